//! `sortie serve`: one process with the control plane and its local workers. Startup order:
//! data directory, store (bootstrap, latest snapshot, worker settings), listeners (bound before
//! the cores start, so errors surface here), TLS roots, resolver, tokens, control state, cores,
//! signals.

use std::fs;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR2};
use sortie_core::config::{parse_listen, Config, StoreBackend};
use sortie_core::snapshot::{decode_snapshot, ValidatedSnapshot, DEFAULT_SNAPSHOT_JSON};
use sortie_core::worker::{AdvertisedCapabilities, Executor, WorkerRegistry, WorkerSettings};

use crate::control::admission::TunnelCounts;
use crate::control::core::{mailbox, ActiveRequests, CoreCommand, MailboxReceiver};
use crate::control::receipts::Receipts;
use crate::control::state::ControlState;
use crate::dispatch::Dispatcher;
use crate::dns::{Resolver, ResolverPool};
use crate::egress::{client_config, Egress, PoolLimits};
use crate::http::{self, CoreServerConfig, LiveServerConfig, ServerConfig, ShutdownTrigger};
use crate::ingress::admin::AdminContext;
use crate::ingress::proxy::ProxyHandler;
use crate::ingress::web::{AdminHandler, ApiHandler};
use crate::metrics::Metrics;
use crate::runtime::{bind_reuseport, core_count, spawn_cores, Driver};
use crate::store::objects::Objects;
use crate::store::{
    ColdThread, PostgresConfig, PostgresStore, RecordStore, SqliteStore, COMMAND_QUEUE_CAPACITY,
};
use crate::tokens;

/// On a store shared by several controls, startup recovery moves only receipts untouched for
/// this long: longer than any request may hold a receipt (the largest `max_timeout_ms`, one
/// hour) or a verification may take, so a receipt another live control is working on is never
/// taken from it (decision 093).
const SHARED_RECOVERY_AGE_MS: u64 = 2 * 3_600_000;

/// Opens the configured record store. PostgreSQL (`store.backend = "postgres"`) also returns
/// its settings, for the follower's listening connection; the URL is never printed.
fn open_store(
    config: &Config,
    data_dir: &Path,
) -> Result<(Box<dyn RecordStore + Send>, Option<PostgresConfig>), ServeError> {
    match config.store.backend {
        StoreBackend::Sqlite => {
            let store = SqliteStore::open(data_dir).map_err(|e| ioe(format!("store: {e}")))?;
            Ok((Box::new(store), None))
        }
        StoreBackend::Postgres => {
            let name = config.store.url_env.as_deref().unwrap_or_default();
            let ca_file = config.store.ca_file.as_deref().map(Path::new);
            let pg =
                PostgresConfig::from_env(name, ca_file).map_err(|e| ioe(format!("store: {e}")))?;
            let store = PostgresStore::open(&pg).map_err(|e| ioe(format!("store: {e}")))?;
            let o = &config.object_storage;
            if o.enabled && o.backend == sortie_core::config::ObjectBackend::Fs {
                tracing::warn!("store.backend is postgres but object_storage.backend is fs: receipt payloads stay on this host, so other controls cannot serve them; use s3 for several controls");
            }
            if o.enabled && o.signing_key_env.is_none() {
                tracing::warn!("store.backend is postgres without object_storage.signing_key_env: worker URLs signed here will not verify on other controls");
            }
            Ok((Box::new(store), Some(pg)))
        }
    }
}

/// How long, on a hand-over to a successor, a connection idle between requests stays open
/// (answering its next request with `Connection: close`) before it is closed: a client sending
/// at least once a second moves over without ever meeting a close (decision 115).
pub const UPGRADE_IDLE_LINGER: Duration = Duration::from_secs(2);
/// How long past the drain timeout (`control.server.drain_timeout_ms`) the process waits for its cores: at the grace each core
/// closes its remaining connections (cancelling their requests, whose guards release what they
/// hold) and stops, within moments. A core not stopped by then is stuck, and the control does
/// not leave the shared store (decision 098). Without the margin the process's deadline and the
/// cores' own grace timers ran out together, and whether a control left was a race.
pub const CORE_STOP_MARGIN: Duration = Duration::from_secs(5);

/// A startup failure, with what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The configuration is unusable.
    #[error("{0}")]
    Config(String),
    /// The data directory, store or a listener failed.
    #[error("{0}")]
    Io(String),
}

fn ioe(what: impl std::fmt::Display) -> ServeError {
    ServeError::Io(what.to_string())
}

fn ensure_data_dir(dir: &Path) -> Result<(), ServeError> {
    fs::create_dir_all(dir).map_err(|e| ioe(format!("control.data_dir {}: {e}", dir.display())))?;
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
    Ok(())
}

fn local_registry(
    config: &Config,
    store: &mut dyn RecordStore,
) -> Result<WorkerRegistry, ServeError> {
    let mut registry = WorkerRegistry::new();
    let now = crate::clock::unix_ms();
    // Local workers advertise the profiles whose loopback self-test passed in this process
    // (decision 082); a build without the connector advertises none.
    let profiles = if config.workers.is_empty() {
        Vec::new()
    } else {
        crate::egress::fingerprint::verify_and_log(config.egress.ca_file.as_deref().map(Path::new))
    };
    for (i, w) in config.workers.iter().enumerate() {
        let caps = AdvertisedCapabilities {
            tags: w.tags.clone(),
            country: w.country.clone(),
            region: w.region.clone(),
            ip_type: w.ip_type.clone(),
            ingress: w.ingress.clone(),
            pools: w.pools.clone(),
            fingerprint_profiles: profiles.clone(),
            capacity: w.capacity,
        }
        .validate()
        .map_err(|e| ServeError::Config(format!("workers[{i}].{e}")))?;
        registry
            .register(&w.id, "local", Executor::Local, caps, now)
            .map_err(|e| ServeError::Config(format!("workers[{i}]: {e}")))?;
    }
    for s in store
        .all_worker_settings()
        .map_err(|e| ioe(format!("store: {e}")))?
    {
        if let Ok(id) = sortie_core::snapshot::ConfigId::parse(&s.worker_id) {
            registry.restore_settings(
                id,
                WorkerSettings {
                    is_enabled: s.is_enabled,
                    is_draining: s.is_draining,
                    revision: s.revision,
                },
            );
        }
    }
    Ok(registry)
}

fn bootstrap_json(config: &Config) -> Result<String, ServeError> {
    let Some(path) = &config.control.bootstrap_snapshot else {
        return Ok(DEFAULT_SNAPSHOT_JSON.to_string());
    };
    let mut bytes = fs::read(path)
        .map_err(|e| ServeError::Config(format!("control.bootstrap_snapshot {path}: {e}")))?;
    let s = decode_snapshot(&mut bytes)
        .map_err(|e| ServeError::Config(format!("control.bootstrap_snapshot {path}: {e}")))?;
    Ok(String::from_utf8_lossy(&s.to_json()).into_owned())
}

