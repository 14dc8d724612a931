//! Black-box tests of the request API: a real gateway process, real loopback upstreams, real
//! sockets. The success paths assert what the destination received byte for byte; the error
//! tests produce every code this build can reach and assert its registry row (status,
//! category, retry class), the request id shape and the documented details.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};
use support::gate::Gate;
use support::gateway::{
    admin, admin_items, http, parse_response, request_api, unb64, wait_until, worker_item, Gateway,
    GatewayBuilder, Resp, DEPLOYMENT_TOKEN,
};
use support::tls::{untrusted_config, TestCa};
use support::upstream::{self, Options, Request, Script, Step, Upstream};

/// How long a test waits for the gateway to reach a state it polls for.
const SETTLE: Duration = Duration::from_secs(10);
/// The request envelope limit of the contract (4 MiB).
const ENVELOPE_LIMIT: usize = 4 * 1024 * 1024;
/// The default inline response body limit (1 MiB).
const DEFAULT_INLINE_LIMIT: usize = 1024 * 1024;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Whether `s` has the documented request id shape: `req_` and 32 lowercase hex digits.
fn is_request_id(s: &str) -> bool {
    s.strip_prefix("req_").is_some_and(|h| {
        h.len() == 32
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Asserts a 200 result envelope and returns it.
fn ok(r: &Resp) -> Value {
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = r.json();
    assert!(is_request_id(v["request_id"].as_str().unwrap_or("")), "{v}");
    for k in ["routing_ms", "assignment_ms", "egress_ms", "total_ms"] {
        assert!(v["timing"][k].is_u64(), "timing.{k} in {v}");
    }
    let t = &v["timing"];
    let parts = t["routing_ms"].as_u64().unwrap_or(0)
        + t["assignment_ms"].as_u64().unwrap_or(0)
        + t["egress_ms"].as_u64().unwrap_or(0);
    // Each stage is rounded down on its own, so their sum may trail the total by a little.
    assert!(parts <= t["total_ms"].as_u64().unwrap_or(0) + 3, "{t}");
    assert_eq!(v["body"]["mode"], "inline_base64");
    assert_eq!(v["body"]["truncated"], false);
    v
}

/// Asserts an error envelope against its registry row and returns it.
fn err(r: &Resp, status: u16, code: &str, category: &str, retryable: bool) -> Value {
    assert_eq!(r.status, status, "{code}: {}", r.text());
    let v = r.json();
    assert_eq!(v["code"], code, "{v}");
    assert_eq!(v["category"], category, "{v}");
    assert_eq!(v["retryable"], retryable, "{v}");
    assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(is_request_id(v["request_id"].as_str().unwrap_or("")), "{v}");
    if let Some(d) = v.get("details") {
        assert!(
            d.as_object()
                .is_some_and(|m| m.values().all(Value::is_string)),
            "{v}"
        );
    }
    v
}

fn body_of(v: &Value) -> Vec<u8> {
    unb64(&v["body"]["data_base64"])
}

/// The response headers of a result as (name, value) pairs.
fn headers_of(v: &Value) -> Vec<(String, Vec<u8>)> {
    v["headers"]
        .as_array()
        .expect("headers array")
        .iter()
        .map(|h| {
            (
                h["name"].as_str().expect("name").to_string(),
                unb64(&h["value_base64"]),
            )
        })
        .collect()
}

/// POSTs raw bytes to the request API with the given extra headers.
fn post_raw(gw: &Gateway, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    http(gw.api, "POST", "/api/v1/requests", headers, body)
}

fn auth() -> String {
    format!("Bearer {DEPLOYMENT_TOKEN}")
}

/// An upstream script that records every request it reads, then runs `then`.
fn recording(then: Script) -> (Script, Arc<Mutex<Vec<Request>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let script: Script = Arc::new(move |r: &Request| {
        s.lock().unwrap_or_else(|p| p.into_inner()).push(r.clone());
        then(r)
    });
    (script, seen)
}

fn only_request(seen: &Arc<Mutex<Vec<Request>>>) -> Request {
    let v = seen.lock().unwrap_or_else(|p| p.into_inner());
    assert_eq!(v.len(), 1, "upstream requests: {v:?}");
    v[0].clone()
}

/// A runtime snapshot with the given rules and pools that opens loopback destinations.
fn snapshot(rules: Value, pools: Value) -> String {
    json!({
        "default_timeout_ms": 60000,
        "routing": {"rules": rules},
        "pools": pools,
        "destinations": {"allow": ["127.0.0.0/8", "::1/128"], "deny": []}
    })
    .to_string()
}

fn rule(id: &str, constraints: Value, pools: &[&str], ttl: u32, fallback: bool) -> Value {
    json!({
        "id": id, "priority": 100, "constraints": constraints, "pools": pools,
        "sticky_session_ttl_seconds": ttl, "allow_sticky_fallback": fallback
    })
}

/// Adds whole TOML tables (for example `[egress]`) to the gateway's config. The builder's
/// `workers` text is written verbatim after every other table, so any table may go there.
fn with_tables(b: GatewayBuilder, toml: &str) -> GatewayBuilder {
    b.workers(toml)
}

/// A loopback port with nothing listening on it.
fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    drop(l);
    port
}

/// Runs `f` on a thread; the handle's result is the test's to join.
fn in_background<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::spawn(f)
}

fn worker(gw: &Gateway, id: &str) -> Value {
    worker_item(&admin_items(gw, "/api/v1/admin/workers"), id).clone()
}

fn worker_action(gw: &Gateway, id: &str, action: &str) {
    let etag = worker(gw, id)["etag"].as_str().expect("etag").to_string();
    let r = admin(
        gw,
        "POST",
        &format!("/api/v1/admin/workers/{id}/{action}"),
        &[("If-Match", &etag), ("X-Service-Actor", "tests")],
        b"",
    );
    assert_eq!(r.status, 200, "{action} {id}: {}", r.text());
}

fn active_request_ids(gw: &Gateway) -> Vec<String> {
    admin_items(gw, "/api/v1/admin/requests")
        .iter()
        .map(|i| {
            assert_eq!(i["deployment_id"], "dep_test");
            i["request_id"].as_str().expect("id").to_string()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Success paths
// ---------------------------------------------------------------------------------------------

#[test]
fn get_through_the_gateway_returns_the_upstream_answer() {
    let up = Upstream::start(upstream::fixed(upstream::response(
        201,
        &[("X-Dup", "a"), ("X-Dup", "b")],
        b"hello",
    )));
    let gw = Gateway::start();
    let r = request_api(&gw, &json!({"method": "GET", "url": up.url("/x")}));
    let v = ok(&r);
    assert_eq!(v["status"], 201);
    assert_eq!(body_of(&v), b"hello");
    let dups: Vec<_> = headers_of(&v)
        .into_iter()
        .filter(|(n, _)| n == "X-Dup")
        .map(|(_, v)| v)
        .collect();
    assert_eq!(dups, vec![b"a".to_vec(), b"b".to_vec()]);
}

#[test]
fn get_sends_exactly_the_method_target_headers_and_host() {
    let (script, seen) = recording(upstream::fixed(upstream::response(200, &[], b"ok")));
    let up = Upstream::start(script);
    let gw = Gateway::start();
    let sent = [
        ("X-First", &b"1"[..]),
        ("x-dup", b"a"),
        ("Accept", b"*/*"),
        ("x-dup", b"b"),
        ("X-Empty", b""),
        ("X-Binary", b"caf\xc3\xa9\t!"),
    ];
    let headers: Vec<Value> = sent
        .iter()
        .map(|(n, v)| json!({"name": n, "value_base64": b64(v)}))
        .collect();
    let target = "/p/a%20b/?q=1&q=2&empty=&x=%2F";
    let r = request_api(
        &gw,
        &json!({"method": "GET", "url": up.url(target), "headers": headers}),
    );
    let v = ok(&r);
    assert_eq!(body_of(&v), b"ok");
    let got = only_request(&seen);
    assert_eq!(got.method, "GET");
    assert_eq!(got.target, target);
    assert!(got.body.is_empty());
    let names: Vec<&str> = got.headers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[0], "Host", "{names:?}");
    assert_eq!(
        got.headers[0].1,
        format!("127.0.0.1:{}", up.port()).into_bytes()
    );
    // The caller's fields follow in order, duplicates and name case kept; after them only
    // fields the gateway manages.
    let forwarded: Vec<(&str, &[u8])> = got.headers[1..=sent.len()]
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_slice()))
        .collect();
    assert_eq!(forwarded, sent.to_vec());
    for (n, _) in &got.headers[sent.len() + 1..] {
        assert!(n.eq_ignore_ascii_case("connection"), "unexpected field {n}");
    }
    assert!(
        !got.headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("content-length")),
        "a GET without a body has no Content-Length: {names:?}"
    );
}

