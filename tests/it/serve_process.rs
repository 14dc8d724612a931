//! Black-box tests of the `sortie serve` process: the zero-config first start (data dir, tokens
//! shown once), configuration errors, graceful shutdown with a request in flight, the legacy
//! epoll driver, and life under systemd (notifications, socket activation, the packaged
//! units).

use crate::support;

use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::gate::Gate;
use support::gateway::{
    http, temp_dir, wait_until, Gateway, ADMIN_TOKEN, DEPLOYMENT_TOKEN, LOOPBACK_SNAPSHOT,
};
use support::proxies::{free_port, free_ports};
use support::upstream::{self, Upstream};

/// How long a process gets to print its banner or to exit.
const PROCESS_LIMIT: Duration = Duration::from_secs(30);

/// A `sortie` process started by a test, with its stdout and stderr lines (stderr prefixed
/// `stderr: `) on one channel. Killed when dropped.
struct Proc {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Proc {
    fn start(args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> Proc {
        Proc::start_program(env!("CARGO_BIN_EXE_sortie"), args, cwd, env)
    }

    fn start_program(program: &str, args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> Proc {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_remove("RUST_LOG");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn sortie");
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().expect("stdout");
        let err = child.stderr.take().expect("stderr");
        let tx2 = tx.clone();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx2.send(format!("stderr: {l}"));
            }
        });
        Proc {
            child,
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// Reads lines until one satisfies `f`; `None` if the process ended (or the limit passed)
    /// first. Every line read is kept in `seen`.
    fn until(&mut self, f: impl Fn(&str) -> bool) -> Option<String> {
        let deadline = Instant::now() + PROCESS_LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if f(&l) {
                        return Some(l);
                    }
                }
                Err(_) => return None,
            }
        }
    }

    /// Like [`Proc::until`], but a line already read counts too (stdout and stderr lines
    /// interleave in no fixed order).
    fn find(&mut self, f: impl Fn(&str) -> bool) -> Option<String> {
        if let Some(l) = self.seen.iter().find(|l| f(l)) {
            return Some(l.clone());
        }
        self.until(f)
    }

    /// Waits for the exit status, then drains the remaining output into `seen`.
    fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + PROCESS_LIMIT;
        let status = loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("sortie did not exit; output:\n{}", self.seen.join("\n"));
            }
            std::thread::park_timeout(Duration::from_millis(20));
        };
        // The reader threads end at EOF, which follows the exit.
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(l);
        }
        status
    }

    fn sigterm(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(ok.success());
    }

    /// The API listener's address, from the banner.
    fn api_addr(&mut self) -> SocketAddr {
        self.until(|l| l.trim_start().starts_with("api:"))
            .and_then(|l| banner_addr(&l))
            .expect("api address")
    }

    fn output(&self) -> String {
        self.seen.join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address in a banner line such as `  api:       http://127.0.0.1:8080  (listening)`.
fn banner_addr(line: &str) -> Option<SocketAddr> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("http://"))
        .and_then(|a| a.parse().ok())
}

fn is_free(addr: &str) -> bool {
    TcpListener::bind(addr).is_ok()
}

/// A config like the harness writes: loopback listeners on kernel-chosen ports, known tokens.
fn write_config(dir: &Path, extra: &str) -> PathBuf {
    let snapshot = dir.join("bootstrap.json");
    std::fs::write(&snapshot, LOOPBACK_SNAPSHOT).expect("write snapshot");
    let config = format!(
        "[control]\napi_listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ncores = 2\n\
         data_dir = {:?}\nbootstrap_snapshot = {:?}\n\n[[deployments]]\nid = \"dep_test\"\n\
         token = \"{DEPLOYMENT_TOKEN}\"\n\n[admin]\ntoken = \"{ADMIN_TOKEN}\"\n\n{extra}",
        dir.join("data").display().to_string(),
        snapshot.display().to_string(),
    );
    let path = dir.join("sortie.toml");
    std::fs::write(&path, config).expect("write config");
    path
}

fn envelope_with(addr: SocketAddr, token: &str, envelope: &Value) -> support::gateway::Resp {
    let auth = format!("Bearer {token}");
    http(
        addr,
        "POST",
        "/api/v1/requests",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        envelope.to_string().as_bytes(),
    )
}

/// The token printed on a banner line such as `    deployment dep_default: sdt_...`.
fn token_after(line: &str, label: &str) -> String {
    line.trim()
        .strip_prefix(label)
        .map(|t| t.trim().to_string())
        .unwrap_or_else(|| panic!("no {label} in {line:?}"))
}

