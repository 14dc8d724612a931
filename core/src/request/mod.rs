//! The request envelope of `POST /api/v1/requests`: strict decoding of the JSON and validation of
//! every field into a [`ValidatedRequest`] (spec, Request table, Routing object, Request API
//! rules 1–4, Limits).
//!
//! This is on the per-request path: no blocking, no logging above debug.

mod headers;
mod url;

use serde::{Deserialize, Deserializer};

pub use self::headers::{check_header_totals, is_tchar, rejection_reason, validate_header, Header};
pub use self::url::{parse_host, parse_target_url, port_number, Host, Scheme, TargetUrl, UrlError};

use crate::error::{ApiError, ErrorCode};
use crate::hints::{CountryCode, RouteHints};
use crate::json::{from_slice_strict, CowStr, JsonError};
use crate::limits::{
    MAX_PROFILE_NAME_BYTES, MAX_REQUEST_ENVELOPE_BYTES, MAX_ROUTING_FIELD_BYTES, MAX_ROUTING_TAGS,
    MAX_ROUTING_TAG_BYTES, MAX_STICKY_SESSION_ID_BYTES, MIN_TIMEOUT_MS,
};

/// An HTTP method a request may use (spec: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// GET
    Get,
    /// HEAD
    Head,
    /// POST
    Post,
    /// PUT
    Put,
    /// PATCH
    Patch,
    /// DELETE
    Delete,
    /// OPTIONS
    Options,
    /// TRACE
    Trace,
}

impl Method {
    /// Parses an uppercase method name of the allowed set.
    pub fn parse(s: &str) -> Option<Method> {
        Some(match s {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "PATCH" => Method::Patch,
            "DELETE" => Method::Delete,
            "OPTIONS" => Method::Options,
            "TRACE" => Method::Trace,
            _ => return None,
        })
    }

    /// The method name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
            Method::Options => "OPTIONS",
            Method::Trace => "TRACE",
        }
    }
}

/// The body of a validated request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestBody {
    /// No body.
    None,
    /// Decoded inline bytes, within the inline request-body limit.
    Inline(Vec<u8>),
    /// A request receipt to upload from; its state is checked at dispatch.
    Receipt(String),
}

/// How the response body is returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseBodyMode {
    /// Inline, base64 in the result envelope (the default).
    InlineBase64,
    /// Stored as a response receipt (needs object storage).
    Receipt,
}

/// What validation needs to know beyond the envelope itself.
#[derive(Debug, Clone, Copy)]
pub struct ValidationContext<'a> {
    /// `control.request.max_inline_request_body_bytes`.
    pub max_inline_request_body_bytes: usize,
    /// `control.request.max_timeout_ms`: caps the default and explicit timeouts.
    pub max_timeout_ms: u64,
    /// `default_timeout_ms` of the active snapshot.
    pub default_timeout_ms: u64,
    /// Whether object storage (and so receipts) is enabled.
    pub is_object_storage_enabled: bool,
    /// Names of the built-in fingerprint profiles.
    pub fingerprint_profiles: &'a [&'a str],
}

/// A request envelope that passed every rule of the contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedRequest {
    /// The method.
    pub method: Method,
    /// The destination.
    pub url: TargetUrl,
    /// Destination headers in order, duplicates preserved.
    pub headers: Vec<Header>,
    /// The body.
    pub body: RequestBody,
    /// Routing hints.
    pub routing: RouteHints,
    /// How the response body is returned.
    pub response_body_mode: ResponseBodyMode,
    /// A built-in fingerprint profile name, or ordinary TLS.
    pub fingerprint_profile: Option<String>,
    /// The effective total deadline in milliseconds (explicit or default, capped).
    pub timeout_ms: u64,
    /// Permission for transport-level retry, as sent (default false).
    pub is_replayable: bool,
}

// Wire types: exactly the contract's fields. `present` makes an explicit `null` an error instead
// of a silent "omitted" (decision 001).

