//! [`Response`]: what a handler returns, and its encoding into an HTTP/1.1 response head.
//!
//! The server owns the framing and connection fields: `Content-Length`, `Transfer-Encoding` and
//! `Connection` come from the server alone, so that a handler cannot make the framing disagree
//! with the body or keep open a connection the server decided to close.
//!
//! On the per-request path: one head buffer per response, no logging.

use std::future::Future;
use std::io;
use std::pin::Pin;

use bytes::Bytes;
use monoio::net::TcpStream;
use sortie_core::h1::{H1Error, HeadPart, OutgoingBody, ResponseHeadWriter};
use sortie_core::proxy::{
    is_hop_by_hop_response_field, is_relayed_response_field, lists_field_names,
    response_field_name, ResponseFieldName,
};

use super::date;
use crate::egress::ResponseFields;

/// A header field name: usually a `&'static str`, owned when built at run time, or a slice of
/// a received head when a field is relayed (sharing that head's buffer, not copied). The
/// encoder checks every name, wherever it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderName(Bytes);

impl HeaderName {
    /// A name that is a slice of a received head's buffer: no copy.
    pub fn shared(name: Bytes) -> HeaderName {
        HeaderName(name)
    }

    /// The name's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Whether the name is `other`, ignoring ASCII case.
    pub fn eq_ignore_ascii_case(&self, other: &str) -> bool {
        self.0.eq_ignore_ascii_case(other.as_bytes())
    }
}

impl From<&'static str> for HeaderName {
    fn from(name: &'static str) -> HeaderName {
        HeaderName(Bytes::from_static(name.as_bytes()))
    }
}

impl From<String> for HeaderName {
    fn from(name: String) -> HeaderName {
        HeaderName(Bytes::from(name))
    }
}

/// A response body produced while it is sent (a relayed upstream body).
///
/// The server writes the head, then calls [`StreamBody::read_into`] until it returns `false`,
/// writing each piece as it comes: with `Content-Length` when [`StreamBody::length`] is known,
/// chunked otherwise (or, for an HTTP/1.0 client, until the connection closes). An error
/// mid-body closes the connection: the status is already sent, and the truncation is what
/// tells the client.
pub trait StreamBody {
    /// The exact length, when known before the first byte.
    fn length(&self) -> Option<u64>;

    /// Appends the next piece of the body to `out` and returns `true`, or returns `false` at
    /// the end of the body (nothing appended).
    fn read_into<'a>(
        &'a mut self,
        out: &'a mut Vec<u8>,
    ) -> Pin<Box<dyn Future<Output = io::Result<bool>> + 'a>>;

    /// Body bytes the stream already holds, taken before the first [`StreamBody::read_into`]
    /// when the body is not chunk-framed to the client: they are written as they are, with the
    /// head, instead of being copied into the server's buffer. `None` (the default) when there
    /// are none; the rest of the body still comes from `read_into`.
    fn take_ready(&mut self) -> Option<Bytes> {
        None
    }

    /// Whether the body is known to have ended without another [`StreamBody::read_into`]:
    /// a small body that came whole with its head ends without a boxed read that would only
    /// answer `false`. `false` (the default) when a read must tell.
    fn is_finished(&self) -> bool {
        false
    }

    /// The fields of the received head this body relays, written after the response's own
    /// [`Response::headers`]. They travel with the body (already boxed per response) rather
    /// than in [`Response`], which every handler result moves. `None` (the default) when the
    /// body relays none.
    fn relayed_fields(&self) -> Option<&RelayedFields> {
        None
    }

    /// The response to send instead when the body fails before any byte of the response
    /// reached the client: the head is not sent yet, so the client can still be told what
    /// went wrong (a gateway error) rather than see the connection close with nothing. `None`
    /// (the default) closes the connection as for an error mid-body. The connection closes
    /// after it either way.
    fn failure_response(&mut self, _error: &io::Error) -> Option<Response> {
        None
    }

    /// Whether [`StreamBody::splice_into`] can move the rest of the body (false by default).
    fn can_splice(&self) -> bool {
        false
    }

    /// Whether, before [`StreamBody::take_ready`], the rest of the body past the bytes it will
    /// give is expected to go by [`StreamBody::splice_into`]: the buffer the head is written
    /// from then gets no room for the body's pieces, which never pass through it. A wrong
    /// guess costs only a larger buffer later. `false` (the default) keeps the room.
    fn expects_splice(&self) -> bool {
        false
    }

    /// Moves the rest of the body straight to `client` with `splice(2)`, socket to socket, and
    /// returns the bytes moved; each wait for `client` lasts at most `write_timeout`. Called
    /// only when [`StreamBody::can_splice`] said so, after [`StreamBody::take_ready`], for a
    /// body sent as it is (not chunk-framed); `client` is non-blocking by then. What it did not
    /// move still comes from [`StreamBody::read_into`].
    fn splice_into<'a>(
        &'a mut self,
        _client: &'a TcpStream,
        _write_timeout: std::time::Duration,
    ) -> Pin<Box<dyn Future<Output = io::Result<u64>> + 'a>> {
        Box::pin(std::future::ready(Ok(0)))
    }
}

