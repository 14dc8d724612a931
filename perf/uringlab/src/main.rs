//! The io_uring lab relay of perf/proxy.sh: the least a forward-proxy hop on io_uring does per
//! request, to measure what ring features would save in kernel time before the gateway's runtime
//! (monoio, which does not expose them) takes them.
//!
//! `sortie-uringlab LISTEN UPSTREAM VARIANT` accepts clients on `LISTEN`, opens one connection to
//! `UPSTREAM` per client, and relays: a request head (no body) goes to the upstream as received,
//! the response (head and `Content-Length` body) comes back as received — in one send once
//! complete, or a read's worth at a time when larger — then the next request.
//! It parses nothing else and checks nothing: a measuring instrument for loopback load, never a
//! proxy to put in front of anything.
//!
//! Variants (what differs is only how bytes enter and which descriptors the ring names):
//! - `oneshot`: one receive per read into the connection's buffer, as the gateway's runtime
//!   does (the kernel arms a poll for a receive that finds no data, and disarms it after).
//! - `multishot`: one multishot receive per socket for its life, into buffers of a provided-
//!   buffer ring (copied out and handed back at once).
//! - `oneshot-fixed`, `multishot-fixed`: the same through a registered file table (no file
//!   reference taken and dropped per operation).
//! - `splice`: `oneshot`, except that the head is read 4 KiB at a time and the rest of a body of
//!   16 KiB or more goes socket → pipe → socket with non-waiting `splice(2)` calls after an
//!   io_uring poll says the socket is ready: the gateway's path for large plain bodies.
//! - `zc`: `oneshot`, except that sends to the client of 16 KiB or more are zero-copy
//!   (`IORING_OP_SEND_ZC`): the kernel sends from the relay's buffer instead of copying it, and
//!   posts a second completion once it no longer needs the buffer; the relay counts the send as
//!   done only then.
//! - `monoio-http`: the `http` variant's work on the gateway's runtime (`on_monoio.rs`): one
//!   monoio task per client connection awaiting owned-buffer reads and writes, the ring set up
//!   as the gateway's. Between this row and `http` is the runtime's cost; between this row and
//!   the gateway, the gateway's own.
//! - `monoio-decisions`: `monoio-http` with the gateway's per-request decisions made between
//!   the operations as plain calls into `sortie-core` (`decisions.rs`): what the gateway's
//!   request path could cost at least as one state machine per connection. Requests without
//!   the deployment's proxy credentials (`PROXY_TOKEN`) are refused.
//! - `monoio-api`: the request API's counterpart: it answers `POST /api/v1/requests` with the
//!   bearer token `PROXY_TOKEN`, the envelope decoded and validated by `sortie-core`, routed,
//!   the destination's answer returned as the result envelope (base64 body and header values),
//!   all as plain calls between the four operations. Only `perf/proxy.sh`'s `api` mode sends
//!   it requests.
//! - `http`: `oneshot`, plus the least HTTP a forward proxy does: the request head is parsed
//!   with httparse (the gateway's parser), its absolute-form target split into authority and
//!   path, and a new head written for the upstream (origin-form request line, `Host`, the other
//!   fields but the proxy's own); the response head is parsed with httparse too and its
//!   `Content-Length` read from the parsed fields. No routing, limits, timers or runtime: the
//!   floor of an HTTP-aware hop, beside the byte relay's.
//!
//! One thread, on CPU `PIN_CPU` (default 0, where the gateway's first core runs), with the ring
//! set up as the gateway sets its up (`COOP_TASKRUN`); each receive takes up to `READ_BYTES`
//! (default 64 KiB, the size of the gateway's upstream reads).

use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, IntoRawFd, RawFd};
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

/// The gateway's allocator (mimalloc): the decision relays allocate as it does, at its price.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod decisions;
mod on_monoio;

