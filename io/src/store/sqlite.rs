//! The SQLite implementation of `RecordStore`: one database file in the data directory, WAL
//! journal, full fsync on commit, schema migrations applied on open.
//!
//! This file blocks on disk. Only the cold thread and startup code may call it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{ffi, Connection, OpenFlags, OptionalExtension, Row, TransactionBehavior};

use super::migrations::{MIGRATIONS, SCHEMA_VERSION};
use sortie_core::receipt::ReceiptState;

use super::{
    ConfigRecord, PartRecord, ReceiptRecord, RecordStore, StoreError, WorkerSettings,
    BOOTSTRAP_ACTION, BOOTSTRAP_ACTOR, HISTORY_LIMIT,
};

/// Name of the database file inside the data directory.
pub const DATABASE_FILE_NAME: &str = "sortie.db";

/// How long a statement waits for a lock held by another connection (another process on the
/// same data directory, or a checkpoint) before failing with [`StoreError::Busy`].
const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether the store may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AccessMode {
    /// Read and write; the data directory and database are created when missing.
    #[default]
    ReadWrite,
    /// Read only (`SQLITE_OPEN_READ_ONLY`): every write fails with [`StoreError::ReadOnly`].
    /// The database must exist and already be at the current schema version.
    ReadOnly,
}

/// Options for [`SqliteStore::open_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqliteOptions {
    /// Whether the store may write.
    pub access: AccessMode,
    /// How long to wait for a lock held by another connection before giving up.
    pub busy_timeout: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            access: AccessMode::ReadWrite,
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
        }
    }
}

/// A [`RecordStore`] on one SQLite database file, `<data_dir>/sortie.db`.
///
/// The connection runs in WAL mode with `synchronous=FULL`, so a config write that returned
/// `Ok` survives a kill -9 or a power cut, and a write interrupted half-way leaves no trace.
#[derive(Debug)]
pub struct SqliteStore {
    conn: Connection,
    path: PathBuf,
}

impl SqliteStore {
    /// Opens (creating if needed) the read-write store in `data_dir`.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        Self::open_with(data_dir, SqliteOptions::default())
    }

    /// Opens the store in `data_dir` with explicit options, applies pending schema migrations
    /// (read-write only) and refuses a database written by a newer schema.
    pub fn open_with(data_dir: &Path, options: SqliteOptions) -> Result<Self, StoreError> {
        let path = data_dir.join(DATABASE_FILE_NAME);
        let flags = match options.access {
            AccessMode::ReadWrite => {
                std::fs::create_dir_all(data_dir).map_err(|e| {
                    StoreError::Io(format!(
                        "cannot create the data directory {}: {e}",
                        data_dir.display()
                    ))
                })?;
                OpenFlags::SQLITE_OPEN_READ_WRITE
                    | OpenFlags::SQLITE_OPEN_CREATE
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX
            }
            AccessMode::ReadOnly => {
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
            }
        };
        let mut conn = Connection::open_with_flags(&path, flags).map_err(|e| {
            let err = map_error(e);
            match err {
                StoreError::Database(msg) => {
                    StoreError::Database(format!("cannot open {}: {msg}", path.display()))
                }
                other => other,
            }
        })?;
        conn.busy_timeout(options.busy_timeout).map_err(map_error)?;
        conn.pragma_update(None, "foreign_keys", true)
            .map_err(map_error)?;
        if options.access == AccessMode::ReadWrite {
            // WAL lets readers proceed during a write, and its commit is a single append to the
            // log, which is what makes a write interrupted by kill -9 invisible on reopen.
            let mode: String = conn
                .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
                .map_err(map_error)?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(StoreError::Database(format!(
                    "cannot switch {} to WAL mode (journal mode stays {mode})",
                    path.display()
                )));
            }
            // FULL syncs the log on every commit: a config write that returned Ok must survive
            // a crash of the process or of the machine.
            conn.pragma_update(None, "synchronous", "FULL")
                .map_err(map_error)?;
        }
        migrate(&mut conn, options.access)?;
        Ok(Self { conn, path })
    }

    /// Path of the database file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Brings the schema to [`SCHEMA_VERSION`] in one immediate transaction, so two processes
