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
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use monoio::net::TcpStream;
use sortie_core::error::{ApiError, ErrorCode};
use sortie_core::h1::{BodyFraming, ResponseFraming, TargetForm};
use sortie_core::ids::RequestId;
use sortie_core::proxy::{
    connection_tokens_of, is_forwarded_request_field, parse_basic, parse_connect_target,
    proxy_http_status, proxy_status, route_hints, PROXY_AUTHENTICATE,
};
use sortie_core::request::{parse_target_url, Method};
use sortie_core::routing::Ingress;

use super::tunnel::{relay, Early};
use crate::control::admission::TunnelCounts;
use crate::control::core::Cancelled;
use crate::control::state::Active;
use crate::dispatch::{self, Assigned, Dispatcher, Holding, Resend, Route};
use crate::egress::{
    BodyLength, BodySource, ResponseBodyReader, StreamRequest, Timeouts, TunnelStream,
};
use crate::http::{
    race, Admitted, Body, BodyError, Either, Handler, RelayedFields, RequestParts, Response,
    ResponseBody, StreamBody, Tunnel,
};
use crate::remote::proxy::ProxyAssignment;
use crate::remote::BusCore;
use crate::tokens::DeploymentRef;
use sortie_core::dispatch::{BodyState, Failure};
use sortie_core::request::TargetUrl;

/// The proxy listener's handler on one core.
pub struct ProxyHandler {
    ctx: Rc<Dispatcher>,
    tunnels: Arc<TunnelCounts>,
    /// The last `Proxy-Authorization` value this core accepted, with its deployment: clients
    /// send the same one request after request; a constant-time compare with it saves the
    /// base64 decoding and the digest lookup.
    last_credential: RefCell<Option<(Vec<u8>, DeploymentRef, u64)>>,
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

fn new_request_id() -> RequestId {
    sortie_core::ids::request_id(crate::tokens::random_bytes())
}

impl ProxyHandler {
    /// A handler for one core, sharing the core's egress executor and active list through
    /// `ctx` and the tunnel counts with every core.
    pub fn new(ctx: Dispatcher, tunnels: Arc<TunnelCounts>) -> ProxyHandler {
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
        let auth = &self.ctx.state.auth;
        // The cache holds for one generation of tokens: a reload checks credentials again.
        let generation = auth.generation();
        if let Some((last, d, g)) = &*self.last_credential.borrow() {
            if *g == generation && crate::tokens::secrets_equal(last, value) {
                return Some(*d);
            }
        }
        let creds = parse_basic(value)?;
        let d = auth.authenticate(creds.password())?;
        // The id is not a secret: a plain comparison.
        if auth.id(d).as_bytes() != creds.user() {
            return None;
        }
        *self.last_credential.borrow_mut() = Some((value.to_vec(), d, generation));
        Some(d)
    }

    fn refuse(
        &self,
        e: &ApiError,
        ingress: Ingress,
        deployment: &str,
        req: &RequestParts,
    ) -> Response {
        self.ctx
            .recorder
            .record(ingress, deployment, e.code.as_str(), None);
        let request_id = new_request_id();
        let response = proxy_error(e, &request_id);
        self.access(
            ingress,
            &request_id,
            deployment,
            req,
            response.status,
            e.code.as_str(),
            Instant::now(),
        );
        response
    }

