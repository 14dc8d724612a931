//! `POST /api/v1/requests`: authenticate, decode and validate, route, take capacity, execute on
//! a local worker, encode the result — or the one error envelope of the registry.
//!
//! This is the per-request path: no blocking, no locks but a sticky-pin shard for sticky
//! requests, per-request logs only at debug level (target `sortie::request`).

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sortie_core::error::{ApiError, ErrorCode};
use sortie_core::fingerprint::BUILTIN_PROFILES;
use sortie_core::proxy::{connection_tokens, is_hop_by_hop_response_field};
use sortie_core::request::{decode_request, RequestBody, ResponseBodyMode, ValidationContext};
use sortie_core::result::{RequestResult, ResultBody, Timing};
use sortie_core::routing::{Ingress, RouteRequest, StickyPins};
use sortie_core::snapshot::TemplateValues;

use super::core::ActiveRequests;
use super::state::ControlState;
use super::streamed::{self, Exchange, ExchangeBody, Target};
use crate::egress::{Egress, EgressRequest};
use crate::metrics::Metrics;
use crate::tokens::{bearer, DeploymentRef};
use subtle::ConstantTimeEq as _;

/// What a core needs to serve the request API.
pub struct ApiContext {
    /// Shared control state.
    pub state: Arc<ControlState>,
    /// Requests running on this core.
    pub active: Rc<ActiveRequests>,
    /// This core's egress executor.
    pub egress: Rc<Egress>,
    /// Metrics, written to this core's shard.
    pub metrics: Arc<Metrics>,
    /// This core's index.
    pub core: usize,
    /// Pins used for requests without a sticky id (never touched by routing then).
    no_pins: std::cell::RefCell<StickyPins>,
    /// The last token this core authenticated, with its deployment: clients send the same
    /// token request after request, and a constant-time compare with it saves the SHA-256 of
    /// the full lookup. The authenticator never changes while the process runs, so the entry
    /// cannot go stale.
    last_token: std::cell::RefCell<Option<(Vec<u8>, DeploymentRef)>>,
    /// The receipt service when object storage is enabled.
    pub receipts: Option<Arc<super::receipts::Receipts>>,
    /// This core's bus lanes, when remote workers may attach.
    pub bus: Option<Rc<crate::bus::control::BusCore>>,
}

impl ApiContext {
    /// A context for one core.
    pub fn new(
        state: Arc<ControlState>,
        active: Rc<ActiveRequests>,
        egress: Rc<Egress>,
        metrics: Arc<Metrics>,
        core: usize,
    ) -> Self {
        ApiContext {
            state,
            active,
            egress,
            metrics,
            core,
            no_pins: std::cell::RefCell::new(StickyPins::new(1)),
            last_token: std::cell::RefCell::new(None),
            receipts: None,
            bus: None,
        }
    }
}

