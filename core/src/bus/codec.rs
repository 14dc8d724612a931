//! The bus's wire encoding: length-prefixed frames with big-endian integers and length-prefixed
//! strings, decoded strictly (every field bounded, no trailing bytes, no unknown type or tag).
//!
//! ```text
//! frame  = length:u32 type:u8 payload     ; length counts type + payload, 1..=MAX_FRAME_BYTES
//! str    = len:u16 UTF-8                   ; bounded per field
//! bytes  = len:u32 octets                  ; bounded per field
//! opt<T> = 0:u8 | 1:u8 T
//! list<T>= count:u16 T*                    ; bounded per field
//! bool   = 0:u8 | 1:u8
//! ```
//!
//! The layout of each frame is in `docs/bus-protocol.md`. Decoding never panics on any input;
//! incomplete input is [`Decoded::Partial`], not an error.

use super::frame::*;
use super::{MAX_DATA_BYTES, MAX_FRAME_BYTES};
use crate::h1::FieldOffsets;
use crate::limits;
use crate::request::{Host, Scheme, TargetUrl};
use crate::worker::{
    AdvertisedCapabilities, MAX_SESSION_BYTES, MAX_WORKER_POOLS, MAX_WORKER_PROFILES,
    MAX_WORKER_TAGS,
};

/// Bytes of the frame header: length and type.
pub const HEADER_BYTES: usize = 5;
/// Longest token a worker may present.
pub const MAX_TOKEN_BYTES: usize = 1024;
/// Longest URL of an assignment (the request URL limit, or a signed receipt URL).
const MAX_URL_BYTES: usize = 16 * 1024;
/// Longest free-text field (messages, reasons).
const MAX_TEXT_BYTES: usize = 4096;
/// Longest short identifier field (ids, codes, names).
const MAX_NAME_BYTES: usize = 256;
/// Most detail entries of a stream error.
const MAX_DETAILS: usize = 32;
/// Most header fields of an assignment or a response head (a proxied request or a response is
/// not bound by the request API's 64).
const MAX_FIELDS: usize = 512;
/// Longest header name.
const MAX_FIELD_NAME_BYTES: usize = 256;
/// Longest header value.
const MAX_FIELD_VALUE_BYTES: usize = 64 * 1024;
/// Largest configuration payload: the admin API's body limit.
const MAX_CONFIG_BYTES: usize = limits::MAX_ADMIN_BODY_BYTES;

