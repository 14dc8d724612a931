//! Black-box tests of the request API: a real gateway process, real loopback upstreams.

mod support;

use serde_json::json;
use support::gateway::{http, request_api, Gateway, DEPLOYMENT_TOKEN};
use support::upstream::{self, Upstream};

#[test]
fn get_through_the_gateway_returns_the_upstream_answer() {
    let up = Upstream::start(upstream::fixed(upstream::response(
        201,
        &[("X-Dup", "a"), ("X-Dup", "b")],
        b"hello",
    )));
    let gw = Gateway::start();
    let r = request_api(&gw, &json!({"method": "GET", "url": up.url("/x")}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert!(v["request_id"].as_str().unwrap().starts_with("req_"));
    assert_eq!(v["status"], 201);
    assert_eq!(v["body"]["data_base64"], "aGVsbG8=");
    assert_eq!(v["body"]["truncated"], false);
    let dups: Vec<_> = v["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["name"] == "X-Dup")
        .map(|h| h["value_base64"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(dups, vec!["YQ==", "Yg=="]);
    for k in ["routing_ms", "assignment_ms", "egress_ms", "total_ms"] {
        assert!(v["timing"][k].is_u64(), "{k}");
    }
}

#[test]
fn bad_token_is_auth_failure() {
    let gw = Gateway::start();
    let r = http(
        gw.api,
        "POST",
        "/api/v1/requests",
        &[
            ("Authorization", "Bearer nope"),
            ("Content-Type", "application/json"),
        ],
        br#"{"method":"GET","url":"http://127.0.0.1:1/"}"#,
    );
    assert_eq!(r.status, 401);
    let v = r.json();
    assert_eq!(v["code"], "auth_failure");
    assert_eq!(v["category"], "client");
    assert_eq!(v["retryable"], false);
    assert!(v["request_id"].as_str().unwrap().starts_with("req_"));
    let _ = DEPLOYMENT_TOKEN;
}
