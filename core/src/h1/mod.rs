//! Our HTTP/1.1 codec, sans-IO: request and response heads, chunked and Content-Length bodies,
//! and writers, for the server listeners and the upstream client.
//!
//! Parsers take byte slices and return [`Parsed::Partial`] when more bytes are needed (like
//! httparse's `Status`); they never read a socket. The rules are strict on purpose: anything two
//! HTTP implementations could frame differently (bare LF, obs-fold, Content-Length together with
//! or repeated beside Transfer-Encoding, unknown codings) is an error, and every error closes the
//! connection.
//!
//! Driving it (the io crate's loop): read into a buffer and call [`parse_request_head`] until it
//! is [`Parsed::Complete`]; answer errors with [`H1Error::status`] and close. Build a
//! [`BodyDecoder`] from the head's framing and feed it the bytes from `consumed_len` on; when
//! it reports `is_done`, the bytes after its `consumed` start the next pipelined request.
//! Responses go out through [`write_response_head`] and [`write_chunk`]. The upstream client is
//! the mirror image: [`write_request_head`], then [`parse_response_head`] (skipping heads that
//! are [`ResponseHead::is_informational`]) and [`BodyDecoder::for_response`].
//!
//! This module is on the per-request path: no blocking, no locks, no logging.

mod body;
mod chunked;
mod error;
mod head;
mod request;
mod response;
mod write;

pub use body::{BodyDecoder, ContentLengthBody};
pub use chunked::{
    BodyLimits, ChunkedDecoder, DecodeProgress, DEFAULT_MAX_CHUNK_EXTENSION_BYTES,
    DEFAULT_MAX_TRAILER_BYTES, MAX_CHUNK_SIZE_DIGITS,
};
pub use error::H1Error;
pub use head::{
    FieldOffsets, HeadLimits, Header, Headers, Parsed, Version, DEFAULT_MAX_HEADERS,
    DEFAULT_MAX_REQUEST_HEAD_BYTES, DEFAULT_MAX_RESPONSE_HEAD_BYTES, DEFAULT_MAX_TARGET_BYTES,
    MAX_HEADERS_CEILING,
};
pub use request::{
    parse_request_head, parse_request_head_with, BodyFraming, ParsedFields, RequestHead,
    RequestStart, TargetForm,
};
pub use response::{
    parse_response_head, parse_response_head_offsets, ResponseFraming, ResponseHead, ResponseStart,
};
pub use write::{
    is_writer_owned, reason_phrase, write_chunk, write_chunk_header, write_last_chunk,
    write_request_head, write_request_head_of, write_request_head_to, write_request_head_with,
    write_response_head, write_response_head_with_reason, HeadPart, OutgoingBody,
    ResponseHeadWriter, CHUNK_DATA_END, LAST_CHUNK,
};

#[cfg(test)]
mod tests {
    use super::*;

    const SEEDS: &[&[u8]] = &[
        b"POST /a?b HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\nX: v\r\n\r\n",
        b"GET http://a.example/ HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\nabc",
        b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\nExpect: 100-continue\r\n\r\n",
    ];
    const RESPONSE_SEEDS: &[&[u8]] = &[
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.0 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
    ];
    const CHUNKED_SEED: &[u8] = b"5;a=\"b\"\r\nhello\r\n0\r\nT: v\r\n\r\n";
    const PROBES: &[u8] = b"\r\n \t:;,=\"\\\x00\x7f\x80\xff0aZ";

    /// Replaces every byte of every seed by each probe byte, and truncates at every point:
    /// nothing panics, and every accepted head obeys the strict rules.
    #[test]
    fn single_byte_mutations_never_panic_and_stay_strict() {
        // The checks below run only on what the parsers accept: the seeds themselves must be
        // accepted, and so must some of their mutations, or a parser that rejects everything
        // would pass.
        for seed in SEEDS {
            assert!(check_request(seed), "{:?}", String::from_utf8_lossy(seed));
        }
        for seed in RESPONSE_SEEDS {
            assert!(check_response(seed), "{:?}", String::from_utf8_lossy(seed));
        }
        let mut accepted = 0usize;
        for seed in SEEDS.iter().chain(RESPONSE_SEEDS) {
            for at in 0..seed.len() {
                for &probe in PROBES {
                    let mut buf = seed.to_vec();
                    buf[at] = probe;
                    accepted +=
                        usize::from(check_request(&buf)) + usize::from(check_response(&buf));
                    buf.insert(at, probe);
                    accepted +=
                        usize::from(check_request(&buf)) + usize::from(check_response(&buf));
                }
                check_request(&seed[..at]);
                check_response(&seed[..at]);
            }
        }
        assert!(
            accepted > 100,
            "only {accepted} mutated heads were accepted"
        );
        let mut decoded = 0usize;
        for at in 0..CHUNKED_SEED.len() {
            for &probe in PROBES {
                let mut buf = CHUNKED_SEED.to_vec();
                buf[at] = probe;
                decoded += usize::from(check_chunked(&buf).is_some());
            }
        }
        assert!(
            decoded > 10,
            "only {decoded} mutated chunked bodies decoded"
        );
        assert_eq!(check_chunked(CHUNKED_SEED).as_deref(), Some(&b"hello"[..]));
    }

