//! The egress executor's upstream HTTP client: performs exactly one upstream request for a
//! validated request, over plain TCP or TLS, reusing per-core keep-alive connections. Over TLS
//! it offers HTTP/2 and HTTP/1.1 and speaks what the destination chooses (`h2conn.rs`,
//! decision 080); the envelope is the same either way.
//!
//! One [`Egress`] per hot core (it is not `Send`): it owns the core's DNS cache, a TLS
//! connector and the keep-alive pool. [`Egress::execute`] resolves the host (IP literals skip
//! DNS), checks every address against the destination policy right before dialling it, connects
//! (optionally from a source address), runs the TLS handshake for `https`, writes the request
//! and reads the whole response into memory under the response body limit. [`Egress::open`]
//! (`streaming.rs`) is the streamed form over the same pool: a request body from a
//! [`BodySource`], the response head first, then its body through a [`ResponseBodyReader`].
//!
//! Every failure is one registry error:
//!
//! | failure | code | timeout_type |
//! |---|---|---|
//! | name does not resolve, resolver saturated | `upstream_dns_failure` | |
//! | every resolved address denied by the policy | `destination_denied` | |
//! | connection refused, network or host unreachable | `upstream_connection_refused` | |
//! | per-attempt connect or TLS handshake limit | `upstream_connect_timeout` | `connect_timeout` |
//! | handshake or certificate failure, TLS error later | `upstream_tls_failure` | |
//! | reset or EOF before the response is complete | `upstream_reset` | |
//! | malformed response, 101, too many 1xx | `protocol_error` (`side: upstream`) | |
//! | response body over `max_response_body_bytes` | `body_too_large` (`direction: response`) | |
//! | no complete head within `response_header` | `timeout_exceeded` | `response_header_timeout` |
//! | no bytes moved for `idle` | `timeout_exceeded` | `idle_timeout` |
//! | the total deadline, at any stage | `timeout_exceeded` | the stage's: `connect_timeout`, `upload_timeout`, `response_header_timeout`, `download_timeout`; `total_deadline_timeout` during name resolution |
//! | source address unusable, sockets exhausted | `executor_internal_error` | |
//!
//! HTTP/2 stream and connection failures (`GOAWAY`, `RST_STREAM`, flow control, protocol
//! violations) map as decision 080's table says; they carry an `h2_error` detail.
//!
//! Timeouts and resets carry a `stage` detail (`dns`, `connect`, `tls_handshake`,
//! `request_write`, `response_header`, `response_body`).
//!
//! Cancellation: dropping the future of [`Egress::execute`] closes the connection it holds. A
//! connection goes back to the pool only after a response was read to its end with keep-alive
//! allowed on both sides and nothing left over, so the pool never holds a connection in an
//! unknown state.
//!
//! This module is on the per-request path: no blocking, no locks, no logging above debug.

mod client;
mod connect;
mod error;
mod fields;
pub mod fingerprint;
mod h2conn;
mod pool;
mod stream;
mod streaming;
mod tls;
mod upstream_proxy;

use std::net::{IpAddr, SocketAddr};
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use monoio_rustls::TlsConnector;
use rustls::ClientConfig;
use sortie_core::destination::DestinationPolicy;
use sortie_core::error::{ApiError, ErrorCode};
use sortie_core::fingerprint::profile::Profile;
use sortie_core::limits::DEFAULT_MAX_INLINE_RESPONSE_BODY_BYTES;
use sortie_core::request::{Header, Method, Scheme, TargetUrl};
use sortie_core::snapshot::ConfigId;

