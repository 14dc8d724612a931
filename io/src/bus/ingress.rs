//! The forward proxy's requests on remote workers (decision 064), the control's side: an
//! absolute-form request streams its head and body to the worker (body kind `stream`, within
//! the worker's credit) and relays the response body to the client as it arrives (granting
//! credit as the client takes it); a CONNECT tunnel (body kind `tunnel`) carries the client's
//! bytes in `Data` frames both ways, each direction ended on its own (half-close), under the
//! tunnel idle limit, with byte counters, and ends when the operator cancels it or the worker's
//! lane is lost (the client's connection then closes).
//!
//! `control/proxy.rs` calls in here at its dispatch point, once routing chose a remote worker.

use std::any::Any;
use std::cell::Cell;
use std::future::Future;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt as _, Splitable as _};
use monoio::net::TcpStream;
use sortie_core::bus::{Assign, BodySource as Body, Field, Frame, StreamId, MAX_DATA_BYTES};
use sortie_core::error::{ApiError, ErrorCode};
use sortie_core::proxy::{connection_tokens, is_hop_by_hop_response_field};

use super::control::{fail, BusCore, Event, Lane, RemoteFailure, StreamGuard, StreamSlot};
use crate::control::api::{ApiContext, Assigned};
use crate::control::core::{ActiveGuard, Cancelled};
use crate::control::proxy::idle_watch;
use crate::egress::{BodyLength, BodySource};
use crate::http::{Response, ResponseBody, StreamBody, Tunnel};

/// Bytes one read of the client's side of a tunnel asks for.
const TUNNEL_READ_BYTES: usize = 64 * 1024;

/// What the worker needs of one forward-proxy request besides its head.
pub(crate) struct ProxyAssignment<'a> {
    pub(crate) request_id: &'a str,
    pub(crate) deployment_id: &'a str,
    /// The head's total deadline.
    pub(crate) deadline: Instant,
    pub(crate) pool: String,
    pub(crate) provider_session: Option<sortie_core::provider_session::ProviderSession>,
    /// The rendered upstream proxy username; never logged.
    pub(crate) proxy_username: Option<String>,
}

impl<'a> ProxyAssignment<'a> {
    fn of(
        request_id: &'a str,
        deployment_id: &'a str,
        deadline: Instant,
        assigned: &Assigned,
    ) -> ProxyAssignment<'a> {
        ProxyAssignment {
            request_id,
            deployment_id,
            deadline,
            pool: assigned.decision.pool_id.as_str().to_string(),
            provider_session: assigned.decision.provider_session,
            proxy_username: assigned
                .via
                .as_ref()
                .and_then(|v| v.username())
                .map(str::to_owned),
        }
    }
}

fn bus_of(ctx: &ApiContext) -> Result<&Rc<BusCore>, ApiError> {
    ctx.bus.as_ref().ok_or_else(|| {
        ApiError::new(
            ErrorCode::TransportUnavailable,
            "no worker bus on this control",
        )
    })
}

/// The forward proxy's dispatch to a remote worker for an absolute-form request: the request
/// keeps its capacity and place in the active list until the response body ends.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn relay<B: BodySource>(
    ctx: &ApiContext,
    request_id: &str,
    deployment: &str,
    deadline: Instant,
    method: &str,
    target: &str,
    forwarded: &[(&str, &[u8])],
    body: &mut B,
    (tracked, cancelled, assigned): (ActiveGuard, Cancelled, Assigned),
) -> Result<Response, ApiError> {
    let bus = bus_of(ctx)?;
    let a = ProxyAssignment::of(request_id, deployment, deadline, &assigned);
    let worker_id = assigned.decision.worker_id.as_str().to_string();
    let headers = forwarded
        .iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.to_vec()))
        .collect();
    let keep: Vec<Box<dyn Any>> = vec![Box::new(tracked), Box::new(assigned)];
    bus.relay(
        &worker_id,
        &a,
        method,
        target.to_string(),
        headers,
        body,
        cancelled,
        keep,
    )
    .await
}

