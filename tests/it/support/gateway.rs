//! A real `sortie serve` process for black-box tests: a temp data dir, a config with known
//! tokens, ports chosen by the kernel and read back from the startup banner.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const DEPLOYMENT_TOKEN: &str = "test-deployment-token-0123456789";
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789abcdef";

/// A snapshot that opens loopback destinations, for tests with local upstreams.
pub const LOOPBACK_SNAPSHOT: &str = r#"{"default_timeout_ms":60000,"routing":{"rules":[{"id":"default","priority":100,"constraints":{},"pools":["direct"],"sticky_session_ttl_seconds":0,"allow_sticky_fallback":true}]},"pools":[{"id":"direct"}],"destinations":{"allow":["127.0.0.0/8","::1/128"],"deny":[]}}"#;

pub struct Gateway {
    pub child: Child,
    pub api: SocketAddr,
    pub admin: Option<SocketAddr>,
    /// The forward-proxy listener (every test gateway runs one).
    pub proxy: Option<SocketAddr>,
    /// The worker bus listener, when the config opens one.
    pub bus: Option<SocketAddr>,
    pub dir: PathBuf,
    pub stdout: mpsc::Receiver<String>,
}

pub struct GatewayBuilder {
    extra: String,
    sections: String,
    snapshot: Option<String>,
    workers: String,
    env: Vec<(String, String)>,
    dir: Option<PathBuf>,
    cores: u32,
    mode: &'static str,
}

impl Default for GatewayBuilder {
    fn default() -> Self {
        GatewayBuilder {
            extra: String::new(),
            sections: String::new(),
            snapshot: Some(LOOPBACK_SNAPSHOT.to_string()),
            workers: String::new(),
            env: Vec::new(),
            dir: None,
            cores: 2,
            mode: "serve",
        }
    }
}

/// Removes the temp dirs of earlier test processes that are gone. Restart tests reuse a dir
/// after its gateway is dropped, so dirs live as long as their test process.
fn sweep_stale_dirs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix("sortie-it-") else {
                continue;
            };
            let pid = rest
                .split('-')
                .rev()
                .nth(1)
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(pid) = pid {
                if pid != std::process::id()
                    && !std::path::Path::new(&format!("/proc/{pid}")).exists()
                {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    });
}

