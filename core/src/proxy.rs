//! Decisions of the forward-proxy ingress (decisions 020–023): proxy credentials, routing hints
//! from `X-Service-Route-*` headers, which fields travel on to the destination and back, the
//! CONNECT authority, and errors as HTTP status plus an RFC 9209 `Proxy-Status` field.
//!
//! On the per-request path of the proxy listener: small allocations only, no logging.

use crate::ascii::eq_lower;
use crate::error::{ApiError, ErrorCode, TimeoutType};
use crate::request::{
    parse_host, port_number, rejection_reason, validate_routing_fields, Host, RoutingFields,
};
use crate::routing::RouteHints;

/// The `Proxy-Authenticate` value of a 407 answer (decision 020).
pub const PROXY_AUTHENTICATE: &str = "Basic realm=\"sortie\"";

/// The name the gateway gives itself in `Proxy-Status` (RFC 9209 §2: a token or string
/// identifying the intermediary).
pub const PROXY_STATUS_NAME: &str = "sortie";

/// Credentials of a `Proxy-Authorization: Basic` field: the decoded `user:password` pair.
#[derive(Clone, PartialEq, Eq)]
pub struct BasicCredentials {
    decoded: Vec<u8>,
    colon: usize,
}

impl std::fmt::Debug for BasicCredentials {
    /// The password is a deployment token: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BasicCredentials")
            .field("user", &String::from_utf8_lossy(self.user()))
            .finish_non_exhaustive()
    }
}

impl BasicCredentials {
    /// The user (the deployment id).
    pub fn user(&self) -> &[u8] {
        self.decoded.get(..self.colon).unwrap_or_default()
    }

    /// The password (the deployment token).
    pub fn password(&self) -> &[u8] {
        self.decoded.get(self.colon + 1..).unwrap_or_default()
    }
}

/// Parses a `Proxy-Authorization` value of the Basic scheme (RFC 7617): the scheme name in any
/// case, one or more spaces, then standard base64 of `user:password` (the user holds no colon).
/// `None` for any other scheme or a malformed value.
pub fn parse_basic(value: &[u8]) -> Option<BasicCredentials> {
    let value = value.trim_ascii();
    let (scheme, rest) = value.split_at_checked(5)?;
    if !scheme.eq_ignore_ascii_case(b"basic") || rest.first() != Some(&b' ') {
        return None;
    }
    let encoded = rest.trim_ascii_start();
    let decoded = sortie_b64::decode(encoded)?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    Some(BasicCredentials { decoded, colon })
}

/// The routing-hint headers (spec, Routing object) and the field each one stands for.
const HINT_HEADERS: &[(&str, Hint)] = &[
    ("x-service-route-tags", Hint::Tags),
    ("x-service-route-country", Hint::Country),
    ("x-service-route-region", Hint::Region),
    ("x-service-route-ip-type", Hint::IpType),
    ("x-service-route-sticky-session", Hint::Sticky),
];

/// The prefix every routing header shares; an unknown name under it is refused, so that a
/// misspelt hint is not silently ignored.
const HINT_PREFIX: &str = "x-service-route-";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hint {
    Tags,
    Country,
    Region,
    IpType,
    Sticky,
}

/// Routing hints from the `X-Service-Route-*` fields of a proxied request (decision 021):
/// `-Tags` is a comma-separated list (several fields are joined, as for any list field, RFC
/// 9110 §5.3), the others appear at most once. The values pass the request API's validation
/// with its messages (`routing.tags[0]: must not be empty`, ...). Errors are
/// `invalid_request`.
pub fn route_hints<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> Result<RouteHints, ApiError> {
    let mut fields = RoutingFields::default();
    for (name, value) in headers {
        if name.len() < HINT_PREFIX.len()
            || !name
                .as_bytes()
                .get(..HINT_PREFIX.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(HINT_PREFIX.as_bytes()))
        {
            continue;
        }
        let Some((_, hint)) = HINT_HEADERS
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
        else {
            return Err(invalid(format!("{name}: unknown routing header")));
        };
        let value = std::str::from_utf8(value)
            .map_err(|_| invalid(format!("{name}: the value is not UTF-8")))?
            .trim_matches([' ', '\t']);
        let single = |slot: &mut Option<&'a str>| {
            if slot.replace(value).is_some() {
                Err(invalid(format!("{name}: given more than once")))
            } else {
                Ok(())
            }
        };
        match hint {
            Hint::Tags => fields
                .tags
                .get_or_insert_with(Vec::new)
                .extend(value.split(',').map(|t| t.trim_matches([' ', '\t']))),
            Hint::Country => single(&mut fields.country)?,
            Hint::Region => single(&mut fields.region)?,
            Hint::IpType => single(&mut fields.ip_type)?,
            Hint::Sticky => single(&mut fields.sticky_session_id)?,
        }
    }
    validate_routing_fields(fields)
}