/// One listener's sockets, a list per core (usually one socket each), and its address.
type Bound = (Vec<Vec<std::net::TcpListener>>, SocketAddr);

struct Listeners {
    bus: Option<Bound>,
    api: Bound,
    admin: Option<Bound>,
    proxy: Option<Bound>,
}

/// Listening sockets this process did not bind: a binary upgrade's predecessor's (decision
/// 115), else the service manager's (socket activation, decision 112).
struct Inherited {
    successor: Option<crate::upgrade::Successor>,
    activated: crate::systemd::Activated,
}

impl Listeners {
    /// Every configured listener, a socket per core at least: the running process's on an
    /// upgrade, the ones the service manager passed, or bound here.
    fn bind(
        c: &sortie_core::config::ControlConfig,
        n: usize,
        successor: Option<crate::upgrade::Successor>,
    ) -> Result<(Listeners, Option<crate::upgrade::Successor>), ServeError> {
        let mut inherited = Inherited {
            successor,
            activated: crate::systemd::Activated::from_env(),
        };
        let act = &mut inherited;
        let listeners = Listeners {
            bus: match &c.bus_listen {
                Some(a) => Some(bind("control.bus_listen", a, n, "bus", act)?),
                None => None,
            },
            api: bind("control.api_listen", &c.api_listen, n, "api", act)?,
            admin: match &c.admin_listen {
                Some(a) => Some(bind("control.admin_listen", a, n, "admin", act)?),
                None => None,
            },
            proxy: match &c.proxy_listen {
                Some(a) => Some(bind("control.proxy_listen", a, n, "proxy", act)?),
                None => None,
            },
        };
        inherited.activated.finish();
        Ok((listeners, inherited.successor))
    }

    /// Duplicates of every socket, offered to a successor (decision 115).
    fn offer(&self) -> Result<Vec<crate::upgrade::Offered>, ServeError> {
        let mut out = Vec::new();
        let all = [
            ("api", Some(&self.api)),
            ("admin", self.admin.as_ref()),
            ("proxy", self.proxy.as_ref()),
            ("bus", self.bus.as_ref()),
        ];
        for (name, l) in all {
            let Some((per_core, addr)) = l else { continue };
            let mut fds = Vec::new();
            for s in per_core.iter().flatten() {
                let dup = s
                    .try_clone()
                    .map_err(|e| ioe(format!("{name} listener: {e}")))?;
                fds.push(std::os::fd::OwnedFd::from(dup));
            }
            out.push(crate::upgrade::Offered {
                name,
                addr: *addr,
                fds,
            });
        }
        Ok(out)
    }
}

/// The `n` per-core listeners of `key` (`control.api_listen`, ...): the socket the service
/// manager passed for `name` when there is one (socket activation, decision 112), else `n`
/// sockets bound to `addr` with `SO_REUSEPORT`.
fn bind(
    key: &str,
    addr: &str,
    n: usize,
    name: &str,
    inherited: &mut Inherited,
) -> Result<Bound, ServeError> {
    let a = parse_listen(key, addr).map_err(|e| ServeError::Config(e.to_string()))?;
    if let Some((socks, bound)) = inherited.successor.as_mut().and_then(|s| s.take(name)) {
        if bound != a && a.port() != 0 {
            tracing::warn!(
                listener = name,
                %bound,
                configured = %a,
                "{key}: serving on the running process's socket; a new address needs a restart"
            );
        }
        let per_core = crate::upgrade::spread(socks, n)
            .map_err(|e| ioe(format!("{key}: the running process's sockets: {e}")))?;
        return Ok((per_core, bound));
    }
    if let Some((listener, bound)) = inherited.activated.take(name, a) {
        if bound != a {
            tracing::info!(
                listener = name,
                %bound,
                configured = %a,
                "{key}: serving on the socket the service manager passed, not the configured address"
            );
        }
        let socks = crate::systemd::per_core(listener, n)
            .map_err(|e| ioe(format!("{key}: the passed socket: {e}")))?;
        return Ok((socks.into_iter().map(|s| vec![s]).collect(), bound));
    }
    let (socks, bound) = bind_reuseport(a, n).map_err(|e| ioe(format!("{key} {addr}: {e}")))?;
    Ok((socks.into_iter().map(|s| vec![s]).collect(), bound))
}

/// Raises the soft open-file limit as far as allowed; the limit in force, if it can be read.
fn open_file_limit() -> Option<u64> {
    match crate::fd::raise_open_file_limit() {
        Ok(l) => Some(l.soft),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read or raise the open-file limit");
            None
        }
    }
}

/// Waits for SIGTERM or SIGINT, or for a successor to take over (which closes `signals`);
/// every SIGHUP on the way runs `reload` (decision 114), every SIGUSR2 starts a successor
/// (decision 115).
fn until_stopped(signals: &mut signal_hook::iterator::Signals, mut reload: impl FnMut()) {
    for signal in signals.forever() {
        match signal {
            SIGHUP => reload(),
            SIGUSR2 => {
                if let Err(e) = crate::upgrade::spawn_successor() {
                    tracing::error!(error = %e, "binary upgrade: cannot start the successor");
                }
            }
            _ => break,
        }
    }
}

/// SIGHUP: reads the configuration file again and applies what can change live (deployment
/// and admin tokens, `log.access`); keys that need a restart are logged and keep their running
/// values; a file that does not read, parse or validate changes nothing (decision 114).
fn reload(r: &Reloadable<'_>) {
    let Some(path) = r.path else {
        tracing::warn!("SIGHUP: there is no configuration file to read again (embedded defaults)");
        return;
    };
    // The service manager hears of the reload and of its end, whatever its outcome.
    crate::systemd::reloading();
    reload_from(r, path);
    crate::systemd::ready("serving");
}

/// What a reload reads and what it may change.
struct Reloadable<'a> {
    state: &'a ControlState,
    bus: Option<&'a crate::remote::BusShared>,
    /// The configuration as started: keys that need a restart are compared with it.
    running: &'a Config,
    path: Option<&'a Path>,
    parse: ParseConfig,
    data_dir: &'a Path,
    server_limits: &'a LiveServerConfig,
    log: Option<&'a LogReload>,
}

