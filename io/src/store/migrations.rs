//! The schemas of both backends, as ordered lists of migrations versioned in code: SQLite's
//! through `PRAGMA user_version`, PostgreSQL's in the one-row table `sortie_schema`.
//!
//! Migration `i` (0-based) moves the database from version `i` to version `i + 1`. Entries are
//! append-only: once released, a migration is never edited, only followed by a new one. The two
//! lists hold the same tables and columns; PostgreSQL's adds `config_head`, the revision
//! counter its compare-and-set updates (decision 091).

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
    // Version 2: receipts and their parts (decision 030). A part row is written only after its
    // payload is durable; `state` follows `sortie_core::receipt`.
    "CREATE TABLE receipts (
         receipt_id      TEXT PRIMARY KEY NOT NULL,
         deployment_id   TEXT NOT NULL,
         direction       TEXT NOT NULL CHECK (direction IN ('request', 'response')),
         state           TEXT NOT NULL,
         size_bytes      INTEGER NOT NULL CHECK (size_bytes >= 0),
         sha256_hex      TEXT NOT NULL,
         idempotency_key TEXT,
         created_at      TEXT NOT NULL,
         updated_at      TEXT NOT NULL,
         expires_at      TEXT NOT NULL,
         expires_unix_ms INTEGER NOT NULL,
         failure         TEXT
     );
     CREATE UNIQUE INDEX receipts_idempotency ON receipts (deployment_id, idempotency_key)
         WHERE idempotency_key IS NOT NULL;
     CREATE INDEX receipts_expiry ON receipts (expires_unix_ms);
     CREATE TABLE receipt_parts (
         receipt_id TEXT NOT NULL REFERENCES receipts (receipt_id) ON DELETE CASCADE,
         number     INTEGER NOT NULL CHECK (number > 0),
         size_bytes INTEGER NOT NULL CHECK (size_bytes >= 0),
         sha256_hex TEXT NOT NULL,
         object_key TEXT NOT NULL,
         PRIMARY KEY (receipt_id, number)
     );",
    // Version 3: the attempt holding an `assigned` receipt (decision 098), so that releasing
    // it never undoes another attempt's assignment.
    "ALTER TABLE receipts ADD COLUMN attempt TEXT;",
];

/// The schema version this build writes and understands: the number of migrations.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

// An empty list would make version 0 "current" and skip creating the tables.
const _: () = assert!(!MIGRATIONS.is_empty());

/// The PostgreSQL schema migrations in order. Text columns compare with the database's
/// collation; queries that promise byte order say `COLLATE "C"`.
pub(crate) const POSTGRES_MIGRATIONS: &[&str] = &[
    // Version 1: the config history with its revision counter, the worker settings, receipts
    // and their parts (the same shape as SQLite's versions 1 and 2).
    "CREATE TABLE config_records (
         revision   BIGINT PRIMARY KEY CHECK (revision > 0),
         snapshot   TEXT NOT NULL,
         actor      TEXT NOT NULL,
         action     TEXT NOT NULL,
         created_at TEXT NOT NULL
     );
     CREATE TABLE config_head (
         id       SMALLINT PRIMARY KEY CHECK (id = 1),
         revision BIGINT NOT NULL CHECK (revision >= 0)
     );
     INSERT INTO config_head (id, revision) VALUES (1, 0);
     CREATE TABLE worker_settings (
         worker_id  TEXT PRIMARY KEY NOT NULL,
         enabled    BOOLEAN NOT NULL,
         draining   BOOLEAN NOT NULL,
         revision   BIGINT NOT NULL CHECK (revision > 0),
         updated_at TEXT NOT NULL,
         actor      TEXT NOT NULL
     );
     CREATE TABLE receipts (
         receipt_id      TEXT PRIMARY KEY NOT NULL,
         deployment_id   TEXT NOT NULL,
         direction       TEXT NOT NULL CHECK (direction IN ('request', 'response')),
         state           TEXT NOT NULL,
         size_bytes      BIGINT NOT NULL CHECK (size_bytes >= 0),
         sha256_hex      TEXT NOT NULL,
         idempotency_key TEXT,
         created_at      TEXT NOT NULL,
         updated_at      TEXT NOT NULL,
         expires_at      TEXT NOT NULL,
         expires_unix_ms BIGINT NOT NULL,
         failure         TEXT
     );
     CREATE UNIQUE INDEX receipts_idempotency ON receipts (deployment_id, idempotency_key)
         WHERE idempotency_key IS NOT NULL;
     CREATE INDEX receipts_expiry ON receipts (expires_unix_ms);
     CREATE TABLE receipt_parts (
         receipt_id TEXT NOT NULL REFERENCES receipts (receipt_id) ON DELETE CASCADE,
         number     INTEGER NOT NULL CHECK (number > 0),
         size_bytes BIGINT NOT NULL CHECK (size_bytes >= 0),
         sha256_hex TEXT NOT NULL,
         object_key TEXT NOT NULL,
         PRIMARY KEY (receipt_id, number)
     );",
    // Version 2: the controls sharing the store, each refreshing its row (decision 094), and
    // the control working on a `verifying` or `assigned` receipt, so the receipts of a control
    // whose row expired can be recovered while the others run.
    "CREATE TABLE controls (
         control_id        TEXT PRIMARY KEY NOT NULL,
         address           TEXT NOT NULL,
         started_at        TEXT NOT NULL,
         last_seen_unix_ms BIGINT NOT NULL
     );
     ALTER TABLE receipts ADD COLUMN holder TEXT;
     CREATE INDEX receipts_holder ON receipts (holder) WHERE holder IS NOT NULL;",
    // Version 3: cancel intents for requests another control runs (decision 095), kept for
    // seconds; `done_by` names the control that cancelled the request.
    "CREATE TABLE cancel_intents (
         request_id      TEXT PRIMARY KEY NOT NULL,
         created_unix_ms BIGINT NOT NULL,
         done_by         TEXT
     );",
    // Version 4: the attempt holding an `assigned` receipt (decision 098), beside its holder,
    // so that a release applies only while that attempt of this control still holds it.
    "ALTER TABLE receipts ADD COLUMN attempt TEXT;",
    // Version 5: each control's own expiry in its row (decision 099), so every control judges
    // another by the other's setting; rows without one are judged by the reader's.
    "ALTER TABLE controls ADD COLUMN expiry_ms BIGINT;",
];

/// The PostgreSQL schema version this build writes and understands.
pub const POSTGRES_SCHEMA_VERSION: u32 = POSTGRES_MIGRATIONS.len() as u32;

const _: () = assert!(!POSTGRES_MIGRATIONS.is_empty());

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
        assert_eq!(
            tables,
            [
                "config_records",
                "receipt_parts",
                "receipts",
                "worker_settings"
            ]
        );
    }
}
