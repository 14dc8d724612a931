//! One HTTP/1.1 exchange on an open connection: write the request head and body, read the
//! response head (skipping interim 1xx responses), read the body by its framing into a buffer
//! bounded by the response limit, and say whether the connection may be reused.
//!
//! On the per-request path: the codec is `sortie_core::h1`; this file only moves bytes and
//! applies the stage limits. No logging above debug.

use std::time::Instant;

use bytes::Bytes;
use sortie_core::error::{ApiError, ErrorCode, TimeoutType};
use sortie_core::h1::{
    parse_response_head_offsets, write_request_head_of, write_request_head_to, BodyDecoder,
    BodyLimits, H1Error, HeadLimits, OutgoingBody, Parsed, ResponseFraming,
};
use sortie_core::request::{rejection_reason, Header, Method, TargetUrl};

use super::connect::within;
use super::error::{self, Expired, Stage};
use super::fields::{FieldSpans, ResponseFields};
use super::stream::{Conn, Sent, READ_BUF_BYTES};
use super::Timeouts;

/// Interim (1xx) responses skipped before the final one; an upstream that sends more is
/// treated as broken rather than read forever.
pub const MAX_INTERIM_RESPONSES: usize = 16;
/// A body up to this size is written in the same write as the head.
pub const COALESCE_BODY_BYTES: usize = 16 * 1024;
/// The response body buffer is reserved up to this size from a declared Content-Length; past
/// it the buffer grows as bytes arrive, so a false length cannot make us allocate.
const MAX_BODY_RESERVE: usize = 1024 * 1024;

/// Builds the request head of a buffered request: the body's length, or `Content-Length: 0`
/// for an empty POST, PUT or PATCH ([`head_to`]).
pub(crate) fn request_head(
    method: Method,
    url: &TargetUrl,
    headers: &[Header],
    body_len: usize,
) -> Result<Vec<u8>, ApiError> {
    let framing = if body_len > 0 {
        OutgoingBody::ContentLength(body_len as u64)
    } else {
        empty_body_framing(method)
    };
    let mut out = Vec::with_capacity(256);
    write_request_head_of(
        &mut out,
        method.as_str(),
        url,
        headers,
        b"Connection: keep-alive\r\n",
        framing,
    )
    .map_err(head_error)?;
    Ok(out)
}

/// The framing of a request without a body. RFC 9110 §8.6: "A user agent SHOULD send
/// Content-Length in a request when the method defines a meaning for enclosed content and it
/// is not sending Transfer-Encoding", even when the content is empty.
pub(crate) fn empty_body_framing(method: Method) -> OutgoingBody {
    match method {
        Method::Post | Method::Put | Method::Patch => OutgoingBody::ContentLength(0),
        _ => OutgoingBody::None,
    }
}

/// The HTTP/1.1 request head to `url`, for buffered and streamed requests alike: origin-form
/// target, `Host` first, the caller's fields in order with duplicates kept, `Connection:
/// keep-alive`, then the framing field. No `Expect` is ever sent.
pub(crate) fn head_to<'f>(
    method: Method,
    url: &TargetUrl,
    fields: impl Iterator<Item = (&'f str, &'f [u8])>,
    framing: OutgoingBody,
) -> Result<Vec<u8>, ApiError> {
    // Fields the gateway manages (hop-by-hop, framing, Expect, proxy credentials, its own
    // X-Service-*) never reach the destination, whoever built the request (decision 017).
    let fields = fields
        .filter(|(n, _)| rejection_reason(n).is_none())
        .map(|(n, v)| (n.as_bytes(), v));
    let mut out = Vec::with_capacity(256);
    write_request_head_to(
        &mut out,
        method.as_str(),
        url,
        fields,
        b"Connection: keep-alive\r\n",
        framing,
    )
    .map_err(head_error)?;
    Ok(out)
}

/// The error of a request head the writer refused.
fn head_error(e: H1Error) -> ApiError {
    ApiError::new(
        ErrorCode::InvalidRequest,
        format!("the request head cannot be written: {e}"),
    )
}

/// A response read completely.
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) headers: crate::egress::ResponseFields,
    /// The first bytes of the body, read with the head: a slice of the head's buffer.
    pub(crate) body_start: Bytes,
    /// The rest of the body.
    pub(crate) body: Vec<u8>,
    /// Whether the connection may carry another request.
    pub(crate) is_reusable: bool,
}

