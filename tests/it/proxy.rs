//! Black-box tests of the forward-proxy ingress with real clients: `curl -x` (absolute-form,
//! and HTTPS through CONNECT) and Python `requests` with `proxies=`, against loopback upstreams
//! (plain and TLS with the test CA). Routing by `X-Service-Route-*` headers is made visible by
//! local workers with distinct source addresses; stripping is checked on the upstream side.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;
use support::gateway::{
    admin, admin_items, parse_response, request_api, wait_until, Gateway, Resp, DEPLOYMENT_TOKEN,
    LOOPBACK_SNAPSHOT,
};
use support::proxy::{
    base64_basic, curl, curl_as_test, curl_command, curl_response, dechunk, find, open_tunnel,
    proxy_user, CURL_MISSING,
};
use support::tls::TestCa;
use support::upstream::{self, Options, Upstream};

const REQUESTS_PATH: &str = "/api/v1/admin/requests";

/// Two local workers sending from distinct loopback addresses, told apart by tag.
const TWO_WORKERS: &str = r#"
[[workers]]
id = "w-two"
capacity = 8
tags = ["two"]
bind_address = "127.0.0.2"

[[workers]]
id = "w-three"
capacity = 8
tags = ["three"]
bind_address = "127.0.0.3"
"#;

/// An echo upstream speaking TLS with a `localhost` certificate from `ca`.
fn tls_upstream(ca: &TestCa) -> Upstream {
    Upstream::start_with(
        upstream::echo(),
        Options {
            tls: Some(ca.localhost_config()),
            ..Options::default()
        },
    )
}

/// The config section that makes the gateway's egress trust `ca`.
fn trusting(ca: &TestCa) -> String {
    format!(
        "[egress]\nca_file = {:?}\n",
        ca.ca_file().display().to_string()
    )
}

fn header<'a>(raw: &'a str, name: &str) -> Vec<&'a str> {
    raw.split("\r\n")
        .filter_map(|l| l.split_once(": "))
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v)
        .collect()
}

#[test]
fn curl_absolute_form_routes_by_header_and_strips_proxy_fields() {
    let up = Upstream::start(upstream::echo());
    let gw = Gateway::builder().workers(TWO_WORKERS).start();
    for (tag, source) in [("two", "127.0.0.2"), ("three", "127.0.0.3")] {
        let route = format!("X-Service-Route-Tags: {tag}");
        let out = curl_as_test(
            &gw,
            &[
                "-H",
                &route,
                "-H",
                "X-Dup: one",
                "-H",
                "X-Private: secret",
                "-H",
                "Connection: X-Private",
                "-H",
                "X-Dup: two",
                "-H",
                "Proxy-Connection: keep-alive",
                "-H",
                "X-Service-Other: x",
                &up.url("/echo?q=1"),
            ],
        );
        let r = curl_response(&out);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&out.stdout));
        // The upstream saw the worker's source address.
        assert!(
            r.header("x-peer").is_some_and(|p| p.starts_with(source)),
            "{tag}: {:?}",
            r.header("x-peer")
        );
        let seen = r.text();
        assert!(seen.starts_with("GET /echo?q=1 HTTP/1.1\r\n"), "{seen}");
        assert_eq!(header(&seen, "host"), [format!("127.0.0.1:{}", up.port())]);
        assert_eq!(header(&seen, "x-dup"), ["one", "two"], "{seen}");
        for gone in [
            "proxy-authorization",
            "proxy-connection",
            "x-service-route-tags",
            "x-service-other",
            "x-private",
        ] {
            assert!(
                header(&seen, gone).is_empty(),
                "{gone} reached the upstream: {seen}"
            );
        }
        assert_eq!(header(&seen, "connection"), ["keep-alive"]);
    }
    // Both routed requests are counted.
    let metrics = admin(&gw, "GET", "/metrics", &[], b"").text();
    assert!(
        metrics.contains(
            "sortie_requests_total{deployment=\"dep_test\",outcome=\"ok\",ingress=\"proxy\"} 2"
        ),
        "{metrics}"
    );
}

