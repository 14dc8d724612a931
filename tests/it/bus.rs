//! Remote workers over the worker bus, as real processes on loopback: one `sortie control` and
//! two or three `sortie worker`s, real upstreams, and a fake worker speaking the protocol with
//! the core codec for the malformed-frame case (decisions 060–062).

use crate::support;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use support::bus::{
    control, control_with, counting_listener, request_at, start_worker, wait_worker, BusTls, Load,
    WORKER_TOKEN,
};
use support::gateway::{
    admin, admin_items, http, temp_dir, unb64, wait_until, ADMIN_TOKEN, LOOPBACK_SNAPSHOT,
};
use support::upstream::{self, Request, Step, Upstream};

/// An upstream that answers after `pause` and records which source address each request came
/// from (workers are told apart by `bind_address`).
fn recording(pause: Duration) -> (Upstream, Arc<Mutex<Vec<IpAddr>>>) {
    let peers = Arc::new(Mutex::new(Vec::new()));
    let p = peers.clone();
    let up = Upstream::start(Arc::new(move |r: &Request| {
        p.lock().unwrap().push(r.peer.ip());
        vec![
            Step::Pause(pause),
            Step::Write(upstream::response(200, &[], b"remote!")),
        ]
    }));
    (up, peers)
}

fn get(url: &str) -> serde_json::Value {
    json!({"method": "GET", "url": url})
}

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

#[test]
fn large_bodies_cross_a_tls_bus_whole() {
    // A 768 KiB answer reaches the control as many data frames, several per socket read: the
    // TLS session's plaintext is read out between records, so it never overflows.
    let dir = temp_dir("bus-tls-large");
    let tls = BusTls::new(&dir);
    let gw = control("127.0.0.1:0", Some(&tls)).start();
    let _w = start_worker("wl", gw.bus.expect("bus listener"), Some(&tls), "");
    wait_worker(&gw, "wl", "connected");
    let up = Upstream::start(upstream::large(768 * 1024));
    for _ in 0..3 {
        let r = request_at(gw.api, &get(&up.url("/big")));
        assert_eq!(r.status, 200, "{}", &r.text()[..r.text().len().min(300)]);
        let v = r.json();
        let body = unb64(&v["body"]["data_base64"]);
        assert!(body == upstream::pattern(768 * 1024), "the body differs");
    }
}

#[test]
fn routes_by_capability_over_tls_and_acknowledges_rollouts() {
    let dir = temp_dir("bus-tls");
    let tls = BusTls::new(&dir);
    let gw = control("127.0.0.1:0", Some(&tls)).start();
    let bus = gw.bus.expect("bus listener");
    let _a = start_worker(
        "wa",
        bus,
        Some(&tls),
        "tags = [\"alpha\"]\nbind_address = \"127.0.0.1\"",
    );
    let _b = start_worker(
        "wb",
        bus,
        Some(&tls),
        "tags = [\"beta\"]\nbind_address = \"127.0.0.2\"",
    );
    let w = wait_worker(&gw, "wa", "connected");
    assert_eq!(w["executor"], "remote");
    assert_eq!(w["capacity"]["max"], 256);
    assert!(w["last_seen"].is_string());
    wait_worker(&gw, "wb", "connected");

    let (up, peers) = recording(Duration::ZERO);
    for (tag, ip) in [("alpha", "127.0.0.1"), ("beta", "127.0.0.2")] {
        for _ in 0..4 {
            let mut env = get(&up.url("/x"));
            env["routing"] = json!({"tags": [tag]});
            let r = request_at(gw.api, &env);
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(r.json()["body"]["data_base64"], b64("remote!"));
            assert_eq!(peers.lock().unwrap().pop().unwrap().to_string(), ip);
        }
    }
    let mut env = get(&up.url("/x"));
    env["routing"] = json!({"tags": ["gamma"]});
    let r = request_at(gw.api, &env);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["code"], "route_unavailable");

    // Rollouts: both workers applied revision 1; a new revision is pushed and acknowledged.
    let rollout = |gw| admin(gw, "GET", "/api/v1/admin/rollouts", &[], b"").json();
    let r = rollout(&gw);
    assert_eq!(r["config_version"], 1);
    assert_eq!(r["entries"].as_array().unwrap().len(), 2, "{r}");
    assert!(r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["status"] == "applied"));
    let put = admin(
        &gw,
        "PUT",
        "/api/v1/admin/config",
        &[
            ("If-Match", "1"),
            ("X-Service-Actor", "test"),
            ("Content-Type", "application/json"),
        ],
        LOOPBACK_SNAPSHOT.replace("60000", "30000").as_bytes(),
    );
    assert_eq!(put.status, 200, "{}", put.text());
    wait_until(Duration::from_secs(10), "rollout of revision 2", || {
        let r = rollout(&gw);
        r["config_version"] == 2
            && r["entries"]
                .as_array()
                .is_some_and(|e| e.len() == 2 && e.iter().all(|e| e["status"] == "applied"))
    });

    // A worker that does not trust the control's certificate never registers: it dials, its
    // TLS handshake fails on the certificate (which its log says), and it is never listed.
    let c = start_worker("wc", bus, Some(&BusTls::new(&temp_dir("bus-other-ca"))), "");
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen
        .iter()
        .any(|l: &String| l.to_ascii_lowercase().contains("certificate"))
    {
        assert!(
            Instant::now() < deadline,
            "no certificate failure logged: {seen:?}"
        );
        let items = admin_items(&gw, "/api/v1/admin/workers");
        assert!(items.iter().all(|w| w["worker_id"] != "wc"), "{items:?}");
        seen.extend(c.output());
        std::thread::park_timeout(Duration::from_millis(100));
    }
    let items = admin_items(&gw, "/api/v1/admin/workers");
    assert!(items.iter().all(|w| w["worker_id"] != "wc"), "{items:?}");
}

#[test]
fn capacity_exhaustion_and_drain_under_load() {
    let gw = control("127.0.0.1:0", None).start();
    let bus = gw.bus.unwrap();
    let _a = start_worker(
        "wa",
        bus,
        None,
        "capacity = 1\nbind_address = \"127.0.0.1\"",
    );
    wait_worker(&gw, "wa", "connected");
    let (slow, _) = recording(Duration::from_millis(1500));
    let api = gw.api;
    let url = slow.url("/slow");
    let first = std::thread::spawn(move || request_at(api, &get(&url)));
    wait_until(Duration::from_secs(10), "one request in flight", || {
        wait_worker(&gw, "wa", "connected")["capacity"]["active"] == 1
    });
    let r = request_at(gw.api, &get(&slow.url("/second")));
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["code"], "executor_capacity_exhausted");
    let first = first.join().unwrap();
    assert_eq!(first.status, 200, "{}", first.text());

    // Drain under load: a second worker joins, requests keep flowing while wa drains.
    let _b = start_worker(
        "wb",
        bus,
        None,
        "capacity = 64\nbind_address = \"127.0.0.2\"",
    );
    wait_worker(&gw, "wb", "connected");
    let (up, peers) = recording(Duration::from_millis(5));
    // Capacity of wa is 1: a refusal is re-routed, never a failure here, because wb has room.
    let load = Load::start(api, &up.url("/load"), 4);
    load.wait_for(20, "load running");
    let etag = wait_worker(&gw, "wa", "connected")["etag"]
        .as_str()
        .unwrap()
        .to_string();
    let r = admin(
        &gw,
        "POST",
        "/api/v1/admin/workers/wa/drain",
        &[("If-Match", &etag), ("X-Service-Actor", "test")],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["draining"], true);
    wait_until(Duration::from_secs(10), "wa idle", || {
        wait_worker(&gw, "wa", "connected")["capacity"]["active"] == 0
    });
    let mark = peers.lock().unwrap().len();
    load.wait_for(20, "more load after the drain");
    assert_eq!(load.stop(), 0, "no request failed");
    let after: Vec<IpAddr> = peers.lock().unwrap()[mark..].to_vec();
    assert!(!after.is_empty());
    assert!(
        after.iter().all(|ip| ip.to_string() == "127.0.0.2"),
        "a drained worker gets no new request: {after:?}"
    );
}