/// What takes over a connection after a `2xx` answer to `CONNECT`: the client's socket and the
/// bytes it already sent past the request head.
pub trait Tunnel {
    /// Runs the tunnel to its end; the connection closes when the future completes.
    fn run(self: Box<Self>, client: TcpStream, early: Vec<u8>)
        -> Pin<Box<dyn Future<Output = ()>>>;
}

/// The body of a [`Response`].
///
/// Non-exhaustive so that further forms can be added without breaking handlers.
#[derive(Default)]
#[non_exhaustive]
pub enum ResponseBody {
    /// No body (`Content-Length: 0`, except where the status forbids the field).
    #[default]
    Empty,
    /// The whole body, sent with `Content-Length`.
    Full(Bytes),
    /// The whole body in `buf[start..]`, sent with `Content-Length`; the `start` bytes before
    /// it are free for the head, which is written into them so that head and body go out in
    /// one send without a copy of the body (a head longer than the room is sent with a copy).
    BehindRoom { buf: Vec<u8>, start: usize },
    /// A body produced while it is sent.
    Stream(Box<dyn StreamBody>),
    /// No body: the head (without framing fields) ends HTTP on the connection, which is handed
    /// to the tunnel. Only for a `2xx` answer to `CONNECT`.
    Tunnel(Box<dyn Tunnel>),
}

impl std::fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResponseBody::Empty => f.write_str("Empty"),
            ResponseBody::Full(b) => f.debug_tuple("Full").field(b).finish(),
            ResponseBody::BehindRoom { buf, start } => f
                .debug_tuple("BehindRoom")
                .field(&buf.get(*start..).unwrap_or_default())
                .finish(),
            ResponseBody::Stream(s) => f
                .debug_struct("Stream")
                .field("length", &s.length())
                .finish(),
            ResponseBody::Tunnel(_) => f.write_str("Tunnel"),
        }
    }
}

/// Bodies compare by content; streams and tunnels never compare equal.
impl PartialEq for ResponseBody {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (ResponseBody::Empty, ResponseBody::Empty) => true,
            (a, b) => match (a.whole(), b.whole()) {
                (Some(a), Some(b)) => a == b,
                _ => false,
            },
        }
    }
}

impl ResponseBody {
    /// Length of the body in bytes, as far as known before it is sent (0 for a stream of
    /// unknown length and for a tunnel).
    pub fn len(&self) -> usize {
        match self {
            ResponseBody::Empty | ResponseBody::Tunnel(_) => 0,
            ResponseBody::Full(_) | ResponseBody::BehindRoom { .. } => {
                self.whole().map_or(0, <[u8]>::len)
            }
            ResponseBody::Stream(s) => s
                .length()
                .map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX)),
        }
    }

    /// Whether the body has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of a whole body (`Full` or `BehindRoom`); `None` for the others.
    pub fn whole(&self) -> Option<&[u8]> {
        match self {
            ResponseBody::Full(b) => Some(b),
            ResponseBody::BehindRoom { buf, start } => buf.get(*start..),
            _ => None,
        }
    }
}

/// The name [`Response::content_type`] is written under.
pub(crate) const CONTENT_TYPE_FIELD: &str = "content-type";

