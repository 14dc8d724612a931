//! The frames of the worker bus as plain data: what each frame carries, and who may send it.
//! Encoding and decoding live in `codec.rs`; which frame may follow which lives in `lane.rs`.

use bytes::Bytes;

use crate::h1::FieldOffsets;
use crate::request::TargetUrl;
use crate::worker::AdvertisedCapabilities;

/// Identifies one request (or tunnel) on one lane. Chosen by the control, never reused on the
/// lane while the stream is open.
pub type StreamId = u32;

/// A header field: raw name and value bytes, order and duplicates kept.
pub type Field = (Vec<u8>, Vec<u8>);

/// Worker → control, first frame of a lane: who the worker is and what it can do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Lowest protocol version the worker speaks.
    pub version_min: u16,
    /// Highest protocol version the worker speaks.
    pub version_max: u16,
    /// The worker's configured id (identifier grammar of decision 002).
    pub worker_id: String,
    /// Random per worker process: every lane of one process carries the same session.
    pub session: String,
    /// The worker token, checked in constant time.
    pub token: Vec<u8>,
    /// This lane's index, `0..lanes`.
    pub lane: u16,
    /// How many lanes the worker opens to this control (one per control core).
    pub lanes: u16,
    /// Capabilities, checked by admission like a local worker's.
    pub capabilities: AdvertisedCapabilities,
}

/// Control → worker: the lane is admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcome {
    /// The protocol version both sides use from now on.
    pub version: u16,
    /// The control instance's id (stable across its restarts).
    pub control_id: String,
    /// The control core this lane belongs to.
    pub core: u16,
    /// How many cores (so lanes) the control runs: a worker learns it from its first lane's
    /// welcome and opens the other lanes.
    pub cores: u16,
    /// How often the worker must send a heartbeat, in milliseconds.
    pub heartbeat_ms: u32,
    /// Present exactly when `version` is 3 or later (decision 068).
    pub settings: Option<LaneSettings>,
}

/// What a version 3 `Welcome` adds: settings of the control that its worker applies to the
/// assignments of this lane (decision 068).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneSettings {
    /// The port of the control's receipt URLs (its `control.bus.api_base_url`, or its API
    /// listener): a worker fetches receipt bodies on this port only.
    pub receipt_port: u16,
    /// `control.proxy.idle_timeout_ms`: the idle limit of the forward proxy's relayed
    /// requests, which a worker applies to them instead of its own `[egress]` one.
    pub proxy_idle_ms: u32,
}

/// Control → worker: the lane is refused; the control closes it after this frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    /// A stable reason (`auth_failed`, `unsupported_version`, `invalid_worker`,
    /// `duplicate_session`, `lane_out_of_range`).
    pub reason: String,
    /// For humans.
    pub message: String,
}

/// Worker → control: the worker is alive; its own view of its load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// Requests in flight on the whole worker process.
    pub active: u32,
    /// The worker's capacity (it may change at run time).
    pub capacity: u32,
}

/// Control → worker: a configuration version and the parts of it workers need (pools and their
/// upstream proxies), as the snapshot's JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigPush {
    /// The revision.
    pub version: u64,
    /// JSON the worker applies.
    pub payload: Vec<u8>,
}

/// Where the request body of an assignment comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodySource {
    /// No body.
    Empty,
    /// `len` bytes follow in [`Frame::Data`] frames of the stream.
    Inline {
        /// Total length.
        len: u64,
    },
    /// The worker fetches the body from a short-lived signed receipt URL (never logged).
    Receipt {
        /// The signed URL.
        url: String,
        /// Total length.
        len: u64,
    },
    /// A CONNECT tunnel: bytes flow both ways in [`Frame::Data`]; each side ends its own
    /// direction with `end`, and the stream ends when both have (or on an error or cancel).
    Tunnel,
    /// A body streamed from the client as it arrives (the forward proxy's absolute-form
    /// requests): [`Frame::Data`] until `end`, sent within the worker's credit. `len` is the
    /// client's `Content-Length`, `None` for a chunked body.
    Stream {
        /// Total length, when known.
        len: Option<u64>,
    },
}