/// opening the same fresh database cannot both migrate it, and a crash mid-way leaves the old
/// version intact.
fn migrate(conn: &mut Connection, access: AccessMode) -> Result<(), StoreError> {
    let behavior = match access {
        AccessMode::ReadWrite => TransactionBehavior::Immediate,
        AccessMode::ReadOnly => TransactionBehavior::Deferred,
    };
    let tx = conn
        .transaction_with_behavior(behavior)
        .map_err(map_error)?;
    let found: i64 = tx
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(map_error)?;
    // user_version is a signed 32-bit header field; a negative value was not written by us.
    let found = u32::try_from(found).map_err(|_| {
        StoreError::Corrupt(format!("negative schema version {found} in the database"))
    })?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if found == SCHEMA_VERSION {
        return Ok(());
    }
    if access == AccessMode::ReadOnly {
        return Err(StoreError::ReadOnly);
    }
    // `found < SCHEMA_VERSION == MIGRATIONS.len()`, so the range is in bounds.
    let pending = MIGRATIONS.get(found as usize..).unwrap_or_default();
    for sql in pending {
        tx.execute_batch(sql).map_err(map_error)?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(map_error)?;
    tx.commit().map_err(map_error)
}

/// Maps a SQLite failure to the store's error, keeping the distinctions a caller acts on.
fn map_error(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(ffi::ErrorCode::ReadOnly) => StoreError::ReadOnly,
        Some(ffi::ErrorCode::DatabaseBusy | ffi::ErrorCode::DatabaseLocked) => StoreError::Busy,
        Some(ffi::ErrorCode::DatabaseCorrupt | ffi::ErrorCode::NotADatabase) => {
            StoreError::Corrupt(e.to_string())
        }
        _ => StoreError::Database(e.to_string()),
    }
}

/// Converts a revision read from the database; a negative one breaks the schema's CHECK and
/// means the file was altered outside the store.
fn revision_from_db(value: i64) -> Result<u64, StoreError> {
    u64::try_from(value)
        .map_err(|_| StoreError::Corrupt(format!("negative revision {value} in the database")))
}

/// Converts a revision for a query. Revisions above `i64::MAX` cannot be stored, so such a
/// value matches nothing; `None` tells the caller so.
fn revision_to_db(value: u64) -> Option<i64> {
    i64::try_from(value).ok()
}

/// The revision that follows `current`.
fn next_revision(current: u64) -> Result<(u64, i64), StoreError> {
    current
        .checked_add(1)
        .and_then(|next| Some((next, revision_to_db(next)?)))
        .ok_or_else(|| StoreError::Database("the revision counter is exhausted".into()))
}

const CONFIG_COLUMNS: &str = "revision, snapshot, actor, action, created_at";

/// Reads a config row without converting the revision yet (row closures return rusqlite
/// errors; the conversion error is ours).
fn config_row(row: &Row<'_>) -> rusqlite::Result<(i64, String, String, String, String)> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
    ))
}

fn config_record(
    (revision, snapshot_json, actor, action, created_at): (i64, String, String, String, String),
) -> Result<ConfigRecord, StoreError> {
    Ok(ConfigRecord {
        revision: revision_from_db(revision)?,
        snapshot_json,
        actor,
        action,
        created_at,
    })
}

const WORKER_COLUMNS: &str = "worker_id, enabled, draining, revision, updated_at, actor";

type WorkerRow = (String, bool, bool, i64, String, String);

fn worker_row(row: &Row<'_>) -> rusqlite::Result<WorkerRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
    ))
}

fn worker_settings(
    (worker_id, is_enabled, is_draining, revision, updated_at, actor): WorkerRow,
) -> Result<WorkerSettings, StoreError> {
    Ok(WorkerSettings {
        worker_id,
        is_enabled,
        is_draining,
        revision: revision_from_db(revision)?,
        updated_at,
        actor,
    })
}

/// The newest config revision, 0 when the history is empty.
fn current_config_revision(conn: &Connection) -> Result<u64, StoreError> {
    let max: Option<i64> = conn
        .query_row("SELECT MAX(revision) FROM config_records", [], |row| {
            row.get(0)
        })
        .map_err(map_error)?;
    max.map_or(Ok(0), revision_from_db)
}