/// The room a handler leaves before a whole body for the head ([`ResponseBody::BehindRoom`]):
/// more than the heads of the answers written that way take (status line, content type, date,
/// length, connection: under 160 bytes).
pub const RESPONSE_HEAD_ROOM: usize = 256;

/// A final response to one request.
#[derive(Debug, PartialEq)]
pub struct Response {
    /// The status code, 200..=599. A handler returning 1xx gets a 500 instead: interim
    /// responses are the server's business.
    pub status: u16,
    /// The `Content-Type` field, written first: a field of its own, so that the JSON and text
    /// answers that carry no other field allocate no list for it. A constant of the handler's
    /// code, written without byte checks (`ResponseHeadWriter::own_field`); a content type that
    /// came from elsewhere goes in `headers`, which are checked.
    pub content_type: Option<&'static str>,
    /// Header fields in order, after `content_type`. `Content-Length`, `Transfer-Encoding` and
    /// `Connection` are dropped (the server writes them); a `Date` here replaces the server's.
    pub headers: Vec<(HeaderName, Bytes)>,
    /// The body. HEAD requests, 204 and 304 get the head only.
    pub body: ResponseBody,
    /// Whether the connection must be closed after this response.
    pub should_close: bool,
}

/// Fields of a received head that a response relays: the head's fields and which of them go
/// on, read from the head's buffer when written (no reference count or copy per field). Where
/// the fields are an HTTP/1.1 head's lines, a run of relayed fields is written as its received
/// lines in one copy (the parser checked them); otherwise the encoder checks each field as it
/// checks a handler's own.
#[derive(Debug, Default)]
pub struct RelayedFields {
    fields: ResponseFields,
    /// Bit `i` set: field `i` is relayed.
    keep: u64,
    /// The relayed names' and values' bytes together, for sizing the head's buffer.
    bytes: usize,
    /// Whether a relayed field is `Date` (the server then adds none).
    has_date: bool,
}

impl RelayedFields {
    /// The most fields a head may have to be relayed this way; a longer head's relayed fields
    /// go into [`Response::headers`].
    pub const MAX_FIELDS: usize = 64;

    /// The fields of `fields` that go back to a forward proxy's client
    /// ([`sortie_core::proxy::is_relayed_response_field`]: not hop-by-hop, not the framing
    /// fields and `Host`, which the server writes itself, not `Proxy-Authenticate`); `fields`
    /// back when there are more than [`RelayedFields::MAX_FIELDS`]. One pass deciding each
    /// field by its name ([`response_field_name`]); a second, with the names the head's
    /// `Connection` fields list (RFC 9110 §7.6.1: the sender's hop-by-hop fields), only when
    /// they list one besides `keep-alive` ([`lists_field_names`]).
    pub fn select(fields: ResponseFields) -> Result<RelayedFields, ResponseFields> {
        if fields.len() > Self::MAX_FIELDS {
            return Err(fields);
        }
        let (mut keep, mut bytes, mut has_date, mut lists) = (0u64, 0, false, false);
        for (i, (n, v)) in fields.iter().enumerate() {
            match response_field_name(n) {
                ResponseFieldName::Ordinary => {}
                ResponseFieldName::Date => has_date = true,
                ResponseFieldName::Connection => {
                    lists |= lists_field_names(v);
                    continue;
                }
                ResponseFieldName::Host
                | ResponseFieldName::NotRelayed
                | ResponseFieldName::HopByHop => continue,
            }
            keep |= 1 << i;
            bytes += n.len() + v.len();
        }
        if lists {
            let tokens = fields.connection_tokens();
            has_date = false;
            for (i, (n, v)) in fields.iter().enumerate() {
                if keep & (1 << i) == 0 {
                    continue;
                }
                if is_hop_by_hop_response_field(n, &tokens) {
                    keep &= !(1 << i);
                    bytes -= n.len() + v.len();
                } else {
                    has_date |= response_field_name(n) == ResponseFieldName::Date;
                }
            }
        }
        Ok(RelayedFields {
            fields,
            keep,
            bytes,
            has_date,
        })
    }

