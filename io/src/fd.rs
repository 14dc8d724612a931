//! Socket operations the runtime does not offer on a connected stream: reading `SO_ERROR` after
//! a non-blocking connect, switching a socket back to blocking mode for the io_uring driver,
//! checking an idle pooled connection or a client's connection for a close or unread bytes
//! without consuming them or waiting, duplicating a client's descriptor to wait on it, and the
//! pipe and non-waiting `splice` a tunnel moves its bytes with (decision 022), the pair of
//! buffers a response head and body go out with in one vectored write, and the epoll set idle
//! keep-alive connections wait in.
//!
//! This is the only module of the io crate's network code with `unsafe` code: each operation
//! borrows the raw descriptor of a stream the caller keeps open, for the length of one system
//! call.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd as _, OwnedFd, RawFd};

use bytes::Bytes;
use monoio::buf::IoVecBuf;
use socket2::SockRef;

/// Runs `f` on a socket2 view of the descriptor behind `stream`.
fn with_socket<S: AsRawFd, R>(stream: &S, f: impl FnOnce(SockRef<'_>) -> R) -> R {
    // SAFETY: `stream` owns the descriptor and is borrowed for the whole call, so the descriptor
    // stays open while the `BorrowedFd` (which never closes it) exists; the borrow does not
    // escape `f`.
    let fd = unsafe { BorrowedFd::borrow_raw(stream.as_raw_fd()) };
    f(SockRef::from(&fd))
}

/// Keeps a bus lane's liveness in the kernel (decision 118): after `every` of silence the
/// kernel probes the peer every `every` and ends the connection after three unanswered probes,
/// and data left unacknowledged for ten times `every` ends it too. Neither side's process wakes
/// for any of it. The kernel counts in whole seconds: at least one.
pub(crate) fn set_lane_keepalive<S: AsRawFd>(
    stream: &S,
    every: std::time::Duration,
) -> io::Result<()> {
    let every = every.max(std::time::Duration::from_secs(1));
    with_socket(stream, |s| {
        s.set_tcp_keepalive(
            &socket2::TcpKeepalive::new()
                .with_time(every)
                .with_interval(every)
                .with_retries(3),
        )?;
        s.set_tcp_user_timeout(Some(every * 10))
    })
}

/// Takes the pending socket error (`SO_ERROR`): after a non-blocking connect reports writable,
/// this is the outcome of the connect.
pub(crate) fn take_error<S: AsRawFd>(stream: &S) -> io::Result<Option<io::Error>> {
    with_socket(stream, |s| s.take_error())
}

/// Shuts both directions of a socket down, so that the peer sees the connection end even if
/// another process holds a copy of the descriptor (one inherited across a fork), before the
/// descriptor is closed.
pub(crate) fn shutdown_both<S: AsRawFd>(stream: &S) -> io::Result<()> {
    with_socket(stream, |s| s.shutdown(std::net::Shutdown::Both))
}

/// Shuts the socket down for writing: the peer reads the end of the stream.
pub(crate) fn shutdown_write<S: AsRawFd>(socket: &S) -> io::Result<()> {
    with_socket(socket, |s| s.shutdown(std::net::Shutdown::Write))
}

/// Sets `TCP_NODELAY`. On a listening socket, every connection it accepts starts with it (Linux
/// copies the listener's options to each connection), which saves a system call per connection.
pub(crate) fn set_nodelay<S: AsRawFd>(socket: &S) -> io::Result<()> {
    with_socket(socket, |s| s.set_nodelay(true))
}

/// Whether `TCP_NODELAY` is set.
#[cfg(test)]
pub(crate) fn has_nodelay<S: AsRawFd>(socket: &S) -> io::Result<bool> {
    with_socket(socket, |s| s.nodelay())
}

/// Clears `O_NONBLOCK`. The io_uring driver expects blocking sockets (it creates its own that
/// way); the epoll driver needs non-blocking ones.
pub(crate) fn set_blocking<S: AsRawFd>(stream: &S) -> io::Result<()> {
    with_socket(stream, |s| s.set_nonblocking(false))
}

/// A second descriptor of `stream`'s socket, as a stream of its own: an upstream connection
/// sends a request head on it while its own stream waits for the answer (decision 124). The
/// socket closes when both are closed.
pub(crate) fn second_handle(stream: &monoio::net::TcpStream) -> io::Result<monoio::net::TcpStream> {
    // SAFETY: `stream` owns the descriptor and is borrowed for the whole call, so it stays open
    // while the `BorrowedFd` exists; the borrow ends with the duplicate, which owns its own
    // descriptor.
    let fd = unsafe { BorrowedFd::borrow_raw(stream.as_raw_fd()) };
    let owned: OwnedFd = fd.try_clone_to_owned()?;
    monoio::net::TcpStream::from_std(std::net::TcpStream::from(owned))
}

/// Sets `O_NONBLOCK` (the only file status flag a socket of ours carries), so that a `splice`
/// from or to it returns `WouldBlock` instead of blocking the core's thread.
pub(crate) fn set_nonblocking<S: AsRawFd>(stream: &S) -> io::Result<()> {
    // SAFETY: the caller keeps the descriptor open for the call (it is borrowed from `stream`);
    // F_SETFL takes an int argument.
    if unsafe { libc::fcntl(stream.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A pipe with both ends non-blocking, the kernel-side buffer of a spliced tunnel direction:
/// bytes go socket → pipe → socket as page references, never through user space.
#[derive(Debug)]
pub(crate) struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    /// A new pipe (`pipe2` with `O_NONBLOCK | O_CLOEXEC`), its capacity raised towards `bytes`
    /// when the kernel allows it (it keeps its default of 64 KiB otherwise).
    pub(crate) fn new(bytes: usize) -> io::Result<Pipe> {
        let mut fds: [libc::c_int; 2] = [-1, -1];
        // SAFETY: `fds` is a valid, writable array of two ints for the length of the call.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let [r, w] = fds;
        // SAFETY: `pipe2` succeeded: both descriptors are open and owned by nobody else; each is
        // wrapped exactly once, and the wrappers close them.
        let pipe = unsafe {
            Pipe {
                read: OwnedFd::from_raw_fd(r),
                write: OwnedFd::from_raw_fd(w),
            }
        };
        let size = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        // SAFETY: the descriptor is open (owned by `pipe`); F_SETPIPE_SZ takes an int. A refusal
        // (over the per-user pipe limit) leaves the default size, which works too.
        let _ = unsafe { libc::fcntl(pipe.write.as_raw_fd(), libc::F_SETPIPE_SZ, size) };
        Ok(pipe)
    }

    /// Moves up to `len` bytes from the socket `from` into the pipe without waiting: `Ok(0)` is
    /// the socket's end of stream, `WouldBlock` means no bytes (or no room in the pipe).
    pub(crate) fn fill_from<S: AsRawFd>(&self, from: &S, len: usize) -> io::Result<usize> {
        splice(from.as_raw_fd(), self.write.as_raw_fd(), len)
    }

    /// Moves up to `len` bytes from the pipe to the socket `to` without waiting; `WouldBlock`
    /// means the socket's send buffer is full.
    pub(crate) fn drain_to<S: AsRawFd>(&self, to: &S, len: usize) -> io::Result<usize> {
        splice(self.read.as_raw_fd(), to.as_raw_fd(), len)
    }
}

/// `splice(2)` between two open descriptors, one of them a pipe, without waiting.
fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: both descriptors are open for the length of the call (borrowed from owners the
    // callers hold); null offsets are what a pipe and a socket require.
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
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// One `recv(2)` that does not wait (`MSG_DONTWAIT`), into the spare capacity of `buf`, whose
/// length grows by the bytes received; 0 means the peer closed its side, `WouldBlock` that
/// nothing was there. For a socket that readiness said has bytes: they are taken at once,
/// without a second trip through the ring.
pub(crate) fn recv_now<S: AsRawFd>(socket: &S, buf: &mut Vec<u8>) -> io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    // SAFETY: the descriptor is open for the call (borrowed from `socket`), and the kernel
    // writes at most `spare.len()` bytes into the buffer's spare capacity, which `buf` owns.
    let n = unsafe {
        libc::recv(
            socket.as_raw_fd(),
            spare.as_mut_ptr().cast(),
            spare.len(),
            libc::MSG_DONTWAIT,
        )
    };
    let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    let len = buf.len().saturating_add(n).min(buf.capacity());
    // SAFETY: the kernel initialized the `n` bytes after the old length, within the capacity.
    unsafe { buf.set_len(len) };
    Ok(n)
}

/// What a non-waiting poll found on a connection: a client's while its request is served, or
/// an idle pooled upstream connection's before reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PeerState {
    /// Connected, nothing unread.
    Quiet,
    /// Connected, with bytes nobody has read yet: a pipelined request from a client, or bytes
    /// an idle upstream sent unasked (it is out of step). The socket stays readable until they
    /// are read, so readiness says nothing more.
    Unread,
    /// The peer shut down its sending side, closed, or reset the connection. Unread bytes do
    /// not hide this.
    Gone,
}

/// Polls the socket without waiting (`poll` with `POLLIN | POLLRDHUP` and a zero timeout),
/// leaving its receive queue as it was.
pub(crate) fn peer_state(fd: RawFd) -> PeerState {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: `p` is a valid pollfd for the length of the call, and the count is 1. A closed or
    // reused descriptor cannot make poll unsound; callers keep `fd` open anyway.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    if n <= 0 {
        // No event, or an error of poll itself (EINTR, ENOMEM): nothing learned.
        return PeerState::Quiet;
    }
    if p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        PeerState::Gone
    } else if p.revents & libc::POLLIN != 0 {
        PeerState::Unread
    } else {
        PeerState::Quiet
    }
}