#[test]
fn serve_without_config_creates_the_data_dir_and_shows_tokens_once() {
    let (api, admin, proxy) = ("127.0.0.1:8080", "127.0.0.1:8081", "127.0.0.1:3128");
    assert!(
        is_free(api) && is_free(admin) && is_free(proxy),
        "this test starts the gateway without a config file, on its default ports {api}, \
         {admin} and {proxy}: stop what listens there"
    );
    let cwd = temp_dir("nocfg");
    let mut p = Proc::start(&["serve"], &cwd, &[]);
    let Some(header) = p.until(|l| l.contains("tokens generated") || l.contains("stderr: sortie:"))
    else {
        panic!("no banner:\n{}", p.output());
    };
    assert!(
        !(header.contains("stderr: sortie:") && header.contains("in use")),
        "a default port was taken while the gateway started: {header}"
    );
    assert!(header.contains("tokens generated"), "{}", p.output());
    let dep_line = p
        .until(|l| l.trim_start().starts_with("deployment dep_default:"))
        .expect("token line");
    let admin_line = p
        .until(|l| l.trim_start().starts_with("admin: ") && !l.contains("http://"))
        .expect("admin token line");
    let deployment = token_after(&dep_line, "deployment dep_default:");
    let admin_token = token_after(&admin_line, "admin:");
    assert!(
        deployment.starts_with("sdt_") && deployment.len() > 20,
        "{deployment}"
    );
    assert!(
        admin_token.starts_with("sat_") && admin_token.len() > 20,
        "{admin_token}"
    );
    let banner = p.output();
    assert!(banner.contains("embedded defaults"), "{banner}");
    assert!(banner.contains("http://127.0.0.1:8080"), "{banner}");
    assert!(banner.contains("http://127.0.0.1:8081"), "{banner}");
    assert!(
        banner.contains("proxy:     http://127.0.0.1:3128"),
        "{banner}"
    );

    let data = cwd.join("sortie-data");
    let tokens = data.join("tokens.toml");
    let mode = std::fs::metadata(&tokens)
        .expect("tokens.toml")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "tokens.toml mode {mode:o}");
    let dmode = std::fs::metadata(&data)
        .expect("data dir")
        .permissions()
        .mode();
    assert_eq!(dmode & 0o077, 0, "data dir mode {dmode:o}");
    let stored = std::fs::read_to_string(&tokens).expect("read tokens");
    assert!(stored.contains(&deployment) && stored.contains(&admin_token));

    // The printed tokens work. The default snapshot denies loopback: the request gets as far
    // as the destination policy.
    let api_addr: SocketAddr = api.parse().expect("addr");
    let env = json!({"method": "GET", "url": "http://127.0.0.1:9/"});
    let r = envelope_with(api_addr, &deployment, &env);
    assert_eq!(r.status, 403, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["code"], "destination_denied");
    let r = envelope_with(api_addr, &admin_token, &env);
    assert_eq!(r.status, 401, "the admin token is not a deployment token");
    // The forward proxy of the embedded defaults answers on loopback with the deployment's
    // Basic credentials (the README's `curl -x` lines), up to the same destination policy.
    let mut s = std::net::TcpStream::connect(proxy).expect("the proxy listener");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("read timeout");
    use base64::Engine as _;
    let basic =
        base64::engine::general_purpose::STANDARD.encode(format!("dep_default:{deployment}"));
    std::io::Write::write_all(
        &mut s,
        format!(
            "GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\
             Proxy-Authorization: Basic {basic}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .expect("send through the proxy");
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut s, &mut raw).expect("the proxy's answer");
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 403"), "{text}");
    assert!(text.contains("destination_denied"), "{text}");
    let r = http(
        admin.parse().expect("addr"),
        "GET",
        "/api/v1/admin/config",
        &[("Authorization", &format!("Bearer {admin_token}"))],
        b"",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["revision"], 1);

    p.sigterm();
    let status = p.wait();
    assert!(status.success(), "exit {status:?}:\n{}", p.output());

    // Second start: the same tokens, never printed in full again.
    let mut p = Proc::start(&["serve"], &cwd, &[]);
    p.until(|l| l.trim_start().starts_with("admin:"))
        .expect("banner");
    p.until(|l| l.trim_start().starts_with("deployment dep_default:"))
        .expect("redacted token line");
    let r = envelope_with(api_addr, &deployment, &env);
    assert_eq!(r.status, 403, "tokens survive a restart");
    p.sigterm();
    assert!(p.wait().success());
    let out = p.output();
    assert!(
        !out.contains(&deployment),
        "deployment token printed again:\n{out}"
    );
    assert!(
        !out.contains(&admin_token),
        "admin token printed again:\n{out}"
    );
    assert!(out.contains("tokens.toml"), "{out}");
    assert_eq!(std::fs::read_to_string(&tokens).expect("tokens"), stored);
}

