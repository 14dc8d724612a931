//! The loopback capture server of the fingerprint self-test and its cross-checks: a TLS
//! (rustls) + HTTP/2 server that keeps each connection's ClientHello bytes as they came off the
//! socket and the client's first HTTP/2 bytes after the handshake, computes JA4, JA4_r, JA3N
//! and the Akamai string with `sortie_core::fingerprint`, and answers the first request with an
//! empty `200` so that the client finishes normally.
//!
//! Its certificate comes from a CA made at start ([`CaptureServer::ca_der`]), for
//! `localhost` and `127.0.0.1`. It runs on plain threads with blocking sockets (one per
//! connection, each with read limits): it is a test and self-test fixture, not a request path.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ServerConfig, ServerConnection};
use sortie_core::fingerprint::client_hello::{
    parse_records, ClientHello, HelloError, MAX_CLIENT_HELLO_BYTES,
};
use sortie_core::fingerprint::http2::{self, Http2Error, Http2Start, MAX_PREFACE_BYTES};
use sortie_core::fingerprint::tls::{fingerprint, TlsFingerprint};

/// How long one connection may take to send what is captured.
const READ_LIMIT: Duration = Duration::from_secs(10);

/// What one connection showed.
#[derive(Debug, Clone)]
pub struct Capture {
    /// The TLS records up to the end of the ClientHello, as received.
    pub client_hello: Vec<u8>,
    /// The same ClientHello, parsed.
    pub hello: ClientHello,
    /// Its fingerprints.
    pub tls: TlsFingerprint,
    /// The protocol chosen by ALPN, if any.
    pub alpn: Option<String>,
    /// The client's HTTP/2 start when it chose `h2`.
    pub http2: Option<Http2Start>,
    /// The request's header names in the order sent, lowercase, when it came over HTTP/1.1
    /// (`host` and `connection` left out: HTTP/2 has no such fields). A recording takes a
    /// browser's header order from here, since reading HTTP/2 field names would need HPACK's
    /// Huffman code and the order is the same.
    pub header_names: Vec<String>,
}

impl Capture {
    /// The Akamai string of the HTTP/2 start, if the connection spoke HTTP/2.
    pub fn akamai(&self) -> Option<String> {
        self.http2.as_ref().map(Http2Start::akamai)
    }

    /// Everything the capture saw, as one JSON object: the fingerprint strings and the
    /// ClientHello and HTTP/2 parameters a profile file holds (what `sortie fingerprints
    /// --capture` prints, one object per line, and `scripts/record-profiles.py` turns into
    /// profile files). Lists keep GREASE values, in wire order.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        let hello = &self.hello;
        let unpadded = sortie_core::fingerprint::tls::fingerprint_unpadded(hello);
        let alpn: Vec<String> = hello
            .alpn
            .iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        let http2 = self.http2.as_ref().map(|h| {
            json!({
                "settings": h.settings,
                "window_update": h.window_update,
                "priority_frames": h.priorities.iter().map(|(s, x, d, w)| json!({
                    "stream": s, "exclusive": x, "depends_on": d, "weight": w,
                })).collect::<Vec<_>>(),
                "pseudo_headers": h.pseudo_headers,
                "headers_priority": h.headers_priority.map(|(x, d, w)| json!({
                    "exclusive": x, "depends_on": d, "weight": w,
                })),
                "akamai": h.akamai(),
            })
        });
        json!({
            "ja4": self.tls.ja4,
            "ja4_r": self.tls.ja4_r,
            "ja3n": self.tls.ja3n,
            "ja3n_string": self.tls.ja3n_string,
            "unpadded": { "ja4": unpadded.ja4, "ja4_r": unpadded.ja4_r, "ja3n": unpadded.ja3n },
            "alpn_chosen": self.alpn,
            "tls": {
                "legacy_version": hello.legacy_version,
                "ciphers": hello.ciphers,
                "extensions": hello.extensions,
                "supported_versions": hello.supported_versions,
                "signature_algorithms": hello.signature_algorithms,
                "groups": hello.groups,
                "key_shares": hello.key_shares,
                "point_formats": hello.point_formats,
                "alpn": alpn,
                "cert_compression": hello.cert_compression,
                "delegated_credentials": hello.delegated_credentials,
                "record_size_limit": hello.record_size_limit,
            },
            "http2": http2,
            "header_names": self.header_names,
        })
    }
}

