//! One connection and its thread: take the next slot of the schedule, send the request at the
//! slot's instant, read the whole response, record the latencies, repeat.
//!
//! Why a blocking thread per connection rather than an event loop: with one request in flight
//! per connection, a thread that owns its connection is the whole state machine, and the
//! standard library offers neither epoll nor sub-millisecond timers for one. A free thread takes
//! the lowest slot nobody has taken yet (one atomic counter), so a slot whose instant comes
//! while every connection is busy is taken by the first connection to become free: exactly a
//! FIFO queue in front of the connections, and its wait is the scheduler lag. Each request costs
//! a write, usually one read and at most one sleep; nothing is shared on the hot path but the
//! counter, and every thread keeps its samples in its own vectors.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use crate::response::{self, MAX_RESPONSE_BYTES};

/// How long to wait for responses still in flight once the schedule is over.
pub(crate) const DRAIN: Duration = Duration::from_secs(5);
/// Bound on opening a connection; loopback connects take microseconds.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// A blocked read wakes this often to check the drain deadline, so that a server that never
/// answers cannot hold a thread past it by more than this.
const READ_POLL: Duration = Duration::from_millis(100);
/// A request write that blocks this long means the server stopped reading.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// The read buffer's starting size, enough for the targets' responses in one read.
const READ_BUFFER_BYTES: usize = 16 * 1024;
/// The read buffer's bound: a head and a body of `MAX_RESPONSE_BYTES` each, plus room for
/// chunk framing. The parser rejects larger responses before this is reached in practice.
const MAX_READ_BUFFER_BYTES: usize = 4 * MAX_RESPONSE_BYTES;

/// The error kind of a request whose answer did not come before the drain deadline, and of a
/// slot never sent because the deadline had passed.
pub(crate) const UNANSWERED: &str = "not answered within the drain time";

/// When each slot is due: slot `i` at `start + i / rate`.
#[derive(Debug)]
pub(crate) struct Schedule {
    start: Instant,
    rate: f64,
    drain_deadline: Instant,
}

impl Schedule {
    /// A schedule of `total` slots at `rate` per second from `start`.
    pub(crate) fn new(start: Instant, rate: f64, total: u64) -> Self {
        let last = Duration::from_secs_f64(total.saturating_sub(1) as f64 / rate);
        Self {
            start,
            rate,
            drain_deadline: start + last + DRAIN,
        }
    }

    /// The first slot's instant.
    pub(crate) fn start(&self) -> Instant {
        self.start
    }

    fn instant(&self, slot: u64) -> Instant {
        self.start + Duration::from_secs_f64(slot as f64 / self.rate)
    }
}

/// What every connection thread shares.
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
    /// The number of slots in the schedule.
    pub(crate) total: u64,
    /// Reconnects allowed over the whole run, so that a server that closes every connection
    /// ends the run instead of being reconnected to forever.
    pub(crate) max_reconnects: usize,
    /// The lowest slot not yet taken.
    pub(crate) next_slot: AtomicU64,
    /// Reconnects made so far.
    pub(crate) reconnects: AtomicUsize,
    /// Set once every thread has started, just before `ready` lets them go.
    pub(crate) schedule: OnceLock<Schedule>,
    /// Holds every thread until the schedule is set.
    pub(crate) ready: Barrier,
}

/// Counters and samples of one connection thread. Latencies are whole microseconds, the unit
/// of the report, which halves the memory of nanosecond samples.
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
/// for its answer), and bounded reads and writes.
pub(crate) fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(READ_POLL))?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    Ok(stream)
}

/// The body of one connection thread. `samples` is the expected number of requests of this
/// connection, to size the sample vectors before the schedule starts.
pub(crate) fn run(shared: &Shared, stream: TcpStream, samples: usize) -> Tally {
    let mut tally = Tally::with_capacity(samples);
    let mut buf = vec![0u8; READ_BUFFER_BYTES];
    shared.ready.wait();
    let Some(schedule) = shared.schedule.get() else {
        return tally;
    };
    let mut stream = Some(stream);
    while let Some(conn) = stream.as_mut() {
        let slot = shared.next_slot.fetch_add(1, Ordering::Relaxed);
        if slot >= shared.total {
            break;
        }
        let due = schedule.instant(slot);
        sleep_until(due);
        let sent_at = Instant::now();
        if sent_at >= schedule.drain_deadline {
            // The slot stays unsent; the report counts every unsent slot as unanswered.
            break;
        }
        tally.sent += 1;
        tally
            .lag_us
            .push(micros(sent_at.saturating_duration_since(due)));
        let is_reusable = match exchange(conn, shared, &mut buf, schedule.drain_deadline) {
            Ok(answer) => {
                let is_2xx = (200..300).contains(&answer.status);
                if is_2xx && answer.has_expected_text {
                    tally.ok += 1;
                    tally
                        .service_us
                        .push(micros(answer.done_at.saturating_duration_since(sent_at)));
                    tally
                        .open_loop_us
                        .push(micros(answer.done_at.saturating_duration_since(due)));
                } else if is_2xx {
                    tally.error("body without expected text".to_owned());
                } else {
                    tally.error(format!("status {}", answer.status));
                }
                // A server that announces a close has answered in full, so that is not an
                // error: the connection is replaced like a lost one.
                !answer.wants_close
            }
            Err(kind) => {
                tally.error(kind);
                false
            }
        };
        if !is_reusable {
            // The old connection closes before its replacement opens.
            drop(stream.take());
            stream = replace(shared, &mut tally);
        }
    }
    tally
}

