//! Egress through a pool's upstream proxy (decisions 006, 070, 071): the proxy pools built from
//! a snapshot, the choice of an endpoint (sticky by provider session, round robin otherwise,
//! ejected endpoints skipped), and opening a connection to a destination through one: TCP to
//! the proxy, TLS to it for `https://`, then an HTTP `CONNECT` or a SOCKS5 handshake, then TLS
//! to the destination through the tunnel for `https` destinations.
//!
//! The decisions (handshake codecs, endpoint choice, ejection numbers, failure facts) are
//! `sortie_core::upstream_proxy`; this file moves the bytes. Rendered usernames and passwords
//! are never logged and never appear in `Debug` output or error messages.
//!
//! Every failure before the tunnel is up is `upstream_proxy_failure` with a fixed `fact`
//! (and `upstream_status` when the proxy answered `CONNECT` with a status); the destination
//! policy's `destination_denied` and the total deadline's `timeout_exceeded` keep their codes,
//! and failures after the tunnel is up (TLS with the destination, the exchange) keep the
//! ordinary upstream codes.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use std::os::fd::{AsRawFd as _, RawFd};

use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt as _};
use monoio::net::TcpStream;
use sortie_core::destination::DestinationPolicy;
use sortie_core::error::{ApiError, ErrorCode};
use sortie_core::provider_session::ProviderSession;
use sortie_core::request::{Host, Scheme};
use sortie_core::snapshot::{
    ConfigId, ProxyAddr, ProxyHost, ProxyResolve, ProxyScheme, Secret, TemplateValues,
    UpstreamProxy, UsernameTemplate,
};
use sortie_core::upstream_proxy::connect::{
    parse_connect_reply, write_connect_request, ConnectReply,
};
use sortie_core::upstream_proxy::socks5::{
    reply_name, Socks5Error, Socks5Handshake, Socks5Step, Socks5Target,
};
use sortie_core::upstream_proxy::{choose_endpoint, OutlierPolicy, ProxyFact};

use super::connect::{self, within};
use super::error::{self, Expired, Stage};
use super::stream::Conn;
use super::{tls, Dial, Egress};

/// Bytes a proxy's handshake reply may take before it is treated as malformed: a `CONNECT`
/// reply head is bounded by the response head limit, a SOCKS5 reply by 262 bytes.
const MAX_REPLY_BYTES: usize = sortie_core::h1::HeadLimits::RESPONSE.max_head_bytes;

/// The health of one proxy endpoint, shared by every core and kept across snapshots (so that
/// `/metrics` counts stay monotonic). Atomics only: the request path takes no lock.
#[derive(Debug, Default)]
pub struct EndpointHealth {
    consecutive_failures: AtomicU32,
    ejected_until_ms: AtomicU64,
    ejections_in_row: AtomicU32,
    ejections_total: AtomicU64,
    failures_total: AtomicU64,
}

impl EndpointHealth {
    /// Whether the endpoint may be chosen at `now_ms` (process monotonic milliseconds).
    pub fn is_available(&self, now_ms: u64) -> bool {
        now_ms >= self.ejected_until_ms.load(Ordering::Relaxed)
    }

    /// A handshake through the endpoint succeeded: its failure run ends, and so does the run
    /// of ejections that makes the next one longer.
    pub fn on_success(&self) {
        if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
        if self.ejections_in_row.load(Ordering::Relaxed) != 0 {
            self.ejections_in_row.store(0, Ordering::Relaxed);
        }
    }

