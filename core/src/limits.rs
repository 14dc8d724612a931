//! Named limits of the contract. The other limits on untrusted input are named, documented
//! `MAX_*`/`MIN_*` constants beside the code that enforces them; `docs/limits.md` lists every
//! one (rendered and checked by `tests/it/tidy.rs`).

/// Request envelope of POST /api/v1/requests (spec, Limits).
pub const MAX_REQUEST_ENVELOPE_BYTES: usize = 4 * 1024 * 1024;
/// Admin mutation bodies: PUT config, rollback, worker actions (spec, Limits).
pub const MAX_ADMIN_BODY_BYTES: usize = 4 * 1024 * 1024;
/// Headers per request (spec, Limits).
pub const MAX_HEADERS: usize = 64;
/// Bytes of one header name (spec, Limits).
pub const MAX_HEADER_NAME_BYTES: usize = 64;
/// Names plus decoded values of all headers (spec, Limits).
pub const MAX_HEADER_TOTAL_BYTES: usize = 16_384;
/// Number of routing tags (spec, Limits).
pub const MAX_ROUTING_TAGS: usize = 32;
/// Bytes of one routing tag (spec, Limits).
pub const MAX_ROUTING_TAG_BYTES: usize = 64;
/// Bytes of `routing.region` and `routing.ip_type` (spec, Limits).
pub const MAX_ROUTING_FIELD_BYTES: usize = 128;
/// Bytes of `routing.sticky_session_id` (decision 001: the spec names no limit).
pub const MAX_STICKY_SESSION_ID_BYTES: usize = 256;
/// Default of `control.request.max_inline_request_body_bytes` (spec, Limits).
pub const DEFAULT_MAX_INLINE_REQUEST_BODY_BYTES: usize = 1024 * 1024;
/// Default of `control.request.max_inline_response_body_bytes` (spec, Limits).
pub const DEFAULT_MAX_INLINE_RESPONSE_BODY_BYTES: usize = 1024 * 1024;
/// Smallest explicit `timeout_ms` (spec, Limits).
pub const MIN_TIMEOUT_MS: u64 = 1000;
/// Default of `control.request.max_timeout_ms` (spec, Limits).
pub const DEFAULT_MAX_TIMEOUT_MS: u64 = 120_000;
/// `default_timeout_ms` when the snapshot sets none (spec, Admin resources).
pub const DEFAULT_TIMEOUT_MS: u64 = 60_000;
/// Receipt metadata of POST /api/v1/receipts (spec, Limits).
pub const MAX_RECEIPT_METADATA_BYTES: usize = 64 * 1024;
/// Bytes of a URL in a request envelope (decision 001).
pub const MAX_URL_BYTES: usize = 8192;
/// Bytes of a fingerprint profile name (decision 001).
pub const MAX_PROFILE_NAME_BYTES: usize = 64;

// Server and egress limits: defaults of config keys (decision 002). The io crate's servers and
// egress client take their defaults from these, so each number is written once.

