//! Black-box tests of the request API listener at the HTTP level: keep-alive, pipelining,
//! `Expect: 100-continue`, paths and methods, malformed requests, slow clients, and a thousand
//! concurrent requests through one gateway.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::gateway::{
    admin, http, parse_response, unb64, wait_until, Gateway, Resp, DEPLOYMENT_TOKEN,
};
use support::upstream::{self, Upstream};

/// How long a test waits for one answer on a raw connection.
const READ_LIMIT: Duration = Duration::from_secs(30);
/// The API listener's default limit for a complete request head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

fn is_request_id(s: &str) -> bool {
    s.strip_prefix("req_").is_some_and(|h| {
        h.len() == 32
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// One `POST /api/v1/requests` with the test token as raw bytes, keep-alive.
fn envelope_request(addr: SocketAddr, envelope: &Value) -> Vec<u8> {
    let body = envelope.to_string();
    let mut out = format!(
        "POST /api/v1/requests HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {DEPLOYMENT_TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(READ_LIMIT)).ok();
    s
}

/// Reads one `Content-Length` response from `s`; bytes past it stay in `buf`.
fn read_one(s: &mut TcpStream, buf: &mut Vec<u8>) -> Resp {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = parse_response(&buf[..end + 4]);
            let len: usize = head
                .header("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                let rest = buf.split_off(end + 4 + len);
                let resp = parse_response(buf);
                *buf = rest;
                return resp;
            }
        }
        let n = s.read(&mut chunk).expect("read response");
        assert!(
            n > 0,
            "connection closed mid-response: {:?}",
            String::from_utf8_lossy(buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Reads until the peer closes (or the read limit), returning everything read.
fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => return raw,
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return raw,
            Err(e) => panic!("connection still open after the read limit: {e}"),
        }
    }
}

/// Asserts a 200 result whose body is the echo of a request for `path`.
fn assert_echo_of(r: &Resp, path: &str) {
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["status"], 200);
    let body = unb64(&v["body"]["data_base64"]);
    let line = format!("GET {path} HTTP/1.1\r\n");
    assert!(
        body.starts_with(line.as_bytes()),
        "expected {line:?}, got {:?}",
        String::from_utf8_lossy(&body)
    );
}

/// Asserts the registry error envelope as the body of an HTTP-level rejection.
fn assert_envelope(r: &Resp, status: u16, code: &str) {
    assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = r.json();
    assert_eq!(v["code"], code, "{v}");
    assert_eq!(
        v["category"],
        if code == "body_too_large" {
            "streaming"
        } else {
            "client"
        }
    );
    assert_eq!(v["retryable"], false);
    assert!(is_request_id(v["request_id"].as_str().unwrap_or("")), "{v}");
}

#[test]
fn keep_alive_serves_several_requests_on_one_connection() {
    let up = Upstream::start(upstream::echo());
    let gw = Gateway::start();
    let mut s = connect(gw.api);
    let mut buf = Vec::new();
    for i in 0..5 {
        let path = format!("/ka/{i}");
        s.write_all(&envelope_request(
            gw.api,
            &json!({"method": "GET", "url": up.url(&path)}),
        ))
        .expect("write");
        let r = read_one(&mut s, &mut buf);
        assert_echo_of(&r, &path);
        assert_ne!(r.header("connection"), Some("close"));
    }
    // Errors keep the connection too.
    s.write_all(&envelope_request(
        gw.api,
        &json!({"method": "BREW", "url": up.url("/")}),
    ))
    .expect("write");
    let r = read_one(&mut s, &mut buf);
    assert_envelope(&r, 400, "invalid_request");
    s.write_all(&envelope_request(
        gw.api,
        &json!({"method": "GET", "url": up.url("/after")}),
    ))
    .expect("write");
    assert_echo_of(&read_one(&mut s, &mut buf), "/after");
    assert!(buf.is_empty());
}

#[test]
fn http_1_0_client_is_answered_and_closed() {
    let up = Upstream::start(upstream::echo());
    let gw = Gateway::start();
    let body = json!({"method": "GET", "url": up.url("/old")}).to_string();
    let req = format!(
        "POST /api/v1/requests HTTP/1.0\r\nAuthorization: Bearer {DEPLOYMENT_TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = connect(gw.api);
    s.write_all(req.as_bytes()).expect("write");
    let raw = read_to_close(&mut s);
    assert!(
        raw.starts_with(b"HTTP/1.1 200 "),
        "{:?}",
        String::from_utf8_lossy(&raw)
    );
    assert_echo_of(&parse_response(&raw), "/old");
}

#[test]
fn pipelined_envelopes_are_answered_in_order() {
    // The first destination is slower than the second: answers still come in request order.
    let slow = Upstream::start(upstream::slow_head(Duration::from_millis(300)));
    let fast = Upstream::start(upstream::echo());
    let gw = Gateway::start();
    let mut s = connect(gw.api);
    let mut both = envelope_request(gw.api, &json!({"method": "GET", "url": slow.url("/first")}));
    both.extend(envelope_request(
        gw.api,
        &json!({"method": "GET", "url": fast.url("/second")}),
    ));
    both.extend(envelope_request(
        gw.api,
        &json!({"method": "GET", "url": fast.url("/third")}),
    ));
    s.write_all(&both).expect("write");
    let mut buf = Vec::new();
    assert_echo_of(&read_one(&mut s, &mut buf), "/first");
    assert_echo_of(&read_one(&mut s, &mut buf), "/second");
    assert_echo_of(&read_one(&mut s, &mut buf), "/third");
}

#[test]
fn chunked_request_bodies_are_accepted() {
    let up = Upstream::start(upstream::echo());
    let gw = Gateway::start();
    let body = json!({"method": "GET", "url": up.url("/chunked")}).to_string();
    let (a, b) = body.split_at(10);
    let req = format!(
        "POST /api/v1/requests HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {DEPLOYMENT_TOKEN}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
        a.len(),
        b.len()
    );
    let mut s = connect(gw.api);
    s.write_all(req.as_bytes()).expect("write");
    assert_echo_of(&read_one(&mut s, &mut Vec::new()), "/chunked");
}

/// An envelope whose body comes after its head, in a later write, is read as one that came
/// with it (the server takes a body already in its buffer without a read; this one it waits
/// for), and the connection serves the next request.
#[test]
fn an_envelope_split_across_writes_is_read_whole() {
    let up = Upstream::start(upstream::echo());
    let gw = Gateway::start();
    let mut s = connect(gw.api);
    for (i, at) in [0usize, 7, 40].into_iter().enumerate() {
        let path = format!("/split{i}");
        let body = json!({"method": "GET", "url": up.url(&path)}).to_string();
        let head = format!(
            "POST /api/v1/requests HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {DEPLOYMENT_TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let (a, b) = body.split_at(at);
        s.write_all(format!("{head}{a}").as_bytes()).expect("head");
        std::thread::sleep(std::time::Duration::from_millis(50));
        s.write_all(b.as_bytes()).expect("rest of the body");
        assert_echo_of(&read_one(&mut s, &mut Vec::new()), &path);
    }
}

#[test]
fn expect_100_continue_on_a_raw_connection() {
    let up = Upstream::start(upstream::echo());
    let gw = Gateway::start();
    let body = json!({"method": "GET", "url": up.url("/expect")}).to_string();
    let head = format!(
        "POST /api/v1/requests HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {DEPLOYMENT_TOKEN}\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut s = connect(gw.api);
    s.write_all(head.as_bytes()).expect("write head");
    // The body is held back until the interim answer arrives.
    let want = b"HTTP/1.1 100 Continue\r\n\r\n";
    let mut got = vec![0u8; want.len()];
    s.read_exact(&mut got).expect("100 Continue");
    assert_eq!(got, want, "{:?}", String::from_utf8_lossy(&got));
    s.write_all(body.as_bytes()).expect("write body");
    assert_echo_of(&read_one(&mut s, &mut Vec::new()), "/expect");
}

#[test]
fn unauthenticated_client_is_refused_before_it_sends_the_body() {
    let gw = Gateway::start();
    // With `Expect: 100-continue` a client waits before sending its body: a bad token is
    // answered at once, without the interim response.
    let mut s = connect(gw.api);
    s.write_all(
        b"POST /api/v1/requests HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 1000000\r\n\r\n",
    )
    .expect("write head");
    let r = read_one(&mut s, &mut Vec::new());
    assert_envelope(&r, 401, "auth_failure");
    // The token is checked first (decision 001), even before the size of the envelope.
    for auth in ["", "Authorization: Bearer nope\r\n"] {
        let mut s = connect(gw.api);
        let head = format!(
            "POST /api/v1/requests HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 9000000\r\n\r\n"
        );
        s.write_all(head.as_bytes()).expect("write head");
        let r = read_one(&mut s, &mut Vec::new());
        assert_envelope(&r, 401, "auth_failure");
    }
    // A valid token with an oversized envelope is still 413, also without the interim answer.
    let mut s = connect(gw.api);
    let head = format!(
        "POST /api/v1/requests HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {DEPLOYMENT_TOKEN}\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 9000000\r\n\r\n"
    );
    s.write_all(head.as_bytes()).expect("write head");
    let r = read_one(&mut s, &mut Vec::new());
    assert_envelope(&r, 413, "body_too_large");
}

#[test]
fn expect_100_continue_with_curl() {
    let out = Command::new("curl")
        .arg("--version")
        .output()
        .expect("this test needs curl (scripts/ci-deps.sh installs it)");
    assert!(out.status.success());
    let up = Upstream::start(upstream::echo());
    let gw = Gateway::start();
    let dir = support::gateway::temp_dir("curl");
    let file = dir.join("envelope.json");
    // curl sends the envelope from a file, padded so it is large enough to be worth a 100.
    let mut body = json!({"method": "GET", "url": up.url("/curl")})
        .to_string()
        .into_bytes();
    body.resize(200_000, b' ');
    std::fs::write(&file, &body).expect("write envelope");
    let out = Command::new("curl")
        .args([
            "-sS",
            "-v",
            "--max-time",
            "30",
            "-H",
            "Expect: 100-continue",
        ])
        .args(["-H", "Content-Type: application/json"])
        .args(["-H", &format!("Authorization: Bearer {DEPLOYMENT_TOKEN}")])
        .arg("--data-binary")
        .arg(format!("@{}", file.display()))
        .arg(format!("http://{}/api/v1/requests", gw.api))
        .output()
        .expect("run curl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("> Expect: 100-continue"), "{stderr}");
    assert!(stderr.contains("< HTTP/1.1 100 Continue"), "{stderr}");
    assert!(stderr.contains("< HTTP/1.1 200"), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON answer");
    assert_eq!(v["status"], 200);
    assert!(unb64(&v["body"]["data_base64"]).starts_with(b"GET /curl HTTP/1.1\r\n"));
}

#[test]
fn other_paths_are_404_and_other_methods_405() {
    let up = Upstream::start(upstream::echo());
    let gw = Gateway::start();
    let auth = format!("Bearer {DEPLOYMENT_TOKEN}");
    let h = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    for (method, path) in [
        ("GET", "/"),
        ("POST", "/"),
        ("POST", "/api/v1/requests/"),
        ("POST", "/api/v1/request"),
        ("POST", "/API/V1/REQUESTS"),
        ("GET", "/api/v1/admin/config"),
        ("GET", "/metrics"),
    ] {
        let r = http(gw.api, method, path, &h, b"");
        assert_eq!(r.status, 404, "{method} {path}");
        assert_eq!(r.json()["error"], "not_found", "{method} {path}");
    }
    for method in ["GET", "PUT", "DELETE", "PATCH", "OPTIONS"] {
        let r = http(gw.api, method, "/api/v1/requests", &h, b"");
        assert_eq!(r.status, 405, "{method}");
        assert_eq!(r.header("allow"), Some("POST"), "{method}");
        assert_eq!(r.json()["error"], "method_not_allowed");
    }
    let r = http(gw.api, "HEAD", "/api/v1/requests", &h, b"");
    assert_eq!(r.status, 405);
    assert!(r.body.is_empty(), "a HEAD answer has no body");
    // A request that brings a body to such a route gets the same answer, not a 413 for a
    // route that takes none.
    let envelope = json!({"method": "GET", "url": up.url("/x")}).to_string();
    for (method, path, status) in [
        ("POST", "/v1/requests", 404),
        ("PUT", "/api/v1/requests", 405),
        ("POST", "/api/v1/openapi.json", 405),
    ] {
        let r = http(gw.api, method, path, &h, envelope.as_bytes());
        assert_eq!(r.status, status, "{method} {path}: {}", r.text());
    }
    // A query string does not change the route.
    let body = json!({"method": "GET", "url": up.url("/q")}).to_string();
    let r = http(
        gw.api,
        "POST",
        "/api/v1/requests?trace=1",
        &h,
        body.as_bytes(),
    );
    assert_echo_of(&r, "/q");
}

#[test]
fn malformed_http_gets_400_with_the_error_envelope() {
    let gw = Gateway::start();
    // A body error needs a valid token: without one the request is refused from its head.
    let bad_chunk = format!(
        "POST /api/v1/requests HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {DEPLOYMENT_TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
    )
    .into_bytes();
    let cases: &[(&str, &[u8], u16)] = &[
        ("garbage", b"GARBAGE\r\n\r\n", 400),
        ("bad header line", b"POST /api/v1/requests HTTP/1.1\r\nHost: x\r\nNo colon here\r\n\r\n", 400),
        ("bare LF", b"POST /api/v1/requests HTTP/1.1\nHost: x\n\n", 400),
        ("space before colon", b"POST /api/v1/requests HTTP/1.1\r\nHost : x\r\n\r\n", 400),
        (
            "both framings",
            b"POST /api/v1/requests HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            400,
        ),
        (
            "two lengths",
            b"POST /api/v1/requests HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nab",
            400,
        ),
        (
            "bad chunk size",
            &bad_chunk,
            400,
        ),
        ("no Host", b"POST /api/v1/requests HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 400),
    ];
    for (name, raw, status) in cases {
        let mut s = connect(gw.api);
        s.write_all(raw).expect("write");
        let got = read_to_close(&mut s);
        assert!(!got.is_empty(), "{name}: no answer");
        let r = parse_response(&got);
        assert_eq!(
            r.status,
            *status,
            "{name}: {}",
            String::from_utf8_lossy(&got)
        );
        assert_envelope(&r, *status, "invalid_request");
        let v = r.json();
        assert!(
            v["message"]
                .as_str()
                .unwrap_or("")
                .starts_with("malformed HTTP request"),
            "{name}: {v}"
        );
    }
    // A head over the size limit: rejected with the envelope as well.
    let mut big = b"POST /api/v1/requests HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    big.resize(big.len() + 128 * 1024, b'a');
    big.extend_from_slice(b"\r\n\r\n");
    let mut s = connect(gw.api);
    let _ = s.write_all(&big);
    let got = read_to_close(&mut s);
    let r = parse_response(&got);
    assert!(r.status == 431 || r.status == 400, "{}", r.status);
    assert_envelope(&r, r.status, "invalid_request");
}

#[test]
fn oversized_chunked_envelope_is_413() {
    let gw = Gateway::start();
    let mut s = connect(gw.api);
    let head = format!(
        "POST /api/v1/requests HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {DEPLOYMENT_TOKEN}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    s.write_all(head.as_bytes()).expect("head");
    let mut w = s.try_clone().expect("clone");
    // 5 MiB in 64 KiB chunks, written on another thread: the server may stop reading early.
    let writer = std::thread::spawn(move || {
        let chunk = vec![b' '; 64 * 1024];
        for _ in 0..80 {
            let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
            frame.extend_from_slice(&chunk);
            frame.extend_from_slice(b"\r\n");
            if w.write_all(&frame).is_err() {
                return;
            }
        }
        let _ = w.write_all(b"0\r\n\r\n");
    });
    let r = read_one(&mut s, &mut Vec::new());
    assert_envelope(&r, 413, "body_too_large");
    let v = r.json();
    assert_eq!(v["details"]["direction"], "request");
    assert_eq!(v["details"]["limit_bytes"], "4194304");
    let _ = s.shutdown(std::net::Shutdown::Both);
    let _ = writer.join();
}

#[test]
fn slowloris_client_is_cut_after_the_header_timeout() {
    let gw = Gateway::start();
    let mut s = connect(gw.api);
    s.write_all(b"POST /api/v1/requests HTTP/1.1\r\nHost: x\r\nContent-Ty")
        .expect("write partial head");
    let started = Instant::now();
    let got = read_to_close(&mut s);
    let took = started.elapsed();
    assert!(
        took >= HEADER_TIMEOUT - Duration::from_secs(1)
            && took < HEADER_TIMEOUT + Duration::from_secs(5),
        "closed after {took:?}"
    );
    // A timeout in the middle of a head is answered before the close.
    let r = parse_response(&got);
    assert_envelope(&r, 408, "invalid_request");
    // The listener still serves others.
    let r = http(gw.api, "GET", "/", &[], b"");
    assert_eq!(r.status, 404);
}

#[test]
fn a_thousand_concurrent_requests_all_succeed_and_release_capacity() {
    const CLIENTS: usize = 1000;
    let up = Upstream::start(upstream::echo());
    let gw = Gateway::builder()
        .workers("[[workers]]\nid = \"bulk\"\ncapacity = 2000\n")
        .start();
    let addr = gw.api;
    let start = Arc::new(Barrier::new(CLIENTS));
    let url = up.url("");
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let start = start.clone();
            let url = url.clone();
            std::thread::Builder::new()
                .stack_size(128 * 1024)
                .spawn(move || {
                    let path = format!("/c/{i}");
                    let envelope = json!({"method": "GET", "url": format!("{url}{path}")});
                    let mut s = TcpStream::connect(addr).expect("connect");
                    s.set_read_timeout(Some(Duration::from_secs(60))).ok();
                    // Every client is connected before any sends, so the gateway sees them all
                    // at once.
                    start.wait();
                    s.write_all(&envelope_request(addr, &envelope))
                        .expect("write");
                    let r = read_one(&mut s, &mut Vec::new());
                    (path, r)
                })
                .expect("spawn client")
        })
        .collect();
    let mut failures = Vec::new();
    for c in clients {
        let (path, r) = c.join().expect("client thread");
        if r.status != 200 {
            failures.push(format!(
                "{path}: {} {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            ));
            continue;
        }
        assert_echo_of(&r, &path);
    }
    assert!(
        failures.is_empty(),
        "{} failed, first: {:?}",
        failures.len(),
        failures.first()
    );
    println!("{CLIENTS} concurrent requests in {:?}", started.elapsed());
    assert_eq!(up.requests(), CLIENTS);
    wait_until(Duration::from_secs(10), "worker capacity to drain", || {
        let r = admin(&gw, "GET", "/api/v1/admin/workers", &[], b"");
        let v = r.json();
        let w = v["items"]
            .as_array()
            .and_then(|a| a.iter().find(|w| w["worker_id"] == "bulk").cloned())
            .expect("worker bulk");
        w["capacity"]["active"] == 0 && w["capacity"]["available"] == 2000
    });
    let r = admin(&gw, "GET", "/api/v1/admin/requests", &[], b"");
    assert_eq!(r.json()["items"], json!([]));
}

#[test]
fn receipt_routes_are_404_without_object_storage() {
    let gw = Gateway::start();
    let auth = format!("Bearer {DEPLOYMENT_TOKEN}");
    for (method, path, body) in [
        ("POST", "/api/v1/receipts", &b"{}"[..]),
        ("GET", "/api/v1/receipts/rcpt_x", b""),
        ("PUT", "/api/v1/receipts/rcpt_x/parts/1", &[7u8; 1000][..]),
        ("POST", "/api/v1/receipts/rcpt_x/complete", b""),
        ("GET", "/api/v1/receipt-objects/rcpt_x?signature=x", b""),
    ] {
        let r = http(gw.api, method, path, &[("Authorization", &auth)], body);
        assert_eq!(r.status, 404, "{method} {path}: {}", r.text());
        assert_eq!(r.json()["code"], "receipt_error", "{method} {path}");
    }
}

/// The server limits are `[control.server]` keys (decision 002): with short values, an idle
/// keep-alive connection is closed and a head that never completes is answered 408, both in
/// well under the defaults (60 s and 10 s).
#[test]
fn server_timeouts_come_from_the_config() {
    let gw = Gateway::builder()
        .control("[control.server]\nidle_timeout_ms = 300\nheader_timeout_ms = 500\n")
        .start();
    let started = Instant::now();
    let mut idle = TcpStream::connect(gw.api).expect("connect");
    idle.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut raw = Vec::new();
    assert!(
        idle.read_to_end(&mut raw).is_ok(),
        "the idle connection stayed open"
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    let started = Instant::now();
    let mut slow = TcpStream::connect(gw.api).expect("connect");
    slow.set_read_timeout(Some(Duration::from_secs(5))).ok();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
        .expect("partial head");
    let mut raw = Vec::new();
    let _ = slow.read_to_end(&mut raw);
    assert_eq!(parse_response(&raw).status, 408, "{raw:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}