/// A response read in full.
struct Answer {
    status: u16,
    has_expected_text: bool,
    wants_close: bool,
    /// When the read that completed the response returned.
    done_at: Instant,
}

/// Writes the request and reads one complete response. The error is the kind to count.
///
/// A close the server makes while the connection is idle is noticed only here, when the next
/// request is written or read, and counts against that request; the targets keep connections
/// open far longer than a run, so this does not happen in practice.
fn exchange(
    conn: &mut TcpStream,
    shared: &Shared,
    buf: &mut Vec<u8>,
    deadline: Instant,
) -> Result<Answer, String> {
    conn.write_all(&shared.request)
        .map_err(|e| format!("connection lost: {e}"))?;
    let mut filled = 0;
    loop {
        if filled == buf.len() {
            if buf.len() >= MAX_READ_BUFFER_BYTES {
                return Err("response too large".to_owned());
            }
            buf.resize((buf.len() * 2).min(MAX_READ_BUFFER_BYTES), 0);
        }
        let free = buf.get_mut(filled..).unwrap_or_default();
        match conn.read(free) {
            Ok(0) => return Err("connection lost".to_owned()),
            Ok(n) => filled += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if Instant::now() >= deadline {
                    return Err(UNANSWERED.to_owned());
                }
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("connection lost: {e}")),
        }
        let done_at = Instant::now();
        let received = buf.get(..filled).unwrap_or_default();
        let Some(response) =
            response::parse(received, shared.is_head).map_err(|e| e.to_string())?
        else {
            continue;
        };
        if response.consumed != filled {
            return Err("extra bytes after response".to_owned());
        }
        let has_expected_text = match &shared.expect {
            Some(text) => contains(&response.body, text),
            None => true,
        };
        return Ok(Answer {
            status: response.status,
            has_expected_text,
            wants_close: response.wants_close,
            done_at,
        });
    }
}

/// Opens a new connection in place of a lost one, so that the run keeps its concurrency; none
/// once every slot is taken or the run's reconnects are used up.
fn replace(shared: &Shared, tally: &mut Tally) -> Option<TcpStream> {
    if shared.next_slot.load(Ordering::Relaxed) >= shared.total {
        return None;
    }
    let allowed = shared
        .reconnects
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < shared.max_reconnects).then_some(n + 1)
        });
    if allowed.is_err() {
        return None;
    }
    match connect(shared.addr) {
        Ok(stream) => Some(stream),
        Err(_) => {
            tally.error("reconnect failed".to_owned());
            None
        }
    }
}

/// Sleeps until `due`. There is no busy-wait for the last microseconds: the process's timer
/// slack is lowered at start so that a sleep ends within some ten microseconds of its instant,
/// and spinning would take CPU from the server under test, which shares the machine. What
/// lateness remains is measured, as scheduler lag.
fn sleep_until(due: Instant) {
    loop {
        let now = Instant::now();
        if now >= due {
            return;
        }
        thread::sleep(due - now);
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
    use std::sync::Arc;

    #[test]
    fn schedule_spaces_slots_evenly() {
        let start = Instant::now();
        let schedule = Schedule::new(start, 4.0, 9);
        assert_eq!(schedule.instant(0), start);
        assert_eq!(schedule.instant(2), start + Duration::from_millis(500));
        assert_eq!(
            schedule.drain_deadline,
            start + Duration::from_secs(2) + DRAIN
        );
    }

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
    /// of `answers`, then closes.
    fn serve(answers: Vec<&'static [u8]>) -> (SocketAddr, thread::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind on loopback");
        let addr = listener.local_addr().expect("bound address");
        let handle = thread::spawn(move || {
            let (mut conn, _) = listener.accept().expect("accept");
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
                conn.write_all(answer).expect("write answer");
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
            total,
            max_reconnects: 0,
            next_slot: AtomicU64::new(0),
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

    #[test]
    fn counts_answers_by_kind() {
        let (addr, server) = serve(vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nno",
            b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA",
        ]);
        let shared = shared(addr, 6, Some("ok"));
        let stream = connect(addr).expect("connect");
        let tally = run(&shared, stream, 6);
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
    fn a_close_ends_the_connection_without_an_error() {
        let (addr, server) = serve(vec![
            b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
            b"unreached",
        ]);
        let shared = shared(addr, 3, None);
        let stream = connect(addr).expect("connect");
        let tally = run(&shared, stream, 3);
        drop(server.join());
        // No reconnects are allowed here, so the thread stops after the first answer and the
        // other two slots stay unsent.
        assert_eq!((tally.sent, tally.ok, tally.errors.len()), (1, 1, 0));
    }
}
