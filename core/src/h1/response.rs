//! Upstream client side: parsing a response head and deciding how its body is delimited and
//! whether the connection may be reused.
//!
//! On the per-request path of the egress executor: no allocation beyond the vector of fields
//! (collected [`Header`](super::Header)s, or their offsets for a caller that keeps the buffer),
//! no logging.

use super::error::H1Error;
use super::head::{
    check_transfer_encoding, collect_headers, diagnose, has_bare_lf, header_slots, list_members,
    parse_content_length, values_of, FieldOffsets, HeadLimits, Headers, Parsed, StartLine, Version,
    MAX_HEADERS_CEILING,
};
use crate::ascii::eq_lower;

/// How the body of a response is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseFraming {
    /// No body: a response to HEAD, or a 1xx (other than 101), 204 or 304 response.
    None,
    /// Exactly this many bytes follow the head.
    ContentLength(u64),
    /// The body uses the chunked transfer coding.
    Chunked,
    /// The body runs until the server closes the connection.
    CloseDelimited,
    /// The connection stops being HTTP after the head: a 2xx answer to CONNECT, or 101.
    Tunnel,
}

/// What a response head's start line and fields decide, without the fields themselves: what
/// [`parse_response_head_offsets`] returns, and the start of every [`ResponseHead`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseStart {
    version: Version,
    status: u16,
    framing: ResponseFraming,
    is_keep_alive: bool,
}

impl ResponseStart {
    /// The protocol version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The status code, within 100..=599.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// How the body is delimited.
    pub fn framing(&self) -> ResponseFraming {
        self.framing
    }

    /// Whether the connection may carry another request after this response's body.
    pub fn is_keep_alive(&self) -> bool {
        self.is_keep_alive
    }

    /// Whether this is an interim 1xx response other than 101: the caller discards it and
    /// parses the next head from `consumed_len` (RFC 9110 §15.2: "A client MUST be able to
    /// parse one or more 1xx responses received prior to a final response").
    pub fn is_informational(&self) -> bool {
        (100..200).contains(&self.status) && self.status != 101
    }

    /// Whether this is 101 (Switching Protocols): the connection now speaks another protocol.
    pub fn is_switching_protocols(&self) -> bool {
        self.status == 101
    }
}

/// A response head that passed every framing and syntax rule, borrowing from the buffer it was
/// parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead<'a> {
    start: ResponseStart,
    reason: &'a str,
    headers: Headers<'a>,
}

impl<'a> ResponseHead<'a> {
    /// The start line and what the fields decide.
    pub fn start(&self) -> ResponseStart {
        self.start
    }

    /// The protocol version.
    pub fn version(&self) -> Version {
        self.start.version
    }

    /// The status code, within 100..=599.
    pub fn status(&self) -> u16 {
        self.start.status
    }

    /// The reason phrase; empty when absent or when it held non-ASCII bytes (it carries no
    /// meaning, RFC 9112 §4: "A client SHOULD ignore the reason-phrase content").
    pub fn reason(&self) -> &'a str {
        self.reason
    }

    /// Every header field line in received order, duplicates kept.
    pub fn headers(&self) -> &Headers<'a> {
        &self.headers
    }

    /// How the body is delimited.
    pub fn framing(&self) -> ResponseFraming {
        self.start.framing
    }

    /// Whether the connection may carry another request after this response's body.
    pub fn is_keep_alive(&self) -> bool {
        self.start.is_keep_alive
    }

    /// See [`ResponseStart::is_informational`].
    pub fn is_informational(&self) -> bool {
        self.start.is_informational()
    }

    /// See [`ResponseStart::is_switching_protocols`].
    pub fn is_switching_protocols(&self) -> bool {
        self.start.is_switching_protocols()
    }
}