fn invalid(message: String) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, message)
}

/// Whether a request field of a proxied request travels on to the destination (decision 021).
///
/// Dropped: everything the request API refuses from a caller (`Host`, which is rewritten from
/// the request target as RFC 9112 §3.2.2 requires, framing fields, hop-by-hop fields,
/// `Expect`, proxy credentials, every `X-Service-*`) and every field the request's
/// `Connection` fields name (RFC 9110 §7.6.1). `connection_tokens` are those names.
pub fn is_forwarded_request_field(name: &str, connection_tokens: &[&[u8]]) -> bool {
    rejection_reason(name).is_none()
        && !connection_tokens
            .iter()
            .any(|t| t.eq_ignore_ascii_case(name.as_bytes()))
}

/// Fields of a response that describe the connection, not the message (RFC 9110 §7.6.1).
/// [`is_fixed_connection_field`] matches them by length; a test holds the two together.
#[cfg(test)]
const RESPONSE_CONNECTION_FIELDS: &[&[u8]] = &[
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"transfer-encoding",
    b"te",
    b"trailer",
    b"upgrade",
];

/// The names listed by the `Connection` fields among `fields`.
pub fn connection_tokens<'a, N: AsRef<[u8]> + 'a, V: AsRef<[u8]> + 'a>(
    fields: impl IntoIterator<Item = &'a (N, V)>,
) -> ConnectionTokens<'a> {
    connection_tokens_of(fields.into_iter().map(|(n, v)| (n.as_ref(), v.as_ref())))
}

/// [`connection_tokens`] of fields given as (name, value) slices, as a parsed head yields them.
pub fn connection_tokens_of<'a>(
    fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
) -> ConnectionTokens<'a> {
    let mut tokens = ConnectionTokens {
        inline: [&[]; INLINE_TOKENS],
        len: 0,
        more: Vec::new(),
    };
    fields
        .into_iter()
        .filter(|(n, _)| eq_lower(n, b"connection"))
        .flat_map(|(_, v)| list_tokens(v))
        .for_each(|t| tokens.push(t));
    tokens
}

/// Tokens [`ConnectionTokens`] holds without allocating: a head lists one or two
/// (`keep-alive`, `close`, `upgrade`), and this runs for every proxied request and response.
const INLINE_TOKENS: usize = 4;

/// The names a head's `Connection` fields list ([`connection_tokens`]); dereferences to a slice.
pub struct ConnectionTokens<'a> {
    inline: [&'a [u8]; INLINE_TOKENS],
    len: usize,
    /// Every token, once there are more than fit inline.
    more: Vec<&'a [u8]>,
}

impl<'a> ConnectionTokens<'a> {
    fn push(&mut self, token: &'a [u8]) {
        if self.more.is_empty() {
            if let Some(slot) = self.inline.get_mut(self.len) {
                *slot = token;
                self.len += 1;
                return;
            }
            self.more.extend_from_slice(&self.inline);
        }
        self.more.push(token);
    }
}

