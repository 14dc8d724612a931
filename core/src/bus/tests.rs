//! Tests of the bus codec and lane state machines: round trips of generated frames, decoding
//! at every split point, strictness on malformed input, and whole exchanges of both lanes.

use super::*;
use crate::worker::AdvertisedCapabilities;

/// xorshift64*: deterministic frames without a property-testing dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn string(&mut self, max: usize) -> String {
        let n = self.below(max as u64 + 1) as usize;
        (0..n)
            .map(|_| match self.below(4) {
                0 => 'é',
                1 => '€',
                _ => char::from(b'a' + self.below(26) as u8),
            })
            .collect()
    }
    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max as u64 + 1) as usize;
        (0..n).map(|_| self.next() as u8).collect()
    }
    fn opt(&mut self, max: usize) -> Option<String> {
        (self.below(2) == 1).then(|| self.string(max))
    }
    fn strings(&mut self, n: u64, max: usize) -> Vec<String> {
        (0..self.below(n + 1)).map(|_| self.string(max)).collect()
    }
    fn fields(&mut self, n: u64) -> Vec<Field> {
        (0..self.below(n + 1))
            .map(|_| (self.bytes(20), self.bytes(100)))
            .collect()
    }
}

fn frame(r: &mut Rng, kind: u64) -> Frame {
    match kind {
        0 => Frame::Hello(Box::new(Hello {
            version_min: r.below(3) as u16,
            version_max: r.below(3) as u16,
            worker_id: r.string(64),
            session: r.string(32),
            token: r.bytes(64),
            lane: r.below(8) as u16,
            lanes: r.below(8) as u16,
            capabilities: AdvertisedCapabilities {
                tags: r.strings(5, 20),
                country: r.opt(2),
                region: r.opt(20),
                ip_type: r.opt(20),
                ingress: r.strings(3, 7),
                pools: r.strings(4, 10),
                fingerprint_profiles: r.strings(3, 12),
                capacity: r.next() as u32,
            },
        })),
        1 => {
            let version = r.next() as u16;
            Frame::Welcome(Welcome {
                version,
                control_id: r.string(30),
                core: r.next() as u16,
                cores: r.next() as u16,
                heartbeat_ms: r.next() as u32,
                settings: (version >= 3).then(|| LaneSettings {
                    receipt_port: r.next() as u16,
                    proxy_idle_ms: r.next() as u32,
                }),
            })
        }
        2 => Frame::Reject(Reject {
            reason: r.string(20),
            message: r.string(200),
        }),
        3 => Frame::Heartbeat(Heartbeat {
            active: r.next() as u32,
            capacity: r.next() as u32,
        }),
        4 => Frame::ConfigPush(ConfigPush {
            version: r.next(),
            payload: r.bytes(500),
        }),
        5 => Frame::ConfigApplied { version: r.next() },
        6 => {
            // Drawn in the frame's order, as the generator always did.
            let stream = r.next() as u32;
            let (request_id, deployment_id) = (r.string(36), r.string(20));
            let (deadline_ms, is_replayable, ingress) =
                (r.next() as u32, r.below(2) == 1, r.below(3) as u8);
            let (method, url, headers) = (r.string(7), r.string(300), r.fields(10));
            let body = match r.below(5) {
                0 => BodySource::Empty,
                4 => BodySource::Stream {
                    len: (r.below(2) == 1).then(|| r.next()),
                },
                1 => BodySource::Inline { len: r.next() },
                2 => BodySource::Receipt {
                    url: r.string(200),
                    len: r.next(),
                },
                _ => BodySource::Tunnel,
            };
            let (pool, provider_session, proxy_username, fingerprint_profile) =
                (r.string(20), r.opt(32), r.opt(40), r.opt(12));
            Frame::Assign(Box::new(Assign::new(AssignRef {
                stream,
                request_id: &request_id,
                deployment_id: &deployment_id,
                deadline_ms,
                is_replayable,
                ingress,
                method: &method,
                url: AssignUrl::Text(&url),
                headers: &headers,
                body: &body,
                pool: &pool,
                provider_session: provider_session.as_deref(),
                proxy_username: proxy_username.as_deref(),
                fingerprint_profile: fingerprint_profile.as_deref(),
                max_response_bytes: r.next(),
                window: r.next() as u32,
            })))
        }
        7 => Frame::Accept {
            stream: r.next() as u32,
        },
        8 => Frame::Refuse {
            stream: r.next() as u32,
            reason: r.string(10),
        },
        9 => Frame::ResponseHead(ResponseHead {
            stream: r.next() as u32,
            status: r.next() as u16,
            headers: r.fields(20).into_iter().collect(),
        }),
        10 => Frame::Data {
            stream: r.next() as u32,
            bytes: r.bytes(2000),
            end: r.below(2) == 1,
        },
        11 => Frame::Credit {
            stream: r.next() as u32,
            bytes: r.next() as u32,
        },
        12 => Frame::StreamError(StreamError {
            stream: r.next() as u32,
            code: r.string(30),
            message: r.string(100),
            timeout_type: r.opt(30),
            upstream_status: (r.below(2) == 1).then(|| r.next() as u16),
            details: (0..r.below(4))
                .map(|_| (r.string(10), r.string(30)))
                .collect(),
        }),
        13 => Frame::Cancel {
            stream: r.next() as u32,
        },
        14 => Frame::Response {
            head: ResponseHead {
                stream: r.next() as u32,
                status: r.next() as u16,
                headers: r.fields(20).into_iter().collect(),
            },
            bytes: r.bytes(2000),
        },
        _ => Frame::GoAway {
            reason: r.string(50),
        },
    }
}

fn encoded(f: &Frame) -> Vec<u8> {
    let mut out = Vec::new();
    encode(f, &mut out).expect("encodes");
    out
}

#[test]
fn every_frame_round_trips_and_decodes_at_every_split_point() {
    let mut r = Rng(0x5eed_1234_abcd_ef01);
    for i in 0..3000 {
        let f = frame(&mut r, i % 16);
        let bytes = encoded(&f);
        assert_eq!(
            decode(&bytes),
            Ok(Decoded::Frame(f.clone(), bytes.len())),
            "{f:?}"
        );
        // Any prefix is partial and asks for no more than the frame's length.
        let cut = r.below(bytes.len() as u64) as usize;
        match decode(&bytes[..cut]) {
            Ok(Decoded::Partial(need)) => assert!(need > cut && need <= bytes.len()),
            other => panic!("prefix {cut} of {f:?}: {other:?}"),
        }
    }
}