/// Control → worker: perform one request. Its strings are held in one buffer (a decoded
/// assignment costs one allocation for them, not one each): read them through the methods of
/// the same names as [`AssignRef`]'s fields; build one from an [`AssignRef`] ([`Assign::new`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assign {
    /// The stream.
    pub stream: StreamId,
    /// Milliseconds left of the total deadline when the frame was written.
    pub deadline_ms: u32,
    /// Permission for a transport-level retry.
    pub is_replayable: bool,
    /// Ingress mode the request came in by: 0 api, 1 proxy, 2 connect.
    pub ingress: u8,
    /// Request header fields for the destination.
    pub headers: Vec<Field>,
    /// The body.
    pub body: BodySource,
    /// Largest response body the control accepts.
    pub max_response_bytes: u64,
    /// Bytes of response body the worker may send before it waits for [`Frame::Credit`].
    pub window: u32,
    /// The destination URL as the control parsed it (version 6, decision 131), which the
    /// worker takes as it is; `None`: the URL came as text. Read both through [`Assign::url`].
    target: Option<TargetUrl>,
    /// The request id, deployment, method, URL, pool, provider session, proxy username and
    /// fingerprint profile, in that order.
    text: AssignText,
}

/// The strings of an [`Assign`], one after the other in one buffer, and where each ends; an
/// optional one that is absent is empty and marked so in `present`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct AssignText {
    buf: String,
    ends: [u32; ASSIGN_TEXTS],
    /// Bit `i` set: text `i` is present (the required ones always are).
    present: u8,
}

/// How many strings an [`Assign`] holds.
const ASSIGN_TEXTS: usize = 8;
/// The index of each in [`AssignText`].
const REQUEST_ID: usize = 0;
const DEPLOYMENT_ID: usize = 1;
const METHOD: usize = 2;
const URL: usize = 3;
const POOL: usize = 4;
const PROVIDER_SESSION: usize = 5;
const PROXY_USERNAME: usize = 6;
const FINGERPRINT_PROFILE: usize = 7;

/// The names of an [`Assign`]'s strings, in their order, as frame errors name them.
pub(crate) const ASSIGN_TEXT_FIELDS: [&str; ASSIGN_TEXTS] = [
    "assign.request_id",
    "assign.deployment_id",
    "assign.method",
    "assign.url",
    "assign.pool",
    "assign.provider_session",
    "assign.proxy_username",
    "assign.fingerprint_profile",
];

/// An [`AssignText`] being decoded: the strings' bytes, checked as UTF-8 once, all together,
/// when they are all in ([`AssignBytes::into_text`]).
#[derive(Debug, Default)]
pub(crate) struct AssignBytes {
    buf: Vec<u8>,
    ends: [u32; ASSIGN_TEXTS],
    present: u8,
    count: usize,
}

impl AssignBytes {
    /// Room for `capacity` bytes of text.
    pub(crate) fn with_capacity(capacity: usize) -> AssignBytes {
        AssignBytes {
            buf: Vec::with_capacity(capacity),
            ..AssignBytes::default()
        }
    }

    /// Appends the next text (`None`: an optional one that is absent). Texts past the eighth
    /// are not kept; an assignment's whole text is far shorter than 4 GiB.
    pub(crate) fn push(&mut self, text: Option<&[u8]>) {
        let Some(end) = self.ends.get_mut(self.count) else {
            return;
        };
        if let Some(t) = text {
            self.buf.extend_from_slice(t);
            self.present |= 1 << self.count;
        }
        *end = u32::try_from(self.buf.len()).unwrap_or(u32::MAX);
        self.count += 1;
    }

    /// The text, when every string is UTF-8; otherwise the index of the first that is not.
    /// One check of the whole buffer and of each string's end (a string cut inside a
    /// character would leave the whole valid but not its parts).
    pub(crate) fn into_text(self) -> Result<AssignText, usize> {
        let AssignBytes {
            buf,
            ends,
            present,
            count,
        } = self;
        let ends_of = ends.get(..count).unwrap_or_default();
        let holding = |offset: usize| {
            ends_of
                .iter()
                .position(|&e| offset < e as usize)
                .unwrap_or(count.saturating_sub(1))
        };
        let buf = String::from_utf8(buf).map_err(|e| holding(e.utf8_error().valid_up_to()))?;
        if let Some(i) = ends_of
            .iter()
            .position(|&e| !buf.is_char_boundary(e as usize))
        {
            return Err(i);
        }
        Ok(AssignText { buf, ends, present })
    }
}

