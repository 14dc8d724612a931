//! Validation of the destination headers a caller supplies in a request envelope (spec, Request
//! API rule 1 and Limits; decision 001 for which headers are managed or rejected).
//!
//! This is on the per-request path.

pub use crate::ascii::is_tchar;
use crate::ascii::{eq_lower, is_field_value, is_token};
use crate::error::{ApiError, ErrorCode};
use crate::limits::{MAX_HEADERS, MAX_HEADER_NAME_BYTES, MAX_HEADER_TOTAL_BYTES};

/// One validated destination header: the name as the caller spelled it and the decoded value.
///
/// Made only by [`validate_header`] and [`Header::new`], so every `Header` holds what they
/// check: the name is a
/// token (RFC 9110 §5.6.2) of at most [`MAX_HEADER_NAME_BYTES`] bytes that names no field the
/// gateway manages ([`rejection_reason`]: no framing, hop-by-hop, `Expect`, proxy credential or
/// `X-Service-*` field), and the value holds no CR, LF, NUL or other control byte but HTAB. A
/// head writer may therefore write it without checking its bytes again
/// ([`crate::h1::write_request_head_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    name: String,
    value: Vec<u8>,
}

impl Header {
    /// The field name, case preserved.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The decoded field value.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// A header from a name and a value already decoded, checked as [`validate_header`] checks
    /// an envelope's (for a request that did not come as an envelope, and for tests). Its
    /// errors carry the envelope's messages, naming the header as entry 0.
    pub fn new(name: &str, value: &[u8]) -> Result<Header, ApiError> {
        check_name(0, name)?;
        check_value(0, value)?;
        Ok(Header {
            name: name.to_owned(),
            value: value.to_vec(),
        })
    }
}

/// A header the gateway sets itself or never forwards: its lowercase name and the reason given
/// to the caller.
type Rejected = (&'static str, &'static str);

const HOST: Rejected = ("host", "Host is derived from url");
const CONTENT_LENGTH: Rejected = ("content-length", "Content-Length is derived from the body");
// RFC 9110 §7.6.1: hop-by-hop fields apply to one connection and are never forwarded.
const TRANSFER_ENCODING: Rejected = (
    "transfer-encoding",
    "Transfer-Encoding is managed by the gateway",
);
const CONNECTION: Rejected = ("connection", "Connection is a hop-by-hop header");
const KEEP_ALIVE: Rejected = ("keep-alive", "Keep-Alive is a hop-by-hop header");
const PROXY_CONNECTION: Rejected = (
    "proxy-connection",
    "Proxy-Connection is a hop-by-hop header",
);
const TE: Rejected = ("te", "TE is a hop-by-hop header");
const TRAILER: Rejected = ("trailer", "Trailer is a hop-by-hop header");
const UPGRADE: Rejected = ("upgrade", "Upgrade is a hop-by-hop header");
const EXPECT: Rejected = ("expect", "Expect is managed by the gateway");
// Callers cannot send proxy credentials (spec, Routing rule 7).
const PROXY_AUTHORIZATION: Rejected = (
    "proxy-authorization",
    "proxy credentials are managed by the gateway",
);
const PROXY_AUTHENTICATE: Rejected = (
    "proxy-authenticate",
    "proxy credentials are managed by the gateway",
);

/// Every header the gateway sets itself or never forwards. Matching is case-insensitive.
/// Everything else is forwarded in order, duplicates preserved.
#[cfg(test)]
const REJECTED: &[Rejected] = &[
    HOST,
    CONTENT_LENGTH,
    TRANSFER_ENCODING,
    CONNECTION,
    KEEP_ALIVE,
    PROXY_CONNECTION,
    TE,
    TRAILER,
    UPGRADE,
    EXPECT,
    PROXY_AUTHORIZATION,
    PROXY_AUTHENTICATE,
];

/// The prefix of the gateway's own headers; they never reach a destination (decision 017).
const SERVICE_PREFIX: &str = "x-service-";

/// Whether `name` is a header the gateway manages or rejects, and why.
pub fn rejection_reason(name: &str) -> Option<&'static str> {
    if name.len() >= SERVICE_PREFIX.len()
        && name
            .as_bytes()
            .get(..SERVICE_PREFIX.len())
            .is_some_and(|p| eq_lower(p, SERVICE_PREFIX.as_bytes()))
    {
        return Some("X-Service-* headers are the gateway's own");
    }
    // By length first: a name is compared with the one or two entries of its length, not all
    // of them (every field of every proxied request asks). A test holds this to `REJECTED`.
    let n = name.as_bytes();
    let is = |(known, why): Rejected| eq_lower(n, known.as_bytes()).then_some(why);
    match n.len() {
        2 => is(TE),
        4 => is(HOST),
        6 => is(EXPECT),
        7 => is(TRAILER).or_else(|| is(UPGRADE)),
        10 => is(CONNECTION).or_else(|| is(KEEP_ALIVE)),
        14 => is(CONTENT_LENGTH),
        16 => is(PROXY_CONNECTION),
        17 => is(TRANSFER_ENCODING),
        18 => is(PROXY_AUTHENTICATE),
        19 => is(PROXY_AUTHORIZATION),
        _ => None,
    }
}

