//! The error registry: every error a client of the request API can see, with its category,
//! HTTP status and retry class, plus the error bodies of the receipt and admin APIs.
//!
//! The registry is the single source of truth: `docs/error-codes.md` is rendered from
//! [`ErrorCode::ALL`] by a test that fails when the file is stale, and the mapping of an error
//! to an HTTP status lives only in [`ErrorCode::http_status`].

use std::fmt;

/// Which side of the gateway caused an error (pingora's `ErrorSource`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Category {
    /// The caller sent something the contract does not allow.
    Client,
    /// No rule or worker could take the request.
    Routing,
    /// The control-to-worker leg failed.
    Transport,
    /// The worker's upstream leg failed.
    Egress,
    /// A streamed body was interrupted or is unusable.
    Streaming,
    /// The control process itself failed.
    Control,
}

impl Category {
    /// The wire name of the category.
    pub const fn as_str(self) -> &'static str {
        match self {
            Category::Client => "client",
            Category::Routing => "routing",
            Category::Transport => "transport",
            Category::Egress => "egress",
            Category::Streaming => "streaming",
            Category::Control => "control",
        }
    }
}

macro_rules! registry {
    ($( $variant:ident = ($code:literal, $cat:ident, $status:literal, $retry:literal, $meaning:literal), )*) => {
        /// A stable error code of the request API.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum ErrorCode {
            $(
                #[doc = $meaning]
                $variant,
            )*
        }

        impl ErrorCode {
            /// Every code, in the order of the contract's table.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The stable wire code.
            pub const fn as_str(self) -> &'static str {
                match self { $(ErrorCode::$variant => $code,)* }
            }

            /// The category the contract assigns to the code.
            pub const fn category(self) -> Category {
                match self { $(ErrorCode::$variant => Category::$cat,)* }
            }

            /// The outer HTTP status of the error envelope. This is the only place where an
            /// error is mapped to HTTP.
            pub const fn http_status(self) -> u16 {
                match self { $(ErrorCode::$variant => $status,)* }
            }

            /// Whether the contract marks the code retryable.
            pub const fn is_retryable(self) -> bool {
                match self { $(ErrorCode::$variant => $retry,)* }
            }

            /// The contract's one-line meaning, used as the default human message.
            pub const fn meaning(self) -> &'static str {
                match self { $(ErrorCode::$variant => $meaning,)* }
            }

            /// Looks a code up by its wire name (for example, in a worker's error frame).
            pub fn from_wire(s: &str) -> Option<ErrorCode> {
                match s { $($code => Some(ErrorCode::$variant),)* _ => None }
            }
        }
    };
}