impl AssignText {
    fn get(&self, i: usize) -> Option<&str> {
        if self.present & (1 << i) == 0 {
            return None;
        }
        let start = match i.checked_sub(1) {
            Some(before) => self.ends.get(before).copied().unwrap_or_default(),
            None => 0,
        };
        let end = self.ends.get(i).copied().unwrap_or_default();
        self.buf.get(start as usize..end as usize)
    }

    fn text(&self, i: usize) -> &str {
        self.get(i).unwrap_or_default()
    }
}

impl Assign {
    /// An assignment of the parts of `a`, its strings copied into one buffer.
    pub fn new<N: AsRef<[u8]>, V: AsRef<[u8]>>(a: AssignRef<'_, N, V>) -> Assign {
        // In the order of `AssignText`.
        let texts = [
            Some(a.request_id),
            Some(a.deployment_id),
            Some(a.method),
            // A URL sent as parts is not sent as text as well.
            Some(match a.url {
                AssignUrl::Text(url) => url,
                AssignUrl::Parts(_) => "",
            }),
            Some(a.pool),
            a.provider_session,
            a.proxy_username,
            a.fingerprint_profile,
        ];
        let mut text = AssignBytes::with_capacity(texts.iter().flatten().map(|t| t.len()).sum());
        for t in texts {
            text.push(t.map(str::as_bytes));
        }
        // Pieces of `str`s, each whole: always UTF-8.
        let text = text.into_text().unwrap_or_default();
        Assign::from_parts(
            AssignNumbers {
                stream: a.stream,
                deadline_ms: a.deadline_ms,
                is_replayable: a.is_replayable,
                ingress: a.ingress,
                max_response_bytes: a.max_response_bytes,
                window: a.window,
            },
            a.headers
                .iter()
                .map(|(n, v)| (n.as_ref().to_vec(), v.as_ref().to_vec()))
                .collect(),
            a.body.clone(),
            match a.url {
                AssignUrl::Text(_) => None,
                AssignUrl::Parts(t) => Some(t.clone()),
            },
            text,
        )
    }

    /// An assignment of decoded parts.
    pub(crate) fn from_parts(
        n: AssignNumbers,
        headers: Vec<Field>,
        body: BodySource,
        target: Option<TargetUrl>,
        text: AssignText,
    ) -> Assign {
        Assign {
            target,
            stream: n.stream,
            deadline_ms: n.deadline_ms,
            is_replayable: n.is_replayable,
            ingress: n.ingress,
            headers,
            body,
            max_response_bytes: n.max_response_bytes,
            window: n.window,
            text,
        }
    }

    /// The request id the caller sees (`req_…`).
    pub fn request_id(&self) -> &str {
        self.text.text(REQUEST_ID)
    }

    /// The deployment, for logs and metrics.
    pub fn deployment_id(&self) -> &str {
        self.text.text(DEPLOYMENT_ID)
    }

    /// Method.
    pub fn method(&self) -> &str {
        self.text.text(METHOD)
    }

    /// The destination: the absolute URL as text (for a tunnel, `host:port`), or the parts a
    /// control of version 6 parsed (decision 131).
    pub fn url(&self) -> AssignUrl<'_> {
        match &self.target {
            Some(t) => AssignUrl::Parts(t),
            None => AssignUrl::Text(self.text.text(URL)),
        }
    }

    /// The pool the request was routed to.
    pub fn pool(&self) -> &str {
        self.text.text(POOL)
    }

    /// The derived provider session (32 hex digits), when there is one: it picks the upstream
    /// proxy endpoint (decision 071).
    pub fn provider_session(&self) -> Option<&str> {
        self.text.get(PROVIDER_SESSION)
    }

    /// The pool's upstream proxy username as the control rendered it from the request's hints
    /// (decision 070); never logged. `None` when the pool has no template.
    pub fn proxy_username(&self) -> Option<&str> {
        self.text.get(PROXY_USERNAME)
    }

    /// The fingerprint profile, when one was asked for.
    pub fn fingerprint_profile(&self) -> Option<&str> {
        self.text.get(FINGERPRINT_PROFILE)
    }
}

