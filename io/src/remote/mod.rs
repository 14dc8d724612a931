//! The control side of the bus: the listener on every core, admission of a lane, its hand-over
//! to the core its hello names, the per-core lane table, heartbeat supervision, configuration
//! pushes, and `BusCore::execute`, which runs one routed request on a remote worker from the
//! core that received it (decisions 060–062).
//!
//! A worker session becomes routable once it has a lane to every core (so any core can assign
//! to it without a cross-core hop), and stops being routable when its first lane is lost.
//!
//! `proxy.rs`: the forward proxy's absolute-form requests and CONNECT tunnels on a remote
//! worker (streamed bodies and tunnel bytes under the worker's credit, decision 064).
//!
//! Admission (decision 101): a bus listener per core, at most 256 connections waiting for their
//! hello, the first frame judged from its five header bytes. After TLS and the hello the
//! accepting core checks the token (shared, or the worker's own with its grants, decision 105),
//! the version and the lane, then hands the descriptor and TLS session to the core the lane names
//! through its mailbox (`crate::bus::Handoff`). Heartbeat supervision runs per core and also closes
//! a lane whose writes stopped progressing; lane 0's heartbeat load goes to the worker's slot for
//! `/metrics` (decision 069). The welcome of version 3 announces the receipt port and the proxy
//! idle limit (decision 068). `BusCore::execute` runs a routed request on the receiving core's
//! lane with the assignment timeout, credit, and `Cancel` from a guard's `Drop`; `BusCore::start`
//! returns the head and a `RemoteReader`, which `crate::dispatch::streamed` stores as a response
//! receipt. Each stream's slot holds its event queue and the worker's credit for what the control
//! sends; the sans-IO lanes of `sortie_core::bus` check each side's data against the window.

pub(crate) mod proxy;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sortie_core::bus::{
    negotiate, AssignRef, AssignUrl, BodySource, ConfigPush, ControlLane, Frame, FrameBuf, Hello,
    LaneSettings, Reject, ResponseHead, StreamError, StreamId, Verdict, Violation, Welcome,
    MAX_DATA_BYTES, PROTOCOL_VERSION,
};
use sortie_core::error::{ApiError, ErrorCode, TimeoutType};

use crate::bus::conn::Conn;
use crate::bus::{buffered_frame, read_frame, read_hello, Handoff, Outbox, Queue};
use crate::control::core::CoreCommand;
use crate::control::state::ControlState;
use crate::egress::BodyLength;

/// Why a bus connection was closed before it became a lane.
#[derive(Debug, thiserror::Error)]
enum GreetError {
    #[error("TLS: {0}")]
    Tls(std::io::Error),
    #[error("hello: {0}")]
    Read(crate::bus::ReadError),
    #[error("{0} before hello")]
    BeforeHello(&'static str),
    #[error("closed before hello")]
    Closed,
    #[error("rejected {0}")]
    Rejected(String),
    #[error("handing the lane to its core: {0}")]
    Handoff(std::io::Error),
    #[error("no core {0} for the lane")]
    NoCore(usize),
}

/// How long a new connection may take to finish TLS and send its hello: short, since a
/// connection that has not authenticated holds a slot of [`MAX_PRE_AUTH_PER_CORE`]
/// (decision 101). A worker across a continent needs a few round trips, well under it.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections of one core's bus listener that may be before their hello at once; the next
/// is closed as soon as it is accepted (decision 101).
pub const MAX_PRE_AUTH_PER_CORE: usize = 256;
/// How long a standby session may wait to take over before its lanes are closed.
pub const STANDBY_LIMIT: Duration = Duration::from_secs(60);
/// A lane silent for this many heartbeat intervals is closed and its worker disconnected.
pub const MISSED_HEARTBEATS: u32 = 3;
/// A lane whose one write (at most 256 KiB) has not completed for this many heartbeat
/// intervals is closed: the worker stopped reading (decision 101).
pub const WRITE_STALL_HEARTBEATS: u32 = 10;
/// Response body bytes a worker may send before the control grants more.
pub const INITIAL_WINDOW: u32 = MAX_DATA_BYTES as u32;
/// Time past the request's deadline the control waits for the worker's own timeout error
/// before it answers `timeout_exceeded` itself.
const DEADLINE_GRACE: Duration = Duration::from_millis(500);

/// The bus settings of a control, shared by its cores.
pub struct BusSettings {
    /// Who may attach (decision 105); a reload may replace them (decision 114).
    pub credentials: arc_swap::ArcSwap<Credentials>,
    /// The TLS server configuration; `None` for plain TCP (`control.bus.plaintext`). A reload
    /// may replace the configuration (new certificate files), not switch TLS on or off.
    pub tls: Option<arc_swap::ArcSwap<rustls::ServerConfig>>,
    /// `control.bus.tls_client_ca_file` is set: the TLS configuration verified the worker's
    /// certificate chain, and the certificate must name the `Hello`'s worker id (decision 109).
    pub requires_client_certificate: bool,
    /// `control.bus.heartbeat_ms`.
    pub heartbeat_ms: u32,
    /// `control.bus.assignment_timeout_ms`.
    pub assignment_timeout: Duration,
    /// The control's cores: lanes per worker.
    pub cores: usize,
    /// The control's id, sent in `Welcome`.
    pub control_id: String,
    /// `control.bus.api_base_url`, without a trailing `/`.
    pub api_base_url: Option<String>,
    /// The API listener's bound port: with the lane's local address, the default base URL.
    pub api_port: u16,
    /// The port of the receipt URLs (`api_base_url`'s, else `api_port`), announced to
    /// version 3 workers, which fetch receipt bodies on it only (decision 068).
    pub receipt_port: u16,
    /// `control.proxy.idle_timeout_ms`, announced to version 3 workers for the forward
    /// proxy's relayed requests (decision 068).
    pub proxy_idle_ms: u32,
}

/// Who may attach to the bus: every worker with the one shared token, or only the workers the
/// configuration lists, each with its own token and grants (decision 105).
pub enum Credentials {
    /// `control.bus.token`: any worker id with this token.
    Shared(Vec<u8>),
    /// `[[control.bus.workers]]`: each id with its own token, by id (looked up once per
    /// `Hello`, however many workers are listed).
    PerWorker(HashMap<String, WorkerCredential>),
}

/// One worker's resolved token and its configuration entry.
pub struct WorkerCredential {
    /// The token it must present.
    pub token: Vec<u8>,
    /// Its entry (id, grants).
    pub entry: sortie_core::config::BusWorkerConfig,
}

impl Credentials {
    /// Checks a `Hello`'s token for its worker id, in constant time over the token; the
    /// refusal's message, for the `Reject`.
    fn admit(&self, worker_id: &str, token: &[u8]) -> Result<(), &'static str> {
        let expected = match self {
            Credentials::Shared(t) => t,
            Credentials::PerWorker(by_id) => match by_id.get(worker_id) {
                Some(c) => &c.token,
                None => return Err("this worker id is not configured on this control"),
            },
        };
        if crate::tokens::secrets_equal(token, expected) {
            Ok(())
        } else {
            Err("invalid worker token")
        }
    }

    /// What the configuration grants `worker_id`, with per-worker credentials.
    fn grant(&self, worker_id: &str) -> Option<sortie_core::worker::WorkerGrant<'_>> {
        match self {
            Credentials::Shared(_) => None,
            Credentials::PerWorker(by_id) => by_id.get(worker_id).map(|c| c.entry.grant()),
        }
    }
}