    /// The fields of a destination's response head that a forward proxy's client gets, in
    /// order: up to [`RelayedFields::MAX_FIELDS`] (every ordinary head) they stay in the
    /// head's buffer and are written from it; a longer head's go into `out.headers` as shared
    /// slices instead.
    pub fn relay(fields: ResponseFields, out: &mut Response) -> RelayedFields {
        let fields = match RelayedFields::select(fields) {
            Ok(relayed) => return relayed,
            Err(fields) => fields,
        };
        let tokens = fields.connection_tokens();
        out.headers = fields
            .iter()
            .enumerate()
            .filter(|(_, (n, _))| is_relayed_response_field(n, &tokens))
            .filter_map(|(i, _)| fields.shared(i))
            .map(|(n, v)| (HeaderName::shared(n), v))
            .collect();
        RelayedFields::default()
    }

    /// How many fields are relayed.
    pub fn len(&self) -> usize {
        self.keep.count_ones() as usize
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.keep == 0
    }

    /// The relayed names' and values' bytes together.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether a relayed field is `Date`.
    pub fn has_date(&self) -> bool {
        self.has_date
    }

    /// The relayed fields as parts of a head, in order: each run of consecutive relayed fields
    /// as its received lines where the fields are a head's lines, a field each otherwise.
    pub(crate) fn parts(&self) -> impl Iterator<Item = HeadPart<'_>> {
        let lines = self.fields.has_lines();
        let mut keep = self.keep;
        std::iter::from_fn(move || {
            if keep == 0 {
                return None;
            }
            let i = keep.trailing_zeros() as usize;
            if lines {
                let past = i + (keep >> i).trailing_ones() as usize;
                if let Some(run) = self.fields.lines(i, past) {
                    keep = u64::MAX.checked_shl(past as u32).map_or(0, |m| keep & m);
                    return Some(HeadPart::ParsedLines(run));
                }
            }
            keep &= keep - 1;
            self.fields.get(i).map(|(n, v)| HeadPart::Field(n, v))
        })
    }

    /// The relayed fields in order: only they are visited, by the set bits of the mask.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let mut keep = self.keep;
        std::iter::from_fn(move || {
            if keep == 0 {
                return None;
            }
            let i = keep.trailing_zeros() as usize;
            keep &= keep - 1;
            self.fields.get(i)
        })
    }
}

/// `Content-Type` of [`Response::json`].
pub const CONTENT_TYPE_JSON: &str = "application/json";
/// `Content-Type` of [`Response::text`].
pub const CONTENT_TYPE_TEXT: &str = "text/plain; charset=utf-8";

impl Response {
    /// A response with no header fields and no body.
    pub fn new(status: u16) -> Response {
        Response {
            status,
            content_type: None,
            headers: Vec::new(),
            body: ResponseBody::Empty,
            should_close: false,
        }
    }

    /// A JSON response.
    pub fn json(status: u16, body: impl Into<Bytes>) -> Response {
        Response::new(status)
            .with_content_type(CONTENT_TYPE_JSON)
            .with_body(body)
    }

    /// A plain text response.
    pub fn text(status: u16, body: impl Into<Bytes>) -> Response {
        Response::new(status)
            .with_content_type(CONTENT_TYPE_TEXT)
            .with_body(body)
    }

    /// Sets the `Content-Type` field ([`Response::content_type`]).
    pub fn with_content_type(mut self, value: &'static str) -> Response {
        self.content_type = Some(value);
        self
    }

    /// Appends a header field.
    pub fn with_header(mut self, name: impl Into<HeaderName>, value: impl Into<Bytes>) -> Response {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// A JSON response whose document is `buf[start..]`, the `start` bytes before it left for
    /// the head ([`ResponseBody::BehindRoom`]).
    pub fn json_behind_room(status: u16, buf: Vec<u8>, start: usize) -> Response {
        let mut r = Response::new(status).with_content_type(CONTENT_TYPE_JSON);
        r.body = ResponseBody::BehindRoom { buf, start };
        r
    }

    /// Replaces the body.
    pub fn with_body(mut self, body: impl Into<Bytes>) -> Response {
        self.body = ResponseBody::Full(body.into());
        self
    }

    /// Marks the connection to be closed after this response.
    pub fn closing(mut self) -> Response {
        self.should_close = true;
        self
    }

    /// The first value of the header field `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.fields()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }

    /// Every header field in the order written: the content type, the handler's own, then the
    /// relayed ones.
    pub fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.content_type
            .map(|v| (CONTENT_TYPE_FIELD.as_bytes(), v.as_bytes()))
            .into_iter()
            .chain(self.headers.iter().map(|(n, v)| (n.as_bytes(), v.as_ref())))
            .chain(self.relayed().into_iter().flat_map(RelayedFields::iter))
    }