/// The numbers of an [`Assign`], as decoded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AssignNumbers {
    pub(crate) stream: StreamId,
    pub(crate) deadline_ms: u32,
    pub(crate) is_replayable: bool,
    pub(crate) ingress: u8,
    pub(crate) max_response_bytes: u64,
    pub(crate) window: u32,
}

/// The destination of an assignment: its URL as text, or (version 6, decision 131) as the parts
/// the control parsed, which the worker takes without parsing text again. A lane to a worker
/// before version 6 sends the text form only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AssignUrl<'a> {
    /// The absolute URL (for a tunnel, `host:port`).
    Text(&'a str),
    /// The URL as parsed.
    Parts(&'a TargetUrl),
}

/// An [`Assign`] from borrowed parts, for writing one (`codec::encode_assign`): the control
/// encodes each assignment straight from the request it serves, without first copying every
/// string and header field into an owned `Assign`. The fields mean what [`Assign`]'s fields and
/// methods of the same names do.
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct AssignRef<'a, N, V> {
    pub stream: StreamId,
    pub request_id: &'a str,
    pub deployment_id: &'a str,
    pub deadline_ms: u32,
    pub is_replayable: bool,
    pub ingress: u8,
    pub method: &'a str,
    pub url: AssignUrl<'a>,
    pub headers: &'a [(N, V)],
    pub body: &'a BodySource,
    pub pool: &'a str,
    pub provider_session: Option<&'a str>,
    pub proxy_username: Option<&'a str>,
    pub fingerprint_profile: Option<&'a str>,
    pub max_response_bytes: u64,
    pub window: u32,
}

impl Assign {
    /// The borrowed form of this assignment.
    pub fn borrowed(&self) -> AssignRef<'_, Vec<u8>, Vec<u8>> {
        AssignRef {
            stream: self.stream,
            request_id: self.request_id(),
            deployment_id: self.deployment_id(),
            deadline_ms: self.deadline_ms,
            is_replayable: self.is_replayable,
            ingress: self.ingress,
            method: self.method(),
            url: self.url(),
            headers: &self.headers,
            body: &self.body,
            pool: self.pool(),
            provider_session: self.provider_session(),
            proxy_username: self.proxy_username(),
            fingerprint_profile: self.fingerprint_profile(),
            max_response_bytes: self.max_response_bytes,
            window: self.window,
        }
    }
}

/// The type byte of [`Frame::ResponseHead`], which the codec also writes without a `Frame`.
pub(crate) const RESPONSE_HEAD_TYPE: u8 = 0x13;
/// The type byte of [`Frame::Data`], which the codec also writes without a `Frame`.
pub(crate) const DATA_TYPE: u8 = 0x14;
/// The type byte of [`Frame::Response`], which the codec also writes without a `Frame`.
pub(crate) const RESPONSE_TYPE: u8 = 0x18;
/// The type byte of [`Frame::Assign`], which the codec also writes without a `Frame`.
pub(crate) const ASSIGN_TYPE: u8 = 0x10;
/// The type byte of [`Frame::Response`] whose fields come as one block and their offsets in
/// it (version 6), which the codec writes without a `Frame`.
pub(crate) const RESPONSE_BLOCK_TYPE: u8 = 0x1a;
/// The type byte of [`Frame::Assign`] with its target URL as parts (version 6).
pub(crate) const ASSIGN_TARGET_TYPE: u8 = 0x19;

/// Worker → control: the response head of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// The stream.
    pub stream: StreamId,
    /// The destination's status.
    pub status: u16,
    /// Response header fields as received, in order.
    pub headers: HeadFields,
}

/// Header fields as one buffer and where each name and value lies in it. A decoded head's
/// fields are copied once, together, and reading one takes no reference count (a pair of
/// shared slices per field took two increments and two decrements).
#[derive(Debug, Clone, Default)]
pub struct HeadFields {
    buf: Bytes,
    /// Every range lies in `buf` (checked where the fields are made).
    spans: Vec<FieldOffsets>,
}