/// An answer of the request API: status and JSON body.
pub struct ApiAnswer {
    /// HTTP status.
    pub status: u16,
    /// JSON body.
    pub body: Vec<u8>,
    /// `ok` or the error code, for metrics.
    outcome: &'static str,
    /// Stage timings of a transported request, for metrics.
    stages: Option<[u64; 4]>,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn error_answer(e: &ApiError, request_id: &str) -> ApiAnswer {
    ApiAnswer {
        status: e.http_status(),
        body: e.to_json(request_id),
        outcome: e.code.as_str(),
        stages: None,
    }
}

fn is_json_content_type(v: Option<&[u8]>) -> bool {
    let Some(v) = v else { return false };
    let media = v.split(|&b| b == b';').next().unwrap_or(b"").trim_ascii();
    media.eq_ignore_ascii_case(b"application/json")
}

fn auth_failure(request_id: &str) -> ApiAnswer {
    let e = ApiError::new(
        ErrorCode::AuthFailure,
        "missing or invalid deployment token",
    );
    error_answer(&e, request_id)
}

/// Authenticates a request from its head alone, so that an unauthenticated client is never
/// asked for its body (no `100 Continue`) and the token is checked before anything else, the
/// envelope size included (decision 001). A request without a valid deployment token gets its
/// `auth_failure` answer here.
pub fn authenticate(
    ctx: &ApiContext,
    authorization: Option<&[u8]>,
) -> Result<DeploymentRef, ApiAnswer> {
    if let Some(token) = authorization.and_then(bearer) {
        if let Some((last, d)) = &*ctx.last_token.borrow() {
            // Constant time in the token's bytes; only the length may differ early.
            if bool::from(last.as_slice().ct_eq(token)) {
                return Ok(*d);
            }
        }
        if let Some(d) = ctx.state.auth.authenticate(token) {
            *ctx.last_token.borrow_mut() = Some((token.to_vec(), d));
            return Ok(d);
        }
    }
    let request_id = sortie_core::ids::request_id(crate::tokens::random_bytes());
    let answer = auth_failure(&request_id);
    ctx.metrics
        .record(ctx.core, Ingress::Api, "-", answer.outcome, answer.stages);
    Err(answer)
}

/// Counts a request refused at admission (decision 043) in the metrics, as any answer is.
pub fn record_refusal(ctx: &ApiContext, deployment: DeploymentRef, e: &ApiError) {
    let deployment = ctx.state.auth.id(deployment);
    ctx.metrics
        .record(ctx.core, Ingress::Api, deployment, e.code.as_str(), None);
    tracing::debug!(
        target: "sortie::request",
        deployment = %deployment,
        code = e.code.as_str(),
        "refused at admission"
    );
}

/// Serves one `POST /api/v1/requests` of an authenticated deployment whose body has been read.
pub async fn handle(
    ctx: &ApiContext,
    deployment: DeploymentRef,
    content_type: Option<&[u8]>,
    body: Vec<u8>,
) -> ApiAnswer {
    let tenant = Some(deployment.index());
    let deployment = ctx.state.auth.id(deployment);
    let request_id = sortie_core::ids::request_id(crate::tokens::random_bytes());
    let mut pending = Unanswered {
        ctx,
        request_id: &request_id,
        deployment,
        is_answered: false,
    };
    let answer = handle_inner(ctx, &request_id, deployment, tenant, content_type, body).await;
    pending.is_answered = true;
    ctx.metrics.record(
        ctx.core,
        Ingress::Api,
        deployment,
        answer.outcome,
        answer.stages,
    );
    answer
}

/// Counts a request whose future was dropped before it answered (its caller left, so the HTTP
/// server dropped it) as `cancelled`: the guards inside released its capacity and upstream
/// connection on the way.
struct Unanswered<'a> {
    ctx: &'a ApiContext,
    request_id: &'a str,
    deployment: &'a str,
    is_answered: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if self.is_answered {
            return;
        }
        let outcome = ErrorCode::Cancelled.as_str();
        self.ctx
            .metrics
            .record(self.ctx.core, Ingress::Api, self.deployment, outcome, None);
        tracing::debug!(
            target: "sortie::request",
            request_id = %self.request_id,
            deployment = %self.deployment,
            code = outcome,
            "caller left; request cancelled"
        );
    }
}

