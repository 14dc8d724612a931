//! Fixtures of the HTTP server tests: a server running on its own core thread with a test
//! handler, and a raw client on std sockets so that every byte on the wire is chosen by the test.
//!
//! Used by the `http_server*` test modules as `use crate::support::http_server as support;`.
#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::rc::Rc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use futures_channel::oneshot;
use sortie_core::h1::{
    parse_response_head, BodyDecoder, BodyLimits, HeadLimits, Parsed, ResponseHead,
};
use sortie_io::http::{
    serve, Admitted, Body, BodyError, Handler, RequestParts, Response, ServerConfig,
    ShutdownTrigger,
};
use sortie_io::runtime::{bind_reuseport, run_on, Driver};

/// Upper bound of every wait in these tests: nothing legitimate takes this long.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// A server on one core thread, shut down when dropped.
pub(crate) struct TestServer {
    pub(crate) addr: SocketAddr,
    trigger: ShutdownTrigger,
    done: mpsc::Receiver<()>,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Starts a server with the [`TestHandler`].
    pub(crate) fn start(cfg: ServerConfig) -> TestServer {
        TestServer::start_with(cfg, TestHandler::default)
    }

    /// Starts a server with the handler `make` builds on the core thread.
    pub(crate) fn start_with<H, F>(cfg: ServerConfig, make: F) -> TestServer
    where
        H: Handler,
        F: FnOnce() -> H + Send + 'static,
    {
        let (mut listeners, addr) = bind_reuseport("127.0.0.1:0".parse().unwrap(), 1).unwrap();
        let listener = listeners.pop().unwrap();
        let trigger = ShutdownTrigger::new();
        let remote = trigger.clone();
        let (done_tx, done) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            run_on(Driver::detect(), async move {
                let listener = monoio::net::TcpListener::from_std(listener).unwrap();
                let signal = remote.signal();
                serve(listener, Rc::new(make()), Rc::new(cfg), signal).await;
                let _ = done_tx.send(());
            });
        });
        TestServer {
            addr,
            trigger,
            done,
            thread: Some(thread),
        }
    }

    /// Fires shutdown without waiting.
    pub(crate) fn trigger_shutdown(&self) {
        self.trigger.trigger();
    }

    /// Waits until the accept loop has returned; panics past `limit`.
    pub(crate) fn wait_stopped(&mut self, limit: Duration) {
        self.done
            .recv_timeout(limit)
            .expect("server did not stop in time");
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }

    /// Connects a raw client.
    pub(crate) fn client(&self) -> Client {
        Client::connect(self.addr)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.trigger.trigger();
        if self.thread.is_some() && self.done.recv_timeout(WAIT).is_ok() {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// A small test configuration: short timeouts so that timeout tests are quick, long enough
/// that ordinary tests never meet them.
pub(crate) fn test_config() -> ServerConfig {
    ServerConfig {
        header_read_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(5),
        body_read_timeout: Duration::from_secs(5),
        write_timeout: Duration::from_secs(5),
        shutdown_grace: Duration::from_secs(5),
        linger_timeout: Duration::from_millis(500),
        ..ServerConfig::default()
    }
}

/// The test handler. Routes by path:
///
/// - `/echo`: reads the whole body and answers it.
/// - `/chunks`: reads the body piece by piece and answers it with the piece count.
/// - `/noread`: answers without reading the body.
/// - `/limit/N`: body limit N, then like `/echo`.
/// - `/big/N`: answers N bytes.
/// - `/refuse`: refused from the head by `admit` (403).
/// - `/close`: answers with `should_close`.
/// - `/bad-header`: a header value with CRLF (the server must answer 500).
/// - `/slow`: reports that it started, then waits for the release gate.
/// - `/hang`: never answers.
/// - anything else: `METHOD TARGET`.
#[derive(Default)]
pub(crate) struct TestHandler {
    pub(crate) started: Option<mpsc::Sender<()>>,
    pub(crate) release: RefCell<Option<oneshot::Receiver<()>>>,
    pub(crate) served: Cell<u64>,
}

impl TestHandler {
    /// A handler whose `/slow` route reports on `started` and waits for `release`.
    pub(crate) fn with_gate(
        started: mpsc::Sender<()>,
        release: oneshot::Receiver<()>,
    ) -> TestHandler {
        TestHandler {
            started: Some(started),
            release: RefCell::new(Some(release)),
            served: Cell::new(0),
        }
    }
}

impl Handler for TestHandler {
    type Admission = ();

    fn admit(&self, req: &RequestParts) -> Result<Admitted<()>, Response> {
        if req.path() == "/refuse" {
            return Err(Response::text(403, "refused"));
        }
        let body_limit = match req.path().strip_prefix("/limit/") {
            Some(n) => n.parse().unwrap_or(0),
            None => 1 << 20,
        };
        Ok(Admitted {
            body_limit,
            admission: (),
        })
    }

    async fn handle(&self, req: &RequestParts, _: (), body: &mut Body<'_>) -> Response {
        self.served.set(self.served.get() + 1);
        let served = self.served.get().to_string();
        let response = match req.path() {
            "/echo" => match body.read_to_end(1 << 20).await {
                Ok(data) => Response::text(200, data),
                Err(e) => return error_reply(e),
            },
            p if p.starts_with("/limit/") => match body.read_to_end(u64::MAX).await {
                Ok(data) => Response::text(200, data),
                Err(e) => return error_reply(e),
            },
            "/chunks" => {
                let mut data = Vec::new();
                let mut pieces = 0;
                loop {
                    match body.read_chunk().await {
                        Ok(Some(piece)) => {
                            assert!(!piece.is_empty());
                            pieces += 1;
                            data.extend_from_slice(&piece);
                        }
                        Ok(None) => break,
                        Err(e) => return error_reply(e),
                    }
                }
                // A finished body keeps answering `None`.
                assert_eq!(body.read_chunk().await, Ok(None));
                assert!(body.is_end());
                Response::text(200, data).with_header("x-pieces", pieces.to_string())
            }
            // Answers as soon as the first piece of the body is in, before the rest is sent:
            // only a server that streams the body to its handler can.
            "/first-piece" => match body.read_chunk().await {
                Ok(Some(piece)) => Response::text(200, piece.len().to_string()).closing(),
                Ok(None) => Response::text(200, "0").closing(),
                Err(e) => return error_reply(e),
            },
            // `/room/R/N`: N bytes `r` written behind R bytes of room for the head.
            p if p.starts_with("/room/") => {
                let mut it = p.trim_start_matches("/room/").split('/');
                let mut next = || it.next().and_then(|n| n.parse().ok()).unwrap_or(0usize);
                let (room, n) = (next(), next());
                let mut buf = vec![0u8; room];
                buf.resize(room + n, b'r');
                Response::json_behind_room(200, buf, room)
            }
            p if p.starts_with("/big/") => {
                let n: usize = p.trim_start_matches("/big/").parse().unwrap_or(0);
                Response::text(200, vec![b'b'; n])
            }
            "/noread" => Response::text(200, "ignored"),
            "/close" => Response::text(200, "bye").closing(),
            "/bad-header" => Response::new(200).with_header("x-bad", "a\r\nx-injected: 1"),
            "/slow" => {
                if let Some(s) = &self.started {
                    let _ = s.send(());
                }
                let gate = self.release.borrow_mut().take();
                if let Some(gate) = gate {
                    let _ = gate.await;
                }
                Response::text(200, "slow done")
            }
            "/hang" => {
                if let Some(s) = &self.started {
                    let _ = s.send(());
                }
                std::future::pending::<()>().await;
                Response::new(500)
            }
            _ => Response::text(200, format!("{} {}", req.method(), req.target())),
        };
        response.with_header("x-served", served)
    }
}

/// What the test handler answers after a body error; the server must replace it with its own
/// error response, so a test that sees 299 has found a bug.
fn error_reply(e: BodyError) -> Response {
    Response::text(299, format!("handler saw {e}"))
}

/// One parsed response.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, Vec<u8>)>,
    pub(crate) body: Vec<u8>,
}

impl Reply {
    /// The first value of a header, as text.
    pub(crate) fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    /// Whether the response announced `Connection: close`.
    pub(crate) fn is_closing(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }

    /// The body as text.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A raw HTTP/1.1 client on a blocking std socket, every read and write bounded by [`WAIT`].
pub(crate) struct Client {
    pub(crate) stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    pub(crate) fn connect(addr: SocketAddr) -> Client {
        Client::over(TcpStream::connect(addr).unwrap())
    }

    /// A client on a connected `stream`, with the tests' bounds on every read and write.
    fn over(stream: TcpStream) -> Client {
        stream.set_read_timeout(Some(WAIT)).unwrap();
        stream.set_write_timeout(Some(WAIT)).unwrap();
        stream.set_nodelay(true).unwrap();
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    /// Connects with a receive buffer of about `bytes` (the kernel doubles what it is asked
    /// for): a client that stops reading fills it, and the server's send buffer behind it,
    /// after a few responses.
    pub(crate) fn connect_with_receive_buffer(addr: SocketAddr, bytes: usize) -> Client {
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        socket.set_recv_buffer_size(bytes).unwrap();
        socket.connect(&addr.into()).unwrap();
        Client::over(socket.into())
    }

    pub(crate) fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// Sends `GET path` with a Host header.
    pub(crate) fn get(&mut self, path: &str) -> Reply {
        self.send(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
        self.reply()
    }

    /// Reads one more chunk of bytes into the buffer; false at EOF or reset.
    fn fill(&mut self) -> bool {
        let mut tmp = [0u8; 16 * 1024];
        match self.stream.read(&mut tmp) {
            Ok(0) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&tmp[..n]);
                true
            }
            Err(e) if e.kind() == ErrorKind::ConnectionReset => false,
            Err(e) => panic!("read failed: {e}"),
        }
    }

    /// Reads the response to a GET-like request.
    pub(crate) fn reply(&mut self) -> Reply {
        self.reply_to("GET")
    }

    /// Reads the response to a request with `method` (HEAD responses have no body).
    pub(crate) fn reply_to(&mut self, method: &str) -> Reply {
        self.try_reply_to(method)
            .unwrap_or_else(|| panic!("connection ended before a full response: {:?}", self.buf))
    }

    /// Like [`Client::reply_to`], `None` if the connection ends first.
    pub(crate) fn try_reply_to(&mut self, method: &str) -> Option<Reply> {
        loop {
            match parse_response_head(&self.buf, method, &HeadLimits::RESPONSE) {
                Ok(Parsed::Complete { head, consumed_len }) => {
                    let (status, headers, framing) = owned_head(&head);
                    let mut decoder =
                        BodyDecoder::for_response(framing, BodyLimits::with_max_body(1 << 30))
                            .unwrap();
                    let mut body = Vec::new();
                    let mut at = consumed_len;
                    loop {
                        let p = decoder
                            .decode(&self.buf[at..], &mut |d| body.extend_from_slice(d))
                            .unwrap();
                        at += p.consumed;
                        if p.is_done {
                            break;
                        }
                        let keep = self.buf[at..].to_vec();
                        self.buf = keep;
                        at = 0;
                        if !self.fill() {
                            if decoder.is_complete_at_eof() {
                                break;
                            }
                            return None;
                        }
                    }
                    self.buf.drain(..at);
                    return Some(Reply {
                        status,
                        headers,
                        body,
                    });
                }
                Ok(Parsed::Partial) => {
                    if !self.fill() {
                        return None;
                    }
                }
                Err(e) => panic!(
                    "bad response head {e}: {:?}",
                    String::from_utf8_lossy(&self.buf)
                ),
            }
        }
    }

    /// Asserts that the server closes the connection without sending anything more, and
    /// returns how long that took.
    pub(crate) fn expect_closed(&mut self) -> Duration {
        let start = Instant::now();
        while self.fill() {}
        assert!(
            self.buf.is_empty(),
            "unexpected bytes before close: {:?}",
            String::from_utf8_lossy(&self.buf)
        );
        start.elapsed()
    }

    /// Whether the server has closed the connection (EOF or reset) once any buffered response
    /// bytes are read.
    pub(crate) fn is_closed_now(&mut self) -> bool {
        !self.fill()
    }

    /// Half-closes the client's sending side.
    pub(crate) fn shutdown_write(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Write);
    }
}

fn owned_head(
    head: &ResponseHead<'_>,
) -> (
    u16,
    Vec<(String, Vec<u8>)>,
    sortie_core::h1::ResponseFraming,
) {
    let headers = head
        .headers()
        .iter()
        .map(|h| (h.name().to_string(), h.value().to_vec()))
        .collect();
    (head.status(), headers, head.framing())
}

/// Retries `f` until it returns `Some`, for at most [`WAIT`]: waiting on a condition with a
/// deadline, never a fixed sleep.
pub(crate) fn eventually<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    super::wait::eventually(WAIT, what, f)
}
