//! The HTTP/1.1 server's protocol behaviour over real loopback sockets: keep-alive, pipelining,
//! bodies, `100 Continue`, HEAD, and the strict rejection of everything that could smuggle.

use crate::support::http_server as support;

use support::{test_config, TestServer};

#[test]
fn keep_alive_serves_three_sequential_requests_on_one_connection() {
    let server = TestServer::start(test_config());
    let mut c = server.client();
    for i in 1..=3 {
        let r = c.get(&format!("/n/{i}?q=1"));
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), format!("GET /n/{i}?q=1"));
        assert_eq!(r.header("x-served").as_deref(), Some(&*i.to_string()));
        assert!(!r.is_closing());
        assert!(r.header("date").is_some_and(|d| d.ends_with(" GMT")));
    }
}

/// A connection quiet for longer than the server's idle release (100 ms) gives its read buffer
/// back and waits for readability; what comes next is served as before: a whole request, a
/// head arriving in pieces, pipelined requests, a body, and a first request that is late.
#[test]
fn requests_after_the_connection_went_idle_are_served() {
    let server = TestServer::start(test_config());
    let quiet = || std::thread::sleep(std::time::Duration::from_millis(300));
    let mut c = server.client();
    assert_eq!(c.get("/before").text(), "GET /before");
    quiet();
    assert_eq!(c.get("/after").text(), "GET /after");
    quiet();
    c.send(b"GET /pie");
    std::thread::sleep(std::time::Duration::from_millis(100));
    c.send(b"ces HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(c.reply().text(), "GET /pieces");
    quiet();
    c.send(
        b"GET /one HTTP/1.1\r\nHost: t\r\n\r\n\
          POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nbody",
    );
    assert_eq!(c.reply().text(), "GET /one");
    assert_eq!(c.reply().text(), "body");

    // A new connection whose first request comes late (within the header timeout).
    let mut late = server.client();
    quiet();
    assert_eq!(late.get("/late").text(), "GET /late");
}

/// Requests that arrive as the wait for the next one reaches the idle release (100 ms), a little
/// before, at, or a little after it, are served all the same: the connection is either still
/// waiting for readiness or parked, and neither loses what the client sent.
#[test]
fn requests_at_the_idle_release_are_served() {
    let server = TestServer::start(test_config());
    let mut c = server.client();
    for (i, ms) in [90u64, 95, 98, 100, 102, 105, 110, 97, 101, 99]
        .iter()
        .enumerate()
    {
        std::thread::sleep(std::time::Duration::from_millis(*ms));
        let path = format!("/at-{i}");
        assert_eq!(c.get(&path).text(), format!("GET {path}"), "after {ms} ms");
    }
}

/// A small keep-alive response goes out while the server reads the next head (on io_uring,
/// from a connection's second response on). A client that sends its requests one by one and
/// reads nothing fills its receive buffer and the server's send buffer: sends made that way
/// are then short or wait, and what they left is written when the next head is in. Every
/// response still arrives whole and in order once the client reads.
#[test]
fn responses_arrive_whole_and_in_order_to_a_client_that_reads_late() {
    const REQUESTS: usize = 800;
    const BODY: usize = 7000;
    let server = TestServer::start(test_config());
    let mut c = support::Client::connect_with_receive_buffer(server.addr, 4096);
    for _ in 0..REQUESTS {
        c.send(format!("GET /big/{BODY} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
        // Each head on its own: the server reads each with the response before still going.
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    for i in 1..=REQUESTS {
        let r = c.reply();
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-served").as_deref(), Some(&*i.to_string()));
        assert_eq!(r.body.len(), BODY, "response {i}");
        assert!(r.body.iter().all(|&b| b == b'b'), "response {i}");
    }
    // The connection is still good.
    assert_eq!(c.get("/after").text(), "GET /after");
}

/// A body written behind room for its head (`ResponseBody::BehindRoom`) goes out with the
/// head written into that room: small ones sent while the next head is read, to a client that
/// reads late (so that those sends come up short and are finished from where they stopped),
/// large ones written at once; a head longer than the room is sent with the body copied behind
/// it. Every response arrives whole, framed by its length, and in order.
#[test]
fn bodies_behind_room_for_the_head_arrive_whole() {
    const REQUESTS: usize = 400;
    let server = TestServer::start(test_config());
    let mut c = support::Client::connect_with_receive_buffer(server.addr, 4096);
    let paths = [
        "/room/256/7000",
        "/room/4/300",
        "/room/256/100000",
        "/room/256/0",
    ];
    for i in 0..REQUESTS {
        let path = paths[i % paths.len()];
        c.send(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    for i in 0..REQUESTS {
        let path = paths[i % paths.len()];
        let n: usize = path.rsplit('/').next().unwrap().parse().unwrap();
        let r = c.reply();
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("application/json")
        );
        assert_eq!(r.body.len(), n, "response {i} of {path}");
        assert!(r.body.iter().all(|&b| b == b'r'), "response {i} of {path}");
    }
    assert_eq!(c.get("/after").text(), "GET /after");
}

#[test]
fn pipelined_requests_in_one_write_are_answered_in_order() {
    let server = TestServer::start(test_config());
    let mut c = server.client();
    c.send(
        b"GET /first HTTP/1.1\r\nHost: t\r\n\r\n\
          POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 6\r\n\r\nsecond\
          POST /chunks HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nthird\r\n0\r\n\r\n\
          GET /fourth HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert_eq!(c.reply().text(), "GET /first");
    assert_eq!(c.reply().text(), "second");
    assert_eq!(c.reply().text(), "third");
    assert_eq!(c.reply().text(), "GET /fourth");
}

#[test]
fn pipelined_request_split_at_every_byte_still_parses() {
    let server = TestServer::start(test_config());
    let mut c = server.client();
    let req = b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabcGET /x HTTP/1.1\r\nHost: t\r\n\r\n";
    // One byte per write: the server sees the head in many reads (the client is slow on
    // purpose; nothing waits on the server).
    for b in req.iter() {
        c.send(std::slice::from_ref(b));
    }
    assert_eq!(c.reply().text(), "abc");
    assert_eq!(c.reply().text(), "GET /x");
}

#[test]
fn content_length_body_is_read() {
    let server = TestServer::start(test_config());
    let mut c = server.client();
    let body = vec![b'z'; 100_000];
    c.send(
        format!(
            "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    c.send(&body);
    let r = c.reply();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, body);
    // The connection stays usable after a large body.
    assert_eq!(c.get("/after").text(), "GET /after");
}

#[test]
fn chunked_body_with_extensions_and_trailers() {
    let server = TestServer::start(test_config());
    let mut c = server.client();
    c.send(
        b"POST /chunks HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n\
          5;name=value\r\nhello\r\n\
          1;a;b=\"quoted \\\" value\"\r\n \r\n\
          5\r\nworld\r\n\
          0;last=1\r\nX-Trailer: t1\r\nX-Other: t2\r\n\r\n",
    );
    let r = c.reply();
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "hello world");
    assert!(!r.is_closing());
    assert_eq!(c.get("/next").text(), "GET /next");
}

#[test]
fn chunked_body_streams_in_pieces() {
    let server = TestServer::start(test_config());
    let mut c = server.client();
    c.send(b"POST /chunks HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
    let mut want = Vec::new();
    for i in 0..50u8 {
        let piece = vec![b'a' + i % 26; 1000];
        c.send(format!("{:x}\r\n", piece.len()).as_bytes());
        c.send(&piece);
        c.send(b"\r\n");
        want.extend_from_slice(&piece);
    }
    c.send(b"0\r\n\r\n");
    let r = c.reply();
    assert_eq!(r.body, want);
    let pieces: usize = r.header("x-pieces").unwrap().parse().unwrap();
    assert!(pieces >= 1);

    // The handler has the first piece while the client still holds the rest back: the answer
    // comes before the body is complete, which a server that buffers whole bodies never gives.
    let mut c = server.client();
    c.send(b"POST /first-piece HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
    c.send(b"3e8\r\n");
    c.send(&[b'p'; 1000]);
    c.send(b"\r\n");
    let r = c.reply();
    assert_eq!(r.status, 200);
    let first: usize = r.text().parse().unwrap();
    assert!((1..=1000).contains(&first), "first piece of {first} bytes");
}

#[test]
fn expect_100_continue_is_sent_when_the_handler_reads() {
    let server = TestServer::start(test_config());
    let mut c = server.client();
    c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n");
    // The client holds the body back until the interim response arrives.
    let interim = c.reply();
    assert_eq!(interim.status, 100);
    c.send(b"hello");
    let r = c.reply();
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "hello");
    assert!(!r.is_closing());
    assert_eq!(c.get("/again").text(), "GET /again");
}

#[test]
fn expect_100_continue_unread_body_closes_without_interim() {
    let server = TestServer::start(test_config());
    let mut c = server.client();
    c.send(
        b"POST /noread HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    );
    let r = c.reply();
    assert_eq!(r.status, 200, "no 100 Continue before the final answer");
    assert_eq!(r.text(), "ignored");
    assert!(r.is_closing());
    c.expect_closed();
}

#[test]
fn expect_100_continue_with_body_over_limit_is_413_without_interim() {
    let server = TestServer::start(test_config());
    let mut c = server.client();
    c.send(
        b"POST /limit/4 HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    );
    let r = c.reply();
    assert_eq!(r.status, 413);
    assert!(r.is_closing());
    c.expect_closed();
}

#[test]
fn head_gets_headers_without_body() {
    let server = TestServer::start(test_config());
    let mut c = server.client();
    c.send(b"HEAD /thing HTTP/1.1\r\nHost: t\r\n\r\n");
    let r = c.reply_to("HEAD");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length").as_deref(), Some("11"));
    assert!(r.body.is_empty());
    // Had the body been sent, it would be parsed as the next response and fail.
    let next = c.get("/after-head");
    assert_eq!(next.text(), "GET /after-head");
}

#[test]
fn smuggling_and_strictness_cases_are_400_and_close() {
    let table: &[(&str, &[u8])] = &[
        ("CL and TE", b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        ("TE and CL", b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n"),
        ("duplicate CL", b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello"),
        ("differing CL", b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"),
        ("CL list", b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5, 5\r\n\r\nhello"),
        ("bad CL", b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: +5\r\n\r\nhello"),
        ("hex CL", b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 0x5\r\n\r\nhello"),
        ("bad chunk size", b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"),
        ("chunk size with sign", b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n+5\r\nhello\r\n0\r\n\r\n"),
        ("chunk data too long", b"POST /chunks HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhello\r\n0\r\n\r\n"),
        ("chunk bare LF", b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n"),
        ("bare LF", b"GET / HTTP/1.1\nHost: t\n\n"),
        ("bare LF in field", b"GET / HTTP/1.1\r\nHost: t\nX: y\r\n\r\n"),
        ("obs-fold", b"GET / HTTP/1.1\r\nHost: t\r\nX: a\r\n b\r\n\r\n"),
        ("space before colon", b"GET / HTTP/1.1\r\nHost : t\r\n\r\n"),
        ("missing Host", b"GET / HTTP/1.1\r\n\r\n"),
        ("two Hosts", b"GET / HTTP/1.1\r\nHost: t\r\nHost: u\r\n\r\n"),
        ("TE not chunked last", b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked, identity\r\n\r\n"),
        ("TE in HTTP/1.0", b"POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        ("NUL in value", b"GET / HTTP/1.1\r\nHost: t\r\nX: a\0b\r\n\r\n"),
        ("bad method", b"G(T / HTTP/1.1\r\nHost: t\r\n\r\n"),
        ("relative target", b"GET foo HTTP/1.1\r\nHost: t\r\n\r\n"),
    ];
    let server = TestServer::start(test_config());
    for (name, raw) in table {
        let mut c = server.client();
        c.send(raw);
        // A request after the bad one must never be answered.
        c.send(b"GET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n");
        let r = c.reply();
        assert_eq!(r.status, 400, "{name}: {}", r.text());
        assert!(r.is_closing(), "{name}");
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("application/json"),
            "{name}"
        );
        assert!(r.text().starts_with("{\"error\":"), "{name}: {}", r.text());
        c.expect_closed();
    }
}

#[test]
fn other_head_errors_get_their_status_and_close() {
    let long_target = format!("GET /{} HTTP/1.1\r\nHost: t\r\n\r\n", "a".repeat(9000));
    let many_headers = format!(
        "GET / HTTP/1.1\r\nHost: t\r\n{}\r\n",
        (0..120)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect::<String>()
    );
    let table: Vec<(&str, Vec<u8>, u16)> = vec![
        ("target too long", long_target.into_bytes(), 414),
        ("too many headers", many_headers.into_bytes(), 431),
        (
            "unsupported coding",
            b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n".to_vec(),
            501,
        ),
        (
            "HTTP/2.0",
            b"GET / HTTP/2.0\r\nHost: t\r\n\r\n".to_vec(),
            505,
        ),
        (
            "unknown expectation",
            b"POST / HTTP/1.1\r\nHost: t\r\nExpect: 200-ok\r\n\r\n".to_vec(),
            417,
        ),
    ];
    let server = TestServer::start(test_config());
    for (name, raw, status) in table {
        let mut c = server.client();
        c.send(&raw);
        let r = c.reply();
        assert_eq!(r.status, status, "{name}");
        assert!(r.is_closing(), "{name}");
        c.expect_closed();
    }
}

#[test]
fn head_too_large_is_431() {
    let server = TestServer::start(test_config());
    let mut c = server.client();
    // One field longer than the 16 KiB head limit, sent in pieces.
    c.send(b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: ");
    let big = vec![b'v'; 20 * 1024];
    // The server may answer and close before the client is done writing.
    let _ = std::io::Write::write_all(&mut c.stream, &big);
    let r = c.reply();
    assert_eq!(r.status, 431);
    assert!(r.is_closing());
    assert_eq!(r.text(), "{\"error\":\"head_too_large\"}");
}

#[test]
fn head_just_under_the_limit_is_served() {
    let server = TestServer::start(test_config());
    let mut c = server.client();
    let prefix = "GET /big HTTP/1.1\r\nHost: t\r\nX-Big: ";
    let fill = 16 * 1024 - prefix.len() - 4;
    c.send(format!("{prefix}{}\r\n\r\n", "v".repeat(fill)).as_bytes());
    let r = c.reply();
    assert_eq!(r.status, 200);
    assert_eq!(c.get("/small").text(), "GET /small");
}

#[test]
fn body_over_limit_is_413_and_closes() {
    let server = TestServer::start(test_config());
    // Declared length above the limit: refused before any body byte is read.
    let mut c = server.client();
    c.send(b"POST /limit/10 HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\nhello world");
    let r = c.reply();
    assert_eq!(r.status, 413);
    assert!(r.is_closing());
    assert_eq!(r.text(), "{\"error\":\"body_too_large\"}");
    c.expect_closed();

    // A chunked body growing past the limit: the handler's read fails and the server answers.
    let mut c = server.client();
    c.send(b"POST /limit/10 HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nhello \r\n6\r\nworld!\r\n0\r\n\r\n");
    let r = c.reply();
    assert_eq!(r.status, 413);
    assert!(r.is_closing());
    c.expect_closed();

    // The handler's own read_to_end limit (1 MiB on /echo).
    let mut c = server.client();
    let body = vec![b'x'; (1 << 20) + 1];
    c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
    c.send(format!("{:x}\r\n", body.len()).as_bytes());
    let _ = std::io::Write::write_all(&mut c.stream, &body);
    let r = c.reply();
    assert_eq!(r.status, 413);
    assert!(r.is_closing());

    // At the limit exactly is fine.
    let mut c = server.client();
    c.send(b"POST /limit/10 HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nhelloworld");
    assert_eq!(c.reply().text(), "helloworld");
}

#[test]
fn unread_body_is_drained_and_the_connection_kept() {
    let server = TestServer::start(test_config());
    let mut c = server.client();
    c.send(b"POST /noread HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n");
    c.send(&[b'b'; 1000]);
    let r = c.reply();
    assert_eq!(r.text(), "ignored");
    assert!(!r.is_closing());
    assert_eq!(c.get("/next").text(), "GET /next");

    // Refused from the head: the body is discarded too.
    c.send(b"POST /refuse HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
    let r = c.reply();
    assert_eq!(r.status, 403);
    assert!(!r.is_closing());
    assert_eq!(c.get("/next2").text(), "GET /next2");
}

#[test]
fn unread_body_past_the_drain_bound_closes() {
    let mut cfg = test_config();
    cfg.max_drain_bytes = 100;
    let server = TestServer::start(cfg);
    let mut c = server.client();
    c.send(b"POST /noread HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n");
    c.send(&[b'b'; 1000]);
    let r = c.reply();
    assert_eq!(r.text(), "ignored");
    assert!(r.is_closing());
    c.expect_closed();
}

#[test]
fn http10_keep_alive_only_when_asked() {
    let server = TestServer::start(test_config());
    let mut c = server.client();
    c.send(b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    let r = c.reply();
    assert_eq!(r.header("connection").as_deref(), Some("keep-alive"));
    c.send(b"GET /b HTTP/1.0\r\n\r\n");
    let r = c.reply();
    assert_eq!(r.text(), "GET /b");
    assert!(r.is_closing());
    c.expect_closed();
}

#[test]
fn client_or_handler_close_ends_the_connection() {
    let server = TestServer::start(test_config());
    let mut c = server.client();
    c.send(b"GET /a HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    assert!(c.reply().is_closing());
    c.expect_closed();

    let mut c = server.client();
    let r = c.get("/close");
    assert_eq!(r.text(), "bye");
    assert!(r.is_closing());
    c.expect_closed();
}

#[test]
fn unencodable_response_becomes_500() {
    let server = TestServer::start(test_config());
    let mut c = server.client();
    let r = c.get("/bad-header");
    assert_eq!(r.status, 500);
    assert!(r.header("x-injected").is_none());
    assert!(r.is_closing());
}

#[test]
fn leading_empty_line_before_a_request_is_ignored() {
    let server = TestServer::start(test_config());
    let mut c = server.client();
    c.send(b"\r\nGET /x HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(c.reply().text(), "GET /x");
}

#[test]
fn client_closing_mid_body_is_handled_quietly() {
    let server = TestServer::start(test_config());
    let mut c = server.client();
    c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nabc");
    c.shutdown_write();
    // No answer can be delivered to a client that left mid-body; the server just closes.
    assert!(c.try_reply_to("POST").is_none());
    // And the server still serves others.
    assert_eq!(server.client().get("/ok").text(), "GET /ok");
}

#[test]
fn curl_smoke_test() {
    let out = std::process::Command::new("curl")
        .arg("--version")
        .output()
        .expect("this test needs curl (scripts/ci-deps.sh installs it)");
    assert!(out.status.success());
    let server = TestServer::start(test_config());
    let url = format!("http://{}/echo", server.addr);
    let out = std::process::Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "5",
            "-H",
            "Expect: 100-continue",
            "--data-binary",
            "hello from curl",
        ])
        .arg(&url)
        .arg(&url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello from curlhello from curl"
    );
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "5", "-I"])
        .arg(format!("http://{}/head", server.addr))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 200 ok"), "{text}");
    assert!(text.contains("content-length: 10"), "{text}");
}
