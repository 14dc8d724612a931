//! The static configuration file (TOML): its keys, their defaults and their validation. Names
//! follow decision 017; the keys the contract names keep the contract's names
//! (`control.request.max_timeout_ms`, `object_storage.max_object_bytes`, …).
//!
//! Parsing and validation are pure; resolving `*_env` variables, reading files and binding
//! sockets are the io crate's business.

use std::net::{IpAddr, SocketAddr};

use serde::Deserialize;

use crate::hints::{CountryCode, Ingress};
use crate::limits::{
    DEFAULT_BODY_TIMEOUT_MS, DEFAULT_DRAIN_TIMEOUT_MS, DEFAULT_EGRESS_CONNECT_TIMEOUT_MS,
    DEFAULT_EGRESS_IDLE_TIMEOUT_MS, DEFAULT_HEADER_TIMEOUT_MS,
    DEFAULT_MAX_CONCURRENT_PER_DEPLOYMENT, DEFAULT_MAX_CONNECTIONS_PER_CORE,
    DEFAULT_MAX_INLINE_REQUEST_BODY_BYTES, DEFAULT_MAX_INLINE_RESPONSE_BODY_BYTES,
    DEFAULT_MAX_IN_FLIGHT_BODY_BYTES, DEFAULT_MAX_TIMEOUT_MS, DEFAULT_POOL_IDLE_TIMEOUT_MS,
    DEFAULT_SERVER_IDLE_TIMEOUT_MS, DEFAULT_WRITE_TIMEOUT_MS, MAX_CONCURRENT_PER_DEPLOYMENT_LIMIT,
    MAX_CONNECTIONS_PER_CORE_LIMIT, MAX_DRAIN_TIMEOUT_MS, MAX_LIMIT_TIMEOUT_MS,
    MAX_ROUTING_FIELD_BYTES, MAX_ROUTING_TAGS, MAX_ROUTING_TAG_BYTES, MIN_IN_FLIGHT_BODY_BYTES,
    MIN_LIMIT_TIMEOUT_MS, MIN_TIMEOUT_MS,
};
use crate::limits::{
    DEFAULT_MAX_TUNNELS_PER_DEPLOYMENT, DEFAULT_PROXY_IDLE_TIMEOUT_MS,
    DEFAULT_TUNNEL_IDLE_TIMEOUT_MS, MAX_TUNNELS_PER_DEPLOYMENT_LIMIT, MAX_TUNNEL_IDLE_TIMEOUT_MS,
};

/// Default of `object_storage.max_object_bytes`: 5 GiB (decision 002).
pub const DEFAULT_MAX_OBJECT_BYTES: u64 = 5 * 1024 * 1024 * 1024;
/// Default capacity of a local worker.
pub const DEFAULT_WORKER_CAPACITY: u32 = 256;
/// The id of the local worker `serve` runs when the file declares none.
pub const DEFAULT_WORKER_ID: &str = "local";
/// The deployment `serve` creates when the file declares none.
pub const DEFAULT_DEPLOYMENT_ID: &str = "dep_default";
/// Longest identifier (deployment, worker, pool).
pub use crate::snapshot::MAX_ID_BYTES;
/// The pool a worker without `pools` belongs to.
pub use crate::worker::DEFAULT_POOL;
/// At most this many workers in one file.
pub const MAX_CONFIG_WORKERS: usize = 4096;
/// Largest `control.request.max_timeout_ms`: one hour.
pub const MAX_MAX_TIMEOUT_MS: u64 = 3_600_000;
/// Largest inline body limit (each direction): 3 MiB, so that a base64 body still fits the 4 MiB
/// envelope.
pub const MAX_INLINE_BODY_LIMIT: usize = 3 * 1024 * 1024;

/// A configuration error naming the key path and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ConfigError {
    /// The key path, e.g. `control.request.max_timeout_ms` or `workers[1].country`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

fn err(path: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        path: path.into(),
        message: message.into(),
    }
}

/// The whole static configuration, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[control]`.
    #[serde(default)]
    pub control: ControlConfig,
    /// `[[deployments]]`: bearer deployment tokens.
    #[serde(default)]
    pub deployments: Vec<DeploymentConfig>,
    /// `[admin]`.
    #[serde(default)]
    pub admin: AdminConfig,
    /// `[object_storage]`.
    #[serde(default)]
    pub object_storage: ObjectStorageConfig,
    /// `[store]`.
    #[serde(default)]
    pub store: StoreConfig,
    /// `[egress]`.
    #[serde(default)]
    pub egress: EgressConfig,
    /// `[[workers]]`: local executors of `serve`.
    #[serde(default)]
    pub workers: Vec<WorkerConfig>,
    /// `[log]`.
    #[serde(default)]
    pub log: LogConfig,
}

/// `[log]`: how the process writes its log to stderr (decision 107).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `text` (the default: one readable line per event) or `json` (one JSON object per line).
    pub format: LogFormat,
    /// Which events are written: a level (`error`, `warn`, `info`, `debug`, `trace`) or
    /// `tracing` filter directives such as `info,sortie_io::remote=debug`. `RUST_LOG`, when
    /// set, takes precedence. Default `info`.
    pub level: String,
    /// One `access` line per request of the request API, the forward proxy and CONNECT, at
    /// level info with target `sortie::access` (decision 113). Off by default.
    pub access: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::default(),
            level: DEFAULT_LOG_LEVEL.to_owned(),
            access: false,
        }
    }
}

/// `log.level` when the file does not set it.
pub const DEFAULT_LOG_LEVEL: &str = "info";
/// The longest `log.level`.
pub const MAX_LOG_LEVEL_BYTES: usize = 512;

impl LogConfig {
    /// Checks `log.level`'s shape: the filter itself is parsed where the log is set up.
    fn validate(&self) -> Result<(), ConfigError> {
        let l = &self.level;
        if l.is_empty() || l.len() > MAX_LOG_LEVEL_BYTES || !l.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(err(
                "log.level",
                format!(
                    "must be 1 to {MAX_LOG_LEVEL_BYTES} printable characters without spaces, such as \"info\" or \"info,sortie_io=debug\""
                ),
            ));
        }
        Ok(())
    }
}

/// `log.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One readable line per event.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `message` and the event's fields at the
    /// top level, for log pipelines.
    Json,
}

/// `[control]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControlConfig {
    /// Request and receipt API listener.
    pub api_listen: String,
    /// Admin API listener; `None` disables the admin API.
    pub admin_listen: Option<String>,
    /// Forward-proxy listener; `None` disables the proxy ingress.
    pub proxy_listen: Option<String>,
    /// Worker bus listener (`control` mode).
    pub bus_listen: Option<String>,
    /// Hot cores; 0 means all available.
    pub cores: u32,
    /// Data directory (SQLite, filesystem objects, tokens).
    pub data_dir: String,
    /// A snapshot file (JSON) used as revision 1 of a fresh data directory instead of the
    /// built-in default snapshot; ignored once the store holds a revision.
    pub bootstrap_snapshot: Option<String>,
    /// `[control.request]`.
    pub request: RequestLimitsConfig,
    /// `[control.server]`.
    pub server: ServerLimitsConfig,
    /// `[control.bus]`: the worker bus listener's security and timing (decision 060).
    pub bus: BusConfig,
    /// `[control.proxy]`.
    pub proxy: ProxyLimitsConfig,
    /// Destination ports no ingress connects to, whatever the address (decision 103): SMTP's
    /// relay port 25 by default; `[]` refuses none.
    pub denied_destination_ports: Vec<u16>,
}

pub use crate::destination::DEFAULT_DENIED_DESTINATION_PORTS;

/// The forward-proxy listener of the embedded defaults (`sortie serve` without a file).
pub const EMBEDDED_PROXY_LISTEN: &str = "127.0.0.1:3128";

/// Default of `control.bus.heartbeat_ms`.
pub const DEFAULT_BUS_HEARTBEAT_MS: u32 = 1000;
/// Default of `control.bus.assignment_timeout_ms`.
pub const DEFAULT_BUS_ASSIGNMENT_TIMEOUT_MS: u64 = 5000;
/// Default of `control.bus.forget_disconnected_ms`: a day.
pub const DEFAULT_BUS_FORGET_DISCONNECTED_MS: u64 = 86_400_000;
/// Bounds of `control.bus.forget_disconnected_ms`: a second to a year.
pub const BUS_FORGET_DISCONNECTED_MS_RANGE: std::ops::RangeInclusive<u64> = 1000..=31_536_000_000;