fn reload_from(r: &Reloadable<'_>, path: &Path) {
    let Reloadable {
        state,
        bus,
        running,
        parse,
        data_dir,
        ..
    } = *r;
    let refused = |why: String| {
        tracing::error!(
            file = %path.display(),
            "configuration not reloaded, the running one stays: {why}"
        );
    };
    let new = match std::fs::read_to_string(path) {
        Ok(text) => match parse(&text) {
            Ok(c) => c,
            Err(e) => return refused(e.to_string()),
        },
        Err(e) => return refused(e.to_string()),
    };
    let resolved = match tokens::resolve(&new, data_dir) {
        Ok(r) => r,
        Err(e) => return refused(e.to_string()),
    };
    let ids_differ = running.deployments.len() != new.deployments.len()
        || running
            .deployments
            .iter()
            .zip(&new.deployments)
            .any(|(a, b)| a.id != b.id);
    if ids_differ {
        return refused(
            "the deployments differ (ids or order): adding or removing one needs a restart".into(),
        );
    }
    // The bus's credentials and TLS files reload (the lanes admitted go on); its other keys
    // need a restart.
    // Whether lanes need a client certificate is fixed at start: the running CA file's path is
    // kept (its contents are read again).
    let mut new_bus = new.control.bus.clone();
    new_bus
        .tls_client_ca_file
        .clone_from(&running.control.bus.tls_client_ca_file);
    let bus_auth_new = match bus.map(|_| bus_auth(&new_bus)).transpose() {
        Ok(x) => x,
        Err(e) => return refused(e.to_string()),
    };
    let bus_rest = |c: &sortie_core::config::BusConfig| {
        let mut c = c.clone();
        c.token = None;
        c.token_env = None;
        c.workers.clear();
        c.tls_cert_file = None;
        c.tls_key_file = None;
        c
    };
    let (a, b) = (&running.control, &new.control);
    let fixed = [
        ("control.api_listen", a.api_listen != b.api_listen),
        ("control.admin_listen", a.admin_listen != b.admin_listen),
        ("control.proxy_listen", a.proxy_listen != b.proxy_listen),
        ("control.bus_listen", a.bus_listen != b.bus_listen),
        ("control.cores", a.cores != b.cores),
        ("control.data_dir", a.data_dir != b.data_dir),
        (
            "control.bootstrap_snapshot",
            a.bootstrap_snapshot != b.bootstrap_snapshot,
        ),
        ("control.request", a.request != b.request),
        ("control.bus", bus_rest(&a.bus) != bus_rest(&b.bus)),
        ("control.proxy", a.proxy != b.proxy),
        (
            "control.denied_destination_ports",
            a.denied_destination_ports != b.denied_destination_ports,
        ),
        ("store", running.store != new.store),
        (
            "object_storage",
            running.object_storage != new.object_storage,
        ),
        ("egress", running.egress != new.egress),
        ("workers", running.workers != new.workers),
    ];
    for (key, _) in fixed.iter().filter(|(_, differs)| *differs) {
        tracing::warn!(
            key = *key,
            "changed in the configuration file: it takes effect after a restart"
        );
    }
    if let Some(apply) = r.log {
        if let Err(e) = apply(&new.log) {
            return refused(e.to_string());
        }
    }
    if let Err(e) = state.auth.replace_tokens(&resolved.deployments) {
        return refused(e.to_string());
    }
    r.server_limits
        .replace(ServerConfig::from_limits(&new.control.server));
    state.admin_token.store(Arc::new(resolved.admin));
    state.set_access_log(new.log.access);
    if let (Some(bus), Some((credentials, tls))) = (bus, bus_auth_new) {
        bus.reload(credentials, tls);
    }
    tracing::info!(
        file = %path.display(),
        access_log = new.log.access,
        log_level = %new.log.level,
        "configuration reloaded: deployment, admin and worker tokens, bus TLS files, [log], \
         control.server limits for new connections"
    );
}

/// What startup reads from the record store before anything serves.
struct Loaded {
    store: Box<dyn RecordStore + Send>,
    /// PostgreSQL's settings, when the store is shared.
    shared: Option<PostgresConfig>,
    revision: u64,
    snapshot: ValidatedSnapshot,
    registry: WorkerRegistry,
}

/// Opens the store, writes the first configuration on a first start, reads the newest one and
/// the worker settings, and recovers the receipts the last stop interrupted.
fn load_store(config: &Config, data_dir: &Path, is_upgrade: bool) -> Result<Loaded, ServeError> {
    let (mut store, shared) = open_store(config, data_dir)?;
    let record = store
        .bootstrap(&bootstrap_json(config)?, &crate::clock::now_rfc3339())
        .map_err(|e| ioe(format!("store: {e}")))?;
    let latest = store
        .latest_config()
        .map_err(|e| ioe(format!("store: {e}")))?
        .unwrap_or(record);
    let mut bytes = latest.snapshot_json.clone().into_bytes();
    let snapshot: ValidatedSnapshot = decode_snapshot(&mut bytes).map_err(|e| {
        ioe(format!(
            "stored configuration revision {} no longer validates: {e}",
            latest.revision
        ))
    })?;
    let registry = local_registry(config, &mut *store)?;
    // Crash recovery of receipts (decision 034) before anything can read them. On a shared
    // store only receipts no live control can still be working on (decision 093).
    let now_ms = crate::clock::unix_ms();
    // On an upgrade the running process still works on its receipts: the same rule.
    let untouched_since = (shared.is_some() || is_upgrade)
        .then(|| crate::clock::rfc3339(now_ms.saturating_sub(SHARED_RECOVERY_AGE_MS)));
    let recovered = store
        .recover_receipts(&crate::clock::rfc3339(now_ms), untouched_since.as_deref())
        .map_err(|e| ioe(format!("store: {e}")))?;
    if recovered > 0 {
        tracing::info!(
            recovered,
            "receipts interrupted by the last stop were recovered"
        );
    }
    Ok(Loaded {
        store,
        shared,
        revision: latest.revision,
        snapshot,
        registry,
    })
}

/// How the configuration file is read: `Config::from_toml` for `sortie serve`,
/// `Config::from_toml_control` for `sortie control`.
pub type ParseConfig = fn(&str) -> Result<Config, sortie_core::config::ConfigError>;

/// The cold thread with the record store and the object store, and the receipts service on
/// them when object storage is enabled (checked once here, so a wrong endpoint fails the start).
fn start_cold(
    config: &Config,
    data_dir: &Path,
    store: Box<dyn RecordStore + Send>,
) -> Result<Cold, ServeError> {
    let objects = if config.object_storage.enabled {
        Some(
            Objects::from_config(&config.object_storage, data_dir)
                .map_err(|e| ServeError::Config(e.to_string()))?,
        )
    } else {
        None
    };
    let has_objects = objects.is_some();
    let (cold, cold_thread) = ColdThread::start_with(store, objects, COMMAND_QUEUE_CAPACITY)
        .map_err(|e| ioe(format!("store: {e}")))?;
    let receipts = if has_objects {
        check_objects(&cold)?;
        let r = Receipts::new(cold.clone(), &config.object_storage, data_dir)
            .map_err(|e| ioe(format!("object storage: {e}")))?
            .shared();
        r.start_sweep()
            .map_err(|e| ioe(format!("object storage: {e}")))?;
        Some(r)
    } else {
        None
    };
    Ok((cold, cold_thread, receipts))
}