struct SessionEntry {
    session: Box<str>,
    lanes: u16,
    up: u16,
    is_registered: bool,
    caps: Option<sortie_core::worker::WorkerCapabilities>,
    /// The newest configuration revision the session acknowledged.
    applied: u64,
    /// The session was registered and then said `GoAway` or lost a lane: a standby takes over
    /// as soon as it has every lane.
    is_retired: bool,
    /// A second session of the same worker waiting to take over: the successor of a worker's
    /// binary upgrade, admitted while this one still serves (decision 115).
    standby: Option<Box<SessionEntry>>,
}

impl SessionEntry {
    fn new(session: &str, lanes: u16) -> SessionEntry {
        SessionEntry {
            session: session.into(),
            lanes,
            up: 0,
            is_registered: false,
            caps: None,
            applied: 0,
            is_retired: false,
            standby: None,
        }
    }

    /// Registers the session once every lane is up.
    fn register_when_complete(&mut self, state: &Arc<ControlState>, worker_id: &str) {
        if self.up < self.lanes || self.is_registered {
            return;
        }
        let Some(caps) = self.caps.clone() else {
            return;
        };
        match state.register_remote_batched(worker_id, &self.session, caps, crate::clock::unix_ms())
        {
            Ok(slot) => {
                slot.set_applied(self.applied);
                self.is_registered = true;
                tracing::info!(
                    worker = worker_id,
                    session = &*self.session,
                    lanes = self.lanes,
                    "remote worker registered"
                );
            }
            Err(err) => {
                tracing::warn!(worker = worker_id, error = %err, "registration refused")
            }
        }
    }

    /// The session stops serving (`GoAway`, or a lane lost): a complete standby takes its
    /// place at once (the registry then names the standby's session, with no moment in which
    /// the worker is not routable), else the worker is listed as disconnected.
    fn retire(&mut self, state: &Arc<ControlState>, worker_id: &str) {
        let was_registered = std::mem::replace(&mut self.is_registered, false);
        self.is_retired |= was_registered;
        if self.promote(state, worker_id) {
            return;
        }
        if was_registered {
            state.disconnect_remote(worker_id, &self.session, crate::clock::unix_ms());
            tracing::info!(
                worker = worker_id,
                session = &*self.session,
                "remote worker disconnected"
            );
        }
    }

    /// Replaces a retired session with its standby once the standby has every lane.
    fn promote(&mut self, state: &Arc<ControlState>, worker_id: &str) -> bool {
        let is_complete = self.standby.as_ref().is_some_and(|sb| sb.up >= sb.lanes);
        if !self.is_retired || !is_complete {
            return false;
        }
        let Some(standby) = self.standby.take() else {
            return false;
        };
        tracing::info!(
            worker = worker_id,
            from = &*self.session,
            to = &*standby.session,
            "remote worker session replaced by its successor"
        );
        *self = *standby;
        self.register_when_complete(state, worker_id);
        true
    }
}

/// The first character of a session that asks to be admitted as the standby of a connected
/// session of its worker id: the successor of a worker's binary upgrade (decision 115). Other
/// sessions start with `s` and are refused while another one is connected (decision 061).
pub const SUCCESSOR_SESSION_PREFIX: &str = "u";

/// Whether a lane was admitted for the worker's current session or as its standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admission {
    Current,
    Standby,
}

/// Bus state shared by every core: settings, the sessions being assembled lane by lane, and
/// the cores' mailboxes for hand-overs and pushes.
pub struct BusShared {
    /// Settings.
    pub settings: BusSettings,
    sessions: Mutex<HashMap<String, SessionEntry>>,
}

impl BusShared {
    /// Shared bus state.
    pub fn new(settings: BusSettings) -> Arc<BusShared> {
        Arc::new(BusShared {
            settings,
            sessions: Mutex::new(HashMap::new()),
        })
    }

    /// Replaces who may attach and the TLS configuration (a reload, decision 114): new lanes
    /// are judged by them; lanes already admitted go on. `tls` is ignored on a plain bus.
    pub fn reload(&self, credentials: Credentials, tls: Option<Arc<rustls::ServerConfig>>) {
        self.settings.credentials.store(Arc::new(credentials));
        if let (Some(current), Some(new)) = (&self.settings.tls, tls) {
            current.store(new);
        }
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, SessionEntry>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admission of a session (decision 061): the same session may (re)open lanes; a second
    /// live session of the same worker id is refused, unless it is a successor
    /// ([`SUCCESSOR_SESSION_PREFIX`]), which waits as its standby (one at a time) and takes over
    /// when the first says `GoAway` or loses a lane (decision 115).
    fn admit_session(&self, state: &ControlState, hello: &Hello) -> Result<Admission, Reject> {
        let reject = |reason: &str, message: String| Reject {
            reason: reason.into(),
            message,
        };
        let registered = state.with_registry(|reg, _| {
            reg.get(&hello.worker_id)
                .map(|r| (r.state(), r.session().map(str::to_owned), r.executor()))
        });
        if let Some((st, session, executor)) = registered {
            use sortie_core::worker::{Executor, WorkerState};
            if executor == Executor::Local && st != WorkerState::Unregistered {
                return Err(reject(
                    "invalid_worker",
                    "the worker id belongs to a local executor".into(),
                ));
            }
            if st == WorkerState::Connected
                && session.as_deref() != Some(&hello.session)
                && !self.sessions().contains_key(&hello.worker_id)
            {
                return Err(reject(
                    "duplicate_session",
                    "another session of this worker id is connected".into(),
                ));
            }
        }
        let lanes = self.settings.cores as u16;
        let mut s = self.sessions();
        let e = s
            .entry(hello.worker_id.clone())
            .or_insert_with(|| SessionEntry::new(&hello.session, lanes));
        if *e.session == *hello.session {
            return Ok(Admission::Current);
        }
        if e.up == 0 && !e.is_registered && e.standby.is_none() {
            *e = SessionEntry::new(&hello.session, lanes);
            return Ok(Admission::Current);
        }
        // Only a successor asks to wait: a second process misconfigured with the same id is
        // refused, and the first keeps serving.
        if !hello.session.starts_with(SUCCESSOR_SESSION_PREFIX) {
            let what = if e.is_registered {
                "another session of this worker id is connected"
            } else {
                "another session of this worker id is connecting"
            };
            return Err(reject("duplicate_session", what.into()));
        }
        match &e.standby {
            Some(sb) if *sb.session == *hello.session => Ok(Admission::Standby),
            Some(_) => Err(reject(
                "duplicate_session",
                "another session of this worker id is connected and one waits to replace it".into(),
            )),
            None => {
                e.standby = Some(Box::new(SessionEntry::new(&hello.session, lanes)));
                Ok(Admission::Standby)
            }
        }
    }

    /// A lane of the session (or of its standby) is up; the last one registers the worker (or
    /// lets the standby take over a retired session).
    fn lane_up(
        &self,
        state: &Arc<ControlState>,
        worker_id: &str,
        session: &str,
        caps: sortie_core::worker::WorkerCapabilities,
    ) {
        let mut s = self.sessions();
        let Some(e) = s.get_mut(worker_id) else {
            return;
        };
        if &*e.session == session {
            e.up = e.up.saturating_add(1);
            e.caps = Some(caps);
            e.register_when_complete(state, worker_id);
        } else if let Some(sb) = e.standby.as_mut().filter(|sb| &*sb.session == session) {
            sb.up = sb.up.saturating_add(1);
            sb.caps = Some(caps);
            e.promote(state, worker_id);
        }
    }

    /// The session acknowledged a configuration revision (it may do so before its last lane
    /// is up, so the session keeps it until registration).
    fn applied(&self, state: &ControlState, worker_id: &str, session: &str, version: u64) {
        let mut s = self.sessions();
        let Some(e) = s.get_mut(worker_id) else {
            return;
        };
        if let Some(sb) = e.standby.as_mut().filter(|sb| &*sb.session == session) {
            sb.applied = sb.applied.max(version);
            return;
        }
        if &*e.session != session {
            return;
        }
        e.applied = e.applied.max(version);
        if e.is_registered {
            if let Some(slot) = state.slot_of(worker_id) {
                slot.set_applied(version);
            }
        }
    }

    /// The worker said `GoAway`: it stops being routable at once (listed as disconnected),
    /// while the streams in flight on its lanes finish.
    fn going_away(&self, state: &Arc<ControlState>, worker_id: &str, session: &str) {
        let mut s = self.sessions();
        let Some(e) = s.get_mut(worker_id).filter(|e| &*e.session == session) else {
            return;
        };
        e.retire(state, worker_id);
    }

    /// A lane of the session is gone: the worker stops being routable.
    fn lane_down(&self, state: &Arc<ControlState>, worker_id: &str, session: &str) {
        let mut s = self.sessions();
        let Some(e) = s.get_mut(worker_id) else {
            return;
        };
        if let Some(sb) = e.standby.as_mut().filter(|sb| &*sb.session == session) {
            sb.up = sb.up.saturating_sub(1);
            if sb.up == 0 {
                e.standby = None;
            }
        } else if &*e.session == session {
            e.up = e.up.saturating_sub(1);
            e.retire(state, worker_id);
        }
        if e.up == 0 && !e.is_registered && e.standby.is_none() {
            s.remove(worker_id);
        }
    }
}

/// A stream's place on its lane: the events its task waits for, and the credit the worker
/// granted for the bytes the control sends (streamed bodies and tunnels).
#[derive(Default)]
pub(super) struct StreamSlot {
    pub(super) events: Queue<Event>,
    pub(super) credit: Cell<u64>,
    pub(super) credit_ready: crate::bus::Notify,
    /// The stream ended (refused, failed, lane lost): nothing more may be sent on it.
    pub(super) is_over: Cell<bool>,
    /// When the worker's `Accept` (or, without one, its answer) reached this core: the end of
    /// the request's hand-over, which the request API reports as `assignment_ms`.
    pub(super) accepted_at: Cell<Option<Instant>>,
    /// Whether `Accept` is also an event that wakes the stream's task, for a task that waits
    /// for it before it sends a streamed body ([`BusCore::accepted`]). Otherwise it only
    /// marks the stream accepted, and the task wakes once, for the head ([`BusCore::answer`]).
    pub(super) accept_wakes: Cell<bool>,
}

/// What a running stream hears from its lane.
pub(super) enum Event {
    Accepted,
    Refused(String),
    Head(ResponseHead),
    Data(Vec<u8>, bool),
    Failed(StreamError),
    Lost(Loss),
}

/// Why a lane ended under a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Loss {
    /// The connection closed, or heartbeats stopped.
    Disconnected,
    /// The worker broke the protocol; the control closed the lane.
    Protocol,
}

