//! The HTTP/1.1 server notices a client that leaves while its handler runs: the handler is
//! dropped soon after, and bytes that arrive meanwhile (pipelined requests) are kept.

use crate::support::http_server as support;

use std::cell::RefCell;
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use futures_channel::oneshot;
use sortie_core::h1::HeadLimits;
use sortie_io::http::{Admitted, Body, Handler, RequestParts, Response, ServerConfig};
use support::{test_config, Client, TestServer, WAIT};

/// How soon a handler must be dropped after its client left.
const DROP_WITHIN: Duration = Duration::from_secs(1);

/// Reports on drop unless the handler finished: the stand-in for the guards that cancel
/// upstream work and release capacity.
struct DropProbe {
    path: String,
    dropped: mpsc::Sender<(String, Instant)>,
    is_finished: bool,
}

impl Drop for DropProbe {
    fn drop(&mut self) {
        if !self.is_finished {
            let _ = self.dropped.send((self.path.clone(), Instant::now()));
        }
    }
}

/// `/wait/*` reads its body, reports that it started, then waits for the next gate (forever
/// when none is left); everything else answers `METHOD TARGET BODY` at once.
struct WaitingHandler {
    started: mpsc::Sender<String>,
    dropped: mpsc::Sender<(String, Instant)>,
    gates: RefCell<Vec<oneshot::Receiver<()>>>,
}

impl Handler for WaitingHandler {
    type Admission = ();

    fn admit(&self, _req: &RequestParts) -> Result<Admitted<()>, Response> {
        Ok(Admitted::with_default_limit())
    }

    async fn handle(&self, req: &RequestParts, _: (), body: &mut Body<'_>) -> Response {
        let data = match body.read_to_end(1 << 20).await {
            Ok(data) => data,
            Err(e) => return Response::text(299, e.to_string()),
        };
        let path = req.path().to_string();
        if !path.starts_with("/wait") {
            let text = format!("{} {} {}", req.method(), req.target(), data.len());
            return Response::text(200, text);
        }
        let mut probe = DropProbe {
            path: path.clone(),
            dropped: self.dropped.clone(),
            is_finished: false,
        };
        let _ = self.started.send(path.clone());
        let gate = self.gates.borrow_mut().pop();
        match gate {
            Some(gate) => {
                let _ = gate.await;
            }
            None => std::future::pending::<()>().await,
        }
        probe.is_finished = true;
        Response::text(200, format!("done {path}"))
    }
}

/// A running server with the waiting handler, its reports, and the senders of its gates (the
/// last gate is taken first).
struct Fixture {
    server: TestServer,
    started: mpsc::Receiver<String>,
    dropped: mpsc::Receiver<(String, Instant)>,
    gates: Vec<oneshot::Sender<()>>,
}

impl Fixture {
    fn start(cfg: ServerConfig, gate_count: usize) -> Fixture {
        let (started_tx, started) = mpsc::channel();
        let (dropped_tx, dropped) = mpsc::channel();
        let (gates, receivers): (Vec<_>, Vec<_>) =
            (0..gate_count).map(|_| oneshot::channel::<()>()).unzip();
        let server = TestServer::start_with(cfg, move || WaitingHandler {
            started: started_tx,
            dropped: dropped_tx,
            gates: RefCell::new(receivers),
        });
        Fixture {
            server,
            started,
            dropped,
            gates,
        }
    }

    fn wait_started(&self, path: &str) {
        let got = self
            .started
            .recv_timeout(WAIT)
            .expect("handler did not start");
        assert_eq!(got, path);
    }

    /// Waits for the handler at `path` to be dropped; returns how long after `since`.
    fn wait_dropped(&self, path: &str, since: Instant) -> Duration {
        let (got, at) = self
            .dropped
            .recv_timeout(DROP_WITHIN)
            .unwrap_or_else(|_| panic!("handler {path} not dropped within {DROP_WITHIN:?}"));
        assert_eq!(got, path);
        at.saturating_duration_since(since)
    }

    fn release(&mut self) {
        let gate = self.gates.pop().expect("a gate left");
        gate.send(()).expect("handler waiting on the gate");
    }

    /// The server still serves new connections (it did not panic or stall).
    fn assert_serving(&self) {
        let mut c = self.server.client();
        let r = c.get("/alive");
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), "GET /alive 0");
    }
}

#[test]
fn client_closing_while_the_handler_waits_drops_the_handler() {
    let fx = Fixture::start(test_config(), 0);
    let cases: &[(&str, &[u8])] = &[
        ("/wait/get", b"GET /wait/get HTTP/1.1\r\nHost: t\r\n\r\n"),
        (
            "/wait/post",
            b"POST /wait/post HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello",
        ),
        (
            "/wait/chunked",
            b"POST /wait/chunked HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n\
              3\r\nabc\r\n0\r\n\r\n",
        ),
    ];
    for (path, request) in cases {
        let mut c = fx.server.client();
        c.send(request);
        fx.wait_started(path);
        let closed_at = Instant::now();
        drop(c);
        let after = fx.wait_dropped(path, closed_at);
        println!("{path}: handler dropped {after:?} after the client closed");
    }
    fx.assert_serving();
}