    /// The access line of one request (decision 113), when `log.access` asks for it. The id's
    /// text is read only for a line that is written.
    #[allow(clippy::too_many_arguments)]
    fn access(
        &self,
        ingress: Ingress,
        request_id: &RequestId,
        deployment: &str,
        req: &RequestParts,
        status: u16,
        outcome: &str,
        started: Instant,
    ) {
        if self.ctx.state.access_log() {
            super::access::Access {
                ingress,
                request_id: request_id.as_str(),
                deployment,
                method: req.method(),
                destination: &super::access::destination_of(req.target()),
                status,
                outcome,
                started,
            }
            .log();
        }
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
                return Err(self.refuse(&e, Ingress::Proxy, "-", req));
            }
        };
        let Some(deployment) = self.authenticate(req.header("proxy-authorization")) else {
            let e = ApiError::new(
                ErrorCode::AuthFailure,
                "missing or invalid proxy credentials (Basic: deployment id and token)",
            );
            return Err(self.refuse(&e, ingress, "-", req));
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

    async fn handle(&self, req: &RequestParts, a: ProxyAdmission, body: &mut Body<'_>) -> Response {
        let request_id = new_request_id();
        let deployment = self.ctx.state.auth.id(a.deployment);
        // The access line gives the request's time to the millisecond, from the precise clock;
        // without it the coarse one serves: the request's deadline and the routing clock.
        let started = if self.ctx.state.access_log() {
            Instant::now()
        } else {
            crate::timer::now()
        };
        let mut pending = Unanswered {
            handler: self,
            ingress: a.ingress,
            deployment,
            is_answered: false,
        };
        let outcome = match a.ingress {
            // Boxed (once per tunnel), so that an absolute-form request's future does not
            // carry the tunnel's state.
            Ingress::Connect => {
                Box::pin(self.connect(req, a.deployment, deployment, &request_id, started)).await
            }
            _ => {
                self.relay(req, a.deployment, deployment, &request_id, body, started)
                    .await
            }
        };
        pending.is_answered = true;
        let (response, code) = match outcome {
            Ok(response) => (response, "ok"),
            Err(e) => {
                tracing::debug!(
                    target: "sortie::proxy",
                    request_id = %request_id,
                    deployment = %deployment,
                    code = e.code.as_str(),
                    total_ms = started.elapsed().as_millis() as u64,
                    "proxied request failed"
                );
                (proxy_error(&e, &request_id), e.code.as_str())
            }
        };
        self.ctx.recorder.record(a.ingress, deployment, code, None);
        self.access(
            a.ingress,
            &request_id,
            deployment,
            req,
            response.status,
            code,
            started,
        );
        response
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
            ctx.recorder.record(
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
    /// The total deadline of a proxied request's head: the default timeout of the snapshot it
    /// is routed under (`active`), under the configured cap (decision 021).
    fn deadline(&self, active: &Active, started: Instant) -> Instant {
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
        d: DeploymentRef,
        deployment: &str,
        request_id: &RequestId,
        body: &mut Body<'_>,
        started: Instant,
    ) -> Result<Response, ApiError> {
        let ctx = &*self.ctx;
        let tenant = Some(d.index());
        let method = Method::parse(req.method()).ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidRequest,
                format!("method {} is not supported", req.method()),
            )
        })?;
        let url = parse_target_url(req.target()).map_err(|e| {
            ApiError::new(ErrorCode::InvalidRequest, format!("request target: {e}"))
        })?;
        ctx.state.limits.denied_ports.check(url.port)?;
        let hints = route_hints(req.headers())?;
        let active = ctx.active_snapshot();
        let tokens = connection_tokens_of(req.headers().map(|(n, v)| (n.as_bytes(), v)));
        // Sized once: collected through the filter, the list would grow as it fills.
        let mut forwarded: Vec<(&str, &[u8])> = Vec::with_capacity(req.header_count());
        forwarded.extend(
            req.headers()
                .filter(|(n, _)| is_forwarded_request_field(n, &tokens)),
        );
        let length = match body.framing() {
            BodyFraming::None | BodyFraming::ContentLength(0) => BodyLength::None,
            BodyFraming::ContentLength(n) => BodyLength::Known(n),
            BodyFraming::Chunked => BodyLength::Chunked,
        };
        let route = Route {
            active: &active,
            deployment,
            hints: &hints,
            ingress: Ingress::Proxy,
            host: &url.host,
            fingerprint: None,
            started,
        };
        // The client's body is read as it is sent: a worker that refused read none of it; a
        // lost one may have.
        let resend = Resend {
            is_replayable: false,
            body: BodyState::Streamed,
        };
        let deadline = self.deadline(&active, started);
        let (tracked, mut cancelled) = ctx.active.track(*request_id, ctx.state.auth.shared_id(d));
        let mut source = ClientBody { body, length };
        let job = ProxyJob {
            request_id,
            deployment,
            deadline,
            method: req.method(),
            target: req.target(),
            url: Some(&url),
            forwarded: &forwarded,
        };
        let (upstream, assigned) = dispatch::run(ctx, &route, resend, async |a: &Assigned| {
            if a.is_remote {
                // Boxed: inline, the remote attempt's state would be part of every local
                // request's future, and of what each request copies into its box.
                return Box::pin(remote_relay(ctx, &job, a, &mut source, &mut cancelled))
                    .await
                    .map(Upstream::Remote);
            }
            let stream_req = StreamRequest {
                method,
                url: &url,
                headers: &forwarded,
                deadline,
                timeouts: Timeouts {
                    idle: ctx.state.limits.proxy_idle_timeout,
                    ..ctx.state.limits.egress_timeouts
                },
                policy: &active.policy,
                worker_id: &a.decision.worker_id,
                bind_address: a.slot.bind_address(),
                // RFC 9110 §9.2.2: a proxy may retry an idempotent request without a body.
                is_replayable: matches!(method, Method::Get | Method::Head | Method::Options),
                via: a.via.as_ref(),
                tenant,
                // Plain bodies are spliced to the client (decision 025).
                may_splice: true,
            };
            // Raced with the cancel, the attempt polled first (no random pick of a branch).
            let open = pin!(ctx.egress.open(&stream_req, &mut source));
            match race(open, &mut cancelled).await {
                Either::Left(r) => r.map(Upstream::Local).map_err(Failure::Error),
                Either::Right(()) => Err(Failure::Error(cancelled_error())),
            }
        })
        .await?;
        let mut resp = match upstream {
            Upstream::Remote(opened) => {
                let holding = Holding::new(tracked, assigned, None);
                return Ok(opened.into_response(req.method(), cancelled, holding));
            }
            Upstream::Local(resp) => resp,
        };
        tracing::debug!(
            target: "sortie::proxy",
            request_id = %request_id,
            deployment = %deployment,
            worker = %assigned.decision.worker_id.as_str(),
            status = resp.status,
            "proxied response head"
        );
        let holding = Holding::new(tracked, assigned, None);
        let head_fields = std::mem::take(&mut resp.headers);
        let declared_length = || {
            let v = head_fields.value(b"content-length")?;
            std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok()
        };
        let length = match resp.body.framing() {
            ResponseFraming::ContentLength(n) => Some(n),
            // A HEAD answer relays the length the destination announced.
            ResponseFraming::None if method == Method::Head => declared_length(),
            ResponseFraming::None => Some(0),
            _ => None,
        };
        let mut out = Response::new(resp.status);
        // The relayed fields stay in the destination's head buffer: no copy of a name or value.
        let fields = RelayedFields::relay(head_fields, &mut out);
        // The body deadline is its idle limit alone: a long download is not cut by the head's
        // total deadline.
        resp.body
            .set_deadline(started + Duration::from_secs(365 * 24 * 3600));
        // Built straight into its box: on the stack first, it would be copied into it.
        let relayed: Box<RelayedBody> = Box::write(
            Box::new_uninit(),
            RelayedBody {
                reader: resp.body,
                fields,
                length,
                request_id: *request_id,
                failure: None,
                cancelled,
                metrics: Arc::clone(&ctx.metrics),
                core: ctx.core,
                holding: Some(holding),
            },
        );
        out.body = ResponseBody::Stream(relayed);
        Ok(out)
    }
}

