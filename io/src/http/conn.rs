//! The connection driver: reads request heads into one growable buffer, parses them with the
//! sans-IO codec, runs the handler, writes responses in order, and enforces every timeout.
//!
//! On the per-request path: no blocking, no locks, debug-level logging only.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::pin::pin;
use std::rc::Rc;

use bytes::Bytes;
use monoio::buf::{IoBuf, IoBufMut, Slice};
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use monoio::net::TcpStream;
use monoio::time::Instant;
use sortie_core::h1::{
    parse_request_head_with, write_chunk_header, BodyDecoder, BodyLimits, Parsed, Version,
    CHUNK_DATA_END, LAST_CHUNK,
};

use super::body::{Body, Settled};
use super::config::ServerConfig;
use super::departure::client_departure;
use super::handler::Handler;
use super::race::{race, Either};
use super::request::RequestParts;
use super::response::{
    encode_head, encode_head_for, ConnectionField, Response, ResponseBody, StreamBody, Tunnel,
    CONTENT_TYPE_FIELD,
};
use super::shutdown::{LatchSlot, ShutdownSignal};
use crate::send_ahead::{collect, SecondWriter, Sent, MAX_SENT_AHEAD_BYTES};
use crate::timer::Timer;

/// Capacity of a connection's read buffer when it starts and after every request: enough for
/// the heads of ordinary API requests, small enough for many idle keep-alive connections.
pub const INITIAL_READ_BUFFER_BYTES: usize = 4 * 1024;
/// How long a connection waits for its next request with its read buffer and its task. After
/// that the wait (for readiness: no read holds the buffer) ends, the buffer and the boxed state
/// of reading heads are freed, the task ends, and the connection is parked (`park.rs`): an
/// idle keep-alive connection keeps its socket and a slot, nothing else. A connection whose
/// requests come closer together than this never pays for the switch.
pub(crate) const IDLE_RELEASE: std::time::Duration = std::time::Duration::from_millis(100);
/// Capacity the read buffer grows to while a request body is read, so that uploads take few
/// reads; it shrinks back after the request.
pub const BODY_READ_BUFFER_BYTES: usize = 16 * 1024;
/// Bodies up to this size are copied behind the head and sent in one write; larger ones are
/// written separately to avoid the copy.
const COALESCE_BODY_BYTES: usize = 16 * 1024;
/// Most bytes a busy connection keeps in its request parts between requests; the parts of a
/// larger head are freed after its request. Ordinary heads need a few hundred.
const MAX_KEPT_PARTS_BYTES: usize = INITIAL_READ_BUFFER_BYTES;
/// Room reserved for a response head.
const HEAD_CAPACITY: usize = 256;
/// Most bytes discarded while lingering after a closing response.
pub const MAX_LINGER_BYTES: usize = 64 * 1024;
/// Sent when neither the handler's response nor its 500 can be encoded.
const INTERNAL_ERROR_RESPONSE: &[u8] =
    b"HTTP/1.1 500 Internal Server Error\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";

/// The socket and read buffer of one connection; [`Body`] borrows it while a handler runs.
pub(crate) struct ConnIo {
    stream: TcpStream,
    /// Bytes read and not yet handed out live in `buf[pos..]`.
    buf: Vec<u8>,
    pos: usize,
    pub(crate) cfg: Rc<ServerConfig>,
    /// Whether the socket was switched to non-blocking mode for `splice`.
    is_nonblocking: bool,
    /// A second descriptor of the socket, for a response sent while the next head is read
    /// (io_uring, decision 125): made on a busy period's second response, closed when the
    /// connection goes idle.
    writer: SecondWriter,
    /// The write timeout's timer, set by each write to the client (see [`Timer`]).
    write_timer: Timer,
}

/// A keep-alive response to send while the next request's head is read (decision 125): its
/// bytes (a buffer from an offset: a body written behind room for its head), and the second
/// descriptor they go out on.
struct Ahead {
    writer: Box<TcpStream>,
    data: Slice<Vec<u8>>,
}

impl ConnIo {
    /// The socket, switched to non-blocking mode for `splice` (kept for the connection's life:
    /// io_uring's receive and send operations wait through their own poll whatever the flag,
    /// and the epoll driver sets it anyway).
    fn nonblocking_stream(&mut self) -> io::Result<&TcpStream> {
        if !self.is_nonblocking {
            crate::fd::set_nonblocking(&self.stream)?;
            self.is_nonblocking = true;
        }
        Ok(&self.stream)
    }

    /// Bytes received and not yet consumed.
    pub(crate) fn buffered(&self) -> &[u8] {
        self.buf.get(self.pos..).unwrap_or_default()
    }

    /// Marks `n` buffered bytes as consumed.
    pub(crate) fn consume(&mut self, n: usize) {
        self.pos = self.pos.saturating_add(n).min(self.buf.len());
    }

    /// Moves the unconsumed bytes to the front of the buffer.
    fn compact(&mut self) {
        if self.pos >= self.buf.len() {
            self.buf.clear();
        } else if self.pos > 0 {
            self.buf.drain(..self.pos);
        }
        self.pos = 0;
    }

    /// Makes room for reading more of a head: doubling the buffer up to the head limit. At the
    /// limit the parser answers 431, so the buffer never needs to exceed it.
    fn prepare_head_read(&mut self) {
        self.compact();
        if self.buf.len() == self.buf.capacity() {
            let max = self.cfg.head_limits.max_head_bytes;
            let target = self
                .buf
                .capacity()
                .saturating_mul(2)
                .max(INITIAL_READ_BUFFER_BYTES)
                .min(max);
            self.buf
                .reserve_exact(target.saturating_sub(self.buf.len()).max(1));
        }
    }