pub use client::{COALESCE_BODY_BYTES, MAX_INTERIM_RESPONSES};
#[cfg(test)]
pub(crate) use fields::parsed as parsed_fields;
pub use fields::{FieldSpans, ResponseFields};
pub use h2conn::{H2_CONNECTION_WINDOW, H2_MAX_HEADER_LIST_BYTES, H2_STREAM_WINDOW};
pub use pool::{
    PoolLimits, POOL_IDLE_TIMEOUT, POOL_MAX_IDLE_PER_KEY, POOL_MAX_IDLE_TOTAL, POOL_PEEK_AFTER,
    POOL_SWEEP_INTERVAL,
};
pub(crate) use streaming::next_appended;
pub use streaming::{BodyLength, BodySource, ResponseBodyReader, StreamRequest, StreamedResponse};
pub use tls::{client_config, TlsConfigError, ALPN_H2, ALPN_HTTP11, RESUMPTION_SESSIONS_PER_CORE};
pub use upstream_proxy::{
    EndpointHealth, EndpointHealthView, HealthRegistry, ProxyPool, ProxyRoute, TunnelStream,
};

use self::client::{Exchange, Failure};
use self::connect::within;
use self::error::{Expired, Stage};
use self::h2conn::{Acquire, H2Conn, H2Failure, H2Pool, Retry};
use self::pool::{Pool, PoolKey};
use self::stream::Conn;
use crate::dns::{Resolver, Tenant};

/// Limit of one connect attempt (TCP, and again for the TLS handshake), never past the total
/// deadline.
/// `egress.connect_timeout_ms` sets it per process.
pub const CONNECT_TIMEOUT: Duration =
    Duration::from_millis(sortie_core::limits::DEFAULT_EGRESS_CONNECT_TIMEOUT_MS);
/// Longest time without a byte moving while the request is written or the body is read.
/// `egress.idle_timeout_ms` sets it per process.
pub const IDLE_TIMEOUT: Duration =
    Duration::from_millis(sortie_core::limits::DEFAULT_EGRESS_IDLE_TIMEOUT_MS);

/// The stage limits of one request. Each is cut short by the request's total deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// One connect attempt (per resolved address), and the TLS handshake.
    pub connect: Duration,
    /// From the request sent to a complete response head; `None` waits until the total
    /// deadline.
    pub response_header: Option<Duration>,
    /// Without a byte moving while writing the request or reading the body.
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: CONNECT_TIMEOUT,
            response_header: None,
            idle: IDLE_TIMEOUT,
        }
    }
}

/// One upstream request, as the executor runs it.
#[derive(Debug, Clone)]
pub struct EgressRequest {
    /// The method.
    pub method: Method,
    /// The destination.
    pub url: TargetUrl,
    /// Destination headers in order, duplicates kept. Headers the gateway manages (framing,
    /// hop-by-hop, `Expect`, proxy credentials, `X-Service-*`) are dropped if present.
    pub headers: Vec<Header>,
    /// The request body; empty for none.
    pub body: Bytes,
    /// The total deadline of the request.
    pub deadline: Instant,
    /// Stage limits.
    pub timeouts: Timeouts,
    /// The response body limit; beyond it the request fails with `body_too_large`.
    pub max_response_body_bytes: usize,
    /// The destination policy of the snapshot the request runs under.
    pub policy: Arc<DestinationPolicy>,
    /// The worker performing the request; connections are pooled per worker.
    pub worker_id: ConfigId,
    /// The source address of egress connections, when the worker has one.
    pub bind_address: Option<IpAddr>,
    /// Permission for one transport-level retry (spec: `replayable`).
    pub is_replayable: bool,
    /// The pool's upstream proxy, when it does not egress directly.
    pub via: Option<ProxyRoute>,
    /// The deployment the request runs for: its DNS lookups queue and run within its share
    /// of the resolver (decision 045).
    pub tenant: Tenant,
    /// The browser profile to connect with (a profile this process verified); `None` for
    /// ordinary TLS.
    pub fingerprint: Option<&'static Profile>,
}

