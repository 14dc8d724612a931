//! Persistence of the admin state (config history, worker settings) behind the `RecordStore`
//! trait, and the cold thread that owns the store so that no hot core ever waits on disk.
//!
//! The split: [`RecordStore`] is a plain synchronous interface with one implementation per
//! backend: [`SqliteStore`] for one control, [`PostgresStore`] for several controls sharing one
//! database (decision 091). Only the cold thread calls it once the
//! gateway runs; hot cores hold a [`ColdHandle`] whose async methods send the operation over a
//! bounded channel and await a one-shot reply. Startup code may use a store directly (to
//! bootstrap the first config before any core runs) and then hand it to [`ColdThread::start`].
//!
//! SQLite runs in WAL mode with `synchronous=FULL`. PostgreSQL's connection lives on a `sortie-pg`
//! thread (the synchronous client cannot run inside the cold thread's tokio runtime) and each call
//! waits at most 15 s; a call that gave up never commits later (decision 096); TLS only with
//! `sslmode=require`, verified; every compare-and-set is one conditional statement in one
//! transaction, and a config commit `NOTIFY`s `sortie_config`. The cold thread runs a tokio
//! current-thread runtime with a `LocalSet`: record-store jobs run one at a time, object-store
//! work runs as local tasks so that many bodies stream at once; bodies cross in chunks of at most
//! 256 KiB over 4-deep channels and are hashed on the cold thread. A readiness probe runs every
//! second (`ColdHandle::is_ready`, decision 040).

mod cold;
mod error;
mod migrations;
pub mod objects;
mod postgres;
mod record;
mod sqlite;

pub use cold::{
    ColdContext, ColdHandle, ColdThread, COMMAND_QUEUE_CAPACITY, READINESS_PROBE_INTERVAL,
    READINESS_STALE_AFTER,
};
pub use error::StoreError;
pub use migrations::{POSTGRES_SCHEMA_VERSION, SCHEMA_VERSION};
pub use postgres::{
    PostgresConfig, PostgresStore, PresenceLane, CALL_TIMEOUT, CONFIG_CHANNEL, CONNECT_TIMEOUT,
    WORKERS_CHANNEL,
};
pub use record::{ConfigRecord, PartRecord, ReceiptRecord, WorkerSettings};
pub use sqlite::{AccessMode, SqliteOptions, SqliteStore, DATABASE_FILE_NAME};

/// Number of config records kept in the history, newest first. The spec bounds the history
/// without fixing the number ("Config history: bounded, newest first"); 100 covers weeks of
/// hand-made changes while keeping the table small even with snapshots near the 4 MiB body
/// limit. Older records are deleted when a new one is appended; their revision numbers are
/// never handed out again.
pub const HISTORY_LIMIT: usize = 100;

/// Actor recorded on the record that [`RecordStore::bootstrap`] creates.
pub const BOOTSTRAP_ACTOR: &str = "sortie";

/// Action recorded on the record that [`RecordStore::bootstrap`] creates.
pub const BOOTSTRAP_ACTION: &str = "bootstrap";

/// The persistent admin state: the audited history of runtime config snapshots and the
/// per-worker settings, both under optimistic concurrency (a write names the revision it read
/// and fails with [`StoreError::RevisionConflict`] when another write came first).
///
/// Implementations are synchronous and may block on disk or network: call them only from the
/// cold thread or from startup code before the hot cores run. Timestamps are RFC 3339 strings
/// passed in by the caller; a store reads no clock. Every backend failure is returned as a
/// [`StoreError`], never a panic.
pub trait RecordStore {
    /// The newest config record, or `None` when the history is empty.
    fn latest_config(&mut self) -> Result<Option<ConfigRecord>, StoreError>;

    /// The newest config revision ever written (0 before the first), cheaper than reading the
    /// newest snapshot: what a control following a shared store polls (decision 092).
    fn latest_revision(&mut self) -> Result<u64, StoreError> {
        self.latest_config().map(|r| r.map_or(0, |r| r.revision))
    }

    /// Whether the store answers and holds a configuration: the readiness probe the cold
    /// thread runs periodically. Backends override it with a query cheaper than reading the
    /// newest snapshot.
    fn probe(&mut self) -> Result<bool, StoreError> {
        self.latest_config().map(|r| r.is_some())
    }

