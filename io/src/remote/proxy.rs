//! The forward proxy's requests on remote workers (decision 064), the control's side: an
//! absolute-form request streams its head and body to the worker (body kind `stream`, within
//! the worker's credit) and relays the response body to the client as it arrives (granting
//! credit as the client takes it); a CONNECT tunnel (body kind `tunnel`) carries the client's
//! bytes in `Data` frames both ways, each direction ended on its own (half-close), under the
//! tunnel idle limit, with byte counters, and ends when the operator cancels it or the worker's
//! lane is lost (the client's connection then closes).
//!
//! The forward proxy's attempt (`crate::ingress::proxy`) calls in here when routing chose a
//! remote worker; the dispatch loop handles a refusal.

use std::cell::Cell;
use std::future::Future;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use monoio::io::{AsyncReadRent, AsyncWriteRentExt as _, Splitable as _};
use monoio::net::TcpStream;
use sortie_core::bus::{AssignRef, AssignUrl, BodySource as Body, Frame, StreamId, MAX_DATA_BYTES};
use sortie_core::error::{ApiError, ErrorCode};

use super::{fail, BusCore, Event, Lane, RemoteFailure, StreamGuard, StreamSlot};
use crate::control::core::Cancelled;
use crate::egress::ResponseFields;
use crate::egress::{BodyLength, BodySource};
use crate::http::{race, Either, RelayedFields, Response, ResponseBody, StreamBody, Tunnel};

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

impl BusCore {
    /// Opens a stream for a proxied request or tunnel: its `Assign`, written from borrowed
    /// parts.
    #[allow(clippy::too_many_arguments)]
    fn open_proxied(
        &self,
        worker_id: &str,
        a: &ProxyAssignment<'_>,
        ingress: u8,
        method: &str,
        url: AssignUrl<'_>,
        headers: &[(&str, &[u8])],
        body: &Body,
    ) -> Result<(StreamGuard, Rc<StreamSlot>), RemoteFailure> {
        let session = a.provider_session.map(|s| s.to_hex());
        self.open(
            worker_id,
            AssignRef {
                stream: 0,
                request_id: a.request_id,
                deployment_id: a.deployment_id,
                deadline_ms: super::millis_left(a.deadline),
                // RFC 9110 §9.2.2: only an idempotent request without a body may be retried.
                is_replayable: matches!(body, Body::Empty)
                    && matches!(method, "GET" | "HEAD" | "OPTIONS"),
                ingress,
                method,
                url,
                headers,
                body,
                pool: &a.pool,
                provider_session: super::session_text(&session),
                proxy_username: a.proxy_username.as_deref(),
                fingerprint_profile: None,
                // A relayed body is streamed, not held: no limit but the client's patience.
                max_response_bytes: u64::MAX,
                window: super::INITIAL_WINDOW,
            },
        )
    }
}

fn cancelled_error() -> ApiError {
    ApiError::new(ErrorCode::Cancelled, "cancelled by operator")
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
        Err(_) => Err(head_expired()),
        Ok(Event::Head(h)) => Ok(h),
        Ok(other) => Err(fail(other, worker_id, false)),
    }
}

fn head_expired() -> RemoteFailure {
    RemoteFailure::Error(ApiError::timeout(
        ErrorCode::TimeoutExceeded,
        sortie_core::error::TimeoutType::TotalDeadline,
        "total deadline expired before the response head",
    ))
}

/// An absolute-form request a remote worker accepted and answered with a head; its body
/// follows on the stream.
pub(crate) struct Opened {
    guard: StreamGuard,
    slot: Rc<StreamSlot>,
    head: sortie_core::bus::ResponseHead,
    is_upload_done: bool,
}