#[test]
fn post_sends_the_inline_body_with_its_length() {
    let (script, seen) = recording(upstream::echo());
    let up = Upstream::start(script);
    let gw = Gateway::start();
    let body: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let r = request_api(
        &gw,
        &json!({
            "method": "POST", "url": up.url("/upload"),
            "headers": [{"name": "Content-Type", "value_base64": b64(b"application/octet-stream")}],
            "body": {"mode": "inline_base64", "data_base64": b64(&body)},
            "replayable": false
        }),
    );
    let v = ok(&r);
    assert_eq!(v["status"], 200);
    let got = only_request(&seen);
    assert_eq!(got.method, "POST");
    assert_eq!(got.target, "/upload");
    assert_eq!(got.body, body);
    let cl: Vec<_> = got
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .collect();
    assert_eq!(cl.len(), 1);
    assert_eq!(cl[0].1, b"70000");
    // The echo upstream answers with the raw request it read: the envelope carries it intact.
    let echoed = body_of(&v);
    assert!(echoed.ends_with(&body));
    assert!(echoed.starts_with(b"POST /upload HTTP/1.1\r\nHost: 127.0.0.1:"));
}

#[test]
fn post_without_body_sends_content_length_zero() {
    let (script, seen) = recording(upstream::echo());
    let up = Upstream::start(script);
    let gw = Gateway::start();
    let v = ok(&request_api(
        &gw,
        &json!({"method": "POST", "url": up.url("/")}),
    ));
    assert_eq!(v["status"], 200);
    let got = only_request(&seen);
    let cl: Vec<_> = got
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.clone())
        .collect();
    assert_eq!(cl, vec![b"0".to_vec()]);
}

#[test]
fn inline_request_body_at_the_limit_is_sent_and_one_byte_more_is_rejected() {
    let (script, seen) = recording(upstream::fixed(upstream::response(204, &[], b"")));
    let up = Upstream::start(script);
    let gw = Gateway::builder()
        .control("request.max_inline_request_body_bytes = 1000")
        .start();
    let at = upstream::pattern(1000);
    let v = ok(&request_api(
        &gw,
        &json!({"method": "PUT", "url": up.url("/put"),
                "body": {"mode": "inline_base64", "data_base64": b64(&at)}}),
    ));
    assert_eq!(v["status"], 204);
    assert_eq!(only_request(&seen).body, at);

    let over = upstream::pattern(1001);
    let r = request_api(
        &gw,
        &json!({"method": "PUT", "url": up.url("/put"),
                "body": {"mode": "inline_base64", "data_base64": b64(&over)}}),
    );
    let v = err(&r, 413, "body_too_large", "streaming", false);
    assert_eq!(v["details"]["direction"], "request");
    assert_eq!(v["details"]["limit_bytes"], "1000");
    assert_eq!(
        up.requests(),
        1,
        "a rejected body never reaches the destination"
    );
}

#[test]
fn head_returns_headers_and_no_body() {
    let (script, seen) = recording(Arc::new(|_: &Request| {
        vec![Step::Write(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Head: yes\r\n\r\n".to_vec(),
        )]
    }));
    let up = Upstream::start(script);
    let gw = Gateway::start();
    // Two in a row: the second runs on the pooled connection, which a HEAD answer must leave
    // clean (no body bytes expected).
    for _ in 0..2 {
        let v = ok(&request_api(
            &gw,
            &json!({"method": "HEAD", "url": up.url("/h")}),
        ));
        assert_eq!(v["status"], 200);
        assert!(body_of(&v).is_empty());
        let h = headers_of(&v);
        assert!(
            h.contains(&("Content-Length".to_string(), b"5".to_vec())),
            "{h:?}"
        );
        assert!(
            h.contains(&("X-Head".to_string(), b"yes".to_vec())),
            "{h:?}"
        );
    }
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|r| r.method == "HEAD" && r.target == "/h"));
}

#[test]
fn other_methods_reach_the_destination() {
    let (script, seen) = recording(upstream::fixed(upstream::response(200, &[], b"m")));
    let up = Upstream::start(script);
    let gw = Gateway::start();
    let methods = ["PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"];
    for m in methods {
        let v = ok(&request_api(
            &gw,
            &json!({"method": m, "url": up.url("/m")}),
        ));
        assert_eq!(body_of(&v), b"m", "{m}");
    }
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    let got: Vec<&str> = seen.iter().map(|r| r.method.as_str()).collect();
    assert_eq!(got, methods);
}

#[test]
fn destination_error_status_is_a_transported_result() {
    let up = Upstream::start(upstream::fixed(upstream::response(
        503,
        &[("Retry-After", "1")],
        b"down",
    )));
    let gw = Gateway::start();
    let v = ok(&request_api(
        &gw,
        &json!({"method": "GET", "url": up.url("/")}),
    ));
    assert_eq!(v["status"], 503);
    assert_eq!(body_of(&v), b"down");
}

#[test]
fn chunked_response_is_decoded() {
    let up = Upstream::start(upstream::chunked(vec![
        b"hello ".to_vec(),
        b"chunked ".to_vec(),
        b"world".to_vec(),
    ]));
    let gw = Gateway::start();
    let v = ok(&request_api(
        &gw,
        &json!({"method": "GET", "url": up.url("/c")}),
    ));
    assert_eq!(v["status"], 200);
    assert_eq!(body_of(&v), b"hello chunked world");
    // The body is de-framed, so the framing and connection fields are not relayed.
    for h in v["headers"].as_array().unwrap() {
        let name = h["name"].as_str().unwrap().to_ascii_lowercase();
        assert!(
            !["transfer-encoding", "connection", "keep-alive"].contains(&name.as_str()),
            "{name} relayed"
        );
    }
}

#[test]
fn close_delimited_response_is_read_to_the_close() {
    let body = upstream::pattern(100_000);
    let up = Upstream::start(upstream::close_delimited(body.clone()));
    let gw = Gateway::start();
    let v = ok(&request_api(
        &gw,
        &json!({"method": "GET", "url": up.url("/")}),
    ));
    assert_eq!(body_of(&v), body);
    let h = headers_of(&v);
    assert!(h.contains(&("X-Framing".to_string(), b"close".to_vec())));
}