impl<'a> std::ops::Deref for ConnectionTokens<'a> {
    type Target = [&'a [u8]];

    fn deref(&self) -> &[&'a [u8]] {
        if self.more.is_empty() {
            self.inline.get(..self.len).unwrap_or_default()
        } else {
            &self.more
        }
    }
}

/// Whether a response field is hop-by-hop: a fixed connection field or a name the response's
/// `Connection` fields list (`connection_tokens`). Such fields are not relayed.
pub fn is_hop_by_hop_response_field(name: &[u8], connection_tokens: &[&[u8]]) -> bool {
    is_fixed_connection_field(name) || is_listed(name, connection_tokens)
}

/// Whether `name` is a fixed connection field: `Connection`, `Keep-Alive`,
/// `Proxy-Connection`, `Transfer-Encoding`, `TE`, `Trailer`, `Upgrade`
/// ([`response_field_name`]'s table).
fn is_fixed_connection_field(name: &[u8]) -> bool {
    matches!(
        response_field_name(name),
        ResponseFieldName::Connection | ResponseFieldName::HopByHop
    )
}

fn is_listed(name: &[u8], connection_tokens: &[&[u8]]) -> bool {
    connection_tokens
        .iter()
        .any(|t| name.eq_ignore_ascii_case(t))
}

/// Whether a destination's response field goes back to the forward proxy's client: not
/// hop-by-hop, not `Content-Length` (the proxy frames the body it relays itself), and not
/// `Proxy-Authenticate` (a challenge for the destination's proxy is not the gateway's; decision
/// 021). The same rule for a local and a remote worker's response.
pub fn is_relayed_response_field(name: &[u8], connection_tokens: &[&[u8]]) -> bool {
    use ResponseFieldName::{Connection, HopByHop, NotRelayed};
    !matches!(
        response_field_name(name),
        NotRelayed | Connection | HopByHop
    ) && !is_listed(name, connection_tokens)
}

/// What a response field's name alone says of where the field goes: the forward proxy's
/// relayed head and the request API's envelope decide every ordinary head with it, one match
/// by length per field, and look at the `Connection` names only when a `Connection` field
/// lists one that could matter ([`lists_field_names`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseFieldName {
    /// Any other field: relayed and carried in the envelope, unless a `Connection` field
    /// names it.
    Ordinary,
    /// `Date`: ordinary, and the relay's stand-in for the server's own.
    Date,
    /// `Host`: carried in the envelope; the server writes its own framing fields, and a
    /// relayed head never carries the destination's.
    Host,
    /// `Content-Length` and `Proxy-Authenticate`: carried in the envelope, never relayed (the
    /// proxy frames the body itself; a challenge for the destination's proxy is not the
    /// gateway's, decision 021).
    NotRelayed,
    /// `Connection`: hop-by-hop, and its value names more hop-by-hop fields.
    Connection,
    /// The other fixed connection fields: `Keep-Alive`, `Proxy-Connection`,
    /// `Transfer-Encoding`, `TE`, `Trailer`, `Upgrade`.
    HopByHop,
}

/// [`ResponseFieldName`] of `name`, in any case: the one table of known response fields, by
/// length first (this runs for every field of every relayed response, and an ordinary field's
/// length matches none of them, or one or two). [`is_relayed_response_field`] and
/// [`is_hop_by_hop_response_field`] read it; a test holds it to
/// [`crate::h1::is_writer_owned`].
pub fn response_field_name(name: &[u8]) -> ResponseFieldName {
    use ResponseFieldName::{Connection, Date, HopByHop, Host, NotRelayed, Ordinary};
    let is = |known: &[u8]| eq_lower(name, known);
    match name.len() {
        2 if is(b"te") => HopByHop,
        4 if is(b"date") => Date,
        4 if is(b"host") => Host,
        7 if is(b"trailer") || is(b"upgrade") => HopByHop,
        10 if is(b"connection") => Connection,
        10 if is(b"keep-alive") => HopByHop,
        14 if is(b"content-length") => NotRelayed,
        16 if is(b"proxy-connection") => HopByHop,
        17 if is(b"transfer-encoding") => HopByHop,
        18 if is(b"proxy-authenticate") => NotRelayed,
        _ => Ordinary,
    }
}

/// Whether a `Connection` field's value lists a name that can change what is relayed: any
/// but `keep-alive`, whose field is hop-by-hop anyway. An ordinary response lists
/// `keep-alive` or nothing, so its fields are decided by their names alone.
pub fn lists_field_names(connection_value: &[u8]) -> bool {
    list_tokens(connection_value).any(|t| !eq_lower(t, b"keep-alive"))
}

/// The non-empty, trimmed members of a comma-separated field value.
fn list_tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// Parses the authority-form target of `CONNECT` (RFC 9110 §9.3.6: `uri-host ":" port`, the
/// port required and non-zero). Errors are `invalid_request`.
pub fn parse_connect_target(target: &str) -> Result<(Host, u16), ApiError> {
    let bad = |why: &str| invalid(format!("CONNECT target {why}"));
    let colon = target.rfind(':').ok_or_else(|| bad("has no port"))?;
    let (host, port) = (&target[..colon], &target[colon + 1..]);
    let port = port_number(port).ok_or_else(|| bad("has an invalid port"))?;
    if host.contains('@') {
        return Err(bad("must not carry user info"));
    }
    let host = parse_host(host).map_err(|e| bad(&format!("has an invalid host: {e}")))?;
    Ok((host, port))
}