/// Parses a response head from the start of `buf`, given the method of the request it answers
/// (the framing of a response depends on it, RFC 9112 §6.3).
///
/// Returns [`Parsed::Partial`] while the head may still become valid with more bytes. On
/// success, `consumed_len` is where the body (or the next response) begins. Any error means
/// the upstream connection is unusable and must be closed.
pub fn parse_response_head<'a>(
    buf: &'a [u8],
    request_method: &str,
    limits: &HeadLimits,
) -> Result<Parsed<ResponseHead<'a>>, H1Error> {
    Ok(
        match parse_with(buf, request_method, limits, collect_headers)? {
            Parsed::Complete {
                head: (start, reason, headers),
                consumed_len,
            } => Parsed::Complete {
                head: ResponseHead {
                    start,
                    reason,
                    headers,
                },
                consumed_len,
            },
            Parsed::Partial => Parsed::Partial,
        },
    )
}

/// [`parse_response_head`] for a caller that keeps `buf` and reads the fields from it later:
/// the same rules and errors, the fields written to `fields` (cleared first; left empty unless
/// the head is complete) as where each lies in `buf` instead of collected as borrowed
/// [`Header`](super::Header)s. One vector of fields per head instead of two.
pub fn parse_response_head_offsets(
    buf: &[u8],
    request_method: &str,
    limits: &HeadLimits,
    fields: &mut Vec<FieldOffsets>,
) -> Result<Parsed<ResponseStart>, H1Error> {
    fields.clear();
    let parsed = parse_with(buf, request_method, limits, |view, parsed| {
        fields.reserve(parsed.len());
        for h in parsed {
            // httparse's fields lie in the buffer it parsed: never taken.
            fields.push(FieldOffsets::of(view, h).ok_or(H1Error::InvalidHeaderValue)?);
        }
        Ok(())
    });
    if !matches!(parsed, Ok(Parsed::Complete { .. })) {
        // A head refused after its fields were taken (its framing) leaves none behind.
        fields.clear();
    }
    Ok(match parsed? {
        Parsed::Complete {
            head: (start, _, ()),
            consumed_len,
        } => Parsed::Complete {
            head: start,
            consumed_len,
        },
        Parsed::Partial => Parsed::Partial,
    })
}

/// The parse both entry points share: the start line and framing are decided on the parser's
/// own fields, which `collect` turns into what the caller keeps.
fn parse_with<'a, T>(
    buf: &'a [u8],
    request_method: &str,
    limits: &HeadLimits,
    collect: impl FnOnce(&'a [u8], &[httparse::Header<'a>]) -> Result<T, H1Error>,
) -> Result<Parsed<(ResponseStart, &'a str, T)>, H1Error> {
    let view = buf.get(..limits.max_head_bytes).unwrap_or(buf);
    let mut slots = header_slots();
    let slots = slots
        .get_mut(..limits.max_headers.min(MAX_HEADERS_CEILING))
        .unwrap_or_default();
    let mut res = httparse::Response::new(&mut []);
    let config = httparse::ParserConfig::default();
    let head_len = match config.parse_response_with_uninit_headers(&mut res, view, slots) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => {
            if has_bare_lf(view) {
                return Err(H1Error::BareLf);
            }
            if buf.len() >= limits.max_head_bytes {
                return Err(H1Error::HeadTooLarge);
            }
            return Ok(Parsed::Partial);
        }
        Err(e) => return Err(diagnose(view, e, StartLine::Response)),
    };
    if has_bare_lf(view.get(..head_len).unwrap_or(view)) {
        return Err(H1Error::BareLf);
    }
    let version = Version::from_minor(res.version);
    let status = res.code.unwrap_or_default();
    // RFC 9110 §15: "Values outside the range 100..599 are invalid."
    if !(100..=599).contains(&status) {
        return Err(H1Error::InvalidStatus);
    }
    let reason = res.reason.unwrap_or_default();
    let parsed: &[httparse::Header<'a>] = res.headers;
    let collected = collect(view, parsed)?;
    let scan = FramingFields::scan(parsed);
    let (framing, overrides_length) =
        response_framing(parsed, &scan, version, status, request_method)?;

    let is_close = scan.lists_close;
    let is_keep_alive = match framing {
        // A close-delimited body ends only with the connection; a tunnel is not HTTP any more.
        ResponseFraming::CloseDelimited | ResponseFraming::Tunnel => false,
        // RFC 9112 §6.3: a message with both Transfer-Encoding and Content-Length "ought to be
        // handled as an error"; we read it by Transfer-Encoding but do not reuse the connection.
        _ if overrides_length => false,
        _ => match version {
            Version::Http11 => !is_close,
            Version::Http10 => !is_close && scan.lists_keep_alive,
        },
    };

    let start = ResponseStart {
        version,
        status,
        framing,
        is_keep_alive,
    };
    Ok(Parsed::Complete {
        head: (start, reason, collected),
        consumed_len: head_len,
    })
}

