//! Integration tests of the egress client's HTTP/1.1 exchange against scripted loopback
//! upstreams: what goes on the wire, every response framing, interim responses, malformed
//! responses and the response body limit.

use crate::support;

use bytes::Bytes;
use sortie_core::error::ErrorCode;
use sortie_core::request::{Header, Method};
use support::upstream::{self, Upstream};
use support::{detail, egress, expect_code, header, request, run};

fn h(name: &str, value: &str) -> Header {
    Header::new(name, value.as_bytes()).expect("a valid destination header")
}

#[test]
fn get_sends_host_first_headers_in_order_and_keep_alive() {
    let up = Upstream::start(upstream::echo());
    run(async {
        let egress = egress(None);
        let mut req = request(Method::Get, &up.url("/a/b?c=d&e"));
        req.headers = vec![
            h("Accept", "*/*"),
            h("X-Dup", "one"),
            h("x-dup", "two"),
            h("User-Agent", "sortie-test"),
        ];
        let resp = egress.execute(&req).await.expect("response");
        assert_eq!(resp.status, 200);
        let want = format!(
            "GET /a/b?c=d&e HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAccept: */*\r\nX-Dup: one\r\n\
             x-dup: two\r\nUser-Agent: sortie-test\r\nConnection: keep-alive\r\n\r\n",
            up.port()
        );
        assert_eq!(String::from_utf8_lossy(&resp.body), want);
        assert_eq!(resp.peer_addr, up.addr());
        assert!(!resp.is_connection_reused);
    });
}

#[test]
fn bodies_carry_content_length_and_empty_posts_say_zero() {
    let up = Upstream::start(upstream::echo());
    run(async {
        let egress = egress(None);
        let table: &[(Method, &[u8], &str)] = &[
            (Method::Post, b"", "Content-Length: 0\r\n\r\n"),
            (Method::Patch, b"", "Content-Length: 0\r\n\r\n"),
            (Method::Put, b"hello", "Content-Length: 5\r\n\r\nhello"),
            (Method::Delete, b"", "Connection: keep-alive\r\n\r\n"),
            (Method::Options, b"x", "Content-Length: 1\r\n\r\nx"),
        ];
        for (method, body, tail) in table {
            let mut req = request(*method, &up.url("/"));
            req.body = Bytes::copy_from_slice(body);
            let resp = egress.execute(&req).await.expect("response");
            let sent = String::from_utf8_lossy(&resp.body).into_owned();
            assert!(sent.starts_with(method.as_str()), "{sent:?}");
            assert!(sent.ends_with(tail), "{method:?}: {sent:?}");
            assert!(!sent.to_ascii_lowercase().contains("expect"), "{sent:?}");
        }
    });
}

#[test]
fn large_request_body_is_sent_whole() {
    let up = Upstream::start(upstream::echo());
    run(async {
        let egress = egress(None);
        let body = upstream::pattern(3 * 1024 * 1024 + 7);
        let mut req = request(Method::Post, &up.url("/upload"));
        req.body = Bytes::from(body.clone());
        req.max_response_body_bytes = 8 * 1024 * 1024;
        let resp = egress.execute(&req).await.expect("response");
        assert!(resp.body.ends_with(&body));
    });
}

#[test]
fn managed_headers_never_reach_the_destination() {
    let up = Upstream::start(upstream::echo());
    run(async {
        let egress = egress(None);
        let mut req = request(Method::Get, &up.url("/"));
        // A managed field cannot be made into a `Header`: the type is the filter.
        for (name, value) in [
            ("Host", "evil.example"),
            ("Content-Length", "99"),
            ("Transfer-Encoding", "chunked"),
            ("Connection", "close"),
            ("Expect", "100-continue"),
            ("Proxy-Authorization", "Basic c2VjcmV0"),
            ("X-Service-Token", "secret"),
        ] {
            let e = Header::new(name, value.as_bytes()).expect_err(name);
            assert_eq!(e.code, ErrorCode::InvalidRequest, "{name}");
        }
        req.headers = vec![h("X-Kept", "yes")];
        let resp = egress.execute(&req).await.expect("response");
        let sent = String::from_utf8_lossy(&resp.body).to_ascii_lowercase();
        for gone in [
            "evil.example",
            "content-length",
            "transfer-encoding",
            "connection: close",
            "expect",
            "proxy-authorization",
            "x-service-token",
        ] {
            assert!(!sent.contains(gone), "{gone} leaked: {sent:?}");
        }
        assert!(sent.contains("x-kept: yes"));
    });
}