#[test]
fn client_reset_while_the_handler_waits_drops_the_handler() {
    let fx = Fixture::start(test_config(), 0);
    let mut stream = TcpStream::connect(fx.server.addr).unwrap();
    std::io::Write::write_all(&mut stream, b"GET /wait/reset HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    fx.wait_started("/wait/reset");
    // A zero linger turns the close into a reset.
    socket2::SockRef::from(&stream)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    let closed_at = Instant::now();
    drop(stream);
    fx.wait_dropped("/wait/reset", closed_at);
    fx.assert_serving();
}

/// A half-close is treated as the client leaving (see the server's module docs).
#[test]
fn client_half_close_while_the_handler_waits_drops_the_handler() {
    let fx = Fixture::start(test_config(), 0);
    let mut c = fx.server.client();
    c.send(b"GET /wait/half HTTP/1.1\r\nHost: t\r\n\r\n");
    fx.wait_started("/wait/half");
    let closed_at = Instant::now();
    c.shutdown_write();
    fx.wait_dropped("/wait/half", closed_at);
    assert!(c.is_closed_now());
    fx.assert_serving();
}

#[test]
fn request_sent_while_the_handler_waits_is_answered_after_it() {
    let mut fx = Fixture::start(test_config(), 1);
    let mut c = fx.server.client();
    c.send(b"GET /wait/first HTTP/1.1\r\nHost: t\r\n\r\n");
    fx.wait_started("/wait/first");
    c.send(b"POST /second HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc");
    fx.release();
    assert_eq!(c.reply().text(), "done /wait/first");
    assert_eq!(c.reply_to("POST").text(), "POST /second 3");
    // The connection goes on, and nothing was dropped.
    assert_eq!(c.get("/third").text(), "GET /third 0");
    assert!(fx.dropped.try_recv().is_err());
}

#[test]
fn bytes_buffered_before_and_during_the_handler_are_all_kept() {
    let mut fx = Fixture::start(test_config(), 1);
    let mut c = fx.server.client();
    // The second request arrives with the first, and more while the handler waits: the watch
    // must not consume any of it.
    c.send(
        b"POST /wait/first HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi\
          GET /second HTTP/1.1\r\nHost: t\r\n\r\nGET /thi",
    );
    fx.wait_started("/wait/first");
    c.send(b"rd HTTP/1.1\r\nHost: t\r\n\r\n");
    c.send(b"GET /fourth HTTP/1.1\r\nHost: t\r\n\r\n");
    fx.release();
    assert_eq!(c.reply_to("POST").text(), "done /wait/first");
    assert_eq!(c.reply().text(), "GET /second 0");
    assert_eq!(c.reply().text(), "GET /third 0");
    assert_eq!(c.reply().text(), "GET /fourth 0");
    assert_eq!(c.get("/fifth").text(), "GET /fifth 0");
}

#[test]
fn pipelined_bytes_past_the_head_limit_wait_for_the_handler_without_error() {
    const HEAD_LIMIT: usize = 1024;
    let cfg = ServerConfig {
        head_limits: HeadLimits {
            max_head_bytes: HEAD_LIMIT,
            ..HeadLimits::REQUEST
        },
        ..test_config()
    };
    let mut fx = Fixture::start(cfg, 1);
    let mut c = fx.server.client();
    c.send(b"GET /wait/first HTTP/1.1\r\nHost: t\r\n\r\n");
    fx.wait_started("/wait/first");
    let mut pipelined = Vec::new();
    let mut count = 0;
    while pipelined.len() < 3 * HEAD_LIMIT {
        pipelined
            .extend_from_slice(format!("GET /p/{count} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
        count += 1;
    }
    c.send(&pipelined);
    fx.release();
    assert_eq!(c.reply().text(), "done /wait/first");
    for i in 0..count {
        assert_eq!(c.reply().text(), format!("GET /p/{i} 0"));
    }
    // The client stayed connected, so the handler was never dropped.
    assert!(fx.dropped.try_recv().is_err());
}

#[test]
fn client_closing_after_pipelined_bytes_still_drops_the_handler() {
    let fx = Fixture::start(test_config(), 0);
    let mut c = fx.server.client();
    c.send(b"GET /wait/first HTTP/1.1\r\nHost: t\r\n\r\n");
    fx.wait_started("/wait/first");
    c.send(b"GET /second HTTP/1.1\r\nHost: t\r\n\r\n");
    let closed_at = Instant::now();
    drop(c);
    fx.wait_dropped("/wait/first", closed_at);
    fx.assert_serving();
}

#[test]
fn answered_handler_leaves_the_connection_ready_for_the_next_request() {
    let mut fx = Fixture::start(test_config(), 2);
    let mut c: Client = fx.server.client();
    for round in ["/wait/a", "/wait/b"] {
        c.send(format!("GET {round} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
        fx.wait_started(round);
        fx.release();
        assert_eq!(c.reply().text(), format!("done {round}"));
        assert_eq!(c.get("/next").text(), "GET /next 0");
    }
    assert!(fx.dropped.try_recv().is_err());
}