/// How an exchange failed.
pub(crate) struct Failure {
    pub(crate) error: ApiError,
    /// Whether the connection broke before a single response byte arrived: on a reused
    /// connection that is the stale-connection race, and a replayable request may be sent
    /// again on a fresh connection.
    pub(crate) is_before_response: bool,
}

impl Failure {
    fn during_response(error: ApiError) -> Failure {
        Failure {
            error,
            is_before_response: false,
        }
    }
}

/// What the exchange needs to know about the request.
pub(crate) struct Exchange<'a> {
    pub(crate) method: Method,
    pub(crate) head: &'a [u8],
    pub(crate) body: &'a Bytes,
    pub(crate) deadline: Instant,
    pub(crate) timeouts: &'a Timeouts,
    pub(crate) max_response_body_bytes: usize,
}

/// The earlier of a stage limit and the total deadline, with what to report when it fires.
pub(crate) fn limit(
    stage_end: Option<Instant>,
    ty: TimeoutType,
    deadline: Instant,
) -> (Instant, Expired) {
    match stage_end {
        Some(end) if end < deadline => (end, Expired::Stage(ty)),
        _ => (deadline, Expired::TotalDeadline),
    }
}

/// Runs one exchange on `conn`.
pub(crate) async fn exchange(conn: &mut Conn, x: &Exchange<'_>) -> Result<Response, Failure> {
    if x.head.len() + x.body.len() <= crate::send_ahead::MAX_SENT_AHEAD_BYTES {
        if let Some(writer) = conn.take_writer() {
            return exchange_with_writer(conn, writer, x).await;
        }
    }
    send_request(conn, x).await?;
    read_response(conn, x).await
}

/// [`exchange`] of a small request on plain TCP under io_uring (decision 124): the request is
/// sent on the connection's second descriptor while the answer is read
/// ([`Conn::send_with_answer`]).
async fn exchange_with_writer(
    conn: &mut Conn,
    writer: Box<monoio::net::TcpStream>,
    x: &Exchange<'_>,
) -> Result<Response, Failure> {
    let mut one = Vec::with_capacity(x.head.len() + x.body.len());
    one.extend_from_slice(x.head);
    one.extend_from_slice(x.body);
    let (answer, sent) = conn
        .send_with_answer(writer, one, x.deadline, async |c: &mut Conn| {
            read_response(c, x).await
        })
        .await;
    match sent {
        Sent::Whole(_) => answer,
        // As when the send goes first: a failure before the answer (a request the socket did
        // not take whole, or a failed send).
        Sent::Short(..) | Sent::Failed => Err(Failure {
            error: error::request_write_broke(),
            is_before_response: true,
        }),
        Sent::NotDone => answer.and_then(|_| {
            Err(Failure::during_response(error::reset(
                Stage::RequestWrite,
                "the request was not sent by the deadline",
            )))
        }),
    }
}

async fn send_request(conn: &mut Conn, x: &Exchange<'_>) -> Result<(), Failure> {
    let before = |error| Failure {
        error,
        is_before_response: true,
    };
    let mut writes: [Option<Bytes>; 2] = if x.body.len() <= COALESCE_BODY_BYTES {
        let mut one = Vec::with_capacity(x.head.len() + x.body.len());
        one.extend_from_slice(x.head);
        one.extend_from_slice(x.body);
        [Some(Bytes::from(one)), None]
    } else {
        [Some(Bytes::copy_from_slice(x.head)), Some(x.body.clone())]
    };
    for data in writes.iter_mut().filter_map(Option::take) {
        // A deadline, not a duration: the coarse clock (never earlier than the true time).
        let idle_end = crate::timer::now().checked_add(x.timeouts.idle);
        let (at, expired) = limit(idle_end, TimeoutType::Idle, x.deadline);
        // Pinned where it is built, not copied into the limit.
        let write = std::pin::pin!(conn.write_all(data));
        match within(at, write).await {
            Some(Ok(())) => {}
            Some(Err(e)) if error::is_tls_error(&e) => return Err(before(error::tls_failure(&e))),
            Some(Err(_)) => return Err(before(error::request_write_broke())),
            None => {
                return Err(Failure::during_response(error::timeout(
                    expired,
                    Stage::RequestWrite,
                )))
            }
        }
    }
    Ok(())
}

/// The parts of a final response head that outlive the buffer it was parsed from.
pub(crate) struct Head {
    pub(crate) status: u16,
    pub(crate) headers: crate::egress::ResponseFields,
    pub(crate) framing: ResponseFraming,
    pub(crate) is_keep_alive: bool,
    /// The bytes read past the head: the start of the body (a slice of the head's buffer).
    pub(crate) rest: Bytes,
}