/// One lane on this core.
pub(crate) struct Lane {
    worker_id: Box<str>,
    session: Box<str>,
    proto: RefCell<ControlLane>,
    streams: RefCell<sortie_core::FastMap<StreamId, Rc<StreamSlot>>>,
    pub(super) out: Outbox,
    is_closed: Cell<bool>,
    stop: crate::bus::Notify,
    last_rx: Cell<Instant>,
    /// The worker's counters, once a heartbeat looked them up.
    slot: std::cell::OnceCell<Arc<crate::control::state::WorkerSlot>>,
    /// [`crate::control::state::session_tag`] of `session`.
    session_tag: u64,
    /// Whether the lane must carry heartbeats: lane 0, or every lane of a worker that speaks a
    /// version before 4 (decision 118). Other lanes are kept by TCP keepalive.
    needs_heartbeats: bool,
    index: u16,
    /// Whether the worker takes an assignment's target URL as parts (version 6, decision 131).
    takes_target_parts: bool,
    /// The control's address on this connection, as the worker dialled it.
    local: Option<std::net::SocketAddr>,
    /// Set while the lane belongs to a standby session (decision 115).
    standby_since: Cell<Option<Instant>>,
}

impl Lane {
    /// Queues an `Assign` written from borrowed parts, as [`Lane::send`] queues a frame.
    pub(super) fn send_assign<N: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        a: &AssignRef<'_, N, V>,
    ) -> bool {
        if self.is_closed.get() {
            return false;
        }
        // A worker before version 6 takes the URL as text only.
        let text;
        let a = match a.url {
            AssignUrl::Parts(t) if !self.takes_target_parts => {
                text = t.to_text();
                &AssignRef {
                    url: AssignUrl::Text(&text),
                    ..*a
                }
            }
            _ => a,
        };
        if self
            .out
            .push_with(|out| sortie_core::bus::encode_assign(a, out))
            .is_err()
        {
            return false;
        }
        self.proto
            .borrow_mut()
            .sent_assign(a.stream, a.window, a.body);
        true
    }

    pub(super) fn send(&self, frame: &Frame) -> bool {
        if self.is_closed.get() {
            return false;
        }
        if self.out.push(frame).is_err() {
            return false;
        }
        self.proto.borrow_mut().sent(frame);
        true
    }
}

/// The bus on one core: its lanes by worker id.
pub struct BusCore {
    core: usize,
    shared: Arc<BusShared>,
    state: Arc<ControlState>,
    lanes: RefCell<sortie_core::FastMap<Box<str>, Rc<Lane>>>,
    /// Lanes of standby sessions: a worker's successor waiting to take over (decision 115).
    standby: RefCell<sortie_core::FastMap<Box<str>, Rc<Lane>>>,
    /// Lanes of sessions that said `GoAway` and were replaced on this core by their successor:
    /// they finish their streams, under heartbeat supervision, until the worker closes them.
    retiring: RefCell<Vec<Rc<Lane>>>,
    /// Connections accepted on this core and not past their hello yet.
    pre_auth: Cell<usize>,
}

impl BusCore {
    /// The bus of one core.
    pub fn new(core: usize, shared: Arc<BusShared>, state: Arc<ControlState>) -> Rc<BusCore> {
        Rc::new(BusCore {
            core,
            shared,
            state,
            lanes: RefCell::new(sortie_core::FastMap::default()),
            standby: RefCell::new(sortie_core::FastMap::default()),
            retiring: RefCell::new(Vec::new()),
            pre_auth: Cell::new(0),
        })
    }

    /// Lanes on this core.
    pub fn lanes(&self) -> usize {
        self.lanes.borrow().len()
    }