registry! {
    AuthFailure = ("auth_failure", Client, 401, false, "invalid deployment token"),
    InvalidRequest = ("invalid_request", Client, 400, false, "malformed input"),
    HeaderInjectionFailed = ("header_injection_failed", Client, 400, false, "malformed input"),
    UnsupportedIngressMode = ("unsupported_ingress_mode", Client, 400, false, "unsupported behavior"),
    DestinationDenied = ("destination_denied", Client, 403, false, "destination policy denied target"),
    RouteNoMatch = ("route_no_match", Routing, 404, false, "no rule matched"),
    RouteUnavailable = ("route_unavailable", Routing, 503, true, "no eligible capacity now"),
    ExecutorCapacityExhausted = ("executor_capacity_exhausted", Routing, 503, true, "all eligible workers at capacity"),
    StickySessionUnavailable = ("sticky_session_unavailable", Routing, 503, false, "required sticky worker unavailable and fallback disabled"),
    AssignmentTimeout = ("assignment_timeout", Transport, 504, true, "assignment did not complete"),
    TransportUnavailable = ("transport_unavailable", Transport, 504, true, "message bus did not complete"),
    WorkerDisconnected = ("worker_disconnected", Transport, 502, true, "worker vanished mid-request"),
    ProtocolError = ("protocol_error", Transport, 502, false, "invalid protocol sequence"),
    UnsupportedFingerprint = ("unsupported_fingerprint", Transport, 400, false, "worker lacks requested profile"),
    TimeoutExceeded = ("timeout_exceeded", Transport, 504, false, "total deadline expired"),
    UpstreamDnsFailure = ("upstream_dns_failure", Egress, 502, true, "resolution failed"),
    UpstreamTlsFailure = ("upstream_tls_failure", Egress, 502, true, "TLS failed"),
    UpstreamConnectionRefused = ("upstream_connection_refused", Egress, 502, true, "connection refused"),
    UpstreamReset = ("upstream_reset", Egress, 502, true, "connection reset"),
    UpstreamProxyFailure = ("upstream_proxy_failure", Egress, 502, true, "proxy failure"),
    UpstreamConnectTimeout = ("upstream_connect_timeout", Egress, 504, true, "connect deadline expired"),
    StreamUploadAborted = ("stream_upload_aborted", Streaming, 502, false, "stream interrupted"),
    StreamDownloadAborted = ("stream_download_aborted", Streaming, 502, false, "stream interrupted"),
    BodyRefUnavailable = ("body_ref_unavailable", Streaming, 409, false, "receipt missing, expired or ineligible"),
    BodyTooLarge = ("body_too_large", Streaming, 413, false, "inline/request/response limit exceeded; no partial body"),
    ControlInternalError = ("control_internal_error", Control, 500, false, "unexpected control failure"),
    ExecutorInternalError = ("executor_internal_error", Egress, 502, false, "unexpected egress failure"),
    Cancelled = ("cancelled", Client, 499, false, "cancelled by caller or operator"),
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The stage a `timeout_exceeded` (or `upstream_connect_timeout`) error names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimeoutType {
    /// Assignment to a worker did not complete.
    Assignment,
    /// The TCP/TLS connect to the destination did not complete.
    Connect,
    /// The destination did not send a complete response head.
    ResponseHeader,
    /// No bytes moved for the idle interval.
    Idle,
    /// The request body upload did not complete.
    Upload,
    /// The response body download did not complete.
    Download,
    /// The total deadline of the request expired.
    TotalDeadline,
}

impl TimeoutType {
    /// Every timeout type, in the order of the contract's table.
    pub const ALL: &'static [TimeoutType] = &[
        TimeoutType::Assignment,
        TimeoutType::Connect,
        TimeoutType::ResponseHeader,
        TimeoutType::Idle,
        TimeoutType::Upload,
        TimeoutType::Download,
        TimeoutType::TotalDeadline,
    ];

    /// The wire name used in `timeout_type` and in `details`.
    pub const fn as_str(self) -> &'static str {
        match self {
            TimeoutType::Assignment => "assignment_timeout",
            TimeoutType::Connect => "connect_timeout",
            TimeoutType::ResponseHeader => "response_header_timeout",
            TimeoutType::Idle => "idle_timeout",
            TimeoutType::Upload => "upload_timeout",
            TimeoutType::Download => "download_timeout",
            TimeoutType::TotalDeadline => "total_deadline_timeout",
        }
    }
}

/// At most this many entries are kept in an error's `details` map.
pub const MAX_DETAILS: usize = 8;
/// A `details` key or value is cut to this many bytes.
pub const MAX_DETAIL_LEN: usize = 256;

/// An error of the request API, before it is given a request id and encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The registry code.
    pub code: ErrorCode,
    /// A message for humans. Never contains secrets or body bytes.
    pub message: String,
    /// The stage of a timeout, when the code is a timeout.
    pub timeout_type: Option<TimeoutType>,
    /// A retry hint in milliseconds.
    pub retry_after_ms: Option<u64>,
    /// The status an upstream CONNECT gateway (upstream proxy) answered; never the
    /// destination's status.
    pub upstream_status: Option<u16>,
    /// Bounded diagnostic details (see [`MAX_DETAILS`]); keys are sorted on output.
    pub details: Vec<(String, String)>,
}