/// The forward proxy's dispatch to a remote worker for a CONNECT tunnel; `permit` (the
/// deployment's tunnel count) is held as long as the tunnel.
pub(crate) async fn connect<P: 'static>(
    ctx: &ApiContext,
    request_id: &str,
    deployment: &str,
    deadline: Instant,
    target: &str,
    (tracked, cancelled, assigned, permit): (ActiveGuard, Cancelled, Assigned, P),
) -> Result<Response, ApiError> {
    let bus = bus_of(ctx)?;
    let a = ProxyAssignment::of(request_id, deployment, deadline, &assigned);
    let worker_id = assigned.decision.worker_id.as_str().to_string();
    let keep: Vec<Box<dyn Any>> = vec![Box::new(tracked), Box::new(assigned), Box::new(permit)];
    bus.tunnel(
        &worker_id,
        &a,
        target.to_string(),
        cancelled,
        ctx.state.limits.tunnel_idle_timeout,
        ctx.metrics.clone(),
        keep,
    )
    .await
}

impl ProxyAssignment<'_> {
    fn assign(
        &self,
        ingress: u8,
        method: &str,
        url: String,
        headers: Vec<Field>,
        body: Body,
    ) -> Assign {
        let left = self.deadline.saturating_duration_since(Instant::now());
        Assign {
            stream: 0,
            request_id: self.request_id.to_string(),
            deployment_id: self.deployment_id.to_string(),
            deadline_ms: u32::try_from(left.as_millis()).unwrap_or(u32::MAX),
            // RFC 9110 §9.2.2: only an idempotent request without a body may be retried.
            is_replayable: matches!(body, Body::Empty)
                && matches!(method, "GET" | "HEAD" | "OPTIONS"),
            ingress,
            method: method.to_string(),
            url,
            headers,
            body,
            pool: self.pool.clone(),
            provider_session: self
                .provider_session
                .map(|s| String::from_utf8_lossy(&s.to_hex()).into_owned()),
            proxy_username: self.proxy_username.clone(),
            fingerprint_profile: None,
            // A relayed body is streamed, not held: no limit but the client's patience.
            max_response_bytes: u64::MAX,
            window: super::control::INITIAL_WINDOW,
        }
    }
}

fn cancelled_error() -> ApiError {
    ApiError::new(ErrorCode::Cancelled, "cancelled by operator")
}

/// A proxied request's error as the forward proxy answers it.
fn to_api_error(f: RemoteFailure, worker_id: &str) -> ApiError {
    match f {
        RemoteFailure::Error(e) => e,
        RemoteFailure::Lost { .. } => ApiError::new(
            ErrorCode::WorkerDisconnected,
            format!("worker {worker_id} disconnected mid-request"),
        ),
        RemoteFailure::Refused(reason) => ApiError::new(
            ErrorCode::ExecutorCapacityExhausted,
            format!("worker {worker_id} refused the assignment ({reason})"),
        ),
    }
}

/// Sends `bytes` on the stream in `Data` frames within the worker's credit, waiting for more
/// when it runs out. Fails when the stream or its lane ended under it.
async fn send_credited(lane: &Lane, slot: &StreamSlot, stream: StreamId, bytes: &[u8]) -> bool {
    let mut at = 0;
    while at < bytes.len() {
        while slot.credit.get() == 0 {
            if slot.is_over.get() {
                return false;
            }
            slot.credit_ready.wait().await;
        }
        if slot.is_over.get() {
            return false;
        }
        let n = (bytes.len() - at)
            .min(MAX_DATA_BYTES)
            .min(usize::try_from(slot.credit.get()).unwrap_or(usize::MAX));
        let Some(piece) = bytes.get(at..at + n) else {
            return false;
        };
        lane.out.room().await;
        if slot.is_over.get() {
            return false;
        }
        if !lane.send(&Frame::Data {
            stream,
            bytes: piece.to_vec(),
            end: false,
        }) {
            return false;
        }
        slot.credit.set(slot.credit.get() - n as u64);
        at += n;
    }
    true
}