#[test]
fn interim_responses_are_skipped() {
    let up = Upstream::start(upstream::interim_then_ok());
    let gw = Gateway::start();
    let v = ok(&request_api(
        &gw,
        &json!({"method": "GET", "url": up.url("/i")}),
    ));
    assert_eq!(v["status"], 200);
    assert!(body_of(&v).starts_with(b"GET /i HTTP/1.1\r\n"));
    assert!(
        !headers_of(&v).iter().any(|(n, _)| n == "Link"),
        "1xx fields are not relayed"
    );
}

#[test]
fn response_at_the_inline_limit_is_returned_whole_and_one_byte_more_is_413() {
    let at = Upstream::start(upstream::large(DEFAULT_INLINE_LIMIT));
    let over = Upstream::start(upstream::large(DEFAULT_INLINE_LIMIT + 1));
    let gw = Gateway::start();
    let v = ok(&request_api(
        &gw,
        &json!({"method": "GET", "url": at.url("/big")}),
    ));
    assert_eq!(body_of(&v), upstream::pattern(DEFAULT_INLINE_LIMIT));
    let r = request_api(&gw, &json!({"method": "GET", "url": over.url("/big")}));
    let v = err(&r, 413, "body_too_large", "streaming", false);
    assert_eq!(v["details"]["direction"], "response");
    assert!(v.get("body").is_none(), "no partial body: {v}");
}

#[test]
fn a_large_envelope_reaches_a_slow_reader_whole() {
    // The answer's head and body go out in one vectored write; a client whose receive buffer
    // is small (4 KiB) makes the gateway's send wait many times over, and must still get every
    // byte in order.
    let up = Upstream::start(upstream::large(DEFAULT_INLINE_LIMIT));
    let gw = Gateway::start();
    let envelope = json!({"method": "GET", "url": up.url("/big")}).to_string();
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    socket.connect(&gw.api.into()).expect("connect");
    let mut s: TcpStream = socket.into();
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let head = format!(
        "POST /api/v1/requests HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Authorization: Bearer {DEPLOYMENT_TOKEN}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        envelope.len()
    );
    s.write_all(head.as_bytes()).expect("head");
    s.write_all(envelope.as_bytes()).expect("envelope");
    let mut raw = Vec::new();
    let mut piece = [0u8; 4096];
    loop {
        let n = s.read(&mut piece).expect("read");
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&piece[..n]);
    }
    let v = ok(&parse_response(&raw));
    assert_eq!(body_of(&v), upstream::pattern(DEFAULT_INLINE_LIMIT));
}

#[test]
fn configured_response_limit_applies_to_every_framing() {
    let gw = Gateway::builder()
        .control("request.max_inline_response_body_bytes = 100")
        .start();
    let fits = Upstream::start(upstream::large(100));
    let v = ok(&request_api(
        &gw,
        &json!({"method": "GET", "url": fits.url("/")}),
    ));
    assert_eq!(body_of(&v).len(), 100);
    let cases = [
        ("content-length", upstream::large(101)),
        ("chunked", upstream::large_chunked(101)),
        (
            "close-delimited",
            upstream::close_delimited(upstream::pattern(101)),
        ),
    ];
    for (name, script) in cases {
        let up = Upstream::start(script);
        let r = request_api(&gw, &json!({"method": "GET", "url": up.url("/")}));
        let v = err(&r, 413, "body_too_large", "streaming", false);
        assert_eq!(v["details"]["direction"], "response", "{name}");
    }
}

#[test]
fn https_upstream_trusted_through_the_configured_ca() {
    let ca = TestCa::new();
    let (script, seen) = recording(upstream::echo());
    let up = Upstream::start_with(
        script,
        Options {
            tls: Some(ca.localhost_config()),
            ..Options::default()
        },
    );
    let gw = with_tables(
        Gateway::builder(),
        &format!(
            "[egress]\nca_file = {:?}\n",
            ca.ca_file().display().to_string()
        ),
    )
    .start();
    for host in ["localhost", "127.0.0.1"] {
        let v = ok(&request_api(
            &gw,
            &json!({"method": "GET", "url": up.https_url(host, "/secure?x=1")}),
        ));
        assert_eq!(v["status"], 200, "{host}");
        assert!(
            body_of(&v).starts_with(b"GET /secure?x=1 HTTP/1.1\r\n"),
            "{host}"
        );
    }
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    let hosts: Vec<Vec<u8>> = seen.iter().map(|r| r.headers[0].1.clone()).collect();
    assert_eq!(
        hosts,
        vec![
            format!("localhost:{}", up.port()).into_bytes(),
            format!("127.0.0.1:{}", up.port()).into_bytes()
        ]
    );
}

#[test]
fn keep_alive_to_the_destination_reuses_one_connection() {
    let up = Upstream::start(upstream::echo());
    let gw = Gateway::builder()
        .workers("[[workers]]\nid = \"w\"\n")
        .start();
    // Requests land on whichever core accepted them; each core has its own pool, so at most
    // one connection per core.
    for i in 0..6 {
        let v = ok(&request_api(
            &gw,
            &json!({"method": "GET", "url": up.url(&format!("/{i}"))}),
        ));
        assert_eq!(v["status"], 200);
    }
    assert_eq!(up.requests(), 6);
    assert!(up.connections() <= 2, "connections: {}", up.connections());
}

// ---------------------------------------------------------------------------------------------
// Errors: client
// ---------------------------------------------------------------------------------------------

#[test]
fn auth_failure_for_missing_bad_or_malformed_tokens() {
    let gw = Gateway::start();
    let body = br#"{"method":"GET","url":"http://127.0.0.1:1/"}"#;
    let bad_token = "Bearer nope".to_string();
    let lower = format!("bearer {DEPLOYMENT_TOKEN}");
    let basic = format!("Basic {DEPLOYMENT_TOKEN}");
    let longer = format!("Bearer {DEPLOYMENT_TOKEN}x");
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("missing", vec![("Content-Type", "application/json")]),
        (
            "bad token",
            vec![
                ("Authorization", &bad_token),
                ("Content-Type", "application/json"),
            ],
        ),
        (
            "basic scheme",
            vec![
                ("Authorization", &basic),
                ("Content-Type", "application/json"),
            ],
        ),
        (
            "token with a suffix",
            vec![
                ("Authorization", &longer),
                ("Content-Type", "application/json"),
            ],
        ),
    ];
    for (name, headers) in cases {
        let r = post_raw(&gw, &headers, body);
        let v = err(&r, 401, "auth_failure", "client", false);
        assert!(v.get("details").is_none(), "{name}: {v}");
    }
    // The scheme is case-insensitive (RFC 9110 §11.1); the token is not.
    let r = post_raw(
        &gw,
        &[("Authorization", &lower), ("Content-Type", "text/plain")],
        body,
    );
    err(&r, 400, "invalid_request", "client", false);
    // The token is checked before the body: garbage with a bad token is still 401.
    let r = post_raw(
        &gw,
        &[
            ("Authorization", "Bearer nope"),
            ("Content-Type", "application/json"),
        ],
        b"{{{ not json",
    );
    err(&r, 401, "auth_failure", "client", false);
}

