//! One event loop and its thread: a share of the schedule's slots, a share of the connections,
//! non-blocking sockets in one epoll set, and a timed wait until the next slot is due.
//!
//! Why an event loop rather than a blocking thread per connection: a thread per connection
//! costs two context switches per request (the sleep until its slot and the wait for its
//! answer), some 20 us of CPU each time, taken from the server under test on the same machine.
//! One loop sends every due request and reads every answer that has arrived in one wakeup, so
//! at tens of thousands of requests per second most wakeups do several things at once.
//!
//! The loop keeps the open-loop semantics: its slots are due at fixed instants; a slot that
//! comes due while every connection of the loop is busy waits for the first one to become free
//! (the slots wait in order, so the first unsent slot is the head of a FIFO queue), and that
//! wait is the scheduler lag. Each loop keeps its samples in its own vectors, sized up front.

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use crate::response::{self, MAX_RESPONSE_BYTES};
use crate::schedule::{Schedule, Share};
use crate::sys::{Epoll, Event, Events};

/// Bound on opening a connection; loopback connects take microseconds.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// A request write that cannot finish this long means the server stopped reading.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// The read buffer's starting size, enough for the targets' responses in one read.
const READ_BUFFER_BYTES: usize = 16 * 1024;
/// The read buffer's bound: a head and a body of `MAX_RESPONSE_BYTES` each, plus room for
/// chunk framing. The parser rejects larger responses before this is reached in practice.
const MAX_READ_BUFFER_BYTES: usize = 4 * MAX_RESPONSE_BYTES;
/// Readiness reports taken per wait; more simply wait for the next one.
const MAX_EVENTS: usize = 256;

/// The error kind of a request whose answer did not come before the drain deadline, and of a
/// slot never sent because the deadline had passed.
pub(crate) const UNANSWERED: &str = "not answered within the drain time";

/// What every event loop shares.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The server's address, for reconnects.
    pub(crate) addr: SocketAddr,
    /// The bytes of the request every slot sends.
    pub(crate) request: Vec<u8>,
    /// Text every 2xx body must contain to count as ok.
    pub(crate) expect: Option<Vec<u8>>,
    /// Whether the request is HEAD (its responses have no body).
    pub(crate) is_head: bool,
    /// Reconnects allowed over the whole run, so that a server that closes every connection
    /// ends the run instead of being reconnected to forever.
    pub(crate) max_reconnects: usize,
    /// Reconnects made so far.
    pub(crate) reconnects: AtomicUsize,
    /// Set once every thread has started, just before `ready` lets them go.
    pub(crate) schedule: OnceLock<Schedule>,
    /// Holds every thread until the schedule is set.
    pub(crate) ready: Barrier,
}

/// Counters and samples of one event loop. Latencies are whole microseconds, the unit of the
/// report, which halves the memory of nanosecond samples.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// Requests written.
    pub(crate) sent: u64,
    /// Requests answered 2xx (with the expected text, if any).
    pub(crate) ok: u64,
    /// Failed requests by kind.
    pub(crate) errors: BTreeMap<String, u64>,
    /// Request written -> response complete, per ok request.
    pub(crate) service_us: Vec<u32>,
    /// Scheduled instant -> response complete, per ok request.
    pub(crate) open_loop_us: Vec<u32>,
    /// Scheduled instant -> request written, per sent request.
    pub(crate) lag_us: Vec<u32>,
}

impl Tally {
    fn with_capacity(samples: usize) -> Self {
        Self {
            service_us: Vec::with_capacity(samples),
            open_loop_us: Vec::with_capacity(samples),
            lag_us: Vec::with_capacity(samples),
            ..Self::default()
        }
    }

    fn error(&mut self, kind: String) {
        *self.errors.entry(kind).or_default() += 1;
    }
}

/// Opens a connection set up for this load: no Nagle delay (requests are small and each waits
/// for its answer), and non-blocking, for the event loop.
pub(crate) fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
    stream.set_nodelay(true)?;
    stream.set_nonblocking(true)?;
    Ok(stream)
}

/// Where a connection's current request stands.
#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    /// Free for the next slot.
    Idle,
    /// The request is partly written: the socket's send buffer was full.
    Writing {
        written: usize,
        due: Instant,
        sent_at: Instant,
    },
    /// The request is written; its response is awaited.
    Reading { due: Instant, sent_at: Instant },
    /// Closed and not replaced.
    Lost,
}