/// The HTTP status of an error on the proxy listener: the registry's, except that a missing or
/// wrong proxy credential is `407 Proxy Authentication Required` (RFC 9110 §15.5.8) rather
/// than the request API's 401, which a proxy client would take for the destination's.
pub fn proxy_http_status(code: ErrorCode) -> u16 {
    match code {
        ErrorCode::AuthFailure => 407,
        other => other.http_status(),
    }
}

/// The RFC 9209 §2.3 proxy error type for a registry error (decision 023).
pub fn proxy_error_type(code: ErrorCode, timeout: Option<TimeoutType>) -> &'static str {
    use ErrorCode as C;
    match code {
        C::UpstreamDnsFailure => "dns_error",
        C::DestinationDenied => "destination_ip_prohibited",
        C::UpstreamConnectionRefused => "connection_refused",
        C::UpstreamConnectTimeout => "connection_timeout",
        C::UpstreamTlsFailure => "tls_protocol_error",
        C::UpstreamReset | C::WorkerDisconnected => "connection_terminated",
        C::ProtocolError => "http_protocol_error",
        C::StreamDownloadAborted => "http_response_incomplete",
        C::BodyTooLarge => "http_response_body_size",
        C::TimeoutExceeded => match timeout {
            Some(TimeoutType::Connect) => "connection_timeout",
            Some(TimeoutType::Idle | TimeoutType::Download) => "connection_read_timeout",
            Some(TimeoutType::Upload) => "connection_write_timeout",
            Some(TimeoutType::TotalDeadline) | None => "http_response_timeout",
            Some(TimeoutType::ResponseHeader | TimeoutType::Assignment) => "http_response_timeout",
        },
        C::AuthFailure => "http_request_denied",
        C::InvalidRequest
        | C::HeaderInjectionFailed
        | C::UnsupportedIngressMode
        | C::StreamUploadAborted => "http_request_error",
        C::RouteNoMatch | C::UnsupportedFingerprint | C::UpstreamProxyFailure => {
            "proxy_configuration_error"
        }
        C::RouteUnavailable | C::StickySessionUnavailable => "destination_unavailable",
        C::ExecutorCapacityExhausted => "connection_limit_reached",
        C::AssignmentTimeout | C::TransportUnavailable => "proxy_internal_error",
        C::Cancelled | C::BodyRefUnavailable => "proxy_internal_response",
        C::ControlInternalError | C::ExecutorInternalError => "proxy_internal_error",
    }
}