impl EgressRequest {
    /// A request without headers or body, with the default stage limits, the default inline
    /// response limit, worker `local`, no source address, not replayable.
    pub fn new(
        method: Method,
        url: TargetUrl,
        deadline: Instant,
        policy: Arc<DestinationPolicy>,
    ) -> EgressRequest {
        EgressRequest {
            method,
            url,
            headers: Vec::new(),
            body: Bytes::new(),
            deadline,
            timeouts: Timeouts::default(),
            max_response_body_bytes: DEFAULT_MAX_INLINE_RESPONSE_BODY_BYTES,
            policy,
            worker_id: ConfigId::parse("local").unwrap_or_else(|_| unreachable!()),
            bind_address: None,
            is_replayable: false,
            via: None,
            tenant: None,
            fingerprint: None,
        }
    }
}

/// A response read completely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressResponse {
    /// The destination's status.
    pub status: u16,
    /// Response header fields as received: names as spelled, raw values, order and duplicates
    /// kept (hop-by-hop and framing fields included; the caller decides what to relay).
    pub headers: ResponseFields,
    /// The first bytes of the body when [`Egress::execute_split`] returned it; empty from
    /// [`Egress::execute`].
    pub body_start: Bytes,
    /// The decoded body (chunked coding removed), or its rest after `body_start`.
    pub body: Vec<u8>,
    /// The address the response came from.
    pub peer_addr: SocketAddr,
    /// Milliseconds spent on DNS, TCP and TLS for this request; 0 on a reused connection.
    pub connect_ms: u64,
    /// Whether the response came over a pooled connection.
    pub is_connection_reused: bool,
}

struct Inner {
    resolver: Resolver,
    /// Through upstream proxies: HTTP/1.1 only.
    tls: TlsConnector,
    /// Direct connections: ALPN `h2` and `http/1.1`.
    tls_direct: tokio_rustls::TlsConnector,
    pool: Pool,
    /// HTTP/2 connections, one per key.
    h2: H2Pool,
    idle_timeout: Duration,
}

/// The upstream client of one core. Cheap to clone (clones share the pool); not `Send`.
#[derive(Clone)]
pub struct Egress {
    inner: Rc<Inner>,
}

impl Egress {
    /// The client of one core with the default pool limits. `tls` is the process-wide
    /// configuration from [`client_config`]; the core keeps its own resumption cache.
    pub fn new(resolver: Resolver, tls: &Arc<ClientConfig>) -> Egress {
        Egress::with_pool_limits(resolver, tls, PoolLimits::default())
    }

    /// The client of one core with the given pool limits. Unless
    /// [`PoolLimits::sweep_interval`] is zero, it starts the core's sweep timer, a task that
    /// closes expired and peer-closed idle connections and ends with the last clone of the
    /// client; it must then be called on a monoio runtime with timers enabled.
    pub fn with_pool_limits(
        resolver: Resolver,
        tls: &Arc<ClientConfig>,
        limits: PoolLimits,
    ) -> Egress {
        let inner = Rc::new(Inner {
            resolver,
            tls: tls::per_core_connector(tls),
            tls_direct: tls::per_core_direct_connector(tls),
            pool: Pool::new(limits),
            h2: H2Pool::default(),
            idle_timeout: limits.idle_timeout,
        });
        if !limits.sweep_interval.is_zero() {
            monoio::spawn(sweep_every(limits.sweep_interval, Rc::downgrade(&inner)));
        }
        Egress { inner }
    }

    /// Performs the request: one upstream exchange, plus at most one retry on a fresh
    /// connection when a reused connection broke before any response byte and the request is
    /// replayable (or, over HTTP/2, when the server provably did not process the stream). The
    /// whole body is in [`EgressResponse::body`].
    pub async fn execute(&self, req: &EgressRequest) -> Result<EgressResponse, ApiError> {
        let mut r = self.execute_split(req).await?;
        if !r.body_start.is_empty() {
            let start = std::mem::take(&mut r.body_start);
            let mut body = Vec::with_capacity(start.len() + r.body.len());
            body.extend_from_slice(&start);
            body.extend_from_slice(&r.body);
            r.body = body;
        }
        Ok(r)
    }