/// Why bytes are not a frame. Every variant is a protocol error: the lane is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length prefix is zero.
    #[error("empty frame")]
    Empty,
    /// The length prefix exceeds [`MAX_FRAME_BYTES`].
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(u32),
    /// The type byte names no frame.
    #[error("unknown frame type 0x{0:02x}")]
    UnknownType(u8),
    /// A field runs past the frame's end.
    #[error("{0}: truncated")]
    Truncated(&'static str),
    /// Bytes are left after the last field.
    #[error("{0}: trailing bytes")]
    Trailing(&'static str),
    /// A string field is not UTF-8.
    #[error("{0}: not UTF-8")]
    InvalidUtf8(&'static str),
    /// A field is longer than its limit.
    #[error("{0}: too long")]
    FieldTooLong(&'static str),
    /// A list has more entries than its limit.
    #[error("{0}: too many entries")]
    TooMany(&'static str),
    /// A boolean, option or enum tag has a value outside its range.
    #[error("{0}: invalid tag")]
    InvalidTag(&'static str),
    /// A target URL's parts do not make a URL that would pass as text.
    #[error("{0}: not a valid target URL")]
    InvalidUrl(&'static str),
    /// A connection's first frame is not a `Hello`.
    #[error("first frame of type 0x{0:02x} is not a hello")]
    NotHello(u8),
}

/// What [`decode`] found at the start of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// More bytes are needed: at least this many in total.
    Partial(usize),
    /// A frame and the bytes it took.
    Frame(Frame, usize),
}

/// Bytes read from a lane and not yet decoded. Frames are taken from the front by moving an
/// offset; the bytes before it are dropped once per read ([`FrameBuf::spare`]), so a read
/// that brings thousands of small frames costs one move of what is left, not one move of the
/// whole buffer per frame.
#[derive(Debug, Default)]
pub struct FrameBuf {
    buf: Vec<u8>,
    start: usize,
}

impl FrameBuf {
    /// An empty buffer.
    pub fn new() -> FrameBuf {
        FrameBuf::default()
    }

    /// A buffer holding bytes already read (a lane handed to another core).
    pub fn from_vec(buf: Vec<u8>) -> FrameBuf {
        FrameBuf { buf, start: 0 }
    }

    /// The next whole frame, if one is buffered.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        match decode(self.pending())? {
            Decoded::Frame(f, used) => {
                self.start += used;
                if self.start == self.buf.len() {
                    self.buf.clear();
                    self.start = 0;
                }
                Ok(Some(f))
            }
            Decoded::Partial(_) => Ok(None),
        }
    }

    /// The bytes not decoded yet.
    pub fn pending(&self) -> &[u8] {
        self.buf.get(self.start..).unwrap_or_default()
    }

    /// The buffer to append the next read to, after dropping the bytes of the frames already
    /// taken.
    pub fn spare(&mut self) -> &mut Vec<u8> {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        &mut self.buf
    }

    /// The bytes not decoded yet, as a vector.
    pub fn into_vec(mut self) -> Vec<u8> {
        self.spare();
        self.buf
    }
}

/// The largest `Hello` a valid worker can send, as the frame length prefix counts it (type
/// byte and payload): every field at its limit. A connection's first frame must be a `Hello`
/// no longer than this, which the listener checks from the first five bytes, before
/// buffering the rest (decision 101).
pub const MAX_HELLO_BYTES: usize = 1
    + 2
    + 2
    + (2 + MAX_NAME_BYTES)
    + (2 + MAX_SESSION_BYTES)
    + (2 + MAX_TOKEN_BYTES)
    + 2
    + 2
    + (2 + MAX_WORKER_TAGS * (2 + MAX_NAME_BYTES))
    + 3 * (1 + 2 + MAX_NAME_BYTES)
    + (2 + 3 * (2 + MAX_NAME_BYTES))
    + (2 + MAX_WORKER_POOLS * (2 + MAX_NAME_BYTES))
    + (2 + MAX_WORKER_PROFILES * (2 + MAX_NAME_BYTES))
    + 4;

/// Whether the start of a connection's first frame can be a `Hello`: once its five header
/// bytes are in, the type must be `Hello` and the length at most [`MAX_HELLO_BYTES`]. Fewer
/// bytes pass (more are needed to tell).
pub fn check_first_frame(buf: &[u8]) -> Result<(), FrameError> {
    let Some(&[a, b, c, d, ty]) = buf.get(..HEADER_BYTES) else {
        return Ok(());
    };
    let len = u32::from_be_bytes([a, b, c, d]);
    if ty != 0x01 {
        return Err(FrameError::NotHello(ty));
    }
    if len as usize > MAX_HELLO_BYTES {
        return Err(FrameError::TooLarge(len));
    }
    Ok(())
}

/// Decodes the frame at the start of `buf`.
pub fn decode(buf: &[u8]) -> Result<Decoded, FrameError> {
    let Some(head) = buf.first_chunk::<4>() else {
        return Ok(Decoded::Partial(4));
    };
    let len = u32::from_be_bytes(*head);
    if len == 0 {
        return Err(FrameError::Empty);
    }
    if len as usize > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(len));
    }
    let total = 4 + len as usize;
    let Some(body) = buf.get(4..total) else {
        return Ok(Decoded::Partial(total));
    };
    let Some((&ty, payload)) = body.split_first() else {
        return Err(FrameError::Empty);
    };
    let mut r = Reader {
        buf: payload,
        at: 0,
    };
    let frame = match ty {
        0x01 => Frame::Hello(Box::new(r.hello()?)),
        0x02 => {
            let version = r.u16("welcome.version")?;
            let control_id = r.str("welcome.control_id", MAX_NAME_BYTES)?;
            let core = r.u16("welcome.core")?;
            let cores = r.u16("welcome.cores")?;
            let heartbeat_ms = r.u32("welcome.heartbeat_ms")?;
            // Version 3 appends the lane settings; a version 2 welcome ends here.
            let settings = if version >= 3 {
                Some(LaneSettings {
                    receipt_port: r.u16("welcome.receipt_port")?,
                    proxy_idle_ms: r.u32("welcome.proxy_idle_ms")?,
                })
            } else {
                None
            };
            Frame::Welcome(Welcome {
                version,
                control_id,
                core,
                cores,
                heartbeat_ms,
                settings,
            })
        }
        0x03 => Frame::Reject(Reject {
            reason: r.str("reject.reason", MAX_NAME_BYTES)?,
            message: r.str("reject.message", MAX_TEXT_BYTES)?,
        }),
        0x04 => Frame::Heartbeat(Heartbeat {
            active: r.u32("heartbeat.active")?,
            capacity: r.u32("heartbeat.capacity")?,
        }),
        0x05 => Frame::ConfigPush(ConfigPush {
            version: r.u64("config_push.version")?,
            payload: r.bytes("config_push.payload", MAX_CONFIG_BYTES)?,
        }),
        0x06 => Frame::ConfigApplied {
            version: r.u64("config_applied.version")?,
        },
        ASSIGN_TYPE => Frame::Assign(Box::new(r.assign(false)?)),
        ASSIGN_TARGET_TYPE => Frame::Assign(Box::new(r.assign(true)?)),
        0x11 => Frame::Accept {
            stream: r.u32("accept.stream")?,
        },
        0x12 => Frame::Refuse {
            stream: r.u32("refuse.stream")?,
            reason: r.str("refuse.reason", MAX_NAME_BYTES)?,
        },
        RESPONSE_HEAD_TYPE => Frame::ResponseHead(ResponseHead {
            stream: r.u32("response_head.stream")?,
            status: r.u16("response_head.status")?,
            headers: r.head_fields("response_head.headers", MAX_FIELDS)?,
        }),
        RESPONSE_TYPE => Frame::Response {
            head: ResponseHead {
                stream: r.u32("response.stream")?,
                status: r.u16("response.status")?,
                headers: r.head_fields("response.headers", MAX_FIELDS)?,
            },
            bytes: r.bytes("response.bytes", MAX_DATA_BYTES)?,
        },
        RESPONSE_BLOCK_TYPE => Frame::Response {
            head: ResponseHead {
                stream: r.u32("response.stream")?,
                status: r.u16("response.status")?,
                headers: r.field_block("response.headers")?,
            },
            bytes: r.bytes("response.bytes", MAX_DATA_BYTES)?,
        },
        DATA_TYPE => Frame::Data {
            stream: r.u32("data.stream")?,
            end: r.bool("data.end")?,
            bytes: r.bytes("data.bytes", MAX_DATA_BYTES)?,
        },
        0x15 => Frame::Credit {
            stream: r.u32("credit.stream")?,
            bytes: r.u32("credit.bytes")?,
        },
        0x16 => Frame::StreamError(StreamError {
            stream: r.u32("stream_error.stream")?,
            code: r.str("stream_error.code", MAX_NAME_BYTES)?,
            message: r.str("stream_error.message", MAX_TEXT_BYTES)?,
            timeout_type: r.opt_str("stream_error.timeout_type", MAX_NAME_BYTES)?,
            upstream_status: match r.u8("stream_error.upstream_status")? {
                0 => None,
                1 => Some(r.u16("stream_error.upstream_status")?),
                _ => return Err(FrameError::InvalidTag("stream_error.upstream_status")),
            },
            details: {
                let n = r.count("stream_error.details", MAX_DETAILS)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push((
                        r.str("stream_error.details", MAX_NAME_BYTES)?,
                        r.str("stream_error.details", MAX_TEXT_BYTES)?,
                    ));
                }
                v
            },
        }),
        0x17 => Frame::Cancel {
            stream: r.u32("cancel.stream")?,
        },
        0x20 => Frame::GoAway {
            reason: r.str("goaway.reason", MAX_TEXT_BYTES)?,
        },
        other => return Err(FrameError::UnknownType(other)),
    };
    if r.at != r.buf.len() {
        return Err(FrameError::Trailing(frame.name()));
    }
    Ok(Decoded::Frame(frame, total))
}

