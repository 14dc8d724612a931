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

/// One uploaded part of a receipt, recorded once its payload is durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartRecord {
    /// Part number, 1..=10,000.
    pub number: u32,
    /// Bytes stored.
    pub size_bytes: u64,
    /// SHA-256 of the stored bytes, lowercase hex.
    pub sha256_hex: String,
    /// Where the bytes are in the object store: each upload gets a fresh key, so a replaced
    /// or refused upload never overwrites the bytes a recorded part points to.
    pub object_key: String,
}

/// A receipt as the store keeps it (decision 030). Scoped to `deployment_id`: every lookup
/// names the deployment, so another deployment's receipt is simply not found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptRecord {
    /// `rcpt_` id.
    pub receipt_id: String,
    /// Owning deployment.
    pub deployment_id: String,
    /// `request` or `response`.
    pub direction: String,
    /// Lifecycle state.
    pub state: sortie_core::receipt::ReceiptState,
    /// Declared size.
    pub size_bytes: u64,
    /// Declared SHA-256, lowercase hex.
    pub sha256_hex: String,
    /// The client's idempotency key, if it sent one.
    pub idempotency_key: Option<String>,
    /// Parts by ascending number.
    pub parts: Vec<PartRecord>,
    /// RFC 3339 creation time.
    pub created_at: String,
    /// RFC 3339 time of the last change.
    pub updated_at: String,
    /// RFC 3339 expiry time.
    pub expires_at: String,
    /// The expiry as Unix milliseconds, for the sweep.
    pub expires_unix_ms: u64,
    /// Why verification failed, on a rejected receipt.
    pub failure: Option<String>,
}