    /// [`Egress::execute`], with the body in two parts: [`EgressResponse::body_start`] (the
    /// bytes that came with the response head, left in the head's buffer) followed by
    /// [`EgressResponse::body`]. Saves copying the start behind the head into the body buffer,
    /// most of a body of some kilobytes; for a caller that can use the body in two pieces.
    pub async fn execute_split(&self, req: &EgressRequest) -> Result<EgressResponse, ApiError> {
        // For the pool's idle ages and the proxy endpoints' health: the coarse clock serves.
        let started = crate::timer::now();
        let via = req.via.as_ref().map(|r| (r, r.choose(started)));
        let key = PoolKey {
            worker_id: req.worker_id.clone(),
            scheme: req.url.scheme,
            host: req.url.host.clone(),
            port: req.url.port,
            bind: req.bind_address,
            via: via.map(|(r, i)| r.key(i)),
            profile: req.fingerprint.map(|p| p.name),
        };
        // A profile sends the caller's headers in the browser's order (decision 082).
        let reordered;
        let headers = match req.fingerprint {
            Some(p) => {
                let order = p.order_headers(req.headers.iter().map(|h| h.name()));
                reordered = order
                    .iter()
                    .filter_map(|&i| req.headers.get(i).cloned())
                    .collect::<Vec<_>>();
                &reordered
            }
            None => &req.headers,
        };
        let mut attempt = Buffered {
            egress: self,
            req,
            headers,
            key: &key,
            head: None,
        };
        self.run_attempts(
            &key,
            Dial::of(req, via),
            started,
            req.is_replayable,
            &mut attempt,
        )
        .await
    }

    /// One buffered exchange over HTTP/2: the whole body under the response limit.
    async fn execute_h2(
        &self,
        conn: &Rc<H2Conn>,
        req: &EgressRequest,
        headers: &[Header],
    ) -> Result<(u16, ResponseFields, Vec<u8>), H2Failure> {
        let no_retry = |error| H2Failure {
            error,
            retry: Retry::No,
        };
        let mut body = req.body.clone();
        let length = streaming::BodySource::length(&body);
        let fields = headers.iter().map(|h| (h.name(), h.value()));
        let head = h2conn::request_head(req.method, &req.url, fields, length).map_err(no_retry)?;
        let sent = h2conn::send(conn, head, length, &mut body, &req.timeouts, req.deadline).await?;
        let mut resp = h2conn::response_head(sent, req.method, &req.timeouts, req.deadline).await?;
        let max = req.max_response_body_bytes;
        let reserve = match resp.framing {
            sortie_core::h1::ResponseFraming::ContentLength(n) => {
                if n > max as u64 {
                    return Err(no_retry(error::response_too_large(max)));
                }
                usize::try_from(n).unwrap_or(0).min(1024 * 1024)
            }
            _ => 0,
        };
        let mut out = Vec::with_capacity(reserve);
        while let Some(piece) = resp
            .body
            .next(req.timeouts.idle, req.deadline)
            .await
            .map_err(no_retry)?
        {
            if out.len().saturating_add(piece.len()) > max {
                return Err(no_retry(error::response_too_large(max)));
            }
            out.extend_from_slice(&piece);
        }
        Ok((resp.status, resp.headers, out))
    }

    /// The connection `key` has at hand: its HTTP/2 connection, or (when `may_reuse` and the
    /// key is not known to speak HTTP/2) a pooled one. Otherwise what [`Egress::obtain`] is to
    /// go on with.
    fn ready(
        &self,
        key: &PoolKey,
        dial: &Dial<'_>,
        may_reuse: bool,
        now: Instant,
    ) -> Result<(Opened, u64, bool), Acquire> {
        match self.inner.h2.acquire(key, dial.policy) {
            Acquire::Conn(c) => Ok((Opened::H2(c), 0, true)),
            Acquire::Unknown if may_reuse => {
                match self.inner.pool.checkout(key, dial.policy, now) {
                    Some(c) => Ok((Opened::Http1(c), 0, true)),
                    // Nothing pooled that passes: a new connection, without looking again.
                    None => Err(Acquire::Unknown),
                }
            }
            other => Err(other),
        }
    }