    /// Checks what the request parser accepts; whether it accepted a complete head.
    fn check_request(buf: &[u8]) -> bool {
        let parsed = parse_request_head(buf, &HeadLimits::REQUEST);
        // The entry point that lends the parser's fields decides the same, field for field.
        let lent = parse_request_head_with(buf, &HeadLimits::REQUEST, |start, fields| {
            (*start, fields.iter().collect::<Vec<_>>())
        });
        let collected = parsed.as_ref().map(|p| match p {
            Parsed::Complete { head, consumed_len } => Parsed::Complete {
                head: (
                    *head.start(),
                    head.headers()
                        .iter()
                        .map(|h| (h.name(), h.value()))
                        .collect::<Vec<_>>(),
                ),
                consumed_len: *consumed_len,
            },
            Parsed::Partial => Parsed::Partial,
        });
        assert_eq!(
            lent,
            collected.map_err(|e| *e),
            "{:?}",
            String::from_utf8_lossy(buf)
        );
        let is_complete = matches!(parsed, Ok(Parsed::Complete { .. }));
        if let Ok(Parsed::Complete { head, consumed_len }) = parsed {
            assert!(consumed_len <= buf.len());
            let raw = &buf[..consumed_len];
            assert!(raw.ends_with(b"\r\n\r\n"));
            assert!(!raw.windows(2).any(|w| w[1] == b'\n' && w[0] != b'\r'));
            let cl = head.headers().values("content-length").count();
            let te = head.headers().contains("transfer-encoding");
            assert!(
                cl <= 1 && !(cl == 1 && te),
                "{:?}",
                String::from_utf8_lossy(buf)
            );
            assert!(head.headers().values("host").count() <= 1);
        }
        is_complete
    }

    /// Checks what the response parser accepts after each method; whether it accepted a
    /// complete head after any.
    fn check_response(buf: &[u8]) -> bool {
        let mut is_complete = false;
        for method in ["GET", "HEAD", "CONNECT"] {
            if let Ok(Parsed::Complete { head, consumed_len }) =
                parse_response_head(buf, method, &HeadLimits::RESPONSE)
            {
                is_complete = true;
                assert!(consumed_len <= buf.len());
                assert!((100..=599).contains(&head.status()));
            }
        }
        is_complete
    }

    /// Decodes a chunked body whole and byte by byte, which must agree; the body when both
    /// finished it.
    fn check_chunked(buf: &[u8]) -> Option<Vec<u8>> {
        let mut whole = ChunkedDecoder::new(BodyLimits::with_max_body(1 << 20));
        let mut a = Vec::new();
        let ra = whole.decode(buf, &mut |d| a.extend_from_slice(d));
        let mut bytewise = ChunkedDecoder::new(BodyLimits::with_max_body(1 << 20));
        let mut b = Vec::new();
        let mut rb = Ok(DecodeProgress {
            consumed: 0,
            is_done: false,
        });
        let mut consumed = 0;
        for byte in buf.chunks(1) {
            rb = bytewise.decode(byte, &mut |d| b.extend_from_slice(d));
            match rb {
                Ok(p) => {
                    consumed += p.consumed;
                    if p.is_done {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        match (ra, rb) {
            (Ok(pa), Ok(pb)) => {
                assert_eq!(pa.consumed, consumed);
                assert_eq!(pa.is_done, pb.is_done);
                assert_eq!(a, b);
                pa.is_done.then_some(a)
            }
            (Err(ea), Err(eb)) => {
                assert_eq!(ea, eb);
                None
            }
            (ra, rb) => panic!("{buf:?}: whole {ra:?} bytewise {rb:?}"),
        }
    }
}
