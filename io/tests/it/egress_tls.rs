//! Integration tests of HTTPS to destinations: a test CA trusted through the `ca_file` path,
//! names and IP literals, pooling of TLS connections, and every way a handshake fails.

use crate::support;

use std::time::Duration;

use sortie_core::error::{ErrorCode, TimeoutType};
use sortie_core::request::Method;
use support::tls::{untrusted_config, TestCa};
use support::upstream::{self, Options, Upstream};
use support::{detail, egress, expect_code, header, request, run};

fn tls_upstream(
    script: upstream::Script,
    config: std::sync::Arc<rustls::ServerConfig>,
) -> Upstream {
    Upstream::start_with(
        script,
        Options {
            tls: Some(config),
            ..Options::default()
        },
    )
}

#[test]
fn trusted_ca_file_works_for_names_and_ip_literals() {
    let ca = TestCa::new();
    let up = tls_upstream(upstream::echo(), ca.localhost_config());
    run(async {
        let egress = egress(Some(ca.ca_file()));
        for host in ["localhost", "127.0.0.1"] {
            let resp = egress
                .execute(&request(Method::Get, &up.https_url(host, "/secure")))
                .await
                .unwrap_or_else(|e| panic!("{host}: {e:?}"));
            assert_eq!(resp.status, 200);
            let want = format!("GET /secure HTTP/1.1\r\nHost: {host}:{}\r\n", up.port());
            assert!(resp.body.starts_with(want.as_bytes()), "{host}");
            assert!(resp.connect_ms < 5_000);
        }
    });
}

#[test]
fn tls_connections_are_pooled() {
    let ca = TestCa::new();
    let up = tls_upstream(upstream::echo(), ca.localhost_config());
    run(async {
        let egress = egress(Some(ca.ca_file()));
        let req = request(Method::Get, &up.https_url("localhost", "/"));
        for i in 0..3 {
            let resp = egress.execute(&req).await.expect("response");
            assert_eq!(resp.is_connection_reused, i > 0);
            assert_eq!(header(&resp.headers, "x-conn-seq"), Some("0"));
        }
        assert_eq!(up.connections(), 1);
        assert_eq!(egress.idle_connections(), 1);
    });
}

#[test]
fn tls_bodies_by_every_framing() {
    let ca = TestCa::new();
    const LEN: usize = 2 * 1024 * 1024 + 3;
    let scripts = [
        upstream::large(LEN),
        upstream::large_chunked(LEN),
        upstream::close_delimited(upstream::pattern(LEN)),
    ];
    for script in scripts {
        let up = tls_upstream(script, ca.localhost_config());
        run(async {
            let egress = egress(Some(ca.ca_file()));
            let mut req = request(Method::Get, &up.https_url("localhost", "/"));
            req.max_response_body_bytes = 4 * 1024 * 1024;
            let resp = egress.execute(&req).await.expect("response");
            assert!(resp.body == upstream::pattern(LEN), "body differs");
        });
    }
}

#[test]
fn untrusted_certificate_is_tls_failure() {
    let up = tls_upstream(upstream::echo(), untrusted_config());
    run(async {
        let egress = egress(None);
        let e = expect_code(
            egress
                .execute(&request(Method::Get, &up.https_url("localhost", "/")))
                .await,
            ErrorCode::UpstreamTlsFailure,
        );
        assert_eq!(e.http_status(), 502);
        assert!(e.code.is_retryable());
        assert_eq!(
            detail(&e, "reason"),
            Some("invalid certificate: UnknownIssuer")
        );
        assert_eq!(up.requests(), 0);
    });
}

#[test]
fn certificate_for_another_name_is_tls_failure() {
    let ca = TestCa::new();
    let up = tls_upstream(upstream::echo(), ca.server_config(&["other.test"]));
    run(async {
        let egress = egress(Some(ca.ca_file()));
        for host in ["localhost", "127.0.0.1"] {
            let e = expect_code(
                egress
                    .execute(&request(Method::Get, &up.https_url(host, "/")))
                    .await,
                ErrorCode::UpstreamTlsFailure,
            );
            assert_eq!(
                detail(&e, "reason"),
                Some("invalid certificate: NotValidForName"),
                "{host}"
            );
        }
    });
}

#[test]
fn plain_http_server_on_an_https_url_is_tls_failure() {
    let up = Upstream::start(upstream::fixed(upstream::response(400, &[], b"plain")));
    run(async {
        let egress = egress(None);
        let e = expect_code(
            egress
                .execute(&request(Method::Get, &up.https_url("127.0.0.1", "/")))
                .await,
            ErrorCode::UpstreamTlsFailure,
        );
        assert!(detail(&e, "reason").is_some());
    });
}

#[test]
fn silent_server_hits_the_connect_limit_during_the_handshake() {
    // Accepts and never answers the ClientHello.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let _keep = std::thread::spawn(move || listener.accept());
    run(async {
        let egress = egress(None);
        let mut req = request(Method::Get, &format!("https://127.0.0.1:{port}/"));
        req.timeouts.connect = Duration::from_millis(200);
        let e = expect_code(
            egress.execute(&req).await,
            ErrorCode::UpstreamConnectTimeout,
        );
        assert_eq!(e.timeout_type, Some(TimeoutType::Connect));
        assert_eq!(detail(&e, "stage"), Some("tls_handshake"));
    });
}

#[test]
fn test_ca_is_unknown_without_the_ca_file() {
    let ca = TestCa::new();
    let up = tls_upstream(upstream::echo(), ca.localhost_config());
    run(async {
        // Without the CA file the test CA is unknown.
        let e = expect_code(
            egress(None)
                .execute(&request(Method::Get, &up.https_url("localhost", "/")))
                .await,
            ErrorCode::UpstreamTlsFailure,
        );
        assert_eq!(
            detail(&e, "reason"),
            Some("invalid certificate: UnknownIssuer")
        );
    });
}

#[test]
fn replayable_request_is_retried_after_a_stale_tls_connection() {
    let ca = TestCa::new();
    let up = tls_upstream(upstream::drop_later_requests(), ca.localhost_config());
    run(async {
        let egress = egress(Some(ca.ca_file()));
        let mut req = request(Method::Get, &up.https_url("localhost", "/"));
        req.is_replayable = true;
        egress.execute(&req).await.expect("first response");
        let resp = egress.execute(&req).await.expect("retried response");
        assert!(!resp.is_connection_reused);
        assert_eq!(up.connections(), 2);
        req.is_replayable = false;
        let e = expect_code(egress.execute(&req).await, ErrorCode::UpstreamReset);
        assert_eq!(detail(&e, "stage"), Some("response_header"));
    });
}
