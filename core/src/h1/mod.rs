//! Our HTTP/1.1 codec, sans-IO: request and response heads, chunked and Content-Length bodies,
//! and writers, for the server listeners and the upstream client.
//!
//! Parsers take byte slices and return [`Parsed::Partial`] when more bytes are needed (like
//! httparse's `Status`); they never read a socket. The rules are strict on purpose: anything two
//! HTTP implementations could frame differently (bare LF, obs-fold, Content-Length together with
//! or repeated beside Transfer-Encoding, unknown codings) is an error, and every error closes the
//! connection.

mod body;
mod chunked;
mod error;
mod head;
mod request;
mod response;

pub use body::{BodyDecoder, ContentLengthBody};
pub use chunked::{
    BodyLimits, ChunkedDecoder, DecodeProgress, DEFAULT_MAX_CHUNK_EXTENSION_BYTES,
    DEFAULT_MAX_TRAILER_BYTES, MAX_CHUNK_SIZE_DIGITS,
};
pub use error::H1Error;
pub use head::{
    HeadLimits, Header, Headers, Parsed, Version, DEFAULT_MAX_HEADERS,
    DEFAULT_MAX_REQUEST_HEAD_BYTES, DEFAULT_MAX_RESPONSE_HEAD_BYTES, DEFAULT_MAX_TARGET_BYTES,
    MAX_HEADERS_CEILING,
};
pub use request::{parse_request_head, BodyFraming, RequestHead, TargetForm};
pub use response::{parse_response_head, ResponseFraming, ResponseHead};
