//! Remote workers for black-box tests: a real `sortie worker` process with a generated config,
//! and a control (`sortie control`) whose bus listens on loopback.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::gateway::{
    admin_items, http, temp_dir, wait_until, Gateway, GatewayBuilder, Resp, DEPLOYMENT_TOKEN,
};

pub const WORKER_TOKEN: &str = "test-worker-token-0123456789";

/// TLS material of a bus: a CA file for workers and the control's certificate and key.
pub struct BusTls {
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    dir: PathBuf,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl BusTls {
    /// A CA and a control certificate for `localhost` and `127.0.0.1`, written under `dir`.
    pub fn new(dir: &std::path::Path) -> BusTls {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let ca_key = KeyPair::generate().expect("CA key");
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        p.distinguished_name.push(DnType::CommonName, "bus test CA");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = p.self_signed(&ca_key).expect("CA");
        let key = KeyPair::generate().expect("leaf key");
        let leaf = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
            .expect("leaf params")
            .signed_by(&key, &ca, &ca_key)
            .expect("leaf");
        let t = BusTls {
            ca_file: dir.join("bus-ca.pem"),
            cert_file: dir.join("bus-cert.pem"),
            key_file: dir.join("bus-key.pem"),
            dir: dir.to_path_buf(),
            ca,
            ca_key,
        };
        std::fs::write(&t.ca_file, t.ca.pem()).expect("ca");
        std::fs::write(&t.cert_file, leaf.pem()).expect("cert");
        std::fs::write(&t.key_file, key.serialize_pem()).expect("key");
        t
    }

    /// A client certificate signed by this CA whose DNS names are `names`, as the `[worker]`
    /// keys `tls_cert_file` and `tls_key_file` (TOML lines).
    pub fn client_cert(&self, file_stem: &str, names: &[&str]) -> String {
        use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, KeyPair};
        let key = KeyPair::generate().expect("client key");
        let mut p = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .expect("client params");
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = p
            .signed_by(&key, &self.ca, &self.ca_key)
            .expect("client cert");
        let cert_file = self.dir.join(format!("{file_stem}-cert.pem"));
        let key_file = self.dir.join(format!("{file_stem}-key.pem"));
        std::fs::write(&cert_file, cert.pem()).expect("client cert file");
        std::fs::write(&key_file, key.serialize_pem()).expect("client key file");
        format!(
            "tls_cert_file = {:?}\ntls_key_file = {:?}\n",
            cert_file.display().to_string(),
            key_file.display().to_string()
        )
    }
}

/// A control builder with a bus on `bus_addr` (`127.0.0.1:0` for any port), plain TCP unless
/// `tls` is given.
pub fn control(bus_addr: &str, tls: Option<&BusTls>) -> GatewayBuilder {
    // Long enough that a loaded test machine does not miss three heartbeats in a row (a lane
    // then closes under a running request); the heartbeat test sets its own.
    control_with(bus_addr, tls, 500)
}

/// [`control`] with another heartbeat interval.
pub fn control_with(bus_addr: &str, tls: Option<&BusTls>, heartbeat_ms: u32) -> GatewayBuilder {
    let bus = match tls {
        None => format!("[control.bus]\ntoken = \"{WORKER_TOKEN}\"\nplaintext = true\nheartbeat_ms = {heartbeat_ms}\n"),
        Some(t) => format!(
            "[control.bus]\ntoken = \"{WORKER_TOKEN}\"\ntls_cert_file = {:?}\ntls_key_file = {:?}\nheartbeat_ms = {heartbeat_ms}\n",
            t.cert_file.display().to_string(),
            t.key_file.display().to_string()
        ),
    };
    Gateway::builder()
        .control_mode()
        .control(&format!("bus_listen = \"{bus_addr}\""))
        .section(&bus)
}

/// A `sortie serve` builder (its local workers run in-process) whose bus also listens on
/// loopback, plain TCP, so remote workers join the embedded gateway.
pub fn serve_with_bus() -> GatewayBuilder {
    Gateway::builder()
        .control("bus_listen = \"127.0.0.1:0\"")
        .section(&format!(
            "[control.bus]\ntoken = \"{WORKER_TOKEN}\"\nplaintext = true\nheartbeat_ms = 500\n"
        ))
}

pub struct Worker {
    pub child: Child,
    pub id: String,
    pub session: String,
    pub out: mpsc::Receiver<String>,
    pub config: PathBuf,
}

/// A listener on `addr` (a loopback address, port 0) that accepts and closes every connection
/// and counts them: where a test checks that a worker dialled nothing.
pub fn counting_listener(addr: &str) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    let at = listener.local_addr().unwrap();
    let reached = Arc::new(AtomicUsize::new(0));
    let counted = reached.clone();
    std::thread::spawn(move || {
        for c in listener.incoming().flatten() {
            counted.fetch_add(1, Ordering::SeqCst);
            drop(c);
        }
    });
    (at, reached)
}

