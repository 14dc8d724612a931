//! Serialising request heads (upstream client), response heads (server) and chunked bodies,
//! appending to a `Vec<u8>`.
//!
//! Every field written is checked: a name must be a token and a value must hold no CR, LF or
//! other control byte, so nothing a caller passes through can split a head. Framing fields
//! (Host, Content-Length, Transfer-Encoding) are written by the writer alone; copies in the
//! caller's list are dropped so that framing cannot disagree with the body that follows. The
//! exceptions are [`HeadPart::ParsedLines`], field lines of a head this crate's parser
//! accepted, which a relay copies as they arrived, and the writer's own fields
//! ([`ResponseHeadWriter::own_field`], [`write_request_head_with`]): names and values the
//! caller's code spells as constants or formats itself (a content type it names, the date),
//! never bytes it received (decision 129). Their callers answer for them. An envelope's
//! destination headers ([`write_request_head_of`]) are not checked again either: a
//! [`Header`] is only made by the checks the writer would make, and more.
//!
//! On the per-request path: appends only, no logging.

use super::error::H1Error;
use super::head::{is_field_value, is_target_byte, is_token};
use super::request::is_valid_host;
use crate::ascii::eq_lower;
use crate::request::{Header, Host, TargetUrl};

/// How the body following a written head is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutgoingBody {
    /// No framing field is written (no body, or a response that cannot have one).
    None,
    /// `Content-Length: n` is written.
    ContentLength(u64),
    /// `Transfer-Encoding: chunked` is written; encode the body with [`write_chunk`] and
    /// [`write_last_chunk`].
    Chunked,
}

/// The last chunk and the empty trailer section that end a chunked body.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";
/// The CRLF that follows the data of a chunk written after [`write_chunk_header`].
pub const CHUNK_DATA_END: &[u8] = b"\r\n";

/// Appends an HTTP/1.1 request head: request line, `Host` first, the caller's fields in order,
/// then the framing field and the empty line.
///
/// `target` is the origin-form (`/path?query`) for a direct upstream or the absolute-form for
/// an upstream proxy. On error nothing is appended.
pub fn write_request_head<I, N, V>(
    out: &mut Vec<u8>,
    method: &str,
    target: &str,
    host: &[u8],
    headers: I,
    body: OutgoingBody,
) -> Result<(), H1Error>
where
    I: IntoIterator<Item = (N, V)>,
    N: AsRef<[u8]>,
    V: AsRef<[u8]>,
{
    write_request_head_with(out, method, target, host, headers, &[], body)
}

/// [`write_request_head`] with the writer's own field lines after the caller's fields:
/// `own_lines` is whole lines (`name ": " value CRLF` each) of constants the caller's code spells
/// (such as `Connection: keep-alive`), written as they are, without the byte checks a field from
/// elsewhere gets. Never a framing field, never received bytes.
pub fn write_request_head_with<I, N, V>(
    out: &mut Vec<u8>,
    method: &str,
    target: &str,
    host: &[u8],
    headers: I,
    own_lines: &[u8],
    body: OutgoingBody,
) -> Result<(), H1Error>
where
    I: IntoIterator<Item = (N, V)>,
    N: AsRef<[u8]>,
    V: AsRef<[u8]>,
{
    check_request_line(method, target)?;
    if !is_valid_host(host) {
        return Err(H1Error::InvalidHost);
    }
    let start = start_request_head(out, method, target, host.len());
    out.extend_from_slice(host);
    out.extend_from_slice(b"\r\n");
    finish_head(out, start, headers, own_lines, body)
}

/// [`write_request_head_with`] to the destination `url`: its origin-form target, and its
/// authority as the `Host` field, written straight into `out`. An address literal is written
/// from its numbers and needs no check; a name is checked as any `Host` value is. On error
/// nothing is appended.
pub fn write_request_head_to<I, N, V>(
    out: &mut Vec<u8>,
    method: &str,
    url: &TargetUrl,
    headers: I,
    own_lines: &[u8],
    body: OutgoingBody,
) -> Result<(), H1Error>
where
    I: IntoIterator<Item = (N, V)>,
    N: AsRef<[u8]>,
    V: AsRef<[u8]>,
{
    let start = start_head_to(out, method, url)?;
    finish_head(out, start, headers, own_lines, body)
}