/// `[control.bus]`: who may attach to the bus listener and how.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BusConfig {
    /// The worker token, required with `control.bus_listen` (or `token_env`).
    pub token: Option<String>,
    /// The environment variable holding the worker token.
    pub token_env: Option<String>,
    /// PEM certificate chain of the TLS listener.
    pub tls_cert_file: Option<String>,
    /// PEM private key of the TLS listener.
    pub tls_key_file: Option<String>,
    /// PEM CA certificates of workers' client certificates: when set, every lane must present
    /// a certificate that chains to one of them and names the `Hello`'s worker id as a DNS
    /// name in its subject alternative names (decision 109). TLS only.
    pub tls_client_ca_file: Option<String>,
    /// Plain TCP instead of TLS; must be said explicitly.
    pub plaintext: bool,
    /// How often workers send heartbeats; a lane silent for three intervals is closed.
    pub heartbeat_ms: u32,
    /// How long a worker may take to accept or refuse an assignment.
    pub assignment_timeout_ms: u64,
    /// How long the record of a disconnected remote worker is kept: after that the worker is
    /// forgotten (its operator settings, if any, stay, listed as `unregistered`).
    pub forget_disconnected_ms: u64,
    /// The base URL (`http://host:port` or `https://...`) at which remote workers reach this
    /// control's API listener to fetch receipt bodies (decision 065). Unset: the control's
    /// address on each worker's bus connection with the API listener's port, over `http`.
    #[serde(default)]
    pub api_base_url: Option<String>,
    /// `[[control.bus.workers]]`: each worker's own token and grants (decision 105). When any
    /// is given, only these ids are admitted, each with its own token, and `token` /
    /// `token_env` (the shared token) must not be set.
    pub workers: Vec<BusWorkerConfig>,
}

/// Most `[[control.bus.workers]]` entries.
pub const MAX_BUS_WORKERS: usize = 10_000;

/// `[[control.bus.workers]]`: one worker's credential and what it may claim (decision 105).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BusWorkerConfig {
    /// The worker id its `Hello` must name.
    pub id: String,
    /// Its token (or `token_env`).
    #[serde(default)]
    pub token: Option<String>,
    /// The environment variable holding its token.
    #[serde(default)]
    pub token_env: Option<String>,
    /// Most concurrent requests it may take: a larger advertised capacity is clipped to this.
    #[serde(default)]
    pub max_capacity: Option<u32>,
    /// The pools it may serve; a `Hello` claiming another is refused. Unset: any.
    #[serde(default)]
    pub pools: Option<Vec<String>>,
    /// The tags it may advertise; a `Hello` claiming another is refused. Unset: any.
    #[serde(default)]
    pub tags: Option<Vec<String>>,
}

impl BusWorkerConfig {
    /// Its token as a secret reference.
    pub fn secret(&self) -> SecretRef {
        SecretRef {
            token: self.token.clone(),
            token_env: self.token_env.clone(),
        }
    }

    /// What the control grants it.
    pub fn grant(&self) -> crate::worker::WorkerGrant<'_> {
        crate::worker::WorkerGrant {
            max_capacity: self.max_capacity,
            pools: self.pools.as_deref(),
            tags: self.tags.as_deref(),
        }
    }
}

impl Default for BusConfig {
    fn default() -> Self {
        BusConfig {
            token: None,
            token_env: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_client_ca_file: None,
            plaintext: false,
            heartbeat_ms: DEFAULT_BUS_HEARTBEAT_MS,
            assignment_timeout_ms: DEFAULT_BUS_ASSIGNMENT_TIMEOUT_MS,
            forget_disconnected_ms: DEFAULT_BUS_FORGET_DISCONNECTED_MS,
            api_base_url: None,
            workers: Vec::new(),
        }
    }
}

impl BusConfig {
    fn validate_workers(&self) -> Result<(), ConfigError> {
        if self.token.is_some() || self.token_env.is_some() {
            return Err(err(
                "control.bus.token",
                "a shared worker token is not used with [[control.bus.workers]]: each worker \
                 has its own",
            ));
        }
        if self.workers.len() > MAX_BUS_WORKERS {
            return Err(err(
                "control.bus.workers",
                format!("at most {MAX_BUS_WORKERS} entries"),
            ));
        }
        for (i, w) in self.workers.iter().enumerate() {
            let p = format!("control.bus.workers[{i}]");
            if !is_valid_id(&w.id) {
                return Err(err(format!("{p}.id"), "not a valid id"));
            }
            if self.workers.iter().take(i).any(|o| o.id == w.id) {
                return Err(err(
                    format!("{p}.id"),
                    format!("duplicate worker id {:?}", w.id),
                ));
            }
            check_secret(&p, &w.secret(), true)?;
            if let Some(t) = &w.token {
                if self
                    .workers
                    .iter()
                    .take(i)
                    .any(|o| o.token.as_ref() == Some(t))
                {
                    return Err(err(
                        format!("{p}.token"),
                        "the same token as another worker: give each its own",
                    ));
                }
            }
            if w.max_capacity
                .is_some_and(|c| !(1..=crate::worker::MAX_WORKER_CAPACITY).contains(&c))
            {
                return Err(err(
                    format!("{p}.max_capacity"),
                    format!("must be 1 to {}", crate::worker::MAX_WORKER_CAPACITY),
                ));
            }
        }
        Ok(())
    }

    /// The worker token as a secret reference.
    pub fn secret(&self) -> SecretRef {
        SecretRef {
            token: self.token.clone(),
            token_env: self.token_env.clone(),
        }
    }

    fn validate(&self, is_listening: bool) -> Result<(), ConfigError> {
        if !(100..=60_000).contains(&self.heartbeat_ms) {
            return Err(err("control.bus.heartbeat_ms", "must be 100 to 60000"));
        }
        if !(MIN_LIMIT_TIMEOUT_MS..=MAX_LIMIT_TIMEOUT_MS).contains(&self.assignment_timeout_ms) {
            return Err(err(
                "control.bus.assignment_timeout_ms",
                format!("must be {MIN_LIMIT_TIMEOUT_MS} to {MAX_LIMIT_TIMEOUT_MS}"),
            ));
        }
        if !BUS_FORGET_DISCONNECTED_MS_RANGE.contains(&self.forget_disconnected_ms) {
            return Err(err(
                "control.bus.forget_disconnected_ms",
                format!(
                    "must be {} to {}",
                    BUS_FORGET_DISCONNECTED_MS_RANGE.start(),
                    BUS_FORGET_DISCONNECTED_MS_RANGE.end()
                ),
            ));
        }
        if let Some(u) = &self.api_base_url {
            let rest = u
                .strip_prefix("http://")
                .or_else(|| u.strip_prefix("https://"));
            let is_valid = rest.is_some_and(|r| {
                !r.is_empty()
                    && r.len() <= 2048
                    && r.bytes().all(|b| b.is_ascii_graphic())
                    && !r.contains(['?', '#', '@'])
            }) && crate::request::parse_target_url(u).is_ok();
            // Parsed as workers parse the receipt URLs built on it: its port is the receipt
            // port announced to them (decision 068).
            if !is_valid {
                return Err(err(
                    "control.bus.api_base_url",
                    "must be an http:// or https:// URL without query, fragment or user info",
                ));
            }
        }
        if self.workers.is_empty() {
            check_secret("control.bus", &self.secret(), is_listening)?;
        } else {
            self.validate_workers()?;
        }
        check_transport(
            "control.bus",
            self.plaintext,
            &[
                ("tls_cert_file", &self.tls_cert_file),
                ("tls_key_file", &self.tls_key_file),
            ],
            is_listening,
        )?;
        check_transport(
            "control.bus",
            self.plaintext,
            &[("tls_client_ca_file", &self.tls_client_ca_file)],
            false,
        )
    }
}