/// Whether a field's name and value are within the bus's bounds for them: the one check a
/// field block's writer and reader both make of each span.
fn fits_field_bounds(s: &FieldOffsets) -> bool {
    let len = |(start, end): (u32, u32)| end.saturating_sub(start) as usize;
    len(s.name) <= MAX_FIELD_NAME_BYTES && len(s.value) <= MAX_FIELD_VALUE_BYTES
}

/// The `N` bytes of `buf` at `at`, when they are all there.
#[inline(always)]
fn array_at<const N: usize>(buf: &[u8], at: usize) -> Option<[u8; N]> {
    buf.get(at..at.checked_add(N)?)?.try_into().ok()
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], FrameError> {
        let end = self.at.checked_add(n).ok_or(FrameError::Truncated(field))?;
        let s = self
            .buf
            .get(self.at..end)
            .ok_or(FrameError::Truncated(field))?;
        self.at = end;
        Ok(s)
    }

    /// The next `N` bytes as an array.
    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], FrameError> {
        self.take(N, field)?
            .try_into()
            .map_err(|_| FrameError::Truncated(field))
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, FrameError> {
        let [b] = self.array(field)?;
        Ok(b)
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, FrameError> {
        Ok(u16::from_be_bytes(self.array(field)?))
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, FrameError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, FrameError> {
        Ok(u64::from_be_bytes(self.array(field)?))
    }

    fn bool(&mut self, field: &'static str) -> Result<bool, FrameError> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(FrameError::InvalidTag(field)),
        }
    }

    fn count(&mut self, field: &'static str, max: usize) -> Result<usize, FrameError> {
        let n = self.u16(field)? as usize;
        if n > max {
            return Err(FrameError::TooMany(field));
        }
        Ok(n)
    }

    fn str(&mut self, field: &'static str, max: usize) -> Result<String, FrameError> {
        let b = self.short_slice(field, max)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| FrameError::InvalidUtf8(field))
    }

    fn opt_short_slice(
        &mut self,
        field: &'static str,
        max: usize,
    ) -> Result<Option<&'a [u8]>, FrameError> {
        match self.u8(field)? {
            0 => Ok(None),
            1 => Ok(Some(self.short_slice(field, max)?)),
            _ => Err(FrameError::InvalidTag(field)),
        }
    }

    fn opt_u64(&mut self, field: &'static str) -> Result<Option<u64>, FrameError> {
        match self.u8(field)? {
            0 => Ok(None),
            1 => Ok(Some(self.u64(field)?)),
            _ => Err(FrameError::InvalidTag(field)),
        }
    }

    fn opt_str(&mut self, field: &'static str, max: usize) -> Result<Option<String>, FrameError> {
        self.opt_short_slice(field, max)?
            .map(|b| {
                std::str::from_utf8(b)
                    .map(str::to_owned)
                    .map_err(|_| FrameError::InvalidUtf8(field))
            })
            .transpose()
    }

    fn bytes(&mut self, field: &'static str, max: usize) -> Result<Vec<u8>, FrameError> {
        Ok(self.long_slice(field, max)?.to_vec())
    }

    /// Bytes with a 32-bit length in front, at most `max`, borrowed from the frame.
    fn long_slice(&mut self, field: &'static str, max: usize) -> Result<&'a [u8], FrameError> {
        let n = self.u32(field)? as usize;
        if n > max {
            return Err(FrameError::FieldTooLong(field));
        }
        self.take(n, field)
    }

    /// Bytes with a 16-bit length in front, at most `max`, borrowed from the frame.
    fn short_slice(&mut self, field: &'static str, max: usize) -> Result<&'a [u8], FrameError> {
        let n = self.u16(field)? as usize;
        if n > max {
            return Err(FrameError::FieldTooLong(field));
        }
        self.take(n, field)
    }

    fn strs(
        &mut self,
        field: &'static str,
        max_items: usize,
        max_len: usize,
    ) -> Result<Vec<String>, FrameError> {
        let n = self.count(field, max_items)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.str(field, max_len)?);
        }
        Ok(v)
    }

    fn fields(&mut self, field: &'static str, max: usize) -> Result<Vec<Field>, FrameError> {
        let n = self.count(field, max)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let name = self.short_bytes(field, MAX_FIELD_NAME_BYTES)?;
            let value = self.bytes(field, MAX_FIELD_VALUE_BYTES)?;
            v.push((name, value));
        }
        Ok(v)
    }

    /// Header fields as one copy of their bytes and where each lies in it, with the bounds of
    /// [`Self::fields`].
    fn head_fields(&mut self, field: &'static str, max: usize) -> Result<HeadFields, FrameError> {
        let n = self.count(field, max)?;
        // The fields are walked in a slice of their own, with a local offset: one bounds check
        // per length and per field, where `short_slice` and `long_slice` went through the
        // reader's position and an `Option` per step. Offsets are relative to the fields'
        // start, where the copy of their bytes starts.
        let rest = self.buf.get(self.at..).unwrap_or_default();
        // A frame is far shorter than 4 GiB; a longer one is refused, never wrapped.
        if u32::try_from(rest.len()).is_err() {
            return Err(FrameError::FieldTooLong(field));
        }
        let mut spans = Vec::with_capacity(n);
        let mut at = 0usize;
        for _ in 0..n {
            let [a, b] = array_at(rest, at).ok_or(FrameError::Truncated(field))?;
            let name_len = usize::from(u16::from_be_bytes([a, b]));
            if name_len > MAX_FIELD_NAME_BYTES {
                return Err(FrameError::FieldTooLong(field));
            }
            let name_at = at + 2;
            let [a, b, c, d] =
                array_at(rest, name_at + name_len).ok_or(FrameError::Truncated(field))?;
            let value_len = u32::from_be_bytes([a, b, c, d]) as usize;
            if value_len > MAX_FIELD_VALUE_BYTES {
                return Err(FrameError::FieldTooLong(field));
            }
            let value_at = name_at + name_len + 4;
            at = value_at + value_len;
            if at > rest.len() {
                return Err(FrameError::Truncated(field));
            }
            // Each offset is at most `rest.len()`, which fits in 32 bits (checked above).
            spans.push(FieldOffsets {
                name: (name_at as u32, (name_at + name_len) as u32),
                value: (value_at as u32, at as u32),
            });
        }
        let all = bytes::Bytes::copy_from_slice(rest.get(..at).unwrap_or_default());
        self.at += at;
        HeadFields::in_buffer(all, spans).ok_or(FrameError::Truncated(field))
    }

    /// Fields written by `write_field_block`: their count, the offsets of each name and value
    /// in the buffer they were written from, where the block starts in it, and the block. One
    /// copy of the block; each offset pair checked to lie in it and to hold no more than a
    /// field's bound.
    fn field_block(&mut self, field: &'static str) -> Result<HeadFields, FrameError> {
        let n = self.count(field, MAX_FIELDS)?;
        let records = self.take(n.saturating_mul(16), field)?;
        let base = self.u32(field)?;
        let block = self.long_slice(field, MAX_FRAME_BYTES)?;
        let mut spans = Vec::with_capacity(n);
        for record in records.chunks_exact(16) {
            let r = u128::from_be_bytes(record.try_into().unwrap_or_default());
            // Each offset as it lies in the block; one before the block wraps to far past it
            // and is refused below.
            let at = |shift: u32| ((r >> shift) as u32).wrapping_sub(base);
            let s = FieldOffsets {
                name: (at(96), at(64)),
                value: (at(32), at(0)),
            };
            if !s.is_within(block.len()) {
                return Err(FrameError::Truncated(field));
            }
            if !fits_field_bounds(&s) {
                return Err(FrameError::FieldTooLong(field));
            }
            spans.push(s);
        }
        // Each span was checked against the block's length above.
        Ok(HeadFields::checked(
            bytes::Bytes::copy_from_slice(block),
            spans,
        ))
    }

    fn short_bytes(&mut self, field: &'static str, max: usize) -> Result<Vec<u8>, FrameError> {
        Ok(self.short_slice(field, max)?.to_vec())
    }

    fn hello(&mut self) -> Result<Hello, FrameError> {
        Ok(Hello {
            version_min: self.u16("hello.version_min")?,
            version_max: self.u16("hello.version_max")?,
            worker_id: self.str("hello.worker_id", MAX_NAME_BYTES)?,
            session: self.str("hello.session", MAX_SESSION_BYTES)?,
            token: {
                let n = self.u16("hello.token")? as usize;
                if n > MAX_TOKEN_BYTES {
                    return Err(FrameError::FieldTooLong("hello.token"));
                }
                self.take(n, "hello.token")?.to_vec()
            },
            lane: self.u16("hello.lane")?,
            lanes: self.u16("hello.lanes")?,
            capabilities: AdvertisedCapabilities {
                tags: self.strs("hello.tags", MAX_WORKER_TAGS, MAX_NAME_BYTES)?,
                country: self.opt_str("hello.country", MAX_NAME_BYTES)?,
                region: self.opt_str("hello.region", MAX_NAME_BYTES)?,
                ip_type: self.opt_str("hello.ip_type", MAX_NAME_BYTES)?,
                ingress: self.strs("hello.ingress", 3, MAX_NAME_BYTES)?,
                pools: self.strs("hello.pools", MAX_WORKER_POOLS, MAX_NAME_BYTES)?,
                fingerprint_profiles: self.strs(
                    "hello.fingerprint_profiles",
                    MAX_WORKER_PROFILES,
                    MAX_NAME_BYTES,
                )?,
                capacity: self.u32("hello.capacity")?,
            },
        })
    }

    /// An `Assign`; `parts`: its URL comes as parts (version 6).
    fn assign(&mut self, parts: bool) -> Result<Assign, FrameError> {
        // The strings go into one buffer, sized for what is left of the frame (at most the
        // longest URL and a little more): one allocation for all of them.
        let room = self
            .buf
            .len()
            .saturating_sub(self.at)
            .min(MAX_URL_BYTES + 512);
        let mut text = AssignBytes::with_capacity(room);
        let stream = self.u32("assign.stream")?;
        text.push(Some(self.short_slice("assign.request_id", MAX_NAME_BYTES)?));
        text.push(Some(
            self.short_slice("assign.deployment_id", MAX_NAME_BYTES)?,
        ));
        let deadline_ms = self.u32("assign.deadline_ms")?;
        let is_replayable = self.bool("assign.replayable")?;
        let ingress = match self.u8("assign.ingress")? {
            i @ 0..=2 => i,
            _ => return Err(FrameError::InvalidTag("assign.ingress")),
        };
        text.push(Some(self.short_slice("assign.method", MAX_NAME_BYTES)?));
        let target = if parts {
            text.push(Some(b""));
            Some(self.target()?)
        } else {
            text.push(Some(self.short_slice("assign.url", MAX_URL_BYTES)?));
            None
        };
        let headers = self.fields("assign.headers", MAX_FIELDS)?;
        let body = match self.u8("assign.body")? {
            0 => BodySource::Empty,
            1 => BodySource::Inline {
                len: self.u64("assign.body.len")?,
            },
            2 => BodySource::Receipt {
                url: self.str("assign.body.url", MAX_URL_BYTES)?,
                len: self.u64("assign.body.len")?,
            },
            3 => BodySource::Tunnel,
            4 => BodySource::Stream {
                len: self.opt_u64("assign.body.len")?,
            },
            _ => return Err(FrameError::InvalidTag("assign.body")),
        };
        text.push(Some(self.short_slice("assign.pool", MAX_NAME_BYTES)?));
        text.push(self.opt_short_slice("assign.provider_session", MAX_NAME_BYTES)?);
        text.push(self.opt_short_slice("assign.proxy_username", MAX_TEXT_BYTES)?);
        text.push(self.opt_short_slice("assign.fingerprint_profile", MAX_NAME_BYTES)?);
        let numbers = AssignNumbers {
            stream,
            deadline_ms,
            is_replayable,
            ingress,
            max_response_bytes: self.u64("assign.max_response_bytes")?,
            window: self.u32("assign.window")?,
        };
        let text = text.into_text().map_err(|i| {
            FrameError::InvalidUtf8(ASSIGN_TEXT_FIELDS.get(i).copied().unwrap_or("assign"))
        })?;
        Ok(Assign::from_parts(numbers, headers, body, target, text))
    }

    /// A target URL written by `write_target`, each part checked as a URL's would be.
    fn target(&mut self) -> Result<TargetUrl, FrameError> {
        const FIELD: &str = "assign.target";
        let scheme = match self.u8(FIELD)? {
            0 => Scheme::Http,
            1 => Scheme::Https,
            _ => return Err(FrameError::InvalidTag(FIELD)),
        };
        let host = match self.u8(FIELD)? {
            0 => {
                let name = self.short_slice(FIELD, MAX_NAME_BYTES)?;
                let name = std::str::from_utf8(name).map_err(|_| FrameError::InvalidUtf8(FIELD))?;
                Host::Domain(name.into())
            }
            1 => Host::V4(self.array::<4>(FIELD)?.into()),
            2 => Host::V6(self.array::<16>(FIELD)?.into()),
            _ => return Err(FrameError::InvalidTag(FIELD)),
        };
        let port = self.u16(FIELD)?;
        let path = self.short_slice(FIELD, MAX_URL_BYTES)?;
        let path = std::str::from_utf8(path).map_err(|_| FrameError::InvalidUtf8(FIELD))?;
        TargetUrl::from_parts(scheme, host, port, path).map_err(|_| FrameError::InvalidUrl(FIELD))
    }
}