/// A running capture server; stops when dropped.
pub struct CaptureServer {
    addr: SocketAddr,
    ca_der: Vec<u8>,
    ca_pem: String,
    rx: mpsc::Receiver<Result<Capture, String>>,
    stop: Arc<AtomicBool>,
}

impl CaptureServer {
    /// Binds `127.0.0.1:0` and starts accepting; offers `h2` and `http/1.1` by ALPN.
    pub fn start() -> Result<CaptureServer, String> {
        Self::start_with(false)
    }

    /// The same server offering only `http/1.1`: a client's request head then comes in plain
    /// text, with its header names in order ([`Capture::header_names`]).
    pub fn start_http1() -> Result<CaptureServer, String> {
        Self::start_with(true)
    }

    fn start_with(http1_only: bool) -> Result<CaptureServer, String> {
        let (config, ca_der, ca_pem) = server_config(http1_only)?;
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
        let addr = listener.local_addr().map_err(|e| format!("bind: {e}"))?;
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::Builder::new()
            .name("fingerprint-capture".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stopped.load(Ordering::Acquire) {
                        return;
                    }
                    let Ok(conn) = conn else { continue };
                    let (config, tx) = (config.clone(), tx.clone());
                    let _ = std::thread::Builder::new()
                        .name("fingerprint-capture-conn".into())
                        .spawn(move || {
                            let _ = tx.send(serve(conn, config));
                        });
                }
            })
            .map_err(|e| format!("thread: {e}"))?;
        Ok(CaptureServer {
            addr,
            ca_der,
            ca_pem,
            rx,
            stop,
        })
    }

    /// The address to connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The DER certificate of the CA that signed the server's certificate.
    pub fn ca_der(&self) -> &[u8] {
        &self.ca_der
    }

    /// The same CA certificate as PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The next connection's capture, waiting at most `wait`; an error names what went wrong
    /// with the connection (no ClientHello, handshake failure, no HTTP/2 start).
    pub fn next(&self, wait: Duration) -> Result<Capture, String> {
        match self.rx.recv_timeout(wait) {
            Ok(r) => r,
            Err(_) => Err(format!("no connection captured within {wait:?}")),
        }
    }
}

impl Drop for CaptureServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