/// Bytes one receive may take by default: as many as the gateway's upstream reads take
/// (`READ_BYTES` in the environment sets another size).
const DEFAULT_READ_BYTES: usize = 64 * 1024;
/// Buffers in the provided-buffer ring (a power of two).
const PROVIDED: u16 = 512;
/// The provided-buffer ring's group id.
const GROUP: u16 = 7;
/// Connections the registered file table has room for (two slots each).
const MAX_CONNS: usize = 8192;
const RING_ENTRIES: u32 = 4096;
/// The `splice` variant: head reads, the least body worth splicing, and the pipe's size (the
/// gateway's figures).
const HEAD_READ_BYTES: usize = 4 * 1024;
const SPLICE_MIN_BYTES: usize = 16 * 1024;
const PIPE_BYTES: usize = 256 * 1024;
/// The `zc` variant: the least send to the client made zero-copy.
const ZC_MIN_BYTES: usize = 16 * 1024;
/// A zero-copy send's second completion: the kernel is done with the buffer (Linux's
/// `IORING_CQE_F_NOTIF`).
const CQE_F_NOTIF: u32 = 1 << 3;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Accept = 1,
    RecvClient,
    SendUpstream,
    RecvUpstream,
    SendClient,
    PollUpstream,
    PollClient,
}

impl Op {
    fn from_token(t: u64) -> Option<Op> {
        Some(match t & 0xff {
            1 => Op::Accept,
            2 => Op::RecvClient,
            3 => Op::SendUpstream,
            4 => Op::RecvUpstream,
            5 => Op::SendClient,
            6 => Op::PollUpstream,
            7 => Op::PollClient,
            _ => return None,
        })
    }
}

fn token(conn: usize, op: Op) -> u64 {
    ((conn as u64) << 8) | op as u64
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for a complete request head from the client.
    Idle,
    /// Sending the request head to the upstream.
    Forwarding,
    /// Relaying the response.
    Responding,
}

struct Conn {
    client: RawFd,
    upstream: RawFd,
    state: State,
    /// Oneshot receives land here (one per side: both can be in flight).
    rbuf_client: Box<[u8]>,
    rbuf_upstream: Box<[u8]>,
    recv_client_pending: bool,
    recv_upstream_pending: bool,
    /// Request bytes received and not yet forwarded.
    req: Vec<u8>,
    /// Response bytes received and not yet sent on.
    resp: Vec<u8>,
    /// Bytes being sent (kept until the send completes), and how many of them went already.
    out_client: Vec<u8>,
    out_client_at: usize,
    out_upstream: Vec<u8>,
    out_upstream_at: usize,
    send_client_pending: bool,
    /// The response's whole length once its head is read; its bytes received so far.
    resp_total: Option<usize>,
    resp_seen: usize,
    /// The `splice` variant: the connection's pipe (read end, write end), whether the body is
    /// being spliced, its bytes still in the upstream socket and those in the pipe.
    pipe: Option<(RawFd, RawFd)>,
    splicing: bool,
    splice_left: usize,
    pipe_held: usize,
    /// The `zc` variant: the client send in flight is zero-copy; its result, kept until the
    /// kernel says it is done with the buffer.
    zc_send: bool,
    zc_result: Option<i32>,
}

/// The provided-buffer ring: entries the kernel takes buffers from, and the buffers.
struct Provided {
    ring: *mut types::BufRingEntry,
    bufs: Vec<u8>,
    tail: u16,
    size: usize,
}

impl Provided {
    fn new(uring: &IoUring, size: usize) -> io::Result<Provided> {
        let bytes = usize::from(PROVIDED) * std::mem::size_of::<types::BufRingEntry>();
        // SAFETY: an anonymous private mapping; checked for failure below. The kernel wants the
        // ring page-aligned, which mmap gives.
        let ring = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ring == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mut p = Provided {
            ring: ring.cast(),
            bufs: vec![0u8; usize::from(PROVIDED) * size],
            tail: 0,
            size,
        };
        // SAFETY: the ring lives as long as the process (never unmapped), with `PROVIDED`
        // entries.
        unsafe {
            uring
                .submitter()
                .register_buf_ring(ring as u64, PROVIDED, GROUP)?
        };
        for bid in 0..PROVIDED {
            p.give_back(bid);
        }
        Ok(p)
    }

    /// Puts buffer `bid` back in the ring for the kernel to fill.
    fn give_back(&mut self, bid: u16) {
        let index = usize::from(self.tail & (PROVIDED - 1));
        let addr = self.bufs.as_ptr() as u64 + u64::from(bid) * self.size as u64;
        // SAFETY: `index` is within the ring's `PROVIDED` entries; the kernel reads an entry only
        // once the tail published below covers it.
        unsafe {
            let entry = &mut *self.ring.add(index);
            entry.set_addr(addr);
            entry.set_len(self.size as u32);
            entry.set_bid(bid);
        }
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: the tail field of the ring's first entry, written with release ordering so the
        // entry above is visible to the kernel before it.
        unsafe {
            let tail = types::BufRingEntry::tail(self.ring) as *const AtomicU16;
            (*tail).store(self.tail, Ordering::Release);
        }
    }