/// A second stream on the descriptor `fd` (`F_DUPFD_CLOEXEC`), registered with the runtime so
/// that a task can wait for readiness on it while another part of the program owns the
/// original. Closing the copy leaves the original open.
///
/// The caller must keep `fd` open for the length of this call.
pub(crate) fn duplicate_stream(fd: RawFd) -> io::Result<monoio::net::TcpStream> {
    // SAFETY: the caller keeps `fd` open for the length of this call; the borrow ends before
    // the function returns, and the duplicate is a descriptor of its own.
    let owned = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()?;
    monoio::net::TcpStream::from_std(std::net::TcpStream::from(owned))
}

/// Most readiness events taken from an [`EpollSet`] per system call.
const EPOLL_BATCH: usize = 64;

/// An epoll set that sockets wait in for readability without a runtime operation each: the set
/// itself is the one thing the runtime waits on ([`EpollSet::waiter`]). Each socket is added
/// for one report (`EPOLLONESHOT`) under a token of the caller's choosing.
pub(crate) struct EpollSet {
    fd: OwnedFd,
}

impl EpollSet {
    pub(crate) fn new() -> io::Result<EpollSet> {
        let fd = rustix::event::epoll::create(rustix::event::epoll::CreateFlags::CLOEXEC)?;
        Ok(EpollSet { fd })
    }

