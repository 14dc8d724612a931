//! Streamed upstream exchanges: the request body comes from a [`BodySource`] while it is sent,
//! and the response is handed over as soon as its head is read, its body read piece by piece
//! through a [`ResponseBodyReader`]. Nothing is buffered whole, so bodies of any size pass
//! through a bounded amount of memory.
//!
//! Connections come from, and go back to, the same per-core keep-alive pool as
//! [`super::Egress::execute`]: a connection is returned only when the response body was read to
//! its end with keep-alive allowed on both sides and nothing left over.
//!
//! Also here: [`super::Egress::dial`], a raw TCP connection to a destination for a tunnel, with
//! the same resolution, destination policy and source address as every other exchange.
//!
//! On the per-request path: no blocking, no locks, no logging above debug.

use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use monoio::net::TcpStream;
use sortie_core::destination::DestinationPolicy;
use sortie_core::error::{ApiError, ErrorCode, TimeoutType};
use sortie_core::fingerprint::profile::Profile;
use sortie_core::h1::{
    write_chunk_header, BodyDecoder, BodyLimits, OutgoingBody, ResponseFraming, CHUNK_DATA_END,
    LAST_CHUNK,
};
use sortie_core::request::{Host, Method, Scheme, TargetUrl};
use sortie_core::snapshot::ConfigId;

use super::client::{self, limit, read_error, Failure};
use super::connect::within;
use super::error::{self, Stage};
use super::h2conn::{self, H2Body, H2Conn, H2Failure, H2Head, Retry};
use super::pool::PoolKey;
use super::stream::{Conn, Sent, READ_BUF_BYTES};
use super::{Attempt, Dial, Egress, Inner, Obtained, ProxyRoute, Timeouts};
use crate::dns::Tenant;
use crate::splice;

/// How a streamed request body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    /// No body.
    None,
    /// Exactly this many bytes (`Content-Length`).
    Known(u64),
    /// Unknown in advance: sent with the chunked transfer coding.
    Chunked,
}

/// Where the request body of a streamed exchange comes from.
///
/// The exchange calls [`BodySource::next_chunk`] until it returns `None`; for
/// [`BodyLength::Known`] the pieces must add up to exactly the declared length (more or fewer
/// bytes fail the exchange with `stream_upload_aborted`).
// Sources are per core and never sent to another thread; see `crate::http::Handler`.
#[allow(async_fn_in_trait)]
pub trait BodySource {
    /// How the body is delimited.
    fn length(&self) -> BodyLength;

    /// The next piece of the body, `None` at its end. An error aborts the exchange and is
    /// returned by [`Egress::open`] as it is.
    async fn next_chunk(&mut self) -> Result<Option<Bytes>, ApiError>;
}

/// A destination's response body as the source of another exchange or of a stored object
/// (decision 065): the body of one exchange read as the body of the next thing.
impl BodySource for ResponseBodyReader {
    fn length(&self) -> BodyLength {
        match self.framing {
            ResponseFraming::None => BodyLength::None,
            ResponseFraming::ContentLength(n) => BodyLength::Known(n),
            _ => BodyLength::Chunked,
        }
    }

    async fn next_chunk(&mut self) -> Result<Option<Bytes>, ApiError> {
        next_appended(async |out: &mut Vec<u8>| self.read_into(out).await).await
    }
}

/// The next non-empty piece of a body read by appending to a buffer (`read` answers whether
/// more follows), as one chunk: the [`BodySource`] view of a response body reader.
pub(crate) async fn next_appended(
    mut read: impl AsyncFnMut(&mut Vec<u8>) -> Result<bool, ApiError>,
) -> Result<Option<Bytes>, ApiError> {
    let mut piece = Vec::new();
    loop {
        let more = read(&mut piece).await?;
        if !piece.is_empty() {
            return Ok(Some(Bytes::from(piece)));
        }
        if !more {
            return Ok(None);
        }
    }
}

/// A body held in memory (possibly empty).
impl BodySource for Bytes {
    fn length(&self) -> BodyLength {
        if self.is_empty() {
            BodyLength::None
        } else {
            BodyLength::Known(self.len() as u64)
        }
    }

    async fn next_chunk(&mut self) -> Result<Option<Bytes>, ApiError> {
        if self.is_empty() {
            Ok(None)
        } else {
            Ok(Some(std::mem::take(self)))
        }
    }
}

