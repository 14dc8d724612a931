//! Remote workers beyond plain request API calls, as real processes on loopback: pools behind a
//! real squid (the rendered username in squid's access log, the password from the worker's own
//! environment), and the forward proxy's absolute-form requests and CONNECT tunnels relayed
//! through remote workers (decisions 063–065).

use crate::support;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use support::bus::{
    control, counting_listener, request_at, start_worker, start_worker_env, wait_worker,
};
use support::gateway::{admin, admin_items, cancel_the_only_request, unb64, wait_until, Gateway};
use support::proxies::{wait_for_log, Squid};
use support::proxy::{
    curl_as_test, curl_command, curl_ok, curl_response, dechunk, find, open_tunnel_with,
    proxy_user, session, CURL_MISSING,
};
use support::receipts::{receipt_state, receipts_call, sha256_hex, verified_receipt};
use support::tls::TestCa;
use support::upstream::{self, Options, Upstream};

const PASSWORD_VAR: &str = "SORTIE_TEST_BUS_PROXY_PASSWORD";
const PASSWORD: &str = "worker-only-secret";
/// The routing header that picks a worker by tag.
const ROUTE_TAGS: &str = "X-Service-Route-Tags";

/// A pool behind squid: the control renders the username, the worker resolves `password_env`
/// from its own environment (the control's has no such variable), squid authenticates the
/// worker's CONNECT, and the rollout lists the worker as applied.
#[test]
fn a_remote_worker_egresses_through_its_pools_upstream_proxy() {
    let sess = session("US", "cart-7");
    let user = format!("bus-US-{sess}");
    let squid = Squid::start(&[(&user, PASSWORD), ("bus--", PASSWORD)]);
    let up = Upstream::start(upstream::echo());
    let snap = json!({
        "routing": {"rules": [{
            "id": "via-proxy", "priority": 1, "pools": ["acme"],
            "sticky_session_ttl_seconds": 600, "allow_sticky_fallback": true
        }]},
        "pools": [{"id": "acme", "upstream_proxy": {
            "id": "acme", "url": squid.url(),
            "username_template": "bus-{country}-{session}", "password_env": PASSWORD_VAR
        }}],
        "destinations": {"allow": ["127.0.0.0/8"], "deny": []}
    })
    .to_string();
    let gw = control("127.0.0.1:0", None).snapshot(Some(&snap)).start();
    let bus = gw.bus.expect("bus listener");
    let worker = start_worker_env(
        "wp",
        bus,
        None,
        "country = \"US\"\npools = [\"acme\"]\nbind_address = \"127.0.0.2\"",
        &[(PASSWORD_VAR, PASSWORD)],
    );
    wait_worker(&gw, "wp", "connected");
    wait_until(Duration::from_secs(10), "rollout applied", || {
        let r = admin(&gw, "GET", "/api/v1/admin/rollouts", &[], b"").json();
        r["entries"]
            .as_array()
            .is_some_and(|e| e.len() == 1 && e[0]["status"] == "applied")
    });

    let sticky = json!({"method": "GET", "url": up.url("/sticky"),
                        "routing": {"country": "US", "sticky_session_id": "cart-7"}});
    let r = request_at(gw.api, &sticky);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["status"], 200, "{}", r.text());
    // Without a sticky id there is no provider session: `{session}` renders empty.
    let plain = json!({"method": "GET", "url": up.url("/plain")});
    let r = request_at(gw.api, &plain);
    assert_eq!(r.json()["status"], 200, "{}", r.text());

    // The forward proxy through the same pool: an absolute-form request and a CONNECT tunnel
    // (curl -p) leave through squid too, without hints (the username renders as `bus--`).
    for args in [
        vec![up.url("/fp")],
        vec!["-p".to_string(), up.url("/tunnel")],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = curl_ok(&gw, &args);
        assert!(r.text().contains("GET /"), "{}", r.text());
    }
    // Squid logs a CONNECT when its tunnel closes: stop the worker, whose pool holds them.
    let worker_out = worker.output().join("\n");
    let mut worker = worker;
    worker.kill9();
    // Three tunnels: the sticky session's, the one the unhinted API request opened and the
    // absolute-form request reused (same destination and username, one worker core), and the
    // client's CONNECT tunnel.
    wait_for_log(&squid.access_log(), "three CONNECT lines", |t| {
        t.matches(" CONNECT ").count() == 3
    });
    let mut users: Vec<String> = squid.connects().into_iter().map(|(u, _)| u).collect();
    users.sort();
    let mut want = vec![user.clone(), "bus--".into(), "bus--".into()];
    want.sort();
    assert_eq!(users, want);
    // The tunnel left from the worker's bind address: squid logs its client.
    let log = std::fs::read_to_string(squid.access_log()).unwrap_or_default();
    assert!(
        log.lines()
            .filter(|l| l.contains(" CONNECT "))
            .all(|l| l.split_whitespace().nth(2) == Some("127.0.0.2")),
        "{log}"
    );
    // Neither process ever printed the password or the rendered username.
    let control_out: Vec<String> = gw.stdout.try_iter().collect();
    for text in [worker_out, control_out.join("\n")] {
        assert!(!text.contains(PASSWORD), "password in output: {text}");
        assert!(!text.contains(&sess), "username in output: {text}");
    }
}