/// `extra` are more `[worker]` keys (tags, capacity, bind_address, ...).
pub fn start_worker(id: &str, bus: SocketAddr, tls: Option<&BusTls>, extra: &str) -> Worker {
    start_worker_env(id, bus, tls, extra, &[])
}

/// [`start_worker`] with variables in the worker's environment (and only in it).
pub fn start_worker_env(
    id: &str,
    bus: SocketAddr,
    tls: Option<&BusTls>,
    extra: &str,
    env: &[(&str, &str)],
) -> Worker {
    let dir = temp_dir("worker");
    let transport = match tls {
        None => "plaintext = true\n".to_string(),
        Some(t) => format!("ca_file = {:?}\n", t.ca_file.display().to_string()),
    };
    let text = format!(
        "[worker]\nid = \"{id}\"\ncontrols = [\"{bus}\"]\ntoken = \"{WORKER_TOKEN}\"\ncores = 1\n{transport}{extra}\n"
    );
    let config = dir.join("worker.toml");
    std::fs::write(&config, text).expect("worker config");
    spawn_worker_env(id, config, env)
}

pub fn spawn_worker(id: &str, config: PathBuf) -> Worker {
    spawn_worker_env(id, config, &[])
}

fn spawn_worker_env(id: &str, config: PathBuf, env: &[(&str, &str)]) -> Worker {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sortie"))
        .envs(env.iter().copied())
        .arg("worker")
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sortie worker");
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    let out = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let err = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx2.send(format!("stderr: {l}"));
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let session = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(left).expect("worker banner");
        if let Some(s) = line.split("(session ").nth(1) {
            break s.trim_end_matches(')').to_string();
        }
    };
    Worker {
        child,
        id: id.into(),
        session,
        out: rx,
        config,
    }
}

impl Worker {
    /// Every line the worker printed so far (stdout and stderr).
    pub fn output(&self) -> Vec<String> {
        self.out.try_iter().collect()
    }

    /// SIGKILL, and reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Waits until the control lists `id` in `state` (and, when connected, with `session`).
pub fn wait_worker(gw: &Gateway, id: &str, state: &str) -> serde_json::Value {
    super::wait::poll(Duration::from_secs(20), || {
        let items = admin_items(gw, "/api/v1/admin/workers");
        match items.iter().find(|w| w["worker_id"] == id) {
            Some(w) if w["state"] == state => Ok(w.clone()),
            _ => Err(format!("worker {id} not {state}: {items:?}")),
        }
    })
}

/// `POST /api/v1/requests` on `api` with the test deployment's token.
pub fn request_at(api: SocketAddr, envelope: &serde_json::Value) -> Resp {
    let auth = format!("Bearer {DEPLOYMENT_TOKEN}");
    http(
        api,
        "POST",
        "/api/v1/requests",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        envelope.to_string().as_bytes(),
    )
}

/// Request API calls in a loop from several threads, each a GET of one URL, until stopped: a
/// load that must see no failure while the workers change under it.
pub struct Load {
    done: Arc<AtomicBool>,
    count: Arc<AtomicUsize>,
    failures: Arc<AtomicUsize>,
    threads: Vec<JoinHandle<()>>,
}

impl Load {
    /// Starts `threads` threads calling `api` with a GET of `url`.
    pub fn start(api: SocketAddr, url: &str, threads: usize) -> Load {
        let done = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(AtomicUsize::new(0));
        let threads = (0..threads)
            .map(|_| {
                let (done, count, failures) = (done.clone(), count.clone(), failures.clone());
                let get = serde_json::json!({"method": "GET", "url": url});
                std::thread::spawn(move || {
                    while !done.load(Ordering::Relaxed) {
                        let r = request_at(api, &get);
                        count.fetch_add(1, Ordering::Relaxed);
                        if r.status != 200 {
                            failures.fetch_add(1, Ordering::Relaxed);
                            eprintln!("failed: {}", r.text());
                        }
                    }
                })
            })
            .collect();
        Load {
            done,
            count,
            failures,
            threads,
        }
    }

    /// Waits until more than `more` requests were answered since this call.
    pub fn wait_for(&self, more: usize, what: &str) {
        let at = self.count.load(Ordering::Relaxed);
        wait_until(Duration::from_secs(10), what, || {
            self.count.load(Ordering::Relaxed) > at + more
        });
    }

    /// Stops the load and returns how many requests failed.
    pub fn stop(self) -> usize {
        self.done.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        self.failures.load(Ordering::Relaxed)
    }
}