/// One streamed upstream request.
#[derive(Debug, Clone, Copy)]
pub struct StreamRequest<'a> {
    /// The method.
    pub method: Method,
    /// The destination.
    pub url: &'a TargetUrl,
    /// Destination header fields in order, duplicates kept. Fields the gateway manages
    /// (framing, hop-by-hop, `Expect`, proxy credentials, `X-Service-*`) are dropped if present.
    pub headers: &'a [(&'a str, &'a [u8])],
    /// The deadline for connecting, sending the request and receiving the response head; the
    /// body's deadline is [`ResponseBodyReader::set_deadline`]'s.
    pub deadline: Instant,
    /// Stage limits.
    pub timeouts: Timeouts,
    /// The destination policy of the snapshot the request runs under.
    pub policy: &'a DestinationPolicy,
    /// The worker performing the request; connections are pooled per worker.
    pub worker_id: &'a ConfigId,
    /// The source address of egress connections, when the worker has one.
    pub bind_address: Option<IpAddr>,
    /// Permission to send the request again, once, on a fresh connection when a pooled one
    /// broke before any response byte. Only used when the body is [`BodyLength::None`]: a
    /// streamed body cannot be sent twice.
    pub is_replayable: bool,
    /// The pool's upstream proxy, when it does not egress directly.
    pub via: Option<&'a ProxyRoute>,
    /// The deployment the request runs for, for its share of the resolver (decision 045).
    pub tenant: Tenant,
    /// Whether the caller may splice the response body to its client
    /// ([`ResponseBodyReader::splice_into`]): the head is then read in small pieces on a plain
    /// connection, so that most of a large body stays in the socket (decision 025).
    pub may_splice: bool,
}

/// The head of a streamed response, with the reader of its body.
pub struct StreamedResponse {
    /// The destination's status.
    pub status: u16,
    /// Response header fields as received: names as spelled, raw values, order and duplicates
    /// kept (hop-by-hop and framing fields included; the caller decides what to relay).
    pub headers: crate::egress::ResponseFields,
    /// The address the response came from.
    pub peer_addr: SocketAddr,
    /// Milliseconds spent on DNS, TCP and TLS; 0 on a reused connection.
    pub connect_ms: u64,
    /// Whether the response came over a pooled connection.
    pub is_connection_reused: bool,
    /// The body, boxed: the reader (its connection and decoder) is most of the response's
    /// size, and the response is moved through every layer between the egress and the handler.
    pub body: Box<ResponseBodyReader>,
}

/// A `Content-Length` body with at least this many bytes left after its head is spliced to a
/// plain client connection instead of being read and written (decision 025): below it, the
/// two system calls a splice adds cost more than the copies they save.
pub(crate) const SPLICE_MIN_BYTES: u64 = 16 * 1024;

/// Reads the body of a streamed response. Dropping it before the end closes the connection.
pub struct ResponseBodyReader {
    conn: Option<Conn>,
    /// The body of an HTTP/2 response (then `conn` is `None`).
    h2: Option<H2Body>,
    decoder: BodyDecoder,
    framing: ResponseFraming,
    /// Body bytes that arrived with the head.
    early: Bytes,
    is_keep_alive: bool,
    has_leftover: bool,
    is_finished: bool,
    deadline: Instant,
    idle: std::time::Duration,
    home: Rc<Inner>,
    key: Option<PoolKey>,
}

impl ResponseBodyReader {
    /// How the upstream delimited the body.
    pub fn framing(&self) -> ResponseFraming {
        self.framing
    }

    /// Whether the body has been read to its end.
    pub fn is_end(&self) -> bool {
        self.is_finished
    }

