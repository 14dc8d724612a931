//! Integration tests of the streamed egress exchange (`Egress::open`) against scripted loopback
//! upstreams: request bodies from a source (known length and chunked), response bodies read
//! piece by piece in every framing, reuse of the shared pool, and the tunnel dial.

use crate::support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use sortie_core::error::{ApiError, ErrorCode};
use sortie_core::h1::ResponseFraming;
use sortie_core::request::{parse_target_url, Host, Method, TargetUrl};
use sortie_core::snapshot::ConfigId;
use sortie_io::egress::{BodyLength, BodySource, Egress, StreamRequest, StreamedResponse};
use support::upstream::{self, Upstream};
use support::{egress, loopback_policy, run, short_timeouts};

/// A body handed out in fixed pieces, as a client's upload arrives.
struct Pieces {
    pieces: Vec<Bytes>,
    length: BodyLength,
}

impl BodySource for Pieces {
    fn length(&self) -> BodyLength {
        self.length
    }

    async fn next_chunk(&mut self) -> Result<Option<Bytes>, ApiError> {
        if self.pieces.is_empty() {
            Ok(None)
        } else {
            Ok(Some(self.pieces.remove(0)))
        }
    }
}

async fn open(
    egress: &Egress,
    method: Method,
    url: &TargetUrl,
    headers: &[(&str, &[u8])],
    body: &mut impl BodySource,
) -> Result<StreamedResponse, ApiError> {
    let policy = loopback_policy();
    let worker = ConfigId::parse("local").unwrap();
    let req = StreamRequest {
        method,
        url,
        headers,
        deadline: Instant::now() + Duration::from_secs(10),
        timeouts: short_timeouts(),
        policy: &policy,
        worker_id: &worker,
        bind_address: None,
        is_replayable: true,
        via: None,
        tenant: None,
        may_splice: false,
    };
    egress.open(&req, body).await
}

async fn read_all(resp: &mut StreamedResponse) -> (Vec<u8>, usize) {
    let mut out = Vec::new();
    let mut reads = 0;
    while resp.body.read_into(&mut out).await.expect("body piece") {
        reads += 1;
    }
    assert!(resp.body.is_end());
    (out, reads)
}

#[test]
fn request_bodies_stream_with_length_or_chunked() {
    let up = Upstream::start(upstream::echo());
    run(async {
        let egress = egress(None);
        let url = parse_target_url(&up.url("/up")).unwrap();
        let pieces = || vec![Bytes::from_static(b"hello "), Bytes::from_static(b"world")];
        let mut known = Pieces {
            pieces: pieces(),
            length: BodyLength::Known(11),
        };
        let mut resp = open(&egress, Method::Put, &url, &[("A", b"1")], &mut known)
            .await
            .expect("response");
        let (echo, _) = read_all(&mut resp).await;
        let echo = String::from_utf8(echo).unwrap();
        assert!(
            echo.ends_with(
                "A: 1\r\nConnection: keep-alive\r\nContent-Length: 11\r\n\r\nhello world"
            ),
            "{echo:?}"
        );

        let mut chunked = Pieces {
            pieces: pieces(),
            length: BodyLength::Chunked,
        };
        let mut resp = open(&egress, Method::Post, &url, &[], &mut chunked)
            .await
            .expect("response");
        let (echo, _) = read_all(&mut resp).await;
        let echo = String::from_utf8(echo).unwrap();
        assert!(
            echo.ends_with(
                "Transfer-Encoding: chunked\r\n\r\n6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n"
            ),
            "{echo:?}"
        );
        // Both exchanges ran on one pooled connection.
        assert!(resp.is_connection_reused);
        assert_eq!(up.connections(), 1);
    });
}