/// What one pass over a response's fields learns about its framing and its connection, so
/// that the rules below need not look for each field again.
struct FramingFields<'a> {
    /// How many `Content-Length` lines, and the first one's value.
    content_length_count: usize,
    content_length: Option<&'a [u8]>,
    has_transfer_encoding: bool,
    /// Whether the `Connection` fields list `close`, and `keep-alive`.
    lists_close: bool,
    lists_keep_alive: bool,
}

impl<'a> FramingFields<'a> {
    fn scan(headers: &[httparse::Header<'a>]) -> FramingFields<'a> {
        let mut f = FramingFields {
            content_length_count: 0,
            content_length: None,
            has_transfer_encoding: false,
            lists_close: false,
            lists_keep_alive: false,
        };
        for h in headers {
            // Comparing lengths first keeps the common case to one integer compare per field.
            let name = h.name.as_bytes();
            match name.len() {
                10 if eq_lower(name, b"connection") => {
                    for token in list_members(h.value) {
                        f.lists_close |= eq_lower(token, b"close");
                        f.lists_keep_alive |= eq_lower(token, b"keep-alive");
                    }
                }
                14 if eq_lower(name, b"content-length") => {
                    f.content_length_count += 1;
                    f.content_length.get_or_insert(h.value);
                }
                17 if eq_lower(name, b"transfer-encoding") => {
                    f.has_transfer_encoding = true;
                }
                _ => {}
            }
        }
        f
    }
}

/// Decides the framing and whether Transfer-Encoding overrode a Content-Length.
fn response_framing(
    headers: &[httparse::Header<'_>],
    fields: &FramingFields<'_>,
    version: Version,
    status: u16,
    request_method: &str,
) -> Result<(ResponseFraming, bool), H1Error> {
    if status == 101 {
        return Ok((ResponseFraming::Tunnel, false));
    }
    // RFC 9112 §6.3 rule 1: "Any response to a HEAD request and any response with a 1xx
    // (Informational), 204 (No Content), or 304 (Not Modified) status code is always terminated
    // by the first empty line after the header fields, regardless of the header fields present
    // in the message, and thus cannot contain a message body or trailer section."
    if request_method == "HEAD" || status < 200 || status == 204 || status == 304 {
        return Ok((ResponseFraming::None, false));
    }
    // Rule 2: "Any 2xx (Successful) response to a CONNECT request implies that the connection
    // will become a tunnel immediately after the empty line that concludes the header fields."
    if request_method == "CONNECT" && (200..300).contains(&status) {
        return Ok((ResponseFraming::Tunnel, false));
    }
    let has_content_length = fields.content_length_count > 0;
    if fields.has_transfer_encoding {
        // RFC 9112 §6.1: "A server or client that receives an HTTP/1.0 message containing a
        // Transfer-Encoding header field MUST treat the message as if the framing is faulty".
        if version == Version::Http10 {
            return Err(H1Error::TransferEncodingInHttp10);
        }
        // Rule 4 would read a response whose final coding is not chunked until close, but the
        // body would still carry a transfer coding we cannot remove before relaying it; we
        // accept `chunked` alone and reject the rest.
        check_transfer_encoding(values_of(headers, "transfer-encoding"))?;
        // Rule 3: "If a message is received with both a Transfer-Encoding and a Content-Length
        // header field, the Transfer-Encoding overrides the Content-Length."
        return Ok((ResponseFraming::Chunked, has_content_length));
    }
    match (fields.content_length_count, fields.content_length) {
        // The common case, one line: its value, read without looking for the field again.
        (1, Some(value)) => content_length_of(std::iter::once(value)),
        (0, _) => {
            // Rule 8: "Otherwise, this is a response message without a declared message body
            // length, so the message body length is determined by the number of octets
            // received prior to the server closing the connection."
            return Ok((ResponseFraming::CloseDelimited, false));
        }
        _ => content_length_of(values_of(headers, "content-length")),
    }
    .map(|n| (ResponseFraming::ContentLength(n), false))
}

/// RFC 9110 §8.6: "a recipient MAY either reject the message as invalid or replace the
/// duplicated field values with a single valid Content-Length field containing that decimal
/// value". Upstreams in the wild repeat identical values, so for responses we accept repeats
/// (lines or list members) that agree and reject any that differ or do not parse.
fn content_length_of<'a>(values: impl Iterator<Item = &'a [u8]>) -> Result<u64, H1Error> {
    // Each number read must be the one before it, if any.
    let agree = |length: &mut Option<u64>, n: u64| match *length {
        Some(prev) if prev != n => Err(H1Error::DuplicateContentLength),
        _ => {
            *length = Some(n);
            Ok(())
        }
    };
    let mut length = None;
    for value in values {
        // A value that is one number (the common case) is that number, without splitting it
        // into list members: a list of equal numbers, or anything invalid, is read below.
        if let Ok(n) = parse_content_length(value) {
            agree(&mut length, n)?;
            continue;
        }
        let mut any = false;
        for member in list_members(value) {
            any = true;
            agree(&mut length, parse_content_length(member)?)?;
        }
        if !any {
            return Err(H1Error::InvalidContentLength);
        }
    }
    length.ok_or(H1Error::InvalidContentLength)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: HeadLimits = HeadLimits::RESPONSE;

    fn parse<'a>(buf: &'a [u8], method: &str) -> Result<Parsed<ResponseHead<'a>>, H1Error> {
        parse_response_head(buf, method, &LIMITS)
    }

