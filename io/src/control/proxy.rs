//! The forward-proxy ingress: absolute-form HTTP requests relayed with streamed bodies, and
//! CONNECT tunnels, on the routing, capacity, destination policy, active-request list and
//! metrics of the request API (decisions 020–023).
//!
//! Per request: the head is admitted (request form, then Basic credentials), the routing hints
//! come from `X-Service-Route-*` fields, routing runs with ingress `proxy` or `connect`, the
//! request takes capacity on the chosen local worker and joins the core's active list (so an
//! operator can list and cancel it), and the upstream exchange runs on the core's shared pool
//! (`Egress::open`). Bodies are streamed both ways. Every error is the registry's, answered
//! with `Proxy-Status` and the JSON error envelope.
//!
//! On the per-request path: no blocking, no locks but a sticky-pin shard, logs at debug only
//! (target `sortie::proxy`); credentials and tokens are never logged.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use monoio::net::TcpStream;
use sortie_core::error::{ApiError, ErrorCode};
use sortie_core::h1::{BodyFraming, ResponseFraming, TargetForm};
use sortie_core::proxy::{
    connection_tokens, is_forwarded_request_field, is_hop_by_hop_response_field, parse_basic,
    parse_connect_target, proxy_http_status, proxy_status, route_hints, PROXY_AUTHENTICATE,
};
use sortie_core::request::{parse_target_url, Method};
use sortie_core::routing::Ingress;
use subtle::ConstantTimeEq as _;

use super::api::{assign, ApiContext};
use super::core::{ActiveGuard, Cancelled};
use super::tunnel::{relay, Early};
use crate::bus::ingress::{Dispatched, Reroute};
use crate::egress::{
    BodyLength, BodySource, ResponseBodyReader, StreamRequest, Timeouts, TunnelStream,
};
use crate::http::{
    Admitted, Body, BodyError, Handler, RequestParts, Response, ResponseBody, StreamBody, Tunnel,
};
use crate::tokens::DeploymentRef;

/// Concurrent tunnels per deployment, shared by every core.
pub struct TunnelCounts {
    counts: Vec<AtomicU32>,
    max: u32,
}

impl TunnelCounts {
    /// Counters for `deployments` deployments, each limited to `max` tunnels.
    pub fn new(deployments: usize, max: u32) -> TunnelCounts {
        TunnelCounts {
            counts: (0..deployments).map(|_| AtomicU32::new(0)).collect(),
            max,
        }
    }

    /// Takes one tunnel of the deployment, or `None` at its limit.
    fn try_take(self: &Arc<Self>, d: DeploymentRef) -> Option<TunnelPermit> {
        let c = self.counts.get(d.index())?;
        c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < self.max).then_some(n + 1)
        })
        .ok()?;
        Some(TunnelPermit {
            counts: Arc::clone(self),
            index: d.index(),
        })
    }

    /// Tunnels the deployment holds now.
    pub fn current(&self, d: DeploymentRef) -> u32 {
        self.counts
            .get(d.index())
            .map_or(0, |c| c.load(Ordering::Acquire))
    }
}

/// One tunnel of a deployment, given back when dropped.
struct TunnelPermit {
    counts: Arc<TunnelCounts>,
    index: usize,
}

