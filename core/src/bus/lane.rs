//! The order of frames on one lane, as two state machines: [`ControlLane`] checks what a worker
//! sends, [`WorkerLane`] what a control sends. Both are told about the frames their own side
//! sends (`sent`), because those open streams and grant credit. A frame out of order is a
//! [`Violation`]: the IO layer answers it with `protocol_error` and closes the lane.
//!
//! Races are not violations: after a `Cancel` the worker may still send frames of that stream
//! until it has seen the cancel, a worker may see `Cancel` or `Credit` for a stream it has
//! just finished, and a control may see `Credit` for a direction it has just ended. Those
//! frames are dropped ([`Verdict::Ignore`]).
//!
//! Each direction of a stream ends with `Data end`. A stream whose control direction carries
//! a streamed body or tunnel bytes ends when both directions have ended (or on `StreamError`,
//! `Refuse` or `Cancel`); otherwise the worker's end ends it.

use super::frame::{Assign, BodySource, Frame, Sender, StreamId};
use super::{INITIAL_UPLOAD_WINDOW, MAX_WINDOW, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN};
use crate::{FastMap, FastSet};

/// Most streams open at once on one lane.
pub const MAX_STREAMS_PER_LANE: usize = 65_536;
/// Streams the control cancelled whose end it still waits for, per lane.
const MAX_CANCELLED: usize = 65_536;

/// A frame that breaks the protocol: which frame, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{frame}: {reason}")]
pub struct Violation {
    /// The frame's name.
    pub frame: &'static str,
    /// Why it is out of order.
    pub reason: &'static str,
}

/// What to do with a frame that is in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Handle it.
    Deliver,
    /// Drop it: it belongs to a stream this side has already given up.
    Ignore,
}

fn violation(frame: &Frame, reason: &'static str) -> Violation {
    Violation {
        frame: frame.name(),
        reason,
    }
}

