//! `sortie worker`: a remote egress executor. For every configured control it opens lane 0,
//! learns the control's core count from `Welcome`, applies the configuration the control pushes
//! (destination policy, pools), then opens the other lanes, each on one of the worker's own
//! cores. Assignments run with the same egress client as a local worker; response bodies go
//! back within the control's flow-control window. Losing any lane of a control closes all of
//! them, and the worker reconnects with exponential backoff and jitter (decision 061).
//!
//! The worker runs the fingerprint self-test and advertises the verified profiles. One applied
//! configuration per control, shared by that control's lanes only (decision 066); a pool's
//! `password_env` is read from the worker's own environment. Receipt bodies are fetched from the
//! control's signed worker route, only from the host the lane dialled and the receipt port its
//! welcome announced, connecting to that address alone. Relayed requests run under the control's
//! proxy idle limit; tunnels use `Egress::dial`/`dial_via`.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use futures_channel::{mpsc, oneshot};
use futures_util::StreamExt as _;
use sortie_core::bus::{
    Assign, AssignUrl, BodySource, EncodeError, Frame, FrameBuf, HeadFields, Heartbeat, Hello,
    ResponseHead, StreamError, StreamId, Verdict, WorkerLane, FIELD_BLOCK_VERSION, MAX_DATA_BYTES,
    PROTOCOL_VERSION, PROTOCOL_VERSION_MIN, RESPONSE_FRAME_VERSION,
};
use sortie_core::config::WorkerFile;
use sortie_core::destination::DestinationPolicy;
use sortie_core::error::{ApiError, ErrorCode};
use sortie_core::request::{parse_target_url, Method};
use sortie_core::snapshot::ConfigId;
use sortie_core::worker::AdvertisedCapabilities;

use crate::bus::conn::Conn;
use crate::bus::{buffered_frame, read_frame, Notify, Outbox, Queue};
use crate::dns::{Resolver, ResolverPool};
use crate::egress::{
    BodyLength, BodySource as EgressBody, Egress, HealthRegistry, ProxyPool, ProxyRoute,
    StreamRequest, Timeouts, TunnelStream,
};
use sortie_core::provider_session::ProviderSession;

/// First reconnection delay; it doubles per failed attempt up to [`BACKOFF_MAX`].
pub const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest reconnection delay (before jitter).
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How long connecting and the welcome may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What every core of the worker shares.
struct Shared {
    /// The worker's id, parsed once at the start.
    id: ConfigId,
    session: String,
    token: Vec<u8>,
    caps: AdvertisedCapabilities,
    capacity: u32,
    active: AtomicU32,
    applied: AtomicU64,
    /// Upstream proxy endpoint health, kept across configurations (decision 071).
    health: HealthRegistry,
    bind_address: Option<IpAddr>,
    /// Set by SIGTERM/SIGINT: lanes say `GoAway`, new assignments are refused.
    is_stopping: std::sync::atomic::AtomicBool,
    /// Set once a successor took over (decision 115): lanes say `GoAway` so the controls
    /// switch to the successor's lanes, but an assignment that crossed it is still served.
    is_handing_over: std::sync::atomic::AtomicBool,
    /// Per control address: its lanes admitted now, and how many it has (learnt from lane 0's
    /// welcome), so that a successor knows when it can take over.
    links: Mutex<HashMap<String, (u16, u16)>>,
    timeouts: Timeouts,
    tls: Option<Arc<rustls::ClientConfig>>,
    server_name: Option<String>,
    /// Each core's command channel.
    cores: Mutex<Vec<mpsc::UnboundedSender<OpenLane>>>,
}

/// What a worker applies of a configuration push.
struct Applied {
    policy: DestinationPolicy,
    /// Pool id → its upstream proxy (`None`: egress from the worker's own address). The
    /// password of `password_env` is read from the worker's environment (decision 063).
    /// Looked up once per assignment: foldhash, not SipHash.
    pools: sortie_core::FastMap<String, Option<Arc<ProxyPool>>>,
}

impl Applied {
    fn of(s: &sortie_core::snapshot::ValidatedSnapshot, health: &HealthRegistry) -> Applied {
        let policy = DestinationPolicy::new(
            s.destinations().allow().to_vec(),
            s.destinations().deny().to_vec(),
        );
        let pools = s
            .pools()
            .iter()
            .map(|p| {
                let proxy = p.upstream_proxy().map(|u| {
                    Arc::new(ProxyPool::build(
                        u,
                        health,
                        sortie_core::upstream_proxy::OutlierPolicy::default(),
                    ))
                });
                (p.id().as_str().to_string(), proxy)
            })
            .collect();
        Applied { policy, pools }
    }
}

/// The configuration one control pushed, shared by that control's lanes on every core. Each
/// control has its own: a worker serving two controls runs each one's requests under that
/// control's destination policy and pools. Empty until the first push, and emptied by a push
/// that does not decode, so assignments are refused (`config`) rather than run under a stale
/// policy.
type ControlConfig = Arc<ArcSwapOption<Applied>>;

/// Ask a core to open one lane.
struct OpenLane {
    addr: String,
    config: ControlConfig,
    lane: u16,
    lanes: u16,
    stop: oneshot::Receiver<()>,
    result: oneshot::Sender<LaneEnd>,
}

/// How a lane ended.
#[derive(Debug)]
enum LaneEnd {
    /// Connected and admitted, then lost (or stopped).
    Lost,
    /// Never admitted: connection failure or refusal.
    Failed(LaneSetupError),
}