/// The cold thread's handle and thread, and the receipts service on it.
type Cold = (
    crate::store::ColdHandle,
    std::thread::JoinHandle<()>,
    Option<Arc<Receipts>>,
);

/// How `run` starts.
pub struct Start {
    /// The configuration file, read again on SIGHUP; `None` for the embedded defaults.
    pub config_path: Option<PathBuf>,
    /// How that file is read.
    pub parse: ParseConfig,
    /// Take the listening sockets of the process running on the same data directory, which
    /// drains and exits once this one serves (decision 115).
    pub upgrade: bool,
    /// Changes the log's level and format at a reload; `None` leaves them as started.
    pub log: Option<LogReload>,
}

/// Applies a reloaded `[log]` (level and format) to the process's log, or says why it cannot.
pub type LogReload =
    Box<dyn Fn(&sortie_core::config::LogConfig) -> Result<(), LogSettingError> + Send>;

/// A `[log]` setting the process's log cannot take: which setting, and the logging library's
/// reason.
#[derive(Debug, thiserror::Error)]
#[error("{setting}: {reason}")]
pub struct LogSettingError {
    /// The setting, with its value where that helps (`log.level "x"`).
    pub setting: String,
    /// Why it was refused.
    pub reason: String,
}

impl LogSettingError {
    /// `setting` refused for `reason`, as a `map_err` function.
    pub fn refused<E: std::fmt::Display>(setting: impl Into<String>) -> impl FnOnce(E) -> Self {
        let setting = setting.into();
        move |reason| LogSettingError {
            setting,
            reason: reason.to_string(),
        }
    }
}

/// Runs the gateway until SIGTERM or SIGINT, or until a successor took over (decision 115);
/// SIGHUP reads the configuration file again and applies what can change live (decision 114);
/// SIGUSR2 starts a successor.
pub fn run(config: Config, start: Start) -> Result<(), ServeError> {
    let Start {
        config_path,
        parse,
        upgrade,
        log,
    } = start;
    // Installed first, so that a SIGTERM or SIGINT that arrives while the gateway starts (even
    // right after its banner) is a graceful stop rather than the default, abrupt termination.
    let mut signals =
        signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP, SIGUSR2]).map_err(ioe)?;
    let data_dir = PathBuf::from(&config.control.data_dir);
    ensure_data_dir(&data_dir)?;
    let open_files = open_file_limit();
    // An upgrade asks the running process for its sockets before anything else can fail.
    let predecessor = upgrade
        .then(|| crate::upgrade::Successor::connect(&data_dir))
        .transpose()
        .map_err(ioe)?;

    let Loaded {
        store,
        shared,
        revision,
        snapshot,
        registry,
    } = load_store(&config, &data_dir, upgrade)?;
    let (cold, cold_thread, receipts) = start_cold(&config, &data_dir, store)?;

    let n = core_count(config.control.cores);
    let (mut listeners, successor) = Listeners::bind(&config.control, n, predecessor)?;
    let offer = listeners.offer()?;
    let tls = client_config(config.egress.ca_file.as_deref().map(Path::new))
        .map_err(|e| ServeError::Config(format!("egress.ca_file: {e}")))?;
    let resolver = ResolverPool::start().map_err(ioe)?;

    // Generated tokens are shown in full only by the start that creates them, so they are
    // resolved after every step that can still fail: a first start that stops at a taken port
    // or a bad CA file must leave them to be shown by the next one.
    let resolved =
        tokens::resolve(&config, &data_dir).map_err(|e| ServeError::Config(e.to_string()))?;
    let state = Arc::new(ControlState::new(
        &config,
        tokens::Authenticator::new(&resolved.deployments),
        resolved.admin.clone(),
        registry,
        revision,
        Arc::new(snapshot),
    ));
    // With a shared store, revisions and worker settings committed by the other controls
    // become active here too (decision 092).
    let follower = match &shared {
        Some(pg) => Some(
            crate::control::follow::Follower::start(
                state.clone(),
                cold.clone(),
                Some(pg.clone()),
                crate::control::follow::POLL_INTERVAL,
            )
            .map_err(|e| ioe(format!("store follower: {e}")))?,
        ),
        None => None,
    };
    // With a shared store, this control's heartbeat row lets the others recover the receipts
    // it holds should it die (decision 094).
    let mut presence = None;
    if shared.is_some() {
        let address = listeners
            .admin
            .as_ref()
            .map_or(listeners.api.1, |a| a.1)
            .to_string();
        let timing = crate::control::presence::Timing::from_config(&config.store);
        presence = Some(
            crate::control::presence::start(&cold, address, timing)
                .map_err(|e| ioe(format!("store: control heartbeat: {e}")))?,
        );
        crate::control::presence::watch_cancels(&cold, state.clone(), timing.cancel_poll)
            .map_err(|e| ioe(format!("store: cancel intents: {e}")))?;
    }
    let bus_shared = match &listeners.bus {
        Some((_, addr)) => {
            crate::remote::start_forgetting(
                state.clone(),
                &cold,
                Duration::from_millis(config.control.bus.forget_disconnected_ms),
            )
            .map_err(|e| ioe(format!("store: worker expiry: {e}")))?;
            Some(bus_shared(&config, n, *addr, listeners.api.1.port())?)
        }
        None => None,
    };
    let reload_bus = bus_shared.clone();
    let metrics = Arc::new(Metrics::new(n));
    let metrics_state = state.clone();
    let metrics_render = metrics.clone();
    let admin_ctx = Arc::new(AdminContext::new(
        state.clone(),
        cold.clone(),
        Arc::new(move || metrics_render.render(&metrics_state.gauges())),
    ));

    let receivers = mailboxes(&state, n);
    let tunnels = Arc::new(TunnelCounts::new(
        state.auth.len(),
        config.control.proxy.max_tunnels_per_deployment,
    ));
    let trigger = ShutdownTrigger::new();
    let phases = Phases::default();

    print_banner(
        &config,
        config_path.as_deref(),
        &resolved,
        ListenAddrs {
            api: listeners.api.1,
            admin: listeners.admin.as_ref().map(|a| a.1),
            proxy: listeners.proxy.as_ref().map(|a| a.1),
            bus: listeners.bus.as_ref().map(|a| a.1),
        },
        n,
        open_files,
        shared.as_ref().is_some_and(PostgresConfig::is_tls),
    );
    warn_if_descriptors_short(open_files, n, &config);
    crate::runtime::exit_on_core_panic();
    let server_limits = LiveServerConfig::new(ServerConfig::from_limits(&config.control.server));
    let pool_limits = PoolLimits {
        idle_timeout: Duration::from_millis(config.egress.pool_idle_timeout_ms),
        ..PoolLimits::default()
    };
    let api_addr = listeners.api.1;
    let beats = crate::systemd::CoreBeats::new(n);
    let [api_socks, admin_socks, proxy_socks, bus_socks] = listeners.per_core();
    let parts = Arc::new(CoreParts {
        state: state.clone(),
        trigger: trigger.clone(),
        phases: phases.clone(),
        receivers,
        api_socks,
        admin_socks,
        proxy_socks,
        bus_socks,
        bus_shared,
        tunnels,
        tls,
        resolver,
        admin_ctx,
        metrics,
        server_limits: server_limits.clone(),
        receipts,
        pool_limits,
        beats: beats.clone(),
    });
    let handles =
        spawn_cores(n, move |ctx| serve_core(ctx.index, parts.take(ctx.index))).map_err(ioe)?;
    let handover = announce(Announce {
        successor,
        offer,
        data_dir: &data_dir,
        signals: &signals,
        api_addr,
        state: &state,
        phases: &phases,
        has_bus: reload_bus.is_some(),
    });
    let watchdog = crate::systemd::Watchdog::start(beats);

    until_stopped(&mut signals, || {
        reload(&Reloadable {
            state: &state,
            bus: reload_bus.as_deref(),
            running: &config,
            path: config_path.as_deref(),
            parse,
            data_dir: &data_dir,
            server_limits: &server_limits,
            log: log.as_ref(),
        });
    });
    stop(Running {
        handover,
        phases,
        drain: server_limits.get().shutdown_grace,
        watchdog,
        trigger,
        handles,
        follower,
        presence,
        is_shared: shared.is_some(),
        cold,
        cold_thread,
    });
    Ok(())
}