/// [`write_request_head_to`] with validated destination headers. Their bytes were checked when
/// each [`Header`] was made (a token name that names no field the gateway manages, so none the
/// writer owns; a value without control bytes but HTAB), so they are written as they are,
/// after one reservation for all of them. On error nothing is appended.
pub fn write_request_head_of(
    out: &mut Vec<u8>,
    method: &str,
    url: &TargetUrl,
    headers: &[Header],
    own_lines: &[u8],
    body: OutgoingBody,
) -> Result<(), H1Error> {
    start_head_to(out, method, url)?;
    // Each line's name and value, `: ` and CRLF; then the own lines, the framing field and the
    // empty line.
    let room = headers.iter().fold(own_lines.len() + 48, |n, h| {
        n + h.name().len() + h.value().len() + 4
    });
    out.reserve(room);
    for h in headers {
        out.extend_from_slice(h.name().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(own_lines);
    end_head(out, body);
    Ok(())
}

/// The request line to `url` and its `Host` field, checked; returns where the head starts.
fn start_head_to(out: &mut Vec<u8>, method: &str, url: &TargetUrl) -> Result<usize, H1Error> {
    let target = url.path_and_query.as_str();
    check_request_line(method, target)?;
    if let Host::Domain(name) = &url.host {
        if !is_valid_host(name.as_bytes()) {
            return Err(H1Error::InvalidHost);
        }
    }
    let start = start_request_head(out, method, target, 0);
    url.write_authority(out);
    out.extend_from_slice(b"\r\n");
    Ok(start)
}

/// The checks of a request line's method and target that every request head writer makes.
fn check_request_line(method: &str, target: &str) -> Result<(), H1Error> {
    if !is_token(method.as_bytes()) {
        return Err(H1Error::InvalidMethod);
    }
    if target.is_empty() || !target.bytes().all(is_target_byte) {
        return Err(H1Error::InvalidTarget);
    }
    Ok(())
}

/// Appends the request line and the `Host` field's name, reserving room for a host of
/// `host_len` bytes beyond the usual; returns where the head starts, for a later error to
/// remove it. The caller writes the host and its CRLF.
fn start_request_head(out: &mut Vec<u8>, method: &str, target: &str, host_len: usize) -> usize {
    let start = out.len();
    out.reserve(target.len().saturating_add(host_len).saturating_add(64));
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    start
}

/// One piece of a response head's field section ([`write_response_head`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadPart<'a> {
    /// A field, checked as it is written; a framing field is dropped.
    Field(&'a [u8], &'a [u8]),
    /// Whole field lines of a received head, copied as they are: each `field-name ":" OWS
    /// field-value OWS CRLF` as this crate's parser accepted it (a token name, a value of
    /// field-value bytes, no fold), none of them a framing field. They are not checked again:
    /// the caller answers for where the lines start and end (a relay holds the offsets the
    /// parser gave, checked against the received buffer).
    ParsedLines(&'a [u8]),
}

/// Appends an HTTP/1.1 response head with the standard reason phrase of `status` and the field
/// section given in parts ([`HeadPart`]), in order. On error nothing is appended.
pub fn write_response_head<'a>(
    out: &mut Vec<u8>,
    status: u16,
    parts: impl IntoIterator<Item = HeadPart<'a>>,
    body: OutgoingBody,
) -> Result<(), H1Error> {
    write_response_head_with_reason(out, status, reason_phrase(status), parts, body)
}

/// [`write_response_head`] with a chosen reason phrase (for example `Connection Established`
/// for CONNECT). On error nothing is appended.
pub fn write_response_head_with_reason<'a>(
    out: &mut Vec<u8>,
    status: u16,
    reason: &str,
    parts: impl IntoIterator<Item = HeadPart<'a>>,
    body: OutgoingBody,
) -> Result<(), H1Error> {
    let mut head = ResponseHeadWriter::with_reason(out, status, reason)?;
    for part in parts {
        head.part(part)?;
    }
    head.end(body);
    Ok(())
}

/// A response head written part by part, in order: [`write_response_head`] for a caller whose
/// parts come from several places, each written as it is found rather than through one chain
/// of iterators. On error the head written so far is removed.
pub struct ResponseHeadWriter<'o> {
    out: &'o mut Vec<u8>,
    /// Where the head starts in `out`.
    start: usize,
}

impl<'o> ResponseHeadWriter<'o> {
    /// Appends the status line with the standard reason phrase of `status`: a line of the
    /// table copied whole when the status has one (every response the server writes).
    pub fn start(out: &'o mut Vec<u8>, status: u16) -> Result<Self, H1Error> {
        let line = status_line(status);
        if line.is_empty() {
            return Self::with_reason(out, status, "");
        }
        let start = out.len();
        out.extend_from_slice(line.as_bytes());
        Ok(ResponseHeadWriter { out, start })
    }