/// Why a worker could not start, or could not take over from its predecessor.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The binary upgrade's hand-over with the running worker failed.
    #[error("binary upgrade: {0}")]
    Upgrade(#[from] crate::upgrade::UpgradeError),
    /// `worker.token_env` names a variable that is not set, or is empty.
    #[error(transparent)]
    Token(#[from] crate::tokens::TokenError),
    /// `worker.id` is not an id the routing model accepts.
    #[error("worker.id {id:?}: {reason}")]
    InvalidId {
        /// The id as configured.
        id: String,
        /// What is wrong with it.
        reason: sortie_core::config_id::IdError,
    },
    /// Neither `worker.token` nor `worker.token_env` is set.
    #[error("worker: needs token or token_env")]
    NoToken,
    /// TLS to the controls without a CA to trust.
    #[error("worker.ca_file is required, or plaintext = true")]
    NoCaFile,
    /// The bus TLS files (CA, client certificate and key) did not load.
    #[error(transparent)]
    BusTls(#[from] crate::bus::conn::BusTlsError),
    /// `egress.ca_file` did not load.
    #[error("egress.ca_file: {0}")]
    EgressTls(#[from] crate::egress::TlsConfigError),
    /// A thread or signal handler the worker needs could not be set up.
    #[error("{what}: {source}")]
    Setup {
        /// What failed to start.
        what: &'static str,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A binary upgrade's successor could not bring up every lane in time; the running
    /// worker keeps serving.
    #[error(
        "binary upgrade: not every lane to the controls was admitted within {} s; the running worker keeps serving",
        UPGRADE_READY_WAIT.as_secs()
    )]
    UpgradeNotReady,
}

fn setup(what: &'static str) -> impl FnOnce(std::io::Error) -> WorkerError {
    move |source| WorkerError::Setup { what, source }
}

/// Why a lane to a control was not admitted (logged; the worker retries with backoff).
#[derive(Debug, thiserror::Error)]
enum LaneSetupError {
    #[error("connect {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("server name: {0}")]
    ServerName(#[from] rustls::pki_types::InvalidDnsNameError),
    #[error("TLS to {addr}: {source}")]
    Tls {
        addr: String,
        source: std::io::Error,
    },
    #[error("hello: {0}")]
    Encode(#[from] sortie_core::bus::EncodeError),
    #[error("write hello: {0}")]
    Write(std::io::Error),
    #[error("read welcome: {0}")]
    Read(crate::bus::ReadError),
    #[error("{reason}: {message}")]
    Rejected { reason: String, message: String },
    #[error("{0} instead of welcome")]
    Unexpected(&'static str),
    #[error("closed before welcome")]
    Closed,
    #[error("no welcome in time")]
    TimedOut,
}

/// How `run` starts.
pub struct Start {
    /// The configuration file: a successor finds its predecessor by it.
    pub config_path: std::path::PathBuf,
    /// Replace the worker running with the same file without a moment in which it is not
    /// routable (decision 115).
    pub upgrade: bool,
}

/// How long a successor waits for every lane to every control to be admitted.
pub const UPGRADE_READY_WAIT: Duration = Duration::from_secs(30);

/// Runs the worker until the process is stopped, or until a successor took over.
pub fn run(file: WorkerFile, start: Start) -> Result<(), WorkerError> {
    let predecessor = start
        .upgrade
        .then(|| crate::upgrade::WorkerSuccessor::connect(&start.config_path))
        .transpose()?;
    let w = &file.worker;
    let token = crate::tokens::from_secret(
        "worker",
        &sortie_core::config::SecretRef {
            token: w.token.clone(),
            token_env: w.token_env.clone(),
        },
    )?
    .ok_or(WorkerError::NoToken)?;
    let tls = match (&w.ca_file, w.plaintext) {
        (_, true) => None,
        (Some(ca), false) => {
            let identity = match (&w.tls_cert_file, &w.tls_key_file) {
                (Some(cert_file), Some(key_file)) => Some(crate::bus::conn::CertKey {
                    key: "worker",
                    cert_file,
                    key_file,
                }),
                _ => None,
            };
            Some(crate::bus::conn::client_config(ca, identity.as_ref())?)
        }
        (None, false) => return Err(WorkerError::NoCaFile),
    };
    let egress_tls =
        crate::egress::client_config(file.egress.ca_file.as_deref().map(std::path::Path::new))?;
    let resolver = ResolverPool::start().map_err(setup("resolver threads"))?;
    // The worker advertises exactly the profiles whose loopback self-test passed in this
    // process, before it dials any control (decision 082).
    let fingerprint_profiles = crate::egress::fingerprint::verify_and_log(
        file.egress.ca_file.as_deref().map(std::path::Path::new),
    );
    let n = crate::runtime::core_count(w.cores);
    // A successor's session asks the controls to wait beside its predecessor's (decision 115).
    let prefix = if predecessor.is_some() {
        crate::remote::SUCCESSOR_SESSION_PREFIX
    } else {
        "s"
    };
    let session = format!("{prefix}{}", hex(&crate::tokens::random_bytes::<12>()));
    let id = ConfigId::parse(&w.id).map_err(|reason| WorkerError::InvalidId {
        id: w.id.clone(),
        reason,
    })?;
    let shared = Arc::new(Shared {
        id,
        session: session.clone(),
        token: token.into_bytes(),
        caps: AdvertisedCapabilities {
            tags: w.tags.clone(),
            country: w.country.clone(),
            region: w.region.clone(),
            ip_type: w.ip_type.clone(),
            ingress: w.ingress.clone(),
            pools: w.pools.clone(),
            fingerprint_profiles,
            capacity: w.capacity,
        },
        capacity: w.capacity,
        active: AtomicU32::new(0),
        applied: AtomicU64::new(0),
        health: HealthRegistry::default(),
        bind_address: w.bind_address.as_deref().and_then(|b| b.parse().ok()),
        is_stopping: std::sync::atomic::AtomicBool::new(false),
        is_handing_over: std::sync::atomic::AtomicBool::new(false),
        links: Mutex::new(HashMap::new()),
        timeouts: Timeouts {
            connect: Duration::from_millis(file.egress.connect_timeout_ms),
            response_header: None,
            idle: Duration::from_millis(file.egress.idle_timeout_ms),
        },
        tls,
        server_name: w.server_name.clone(),
        cores: Mutex::new(Vec::new()),
    });
    let mut receivers = Vec::with_capacity(n);
    {
        let mut cores = shared
            .cores
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for _ in 0..n {
            let (tx, rx) = mpsc::unbounded();
            cores.push(tx);
            receivers.push(Some(rx));
        }
    }
    let receivers = Arc::new(Mutex::new(receivers));
    let controls = w.controls.clone();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGUSR2,
    ])
    .map_err(setup("signal handlers"))?;
    let stopping = shared.clone();
    println!(
        "sortie {} worker {} (session {session})",
        env!("CARGO_PKG_VERSION"),
        w.id
    );
    println!("  cores:     {n}");
    for c in &controls {
        println!(
            "  control:   {}://{c}",
            if shared.tls.is_some() { "tls" } else { "tcp" }
        );
    }
    {
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
    }
    crate::runtime::exit_on_core_panic();
    let pool_limits = crate::egress::PoolLimits {
        idle_timeout: Duration::from_millis(file.egress.pool_idle_timeout_ms),
        ..Default::default()
    };
    let beats = crate::systemd::CoreBeats::new(n);
    let core_beats = beats.clone();
    let handles = crate::runtime::spawn_cores(n, move |ctx| {
        let beats = core_beats.clone();
        let shared = shared.clone();
        let rx = receivers
            .lock()
            .ok()
            .and_then(|mut v| v.get_mut(ctx.index).and_then(Option::take));
        let resolver = resolver.clone();
        let egress_tls = egress_tls.clone();
        let controls = controls.clone();
        async move {
            monoio::spawn(beats.run(ctx.index));
            let egress = Rc::new(Egress::with_pool_limits(
                Resolver::new(resolver),
                &egress_tls,
                pool_limits,
            ));
            for (i, addr) in controls.iter().enumerate() {
                if i % ctx.count == ctx.index {
                    monoio::spawn(supervise(shared.clone(), egress.clone(), addr.clone()));
                }
            }
            if let Some(mut rx) = rx {
                while let Some(open) = rx.next().await {
                    monoio::spawn(open_lane(shared.clone(), egress.clone(), open));
                }
            }
        }
    })
    .map_err(setup("core threads"))?;
    if let Some(p) = predecessor {
        take_over(p, &stopping, &w.controls)?;
    }
    crate::systemd::ready("dialling its controls");
    let watchdog = crate::systemd::Watchdog::start(beats);
    let (handing, closing) = (stopping.clone(), signals.handle());
    if let Err(e) = crate::upgrade::offer_worker(&start.config_path, &session, move |_| {
        handing.is_handing_over.store(true, Ordering::Relaxed);
        closing.close();
    }) {
        tracing::warn!(error = %e, "binary upgrade: no hand-over socket; this worker cannot hand over");
    }
    for signal in signals.forever() {
        if signal != signal_hook::consts::SIGUSR2 {
            break;
        }
        if let Err(e) = crate::upgrade::spawn_successor() {
            tracing::error!(error = %e, "binary upgrade: cannot start the successor");
        }
    }
    if let Some(w) = watchdog {
        w.stop();
    }
    // A GoAway may cross an assignment already on its way: the wait for the last one starts
    // after a quiet moment (a heartbeat's worth on a stop; longer on a hand-over, where the
    // controls switch to the successor's lanes as each hears the GoAway and an assignment that
    // crossed it is still served here).
    let quiet = if stopping.is_handing_over.load(Ordering::Relaxed) {
        tracing::info!("handed over: finishing the assignments in flight");
        HANDOVER_QUIET
    } else {
        crate::systemd::stopping();
        // Graceful stop: every lane says GoAway within a heartbeat, assignments in flight
        // finish (within `STOP_GRACE`), then the process exits and its lanes close.
        tracing::info!("stopping: no new assignments, finishing the ones in flight");
        stopping.is_stopping.store(true, Ordering::Relaxed);
        STOP_QUIET
    };
    let deadline = Instant::now() + STOP_GRACE;
    std::thread::sleep(quiet);
    while stopping.active.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
        std::thread::park_timeout(Duration::from_millis(20));
    }
    drop(handles);
    Ok(())
}

/// How long a stopping worker waits after its `GoAway` before an idle moment counts as the end.
const STOP_QUIET: Duration = Duration::from_millis(300);

/// How long a worker that handed over keeps its lanes after its `GoAway`, for assignments a
/// control sent before it heard it.
pub const HANDOVER_QUIET: Duration = Duration::from_millis(500);

/// The successor's side: waits until every lane to every control is admitted (as a standby
/// of the predecessor's session), then tells the predecessor to step back.
fn take_over(
    p: crate::upgrade::WorkerSuccessor,
    shared: &Shared,
    controls: &[String],
) -> Result<(), WorkerError> {
    let started = Instant::now();
    while !shared.is_fully_connected(controls) {
        if started.elapsed() > UPGRADE_READY_WAIT {
            return Err(WorkerError::UpgradeNotReady);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    tracing::info!(
        predecessor = %p.predecessor_session,
        waited_ms = started.elapsed().as_millis() as u64,
        "binary upgrade: every lane admitted; the running worker steps back"
    );
    Ok(p.ready()?)
}

/// How long a stopping worker lets its assignments in flight run.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A delay of `base` ± 50%, from fresh randomness.
fn jitter(base: Duration) -> Duration {
    let r = u64::from(u16::from_be_bytes(crate::tokens::random_bytes::<2>()));
    let ms = base.as_millis() as u64;
    Duration::from_millis(ms / 2 + ms * r / 65_535)
}

/// Keeps one control's lanes up: lane 0 here, the others on the worker's cores; when any lane
/// ends, all are stopped and the set reconnects after a backoff.
async fn supervise(shared: Arc<Shared>, egress: Rc<Egress>, addr: String) {
    let mut backoff = BACKOFF_MIN;
    loop {
        // A new session starts without configuration: the control pushes its current one.
        let config = ControlConfig::default();
        let (cores_tx, cores_rx) = oneshot::channel::<u16>();
        let (stop0_tx, stop0_rx) = oneshot::channel();
        let (end0_tx, end0_rx) = oneshot::channel();
        let (away_tx, away_rx) = oneshot::channel();
        monoio::spawn(run_lane(
            shared.clone(),
            egress.clone(),
            addr.clone(),
            config.clone(),
            0,
            0,
            stop0_rx,
            end0_tx,
            Some(cores_tx),
            Some(away_tx),
        ));
        let mut stops = vec![stop0_tx];
        let mut ends = vec![end0_rx];
        let lanes = cores_rx.await.ok();
        if let Some(lanes) = lanes {
            let cores = shared.cores.lock().map(|c| c.clone()).unwrap_or_default();
            for lane in 1..lanes {
                let (stop_tx, stop_rx) = oneshot::channel();
                let (end_tx, end_rx) = oneshot::channel();
                let open = OpenLane {
                    addr: addr.clone(),
                    config: config.clone(),
                    lane,
                    lanes,
                    stop: stop_rx,
                    result: end_tx,
                };
                if let Some(c) = cores.get(usize::from(lane) % cores.len().max(1)) {
                    let _ = c.unbounded_send(open);
                }
                stops.push(stop_tx);
                ends.push(end_rx);
            }
        }
        // The first lane to end ends them all; a control going away (handing over to its
        // successor) leaves them to finish what they carry and dials again at once.
        let any_end = futures_util::future::select_all(ends);
        let (first, rest) = match futures_util::future::select(any_end, away_rx).await {
            futures_util::future::Either::Left(((first, _, rest), _)) => (first, rest),
            futures_util::future::Either::Right((Ok(()), any_end)) => {
                tracing::info!(control = %addr, "control going away: dialling it again while these lanes finish");
                let remaining = any_end.into_inner();
                monoio::spawn(async move {
                    // The stop senders live until every lane of the set ended by itself.
                    let _stops = stops;
                    futures_util::future::join_all(remaining).await;
                });
                backoff = BACKOFF_MIN;
                continue;
            }
            futures_util::future::Either::Right((Err(_), any_end)) => {
                let (first, _, rest) = any_end.await;
                (first, rest)
            }
        };
        for s in stops {
            let _ = s.send(());
        }
        for r in rest {
            let _ = r.await;
        }
        let was_up = matches!(first, Ok(LaneEnd::Lost));
        if was_up {
            backoff = BACKOFF_MIN;
        }
        if let Ok(LaneEnd::Failed(reason)) = &first {
            tracing::info!(control = %addr, %reason, "bus lane not admitted; retrying");
        } else {
            tracing::info!(control = %addr, "bus lanes lost; reconnecting");
        }
        monoio::time::sleep(jitter(backoff)).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

async fn open_lane(shared: Arc<Shared>, egress: Rc<Egress>, open: OpenLane) {
    run_lane(
        shared,
        egress,
        open.addr,
        open.config,
        open.lane,
        open.lanes,
        open.stop,
        open.result,
        None,
        None,
    )
    .await;
}

/// One stream an assignment opened on this worker.
struct WStream {
    /// Request body pieces (or tunnel bytes) from the control, with their `end` flag.
    body: Queue<(Vec<u8>, bool)>,
    /// Bytes the worker may still send on the stream (the control's window and credit).
    credit: Cell<u64>,
    credit_ready: Notify,
    cancel: Notify,
    is_cancelled: Cell<bool>,
}

/// The worker's side of one lane.
struct WLane {
    /// The control as this lane reached it: the host of the `controls` entry and the address
    /// connected to. Receipt bodies are fetched from there only.
    control_host: String,
    control_ip: Option<IpAddr>,
    /// What the control's welcome announced (version 3 and later, decision 068): the port of
    /// its receipt URLs and the forward proxy's idle limit.
    settings: Option<sortie_core::bus::LaneSettings>,
    /// The protocol version the control chose.
    version: u16,
    out: Outbox,
    proto: RefCell<WorkerLane>,
    streams: RefCell<sortie_core::FastMap<StreamId, Rc<WStream>>>,
    /// Tasks that finished a stream and wait for the next ([`run_streams`]), at most
    /// [`MAX_IDLE_RUNNERS`].
    idle_runners: RefCell<Vec<Rc<Runner>>>,
    /// Set when the lane ended: runners finish their stream and go.
    is_closed: Cell<bool>,
}

/// Idle stream runners one lane keeps: each holds a stream's state (a few KiB) while it waits,
/// so a burst of concurrent streams leaves at most this many behind.
const MAX_IDLE_RUNNERS: usize = 64;

/// One assignment and what serving it needs.
struct StreamJob {
    shared: Arc<Shared>,
    egress: Rc<Egress>,
    config: Option<Arc<Applied>>,
    s: Rc<WStream>,
    a: Box<Assign>,
}

/// The hand-over point of an idle [`run_streams`] task: the next job, or none when the lane
/// ended.
#[derive(Default)]
struct Runner {
    job: RefCell<Option<StreamJob>>,
    ready: Notify,
}

/// Hands an assignment to an idle runner of the lane, or to a new one ([`run_streams`]).
fn start_stream(
    wl: &Rc<WLane>,
    shared: &Arc<Shared>,
    egress: &Rc<Egress>,
    config: Option<Arc<Applied>>,
    a: Box<Assign>,
) {
    let s = Rc::new(WStream {
        body: Queue::default(),
        credit: Cell::new(u64::from(a.window)),
        credit_ready: Notify::default(),
        cancel: Notify::default(),
        is_cancelled: Cell::new(false),
    });
    wl.streams.borrow_mut().insert(a.stream, s.clone());
    let job = StreamJob {
        shared: shared.clone(),
        egress: egress.clone(),
        config,
        s,
        a,
    };
    let idle = wl.idle_runners.borrow_mut().pop();
    match idle {
        Some(runner) => {
            *runner.job.borrow_mut() = Some(job);
            runner.ready.notify();
        }
        None => {
            let wl = wl.clone();
            // The runner's state (a few KiB) is built in its own box, where it runs: the task
            // holds only the arguments and the box, so that spawning it copies a few words
            // instead of the whole state.
            monoio::spawn(
                async move { crate::runtime::boxed_in_place(|| run_streams(wl, job)).await },
            );
        }
    }
}

/// Serves `first`, then the lane's next assignments while it is idle among
/// [`WLane::idle_runners`]: each stream's state is built in this task's own memory where the
/// stream before ran, instead of a new task (and its allocation, from the allocator's slow path
/// at this size) per stream.
async fn run_streams(wl: Rc<WLane>, first: StreamJob) {
    let runner = Rc::new(Runner::default());
    let mut next = Some(first);
    while let Some(StreamJob {
        shared,
        egress,
        config,
        s,
        a,
    }) = next.take()
    {
        {
            let serve = std::pin::pin!(serve_stream(shared, egress, config, wl.clone(), s, a));
            serve.await;
        }
        if wl.is_closed.get() || wl.idle_runners.borrow().len() >= MAX_IDLE_RUNNERS {
            return;
        }
        wl.idle_runners.borrow_mut().push(runner.clone());
        runner.ready.wait().await;
        next = runner.job.borrow_mut().take();
    }
}

impl WLane {
    /// Queues a frame. A frame that cannot be encoded (a field over the codec's bounds) is not
    /// sent and the caller is told, so that one stream fails rather than the lane.
    fn send(&self, frame: &Frame) -> Result<(), EncodeError> {
        if let Err(e) = self.out.push(frame) {
            // A stream error carrying an oversized message or details still ends its stream,
            // with the code alone.
            if let Frame::StreamError(se) = frame {
                let bare = Frame::StreamError(StreamError {
                    stream: se.stream,
                    code: se.code.clone(),
                    message: "error details exceed the bus limits".into(),
                    timeout_type: se.timeout_type.clone(),
                    upstream_status: se.upstream_status,
                    details: Vec::new(),
                });
                self.send(&bare)?;
            }
            return Err(e);
        }
        self.proto.borrow_mut().sent(frame);
        if let Some(id) = frame.stream() {
            let ends = matches!(
                frame,
                Frame::Refuse { .. } | Frame::StreamError(_) | Frame::Data { end: true, .. }
            );
            self.forget_if_ended(id, ends);
        }
        Ok(())
    }

    /// Queues a `Data` frame of `bytes` (at most `MAX_DATA_BYTES`), written from the borrowed
    /// bytes: [`WLane::post`] of `Frame::Data` without a copy of them into the frame first.
    fn post_data(&self, stream: StreamId, bytes: &[u8], end: bool) {
        if let Err(e) = self
            .out
            .push_with(|out| sortie_core::bus::encode_data(stream, bytes, end, out))
        {
            tracing::error!(frame = "data", error = %e, "bus frame could not be encoded");
            return;
        }
        self.proto.borrow_mut().sent_data(stream, bytes.len(), end);
        self.forget_if_ended(stream, end);
    }

    /// Queues a frame whose fields are bounded by construction (heartbeats, credit, accept,
    /// data within `MAX_DATA_BYTES`, ...), logging the impossible failure.
    fn post(&self, frame: &Frame) {
        if let Err(e) = self.send(frame) {
            tracing::error!(frame = frame.name(), error = %e, "bus frame could not be encoded");
        }
    }

    /// Forgets stream `id` after a frame that `ends` it was sent.
    fn forget_if_ended(&self, id: StreamId, ends: bool) {
        // A tunnel or streamed body lives on past the worker's end while the control's
        // direction is open.
        if ends && !self.proto.borrow().has_stream(id) {
            self.streams.borrow_mut().remove(&id);
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_lane(
    shared: Arc<Shared>,
    egress: Rc<Egress>,
    addr: String,
    config: ControlConfig,
    lane: u16,
    lanes: u16,
    stop: oneshot::Receiver<()>,
    end: oneshot::Sender<LaneEnd>,
    learn_cores: Option<oneshot::Sender<u16>>,
    going_away: Option<oneshot::Sender<()>>,
) {
    let r = lane_session(
        shared,
        egress,
        &addr,
        config,
        lane,
        lanes,
        stop,
        (learn_cores, going_away),
    )
    .await;
    let _ = end.send(r);
}

async fn connect(
    shared: &Shared,
    addr: &str,
) -> Result<(Conn<monoio::net::TcpStream>, Option<IpAddr>), LaneSetupError> {
    let tcp = monoio::net::TcpStream::connect(addr)
        .await
        .map_err(|source| LaneSetupError::Connect {
            addr: addr.to_string(),
            source,
        })?;
    let peer = tcp.peer_addr().ok().map(|a| a.ip());
    connect_tls(shared, addr, tcp).await.map(|c| (c, peer))
}

async fn connect_tls(
    shared: &Shared,
    addr: &str,
    tcp: monoio::net::TcpStream,
) -> Result<Conn<monoio::net::TcpStream>, LaneSetupError> {
    match &shared.tls {
        None => Ok(Conn::plain(tcp)),
        Some(cfg) => {
            let host = shared.server_name.clone().unwrap_or_else(|| {
                addr.rsplit_once(':')
                    .map_or(addr, |(h, _)| h)
                    .trim_matches(['[', ']'])
                    .to_string()
            });
            let name = rustls::pki_types::ServerName::try_from(host)?;
            Conn::connect_tls(tcp, cfg.clone(), name)
                .await
                .map_err(|source| LaneSetupError::Tls {
                    addr: addr.to_string(),
                    source,
                })
        }
    }
}

/// The control's answer to a hello: its welcome, or why there is none.
fn welcome(answer: Option<Frame>) -> Result<sortie_core::bus::Welcome, LaneSetupError> {
    match answer {
        Some(Frame::Welcome(w)) => Ok(w),
        Some(Frame::Reject(r)) => Err(LaneSetupError::Rejected {
            reason: r.reason.to_string(),
            message: r.message,
        }),
        Some(f) => Err(LaneSetupError::Unexpected(f.name())),
        None => Err(LaneSetupError::Closed),
    }
}

#[allow(clippy::too_many_arguments)]
async fn lane_session(
    shared: Arc<Shared>,
    egress: Rc<Egress>,
    addr: &str,
    config: ControlConfig,
    lane: u16,
    lanes: u16,
    mut stop: oneshot::Receiver<()>,
    (learn_cores, mut going_away): (Option<oneshot::Sender<u16>>, Option<oneshot::Sender<()>>),
) -> LaneEnd {
    let setup = async {
        let (mut conn, peer) = connect(&shared, addr).await?;
        let hello = Hello {
            version_min: PROTOCOL_VERSION_MIN,
            version_max: PROTOCOL_VERSION,
            worker_id: shared.id.as_str().to_owned(),
            session: shared.session.clone(),
            token: shared.token.clone(),
            lane,
            // Lane 0 says 0: it learns the control's core count from the welcome.
            lanes,
            capabilities: shared.caps.clone(),
        };
        let mut buf = FrameBuf::new();
        let mut out = Vec::new();
        sortie_core::bus::encode(&Frame::Hello(Box::new(hello)), &mut out)?;
        let (r, _) = conn.write_all(out).await;
        r.map_err(LaneSetupError::Write)?;
        let answer = read_frame(&mut conn, &mut buf).await;
        welcome(answer.map_err(LaneSetupError::Read)?).map(|w| (conn, buf, w, peer))
    };
    let (conn, buf, welcome, peer) = match monoio::time::timeout(CONNECT_TIMEOUT, setup).await {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => return LaneEnd::Failed(e),
        Err(_) => return LaneEnd::Failed(LaneSetupError::TimedOut),
    };
    let _counted = LinkCount::up(&shared, addr, (lane == 0).then_some(welcome.cores));
    let mut proto = WorkerLane::new();
    let _ = proto.receive(&Frame::Welcome(welcome.clone()));
    let wl = Rc::new(WLane {
        control_host: addr
            .rsplit_once(':')
            .map_or(addr, |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase(),
        control_ip: peer,
        settings: welcome.settings,
        version: welcome.version,
        out: Outbox::default(),
        proto: RefCell::new(proto),
        streams: RefCell::new(sortie_core::FastMap::default()),
        idle_runners: RefCell::new(Vec::new()),
        is_closed: Cell::new(false),
    });
    conn.keep_alive(Duration::from_millis(u64::from(welcome.heartbeat_ms)));
    // Version 4: only lane 0 carries heartbeats; the kernel keeps the others (decision 118).
    let beats = sortie_core::bus::lane_heartbeats(welcome.version, lane);
    let (mut reader, writer) = conn.split();
    let w2 = wl.clone();
    monoio::spawn(async move { w2.out.run(writer).await });
    let hb = Rc::new(Cell::new(true));
    {
        let (wl, hb, shared) = (wl.clone(), hb.clone(), shared.clone());
        let every = Duration::from_millis(u64::from(welcome.heartbeat_ms.max(100)));
        monoio::spawn(async move {
            let mut has_said_goaway = false;
            while hb.get() {
                if beats {
                    wl.post(&Frame::Heartbeat(Heartbeat {
                        active: shared.active.load(Ordering::Relaxed),
                        capacity: shared.capacity,
                    }));
                }
                let tick = every.min(Duration::from_millis(100));
                let next = Instant::now() + every;
                while hb.get() && Instant::now() < next {
                    if !has_said_goaway
                        && (shared.is_stopping.load(Ordering::Relaxed)
                            || shared.is_handing_over.load(Ordering::Relaxed))
                    {
                        has_said_goaway = true;
                        wl.post(&Frame::GoAway {
                            reason: "worker stopping".into(),
                        });
                    }
                    monoio::time::sleep(tick).await;
                }
            }
        });
    }
    let mut learn_cores = learn_cores;
    let mut buf = buf;
    let end = loop {
        let next = match buffered_frame(&mut buf) {
            Ok(None) => monoio::select! {
                r = read_frame(&mut reader, &mut buf) => r,
                _ = &mut stop => break LaneEnd::Lost,
            },
            buffered => buffered,
        };
        let frame = match next {
            Ok(Some(f)) => f,
            Ok(None) => break LaneEnd::Lost,
            Err(e) => {
                tracing::warn!(control = %addr, error = %e, "bus frame error from the control");
                break LaneEnd::Lost;
            }
        };
        match wl.proto.borrow_mut().receive(&frame) {
            Ok(Verdict::Deliver) => {}
            Ok(Verdict::Ignore) => continue,
            Err(v) => {
                tracing::warn!(control = %addr, violation = %v, "bus protocol error from the control");
                break LaneEnd::Lost;
            }
        }
        match frame {
            Frame::ConfigPush(p) => {
                let mut bytes = p.payload;
                match sortie_core::snapshot::decode_snapshot(&mut bytes) {
                    Ok(s) => {
                        config.store(Some(Arc::new(Applied::of(&s, &shared.health))));
                        shared.applied.fetch_max(p.version, Ordering::Relaxed);
                        wl.post(&Frame::ConfigApplied { version: p.version });
                        tracing::info!(control = %addr, version = p.version, "configuration applied");
                    }
                    Err(e) => {
                        config.store(None);
                        tracing::warn!(control = %addr, error = %e, "configuration push does not validate; refusing this control's assignments until a valid one")
                    }
                }
                if let Some(tx) = learn_cores.take() {
                    let _ = tx.send(welcome.cores.max(1));
                }
            }
            Frame::Assign(a) => start_stream(&wl, &shared, &egress, config.load_full(), a),
            Frame::Data { stream, bytes, end } => {
                if let Some(s) = wl.streams.borrow().get(&stream) {
                    s.body.push((bytes, end));
                }
                // The control's end may be the last of a stream the worker already ended
                // (a tunnel closed by the destination first).
                if end && !wl.proto.borrow().has_stream(stream) {
                    wl.streams.borrow_mut().remove(&stream);
                }
            }
            Frame::Credit { stream, bytes } => {
                if let Some(s) = wl.streams.borrow().get(&stream) {
                    s.credit
                        .set(s.credit.get().saturating_add(u64::from(bytes)));
                    s.credit_ready.notify();
                }
            }
            Frame::Cancel { stream } => {
                if let Some(s) = wl.streams.borrow_mut().remove(&stream) {
                    s.is_cancelled.set(true);
                    s.cancel.notify();
                }
            }
            Frame::GoAway { reason } => {
                tracing::info!(control = %addr, %reason, "control going away");
                // A control hands over to its successor (decision 115): the supervisor dials
                // a new lane set now, and this one serves on until the control closes it.
                if let Some(tx) = going_away.take() {
                    let _ = tx.send(());
                }
            }
            _ => {}
        }
    };
    hb.set(false);
    wl.out.close();
    // Whatever runs on this lane is abandoned: its upstream requests are dropped.
    for (_, s) in wl.streams.borrow_mut().drain() {
        s.is_cancelled.set(true);
        s.cancel.notify();
    }
    // Idle runners go (no job); busy ones go after their stream.
    wl.is_closed.set(true);
    for runner in std::mem::take(&mut *wl.idle_runners.borrow_mut()) {
        runner.ready.notify();
    }
    end
}

/// One admitted lane in [`Shared::links`], counted while it lives.
struct LinkCount<'a> {
    shared: &'a Shared,
    addr: String,
}

impl<'a> LinkCount<'a> {
    fn up(shared: &'a Shared, addr: &str, cores: Option<u16>) -> LinkCount<'a> {
        if let Ok(mut links) = shared.links.lock() {
            let e = links.entry(addr.to_owned()).or_insert((0, 0));
            e.0 = e.0.saturating_add(1);
            if let Some(c) = cores {
                e.1 = c.max(1);
            }
        }
        LinkCount {
            shared,
            addr: addr.to_owned(),
        }
    }
}

impl Drop for LinkCount<'_> {
    fn drop(&mut self) {
        if let Ok(mut links) = self.shared.links.lock() {
            if let Some(e) = links.get_mut(&self.addr) {
                e.0 = e.0.saturating_sub(1);
            }
        }
    }
}

impl Shared {
    /// Whether every control in `controls` admitted all its lanes.
    fn is_fully_connected(&self, controls: &[String]) -> bool {
        let Ok(links) = self.links.lock() else {
            return false;
        };
        controls.iter().all(|c| {
            links
                .get(c)
                .is_some_and(|&(up, wanted)| wanted > 0 && up >= wanted)
        })
    }
}

/// Runs one assignment: accept or refuse, collect the inline body, perform the exchange, send
/// the head and the body within the window, or one stream error.
async fn serve_stream(
    shared: Arc<Shared>,
    egress: Rc<Egress>,
    config: Option<Arc<Applied>>,
    wl: Rc<WLane>,
    s: Rc<WStream>,
    a: Box<Assign>,
) {
    let stream = a.stream;
    let taken = shared
        .active
        .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
            (n < shared.capacity).then_some(n + 1)
        })
        .is_ok();
    if !taken || shared.is_stopping.load(Ordering::Relaxed) {
        if taken {
            shared.active.fetch_sub(1, Ordering::AcqRel);
        }
        let reason = if taken { "draining" } else { "capacity" };
        wl.post(&Frame::Refuse {
            stream,
            reason: reason.into(),
        });
        return;
    }
    let _release = Release(shared.clone());
    let Some(config) = config else {
        wl.post(&Frame::Refuse {
            stream,
            reason: "config".into(),
        });
        return;
    };
    // The pool must be one of the applied configuration (a push may be on its way).
    let Some(proxy) = config.pools.get(a.pool()) else {
        wl.post(&Frame::Refuse {
            stream,
            reason: "pool".into(),
        });
        return;
    };
    let session = a.provider_session().and_then(ProviderSession::from_hex);
    let via = proxy
        .as_ref()
        .map(|p| p.route_rendered(a.proxy_username(), session));
    wl.post(&Frame::Accept { stream });
    // Pinned where it is built and raced by reference: the exchange's state is not copied, and
    // it is polled before the cancel (no random pick of a branch as `select!` makes).
    let work = std::pin::pin!(async {
        match a.ingress {
            // Boxed (once per tunnel): inline, the tunnel's state would be part of every
            // exchange's task, and of what each spawn copies into it.
            2 => {
                Box::pin(tunnel(
                    &shared,
                    &egress,
                    &wl,
                    &s,
                    &a,
                    &config.policy,
                    via.as_ref(),
                ))
                .await
            }
            _ => exchange(&shared, &egress, &wl, &s, &a, &config.policy, via.as_ref()).await,
        }
    });
    let r = match crate::http::race(work, s.cancel.wait()).await {
        crate::http::Either::Left(r) => Some(r),
        crate::http::Either::Right(()) => None,
    };
    match r {
        None => {
            if s.is_cancelled.get() {
                wl.post(&Frame::StreamError(to_stream_error(
                    stream,
                    &ApiError::new(ErrorCode::Cancelled, "cancelled by the control"),
                )));
            }
        }
        Some(Ok(())) => {}
        Some(Err(e)) => wl.post(&Frame::StreamError(to_stream_error(stream, &e))),
    }
}

struct Release(Arc<Shared>);

impl Drop for Release {
    fn drop(&mut self) {
        let _ = self
            .0
            .active
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

/// `protocol_error` for a response head the bus cannot carry (the destination's fault).
fn unsendable_head(e: EncodeError) -> ApiError {
    ApiError::new(
        ErrorCode::ProtocolError,
        format!("the destination's response head exceeds the worker bus limits ({e})"),
    )
    .with_detail("side", "upstream")
    .with_detail("reason", "head_exceeds_bus_limits")
}

fn to_stream_error(stream: StreamId, e: &ApiError) -> StreamError {
    StreamError {
        stream,
        code: e.code.as_str().to_string(),
        message: e.message.clone(),
        timeout_type: e.timeout_type.map(|t| t.as_str().to_string()),
        upstream_status: e.upstream_status,
        details: e.details.clone(),
    }
}

async fn exchange(
    shared: &Shared,
    egress: &Egress,
    wl: &WLane,
    s: &WStream,
    a: &Assign,
    policy: &DestinationPolicy,
    via: Option<&ProxyRoute>,
) -> Result<(), ApiError> {
    // Deadlines only, so the coarse clock (decision 121).
    let started = crate::timer::now();
    let deadline = started + Duration::from_millis(u64::from(a.deadline_ms));
    let invalid = |m: &str| ApiError::new(ErrorCode::ExecutorInternalError, m.to_string());
    let method = Method::parse(a.method()).ok_or_else(|| invalid("assignment: unknown method"))?;
    // A control of version 6 sends the URL as parts it parsed, checked as they were decoded
    // (decision 131); an older one sends text.
    let parsed;
    let url = match a.url() {
        AssignUrl::Parts(t) => t,
        AssignUrl::Text(text) => {
            parsed = parse_target_url(text).map_err(|_| invalid("assignment: invalid url"))?;
            &parsed
        }
    };
    let mut headers: Vec<(&str, &[u8])> = Vec::with_capacity(a.headers.len());
    for (n, v) in &a.headers {
        let n = std::str::from_utf8(n).map_err(|_| invalid("assignment: header name"))?;
        headers.push((n, v));
    }
    let is_proxy = a.ingress == 1;
    let tenant = crate::dns::tenant_of_id(a.deployment_id());
    // The control routes a named profile only to a worker advertising it, and this worker
    // advertises only what it verified; a name it did not verify is refused, never sent with
    // an ordinary ClientHello.
    let fingerprint = match a.fingerprint_profile() {
        None => None,
        Some(name) => Some(crate::egress::fingerprint::verified(name).ok_or_else(|| {
            ApiError::new(
                ErrorCode::UnsupportedFingerprint,
                format!("worker {} did not verify profile {name}", shared.id),
            )
        })?),
    };
    let worker_id = shared.id.clone();
    if let BodySource::Receipt {
        url: receipt_url,
        len,
    } = &a.body
    {
        // A receipt body is fetched from the control as it is sent on (decision 065).
        let mut src =
            fetch_receipt(shared, egress, wl, receipt_url, *len, deadline, tenant).await?;
        let req = StreamRequest {
            method,
            url,
            headers: &headers,
            deadline,
            timeouts: shared.timeouts,
            policy,
            worker_id: &worker_id,
            bind_address: shared.bind_address,
            is_replayable: false,
            via,
            tenant,
            may_splice: false,
        };
        let mut resp = egress
            .open_fingerprinted(&req, fingerprint, &mut src)
            .await?;
        resp.body.set_deadline(deadline);
        return send_response(wl, s, a, resp).await;
    }
    let mut src = BusBody {
        wl,
        s,
        stream: a.stream,
        length: match a.body {
            BodySource::Empty => BodyLength::None,
            BodySource::Inline { len } => BodyLength::Known(len),
            BodySource::Stream { len: Some(n) } => BodyLength::Known(n),
            BodySource::Stream { len: None } => BodyLength::Chunked,
            BodySource::Receipt { .. } | BodySource::Tunnel => {
                return Err(invalid("assignment: this body kind is not supported here"))
            }
        },
        is_done: matches!(a.body, BodySource::Empty),
        is_streamed: matches!(a.body, BodySource::Stream { .. }),
    };
    let req = StreamRequest {
        method,
        url,
        headers: &headers,
        deadline,
        timeouts: shared.timeouts,
        policy,
        worker_id: &worker_id,
        bind_address: shared.bind_address,
        is_replayable: a.is_replayable,
        via,
        tenant,
        may_splice: false,
    };
    // A relayed request runs under the control's forward-proxy idle limit, as a local relay
    // does, when the control announced it (decision 068); otherwise the worker's own.
    let timeouts = match wl.settings.filter(|s| is_proxy && s.proxy_idle_ms > 0) {
        Some(s) => Timeouts {
            idle: Duration::from_millis(u64::from(s.proxy_idle_ms)),
            ..shared.timeouts
        },
        None => shared.timeouts,
    };
    let req = StreamRequest { timeouts, ..req };
    let mut resp = if src.is_streamed {
        egress
            .open_fingerprinted(&req, fingerprint, &mut src)
            .await?
    } else {
        // The request API's inline body arrives whole before the exchange starts (it is
        // bounded by the control's inline limit), so a replayable request can be re-sent.
        let mut whole = Vec::new();
        while let Some(c) = src.next_chunk().await? {
            whole.extend_from_slice(&c);
        }
        egress
            .open_fingerprinted(&req, fingerprint, &mut Bytes::from(whole))
            .await?
    };
    if is_proxy {
        // A relayed body's deadline is its idle limit alone, as for the local forward proxy.
        resp.body
            .set_deadline(started + Duration::from_secs(365 * 24 * 3600));
    } else {
        resp.body.set_deadline(deadline);
    }
    send_response(wl, s, a, resp).await
}

/// Sends the response head, then the body within the control's credit, then its end.
async fn send_response(
    wl: &WLane,
    s: &WStream,
    a: &Assign,
    mut resp: crate::egress::StreamedResponse,
) -> Result<(), ApiError> {
    // A destination may answer with headers beyond the bus's bounds (too many fields, a name
    // over 256 bytes): that request fails, the lane and its other streams go on.
    let early = resp.body.take_early();
    if resp.body.is_end() && wl.version >= RESPONSE_FRAME_VERSION && a.ingress != 2 {
        // The whole body came with the head: within the credit (and so the frame's bound),
        // head and body go as one `Response` frame (decision 123).
        let whole = early.as_deref().unwrap_or_default();
        let len = whole.len() as u64;
        if len > a.max_response_bytes {
            return Err(body_too_large());
        }
        if len <= s.credit.get() && whole.len() <= MAX_DATA_BYTES {
            wl.out
                .push_with(|out| {
                    if wl.version >= FIELD_BLOCK_VERSION {
                        // The parsed head's fields as one block (decision 131).
                        let (buf, spans) = resp.headers.block();
                        sortie_core::bus::encode_response_block(
                            a.stream,
                            resp.status,
                            buf,
                            spans,
                            whole,
                            out,
                        )
                    } else {
                        sortie_core::bus::encode_response_of(
                            a.stream,
                            resp.status,
                            resp.headers.iter(),
                            whole,
                            out,
                        )
                    }
                })
                .map_err(unsendable_head)?;
            wl.proto.borrow_mut().sent_data(a.stream, whole.len(), true);
            wl.forget_if_ended(a.stream, true);
            return Ok(());
        }
    }
    // Encoded from the response's own header slices, without a copy of each field; a head
    // changes nothing the lane's protocol state tracks (`WLane::send` would only encode it).
    wl.out
        .push_with(|out| {
            sortie_core::bus::encode_response_head_of(
                a.stream,
                resp.status,
                resp.headers.iter(),
                out,
            )
        })
        .map_err(unsendable_head)?;
    let mut sent: u64 = 0;
    let mut count = |n: usize| {
        sent += n as u64;
        if sent > a.max_response_bytes {
            return Err(body_too_large());
        }
        Ok(())
    };
    // The piece that ends the body carries the end itself: a body read in one piece (most
    // small answers) is one `Data` frame, and the control sends no `Credit` for it. The bytes
    // that came with the head go as they are, without a copy into `piece`.
    if let Some(early) = early {
        count(early.len())?;
        let is_last = resp.body.is_end();
        send_within_credit(wl, s, a.stream, &early, is_last).await;
        if is_last {
            return Ok(());
        }
    }
    let mut piece = Vec::new();
    loop {
        piece.clear();
        let more = resp.body.read_into(&mut piece).await?;
        if !more {
            break;
        }
        count(piece.len())?;
        let is_last = resp.body.is_end();
        send_within_credit(wl, s, a.stream, &piece, is_last).await;
        if is_last {
            return Ok(());
        }
    }
    wl.post_data(a.stream, &[], true);
    Ok(())
}

fn body_too_large() -> ApiError {
    ApiError::new(ErrorCode::BodyTooLarge, "response body exceeds the limit")
        .with_detail("direction", "response")
}

/// Sends `bytes` in `Data` frames within the stream's credit, waiting for `Credit` when it runs
/// out (a cancel or a lost lane ends the waiting task from outside); with `end`, the last frame
/// ends the stream.
async fn send_within_credit(wl: &WLane, s: &WStream, stream: StreamId, bytes: &[u8], end: bool) {
    let mut at = 0;
    while at < bytes.len() {
        while s.credit.get() == 0 {
            s.credit_ready.wait().await;
        }
        let n = (bytes.len() - at)
            .min(MAX_DATA_BYTES)
            .min(usize::try_from(s.credit.get()).unwrap_or(usize::MAX));
        let Some(piece) = bytes.get(at..at + n) else {
            return;
        };
        wl.out.room().await;
        wl.post_data(stream, piece, end && at + n == bytes.len());
        s.credit.set(s.credit.get() - n as u64);
        at += n;
    }
}

/// The request body of an assignment as the egress client reads it: the control's `Data`
/// frames, credited back as they are taken.
struct BusBody<'a> {
    wl: &'a WLane,
    s: &'a WStream,
    stream: StreamId,
    length: BodyLength,
    is_done: bool,
    /// A streamed body (forward proxy) rather than an inline one (request API).
    is_streamed: bool,
}

impl EgressBody for BusBody<'_> {
    fn length(&self) -> BodyLength {
        self.length
    }

    async fn next_chunk(&mut self) -> Result<Option<Bytes>, ApiError> {
        while !self.is_done {
            let (bytes, end) = self.s.body.next().await;
            self.is_done = end;
            if !bytes.is_empty() {
                if self.is_streamed {
                    self.wl.post(&Frame::Credit {
                        stream: self.stream,
                        bytes: bytes.len() as u32,
                    });
                }
                return Ok(Some(Bytes::from(bytes)));
            }
        }
        Ok(None)
    }
}

/// Runs a CONNECT tunnel: dials the destination (directly or through the pool's upstream
/// proxy), answers `200`, then relays bytes both ways until both directions have ended. The
/// control watches the tunnel's idleness and cancels it.
async fn tunnel(
    shared: &Shared,
    egress: &Egress,
    wl: &WLane,
    s: &WStream,
    a: &Assign,
    policy: &DestinationPolicy,
    via: Option<&ProxyRoute>,
) -> Result<(), ApiError> {
    // A tunnel's target is `host:port` text; no control sends it as parts.
    let AssignUrl::Text(target) = a.url() else {
        return Err(ApiError::new(
            ErrorCode::ExecutorInternalError,
            "assignment: a tunnel's target must be host:port text",
        ));
    };
    let (host, port) = sortie_core::proxy::parse_connect_target(target)?;
    let deadline = Instant::now() + Duration::from_millis(u64::from(a.deadline_ms));
    let tenant = crate::dns::tenant_of_id(a.deployment_id());
    let bind = shared.bind_address;
    let limit = shared.timeouts.connect;
    let (upstream, _peer, first_down) = match via {
        Some(route) => {
            egress
                .dial_via(route, &host, port, bind, policy, limit, deadline, tenant)
                .await?
        }
        None => {
            let (tcp, peer) = egress
                .dial(&host, port, bind, policy, limit, deadline, tenant)
                .await?;
            (TunnelStream::Tcp(tcp), peer, Vec::new())
        }
    };
    wl.send(&Frame::ResponseHead(ResponseHead {
        stream: a.stream,
        status: 200,
        headers: HeadFields::default(),
    }))
    .map_err(unsendable_head)?;
    // Through an `https://` upstream proxy the tunnel is the TLS session's plaintext.
    relay_tunnel(Conn::tunnel(upstream), first_down, wl, s, a.stream).await
}

/// Relays an open tunnel's bytes between the destination connection `upstream` and the bus
/// stream `stream` until both directions have ended; the download starts with `first_down`,
/// the destination's bytes that came with an upstream proxy's reply.
async fn relay_tunnel(
    upstream: Conn<monoio::net::TcpStream>,
    first_down: Vec<u8>,
    wl: &WLane,
    s: &WStream,
    stream: StreamId,
) -> Result<(), ApiError> {
    let (mut from_up, to_up) = upstream.split();
    // Destination → control, until the destination half-closes (or closes its TLS session,
    // with or without `close_notify`).
    let download = async {
        if !first_down.is_empty() {
            send_within_credit(wl, s, stream, &first_down, false).await;
        }
        let mut buf = Vec::with_capacity(64 * 1024);
        loop {
            buf.clear();
            match from_up.read(&mut buf).await {
                Ok(0) => {
                    wl.post_data(stream, &[], true);
                    return Ok(());
                }
                Ok(_) => send_within_credit(wl, s, stream, &buf, false).await,
                Err(e) => {
                    return Err(ApiError::new(
                        ErrorCode::UpstreamReset,
                        format!("tunnel destination: {e}"),
                    ))
                }
            }
        }
    };
    // Control → destination, until the client half-closes; then the destination's connection
    // is shut down for writing (after `close_notify` through TLS).
    let upload = async {
        let mut to = to_up;
        loop {
            let (bytes, end) = s.body.next().await;
            let n = bytes.len();
            if n > 0 {
                let (r, _) = to.write_all(bytes).await;
                if let Err(e) = r {
                    return Err(ApiError::new(
                        ErrorCode::UpstreamReset,
                        format!("tunnel destination: {e}"),
                    ));
                }
                wl.post(&Frame::Credit {
                    stream,
                    bytes: n as u32,
                });
            }
            if end {
                // A failed shutdown is the destination's end anyway: nothing more to send.
                let _ = to.close_write().await;
                return Ok(());
            }
        }
    };
    let mut download = std::pin::pin!(download);
    let mut upload = std::pin::pin!(upload);
    monoio::select! {
        d = &mut download => { d?; (&mut upload).await }
        u = &mut upload => { u?; (&mut download).await }
    }
}

/// Opens the receipt body at `url` (the control's signed worker route, a bearer credential:
/// never logged) and returns it as the request body to send on. The control is the
/// operator's own address: the destination policy does not apply to it.
async fn fetch_receipt(
    shared: &Shared,
    egress: &Egress,
    wl: &WLane,
    url: &str,
    len: u64,
    deadline: Instant,
    tenant: crate::dns::Tenant,
) -> Result<ReceiptBody, ApiError> {
    let unavailable = |why: String| ApiError::new(ErrorCode::BodyRefUnavailable, why);
    let target = parse_target_url(url)
        .map_err(|_| unavailable("the receipt URL of the assignment is not valid".into()))?;
    // Only the control this lane dialled serves receipt bodies: the URL must name its host
    // (the `controls` entry or the address connected to), and the connection goes to that
    // address alone, whatever the name resolves to now.
    let host = target.host_str().to_string();
    let is_control =
        host == wl.control_host || wl.control_ip.is_some_and(|ip| host == ip.to_string());
    let Some(ip) = wl.control_ip.filter(|_| is_control) else {
        return Err(unavailable(
            "the receipt URL does not name the control this worker dialled".into(),
        ));
    };
    // The port too, when the control announced it (decision 068); a version 2 control does
    // not, and only its host is checked.
    if let Some(s) = wl.settings {
        if target.port != s.receipt_port {
            return Err(unavailable(format!(
                "the receipt URL's port is not the control's receipt port {}",
                s.receipt_port
            )));
        }
    }
    let policy = DestinationPolicy::new(
        std::iter::once(format!("{ip}/{}", if ip.is_ipv4() { 32 } else { 128 }))
            .filter_map(|c| c.parse().ok())
            .collect(),
        Vec::new(),
    );
    let worker_id = shared.id.clone();
    let req = StreamRequest {
        method: Method::Get,
        url: &target,
        headers: &[],
        deadline,
        timeouts: shared.timeouts,
        policy: &policy,
        worker_id: &worker_id,
        bind_address: None,
        is_replayable: true,
        via: None,
        tenant,
        may_splice: false,
    };
    // The connection goes to the address this lane dialled; the URL's name stays in `Host`
    // and SNI, and is not resolved again.
    let mut resp = egress
        .open_at(&req, ip, &mut Bytes::new())
        .await
        .map_err(|e| {
            unavailable(format!(
                "fetching the receipt body from the control: {}",
                e.code.as_str()
            ))
        })?;
    if resp.status != 200 {
        return Err(unavailable(format!(
            "the control answered the receipt fetch with {}",
            resp.status
        )));
    }
    resp.body.set_deadline(deadline);
    Ok(ReceiptBody {
        body: resp.body,
        left: len,
        len,
        piece: Vec::new(),
    })
}

/// A receipt body read from the control while it is sent to the destination.
struct ReceiptBody {
    body: Box<crate::egress::ResponseBodyReader>,
    left: u64,
    len: u64,
    piece: Vec<u8>,
}

impl EgressBody for ReceiptBody {
    fn length(&self) -> BodyLength {
        if self.len == 0 {
            BodyLength::None
        } else {
            BodyLength::Known(self.len)
        }
    }

    async fn next_chunk(&mut self) -> Result<Option<Bytes>, ApiError> {
        if self.left == 0 {
            return Ok(None);
        }
        let aborted = || {
            ApiError::new(
                ErrorCode::StreamUploadAborted,
                "the receipt body from the control broke off",
            )
        };
        self.piece.clear();
        let more = self
            .body
            .read_into(&mut self.piece)
            .await
            .map_err(|_| aborted())?;
        if self.piece.is_empty() && !more {
            return Err(aborted());
        }
        let n = self.piece.len() as u64;
        if n > self.left {
            return Err(aborted());
        }
        self.left -= n;
        Ok(Some(Bytes::copy_from_slice(&self.piece)))
    }
}
