//! Streaming decoder of the chunked transfer coding (RFC 9112 §7.1), sans-IO.
//!
//! The decoder is a byte-level state machine: input may be split anywhere (even one byte at a
//! time) and the decoded data, chunk extensions, trailers and errors come out the same. Data is
//! handed to the caller as slices of the input, without copying.
//!
//! On the per-request path: no allocation, no logging.

use super::error::H1Error;
use super::head::{is_field_value_byte, is_tchar};

/// Most hex digits of a chunk-size: 16 digits fill 64 bits, so the size cannot overflow.
/// Leading zeros count too; no sender needs more than this.
pub const MAX_CHUNK_SIZE_DIGITS: u8 = 16;
/// Default byte limit of all chunk extensions of one body. Extensions carry nothing we use, and
/// without a bound a peer could send megabytes of them around one-byte chunks.
pub const DEFAULT_MAX_CHUNK_EXTENSION_BYTES: usize = 16 * 1024;
/// Default byte limit of the trailer section of one body (the same as a request head).
pub const DEFAULT_MAX_TRAILER_BYTES: usize = 16 * 1024;

/// Limits applied while decoding one body (the extension and trailer limits apply to chunked
/// bodies only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    /// Sum of all chunk sizes; beyond it [`H1Error::BodyTooLarge`] (413).
    pub max_body_bytes: u64,
    /// Bytes of all chunk extensions together.
    pub max_extension_bytes: usize,
    /// Bytes of the trailer section, including its line endings.
    pub max_trailer_bytes: usize,
}

impl BodyLimits {
    /// The default extension and trailer limits with the given body limit.
    pub const fn with_max_body(max_body_bytes: u64) -> BodyLimits {
        BodyLimits {
            max_body_bytes,
            max_extension_bytes: DEFAULT_MAX_CHUNK_EXTENSION_BYTES,
            max_trailer_bytes: DEFAULT_MAX_TRAILER_BYTES,
        }
    }
}

/// What one call to a body decoder did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeProgress {
    /// Bytes of the input that belong to the body. Less than the input only when the body
    /// ended: the rest is the next message.
    pub consumed: usize,
    /// Whether the body is complete.
    pub is_done: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Expecting the first hex digit of a chunk-size.
    SizeStart,
    /// Inside the chunk-size.
    Size,
    /// Whitespace after the chunk-size, before `;`.
    SizeBws,
    /// After `;`, before an extension name.
    ExtNameStart,
    ExtName,
    /// Whitespace after an extension name, before `=` or `;`.
    ExtNameBws,
    /// After `=`, before the value.
    ExtValueStart,
    ExtToken,
    ExtQuoted,
    ExtQuotedPair,
    /// Right after the closing quote.
    ExtAfterQuoted,
    /// Whitespace after a value, before `;`.
    ExtValueBws,
    /// Expecting the LF that ends a chunk-size line.
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerLineStart,
    TrailerName,
    TrailerValue,
    TrailerLf,
    FinalLf,
    Done,
    Failed(H1Error),
}

impl State {
    fn is_extension(self) -> bool {
        matches!(
            self,
            State::SizeBws
                | State::ExtNameStart
                | State::ExtName
                | State::ExtNameBws
                | State::ExtValueStart
                | State::ExtToken
                | State::ExtQuoted
                | State::ExtQuotedPair
                | State::ExtAfterQuoted
                | State::ExtValueBws
        )
    }

    fn is_trailer(self) -> bool {
        matches!(
            self,
            State::TrailerLineStart
                | State::TrailerName
                | State::TrailerValue
                | State::TrailerLf
                | State::FinalLf
        )
    }
}

/// Decodes one chunked body incrementally.
///
/// Chunk extensions are checked against the `chunk-ext` grammar and discarded; trailer fields
/// are checked and discarded (RFC 9112 §7.1.2: "A recipient that removes the chunked coding from
/// a message MAY selectively retain or discard the received trailer fields").
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
    /// The chunk-size being read, then the bytes of the current chunk still to come.
    size: u64,
    digits: u8,
    body_len: u64,
    extension_bytes: usize,
    trailer_bytes: usize,
    limits: BodyLimits,
}

impl ChunkedDecoder {
    /// A decoder at the start of a chunked body.
    pub fn new(limits: BodyLimits) -> ChunkedDecoder {
        ChunkedDecoder {
            state: State::SizeStart,
            size: 0,
            digits: 0,
            body_len: 0,
            extension_bytes: 0,
            trailer_bytes: 0,
            limits,
        }
    }