/// The steps of a start beyond the stop itself, fired once each.
#[derive(Clone, Default)]
struct Phases {
    /// The bus listeners stop accepting: at a stop, or when the remote workers move to a
    /// successor (decision 115).
    bus_stop: ShutdownTrigger,
    /// The HTTP listeners start accepting: at once, or on an upgrade once the predecessor's
    /// remote workers registered here.
    gate: ShutdownTrigger,
}

/// What `announce` needs.
struct Announce<'a> {
    successor: Option<crate::upgrade::Successor>,
    offer: Vec<crate::upgrade::Offered>,
    data_dir: &'a Path,
    signals: &'a signal_hook::iterator::Signals,
    api_addr: SocketAddr,
    state: &'a Arc<ControlState>,
    phases: &'a Phases,
    /// Whether this process has a bus listener, so remote workers to move.
    has_bus: bool,
}

/// How long an upgraded control waits for its predecessor's remote workers to register before
/// it opens its HTTP listeners anyway (the predecessor serves requests meanwhile).
pub const UPGRADE_WORKER_WAIT: Duration = Duration::from_secs(10);

/// On an upgrade, moves the predecessor's remote workers here and waits (up to
/// [`UPGRADE_WORKER_WAIT`]) until they registered.
fn move_workers(s: &mut crate::upgrade::Successor, state: &ControlState) {
    let ids = match s.move_workers() {
        Ok(ids) => ids,
        Err(e) => {
            tracing::warn!(error = %e, "binary upgrade: the remote workers were not moved");
            return;
        }
    };
    let started = std::time::Instant::now();
    let registered = || {
        state.with_registry(|reg, _| {
            ids.iter().all(|id| {
                reg.get(id)
                    .is_some_and(|r| r.state() == sortie_core::worker::WorkerState::Connected)
            })
        })
    };
    while !registered() && started.elapsed() < UPGRADE_WORKER_WAIT {
        std::thread::sleep(Duration::from_millis(10));
    }
    let missing = state.with_registry(|reg, _| {
        ids.iter()
            .filter(|id| {
                reg.get(id)
                    .is_none_or(|r| r.state() != sortie_core::worker::WorkerState::Connected)
            })
            .count()
    });
    tracing::info!(
        workers = ids.len(),
        missing,
        waited_ms = started.elapsed().as_millis() as u64,
        "binary upgrade: the predecessor's remote workers registered here"
    );
}

/// The running process's side of a hand-over's steps.
fn hooks(a: &Announce<'_>) -> crate::upgrade::Hooks {
    let (state, bus_stop) = (a.state.clone(), a.phases.bus_stop.clone());
    let signals = a.signals.handle();
    crate::upgrade::Hooks {
        move_workers: Box::new(move || {
            // The bus stops accepting before any lane hears `GoAway`, so that the workers'
            // new lanes reach the successor.
            bus_stop.trigger();
            if let Some(mailboxes) = state.mailboxes.get() {
                for m in mailboxes {
                    m.send(CoreCommand::GoAwayAll("control upgrade".into()));
                }
            }
            state.with_registry(|reg, _| {
                reg.iter()
                    .filter(|r| {
                        r.executor() == Executor::Remote
                            && r.state() == sortie_core::worker::WorkerState::Connected
                    })
                    .map(|r| r.id().as_str().to_owned())
                    .collect()
            })
        }),
        // A completed hand-over ends the wait for signals; the drain follows.
        handed_over: Box::new(move |_| signals.close()),
    }
}

/// Tells the predecessor of an upgrade, then the service manager, that this process serves,
/// and offers its sockets to a successor in turn. Without the hand-over socket the process
/// serves on, unable to hand over.
fn announce(a: Announce<'_>) -> Option<crate::upgrade::Handover> {
    let hooks = hooks(&a);
    let Announce {
        mut successor,
        offer,
        data_dir,
        api_addr,
        state,
        phases,
        has_bus,
        ..
    } = a;
    if let Some(s) = successor.as_mut() {
        if has_bus {
            move_workers(s, state);
        }
    }
    phases.gate.trigger();
    if let Some(s) = successor {
        match s.ready() {
            Ok(()) => tracing::info!("binary upgrade: serving; the previous process drains"),
            Err(e) => {
                tracing::warn!(error = %e, "binary upgrade: the previous process did not confirm; serving anyway")
            }
        }
    }
    crate::systemd::ready(&format!("serving the API on {api_addr}"));
    match crate::upgrade::Handover::listen(data_dir, offer, hooks) {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!(error = %e, "binary upgrade: no hand-over socket in the data directory; this process cannot hand over");
            None
        }
    }
}

