//! Recognising one complete HTTP/1.1 response at the start of a buffer.
//!
//! The bytes come from the server under test, so nothing here may panic on them: every slice is
//! taken with `get` and every length is checked before it is added.

use std::borrow::Cow;
use std::fmt;

/// The largest response head or body accepted; the targets answer a few hundred bytes, so
/// anything larger is a broken server rather than a response worth waiting for.
pub(crate) const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// Hex digits accepted in a chunk size. Eight digits already exceed `MAX_RESPONSE_BYTES`, so
/// a longer size is too large without being converted (and cannot overflow).
const MAX_CHUNK_SIZE_DIGITS: usize = 8;

/// One complete response found at the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Response<'a> {
    /// The three-digit status code.
    pub(crate) status: u16,
    /// The body: borrowed from the buffer, or joined from its chunks.
    pub(crate) body: Cow<'a, [u8]>,
    /// How many bytes of the buffer the response occupies.
    pub(crate) consumed: usize,
    /// Whether the server will close the connection after this response (HTTP/1.0 without
    /// keep-alive, or `Connection: close`).
    pub(crate) wants_close: bool,
}

/// A response this client cannot parse or does not accept. The `Display` text is the error
/// kind counted in the report.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ResponseError {
    /// No end of the head within `MAX_RESPONSE_BYTES`.
    HeadTooLarge,
    /// The status line is not `HTTP/1.x NNN ...`; holds its first bytes, escaped.
    BadStatusLine(String),
    /// A Content-Length that is not a number, or two that disagree.
    BadContentLength,
    /// A body whose end only the connection's close would mark.
    NoLength,
    /// A Content-Length above `MAX_RESPONSE_BYTES`.
    BodyTooLarge,
    /// A chunk size that is not hexadecimal.
    BadChunkSize,
    /// Chunk data not followed by CRLF.
    BadChunkEnd,
    /// Chunks adding up to more than `MAX_RESPONSE_BYTES`.
    ChunkedBodyTooLarge,
}

impl fmt::Display for ResponseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::HeadTooLarge => f.write_str("response head too large"),
            Self::BadStatusLine(line) => write!(f, "bad status line {line}"),
            Self::BadContentLength => f.write_str("bad content-length"),
            Self::NoLength => f.write_str("response without content-length or chunked encoding"),
            Self::BodyTooLarge => f.write_str("response body too large"),
            Self::BadChunkSize => f.write_str("bad chunk size"),
            Self::BadChunkEnd => f.write_str("chunk data without its CRLF"),
            Self::ChunkedBodyTooLarge => f.write_str("chunked body too large"),
        }
    }
}

/// How much of the status line an error message quotes.
const QUOTED_STATUS_LINE_BYTES: usize = 80;

/// Parses one response at the start of `buf`. `Ok(None)` means more bytes are needed.
/// `is_head` says the request was HEAD, whose response has no body whatever its headers say.
pub(crate) fn parse(buf: &[u8], is_head: bool) -> Result<Option<Response<'_>>, ResponseError> {
    let Some(head_end) = find(buf, b"\r\n\r\n", 0) else {
        if buf.len() > MAX_RESPONSE_BYTES {
            return Err(ResponseError::HeadTooLarge);
        }
        return Ok(None);
    };
    let head = buf.get(..head_end).unwrap_or_default();
    let mut lines = split_crlf(head);
    let status_line = lines.next().unwrap_or_default();
    let (is_http10, status) = parse_status_line(status_line).ok_or_else(|| {
        let quoted = status_line
            .get(..QUOTED_STATUS_LINE_BYTES)
            .unwrap_or(status_line);
        ResponseError::BadStatusLine(quoted.escape_ascii().to_string())
    })?;

    let mut length: Option<usize> = None;
    let mut is_chunked = false;
    // RFC 9112 §9.3: an HTTP/1.0 server closes after the response unless it says keep-alive.
    let mut wants_close = is_http10;
    for line in lines {
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let (name, colon_and_value) = line.split_at(colon);
                (name, colon_and_value.get(1..).unwrap_or_default())
            }
            None => (line, &[][..]),
        };
        let name = name.trim_ascii();
        let value = value.trim_ascii();
        if name.eq_ignore_ascii_case(b"content-length") {
            let parsed = parse_content_length(value)?;
            // RFC 9112 §6.3: differing Content-Length values make the framing unknowable.
            if length.is_some_and(|earlier| earlier != parsed) {
                return Err(ResponseError::BadContentLength);
            }
            length = Some(parsed);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // RFC 9112 §6.1: the body is chunked when chunked is the last coding applied.
            is_chunked = ends_with_ignore_case(value, b"chunked");
        } else if name.eq_ignore_ascii_case(b"connection") {
            wants_close = contains_ignore_case(value, b"close");
        }
    }

    let start = head_end + 4;
    // RFC 9112 §6.3: responses to HEAD, 204 and 304 end with their head.
    if is_head || status == 204 || status == 304 {
        return Ok(Some(Response {
            status,
            body: Cow::Borrowed(&[]),
            consumed: start,
            wants_close,
        }));
    }
    // RFC 9112 §6.3: Transfer-Encoding overrides Content-Length.
    if is_chunked {
        return parse_chunked(buf, start, status, wants_close);
    }
    // Without a length the body runs to the end of the connection, which a keep-alive load
    // cannot use.
    let length = length.ok_or(ResponseError::NoLength)?;
    if length > MAX_RESPONSE_BYTES {
        return Err(ResponseError::BodyTooLarge);
    }
    let end = start + length;
    Ok(buf.get(start..end).map(|body| Response {
        status,
        body: Cow::Borrowed(body),
        consumed: end,
        wants_close,
    }))
}

