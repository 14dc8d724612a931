//! The one error type of the store and the cold thread.

/// Why a store operation failed. Every backend failure maps to one of these values; none
/// panics. Messages never contain snapshot contents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The caller's expected revision is stale; re-read and retry with `current`.
    #[error("revision conflict: the current revision is {current}")]
    RevisionConflict {
        /// The revision actually stored (0 when there is no record).
        current: u64,
    },
    /// The database was written by a newer build whose schema this build does not know.
    #[error(
        "the database schema version {found} is newer than this build supports ({supported}); \
         run a newer sortie on this data directory"
    )]
    NewerSchema {
        /// Schema version found in the database.
        found: u32,
        /// Newest schema version this build knows.
        supported: u32,
    },
    /// The store was opened read-only or the database refuses writes.
    #[error("the store is read-only")]
    ReadOnly,
    /// The store cannot take the operation now (command queue full, or the database stayed
    /// locked by another process past the busy timeout); retrying later may succeed.
    #[error("the store is busy; retry later")]
    Busy,
    /// A write's `COMMIT` was under way when the caller stopped waiting for it: it may or may
    /// not have taken effect. Not retryable as it stands; re-read the state before deciding
    /// (decision 096).
    #[error("the store did not confirm the write in time; it may or may not have taken effect")]
    OutcomeUnknown,
    /// The cold thread has stopped; no operation can complete.
    #[error("the store is unavailable: the cold thread has stopped")]
    Unavailable,
    /// A filesystem operation around the database failed (creating the data directory,
    /// starting the thread).
    #[error("store I/O error: {0}")]
    Io(String),
    /// The database file is damaged, is not a database, or holds a value that breaks an
    /// invariant of the schema.
    #[error("the store is corrupt: {0}")]
    Corrupt(String),
    /// Any other database failure, with the backend's message.
    #[error("database error: {0}")]
    Database(String),
}
