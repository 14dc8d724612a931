//! nginx as a real HTTP/2 (and HTTP/1.1) upstream over TLS: a temporary prefix with a
//! configuration, a leaf certificate from the test CA, static files, and an access log that
//! names each request's connection serial number and protocol.
//!
//! Debian's nginx (`scripts/ci-deps.sh` installs it) runs as one foreground process.

use std::io::Read as _;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::proxies::free_ports;
use super::tls::TestCa;

/// The servers of the test configuration, one port each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// TLS, HTTP/2 and HTTP/1.1 offered by ALPN.
    H2,
    /// TLS, HTTP/1.1 only.
    H1,
    /// HTTP/2 with `http2_max_concurrent_streams 4`.
    FourStreams,
    /// HTTP/2 closing each connection (GOAWAY) after 5 requests.
    FiveRequests,
}

const SERVERS: [Server; 4] = [
    Server::H2,
    Server::H1,
    Server::FourStreams,
    Server::FiveRequests,
];

/// One access-log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    /// nginx's connection serial number (`$connection`).
    pub connection: u64,
    /// `HTTP/2.0` or `HTTP/1.1`.
    pub protocol: String,
    pub status: u16,
    /// `$request_length`: request line or pseudo-headers, fields and body.
    pub request_length: u64,
    pub uri: String,
}

/// A running nginx; stopped on drop.
pub struct Nginx {
    child: Child,
    dir: tempfile::TempDir,
    ports: Vec<(Server, u16)>,
}

impl Nginx {
    /// Starts nginx with a leaf of `ca` for `localhost` and `127.0.0.1`, and waits until
    /// every server accepts connections. Fails the test, naming what to install, when nginx
    /// is missing.
    ///
    /// The servers' ports are all different and were free a moment before nginx binds them;
    /// when another socket took one meanwhile, nginx exits saying so and is started again on
    /// other ports, up to five times.
    pub fn start(ca: &TestCa) -> Nginx {
        const ATTEMPTS: usize = 5;
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            match Nginx::start_on(ca, free_ports(SERVERS.len())) {
                Ok(nginx) => return nginx,
                Err(e) if e.contains("Address already in use") => last = e,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("nginx lost a port to another socket {ATTEMPTS} times; the last:\n{last}")
    }

    fn start_on(ca: &TestCa, free: Vec<u16>) -> Result<Nginx, String> {
        let bin = ["/usr/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("nginx is not installed: run scripts/ci-deps.sh (apt-get install nginx)");
        let dir = tempfile::tempdir().expect("temp dir");
        let (cert, key) = ca.leaf_pem_files(&["localhost", "127.0.0.1"], dir.path());
        let www = dir.path().join("www");
        std::fs::create_dir(&www).expect("docroot");
        std::fs::create_dir(www.join("put")).expect("upload folder");
        std::fs::write(www.join("1k.bin"), super::upstream::pattern(1024)).expect("1k file");
        std::fs::write(www.join("8m.bin"), super::upstream::pattern(8 << 20)).expect("8m file");
        let ports: Vec<(Server, u16)> = SERVERS.iter().copied().zip(free).collect();
        // A response header list of about 80 KiB, over the 64 KiB the egress accepts.
        let big_head: String = (0..20)
            .map(|i| format!("add_header X-Big-{i} {};", "b".repeat(4000)))
            .collect();
        let mut servers = String::new();
        for (server, port) in &ports {
            let (listen, extra) = match server {
                Server::H2 => ("ssl http2", ""),
                Server::H1 => ("ssl", ""),
                Server::FourStreams => ("ssl http2", "http2_max_concurrent_streams 4;"),
                Server::FiveRequests => ("ssl http2", "keepalive_requests 5;"),
            };
            servers.push_str(&format!(
                "server {{ listen 127.0.0.1:{port} {listen}; {extra}
                   ssl_certificate {cert}; ssl_certificate_key {key};
                   root {www};
                   location = /small {{ return 200 'small body'; }}
                   location = /reset {{ return 444; }}
                   location = /big-head {{ {big_head} return 200 'big head'; }}
                   location = /upload {{ client_max_body_size 64m; return 200 'received'; }}
                   location /put/ {{ dav_methods PUT; client_max_body_size 64m;
                     client_body_temp_path {d}/body; }}
                }}\n",
                cert = cert.display(),
                key = key.display(),
                www = www.display(),
                d = dir.path().display(),
                big_head = big_head,
            ));
        }
        let d = dir.path().display();
        let conf = format!(
            "daemon off; master_process off; worker_processes 1; user root;
             pid {d}/nginx.pid; error_log {d}/error.log info;
             events {{ worker_connections 1024; }}
             http {{
               log_format t '$connection $server_protocol $status $request_length $request_uri';
               access_log {d}/access.log t;
               client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;
               fastcgi_temp_path {d}/fcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
               keepalive_timeout 60s;
               {servers}
             }}\n"
        );
        let conf_file = dir.path().join("nginx.conf");
        std::fs::write(&conf_file, conf).expect("nginx.conf");
        let child = Command::new(bin)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf_file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("nginx starts");
        let mut nginx = Nginx { child, dir, ports };
        nginx.wait_ready()?;
        Ok(nginx)
    }

    /// Waits until every server accepts connections; `Err` with nginx's output and error log
    /// when it exited first.
    fn wait_ready(&mut self) -> Result<(), String> {
        for (_, port) in self.ports.clone() {
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            super::wait::poll(Duration::from_secs(10), || {
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    return Ok(Ok(()));
                }
                if let Ok(Some(status)) = self.child.try_wait() {
                    let mut err = String::new();
                    if let Some(mut e) = self.child.stderr.take() {
                        let _ = e.read_to_string(&mut err);
                    }
                    return Ok(Err(format!(
                        "nginx exited ({status}): {err} {}",
                        self.error_log()
                    )));
                }
                Err(format!("nginx did not listen on {port}"))
            })?;
        }
        Ok(())
    }

    /// The port of `server`.
    pub fn port(&self, server: Server) -> u16 {
        self.ports
            .iter()
            .find(|(s, _)| *s == server)
            .map(|(_, p)| *p)
            .expect("configured server")
    }

    /// `https://localhost:PORT{path}` on `server`.
    pub fn url(&self, server: Server, path: &str) -> String {
        format!("https://localhost:{}{path}", self.port(server))
    }

    /// A file of the document root (uploads land under `put/`).
    pub fn file(&self, path: &str) -> PathBuf {
        self.dir.path().join("www").join(path)
    }

    /// The access log so far, one entry per request nginx finished.
    pub fn access_log(&self) -> Vec<Logged> {
        let text = std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                Some(Logged {
                    connection: f.first()?.parse().ok()?,
                    protocol: f.get(1)?.to_string(),
                    status: f.get(2)?.parse().ok()?,
                    request_length: f.get(3)?.parse().ok()?,
                    uri: f.get(4)?.to_string(),
                })
            })
            .collect()
    }

    /// Waits until the access log holds `n` entries (nginx writes a line when a request
    /// ends, which may be just after the client saw the response).
    pub fn wait_logged(&self, n: usize) -> Vec<Logged> {
        super::wait::poll(Duration::from_secs(10), || {
            let log = self.access_log();
            if log.len() >= n {
                return Ok(log);
            }
            Err(format!("nginx logged {} of {n} requests", log.len()))
        })
    }

    /// nginx's error log, for failure messages.
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
