//! Server side: parsing a request head and deciding its framing, persistence and expectation.
//!
//! On the per-request path of every listener (API, admin, forward proxy): no allocation beyond
//! the header vector, no logging.

use super::error::H1Error;
use super::head::{
    check_transfer_encoding, collect_headers, diagnose, has_bare_lf, header_slots, is_target_byte,
    list_members, parse_content_length, values_of, HeadLimits, Headers, Parsed, StartLine, Version,
    MAX_HEADERS_CEILING,
};
use crate::ascii::eq_lower;

/// How the body of a request is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body: neither Content-Length nor Transfer-Encoding was sent.
    None,
    /// Exactly this many bytes follow the head.
    ContentLength(u64),
    /// The body uses the chunked transfer coding.
    Chunked,
}

impl BodyFraming {
    /// Whether body bytes may follow the head.
    pub fn has_body(self) -> bool {
        !matches!(self, BodyFraming::None | BodyFraming::ContentLength(0))
    }
}

/// The form of a request-target (RFC 9112 §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetForm {
    /// `absolute-path [ "?" query ]`, sent to an origin server.
    Origin,
    /// `absolute-URI`, sent to a forward proxy.
    Absolute,
    /// `uri-host ":" port`, only with CONNECT.
    Authority,
    /// `*`, only with OPTIONS.
    Asterisk,
}

/// What a request head's start line and fields decide, borrowing from the buffer it was parsed
/// from, without the fields themselves: the start of every [`RequestHead`], and what
/// [`parse_request_head_with`] hands its caller beside the parser's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestStart<'a> {
    method: &'a str,
    target: &'a str,
    target_form: TargetForm,
    version: Version,
    host: Option<&'a [u8]>,
    framing: BodyFraming,
    is_keep_alive: bool,
    expects_continue: bool,
}

impl<'a> RequestStart<'a> {
    /// The method token, case preserved (methods are case-sensitive).
    pub fn method(&self) -> &'a str {
        self.method
    }

    /// The request-target as sent: visible ASCII only.
    pub fn target(&self) -> &'a str {
        self.target
    }

    /// Which form the request-target has; CONNECT always has [`TargetForm::Authority`].
    pub fn target_form(&self) -> TargetForm {
        self.target_form
    }

    /// The protocol version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The value of the single Host field, if any (absent only in HTTP/1.0).
    pub fn host(&self) -> Option<&'a [u8]> {
        self.host
    }

    /// How the body is delimited.
    pub fn framing(&self) -> BodyFraming {
        self.framing
    }

    /// Whether the connection may carry another request after this one's response.
    pub fn is_keep_alive(&self) -> bool {
        self.is_keep_alive
    }

    /// Whether the client waits for `100 Continue` before sending the body.
    pub fn expects_continue(&self) -> bool {
        self.expects_continue
    }
}

/// A request head that passed every framing and syntax rule, borrowing from the buffer it was
/// parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead<'a> {
    start: RequestStart<'a>,
    headers: Headers<'a>,
}

impl<'a> RequestHead<'a> {
    /// What the start line and fields decide.
    pub fn start(&self) -> &RequestStart<'a> {
        &self.start
    }

    /// The method token, case preserved (methods are case-sensitive).
    pub fn method(&self) -> &'a str {
        self.start.method
    }

    /// The request-target as sent: visible ASCII only.
    pub fn target(&self) -> &'a str {
        self.start.target
    }

    /// Which form the request-target has; CONNECT always has [`TargetForm::Authority`].
    pub fn target_form(&self) -> TargetForm {
        self.start.target_form
    }

    /// The protocol version.
    pub fn version(&self) -> Version {
        self.start.version
    }

    /// Every header field line in received order.
    pub fn headers(&self) -> &Headers<'a> {
        &self.headers
    }

    /// The value of the single Host field, if any (absent only in HTTP/1.0).
    pub fn host(&self) -> Option<&'a [u8]> {
        self.start.host
    }

    /// How the body is delimited.
    pub fn framing(&self) -> BodyFraming {
        self.start.framing
    }

    /// Whether the connection may carry another request after this one's response.
    pub fn is_keep_alive(&self) -> bool {
        self.start.is_keep_alive
    }

    /// Whether the client waits for `100 Continue` before sending the body.
    pub fn expects_continue(&self) -> bool {
        self.start.expects_continue
    }
}

/// The fields of a parsed request head as the parser left them, lent to the caller of
/// [`parse_request_head_with`] for the length of its callback: (name, value) in received order.
#[derive(Clone, Copy)]
pub struct ParsedFields<'p, 'a>(&'p [httparse::Header<'a>]);

impl<'p, 'a> ParsedFields<'p, 'a> {
    /// Number of field lines.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no field lines.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The fields in received order, as (name, value).
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &'a [u8])> + Clone + 'p {
        self.0.iter().map(|h| (h.name, h.value))
    }
}

/// Parses a request head from the start of `buf`.
///
/// Returns [`Parsed::Partial`] while the head may still become valid with more bytes; the
/// caller reads more and parses again from the start. On success, `consumed_len` is where the
/// body (or, with no body, the next pipelined request) begins. Any error means: answer
/// [`H1Error::status`] and close the connection.
pub fn parse_request_head<'a>(
    buf: &'a [u8],
    limits: &HeadLimits,
) -> Result<Parsed<RequestHead<'a>>, H1Error> {
    parse_with(buf, limits, |view, start, parsed| {
        Ok(RequestHead {
            start,
            headers: collect_headers(view, parsed)?,
        })
    })
}