    /// Adds `stream` until it is readable, half-closed, closed or in error, which is reported
    /// once with `token`.
    pub(crate) fn add_oneshot<S: AsRawFd>(&self, stream: &S, token: u64) -> io::Result<()> {
        use rustix::event::epoll::{EventData, EventFlags};
        // SAFETY: `stream` owns the descriptor and is borrowed for the whole call; the set keeps
        // no borrow (the kernel tracks the open file, and closing it removes it from the set).
        let fd = unsafe { BorrowedFd::borrow_raw(stream.as_raw_fd()) };
        rustix::event::epoll::add(
            &self.fd,
            fd,
            EventData::new_u64(token),
            EventFlags::IN | EventFlags::RDHUP | EventFlags::ONESHOT,
        )?;
        Ok(())
    }

    /// Removes `stream` from the set; a stream not in it is left alone.
    pub(crate) fn remove<S: AsRawFd>(&self, stream: &S) {
        // SAFETY: as in `add_oneshot`.
        let fd = unsafe { BorrowedFd::borrow_raw(stream.as_raw_fd()) };
        let _ = rustix::event::epoll::delete(&self.fd, fd);
    }

    /// Appends the tokens of the streams that became ready to `out`, without waiting.
    pub(crate) fn take_ready(&self, out: &mut Vec<u64>) -> io::Result<()> {
        let mut events = [std::mem::MaybeUninit::uninit(); EPOLL_BATCH];
        let now = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        loop {
            let (ready, _) = rustix::event::epoll::wait(&self.fd, &mut events, Some(&now))?;
            out.extend(ready.iter().map(|e| e.data.u64()));
            if ready.len() < EPOLL_BATCH {
                return Ok(());
            }
        }
    }