    /// Appends the status line with `reason`.
    pub fn with_reason(out: &'o mut Vec<u8>, status: u16, reason: &str) -> Result<Self, H1Error> {
        let start = start_response_head(out, status, reason)?;
        Ok(ResponseHeadWriter { out, start })
    }

    /// Appends one part of the field section ([`HeadPart`]).
    #[inline]
    pub fn part(&mut self, part: HeadPart<'_>) -> Result<(), H1Error> {
        match part {
            HeadPart::Field(name, value) => self.field(name, value),
            HeadPart::ParsedLines(lines) => {
                self.out.extend_from_slice(lines);
                Ok(())
            }
        }
    }

    /// Appends one field, checked; a framing field is dropped.
    #[inline]
    pub fn field(&mut self, name: &[u8], value: &[u8]) -> Result<(), H1Error> {
        push_field(self.out, self.start, name, value)
    }

    /// Appends a field of the writer's own: a name and value the caller's code spells as
    /// constants or formats itself (a content type it names, the date it formatted), never
    /// bytes it received or a framing field. Written as given, without the byte checks of
    /// [`ResponseHeadWriter::field`]: the server writes these on every response.
    #[inline]
    pub fn own_field(&mut self, name: &'static str, value: &[u8]) {
        self.out
            .reserve(name.len().saturating_add(value.len()).saturating_add(4));
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b": ");
        self.out.extend_from_slice(value);
        self.out.extend_from_slice(b"\r\n");
    }

    /// Appends one whole field line of the writer's own (`name ": " value CRLF`) that the
    /// caller's code formatted itself, such as the date, as it is
    /// ([`ResponseHeadWriter::own_field`]).
    #[inline]
    pub fn own_line(&mut self, line: &[u8]) {
        self.out.extend_from_slice(line);
    }

    /// Appends whole field lines of the writer's own (`name ": " value CRLF` each), constants
    /// of the caller's code, as they are ([`ResponseHeadWriter::own_field`]).
    #[inline]
    pub fn own_lines(&mut self, lines: &'static [u8]) {
        self.out.extend_from_slice(lines);
    }

    /// Appends the framing field and the empty line that end the head.
    pub fn end(self, body: OutgoingBody) {
        end_head(self.out, body);
    }
}