/// [`parse_request_head`] for a caller that copies the head at once: the same rules, errors and
/// `consumed_len`, with the head handed to `take` as its [`RequestStart`] and the parser's own
/// fields instead of collected into a [`RequestHead`] (one vector fewer per head).
pub fn parse_request_head_with<'a, T>(
    buf: &'a [u8],
    limits: &HeadLimits,
    take: impl FnOnce(&RequestStart<'a>, ParsedFields<'_, 'a>) -> T,
) -> Result<Parsed<T>, H1Error> {
    parse_with(buf, limits, |_, start, parsed| {
        Ok(take(&start, ParsedFields(parsed)))
    })
}

/// The parse both entry points share: every rule is decided on httparse's own fields, which
/// `finish` turns into what the caller keeps once the head passed them all.
fn parse_with<'a, T>(
    buf: &'a [u8],
    limits: &HeadLimits,
    finish: impl FnOnce(&'a [u8], RequestStart<'a>, &[httparse::Header<'a>]) -> Result<T, H1Error>,
) -> Result<Parsed<T>, H1Error> {
    // Parsing never looks past the head limit, which also bounds the work per call.
    let view = buf.get(..limits.max_head_bytes).unwrap_or(buf);
    let mut slots = header_slots();
    let slots = slots
        .get_mut(..limits.max_headers.min(MAX_HEADERS_CEILING))
        .unwrap_or_default();
    let mut req = httparse::Request::new(&mut []);
    let head_len = match req.parse_with_uninit_headers(view, slots) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return partial(view, buf.len(), limits),
        Err(e) => return Err(diagnose(view, e, StartLine::Request)),
    };
    if has_bare_lf(view.get(..head_len).unwrap_or(view)) {
        return Err(H1Error::BareLf);
    }
    let method = req.method.unwrap_or_default();
    let target = req.path.unwrap_or_default();
    let version = Version::from_minor(req.version);

    // RFC 9112 §3: "A server that receives a request-target longer than any URI it wishes to
    // parse MUST respond with a 414 (URI Too Long) status code".
    if target.len() > limits.max_target_bytes {
        return Err(H1Error::TargetTooLong);
    }
    if !target.bytes().all(is_target_byte) {
        return Err(H1Error::InvalidTarget);
    }
    let target_form = classify_target(method, target.as_bytes())?;

    let parsed: &[httparse::Header<'a>] = req.headers;
    let fields = FramingFields::scan(parsed);

    // RFC 9112 §3.2: "A server MUST respond with a 400 (Bad Request) status code to any
    // HTTP/1.1 request message that lacks a Host header field and to any request message that
    // contains more than one Host header field line or a Host header field with an invalid
    // field value."
    if fields.host_count > 1 {
        return Err(H1Error::DuplicateHost);
    }
    if fields.host_count == 0 && version == Version::Http11 {
        return Err(H1Error::MissingHost);
    }
    if let Some(host) = fields.host {
        if !is_valid_host(host) {
            return Err(H1Error::InvalidHost);
        }
    }

    let framing = request_framing(parsed, &fields, version)?;

    // RFC 9112 §9.3: "If the received protocol is HTTP/1.1 (or later) ... the connection will
    // persist after the current response" unless "close" is among the connection options; "If
    // the received protocol is HTTP/1.0, the "keep-alive" connection option is present ... the
    // connection will persist".
    let is_close = fields.lists_close;
    let is_keep_alive = match version {
        Version::Http11 => !is_close,
        Version::Http10 => !is_close && fields.lists_keep_alive,
    };

    let mut expects_continue = false;
    if fields.has_expect {
        for member in values_of(parsed, "expect").flat_map(list_members) {
            // RFC 9110 §10.1.1: "A server that receives an Expect field value containing a
            // member other than 100-continue MAY respond with a 417 (Expectation Failed)
            // status code to indicate that the unexpected expectation cannot be met."
            if !member.eq_ignore_ascii_case(b"100-continue") {
                return Err(H1Error::UnsupportedExpectation);
            }
            expects_continue = true;
        }
        // RFC 9110 §10.1.1: "A server that receives a 100-continue expectation in an HTTP/1.0
        // request MUST ignore that expectation."
        if version == Version::Http10 {
            expects_continue = false;
        }
    }

    let start = RequestStart {
        method,
        target,
        target_form,
        version,
        host: fields.host,
        framing,
        is_keep_alive,
        expects_continue,
    };
    Ok(Parsed::Complete {
        head: finish(view, start, parsed)?,
        consumed_len: head_len,
    })
}

/// What a single pass over the fields learns about framing and routing fields.
struct FramingFields<'a> {
    host_count: usize,
    host: Option<&'a [u8]>,
    content_length_count: usize,
    content_length: Option<&'a [u8]>,
    has_transfer_encoding: bool,
    /// Whether the `Connection` fields list `close`, and `keep-alive`.
    lists_close: bool,
    lists_keep_alive: bool,
    has_expect: bool,
}