    /// A connection for `key`: the key's HTTP/2 connection when it has one (waiting, within
    /// the deadline, while another request of this core opens it), else a pooled HTTP/1.1
    /// connection when `may_reuse`, else a new one. Returns it with the milliseconds spent
    /// connecting and whether it existed before.
    ///
    /// The connection the key has at hand (its HTTP/2 connection, or a pooled one) is taken
    /// by [`Egress::ready`] first, without this future: it is what nearly every request gets.
    async fn obtain(
        &self,
        key: &PoolKey,
        dial: Dial<'_>,
        may_reuse: bool,
        now: Instant,
        first: Acquire,
    ) -> Result<(Opened, u64, bool), ApiError> {
        let mut acquired = Some(first);
        loop {
            let acquire = match acquired.take() {
                Some(a) => a,
                None => self.inner.h2.acquire(key, dial.policy),
            };
            let guard = match acquire {
                Acquire::Conn(c) => return Ok((Opened::H2(c), 0, true)),
                Acquire::Wait(rx) => match within(dial.deadline, rx).await {
                    Some(_) => continue,
                    None => return Err(error::timeout(Expired::TotalDeadline, Stage::Connect)),
                },
                Acquire::Dial(g) => Some(g),
                Acquire::Unknown => None,
            };
            if guard.is_none() && may_reuse {
                if let Some(c) = self.inner.pool.checkout(key, dial.policy, now) {
                    return Ok((Opened::Http1(c), 0, true));
                }
            }
            let connect_started = Instant::now();
            // Boxed: connecting (DNS, TCP, TLS handshake) has by far the largest state of the
            // exchange, and the hot path reuses a pooled connection instead.
            let conn = Box::pin(self.connect(dial)).await?;
            if let Opened::H2(c) = &conn {
                match guard {
                    Some(g) => g.finish(c),
                    None => self.inner.h2.register(key.clone(), c),
                }
            }
            return Ok((conn, millis(connect_started.elapsed()), false));
        }
    }

    /// Resolves the host (unless the dial names its address) and opens a TCP connection to the
    /// first address the policy allows.
    async fn dial_tcp(
        &self,
        req: &Dial<'_>,
    ) -> Result<(monoio::net::TcpStream, SocketAddr), ApiError> {
        let addrs = match req.connect_to {
            Some(ip) => vec![ip],
            None => {
                connect::resolve(
                    &self.inner.resolver,
                    &req.url.host,
                    req.deadline,
                    req.tenant,
                )
                .await?
            }
        };
        connect::connect_any(
            &addrs,
            req.url.port,
            req.bind_address,
            req.policy,
            req.timeouts.connect,
            req.deadline,
        )
        .await
    }

    /// Closes idle connections that expired or that their peer closed; the sweep timer calls
    /// this every [`PoolLimits::sweep_interval`]. Returns how many were closed.
    pub fn sweep_idle(&self) -> usize {
        let now = Instant::now();
        self.inner.pool.sweep(now) + self.inner.h2.sweep(now, self.inner.idle_timeout)
    }

    /// Open HTTP/2 connections of this core (one per destination key that chose HTTP/2).
    pub fn h2_connections(&self) -> usize {
        self.inner.h2.len()
    }

    /// Idle connections in this core's pool.
    pub fn idle_connections(&self) -> usize {
        self.inner.pool.len()
    }