    fn bytes(&self, bid: u16, len: usize) -> &[u8] {
        let start = usize::from(bid) * self.size;
        &self.bufs[start..start + len.min(self.size)]
    }
}

struct Relay {
    read_bytes: usize,
    multishot: bool,
    splice: bool,
    fixed: bool,
    http: bool,
    zc: bool,
    upstream: String,
    listener: RawFd,
    conns: Vec<Option<Conn>>,
    provided: Option<Provided>,
    pending: Vec<squeue::Entry>,
    /// Where a provided buffer's bytes are copied to.
    scratch: Vec<u8>,
}

/// An operation on a socket, by descriptor or by registered slot.
macro_rules! on_fd {
    ($relay:expr, $fd:expr, $slot:expr, |$f:ident| $build:expr) => {
        if $relay.fixed {
            let $f = types::Fixed($slot);
            $build
        } else {
            let $f = types::Fd($fd);
            $build
        }
    };
}

impl Relay {
    fn arm_accept(&mut self) {
        let e = opcode::Accept::new(
            types::Fd(self.listener),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
        .build()
        .user_data(token(0, Op::Accept));
        self.pending.push(e);
    }

    fn accept(&mut self, uring: &IoUring, fd: RawFd) -> io::Result<()> {
        set_nodelay(fd);
        let up = TcpStream::connect(&self.upstream)?;
        up.set_nodelay(true)?;
        let upstream = up.into_raw_fd();
        let id = self.conns.len();
        if id >= MAX_CONNS {
            return Err(io::Error::other("too many connections"));
        }
        if self.fixed {
            uring
                .submitter()
                .register_files_update(2 * id as u32, &[fd, upstream])?;
        }
        let pipe = if self.splice {
            set_nonblocking(fd)?;
            set_nonblocking(upstream)?;
            Some(new_pipe()?)
        } else {
            None
        };
        self.conns.push(Some(Conn {
            client: fd,
            upstream,
            state: State::Idle,
            rbuf_client: vec![0u8; self.read_bytes].into_boxed_slice(),
            rbuf_upstream: vec![0u8; self.read_bytes].into_boxed_slice(),
            recv_client_pending: false,
            recv_upstream_pending: false,
            req: Vec::with_capacity(self.read_bytes),
            resp: Vec::with_capacity(self.read_bytes),
            out_client: Vec::new(),
            out_client_at: 0,
            out_upstream: Vec::new(),
            out_upstream_at: 0,
            send_client_pending: false,
            resp_total: None,
            resp_seen: 0,
            pipe,
            splicing: false,
            splice_left: 0,
            pipe_held: 0,
            zc_send: false,
            zc_result: None,
        }));
        if self.multishot {
            self.arm_multishot(id, Op::RecvClient);
            self.arm_multishot(id, Op::RecvUpstream);
        }
        self.try_start(id);
        Ok(())
    }

    fn arm_multishot(&mut self, id: usize, op: Op) {
        let Some(c) = self.conns[id].as_ref() else {
            return;
        };
        let (fd, slot) = match op {
            Op::RecvClient => (c.client, 2 * id as u32),
            _ => (c.upstream, 2 * id as u32 + 1),
        };
        let e = on_fd!(self, fd, slot, |f| opcode::RecvMulti::new(f, GROUP).build());
        self.pending.push(e.user_data(token(id, op)));
    }

    /// A oneshot receive into the connection's buffer for that side.
    fn recv(&mut self, id: usize, op: Op) {
        let Some(c) = self.conns[id].as_mut() else {
            return;
        };
        let (fd, slot, buf) = match op {
            Op::RecvClient => {
                c.recv_client_pending = true;
                (c.client, 2 * id as u32, c.rbuf_client.as_mut_ptr())
            }
            _ => {
                c.recv_upstream_pending = true;
                (c.upstream, 2 * id as u32 + 1, c.rbuf_upstream.as_mut_ptr())
            }
        };
        // The splice variant reads heads 4 KiB at a time, so most of a large body is still in the
        // socket to be spliced (as the gateway's forward proxy does).
        let len = match (self.splice, op) {
            (true, Op::RecvUpstream) => HEAD_READ_BYTES as u32,
            _ => self.read_bytes as u32,
        };
        let e = on_fd!(self, fd, slot, |f| opcode::Recv::new(f, buf, len).build());
        self.pending.push(e.user_data(token(id, op)));
    }

    fn send(&mut self, id: usize, op: Op) {
        let zc = self.zc;
        let Some(c) = self.conns[id].as_mut() else {
            return;
        };
        if op == Op::SendClient {
            c.zc_send = zc && c.out_client.len() - c.out_client_at >= ZC_MIN_BYTES;
            c.zc_result = None;
        }
        let c = &*c;
        let (fd, slot, data) = match op {
            Op::SendClient => (c.client, 2 * id as u32, &c.out_client[c.out_client_at..]),
            _ => (
                c.upstream,
                2 * id as u32 + 1,
                &c.out_upstream[c.out_upstream_at..],
            ),
        };
        let (ptr, len) = (data.as_ptr(), data.len() as u32);
        if op == Op::SendClient && c.zc_send {
            let e = on_fd!(self, fd, slot, |f| opcode::SendZc::new(f, ptr, len).build());
            self.pending.push(e.user_data(token(id, op)));
            return;
        }
        let e = on_fd!(self, fd, slot, |f| opcode::Send::new(f, ptr, len).build());
        self.pending.push(e.user_data(token(id, op)));
    }

    /// Forwards a complete request head if one is buffered; otherwise waits for more.
    fn try_start(&mut self, id: usize) {
        let multishot = self.multishot;
        let Some(c) = self.conns[id].as_mut() else {
            return;
        };
        if c.state != State::Idle {
            return;
        }
        // A complete head at the front of `req` becomes `out_upstream`: rewritten (http), or
        // as received.
        let ready = if self.http {
            c.out_upstream.clear();
            rewrite_request(&c.req, &mut c.out_upstream).map(|len| {
                c.req.drain(..len);
            })
        } else {
            find(&c.req, b"\r\n\r\n").map(|at| {
                let rest = c.req.split_off(at + 4);
                c.out_upstream = std::mem::replace(&mut c.req, rest);
            })
        };
        match ready {
            Some(()) => {
                c.out_upstream_at = 0;
                c.state = State::Forwarding;
                c.resp_total = None;
                c.resp_seen = 0;
                self.send(id, Op::SendUpstream);
            }
            None if !multishot && !c.recv_client_pending => self.recv(id, Op::RecvClient),
            None => {}
        }
    }

    /// Sends on what arrived of the response, and asks for more while it is not complete.
    fn pump(&mut self, id: usize) {
        let (multishot, read_bytes, splice) = (self.multishot, self.read_bytes, self.splice);
        let Some(c) = self.conns[id].as_mut() else {
            return;
        };
        if c.state != State::Responding {
            return;
        }
        if c.resp_total.is_none() {
            if self.http {
                c.resp_total = parsed_response_length(&c.resp);
            } else if let Some(at) = find(&c.resp, b"\r\n\r\n") {
                c.resp_total = Some(at + 4 + content_length(&c.resp[..at]));
            }
        }
        let Some(total) = c.resp_total else {
            if !multishot && !c.recv_upstream_pending {
                self.recv(id, Op::RecvUpstream);
            }
            return;
        };
        if splice && !c.splicing && total.saturating_sub(c.resp_seen) >= SPLICE_MIN_BYTES {
            // The head and what came with it go now; the rest is spliced once they went.
            c.splicing = true;
            c.splice_left = total - c.resp_seen;
        }
        // Bytes go on once the response is complete or a read's worth is in hand: a small
        // response leaves in one send (one segment), as the gateway sends head and body.
        let complete = c.resp_seen >= total || c.splicing;
        let mut send = false;
        if !c.send_client_pending && !c.resp.is_empty() && (complete || c.resp.len() >= read_bytes)
        {
            c.out_client.clear();
            std::mem::swap(&mut c.out_client, &mut c.resp);
            c.out_client_at = 0;
            c.send_client_pending = true;
            send = true;
        }
        let want_more = c.resp_seen < total && !c.recv_upstream_pending && !c.splicing;
        if send {
            self.send(id, Op::SendClient);
        }
        if want_more && !multishot {
            self.recv(id, Op::RecvUpstream);
        }
    }

    fn on_data(&mut self, id: usize, op: Op, data: Option<&[u8]>) {
        let Some(c) = self.conns[id].as_mut() else {
            return;
        };
        match (op, data) {
            (Op::RecvClient, Some(d)) => {
                c.req.extend_from_slice(d);
                self.try_start(id);
            }
            (Op::RecvUpstream, Some(d)) => {
                c.resp.extend_from_slice(d);
                c.resp_seen += d.len();
                self.pump(id);
            }
            _ => {}
        }
    }

    fn close(&mut self, id: usize) {
        if let Some(c) = self.conns[id].take() {
            // SAFETY: the descriptors are this connection's own, closed once.
            unsafe {
                libc::close(c.client);
                libc::close(c.upstream);
                if let Some((r, w)) = c.pipe {
                    libc::close(r);
                    libc::close(w);
                }
            }
        }
    }

    fn complete(&mut self, uring: &IoUring, user_data: u64, res: i32, flags: u32) {
        let Some(op) = Op::from_token(user_data) else {
            return;
        };
        let id = (user_data >> 8) as usize;
        if op == Op::Accept {
            if res >= 0 {
                if let Err(e) = self.accept(uring, res) {
                    eprintln!("uringlab: accept: {e}");
                    // SAFETY: the accepted descriptor, not handed to a connection.
                    unsafe { libc::close(res) };
                }
            }
            self.arm_accept();
            return;
        }
        if self.conns.get(id).is_none_or(Option::is_none) {
            if let Some(bid) = cqueue::buffer_select(flags) {
                if let Some(p) = self.provided.as_mut() {
                    p.give_back(bid);
                }
            }
            return;
        }
        match op {
            Op::RecvClient | Op::RecvUpstream if self.multishot => {
                if res > 0 {
                    let Some(bid) = cqueue::buffer_select(flags) else {
                        return self.close(id);
                    };
                    // Copied out so the buffer goes back at once (the relay's own buffers then
                    // hold it, as the gateway's would).
                    let mut data = std::mem::take(&mut self.scratch);
                    if let Some(p) = self.provided.as_mut() {
                        data.extend_from_slice(p.bytes(bid, res as usize));
                        p.give_back(bid);
                    }
                    self.on_data(id, op, Some(&data));
                    data.clear();
                    self.scratch = data;
                    if !cqueue::more(flags) {
                        self.arm_multishot(id, op);
                    }
                } else if res == -libc::ENOBUFS {
                    self.arm_multishot(id, op);
                } else {
                    self.close(id);
                }
            }
            Op::RecvClient | Op::RecvUpstream => {
                let Some(c) = self.conns[id].as_mut() else {
                    return;
                };
                if op == Op::RecvClient {
                    c.recv_client_pending = false;
                } else {
                    c.recv_upstream_pending = false;
                }
                if res <= 0 {
                    return self.close(id);
                }
                let n = res as usize;
                if op == Op::RecvClient {
                    c.req.extend_from_slice(&c.rbuf_client[..n]);
                    self.try_start(id);
                } else {
                    c.resp.extend_from_slice(&c.rbuf_upstream[..n]);
                    c.resp_seen += n;
                    self.pump(id);
                }
            }
            Op::SendClient if self.conns[id].as_ref().is_some_and(|c| c.zc_send) => {
                let Some(c) = self.conns[id].as_mut() else {
                    return;
                };
                // The send's own completion, with a notification to follow: wait for it,
                // since the buffer is the kernel's until then.
                if flags & CQE_F_NOTIF == 0 && cqueue::more(flags) {
                    c.zc_result = Some(res);
                    return;
                }
                let res = if flags & CQE_F_NOTIF != 0 {
                    c.zc_result.take().unwrap_or(-libc::EIO)
                } else {
                    res
                };
                c.zc_send = false;
                self.sent(id, op, res);
            }
            Op::SendUpstream | Op::SendClient => self.sent(id, op, res),
            Op::PollUpstream | Op::PollClient => {
                if res < 0 {
                    return self.close(id);
                }
                self.splice_step(id);
            }
            Op::Accept => {}
        }
    }

    /// A send's completion (a zero-copy one once its buffer is free): the rest of the data, or
    /// the next step of the exchange.
    fn sent(&mut self, id: usize, op: Op, res: i32) {
        if res < 0 {
            return self.close(id);
        }
        let Some(c) = self.conns[id].as_mut() else {
            return;
        };
        if op == Op::SendUpstream {
            c.out_upstream_at += res as usize;
            if c.out_upstream_at < c.out_upstream.len() {
                return self.send(id, op);
            }
            c.state = State::Responding;
            self.pump(id);
        } else {
            c.out_client_at += res as usize;
            if c.out_client_at < c.out_client.len() {
                return self.send(id, op);
            }
            c.send_client_pending = false;
            if c.splicing {
                return self.splice_step(id);
            }
            let done = c.resp_total.is_some_and(|t| c.resp_seen >= t) && c.resp.is_empty();
            if done {
                c.state = State::Idle;
                self.try_start(id);
            } else {
                self.pump(id);
            }
        }
    }

    /// Moves the rest of a body through the pipe until it is all out, or a socket is not ready
    /// (then a poll for it is posted and this runs again when it says ready).
    fn splice_step(&mut self, id: usize) {
        loop {
            let Some(c) = self.conns[id].as_mut() else {
                return;
            };
            let Some((pipe_r, pipe_w)) = c.pipe else {
                return self.close(id);
            };
            if c.pipe_held > 0 {
                match splice(pipe_r, c.client, c.pipe_held) {
                    Ok(n) => c.pipe_held -= n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        return self.poll(id, Op::PollClient);
                    }
                    Err(_) => return self.close(id),
                }
            } else if c.splice_left > 0 {
                match splice(c.upstream, pipe_w, c.splice_left.min(PIPE_BYTES)) {
                    Ok(0) => return self.close(id),
                    Ok(n) => {
                        c.pipe_held += n;
                        c.splice_left -= n;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        return self.poll(id, Op::PollUpstream);
                    }
                    Err(_) => return self.close(id),
                }
            } else {
                c.splicing = false;
                c.resp_seen = c.resp_total.unwrap_or(c.resp_seen);
                c.state = State::Idle;
                return self.try_start(id);
            }
        }
    }

