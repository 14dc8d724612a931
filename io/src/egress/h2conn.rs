//! HTTP/2 to destinations that choose it by ALPN (decision 080): one connection per pool key
//! per core carries the core's concurrent requests to that destination as streams, within the
//! server's `MAX_CONCURRENT_STREAMS` (the `http2` crate queues a stream until a slot frees).
//!
//! The `http2` crate (an `h2` fork that can also order SETTINGS and pseudo-headers and set
//! stream priorities, which browser profiles need; decision 081) runs on the socket in poll
//! mode (tokio-rustls, or BoringSSL for a fingerprinted connection, over monoio's poll IO); the
//! connection's frame pump is a task on the same core. A key is known to speak HTTP/2 once a
//! handshake to it chose `h2`; from then on, while its connection is being (re)opened, the
//! core's other requests to the key wait for it instead of dialling their own.
//!
//! Failures become registry errors as decision 080's table says; a stream the server provably
//! did not process (`REFUSED_STREAM`, or above a graceful `GOAWAY`'s last stream) is sent again
//! once on a new connection, whatever `replayable` says (RFC 9113 §8.7).
//!
//! On the per-request path: no blocking, no locks, no logging above debug.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_channel::oneshot;
use http2::client::{ResponseFuture, SendRequest};
use http2::frame::{
    Priorities, Priority, PseudoId, PseudoOrder, SettingId, SettingsOrder, StreamDependency,
    StreamId,
};
use http2::{Reason, RecvStream, SendStream};
use sortie_core::destination::DestinationPolicy;
use sortie_core::error::{ApiError, ErrorCode, TimeoutType};
use sortie_core::fingerprint::profile::Http2Profile;
use sortie_core::h1::{ResponseFraming, DEFAULT_MAX_RESPONSE_HEAD_BYTES};
use sortie_core::request::{rejection_reason, Method, Scheme, TargetUrl};
use tokio::io::{AsyncRead, AsyncWrite};

use super::client::limit;
use super::connect::within;
use super::error::{self, Stage};
use super::pool::PoolKey;
use super::streaming::{BodyLength, BodySource};
use super::Timeouts;

/// The receive window of one stream: how much of a response body the server may send before
/// the reader takes it. The RFC's 64 KiB default caps a loopback download at a few hundred
/// megabits; 1 MiB lets one stream fill a fast link.
pub const H2_STREAM_WINDOW: u32 = 1024 * 1024;
/// The receive window of a connection, over all its streams: the most body bytes one HTTP/2
/// connection can hold in memory on the gateway's side.
pub const H2_CONNECTION_WINDOW: u32 = 4 * 1024 * 1024;
/// The largest response header list accepted (`SETTINGS_MAX_HEADER_LIST_SIZE`), the same
/// limit as an HTTP/1.1 response head.
pub const H2_MAX_HEADER_LIST_BYTES: u32 = DEFAULT_MAX_RESPONSE_HEAD_BYTES as u32;

/// An HTTP/2 connection to a destination.
pub(crate) struct H2Conn {
    send: SendRequest<Bytes>,
    peer: SocketAddr,
    /// Set when the frame pump ended, or when the connection refused a new stream (after a
    /// `GOAWAY`): no new request is started on it.
    is_closed: Rc<Cell<bool>>,
    /// Streams in use (exchanges and body readers alive).
    active: Cell<usize>,
    /// When the last stream ended; with no stream in use for the pool's idle timeout the
    /// connection is closed by the sweep.
    last_used: Cell<Instant>,
}

impl H2Conn {
    /// Runs the HTTP/2 connection preface over a TLS session that chose `h2` and starts the
    /// connection's frame pump on this core: with the ordinary settings, or as `profile` says.
    pub(crate) async fn start<T>(
        io: T,
        peer: SocketAddr,
        profile: Option<&Http2Profile>,
    ) -> Result<Rc<H2Conn>, ApiError>
    where
        T: AsyncRead + AsyncWrite + Unpin + 'static,
    {
        let (send, connection) = builder(profile)
            .handshake::<_, Bytes>(io)
            .await
            .map_err(|e| map_error(&e, Stage::TlsHandshake).error)?;
        let is_closed = Rc::new(Cell::new(false));
        let flag = is_closed.clone();
        monoio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "HTTP/2 upstream connection ended");
            }
            flag.set(true);
        });
        Ok(Rc::new(H2Conn {
            send,
            peer,
            is_closed,
            active: Cell::new(0),
            last_used: Cell::new(Instant::now()),
        }))
    }

    /// The address connected to.
    pub(crate) fn peer(&self) -> SocketAddr {
        self.peer
    }

    fn is_usable(&self) -> bool {
        !self.is_closed.get()
    }
}