/// TLS unless `plaintext = true` is said; with TLS every named file is required.
fn check_transport(
    path: &str,
    is_plaintext: bool,
    files: &[(&str, &Option<String>)],
    is_required: bool,
) -> Result<(), ConfigError> {
    for (k, v) in files {
        match v {
            Some(f) if f.is_empty() => return Err(err(format!("{path}.{k}"), "must not be empty")),
            Some(_) if is_plaintext => {
                return Err(err(
                    format!("{path}.{k}"),
                    "is not used with plaintext = true",
                ))
            }
            None if is_required && !is_plaintext => {
                return Err(err(
                    format!("{path}.{k}"),
                    "is required (TLS), or set plaintext = true for plain TCP",
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig {
            api_listen: "127.0.0.1:8080".into(),
            admin_listen: Some("127.0.0.1:8081".into()),
            proxy_listen: None,
            bus_listen: None,
            cores: 0,
            data_dir: "./sortie-data".into(),
            bootstrap_snapshot: None,
            request: RequestLimitsConfig::default(),
            server: ServerLimitsConfig::default(),
            bus: BusConfig::default(),
            proxy: ProxyLimitsConfig::default(),
            denied_destination_ports: DEFAULT_DENIED_DESTINATION_PORTS.to_vec(),
        }
    }
}

/// `[control.request]`: the static request limits the contract names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RequestLimitsConfig {
    /// `control.request.max_timeout_ms`.
    pub max_timeout_ms: u64,
    /// `control.request.max_inline_request_body_bytes`.
    pub max_inline_request_body_bytes: usize,
    /// `control.request.max_inline_response_body_bytes`.
    pub max_inline_response_body_bytes: usize,
    /// `control.request.max_in_flight_body_bytes`: request envelope bytes all cores may hold
    /// at once, reserved from the head (decision 043).
    pub max_in_flight_body_bytes: u64,
    /// `control.request.max_concurrent_per_deployment`: requests one deployment may have in
    /// flight on the request API, from admission to answer (decision 043).
    pub max_concurrent_per_deployment: u32,
}

impl Default for RequestLimitsConfig {
    fn default() -> Self {
        RequestLimitsConfig {
            max_timeout_ms: DEFAULT_MAX_TIMEOUT_MS,
            max_inline_request_body_bytes: DEFAULT_MAX_INLINE_REQUEST_BODY_BYTES,
            max_inline_response_body_bytes: DEFAULT_MAX_INLINE_RESPONSE_BODY_BYTES,
            max_in_flight_body_bytes: DEFAULT_MAX_IN_FLIGHT_BODY_BYTES,
            max_concurrent_per_deployment: DEFAULT_MAX_CONCURRENT_PER_DEPLOYMENT,
        }
    }
}

/// `[control.server]`: limits of the HTTP servers behind every listener (API, admin, proxy),
/// applied per core and per listener (decision 002).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerLimitsConfig {
    /// A whole request head, from its first byte; then 408 and close.
    pub header_timeout_ms: u64,
    /// A keep-alive connection waiting for its next request; then it is closed.
    pub idle_timeout_ms: u64,
    /// Without a request body byte arriving while a body is read; then 408 and close.
    pub body_timeout_ms: u64,
    /// One response write making no progress; then the connection is closed.
    pub write_timeout_ms: u64,
    /// Connections one core serves at once on one listener; beyond it, 503 and close.
    pub max_connections_per_core: usize,
    /// After a stop or a hand-over to a successor begins, how long in-flight requests and
    /// tunnels may run on; then their connections are closed (decision 115).
    pub drain_timeout_ms: u64,
}

impl Default for ServerLimitsConfig {
    fn default() -> Self {
        ServerLimitsConfig {
            header_timeout_ms: DEFAULT_HEADER_TIMEOUT_MS,
            idle_timeout_ms: DEFAULT_SERVER_IDLE_TIMEOUT_MS,
            body_timeout_ms: DEFAULT_BODY_TIMEOUT_MS,
            write_timeout_ms: DEFAULT_WRITE_TIMEOUT_MS,
            max_connections_per_core: DEFAULT_MAX_CONNECTIONS_PER_CORE,
            drain_timeout_ms: DEFAULT_DRAIN_TIMEOUT_MS,
        }
    }
}

/// `[control.proxy]`: limits of the forward-proxy ingress (decision 022).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyLimitsConfig {
    /// A relayed request with no byte moving while its body is sent or its response body
    /// relayed; then the request fails with `idle_timeout`.
    pub idle_timeout_ms: u64,
    /// A CONNECT tunnel with no byte moving in either direction; then it is closed.
    pub tunnel_idle_timeout_ms: u64,
    /// Concurrent CONNECT tunnels of one deployment across all cores; beyond it, 503
    /// `executor_capacity_exhausted`.
    pub max_tunnels_per_deployment: u32,
}

impl Default for ProxyLimitsConfig {
    fn default() -> Self {
        ProxyLimitsConfig {
            idle_timeout_ms: DEFAULT_PROXY_IDLE_TIMEOUT_MS,
            tunnel_idle_timeout_ms: DEFAULT_TUNNEL_IDLE_TIMEOUT_MS,
            max_tunnels_per_deployment: DEFAULT_MAX_TUNNELS_PER_DEPLOYMENT,
        }
    }
}

/// A secret given inline or by the name of an environment variable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    /// The secret itself (discouraged: prefer `token_env`).
    #[serde(default)]
    pub token: Option<String>,
    /// The environment variable holding the secret.
    #[serde(default)]
    pub token_env: Option<String>,
}

/// `[[deployments]]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentConfig {
    /// Deployment id.
    pub id: String,
    /// The bearer token.
    #[serde(flatten)]
    pub secret: SecretRef,
}

/// `[admin]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// The admin bearer token; generated into the data dir when not set.
    #[serde(flatten)]
    pub secret: SecretRef,
}

/// Object storage backends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ObjectBackend {
    /// Files under `data_dir/objects`.
    #[default]
    Fs,
    /// An S3-compatible service.
    S3,
}

/// `[object_storage]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ObjectStorageConfig {
    /// Whether the receipt API exists.
    pub enabled: bool,
    /// Backend.
    pub backend: ObjectBackend,
    /// `object_storage.max_object_bytes`.
    pub max_object_bytes: u64,
    /// S3 bucket.
    pub bucket: Option<String>,
    /// S3 endpoint URL.
    pub endpoint: Option<String>,
    /// S3 region.
    pub region: Option<String>,
    /// Path-style addressing.
    pub force_path_style: bool,
    /// Environment variable with the S3 access key id.
    pub access_key_env: Option<String>,
    /// Environment variable with the S3 secret key.
    pub secret_key_env: Option<String>,
    /// `object_storage.receipt_ttl_seconds`: lifetime of a receipt from its creation
    /// (decision 031).
    pub receipt_ttl_seconds: u64,
    /// Environment variable holding the key that signs worker URLs (64 hex digits), shared by
    /// every control of a deployment (decision 093). Unset: a key file in `data_dir`.
    pub signing_key_env: Option<String>,
}

/// Largest `object_storage.receipt_ttl_seconds`: 30 days.
pub const MAX_RECEIPT_TTL_SECONDS: u64 = 30 * 24 * 3600;

/// Default of `object_storage.receipt_ttl_seconds`: 24 hours (decision 031).
pub const DEFAULT_RECEIPT_TTL_SECONDS: u64 = 24 * 3600;

impl Default for ObjectStorageConfig {
    fn default() -> Self {
        ObjectStorageConfig {
            enabled: false,
            backend: ObjectBackend::Fs,
            max_object_bytes: DEFAULT_MAX_OBJECT_BYTES,
            bucket: None,
            endpoint: None,
            region: None,
            force_path_style: false,
            access_key_env: None,
            secret_key_env: None,
            receipt_ttl_seconds: DEFAULT_RECEIPT_TTL_SECONDS,
            signing_key_env: None,
        }
    }
}

/// Record store backends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    /// SQLite under `data_dir`.
    #[default]
    Sqlite,
    /// PostgreSQL at the URL in `url_env`.
    Postgres,
}

/// Default of `store.heartbeat_ms`.
pub const DEFAULT_STORE_HEARTBEAT_MS: u32 = 1000;
/// Default of `store.control_expiry_ms`.
pub const DEFAULT_CONTROL_EXPIRY_MS: u32 = 10_000;
/// Default of `store.cancel_poll_ms`.
pub const DEFAULT_CANCEL_POLL_MS: u32 = 200;
/// Bounds of `store.heartbeat_ms`.
pub const STORE_HEARTBEAT_MS_RANGE: std::ops::RangeInclusive<u32> = 100..=60_000;
/// Bounds of `store.control_expiry_ms`; it must also span three heartbeats.
pub const CONTROL_EXPIRY_MS_RANGE: std::ops::RangeInclusive<u32> = 1_000..=3_600_000;
/// Bounds of `store.cancel_poll_ms`: at most a third of the 3 s a cancel waits for the owner
/// (decision 095), so the owner polls at least three times within it.
pub const CANCEL_POLL_MS_RANGE: std::ops::RangeInclusive<u32> = 50..=1_000;