#[test]
fn kill9_of_a_worker_fails_each_in_flight_request_once() {
    let gw = control("127.0.0.1:0", None)
        .env("RUST_LOG", "info,sortie::request=debug")
        .start();
    let bus = gw.bus.unwrap();
    let mut a = start_worker("wa", bus, None, "capacity = 16");
    wait_worker(&gw, "wa", "connected");
    let (slow, _) = recording(Duration::from_secs(30));
    let api = gw.api;
    let started = Instant::now();
    let mut threads = Vec::new();
    for i in 0..3 {
        let url = slow.url(&format!("/slow/{i}"));
        threads.push(std::thread::spawn(move || request_at(api, &get(&url))));
    }
    wait_until(Duration::from_secs(10), "three requests in flight", || {
        wait_worker(&gw, "wa", "connected")["capacity"]["active"] == 3
    });
    a.kill9();
    for t in threads {
        let r = t.join().unwrap();
        assert_eq!(r.status, 502, "{}", r.text());
        let body = r.json();
        assert_eq!(body["code"], "worker_disconnected");
        assert_eq!(body["retryable"], true);
    }
    assert!(started.elapsed() < Duration::from_secs(15), "no hang");
    wait_worker(&gw, "wa", "disconnected");

    // Decision 062: a replayable request whose worker dies before any response byte is sent
    // once more, to another worker. The upstream holds only the first request it sees.
    let mut b = start_worker("wb", bus, None, "");
    let mut c = start_worker("wc", bus, None, "");
    wait_worker(&gw, "wb", "connected");
    wait_worker(&gw, "wc", "connected");
    let seen = Arc::new(AtomicUsize::new(0));
    let s2 = seen.clone();
    let up = Upstream::start(Arc::new(move |_: &Request| {
        let pause = if s2.fetch_add(1, Ordering::SeqCst) == 0 {
            Duration::from_secs(30)
        } else {
            Duration::ZERO
        };
        vec![
            Step::Pause(pause),
            Step::Write(upstream::response(200, &[], b"again")),
        ]
    }));
    let url = up.url("/replay");
    let t = std::thread::spawn(move || {
        request_at(
            api,
            &json!({"method": "GET", "url": url, "replayable": true}),
        )
    });
    // The worker has passed the request on: the upstream holds it.
    wait_until(
        Duration::from_secs(10),
        "the upstream has the request",
        || seen.load(Ordering::SeqCst) == 1,
    );
    let mut busy = None;
    wait_until(
        Duration::from_secs(10),
        "the replayable request in flight",
        || {
            for id in ["wb", "wc"] {
                if wait_worker(&gw, id, "connected")["capacity"]["active"] == 1 {
                    busy = Some(id);
                    return true;
                }
            }
            false
        },
    );
    match busy {
        Some("wb") => b.kill9(),
        _ => c.kill9(),
    }
    let r = t.join().unwrap();
    if r.status != 200 {
        let log: Vec<String> = gw.stdout.try_iter().collect();
        panic!(
            "{}: {}\ncontrol log:\n{}",
            r.status,
            r.text(),
            log.join("\n")
        );
    }
    assert_eq!(r.json()["body"]["data_base64"], b64("again"));
    assert_eq!(seen.load(Ordering::SeqCst), 2);
}

#[test]
fn control_restart_and_worker_reconnection() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let bus_addr = format!("127.0.0.1:{port}");
    let dir = temp_dir("bus-restart");
    let mut gw = control(&bus_addr, None).dir(dir.clone()).start();
    let w = start_worker("wa", gw.bus.unwrap(), None, "");
    let before = wait_worker(&gw, "wa", "connected");
    let (up, _) = recording(Duration::ZERO);
    assert_eq!(request_at(gw.api, &get(&up.url("/1"))).status, 200);
    assert!(gw.terminate().success());
    drop(gw);
    let gw = control(&bus_addr, None).dir(dir).start();
    let after = wait_worker(&gw, "wa", "connected");
    assert_eq!(
        after["session"], before["session"],
        "the same worker process"
    );
    assert_eq!(after["session"].as_str(), Some(w.session.as_str()));
    let r = request_at(gw.api, &get(&up.url("/2")));
    assert_eq!(r.status, 200, "{}", r.text());
}

/// An upstream that reads one request and then waits for the client to close, recording it.
fn hanging_upstream() -> (SocketAddr, Arc<AtomicBool>, Arc<AtomicBool>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (got, closed) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let (g, c) = (got.clone(), closed.clone());
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            let mut buf = [0u8; 4096];
            let mut seen = Vec::new();
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            g.store(true, Ordering::SeqCst);
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            c.store(true, Ordering::SeqCst);
        }
    });
    (addr, got, closed)
}

#[test]
fn cancel_reaches_the_worker_and_aborts_the_upstream_request() {
    let gw = control("127.0.0.1:0", None).start();
    let _a = start_worker("wa", gw.bus.unwrap(), None, "");
    wait_worker(&gw, "wa", "connected");
    let (addr, got, closed) = hanging_upstream();
    let api = gw.api;
    let t = std::thread::spawn(move || request_at(api, &get(&format!("http://{addr}/hang"))));
    wait_until(
        Duration::from_secs(10),
        "the upstream has the request",
        || got.load(Ordering::SeqCst),
    );
    support::gateway::cancel_the_only_request(&gw);
    let r = t.join().unwrap();
    assert_eq!(r.json()["code"], "cancelled", "{}", r.text());
    wait_until(
        Duration::from_secs(10),
        "the worker closed the upstream request",
        || closed.load(Ordering::SeqCst),
    );
}

use sortie_core::bus::{decode, encode, Decoded, Frame, Hello};

/// A fake worker's lane to `gw`'s bus, its hello (as `id`) sent.
fn fake_worker(gw: &support::gateway::Gateway, id: &str) -> TcpStream {
    let mut s = TcpStream::connect(gw.bus.unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&hello(id)).unwrap();
    s
}

/// A fake worker: the next frame from the control.
fn next_frame(s: &mut TcpStream, buf: &mut Vec<u8>) -> Frame {
    loop {
        if let Ok(Decoded::Frame(f, n)) = decode(buf) {
            buf.drain(..n);
            return f;
        }
        let mut chunk = [0u8; 65536];
        let n = s.read(&mut chunk).expect("control frame");
        assert!(n > 0, "control closed");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A fake worker registers on a one-core control with the core codec and then stays silent:
/// the control disconnects it after the heartbeat bound (3 intervals, decision 061).
#[test]
fn a_silent_worker_is_disconnected_after_the_heartbeat_bound() {
    let gw = control_with("127.0.0.1:0", None, 200).cores(1).start();
    let mut s = fake_worker(&gw, "silent");
    let mut buf = Vec::new();
    // Version 3: the welcome announces the receipt port (the API listener's here) and the
    // forward proxy's idle limit (decision 068).
    let api_port = gw.api.port();
    assert!(matches!(next_frame(&mut s, &mut buf), Frame::Welcome(w)
        if w.heartbeat_ms == 200 && w.version == sortie_core::bus::PROTOCOL_VERSION
            && w.settings.is_some_and(|l| l.receipt_port == api_port && l.proxy_idle_ms == 60_000)));
    wait_worker(&gw, "silent", "connected");
    let since = Instant::now();
    wait_worker(&gw, "silent", "disconnected");
    let took = since.elapsed();
    assert!(took < Duration::from_secs(3), "disconnected after {took:?}");
    let mut rest = [0u8; 4096];
    loop {
        match s.read(&mut rest) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}

fn hello(id: &str) -> Vec<u8> {
    hello_with_capacity(id, 4)
}

/// An encoded heartbeat of an idle fake worker of `capacity`.
fn heartbeat_frame(capacity: u32) -> Vec<u8> {
    let mut frame = Vec::new();
    encode(
        &Frame::Heartbeat(sortie_core::bus::Heartbeat {
            active: 0,
            capacity,
        }),
        &mut frame,
    )
    .unwrap();
    frame
}

/// The timer the kernel runs on the TCP connection from `local` to `remote`, from
/// `/proc/net/tcp` (`tr`: 0 none, 1 retransmission, 2 keepalive, ...); `None` when no such
/// connection is listed.
fn tcp_timer(local: SocketAddr, remote: SocketAddr) -> Option<u8> {
    let hex = |a: SocketAddr| match a.ip() {
        IpAddr::V4(ip) => format!("{:08X}:{:04X}", u32::from_le_bytes(ip.octets()), a.port()),
        IpAddr::V6(_) => panic!("IPv4 only"),
    };
    let (l, r) = (hex(local), hex(remote));
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        (cols.get(1) == Some(&l.as_str()) && cols.get(2) == Some(&r.as_str()))
            .then(|| u8::from_str_radix(cols[5].split(':').next().unwrap(), 16).unwrap())
    })
}

/// Waits until the kernel keeps the connection from `local` to `remote` alive (timer 2).
fn assert_kept_alive(local: SocketAddr, remote: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let timer = tcp_timer(local, remote);
        if timer == Some(2) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no keepalive timer on {local} -> {remote}: {timer:?}"
        );
        std::thread::park_timeout(Duration::from_millis(20));
    }
}