/// The client settings of a new connection. Ordinary: no push, the windows above, the header
/// list limit. A profile: its SETTINGS in its order, its connection window, pseudo-header order
/// and HEADERS priority (stream windows and header list size are then what the browser says).
fn builder(profile: Option<&Http2Profile>) -> http2::client::Builder {
    let mut b = http2::client::Builder::new();
    let Some(p) = profile else {
        b.enable_push(false)
            .initial_window_size(H2_STREAM_WINDOW)
            .initial_connection_window_size(H2_CONNECTION_WINDOW)
            .max_header_list_size(H2_MAX_HEADER_LIST_BYTES);
        return b;
    };
    let mut order = SettingsOrder::builder();
    for &(id, value) in p.settings {
        match id {
            1 => {
                b.header_table_size(value);
                order = order.push(SettingId::HeaderTableSize);
            }
            2 => {
                b.enable_push(value != 0);
                order = order.push(SettingId::EnablePush);
            }
            3 => {
                b.max_concurrent_streams(value);
                order = order.push(SettingId::MaxConcurrentStreams);
            }
            4 => {
                b.initial_window_size(value);
                order = order.push(SettingId::InitialWindowSize);
            }
            5 => {
                b.max_frame_size(value);
                order = order.push(SettingId::MaxFrameSize);
            }
            6 => {
                b.max_header_list_size(value);
                order = order.push(SettingId::MaxHeaderListSize);
            }
            8 => {
                b.enable_connect_protocol(value != 0);
                order = order.push(SettingId::EnableConnectProtocol);
            }
            9 => {
                b.no_rfc7540_priorities(value != 0);
                order = order.push(SettingId::NoRfc7540Priorities);
            }
            // Profiles only name the identifiers above (core's tests check the data).
            _ => {}
        }
    }
    if !p.priority_frames.is_empty() {
        let mut frames = Priorities::builder();
        for &(stream, exclusive, depends_on, weight) in p.priority_frames {
            frames = frames.push(Priority::new(
                StreamId::from(stream),
                StreamDependency::new(StreamId::from(depends_on), wire_weight(weight), exclusive),
            ));
        }
        b.priorities(frames.build());
    }
    b.settings_order(order.build())
        .initial_connection_window_size(p.connection_window);
    let mut pseudo = PseudoOrder::builder();
    for c in p.pseudo_order {
        pseudo = pseudo.push(match c {
            'm' => PseudoId::Method,
            'a' => PseudoId::Authority,
            's' => PseudoId::Scheme,
            _ => PseudoId::Path,
        });
    }
    b.headers_pseudo_order(pseudo.build());
    if let Some((exclusive, depends_on, weight)) = p.headers_priority {
        b.headers_stream_dependency(StreamDependency::new(
            StreamId::from(depends_on),
            wire_weight(weight),
            exclusive,
        ));
    }
    b
}

/// A priority weight as sent: one less (RFC 9113 §5.3.2: 1–256 sent as 0–255).
fn wire_weight(weight: u16) -> u8 {
    u8::try_from(weight.saturating_sub(1)).unwrap_or(u8::MAX)
}

/// A stream in use on a connection: counts it, and stamps the connection's last use when it
/// ends.
pub(crate) struct InUse(Rc<H2Conn>);

impl InUse {
    fn new(conn: Rc<H2Conn>) -> InUse {
        conn.active.set(conn.active.get() + 1);
        InUse(conn)
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.0.active.set(self.0.active.get().saturating_sub(1));
        self.0.last_used.set(Instant::now());
    }
}

enum Slot {
    Ready(Rc<H2Conn>),
    /// A request is opening the key's connection; the others wait for it here.
    Connecting(Vec<oneshot::Sender<()>>),
}

type Slots = Rc<RefCell<HashMap<PoolKey, Slot>>>;

/// The HTTP/2 connections of one core, one per key.
#[derive(Default)]
pub(crate) struct H2Pool {
    slots: Slots,
}