    /// The fields the body relays ([`StreamBody::relayed_fields`]).
    pub fn relayed(&self) -> Option<&RelayedFields> {
        match &self.body {
            ResponseBody::Stream(s) => s.relayed_fields(),
            _ => None,
        }
    }

    /// Whether the response asks to close the connection, by flag or by a `Connection: close`
    /// field.
    pub fn is_closing(&self) -> bool {
        self.should_close
            || self
                .headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
                .flat_map(|(_, v)| v.split(|&b| b == b','))
                .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"close"))
    }
}

/// The `Connection` field the server adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnectionField {
    /// None: HTTP/1.1 persists by default.
    Omit,
    /// `Connection: close`: the server closes after this response.
    Close,
    /// `Connection: keep-alive`: an HTTP/1.0 client asked to keep the connection.
    KeepAlive,
}

/// Appends the head of `resp` to `out` and returns whether the body bytes must follow.
pub(crate) fn encode_head(
    out: &mut Vec<u8>,
    resp: &Response,
    is_head_request: bool,
    connection: ConnectionField,
) -> Result<bool, H1Error> {
    encode_head_for(out, resp, is_head_request, connection, false)
}

/// [`encode_head`] for a client of the given version: a streamed body of unknown length is
/// chunked for HTTP/1.1 and close-delimited for HTTP/1.0.
pub(crate) fn encode_head_for(
    out: &mut Vec<u8>,
    resp: &Response,
    is_head_request: bool,
    connection: ConnectionField,
    is_http10: bool,
) -> Result<bool, H1Error> {
    if !(200..=599).contains(&resp.status) {
        return Err(H1Error::InvalidStatus);
    }
    // RFC 9110 §8.6: "A server MUST NOT send a Content-Length header field in any response
    // with a status code of 1xx (Informational) or 204 (No Content)". A 304 carries the length
    // of the representation it stands for, which we do not know here, so it gets none either.
    let has_no_content = matches!(resp.status, 204 | 304);
    let framing = match &resp.body {
        _ if has_no_content => OutgoingBody::None,
        // RFC 9110 §9.3.6: "A server MUST NOT send any Transfer-Encoding or Content-Length
        // header fields in a 2xx (Successful) response to CONNECT."
        ResponseBody::Tunnel(_) => OutgoingBody::None,
        ResponseBody::Stream(s) => match s.length() {
            Some(n) => OutgoingBody::ContentLength(n),
            // A HEAD answer of unknown length says nothing about the length.
            None if is_head_request => OutgoingBody::None,
            // HTTP/1.0 has no chunked coding: the body runs until the connection closes, which
            // the caller arranges (RFC 9112 §6.3, item 8).
            None if is_http10 => OutgoingBody::None,
            None => OutgoingBody::Chunked,
        },
        // RFC 9110 §9.3.2: the response to HEAD carries the fields the GET response would,
        // including its Content-Length, without the content.
        _ => OutgoingBody::ContentLength(resp.body.len() as u64),
    };
    let has_date = resp.relayed().is_some_and(RelayedFields::has_date)
        || resp
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("date"));
    // Each source of fields written in turn: the handler's own, the relayed ones, then the
    // server's.
    let mut head = ResponseHeadWriter::start(out, resp.status)?;
    // The server's own fields (the content type a handler named from its constants, the date,
    // the connection's fate) are written without the byte checks of the fields that come from
    // elsewhere: every response carries them.
    if let Some(v) = resp.content_type {
        head.own_field(CONTENT_TYPE_FIELD, v.as_bytes());
    }
    for (n, v) in &resp.headers {
        if !n.eq_ignore_ascii_case("connection") {
            head.field(n.as_bytes(), v)?;
        }
    }
    if let Some(relayed) = resp.relayed() {
        for part in relayed.parts() {
            head.part(part)?;
        }
    }
    if !has_date {
        head.own_line(&date::field_line());
    }
    match connection {
        ConnectionField::Omit => {}
        ConnectionField::Close => head.own_lines(b"Connection: close\r\n"),
        ConnectionField::KeepAlive => head.own_lines(b"Connection: keep-alive\r\n"),
    }
    head.end(framing);
    let has_bytes = match &resp.body {
        ResponseBody::Stream(st) => st.length() != Some(0),
        ResponseBody::Tunnel(_) => false,
        body => !body.is_empty(),
    };
    Ok(!is_head_request && !has_no_content && has_bytes)
}

