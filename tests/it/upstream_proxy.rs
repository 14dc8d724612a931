//! Black-box tests of pools behind an upstream proxy: a real `sortie serve` routes request API
//! calls, absolute-form proxy requests and CONNECT tunnels through a real squid on loopback,
//! with the username rendered from the provider session and the password from the gateway's
//! environment (`password_env`). The username is read from squid's access log.

use crate::support;

use std::io::{Read, Write};
use std::process::Command;

use serde_json::{json, Value};
use support::gateway::{admin, request_api, Gateway, DEPLOYMENT_TOKEN};
use support::proxies::{free_port, wait_for_log, Squid};
use support::proxy::{open_tunnel_with, session};
use support::tls::TestCa;
use support::upstream::{self, Options, Upstream};

const PASSWORD_VAR: &str = "SORTIE_TEST_UPSTREAM_PROXY_PASSWORD";

fn snapshot(proxy: Value) -> String {
    json!({
        "routing": {"rules": [{
            "id": "via-proxy", "priority": 1, "pools": ["acme"],
            "sticky_session_ttl_seconds": 600, "allow_sticky_fallback": true
        }]},
        "pools": [{"id": "acme", "upstream_proxy": proxy}],
        "destinations": {"allow": ["127.0.0.0/8"], "deny": []}
    })
    .to_string()
}

fn workers(country: &str) -> String {
    format!("[[workers]]\nid = \"w\"\ncountry = \"{country}\"\npools = [\"acme\"]\n")
}

/// An echo upstream speaking TLS with the test CA's `localhost` certificate.
fn secure_echo(ca: &TestCa) -> Upstream {
    Upstream::start_with(
        upstream::echo(),
        Options {
            tls: Some(ca.localhost_config()),
            ..Options::default()
        },
    )
}

#[test]
fn the_request_api_goes_through_squid_with_the_session_username() {
    let sess = session("US", "cart-42");
    let user = format!("c-US-{sess}");
    let squid = Squid::start(&[(&user, "from-env"), ("c--", "from-env")]);
    let up = Upstream::start(upstream::echo());
    let snap = snapshot(json!({
        "id": "acme", "url": squid.url(),
        "username_template": "c-{country}-{session}", "password_env": PASSWORD_VAR
    }));
    let gw = Gateway::builder()
        .snapshot(Some(&snap))
        .workers(&workers("US"))
        .env(PASSWORD_VAR, "from-env")
        // One core, one connection pool: the reuse below is deterministic.
        .cores(1)
        .start();
    let sticky = json!({"method": "GET", "url": up.url("/a"),
                        "routing": {"country": "US", "sticky_session_id": "cart-42"}});
    for _ in 0..2 {
        let r = request_api(&gw, &sticky);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["status"], 200, "{}", r.text());
    }
    // Without a sticky id there is no provider session: `{session}` renders empty.
    let plain = json!({"method": "GET", "url": up.url("/b")});
    let r = request_api(&gw, &plain);
    assert_eq!(r.json()["status"], 200, "{}", r.text());
    // One pooled tunnel per username: the sticky session's was reused.
    assert_eq!(up.connections(), 2);
    drop(gw);
    wait_for_log(&squid.access_log(), "two CONNECT lines", |t| {
        t.matches(" CONNECT ").count() == 2
    });
    let mut users: Vec<String> = squid.connects().into_iter().map(|(u, _)| u).collect();
    users.sort();
    let mut want = vec![user.clone(), "c--".to_string()];
    want.sort();
    assert_eq!(users, want);
}