/// What a request to a key does about HTTP/2.
pub(crate) enum Acquire {
    /// Use this connection.
    Conn(Rc<H2Conn>),
    /// The key's connection is being opened; try again when this resolves.
    Wait(oneshot::Receiver<()>),
    /// The key speaks HTTP/2 but has no usable connection: open it and report through the
    /// guard (the others wait meanwhile).
    Dial(DialGuard),
    /// The key is not known to speak HTTP/2.
    Unknown,
}

impl H2Pool {
    /// What a request to `key` under `policy` should do. Constant work per call.
    pub(crate) fn acquire(&self, key: &PoolKey, policy: &DestinationPolicy) -> Acquire {
        let mut slots = self.slots.borrow_mut();
        let Some(slot) = slots.get_mut(key) else {
            return Acquire::Unknown;
        };
        match slot {
            // The policy of the request at hand applies, as for pooled HTTP/1.1 connections.
            Slot::Ready(c) if c.is_usable() && policy.allows(c.peer.ip()) => {
                Acquire::Conn(c.clone())
            }
            Slot::Ready(_) => {
                *slot = Slot::Connecting(Vec::new());
                Acquire::Dial(DialGuard {
                    slots: self.slots.clone(),
                    key: Some(key.clone()),
                })
            }
            Slot::Connecting(waiters) => {
                let (tx, rx) = oneshot::channel();
                waiters.push(tx);
                Acquire::Wait(rx)
            }
        }
    }

    /// Records a connection that a dial to a key not known to speak HTTP/2 opened. A key that
    /// already has a usable connection keeps it; this one then serves its one request and
    /// closes when that ends.
    pub(crate) fn register(&self, key: PoolKey, conn: &Rc<H2Conn>) {
        let mut slots = self.slots.borrow_mut();
        match slots.get(&key) {
            Some(Slot::Ready(c)) if c.is_usable() => {}
            _ => {
                if let Some(Slot::Connecting(waiters)) =
                    slots.insert(key, Slot::Ready(conn.clone()))
                {
                    wake(waiters);
                }
            }
        }
    }

    /// Closes connections that ended, and those without a stream in use for `idle_timeout`
    /// (dropping the last handle makes the frame pump send `GOAWAY` and close). Returns how
    /// many were dropped.
    pub(crate) fn sweep(&self, now: Instant, idle_timeout: Duration) -> usize {
        let mut slots = self.slots.borrow_mut();
        let before = slots.len();
        slots.retain(|_, slot| match slot {
            Slot::Ready(c) => {
                c.is_usable()
                    && (c.active.get() > 0
                        || now.saturating_duration_since(c.last_used.get()) < idle_timeout)
            }
            Slot::Connecting(_) => true,
        });
        before - slots.len()
    }

    /// Usable HTTP/2 connections held.
    pub(crate) fn len(&self) -> usize {
        self.slots
            .borrow()
            .values()
            .filter(|s| matches!(s, Slot::Ready(c) if c.is_usable()))
            .count()
    }
}

fn wake(waiters: Vec<oneshot::Sender<()>>) {
    for w in waiters {
        let _ = w.send(());
    }
}

/// Held by the request that opens a key's HTTP/2 connection. Dropped without
/// [`DialGuard::finish`] (the dial failed, chose HTTP/1.1, or the request was cancelled), it
/// forgets that the key speaks HTTP/2 and wakes the waiting requests, which then dial on
/// their own.
pub(crate) struct DialGuard {
    slots: Slots,
    key: Option<PoolKey>,
}

impl DialGuard {
    /// The connection is open: the waiting requests use it.
    pub(crate) fn finish(mut self, conn: &Rc<H2Conn>) {
        if let Some(key) = self.key.take() {
            let mut slots = self.slots.borrow_mut();
            if let Some(Slot::Connecting(waiters)) = slots.insert(key, Slot::Ready(conn.clone())) {
                wake(waiters);
            }
        }
    }
}

impl Drop for DialGuard {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        let Ok(mut slots) = self.slots.try_borrow_mut() else {
            return;
        };
        if matches!(slots.get(&key), Some(Slot::Connecting(_))) {
            if let Some(Slot::Connecting(waiters)) = slots.remove(&key) {
                wake(waiters);
            }
        }
    }
}