/// Reads `HTTP/1.x NNN reason` into (is HTTP/1.0, status).
fn parse_status_line(line: &[u8]) -> Option<(bool, u16)> {
    let mut parts = line.splitn(3, |&b| b == b' ');
    let version = parts.next()?;
    let code = parts.next()?;
    if !version.starts_with(b"HTTP/1.") {
        return None;
    }
    // RFC 9112 §4: status-code = 3DIGIT.
    if code.len() != 3 || !code.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let status = code
        .iter()
        .fold(0u16, |acc, &d| acc * 10 + u16::from(d - b'0'));
    Some((version == b"HTTP/1.0", status))
}

/// A Content-Length value; values with too many digits to convert are simply too large.
fn parse_content_length(value: &[u8]) -> Result<usize, ResponseError> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return Err(ResponseError::BadContentLength);
    }
    value
        .iter()
        .try_fold(0usize, |acc, &d| {
            acc.checked_mul(10)?.checked_add(usize::from(d - b'0'))
        })
        .ok_or(ResponseError::BodyTooLarge)
}

/// Parses a chunked body that starts at `pos` (RFC 9112 §7.1), joining its chunks.
fn parse_chunked(
    buf: &[u8],
    mut pos: usize,
    status: u16,
    wants_close: bool,
) -> Result<Option<Response<'_>>, ResponseError> {
    let mut body = Vec::new();
    loop {
        let Some(line_end) = find(buf, b"\r\n", pos) else {
            return Ok(None);
        };
        let line = buf.get(pos..line_end).unwrap_or_default();
        // RFC 9112 §7.1.1: chunk extensions follow a semicolon and are ignored here.
        let size_text = line
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        let size = parse_chunk_size(size_text)?;
        if size > MAX_RESPONSE_BYTES - body.len() {
            return Err(ResponseError::ChunkedBodyTooLarge);
        }
        pos = line_end + 2;
        if size == 0 {
            // RFC 9112 §7.1.2: the trailer section runs to an empty line.
            loop {
                let Some(line_end) = find(buf, b"\r\n", pos) else {
                    return Ok(None);
                };
                if line_end == pos {
                    return Ok(Some(Response {
                        status,
                        body: Cow::Owned(body),
                        consumed: line_end + 2,
                        wants_close,
                    }));
                }
                pos = line_end + 2;
            }
        }
        let data_end = pos + size;
        let Some(data_and_crlf) = buf.get(pos..data_end + 2) else {
            return Ok(None);
        };
        let (data, crlf) = data_and_crlf.split_at(size);
        if crlf != b"\r\n" {
            return Err(ResponseError::BadChunkEnd);
        }
        body.extend_from_slice(data);
        pos = data_end + 2;
    }
}

/// A chunk size in hexadecimal; a size with more digits than any acceptable body is too large.
fn parse_chunk_size(text: &[u8]) -> Result<usize, ResponseError> {
    if text.is_empty() || !text.iter().all(u8::is_ascii_hexdigit) {
        return Err(ResponseError::BadChunkSize);
    }
    if text.len() > MAX_CHUNK_SIZE_DIGITS {
        return Err(ResponseError::ChunkedBodyTooLarge);
    }
    let size = text.iter().fold(0usize, |acc, &d| {
        let digit = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            _ => d - b'A' + 10,
        };
        acc * 16 + usize::from(digit)
    });
    Ok(size)
}

/// Position of the first `needle` in `haystack` at or after `from`.
fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    haystack
        .get(from..)?
        .windows(needle.len())
        .position(|window| window == needle)
        .map(|at| at + from)
}

/// The CRLF-separated lines of a head (without the final empty line).
fn split_crlf(head: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(head);
    std::iter::from_fn(move || {
        let text = rest?;
        match find(text, b"\r\n", 0) {
            Some(at) => {
                rest = text.get(at + 2..);
                text.get(..at)
            }
            None => rest.take(),
        }
    })
}

fn ends_with_ignore_case(value: &[u8], suffix: &[u8]) -> bool {
    value
        .len()
        .checked_sub(suffix.len())
        .and_then(|start| value.get(start..))
        .is_some_and(|tail| tail.eq_ignore_ascii_case(suffix))
}