    /// Opens a new connection for `req`: DNS, TCP, and TLS for `https`, then the HTTP/2
    /// preface when the destination chose `h2` (within the same limit as the handshake);
    /// through the upstream proxy endpoint when there is one (HTTP/1.1 only, decision 080).
    async fn connect(&self, req: Dial<'_>) -> Result<Opened, ApiError> {
        if let Some((route, i)) = req.via {
            if req.profile.is_some() && req.url.scheme == Scheme::Https {
                // Decision 082: the fingerprinted connector does not run inside proxy tunnels
                // yet; never send an ordinary ClientHello in its place.
                return Err(ApiError::new(
                    ErrorCode::UnsupportedFingerprint,
                    "fingerprint profiles are not applied through upstream proxies",
                ));
            }
            return self.connect_via(route, i, &req).await.map(Opened::Http1);
        }
        let (tcp, peer) = self.dial_tcp(&req).await?;
        match req.url.scheme {
            Scheme::Http => Ok(Opened::Http1(Conn::plain(tcp, peer))),
            Scheme::Https => {
                let name = tls::server_name(&req.url.host)?;
                let attempt_end = Instant::now().checked_add(req.timeouts.connect);
                let (at, expired) = match attempt_end {
                    Some(end) if end < req.deadline => (end, Expired::ConnectAttempt),
                    _ => (req.deadline, Expired::TotalDeadline),
                };
                let handshake = async {
                    if let Some(profile) = req.profile {
                        return connect_fingerprinted(
                            profile,
                            &req.url.host_str(),
                            name,
                            tcp,
                            peer,
                        )
                        .await;
                    }
                    match tls::handshake_negotiating(&self.inner.tls_direct, name, tcp, peer)
                        .await?
                    {
                        tls::Negotiated::Http1(conn) => Ok(Opened::Http1(conn)),
                        tls::Negotiated::H2(stream) => {
                            Ok(Opened::H2(H2Conn::start(*stream, peer, None).await?))
                        }
                    }
                };
                match within(at, handshake).await {
                    Some(conn) => conn,
                    None => Err(error::timeout(expired, Stage::TlsHandshake)),
                }
            }
        }
    }
}

/// The handshake of a fingerprinted connection (BoringSSL with the profile's ClientHello) and,
/// when the destination chooses `h2`, the profile's HTTP/2 start; HTTP/1.1 otherwise.
#[cfg(feature = "fingerprints")]
async fn connect_fingerprinted(
    profile: &'static Profile,
    host: &str,
    name: rustls::pki_types::ServerName<'static>,
    tcp: monoio::net::TcpStream,
    peer: SocketAddr,
) -> Result<Opened, ApiError> {
    use std::os::fd::AsRawFd as _;
    let connectors = fingerprint::connectors().ok_or_else(|| {
        ApiError::new(
            ErrorCode::UnsupportedFingerprint,
            "fingerprint profiles are not verified in this process",
        )
    })?;
    let fd = tcp.as_raw_fd();
    let tcp = tcp
        .try_into_poll_io()
        .map_err(|(e, _)| error::internal(&format!("poll IO: {e}")))?;
    let stream = fingerprint::handshake(connectors, profile, host, name, tcp)
        .await
        .map_err(|e| match e {
            fingerprint::HandshakeError::Setup(s) => error::internal(&s),
            fingerprint::HandshakeError::Tls(s) => error::tls_message(&s),
        })?;
    if fingerprint::is_h2(&stream) {
        return Ok(Opened::H2(
            H2Conn::start(stream, peer, Some(&profile.http2)).await?,
        ));
    }
    Ok(Opened::Http1(Conn::boring(stream, fd, peer)))
}

/// Without the connector no profile is ever verified, so no request gets here.
#[cfg(not(feature = "fingerprints"))]
async fn connect_fingerprinted(
    profile: &'static Profile,
    _host: &str,
    _name: rustls::pki_types::ServerName<'static>,
    _tcp: monoio::net::TcpStream,
    _peer: SocketAddr,
) -> Result<Opened, ApiError> {
    Err(ApiError::new(
        ErrorCode::UnsupportedFingerprint,
        format!(
            "profile {}: {}",
            profile.name,
            fingerprint::UNAVAILABLE_REASON
        ),
    ))
}

/// How a connection was obtained for an attempt.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Obtained {
    /// Milliseconds spent connecting (0 for a pooled connection).
    pub(crate) connect_ms: u64,
    /// Whether the connection came from the pool.
    pub(crate) is_reused: bool,
}