#[test]
fn curl_streams_large_bodies_both_ways() {
    let up = Upstream::start(upstream::echo());
    let gw = Gateway::builder().start();
    let dir = support::gateway::temp_dir("proxy-body");
    let file = dir.join("body.bin");
    let body = upstream::pattern(6 * 1024 * 1024 + 11);
    std::fs::write(&file, &body).unwrap();
    let data = format!("@{}", file.display());
    let url = up.url("/upload");
    for framing in [None, Some("Transfer-Encoding: chunked")] {
        let mut args = vec!["--data-binary", &data];
        if let Some(h) = framing {
            args.extend(["-H", h]);
        }
        args.push(&url);
        let r = curl_response(&curl_as_test(&gw, &args));
        assert_eq!(r.status, 200);
        // The echo carries the request as the upstream read it: the head, then the body in
        // the client's framing (re-chunked by the gateway for a chunked upload).
        let end = find(&r.body, b"\r\n\r\n").expect("echoed head") + 4;
        let sent = match framing {
            None => r.body[end..].to_vec(),
            Some(_) => dechunk(&r.body[end..]),
        };
        assert_eq!(sent.len(), body.len(), "{framing:?}");
        assert!(sent == body, "{framing:?}: body differs");
    }
}

#[test]
fn curl_https_through_connect_with_the_test_ca() {
    let ca = TestCa::new();
    let up = tls_upstream(&ca);
    let gw = Gateway::builder().workers(TWO_WORKERS).start();
    let cacert = ca.ca_file().display().to_string();
    let out = curl_as_test(
        &gw,
        &[
            "--proxy-header",
            "X-Service-Route-Tags: three",
            "--cacert",
            &cacert,
            &up.https_url("localhost", "/secure"),
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("GET /secure HTTP/1.1"), "{text}");
    // The tunnel left from the worker chosen by the CONNECT's routing header.
    assert!(text.contains("X-Peer: 127.0.0.3:"), "{text}");
    assert!(!text.contains("X-Service-Route-Tags"), "{text}");
    let metrics = admin(&gw, "GET", "/metrics", &[], b"").text();
    wait_until(Duration::from_secs(10), "tunnel counted", || {
        admin(&gw, "GET", "/metrics", &[], b"")
            .text()
            .contains("sortie_tunnels_total 1")
    });
    assert!(metrics.contains("sortie_tunnel_bytes_total"), "{metrics}");
    // The tunnel is counted under its own ingress.
    assert!(
        metrics.contains(
            "sortie_requests_total{deployment=\"dep_test\",outcome=\"ok\",ingress=\"connect\"} 1"
        ),
        "{metrics}"
    );
}

/// Bulk bytes both ways through a tunnel arrive whole and in order (each direction starts as
/// a copy loop and splices once its reads fill the largest buffer), and the client's
/// half-close reaches the destination while the other direction goes on.
#[test]
fn a_tunnel_carries_bulk_bytes_both_ways_and_the_half_close() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // A raw echo destination: copies back until the end of stream, then closes its side.
    let echo = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut r = s.try_clone().unwrap();
        let n = std::io::copy(&mut r, &mut s).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        n
    });
    let gw = Gateway::builder().start();
    let (mut s, status) = open_tunnel(&gw, port);
    assert_eq!(status, "HTTP/1.1 200 OK");
    let payload = upstream::pattern(8 << 20);
    let mut w = s.try_clone().unwrap();
    let sent = payload.clone();
    let writer = std::thread::spawn(move || {
        w.write_all(&sent).unwrap();
        w.shutdown(std::net::Shutdown::Write).unwrap();
    });
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    writer.join().unwrap();
    assert_eq!(echo.join().unwrap(), payload.len() as u64);
    assert_eq!(got.len(), payload.len());
    assert!(got == payload, "the echoed bytes differ");
}

#[test]
fn a_destination_reset_ends_the_tunnel_for_the_client_at_once() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // A destination that reads the first bytes, then resets the connection.
    let destination = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut first = [0u8; 5];
        s.read_exact(&mut first).unwrap();
        socket2::SockRef::from(&s)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(s);
    });
    let gw = Gateway::builder().start();
    let (mut s, status) = open_tunnel(&gw, port);
    assert_eq!(status, "HTTP/1.1 200 OK");
    s.write_all(b"hello").unwrap();
    destination.join().unwrap();
    // The client keeps its own side open: the failed direction must still end the client's,
    // at once rather than at the tunnel's idle limit.
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut rest = Vec::new();
    if let Err(e) = s.read_to_end(&mut rest) {
        assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "the client did not see the tunnel end: {e}"
        );
    }
    assert!(rest.is_empty(), "{rest:?}");
}

