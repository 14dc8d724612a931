//! Black-box persistence tests: config history and worker settings across SIGTERM and SIGKILL
//! restarts (decision 005: an acknowledged write survives, an interrupted one leaves either the
//! whole record or none), and store failures that must answer an error and activate nothing
//! (spec, Admin rule 3).

use crate::support;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use support::gateway::{
    admin, admin_items, parse_response, request_api, temp_dir, wait_until, worker_item, Gateway,
    Resp, ADMIN_TOKEN, LOOPBACK_SNAPSHOT,
};
use support::upstream::{self, Upstream};

const CONFIG: &str = "/api/v1/admin/config";
const WORKERS: &str = "/api/v1/admin/workers";
/// The history bound of decision 005.
const HISTORY_LIMIT: usize = 100;

const FAST_AND_PLAIN: &str = r#"
[[workers]]
id = "w-fast"
capacity = 4
tags = ["fast"]

[[workers]]
id = "w-plain"
capacity = 4
"#;

/// A complete snapshot told apart by its default timeout; `allows_loopback` decides whether the
/// loopback upstreams of the tests are reachable, so a request shows which one is active.
fn snapshot(default_timeout_ms: u64, allows_loopback: bool) -> Value {
    let mut v: Value = serde_json::from_str(LOOPBACK_SNAPSHOT).expect("loopback snapshot");
    v["default_timeout_ms"] = json!(default_timeout_ms);
    if !allows_loopback {
        v["destinations"]["allow"] = json!([]);
    }
    v
}

fn put(gw: &Gateway, if_match: &str, body: &Value) -> Resp {
    admin(
        gw,
        "PUT",
        CONFIG,
        &[("If-Match", if_match), ("X-Service-Actor", "persistence")],
        body.to_string().as_bytes(),
    )
}

