//! What request and response heads share: versions, limits, header fields, field-value lists,
//! the framing fields (Content-Length, Transfer-Encoding) and the diagnosis of malformed lines.
//!
//! On the per-request path: no allocation beyond the header vector, no logging.

use std::mem::MaybeUninit;

use super::error::H1Error;

/// Default byte limit of a request head (request line, fields, final CRLF). Beyond it the
/// server answers 431.
pub const DEFAULT_MAX_REQUEST_HEAD_BYTES: usize = 16 * 1024;
/// Default byte limit of an upstream response head. Upstreams send more and longer fields
/// (cookies, CSPs) than our clients do, so the limit is larger than for requests.
pub const DEFAULT_MAX_RESPONSE_HEAD_BYTES: usize = 64 * 1024;
/// Default number of header fields in a head. Beyond it the server answers 431.
pub const DEFAULT_MAX_HEADERS: usize = 100;
/// Default byte limit of a request-target; beyond it the server answers 414. It equals the
/// URL limit of the request envelope so that both ingresses accept the same URLs.
pub const DEFAULT_MAX_TARGET_BYTES: usize = crate::limits::MAX_URL_BYTES;
/// Hard ceiling on [`HeadLimits::max_headers`]: the parser keeps its field slots on the stack.
pub const MAX_HEADERS_CEILING: usize = 256;

/// Limits applied while parsing a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadLimits {
    /// Bytes from the first byte of the start line to the end of the empty line.
    pub max_head_bytes: usize,
    /// Header field lines; values above [`MAX_HEADERS_CEILING`] act as the ceiling.
    pub max_headers: usize,
    /// Bytes of the request-target (ignored for responses).
    pub max_target_bytes: usize,
}

impl HeadLimits {
    /// The defaults for requests received by the server.
    pub const REQUEST: HeadLimits = HeadLimits {
        max_head_bytes: DEFAULT_MAX_REQUEST_HEAD_BYTES,
        max_headers: DEFAULT_MAX_HEADERS,
        max_target_bytes: DEFAULT_MAX_TARGET_BYTES,
    };

    /// The defaults for responses received from upstreams.
    pub const RESPONSE: HeadLimits = HeadLimits {
        max_head_bytes: DEFAULT_MAX_RESPONSE_HEAD_BYTES,
        max_headers: DEFAULT_MAX_HEADERS,
        max_target_bytes: DEFAULT_MAX_TARGET_BYTES,
    };
}

impl Default for HeadLimits {
    fn default() -> Self {
        HeadLimits::REQUEST
    }
}

/// The outcome of parsing a head from the start of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed<T> {
    /// The head is complete and valid.
    Complete {
        /// The parsed head, borrowing from the buffer.
        head: T,
        /// Bytes of the buffer the head occupies; the body (or the next message) starts here.
        consumed_len: usize,
    },
    /// The buffer holds the beginning of a head that may still become valid: read more bytes
    /// and parse again from the start.
    Partial,
}

/// The HTTP version of a message. Only 1.0 and 1.1 are accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// HTTP/1.0.
    Http10,
    /// HTTP/1.1.
    Http11,
}

impl Version {
    /// The version as it appears on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            Version::Http10 => "HTTP/1.0",
            Version::Http11 => "HTTP/1.1",
        }
    }

    pub(super) fn from_minor(minor: Option<u8>) -> Version {
        // httparse only reports minor 0 or 1 on success; anything else cannot happen, and
        // treating it as 1.1 keeps this total without a panic path.
        if minor == Some(0) {
            Version::Http10
        } else {
            Version::Http11
        }
    }
}

/// One header field line, borrowed from the parsed buffer. The name is the raw bytes as sent
/// (case preserved); the value has surrounding whitespace removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<'a> {
    name: &'a str,
    value: &'a [u8],
    /// Where `name` starts in the buffer the head was parsed from.
    name_at: usize,
    /// Where `value` starts in that buffer.
    value_at: usize,
}

impl<'a> Header<'a> {
    /// Where the name lies in the buffer passed to the parser: `&buf[h.name_range()]` is
    /// [`Header::name`]. A caller that keeps the buffer (for example frozen into a shared
    /// `Bytes`) slices the fields from it by these offsets.
    pub fn name_range(&self) -> std::ops::Range<usize> {
        self.name_at..self.name_at + self.name.len()
    }

