//! `POST /api/v1/requests`: authenticate, decode and validate, then the one dispatch loop
//! (`crate::dispatch::run`) with this ingress's attempt on a local or remote worker; encode the
//! result — or the one error envelope of the registry.
//!
//! This is the per-request path: no blocking, no locks but a sticky-pin shard for sticky
//! requests, per-request logs only at debug level (target `sortie::request`).

use std::time::{Duration, Instant};

use sortie_core::dispatch::{BodyState, Failure};
use sortie_core::error::{ApiError, ErrorCode};
use sortie_core::fingerprint::BUILTIN_PROFILES;
use sortie_core::ids::RequestId;
use sortie_core::proxy::{
    is_hop_by_hop_response_field, lists_field_names, response_field_name, ResponseFieldName,
};
use sortie_core::receipt::ReceiptState;
use sortie_core::request::{
    decode_request, RequestBody, ResponseBodyMode, ValidatedRequest, ValidationContext,
};
use sortie_core::result::{RequestResult, ResultBody, Timing};
use sortie_core::routing::Ingress;

use crate::dispatch::streamed::{self, Exchange, ExchangeBody, Target};
use crate::dispatch::{self, Assigned, Dispatcher, Resend, Route};
use crate::egress::EgressRequest;
use crate::tokens::{bearer, DeploymentRef};

/// An answer of the request API: status and JSON body.
pub struct ApiAnswer {
    /// HTTP status.
    pub status: u16,
    /// The JSON document in `body[body_start..]`: a transported request's result is written
    /// behind room for the HTTP head ([`crate::http::ResponseBody::BehindRoom`]).
    pub body: Vec<u8>,
    /// Where the document starts in `body`.
    pub body_start: usize,
    /// `ok` or the error code, for metrics.
    outcome: &'static str,
    /// Stage timings of a transported request, for metrics.
    stages: Option<[u64; 4]>,
}

impl ApiAnswer {
    /// The JSON document.
    pub fn document(&self) -> &[u8] {
        self.body.get(self.body_start..).unwrap_or_default()
    }
}

/// The destination's fields the envelope carries, in order: the body in the envelope is
/// already de-framed, so the fields that describe the upstream connection are left out
/// (hop-by-hop, and the names its `Connection` fields list). Each field is decided by its name
/// ([`response_field_name`]); the listed names are looked at only when a `Connection` field
/// lists one besides `keep-alive` ([`lists_field_names`]).
fn envelope_fields(fields: &crate::egress::ResponseFields) -> Vec<(&[u8], &[u8])> {
    // Sized once for every field: pushed one by one, the list would grow as it fills.
    let mut headers: Vec<(&[u8], &[u8])> = Vec::with_capacity(fields.len());
    let mut lists = false;
    for (n, v) in fields.iter() {
        match response_field_name(n) {
            ResponseFieldName::Connection => lists |= lists_field_names(v),
            ResponseFieldName::HopByHop => {}
            _ => headers.push((n, v)),
        }
    }
    if lists {
        let tokens = fields.connection_tokens();
        headers.retain(|(n, _)| !is_hop_by_hop_response_field(n, &tokens));
    }
    headers
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn error_answer(e: &ApiError, request_id: &str) -> ApiAnswer {
    ApiAnswer {
        status: e.http_status(),
        body: e.to_json(request_id),
        body_start: 0,
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
    ctx: &Dispatcher,
    authorization: Option<&[u8]>,
) -> Result<DeploymentRef, ApiAnswer> {
    if let Some(token) = authorization.and_then(bearer) {
        // The cache holds for one generation of tokens: after a reload a token is checked
        // against the new ones (decision 114).
        let generation = ctx.state.auth.generation();
        if let Some((last, d, g)) = &*ctx.last_token.borrow() {
            // Constant time in the token's bytes; only the length may differ early.
            if *g == generation && crate::tokens::secrets_equal(last, token) {
                return Ok(*d);
            }
        }
        if let Some(d) = ctx.state.auth.authenticate(token) {
            *ctx.last_token.borrow_mut() = Some((token.to_vec(), d, generation));
            return Ok(d);
        }
    }
    let request_id = sortie_core::ids::request_id(crate::tokens::random_bytes());
    let answer = auth_failure(&request_id);
    ctx.recorder
        .record(Ingress::Api, "-", answer.outcome, answer.stages);
    Err(answer)
}

/// Counts a request refused at admission (decision 043) in the metrics, as any answer is.
pub fn record_refusal(ctx: &Dispatcher, deployment: DeploymentRef, e: &ApiError) {
    let deployment = ctx.state.auth.id(deployment);
    ctx.recorder
        .record(Ingress::Api, deployment, e.code.as_str(), None);
    tracing::debug!(
        target: "sortie::request",
        deployment = %deployment,
        code = e.code.as_str(),
        "refused at admission"
    );
}

/// Serves one `POST /api/v1/requests` of an authenticated deployment whose body has been read.
pub async fn handle(
    ctx: &Dispatcher,
    d: DeploymentRef,
    content_type: Option<&[u8]>,
    body: Vec<u8>,
) -> ApiAnswer {
    let deployment = ctx.state.auth.id(d);
    let id = sortie_core::ids::request_id(crate::tokens::random_bytes());
    // The id's text, checked as UTF-8 once here rather than at each use.
    let request_id: &str = &id;
    let mut pending = Unanswered {
        ctx,
        request_id,
        deployment,
        is_answered: false,
    };
    let started = Instant::now();
    let mut target = None;
    let answer = handle_inner(
        ctx,
        &id,
        request_id,
        d,
        deployment,
        content_type,
        body,
        &mut target,
        started,
    )
    .await;
    pending.is_answered = true;
    if ctx.state.access_log() {
        let (method, destination) = target.unwrap_or(("-", String::from("-")));
        super::access::Access {
            ingress: Ingress::Api,
            request_id,
            deployment,
            method,
            destination: &destination,
            status: answer.status,
            outcome: answer.outcome,
            started,
        }
        .log();
    }
    ctx.recorder
        .record(Ingress::Api, deployment, answer.outcome, answer.stages);
    answer
}

/// Counts a request whose future was dropped before it answered (its caller left, so the HTTP
/// server dropped it) as `cancelled`: the guards inside released its capacity and upstream
/// connection on the way.
struct Unanswered<'a> {
    ctx: &'a Dispatcher,
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
            .recorder
            .record(Ingress::Api, self.deployment, outcome, None);
        tracing::debug!(
            target: "sortie::request",
            request_id = %self.request_id,
            deployment = %self.deployment,
            code = outcome,
            "caller left; request cancelled"
        );
    }
}