/// Bytes the first read of a response head asks for on a plain connection: a head and a body
/// of up to about 16 KiB in one read; the rest of a larger body is read after it.
const PLAIN_HEAD_READ_BYTES: usize = 16 * 1024;

/// Bytes asked for by each read of a response head on a plain connection whose caller splices
/// large bodies: most heads and small bodies fit, and the rest of a large body stays in the
/// socket to be spliced on without passing through user space (decision 025).
const SPLICING_HEAD_READ_BYTES: usize = 4 * 1024;

/// What each read of a response head on `conn` asks for. A plain connection's asks for less
/// than a TLS one's (which drains records): the buffer is allocated per response, and a small
/// answer's fits a small one; one that a large body is spliced from, less again.
pub(super) fn head_read_bytes(conn: &Conn, may_splice: bool) -> usize {
    match (conn.is_plain(), may_splice) {
        (true, true) => SPLICING_HEAD_READ_BYTES,
        (true, false) => PLAIN_HEAD_READ_BYTES,
        (false, _) => READ_BUF_BYTES,
    }
}

async fn read_response(conn: &mut Conn, x: &Exchange<'_>) -> Result<Response, Failure> {
    // The start of a deadline, not of a duration: the coarse clock.
    let sent_at = crate::timer::now();
    let header_end = match x.timeouts.response_header {
        Some(t) => sent_at.checked_add(t),
        None => None,
    };
    let (at, expired) = limit(header_end, TimeoutType::ResponseHeader, x.deadline);
    let mut buf = Vec::new();
    let read_bytes = head_read_bytes(conn, false);
    // Pinned where it is built, not copied into the limit; in a block, so that the borrow of
    // `conn` ends with it.
    let read = {
        let read = std::pin::pin!(read_head(conn, x.method, &mut buf, read_bytes));
        within(at, read).await
    };
    let mut head = match read {
        Some(head) => head?,
        None => {
            return Err(Failure::during_response(error::timeout(
                expired,
                Stage::ResponseHeader,
            )))
        }
    };
    let limits = BodyLimits::with_max_body(x.max_response_body_bytes as u64);
    let mut decoder = BodyDecoder::for_response(head.framing, limits)
        .map_err(|e| Failure::during_response(body_error(e, x.max_response_body_bytes)))?;
    let body_failure = |e| Failure::during_response(body_error(e, x.max_response_body_bytes));
    // A body without chunk framing is the bytes as they are: those that came with the head
    // stay where they are (a slice of the head's buffer, `body_start`), the rest is read
    // straight into `body`. Only chunked bodies go through the connection's buffer and the
    // decoder's copy.
    let is_plain = !matches!(head.framing, ResponseFraming::Chunked);
    let early = std::mem::take(&mut head.rest);
    let mut body_start = Bytes::new();
    let mut chunked_start = Vec::new();
    let progress = if is_plain {
        decoder.decode(&early, &mut |_| {})
    } else {
        decoder.decode(&early, &mut |d: &[u8]| chunked_start.extend_from_slice(d))
    }
    .map_err(body_failure)?;
    let mut has_leftover = progress.consumed < early.len();
    if is_plain {
        body_start = early.slice(..progress.consumed.min(early.len()));
    }
    drop(early);
    // The rest of a declared length, and one byte over it: the read that completes the body
    // may ask for one byte more than the rest (see below) without growing the buffer. A body
    // that came whole with the head needs no room at all (no allocation).
    let reserve = match (is_plain, decoder.remaining()) {
        (true, Some(0)) => 0,
        (true, Some(r)) => usize::try_from(r)
            .unwrap_or(usize::MAX)
            .min(MAX_BODY_RESERVE)
            .saturating_add(1),
        _ => 0,
    };
    let mut body = if chunked_start.is_empty() {
        Vec::with_capacity(reserve)
    } else {
        chunked_start
    };
    let mut is_eof = false;
    while !decoder.is_done() {
        // A deadline, not a duration: the coarse clock (never earlier than the true time).
        let idle_end = crate::timer::now().checked_add(x.timeouts.idle);
        let (at, expired) = limit(idle_end, TimeoutType::Idle, x.deadline);
        let broken =
            |e: std::io::Error| Failure::during_response(read_error(&e, Stage::ResponseBody));
        let timed_out = || Failure::during_response(error::timeout(expired, Stage::ResponseBody));
        if is_plain {
            // Never much more room than the rest of a declared body; one byte more than the
            // rest, so that a TLS read that filled the room does not leave the pool unsure
            // whether rustls holds more.
            let want = decoder.remaining().map_or(READ_BUF_BYTES, |r| {
                usize::try_from(r)
                    .unwrap_or(usize::MAX)
                    .saturating_add(1)
                    .min(READ_BUF_BYTES)
            });
            let n = match within(at, conn.read_append(&mut body, want)).await {
                Some(Ok(n)) => n,
                Some(Err(e)) => return Err(broken(e)),
                None => return Err(timed_out()),
            };
            if n == 0 {
                is_eof = true;
                break;
            }
            let fresh = body.len() - n;
            let progress = decoder
                .decode(body.get(fresh..).unwrap_or_default(), &mut |_| {})
                .map_err(body_failure)?;
            if progress.consumed < n {
                // Bytes past the declared length are not the body's.
                body.truncate(fresh + progress.consumed);
                has_leftover = true;
            }
            continue;
        }
        let chunk = match within(at, conn.read_some()).await {
            Some(Ok(chunk)) => chunk,
            Some(Err(e)) => return Err(broken(e)),
            None => return Err(timed_out()),
        };
        if chunk.is_empty() {
            is_eof = true;
            break;
        }
        let progress = decoder
            .decode(chunk, &mut |d: &[u8]| body.extend_from_slice(d))
            .map_err(body_failure)?;
        has_leftover = progress.consumed < chunk.len();
    }
    if is_eof && !decoder.is_complete_at_eof() {
        return Err(Failure::during_response(error::reset(
            Stage::ResponseBody,
            "the connection closed before the response body was complete",
        )));
    }
    // Reuse needs a cleanly ended body with nothing after it: a byte beyond the response means
    // the upstream is out of step, and its next "response" cannot be trusted.
    let is_reusable = head.is_keep_alive
        && !is_eof
        && decoder.is_done()
        && !has_leftover
        && conn.is_plaintext_drained();
    Ok(Response {
        status: head.status,
        headers: head.headers,
        body_start,
        body,
        is_reusable,
    })
}