/// When a failed stream may be sent again on a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Never: the response had begun, or the request may have been acted on.
    No,
    /// When the request is `replayable`: the request may have reached the destination.
    IfReplayable,
    /// Always: the server did not process the stream (RFC 9113 §8.7).
    Always,
    /// Always, even with a streamed body: nothing of the request left the gateway (the
    /// connection took no new stream).
    NotSent,
}

/// A failed HTTP/2 exchange.
pub(crate) struct H2Failure {
    pub(crate) error: ApiError,
    pub(crate) retry: Retry,
}

/// The request head as the `http2` crate takes it: the target URL's scheme, authority and path as
/// pseudo-headers, the caller's fields in order minus those the gateway manages (the
/// connection-specific fields RFC 9113 §8.2.2 forbids are among them), and `content-length`
/// when the body's length is known (or 0 for an empty POST, PUT or PATCH, as over HTTP/1.1).
pub(crate) fn request_head<'a>(
    method: Method,
    url: &TargetUrl,
    fields: impl Iterator<Item = (&'a str, &'a [u8])>,
    length: BodyLength,
) -> Result<http::Request<()>, ApiError> {
    let invalid = |what: &str| {
        ApiError::new(
            ErrorCode::InvalidRequest,
            format!("the request head cannot be written: {what}"),
        )
    };
    let scheme = match url.scheme {
        Scheme::Http => "http",
        Scheme::Https => "https",
    };
    let uri = format!("{scheme}://{}{}", url.authority(), url.path_and_query);
    let mut req = http::Request::builder()
        .method(method.as_str())
        .uri(uri)
        .body(())
        .map_err(|_| invalid("the target is not a valid URI"))?;
    let headers = req.headers_mut();
    for (name, value) in fields.filter(|(n, _)| rejection_reason(n).is_none()) {
        let name = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid("a field name is not valid"))?;
        let value = http::HeaderValue::from_bytes(value)
            .map_err(|_| invalid("a field value is not valid"))?;
        headers.append(name, value);
    }
    let content_length = match length {
        BodyLength::Known(n) => Some(n),
        BodyLength::None if matches!(method, Method::Post | Method::Put | Method::Patch) => Some(0),
        _ => None,
    };
    if let Some(n) = content_length {
        headers.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(n));
    }
    Ok(req)
}

/// Opens a stream on `conn`, sends the head and the body from `body` with flow control, and
/// returns the future of the response head.
pub(crate) async fn send<B: BodySource>(
    conn: &Rc<H2Conn>,
    head: http::Request<()>,
    length: BodyLength,
    body: &mut B,
    timeouts: &Timeouts,
    deadline: Instant,
) -> Result<Sent, H2Failure> {
    let in_use = InUse::new(conn.clone());
    let idle_end = Instant::now().checked_add(timeouts.idle);
    let (at, expired) = limit(idle_end, TimeoutType::Idle, deadline);
    let mut sender = conn.send.clone();
    // Waits for a stream slot under the server's MAX_CONCURRENT_STREAMS.
    let ready = match within(at, poll_fn(|cx| sender.poll_ready(cx))).await {
        Some(r) => r,
        None => {
            return Err(H2Failure {
                error: error::timeout(expired, Stage::RequestWrite),
                retry: Retry::No,
            })
        }
    };
    let is_end = length == BodyLength::None;
    let sent = ready.and_then(|()| sender.send_request(head, is_end));
    let (response, mut stream) = match sent {
        Ok(pair) => pair,
        Err(e) => {
            // The connection takes no new stream (GOAWAY received, or it broke): nothing of
            // this request was sent.
            conn.is_closed.set(true);
            return Err(H2Failure {
                error: map_error(&e, Stage::RequestWrite).error,
                retry: Retry::NotSent,
            });
        }
    };
    let mut sent_until_cut = None;
    if !is_end {
        let during = |error| H2Failure {
            error,
            retry: Retry::No,
        };
        let mut sent = 0u64;
        while let Some(piece) = body.next_chunk().await.map_err(during)? {
            sent = sent.saturating_add(piece.len() as u64);
            if matches!(length, BodyLength::Known(n) if sent > n) {
                stream.send_reset(Reason::CANCEL);
                return Err(during(upload_mismatch()));
            }
            if let Err(e) = send_data(&mut stream, piece, timeouts, deadline).await {
                // RFC 9113 §8.1: a server may answer before the request is complete and then
                // end the stream; its response, if one comes, is the outcome.
                sent_until_cut = Some(e);
                break;
            }
        }
        if sent_until_cut.is_none() {
            if matches!(length, BodyLength::Known(n) if sent != n) {
                stream.send_reset(Reason::CANCEL);
                return Err(during(upload_mismatch()));
            }
            if let Err(e) = stream.send_data(Bytes::new(), true) {
                sent_until_cut = Some(map_error(&e, Stage::RequestWrite).error);
            }
        }
    }
    Ok(Sent {
        response,
        in_use,
        upload_error: sent_until_cut,
    })
}