// Every argument is word-aligned (`id` by reference): the compiler lays a byte-aligned argument
// after the fields the future keeps across its waits, so the future not yet polled would span
// them, and each move of it (two or three per request, on the way into the connection's busy
// period) would copy 1.7 KiB instead of 120 bytes (`perf/future_sizes.sh`).
#[allow(clippy::too_many_arguments)]
async fn handle_inner(
    ctx: &Dispatcher,
    id: &RequestId,
    request_id: &str,
    d: DeploymentRef,
    deployment: &str,
    content_type: Option<&[u8]>,
    mut body: Vec<u8>,
    target: &mut Option<(&'static str, String)>,
    // When the request was admitted: the start of its timings, its deadline and its log line.
    started: Instant,
) -> ApiAnswer {
    let tenant = Some(d.index());
    if !is_json_content_type(content_type) {
        let e = ApiError::new(
            ErrorCode::InvalidRequest,
            "Content-Type must be application/json",
        );
        return error_answer(&e, request_id);
    }
    let active = ctx.active_snapshot();
    let limits = &ctx.state.limits;
    let vctx = ValidationContext {
        max_inline_request_body_bytes: limits.max_inline_request_body_bytes,
        max_timeout_ms: limits.max_timeout_ms,
        default_timeout_ms: active.snapshot.default_timeout_ms(),
        is_object_storage_enabled: ctx.receipts.is_some(),
        fingerprint_profiles: BUILTIN_PROFILES,
    };
    let mut req = match decode_request(&mut body, &vctx) {
        Ok(r) => r,
        Err(e) => return error_answer(&e, request_id),
    };
    // Decision 103: a refused port never reaches routing, a worker or a proxy.
    if let Err(e) = limits.denied_ports.check(req.url.port) {
        return error_answer(&e, request_id);
    }
    drop(body);
    if ctx.state.access_log() {
        // Scheme, host and port: never the path or query (decision 113).
        *target = Some((
            req.method.as_str(),
            format!(
                "{}://{}:{}",
                req.url.scheme.as_str(),
                req.url.host,
                req.url.port
            ),
        ));
    }
    let job = Job {
        request_id,
        deployment,
        tenant,
        deadline: started + Duration::from_millis(req.timeout_ms),
    };
    // What routing reads stays here; the request itself goes to the attempts.
    // The host's own `Arc`, so that routing's borrow does not hold the request.
    let host = req.url.host.clone();
    let hints = std::mem::take(&mut req.routing);
    let fingerprint = req.fingerprint_profile.take();
    let route = Route {
        active: &active,
        deployment,
        hints: &hints,
        ingress: Ingress::Api,
        host: &host,
        fingerprint: fingerprint.as_deref(),
        started,
    };
    let resend = Resend {
        is_replayable: req.is_replayable,
        body: match req.body {
            RequestBody::Receipt(_) => BodyState::Held,
            _ => BodyState::Whole,
        },
    };
    let (_tracked, mut cancelled) = ctx.active.track(*id, ctx.state.auth.shared_id(d));
    // A request receipt held for remote attempts, kept across refusals; released (consumed
    // or verified again) before the answer goes out.
    let mut remote_hold: Option<RemoteHold<'_>> = None;
    // A remote attempt borrows the request; a local one takes it (and its body), and nothing
    // follows a local attempt.
    let mut req = Some(req);
    let outcome = dispatch::run(ctx, &route, resend, async |assigned: &Assigned| {
        // Pinned where it is built, raced with the cancel by reference: the attempt's state is
        // not copied; and the attempt is polled first, with no random pick of a branch as
        // `select!` makes on every poll.
        let attempt = std::pin::pin!(async {
            let Some(r) = req.as_ref() else {
                return Err(internal("the request ran locally already").into());
            };
            // Both branches inline: the request's future is built in the connection's busy
            // period box, where the request before it ran, with no allocation of its own.
            if assigned.is_remote {
                remote_attempt(ctx, &job, r, &route, assigned, &mut remote_hold).await
            } else {
                // Refused by remote workers, routed to a local one: the receipt goes back to
                // `verified` before the local attempt takes it.
                if let Some(h) = remote_hold.take() {
                    h.hold.release(ReceiptState::Verified).await;
                }
                let Some(r) = req.take() else {
                    return Err(internal("the request ran locally already").into());
                };
                local_attempt(ctx, &job, r, &route, assigned)
                    .await
                    .map_err(Failure::Error)
            }
        });
        match crate::http::race(attempt, &mut cancelled).await {
            crate::http::Either::Left(r) => r,
            crate::http::Either::Right(()) => Err(Failure::Error(cancelled_error())),
        }
    })
    .await;
    if let Some(h) = remote_hold.take() {
        let to = match &outcome {
            Ok(_) => ReceiptState::Consumed,
            Err(_) => ReceiptState::Verified,
        };
        h.hold.release(to).await;
    }
    let (resp, assigned) = match outcome {
        Ok(r) => r,
        Err(e) => {
            log_failure(request_id, deployment, None, &e, started);
            return error_answer(&e, request_id);
        }
    };
    let done = Instant::now();
    let headers = envelope_fields(&resp.headers);
    // The stages end where routing chose the worker, where the worker took the request over
    // (its `Accept` for a remote one; at once for a local one: the same instant, no clock
    // read) and where the answer was whole (decision 128).
    let routed = assigned.routed.unwrap_or(started);
    let handed_over = resp.accepted_at.map_or(routed, |at| at.max(routed));
    // Each instant from the start once; the stages are the differences of those durations.
    let since = |at: Instant| at.saturating_duration_since(started);
    let (to_routed, to_handed_over, to_done) = (since(routed), since(handed_over), since(done));
    let timing = Timing {
        routing_ms: millis(to_routed),
        assignment_ms: millis(to_handed_over.saturating_sub(to_routed)),
        egress_ms: millis(to_done.saturating_sub(to_handed_over)),
        total_ms: millis(to_done),
    };
    let out = RequestResult {
        request_id,
        status: resp.status,
        headers: &headers,
        header_names_are_tokens: resp.headers.names_are_tokens(),
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
        rule = %assigned.decision.rule_id.as_str(),
        worker = %assigned.decision.worker_id.as_str(),
        status = resp.status,
        routing_ms = timing.routing_ms,
        egress_ms = timing.egress_ms,
        total_ms = timing.total_ms,
        "request done"
    );
    ApiAnswer {
        status: 200,
        body: out.to_json_behind(crate::http::RESPONSE_HEAD_ROOM),
        body_start: crate::http::RESPONSE_HEAD_ROOM,
        outcome: "ok",
        stages: Some([
            timing.routing_ms,
            timing.assignment_ms,
            timing.egress_ms,
            timing.total_ms,
        ]),
    }
}

/// What every attempt of one request shares.
struct Job<'a> {
    request_id: &'a str,
    deployment: &'a str,
    /// The deployment, for its share of the resolver (decision 045).
    tenant: crate::dns::Tenant,
    /// The request's total deadline.
    deadline: Instant,
}