/// Reads until a final response head is complete, skipping interim responses, into `buf`
/// (left empty on success). The bytes read past the head come back as [`Head::rest`].
pub(crate) async fn read_head(
    conn: &mut Conn,
    method: Method,
    buf: &mut Vec<u8>,
    read_bytes: usize,
) -> Result<Head, Failure> {
    let mut interim = 0usize;
    let mut received_any = false;
    // Where the final head's fields lie in `buf`: kept with the buffer, read from it later.
    let mut fields = Vec::new();
    loop {
        // Parse what is buffered before reading more: interim heads and the final head may
        // arrive in one read.
        if !buf.is_empty() {
            match parse_response_head_offsets(
                buf,
                method.as_str(),
                &HeadLimits::RESPONSE,
                &mut fields,
            ) {
                Ok(Parsed::Partial) => {}
                Ok(Parsed::Complete { head, consumed_len }) => {
                    if head.is_switching_protocols() {
                        // We never ask for an upgrade; a 101 would hand the connection to a
                        // protocol we do not speak.
                        return Err(Failure::during_response(error::protocol_violation(
                            "unexpected_101",
                            "the destination switched protocols without being asked",
                        )));
                    }
                    if head.is_informational() {
                        interim += 1;
                        if interim > MAX_INTERIM_RESPONSES {
                            return Err(Failure::during_response(error::protocol_violation(
                                "too_many_interim_responses",
                                "the destination sent too many interim responses",
                            )));
                        }
                        buf.drain(..consumed_len.min(buf.len()));
                        continue;
                    }
                    // The fields stay in the head's buffer, read through their offsets: no
                    // allocation or reference count per field. The codec gives each field's
                    // offsets in the buffer it parsed, which is `buf`: checked against it here.
                    let malformed = || {
                        Failure::during_response(error::protocol_error(H1Error::InvalidHeaderValue))
                    };
                    let spans = FieldSpans::parsed(buf, std::mem::take(&mut fields), consumed_len)
                        .ok_or_else(malformed)?;
                    let (status, framing) = (head.status(), head.framing());
                    let is_keep_alive = head.is_keep_alive();
                    let consumed = consumed_len.min(buf.len());
                    // The bytes past the head stay in the same buffer, handed on as a slice.
                    let frozen = Bytes::from(std::mem::take(buf));
                    let rest = frozen.slice(consumed..);
                    let headers = ResponseFields::in_buffer(frozen, spans).ok_or_else(malformed)?;
                    return Ok(Head {
                        status,
                        headers,
                        framing,
                        is_keep_alive,
                        rest,
                    });
                }
                Err(e) => return Err(Failure::during_response(error::protocol_error(e))),
            }
        }
        // Straight into the head buffer: no copy out of the connection's.
        match conn.read_append(buf, read_bytes).await {
            Ok(0) => {
                return Err(Failure {
                    error: error::reset(
                        Stage::ResponseHeader,
                        "the connection closed before a complete response head",
                    ),
                    is_before_response: !received_any,
                })
            }
            Ok(_) => received_any = true,
            Err(e) => {
                return Err(Failure {
                    error: read_error(&e, Stage::ResponseHeader),
                    is_before_response: !received_any && !error::is_tls_error(&e),
                })
            }
        }
    }
}