#[test]
fn frames_back_to_back_decode_one_at_a_time() {
    let mut r = Rng(7);
    let frames: Vec<Frame> = (0..50).map(|i| frame(&mut r, i % 16)).collect();
    let mut buf = Vec::new();
    for f in &frames {
        encode(f, &mut buf).unwrap();
    }
    let mut at = 0;
    for f in &frames {
        match decode(&buf[at..]) {
            Ok(Decoded::Frame(got, n)) => {
                assert_eq!(&got, f);
                at += n;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(at, buf.len());
}

#[test]
fn malformed_frames_are_errors_not_panics() {
    let ok = encoded(&Frame::Cancel { stream: 9 });
    let mut trailing = ok.clone();
    trailing[3] += 1;
    trailing.push(0);
    let mut bad_bool = encoded(&Frame::Data {
        stream: 1,
        bytes: vec![],
        end: false,
    });
    bad_bool[9] = 2;
    let mut bad_utf8 = encoded(&Frame::GoAway {
        reason: "ab".into(),
    });
    bad_utf8[7] = 0xff;
    let too_large = (MAX_FRAME_BYTES as u32 + 1).to_be_bytes().to_vec();
    let mut long_data = Vec::new();
    // A complete frame whose data length field claims more than the limit.
    long_data.extend_from_slice(&(1u32 + 4 + 1 + 4).to_be_bytes());
    long_data.push(0x14);
    long_data.extend_from_slice(&1u32.to_be_bytes());
    long_data.push(0);
    long_data.extend_from_slice(&(MAX_DATA_BYTES as u32 + 1).to_be_bytes());
    let cases: Vec<(Vec<u8>, FrameError)> = vec![
        (vec![0, 0, 0, 0], FrameError::Empty),
        (vec![0, 0, 0, 1, 0x7f], FrameError::UnknownType(0x7f)),
        (too_large, FrameError::TooLarge(MAX_FRAME_BYTES as u32 + 1)),
        (trailing, FrameError::Trailing("cancel")),
        (bad_bool, FrameError::InvalidTag("data.end")),
        (bad_utf8, FrameError::InvalidUtf8("goaway.reason")),
        (
            vec![0, 0, 0, 3, 0x11, 0, 0],
            FrameError::Truncated("accept.stream"),
        ),
        (long_data, FrameError::FieldTooLong("data.bytes")),
    ];
    for (bytes, want) in cases {
        assert_eq!(decode(&bytes), Err(want.clone()), "{bytes:?}");
    }
    // Random garbage never panics.
    let mut r = Rng(99);
    for _ in 0..20_000 {
        let mut b = r.bytes(64);
        if b.len() >= 4 {
            let len = (b.len() - 4) as u32;
            b[..4].copy_from_slice(&len.to_be_bytes());
        }
        let _ = decode(&b);
    }
}

#[test]
fn encoding_refuses_fields_the_peer_would_reject() {
    let f = Frame::Data {
        stream: 1,
        bytes: vec![0; MAX_DATA_BYTES + 1],
        end: true,
    };
    let mut out = vec![1, 2, 3];
    assert_eq!(encode(&f, &mut out), Err(EncodeError("data.bytes")));
    assert_eq!(out, vec![1, 2, 3], "nothing is left half-written");
}

#[test]
fn version_negotiation_picks_the_highest_common_version() {
    assert_eq!(negotiate(2, 2), Some(2), "a version 2 peer is still served");
    assert_eq!(negotiate(2, 3), Some(3));
    assert_eq!(negotiate(2, 4), Some(4));
    assert_eq!(negotiate(2, 5), Some(5));
    assert_eq!(negotiate(1, 9), Some(PROTOCOL_VERSION));
    assert_eq!(negotiate(1, 1), None, "version 1 is no longer spoken");
    assert_eq!(negotiate(6, 9), Some(6));
    assert_eq!(negotiate(7, 9), None);
    assert_eq!(negotiate(0, 0), None);
    assert_eq!(negotiate(3, 1), None);
}

fn hello() -> Frame {
    Frame::Hello(Box::new(Hello {
        version_min: 2,
        version_max: 2,
        worker_id: "w1".into(),
        session: "s".into(),
        token: b"t".to_vec(),
        lane: 0,
        lanes: 1,
        capabilities: AdvertisedCapabilities::default(),
    }))
}

fn assign(stream: StreamId, body: BodySource, window: u32) -> Frame {
    Frame::Assign(Box::new(Assign::new::<Vec<u8>, Vec<u8>>(AssignRef {
        stream,
        request_id: "req_1",
        deployment_id: "d",
        deadline_ms: 1000,
        is_replayable: false,
        ingress: 0,
        method: "GET",
        url: AssignUrl::Text("http://a/"),
        headers: &[],
        body: &body,
        pool: "direct",
        provider_session: None,
        proxy_username: None,
        fingerprint_profile: None,
        max_response_bytes: 1 << 20,
        window,
    })))
}

/// A control's welcome to a one-core lane.
fn welcome() -> Frame {
    Frame::Welcome(Welcome {
        version: 2,
        control_id: "c".into(),
        core: 0,
        cores: 1,
        heartbeat_ms: 1000,
        settings: None,
    })
}

/// A control lane that admitted the worker's hello.
fn admitted_control() -> ControlLane {
    let mut lane = ControlLane::new();
    lane.receive(&hello()).unwrap();
    lane.admit();
    lane
}

/// A worker lane the control welcomed.
fn welcomed_worker() -> WorkerLane {
    let mut lane = WorkerLane::new();
    lane.receive(&welcome()).unwrap();
    lane
}

fn data(stream: StreamId, n: usize, end: bool) -> Frame {
    Frame::Data {
        stream,
        bytes: vec![b'x'; n],
        end,
    }
}

#[test]
fn control_lane_accepts_a_whole_exchange_and_flags_every_disorder() {
    let mut lane = ControlLane::new();
    assert_eq!(
        lane.receive(&Frame::Heartbeat(Heartbeat {
            active: 0,
            capacity: 1
        })),
        Err(Violation {
            frame: "heartbeat",
            reason: "expected hello first"
        })
    );
    let mut lane = ControlLane::new();
    assert_eq!(lane.receive(&hello()), Ok(Verdict::Deliver));
    assert!(
        lane.receive(&Frame::Accept { stream: 1 }).is_err(),
        "before admission"
    );
    let mut lane = admitted_control();
    assert!(lane.is_open());
    assert!(lane.receive(&hello()).is_err(), "second hello");
    let s = lane.next_stream().unwrap();
    lane.sent(&assign(s, BodySource::Empty, 10));
    assert!(
        lane.receive(&data(s, 1, false)).is_err(),
        "data before accept"
    );
    assert_eq!(
        lane.receive(&Frame::Accept { stream: s }),
        Ok(Verdict::Deliver)
    );
    assert!(
        lane.receive(&data(s, 1, false)).is_err(),
        "data before head"
    );
    let head = Frame::ResponseHead(ResponseHead {
        stream: s,
        status: 200,
        headers: HeadFields::default(),
    });
    assert_eq!(lane.receive(&head), Ok(Verdict::Deliver));
    assert!(lane.receive(&head).is_err(), "second head");
    assert_eq!(lane.receive(&data(s, 10, false)), Ok(Verdict::Deliver));
    assert!(
        lane.receive(&data(s, 1, false)).is_err(),
        "window exhausted"
    );
    let mut lane2 = admitted_control();
    let s = lane2.next_stream().unwrap();
    lane2.sent(&assign(s, BodySource::Empty, 10));
    lane2.receive(&Frame::Accept { stream: s }).unwrap();
    lane2
        .receive(&Frame::ResponseHead(ResponseHead {
            stream: s,
            status: 200,
            headers: HeadFields::default(),
        }))
        .unwrap();
    lane2.receive(&data(s, 10, false)).unwrap();
    lane2.sent(&Frame::Credit {
        stream: s,
        bytes: 5,
    });
    assert_eq!(lane2.receive(&data(s, 5, true)), Ok(Verdict::Deliver));
    assert_eq!(lane2.open_streams(), 0);
    assert!(lane2.receive(&data(s, 0, true)).is_err(), "stream is over");
    assert!(
        lane2.receive(&Frame::Cancel { stream: 1 }).is_err(),
        "a control-only frame from a worker"
    );
}

/// Version 5's `Response`: the head and the last data in one frame, after an `Accept` or in
/// its place for a stream whose body the control does not stream; within the window; the
/// stream is over after it, unless the control's direction is still open.
#[test]
fn control_lane_takes_a_whole_response_in_one_frame() {
    let response = |stream: StreamId, len: usize| Frame::Response {
        head: ResponseHead {
            stream,
            status: 200,
            headers: HeadFields::default(),
        },
        bytes: vec![7; len],
    };
    let mut lane = admitted_control();
    // After an accept.
    let s = lane.next_stream().unwrap();
    lane.sent(&assign(s, BodySource::Empty, 10));
    lane.receive(&Frame::Accept { stream: s }).unwrap();
    assert_eq!(lane.receive(&response(s, 10)), Ok(Verdict::Deliver));
    assert_eq!(lane.open_streams(), 0);
    assert!(lane.receive(&response(s, 0)).is_err(), "stream is over");
    // In place of the accept, for an inline body.
    let s = lane.next_stream().unwrap();
    lane.sent(&assign(s, BodySource::Inline { len: 3 }, 10));
    assert_eq!(lane.receive(&response(s, 0)), Ok(Verdict::Deliver));
    assert_eq!(lane.open_streams(), 0);
    // Beyond the window.
    let s = lane.next_stream().unwrap();
    lane.sent(&assign(s, BodySource::Empty, 10));
    assert!(lane.receive(&response(s, 11)).is_err(), "window exceeded");
    // Not after a head, and not unaccepted for a streamed body, whose bytes go out only
    // after `Accept`; once accepted, it ends the worker's direction only.
    let mut lane = admitted_control();
    let s = lane.next_stream().unwrap();
    lane.sent(&assign(s, BodySource::Empty, 10));
    lane.receive(&Frame::Accept { stream: s }).unwrap();
    lane.receive(&Frame::ResponseHead(ResponseHead {
        stream: s,
        status: 200,
        headers: HeadFields::default(),
    }))
    .unwrap();
    assert!(lane.receive(&response(s, 1)).is_err(), "after a head");
    let s = lane.next_stream().unwrap();
    lane.sent(&assign(s, BodySource::Stream { len: None }, 10));
    assert!(
        lane.receive(&response(s, 1)).is_err(),
        "streamed body, no accept"
    );
    let s = lane.next_stream().unwrap();
    lane.sent(&assign(s, BodySource::Stream { len: None }, 10));
    lane.receive(&Frame::Accept { stream: s }).unwrap();
    assert_eq!(lane.receive(&response(s, 1)), Ok(Verdict::Deliver));
    assert!(lane.is_half_open(s));
    // A cancelled stream's response is its end.
    let s = lane.next_stream().unwrap();
    lane.sent(&assign(s, BodySource::Empty, 10));
    lane.sent(&Frame::Cancel { stream: s });
    assert_eq!(lane.receive(&response(s, 1)), Ok(Verdict::Ignore));
    assert!(
        lane.receive(&response(s, 1)).is_err(),
        "forgotten after its end"
    );
    // The worker's side: sending it ends the stream.
    let mut w = welcomed_worker();
    w.receive(&assign(9, BodySource::Empty, 10)).unwrap();
    w.sent(&response(9, 4));
    assert!(!w.has_stream(9));
}

#[test]
fn control_lane_drops_frames_of_cancelled_streams_until_their_end() {
    let mut lane = admitted_control();
    let s = lane.next_stream().unwrap();
    lane.sent(&assign(s, BodySource::Empty, 100));
    lane.receive(&Frame::Accept { stream: s }).unwrap();
    lane.sent(&Frame::Cancel { stream: s });
    let head = Frame::ResponseHead(ResponseHead {
        stream: s,
        status: 200,
        headers: HeadFields::default(),
    });
    assert_eq!(lane.receive(&head), Ok(Verdict::Ignore));
    let end = Frame::StreamError(StreamError {
        stream: s,
        code: "cancelled".into(),
        message: String::new(),
        timeout_type: None,
        upstream_status: None,
        details: vec![],
    });
    assert_eq!(lane.receive(&end), Ok(Verdict::Ignore));
    assert!(lane.receive(&head).is_err(), "forgotten after its end");
    // Closing fails what is in flight.
    let s2 = lane.next_stream().unwrap();
    assert_ne!(s, s2);
    lane.sent(&assign(s2, BodySource::Empty, 1));
    assert_eq!(lane.close(), vec![s2]);
}

#[test]
fn worker_lane_checks_bodies_against_their_announced_length() {
    let mut lane = WorkerLane::new();
    assert!(
        lane.receive(&assign(1, BodySource::Empty, 1)).is_err(),
        "before welcome"
    );
    let welcome = welcome();
    assert_eq!(lane.receive(&welcome), Ok(Verdict::Deliver));
    assert!(lane.receive(&welcome).is_err());
    assert!(
        lane.receive(&assign(0, BodySource::Empty, 1)).is_err(),
        "stream 0"
    );
    lane.receive(&assign(1, BodySource::Inline { len: 5 }, 1))
        .unwrap();
    assert!(
        lane.receive(&assign(1, BodySource::Empty, 1)).is_err(),
        "id in use"
    );
    assert_eq!(lane.receive(&data(1, 3, false)), Ok(Verdict::Deliver));
    assert!(lane.receive(&data(1, 3, false)).is_err(), "past the length");
    assert!(
        lane.receive(&data(1, 1, true)).is_err(),
        "short of the length"
    );
    assert_eq!(lane.receive(&data(1, 2, true)), Ok(Verdict::Deliver));
    assert!(lane.receive(&data(1, 0, true)).is_err(), "after the end");
    lane.sent(&data(1, 0, true));
    assert_eq!(lane.open_streams(), 0);
    assert_eq!(
        lane.receive(&Frame::Cancel { stream: 1 }),
        Ok(Verdict::Ignore)
    );
    assert!(lane.receive(&data(1, 1, false)).is_err());
    lane.receive(&assign(2, BodySource::Tunnel, 1)).unwrap();
    for _ in 0..5 {
        lane.receive(&data(2, 1000, false)).unwrap();
    }
    lane.receive(&data(2, 0, true)).unwrap();
    assert!(
        lane.receive(&Frame::Accept { stream: 2 }).is_err(),
        "worker-only frame"
    );
}

/// The fuzz seed of a control's frames decodes whole (the seed follows the codec).
#[test]
fn control_frames_seed_decodes() {
    let seed = include_bytes!("../../../fuzz/corpus/bus_frame/welcome");
    let mut rest = &seed[..];
    let mut names = Vec::new();
    while !rest.is_empty() {
        match decode(rest) {
            Ok(Decoded::Frame(f, n)) => {
                names.push(f.name());
                rest = &rest[n..];
            }
            other => panic!("seed does not decode: {other:?}"),
        }
    }
    assert_eq!(
        names,
        ["welcome", "config_push", "credit", "cancel", "goaway"]
    );
}

/// A tunnel ends when both directions have: the worker may end its own first and keep
/// granting credit for the control's bytes, and the control may end first and keep receiving.
#[test]
fn tunnels_half_close_in_either_order() {
    let head = |s| {
        Frame::ResponseHead(ResponseHead {
            stream: s,
            status: 200,
            headers: HeadFields::default(),
        })
    };
    let credit = |s| Frame::Credit {
        stream: s,
        bytes: 10,
    };
    // The worker ends first.
    let mut c = admitted_control();
    let mut w = welcomed_worker();
    let s = c.next_stream().unwrap();
    let a = assign(s, BodySource::Tunnel, 100);
    c.sent(&a);
    w.receive(&a).unwrap();
    for f in [Frame::Accept { stream: s }, head(s), data(s, 5, true)] {
        w.sent(&f);
        assert_eq!(c.receive(&f), Ok(Verdict::Deliver), "{f:?}");
    }
    assert!(c.is_half_open(s));
    assert_eq!(w.open_streams(), 1, "the control's direction is still open");
    let up = data(s, 7, false);
    c.sent(&up);
    assert_eq!(w.receive(&up), Ok(Verdict::Deliver));
    w.sent(&credit(s));
    assert_eq!(c.receive(&credit(s)), Ok(Verdict::Deliver));
    assert!(c.receive(&data(s, 1, false)).is_err(), "data after its end");
    let end = data(s, 0, true);
    c.sent(&end);
    assert_eq!(w.receive(&end), Ok(Verdict::Deliver));
    assert_eq!((c.open_streams(), w.open_streams()), (0, 0));
    assert!(!c.is_half_open(s));
    assert_eq!(c.receive(&credit(s)), Ok(Verdict::Ignore), "late credit");

    // The control ends first; a streamed body of unknown length behaves the same.
    for body in [BodySource::Tunnel, BodySource::Stream { len: None }] {
        let s = c.next_stream().unwrap();
        let a = assign(s, body, 100);
        c.sent(&a);
        w.receive(&a).unwrap();
        let end = data(s, 3, true);
        c.sent(&end);
        assert_eq!(w.receive(&end), Ok(Verdict::Deliver));
        assert!(w.receive(&data(s, 1, false)).is_err(), "after the end");
        for f in [
            Frame::Accept { stream: s },
            head(s),
            data(s, 9, false),
            data(s, 0, true),
        ] {
            w.sent(&f);
            assert_eq!(c.receive(&f), Ok(Verdict::Deliver), "{f:?}");
        }
        assert_eq!((c.open_streams(), w.open_streams()), (0, 0));
        assert!(!c.is_half_open(s));
    }

    // A cancel ends a half-open stream at once on both sides.
    let s = c.next_stream().unwrap();
    let a = assign(s, BodySource::Tunnel, 100);
    c.sent(&a);
    w.receive(&a).unwrap();
    for f in [Frame::Accept { stream: s }, head(s), data(s, 0, true)] {
        w.sent(&f);
        c.receive(&f).unwrap();
    }
    let cancel = Frame::Cancel { stream: s };
    c.sent(&cancel);
    assert_eq!(w.receive(&cancel), Ok(Verdict::Deliver));
    assert!(!c.is_half_open(s));
}

/// The fuzz seed of version 2 assignments (written from the layout in `docs/bus-protocol.md`,
/// not with this codec) decodes to the frames it describes.
#[test]
fn version_2_assignment_seed_decodes() {
    let seed = include_bytes!("../../../fuzz/corpus/bus_frame/assign_v2");
    let mut rest = &seed[..];
    let mut frames = Vec::new();
    while !rest.is_empty() {
        match decode(rest) {
            Ok(Decoded::Frame(f, n)) => {
                frames.push(f);
                rest = &rest[n..];
            }
            other => panic!("seed does not decode: {other:?}"),
        }
    }
    let assigns: Vec<&Assign> = frames
        .iter()
        .filter_map(|f| match f {
            Frame::Assign(a) => Some(&**a),
            _ => None,
        })
        .collect();
    assert_eq!(assigns.len(), 4);
    assert_eq!(assigns[0].ingress, 2);
    assert_eq!(assigns[0].body, BodySource::Tunnel);
    assert_eq!(assigns[0].url(), AssignUrl::Text("example.test:443"));
    assert_eq!(assigns[0].proxy_username(), Some("cust-US-0123"));
    assert_eq!(assigns[1].body, BodySource::Stream { len: Some(5) });
    assert_eq!(assigns[1].headers.len(), 1);
    assert_eq!(assigns[2].body, BodySource::Stream { len: None });
    assert!(matches!(
        &assigns[3].body,
        BodySource::Receipt { len: 3, .. }
    ));
    assert!(matches!(
        frames.last(),
        Some(Frame::Data { stream: 2, end: true, bytes }) if bytes == b"hello"
    ));
}

/// A peer cannot make the other side buffer without limit: bytes beyond the window granted
/// and credit beyond `MAX_WINDOW` are violations, on both lanes.
#[test]
fn flow_control_is_enforced_in_both_directions() {
    let credit = |s, bytes| Frame::Credit { stream: s, bytes };
    let upload = INITIAL_UPLOAD_WINDOW as usize;

    // The worker: the control's streamed body stays within the upload window plus credit.
    let mut w = welcomed_worker();
    w.receive(&assign(1, BodySource::Stream { len: None }, 100))
        .unwrap();
    assert_eq!(w.receive(&data(1, upload, false)), Ok(Verdict::Deliver));
    w.sent(&credit(1, 10));
    assert_eq!(w.receive(&data(1, 10, false)), Ok(Verdict::Deliver));
    let over = w.receive(&data(1, 1, false)).unwrap_err();
    assert_eq!(over.reason, "flow-control window exceeded");
    // The control's credit may not raise the worker's window beyond the maximum.
    let mut w = welcomed_worker();
    w.receive(&assign(2, BodySource::Empty, 100)).unwrap();
    let limit = u32::try_from(MAX_WINDOW - 100).unwrap();
    assert_eq!(w.receive(&credit(2, limit)), Ok(Verdict::Deliver));
    let over = w.receive(&credit(2, 1)).unwrap_err();
    assert_eq!(over.reason, "credit beyond the maximum window");
    let mut w = welcomed_worker();
    w.receive(&assign(3, BodySource::Empty, 1)).unwrap();
    assert!(w.receive(&credit(3, u32::MAX)).is_err(), "u32::MAX credit");
    let mut w = welcomed_worker();
    let window = u32::try_from(MAX_WINDOW + 1).unwrap();
    assert!(w.receive(&assign(4, BodySource::Empty, window)).is_err());

    // The control: the worker's credit for a tunnel may not raise the control's window
    // beyond the maximum; the window shrinks with what the control sends.
    let mut c = admitted_control();
    let s = c.next_stream().unwrap();
    c.sent(&assign(s, BodySource::Tunnel, 100));
    c.receive(&Frame::Accept { stream: s }).unwrap();
    let room = u32::try_from(MAX_WINDOW).unwrap() - INITIAL_UPLOAD_WINDOW;
    assert_eq!(c.receive(&credit(s, room)), Ok(Verdict::Deliver));
    assert!(
        c.receive(&credit(s, 1)).is_err(),
        "one byte over the maximum"
    );
    let mut c = admitted_control();
    let s = c.next_stream().unwrap();
    c.sent(&assign(s, BodySource::Tunnel, 100));
    c.receive(&Frame::Accept { stream: s }).unwrap();
    c.sent(&data(s, upload, false));
    assert_eq!(
        c.receive(&credit(s, u32::try_from(MAX_WINDOW).unwrap())),
        Ok(Verdict::Deliver),
        "the bytes sent made room"
    );
    assert!(c.receive(&credit(s, u32::MAX)).is_err(), "u32::MAX credit");
    // Credit for an inline body has no use and is dropped.
    let s = c.next_stream().unwrap();
    c.sent(&assign(s, BodySource::Inline { len: 3 }, 100));
    c.receive(&Frame::Accept { stream: s }).unwrap();
    assert_eq!(c.receive(&credit(s, u32::MAX)), Ok(Verdict::Ignore));
}

/// A version 3 welcome carries the lane settings and a version 2 one does not; each decodes as
/// it was sent, and a welcome whose settings disagree with its version is never sent.
#[test]
fn welcome_settings_follow_the_version() {
    let settings = Some(LaneSettings {
        receipt_port: 8443,
        proxy_idle_ms: 90_000,
    });
    let welcome = |version, settings| {
        Frame::Welcome(Welcome {
            version,
            control_id: "c".into(),
            core: 0,
            cores: 2,
            heartbeat_ms: 500,
            settings,
        })
    };
    let mut sizes = Vec::new();
    for (version, settings) in [(2, None), (3, settings)] {
        let f = welcome(version, settings);
        let mut out = Vec::new();
        encode(&f, &mut out).unwrap();
        match decode(&out) {
            Ok(Decoded::Frame(g, n)) => {
                assert_eq!(n, out.len());
                assert_eq!(g, f);
            }
            other => panic!("{other:?}"),
        }
        sizes.push(out.len());
    }
    assert_eq!(sizes[1] - sizes[0], 6, "a u16 port and a u32 limit");
    for (version, settings) in [(2, settings), (3, None)] {
        let mut out = Vec::new();
        assert_eq!(
            encode(&welcome(version, settings), &mut out),
            Err(EncodeError("welcome.settings"))
        );
        assert!(out.is_empty());
    }
}

/// `check_request_head` names the bound a forward-proxy head exceeds, and accepts exactly what
/// the codec encodes.
#[test]
fn request_heads_beyond_the_bus_bounds_are_named_before_encoding() {
    let with_name = |len: usize| {
        let mut f = assign(1, BodySource::Empty, 1);
        if let Frame::Assign(a) = &mut f {
            a.headers = vec![(vec![b'x'; len], b"v".to_vec())];
        }
        f
    };
    for (len, fits) in [(256, true), (257, false)] {
        let f = with_name(len);
        let Frame::Assign(a) = &f else { unreachable!() };
        let AssignUrl::Text(url) = a.url() else {
            panic!("a URL as text");
        };
        let checked = check_request_head(a.method(), url, &a.headers);
        assert_eq!(checked.is_ok(), fits, "{checked:?}");
        assert_eq!(encode(&f, &mut Vec::new()).is_ok(), fits);
        if let Err(why) = checked {
            assert!(why.contains("header field name of 257 bytes"), "{why}");
            assert!(why.contains("limit of 256 bytes"), "{why}");
        }
    }
    let many: Vec<Field> = (0..513)
        .map(|i| (format!("x-{i}").into_bytes(), vec![]))
        .collect();
    let why = check_request_head("GET", "http://a/", &many).unwrap_err();
    assert!(why.contains("limit of 512 fields"), "{why}");
    let long_url = format!("http://a/{}", "p".repeat(16 * 1024));
    let why = check_request_head::<&str, &[u8]>("GET", &long_url, &[]).unwrap_err();
    assert!(why.contains("request target"), "{why}");
}

/// The fuzz seed of a version 3 welcome (written from the layout in `docs/bus-protocol.md`, not
/// with this codec) decodes to the settings it describes.
#[test]
fn version_3_welcome_seed_decodes() {
    let seed = include_bytes!("../../../fuzz/corpus/bus_frame/welcome_v3");
    match decode(seed) {
        Ok(Decoded::Frame(Frame::Welcome(w), n)) => {
            assert_eq!(n, seed.len());
            assert_eq!((w.version, w.control_id.as_str()), (3, "c1"));
            assert_eq!((w.core, w.cores, w.heartbeat_ms), (1, 2, 1000));
            assert_eq!(
                w.settings,
                Some(LaneSettings {
                    receipt_port: 8443,
                    proxy_idle_ms: 60_000,
                })
            );
        }
        other => panic!("seed does not decode: {other:?}"),
    }
}

/// A `Hello` with every field at its limit is exactly [`MAX_HELLO_BYTES`] long: the bound the
/// listener checks from a first frame's header is the largest valid hello, no less.
#[test]
fn the_largest_hello_is_the_first_frame_bound() {
    let name = |c: char| c.to_string().repeat(256);
    let names = |n: usize| (0..n).map(|i| format!("{i:0>256}")).collect::<Vec<_>>();
    let f = Frame::Hello(Box::new(Hello {
        version_min: 2,
        version_max: 3,
        worker_id: name('w'),
        session: "s".repeat(crate::worker::MAX_SESSION_BYTES),
        token: vec![b't'; MAX_TOKEN_BYTES],
        lane: 0,
        lanes: 1,
        capabilities: AdvertisedCapabilities {
            tags: names(crate::worker::MAX_WORKER_TAGS),
            country: Some(name('c')),
            region: Some(name('r')),
            ip_type: Some(name('i')),
            ingress: names(3),
            pools: names(crate::worker::MAX_WORKER_POOLS),
            fingerprint_profiles: names(crate::worker::MAX_WORKER_PROFILES),
            capacity: u32::MAX,
        },
    }));
    let bytes = encoded(&f);
    assert_eq!(bytes.len(), 4 + MAX_HELLO_BYTES);
    assert_eq!(check_first_frame(&bytes), Ok(()));
    assert!(matches!(
        decode(&bytes),
        Ok(Decoded::Frame(Frame::Hello(_), _))
    ));
}

#[test]
fn a_first_frame_is_judged_from_its_five_header_bytes() {
    let hb = encoded(&Frame::Heartbeat(Heartbeat {
        active: 0,
        capacity: 0,
    }));
    // Four bytes tell nothing yet; the fifth names the type.
    assert_eq!(check_first_frame(&hb[..4]), Ok(()));
    assert_eq!(
        check_first_frame(&hb[..5]),
        Err(FrameError::NotHello(hb[4]))
    );
    let mut long = (MAX_HELLO_BYTES as u32 + 1).to_be_bytes().to_vec();
    long.push(0x01);
    assert_eq!(
        check_first_frame(&long),
        Err(FrameError::TooLarge(MAX_HELLO_BYTES as u32 + 1))
    );
    assert_eq!(check_first_frame(&encoded(&hello())), Ok(()));
}

/// Frames leave the buffer by an offset; what is left moves once per read, and a frame split
/// over reads is whole once its last byte is in.
#[test]
fn a_frame_buffer_takes_frames_from_the_front_and_keeps_the_rest() {
    let one = encoded(&Frame::Cancel { stream: 7 });
    let mut wire = Vec::new();
    for _ in 0..1000 {
        wire.extend_from_slice(&one);
    }
    wire.extend_from_slice(&one[..3]);
    let mut fb = FrameBuf::new();
    fb.spare().extend_from_slice(&wire);
    let mut n = 0;
    while let Some(f) = fb.next_frame().unwrap() {
        assert_eq!(f, Frame::Cancel { stream: 7 });
        n += 1;
    }
    assert_eq!(n, 1000);
    assert_eq!(fb.pending(), &one[..3]);
    fb.spare().extend_from_slice(&one[3..]);
    assert_eq!(fb.next_frame().unwrap(), Some(Frame::Cancel { stream: 7 }));
    assert!(fb.pending().is_empty());
    assert_eq!(fb.next_frame().unwrap(), None);
    let mut fb = FrameBuf::from_vec(one.clone());
    fb.spare().extend_from_slice(&one[..2]);
    assert!(fb.next_frame().unwrap().is_some());
    assert_eq!(fb.into_vec(), one[..2].to_vec());
    let mut bad = FrameBuf::from_vec(vec![0, 0, 0, 0]);
    assert_eq!(bad.next_frame(), Err(FrameError::Empty));
}

#[test]
fn from_version_4_only_lane_zero_carries_heartbeats() {
    for version in [2, 3] {
        assert!(lane_heartbeats(version, 0) && lane_heartbeats(version, 1));
    }
    assert!(lane_heartbeats(4, 0));
    assert!(!lane_heartbeats(4, 1) && !lane_heartbeats(4, 7));
}

/// The borrowed encoding of a response head writes the bytes `encode` writes for the same
/// frame, and fails as it does (leaving the buffer as it was) when the fields are over the
/// bounds.
#[test]
fn borrowed_assigns_encode_as_frames_do() {
    let mut r = Rng(0x5eed_a551);
    for _ in 0..200 {
        let f = frame(&mut r, 6);
        let Frame::Assign(a) = &f else {
            panic!("kind 6 is an assignment");
        };
        let mut framed = b"before".to_vec();
        let framed_res = encode(&f, &mut framed);
        let mut direct = b"before".to_vec();
        let direct_res = encode_assign(&a.borrowed(), &mut direct);
        assert_eq!(direct_res, framed_res);
        assert_eq!(direct, framed);
    }
}

#[test]
fn borrowed_response_heads_encode_as_frames_do() {
    let fields: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (b"content-type".to_vec(), b"text/plain".to_vec()),
        (b"x-empty".to_vec(), Vec::new()),
        (b"set-cookie".to_vec(), vec![b'v'; 300]),
    ];
    let mut framed = b"before".to_vec();
    encode(
        &Frame::ResponseHead(ResponseHead {
            stream: 7,
            status: 203,
            headers: fields.iter().cloned().collect(),
        }),
        &mut framed,
    )
    .expect("encodes");
    let borrowed: Vec<(&[u8], &[u8])> = fields
        .iter()
        .map(|(n, v)| (n.as_slice(), v.as_slice()))
        .collect();
    let mut direct = b"before".to_vec();
    encode_response_head(7, 203, &borrowed, &mut direct).expect("encodes");
    assert_eq!(direct, framed);

    let too_many: Vec<(&[u8], &[u8])> = vec![(b"a", b"b"); 10_000];
    let mut out = b"kept".to_vec();
    let err = encode_response_head(1, 200, &too_many, &mut out).expect_err("over the bound");
    let framed_err = encode(
        &Frame::ResponseHead(ResponseHead {
            stream: 1,
            status: 200,
            headers: too_many.iter().copied().collect(),
        }),
        &mut Vec::new(),
    )
    .expect_err("over the bound");
    assert_eq!(err, framed_err);
    assert_eq!(out, b"kept");
}

/// A `Data` frame written from borrowed bytes is the frame's own encoding, and recording it
/// leaves the worker's lane as recording the frame does.
#[test]
fn borrowed_data_encodes_and_counts_as_frames_do() {
    for (bytes, end) in [
        (&b""[..], true),
        (&b"piece"[..], false),
        (&b"last"[..], true),
    ] {
        let frame = Frame::Data {
            stream: 5,
            bytes: bytes.to_vec(),
            end,
        };
        let (mut framed, mut direct) = (b"before".to_vec(), b"before".to_vec());
        encode(&frame, &mut framed).expect("encodes");
        encode_data(5, bytes, end, &mut direct).expect("encodes");
        assert_eq!(direct, framed);
    }
    let too_long = vec![0u8; MAX_DATA_BYTES + 1];
    let mut out = b"kept".to_vec();
    assert!(encode_data(5, &too_long, false, &mut out).is_err());
    assert_eq!(out, b"kept", "left as it was");

    // Two lanes with one stream each, one recording frames, the other lengths.
    let (mut by_frame, mut by_len) = (welcomed_worker(), welcomed_worker());
    let a = assign(1, BodySource::Empty, 10);
    for lane in [&mut by_frame, &mut by_len] {
        assert_eq!(lane.receive(&a), Ok(Verdict::Deliver));
        assert!(lane.has_stream(1));
    }
    by_frame.sent(&data(1, 4, false));
    by_len.sent_data(1, 4, false);
    assert_eq!(by_frame.has_stream(1), by_len.has_stream(1));
    by_frame.sent(&data(1, 0, true));
    by_len.sent_data(1, 0, true);
    assert!(!by_frame.has_stream(1) && !by_len.has_stream(1));
}

/// An assignment's strings are checked as UTF-8 together: a bad byte is blamed on the string
/// holding it, and a character cut between two strings (the whole valid, its parts not) is
/// refused too.
#[test]
fn assignment_text_is_utf8_string_by_string() {
    let text = |parts: &[Option<&[u8]>]| {
        let mut b = super::frame::AssignBytes::with_capacity(16);
        for p in parts {
            b.push(*p);
        }
        b.into_text()
    };
    let b = |s: &'static [u8]| Some(s);
    assert!(text(&[b(b"req"), b("dé".as_bytes()), None, b(b"u")]).is_ok());
    assert_eq!(text(&[b(b"a"), b(b"b"), b(b"\xff")]).err(), Some(2));
    assert_eq!(text(&[b(b"\xc3"), b(b"\xa9")]).err(), Some(0));
    assert_eq!(text(&[b(b"a"), None, b(b"\xe2\x82")]).err(), Some(2));
    let a = Assign::new::<Vec<u8>, Vec<u8>>(AssignRef {
        stream: 1,
        request_id: "req_1",
        deployment_id: "dé",
        deadline_ms: 1,
        is_replayable: false,
        ingress: 0,
        method: "GET",
        url: AssignUrl::Text("http://a/"),
        headers: &[],
        body: &BodySource::Empty,
        pool: "p",
        provider_session: None,
        proxy_username: Some("user"),
        fingerprint_profile: None,
        max_response_bytes: 1,
        window: 1,
    });
    assert_eq!(
        (
            a.request_id(),
            a.deployment_id(),
            a.method(),
            a.url(),
            a.pool()
        ),
        ("req_1", "dé", "GET", AssignUrl::Text("http://a/"), "p")
    );
    assert_eq!(
        (
            a.provider_session(),
            a.proxy_username(),
            a.fingerprint_profile()
        ),
        (None, Some("user"), None)
    );
    // A frame whose URL is not UTF-8 names the URL.
    let mut frame = Vec::new();
    encode(&Frame::Assign(Box::new(a)), &mut frame).expect("encodes");
    let at = frame
        .windows(9)
        .position(|w| w == b"http://a/")
        .expect("the URL is in the frame");
    frame[at] = 0xff;
    assert_eq!(
        decode(&frame).err(),
        Some(FrameError::InvalidUtf8("assign.url"))
    );
}

/// An assignment whose target URL is sent as parts (version 6): its own frame type, no URL
/// text, and the worker decodes the same `TargetUrl` the control parsed.
#[test]
fn assignment_target_as_parts_round_trips() {
    use crate::request::parse_target_url;
    for url in [
        "http://example.com/",
        "https://api.example.com:8443/a/b?c=d%20e",
        "http://127.0.0.1:18090/1k",
        "https://10.0.0.1/",
        "http://[2001:db8::1]:8080/x?y",
        "https://[::1]/",
        "http://under_score.example/?q",
    ] {
        let target = parse_target_url(url).expect(url);
        let Frame::Assign(base) = assign(7, BodySource::Inline { len: 3 }, 1 << 16) else {
            panic!("an assignment");
        };
        let headers = [(b"x-a".to_vec(), b"1".to_vec())];
        let a = AssignRef {
            url: AssignUrl::Parts(&target),
            headers: &headers,
            ..base.borrowed()
        };
        let mut borrowed = Vec::new();
        encode_assign(&a, &mut borrowed).expect("encodes");
        let owned = Frame::Assign(Box::new(Assign::new(a)));
        let mut whole = Vec::new();
        encode(&owned, &mut whole).expect("encodes");
        assert_eq!(borrowed, whole, "{url}: the same bytes either way");
        assert_eq!(borrowed.get(4), Some(&0x19), "{url}: the parts frame type");
        let Ok(Decoded::Frame(Frame::Assign(got), used)) = decode(&borrowed) else {
            panic!("{url}: does not decode");
        };
        assert_eq!(used, borrowed.len());
        assert_eq!(got.url(), AssignUrl::Parts(&target), "{url}");
        assert_eq!(Frame::Assign(got), owned);
    }
    // Without parts the frame is the text form, as before.
    let mut text = Vec::new();
    encode(&assign(1, BodySource::Empty, 1), &mut text).expect("encodes");
    assert_eq!(text.get(4), Some(&0x10));
    let Ok(Decoded::Frame(Frame::Assign(got), _)) = decode(&text) else {
        panic!("does not decode");
    };
    assert_eq!(got.url(), AssignUrl::Text("http://a/"));
}

/// Parts that no URL text could have parsed into are refused as the frame is decoded, never
/// handed to the egress: a name that is not a host, port 0, a path that does not start with
/// `/`, holds a space, a control byte, a fragment or a bad escape, and unknown tags.
#[test]
fn assignment_target_parts_are_checked() {
    // An Assign of the parts frame with `url` as its target, its bytes after the URL given.
    let frame_with = |target: &[u8]| {
        let t = crate::request::parse_target_url("http://a/").expect("url");
        let Frame::Assign(base) = assign(1, BodySource::Empty, 1) else {
            panic!("an assignment");
        };
        let a = AssignRef {
            url: AssignUrl::Parts(&t),
            ..base.borrowed()
        };
        let mut good = Vec::new();
        encode_assign(&a, &mut good).expect("encodes");
        // The target of "http://a/": scheme 0, name "a", port 80, path "/".
        let written: &[u8] = &[0, 0, 0, 1, b'a', 0, 80, 0, 1, b'/'];
        let at = good
            .windows(written.len())
            .position(|w| w == written)
            .expect("the target's bytes");
        let mut out = good.get(..at).expect("head").to_vec();
        out.extend_from_slice(target);
        out.extend_from_slice(good.get(at + written.len()..).expect("tail"));
        let len = u32::try_from(out.len() - 4).expect("short");
        out.splice(..4, len.to_be_bytes());
        decode(&out)
    };
    let ok = frame_with(&[0, 0, 0, 1, b'a', 0, 80, 0, 1, b'/']);
    assert!(
        matches!(ok, Ok(Decoded::Frame(Frame::Assign(_), _))),
        "{ok:?}"
    );
    let name = |n: &[u8], port: u16, path: &[u8]| {
        let mut t = vec![1, 0];
        t.extend_from_slice(&u16::try_from(n.len()).expect("short").to_be_bytes());
        t.extend_from_slice(n);
        t.extend_from_slice(&port.to_be_bytes());
        t.extend_from_slice(&u16::try_from(path.len()).expect("short").to_be_bytes());
        t.extend_from_slice(path);
        t
    };
    let invalid = Err(FrameError::InvalidUrl("assign.target"));
    for (case, bytes) in [
        ("a space in the name", name(b"a b", 443, b"/")),
        ("an uppercase name", name(b"A", 443, b"/")),
        ("an empty name", name(b"", 443, b"/")),
        (
            "a label starting with a hyphen",
            name(b"-a.example", 443, b"/"),
        ),
        (
            "an obfuscated address as a name",
            name(b"0x7f.1", 443, b"/"),
        ),
        ("a dotted address as a name", name(b"127.0.0.1", 443, b"/")),
        ("port 0", name(b"a", 0, b"/")),
        ("an empty path", name(b"a", 443, b"")),
        ("a relative path", name(b"a", 443, b"x")),
        ("a space in the path", name(b"a", 443, b"/a b")),
        ("CRLF in the path", name(b"a", 443, b"/a\r\nX: y")),
        ("a fragment", name(b"a", 443, b"/a#b")),
        ("a bad escape", name(b"a", 443, b"/%zz")),
        ("a non-ASCII byte", name(b"a", 443, "/é".as_bytes())),
    ] {
        assert_eq!(frame_with(&bytes), invalid, "{case}");
    }
    assert_eq!(
        frame_with(&[2, 0, 0, 1, b'a', 0, 80, 0, 1, b'/']),
        Err(FrameError::InvalidTag("assign.target")),
        "scheme tag"
    );
    assert_eq!(
        frame_with(&[0, 3, 0, 0, 0, 1, 0, 80, 0, 1, b'/']),
        Err(FrameError::InvalidTag("assign.target")),
        "host tag"
    );
    assert_eq!(
        frame_with(&[0, 0, 0, 1, 0xff, 0, 80, 0, 1, b'/']),
        Err(FrameError::InvalidUtf8("assign.target")),
        "a name that is not UTF-8"
    );
    // An address comes as its bytes and needs no check; its port follows from the scheme.
    let Ok(Decoded::Frame(Frame::Assign(a), _)) =
        frame_with(&[1, 1, 10, 0, 0, 1, 1, 187, 0, 1, b'/'])
    else {
        panic!("an address decodes");
    };
    let AssignUrl::Parts(t) = a.url() else {
        panic!("parts");
    };
    assert_eq!(
        (t.to_text().as_str(), t.has_explicit_port),
        ("https://10.0.0.1/", false)
    );
}

/// A `Response` whose fields go as one block (version 6) decodes to the same frame as one
/// written field by field, from a buffer laid out as a parsed head is (status line, field
/// lines, then body bytes around them).
#[test]
fn response_fields_as_one_block_round_trip() {
    let raw = b"HTTP/1.1 200 OK\r\nServer: x\r\nContent-Length: 2\r\nX-Empty: \r\n\r\nok";
    let span = |s: &str, from: usize| {
        let at = raw
            .windows(s.len())
            .enumerate()
            .position(|(i, w)| i >= from && w == s.as_bytes())
            .expect("in the head");
        (at as u32, (at + s.len()) as u32)
    };
    let spans = [
        crate::h1::FieldOffsets {
            name: span("Server", 0),
            value: span("x", 25),
        },
        crate::h1::FieldOffsets {
            name: span("Content-Length", 0),
            value: span("2", 40),
        },
        crate::h1::FieldOffsets {
            name: span("X-Empty", 0),
            value: (span("X-Empty", 0).1 + 2, span("X-Empty", 0).1 + 2),
        },
    ];
    let fields = [("Server", "x"), ("Content-Length", "2"), ("X-Empty", "")];
    for (body, spans, fields) in [
        (&b"ok"[..], &spans[..], &fields[..]),
        (&b""[..], &[][..], &[][..]),
    ] {
        let mut block = Vec::new();
        encode_response_block(9, 200, raw, spans, body, &mut block).expect("encodes");
        assert_eq!(block.get(4), Some(&0x1a));
        let mut by_field = Vec::new();
        let iter = fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes()));
        encode_response_of(9, 200, iter, body, &mut by_field).expect("encodes");
        let (Ok(Decoded::Frame(a, n)), Ok(Decoded::Frame(b, _))) =
            (decode(&block), decode(&by_field))
        else {
            panic!("both decode");
        };
        assert_eq!(n, block.len());
        assert_eq!(a, b);
        // Only the bytes from the first field to the last travel, not the status line.
        assert!(!block.windows(8).any(|w| w == b"HTTP/1.1"));
    }
}