    /// Replaces the deadline of the body (by default the request's head deadline). Each read
    /// is also bounded by the idle limit.
    pub fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = deadline;
    }

    /// The body bytes that came with the response head, when the body has no chunk framing:
    /// they are the body as it is, handed out without a copy (bytes past a declared length are
    /// left out and keep the connection from the pool). `None` for a chunked body, or once
    /// [`ResponseBodyReader::read_into`] has run; `read_into` then goes on after these bytes.
    pub fn take_early(&mut self) -> Option<Bytes> {
        if self.is_finished
            || self.early.is_empty()
            || matches!(self.framing, ResponseFraming::Chunked)
        {
            return None;
        }
        let mut early = std::mem::take(&mut self.early);
        let consumed = match self.decoder.decode(&early, &mut |_| {}) {
            Ok(progress) => progress.consumed,
            Err(_) => {
                // Plain framing cannot fail to decode; should it, `read_into` reports it.
                self.early = early;
                return None;
            }
        };
        if consumed < early.len() {
            self.has_leftover = true;
            early.truncate(consumed);
        }
        if self.decoder.is_done() {
            self.finish(false);
        }
        Some(early)
    }

    /// Appends the next decoded piece of the body to `out`; returns `false` at the end of the
    /// body (nothing appended). At the end, a reusable connection goes back to the pool.
    ///
    /// Errors: `upstream_reset` (closed or broken before the end), `upstream_tls_failure`,
    /// `protocol_error` (bad chunk framing), `timeout_exceeded` (`idle_timeout` or
    /// `download_timeout`).
    pub async fn read_into(&mut self, out: &mut Vec<u8>) -> Result<bool, ApiError> {
        if self.is_finished {
            return Ok(false);
        }
        if let Some(h2) = self.h2.as_mut() {
            loop {
                match h2.next(self.idle, self.deadline).await {
                    Ok(Some(piece)) if piece.is_empty() => {}
                    Ok(Some(piece)) => {
                        out.extend_from_slice(&piece);
                        return Ok(true);
                    }
                    Ok(None) => {
                        self.is_finished = true;
                        self.h2 = None;
                        return Ok(false);
                    }
                    Err(e) => {
                        // Dropping the stream resets it; the connection carries on.
                        self.h2 = None;
                        return Err(e);
                    }
                }
            }
        }
        let before = out.len();
        if !self.early.is_empty() {
            let early = std::mem::take(&mut self.early);
            let progress = self
                .decoder
                .decode(&early, &mut |d: &[u8]| out.extend_from_slice(d))
                .map_err(error::protocol_error)?;
            self.has_leftover = progress.consumed < early.len();
        }
        loop {
            if self.decoder.is_done() {
                self.finish(false);
                return Ok(out.len() > before);
            }
            if out.len() > before {
                return Ok(true);
            }
            let Some(conn) = self.conn.as_mut() else {
                return Ok(false);
            };
            let idle_end = crate::timer::now().checked_add(self.idle);
            if !matches!(self.framing, ResponseFraming::Chunked) {
                // A body without chunk framing is relayed byte for byte: read it straight into
                // the caller's buffer instead of copying it out of the connection's.
                let (at, expired) = limit(idle_end, TimeoutType::Idle, self.deadline);
                // Never much more room than the rest of a declared body: a small body costs a
                // small buffer. One byte more than the rest, so that a TLS read that filled the
                // room does not leave the pool unsure whether rustls holds more.
                let want = self.decoder.remaining().map_or(READ_BUF_BYTES, |r| {
                    usize::try_from(r)
                        .unwrap_or(usize::MAX)
                        .saturating_add(1)
                        .min(READ_BUF_BYTES)
                });
                let n = match within(at, conn.read_append(out, want)).await {
                    Some(Ok(n)) => n,
                    Some(Err(e)) => {
                        self.conn = None;
                        return Err(read_error(&e, Stage::ResponseBody));
                    }
                    None => {
                        self.conn = None;
                        return Err(error::timeout(expired, Stage::ResponseBody));
                    }
                };
                if n == 0 {
                    if self.decoder.is_complete_at_eof() {
                        self.finish(true);
                        return Ok(out.len() > before);
                    }
                    self.conn = None;
                    return Err(error::reset(
                        Stage::ResponseBody,
                        "the connection closed before the response body was complete",
                    ));
                }
                let fresh = out.len() - n;
                let progress = self
                    .decoder
                    .decode(out.get(fresh..).unwrap_or_default(), &mut |_| {})
                    .map_err(error::protocol_error)?;
                if progress.consumed < n {
                    // Bytes past the declared length are not the body's.
                    out.truncate(fresh + progress.consumed);
                    self.has_leftover = true;
                }
                continue;
            }
            let (at, expired) = limit(idle_end, TimeoutType::Idle, self.deadline);
            let chunk = match within(at, conn.read_some()).await {
                Some(Ok(chunk)) => chunk,
                Some(Err(e)) => {
                    self.conn = None;
                    return Err(read_error(&e, Stage::ResponseBody));
                }
                None => {
                    self.conn = None;
                    return Err(error::timeout(expired, Stage::ResponseBody));
                }
            };
            if chunk.is_empty() {
                if self.decoder.is_complete_at_eof() {
                    self.finish(true);
                    return Ok(out.len() > before);
                }
                self.conn = None;
                return Err(error::reset(
                    Stage::ResponseBody,
                    "the connection closed before the response body was complete",
                ));
            }
            let progress = self
                .decoder
                .decode(chunk, &mut |d: &[u8]| out.extend_from_slice(d))
                .map_err(error::protocol_error)?;
            self.has_leftover = progress.consumed < chunk.len();
        }
    }

    /// Whether [`ResponseBodyReader::splice_into`] can move the rest of the body: a plain
    /// HTTP/1.1 connection and a `Content-Length` body with at least `SPLICE_MIN_BYTES` left,
    /// none of it held in user space (after [`ResponseBodyReader::take_early`]).
    pub fn can_splice(&self) -> bool {
        self.early.is_empty() && self.expects_splice()
    }

    /// What [`ResponseBodyReader::can_splice`] will say once the early bytes are taken
    /// ([`ResponseBodyReader::take_early`]), so whether the server need keep no room for the
    /// body: its rules but the early bytes', which count as taken, the body left beyond them
    /// being what would be spliced.
    pub fn expects_splice(&self) -> bool {
        let early = self.early.len() as u64;
        !self.is_finished
            && self.h2.is_none()
            && !self.has_leftover
            && matches!(self.framing, ResponseFraming::ContentLength(_))
            && self
                .decoder
                .remaining()
                .is_some_and(|r| r.saturating_sub(early) >= SPLICE_MIN_BYTES)
            && self.conn.as_ref().is_some_and(|c| c.is_plain())
    }

    /// Moves the rest of the body straight from the destination's socket to `client` with
    /// `splice(2)` (`crate::splice`), never reading a byte past it; returns the bytes that
    /// reached `client`. Each wait for the destination is bounded by the idle limit and the
    /// deadline, each wait for `client` by `write_timeout`. At the end a reusable connection
    /// goes back to the pool, as after [`ResponseBodyReader::read_into`]; on an error it is
    /// closed. Only when [`ResponseBodyReader::can_splice`] says so; `Ok(0)` otherwise. The
    /// bytes that reached `client` are also counted in `moved` as they go, so that a splice
    /// that fails or is dropped halfway still tells how much it moved. `at_body_end` is called
    /// once the body's last byte has been read from the destination, before it is written to
    /// `client`.
    pub async fn splice_into(
        &mut self,
        client: &TcpStream,
        write_timeout: std::time::Duration,
        moved: &std::cell::Cell<u64>,
        at_body_end: &mut dyn FnMut(),
    ) -> std::io::Result<u64> {
        if !self.can_splice() {
            return Ok(0);
        }
        let left = self.decoder.remaining().unwrap_or(0);
        let (idle, deadline) = (self.idle, self.deadline);
        let Some(conn) = self.conn.as_mut() else {
            return Ok(0);
        };
        let before = moved.get();
        let (from, mut pipe) = match (conn.plain_for_splice(), splice::PooledPipe::take()) {
            (Ok(Some(from)), Ok(pipe)) => (from, pipe),
            // Nothing moved yet: the caller reads and writes the rest instead.
            (Ok(None), _) => return Ok(0),
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!(error = %e, "response body cannot splice: copying");
                return Ok(0);
            }
        };
        let read_until = || {
            let idle_end = crate::timer::now().checked_add(idle);
            Some(limit(idle_end, TimeoutType::Idle, deadline).0)
        };
        let outcome = splice::pump(
            from,
            client,
            &mut pipe,
            Some(left),
            read_until,
            Some(write_timeout),
            moved,
            at_body_end,
        )
        .await;
        let moved = moved.get().saturating_sub(before);
        match outcome {
            Ok(()) => {
                self.decoder
                    .count_moved(moved)
                    .map_err(|e| std::io::Error::other(e.as_str()))?;
                // The splice took exactly the body: anything already behind it is not a
                // response to a request we sent, and the connection must not be reused.
                if conn.idle_state() != crate::fd::PeerState::Quiet {
                    self.has_leftover = true;
                }
                self.finish(false);
                Ok(moved)
            }
            Err(e) => {
                self.conn = None;
                Err(match e {
                    splice::MoveError::Source(e) => {
                        std::io::Error::other(format!("destination response body: {e}"))
                    }
                    splice::MoveError::SourceTimeout => std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "destination response body: no byte within the idle limit",
                    ),
                    splice::MoveError::Sink(e) => e,
                })
            }
        }
    }

    fn finish(&mut self, is_eof: bool) {
        self.is_finished = true;
        let Some(conn) = self.conn.take() else { return };
        // Reuse needs a cleanly ended body with nothing after it (see `client.rs`).
        let is_reusable = self.is_keep_alive
            && !is_eof
            && !self.has_leftover
            && self.framing != ResponseFraming::CloseDelimited
            && conn.is_plaintext_drained();
        if let (true, Some(key)) = (is_reusable, self.key.take()) {
            self.home.pool.put(&key, conn, crate::timer::now());
        }
    }
}