/// One exchange on a connection of the pool, run by [`Egress::run_attempts`] once per attempt:
/// the buffered exchange of [`Egress::execute_split`] and the streamed one of [`Egress::open`].
pub(crate) trait Attempt {
    /// What a successful exchange answers.
    type Output;
    /// The exchange as a stream of an HTTP/2 connection.
    async fn over_h2(
        &mut self,
        conn: &Rc<H2Conn>,
        got: Obtained,
    ) -> Result<Self::Output, H2Failure>;
    /// The exchange on an HTTP/1.1 connection, which is the exchange's from then on (to pool
    /// at a clean end, or to hand to a body reader).
    async fn over_h1(&mut self, conn: Conn, got: Obtained) -> Result<Self::Output, Failure>;
    /// Whether an HTTP/2 stream the server did not process may be sent again; a stream whose
    /// request body was streamed from its source may not unless none of it left.
    fn may_resend_unprocessed(&self, f: &H2Failure) -> bool;
}

impl Egress {
    /// The one upstream retry loop: obtains a connection for `key` (pooled unless a retry
    /// asked for a fresh one) and runs `attempt` on it; sends again at most once after a
    /// reused connection broke before any response byte when the request is replayable, and
    /// at most once after an HTTP/2 stream the server provably did not process.
    pub(crate) async fn run_attempts<A: Attempt>(
        &self,
        key: &PoolKey,
        dial: Dial<'_>,
        started: Instant,
        is_replayable: bool,
        attempt: &mut A,
    ) -> Result<A::Output, ApiError> {
        let mut may_retry = is_replayable;
        let mut may_retry_unprocessed = true;
        let mut may_reuse = true;
        loop {
            let (conn, connect_ms, is_reused) = match self.ready(key, &dial, may_reuse, started) {
                Ok(ready) => ready,
                Err(first) => {
                    // Looked at already: the pool is not asked twice.
                    let may_reuse = may_reuse && !matches!(first, Acquire::Unknown);
                    self.obtain(key, dial, may_reuse, started, first).await?
                }
            };
            let got = Obtained {
                connect_ms,
                is_reused,
            };
            match conn {
                Opened::H2(c) => match attempt.over_h2(&c, got).await {
                    Ok(out) => return Ok(out),
                    Err(f) => {
                        let mut allowance =
                            may_retry_unprocessed && attempt.may_resend_unprocessed(&f);
                        if !retry_h2(&f, is_reused, &mut may_retry, &mut allowance) {
                            return Err(f.error);
                        }
                        may_retry_unprocessed = allowance;
                        tracing::debug!("HTTP/2 stream failed before a response; retrying");
                    }
                },
                Opened::Http1(conn) => match attempt.over_h1(conn, got).await {
                    Ok(out) => return Ok(out),
                    Err(Failure {
                        is_before_response: true,
                        ..
                    }) if is_reused && may_retry => {
                        // The upstream closed the idle connection while we were sending: the
                        // request may not have been seen at all. `replayable` permits sending
                        // it again, once, on a connection of our own making.
                        tracing::debug!("pooled connection broke before a response; retrying");
                        may_retry = false;
                    }
                    Err(f) => return Err(f.error),
                },
            }
            may_reuse = false;
        }
    }
}

/// The buffered exchange of [`Egress::execute_split`]: the whole body under the response limit.
struct Buffered<'a> {
    egress: &'a Egress,
    req: &'a EgressRequest,
    /// The request's fields, in a profile's order when it has one.
    headers: &'a [Header],
    key: &'a PoolKey,
    /// The HTTP/1.1 request head, encoded on the first HTTP/1.1 attempt.
    head: Option<Vec<u8>>,
}