fn at(index: usize, m: &str) -> String {
    format!("headers[{index}]: {m}")
}

/// Checks a name: a token of at most [`MAX_HEADER_NAME_BYTES`], not a managed field.
fn check_name(index: usize, name: &str) -> Result<(), ApiError> {
    // One pass in the common case: CR, LF and NUL are not tchars, so they are only looked for
    // once the name is known to be bad, to pick the right code.
    if !is_token(name.as_bytes()) {
        if name.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            return Err(ApiError::new(
                ErrorCode::HeaderInjectionFailed,
                at(index, "name contains CR, LF or NUL"),
            ));
        }
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            at(index, "name is not a valid header field name"),
        ));
    }
    if name.len() > MAX_HEADER_NAME_BYTES {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            at(
                index,
                &format!("name is longer than {MAX_HEADER_NAME_BYTES} bytes"),
            ),
        ));
    }
    if let Some(why) = rejection_reason(name) {
        return Err(ApiError::new(ErrorCode::InvalidRequest, at(index, why)));
    }
    Ok(())
}

/// Checks a decoded value. RFC 9110 §5.5: no control character but HTAB in a field value; CR,
/// LF or NUL after decoding would split or truncate the header upstream (spec, rule 1).
fn check_value(index: usize, value: &[u8]) -> Result<(), ApiError> {
    // One fold over every byte, no early exit; the bad value's code is picked in a second look.
    if is_field_value(value) {
        return Ok(());
    }
    Err(if value.iter().any(|&b| matches!(b, b'\r' | b'\n' | 0)) {
        ApiError::new(
            ErrorCode::HeaderInjectionFailed,
            at(index, "decoded value contains CR, LF or NUL"),
        )
    } else {
        ApiError::new(
            ErrorCode::InvalidRequest,
            at(index, "decoded value contains a control character"),
        )
    })
}

/// Validates one header's name and base64 value; `index` is used in messages.
pub fn validate_header(index: usize, name: &str, value_base64: &str) -> Result<Header, ApiError> {
    check_name(index, name)?;
    let value = match sortie_b64::decode(value_base64.as_bytes()) {
        Some(v) => v,
        // Spec, Request API rule 1: no CR or LF before decoding. CR and LF are outside the
        // base64 alphabet, so they can only be the cause of a failed decode.
        None if value_base64.bytes().any(|b| b == b'\r' || b == b'\n') => {
            return Err(ApiError::new(
                ErrorCode::HeaderInjectionFailed,
                at(index, "value_base64 contains CR or LF"),
            ))
        }
        None => {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                at(index, "value_base64 is not standard base64"),
            ))
        }
    };
    check_value(index, &value)?;
    Ok(Header {
        name: name.to_string(),
        value,
    })
}

