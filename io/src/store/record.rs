//! The records the store keeps: audited config snapshots and per-worker settings.

/// One entry of the config history: a complete runtime snapshot as it was stored, with who
/// stored it, why and when. The admin API's `ConfigRecord` resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigRecord {
    /// Monotonic revision, starting at 1; never reused, even after the record is pruned.
    pub revision: u64,
    /// The snapshot as the JSON text that was validated and stored.
    pub snapshot_json: String,
    /// Audit attribution (the `X-Service-Actor` header, or `sortie` for the bootstrap record).
    pub actor: String,
    /// What produced the record, e.g. `bootstrap`, `update`, `rollback`.
    pub action: String,
    /// RFC 3339 UTC timestamp supplied by the caller.
    pub created_at: String,
}

/// The administrator's lifecycle flags for one worker id. Such a record may exist for a worker
/// that never registered; it does not make that worker eligible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSettings {
    /// The worker id the settings apply to.
    pub worker_id: String,
    /// Whether the worker may receive assignments (`enable`/`disable` actions).
    pub is_enabled: bool,
    /// Whether the worker is draining: it finishes in-flight work and takes no new work
    /// (`drain`/`undrain` actions).
    pub is_draining: bool,
    /// Revision of this worker's settings, starting at 1; 0 means no record exists yet.
    pub revision: u64,
    /// RFC 3339 UTC timestamp of the last change, supplied by the caller.
    pub updated_at: String,
    /// Audit attribution of the last change.
    pub actor: String,
}
