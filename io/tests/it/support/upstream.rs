//! A loopback HTTP/1.1 upstream on std threads whose behaviour each test scripts: for every
//! request it reads, a [`Script`] returns the [`Step`]s to perform (write bytes, pause, close,
//! reset). It counts connections, requests and idle closes so that tests can prove pooling.
//!
//! Requests are parsed with the project's own codec; the raw bytes of each request are kept so
//! that [`echo`] can send them back and tests can assert exactly what went on the wire.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustls::{ServerConfig, ServerConnection, StreamOwned};
use sortie_core::h1::{parse_request_head, BodyDecoder, BodyLimits, HeadLimits, Parsed};

/// How long a connection waits for its first request, and for later ones when the upstream
/// does not close idle connections itself. Bounds the life of every connection thread.
pub const REQUEST_WAIT: Duration = Duration::from_secs(10);
/// Request bodies the upstream accepts.
const MAX_REQUEST_BODY: u64 = 64 * 1024 * 1024;

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Request {
    /// Head and body exactly as read from the connection.
    pub raw: Vec<u8>,
    /// The method.
    pub method: String,
    /// The request-target.
    pub target: String,
    /// Header fields in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The decoded body.
    pub body: Vec<u8>,
    /// The connection's number on this upstream, from 0.
    pub conn_seq: usize,
    /// The request's number on its connection, from 0.
    pub req_seq: usize,
    /// The client address.
    pub peer: SocketAddr,
}

/// One thing the upstream does in answer to a request.
#[derive(Debug, Clone)]
pub enum Step {
    /// Writes bytes.
    Write(Vec<u8>),
    /// Pauses: the point of a slow upstream.
    Pause(Duration),
    /// Closes the connection (TLS: after `close_notify`).
    Close,
    /// Closes the connection with a reset (`SO_LINGER` 0).
    Reset,
}

/// Decides the steps for each request.
pub type Script = Arc<dyn Fn(&Request) -> Vec<Step> + Send + Sync>;

/// Counters of an upstream.
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections accepted.
    pub connections: AtomicUsize,
    /// Requests read completely.
    pub requests: AtomicUsize,
    /// Idle connections the upstream closed after its idle limit.
    pub idle_closes: AtomicUsize,
}

/// Options of an upstream.
#[derive(Clone, Default)]
pub struct Options {
    /// Close a connection that stays idle this long after a response.
    pub idle_close_after: Option<Duration>,
    /// Serve TLS with this configuration.
    pub tls: Option<Arc<ServerConfig>>,
}

/// A running upstream; stops accepting when dropped.
pub struct Upstream {
    addr: SocketAddr,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
}

impl Upstream {
    /// A plain HTTP upstream on 127.0.0.1 running `script`.
    pub fn start(script: Script) -> Upstream {
        Upstream::start_with(script, Options::default())
    }

    /// An upstream with options.
    pub fn start_with(script: Script, options: Options) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("upstream binds");
        let addr = listener.local_addr().expect("upstream address");
        let stats = Arc::new(Stats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (stats.clone(), stop.clone());
        std::thread::Builder::new()
            .name("test-upstream".into())
            .spawn(move || accept_loop(listener, script, options, s, st))
            .expect("upstream thread starts");
        Upstream { addr, stats, stop }
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `http://127.0.0.1:PORT` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port())
    }

    /// `https://HOST:PORT` followed by `path`.
    pub fn https_url(&self, host: &str, path: &str) -> String {
        format!("https://{host}:{}{path}", self.port())
    }

    /// The counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.stats.connections.load(Ordering::SeqCst)
    }

    /// Requests read so far.
    pub fn requests(&self) -> usize {
        self.stats.requests.load(Ordering::SeqCst)
    }

    /// Idle connections closed so far.
    pub fn idle_closes(&self) -> usize {
        self.stats.idle_closes.load(Ordering::SeqCst)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept call so the thread sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

fn accept_loop(
    listener: TcpListener,
    script: Script,
    options: Options,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
) {
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let conn_seq = stats.connections.fetch_add(1, Ordering::SeqCst);
        let (script, options, stats) = (script.clone(), options.clone(), stats.clone());
        let _ = std::thread::Builder::new()
            .name("test-upstream-conn".into())
            .spawn(move || {
                let _ = serve(stream, conn_seq, &script, &options, &stats);
            });
    }
}