/// Checks the whole-list limits: entry count and total size of names plus decoded values.
pub fn check_header_totals(count: usize, headers: &[Header]) -> Result<(), ApiError> {
    if count > MAX_HEADERS {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("headers: at most {MAX_HEADERS} entries are allowed, got {count}"),
        ));
    }
    let total: usize = headers.iter().map(|h| h.name.len() + h.value.len()).sum();
    if total > MAX_HEADER_TOTAL_BYTES {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!(
                "headers: names plus decoded values total {total} bytes, over the limit of \
                 {MAX_HEADER_TOTAL_BYTES}"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule as the table states it: a pass over every entry.
    fn rejection_by_table(name: &str) -> Option<&'static str> {
        if name.to_ascii_lowercase().starts_with(SERVICE_PREFIX) {
            return Some("X-Service-* headers are the gateway's own");
        }
        REJECTED
            .iter()
            .find(|(n, _)| name.eq_ignore_ascii_case(n))
            .map(|(_, why)| *why)
    }

    #[test]
    fn the_dispatch_by_length_finds_every_entry_of_the_table() {
        let mut names: Vec<String> = Vec::new();
        for (known, _) in REJECTED {
            names.push(known.to_string());
            names.push(known.to_ascii_uppercase());
            // Mixed case, one letter off, a byte longer and a byte shorter.
            names.push(
                known
                    .char_indices()
                    .map(|(i, c)| {
                        if i % 2 == 0 {
                            c.to_ascii_uppercase()
                        } else {
                            c
                        }
                    })
                    .collect(),
            );
            for i in 0..known.len() {
                let mut b = known.as_bytes().to_vec();
                b[i] = if b[i] == b'x' { b'y' } else { b'x' };
                names.push(String::from_utf8(b).unwrap());
            }
            names.push(format!("{known}x"));
            names.push(known[1..].to_string());
        }
        names.extend(
            [
                "X-Service-Token",
                "x-service-",
                "X-SERVICE-a",
                "x-servic",
                "Accept",
                "",
                "t",
            ]
            .map(String::from),
        );
        for name in &names {
            assert_eq!(rejection_reason(name), rejection_by_table(name), "{name:?}");
        }
        // Every entry is reached: none is left to a length the dispatch does not list.
        for (known, why) in REJECTED {
            assert_eq!(rejection_reason(known), Some(*why), "{known}");
        }
    }

    fn b64(s: &[u8]) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn accepts_ordinary_headers() {
        for (n, v) in [
            ("Accept", &b"text/html"[..]),
            ("x-custom_1", b"a\tb"),
            ("Cookie", b""),
            ("User-Agent", "caf\u{e9}".as_bytes()),
            ("!#$%&'*+-.^_`|~", b"v"),
        ] {
            let h = validate_header(0, n, &b64(v)).unwrap();
            assert_eq!(h.name, n);
            assert_eq!(h.value, v);
        }
    }

    #[test]
    fn rejects_with_the_right_code() {
        use ErrorCode::*;
        let long = "a".repeat(MAX_HEADER_NAME_BYTES + 1);
        let cases: Vec<(&str, String, ErrorCode)> = vec![
            ("X-A\r\n", b64(b"v"), HeaderInjectionFailed),
            ("X-A", b64(b"v\r\nEvil: 1"), HeaderInjectionFailed),
            ("X-A", b64(b"v\n"), HeaderInjectionFailed),
            ("X-A", b64(b"v\0"), HeaderInjectionFailed),
            ("X-A", "dg==\r\n".into(), HeaderInjectionFailed),
            ("X-A", "dg\n==".into(), HeaderInjectionFailed),
            ("X-A", b64(b"\x01"), InvalidRequest),
            ("X-A", b64(b"\x7f"), InvalidRequest),
            ("X-A", "dg".into(), InvalidRequest),
            ("X-A", "d-==".into(), InvalidRequest),
            ("X-A", "dg==dg==".into(), InvalidRequest),
            ("", b64(b"v"), InvalidRequest),
            ("X A", b64(b"v"), InvalidRequest),
            ("X:A", b64(b"v"), InvalidRequest),
            ("X\u{e9}", b64(b"v"), InvalidRequest),
            (&long, b64(b"v"), InvalidRequest),
            ("Host", b64(b"evil"), InvalidRequest),
            ("content-LENGTH", b64(b"1"), InvalidRequest),
            ("Transfer-Encoding", b64(b"chunked"), InvalidRequest),
            ("Connection", b64(b"close"), InvalidRequest),
            ("Keep-Alive", b64(b"1"), InvalidRequest),
            ("Proxy-Connection", b64(b"1"), InvalidRequest),
            ("TE", b64(b"trailers"), InvalidRequest),
            ("Trailer", b64(b"x"), InvalidRequest),
            ("Upgrade", b64(b"h2c"), InvalidRequest),
            ("Expect", b64(b"100-continue"), InvalidRequest),
            ("Proxy-Authorization", b64(b"Basic x"), InvalidRequest),
            ("X-Service-Route-Tags", b64(b"a"), InvalidRequest),
            ("x-service-anything", b64(b"a"), InvalidRequest),
        ];
        for (n, v, code) in cases {
            let e = validate_header(3, n, &v).unwrap_err();
            assert_eq!(e.code, code, "{n:?} {v:?}: {e}");
            assert!(e.message.starts_with("headers[3]: "), "{}", e.message);
        }
    }

    /// Every byte value at every position of decoded values around the vector width: a control
    /// byte but HTAB is refused, CR, LF and NUL as injection, anything else passes.
    #[test]
    fn every_byte_of_a_value_is_judged() {
        for len in [1usize, 15, 16, 17, 33, 64] {
            for at in [0, len / 2, len - 1] {
                for c in 0..=255u8 {
                    let mut v = vec![b'v'; len];
                    v[at] = c;
                    let got = validate_header(0, "X-A", &b64(&v)).map_err(|e| e.code);
                    let want = match c {
                        b'\r' | b'\n' | 0 => Err(ErrorCode::HeaderInjectionFailed),
                        b'\t' => Ok(()),
                        0..=0x1f | 0x7f => Err(ErrorCode::InvalidRequest),
                        _ => Ok(()),
                    };
                    assert_eq!(got.map(|_| ()), want, "byte {c:#x} at {at} of {len}");
                }
            }
        }
    }

    #[test]
    fn totals() {
        let h = |n: usize| Header {
            name: "a".into(),
            value: vec![b'x'; n],
        };
        assert!(check_header_totals(64, &[]).is_ok());
        assert!(check_header_totals(65, &[]).is_err());
        assert!(check_header_totals(1, &[h(MAX_HEADER_TOTAL_BYTES - 1)]).is_ok());
        assert!(check_header_totals(1, &[h(MAX_HEADER_TOTAL_BYTES)]).is_err());
    }
}