pub fn temp_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    sweep_stale_dirs();
    let d = std::env::temp_dir().join(format!(
        "sortie-it-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

impl GatewayBuilder {
    /// Extra `[control]` keys (TOML lines).
    pub fn control(mut self, lines: &str) -> Self {
        self.extra.push_str(lines);
        self.extra.push('\n');
        self
    }

    /// Whole TOML sections or tables appended to the config (`[object_storage]`,
    /// `[[deployments]]`).
    pub fn section(mut self, toml: &str) -> Self {
        self.sections.push_str(toml);
        self.sections.push('\n');
        self
    }

    /// `[[workers]]` tables (TOML); without them the gateway runs its default local worker.
    pub fn workers(mut self, toml: &str) -> Self {
        self.workers.push_str(toml);
        self
    }

    /// The bootstrap snapshot, or `None` for the built-in default (loopback denied).
    pub fn snapshot(mut self, s: Option<&str>) -> Self {
        self.snapshot = s.map(str::to_string);
        self
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    /// Hot cores (2 unless set).
    pub fn cores(mut self, n: u32) -> Self {
        self.cores = n;
        self
    }

    /// Runs `sortie control` instead of `sortie serve` (no implied local worker).
    pub fn control_mode(mut self) -> Self {
        self.mode = "control";
        self
    }

    /// Reuses a data dir (restart tests).
    pub fn dir(mut self, d: PathBuf) -> Self {
        self.dir = Some(d);
        self
    }

    pub fn start(self) -> Gateway {
        let dir = self.dir.unwrap_or_else(|| temp_dir("gw"));
        let mut snapshot_line = String::new();
        if let Some(s) = &self.snapshot {
            let p = dir.join("bootstrap.json");
            std::fs::write(&p, s).expect("write snapshot");
            snapshot_line = format!("bootstrap_snapshot = {:?}\n", p.display().to_string());
        }
        let config = format!(
            "[control]\napi_listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nproxy_listen = \"127.0.0.1:0\"\ncores = {}\ndata_dir = {:?}\n{snapshot_line}{}\n\
             [[deployments]]\nid = \"dep_test\"\ntoken = \"{DEPLOYMENT_TOKEN}\"\n\n[admin]\ntoken = \"{ADMIN_TOKEN}\"\n\n{}\n{}",
            self.cores,
            dir.join("data").display().to_string(),
            self.extra,
            self.workers,
            self.sections,
        );
        let cfg = dir.join("sortie.toml");
        std::fs::write(&cfg, config).expect("write config");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sortie"));
        cmd.arg(self.mode)
            .arg("--config")
            .arg(&cfg)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn sortie");
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().expect("stdout");
        let tx2 = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let err = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx2.send(format!("stderr: {line}"));
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let (mut api, mut admin, mut proxy, mut bus) = (None, None, None, None);
        let mut seen = Vec::new();
        let mut has_proxy_line = false;
        let mut has_receipts_line = false;
        while api.is_none() || admin.is_none() || !has_proxy_line || !has_receipts_line {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match rx.recv_timeout(left) {
                Ok(l) => l,
                Err(_) => {
                    let _ = child.kill();
                    panic!(
                        "gateway did not report its listeners; output:\n{}",
                        seen.join("\n")
                    );
                }
            };
            if let Some(a) = parse_listen_line(&line, "api:") {
                api = Some(a);
            }
            if let Some(a) = parse_listen_line(&line, "admin:") {
                admin = Some(a);
            }
            if let Some(rest) = line.trim().strip_prefix("bus:") {
                bus = rest
                    .split_whitespace()
                    .next()
                    .and_then(|u| u.split_once("://"))
                    .and_then(|(_, a)| a.parse().ok());
            }
            has_receipts_line |= line.trim().starts_with("receipts:");
            if line.trim().starts_with("proxy:") {
                has_proxy_line = true;
                proxy = parse_listen_line(&line, "proxy:");
            }
            seen.push(line);
        }
        Gateway {
            child,
            api: api.expect("api"),
            admin,
            proxy,
            bus,
            dir,
            stdout: rx,
        }
    }
}

fn parse_listen_line(line: &str, key: &str) -> Option<SocketAddr> {
    let rest = line.trim().strip_prefix(key)?.trim();
    let url = rest.split_whitespace().next()?;
    url.strip_prefix("http://")?.parse().ok()
}

impl Gateway {
    pub fn builder() -> GatewayBuilder {
        GatewayBuilder::default()
    }

    pub fn start() -> Gateway {
        GatewayBuilder::default().start()
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("gateway did not exit after SIGTERM");
            }
            std::thread::park_timeout(Duration::from_millis(20));
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A parsed HTTP/1.1 response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

/// Sends one request on a new connection (`Connection: close`) and reads the answer.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).ok();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).expect("write head");
    s.write_all(body).expect("write body");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read response");
    parse_response(&raw)
}

pub fn parse_response(raw: &[u8]) -> Resp {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no complete head in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..end]).to_string();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| {
            l.split_once(':')
                .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        })
        .collect();
    let body = raw[end + 4..].to_vec();
    Resp {
        status,
        headers,
        body,
    }
}

/// The bytes of a base64 JSON string, such as an inline body's `data_base64`.
pub fn unb64(v: &serde_json::Value) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().expect("base64 string"))
        .expect("valid base64")
}

/// POSTs an envelope to the request API with the test deployment token.
pub fn request_api(gw: &Gateway, envelope: &serde_json::Value) -> Resp {
    let auth = format!("Bearer {DEPLOYMENT_TOKEN}");
    http(
        gw.api,
        "POST",
        "/api/v1/requests",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        envelope.to_string().as_bytes(),
    )
}

/// Calls the admin API with the admin token.
pub fn admin(
    gw: &Gateway,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let mut h: Vec<(&str, &str)> = vec![("Authorization", &auth)];
    h.extend_from_slice(headers);
    http(gw.admin.expect("admin listener"), method, path, &h, body)
}

/// The `items` of an admin list (config history, workers, active requests), after checking that
/// the call answered 200.
pub fn admin_items(gw: &Gateway, path: &str) -> Vec<serde_json::Value> {
    let r = admin(gw, "GET", path, &[], b"");
    assert_eq!(r.status, 200, "GET {path}: {}", r.text());
    r.json()["items"].as_array().expect("items").clone()
}

/// Cancels the one request the gateway lists as active (`DELETE /api/v1/admin/requests/{id}`,
/// which must answer 204); fails when not exactly one is listed.
pub fn cancel_the_only_request(gw: &Gateway) {
    let items = admin_items(gw, "/api/v1/admin/requests");
    assert_eq!(items.len(), 1, "{items:?}");
    let id = items[0]["request_id"].as_str().unwrap();
    let r = admin(
        gw,
        "DELETE",
        &format!("/api/v1/admin/requests/{id}"),
        &[],
        b"",
    );
    assert_eq!(r.status, 204, "{}", r.text());
}

/// The entry of `worker_id` in a workers list; panics when it is not listed.
pub fn worker_item<'a>(items: &'a [serde_json::Value], id: &str) -> &'a serde_json::Value {
    items
        .iter()
        .find(|w| w["worker_id"] == id)
        .unwrap_or_else(|| panic!("{id} not listed: {items:?}"))
}

pub use super::wait::wait_until;