impl<'a> FramingFields<'a> {
    fn scan(headers: &[httparse::Header<'a>]) -> FramingFields<'a> {
        let mut f = FramingFields {
            host_count: 0,
            host: None,
            content_length_count: 0,
            content_length: None,
            has_transfer_encoding: false,
            lists_close: false,
            lists_keep_alive: false,
            has_expect: false,
        };
        for h in headers {
            // Comparing lengths first keeps the common case to one integer compare per field.
            let name = h.name;
            match name.len() {
                4 if eq_lower(name.as_bytes(), b"host") => {
                    f.host_count += 1;
                    f.host.get_or_insert(h.value);
                }
                6 if eq_lower(name.as_bytes(), b"expect") => f.has_expect = true,
                10 if eq_lower(name.as_bytes(), b"connection") => {
                    for token in list_members(h.value) {
                        f.lists_close |= eq_lower(token, b"close");
                        f.lists_keep_alive |= eq_lower(token, b"keep-alive");
                    }
                }
                14 if eq_lower(name.as_bytes(), b"content-length") => {
                    f.content_length_count += 1;
                    f.content_length.get_or_insert(h.value);
                }
                17 if eq_lower(name.as_bytes(), b"transfer-encoding") => {
                    f.has_transfer_encoding = true;
                }
                _ => {}
            }
        }
        f
    }
}

fn request_framing(
    headers: &[httparse::Header<'_>],
    fields: &FramingFields<'_>,
    version: Version,
) -> Result<BodyFraming, H1Error> {
    if fields.has_transfer_encoding {
        // RFC 9112 §6.1: "A server MAY reject a request that contains both Content-Length and
        // Transfer-Encoding or process such a request in accordance with the Transfer-Encoding
        // alone. Regardless, the server MUST close the connection after responding to such a
        // request". We reject: the pair is the classic smuggling setup.
        if fields.content_length_count > 0 {
            return Err(H1Error::ContentLengthWithTransferEncoding);
        }
        // RFC 9112 §6.1: "A server or client that receives an HTTP/1.0 message containing a
        // Transfer-Encoding header field MUST treat the message as if the framing is faulty".
        if version == Version::Http10 {
            return Err(H1Error::TransferEncodingInHttp10);
        }
        check_transfer_encoding(values_of(headers, "transfer-encoding"))?;
        return Ok(BodyFraming::Chunked);
    }
    if let Some(value) = fields.content_length {
        // RFC 9110 §8.6 lets a recipient accept a repeated identical value; we reject any
        // repetition, list or not, in requests: a single well-formed value is the only form
        // every server and proxy reads the same way (RFC 9112 §6.3: "If a message is received
        // without Transfer-Encoding and with an invalid Content-Length header field ... the
        // server MUST respond with a 400 (Bad Request) status code and then close the
        // connection").
        if fields.content_length_count > 1 || value.contains(&b',') {
            return Err(H1Error::DuplicateContentLength);
        }
        return parse_content_length(value).map(BodyFraming::ContentLength);
    }
    // RFC 9112 §6.3: "If this is a request message and none of the above are true, then the
    // message body length is zero (no message body is present)."
    Ok(BodyFraming::None)
}

fn partial<T>(view: &[u8], buf_len: usize, limits: &HeadLimits) -> Result<Parsed<T>, H1Error> {
    // Rejecting a bare LF early spares reading the rest of a head we will refuse anyway.
    if has_bare_lf(view) {
        return Err(H1Error::BareLf);
    }
    if target_len_so_far(view) > limits.max_target_bytes {
        return Err(H1Error::TargetTooLong);
    }
    // RFC 6585 §5: 431 "indicates that the server is unwilling to process the request because
    // its header fields are too large".
    if buf_len >= limits.max_head_bytes {
        return Err(H1Error::HeadTooLarge);
    }
    Ok(Parsed::Partial)
}

/// Length of the request-target received so far in an incomplete head, so that an overlong
/// target is answered with 414 before the head limit turns it into a 431.
fn target_len_so_far(view: &[u8]) -> usize {
    let start = view
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(view.len());
    let line = view.get(start..).unwrap_or_default();
    let Some(sp) = line.iter().position(|&b| b == b' ') else {
        return 0;
    };
    let after = line.get(sp.saturating_add(1)..).unwrap_or_default();
    after
        .iter()
        .position(|&b| matches!(b, b' ' | b'\r' | b'\n'))
        .unwrap_or(after.len())
}

fn classify_target(method: &str, target: &[u8]) -> Result<TargetForm, H1Error> {
    // RFC 9112 §3.2.3: "The authority-form of request-target is only used for CONNECT
    // requests", and RFC 9110 §9.3.6: "a server MUST reject a CONNECT request that targets an
    // empty or invalid port number".
    if method == "CONNECT" {
        return match split_host_port(target) {
            Some((host, Some(port))) if !host.is_empty() && is_valid_port(port) => {
                Ok(TargetForm::Authority)
            }
            _ => Err(H1Error::InvalidTarget),
        };
    }
    match target {
        [b'/', ..] => Ok(TargetForm::Origin),
        // RFC 9112 §3.2.4: "The asterisk-form of request-target is only used for a
        // server-wide OPTIONS request".
        b"*" if method == "OPTIONS" => Ok(TargetForm::Asterisk),
        _ if is_absolute_uri(target) => Ok(TargetForm::Absolute),
        _ => Err(H1Error::InvalidTarget),
    }
}

/// RFC 3986 §3.1: `scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )`, then `":"`.
fn is_absolute_uri(target: &[u8]) -> bool {
    let Some(colon) = target.iter().position(|&b| b == b':') else {
        return false;
    };
    let scheme = target.get(..colon).unwrap_or_default();
    matches!(scheme.first(), Some(b) if b.is_ascii_alphabetic())
        && scheme
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
}

/// RFC 9110 §7.2: `Host = uri-host [ ":" port ]`. An empty value is allowed (RFC 9112 §3.2:
/// a client sends an empty Host when the target URI has no authority).
pub(super) fn is_valid_host(value: &[u8]) -> bool {
    match split_host_port(value) {
        Some((_, None)) => true,
        Some((_, Some(port))) => port.iter().all(u8::is_ascii_digit),
        None => false,
    }
}

fn is_valid_port(port: &[u8]) -> bool {
    !port.is_empty()
        && port.len() <= 5
        && port.iter().all(u8::is_ascii_digit)
        && parse_content_length(port).is_ok_and(|p| (1..=65535).contains(&p))
}

/// Splits `uri-host [ ":" port ]` and checks the host's characters: an IP-literal in
/// brackets, or a reg-name/IPv4 address of unreserved, pct-encoded and sub-delim characters
/// (RFC 3986 §3.2.2). The port is returned unchecked.
fn split_host_port(value: &[u8]) -> Option<(&[u8], Option<&[u8]>)> {
    let (host, rest) = if let [b'[', inner @ ..] = value {
        let close = inner.iter().position(|&b| b == b']')?;
        let (literal, rest) = inner.split_at(close);
        let ok = !literal.is_empty() && literal.iter().all(|&b| is_ip_literal_byte(b));
        if !ok {
            return None;
        }
        let host = value.get(..close.saturating_add(2))?;
        (host, rest.get(1..).unwrap_or_default())
    } else {
        let end = value.iter().position(|&b| b == b':').unwrap_or(value.len());
        let (host, rest) = value.split_at(end);
        if !host
            .iter()
            .all(|&b| HOST_BYTES.get(usize::from(b)).copied().unwrap_or(false))
        {
            return None;
        }
        (host, rest)
    };
    match rest {
        [] => Some((host, None)),
        [b':', port @ ..] => Some((host, Some(port))),
        _ => None,
    }
}

/// `unreserved / sub-delims / "%"` as a table: host validation runs on every request, and the
/// table is several times faster than the chain of comparisons. Indexing by a `u8` cannot go
/// out of bounds of 256 entries.
#[allow(clippy::indexing_slicing)] // written at compile time, below 256
static HOST_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut i = 0;
    while i < table.len() {
        table[i] = is_unreserved_or_sub_delim(i as u8) || i == b'%' as usize;
        i += 1;
    }
    table
};

/// RFC 3986 §3.2.2: an IP-literal holds an IPv6 address or `"v" 1*HEXDIG "." 1*( unreserved /
/// sub-delims / ":" )`.
const fn is_ip_literal_byte(b: u8) -> bool {
    b == b':' || is_unreserved_or_sub_delim(b)
}

const fn is_unreserved_or_sub_delim(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: HeadLimits = HeadLimits::REQUEST;

    fn parse(buf: &[u8]) -> Result<Parsed<RequestHead<'_>>, H1Error> {
        parse_request_head(buf, &LIMITS)
    }

    fn complete(buf: &[u8]) -> (RequestHead<'_>, usize) {
        match parse(buf) {
            Ok(Parsed::Complete { head, consumed_len }) => (head, consumed_len),
            other => panic!(
                "expected a complete head for {:?}, got {other:?}",
                show(buf)
            ),
        }
    }

    fn show(buf: &[u8]) -> String {
        String::from_utf8_lossy(buf).into_owned()
    }

    /// Every rejection rule, one row each: the input and the error it must produce.
    #[test]
    fn rejections() {
        let table: &[(&str, &[u8], H1Error)] = &[
            // Line endings.
            ("bare LF everywhere", b"GET / HTTP/1.1\nHost: a\n\n", H1Error::BareLf),
            ("bare LF after request line", b"GET / HTTP/1.1\nHost: a\r\n\r\n", H1Error::BareLf),
            ("bare LF after field", b"GET / HTTP/1.1\r\nHost: a\n\r\n", H1Error::BareLf),
            ("bare LF as final line", b"GET / HTTP/1.1\r\nHost: a\r\n\n", H1Error::BareLf),
            ("bare LF before request", b"\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", H1Error::BareLf),
            ("bare CR in field", b"GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n", H1Error::BareCr),
            ("bare CR after version", b"GET / HTTP/1.1\rHost: a\r\n\r\n", H1Error::BareCr),
            // Field syntax.
            ("obs-fold", b"GET / HTTP/1.1\r\nHost: a\r\nX: b\r\n c\r\n\r\n", H1Error::ObsFold),
            ("obs-fold tab", b"GET / HTTP/1.1\r\nHost: a\r\nX: b\r\n\tc\r\n\r\n", H1Error::ObsFold),
            ("space first field", b"GET / HTTP/1.1\r\n Host: a\r\n\r\n", H1Error::ObsFold),
            ("space before colon", b"GET / HTTP/1.1\r\nHost : a\r\n\r\n", H1Error::WhitespaceBeforeColon),
            ("tab before colon", b"GET / HTTP/1.1\r\nHost\t: a\r\n\r\n", H1Error::WhitespaceBeforeColon),
            ("name without colon", b"GET / HTTP/1.1\r\nHost\r\n\r\n", H1Error::InvalidHeaderName),
            ("empty name", b"GET / HTTP/1.1\r\n: a\r\nHost: a\r\n\r\n", H1Error::InvalidHeaderName),
            ("bad name byte", b"GET / HTTP/1.1\r\nHo(st: a\r\n\r\n", H1Error::InvalidHeaderName),
            ("non-ASCII name", b"GET / HTTP/1.1\r\nH\xc3\xa9: a\r\n\r\n", H1Error::InvalidHeaderName),
            ("NUL in value", b"GET / HTTP/1.1\r\nHost: a\r\nX: a\0b\r\n\r\n", H1Error::InvalidHeaderValue),
            ("DEL in value", b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x7fb\r\n\r\n", H1Error::InvalidHeaderValue),
            ("control in value", b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x01\r\n\r\n", H1Error::InvalidHeaderValue),
            // Request line.
            ("bad method byte", b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n", H1Error::InvalidMethod),
            ("empty method", b" / HTTP/1.1\r\nHost: a\r\n\r\n", H1Error::InvalidMethod),
            ("non-ASCII method", b"G\xc3\x89T / HTTP/1.1\r\nHost: a\r\n\r\n", H1Error::InvalidMethod),
            ("two spaces", b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n", H1Error::InvalidTarget),
            ("no target", b"GET HTTP/1.1\r\nHost: a\r\n\r\n", H1Error::InvalidVersion),
            ("HTTP/0.9", b"GET /\r\n\r\n", H1Error::InvalidVersion),
            ("non-ASCII target", b"GET /\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n", H1Error::InvalidTarget),
            ("control in target", b"GET /\x01 HTTP/1.1\r\nHost: a\r\n\r\n", H1Error::InvalidTarget),
            ("relative target", b"GET foo HTTP/1.1\r\nHost: a\r\n\r\n", H1Error::InvalidTarget),
            ("asterisk with GET", b"GET * HTTP/1.1\r\nHost: a\r\n\r\n", H1Error::InvalidTarget),
            ("CONNECT origin-form", b"CONNECT / HTTP/1.1\r\nHost: a\r\n\r\n", H1Error::InvalidTarget),
            ("CONNECT without port", b"CONNECT a.example HTTP/1.1\r\nHost: a\r\n\r\n", H1Error::InvalidTarget),
            ("CONNECT port 0", b"CONNECT a.example:0 HTTP/1.1\r\nHost: a\r\n\r\n", H1Error::InvalidTarget),
            ("CONNECT port too big", b"CONNECT a.example:65536 HTTP/1.1\r\nHost: a\r\n\r\n", H1Error::InvalidTarget),
            ("CONNECT empty host", b"CONNECT :443 HTTP/1.1\r\nHost: a\r\n\r\n", H1Error::InvalidTarget),
            ("CONNECT userinfo", b"CONNECT u@a.example:443 HTTP/1.1\r\nHost: a\r\n\r\n", H1Error::InvalidTarget),
            ("CONNECT absolute", b"CONNECT http://a.example:443/ HTTP/1.1\r\nHost: a\r\n\r\n", H1Error::InvalidTarget),
            // Versions.
            ("HTTP/2.0", b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", H1Error::UnsupportedVersion),
            ("HTTP/1.2", b"GET / HTTP/1.2\r\nHost: a\r\n\r\n", H1Error::UnsupportedVersion),
            ("HTTP/0.9 line", b"GET / HTTP/0.9\r\nHost: a\r\n\r\n", H1Error::UnsupportedVersion),
            ("HTTP/3", b"GET / HTTP/3\r\nHost: a\r\n\r\n", H1Error::UnsupportedVersion),
            ("lowercase version", b"GET / http/1.1\r\nHost: a\r\n\r\n", H1Error::InvalidVersion),
            ("garbage version", b"GET / HTTX/1.1\r\nHost: a\r\n\r\n", H1Error::InvalidVersion),
            ("version suffix", b"GET / HTTP/1.1x\r\nHost: a\r\n\r\n", H1Error::InvalidVersion),
            ("trailing space", b"GET / HTTP/1.1 \r\nHost: a\r\n\r\n", H1Error::InvalidVersion),
            // Host.
            ("missing Host", b"GET / HTTP/1.1\r\n\r\n", H1Error::MissingHost),
            ("missing Host absolute", b"GET http://a/ HTTP/1.1\r\n\r\n", H1Error::MissingHost),
            ("two Hosts", b"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", H1Error::DuplicateHost),
            ("two Hosts 1.0", b"GET / HTTP/1.0\r\nHost: a\r\nhost: b\r\n\r\n", H1Error::DuplicateHost),
            ("Host with space", b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", H1Error::InvalidHost),
            ("Host with slash", b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", H1Error::InvalidHost),
            ("Host with userinfo", b"GET / HTTP/1.1\r\nHost: u@a\r\n\r\n", H1Error::InvalidHost),
            ("Host bad port", b"GET / HTTP/1.1\r\nHost: a:8x\r\n\r\n", H1Error::InvalidHost),
            ("Host two colons", b"GET / HTTP/1.1\r\nHost: a:1:2\r\n\r\n", H1Error::InvalidHost),
            ("Host open bracket", b"GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", H1Error::InvalidHost),
            ("Host list", b"GET / HTTP/1.1\r\nHost: a, b\r\n\r\n", H1Error::InvalidHost),
            // Content-Length.
            ("CL and TE", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", H1Error::ContentLengthWithTransferEncoding),
            ("TE and CL", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", H1Error::ContentLengthWithTransferEncoding),
            ("CL differing", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", H1Error::DuplicateContentLength),
            ("CL identical", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", H1Error::DuplicateContentLength),
            ("CL list", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n", H1Error::DuplicateContentLength),
            ("CL list differing", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5,6\r\n\r\n", H1Error::DuplicateContentLength),
            ("CL empty", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n", H1Error::InvalidContentLength),
            ("CL sign", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n", H1Error::InvalidContentLength),
            ("CL negative", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", H1Error::InvalidContentLength),
            ("CL hex", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x5\r\n\r\n", H1Error::InvalidContentLength),
            ("CL inner space", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1 2\r\n\r\n", H1Error::InvalidContentLength),
            ("CL overflow", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551616\r\n\r\n", H1Error::InvalidContentLength),
            // Transfer-Encoding.
            ("TE gzip only", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", H1Error::InvalidTransferEncoding),
            ("TE chunked not final", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", H1Error::InvalidTransferEncoding),
            ("TE chunked twice", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", H1Error::InvalidTransferEncoding),
            ("TE empty", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n\r\n", H1Error::InvalidTransferEncoding),
            ("TE smuggle suffix", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunkedx\r\n\r\n", H1Error::InvalidTransferEncoding),
            ("TE vertical tab", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \x0bchunked\r\n\r\n", H1Error::InvalidHeaderValue),
            ("TE gzip then chunked", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", H1Error::UnsupportedTransferCoding),
            ("TE in HTTP/1.0", b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", H1Error::TransferEncodingInHttp10),
            // Expect.
            ("Expect other", b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\n\r\n", H1Error::UnsupportedExpectation),
            ("Expect with extra", b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue, x\r\n\r\n", H1Error::UnsupportedExpectation),
            ("Expect param", b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue;a=b\r\n\r\n", H1Error::UnsupportedExpectation),
        ];
        for (name, input, want) in table {
            assert_eq!(parse(input), Err(*want), "{name}: {:?}", show(input));
        }
    }

    #[test]
    fn framing_and_persistence() {
        type Row = (&'static [u8], BodyFraming, bool, bool);
        let table: &[Row] = &[
            (
                b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
                BodyFraming::None,
                true,
                false,
            ),
            (
                b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
                BodyFraming::None,
                false,
                false,
            ),
            (
                b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Keep-Alive, CLOSE\r\n\r\n",
                BodyFraming::None,
                false,
                false,
            ),
            (
                b"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nConnection: close\r\n\r\n",
                BodyFraming::None,
                false,
                false,
            ),
            (
                b"GET / HTTP/1.1\r\nHost: a\r\nConnection: closed\r\n\r\n",
                BodyFraming::None,
                true,
                false,
            ),
            (b"GET / HTTP/1.0\r\n\r\n", BodyFraming::None, false, false),
            (
                b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
                BodyFraming::None,
                true,
                false,
            ),
            (
                b"GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n",
                BodyFraming::None,
                false,
                false,
            ),
            (
                b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
                BodyFraming::ContentLength(0),
                true,
                false,
            ),
            (
                b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 42\r\n\r\n",
                BodyFraming::ContentLength(42),
                true,
                false,
            ),
            (
                b"POST / HTTP/1.1\r\nHost: a\r\ncontent-length:\t 007 \t\r\n\r\n",
                BodyFraming::ContentLength(7),
                true,
                false,
            ),
            (
                b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551615\r\n\r\n",
                BodyFraming::ContentLength(u64::MAX),
                true,
                false,
            ),
            (
                b"POST / HTTP/1.0\r\nContent-Length: 3\r\n\r\n",
                BodyFraming::ContentLength(3),
                false,
                false,
            ),
            (
                b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
                BodyFraming::Chunked,
                true,
                false,
            ),
            (
                b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: ChUnKeD\r\n\r\n",
                BodyFraming::Chunked,
                true,
                false,
            ),
            (
                b"POST / HTTP/1.1\r\nHost: a\r\ntransfer-encoding:\tchunked\t\r\n\r\n",
                BodyFraming::Chunked,
                true,
                false,
            ),
            (
                b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: ,chunked,\r\n\r\n",
                BodyFraming::Chunked,
                true,
                false,
            ),
            (
                b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
                BodyFraming::ContentLength(1),
                true,
                true,
            ),
            (
                b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n",
                BodyFraming::ContentLength(1),
                true,
                true,
            ),
            (
                b"POST / HTTP/1.1\r\nHost: a\r\nExpect:\r\nContent-Length: 1\r\n\r\n",
                BodyFraming::ContentLength(1),
                true,
                false,
            ),
            // RFC 9110 §10.1.1: a 100-continue expectation in HTTP/1.0 is ignored.
            (
                b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
                BodyFraming::ContentLength(1),
                false,
                false,
            ),
        ];
        for (input, framing, keep_alive, expects_continue) in table {
            let (head, consumed) = complete(input);
            assert_eq!(consumed, input.len(), "{:?}", show(input));
            assert_eq!(head.framing(), *framing, "{:?}", show(input));
            assert_eq!(head.is_keep_alive(), *keep_alive, "{:?}", show(input));
            assert_eq!(
                head.expects_continue(),
                *expects_continue,
                "{:?}",
                show(input)
            );
        }
    }

    #[test]
    fn accessors_and_header_order() {
        let input = b"POST /a?b=c HTTP/1.1\r\nHost: api.example:8080\r\nX-A: 1\r\nx-a: 2\r\n\
            Accept: */*\r\nX-Empty:\r\nX-Obs: caf\xe9\r\nContent-Length: 3\r\n\r\nabc";
        let (head, consumed) = complete(input);
        assert_eq!(consumed, input.len() - 3);
        assert_eq!(head.method(), "POST");
        assert_eq!(head.target(), "/a?b=c");
        assert_eq!(head.target_form(), TargetForm::Origin);
        assert_eq!(head.version(), Version::Http11);
        assert_eq!(head.host(), Some(&b"api.example:8080"[..]));
        let headers = head.headers();
        assert_eq!(headers.len(), 7);
        let names: Vec<&str> = headers.iter().map(|h| h.name()).collect();
        assert_eq!(
            names,
            [
                "Host",
                "X-A",
                "x-a",
                "Accept",
                "X-Empty",
                "X-Obs",
                "Content-Length"
            ]
        );
        assert_eq!(headers.value("x-A"), Some(&b"1"[..]));
        let all: Vec<&[u8]> = headers.values("X-A").collect();
        assert_eq!(all, vec![&b"1"[..], b"2"]);
        assert_eq!(headers.value("x-empty"), Some(&b""[..]));
        assert_eq!(headers.value("x-obs"), Some(&b"caf\xe9"[..]));
        assert!(headers.contains("ACCEPT"));
        assert!(!headers.contains("cookie"));
        assert_eq!(headers.value("cookie"), None);
    }

    #[test]
    fn target_forms() {
        let table: &[(&[u8], TargetForm, &str)] = &[
            (
                b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n",
                TargetForm::Origin,
                "/x",
            ),
            (
                b"GET http://a.example/x?y HTTP/1.1\r\nHost: a.example\r\n\r\n",
                TargetForm::Absolute,
                "http://a.example/x?y",
            ),
            (
                b"GET HTTPS://A.example HTTP/1.1\r\nHost: a.example\r\n\r\n",
                TargetForm::Absolute,
                "HTTPS://A.example",
            ),
            (
                b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n",
                TargetForm::Authority,
                "a.example:443",
            ),
            (
                b"CONNECT [2001:db8::1]:443 HTTP/1.1\r\nHost: [2001:db8::1]:443\r\n\r\n",
                TargetForm::Authority,
                "[2001:db8::1]:443",
            ),
            (
                b"CONNECT 192.0.2.1:8443 HTTP/1.1\r\nHost: 192.0.2.1:8443\r\n\r\n",
                TargetForm::Authority,
                "192.0.2.1:8443",
            ),
            (
                b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
                TargetForm::Asterisk,
                "*",
            ),
            (
                b"GET /{a}|b HTTP/1.1\r\nHost: a\r\n\r\n",
                TargetForm::Origin,
                "/{a}|b",
            ),
        ];
        for (input, form, target) in table {
            let (head, _) = complete(input);
            assert_eq!(head.target_form(), *form, "{:?}", show(input));
            assert_eq!(head.target(), *target);
        }
    }

    #[test]
    fn host_values() {
        let table: &[(&[u8], bool)] = &[
            (b"", true),
            (b"a.example", true),
            (b"a.example:8080", true),
            (b"a.example:", true),
            (b"[::1]", true),
            (b"[::1]:80", true),
            (b"192.0.2.1:80", true),
            (b"xn--bcher-kva.example", true),
            (b"a%20b", true),
            (b"a b", false),
            (b"a/b", false),
            (b"u@a", false),
            (b"a:b", false),
            (b"[::1", false),
            (b"[]", false),
            (b"[::1]x", false),
            (b"a:1:2", false),
        ];
        for (host, want) in table {
            assert_eq!(is_valid_host(host), *want, "{:?}", show(host));
        }
    }

    #[test]
    fn exotic_but_legal() {
        let table: &[&[u8]] = &[
            // Leading empty lines before the request line (RFC 9112 §2.2).
            b"\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
            // Tabs and spaces as OWS around values.
            b"GET / HTTP/1.1\r\nHost:\ta\t\r\nX:  \t b \t \r\n\r\n",
            // Empty values and token characters in names.
            b"GET / HTTP/1.1\r\nHost: a\r\nX-!#$%&'*+-.^_`|~: v\r\nY:\r\n\r\n",
            // obs-text in values.
            b"GET / HTTP/1.1\r\nHost: a\r\nX: \x80\xff\r\n\r\n",
            // HTTP/1.0 without Host.
            b"GET / HTTP/1.0\r\n\r\n",
            // Extension methods are tokens.
            b"PROPFIND / HTTP/1.1\r\nHost: a\r\n\r\n",
            // Empty Host.
            b"GET / HTTP/1.1\r\nHost:\r\n\r\n",
        ];
        for input in table {
            let (_, consumed) = complete(input);
            assert_eq!(consumed, input.len(), "{:?}", show(input));
        }
        // Only OPTIONS may use the asterisk-form.
        assert_eq!(
            parse(b"M-SEARCH * HTTP/1.1\r\nHost: a\r\n\r\n"),
            Err(H1Error::InvalidTarget)
        );
    }

    #[test]
    fn pipelined_requests_are_found_by_consumed_len() {
        let first = b"POST /one HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n";
        let second = b"GET /two HTTP/1.1\r\nHost: a\r\n\r\n";
        let mut buf = Vec::new();
        buf.extend_from_slice(first);
        buf.extend_from_slice(b"hello");
        buf.extend_from_slice(second);
        let (head, consumed) = complete(&buf);
        assert_eq!(head.target(), "/one");
        assert_eq!(consumed, first.len());
        assert_eq!(head.framing(), BodyFraming::ContentLength(5));
        let rest = &buf[consumed + 5..];
        let (head, consumed) = complete(rest);
        assert_eq!(head.target(), "/two");
        assert_eq!(consumed, second.len());
    }

    #[test]
    fn every_split_point_is_partial_then_complete() {
        let input =
            b"POST /upload?x=1 HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\
            Expect: 100-continue\r\nX-Tab:\tv\r\n\r\n";
        for cut in 0..input.len() {
            assert_eq!(parse(&input[..cut]), Ok(Parsed::Partial), "cut at {cut}");
        }
        let (head, consumed) = complete(input);
        assert_eq!(consumed, input.len());
        assert_eq!(head.framing(), BodyFraming::Chunked);
        assert!(head.expects_continue());
    }

    #[test]
    fn errors_surface_before_the_head_is_complete() {
        let table: &[(&[u8], H1Error)] = &[
            (b"GET / HTTP/1.1\nHost", H1Error::BareLf),
            (b"G(T", H1Error::InvalidMethod),
            (b"GET / HTTP/2", H1Error::UnsupportedVersion),
            (b"GET / HTTX", H1Error::InvalidVersion),
            (
                b"GET / HTTP/1.1\r\nHost : a",
                H1Error::WhitespaceBeforeColon,
            ),
            (b"GET / HTTP/1.1\r\nHost: a\r\n b", H1Error::ObsFold),
        ];
        for (input, want) in table {
            assert_eq!(parse(input), Err(*want), "{:?}", show(input));
        }
    }

    #[test]
    fn head_limits() {
        fn p(b: &[u8]) -> Result<Parsed<RequestHead<'_>>, H1Error> {
            let limits = HeadLimits {
                max_head_bytes: 64,
                max_headers: 2,
                max_target_bytes: 16,
            };
            parse_request_head(b, &limits)
        }

        // Exactly at the head limit is fine; one byte more is 431.
        let mut fits = b"GET / HTTP/1.1\r\nHost: a\r\nX: ".to_vec();
        fits.resize(64 - 4, b'v');
        fits.extend_from_slice(b"\r\n\r\n");
        assert_eq!(fits.len(), 64);
        assert!(matches!(
            p(&fits),
            Ok(Parsed::Complete {
                consumed_len: 64,
                ..
            })
        ));
        let mut over = fits[..fits.len() - 4].to_vec();
        over.extend_from_slice(b"v\r\n\r\n");
        assert_eq!(p(&over), Err(H1Error::HeadTooLarge));
        // An incomplete head that already fills the limit is 431 without waiting for more.
        assert_eq!(p(&over[..64]), Err(H1Error::HeadTooLarge));
        assert_eq!(p(&over[..63]), Ok(Parsed::Partial));

        // Header count.
        assert!(matches!(
            p(b"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n\r\n"),
            Ok(Parsed::Complete { .. })
        ));
        assert_eq!(
            p(b"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\nY: 2\r\n\r\n"),
            Err(H1Error::TooManyHeaders)
        );

        // Target length: complete and still arriving.
        assert!(matches!(
            p(b"GET /234567890123456 HTTP/1.1\r\nHost: a\r\n\r\n"),
            Ok(Parsed::Complete { .. })
        ));
        assert_eq!(
            p(b"GET /2345678901234567 HTTP/1.1\r\nHost: a\r\n\r\n"),
            Err(H1Error::TargetTooLong)
        );
        assert_eq!(p(b"GET /2345678901234567"), Err(H1Error::TargetTooLong));
        assert_eq!(p(b"GET /234567890123456"), Ok(Parsed::Partial));
    }

    #[test]
    fn default_limits() {
        assert_eq!(LIMITS.max_head_bytes, 16 * 1024);
        assert_eq!(LIMITS.max_headers, 100);
        assert_eq!(LIMITS.max_target_bytes, 8192);

        let mut long_target = b"GET /".to_vec();
        long_target.resize(5 + 9000, b'a');
        assert_eq!(parse(&long_target), Err(H1Error::TargetTooLong));
        long_target.extend_from_slice(b" HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(parse(&long_target), Err(H1Error::TargetTooLong));

        let mut many = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
        for i in 0..100 {
            many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(parse(&many), Err(H1Error::TooManyHeaders));

        let mut huge = b"GET / HTTP/1.1\r\nHost: a\r\nX: ".to_vec();
        huge.resize(20_000, b'v');
        assert_eq!(parse(&huge), Err(H1Error::HeadTooLarge));

        // A ceiling larger than the stack slots acts as the ceiling.
        let wide = HeadLimits {
            max_headers: 10_000,
            ..LIMITS
        };
        let mut at_ceiling = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
        for i in 0..MAX_HEADERS_CEILING {
            at_ceiling.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
        }
        at_ceiling.extend_from_slice(b"\r\n");
        let wide = HeadLimits {
            max_head_bytes: 1 << 20,
            ..wide
        };
        assert_eq!(
            parse_request_head(&at_ceiling, &wide),
            Err(H1Error::TooManyHeaders)
        );
    }

    #[test]
    fn framing_helpers() {
        assert!(!BodyFraming::None.has_body());
        assert!(!BodyFraming::ContentLength(0).has_body());
        assert!(BodyFraming::ContentLength(1).has_body());
        assert!(BodyFraming::Chunked.has_body());
    }

    #[test]
    fn list_tokens_across_lines() {
        let (head, _) = complete(
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, X-Hop\r\nconnection: ,te\r\n\r\n",
        );
        let tokens: Vec<&[u8]> = head.headers().list_members("connection").collect();
        assert_eq!(tokens, vec![&b"keep-alive"[..], b"X-Hop", b"te"]);
        assert!(head.headers().has_token("Connection", "x-hop"));
        assert!(!head.headers().has_token("Connection", "close"));
    }
}