impl Egress {
    /// Performs one streamed exchange: connects (or reuses a pooled connection), writes the
    /// head and the body from `body`, and returns once the response head is read.
    ///
    /// Failures are the registry errors of [`Egress::execute`]; an error of `body` is
    /// returned as it is, and a source that yields more or fewer bytes than it declared fails
    /// with `stream_upload_aborted`. Dropping the future closes the connection it holds.
    pub async fn open<B: BodySource>(
        &self,
        req: &StreamRequest<'_>,
        body: &mut B,
    ) -> Result<StreamedResponse, ApiError> {
        self.open_inner(req, None, None, body).await
    }

    /// [`Egress::open`] on a fingerprinted connection: `profile`'s ClientHello and HTTP/2
    /// start, the caller's headers in the profile's order (decision 082). `None` is
    /// [`Egress::open`].
    pub async fn open_fingerprinted<B: BodySource>(
        &self,
        req: &StreamRequest<'_>,
        profile: Option<&'static Profile>,
        body: &mut B,
    ) -> Result<StreamedResponse, ApiError> {
        let Some(p) = profile else {
            return self.open_inner(req, None, None, body).await;
        };
        let order = p.order_headers(req.headers.iter().map(|(n, _)| *n));
        let headers: Vec<(&str, &[u8])> = order
            .iter()
            .filter_map(|&i| req.headers.get(i).copied())
            .collect();
        let ordered = StreamRequest {
            headers: &headers,
            ..*req
        };
        self.open_inner(&ordered, Some(p), None, body).await
    }

