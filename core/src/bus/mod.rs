//! The worker bus: the binary frame protocol between a control and its remote workers, sans-IO.
//! `frame.rs` is the data, `codec.rs` the wire encoding, `lane.rs` the order of frames on one
//! lane. The transport (sockets, TLS, lanes per core) lives in the io crate. The protocol is
//! described for implementers in `docs/bus-protocol.md`.

mod codec;
mod frame;
mod lane;

pub use codec::{
    check_first_frame, check_request_head, decode, encode, encode_assign, encode_data,
    encode_response_block, encode_response_head, encode_response_head_of, encode_response_of,
    Decoded, EncodeError, FrameBuf, FrameError, HEADER_BYTES, MAX_HELLO_BYTES, MAX_TOKEN_BYTES,
};
pub use frame::{
    Assign, AssignRef, AssignUrl, BodySource, ConfigPush, Field, Frame, HeadFields, Heartbeat,
    Hello, LaneSettings, Reject, ResponseHead, Sender, StreamError, StreamId, Welcome,
};
pub use lane::{negotiate, ControlLane, Verdict, Violation, WorkerLane, MAX_STREAMS_PER_LANE};

/// Most bytes one side may allow the other to send on one direction of a stream: the window
/// of `Assign` (or the upload window) plus every `Credit`, minus the bytes sent. A `Credit`
/// that would raise the window beyond it, or an `Assign.window` above it, is a protocol
/// violation, so a peer cannot make the other side buffer without limit.
pub const MAX_WINDOW: u64 = 16 * 1024 * 1024;

/// The protocol version this build speaks best. Version 3 adds the lane settings of
/// `Welcome` (decision 068). Version 4 changes no frame: heartbeats go on lane 0 only, and
/// the other lanes' liveness is the kernel's TCP keepalive (decision 118). Version 5 adds the
/// `Response` frame, a whole small answer in one frame (decision 123). Version 6 adds the
/// `Assign` whose target URL comes as parts, so that the worker does not parse it again, and
/// the `Response` whose fields come as one block (decision 131). A build also speaks versions 2 to 5 with a peer that knows no better.
pub const PROTOCOL_VERSION: u16 = 6;
/// The first version whose worker may send a [`Frame::Response`] with its fields as one block
/// (`encode_response_block`; decision 131).
pub const FIELD_BLOCK_VERSION: u16 = 6;
/// The first version whose control may send an `Assign` with its target URL as parts
/// ([`AssignUrl::Parts`]; decision 131).
pub const TARGET_PARTS_VERSION: u16 = 6;
/// The first version whose worker may answer with [`Frame::Response`] (decision 123).
pub const RESPONSE_FRAME_VERSION: u16 = 5;
/// The first version in which only lane 0 carries heartbeats (decision 118).
pub const LANE_ZERO_HEARTBEATS_VERSION: u16 = 4;

/// Whether a lane of `index` sends (worker) and must receive (control) heartbeats under the
/// negotiated `version`.
pub fn lane_heartbeats(version: u16, index: u16) -> bool {
    index == 0 || version < LANE_ZERO_HEARTBEATS_VERSION
}
/// The oldest protocol version this build still speaks. Version 2 added the streamed body
/// kind, the upstream proxy username of `Assign` and tunnel half-close; a version 1 peer is
/// refused with `unsupported_version` rather than misread.
pub const PROTOCOL_VERSION_MIN: u16 = 2;
/// How many request-body or tunnel bytes the control may send on a stream before the worker
/// grants more with `Credit` (streamed and tunnel bodies; an inline body is sent whole).
pub const INITIAL_UPLOAD_WINDOW: u32 = MAX_DATA_BYTES as u32;
/// Most payload bytes of one `Data` frame.
pub const MAX_DATA_BYTES: usize = 256 * 1024;
/// Largest frame (type byte and payload): a configuration push of the admin API's largest
/// snapshot, plus room for its fields.
pub const MAX_FRAME_BYTES: usize = crate::limits::MAX_ADMIN_BODY_BYTES + 64 * 1024;

#[cfg(test)]
mod tests;
