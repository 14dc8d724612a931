//! The binary upgrade (SIGUSR2, `--upgrade`) of a real `sortie serve` under load: keep-alive
//! clients of the request API and of the forward proxy send throughout, a CONNECT tunnel opened
//! before the upgrade carries bytes across it, and none of them sees a failure. The successor
//! serves on the same listening sockets; the predecessor drains and exits 0 once its tunnel
//! closed.

use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::gateway::{wait_until, Gateway, DEPLOYMENT_TOKEN};
use support::proxy::{base64_basic, open_tunnel, proxy_user};
use support::upstream::{self, Upstream};

/// A TCP echo server on loopback, a thread per connection; its port.
fn echo_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind echo");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// What the clients saw.
#[derive(Default)]
struct Tally {
    ok: AtomicUsize,
    /// Responses that closed their connection (`Connection: close`).
    closes: AtomicUsize,
    failures: Mutex<Vec<String>>,
}

/// One keep-alive client: sends `request` to `addr` every `period` until `stop`, reconnecting
/// only after a response that said `Connection: close`. Anything but a complete 200 is a
/// failure.
fn client(
    addr: SocketAddr,
    request: Vec<u8>,
    period: Duration,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut conn: Option<BufReader<TcpStream>> = None;
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            if conn.is_none() {
                match TcpStream::connect(addr) {
                    Ok(s) => {
                        s.set_read_timeout(Some(Duration::from_secs(10))).ok();
                        conn = Some(BufReader::new(s));
                    }
                    Err(e) => {
                        tally.failures.lock().unwrap().push(format!("connect: {e}"));
                        std::thread::sleep(period);
                        continue;
                    }
                }
            }
            let c = conn.as_mut().expect("connection");
            match exchange(c, &request) {
                Ok(is_closing) => {
                    tally.ok.fetch_add(1, Ordering::Relaxed);
                    if is_closing {
                        tally.closes.fetch_add(1, Ordering::Relaxed);
                        conn = None;
                    }
                }
                Err(e) => {
                    tally.failures.lock().unwrap().push(e);
                    conn = None;
                }
            }
            std::thread::sleep(period.saturating_sub(started.elapsed()));
        }
    })
}

/// Writes one request and reads its response; whether the response closes the connection.
fn exchange(c: &mut BufReader<TcpStream>, request: &[u8]) -> Result<bool, String> {
    c.get_mut()
        .write_all(request)
        .map_err(|e| format!("write: {e}"))?;
    let mut status = String::new();
    match c.read_line(&mut status) {
        Ok(0) => return Err("closed before a response".into()),
        Ok(_) => {}
        Err(e) => return Err(format!("read: {e}")),
    }
    let (mut length, mut is_closing) = (0usize, false);
    loop {
        let mut line = String::new();
        c.read_line(&mut line).map_err(|e| format!("head: {e}"))?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').unwrap_or((line, ""));
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().unwrap_or(0),
            "connection" => is_closing = value.trim().eq_ignore_ascii_case("close"),
            _ => {}
        }
    }
    let mut body = vec![0u8; length];
    c.read_exact(&mut body).map_err(|e| format!("body: {e}"))?;
    if !status.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "{}: {}",
            status.trim_end(),
            String::from_utf8_lossy(&body)
        ));
    }
    Ok(is_closing)
}

/// Keep-alive clients of the request API and the forward proxy, each sending `GET` of one
/// upstream URL (through an envelope, or in absolute form) on its own schedule.
struct Load {
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
    clients: Vec<std::thread::JoinHandle<()>>,
    api_request: Vec<u8>,
}

impl Load {
    /// Three clients of the API and three of the proxy at `gw`, a request every 20 ms each.
    fn start(gw: &Gateway, up: &Upstream) -> Load {
        let envelope = format!(r#"{{"method":"GET","url":"{}"}}"#, up.url("/api"));
        let api_request = format!(
            "POST /api/v1/requests HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {DEPLOYMENT_TOKEN}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{envelope}",
            envelope.len()
        );
        let proxy_request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nProxy-Authorization: Basic {}\r\n\r\n",
            up.url("/proxied"),
            up.addr(),
            base64_basic(&proxy_user())
        );
        let mut load = Load {
            stop: Arc::new(AtomicBool::new(false)),
            tally: Arc::new(Tally::default()),
            clients: Vec::new(),
            api_request: api_request.into_bytes(),
        };
        for _ in 0..3 {
            load.add(gw.api, load.api_request.clone(), Duration::from_millis(20));
            load.add(
                gw.proxy.expect("proxy"),
                proxy_request.clone().into_bytes(),
                Duration::from_millis(20),
            );
        }
        load
    }