impl ApiError {
    /// An error with the given code and message and no optional fields.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            timeout_type: None,
            retry_after_ms: None,
            upstream_status: None,
            details: Vec::new(),
        }
    }

    /// A timeout error naming its stage, both as `timeout_type` and in `details`.
    pub fn timeout(code: ErrorCode, stage: TimeoutType, message: impl Into<String>) -> Self {
        ApiError::new(code, message)
            .with_timeout_type(stage)
            .with_detail("timeout_type", stage.as_str())
    }

    /// Sets `timeout_type`.
    pub fn with_timeout_type(mut self, t: TimeoutType) -> Self {
        self.timeout_type = Some(t);
        self
    }

    /// Sets `retry_after_ms`.
    pub fn with_retry_after_ms(mut self, ms: u64) -> Self {
        self.retry_after_ms = Some(ms);
        self
    }

    /// Sets `upstream_status`.
    pub fn with_upstream_status(mut self, status: u16) -> Self {
        self.upstream_status = Some(status);
        self
    }

    /// Adds a diagnostic detail, keeping the map bounded: beyond [`MAX_DETAILS`] entries the
    /// detail is dropped, and keys and values are cut to [`MAX_DETAIL_LEN`] bytes.
    pub fn with_detail(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        let key = truncate_utf8(key.into(), MAX_DETAIL_LEN);
        let value = truncate_utf8(value.into(), MAX_DETAIL_LEN);
        if let Some(slot) = self.details.iter_mut().find(|(k, _)| *k == key) {
            slot.1 = value;
        } else if self.details.len() < MAX_DETAILS {
            self.details.push((key, value));
        }
        self
    }

    /// The outer HTTP status of this error.
    pub fn http_status(&self) -> u16 {
        self.code.http_status()
    }

    /// Encodes the error envelope with the request id it belongs to.
    pub fn to_json(&self, request_id: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(160 + self.message.len());
        out.extend_from_slice(b"{\"category\":");
        crate::json::write_str(&mut out, self.code.category().as_str());
        out.extend_from_slice(b",\"code\":");
        crate::json::write_str(&mut out, self.code.as_str());
        out.extend_from_slice(b",\"message\":");
        crate::json::write_str(&mut out, &self.message);
        out.extend_from_slice(b",\"retryable\":");
        out.extend_from_slice(if self.code.is_retryable() {
            b"true"
        } else {
            b"false"
        });
        out.extend_from_slice(b",\"request_id\":");
        crate::json::write_str(&mut out, request_id);
        if let Some(t) = self.timeout_type {
            out.extend_from_slice(b",\"timeout_type\":");
            crate::json::write_str(&mut out, t.as_str());
        }
        if let Some(ms) = self.retry_after_ms {
            out.extend_from_slice(b",\"retry_after_ms\":");
            out.extend_from_slice(ms.to_string().as_bytes());
        }
        if let Some(s) = self.upstream_status {
            out.extend_from_slice(b",\"upstream_status\":");
            out.extend_from_slice(s.to_string().as_bytes());
        }
        if !self.details.is_empty() {
            let mut sorted: Vec<&(String, String)> = self.details.iter().collect();
            sorted.sort();
            out.extend_from_slice(b",\"details\":{");
            for (i, (k, v)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                crate::json::write_str(&mut out, k);
                out.push(b':');
                crate::json::write_str(&mut out, v);
            }
            out.push(b'}');
        }
        out.push(b'}');
        out
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ApiError {}

impl From<ErrorCode> for ApiError {
    fn from(code: ErrorCode) -> Self {
        ApiError::new(code, code.meaning())
    }
}

fn truncate_utf8(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// The wire code of every receipt API error body.
pub const RECEIPT_ERROR_CODE: &str = "receipt_error";

/// Encodes the receipt API error body `{"code":"receipt_error","message":...}`.
pub fn receipt_error_json(message: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(48 + message.len());
    out.extend_from_slice(b"{\"code\":\"receipt_error\",\"message\":");
    crate::json::write_str(&mut out, message);
    out.push(b'}');
    out
}

/// Why the receipt API refused a call: the kind fixes the HTTP status, and every answer has the
/// body `{"code":"receipt_error","message":...}` (spec, Errors > Receipt API). This is the only
/// place a receipt API failure is mapped to HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReceiptErrorKind {
    /// 400: malformed metadata or parts.
    Malformed,
    /// 401: deployment authentication failed.
    AuthFailed,
    /// 403: invalid assignment signature on a worker's object URL.
    InvalidSignature,
    /// 404: unknown receipt id, or a path that is no receipt route (also every receipt path
    /// while object storage is disabled).
    NotFound,
    /// 409: illegal state transition (including cancel of assigned or consumed), or a receipt
    /// that changed meanwhile.
    IllegalTransition,
    /// 411: a part without an exact `Content-Length` (HTTP's own status for it).
    LengthRequired,
    /// 413: metadata over 64 KiB, or a part over the part limit (HTTP's own status for it).
    TooLarge,
    /// 500: unexpected storage failure.
    StorageFailure,
}

impl ReceiptErrorKind {
    /// Every kind, in status order.
    pub const ALL: [ReceiptErrorKind; 8] = [
        ReceiptErrorKind::Malformed,
        ReceiptErrorKind::AuthFailed,
        ReceiptErrorKind::InvalidSignature,
        ReceiptErrorKind::NotFound,
        ReceiptErrorKind::IllegalTransition,
        ReceiptErrorKind::LengthRequired,
        ReceiptErrorKind::TooLarge,
        ReceiptErrorKind::StorageFailure,
    ];

    /// The HTTP status of the kind.
    pub const fn http_status(self) -> u16 {
        match self {
            ReceiptErrorKind::Malformed => 400,
            ReceiptErrorKind::AuthFailed => 401,
            ReceiptErrorKind::InvalidSignature => 403,
            ReceiptErrorKind::NotFound => 404,
            ReceiptErrorKind::IllegalTransition => 409,
            ReceiptErrorKind::LengthRequired => 411,
            ReceiptErrorKind::TooLarge => 413,
            ReceiptErrorKind::StorageFailure => 500,
        }
    }

    /// When the kind is answered, for the rendered registry.
    pub const fn condition(self) -> &'static str {
        match self {
            ReceiptErrorKind::Malformed => "malformed metadata or parts",
            ReceiptErrorKind::AuthFailed => "deployment authentication failed",
            ReceiptErrorKind::InvalidSignature => "invalid assignment signature",
            ReceiptErrorKind::NotFound => {
                "unknown receipt ID or route (every receipt route without object storage)"
            }
            ReceiptErrorKind::IllegalTransition => {
                "illegal state transition (including cancel of assigned or consumed)"
            }
            ReceiptErrorKind::LengthRequired => "a part without an exact Content-Length",
            ReceiptErrorKind::TooLarge => "metadata over 64 KiB or a part over the part limit",
            ReceiptErrorKind::StorageFailure => "unexpected storage failure",
        }
    }
}