    /// A failure that says the endpoint is unhealthy; ejects it after
    /// [`OutlierPolicy::consecutive_failures`] in a row. Returns whether this failure ejected.
    pub fn on_failure(&self, policy: &OutlierPolicy, now_ms: u64) -> bool {
        self.failures_total.fetch_add(1, Ordering::Relaxed);
        let n = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n < policy.consecutive_failures || !self.is_available(now_ms) {
            return false;
        }
        // One core wins the ejection; the others see the run already reset.
        if self
            .consecutive_failures
            .compare_exchange(n, 0, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        let nth = self.ejections_in_row.fetch_add(1, Ordering::Relaxed) + 1;
        self.ejected_until_ms.store(
            now_ms.saturating_add(policy.ejection_ms(nth)),
            Ordering::Relaxed,
        );
        self.ejections_total.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Times the endpoint was ejected since the process started.
    pub fn ejections_total(&self) -> u64 {
        self.ejections_total.load(Ordering::Relaxed)
    }

    /// Failures counted against the endpoint since the process started.
    pub fn failures_total(&self) -> u64 {
        self.failures_total.load(Ordering::Relaxed)
    }
}

/// One endpoint's health as `/metrics` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointHealthView {
    /// The upstream proxy id.
    pub proxy_id: String,
    /// The endpoint's canonical URL (never holds credentials).
    pub endpoint: String,
    /// Whether it is ejected now.
    pub is_ejected: bool,
    /// Ejections since the process started.
    pub ejections_total: u64,
    /// Failures counted against it since the process started.
    pub failures_total: u64,
}

/// The health of every endpoint any snapshot named, by (proxy id, endpoint URL). Locked only
/// when a snapshot is activated and when metrics are rendered.
#[derive(Debug, Default)]
pub struct HealthRegistry {
    by_endpoint: Mutex<HashMap<(String, String), Arc<EndpointHealth>>>,
}

impl HealthRegistry {
    /// The health of an endpoint, created on first use.
    pub fn get(&self, proxy_id: &str, endpoint: &str) -> Arc<EndpointHealth> {
        let mut map = self.by_endpoint.lock().unwrap_or_else(|p| p.into_inner());
        map.entry((proxy_id.to_string(), endpoint.to_string()))
            .or_default()
            .clone()
    }

    /// Every endpoint's health at `now_ms`, sorted by proxy id and endpoint.
    pub fn view(&self, now_ms: u64) -> Vec<EndpointHealthView> {
        let map = self.by_endpoint.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<EndpointHealthView> = map
            .iter()
            .map(|((proxy_id, endpoint), h)| EndpointHealthView {
                proxy_id: proxy_id.clone(),
                endpoint: endpoint.clone(),
                is_ejected: !h.is_available(now_ms),
                ejections_total: h.ejections_total(),
                failures_total: h.failures_total(),
            })
            .collect();
        out.sort_by(|a, b| (&a.proxy_id, &a.endpoint).cmp(&(&b.proxy_id, &b.endpoint)));
        out
    }
}

/// One endpoint of a proxy pool.
#[derive(Debug)]
struct Endpoint {
    addr: ProxyAddr,
    /// The canonical URL: the pool key and the metrics label.
    url: Arc<str>,
    resolve: ProxyResolve,
    health: Arc<EndpointHealth>,
}

/// The password as the executor has it.
#[derive(Debug)]
enum Password {
    None,
    Inline(Secret),
    /// `password_env` named a variable this process does not have (or not as UTF-8).
    Missing,
}

/// A pool's upstream proxy as the executor uses it, built when a snapshot is activated.
pub struct ProxyPool {
    id: ConfigId,
    endpoints: Box<[Endpoint]>,
    template: Option<UsernameTemplate>,
    password: Password,
    outlier: OutlierPolicy,
    rr: AtomicUsize,
}

impl fmt::Debug for ProxyPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyPool")
            .field("id", &self.id)
            .field("endpoints", &self.endpoints.len())
            .finish_non_exhaustive()
    }
}