    /// One more client sending `request` to `addr` every `period`.
    fn add(&mut self, addr: SocketAddr, request: Vec<u8>, period: Duration) {
        let c = client(addr, request, period, self.stop.clone(), self.tally.clone());
        self.clients.push(c);
    }

    /// Requests answered so far.
    fn ok(&self) -> usize {
        self.tally.ok.load(Ordering::Relaxed)
    }

    /// Waits until `more` requests more were answered.
    fn wait_for(&self, more: usize, what: &str) {
        let at = self.ok();
        wait_until(Duration::from_secs(10), what, || self.ok() >= at + more);
    }

    /// Stops the clients and fails the test on any failure; the responses that closed their
    /// connection.
    fn finish(self, what: &str) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        for c in self.clients {
            c.join().expect("client");
        }
        let failures = self.tally.failures.lock().unwrap().clone();
        assert!(
            failures.is_empty(),
            "{} failures across {what} (of {} ok): {failures:?}",
            failures.len(),
            self.tally.ok.load(Ordering::Relaxed)
        );
        self.tally.closes.load(Ordering::Relaxed)
    }
}

/// Kills a process that is not this test's child, when the test ends however it ends.
struct Reap(u32);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &self.0.to_string()])
            .status();
    }
}

/// Sends SIGUSR2 to process `pid` and returns its successor's pid, read from the log line
/// of the hand-over among `lines` (the process's output).
fn upgrade(pid: u32, lines: &std::sync::mpsc::Receiver<String>) -> u32 {
    let kill = std::process::Command::new("kill")
        .args(["-USR2", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    let successor: u32 = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no hand-over within 30 s; output:\n{}", seen.join("\n")));
        if let Some(rest) = line.split("handed over to process ").nth(1) {
            break rest
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|p| p.parse().ok())
                .expect("successor pid");
        }
        seen.push(line);
    };
    assert_ne!(successor, pid);
    successor
}

/// The inodes of the sockets process `pid` has open (`/proc/PID/fd`).
fn socket_inodes(pid: u32) -> std::collections::HashSet<u64> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("the process's descriptors");
    dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|target| {
            let t = target.to_str()?;
            t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// The inodes of every listening TCP socket on the machine (`/proc/net/tcp*`, state `0A`).
fn listening_socket_inodes() -> std::collections::HashSet<u64> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter_map(|l| {
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    (cols.get(3) == Some(&"0A")).then(|| cols.get(9)?.parse().ok())?
                })
                .collect::<Vec<u64>>()
        })
        .collect()
}