impl Attempt for Buffered<'_> {
    type Output = EgressResponse;

    async fn over_h2(
        &mut self,
        c: &Rc<H2Conn>,
        got: Obtained,
    ) -> Result<EgressResponse, H2Failure> {
        let (status, headers, body) = self.egress.execute_h2(c, self.req, self.headers).await?;
        Ok(EgressResponse {
            status,
            headers,
            body_start: Bytes::new(),
            body,
            peer_addr: c.peer(),
            connect_ms: got.connect_ms,
            is_connection_reused: got.is_reused,
        })
    }

    async fn over_h1(&mut self, mut conn: Conn, got: Obtained) -> Result<EgressResponse, Failure> {
        let req = self.req;
        let head = match &self.head {
            Some(h) => h,
            None => self.head.insert(
                client::request_head(req.method, &req.url, self.headers, req.body.len()).map_err(
                    |error| Failure {
                        error,
                        is_before_response: false,
                    },
                )?,
            ),
        };
        let x = Exchange {
            method: req.method,
            head,
            body: &req.body,
            deadline: req.deadline,
            timeouts: &req.timeouts,
            max_response_body_bytes: req.max_response_body_bytes,
        };
        let resp = client::exchange(&mut conn, &x).await?;
        let peer_addr = conn.peer();
        if resp.is_reusable {
            // The pool's idle ages are deadlines' business: the coarse clock.
            self.egress
                .inner
                .pool
                .put(self.key, conn, crate::timer::now());
        }
        Ok(EgressResponse {
            status: resp.status,
            headers: resp.headers,
            body_start: resp.body_start,
            body: resp.body,
            peer_addr,
            connect_ms: got.connect_ms,
            is_connection_reused: got.is_reused,
        })
    }

    fn may_resend_unprocessed(&self, _: &H2Failure) -> bool {
        true
    }
}

/// A new or pooled connection, by the protocol it speaks.
enum Opened {
    Http1(Conn),
    H2(Rc<H2Conn>),
}

/// Whether an HTTP/2 failure is sent again, using up the matching allowance: a stream the
/// server did not process once, any other failure before a response once when the request is
/// replayable and its connection was an existing one.
fn retry_h2(
    f: &H2Failure,
    is_reused: bool,
    may_retry: &mut bool,
    may_retry_unprocessed: &mut bool,
) -> bool {
    match f.retry {
        Retry::Always | Retry::NotSent if *may_retry_unprocessed => {
            *may_retry_unprocessed = false;
            true
        }
        Retry::IfReplayable if is_reused && *may_retry => {
            *may_retry = false;
            true
        }
        _ => false,
    }
}

/// What opening an upstream connection needs to know.
#[derive(Clone, Copy)]
pub(crate) struct Dial<'a> {
    url: &'a TargetUrl,
    bind_address: Option<IpAddr>,
    policy: &'a DestinationPolicy,
    timeouts: &'a Timeouts,
    deadline: Instant,
    /// The upstream proxy route and the chosen endpoint, when not direct.
    via: Option<(&'a ProxyRoute, usize)>,
    tenant: Tenant,
    /// The browser profile of the connection, if any.
    profile: Option<&'static Profile>,
    /// The address to connect to instead of resolving the URL's host, which still names the
    /// destination in `Host` and SNI ([`Egress::open_at`]).
    connect_to: Option<IpAddr>,
}

impl<'a> Dial<'a> {
    fn of(req: &'a EgressRequest, via: Option<(&'a ProxyRoute, usize)>) -> Dial<'a> {
        Dial {
            url: &req.url,
            bind_address: req.bind_address,
            policy: &req.policy,
            timeouts: &req.timeouts,
            deadline: req.deadline,
            via,
            tenant: req.tenant,
            profile: req.fingerprint,
            connect_to: None,
        }
    }
}

/// The sweep timer of one core: idle connections are closed here, off the request path, so
/// that an idle pool gives its descriptors back without waiting for a request to its key.
async fn sweep_every(interval: Duration, inner: Weak<Inner>) {
    loop {
        monoio::time::sleep(interval).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let now = Instant::now();
        let closed = inner.pool.sweep(now) + inner.h2.sweep(now, inner.idle_timeout);
        if closed > 0 {
            tracing::debug!(closed, "idle upstream connections swept");
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