/// `[store]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// Backend.
    pub backend: StoreBackend,
    /// Environment variable with the PostgreSQL URL.
    pub url_env: Option<String>,
    /// PEM file of CA certificates trusted for the PostgreSQL server, in addition to the
    /// webpki roots, when the URL asks for TLS (`sslmode=require`; decision 091).
    pub ca_file: Option<String>,
    /// On a shared store, how often this control refreshes its heartbeat row (decisions 094,
    /// 099).
    pub heartbeat_ms: u32,
    /// On a shared store, how long after its last heartbeat the others count this control as
    /// dead and recover the receipts it held. Recorded in its row, so each control is judged by
    /// its own setting.
    pub control_expiry_ms: u32,
    /// On a shared store, how often this control looks for cancel intents naming requests it
    /// runs (decision 095).
    pub cancel_poll_ms: u32,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            backend: StoreBackend::default(),
            url_env: None,
            ca_file: None,
            heartbeat_ms: DEFAULT_STORE_HEARTBEAT_MS,
            control_expiry_ms: DEFAULT_CONTROL_EXPIRY_MS,
            cancel_poll_ms: DEFAULT_CANCEL_POLL_MS,
        }
    }
}

impl StoreConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let range =
            |r: &std::ops::RangeInclusive<u32>| format!("must be {} to {}", r.start(), r.end());
        if !STORE_HEARTBEAT_MS_RANGE.contains(&self.heartbeat_ms) {
            return Err(err("store.heartbeat_ms", range(&STORE_HEARTBEAT_MS_RANGE)));
        }
        if !CONTROL_EXPIRY_MS_RANGE.contains(&self.control_expiry_ms) {
            return Err(err(
                "store.control_expiry_ms",
                range(&CONTROL_EXPIRY_MS_RANGE),
            ));
        }
        // Two missed beats (a slow store call, a busy cold thread) must not make a live
        // control look dead.
        if u64::from(self.control_expiry_ms) < 3 * u64::from(self.heartbeat_ms) {
            return Err(err(
                "store.control_expiry_ms",
                "must be at least three heartbeats (3 × store.heartbeat_ms)",
            ));
        }
        if !CANCEL_POLL_MS_RANGE.contains(&self.cancel_poll_ms) {
            return Err(err("store.cancel_poll_ms", range(&CANCEL_POLL_MS_RANGE)));
        }
        Ok(())
    }
}

/// `[egress]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EgressConfig {
    /// PEM file of extra trusted roots, in addition to the bundled web PKI roots.
    pub ca_file: Option<String>,
    /// One connect attempt (per resolved address), and again the TLS handshake.
    pub connect_timeout_ms: u64,
    /// Without a byte moving while the request is written or the response body read.
    pub idle_timeout_ms: u64,
    /// How long an idle upstream connection is kept for reuse.
    pub pool_idle_timeout_ms: u64,
}

impl Default for EgressConfig {
    fn default() -> Self {
        EgressConfig {
            ca_file: None,
            connect_timeout_ms: DEFAULT_EGRESS_CONNECT_TIMEOUT_MS,
            idle_timeout_ms: DEFAULT_EGRESS_IDLE_TIMEOUT_MS,
            pool_idle_timeout_ms: DEFAULT_POOL_IDLE_TIMEOUT_MS,
        }
    }
}

/// `[[workers]]`: a local executor.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    /// Worker id.
    pub id: String,
    /// Concurrent requests it may run.
    #[serde(default = "default_capacity")]
    pub capacity: u32,
    /// Advertised tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Advertised country (normalised to uppercase on validation).
    #[serde(default)]
    pub country: Option<String>,
    /// Advertised region.
    #[serde(default)]
    pub region: Option<String>,
    /// Advertised IP type.
    #[serde(default)]
    pub ip_type: Option<String>,
    /// Pools it serves; none means `direct`.
    #[serde(default)]
    pub pools: Vec<String>,
    /// Ingress modes it serves; none means all three.
    #[serde(default)]
    pub ingress: Vec<String>,
    /// Egress source address.
    #[serde(default)]
    pub bind_address: Option<String>,
}

fn default_capacity() -> u32 {
    DEFAULT_WORKER_CAPACITY
}