    /// Where the value lies in the buffer passed to the parser: `&buf[h.value_range()]` is
    /// [`Header::value`].
    pub fn value_range(&self) -> std::ops::Range<usize> {
        self.value_at..self.value_at + self.value.len()
    }

    /// The field name as sent; it is a `token`, hence ASCII.
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// The field value without leading and trailing whitespace; it may hold obs-text bytes.
    pub fn value(&self) -> &'a [u8] {
        self.value
    }

    /// Whether the field name equals `name`, ignoring ASCII case.
    pub fn is_named(&self, name: &str) -> bool {
        self.name.eq_ignore_ascii_case(name)
    }
}

/// The header fields of a head in the order they were received, duplicates kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers<'a> {
    fields: Vec<Header<'a>>,
}

impl<'a> Headers<'a> {
    /// Number of field lines.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// Whether there are no field lines.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// All field lines in received order.
    pub fn iter(&self) -> std::slice::Iter<'_, Header<'a>> {
        self.fields.iter()
    }

    /// The value of the first field named `name` (ASCII case-insensitive).
    pub fn value(&self, name: &str) -> Option<&'a [u8]> {
        self.fields
            .iter()
            .find(|h| h.is_named(name))
            .map(|h| h.value)
    }

    /// The values of every field named `name`, in received order.
    pub fn values<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'a [u8]> + 's {
        self.fields
            .iter()
            .filter(move |h| h.is_named(name))
            .map(|h| h.value)
    }

    /// Whether a field named `name` is present.
    pub fn contains(&self, name: &str) -> bool {
        self.fields.iter().any(|h| h.is_named(name))
    }

    /// The members of the comma-separated lists in every field named `name`, trimmed, with
    /// empty members skipped (RFC 9110 §5.6.1.2: "a recipient MUST parse and ignore a
    /// reasonable number of empty list elements").
    pub fn list_members<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'a [u8]> + 's {
        self.values(name).flat_map(list_members)
    }

    /// Whether any list member of the fields named `name` equals `token`, ignoring ASCII case
    /// (for example `Connection: close`).
    pub fn has_token(&self, name: &str, token: &str) -> bool {
        self.list_members(name)
            .any(|m| m.eq_ignore_ascii_case(token.as_bytes()))
    }
}

impl<'s, 'a> IntoIterator for &'s Headers<'a> {
    type Item = &'s Header<'a>;
    type IntoIter = std::slice::Iter<'s, Header<'a>>;

    fn into_iter(self) -> Self::IntoIter {
        self.fields.iter()
    }
}

/// Stack slots for httparse: uninitialised, so a large ceiling costs nothing per parse.
pub(super) type HeaderSlots<'a> = [MaybeUninit<httparse::Header<'a>>; MAX_HEADERS_CEILING];

pub(super) fn header_slots<'a>() -> HeaderSlots<'a> {
    [const { MaybeUninit::uninit() }; MAX_HEADERS_CEILING]
}

/// Collects the fields httparse found in `base`, with their offsets in it.
///
/// httparse hands out sub-slices of the buffer it parsed, so every offset is found; one that
/// is not (a parser that copied) fails the head instead of yielding a wrong range.
pub(super) fn collect_headers<'a>(
    base: &[u8],
    parsed: &[httparse::Header<'a>],
) -> Result<Headers<'a>, H1Error> {
    let mut fields = Vec::with_capacity(parsed.len());
    for h in parsed {
        let name_at = offset_in(base, h.name.as_bytes()).ok_or(H1Error::InvalidHeaderName)?;
        let value_at = offset_in(base, h.value).ok_or(H1Error::InvalidHeaderValue)?;
        fields.push(Header {
            name: h.name,
            value: h.value,
            name_at,
            value_at,
        });
    }
    Ok(Headers { fields })
}

/// Where one header field lies in the buffer its head was parsed from: the byte ranges of its
/// name and its value, each as `(start, end)`. What [`super::parse_response_head_offsets`]
/// gives instead of borrowed [`Header`]s, for a caller that keeps the buffer and reads the
/// fields from it later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldOffsets {
    pub name: (u32, u32),
    pub value: (u32, u32),
}