/// Decision 118: from version 4 on only lane 0 carries heartbeats. A fake worker on a two-core
/// control heartbeats on lane 0 alone for four times the silence bound: under version 4 its
/// lane 1 stays open and the worker connected, and the control keeps both lanes by TCP
/// keepalive; the same worker speaking version 3 loses lane 1, and with it its registration.
#[test]
fn from_version_4_only_lane_zero_carries_heartbeats() {
    for version in [4u16, 3] {
        let gw = control_with("127.0.0.1:0", None, 200).cores(2).start();
        let bus = gw.bus.unwrap();
        let id = format!("lanes-v{version}");
        let open = |index: u16| {
            let mut s = TcpStream::connect(bus).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            s.write_all(&hello_lane(
                &id,
                4,
                index,
                if index == 0 { 0 } else { 2 },
                version,
            ))
            .unwrap();
            let mut buf = Vec::new();
            match next_frame(&mut s, &mut buf) {
                Frame::Welcome(w) => assert_eq!((w.version, w.cores), (version, 2)),
                other => panic!("{other:?}"),
            }
            s
        };
        let mut lane0 = open(0);
        let mut lane1 = open(1);
        wait_worker(&gw, &id, "connected");
        for s in [&lane0, &lane1] {
            assert_kept_alive(s.peer_addr().unwrap(), s.local_addr().unwrap());
        }
        let beat = heartbeat_frame(4);
        // The bound is 3 intervals of 200 ms, checked every interval.
        let until = Instant::now() + Duration::from_millis(2400);
        while Instant::now() < until {
            lane0.write_all(&beat).unwrap();
            std::thread::sleep(Duration::from_millis(50));
        }
        let items = admin_items(&gw, "/api/v1/admin/workers");
        let state = support::gateway::worker_item(&items, &id)["state"].clone();
        if version == 4 {
            assert!(
                !closed_within(&mut lane1, Duration::from_millis(200)),
                "version 4: the control closed the silent lane 1"
            );
            assert_eq!(state, "connected", "{items:?}");
        } else {
            assert!(
                closed_within(&mut lane1, Duration::from_secs(1)),
                "version 3: lane 1 was silent past the bound and is still open"
            );
            assert_eq!(state, "disconnected", "{items:?}");
        }
        drop(lane0);
    }
}

