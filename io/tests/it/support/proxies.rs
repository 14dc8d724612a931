//! Real upstream proxies for the tests: squid (HTTP `CONNECT`, Basic authentication through
//! `basic_ncsa_auth`) and dante (`danted`, SOCKS5 with RFC 1929 username/password checked
//! against system users), each started on a free loopback port with its own configuration in a
//! temporary directory and stopped when dropped. Their logs show the username each request
//! authenticated as.
//!
//! Missing programs fail the test with what to install (`scripts/ci-deps.sh` installs both).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a proxy may take to start listening.
const START_LIMIT: Duration = Duration::from_secs(20);

/// A free loopback port (bound and released; the proxy binds it right after).
pub fn free_port() -> u16 {
    free_ports(1)[0]
}

/// `n` free loopback ports, all different: each is held bound until all are chosen, since a
/// port released at once may be handed out again by the next bind (two servers of one
/// configuration on one port would then share it without an error).
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free loopback port"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("bound address").port())
        .collect()
}

fn require(program: &str, package: &str) -> PathBuf {
    for dir in ["/usr/sbin", "/usr/bin", "/usr/lib/squid"] {
        let p = Path::new(dir).join(program);
        if p.exists() {
            return p;
        }
    }
    panic!("{program} is missing: install the Debian package {package} (scripts/ci-deps.sh does)");
}