impl FieldOffsets {
    /// The offsets of `h` in `base`, the buffer httparse parsed it from; `None` when it does
    /// not lie there or `base` is not addressable in 32 bits.
    pub(super) fn of(base: &[u8], h: &httparse::Header<'_>) -> Option<FieldOffsets> {
        let range = |part: &[u8]| -> Option<(u32, u32)> {
            let start = offset_in(base, part)?;
            Some((
                u32::try_from(start).ok()?,
                u32::try_from(start + part.len()).ok()?,
            ))
        };
        Some(FieldOffsets {
            name: range(h.name.as_bytes())?,
            value: range(h.value)?,
        })
    }

    /// Whether the name and the value both lie within `0..len`, neither reversed: what a
    /// holder of a buffer and its fields' offsets checks once, when it is made.
    #[inline]
    pub fn is_within(&self, len: usize) -> bool {
        let is_within = |(start, end): (u32, u32)| start <= end && end as usize <= len;
        is_within(self.name) && is_within(self.value)
    }

    /// The name and the value in `buf`. For offsets checked against `buf`
    /// ([`FieldOffsets::is_within`]); a range outside it reads as empty.
    #[inline]
    pub fn read<'b>(&self, buf: &'b [u8]) -> (&'b [u8], &'b [u8]) {
        let part =
            |(start, end): (u32, u32)| buf.get(start as usize..end as usize).unwrap_or_default();
        (part(self.name), part(self.value))
    }
}

/// The values of the parser's fields named `name` (ASCII case ignored), in order.
pub(super) fn values_of<'a, 's>(
    fields: &'s [httparse::Header<'a>],
    name: &'s str,
) -> impl Iterator<Item = &'a [u8]> + 's {
    fields
        .iter()
        .filter(move |f| f.name.eq_ignore_ascii_case(name))
        .map(|f| f.value)
}

/// Where `part` starts inside `base`, if it lies wholly within it.
fn offset_in(base: &[u8], part: &[u8]) -> Option<usize> {
    let start = (part.as_ptr() as usize).checked_sub(base.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= base.len()).then_some(start)
}

/// The members of one comma-separated field value, trimmed of OWS, empty ones skipped.
pub(super) fn list_members(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(trim_ows)
        .filter(|m| !m.is_empty())
}

/// Removes optional whitespace (SP, HTAB) from both ends.
pub(super) fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

pub(super) use crate::ascii::{is_field_value, is_field_value_byte, is_tchar, is_token};

/// Finds a LF that is not preceded by CR.
///
/// httparse accepts a lone LF as a line terminator; RFC 9112 §2.2 allows that leniency
/// ("a recipient MAY recognize a single LF as a line terminator") but a parser that does and a
/// proxy behind it that does not disagree on where lines end, which is a smuggling vector. We
/// take the strict side and reject.
pub(super) fn has_bare_lf(head: &[u8]) -> bool {
    let starts_with_lf = head.first() == Some(&b'\n');
    // Pairs each byte with the one before it. The fold has no early exit and no branches, so
    // the compiler vectorises it: this runs on every head, and a byte loop cost more than
    // httparse's own parse.
    let pairs = head.get(1..).unwrap_or_default().iter().zip(head);
    starts_with_lf
        | pairs.fold(false, |found, (&b, &prev)| {
            found | ((b == b'\n') & (prev != b'\r'))
        })
}

/// Parses a Content-Length value. RFC 9110 §8.6: `Content-Length = 1*DIGIT`; signs, spaces,
/// lists and overflow are rejected.
pub(super) fn parse_content_length(value: &[u8]) -> Result<u64, H1Error> {
    if value.is_empty() {
        return Err(H1Error::InvalidContentLength);
    }
    let mut n: u64 = 0;
    for &b in value {
        if !b.is_ascii_digit() {
            return Err(H1Error::InvalidContentLength);
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(b - b'0')))
            .ok_or(H1Error::InvalidContentLength)?;
    }
    Ok(n)
}