/// Stable `error` values of the admin API. Each fixes the HTTP status of its answer; the kinds
/// after [`AdminErrorKind::IfMatchRequired`] usually carry a diagnostic as their `error` value
/// instead of the stable one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminErrorKind {
    /// 400: If-Match is neither a quoted nor a bare revision number.
    InvalidIfMatch,
    /// 401: admin token missing or invalid.
    AuthRequired,
    /// 404: the cancellation target is not an active request.
    RequestNotFound,
    /// 409: If-Match names a stale revision.
    RevisionConflict,
    /// 428: If-Match missing on a mutation.
    IfMatchRequired,
    /// 400: a malformed or invalid body or header (a diagnostic says which).
    InvalidRequest,
    /// 404: no such route, or no such method on it.
    NotFound,
    /// 405: a route that exists answers other methods only (`Allow` lists them).
    MethodNotAllowed,
    /// 500: the control failed unexpectedly (a diagnostic says where).
    InternalError,
    /// 503: the record store cannot be reached now.
    StoreUnavailable,
}

impl AdminErrorKind {
    /// Every kind, in the order of the rendered registry.
    pub const ALL: [AdminErrorKind; 10] = [
        AdminErrorKind::InvalidIfMatch,
        AdminErrorKind::AuthRequired,
        AdminErrorKind::RequestNotFound,
        AdminErrorKind::RevisionConflict,
        AdminErrorKind::IfMatchRequired,
        AdminErrorKind::InvalidRequest,
        AdminErrorKind::NotFound,
        AdminErrorKind::MethodNotAllowed,
        AdminErrorKind::InternalError,
        AdminErrorKind::StoreUnavailable,
    ];

    /// The stable `error` value.
    pub const fn as_str(self) -> &'static str {
        match self {
            AdminErrorKind::InvalidIfMatch => "invalid_if_match",
            AdminErrorKind::AuthRequired => "admin_auth_required",
            AdminErrorKind::RequestNotFound => "request_not_found",
            AdminErrorKind::RevisionConflict => "revision_conflict",
            AdminErrorKind::IfMatchRequired => "if_match_required",
            AdminErrorKind::InvalidRequest => "invalid_request",
            AdminErrorKind::NotFound => "not_found",
            AdminErrorKind::MethodNotAllowed => "method_not_allowed",
            AdminErrorKind::InternalError => "internal_error",
            AdminErrorKind::StoreUnavailable => "store_unavailable",
        }
    }

    /// The HTTP status of the kind.
    pub const fn http_status(self) -> u16 {
        match self {
            AdminErrorKind::InvalidIfMatch | AdminErrorKind::InvalidRequest => 400,
            AdminErrorKind::AuthRequired => 401,
            AdminErrorKind::RequestNotFound | AdminErrorKind::NotFound => 404,
            AdminErrorKind::MethodNotAllowed => 405,
            AdminErrorKind::RevisionConflict => 409,
            AdminErrorKind::IfMatchRequired => 428,
            AdminErrorKind::InternalError => 500,
            AdminErrorKind::StoreUnavailable => 503,
        }
    }
}