    /// Makes room for reading body bytes.
    pub(crate) fn prepare_body_read(&mut self) {
        self.compact();
        if self.buf.capacity() < BODY_READ_BUFFER_BYTES {
            self.buf
                .reserve_exact(BODY_READ_BUFFER_BYTES.saturating_sub(self.buf.len()));
        }
        if self.buf.len() == self.buf.capacity() {
            self.buf.reserve(INITIAL_READ_BUFFER_BYTES);
        }
    }

    /// Returns a buffer grown by a large head or body to its initial size, so that an idle
    /// connection holds little memory.
    fn recycle(&mut self) {
        self.compact();
        if self.buf.capacity() > INITIAL_READ_BUFFER_BYTES
            && self.buf.len() <= INITIAL_READ_BUFFER_BYTES
        {
            let mut fresh = Vec::with_capacity(INITIAL_READ_BUFFER_BYTES);
            fresh.extend_from_slice(&self.buf);
            self.buf = fresh;
        }
    }

    /// Frees the read buffer of a connection that holds no unconsumed bytes: an idle
    /// connection keeps none ([`IDLE_RELEASE`]); the next head read allocates it again.
    fn release_buffer(&mut self) {
        self.writer.release();
        if self.pos >= self.buf.len() {
            self.buf = Vec::new();
            self.pos = 0;
        }
    }

    /// [`ConnIo::write_all_timed`] of a response's buffer, or, when `may_send_ahead` and the
    /// response is small enough, its bytes with the socket's second descriptor, to be sent while
    /// the next head is read ([`Ahead`]; `None` on the epoll driver and on a busy period's first
    /// response).
    async fn write_or_ahead(
        &mut self,
        buf: Vec<u8>,
        may_send_ahead: bool,
    ) -> io::Result<Option<Ahead>> {
        match self.try_ahead(buf, 0, may_send_ahead) {
            Ok(ahead) => Ok(Some(ahead)),
            Err(buf) => self.write_all_timed_from(buf, 0).await.map(|_| None),
        }
    }

    /// `buf[from..]` to be sent ahead ([`ConnIo::write_or_ahead`]), or, when it may not or
    /// cannot be, the buffer back for [`ConnIo::write_all_timed_from`]. Without a future of its
    /// own: on io_uring a small response goes ahead without any.
    fn try_ahead(
        &mut self,
        buf: Vec<u8>,
        from: usize,
        may_send_ahead: bool,
    ) -> Result<Ahead, Vec<u8>> {
        let from = from.min(buf.len());
        if may_send_ahead && buf.len() - from <= MAX_SENT_AHEAD_BYTES {
            if let Some(writer) = self.writer.take(&self.stream) {
                let data = buf.slice(from..);
                return Ok(Ahead { writer, data });
            }
        }
        Err(buf)
    }

    /// Collects a response sent ahead: writes what a short send left (the write timeout then
    /// applies as to any write), and fails when the send failed or made no progress within the
    /// write timeout.
    async fn finish_ahead(
        &mut self,
        writer: Box<TcpStream>,
        sent: Sent<Slice<Vec<u8>>>,
    ) -> io::Result<()> {
        self.writer.put(writer);
        match sent {
            Sent::Whole(_) => Ok(()),
            Sent::Short(n, data) => {
                let from = data.begin().saturating_add(n);
                self.write_all_timed_from(data.into_inner(), from)
                    .await
                    .map(drop)
            }
            Sent::Failed => Err(io::Error::from(io::ErrorKind::BrokenPipe)),
            Sent::NotDone => Err(io::Error::from(io::ErrorKind::TimedOut)),
        }
    }

    /// Takes what the socket holds now into the buffer's spare capacity, without waiting
    /// (`WouldBlock` when nothing is there); 0 means the peer closed its side.
    fn read_now(&mut self) -> io::Result<usize> {
        if self.buf.len() == self.buf.capacity() {
            return Err(io::Error::other("read buffer has no room"));
        }
        crate::fd::recv_now(&self.stream, &mut self.buf)
    }

    /// Reads into the spare capacity of the buffer; 0 means the peer closed its side.
    ///
    /// If the future is dropped before it completes (a timeout or shutdown won the race), the
    /// buffer goes with the cancelled operation and the connection is left with an empty one:
    /// every caller closes the connection in that case.
    pub(crate) async fn read_more(&mut self) -> io::Result<usize> {
        let pos = std::mem::take(&mut self.pos);
        let buf = std::mem::take(&mut self.buf);
        let (len, cap) = (buf.len(), buf.capacity());
        if len == cap {
            self.buf = buf;
            self.pos = pos;
            return Err(io::Error::other("read buffer has no room"));
        }
        let spare = buf.slice_mut(len..cap);
        let (res, slice) = self.stream.read(spare).await;
        self.buf = slice.into_inner();
        self.pos = pos;
        res
    }