/// What the attempts of one proxied request share.
struct ProxyJob<'a> {
    request_id: &'a str,
    deployment: &'a str,
    /// The head's total deadline.
    deadline: Instant,
    method: &'a str,
    target: &'a str,
    /// The target as parsed, for an absolute-form request (none for a tunnel).
    url: Option<&'a TargetUrl>,
    /// The request's fields without hop-by-hop ones.
    forwarded: &'a [(&'a str, &'a [u8])],
}

/// Where a proxied request's response comes from. Moved once per request; boxing the common
/// local case would cost an allocation per request instead.
#[allow(clippy::large_enum_variant)]
enum Upstream {
    Local(crate::egress::StreamedResponse),
    Remote(crate::remote::proxy::Opened),
}

fn cancelled_error() -> ApiError {
    ApiError::new(ErrorCode::Cancelled, "cancelled by operator")
}

/// The bus of this core, for an attempt on a remote worker.
fn bus_of(ctx: &Dispatcher) -> Result<&Rc<BusCore>, Failure> {
    ctx.bus.as_ref().ok_or_else(|| {
        Failure::Error(ApiError::new(
            ErrorCode::TransportUnavailable,
            "no worker bus on this control",
        ))
    })
}

/// What the remote worker needs of the request besides its head (decision 064).
fn proxy_assignment<'a>(job: &ProxyJob<'a>, a: &Assigned) -> ProxyAssignment<'a> {
    ProxyAssignment {
        request_id: job.request_id,
        deployment_id: job.deployment,
        deadline: job.deadline,
        pool: a.decision.pool_id.as_str().to_string(),
        provider_session: a.decision.provider_session,
        proxy_username: a.via.as_ref().and_then(|v| v.username()).map(str::to_owned),
    }
}