    /// A runtime stream on a duplicate of the set's descriptor, whose `readable` completes when
    /// a stream in the set is ready. (The runtime waits for readiness of streams only; it does
    /// nothing else with this one.)
    pub(crate) fn waiter(&self) -> io::Result<monoio::net::TcpStream> {
        duplicate_stream(self.fd.as_raw_fd())
    }
}

/// Makes `cmd`'s program start with no descriptor of this process from 3 up: in the child,
/// between fork and exec, every such descriptor is marked close-on-exec. The runtime accepts
/// connections without `SOCK_CLOEXEC` (io_uring's accept as monoio submits it), so without
/// this a child would inherit every client connection open when it was spawned and keep it
/// open after this process closed it. Descriptors the child needs must reach it otherwise
/// (the upgrade hands its listeners over a Unix socket). `open_max` bounds the fallback for
/// kernels without `close_range` (before 5.11): read it before spawning, as the child may
/// not allocate or ask.
pub(crate) fn inherit_only_stdio(cmd: &mut std::process::Command, open_max: u32) {
    use std::os::unix::process::CommandExt as _;
    let hook = move || {
        // SAFETY: a raw system call with integer arguments; it marks descriptors, nothing
        // else, and allocates nothing (this runs in the forked child).
        let r = unsafe {
            libc::syscall(
                libc::SYS_close_range,
                libc::c_uint::from(3u8),
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            )
        };
        if r != 0 {
            // At most a million: an unlimited limit must not make this loop for ever.
            let end = RawFd::try_from(open_max.min(1 << 20)).unwrap_or(RawFd::MAX);
            for fd in 3..end {
                // SAFETY: fcntl on any integer is sound; a closed descriptor fails with EBADF.
                unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
            }
        }
        Ok(())
    };
    // SAFETY: the hook runs in the child after fork and before exec, and makes only
    // async-signal-safe system calls (close_range, fcntl) without allocating or locking.
    unsafe { cmd.pre_exec(hook) };
}

/// Whether `fd` is a stream socket of an internet family that listens.
fn is_listening_tcp(fd: BorrowedFd<'_>) -> bool {
    let s = SockRef::from(&fd);
    let is_inet = s.local_addr().is_ok_and(|a| a.as_socket().is_some());
    is_inet
        && s.r#type().is_ok_and(|t| t == socket2::Type::STREAM)
        && rustix::net::sockopt::socket_acceptconn(fd).unwrap_or(false)
}

/// A listening TCP socket received from another process (a binary upgrade's predecessor),
/// after checking that it is one; anything else is refused (and closed).
pub(crate) fn listener_from_owned(fd: OwnedFd) -> io::Result<std::net::TcpListener> {
    use std::os::fd::AsFd as _;
    if !is_listening_tcp(fd.as_fd()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a received descriptor is not a listening TCP socket",
        ));
    }
    Ok(std::net::TcpListener::from(fd))
}