impl Opened {
    /// The client's response: the head's fields without hop-by-hop ones, the body relayed as
    /// it arrives. `keep` is held until the worker's body ends, before its last piece goes to
    /// the client (the request's capacity and place in the active list, decision 127).
    pub(crate) fn into_response<K: 'static>(
        self,
        method: &str,
        cancelled: Cancelled,
        keep: K,
    ) -> Response {
        let h = self.head;
        let fields = ResponseFields::decoded(h.headers);
        let declared = fields
            .value(b"content-length")
            .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok());
        // The worker de-framed the body: its length is the destination's Content-Length unless
        // it was chunked; a HEAD answer relays the announced length; 204 and 304 have none.
        let length = if method == "HEAD" {
            declared
        } else if matches!(h.status, 204 | 304) {
            Some(0)
        } else if fields.value(b"transfer-encoding").is_some() {
            None
        } else {
            declared
        };
        let mut out = Response::new(h.status);
        // The relayed fields stay in the head's one buffer, as a local destination's do.
        let fields = RelayedFields::relay(fields, &mut out);
        out.body = ResponseBody::Stream(Box::new(RemoteBody {
            fields,
            guard: self.guard,
            slot: self.slot,
            length,
            cancelled,
            is_ended: false,
            is_upload_done: self.is_upload_done,
            keep: Some(keep),
        }));
        out
    }
}

impl BusCore {
    /// Sends one absolute-form request to a remote worker: the head, then, once the worker
    /// accepted, the streamed body, until the response head comes back. Nothing of the body
    /// is read before `Accept`, so a refusal leaves it whole for the next worker.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn relay<B: BodySource>(
        &self,
        worker_id: &str,
        a: &ProxyAssignment<'_>,
        method: &str,
        url: AssignUrl<'_>,
        headers: &[(&str, &[u8])],
        body: &mut B,
        cancelled: &mut Cancelled,
    ) -> Result<Opened, RemoteFailure> {
        let kind = match body.length() {
            BodyLength::None => Body::Empty,
            BodyLength::Known(n) => Body::Stream { len: Some(n) },
            BodyLength::Chunked => Body::Stream { len: None },
        };
        let has_body = !matches!(kind, Body::Empty);
        let (mut guard, slot) = self.open_proxied(worker_id, a, 1, method, url, headers, &kind)?;
        let (lane, stream) = (guard.lane.clone(), guard.stream);
        let deadline = a.deadline;
        if !has_body {
            let h = {
                let answer = pin!(self.answer(
                    worker_id,
                    &mut guard,
                    &slot,
                    deadline,
                    deadline,
                    head_expired
                ));
                match race(answer, &mut *cancelled).await {
                    Either::Left(h) => h?,
                    Either::Right(()) => return Err(RemoteFailure::Error(cancelled_error())),
                }
            };
            return Ok(Opened {
                guard,
                slot,
                head: h,
                is_upload_done: true,
            });
        }
        // The body goes out only after `Accept`: its task waits for it.
        slot.accept_wakes.set(true);
        {
            let accepted = pin!(self.accepted(worker_id, &mut guard, &slot, deadline));
            match race(accepted, &mut *cancelled).await {
                Either::Left(r) => r?,
                Either::Right(()) => return Err(RemoteFailure::Error(cancelled_error())),
            }
        }
        let mut is_upload_done = false;
        let h = {
            let mut answer = pin!(head(&slot, worker_id, deadline));
            let got = {
                let mut up = pin!(upload(&lane, &slot, stream, body));
                monoio::select! {
                    h = &mut answer => Some(h),
                    u = &mut up => {
                        is_upload_done = true;
                        match u {
                            Err(e) if !slot.is_over.get() => return Err(RemoteFailure::Error(e)),
                            _ => None,
                        }
                    },
                    _ = &mut *cancelled => return Err(RemoteFailure::Error(cancelled_error())),
                }
            };
            match got {
                Some(h) => h,
                None => match race(answer, &mut *cancelled).await {
                    Either::Left(h) => h,
                    Either::Right(()) => return Err(RemoteFailure::Error(cancelled_error())),
                },
            }?
        };
        Ok(Opened {
            guard,
            slot,
            head: h,
            is_upload_done,
        })
    }

    /// Opens a CONNECT tunnel through a remote worker: the worker dials (directly or through
    /// the pool's upstream proxy) and answers `200`, or a registry error.
    pub(crate) async fn tunnel(
        &self,
        worker_id: &str,
        a: &ProxyAssignment<'_>,
        authority: &str,
        cancelled: &mut Cancelled,
    ) -> Result<OpenTunnel, RemoteFailure> {
        let (mut guard, slot) = self.open_proxied(
            worker_id,
            a,
            2,
            "CONNECT",
            AssignUrl::Text(authority),
            &[],
            &Body::Tunnel,
        )?;
        let h = {
            let answer = pin!(self.answer(
                worker_id,
                &mut guard,
                &slot,
                a.deadline,
                a.deadline,
                head_expired
            ));
            match race(answer, &mut *cancelled).await {
                Either::Left(h) => h?,
                Either::Right(()) => return Err(RemoteFailure::Error(cancelled_error())),
            }
        };
        if !(200..300).contains(&h.status) {
            return Err(RemoteFailure::Error(
                ApiError::new(
                    ErrorCode::ProtocolError,
                    format!("worker {worker_id} answered the tunnel with {}", h.status),
                )
                .with_detail("side", "worker"),
            ));
        }
        Ok(OpenTunnel { guard, slot })
    }
}