/// The request envelope as decoded, before validation; strings borrow from the request buffer.
/// Public so that benchmarks can compare JSON decoders on the same type; use [`decode_request`]
/// otherwise.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestEnvelope<'a> {
    #[serde(borrow)]
    method: CowStr<'a>,
    #[serde(borrow)]
    url: CowStr<'a>,
    #[serde(default, borrow, deserialize_with = "present")]
    headers: Option<Vec<WireHeader<'a>>>,
    #[serde(default, borrow, deserialize_with = "present")]
    body: Option<WireBody<'a>>,
    #[serde(default, borrow, deserialize_with = "present")]
    routing: Option<WireRouting<'a>>,
    #[serde(default, borrow, deserialize_with = "present")]
    response_body_mode: Option<CowStr<'a>>,
    #[serde(default, borrow, deserialize_with = "present")]
    fingerprint_profile: Option<CowStr<'a>>,
    #[serde(default, deserialize_with = "present")]
    timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    replayable: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireHeader<'a> {
    #[serde(borrow)]
    name: CowStr<'a>,
    #[serde(borrow)]
    value_base64: CowStr<'a>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireBody<'a> {
    #[serde(borrow)]
    mode: CowStr<'a>,
    #[serde(default, borrow, deserialize_with = "present")]
    data_base64: Option<CowStr<'a>>,
    #[serde(default, borrow, deserialize_with = "present")]
    receipt_id: Option<CowStr<'a>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireRouting<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    tags: Option<Vec<CowStr<'a>>>,
    #[serde(default, borrow, deserialize_with = "present")]
    country: Option<CowStr<'a>>,
    #[serde(default, borrow, deserialize_with = "present")]
    region: Option<CowStr<'a>>,
    #[serde(default, borrow, deserialize_with = "present")]
    ip_type: Option<CowStr<'a>>,
    #[serde(default, borrow, deserialize_with = "present")]
    sticky_session_id: Option<CowStr<'a>>,
}

fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

fn invalid(msg: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, msg)
}

/// Maps a strict-JSON failure of an envelope to the request API's error.
pub fn json_error(e: JsonError) -> ApiError {
    match e {
        // Decision 001: an oversized envelope is a size failure (413), not malformed input.
        JsonError::TooLarge { limit, .. } => envelope_too_large(limit),
        other => invalid(format!("request envelope: {other}")),
    }
}

/// The error for a request envelope over `limit` bytes: `body_too_large` with
/// `direction=request` and the envelope limit.
pub fn envelope_too_large(limit: usize) -> ApiError {
    ApiError::new(
        ErrorCode::BodyTooLarge,
        format!("request envelope is larger than {limit} bytes"),
    )
    .with_detail("direction", "request")
    .with_detail("limit_bytes", limit.to_string())
}

/// Decodes and validates a request envelope. `buf` is parsed in place (it is scratch space
/// afterwards).
pub fn decode_request(
    buf: &mut [u8],
    ctx: &ValidationContext<'_>,
) -> Result<ValidatedRequest, ApiError> {
    let wire: RequestEnvelope<'_> =
        from_slice_strict(buf, MAX_REQUEST_ENVELOPE_BYTES).map_err(json_error)?;
    validate(wire, ctx)
}