#[test]
fn tunnel_idle_timeout_and_limit_come_from_the_config() {
    let echo = Upstream::start(upstream::echo());
    let gw = Gateway::builder()
        .section("[control.proxy]\ntunnel_idle_timeout_ms = 400\nmax_tunnels_per_deployment = 1")
        .start();
    let (mut first, status) = open_tunnel(&gw, echo.port());
    assert_eq!(status, "HTTP/1.1 200 OK");
    // The deployment holds its one tunnel: a second is refused as retryable overload.
    let (_, second) = open_tunnel(&gw, echo.port());
    assert!(second.starts_with("HTTP/1.1 503"), "{second}");
    // Nothing moves: the gateway closes the tunnel after the idle limit (checked every
    // quarter of it), long before the client's read timeout.
    let opened = std::time::Instant::now();
    let mut rest = Vec::new();
    let _ = first.read_to_end(&mut rest);
    let waited = opened.elapsed();
    assert!(waited < Duration::from_secs(5), "closed after {waited:?}");
    assert!(
        waited >= Duration::from_millis(300),
        "closed after {waited:?}"
    );
    // The closed tunnel gave its place back.
    wait_until(Duration::from_secs(5), "a new tunnel to be allowed", || {
        open_tunnel(&gw, echo.port()).1 == "HTTP/1.1 200 OK"
    });
}

#[test]
fn curl_without_credentials_gets_407() {
    let up = Upstream::start(upstream::echo());
    let gw = Gateway::builder().start();
    let wrong = "dep_test:not-the-token";
    let other_user = format!("dep_other:{DEPLOYMENT_TOKEN}");
    for creds in [None, Some(wrong), Some(other_user.as_str())] {
        let mut args = Vec::new();
        if let Some(c) = creds {
            args.extend(["--proxy-user", c]);
        }
        let url = up.url("/");
        args.push(url.as_str());
        let r = curl_response(&curl(&gw, &args));
        assert_eq!(r.status, 407, "{creds:?}");
        assert_eq!(
            r.header("proxy-authenticate"),
            Some("Basic realm=\"sortie\"")
        );
        assert_eq!(
            r.header("proxy-status"),
            Some("sortie; error=http_request_denied; details=\"auth_failure\"")
        );
        assert_eq!(r.json()["code"], "auth_failure");
    }
    assert_eq!(up.requests(), 0);
}

#[test]
fn denied_destinations_and_bad_hints_answer_with_proxy_status() {
    let up = Upstream::start(upstream::echo());
    // The built-in snapshot opens no loopback range.
    let gw = Gateway::builder().snapshot(None).start();
    let r = curl_response(&curl_as_test(&gw, &[&up.url("/")]));
    assert_eq!(r.status, 403);
    assert_eq!(
        r.header("proxy-status"),
        Some("sortie; error=destination_ip_prohibited; details=\"destination_denied\"")
    );
    assert_eq!(r.json()["code"], "destination_denied");
    // Through CONNECT too.
    let out = curl_as_test(&gw, &["-p", &up.url("/")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("HTTP/1.1 403"), "{text}");
    assert!(text.contains("details=\"destination_denied\""), "{text}");
    assert_eq!(up.requests(), 0);

    let r = curl_response(&curl_as_test(
        &gw,
        &["-H", "X-Service-Route-Country: ZZ", &up.url("/")],
    ));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["code"], "invalid_request");
    assert_eq!(
        r.json()["message"],
        "routing.country: must be a two-letter ISO 3166-1 country code"
    );
    // A tag no worker advertises.
    let r = curl_response(&curl_as_test(
        &gw,
        &["-H", "X-Service-Route-Tags: nowhere", &up.url("/")],
    ));
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r
        .header("proxy-status")
        .is_some_and(|v| v.contains("details=\"route_unavailable\"")));
}