impl ProxyPool {
    /// Builds the pool of a snapshot's upstream proxy. `password_env` is read here, from this
    /// process's environment (decision 071); `health` keeps endpoint health across snapshots.
    pub fn build(
        proxy: &UpstreamProxy,
        health: &HealthRegistry,
        outlier: OutlierPolicy,
    ) -> ProxyPool {
        let endpoints = proxy
            .endpoints()
            .iter()
            .map(|addr| {
                let url: Arc<str> = addr.to_url().into();
                Endpoint {
                    addr: addr.clone(),
                    health: health.get(proxy.id().as_str(), &url),
                    url,
                    resolve: proxy.resolve_for(addr),
                }
            })
            .collect();
        let password = match (proxy.password(), proxy.password_env()) {
            (Some(p), _) => Password::Inline(p.clone()),
            (None, Some(name)) => match std::env::var(name)
                .ok()
                .and_then(|v| Secret::parse_password(&v).ok())
            {
                Some(s) => Password::Inline(s),
                None => {
                    tracing::warn!(
                        proxy = proxy.id().as_str(),
                        variable = name,
                        "the upstream proxy's password_env names no usable variable; requests through it fail"
                    );
                    Password::Missing
                }
            },
            (None, None) => Password::None,
        };
        ProxyPool {
            id: proxy.id().clone(),
            endpoints,
            template: proxy.username_template().cloned(),
            password,
            outlier,
            rr: AtomicUsize::new(0),
        }
    }

    /// The proxy id.
    pub fn id(&self) -> &ConfigId {
        &self.id
    }

    /// The route of one request: the username rendered from the request's hints and provider
    /// session. A hint that cannot be placed in a username (decision 006) is `invalid_request`.
    pub fn route(
        self: &Arc<Self>,
        values: &TemplateValues<'_>,
        session: Option<ProviderSession>,
    ) -> Result<ProxyRoute, ApiError> {
        let username = match &self.template {
            None => None,
            Some(t) => Some(Arc::<str>::from(t.render(values).map_err(|e| {
                ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!("the routing hints cannot form the upstream proxy username: {e}"),
                )
            })?)),
        };
        Ok(ProxyRoute {
            pool: self.clone(),
            username,
            session,
        })
    }
}

impl ProxyPool {
    /// The route of a request whose username was rendered elsewhere: a remote worker gets it
    /// from the control's assignment, rendered from hints it does not see itself.
    pub fn route_rendered(
        self: &Arc<Self>,
        username: Option<&str>,
        session: Option<ProviderSession>,
    ) -> ProxyRoute {
        ProxyRoute {
            pool: self.clone(),
            username: username.map(Arc::from),
            session,
        }
    }
}

/// How one request goes through its pool's upstream proxy. Cheap to clone.
#[derive(Clone)]
pub struct ProxyRoute {
    pool: Arc<ProxyPool>,
    username: Option<Arc<str>>,
    session: Option<ProviderSession>,
}

impl fmt::Debug for ProxyRoute {
    /// The username is left out: it carries the provider session and the caller's hints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyRoute")
            .field("proxy", &self.pool.id)
            .finish_non_exhaustive()
    }
}

impl ProxyRoute {
    /// Chooses the endpoint for a new or pooled connection.
    pub(crate) fn choose(&self, now: Instant) -> usize {
        let now_ms = crate::clock::monotonic_ms_at(now);
        let eps = &self.pool.endpoints;
        let rr = if self.session.is_none() && eps.len() > 1 {
            self.pool.rr.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        };
        choose_endpoint(eps.len(), self.session.as_ref(), rr, |i| {
            eps.get(i).is_some_and(|e| e.health.is_available(now_ms))
        })
    }

    /// What a pooled connection through endpoint `i` is keyed by besides the destination.
    pub(crate) fn key(&self, i: usize) -> ViaKey {
        ViaKey {
            endpoint: self
                .pool
                .endpoints
                .get(i)
                .map_or_else(|| Arc::from(""), |e| e.url.clone()),
            username: self.username.clone(),
        }
    }