    /// [`Egress::open`] on a connection to `ip`, whatever the URL's host resolves to; the host
    /// still names the destination in `Host` and SNI, and `ip` must pass the request's policy.
    /// Direct connections only: `req.via` must be `None`. Pooled connections are shared with
    /// requests to the same host only when their peer passes the same policy.
    pub async fn open_at<B: BodySource>(
        &self,
        req: &StreamRequest<'_>,
        ip: IpAddr,
        body: &mut B,
    ) -> Result<StreamedResponse, ApiError> {
        debug_assert!(req.via.is_none(), "open_at connects directly");
        self.open_inner(req, None, Some(ip), body).await
    }

    async fn open_inner<B: BodySource>(
        &self,
        req: &StreamRequest<'_>,
        profile: Option<&'static Profile>,
        connect_to: Option<IpAddr>,
        body: &mut B,
    ) -> Result<StreamedResponse, ApiError> {
        let length = body.length();
        let head = stream_head(req, length)?;
        // For the pool's idle ages and the proxy endpoints' health: the coarse clock serves.
        let started = crate::timer::now();
        let via = req.via.map(|r| (r, r.choose(started)));
        let key = PoolKey {
            worker_id: req.worker_id.clone(),
            scheme: req.url.scheme,
            host: req.url.host.clone(),
            port: req.url.port,
            bind: req.bind_address,
            via: via.map(|(r, i)| r.key(i)),
            profile: profile.map(|p| p.name),
        };
        let dial = Dial {
            url: req.url,
            bind_address: req.bind_address,
            policy: req.policy,
            timeouts: &req.timeouts,
            deadline: req.deadline,
            via,
            tenant: req.tenant,
            profile,
            connect_to,
        };
        let is_replayable = req.is_replayable && length == BodyLength::None;
        let mut attempt = Streamed {
            egress: self,
            req,
            head,
            length,
            body,
            key: &key,
        };
        self.run_attempts(&key, dial, started, is_replayable, &mut attempt)
            .await
    }

    /// The head of a streamed exchange over HTTP/2.
    async fn open_h2<B: BodySource>(
        &self,
        conn: &Rc<H2Conn>,
        req: &StreamRequest<'_>,
        length: BodyLength,
        body: &mut B,
    ) -> Result<H2Head, H2Failure> {
        let fields = req.headers.iter().map(|(n, v)| (*n, *v));
        let head = h2conn::request_head(req.method, req.url, fields, length).map_err(|error| {
            H2Failure {
                error,
                retry: Retry::No,
            }
        })?;
        let sent = h2conn::send(conn, head, length, body, &req.timeouts, req.deadline).await?;
        h2conn::response_head(sent, req.method, &req.timeouts, req.deadline).await
    }

    /// Opens a TCP connection to `host:port` for a tunnel: resolution on the resolver thread,
    /// the destination policy on every address right before it is dialled, `bind_address` as
    /// the source, `connect_limit` per attempt and `deadline` overall; DNS lookups count
    /// against `tenant`'s share of the resolver.
    #[allow(clippy::too_many_arguments)]
    pub async fn dial(
        &self,
        host: &Host,
        port: u16,
        bind_address: Option<IpAddr>,
        policy: &DestinationPolicy,
        connect_limit: std::time::Duration,
        deadline: Instant,
        tenant: Tenant,
    ) -> Result<(TcpStream, SocketAddr), ApiError> {
        let (url, timeouts) = tunnel_target(host, port, connect_limit);
        self.dial_tcp(&Dial {
            url: &url,
            bind_address,
            policy,
            timeouts: &timeouts,
            deadline,
            via: None,
            tenant,
            profile: None,
            connect_to: None,
        })
        .await
    }
}

/// The destination and stage limits of a tunnel to `host:port`: only the address and the
/// connect limit matter, nothing is sent over HTTP.
pub(crate) fn tunnel_target(
    host: &Host,
    port: u16,
    connect_limit: std::time::Duration,
) -> (TargetUrl, Timeouts) {
    let url = TargetUrl {
        scheme: Scheme::Http,
        host: host.clone(),
        port,
        has_explicit_port: true,
        path_and_query: "/".into(),
    };
    let timeouts = Timeouts {
        connect: connect_limit,
        ..Timeouts::default()
    };
    (url, timeouts)
}

/// The address a response is reported from when its connection already went back to the pool.
fn dial_peer(req: &StreamRequest<'_>) -> SocketAddr {
    SocketAddr::new(IpAddr::from([0, 0, 0, 0]), req.url.port)
}