    /// The config record with this revision, or `None` when it never existed or was pruned.
    fn config_at(&mut self, revision: u64) -> Result<Option<ConfigRecord>, StoreError>;

    /// Appends a config record with revision `expected_revision + 1`, atomically, provided the
    /// newest stored revision is `expected_revision` (0 for an empty history); otherwise fails
    /// with [`StoreError::RevisionConflict`] carrying the current revision. Prunes the history
    /// to the newest [`HISTORY_LIMIT`] records in the same transaction.
    fn append_config(
        &mut self,
        expected_revision: u64,
        snapshot_json: &str,
        actor: &str,
        action: &str,
        created_at: &str,
    ) -> Result<ConfigRecord, StoreError>;

    /// Up to `limit` config records, newest first.
    fn history(&mut self, limit: usize) -> Result<Vec<ConfigRecord>, StoreError>;

    /// Creates revision 1 from `default_snapshot_json` (actor [`BOOTSTRAP_ACTOR`], action
    /// [`BOOTSTRAP_ACTION`]) when the history is empty, and returns the newest record either
    /// way, so calling it on every start is safe.
    fn bootstrap(
        &mut self,
        default_snapshot_json: &str,
        created_at: &str,
    ) -> Result<ConfigRecord, StoreError>;

    /// The settings record of one worker, or `None` when none was ever written (revision 0).
    fn worker_settings(&mut self, worker_id: &str) -> Result<Option<WorkerSettings>, StoreError>;

    /// Every settings record, ordered by worker id (byte order).
    fn all_worker_settings(&mut self) -> Result<Vec<WorkerSettings>, StoreError>;

    /// Writes the settings of one worker with revision `expected_revision + 1`, provided its
    /// current revision is `expected_revision` (0 when it has no record yet); otherwise fails
    /// with [`StoreError::RevisionConflict`] carrying the current revision.
    fn update_worker_settings(
        &mut self,
        worker_id: &str,
        expected_revision: u64,
        is_enabled: bool,
        is_draining: bool,
        actor: &str,
        updated_at: &str,
    ) -> Result<WorkerSettings, StoreError>;

    /// Inserts a new receipt, unless the deployment already has one with the same idempotency
    /// key: then that stored receipt is returned instead and nothing is written. The caller
    /// compares identities to tell a safe retry from a conflict.
    fn create_receipt(&mut self, receipt: &ReceiptRecord) -> Result<ReceiptRecord, StoreError>;

    /// The receipt `receipt_id` of `deployment_id` with its parts, or `None`.
    fn receipt(
        &mut self,
        deployment_id: &str,
        receipt_id: &str,
    ) -> Result<Option<ReceiptRecord>, StoreError>;

    /// Records (or replaces) a part whose payload is durable, provided the receipt is still
    /// `uploading`; returns `false` and writes nothing otherwise.
    fn put_receipt_part(
        &mut self,
        deployment_id: &str,
        receipt_id: &str,
        part: &PartRecord,
        updated_at: &str,
    ) -> Result<bool, StoreError>;

    /// Moves a receipt from `from` to `to` (compare-and-set on the state); returns `false` and
    /// writes nothing when its state is not `from`.
    fn set_receipt_state(
        &mut self,
        deployment_id: &str,
        receipt_id: &str,
        from: sortie_core::receipt::ReceiptState,
        to: sortie_core::receipt::ReceiptState,
        updated_at: &str,
        failure: Option<&str>,
    ) -> Result<bool, StoreError>;

    /// Moves a `verified` receipt to `assigned` for one attempt (decision 098): `attempt`, a
    /// token unique to the attempt, is recorded with it (and, on a shared store, this control
    /// as its holder). Returns `false`, writing nothing, when the receipt is not `verified`.
    fn assign_receipt(
        &mut self,
        deployment_id: &str,
        receipt_id: &str,
        attempt: &str,
        updated_at: &str,
    ) -> Result<bool, StoreError>;

