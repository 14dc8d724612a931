//! HTTP adapters: the request API and the admin API as [`crate::http::Handler`]s. They only
//! route by path, read bodies within their limits and translate answers; the logic lives in
//! `api.rs` and `admin.rs`.

use std::rc::Rc;
use std::sync::Arc;

use sortie_core::error::{admin_error_json, AdminErrorKind, ApiError, ErrorCode, ReceiptErrorKind};
use sortie_core::h1::BodyFraming;
use sortie_core::limits::{MAX_ADMIN_BODY_BYTES, MAX_REQUEST_ENVELOPE_BYTES};
use sortie_core::request::envelope_too_large;

use super::admin::{self, AdminContext, AdminRequest};
use super::api;
use super::dashboard;
use super::openapi;
use crate::control::admission::InFlight;
use crate::control::core::ActiveRequests;
use crate::control::receipts::{self, Receipts, RECEIPT_OBJECTS_PATH};
use crate::control::state::ControlState;
use crate::dispatch::Dispatcher;
use crate::egress::Egress;
use crate::http::{Admitted, Body, BodyError, Handler, RequestParts, Response};
use crate::metrics::Metrics;
use crate::tokens::DeploymentRef;

/// Path of the request API.
pub const REQUESTS_PATH: &str = "/api/v1/requests";

/// The request API listener's handler.
pub struct ApiHandler {
    ctx: Dispatcher,
}

impl ApiHandler {
    /// A handler for one core.
    pub fn new(
        state: Arc<ControlState>,
        active: Rc<ActiveRequests>,
        egress: Rc<Egress>,
        metrics: Arc<Metrics>,
        core: usize,
    ) -> ApiHandler {
        ApiHandler {
            ctx: Dispatcher::new(state, active, egress, metrics, core),
        }
    }

    /// Lets the request API assign to remote workers through this core's bus lanes.
    pub fn with_bus(mut self, bus: Rc<crate::remote::BusCore>) -> ApiHandler {
        self.ctx.bus = Some(bus);
        self
    }

    /// Enables the receipt API (object storage is on).
    pub fn with_receipts(mut self, receipts: Arc<Receipts>) -> ApiHandler {
        self.ctx.receipts = Some(receipts);
        self
    }
}

/// What [`ApiHandler::admit`] learned from the head.
pub enum ApiAdmission {
    /// Answered 404 or 405 without reading a body.
    Other,
    /// `POST /api/v1/requests` of this deployment, with what its admission holds (decision
    /// 043).
    Request(DeploymentRef, InFlight),
    /// A receipt client route of this deployment.
    Receipt(DeploymentRef),
    /// The signed worker route; the signature is checked in the handler.
    Worker,
}

fn envelope_error(e: &ApiError) -> Response {
    let id = sortie_core::ids::request_id(crate::tokens::random_bytes());
    Response::json(e.http_status(), e.to_json(&id))
}

impl Handler for ApiHandler {
    /// What the head showed: the route and, where one is needed, the authenticated deployment.
    type Admission = ApiAdmission;

    fn admit(&self, req: &RequestParts) -> Result<Admitted<Self::Admission>, Response> {
        if is_receipt_path(req.path()) {
            return self.admit_receipt(req);
        }
        if req.path() != REQUESTS_PATH || req.method() != "POST" {
            // A route that takes no body answers a request that brings one as it answers any
            // other (404, 405), from the head: not 413 for a body limit of zero. The server
            // discards the body within its drain bound.
            if !matches!(req.framing(), BodyFraming::None) {
                return Err(other_route(req.method(), req.path()));
            }
            return Ok(Admitted {
                body_limit: 0,
                admission: ApiAdmission::Other,
            });
        }
        // One byte over the limit is read so that an oversized chunked envelope is told apart
        // from one exactly at the limit.
        let body_limit = MAX_REQUEST_ENVELOPE_BYTES as u64 + 1;
        let deployment = match api::authenticate(&self.ctx, req.header("authorization")) {
            Ok(deployment) => deployment,
            Err(answer) => return Err(Response::json(answer.status, answer.body)),
        };
        // The body's share of the budget is reserved before a byte of it is read: the declared
        // length (a larger one is refused by the server as 413), or the limit when chunked.
        let body_bytes = match req.framing() {
            BodyFraming::None => 0,
            BodyFraming::ContentLength(n) => n.min(body_limit),
            BodyFraming::Chunked => body_limit,
        };
        match self.ctx.state.admission.try_admit(deployment, body_bytes) {
            Ok(in_flight) => Ok(Admitted {
                body_limit,
                admission: ApiAdmission::Request(deployment, in_flight),
            }),
            Err(e) => {
                api::record_refusal(&self.ctx, deployment, &e);
                Err(envelope_error(&e).closing())
            }
        }
    }