#[test]
fn tokens_are_shown_by_the_first_start_that_succeeds() {
    // A first start that fails (here: the API port is taken) must not swallow the one showing
    // of the generated tokens.
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let cwd = temp_dir("firstfail");
    let cfg = |api: &str| {
        format!("[control]\napi_listen = \"{api}\"\nadmin_listen = \"127.0.0.1:0\"\ncores = 1\n")
    };
    std::fs::write(
        cwd.join("a.toml"),
        cfg(&taken.local_addr().expect("addr").to_string()),
    )
    .expect("config");
    std::fs::write(cwd.join("b.toml"), cfg("127.0.0.1:0")).expect("config");
    let mut p = Proc::start(&["serve", "--config", "a.toml"], &cwd, &[]);
    let status = p.wait();
    assert!(!status.success());
    assert!(p.output().contains("control.api_listen"), "{}", p.output());
    assert!(!p.output().contains("sdt_"), "{}", p.output());

    let mut p = Proc::start(&["serve", "--config", "b.toml"], &cwd, &[]);
    let line = p
        .until(|l| l.contains("tokens generated") || l.trim_start().starts_with("tokens:"))
        .unwrap_or_else(|| panic!("no token banner:\n{}", p.output()));
    assert!(line.contains("tokens generated"), "{}", p.output());
    let dep = p
        .until(|l| l.trim_start().starts_with("deployment dep_default:"))
        .expect("token line");
    let token = token_after(&dep, "deployment dep_default:");
    let stored = std::fs::read_to_string(cwd.join("sortie-data/tokens.toml")).expect("tokens");
    assert!(
        stored.contains(&token),
        "the printed token is the stored one"
    );
    p.sigterm();
    assert!(p.wait().success());
}

#[test]
fn bad_configs_exit_non_zero_naming_the_key() {
    let dir = temp_dir("badcfg");
    let bad_snapshot = dir.join("bad-snapshot.json");
    std::fs::write(&bad_snapshot, b"{\"default_timeout_ms\": 1}").expect("write");
    // Listeners on port 0 so that a config that gets as far as binding never collides.
    let listen = "api_listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n";
    let cases: Vec<(&str, String, &str)> = vec![
        ("cores", "[control]\ncores = 5000\n".into(), "control.cores"),
        (
            "listen address",
            "[control]\napi_listen = \"nope\"\n".into(),
            "control.api_listen",
        ),
        (
            "timeout cap",
            "[control.request]\nmax_timeout_ms = 10\n".into(),
            "control.request.max_timeout_ms",
        ),
        (
            "inline limit",
            "[control.request]\nmax_inline_request_body_bytes = 999999999\n".into(),
            "control.request.max_inline_request_body_bytes",
        ),
        (
            "worker capacity",
            "[[workers]]\nid = \"w\"\ncapacity = 0\n".into(),
            "workers[0].capacity",
        ),
        (
            "worker country",
            "[[workers]]\nid = \"w\"\n\n[[workers]]\nid = \"v\"\ncountry = \"USA\"\n".into(),
            "workers[1].country",
        ),
        (
            "bind address",
            "[[workers]]\nid = \"w\"\nbind_address = \"127.0.0.1:80\"\n".into(),
            "workers[0].bind_address",
        ),
        (
            "duplicate worker",
            "[[workers]]\nid = \"w\"\n[[workers]]\nid = \"w\"\n".into(),
            "workers[1].id",
        ),
        ("unknown key", "[control]\nbogus = 1\n".into(), "line 2"),
        ("not TOML", "[control\n".into(), "line 1"),
        (
            "missing bootstrap snapshot",
            format!("[control]\n{listen}bootstrap_snapshot = \"/nonexistent/snapshot.json\"\n"),
            "control.bootstrap_snapshot",
        ),
        (
            "invalid bootstrap snapshot",
            format!(
                "[control]\n{listen}bootstrap_snapshot = {:?}\n",
                bad_snapshot.display().to_string()
            ),
            "control.bootstrap_snapshot",
        ),
        (
            "missing CA file",
            format!("[control]\n{listen}\n[egress]\nca_file = \"/nonexistent/ca.pem\"\n"),
            "egress.ca_file",
        ),
        (
            "object storage credentials",
            format!(
                "[control]\n{listen}\n[object_storage]\nenabled = true\nbackend = \"s3\"\n\
                 bucket = \"b\"\nendpoint = \"http://127.0.0.1:9\"\n\
                 access_key_env = \"SORTIE_TEST_UNSET_ACCESS_KEY\"\n\
                 secret_key_env = \"SORTIE_TEST_UNSET_SECRET_KEY\"\n"
            ),
            "object_storage.access_key_env",
        ),
    ];
    for (i, (name, toml, key)) in cases.iter().enumerate() {
        let case_dir = dir.join(format!("case{i}"));
        std::fs::create_dir_all(&case_dir).expect("dir");
        let file = case_dir.join("sortie.toml");
        std::fs::write(&file, toml).expect("write config");
        let mut p = Proc::start(&["serve", "--config", "sortie.toml"], &case_dir, &[]);
        let status = p.wait();
        let out = p.output();
        assert_eq!(status.code(), Some(1), "{name}: {out}");
        let err_line = p
            .seen
            .iter()
            .find(|l| l.contains(key))
            .unwrap_or_else(|| panic!("{name}: {key} not named in:\n{out}"));
        assert!(err_line.starts_with("stderr: "), "{name}: {err_line}");
        assert!(!out.contains("listening"), "{name}: started anyway:\n{out}");
    }
    let mut p = Proc::start(
        &["serve", "--config", "/nonexistent/sortie.toml"],
        &dir,
        &[],
    );
    let status = p.wait();
    assert_eq!(status.code(), Some(2), "{}", p.output());
    assert!(
        p.output().contains("/nonexistent/sortie.toml"),
        "{}",
        p.output()
    );
}