/// Checks the Transfer-Encoding field lines of a message and succeeds only when the codings
/// are exactly `chunked` (case-insensitive, empty list members ignored).
pub(super) fn check_transfer_encoding<'a>(
    values: impl Iterator<Item = &'a [u8]>,
) -> Result<(), H1Error> {
    let mut chunked_count = 0usize;
    let mut has_other = false;
    let mut last_is_chunked = false;
    let mut any = false;
    for member in values.flat_map(list_members) {
        any = true;
        last_is_chunked = member.eq_ignore_ascii_case(b"chunked");
        if last_is_chunked {
            chunked_count += 1;
        } else {
            has_other = true;
        }
    }
    // RFC 9112 §6.3: "If a Transfer-Encoding header field is present in a request and the
    // chunked transfer coding is not the final encoding, the message body length cannot be
    // determined reliably; the server MUST respond with the 400 (Bad Request) status code and
    // then close the connection."
    if !any || !last_is_chunked {
        return Err(H1Error::InvalidTransferEncoding);
    }
    // RFC 9112 §6.1: "A sender MUST NOT apply the chunked transfer coding more than once to a
    // message body".
    if chunked_count > 1 {
        return Err(H1Error::InvalidTransferEncoding);
    }
    // RFC 9112 §6.1: "A server that receives a request message with a transfer coding it does
    // not understand SHOULD respond with 501 (Not Implemented)." We implement only chunked.
    if has_other {
        return Err(H1Error::UnsupportedTransferCoding);
    }
    Ok(())
}

/// Which start line a malformed head begins with, for [`diagnose`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StartLine {
    Request,
    Response,
}

/// Names the first violation in a head that httparse rejected.
///
/// httparse reports coarse kinds (`HeaderName` covers obs-fold, whitespace before the colon and
/// bad bytes alike), so on the error path only we walk the lines ourselves to name the rule.
/// When the walk finds nothing more specific, httparse's kind is mapped directly.
pub(super) fn diagnose(view: &[u8], err: httparse::Error, start: StartLine) -> H1Error {
    if err == httparse::Error::TooManyHeaders {
        return H1Error::TooManyHeaders;
    }
    let fallback = match err {
        httparse::Error::HeaderName => H1Error::InvalidHeaderName,
        httparse::Error::HeaderValue => H1Error::InvalidHeaderValue,
        httparse::Error::NewLine => H1Error::BareCr,
        httparse::Error::Status => H1Error::InvalidStatus,
        httparse::Error::Version => H1Error::InvalidVersion,
        httparse::Error::Token => match start {
            StartLine::Request => H1Error::InvalidTarget,
            StartLine::Response => H1Error::InvalidStatus,
        },
        _ => H1Error::InvalidHeaderName,
    };
    walk_lines(view, start).unwrap_or(fallback)
}

/// One line of a head as the diagnosis sees it.
struct Line<'a> {
    /// The bytes before the line ending (or before the end of the buffer).
    content: &'a [u8],
    /// The violation in the line ending, if any.
    ending: Result<(), H1Error>,
    /// Whether a line ending (valid or not) was found.
    is_terminated: bool,
    /// The bytes after a valid CRLF; empty otherwise.
    rest: &'a [u8],
}

fn next_line(buf: &[u8]) -> Line<'_> {
    let Some(i) = buf.iter().position(|&b| b == b'\n' || b == b'\r') else {
        return Line {
            content: buf,
            ending: Ok(()),
            is_terminated: false,
            rest: &[],
        };
    };
    let (content, after) = buf.split_at(i);
    let (ending, is_terminated, rest): (_, _, &[u8]) = match after {
        [b'\r', b'\n', rest @ ..] => (Ok(()), true, rest),
        // A CR at the very end may still be followed by LF.
        [b'\r'] => (Ok(()), false, &[]),
        [b'\r', ..] => (Err(H1Error::BareCr), true, &[]),
        _ => (Err(H1Error::BareLf), true, &[]),
    };
    Line {
        content,
        ending,
        is_terminated,
        rest,
    }
}