/// Validates a decoded envelope against every rule of the contract.
pub fn validate(
    w: RequestEnvelope<'_>,
    ctx: &ValidationContext<'_>,
) -> Result<ValidatedRequest, ApiError> {
    let method = match Method::parse(&w.method) {
        Some(m) => m,
        None if w.method.eq_ignore_ascii_case("CONNECT") => {
            return Err(invalid("method: CONNECT is not allowed on the request API"))
        }
        None if Method::parse(&w.method.to_ascii_uppercase()).is_some() => {
            return Err(invalid("method: must be uppercase"))
        }
        None => {
            return Err(invalid(
                "method: must be one of GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE",
            ))
        }
    };
    let url = parse_target_url(&w.url).map_err(|e| invalid(format!("url: {e}")))?;

    let wire_headers = w.headers.unwrap_or_default();
    // Spec, Limits: at most 64 entries; checked before decoding any value.
    check_header_totals(wire_headers.len(), &[])?;
    let mut headers = Vec::with_capacity(wire_headers.len());
    for (i, h) in wire_headers.iter().enumerate() {
        headers.push(validate_header(i, &h.name, &h.value_base64)?);
    }
    check_header_totals(headers.len(), &headers)?;

    let body = match w.body {
        None => RequestBody::None,
        Some(b) => validate_body(b, ctx)?,
    };
    // RFC 9110 §9.3.8: a client must not send content in a TRACE request.
    if method == Method::Trace && body != RequestBody::None {
        return Err(invalid("body: a TRACE request cannot carry a body"));
    }

    let routing = match w.routing {
        None => RouteHints::default(),
        Some(r) => validate_routing(r)?,
    };

    let response_body_mode = match w.response_body_mode.as_deref() {
        None | Some("inline_base64") => ResponseBodyMode::InlineBase64,
        Some("receipt") if ctx.is_object_storage_enabled => ResponseBodyMode::Receipt,
        Some("receipt") => {
            return Err(invalid(
                "response_body_mode: receipt needs object storage enabled",
            ))
        }
        Some(_) => {
            return Err(invalid(
                "response_body_mode: must be inline_base64 or receipt",
            ))
        }
    };

    let fingerprint_profile = match w.fingerprint_profile {
        None => None,
        Some(p) => {
            // A profile's own name, or an alias of it (decision 100): held as the profile's
            // name, which is what workers advertise.
            let name = if p.len() > MAX_PROFILE_NAME_BYTES {
                None
            } else if ctx.fingerprint_profiles.contains(&p.as_str()) {
                Some(p.into_owned())
            } else {
                crate::fingerprint::canonical(&p)
                    .filter(|c| ctx.fingerprint_profiles.contains(c))
                    .map(str::to_owned)
            };
            match name {
                Some(n) => Some(n),
                None => return Err(invalid("fingerprint_profile: not a built-in profile name")),
            }
        }
    };

    // Spec, Request API rule 3: the snapshot default applies when omitted; the static cap limits
    // both the default and explicit values.
    let timeout_ms = match w.timeout_ms {
        Some(t) if t < MIN_TIMEOUT_MS => {
            return Err(invalid(format!(
                "timeout_ms: must be at least {MIN_TIMEOUT_MS}"
            )))
        }
        Some(t) => t,
        None => ctx.default_timeout_ms,
    }
    .min(ctx.max_timeout_ms);

    Ok(ValidatedRequest {
        method,
        url,
        headers,
        body,
        routing,
        response_body_mode,
        fingerprint_profile,
        timeout_ms,
        is_replayable: w.replayable.unwrap_or(false),
    })
}

fn validate_body(b: WireBody, ctx: &ValidationContext<'_>) -> Result<RequestBody, ApiError> {
    match (b.mode.as_str(), b.data_base64, b.receipt_id) {
        ("inline_base64", Some(data), None) => {
            let limit = ctx.max_inline_request_body_bytes;
            // The decoded size is known from the encoded length: refuse before decoding.
            if decoded_len(&data) > limit {
                return Err(body_too_large(limit));
            }
            let bytes = sortie_b64::decode(data.as_bytes())
                .ok_or_else(|| invalid("body.data_base64: not standard base64"))?;
            if bytes.len() > limit {
                return Err(body_too_large(limit));
            }
            Ok(RequestBody::Inline(bytes))
        }
        ("inline_base64", None, _) => Err(invalid("body: inline_base64 needs data_base64")),
        ("inline_base64", Some(_), Some(_)) => {
            Err(invalid("body: inline_base64 cannot carry receipt_id"))
        }
        ("receipt", None, Some(id)) => {
            if !ctx.is_object_storage_enabled {
                return Err(invalid("body: receipt mode needs object storage enabled"));
            }
            if !crate::ids::is_receipt_id(&id) {
                return Err(invalid("body.receipt_id: not a receipt id"));
            }
            Ok(RequestBody::Receipt(id.into_owned()))
        }
        ("receipt", Some(_), _) => Err(invalid("body: receipt mode cannot carry data_base64")),
        ("receipt", None, None) => Err(invalid("body: receipt mode needs receipt_id")),
        _ => Err(invalid("body.mode: must be inline_base64 or receipt")),
    }
}