/// The attempt on a remote worker: the head, then (once the worker accepted) the streamed body,
/// until the response head comes back. Nothing of the body is read before `Accept`, so a
/// refusal leaves it whole for the next worker.
async fn remote_relay<B: BodySource>(
    ctx: &Dispatcher,
    job: &ProxyJob<'_>,
    a: &Assigned,
    body: &mut B,
    cancelled: &mut Cancelled,
) -> Result<crate::remote::proxy::Opened, Failure> {
    let bus = bus_of(ctx)?;
    // A head the bus cannot carry is the client's error.
    if let Err(why) = sortie_core::bus::check_request_head(job.method, job.target, job.forwarded) {
        return Err(ApiError::new(ErrorCode::InvalidRequest, why).into());
    }
    let worker_id = a.decision.worker_id.as_str();
    // The fields go to the assignment as borrowed; the URL as the parts parsed here, to a
    // worker of version 6 (decision 131).
    bus.relay(
        worker_id,
        &proxy_assignment(job, a),
        job.method,
        match job.url {
            Some(t) => sortie_core::bus::AssignUrl::Parts(t),
            None => sortie_core::bus::AssignUrl::Text(job.target),
        },
        job.forwarded,
        body,
        cancelled,
    )
    .await
}

/// A destination's response body on its way to the client. It holds the request's place in
/// the active list and its worker capacity until the destination's body ends (before its last
/// bytes go to the client, decision 127) or the client leaves.
struct RelayedBody {
    reader: Box<ResponseBodyReader>,
    /// The destination's fields the client gets.
    fields: RelayedFields,
    length: Option<u64>,
    /// For the error answer when the body fails before any byte reached the client.
    request_id: RequestId,
    /// Why the last read failed.
    failure: Option<ApiError>,
    cancelled: Cancelled,
    /// Where spliced bytes are counted.
    metrics: Arc<crate::metrics::Metrics>,
    core: usize,
    /// The request's place in the active list and its capacity, until the destination's body
    /// ends.
    holding: Option<Holding>,
}

impl RelayedBody {
    /// Lets go of the request's capacity and place in the active list once the destination's
    /// body was read whole: the worker's part is done, and a client that has the last byte
    /// may start its next request on the freed capacity at once (decision 127).
    fn release_if_ended(&mut self) {
        if self.reader.is_end() {
            self.holding = None;
        }
    }
}

impl StreamBody for RelayedBody {
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
            if self.cancelled.is_set() {
                return Err(std::io::Error::other("cancelled by operator"));
            }
            let read = {
                let read = pin!(self.reader.read_into(out));
                match race(read, &mut self.cancelled).await {
                    Either::Left(r) => Some(r),
                    Either::Right(()) => None,
                }
            };
            match read {
                Some(Ok(more)) => {
                    self.release_if_ended();
                    Ok(more)
                }
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
        let early = self.reader.take_early();
        self.release_if_ended();
        early
    }

    fn is_finished(&self) -> bool {
        !self.cancelled.is_set() && self.reader.is_end()
    }

    fn can_splice(&self) -> bool {
        !self.cancelled.is_set() && self.reader.can_splice()
    }

