//! The record-store backends for tests that must hold on both: SQLite in a temporary data
//! directory and PostgreSQL on a fresh database of the test cluster ([`crate::pg`]), behind one
//! trait, and the macro that turns one test function into a test per backend.
//!
//! Declared in `main.rs` before the test modules, so that `on_both_backends!` is in scope in
//! each; a test module imports `crate::store_backends`.

#![allow(dead_code, unreachable_pub)]

use sortie_io::store::{
    PostgresConfig, PostgresStore, RecordStore, SqliteStore, StoreError, DATABASE_FILE_NAME,
    POSTGRES_SCHEMA_VERSION, SCHEMA_VERSION,
};

/// One database of one backend; every `open` is a new connection to it, as another process
/// (or another control) would open.
pub trait Backend {
    fn try_open(&self) -> Result<Box<dyn RecordStore + Send>, StoreError>;
    fn open(&self) -> Box<dyn RecordStore + Send> {
        self.try_open().expect("store opens")
    }
    /// Marks the database as written by a newer schema than this build's.
    fn set_newer_schema(&self) -> u32;
    /// The newest schema version this build knows, for this backend.
    fn supported(&self) -> u32;
    /// Where the database is, as [`open_locator`] takes it: a data directory or a URL (for a
    /// child process that opens the same database).
    fn locator(&self) -> String;
    /// The backend's own consistency check of the database, beyond what the store reads.
    fn check_integrity(&self) {}
}

/// Opens the store a [`Backend::locator`] names: a `postgres://` URL or a data directory.
pub fn open_locator(locator: &str) -> Box<dyn RecordStore + Send> {
    if locator.starts_with("postgres://") {
        let config = PostgresConfig::parse(locator, None).expect("test URL");
        Box::new(PostgresStore::open(&config).expect("store opens"))
    } else {
        Box::new(SqliteStore::open(std::path::Path::new(locator)).expect("store opens"))
    }
}

/// A SQLite data directory, removed when dropped.
pub struct Sqlite(pub tempfile::TempDir);

impl Backend for Sqlite {
    fn try_open(&self) -> Result<Box<dyn RecordStore + Send>, StoreError> {
        Ok(Box::new(SqliteStore::open(self.0.path())?))
    }
    fn set_newer_schema(&self) -> u32 {
        let conn =
            rusqlite::Connection::open(self.0.path().join(DATABASE_FILE_NAME)).expect("open");
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .expect("set version");
        SCHEMA_VERSION + 1
    }
    fn supported(&self) -> u32 {
        SCHEMA_VERSION
    }
    fn locator(&self) -> String {
        self.0.path().display().to_string()
    }
    fn check_integrity(&self) {
        let conn =
            rusqlite::Connection::open(self.0.path().join(DATABASE_FILE_NAME)).expect("raw open");
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .expect("integrity_check");
        assert_eq!(check, "ok");
    }
}

/// A database of the test cluster, by URL.
pub struct Postgres(pub String);

impl Postgres {
    pub fn config(&self) -> PostgresConfig {
        PostgresConfig::parse(&self.0, None).expect("test URL")
    }
}

impl Backend for Postgres {
    fn try_open(&self) -> Result<Box<dyn RecordStore + Send>, StoreError> {
        Ok(Box::new(PostgresStore::open(&self.config())?))
    }
    fn set_newer_schema(&self) -> u32 {
        let mut c = self.config().connect().expect("connect");
        c.execute(
            "UPDATE sortie_schema SET version = $1",
            &[&i32::try_from(POSTGRES_SCHEMA_VERSION + 1).expect("small")],
        )
        .expect("set version");
        POSTGRES_SCHEMA_VERSION + 1
    }
    fn supported(&self) -> u32 {
        POSTGRES_SCHEMA_VERSION
    }
    fn locator(&self) -> String {
        self.0.clone()
    }
}

impl Sqlite {
    /// A fresh, empty data directory.
    pub fn new() -> Sqlite {
        Sqlite(tempfile::tempdir().expect("temporary directory"))
    }
}

impl Postgres {
    /// A fresh, empty database named after `tag`.
    pub fn new(tag: &str) -> Postgres {
        Postgres(crate::pg::cluster().fresh_database(tag))
    }
}

/// Runs each named test function (taking `&dyn Backend`) against both backends, as
/// `sqlite::NAME` and `postgres::NAME`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[test]
            fn $name() {
                super::$name(&crate::store_backends::Sqlite::new());
            })*
        }
        mod postgres {
            $(#[test]
            fn $name() {
                super::$name(&crate::store_backends::Postgres::new(stringify!($name)));
            })*
        }
    };
}