    async fn handle(
        &self,
        req: &RequestParts,
        deployment: Self::Admission,
        body: &mut Body<'_>,
    ) -> Response {
        // The in-flight share is held until the answer is built, or until the future is dropped.
        let (deployment, _in_flight) = match deployment {
            ApiAdmission::Receipt(d) => {
                let Some(receipts) = &self.ctx.receipts else {
                    return receipts_disabled();
                };
                let id = self.ctx.state.auth.id(d);
                return receipts
                    .handle(
                        id,
                        req.method(),
                        req.path(),
                        req.header("x-service-part-sha256"),
                        body,
                    )
                    .await;
            }
            ApiAdmission::Worker => {
                let Some(receipts) = &self.ctx.receipts else {
                    return receipts_disabled();
                };
                return receipts.worker_object(req.path(), req.query()).await;
            }
            ApiAdmission::Request(d, in_flight) => (d, in_flight),
            ApiAdmission::Other => return other_route(req.method(), req.path()),
        };
        let limit = MAX_REQUEST_ENVELOPE_BYTES as u64;
        // The envelope came with its head (nearly always): taken without a read's future.
        let read = match body.take_to_end(limit) {
            Some(read) => read,
            None => body.read_to_end(limit).await,
        };
        let bytes = match read {
            Ok(b) => b,
            Err(BodyError::TooLarge) => {
                return envelope_error(&envelope_too_large(MAX_REQUEST_ENVELOPE_BYTES)).closing()
            }
            Err(e) => {
                let err = ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!("request body: {}", e.reason()),
                );
                return envelope_error(&err).closing();
            }
        };
        let answer = api::handle(&self.ctx, deployment, req.header("content-type"), bytes).await;
        Response::json_behind_room(answer.status, answer.body, answer.body_start)
    }

    fn error_response(&self, status: u16, reason: &'static str) -> Response {
        let id = sortie_core::ids::request_id(crate::tokens::random_bytes());
        // The status stays the server's (400, 408, 413, 414, 431, 503...): it describes the HTTP
        // failure; the body is the registry envelope so API clients can parse it.
        Response::json(status, server_error(status, reason).to_json(&id))
    }
}

/// The answer of the request API's listener on a route other than `POST` to the requests path
/// and the receipt routes: the OpenAPI document, 405 on the requests path, 404 elsewhere.
fn other_route(method: &str, path: &str) -> Response {
    if path == openapi::OPENAPI_PATH {
        openapi_document(method, openapi::API_DOCUMENT)
    } else if path == REQUESTS_PATH {
        admin_error(AdminErrorKind::MethodNotAllowed).with_header("allow", "POST")
    } else {
        admin_error(AdminErrorKind::NotFound)
    }
}

/// The answer of every receipt path without object storage (spec, Receipt API: the routes
/// exist only when it is enabled).
fn receipts_disabled() -> Response {
    receipts::error(ReceiptErrorKind::NotFound, "object storage is not enabled")
}

/// The answer of an admin-style error `kind` with its stable `error` value.
pub(crate) fn admin_error(kind: AdminErrorKind) -> Response {
    admin_diagnostic(kind, kind.as_str())
}

/// The answer of an admin-style error `kind` whose `error` says what failed.
fn admin_diagnostic(kind: AdminErrorKind, message: &str) -> Response {
    Response::json(kind.http_status(), admin_error_json(message))
}

impl ApiHandler {
    /// Admits a receipt route from its head: 404 without object storage (before any body is
    /// read), no token for the signed worker route, the deployment token otherwise, and the
    /// route's body limit.
    fn admit_receipt(&self, req: &RequestParts) -> Result<Admitted<ApiAdmission>, Response> {
        if self.ctx.receipts.is_none() {
            return Err(receipts_disabled());
        }
        if req.path().starts_with(RECEIPT_OBJECTS_PATH) {
            if !matches!(req.method(), "GET" | "HEAD") {
                return Err(receipts::error(
                    ReceiptErrorKind::NotFound,
                    "unknown receipt route",
                ));
            }
            return Ok(Admitted {
                body_limit: 0,
                admission: ApiAdmission::Worker,
            });
        }
        let deployment = match api::authenticate(&self.ctx, req.header("authorization")) {
            Ok(d) => d,
            Err(_) => {
                return Err(receipts::error(
                    ReceiptErrorKind::AuthFailed,
                    "deployment authentication failed",
                ))
            }
        };
        let (content_length, is_chunked) = match req.framing() {
            sortie_core::h1::BodyFraming::ContentLength(n) => (Some(n), false),
            sortie_core::h1::BodyFraming::Chunked => (None, true),
            sortie_core::h1::BodyFraming::None => (None, false),
        };
        let limit = receipts::admit(req.method(), req.path(), content_length, is_chunked)?;
        Ok(Admitted {
            body_limit: limit,
            admission: ApiAdmission::Receipt(deployment),
        })
    }
}

/// Whether `path` is one of the receipt API's routes.
fn is_receipt_path(path: &str) -> bool {
    ["/api/v1/receipts", "/api/v1/receipt-objects"]
        .iter()
        .any(|p| path == *p || path.strip_prefix(p).is_some_and(|r| r.starts_with('/')))
}