#[test]
fn proxy_failures_are_upstream_proxy_failure_and_show_in_metrics() {
    let squid = Squid::start(&[("u", "right")]);
    let up = Upstream::start(upstream::echo());
    let dead = format!("http://127.0.0.1:{}", free_port());
    let snap = json!({
        "routing": {"rules": [
            {"id": "wrong", "priority": 1, "pools": ["wrong"], "constraints": {"region": "wrong"}},
            {"id": "dead", "priority": 2, "pools": ["dead"], "constraints": {"region": "dead"}},
            {"id": "unset", "priority": 3, "pools": ["unset"], "constraints": {"region": "unset"}}
        ]},
        "pools": [
            {"id": "wrong", "upstream_proxy": {"id": "sq", "url": squid.url(),
                "username_template": "u", "password": "wrong"}},
            {"id": "dead", "upstream_proxy": {"id": "dead", "url": dead}},
            {"id": "unset", "upstream_proxy": {"id": "sq", "url": squid.url(),
                "username_template": "u", "password_env": "SORTIE_TEST_UNSET_VARIABLE"}}
        ],
        "destinations": {"allow": ["127.0.0.0/8"], "deny": []}
    })
    .to_string();
    let gw = Gateway::builder()
        .snapshot(Some(&snap))
        .workers(
            "[[workers]]\nid = \"w1\"\nregion = \"wrong\"\npools = [\"wrong\"]\n\
             [[workers]]\nid = \"w2\"\nregion = \"dead\"\npools = [\"dead\"]\n\
             [[workers]]\nid = \"w3\"\nregion = \"unset\"\npools = [\"unset\"]\n",
        )
        .start();
    let call = |region: &str| {
        let env = json!({"method": "GET", "url": up.url("/"), "routing": {"region": region}});
        let r = request_api(&gw, &env);
        assert_eq!(r.status, 502, "{}", r.text());
        let v = r.json();
        assert_eq!(v["code"], "upstream_proxy_failure", "{v}");
        assert_eq!(v["retryable"], true, "{v}");
        v
    };
    let v = call("wrong");
    assert_eq!(v["upstream_status"], 407, "{v}");
    assert_eq!(v["details"]["fact"], "proxy_auth", "{v}");
    assert!(!v.to_string().contains("wrong\""), "no password in {v}");
    // Five failures in a row eject the endpoint (decision 071); with no other endpoint left
    // it is still tried, and still fails.
    for _ in 0..6 {
        let v = call("dead");
        assert_eq!(v["details"]["fact"], "proxy_connect", "{v}");
        assert!(v.get("upstream_status").is_none(), "{v}");
    }
    let v = call("unset");
    assert_eq!(v["details"]["fact"], "proxy_credentials", "{v}");
    assert_eq!(up.connections(), 0);
    let metrics = admin(&gw, "GET", "/metrics", &[], b"").text();
    let label = format!("{{proxy=\"dead\",endpoint=\"{dead}\"}}");
    for line in [
        format!("sortie_upstream_proxy_failures_total{label} 6"),
        format!("sortie_upstream_proxy_ejections_total{label} 1"),
        format!("sortie_upstream_proxy_ejected{label} 1"),
        "# TYPE sortie_upstream_proxy_ejections_total counter".to_string(),
    ] {
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }
    // The squid endpoint answered (a 407 is an answer): never counted against it.
    assert!(metrics.contains(&format!(
        "sortie_upstream_proxy_failures_total{{proxy=\"sq\",endpoint=\"{}\"}} 0",
        squid.url()
    )));
}