    /// Writes all of `data`, failing when one write makes no progress within the write
    /// timeout: a slow but steady client gets a large response, a client that stopped reading
    /// is cut.
    pub(crate) async fn write_all_timed<T: IoBuf + 'static>(&mut self, data: T) -> io::Result<()> {
        self.write_all_timed_from(data, 0).await.map(drop)
    }

    /// [`ConnIo::write_all_timed`] of `data[start..]`, giving the buffer back for
    /// reuse (it is lost with a write that timed out).
    pub(crate) async fn write_all_timed_from<T: IoBuf + 'static>(
        &mut self,
        data: T,
        start: usize,
    ) -> io::Result<T> {
        let len = data.bytes_init();
        let mut buf = data;
        let mut written = start.min(len);
        let limit = self.cfg.write_timeout;
        while written < len {
            let write = self.stream.write(buf.slice(written..len));
            let (res, slice) = match self.write_timer.within_for(limit, write).await {
                Some(done) => done,
                None => return Err(io::Error::from(io::ErrorKind::TimedOut)),
            };
            buf = slice.into_inner();
            match res {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => written = written.saturating_add(n).min(len),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(buf)
    }

    /// Writes `head` then `body`, each as it is (no copy of `body` behind the head), with the
    /// timeout of [`ConnIo::write_all_timed`]; gives the head's buffer back for reuse. Both go
    /// in one vectored write: one operation, and one wake-up of the client, instead of two;
    /// what a short write leaves goes out piece by piece.
    pub(crate) async fn write_head_and_body_timed(
        &mut self,
        head: Vec<u8>,
        body: Bytes,
    ) -> io::Result<Vec<u8>> {
        let pair = crate::fd::HeadAndBody::new(head, body);
        let total = pair.len();
        let limit = self.cfg.write_timeout;
        let write = self.stream.writev(pair);
        let (res, pair) = match self.write_timer.within_for(limit, write).await {
            Some(done) => done,
            None => return Err(io::Error::from(io::ErrorKind::TimedOut)),
        };
        let written = match res {
            Ok(0) if total > 0 => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => n,
            // A vectored write is a file write to io_uring: on a socket switched to
            // non-blocking (one that spliced) it answers "would block" instead of waiting;
            // the sends below wait through their poll.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                ) =>
            {
                0
            }
            Err(e) => return Err(e),
        };
        let (head, body) = pair.into_parts();
        let head_len = head.len();
        let head = self.write_all_timed_from(head, written).await?;
        self.write_all_timed_from(body, written.saturating_sub(head_len))
            .await?;
        Ok(head)
    }
}

/// What reading the next head produced.
enum Next {
    /// A head was read into the busy period's parts.
    Request,
    /// Close silently: the client left, idled out, or shutdown caught the connection idle.
    Close,
    /// Answer this error and close.
    Reject(u16, &'static str),
    /// No byte of a next request came within [`IDLE_RELEASE`]: go idle, waiting for
    /// readability until the deadline given.
    Idle(Instant),
}

/// How a busy period of a connection ended.
enum Busy {
    /// Idle until the deadline given: park without a buffer.
    Idle(Instant),
    Close,
    Tunnel(Box<dyn Tunnel>),
}

/// How a connection's task ended.
enum End {
    Close,
    Tunnel(Box<dyn Tunnel>),
    /// Idle until the deadline given: parked (see `park.rs`), or closed if it cannot be.
    Idle(Instant),
}

/// Whether the connection goes on after an exchange.
enum Flow {
    /// With the response still to send when it is sent while the next head is read.
    KeepAlive(Option<Ahead>),
    Close,
    /// HTTP ends: the connection belongs to the tunnel from here.
    Tunnel(Box<dyn Tunnel>),
}

/// A connection between busy periods: what it keeps while it is parked without a task, and
/// what a task serving it starts from (see `park.rs`).
pub struct Parked {
    stream: TcpStream,
    cfg: Rc<ServerConfig>,
    peer: SocketAddr,
    accepted_at: Instant,
    requests: u64,
    is_nonblocking: bool,
}

impl Parked {
    /// A connection just accepted, to be served with the limits in `cfg`.
    pub fn accepted(stream: TcpStream, peer: SocketAddr, cfg: Rc<ServerConfig>) -> Parked {
        Parked {
            stream,
            cfg,
            peer,
            accepted_at: Instant::now(),
            requests: 0,
            is_nonblocking: monoio::utils::is_legacy(),
        }
    }
}

impl AsRawFd for Parked {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.stream.as_raw_fd()
    }
}

struct Connection<H> {
    io: ConnIo,
    peer: SocketAddr,
    handler: Rc<H>,
    shutdown: ShutdownSignal,
    /// The connection's place among the waiters for the idle close, taken by its first wait
    /// between requests and kept for the rest of the busy period.
    idle_close: LatchSlot,
    accepted_at: Instant,
    requests: u64,
    /// The timers of the waits every request makes: for its next request's first bytes (for
    /// [`IDLE_RELEASE`]) and its client's departure. Set again by each wait (see [`Timer`]).
    release_timer: Timer,
    departure_timer: Timer,
}

/// Serves one connection until it closes or goes idle: requests in order (pipelined ones from
/// the leftover bytes of the previous one), keep-alive as the client and handler allow. A
/// connection that goes idle is handed to `park` with its deadline, and the future ends; a
/// task started later from the [`Parked`] state goes on where it left off.
///
/// Not an `async fn`: the connection's state is built here and moved into the future whole,
/// which uses it in place. An `async fn` would keep its arguments and the state built from
/// them side by side.
pub fn serve_connection<H: Handler, P: FnOnce(Parked, Instant)>(
    from: Parked,
    handler: Rc<H>,
    shutdown: ShutdownSignal,
    park: P,
) -> impl std::future::Future<Output = ()> {
    let Parked {
        stream,
        cfg,
        peer,
        accepted_at,
        requests,
        is_nonblocking,
    } = from;
    let mut conn = Connection {
        io: ConnIo {
            stream,
            buf: Vec::new(),
            pos: 0,
            cfg,
            is_nonblocking,
            writer: SecondWriter::default(),
            write_timer: Timer::unset(),
        },
        peer,
        handler,
        idle_close: shutdown.idle_close_slot(),
        shutdown,
        accepted_at,
        requests,
        release_timer: Timer::unset(),
        departure_timer: Timer::unset(),
    };
    async move {
        let end = conn.run().await;
        // Their registrations go now, not with the parked connection or the tunnel.
        drop(std::mem::replace(&mut conn.release_timer, Timer::unset()));
        drop(std::mem::replace(&mut conn.departure_timer, Timer::unset()));
        drop(std::mem::replace(&mut conn.io.write_timer, Timer::unset()));
        match end {
            End::Close => {}
            End::Idle(deadline) => {
                let io = conn.io;
                let parked = Parked {
                    stream: io.stream,
                    cfg: io.cfg,
                    peer: conn.peer,
                    accepted_at: conn.accepted_at,
                    requests: conn.requests,
                    is_nonblocking: io.is_nonblocking,
                };
                park(parked, deadline);
            }
            End::Tunnel(tunnel) => {
                let ConnIo {
                    stream, buf, pos, ..
                } = conn.io;
                let early = buf.get(pos..).unwrap_or_default().to_vec();
                tunnel.run(stream, early).await;
            }
        }
    }
}

impl<H: Handler> Connection<H> {
    /// Serves requests until the connection closes, goes idle, or a request hands it to a
    /// tunnel: busy periods, each boxed.
    async fn run(&mut self) -> End {
        loop {
            // Boxed, once per busy period (for a connection under load, once), so that the
            // state of reading heads and of each request is held only while requests come.
            match crate::runtime::boxed_in_place(|| self.busy()).await {
                Busy::Idle(deadline) => {
                    self.io.release_buffer();
                    // Bytes left in the buffer (none, when the wait for a next request went
                    // quiet) are served at once.
                    if self.io.buffered().is_empty() {
                        return End::Idle(deadline);
                    }
                }
                Busy::Close => return End::Close,
                Busy::Tunnel(tunnel) => return End::Tunnel(tunnel),
            }
        }
    }

    /// Serves requests while they keep coming: until the connection closes, goes to a
    /// tunnel, or has been idle for [`IDLE_RELEASE`].
    async fn busy(&mut self) -> Busy {
        // One per busy period too: each request's head is copied into the same parts, so that
        // only the first allocates; they go with the busy period, not with an idle connection.
        let mut parts = RequestParts::empty(self.peer);
        let mut ahead: Option<Ahead> = None;
        loop {
            let next = match ahead.take() {
                None => self.read_head(&mut parts).await,
                Some(Ahead { mut writer, data }) => {
                    // The write timeout runs from the send, as for a response written before.
                    let until = checked_deadline(
                        Instant::from_std(crate::timer::now()),
                        self.io.cfg.write_timeout,
                    )
                    .into_std();
                    // Made (put on the ring) before the read, collected after it
                    // (`send_ahead::collect`).
                    let len = data.bytes_init();
                    let (next, sent) = {
                        let mut send = pin!(writer.write(data));
                        let next = self.read_head(&mut parts).await;
                        (
                            next,
                            collect(send.as_mut(), len, until, &mut self.io.write_timer).await,
                        )
                    };
                    if let Err(e) = self.io.finish_ahead(writer, sent).await {
                        tracing::debug!(peer = %self.peer, error = %e, "response send failed");
                        return Busy::Close;
                    }
                    next
                }
            };
            match next {
                Next::Request => {}
                Next::Close => return Busy::Close,
                Next::Idle(deadline) => return Busy::Idle(deadline),
                Next::Reject(status, reason) => {
                    tracing::debug!(peer = %self.peer, status, reason, "request head rejected");
                    self.reject(status, reason, false).await;
                    return Busy::Close;
                }
            };
            self.requests = self.requests.saturating_add(1);
            // Inline, in the busy period's box: a request's state (the handler's future, the
            // body, the response) is built where the previous request's was, with no
            // allocation of its own; the quiet time it is held through is at most
            // IDLE_RELEASE, after which the connection parks and the box goes.
            match self.exchange(&parts).await {
                Flow::KeepAlive(sending) => {
                    ahead = sending;
                    self.io.recycle();
                    // An unusually large head's buffers are not kept for the next request.
                    if parts.capacity_bytes() > MAX_KEPT_PARTS_BYTES {
                        parts = RequestParts::empty(self.peer);
                    }
                }
                Flow::Close => return Busy::Close,
                Flow::Tunnel(tunnel) => return Busy::Tunnel(tunnel),
            }
        }
    }

    /// Reads until a complete head is buffered, and copies it into `parts`.
    async fn read_head(&mut self, parts: &mut RequestParts) -> Next {
        let cfg = Rc::clone(&self.io.cfg);
        let limits = &cfg.head_limits;
        let mut head_deadline: Option<Instant> = None;
        // Offset into the buffered bytes up to which no LF was found: a head can only
        // complete with a new LF, so re-parsing before one arrives is wasted work.
        let mut scanned = 0usize;
        loop {
            let input = self.io.buffered();
            if !input.is_empty() {
                let fresh = input.get(scanned..).unwrap_or_default();
                if fresh.contains(&b'\n') || input.len() >= limits.max_head_bytes {
                    let peer = self.peer;
                    let parsed = parse_request_head_with(input, limits, |start, fields| {
                        parts.fill(start, fields.iter(), peer)
                    });
                    match parsed {
                        Ok(Parsed::Complete { consumed_len, .. }) => {
                            self.io.consume(consumed_len);
                            return Next::Request;
                        }
                        Ok(Parsed::Partial) => {}
                        Err(e) => return Next::Reject(e.status(), e.as_str()),
                    }
                }
                scanned = input.len();
                // The whole head must arrive within the timeout of its first byte.
                head_deadline.get_or_insert_with(|| deadline_after(cfg.header_read_timeout));
            }
            self.io.prepare_head_read();
            if let Some(deadline) = head_deadline {
                // Mid-head, shutdown does not interrupt: the request finishes, then closes.
                match crate::timer::within(deadline.into_std(), self.io.read_more()).await {
                    None => return Next::Reject(408, "request_timeout"),
                    Some(Ok(0)) | Some(Err(_)) => return Next::Close,
                    Some(Ok(_)) => {}
                }
                continue;
            }
            if self.shutdown.is_closing_idle() {
                return Next::Close;
            }
            // A new connection must start its first request within the header timeout; a
            // kept-alive one may idle for the idle timeout.
            // The coarse clock: these are deadlines, and this runs once per request.
            let now = Instant::from_std(crate::timer::now());
            let idle_deadline = if self.requests == 0 {
                checked_deadline(self.accepted_at, cfg.header_read_timeout)
            } else {
                checked_deadline(now, cfg.idle_timeout)
            };
            let release_at = checked_deadline(now, IDLE_RELEASE);
            if release_at >= idle_deadline {
                let read = pin!(crate::timer::within(
                    idle_deadline.into_std(),
                    self.io.read_more()
                ));
                match race(self.idle_close.wait(), read).await {
                    Either::Left(()) => return Next::Close,
                    Either::Right(None) => return Next::Close,
                    Either::Right(Some(Ok(0) | Err(_))) => return Next::Close,
                    Either::Right(Some(Ok(_))) => {}
                }
                continue;
            }
            // Readiness first (a poll on the ring, which is safe to drop), then the bytes at
            // once with a read that does not wait: no operation holds the buffer while the
            // connection waits, so going quiet or shutting down has nothing to cancel.
            let woke = {
                let ready = pin!(self.io.stream.readable(false));
                let release = pin!(self.release_timer.sleep_until(release_at.into_std()));
                let stop = pin!(race(self.idle_close.wait(), release));
                race(ready, stop).await
            };
            match woke {
                Either::Left(Ok(())) => {}
                Either::Left(Err(_)) => return Next::Close,
                // Shutdown caught the connection idle.
                Either::Right(Either::Left(())) => return Next::Close,
                // Quiet for IDLE_RELEASE: the buffer goes back as the connection parks.
                Either::Right(Either::Right(())) => return Next::Idle(idle_deadline),
            }
            match self.io.read_now() {
                Ok(0) => return Next::Close,
                Ok(_) => {}
                // Readiness that found nothing to read: wait again.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                Err(_) => return Next::Close,
            }
        }
    }

    /// Runs one request through the handler and writes its response.
    async fn exchange(&mut self, parts: &RequestParts) -> Flow {
        let handler = Rc::clone(&self.handler);
        let handler = &*handler;
        let is_head = parts.is_head();
        let framing = parts.framing();
        let expects_continue = parts.expects_continue();
        let mut should_close = !parts.is_keep_alive();
        let version = parts.version();
        let is_http10_keep_alive = version == Version::Http10 && parts.is_keep_alive();
        let max_drain = self.io.cfg.max_drain_bytes;

        let (mut response, settled) = match handler.admit(parts) {
            Ok(admitted) => {
                let limits = BodyLimits::with_max_body(admitted.body_limit);
                let decoder = match BodyDecoder::for_request(framing, limits) {
                    Ok(d) => d,
                    Err(e) => {
                        // RFC 9110 §15.5.14: 413 when the content is larger than the server
                        // is willing to process; the declared length already says so.
                        self.reject(e.status(), e.as_str(), is_head).await;
                        return Flow::Close;
                    }
                };
                let fd = self.io.stream.as_raw_fd();
                let watch_after = self.io.cfg.departure_watch_after;
                let mut body = Body::new(&mut self.io, decoder, framing, expects_continue);
                let outcome = {
                    let handling = pin!(handler.handle(parts, admitted.admission, &mut body));
                    // The connection outlives the watch, which keeps `fd` open for it.
                    let departure =
                        pin!(client_departure(fd, watch_after, &mut self.departure_timer));
                    race(handling, departure).await
                };
                let response = match outcome {
                    Either::Left(response) => response,
                    Either::Right(()) => {
                        // Dropping the handler's future releases what it holds (an upstream
                        // exchange, worker capacity); nobody is left to answer.
                        tracing::debug!(peer = %self.peer, "client left; request dropped");
                        return Flow::Close;
                    }
                };
                let is_closing =
                    should_close || response.is_closing() || self.shutdown.is_shutdown();
                let settled = match body.settled_now(max_drain, is_closing) {
                    Some(settled) => settled,
                    None => body.settle(max_drain, is_closing).await,
                };
                (response, settled)
            }
            Err(response) => {
                // The handler refused from the head alone. The body is unread: discard it
                // within the drain bound, as after any handler that does not read it.
                let decoder =
                    match BodyDecoder::for_request(framing, BodyLimits::with_max_body(u64::MAX)) {
                        Ok(d) => d,
                        Err(_) => return Flow::Close,
                    };
                let mut body = Body::new(&mut self.io, decoder, framing, expects_continue);
                let is_closing =
                    should_close || response.is_closing() || self.shutdown.is_shutdown();
                let settled = match body.settled_now(max_drain, is_closing) {
                    Some(settled) => settled,
                    None => body.settle(max_drain, is_closing).await,
                };
                (response, settled)
            }
        };

        match settled {
            Settled::Complete => {}
            Settled::MustClose => should_close = true,
            Settled::Failed(e) => match e.status() {
                Some(status) => {
                    tracing::debug!(peer = %self.peer, reason = e.reason(), "request body failed");
                    response = handler.error_response(status, e.reason());
                    should_close = true;
                }
                None => return Flow::Close,
            },
        }
        let is_tunnel = matches!(response.body, ResponseBody::Tunnel(_));
        if is_tunnel && matches!(settled, Settled::Complete) {
            // Persistence rules are about HTTP messages: a tunnel replaces them, whatever the
            // version (clients commonly send `CONNECT ... HTTP/1.0`).
            should_close = false;
        }
        should_close |= response.is_closing() || self.shutdown.is_shutdown();
        if is_tunnel && (should_close || !(200..300).contains(&response.status)) {
            // Only a 2xx answer to CONNECT starts a tunnel; anything else is a plain answer.
            response.body = ResponseBody::Empty;
            should_close = true;
        }
        let is_http10 = version == Version::Http10;
        if is_http10 && matches!(&response.body, ResponseBody::Stream(s) if s.length().is_none()) {
            // Close-delimited: HTTP/1.0 has no chunked coding.
            should_close = true;
        }
        let connection = if is_tunnel && !should_close {
            ConnectionField::Omit
        } else if should_close {
            ConnectionField::Close
        } else if is_http10_keep_alive {
            ConnectionField::KeepAlive
        } else {
            ConnectionField::Omit
        };
        // A keep-alive response may go out while the next head is read; a closing one is
        // followed by lingering, and a tunnel's head by the tunnel, on the connection's own
        // descriptor.
        let may_send_ahead = !should_close && !is_tunnel;
        let ahead = match self
            .write_response(
                &mut response,
                is_head,
                connection,
                is_http10,
                may_send_ahead,
            )
            .await
        {
            Ok(ahead) => ahead,
            Err(_) => return Flow::Close,
        };
        if let ResponseBody::Tunnel(tunnel) = std::mem::take(&mut response.body) {
            return Flow::Tunnel(tunnel);
        }
        if should_close {
            self.linger().await;
            return Flow::Close;
        }
        Flow::KeepAlive(ahead)
    }

    /// Answers an error the server detected itself, then closes.
    async fn reject(&mut self, status: u16, reason: &'static str, is_head: bool) {
        let mut response = self.handler.error_response(status, reason);
        if self
            .write_response(&mut response, is_head, ConnectionField::Close, false, false)
            .await
            .is_ok()
        {
            self.linger().await;
        }
    }

    /// Encodes and writes a response; a response that cannot be encoded (a 1xx status, a
    /// header value with CR or LF) is replaced by the handler's 500. A streamed body is written
    /// as it is produced; the head of a tunnel is written alone. When `may_send_ahead`, a
    /// response in one small buffer may instead come back unsent, to go out while the next
    /// head is read ([`ConnIo::write_or_ahead`]).
    async fn write_response(
        &mut self,
        response: &mut Response,
        is_head: bool,
        connection: ConnectionField,
        is_http10: bool,
        may_send_ahead: bool,
    ) -> io::Result<Option<Ahead>> {
        // A new buffer for each response, not one kept by the connection: the connection's own
        // was last touched a whole round of the other connections ago, while the allocator
        // hands out the blocks of this size on this core in turn, touched fewer responses ago
        // (fewer first-level cache misses per request, measured in `perf/README.md`).
        let mut out = Vec::with_capacity(response_capacity(response, is_head));
        let mut fallback;
        let (response, has_body) =
            match encode_head_for(&mut out, response, is_head, connection, is_http10) {
                Ok(has_body) => (response, has_body),
                Err(e) => {
                    tracing::debug!(error = %e, "handler response cannot be encoded");
                    out.clear();
                    fallback = self.handler.error_response(500, "invalid_response");
                    match encode_head(&mut out, &fallback, is_head, ConnectionField::Close) {
                        Ok(has_body) => (&mut fallback, has_body),
                        Err(_) => {
                            return self
                                .io
                                .write_all_timed(INTERNAL_ERROR_RESPONSE)
                                .await
                                .map(|()| None)
                        }
                    }
                }
            };
        // The whole response in one buffer, from `from`: sent ahead or written below, by this
        // future itself (no future of a writer between it and the operation).
        let (buf, from) = match &mut response.body {
            _ if !has_body => (out, 0),
            ResponseBody::Full(b) if b.len() <= COALESCE_BODY_BYTES => {
                out.extend_from_slice(b);
                (out, 0)
            }
            ResponseBody::Full(b) => {
                self.io.write_head_and_body_timed(out, b.clone()).await?;
                return Ok(None);
            }
            ResponseBody::BehindRoom { buf, start } => {
                let (mut buf, start) = (std::mem::take(buf), *start);
                match start
                    .checked_sub(out.len())
                    .and_then(|at| Some((at, buf.get_mut(at..start)?)))
                {
                    // The head goes into the room before the body: one send, no copy of it.
                    Some((at, room)) => {
                        room.copy_from_slice(&out);
                        (buf, at)
                    }
                    None => {
                        out.extend_from_slice(buf.get(start..).unwrap_or_default());
                        (out, 0)
                    }
                }
            }
            ResponseBody::Stream(stream) => {
                let is_chunked = stream.length().is_none() && !is_http10;
                return write_stream(
                    &mut self.io,
                    stream.as_mut(),
                    is_chunked,
                    out,
                    may_send_ahead,
                )
                .await;
            }
            _ => (out, 0),
        };
        match self.io.try_ahead(buf, from, may_send_ahead) {
            Ok(ahead) => Ok(Some(ahead)),
            Err(buf) => self.io.write_all_timed_from(buf, from).await.map(|_| None),
        }
    }

    /// After a closing response: shut down the write side, so the client sees the end, then
    /// discard what it still sends for a short while. Closing with unread bytes would make the
    /// kernel send a reset, which can destroy the response before the client reads it (RFC
    /// 9112 §9.6).
    async fn linger(&mut self) {
        if self.io.stream.shutdown().await.is_err() {
            return;
        }
        let deadline = deadline_after(self.io.cfg.linger_timeout);
        let mut discarded = 0usize;
        loop {
            self.io.buf.clear();
            self.io.pos = 0;
            if self.io.buf.capacity() == 0 {
                self.io.buf.reserve(INITIAL_READ_BUFFER_BYTES);
            }
            match crate::timer::within(deadline.into_std(), self.io.read_more()).await {
                Some(Ok(n)) if n > 0 => {
                    discarded = discarded.saturating_add(n);
                    if discarded > MAX_LINGER_BYTES {
                        return;
                    }
                }
                _ => return,
            }
        }
    }
}

/// Room left before the data of a streamed piece for its chunk-size line (16 hex digits and
/// CRLF), so that chunk framing costs no copy of the data.
const CHUNK_PREFIX_BYTES: usize = 18;
/// The buffer a streamed body is read into and written from, reused for every piece.
const STREAM_BUFFER_BYTES: usize = 64 * 1024;

/// Writes the head `head` of a streamed response and its body: each piece as it comes,
/// chunk-framed when `is_chunked`. The head goes out with the first piece, one write instead of
/// two. An error of the stream or of the client fails the write; the caller then closes the
/// connection. When `may_send_ahead`, the last write may instead come back unsent
/// ([`ConnIo::write_or_ahead`]), as when the whole body came with the destination's head.
async fn write_stream(
    io: &mut ConnIo,
    stream: &mut dyn StreamBody,
    is_chunked: bool,
    head: Vec<u8>,
    may_send_ahead: bool,
) -> io::Result<Option<Ahead>> {
    let prefix = if is_chunked { CHUNK_PREFIX_BYTES } else { 0 };
    let mut head_len = head.len();
    let mut buf = head;
    // Room the caller did not leave already (`response_capacity`); none for a body that will
    // be spliced, whose reads (should the splice not happen) reserve their own.
    if is_chunked || !stream.expects_splice() {
        buf.reserve(stream_room(stream.length()) + prefix + CHUNK_DATA_END.len());
    }
    let mut declared_left = stream.length();
    if !is_chunked {
        // Body bytes the stream already holds (read with the destination's head): a large
        // piece is written after the head as it is instead of being copied behind it.
        if let Some(first) = stream.take_ready().filter(|b| !b.is_empty()) {
            if let Some(left) = &mut declared_left {
                *left = left
                    .checked_sub(first.len() as u64)
                    .ok_or_else(|| io::Error::other("stream body longer than its length"))?;
            }
            buf = if first.len() <= COALESCE_BODY_BYTES {
                // A small piece costs less to copy than a second write.
                buf.extend_from_slice(&first);
                if declared_left == Some(0) && stream.is_finished() {
                    // The whole body came with the head: the response is this one write.
                    return io.write_or_ahead(buf, may_send_ahead).await;
                }
                io.write_all_timed_from(buf, 0).await?
            } else {
                io.write_head_and_body_timed(buf, first).await?
            };
            head_len = 0;
        }
        if stream.can_splice() {
            // The rest goes socket to socket: the head (and what came with it) first.
            if head_len > 0 {
                buf = io.write_all_timed_from(buf, 0).await?;
                head_len = 0;
            }
            let write_timeout = io.cfg.write_timeout;
            // Should the switch fail, the rest is read and written below.
            let moved = match io.nonblocking_stream() {
                Ok(client) => stream.splice_into(client, write_timeout).await?,
                Err(e) => {
                    tracing::debug!(error = %e, "client connection cannot splice: copying");
                    0
                }
            };
            if let Some(left) = &mut declared_left {
                *left = left
                    .checked_sub(moved)
                    .ok_or_else(|| io::Error::other("stream body longer than its length"))?;
            }
        }
    }
    loop {
        buf.truncate(head_len);
        if stream.is_finished() {
            break;
        }
        buf.resize(head_len + prefix, 0);
        let more = match stream.read_into(&mut buf).await {
            Ok(more) => more,
            // The head is still unsent (it goes out with the first piece): nothing reached
            // the client yet.
            Err(e) if head_len > 0 => return write_failure(io, stream, e).await.map(|()| None),
            Err(e) => return Err(e),
        };
        if !more {
            break;
        }
        let data_len = buf.len() - head_len - prefix;
        if let Some(left) = &mut declared_left {
            // A stream must not send more than it declared: the client would read the excess
            // as the next response.
            *left = left
                .checked_sub(data_len as u64)
                .ok_or_else(|| io::Error::other("stream body longer than its length"))?;
        }
        let start = if is_chunked {
            let mut line = Vec::with_capacity(CHUNK_PREFIX_BYTES);
            write_chunk_header(&mut line, data_len as u64);
            let start = if head_len > 0 {
                // Behind the head the line must follow it directly: one move of the first
                // piece.
                buf.splice(head_len..head_len + prefix, line);
                0
            } else {
                // Right-aligned in the room left for it: no move at all.
                let start = prefix.saturating_sub(line.len());
                if let Some(slot) = buf.get_mut(start..prefix) {
                    slot.copy_from_slice(&line);
                }
                start
            };
            buf.extend_from_slice(CHUNK_DATA_END);
            start
        } else {
            0
        };
        buf = io.write_all_timed_from(buf, start).await?;
        head_len = 0;
    }
    if declared_left.is_some_and(|left| left > 0) {
        return Err(io::Error::other("stream body shorter than its length"));
    }
    buf.truncate(head_len);
    if is_chunked {
        buf.extend_from_slice(LAST_CHUNK);
    }
    if buf.is_empty() {
        return Ok(None);
    }
    io.write_or_ahead(buf, may_send_ahead).await
}

/// Room for a streamed body's pieces: a known small body gets a small buffer.
fn stream_room(length: Option<u64>) -> usize {
    length.map_or(STREAM_BUFFER_BYTES, |n| {
        usize::try_from(n)
            .unwrap_or(usize::MAX)
            .min(STREAM_BUFFER_BYTES)
    })
}

/// The capacity of a response's write buffer: its head (the fields it carries, and room for
/// the status line and the server's own fields), and the body where the body is written from
/// the same buffer. One allocation per response instead of a head buffer grown by its body.
/// The answer to HEAD has no body, whatever the response holds.
fn response_capacity(response: &Response, is_head: bool) -> usize {
    let fields: usize = response
        .headers
        .iter()
        .map(|(n, v)| n.as_bytes().len() + v.len() + 4)
        .sum::<usize>()
        + response
            .content_type
            .map_or(0, |v| CONTENT_TYPE_FIELD.len() + v.len() + 4)
        + response.relayed().map_or(0, |r| r.bytes() + 4 * r.len());
    let body = match &response.body {
        _ if is_head => 0,
        ResponseBody::Full(b) if b.len() <= COALESCE_BODY_BYTES => b.len(),
        // A body that will be spliced passes through no buffer but for the bytes that came
        // with its head, copied behind it (a 64 KiB body's room would be allocated and freed
        // with each response, never written).
        ResponseBody::Stream(s) if s.expects_splice() => 0,
        ResponseBody::Stream(s) => {
            stream_room(s.length()) + CHUNK_PREFIX_BYTES + CHUNK_DATA_END.len()
        }
        _ => 0,
    };
    HEAD_CAPACITY.saturating_add(fields).saturating_add(body)
}

/// A streamed body failed before any byte of its response was written: sends the stream's
/// failure response in place of the head when it has one (`Connection: close`), and returns
/// the error either way, so that the connection closes.
async fn write_failure(
    io: &mut ConnIo,
    stream: &mut dyn StreamBody,
    error: io::Error,
) -> io::Result<()> {
    if let Some(resp) = stream.failure_response(&error) {
        let mut out = Vec::with_capacity(256);
        if let Ok(has_body) = encode_head(&mut out, &resp, false, ConnectionField::Close) {
            if let (true, Some(b)) = (has_body, resp.body.whole()) {
                out.extend_from_slice(b);
            }
            io.write_all_timed(out).await?;
        }
    }
    Err(error)
}

/// `now + d`, or a far deadline when the sum does not fit (an absurdly long configured timeout).
fn deadline_after(d: std::time::Duration) -> Instant {
    checked_deadline(Instant::now(), d)
}

fn checked_deadline(from: Instant, d: std::time::Duration) -> Instant {
    Instant::from_std(crate::timer::deadline(from.into_std(), d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::handler::Minimal;

    /// Every connection between two requests of a busy period keeps its task's state: the
    /// request in progress and the rare error path are boxed so that this state stays small.
    #[test]
    fn connection_state_stays_small() {
        crate::runtime::run_on(crate::runtime::Driver::detect(), async {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let _client = std::net::TcpStream::connect(addr).unwrap();
            let (accepted, _) = listener.accept().unwrap();
            let stream = TcpStream::from_std(accepted).unwrap();
            let fut = serve_connection(
                Parked::accepted(stream, addr, Rc::new(ServerConfig::default())),
                Rc::new(Minimal),
                ShutdownSignal::new(),
                |_, _| {},
            );
            let size = std::mem::size_of_val(&fut);
            assert!(size <= 3 * 1024, "{size} bytes");
            // A cache-padded field (the runtime's own timers have them) would make every box
            // of a connection's or request's state an over-aligned allocation.
            let align = std::mem::align_of_val(&fut);
            assert!(align <= 16, "aligned to {align} bytes");
        });
    }

    #[test]
    fn deadlines_never_overflow() {
        let now = Instant::now();
        assert!(checked_deadline(now, std::time::Duration::MAX) > now);
        assert_eq!(
            checked_deadline(now, std::time::Duration::from_secs(1)),
            now + std::time::Duration::from_secs(1)
        );
    }
}