/// `GET` (or `HEAD`) of a listener's OpenAPI document; no token needed.
fn openapi_document(method: &str, document: &'static [u8]) -> Response {
    match method {
        "GET" | "HEAD" => Response::new(200)
            .with_content_type(crate::http::CONTENT_TYPE_JSON)
            .with_header("cache-control", "no-cache")
            .with_body(bytes::Bytes::from_static(document)),
        _ => admin_error(AdminErrorKind::MethodNotAllowed).with_header("allow", "GET, HEAD"),
    }
}

/// The registry error for a failure the HTTP server detected before the request API ran.
pub(crate) fn server_error(status: u16, reason: &str) -> ApiError {
    match status {
        413 => ApiError::new(
            ErrorCode::BodyTooLarge,
            format!("request too large: {reason}"),
        )
        .with_detail("direction", "request")
        .with_detail("limit_bytes", MAX_REQUEST_ENVELOPE_BYTES.to_string()),
        // Too many connections on this core: retryable, like any capacity shortage.
        503 => ApiError::new(
            ErrorCode::RouteUnavailable,
            format!("gateway busy: {reason}"),
        ),
        _ => ApiError::new(
            ErrorCode::InvalidRequest,
            format!("malformed HTTP request: {reason}"),
        ),
    }
}

/// The admin listener's handler.
pub struct AdminHandler {
    ctx: Arc<AdminContext>,
}

impl AdminHandler {
    /// A handler over the shared admin context.
    pub fn new(ctx: Arc<AdminContext>) -> AdminHandler {
        AdminHandler { ctx }
    }
}

impl Handler for AdminHandler {
    type Admission = ();

    /// Public routes (probes, the OpenAPI document, the dashboard's files; decision 050) take
    /// no body. Everything else needs the admin token, checked here from the head: a request
    /// without it is refused before a body byte is read, and its connection is closed rather
    /// than drained (decision 040).
    fn admit(&self, req: &RequestParts) -> Result<Admitted<()>, Response> {
        let path = req.path();
        if dashboard::is_dashboard_path(path)
            || admin::is_public_path(path)
            || path == openapi::OPENAPI_PATH
        {
            return Ok(Admitted {
                body_limit: 0,
                admission: (),
            });
        }
        if !admin::is_authorized(&self.ctx, req.header("authorization")) {
            return Err(admin_error(AdminErrorKind::AuthRequired).closing());
        }
        Ok(Admitted {
            body_limit: MAX_ADMIN_BODY_BYTES as u64 + 1,
            admission: (),
        })
    }

    async fn handle(&self, req: &RequestParts, _: (), body: &mut Body<'_>) -> Response {
        if req.path() == openapi::OPENAPI_PATH {
            return openapi_document(req.method(), openapi::ADMIN_DOCUMENT);
        }
        if dashboard::is_dashboard_path(req.path()) {
            return dashboard::serve(req.method(), req.path(), req.header("if-none-match"));
        }
        let bytes = match body.read_to_end(MAX_ADMIN_BODY_BYTES as u64).await {
            Ok(b) => b,
            Err(BodyError::TooLarge) => {
                return admin_diagnostic(
                    AdminErrorKind::InvalidRequest,
                    &admin::body_too_large_message(),
                )
                .closing()
            }
            Err(e) => {
                return admin_diagnostic(AdminErrorKind::InvalidRequest, e.reason()).closing()
            }
        };
        let method = if req.method() == "HEAD" {
            "GET"
        } else {
            req.method()
        };
        let answer = admin::handle(
            &self.ctx,
            AdminRequest {
                method,
                path: req.path(),
                authorization: req.header("authorization"),
                if_match: req.header("if-match"),
                actor: req.header("x-service-actor"),
                body: bytes,
            },
        )
        .await;
        let mut r = Response::new(answer.status)
            .with_content_type(answer.content_type)
            .with_body(answer.body);
        if let Some(tag) = answer.etag {
            r = r.with_header("etag", tag);
        }
        r
    }

    fn error_response(&self, status: u16, reason: &'static str) -> Response {
        // Spec, Admin API errors: a body over the 4 MiB mutation limit is a decode error (400),
        // whether the server sees it from the declared length or while reading; the server's own
        // 413 would give the same failure two statuses.
        if status == 413 {
            return admin_diagnostic(
                AdminErrorKind::InvalidRequest,
                &admin::body_too_large_message(),
            );
        }
        Response::json(status, admin_error_json(reason))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_map_to_registry_codes() {
        let e = server_error(413, "body_too_large");
        assert_eq!(e.code, ErrorCode::BodyTooLarge);
        assert!(e
            .details
            .contains(&("limit_bytes".into(), "4194304".into())));
        let e = server_error(503, "too_many_connections");
        assert_eq!(e.code, ErrorCode::RouteUnavailable);
        assert!(e.code.is_retryable());
        for s in [400, 408, 414, 431, 501, 505] {
            assert_eq!(server_error(s, "x").code, ErrorCode::InvalidRequest, "{s}");
        }
    }
}