    fn expects_splice(&self) -> bool {
        !self.cancelled.is_set() && self.reader.expects_splice()
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
            let holding = &mut self.holding;
            let mut release = || *holding = None;
            let splice = pin!(self
                .reader
                .splice_into(client, write_timeout, &moved, &mut release));
            let outcome = match race(splice, &mut self.cancelled).await {
                Either::Left(r) => r.map(drop),
                Either::Right(()) => Err(std::io::Error::other("cancelled by operator")),
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
        request_id: &RequestId,
        started: Instant,
    ) -> Result<Response, ApiError> {
        let ctx = &*self.ctx;
        let (host, port) = parse_connect_target(req.target())?;
        ctx.state.limits.denied_ports.check(port)?;
        let hints = route_hints(req.headers())?;
        let active = ctx.active_snapshot();
        let route = Route {
            active: &active,
            deployment,
            hints: &hints,
            ingress: Ingress::Connect,
            host: &host,
            fingerprint: None,
            started,
        };
        let resend = Resend {
            is_replayable: false,
            body: BodyState::Streamed,
        };
        let deadline = self.deadline(&active, started);
        let (tracked, mut cancelled) = ctx.active.track(*request_id, ctx.state.auth.shared_id(d));
        let job = ProxyJob {
            request_id,
            deployment,
            deadline,
            method: "CONNECT",
            target: req.target(),
            url: None,
            forwarded: &[],
        };
        let tenant = Some(d.index());
        // Taken once routing found a worker, so a routing error is answered as such.
        let mut permit = None;
        let (opened, assigned) = dispatch::run(ctx, &route, resend, async |a: &Assigned| {
            if permit.is_none() {
                permit = Some(self.tunnels.try_take(d).ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::ExecutorCapacityExhausted,
                        format!(
                            "the deployment holds its limit of {} concurrent tunnels",
                            self.tunnels.max()
                        ),
                    )
                })?);
            }
            if a.is_remote {
                let bus = bus_of(ctx)?;
                if let Err(why) =
                    sortie_core::bus::check_request_head::<&str, &[u8]>("CONNECT", job.target, &[])
                {
                    return Err(ApiError::new(ErrorCode::InvalidRequest, why).into());
                }
                return bus
                    .tunnel(
                        a.decision.worker_id.as_str(),
                        &proxy_assignment(&job, a),
                        job.target,
                        &mut cancelled,
                    )
                    .await
                    .map(OpenedTunnel::Remote);
            }
            let (bind, connect_limit) = (
                a.slot.bind_address(),
                ctx.state.limits.egress_timeouts.connect,
            );
            let policy = &active.policy;
            // A pool behind an upstream proxy tunnels through it (decision 070).
            let dial = async {
                match &a.via {
                    Some(via) => {
                        ctx.egress
                            .dial_via(
                                via,
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
                    None => ctx
                        .egress
                        .dial(&host, port, bind, policy, connect_limit, deadline, tenant)
                        .await
                        .map(|(tcp, peer)| (TunnelStream::Tcp(tcp), peer, Vec::new())),
                }
            };
            match race(Box::pin(dial), &mut cancelled).await {
                Either::Left(Ok((upstream, _peer, first_down))) => {
                    Ok(OpenedTunnel::Local(upstream, first_down))
                }
                Either::Left(Err(e)) => Err(Failure::Error(e)),
                Either::Right(()) => Err(Failure::Error(cancelled_error())),
            }
        })
        .await?;
        tracing::debug!(
            target: "sortie::proxy",
            request_id = %request_id,
            deployment = %deployment,
            worker = %assigned.decision.worker_id.as_str(),
            "tunnel open"
        );
        let holding = Holding::new(tracked, assigned, permit);
        let idle_timeout = ctx.state.limits.tunnel_idle_timeout;
        let (upstream, first_down) = match opened {
            OpenedTunnel::Remote(t) => {
                let metrics = ctx.metrics.clone();
                return Ok(t.into_response(cancelled, idle_timeout, metrics, ctx.core, holding));
            }
            OpenedTunnel::Local(upstream, first_down) => (upstream, first_down),
        };
        let tunnel = TunnelJob {
            upstream,
            first_down,
            cancelled,
            _holding: holding,
            metrics: ctx.metrics.clone(),
            core: ctx.core,
            idle_timeout,
        };
        let mut r = Response::new(200);
        r.body = ResponseBody::Tunnel(Box::new(tunnel));
        Ok(r)
    }
}