/// Why a frame cannot be encoded: a field exceeds what its length prefix or limit allows. The
/// sender checks its own frames so that it never writes one the peer must reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0}: too long to encode")]
pub struct EncodeError(pub &'static str);

/// Checks that a request head fits the bounds of an `Assign` before anything is assigned: the
/// error names the first field over its bound and the bound, as a message for the client
/// (the forward proxy relays heads that HTTP/1.1 itself does not bound).
pub fn check_request_head<N: AsRef<[u8]>, V: AsRef<[u8]>>(
    method: &str,
    url: &str,
    headers: &[(N, V)],
) -> Result<(), String> {
    if method.len() > MAX_NAME_BYTES {
        return Err(format!(
            "the method exceeds the worker bus limit of {MAX_NAME_BYTES} bytes"
        ));
    }
    if url.len() > MAX_URL_BYTES {
        return Err(format!(
            "the request target exceeds the worker bus limit of {MAX_URL_BYTES} bytes"
        ));
    }
    if headers.len() > MAX_FIELDS {
        return Err(format!(
            "{} header fields exceed the worker bus limit of {MAX_FIELDS} fields",
            headers.len()
        ));
    }
    for (name, value) in headers {
        let (name, value) = (name.as_ref(), value.as_ref());
        if name.len() > MAX_FIELD_NAME_BYTES {
            return Err(format!(
                "a header field name of {} bytes exceeds the worker bus limit of \
                 {MAX_FIELD_NAME_BYTES} bytes",
                name.len()
            ));
        }
        if value.len() > MAX_FIELD_VALUE_BYTES {
            return Err(format!(
                "the value of header field {} ({} bytes) exceeds the worker bus limit of \
                 {MAX_FIELD_VALUE_BYTES} bytes",
                String::from_utf8_lossy(name),
                value.len()
            ));
        }
    }
    Ok(())
}

/// Appends the encoding of `frame` to `out`. On error `out` is left as it was.
pub fn encode(frame: &Frame, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    framed(out, frame.type_byte(), frame.name(), |w| {
        encode_body(frame, w)
    })
}

/// Encodes an `Assign` frame from borrowed parts: the same bytes as [`encode`] of
/// `Frame::Assign` with these fields (the control's per-request path). On error `out` is as it
/// was.
pub fn encode_assign<N: AsRef<[u8]>, V: AsRef<[u8]>>(
    a: &AssignRef<'_, N, V>,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    let type_byte = match a.url {
        AssignUrl::Parts(_) => ASSIGN_TARGET_TYPE,
        AssignUrl::Text(_) => ASSIGN_TYPE,
    };
    framed(out, type_byte, "assign", |w| write_assign(w, a))
}