    /// The rendered username, for a remote worker's assignment only: never log it.
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }

    /// The endpoint's canonical URL (for logs: it holds no credentials).
    pub fn endpoint_url(&self, i: usize) -> Option<&str> {
        self.pool.endpoints.get(i).map(|e| &*e.url)
    }

    fn credentials(&self) -> Result<Option<(&str, &str)>, ApiError> {
        let password = match &self.pool.password {
            Password::None => None,
            Password::Inline(s) => Some(s.expose()),
            Password::Missing => return Err(ProxyFact::Credentials.error()),
        };
        Ok(match (self.username.as_deref(), password) {
            (None, None) => None,
            (u, p) => Some((u.unwrap_or(""), p.unwrap_or(""))),
        })
    }
}

/// The part of a pool key that keeps connections of different proxy endpoints and usernames
/// (provider sessions) apart: two sessions never share an upstream connection.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ViaKey {
    endpoint: Arc<str>,
    username: Option<Arc<str>>,
}

/// The destination as the proxy is asked for it.
enum Target {
    /// An address the gateway resolved and the policy allowed (or an allowed literal).
    Addr(SocketAddr),
    /// A name the proxy resolves.
    Name(Box<str>, u16),
}

/// A transport under the handshake: plain TCP to the proxy, or TLS to an `https://` proxy.
trait HandshakeIo: AsyncReadRent + AsyncWriteRent {}
impl<T: AsyncReadRent + AsyncWriteRent> HandshakeIo for T {}

impl Egress {
    /// Opens a connection to the destination of `req` through endpoint `i` of its proxy route:
    /// the tunnel, then TLS with the destination through it for `https`.
    pub(crate) async fn connect_via(
        &self,
        route: &ProxyRoute,
        i: usize,
        req: &Dial<'_>,
    ) -> Result<Conn, ApiError> {
        let (tunnel, proxy_peer, policy_ip, early) = self.tunnel_via(route, i, req).await?;
        // Neither an HTTP nor a TLS destination speaks before the gateway does: bytes after the
        // proxy's reply mean the proxy is out of step.
        if !early.is_empty() {
            return Err(ProxyFact::Protocol.error());
        }
        let conn = match (req.url.scheme, tunnel) {
            (Scheme::Http, Tunnel::Plain(tcp)) => Conn::plain(tcp, proxy_peer),
            (Scheme::Http, Tunnel::Tls(tls, fd)) => Conn::tls(*tls, fd, proxy_peer),
            (Scheme::Https, Tunnel::Plain(tcp)) => {
                let name = tls::server_name(&req.url.host)?;
                let (at, expired) = attempt_limit(req);
                match within(at, tls::handshake(&self.inner.tls, name, tcp, proxy_peer)).await {
                    Some(conn) => conn?,
                    None => return Err(error::timeout(expired, Stage::TlsHandshake)),
                }
            }
            (Scheme::Https, Tunnel::Tls(tls, fd)) => {
                let name = tls::server_name(&req.url.host)?;
                let (at, expired) = attempt_limit(req);
                let handshake = tls::handshake_in_tls(&self.inner.tls, name, *tls, fd, proxy_peer);
                match within(at, handshake).await {
                    Some(conn) => conn?,
                    None => return Err(error::timeout(expired, Stage::TlsHandshake)),
                }
            }
        };
        Ok(conn.with_policy_ip(policy_ip))
    }