#[test]
fn check_config_reports_the_same_keys() {
    let dir = temp_dir("checkcfg");
    let file = dir.join("bad.toml");
    std::fs::write(&file, "[[workers]]\nid = \"w\"\ncapacity = 0\n").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_sortie"))
        .arg("check-config")
        .arg(&file)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("workers[0].capacity"));
    let good = write_config(&dir, "");
    let out = Command::new(env!("CARGO_BIN_EXE_sortie"))
        .arg("check-config")
        .arg(&good)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sigterm_lets_the_in_flight_request_finish_then_exits_0() {
    let gate = Gate::new();
    let up = Upstream::start(gate.script(upstream::echo()));
    let mut gw = Gateway::start();
    let api = gw.api;
    let url = up.url("/in-flight");
    let caller = std::thread::spawn(move || {
        envelope_with(api, DEPLOYMENT_TOKEN, &json!({"method": "GET", "url": url}))
    });
    wait_until(
        Duration::from_secs(10),
        "the request to reach the upstream",
        || up.requests() == 1,
    );
    let ok = Command::new("kill")
        .args(["-TERM", &gw.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(ok.success());
    let deadline = Instant::now() + PROCESS_LIMIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = gw.stdout.recv_timeout(left).expect("shutdown log line");
        if line.contains("shutting down") {
            break;
        }
    }
    // New connections are refused once the listeners close.
    wait_until(Duration::from_secs(10), "the API listener to close", || {
        std::net::TcpStream::connect(api).is_err()
    });
    // Shutdown has begun and the request is still held upstream: let it finish.
    assert!(!caller.is_finished());
    gate.open();
    let r = caller.join().expect("caller");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("connection"), Some("close"));
    let v = r.json();
    assert_eq!(v["status"], 200);
    let status = gw.terminate();
    assert!(status.success(), "exit status {status:?}");
}

#[test]
fn legacy_epoll_driver_serves_requests() {
    let up = Upstream::start(upstream::echo());
    let dir = temp_dir("epoll");
    let cfg = write_config(&dir, "");
    let cfg = cfg.display().to_string();
    let mut p = Proc::start(
        &["serve", "--config", &cfg],
        &dir,
        &[("MONOIO_FORCE_LEGACY_DRIVER", "1")],
    );
    let cores = p
        .until(|l| l.trim_start().starts_with("cores:"))
        .expect("banner");
    assert!(cores.contains("(epoll)"), "{cores}");
    let api = p.api_addr();
    let r = envelope_with(
        api,
        DEPLOYMENT_TOKEN,
        &json!({"method": "POST", "url": up.url("/e"),
        "body": {"mode": "inline_base64", "data_base64": "aGk="}}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["status"], 200);
    let r = envelope_with(api, "wrong", &json!({"method": "GET", "url": up.url("/")}));
    assert_eq!(r.status, 401);
    p.find(|l| l.contains("using the epoll driver"))
        .expect("the fallback is logged");
    p.sigterm();
    assert!(p.wait().success(), "{}", p.output());
}

/// The usual soft open-file limit (1024, or less) would cap the gateway at a few hundred
/// requests in flight: `serve` raises it to the hard limit and says so in its banner.
#[test]
fn serve_raises_the_soft_open_file_limit() {
    let hard = std::fs::read_to_string("/proc/self/limits")
        .expect("limits")
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(4).map(str::to_string))
        .expect("hard limit");
    let dir = temp_dir("nofile");
    let cfg = write_config(&dir, "");
    let cfg = cfg.display().to_string();
    let mut p = Proc::start_program(
        "sh",
        &[
            "-c",
            "ulimit -Sn 256 && exec \"$0\" \"$@\"",
            env!("CARGO_BIN_EXE_sortie"),
            "serve",
            "--config",
            &cfg,
        ],
        &dir,
        &[],
    );
    let line = p
        .until(|l| l.trim_start().starts_with("fd limit:"))
        .expect("banner");
    let shown = line.split_whitespace().nth(2).expect("limit").to_string();
    if hard == "unlimited" {
        assert_ne!(shown, "256", "{line}");
    } else {
        assert_eq!(shown, hard, "{line}");
    }
    p.sigterm();
    assert!(p.wait().success(), "{}", p.output());
}

/// Decision 041: a panic on a hot core stops the whole process with exit status 70 and a log
/// line saying so, rather than leaving a live process with a dead core. The debug build's
/// `SORTIE_DEBUG_PANIC_CORE` makes core 0 panic shortly after the start.
#[test]
fn a_panic_on_a_core_stops_the_process_with_status_70() {
    let dir = temp_dir("core-panic");
    let config = write_config(&dir, "");
    let config = config.to_str().expect("utf-8 path");
    let mut p = Proc::start(
        &["serve", "--config", config],
        &dir,
        &[("SORTIE_DEBUG_PANIC_CORE", "0")],
    );
    assert!(
        p.until(|l| l.trim_start().starts_with("api:")).is_some(),
        "no banner:\n{}",
        p.output()
    );
    let status = p.wait();
    assert_eq!(status.code(), Some(70), "{status:?}:\n{}", p.output());
    let out = p.output();
    assert!(
        out.contains("panicked") && out.contains("SORTIE_DEBUG_PANIC_CORE"),
        "{out}"
    );
    assert!(
        out.contains("a core thread panicked: stopping the process"),
        "{out}"
    );
}