#[test]
fn origin_form_and_oddities_are_unsupported_ingress_modes() {
    let gw = Gateway::builder().start();
    let addr = gw.proxy.unwrap();
    for head in [
        "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
        "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
    ] {
        let r = raw_exchange(addr, head.as_bytes());
        assert_eq!(r.status, 400, "{head:?}: {}", r.text());
        assert_eq!(r.json()["code"], "unsupported_ingress_mode", "{head:?}");
        assert_eq!(
            r.header("proxy-status"),
            Some("sortie; error=http_request_error; details=\"unsupported_ingress_mode\"")
        );
    }
}

/// Writes `bytes` on a new connection and reads until the gateway closes it.
fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> Resp {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(bytes).unwrap();
    parse_response(&read_one(&mut s).0)
}

/// Reads one response from `s`, up to the end of its `Content-Length` body or of the
/// connection: its bytes, and whether the connection ended first.
fn read_one(s: &mut TcpStream) -> (Vec<u8>, bool) {
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        if let Some(end) = find(&raw, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
            let len = head
                .split("\r\n")
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse::<usize>().ok());
            if len.is_some_and(|l| raw.len() >= end + 4 + l) {
                return (raw, false);
            }
        }
        match s.read(&mut buf) {
            Ok(0) => return (raw, true),
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) => panic!("read: {e}"),
        }
    }
}

/// An absolute-form GET of `url` for the test deployment.
fn proxied_get(url: &str, port: u16) -> String {
    let auth = base64_basic(&proxy_user());
    format!(
        "GET {url} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
    )
}

#[test]
fn large_bodies_go_socket_to_socket_and_both_connections_stay_open() {
    // Past its first piece, a large `Content-Length` body is spliced from the destination's
    // socket to the client's (decision 025): every byte arrives, and both connections carry
    // the next request.
    let len = 3 * 1024 * 1024 + 5;
    let up = Upstream::start(upstream::large(len));
    let gw = Gateway::builder().start();
    let mut s = TcpStream::connect(gw.proxy.unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    for i in 0..3 {
        s.write_all(proxied_get(&up.url(&format!("/{i}")), up.port()).as_bytes())
            .unwrap();
        let (raw, ended) = read_one(&mut s);
        assert!(!ended, "response {i}: the connection ended");
        let r = parse_response(&raw);
        assert_eq!(r.status, 200, "response {i}");
        assert!(
            r.body == upstream::pattern(len),
            "response {i}: body differs"
        );
    }
    assert_eq!(up.requests(), 3);
    assert_eq!(up.connections(), 1, "the destination connection was reused");
    // All but what came with each head went socket to socket.
    let spliced = spliced_bytes(&gw);
    assert!(
        spliced >= 3 * (len as u64 - 64 * 1024) && spliced <= 3 * len as u64,
        "spliced {spliced} of {}",
        3 * len
    );
}

/// `sortie_proxy_spliced_bytes_total` from the gateway's metrics.
fn spliced_bytes(gw: &Gateway) -> u64 {
    let metrics = admin(gw, "GET", "/metrics", &[], b"").text();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("sortie_proxy_spliced_bytes_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no spliced byte counter in {metrics}"))
}

