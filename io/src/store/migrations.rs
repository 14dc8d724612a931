//! The SQLite schema, as an ordered list of migrations versioned in code through
//! `PRAGMA user_version`.
//!
//! Migration `i` (0-based) moves the database from version `i` to version `i + 1`. Entries are
//! append-only: once released, a migration is never edited, only followed by a new one.

/// The schema migrations in order. A fresh database runs all of them.
pub(crate) const MIGRATIONS: &[&str] = &[
    // Version 1: the config history and the worker settings.
    "CREATE TABLE config_records (
         revision   INTEGER PRIMARY KEY CHECK (revision > 0),
         snapshot   TEXT NOT NULL,
         actor      TEXT NOT NULL,
         action     TEXT NOT NULL,
         created_at TEXT NOT NULL
     );
     CREATE TABLE worker_settings (
         worker_id  TEXT PRIMARY KEY NOT NULL,
         enabled    INTEGER NOT NULL CHECK (enabled IN (0, 1)),
         draining   INTEGER NOT NULL CHECK (draining IN (0, 1)),
         revision   INTEGER NOT NULL CHECK (revision > 0),
         updated_at TEXT NOT NULL,
         actor      TEXT NOT NULL
     );",
];

/// The schema version this build writes and understands: the number of migrations.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

// An empty list would make version 0 "current" and skip creating the tables.
const _: () = assert!(!MIGRATIONS.is_empty());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_migration_applies_in_order_on_an_empty_database() {
        let conn = rusqlite::Connection::open_in_memory().expect("in-memory database");
        for sql in MIGRATIONS {
            conn.execute_batch(sql).expect("migration applies");
        }
        let tables: Vec<String> = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
            .expect("table list");
        assert_eq!(tables, ["config_records", "worker_settings"]);
    }
}