/// A tunnel a remote worker opened: its stream, until the client's socket is handed over.
pub(crate) struct OpenTunnel {
    guard: StreamGuard,
    slot: Rc<StreamSlot>,
}

impl OpenTunnel {
    /// The client's `200`, whose hand-over runs the tunnel; `keep` is held as long as the
    /// tunnel (its capacity, place in the active list and tunnel permit).
    pub(crate) fn into_response<K: 'static>(
        self,
        cancelled: Cancelled,
        idle_timeout: Duration,
        metrics: Arc<crate::metrics::Metrics>,
        core: usize,
        keep: K,
    ) -> Response {
        let mut r = Response::new(200);
        r.body = ResponseBody::Tunnel(Box::new(RemoteTunnel {
            guard: self.guard,
            slot: self.slot,
            cancelled,
            idle_timeout,
            metrics,
            core,
            _keep: keep,
        }));
        r
    }
}

/// A remote worker's response body on its way to the client; credit goes back as the client
/// takes it, so a slow client holds the worker at one window.
struct RemoteBody<K> {
    /// The head's fields the client gets.
    fields: RelayedFields,
    guard: StreamGuard,
    slot: Rc<StreamSlot>,
    length: Option<u64>,
    cancelled: Cancelled,
    is_ended: bool,
    /// Whether the request body was sent whole; if not, the stream is cancelled at the end
    /// (the worker stops waiting for the rest).
    is_upload_done: bool,
    /// What the request holds until the worker's body ends (its capacity, its place in the
    /// active list).
    keep: Option<K>,
}

impl<K> StreamBody for RemoteBody<K> {
    fn length(&self) -> Option<u64> {
        self.length
    }

    fn relayed_fields(&self) -> Option<&RelayedFields> {
        Some(&self.fields)
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
            let next = pin!(self.slot.events.next());
            let ev = match race(next, &mut self.cancelled).await {
                Either::Left(ev) => ev,
                Either::Right(()) => return Err(std::io::Error::other("cancelled by operator")),
            };
            match ev {
                Event::Data(bytes, end) => {
                    let n = bytes.len();
                    out.extend_from_slice(&bytes);
                    if end {
                        self.is_ended = true;
                        self.guard.is_done = self.is_upload_done;
                        // The worker's part is done: released before the last piece goes out,
                        // so a client that has it finds the capacity free (decision 127).
                        self.keep = None;
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
struct RemoteTunnel<K> {
    guard: StreamGuard,
    slot: Rc<StreamSlot>,
    cancelled: Cancelled,
    idle_timeout: Duration,
    metrics: Arc<crate::metrics::Metrics>,
    core: usize,
    /// What the tunnel holds while it runs.
    _keep: K,
}

impl<K: 'static> Tunnel for RemoteTunnel<K> {
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
                _ = crate::clock::idle_watch(&up_bytes, &down_bytes, t.idle_timeout) => "idle",
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