/// The request head of a streamed exchange ([`client::head_to`]).
fn stream_head(req: &StreamRequest<'_>, length: BodyLength) -> Result<Vec<u8>, ApiError> {
    let framing = match length {
        BodyLength::None => client::empty_body_framing(req.method),
        BodyLength::Known(n) => OutgoingBody::ContentLength(n),
        BodyLength::Chunked => OutgoingBody::Chunked,
    };
    client::head_to(req.method, req.url, req.headers.iter().copied(), framing)
}

/// Sends the head and the body, then reads the final response head. Returns the head and the
/// body bytes that came with it. `head` comes back after its write for the next attempt; a write
/// cut short by a timeout loses it, and the next attempt writes it again.
async fn exchange_head<B: BodySource>(
    conn: &mut Conn,
    req: &StreamRequest<'_>,
    head: &mut Vec<u8>,
    length: BodyLength,
    body: &mut B,
) -> Result<(client::Head, Bytes), Failure> {
    let before = |error| Failure {
        error,
        is_before_response: true,
    };
    let during = |error| Failure {
        error,
        is_before_response: false,
    };
    if head.is_empty() {
        *head = stream_head(req, length).map_err(before)?;
    }
    if length == BodyLength::None && head.len() <= crate::send_ahead::MAX_SENT_AHEAD_BYTES {
        if let Some(writer) = conn.take_writer() {
            return head_with_answer(conn, writer, req, head).await;
        }
    }
    let (written, data) = write_from(conn, req, std::mem::take(head)).await;
    *head = data;
    written.map_err(before)?;
    let mut sent = 0u64;
    // Once body bytes are out, a failure is no longer a harmless stale-connection race.
    while let Some(piece) = body.next_chunk().await.map_err(during)? {
        if piece.is_empty() {
            continue;
        }
        sent = sent.saturating_add(piece.len() as u64);
        let data = match length {
            BodyLength::Chunked => {
                let mut framed = Vec::with_capacity(piece.len() + 20);
                write_chunk_header(&mut framed, piece.len() as u64);
                framed.extend_from_slice(&piece);
                framed.extend_from_slice(CHUNK_DATA_END);
                Bytes::from(framed)
            }
            BodyLength::Known(n) if sent > n => return Err(during(upload_mismatch())),
            BodyLength::None => return Err(during(upload_mismatch())),
            BodyLength::Known(_) => piece,
        };
        write(conn, req, data).await.map_err(during)?;
    }
    match length {
        BodyLength::Chunked => write(conn, req, Bytes::from_static(LAST_CHUNK))
            .await
            .map_err(during)?,
        BodyLength::Known(n) if sent != n => return Err(during(upload_mismatch())),
        _ => {}
    }
    answer_head(conn, req, header_limit(req)).await
}

/// When the answer's head must be in: the response header timeout, within the deadline.
fn header_limit(req: &StreamRequest<'_>) -> (Instant, error::Expired) {
    let header_end = req
        .timeouts
        .response_header
        .and_then(|t| crate::timer::now().checked_add(t));
    limit(header_end, TimeoutType::ResponseHeader, req.deadline)
}

/// Reads the answer's head by `limit`, with the bytes of its body that came with it.
async fn answer_head(
    conn: &mut Conn,
    req: &StreamRequest<'_>,
    (at, expired): (Instant, error::Expired),
) -> Result<(client::Head, Bytes), Failure> {
    let mut buf = Vec::new();
    // What a splicing caller's small reads leave of a large body goes on to the client in
    // [`ResponseBodyReader::splice_into`].
    let read_bytes = client::head_read_bytes(conn, req.may_splice);
    // Pinned where it is built, not copied into the limit.
    let read = std::pin::pin!(client::read_head(conn, req.method, &mut buf, read_bytes));
    match within(at, read).await {
        Some(head) => {
            let mut head = head?;
            let early = std::mem::take(&mut head.rest);
            Ok((head, early))
        }
        None => Err(Failure {
            error: error::timeout(expired, Stage::ResponseHeader),
            is_before_response: false,
        }),
    }
}

/// A request without a body on plain TCP under io_uring (decision 124): its head is sent on the
/// connection's second descriptor while the answer is read ([`Conn::send_with_answer`]): one
/// wake-up per exchange fewer, and one limit (the answer's) for both.
async fn head_with_answer(
    conn: &mut Conn,
    writer: Box<monoio::net::TcpStream>,
    req: &StreamRequest<'_>,
    head: &mut Vec<u8>,
) -> Result<(client::Head, Bytes), Failure> {
    let limit = header_limit(req);
    let (answer, sent) = conn
        .send_with_answer(
            writer,
            std::mem::take(head),
            limit.0,
            async |c: &mut Conn| answer_head(c, req, limit).await,
        )
        .await;
    let broke = || Failure {
        error: error::request_write_broke(),
        is_before_response: true,
    };
    match sent {
        Sent::Whole(data) => {
            *head = data;
            answer
        }
        // As when the send goes first: a failure before the answer (a head the socket did not
        // take whole, or a failed send).
        Sent::Short(_, data) => {
            *head = data;
            Err(broke())
        }
        Sent::Failed => Err(broke()),
        // Not sent by the answer's limit: that limit's failure, or the answer's own.
        Sent::NotDone => answer.and_then(|_| Err(broke())),
    }
}