impl Drop for TunnelPermit {
    fn drop(&mut self) {
        if let Some(c) = self.counts.counts.get(self.index) {
            c.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The proxy listener's handler on one core.
pub struct ProxyHandler {
    ctx: Rc<ApiContext>,
    tunnels: Arc<TunnelCounts>,
    /// The last `Proxy-Authorization` value this core accepted, with its deployment: clients
    /// send the same one request after request; a constant-time compare with it saves the
    /// base64 decoding and the digest lookup.
    last_credential: RefCell<Option<(Vec<u8>, DeploymentRef)>>,
}

/// What [`ProxyHandler::admit`] learned from the head.
pub struct ProxyAdmission {
    deployment: DeploymentRef,
    ingress: Ingress,
}

/// A registry error as the proxy answers it: the proxy status (407 for credentials), an RFC
/// 9209 `Proxy-Status` field naming the code, and the JSON error envelope (decision 023).
pub fn proxy_error(e: &ApiError, request_id: &str) -> Response {
    let mut r = Response::json(proxy_http_status(e.code), e.to_json(request_id))
        .with_header("proxy-status", proxy_status(e));
    if e.code == ErrorCode::AuthFailure {
        r = r.with_header("proxy-authenticate", PROXY_AUTHENTICATE);
    }
    r
}

fn new_request_id() -> String {
    sortie_core::ids::request_id(crate::tokens::random_bytes())
}

impl ProxyHandler {
    /// A handler for one core, sharing the core's egress executor and active list through
    /// `ctx` and the tunnel counts with every core.
    pub fn new(ctx: ApiContext, tunnels: Arc<TunnelCounts>) -> ProxyHandler {
        ProxyHandler {
            ctx: Rc::new(ctx),
            tunnels,
            last_credential: RefCell::new(None),
        }
    }

    /// The deployment a `Proxy-Authorization` value proves: Basic, the deployment id as user
    /// and its token as password (decision 020), the token compared in constant time.
    fn authenticate(&self, value: Option<&[u8]>) -> Option<DeploymentRef> {
        let value = value?;
        if let Some((last, d)) = &*self.last_credential.borrow() {
            if bool::from(last.as_slice().ct_eq(value)) {
                return Some(*d);
            }
        }
        let creds = parse_basic(value)?;
        let auth = &self.ctx.state.auth;
        let d = auth.authenticate(creds.password())?;
        // The id is not a secret: a plain comparison.
        if auth.id(d).as_bytes() != creds.user() {
            return None;
        }
        *self.last_credential.borrow_mut() = Some((value.to_vec(), d));
        Some(d)
    }

    fn refuse(&self, e: &ApiError, ingress: Ingress, deployment: &str) -> Response {
        self.ctx
            .metrics
            .record(self.ctx.core, ingress, deployment, e.code.as_str(), None);
        proxy_error(e, &new_request_id())
    }
}

impl Handler for ProxyHandler {
    type Admission = ProxyAdmission;

    fn admit(&self, req: &RequestParts) -> Result<Admitted<ProxyAdmission>, Response> {
        let ingress = match (req.method(), req.target_form()) {
            ("CONNECT", TargetForm::Authority) => Ingress::Connect,
            (_, TargetForm::Absolute) => Ingress::Proxy,
            (method, form) => {
                let e = ApiError::new(
                    ErrorCode::UnsupportedIngressMode,
                    format!(
                        "the proxy accepts absolute-form requests and CONNECT; got {method} with \
                         a{} target",
                        match form {
                            TargetForm::Origin => "n origin-form",
                            TargetForm::Asterisk => "n asterisk-form",
                            TargetForm::Absolute => "n absolute-form",
                            TargetForm::Authority => "n authority-form",
                        }
                    ),
                );
                // Neither form: counted with the listener's main mode.
                return Err(self.refuse(&e, Ingress::Proxy, "-"));
            }
        };
        let Some(deployment) = self.authenticate(req.header("proxy-authorization")) else {
            let e = ApiError::new(
                ErrorCode::AuthFailure,
                "missing or invalid proxy credentials (Basic: deployment id and token)",
            );
            return Err(self.refuse(&e, ingress, "-"));
        };
        Ok(Admitted {
            // Request bodies are streamed to the destination, never held whole.
            body_limit: u64::MAX,
            admission: ProxyAdmission {
                deployment,
                ingress,
            },
        })
    }

    async fn handle(&self, req: RequestParts, a: ProxyAdmission, body: &mut Body<'_>) -> Response {
        let request_id = new_request_id();
        let deployment = self.ctx.state.auth.id(a.deployment);
        let started = Instant::now();
        let mut pending = Unanswered {
            handler: self,
            ingress: a.ingress,
            deployment,
            is_answered: false,
        };
        let outcome = match a.ingress {
            Ingress::Connect => {
                self.connect(&req, a.deployment, deployment, &request_id, started)
                    .await
            }
            _ => {
                let tenant = Some(a.deployment.index());
                self.relay(&req, deployment, tenant, &request_id, body, started)
                    .await
            }
        };
        pending.is_answered = true;
        match outcome {
            Ok(response) => {
                self.ctx
                    .metrics
                    .record(self.ctx.core, a.ingress, deployment, "ok", None);
                response
            }
            Err(e) => {
                tracing::debug!(
                    target: "sortie::proxy",
                    request_id = %request_id,
                    deployment = %deployment,
                    code = e.code.as_str(),
                    total_ms = started.elapsed().as_millis() as u64,
                    "proxied request failed"
                );
                self.ctx.metrics.record(
                    self.ctx.core,
                    a.ingress,
                    deployment,
                    e.code.as_str(),
                    None,
                );
                proxy_error(&e, &request_id)
            }
        }
    }

    fn error_response(&self, status: u16, reason: &'static str) -> Response {
        // Framing errors, timeouts and overload the server detects itself: the server's status,
        // with the registry code in Proxy-Status and the envelope.
        let e = super::web::server_error(status, reason);
        let mut r = proxy_error(&e, &new_request_id());
        r.status = status;
        r
    }
}

/// Counts a proxied request whose future was dropped before it answered (its client left) as
/// `cancelled`, as the request API does.
struct Unanswered<'a> {
    handler: &'a ProxyHandler,
    ingress: Ingress,
    deployment: &'a str,
    is_answered: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if !self.is_answered {
            let ctx = &self.handler.ctx;
            ctx.metrics.record(
                ctx.core,
                self.ingress,
                self.deployment,
                ErrorCode::Cancelled.as_str(),
                None,
            );
        }
    }
}

/// The client's request body as the source of the upstream request body.
struct ClientBody<'a, 'b> {
    body: &'a mut Body<'b>,
    length: BodyLength,
}

impl BodySource for ClientBody<'_, '_> {
    fn length(&self) -> BodyLength {
        self.length
    }