#[test]
fn a_body_longer_or_shorter_than_declared_is_an_aborted_upload() {
    let up = Upstream::start(upstream::echo());
    run(async {
        let egress = egress(None);
        let url = parse_target_url(&up.url("/")).unwrap();
        for declared in [3, 20] {
            let mut body = Pieces {
                pieces: vec![Bytes::from_static(b"0123456789")],
                length: BodyLength::Known(declared),
            };
            match open(&egress, Method::Post, &url, &[], &mut body).await {
                Err(e) => assert_eq!(e.code, ErrorCode::StreamUploadAborted, "{e:?}"),
                Ok(r) => panic!("declared {declared}: got {}", r.status),
            }
        }
    });
}

#[test]
fn large_responses_arrive_in_pieces_in_every_framing() {
    let len = 5 * 1024 * 1024 + 3;
    let want = upstream::pattern(len);
    for (script, framing) in [
        (
            upstream::large(len),
            ResponseFraming::ContentLength(len as u64),
        ),
        (upstream::large_chunked(len), ResponseFraming::Chunked),
        (
            upstream::close_delimited(want.clone()),
            ResponseFraming::CloseDelimited,
        ),
    ] {
        let up = Upstream::start(script);
        run(async {
            let egress = egress(None);
            let url = parse_target_url(&up.url("/big")).unwrap();
            let mut resp = open(&egress, Method::Get, &url, &[], &mut Bytes::new())
                .await
                .expect("response");
            assert_eq!(resp.body.framing(), framing);
            let (body, reads) = read_all(&mut resp).await;
            assert_eq!(body.len(), want.len());
            assert!(body == want, "{framing:?}: body differs");
            // Streamed: many reads, never the whole body at once.
            assert!(reads > 4, "{framing:?}: {reads} reads");
            let pooled = egress.idle_connections();
            match framing {
                ResponseFraming::CloseDelimited => assert_eq!(pooled, 0),
                _ => assert_eq!(pooled, 1, "{framing:?}"),
            }
        });
    }
}

#[test]
fn a_reader_dropped_mid_body_closes_its_connection() {
    let up = Upstream::start(upstream::large(4 * 1024 * 1024));
    run(async {
        let egress = egress(None);
        let url = parse_target_url(&up.url("/")).unwrap();
        let mut resp = open(&egress, Method::Get, &url, &[], &mut Bytes::new())
            .await
            .expect("response");
        let mut out = Vec::new();
        assert!(resp.body.read_into(&mut out).await.unwrap());
        drop(resp);
        assert_eq!(egress.idle_connections(), 0);
        let mut again = open(&egress, Method::Get, &url, &[], &mut Bytes::new())
            .await
            .expect("response");
        assert!(!again.is_connection_reused);
        let (body, _) = read_all(&mut again).await;
        assert_eq!(body.len(), 4 * 1024 * 1024);
    });
}

#[test]
fn a_stalled_body_times_out_idle() {
    let up = Upstream::start(upstream::slow_body(1000, 10, Duration::from_secs(8)));
    run(async {
        let egress = egress(None);
        let url = parse_target_url(&up.url("/")).unwrap();
        let mut resp = open(&egress, Method::Get, &url, &[], &mut Bytes::new())
            .await
            .expect("response head");
        let mut out = Vec::new();
        // The bytes that came with the head are handed out before the stall.
        assert!(resp.body.read_into(&mut out).await.expect("first bytes"));
        assert_eq!(out.len(), 10);
        let e = loop {
            match resp.body.read_into(&mut out).await {
                Ok(true) => continue,
                Ok(false) => panic!("body ended"),
                Err(e) => break e,
            }
        };
        assert_eq!(e.code, ErrorCode::TimeoutExceeded, "{e:?}");
    });
}

#[test]
fn dial_applies_the_destination_policy() {
    let up = Upstream::start(upstream::echo());
    run(async {
        let egress = egress(None);
        let host = Host::V4([127, 0, 0, 1].into());
        let deadline = Instant::now() + Duration::from_secs(5);
        let (_tcp, peer) = egress
            .dial(
                &host,
                up.port(),
                None,
                &loopback_policy(),
                Duration::from_secs(2),
                deadline,
                None,
            )
            .await
            .expect("allowed");
        assert_eq!(peer, up.addr());
        let closed = sortie_core::destination::DestinationPolicy::default();
        let e = egress
            .dial(
                &host,
                up.port(),
                None,
                &closed,
                Duration::from_secs(2),
                deadline,
                None,
            )
            .await;
        let Err(e) = e else {
            panic!("a dial to a denied address succeeded")
        };
        assert_eq!(e.code, ErrorCode::DestinationDenied);
    });
}