/// Heartbeats are recorded without the registry's lock, in the worker's slot: `last_seen` of a
/// connected worker follows its lane 0's heartbeats, and stops when it disconnects.
#[test]
fn last_seen_follows_the_heartbeats_of_lane_zero() {
    let gw = control_with("127.0.0.1:0", None, 200).cores(2).start();
    let mut w = start_worker("seen", gw.bus.unwrap(), None, "");
    let first = wait_worker(&gw, "seen", "connected")["last_seen"]
        .as_str()
        .expect("last_seen")
        .to_string();
    let mut later = String::new();
    wait_until(Duration::from_secs(5), "a later heartbeat", || {
        let items = admin_items(&gw, "/api/v1/admin/workers");
        later = support::gateway::worker_item(&items, "seen")["last_seen"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        later > first
    });
    w.kill9();
    let gone = wait_worker(&gw, "seen", "disconnected")["last_seen"]
        .as_str()
        .expect("last_seen")
        .to_string();
    assert!(gone >= later, "{gone} < {later}");
}

/// A real worker and a control both leave their lanes' liveness to the kernel: every lane has
/// a keepalive timer on both of its ends (decision 118).
#[test]
fn both_ends_of_every_lane_are_kept_alive_by_the_kernel() {
    let gw = control_with("127.0.0.1:0", None, 1000).cores(2).start();
    let bus = gw.bus.unwrap();
    let _w = start_worker("ka", bus, None, "");
    wait_worker(&gw, "ka", "connected");
    // The worker's ends: connections to the bus port other than this test's own.
    let deadline = Instant::now() + Duration::from_secs(10);
    let ends = loop {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
        let bus_hex = format!(":{:04X}", bus.port());
        let ends: Vec<(SocketAddr, SocketAddr)> = table
            .lines()
            .skip(1)
            .filter_map(|line| {
                let cols: Vec<&str> = line.split_whitespace().collect();
                // Established (01) connections whose remote end is the bus listener.
                (cols.get(2)?.ends_with(&bus_hex) && cols.get(3) == Some(&"01")).then(|| {
                    let parse = |c: &str| {
                        let (ip, port) = c.split_once(':').unwrap();
                        let ip = u32::from_str_radix(ip, 16).unwrap().to_le_bytes();
                        SocketAddr::from((ip, u16::from_str_radix(port, 16).unwrap()))
                    };
                    (parse(cols[1]), parse(cols[2]))
                })
            })
            .collect();
        if ends.len() == 2 {
            break ends;
        }
        assert!(Instant::now() < deadline, "worker lanes: {ends:?}");
        std::thread::park_timeout(Duration::from_millis(50));
    };
    for (worker_end, control_end) in ends {
        assert_kept_alive(worker_end, control_end);
        assert_kept_alive(control_end, worker_end);
    }
}

/// A worker of an earlier build speaks version 2 only: its welcome is a version 2 one,
/// without the lane settings of version 3 (decision 068), and it registers.
#[test]
fn a_version_2_worker_gets_a_version_2_welcome() {
    let gw = control_with("127.0.0.1:0", None, 10_000).cores(1).start();
    let mut s = TcpStream::connect(gw.bus.unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut v2 = hello("older");
    // The hello's version range is its first four payload bytes: 2..=2.
    v2[5..9].copy_from_slice(&[0, 2, 0, 2]);
    s.write_all(&v2).unwrap();
    let mut buf = Vec::new();
    match next_frame(&mut s, &mut buf) {
        Frame::Welcome(w) => {
            assert_eq!(w.version, 2);
            assert_eq!(w.settings, None);
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(next_frame(&mut s, &mut buf), Frame::ConfigPush(_)));
    wait_worker(&gw, "older", "connected");
}

/// Writes one frame to a scripted lane.
fn send_frame(s: &mut TcpStream, f: Frame) {
    let mut out = Vec::new();
    encode(&f, &mut out).unwrap();
    s.write_all(&out).unwrap();
}

/// A scripted control's side of a worker's lane after its hello: the welcome at `version`
/// (announcing `receipt_port`), the loopback configuration, and the wait for it to apply.
fn configure_scripted_lane(s: &mut TcpStream, buf: &mut Vec<u8>, version: u16, receipt_port: u16) {
    use sortie_core::bus::{ConfigPush, LaneSettings, Welcome};
    send_frame(
        s,
        Frame::Welcome(Welcome {
            version,
            control_id: "scripted".into(),
            core: 0,
            cores: 1,
            heartbeat_ms: 10_000,
            settings: Some(LaneSettings {
                receipt_port,
                proxy_idle_ms: 60_000,
            }),
        }),
    );
    send_frame(
        s,
        Frame::ConfigPush(ConfigPush {
            version: 1,
            payload: LOOPBACK_SNAPSHOT.as_bytes().to_vec(),
        }),
    );
    loop {
        if let Frame::ConfigApplied { version: 1 } = next_frame(s, buf) {
            break;
        }
    }
}

/// The stream error a real worker `id` answers `assign` with, from a scripted control that
/// welcomed it at `version` and announced `receipt_port`.
fn scripted_worker_error(
    id: &str,
    version: u16,
    receipt_port: u16,
    assign: sortie_core::bus::Assign,
) -> sortie_core::bus::StreamError {
    let bus = TcpListener::bind("127.0.0.1:0").unwrap();
    let _w = start_worker(id, bus.local_addr().unwrap(), None, "");
    let (mut s, _) = bus.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = Vec::new();
    match next_frame(&mut s, &mut buf) {
        Frame::Hello(h) => assert_eq!(h.version_max, sortie_core::bus::PROTOCOL_VERSION),
        other => panic!("{other:?}"),
    }
    configure_scripted_lane(&mut s, &mut buf, version, receipt_port);
    send_frame(&mut s, Frame::Assign(Box::new(assign)));
    loop {
        match next_frame(&mut s, &mut buf) {
            Frame::StreamError(e) => return e,
            Frame::Heartbeat(_) | Frame::Accept { .. } => continue,
            other => panic!("{other:?}"),
        }
    }
}

/// The worker side of decision 068, against a scripted control that misbehaves: a receipt URL
/// on the dialled host but not on the receipt port the welcome announced is refused with
/// `body_ref_unavailable`, and nothing connects to that port.
#[test]
fn a_worker_fetches_receipts_only_on_the_announced_port() {
    use sortie_core::bus::{Assign, AssignRef, AssignUrl, BodySource};
    let (other, reached) = counting_listener("127.0.0.1:0");
    let other_port = other.port();
    let assign = Assign::new::<Vec<u8>, Vec<u8>>(AssignRef {
        stream: 1,
        request_id: "req_port",
        deployment_id: "dep_test",
        deadline_ms: 10_000,
        is_replayable: false,
        ingress: 0,
        method: "POST",
        url: AssignUrl::Text("http://127.0.0.1:9/x"),
        headers: &[],
        body: &BodySource::Receipt {
            url: format!(
                "http://127.0.0.1:{other_port}/api/v1/receipt-objects/r?deployment_id=dep_test"
            ),
            len: 10,
        },
        pool: "direct",
        provider_session: None,
        proxy_username: None,
        fingerprint_profile: None,
        max_response_bytes: 1 << 20,
        window: 1 << 16,
    });
    // Not the port of the receipt URL.
    let error = scripted_worker_error("wp", 3, other_port.wrapping_add(1), assign);
    assert_eq!(error.code, "body_ref_unavailable", "{error:?}");
    assert!(error.message.contains("receipt port"), "{error:?}");
    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "the other port was contacted"
    );
}

/// A tunnel's target is `host:port` text. A scripted control that sends one as parsed URL
/// parts (the form only absolute-form requests take) gets a stream error, and the worker dials
/// nothing.
#[test]
fn a_worker_refuses_a_tunnel_whose_target_came_as_parts() {
    use sortie_core::bus::{Assign, AssignRef, AssignUrl, BodySource, PROTOCOL_VERSION};
    let (dest, reached) = counting_listener("127.0.0.1:0");
    let target = sortie_core::request::parse_target_url(&format!("https://{dest}/")).unwrap();
    let assign = Assign::new::<Vec<u8>, Vec<u8>>(AssignRef {
        stream: 1,
        request_id: "req_tunnel_parts",
        deployment_id: "dep_test",
        deadline_ms: 10_000,
        is_replayable: false,
        ingress: 2,
        method: "CONNECT",
        url: AssignUrl::Parts(&target),
        headers: &[],
        body: &BodySource::Tunnel,
        pool: "direct",
        provider_session: None,
        proxy_username: None,
        fingerprint_profile: None,
        max_response_bytes: u64::MAX,
        window: 1 << 16,
    });
    let error = scripted_worker_error("wt", PROTOCOL_VERSION, 1, assign);
    assert_eq!(error.stream, 1, "{error:?}");
    assert_eq!(error.code, "executor_internal_error", "{error:?}");
    assert!(error.message.contains("host:port text"), "{error:?}");
    assert_eq!(reached.load(Ordering::SeqCst), 0, "the worker dialled");
}

/// What a real worker answers a scripted control that welcomed it at `version`, for a GET of
/// `len` body bytes under a response window of `window`: the frames of the stream, in order.
fn worker_answer(version: u16, window: u32, len: usize) -> Vec<Frame> {
    worker_answer_typed(version, window, len)
        .into_iter()
        .map(|(f, _)| f)
        .collect()
}

/// `worker_answer`, each frame with the type byte it came with; from version 6 the assignment
/// carries its target as parts (decision 131).
fn worker_answer_typed(version: u16, window: u32, len: usize) -> Vec<(Frame, u8)> {
    use sortie_core::bus::{Assign, AssignRef, AssignUrl, BodySource};
    let up = Upstream::start(upstream::large(len));
    let bus = TcpListener::bind("127.0.0.1:0").unwrap();
    let _w = start_worker("wv", bus.local_addr().unwrap(), None, "");
    let (mut s, _) = bus.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = Vec::new();
    assert!(matches!(next_frame(&mut s, &mut buf), Frame::Hello(_)));
    configure_scripted_lane(&mut s, &mut buf, version, 9);
    let url = up.url("/whole");
    let target = sortie_core::request::parse_target_url(&url).unwrap();
    send_frame(
        &mut s,
        Frame::Assign(Box::new(Assign::new::<Vec<u8>, Vec<u8>>(AssignRef {
            stream: 1,
            request_id: "req_whole",
            deployment_id: "dep_test",
            deadline_ms: 10_000,
            is_replayable: false,
            ingress: 0,
            method: "GET",
            url: if version >= 6 {
                AssignUrl::Parts(&target)
            } else {
                AssignUrl::Text(&url)
            },
            headers: &[],
            body: &BodySource::Empty,
            pool: "direct",
            provider_session: None,
            proxy_username: None,
            fingerprint_profile: None,
            max_response_bytes: 1 << 20,
            window,
        }))),
    );
    let mut frames = Vec::new();
    let mut got = 0usize;
    loop {
        // The type byte of the next frame, once its first five bytes are in.
        while buf.len() < 5 {
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).expect("worker frame");
            assert!(n > 0, "worker closed");
            buf.extend_from_slice(&chunk[..n]);
        }
        let type_byte = buf[4];
        let f = next_frame(&mut s, &mut buf);
        let is_last = match &f {
            Frame::Heartbeat(_) => continue,
            Frame::Response { .. } | Frame::StreamError(_) => true,
            Frame::Data { bytes, end, .. } => {
                got += bytes.len();
                if !end && got >= window as usize {
                    // Room for the rest.
                    send_frame(
                        &mut s,
                        Frame::Credit {
                            stream: 1,
                            bytes: 1 << 20,
                        },
                    );
                }
                *end
            }
            _ => false,
        };
        frames.push((f, type_byte));
        if is_last {
            return frames;
        }
    }
}

/// Version 5 (decision 123): a body that came whole with the head, within the window, is
/// answered with one `Response` frame after the `Accept`; a version 4 lane gets the head and
/// the data apart, and so does a body over the window. Version 6 (decision 131): the worker
/// takes an assignment whose target comes as parts, and its `Response` carries the fields as
/// one block (0x1a), where a version 5 lane gets them one by one (0x18).
#[test]
fn a_whole_small_answer_is_one_response_frame_from_version_5() {
    for (version, type_byte) in [(5, 0x18), (6, 0x1a)] {
        let typed = worker_answer_typed(version, 1 << 16, 1024);
        assert_eq!(typed.get(1).map(|(_, t)| *t), Some(type_byte), "{typed:?}");
        let frames: Vec<Frame> = typed.into_iter().map(|(f, _)| f).collect();
        assert_whole_answer(&frames);
    }
    let names = |frames: &[Frame]| frames.iter().map(|f| f.name()).collect::<Vec<_>>();
    let frames = worker_answer(4, 1 << 16, 1024);
    assert_eq!(
        names(&frames),
        ["accept", "response_head", "data"],
        "{frames:?}"
    );
    let frames = worker_answer(5, 100, 1024);
    assert_eq!(
        &names(&frames)[..2],
        ["accept", "response_head"],
        "{frames:?}"
    );
    assert!(frames[2..].iter().all(|f| f.name() == "data"), "{frames:?}");
    let body: Vec<u8> = frames[2..]
        .iter()
        .flat_map(|f| match f {
            Frame::Data { bytes, .. } => bytes.clone(),
            _ => Vec::new(),
        })
        .collect();
    assert_eq!(body, upstream::pattern(1024));
}

/// The `Accept` and one whole `Response` of 1 KiB, status 200, with its `Content-Length`.
fn assert_whole_answer(frames: &[Frame]) {
    assert_eq!(frames.len(), 2, "{frames:?}");
    assert!(
        matches!(frames[0], Frame::Accept { stream: 1 }),
        "{frames:?}"
    );
    match &frames[1] {
        Frame::Response { head, bytes } => {
            assert_eq!((head.stream, head.status), (1, 200));
            assert_eq!(bytes, &upstream::pattern(1024));
            let length = head
                .headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(b"content-length"));
            assert_eq!(length.map(|(_, v)| v), Some(&b"1024"[..]));
        }
        other => panic!("{other:?}"),
    }
}

fn hello_with_capacity(id: &str, capacity: u32) -> Vec<u8> {
    hello_lane(id, capacity, 0, 0, sortie_core::bus::PROTOCOL_VERSION)
}