#[test]
fn response_headers_keep_order_duplicates_and_raw_values() {
    let raw = b"HTTP/1.1 201 Created\r\nSet-Cookie: a=1\r\nX-Raw: \xe2\x82\xac tab\there\r\n\
                set-cookie: b=2\r\nContent-Length: 2\r\n\r\nok"
        .to_vec();
    let up = Upstream::start(upstream::fixed(raw));
    run(async {
        let egress = egress(None);
        let resp = egress
            .execute(&request(Method::Get, &up.url("/")))
            .await
            .expect("response");
        assert_eq!(resp.status, 201);
        let names: Vec<&[u8]> = resp.headers.iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            vec![
                &b"Set-Cookie"[..],
                b"X-Raw",
                b"set-cookie",
                b"Content-Length"
            ]
        );
        assert_eq!(
            resp.headers.get(1).map(|(_, v)| v),
            Some(&b"\xe2\x82\xac tab\there"[..])
        );
        assert_eq!(resp.headers.get(2).map(|(_, v)| v), Some(&b"b=2"[..]));
        assert_eq!(resp.body, b"ok");
    });
}

#[test]
fn chunked_response_is_decoded() {
    let chunks = vec![b"hello ".to_vec(), b"chunked ".to_vec(), b"world".to_vec()];
    let up = Upstream::start(upstream::chunked(chunks));
    run(async {
        let egress = egress(None);
        let resp = egress
            .execute(&request(Method::Get, &up.url("/")))
            .await
            .expect("response");
        assert_eq!(resp.body, b"hello chunked world");
        assert_eq!(header(&resp.headers, "transfer-encoding"), Some("chunked"));
        // The body ended cleanly with keep-alive: the connection is pooled.
        assert_eq!(egress.idle_connections(), 1);
    });
}

#[test]
fn five_mebibyte_bodies_by_length_and_chunked() {
    const LEN: usize = 5 * 1024 * 1024;
    for script in [upstream::large(LEN), upstream::large_chunked(LEN)] {
        let up = Upstream::start(script);
        run(async {
            let egress = egress(None);
            let mut req = request(Method::Get, &up.url("/big"));
            req.max_response_body_bytes = 8 * 1024 * 1024;
            let resp = egress.execute(&req).await.expect("response");
            assert_eq!(resp.body.len(), LEN);
            assert!(resp.body == upstream::pattern(LEN), "body differs");
        });
    }
}

#[test]
fn close_delimited_body_ends_with_the_connection_and_is_not_pooled() {
    let up = Upstream::start(upstream::close_delimited(b"until the end".to_vec()));
    run(async {
        let egress = egress(None);
        let resp = egress
            .execute(&request(Method::Get, &up.url("/")))
            .await
            .expect("response");
        assert_eq!(resp.body, b"until the end");
        assert_eq!(egress.idle_connections(), 0);
    });
}

#[test]
fn connection_close_response_is_not_pooled() {
    let raw = upstream::response(200, &[("Connection", "close")], b"bye");
    let up = Upstream::start(upstream::fixed_then_close(raw));
    run(async {
        let egress = egress(None);
        let resp = egress
            .execute(&request(Method::Get, &up.url("/")))
            .await
            .expect("response");
        assert_eq!(resp.body, b"bye");
        assert_eq!(egress.idle_connections(), 0);
    });
}

#[test]
fn interim_responses_are_skipped() {
    let up = Upstream::start(upstream::interim_then_ok());
    run(async {
        let egress = egress(None);
        let resp = egress
            .execute(&request(Method::Get, &up.url("/early")))
            .await
            .expect("response");
        assert_eq!(resp.status, 200);
        assert!(resp.body.starts_with(b"GET /early HTTP/1.1\r\n"));
        assert_eq!(header(&resp.headers, "link"), None);
        assert_eq!(egress.idle_connections(), 1);
    });
}

#[test]
fn bodiless_responses_have_no_body() {
    // HEAD: a Content-Length describes the GET body, none follows. 204 and 304: never a body.
    let head_up = Upstream::start(upstream::fixed(
        b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n".to_vec(),
    ));
    let no_content = Upstream::start(upstream::fixed(
        b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n".to_vec(),
    ));
    let not_modified = Upstream::start(upstream::fixed(
        b"HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n".to_vec(),
    ));
    run(async {
        let egress = egress(None);
        let table = [
            (Method::Head, &head_up, 200),
            (Method::Get, &no_content, 204),
            (Method::Get, &not_modified, 304),
        ];
        for (method, up, status) in table {
            let resp = egress
                .execute(&request(method, &up.url("/")))
                .await
                .expect("response");
            assert_eq!(resp.status, status);
            assert!(resp.body.is_empty());
            // Twice on the same connection: framing stayed in step.
            let again = egress
                .execute(&request(method, &up.url("/")))
                .await
                .expect("response");
            assert!(again.is_connection_reused, "{status}");
        }
    });
}