#[test]
fn the_forward_proxy_uses_squid_for_absolute_form_and_connect() {
    let squid = Squid::start(&[("fp-DE", "pw")]);
    let up = Upstream::start(upstream::echo());
    let ca = TestCa::new();
    let secure = secure_echo(&ca);
    let snap = snapshot(json!({
        "id": "acme", "url": squid.url(), "username_template": "fp-{country}", "password": "pw"
    }));
    let gw = Gateway::builder()
        .snapshot(Some(&snap))
        .workers(&workers("DE"))
        .start();
    let proxy = format!("http://{}", gw.proxy.expect("proxy listener"));
    let user = format!("dep_test:{DEPLOYMENT_TOKEN}");
    let cacert = ca.ca_file().display().to_string();
    let (plain_url, secure_url) = (up.url("/abs"), secure.https_url("localhost", "/tunnel"));
    for url in [plain_url.as_str(), secure_url.as_str()] {
        let out = Command::new("curl")
            .args(["-s", "-S", "-i", "--max-time", "30", "-x", &proxy])
            .args(["--proxy-user", &user])
            .args(["--proxy-header", "X-Service-Route-Country: DE"])
            .args(["--cacert", &cacert, url])
            .output()
            .expect("curl must be installed (scripts/ci-deps.sh installs it)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{url}: {text}");
        assert!(text.contains("HTTP/1.1 200"), "{url}: {text}");
    }
    drop(gw);
    wait_for_log(&squid.access_log(), "two CONNECT lines", |t| {
        t.matches(" CONNECT ").count() == 2
    });
    let connects = squid.connects();
    assert!(
        connects.len() == 2 && connects.iter().all(|(u, _)| u == "fp-DE"),
        "{connects:?}"
    );
}

/// A gateway whose pool goes through squid speaking TLS (`https://`, user `tls-DE`), both
/// trusting the returned test CA.
fn behind_tls_squid() -> (TestCa, Squid, Gateway) {
    let ca = TestCa::new();
    let (cert, key) = ca.leaf_pem(&["localhost", "127.0.0.1"]);
    let squid = Squid::start_tls(&[("tls-DE", "pw")], &cert, &key);
    let snap = snapshot(json!({
        "id": "acme", "url": format!("https://localhost:{}", squid.port()),
        "username_template": "tls-{country}", "password": "pw"
    }));
    let gw = Gateway::builder()
        .snapshot(Some(&snap))
        .workers(&format!(
            "{}[egress]\nca_file = {:?}\n",
            workers("DE"),
            ca.ca_file().display().to_string()
        ))
        .start();
    (ca, squid, gw)
}

#[test]
fn connect_tunnels_go_through_an_https_upstream_proxy() {
    // The tunnel's bytes travel inside TLS to the proxy: curl's TLS to the destination inside
    // the gateway's TLS to squid, and a plain HTTP exchange forced through CONNECT (`-p`).
    let (ca, squid, gw) = behind_tls_squid();
    let up = Upstream::start(upstream::echo());
    let secure = secure_echo(&ca);
    let proxy = format!("http://{}", gw.proxy.expect("proxy listener"));
    let user = format!("dep_test:{DEPLOYMENT_TOKEN}");
    let cacert = ca.ca_file().display().to_string();
    let cases = [
        (
            secure.https_url("localhost", "/tls-in-tls"),
            false,
            "GET /tls-in-tls",
        ),
        (up.url("/plain-tunnel"), true, "GET /plain-tunnel"),
    ];
    for (url, force_tunnel, echoed) in &cases {
        let mut cmd = Command::new("curl");
        cmd.args(["-s", "-S", "-i", "--max-time", "30", "-x", &proxy])
            .args(["--proxy-user", &user])
            .args(["--proxy-header", "X-Service-Route-Country: DE"])
            .args(["--cacert", &cacert]);
        if *force_tunnel {
            cmd.arg("-p");
        }
        let out = cmd
            .arg(url)
            .output()
            .expect("curl must be installed (scripts/ci-deps.sh installs it)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{url}: {text}");
        // The tunnel's 200, then the destination's own answer echoing the request.
        assert!(text.contains("HTTP/1.1 200"), "{url}: {text}");
        assert!(text.contains(echoed), "{url}: {text}");
    }
    // A 256 KiB upload and its echo: many TLS records each way through the proxy's session.
    let body = vec![b'x'; 256 * 1024];
    let file = std::env::temp_dir().join(format!("sortie-tls-tunnel-{}", std::process::id()));
    std::fs::write(&file, &body).expect("body file");
    let out = Command::new("curl")
        .args(["-s", "-S", "--max-time", "30", "-p", "-x", &proxy])
        .args(["--proxy-user", &user])
        .args(["--proxy-header", "X-Service-Route-Country: DE"])
        .args(["--data-binary", &format!("@{}", file.display())])
        .arg(up.url("/upload"))
        .output()
        .expect("curl");
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let echoed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        echoed.starts_with("POST /upload HTTP/1.1\r\n"),
        "{}",
        &echoed[..echoed.len().min(200)]
    );
    assert!(
        echoed.ends_with(&"x".repeat(1024)),
        "the body came back whole"
    );
    assert!(out.stdout.len() > body.len(), "{} bytes", out.stdout.len());
    drop(gw);
    wait_for_log(&squid.access_log(), "three CONNECT lines", |t| {
        t.matches(" CONNECT ").count() == 3
    });
    assert!(
        squid.connects().iter().all(|(u, _)| u == "tls-DE"),
        "{:?}",
        squid.connects()
    );
}

