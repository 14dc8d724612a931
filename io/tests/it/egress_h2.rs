//! Integration tests of HTTP/2 to destinations against a real HTTP/2 server (nginx over TLS):
//! ALPN picks the protocol, concurrent requests of a core share one connection within the
//! server's MAX_CONCURRENT_STREAMS, GOAWAY and RST_STREAM become retries or registry errors,
//! and the streamed exchange carries large bodies both ways.

use crate::support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::join_all;
use sortie_core::error::{ApiError, ErrorCode};
use sortie_core::h1::ResponseFraming;
use sortie_core::request::{parse_target_url, Method};
use sortie_core::snapshot::ConfigId;
use sortie_io::egress::{BodyLength, BodySource, StreamRequest};
use support::nginx::{Nginx, Server};
use support::tls::TestCa;
use support::{detail, egress, header, loopback_policy, request, run, short_timeouts};

fn connections(log: &[support::nginx::Logged]) -> BTreeSet<u64> {
    log.iter().map(|l| l.connection).collect()
}

#[test]
fn alpn_chooses_h2_and_concurrent_requests_share_one_connection() {
    let ca = TestCa::new();
    let nginx = Nginx::start(&ca);
    run(async {
        let egress = egress(Some(ca.ca_file()));
        let first = egress
            .execute(&request(Method::Get, &nginx.url(Server::H2, "/small")))
            .await
            .expect("first response");
        assert_eq!(first.status, 200);
        assert_eq!(first.body, b"small body");
        assert!(!first.is_connection_reused);
        // Names as an HTTP/2 server sends them: lowercase.
        assert_eq!(header(&first.headers, "content-length"), Some("10"));
        assert!(first
            .headers
            .iter()
            .all(|(n, _)| n.to_ascii_lowercase() == n));
        assert_eq!(egress.h2_connections(), 1);
        assert_eq!(egress.idle_connections(), 0);

        let reqs: Vec<_> = (0..32)
            .map(|i| request(Method::Get, &nginx.url(Server::H2, &format!("/1k.bin?{i}"))))
            .collect();
        let resps = join_all(reqs.iter().map(|r| egress.execute(r))).await;
        for r in resps {
            let r = r.expect("concurrent response");
            assert_eq!(r.status, 200);
            assert_eq!(r.body, support::upstream::pattern(1024));
            assert!(r.is_connection_reused);
        }
        assert_eq!(egress.h2_connections(), 1);
    });
    let log = nginx.wait_logged(33);
    assert!(log.iter().all(|l| l.protocol == "HTTP/2.0"), "{log:?}");
    assert_eq!(connections(&log).len(), 1, "{log:?}");
}

#[test]
fn an_http11_only_server_keeps_the_http11_pool() {
    let ca = TestCa::new();
    let nginx = Nginx::start(&ca);
    run(async {
        let egress = egress(Some(ca.ca_file()));
        for i in 0..3 {
            let r = egress
                .execute(&request(Method::Get, &nginx.url(Server::H1, "/small")))
                .await
                .expect("response");
            assert_eq!(r.body, b"small body");
            assert_eq!(r.is_connection_reused, i > 0);
        }
        assert_eq!(egress.h2_connections(), 0);
        assert_eq!(egress.idle_connections(), 1);
    });
    let log = nginx.wait_logged(3);
    assert!(log.iter().all(|l| l.protocol == "HTTP/1.1"), "{log:?}");
    assert_eq!(connections(&log).len(), 1);
}

#[test]
fn streams_beyond_max_concurrent_streams_wait_for_a_slot() {
    let ca = TestCa::new();
    let nginx = Nginx::start(&ca);
    run(async {
        let egress = egress(Some(ca.ca_file()));
        // Open the connection first, so that every request below finds it.
        egress
            .execute(&request(
                Method::Get,
                &nginx.url(Server::FourStreams, "/small"),
            ))
            .await
            .expect("first response");
        let reqs: Vec<_> = (0..24)
            .map(|_| request(Method::Get, &nginx.url(Server::FourStreams, "/1k.bin")))
            .collect();
        for r in join_all(reqs.iter().map(|r| egress.execute(r))).await {
            assert_eq!(r.expect("response within the stream limit").status, 200);
        }
    });
    let log = nginx.wait_logged(25);
    assert_eq!(connections(&log).len(), 1, "{log:?}");
    assert!(log.iter().all(|l| l.status == 200), "{log:?}");
}

