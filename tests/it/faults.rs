//! Fault tests: upstreams that fail mid-exchange in the ways real servers do, many at a time,
//! against a real `sortie serve`. Each fault must give every caller its registry error and
//! leave nothing behind: no active request, no capacity held, no broken connection in the
//! pool, and the next request served normally.

use crate::support;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use serde_json::{json, Value};
use support::gateway::{admin, admin_items, request_api, wait_until, worker_item, Gateway};
use support::upstream::{self, Request, Script, Step, Upstream};

/// How long a test waits for the gateway to settle after the faults.
const SETTLE: Duration = Duration::from_secs(10);
/// Concurrent callers per fault.
const CALLERS: usize = 8;
/// Requests per caller.
const ROUNDS: usize = 3;

/// A chunked response whose second chunk size is not hexadecimal.
fn malformed_chunk() -> Script {
    Arc::new(|_: &Request| {
        vec![Step::Write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\nxx\r\n0\r\n\r\n"
                .to_vec(),
        )]
    })
}

/// A chunked response whose chunk size would overflow 64 bits.
fn overflowing_chunk() -> Script {
    Arc::new(|_: &Request| {
        vec![Step::Write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff1\r\nx\r\n"
                .to_vec(),
        )]
    })
}

/// Runs `CALLERS` threads of `ROUNDS` requests each and returns every answer's status and body.
fn storm(gw: &Gateway, envelope: &Value) -> Vec<(u16, Value)> {
    let api = gw.api;
    let handles: Vec<_> = (0..CALLERS)
        .map(|_| {
            let envelope = envelope.clone();
            thread::spawn(move || {
                (0..ROUNDS)
                    .map(|_| {
                        let r = support::gateway::http(
                            api,
                            "POST",
                            "/api/v1/requests",
                            &[
                                (
                                    "Authorization",
                                    &format!("Bearer {}", support::gateway::DEPLOYMENT_TOKEN),
                                ),
                                ("Content-Type", "application/json"),
                            ],
                            envelope.to_string().as_bytes(),
                        );
                        (r.status, r.json())
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().expect("caller thread"))
        .collect()
}

/// Asserts that the gateway holds nothing for finished requests and still serves.
fn assert_settled(gw: &Gateway, healthy: &Upstream) {
    wait_until(SETTLE, "no active request and no capacity held", || {
        let active = admin_items(gw, "/api/v1/admin/requests");
        let workers = admin_items(gw, "/api/v1/admin/workers");
        active.is_empty() && worker_item(&workers, "local")["capacity"]["active"] == 0
    });
    let r = request_api(gw, &json!({"method": "GET", "url": healthy.url("/after")}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["status"], 200);
}

fn check_fault(gw: &Gateway, healthy: &Upstream, script: Script, want: (u16, &str, Option<&str>)) {
    let up = Upstream::start(script);
    let envelope = json!({"method": "GET", "url": up.url("/fault"), "timeout_ms": 1000});
    let answers = storm(gw, &envelope);
    assert_eq!(answers.len(), CALLERS * ROUNDS);
    for (status, v) in &answers {
        assert_eq!(*status, want.0, "{v}");
        assert_eq!(v["code"], want.1, "{v}");
        if let Some(t) = want.2 {
            assert_eq!(v["timeout_type"], t, "{v}");
        }
        let id = v["request_id"].as_str().unwrap_or_default();
        assert!(id.starts_with("req_"), "{v}");
    }
    assert_settled(gw, healthy);
}

#[test]
fn upstream_faults_fail_each_caller_and_leave_nothing_behind() {
    let healthy = Upstream::start(upstream::echo());
    let gw = Gateway::start();
    // A reset in the middle of the body.
    check_fault(
        &gw,
        &healthy,
        upstream::reset_mid_body(),
        (502, "upstream_reset", None),
    );
    // Headers, part of the body, then nothing until the 1 s total deadline.
    check_fault(
        &gw,
        &healthy,
        upstream::slow_body(100, 10, Duration::from_secs(5)),
        (504, "timeout_exceeded", Some("download_timeout")),
    );
    // Headers, then silence before any body byte.
    check_fault(
        &gw,
        &healthy,
        upstream::slow_body(100, 0, Duration::from_secs(5)),
        (504, "timeout_exceeded", Some("download_timeout")),
    );
    // A malformed chunk size and an overflowing one.
    check_fault(
        &gw,
        &healthy,
        malformed_chunk(),
        (502, "protocol_error", None),
    );
    // A chunk size past the response limit is refused as soon as its digits are read, before
    // any data, and never read as a wrapped-around small size.
    check_fault(
        &gw,
        &healthy,
        overflowing_chunk(),
        (413, "body_too_large", None),
    );
    // Every fault is counted by its code.
    let metrics = admin(&gw, "GET", "/metrics", &[], b"").text();
    for code in [
        "upstream_reset",
        "timeout_exceeded",
        "protocol_error",
        "body_too_large",
    ] {
        assert!(
            metrics.contains(&format!("outcome=\"{code}\"")),
            "{code} missing from metrics:\n{metrics}"
        );
    }
}

#[test]
fn a_fault_on_one_pooled_connection_does_not_reach_the_next_request() {
    // The first request on each connection is answered and the connection kept alive; the
    // second gets a reset mid-body. A replayable request must not be retried after body bytes
    // arrived, and the broken connection must never be handed out again.
    let script: Script = Arc::new(|r: &Request| {
        if r.req_seq == 0 {
            vec![Step::Write(upstream::response(200, &[], b"first"))]
        } else {
            vec![
                Step::Write(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n0123".to_vec()),
                Step::Reset,
            ]
        }
    });
    let up = Upstream::start(script);
    // One core, so that every request meets the same connection pool.
    let gw = Gateway::builder().cores(1).start();
    let env = json!({"method": "GET", "url": up.url("/p"), "replayable": true});
    for _ in 0..5 {
        let first = request_api(&gw, &env);
        assert_eq!(first.status, 200, "{}", first.text());
        let second = request_api(&gw, &env);
        assert_eq!(second.status, 502, "{}", second.text());
        assert_eq!(second.json()["code"], "upstream_reset");
    }
    // Two requests per connection: the reset connection was never reused.
    assert_eq!(up.requests(), 10);
    assert_eq!(up.connections(), 5);
    let healthy = Upstream::start(upstream::echo());
    assert_settled(&gw, &healthy);
}