    async fn next_chunk(&mut self) -> Result<Option<Bytes>, ApiError> {
        self.body.read_chunk().await.map_err(|e| {
            let code = match e {
                BodyError::TooLarge => ErrorCode::BodyTooLarge,
                _ => ErrorCode::StreamUploadAborted,
            };
            ApiError::new(code, format!("client request body: {}", e.reason()))
        })
    }
}

impl ProxyHandler {
    /// The total deadline of a proxied request's head: the snapshot's default timeout under
    /// the configured cap (decision 021).
    fn deadline(&self, started: Instant) -> Instant {
        let active = self.ctx.state.active();
        let ms = active
            .snapshot
            .default_timeout_ms()
            .min(self.ctx.state.limits.max_timeout_ms);
        started + Duration::from_millis(ms)
    }

    /// Relays one absolute-form request.
    async fn relay(
        &self,
        req: &RequestParts,
        deployment: &str,
        tenant: crate::dns::Tenant,
        request_id: &str,
        body: &mut Body<'_>,
        started: Instant,
    ) -> Result<Response, ApiError> {
        let method = Method::parse(req.method()).ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidRequest,
                format!("method {} is not supported", req.method()),
            )
        })?;
        let url = parse_target_url(req.target()).map_err(|e| {
            ApiError::new(ErrorCode::InvalidRequest, format!("request target: {e}"))
        })?;
        self.ctx.state.limits.denied_ports.check(url.port)?;
        let hints = route_hints(req.headers())?;
        let active = self.ctx.state.active();
        let assigned = assign(
            &self.ctx,
            &active,
            deployment,
            &hints,
            Ingress::Proxy,
            &url.host_str(),
            None,
            started,
        )?;
        let (tracked, cancelled) = self.ctx.active.track(request_id, deployment);

        let fields: Vec<(&str, &[u8])> = req.headers().collect();
        let tokens = connection_tokens(&fields);
        let forwarded: Vec<(&str, &[u8])> = fields
            .iter()
            .copied()
            .filter(|(n, _)| is_forwarded_request_field(n, &tokens))
            .collect();
        let length = match body.framing() {
            BodyFraming::None | BodyFraming::ContentLength(0) => BodyLength::None,
            BodyFraming::ContentLength(n) => BodyLength::Known(n),
            BodyFraming::Chunked => BodyLength::Chunked,
        };
        let (tracked, mut cancelled, assigned) = if assigned.is_remote {
            let mut source = ClientBody { body, length };
            let route = Reroute {
                active: &active,
                hints: &hints,
                ingress: Ingress::Proxy,
                host: &url.host_str(),
                started,
            };
            match crate::bus::ingress::relay(
                &self.ctx,
                request_id,
                deployment,
                self.deadline(started),
                method.as_str(),
                req.target(),
                &forwarded,
                &mut source,
                &route,
                (tracked, cancelled, assigned),
            )
            .await
            {
                Dispatched::Answered(r) => return r,
                // Refused by the remote workers: routing chose a local one.
                Dispatched::Local(held) => held,
            }
        } else {
            (tracked, cancelled, assigned)
        };
        let stream_req = StreamRequest {
            method,
            url: &url,
            headers: &forwarded,
            deadline: self.deadline(started),
            timeouts: Timeouts {
                idle: self.ctx.state.limits.proxy_idle_timeout,
                ..self.ctx.state.limits.egress_timeouts
            },
            policy: &active.policy,
            worker_id: &assigned.decision.worker_id,
            bind_address: assigned.slot.bind_address(),
            // RFC 9110 §9.2.2: a proxy may retry an idempotent request without a body.
            is_replayable: matches!(method, Method::Get | Method::Head | Method::Options),
            via: assigned.via.as_ref(),
            tenant,
            // Plain bodies are spliced to the client (decision 025).
            may_splice: true,
        };
        let mut source = ClientBody { body, length };
        let opened = monoio::select! {
            r = Box::pin(self.ctx.egress.open(&stream_req, &mut source)) => Some(r),
            _ = &mut cancelled => None,
        };
        let mut resp = match opened {
            None => return Err(ApiError::new(ErrorCode::Cancelled, "cancelled by operator")),
            Some(r) => r?,
        };
        tracing::debug!(
            target: "sortie::proxy",
            request_id = %request_id,
            deployment = %deployment,
            worker = %assigned.decision.worker_id.as_str(),
            status = resp.status,
            "proxied response head"
        );
        let head_fields = std::mem::take(&mut resp.headers);
        let tokens = connection_tokens(&head_fields);
        let declared_length = head_fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(b"content-length"))
            .and_then(|(_, v)| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok());
        let length = match resp.body.framing() {
            ResponseFraming::ContentLength(n) => Some(n),
            // A HEAD answer relays the length the destination announced.
            ResponseFraming::None if method == Method::Head => declared_length,
            ResponseFraming::None => Some(0),
            _ => None,
        };
        let mut out = Response::new(resp.status);
        out.headers = head_fields
            .iter()
            .filter(|(n, _)| {
                !is_hop_by_hop_response_field(n, &tokens)
                    && !n.eq_ignore_ascii_case(b"content-length")
                    && !n.eq_ignore_ascii_case(b"proxy-authenticate")
            })
            .filter_map(|(n, v)| {
                let name = std::str::from_utf8(n).ok()?.to_owned();
                Some((name.into(), v.clone()))
            })
            .collect();
        // The body deadline is its idle limit alone: a long download is not cut by the head's
        // total deadline.
        resp.body
            .set_deadline(started + Duration::from_secs(365 * 24 * 3600));
        out.body = ResponseBody::Stream(Box::new(RelayedBody {
            reader: resp.body,
            length,
            request_id: request_id.to_owned(),
            failure: None,
            cancelled,
            metrics: Arc::clone(&self.ctx.metrics),
            core: self.ctx.core,
            _tracked: tracked,
            _assigned: assigned,
        }));
        Ok(out)
    }
}