#[test]
fn bytes_behind_a_spliced_body_keep_its_connection_out_of_the_pool() {
    // A destination that sends more than its Content-Length said: the surplus looks like a
    // response, and a reused connection would hand it to the next request, perhaps another
    // deployment's. Spliced bodies are checked for it as read ones are.
    let len = 200 * 1024;
    let up = Upstream::start(std::sync::Arc::new(move |r: &upstream::Request| {
        let mut out = upstream::response(200, &[], &upstream::pattern(len));
        if r.target.ends_with("/first") {
            out.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL");
        }
        vec![upstream::Step::Write(out)]
    }));
    let gw = Gateway::builder().start();
    let mut s = TcpStream::connect(gw.proxy.unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    for path in ["/first", "/second"] {
        s.write_all(proxied_get(&up.url(path), up.port()).as_bytes())
            .unwrap();
        let (raw, ended) = read_one(&mut s);
        assert!(!ended, "{path}: the connection ended");
        let r = parse_response(&raw);
        assert_eq!(r.status, 200, "{path}");
        assert!(r.body == upstream::pattern(len), "{path}: body differs");
    }
    assert!(spliced_bytes(&gw) > 0, "nothing was spliced");
    assert_eq!(
        up.connections(),
        2,
        "the connection with surplus bytes was reused"
    );
}

#[test]
fn a_destination_that_stops_mid_body_ends_the_client_connection_short() {
    // The status and length are sent before the body: a destination closing mid-body can only
    // be told by a truncated body and a closed connection, spliced or not.
    let (total, sent) = (2 * 1024 * 1024, 300 * 1024);
    let up = Upstream::start(std::sync::Arc::new(move |_: &upstream::Request| {
        let mut first = format!("HTTP/1.1 200 OK\r\nContent-Length: {total}\r\n\r\n").into_bytes();
        first.extend_from_slice(&upstream::pattern(sent));
        vec![upstream::Step::Write(first), upstream::Step::Close]
    }));
    let gw = Gateway::builder().start();
    let mut s = TcpStream::connect(gw.proxy.unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(proxied_get(&up.url("/cut"), up.port()).as_bytes())
        .unwrap();
    let (raw, ended) = read_one(&mut s);
    assert!(ended, "the connection stayed open");
    let end = find(&raw, b"\r\n\r\n").expect("a head") + 4;
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains(&format!("content-length: {total}")), "{head}");
    assert_eq!(
        &raw[end..],
        &upstream::pattern(sent)[..],
        "the bytes that came"
    );
    // Most of them went socket to socket, and count although the body was cut.
    let spliced = spliced_bytes(&gw);
    assert!(
        spliced >= 256 * 1024 && spliced <= sent as u64,
        "spliced {spliced} of {sent}"
    );
}

#[test]
fn a_slow_destination_times_out_with_504() {
    let up = Upstream::start(upstream::slow_head(Duration::from_secs(4)));
    let snapshot = LOOPBACK_SNAPSHOT.replace(
        "\"default_timeout_ms\":60000",
        "\"default_timeout_ms\":1000",
    );
    let gw = Gateway::builder().snapshot(Some(&snapshot)).start();
    let r = curl_response(&curl_as_test(&gw, &[&up.url("/")]));
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.json()["code"], "timeout_exceeded");
    assert_eq!(
        r.header("proxy-status"),
        Some("sortie; error=http_response_timeout; details=\"timeout_exceeded\"")
    );
}