/// A remote worker tunnels a CONNECT through an `https://` upstream proxy: the tunnel's bytes
/// travel inside the worker's TLS session with squid, trusted through the worker's CA file.
#[test]
fn a_remote_worker_tunnels_through_an_https_upstream_proxy() {
    let ca = TestCa::new();
    let (cert, key) = ca.leaf_pem(&["localhost", "127.0.0.1"]);
    let squid = Squid::start_tls(&[("tls-u", PASSWORD)], &cert, &key);
    let up = Upstream::start(upstream::echo());
    let snap = json!({
        "routing": {"rules": [{"id": "r", "priority": 1, "pools": ["acme"]}]},
        "pools": [{"id": "acme", "upstream_proxy": {
            "id": "acme", "url": format!("https://localhost:{}", squid.port()),
            "username_template": "tls-u", "password_env": PASSWORD_VAR
        }}],
        "destinations": {"allow": ["127.0.0.0/8"], "deny": []}
    })
    .to_string();
    let gw = control("127.0.0.1:0", None).snapshot(Some(&snap)).start();
    let worker = start_worker_env(
        "wt",
        gw.bus.expect("bus listener"),
        None,
        &format!(
            "pools = [\"acme\"]\n[egress]\nca_file = {:?}",
            ca.ca_file().display().to_string()
        ),
        &[(PASSWORD_VAR, PASSWORD)],
    );
    wait_worker(&gw, "wt", "connected");
    let r = curl_ok(&gw, &["-p", &up.url("/through-tls")]);
    assert!(r.text().contains("GET /through-tls"), "{}", r.text());
    let mut worker = worker;
    worker.kill9();
    wait_for_log(&squid.access_log(), "one CONNECT line", |t| {
        t.matches(" CONNECT ").count() == 1
    });
    assert!(squid.connects().iter().all(|(u, _)| u == "tls-u"));
}

/// A worker whose environment lacks the password answers the request with the proxy's
/// credentials failure, not from its own address.
#[test]
fn a_remote_worker_without_the_password_variable_fails_with_proxy_credentials() {
    let squid = Squid::start(&[("u", PASSWORD)]);
    let up = Upstream::start(upstream::echo());
    let snap = json!({
        "routing": {"rules": [{"id": "r", "priority": 1, "pools": ["acme"]}]},
        "pools": [{"id": "acme", "upstream_proxy": {
            "id": "acme", "url": squid.url(),
            "username_template": "u", "password_env": PASSWORD_VAR
        }}],
        "destinations": {"allow": ["127.0.0.0/8"], "deny": []}
    })
    .to_string();
    let gw = control("127.0.0.1:0", None)
        .snapshot(Some(&snap))
        // Only the control has it: the worker must not be given it over the bus.
        .env(PASSWORD_VAR, PASSWORD)
        .start();
    let _w = start_worker("wn", gw.bus.unwrap(), None, "pools = [\"acme\"]");
    wait_worker(&gw, "wn", "connected");
    let r = request_at(gw.api, &json!({"method": "GET", "url": up.url("/x")}));
    assert_eq!(r.status, 502, "{}", r.text());
    let j = r.json();
    assert_eq!(j["code"], "upstream_proxy_failure", "{j}");
    assert_eq!(j["details"]["fact"], "proxy_credentials", "{j}");
    assert_eq!(up.connections(), 0);
}

/// A control with two remote workers sending from distinct loopback addresses, told apart by
/// tag.
fn control_and_two_workers(
    proxy_section: &str,
) -> (Gateway, support::bus::Worker, support::bus::Worker) {
    let gw = control("127.0.0.1:0", None).section(proxy_section).start();
    let bus = gw.bus.expect("bus listener");
    let two = start_worker(
        "w-two",
        bus,
        None,
        "tags = [\"two\"]\nbind_address = \"127.0.0.2\"",
    );
    let three = start_worker(
        "w-three",
        bus,
        None,
        "tags = [\"three\"]\nbind_address = \"127.0.0.3\"",
    );
    wait_worker(&gw, "w-two", "connected");
    wait_worker(&gw, "w-three", "connected");
    (gw, two, three)
}