fn walk_lines(view: &[u8], start: StartLine) -> Option<H1Error> {
    let mut line = next_line(view);
    // RFC 9112 §2.2: "a server that is expecting to receive and parse a request-line SHOULD
    // ignore at least one empty line (CRLF) received prior to the request-line".
    while line.content.is_empty() && line.is_terminated {
        if let Err(e) = line.ending {
            return Some(e);
        }
        line = next_line(line.rest);
    }
    let found = match start {
        StartLine::Request => check_request_line(line.content, line.is_terminated),
        StartLine::Response => check_status_line(line.content, line.is_terminated),
    };
    if found.is_some() {
        return found;
    }
    loop {
        if let Err(e) = line.ending {
            return Some(e);
        }
        if !line.is_terminated {
            return None;
        }
        line = next_line(line.rest);
        if line.content.is_empty() {
            return line.ending.err();
        }
        if let Some(e) = check_field_line(line.content, line.is_terminated) {
            return Some(e);
        }
    }
}

fn check_request_line(line: &[u8], terminated: bool) -> Option<H1Error> {
    let mut parts = line.splitn(3, |&b| b == b' ');
    let method = parts.next().unwrap_or_default();
    let Some(target) = parts.next() else {
        // The line (or the buffer) ended inside the method.
        if !method.iter().all(|&b| is_tchar(b)) || (terminated && method.is_empty()) {
            return Some(H1Error::InvalidMethod);
        }
        return terminated.then_some(H1Error::InvalidTarget);
    };
    if !is_token(method) {
        return Some(H1Error::InvalidMethod);
    }
    let Some(version) = parts.next() else {
        if !target.iter().all(|&b| is_target_byte(b)) || (terminated && target.is_empty()) {
            return Some(H1Error::InvalidTarget);
        }
        // A request line without a version is the HTTP/0.9 form, which we do not speak.
        return terminated.then_some(H1Error::InvalidVersion);
    };
    if target.is_empty() || !target.iter().all(|&b| is_target_byte(b)) {
        return Some(H1Error::InvalidTarget);
    }
    check_version(version, terminated)
}

fn check_status_line(line: &[u8], terminated: bool) -> Option<H1Error> {
    let mut parts = line.splitn(2, |&b| b == b' ');
    let version = parts.next().unwrap_or_default();
    let Some(rest) = parts.next() else {
        return check_version(version, terminated).or(terminated.then_some(H1Error::InvalidStatus));
    };
    if let Some(e) = check_version(version, true) {
        return Some(e);
    }
    let (code, reason) = rest.split_at(rest.len().min(3));
    let code_ok = code.iter().all(u8::is_ascii_digit) && (code.len() == 3 || !terminated);
    let reason_ok = match reason {
        [] => true,
        [b' ', reason @ ..] => reason.iter().all(|&b| is_field_value_byte(b)),
        _ => false,
    };
    (!code_ok || !reason_ok).then_some(H1Error::InvalidStatus)
}

/// Classifies an HTTP-version token. RFC 9112 §2.3: `HTTP-version = HTTP-name "/" DIGIT "."
/// DIGIT`; a well-formed version other than 1.0 and 1.1 is answered with 505 (RFC 9110
/// §15.6.6), anything else is malformed (400). An unterminated prefix is judged as far as it
/// goes.
fn check_version(version: &[u8], terminated: bool) -> Option<H1Error> {
    const NAME: &[u8] = b"HTTP/";
    let prefix_len = version.len().min(NAME.len());
    if version.get(..prefix_len) != NAME.get(..prefix_len) {
        return Some(H1Error::InvalidVersion);
    }
    let tail = version.get(NAME.len()..).unwrap_or_default();
    if tail == b"1.0" || tail == b"1.1" {
        return None;
    }
    if !terminated && (b"1.0".starts_with(tail) || b"1.1".starts_with(tail)) {
        return None;
    }
    let is_numeric = matches!(tail.first(), Some(b'0'..=b'9'))
        && tail.iter().all(|&b| b.is_ascii_digit() || b == b'.');
    Some(if is_numeric {
        H1Error::UnsupportedVersion
    } else {
        H1Error::InvalidVersion
    })
}