/// Default of `control.server.header_timeout_ms`: a whole request head, from its first byte.
pub const DEFAULT_HEADER_TIMEOUT_MS: u64 = 10_000;
/// Default of `control.server.idle_timeout_ms`: a keep-alive connection between requests.
pub const DEFAULT_SERVER_IDLE_TIMEOUT_MS: u64 = 60_000;
/// Default of `control.server.body_timeout_ms`: without a request body byte arriving.
pub const DEFAULT_BODY_TIMEOUT_MS: u64 = 30_000;
/// Default of `control.server.write_timeout_ms`: one response write making no progress.
pub const DEFAULT_WRITE_TIMEOUT_MS: u64 = 30_000;
/// `control.server.drain_timeout_ms`: how long in-flight requests and tunnels may run on
/// after a stop or a hand-over to a successor begins; then their connections are closed.
pub const DEFAULT_DRAIN_TIMEOUT_MS: u64 = 10_000;
/// The longest drain a configuration may ask for.
pub const MAX_DRAIN_TIMEOUT_MS: u64 = 3_600_000;
/// Default of `control.server.max_connections_per_core`, per listener.
pub const DEFAULT_MAX_CONNECTIONS_PER_CORE: usize = 16 * 1024;
/// Default of `egress.connect_timeout_ms`: one connect attempt, and the TLS handshake.
pub const DEFAULT_EGRESS_CONNECT_TIMEOUT_MS: u64 = 10_000;
/// Default of `egress.idle_timeout_ms`: without a byte moving while the request is written or
/// the response body read.
pub const DEFAULT_EGRESS_IDLE_TIMEOUT_MS: u64 = 30_000;
/// Default of `egress.pool_idle_timeout_ms`: how long an idle upstream connection is kept.
pub const DEFAULT_POOL_IDLE_TIMEOUT_MS: u64 = 30_000;
/// Smallest accepted value of the timeout keys above.
pub const MIN_LIMIT_TIMEOUT_MS: u64 = 100;
/// Largest accepted value of the timeout keys above (one hour).
pub const MAX_LIMIT_TIMEOUT_MS: u64 = 3_600_000;
/// Largest accepted `control.server.max_connections_per_core`.
pub const MAX_CONNECTIONS_PER_CORE_LIMIT: usize = 1_000_000;
/// Default of `control.request.max_in_flight_body_bytes`: request body bytes (envelopes) all
/// cores together may hold at once (decision 043).
pub const DEFAULT_MAX_IN_FLIGHT_BODY_BYTES: u64 = 512 * 1024 * 1024;
/// Smallest accepted `control.request.max_in_flight_body_bytes`: one envelope at its limit.
pub const MIN_IN_FLIGHT_BODY_BYTES: u64 = MAX_REQUEST_ENVELOPE_BYTES as u64 + 1;
/// Default of `control.request.max_concurrent_per_deployment` (decision 043).
pub const DEFAULT_MAX_CONCURRENT_PER_DEPLOYMENT: u32 = 1024;
/// Largest accepted `control.request.max_concurrent_per_deployment`.
pub const MAX_CONCURRENT_PER_DEPLOYMENT_LIMIT: u32 = 1_000_000;
/// Default of `control.proxy.idle_timeout_ms`: a relayed proxy request with no byte moving
/// while its body is sent or its response body relayed (decision 022).
pub const DEFAULT_PROXY_IDLE_TIMEOUT_MS: u64 = 60_000;
/// Default of `control.proxy.tunnel_idle_timeout_ms`: a CONNECT tunnel with no byte moving in
/// either direction (decision 022).
pub const DEFAULT_TUNNEL_IDLE_TIMEOUT_MS: u64 = 300_000;
/// Largest accepted `control.proxy.tunnel_idle_timeout_ms` (one day): tunnels carry long-lived
/// protocols (WebSocket, database sessions) that idle longer than a request would.
pub const MAX_TUNNEL_IDLE_TIMEOUT_MS: u64 = 86_400_000;
/// Default of `control.proxy.max_tunnels_per_deployment`: concurrent CONNECT tunnels of one
/// deployment across all cores (decision 022).
pub const DEFAULT_MAX_TUNNELS_PER_DEPLOYMENT: u32 = 1024;
/// Largest accepted `control.proxy.max_tunnels_per_deployment`.
pub const MAX_TUNNELS_PER_DEPLOYMENT_LIMIT: u32 = 1_000_000;

/// Largest receipt part (decision 031): 128 MiB, at most `object_storage.max_object_bytes`.
pub const MAX_RECEIPT_PART_BYTES: u64 = 128 * 1024 * 1024;
/// Longest receipt idempotency key accepted.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 256;
/// Longest lifetime a signed worker URL of a receipt may claim (decision 033).
pub const MAX_SIGNED_URL_SECONDS: u64 = 3600;
