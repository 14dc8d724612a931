//! Moving bulk bytes socket → pipe → socket with `splice(2)`: the kernel hands page references
//! along and the core never touches the bytes. Used by CONNECT tunnel directions that carry
//! bulk data (decision 024) and by the rest of a large `Content-Length` response body on the
//! forward proxy (decision 025).
//!
//! Splices never wait: both sockets are non-blocking while they splice, and readiness comes from
//! the runtime (an io_uring poll, or epoll). Pipes come from a small free list per core.
//!
//! On the per-request path: no locks, no allocation once a core has its pipes, no logging.

use std::cell::{Cell, RefCell};
use std::io;
use std::time::{Duration, Instant};

use monoio::net::TcpStream;

use crate::fd::Pipe;

/// Capacity asked for each pipe, and the most one splice moves: a 64 KiB body arriving as many
/// small segments still fits in one round (each segment takes a slot of the pipe, and the
/// default pipe has 16).
pub(crate) const PIPE_BYTES: usize = 256 * 1024;
/// Empty pipes a core keeps for its next splices.
const FREE_PIPES_PER_CORE: usize = 64;

thread_local! {
    /// This core's empty pipes.
    static FREE_PIPES: RefCell<Vec<Pipe>> = const { RefCell::new(Vec::new()) };
}

/// A pipe of this core's free list (or a new one), and how many bytes it holds now. Given
/// back to the list on drop when empty; a pipe still holding bytes (a move cut mid-piece) is
/// closed instead: its bytes belong to a dead exchange.
pub(crate) struct PooledPipe {
    pub(crate) pipe: Option<Pipe>,
    /// Bytes spliced into the pipe and not yet out of it.
    pub(crate) held: usize,
}

impl PooledPipe {
    /// A pipe from this core's free list, or a new one.
    pub(crate) fn take() -> io::Result<PooledPipe> {
        let free = FREE_PIPES.try_with(|f| f.borrow_mut().pop()).ok().flatten();
        let pipe = match free {
            Some(p) => p,
            None => Pipe::new(PIPE_BYTES)?,
        };
        Ok(PooledPipe {
            pipe: Some(pipe),
            held: 0,
        })
    }
}

impl Drop for PooledPipe {
    fn drop(&mut self) {
        if self.held != 0 {
            return;
        }
        if let Some(p) = self.pipe.take() {
            // During thread exit the list may be gone: the pipe just closes.
            let _ = FREE_PIPES.try_with(|f| {
                let mut f = f.borrow_mut();
                if f.len() < FREE_PIPES_PER_CORE {
                    f.push(p);
                }
            });
        }
    }
}

/// Bytes a [`pump`] moves before it lets the core's other tasks run: with a fast source and a
/// fast destination every splice succeeds at once, and a large body would otherwise hold the
/// core (its timers, its other connections) until its end.
const BYTES_BETWEEN_YIELDS: u64 = 2 * 1024 * 1024;

/// Completes on its second poll, after waking itself: the rest of the core's ready tasks run
/// in between.
struct YieldNow(bool);

impl std::future::Future for YieldNow {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

/// How [`pump`] stopped short.
#[derive(Debug)]
pub(crate) enum MoveError {
    /// Reading the source failed, or it ended before the last byte it owed.
    Source(io::Error),
    /// The source sent nothing before its read limit.
    SourceTimeout,
    /// Writing to the destination failed, or it accepted nothing for the write timeout.
    Sink(io::Error),
}

impl From<MoveError> for io::Error {
    fn from(e: MoveError) -> io::Error {
        match e {
            MoveError::Source(e) | MoveError::Sink(e) => e,
            MoveError::SourceTimeout => io::ErrorKind::TimedOut.into(),
        }
    }
}

/// Splices `from` → `pipe` → `to`: exactly `len` bytes when given (never a byte past them:
/// what follows on `from` is the next message; an end of `from` before them is an error),
/// otherwise until `from` ends. Adds each byte that reached `to` to `moved`. Both sockets must
/// be non-blocking. With `len`, `at_source_end` is called once the last of those bytes has been
/// read from `from` and before it is written to `to`, so what it releases is released before
/// the reader of `to` can have the whole.
///
/// Each wait for `from` ends at `read_until()` when it gives an instant (asked before every
/// wait, so an idle limit restarts with each piece); each wait for `to` lasts at most
/// `write_timeout` when given. The first fill does not wait (callers come here when bytes are
/// likely queued); after that, a fill that took all it asked for is followed by another at
/// once, and otherwise the next one waits for readiness first, which spares the system call
/// that would only find the socket empty.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn pump(
    from: &TcpStream,
    to: &TcpStream,
    pipe: &mut PooledPipe,
    len: Option<u64>,
    read_until: impl Fn() -> Option<Instant>,
    write_timeout: Option<Duration>,
    moved: &Cell<u64>,
    at_source_end: &mut dyn FnMut(),
) -> Result<(), MoveError> {
    let PooledPipe { pipe: slot, held } = pipe;
    let p = slot
        .as_ref()
        .ok_or_else(|| MoveError::Source(io::Error::other("splice pipe gone")))?;
    let mut left = len;
    let mut wait_first = false;
    let mut since_yield = 0u64;
    while left != Some(0) {
        if since_yield >= BYTES_BETWEEN_YIELDS {
            since_yield = 0;
            YieldNow(false).await;
        }
        if wait_first {
            let ready = from.readable(false);
            match read_until() {
                None => ready.await.map_err(MoveError::Source)?,
                // The coarse per-core timers (decision 121): a runtime timer would make every
                // future that holds a splice 128-byte aligned, and so its box or task.
                Some(at) => match crate::timer::within(at, ready).await {
                    Some(r) => r.map_err(MoveError::Source)?,
                    None => return Err(MoveError::SourceTimeout),
                },
            }
        }
        let want = left.map_or(PIPE_BYTES, |l| {
            usize::try_from(l).map_or(PIPE_BYTES, |l| l.min(PIPE_BYTES))
        });
        let n = match p.fill_from(from, want) {
            Ok(0) if left.is_none() => return Ok(()),
            Ok(0) => {
                return Err(MoveError::Source(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the connection closed before the body was complete",
                )))
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait_first = true;
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                wait_first = false;
                continue;
            }
            Err(e) => return Err(MoveError::Source(e)),
        };
        wait_first = n < want;
        left = left.map(|l| l.saturating_sub(n as u64));
        if left == Some(0) {
            at_source_end();
        }
        since_yield = since_yield.saturating_add(n as u64);
        *held = held.saturating_add(n);
        while *held > 0 {
            match p.drain_to(to, *held) {
                Ok(0) => return Err(MoveError::Sink(io::ErrorKind::WriteZero.into())),
                Ok(m) => {
                    *held = held.saturating_sub(m);
                    moved.set(moved.get().saturating_add(m as u64));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let room = to.writable(false);
                    let waited = match write_timeout {
                        None => room.await,
                        Some(t) => crate::timer::within_for(t, room)
                            .await
                            .unwrap_or_else(|| Err(io::ErrorKind::TimedOut.into())),
                    };
                    waited.map_err(MoveError::Sink)?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(MoveError::Sink(e)),
            }
        }
    }
    Ok(())
}