fn write_assign<N: AsRef<[u8]>, V: AsRef<[u8]>>(
    w: &mut Writer<'_>,
    a: &AssignRef<'_, N, V>,
) -> Result<(), EncodeError> {
    w.u32(a.stream);
    w.str(a.request_id, MAX_NAME_BYTES, "assign.request_id")?;
    w.str(a.deployment_id, MAX_NAME_BYTES, "assign.deployment_id")?;
    w.u32(a.deadline_ms);
    w.u8(u8::from(a.is_replayable));
    if a.ingress > 2 {
        return Err(EncodeError("assign.ingress"));
    }
    w.u8(a.ingress);
    w.str(a.method, MAX_NAME_BYTES, "assign.method")?;
    match a.url {
        AssignUrl::Parts(t) => write_target(w, t)?,
        AssignUrl::Text(url) => w.str(url, MAX_URL_BYTES, "assign.url")?,
    }
    w.fields(a.headers, MAX_FIELDS, "assign.headers")?;
    match a.body {
        BodySource::Empty => w.u8(0),
        BodySource::Inline { len } => {
            w.u8(1);
            w.u64(*len);
        }
        BodySource::Receipt { url, len } => {
            w.u8(2);
            w.str(url, MAX_URL_BYTES, "assign.body.url")?;
            w.u64(*len);
        }
        BodySource::Tunnel => w.u8(3),
        BodySource::Stream { len } => {
            w.u8(4);
            match len {
                None => w.u8(0),
                Some(n) => {
                    w.u8(1);
                    w.u64(*n);
                }
            }
        }
    }
    w.str(a.pool, MAX_NAME_BYTES, "assign.pool")?;
    w.opt_str(a.provider_session, "assign.provider_session")?;
    w.opt_text(a.proxy_username, "assign.proxy_username")?;
    w.opt_str(a.fingerprint_profile, "assign.fingerprint_profile")?;
    w.u64(a.max_response_bytes);
    w.u32(a.window);
    Ok(())
}