/// The hello of lane `lane` of `lanes` (lane 0 says 0), offering versions up to `version_max`.
fn hello_lane(id: &str, capacity: u32, lane: u16, lanes: u16, version_max: u16) -> Vec<u8> {
    use sortie_core::worker::AdvertisedCapabilities;
    let mut out = Vec::new();
    encode(
        &Frame::Hello(Box::new(Hello {
            version_min: sortie_core::bus::PROTOCOL_VERSION_MIN,
            version_max,
            worker_id: id.into(),
            session: format!("{id}-session"),
            token: WORKER_TOKEN.as_bytes().to_vec(),
            lane,
            lanes,
            capabilities: AdvertisedCapabilities {
                capacity,
                ..Default::default()
            },
        })),
        &mut out,
    )
    .unwrap();
    out
}

/// A fake worker on a one-core control: registers with the core codec, takes an assignment,
/// then sends a frame out of order. The heartbeat bound is long here, so only the bad frame
/// closes the lane.
#[test]
fn malformed_frame_from_a_worker_is_a_protocol_error_and_the_control_survives() {
    let gw = control_with("127.0.0.1:0", None, 10_000).cores(1).start();
    let mut s = fake_worker(&gw, "fake");
    let mut buf = Vec::new();
    let mut next = |s: &mut TcpStream| next_frame(s, &mut buf);
    assert!(matches!(next(&mut s), Frame::Welcome(w) if w.cores == 1));
    assert!(matches!(next(&mut s), Frame::ConfigPush(_)));
    wait_worker(&gw, "fake", "connected");
    let api = gw.api;
    let t = std::thread::spawn(move || request_at(api, &get("http://127.0.0.1:9/")));
    let stream = loop {
        match next(&mut s) {
            Frame::Assign(a) => break a.stream,
            _ => continue,
        }
    };
    // Data before Accept and a response head: out of order.
    let mut bad = Vec::new();
    encode(
        &Frame::Data {
            stream,
            bytes: b"x".to_vec(),
            end: false,
        },
        &mut bad,
    )
    .unwrap();
    s.write_all(&bad).unwrap();
    let r = t.join().unwrap();
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.json()["code"], "protocol_error");
    // The lane is closed, the worker disconnected, and the control still answers.
    // A read that times out is no close: `closed_within` tells the two apart.
    assert!(
        closed_within(&mut s, Duration::from_secs(10)),
        "lane closed"
    );
    wait_worker(&gw, "fake", "disconnected");
    let r = http(
        gw.admin.unwrap(),
        "GET",
        "/api/v1/admin/workers",
        &[("Authorization", &format!("Bearer {ADMIN_TOKEN}"))],
        b"",
    );
    assert_eq!(r.status, 200);
    // Garbage bytes instead of a hello are dropped without harm, too.
    let mut g = TcpStream::connect(gw.bus.unwrap()).unwrap();
    g.write_all(&[0xff; 64]).unwrap();
    assert!(
        closed_within(&mut g, Duration::from_secs(10)),
        "garbage left open"
    );
    let r = request_at(gw.api, &get("http://127.0.0.1:9/"));
    assert_eq!(r.json()["code"], "route_unavailable", "{}", r.text());
}

/// The request API's timing through a remote worker (decision 128): `assignment_ms` runs from
/// the worker's choice to its `Accept`, `egress_ms` from there to the whole answer. A fake
/// worker accepts 400 ms after its assignment and answers 300 ms after that.
#[test]
fn assignment_ms_runs_until_the_worker_accepts() {
    use sortie_core::bus::{HeadFields, ResponseHead};
    let gw = control_with("127.0.0.1:0", None, 10_000).cores(1).start();
    let mut s = fake_worker(&gw, "slow");
    let mut buf = Vec::new();
    wait_worker(&gw, "slow", "connected");
    let api = gw.api;
    let t = std::thread::spawn(move || request_at(api, &get("http://127.0.0.1:9/")));
    let stream = loop {
        if let Frame::Assign(a) = next_frame(&mut s, &mut buf) {
            break a.stream;
        }
    };
    std::thread::sleep(Duration::from_millis(400));
    send_frame(&mut s, Frame::Accept { stream });
    std::thread::sleep(Duration::from_millis(300));
    send_frame(
        &mut s,
        Frame::Response {
            head: ResponseHead {
                stream,
                status: 200,
                headers: HeadFields::copied([("Content-Length", "2")]),
            },
            bytes: b"ok".to_vec(),
        },
    );
    let r = t.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(unb64(&v["body"]["data_base64"]), b"ok");
    let ms = |k: &str| v["timing"][k].as_u64().unwrap_or(u64::MAX);
    let (routing, assignment, egress, total) = (
        ms("routing_ms"),
        ms("assignment_ms"),
        ms("egress_ms"),
        ms("total_ms"),
    );
    assert!((400..700).contains(&assignment), "{v}");
    assert!((300..600).contains(&egress), "{v}");
    assert!(routing + assignment + egress <= total + 3, "{v}");
    assert!(total >= 700, "{v}");
}

/// Decision 131: a control sends a version 6 worker the target URL as the parts it parsed (the
/// worker does not parse it again), and a version 5 worker the URL as text; both answer.
#[test]
fn the_target_url_goes_as_parts_from_version_6_and_as_text_before() {
    use sortie_core::bus::{AssignUrl, HeadFields, ResponseHead};
    let gw = control_with("127.0.0.1:0", None, 10_000).cores(1).start();
    for version in [5, 6] {
        let id = format!("v{version}");
        let mut s = TcpStream::connect(gw.bus.unwrap()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(&hello_lane(&id, 4, 0, 0, version)).unwrap();
        let mut buf = Vec::new();
        wait_worker(&gw, &id, "connected");
        let api = gw.api;
        // One worker is connected at a time: the request goes to this one.
        let t = std::thread::spawn(move || request_at(api, &get("http://127.0.0.1:9/a/b?c=d%20e")));
        let a = loop {
            if let Frame::Assign(a) = next_frame(&mut s, &mut buf) {
                break a;
            }
        };
        let url = "http://127.0.0.1:9/a/b?c=d%20e";
        if version >= 6 {
            let parsed = sortie_core::request::parse_target_url(url).unwrap();
            assert_eq!(a.url(), AssignUrl::Parts(&parsed));
        } else {
            assert_eq!(a.url(), AssignUrl::Text(url));
        }
        send_frame(&mut s, Frame::Accept { stream: a.stream });
        send_frame(
            &mut s,
            Frame::Response {
                head: ResponseHead {
                    stream: a.stream,
                    status: 200,
                    headers: HeadFields::copied([("Content-Length", "2")]),
                },
                bytes: b"ok".to_vec(),
            },
        );
        let r = t.join().unwrap();
        assert_eq!(r.status, 200, "version {version}: {}", r.text());
        assert_eq!(unb64(&r.json()["body"]["data_base64"]), b"ok");
        drop(s);
        wait_worker(&gw, &format!("v{version}"), "disconnected");
    }
}

/// A fake worker that never answers its assignment: `assignment_timeout` after
/// `control.bus.assignment_timeout_ms`, and the control cancels the stream.
#[test]
fn an_assignment_not_accepted_in_time_is_an_assignment_timeout() {
    use support::gateway::Gateway;
    let gw = Gateway::builder()
        .control_mode()
        .control("bus_listen = \"127.0.0.1:0\"")
        .section(&format!(
            "[control.bus]\ntoken = \"{WORKER_TOKEN}\"\nplaintext = true\nheartbeat_ms = 10000\nassignment_timeout_ms = 300\n"
        ))
        .cores(1)
        .start();
    let mut s = fake_worker(&gw, "mute");
    let mut buf = Vec::new();
    wait_worker(&gw, "mute", "connected");
    let api = gw.api;
    let started = Instant::now();
    let t = std::thread::spawn(move || request_at(api, &get("http://127.0.0.1:9/")));
    let stream = loop {
        if let Frame::Assign(a) = next_frame(&mut s, &mut buf) {
            break a.stream;
        }
    };
    let r = t.join().unwrap();
    assert_eq!(r.status, 504, "{}", r.text());
    let body = r.json();
    assert_eq!(body["code"], "assignment_timeout");
    assert_eq!(body["details"]["timeout_type"], "assignment_timeout");
    assert!(started.elapsed() < Duration::from_secs(5));
    loop {
        if let Frame::Cancel { stream: c } = next_frame(&mut s, &mut buf) {
            assert_eq!(c, stream);
            break;
        }
    }
}

/// Decision 061: a second process with the id of a connected worker is refused
/// (`duplicate_session`) and the first keeps serving; once the first is gone, the second is
/// admitted on its next attempt.
#[test]
fn a_second_session_of_a_connected_worker_id_is_refused_until_the_first_is_gone() {
    let gw = control("127.0.0.1:0", None).start();
    let bus = gw.bus.unwrap();
    let mut first = start_worker("wa", bus, None, "");
    let w = wait_worker(&gw, "wa", "connected");
    assert_eq!(w["session"].as_str(), Some(first.session.as_str()));
    let second = start_worker("wa", bus, None, "");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let line = second
            .out
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the second worker logs its refusal");
        if line.contains("duplicate_session") {
            break;
        }
    }
    let w = wait_worker(&gw, "wa", "connected");
    assert_eq!(w["session"].as_str(), Some(first.session.as_str()));
    first.kill9();
    wait_until(
        Duration::from_secs(20),
        "the second session admitted",
        || wait_worker(&gw, "wa", "connected")["session"].as_str() == Some(second.session.as_str()),
    );
    let (up, _) = recording(Duration::ZERO);
    assert_eq!(request_at(gw.api, &get(&up.url("/x"))).status, 200);
}