/// One keep-alive connection of a loop.
struct Conn {
    stream: Option<TcpStream>,
    state: State,
    buf: Vec<u8>,
    filled: usize,
    /// The socket reported input or a close while no request was in flight. Edge-triggered
    /// readiness reports that only once, so it is remembered, and the next request reads at
    /// once after its write: the stale bytes or the close then count against that request,
    /// as they would with a blocking socket.
    has_pending_input: bool,
}

impl Conn {
    fn new(stream: TcpStream) -> Self {
        Self {
            stream: Some(stream),
            state: State::Idle,
            buf: vec![0u8; READ_BUFFER_BYTES],
            filled: 0,
            has_pending_input: false,
        }
    }
}

/// What one read of a connection came to.
enum ReadOutcome {
    /// The response is not complete yet; the next edge brings more.
    Partial,
    /// A whole response, with what the report needs of it.
    Complete(Answer),
    /// The error kind to count; the connection cannot be reused.
    Failed(String),
}

/// A response read in full.
struct Answer {
    status: u16,
    has_expected_text: bool,
    wants_close: bool,
    /// When the read that completed the response returned.
    done_at: Instant,
}

/// One event loop, set up before its thread starts so that a failure to set it up stops the
/// run before any load is sent.
pub(crate) struct Loop {
    shared: Arc<Shared>,
    epoll: Epoll,
    conns: Vec<Conn>,
    /// Idle connections, oldest first, so that the load rotates over every connection as a
    /// client with a thread per connection would.
    free: VecDeque<usize>,
    share: Share,
    /// The index within `share` of the first slot not yet sent.
    next: u64,
    /// Connections with a request written or being written.
    in_flight: usize,
    /// Connections with a request partly written, whose write deadline the loop watches.
    writing: usize,
    /// Connections not lost.
    live: usize,
    tally: Tally,
}

impl Loop {
    /// A loop owning `share` of the slots and `streams` (connected with [`connect`]).
    pub(crate) fn new(
        shared: Arc<Shared>,
        share: Share,
        streams: Vec<TcpStream>,
    ) -> io::Result<Self> {
        let epoll = Epoll::new()?;
        let mut conns = Vec::with_capacity(streams.len());
        for (i, stream) in streams.into_iter().enumerate() {
            epoll.add(&stream, token(i))?;
            conns.push(Conn::new(stream));
        }
        let samples = usize::try_from(share.len()).unwrap_or(0);
        Ok(Self {
            shared,
            epoll,
            free: (0..conns.len()).collect(),
            live: conns.len(),
            conns,
            share,
            next: 0,
            in_flight: 0,
            writing: 0,
            tally: Tally::with_capacity(samples),
        })
    }

    /// Runs the loop's share of the schedule and returns what it saw.
    pub(crate) fn run(mut self) -> Tally {
        self.shared.ready.wait();
        let shared = Arc::clone(&self.shared);
        let Some(schedule) = shared.schedule.get() else {
            return self.tally;
        };
        let mut events = Events::with_capacity(MAX_EVENTS);
        loop {
            self.send_due(schedule);
            let now = Instant::now();
            let is_sending_over = self.share.slot(self.next).is_none() || self.live == 0;
            if is_sending_over && self.in_flight == 0 {
                break;
            }
            if now >= schedule.drain_deadline {
                self.abandon_in_flight();
                break;
            }
            let wake = self.wake_at(schedule);
            if let Err(e) = self
                .epoll
                .wait(&mut events, wake.saturating_duration_since(now))
            {
                // The slots not yet sent count as unanswered in the report.
                self.tally.error(format!("event loop failed: {e}"));
                self.abandon_in_flight();
                break;
            }
            for event in events.iter() {
                self.on_event(event);
            }
            if self.writing > 0 {
                self.expire_writes();
            }
        }
        self.tally
    }

    /// The instant the loop must wake by even if no socket reports: the next slot's, when a
    /// connection is free to send it; the earliest write deadline; the drain deadline.
    fn wake_at(&self, schedule: &Schedule) -> Instant {
        let mut wake = schedule.drain_deadline;
        if !self.free.is_empty() {
            if let Some(slot) = self.share.slot(self.next) {
                wake = wake.min(schedule.instant(slot));
            }
        }
        if self.writing > 0 {
            for conn in &self.conns {
                if let State::Writing { sent_at, .. } = conn.state {
                    wake = wake.min(sent_at + WRITE_TIMEOUT);
                }
            }
        }
        wake
    }