/// Offsets that do not lie in their block, a reversed pair, a name or value over its bound,
/// more fields than the bound, or a block cut short are refused; spans that do not lie in the
/// encoder's buffer are not written.
#[test]
fn response_field_blocks_are_checked() {
    let frame = |count: u16, offsets: &[u32], block: &[u8]| {
        // The type byte of a `Response` with its fields as one block.
        let mut body = vec![0x1a];
        body.extend_from_slice(&1u32.to_be_bytes());
        body.extend_from_slice(&200u16.to_be_bytes());
        body.extend_from_slice(&count.to_be_bytes());
        for o in offsets {
            body.extend_from_slice(&o.to_be_bytes());
        }
        // Where the block starts in the worker's buffer: 100.
        body.extend_from_slice(&100u32.to_be_bytes());
        body.extend_from_slice(&u32::try_from(block.len()).expect("short").to_be_bytes());
        body.extend_from_slice(block);
        body.extend_from_slice(&0u32.to_be_bytes());
        let mut out = u32::try_from(body.len())
            .expect("short")
            .to_be_bytes()
            .to_vec();
        out.extend_from_slice(&body);
        decode(&out)
    };
    let f = "response.headers";
    let Ok(Decoded::Frame(Frame::Response { head, .. }, _)) =
        frame(1, &[100, 101, 103, 104], b"a: b")
    else {
        panic!("a good block decodes");
    };
    assert_eq!(head.headers.get(0), Some((&b"a"[..], &b"b"[..])));
    for (case, offsets) in [
        ("past the block", [100, 101, 103, 105]),
        ("a reversed name", [101, 100, 103, 104]),
        ("before the block", [99, 101, 103, 104]),
    ] {
        assert_eq!(
            frame(1, &offsets, b"a: b"),
            Err(FrameError::Truncated(f)),
            "{case}"
        );
    }
    assert!(frame(1, &[100, 101, 103], b"a: b").is_err());
    assert!(frame(2, &[100, 101, 103, 104], b"a: b").is_err());
    // A name one byte over the bus's 256.
    let long = vec![b'a'; 257];
    let end = 100 + long.len() as u32;
    assert_eq!(
        frame(1, &[100, end, end, end], &long),
        Err(FrameError::FieldTooLong(f))
    );
    // One field over the bus's 512.
    let many = 513;
    assert_eq!(frame(many, &[], b""), Err(FrameError::TooMany(f)));
    // The encoder refuses spans outside its buffer and writes nothing.
    let mut out = vec![7];
    let bad = [crate::h1::FieldOffsets {
        name: (0, 1),
        value: (3, 9),
    }];
    assert!(encode_response_block(1, 200, b"a: b", &bad, b"", &mut out).is_err());
    assert_eq!(out, [7]);
}