/// SIGTERM to a worker under load: it says `GoAway`, the control stops assigning to it, the
/// requests in flight finish, and it exits 0 — no request fails.
#[test]
fn a_stopping_worker_finishes_its_requests_under_load() {
    let gw = control("127.0.0.1:0", None).start();
    let bus = gw.bus.unwrap();
    let mut a = start_worker("wa", bus, None, "");
    let _b = start_worker("wb", bus, None, "");
    wait_worker(&gw, "wa", "connected");
    wait_worker(&gw, "wb", "connected");
    let (up, _) = recording(Duration::from_millis(30));
    let load = Load::start(gw.api, &up.url("/load"), 6);
    load.wait_for(30, "load running");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &a.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(s) = a.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "worker did not stop");
        std::thread::park_timeout(Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit:?}");
    load.wait_for(30, "more load after the stop");
    assert_eq!(load.stop(), 0, "no request failed");
    wait_worker(&gw, "wa", "disconnected");
}

/// Lanes live past the time limit of the hello (5 s): a worker stays connected, heartbeating,
/// and keeps serving for longer than that.
#[test]
fn lanes_outlive_the_hello_time_limit() {
    let gw = control("127.0.0.1:0", None).start();
    let w = start_worker("wa", gw.bus.unwrap(), None, "");
    wait_worker(&gw, "wa", "connected");
    let until = Instant::now() + Duration::from_secs(12);
    while Instant::now() < until {
        let items = admin_items(&gw, "/api/v1/admin/workers");
        let item = support::gateway::worker_item(&items, "wa");
        assert_eq!(item["state"], "connected", "{item}");
        assert_eq!(item["session"].as_str(), Some(w.session.as_str()));
        std::thread::park_timeout(Duration::from_millis(200));
    }
    let (up, _) = recording(Duration::ZERO);
    assert_eq!(request_at(gw.api, &get(&up.url("/late"))).status, 200);
}

/// A fake worker that registers and then stops reading its lane: once more than the lane's
/// queue bound (8 MiB) waits to be written to it, new requests for it answer
/// `transport_unavailable` at once instead of growing the control's memory; the requests
/// already sent end with `assignment_timeout`.
#[test]
fn a_lane_that_stops_draining_makes_new_requests_transport_unavailable() {
    let (gw, mut s, mut buf) = slow_reading_fake_worker("stuck", 30_000);
    assert!(matches!(next_frame(&mut s, &mut buf), Frame::ConfigPush(_)));
    wait_worker(&gw, "stuck", "connected");
    // From here on the fake never reads. Each request queues its assignment and 1000 KiB of
    // inline body on the lane.
    let body = b64(&"x".repeat(1000 * 1024));
    let env = json!({"method": "POST", "url": "http://127.0.0.1:9/",
                     "body": {"mode": "inline_base64", "data_base64": body}});
    let api = gw.api;
    let started = Instant::now();
    let mut threads: Vec<_> = (0..40)
        .map(|_| {
            let env = env.clone();
            let t = std::thread::spawn(move || request_at(api, &env));
            // Paced, so that the queue fills in order.
            std::thread::park_timeout(Duration::from_millis(20));
            t
        })
        .collect();
    // The first answer, long before any assignment times out, is the refusal.
    let mut unavailable = None;
    while unavailable.is_none() && started.elapsed() < Duration::from_secs(18) {
        if let Some(done) = threads.iter().position(|t| t.is_finished()) {
            unavailable = Some(threads.swap_remove(done).join().unwrap());
        }
        std::thread::park_timeout(Duration::from_millis(50));
    }
    let r = unavailable.expect("a request answered before its assignment timeout");
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.json()["code"], "transport_unavailable", "{}", r.text());
    // The requests queued before the bound time out unanswered; the later ones were refused.
    let mut timed_out = 0;
    for t in threads {
        let r = t.join().unwrap();
        match r.json()["code"].as_str() {
            Some("assignment_timeout") => timed_out += 1,
            Some("transport_unavailable") => {}
            _ => panic!("{}", r.text()),
        }
    }
    assert!(timed_out >= 8, "the queue took {timed_out} requests");
    drop(s);
}

/// One worker process with two controls in `worker.controls`: it registers with both, serves
/// requests from each over its own lanes, and keeps serving one when the other stops.
#[test]
fn one_worker_serves_two_controls() {
    // Each control's destination policy holds for its own requests: a allows loopback, b
    // allows only an address the upstream is not on.
    let a = control("127.0.0.1:0", None).start();
    let b_policy = LOOPBACK_SNAPSHOT.replace(r#"["127.0.0.0/8","::1/128"]"#, r#"["10.9.9.9/32"]"#);
    assert_ne!(b_policy, LOOPBACK_SNAPSHOT);
    let b = control("127.0.0.1:0", None)
        .snapshot(Some(&b_policy))
        .start();
    let dir = temp_dir("worker-two-controls");
    let config = dir.join("worker.toml");
    std::fs::write(
        &config,
        format!(
            "[worker]\nid = \"w2\"\ncontrols = [\"{}\", \"{}\"]\ntoken = \"{WORKER_TOKEN}\"\n\
             plaintext = true\ncores = 1\nbind_address = \"127.0.0.2\"\n",
            a.bus.unwrap(),
            b.bus.unwrap()
        ),
    )
    .unwrap();
    let w = support::bus::spawn_worker("w2", config);
    let sa = wait_worker(&a, "w2", "connected");
    let sb = wait_worker(&b, "w2", "connected");
    assert_eq!(sa["session"], sb["session"], "one process, one session");
    let (up, peers) = recording(Duration::ZERO);
    // Both orders, twice: a configuration pushed by one control never serves the other's.
    for gw in [&a, &b, &a, &b] {
        let r = request_at(gw.api, &get(&up.url("/both")));
        if gw.api == a.api {
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(
                peers.lock().unwrap().pop().unwrap().to_string(),
                "127.0.0.2"
            );
        } else {
            assert_eq!(r.status, 403, "{}", r.text());
            assert_eq!(r.json()["code"], "destination_denied", "{}", r.text());
        }
    }
    assert_eq!(
        peers.lock().unwrap().len(),
        0,
        "b's requests never reached the upstream"
    );
    drop(a);
    for _ in 0..3 {
        let r = request_at(b.api, &get(&up.url("/after")));
        assert_eq!(r.status, 403, "{}", r.text());
    }
    assert_eq!(wait_worker(&b, "w2", "connected")["session"], sb["session"]);
    drop(w);
}

#[test]
fn a_response_head_beyond_the_bus_limits_fails_its_request_and_not_the_lane() {
    let gw = control("127.0.0.1:0", None).start();
    let w = start_worker("wh", gw.bus.unwrap(), None, "bind_address = \"127.0.0.1\"");
    let session = wait_worker(&gw, "wh", "connected")["session"].clone();
    // The bus carries header names of at most 256 bytes; HTTP/1.1 does not bound them.
    let long_name = "x".repeat(300);
    let up = Upstream::start(Arc::new(move |r: &Request| {
        if r.target == "/long-name" {
            vec![Step::Write(upstream::response(
                200,
                &[(&long_name, "1")],
                b"no",
            ))]
        } else {
            vec![
                Step::Pause(Duration::from_millis(if r.target == "/slow" {
                    800
                } else {
                    0
                })),
                Step::Write(upstream::response(200, &[], b"fine")),
            ]
        }
    }));
    let api = gw.api;
    let slow_url = up.url("/slow");
    let slow = std::thread::spawn(move || request_at(api, &get(&slow_url)));
    let r = request_at(gw.api, &get(&up.url("/long-name")));
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.json()["code"], "protocol_error", "{}", r.text());
    let slow = slow.join().unwrap();
    assert_eq!(
        slow.status,
        200,
        "concurrent request on the same lane: {}",
        slow.text()
    );
    let next = request_at(gw.api, &get(&up.url("/next")));
    assert_eq!(next.status, 200, "{}", next.text());
    assert_eq!(wait_worker(&gw, "wh", "connected")["session"], session);
    drop(w);
}