/// A mailbox per core: the senders go to the shared state, the receivers to the cores.
fn mailboxes(state: &ControlState, n: usize) -> PerCore<MailboxReceiver> {
    let mut senders = Vec::with_capacity(n);
    let mut receivers: Vec<Option<MailboxReceiver>> = Vec::with_capacity(n);
    for _ in 0..n {
        let (tx, rx) = mailbox();
        senders.push(tx);
        receivers.push(Some(rx));
    }
    let _ = state.mailboxes.set(senders);
    std::sync::Mutex::new(receivers)
}

/// What a running control stops, in order.
struct Running {
    /// The hand-over socket; a successor's pid once it took over.
    handover: Option<crate::upgrade::Handover>,
    phases: Phases,
    /// How long in-flight requests and tunnels may run on (`control.server.drain_timeout_ms`).
    drain: Duration,
    watchdog: Option<crate::systemd::Watchdog>,
    trigger: ShutdownTrigger,
    handles: Vec<std::thread::JoinHandle<()>>,
    follower: Option<crate::control::follow::Follower>,
    presence: Option<crate::control::presence::Presence>,
    is_shared: bool,
    cold: crate::store::ColdHandle,
    cold_thread: std::thread::JoinHandle<()>,
}

/// The graceful stop: the cores finish their requests within the grace, then the follower,
/// the heartbeat and the cold thread stop.
fn stop(r: Running) {
    let Running {
        handover,
        phases,
        drain,
        watchdog,
        trigger,
        handles,
        follower,
        mut presence,
        is_shared,
        cold,
        cold_thread,
    } = r;
    if let Some(w) = watchdog {
        w.stop();
    }
    match handover
        .as_ref()
        .and_then(crate::upgrade::Handover::successor)
    {
        Some(pid) => {
            // The successor is the service now (it told the service manager); idle
            // connections linger so that their clients move over at their next request.
            tracing::info!(
                successor = pid,
                "handed over: finishing in-flight requests and tunnels"
            );
            trigger.trigger_lingering(UPGRADE_IDLE_LINGER.min(drain));
        }
        None => {
            // The service manager hears of the drain; its stop timeout bounds it from here.
            crate::systemd::stopping();
            if let Some(h) = &handover {
                h.withdraw();
            }
            tracing::info!("shutting down: finishing in-flight requests");
            trigger.trigger();
        }
    }
    phases.bus_stop.trigger();
    let deadline = std::time::Instant::now() + drain + CORE_STOP_MARGIN;
    let mut is_every_core_done = true;
    for h in handles {
        while !h.is_finished() && std::time::Instant::now() < deadline {
            std::thread::park_timeout(Duration::from_millis(20));
        }
        if h.is_finished() {
            let _ = h.join();
        } else {
            is_every_core_done = false;
        }
    }
    if let Some(f) = follower {
        f.stop();
    }
    // Last store write of a shared store: the others need not wait for this control's row to
    // expire (decision 098). Only once every core stopped: a request still running past the
    // grace may still use the receipt it holds, which leaving would hand to another control.
    // No beat after this: the row is removed just below, or left to expire.
    if let Some(p) = presence.take() {
        p.stop();
    }
    if is_shared {
        if is_every_core_done {
            crate::control::presence::leave(&cold);
        } else {
            tracing::warn!(
                "a core still running past the shutdown grace and its margin: this control's \
                 row is left to expire, and its receipts with it"
            );
        }
    }
    cold.shutdown();
    let _ = cold_thread.join();
    tracing::info!("stopped");
}

/// Warns when the open-file limit is below what the per-core connection limits may use: a
/// request in flight holds a client and an upstream descriptor.
fn warn_if_descriptors_short(open_files: Option<u64>, cores: usize, config: &Config) {
    let Some(limit) = open_files else { return };
    let per_core = config.control.server.max_connections_per_core as u64;
    let wanted = (cores as u64).saturating_mul(per_core.saturating_mul(2));
    if limit < wanted {
        tracing::warn!(
            limit,
            wanted,
            "the open-file limit caps connections below the per-core limits; raise the hard \
             limit (ulimit -Hn, or LimitNOFILE= for a systemd service)"
        );
    }
}

impl Listeners {
    /// Moves each listener's sockets, one per core, out for the cores to take (API, admin,
    /// proxy, bus); the addresses stay for the banner.
    fn per_core(&mut self) -> [CoreSockets; 4] {
        let each = |l: Option<&mut Bound>| {
            let socks = l.map(|(v, _)| std::mem::take(v)).unwrap_or_default();
            std::sync::Mutex::new(socks.into_iter().map(Some).collect::<Vec<_>>())
        };
        [
            each(Some(&mut self.api)),
            each(self.admin.as_mut()),
            each(self.proxy.as_mut()),
            each(self.bus.as_mut()),
        ]
    }
}

/// One slot per core, each taken once by its core.
type PerCore<T> = std::sync::Mutex<Vec<Option<T>>>;

/// The sockets of one listener, a list per core.
type CoreSockets = PerCore<Vec<std::net::TcpListener>>;

/// Takes core `index`'s slot.
fn take_slot<T>(slots: &PerCore<T>, index: usize) -> Option<T> {
    slots
        .lock()
        .ok()
        .and_then(|mut v| v.get_mut(index).and_then(Option::take))
}

/// What startup hands to the cores: shared pieces, and per-core ones each core takes once.
struct CoreParts {
    state: Arc<ControlState>,
    trigger: ShutdownTrigger,
    phases: Phases,
    receivers: PerCore<MailboxReceiver>,
    api_socks: CoreSockets,
    admin_socks: CoreSockets,
    proxy_socks: CoreSockets,
    bus_socks: CoreSockets,
    bus_shared: Option<Arc<crate::remote::BusShared>>,
    tunnels: Arc<TunnelCounts>,
    tls: Arc<rustls::ClientConfig>,
    resolver: ResolverPool,
    admin_ctx: Arc<AdminContext>,
    metrics: Arc<Metrics>,
    server_limits: LiveServerConfig,
    receipts: Option<Arc<Receipts>>,
    pool_limits: PoolLimits,
    beats: Arc<crate::systemd::CoreBeats>,
}

/// One core's share: what it takes for itself, and the shared parts.
struct CorePart {
    parts: Arc<CoreParts>,
    signal: crate::http::ShutdownSignal,
    bus_signal: crate::http::ShutdownSignal,
    gate: crate::http::ShutdownSignal,
    rx: Option<MailboxReceiver>,
    api_sock: Vec<std::net::TcpListener>,
    admin_sock: Vec<std::net::TcpListener>,
    proxy_sock: Vec<std::net::TcpListener>,
    bus_sock: Vec<std::net::TcpListener>,
}