    /// Opens a raw tunnel to `host:port` through the route's proxy for a CONNECT tunnel of the
    /// forward proxy: the counterpart of [`Egress::dial`]. The endpoint is chosen as for any
    /// exchange. Through an `https://` proxy the tunnel's bytes travel inside TLS to the proxy
    /// ([`TunnelStream::Tls`]). Also returns the destination's first bytes when they came with
    /// the proxy's reply (a destination that speaks first, like SSH or SMTP).
    #[allow(clippy::too_many_arguments)]
    pub async fn dial_via(
        &self,
        route: &ProxyRoute,
        host: &Host,
        port: u16,
        bind_address: Option<IpAddr>,
        policy: &DestinationPolicy,
        connect_limit: std::time::Duration,
        deadline: Instant,
        tenant: crate::dns::Tenant,
    ) -> Result<(TunnelStream, SocketAddr, Vec<u8>), ApiError> {
        let (url, timeouts) = super::streaming::tunnel_target(host, port, connect_limit);
        let i = route.choose(Instant::now());
        let req = Dial {
            url: &url,
            bind_address,
            policy,
            timeouts: &timeouts,
            deadline,
            via: Some((route, i)),
            tenant,
            profile: None,
            connect_to: None,
        };
        match self.tunnel_via(route, i, &req).await? {
            (Tunnel::Plain(tcp), peer, _, early) => Ok((TunnelStream::Tcp(tcp), peer, early)),
            (Tunnel::Tls(tls, _), peer, _, early) => Ok((TunnelStream::Tls(tls), peer, early)),
        }
    }

    /// The tunnel through endpoint `i` to the destination of `req`, with the proxy's address
    /// and the destination address the policy allowed (none when the proxy resolves the name).
    /// Records the outcome in the endpoint's health.
    async fn tunnel_via(
        &self,
        route: &ProxyRoute,
        i: usize,
        req: &Dial<'_>,
    ) -> Result<(Tunnel, SocketAddr, Option<IpAddr>, Vec<u8>), ApiError> {
        let Some(endpoint) = route.pool.endpoints.get(i) else {
            return Err(error::internal("no such upstream proxy endpoint"));
        };
        let credentials = route.credentials()?;
        let target = self.target(endpoint.resolve, req).await?;
        let policy_ip = match &target {
            Target::Addr(a) => Some(a.ip()),
            Target::Name(..) => None,
        };
        let result = self.open_tunnel(endpoint, credentials, &target, req).await;
        match &result {
            Ok(_) => endpoint.health.on_success(),
            Err(f) if f.is_endpoint_failure() => {
                let now_ms = crate::clock::monotonic_ms_at(Instant::now());
                if endpoint.health.on_failure(&route.pool.outlier, now_ms) {
                    tracing::info!(
                        proxy = route.pool.id.as_str(),
                        endpoint = &*endpoint.url,
                        "upstream proxy endpoint ejected"
                    );
                }
            }
            Err(_) => {}
        }
        let (tunnel, peer, early) = result.map_err(Failed::into_error)?;
        Ok((tunnel, peer, policy_ip, early))
    }

    /// The destination as the endpoint is asked for it (decision 070): IP literals are checked
    /// as always; names are resolved and checked here unless the proxy resolves them.
    async fn target(&self, resolve: ProxyResolve, req: &Dial<'_>) -> Result<Target, ApiError> {
        let port = req.url.port;
        let check = |ip: IpAddr| {
            req.policy
                .check(ip)
                .map(|()| Target::Addr(SocketAddr::new(ip, port)))
                .map_err(ApiError::from)
        };
        match (&req.url.host, resolve) {
            (Host::V4(a), _) => check(IpAddr::V4(*a)),
            (Host::V6(a), _) => check(IpAddr::V6(*a)),
            (Host::Domain(d), ProxyResolve::Proxy) => Ok(Target::Name(d.as_ref().into(), port)),
            (host @ Host::Domain(_), ProxyResolve::Gateway) => {
                let addrs =
                    connect::resolve(&self.inner.resolver, host, req.deadline, req.tenant).await?;
                let mut denied = None;
                for ip in addrs {
                    match req.policy.check(ip) {
                        Ok(()) => return Ok(Target::Addr(SocketAddr::new(ip, port))),
                        Err(d) => {
                            denied.get_or_insert(d);
                        }
                    }
                }
                Err(denied.map_or_else(
                    || error::dns_failure(&crate::dns::DnsError::NotFound("no addresses".into())),
                    ApiError::from,
                ))
            }
        }
    }