/// A stream whose request went out (or was cut short by the server).
pub(crate) struct Sent {
    response: ResponseFuture,
    in_use: InUse,
    /// Why the body could not be sent completely; returned if no response comes.
    upload_error: Option<ApiError>,
}

/// Sends one piece of the body as the stream's and the connection's send windows allow.
async fn send_data(
    stream: &mut SendStream<Bytes>,
    mut piece: Bytes,
    timeouts: &Timeouts,
    deadline: Instant,
) -> Result<(), ApiError> {
    while !piece.is_empty() {
        stream.reserve_capacity(piece.len());
        let idle_end = Instant::now().checked_add(timeouts.idle);
        let (at, expired) = limit(idle_end, TimeoutType::Idle, deadline);
        let granted = match within(at, poll_fn(|cx| stream.poll_capacity(cx))).await {
            Some(Some(Ok(n))) => n,
            Some(Some(Err(e))) => return Err(map_error(&e, Stage::RequestWrite).error),
            Some(None) => {
                return Err(error::reset(
                    Stage::RequestWrite,
                    "the destination closed the HTTP/2 stream while the request was sent",
                ))
            }
            None => return Err(error::timeout(expired, Stage::RequestWrite)),
        };
        if granted == 0 {
            continue;
        }
        let part = piece.split_to(granted.min(piece.len()));
        stream
            .send_data(part, false)
            .map_err(|e| map_error(&e, Stage::RequestWrite).error)?;
    }
    Ok(())
}

fn upload_mismatch() -> ApiError {
    ApiError::new(
        ErrorCode::StreamUploadAborted,
        "the request body did not match its declared length",
    )
}

/// A response head, with the reader of its body.
pub(crate) struct H2Head {
    pub(crate) status: u16,
    /// Field names as the server sent them (lowercase on the wire, RFC 9113 §8.2.1), values
    /// raw; a name's repeated fields follow its first one.
    pub(crate) headers: crate::egress::ResponseFields,
    pub(crate) framing: ResponseFraming,
    pub(crate) body: H2Body,
}