/// A destination's response body on its way to the client. It holds the request's place in
/// the active list and its worker capacity until the body ends or the client leaves.
struct RelayedBody {
    reader: ResponseBodyReader,
    length: Option<u64>,
    /// For the error answer when the body fails before any byte reached the client.
    request_id: String,
    /// Why the last read failed.
    failure: Option<ApiError>,
    cancelled: Cancelled,
    /// Where spliced bytes are counted.
    metrics: Arc<crate::metrics::Metrics>,
    core: usize,
    _tracked: ActiveGuard,
    _assigned: super::api::Assigned,
}

impl StreamBody for RelayedBody {
    fn length(&self) -> Option<u64> {
        self.length
    }

    fn read_into<'a>(
        &'a mut self,
        out: &'a mut Vec<u8>,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<bool>> + 'a>> {
        Box::pin(async move {
            if self.cancelled.is_set() {
                return Err(std::io::Error::other("cancelled by operator"));
            }
            let read = monoio::select! {
                r = self.reader.read_into(out) => Some(r),
                _ = &mut self.cancelled => None,
            };
            match read {
                Some(Ok(more)) => Ok(more),
                Some(Err(e)) => {
                    let err = std::io::Error::other(e.message.clone());
                    self.failure = Some(e);
                    Err(err)
                }
                None => Err(std::io::Error::other("cancelled by operator")),
            }
        })
    }