/// A standard stream on a duplicate of the descriptor `fd` (`F_DUPFD_CLOEXEC`), to hand a
/// connection to another thread's runtime: the caller then drops its own stream, and the copy
/// keeps the socket open.
///
/// The caller must keep `fd` open for the length of this call.
pub(crate) fn duplicate_std(fd: RawFd) -> io::Result<std::net::TcpStream> {
    // SAFETY: as in `duplicate_stream`: the borrow ends before the function returns, and the
    // duplicate is a descriptor of its own.
    let owned = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()?;
    Ok(std::net::TcpStream::from(owned))
}

/// Takes ownership of a listening TCP socket the service manager passed to this process
/// (socket activation), after checking that `fd` is one: a stream socket of an internet family
/// that listens. Anything else is refused and left alone.
///
/// The caller must pass each descriptor once, and only one that `sd_notify::listen_fds` named
/// for this process (its `LISTEN_PID` is ours): nothing else in the process owns it.
pub(crate) fn adopt_listener(fd: RawFd) -> io::Result<std::net::TcpListener> {
    // SAFETY: the descriptor was passed to this process and is open (see above); the borrow
    // ends within this statement.
    let is_listening = is_listening_tcp(unsafe { BorrowedFd::borrow_raw(fd) });
    if !is_listening {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("descriptor {fd} is not a listening TCP socket"),
        ));
    }
    // SAFETY: the caller passes a descriptor that nothing else in the process owns (see
    // above), and it was just checked to be a listening TCP socket.
    Ok(unsafe { std::net::TcpListener::from_raw_fd(fd) })
}

/// The highest soft open-file limit asked for: the kernel's default `fs.nr_open`.
const MAX_OPEN_FILES: libc::rlim_t = 1 << 20;

/// The open-file limit after [`raise_open_file_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpenFileLimit {
    /// The soft limit now in force.
    pub(crate) soft: u64,
    /// The hard limit, which only a privileged process may raise.
    pub(crate) hard: u64,
}

/// Raises the soft open-file limit (`RLIMIT_NOFILE`) to the hard limit. Every client
/// connection, pooled upstream connection and watched request holds a descriptor, and the
/// usual soft default of 1024 (the default for shells and systemd services alike) would cap the
/// gateway at a few hundred requests in flight, far below its connection limits.
pub(crate) fn raise_open_file_limit() -> io::Result<OpenFileLimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the length of the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // An unlimited hard limit cannot be the soft one: the kernel caps descriptors at
    // `fs.nr_open`, 1,048,576 by default.
    let target = lim.rlim_max.min(MAX_OPEN_FILES);
    if lim.rlim_cur < target {
        let raised = libc::rlimit {
            rlim_cur: target,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit for the length of the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
        lim = raised;
    }
    Ok(OpenFileLimit {
        soft: lim.rlim_cur,
        hard: lim.rlim_max,
    })
}

/// A response head and a body to send in one vectored write. The two `iovec`s live on the heap,
/// so their address stays put while the runtime owns the value (the contract of
/// [`IoVecBuf`]).
pub(crate) struct HeadAndBody {
    head: Vec<u8>,
    body: Bytes,
    iov: Box<[libc::iovec; 2]>,
}

impl HeadAndBody {
    pub(crate) fn new(head: Vec<u8>, body: Bytes) -> HeadAndBody {
        let iov = Box::new([
            libc::iovec {
                iov_base: head.as_ptr() as *mut libc::c_void,
                iov_len: head.len(),
            },
            libc::iovec {
                iov_base: body.as_ptr() as *mut libc::c_void,
                iov_len: body.len(),
            },
        ]);
        HeadAndBody { head, body, iov }
    }

    pub(crate) fn len(&self) -> usize {
        self.head.len().saturating_add(self.body.len())
    }

    pub(crate) fn into_parts(self) -> (Vec<u8>, Bytes) {
        (self.head, self.body)
    }
}

// SAFETY: the iovecs point into `head`'s and `body`'s heap storage, which neither moves nor
// changes while the value exists (both are only read, and only given back by `into_parts`,
// which consumes the value); the array itself is boxed, so `read_iovec_ptr` is stable across
// moves of the value, and it holds exactly two valid entries.
unsafe impl IoVecBuf for HeadAndBody {
    fn read_iovec_ptr(&self) -> *const libc::iovec {
        self.iov.as_ptr()
    }