    /// Accepts bus connections on this core's listener until shutdown. A connection the
    /// kernel completed as the accept was cancelled is closed: its worker dials again (on a
    /// socket handed to a successor, decision 115, the successor accepts it).
    pub async fn serve(
        self: Rc<Self>,
        listener: monoio::net::TcpListener,
        shutdown: crate::http::ShutdownSignal,
    ) {
        monoio::spawn(self.clone().supervise());
        let mut stop = std::pin::pin!(shutdown.wait());
        let canceller = monoio::io::Canceller::new();
        loop {
            let mut accept = std::pin::pin!(listener.cancelable_accept(canceller.handle()));
            let accepted = match crate::http::race(stop.as_mut(), accept.as_mut()).await {
                crate::http::Either::Left(()) => {
                    drop(canceller.cancel());
                    drop(accept.await);
                    return;
                }
                crate::http::Either::Right(a) => a,
            };
            match accepted {
                // Accepted as the stop came (its flag is set before any `GoAway` goes out): a
                // worker dialling after a `GoAway` must reach the successor, not this process.
                Ok(_) if shutdown.is_shutdown() => return,
                Ok((stream, peer)) => {
                    if self.pre_auth.get() >= MAX_PRE_AUTH_PER_CORE {
                        tracing::debug!(%peer, "bus connection closed: too many before their hello");
                        drop(stream);
                        continue;
                    }
                    self.pre_auth.set(self.pre_auth.get() + 1);
                    let me = self.clone();
                    monoio::spawn(async move {
                        let greeted =
                            monoio::time::timeout(HELLO_TIMEOUT, me.clone().greet(stream)).await;
                        me.pre_auth.set(me.pre_auth.get().saturating_sub(1));
                        match greeted {
                            Ok(Err(e)) => {
                                tracing::debug!(%peer, error = %e, "bus connection refused")
                            }
                            Err(_) => {
                                tracing::debug!(%peer, "bus connection sent no hello in time")
                            }
                            Ok(Ok(())) => {}
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "bus accept");
                    monoio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// TLS, hello, the checks that need no registry, then the hand-over.
    ///
    /// A refused connection is logged at debug level: before the hello, anyone may dial.
    async fn greet(self: Rc<Self>, stream: monoio::net::TcpStream) -> Result<(), GreetError> {
        let s = &self.shared.settings;
        let mut conn = match &s.tls {
            Some(cfg) => Conn::accept_tls(stream, cfg.load_full())
                .await
                .map_err(GreetError::Tls)?,
            None => Conn::plain(stream),
        };
        let mut buf = FrameBuf::new();
        let hello = match read_hello(&mut conn, &mut buf)
            .await
            .map_err(GreetError::Read)?
        {
            Some(Frame::Hello(h)) => h,
            Some(f) => return Err(GreetError::BeforeHello(f.name())),
            None => return Err(GreetError::Closed),
        };
        let reject = |reason: &str, message: &str| {
            Frame::Reject(Reject {
                reason: reason.into(),
                message: message.into(),
            })
        };
        let refusal = if let Err(why) = s.credentials.load().admit(&hello.worker_id, &hello.token) {
            Some(reject("auth_failed", why))
        } else if s.requires_client_certificate && !conn.peer_names(&hello.worker_id) {
            Some(reject(
                "auth_failed",
                "the client certificate does not name this worker id",
            ))
        } else if negotiate(hello.version_min, hello.version_max).is_none() {
            Some(reject(
                "unsupported_version",
                "no protocol version in common",
            ))
        } else if usize::from(hello.lane) >= s.cores
            || !(usize::from(hello.lanes) == s.cores || (hello.lane == 0 && hello.lanes == 0))
        {
            Some(reject(
                "lane_out_of_range",
                &format!("this control has {} cores: lanes 0..{}", s.cores, s.cores),
            ))
        } else {
            None
        };
        if let Some(f) = refusal {
            let mut out = Vec::new();
            let _ = sortie_core::bus::encode(&f, &mut out);
            let (_r, _) = conn.write_all(out).await;
            return Err(GreetError::Rejected(hello.worker_id));
        }
        let target = usize::from(hello.lane);
        if target == self.core {
            // A task of its own: the lane outlives the hello's time limit around this call.
            monoio::spawn(self.clone().adopt(conn, hello, buf));
            return Ok(());
        }
        let (stream, tls) = conn.into_parts().map_err(GreetError::Handoff)?;
        let handoff = Handoff {
            stream,
            tls,
            hello,
            rest: buf,
        };
        let sent = self
            .state
            .mailboxes
            .get()
            .and_then(|m| m.get(target))
            .is_some_and(|m| m.send(CoreCommand::AdoptLane(Box::new(handoff))));
        if sent {
            Ok(())
        } else {
            Err(GreetError::NoCore(target))
        }
    }

    /// Takes over a lane another core accepted.
    pub async fn adopt_handoff(self: Rc<Self>, h: Box<Handoff>) {
        let Handoff {
            stream,
            tls,
            hello,
            rest,
        } = *h;
        let stream = match monoio::net::TcpStream::from_std(stream) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "bus hand-over");
                return;
            }
        };
        let conn = match tls {
            Some(t) => Conn::with_session(stream, t),
            None => Conn::plain(stream),
        };
        self.adopt(conn, hello, rest).await;
    }

    /// Registry admission, `Welcome`, then the lane runs on this core until it closes.
    async fn adopt(
        self: Rc<Self>,
        mut conn: Conn<monoio::net::TcpStream>,
        hello: Box<Hello>,
        rest: FrameBuf,
    ) {
        let s = &self.shared.settings;
        let mut advertised = hello.capabilities.clone();
        let credentials = s.credentials.load();
        let granted = match credentials.grant(&hello.worker_id) {
            Some(g) => advertised.apply_grant(&g),
            None => Ok(()),
        };
        let caps = match granted.and_then(|()| advertised.validate()) {
            Ok(c) => Ok(c),
            Err(e) => Err(Reject {
                reason: "invalid_worker".into(),
                message: e.to_string(),
            }),
        };
        let admitted = caps.and_then(|caps| {
            if !sortie_core::config::is_valid_id(&hello.worker_id)
                || hello.session.is_empty()
                || !hello.session.bytes().all(|b| b.is_ascii_graphic())
            {
                return Err(Reject {
                    reason: "invalid_worker".into(),
                    message: "worker id or session is not valid".into(),
                });
            }
            let admission = self.shared.admit_session(&self.state, &hello)?;
            Ok((caps, admission))
        });
        let (caps, admission) = match admitted {
            Ok(c) => c,
            Err(r) => {
                tracing::info!(worker = %hello.worker_id, reason = %r.reason, "bus lane refused");
                let mut out = Vec::new();
                let _ = sortie_core::bus::encode(&Frame::Reject(r), &mut out);
                let (_r, _) = conn.write_all(out).await;
                return;
            }
        };
        let mut proto = ControlLane::new();
        let _ = proto.receive(&Frame::Hello(hello.clone()));
        proto.admit();
        let version = negotiate(hello.version_min, hello.version_max).unwrap_or(PROTOCOL_VERSION);
        conn.keep_alive(Duration::from_millis(u64::from(s.heartbeat_ms)));
        let lane = Rc::new(Lane {
            worker_id: hello.worker_id.as_str().into(),
            session: hello.session.as_str().into(),
            proto: RefCell::new(proto),
            streams: RefCell::new(sortie_core::FastMap::default()),
            out: Outbox::default(),
            is_closed: Cell::new(false),
            stop: crate::bus::Notify::default(),
            last_rx: Cell::new(Instant::now()),
            needs_heartbeats: sortie_core::bus::lane_heartbeats(version, hello.lane),
            slot: std::cell::OnceCell::new(),
            session_tag: crate::control::state::session_tag(&hello.session),
            index: hello.lane,
            takes_target_parts: version >= sortie_core::bus::TARGET_PARTS_VERSION,
            local: conn.local_addr(),
            standby_since: Cell::new(None),
        });
        lane.send(&Frame::Welcome(Welcome {
            version,
            control_id: s.control_id.clone(),
            core: self.core as u16,
            cores: s.cores as u16,
            heartbeat_ms: s.heartbeat_ms,
            settings: (version >= 3).then_some(LaneSettings {
                receipt_port: s.receipt_port,
                proxy_idle_ms: s.proxy_idle_ms,
            }),
        }));
        if hello.lane == 0 {
            // The worker applies the configuration before it opens its other lanes.
            let active = self.state.active();
            lane.send(&Frame::ConfigPush(ConfigPush {
                version: active.revision,
                payload: active.snapshot.to_json(),
            }));
        }
        // A standby's lane waits beside the current one (decision 115); otherwise a lane of
        // the session replaces the one it had on this core.
        let table = match admission {
            Admission::Current => &self.lanes,
            Admission::Standby => {
                lane.standby_since.set(Some(Instant::now()));
                &self.standby
            }
        };
        let previous = table
            .borrow_mut()
            .insert(lane.worker_id.clone(), lane.clone());
        if let Some(old) = previous {
            self.close(&old, Loss::Disconnected);
        }
        self.shared
            .lane_up(&self.state, &lane.worker_id, &lane.session, caps);
        let (mut reader, writer) = conn.split();
        let writer_lane = lane.clone();
        monoio::spawn(async move { writer_lane.out.run(writer).await });
        let mut buf = rest;
        loop {
            let next = match buffered_frame(&mut buf) {
                Ok(None) => {
                    let r = monoio::select! {
                        r = read_frame(&mut reader, &mut buf) => r,
                        _ = lane.stop.wait() => break,
                    };
                    // The coarse clock: once per read (the frames after it in the buffer came
                    // with it), against heartbeat silences of seconds.
                    lane.last_rx.set(crate::timer::now());
                    r
                }
                buffered => buffered,
            };
            match next {
                Ok(Some(frame)) => {
                    if let Err(reason) = self.dispatch(&lane, frame) {
                        tracing::warn!(worker = %lane.worker_id, lane = lane.index, %reason, "bus protocol error; closing the lane");
                        self.close(&lane, Loss::Protocol);
                        break;
                    }
                }
                Ok(None) => {
                    self.close(&lane, Loss::Disconnected);
                    break;
                }
                Err(crate::bus::ReadError::Io(e)) => {
                    tracing::info!(worker = %lane.worker_id, lane = lane.index, error = %e, "bus lane failed");
                    self.close(&lane, Loss::Disconnected);
                    break;
                }
                Err(crate::bus::ReadError::Frame(reason)) => {
                    tracing::warn!(worker = %lane.worker_id, lane = lane.index, %reason, "bus frame error; closing the lane");
                    self.close(&lane, Loss::Protocol);
                    break;
                }
            }
        }
    }

    fn dispatch(&self, lane: &Rc<Lane>, frame: Frame) -> Result<(), Violation> {
        let verdict = lane.proto.borrow_mut().receive(&frame)?;
        if verdict == Verdict::Ignore {
            return Ok(());
        }
        let queue = |id: StreamId| lane.streams.borrow().get(&id).cloned();
        let remove = |id: StreamId| lane.streams.borrow_mut().remove(&id);
        match frame {
            Frame::Heartbeat(h) => {
                if lane.index == 0 {
                    // The worker's slot, looked up once per lane: the heartbeat itself takes no
                    // lock (a registration batch may hold the registry's for a rebuild).
                    if lane.slot.get().is_none() {
                        if let Some(slot) = self.state.slot_of(&lane.worker_id) {
                            let _ = lane.slot.set(slot);
                        }
                    }
                    if let Some(slot) = lane.slot.get() {
                        slot.heartbeat(lane.session_tag, crate::clock::unix_ms(), h.active);
                    }
                }
            }
            Frame::ConfigApplied { version } => {
                self.shared
                    .applied(&self.state, &lane.worker_id, &lane.session, version);
            }
            Frame::GoAway { reason } => {
                // No new assignments; the streams on its lanes finish. A standby of the worker
                // takes this core's place at once.
                tracing::info!(worker = %lane.worker_id, %reason, "worker going away");
                self.hand_over_lane(lane);
                self.shared
                    .going_away(&self.state, &lane.worker_id, &lane.session);
            }
            Frame::Accept { stream } => {
                if let Some(q) = queue(stream) {
                    q.accepted_at.set(Some(Instant::now()));
                    if q.accept_wakes.get() {
                        q.events.push(Event::Accepted);
                    }
                }
            }
            Frame::Refuse { stream, reason } => {
                if let Some(q) = remove(stream) {
                    q.is_over.set(true);
                    q.events.push(Event::Refused(reason));
                    q.credit_ready.notify();
                }
            }
            Frame::ResponseHead(h) => {
                if let Some(q) = queue(h.stream) {
                    q.events.push(Event::Head(h));
                }
            }
            Frame::Response { head, bytes } => {
                // The head and the body's end at once (version 5): both events wait in the
                // queue for one wake-up of the stream's task.
                let stream = head.stream;
                let q = if lane.proto.borrow().is_half_open(stream) {
                    queue(stream)
                } else {
                    remove(stream)
                };
                if let Some(q) = q {
                    if q.accepted_at.get().is_none() {
                        q.accepted_at.set(Some(Instant::now()));
                    }
                    q.events.push(Event::Head(head));
                    q.events.push(Event::Data(bytes, true));
                }
            }
            Frame::Data { stream, bytes, end } => {
                // A tunnel's or streamed body's stream outlives the worker's end while the
                // control's direction is open: it still takes credit.
                let is_over = end && !lane.proto.borrow().is_half_open(stream);
                let q = if is_over {
                    remove(stream)
                } else {
                    queue(stream)
                };
                if let Some(q) = q {
                    q.events.push(Event::Data(bytes, end));
                }
            }
            Frame::StreamError(e) => {
                if let Some(q) = remove(e.stream) {
                    q.is_over.set(true);
                    q.events.push(Event::Failed(e));
                    q.credit_ready.notify();
                }
            }
            Frame::Credit { stream, bytes } => {
                if let Some(q) = queue(stream) {
                    q.credit
                        .set(q.credit.get().saturating_add(u64::from(bytes)));
                    q.credit_ready.notify();
                }
            }
            other => {
                return Err(Violation {
                    frame: other.name(),
                    reason: "is not expected from a worker",
                })
            }
        }
        Ok(())
    }

    /// Closes a lane: every stream on it ends with `loss`, the worker stops being routable.
    fn close(&self, lane: &Rc<Lane>, loss: Loss) {
        if lane.is_closed.replace(true) {
            return;
        }
        lane.proto.borrow_mut().close();
        let streams: Vec<_> = lane.streams.borrow_mut().drain().collect();
        for (_, q) in streams {
            q.is_over.set(true);
            q.events.push(Event::Lost(loss));
            q.credit_ready.notify();
        }
        lane.out.close();
        lane.stop.notify();
        self.hand_over_lane(lane);
        for table in [&self.lanes, &self.standby] {
            let mut t = table.borrow_mut();
            if t.get(&lane.worker_id).is_some_and(|l| Rc::ptr_eq(l, lane)) {
                t.remove(&lane.worker_id);
            }
        }
        self.retiring.borrow_mut().retain(|l| !Rc::ptr_eq(l, lane));
        self.shared
            .lane_down(&self.state, &lane.worker_id, &lane.session);
    }

    /// The worker's current lane on this core stops taking assignments (it said `GoAway`, or
    /// it closed): its standby's lane, if one waits on this core, takes its place, and the old
    /// lane finishes its streams on the retiring list (decision 115).
    fn hand_over_lane(&self, lane: &Rc<Lane>) {
        let is_current = self
            .lanes
            .borrow()
            .get(&lane.worker_id)
            .is_some_and(|l| Rc::ptr_eq(l, lane));
        if !is_current {
            return;
        }
        let Some(next) = self.standby.borrow_mut().remove(&lane.worker_id) else {
            return;
        };
        next.standby_since.set(None);
        self.lanes.borrow_mut().insert(lane.worker_id.clone(), next);
        if !lane.is_closed.get() {
            self.retiring.borrow_mut().push(lane.clone());
        }
    }

    /// Every lane this core supervises: current, standby and retiring ones.
    fn all_lanes(&self) -> Vec<Rc<Lane>> {
        let mut all: Vec<Rc<Lane>> = self.lanes.borrow().values().cloned().collect();
        all.extend(self.standby.borrow().values().cloned());
        all.extend(self.retiring.borrow().iter().cloned());
        all
    }

    /// Closes lanes whose worker stopped sending heartbeats.
    async fn supervise(self: Rc<Self>) {
        let every = Duration::from_millis(u64::from(self.shared.settings.heartbeat_ms));
        let silent = every * MISSED_HEARTBEATS;
        loop {
            monoio::time::sleep(every).await;
            let stale: Vec<Rc<Lane>> = self
                .all_lanes()
                .into_iter()
                .filter(|l| l.needs_heartbeats && l.last_rx.get().elapsed() > silent)
                .collect();
            for l in stale {
                tracing::warn!(worker = %l.worker_id, lane = l.index, "no heartbeat; closing the lane");
                self.close(&l, Loss::Disconnected);
            }
            // A worker that heartbeats but stops reading: its lane's writes make no progress
            // (or its queue outgrows any honest backlog). Close it, abandoning what it holds.
            let stall = every * WRITE_STALL_HEARTBEATS;
            let stuck: Vec<Rc<Lane>> = self
                .all_lanes()
                .into_iter()
                .filter(|l| l.out.is_stuck(stall))
                .collect();
            // A standby that never took over (its predecessor keeps serving) is let go, so a
            // successor that failed to complete its hand-over does not wait for ever.
            let expired: Vec<Rc<Lane>> = self
                .standby
                .borrow()
                .values()
                .filter(|l| {
                    l.standby_since
                        .get()
                        .is_some_and(|t| t.elapsed() > STANDBY_LIMIT)
                })
                .cloned()
                .collect();
            for l in expired {
                tracing::warn!(worker = %l.worker_id, lane = l.index, "a standby session did not take over in time; closing its lane");
                self.close(&l, Loss::Disconnected);
            }
            for l in stuck {
                tracing::warn!(
                    worker = %l.worker_id,
                    lane = l.index,
                    queued = l.out.queued(),
                    "the worker does not read its lane; closing it"
                );
                self.close(&l, Loss::Disconnected);
                l.out.abort();
            }
        }
    }

    /// Pushes a configuration revision on the lanes 0 of this core (the control's core 0 holds
    /// every worker's lane 0).
    pub fn push_config(&self, version: u64, payload: &Arc<Vec<u8>>) {
        let mut lanes: Vec<Rc<Lane>> = self
            .lanes
            .borrow()
            .values()
            .filter(|l| l.index == 0)
            .cloned()
            .collect();
        // A standby applies every revision too, so it takes over with the active one.
        lanes.extend(
            self.standby
                .borrow()
                .values()
                .filter(|l| l.index == 0)
                .cloned(),
        );
        for l in lanes {
            l.send(&Frame::ConfigPush(ConfigPush {
                version,
                payload: payload.to_vec(),
            }));
        }
    }

    /// Says `GoAway` on every lane of this core (a hand-over to a successor, decision 115):
    /// the workers dial again, reaching the successor, while these lanes carry on.
    pub fn go_away_all(&self, reason: &str) {
        let lanes: Vec<Rc<Lane>> = self.lanes.borrow().values().cloned().collect();
        for l in lanes {
            l.send(&Frame::GoAway {
                reason: reason.to_owned(),
            });
        }
    }

    /// Opens a stream to a worker on this core's lane and sends its `Assign` (the stream id is
    /// filled in here). The guard cancels the stream if it is dropped before it is done.
    pub(super) fn open<N: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        worker_id: &str,
        mut assign: AssignRef<'_, N, V>,
    ) -> Result<(StreamGuard, Rc<StreamSlot>), RemoteFailure> {
        let Some(lane) = self.lanes.borrow().get(worker_id).cloned() else {
            return Err(RemoteFailure::Error(ApiError::new(
                ErrorCode::TransportUnavailable,
                format!("no bus lane to worker {worker_id} on this core"),
            )));
        };
        let unavailable = || {
            RemoteFailure::Error(ApiError::new(
                ErrorCode::TransportUnavailable,
                "the bus lane cannot take the assignment",
            ))
        };
        if lane.out.queued() > crate::bus::MAX_QUEUED_BYTES {
            // The worker stopped reading (or its link is far slower than the traffic).
            return Err(RemoteFailure::Error(ApiError::new(
                ErrorCode::TransportUnavailable,
                format!("the bus lane to worker {worker_id} is backed up"),
            )));
        }
        let Some(stream) = lane.proto.borrow_mut().next_stream() else {
            return Err(unavailable());
        };
        let slot = Rc::new(StreamSlot {
            credit: Cell::new(u64::from(sortie_core::bus::INITIAL_UPLOAD_WINDOW)),
            ..StreamSlot::default()
        });
        lane.streams.borrow_mut().insert(stream, slot.clone());
        let mut guard = StreamGuard {
            lane,
            stream,
            is_done: false,
        };
        assign.stream = stream;
        if !guard.lane.send_assign(&assign) {
            guard.is_done = true;
            guard.lane.streams.borrow_mut().remove(&stream);
            return Err(unavailable());
        }
        Ok((guard, slot))
    }

    /// Waits for the response head of a stream whose task does not wait for `Accept` on its
    /// own (`accept_wakes` unset): the worker must have accepted by the assignment timeout
    /// (never past `deadline`), which the `Accept` frame marks on the slot without waking
    /// the task, and the head must come by `until` (`expired` otherwise). One wake-up per
    /// request instead of one for the `Accept` and one for the head.
    pub(super) async fn answer(
        &self,
        worker_id: &str,
        guard: &mut StreamGuard,
        slot: &StreamSlot,
        deadline: Instant,
        until: Instant,
        expired: fn() -> RemoteFailure,
    ) -> Result<ResponseHead, RemoteFailure> {
        // A deadline, so from the coarse clock (decision 121).
        let mut by = (crate::timer::now() + self.shared.settings.assignment_timeout).min(deadline);
        loop {
            match crate::timer::within(by, slot.events.next()).await {
                Some(Event::Head(h)) => return Ok(h),
                Some(Event::Refused(reason)) => {
                    guard.is_done = true;
                    return Err(RemoteFailure::Refused(reason));
                }
                Some(other) => {
                    guard.is_done = true;
                    return Err(fail(other, worker_id, false));
                }
                None if slot.accepted_at.get().is_none() => {
                    return Err(assignment_timeout(worker_id))
                }
                None if by >= until => return Err(expired()),
                // Accepted in time: the rest of the wait is the head's.
                None => by = until,
            }
        }
    }

    /// Waits for the worker's `Accept` within the assignment timeout (never past `deadline`).
    pub(super) async fn accepted(
        &self,
        worker_id: &str,
        guard: &mut StreamGuard,
        slot: &StreamSlot,
        deadline: Instant,
    ) -> Result<(), RemoteFailure> {
        let accept_by =
            (crate::timer::now() + self.shared.settings.assignment_timeout).min(deadline);
        // The coarse per-core timers (decision 121): a runtime timer would make every
        // request future that holds this wait 128-byte aligned, and so its box.
        match crate::timer::within(accept_by, slot.events.next()).await {
            None => Err(assignment_timeout(worker_id)),
            Some(Event::Accepted) => Ok(()),
            Some(Event::Refused(reason)) => {
                guard.is_done = true;
                Err(RemoteFailure::Refused(reason))
            }
            Some(other) => {
                guard.is_done = true;
                Err(fail(other, worker_id, false))
            }
        }
    }

    /// Why receipt bodies cannot go to remote workers, if they cannot: on a TLS bus without
    /// `control.bus.api_base_url` the default base URL is plain HTTP, and the signed URL (a
    /// bearer credential) would cross the network in clear (decision 066).
    pub(crate) fn receipt_refusal(&self) -> Option<ApiError> {
        let s = &self.shared.settings;
        (s.tls.is_some() && s.api_base_url.is_none()).then(|| {
            ApiError::new(
                ErrorCode::BodyRefUnavailable,
                "receipt bodies on remote workers over a TLS bus need an https \
                 control.bus.api_base_url (the default base URL is plain HTTP)",
            )
        })
    }

    /// The base URL at which `worker_id` reaches this control's API listener (decision 065):
    /// `control.bus.api_base_url`, else this core's lane address with the API port.
    pub(crate) fn api_base_url(&self, worker_id: &str) -> Option<String> {
        let s = &self.shared.settings;
        if let Some(u) = &s.api_base_url {
            return Some(u.clone());
        }
        let lane = self.lanes.borrow().get(worker_id).cloned()?;
        let ip = lane.local?.ip();
        Some(format!(
            "http://{}",
            std::net::SocketAddr::new(ip, s.api_port)
        ))
    }

    /// Runs one request on a remote worker from this core and collects its whole response.
    pub(crate) async fn execute(
        &self,
        worker_id: &str,
        job: &RemoteJob<'_>,
    ) -> Result<RemoteResponse, RemoteFailure> {
        let (h, mut reader) = self.start(worker_id, job).await?;
        // The first piece is kept as its frame was decoded, the rest copied behind it: a body
        // in one frame (any small one) is not copied again.
        let mut body = Vec::new();
        let mut len = 0usize;
        while let Some(piece) = reader.next_piece().await? {
            len = len.saturating_add(piece.len());
            if len > job.max_response_bytes {
                return Err(RemoteFailure::Error(
                    ApiError::new(
                        ErrorCode::BodyTooLarge,
                        "response body exceeds the inline limit",
                    )
                    .with_detail("direction", "response"),
                ));
            }
            if body.is_empty() {
                body = piece;
            } else {
                body.extend_from_slice(&piece);
            }
        }
        Ok(RemoteResponse {
            accepted_at: reader.accepted_at(),
            status: h.status,
            // Slices of the one buffer the head was decoded into.
            headers: crate::egress::ResponseFields::decoded(h.headers),
            body,
        })
    }

    /// Sends one request to a remote worker from this core and waits for its response head;
    /// the body follows through the returned reader.
    pub(crate) async fn start(
        &self,
        worker_id: &str,
        job: &RemoteJob<'_>,
    ) -> Result<(ResponseHead, RemoteReader), RemoteFailure> {
        let body = match (&job.receipt, job.body.is_empty()) {
            (Some((url, len)), _) => BodySource::Receipt {
                url: url.clone(),
                len: *len,
            },
            (None, true) => BodySource::Empty,
            (None, false) => BodySource::Inline {
                len: job.body.len() as u64,
            },
        };
        let session = job.provider_session.map(|s| s.to_hex());
        let (mut guard, q) = self.open(
            worker_id,
            AssignRef {
                stream: 0,
                request_id: job.request_id,
                deployment_id: job.deployment_id,
                deadline_ms: millis_left(job.deadline),
                is_replayable: job.is_replayable,
                ingress: 0,
                method: job.method,
                url: AssignUrl::Parts(job.target),
                headers: &job.headers,
                body: &body,
                pool: job.pool,
                provider_session: session_text(&session),
                proxy_username: job.proxy_username,
                fingerprint_profile: job.fingerprint_profile,
                max_response_bytes: job.max_response_bytes as u64,
                window: INITIAL_WINDOW,
            },
        )?;
        let (lane, stream) = (guard.lane.clone(), guard.stream);
        if job.receipt.is_none() {
            let mut chunks = job.body.chunks(MAX_DATA_BYTES).peekable();
            while let Some(c) = chunks.next() {
                lane.send(&Frame::Data {
                    stream,
                    bytes: c.to_vec(),
                    end: chunks.peek().is_none(),
                });
            }
        }
        let until = job.deadline + DEADLINE_GRACE;
        let h = self
            .answer(
                worker_id,
                &mut guard,
                &q,
                job.deadline,
                until,
                deadline_expired,
            )
            .await?;
        Ok((
            h,
            RemoteReader {
                guard,
                slot: q,
                until,
                worker_id: worker_id.into(),
                is_ended: false,
            },
        ))
    }
}

fn assignment_timeout(worker_id: &str) -> RemoteFailure {
    RemoteFailure::Error(ApiError::timeout(
        ErrorCode::AssignmentTimeout,
        TimeoutType::Assignment,
        format!("worker {worker_id} did not accept the assignment in time"),
    ))
}

fn deadline_expired() -> RemoteFailure {
    RemoteFailure::Error(ApiError::timeout(
        ErrorCode::TimeoutExceeded,
        TimeoutType::TotalDeadline,
        "total deadline expired",
    ))
}

/// A remote worker's response body as the request API reads it: credit goes back for what
/// was taken; the total deadline (plus the grace for the worker's own timeout) bounds it.
pub(crate) struct RemoteReader {
    guard: StreamGuard,
    slot: Rc<StreamSlot>,
    until: Instant,
    worker_id: Box<str>,
    is_ended: bool,
}

impl RemoteReader {
    /// When the worker's `Accept` reached this core: the worker started the upstream request
    /// then.
    pub(crate) fn accepted_at(&self) -> Option<Instant> {
        self.slot.accepted_at.get()
    }

    /// Appends the next piece of the body to `out`; `false` at its end.
    pub(crate) async fn next(&mut self, out: &mut Vec<u8>) -> Result<bool, RemoteFailure> {
        Ok(match self.next_piece().await? {
            Some(piece) => {
                out.extend_from_slice(&piece);
                true
            }
            None => false,
        })
    }

    /// The next piece of the body as it came in its `Data` frame (possibly empty); `None` at
    /// its end.
    pub(crate) async fn next_piece(&mut self) -> Result<Option<Vec<u8>>, RemoteFailure> {
        if self.is_ended {
            return Ok(None);
        }
        let ev = crate::timer::within(self.until, self.slot.events.next())
            .await
            .ok_or_else(deadline_expired)?;
        match ev {
            Event::Data(bytes, end) => {
                let n = bytes.len();
                if end {
                    self.guard.is_done = true;
                    self.is_ended = true;
                    return Ok((n > 0).then_some(bytes));
                }
                if n > 0 {
                    self.guard.lane.send(&Frame::Credit {
                        stream: self.guard.stream,
                        bytes: n as u32,
                    });
                }
                Ok(Some(bytes))
            }
            other => {
                self.guard.is_done = true;
                Err(fail(other, &self.worker_id, true))
            }
        }
    }

    /// [`RemoteReader::next`] with the failure as the caller's error.
    async fn next_or_error(&mut self, out: &mut Vec<u8>) -> Result<bool, ApiError> {
        self.next(out).await.map_err(|f| match f {
            RemoteFailure::Error(e) => e,
            RemoteFailure::Lost { .. } | RemoteFailure::Refused(_) => ApiError::new(
                ErrorCode::WorkerDisconnected,
                format!("worker {} disconnected mid-request", self.worker_id),
            ),
        })
    }
}

/// A remote worker's response body, of unknown length (the worker de-framed it), as the source
/// of a stored object (decision 065).
impl crate::egress::BodySource for RemoteReader {
    fn length(&self) -> BodyLength {
        BodyLength::Chunked
    }

    async fn next_chunk(&mut self) -> Result<Option<Bytes>, ApiError> {
        crate::egress::next_appended(async |out: &mut Vec<u8>| self.next_or_error(out).await).await
    }
}

pub(super) fn fail(ev: Event, worker_id: &str, has_head: bool) -> RemoteFailure {
    match ev {
        Event::Failed(e) => RemoteFailure::Error(stream_error(e)),
        Event::Lost(Loss::Disconnected) => RemoteFailure::Lost { has_head },
        Event::Lost(Loss::Protocol) => RemoteFailure::Error(
            ApiError::new(
                ErrorCode::ProtocolError,
                format!("worker {worker_id} broke the bus protocol; its lane was closed"),
            )
            .with_detail("side", "worker"),
        ),
        Event::Refused(r) => RemoteFailure::Refused(r),
        Event::Accepted | Event::Head(_) | Event::Data(..) => RemoteFailure::Error(ApiError::new(
            ErrorCode::ProtocolError,
            "unexpected frame on the stream",
        )),
    }
}

/// A worker's `StreamError` as the caller's error: a registry code passes as it is; anything
/// else is the worker's internal failure.
fn stream_error(e: StreamError) -> ApiError {
    let code = ErrorCode::from_wire(&e.code).unwrap_or(ErrorCode::ExecutorInternalError);
    let mut out = ApiError::new(code, e.message);
    if let Some(t) = e
        .timeout_type
        .as_deref()
        .and_then(|t| TimeoutType::ALL.iter().find(|x| x.as_str() == t))
    {
        out = out.with_timeout_type(*t);
    }
    if let Some(s) = e.upstream_status {
        out = out.with_upstream_status(s);
    }
    for (k, v) in e.details {
        out = out.with_detail(k, v);
    }
    out
}

/// Sends `Cancel` for a stream its request gave up (operator cancel, caller gone, deadline),
/// and forgets the stream's slot on the lane.
pub(super) struct StreamGuard {
    pub(super) lane: Rc<Lane>,
    pub(super) stream: StreamId,
    /// Set when the stream ended on its own (or was refused): no `Cancel` is due.
    pub(super) is_done: bool,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        // The slot goes in any case: a tunnel whose worker ended its direction first keeps it
        // until here.
        let was_open = self
            .lane
            .streams
            .borrow_mut()
            .remove(&self.stream)
            .is_some();
        if was_open && !self.is_done {
            self.lane.send(&Frame::Cancel {
                stream: self.stream,
            });
        }
    }
}

/// Milliseconds from now until `deadline`, as an assignment carries its deadline. The coarse
/// clock never reads earlier than the true time, so this is never more than is left.
fn millis_left(deadline: Instant) -> u32 {
    let left = deadline.saturating_duration_since(crate::timer::now());
    u32::try_from(left.as_millis()).unwrap_or(u32::MAX)
}

/// A provider session's 32 hex digits (`ProviderSession::to_hex`) as an assignment carries
/// them.
fn session_text(hex: &Option<[u8; 32]>) -> Option<&str> {
    hex.as_ref().and_then(|h| std::str::from_utf8(h).ok())
}

/// One request for a remote worker.
pub(crate) struct RemoteJob<'a> {
    pub(crate) request_id: &'a str,
    pub(crate) deployment_id: &'a str,
    pub(crate) method: &'a str,
    /// The destination, sent as parts to a worker of version 6 (decision 131).
    pub(crate) target: &'a sortie_core::request::TargetUrl,
    /// (name, value) of each request header field, borrowed from the validated request.
    pub(crate) headers: Vec<(&'a [u8], &'a [u8])>,
    pub(crate) body: Bytes,
    /// A request receipt's signed worker URL (a bearer credential: never logged) and its
    /// length, instead of an inline body (decision 065).
    pub(crate) receipt: Option<(String, u64)>,
    pub(crate) deadline: Instant,
    pub(crate) is_replayable: bool,
    pub(crate) pool: &'a str,
    /// The provider session routing derived: it picks the proxy endpoint on the worker.
    pub(crate) provider_session: Option<sortie_core::provider_session::ProviderSession>,
    /// The pool's upstream proxy username, rendered by the control; never logged.
    pub(crate) proxy_username: Option<&'a str>,
    pub(crate) fingerprint_profile: Option<&'a str>,
    pub(crate) max_response_bytes: usize,
}