fn check_field_line(line: &[u8], terminated: bool) -> Option<H1Error> {
    // RFC 9112 §5.2: "A server that receives an obs-fold in a request message that is not
    // within a "message/http" container MUST either reject the message by sending a 400 (Bad
    // Request) ... or replace each received obs-fold with one or more SP octets". We reject;
    // for responses we do the same rather than rewrite a value we forward.
    if let [b' ' | b'\t', ..] = line {
        return Some(H1Error::ObsFold);
    }
    let name_len = line
        .iter()
        .position(|&b| !is_tchar(b))
        .unwrap_or(line.len());
    let (name, rest) = line.split_at(name_len);
    match rest {
        [] if !terminated => None,
        [] => Some(H1Error::InvalidHeaderName),
        // RFC 9112 §5.1: "No whitespace is allowed between the field name and colon. ... A
        // server MUST reject, with a response status code of 400 (Bad Request), any received
        // request message that contains whitespace between a header field name and colon."
        [b' ' | b'\t', ..] if !name.is_empty() => Some(H1Error::WhitespaceBeforeColon),
        [b':', value @ ..] if !name.is_empty() => {
            (!value.iter().all(|&b| is_field_value_byte(b))).then_some(H1Error::InvalidHeaderValue)
        }
        _ => Some(H1Error::InvalidHeaderName),
    }
}