impl Config {
    /// Parses and validates a TOML document.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let mut c = Config::parse(text)?;
        c.validate()?;
        Ok(c)
    }

    /// The embedded defaults of `sortie serve` with no file.
    pub fn embedded_default() -> Config {
        let mut c = Config::default();
        // `sortie serve` without a file is how people try the gateway first: the forward proxy
        // answers too, on loopback, with the deployment's Basic credentials (decision 106). A
        // file names the listeners it wants.
        c.control.proxy_listen = Some(EMBEDDED_PROXY_LISTEN.into());
        // The defaults are valid by construction; validation fills in the default worker.
        let _ = c.validate();
        c
    }

    /// Parses and validates the file of `sortie control`: like [`Config::from_toml`], but no
    /// local worker is implied (remote workers attach over the bus), and `control.bus_listen`
    /// is required.
    pub fn from_toml_control(text: &str) -> Result<Config, ConfigError> {
        let mut c = Config::parse(text)?;
        c.validate_with(false)?;
        if c.control.bus_listen.is_none() {
            return Err(err(
                "control.bus_listen",
                "is required by sortie control (workers attach there)",
            ));
        }
        Ok(c)
    }

    fn parse(text: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| {
            let span = e.span().map(|s| line_of(text, s.start));
            let msg = e.message().trim().to_string();
            match span {
                Some(line) => err(format!("line {line}"), msg),
                None => err("config", msg),
            }
        })
    }

    /// Validates every key and fills in derived defaults (the default worker, worker pools,
    /// uppercase countries).
    pub fn validate(&mut self) -> Result<(), ConfigError> {
        self.validate_with(true)
    }

    fn validate_with(&mut self, is_local_implied: bool) -> Result<(), ConfigError> {
        self.validate_control()?;
        self.validate_credentials()?;
        self.validate_storage()?;
        self.validate_workers(is_local_implied)
    }

    /// `[control]` and its tables: listeners, cores, request, server and proxy limits, the
    /// refused destination ports.
    fn validate_control(&self) -> Result<(), ConfigError> {
        self.control
            .bus
            .validate(self.control.bus_listen.is_some())?;
        let c = &self.control;
        parse_listen("control.api_listen", &c.api_listen)?;
        for (k, v) in [
            ("control.admin_listen", &c.admin_listen),
            ("control.proxy_listen", &c.proxy_listen),
            ("control.bus_listen", &c.bus_listen),
        ] {
            if let Some(v) = v {
                parse_listen(k, v)?;
            }
        }
        if c.cores > 1024 {
            return Err(err("control.cores", "must be 0 (all) to 1024"));
        }
        if c.data_dir.is_empty() {
            return Err(err("control.data_dir", "must not be empty"));
        }
        let r = &c.request;
        if !(MIN_TIMEOUT_MS..=MAX_MAX_TIMEOUT_MS).contains(&r.max_timeout_ms) {
            return Err(err(
                "control.request.max_timeout_ms",
                format!("must be {MIN_TIMEOUT_MS} to {MAX_MAX_TIMEOUT_MS}"),
            ));
        }
        for (k, v) in [
            (
                "control.request.max_inline_request_body_bytes",
                r.max_inline_request_body_bytes,
            ),
            (
                "control.request.max_inline_response_body_bytes",
                r.max_inline_response_body_bytes,
            ),
        ] {
            if v > MAX_INLINE_BODY_LIMIT {
                return Err(err(k, format!("must be at most {MAX_INLINE_BODY_LIMIT}")));
            }
        }

        if r.max_in_flight_body_bytes < MIN_IN_FLIGHT_BODY_BYTES {
            return Err(err(
                "control.request.max_in_flight_body_bytes",
                format!("must be at least {MIN_IN_FLIGHT_BODY_BYTES} (one envelope at its limit)"),
            ));
        }
        if !(1..=MAX_CONCURRENT_PER_DEPLOYMENT_LIMIT).contains(&r.max_concurrent_per_deployment) {
            return Err(err(
                "control.request.max_concurrent_per_deployment",
                format!("must be 1 to {MAX_CONCURRENT_PER_DEPLOYMENT_LIMIT}"),
            ));
        }
        let sv = &c.server;
        let e = &self.egress;
        for (k, v) in [
            ("control.server.header_timeout_ms", sv.header_timeout_ms),
            ("control.server.idle_timeout_ms", sv.idle_timeout_ms),
            ("control.server.body_timeout_ms", sv.body_timeout_ms),
            ("control.server.write_timeout_ms", sv.write_timeout_ms),
            ("control.proxy.idle_timeout_ms", c.proxy.idle_timeout_ms),
            ("egress.connect_timeout_ms", e.connect_timeout_ms),
            ("egress.idle_timeout_ms", e.idle_timeout_ms),
            ("egress.pool_idle_timeout_ms", e.pool_idle_timeout_ms),
        ] {
            if !(MIN_LIMIT_TIMEOUT_MS..=MAX_LIMIT_TIMEOUT_MS).contains(&v) {
                return Err(err(
                    k,
                    format!("must be {MIN_LIMIT_TIMEOUT_MS} to {MAX_LIMIT_TIMEOUT_MS}"),
                ));
            }
        }
        if sv.drain_timeout_ms > MAX_DRAIN_TIMEOUT_MS {
            return Err(err(
                "control.server.drain_timeout_ms",
                format!("must be 0 to {MAX_DRAIN_TIMEOUT_MS}"),
            ));
        }
        let px = &c.proxy;
        if !(MIN_LIMIT_TIMEOUT_MS..=MAX_TUNNEL_IDLE_TIMEOUT_MS).contains(&px.tunnel_idle_timeout_ms)
        {
            return Err(err(
                "control.proxy.tunnel_idle_timeout_ms",
                format!("must be {MIN_LIMIT_TIMEOUT_MS} to {MAX_TUNNEL_IDLE_TIMEOUT_MS}"),
            ));
        }
        if !(1..=MAX_TUNNELS_PER_DEPLOYMENT_LIMIT).contains(&px.max_tunnels_per_deployment) {
            return Err(err(
                "control.proxy.max_tunnels_per_deployment",
                format!("must be 1 to {MAX_TUNNELS_PER_DEPLOYMENT_LIMIT}"),
            ));
        }
        if !(1..=MAX_CONNECTIONS_PER_CORE_LIMIT).contains(&sv.max_connections_per_core) {
            return Err(err(
                "control.server.max_connections_per_core",
                format!("must be 1 to {MAX_CONNECTIONS_PER_CORE_LIMIT}"),
            ));
        }

        let ports = &self.control.denied_destination_ports;
        if ports.len() > crate::destination::DeniedPorts::MAX {
            return Err(err(
                "control.denied_destination_ports",
                format!("at most {} ports", crate::destination::DeniedPorts::MAX),
            ));
        }
        for (i, p) in ports.iter().enumerate() {
            if *p == 0 || ports.iter().skip(i + 1).any(|q| q == p) {
                return Err(err(
                    format!("control.denied_destination_ports[{i}]"),
                    "ports are 1 to 65535, each once",
                ));
            }
        }

        Ok(())
    }

    /// `[[deployments]]` and `[admin]`: ids, token sources, and no token written twice.
    fn validate_credentials(&self) -> Result<(), ConfigError> {
        let mut seen = Vec::new();
        for (i, d) in self.deployments.iter().enumerate() {
            let p = format!("deployments[{i}]");
            check_id(&format!("{p}.id"), &d.id)?;
            if seen.contains(&&d.id) {
                return Err(err(
                    format!("{p}.id"),
                    format!("duplicate deployment id {:?}", d.id),
                ));
            }
            seen.push(&d.id);
            check_secret(&p, &d.secret, true)?;
        }
        check_secret("admin", &self.admin.secret, false)?;
        // Tokens written in the file must differ (decision 102; the ones from the environment
        // are compared once resolved, at start).
        let inline: Vec<(String, &str)> = self
            .deployments
            .iter()
            .enumerate()
            .filter_map(|(i, d)| {
                d.secret
                    .token
                    .as_deref()
                    .map(|t| (format!("deployments[{i}].token"), t))
            })
            .chain(
                self.admin
                    .secret
                    .token
                    .as_deref()
                    .map(|t| ("admin.token".to_string(), t)),
            )
            .collect();
        for (i, (a, ta)) in inline.iter().enumerate() {
            if let Some((b, _)) = inline.iter().skip(i + 1).find(|(_, tb)| tb == ta) {
                return Err(err(
                    b.clone(),
                    format!("the same token as {a}: give each its own"),
                ));
            }
        }

        Ok(())
    }

    /// `[object_storage]`, `[store]` and the egress CA file.
    fn validate_storage(&self) -> Result<(), ConfigError> {
        let o = &self.object_storage;
        if o.enabled && o.max_object_bytes == 0 {
            return Err(err(
                "object_storage.max_object_bytes",
                "must be greater than 0",
            ));
        }
        if o.enabled && !(1..=MAX_RECEIPT_TTL_SECONDS).contains(&o.receipt_ttl_seconds) {
            return Err(err(
                "object_storage.receipt_ttl_seconds",
                "must be between 1 and 2592000 (30 days)",
            ));
        }
        if o.enabled && o.backend == ObjectBackend::S3 {
            for (k, v) in [
                ("object_storage.bucket", &o.bucket),
                ("object_storage.endpoint", &o.endpoint),
                ("object_storage.access_key_env", &o.access_key_env),
                ("object_storage.secret_key_env", &o.secret_key_env),
            ] {
                if v.as_deref().is_none_or(str::is_empty) {
                    return Err(err(k, "is required with backend = \"s3\""));
                }
            }
        }
        if o.signing_key_env.as_deref() == Some("") {
            return Err(err(
                "object_storage.signing_key_env",
                "must name an environment variable",
            ));
        }
        if self.store.backend == StoreBackend::Postgres
            && self.store.url_env.as_deref().is_none_or(str::is_empty)
        {
            return Err(err(
                "store.url_env",
                "is required with backend = \"postgres\"",
            ));
        }
        if self.store.ca_file.as_deref() == Some("") {
            return Err(err("store.ca_file", "must not be empty"));
        }
        self.store.validate()?;
        self.log.validate()?;
        if let Some(f) = &self.egress.ca_file {
            if f.is_empty() {
                return Err(err("egress.ca_file", "must not be empty"));
            }
        }

        Ok(())
    }

    /// `[[workers]]`, with the implied local worker when none is configured.
    fn validate_workers(&mut self, is_local_implied: bool) -> Result<(), ConfigError> {
        if self.workers.len() > MAX_CONFIG_WORKERS {
            return Err(err(
                "workers",
                format!("at most {MAX_CONFIG_WORKERS} workers"),
            ));
        }
        if self.workers.is_empty() && is_local_implied {
            self.workers.push(WorkerConfig {
                id: DEFAULT_WORKER_ID.into(),
                capacity: DEFAULT_WORKER_CAPACITY,
                tags: vec![],
                country: None,
                region: None,
                ip_type: None,
                pools: vec![],
                ingress: vec![],
                bind_address: None,
            });
        }
        let mut ids: Vec<&str> = Vec::new();
        for (i, w) in self.workers.iter_mut().enumerate() {
            let p = format!("workers[{i}]");
            check_id(&format!("{p}.id"), &w.id)?;
            if ids.contains(&w.id.as_str()) {
                return Err(err(
                    format!("{p}.id"),
                    format!("duplicate worker id {:?}", w.id),
                ));
            }
            if w.capacity == 0 || w.capacity > 1_000_000 {
                return Err(err(format!("{p}.capacity"), "must be 1 to 1000000"));
            }
            if w.tags.len() > MAX_ROUTING_TAGS {
                return Err(err(
                    format!("{p}.tags"),
                    format!("at most {MAX_ROUTING_TAGS} tags"),
                ));
            }
            for (j, t) in w.tags.iter().enumerate() {
                if t.is_empty() || t.len() > MAX_ROUTING_TAG_BYTES {
                    return Err(err(
                        format!("{p}.tags[{j}]"),
                        format!("must be 1 to {MAX_ROUTING_TAG_BYTES} bytes"),
                    ));
                }
                if w.tags.iter().take(j).any(|prev| prev == t) {
                    return Err(err(format!("{p}.tags[{j}]"), "duplicate tag"));
                }
            }
            if let Some(cc) = &w.country {
                let code = CountryCode::parse(cc).ok_or_else(|| {
                    err(
                        format!("{p}.country"),
                        "must be a two-letter ISO 3166-1 country code",
                    )
                })?;
                w.country = Some(code.as_str().to_string());
            }
            for (k, v) in [("region", &w.region), ("ip_type", &w.ip_type)] {
                if let Some(v) = v {
                    if v.is_empty() || v.len() > MAX_ROUTING_FIELD_BYTES {
                        return Err(err(
                            format!("{p}.{k}"),
                            format!("must be 1 to {MAX_ROUTING_FIELD_BYTES} bytes"),
                        ));
                    }
                }
            }
            if w.pools.is_empty() {
                w.pools.push(DEFAULT_POOL.into());
            }
            for (j, pool) in w.pools.iter().enumerate() {
                check_id(&format!("{p}.pools[{j}]"), pool)?;
            }
            for (j, m) in w.ingress.iter().enumerate() {
                if Ingress::from_wire(m).is_none() {
                    return Err(err(
                        format!("{p}.ingress[{j}]"),
                        "must be api, proxy or connect",
                    ));
                }
            }
            if let Some(b) = &w.bind_address {
                b.parse::<IpAddr>().map_err(|_| {
                    err(
                        format!("{p}.bind_address"),
                        "must be an IP address (no port)",
                    )
                })?;
            }
            ids.push(&w.id);
        }
        Ok(())
    }
}