    /// TCP (and TLS for `https://`) to the endpoint, then the handshake. Returns the tunnel,
    /// the proxy's address and the destination's bytes that came with the proxy's reply.
    async fn open_tunnel(
        &self,
        endpoint: &Endpoint,
        credentials: Option<(&str, &str)>,
        target: &Target,
        req: &Dial<'_>,
    ) -> Result<(Tunnel, SocketAddr, Vec<u8>), Failed> {
        let (tcp, peer) = self.dial_proxy(&endpoint.addr, req).await?;
        let fd = tcp.as_raw_fd();
        let scheme = endpoint.addr.scheme();
        if scheme == ProxyScheme::Https {
            let name = proxy_server_name(endpoint.addr.host()).map_err(Failed::Api)?;
            let (at, expired) = attempt_limit(req);
            let mut tls = match within(at, self.inner.tls.connect(name, tcp)).await {
                Some(Ok(s)) => s,
                Some(Err(e)) => {
                    let e = std::io::Error::from(e);
                    tracing::debug!(reason = %e, "TLS with the upstream proxy failed");
                    return Err(Failed::Fact(ProxyFact::Tls, None));
                }
                None => return Err(Failed::expired(expired)),
            };
            let early = handshake(&mut tls, scheme, credentials, target, req).await?;
            return Ok((Tunnel::Tls(Box::new(tls), fd), peer, early));
        }
        let mut tcp = tcp;
        let early = handshake(&mut tcp, scheme, credentials, target, req).await?;
        Ok((Tunnel::Plain(tcp), peer, early))
    }

    /// Resolves the endpoint's host and connects to the first address that accepts. The
    /// destination policy does not apply: the operator named the proxy.
    async fn dial_proxy(
        &self,
        addr: &ProxyAddr,
        req: &Dial<'_>,
    ) -> Result<(TcpStream, SocketAddr), Failed> {
        let host = match addr.host() {
            ProxyHost::V4(a) => Host::V4(*a),
            ProxyHost::V6(a) => Host::V6(*a),
            ProxyHost::Name(n) => Host::Domain(n.as_ref().into()),
        };
        let addrs =
            match connect::resolve(&self.inner.resolver, &host, req.deadline, req.tenant).await {
                Ok(a) => a,
                Err(e) if e.code == ErrorCode::TimeoutExceeded => return Err(Failed::Api(e)),
                Err(_) => return Err(Failed::Fact(ProxyFact::Connect, None)),
            };
        let open = proxy_policy();
        match connect::connect_any(
            &addrs,
            addr.port(),
            req.bind_address,
            open,
            req.timeouts.connect,
            req.deadline,
        )
        .await
        {
            Ok(ok) => Ok(ok),
            // The total deadline keeps its code; a local failure too.
            Err(e)
                if e.code == ErrorCode::TimeoutExceeded
                    || e.code == ErrorCode::ExecutorInternalError =>
            {
                Err(Failed::Api(e))
            }
            Err(e) if e.code == ErrorCode::UpstreamConnectTimeout => {
                Err(Failed::Fact(ProxyFact::Timeout, None))
            }
            Err(_) => Err(Failed::Fact(ProxyFact::Connect, None)),
        }
    }
}

/// A policy that allows every address: the proxy endpoint is the operator's own choice, not a
/// destination.
fn proxy_policy() -> &'static DestinationPolicy {
    static OPEN: std::sync::OnceLock<DestinationPolicy> = std::sync::OnceLock::new();
    OPEN.get_or_init(|| {
        DestinationPolicy::new(
            vec![
                "0.0.0.0/0".parse().unwrap_or_else(|_| unreachable!()),
                "::/0".parse().unwrap_or_else(|_| unreachable!()),
            ],
            vec![],
        )
    })
}