impl CoreParts {
    /// Core `index`'s share: its sockets and mailbox taken, the rest shared.
    fn take(self: &Arc<Self>, index: usize) -> CorePart {
        CorePart {
            parts: Arc::clone(self),
            signal: self.trigger.signal(),
            bus_signal: self.phases.bus_stop.signal(),
            gate: self.phases.gate.signal(),
            rx: take_slot(&self.receivers, index),
            api_sock: take_slot(&self.api_socks, index).unwrap_or_default(),
            admin_sock: take_slot(&self.admin_socks, index).unwrap_or_default(),
            proxy_sock: take_slot(&self.proxy_socks, index).unwrap_or_default(),
            bus_sock: take_slot(&self.bus_socks, index).unwrap_or_default(),
        }
    }
}

/// Serves one core until shutdown: its bus lanes and mailbox, then the proxy, admin and API
/// listeners on one egress executor and one active-request table.
async fn serve_core(index: usize, part: CorePart) {
    #[cfg(debug_assertions)]
    debug_panic_core(index);
    let CorePart {
        parts,
        signal,
        bus_signal,
        gate,
        rx,
        api_sock,
        admin_sock,
        proxy_sock,
        bus_sock,
    } = part;
    let state = &parts.state;
    monoio::spawn(parts.beats.clone().run(index));
    let active = Rc::new(ActiveRequests::default());
    let bus = parts
        .bus_shared
        .clone()
        .map(|shared| crate::remote::BusCore::new(index, shared, state.clone()));
    if let Some(bus) = &bus {
        for sock in bus_sock {
            match monoio::net::TcpListener::from_std(sock) {
                Ok(l) => {
                    monoio::spawn(bus.clone().serve(l, bus_signal.clone()));
                }
                Err(e) => tracing::error!(error = %e, "bus listener"),
            }
        }
    }
    if let Some(rx) = rx {
        monoio::spawn(run_mailbox(rx, active.clone(), bus.clone()));
    }
    let egress = Rc::new(Egress::with_pool_limits(
        Resolver::new(parts.resolver.clone()),
        &parts.tls,
        parts.pool_limits,
    ));
    let cfg = Rc::new(CoreServerConfig::new(parts.server_limits.clone()));
    // On an upgrade the HTTP listeners open once the remote workers moved here (decision 115).
    if let http::Either::Right(()) = http::race(gate.wait(), signal.wait()).await {
        return;
    }
    let mut tasks = Vec::new();
    let on = Serving {
        cfg: &cfg,
        signal: &signal,
    };
    if !proxy_sock.is_empty() {
        // The proxy shares the core's egress pool and active list with the request API.
        let mut ctx = Dispatcher::new(
            state.clone(),
            active.clone(),
            egress.clone(),
            parts.metrics.clone(),
            index,
        );
        // Remote workers relay proxied requests over this core's lanes.
        ctx.bus = bus.clone();
        let h = Rc::new(ProxyHandler::new(ctx, parts.tunnels.clone()));
        on.spawn(proxy_sock, "proxy", &h, &mut tasks);
    }
    let mut api = ApiHandler::new(state.clone(), active, egress, parts.metrics.clone(), index);
    if let Some(r) = parts.receipts.clone() {
        api = api.with_receipts(r);
    }
    if let Some(b) = bus {
        api = api.with_bus(b);
    }
    let api = Rc::new(api);
    if !admin_sock.is_empty() {
        let h = Rc::new(AdminHandler::new(parts.admin_ctx.clone()));
        on.spawn(admin_sock, "admin", &h, &mut tasks);
    }
    on.spawn(api_sock, "api", &api, &mut tasks);
    for t in tasks {
        t.await;
    }
}

/// What every HTTP listener of a core is served with.
struct Serving<'a> {
    cfg: &'a Rc<CoreServerConfig>,
    signal: &'a crate::http::ShutdownSignal,
}

impl Serving<'_> {
    /// Serves each of a listener's sockets on this core with `handler`, on a task of its own.
    fn spawn<H: http::Handler>(
        &self,
        socks: Vec<std::net::TcpListener>,
        what: &str,
        handler: &Rc<H>,
        tasks: &mut Vec<monoio::task::JoinHandle<()>>,
    ) {
        for sock in socks {
            match monoio::net::TcpListener::from_std(sock) {
                Ok(l) => tasks.push(monoio::spawn(http::serve_live(
                    l,
                    handler.clone(),
                    self.cfg.clone(),
                    self.signal.clone(),
                ))),
                Err(e) => tracing::error!(error = %e, "{what} listener"),
            }
        }
    }
}

/// The bound addresses the banner reports.
struct ListenAddrs {
    api: SocketAddr,
    admin: Option<SocketAddr>,
    proxy: Option<SocketAddr>,
    bus: Option<SocketAddr>,
}

/// The bus settings of this control: worker token, TLS unless plain TCP was asked for.
fn bus_shared(
    config: &Config,
    cores: usize,
    addr: SocketAddr,
    api_port: u16,
) -> Result<Arc<crate::remote::BusShared>, ServeError> {
    let b = &config.control.bus;
    let (credentials, tls) = bus_auth(b)?;
    // Workers fetch receipt bodies on this port only (decision 068).
    let receipt_port = match b.api_base_url.as_deref() {
        Some(u) => {
            sortie_core::request::parse_target_url(u)
                .map_err(|e| ServeError::Config(format!("control.bus.api_base_url: {e}")))?
                .port
        }
        None => api_port,
    };
    Ok(crate::remote::BusShared::new(crate::remote::BusSettings {
        credentials: arc_swap::ArcSwap::from_pointee(credentials),
        tls: tls.map(arc_swap::ArcSwap::new),
        requires_client_certificate: b.tls_client_ca_file.is_some() && !b.plaintext,
        heartbeat_ms: b.heartbeat_ms,
        assignment_timeout: Duration::from_millis(b.assignment_timeout_ms),
        cores,
        control_id: format!("control-{addr}"),
        api_base_url: b
            .api_base_url
            .as_deref()
            .map(|u| u.trim_end_matches('/').to_string()),
        api_port,
        receipt_port,
        proxy_idle_ms: u32::try_from(config.control.proxy.idle_timeout_ms).unwrap_or(u32::MAX),
    }))
}

/// Who may attach to the bus and its TLS configuration, from `[control.bus]`: at start, and
/// again at a reload (decision 114).
fn bus_auth(
    b: &sortie_core::config::BusConfig,
) -> Result<
    (
        crate::remote::Credentials,
        Option<Arc<rustls::ServerConfig>>,
    ),
    ServeError,