/// A one-core control (plain bus, `heartbeat_ms`, a 20 s assignment timeout) and a fake worker
/// `id` registered on it with the core codec through a 4 KiB receive buffer, so that the kernel
/// holds little of what the control writes; returns them after the `Welcome`, with the buffer
/// of frames read so far.
fn slow_reading_fake_worker(
    id: &str,
    heartbeat_ms: u32,
) -> (support::gateway::Gateway, TcpStream, Vec<u8>) {
    let gw = support::gateway::Gateway::builder()
        .control_mode()
        .control("bus_listen = \"127.0.0.1:0\"")
        .section(&format!(
            "[control.bus]\ntoken = \"{WORKER_TOKEN}\"\nplaintext = true\nheartbeat_ms = {heartbeat_ms}\nassignment_timeout_ms = 20000\n"
        ))
        .cores(1)
        .start();
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&gw.bus.unwrap().into()).unwrap();
    let mut s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&hello_with_capacity(id, 256)).unwrap();
    let mut buf = Vec::new();
    assert!(matches!(next_frame(&mut s, &mut buf), Frame::Welcome(_)));
    (gw, s, buf)
}

/// Reads until the control closes the connection: true when it did within `within` (end of
/// stream or reset), false when the read timed out with the connection still open.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut sink = [0u8; 4096];
    loop {
        match s.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// Before authentication the listener reads no more than a hello's header needs: a first frame
/// that is not a `Hello`, or a `Hello` longer than the largest valid one, closes the
/// connection as soon as its five header bytes are in, long before the hello time limit
/// (decision 101).
#[test]
fn a_first_frame_that_cannot_be_a_hello_closes_the_connection_at_once() {
    let gw = control("127.0.0.1:0", None).cores(1).start();
    let bus = gw.bus.unwrap();
    let heartbeat_header = [0, 0, 0, 9, 0x04];
    let mut oversized = (sortie_core::bus::MAX_HELLO_BYTES as u32 + 1)
        .to_be_bytes()
        .to_vec();
    oversized.push(0x01);
    for header in [heartbeat_header.to_vec(), oversized] {
        let mut s = TcpStream::connect(bus).unwrap();
        s.write_all(&header).unwrap();
        let started = Instant::now();
        assert!(
            closed_within(&mut s, Duration::from_secs(3)),
            "{header:?}: still open after {:?}",
            started.elapsed()
        );
    }
    // A real worker still registers.
    let _w = start_worker("wa", bus, None, "");
    wait_worker(&gw, "wa", "connected");
}

/// At most `MAX_PRE_AUTH_PER_CORE` (256) connections of a core may wait for their hello at
/// once: the next ones are closed as they are accepted, the waiting ones only at the hello
/// time limit (decision 101).
#[test]
fn connections_past_the_pre_authentication_bound_are_closed_as_accepted() {
    let gw = control("127.0.0.1:0", None).cores(1).start();
    let bus = gw.bus.unwrap();
    // Accepted in the order they connected: the 256 take every slot before the extra ones.
    let mut waiting: Vec<TcpStream> = (0..256).map(|_| TcpStream::connect(bus).unwrap()).collect();
    let mut extra: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(bus).unwrap()).collect();
    for (i, s) in extra.iter_mut().enumerate() {
        assert!(
            closed_within(s, Duration::from_secs(2)),
            "extra connection {i} left open"
        );
    }
    // The first ones are still waiting (the limit is 5 s)...
    assert!(!closed_within(&mut waiting[0], Duration::from_millis(200)));
    // ...and are closed at the hello time limit.
    let started = Instant::now();
    assert!(closed_within(&mut waiting[0], Duration::from_secs(8)));
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    drop(waiting);
    // Slots are free again: a real worker registers.
    let _w = start_worker("wa", bus, None, "");
    wait_worker(&gw, "wa", "connected");
}