/// Waits for a child process (the process upgraded) to exit; its status.
fn wait_exit(child: &mut std::process::Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "the old process did not exit within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet).
fn is_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

#[test]
fn sigusr2_upgrades_under_load_without_a_failed_request() {
    let up = Upstream::start(upstream::fixed(upstream::response(200, &[], b"hello")));
    let echo = echo_server();
    let mut gw = Gateway::builder().start();
    let mut load = Load::start(&gw, &up);
    // A slow client: one request a second, under the hand-over's idle linger.
    load.add(gw.api, load.api_request.clone(), Duration::from_secs(1));

    // A tunnel opened before the upgrade.
    let (mut tunnel, status) = open_tunnel(&gw, echo);
    assert!(status.contains(" 200"), "CONNECT: {status}");
    let mut echo_round = |i: usize| {
        let msg = format!("round {i}\n");
        tunnel.write_all(msg.as_bytes()).expect("tunnel write");
        let mut back = vec![0u8; msg.len()];
        tunnel.read_exact(&mut back).expect("tunnel read");
        assert_eq!(back, msg.as_bytes(), "the tunnel echoes");
    };
    echo_round(0);
    load.wait_for(50, "requests before the upgrade");
    let before = load.ok();

    let successor = upgrade(gw.child.id(), &gw.stdout);
    let _reap = Reap(successor);
    // The successor holds none of its predecessor's connections (the tunnel's among them),
    // only the listening sockets they share: an inherited copy would keep each connection open
    // for its client after the predecessor closed it, for the successor's whole life.
    let listening = listening_socket_inodes();
    let old = socket_inodes(gw.child.id());
    let leaked: Vec<_> = socket_inodes(successor)
        .intersection(&old)
        .filter(|i| !listening.contains(*i))
        .copied()
        .collect();
    assert!(
        leaked.is_empty(),
        "the successor holds the predecessor's connections {leaked:?}"
    );

    // The tunnel lives on in the draining process, which waits for it.
    for i in 1..=8 {
        std::thread::sleep(Duration::from_millis(100));
        echo_round(i);
    }
    assert!(
        gw.child.try_wait().expect("wait").is_none(),
        "the old process drains while its tunnel is open"
    );
    drop(tunnel);
    let status = wait_exit(&mut gw.child, Duration::from_secs(15));
    assert!(status.success(), "the old process exits 0: {status}");

    // The successor alone serves now.
    load.wait_for(50, "requests after the upgrade");
    let (mut t2, status) = open_tunnel(&gw, echo);
    assert!(
        status.contains(" 200"),
        "CONNECT after the upgrade: {status}"
    );
    t2.write_all(b"new\n").expect("write");
    let mut back = [0u8; 4];
    t2.read_exact(&mut back).expect("read");
    assert_eq!(&back, b"new\n");

    assert!(load.ok() > before);
    let closes = load.finish("the upgrade");
    assert!(
        closes >= 7,
        "every client was told to move over with Connection: close"
    );

    // The successor stops on SIGTERM like any process.
    std::process::Command::new("kill")
        .args(["-TERM", &successor.to_string()])
        .status()
        .expect("kill");
    wait_until(Duration::from_secs(20), "the successor to stop", || {
        is_gone(successor)
    });
}

#[test]
fn upgrade_without_a_running_process_fails_and_says_so() {
    let dir = support::gateway::temp_dir("upgrade-alone");
    let config = dir.join("sortie.toml");
    std::fs::write(
        &config,
        format!(
            "[control]\napi_listen = \"127.0.0.1:0\"\ndata_dir = {:?}\n",
            dir.join("data").display().to_string()
        ),
    )
    .expect("config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sortie"))
        .args(["serve", "--upgrade", "--config"])
        .arg(&config)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no running process to upgrade at") && err.contains("upgrade.sock"),
        "{err}"
    );
}

/// Under systemd: the running process tells the service manager the successor's pid
/// (`MAINPID=`) and sends no `STOPPING=1` (the service is not stopping); the successor then says
/// `READY=1`. The successor can itself be upgraded: it took over the hand-over socket.
#[test]
fn the_service_manager_hears_of_the_new_main_process_and_the_successor_upgrades_again() {
    use std::os::unix::net::UnixDatagram;
    let dir = support::gateway::temp_dir("upgrade-notify");
    let socket_path = dir.join("notify.sock");
    let notify = UnixDatagram::bind(&socket_path).expect("notify socket");
    notify
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let next = || {
        let mut buf = [0u8; 4096];
        let n = notify.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).trim_end().to_string()
    };
    let mut gw = Gateway::builder()
        .dir(dir.clone())
        .env("NOTIFY_SOCKET", socket_path.to_str().expect("path"))
        .start();
    assert!(next().lines().any(|l| l == "READY=1"));
    let mut pid = gw.child.id();
    let mut reaps = Vec::new();
    for round in 0..2 {
        std::process::Command::new("kill")
            .args(["-USR2", &pid.to_string()])
            .status()
            .expect("kill");
        let main_pid = next();
        let successor: u32 = main_pid
            .strip_prefix("MAINPID=")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("round {round}: MAINPID= first, got {main_pid:?}"));
        reaps.push(Reap(successor));
        assert_ne!(successor, pid);
        let ready = next();
        assert!(
            ready.lines().any(|l| l == "READY=1"),
            "round {round}: READY=1 from the successor, got {ready:?}"
        );
        // The predecessor drains (no connection holds it) and exits without STOPPING=1.
        wait_until(Duration::from_secs(20), "the predecessor to exit", || {
            is_gone(pid) || (round == 0 && gw.child.try_wait().ok().flatten().is_some())
        });
        let r = support::gateway::http(gw.admin.expect("admin"), "GET", "/healthz", &[], b"");
        assert_eq!(r.status, 200, "round {round}: the successor answers");
        pid = successor;
    }
    assert!(gw
        .child
        .try_wait()
        .expect("wait")
        .expect("exited")
        .success());
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    let stopping = next();
    assert!(
        stopping.lines().any(|l| l == "STOPPING=1"),
        "the last process stops as usual: {stopping:?}"
    );
    wait_until(Duration::from_secs(20), "the last process to stop", || {
        is_gone(pid)
    });
    drop(reaps);
}