impl HeadFields {
    /// Fields copied into one buffer.
    pub fn copied<N: AsRef<[u8]>, V: AsRef<[u8]>>(
        fields: impl IntoIterator<Item = (N, V)>,
    ) -> HeadFields {
        let mut buf = Vec::new();
        let mut spans = Vec::new();
        for (name, value) in fields {
            let mut push = |part: &[u8]| {
                let start = buf.len();
                buf.extend_from_slice(part);
                // A head's fields are bounded far below 4 GiB; saturating keeps a pathological
                // one from wrapping (its range then reads as empty).
                let at = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
                (at(start), at(buf.len()))
            };
            let name = push(name.as_ref());
            let value = push(value.as_ref());
            spans.push(FieldOffsets { name, value });
        }
        HeadFields {
            buf: Bytes::from(buf),
            spans,
        }
    }

    /// Fields whose spans the caller checked against `buf` one by one as it read them.
    pub(crate) fn checked(buf: Bytes, spans: Vec<FieldOffsets>) -> HeadFields {
        debug_assert!(spans.iter().all(|s| s.is_within(buf.len())));
        HeadFields { buf, spans }
    }

    /// Fields whose names and values lie in `buf` at `spans`; `None` when a range does not.
    pub fn in_buffer(buf: Bytes, spans: Vec<FieldOffsets>) -> Option<HeadFields> {
        spans
            .iter()
            .all(|s| s.is_within(buf.len()))
            .then_some(HeadFields { buf, spans })
    }

    /// How many fields there are.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The field at `index`, as (name, value).
    pub fn get(&self, index: usize) -> Option<(&[u8], &[u8])> {
        self.spans.get(index).map(|s| s.read(&self.buf))
    }

    /// The fields in order, as (name, value).
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&[u8], &[u8])> + Clone + '_ {
        self.spans.iter().map(|s| s.read(&self.buf))
    }

    /// The buffer and the ranges of each field's name and value in it.
    pub fn into_parts(self) -> (Bytes, Vec<FieldOffsets>) {
        (self.buf, self.spans)
    }
}

impl<N: AsRef<[u8]>, V: AsRef<[u8]>> FromIterator<(N, V)> for HeadFields {
    fn from_iter<I: IntoIterator<Item = (N, V)>>(fields: I) -> HeadFields {
        HeadFields::copied(fields)
    }
}

impl PartialEq for HeadFields {
    fn eq(&self, other: &HeadFields) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for HeadFields {}

/// Worker → control: the stream failed; ends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamError {
    /// The stream.
    pub stream: StreamId,
    /// A registry code (`upstream_reset`, `timeout_exceeded`, ...).
    pub code: String,
    /// For humans; never secrets.
    pub message: String,
    /// `timeout_type`, for timeouts.
    pub timeout_type: Option<String>,
    /// A CONNECT status of an upstream proxy.
    pub upstream_status: Option<u16>,
    /// Diagnostic details.
    pub details: Vec<(String, String)>,
}

/// One frame of the bus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Worker → control: registration.
    Hello(Box<Hello>),
    /// Control → worker: admitted.
    Welcome(Welcome),
    /// Control → worker: refused.
    Reject(Reject),
    /// Worker → control: alive, with load.
    Heartbeat(Heartbeat),
    /// Control → worker: a configuration version to apply.
    ConfigPush(ConfigPush),
    /// Worker → control: that version is applied.
    ConfigApplied {
        /// The revision.
        version: u64,
    },
    /// Control → worker: perform a request.
    Assign(Box<Assign>),
    /// Worker → control: the assignment is taken.
    Accept {
        /// The stream.
        stream: StreamId,
    },
    /// Worker → control: not taken (at capacity, draining, unknown pool); the control tries
    /// another eligible worker. Ends the stream.
    Refuse {
        /// The stream.
        stream: StreamId,
        /// A stable reason: `capacity`, `draining`, `pool`, `profile`.
        reason: String,
    },
    /// Worker → control: response head.
    ResponseHead(ResponseHead),
    /// Worker → control (version 5): a whole response in one frame, the head and the body
    /// that ends the worker's direction: `ResponseHead` and `Data end` together, and the
    /// stream's `Accept` when none was sent before it (decision 123).
    Response {
        /// The head.
        head: ResponseHead,
        /// The whole body; at most [`super::MAX_DATA_BYTES`].
        bytes: Vec<u8>,
    },
    /// Body bytes of a stream: the request body or tunnel bytes (control → worker), the response
    /// body or tunnel bytes (worker → control). `end` closes that direction.
    Data {
        /// The stream.
        stream: StreamId,
        /// The bytes; at most [`super::MAX_DATA_BYTES`].
        bytes: Vec<u8>,
        /// The last frame of this direction.
        end: bool,
    },
    /// Flow control: the receiver of a stream's data grants this many more bytes.
    Credit {
        /// The stream.
        stream: StreamId,
        /// Bytes granted.
        bytes: u32,
    },
    /// Worker → control: the stream failed.
    StreamError(StreamError),
    /// Control → worker: abort the stream (operator cancel, caller gone, deadline).
    Cancel {
        /// The stream.
        stream: StreamId,
    },
    /// Either side: no new streams; the lane closes when the open ones end.
    GoAway {
        /// For humans.
        reason: String,
    },
}