/// The connection a CONNECT tunnel of the forward proxy relays to: TCP to the destination (or
/// to an `http://` or SOCKS5 proxy that carries the tunnel on as raw bytes), or TLS to an
/// `https://` proxy, inside which the tunnel's bytes travel. Only the first can be spliced.
pub enum TunnelStream {
    /// Raw TCP: the tunnel's bytes are the connection's bytes.
    Tcp(TcpStream),
    /// TLS to an `https://` upstream proxy; its plaintext is the tunnel.
    Tls(Box<monoio_rustls::ClientTlsStream<TcpStream>>),
}

/// The tunnel once the handshake is done.
enum Tunnel {
    Plain(TcpStream),
    /// TLS to an `https://` proxy, with the descriptor of its TCP stream.
    Tls(Box<monoio_rustls::ClientTlsStream<TcpStream>>, RawFd),
}

/// How the proxy path failed.
#[derive(Debug)]
enum Failed {
    /// A proxy failure with its fact and the `CONNECT` status, if one came.
    Fact(ProxyFact, Option<u16>),
    /// A SOCKS5 reply other than succeeded (`proxy_tunnel` with the reply's name).
    SocksReply(u8),
    /// An error that keeps its own code (the total deadline, local resources).
    Api(ApiError),
}

impl Failed {
    fn expired(expired: Expired) -> Failed {
        match expired {
            Expired::ConnectAttempt => Failed::Fact(ProxyFact::Timeout, None),
            other => Failed::Api(error::timeout(other, Stage::Connect)),
        }
    }

    fn is_endpoint_failure(&self) -> bool {
        matches!(self, Failed::Fact(f, _) if f.is_endpoint_failure())
    }

    fn into_error(self) -> ApiError {
        match self {
            Failed::Fact(fact, status) => {
                let e = fact.error();
                match status {
                    Some(s) => e.with_upstream_status(s),
                    None => e,
                }
            }
            Failed::SocksReply(rep) => ProxyFact::Tunnel
                .error()
                .with_detail("socks_reply", reply_name(rep)),
            Failed::Api(e) => e,
        }
    }
}

/// The earlier of one connect attempt's limit and the total deadline.
fn attempt_limit(req: &Dial<'_>) -> (Instant, Expired) {
    match Instant::now().checked_add(req.timeouts.connect) {
        Some(end) if end < req.deadline => (end, Expired::ConnectAttempt),
        _ => (req.deadline, Expired::TotalDeadline),
    }
}

fn proxy_server_name(host: &ProxyHost) -> Result<rustls::pki_types::ServerName<'static>, ApiError> {
    let host = match host {
        ProxyHost::V4(a) => Host::V4(*a),
        ProxyHost::V6(a) => Host::V6(*a),
        ProxyHost::Name(n) => Host::Domain(n.as_ref().into()),
    };
    tls::server_name(&host)
}

/// Runs the endpoint's handshake within one connect attempt's limit; returns the destination's
/// first bytes when they came with the proxy's reply.
async fn handshake<S: HandshakeIo>(
    io: &mut S,
    scheme: ProxyScheme,
    credentials: Option<(&str, &str)>,
    target: &Target,
    req: &Dial<'_>,
) -> Result<Vec<u8>, Failed> {
    let (at, expired) = attempt_limit(req);
    let run = async {
        if scheme.is_socks() {
            socks5(io, credentials, target).await
        } else {
            http_connect(io, credentials, target).await
        }
    };
    match within(at, run).await {
        Some(r) => r,
        None => Err(Failed::expired(expired)),
    }
}

async fn send<S: HandshakeIo>(io: &mut S, data: Vec<u8>) -> Result<(), Failed> {
    let (res, _) = io.write_all(data).await;
    if res.is_err() {
        return Err(Failed::Fact(ProxyFact::Closed, None));
    }
    io.flush()
        .await
        .map_err(|_| Failed::Fact(ProxyFact::Closed, None))
}