    /// Sends every slot that is due on the free connections, oldest slot first.
    fn send_due(&mut self, schedule: &Schedule) {
        while let Some(slot) = self.share.slot(self.next) {
            let due = schedule.instant(slot);
            let now = Instant::now();
            if due > now || self.free.is_empty() {
                return;
            }
            if now >= schedule.drain_deadline {
                // The slot stays unsent; the report counts every unsent slot as unanswered.
                return;
            }
            let Some(i) = self.free.pop_front() else {
                return;
            };
            self.next += 1;
            self.tally.sent += 1;
            self.tally
                .lag_us
                .push(micros(now.saturating_duration_since(due)));
            self.in_flight += 1;
            self.writing += 1;
            if let Some(conn) = self.conns.get_mut(i) {
                conn.state = State::Writing {
                    written: 0,
                    due,
                    sent_at: now,
                };
            }
            self.write(i);
        }
    }

    /// Writes what is left of connection `i`'s request; once it is all written, the response
    /// is awaited.
    fn write(&mut self, i: usize) {
        let Some(conn) = self.conns.get_mut(i) else {
            return;
        };
        let State::Writing {
            mut written,
            due,
            sent_at,
        } = conn.state
        else {
            return;
        };
        let Some(stream) = conn.stream.as_mut() else {
            return;
        };
        let request = &self.shared.request;
        let failure = loop {
            let Some(rest) = request.get(written..).filter(|rest| !rest.is_empty()) else {
                break None;
            };
            match stream.write(rest) {
                Ok(0) => break Some("connection lost: wrote nothing".to_owned()),
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // The next edge with room to write resumes here.
                    conn.state = State::Writing {
                        written,
                        due,
                        sent_at,
                    };
                    return;
                }
                Err(e) => break Some(format!("connection lost: {e}")),
            }
        };
        if let Some(kind) = failure {
            self.fail(i, kind);
            return;
        }
        self.writing -= 1;
        conn.state = State::Reading { due, sent_at };
        if conn.has_pending_input {
            conn.has_pending_input = false;
            self.read(i);
        }
    }

    /// Handles one readiness report.
    fn on_event(&mut self, event: Event) {
        let Ok(i) = usize::try_from(event.token) else {
            return;
        };
        let Some(conn) = self.conns.get_mut(i) else {
            return;
        };
        match conn.state {
            State::Idle => conn.has_pending_input |= event.is_readable,
            State::Writing { .. } => {
                conn.has_pending_input |= event.is_readable;
                if event.is_writable {
                    self.write(i);
                }
            }
            State::Reading { .. } => {
                if event.is_readable {
                    self.read(i);
                }
            }
            State::Lost => {}
        }
    }

    /// Reads what connection `i` has and, once a response is complete, records it and frees
    /// the connection.
    fn read(&mut self, i: usize) {
        let Some(conn) = self.conns.get_mut(i) else {
            return;
        };
        let State::Reading { due, sent_at } = conn.state else {
            return;
        };
        match read_response(conn, &self.shared) {
            ReadOutcome::Partial => {}
            ReadOutcome::Failed(kind) => self.fail(i, kind),
            ReadOutcome::Complete(answer) => {
                conn.state = State::Idle;
                conn.filled = 0;
                self.in_flight -= 1;
                let is_2xx = (200..300).contains(&answer.status);
                if is_2xx && answer.has_expected_text {
                    self.tally.ok += 1;
                    self.tally
                        .service_us
                        .push(micros(answer.done_at.saturating_duration_since(sent_at)));
                    self.tally
                        .open_loop_us
                        .push(micros(answer.done_at.saturating_duration_since(due)));
                } else if is_2xx {
                    self.tally.error("body without expected text".to_owned());
                } else {
                    self.tally.error(format!("status {}", answer.status));
                }
                // A server that announces a close has answered in full, so that is not an
                // error: the connection is replaced like a lost one.
                if answer.wants_close {
                    self.replace(i);
                } else {
                    self.free.push_back(i);
                }
            }
        }
    }

    /// Counts a failed request of connection `i` and replaces the connection.
    fn fail(&mut self, i: usize, kind: String) {
        let Some(conn) = self.conns.get_mut(i) else {
            return;
        };
        match conn.state {
            State::Writing { .. } => {
                self.writing -= 1;
                self.in_flight -= 1;
            }
            State::Reading { .. } => self.in_flight -= 1,
            State::Idle | State::Lost => {}
        }
        conn.state = State::Idle;
        self.tally.error(kind);
        self.replace(i);
    }

    /// Closes connection `i` and opens a new one in its place, so that the run keeps its
    /// concurrency; none once the loop has sent every slot or the run's reconnects are used up.
    fn replace(&mut self, i: usize) {
        let Some(conn) = self.conns.get_mut(i) else {
            return;
        };
        // The old connection closes (and leaves the epoll set) before its replacement opens.
        drop(conn.stream.take());
        conn.state = State::Lost;
        conn.filled = 0;
        conn.has_pending_input = false;
        self.live -= 1;
        if self.share.slot(self.next).is_none() {
            return;
        }
        let shared = &self.shared;
        let allowed = shared
            .reconnects
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < shared.max_reconnects).then_some(n + 1)
            });
        if allowed.is_err() {
            return;
        }
        let stream = connect(shared.addr).and_then(|stream| {
            self.epoll.add(&stream, token(i))?;
            Ok(stream)
        });
        match stream {
            Ok(stream) => {
                conn.stream = Some(stream);
                conn.state = State::Idle;
                self.live += 1;
                self.free.push_back(i);
            }
            Err(_) => self.tally.error("reconnect failed".to_owned()),
        }
    }

    /// Fails the requests whose write has not finished within `WRITE_TIMEOUT`.
    fn expire_writes(&mut self) {
        let now = Instant::now();
        for i in 0..self.conns.len() {
            let is_expired = self.conns.get(i).is_some_and(|conn| {
                matches!(conn.state, State::Writing { sent_at, .. } if now >= sent_at + WRITE_TIMEOUT)
            });
            if is_expired {
                self.fail(i, "connection lost: request write timed out".to_owned());
            }
        }
    }

    /// Counts every request still in flight as unanswered; the drain time is over.
    fn abandon_in_flight(&mut self) {
        for conn in &mut self.conns {
            if matches!(conn.state, State::Writing { .. } | State::Reading { .. }) {
                conn.state = State::Idle;
                self.tally.error(UNANSWERED.to_owned());
            }
        }
        self.in_flight = 0;
        self.writing = 0;
    }
}