/// A tunnel's upstream end: a local connection (with the destination's first bytes when they
/// came with an upstream proxy's reply), or a remote worker's stream.
enum OpenedTunnel {
    Local(TunnelStream, Vec<u8>),
    Remote(crate::remote::proxy::OpenTunnel),
}

/// An open tunnel waiting for the client's socket.
struct TunnelJob {
    upstream: TunnelStream,
    /// The destination's first bytes, when they came with an upstream proxy's reply.
    first_down: Vec<u8>,
    cancelled: Cancelled,
    /// Held as long as the tunnel: its place in the active list, capacity and tunnel permit.
    _holding: Holding,
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
                _holding,
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
                _ = crate::clock::idle_watch(&up_bytes, &down_bytes, idle_timeout) => "idle",
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::ResponseFields;

    /// Relayed fields keep their order and drop hop-by-hop fields, those `Connection` names,
    /// `Content-Length` and `Proxy-Authenticate`, for ordinary heads (written from the head's
    /// buffer) and heads past [`RelayedFields::MAX_FIELDS`] (copied out as slices) alike;
    /// either way the written head carries them.
    #[test]
    fn relayed_fields_filter_in_order_for_short_and_long_heads() {
        let head = |extra: usize| -> Vec<(String, String)> {
            let mut f: Vec<(String, String)> = [
                ("Server", "nginx"),
                ("Connection", "keep-alive, X-Hop"),
                ("Content-Length", "5"),
                ("X-Hop", "1"),
                ("Keep-Alive", "timeout=5"),
                ("Proxy-Authenticate", "Basic"),
                ("ETag", "\"a\""),
            ]
            .into_iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
            f.extend((0..extra).map(|i| (format!("X-{i}"), "v".to_string())));
            f
        };
        // The fields as a destination's HTTP/1.1 head gives them (its lines), and copied.
        let parsed = |f: Vec<(String, String)>| {
            let lines: String = f.iter().map(|(n, v)| format!("{n}: {v}\r\n")).collect();
            let text = format!("HTTP/1.1 200 OK\r\n{lines}\r\n").into_bytes();
            crate::egress::parsed_fields(Box::leak(text.into_boxed_slice()))
        };
        type Form<'a> = &'a dyn Fn(Vec<(String, String)>) -> ResponseFields;
        let forms: [Form<'_>; 2] = [&parsed, &|f| ResponseFields::copied(f)];
        for (extra, form) in [0, 57, 58, 90]
            .into_iter()
            .flat_map(|e| forms.iter().map(move |form| (e, form)))
        {
            let mut out = Response::new(200);
            let relayed = RelayedFields::relay(form(head(extra)), &mut out);
            out.body = ResponseBody::Stream(Box::new(crate::http::RelayingBody(relayed)));
            let names: Vec<&[u8]> = out.fields().map(|(n, _)| n).collect();
            let mut want: Vec<Vec<u8>> = vec![b"Server".to_vec(), b"ETag".to_vec()];
            want.extend((0..extra).map(|i| format!("X-{i}").into_bytes()));
            assert_eq!(
                names,
                want.iter().map(Vec::as_slice).collect::<Vec<_>>(),
                "{extra}"
            );
            assert_eq!(out.header("etag"), Some(&b"\"a\""[..]));
            assert_eq!(
                out.headers.is_empty(),
                extra + 7 <= RelayedFields::MAX_FIELDS
            );
            let mut written = Vec::new();
            crate::http::encode_head(
                &mut written,
                &out,
                false,
                crate::http::ConnectionField::Omit,
            )
            .expect("encodes");
            let text = String::from_utf8(written).expect("ASCII");
            assert!(text.starts_with("HTTP/1.1 200 OK\r\nServer: nginx\r\nETag: \"a\"\r\n"));
            assert!(
                !text.contains("X-Hop") && !text.contains("Keep-Alive"),
                "{text}"
            );
        }
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