/// Each core remembers the last token it authenticated; a token that differs from it in one
/// byte, or is a prefix or an extension of it, must still fail, on every core.
#[test]
fn near_misses_of_a_recently_accepted_token_fail() {
    let gw = Gateway::start();
    let body = br#"{"method":"GET","url":"http://127.0.0.1:1/"}"#;
    let valid = format!("Bearer {DEPLOYMENT_TOKEN}");
    let mut flipped = DEPLOYMENT_TOKEN.as_bytes().to_vec();
    let last = flipped.len() - 1;
    flipped[last] ^= 1;
    let flipped = format!("Bearer {}", String::from_utf8(flipped).expect("ascii"));
    let prefix = format!("Bearer {}", &DEPLOYMENT_TOKEN[..DEPLOYMENT_TOKEN.len() - 1]);
    let longer = format!("Bearer {DEPLOYMENT_TOKEN}x");
    // Enough rounds, each on new connections, for both cores to see the valid token first.
    for _ in 0..8 {
        let json = ("Content-Type", "application/json");
        let r = post_raw(&gw, &[("Authorization", &valid), json], body);
        assert_ne!(r.status, 401, "{}", r.text());
        for bad in [&flipped, &prefix, &longer] {
            let r = post_raw(&gw, &[("Authorization", bad), json], body);
            err(&r, 401, "auth_failure", "client", false);
        }
    }
}