/// Appends the status line; returns where the head starts, for a later error to remove it.
fn start_response_head(out: &mut Vec<u8>, status: u16, reason: &str) -> Result<usize, H1Error> {
    // RFC 9112 §4: `status-code = 3DIGIT`, `reason-phrase = 1*( HTAB / SP / VCHAR /
    // obs-text )`; RFC 9110 §15 limits codes to 100..599.
    if !(100..=599).contains(&status) {
        return Err(H1Error::InvalidStatus);
    }
    if !reason
        .bytes()
        .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
    {
        return Err(H1Error::InvalidStatus);
    }
    let start = out.len();
    out.extend_from_slice(b"HTTP/1.1 ");
    push_decimal(out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(reason.as_bytes());
    out.extend_from_slice(b"\r\n");
    Ok(start)
}

fn finish_head<I, N, V>(
    out: &mut Vec<u8>,
    start: usize,
    headers: I,
    own_lines: &[u8],
    body: OutgoingBody,
) -> Result<(), H1Error>
where
    I: IntoIterator<Item = (N, V)>,
    N: AsRef<[u8]>,
    V: AsRef<[u8]>,
{
    for (name, value) in headers {
        push_field(out, start, name.as_ref(), value.as_ref())?;
    }
    out.extend_from_slice(own_lines);
    end_head(out, body);
    Ok(())
}

/// Appends one checked field (a framing field is dropped); on error the head from `start` is
/// removed.
#[inline]
fn push_field(out: &mut Vec<u8>, start: usize, name: &[u8], value: &[u8]) -> Result<(), H1Error> {
    let checked = if !is_token(name) {
        Err(H1Error::InvalidHeaderName)
    } else if !is_field_value(value) {
        Err(H1Error::InvalidHeaderValue)
    } else {
        Ok(())
    };
    if let Err(e) = checked {
        out.truncate(start);
        return Err(e);
    }
    if !is_writer_owned(name) {
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    Ok(())
}

/// Appends the framing field and the empty line that end a head.
fn end_head(out: &mut Vec<u8>, body: OutgoingBody) {
    match body {
        OutgoingBody::None => {}
        OutgoingBody::ContentLength(n) => {
            out.extend_from_slice(b"Content-Length: ");
            push_decimal(out, n);
            out.extend_from_slice(b"\r\n");
        }
        OutgoingBody::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
}

/// Whether `name` is a framing field, which the writer alone writes (`Host`, `Content-Length`,
/// `Transfer-Encoding`). By length first: this runs for every field written.
pub fn is_writer_owned(name: &[u8]) -> bool {
    match name.len() {
        4 => eq_lower(name, b"host"),
        14 => eq_lower(name, b"content-length"),
        17 => eq_lower(name, b"transfer-encoding"),
        _ => false,
    }
}

/// Appends one chunk: size line, data, CRLF. Empty data writes nothing, because a zero-size
/// chunk would end the body.
pub fn write_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    write_chunk_header(out, data.len() as u64);
    out.extend_from_slice(data);
    out.extend_from_slice(CHUNK_DATA_END);
}

/// Appends the size line of a chunk of `len` bytes, for callers that write the data from
/// their own buffer and then [`CHUNK_DATA_END`]. A zero `len` writes nothing.
pub fn write_chunk_header(out: &mut Vec<u8>, len: u64) {
    if len == 0 {
        return;
    }
    push_hex(out, len);
    out.extend_from_slice(b"\r\n");
}

/// Appends the last chunk and an empty trailer section.
pub fn write_last_chunk(out: &mut Vec<u8>) {
    out.extend_from_slice(LAST_CHUNK);
}

/// The reason phrase of a status code (RFC 9110 §15), or an empty string for codes without a
/// registered phrase.
pub const fn reason_phrase(status: u16) -> &'static str {
    // The line is `HTTP/1.1 NNN ` (13 bytes), the phrase, then CRLF.
    let line = status_line(status).as_bytes();
    let Some((_, rest)) = line.split_at_checked(13) else {
        return "";
    };
    let Some((phrase, _)) = rest.split_at_checked(rest.len().saturating_sub(2)) else {
        return "";
    };
    match std::str::from_utf8(phrase) {
        Ok(phrase) => phrase,
        Err(_) => "",
    }
}

/// The whole status line of a status with a standard reason phrase (empty for any other): the
/// one table of the phrases, and what a response head starts with, copied as it is.
const fn status_line(status: u16) -> &'static str {
    match status {
        100 => "HTTP/1.1 100 Continue\r\n",
        101 => "HTTP/1.1 101 Switching Protocols\r\n",
        103 => "HTTP/1.1 103 Early Hints\r\n",
        200 => "HTTP/1.1 200 OK\r\n",
        201 => "HTTP/1.1 201 Created\r\n",
        202 => "HTTP/1.1 202 Accepted\r\n",
        203 => "HTTP/1.1 203 Non-Authoritative Information\r\n",
        204 => "HTTP/1.1 204 No Content\r\n",
        205 => "HTTP/1.1 205 Reset Content\r\n",
        206 => "HTTP/1.1 206 Partial Content\r\n",
        300 => "HTTP/1.1 300 Multiple Choices\r\n",
        301 => "HTTP/1.1 301 Moved Permanently\r\n",
        302 => "HTTP/1.1 302 Found\r\n",
        303 => "HTTP/1.1 303 See Other\r\n",
        304 => "HTTP/1.1 304 Not Modified\r\n",
        307 => "HTTP/1.1 307 Temporary Redirect\r\n",
        308 => "HTTP/1.1 308 Permanent Redirect\r\n",
        400 => "HTTP/1.1 400 Bad Request\r\n",
        401 => "HTTP/1.1 401 Unauthorized\r\n",
        403 => "HTTP/1.1 403 Forbidden\r\n",
        404 => "HTTP/1.1 404 Not Found\r\n",
        405 => "HTTP/1.1 405 Method Not Allowed\r\n",
        406 => "HTTP/1.1 406 Not Acceptable\r\n",
        407 => "HTTP/1.1 407 Proxy Authentication Required\r\n",
        408 => "HTTP/1.1 408 Request Timeout\r\n",
        409 => "HTTP/1.1 409 Conflict\r\n",
        410 => "HTTP/1.1 410 Gone\r\n",
        411 => "HTTP/1.1 411 Length Required\r\n",
        412 => "HTTP/1.1 412 Precondition Failed\r\n",
        413 => "HTTP/1.1 413 Content Too Large\r\n",
        414 => "HTTP/1.1 414 URI Too Long\r\n",
        415 => "HTTP/1.1 415 Unsupported Media Type\r\n",
        416 => "HTTP/1.1 416 Range Not Satisfiable\r\n",
        417 => "HTTP/1.1 417 Expectation Failed\r\n",
        421 => "HTTP/1.1 421 Misdirected Request\r\n",
        422 => "HTTP/1.1 422 Unprocessable Content\r\n",
        426 => "HTTP/1.1 426 Upgrade Required\r\n",
        428 => "HTTP/1.1 428 Precondition Required\r\n",
        429 => "HTTP/1.1 429 Too Many Requests\r\n",
        431 => "HTTP/1.1 431 Request Header Fields Too Large\r\n",
        // Not registered; the request API uses it for `cancelled` (as nginx does).
        499 => "HTTP/1.1 499 Client Closed Request\r\n",
        500 => "HTTP/1.1 500 Internal Server Error\r\n",
        501 => "HTTP/1.1 501 Not Implemented\r\n",
        502 => "HTTP/1.1 502 Bad Gateway\r\n",
        503 => "HTTP/1.1 503 Service Unavailable\r\n",
        504 => "HTTP/1.1 504 Gateway Timeout\r\n",
        505 => "HTTP/1.1 505 HTTP Version Not Supported\r\n",
        _ => "",
    }
}