/// A target URL as parts (version 6, decision 131): the scheme (0 `http`, 1 `https`), the
/// host (0 and a name, 1 and four bytes of IPv4, 2 and sixteen bytes of IPv6), the port, and
/// the path and query.
fn write_target(w: &mut Writer<'_>, t: &TargetUrl) -> Result<(), EncodeError> {
    w.u8(match t.scheme {
        Scheme::Http => 0,
        Scheme::Https => 1,
    });
    match &t.host {
        Host::Domain(name) => {
            w.u8(0);
            w.str(name, MAX_NAME_BYTES, "assign.target.host")?;
        }
        Host::V4(a) => {
            w.u8(1);
            w.out.extend_from_slice(&a.octets());
        }
        Host::V6(a) => {
            w.u8(2);
            w.out.extend_from_slice(&a.octets());
        }
    }
    w.u16(t.port);
    w.str(&t.path_and_query, MAX_URL_BYTES, "assign.target.path")
}

/// Encodes a `ResponseHead` frame from borrowed fields: the same bytes as [`encode`] of
/// `Frame::ResponseHead` with these fields, without first copying each name and value into a
/// `Vec` of its own (the worker's answer heads, a per-request path). On error `out` is as it
/// was.
pub fn encode_response_head<N: AsRef<[u8]>, V: AsRef<[u8]>>(
    stream: StreamId,
    status: u16,
    headers: &[(N, V)],
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    let fields = headers.iter().map(|(n, v)| (n.as_ref(), v.as_ref()));
    encode_response_head_of(stream, status, fields, out)
}

/// [`encode_response_head`] of fields given as (name, value) slices, as a received head
/// yields them.
pub fn encode_response_head_of<'a>(
    stream: StreamId,
    status: u16,
    headers: impl ExactSizeIterator<Item = (&'a [u8], &'a [u8])>,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    framed(out, RESPONSE_HEAD_TYPE, "response_head", |w| {
        w.u32(stream);
        w.u16(status);
        w.fields_of(headers, MAX_FIELDS, "response_head.headers")
    })
}

/// Encodes a `Response` frame (version 5) from borrowed fields and body: the same bytes as
/// [`encode`] of `Frame::Response` with them, without copying each field and the body into
/// `Vec`s of their own first (the worker's whole small answers, a per-request path). On
/// error `out` is as it was.
pub fn encode_response_of<'a>(
    stream: StreamId,
    status: u16,
    headers: impl ExactSizeIterator<Item = (&'a [u8], &'a [u8])>,
    bytes: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    framed(out, RESPONSE_TYPE, "response", |w| {
        w.u32(stream);
        w.u16(status);
        w.fields_of(headers, MAX_FIELDS, "response.headers")?;
        w.bytes(bytes, MAX_DATA_BYTES, "response.bytes")
    })
}