/// The worker's `Accept` only marks a stream accepted; the request's task waits for the head.
/// A worker that accepted within `control.bus.assignment_timeout_ms` (300 ms here) and whose
/// destination answers after it (1 s) is waited for, through the request API and the forward
/// proxy alike; a worker that never accepts is an `assignment_timeout` (the `bus` tests).
#[test]
fn a_head_after_the_assignment_timeout_is_waited_for_once_accepted() {
    let gw = Gateway::builder()
        .control_mode()
        .control("bus_listen = \"127.0.0.1:0\"")
        .section(&format!(
            "[control.bus]\ntoken = \"{}\"\nplaintext = true\nheartbeat_ms = 500\n\
             assignment_timeout_ms = 300\n",
            support::bus::WORKER_TOKEN
        ))
        .start();
    let _w = start_worker("wa", gw.bus.expect("bus listener"), None, "");
    wait_worker(&gw, "wa", "connected");
    let slow = Upstream::start(upstream::slow_head(Duration::from_secs(1)));
    let started = Instant::now();
    let r = request_at(gw.api, &json!({"method": "GET", "url": slow.url("/api")}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["status"], 200, "{}", r.text());
    assert!(started.elapsed() >= Duration::from_secs(1));
    let r = curl_ok(&gw, &[&slow.url("/proxied")]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(slow.requests(), 2, "one upstream request each");
}

/// `curl -x`: absolute-form requests (small, and large bodies both ways in both framings) and
/// HTTPS through CONNECT with the test CA, each relayed by the remote worker its routing
/// header chose, as the upstream's view of the peer shows.
#[test]
fn curl_through_the_control_to_remote_workers() {
    let up = Upstream::start(upstream::echo());
    let (gw, _two, _three) = control_and_two_workers("");
    for (tag, ip) in [("two", "127.0.0.2"), ("three", "127.0.0.3")] {
        let route = format!("X-Service-Route-Tags: {tag}");
        let r = curl_ok(&gw, &["--proxy-header", &route, &up.url("/plain")]);
        let text = String::from_utf8_lossy(&r.body).into_owned();
        assert!(text.starts_with("GET /plain HTTP/1.1"), "{text}");
        let peer = r.header("X-Peer").unwrap_or_default();
        assert!(peer.starts_with(&format!("{ip}:")), "{peer}");
        assert!(!text.contains("X-Service-Route"), "{text}");
        assert!(!text.contains("Proxy-Authorization"), "{text}");
    }

    // The destination's head reaches the client as a local worker's would: its own fields in
    // order, its `Date` the only one, hop-by-hop fields (listed in `Connection` or not) and
    // the framing the worker removed left out.
    let fields = Upstream::start(upstream::fixed(
        b"HTTP/1.1 200 OK\r\nX-First: 1\r\nConnection: X-Secret\r\nX-Secret: s\r\n\
          Keep-Alive: timeout=5\r\nDate: Tue, 01 Jan 2030 00:00:00 GMT\r\nX-Last: 2\r\n\
          Content-Length: 2\r\n\r\nok"
            .to_vec(),
    ));
    for tag in ["two", "three"] {
        let route = format!("X-Service-Route-Tags: {tag}");
        let r = curl_ok(&gw, &["--proxy-header", &route, &fields.url("/fields")]);
        assert_eq!(r.body, b"ok");
        let names: Vec<&str> = r.headers.iter().map(|(n, _)| n.as_str()).collect();
        let date: Vec<&str> = r
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("date"))
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(date, ["Tue, 01 Jan 2030 00:00:00 GMT"], "{names:?}");
        let first = names.iter().position(|n| *n == "X-First");
        let last = names.iter().position(|n| *n == "X-Last");
        assert!(first.is_some() && first < last, "{names:?}");
        for gone in ["X-Secret", "Keep-Alive"] {
            assert!(!names.contains(&gone), "{gone} relayed: {names:?}");
        }
        assert_eq!(r.header("Content-Length"), Some("2"), "{names:?}");
    }

    // Large bodies both ways, past every flow-control window: the body is streamed to the
    // worker as the client sends it and the echo streamed back.
    let dir = support::gateway::temp_dir("bus-proxy-body");
    let file = dir.join("body.bin");
    let body = upstream::pattern(3 * 1024 * 1024 + 7);
    std::fs::write(&file, &body).unwrap();
    let data = format!("@{}", file.display());
    let url = up.url("/upload");
    for framing in [None, Some("Transfer-Encoding: chunked")] {
        let mut args = vec![
            "--proxy-header",
            "X-Service-Route-Tags: three",
            "--data-binary",
            &data,
        ];
        if let Some(h) = framing {
            args.extend(["-H", h]);
        }
        args.push(&url);
        let out = curl_as_test(&gw, &args);
        let r = curl_response(&out);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&out.stderr));
        let end = find(&r.body, b"\r\n\r\n").expect("echoed head") + 4;
        let peer = r.header("X-Peer").unwrap_or_default();
        assert!(peer.starts_with("127.0.0.3:"), "{peer}");
        let sent = match framing {
            None => r.body[end..].to_vec(),
            Some(_) => dechunk(&r.body[end..]),
        };
        assert_eq!(sent.len(), body.len(), "{framing:?}");
        assert!(sent == body, "{framing:?}: body differs");
    }

    // HTTPS through a CONNECT tunnel on a remote worker.
    let ca = TestCa::new();
    let tls_up = Upstream::start_with(
        upstream::echo(),
        Options {
            tls: Some(ca.localhost_config()),
            ..Options::default()
        },
    );
    let cacert = ca.ca_file().display().to_string();
    for (tag, ip) in [("two", "127.0.0.2"), ("three", "127.0.0.3")] {
        let route = format!("X-Service-Route-Tags: {tag}");
        let out = curl_as_test(
            &gw,
            &[
                "--proxy-header",
                &route,
                "--cacert",
                &cacert,
                &tls_up.https_url("localhost", "/secure"),
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
        assert!(text.contains(&format!("X-Peer: {ip}:")), "{text}");
    }
    // A header name beyond the bus's bound is the client's error, named as such and found
    // before any worker is asked (decision 067).
    let served = up.requests();
    let long = format!("X-{}: v", "n".repeat(300));
    let out = curl_as_test(&gw, &["-H", &long, &up.url("/long-name")]);
    let r = curl_response(&out);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["code"], "invalid_request", "{}", r.text());
    assert!(r.text().contains("limit of 256 bytes"), "{}", r.text());
    assert_eq!(up.requests(), served, "the destination was not reached");

    wait_until(Duration::from_secs(10), "tunnels counted", || {
        admin(&gw, "GET", "/metrics", &[], b"")
            .text()
            .contains("sortie_tunnels_total 2")
    });
    let metrics = admin(&gw, "GET", "/metrics", &[], b"").text();
    assert!(
        metrics.contains(
            "sortie_requests_total{deployment=\"dep_test\",outcome=\"ok\",ingress=\"connect\"} 2"
        ),
        "{metrics}"
    );
}