/// Waits for the final response head within the response-header limit and the deadline.
pub(crate) async fn response_head(
    sent: Sent,
    method: Method,
    timeouts: &Timeouts,
    deadline: Instant,
) -> Result<H2Head, H2Failure> {
    let header_end = timeouts
        .response_header
        .and_then(|t| Instant::now().checked_add(t));
    let (at, expired) = limit(header_end, TimeoutType::ResponseHeader, deadline);
    let Sent {
        response,
        in_use,
        upload_error,
    } = sent;
    let resp = match within(at, response).await {
        Some(Ok(r)) => r,
        Some(Err(e)) => {
            return Err(match upload_error {
                Some(error) => H2Failure {
                    error,
                    retry: Retry::No,
                },
                None => map_error(&e, Stage::ResponseHeader),
            })
        }
        None => {
            return Err(H2Failure {
                error: error::timeout(expired, Stage::ResponseHeader),
                retry: Retry::No,
            })
        }
    };
    let (parts, recv) = resp.into_parts();
    // A profile that does not send SETTINGS_MAX_HEADER_LIST_SIZE (Firefox's) leaves the
    // library's own, much larger, default in force; the ordinary limit holds for every
    // connection all the same, counted as RFC 9113 §6.5.2 does.
    let list_bytes = parts.headers.iter().fold(0usize, |n, (name, value)| {
        n.saturating_add(name.as_str().len() + value.len() + 32)
    });
    if list_bytes > H2_MAX_HEADER_LIST_BYTES as usize {
        return Err(H2Failure {
            error: error::protocol_violation(
                "head_too_large",
                &format!("the response header list exceeds {H2_MAX_HEADER_LIST_BYTES} bytes"),
            ),
            retry: Retry::No,
        });
    }
    let status = parts.status.as_u16();
    // If several came, the last one counts.
    let declared = parts
        .headers
        .get_all(http::header::CONTENT_LENGTH)
        .iter()
        .next_back()
        .and_then(|value| std::str::from_utf8(value.as_bytes()).ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    // Copied into one buffer: one allocation for the head, not two per field.
    let headers = crate::egress::ResponseFields::copied(
        parts
            .headers
            .iter()
            .map(|(name, value)| (name.as_str().as_bytes(), value.as_bytes())),
    );
    // RFC 9110 §6.4.1: no content in answers to HEAD, and in 204 and 304 responses.
    let framing = if method == Method::Head || status == 204 || status == 304 {
        ResponseFraming::None
    } else {
        match declared {
            Some(n) => ResponseFraming::ContentLength(n),
            // Not chunk-coded on the wire: over HTTP/2 this means "length not announced; the
            // body ends with the stream".
            None => ResponseFraming::Chunked,
        }
    };
    Ok(H2Head {
        status,
        headers,
        framing,
        body: H2Body {
            recv,
            _in_use: in_use,
            is_end: false,
            left: declared,
        },
    })
}

/// The body of an HTTP/2 response. Dropped before its end, it resets the stream (`CANCEL`);
/// the connection carries on.
pub(crate) struct H2Body {
    recv: RecvStream,
    _in_use: InUse,
    is_end: bool,
    /// Bytes still due by the response's `content-length`, when it declared one.
    left: Option<u64>,
}

impl H2Body {
    /// The next piece of the body, `None` at its end. Each read waits at most the idle limit
    /// and never past `deadline`. The piece's bytes are given back to the server's send window
    /// as they are handed over, so the stream buffers at most its window.
    pub(crate) async fn next(
        &mut self,
        idle: Duration,
        deadline: Instant,
    ) -> Result<Option<Bytes>, ApiError> {
        if self.is_end {
            return Ok(None);
        }
        let idle_end = Instant::now().checked_add(idle);
        let (at, expired) = limit(idle_end, TimeoutType::Idle, deadline);
        match within(at, self.recv.data()).await {
            Some(Some(Ok(data))) => {
                // Only fails for a stream already closed, whose window no longer matters.
                let _ = self.recv.flow_control().release_capacity(data.len());
                if let Some(left) = self.left.as_mut() {
                    *left = left.saturating_sub(data.len() as u64);
                }
                Ok(Some(data))
            }
            // A server that answered before reading the whole request body may end the stream
            // with RST_STREAM(NO_ERROR) right after a complete response (RFC 9113 §8.1). The
            // `http2` crate reports that reset instead of the end it followed; a body that
            // already has every byte its content-length announced is complete.
            Some(Some(Err(e)))
                if self.left == Some(0)
                    && e.is_remote()
                    && e.is_reset()
                    && e.reason() == Some(Reason::NO_ERROR) =>
            {
                self.is_end = true;
                Ok(None)
            }
            Some(Some(Err(e))) => Err(map_error(&e, Stage::ResponseBody).error),
            Some(None) => {
                self.is_end = true;
                Ok(None)
            }
            None => Err(error::timeout(expired, Stage::ResponseBody)),
        }
    }
}

/// The registry error of an `http2` failure in `stage` (decision 080), and whether the stream
/// may be sent again.
pub(crate) fn map_error(e: &http2::Error, stage: Stage) -> H2Failure {
    if let Some(io) = e.get_io() {
        let error = if error::is_tls_error(io) {
            error::tls_failure(io)
        } else {
            error::reset(stage, "the HTTP/2 connection broke")
        };
        return H2Failure {
            error,
            retry: if error::is_tls_error(io) {
                Retry::No
            } else {
                Retry::IfReplayable
            },
        };
    }
    let reason = e.reason().unwrap_or(Reason::INTERNAL_ERROR);
    let name = reason_name(reason);
    if e.is_remote() && e.is_go_away() {
        return H2Failure {
            error: error::reset(
                stage,
                "the destination closed the HTTP/2 connection (GOAWAY)",
            )
            .with_detail("h2_error", name),
            // A graceful GOAWAY fails only the streams above its last stream id, which the
            // server did not process (RFC 9113 §6.8).
            retry: if reason == Reason::NO_ERROR {
                Retry::Always
            } else {
                Retry::IfReplayable
            },
        };
    }
    if e.is_remote() && e.is_reset() {
        let (message, retry) = if reason == Reason::REFUSED_STREAM {
            ("the destination refused the HTTP/2 stream", Retry::Always)
        } else {
            (
                "the destination reset the HTTP/2 stream",
                Retry::IfReplayable,
            )
        };
        return H2Failure {
            error: error::reset(stage, message).with_detail("h2_error", name),
            retry,
        };
    }
    if e.is_library() {
        // The http2 crate found the destination breaking HTTP/2 (malformed frames or headers,
        // flow-control or size violations) and ended the stream or the connection.
        return H2Failure {
            error: error::protocol_violation(
                "h2_protocol_error",
                "the destination broke the HTTP/2 protocol",
            )
            .with_detail("h2_error", name),
            retry: Retry::No,
        };
    }
    H2Failure {
        error: error::internal("the HTTP/2 client failed").with_detail("h2_error", name),
        retry: Retry::No,
    }
}

/// The RFC 9113 §7 name of an error code; `UNKNOWN` for codes it does not define.
fn reason_name(r: Reason) -> &'static str {
    match u32::from(r) {
        0x0 => "NO_ERROR",
        0x1 => "PROTOCOL_ERROR",
        0x2 => "INTERNAL_ERROR",
        0x3 => "FLOW_CONTROL_ERROR",
        0x4 => "SETTINGS_TIMEOUT",
        0x5 => "STREAM_CLOSED",
        0x6 => "FRAME_SIZE_ERROR",
        0x7 => "REFUSED_STREAM",
        0x8 => "CANCEL",
        0x9 => "COMPRESSION_ERROR",
        0xa => "CONNECT_ERROR",
        0xb => "ENHANCE_YOUR_CALM",
        0xc => "INADEQUATE_SECURITY",
        0xd => "HTTP_1_1_REQUIRED",
        _ => "UNKNOWN",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sortie_core::request::parse_target_url;

    #[test]
    fn heads_carry_pseudo_headers_and_drop_managed_fields() {
        let url = parse_target_url("https://a.example:8443/p?q=1").unwrap();
        let fields: &[(&str, &[u8])] = &[
            ("Accept", b"*/*"),
            ("Connection", b"close"),
            ("X-Service-Route-Tags", b"a"),
            ("X-Dup", b"1"),
            ("X-Dup", b"2"),
        ];
        let req = request_head(
            Method::Post,
            &url,
            fields.iter().copied(),
            BodyLength::Known(5),
        )
        .unwrap();
        assert_eq!(req.method(), "POST");
        assert_eq!(req.uri(), "https://a.example:8443/p?q=1");
        let names: Vec<_> = req.headers().iter().map(|(n, v)| (n.as_str(), v)).collect();
        assert_eq!(names.len(), 4, "{names:?}");
        assert_eq!(req.headers()["accept"], "*/*");
        let dups: Vec<_> = req.headers().get_all("x-dup").iter().collect();
        assert_eq!(dups, ["1", "2"]);
        assert_eq!(req.headers()["content-length"], "5");
        let empty_post =
            request_head(Method::Post, &url, std::iter::empty(), BodyLength::None).unwrap();
        assert_eq!(empty_post.headers()["content-length"], "0");
        let get = request_head(Method::Get, &url, std::iter::empty(), BodyLength::None).unwrap();
        assert!(get.headers().is_empty());
        let chunked =
            request_head(Method::Put, &url, std::iter::empty(), BodyLength::Chunked).unwrap();
        assert!(chunked.headers().get("content-length").is_none());
    }

    #[test]
    fn reason_names_follow_the_rfc() {
        assert_eq!(reason_name(Reason::NO_ERROR), "NO_ERROR");
        assert_eq!(reason_name(Reason::REFUSED_STREAM), "REFUSED_STREAM");
        assert_eq!(reason_name(Reason::HTTP_1_1_REQUIRED), "HTTP_1_1_REQUIRED");
        assert_eq!(reason_name(Reason::from(0xff)), "UNKNOWN");
    }
}