fn server_config(http1_only: bool) -> Result<(Arc<ServerConfig>, Vec<u8>, String), String> {
    let e = |what: &'static str| move |err: rcgen::Error| format!("{what}: {err}");
    let ca_key = KeyPair::generate().map_err(e("CA key"))?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(e("CA"))?;
    ca.distinguished_name
        .push(DnType::CommonName, "Sortie fingerprint capture CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    let ca_cert = ca.self_signed(&ca_key).map_err(e("CA certificate"))?;
    let key = KeyPair::generate().map_err(e("key"))?;
    let leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .map_err(e("certificate"))?
        .signed_by(&key, &ca_cert, &ca_key)
        .map_err(e("certificate"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone(), ca_cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .map_err(|e| e.to_string())?;
    // No resumption: every capture is of a first connection (a resumed one adds
    // `pre_shared_key` and changes JA4), whatever session cache the client keeps.
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.alpn_protocols = if http1_only {
        vec![b"http/1.1".to_vec()]
    } else {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    };
    let ca_der: CertificateDer<'static> = ca_cert.der().clone();
    Ok((Arc::new(config), ca_der.to_vec(), ca_cert.pem()))
}

/// The socket with the bytes already read in front: rustls reads the ClientHello from here
/// after the capture took it off the socket.
struct Replay {
    front: io::Cursor<Vec<u8>>,
    tcp: TcpStream,
}

impl Read for Replay {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.front.read(buf)?;
        if n > 0 {
            return Ok(n);
        }
        self.tcp.read(buf)
    }
}

impl Write for Replay {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.tcp.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.tcp.flush()
    }
}

fn serve(tcp: TcpStream, config: Arc<ServerConfig>) -> Result<Capture, String> {
    tcp.set_read_timeout(Some(READ_LIMIT))
        .map_err(|e| e.to_string())?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut hello = Vec::new();
    let mut tcp_r = tcp.try_clone().map_err(|e| e.to_string())?;
    let mut buf = [0u8; 4096];
    let parsed = loop {
        let n = tcp_r
            .read(&mut buf)
            .map_err(|e| format!("reading the ClientHello: {e}"))?;
        if n == 0 {
            return Err("the client closed before its ClientHello was complete".into());
        }
        hello.extend_from_slice(buf.get(..n).unwrap_or_default());
        match parse_records(&hello) {
            Err(HelloError::Incomplete) if hello.len() <= MAX_CLIENT_HELLO_BYTES + 1024 => {}
            other => break other.map_err(|e| e.to_string())?,
        }
    };
    let tls = fingerprint(&parsed);
    let mut conn = ServerConnection::new(config).map_err(|e| e.to_string())?;
    let mut io = Replay {
        front: io::Cursor::new(hello.clone()),
        tcp,
    };
    while conn.is_handshaking() {
        conn.complete_io(&mut io)
            .map_err(|e| format!("TLS handshake: {e}"))?;
    }
    let alpn = conn
        .alpn_protocol()
        .map(|p| String::from_utf8_lossy(p).into_owned());
    let mut stream = rustls::Stream::new(&mut conn, &mut io);
    let mut plain = Vec::new();
    let mut header_names = Vec::new();
    let http2 = if alpn.as_deref() == Some("h2") {
        let start = loop {
            let n = stream
                .read(&mut buf)
                .map_err(|e| format!("reading the HTTP/2 start: {e}"))?;
            if n == 0 {
                return Err("the client closed before its first request".into());
            }
            plain.extend_from_slice(buf.get(..n).unwrap_or_default());
            match http2::parse(&plain) {
                Err(Http2Error::Incomplete) if plain.len() <= MAX_PREFACE_BYTES => {}
                other => break other.map_err(|e| e.to_string())?,
            }
        };
        // SETTINGS (none), SETTINGS ACK, HEADERS on stream 1 with `:status: 200` (static
        // index 8) ending the stream, GOAWAY after stream 1.
        let mut out = Vec::new();
        out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        out.extend_from_slice(&[0, 0, 0, 4, 1, 0, 0, 0, 0]);
        out.extend_from_slice(&[0, 0, 1, 1, 0x5, 0, 0, 0, 1, 0x88]);
        out.extend_from_slice(&[0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]);
        stream
            .write_all(&out)
            .map_err(|e| format!("answering: {e}"))?;
        Some(start)
    } else {
        loop {
            let n = stream
                .read(&mut buf)
                .map_err(|e| format!("reading the request: {e}"))?;
            plain.extend_from_slice(buf.get(..n).unwrap_or_default());
            if n == 0 || plain.windows(4).any(|w| w == b"\r\n\r\n") || plain.len() > 65_536 {
                break;
            }
        }
        header_names = request_header_names(&plain);
        stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            .map_err(|e| format!("answering: {e}"))?;
        None
    };
    let _ = stream.flush();
    conn.send_close_notify();
    let _ = conn.complete_io(&mut io);
    Ok(Capture {
        client_hello: hello,
        hello: parsed,
        tls,
        alpn,
        http2,
        header_names,
    })
}

/// The header names of an HTTP/1.1 request head, lowercase, in order, without `host` and
/// `connection`; the lines after the request line up to the blank line, each name before its
/// colon (a capture fixture: a line without a colon is skipped).
fn request_header_names(head: &[u8]) -> Vec<String> {
    let end = head
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(head.len());
    let text = String::from_utf8_lossy(head.get(..end).unwrap_or_default());
    text.split("\r\n")
        .skip(1)
        .filter_map(|line| line.split_once(':'))
        .map(|(name, _)| name.trim().to_ascii_lowercase())
        .filter(|n| n != "host" && n != "connection")
        .collect()
}