/// Which side may send a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    /// The worker.
    Worker,
    /// The control.
    Control,
    /// Either side.
    Both,
}

impl Frame {
    /// The frame's type byte on the wire.
    pub const fn type_byte(&self) -> u8 {
        match self {
            Frame::Hello(_) => 0x01,
            Frame::Welcome(_) => 0x02,
            Frame::Reject(_) => 0x03,
            Frame::Heartbeat(_) => 0x04,
            Frame::ConfigPush(_) => 0x05,
            Frame::ConfigApplied { .. } => 0x06,
            Frame::Assign(a) if a.target.is_some() => ASSIGN_TARGET_TYPE,
            Frame::Assign(_) => ASSIGN_TYPE,
            Frame::Accept { .. } => 0x11,
            Frame::Refuse { .. } => 0x12,
            Frame::ResponseHead(_) => RESPONSE_HEAD_TYPE,
            Frame::Data { .. } => DATA_TYPE,
            Frame::Response { .. } => RESPONSE_TYPE,
            Frame::Credit { .. } => 0x15,
            Frame::StreamError(_) => 0x16,
            Frame::Cancel { .. } => 0x17,
            Frame::GoAway { .. } => 0x20,
        }
    }

    /// Who may send it.
    pub const fn sender(&self) -> Sender {
        match self {
            Frame::Hello(_)
            | Frame::Heartbeat(_)
            | Frame::ConfigApplied { .. }
            | Frame::Accept { .. }
            | Frame::Refuse { .. }
            | Frame::ResponseHead(_)
            | Frame::Response { .. }
            | Frame::StreamError(_) => Sender::Worker,
            Frame::Welcome(_)
            | Frame::Reject(_)
            | Frame::ConfigPush(_)
            | Frame::Assign(_)
            | Frame::Cancel { .. } => Sender::Control,
            Frame::Data { .. } | Frame::Credit { .. } | Frame::GoAway { .. } => Sender::Both,
        }
    }

    /// The stream a frame belongs to, if any.
    pub fn stream(&self) -> Option<StreamId> {
        match self {
            Frame::Assign(a) => Some(a.stream),
            Frame::Accept { stream }
            | Frame::Refuse { stream, .. }
            | Frame::Data { stream, .. }
            | Frame::Credit { stream, .. }
            | Frame::Cancel { stream } => Some(*stream),
            Frame::ResponseHead(h) | Frame::Response { head: h, .. } => Some(h.stream),
            Frame::StreamError(e) => Some(e.stream),
            _ => None,
        }
    }

    /// A short name for logs and errors.
    pub const fn name(&self) -> &'static str {
        match self {
            Frame::Hello(_) => "hello",
            Frame::Welcome(_) => "welcome",
            Frame::Reject(_) => "reject",
            Frame::Heartbeat(_) => "heartbeat",
            Frame::ConfigPush(_) => "config_push",
            Frame::ConfigApplied { .. } => "config_applied",
            Frame::Assign(_) => "assign",
            Frame::Accept { .. } => "accept",
            Frame::Refuse { .. } => "refuse",
            Frame::ResponseHead(_) => "response_head",
            Frame::Data { .. } => "data",
            Frame::Response { .. } => "response",
            Frame::Credit { .. } => "credit",
            Frame::StreamError(_) => "stream_error",
            Frame::Cancel { .. } => "cancel",
            Frame::GoAway { .. } => "goaway",
        }
    }
}