/// Most controls one worker dials.
pub const MAX_WORKER_CONTROLS: usize = 16;

/// The file of `sortie worker` (decision 060): `[worker]` and the shared `[egress]` limits.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerFile {
    /// `[worker]`.
    pub worker: WorkerProcessConfig,
    /// `[egress]`.
    #[serde(default)]
    pub egress: EgressConfig,
    /// `[log]`.
    #[serde(default)]
    pub log: LogConfig,
}

/// `[worker]`: a remote worker's identity, its controls and what it advertises.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerProcessConfig {
    /// The worker id.
    pub id: String,
    /// Bus addresses (`host:port`) of every control this worker serves.
    pub controls: Vec<String>,
    /// The worker token the controls expect (or `token_env`).
    #[serde(default)]
    pub token: Option<String>,
    /// The environment variable holding the worker token.
    #[serde(default)]
    pub token_env: Option<String>,
    /// Plain TCP to the controls instead of TLS; must be said explicitly.
    #[serde(default)]
    pub plaintext: bool,
    /// PEM file of the CA that signed the controls' certificates (TLS).
    #[serde(default)]
    pub ca_file: Option<String>,
    /// The name the controls' certificates carry; default: the host of each address.
    #[serde(default)]
    pub server_name: Option<String>,
    /// PEM certificate chain this worker presents to controls that require client
    /// certificates (`control.bus.tls_client_ca_file`); it must name the worker id as a DNS
    /// name. With `tls_key_file`.
    #[serde(default)]
    pub tls_cert_file: Option<String>,
    /// PEM private key of `tls_cert_file`.
    #[serde(default)]
    pub tls_key_file: Option<String>,
    /// The worker's own threads; 0 means all available.
    #[serde(default)]
    pub cores: u32,
    /// Concurrent requests it runs.
    #[serde(default = "default_capacity")]
    pub capacity: u32,
    /// Advertised tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Advertised country.
    #[serde(default)]
    pub country: Option<String>,
    /// Advertised region.
    #[serde(default)]
    pub region: Option<String>,
    /// Advertised IP type.
    #[serde(default)]
    pub ip_type: Option<String>,
    /// Pools it serves; none means `direct`.
    #[serde(default)]
    pub pools: Vec<String>,
    /// Ingress modes it serves; none means all three.
    #[serde(default)]
    pub ingress: Vec<String>,
    /// Egress source address.
    #[serde(default)]
    pub bind_address: Option<String>,
}