    /// A destination whose body fails before a byte of it reached the client (a malformed
    /// first chunk, a reset, an idle destination) gets the client the registry's answer, with
    /// `Proxy-Status`, as a failure of the head would: the status line was not sent yet.
    fn failure_response(&mut self, _error: &std::io::Error) -> Option<Response> {
        let e = self.failure.take()?;
        Some(proxy_error(&e, &self.request_id))
    }

    fn take_ready(&mut self) -> Option<Bytes> {
        self.reader.take_early()
    }

    fn can_splice(&self) -> bool {
        !self.cancelled.is_set() && self.reader.can_splice()
    }

    fn splice_into<'a>(
        &'a mut self,
        client: &'a TcpStream,
        write_timeout: Duration,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<u64>> + 'a>> {
        Box::pin(async move {
            // Counted as they go: a body cut by the destination, the client or a cancel still
            // counts the bytes that reached the client.
            let moved = Cell::new(0u64);
            let outcome = monoio::select! {
                r = self.reader.splice_into(client, write_timeout, &moved) => r.map(drop),
                _ = &mut self.cancelled => {
                    Err(std::io::Error::other("cancelled by operator"))
                }
            };
            self.metrics.record_spliced(self.core, moved.get());
            outcome.map(|()| moved.get())
        })
    }
}