/// A request receipt held for remote attempts, with its id and size: the worker fetches the
/// body from the control's signed route (decision 065).
struct RemoteHold<'a> {
    hold: streamed::Hold<'a>,
    id: String,
    size: u64,
}

fn cancelled_error() -> ApiError {
    ApiError::new(ErrorCode::Cancelled, "cancelled by operator")
}

fn internal(why: &str) -> ApiError {
    ApiError::new(ErrorCode::ControlInternalError, why.to_string())
}

fn no_storage() -> ApiError {
    ApiError::new(
        ErrorCode::BodyRefUnavailable,
        "object storage is not enabled",
    )
}

/// One attempt on a remote worker: the whole request in the assignment (a receipt body by
/// its signed URL), the response inline or streamed into a new response receipt.
async fn remote_attempt<'r>(
    ctx: &'r Dispatcher,
    job: &Job<'_>,
    req: &ValidatedRequest,
    route: &Route<'_>,
    assigned: &Assigned,
    remote_hold: &mut Option<RemoteHold<'r>>,
) -> Result<Exchange, Failure> {
    let Some(bus) = &ctx.bus else {
        return Err(ApiError::new(
            ErrorCode::TransportUnavailable,
            "no worker bus on this control",
        )
        .into());
    };
    let worker_id = assigned.decision.worker_id.as_str();
    // A receipt body is fetched by the worker from the control's signed worker route
    // (decision 065): the URL is a bearer credential and is never logged.
    let (body, receipt) = match &req.body {
        RequestBody::None => (bytes::Bytes::new(), None),
        RequestBody::Inline(b) => (bytes::Bytes::from(b.clone()), None),
        RequestBody::Receipt(id) => {
            let Some(receipts) = &ctx.receipts else {
                return Err(no_storage().into());
            };
            if let Some(e) = bus.receipt_refusal() {
                return Err(e.into());
            }
            if remote_hold.is_none() {
                let (r, hold) = streamed::take_receipt(receipts, job.deployment, id).await?;
                *remote_hold = Some(RemoteHold {
                    hold,
                    id: r.receipt_id,
                    size: r.size_bytes,
                });
            }
            let Some(base) = bus.api_base_url(worker_id) else {
                return Err(ApiError::new(
                    ErrorCode::TransportUnavailable,
                    format!("no bus lane to worker {worker_id} on this core"),
                )
                .into());
            };
            let (id, size) = remote_hold
                .as_ref()
                .map(|h| (h.id.as_str(), h.size))
                .unwrap_or_default();
            let path = receipts.signed_object_path(job.deployment, job.request_id, id);
            (bytes::Bytes::new(), Some((format!("{base}{path}"), size)))
        }
    };
    let to_receipt = req.response_body_mode == ResponseBodyMode::Receipt;
    if to_receipt && ctx.receipts.is_none() {
        return Err(no_storage().into());
    }
    let limits = ctx.state.limits;
    let remote = crate::remote::RemoteJob {
        request_id: job.request_id,
        deployment_id: job.deployment,
        method: req.method.as_str(),
        target: &req.url,
        headers: req
            .headers
            .iter()
            .map(|h| (h.name().as_bytes(), h.value()))
            .collect(),
        body,
        receipt,
        deadline: job.deadline,
        is_replayable: req.is_replayable,
        pool: assigned.decision.pool_id.as_str(),
        provider_session: assigned.decision.provider_session,
        proxy_username: assigned.via.as_ref().and_then(|v| v.username()),
        fingerprint_profile: route.fingerprint,
        max_response_bytes: match (&ctx.receipts, to_receipt) {
            (Some(r), true) => usize::try_from(r.max_object_bytes()).unwrap_or(usize::MAX),
            _ => limits.max_inline_response_body_bytes,
        },
    };
    match (&ctx.receipts, to_receipt) {
        (Some(receipts), true) => {
            // The worker's body goes into a new response receipt as it arrives.
            let (h, mut reader) = bus.start(worker_id, &remote).await?;
            let body = streamed::store_response(receipts, job.deployment, &mut reader).await?;
            Ok(Exchange {
                status: h.status,
                headers: crate::egress::ResponseFields::decoded(h.headers),
                body,
                accepted_at: reader.accepted_at(),
            })
        }
        _ => bus.execute(worker_id, &remote).await.map(|resp| Exchange {
            status: resp.status,
            headers: resp.headers,
            body: ExchangeBody::Inline {
                start: bytes::Bytes::new(),
                rest: resp.body,
            },
            accepted_at: resp.accepted_at,
        }),
    }
}