    fn read_iovec_len(&self) -> usize {
        self.iov.len()
    }
}

/// The local address of the socket (tests identify pooled connections by it).
#[cfg(test)]
pub(crate) fn local_addr<S: AsRawFd>(stream: &S) -> io::Result<std::net::SocketAddr> {
    with_socket(stream, |s| s.local_addr())?
        .as_socket()
        .ok_or_else(|| io::Error::other("not an inet socket"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::net::{Shutdown, TcpListener, TcpStream};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    /// Waits (bounded) until `peer_state` reports something other than `Quiet`: the kernel
    /// delivers loopback segments asynchronously.
    fn settle_peer(c: &TcpStream) -> PeerState {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let s = peer_state(c.as_raw_fd());
            if s != PeerState::Quiet || std::time::Instant::now() > until {
                return s;
            }
            std::thread::yield_now();
        }
    }

    #[test]
    fn peer_state_sees_quiet_bytes_and_eof_without_consuming() {
        let (c, mut s) = pair();
        assert_eq!(peer_state(c.as_raw_fd()), PeerState::Quiet);
        s.write_all(b"x").unwrap();
        assert_eq!(settle_peer(&c), PeerState::Unread);
        // Polling did not consume: the byte is still there.
        assert_eq!(peer_state(c.as_raw_fd()), PeerState::Unread);

        let (c, s) = pair();
        s.shutdown(Shutdown::Write).unwrap();
        assert_eq!(settle_peer(&c), PeerState::Gone);
        assert!(take_error(&c).unwrap().is_none());
    }

    #[test]
    fn peer_state_sees_a_close_behind_unread_bytes() {
        let (c, mut s) = pair();
        assert_eq!(peer_state(c.as_raw_fd()), PeerState::Quiet);
        s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!(settle_peer(&c), PeerState::Unread);
        s.shutdown(Shutdown::Write).unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while peer_state(c.as_raw_fd()) != PeerState::Gone {
            assert!(std::time::Instant::now() < until, "close not seen");
            std::thread::yield_now();
        }
        let (c, s) = pair();
        drop(s);
        assert_eq!(settle_peer(&c), PeerState::Gone);
    }

    #[test]
    fn a_pipe_splices_socket_to_socket_without_waiting() {
        use std::io::Read as _;
        let (mut src_peer, src) = pair();
        let (dst, mut dst_peer) = pair();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            dst_peer.read_to_end(&mut got).map(|_| got)
        });
        set_nonblocking(&src).unwrap();
        set_nonblocking(&dst).unwrap();
        let pipe = Pipe::new(256 * 1024).unwrap();
        // Nothing sent yet: no bytes, and no wait.
        let e = pipe.fill_from(&src, 4096).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        let payload: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        src_peer.write_all(&payload).unwrap();
        src_peer.shutdown(Shutdown::Write).unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut moved = 0usize;
        loop {
            assert!(
                std::time::Instant::now() < until,
                "only {moved} bytes moved"
            );
            match pipe.fill_from(&src, 1 << 20) {
                Ok(0) => break,
                Ok(n) => {
                    let mut left = n;
                    while left > 0 {
                        match pipe.drain_to(&dst, left) {
                            Ok(m) => left -= m,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                std::thread::yield_now()
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                    moved += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(moved, payload.len());
        dst.shutdown(Shutdown::Write).unwrap();
        assert_eq!(reader.join().unwrap().unwrap(), payload);
    }

    #[test]
    fn set_blocking_clears_nonblocking_mode() {
        let (c, _s) = pair();
        c.set_nonblocking(true).unwrap();
        set_blocking(&c).unwrap();
        // A blocking socket is still polled without waiting (a zero timeout).
        assert_eq!(peer_state(c.as_raw_fd()), PeerState::Quiet);
    }
}