/// Streams the client's request body to the worker, then ends that direction.
async fn upload<B: BodySource>(
    lane: &Lane,
    slot: &StreamSlot,
    stream: StreamId,
    body: &mut B,
) -> Result<(), ApiError> {
    let gone = || {
        ApiError::new(
            ErrorCode::WorkerDisconnected,
            "the stream ended under the body",
        )
    };
    while let Some(chunk) = body.next_chunk().await? {
        if !send_credited(lane, slot, stream, &chunk).await {
            return Err(gone());
        }
    }
    lane.send(&Frame::Data {
        stream,
        bytes: Vec::new(),
        end: true,
    });
    Ok(())
}

/// Waits for the response head after `Accept`, until `deadline`.
async fn head(
    slot: &StreamSlot,
    worker_id: &str,
    deadline: Instant,
) -> Result<sortie_core::bus::ResponseHead, RemoteFailure> {
    match monoio::time::timeout_at(deadline.into(), slot.events.next()).await {
        Err(_) => Err(RemoteFailure::Error(ApiError::timeout(
            ErrorCode::TimeoutExceeded,
            sortie_core::error::TimeoutType::TotalDeadline,
            "total deadline expired before the response head",
        ))),
        Ok(Event::Head(h)) => Ok(h),
        Ok(other) => Err(fail(other, worker_id, false)),
    }
}

impl BusCore {
    /// Relays one absolute-form request through a remote worker: the head and the streamed
    /// body go out, the response comes back as a streamed body. `keep` is held until the
    /// response body ends (the request's capacity and place in the active list).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn relay<B: BodySource>(
        &self,
        worker_id: &str,
        a: &ProxyAssignment<'_>,
        method: &str,
        url: String,
        headers: Vec<Field>,
        body: &mut B,
        cancelled: Cancelled,
        keep: Vec<Box<dyn Any>>,
    ) -> Result<Response, ApiError> {
        let kind = match body.length() {
            BodyLength::None => Body::Empty,
            BodyLength::Known(n) => Body::Stream { len: Some(n) },
            BodyLength::Chunked => Body::Stream { len: None },
        };
        let has_body = !matches!(kind, Body::Empty);
        let assign = a.assign(1, method, url, headers, kind);
        let (mut guard, slot) = self
            .open(worker_id, assign)
            .map_err(|f| to_api_error(f, worker_id))?;
        let (lane, stream) = (guard.lane.clone(), guard.stream);
        let deadline = a.deadline;
        let mut cancelled = cancelled;
        let (h, is_upload_done) = {
            let answer = async {
                self.accepted(worker_id, &mut guard, &slot, deadline)
                    .await?;
                head(&slot, worker_id, deadline).await
            };
            let mut answer = pin!(answer);
            let mut is_upload_done = !has_body;
            let got = if has_body {
                let mut up = pin!(upload(&lane, &slot, stream, body));
                monoio::select! {
                    h = &mut answer => Some(h),
                    u = &mut up => {
                        is_upload_done = true;
                        match u {
                            Err(e) if !slot.is_over.get() => return Err(e),
                            _ => None,
                        }
                    },
                    _ = &mut cancelled => return Err(cancelled_error()),
                }
            } else {
                None
            };
            let h = match got {
                Some(h) => h,
                None => monoio::select! {
                    h = &mut answer => h,
                    _ = &mut cancelled => return Err(cancelled_error()),
                },
            }
            .map_err(|f| to_api_error(f, worker_id))?;
            (h, is_upload_done)
        };
        let tokens = connection_tokens(&h.headers);
        let field = |name: &[u8]| {
            h.headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_slice())
        };
        let declared = field(b"content-length")
            .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok());
        // The worker de-framed the body: its length is the destination's Content-Length unless
        // it was chunked; a HEAD answer relays the announced length; 204 and 304 have none.
        let length = if method == "HEAD" {
            declared
        } else if matches!(h.status, 204 | 304) {
            Some(0)
        } else if field(b"transfer-encoding").is_some() {
            None
        } else {
            declared
        };
        let mut out = Response::new(h.status);
        out.headers = h
            .headers
            .iter()
            .filter(|(n, _)| {
                !is_hop_by_hop_response_field(n, &tokens)
                    && !n.eq_ignore_ascii_case(b"content-length")
                    && !n.eq_ignore_ascii_case(b"proxy-authenticate")
            })
            .filter_map(|(n, v)| {
                let name = std::str::from_utf8(n).ok()?.to_owned();
                Some((name.into(), Bytes::copy_from_slice(v)))
            })
            .collect();
        out.body = ResponseBody::Stream(Box::new(RemoteBody {
            guard,
            slot,
            length,
            cancelled,
            is_ended: false,
            is_upload_done,
            _keep: keep,
        }));
        Ok(out)
    }

    /// Opens a CONNECT tunnel through a remote worker: the worker dials (directly or through
    /// the pool's upstream proxy) and answers `200`, or a registry error. `keep` lives as long
    /// as the tunnel.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn tunnel(
        &self,
        worker_id: &str,
        a: &ProxyAssignment<'_>,
        authority: String,
        cancelled: Cancelled,
        idle_timeout: Duration,
        metrics: Arc<crate::metrics::Metrics>,
        keep: Vec<Box<dyn Any>>,
    ) -> Result<Response, ApiError> {
        let assign = a.assign(2, "CONNECT", authority, Vec::new(), Body::Tunnel);
        let (mut guard, slot) = self
            .open(worker_id, assign)
            .map_err(|f| to_api_error(f, worker_id))?;
        let mut cancelled = cancelled;
        let h = {
            let answer = async {
                self.accepted(worker_id, &mut guard, &slot, a.deadline)
                    .await?;
                head(&slot, worker_id, a.deadline).await
            };
            monoio::select! {
                h = answer => h.map_err(|f| to_api_error(f, worker_id))?,
                _ = &mut cancelled => return Err(cancelled_error()),
            }
        };
        if !(200..300).contains(&h.status) {
            return Err(ApiError::new(
                ErrorCode::ProtocolError,
                format!("worker {worker_id} answered the tunnel with {}", h.status),
            )
            .with_detail("side", "worker"));
        }
        let mut r = Response::new(200);
        r.body = ResponseBody::Tunnel(Box::new(RemoteTunnel {
            guard,
            slot,
            cancelled,
            idle_timeout,
            metrics,
            core: self.core(),
            _keep: keep,
        }));
        Ok(r)
    }
}