/// The text of every log in `logs` that exists, each under its file name.
fn read_logs(logs: &[&Path]) -> String {
    logs.iter()
        .filter_map(|p| {
            let text = std::fs::read_to_string(p).ok()?;
            Some(format!("--- {}\n{text}", p.display()))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Starts a proxy with `start` on a port [`free_port`] finds. That port was only free a moment
/// ago: another test's socket can take it before the proxy binds it, and the proxy then exits
/// saying "Address already in use". Only that failure is tried again, on another port, up to
/// five times; any other fails the test with `start`'s message.
fn on_a_free_port<T>(name: &str, start: impl Fn(u16) -> Result<T, String>) -> T {
    const ATTEMPTS: usize = 5;
    let mut last = String::new();
    for _ in 0..ATTEMPTS {
        match start(free_port()) {
            Ok(proxy) => return proxy,
            Err(e) if e.contains("Address already in use") => last = e,
            Err(e) => panic!("{e}"),
        }
    }
    panic!("{name} lost its port to another socket {ATTEMPTS} times; the last:\n{last}")
}

/// Waits until the proxy listens on `addr`; `Err` with its logs when it exited first. Fails
/// the test when it neither listens nor exits within [`START_LIMIT`].
fn wait_listening(addr: SocketAddr, child: &mut Child, logs: &[&Path]) -> Result<(), String> {
    super::wait::poll(START_LIMIT, || {
        if TcpStream::connect(addr).is_ok() {
            return Ok(Ok(()));
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Ok(Err(format!(
                "the proxy exited with {status} before listening on {addr}:\n{}",
                read_logs(logs)
            )));
        }
        Err(format!(
            "the proxy did not listen on {addr}:\n{}",
            read_logs(logs)
        ))
    })
}

fn stop(child: &mut Child) {
    // SIGTERM first so the proxy closes its helpers and listeners, then SIGKILL if it lingers.
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Polls a log file until `pred` holds on its text; returns the text. Fails after 10 s.
pub fn wait_for_log(path: &Path, what: &str, pred: impl Fn(&str) -> bool) -> String {
    super::wait::poll(Duration::from_secs(10), || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if pred(&text) {
            return Ok(text);
        }
        Err(format!(
            "{what} did not appear in {}:\n{text}",
            path.display()
        ))
    })
}

/// A squid on loopback with Basic authentication.
pub struct Squid {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Squid {
    /// Starts squid on a free port, accepting each `(user, password)`.
    pub fn start(users: &[(&str, &str)]) -> Squid {
        Squid::start_on_a_free_port(users, None)
    }

    /// Starts squid on `port`.
    pub fn start_on(port: u16, users: &[(&str, &str)]) -> Squid {
        Squid::start_with(port, users, None).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts squid speaking TLS to its clients (`https_port`) with the given PEM certificate
    /// chain and key.
    pub fn start_tls(users: &[(&str, &str)], cert_pem: &str, key_pem: &str) -> Squid {
        Squid::start_on_a_free_port(users, Some((cert_pem, key_pem)))
    }

    /// Squid on a port [`on_a_free_port`] finds; its "Address already in use" is in its cache
    /// log.
    fn start_on_a_free_port(users: &[(&str, &str)], tls: Option<(&str, &str)>) -> Squid {
        on_a_free_port("squid", |port| Squid::start_with(port, users, tls))
    }

    fn start_with(
        port: u16,
        users: &[(&str, &str)],
        tls: Option<(&str, &str)>,
    ) -> Result<Squid, String> {
        let squid = require("squid", "squid");
        let helper = require("basic_ncsa_auth", "squid");
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        // squid drops to its own user: everything it reads must be readable, and its log
        // directory writable, by that user.
        set_mode(d, 0o755);
        let mut passwd = String::new();
        for (user, password) in users {
            let out = Command::new("openssl")
                .args(["passwd", "-apr1", password])
                .output()
                .expect("openssl runs");
            assert!(out.status.success(), "openssl passwd failed");
            passwd.push_str(&format!(
                "{user}:{}\n",
                String::from_utf8_lossy(&out.stdout).trim()
            ));
        }
        std::fs::write(d.join("passwd"), passwd).expect("passwd file");
        set_mode(&d.join("passwd"), 0o644);
        let logs = d.join("logs");
        std::fs::create_dir(&logs).expect("log dir");
        set_mode(&logs, 0o777);
        let listen = match tls {
            None => format!("http_port 127.0.0.1:{port}"),
            Some((cert, key)) => {
                for (name, pem) in [("cert.pem", cert), ("key.pem", key)] {
                    std::fs::write(d.join(name), pem).expect("TLS file");
                    set_mode(&d.join(name), 0o644);
                }
                format!(
                    "https_port 127.0.0.1:{port} tls-cert={} tls-key={}",
                    d.join("cert.pem").display(),
                    d.join("key.pem").display()
                )
            }
        };
        let conf = format!(
            "{listen}\n\
             pid_filename {logs}/squid.pid\n\
             access_log stdio:{logs}/access.log squid\n\
             cache_log {logs}/cache.log\n\
             cache_store_log none\n\
             cache deny all\n\
             cache_mem 8 MB\n\
             coredump_dir {logs}\n\
             auth_param basic program {helper} {passwd}\n\
             auth_param basic realm sortie-test\n\
             auth_param basic casesensitive on\n\
             acl authed proxy_auth REQUIRED\n\
             http_access allow authed\n\
             http_access deny all\n\
             shutdown_lifetime 0 seconds\n\
             visible_hostname sortie-test\n",
            logs = logs.display(),
            helper = helper.display(),
            passwd = d.join("passwd").display(),
        );
        std::fs::write(d.join("squid.conf"), conf).expect("squid.conf");
        set_mode(&d.join("squid.conf"), 0o644);
        let out_log = d.join("out.txt");
        // Squid names its shared-memory segments after its service name: squids started at the
        // same time under the default name collide ("shm_open ... File exists") and one exits.
        static SERVICE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let service = format!(
            "sortietest{}x{}",
            std::process::id(),
            SERVICE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let mut child = Command::new(squid)
            .args(["-N", "-n", &service, "-f"])
            .arg(d.join("squid.conf"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out_log).expect("out file"))
            .stderr(std::fs::File::create(d.join("err.txt")).expect("err file"))
            .spawn()
            .expect("squid starts");
        wait_listening(
            SocketAddr::from(([127, 0, 0, 1], port)),
            &mut child,
            &[&d.join("err.txt"), &logs.join("cache.log")],
        )?;
        Ok(Squid { child, port, dir })
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The access log (`squid` format: the username is the eighth field).
    pub fn access_log(&self) -> PathBuf {
        self.dir.path().join("logs/access.log")
    }

    /// The access log's lines for method `CONNECT`, as (username, status field).
    pub fn connects(&self) -> Vec<(String, String)> {
        std::fs::read_to_string(self.access_log())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.get(5) == Some(&"CONNECT")).then(|| {
                    (
                        f.get(7).unwrap_or(&"").to_string(),
                        f.get(3).unwrap_or(&"").to_string(),
                    )
                })
            })
            .collect()
    }
}

impl Drop for Squid {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// A dante SOCKS5 server on loopback with username/password authentication against system
/// users (created by the fixture; the tests run as root).
pub struct Dante {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Dante {
    /// Starts danted on a free port ([`on_a_free_port`]), with each `(user, password)` as a
    /// system user.
    pub fn start(users: &[(&str, &str)]) -> Dante {
        for (user, password) in users {
            ensure_system_user(user, password);
        }
        on_a_free_port("danted", Dante::start_on)
    }

    fn start_on(port: u16) -> Result<Dante, String> {
        let danted = require("danted", "dante-server");
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        set_mode(d, 0o755);
        let log = d.join("danted.log");
        let conf = format!(
            "logoutput: {log}\n\
             internal: 127.0.0.1 port = {port}\n\
             external: 127.0.0.1\n\
             socksmethod: username\n\
             clientmethod: none\n\
             user.privileged: root\n\
             user.unprivileged: nobody\n\
             client pass {{\n  from: 127.0.0.0/8 to: 0.0.0.0/0\n}}\n\
             socks pass {{\n  from: 127.0.0.0/8 to: 0.0.0.0/0\n  command: connect\n  log: connect error\n}}\n",
            log = log.display(),
        );
        std::fs::write(d.join("danted.conf"), conf).expect("danted.conf");
        let mut child = Command::new(danted)
            .arg("-f")
            .arg(d.join("danted.conf"))
            .arg("-p")
            .arg(d.join("danted.pid"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join("err.txt")).expect("err file"))
            .spawn()
            .expect("danted starts");
        if let Err(e) = wait_listening(
            SocketAddr::from(([127, 0, 0, 1], port)),
            &mut child,
            &[&log, &d.join("err.txt")],
        ) {
            // Still running only when it neither listened nor exited in time.
            if matches!(child.try_wait(), Ok(None)) {
                stop(&mut child);
            }
            return Err(e);
        }
        Ok(Dante { child, port, dir })
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The log, where each passed connection names `username%USER@client`.
    pub fn log(&self) -> PathBuf {
        self.dir.path().join("danted.log")
    }

    /// Users of the connections dante passed, in order.
    pub fn users(&self) -> Vec<String> {
        std::fs::read_to_string(self.log())
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("pass(") && l.contains("tcp/connect"))
            .filter_map(|l| {
                let at = l.find("username%")? + "username%".len();
                let rest = l.get(at..)?;
                Some(rest.get(..rest.find('@')?)?.to_string())
            })
            .collect()
    }
}

impl Drop for Dante {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// Creates a system user without a home or login shell and sets its password (idempotent).
fn ensure_system_user(user: &str, password: &str) {
    let exists = Command::new("id")
        .arg(user)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !exists {
        let status = Command::new("useradd")
            .args(["-M", "-N", "-s", "/usr/sbin/nologin", user])
            .status()
            .expect("useradd runs");
        assert!(
            status.success(),
            "useradd {user} failed: the SOCKS5 tests need root to create their dante users"
        );
    }
    let mut chpasswd = Command::new("chpasswd")
        .stdin(Stdio::piped())
        .spawn()
        .expect("chpasswd runs");
    use std::io::Write as _;
    chpasswd
        .stdin
        .take()
        .expect("stdin")
        .write_all(format!("{user}:{password}\n").as_bytes())
        .expect("chpasswd input");
    assert!(chpasswd.wait().expect("chpasswd ends").success());
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// The failure [`on_a_free_port`] tries again is the one danted reports when its port is taken,
/// taken here as the race takes it, by the local end of another connection.
#[test]
fn dante_on_a_taken_port_says_so() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let client = TcpStream::connect(listener.local_addr().expect("its address")).expect("connects");
    let port = client.local_addr().expect("the client's address").port();
    match Dante::start_on(port) {
        Ok(_) => panic!("danted listened on a port another socket holds"),
        Err(e) => assert!(e.contains("Address already in use"), "{e}"),
    }
}

/// The failure [`on_a_free_port`] tries again is the one squid reports when its
/// port is taken: an exit before listening, with "Address already in use" in its cache log.
/// Taken here as the race takes it, by the local end of another connection.
#[test]
fn squid_on_a_taken_port_says_so() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let client = TcpStream::connect(listener.local_addr().expect("its address")).expect("connects");
    let port = client.local_addr().expect("the client's address").port();
    match Squid::start_with(port, &[("user", "password")], None) {
        Ok(_) => panic!("squid listened on a port another socket holds"),
        Err(e) => assert!(e.contains("Address already in use"), "{e}"),
    }
}