    /// Whether the last chunk and the trailer section have been read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The sum of the chunk sizes announced so far.
    pub fn body_len(&self) -> u64 {
        self.body_len
    }

    /// Decodes as much of `input` as belongs to the body, passing each run of data to `out`
    /// (never an empty slice).
    ///
    /// All of `input` is consumed unless the body ends inside it. After an error the decoder
    /// keeps returning that error; after the end it consumes nothing.
    pub fn decode(
        &mut self,
        input: &[u8],
        out: &mut impl FnMut(&[u8]),
    ) -> Result<DecodeProgress, H1Error> {
        if let State::Failed(e) = self.state {
            return Err(e);
        }
        let mut at = 0usize;
        loop {
            let rest = input.get(at..).unwrap_or_default();
            if self.state == State::Done {
                break;
            }
            if self.state == State::Data {
                // Bulk path: hand over the whole run of data in one slice.
                let take = usize::try_from(self.size).map_or(rest.len(), |s| s.min(rest.len()));
                if take == 0 {
                    break;
                }
                let (data, _) = rest.split_at(take);
                out(data);
                // `take` is at most `self.size`, so this cannot underflow.
                self.size = self.size.saturating_sub(take as u64);
                at = at.saturating_add(take);
                if self.size == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            let Some(&b) = rest.first() else {
                break;
            };
            at = at.saturating_add(1);
            if let Err(e) = self.step(b) {
                self.state = State::Failed(e);
                return Err(e);
            }
        }
        Ok(DecodeProgress {
            consumed: at,
            is_done: self.state == State::Done,
        })
    }

    /// Advances the state machine over one byte outside chunk data.
    fn step(&mut self, b: u8) -> Result<(), H1Error> {
        if self.state.is_extension() {
            self.extension_bytes = self.extension_bytes.saturating_add(1);
            if self.extension_bytes > self.limits.max_extension_bytes {
                return Err(H1Error::ChunkExtensionsTooLarge);
            }
        } else if self.state.is_trailer() {
            self.trailer_bytes = self.trailer_bytes.saturating_add(1);
            if self.trailer_bytes > self.limits.max_trailer_bytes {
                return Err(H1Error::TrailersTooLarge);
            }
        }
        self.state = match self.state {
            // RFC 9112 §7.1: `chunk-size = 1*HEXDIG`.
            State::SizeStart => match hex_value(b) {
                Some(d) => {
                    self.size = 0;
                    self.digits = 0;
                    self.push_digit(d)?;
                    State::Size
                }
                None => return Err(H1Error::InvalidChunkSize),
            },
            State::Size => match b {
                b'\r' => State::SizeLf,
                b'\n' => return Err(H1Error::BareLf),
                b';' => State::ExtNameStart,
                b' ' | b'\t' => State::SizeBws,
                _ => match hex_value(b) {
                    Some(d) => {
                        self.push_digit(d)?;
                        State::Size
                    }
                    None => return Err(H1Error::InvalidChunkSize),
                },
            },
            // RFC 9112 §7.1.1: `chunk-ext = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS
            // chunk-ext-val ] )`, `chunk-ext-name = token`, `chunk-ext-val = token /
            // quoted-string`. We check the grammar so that no byte can hide a line end, then
            // ignore the extensions ("A recipient MUST ignore unrecognized chunk extensions").
            State::SizeBws => match b {
                b' ' | b'\t' => State::SizeBws,
                b';' => State::ExtNameStart,
                _ => return Err(H1Error::InvalidChunkExtension),
            },
            State::ExtNameStart => match b {
                b' ' | b'\t' => State::ExtNameStart,
                _ if is_tchar(b) => State::ExtName,
                _ => return Err(H1Error::InvalidChunkExtension),
            },
            State::ExtName => match b {
                b'\r' => State::SizeLf,
                b'\n' => return Err(H1Error::BareLf),
                b';' => State::ExtNameStart,
                b'=' => State::ExtValueStart,
                b' ' | b'\t' => State::ExtNameBws,
                _ if is_tchar(b) => State::ExtName,
                _ => return Err(H1Error::InvalidChunkExtension),
            },
            State::ExtNameBws => match b {
                b' ' | b'\t' => State::ExtNameBws,
                b'=' => State::ExtValueStart,
                b';' => State::ExtNameStart,
                _ => return Err(H1Error::InvalidChunkExtension),
            },
            State::ExtValueStart => match b {
                b' ' | b'\t' => State::ExtValueStart,
                b'"' => State::ExtQuoted,
                _ if is_tchar(b) => State::ExtToken,
                _ => return Err(H1Error::InvalidChunkExtension),
            },
            State::ExtToken => match b {
                b'\r' => State::SizeLf,
                b'\n' => return Err(H1Error::BareLf),
                b';' => State::ExtNameStart,
                b' ' | b'\t' => State::ExtValueBws,
                _ if is_tchar(b) => State::ExtToken,
                _ => return Err(H1Error::InvalidChunkExtension),
            },
            // RFC 9110 §5.6.4: `qdtext = HTAB / SP / %x21 / %x23-5B / %x5D-7E / obs-text`,
            // `quoted-pair = "\" ( HTAB / SP / VCHAR / obs-text )`.
            State::ExtQuoted => match b {
                b'"' => State::ExtAfterQuoted,
                b'\\' => State::ExtQuotedPair,
                b'\t' | b' ' | 0x21 | 0x23..=0x5b | 0x5d..=0x7e | 0x80..=0xff => State::ExtQuoted,
                _ => return Err(H1Error::InvalidChunkExtension),
            },
            State::ExtQuotedPair => match b {
                b'\t' | b' ' | 0x21..=0x7e | 0x80..=0xff => State::ExtQuoted,
                _ => return Err(H1Error::InvalidChunkExtension),
            },
            State::ExtAfterQuoted => match b {
                b'\r' => State::SizeLf,
                b'\n' => return Err(H1Error::BareLf),
                b';' => State::ExtNameStart,
                b' ' | b'\t' => State::ExtValueBws,
                _ => return Err(H1Error::InvalidChunkExtension),
            },
            State::ExtValueBws => match b {
                b' ' | b'\t' => State::ExtValueBws,
                b';' => State::ExtNameStart,
                _ => return Err(H1Error::InvalidChunkExtension),
            },
            State::SizeLf => match b {
                b'\n' if self.size == 0 => State::TrailerLineStart,
                b'\n' => {
                    self.body_len = self.body_len.saturating_add(self.size);
                    State::Data
                }
                _ => return Err(H1Error::BareCr),
            },
            // RFC 9112 §7.1: `chunk = chunk-size [ chunk-ext ] CRLF chunk-data CRLF`.
            State::DataCr => match b {
                b'\r' => State::DataLf,
                b'\n' => return Err(H1Error::BareLf),
                _ => return Err(H1Error::UnterminatedChunk),
            },
            State::DataLf => match b {
                b'\n' => State::SizeStart,
                _ => return Err(H1Error::BareCr),
            },
            // RFC 9112 §7.1.2: `trailer-section = *( field-line CRLF )`, then the final CRLF.
            State::TrailerLineStart => match b {
                b'\r' => State::FinalLf,
                b'\n' => return Err(H1Error::BareLf),
                _ if is_tchar(b) => State::TrailerName,
                // Whitespace here would be obs-fold (RFC 9112 §5.2), rejected as in heads.
                _ => return Err(H1Error::InvalidTrailer),
            },
            State::TrailerName => match b {
                b':' => State::TrailerValue,
                _ if is_tchar(b) => State::TrailerName,
                _ => return Err(H1Error::InvalidTrailer),
            },
            State::TrailerValue => match b {
                b'\r' => State::TrailerLf,
                b'\n' => return Err(H1Error::BareLf),
                _ if is_field_value_byte(b) => State::TrailerValue,
                _ => return Err(H1Error::InvalidTrailer),
            },
            State::TrailerLf => match b {
                b'\n' => State::TrailerLineStart,
                _ => return Err(H1Error::BareCr),
            },
            State::FinalLf => match b {
                b'\n' => State::Done,
                _ => return Err(H1Error::BareCr),
            },
            // `decode` never steps in these states; staying put keeps this total.
            State::Data | State::Done | State::Failed(_) => self.state,
        };
        Ok(())
    }

    fn push_digit(&mut self, d: u8) -> Result<(), H1Error> {
        self.digits = self.digits.saturating_add(1);
        if self.digits > MAX_CHUNK_SIZE_DIGITS {
            return Err(H1Error::ChunkSizeTooLong);
        }
        // At most 16 digits of 4 bits each: the shift never drops a set bit.
        self.size = (self.size << 4) | u64::from(d);
        // Checking while the digits arrive answers 413 as soon as the size is known to be too
        // large, before any data is read.
        if self.body_len.saturating_add(self.size) > self.limits.max_body_bytes {
            return Err(H1Error::BodyTooLarge);
        }
        Ok(())
    }
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: BodyLimits = BodyLimits::with_max_body(1 << 20);

    /// Decodes `input` in pieces of `step` bytes, returning the data, the bytes consumed and
    /// whether the body ended.
    fn decode_split(
        input: &[u8],
        step: usize,
        limits: BodyLimits,
    ) -> Result<(Vec<u8>, usize, bool), H1Error> {
        let mut decoder = ChunkedDecoder::new(limits);
        let mut data = Vec::new();
        let mut consumed = 0;
        for piece in input.chunks(step.max(1)) {
            let progress = decoder.decode(piece, &mut |d| {
                assert!(!d.is_empty());
                data.extend_from_slice(d)
            })?;
            consumed += progress.consumed;
            if progress.is_done {
                assert!(decoder.is_done());
                return Ok((data, consumed, true));
            }
            assert_eq!(progress.consumed, piece.len());
        }
        Ok((data, consumed, decoder.is_done()))
    }

    fn decode_all(input: &[u8]) -> Result<(Vec<u8>, usize, bool), H1Error> {
        let whole = decode_split(input, input.len(), LIMITS);
        // Every way of feeding must agree with feeding everything at once.
        for step in [1, 2, 3, 7] {
            assert_eq!(
                decode_split(input, step, LIMITS),
                whole,
                "step {step} on {input:?}"
            );
        }
        whole
    }

    #[test]
    fn valid_bodies() {
        let table: &[(&[u8], &[u8])] = &[
            (b"0\r\n\r\n", b""),
            (b"5\r\nhello\r\n0\r\n\r\n", b"hello"),
            (b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", b"hello world"),
            (b"A\r\n0123456789\r\n0\r\n\r\n", b"0123456789"),
            (b"a\r\n0123456789\r\n0\r\n\r\n", b"0123456789"),
            (b"00000005\r\nhello\r\n000\r\n\r\n", b"hello"),
            (b"0000000000000005\r\nhello\r\n0\r\n\r\n", b"hello"),
            // Data may contain CR, LF and anything else.
            (b"4\r\n\r\n\n\r\r\n0\r\n\r\n", b"\r\n\n\r"),
            // Chunk extensions.
            (b"5;a\r\nhello\r\n0\r\n\r\n", b"hello"),
            (b"5;a=b\r\nhello\r\n0\r\n\r\n", b"hello"),
            (b"5 ; a = b ; c\r\nhello\r\n0;last\r\n\r\n", b"hello"),
            (
                b"5\t;\ta\t=\t\"q \\\" ;\\r\"\r\nhello\r\n0\r\n\r\n",
                b"hello",
            ),
            (b"5;a=\"\"\r\nhello\r\n0\r\n\r\n", b"hello"),
            (b"5;a=\"x\" ;b\r\nhello\r\n0\r\n\r\n", b"hello"),
            (b"5;n=\"caf\xe9\"\r\nhello\r\n0\r\n\r\n", b"hello"),
            // Trailers.
            (b"5\r\nhello\r\n0\r\nX-Sum: 1\r\n\r\n", b"hello"),
            (
                b"5\r\nhello\r\n0\r\nA: 1\r\nB:\r\nC:\t v \t\r\n\r\n",
                b"hello",
            ),
            (b"0\r\nDigest: sha-256=abc\r\n\r\n", b""),
        ];
        for (input, want) in table {
            let (data, consumed, done) =
                decode_all(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
            assert_eq!(data, *want, "{input:?}");
            assert_eq!(consumed, input.len(), "{input:?}");
            assert!(done, "{input:?}");
        }
    }

    #[test]
    fn invalid_bodies() {
        let table: &[(&[u8], H1Error)] = &[
            (b"\r\n", H1Error::InvalidChunkSize),
            (b";a\r\n", H1Error::InvalidChunkSize),
            (b"g\r\n", H1Error::InvalidChunkSize),
            (b"-1\r\n", H1Error::InvalidChunkSize),
            (b"+1\r\n", H1Error::InvalidChunkSize),
            (b"0x5\r\nhello\r\n", H1Error::InvalidChunkSize),
            (b" 5\r\nhello\r\n", H1Error::InvalidChunkSize),
            (b"5\r\nhello\r\n\r\n", H1Error::InvalidChunkSize),
            (b"00000000000000005\r\n", H1Error::ChunkSizeTooLong),
            (b"5\nhello\r\n0\r\n\r\n", H1Error::BareLf),
            (b"5\r\nhello\n0\r\n\r\n", H1Error::BareLf),
            (b"5\r\nhello\r\n0\n\r\n", H1Error::BareLf),
            (b"5\r\nhello\r\n0\r\n\n", H1Error::BareLf),
            (b"5\r\nhello\r\n0\r\nX: 1\n\r\n", H1Error::BareLf),
            (b"5;a\nhello", H1Error::BareLf),
            (b"5;a=b\nhello", H1Error::BareLf),
            (b"5;a=\"b\"\nhello", H1Error::BareLf),
            (b"5\rhello", H1Error::BareCr),
            (b"5\r\nhello\rx", H1Error::BareCr),
            (b"0\r\n\rx", H1Error::BareCr),
            (b"5\r\nhelloXX0\r\n\r\n", H1Error::UnterminatedChunk),
            (b"5\r\nhello world\r\n", H1Error::UnterminatedChunk),
            (b"5 \r\nhello\r\n", H1Error::InvalidChunkExtension),
            (b"5;\r\nhello\r\n", H1Error::InvalidChunkExtension),
            (b"5;=b\r\nhello\r\n", H1Error::InvalidChunkExtension),
            (b"5;a=\r\nhello\r\n", H1Error::InvalidChunkExtension),
            (b"5;a \r\nhello\r\n", H1Error::InvalidChunkExtension),
            (b"5;a=b \r\nhello\r\n", H1Error::InvalidChunkExtension),
            (b"5;a=b c\r\nhello\r\n", H1Error::InvalidChunkExtension),
            (
                b"5;a=\"b\r\n\"\r\nhello\r\n",
                H1Error::InvalidChunkExtension,
            ),
            (b"5;a=\"b\"c\r\nhello\r\n", H1Error::InvalidChunkExtension),
            (
                b"5;a=\"\\\x01\"\r\nhello\r\n",
                H1Error::InvalidChunkExtension,
            ),
            (b"5;a=b\x00\r\nhello\r\n", H1Error::InvalidChunkExtension),
            (b"5;a(=b\r\nhello\r\n", H1Error::InvalidChunkExtension),
            (b"0\r\n X: 1\r\n\r\n", H1Error::InvalidTrailer),
            (b"0\r\nX : 1\r\n\r\n", H1Error::InvalidTrailer),
            (b"0\r\nX\r\n\r\n", H1Error::InvalidTrailer),
            (b"0\r\n: 1\r\n\r\n", H1Error::InvalidTrailer),
            (b"0\r\nX: a\x00b\r\n\r\n", H1Error::InvalidTrailer),
            (b"0\r\nX: 1\r\n y\r\n\r\n", H1Error::InvalidTrailer),
        ];
        for (input, want) in table {
            for step in [input.len(), 1, 2, 3] {
                assert_eq!(
                    decode_split(input, step, LIMITS),
                    Err(*want),
                    "{input:?} step {step}"
                );
            }
        }
    }

    #[test]
    fn size_digits_are_bounded_before_the_limit() {
        let unlimited = BodyLimits::with_max_body(u64::MAX);
        let table: &[(&[u8], Result<(), H1Error>)] = &[
            (b"ffffffffffffffff\r\n", Ok(())),
            (b"10000000000000000\r\n", Err(H1Error::ChunkSizeTooLong)),
            (b"00000000000000000\r\n", Err(H1Error::ChunkSizeTooLong)),
        ];
        for (input, want) in table {
            let got = decode_split(input, 1, unlimited).map(|_| ());
            assert_eq!(got, *want, "{input:?}");
        }
    }

    #[test]
    fn pipelined_bytes_after_the_body_are_not_consumed() {
        let body = b"3\r\nabc\r\n0\r\nT: v\r\n\r\n";
        let mut input = body.to_vec();
        input.extend_from_slice(b"GET /next HTTP/1.1\r\n");
        let (data, consumed, done) = decode_all(&input).unwrap();
        assert_eq!(data, b"abc");
        assert_eq!(consumed, body.len());
        assert!(done);

        // Once done, further input is left alone.
        let mut decoder = ChunkedDecoder::new(LIMITS);
        let progress = decoder.decode(&input, &mut |_| {}).unwrap();
        assert_eq!(
            progress,
            DecodeProgress {
                consumed: body.len(),
                is_done: true
            }
        );
        let again = decoder
            .decode(b"more", &mut |_| panic!("no data after the end"))
            .unwrap();
        assert_eq!(
            again,
            DecodeProgress {
                consumed: 0,
                is_done: true
            }
        );
    }

    #[test]
    fn incomplete_bodies_wait_for_more() {
        let input = b"5;a=\"x\"\r\nhello\r\n0\r\nX: 1\r\n\r\n";
        for cut in 0..input.len() {
            let (_, consumed, done) = decode_split(&input[..cut], cut.max(1), LIMITS).unwrap();
            assert_eq!(consumed, cut);
            assert!(!done, "cut {cut}");
        }
    }

    #[test]
    fn errors_are_sticky() {
        let mut decoder = ChunkedDecoder::new(LIMITS);
        assert_eq!(
            decoder.decode(b"z", &mut |_| {}),
            Err(H1Error::InvalidChunkSize)
        );
        assert_eq!(
            decoder.decode(b"0\r\n\r\n", &mut |_| {}),
            Err(H1Error::InvalidChunkSize)
        );
        assert!(!decoder.is_done());
    }

    #[test]
    fn body_limit() {
        let limits = BodyLimits::with_max_body(10);
        let ok = b"5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n";
        assert_eq!(decode_split(ok, ok.len(), limits).unwrap().0, b"helloworld");
        let over = b"5\r\nhello\r\n6\r\nworld!\r\n0\r\n\r\n";
        assert_eq!(
            decode_split(over, over.len(), limits),
            Err(H1Error::BodyTooLarge)
        );
        // The limit trips on the size line, before any of the chunk's data is passed on.
        let mut decoder = ChunkedDecoder::new(limits);
        let mut seen = Vec::new();
        let result = decoder.decode(over, &mut |d| seen.extend_from_slice(d));
        assert_eq!(result, Err(H1Error::BodyTooLarge));
        assert_eq!(seen, b"hello");
        // A huge announced size is refused at once.
        let mut decoder = ChunkedDecoder::new(limits);
        assert_eq!(
            decoder.decode(b"ffffffffffffffff", &mut |_| {}),
            Err(H1Error::BodyTooLarge)
        );
        assert_eq!(decoder.body_len(), 0);
        // u64::MAX as a size is accepted by syntax when the limit allows it.
        let mut decoder = ChunkedDecoder::new(BodyLimits::with_max_body(u64::MAX));
        let progress = decoder
            .decode(b"ffffffffffffffff\r\nab", &mut |_| {})
            .unwrap();
        assert_eq!(
            progress,
            DecodeProgress {
                consumed: 20,
                is_done: false
            }
        );
        assert_eq!(decoder.body_len(), u64::MAX);
    }

    #[test]
    fn extension_and_trailer_limits() {
        let limits = BodyLimits {
            max_extension_bytes: 8,
            max_trailer_bytes: 10,
            ..LIMITS
        };
        let ext_ok = b"1;abcdefg\r\nx\r\n0\r\n\r\n";
        assert!(decode_split(ext_ok, 1, limits).is_ok());
        let ext_over = b"1;abcdefgh\r\nx\r\n0\r\n\r\n";
        assert_eq!(
            decode_split(ext_over, 1, limits),
            Err(H1Error::ChunkExtensionsTooLarge)
        );
        // The extension limit is for the whole body, not per chunk.
        let ext_spread = b"1;abcd\r\nx\r\n1;abcd\r\nx\r\n0\r\n\r\n";
        assert_eq!(
            decode_split(ext_spread, 3, limits),
            Err(H1Error::ChunkExtensionsTooLarge)
        );

        let trailer_ok = b"0\r\nA: 12\r\n\r\n";
        assert!(decode_split(trailer_ok, 1, limits).is_ok());
        let trailer_over = b"0\r\nA: 1234\r\n\r\n";
        assert_eq!(
            decode_split(trailer_over, 1, limits),
            Err(H1Error::TrailersTooLarge)
        );
    }

    #[test]
    fn large_body_in_many_chunks() {
        let mut input = Vec::new();
        let mut want = Vec::new();
        for i in 0..100u32 {
            let chunk: Vec<u8> = (0..(i * 37 % 500 + 1)).map(|j| (i + j) as u8).collect();
            input.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            input.extend_from_slice(&chunk);
            input.extend_from_slice(b"\r\n");
            want.extend_from_slice(&chunk);
        }
        input.extend_from_slice(b"0\r\n\r\n");
        for step in [1, 13, 4096, input.len()] {
            let (data, consumed, done) = decode_split(&input, step, LIMITS).unwrap();
            assert_eq!(data, want);
            assert_eq!(consumed, input.len());
            assert!(done);
        }
    }
}