/// A remote worker's response body on its way to the client; credit goes back as the client
/// takes it, so a slow client holds the worker at one window.
struct RemoteBody {
    guard: StreamGuard,
    slot: Rc<StreamSlot>,
    length: Option<u64>,
    cancelled: Cancelled,
    is_ended: bool,
    /// Whether the request body was sent whole; if not, the stream is cancelled at the end
    /// (the worker stops waiting for the rest).
    is_upload_done: bool,
    _keep: Vec<Box<dyn Any>>,
}

impl StreamBody for RemoteBody {
    fn length(&self) -> Option<u64> {
        self.length
    }

    fn read_into<'a>(
        &'a mut self,
        out: &'a mut Vec<u8>,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<bool>> + 'a>> {
        Box::pin(async move {
            if self.is_ended {
                return Ok(false);
            }
            if self.cancelled.is_set() {
                return Err(std::io::Error::other("cancelled by operator"));
            }
            let ev = monoio::select! {
                ev = self.slot.events.next() => ev,
                _ = &mut self.cancelled => return Err(std::io::Error::other("cancelled by operator")),
            };
            match ev {
                Event::Data(bytes, end) => {
                    let n = bytes.len();
                    out.extend_from_slice(&bytes);
                    if end {
                        self.is_ended = true;
                        self.guard.is_done = self.is_upload_done;
                        return Ok(n > 0);
                    }
                    if n > 0 {
                        self.guard.lane.send(&Frame::Credit {
                            stream: self.guard.stream,
                            bytes: n as u32,
                        });
                    }
                    Ok(true)
                }
                Event::Failed(e) => {
                    self.guard.is_done = true;
                    Err(std::io::Error::other(format!(
                        "worker: {}: {}",
                        e.code, e.message
                    )))
                }
                Event::Lost(_) => {
                    self.guard.is_done = true;
                    Err(std::io::Error::other("worker disconnected mid-body"))
                }
                _ => Err(std::io::Error::other("unexpected frame on the stream")),
            }
        })
    }
}