pub(crate) fn read_error(e: &std::io::Error, stage: Stage) -> ApiError {
    if error::is_tls_error(e) {
        error::tls_failure(e)
    } else {
        error::reset(
            stage,
            "the connection broke before the response was complete",
        )
    }
}

fn body_error(e: H1Error, limit: usize) -> ApiError {
    match e {
        H1Error::BodyTooLarge => error::response_too_large(limit),
        other => error::protocol_error(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sortie_core::request::parse_target_url;

    fn header(name: &str, value: &str) -> Header {
        Header::new(name, value.as_bytes()).unwrap()
    }

    #[test]
    fn request_heads() {
        let url = parse_target_url("http://a.example:8080/p?q=1").unwrap();
        let default_port = parse_target_url("https://b.example/").unwrap();
        let headers = vec![
            header("Accept", "*/*"),
            header("X-Dup", "1"),
            header("X-Dup", "2"),
        ];
        // A field the gateway manages cannot be a `Header` at all, so none reaches a head.
        for managed in [
            "connection",
            "Expect",
            "X-Service-Token",
            "Proxy-Authorization",
        ] {
            assert!(Header::new(managed, b"x").is_err(), "{managed}");
        }
        let table: &[(Method, &TargetUrl, &[Header], usize, &str)] = &[
            (
                Method::Get,
                &url,
                &headers,
                0,
                "GET /p?q=1 HTTP/1.1\r\nHost: a.example:8080\r\nAccept: */*\r\nX-Dup: 1\r\n\
                 X-Dup: 2\r\nConnection: keep-alive\r\n\r\n",
            ),
            (
                Method::Post,
                &default_port,
                &[],
                0,
                "POST / HTTP/1.1\r\nHost: b.example\r\nConnection: keep-alive\r\n\
                 Content-Length: 0\r\n\r\n",
            ),
            (
                Method::Put,
                &default_port,
                &[],
                5,
                "PUT / HTTP/1.1\r\nHost: b.example\r\nConnection: keep-alive\r\n\
                 Content-Length: 5\r\n\r\n",
            ),
            (
                Method::Delete,
                &default_port,
                &[],
                0,
                "DELETE / HTTP/1.1\r\nHost: b.example\r\nConnection: keep-alive\r\n\r\n",
            ),
            (
                Method::Options,
                &default_port,
                &[],
                3,
                "OPTIONS / HTTP/1.1\r\nHost: b.example\r\nConnection: keep-alive\r\n\
                 Content-Length: 3\r\n\r\n",
            ),
        ];
        for (method, url, headers, body_len, want) in table {
            let got = request_head(*method, url, headers, *body_len).unwrap();
            assert_eq!(String::from_utf8(got).unwrap(), *want, "{method:?}");
        }
    }

    #[test]
    fn unwritable_header_is_invalid_request() {
        let url = parse_target_url("http://a.example/").unwrap();
        // Fields given one by one (a streamed request's, a peer's) are checked as written.
        let fields = [("X", &b"a\r\nb"[..])].into_iter();
        let e = head_to(Method::Get, &url, fields, OutgoingBody::None).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidRequest);
        // A `Header` cannot hold such a value at all.
        let e = Header::new("X", b"a\r\nb").unwrap_err();
        assert_eq!(e.code, ErrorCode::HeaderInjectionFailed);
    }

    #[test]
    fn limits_pick_the_earlier_end() {
        let now = Instant::now();
        let later = now + std::time::Duration::from_secs(5);
        assert_eq!(
            limit(Some(now), TimeoutType::Idle, later),
            (now, Expired::Stage(TimeoutType::Idle))
        );
        assert_eq!(
            limit(Some(later), TimeoutType::Idle, now),
            (now, Expired::TotalDeadline)
        );
        assert_eq!(
            limit(None, TimeoutType::ResponseHeader, now),
            (now, Expired::TotalDeadline)
        );
    }
}