/// Chooses the protocol version for a worker that speaks `min..=max`, or `None` when the ranges
/// do not meet (the control rejects the lane with `unsupported_version`).
pub fn negotiate(min: u16, max: u16) -> Option<u16> {
    let v = max.min(PROTOCOL_VERSION);
    (min <= max && v >= min && v >= PROTOCOL_VERSION_MIN).then_some(v)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ControlStream {
    /// Assigned; waiting for accept or refuse.
    Assigned { window: u64 },
    /// Accepted; waiting for the response head.
    Accepted { window: u64 },
    /// Head received; body data until `end`.
    Receiving { window: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitHello,
    AwaitAdmission,
    Open,
    Closed,
}

/// The control's view of one lane.
#[derive(Debug)]
pub struct ControlLane {
    phase: Phase,
    streams: FastMap<StreamId, ControlStream>,
    cancelled: FastSet<StreamId>,
    /// Streamed and tunnel streams whose control → worker direction has not ended.
    up_open: FastSet<StreamId>,
    /// Of those, the ones whose worker → control direction has ended: the worker may still
    /// grant credit (or fail the stream) until the control ends its direction.
    half: FastSet<StreamId>,
    /// Of the streamed and tunnel streams, the bytes the control may still send (the upload
    /// window plus the worker's credit, minus what it sent).
    sendable: FastMap<StreamId, u64>,
    next_stream: StreamId,
}

impl Default for ControlLane {
    fn default() -> Self {
        ControlLane::new()
    }
}

impl ControlLane {
    /// A lane that waits for `Hello`.
    pub fn new() -> ControlLane {
        ControlLane {
            phase: Phase::AwaitHello,
            streams: FastMap::default(),
            cancelled: FastSet::default(),
            up_open: FastSet::default(),
            half: FastSet::default(),
            sendable: FastMap::default(),
            next_stream: 1,
        }
    }

    /// Whether the lane was admitted and is not closed.
    pub fn is_open(&self) -> bool {
        self.phase == Phase::Open
    }

    /// Streams in flight.
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// A fresh stream id for the next assignment, or `None` when the lane is full.
    pub fn next_stream(&mut self) -> Option<StreamId> {
        if self.streams.len() >= MAX_STREAMS_PER_LANE {
            return None;
        }
        // Ids wrap after 2^32 streams; the ones in use are skipped.
        for _ in 0..=MAX_STREAMS_PER_LANE {
            let id = self.next_stream;
            self.next_stream = self.next_stream.wrapping_add(1).max(1);
            if !self.streams.contains_key(&id)
                && !self.cancelled.contains(&id)
                && !self.up_open.contains(&id)
            {
                return Some(id);
            }
        }
        None
    }

    /// The control admitted the lane (it sent `Welcome`).
    pub fn admit(&mut self) {
        if self.phase == Phase::AwaitAdmission {
            self.phase = Phase::Open;
        }
    }

    /// The lane is closed: every stream in flight is failed by the caller
    /// (`worker_disconnected`). Returns their ids.
    pub fn close(&mut self) -> Vec<StreamId> {
        self.phase = Phase::Closed;
        self.cancelled.clear();
        self.half.clear();
        self.up_open.clear();
        self.sendable.clear();
        self.streams.drain().map(|(id, _)| id).collect()
    }

    /// Whether the worker ended its direction of a stream whose control direction is still
    /// open (a tunnel or a streamed body): the stream lives on until the control ends it.
    pub fn is_half_open(&self, stream: StreamId) -> bool {
        self.half.contains(&stream)
    }

    /// Notes an `Assign` the control wrote from borrowed parts (`encode_assign`): what
    /// [`ControlLane::sent`] notes for a `Frame::Assign` with these fields.
    pub fn sent_assign(&mut self, stream: StreamId, window: u32, body: &BodySource) {
        self.streams.insert(
            stream,
            ControlStream::Assigned {
                window: u64::from(window),
            },
        );
        if matches!(body, BodySource::Tunnel | BodySource::Stream { .. }) {
            self.up_open.insert(stream);
            self.sendable
                .insert(stream, u64::from(INITIAL_UPLOAD_WINDOW));
        }
    }

    /// Records a frame the control sends.
    pub fn sent(&mut self, frame: &Frame) {
        match frame {
            Frame::Assign(a) => self.sent_assign(a.stream, a.window, &a.body),
            Frame::Data { stream, bytes, end } => {
                if let Some(w) = self.sendable.get_mut(stream) {
                    *w = w.saturating_sub(bytes.len() as u64);
                }
                if *end {
                    self.up_open.remove(stream);
                    self.half.remove(stream);
                    if !self.streams.contains_key(stream) {
                        self.sendable.remove(stream);
                    }
                }
            }
            Frame::Credit { stream, bytes } => {
                if let Some(s) = self.streams.get_mut(stream) {
                    let w = match s {
                        ControlStream::Assigned { window }
                        | ControlStream::Accepted { window }
                        | ControlStream::Receiving { window } => window,
                    };
                    *w = w.saturating_add(u64::from(*bytes));
                }
            }
            Frame::Cancel { stream } => {
                // A half-open stream has nothing more to come from the worker but credit,
                // which is dropped anyway: it is not remembered as cancelled.
                self.up_open.remove(stream);
                self.half.remove(stream);
                self.sendable.remove(stream);
                let was_open = self.streams.remove(stream).is_some();
                if was_open && self.cancelled.len() < MAX_CANCELLED {
                    self.cancelled.insert(*stream);
                }
            }
            _ => {}
        }
    }

    /// Checks a frame the worker sent.
    pub fn receive(&mut self, frame: &Frame) -> Result<Verdict, Violation> {
        if frame.sender() == Sender::Control {
            return Err(violation(frame, "only a control sends this frame"));
        }
        match (self.phase, frame) {
            (Phase::AwaitHello, Frame::Hello(_)) => {
                self.phase = Phase::AwaitAdmission;
                return Ok(Verdict::Deliver);
            }
            (Phase::AwaitHello, _) => return Err(violation(frame, "expected hello first")),
            (Phase::AwaitAdmission, _) => {
                return Err(violation(frame, "sent before the lane was admitted"))
            }
            (Phase::Closed, _) => return Err(violation(frame, "lane is closed")),
            (Phase::Open, Frame::Hello(_)) => return Err(violation(frame, "second hello")),
            (
                Phase::Open,
                Frame::Heartbeat(_) | Frame::ConfigApplied { .. } | Frame::GoAway { .. },
            ) => return Ok(Verdict::Deliver),
            (Phase::Open, _) => {}
        }
        let Some(stream) = frame.stream() else {
            return Err(violation(frame, "unexpected frame"));
        };
        // One lookup per frame: the stream's state is read and moved on through `slot`.
        let Some(slot) = self.streams.get_mut(&stream) else {
            if self.half.contains(&stream) {
                return match frame {
                    Frame::Credit { bytes, .. } => self.credit(frame, stream, *bytes),
                    Frame::StreamError(_) => {
                        self.half.remove(&stream);
                        self.up_open.remove(&stream);
                        self.sendable.remove(&stream);
                        Ok(Verdict::Deliver)
                    }
                    _ => Err(violation(frame, "worker already ended its direction")),
                };
            }
            if matches!(frame, Frame::Credit { .. }) {
                // Credit for bytes the control sent may cross the control's own end of its
                // direction: harmless, dropped.
                return Ok(Verdict::Ignore);
            }
            if self.cancelled.contains(&stream) {
                let ends = matches!(
                    frame,
                    Frame::Refuse { .. }
                        | Frame::StreamError(_)
                        | Frame::Data { end: true, .. }
                        | Frame::Response { .. }
                );
                if ends {
                    self.cancelled.remove(&stream);
                }
                return Ok(Verdict::Ignore);
            }
            return Err(violation(frame, "unknown stream"));
        };
        match (*slot, frame) {
            (ControlStream::Assigned { window }, Frame::Accept { .. }) => {
                *slot = ControlStream::Accepted { window };
            }
            (ControlStream::Accepted { window }, Frame::ResponseHead(_)) => {
                *slot = ControlStream::Receiving { window };
            }
            // A whole response: its head and last data, and the stream's accept when it had
            // none, which only a stream whose body the control does not stream may skip (the
            // control sends such a body only after `Accept`).
            (ControlStream::Assigned { window }, Frame::Response { bytes, .. })
                if !self.up_open.contains(&stream) =>
            {
                self.worker_ended(frame, stream, window, bytes.len())?;
            }
            (ControlStream::Accepted { window }, Frame::Response { bytes, .. }) => {
                self.worker_ended(frame, stream, window, bytes.len())?;
            }
            (ControlStream::Receiving { window }, Frame::Data { bytes, end, .. }) => {
                let len = bytes.len() as u64;
                if *end {
                    self.worker_ended(frame, stream, window, bytes.len())?;
                } else if len > window {
                    return Err(violation(frame, "flow-control window exceeded"));
                } else {
                    *slot = ControlStream::Receiving {
                        window: window - len,
                    };
                }
            }
            // Credit for the request body or tunnel bytes the control sends.
            (
                ControlStream::Accepted { .. } | ControlStream::Receiving { .. },
                Frame::Credit { bytes, .. },
            ) => return self.credit(frame, stream, *bytes),
            (_, Frame::StreamError(_)) | (ControlStream::Assigned { .. }, Frame::Refuse { .. }) => {
                self.streams.remove(&stream);
                self.up_open.remove(&stream);
                self.sendable.remove(&stream);
            }
            (ControlStream::Assigned { .. }, _) => {
                return Err(violation(frame, "stream not accepted yet"))
            }
            (ControlStream::Accepted { .. }, Frame::Data { .. }) => {
                return Err(violation(frame, "data before the response head"))
            }
            _ => return Err(violation(frame, "out of order for its stream")),
        }
        Ok(Verdict::Deliver)
    }

    /// The worker's last `len` bytes of a stream within its `window`: its direction ends, and
    /// with it the stream unless the control's direction is still open.
    fn worker_ended(
        &mut self,
        frame: &Frame,
        stream: StreamId,
        window: u64,
        len: usize,
    ) -> Result<(), Violation> {
        if len as u64 > window {
            return Err(violation(frame, "flow-control window exceeded"));
        }
        self.streams.remove(&stream);
        if self.up_open.contains(&stream) {
            self.half.insert(stream);
        } else {
            self.sendable.remove(&stream);
        }
        Ok(())
    }

    /// Credit from the worker for the control's direction of a stream.
    fn credit(
        &mut self,
        frame: &Frame,
        stream: StreamId,
        bytes: u32,
    ) -> Result<Verdict, Violation> {
        let Some(w) = self.sendable.get_mut(&stream) else {
            // An inline or empty body is sent whole: credit for it has no use.
            return Ok(Verdict::Ignore);
        };
        let raised = *w + u64::from(bytes);
        if raised > MAX_WINDOW {
            return Err(violation(frame, "credit beyond the maximum window"));
        }
        *w = raised;
        Ok(Verdict::Deliver)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WorkerStream {
    /// Request body bytes still to come from the control; `None` for a tunnel or a streamed
    /// body of unknown length.
    body_left: Option<u64>,
    /// Whether the control may still send body bytes; after `end` the stream lives on until
    /// the worker ends it.
    body_open: bool,
    /// Whether the worker ended its own direction while the control's is still open (a
    /// tunnel's half-close, or an answer before the whole streamed body).
    is_worker_done: bool,
    /// Streamed and tunnel bodies: the bytes the control may still send (the upload window
    /// plus the credit the worker sent, minus what arrived). `None` for an inline body, which
    /// `body_left` bounds.
    receivable: Option<u64>,
    /// The bytes the worker may still send (`Assign.window` plus the control's credit, minus
    /// what it sent).
    sendable: u64,
}

/// The worker's view of one lane.
#[derive(Debug)]
pub struct WorkerLane {
    phase: Phase,
    streams: FastMap<StreamId, WorkerStream>,
}

impl Default for WorkerLane {
    fn default() -> Self {
        WorkerLane::new()
    }
}

impl WorkerLane {
    /// A lane that has sent `Hello` and waits for `Welcome`.
    pub fn new() -> WorkerLane {
        WorkerLane {
            phase: Phase::AwaitAdmission,
            streams: FastMap::default(),
        }
    }

    /// Whether the control admitted the lane.
    pub fn is_open(&self) -> bool {
        self.phase == Phase::Open
    }

    /// Streams in flight.
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// Whether a stream is open (either direction).
    pub fn has_stream(&self, stream: StreamId) -> bool {
        self.streams.contains_key(&stream)
    }

    /// Records a frame the worker sends: ending frames finish its streams.
    pub fn sent(&mut self, frame: &Frame) {
        match frame {
            Frame::Credit { stream, bytes } => {
                if let Some(w) = self
                    .streams
                    .get_mut(stream)
                    .and_then(|s| s.receivable.as_mut())
                {
                    *w = w.saturating_add(u64::from(*bytes));
                }
            }
            Frame::Data { stream, bytes, end } => self.sent_data(*stream, bytes.len(), *end),
            Frame::Response { head, bytes } => self.sent_data(head.stream, bytes.len(), true),
            Frame::Refuse { stream, .. }
            | Frame::StreamError(crate::bus::StreamError { stream, .. }) => {
                self.streams.remove(stream);
            }
            _ => {}
        }
    }

    /// Records a `Data` frame of `len` bytes the worker sends ([`WorkerLane::sent`] of one,
    /// for a frame written from borrowed bytes).
    pub fn sent_data(&mut self, stream: StreamId, len: usize, end: bool) {
        if !end {
            if let Some(s) = self.streams.get_mut(&stream) {
                s.sendable = s.sendable.saturating_sub(len as u64);
            }
            return;
        }
        match self.streams.get_mut(&stream) {
            Some(s) if s.body_open => s.is_worker_done = true,
            _ => {
                self.streams.remove(&stream);
            }
        }
    }

    /// Checks a frame the control sent.
    pub fn receive(&mut self, frame: &Frame) -> Result<Verdict, Violation> {
        if frame.sender() == Sender::Worker {
            return Err(violation(frame, "only a worker sends this frame"));
        }
        match (self.phase, frame) {
            (Phase::AwaitAdmission, Frame::Welcome(_)) => {
                self.phase = Phase::Open;
                return Ok(Verdict::Deliver);
            }
            (Phase::AwaitAdmission, Frame::Reject(_)) => {
                self.phase = Phase::Closed;
                return Ok(Verdict::Deliver);
            }
            (Phase::AwaitAdmission, _) => return Err(violation(frame, "expected welcome first")),
            (Phase::Closed | Phase::AwaitHello, _) => {
                return Err(violation(frame, "lane is closed"))
            }
            (Phase::Open, Frame::Welcome(_) | Frame::Reject(_)) => {
                return Err(violation(frame, "lane already admitted"))
            }
            (Phase::Open, Frame::ConfigPush(_) | Frame::GoAway { .. }) => {
                return Ok(Verdict::Deliver)
            }
            (Phase::Open, Frame::Assign(a)) => return self.assign(frame, a),
            (Phase::Open, _) => {}
        }
        let Some(stream) = frame.stream() else {
            return Err(violation(frame, "unexpected frame"));
        };
        let Some(state) = self.streams.get(&stream).copied() else {
            // Cancel and credit may cross the worker's own end of the stream.
            return match frame {
                Frame::Cancel { .. } | Frame::Credit { .. } => Ok(Verdict::Ignore),
                _ => Err(violation(frame, "unknown stream")),
            };
        };
        match frame {
            Frame::Cancel { .. } if state.is_worker_done => {
                // The worker's direction is over: the cancel ends the stream here.
                self.streams.remove(&stream);
                Ok(Verdict::Deliver)
            }
            Frame::Cancel { .. } => Ok(Verdict::Deliver),
            Frame::Credit { bytes, .. } => {
                let raised = state.sendable + u64::from(*bytes);
                if raised > MAX_WINDOW {
                    return Err(violation(frame, "credit beyond the maximum window"));
                }
                self.streams.insert(
                    stream,
                    WorkerStream {
                        sendable: raised,
                        ..state
                    },
                );
                Ok(Verdict::Deliver)
            }
            Frame::Data { bytes, end, .. } => {
                if !state.body_open {
                    return Err(violation(frame, "data after the request body ended"));
                }
                let len = bytes.len() as u64;
                let receivable = match state.receivable {
                    Some(w) if len > w => {
                        return Err(violation(frame, "flow-control window exceeded"))
                    }
                    Some(w) => Some(w - len),
                    None => None,
                };
                let body_left = match state.body_left {
                    Some(left) if len > left => {
                        return Err(violation(frame, "more body bytes than announced"))
                    }
                    Some(left) if *end && len != left => {
                        return Err(violation(frame, "body ended before its announced length"))
                    }
                    Some(left) => Some(left - len),
                    None => None,
                };
                if *end && state.is_worker_done {
                    self.streams.remove(&stream);
                } else {
                    let s = WorkerStream {
                        body_left,
                        body_open: !*end,
                        receivable,
                        ..state
                    };
                    self.streams.insert(stream, s);
                }
                Ok(Verdict::Deliver)
            }
            _ => Err(violation(frame, "out of order for its stream")),
        }
    }

    fn assign(&mut self, frame: &Frame, a: &Assign) -> Result<Verdict, Violation> {
        if a.stream == 0 {
            return Err(violation(frame, "stream 0 is reserved"));
        }
        if self.streams.contains_key(&a.stream) {
            return Err(violation(frame, "stream id in use"));
        }
        if self.streams.len() >= MAX_STREAMS_PER_LANE {
            return Err(violation(frame, "too many streams"));
        }
        if u64::from(a.window) > MAX_WINDOW {
            return Err(violation(frame, "window beyond the maximum window"));
        }
        let upload = Some(u64::from(INITIAL_UPLOAD_WINDOW));
        let (body_left, body_open, receivable) = match a.body {
            BodySource::Empty | BodySource::Receipt { .. } => (Some(0), false, None),
            BodySource::Inline { len } => (Some(len), len > 0, None),
            BodySource::Stream { len } => (len, true, upload),
            BodySource::Tunnel => (None, true, upload),
        };
        self.streams.insert(
            a.stream,
            WorkerStream {
                body_left,
                body_open,
                is_worker_done: false,
                receivable,
                sendable: u64::from(a.window),
            },
        );
        Ok(Verdict::Deliver)
    }
}
