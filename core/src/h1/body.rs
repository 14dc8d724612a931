//! Body readers for every framing: a Content-Length countdown, the chunked decoder, a
//! close-delimited reader and the empty body, behind one interface.
//!
//! On the per-request path: no allocation, no logging.

use super::chunked::{BodyLimits, ChunkedDecoder, DecodeProgress};
use super::error::H1Error;
use super::request::BodyFraming;
use super::response::ResponseFraming;

/// Counts down the bytes of a body of known length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentLengthBody {
    remaining: u64,
}

impl ContentLengthBody {
    /// A reader for `length` bytes, refused with [`H1Error::BodyTooLarge`] (413) when the
    /// length exceeds `max_body_bytes`: the declared length is known before any byte arrives.
    pub fn new(length: u64, max_body_bytes: u64) -> Result<ContentLengthBody, H1Error> {
        if length > max_body_bytes {
            return Err(H1Error::BodyTooLarge);
        }
        Ok(ContentLengthBody { remaining: length })
    }

    /// Bytes of the body still to come.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Whether every byte has been taken.
    pub fn is_done(&self) -> bool {
        self.remaining == 0
    }

    /// Takes the prefix of `input` that belongs to the body; the rest is the next message.
    pub fn take<'a>(&mut self, input: &'a [u8]) -> &'a [u8] {
        let n = usize::try_from(self.remaining).map_or(input.len(), |r| r.min(input.len()));
        let (body, _) = input.split_at(n);
        // `n` is at most `remaining`, so this cannot underflow.
        self.remaining = self.remaining.saturating_sub(n as u64);
        body
    }
}

#[derive(Debug, Clone)]
enum Reader {
    Empty,
    Length(ContentLengthBody),
    Chunked(ChunkedDecoder),
    UntilClose { received: u64, max_body_bytes: u64 },
}

/// Reads the body of one message, whatever its framing.
#[derive(Debug, Clone)]
pub struct BodyDecoder {
    reader: Reader,
}

impl BodyDecoder {
    /// The reader for a request body. Fails with [`H1Error::BodyTooLarge`] when a declared
    /// Content-Length already exceeds the limit.
    pub fn for_request(framing: BodyFraming, limits: BodyLimits) -> Result<BodyDecoder, H1Error> {
        let reader = match framing {
            BodyFraming::None => Reader::Empty,
            BodyFraming::ContentLength(n) => {
                Reader::Length(ContentLengthBody::new(n, limits.max_body_bytes)?)
            }
            BodyFraming::Chunked => Reader::Chunked(ChunkedDecoder::new(limits)),
        };
        Ok(BodyDecoder { reader })
    }

    /// The reader for a response body. A tunnel has no HTTP body: the reader is empty and the
    /// caller relays the connection's bytes as they are.
    pub fn for_response(
        framing: ResponseFraming,
        limits: BodyLimits,
    ) -> Result<BodyDecoder, H1Error> {
        let reader = match framing {
            ResponseFraming::None | ResponseFraming::Tunnel => Reader::Empty,
            ResponseFraming::ContentLength(n) => {
                Reader::Length(ContentLengthBody::new(n, limits.max_body_bytes)?)
            }
            ResponseFraming::Chunked => Reader::Chunked(ChunkedDecoder::new(limits)),
            ResponseFraming::CloseDelimited => Reader::UntilClose {
                received: 0,
                max_body_bytes: limits.max_body_bytes,
            },
        };
        Ok(BodyDecoder { reader })
    }

    /// Decodes as much of `input` as belongs to the body, passing data to `out` (never an
    /// empty slice). Bytes beyond `consumed` belong to the next message.
    pub fn decode(
        &mut self,
        input: &[u8],
        out: &mut impl FnMut(&[u8]),
    ) -> Result<DecodeProgress, H1Error> {
        match &mut self.reader {
            Reader::Empty => Ok(DecodeProgress {
                consumed: 0,
                is_done: true,
            }),
            Reader::Length(body) => {
                let data = body.take(input);
                if !data.is_empty() {
                    out(data);
                }
                Ok(DecodeProgress {
                    consumed: data.len(),
                    is_done: body.is_done(),
                })
            }
            Reader::Chunked(decoder) => decoder.decode(input, out),
            Reader::UntilClose {
                received,
                max_body_bytes,
            } => {
                *received = received.saturating_add(input.len() as u64);
                if *received > *max_body_bytes {
                    return Err(H1Error::BodyTooLarge);
                }
                if !input.is_empty() {
                    out(input);
                }
                Ok(DecodeProgress {
                    consumed: input.len(),
                    is_done: false,
                })
            }
        }
    }

    /// Body bytes still expected, when the framing says (a `Content-Length` body); `None` for
    /// chunked and close-delimited bodies.
    pub fn remaining(&self) -> Option<u64> {
        match &self.reader {
            Reader::Empty => Some(0),
            Reader::Length(body) => Some(body.remaining()),
            Reader::Chunked(_) | Reader::UntilClose { .. } => None,
        }
    }

    /// Whether the body has ended. A close-delimited body never ends by its bytes; see
    /// [`BodyDecoder::is_complete_at_eof`].
    pub fn is_done(&self) -> bool {
        match &self.reader {
            Reader::Empty => true,
            Reader::Length(body) => body.is_done(),
            Reader::Chunked(decoder) => decoder.is_done(),
            Reader::UntilClose { .. } => false,
        }
    }

    /// Counts `n` bytes of a `Content-Length` body that were moved without passing through the
    /// decoder (spliced from socket to socket). Refused, changing nothing, for any other
    /// framing and for more bytes than remain.
    pub fn count_moved(&mut self, n: u64) -> Result<(), H1Error> {
        match &mut self.reader {
            Reader::Length(body) if n <= body.remaining => {
                body.remaining -= n;
                Ok(())
            }
            _ => Err(H1Error::BodyTooLarge),
        }
    }