/// The worker is the authority on its own capacity (decision 067): a worker serving two
/// controls, full with one's requests, refuses the other's forward-proxy assignments, and that
/// control routes the absolute-form request (its body whole) and the CONNECT tunnel to the next
/// eligible worker, remote or local; it answers `executor_capacity_exhausted` only when no
/// candidate is left. The busy worker's own load shows in that control's `/metrics` (decision
/// 069).
#[test]
fn a_refused_proxy_assignment_goes_to_the_next_eligible_worker() {
    // a: a gateway with a local worker `wl` (tag `l`) whose bus the remote `wa` (tags `r`
    // and `l`, serving b too) and `wb` (tag `r`) join.
    let a = support::bus::serve_with_bus()
        .workers(
            "[[workers]]\nid = \"wl\"\ncapacity = 1\ntags = [\"l\"]\n\
             bind_address = \"127.0.0.4\"\n",
        )
        .start();
    let b = control("127.0.0.1:0", None).start();
    let dir = support::gateway::temp_dir("bus-proxy-refused");
    let config = dir.join("worker.toml");
    std::fs::write(
        &config,
        format!(
            "[worker]\nid = \"wa\"\ncontrols = [\"{}\", \"{}\"]\ntoken = \"{}\"\n\
             plaintext = true\ncores = 1\ncapacity = 2\ntags = [\"shared\", \"r\", \"l\"]\n\
             bind_address = \"127.0.0.2\"\n",
            a.bus.unwrap(),
            b.bus.unwrap(),
            support::bus::WORKER_TOKEN
        ),
    )
    .unwrap();
    let _wa = support::bus::spawn_worker("wa", config);
    let _wb = start_worker(
        "wb",
        a.bus.unwrap(),
        None,
        "capacity = 1\ntags = [\"r\"]\nbind_address = \"127.0.0.3\"",
    );
    wait_worker(&a, "wa", "connected");
    wait_worker(&a, "wb", "connected");
    wait_worker(&b, "wa", "connected");

    // wa's two places go to b's requests, held by a slow destination.
    let slow = Upstream::start(upstream::slow_head(Duration::from_secs(15)));
    let held: Vec<_> = (0..2)
        .map(|i| {
            let (api, url) = (b.api, slow.url(&format!("/held-{i}")));
            std::thread::spawn(move || request_at(api, &json!({"method": "GET", "url": url})))
        })
        .collect();
    wait_until(Duration::from_secs(10), "wa full with b's requests", || {
        wait_worker(&b, "wa", "connected")["capacity"]["active"] == 2
    });
    assert_eq!(wait_worker(&a, "wa", "connected")["capacity"]["active"], 0);

    // On a, wa has the most room (2 against 1), is chosen first and refuses: the request goes
    // to the other candidate with its whole body, past the first upload window; with tag `r`
    // that is the remote wb, with tag `l` the local wl. A CONNECT tunnel goes the same way,
    // right after: a client with the whole answer finds the one-place worker free (decision
    // 127).
    let echo = Upstream::start(upstream::echo());
    let body = upstream::pattern(300 * 1024 + 1);
    let file = dir.join("body.bin");
    std::fs::write(&file, &body).unwrap();
    let data = format!("@{}", file.display());
    for (tag, ip) in [("r", "127.0.0.3:"), ("l", "127.0.0.4:")] {
        let route = format!("{ROUTE_TAGS}: {tag}");
        let r = curl_ok(
            &a,
            &[
                "--proxy-header",
                &route,
                "--data-binary",
                &data,
                &echo.url("/refused-first"),
            ],
        );
        let peer = r.header("X-Peer").unwrap_or_default();
        assert!(peer.starts_with(ip), "{tag}: {peer}");
        let end = find(&r.body, b"\r\n\r\n").expect("echoed head") + 4;
        assert!(r.body[end..] == body[..], "{tag}: the body differs");
        let r = curl_ok(
            &a,
            &["--proxy-header", &route, "-p", &echo.url("/tunnelled")],
        );
        let peer = r.header("X-Peer").unwrap_or_default();
        assert!(peer.starts_with(ip), "{tag}: {peer}");
    }

    // Only wa is eligible: its refusal leaves no candidate, for either form.
    let out = curl_as_test(
        &a,
        &[
            "--proxy-header",
            "X-Service-Route-Tags: shared",
            &echo.url("/no-one-left"),
        ],
    );
    let r = curl_response(&out);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        r.json()["code"],
        "executor_capacity_exhausted",
        "{}",
        r.text()
    );
    let (_s, status) = open_tunnel_with(&a, echo.port(), &[(ROUTE_TAGS, "shared")]);
    assert!(status.starts_with("HTTP/1.1 503"), "{status}");
    assert_eq!(echo.requests(), 4, "only the four relayed requests arrived");

    // a counts none of b's requests on wa, but wa's heartbeats report its own load.
    wait_until(Duration::from_secs(10), "wa's reported load", || {
        admin(&a, "GET", "/metrics", &[], b"")
            .text()
            .contains("sortie_worker_reported_active_requests{worker=\"wa\"} 2")
    });
    let metrics = admin(&a, "GET", "/metrics", &[], b"").text();
    assert!(
        metrics.contains("sortie_worker_active_requests{worker=\"wa\"} 0"),
        "{metrics}"
    );
    for t in held {
        let r = t.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    wait_until(Duration::from_secs(10), "wa's load back to 0", || {
        admin(&a, "GET", "/metrics", &[], b"")
            .text()
            .contains("sortie_worker_reported_active_requests{worker=\"wa\"} 0")
    });
}