> {
    // Decision 105: each worker's own token when `[[control.bus.workers]]` lists them, else
    // the one shared token.
    let credentials = if b.workers.is_empty() {
        let token = tokens::from_secret("control.bus", &b.secret())
            .map_err(|e| ServeError::Config(e.to_string()))?
            .ok_or_else(|| ServeError::Config("control.bus: needs token or token_env".into()))?;
        crate::remote::Credentials::Shared(token.into_bytes())
    } else {
        let mut entries = std::collections::HashMap::with_capacity(b.workers.len());
        for (i, w) in b.workers.iter().enumerate() {
            let path = format!("control.bus.workers[{i}]");
            let token = tokens::from_secret(&path, &w.secret())
                .map_err(|e| ServeError::Config(e.to_string()))?
                .ok_or_else(|| ServeError::Config(format!("{path}: needs token or token_env")))?;
            entries.insert(
                w.id.clone(),
                crate::remote::WorkerCredential {
                    token: token.into_bytes(),
                    entry: w.clone(),
                },
            );
        }
        crate::remote::Credentials::PerWorker(entries)
    };
    let tls = if b.plaintext {
        None
    } else {
        let (Some(cert), Some(key)) = (&b.tls_cert_file, &b.tls_key_file) else {
            return Err(ServeError::Config(
                "control.bus: tls_cert_file and tls_key_file are required, or plaintext = true"
                    .into(),
            ));
        };
        let identity = crate::bus::conn::CertKey {
            key: "control.bus",
            cert_file: cert,
            key_file: key,
        };
        Some(
            crate::bus::conn::server_config(&identity, b.tls_client_ca_file.as_deref())
                .map_err(|e| ServeError::Config(e.to_string()))?,
        )
    };
    Ok((credentials, tls))
}

/// Debug builds only: `SORTIE_DEBUG_PANIC_CORE=<index>` makes that core panic shortly after it
/// starts, so that tests can check the panic policy (decision 041) on a real process.
#[cfg(debug_assertions)]
fn debug_panic_core(index: usize) {
    let wanted = std::env::var("SORTIE_DEBUG_PANIC_CORE").ok();
    if wanted.and_then(|v| v.parse::<usize>().ok()) == Some(index) {
        monoio::spawn(async {
            monoio::time::sleep(Duration::from_millis(200)).await;
            panic!("panic requested by SORTIE_DEBUG_PANIC_CORE");
        });
    }
}

/// Checks the object store once at startup (the S3 bucket answers; the filesystem directory
/// exists and crash leftovers are cleared), so a wrong endpoint fails the start, not the first
/// upload.
fn check_objects(cold: &crate::store::ColdHandle) -> Result<(), ServeError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    cold.spawn(move |ctx| async move {
        let r = match ctx.objects() {
            Some(o) => o.startup().await,
            None => Ok(()),
        };
        let _ = tx.send(r);
    })
    .map_err(|e| ioe(format!("object storage: {e}")))?;
    match rx.recv_timeout(OBJECT_STORE_CHECK_TIMEOUT) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(ioe(format!("object storage: {e}"))),
        Err(_) => Err(ioe(
            "object storage: no answer within 30 s at startup".to_string()
        )),
    }
}

/// How long the startup check of the object store may take.
const OBJECT_STORE_CHECK_TIMEOUT: Duration = Duration::from_secs(30);

fn print_banner(
    config: &Config,
    config_path: Option<&Path>,
    t: &tokens::ResolvedTokens,
    addrs: ListenAddrs,
    cores: usize,
    open_files: Option<u64>,
    is_store_tls: bool,
) {
    let source = config_path.map_or_else(
        || "embedded defaults".to_string(),
        |p| p.display().to_string(),
    );
    println!("sortie {} ({source})", env!("CARGO_PKG_VERSION"));
    println!("  data dir:  {}", config.control.data_dir);
    println!("  cores:     {cores} ({})", Driver::detect().as_str());
    if let Some(n) = open_files {
        println!("  fd limit:  {n} open files");
    }
    let ListenAddrs {
        api,
        admin,
        proxy,
        bus,
    } = addrs;
    println!("  api:       http://{api}  (listening)");
    match admin {
        Some(a) => println!("  admin:     http://{a}  (listening)"),
        None => println!("  admin:     disabled"),
    }
    match proxy {
        Some(p) => println!("  proxy:     http://{p}  (listening)"),
        None => println!("  proxy:     disabled"),
    }
    if let Some(b) = bus {
        let scheme = if config.control.bus.plaintext {
            "tcp"
        } else {
            "tls"
        };
        println!("  bus:       {scheme}://{b}  (listening)");
    }
    match config.store.backend {
        StoreBackend::Sqlite => println!(
            "  store:     sqlite, {}/{}",
            config.control.data_dir,
            crate::store::DATABASE_FILE_NAME
        ),
        StoreBackend::Postgres => println!(
            "  store:     postgres, url from ${}{}",
            config.store.url_env.as_deref().unwrap_or_default(),
            if is_store_tls { " (tls)" } else { "" }
        ),
    }
    let o = &config.object_storage;
    match (o.enabled, o.backend) {
        (false, _) => println!("  receipts:  disabled (object_storage.enabled = false)"),
        (true, sortie_core::config::ObjectBackend::Fs) => println!(
            "  receipts:  fs, {}/{}",
            config.control.data_dir,
            crate::store::objects::FS_DIRECTORY
        ),
        (true, sortie_core::config::ObjectBackend::S3) => println!(
            "  receipts:  s3, bucket {} at {}",
            o.bucket.as_deref().unwrap_or_default(),
            o.endpoint.as_deref().unwrap_or_default()
        ),
    }
    if let Some(file) = &t.file {
        if t.is_new_file {
            println!(
                "  tokens generated and stored in {} (shown this once):",
                file.display()
            );
            for (id, tok) in &t.deployments {
                println!("    deployment {id}: {tok}");
            }
            println!("    admin: {}", t.admin);
        } else {
            println!("  tokens:    {}", file.display());
            for (id, tok) in &t.deployments {
                println!("    deployment {id}: {}", tokens::redact(tok));
            }
        }
    }
    use std::io::Write as _;
    let _ = io::stdout().flush();
}

/// Serves the core's mailbox until every sender is gone.
async fn run_mailbox(
    mut rx: MailboxReceiver,
    active: Rc<ActiveRequests>,
    bus: Option<Rc<crate::remote::BusCore>>,
) {
    while let Some(cmd) = rx.next().await {
        match cmd {
            CoreCommand::ListActive(reply) => {
                let _ = reply.send(active.list());
            }
            CoreCommand::Cancel(id, reply) => {
                let _ = reply.send(active.cancel(&id));
            }
            CoreCommand::AdoptLane(h) => {
                if let Some(bus) = &bus {
                    monoio::spawn(bus.clone().adopt_handoff(h));
                }
            }
            CoreCommand::PushConfig(version, payload) => {
                if let Some(bus) = &bus {
                    bus.push_config(version, &payload);
                }
            }
            CoreCommand::GoAwayAll(reason) => {
                if let Some(bus) = &bus {
                    bus.go_away_all(&reason);
                }
            }
        }
    }
}