/// The attempt on a local worker: the egress client on this core, the body inline or streamed
/// from or to a receipt.
async fn local_attempt(
    ctx: &Dispatcher,
    job: &Job<'_>,
    req: ValidatedRequest,
    route: &Route<'_>,
    assigned: &Assigned,
) -> Result<Exchange, ApiError> {
    // The configuration the request started under, as routing used it.
    let active = route.active;
    let limits = ctx.state.limits;
    let (decision, slot, via) = (&assigned.decision, &assigned.slot, assigned.via.as_ref());
    // Routing only chose a worker advertising the profile, and a local worker advertises only
    // the profiles this process verified (decision 082).
    let fingerprint = match route.fingerprint {
        None => None,
        Some(name) => Some(crate::egress::fingerprint::verified(name).ok_or_else(|| {
            ApiError::new(
                ErrorCode::UnsupportedFingerprint,
                format!("this process did not verify profile {name}"),
            )
        })?),
    };
    let is_streamed = matches!(req.body, RequestBody::Receipt(_))
        || req.response_body_mode == ResponseBodyMode::Receipt;
    if let (Some(receipts), true) = (&ctx.receipts, is_streamed) {
        let target = Target {
            egress: &ctx.egress,
            policy: &active.policy,
            worker_id: &decision.worker_id,
            bind_address: slot.bind_address(),
            deadline: job.deadline,
            max_inline_response_body_bytes: limits.max_inline_response_body_bytes,
            timeouts: limits.egress_timeouts,
            via,
            tenant: job.tenant,
            fingerprint,
        };
        return streamed::execute(receipts, job.deployment, req, &target).await;
    }
    let body = match req.body {
        RequestBody::None => bytes::Bytes::new(),
        RequestBody::Inline(b) => bytes::Bytes::from(b),
        RequestBody::Receipt(_) => return Err(no_storage()),
    };
    let egress_req = EgressRequest {
        method: req.method,
        url: req.url,
        headers: req.headers,
        body,
        deadline: job.deadline,
        max_response_body_bytes: limits.max_inline_response_body_bytes,
        policy: active.policy.clone(),
        worker_id: decision.worker_id.clone(),
        bind_address: slot.bind_address(),
        is_replayable: req.is_replayable,
        timeouts: limits.egress_timeouts,
        via: via.cloned(),
        tenant: job.tenant,
        fingerprint,
    };
    // In two parts: the body's start is not copied behind the head; the envelope encodes both
    // as one.
    let resp = ctx.egress.execute_split(&egress_req).await?;
    Ok(Exchange {
        status: resp.status,
        headers: resp.headers,
        body: ExchangeBody::Inline {
            start: resp.body_start,
            rest: resp.body,
        },
        accepted_at: None,
    })
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
    use super::envelope_fields;
    use crate::egress::ResponseFields;

    /// The envelope leaves out the hop-by-hop fields and, when a `Connection` field lists
    /// them, the names it lists; it keeps the framing fields and `Host` (the body it carries
    /// is de-framed, but they still say what the destination sent).
    #[test]
    fn envelope_fields_leave_out_the_connection_fields() {
        let fields = ResponseFields::copied([
            ("Date", "d"),
            ("Connection", "keep-alive"),
            ("Keep-Alive", "timeout=5"),
            ("Content-Length", "3"),
            ("X-A", "1"),
            ("Transfer-Encoding", "chunked"),
        ]);
        let names: Vec<&[u8]> = envelope_fields(&fields).iter().map(|(n, _)| *n).collect();
        assert_eq!(names, [&b"Date"[..], b"Content-Length", b"X-A"]);
        let listed = ResponseFields::copied([
            ("X-Private", "p"),
            ("connection", "close, X-PRIVATE"),
            ("Host", "h"),
            ("Upgrade", "x"),
            ("X-B", "2"),
        ]);
        let names: Vec<&[u8]> = envelope_fields(&listed).iter().map(|(n, _)| *n).collect();
        assert_eq!(names, [&b"Host"[..], b"X-B"]);
    }
}