/// A relayed body through a remote worker runs under the control's forward-proxy idle limit,
/// as a local relay does, not under the worker's `[egress]` one (decision 068): with the
/// control at 4 s and the worker at 1 s, a destination that pauses 2 s mid-body is relayed
/// whole, and one that pauses 8 s is cut after about 4 s.
#[test]
fn relayed_bodies_run_under_the_controls_proxy_idle_limit() {
    let gw = control("127.0.0.1:0", None)
        .section("[control.proxy]\nidle_timeout_ms = 4000")
        .start();
    let _w = start_worker(
        "wi",
        gw.bus.unwrap(),
        None,
        "\n[egress]\nidle_timeout_ms = 1000",
    );
    wait_worker(&gw, "wi", "connected");
    let total = 64 * 1024;
    for (pause, is_whole) in [
        (Duration::from_secs(2), true),
        (Duration::from_secs(8), false),
    ] {
        let up = Upstream::start(upstream::slow_body(total, 16 * 1024, pause));
        let started = Instant::now();
        let out = curl_as_test(&gw, &[&up.url("/paused")]);
        let took = started.elapsed();
        if is_whole {
            assert!(
                out.status.success(),
                "{pause:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let r = curl_response(&out);
            assert!(
                r.body == upstream::pattern(total),
                "{pause:?}: body differs"
            );
        } else {
            // curl: the transfer ended short of its Content-Length.
            assert_eq!(out.status.code(), Some(18), "{pause:?} after {took:?}");
            assert!(
                took >= Duration::from_millis(3500) && took < Duration::from_millis(7500),
                "cut after {took:?}"
            );
        }
    }
}

/// A destination for raw tunnels: each connection reads until the client's end of stream,
/// answers with the byte count and closes (a half-close test), or, when `hold` is set, only
/// records that the connection was closed from the other side.
struct TunnelEnd {
    port: u16,
    accepted: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
}

impl TunnelEnd {
    fn start(answer: bool) -> TunnelEnd {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (accepted, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (a, c) = (accepted.clone(), closed.clone());
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                a.fetch_add(1, Ordering::SeqCst);
                let c = c.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    let mut n = 0usize;
                    loop {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(k) => n += k,
                        }
                    }
                    if answer {
                        let _ = write!(s, "got {n} bytes");
                    }
                    c.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        TunnelEnd {
            port,
            accepted,
            closed,
        }
    }
}

/// Raw tunnels through remote workers: half-close in both directions, the idle limit, an
/// operator's cancel (the worker closes the destination connection) and a worker killed
/// mid-tunnel (the client's connection closes).
#[test]
fn tunnels_half_close_idle_out_cancel_and_die_with_their_worker() {
    let (gw, _two, mut three) =
        control_and_two_workers("[control.proxy]\ntunnel_idle_timeout_ms = 2000");

    // Half-close: the client ends its side; the destination sees the end, answers, closes;
    // the answer and then the end reach the client.
    let answering = TunnelEnd::start(true);
    let (mut s, status) = open_tunnel_with(&gw, answering.port, &[(ROUTE_TAGS, "two")]);
    assert_eq!(status, "HTTP/1.1 200 OK");
    let payload = upstream::pattern(700 * 1024);
    s.write_all(&payload).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut back = Vec::new();
    s.read_to_end(&mut back).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&back),
        format!("got {} bytes", payload.len())
    );
    // The tunnel's bytes are counted when it ends, in both directions.
    let counted = |direction: &str| {
        let text = admin(&gw, "GET", "/metrics", &[], b"").text();
        let prefix = format!("sortie_tunnel_bytes_total{{direction=\"{direction}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    wait_until(Duration::from_secs(5), "the tunnel's bytes counted", || {
        counted("up") == payload.len() as u64 && counted("down") == back.len() as u64
    });

    // Idle: nothing moves, the control closes the tunnel after the limit and the worker closes
    // the destination's connection.
    let holding = TunnelEnd::start(false);
    let (mut s, status) = open_tunnel_with(&gw, holding.port, &[(ROUTE_TAGS, "two")]);
    assert_eq!(status, "HTTP/1.1 200 OK");
    let opened = Instant::now();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    let waited = opened.elapsed();
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_secs(8),
        "closed after {waited:?}"
    );
    wait_until(
        Duration::from_secs(5),
        "destination closed after idle",
        || holding.closed.load(Ordering::SeqCst) == 1,
    );

    // Cancel: listed while open, closed by DELETE; the worker closes the destination side.
    let (mut s, status) = open_tunnel_with(&gw, holding.port, &[(ROUTE_TAGS, "two")]);
    assert_eq!(status, "HTTP/1.1 200 OK");
    wait_until(Duration::from_secs(5), "destination connected", || {
        holding.accepted.load(Ordering::SeqCst) == 2
    });
    let cancelled_at = Instant::now();
    cancel_the_only_request(&gw);
    let _ = s.read_to_end(&mut rest);
    assert!(
        cancelled_at.elapsed() < Duration::from_millis(1500),
        "closed by the cancel"
    );
    wait_until(
        Duration::from_secs(5),
        "destination closed after cancel",
        || holding.closed.load(Ordering::SeqCst) == 2,
    );
    wait_until(Duration::from_secs(5), "the tunnel left the list", || {
        admin_items(&gw, "/api/v1/admin/requests").is_empty()
    });

    // A worker killed mid-tunnel: bytes flowed, then the client's connection closes.
    let echo = Upstream::start(upstream::echo());
    let (mut s, status) = open_tunnel_with(&gw, echo.port(), &[(ROUTE_TAGS, "three")]);
    assert_eq!(status, "HTTP/1.1 200 OK");
    write!(s, "GET /t HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut first = [0u8; 12];
    s.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    let killed = Instant::now();
    three.kill9();
    let _ = s.read_to_end(&mut rest);
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "client closed in time"
    );
    wait_until(Duration::from_secs(5), "the tunnel left the list", || {
        admin_items(&gw, "/api/v1/admin/requests").is_empty()
    });
}