/// An empty body that relays `fields`, for tests of relayed heads.
#[cfg(test)]
pub(crate) struct RelayingBody(pub(crate) RelayedFields);

#[cfg(test)]
impl StreamBody for RelayingBody {
    fn length(&self) -> Option<u64> {
        Some(0)
    }

    fn read_into<'a>(
        &'a mut self,
        _out: &'a mut Vec<u8>,
    ) -> Pin<Box<dyn Future<Output = io::Result<bool>> + 'a>> {
        Box::pin(async { Ok(false) })
    }

    fn relayed_fields(&self) -> Option<&RelayedFields> {
        Some(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(resp: &Response, is_head: bool, c: ConnectionField) -> (String, bool) {
        let mut out = Vec::new();
        let has_body = encode_head(&mut out, resp, is_head, c).unwrap();
        let text = String::from_utf8(out).unwrap();
        // The date changes every second; replace it for stable comparisons.
        let text = match text.find("Date: ") {
            Some(i) => {
                let end = i + 6 + date::IMF_FIXDATE_LEN;
                format!("{}Date: D{}", &text[..i], &text[end..])
            }
            None => text,
        };
        (text, has_body)
    }

    /// Relayed fields are written after the handler's own, only those selected, and a relayed
    /// `Date` stands in for the server's; the counts size the buffer. A parsed head's relayed
    /// fields are written as their received lines, in runs, and read the same; copied fields
    /// are written one by one. The fields the server writes are never relayed.
    #[test]
    fn relayed_fields_are_written_from_the_received_head() {
        let copied =
            ResponseFields::copied([("date", "Tue, 1 Jan 2030"), ("X-A", "b"), ("Upgrade", "h2")]);
        let parsed = crate::egress::parsed_fields(
            b"HTTP/1.1 200 OK\r\ndate: Tue, 1 Jan 2030\r\nX-A:  b \r\nUpgrade: h2\r\n\r\n",
        );
        for (received, relayed_text) in [
            (copied, "date: Tue, 1 Jan 2030\r\nX-A: b\r\n"),
            (parsed, "date: Tue, 1 Jan 2030\r\nX-A:  b \r\n"),
        ] {
            let relayed = RelayedFields::select(received).expect("few fields");
            assert_eq!(
                (relayed.len(), relayed.bytes(), relayed.has_date()),
                (2, 23, true)
            );
            let mut resp = Response::new(200).with_header("x-own", "1");
            resp.body = ResponseBody::Stream(Box::new(RelayingBody(relayed)));
            assert_eq!(resp.header("X-a"), Some(&b"b"[..]));
            let (text, _) = encode(&resp, false, ConnectionField::Omit);
            assert_eq!(
                text,
                format!("HTTP/1.1 200 OK\r\nx-own: 1\r\n{relayed_text}Content-Length: 0\r\n\r\n")
            );
        }
        let many = ResponseFields::copied((0..65).map(|i| (format!("X-{i}"), "v")));
        assert!(RelayedFields::select(many).is_err());
        // The names a `Connection` field lists are dropped; `Connection` itself, the framing
        // fields and `Host` are the server's.
        let listed = ResponseFields::copied([
            ("Connection", "x-hop"),
            ("X-Hop", "1"),
            ("A", "b"),
            ("Content-Length", "1"),
            ("Transfer-Encoding", "chunked"),
            ("Host", "h"),
        ]);
        let relayed = RelayedFields::select(listed).expect("few fields");
        let names: Vec<&[u8]> = relayed.iter().map(|(n, _)| n).collect();
        assert_eq!(names, [&b"A"[..]]);
        // A listed `Date` is hop-by-hop too: the server's own stands in.
        let listed_date = ResponseFields::copied([
            ("Date", "Tue, 1 Jan 2030"),
            ("X-A", "b"),
            ("Connection", "date"),
        ]);
        let relayed = RelayedFields::select(listed_date).expect("few fields");
        assert_eq!(
            (relayed.len(), relayed.bytes(), relayed.has_date()),
            (1, 4, false)
        );
    }

    /// A parsed head's relayed fields go out as one piece per run of consecutive relayed
    /// fields; a head whose fields are not lines goes out field by field.
    #[test]
    fn relayed_lines_are_written_in_runs() {
        let parsed = crate::egress::parsed_fields(
            b"HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\nConnection: close\r\nC: 3\r\nUpgrade: x\r\nD: 4\r\nE: 5\r\n\r\n",
        );
        let relayed = RelayedFields::select(parsed).expect("few fields");
        let parts: Vec<HeadPart<'_>> = relayed.parts().collect();
        assert_eq!(
            parts,
            [
                HeadPart::ParsedLines(b"A: 1\r\nB: 2\r\n"),
                HeadPart::ParsedLines(b"C: 3\r\n"),
                HeadPart::ParsedLines(b"D: 4\r\nE: 5\r\n"),
            ]
        );
        let copied = ResponseFields::copied(relayed.iter());
        let relayed = RelayedFields::select(copied).expect("few fields");
        let parts: Vec<HeadPart<'_>> = relayed.parts().collect();
        assert_eq!(parts.len(), 5);
        assert_eq!(parts[4], HeadPart::Field(b"E", b"5"));
    }

    #[test]
    fn heads_for_each_case() {
        type Row = (Response, bool, ConnectionField, &'static str, bool);
        let table: Vec<Row> = vec![
            (
                Response::json(200, &b"{}"[..]),
                false,
                ConnectionField::Omit,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nDate: D\r\nContent-Length: 2\r\n\r\n",
                true,
            ),
            (
                Response::text(404, "no"),
                true,
                ConnectionField::Close,
                "HTTP/1.1 404 Not Found\r\ncontent-type: text/plain; charset=utf-8\r\nDate: D\r\nConnection: close\r\nContent-Length: 2\r\n\r\n",
                false,
            ),
            (
                Response::new(204).with_body("ignored"),
                false,
                ConnectionField::KeepAlive,
                "HTTP/1.1 204 No Content\r\nDate: D\r\nConnection: keep-alive\r\n\r\n",
                false,
            ),
            (
                Response::new(304),
                false,
                ConnectionField::Omit,
                "HTTP/1.1 304 Not Modified\r\nDate: D\r\n\r\n",
                false,
            ),
            (
                Response::new(200)
                    .with_header("Content-Length", "99")
                    .with_header("connection", "keep-alive")
                    .with_header("transfer-encoding", "chunked")
                    .with_header("date", "x"),
                false,
                ConnectionField::Close,
                "HTTP/1.1 200 OK\r\ndate: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
                false,
            ),
        ];
        for (resp, is_head, c, want, want_body) in table {
            assert_eq!(encode(&resp, is_head, c), (want.to_string(), want_body));
        }
    }

    #[test]
    fn rejects_what_would_split_or_misframe_the_head() {
        let mut out = Vec::new();
        let bad: &[(Response, H1Error)] = &[
            (Response::new(100), H1Error::InvalidStatus),
            (Response::new(600), H1Error::InvalidStatus),
            (
                Response::new(200).with_header("x", "a\r\nb: c"),
                H1Error::InvalidHeaderValue,
            ),
            (
                Response::new(200).with_header("bad name", "v"),
                H1Error::InvalidHeaderName,
            ),
        ];
        for (resp, want) in bad {
            assert_eq!(
                encode_head(&mut out, resp, false, ConnectionField::Omit),
                Err(*want)
            );
            assert!(out.is_empty());
        }
    }

    #[test]
    fn closing_by_flag_or_field() {
        assert!(!Response::new(200).is_closing());
        assert!(Response::new(200).closing().is_closing());
        assert!(Response::new(200)
            .with_header("Connection", "keep-alive, Close")
            .is_closing());
        assert!(!Response::new(200)
            .with_header("connection", "closed")
            .is_closing());
        assert_eq!(
            Response::new(200).with_header("A", "1").header("a"),
            Some(&b"1"[..])
        );
    }
}