    /// Moves an `assigned` receipt to `to` (`consumed` after a success, `verified` otherwise)
    /// only while the attempt `attempt` still holds it (and, on a shared store, this control is
    /// its holder): a release, or the revert of an assignment whose outcome is unknown, never
    /// undoes another attempt's assignment, so it is safe to repeat. Returns `false`, writing
    /// nothing, otherwise.
    fn release_receipt(
        &mut self,
        deployment_id: &str,
        receipt_id: &str,
        attempt: &str,
        to: sortie_core::receipt::ReceiptState,
        updated_at: &str,
    ) -> Result<bool, StoreError>;

    /// Up to `limit` receipts (deployment id, receipt id) whose expiry is at or before
    /// `now_unix_ms` and that may expire now (decision 004: not assigned, not already
    /// cancelled or expired).
    fn due_receipts(
        &mut self,
        now_unix_ms: u64,
        limit: usize,
    ) -> Result<Vec<(String, String)>, StoreError>;

    /// Crash recovery at startup (decision 034): `verifying` goes back to `uploading` (its
    /// parts are still stored; the client repeats complete) and `assigned` back to `verified`
    /// (the attempt died with the process). With `untouched_since` (RFC 3339, the stored
    /// times' format) only receipts last changed at or before it: controls sharing a store
    /// pass a time old enough that no live control can still be working on such a receipt
    /// (decision 093); one control alone on its store passes `None`. Returns how many receipts
    /// moved.
    fn recover_receipts(
        &mut self,
        updated_at: &str,
        untouched_since: Option<&str>,
    ) -> Result<usize, StoreError>;

    /// The id this control is known by to the other controls sharing the store, minted when
    /// the store was opened (decision 094); `None` for a store only one control uses.
    fn control_id(&self) -> Option<&str> {
        None
    }

    /// Registers this control, or refreshes its row: `address` (where it answers), the time it
    /// started, `expiry` (how long after this beat the others may count it dead, decision 099)
    /// and, from the store's own clock so that controls on different hosts compare one clock,
    /// when it was last seen. A store only one control uses keeps no such row.
    fn control_heartbeat(
        &mut self,
        _address: &str,
        _started_at: &str,
        _expiry: std::time::Duration,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    /// This control stops gracefully (decision 098): in one transaction its `verifying` and
    /// `assigned` receipts are recovered as [`RecordStore::recover_dead_controls`] would
    /// recover them and its row is removed, so the others need not wait for the row to expire;
    /// later heartbeats write nothing. Returns how many receipts moved. A store only one control
    /// uses keeps no row: nothing to do.
    fn control_leave(&mut self, _updated_at: &str) -> Result<usize, StoreError> {
        Ok(0)
    }

    /// Recovers the receipts held by controls not seen within their expiry (by the store's
    /// clock; the expiry each row records, else `expiry`): `verifying` goes back to
    /// `uploading`, `assigned` back to `verified`, as at startup (decision 034), and those
    /// controls' rows are removed. Receipts of controls seen within their expiry, and of this
    /// one, are left alone. Returns how many receipts moved.
    fn recover_dead_controls(
        &mut self,
        _expiry: std::time::Duration,
        _updated_at: &str,
    ) -> Result<usize, StoreError> {
        Ok(0)
    }

    /// The heartbeat's own connection, on a store several controls share (decision 104): the
    /// presence loop beats through it, never behind the store calls of requests. `None` for a
    /// store only one control uses.
    fn presence_lane(&self) -> Option<PresenceLane> {
        None
    }

    /// Asks the controls sharing the store to cancel `request_id` (decision 095): writes (or
    /// renews) a cancel intent, pending until a control that runs the request marks it done.
    /// Returns `false`, writing nothing, on a store only one control uses.
    fn request_cancel(&mut self, _request_id: &str) -> Result<bool, StoreError> {
        Ok(false)
    }

    /// The request ids of pending cancel intents younger than `expiry` (by the store's clock);
    /// older intents are removed.
    fn pending_cancels(&mut self, _expiry: std::time::Duration) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
    }

    /// Marks the cancel intent of `request_id` done by this control.
    fn cancel_done(&mut self, _request_id: &str) -> Result<(), StoreError> {
        Ok(())
    }

    /// Whether a control has carried out the cancel intent of `request_id`.
    fn cancel_carried_out(&mut self, _request_id: &str) -> Result<bool, StoreError> {
        Ok(false)
    }
}