fn config(gw: &Gateway) -> Value {
    let r = admin(gw, "GET", CONFIG, &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let tag = format!("\"{}\"", v["revision"]);
    assert_eq!(r.header("etag"), Some(tag.as_str()));
    v
}

fn history(gw: &Gateway) -> Vec<Value> {
    admin_items(gw, "/api/v1/admin/config/history")
}

fn workers(gw: &Gateway) -> Vec<Value> {
    admin_items(gw, WORKERS)
}

fn act(gw: &Gateway, id: &str, action: &str, if_match: &str) -> Resp {
    admin(
        gw,
        "POST",
        &format!("{WORKERS}/{id}/{action}"),
        &[("If-Match", if_match)],
        b"",
    )
}

fn fetch(gw: &Gateway, up: &Upstream, tags: &[&str]) -> Resp {
    request_api(
        gw,
        &json!({"method": "GET", "url": up.url("/p"), "routing": {"tags": tags}}),
    )
}

fn metric(gw: &Gateway, series: &str) -> Option<f64> {
    let m = admin(gw, "GET", "/metrics", &[], b"").text();
    m.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn restart(dir: &Path) -> Gateway {
    Gateway::builder()
        .workers(FAST_AND_PLAIN)
        .dir(dir.to_path_buf())
        .start()
}

/// Writes two revisions and two worker settings records, stops the gateway with `stop`,
/// restarts it on the same data dir and checks that everything acknowledged is back and active.
fn survives_restart(stop: impl FnOnce(Gateway)) {
    let up = Upstream::start(upstream::fixed(upstream::response(200, &[], b"ok")));
    let gw = Gateway::builder().workers(FAST_AND_PLAIN).start();
    let dir = gw.dir.clone();
    assert_eq!(put(&gw, "1", &snapshot(2_000, true)).status, 200);
    let r = put(&gw, "2", &snapshot(3_000, false));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(act(&gw, "w-fast", "drain", "\"0\"").status, 200);
    assert_eq!(act(&gw, "ghost", "disable", "\"0\"").status, 200);
    let before = history(&gw);
    assert_eq!(fetch(&gw, &up, &[]).status, 403);
    stop(gw);

    let gw = restart(&dir);
    // The newest committed snapshot is the active one, not the bootstrap file.
    let v = config(&gw);
    assert_eq!(v["revision"], 3);
    assert_eq!(v["snapshot"], snapshot(3_000, false));
    assert_eq!(history(&gw), before);
    let denied = fetch(&gw, &up, &[]);
    assert_eq!(denied.status, 403, "{}", denied.text());
    assert_eq!(denied.json()["code"], "destination_denied");
    let rollout = admin(&gw, "GET", "/api/v1/admin/rollouts", &[], b"").json();
    assert_eq!(rollout["config_version"], 3);
    assert_eq!(metric(&gw, "sortie_config_revision"), Some(3.0));

    // Worker settings came back with their ETags, and routing honours them.
    let items = workers(&gw);
    let ids: Vec<&str> = items
        .iter()
        .map(|w| w["worker_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["ghost", "w-fast", "w-plain"]);
    assert_eq!(worker_item(&items, "w-fast")["draining"], true);
    assert_eq!(worker_item(&items, "w-fast")["etag"], "\"1\"");
    assert_eq!(worker_item(&items, "w-fast")["state"], "connected");
    assert_eq!(worker_item(&items, "w-plain")["etag"], "\"0\"");
    assert_eq!(worker_item(&items, "ghost")["state"], "unregistered");
    assert_eq!(worker_item(&items, "ghost")["enabled"], false);
    assert_eq!(worker_item(&items, "ghost")["etag"], "\"1\"");

    let r = admin(
        &gw,
        "POST",
        "/api/v1/admin/config/rollback",
        &[("If-Match", "\"3\"")],
        br#"{"config_version":2}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["revision"], 4);
    let tagged = fetch(&gw, &up, &["fast"]);
    assert_eq!(tagged.status, 503, "{}", tagged.text());
    assert_eq!(tagged.json()["code"], "route_unavailable");
    assert_eq!(fetch(&gw, &up, &[]).status, 200);
    assert_eq!(act(&gw, "w-fast", "undrain", "\"0\"").status, 409);
    assert_eq!(act(&gw, "w-fast", "undrain", "\"1\"").status, 200);
    assert_eq!(fetch(&gw, &up, &["fast"]).status, 200);
}

#[test]
fn state_survives_a_sigterm_restart() {
    survives_restart(|mut gw| {
        let status = gw.terminate();
        assert!(status.success(), "exit status {status:?}");
    });
}

#[test]
fn state_survives_a_sigkill_restart() {
    // Dropping the gateway sends SIGKILL and reaps the process.
    survives_restart(drop);
}

/// One request on a new connection, with every failure returned instead of panicking: the
/// gateway may be killed at any moment.
fn try_http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> io::Result<Resp> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    if !raw.windows(4).any(|w| w == b"\r\n\r\n") {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "no complete response",
        ));
    }
    Ok(parse_response(&raw))
}

/// A small deterministic generator (xorshift64*) seeded from the clock, printed so that a
/// failing run can be told apart from others.
struct Rng(u64);

impl Rng {
    fn from_clock() -> Rng {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        eprintln!("kill loop seed {nanos}");
        Rng(nanos | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// What the writer thread tried and what the gateway acknowledged.
#[derive(Default)]
struct Log {
    /// (expected revision sent as If-Match, default timeout of the snapshot) per attempt.
    attempted: Vec<(u64, u64)>,
    /// (revision answered, default timeout of the snapshot) per 200.
    acknowledged: Vec<(u64, u64)>,
}

/// The snapshots of the kill loop: odd timeouts deny loopback, even ones allow it.
fn loop_snapshot(timeout: u64) -> Value {
    snapshot(timeout, timeout.is_multiple_of(2))
}

/// Checks a restarted gateway against everything written so far and returns its revision.
fn verify_after_crash(gw: &Gateway, up: &Upstream, log: &Log) -> u64 {
    let v = config(gw);
    let revision = v["revision"].as_u64().expect("revision");
    let last_ack = log.acknowledged.last().copied();
    if let Some((acked, _)) = last_ack {
        assert!(
            revision >= acked,
            "revision {revision} lost acknowledged {acked}"
        );
    }
    // The active snapshot is complete and is one that was written: the acknowledged one, or
    // the single write in flight when the process died.
    eprintln!(
        "restarted at revision {revision}; last acknowledged {:?}",
        last_ack.map(|(r, _)| r)
    );
    let timeout = v["snapshot"]["default_timeout_ms"]
        .as_u64()
        .expect("timeout");
    let expected_snapshot = match last_ack {
        Some((acked, t)) if acked == revision => loop_snapshot(t),
        _ => {
            let previous = last_ack.map_or(0, |(a, _)| a);
            assert_eq!(
                revision,
                previous + 1,
                "more than one unacknowledged revision"
            );
            let attempt = log
                .attempted
                .iter()
                .find(|(expected, t)| *expected == previous && *t == timeout);
            assert!(
                attempt.is_some(),
                "snapshot {v} was never written at {previous}"
            );
            loop_snapshot(timeout)
        }
    };
    assert_eq!(v["snapshot"], expected_snapshot);

    // History: contiguous, newest first, every kept acknowledged record intact.
    let items = history(gw);
    let revs: Vec<u64> = items
        .iter()
        .map(|i| i["revision"].as_u64().unwrap())
        .collect();
    let kept = (revision as usize).min(HISTORY_LIMIT) as u64;
    let want: Vec<u64> = (revision + 1 - kept..=revision).rev().collect();
    assert_eq!(revs, want);
    for (rev, t) in &log.acknowledged {
        if let Some(item) = items.iter().find(|i| i["revision"] == *rev) {
            assert_eq!(item["snapshot"], loop_snapshot(*t), "revision {rev}");
        }
    }

    // The restarted gateway routes with that snapshot.
    let r = fetch(gw, up, &[]);
    let expected_status = if timeout.is_multiple_of(2) { 200 } else { 403 };
    assert_eq!(
        r.status,
        expected_status,
        "snapshot {timeout}: {}",
        r.text()
    );
    revision
}

#[test]
fn sigkill_during_config_writes_never_loses_an_acknowledged_revision() {
    const ROUNDS: usize = 5;
    let up = Upstream::start(upstream::fixed(upstream::response(200, &[], b"ok")));
    let mut rng = Rng::from_clock();
    let dir = temp_dir("killloop");
    let log = Arc::new(Mutex::new(Log {
        attempted: Vec::new(),
        acknowledged: vec![(1, 60_000)],
    }));
    let mut next_timeout = 10_000u64;
    let mut gw = restart(&dir);
    // The bootstrap record is revision 1, the harness's loopback snapshot: what the log above
    // starts from, read from the gateway rather than assumed.
    let first = config(&gw);
    assert_eq!(first["revision"], 1, "{first}");
    assert_eq!(first["snapshot"], loop_snapshot(60_000), "{first}");
    for round in 0..ROUNDS {
        let mut revision = verify_after_crash(&gw, &up, &log.lock().unwrap());
        let addr = gw.admin.expect("admin listener");
        let first_timeout = next_timeout;
        next_timeout += 1_000;
        let writer_log = log.clone();
        let writer = std::thread::spawn(move || {
            let auth = format!("Bearer {ADMIN_TOKEN}");
            for timeout in first_timeout.. {
                let body = loop_snapshot(timeout).to_string();
                let if_match = format!("\"{revision}\"");
                writer_log
                    .lock()
                    .unwrap()
                    .attempted
                    .push((revision, timeout));
                let headers = [
                    ("Authorization", auth.as_str()),
                    ("If-Match", if_match.as_str()),
                ];
                match try_http(addr, "PUT", CONFIG, &headers, body.as_bytes()) {
                    Ok(r) if r.status == 200 => {
                        revision = r.json()["revision"].as_u64().expect("revision");
                        writer_log
                            .lock()
                            .unwrap()
                            .acknowledged
                            .push((revision, timeout));
                    }
                    Ok(r) => panic!("write answered {}: {}", r.status, r.text()),
                    Err(_) => return,
                }
            }
        });
        let target = log.lock().unwrap().acknowledged.len() + 1 + rng.below(12) as usize;
        wait_until(Duration::from_secs(20), "acknowledged writes", || {
            log.lock().unwrap().acknowledged.len() >= target || writer.is_finished()
        });
        assert!(
            !writer.is_finished(),
            "the writer stopped before the kill: {:?}",
            writer.join().err()
        );
        // SIGKILL while the writer is in the middle of its next write.
        drop(gw);
        writer.join().expect("writer thread");
        let acked = log.lock().unwrap().acknowledged.len();
        eprintln!("round {round}: {acked} writes acknowledged so far");
        gw = restart(&dir);
    }
    let revision = verify_after_crash(&gw, &up, &log.lock().unwrap());
    assert!(
        revision > ROUNDS as u64,
        "only {revision} revisions written"
    );
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}

/// What the worker-action writer tried and what the gateway acknowledged: (If-Match revision
/// sent, draining after the action) per attempt, (revision answered, draining) per 200.
#[derive(Default)]
struct ActionLog {
    attempted: Vec<(u64, bool)>,
    acknowledged: Vec<(u64, bool)>,
}

/// Checks the worker `w-fast` of a restarted gateway against the actions written so far: its
/// record is the last acknowledged one or the single one in flight at the kill, routing obeys
/// it, and the ETag the list shows is the one the next action must carry. Returns (revision,
/// draining).
fn verify_worker_after_crash(gw: &Gateway, up: &Upstream, log: &ActionLog) -> (u64, bool) {
    let items = workers(gw);
    let w = worker_item(&items, "w-fast");
    let etag = w["etag"].as_str().expect("etag").to_string();
    let revision: u64 = etag.trim_matches('"').parse().expect("numeric etag");
    let draining = w["draining"].as_bool().expect("draining");
    let (acked, acked_draining) = log.acknowledged.last().copied().unwrap_or((0, false));
    assert!(
        revision >= acked,
        "revision {revision} lost acknowledged {acked}"
    );
    if revision == acked {
        assert_eq!(draining, acked_draining, "{w}");
    } else {
        assert_eq!(
            revision,
            acked + 1,
            "more than one unacknowledged action: {w}"
        );
        assert!(
            log.attempted
                .iter()
                .any(|&(sent, d)| sent == acked && d == draining),
            "record {w} was never written at {acked}"
        );
    }
    // The routing state is the stored one: a draining worker takes no new request.
    let r = fetch(gw, up, &["fast"]);
    let want = if draining { 503 } else { 200 };
    assert_eq!(r.status, want, "draining {draining}: {}", r.text());
    (revision, draining)
}

#[test]
fn sigkill_during_worker_actions_keeps_store_and_routing_in_step() {
    const ROUNDS: usize = 4;
    let up = Upstream::start(upstream::fixed(upstream::response(200, &[], b"ok")));
    let mut rng = Rng::from_clock();
    let dir = temp_dir("actionloop");
    let log = Arc::new(Mutex::new(ActionLog::default()));
    let mut gw = restart(&dir);
    for round in 0..ROUNDS {
        let (mut revision, mut draining) =
            verify_worker_after_crash(&gw, &up, &log.lock().unwrap());
        let addr = gw.admin.expect("admin listener");
        let writer_log = log.clone();
        let writer = std::thread::spawn(move || {
            let auth = format!("Bearer {ADMIN_TOKEN}");
            loop {
                let action = if draining { "undrain" } else { "drain" };
                let if_match = format!("\"{revision}\"");
                writer_log
                    .lock()
                    .unwrap()
                    .attempted
                    .push((revision, !draining));
                let headers = [
                    ("Authorization", auth.as_str()),
                    ("If-Match", if_match.as_str()),
                ];
                let path = format!("{WORKERS}/w-fast/{action}");
                match try_http(addr, "POST", &path, &headers, b"") {
                    Ok(r) if r.status == 200 => {
                        let tag = r
                            .header("etag")
                            .expect("etag")
                            .trim_matches('"')
                            .to_string();
                        revision = tag.parse().expect("numeric etag");
                        draining = r.json()["draining"].as_bool().expect("draining");
                        writer_log
                            .lock()
                            .unwrap()
                            .acknowledged
                            .push((revision, draining));
                    }
                    Ok(r) => panic!("action answered {}: {}", r.status, r.text()),
                    Err(_) => return,
                }
            }
        });
        let target = log.lock().unwrap().acknowledged.len() + 1 + rng.below(20) as usize;
        wait_until(Duration::from_secs(20), "acknowledged actions", || {
            log.lock().unwrap().acknowledged.len() >= target || writer.is_finished()
        });
        assert!(
            !writer.is_finished(),
            "the writer stopped before the kill: {:?}",
            writer.join().err()
        );
        drop(gw);
        writer.join().expect("writer thread");
        let acked = log.lock().unwrap().acknowledged.len();
        eprintln!("round {round}: {acked} actions acknowledged so far");
        gw = restart(&dir);
    }
    let (revision, _) = verify_worker_after_crash(&gw, &up, &log.lock().unwrap());
    assert!(revision > ROUNDS as u64, "only {revision} actions written");
    // The ETag shown after the last restart is accepted by the next action.
    let r = act(&gw, "w-fast", "enable", &format!("\"{revision}\""));
    assert_eq!(r.status, 200, "{}", r.text());
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as `mount -o size=` takes it), or `None` without the privilege.
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = temp_dir("tmpfs");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Tmpfs(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let unmounted = Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Fills the file system that holds `path` until a write fails.
fn fill(path: &Path) -> io::Error {
    let mut f = std::fs::File::create(path).expect("filler file");
    let block = vec![0x5a_u8; 4096];
    loop {
        if let Err(e) = f.write_all(&block).and_then(|()| f.sync_data()) {
            return e;
        }
    }
}

/// While the store refuses writes: every mutation answers 5xx, and durable state, routing,
/// rollouts and metrics stay at revision 2 with w-fast not drained.
fn assert_writes_fail_and_change_nothing(gw: &Gateway, up: &Upstream) {
    let r = put(gw, "\"2\"", &snapshot(9_000, false));
    assert!(
        r.status >= 500,
        "store failure answered {}: {}",
        r.status,
        r.text()
    );
    assert!(r.header("etag").is_none());
    assert!(r.json()["error"].is_string(), "{}", r.text());
    let r = admin(
        gw,
        "POST",
        "/api/v1/admin/config/rollback",
        &[("If-Match", "\"2\"")],
        br#"{"config_version":1}"#,
    );
    assert!(
        r.status >= 500,
        "rollback answered {}: {}",
        r.status,
        r.text()
    );
    let r = act(gw, "w-fast", "drain", "\"0\"");
    assert!(r.status >= 500, "drain answered {}: {}", r.status, r.text());

    let v = config(gw);
    assert_eq!(v["revision"], 2);
    assert_eq!(v["snapshot"], snapshot(2_000, true));
    assert_eq!(history(gw).len(), 2);
    assert_eq!(fetch(gw, up, &["fast"]).status, 200);
    let items = workers(gw);
    assert_eq!(worker_item(&items, "w-fast")["draining"], false);
    assert_eq!(worker_item(&items, "w-fast")["etag"], "\"0\"");
    let rollout = admin(gw, "GET", "/api/v1/admin/rollouts", &[], b"").json();
    assert_eq!(rollout["config_version"], 2);
    assert_eq!(metric(gw, "sortie_config_revision"), Some(2.0));
}

/// After the store recovered: the next writes take the revisions the failed ones never used.
fn assert_writes_recover(gw: &Gateway, up: &Upstream) {
    let r = put(gw, "\"2\"", &snapshot(9_000, false));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["revision"], 3);
    assert_eq!(fetch(gw, up, &[]).status, 403);
    let r = act(gw, "w-fast", "drain", "\"0\"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("etag"), Some("\"1\""));
    let revs: Vec<u64> = history(gw)
        .iter()
        .map(|i| i["revision"].as_u64().unwrap())
        .collect();
    assert_eq!(revs, [3, 2, 1]);
}

#[test]
fn a_full_disk_fails_writes_and_activates_nothing() {
    let fs = Tmpfs::mount("16m").expect(
        "this test fills a small file system: mounting a tmpfs needs root (CAP_SYS_ADMIN) and \
         the mount/umount commands (util-linux)",
    );
    let up = Upstream::start(upstream::fixed(upstream::response(200, &[], b"ok")));
    let gw = Gateway::builder()
        .workers(FAST_AND_PLAIN)
        .dir(fs.0.clone())
        .start();
    assert_eq!(put(&gw, "1", &snapshot(2_000, true)).status, 200);

    let filler = fs.0.join("filler");
    let e = fill(&filler);
    assert_eq!(e.raw_os_error(), Some(28), "expected ENOSPC, got {e}");
    assert_writes_fail_and_change_nothing(&gw, &up);

    std::fs::remove_file(&filler).expect("remove filler");
    assert_writes_recover(&gw, &up);

    // What the restarted gateway finds is exactly what was acknowledged.
    drop(gw);
    let gw = restart(&fs.0);
    assert_eq!(config(&gw)["revision"], 3);
    assert_eq!(history(&gw).len(), 3);
    assert_eq!(worker_item(&workers(&gw), "w-fast")["etag"], "\"1\"");
}

fn chattr(flag: &str, path: &Path) -> bool {
    Command::new("chattr")
        .arg(flag)
        .arg(path)
        .status()
        .is_ok_and(|s| s.success())
}

/// Clears the immutable flag again even when the test fails half-way.
struct Immutable(PathBuf);

impl Drop for Immutable {
    fn drop(&mut self) {
        chattr("-i", &self.0);
    }
}

#[test]
fn an_unwritable_database_log_fails_writes_and_activates_nothing() {
    let up = Upstream::start(upstream::fixed(upstream::response(200, &[], b"ok")));
    let gw = Gateway::builder().workers(FAST_AND_PLAIN).start();
    assert_eq!(put(&gw, "1", &snapshot(2_000, true)).status, 200);

    // The store writes through SQLite's write-ahead log; an immutable log refuses every write
    // even through the descriptor the gateway already holds open.
    let wal = gw.dir.join("data").join("sortie.db-wal");
    assert!(wal.exists(), "no write-ahead log at {}", wal.display());
    assert!(
        chattr("+i", &wal),
        "this test makes the write-ahead log immutable: chattr +i needs root (CAP_LINUX_IMMUTABLE), \
         the chattr command (e2fsprogs) and a temporary directory on ext2/3/4, xfs or btrfs"
    );
    let guard = Immutable(wal);
    assert_writes_fail_and_change_nothing(&gw, &up);
    drop(guard);
    assert_writes_recover(&gw, &up);
}