#[test]
fn malformed_and_unexpected_responses_are_protocol_errors() {
    let table: &[(&[u8], &str)] = &[
        (b"HTTP/1.1 200 OK\nContent-Length: 0\n\n", "bare_lf"),
        (b"HTTP/2.0 200 OK\r\n\r\n", "unsupported_version"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx",
            "duplicate_content_length",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "unsupported_transfer_coding",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "invalid_chunk_size",
        ),
        (
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
            "unexpected_101",
        ),
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "invalid_version"),
    ];
    for (raw, reason) in table {
        let up = Upstream::start(upstream::fixed(raw.to_vec()));
        run(async {
            let egress = egress(None);
            let e = expect_code(
                egress.execute(&request(Method::Get, &up.url("/"))).await,
                ErrorCode::ProtocolError,
            );
            assert_eq!(e.http_status(), 502);
            assert_eq!(detail(&e, "side"), Some("upstream"), "{e:?}");
            assert_eq!(detail(&e, "reason"), Some(*reason), "{e:?}");
            assert_eq!(egress.idle_connections(), 0);
        });
    }
}

#[test]
fn too_many_interim_responses_are_a_protocol_error() {
    let mut raw =
        b"HTTP/1.1 100 Continue\r\n\r\n".repeat(sortie_io::egress::MAX_INTERIM_RESPONSES + 1);
    raw.extend_from_slice(&upstream::response(200, &[], b"late"));
    let up = Upstream::start(upstream::fixed(raw));
    run(async {
        let egress = egress(None);
        let e = expect_code(
            egress.execute(&request(Method::Get, &up.url("/"))).await,
            ErrorCode::ProtocolError,
        );
        assert_eq!(detail(&e, "reason"), Some("too_many_interim_responses"));
    });
}

#[test]
fn response_over_the_limit_is_body_too_large_for_every_framing() {
    const LIMIT: usize = 1024 * 1024;
    let scripts = [
        ("content-length", upstream::large(LIMIT + 1)),
        ("chunked", upstream::large_chunked(5 * 1024 * 1024)),
        (
            "close-delimited",
            upstream::close_delimited(upstream::pattern(LIMIT + 10)),
        ),
    ];
    for (name, script) in scripts {
        let up = Upstream::start(script);
        run(async {
            let egress = egress(None);
            let mut req = request(Method::Get, &up.url("/"));
            req.max_response_body_bytes = LIMIT;
            let e = expect_code(egress.execute(&req).await, ErrorCode::BodyTooLarge);
            assert_eq!(e.http_status(), 413, "{name}");
            assert_eq!(detail(&e, "direction"), Some("response"), "{name}");
            assert_eq!(detail(&e, "limit_bytes"), Some("1048576"), "{name}");
            assert_eq!(egress.idle_connections(), 0, "{name}");
        });
    }
    // Exactly at the limit is fine.
    let up = Upstream::start(upstream::large(LIMIT));
    run(async {
        let egress = egress(None);
        let mut req = request(Method::Get, &up.url("/"));
        req.max_response_body_bytes = LIMIT;
        let resp = egress.execute(&req).await.expect("response at the limit");
        assert_eq!(resp.body.len(), LIMIT);
    });
}

#[test]
fn bind_address_sets_the_source_of_the_connection() {
    let up = Upstream::start(upstream::echo());
    run(async {
        let egress = egress(None);
        let mut req = request(Method::Get, &up.url("/"));
        req.bind_address = Some(support::loopback_alias());
        let resp = egress.execute(&req).await.expect("response");
        let peer = header(&resp.headers, "x-peer").expect("peer header");
        assert!(peer.starts_with("127.0.0.2:"), "{peer}");
        // Connections are pooled per source address: without it, a new connection is made.
        let plain = egress
            .execute(&request(Method::Get, &up.url("/")))
            .await
            .expect("response");
        assert!(!plain.is_connection_reused);
        assert!(header(&plain.headers, "x-peer")
            .unwrap()
            .starts_with("127.0.0.1:"));
        let again = egress.execute(&req).await.expect("response");
        assert!(again.is_connection_reused);
        assert_eq!(up.connections(), 2);
    });
}

#[test]
fn bind_address_of_the_wrong_family_is_an_internal_error() {
    let up = Upstream::start(upstream::echo());
    run(async {
        let egress = egress(None);
        let mut req = request(Method::Get, &up.url("/"));
        req.bind_address = Some("::1".parse().unwrap());
        let e = expect_code(egress.execute(&req).await, ErrorCode::ExecutorInternalError);
        assert_eq!(up.connections(), 0, "{e:?}");
    });
}