/// Writes `data` within the idle limit and the deadline.
async fn write(conn: &mut Conn, req: &StreamRequest<'_>, data: Bytes) -> Result<(), ApiError> {
    write_from(conn, req, data).await.0
}

/// [`write`] that gives `data` back, written or not; an empty buffer when the write timed out
/// (the cancelled write took it).
async fn write_from<T>(
    conn: &mut Conn,
    req: &StreamRequest<'_>,
    data: T,
) -> (Result<(), ApiError>, T)
where
    T: monoio::buf::IoBuf + AsRef<[u8]> + Default + 'static,
{
    let idle_end = crate::timer::now().checked_add(req.timeouts.idle);
    let (at, expired) = limit(idle_end, TimeoutType::Idle, req.deadline);
    let write = std::pin::pin!(conn.write_all_from(data));
    let (res, data) = match within(at, write).await {
        Some(done) => done,
        None => {
            return (
                Err(error::timeout(expired, Stage::RequestWrite)),
                T::default(),
            )
        }
    };
    let res = match res {
        Ok(()) => Ok(()),
        Err(e) if error::is_tls_error(&e) => Err(error::tls_failure(&e)),
        Err(_) => Err(error::request_write_broke()),
    };
    (res, data)
}

fn upload_mismatch() -> ApiError {
    ApiError::new(
        ErrorCode::StreamUploadAborted,
        "the request body did not match its declared length",
    )
}

/// The streamed exchange of [`Egress::open`]: the request body from its source, the answer at
/// the response head with a reader for the body.
struct Streamed<'a, 'r, B> {
    egress: &'a Egress,
    req: &'a StreamRequest<'r>,
    /// The HTTP/1.1 request head, written by each attempt and given back by its write; empty
    /// after a write that timed out, and then made again.
    head: Vec<u8>,
    length: BodyLength,
    body: &'a mut B,
    key: &'a PoolKey,
}

impl<B: BodySource> Attempt for Streamed<'_, '_, B> {
    type Output = StreamedResponse;

    async fn over_h2(
        &mut self,
        c: &Rc<H2Conn>,
        got: Obtained,
    ) -> Result<StreamedResponse, H2Failure> {
        let head = self
            .egress
            .open_h2(c, self.req, self.length, self.body)
            .await?;
        let framing = head.framing;
        let is_finished = framing == ResponseFraming::None;
        let decoder =
            BodyDecoder::for_response(ResponseFraming::None, BodyLimits::with_max_body(0))
                .map_err(|e| H2Failure {
                    error: error::protocol_error(e),
                    retry: Retry::No,
                })?;
        Ok(StreamedResponse {
            status: head.status,
            headers: head.headers,
            peer_addr: c.peer(),
            connect_ms: got.connect_ms,
            is_connection_reused: got.is_reused,
            body: Box::new(ResponseBodyReader {
                conn: None,
                h2: (!is_finished).then_some(head.body),
                decoder,
                framing,
                early: Bytes::new(),
                is_keep_alive: false,
                has_leftover: false,
                is_finished,
                deadline: self.req.deadline,
                idle: self.req.timeouts.idle,
                home: self.egress.inner.clone(),
                key: None,
            }),
        })
    }

    async fn over_h1(
        &mut self,
        mut conn: Conn,
        got: Obtained,
    ) -> Result<StreamedResponse, Failure> {
        let (head, early) =
            exchange_head(&mut conn, self.req, &mut self.head, self.length, self.body).await?;
        let decoder = BodyDecoder::for_response(head.framing, BodyLimits::with_max_body(u64::MAX))
            .map_err(|e| Failure {
                error: error::protocol_error(e),
                is_before_response: false,
            })?;
        let is_finished = decoder.is_done() && early.is_empty();
        // Built straight into its box: on the stack first, it would be copied into it.
        let mut reader = Box::write(
            Box::new_uninit(),
            ResponseBodyReader {
                conn: Some(conn),
                h2: None,
                decoder,
                framing: head.framing,
                early,
                is_keep_alive: head.is_keep_alive,
                has_leftover: false,
                is_finished: false,
                deadline: self.req.deadline,
                idle: self.req.timeouts.idle,
                home: self.egress.inner.clone(),
                key: Some(self.key.clone()),
            },
        );
        if is_finished {
            // No body at all (HEAD, 204, 304, `Content-Length: 0`): the connection is ready for
            // the pool right away.
            reader.finish(false);
        }
        let peer_addr = reader
            .conn
            .as_ref()
            .map_or(dial_peer(self.req), |c| c.peer());
        Ok(StreamedResponse {
            status: head.status,
            headers: head.headers,
            peer_addr,
            connect_ms: got.connect_ms,
            is_connection_reused: got.is_reused,
            body: reader,
        })
    }