async fn handle_inner(
    ctx: &ApiContext,
    request_id: &str,
    deployment: &str,
    tenant: crate::dns::Tenant,
    content_type: Option<&[u8]>,
    mut body: Vec<u8>,
) -> ApiAnswer {
    let started = Instant::now();
    let state = &ctx.state;

    if !is_json_content_type(content_type) {
        let e = ApiError::new(
            ErrorCode::InvalidRequest,
            "Content-Type must be application/json",
        );
        return error_answer(&e, request_id);
    }

    let active = state.active();
    let limits = state.limits;
    let vctx = ValidationContext {
        max_inline_request_body_bytes: limits.max_inline_request_body_bytes,
        max_timeout_ms: limits.max_timeout_ms,
        default_timeout_ms: active.snapshot.default_timeout_ms(),
        is_object_storage_enabled: ctx.receipts.is_some(),
        fingerprint_profiles: BUILTIN_PROFILES,
    };
    let req = match decode_request(&mut body, &vctx) {
        Ok(r) => r,
        Err(e) => return error_answer(&e, request_id),
    };
    // Decision 103: a refused port never reaches routing, a worker or a proxy.
    if let Err(e) = limits.denied_ports.check(req.url.port) {
        return error_answer(&e, request_id);
    }
    drop(body);
    let deadline = started + Duration::from_millis(req.timeout_ms);

    // Routing, then execution; a remote worker's refusal (or a lost lane under the replay
    // rule of decision 062) routes again without that worker.
    let mut excluded: Vec<sortie_core::routing::WorkerIndex> = Vec::new();
    // A request receipt held for remote attempts (kept across re-routing), with its id and
    // size; consumed when the exchange succeeds, verified again when it fails.
    let mut remote_hold: Option<(streamed::Hold<'_>, String, u64)> = None;
    let (assigned_at, routed, decision, outcome, _tracked) = loop {
        let assigned = match assign_excluding(
            ctx,
            &active,
            deployment,
            &req.routing,
            Ingress::Api,
            &req.url.host_str(),
            req.fingerprint_profile.as_deref(),
            started,
            &excluded,
        ) {
            Ok(a) => a,
            Err(e) => {
                log_failure(request_id, deployment, None, &e, started);
                return error_answer(&e, request_id);
            }
        };
        let routed = assigned.routed;
        let (tracked, cancelled) = ctx.active.track(request_id, deployment);
        let is_remote = active
            .table
            .worker(assigned.decision.worker)
            .is_some_and(|w| w.executor() == sortie_core::worker::Executor::Remote);
        let assigned_at = Instant::now();
        if is_remote {
            let Some(bus) = &ctx.bus else {
                let e = ApiError::new(
                    ErrorCode::TransportUnavailable,
                    "no worker bus on this control",
                );
                return error_answer(&e, request_id);
            };
            let no_storage = || {
                ApiError::new(
                    ErrorCode::BodyRefUnavailable,
                    "object storage is not enabled",
                )
            };
            let worker_id = assigned.decision.worker_id.as_str();
            // A receipt body is fetched by the worker from the control's signed worker route
            // (decision 065): the URL is a bearer credential and is never logged.
            let (body, receipt) = match &req.body {
                RequestBody::None => (bytes::Bytes::new(), None),
                RequestBody::Inline(b) => (bytes::Bytes::from(b.clone()), None),
                RequestBody::Receipt(id) => {
                    let Some(receipts) = &ctx.receipts else {
                        return error_answer(&no_storage(), request_id);
                    };
                    if let Some(e) = bus.receipt_refusal() {
                        return error_answer(&e, request_id);
                    }
                    if remote_hold.is_none() {
                        match streamed::take_receipt(receipts, deployment, id).await {
                            Ok((r, h)) => remote_hold = Some((h, r.receipt_id, r.size_bytes)),
                            Err(e) => return error_answer(&e, request_id),
                        }
                    }
                    let Some(base) = bus.api_base_url(worker_id) else {
                        let e = ApiError::new(
                            ErrorCode::TransportUnavailable,
                            format!("no bus lane to worker {worker_id} on this core"),
                        );
                        return error_answer(&e, request_id);
                    };
                    let (id, size) = remote_hold
                        .as_ref()
                        .map(|(_, id, size)| (id.as_str(), *size))
                        .unwrap_or_default();
                    let path = receipts.signed_object_path(deployment, request_id, id);
                    (bytes::Bytes::new(), Some((format!("{base}{path}"), size)))
                }
            };
            let to_receipt = req.response_body_mode == ResponseBodyMode::Receipt;
            if to_receipt && ctx.receipts.is_none() {
                return error_answer(&no_storage(), request_id);
            }
            let url = req.url.to_string();
            let job = crate::bus::control::RemoteJob {
                request_id,
                deployment_id: deployment,
                method: req.method.as_str(),
                url,
                headers: req
                    .headers
                    .iter()
                    .map(|h| (h.name.as_bytes().to_vec(), h.value.clone()))
                    .collect(),
                body,
                receipt,
                deadline,
                is_replayable: req.is_replayable,
                pool: assigned.decision.pool_id.as_str(),
                provider_session: assigned.decision.provider_session,
                proxy_username: assigned.via.as_ref().and_then(|v| v.username()),
                fingerprint_profile: req.fingerprint_profile.as_deref(),
                max_response_bytes: match (&ctx.receipts, to_receipt) {
                    (Some(r), true) => usize::try_from(r.max_object_bytes()).unwrap_or(usize::MAX),
                    _ => limits.max_inline_response_body_bytes,
                },
            };
            use crate::bus::control::RemoteFailure;
            let run = async {
                match (&ctx.receipts, to_receipt) {
                    (Some(receipts), true) => {
                        // The worker's body goes into a new response receipt as it arrives.
                        let (h, mut reader) = bus.start(worker_id, &job).await?;
                        let body = streamed::store_response(receipts, deployment, &mut reader)
                            .await
                            .map_err(RemoteFailure::Error)?;
                        Ok(Exchange {
                            status: h.status,
                            headers: h
                                .headers
                                .into_iter()
                                .map(|(n, v)| (bytes::Bytes::from(n), bytes::Bytes::from(v)))
                                .collect(),
                            body,
                        })
                    }
                    _ => bus.execute(worker_id, &job).await.map(|resp| Exchange {
                        status: resp.status,
                        headers: resp.headers,
                        body: ExchangeBody::Inline {
                            start: bytes::Bytes::new(),
                            rest: resp.body,
                        },
                    }),
                }
            };
            let r = monoio::select! {
                r = Box::pin(run) => Some(r),
                _ = cancelled => None,
            };
            // The receipt's state is written before the answer goes out; after a refusal it
            // stays assigned for the next attempt.
            let is_retry =
                matches!(r, Some(Err(RemoteFailure::Refused(_)))) && may_offer_again(&excluded);
            if !is_retry {
                if let (Some((h, _, _)), Some(r)) = (remote_hold.take(), &r) {
                    let to = if r.is_ok() {
                        sortie_core::receipt::ReceiptState::Consumed
                    } else {
                        sortie_core::receipt::ReceiptState::Verified
                    };
                    h.release(to).await;
                }
            }
            let outcome = match r {
                None => None,
                Some(Ok(exchange)) => Some(Ok(exchange)),
                Some(Err(RemoteFailure::Refused(reason))) => {
                    tracing::debug!(target: "sortie::request", request_id, worker = %assigned.decision.worker_id.as_str(), %reason, "assignment refused");
                    if may_offer_again(&excluded) {
                        excluded.push(assigned.decision.worker);
                        continue;
                    }
                    Some(Err(ApiError::new(
                        ErrorCode::ExecutorCapacityExhausted,
                        "every eligible worker refused the assignment",
                    )))
                }
                Some(Err(RemoteFailure::Lost { has_head })) => {
                    // Decision 062: re-sent once, elsewhere, only when the caller allowed it
                    // and no response byte came back; the inline body is still whole here.
                    let is_held = matches!(req.body, RequestBody::Receipt(_));
                    if req.is_replayable && !has_head && excluded.is_empty() && !is_held {
                        excluded.push(assigned.decision.worker);
                        continue;
                    }
                    Some(Err(ApiError::new(
                        ErrorCode::WorkerDisconnected,
                        format!(
                            "worker {} disconnected mid-request",
                            assigned.decision.worker_id.as_str()
                        ),
                    )))
                }
                Some(Err(RemoteFailure::Error(e))) => Some(Err(e)),
            };
            break (assigned_at, routed, assigned.decision, outcome, tracked);
        }
        // Refused by remote workers, routed to a local one: the receipt goes back to
        // `verified` before the local attempt takes it.
        if let Some((h, _, _)) = remote_hold.take() {
            h.release(sortie_core::receipt::ReceiptState::Verified)
                .await;
        }
        let decision = &assigned.decision;
        let slot = &assigned.slot;
        let via = assigned.via.as_ref();
        // Routing only chose a worker advertising the profile, and a local worker advertises
        // only the profiles this process verified (decision 082).
        let fingerprint = match req.fingerprint_profile.as_deref() {
            None => None,
            Some(name) => match crate::egress::fingerprint::verified(name) {
                Some(p) => Some(p),
                None => {
                    let e = ApiError::new(
                        ErrorCode::UnsupportedFingerprint,
                        format!("this process did not verify profile {name}"),
                    );
                    return error_answer(&e, request_id);
                }
            },
        };
        let is_streamed = matches!(req.body, RequestBody::Receipt(_))
            || req.response_body_mode == ResponseBodyMode::Receipt;
        let outcome = match (&ctx.receipts, is_streamed) {
            (Some(receipts), true) => {
                let target = Target {
                    egress: &ctx.egress,
                    policy: &active.policy,
                    worker_id: &decision.worker_id,
                    bind_address: slot.bind_address(),
                    deadline,
                    max_inline_response_body_bytes: limits.max_inline_response_body_bytes,
                    timeouts: limits.egress_timeouts,
                    via,
                    tenant,
                    fingerprint,
                };
                monoio::select! {
                    r = Box::pin(streamed::execute(receipts, deployment, req, &target)) => Some(r),
                    _ = cancelled => None,
                }
            }
            _ => {
                let body_bytes = match req.body {
                    RequestBody::None => bytes::Bytes::new(),
                    RequestBody::Inline(b) => bytes::Bytes::from(b),
                    RequestBody::Receipt(_) => {
                        let e = ApiError::new(
                            ErrorCode::BodyRefUnavailable,
                            "object storage is not enabled",
                        );
                        return error_answer(&e, request_id);
                    }
                };
                let job = EgressRequest {
                    method: req.method,
                    url: req.url,
                    headers: req.headers,
                    body: body_bytes,
                    deadline,
                    max_response_body_bytes: limits.max_inline_response_body_bytes,
                    policy: active.policy.clone(),
                    worker_id: decision.worker_id.clone(),
                    bind_address: slot.bind_address(),
                    is_replayable: req.is_replayable,
                    timeouts: limits.egress_timeouts,
                    via: via.cloned(),
                    tenant,
                    fingerprint,
                };
                monoio::select! {
                    // In two parts: the body's start is not copied behind the head; the
                    // envelope encodes both as one.
                    r = Box::pin(ctx.egress.execute_split(&job)) => Some(r.map(|resp| Exchange {
                        status: resp.status,
                        headers: resp.headers,
                        body: ExchangeBody::Inline {
                            start: resp.body_start,
                            rest: resp.body,
                        },
                    })),
                    _ = cancelled => None,
                }
            }
        };
        break (assigned_at, routed, assigned.decision, outcome, tracked);
    };
    let assigned = assigned_at;
    let decision = &decision;
    let done = Instant::now();
    let result = match outcome {
        None => Err(ApiError::new(ErrorCode::Cancelled, "cancelled by operator")),
        Some(r) => r,
    };
    match result {
        Ok(resp) => {
            // The body in the envelope is already de-framed: the fields that describe the
            // upstream connection are left out.
            let tokens = connection_tokens(&resp.headers);
            let headers: Vec<(&[u8], &[u8])> = resp
                .headers
                .iter()
                .filter(|(n, _)| !is_hop_by_hop_response_field(n, &tokens))
                .map(|(n, v)| (&n[..], &v[..]))
                .collect();
            let timing = Timing {
                routing_ms: millis(routed - started),
                assignment_ms: millis(assigned - routed),
                egress_ms: millis(done - assigned),
                total_ms: millis(done - started),
            };
            let out = RequestResult {
                request_id,
                status: resp.status,
                headers: &headers,
                body: match &resp.body {
                    ExchangeBody::Inline { start, rest } => ResultBody::InlineParts(start, rest),
                    ExchangeBody::Receipt {
                        receipt_id,
                        size_bytes,
                        sha256_hex,
                    } => ResultBody::Receipt {
                        receipt_id,
                        size_bytes: *size_bytes,
                        sha256_hex,
                    },
                },
                timing,
            };
            tracing::debug!(
                target: "sortie::request",
                request_id = %request_id,
                deployment = %deployment,
                rule = %decision.rule_id.as_str(),
                worker = %decision.worker_id.as_str(),
                status = resp.status,
                routing_ms = timing.routing_ms,
                egress_ms = timing.egress_ms,
                total_ms = timing.total_ms,
                "request done"
            );
            ApiAnswer {
                status: 200,
                body: out.to_json(),
                outcome: "ok",
                stages: Some([
                    timing.routing_ms,
                    timing.assignment_ms,
                    timing.egress_ms,
                    timing.total_ms,
                ]),
            }
        }
        Err(e) => {
            log_failure(
                request_id,
                deployment,
                Some(decision.worker_id.as_str()),
                &e,
                started,
            );
            error_answer(&e, request_id)
        }
    }
}

/// Most workers one request may be offered to: after this many refusals it fails with
/// `executor_capacity_exhausted` (decisions 062 and 067).
pub(crate) const MAX_REMOTE_ATTEMPTS: usize = 3;

/// Whether a request whose offer was just refused may be offered to another worker;
/// `refused_before` holds the workers that refused it before this one.
pub(crate) fn may_offer_again<T>(refused_before: &[T]) -> bool {
    refused_before.len() + 1 < MAX_REMOTE_ATTEMPTS
}

/// A request that routing placed on a local worker, holding one unit of its capacity until
/// dropped.
pub(crate) struct Assigned {
    /// What routing chose.
    pub(crate) decision: sortie_core::routing::RouteDecision,
    /// The chosen worker's executor slot.
    pub(crate) slot: Arc<super::state::WorkerSlot>,
    /// When routing finished.
    pub(crate) routed: Instant,
    /// The pool's upstream proxy, when it does not egress directly.
    pub(crate) via: Option<crate::egress::ProxyRoute>,
    /// The worker attaches over the bus (`sortie worker`).
    pub(crate) is_remote: bool,
    _capacity: CapacityGuard,
}

/// Routes a request (spec, Routing rules 1-6) and takes capacity on the chosen worker: the
/// forward proxy's step (a remote worker relays over the bus, decision 064). `fingerprint` is
/// the request API's named profile, checked against the worker's advertisement (Request API
/// rule 6).
#[allow(clippy::too_many_arguments)]
pub(crate) fn assign(
    ctx: &ApiContext,
    active: &super::state::Active,
    deployment: &str,
    hints: &sortie_core::routing::RouteHints,
    ingress: Ingress,
    host: &str,
    fingerprint: Option<&str>,
    started: Instant,
) -> Result<Assigned, ApiError> {
    assign_excluding(
        ctx,
        active,
        deployment,
        hints,
        ingress,
        host,
        fingerprint,
        started,
        &[],
    )
}

/// [`assign`] with workers that already refused this request counted as full.
#[allow(clippy::too_many_arguments)]
pub(crate) fn assign_excluding(
    ctx: &ApiContext,
    active: &super::state::Active,
    deployment: &str,
    hints: &sortie_core::routing::RouteHints,
    ingress: Ingress,
    host: &str,
    fingerprint: Option<&str>,
    started: Instant,
    excluded: &[sortie_core::routing::WorkerIndex],
) -> Result<Assigned, ApiError> {
    let state = &ctx.state;
    let tie_break = state.route_counter.fetch_add(1, Ordering::Relaxed);
    let route_req = RouteRequest {
        deployment_id: deployment,
        hints,
        ingress,
        host,
        tie_break,
    };
    let capacity = |w| {
        if excluded.contains(&w) {
            u32::MAX
        } else {
            active.active_on(w)
        }
    };
    let now_ms = crate::clock::monotonic_ms_at(started);
    let decision = match hints.sticky_session_id.as_deref().filter(|s| !s.is_empty()) {
        Some(sid) => state.with_pins(deployment, sid, |pins| {
            active.table.route(&route_req, pins, now_ms, &capacity)
        }),
        None => active
            .table
            .route(&route_req, &mut ctx.no_pins.borrow_mut(), now_ms, &capacity),
    };
    let decision = decision.map_err(|e| e.to_api_error())?;
    let routed = Instant::now();

    if let Some(profile) = fingerprint {
        let advertises = active
            .table
            .worker(decision.worker)
            .and_then(|w| w.capabilities())
            .is_some_and(|c| c.advertises_profile(profile));
        if !advertises {
            return Err(ApiError::new(
                ErrorCode::UnsupportedFingerprint,
                format!(
                    "worker {} does not advertise profile {profile}",
                    decision.worker_id.as_str()
                ),
            ));
        }
    }

    // A pool behind an upstream proxy: the username is rendered here, from the request's hints
    // and the provider session routing derived (decision 006), so every exchange of the request
    // uses the same one.
    let via = match active.proxy(decision.pool) {
        None => None,
        Some(pool) => {
            // A remote worker gets the rendered username in its assignment and uses the
            // pool's proxy from its applied configuration (decision 063).
            let session_hex = decision.provider_session.map(|s| s.to_hex());
            let values = TemplateValues {
                country: hints.country.as_ref().map_or("", |c| c.as_str()),
                region: hints.region.as_deref().unwrap_or(""),
                ip_type: hints.ip_type.as_deref().unwrap_or(""),
                session: session_hex
                    .as_ref()
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .unwrap_or(""),
            };
            Some(pool.route(&values, decision.provider_session)?)
        }
    };

    let Some(slot) = active.slot(decision.worker).cloned() else {
        return Err(ApiError::new(
            ErrorCode::RouteUnavailable,
            "selected worker has no local executor",
        ));
    };
    let max = active
        .table
        .worker(decision.worker)
        .and_then(|w| w.capabilities())
        .map_or(0, |c| c.max_capacity());
    if !slot.try_acquire(max) {
        return Err(ApiError::new(
            ErrorCode::ExecutorCapacityExhausted,
            "all eligible workers at capacity",
        ));
    }
    let is_remote = active
        .table
        .worker(decision.worker)
        .is_some_and(|w| w.executor() == sortie_core::worker::Executor::Remote);
    Ok(Assigned {
        decision,
        _capacity: CapacityGuard(slot.clone()),
        slot,
        routed,
        via,
        is_remote,
    })
}

struct CapacityGuard(Arc<super::state::WorkerSlot>);

impl Drop for CapacityGuard {
    fn drop(&mut self) {
        self.0.release();
    }
}

fn log_failure(
    request_id: &str,
    deployment: &str,
    worker: Option<&str>,
    e: &ApiError,
    started: Instant,
) {
    tracing::debug!(
        target: "sortie::request",
        request_id = %request_id,
        deployment = %deployment,
        worker = worker.unwrap_or("-"),
        code = e.code.as_str(),
        total_ms = millis(started.elapsed()),
        "request failed"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_offered_to_at_most_three_workers() {
        // The first and the second refusal leave room for another offer...
        assert!(may_offer_again::<u8>(&[]));
        assert!(may_offer_again(&[1u8]));
        // ...the third ends it: three offers in all, as decisions 062 and 067 say.
        assert!(!may_offer_again(&[1u8, 2]));
    }
}