/// The server side of one connection, plain or TLS.
enum Conn {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ServerConnection, TcpStream>>),
}

impl Conn {
    fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Tls(s) => &s.sock,
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}

fn serve(
    stream: TcpStream,
    conn_seq: usize,
    script: &Script,
    options: &Options,
    stats: &Stats,
) -> io::Result<()> {
    let peer = stream.peer_addr()?;
    stream.set_nodelay(true)?;
    let mut conn = match &options.tls {
        None => Conn::Plain(stream),
        Some(config) => {
            let session = ServerConnection::new(config.clone()).map_err(io::Error::other)?;
            Conn::Tls(Box::new(StreamOwned::new(session, stream)))
        }
    };
    let mut buf = Vec::new();
    let mut req_seq = 0;
    loop {
        let wait = match (req_seq, options.idle_close_after) {
            (0, _) | (_, None) => REQUEST_WAIT,
            (_, Some(idle)) => idle,
        };
        conn.tcp().set_read_timeout(Some(wait))?;
        let request = match read_request(&mut conn, &mut buf, peer, conn_seq, req_seq) {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(()),
            Err(e) if is_timeout(&e) && req_seq > 0 && options.idle_close_after.is_some() => {
                close(conn);
                stats.idle_closes.fetch_add(1, Ordering::SeqCst);
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        stats.requests.fetch_add(1, Ordering::SeqCst);
        req_seq += 1;
        for step in script(&request) {
            match step {
                Step::Write(bytes) => {
                    conn.write_all(&bytes)?;
                    conn.flush()?;
                }
                Step::Pause(d) => std::thread::sleep(d),
                Step::Close => {
                    close(conn);
                    return Ok(());
                }
                Step::Reset => {
                    socket2::SockRef::from(conn.tcp()).set_linger(Some(Duration::ZERO))?;
                    return Ok(());
                }
            }
        }
    }
}

fn close(conn: Conn) {
    if let Conn::Tls(mut s) = conn {
        s.conn.send_close_notify();
        let _ = s.flush();
        let _ = s.sock.shutdown(Shutdown::Write);
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Reads one request; `None` when the client closed between requests.
fn read_request(
    conn: &mut Conn,
    buf: &mut Vec<u8>,
    peer: SocketAddr,
    conn_seq: usize,
    req_seq: usize,
) -> io::Result<Option<Request>> {
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        if !buf.is_empty() {
            let parsed = parse_request_head(buf, &HeadLimits::REQUEST)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            if let Parsed::Complete { head, consumed_len } = parsed {
                let method = head.method().to_string();
                let target = head.target().to_string();
                let headers = head
                    .headers()
                    .iter()
                    .map(|h| (h.name().to_string(), h.value().to_vec()))
                    .collect();
                let mut decoder = BodyDecoder::for_request(
                    head.framing(),
                    BodyLimits::with_max_body(MAX_REQUEST_BODY),
                )
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                let mut raw = buf[..consumed_len].to_vec();
                let mut rest = buf.split_off(consumed_len);
                buf.clear();
                let mut body = Vec::new();
                loop {
                    let progress = decoder
                        .decode(&rest, &mut |d| body.extend_from_slice(d))
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    raw.extend_from_slice(&rest[..progress.consumed]);
                    if decoder.is_done() {
                        // Pipelined bytes stay for the next request.
                        buf.extend_from_slice(&rest[progress.consumed..]);
                        break;
                    }
                    let n = conn.read(&mut chunk)?;
                    if n == 0 {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    rest = chunk[..n].to_vec();
                }
                return Ok(Some(Request {
                    raw,
                    method,
                    target,
                    headers,
                    body,
                    conn_seq,
                    req_seq,
                    peer,
                }));
            }
        }
        let n = match conn.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && buf.is_empty() => 0,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset && buf.is_empty() => 0,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A complete response with `Content-Length`.
pub fn response(status: u16, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status} {}\r\n", reason(status)).into_bytes();
    for (n, v) in headers {
        out.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
    }
    out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
    out.extend_from_slice(body);
    out
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        304 => "Not Modified",
        404 => "Not Found",
        _ => "Whatever",
    }
}

/// Answers 200 with the raw request as the body, plus the connection and request numbers and
/// the client address in `X-Conn-Seq`, `X-Req-Seq` and `X-Peer`.
pub fn echo() -> Script {
    Arc::new(|r: &Request| vec![Step::Write(echo_response(r))])
}

fn echo_response(r: &Request) -> Vec<u8> {
    response(
        200,
        &[
            ("X-Conn-Seq", &r.conn_seq.to_string()),
            ("X-Req-Seq", &r.req_seq.to_string()),
            ("X-Peer", &r.peer.to_string()),
        ],
        &r.raw,
    )
}

/// Answers every request with the same bytes, keeping the connection.
pub fn fixed(bytes: Vec<u8>) -> Script {
    Arc::new(move |_: &Request| vec![Step::Write(bytes.clone())])
}

/// Answers every request with the same bytes, then closes.
pub fn fixed_then_close(bytes: Vec<u8>) -> Script {
    Arc::new(move |_: &Request| vec![Step::Write(bytes.clone()), Step::Close])
}

/// A chunked response with the given chunks, each written separately.
pub fn chunked(chunks: Vec<Vec<u8>>) -> Script {
    Arc::new(move |_: &Request| {
        let mut steps = vec![Step::Write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec(),
        )];
        for c in &chunks {
            let mut frame = format!("{:x};ext=1\r\n", c.len()).into_bytes();
            frame.extend_from_slice(c);
            frame.extend_from_slice(b"\r\n");
            steps.push(Step::Write(frame));
        }
        steps.push(Step::Write(b"0\r\nX-Trailer: t\r\n\r\n".to_vec()));
        steps
    })
}

/// The deterministic byte pattern of large bodies.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// A `Content-Length` body of `len` pattern bytes.
pub fn large(len: usize) -> Script {
    fixed(response(200, &[], &pattern(len)))
}

/// A chunked body of `len` pattern bytes in 64 KiB chunks.
pub fn large_chunked(len: usize) -> Script {
    let body = pattern(len);
    chunked(body.chunks(64 * 1024).map(<[u8]>::to_vec).collect())
}

/// A body delimited by closing the connection.
pub fn close_delimited(body: Vec<u8>) -> Script {
    Arc::new(move |_: &Request| {
        let mut out = b"HTTP/1.1 200 OK\r\nX-Framing: close\r\n\r\n".to_vec();
        out.extend_from_slice(&body);
        vec![Step::Write(out), Step::Close]
    })
}

/// Pauses before the response head: a destination slower than the header limit.
pub fn slow_head(pause: Duration) -> Script {
    Arc::new(move |r: &Request| vec![Step::Pause(pause), Step::Write(echo_response(r))])
}

/// Sends the head and `sent` of `total` body bytes, then stalls for `pause`.
pub fn slow_body(total: usize, sent: usize, pause: Duration) -> Script {
    Arc::new(move |_: &Request| {
        let body = pattern(total);
        let mut first = format!("HTTP/1.1 200 OK\r\nContent-Length: {total}\r\n\r\n").into_bytes();
        first.extend_from_slice(&body[..sent]);
        vec![
            Step::Write(first),
            Step::Pause(pause),
            Step::Write(body[sent..].to_vec()),
        ]
    })
}

/// Resets the connection after reading the request.
pub fn reset() -> Script {
    Arc::new(|_: &Request| vec![Step::Reset])
}

/// Sends the head and part of the body, then resets.
pub fn reset_mid_body() -> Script {
    Arc::new(|_: &Request| {
        vec![
            Step::Write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789".to_vec()),
            Step::Reset,
        ]
    })
}

/// Two interim responses, then the echo.
pub fn interim_then_ok() -> Script {
    Arc::new(|r: &Request| {
        vec![
            Step::Write(b"HTTP/1.1 100 Continue\r\n\r\n".to_vec()),
            Step::Write(
                b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n".to_vec(),
            ),
            Step::Write(echo_response(r)),
        ]
    })
}

/// Echoes the first request of each connection; on any later one, reads it and closes without
/// answering: the stale keep-alive race, made deterministic.
pub fn drop_later_requests() -> Script {
    Arc::new(|r: &Request| {
        if r.req_seq == 0 {
            vec![Step::Write(echo_response(r))]
        } else {
            vec![Step::Close]
        }
    })
}