/// A remote worker's whole response.
pub(crate) struct RemoteResponse {
    /// When the worker's `Accept` reached this core.
    pub(crate) accepted_at: Option<Instant>,
    pub(crate) status: u16,
    pub(crate) headers: crate::egress::ResponseFields,
    pub(crate) body: Vec<u8>,
}

/// How a remote attempt ended without an answer: `sortie_core::dispatch` decides what follows.
pub(crate) use sortie_core::dispatch::Failure as RemoteFailure;

/// Starts the task that forgets remote workers disconnected for at least `after`
/// (`control.bus.forget_disconnected_ms`), on the cold thread, checking a few times per bound:
/// without it, every id that ever registered would keep a record and a capacity slot for the
/// life of the process.
pub fn start_forgetting(
    state: Arc<ControlState>,
    cold: &crate::store::ColdHandle,
    after: Duration,
) -> Result<(), crate::store::StoreError> {
    let every = (after / 4).clamp(Duration::from_millis(250), Duration::from_secs(60));
    cold.spawn(move |_| async move {
        loop {
            tokio::time::sleep(every).await;
            let n = state.forget_disconnected(crate::clock::unix_ms(), after);
            if n > 0 {
                tracing::info!(
                    workers = n,
                    after_ms = after.as_millis() as u64,
                    "forgot remote workers disconnected for longer than control.bus.forget_disconnected_ms"
                );
            }
        }
    })
}