/// Bytes accepted in a request-target: visible ASCII. RFC 9112 §3.2 builds every form from
/// URI components, which hold no controls, spaces or non-ASCII bytes; we do not narrow further
/// to RFC 3986's set because common clients send `|`, `{` or `}` unescaped.
pub(super) const fn is_target_byte(b: u8) -> bool {
    b > 0x20 && b < 0x7f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_length_values() {
        let table: &[(&[u8], Result<u64, H1Error>)] = &[
            (b"0", Ok(0)),
            (b"5", Ok(5)),
            (b"007", Ok(7)),
            (b"18446744073709551615", Ok(u64::MAX)),
            (b"18446744073709551616", Err(H1Error::InvalidContentLength)),
            (
                b"99999999999999999999999",
                Err(H1Error::InvalidContentLength),
            ),
            (b"", Err(H1Error::InvalidContentLength)),
            (b"+5", Err(H1Error::InvalidContentLength)),
            (b"-5", Err(H1Error::InvalidContentLength)),
            (b"5 ", Err(H1Error::InvalidContentLength)),
            (b"5,5", Err(H1Error::InvalidContentLength)),
            (b"0x10", Err(H1Error::InvalidContentLength)),
            (b"1e3", Err(H1Error::InvalidContentLength)),
            ("５".as_bytes(), Err(H1Error::InvalidContentLength)),
        ];
        for (input, want) in table {
            assert_eq!(
                parse_content_length(input),
                *want,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn transfer_encoding_values() {
        type Row = (&'static [&'static [u8]], Result<(), H1Error>);
        let table: &[Row] = &[
            (&[b"chunked"], Ok(())),
            (&[b"Chunked"], Ok(())),
            (&[b"CHUNKED"], Ok(())),
            (&[b" , chunked ,"], Ok(())),
            (&[b""], Err(H1Error::InvalidTransferEncoding)),
            (&[b" , "], Err(H1Error::InvalidTransferEncoding)),
            (&[b"gzip"], Err(H1Error::InvalidTransferEncoding)),
            (&[b"chunked, gzip"], Err(H1Error::InvalidTransferEncoding)),
            (
                &[b"chunked", b"gzip"],
                Err(H1Error::InvalidTransferEncoding),
            ),
            (
                &[b"chunked, chunked"],
                Err(H1Error::InvalidTransferEncoding),
            ),
            (
                &[b"chunked", b"chunked"],
                Err(H1Error::InvalidTransferEncoding),
            ),
            (&[b"chunked;x=1"], Err(H1Error::InvalidTransferEncoding)),
            (&[b"xchunked"], Err(H1Error::InvalidTransferEncoding)),
            (&[b"gzip, chunked"], Err(H1Error::UnsupportedTransferCoding)),
            (
                &[b"gzip", b"chunked"],
                Err(H1Error::UnsupportedTransferCoding),
            ),
            (
                &[b"identity, chunked"],
                Err(H1Error::UnsupportedTransferCoding),
            ),
        ];
        for (values, want) in table {
            assert_eq!(
                check_transfer_encoding(values.iter().copied()),
                *want,
                "{values:?}"
            );
        }
    }

    #[test]
    fn bare_lf_detection() {
        let table: &[(&[u8], bool)] = &[
            (b"", false),
            (b"a\r\nb\r\n\r\n", false),
            (b"\n", true),
            (b"a\nb", true),
            (b"a\r\n\n", true),
            (b"a\r\r\n", false),
        ];
        for (input, want) in table {
            assert_eq!(has_bare_lf(input), *want, "{input:?}");
        }
    }

    #[test]
    fn ows_trimming_and_lists() {
        assert_eq!(trim_ows(b" \t a b \t"), b"a b");
        assert_eq!(trim_ows(b"   "), b"");
        let members: Vec<&[u8]> = list_members(b" a ,, b,\tc ,").collect();
        assert_eq!(members, vec![&b"a"[..], b"b", b"c"]);
    }

    #[test]
    fn line_walk_names_the_first_violation() {
        let table: &[(&[u8], StartLine, Option<H1Error>)] = &[
            (
                b"\n\r\nGET / HTTP/1.1\r\n",
                StartLine::Request,
                Some(H1Error::BareLf),
            ),
            (
                b"\r\n\r\nG(T / HTTP/1.1\r\n",
                StartLine::Request,
                Some(H1Error::InvalidMethod),
            ),
            (
                b"GET / HTTP/1.1\r\nA: b\r\nC\r\n\r\n",
                StartLine::Request,
                Some(H1Error::InvalidHeaderName),
            ),
            (
                b"GET / HTTP/1.1\r\nA: b\r\n\tc\r\n",
                StartLine::Request,
                Some(H1Error::ObsFold),
            ),
            (
                b"GET / HTTP/1.1\r\nA: b\r\n\nX",
                StartLine::Request,
                Some(H1Error::BareLf),
            ),
            (b"GET / HTTP/1.1\r\nA: b\r", StartLine::Request, None),
            (b"GET / HTTP/1.1\r\nA: b\r\n\r\n", StartLine::Request, None),
            (
                b"HTTP/1.1 2x0 OK\r\n",
                StartLine::Response,
                Some(H1Error::InvalidStatus),
            ),
            (b"HTTP/1.1 200\r\n", StartLine::Response, None),
            (
                b"HTTP/1.1\r\n",
                StartLine::Response,
                Some(H1Error::InvalidStatus),
            ),
            (
                b"HTTP/1.1 200 OK\r\nA: b\rc",
                StartLine::Response,
                Some(H1Error::BareCr),
            ),
            (
                b"HTTP/1.1 200 OK\r\nA : b\r\n",
                StartLine::Response,
                Some(H1Error::WhitespaceBeforeColon),
            ),
        ];
        for (input, start, want) in table {
            assert_eq!(
                walk_lines(input, *start),
                *want,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
        // Without a more specific finding, httparse's kind is mapped.
        let e = diagnose(
            b"GET / HTTP/1.1\r\nA: b\r",
            httparse::Error::HeaderValue,
            StartLine::Request,
        );
        assert_eq!(e, H1Error::InvalidHeaderValue);
        let e = diagnose(b"", httparse::Error::TooManyHeaders, StartLine::Request);
        assert_eq!(e, H1Error::TooManyHeaders);
    }

    #[test]
    fn version_classification() {
        let table: &[(&[u8], bool, Option<H1Error>)] = &[
            (b"HTTP/1.1", true, None),
            (b"HTTP/1.0", true, None),
            (b"HTTP/1.", false, None),
            (b"HTT", false, None),
            (b"HTTP/2.0", true, Some(H1Error::UnsupportedVersion)),
            (b"HTTP/1.2", true, Some(H1Error::UnsupportedVersion)),
            (b"HTTP/0.9", true, Some(H1Error::UnsupportedVersion)),
            (b"HTTP/2", true, Some(H1Error::UnsupportedVersion)),
            (b"HTTP/11", true, Some(H1Error::UnsupportedVersion)),
            (b"HTTP/", true, Some(H1Error::InvalidVersion)),
            (b"http/1.1", true, Some(H1Error::InvalidVersion)),
            (b"HTTX/1.1", true, Some(H1Error::InvalidVersion)),
            (b"HTTP/x", true, Some(H1Error::InvalidVersion)),
            (b"HTTP/1.1x", true, Some(H1Error::InvalidVersion)),
            (b"HTTP/2", false, Some(H1Error::UnsupportedVersion)),
        ];
        for (input, terminated, want) in table {
            assert_eq!(check_version(input, *terminated), *want, "{input:?}");
        }
    }
}