/// The decoded size of padded standard base64 (exact when the input is valid; malformed input
/// fails decoding afterwards).
fn decoded_len(b64: &str) -> usize {
    let pad = b64.bytes().rev().take(2).filter(|&b| b == b'=').count();
    (b64.len() / 4 * 3).saturating_sub(pad)
}

fn body_too_large(limit: usize) -> ApiError {
    ApiError::new(
        ErrorCode::BodyTooLarge,
        format!("inline request body is larger than {limit} bytes"),
    )
    .with_detail("direction", "request")
    .with_detail("limit_bytes", limit.to_string())
}

fn validate_routing(r: WireRouting) -> Result<RouteHints, ApiError> {
    let tags: Option<Vec<&str>> = r
        .tags
        .as_ref()
        .map(|t| t.iter().map(CowStr::as_str).collect());
    validate_routing_fields(RoutingFields {
        tags,
        country: r.country.as_deref(),
        region: r.region.as_deref(),
        ip_type: r.ip_type.as_deref(),
        sticky_session_id: r.sticky_session_id.as_deref(),
    })
}

/// Routing hints as given, before validation: by the request envelope's `routing` object or by
/// the forward proxy's `X-Service-Route-*` headers, which share these rules and messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutingFields<'a> {
    /// `tags`, in order.
    pub tags: Option<Vec<&'a str>>,
    /// `country`.
    pub country: Option<&'a str>,
    /// `region`.
    pub region: Option<&'a str>,
    /// `ip_type`.
    pub ip_type: Option<&'a str>,
    /// `sticky_session_id`.
    pub sticky_session_id: Option<&'a str>,
}

/// Validates routing hints (spec, Routing object and Limits).
pub fn validate_routing_fields(r: RoutingFields<'_>) -> Result<RouteHints, ApiError> {
    let mut hints = RouteHints::default();
    if let Some(tags) = r.tags {
        if tags.len() > MAX_ROUTING_TAGS {
            return Err(invalid(format!(
                "routing.tags: at most {MAX_ROUTING_TAGS} tags"
            )));
        }
        for (i, t) in tags.iter().enumerate() {
            if t.is_empty() {
                return Err(invalid(format!("routing.tags[{i}]: must not be empty")));
            }
            if t.len() > MAX_ROUTING_TAG_BYTES {
                return Err(invalid(format!(
                    "routing.tags[{i}]: longer than {MAX_ROUTING_TAG_BYTES} bytes"
                )));
            }
            if tags.iter().take(i).any(|prev| prev == t) {
                return Err(invalid(format!("routing.tags[{i}]: duplicate tag")));
            }
        }
        hints.tags = tags.into_iter().map(str::to_owned).collect();
    }
    if let Some(c) = r.country {
        hints.country = Some(CountryCode::parse(c).ok_or_else(|| {
            invalid("routing.country: must be a two-letter ISO 3166-1 country code")
        })?);
    }
    hints.region = bounded_field("routing.region", r.region)?;
    hints.ip_type = bounded_field("routing.ip_type", r.ip_type)?;
    if let Some(s) = r.sticky_session_id {
        if s.len() > MAX_STICKY_SESSION_ID_BYTES {
            return Err(invalid(format!(
                "routing.sticky_session_id: longer than {MAX_STICKY_SESSION_ID_BYTES} bytes"
            )));
        }
        hints.sticky_session_id = Some(s.to_owned());
    }
    Ok(hints)
}

fn bounded_field(path: &str, v: Option<&str>) -> Result<Option<String>, ApiError> {
    match v {
        Some("") => Err(invalid(format!("{path}: must not be empty"))),
        Some(s) if s.len() > MAX_ROUTING_FIELD_BYTES => Err(invalid(format!(
            "{path}: longer than {MAX_ROUTING_FIELD_BYTES} bytes"
        ))),
        other => Ok(other.map(str::to_owned)),
    }
}

#[cfg(test)]
mod tests;