/// Encodes the admin API error body `{"error":...}`; `error` is a stable kind or a diagnostic.
pub fn admin_error_json(error: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + error.len());
    out.extend_from_slice(b"{\"error\":");
    crate::json::write_str(&mut out, error);
    out.push(b'}');
    out
}

/// Renders the registry as the Markdown document `docs/error-codes.md`.
pub fn render_registry_markdown() -> String {
    let mut s = String::from(
        "# Error codes\n\n\
         Rendered from `core/src/error.rs` by a test; do not edit by hand.\n\n\
         ## Request API\n\n\
         | Code | Category | HTTP | Retryable | Meaning |\n|---|---|---|---|---|\n",
    );
    for c in ErrorCode::ALL {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            c.as_str(),
            c.category().as_str(),
            c.http_status(),
            if c.is_retryable() { "yes" } else { "no" },
            c.meaning()
        ));
    }
    s.push_str("\n## Timeout types\n\n");
    for t in TimeoutType::ALL {
        s.push_str(&format!("- `{}`\n", t.as_str()));
    }
    s.push_str(
        "\n## Receipt API\n\nBody: `{\"code\":\"receipt_error\",\"message\":...}`.\n\n\
         | HTTP | Condition |\n|---|---|\n",
    );
    for k in ReceiptErrorKind::ALL {
        s.push_str(&format!("| {} | {} |\n", k.http_status(), k.condition()));
    }
    s.push_str(
        "\n## Admin API\n\nBody: `{\"error\":...}`: the stable value below, or for 400, 404, \
         500 and 503 often a diagnostic that says what failed.\n\n| HTTP | error |\n|---|---|\n",
    );
    for k in AdminErrorKind::ALL {
        s.push_str(&format!("| {} | {} |\n", k.http_status(), k.as_str()));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipt_and_admin_kinds_answer_the_contract_statuses() {
        // The contract's receipt table, then HTTP's own 411 and 413.
        let receipt: Vec<u16> = ReceiptErrorKind::ALL
            .iter()
            .map(|k| k.http_status())
            .collect();
        assert_eq!(receipt, [400, 401, 403, 404, 409, 411, 413, 500]);
        let admin: Vec<(&str, u16)> = AdminErrorKind::ALL
            .iter()
            .map(|k| (k.as_str(), k.http_status()))
            .collect();
        assert_eq!(
            admin,
            [
                ("invalid_if_match", 400),
                ("admin_auth_required", 401),
                ("request_not_found", 404),
                ("revision_conflict", 409),
                ("if_match_required", 428),
                ("invalid_request", 400),
                ("not_found", 404),
                ("method_not_allowed", 405),
                ("internal_error", 500),
                ("store_unavailable", 503),
            ]
        );
    }

    #[test]
    fn registry_matches_contract_table() {
        // (code, category, status, retryable) exactly as the contract's table.
        let table: &[(&str, &str, u16, bool)] = &[
            ("auth_failure", "client", 401, false),
            ("invalid_request", "client", 400, false),
            ("header_injection_failed", "client", 400, false),
            ("unsupported_ingress_mode", "client", 400, false),
            ("destination_denied", "client", 403, false),
            ("route_no_match", "routing", 404, false),
            ("route_unavailable", "routing", 503, true),
            ("executor_capacity_exhausted", "routing", 503, true),
            ("sticky_session_unavailable", "routing", 503, false),
            ("assignment_timeout", "transport", 504, true),
            ("transport_unavailable", "transport", 504, true),
            ("worker_disconnected", "transport", 502, true),
            ("protocol_error", "transport", 502, false),
            ("unsupported_fingerprint", "transport", 400, false),
            ("timeout_exceeded", "transport", 504, false),
            ("upstream_dns_failure", "egress", 502, true),
            ("upstream_tls_failure", "egress", 502, true),
            ("upstream_connection_refused", "egress", 502, true),
            ("upstream_reset", "egress", 502, true),
            ("upstream_proxy_failure", "egress", 502, true),
            ("upstream_connect_timeout", "egress", 504, true),
            ("stream_upload_aborted", "streaming", 502, false),
            ("stream_download_aborted", "streaming", 502, false),
            ("body_ref_unavailable", "streaming", 409, false),
            ("body_too_large", "streaming", 413, false),
            ("control_internal_error", "control", 500, false),
            ("executor_internal_error", "egress", 502, false),
            ("cancelled", "client", 499, false),
        ];
        assert_eq!(ErrorCode::ALL.len(), 28);
        assert_eq!(table.len(), ErrorCode::ALL.len());
        for (code, (name, cat, status, retry)) in ErrorCode::ALL.iter().zip(table) {
            assert_eq!(code.as_str(), *name);
            assert_eq!(code.category().as_str(), *cat, "{name}");
            assert_eq!(code.http_status(), *status, "{name}");
            assert_eq!(code.is_retryable(), *retry, "{name}");
            assert_eq!(ErrorCode::from_wire(name), Some(*code));
        }
        assert_eq!(ErrorCode::from_wire("nope"), None);
    }

    #[test]
    fn envelope_has_required_fields_and_sorted_details() {
        let e = ApiError::new(ErrorCode::BodyTooLarge, "inline body over limit")
            .with_detail("limit_bytes", "1048576")
            .with_detail("direction", "request");
        let v: serde_json::Value = serde_json::from_slice(&e.to_json("req_1")).unwrap();
        assert_eq!(v["category"], "streaming");
        assert_eq!(v["code"], "body_too_large");
        assert_eq!(v["retryable"], false);
        assert_eq!(v["request_id"], "req_1");
        assert_eq!(v["details"]["limit_bytes"], "1048576");
        assert_eq!(v["details"]["direction"], "request");
        assert!(v.get("timeout_type").is_none());
        assert!(v.get("upstream_status").is_none());
        let raw = String::from_utf8(e.to_json("req_1")).unwrap();
        assert!(raw.find("direction").unwrap() < raw.find("limit_bytes").unwrap());
    }

    #[test]
    fn timeout_error_names_stage() {
        let e = ApiError::timeout(
            ErrorCode::TimeoutExceeded,
            TimeoutType::ResponseHeader,
            "no response head",
        )
        .with_retry_after_ms(250)
        .with_upstream_status(407);
        let v: serde_json::Value = serde_json::from_slice(&e.to_json("req_x")).unwrap();
        assert_eq!(v["timeout_type"], "response_header_timeout");
        assert_eq!(v["details"]["timeout_type"], "response_header_timeout");
        assert_eq!(v["retry_after_ms"], 250);
        assert_eq!(v["upstream_status"], 407);
    }

    #[test]
    fn details_are_bounded() {
        let mut e = ApiError::new(ErrorCode::InvalidRequest, "x");
        for i in 0..100 {
            e = e.with_detail(format!("k{i}"), "é".repeat(1000));
        }
        assert_eq!(e.details.len(), MAX_DETAILS);
        assert!(e.details.iter().all(|(_, v)| v.len() <= MAX_DETAIL_LEN));
        assert!(std::str::from_utf8(&e.to_json("r")).is_ok());
    }

    #[test]
    fn messages_are_escaped() {
        let e = ApiError::new(ErrorCode::InvalidRequest, "bad \"x\"\n\u{1}");
        let v: serde_json::Value = serde_json::from_slice(&e.to_json("r")).unwrap();
        assert_eq!(v["message"], "bad \"x\"\n\u{1}");
        let v: serde_json::Value = serde_json::from_slice(&receipt_error_json("a\"b")).unwrap();
        assert_eq!(v["code"], "receipt_error");
        assert_eq!(v["message"], "a\"b");
        let v: serde_json::Value = serde_json::from_slice(&admin_error_json("x\\y")).unwrap();
        assert_eq!(v["error"], "x\\y");
    }

    // Renders the document into the repository: the one file a core test touches.
    #[allow(clippy::disallowed_methods)]
    #[test]
    fn docs_error_codes_is_fresh() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/error-codes.md");
        let rendered = render_registry_markdown();
        let current = std::fs::read_to_string(path).unwrap_or_default();
        if current != rendered {
            if std::env::var_os("SORTIE_BLESS").is_some() {
                std::fs::write(path, &rendered).unwrap();
            } else {
                panic!("docs/error-codes.md is stale: run `SORTIE_BLESS=1 cargo test -p sortie-core docs_error_codes_is_fresh`");
            }
        }
    }
}