/// A worker that keeps sending heartbeats but never reads: the control's writes to it stop
/// making progress, and the lane is closed after `WRITE_STALL_HEARTBEATS` (10) heartbeat
/// intervals instead of queueing without bound (decision 101).
#[test]
fn a_worker_that_heartbeats_but_never_reads_is_disconnected() {
    let (gw, mut s, _) = slow_reading_fake_worker("deaf", 100);
    wait_worker(&gw, "deaf", "connected");
    // From here on it only writes: a heartbeat every 50 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let mut hb = s.try_clone().unwrap();
    let stopping = stop.clone();
    let beats = std::thread::spawn(move || {
        let frame = heartbeat_frame(256);
        while !stopping.load(Ordering::Relaxed) && hb.write_all(&frame).is_ok() {
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    // Requests with large bodies give the lane bytes to write that nobody takes.
    let body = b64(&"x".repeat(1000 * 1024));
    let env = json!({"method": "POST", "url": "http://127.0.0.1:9/",
                     "body": {"mode": "inline_base64", "data_base64": body}});
    let api = gw.api;
    let requests: Vec<_> = (0..16)
        .map(|_| {
            let env = env.clone();
            std::thread::spawn(move || request_at(api, &env))
        })
        .collect();
    let started = Instant::now();
    wait_worker(&gw, "deaf", "disconnected");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "disconnected after {:?}",
        started.elapsed()
    );
    // Every request ends (none waits for its assignment timeout of 20 s).
    for r in requests {
        let r = r.join().unwrap();
        assert_ne!(r.status, 200, "{}", r.text());
    }
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    stop.store(true, Ordering::Relaxed);
    beats.join().unwrap();
    assert!(
        closed_within(&mut s, Duration::from_secs(5)),
        "the control closed the lane"
    );
}

/// With `[[control.bus.workers]]` each worker has its own token, bound to its id (decision
/// 105): a `Hello` naming another worker's id with this token, or an id the control does not
/// list, is refused with `auth_failed`; a pool outside the worker's grant refuses it with
/// `invalid_worker`; a capacity above the grant is clipped to it.
#[test]
fn workers_authenticate_with_their_own_tokens_and_claim_only_what_is_granted() {
    use support::gateway::Gateway;
    let gw = Gateway::builder()
        .control_mode()
        .control("bus_listen = \"127.0.0.1:0\"")
        .section(&format!(
            "[control.bus]\nplaintext = true\nheartbeat_ms = 500\n\
             [[control.bus.workers]]\nid = \"wa\"\ntoken = \"{WORKER_TOKEN}\"\nmax_capacity = 2\npools = [\"direct\"]\n\
             [[control.bus.workers]]\nid = \"wb\"\ntoken = \"another-worker-token-0123456789\"\n"
        ))
        .cores(1)
        .start();
    let bus = gw.bus.unwrap();
    let refused = |hello: Vec<u8>| -> sortie_core::bus::Reject {
        let mut s = TcpStream::connect(bus).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&hello).unwrap();
        let mut buf = Vec::new();
        match next_frame(&mut s, &mut buf) {
            Frame::Reject(r) => r,
            other => panic!("admitted: {other:?}"),
        }
    };
    // wa's token under wb's id, and an id nobody configured.
    let r = refused(hello("wb"));
    assert_eq!(r.reason, "auth_failed", "{r:?}");
    let r = refused(hello("wz"));
    assert_eq!(r.reason, "auth_failed", "{r:?}");
    assert!(r.message.contains("not configured"), "{r:?}");
    // wa claiming a pool it was not granted.
    let mut out = Vec::new();
    encode(
        &Frame::Hello(Box::new(Hello {
            version_min: sortie_core::bus::PROTOCOL_VERSION_MIN,
            version_max: sortie_core::bus::PROTOCOL_VERSION,
            worker_id: "wa".into(),
            session: "wa-greedy".into(),
            token: WORKER_TOKEN.as_bytes().to_vec(),
            lane: 0,
            lanes: 0,
            capabilities: sortie_core::worker::AdvertisedCapabilities {
                pools: vec!["acme".into()],
                capacity: 4,
                ..Default::default()
            },
        })),
        &mut out,
    )
    .unwrap();
    let r = refused(out);
    assert_eq!(r.reason, "invalid_worker", "{r:?}");
    assert!(r.message.contains("acme"), "{r:?}");
    // The real wa registers with its own token; its capacity of 64 is held to the grant's 2.
    let _w = start_worker("wa", bus, None, "capacity = 64\n");
    let w = wait_worker(&gw, "wa", "connected");
    assert_eq!(w["capacity"]["max"], 2, "{w}");
    let (up, _) = recording(Duration::ZERO);
    assert_eq!(request_at(gw.api, &get(&up.url("/own-token"))).status, 200);
}

/// A remote worker disconnected for longer than `control.bus.forget_disconnected_ms` is
/// forgotten: its record and slot go, unless an admin action gave it settings, which stay
/// (listed as `unregistered`), so a disabled worker that comes back is still disabled.
#[test]
fn disconnected_workers_are_forgotten_after_the_bound_and_settings_stay() {
    let gw = control_with("127.0.0.1:0", None, 200)
        .cores(1)
        .section("forget_disconnected_ms = 1000\n")
        .start();
    let bus = gw.bus.unwrap();
    let mut lanes = Vec::new();
    for id in ["gone", "kept"] {
        let mut s = TcpStream::connect(bus).unwrap();
        s.write_all(&hello(id)).unwrap();
        wait_worker(&gw, id, "connected");
        lanes.push(s);
    }
    let r = admin(
        &gw,
        "POST",
        "/api/v1/admin/workers/kept/disable",
        &[("If-Match", "\"0\"")],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // The lanes close after this instant, so the bound counts from later still.
    let since = Instant::now();
    drop(lanes);
    wait_worker(&gw, "gone", "disconnected");
    wait_until(Duration::from_secs(10), "the two workers forgotten", || {
        let items = admin_items(&gw, "/api/v1/admin/workers");
        let state = |id: &str| {
            items
                .iter()
                .find(|w| w["worker_id"] == id)
                .map(|w| w["state"].as_str().unwrap_or("").to_string())
        };
        state("gone").is_none() && state("kept").as_deref() == Some("unregistered")
    });
    // Not before the bound.
    assert!(
        since.elapsed() >= Duration::from_millis(1000),
        "{:?}",
        since.elapsed()
    );
    let kept = wait_worker(&gw, "kept", "unregistered");
    assert_eq!(kept["enabled"], false, "{kept}");

    // The disabled worker returns disabled: registered, and not routable.
    let mut back = TcpStream::connect(bus).unwrap();
    back.write_all(&hello("kept")).unwrap();
    let kept = wait_worker(&gw, "kept", "connected");
    assert_eq!(kept["enabled"], false, "{kept}");
}

/// Waits until worker `w` logs a line containing `needle` (any case), checking all along that
/// the control never lists it.
fn refused_with(gw: &support::gateway::Gateway, w: &support::bus::Worker, needle: &str) {
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !seen
        .iter()
        .any(|l: &String| l.to_ascii_lowercase().contains(needle))
    {
        assert!(
            Instant::now() < deadline,
            "{}: no {needle:?} logged: {seen:?}",
            w.id
        );
        let items = admin_items(gw, "/api/v1/admin/workers");
        assert!(items.iter().all(|i| i["worker_id"] != *w.id), "{items:?}");
        seen.extend(w.output());
        std::thread::park_timeout(Duration::from_millis(100));
    }
    let items = admin_items(gw, "/api/v1/admin/workers");
    assert!(items.iter().all(|i| i["worker_id"] != *w.id), "{items:?}");
}

/// With `control.bus.tls_client_ca_file`, a worker is admitted only with a client certificate
/// from that CA naming its own id: another worker's certificate, none, or one from another CA
/// is refused, so a worker host can open lanes under its own id alone (decision 109).
#[test]
fn client_certificates_bind_workers_to_their_ids() {
    let dir = temp_dir("bus-mtls");
    let tls = BusTls::new(&dir);
    let gw = control("127.0.0.1:0", Some(&tls))
        .section(&format!(
            "tls_client_ca_file = {:?}\n",
            tls.ca_file.display().to_string()
        ))
        .cores(2)
        .start();
    let bus = gw.bus.expect("bus listener");
    let wa_cert = tls.client_cert("wa", &["wa"]);
    let _wa = start_worker("wa", bus, Some(&tls), &wa_cert);
    wait_worker(&gw, "wa", "connected");
    let (up, _) = recording(Duration::ZERO);
    for _ in 0..4 {
        let r = request_at(gw.api, &get(&up.url("/mtls")));
        assert_eq!(r.status, 200, "{}", r.text());
    }

    // wa's certificate under another id: the Hello is refused.
    let thief = start_worker("wt", bus, Some(&tls), &wa_cert);
    refused_with(
        &gw,
        &thief,
        "client certificate does not name this worker id",
    );
    // No certificate: the handshake fails, and the control's alert says why.
    let bare = start_worker("wn", bus, Some(&tls), "");
    refused_with(&gw, &bare, "certificaterequired");
    // A certificate naming the id, from a CA the control does not trust (its name is the
    // trusted CA's, so the signature is what fails).
    let other = BusTls::new(&temp_dir("bus-mtls-other"));
    let foreign = start_worker("wo", bus, Some(&tls), &other.client_cert("wo", &["wo"]));
    refused_with(&gw, &foreign, "fatal alert");
    // wa is still the one connected wa.
    let w = wait_worker(&gw, "wa", "connected");
    assert_eq!(w["session"], _wa.session.as_str(), "{w}");
}

/// SIGHUP reads the control's file again: a worker's new token admits its next lane and the
/// old one no longer does; the lane admitted before goes on (decision 114).
#[test]
fn sighup_reloads_worker_tokens() {
    use support::gateway::Gateway;
    const NEW_TOKEN: &str = "reloaded-worker-token-0123456789";
    let gw = Gateway::builder()
        .control_mode()
        .control("bus_listen = \"127.0.0.1:0\"")
        .section(&format!(
            "[control.bus]\nplaintext = true\nheartbeat_ms = 500\n\
             [[control.bus.workers]]\nid = \"wa\"\ntoken = \"{WORKER_TOKEN}\"\n"
        ))
        .cores(1)
        .start();
    let bus = gw.bus.unwrap();
    let hello_with = |token: &str, session: &str| {
        let mut out = Vec::new();
        encode(
            &Frame::Hello(Box::new(Hello {
                version_min: sortie_core::bus::PROTOCOL_VERSION_MIN,
                version_max: sortie_core::bus::PROTOCOL_VERSION,
                worker_id: "wa".into(),
                session: session.into(),
                token: token.as_bytes().to_vec(),
                lane: 0,
                lanes: 0,
                capabilities: sortie_core::worker::AdvertisedCapabilities {
                    capacity: 4,
                    ..Default::default()
                },
            })),
            &mut out,
        )
        .unwrap();
        let mut s = TcpStream::connect(bus).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&out).unwrap();
        let mut buf = Vec::new();
        (next_frame(&mut s, &mut buf), s)
    };
    let (f, _) = hello_with(NEW_TOKEN, "s1");
    assert!(
        matches!(&f, Frame::Reject(r) if r.reason == "auth_failed"),
        "{f:?}"
    );
    let (f, first) = hello_with(WORKER_TOKEN, "s2");
    assert!(matches!(f, Frame::Welcome(_)), "{f:?}");
    drop(first);
    wait_worker(&gw, "wa", "disconnected");

    let cfg = gw.dir.join("sortie.toml");
    let text = std::fs::read_to_string(&cfg).expect("config");
    std::fs::write(&cfg, text.replace(WORKER_TOKEN, NEW_TOKEN)).expect("rewrite");
    let ok = std::process::Command::new("kill")
        .args(["-HUP", &gw.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(ok.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = gw.stdout.recv_timeout(left).expect("a reload line");
        assert!(!line.contains("not reloaded"), "{line}");
        if line.contains("configuration reloaded") {
            break;
        }
    }
    let (f, _) = hello_with(WORKER_TOKEN, "s3");
    assert!(
        matches!(&f, Frame::Reject(r) if r.reason == "auth_failed"),
        "{f:?}"
    );
    let (f, _lane) = hello_with(NEW_TOKEN, "s4");
    assert!(matches!(f, Frame::Welcome(_)), "{f:?}");
    wait_worker(&gw, "wa", "connected");
}