/// Receipt bodies on a remote worker with fs object storage: the worker fetches the request
/// body from the control's signed worker route and streams it to the destination (which sees
/// the worker's address), the receipt is consumed; a response body streams back into a new
/// verified response receipt. No signed URL is ever printed.
#[test]
fn receipt_bodies_on_a_remote_worker() {
    let gw = control("127.0.0.1:0", None)
        .section("[object_storage]\nenabled = true\nbackend = \"fs\"")
        .start();
    let worker = start_worker(
        "wr",
        gw.bus.expect("bus listener"),
        None,
        "bind_address = \"127.0.0.2\"",
    );
    wait_worker(&gw, "wr", "connected");

    let echo = Upstream::start(upstream::echo());
    // Echoed whole in the envelope: under the 1 MiB inline response limit with its head.
    let body = upstream::pattern(700 * 1024 + 5);
    let id = verified_receipt(&gw, &body);
    let r = request_at(
        gw.api,
        &json!({"method": "POST", "url": echo.url("/from-receipt"),
                "body": {"mode": "receipt", "receipt_id": id}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["status"], 200, "{v}");
    let echoed = unb64(&v["body"]["data_base64"]);
    let end = find(&echoed, b"\r\n\r\n").expect("echoed head") + 4;
    let head = String::from_utf8_lossy(&echoed[..end]).into_owned();
    assert!(head.starts_with("POST /from-receipt HTTP/1.1"), "{head}");
    assert!(
        head.contains(&format!("Content-Length: {}", body.len())),
        "{head}"
    );
    assert!(echoed[end..] == body[..], "the receipt body differs");
    let peer = v["headers"]
        .as_array()
        .and_then(|h| h.iter().find(|f| f["name"] == "X-Peer"))
        .and_then(|f| f["value_base64"].as_str())
        .map(|b| {
            use base64::Engine as _;
            let raw = base64::engine::general_purpose::STANDARD
                .decode(b)
                .unwrap_or_default();
            String::from_utf8_lossy(&raw).into_owned()
        })
        .unwrap_or_default();
    assert!(peer.starts_with("127.0.0.2:"), "{v}");
    assert_eq!(receipt_state(&gw, &id), "consumed");
    // A consumed receipt is not sent again.
    let again = request_at(
        gw.api,
        &json!({"method": "POST", "url": echo.url("/again"),
                "body": {"mode": "receipt", "receipt_id": id}}),
    );
    assert_eq!(again.status, 409, "{}", again.text());
    assert_eq!(again.json()["code"], "body_ref_unavailable");

    // A response body into a receipt, past several flow-control windows.
    let want = upstream::pattern(3 * 1024 * 1024 + 3);
    let large = Upstream::start(upstream::large(want.len()));
    let r = request_at(
        gw.api,
        &json!({"method": "GET", "url": large.url("/big"), "response_body_mode": "receipt"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let b = &r.json()["body"];
    assert_eq!(b["mode"], "receipt", "{b}");
    assert_eq!(b["size_bytes"], want.len());
    assert_eq!(b["sha256_hex"], sha256_hex(&want));
    let rid = b["receipt_id"].as_str().expect("id").to_string();
    assert_eq!(receipt_state(&gw, &rid), "verified");
    let got = receipts_call(&gw, "GET", &format!("/api/v1/receipts/{rid}/content"), b"");
    assert!(
        got.status == 200 && got.body == want,
        "downloaded body differs"
    );

    let worker_out = worker.output().join("\n");
    let control_out: Vec<String> = gw.stdout.try_iter().collect();
    for text in [worker_out, control_out.join("\n")] {
        assert!(!text.contains("signature="), "signed URL in output: {text}");
    }
}

/// A relayed download through a remote worker: an operator's cancel cuts it (curl sees the
/// truncated transfer) and the request leaves the active list; a second download is cut the
/// same way when its worker is killed.
#[test]
fn relayed_downloads_end_on_cancel_and_when_their_worker_dies() {
    let up = Upstream::start(upstream::slow_body(
        4 << 20,
        512 << 10,
        Duration::from_secs(25),
    ));
    let (gw, _two, mut three) = control_and_two_workers("");
    let dir = support::gateway::temp_dir("bus-proxy-cut");
    let download = |tag: &str, name: &str| {
        let file = dir.join(name);
        let child = curl_command(&gw)
            .args(["-o", &file.display().to_string()])
            .args(["--proxy-user", &proxy_user()])
            .args(["--proxy-header", &format!("X-Service-Route-Tags: {tag}")])
            .arg(up.url("/stall"))
            .spawn()
            .expect(CURL_MISSING);
        wait_until(Duration::from_secs(10), "the first body bytes", || {
            std::fs::metadata(&file).is_ok_and(|m| m.len() >= 64 << 10)
        });
        child
    };
    let wait_exit = |child: &mut std::process::Child| {
        let mut status = None;
        wait_until(Duration::from_secs(10), "curl to see the cut", || {
            status = child.try_wait().unwrap();
            status.is_some()
        });
        status.unwrap().code()
    };

    let mut child = download("two", "cancelled");
    cancel_the_only_request(&gw);
    // curl reports the truncated transfer (exit 18, partial file).
    assert_eq!(wait_exit(&mut child), Some(18));
    wait_until(Duration::from_secs(5), "the list to empty", || {
        admin_items(&gw, "/api/v1/admin/requests").is_empty()
    });

    let mut child = download("three", "killed");
    three.kill9();
    assert_eq!(wait_exit(&mut child), Some(18));
    wait_until(Duration::from_secs(5), "the list to empty", || {
        admin_items(&gw, "/api/v1/admin/requests").is_empty()
    });
}

/// A remote worker advertises exactly the fingerprint profiles its startup self-test verified
/// (decision 082): a build with feature `fingerprints` verifies every built-in profile and a
/// request naming one is performed by the worker; a build without it advertises none and the
/// control answers `unsupported_fingerprint`.
#[test]
fn a_remote_worker_advertises_the_profiles_its_self_test_verified() {
    let gw = control("127.0.0.1:0", None).start();
    let _w = start_worker("wf", gw.bus.expect("bus listener"), None, "");
    let w = wait_worker(&gw, "wf", "connected");
    let advertised: Vec<&str> = w["fingerprint_profiles"]
        .as_array()
        .expect("fingerprint_profiles")
        .iter()
        .filter_map(|p| p.as_str())
        .collect();
    let up = Upstream::start(upstream::echo());
    let name = sortie_core::fingerprint::BUILTIN_PROFILES
        .first()
        .copied()
        .expect("a built-in profile");
    let r = request_at(
        gw.api,
        &json!({"method": "GET", "url": up.url("/fp"), "fingerprint_profile": name}),
    );
    if cfg!(feature = "fingerprints") {
        let mut all: Vec<&str> = sortie_core::fingerprint::profile::PROFILES
            .iter()
            .filter(|p| p.unsupported.is_none())
            .map(|p| p.name)
            .collect();
        // The worker record lists them sorted by name.
        all.sort_unstable();
        assert_eq!(advertised, all);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["status"], 200, "{}", r.text());
    } else {
        assert!(advertised.is_empty(), "{advertised:?}");
        assert_eq!(r.json()["code"], "unsupported_fingerprint", "{}", r.text());
    }
}

/// A control with fs object storage whose `control.bus.api_base_url` is `base`.
fn control_with_api_base_url(base: &str) -> Gateway {
    Gateway::builder()
        .control_mode()
        .control("bus_listen = \"127.0.0.1:0\"")
        .section(&format!(
            "[control.bus]\ntoken = \"{}\"\nplaintext = true\napi_base_url = \"{base}\"\n",
            support::bus::WORKER_TOKEN
        ))
        .section("[object_storage]\nenabled = true\nbackend = \"fs\"")
        .start()
}

/// Starts worker `id` on `gw`'s bus (over `tls` when given) and sends a request whose body is
/// a new verified receipt of `len` bytes: it must be refused with `body_ref_unavailable`, the
/// message containing `says`, the destination never reached and the receipt `verified` again.
/// Returns the destination and the worker.
fn assert_receipt_refused(
    gw: &Gateway,
    tls: Option<&support::bus::BusTls>,
    id: &str,
    len: usize,
    says: &str,
) -> (Upstream, support::bus::Worker) {
    let w = start_worker(id, gw.bus.expect("bus listener"), tls, "");
    wait_worker(gw, id, "connected");
    let echo = Upstream::start(upstream::echo());
    let receipt = verified_receipt(gw, &upstream::pattern(len));
    let r = request_at(
        gw.api,
        &json!({"method": "POST", "url": echo.url("/x"),
                "body": {"mode": "receipt", "receipt_id": receipt}}),
    );
    assert_eq!(r.json()["code"], "body_ref_unavailable", "{}", r.text());
    assert!(r.text().contains(says), "{}", r.text());
    assert_eq!(echo.connections(), 0);
    assert_eq!(receipt_state(gw, &receipt), "verified");
    (echo, w)
}

/// `control.bus.api_base_url` is where workers fetch receipt bodies: pointed at a closed port,
/// the worker's fetch fails, the request answers `body_ref_unavailable` and the receipt is
/// `verified` again for another attempt.
#[test]
fn the_configured_api_base_url_is_where_workers_fetch_receipts() {
    let gw = control_with_api_base_url("http://127.0.0.1:9");
    assert_receipt_refused(&gw, None, "wu", 64 * 1024, "");
}

/// A worker fetches receipt bodies only from the control it dialled: a receipt URL naming
/// another host (here an `api_base_url` on 127.0.0.9 while the worker dials 127.0.0.1) is
/// `body_ref_unavailable`, and nothing connects to that host.
#[test]
fn a_worker_fetches_receipts_only_from_the_control_it_dialled() {
    let (other, reached) = counting_listener("127.0.0.9:0");
    let gw = control_with_api_base_url(&format!("http://{other}"));
    assert_receipt_refused(&gw, None, "wx", 1024, "does not name the control");
    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "the other host was contacted"
    );
}

/// On a TLS bus without `control.bus.api_base_url` the default receipt URL would be plain
/// HTTP: the signed URL would cross the network in clear, so receipt bodies on remote workers
/// are refused with `body_ref_unavailable`, saying what to set; the receipt stays `verified`.
#[test]
fn a_tls_bus_without_an_api_base_url_refuses_remote_receipt_bodies() {
    let tls = support::bus::BusTls::new(&support::gateway::temp_dir("bus-tls-receipts"));
    let gw = control("127.0.0.1:0", Some(&tls))
        .section("[object_storage]\nenabled = true\nbackend = \"fs\"")
        .start();
    let (echo, _w) = assert_receipt_refused(
        &gw,
        Some(&tls),
        "wt",
        1024,
        "https control.bus.api_base_url",
    );
    // Inline bodies on the same TLS bus are unaffected.
    let r = request_at(
        gw.api,
        &json!({"method": "POST", "url": echo.url("/y"),
                "body": {"mode": "inline_base64", "data_base64": "aGVsbG8="}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

/// A forward-proxy request gives its worker capacity back once the destination's body was read
/// whole, before the body's last bytes go to the client (decision 127): a client that has the
/// whole answer and at once opens a new connection for its next request finds the capacity of a
/// one-place worker free, local or remote, whether the body was spliced (a plain length), copied
/// (chunked) or came with the head.
#[test]
fn a_client_with_the_whole_answer_finds_the_capacity_free() {
    let a = support::bus::serve_with_bus()
        .workers("[[workers]]\nid = \"wl\"\ncapacity = 1\ntags = [\"l\"]\n")
        .start();
    let _wr = start_worker("wr", a.bus.unwrap(), None, "capacity = 1\ntags = [\"r\"]");
    wait_worker(&a, "wr", "connected");
    let len = 256 * 1024;
    let spliced = Upstream::start(upstream::large(len));
    let chunked = Upstream::start(upstream::large_chunked(len));
    let small = Upstream::start(upstream::fixed(upstream::response(200, &[], b"small")));
    let auth = support::proxy::base64_basic(&proxy_user());
    let mut refused = Vec::new();
    for tag in ["l", "r"] {
        for (kind, up) in [
            ("spliced", &spliced),
            ("chunked", &chunked),
            ("small", &small),
        ] {
            for i in 0..40 {
                let mut s = std::net::TcpStream::connect(a.proxy.unwrap()).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
                write!(
                    s,
                    "GET {} HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {auth}\r\n\
                     {ROUTE_TAGS}: {tag}\r\nConnection: close\r\n\r\n",
                    up.url(&format!("/{kind}-{i}"))
                )
                .unwrap();
                let mut out = Vec::new();
                s.read_to_end(&mut out).unwrap();
                if !out.starts_with(b"HTTP/1.1 200") {
                    let head = &out[..find(&out, b"\r\n\r\n").unwrap_or(out.len())];
                    refused.push(format!(
                        "{tag} {kind} {i}: {}",
                        String::from_utf8_lossy(head)
                    ));
                } else if kind != "small" {
                    assert!(out.len() > len, "{tag} {kind} {i}: {} bytes", out.len());
                }
            }
        }
    }
    assert!(refused.is_empty(), "{} refused: {refused:?}", refused.len());
}