#[test]
fn a_tunnel_through_an_https_proxy_ends_when_the_destination_closes() {
    // A raw destination with no framing: it answers "ping" with 256 KiB and closes, so the
    // download ends only at the end of the stream, which reaches the gateway as the end of
    // the TLS session with squid.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = listener.local_addr().expect("addr").port();
    let payload = upstream::pattern(256 * 1024);
    let sent = payload.clone();
    let destination = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut ping = [0u8; 4];
        s.read_exact(&mut ping).expect("ping");
        assert_eq!(&ping, b"ping");
        s.write_all(&sent).expect("payload");
    });
    // The CA and squid live as long as the test.
    let (_ca, _squid, gw) = behind_tls_squid();
    let (mut s, status) = open_tunnel_with(&gw, port, &[("X-Service-Route-Country", "DE")]);
    assert_eq!(status, "HTTP/1.1 200 OK");
    s.write_all(b"ping").expect("ping");
    let mut got = Vec::new();
    s.read_to_end(&mut got).expect("the tunnel's end");
    destination.join().expect("destination");
    assert_eq!(got.len(), payload.len());
    assert!(got == payload, "the bytes differ");
}

#[test]
fn a_destination_that_speaks_first_reaches_the_client_through_the_proxy() {
    // A scripted HTTP proxy whose reply to CONNECT and the destination's greeting arrive in
    // one write, as they may from a real proxy when the destination speaks first (SSH, SMTP):
    // the greeting is the tunnel's first bytes, not a protocol error.
    let proxy = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let proxy_port = proxy.local_addr().expect("addr").port();
    let scripted = std::thread::spawn(move || {
        let (mut s, _) = proxy.accept().expect("accept");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if s.read(&mut byte).expect("CONNECT head") == 0 {
                break;
            }
            head.push(byte[0]);
        }
        s.write_all(b"HTTP/1.1 200 Connection established\r\n\r\nSSH-2.0-scripted\r\n")
            .expect("reply and greeting");
        // Then an echo of what the client says, until it is done.
        let mut r = s.try_clone().expect("clone");
        let _ = std::io::copy(&mut r, &mut s);
        String::from_utf8_lossy(&head).into_owned()
    });
    let snap = snapshot(json!({
        "id": "acme", "url": format!("http://127.0.0.1:{proxy_port}"),
        "username_template": "u", "password": "pw"
    }));
    let gw = Gateway::builder()
        .snapshot(Some(&snap))
        .workers(&workers("DE"))
        .start();
    let (mut s, status) = open_tunnel_with(&gw, 2222, &[]);
    assert_eq!(status, "HTTP/1.1 200 OK");
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).expect("the greeting");
    assert_eq!(&greeting, b"SSH-2.0-scripted\r\n");
    s.write_all(b"client\n").expect("write");
    let mut echoed = [0u8; 7];
    s.read_exact(&mut echoed).expect("the echo");
    assert_eq!(&echoed, b"client\n");
    drop(s);
    let head = scripted.join().expect("proxy");
    assert!(
        head.starts_with("CONNECT 127.0.0.1:2222 HTTP/1.1\r\n"),
        "{head}"
    );
}