#[test]
fn goaway_moves_later_requests_to_a_new_connection() {
    let ca = TestCa::new();
    let nginx = Nginx::start(&ca);
    run(async {
        let egress = egress(Some(ca.ca_file()));
        for i in 0..12 {
            let r = egress
                .execute(&request(
                    Method::Get,
                    &nginx.url(Server::FiveRequests, "/small"),
                ))
                .await
                .unwrap_or_else(|e| panic!("request {i}: {e:?}"));
            assert_eq!(r.status, 200);
        }
    });
    let log = nginx.wait_logged(12);
    // nginx answers five requests per connection, then sends GOAWAY.
    assert_eq!(connections(&log).len(), 3, "{log:?}");
}

#[test]
fn a_reset_stream_is_upstream_reset_and_the_connection_carries_on() {
    let ca = TestCa::new();
    let nginx = Nginx::start(&ca);
    run(async {
        let egress = egress(Some(ca.ca_file()));
        egress
            .execute(&request(Method::Get, &nginx.url(Server::H2, "/small")))
            .await
            .expect("first response");
        // nginx's 444 closes the request without a response: over HTTP/2, a RST_STREAM.
        let e = egress
            .execute(&request(Method::Get, &nginx.url(Server::H2, "/reset")))
            .await
            .expect_err("reset");
        assert_eq!(e.code, ErrorCode::UpstreamReset, "{e:?}");
        assert!(detail(&e, "h2_error").is_some(), "{e:?}");
        let after = egress
            .execute(&request(Method::Get, &nginx.url(Server::H2, "/small")))
            .await
            .expect("the connection survives a reset stream");
        assert!(after.is_connection_reused);
    });
    let log = nginx.wait_logged(3);
    assert_eq!(connections(&log).len(), 1, "{log:?}");
}

#[test]
fn a_lost_connection_is_upstream_reset_or_a_fresh_dial() {
    let ca = TestCa::new();
    let mut nginx = Nginx::start(&ca);
    let url = nginx.url(Server::H2, "/small");
    run(async {
        let egress = egress(Some(ca.ca_file()));
        egress
            .execute(&request(Method::Get, &url))
            .await
            .expect("first response");
        assert_eq!(egress.h2_connections(), 1);
        drop(std::mem::replace(&mut nginx, Nginx::start(&ca)));
        // The old server is gone: its connection ends, and the next request dials afresh
        // (nothing listens on the old port any more).
        support::wait_until(Duration::from_secs(5), || egress.h2_connections() == 0).await;
        let e = egress
            .execute(&request(Method::Get, &url))
            .await
            .expect_err("nothing listens");
        assert_eq!(e.code, ErrorCode::UpstreamConnectionRefused, "{e:?}");
    });
}

/// A body handed out in fixed pieces.
struct Pieces(Vec<Bytes>, BodyLength);

impl BodySource for Pieces {
    fn length(&self) -> BodyLength {
        self.1
    }

    async fn next_chunk(&mut self) -> Result<Option<Bytes>, ApiError> {
        Ok((!self.0.is_empty()).then(|| self.0.remove(0)))
    }
}

