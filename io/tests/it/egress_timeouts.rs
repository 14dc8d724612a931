//! Integration tests of the egress client's stage limits and of cancellation: a slow head, a
//! stalled body, the total deadline at each stage, and a request future dropped mid-flight.

use crate::support;

use std::time::{Duration, Instant};

use sortie_core::error::{ErrorCode, TimeoutType};
use sortie_core::request::Method;
use support::upstream::{self, Upstream};
use support::{detail, egress, expect_code, request, run};

/// How long scripted upstreams stall: far beyond the limits under test, short enough that their
/// threads end soon after the test.
const STALL: Duration = Duration::from_secs(3);

#[test]
fn slow_head_hits_the_response_header_limit() {
    let up = Upstream::start(upstream::slow_head(STALL));
    run(async {
        let egress = egress(None);
        let mut req = request(Method::Get, &up.url("/"));
        req.timeouts.response_header = Some(Duration::from_millis(150));
        let started = Instant::now();
        let e = expect_code(egress.execute(&req).await, ErrorCode::TimeoutExceeded);
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(e.http_status(), 504);
        assert!(!e.code.is_retryable());
        assert_eq!(e.timeout_type, Some(TimeoutType::ResponseHeader));
        assert_eq!(detail(&e, "timeout_type"), Some("response_header_timeout"));
        assert_eq!(detail(&e, "stage"), Some("response_header"));
        assert_eq!(egress.idle_connections(), 0);
    });
}

#[test]
fn slow_head_without_a_header_limit_runs_into_the_total_deadline() {
    let up = Upstream::start(upstream::slow_head(STALL));
    run(async {
        let egress = egress(None);
        let mut req = request(Method::Get, &up.url("/"));
        req.timeouts.response_header = None;
        req.deadline = Instant::now() + Duration::from_millis(200);
        let e = expect_code(egress.execute(&req).await, ErrorCode::TimeoutExceeded);
        assert_eq!(e.timeout_type, Some(TimeoutType::ResponseHeader));
        assert_eq!(detail(&e, "timeout_type"), Some("response_header_timeout"));
        assert_eq!(detail(&e, "deadline"), Some("total"));
        assert_eq!(detail(&e, "stage"), Some("response_header"));
    });
}

#[test]
fn stalled_body_hits_the_idle_limit() {
    let up = Upstream::start(upstream::slow_body(100, 10, STALL));
    run(async {
        let egress = egress(None);
        let mut req = request(Method::Get, &up.url("/"));
        req.timeouts.idle = Duration::from_millis(150);
        let e = expect_code(egress.execute(&req).await, ErrorCode::TimeoutExceeded);
        assert_eq!(e.timeout_type, Some(TimeoutType::Idle));
        assert_eq!(detail(&e, "timeout_type"), Some("idle_timeout"));
        assert_eq!(detail(&e, "stage"), Some("response_body"));
        assert_eq!(egress.idle_connections(), 0);
    });
}

#[test]
fn stalled_body_runs_into_the_total_deadline_before_the_idle_limit() {
    let up = Upstream::start(upstream::slow_body(100, 10, STALL));
    run(async {
        let egress = egress(None);
        let mut req = request(Method::Get, &up.url("/"));
        req.timeouts.idle = Duration::from_secs(10);
        req.deadline = Instant::now() + Duration::from_millis(250);
        let e = expect_code(egress.execute(&req).await, ErrorCode::TimeoutExceeded);
        assert_eq!(e.timeout_type, Some(TimeoutType::Download));
        assert_eq!(detail(&e, "deadline"), Some("total"));
        assert_eq!(detail(&e, "stage"), Some("response_body"));
    });
}

#[test]
fn a_slow_but_moving_body_is_not_idle() {
    // Three pauses of 300 ms against an idle limit of 600 ms: each well under the limit,
    // 0.9 s together, so the body arrives only if every byte resets the idle timer.
    let script: upstream::Script = std::sync::Arc::new(|_: &upstream::Request| {
        let pause = Duration::from_millis(300);
        vec![
            upstream::Step::Write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\na".to_vec()),
            upstream::Step::Pause(pause),
            upstream::Step::Write(b"b".to_vec()),
            upstream::Step::Pause(pause),
            upstream::Step::Write(b"c".to_vec()),
            upstream::Step::Pause(pause),
            upstream::Step::Write(b"d".to_vec()),
        ]
    });
    let up = Upstream::start(script);
    run(async {
        let egress = egress(None);
        let mut req = request(Method::Get, &up.url("/"));
        req.timeouts.idle = Duration::from_millis(600);
        let started = std::time::Instant::now();
        let resp = egress.execute(&req).await.expect("response");
        assert_eq!(resp.body, b"abcd");
        assert!(
            started.elapsed() >= Duration::from_millis(900),
            "{:?}",
            started.elapsed()
        );
    });
}

#[test]
fn expired_deadline_fails_before_dialling() {
    let up = Upstream::start(upstream::echo());
    run(async {
        let egress = egress(None);
        let mut req = request(Method::Get, &up.url("/"));
        req.deadline = Instant::now();
        let e = expect_code(egress.execute(&req).await, ErrorCode::TimeoutExceeded);
        assert_eq!(e.timeout_type, Some(TimeoutType::Connect));
        assert_eq!(detail(&e, "deadline"), Some("total"));
        assert_eq!(up.connections(), 0);
    });
}

#[test]
fn dropping_the_request_future_leaves_nothing_behind() {
    let slow = Upstream::start(upstream::slow_head(STALL));
    let fast = Upstream::start(upstream::echo());
    run(async {
        let egress = egress(None);
        // A pooled connection that a broken cancellation could disturb.
        let to_fast = request(Method::Get, &fast.url("/"));
        egress.execute(&to_fast).await.expect("warm-up");
        assert_eq!(egress.idle_connections(), 1);

        let req = request(Method::Get, &slow.url("/"));
        let cancelled =
            monoio::time::timeout(Duration::from_millis(100), egress.execute(&req)).await;
        assert!(
            cancelled.is_err(),
            "the slow request should still be running"
        );
        support::wait_until(Duration::from_secs(5), || slow.requests() == 1).await;
        // The dropped exchange's connection did not enter the pool.
        assert_eq!(egress.idle_connections(), 1);

        // The core keeps working: the fast upstream still answers on the pooled connection.
        let resp = egress.execute(&to_fast).await.expect("response");
        assert!(resp.is_connection_reused);
        assert_eq!(fast.connections(), 1);
    });
}

#[test]
fn dropping_a_request_on_a_pooled_connection_closes_that_connection() {
    // First request answered at once; the second stalls before its head.
    let script: upstream::Script = std::sync::Arc::new(|r: &upstream::Request| {
        let mut steps = Vec::new();
        if r.req_seq > 0 {
            steps.push(upstream::Step::Pause(STALL));
        }
        steps.push(upstream::Step::Write(upstream::response(200, &[], b"ok")));
        steps
    });
    let up = Upstream::start(script);
    run(async {
        let egress = egress(None);
        let req = request(Method::Get, &up.url("/"));
        egress.execute(&req).await.expect("first response");
        assert_eq!(egress.idle_connections(), 1);
        let cancelled =
            monoio::time::timeout(Duration::from_millis(100), egress.execute(&req)).await;
        assert!(cancelled.is_err());
        // The connection was taken out of the pool and dropped with the future: the late
        // response can never be read as the answer to another request.
        assert_eq!(egress.idle_connections(), 0);
        let resp = egress.execute(&req).await.expect("third response");
        assert!(!resp.is_connection_reused);
        assert_eq!(up.connections(), 2);
    });
}