#[test]
fn bodies_that_fill_the_read_exactly_keep_the_connection() {
    for len in [1, 1024, 64 * 1024, 64 * 1024 + 1] {
        let up = Upstream::start(upstream::large(len));
        run(async {
            let egress = egress(None);
            let url = parse_target_url(&up.url("/")).unwrap();
            for _ in 0..3 {
                let mut resp = open(&egress, Method::Get, &url, &[], &mut Bytes::new())
                    .await
                    .expect("response");
                let (body, _) = read_all(&mut resp).await;
                assert_eq!(body.len(), len);
            }
            assert_eq!(up.connections(), 1, "{len} bytes");
        });
    }
}

/// A replayable request whose pooled connection turns out dead is sent again, whole, on a
/// fresh one: the head the first write gave back is the one the second attempt writes.
#[test]
fn a_request_on_a_dead_pooled_connection_is_sent_again_whole() {
    let up = Upstream::start(upstream::drop_later_requests());
    run(async {
        let egress = egress(None);
        let url = parse_target_url(&up.url("/again?q=1")).unwrap();
        let fields: &[(&str, &[u8])] = &[("X-Trace", b"abc")];
        let mut first = open(&egress, Method::Get, &url, fields, &mut Bytes::new())
            .await
            .expect("first response");
        let (first_echo, _) = read_all(&mut first).await;
        drop(first);
        // The pooled connection looks healthy, but the upstream drops the next request on it.
        let mut again = open(&egress, Method::Get, &url, fields, &mut Bytes::new())
            .await
            .expect("retried response");
        assert!(!again.is_connection_reused);
        let (echo, _) = read_all(&mut again).await;
        assert_eq!(echo, first_echo);
        let echo = String::from_utf8(echo).unwrap();
        assert!(echo.starts_with("GET /again?q=1 HTTP/1.1\r\n"), "{echo:?}");
        assert!(
            echo.ends_with("X-Trace: abc\r\nConnection: keep-alive\r\n\r\n"),
            "{echo:?}"
        );
        assert_eq!(up.connections(), 2);
        assert_eq!(up.requests(), 3);
    });
}

#[test]
fn open_at_connects_to_the_given_address_and_keeps_the_name_for_host() {
    let up = Upstream::start(upstream::echo());
    run(async {
        let egress = egress(None);
        // A name no resolver knows: only the pinned address can reach the upstream.
        let port = up.port();
        let url = parse_target_url(&format!("http://control.sortie.invalid:{port}/r")).unwrap();
        let policy = loopback_policy();
        let worker = ConfigId::parse("local").unwrap();
        let req = StreamRequest {
            method: Method::Get,
            url: &url,
            headers: &[],
            deadline: Instant::now() + Duration::from_secs(10),
            timeouts: short_timeouts(),
            policy: &policy,
            worker_id: &worker,
            bind_address: None,
            is_replayable: true,
            via: None,
            tenant: None,
            may_splice: false,
        };
        let err = egress
            .open(&req, &mut Bytes::new())
            .await
            .err()
            .expect("the name does not resolve");
        assert_eq!(err.code, ErrorCode::UpstreamDnsFailure, "{err:?}");
        let ip = "127.0.0.1".parse().unwrap();
        let mut resp = egress
            .open_at(&req, ip, &mut Bytes::new())
            .await
            .expect("response from the pinned address");
        let (echo, _) = read_all(&mut resp).await;
        let echo = String::from_utf8(echo).unwrap();
        assert!(
            echo.contains(&format!("Host: control.sortie.invalid:{port}\r\n")),
            "{echo:?}"
        );
        assert_eq!(up.connections(), 1);
    });
}