#[test]
fn streamed_exchanges_carry_large_bodies_both_ways() {
    let ca = TestCa::new();
    let nginx = Nginx::start(&ca);
    run(async {
        let egress = egress(Some(ca.ca_file()));
        let policy = loopback_policy();
        let worker = ConfigId::parse("local").unwrap();
        let download = parse_target_url(&nginx.url(Server::H2, "/8m.bin")).unwrap();
        let req = |method, url| StreamRequest {
            method,
            url,
            headers: &[],
            deadline: Instant::now() + Duration::from_secs(20),
            timeouts: short_timeouts(),
            policy: &policy,
            worker_id: &worker,
            bind_address: None,
            is_replayable: true,
            via: None,
            tenant: None,
            may_splice: false,
        };
        let mut resp = egress
            .open(&req(Method::Get, &download), &mut Bytes::new())
            .await
            .expect("streamed response");
        assert_eq!(resp.status, 200);
        assert_eq!(resp.body.framing(), ResponseFraming::ContentLength(8 << 20));
        let mut body = Vec::new();
        let mut pieces = 0;
        while resp.body.read_into(&mut body).await.expect("body piece") {
            pieces += 1;
        }
        assert!(resp.body.is_end());
        assert!(pieces > 1);
        assert!(body == support::upstream::pattern(8 << 20), "body differs");

        // 6 MiB up in 64 KiB pieces, with a known length and chunked (no length on HTTP/2),
        // stored by the server as a file.
        let puts: Vec<_> = ["known", "chunked"]
            .iter()
            .map(|name| parse_target_url(&nginx.url(Server::H2, &format!("/put/{name}"))).unwrap())
            .collect();
        for ((length, name), url) in [
            (BodyLength::Known(6 << 20), "known"),
            (BodyLength::Chunked, "chunked"),
        ]
        .into_iter()
        .zip(&puts)
        {
            let pieces: Vec<Bytes> = support::upstream::pattern(6 << 20)
                .chunks(64 << 10)
                .map(Bytes::copy_from_slice)
                .collect();
            let mut source = Pieces(pieces, length);
            let mut resp = egress
                .open(&req(Method::Put, url), &mut source)
                .await
                .expect("upload response");
            assert_eq!(resp.status, 201, "{name}");
            let mut body = Vec::new();
            while resp.body.read_into(&mut body).await.expect("body") {}
            let stored = std::fs::read(nginx.file(&format!("put/{name}"))).expect("stored");
            assert!(
                stored == support::upstream::pattern(6 << 20),
                "{name} differs"
            );
        }
        // A server that answers before reading the body ends the upload; its answer is the
        // outcome (RFC 9113 §8.1).
        let early = parse_target_url(&nginx.url(Server::H2, "/upload")).unwrap();
        let pieces: Vec<Bytes> = support::upstream::pattern(6 << 20)
            .chunks(64 << 10)
            .map(Bytes::copy_from_slice)
            .collect();
        let mut source = Pieces(pieces, BodyLength::Known(6 << 20));
        let mut resp = egress
            .open(&req(Method::Post, &early), &mut source)
            .await
            .expect("early answer");
        assert_eq!(resp.status, 200);
        let mut body = Vec::new();
        while resp.body.read_into(&mut body).await.expect("body") {}
        assert_eq!(body, b"received");
        assert_eq!(egress.h2_connections(), 1);
    });
    let log = nginx.wait_logged(4);
    assert_eq!(connections(&log).len(), 1, "{log:?}");
}

#[test]
fn a_response_over_the_limit_is_body_too_large() {
    let ca = TestCa::new();
    let nginx = Nginx::start(&ca);
    run(async {
        let egress = egress(Some(ca.ca_file()));
        let mut req = request(Method::Get, &nginx.url(Server::H2, "/8m.bin"));
        req.max_response_body_bytes = 1 << 20;
        let e = egress.execute(&req).await.expect_err("too large");
        assert_eq!(e.code, ErrorCode::BodyTooLarge);
        assert_eq!(detail(&e, "direction"), Some("response"));
        // The stream is cancelled; the connection serves the next request.
        let r = egress
            .execute(&request(Method::Get, &nginx.url(Server::H2, "/small")))
            .await
            .expect("next response");
        assert!(r.is_connection_reused);
    });
}

/// The response header list is bounded on every HTTP/2 connection, also under a browser profile
/// that does not announce SETTINGS_MAX_HEADER_LIST_SIZE (Firefox's), where the HTTP/2 library's
/// own default would let megabytes through.
///
/// With `fingerprints` it runs in a process of its own: the profiles' connectors trust the CA of
/// the first test in a process that installs them.
#[test]
fn a_response_header_list_over_the_limit_is_refused() {
    #[cfg(feature = "fingerprints")]
    if support::run_alone("egress_h2::a_response_header_list_over_the_limit_is_refused").is_some() {
        return;
    }
    let ca = TestCa::new();
    let nginx = Nginx::start(&ca);
    let url = nginx.url(Server::H2, "/big-head");
    let e = run(async {
        egress(Some(ca.ca_file()))
            .execute(&request(Method::Get, &url))
            .await
    })
    .expect_err("an 80 KiB header list is refused");
    assert!(
        matches!(e.code, ErrorCode::ProtocolError | ErrorCode::UpstreamReset),
        "{e:?}"
    );
    #[cfg(feature = "fingerprints")]
    {
        use sortie_io::egress::fingerprint::{verified, verify_at_startup};
        let results = verify_at_startup(Some(ca.ca_file())).expect("the self-test runs");
        assert!(!results.is_empty(), "the self-test checked no profile");
        assert!(
            results
                .iter()
                .all(|r| r.is_pass() || r.unsupported().is_some()),
            "self-test failed"
        );
        let mut req = request(Method::Get, &url);
        req.fingerprint = Some(verified("firefox_133").expect("firefox_133 verified"));
        let e = run(async { egress(Some(ca.ca_file())).execute(&req).await })
            .expect_err("an 80 KiB header list is refused under firefox_133");
        assert_eq!(e.code, ErrorCode::ProtocolError, "{e:?}");
        assert_eq!(detail(&e, "reason"), Some("head_too_large"), "{e:?}");
    }
}