/// The `Proxy-Status` value of an error: `sortie; error=<type>; details="<code>"` (RFC 9209
/// §2.1.1 and §2.1.5). The code is a registry token, so it needs no escaping.
pub fn proxy_status(e: &ApiError) -> String {
    format!(
        "{PROXY_STATUS_NAME}; error={}; details=\"{}\"",
        proxy_error_type(e.code, e.timeout_type),
        e.code.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn basic_credentials() {
        let v = format!("Basic {}", b64("dep_default:tok:en"));
        let c = parse_basic(v.as_bytes()).unwrap();
        assert_eq!(c.user(), b"dep_default");
        assert_eq!(c.password(), b"tok:en");
        assert!(!format!("{c:?}").contains("tok"));
        let spaced = format!("bAsIc   {}  ", b64("a:"));
        let c = parse_basic(spaced.as_bytes()).unwrap();
        assert_eq!((c.user(), c.password()), (&b"a"[..], &b""[..]));
        for bad in [
            "".to_string(),
            "Basic".into(),
            "Basic ".into(),
            format!("Bearer {}", b64("a:b")),
            format!("Basicx{}", b64("a:b")),
            format!("Basic {}", b64("no-colon")),
            "Basic !!!".into(),
            format!("Basic {}", b64("ab:cd").trim_end_matches('=')),
        ] {
            assert!(parse_basic(bad.as_bytes()).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn hints_from_headers() {
        let h: &[(&str, &[u8])] = &[
            ("Accept", b"*/*"),
            ("X-Service-Route-Tags", b"residential, fast"),
            ("x-service-route-tags", b"eu"),
            ("X-Service-Route-Country", b" de "),
            ("X-Service-Route-Region", b"eu-west"),
            ("X-Service-Route-IP-Type", b"residential"),
            ("X-Service-Route-Sticky-Session", b"s1"),
        ];
        let hints = route_hints(h.iter().copied()).unwrap();
        assert_eq!(hints.tags, ["residential", "fast", "eu"]);
        assert_eq!(hints.country.unwrap().as_str(), "DE");
        assert_eq!(hints.region.as_deref(), Some("eu-west"));
        assert_eq!(hints.ip_type.as_deref(), Some("residential"));
        assert_eq!(hints.sticky_session_id.as_deref(), Some("s1"));
        assert!(route_hints([("Host", &b"a"[..])]).unwrap().is_empty());
    }

    #[test]
    fn bad_hints_use_the_request_api_messages() {
        let long = "x".repeat(129);
        type Fields<'a> = &'a [(&'a str, &'a [u8])];
        let table: &[(Fields, &str)] = &[
            (
                &[("X-Service-Route-Tags", b"a,,b")],
                "routing.tags[1]: must not be empty",
            ),
            (
                &[("X-Service-Route-Tags", b"a, a")],
                "routing.tags[1]: duplicate tag",
            ),
            (
                &[("X-Service-Route-Country", b"ZZ")],
                "routing.country: must be a two-letter ISO 3166-1 country code",
            ),
            (
                &[("X-Service-Route-Region", b"")],
                "routing.region: must not be empty",
            ),
            (
                &[("X-Service-Route-IP-Type", long.as_bytes())],
                "routing.ip_type: longer than 128 bytes",
            ),
            (
                &[
                    ("X-Service-Route-Region", b"a"),
                    ("X-Service-Route-Region", b"b"),
                ],
                "X-Service-Route-Region: given more than once",
            ),
            (
                &[("X-Service-Route-Colour", b"red")],
                "X-Service-Route-Colour: unknown routing header",
            ),
            (
                &[("X-Service-Route-Region", b"\xff")],
                "X-Service-Route-Region: the value is not UTF-8",
            ),
        ];
        for (headers, message) in table {
            let e = route_hints(headers.iter().copied()).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidRequest);
            assert_eq!(e.message, *message);
        }
        let many = (0..33).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        let e = route_hints([("X-Service-Route-Tags", many.as_bytes())]).unwrap_err();
        assert_eq!(e.message, "routing.tags: at most 32 tags");
    }

    #[test]
    fn forwarded_request_fields() {
        let listed: &[&[u8]] = &[b"x-hop", b"Foo"];
        for (name, forwarded) in [
            ("Accept", true),
            ("Cookie", true),
            ("X-Dup", true),
            ("Proxy-Authorization", false),
            ("proxy-connection", false),
            ("Connection", false),
            ("Keep-Alive", false),
            ("TE", false),
            ("Trailer", false),
            ("Transfer-Encoding", false),
            ("Upgrade", false),
            ("Content-Length", false),
            ("Host", false),
            ("Expect", false),
            ("X-Service-Route-Tags", false),
            ("x-service-anything", false),
            ("X-Hop", false),
            ("foo", false),
        ] {
            assert_eq!(
                is_forwarded_request_field(name, listed),
                forwarded,
                "{name}"
            );
        }
    }

    #[test]
    fn connection_tokens_past_the_inline_ones_are_all_kept() {
        let fields: Vec<(&[u8], &[u8])> = vec![
            (b"Connection", b"a, b, c"),
            (b"Connection", b"d, e"),
            (b"Connection", b"f"),
        ];
        let tokens = connection_tokens(&fields);
        assert_eq!(*tokens, [&b"a"[..], b"b", b"c", b"d", b"e", b"f"]);
        let four: Vec<(&[u8], &[u8])> = vec![(b"Connection", b"a,b,c,d")];
        assert_eq!(*connection_tokens(&four), [&b"a"[..], b"b", b"c", b"d"]);
        let none: Vec<(&[u8], &[u8])> = vec![(b"Server", b"x")];
        assert!(connection_tokens(&none).is_empty());
    }

    #[test]
    fn hop_by_hop_response_fields() {
        let fields: Vec<(&[u8], &[u8])> = vec![
            (b"Connection", b"close, X-Private"),
            (b"connection", b" keep-alive ,"),
            (b"Server", b"x"),
        ];
        let tokens = connection_tokens(&fields);
        assert_eq!(*tokens, [&b"close"[..], b"X-Private", b"keep-alive"]);
        for (name, hop) in [
            (&b"Transfer-Encoding"[..], true),
            (b"x-private", true),
            (b"Keep-Alive", true),
            (b"Server", false),
            (b"Content-Type", false),
            (b"Content-Length", false),
        ] {
            assert_eq!(is_hop_by_hop_response_field(name, &tokens), hop);
        }
    }

    /// The length-first classifier names exactly the listed fields, in any case, and nothing
    /// of another name (every length up to the longest listed and beyond).
    #[test]
    fn fixed_connection_fields_are_the_listed_ones() {
        for known in RESPONSE_CONNECTION_FIELDS {
            assert!(is_fixed_connection_field(known));
            assert!(is_fixed_connection_field(&known.to_ascii_uppercase()));
            let mut other = known.to_vec();
            if let Some(last) = other.last_mut() {
                *last ^= 0x01;
            }
            assert!(!is_fixed_connection_field(&other), "{other:?}");
        }
        for len in 0..=20 {
            for fill in [b'a', b'e', b't', b'-'] {
                let name = vec![fill; len];
                let listed = RESPONSE_CONNECTION_FIELDS
                    .iter()
                    .any(|k| name.eq_ignore_ascii_case(k));
                assert_eq!(is_fixed_connection_field(&name), listed, "{name:?}");
            }
        }
    }

    #[test]
    fn connect_targets() {
        let (h, p) = parse_connect_target("example.com:443").unwrap();
        assert_eq!((h.to_string(), p), ("example.com".to_string(), 443));
        let (h, p) = parse_connect_target("[::1]:8443").unwrap();
        assert_eq!((h, p), (Host::V6("::1".parse().unwrap()), 8443));
        let (h, _) = parse_connect_target("127.0.0.1:1").unwrap();
        assert_eq!(h, Host::V4([127, 0, 0, 1].into()));
        for bad in [
            "example.com",
            "example.com:",
            "example.com:0",
            "example.com:65536",
            "example.com:44x",
            ":443",
            "user@example.com:443",
            "[::1%25eth0]:443",
            "exa mple.com:443",
        ] {
            assert_eq!(
                parse_connect_target(bad).unwrap_err().code,
                ErrorCode::InvalidRequest,
                "{bad}"
            );
        }
    }

    #[test]
    fn proxy_status_values() {
        let e = ApiError::new(ErrorCode::UpstreamDnsFailure, "x");
        assert_eq!(
            proxy_status(&e),
            "sortie; error=dns_error; details=\"upstream_dns_failure\""
        );
        let t = ApiError::timeout(ErrorCode::TimeoutExceeded, TimeoutType::Idle, "x");
        assert_eq!(
            proxy_status(&t),
            "sortie; error=connection_read_timeout; details=\"timeout_exceeded\""
        );
        assert_eq!(proxy_http_status(ErrorCode::AuthFailure), 407);
        assert_eq!(proxy_http_status(ErrorCode::DestinationDenied), 403);
        // Every code maps to a type the RFC registers.
        const RFC9209: &[&str] = &[
            "dns_timeout",
            "dns_error",
            "destination_not_found",
            "destination_unavailable",
            "destination_ip_prohibited",
            "destination_ip_unroutable",
            "connection_refused",
            "connection_terminated",
            "connection_timeout",
            "connection_read_timeout",
            "connection_write_timeout",
            "connection_limit_reached",
            "tls_protocol_error",
            "tls_certificate_error",
            "tls_alert_received",
            "http_request_error",
            "http_request_denied",
            "http_response_incomplete",
            "http_response_header_section_size",
            "http_response_header_size",
            "http_response_body_size",
            "http_response_trailer_section_size",
            "http_response_trailer_size",
            "http_response_transfer_coding",
            "http_response_content_coding",
            "http_response_timeout",
            "http_upgrade_failed",
            "http_protocol_error",
            "proxy_internal_response",
            "proxy_internal_error",
            "proxy_configuration_error",
            "proxy_loop_detected",
        ];
        for code in ErrorCode::ALL {
            for t in std::iter::once(None).chain(TimeoutType::ALL.iter().copied().map(Some)) {
                let ty = proxy_error_type(*code, t);
                assert!(RFC9209.contains(&ty), "{code}: {ty}");
            }
        }
    }

    /// The one table of response field names agrees with the rules read from it and with the
    /// head writer's own list (`is_writer_owned`), for every known name in several spellings,
    /// names one letter or one byte off, and other names.
    #[test]
    fn response_field_names_agree_with_the_rules() {
        use ResponseFieldName::{Connection, Date, HopByHop, Host};
        let known: &[&[u8]] = &[
            b"te",
            b"date",
            b"host",
            b"trailer",
            b"upgrade",
            b"connection",
            b"keep-alive",
            b"content-length",
            b"proxy-connection",
            b"transfer-encoding",
            b"proxy-authenticate",
        ];
        let mut names: Vec<Vec<u8>> = vec![b"".to_vec(), b"x".to_vec(), b"server".to_vec()];
        for k in known {
            names.push(k.to_vec());
            names.push(k.to_ascii_uppercase());
            let mut title = k.to_vec();
            title[0] = title[0].to_ascii_uppercase();
            names.push(title);
            for i in 0..k.len() {
                let mut off = k.to_vec();
                off[i] ^= 0x01;
                names.push(off);
            }
            let mut longer = k.to_vec();
            longer.push(b's');
            names.push(longer);
            names.push(k[1..].to_vec());
        }
        for name in &names {
            let class = response_field_name(name);
            let is_relayed = is_relayed_response_field(name, &[])
                && !crate::h1::is_writer_owned(name)
                && !name.eq_ignore_ascii_case(b"connection");
            assert_eq!(
                matches!(class, ResponseFieldName::Ordinary | Date),
                is_relayed,
                "{name:?}"
            );
            assert_eq!(
                !matches!(class, Connection | HopByHop),
                !is_hop_by_hop_response_field(name, &[]),
                "{name:?}"
            );
            assert_eq!(
                class == Date,
                name.eq_ignore_ascii_case(b"date"),
                "{name:?}"
            );
            assert_eq!(
                class == Host,
                name.eq_ignore_ascii_case(b"host"),
                "{name:?}"
            );
            assert_eq!(
                class == Connection,
                name.eq_ignore_ascii_case(b"connection"),
                "{name:?}"
            );
        }
    }

    /// A `Connection` value lists a name that matters exactly when its tokens hold one other
    /// than `keep-alive`, in any case.
    #[test]
    fn connection_values_that_list_field_names() {
        for (value, lists) in [
            (&b""[..], false),
            (b" , ,", false),
            (b"keep-alive", false),
            (b"Keep-Alive, KEEP-ALIVE", false),
            (b"close", true),
            (b"keep-alive, x-private", true),
            (b"keep-alives", true),
            (b" ,upgrade", true),
        ] {
            assert_eq!(lists_field_names(value), lists, "{value:?}");
            let fields: Vec<(&[u8], &[u8])> = vec![(b"Connection", value)];
            let other = connection_tokens(&fields)
                .iter()
                .any(|t| !t.eq_ignore_ascii_case(b"keep-alive"));
            assert_eq!(other, lists, "{value:?}");
        }
    }

    #[test]
    fn relayed_response_fields_leave_out_framing_and_proxy_challenges() {
        let fields: Vec<(&[u8], &[u8])> = vec![(b"Connection", b"x-drop")];
        let tokens = connection_tokens(&fields);
        for kept in ["content-type", "set-cookie", "www-authenticate", "etag"] {
            assert!(
                is_relayed_response_field(kept.as_bytes(), &tokens),
                "{kept}"
            );
        }
        for dropped in [
            "Content-Length",
            "proxy-authenticate",
            "connection",
            "transfer-encoding",
            "keep-alive",
            "X-Drop",
        ] {
            assert!(
                !is_relayed_response_field(dropped.as_bytes(), &tokens),
                "{dropped}"
            );
        }
        // By length first: names one byte longer or one letter off are relayed; case does not
        // matter; no `Connection` field lists nothing.
        for (name, relayed) in [
            (&b"Content-Length"[..], false),
            (b"PROXY-AUTHENTICATE", false),
            (b"Content-Lengths", true),
            (b"Proxy-Authenticatf", true),
            (b"Keep-Alive", false),
            (b"TE", false),
            (b"Date", true),
            (b"", true),
        ] {
            assert_eq!(is_relayed_response_field(name, &[]), relayed, "{name:?}");
        }
        assert!(!is_relayed_response_field(b"X-Private", &[b"x-private"]));
    }
}