/// An open tunnel through a remote worker, waiting for the client's socket.
struct RemoteTunnel {
    guard: StreamGuard,
    slot: Rc<StreamSlot>,
    cancelled: Cancelled,
    idle_timeout: Duration,
    metrics: Arc<crate::metrics::Metrics>,
    core: usize,
    _keep: Vec<Box<dyn Any>>,
}

impl Tunnel for RemoteTunnel {
    fn run(
        self: Box<Self>,
        client: TcpStream,
        early: Vec<u8>,
    ) -> Pin<Box<dyn Future<Output = ()>>> {
        Box::pin(async move {
            let mut t = *self;
            let (lane, stream, slot) = (t.guard.lane.clone(), t.guard.stream, t.slot.clone());
            let (mut client_read, client_write) = client.into_split();
            let up_bytes = Cell::new(0u64);
            let down_bytes = Cell::new(0u64);
            // Client → worker, until the client half-closes.
            let upload = async {
                if !early.is_empty() {
                    up_bytes.set(early.len() as u64);
                    if !send_credited(&lane, &slot, stream, &early).await {
                        return false;
                    }
                }
                let mut buf = Vec::with_capacity(TUNNEL_READ_BYTES);
                loop {
                    let (r, back) = client_read.read(buf).await;
                    buf = back;
                    match r {
                        Ok(0) => {
                            return lane.send(&Frame::Data {
                                stream,
                                bytes: Vec::new(),
                                end: true,
                            })
                        }
                        Ok(n) => {
                            up_bytes.set(up_bytes.get() + n as u64);
                            if !send_credited(&lane, &slot, stream, &buf[..n.min(buf.len())]).await
                            {
                                return false;
                            }
                            buf.clear();
                        }
                        Err(_) => return false,
                    }
                }
            };
            // Worker → client, until the worker ends its direction; dropping the write half
            // then shuts the client's socket for writing (the half-close).
            let download = async {
                let mut to = client_write;
                loop {
                    match slot.events.next().await {
                        Event::Data(bytes, end) => {
                            let n = bytes.len();
                            if n > 0 {
                                let (r, _) = to.write_all(bytes).await;
                                if r.is_err() {
                                    return false;
                                }
                                down_bytes.set(down_bytes.get() + n as u64);
                                lane.send(&Frame::Credit {
                                    stream,
                                    bytes: n as u32,
                                });
                            }
                            if end {
                                return true;
                            }
                        }
                        _ => return false,
                    }
                }
            };
            let mut upload = pin!(upload);
            let mut download = pin!(download);
            let relay = async {
                monoio::select! {
                    u = &mut upload => u && (&mut download).await,
                    d = &mut download => d && (&mut upload).await,
                }
            };
            let ended = monoio::select! {
                ok = relay => if ok { "closed" } else { "broken" },
                _ = idle_watch(&up_bytes, &down_bytes, t.idle_timeout) => "idle",
                _ = &mut t.cancelled => "cancelled",
            };
            // Both directions ended in order: nothing to cancel; otherwise the guard's drop
            // sends `Cancel` and the worker closes its upstream connection.
            t.guard.is_done = ended == "closed";
            t.metrics
                .record_tunnel(t.core, up_bytes.get(), down_bytes.get());
            tracing::debug!(
                target: "sortie::proxy",
                bytes_up = up_bytes.get(),
                bytes_down = down_bytes.get(),
                end = ended,
                "remote tunnel ended"
            );
        })
    }
}