    /// Whether the body is complete if the peer closes the connection now. When it is not, the
    /// message was truncated (RFC 9112 §8: "A message that uses a valid Content-Length is
    /// incomplete if the size of the message body received ... is less than the value given by
    /// Content-Length. A response that has neither chunked transfer coding nor Content-Length
    /// is terminated by closure of the connection").
    pub fn is_complete_at_eof(&self) -> bool {
        matches!(self.reader, Reader::UntilClose { .. }) || self.is_done()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: BodyLimits = BodyLimits::with_max_body(100);

    #[test]
    fn moved_bytes_count_only_against_a_length() {
        let mut d = BodyDecoder::for_response(ResponseFraming::ContentLength(10), LIMITS).unwrap();
        assert_eq!(d.count_moved(11), Err(H1Error::BodyTooLarge));
        assert_eq!(d.remaining(), Some(10));
        d.count_moved(4).unwrap();
        assert_eq!(d.remaining(), Some(6));
        d.count_moved(6).unwrap();
        assert!(d.is_done());
        let mut chunked = BodyDecoder::for_response(ResponseFraming::Chunked, LIMITS).unwrap();
        assert_eq!(chunked.count_moved(1), Err(H1Error::BodyTooLarge));
    }

    fn run(decoder: &mut BodyDecoder, input: &[u8]) -> Result<(Vec<u8>, DecodeProgress), H1Error> {
        let mut data = Vec::new();
        let progress = decoder.decode(input, &mut |d| {
            assert!(!d.is_empty());
            data.extend_from_slice(d);
        })?;
        Ok((data, progress))
    }

    #[test]
    fn content_length_countdown() {
        let mut body = ContentLengthBody::new(5, 100).unwrap();
        assert_eq!(body.take(b"he"), b"he");
        assert_eq!(body.remaining(), 3);
        assert_eq!(body.take(b""), b"");
        assert_eq!(body.take(b"lloGET /"), b"llo");
        assert!(body.is_done());
        assert_eq!(body.take(b"more"), b"");
        assert_eq!(ContentLengthBody::new(101, 100), Err(H1Error::BodyTooLarge));
        assert!(ContentLengthBody::new(u64::MAX, u64::MAX).is_ok());
    }

    #[test]
    fn request_bodies() {
        let mut none = BodyDecoder::for_request(BodyFraming::None, LIMITS).unwrap();
        assert!(none.is_done());
        assert_eq!(
            run(&mut none, b"GET").unwrap(),
            (
                vec![],
                DecodeProgress {
                    consumed: 0,
                    is_done: true
                }
            )
        );

        let mut fixed = BodyDecoder::for_request(BodyFraming::ContentLength(4), LIMITS).unwrap();
        assert_eq!(
            run(&mut fixed, b"ab").unwrap(),
            (
                b"ab".to_vec(),
                DecodeProgress {
                    consumed: 2,
                    is_done: false
                }
            )
        );
        assert!(!fixed.is_complete_at_eof());
        assert_eq!(
            run(&mut fixed, b"cdef").unwrap(),
            (
                b"cd".to_vec(),
                DecodeProgress {
                    consumed: 2,
                    is_done: true
                }
            )
        );
        assert!(fixed.is_complete_at_eof());

        let mut empty = BodyDecoder::for_request(BodyFraming::ContentLength(0), LIMITS).unwrap();
        assert!(empty.is_done());
        assert_eq!(
            run(&mut empty, b"x").unwrap().1,
            DecodeProgress {
                consumed: 0,
                is_done: true
            }
        );

        assert_eq!(
            BodyDecoder::for_request(BodyFraming::ContentLength(101), LIMITS).err(),
            Some(H1Error::BodyTooLarge)
        );

        let mut chunked = BodyDecoder::for_request(BodyFraming::Chunked, LIMITS).unwrap();
        assert_eq!(
            run(&mut chunked, b"2\r\nok\r\n0\r\n\r\nX").unwrap(),
            (
                b"ok".to_vec(),
                DecodeProgress {
                    consumed: 12,
                    is_done: true
                }
            )
        );
    }

    #[test]
    fn response_bodies() {
        for framing in [ResponseFraming::None, ResponseFraming::Tunnel] {
            let decoder = BodyDecoder::for_response(framing, LIMITS).unwrap();
            assert!(decoder.is_done());
        }
        let mut until_close =
            BodyDecoder::for_response(ResponseFraming::CloseDelimited, LIMITS).unwrap();
        assert_eq!(
            run(&mut until_close, b"anything\r\n").unwrap(),
            (
                b"anything\r\n".to_vec(),
                DecodeProgress {
                    consumed: 10,
                    is_done: false
                }
            )
        );
        assert!(!until_close.is_done());
        assert!(until_close.is_complete_at_eof());
        assert_eq!(run(&mut until_close, &[0u8; 90]).unwrap().1.consumed, 90);
        assert_eq!(run(&mut until_close, b"!"), Err(H1Error::BodyTooLarge));

        let mut fixed =
            BodyDecoder::for_response(ResponseFraming::ContentLength(3), LIMITS).unwrap();
        assert_eq!(
            run(&mut fixed, b"abc").unwrap().1,
            DecodeProgress {
                consumed: 3,
                is_done: true
            }
        );
        let mut chunked = BodyDecoder::for_response(ResponseFraming::Chunked, LIMITS).unwrap();
        assert!(!chunked.is_complete_at_eof());
        assert_eq!(
            run(&mut chunked, b"1\r\n"),
            Ok((
                vec![],
                DecodeProgress {
                    consumed: 3,
                    is_done: false
                }
            ))
        );
    }
}