impl ProxyHandler {
    /// Opens a CONNECT tunnel: routing with ingress `connect`, the tunnel limit, the
    /// destination policy on the connected address, then `200` and the hand-over.
    async fn connect(
        &self,
        req: &RequestParts,
        d: DeploymentRef,
        deployment: &str,
        request_id: &str,
        started: Instant,
    ) -> Result<Response, ApiError> {
        let (host, port) = parse_connect_target(req.target())?;
        self.ctx.state.limits.denied_ports.check(port)?;
        let hints = route_hints(req.headers())?;
        let active = self.ctx.state.active();
        let host_text = match &host {
            sortie_core::request::Host::Domain(name) => name.to_string(),
            other => other.to_string().trim_matches(['[', ']']).to_string(),
        };
        let assigned = assign(
            &self.ctx,
            &active,
            deployment,
            &hints,
            Ingress::Connect,
            &host_text,
            None,
            started,
        )?;
        let permit = self.tunnels.try_take(d).ok_or_else(|| {
            ApiError::new(
                ErrorCode::ExecutorCapacityExhausted,
                format!(
                    "the deployment holds its limit of {} concurrent tunnels",
                    self.tunnels.max
                ),
            )
        })?;
        let (tracked, cancelled) = self.ctx.active.track(request_id, deployment);
        let deadline = self.deadline(started);
        let (tracked, mut cancelled, assigned, permit) = if assigned.is_remote {
            let route = Reroute {
                active: &active,
                hints: &hints,
                ingress: Ingress::Connect,
                host: &host_text,
                started,
            };
            match crate::bus::ingress::connect(
                &self.ctx,
                request_id,
                deployment,
                deadline,
                req.target(),
                &route,
                (tracked, cancelled, assigned, permit),
            )
            .await
            {
                Dispatched::Answered(r) => return r,
                // Refused by the remote workers: routing chose a local one.
                Dispatched::Local(held) => held,
            }
        } else {
            (tracked, cancelled, assigned, permit)
        };
        let (bind, connect_limit) = (
            assigned.slot.bind_address(),
            self.ctx.state.limits.egress_timeouts.connect,
        );
        let tenant = Some(d.index());
        let egress = &self.ctx.egress;
        // A pool behind an upstream proxy tunnels through it (decision 072).
        let dial = async {
            match &assigned.via {
                Some(route) => {
                    let policy = &active.policy;
                    egress
                        .dial_via(
                            route,
                            &host,
                            port,
                            bind,
                            policy,
                            connect_limit,
                            deadline,
                            tenant,
                        )
                        .await
                }
                None => egress
                    .dial(
                        &host,
                        port,
                        bind,
                        &active.policy,
                        connect_limit,
                        deadline,
                        tenant,
                    )
                    .await
                    .map(|(tcp, peer)| (TunnelStream::Tcp(tcp), peer, Vec::new())),
            }
        };
        let dialled = monoio::select! {
            r = Box::pin(dial) => Some(r),
            _ = &mut cancelled => None,
        };
        let (upstream, _peer, first_down) = match dialled {
            None => return Err(ApiError::new(ErrorCode::Cancelled, "cancelled by operator")),
            Some(r) => r?,
        };
        tracing::debug!(
            target: "sortie::proxy",
            request_id = %request_id,
            deployment = %deployment,
            worker = %assigned.decision.worker_id.as_str(),
            "tunnel open"
        );
        let tunnel = TunnelJob {
            upstream,
            first_down,
            cancelled,
            _tracked: tracked,
            _assigned: assigned,
            _permit: permit,
            metrics: self.ctx.metrics.clone(),
            core: self.ctx.core,
            idle_timeout: self.ctx.state.limits.tunnel_idle_timeout,
        };
        let mut r = Response::new(200);
        r.body = ResponseBody::Tunnel(Box::new(tunnel));
        Ok(r)
    }
}

/// An open tunnel waiting for the client's socket.
struct TunnelJob {
    upstream: TunnelStream,
    /// The destination's first bytes, when they came with an upstream proxy's reply.
    first_down: Vec<u8>,
    cancelled: Cancelled,
    _tracked: ActiveGuard,
    _assigned: super::api::Assigned,
    _permit: TunnelPermit,
    metrics: Arc<crate::metrics::Metrics>,
    core: usize,
    /// `control.proxy.tunnel_idle_timeout_ms`.
    idle_timeout: Duration,
}