/// Reads more of the proxy's reply into `buf`; EOF or an error is [`ProxyFact::Closed`].
async fn receive<S: HandshakeIo>(io: &mut S, buf: &mut Vec<u8>) -> Result<(), Failed> {
    if buf.len() >= MAX_REPLY_BYTES {
        return Err(Failed::Fact(ProxyFact::Protocol, None));
    }
    let mut chunk = Vec::with_capacity(4096);
    let (res, c) = io.read(chunk).await;
    chunk = c;
    match res {
        Ok(0) | Err(_) => Err(Failed::Fact(ProxyFact::Closed, None)),
        Ok(n) => {
            buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
            Ok(())
        }
    }
}

/// Asks the proxy for a tunnel with `CONNECT`; the bytes that came behind its reply (the
/// destination's first bytes) are returned.
async fn http_connect<S: HandshakeIo>(
    io: &mut S,
    credentials: Option<(&str, &str)>,
    target: &Target,
) -> Result<Vec<u8>, Failed> {
    let authority = match target {
        Target::Addr(a) => a.to_string(),
        Target::Name(n, port) => format!("{n}:{port}"),
    };
    let mut head = Vec::with_capacity(256);
    write_connect_request(&mut head, &authority, credentials)
        .map_err(|_| Failed::Api(error::internal("the CONNECT request cannot be written")))?;
    send(io, head).await?;
    let mut buf = Vec::new();
    loop {
        receive(io, &mut buf).await?;
        match parse_connect_reply(&buf) {
            Ok(ConnectReply::Partial) => continue,
            Ok(ConnectReply::Established { consumed, .. }) => {
                buf.drain(..consumed.min(buf.len()));
                return Ok(buf);
            }
            Ok(ConnectReply::Refused { status: 407 }) => {
                return Err(Failed::Fact(ProxyFact::Auth, Some(407)))
            }
            Ok(ConnectReply::Refused { status }) => {
                return Err(Failed::Fact(ProxyFact::Tunnel, Some(status)))
            }
            Err(e) => {
                tracing::debug!(reason = %e, "malformed reply to CONNECT");
                return Err(Failed::Fact(ProxyFact::Protocol, None));
            }
        }
    }
}

/// The SOCKS5 handshake; the bytes that came behind the proxy's last reply are returned.
async fn socks5<S: HandshakeIo>(
    io: &mut S,
    credentials: Option<(&str, &str)>,
    target: &Target,
) -> Result<Vec<u8>, Failed> {
    let t = match target {
        Target::Addr(a) => Socks5Target::Addr(*a),
        Target::Name(n, port) => Socks5Target::Name(n, *port),
    };
    let (mut hs, greeting) = Socks5Handshake::start(t, credentials).map_err(socks_failure)?;
    send(io, greeting).await?;
    let mut buf = Vec::new();
    loop {
        match hs.feed(&buf).map_err(socks_failure)? {
            Socks5Step::NeedMore => receive(io, &mut buf).await?,
            Socks5Step::Send { consumed, out } => {
                buf.drain(..consumed.min(buf.len()));
                send(io, out).await?;
            }
            Socks5Step::Connected { consumed } => {
                buf.drain(..consumed.min(buf.len()));
                return Ok(buf);
            }
        }
    }
}

fn socks_failure(e: Socks5Error) -> Failed {
    let fact = match e {
        Socks5Error::NoAcceptableMethod | Socks5Error::AuthRejected => ProxyFact::Auth,
        Socks5Error::BadCredentials => ProxyFact::Credentials,
        Socks5Error::Reply(rep) => return Failed::SocksReply(rep),
        Socks5Error::NameTooLong => {
            return Failed::Api(ApiError::new(
                ErrorCode::InvalidRequest,
                "the destination name is too long for a SOCKS5 proxy",
            ))
        }
        Socks5Error::Malformed(_) => ProxyFact::Protocol,
    };
    Failed::Fact(fact, None)
}
