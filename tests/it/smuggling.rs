//! Request-smuggling table: the classic desync inputs (CL+TE, duplicate or comma-joined
//! Content-Length, obs-fold, bare LF, `Transfer-Encoding: chunked, identity`, chunk-size
//! overflow, NUL in a header, ...) sent to BOTH the request API listener and the forward-proxy
//! listener of a real gateway. Each must be refused with an error status, the connection must
//! close, and the request smuggled behind it must never be answered.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use base64::Engine as _;
use support::gateway::{Gateway, DEPLOYMENT_TOKEN};
use support::upstream::{self, Upstream};

/// (name, the framing and header lines after the authenticated request line, body bytes).
const CASES: &[(&str, &str, &str)] = &[
    (
        "cl_and_te",
        "Content-Length: 6\r\nTransfer-Encoding: chunked\r\n",
        "0\r\n\r\nX",
    ),
    (
        "te_and_cl",
        "Transfer-Encoding: chunked\r\nContent-Length: 6\r\n",
        "0\r\n\r\nX",
    ),
    (
        "duplicate_cl_differing",
        "Content-Length: 2\r\nContent-Length: 3\r\n",
        "{}X",
    ),
    (
        "duplicate_cl_same",
        "Content-Length: 2\r\nContent-Length: 2\r\n",
        "{}",
    ),
    ("comma_joined_cl", "Content-Length: 2, 2\r\n", "{}"),
    (
        "comma_joined_cl_differing",
        "Content-Length: 2, 3\r\n",
        "{}X",
    ),
    ("signed_cl", "Content-Length: +2\r\n", "{}"),
    (
        "obs_fold",
        "Content-Length: 2\r\nX-Folded: a\r\n b\r\n",
        "{}",
    ),
    (
        "te_chunked_identity",
        "Transfer-Encoding: chunked, identity\r\n",
        "0\r\n\r\n",
    ),
    (
        "te_identity",
        "Transfer-Encoding: identity\r\n",
        "0\r\n\r\n",
    ),
    (
        "te_not_last_chunked",
        "Transfer-Encoding: gzip\r\n",
        "0\r\n\r\n",
    ),
    (
        "chunk_size_overflow",
        "Transfer-Encoding: chunked\r\n",
        "1ffffffffffffffff\r\nX\r\n0\r\n\r\n",
    ),
    (
        "chunk_size_negative",
        "Transfer-Encoding: chunked\r\n",
        "-1\r\nX\r\n0\r\n\r\n",
    ),
    (
        "nul_in_header",
        "Content-Length: 2\r\nX-Nul: a\0b\r\n",
        "{}",
    ),
    ("space_before_colon", "Content-Length : 2\r\n", "{}"),
];

/// A request the gateway must never answer: smuggled behind each case.
const SMUGGLED: &str = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";

/// Sends `bytes`, reads until the gateway closes the connection (or 10 s pass).
fn exchange(addr: SocketAddr, bytes: &[u8]) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    s.write_all(bytes).expect("write");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return (raw, true),
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => continue,
            // A reset after the answer also closes the connection.
            Err(_) => return (raw, true),
        }
    }
    (raw, false)
}

fn check(listener: &str, name: &str, addr: SocketAddr, request: String) {
    let (raw, closed) = exchange(addr, request.as_bytes());
    let text = String::from_utf8_lossy(&raw);
    let status: u16 = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{listener} {name}: no response: {text:?}"));
    // A client error, or 501 for a transfer coding it does not implement (RFC 9112 §6.1);
    // never a gateway error, which would mean the input went further.
    assert!(
        (400..500).contains(&status) || status == 501,
        "{listener} {name}: refused with a client error (or 501), got {status}: {text}"
    );
    assert!(
        closed,
        "{listener} {name}: the connection stayed open: {text}"
    );
    assert_eq!(
        text.matches("HTTP/1.1 ").count(),
        1,
        "{listener} {name}: more than one answer: {text}"
    );
    if listener == "proxy" {
        assert!(
            text.to_ascii_lowercase()
                .contains("\r\nproxy-status: sortie; error="),
            "{listener} {name}: no Proxy-Status: {text}"
        );
    }
}

#[test]
fn desync_inputs_are_refused_and_close_the_connection_on_both_listeners() {
    // Records what reaches the destination: its targets and bytes.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, Vec<u8>)>::new()));
    let s = seen.clone();
    let up = Upstream::start(std::sync::Arc::new(move |r: &upstream::Request| {
        s.lock().unwrap().push((r.target.clone(), r.raw.clone()));
        vec![upstream::Step::Write(upstream::response(200, &[], b"ok"))]
    }));
    let gw = Gateway::builder().start();
    let proxy_auth =
        base64::engine::general_purpose::STANDARD.encode(format!("dep_test:{DEPLOYMENT_TOKEN}"));
    for (name, fields, body) in CASES {
        let api = format!(
            "POST /api/v1/requests HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {DEPLOYMENT_TOKEN}\r\n\
             Content-Type: application/json\r\n{fields}\r\n{body}{SMUGGLED}"
        );
        check("api", name, gw.api, api);
        let proxy = format!(
            "POST {} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nProxy-Authorization: Basic {proxy_auth}\r\n\
             {fields}\r\n{body}{SMUGGLED}",
            up.url("/"),
            up.port()
        );
        check("proxy", name, gw.proxy.expect("proxy listener"), proxy);
    }
    // No case reaches the destination, not even the body-level ones (a chunk size that
    // overflows or is negative), whose body arrives here in the same write as the head. Nothing
    // smuggled ever does either: not as a request of its own, and not inside another one's
    // bytes (the loop below says which, should one arrive).
    let seen = seen.lock().unwrap();
    let targets: Vec<&String> = seen.iter().map(|(t, _)| t).collect();
    assert!(
        targets.is_empty(),
        "requests reached the upstream: {targets:?}"
    );
    for (target, raw) in seen.iter() {
        assert!(
            !target.contains("smuggled"),
            "a smuggled request arrived: {target}"
        );
        let raw = String::from_utf8_lossy(raw);
        assert!(!raw.contains("/smuggled"), "smuggled bytes arrived: {raw}");
    }
    assert_eq!(up.requests(), seen.len());
}

#[test]
fn bare_lf_is_refused_on_both_listeners() {
    let up = Upstream::start(upstream::echo());
    let gw = Gateway::builder().start();
    let api = format!(
        "POST /api/v1/requests HTTP/1.1\nHost: gw\nAuthorization: Bearer {DEPLOYMENT_TOKEN}\n\
         Content-Length: 2\n\n{{}}{SMUGGLED}"
    );
    check("api", "bare_lf", gw.api, api);
    let proxy = format!("GET {} HTTP/1.1\nHost: x\n\n{SMUGGLED}", up.url("/"));
    check("proxy", "bare_lf", gw.proxy.unwrap(), proxy);
    assert_eq!(up.requests(), 0);
}