fn latest_config_in(conn: &Connection) -> Result<Option<ConfigRecord>, StoreError> {
    conn.query_row(
        &format!("SELECT {CONFIG_COLUMNS} FROM config_records ORDER BY revision DESC LIMIT 1"),
        [],
        config_row,
    )
    .optional()
    .map_err(map_error)?
    .map(config_record)
    .transpose()
}

const RECEIPT_COLUMNS: &str = "receipt_id, deployment_id, direction, state, size_bytes, \
     sha256_hex, idempotency_key, created_at, updated_at, expires_at, expires_unix_ms, failure";

/// Converts a count or size read from the database; a negative one breaks a CHECK.
fn u64_from_db(value: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("negative {what} {value}")))
}

fn i64_to_db(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

type ReceiptRow = (
    String,
    String,
    String,
    String,
    i64,
    String,
    Option<String>,
    String,
    String,
    String,
    i64,
    Option<String>,
);

fn receipt_row(row: &Row<'_>) -> rusqlite::Result<ReceiptRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
        row.get(7)?,
        row.get(8)?,
        row.get(9)?,
        row.get(10)?,
        row.get(11)?,
    ))
}

/// Reads a receipt and its parts from `conn`.
fn receipt_in(
    conn: &Connection,
    deployment_id: &str,
    receipt_id: &str,
) -> Result<Option<ReceiptRecord>, StoreError> {
    let row = conn
        .prepare_cached(&format!(
            "SELECT {RECEIPT_COLUMNS} FROM receipts WHERE receipt_id = ?1 AND deployment_id = ?2"
        ))
        .and_then(|mut s| {
            s.query_row([receipt_id, deployment_id], receipt_row)
                .optional()
        })
        .map_err(map_error)?;
    let Some((
        id,
        dep,
        direction,
        state,
        size,
        sha,
        key,
        created,
        updated,
        expires,
        exp_ms,
        failure,
    )) = row
    else {
        return Ok(None);
    };
    let state = ReceiptState::from_wire(&state)
        .ok_or_else(|| StoreError::Corrupt(format!("unknown receipt state {state:?}")))?;
    let parts = conn
        .prepare_cached(
            "SELECT number, size_bytes, sha256_hex, object_key FROM receipt_parts \
             WHERE receipt_id = ?1 ORDER BY number",
        )
        .and_then(|mut s| {
            s.query_map([&id], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(map_error)?
        .into_iter()
        .map(|(n, size, sha, object_key)| {
            Ok(PartRecord {
                number: u32::try_from(n)
                    .map_err(|_| StoreError::Corrupt(format!("part number {n}")))?,
                size_bytes: u64_from_db(size, "part size")?,
                sha256_hex: sha,
                object_key,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(Some(ReceiptRecord {
        receipt_id: id,
        deployment_id: dep,
        direction,
        state,
        size_bytes: u64_from_db(size, "receipt size")?,
        sha256_hex: sha,
        idempotency_key: key,
        parts,
        created_at: created,
        updated_at: updated,
        expires_at: expires,
        expires_unix_ms: u64_from_db(exp_ms, "expiry")?,
        failure,
    }))
}

impl RecordStore for SqliteStore {
    fn create_receipt(&mut self, r: &ReceiptRecord) -> Result<ReceiptRecord, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(map_error)?;
        if let Some(key) = &r.idempotency_key {
            let existing: Option<String> = tx
                .query_row(
                    "SELECT receipt_id FROM receipts WHERE deployment_id = ?1 \
                     AND idempotency_key = ?2",
                    [&r.deployment_id, key],
                    |row| row.get(0),
                )
                .optional()
                .map_err(map_error)?;
            if let Some(id) = existing {
                return receipt_in(&tx, &r.deployment_id, &id)?
                    .ok_or_else(|| StoreError::Corrupt("receipt vanished".into()));
            }
        }
        tx.execute(
            &format!(
                "INSERT INTO receipts ({RECEIPT_COLUMNS}) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
            ),
            rusqlite::params![
                r.receipt_id,
                r.deployment_id,
                r.direction,
                r.state.as_str(),
                i64_to_db(r.size_bytes),
                r.sha256_hex,
                r.idempotency_key,
                r.created_at,
                r.updated_at,
                r.expires_at,
                i64_to_db(r.expires_unix_ms),
                r.failure,
            ],
        )
        .map_err(map_error)?;
        tx.commit().map_err(map_error)?;
        Ok(r.clone())
    }

    fn receipt(
        &mut self,
        deployment_id: &str,
        receipt_id: &str,
    ) -> Result<Option<ReceiptRecord>, StoreError> {
        receipt_in(&self.conn, deployment_id, receipt_id)
    }

    fn put_receipt_part(
        &mut self,
        deployment_id: &str,
        receipt_id: &str,
        part: &PartRecord,
        updated_at: &str,
    ) -> Result<bool, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(map_error)?;
        let touched = tx
            .execute(
                "UPDATE receipts SET updated_at = ?1 WHERE receipt_id = ?2 \
                 AND deployment_id = ?3 AND state = ?4",
                rusqlite::params![
                    updated_at,
                    receipt_id,
                    deployment_id,
                    ReceiptState::Uploading.as_str()
                ],
            )
            .map_err(map_error)?;
        if touched == 0 {
            return Ok(false);
        }
        tx.execute(
            "INSERT OR REPLACE INTO receipt_parts \
             (receipt_id, number, size_bytes, sha256_hex, object_key) VALUES (?1, ?2, ?3, ?4, ?5)",
            rusqlite::params![
                receipt_id,
                part.number,
                i64_to_db(part.size_bytes),
                part.sha256_hex,
                part.object_key
            ],
        )
        .map_err(map_error)?;
        tx.commit().map_err(map_error)?;
        Ok(true)
    }

    fn set_receipt_state(
        &mut self,
        deployment_id: &str,
        receipt_id: &str,
        from: ReceiptState,
        to: ReceiptState,
        updated_at: &str,
        failure: Option<&str>,
    ) -> Result<bool, StoreError> {
        let n = self
            .conn
            .execute(
                "UPDATE receipts SET state = ?1, updated_at = ?2, failure = COALESCE(?3, failure), \
                 attempt = NULL WHERE receipt_id = ?4 AND deployment_id = ?5 AND state = ?6",
                rusqlite::params![
                    to.as_str(),
                    updated_at,
                    failure,
                    receipt_id,
                    deployment_id,
                    from.as_str()
                ],
            )
            .map_err(map_error)?;
        Ok(n > 0)
    }

    fn assign_receipt(
        &mut self,
        deployment_id: &str,
        receipt_id: &str,
        attempt: &str,
        updated_at: &str,
    ) -> Result<bool, StoreError> {
        let n = self
            .conn
            .execute(
                "UPDATE receipts SET state = 'assigned', updated_at = ?1, attempt = ?2 \
                 WHERE receipt_id = ?3 AND deployment_id = ?4 AND state = 'verified'",
                rusqlite::params![updated_at, attempt, receipt_id, deployment_id],
            )
            .map_err(map_error)?;
        Ok(n > 0)
    }

    fn release_receipt(
        &mut self,
        deployment_id: &str,
        receipt_id: &str,
        attempt: &str,
        to: ReceiptState,
        updated_at: &str,
    ) -> Result<bool, StoreError> {
        let n = self
            .conn
            .execute(
                "UPDATE receipts SET state = ?1, updated_at = ?2, attempt = NULL \
                 WHERE receipt_id = ?3 AND deployment_id = ?4 AND state = 'assigned' \
                 AND attempt = ?5",
                rusqlite::params![to.as_str(), updated_at, receipt_id, deployment_id, attempt],
            )
            .map_err(map_error)?;
        Ok(n > 0)
    }

    fn due_receipts(
        &mut self,
        now_unix_ms: u64,
        limit: usize,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.conn
            .prepare_cached(
                "SELECT deployment_id, receipt_id FROM receipts WHERE expires_unix_ms <= ?1 \
                 AND state NOT IN ('assigned', 'cancelled', 'expired') LIMIT ?2",
            )
            .and_then(|mut s| {
                s.query_map(rusqlite::params![i64_to_db(now_unix_ms), limit], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?
                .collect()
            })
            .map_err(map_error)
    }

    fn recover_receipts(
        &mut self,
        updated_at: &str,
        untouched_since: Option<&str>,
    ) -> Result<usize, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(map_error)?;
        let mut moved = 0;
        for (from, to) in [
            (ReceiptState::Verifying, ReceiptState::Uploading),
            (ReceiptState::Assigned, ReceiptState::Verified),
        ] {
            moved += tx
                .execute(
                    "UPDATE receipts SET state = ?1, updated_at = ?2, attempt = NULL \
                     WHERE state = ?3 AND (?4 IS NULL OR updated_at <= ?4)",
                    rusqlite::params![to.as_str(), updated_at, from.as_str(), untouched_since],
                )
                .map_err(map_error)?;
        }
        tx.commit().map_err(map_error)?;
        Ok(moved)
    }

    fn latest_config(&mut self) -> Result<Option<ConfigRecord>, StoreError> {
        latest_config_in(&self.conn)
    }

    fn latest_revision(&mut self) -> Result<u64, StoreError> {
        current_config_revision(&self.conn)
    }

    fn probe(&mut self) -> Result<bool, StoreError> {
        self.conn
            .query_row("SELECT EXISTS(SELECT 1 FROM config_records)", [], |r| {
                r.get::<_, bool>(0)
            })
            .map_err(map_error)
    }

    fn config_at(&mut self, revision: u64) -> Result<Option<ConfigRecord>, StoreError> {
        let Some(revision) = revision_to_db(revision) else {
            return Ok(None);
        };
        self.conn
            .query_row(
                &format!("SELECT {CONFIG_COLUMNS} FROM config_records WHERE revision = ?1"),
                [revision],
                config_row,
            )
            .optional()
            .map_err(map_error)?
            .map(config_record)
            .transpose()
    }

    fn append_config(
        &mut self,
        expected_revision: u64,
        snapshot_json: &str,
        actor: &str,
        action: &str,
        created_at: &str,
    ) -> Result<ConfigRecord, StoreError> {
        // IMMEDIATE takes the write lock before the read, so the check and the insert are one
        // atomic step even against another process on the same file.
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(map_error)?;
        let current = current_config_revision(&tx)?;
        if current != expected_revision {
            return Err(StoreError::RevisionConflict { current });
        }
        // The new revision is max + 1 and pruning keeps the newest records, so a revision
        // number is never handed out twice.
        let (revision, db_revision) = next_revision(current)?;
        tx.execute(
            &format!("INSERT INTO config_records ({CONFIG_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5)"),
            rusqlite::params![db_revision, snapshot_json, actor, action, created_at],
        )
        .map_err(map_error)?;
        let keep = i64::try_from(HISTORY_LIMIT).unwrap_or(i64::MAX);
        tx.execute(
            "DELETE FROM config_records WHERE revision NOT IN \
             (SELECT revision FROM config_records ORDER BY revision DESC LIMIT ?1)",
            [keep],
        )
        .map_err(map_error)?;
        tx.commit().map_err(map_error)?;
        Ok(ConfigRecord {
            revision,
            snapshot_json: snapshot_json.to_owned(),
            actor: actor.to_owned(),
            action: action.to_owned(),
            created_at: created_at.to_owned(),
        })
    }

    fn history(&mut self, limit: usize) -> Result<Vec<ConfigRecord>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT {CONFIG_COLUMNS} FROM config_records ORDER BY revision DESC LIMIT ?1"
            ))
            .map_err(map_error)?;
        let rows = stmt.query_map([limit], config_row).map_err(map_error)?;
        rows.map(|row| config_record(row.map_err(map_error)?))
            .collect()
    }

    fn bootstrap(
        &mut self,
        default_snapshot_json: &str,
        created_at: &str,
    ) -> Result<ConfigRecord, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(map_error)?;
        if let Some(latest) = latest_config_in(&tx)? {
            return Ok(latest);
        }
        tx.execute(
            &format!("INSERT INTO config_records ({CONFIG_COLUMNS}) VALUES (1, ?1, ?2, ?3, ?4)"),
            rusqlite::params![
                default_snapshot_json,
                BOOTSTRAP_ACTOR,
                BOOTSTRAP_ACTION,
                created_at
            ],
        )
        .map_err(map_error)?;
        tx.commit().map_err(map_error)?;
        Ok(ConfigRecord {
            revision: 1,
            snapshot_json: default_snapshot_json.to_owned(),
            actor: BOOTSTRAP_ACTOR.to_owned(),
            action: BOOTSTRAP_ACTION.to_owned(),
            created_at: created_at.to_owned(),
        })
    }

    fn worker_settings(&mut self, worker_id: &str) -> Result<Option<WorkerSettings>, StoreError> {
        self.conn
            .query_row(
                &format!("SELECT {WORKER_COLUMNS} FROM worker_settings WHERE worker_id = ?1"),
                [worker_id],
                worker_row,
            )
            .optional()
            .map_err(map_error)?
            .map(worker_settings)
            .transpose()
    }

    fn all_worker_settings(&mut self) -> Result<Vec<WorkerSettings>, StoreError> {
        // TEXT compares with the BINARY collation: byte order, the same as Rust's `str` order.
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT {WORKER_COLUMNS} FROM worker_settings ORDER BY worker_id"
            ))
            .map_err(map_error)?;
        let rows = stmt.query_map([], worker_row).map_err(map_error)?;
        rows.map(|row| worker_settings(row.map_err(map_error)?))
            .collect()
    }

    fn update_worker_settings(
        &mut self,
        worker_id: &str,
        expected_revision: u64,
        is_enabled: bool,
        is_draining: bool,
        actor: &str,
        updated_at: &str,
    ) -> Result<WorkerSettings, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(map_error)?;
        let current: Option<i64> = tx
            .query_row(
                "SELECT revision FROM worker_settings WHERE worker_id = ?1",
                [worker_id],
                |row| row.get(0),
            )
            .optional()
            .map_err(map_error)?;
        let current = current.map_or(Ok(0), revision_from_db)?;
        if current != expected_revision {
            return Err(StoreError::RevisionConflict { current });
        }
        let (revision, db_revision) = next_revision(current)?;
        tx.execute(
            &format!(
                "INSERT INTO worker_settings ({WORKER_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
                 ON CONFLICT (worker_id) DO UPDATE SET enabled = excluded.enabled, \
                 draining = excluded.draining, revision = excluded.revision, \
                 updated_at = excluded.updated_at, actor = excluded.actor"
            ),
            rusqlite::params![
                worker_id,
                is_enabled,
                is_draining,
                db_revision,
                updated_at,
                actor
            ],
        )
        .map_err(map_error)?;
        tx.commit().map_err(map_error)?;
        Ok(WorkerSettings {
            worker_id: worker_id.to_owned(),
            is_enabled,
            is_draining,
            revision,
            updated_at: updated_at.to_owned(),
            actor: actor.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_beyond_the_signed_range_match_nothing() {
        assert_eq!(revision_to_db(u64::MAX), None);
        assert_eq!(revision_to_db(7), Some(7));
    }

    #[test]
    fn negative_revisions_read_as_corruption() {
        assert!(matches!(revision_from_db(-1), Err(StoreError::Corrupt(_))));
        assert_eq!(revision_from_db(3), Ok(3));
    }

    #[test]
    fn the_revision_counter_refuses_to_wrap() {
        assert_eq!(next_revision(1), Ok((2, 2)));
        assert!(next_revision(i64::MAX as u64).is_err());
        assert!(next_revision(u64::MAX).is_err());
    }

    #[test]
    fn sqlite_error_codes_map_to_the_distinctions_callers_act_on() {
        let failure = |code| {
            rusqlite::Error::SqliteFailure(
                ffi::Error {
                    code,
                    extended_code: 0,
                },
                None,
            )
        };
        let table = [
            (ffi::ErrorCode::ReadOnly, StoreError::ReadOnly),
            (ffi::ErrorCode::DatabaseBusy, StoreError::Busy),
            (ffi::ErrorCode::DatabaseLocked, StoreError::Busy),
        ];
        for (code, want) in table {
            assert_eq!(map_error(failure(code)), want, "{code:?}");
        }
        assert!(matches!(
            map_error(failure(ffi::ErrorCode::NotADatabase)),
            StoreError::Corrupt(_)
        ));
        assert!(matches!(
            map_error(failure(ffi::ErrorCode::DiskFull)),
            StoreError::Database(_)
        ));
    }
}