/// `log.format = "json"` (decision 107): every log line on stderr is one JSON object with the
/// time, level and message at the top level, and per-request lines carry their fields; no
/// token appears in the log, even at debug level.
#[test]
fn json_logs_are_one_object_per_line_without_secrets() {
    let up = Upstream::start(upstream::echo());
    let dir = temp_dir("jsonlog");
    let cfg = write_config(&dir, "[log]\nformat = \"json\"\n");
    let cfg = cfg.display().to_string();
    let mut p = Proc::start(&["serve", "--config", &cfg], &dir, &[("RUST_LOG", "debug")]);
    let api = p.api_addr();
    let r = envelope_with(
        api,
        DEPLOYMENT_TOKEN,
        &json!({"method": "GET", "url": up.url("/j")}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = envelope_with(
        api,
        "wrong-token-value",
        &json!({"method": "GET", "url": up.url("/")}),
    );
    assert_eq!(r.status, 401);
    p.find(|l| l.starts_with("stderr: {") && l.contains("request_id"))
        .expect("a per-request line with its fields");
    p.sigterm();
    let status = p.wait();
    assert!(status.success(), "{status:?}");
    let mut lines = 0;
    for line in p
        .output()
        .lines()
        .filter_map(|l| l.strip_prefix("stderr: "))
    {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not one JSON object per line ({e}): {line}"));
        assert!(
            v["timestamp"].is_string() && v["level"].is_string(),
            "{line}"
        );
        assert!(v["message"].is_string(), "{line}");
        assert!(
            !line.contains(DEPLOYMENT_TOKEN) && !line.contains(ADMIN_TOKEN),
            "{line}"
        );
        assert!(!line.contains("wrong-token-value"), "{line}");
        lines += 1;
    }
    assert!(lines >= 3, "{}", p.output());
}

/// A tool of the systemd package, or a failure that says what to install.
fn systemd_tool(name: &str) -> PathBuf {
    for dir in ["/usr/bin", "/bin", "/usr/local/bin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("{name} is missing: install the systemd package (scripts/ci-deps.sh does)");
}

/// Under systemd (`Type=notify`): `READY=1` once the listeners are bound (the API answers at
/// that moment), `WATCHDOG=1` at half the `WATCHDOG_USEC` interval while the cores turn, and
/// `STOPPING=1` when SIGTERM starts the drain; the process still exits 0.
#[test]
fn serve_notifies_systemd_ready_watchdog_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let dir = temp_dir("notify");
    let config = write_config(&dir, "");
    let socket_path = dir.join("notify.sock");
    let notify = UnixDatagram::bind(&socket_path).expect("notify socket");
    notify
        .set_read_timeout(Some(PROCESS_LIMIT))
        .expect("timeout");
    let mut p = Proc::start(
        &["serve", "--config", config.to_str().unwrap()],
        &dir,
        &[
            ("NOTIFY_SOCKET", socket_path.to_str().unwrap()),
            ("WATCHDOG_USEC", "400000"),
        ],
    );
    let next = || {
        let mut buf = [0u8; 4096];
        let n = notify.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).trim_end().to_string()
    };
    let ready = next();
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(
        ready
            .lines()
            .any(|l| l.starts_with("STATUS=serving the API on 127.0.0.1:")),
        "{ready:?}"
    );
    let api = p.api_addr();
    assert!(std::net::TcpStream::connect(api).is_ok(), "API at READY");
    // Pings at half the interval: several within a second.
    let started = Instant::now();
    for _ in 0..3 {
        assert_eq!(next(), "WATCHDOG=1");
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    p.sigterm();
    let stopping = loop {
        let m = next();
        if m != "WATCHDOG=1" {
            break m;
        }
    };
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    let status = p.wait();
    assert!(status.success(), "{status:?}\n{}", p.output());
}

/// Socket activation: the listeners passed by the service manager (`LISTEN_FDS`, named by
/// `FileDescriptorName=`) are served instead of the configured addresses, here through
/// `systemd-socket-activate`, which binds two ports and starts the gateway at the first
/// connection.
#[test]
fn serve_takes_its_listeners_from_socket_activation() {
    let up = Upstream::start(upstream::echo());
    let dir = temp_dir("activation");
    let config = write_config(&dir, "");
    let ports = free_ports(2);
    let (api_port, admin_port) = (ports[0], ports[1]);
    let tool = systemd_tool("systemd-socket-activate");
    let api_arg = format!("127.0.0.1:{api_port}");
    let admin_arg = format!("127.0.0.1:{admin_port}");
    let mut p = Proc::start_program(
        tool.to_str().unwrap(),
        &[
            "-l",
            &api_arg,
            "-l",
            &admin_arg,
            "--fdname=api:admin",
            env!("CARGO_BIN_EXE_sortie"),
            "serve",
            "--config",
            config.to_str().unwrap(),
        ],
        &dir,
        &[],
    );
    let api: SocketAddr = api_arg.parse().unwrap();
    // The first connection starts the gateway; it waits in the passed socket's queue.
    wait_until(
        Duration::from_secs(10),
        "systemd-socket-activate to listen",
        || std::net::TcpStream::connect(api).is_ok(),
    );
    let r = envelope_with(
        api,
        DEPLOYMENT_TOKEN,
        &json!({"method": "GET", "url": up.url("/activated")}),
    );
    assert_eq!(r.status, 200, "{}\n{}", r.text(), p.output());
    assert_eq!(r.json()["status"], 200);
    assert_eq!(p.api_addr(), api, "{}", p.output());
    let admin: SocketAddr = admin_arg.parse().unwrap();
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let r = http(
        admin,
        "GET",
        "/api/v1/admin/workers",
        &[("Authorization", &auth)],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    p.sigterm();
    let status = p.wait();
    assert!(status.success(), "{status:?}\n{}", p.output());
}

/// The packaged units are valid for systemd (`systemd-analyze verify`, with `ExecStart`
/// pointed at this build).
#[test]
fn packaged_systemd_units_verify() {
    let tool = systemd_tool("systemd-analyze");
    let dir = temp_dir("units");
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/systemd");
    let mut names = Vec::new();
    for e in std::fs::read_dir(&units).expect("packaging/systemd") {
        let e = e.expect("entry");
        let name = e.file_name().to_string_lossy().to_string();
        let text = std::fs::read_to_string(e.path())
            .expect("unit")
            .replace("/usr/bin/sortie", env!("CARGO_BIN_EXE_sortie"));
        std::fs::write(dir.join(&name), text).expect("copy unit");
        names.push(name);
    }
    names.sort();
    assert_eq!(
        names,
        [
            "sortie-admin.socket",
            "sortie-api.socket",
            "sortie-control.service",
            "sortie-proxy.socket",
            "sortie-worker.service",
            "sortie.service"
        ]
    );
    let out = Command::new(tool)
        .arg("verify")
        .arg("--man=no")
        .args(names.iter().map(|n| format!("./{n}")))
        .current_dir(&dir)
        .output()
        .expect("run systemd-analyze");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && text.trim().is_empty(), "{text}");
}

/// Sends `head` (with `Proxy-Authorization` for the test deployment unless `auth` is false) to
/// the forward proxy at `proxy` and returns the first line of the answer.
fn through_proxy(proxy: SocketAddr, head: &str, auth: bool) -> String {
    use base64::Engine as _;
    let basic =
        base64::engine::general_purpose::STANDARD.encode(format!("dep_test:{DEPLOYMENT_TOKEN}"));
    let auth = if auth {
        format!("Proxy-Authorization: Basic {basic}\r\n")
    } else {
        String::new()
    };
    let mut s = std::net::TcpStream::connect(proxy).expect("the proxy listener");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let text = head.replacen(
        "\r\n\r\n",
        &format!("\r\n{auth}Connection: close\r\n\r\n"),
        1,
    );
    std::io::Write::write_all(&mut s, text.as_bytes()).expect("send through the proxy");
    let mut buf = [0u8; 512];
    let n = std::io::Read::read(&mut s, &mut buf).expect("the proxy's answer");
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// `log.access = true`: one `access` line per request of the request API, the forward proxy
/// and CONNECT, with its fields, in JSON here; destinations by scheme, host and port only, so
/// neither a query's secret nor a credential appears anywhere in the log.
#[test]
fn the_access_log_has_a_line_per_request_and_no_secrets() {
    let up = Upstream::start(upstream::echo());
    let dir = temp_dir("accesslog");
    let proxy_port = free_port();
    let cfg = write_config(&dir, "[log]\nformat = \"json\"\naccess = true\n");
    // The proxy listener, in the [control] table the harness wrote first.
    let text = std::fs::read_to_string(&cfg).expect("config").replacen(
        "cores = 2\n",
        &format!("cores = 2\nproxy_listen = \"127.0.0.1:{proxy_port}\"\n"),
        1,
    );
    std::fs::write(&cfg, text).expect("config");
    let cfg = cfg.display().to_string();
    let mut p = Proc::start(&["serve", "--config", &cfg], &dir, &[]);
    let api = p.api_addr();
    let secret_url = up.url("/a?api_key=QUERYSECRET");
    let r = envelope_with(
        api,
        DEPLOYMENT_TOKEN,
        &json!({"method": "GET", "url": secret_url}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let request_id = r.json()["request_id"]
        .as_str()
        .expect("request_id")
        .to_string();
    let r = envelope_with(
        api,
        DEPLOYMENT_TOKEN,
        &json!({"method": "GET", "url": "ftp://x/"}),
    );
    assert_eq!(r.status, 400);
    let proxy: SocketAddr = format!("127.0.0.1:{proxy_port}").parse().unwrap();
    let port = up.port();
    let first = through_proxy(
        proxy,
        &format!("GET http://127.0.0.1:{port}/p?token=QUERYSECRET HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"),
        true,
    );
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    let first = through_proxy(
        proxy,
        &format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"),
        true,
    );
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    let first = through_proxy(
        proxy,
        &format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"),
        false,
    );
    assert!(first.starts_with("HTTP/1.1 407"), "{first}");
    p.find(|l| l.contains("\"message\":\"access\"") && l.contains("\"status\":407"))
        .expect("the refused request's access line");
    p.sigterm();
    assert!(p.wait().success(), "{}", p.output());

    let access: Vec<Value> = p
        .output()
        .lines()
        .filter_map(|l| l.strip_prefix("stderr: "))
        .map(|l| {
            assert!(!l.contains("QUERYSECRET"), "{l}");
            assert!(
                !l.contains(DEPLOYMENT_TOKEN) && !l.contains(ADMIN_TOKEN),
                "{l}"
            );
            serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"))
        })
        .filter(|v| v["message"] == "access")
        .collect();
    let summary: Vec<(String, String, String, u64, String)> = access
        .iter()
        .map(|v| {
            (
                v["ingress"].as_str().unwrap_or("?").to_string(),
                v["method"].as_str().unwrap_or("?").to_string(),
                v["destination"].as_str().unwrap_or("?").to_string(),
                v["status"].as_u64().unwrap_or(0),
                v["outcome"].as_str().unwrap_or("?").to_string(),
            )
        })
        .collect();
    let dest = format!("http://127.0.0.1:{port}");
    let s = |a: &str, b: &str, c: &str, d: u64, e: &str| {
        (
            a.to_string(),
            b.to_string(),
            c.to_string(),
            d,
            e.to_string(),
        )
    };
    assert_eq!(
        summary,
        [
            s("api", "GET", &dest, 200, "ok"),
            s("api", "-", "-", 400, "invalid_request"),
            s("proxy", "GET", &dest, 200, "ok"),
            s(
                "connect",
                "CONNECT",
                &format!("127.0.0.1:{port}"),
                200,
                "ok"
            ),
            s("proxy", "GET", &dest, 407, "auth_failure"),
        ],
        "{access:?}"
    );
    let first = &access[0];
    assert_eq!(first["request_id"], request_id.as_str());
    assert_eq!(first["deployment"], "dep_test");
    assert!(first["duration_ms"].is_u64(), "{first}");
}

/// One request API call on an open keep-alive connection; the status.
fn envelope_on(s: &mut std::net::TcpStream, token: &str, envelope: &Value) -> u16 {
    use std::io::{Read as _, Write as _};
    let body = envelope.to_string();
    let head = format!(
        "POST /api/v1/requests HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(format!("{head}{body}").as_bytes())
        .expect("send");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).expect("read the answer");
        assert!(
            n > 0,
            "the connection closed: {}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let len: usize = text[..end]
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                assert!(!text[..end]
                    .to_ascii_lowercase()
                    .contains("connection: close"));
                return text[9..12].parse().expect("status");
            }
        }
    }
}

/// SIGHUP reads the file again: new deployment and admin tokens and `log.access` apply at once,
/// a keep-alive connection opened before goes on; keys that need a restart are named and keep
/// their running values; a file that does not parse changes nothing.
/// Sends SIGHUP to the gateway.
fn hup(p: &Proc) {
    let ok = Command::new("kill")
        .args(["-HUP", &p.child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(ok.success());
}

/// SIGHUP also changes the log's level and format, and the server limits of connections
/// accepted from then on; a filter the log cannot use refuses the whole reload.
#[test]
fn sighup_reloads_log_level_format_and_server_limits() {
    let up = Upstream::start(upstream::echo());
    let dir = temp_dir("reload-log");
    let cfg = write_config(&dir, "[log]\nlevel = \"warn\"\n");
    let original = std::fs::read_to_string(&cfg)
        .expect("config")
        .replace("cores = 2", "cores = 1");
    std::fs::write(&cfg, &original).expect("one core");
    let cfg_arg = cfg.display().to_string();
    let mut p = Proc::start(&["serve", "--config", &cfg_arg], &dir, &[]);
    let api = p.api_addr();
    let env = json!({"method": "GET", "url": up.url("/r")});
    let mut kept = std::net::TcpStream::connect(api).expect("connect");
    kept.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    assert_eq!(envelope_on(&mut kept, DEPLOYMENT_TOKEN, &env), 200);
    // Before: a second connection beside the kept one is served.
    assert_eq!(envelope_with(api, DEPLOYMENT_TOKEN, &env).status, 200);
    let changed = original.replace("level = \"warn\"", "level = \"info\"\nformat = \"json\"")
        + "\n[control.server]\nmax_connections_per_core = 1\n";
    std::fs::write(&cfg, changed).expect("rewrite config");
    hup(&p);
    let line = p
        .until(|l| l.contains("configuration reloaded"))
        .unwrap_or_else(|| panic!("no reload line:\n{}", p.output()));
    // At level warn the info line would not be written at all; in JSON it is an object.
    let v: Value = serde_json::from_str(line.trim_start_matches("stderr: "))
        .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
    assert_eq!(v["level"], "INFO", "{line}");
    assert!(
        p.find(|l| l.contains("control.server") && l.contains("restart"))
            .is_none(),
        "control.server is not a restart key any more:\n{}",
        p.output()
    );
    // After: the kept connection goes on; a new one is over the per-core limit of 1.
    assert_eq!(envelope_on(&mut kept, DEPLOYMENT_TOKEN, &env), 200);
    let over = envelope_with(api, DEPLOYMENT_TOKEN, &env);
    assert_eq!(over.status, 503, "{}", over.text());
    assert!(
        over.text().contains("too_many_connections"),
        "{}",
        over.text()
    );

    // A filter the log cannot use refuses the reload: the limit stays.
    let broken = std::fs::read_to_string(&cfg)
        .expect("config")
        .replace("level = \"info\"", "level = \"info,a=b=c\"");
    std::fs::write(&cfg, broken).expect("rewrite config");
    hup(&p);
    p.until(|l| l.contains("configuration not reloaded") && l.contains("log.level"))
        .unwrap_or_else(|| panic!("no refusal naming log.level:\n{}", p.output()));
    assert_eq!(envelope_with(api, DEPLOYMENT_TOKEN, &env).status, 503);
    drop(kept);
    p.sigterm();
    assert!(p.wait().success(), "{}", p.output());
}

#[test]
fn sighup_reloads_tokens_and_keeps_connections() {
    const NEW_DEPLOYMENT_TOKEN: &str = "reloaded-deployment-token-0123456789";
    const NEW_ADMIN_TOKEN: &str = "reloaded-admin-token-0123456789abcd";
    let up = Upstream::start(upstream::echo());
    let dir = temp_dir("reload");
    let cfg = write_config(&dir, "");
    let original = std::fs::read_to_string(&cfg).expect("config");
    let cfg_arg = cfg.display().to_string();
    let mut p = Proc::start(&["serve", "--config", &cfg_arg], &dir, &[]);
    let api = p.api_addr();
    let admin: SocketAddr = p
        .find(|l| l.trim_start().starts_with("admin:"))
        .and_then(|l| banner_addr(&l))
        .expect("admin address");
    let env = json!({"method": "GET", "url": up.url("/r")});
    let mut kept = std::net::TcpStream::connect(api).expect("connect");
    kept.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    assert_eq!(envelope_on(&mut kept, DEPLOYMENT_TOKEN, &env), 200);
    let admin_status = |token: &str| {
        let auth = format!("Bearer {token}");
        http(
            admin,
            "GET",
            "/api/v1/admin/config",
            &[("Authorization", &auth)],
            b"",
        )
        .status
    };

    // New tokens, the access log on, and a listener moved (which needs a restart).
    let changed = original
        .replace(DEPLOYMENT_TOKEN, NEW_DEPLOYMENT_TOKEN)
        .replace(ADMIN_TOKEN, NEW_ADMIN_TOKEN)
        .replace(
            "api_listen = \"127.0.0.1:0\"",
            "api_listen = \"127.0.0.1:1\"",
        )
        + "[log]\naccess = true\n";
    std::fs::write(&cfg, changed).expect("rewrite config");
    hup(&p);
    p.until(|l| l.contains("configuration reloaded"))
        .unwrap_or_else(|| panic!("no reload line:\n{}", p.output()));
    assert!(
        p.find(|l| l.contains("control.api_listen") && l.contains("restart"))
            .is_some(),
        "{}",
        p.output()
    );
    assert_eq!(envelope_with(api, DEPLOYMENT_TOKEN, &env).status, 401);
    assert_eq!(envelope_with(api, NEW_DEPLOYMENT_TOKEN, &env).status, 200);
    // The connection opened before the reload is still served, under the new token.
    assert_eq!(envelope_on(&mut kept, NEW_DEPLOYMENT_TOKEN, &env), 200);
    assert_eq!(admin_status(ADMIN_TOKEN), 401);
    assert_eq!(admin_status(NEW_ADMIN_TOKEN), 200);
    p.find(|l| l.contains("INFO access") && l.contains("outcome=\"ok\""))
        .unwrap_or_else(|| panic!("no access line after the reload:\n{}", p.output()));

    // A file that does not parse: refused, the running configuration stays.
    std::fs::write(&cfg, "[control\nbroken").expect("break config");
    hup(&p);
    p.until(|l| l.contains("configuration not reloaded"))
        .unwrap_or_else(|| panic!("no refusal line:\n{}", p.output()));
    assert_eq!(envelope_on(&mut kept, NEW_DEPLOYMENT_TOKEN, &env), 200);
    assert_eq!(admin_status(NEW_ADMIN_TOKEN), 200);

    p.sigterm();
    assert!(p.wait().success(), "{}", p.output());
    for line in p.seen.iter() {
        assert!(
            !line.contains(NEW_DEPLOYMENT_TOKEN) && !line.contains(NEW_ADMIN_TOKEN),
            "{line}"
        );
    }
}