fn contains_ignore_case(value: &[u8], needle: &[u8]) -> bool {
    value
        .windows(needle.len())
        .any(|window| window.eq_ignore_ascii_case(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A complete response: (status, body, wants_close).
    type Complete<'a> = (u16, &'a [u8], bool);

    /// The parsed response, which must take up the whole input.
    fn complete(input: &[u8], is_head: bool) -> Option<(u16, Vec<u8>, bool)> {
        let response = parse(input, is_head).ok()??;
        assert_eq!(
            response.consumed,
            input.len(),
            "consumed of {:?}",
            input.escape_ascii()
        );
        Some((
            response.status,
            response.body.into_owned(),
            response.wants_close,
        ))
    }

    #[test]
    fn complete_responses() {
        let cases: &[(&[u8], bool, Complete)] = &[
            (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", false, (200, b"hi", false)),
            (b"HTTP/1.1 404 Not Found\r\ncontent-length:0\r\n\r\n", false, (404, b"", false)),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx",
                false,
                (200, b"x", true),
            ),
            (b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", false, (200, b"x", true)),
            (
                b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\nConnection: keep-alive\r\n\r\nx",
                false,
                (200, b"x", false),
            ),
            (
                b"HTTP/1.1 200\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
                false,
                (200, b"abc", false),
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
                  3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
                false,
                (200, b"abcde", false),
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\nContent-Length: 99\r\n\r\n\
                  0\r\nT: v\r\n\r\n",
                false,
                (200, b"", false),
            ),
            (b"HTTP/1.1 204 No Content\r\n\r\n", false, (204, b"", false)),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true, (200, b"", false)),
        ];
        for (input, is_head, expected) in cases {
            let (status, body, wants_close) = *expected;
            assert_eq!(
                complete(input, *is_head),
                Some((status, body.to_vec(), wants_close)),
                "{:?}",
                input.escape_ascii()
            );
        }
    }

    #[test]
    fn incomplete_responses_ask_for_more() {
        let cases: &[&[u8]] = &[
            b"",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nh",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nTrailer: x\r\n",
        ];
        for input in cases {
            assert_eq!(parse(input, false), Ok(None), "{:?}", input.escape_ascii());
        }
    }

    #[test]
    fn a_second_response_is_left_unconsumed() {
        let input = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxHTTP/1.1 200 OK\r\n";
        let response = parse(input, false).ok().flatten().map(|r| r.consumed);
        assert_eq!(response, Some(39));
    }

    #[test]
    fn rejected_responses() {
        let huge_length = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", 1 << 21);
        let many_digits = "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n";
        let cases: &[(&[u8], ResponseError)] = &[
            (
                b"HTTP/2 200 OK\r\n\r\n",
                ResponseError::BadStatusLine("HTTP/2 200 OK".into()),
            ),
            (
                b"HTTP/1.1 20x OK\r\n\r\n",
                ResponseError::BadStatusLine("HTTP/1.1 20x OK".into()),
            ),
            (
                b"HTTP/1.1 2000\r\n\r\n",
                ResponseError::BadStatusLine("HTTP/1.1 2000".into()),
            ),
            (
                b"HTTP/1.1\r\n\r\n",
                ResponseError::BadStatusLine("HTTP/1.1".into()),
            ),
            (
                b"\xff\r\n\r\n",
                ResponseError::BadStatusLine("\\xff".into()),
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
                ResponseError::BadContentLength,
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\n",
                ResponseError::BadContentLength,
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                ResponseError::BadContentLength,
            ),
            (
                b"HTTP/1.1 200 OK\r\nServer: x\r\n\r\n",
                ResponseError::NoLength,
            ),
            (huge_length.as_bytes(), ResponseError::BodyTooLarge),
            (many_digits.as_bytes(), ResponseError::BodyTooLarge),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                ResponseError::BadChunkSize,
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\n",
                ResponseError::BadChunkSize,
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x1\r\n",
                ResponseError::BadChunkSize,
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n",
                ResponseError::BadChunkEnd,
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n100001\r\n",
                ResponseError::ChunkedBodyTooLarge,
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\n",
                ResponseError::ChunkedBodyTooLarge,
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(
                parse(input, false).as_ref().err(),
                Some(expected),
                "{:?}",
                input.escape_ascii()
            );
        }
    }

    #[test]
    fn a_head_without_end_is_bounded() {
        let mut input = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
        input.resize(MAX_RESPONSE_BYTES + 1, b'a');
        assert_eq!(parse(&input, false), Err(ResponseError::HeadTooLarge));
    }

    #[test]
    fn chunks_adding_up_past_the_limit_are_rejected() {
        let mut input = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n80000\r\n".to_vec();
        input.resize(input.len() + 0x80000, b'a');
        input.extend_from_slice(b"\r\n80001\r\n");
        assert_eq!(
            parse(&input, false),
            Err(ResponseError::ChunkedBodyTooLarge)
        );
    }
}