#[test]
fn an_operator_cancels_a_relayed_download_and_a_tunnel() {
    // The body stalls after its first bytes: the request stays active while it is relayed.
    let up = Upstream::start(upstream::slow_body(
        4 << 20,
        256 << 10,
        Duration::from_secs(25),
    ));
    let gw = Gateway::builder().start();
    let dir = support::gateway::temp_dir("proxy-cancel");
    let file = dir.join("partial");
    let file_arg = file.display().to_string();
    let mut child = curl_command(&gw)
        .args([
            "-o",
            &file_arg,
            "--proxy-user",
            &proxy_user(),
            &up.url("/stall"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect(CURL_MISSING);
    // The first body bytes reached curl's file (past its write buffering): the body is being
    // relayed.
    wait_until(Duration::from_secs(10), "the first body bytes", || {
        std::fs::metadata(&file).is_ok_and(|m| m.len() >= 64 << 10)
    });
    let mut id = String::new();
    wait_until(Duration::from_secs(10), "the download to be listed", || {
        let items = admin_items(&gw, REQUESTS_PATH);
        match items.first() {
            Some(item) => {
                assert_eq!(item["deployment_id"], "dep_test");
                id = item["request_id"].as_str().unwrap().to_string();
                true
            }
            None => false,
        }
    });
    let r = admin(&gw, "DELETE", &format!("{REQUESTS_PATH}/{id}"), &[], b"");
    assert_eq!(r.status, 204, "{}", r.text());
    let mut status = None;
    wait_until(Duration::from_secs(10), "curl to see the cut", || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    // curl reports the truncated transfer (exit 18, partial file).
    assert_eq!(status.unwrap().code(), Some(18));
    wait_until(Duration::from_secs(5), "the list to empty", || {
        admin_items(&gw, REQUESTS_PATH).is_empty()
    });

    // A tunnel is listed while open and closed by a cancel.
    let echo = Upstream::start(upstream::echo());
    let (mut s, status) = open_tunnel(&gw, echo.port());
    assert_eq!(status, "HTTP/1.1 200 OK");
    let items = admin_items(&gw, REQUESTS_PATH);
    assert_eq!(items.len(), 1, "{items:?}");
    let id = items[0]["request_id"].as_str().unwrap();
    assert_eq!(
        admin(&gw, "DELETE", &format!("{REQUESTS_PATH}/{id}"), &[], b"").status,
        204
    );
    let mut rest = Vec::new();
    // The gateway closes the tunnel: the read ends (EOF or reset) well before its timeout.
    let _ = s.read_to_end(&mut rest);
    wait_until(
        Duration::from_secs(5),
        "the tunnel to leave the list",
        || admin_items(&gw, REQUESTS_PATH).is_empty(),
    );
}

/// Runs a Python `requests` script; fails naming what to install when `requests` is missing.
fn python(script: &str, args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 must be installed");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named 'requests'"),
        "Python requests is missing: run scripts/ci-deps.sh (pip install requests)"
    );
    assert!(out.status.success(), "python failed: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const PY_REQUESTS: &str = r#"
import sys, requests
proxy, url, ca = sys.argv[1], sys.argv[2], sys.argv[3]
proxies = {"http": proxy, "https": proxy}
with requests.Session() as s:
    for i in range(3):
        r = s.get(url, proxies=proxies, verify=ca, headers={"X-Service-Route-Tags": "two"}, timeout=20)
        print(r.status_code, r.headers.get("X-Peer", "-"), len(r.content))
    bad = proxy.replace("dep_test:", "dep_test:x")
    try:
        r = s.get(url, proxies={"http": bad, "https": bad}, verify=ca, timeout=20)
        print(r.status_code)
    except requests.exceptions.ProxyError as e:
        # For https, requests raises on the CONNECT's answer instead of returning it.
        print("407" if "407 Proxy Authentication Required" in str(e) else e)
"#;

#[test]
fn python_requests_through_the_proxy_plain_and_tls() {
    let ca = TestCa::new();
    let plain = Upstream::start(upstream::echo());
    let tls = tls_upstream(&ca);
    let gw = Gateway::builder()
        .workers(&format!("{TWO_WORKERS}\n{}", trusting(&ca)))
        .start();
    let proxy = format!("http://{}@{}", proxy_user(), gw.proxy.unwrap());
    let ca_file = ca.ca_file().display().to_string();
    let out = python(PY_REQUESTS, &[&proxy, &plain.url("/py"), &ca_file]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    for l in &lines[..3] {
        assert!(l.starts_with("200 127.0.0.2:"), "{out}");
    }
    assert_eq!(lines[3], "407", "{out}");
    // Keep-alive on both sides: three requests, one upstream connection.
    assert_eq!(plain.connections(), 1);

    // HTTPS: requests opens a CONNECT tunnel and speaks TLS to the upstream through it. The
    // routing header goes only to the destination there (requests does not send it on the
    // CONNECT), so the tunnel is routed without hints.
    let out = python(
        PY_REQUESTS,
        &[&proxy, &tls.https_url("localhost", "/tls"), &ca_file],
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    for l in &lines[..3] {
        assert!(l.starts_with("200 127.0.0."), "{out}");
    }
    assert_eq!(lines[3], "407", "{out}");
}

#[test]
fn chunked_and_close_delimited_responses_are_relayed_whole() {
    let len = 3 * 1024 * 1024 + 5;
    let want = upstream::pattern(len);
    let gw = Gateway::builder().start();
    for (script, http10) in [
        (upstream::large_chunked(len), false),
        (upstream::large_chunked(len), true),
        (upstream::close_delimited(want.clone()), false),
    ] {
        let up = Upstream::start(script);
        let url = up.url("/");
        let mut args = Vec::new();
        if http10 {
            args.push("-0");
        }
        args.push(&url);
        let out = curl_as_test(&gw, &args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r = curl_response(&out);
        assert_eq!(r.status, 200);
        let te = r.header("transfer-encoding");
        // Unknown length: chunked to an HTTP/1.1 client, until close to an HTTP/1.0 one.
        assert_eq!(
            te,
            if http10 { None } else { Some("chunked") },
            "http10={http10}"
        );
        assert_eq!(r.body.len(), want.len(), "http10={http10}");
        assert!(r.body == want, "http10={http10}: body differs");
    }
}

#[test]
fn absolute_form_https_targets_use_tls_from_the_gateway() {
    let ca = TestCa::new();
    let up = tls_upstream(&ca);
    let gw = Gateway::builder().workers(&trusting(&ca)).start();
    let auth = base64_basic(&proxy_user());
    let url = up.https_url("localhost", "/tls-abs");
    let r = raw_exchange(
        gw.proxy.unwrap(),
        format!(
            "GET {url} HTTP/1.1\r\nHost: localhost:{}\r\nProxy-Authorization: Basic {auth}\r\n\
             Connection: close\r\n\r\n",
            up.port()
        )
        .as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = r.text();
    assert!(seen.starts_with("GET /tls-abs HTTP/1.1\r\n"), "{seen}");
    assert_eq!(header(&seen, "host"), [format!("localhost:{}", up.port())]);
    assert!(header(&seen, "proxy-authorization").is_empty(), "{seen}");
}

/// Port 25 (SMTP relay) is refused by default on every ingress, before routing, with the reason
/// `port` (decision 103); `control.denied_destination_ports = []` refuses none.
#[test]
fn the_smtp_relay_port_is_refused_on_every_ingress_by_default() {
    let gw = Gateway::start();
    let r = request_api(
        &gw,
        &json!({"method": "GET", "url": "http://127.0.0.1:25/"}),
    );
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.json()["code"], "destination_denied", "{}", r.text());
    assert_eq!(r.json()["details"]["reason"], "port", "{}", r.text());
    let r = curl_response(&curl_as_test(&gw, &["http://127.0.0.1:25/"]));
    assert_eq!(r.status, 403);
    assert_eq!(r.json()["details"]["reason"], "port", "{}", r.text());
    assert_eq!(
        r.header("proxy-status"),
        Some("sortie; error=destination_ip_prohibited; details=\"destination_denied\"")
    );
    let (_s, status) = open_tunnel(&gw, 25);
    assert!(status.starts_with("HTTP/1.1 403"), "{status}");
    // Any other port goes its usual way: nothing listens there, the connection is refused.
    let refused = |gw: &Gateway, port: u16| {
        let url = format!("http://127.0.0.1:{port}/");
        let r = request_api(gw, &json!({"method": "GET", "url": url}));
        assert_eq!(
            r.json()["code"],
            "upstream_connection_refused",
            "{}",
            r.text()
        );
    };
    refused(&gw, 587);
    let open = Gateway::builder()
        .control("denied_destination_ports = []")
        .start();
    refused(&open, 25);
}

/// A destination whose body is malformed before any byte of it reached the client (`zz` as
/// the first chunk size) gets the client a 502 with `Proxy-Status: ... http_protocol_error`,
/// as a malformed head does, not a connection closed with nothing.
#[test]
fn a_body_malformed_before_its_first_byte_answers_502_with_proxy_status() {
    let up = Upstream::start(std::sync::Arc::new(|_: &upstream::Request| {
        vec![
            upstream::Step::Write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n".to_vec(),
            ),
            upstream::Step::Close,
        ]
    }));
    let gw = Gateway::builder().start();
    let mut s = TcpStream::connect(gw.proxy.unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(proxied_get(&up.url("/bad-chunk"), up.port()).as_bytes())
        .unwrap();
    let (raw, _) = read_one(&mut s);
    let r = parse_response(&raw);
    assert_eq!(r.status, 502, "{}", String::from_utf8_lossy(&raw));
    assert_eq!(r.header("connection"), Some("close"));
    let status = r.header("proxy-status").unwrap_or_default();
    assert!(status.contains("error=http_protocol_error"), "{status}");
    assert_eq!(r.json()["code"], "protocol_error", "{}", r.text());
}