/// Encodes a `Response` frame (version 6, decision 131) whose fields go as one block: the
/// bytes of `buf` from the first field to the last, once, and the offsets of each name and
/// value in it. Decodes to the same [`Frame::Response`] as [`encode_response_of`] of those
/// fields; the worker writes a head it parsed without a length and a copy per name and
/// value. Every span must lie in `buf`. On error `out` is as it was.
pub fn encode_response_block(
    stream: StreamId,
    status: u16,
    buf: &[u8],
    spans: &[FieldOffsets],
    bytes: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    framed(out, RESPONSE_BLOCK_TYPE, "response", |w| {
        w.u32(stream);
        w.u16(status);
        write_field_block(w, buf, spans, "response.headers")?;
        w.bytes(bytes, MAX_DATA_BYTES, "response.bytes")
    })
}

fn write_field_block(
    w: &mut Writer<'_>,
    buf: &[u8],
    spans: &[FieldOffsets],
    field: &'static str,
) -> Result<(), EncodeError> {
    if spans.len() > MAX_FIELDS {
        return Err(EncodeError(field));
    }
    w.u16(spans.len() as u16);
    // One pass: each span checked and written as it lies in `buf` (16 bytes, one store),
    // then where the block starts in `buf`, then the block.
    w.out.reserve(spans.len() * 16);
    let (mut lo, mut hi) = (u32::MAX, 0u32);
    for s in spans {
        if !s.is_within(buf.len()) || !fits_field_bounds(s) {
            return Err(EncodeError(field));
        }
        lo = lo.min(s.name.0).min(s.value.0);
        hi = hi.max(s.name.1).max(s.value.1);
        let record = u128::from(s.name.0) << 96
            | u128::from(s.name.1) << 64
            | u128::from(s.value.0) << 32
            | u128::from(s.value.1);
        w.out.extend_from_slice(&record.to_be_bytes());
    }
    let lo = lo.min(hi);
    let block = buf
        .get(lo as usize..hi as usize)
        .ok_or(EncodeError(field))?;
    w.u32(lo);
    w.bytes(block, MAX_FRAME_BYTES, field)
}

/// Encodes a `Data` frame of borrowed bytes: the same bytes as [`encode`] of `Frame::Data`,
/// without first copying `bytes` into a `Vec` of its own (the worker's response bodies, a
/// per-request path). On error `out` is as it was.
pub fn encode_data(
    stream: StreamId,
    bytes: &[u8],
    end: bool,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    framed(out, DATA_TYPE, "data", |w| {
        write_data(w, stream, bytes, end)
    })
}

fn write_data(
    w: &mut Writer<'_>,
    stream: StreamId,
    bytes: &[u8],
    end: bool,
) -> Result<(), EncodeError> {
    w.u32(stream);
    w.u8(u8::from(end));
    w.bytes(bytes, MAX_DATA_BYTES, "data.bytes")
}

/// Appends one frame to `out`: four bytes reserved for the length, the type byte, what `body`
/// writes, then the length in the reserved bytes. On error `out` is left as it was.
fn framed(
    out: &mut Vec<u8>,
    type_byte: u8,
    name: &'static str,
    body: impl FnOnce(&mut Writer<'_>) -> Result<(), EncodeError>,
) -> Result<(), EncodeError> {
    let start = out.len();
    out.extend_from_slice(&[0, 0, 0, 0, type_byte]);
    let result = body(&mut Writer { out: &mut *out }).and_then(|()| {
        let len = out.len() - start - 4;
        if len > MAX_FRAME_BYTES {
            return Err(EncodeError(name));
        }
        out.get_mut(start..start + 4)
            .ok_or(EncodeError(name))?
            .copy_from_slice(&(len as u32).to_be_bytes());
        Ok(())
    });
    if result.is_err() {
        out.truncate(start);
    }
    result
}

/// The fields of `frame`, after its type byte.
fn encode_body(frame: &Frame, w: &mut Writer<'_>) -> Result<(), EncodeError> {
    match frame {
        Frame::Hello(h) => {
            w.u16(h.version_min);
            w.u16(h.version_max);
            w.str(&h.worker_id, MAX_NAME_BYTES, "hello.worker_id")?;
            w.str(&h.session, MAX_SESSION_BYTES, "hello.session")?;
            w.short_bytes(&h.token, MAX_TOKEN_BYTES, "hello.token")?;
            w.u16(h.lane);
            w.u16(h.lanes);
            let c = &h.capabilities;
            w.strs(&c.tags, MAX_WORKER_TAGS, "hello.tags")?;
            w.opt_str(c.country.as_deref(), "hello.country")?;
            w.opt_str(c.region.as_deref(), "hello.region")?;
            w.opt_str(c.ip_type.as_deref(), "hello.ip_type")?;
            w.strs(&c.ingress, 3, "hello.ingress")?;
            w.strs(&c.pools, MAX_WORKER_POOLS, "hello.pools")?;
            w.strs(
                &c.fingerprint_profiles,
                MAX_WORKER_PROFILES,
                "hello.fingerprint_profiles",
            )?;
            w.u32(c.capacity);
        }
        Frame::Welcome(x) => {
            w.u16(x.version);
            w.str(&x.control_id, MAX_NAME_BYTES, "welcome.control_id")?;
            w.u16(x.core);
            w.u16(x.cores);
            w.u32(x.heartbeat_ms);
            match (x.version >= 3, &x.settings) {
                (true, Some(l)) => {
                    w.u16(l.receipt_port);
                    w.u32(l.proxy_idle_ms);
                }
                (false, None) => {}
                // The settings travel with version 3 and later only.
                _ => return Err(EncodeError("welcome.settings")),
            }
        }
        Frame::Reject(x) => {
            w.str(&x.reason, MAX_NAME_BYTES, "reject.reason")?;
            w.str(&x.message, MAX_TEXT_BYTES, "reject.message")?;
        }
        Frame::Heartbeat(x) => {
            w.u32(x.active);
            w.u32(x.capacity);
        }
        Frame::ConfigPush(x) => {
            w.u64(x.version);
            w.bytes(&x.payload, MAX_CONFIG_BYTES, "config_push.payload")?;
        }
        Frame::ConfigApplied { version } => w.u64(*version),
        Frame::Assign(a) => write_assign(w, &a.borrowed())?,
        Frame::Accept { stream } | Frame::Cancel { stream } => w.u32(*stream),
        Frame::Refuse { stream, reason } => {
            w.u32(*stream);
            w.str(reason, MAX_NAME_BYTES, "refuse.reason")?;
        }
        Frame::ResponseHead(h) => {
            w.u32(h.stream);
            w.u16(h.status);
            w.fields_of(h.headers.iter(), MAX_FIELDS, "response_head.headers")?;
        }
        Frame::Response { head, bytes } => {
            w.u32(head.stream);
            w.u16(head.status);
            w.fields_of(head.headers.iter(), MAX_FIELDS, "response.headers")?;
            w.bytes(bytes, MAX_DATA_BYTES, "response.bytes")?;
        }
        Frame::Data { stream, bytes, end } => write_data(w, *stream, bytes, *end)?,
        Frame::Credit { stream, bytes } => {
            w.u32(*stream);
            w.u32(*bytes);
        }
        Frame::StreamError(e) => {
            w.u32(e.stream);
            w.str(&e.code, MAX_NAME_BYTES, "stream_error.code")?;
            w.str(&e.message, MAX_TEXT_BYTES, "stream_error.message")?;
            w.opt_str(e.timeout_type.as_deref(), "stream_error.timeout_type")?;
            match e.upstream_status {
                None => w.u8(0),
                Some(s) => {
                    w.u8(1);
                    w.u16(s);
                }
            }
            if e.details.len() > MAX_DETAILS {
                return Err(EncodeError("stream_error.details"));
            }
            w.u16(e.details.len() as u16);
            for (k, v) in &e.details {
                w.str(k, MAX_NAME_BYTES, "stream_error.details")?;
                w.str(v, MAX_TEXT_BYTES, "stream_error.details")?;
            }
        }
        Frame::GoAway { reason } => w.str(reason, MAX_TEXT_BYTES, "goaway.reason")?,
    }
    Ok(())
}

struct Writer<'a> {
    out: &'a mut Vec<u8>,
}