    fn complete<'a>(buf: &'a [u8], method: &str) -> (ResponseHead<'a>, usize) {
        match parse(buf, method) {
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

    #[test]
    fn framing_by_status_and_method() {
        type Row = (&'static str, &'static [u8], ResponseFraming, bool);
        let table: &[Row] = &[
            (
                "GET",
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
                ResponseFraming::ContentLength(5),
                true,
            ),
            (
                "GET",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                ResponseFraming::Chunked,
                true,
            ),
            (
                "GET",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n",
                ResponseFraming::Chunked,
                true,
            ),
            (
                "GET",
                b"HTTP/1.1 200 OK\r\n\r\n",
                ResponseFraming::CloseDelimited,
                false,
            ),
            (
                "GET",
                b"HTTP/1.0 200 OK\r\n\r\n",
                ResponseFraming::CloseDelimited,
                false,
            ),
            (
                "GET",
                b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n",
                ResponseFraming::ContentLength(1),
                false,
            ),
            (
                "GET",
                b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\nConnection: keep-alive\r\n\r\n",
                ResponseFraming::ContentLength(1),
                true,
            ),
            (
                "GET",
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: close\r\n\r\n",
                ResponseFraming::ContentLength(1),
                false,
            ),
            // Rule 1: no body regardless of framing fields.
            (
                "HEAD",
                b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n",
                ResponseFraming::None,
                true,
            ),
            (
                "HEAD",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                ResponseFraming::None,
                true,
            ),
            (
                "GET",
                b"HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n",
                ResponseFraming::None,
                true,
            ),
            (
                "GET",
                b"HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n",
                ResponseFraming::None,
                true,
            ),
            (
                "GET",
                b"HTTP/1.1 100 Continue\r\n\r\n",
                ResponseFraming::None,
                true,
            ),
            (
                "GET",
                b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n",
                ResponseFraming::None,
                true,
            ),
            // Rule 2 and 101: tunnels.
            (
                "CONNECT",
                b"HTTP/1.1 200 Connection Established\r\n\r\n",
                ResponseFraming::Tunnel,
                false,
            ),
            (
                "CONNECT",
                b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n",
                ResponseFraming::Tunnel,
                false,
            ),
            (
                "CONNECT",
                b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n",
                ResponseFraming::ContentLength(0),
                true,
            ),
            (
                "GET",
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
                ResponseFraming::Tunnel,
                false,
            ),
            // Rule 3: Transfer-Encoding overrides Content-Length, and the connection is not reused.
            (
                "GET",
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
                ResponseFraming::Chunked,
                false,
            ),
            // Identical repeats are accepted in responses.
            (
                "GET",
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
                ResponseFraming::ContentLength(5),
                true,
            ),
            (
                "GET",
                b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n",
                ResponseFraming::ContentLength(5),
                true,
            ),
            (
                "GET",
                b"HTTP/1.1 200 OK\r\nContent-Length: 5,\r\n\r\n",
                ResponseFraming::ContentLength(5),
                true,
            ),
        ];
        for (method, input, framing, keep_alive) in table {
            let (head, consumed) = complete(input, method);
            assert_eq!(consumed, input.len(), "{:?}", show(input));
            assert_eq!(head.framing(), *framing, "{method} {:?}", show(input));
            assert_eq!(
                head.is_keep_alive(),
                *keep_alive,
                "{method} {:?}",
                show(input)
            );
        }
    }

    #[test]
    fn rejections() {
        let table: &[(&str, &[u8], H1Error)] = &[
            (
                "bare LF",
                b"HTTP/1.1 200 OK\nContent-Length: 0\n\n",
                H1Error::BareLf,
            ),
            (
                "bare LF at end",
                b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\n",
                H1Error::BareLf,
            ),
            ("bare CR", b"HTTP/1.1 200 OK\rX: a\r\n\r\n", H1Error::BareCr),
            (
                "obs-fold",
                b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n",
                H1Error::ObsFold,
            ),
            (
                "space before colon",
                b"HTTP/1.1 200 OK\r\nX : a\r\n\r\n",
                H1Error::WhitespaceBeforeColon,
            ),
            (
                "bad name",
                b"HTTP/1.1 200 OK\r\nX(: a\r\n\r\n",
                H1Error::InvalidHeaderName,
            ),
            (
                "NUL in value",
                b"HTTP/1.1 200 OK\r\nX: a\0\r\n\r\n",
                H1Error::InvalidHeaderValue,
            ),
            (
                "HTTP/2",
                b"HTTP/2.0 200 OK\r\n\r\n",
                H1Error::UnsupportedVersion,
            ),
            (
                "garbage version",
                b"HTPT/1.1 200 OK\r\n\r\n",
                H1Error::InvalidVersion,
            ),
            (
                "two digit status",
                b"HTTP/1.1 20 OK\r\n\r\n",
                H1Error::InvalidStatus,
            ),
            (
                "four digit status",
                b"HTTP/1.1 2000 OK\r\n\r\n",
                H1Error::InvalidStatus,
            ),
            (
                "status letters",
                b"HTTP/1.1 2x0 OK\r\n\r\n",
                H1Error::InvalidStatus,
            ),
            (
                "status 099",
                b"HTTP/1.1 099 Low\r\n\r\n",
                H1Error::InvalidStatus,
            ),
            (
                "status 600",
                b"HTTP/1.1 600 High\r\n\r\n",
                H1Error::InvalidStatus,
            ),
            (
                "control in reason",
                b"HTTP/1.1 200 O\x01K\r\n\r\n",
                H1Error::InvalidStatus,
            ),
            (
                "CL differing lines",
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
                H1Error::DuplicateContentLength,
            ),
            (
                "CL differing list",
                b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n",
                H1Error::DuplicateContentLength,
            ),
            (
                "CL invalid",
                b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n",
                H1Error::InvalidContentLength,
            ),
            (
                "CL empty",
                b"HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\n",
                H1Error::InvalidContentLength,
            ),
            (
                "CL second invalid",
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: -5\r\n\r\n",
                H1Error::InvalidContentLength,
            ),
            (
                "CL overflow",
                b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
                H1Error::InvalidContentLength,
            ),
            (
                "TE gzip",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
                H1Error::InvalidTransferEncoding,
            ),
            (
                "TE gzip chunked",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                H1Error::UnsupportedTransferCoding,
            ),
            (
                "TE in 1.0",
                b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                H1Error::TransferEncodingInHttp10,
            ),
        ];
        for (name, input, want) in table {
            assert_eq!(parse(input, "GET"), Err(*want), "{name}: {:?}", show(input));
        }
    }

    #[test]
    fn status_line_forms() {
        let table: &[(&[u8], u16, &str)] = &[
            (b"HTTP/1.1 200 OK\r\n\r\n", 200, "OK"),
            (b"HTTP/1.1 200 \r\n\r\n", 200, ""),
            (b"HTTP/1.1 200\r\n\r\n", 200, ""),
            (
                b"HTTP/1.1 404 Not\tFound here\r\n\r\n",
                404,
                "Not\tFound here",
            ),
            (b"HTTP/1.1 200 caf\xe9\r\n\r\n", 200, ""),
            (b"HTTP/1.1 599 Whatever\r\n\r\n", 599, "Whatever"),
            (b"\r\nHTTP/1.1 200 OK\r\n\r\n", 200, "OK"),
        ];
        for (input, status, reason) in table {
            let (head, consumed) = complete(input, "GET");
            assert_eq!(consumed, input.len());
            assert_eq!(head.status(), *status, "{:?}", show(input));
            assert_eq!(head.reason(), *reason, "{:?}", show(input));
        }
    }

    #[test]
    fn informational_responses_are_skipped_by_consumed_len() {
        let buf = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </s>\r\n\r\n\
            HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok";
        let mut at = 0;
        let mut statuses = Vec::new();
        loop {
            let (head, consumed) = complete(&buf[at..], "POST");
            at += consumed;
            statuses.push(head.status());
            if !head.is_informational() {
                assert_eq!(head.framing(), ResponseFraming::ContentLength(2));
                break;
            }
            assert_eq!(head.framing(), ResponseFraming::None);
        }
        assert_eq!(statuses, [100, 103, 201]);
        assert_eq!(&buf[at..], b"ok");
    }

    #[test]
    fn informational_classification() {
        let (head, _) = complete(b"HTTP/1.1 101 Switching Protocols\r\n\r\n", "GET");
        assert!(!head.is_informational());
        assert!(head.is_switching_protocols());
        let (head, _) = complete(b"HTTP/1.1 100 Continue\r\n\r\n", "GET");
        assert!(head.is_informational());
        assert!(!head.is_switching_protocols());
        let (head, _) = complete(b"HTTP/1.1 200 OK\r\n\r\n", "GET");
        assert!(!head.is_informational());
    }

    #[test]
    fn raw_names_values_and_duplicates() {
        let input =
            b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nset-cookie: b=2\r\nX-Raw:  caf\xc3\xa9 \r\n\
            Content-Length: 0\r\n\r\n";
        let (head, _) = complete(input, "GET");
        let pairs: Vec<(&[u8], &[u8])> = head
            .headers()
            .iter()
            .map(|h| (h.name().as_bytes(), h.value()))
            .collect();
        assert_eq!(
            pairs,
            vec![
                (&b"Set-Cookie"[..], &b"a=1"[..]),
                (b"set-cookie", b"b=2"),
                (b"X-Raw", "café".as_bytes()),
                (b"Content-Length", b"0"),
            ]
        );
        assert_eq!(head.version(), Version::Http11);
    }

    #[test]
    fn every_split_point_is_partial_then_complete() {
        let input = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX:\tv\r\n\r\n";
        for cut in 0..input.len() {
            assert_eq!(
                parse(&input[..cut], "GET"),
                Ok(Parsed::Partial),
                "cut at {cut}"
            );
        }
        assert_eq!(complete(input, "GET").0.framing(), ResponseFraming::Chunked);
    }

    #[test]
    fn limits() {
        let limits = HeadLimits {
            max_head_bytes: 40,
            max_headers: 1,
            ..HeadLimits::RESPONSE
        };
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        assert!(ok.len() <= 40);
        assert!(matches!(
            parse_response_head(ok, "GET", &limits),
            Ok(Parsed::Complete { .. })
        ));
        let two = b"HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\n\r\n";
        assert_eq!(
            parse_response_head(two, "GET", &limits),
            Err(H1Error::TooManyHeaders)
        );
        let long = b"HTTP/1.1 200 OK\r\nContent-Length: 000000000000000000000";
        assert_eq!(
            parse_response_head(long, "GET", &limits),
            Err(H1Error::HeadTooLarge)
        );
        assert_eq!(LIMITS.max_head_bytes, 64 * 1024);
    }

    /// A client keeps the head's buffer and slices each field from it by the offsets the
    /// codec gives: they point at the same bytes as the borrowed name and value, within the
    /// head, after interim responses and obs-text too.
    #[test]
    fn field_ranges_point_into_the_parsed_buffer() {
        let buf: &[u8] = b"HTTP/1.1 200 OK\r\nA: 1\r\nLong-Name:   padded value \t\r\n\
            X-Empty:\r\nX-Obs: \xe9t\xe9\r\nContent-Length: 3\r\n\r\nabc";
        let (head, consumed) = complete(buf, "GET");
        assert_eq!(head.headers().len(), 5);
        for h in head.headers() {
            let (n, v) = (h.name_range(), h.value_range());
            assert!(n.end <= consumed && v.end <= consumed);
            assert_eq!(&buf[n], h.name().as_bytes());
            assert_eq!(&buf[v], h.value());
        }
        let first = head.headers().iter().next().unwrap();
        assert_eq!((first.name_range(), first.value_range()), (17..18, 20..21));
    }

    /// The offsets entry point applies the same rules as the collecting one: the same result
    /// or error for every head, and each field's offsets are the collected field's ranges.
    #[test]
    fn offsets_agree_with_collected_fields() {
        let heads: &[(&[u8], &str)] = &[
            (
                b"HTTP/1.1 200 OK\r\nA: 1\r\nContent-Length: 3\r\n\r\nabc",
                "GET",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                "GET",
            ),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "GET"),
            (
                b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
                "GET",
            ),
            (
                b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
                "GET",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                "GET",
            ),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n", "GET"),
            (
                b"HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n",
                "GET",
            ),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", "HEAD"),
            (b"HTTP/1.1 200 Connection established\r\n\r\n", "CONNECT"),
            (
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n",
                "GET",
            ),
            (
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
                "GET",
            ),
            (
                b"HTTP/1.1 200 OK\r\nX-Obs: \xe9\r\nContent-Length: 0\r\n\r\n",
                "GET",
            ),
            (b"HTTP/1.1 200 OK\r\nA: 1\r\n", "GET"),
            (b"HTTP/1.1 200 OK\nA: 1\r\n\r\n", "GET"),
            (b"HTTP/1.1 999 Nope\r\n\r\n", "GET"),
            (b"HTTP/1.1 200 OK\r\nBad Name: 1\r\n\r\n", "GET"),
        ];
        let mut fields = vec![FieldOffsets {
            name: (9, 9),
            value: (9, 9),
        }];
        for &(buf, method) in heads {
            let collected = parse_response_head(buf, method, &LIMITS);
            let offsets = parse_response_head_offsets(buf, method, &LIMITS, &mut fields);
            // Cleared first: nothing of the head before stays behind a partial or failed one.
            if !matches!(offsets, Ok(Parsed::Complete { .. })) {
                assert!(fields.is_empty(), "{}", show(buf));
            }
            match (collected, offsets) {
                (
                    Ok(Parsed::Complete {
                        head,
                        consumed_len: a,
                    }),
                    Ok(Parsed::Complete {
                        head: start,
                        consumed_len: b,
                    }),
                ) => {
                    assert_eq!((head.start(), a), (start, b), "{}", show(buf));
                    let ranges: Vec<_> = head
                        .headers()
                        .iter()
                        .map(|h| (h.name_range(), h.value_range()))
                        .collect();
                    let given: Vec<_> = fields
                        .iter()
                        .map(|f| {
                            let r = |(s, e): (u32, u32)| s as usize..e as usize;
                            (r(f.name), r(f.value))
                        })
                        .collect();
                    assert_eq!(ranges, given, "{}", show(buf));
                }
                (Ok(Parsed::Partial), Ok(Parsed::Partial)) => {}
                (Err(a), Err(b)) => assert_eq!(a, b, "{}", show(buf)),
                (a, b) => panic!("{}: {a:?} against {b:?}", show(buf)),
            }
        }
    }
}