    fn poll(&mut self, id: usize, op: Op) {
        let Some(c) = self.conns[id].as_ref() else {
            return;
        };
        let (fd, slot, events) = match op {
            Op::PollClient => (c.client, 2 * id as u32, libc::POLLOUT),
            _ => (c.upstream, 2 * id as u32 + 1, libc::POLLIN),
        };
        let e = on_fd!(self, fd, slot, |f| opcode::PollAdd::new(f, events as u32)
            .build());
        self.pending.push(e.user_data(token(id, op)));
    }
}

/// `splice(2)` of up to `len` bytes, never waiting (both ends are non-blocking).
fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: two open descriptors of this relay, one of them a pipe; no user memory involved.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on an open descriptor of this relay.
    let r = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK)
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A non-blocking pipe of `PIPE_BYTES`: (read end, write end).
fn new_pipe() -> io::Result<(RawFd, RawFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fcntl on the pipe just made; a refused size leaves the default.
    unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, PIPE_BYTES as libc::c_int) };
    Ok((fds[0], fds[1]))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Parses a complete request head at the start of `req` and writes the head to send upstream
/// into `out`: the origin-form request line, `Host` from the absolute-form target, the other
/// fields but `Host` and the proxy's own. Returns the received head's length; `None` while it is
/// incomplete or when it is not an absolute-form `http://` request (the lab does not answer it).
fn rewrite_request(req: &[u8], out: &mut Vec<u8>) -> Option<usize> {
    let mut fields = [httparse::EMPTY_HEADER; 32];
    let mut parsed = httparse::Request::new(&mut fields);
    let len = match parsed.parse(req) {
        Ok(httparse::Status::Complete(len)) => len,
        _ => return None,
    };
    let method = parsed.method?;
    let target = parsed.path?;
    let rest = target.strip_prefix("http://")?;
    let slash = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(slash);
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(if path.is_empty() {
        b"/"
    } else {
        path.as_bytes()
    });
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(authority.as_bytes());
    out.extend_from_slice(b"\r\n");
    for f in parsed.headers.iter() {
        let name = f.name.as_bytes();
        if name.eq_ignore_ascii_case(b"host")
            || name.eq_ignore_ascii_case(b"proxy-connection")
            || name.eq_ignore_ascii_case(b"proxy-authorization")
        {
            continue;
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(f.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Some(len)
}

/// A response's whole length (head and `Content-Length` body) once its head is complete, from
/// httparse's fields.
fn parsed_response_length(resp: &[u8]) -> Option<usize> {
    let mut fields = [httparse::EMPTY_HEADER; 32];
    let mut parsed = httparse::Response::new(&mut fields);
    let len = match parsed.parse(resp) {
        Ok(httparse::Status::Complete(len)) => len,
        _ => return None,
    };
    let body = parsed
        .headers
        .iter()
        .find(|f| f.name.eq_ignore_ascii_case("content-length"))
        .and_then(|f| std::str::from_utf8(f.value).ok()?.trim().parse().ok())
        .unwrap_or(0);
    Some(len + body)
}

/// The `Content-Length` of a response head (0 when absent or unreadable).
fn content_length(head: &[u8]) -> usize {
    head.split(|&b| b == b'\n')
        .filter_map(|line| {
            let colon = line.iter().position(|&b| b == b':')?;
            let (name, value) = line.split_at(colon);
            name.eq_ignore_ascii_case(b"content-length").then(|| {
                std::str::from_utf8(&value[1..])
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0)
            })
        })
        .next()
        .unwrap_or(0)
}

fn set_nodelay(fd: RawFd) {
    let one: libc::c_int = 1;
    // SAFETY: a valid socket descriptor and an option value of the size given.
    unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET stays within it for cpu < 1024.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn main() -> io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, listen, upstream, variant] = args.as_slice() else {
        eprintln!("usage: sortie-uringlab LISTEN UPSTREAM oneshot|multishot|oneshot-fixed|multishot-fixed|splice|http|zc|monoio-http|monoio-decisions|monoio-api");
        std::process::exit(2);
    };
    let read_bytes = std::env::var("READ_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| (1024..=1 << 20).contains(&n))
        .unwrap_or(DEFAULT_READ_BYTES);
    let cpu = std::env::var("PIN_CPU")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let work = match variant.as_str() {
        "monoio-http" => Some(on_monoio::Work::Relay),
        "monoio-decisions" => Some(on_monoio::Work::Decisions(decisions::Decisions::new())),
        "monoio-api" => Some(on_monoio::Work::Api(decisions::Decisions::new())),
        _ => None,
    };
    if let Some(work) = work {
        pin(cpu);
        return on_monoio::run(listen, upstream, read_bytes, work);
    }
    let http = variant == "http";
    let zc = variant == "zc";
    let (multishot, fixed, splice) = match variant.as_str() {
        "oneshot" | "http" | "zc" => (false, false, false),
        "multishot" => (true, false, false),
        "oneshot-fixed" => (false, true, false),
        "multishot-fixed" => (true, true, false),
        "splice" => (false, false, true),
        other => {
            eprintln!("sortie-uringlab: unknown variant {other}");
            std::process::exit(2);
        }
    };
    pin(cpu);
    let listener = TcpListener::bind(listen)?;
    let mut uring: IoUring = IoUring::builder()
        .setup_coop_taskrun()
        .build(RING_ENTRIES)?;
    if fixed {
        uring
            .submitter()
            .register_files_sparse(2 * MAX_CONNS as u32)?;
    }
    let provided = if multishot {
        Some(Provided::new(&uring, read_bytes)?)
    } else {
        None
    };
    let mut relay = Relay {
        read_bytes,
        multishot,
        splice,
        fixed,
        http,
        zc,
        upstream: upstream.clone(),
        listener: listener.as_raw_fd(),
        conns: Vec::new(),
        provided,
        pending: Vec::new(),
        scratch: Vec::with_capacity(read_bytes),
    };
    relay.arm_accept();
    let mut done: Vec<(u64, i32, u32)> = Vec::with_capacity(RING_ENTRIES as usize);
    loop {
        {
            let mut sq = uring.submission();
            for e in relay.pending.drain(..) {
                // SAFETY: every buffer an entry names lives in a connection (or the provided
                // ring) until its completion is taken below; the queue has room for a round.
                if unsafe { sq.push(&e) }.is_err() {
                    return Err(io::Error::other("submission queue full"));
                }
            }
        }
        uring.submit_and_wait(1)?;
        done.extend(
            uring
                .completion()
                .map(|c| (c.user_data(), c.result(), c.flags())),
        );
        for (user_data, res, flags) in done.drain(..) {
            relay.complete(&uring, user_data, res, flags);
        }
    }
}
