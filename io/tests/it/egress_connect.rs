//! Integration tests of how the egress client reaches a destination: DNS, the destination
//! policy on every resolved address, refused ports, connect timeouts and resets.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use sortie_core::destination::DestinationPolicy;
use sortie_core::error::{ErrorCode, TimeoutType};
use sortie_core::request::Method;
use support::upstream::{self, Upstream};
use support::{detail, egress, expect_code, request, run};

/// A port nothing listens on: bound, then released.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

#[test]
fn refused_port_is_connection_refused() {
    let port = closed_port();
    run(async {
        let egress = egress(None);
        let e = expect_code(
            egress
                .execute(&request(Method::Get, &format!("http://127.0.0.1:{port}/")))
                .await,
            ErrorCode::UpstreamConnectionRefused,
        );
        assert_eq!(e.http_status(), 502);
        assert!(e.code.is_retryable());
        assert_eq!(detail(&e, "reason"), Some("connection refused"));
    });
}

#[test]
fn unknown_name_is_dns_failure() {
    run(async {
        let egress = egress(None);
        let e = expect_code(
            egress
                .execute(&request(Method::Get, "http://no-such-host.invalid/"))
                .await,
            ErrorCode::UpstreamDnsFailure,
        );
        assert_eq!(e.http_status(), 502);
    });
}

#[test]
fn names_resolve_through_the_resolver() {
    let up = Upstream::start(upstream::echo());
    run(async {
        let egress = egress(None);
        let resp = egress
            .execute(&request(
                Method::Get,
                &format!("http://localhost:{}/", up.port()),
            ))
            .await
            .expect("response");
        assert!(resp.body.starts_with(b"GET / HTTP/1.1\r\nHost: localhost:"));
        assert!(resp.peer_addr.ip().is_loopback());
    });
}

#[test]
fn loopback_is_denied_without_an_allow_entry() {
    let up = Upstream::start(upstream::echo());
    run(async {
        let egress = egress(None);
        for url in [up.url("/"), format!("http://localhost:{}/", up.port())] {
            let mut req = request(Method::Get, &url);
            req.policy = Arc::new(DestinationPolicy::default());
            let e = expect_code(egress.execute(&req).await, ErrorCode::DestinationDenied);
            assert_eq!(e.http_status(), 403);
            assert_eq!(detail(&e, "reason"), Some("loopback"));
            assert!(!e.message.contains("127.0.0.1"), "{}", e.message);
        }
        // Nothing was dialled.
        assert_eq!(up.connections(), 0);
        // A deny entry wins over the allowance.
        let mut req = request(Method::Get, &up.url("/"));
        req.policy = Arc::new(DestinationPolicy::new(
            vec!["127.0.0.0/8".parse().unwrap()],
            vec!["127.0.0.1/32".parse().unwrap()],
        ));
        let e = expect_code(egress.execute(&req).await, ErrorCode::DestinationDenied);
        assert_eq!(detail(&e, "reason"), Some("deny_list"));
        assert_eq!(up.connections(), 0);
    });
}

#[test]
fn pooled_connection_is_not_reused_once_the_policy_denies_it() {
    let up = Upstream::start(upstream::echo());
    run(async {
        let egress = egress(None);
        let req = request(Method::Get, &up.url("/"));
        egress.execute(&req).await.expect("response");
        assert_eq!(egress.idle_connections(), 1);
        let mut strict = req.clone();
        strict.policy = Arc::new(DestinationPolicy::default());
        expect_code(egress.execute(&strict).await, ErrorCode::DestinationDenied);
        assert_eq!(egress.idle_connections(), 0);
        assert_eq!(up.connections(), 1);
    });
}

#[test]
fn reset_after_the_request_is_upstream_reset() {
    let up = Upstream::start(upstream::reset());
    run(async {
        let egress = egress(None);
        let e = expect_code(
            egress.execute(&request(Method::Get, &up.url("/"))).await,
            ErrorCode::UpstreamReset,
        );
        assert_eq!(detail(&e, "stage"), Some("response_header"));
        assert!(e.code.is_retryable());
    });
}

#[test]
fn reset_mid_body_is_upstream_reset_without_a_partial_body() {
    let up = Upstream::start(upstream::reset_mid_body());
    run(async {
        let egress = egress(None);
        let e = expect_code(
            egress.execute(&request(Method::Get, &up.url("/"))).await,
            ErrorCode::UpstreamReset,
        );
        assert_eq!(detail(&e, "stage"), Some("response_body"));
        assert_eq!(egress.idle_connections(), 0);
    });
}

#[test]
fn truncated_body_is_upstream_reset() {
    let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nonly a few bytes".to_vec();
    let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n".to_vec();
    for raw in [raw, chunked] {
        let up = Upstream::start(upstream::fixed_then_close(raw));
        run(async {
            let egress = egress(None);
            let e = expect_code(
                egress.execute(&request(Method::Get, &up.url("/"))).await,
                ErrorCode::UpstreamReset,
            );
            assert_eq!(detail(&e, "stage"), Some("response_body"));
        });
    }
}

#[test]
fn close_before_any_response_is_upstream_reset() {
    let up = Upstream::start(Arc::new(|_: &upstream::Request| {
        vec![upstream::Step::Close]
    }));
    run(async {
        let egress = egress(None);
        let e = expect_code(
            egress.execute(&request(Method::Get, &up.url("/"))).await,
            ErrorCode::UpstreamReset,
        );
        assert_eq!(detail(&e, "stage"), Some("response_header"));
        // A fresh connection is never retried, replayable or not.
        assert_eq!(up.connections(), 1);
    });
}

/// A listener whose accept queue is full: the kernel drops further SYNs, so a connect hangs
/// until its limit.
fn full_listener() -> (socket2::Socket, Vec<socket2::Socket>, std::net::SocketAddr) {
    use socket2::{Domain, Socket, Type};
    let l = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    l.bind(
        &"127.0.0.1:0"
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into(),
    )
    .expect("bind");
    l.listen(0).expect("listen");
    let addr = l.local_addr().unwrap().as_socket().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..8 {
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
        s.set_nonblocking(true).expect("nonblocking");
        let _ = s.connect(&addr.into());
        fillers.push(s);
    }
    (l, fillers, addr)
}

#[test]
fn connect_limit_is_upstream_connect_timeout_and_total_deadline_wins_when_earlier() {
    let (_l, _fillers, addr) = full_listener();
    run(async {
        let egress = egress(None);
        let mut req = request(Method::Get, &format!("http://{addr}/"));
        req.timeouts.connect = Duration::from_millis(200);
        let started = std::time::Instant::now();
        let e = expect_code(
            egress.execute(&req).await,
            ErrorCode::UpstreamConnectTimeout,
        );
        assert_eq!(e.http_status(), 504);
        assert!(e.code.is_retryable());
        assert_eq!(e.timeout_type, Some(TimeoutType::Connect));
        assert_eq!(detail(&e, "timeout_type"), Some("connect_timeout"));
        assert!(started.elapsed() < Duration::from_secs(2));
        let mut req = request(Method::Get, &format!("http://{addr}/"));
        req.timeouts.connect = Duration::from_secs(5);
        req.deadline = std::time::Instant::now() + Duration::from_millis(200);
        let e = expect_code(egress.execute(&req).await, ErrorCode::TimeoutExceeded);
        assert_eq!(e.timeout_type, Some(TimeoutType::Connect));
        assert_eq!(detail(&e, "deadline"), Some("total"));
        assert_eq!(detail(&e, "stage"), Some("connect"));
    });
}