/// A control with a remote worker: on the hand-over the predecessor stops accepting on the
/// bus and says `GoAway`; the worker dials again and registers with the successor, which opens
/// its HTTP listeners only then, while the predecessor serves on its old lanes. Keep-alive
/// clients of the request API and the forward proxy, all served by the remote worker, see no
/// failure.
#[test]
fn a_control_upgrades_under_load_and_its_remote_workers_follow() {
    use support::bus::{control, start_worker, wait_worker};
    let up = Upstream::start(upstream::fixed(upstream::response(200, &[], b"hello")));
    let mut gw = control("127.0.0.1:0", None).start();
    let worker = start_worker("w-remote", gw.bus.expect("bus"), None, "capacity = 64\n");
    wait_worker(&gw, "w-remote", "connected");
    let load = Load::start(&gw, &up);
    load.wait_for(50, "requests before the upgrade");
    let successor = upgrade(gw.child.id(), &gw.stdout);
    let _reap = Reap(successor);
    let status = wait_exit(&mut gw.child, Duration::from_secs(20));
    assert!(status.success(), "the old control exits 0: {status}");
    load.wait_for(50, "requests after the upgrade");
    load.finish("the upgrade");
    // The successor has the worker, and the worker redialled on the control's GoAway rather
    // than after losing its lanes.
    wait_worker(&gw, "w-remote", "connected");
    assert!(
        worker
            .output()
            .iter()
            .any(|l| l.contains("control going away: dialling it again")),
        "{:?}",
        worker.output()
    );
    std::process::Command::new("kill")
        .args(["-TERM", &successor.to_string()])
        .status()
        .expect("kill");
    wait_until(Duration::from_secs(20), "the successor to stop", || {
        is_gone(successor)
    });
}

/// A worker's binary upgrade (SIGUSR2 to `sortie worker`): the successor's lanes wait beside
/// the running worker's as a standby session, the running worker then says `GoAway`, and the
/// control switches to the successor at once. With this one worker the only one eligible, no
/// request of the keep-alive clients fails, and the control lists the successor's session.
#[test]
fn a_worker_upgrades_under_load_without_a_moment_unroutable() {
    use support::bus::{control, start_worker, wait_worker};
    let up = Upstream::start(upstream::fixed(upstream::response(200, &[], b"hello")));
    let gw = control("127.0.0.1:0", None).start();
    let mut worker = start_worker("w-up", gw.bus.expect("bus"), None, "capacity = 64\n");
    wait_worker(&gw, "w-up", "connected");
    let load = Load::start(&gw, &up);
    load.wait_for(50, "requests before the upgrade");
    let successor = upgrade(worker.child.id(), &worker.out);
    let _reap = Reap(successor);
    let status = wait_exit(&mut worker.child, Duration::from_secs(20));
    assert!(status.success(), "the old worker exits 0: {status}");
    let listed = wait_worker(&gw, "w-up", "connected");
    assert!(
        listed["session"]
            .as_str()
            .is_some_and(|s| s.starts_with('u')),
        "the successor's session is the worker's now: {listed}"
    );
    load.wait_for(50, "requests after the upgrade");
    load.finish("the worker's upgrade");
}