impl Writer<'_> {
    fn u8(&mut self, v: u8) {
        self.out.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.out.extend_from_slice(&v.to_be_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.out.extend_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.out.extend_from_slice(&v.to_be_bytes());
    }
    fn short_bytes(
        &mut self,
        b: &[u8],
        max: usize,
        field: &'static str,
    ) -> Result<(), EncodeError> {
        if b.len() > max || b.len() > u16::MAX as usize {
            return Err(EncodeError(field));
        }
        self.u16(b.len() as u16);
        self.out.extend_from_slice(b);
        Ok(())
    }
    fn str(&mut self, s: &str, max: usize, field: &'static str) -> Result<(), EncodeError> {
        self.short_bytes(s.as_bytes(), max, field)
    }
    fn opt_str(&mut self, s: Option<&str>, field: &'static str) -> Result<(), EncodeError> {
        self.opt_bounded(s, MAX_NAME_BYTES, field)
    }
    fn opt_text(&mut self, s: Option<&str>, field: &'static str) -> Result<(), EncodeError> {
        self.opt_bounded(s, MAX_TEXT_BYTES, field)
    }
    fn opt_bounded(
        &mut self,
        s: Option<&str>,
        max: usize,
        field: &'static str,
    ) -> Result<(), EncodeError> {
        match s {
            None => {
                self.u8(0);
                Ok(())
            }
            Some(s) => {
                self.u8(1);
                self.str(s, max, field)
            }
        }
    }
    fn bytes(&mut self, b: &[u8], max: usize, field: &'static str) -> Result<(), EncodeError> {
        if b.len() > max {
            return Err(EncodeError(field));
        }
        self.u32(b.len() as u32);
        self.out.extend_from_slice(b);
        Ok(())
    }
    fn strs(&mut self, v: &[String], max: usize, field: &'static str) -> Result<(), EncodeError> {
        if v.len() > max {
            return Err(EncodeError(field));
        }
        self.u16(v.len() as u16);
        for s in v {
            self.str(s, MAX_NAME_BYTES, field)?;
        }
        Ok(())
    }
    fn fields<N: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        v: &[(N, V)],
        max: usize,
        field: &'static str,
    ) -> Result<(), EncodeError> {
        self.fields_of(v.iter().map(|(n, v)| (n.as_ref(), v.as_ref())), max, field)
    }

    fn fields_of<'f>(
        &mut self,
        v: impl ExactSizeIterator<Item = (&'f [u8], &'f [u8])>,
        max: usize,
        field: &'static str,
    ) -> Result<(), EncodeError> {
        if v.len() > max {
            return Err(EncodeError(field));
        }
        self.u16(v.len() as u16);
        for (n, val) in v {
            self.short_bytes(n, MAX_FIELD_NAME_BYTES, field)?;
            self.bytes(val, MAX_FIELD_VALUE_BYTES, field)?;
        }
        Ok(())
    }
}