    /// A streamed body already taken from its source cannot be sent again; `NotSent` means
    /// none was.
    fn may_resend_unprocessed(&self, f: &H2Failure) -> bool {
        f.retry == Retry::NotSent || self.length == BodyLength::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sortie_core::request::parse_target_url;

    #[test]
    fn heads_by_body_length() {
        let url = parse_target_url("http://a.example:8080/p?q=1").unwrap();
        let policy = DestinationPolicy::default();
        let worker = ConfigId::parse("w").unwrap();
        let headers: &[(&str, &[u8])] = &[
            ("Accept", b"*/*"),
            ("Proxy-Authorization", b"Basic x"),
            ("X-Service-Route-Tags", b"a"),
            ("X-Dup", b"1"),
            ("X-Dup", b"2"),
        ];
        let req = |method| StreamRequest {
            method,
            url: &url,
            headers,
            deadline: Instant::now(),
            timeouts: Timeouts::default(),
            policy: &policy,
            worker_id: &worker,
            bind_address: None,
            is_replayable: false,
            via: None,
            tenant: None,
            may_splice: false,
        };
        let prefix = "Host: a.example:8080\r\nAccept: */*\r\nX-Dup: 1\r\nX-Dup: 2\r\n\
                      Connection: keep-alive\r\n";
        let table = [
            (Method::Get, BodyLength::None, "GET", ""),
            (
                Method::Post,
                BodyLength::None,
                "POST",
                "Content-Length: 0\r\n",
            ),
            (
                Method::Put,
                BodyLength::Known(7),
                "PUT",
                "Content-Length: 7\r\n",
            ),
            (
                Method::Post,
                BodyLength::Chunked,
                "POST",
                "Transfer-Encoding: chunked\r\n",
            ),
        ];
        for (method, length, name, framing) in table {
            let got = String::from_utf8(stream_head(&req(method), length).unwrap()).unwrap();
            assert_eq!(
                got,
                format!("{name} /p?q=1 HTTP/1.1\r\n{prefix}{framing}\r\n")
            );
        }
    }

    /// Before the early bytes are taken, `expects_splice` says what `can_splice` will say after:
    /// a plain `Content-Length` body whose rest beyond them is at least `SPLICE_MIN_BYTES`.
    #[test]
    fn a_splice_is_expected_from_the_body_left_past_the_early_bytes() {
        let resolver = crate::dns::ResolverPool::start().unwrap();
        crate::runtime::run_on(crate::runtime::Driver::detect(), async move {
            let tls = crate::egress::client_config(None).unwrap();
            let egress = Egress::new(crate::dns::Resolver::new(resolver), &tls);
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let reader = |len: u64, early: usize, conn: Conn| {
                let framing = ResponseFraming::ContentLength(len);
                ResponseBodyReader {
                    conn: Some(conn),
                    h2: None,
                    decoder: BodyDecoder::for_response(
                        framing,
                        BodyLimits::with_max_body(u64::MAX),
                    )
                    .unwrap(),
                    framing,
                    early: Bytes::from(vec![b'x'; early]),
                    is_keep_alive: true,
                    has_leftover: false,
                    is_finished: false,
                    deadline: Instant::now(),
                    idle: std::time::Duration::from_secs(1),
                    home: egress.inner.clone(),
                    key: None,
                }
            };
            let min = SPLICE_MIN_BYTES as usize;
            // (body length, early bytes, expected)
            for (len, early, expected) in [
                (64 * 1024, 4000, true),
                (min + 4000, 4000, true),
                (min + 3999, 4000, false),
                (64 * 1024, 0, true),
                (1024, 1024, false),
            ] {
                let stream = monoio::net::TcpStream::connect(addr).await.unwrap();
                let (_server, _) = listener.accept().unwrap();
                let mut r = reader(len as u64, early, Conn::plain(stream, addr));
                assert_eq!(r.expects_splice(), expected, "{len} bytes, {early} early");
                assert_eq!(
                    r.can_splice(),
                    expected && early == 0,
                    "before the early bytes"
                );
                let _ = r.take_early();
                assert_eq!(r.can_splice(), expected, "{len} bytes, {early} taken");
                assert_eq!(r.expects_splice(), r.can_splice(), "after the early bytes");
            }
        });
    }

    #[test]
    fn bytes_are_a_body_source() {
        crate::runtime::run_on(crate::runtime::Driver::detect(), async {
            let mut b = Bytes::from_static(b"abc");
            assert_eq!(b.length(), BodyLength::Known(3));
            assert_eq!(b.next_chunk().await.unwrap().unwrap(), &b"abc"[..]);
            assert_eq!(b.next_chunk().await.unwrap(), None);
            assert_eq!(Bytes::new().length(), BodyLength::None);
        });
    }
}