fn push_decimal(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(crate::decimal::Digits::of(n).as_bytes());
}

fn push_hex(out: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        if let Some(slot) = digits.get_mut(i) {
            *slot = crate::hex::digit((n & 0xf) as u8);
        }
        n >>= 4;
        if n == 0 || i == 0 {
            break;
        }
    }
    out.extend_from_slice(digits.get(i..).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::h1::{
        parse_request_head, parse_response_head, BodyFraming, BodyLimits, ChunkedDecoder,
        HeadLimits, Parsed, ResponseFraming,
    };

    const NO_HEADERS: [(&str, &str); 0] = [];
    const NO_PARTS: [HeadPart<'static>; 0] = [];

    /// The writer's own lines and fields go where the checked ones would, and the heads they
    /// make parse back with the same fields.
    #[test]
    fn own_fields_are_written_in_place() {
        let mut out = Vec::new();
        write_request_head_with(
            &mut out,
            "GET",
            "/",
            b"a.example",
            [("Accept", "*/*")],
            b"Connection: keep-alive\r\n",
            OutgoingBody::ContentLength(0),
        )
        .unwrap();
        assert_eq!(
            out,
            b"GET / HTTP/1.1\r\nHost: a.example\r\nAccept: */*\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n"
        );
        let Ok(Parsed::Complete { .. }) = parse_request_head(&out, &HeadLimits::REQUEST) else {
            panic!("the request head does not parse back");
        };

        let mut out = Vec::new();
        let mut head = ResponseHeadWriter::start(&mut out, 200).unwrap();
        head.own_field("content-type", b"application/json");
        head.field(b"X-A", b"1").unwrap();
        head.own_field("Date", b"Sun, 06 Nov 1994 08:49:37 GMT");
        head.own_lines(b"Connection: close\r\n");
        head.end(OutgoingBody::ContentLength(2));
        assert_eq!(
            out,
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nX-A: 1\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\nConnection: close\r\nContent-Length: 2\r\n\r\n"
        );
        let Ok(Parsed::Complete { head: parsed, .. }) =
            parse_response_head(&out, "GET", &HeadLimits::RESPONSE)
        else {
            panic!("the response head does not parse back");
        };
        assert_eq!(parsed.headers().len(), 5);
    }

    #[test]
    fn request_head_round_trips() {
        let mut out = b"previous".to_vec();
        write_request_head(
            &mut out,
            "POST",
            "/v1/items?x=1",
            b"api.example:8443",
            [
                ("Accept", "*/*"),
                ("X-Dup", "1"),
                ("x-dup", "2"),
                ("Content-Length", "99"),
                ("HOST", "evil"),
            ],
            OutgoingBody::ContentLength(12),
        )
        .unwrap();
        let head = &out[b"previous".len()..];
        assert_eq!(
            head,
            b"POST /v1/items?x=1 HTTP/1.1\r\nHost: api.example:8443\r\nAccept: */*\r\n\
              X-Dup: 1\r\nx-dup: 2\r\nContent-Length: 12\r\n\r\n"
        );
        let Ok(Parsed::Complete {
            head: parsed,
            consumed_len,
        }) = parse_request_head(head, &HeadLimits::REQUEST)
        else {
            panic!("written head must parse");
        };
        assert_eq!(consumed_len, head.len());
        assert_eq!(parsed.method(), "POST");
        assert_eq!(parsed.host(), Some(&b"api.example:8443"[..]));
        assert_eq!(parsed.framing(), BodyFraming::ContentLength(12));
        let dups: Vec<&[u8]> = parsed.headers().values("x-dup").collect();
        assert_eq!(dups, vec![&b"1"[..], b"2"]);
    }

    /// The head to a URL is the head written with the URL's authority as text, for names,
    /// addresses and ports; a name that could not have been parsed is refused, nothing appended.
    #[test]
    fn request_head_to_a_url_matches_the_head_with_its_authority() {
        let fields = [("Accept", "*/*"), ("X-A", "1")];
        for input in [
            "http://example.com/a?b=c",
            "https://example.com:8443/",
            "http://127.0.0.1:19190/1k",
            "http://10.200.3.45/",
            "http://[2001:db8::1]:8080/p",
            "https://[::1]/",
        ] {
            let url = crate::request::parse_target_url(input).unwrap();
            let body = OutgoingBody::ContentLength(3);
            let (mut to, mut with) = (b"x".to_vec(), b"x".to_vec());
            let own = b"Connection: keep-alive\r\n";
            write_request_head_to(&mut to, "POST", &url, fields, own, body).unwrap();
            let host = url.authority();
            write_request_head_with(
                &mut with,
                "POST",
                &url.path_and_query,
                host.as_bytes(),
                fields,
                own,
                body,
            )
            .unwrap();
            assert_eq!(
                String::from_utf8_lossy(&to),
                String::from_utf8_lossy(&with),
                "{input}"
            );
        }
        let mut url = crate::request::parse_target_url("http://example.com/").unwrap();
        url.host = Host::Domain("evil.example\r\nX-Injected: 1".into());
        let mut out = b"x".to_vec();
        let refused = write_request_head_to(&mut out, "GET", &url, fields, b"", OutgoingBody::None);
        assert_eq!(refused, Err(H1Error::InvalidHost));
        assert_eq!(out, b"x");
    }

    /// Validated headers written unchecked make the head the checked writer makes of the same
    /// fields, for values with every byte a field value may hold; a bad host appends nothing.
    #[test]
    fn validated_headers_make_the_checked_head() {
        let values: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"*/*".to_vec(),
            b"a\tb c".to_vec(),
            (0x20..=0xffu8).filter(|&b| b != 0x7f).collect(),
        ];
        let headers: Vec<crate::request::Header> = values
            .iter()
            .enumerate()
            .map(|(i, v)| crate::request::Header::new(&format!("X-{i}"), v).unwrap())
            .collect();
        let fields: Vec<(&[u8], &[u8])> = headers
            .iter()
            .map(|h| (h.name().as_bytes(), h.value()))
            .collect();
        let url = crate::request::parse_target_url("http://example.com:8080/a?b").unwrap();
        for body in [
            OutgoingBody::None,
            OutgoingBody::ContentLength(7),
            OutgoingBody::Chunked,
        ] {
            let (mut checked, mut of) = (b"x".to_vec(), b"x".to_vec());
            let own = b"Connection: keep-alive\r\n";
            write_request_head_to(&mut checked, "PUT", &url, fields.iter().copied(), own, body)
                .unwrap();
            write_request_head_of(&mut of, "PUT", &url, &headers, own, body).unwrap();
            assert_eq!(checked, of);
        }
        let mut bad = url.clone();
        bad.host = Host::Domain("evil.example\r\nX-Injected: 1".into());
        let mut out = b"x".to_vec();
        let refused =
            write_request_head_of(&mut out, "GET", &bad, &headers, b"", OutgoingBody::None);
        assert_eq!(refused, Err(H1Error::InvalidHost));
        assert_eq!(out, b"x");
    }

    #[test]
    fn absolute_form_and_chunked_request() {
        let mut out = Vec::new();
        write_request_head(
            &mut out,
            "PUT",
            "http://a.example/up",
            b"a.example",
            NO_HEADERS,
            OutgoingBody::Chunked,
        )
        .unwrap();
        assert_eq!(
            out,
            b"PUT http://a.example/up HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
    }

    #[test]
    fn request_writer_rejects_injection_and_appends_nothing() {
        type Row = (
            &'static str,
            &'static str,
            &'static [u8],
            (&'static [u8], &'static [u8]),
            H1Error,
        );
        let table: &[Row] = &[
            ("GE T", "/", b"a", (b"X", b"v"), H1Error::InvalidMethod),
            ("", "/", b"a", (b"X", b"v"), H1Error::InvalidMethod),
            ("GET", "/a b", b"a", (b"X", b"v"), H1Error::InvalidTarget),
            ("GET", "", b"a", (b"X", b"v"), H1Error::InvalidTarget),
            (
                "GET",
                "/\r\nX: y",
                b"a",
                (b"X", b"v"),
                H1Error::InvalidTarget,
            ),
            ("GET", "/", b"a\r\nX: y", (b"X", b"v"), H1Error::InvalidHost),
            (
                "GET",
                "/",
                b"a",
                (b"X\r\nY", b"v"),
                H1Error::InvalidHeaderName,
            ),
            ("GET", "/", b"a", (b"", b"v"), H1Error::InvalidHeaderName),
            ("GET", "/", b"a", (b"X Y", b"v"), H1Error::InvalidHeaderName),
            (
                "GET",
                "/",
                b"a",
                (b"X", b"v\r\nY: z"),
                H1Error::InvalidHeaderValue,
            ),
            (
                "GET",
                "/",
                b"a",
                (b"X", b"v\nY: z"),
                H1Error::InvalidHeaderValue,
            ),
            (
                "GET",
                "/",
                b"a",
                (b"X", b"v\0"),
                H1Error::InvalidHeaderValue,
            ),
        ];
        for (method, target, host, header, want) in table {
            let mut out = b"keep".to_vec();
            let got = write_request_head(
                &mut out,
                method,
                target,
                host,
                [*header],
                OutgoingBody::None,
            );
            assert_eq!(got, Err(*want), "{method:?} {target:?} {host:?} {header:?}");
            assert_eq!(out, b"keep");
        }
    }

    #[test]
    fn response_head_forms() {
        let mut out = Vec::new();
        write_response_head(
            &mut out,
            200,
            [HeadPart::Field(b"Content-Type", b"application/json")],
            OutgoingBody::ContentLength(2),
        )
        .unwrap();
        assert_eq!(
            out,
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n"
        );

        out.clear();
        write_response_head(&mut out, 204, NO_PARTS, OutgoingBody::None).unwrap();
        assert_eq!(out, b"HTTP/1.1 204 No Content\r\n\r\n");

        out.clear();
        write_response_head(
            &mut out,
            599,
            [HeadPart::Field(b"Connection", b"close")],
            OutgoingBody::Chunked,
        )
        .unwrap();
        assert_eq!(
            out,
            b"HTTP/1.1 599 \r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        let Ok(Parsed::Complete { head, .. }) =
            parse_response_head(&out, "GET", &HeadLimits::RESPONSE)
        else {
            panic!("written head must parse");
        };
        assert_eq!(head.framing(), ResponseFraming::Chunked);
        assert!(!head.is_keep_alive());

        out.clear();
        write_response_head_with_reason(
            &mut out,
            200,
            "Connection Established",
            NO_PARTS,
            OutgoingBody::None,
        )
        .unwrap();
        assert_eq!(out, b"HTTP/1.1 200 Connection Established\r\n\r\n");

        for status in [0, 99, 600, 1000] {
            assert_eq!(
                write_response_head(&mut out, status, NO_PARTS, OutgoingBody::None),
                Err(H1Error::InvalidStatus)
            );
        }
        let mut out = Vec::new();
        assert_eq!(
            write_response_head_with_reason(&mut out, 200, "O\r\nK", NO_PARTS, OutgoingBody::None),
            Err(H1Error::InvalidStatus)
        );
        assert_eq!(
            write_response_head(
                &mut out,
                200,
                [HeadPart::Field(b"X", b"a\rb")],
                OutgoingBody::None
            ),
            Err(H1Error::InvalidHeaderValue)
        );
        assert!(out.is_empty());
    }

    #[test]
    fn reason_phrases() {
        let table = [
            (200, "OK"),
            (400, "Bad Request"),
            (413, "Content Too Large"),
            (414, "URI Too Long"),
            (417, "Expectation Failed"),
            (431, "Request Header Fields Too Large"),
            (501, "Not Implemented"),
            (505, "HTTP Version Not Supported"),
            (299, ""),
        ];
        for (status, phrase) in table {
            assert_eq!(reason_phrase(status), phrase);
        }
        // Every error status of the codec has a phrase.
        for e in crate::h1::H1Error::ALL {
            assert!(!reason_phrase(e.status()).is_empty(), "{e:?}");
        }
        // A status line copied from the table is the line written from its parts, for every
        // status; one without a phrase is written from its parts with an empty one.
        for status in 100..=599 {
            let mut copied = b"x".to_vec();
            ResponseHeadWriter::start(&mut copied, status).unwrap();
            let mut built = b"x".to_vec();
            start_response_head(&mut built, status, reason_phrase(status)).unwrap();
            assert_eq!(copied, built, "{status}");
            let line = status_line(status);
            assert!(
                line.is_empty()
                    || line == format!("HTTP/1.1 {status} {}\r\n", reason_phrase(status)),
                "{status}"
            );
        }
        assert!(ResponseHeadWriter::start(&mut Vec::new(), 99).is_err());
        assert!(ResponseHeadWriter::start(&mut Vec::new(), 600).is_err());
    }

    #[test]
    fn numbers() {
        let mut out = Vec::new();
        for n in [0u64, 7, 10, 255, 65_535, u64::MAX] {
            out.clear();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
            out.clear();
            push_hex(&mut out, n);
            assert_eq!(out, format!("{n:x}").as_bytes());
        }
    }

    #[test]
    fn chunks_round_trip_through_the_decoder() {
        let pieces: [&[u8]; 5] = [b"hello", b"", b" ", &[0u8; 300], b"\r\n0\r\n\r\n"];
        let mut out = Vec::new();
        let mut want = Vec::new();
        for p in pieces {
            write_chunk(&mut out, p);
            want.extend_from_slice(p);
        }
        write_chunk_header(&mut out, 0);
        write_chunk_header(&mut out, 3);
        out.extend_from_slice(b"abc");
        out.extend_from_slice(CHUNK_DATA_END);
        want.extend_from_slice(b"abc");
        write_last_chunk(&mut out);
        assert!(out.starts_with(b"5\r\nhello\r\n1\r\n \r\n12c\r\n"));
        assert!(out.ends_with(b"3\r\nabc\r\n0\r\n\r\n"));

        let mut decoder = ChunkedDecoder::new(BodyLimits::with_max_body(1 << 20));
        let mut got = Vec::new();
        let progress = decoder
            .decode(&out, &mut |d| got.extend_from_slice(d))
            .unwrap();
        assert!(progress.is_done);
        assert_eq!(progress.consumed, out.len());
        assert_eq!(got, want);
    }

    /// Parts are written in order: fields checked (a framing field dropped), parsed lines as
    /// they are; a bad field anywhere removes the whole head. The written head parses back
    /// with the same fields.
    #[test]
    fn parts_write_fields_checked_and_parsed_lines_as_they_are() {
        let mut out = b"x".to_vec();
        write_response_head(
            &mut out,
            200,
            [
                HeadPart::Field(b"A", b"1"),
                HeadPart::ParsedLines(b"B:  2\r\nC:\r\n"),
                HeadPart::Field(b"Content-Length", b"9"),
                HeadPart::Field(b"D", b"4"),
            ],
            OutgoingBody::ContentLength(5),
        )
        .expect("valid");
        let want = b"HTTP/1.1 200 OK\r\nA: 1\r\nB:  2\r\nC:\r\nD: 4\r\nContent-Length: 5\r\n\r\n";
        assert_eq!(&out[1..], &want[..]);
        let Ok(Parsed::Complete { head, .. }) =
            parse_response_head(&out[1..], "GET", &HeadLimits::RESPONSE)
        else {
            panic!("parses back");
        };
        let fields: Vec<(&str, &[u8])> = head
            .headers()
            .iter()
            .map(|h| (h.name(), h.value()))
            .collect();
        assert_eq!(
            fields,
            [
                ("A", &b"1"[..]),
                ("B", b"2"),
                ("C", b""),
                ("D", b"4"),
                ("Content-Length", b"5")
            ]
        );
        for bad in [
            HeadPart::Field(b"D", b"a\r\nb"),
            HeadPart::Field(b"D:", b"a"),
        ] {
            let mut out = b"x".to_vec();
            let r = write_response_head(
                &mut out,
                200,
                [HeadPart::ParsedLines(b"B: 2\r\n"), bad],
                OutgoingBody::None,
            );
            assert!(r.is_err(), "{bad:?}");
            assert_eq!(out, b"x");
        }
        let mut out = Vec::new();
        let r = write_response_head(&mut out, 99, NO_PARTS, OutgoingBody::None);
        assert_eq!(r, Err(H1Error::InvalidStatus));
        assert!(out.is_empty());
    }

    /// The framing fields are told by length first and then by name, in any case; nothing
    /// else is one.
    #[test]
    fn writer_owned_fields_by_length_and_name() {
        for name in ["Host", "content-length", "TRANSFER-ENCODING"] {
            assert!(is_writer_owned(name.as_bytes()), "{name}");
            let mut near = name.as_bytes().to_vec();
            near[0] ^= 1;
            assert!(!is_writer_owned(&near), "{near:?}");
            assert!(!is_writer_owned(&name.as_bytes()[1..]));
            assert!(!is_writer_owned(format!("{name}x").as_bytes()));
        }
        for len in 0..24 {
            assert!(!is_writer_owned(&vec![b'a'; len]));
        }
    }
}