impl Tunnel for TunnelJob {
    fn run(
        self: Box<Self>,
        client: TcpStream,
        early: Vec<u8>,
    ) -> Pin<Box<dyn Future<Output = ()>>> {
        Box::pin(async move {
            let TunnelJob {
                upstream,
                first_down,
                mut cancelled,
                _tracked,
                _assigned,
                _permit,
                metrics,
                core,
                idle_timeout,
            } = *self;
            let up_bytes = Cell::new(0u64);
            let down_bytes = Cell::new(0u64);
            let early = Early {
                up: early,
                down: first_down,
            };
            let relay = relay(client, upstream, early, &up_bytes, &down_bytes);
            let ended = monoio::select! {
                r = relay => match r {
                    Ok(()) => "closed",
                    Err(e) => {
                        tracing::debug!(target: "sortie::proxy", error = %e, "tunnel failed");
                        "broken"
                    }
                },
                _ = idle_watch(&up_bytes, &down_bytes, idle_timeout) => "idle",
                _ = &mut cancelled => "cancelled",
            };
            metrics.record_tunnel(core, up_bytes.get(), down_bytes.get());
            tracing::debug!(
                target: "sortie::proxy",
                bytes_up = up_bytes.get(),
                bytes_down = down_bytes.get(),
                end = ended,
                "tunnel ended"
            );
        })
    }
}

/// Completes when no byte moved in either direction for `limit`, checked every quarter of it:
/// one timer per tunnel instead of one per read.
pub(crate) async fn idle_watch(up: &Cell<u64>, down: &Cell<u64>, limit: Duration) {
    let step = limit / 4;
    let mut seen = (up.get(), down.get());
    let mut quiet = Duration::ZERO;
    loop {
        monoio::time::sleep(step).await;
        let now = (up.get(), down.get());
        if now == seen {
            quiet += step;
            if quiet >= limit {
                return;
            }
        } else {
            seen = now;
            quiet = Duration::ZERO;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::Authenticator;

    fn deployments() -> (Authenticator, DeploymentRef, DeploymentRef) {
        let auth = Authenticator::new(&[
            ("dep_a".to_string(), "token-a".to_string()),
            ("dep_b".to_string(), "token-b".to_string()),
        ]);
        let a = auth.authenticate(b"token-a").unwrap();
        let b = auth.authenticate(b"token-b").unwrap();
        (auth, a, b)
    }

    #[test]
    fn tunnel_limit_is_per_deployment_and_permits_give_back() {
        let (_auth, a, b) = deployments();
        let counts = Arc::new(TunnelCounts::new(2, 2));
        let first = counts.try_take(a).expect("first");
        let second = counts.try_take(a).expect("second");
        assert!(counts.try_take(a).is_none(), "a third tunnel of dep_a");
        assert_eq!(counts.current(a), 2);
        // Another deployment has its own count.
        let other = counts.try_take(b).expect("dep_b");
        assert_eq!(counts.current(b), 1);
        drop(first);
        assert_eq!(counts.current(a), 1);
        let again = counts.try_take(a).expect("a slot came back");
        drop((second, other, again));
        assert_eq!((counts.current(a), counts.current(b)), (0, 0));
    }

    #[test]
    fn errors_carry_proxy_status_and_the_envelope() {
        let e = ApiError::new(ErrorCode::AuthFailure, "no");
        let r = proxy_error(&e, "req_1");
        assert_eq!(r.status, 407);
        assert_eq!(
            r.header("proxy-authenticate"),
            Some(&b"Basic realm=\"sortie\""[..])
        );
        assert_eq!(
            r.header("proxy-status"),
            Some(&b"sortie; error=http_request_denied; details=\"auth_failure\""[..])
        );
        let e = ApiError::new(ErrorCode::UpstreamConnectionRefused, "refused");
        let r = proxy_error(&e, "req_2");
        assert_eq!(r.status, 502);
        assert!(r.header("proxy-authenticate").is_none());
        match &r.body {
            ResponseBody::Full(b) => {
                let v: serde_json::Value = serde_json::from_slice(b).unwrap();
                assert_eq!(v["code"], "upstream_connection_refused");
                assert_eq!(v["request_id"], "req_2");
            }
            other => panic!("{other:?}"),
        }
    }
}