#[test]
fn invalid_request_for_malformed_envelopes() {
    let gw = Gateway::start();
    let a = auth();
    let json_ct = [
        ("Authorization", a.as_str()),
        ("Content-Type", "application/json"),
    ];
    let u = "http://127.0.0.1:1/";
    let many: Vec<Value> = (0..65)
        .map(|i| json!({"name": format!("x-h{i}"), "value_base64": "YQ=="}))
        .collect();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty body", b"".to_vec()),
        ("bad JSON", br#"{"method":"GET","#.to_vec()),
        ("not an object", b"[1,2]".to_vec()),
        ("unknown field", format!(r#"{{"method":"GET","url":"{u}","foo":1}}"#).into_bytes()),
        ("trailing data", format!(r#"{{"method":"GET","url":"{u}"}} {{}}"#).into_bytes()),
        ("duplicate key", format!(r#"{{"method":"GET","method":"GET","url":"{u}"}}"#).into_bytes()),
        ("invalid UTF-8", b"{\"method\":\"GET\",\"url\":\"http://a\xff/\"}".to_vec()),
        ("missing url", br#"{"method":"GET"}"#.to_vec()),
        ("missing method", format!(r#"{{"url":"{u}"}}"#).into_bytes()),
        ("CONNECT", format!(r#"{{"method":"CONNECT","url":"{u}"}}"#).into_bytes()),
        ("lowercase method", format!(r#"{{"method":"get","url":"{u}"}}"#).into_bytes()),
        ("unknown method", format!(r#"{{"method":"BREW","url":"{u}"}}"#).into_bytes()),
        ("scheme ftp", br#"{"method":"GET","url":"ftp://example.com/"}"#.to_vec()),
        ("relative URL", br#"{"method":"GET","url":"/just/a/path"}"#.to_vec()),
        ("user info", br#"{"method":"GET","url":"http://user:pw@example.com/"}"#.to_vec()),
        ("fragment", br#"{"method":"GET","url":"http://example.com/#top"}"#.to_vec()),
        ("empty host", br#"{"method":"GET","url":"http:///path"}"#.to_vec()),
        ("short IPv4", br#"{"method":"GET","url":"http://127.1/"}"#.to_vec()),
        ("zone id", br#"{"method":"GET","url":"http://[fe80::1%25eth0]/"}"#.to_vec()),
        ("bad port", br#"{"method":"GET","url":"http://example.com:99999/"}"#.to_vec()),
        ("space in URL", br#"{"method":"GET","url":"http://example.com/a b"}"#.to_vec()),
        ("null field", format!(r#"{{"method":"GET","url":"{u}","timeout_ms":null}}"#).into_bytes()),
        ("timeout below 1000", format!(r#"{{"method":"GET","url":"{u}","timeout_ms":999}}"#).into_bytes()),
        ("timeout as string", format!(r#"{{"method":"GET","url":"{u}","timeout_ms":"5000"}}"#).into_bytes()),
        (
            "managed Host header",
            format!(r#"{{"method":"GET","url":"{u}","headers":[{{"name":"Host","value_base64":"eA=="}}]}}"#).into_bytes(),
        ),
        (
            "hop-by-hop header",
            format!(r#"{{"method":"GET","url":"{u}","headers":[{{"name":"Connection","value_base64":"eA=="}}]}}"#).into_bytes(),
        ),
        (
            "service header",
            format!(r#"{{"method":"GET","url":"{u}","headers":[{{"name":"X-Service-Route-Tags","value_base64":"eA=="}}]}}"#).into_bytes(),
        ),
        (
            "header name not a token",
            format!(r#"{{"method":"GET","url":"{u}","headers":[{{"name":"a b","value_base64":"eA=="}}]}}"#).into_bytes(),
        ),
        (
            "header value not base64",
            format!(r#"{{"method":"GET","url":"{u}","headers":[{{"name":"a","value_base64":"!!"}}]}}"#).into_bytes(),
        ),
        (
            "65 headers",
            json!({"method": "GET", "url": u, "headers": many}).to_string().into_bytes(),
        ),
        (
            "body not base64",
            format!(r#"{{"method":"POST","url":"{u}","body":{{"mode":"inline_base64","data_base64":"***"}}}}"#).into_bytes(),
        ),
        (
            "body mode unknown",
            format!(r#"{{"method":"POST","url":"{u}","body":{{"mode":"raw","data_base64":"YQ=="}}}}"#).into_bytes(),
        ),
        (
            "receipt body without object storage",
            format!(r#"{{"method":"POST","url":"{u}","body":{{"mode":"receipt","receipt_id":"rcpt_0123456789abcdef0123456789abcdef"}}}}"#).into_bytes(),
        ),
        (
            "receipt response mode without object storage",
            format!(r#"{{"method":"GET","url":"{u}","response_body_mode":"receipt"}}"#).into_bytes(),
        ),
        (
            "TRACE with a body",
            format!(r#"{{"method":"TRACE","url":"{u}","body":{{"mode":"inline_base64","data_base64":"YQ=="}}}}"#).into_bytes(),
        ),
        (
            "unknown country",
            format!(r#"{{"method":"GET","url":"{u}","routing":{{"country":"ZZ"}}}}"#).into_bytes(),
        ),
        (
            "duplicate tags",
            format!(r#"{{"method":"GET","url":"{u}","routing":{{"tags":["a","a"]}}}}"#).into_bytes(),
        ),
        (
            "unknown fingerprint profile",
            format!(r#"{{"method":"GET","url":"{u}","fingerprint_profile":"Chrome_131"}}"#).into_bytes(),
        ),
    ];
    for (name, body) in &cases {
        let r = post_raw(&gw, &json_ct, body);
        assert_eq!(r.status, 400, "{name}: {}", r.text());
        let v = err(&r, 400, "invalid_request", "client", false);
        assert!(!v["message"].as_str().unwrap_or("").is_empty(), "{name}");
    }
    let good = format!(r#"{{"method":"GET","url":"{u}"}}"#);
    for ct in [
        None,
        Some("text/plain"),
        Some("application/jsonx"),
        Some("multipart/form-data"),
    ] {
        let mut h = vec![("Authorization", a.as_str())];
        if let Some(ct) = ct {
            h.push(("Content-Type", ct));
        }
        let r = post_raw(&gw, &h, good.as_bytes());
        let v = err(&r, 400, "invalid_request", "client", false);
        assert!(
            v["message"].as_str().unwrap_or("").contains("Content-Type"),
            "{ct:?}: {v}"
        );
    }
}

#[test]
fn content_type_parameters_and_case_are_accepted() {
    let up = Upstream::start(upstream::fixed(upstream::response(200, &[], b"")));
    let gw = Gateway::start();
    let a = auth();
    for ct in ["application/json; charset=utf-8", "Application/JSON"] {
        let body = json!({"method": "GET", "url": up.url("/")}).to_string();
        let r = post_raw(
            &gw,
            &[("Authorization", &a), ("Content-Type", ct)],
            body.as_bytes(),
        );
        ok(&r);
    }
}

#[test]
fn header_injection_failed_for_cr_or_lf() {
    let gw = Gateway::start();
    let u = "http://127.0.0.1:1/";
    let cases = [
        json!({"method": "GET", "url": u,
               "headers": [{"name": "X-A", "value_base64": b64(b"a\r\nX-Injected: 1")}]}),
        json!({"method": "GET", "url": u,
               "headers": [{"name": "X-A", "value_base64": b64(b"a\nb")}]}),
        json!({"method": "GET", "url": u,
               "headers": [{"name": "X-A\r\nX-B", "value_base64": "YQ=="}]}),
    ];
    for c in &cases {
        err(
            &request_api(&gw, c),
            400,
            "header_injection_failed",
            "client",
            false,
        );
    }
}

#[test]
fn envelope_over_4_mib_is_413_and_at_4_mib_is_accepted() {
    let up = Upstream::start(upstream::fixed(upstream::response(200, &[], b"fine")));
    let gw = Gateway::start();
    let a = auth();
    let h = [
        ("Authorization", a.as_str()),
        ("Content-Type", "application/json"),
    ];
    let mut at = json!({"method": "GET", "url": up.url("/")})
        .to_string()
        .into_bytes();
    at.resize(ENVELOPE_LIMIT, b' ');
    let v = ok(&post_raw(&gw, &h, &at));
    assert_eq!(body_of(&v), b"fine");

    let mut over = at.clone();
    over.push(b' ');
    let r = post_raw(&gw, &h, &over);
    let v = err(&r, 413, "body_too_large", "streaming", false);
    assert_eq!(v["details"]["direction"], "request");
    assert_eq!(v["details"]["limit_bytes"], ENVELOPE_LIMIT.to_string());
    assert_eq!(up.requests(), 1);

    // Far over the limit, announced up front: answered without reading the whole body.
    let big = vec![b' '; ENVELOPE_LIMIT * 2];
    let r = send_tolerant(gw.api, &h, &big);
    let v = err(&r, 413, "body_too_large", "streaming", false);
    assert_eq!(v["details"]["limit_bytes"], ENVELOPE_LIMIT.to_string());
}

/// Sends a POST whose body the server may refuse to read: the body goes out on another thread
/// and write errors are ignored; the answer is read here.
fn send_tolerant(addr: SocketAddr, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let mut head = format!(
        "POST /api/v1/requests HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).expect("head");
    let mut w = s.try_clone().expect("clone");
    let body = body.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(&body);
    });
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) => {
                assert!(!raw.is_empty(), "no answer before {e}");
                break;
            }
        }
    }
    let _ = s.shutdown(std::net::Shutdown::Both);
    let _ = writer.join();
    parse_response(&raw)
}

#[test]
fn destination_denied_by_the_default_policy() {
    let up = Upstream::start(upstream::echo());
    let gw = Gateway::builder().snapshot(None).start();
    let urls = [
        up.url("/"),
        format!("http://localhost:{}/", up.port()),
        format!("http://[::1]:{}/", up.port()),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        "http://10.0.0.1/".to_string(),
    ];
    for u in &urls {
        let r = request_api(&gw, &json!({"method": "GET", "url": u}));
        err(&r, 403, "destination_denied", "client", false);
    }
    assert_eq!(up.connections(), 0, "a denied destination is never dialled");
}

#[test]
fn destination_denied_by_a_deny_range_inside_an_allowed_one() {
    let up = Upstream::start(upstream::echo());
    let snap = json!({
        "default_timeout_ms": 60000,
        "routing": {"rules": [rule("default", json!({}), &["direct"], 0, true)]},
        "pools": [{"id": "direct"}],
        "destinations": {"allow": ["127.0.0.0/8"], "deny": ["127.0.0.1/32"]}
    })
    .to_string();
    let gw = Gateway::builder().snapshot(Some(&snap)).start();
    let r = request_api(&gw, &json!({"method": "GET", "url": up.url("/")}));
    err(&r, 403, "destination_denied", "client", false);
    assert_eq!(up.connections(), 0);
}

// ---------------------------------------------------------------------------------------------
// Errors: routing
// ---------------------------------------------------------------------------------------------

#[test]
fn route_no_match_when_the_only_rule_needs_a_country() {
    let up = Upstream::start(upstream::echo());
    let snap = snapshot(
        json!([rule(
            "us-only",
            json!({"country": "US"}),
            &["direct"],
            0,
            true
        )]),
        json!([{"id": "direct"}]),
    );
    let gw = Gateway::builder()
        .snapshot(Some(&snap))
        .workers("[[workers]]\nid = \"us\"\ncountry = \"US\"\n")
        .start();
    let r = request_api(&gw, &json!({"method": "GET", "url": up.url("/")}));
    err(&r, 404, "route_no_match", "routing", false);
    let r = request_api(
        &gw,
        &json!({"method": "GET", "url": up.url("/"), "routing": {"country": "DE"}}),
    );
    err(&r, 404, "route_no_match", "routing", false);
    // The matching hint routes (normalised to uppercase).
    let v = ok(&request_api(
        &gw,
        &json!({"method": "GET", "url": up.url("/"), "routing": {"country": "us"}}),
    ));
    assert_eq!(v["status"], 200);
    assert_eq!(up.requests(), 1);
}

#[test]
fn route_unavailable_when_no_worker_serves_the_pool_or_the_hint() {
    let up = Upstream::start(upstream::echo());
    let snap = snapshot(
        json!([
            rule(
                "by-host",
                json!({"host": "localhost"}),
                &["direct"],
                0,
                true
            ),
            json!({"id": "orphan", "priority": 200, "constraints": {}, "pools": ["nobody"],
                   "sticky_session_ttl_seconds": 0, "allow_sticky_fallback": true}),
        ]),
        json!([{"id": "direct"}, {"id": "nobody"}]),
    );
    let gw = Gateway::builder().snapshot(Some(&snap)).start();
    let r = request_api(&gw, &json!({"method": "GET", "url": up.url("/")}));
    err(&r, 503, "route_unavailable", "routing", true);
    // The host rule routes to the default worker, but a tag no worker advertises leaves none.
    let localhost = format!("http://localhost:{}/", up.port());
    let v = ok(&request_api(
        &gw,
        &json!({"method": "GET", "url": localhost}),
    ));
    assert_eq!(v["status"], 200);
    let r = request_api(
        &gw,
        &json!({"method": "GET", "url": localhost, "routing": {"tags": ["gpu"]}}),
    );
    err(&r, 503, "route_unavailable", "routing", true);
}

#[test]
fn executor_capacity_exhausted_while_the_only_slot_is_busy() {
    let gate = Gate::new();
    let up = Upstream::start(gate.script(upstream::echo()));
    let gw = Gateway::builder()
        .workers("[[workers]]\nid = \"solo\"\ncapacity = 1\n")
        .start();
    let url = up.url("/slow");
    let first = {
        let body = json!({"method": "GET", "url": url});
        let api = gw.api;
        in_background(move || post_envelope(api, &body))
    };
    wait_until(SETTLE, "the first request to reach the upstream", || {
        up.requests() == 1
    });
    assert_eq!(worker(&gw, "solo")["capacity"]["active"], 1);
    assert_eq!(worker(&gw, "solo")["capacity"]["available"], 0);
    let r = request_api(&gw, &json!({"method": "GET", "url": up.url("/second")}));
    err(&r, 503, "executor_capacity_exhausted", "routing", true);
    gate.open();
    let v = ok(&first.join().expect("first request"));
    assert!(body_of(&v).starts_with(b"GET /slow "));
    // The slot is free again.
    let v = ok(&request_api(
        &gw,
        &json!({"method": "GET", "url": up.url("/third")}),
    ));
    assert!(body_of(&v).starts_with(b"GET /third "));
    assert_eq!(worker(&gw, "solo")["capacity"]["active"], 0);
}

/// Decision 043: a deployment has at most `control.request.max_concurrent_per_deployment`
/// requests in flight; one more is refused from its head with a retryable
/// `executor_capacity_exhausted` naming the limit, and the count comes back as requests end.
#[test]
fn concurrent_requests_per_deployment_are_limited() {
    let gate = Gate::new();
    let up = Upstream::start(gate.script(upstream::echo()));
    let gw = Gateway::builder()
        .control("[control.request]\nmax_concurrent_per_deployment = 2\n")
        .start();
    let held: Vec<_> = (0..2)
        .map(|i| {
            let body = json!({"method": "GET", "url": up.url(&format!("/held{i}"))});
            let api = gw.api;
            in_background(move || post_envelope(api, &body))
        })
        .collect();
    wait_until(SETTLE, "both requests to reach the upstream", || {
        up.requests() == 2
    });
    let r = request_api(&gw, &json!({"method": "GET", "url": up.url("/third")}));
    let v = err(&r, 503, "executor_capacity_exhausted", "routing", true);
    assert_eq!(v["retry_after_ms"], 100, "{v}");
    assert_eq!(v["details"]["reason"], "deployment_concurrency", "{v}");
    assert_eq!(v["details"]["limit"], "2", "{v}");
    gate.open();
    for h in held {
        ok(&h.join().expect("held request"));
    }
    ok(&request_api(
        &gw,
        &json!({"method": "GET", "url": up.url("/after")}),
    ));
}

/// Decision 043: request bodies in flight share `control.request.max_in_flight_body_bytes`,
/// reserved from the head. A client that announced a large envelope and sends it slowly holds
/// its share; another request that does not fit is refused before its body is read, and fits
/// again once the first is gone.
#[test]
fn request_bodies_in_flight_share_a_byte_budget() {
    let up = Upstream::start(upstream::echo());
    let gw = Gateway::builder()
        .control("[control.request]\nmax_in_flight_body_bytes = 4194305\n")
        .start();
    let mut slow = TcpStream::connect(gw.api).expect("connect");
    // The slow client asks for `100 Continue`: the gateway sends it once the request is admitted
    // and its body is being read, so the budget is known to be taken before anything else is
    // sent (without it, a request below could be admitted first and the slow one refused).
    let head = format!(
        "POST /api/v1/requests HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\n\
         Content-Type: application/json\r\nContent-Length: 4000000\r\n\
         Expect: 100-continue\r\n\r\n",
        auth()
    );
    slow.write_all(head.as_bytes()).expect("head");
    slow.set_read_timeout(Some(SETTLE)).expect("read timeout");
    let mut interim = Vec::new();
    let mut byte = [0u8; 1];
    while !interim.ends_with(b"\r\n\r\n") {
        let n = slow.read(&mut byte).expect("the interim response");
        assert_eq!(n, 1, "closed after {:?}", String::from_utf8_lossy(&interim));
        interim.push(byte[0]);
    }
    assert!(
        interim.starts_with(b"HTTP/1.1 100 "),
        "{:?}",
        String::from_utf8_lossy(&interim)
    );
    slow.write_all(b"{").expect("the first body byte");
    let envelope = json!({
        "method": "POST",
        "url": up.url("/fits-not"),
        "body": {"mode": "inline_base64", "data_base64": b64(&[7u8; 200_000])},
    });
    wait_until(SETTLE, "the budget to be taken by the slow body", || {
        let r = request_api(&gw, &envelope);
        r.status == 503
    });
    let r = request_api(&gw, &envelope);
    let v = err(&r, 503, "executor_capacity_exhausted", "routing", true);
    assert_eq!(v["retry_after_ms"], 100, "{v}");
    assert_eq!(v["details"]["reason"], "in_flight_body_bytes", "{v}");
    assert_eq!(v["details"]["limit"], "4194305", "{v}");
    drop(slow);
    wait_until(SETTLE, "the budget to come back", || {
        request_api(&gw, &json!({"method": "GET", "url": up.url("/fits")})).status == 200
    });
}

/// POSTs an envelope with the test token to the API at `addr` (for use on other threads).
fn post_envelope(addr: SocketAddr, body: &Value) -> Resp {
    let a = auth();
    http(
        addr,
        "POST",
        "/api/v1/requests",
        &[("Authorization", &a), ("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
}

#[test]
fn sticky_session_unavailable_when_the_pinned_worker_drains_and_fallback_is_off() {
    let up = Upstream::start(upstream::echo());
    let snap = snapshot(
        json!([rule("sticky", json!({}), &["direct"], 600, false)]),
        json!([{"id": "direct"}]),
    );
    let gw = Gateway::builder()
        .snapshot(Some(&snap))
        .workers("[[workers]]\nid = \"w1\"\n\n[[workers]]\nid = \"w2\"\n")
        .start();
    let sticky = |id: &str| json!({"method": "GET", "url": up.url("/"), "routing": {"sticky_session_id": id}});
    // Drain w2 so that session s1 is pinned to w1, then bring w2 back.
    worker_action(&gw, "w2", "drain");
    ok(&request_api(&gw, &sticky("s1")));
    worker_action(&gw, "w2", "undrain");
    // With w1 draining, the pinned worker is unavailable and the rule forbids fallback.
    worker_action(&gw, "w1", "drain");
    let r = request_api(&gw, &sticky("s1"));
    err(&r, 503, "sticky_session_unavailable", "routing", false);
    // Other sessions and unpinned requests go to w2.
    ok(&request_api(&gw, &sticky("s2")));
    ok(&request_api(
        &gw,
        &json!({"method": "GET", "url": up.url("/")}),
    ));
    // Back on w1, the pin is honoured again.
    worker_action(&gw, "w1", "undrain");
    ok(&request_api(&gw, &sticky("s1")));
}

/// A sticky session pinned to w1 falls back to w2 when w1 is unavailable and fallback is
/// allowed, and is pinned there: told apart by the source address each worker binds.
#[test]
fn sticky_fallback_repins_when_allowed() {
    let peers = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let p = peers.clone();
    let up = Upstream::start(std::sync::Arc::new(move |r: &upstream::Request| {
        p.lock().unwrap().push(r.peer.ip().to_string());
        vec![upstream::Step::Write(upstream::response(200, &[], b"ok"))]
    }));
    let snap = snapshot(
        json!([rule("sticky", json!({}), &["direct"], 600, true)]),
        json!([{"id": "direct"}]),
    );
    let gw = Gateway::builder()
        .snapshot(Some(&snap))
        .workers(
            "[[workers]]\nid = \"w1\"\nbind_address = \"127.0.0.2\"\n\n\
             [[workers]]\nid = \"w2\"\nbind_address = \"127.0.0.3\"\n",
        )
        .start();
    let body = json!({"method": "GET", "url": up.url("/"), "routing": {"sticky_session_id": "s"}});
    worker_action(&gw, "w2", "drain");
    ok(&request_api(&gw, &body));
    worker_action(&gw, "w2", "undrain");
    // Still pinned to w1 while it is available.
    ok(&request_api(&gw, &body));
    worker_action(&gw, "w1", "disable");
    ok(&request_api(&gw, &body));
    // Re-pinned to w2: it stays there once w1 is back.
    worker_action(&gw, "w1", "enable");
    ok(&request_api(&gw, &body));
    assert_eq!(
        *peers.lock().unwrap(),
        ["127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"]
    );
}

// ---------------------------------------------------------------------------------------------
// Errors: transport and egress
// ---------------------------------------------------------------------------------------------

/// Without the fingerprinted connector local workers advertise no profile (decision 082); with
/// it, `tests/it/fingerprints.rs` covers fingerprinted requests. `.ci/run` runs this test in the
/// build without the feature.
#[cfg(not(feature = "fingerprints"))]
#[test]
fn unsupported_fingerprint_when_local_workers_advertise_none() {
    let up = Upstream::start(upstream::echo());
    let gw = Gateway::start();
    for profile in ["chrome_131", "firefox_133"] {
        let r = request_api(
            &gw,
            &json!({"method": "GET", "url": up.url("/"), "fingerprint_profile": profile}),
        );
        err(&r, 400, "unsupported_fingerprint", "transport", false);
    }
    assert_eq!(up.connections(), 0);
}

#[test]
fn total_deadline_while_waiting_for_the_response_head() {
    let gate = Gate::new();
    let up = Upstream::start(gate.script(upstream::echo()));
    let gw = Gateway::start();
    let started = Instant::now();
    let r = request_api(
        &gw,
        &json!({"method": "GET", "url": up.url("/"), "timeout_ms": 1000}),
    );
    let took = started.elapsed();
    let v = err(&r, 504, "timeout_exceeded", "transport", false);
    assert_eq!(v["timeout_type"], "response_header_timeout");
    assert_eq!(v["details"]["timeout_type"], "response_header_timeout");
    assert_eq!(v["details"]["stage"], "response_header");
    assert!(took >= Duration::from_millis(1000), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn total_deadline_while_reading_the_response_body() {
    // The head and half the body go out at once; the rest only long after the deadline.
    let up = Upstream::start(upstream::slow_body(200, 100, Duration::from_secs(5)));
    let gw = Gateway::start();
    let started = Instant::now();
    let r = request_api(
        &gw,
        &json!({"method": "GET", "url": up.url("/"), "timeout_ms": 1000}),
    );
    let v = err(&r, 504, "timeout_exceeded", "transport", false);
    assert_eq!(v["timeout_type"], "download_timeout");
    assert_eq!(v["details"]["stage"], "response_body");
    assert!(started.elapsed() < Duration::from_secs(4));
}

#[test]
fn idle_timeout_when_the_body_stalls() {
    // The stage limit is `egress.idle_timeout_ms` without a byte moving, here 1 s, under a
    // total deadline long enough not to fire first.
    let up = Upstream::start(upstream::slow_body(200, 100, Duration::from_secs(45)));
    let gw = Gateway::builder()
        .control("[egress]\nidle_timeout_ms = 1000\n")
        .start();
    let started = Instant::now();
    let r = request_api(
        &gw,
        &json!({"method": "GET", "url": up.url("/"), "timeout_ms": 50000}),
    );
    let took = started.elapsed();
    let v = err(&r, 504, "timeout_exceeded", "transport", false);
    assert_eq!(v["timeout_type"], "idle_timeout");
    assert_eq!(v["details"]["timeout_type"], "idle_timeout");
    assert_eq!(v["details"]["stage"], "response_body");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(10),
        "{took:?}"
    );
}

#[test]
fn default_timeout_comes_from_the_snapshot() {
    let gate = Gate::new();
    let up = Upstream::start(gate.script(upstream::echo()));
    let snap = json!({
        "default_timeout_ms": 1000,
        "routing": {"rules": [rule("default", json!({}), &["direct"], 0, true)]},
        "pools": [{"id": "direct"}],
        "destinations": {"allow": ["127.0.0.0/8"], "deny": []}
    })
    .to_string();
    let gw = Gateway::builder().snapshot(Some(&snap)).start();
    let started = Instant::now();
    let r = request_api(&gw, &json!({"method": "GET", "url": up.url("/")}));
    let v = err(&r, 504, "timeout_exceeded", "transport", false);
    assert_eq!(v["timeout_type"], "response_header_timeout");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn max_timeout_caps_explicit_timeouts() {
    let gate = Gate::new();
    let up = Upstream::start(gate.script(upstream::echo()));
    let gw = Gateway::builder()
        .control("request.max_timeout_ms = 1000")
        .start();
    let started = Instant::now();
    let r = request_api(
        &gw,
        &json!({"method": "GET", "url": up.url("/"), "timeout_ms": 60000}),
    );
    let v = err(&r, 504, "timeout_exceeded", "transport", false);
    assert_eq!(v["timeout_type"], "response_header_timeout");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn upstream_dns_failure_for_an_unresolvable_name() {
    let gw = Gateway::start();
    let r = request_api(
        &gw,
        &json!({"method": "GET", "url": "http://no-such-host.invalid/", "timeout_ms": 20000}),
    );
    let v = err(&r, 502, "upstream_dns_failure", "egress", true);
    assert!(v["details"]["reason"].is_string(), "{v}");
}

#[test]
fn upstream_connection_refused_on_a_closed_port() {
    let gw = Gateway::start();
    let port = closed_port();
    let r = request_api(
        &gw,
        &json!({"method": "GET", "url": format!("http://127.0.0.1:{port}/")}),
    );
    let v = err(&r, 502, "upstream_connection_refused", "egress", true);
    assert_eq!(v["details"]["reason"], "connection refused");
}

#[test]
fn upstream_reset_before_and_during_the_response() {
    let before = Upstream::start(upstream::reset());
    let during = Upstream::start(upstream::reset_mid_body());
    let gw = Gateway::start();
    for (up, stage) in [(&before, "response_header"), (&during, "response_body")] {
        let r = request_api(&gw, &json!({"method": "GET", "url": up.url("/")}));
        let v = err(&r, 502, "upstream_reset", "egress", true);
        assert_eq!(v["details"]["stage"], stage, "{v}");
    }
}

#[test]
fn upstream_tls_failure_for_an_untrusted_certificate() {
    let up = Upstream::start_with(
        upstream::echo(),
        Options {
            tls: Some(untrusted_config()),
            ..Options::default()
        },
    );
    let gw = Gateway::start();
    let r = request_api(
        &gw,
        &json!({"method": "GET", "url": up.https_url("localhost", "/")}),
    );
    let v = err(&r, 502, "upstream_tls_failure", "egress", true);
    assert_eq!(v["details"]["reason"], "invalid certificate: UnknownIssuer");
    assert_eq!(up.requests(), 0);
}

#[test]
fn upstream_tls_failure_for_a_name_the_certificate_does_not_cover() {
    let ca = TestCa::new();
    let up = Upstream::start_with(
        upstream::echo(),
        Options {
            tls: Some(ca.server_config(&["other.test"])),
            ..Options::default()
        },
    );
    let gw = with_tables(
        Gateway::builder(),
        &format!(
            "[egress]\nca_file = {:?}\n",
            ca.ca_file().display().to_string()
        ),
    )
    .start();
    let r = request_api(
        &gw,
        &json!({"method": "GET", "url": up.https_url("localhost", "/")}),
    );
    let v = err(&r, 502, "upstream_tls_failure", "egress", true);
    assert_eq!(
        v["details"]["reason"],
        "invalid certificate: NotValidForName"
    );
}

/// A listener whose accept queue is full: further SYNs are dropped by the kernel, so a connect
/// to it hangs (on loopback, without any firewall rule). Keep the returned values alive.
fn black_hole() -> (socket2::Socket, Vec<TcpStream>, SocketAddr) {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .expect("bind");
    s.listen(0).expect("listen");
    let addr = s.local_addr().expect("addr").as_socket().expect("inet");
    // With a backlog of 0 the queue holds one connection; fill it (and try one more, which
    // may already hang) so that the gateway's SYN is dropped.
    let mut fill = Vec::new();
    for _ in 0..2 {
        if let Ok(c) = TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
            fill.push(c);
        }
    }
    assert!(!fill.is_empty(), "the accept queue took no connection");
    (s, fill, addr)
}

#[test]
fn connect_that_hangs_ends_at_the_total_deadline_or_the_connect_limit() {
    let (_l, _fill, addr) = black_hole();
    let gw = Gateway::start();
    let url = format!("http://{addr}/");
    let started = Instant::now();
    let r = request_api(
        &gw,
        &json!({"method": "GET", "url": url, "timeout_ms": 1000}),
    );
    let v = err(&r, 504, "timeout_exceeded", "transport", false);
    assert_eq!(v["timeout_type"], "connect_timeout");
    assert_eq!(v["details"]["stage"], "connect");
    assert!(started.elapsed() < Duration::from_secs(5));

    // With a longer deadline the per-attempt connect limit (10 s) fires first.
    let started = Instant::now();
    let r = request_api(
        &gw,
        &json!({"method": "GET", "url": url, "timeout_ms": 15000}),
    );
    let v = err(&r, 504, "upstream_connect_timeout", "egress", true);
    assert_eq!(v["timeout_type"], "connect_timeout");
    assert_eq!(v["details"]["timeout_type"], "connect_timeout");
    assert_eq!(v["details"]["stage"], "connect");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(14),
        "{took:?}"
    );
}

#[test]
fn tls_handshake_that_never_answers_is_a_connect_timeout() {
    // Accepts TCP and never says a word: the TLS handshake is bounded by the connect limit.
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let gw = Gateway::start();
    let url = format!("https://{addr}/");
    let started = Instant::now();
    let r = request_api(
        &gw,
        &json!({"method": "GET", "url": url, "timeout_ms": 15000}),
    );
    let v = err(&r, 504, "upstream_connect_timeout", "egress", true);
    assert_eq!(v["timeout_type"], "connect_timeout");
    assert_eq!(v["details"]["stage"], "tls_handshake");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(14),
        "{took:?}"
    );
    drop(l);
}

#[test]
fn protocol_error_for_garbage_and_for_101() {
    let garbage = Upstream::start(upstream::fixed(b"SSH-2.0-OpenSSH_9.6\r\n\r\n".to_vec()));
    let switching = Upstream::start(upstream::fixed(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
            .to_vec(),
    ));
    let bad_length = Upstream::start(upstream::fixed(
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello".to_vec(),
    ));
    let gw = Gateway::start();
    for up in [&garbage, &switching, &bad_length] {
        let r = request_api(&gw, &json!({"method": "GET", "url": up.url("/")}));
        let v = err(&r, 502, "protocol_error", "transport", false);
        assert_eq!(v["details"]["side"], "upstream", "{v}");
    }
}

#[test]
fn executor_internal_error_for_a_source_address_this_host_lacks() {
    let up = Upstream::start(upstream::echo());
    // 192.0.2.1 (TEST-NET-1) is not an address of this host, so binding to it fails.
    let gw = Gateway::builder()
        .workers("[[workers]]\nid = \"w\"\nbind_address = \"192.0.2.1\"\n")
        .start();
    let r = request_api(&gw, &json!({"method": "GET", "url": up.url("/")}));
    err(&r, 502, "executor_internal_error", "egress", false);
    assert_eq!(up.connections(), 0);
}

#[test]
fn source_address_of_a_worker_is_used() {
    let up = Upstream::start(upstream::echo());
    let gw = Gateway::builder()
        .workers("[[workers]]\nid = \"w\"\nbind_address = \"127.0.0.2\"\n")
        .start();
    let v = ok(&request_api(
        &gw,
        &json!({"method": "GET", "url": up.url("/")}),
    ));
    let peer = headers_of(&v)
        .into_iter()
        .find(|(n, _)| n == "X-Peer")
        .map(|(_, v)| String::from_utf8_lossy(&v).into_owned())
        .expect("X-Peer");
    assert!(peer.starts_with("127.0.0.2:"), "{peer}");
}

#[test]
fn cancelled_by_the_operator_through_the_admin_api() {
    let gate = Gate::new();
    let up = Upstream::start(gate.script(upstream::echo()));
    let gw = Gateway::start();
    let caller = {
        let body = json!({"method": "GET", "url": up.url("/slow")});
        let api = gw.api;
        in_background(move || post_envelope(api, &body))
    };
    let mut ids = Vec::new();
    wait_until(SETTLE, "the request to be listed as active", || {
        ids = active_request_ids(&gw);
        !ids.is_empty()
    });
    assert_eq!(ids.len(), 1, "{ids:?}");
    let id = ids[0].clone();
    assert!(is_request_id(&id), "{id}");
    let path = format!("/api/v1/admin/requests/{id}");
    let r = admin(&gw, "DELETE", &path, &[], b"");
    assert_eq!(r.status, 204, "{}", r.text());
    assert!(r.body.is_empty());
    let r = caller.join().expect("caller");
    let v = err(&r, 499, "cancelled", "client", false);
    assert_eq!(
        v["request_id"],
        id.as_str(),
        "the caller learns the id the operator saw"
    );
    wait_until(SETTLE, "the request to leave the active list", || {
        active_request_ids(&gw).is_empty()
    });
    // Repeating the cancellation is safe.
    let r = admin(&gw, "DELETE", &path, &[], b"");
    assert_eq!(r.status, 204, "{}", r.text());
    let r = admin(
        &gw,
        "DELETE",
        "/api/v1/admin/requests/req_0123456789abcdef0123456789abcdef",
        &[],
        b"",
    );
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"], "request_not_found");
    // Capacity came back.
    assert_eq!(worker(&gw, "local")["capacity"]["active"], 0);
    drop(gate);
}