/// Connection `i`'s epoll token.
fn token(i: usize) -> u64 {
    u64::try_from(i).unwrap_or(u64::MAX)
}

/// Reads from `conn` until a response is complete or the socket has nothing more.
///
/// The socket is edge-triggered, so a read that fills less than the free space has emptied it
/// (TCP hands over everything queued), and whatever arrives later brings a new report: the
/// loop reads again only when the buffer filled up, which saves the read that would return
/// `WouldBlock` after almost every response.
fn read_response(conn: &mut Conn, shared: &Shared) -> ReadOutcome {
    let Some(stream) = conn.stream.as_mut() else {
        return ReadOutcome::Failed("connection lost".to_owned());
    };
    loop {
        if conn.filled == conn.buf.len() {
            if conn.buf.len() >= MAX_READ_BUFFER_BYTES {
                return ReadOutcome::Failed("response too large".to_owned());
            }
            let grown = (conn.buf.len() * 2).min(MAX_READ_BUFFER_BYTES);
            conn.buf.resize(grown, 0);
        }
        let free = conn.buf.get_mut(conn.filled..).unwrap_or_default();
        let room = free.len();
        let n = match stream.read(free) {
            Ok(0) => return ReadOutcome::Failed("connection lost".to_owned()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return ReadOutcome::Partial,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return ReadOutcome::Failed(format!("connection lost: {e}")),
        };
        conn.filled += n;
        let done_at = Instant::now();
        let received = conn.buf.get(..conn.filled).unwrap_or_default();
        match response::parse(received, shared.is_head) {
            Err(e) => return ReadOutcome::Failed(e.to_string()),
            Ok(None) if n < room => return ReadOutcome::Partial,
            Ok(None) => {}
            Ok(Some(response)) => {
                if response.consumed != conn.filled {
                    return ReadOutcome::Failed("extra bytes after response".to_owned());
                }
                let has_expected_text = match &shared.expect {
                    Some(text) => contains(&response.body, text),
                    None => true,
                };
                return ReadOutcome::Complete(Answer {
                    status: response.status,
                    has_expected_text,
                    wants_close: response.wants_close,
                    done_at,
                });
            }
        }
    }
}

fn micros(duration: Duration) -> u32 {
    u32::try_from(duration.as_micros()).unwrap_or(u32::MAX)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty()
        || haystack
            .windows(needle.len())
            .any(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::thread;

    #[test]
    fn contains_finds_text() {
        let cases: &[(&[u8], &[u8], bool)] = &[
            (b"{\"status\":200}", b"\"status\":200", true),
            (b"{\"status\":502}", b"\"status\":200", false),
            (b"", b"x", false),
            (b"abc", b"", true),
        ];
        for (haystack, needle, expected) in cases {
            assert_eq!(
                contains(haystack, needle),
                *expected,
                "{haystack:?} {needle:?}"
            );
        }
    }

    /// A one-connection server on loopback that reads each request and answers with the next
    /// of `answers`, each written in pieces of at most `piece` bytes, then closes.
    fn serve(answers: Vec<&'static [u8]>, piece: usize) -> (SocketAddr, thread::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind on loopback");
        let addr = listener.local_addr().expect("bound address");
        let handle = thread::spawn(move || {
            let (mut conn, _) = listener.accept().expect("accept");
            conn.set_nodelay(true).expect("nodelay");
            let mut request = [0u8; 1024];
            for answer in answers {
                let mut got = Vec::new();
                while !got.ends_with(b"\r\n\r\n") {
                    let n = conn.read(&mut request).expect("read request");
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&request[..n]);
                }
                for chunk in answer.chunks(piece) {
                    conn.write_all(chunk).expect("write answer");
                }
            }
        });
        (addr, handle)
    }

    fn shared(addr: SocketAddr, total: u64, expect: Option<&str>) -> Arc<Shared> {
        let shared = Arc::new(Shared {
            addr,
            request: b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            expect: expect.map(|text| text.as_bytes().to_vec()),
            is_head: false,
            max_reconnects: 0,
            reconnects: AtomicUsize::new(0),
            schedule: OnceLock::new(),
            ready: Barrier::new(1),
        });
        shared
            .schedule
            .set(Schedule::new(Instant::now(), 100_000.0, total))
            .expect("unset");
        shared
    }

    fn run_one(addr: SocketAddr, total: u64, expect: Option<&str>) -> Tally {
        let shared = shared(addr, total, expect);
        let stream = connect(addr).expect("connect");
        Loop::new(shared, Share::new(0, 1, total), vec![stream])
            .expect("event loop")
            .run()
    }

    #[test]
    fn counts_answers_by_kind() {
        let (addr, server) = serve(
            vec![
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nno",
                b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA",
            ],
            usize::MAX,
        );
        let tally = run_one(addr, 6, Some("ok"));
        server.join().expect("server thread");
        assert_eq!((tally.sent, tally.ok), (5, 2));
        assert_eq!(
            (
                tally.service_us.len(),
                tally.open_loop_us.len(),
                tally.lag_us.len()
            ),
            (2, 2, 5)
        );
        let errors: Vec<(&str, u64)> = tally.errors.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(
            errors,
            [
                ("body without expected text", 1),
                ("extra bytes after response", 1),
                ("status 503", 1)
            ]
        );
    }

    #[test]
    fn a_response_in_pieces_is_joined() {
        let (addr, server) = serve(
            vec![
                b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n01234\r\n0\r\n\r\n",
            ],
            3,
        );
        let tally = run_one(addr, 2, Some("234"));
        server.join().expect("server thread");
        assert_eq!((tally.sent, tally.ok, tally.errors.len()), (2, 2, 0));
    }

    #[test]
    fn a_close_ends_the_connection_without_an_error() {
        let (addr, server) = serve(
            vec![
                b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
                b"unreached",
            ],
            usize::MAX,
        );
        let tally = run_one(addr, 3, None);
        drop(server.join());
        // No reconnects are allowed here, so the loop stops after the first answer and the
        // other two slots stay unsent.
        assert_eq!((tally.sent, tally.ok, tally.errors.len()), (1, 1, 0));
    }

    #[test]
    fn a_lost_connection_counts_against_its_request() {
        // The server reads the first request and closes without answering.
        let (addr, server) = serve(vec![b""], usize::MAX);
        let tally = run_one(addr, 2, None);
        drop(server.join());
        assert_eq!((tally.sent, tally.ok), (1, 0));
        let errors: Vec<(&str, u64)> = tally.errors.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(errors, [("connection lost", 1)]);
    }
}