impl WorkerFile {
    /// Parses and validates the file of `sortie worker`.
    pub fn from_toml(text: &str) -> Result<WorkerFile, ConfigError> {
        let f: WorkerFile = toml::from_str(text).map_err(|e| {
            let span = e.span().map(|s| line_of(text, s.start));
            let msg = e.message().trim().to_string();
            match span {
                Some(line) => err(format!("line {line}"), msg),
                None => err("config", msg),
            }
        })?;
        f.log.validate()?;
        let w = &f.worker;
        check_id("worker.id", &w.id)?;
        if w.controls.is_empty() || w.controls.len() > MAX_WORKER_CONTROLS {
            return Err(err(
                "worker.controls",
                format!("must name 1 to {MAX_WORKER_CONTROLS} control bus addresses"),
            ));
        }
        for (i, c) in w.controls.iter().enumerate() {
            let ok = c
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !ok {
                return Err(err(
                    format!("worker.controls[{i}]"),
                    format!("{c:?} is not host:port"),
                ));
            }
        }
        check_secret(
            "worker",
            &SecretRef {
                token: w.token.clone(),
                token_env: w.token_env.clone(),
            },
            true,
        )?;
        check_transport("worker", w.plaintext, &[("ca_file", &w.ca_file)], true)?;
        check_transport(
            "worker",
            w.plaintext,
            &[
                ("tls_cert_file", &w.tls_cert_file),
                ("tls_key_file", &w.tls_key_file),
            ],
            false,
        )?;
        if w.tls_cert_file.is_some() != w.tls_key_file.is_some() {
            return Err(err(
                "worker.tls_key_file",
                "tls_cert_file and tls_key_file are given together",
            ));
        }
        if w.cores > 1024 {
            return Err(err("worker.cores", "must be 0 (all) to 1024"));
        }
        // The advertised fields follow the rules of a local worker's.
        let mut local = Config {
            workers: vec![WorkerConfig {
                id: w.id.clone(),
                capacity: w.capacity,
                tags: w.tags.clone(),
                country: w.country.clone(),
                region: w.region.clone(),
                ip_type: w.ip_type.clone(),
                pools: w.pools.clone(),
                ingress: w.ingress.clone(),
                bind_address: w.bind_address.clone(),
            }],
            egress: f.egress.clone(),
            ..Config::default()
        };
        local.validate().map_err(|e| ConfigError {
            path: e.path.replacen("workers[0]", "worker", 1),
            message: e.message,
        })?;
        let mut f = f;
        if let Some(v) = local.workers.pop() {
            f.worker.country = v.country;
            f.worker.pools = v.pools;
        }
        Ok(f)
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()
        .iter()
        .take(offset)
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// Parses a listen address `ip:port`.
pub fn parse_listen(path: &str, v: &str) -> Result<SocketAddr, ConfigError> {
    v.parse::<SocketAddr>().map_err(|_| {
        err(
            path,
            format!("{v:?} is not an address like 127.0.0.1:8080 or [::1]:8080"),
        )
    })
}

/// Identifiers: 1 to 64 bytes of ASCII letters, digits, `-`, `_`, `.`.
pub fn is_valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn check_id(path: &str, id: &str) -> Result<(), ConfigError> {
    if is_valid_id(id) {
        Ok(())
    } else {
        Err(err(
            path,
            format!("must be 1 to {MAX_ID_BYTES} of A-Z a-z 0-9 - _ ."),
        ))
    }
}

fn check_secret(path: &str, s: &SecretRef, required: bool) -> Result<(), ConfigError> {
    match (&s.token, &s.token_env) {
        (Some(_), Some(_)) => Err(err(path, "set token or token_env, not both")),
        (Some(t), None) if t.len() < 16 => {
            Err(err(format!("{path}.token"), "must be at least 16 bytes"))
        }
        (None, Some(e)) if e.is_empty() => {
            Err(err(format!("{path}.token_env"), "must not be empty"))
        }
        (None, None) if required => Err(err(path, "needs token or token_env")),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[[control.bus.workers]]` (decision 105): each entry needs its own token, ids and tokens
    /// are unique, and the shared token is not set beside them.
    #[test]
    fn per_worker_bus_credentials_are_checked() {
        let base = "[control]\nbus_listen = \"127.0.0.1:7070\"\n[control.bus]\nplaintext = true\n";
        let entry = |id: &str, t: &str| {
            format!("[[control.bus.workers]]\nid = \"{id}\"\ntoken = \"{t}\"\n")
        };
        let ok = format!(
            "{base}{}{}",
            entry("wa", "aaaaaaaaaaaaaaaa"),
            entry("wb", "bbbbbbbbbbbbbbbb")
        );
        let c = Config::from_toml_control(&ok).unwrap();
        assert_eq!(c.control.bus.workers.len(), 2);
        for (text, path) in [
            (
                format!(
                    "{base}token = \"cccccccccccccccc\"\n{}",
                    entry("wa", "aaaaaaaaaaaaaaaa")
                ),
                "control.bus.token",
            ),
            (
                format!(
                    "{base}{}{}",
                    entry("wa", "aaaaaaaaaaaaaaaa"),
                    entry("wa", "bbbbbbbbbbbbbbbb")
                ),
                "control.bus.workers[1].id",
            ),
            (
                format!(
                    "{base}{}{}",
                    entry("wa", "aaaaaaaaaaaaaaaa"),
                    entry("wb", "aaaaaaaaaaaaaaaa")
                ),
                "control.bus.workers[1].token",
            ),
            (
                format!("{base}{}", entry("wa", "short")),
                "control.bus.workers[0].token",
            ),
            (
                format!(
                    "{base}{}max_capacity = 0\n",
                    entry("wa", "aaaaaaaaaaaaaaaa")
                ),
                "control.bus.workers[0].max_capacity",
            ),
        ] {
            let e = Config::from_toml_control(&text).unwrap_err();
            assert_eq!(e.path, path, "{e}");
        }
    }

    /// Tokens written in the file are compared at load (decision 102): a deployment's token
    /// may be neither another deployment's nor the admin token.
    #[test]
    fn a_token_given_twice_is_refused() {
        let dep = |id: &str, t: &str| format!("[[deployments]]\nid = \"{id}\"\ntoken = \"{t}\"\n");
        let e = Config::from_toml(&(dep("a", "0123456789abcdef") + &dep("b", "0123456789abcdef")))
            .unwrap_err();
        assert_eq!(e.path, "deployments[1].token", "{e}");
        assert!(e.to_string().contains("deployments[0].token"), "{e}");
        assert!(!e.to_string().contains("0123456789abcdef"), "{e}");
        let e = Config::from_toml(
            &(dep("a", "0123456789abcdef") + "[admin]\ntoken = \"0123456789abcdef\"\n"),
        )
        .unwrap_err();
        assert_eq!(e.path, "admin.token", "{e}");
        assert!(
            Config::from_toml(&(dep("a", "0123456789abcdef") + &dep("b", "fedcba9876543210")))
                .is_ok()
        );
    }

    #[test]
    fn empty_file_gives_embedded_defaults_but_the_proxy() {
        let c = Config::from_toml("").unwrap();
        // Only the embedded defaults (no file at all) add the loopback forward proxy.
        let mut embedded = Config::embedded_default();
        assert_eq!(
            embedded.control.proxy_listen.as_deref(),
            Some("127.0.0.1:3128")
        );
        assert_eq!(c.control.proxy_listen, None);
        embedded.control.proxy_listen = None;
        assert_eq!(c, embedded);
        assert_eq!(c.control.api_listen, "127.0.0.1:8080");
        assert_eq!(c.control.admin_listen.as_deref(), Some("127.0.0.1:8081"));
        assert_eq!(c.control.request.max_timeout_ms, 120_000);
        assert_eq!(c.control.request.max_inline_request_body_bytes, 1 << 20);
        assert_eq!(c.object_storage.max_object_bytes, DEFAULT_MAX_OBJECT_BYTES);
        assert_eq!(c.workers.len(), 1);
        assert_eq!(c.workers[0].id, "local");
        assert_eq!(c.workers[0].pools, vec!["direct"]);
    }

    #[test]
    fn a_section_with_one_key_keeps_the_defaults_of_the_others() {
        let c = Config::from_toml(
            "[control]\ncores = 1\n[control.request]\nmax_timeout_ms = 5000\n\
             [control.server]\nheader_timeout_ms = 2000\n[control.proxy]\n\
             tunnel_idle_timeout_ms = 9000\n[control.bus]\nheartbeat_ms = 500\n\
             [object_storage]\nreceipt_ttl_seconds = 60\n[egress]\nconnect_timeout_ms = 700\n",
        )
        .unwrap();
        let d = Config::embedded_default();
        assert_eq!(c.control.api_listen, d.control.api_listen);
        assert_eq!(c.control.data_dir, d.control.data_dir);
        let r = c.control.request;
        assert_eq!(r.max_timeout_ms, 5000);
        assert_eq!(
            RequestLimitsConfig {
                max_timeout_ms: d.control.request.max_timeout_ms,
                ..r
            },
            d.control.request
        );
        let s = c.control.server;
        assert_eq!(s.header_timeout_ms, 2000);
        assert_eq!(
            ServerLimitsConfig {
                header_timeout_ms: d.control.server.header_timeout_ms,
                ..s
            },
            d.control.server
        );
        let p = c.control.proxy;
        assert_eq!(p.tunnel_idle_timeout_ms, 9000);
        assert_eq!(p.idle_timeout_ms, DEFAULT_PROXY_IDLE_TIMEOUT_MS);
        assert_eq!(
            p.max_tunnels_per_deployment,
            DEFAULT_MAX_TUNNELS_PER_DEPLOYMENT
        );
        assert_eq!(c.control.bus.heartbeat_ms, 500);
        assert_eq!(
            c.control.bus.assignment_timeout_ms,
            DEFAULT_BUS_ASSIGNMENT_TIMEOUT_MS
        );
        assert_eq!(c.object_storage.receipt_ttl_seconds, 60);
        assert_eq!(c.object_storage.max_object_bytes, DEFAULT_MAX_OBJECT_BYTES);
        assert_eq!(c.egress.connect_timeout_ms, 700);
        assert_eq!(c.egress.idle_timeout_ms, DEFAULT_EGRESS_IDLE_TIMEOUT_MS);
        assert_eq!(c.egress.pool_idle_timeout_ms, DEFAULT_POOL_IDLE_TIMEOUT_MS);
    }

    #[test]
    fn store_timing_keys_have_defaults_and_bounds() {
        let d = Config::from_toml("").unwrap().store;
        assert_eq!(
            (d.heartbeat_ms, d.control_expiry_ms, d.cancel_poll_ms),
            (1000, 10_000, 200)
        );
        let c = Config::from_toml(
            "[store]\nbackend = \"postgres\"\nurl_env = \"U\"\nheartbeat_ms = 250\n\
             control_expiry_ms = 1000\ncancel_poll_ms = 1000\n",
        )
        .unwrap()
        .store;
        assert_eq!(
            (c.heartbeat_ms, c.control_expiry_ms, c.cancel_poll_ms),
            (250, 1000, 1000)
        );
        // Exactly three heartbeats is enough; the bounds themselves are accepted.
        for ok in [
            "[store]\nheartbeat_ms = 100\ncontrol_expiry_ms = 1000\ncancel_poll_ms = 50",
            "[store]\nheartbeat_ms = 60000\ncontrol_expiry_ms = 3600000",
            "[store]\nheartbeat_ms = 1000\ncontrol_expiry_ms = 3000",
        ] {
            assert!(Config::from_toml(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn bus_listener_needs_a_token_and_tls_or_explicit_plaintext() {
        let base = "[control]\nbus_listen = \"127.0.0.1:7070\"\n";
        let cases = [
            ("", "control.bus"),
            (
                "[control.bus]\ntoken = \"0123456789abcdef\"\n",
                "control.bus.tls_cert_file",
            ),
            (
                "[control.bus]\ntoken = \"0123456789abcdef\"\nplaintext = true\ntls_key_file = \"k\"\n",
                "control.bus.tls_key_file",
            ),
            (
                "[control.bus]\ntoken = \"0123456789abcdef\"\nplaintext = true\nheartbeat_ms = 5\n",
                "control.bus.heartbeat_ms",
            ),
            (
                "[control.bus]\ntoken = \"0123456789abcdef\"\nplaintext = true\napi_base_url = \"http://a:99999\"\n",
                "control.bus.api_base_url",
            ),
            (
                "[control.bus]\ntoken = \"0123456789abcdef\"\nplaintext = true\ntls_client_ca_file = \"ca.pem\"\n",
                "control.bus.tls_client_ca_file",
            ),
            (
                "[control.bus]\ntoken = \"0123456789abcdef\"\nplaintext = true\nforget_disconnected_ms = 999\n",
                "control.bus.forget_disconnected_ms",
            ),
        ];
        for (extra, path) in cases {
            let e = Config::from_toml(&format!("{base}{extra}")).unwrap_err();
            assert_eq!(e.path, path, "{extra}");
        }
        let with_base = format!(
            "{base}[control.bus]\ntoken = \"0123456789abcdef\"\nplaintext = true\n\
             api_base_url = \"https://control.example/sortie\"\n"
        );
        assert!(Config::from_toml(&with_base).is_ok());
        let ok = format!("{base}[control.bus]\ntoken = \"0123456789abcdef\"\nplaintext = true\n");
        let c = Config::from_toml_control(&ok).unwrap();
        assert!(c.workers.is_empty(), "control mode implies no local worker");
        assert_eq!(Config::from_toml(&ok).unwrap().workers.len(), 1);
        let e = Config::from_toml_control("").unwrap_err();
        assert_eq!(e.path, "control.bus_listen");
    }

    #[test]
    fn worker_file() {
        let ok = "[worker]\nid = \"w1\"\ncontrols = [\"127.0.0.1:7070\"]\ntoken = \"0123456789abcdef\"\nca_file = \"ca.pem\"\ncountry = \"de\"\n";
        let f = WorkerFile::from_toml(ok).unwrap();
        assert_eq!(f.worker.country.as_deref(), Some("DE"));
        assert_eq!(f.worker.pools, vec!["direct"]);
        let cases = [
            ("[worker]\nid = \"w 1\"\ncontrols = [\"a:1\"]\ntoken = \"0123456789abcdef\"\nplaintext = true", "worker.id"),
            ("[worker]\nid = \"w\"\ncontrols = []\ntoken = \"0123456789abcdef\"\nplaintext = true", "worker.controls"),
            ("[worker]\nid = \"w\"\ncontrols = [\"nohost\"]\ntoken = \"0123456789abcdef\"\nplaintext = true", "worker.controls[0]"),
            ("[worker]\nid = \"w\"\ncontrols = [\"a:1\"]\nplaintext = true", "worker"),
            ("[worker]\nid = \"w\"\ncontrols = [\"a:1\"]\ntoken = \"0123456789abcdef\"", "worker.ca_file"),
            ("[worker]\nid = \"w\"\ncontrols = [\"a:1\"]\ntoken = \"0123456789abcdef\"\nplaintext = true\ntls_cert_file = \"c.pem\"\ntls_key_file = \"k.pem\"", "worker.tls_cert_file"),
            ("[worker]\nid = \"w\"\ncontrols = [\"a:1\"]\ntoken = \"0123456789abcdef\"\nca_file = \"ca.pem\"\ntls_cert_file = \"c.pem\"", "worker.tls_key_file"),
            ("[worker]\nid = \"w\"\ncontrols = [\"a:1\"]\ntoken = \"0123456789abcdef\"\nplaintext = true\ncapacity = 0", "worker.capacity"),
        ];
        for (text, path) in cases {
            assert_eq!(
                WorkerFile::from_toml(text).unwrap_err().path,
                path,
                "{text}"
            );
        }
    }

    #[test]
    fn design_example_parses() {
        let c = Config::from_toml(
            r#"
[control]
api_listen = "127.0.0.1:8080"
admin_listen = "127.0.0.1:8081"
proxy_listen = "127.0.0.1:3128"
bus_listen = "127.0.0.1:7070"
cores = 0
data_dir = "./sortie-data"

[control.request]
max_timeout_ms = 30000

[[deployments]]
id = "dep_default"
token_env = "SORTIE_DEPLOYMENT_TOKEN"

[admin]
token_env = "SORTIE_ADMIN_TOKEN"

[object_storage]
enabled = true
backend = "fs"
max_object_bytes = 5368709120

[store]
backend = "sqlite"

[control.bus]
token_env = "SORTIE_WORKER_TOKEN"
tls_cert_file = "/path/bus-cert.pem"
tls_key_file = "/path/bus-key.pem"

[egress]
ca_file = "/path/extra-roots.pem"

[[workers]]
id = "local-a"
capacity = 256
tags = ["residential"]
country = "us"
region = "us-east"
ip_type = "residential"
pools = ["direct"]
bind_address = "127.0.0.2"
"#,
        )
        .unwrap();
        assert_eq!(c.control.request.max_timeout_ms, 30000);
        assert_eq!(c.workers[0].country.as_deref(), Some("US"));
        assert!(c.object_storage.enabled);
    }

    #[test]
    fn errors_name_the_key() {
        let cases: &[(&str, &str)] = &[
            ("[control]\napi_listen = \"nope\"", "control.api_listen"),
            ("[control]\nbogus = 1", "line 2"),
            ("[control.request]\nmax_timeout_ms = 10", "control.request.max_timeout_ms"),
            ("[control.request]\nmax_inline_request_body_bytes = 99999999", "control.request.max_inline_request_body_bytes"),
            ("[[deployments]]\nid = \"d\"", "deployments[0]"),
            ("[[deployments]]\nid = \"d\"\ntoken = \"short\"", "deployments[0].token"),
            ("[[deployments]]\nid = \"d\"\ntoken_env = \"A\"\n[[deployments]]\nid = \"d\"\ntoken_env = \"B\"", "deployments[1].id"),
            ("[[workers]]\nid = \"w\"\ncountry = \"USA\"", "workers[0].country"),
            ("[[workers]]\nid = \"w\"\ncapacity = 0", "workers[0].capacity"),
            ("[[workers]]\nid = \"w\"\nbind_address = \"1.2.3.4:5\"", "workers[0].bind_address"),
            ("[[workers]]\nid = \"w\"\ningress = [\"udp\"]", "workers[0].ingress[0]"),
            ("[[workers]]\nid = \"w w\"", "workers[0].id"),
            ("[object_storage]\nenabled = true\nbackend = \"s3\"", "object_storage.bucket"),
            ("[store]\nbackend = \"postgres\"", "store.url_env"),
            ("[store]\nbackend = \"mysql\"", "line 2"),
            ("[store]\nca_file = \"\"", "store.ca_file"),
            ("[store]\nheartbeat_ms = 50", "store.heartbeat_ms"),
            ("[store]\ncontrol_expiry_ms = 999", "store.control_expiry_ms"),
            ("[store]\ncontrol_expiry_ms = 3600001", "store.control_expiry_ms"),
            ("[store]\nheartbeat_ms = 4000", "store.control_expiry_ms"),
            ("[store]\ncancel_poll_ms = 1001", "store.cancel_poll_ms"),
            ("[store]\ncancel_poll_ms = 10", "store.cancel_poll_ms"),
            ("[object_storage]\nsigning_key_env = \"\"", "object_storage.signing_key_env"),
            ("[control.server]\nheader_timeout_ms = 5", "control.server.header_timeout_ms"),
            ("[control.request]\nmax_in_flight_body_bytes = 1000", "control.request.max_in_flight_body_bytes"),
            ("[control.request]\nmax_concurrent_per_deployment = 0", "control.request.max_concurrent_per_deployment"),
            ("[control.server]\nmax_connections_per_core = 0", "control.server.max_connections_per_core"),
            ("[control.server]\ndrain_timeout_ms = 3600001", "control.server.drain_timeout_ms"),
            ("[log]\nlevel = \"\"", "log.level"),
            ("[log]\nlevel = \"info, debug\"", "log.level"),
            ("[egress]\nidle_timeout_ms = 99999999999", "egress.idle_timeout_ms"),
            ("[control.proxy]\nidle_timeout_ms = 5", "control.proxy.idle_timeout_ms"),
            ("[control.proxy]\ntunnel_idle_timeout_ms = 86400001", "control.proxy.tunnel_idle_timeout_ms"),
            ("[control.proxy]\nmax_tunnels_per_deployment = 0", "control.proxy.max_tunnels_per_deployment"),
            ("[control.proxy]\nmax_tunnels = 5", "line 2"),
        ];
        for (text, path) in cases {
            let e = Config::from_toml(text).unwrap_err();
            assert!(e.to_string().starts_with(path), "{text:?}: {e}");
        }
    }

    #[test]
    fn server_and_egress_limits_are_keys_with_defaults() {
        let c = Config::from_toml("").unwrap();
        assert_eq!(c.control.server, ServerLimitsConfig::default());
        assert_eq!(c.control.server.header_timeout_ms, 10_000);
        assert_eq!(c.control.server.idle_timeout_ms, 60_000);
        assert_eq!(c.egress.connect_timeout_ms, 10_000);
        assert_eq!(c.egress.idle_timeout_ms, 30_000);
        let c = Config::from_toml(
            "[control.server]\nheader_timeout_ms = 500\nidle_timeout_ms = 700\n\
             body_timeout_ms = 900\nwrite_timeout_ms = 1100\nmax_connections_per_core = 3\n\
             drain_timeout_ms = 0\n\
             [egress]\nconnect_timeout_ms = 200\nidle_timeout_ms = 300\npool_idle_timeout_ms = 400\n",
        )
        .unwrap();
        let s = c.control.server;
        assert_eq!(
            (
                s.header_timeout_ms,
                s.idle_timeout_ms,
                s.body_timeout_ms,
                s.write_timeout_ms
            ),
            (500, 700, 900, 1100)
        );
        assert_eq!(s.max_connections_per_core, 3);
        assert_eq!(s.drain_timeout_ms, 0);
        assert_eq!(ServerLimitsConfig::default().drain_timeout_ms, 10_000);
        let e = &c.egress;
        assert_eq!(
            (
                e.connect_timeout_ms,
                e.idle_timeout_ms,
                e.pool_idle_timeout_ms
            ),
            (200, 300, 400)
        );
    }

    #[test]
    fn proxy_limits_are_keys_with_defaults() {
        let c = Config::from_toml("").unwrap();
        assert_eq!(c.control.proxy, ProxyLimitsConfig::default());
        let p = c.control.proxy;
        assert_eq!(
            (
                p.idle_timeout_ms,
                p.tunnel_idle_timeout_ms,
                p.max_tunnels_per_deployment
            ),
            (60_000, 300_000, 1024)
        );
        let c = Config::from_toml(
            "[control.proxy]\nidle_timeout_ms = 1500\ntunnel_idle_timeout_ms = 2500\n\
             max_tunnels_per_deployment = 7\n",
        )
        .unwrap();
        let p = c.control.proxy;
        assert_eq!(
            (
                p.idle_timeout_ms,
                p.tunnel_idle_timeout_ms,
                p.max_tunnels_per_deployment
            ),
            (1500, 2500, 7)
        );
    }
}
