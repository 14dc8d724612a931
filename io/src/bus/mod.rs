//! The worker bus transport: lanes between a control and its remote workers over TCP or TLS,
//! carrying the frames of `sortie_core::bus` (protocol in `docs/bus-protocol.md`, decisions
//! 060–062).
//!
//! - `conn.rs`: one connection, plain or TLS, split into a reader and a writer task.
//! - this file: frame reading and buffering (`FrameBuf`, `read_frame`), the outbox a lane writes
//!   from, and the per-core notification and queue primitives both ends use.
//!
//! The control's side of the bus (listener, lanes, remote execution) is `crate::remote`; the
//! worker process is `crate::worker`. This module knows neither.

pub(crate) mod conn;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use sortie_core::bus::{encode, EncodeError, Frame, FrameBuf};

/// A level-triggered wake-up for one waiting task of this core: `notify` marks it, the next
/// `wait` consumes the mark.
#[derive(Default)]
pub(crate) struct Notify {
    is_marked: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl Notify {
    pub(crate) fn notify(&self) {
        self.is_marked.set(true);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    pub(crate) fn wait(&self) -> NotifyWait<'_> {
        NotifyWait(self)
    }
}

pub(crate) struct NotifyWait<'a>(&'a Notify);

impl Future for NotifyWait<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0.is_marked.replace(false) {
            return Poll::Ready(());
        }
        self.0.waker.set(Some(cx.waker().clone()));
        Poll::Pending
    }
}

/// Bytes that may wait to be written on one lane before it takes no new stream: a peer that
/// stops reading makes new assignments `transport_unavailable` instead of growing the queue.
pub(crate) const MAX_QUEUED_BYTES: usize = 8 * 1024 * 1024;

/// Bytes one lane may hold queued at all, control frames included: past it the peer has
/// stopped reading for good (stream data already waits at [`MAX_QUEUED_BYTES`]; only control
/// frames, such as configuration pushes, can go beyond), and the lane is closed (decision 101).
pub(crate) const MAX_OUTBOX_BYTES: usize = 2 * MAX_QUEUED_BYTES + sortie_core::bus::MAX_FRAME_BYTES;

/// Most bytes of one write: a lane is judged by how long one such write takes
/// ([`Outbox::is_stuck`]).
const MAX_WRITE_BYTES: usize = 256 * 1024;

/// Frames waiting to be written on one lane, already encoded; the lane's writer task takes
/// them all at once and writes them in pieces of at most `MAX_WRITE_BYTES`.
#[derive(Default)]
pub(crate) struct Outbox {
    buf: RefCell<Vec<u8>>,
    /// Bytes at the front of `buf` already handed to the writer.
    taken: Cell<usize>,
    /// Bytes the writer took and is still writing.
    writing: Cell<usize>,
    /// When the piece being written started, while one is.
    writing_since: Cell<Option<std::time::Instant>>,
    ready: Notify,
    is_closed: Cell<bool>,
    /// Wakes a writer waiting on a write when the lane is abandoned.
    abort: Notify,
    /// Senders waiting for the queue to fall under `MAX_QUEUED_BYTES`.
    drained: RefCell<Vec<Waker>>,
}

impl Outbox {
    /// Waits while more than `MAX_QUEUED_BYTES` wait to be written (or until the outbox
    /// closes): a peer that grants credit but stops reading cannot make this side queue
    /// without limit. Stream data waits here; control frames do not.
    pub(crate) async fn room(&self) {
        std::future::poll_fn(|cx| {
            if self.is_closed.get() || self.queued() <= MAX_QUEUED_BYTES {
                Poll::Ready(())
            } else {
                self.drained.borrow_mut().push(cx.waker().clone());
                Poll::Pending
            }
        })
        .await;
    }

    fn wake_drained(&self) {
        let waiting = std::mem::take(&mut *self.drained.borrow_mut());
        for w in waiting {
            w.wake();
        }
    }

    /// Queues a frame.
    pub(crate) fn push(&self, frame: &Frame) -> Result<(), EncodeError> {
        self.push_with(|out| encode(frame, out))
    }

    /// Queues the frame `write` appends to the queue's bytes (an encoder that leaves them as
    /// they were when it fails), for frames written from borrowed parts without a `Frame`.
    pub(crate) fn push_with(
        &self,
        write: impl FnOnce(&mut Vec<u8>) -> Result<(), EncodeError>,
    ) -> Result<(), EncodeError> {
        if self.is_closed.get() {
            return Ok(());
        }
        write(&mut self.buf.borrow_mut())?;
        self.ready.notify();
        Ok(())
    }

    /// Bytes queued or being written.
    pub(crate) fn queued(&self) -> usize {
        self.buf.borrow().len() - self.taken.get() + self.writing.get()
    }

    /// The next piece for the writer, at most `MAX_WRITE_BYTES`: the whole queue when it is
    /// that small (swapped with `spare`, no copy), else copied from the front. The bytes
    /// handed over leave the queue by an offset, dropped once they are the larger part, so a
    /// long queue costs each byte a bounded number of moves.
    fn next_piece(&self, spare: &mut Vec<u8>) -> Option<Vec<u8>> {
        let mut b = self.buf.borrow_mut();
        let at = self.taken.get();
        if at >= b.len() {
            b.clear();
            self.taken.set(0);
            return None;
        }
        if at == 0 && b.len() <= MAX_WRITE_BYTES {
            spare.clear();
            return Some(std::mem::replace(&mut *b, std::mem::take(spare)));
        }
        let end = (at + MAX_WRITE_BYTES).min(b.len());
        let mut piece = std::mem::take(spare);
        piece.clear();
        piece.extend_from_slice(b.get(at..end).unwrap_or_default());
        if end == b.len() {
            b.clear();
            self.taken.set(0);
        } else if end > b.len() - end {
            b.drain(..end);
            self.taken.set(0);
        } else {
            self.taken.set(end);
        }
        Some(piece)
    }

    /// Stops the writer after what is queued.
    pub(crate) fn close(&self) {
        self.is_closed.set(true);
        self.ready.notify();
        self.wake_drained();
    }

    /// Stops the writer now, abandoning a write the peer does not take and what is queued.
    pub(crate) fn abort(&self) {
        self.close();
        self.abort.notify();
    }

    /// Whether the peer stopped reading: more than `MAX_OUTBOX_BYTES` queued, or one piece
    /// of at most `MAX_WRITE_BYTES` in the writing for longer than `stall`.
    pub(crate) fn is_stuck(&self, stall: std::time::Duration) -> bool {
        self.queued() > MAX_OUTBOX_BYTES
            || self
                .writing_since
                .get()
                .is_some_and(|since| since.elapsed() > stall)
    }

    /// The writer task: writes what is queued until the outbox closes or a write fails, or
    /// until [`Outbox::abort`].
    pub(crate) async fn run<S: monoio::io::AsyncWriteRent>(&self, mut conn: conn::Conn<S>) {
        let mut spare = Vec::new();
        loop {
            match self.next_piece(&mut spare) {
                Some(bytes) => {
                    self.writing.set(bytes.len());
                    self.writing_since.set(Some(std::time::Instant::now()));
                    let written = monoio::select! {
                        w = conn.write_all(bytes) => Some(w),
                        _ = self.abort.wait() => None,
                    };
                    self.writing.set(0);
                    self.writing_since.set(None);
                    let Some((r, back)) = written else {
                        return;
                    };
                    spare = back;
                    if r.is_err() {
                        self.is_closed.set(true);
                        self.wake_drained();
                        return;
                    }
                    self.wake_drained();
                }
                None if self.is_closed.get() => return,
                None => self.ready.wait().await,
            }
        }
    }
}

/// Events of one stream, queued by the lane's reader for the task that runs the stream.
pub(crate) struct Queue<T> {
    items: RefCell<VecDeque<T>>,
    ready: Notify,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue {
            items: RefCell::new(VecDeque::new()),
            ready: Notify::default(),
        }
    }
}

impl<T> Queue<T> {
    pub(crate) fn push(&self, item: T) {
        self.items.borrow_mut().push_back(item);
        self.ready.notify();
    }

    pub(crate) async fn next(&self) -> T {
        loop {
            if let Some(v) = self.items.borrow_mut().pop_front() {
                return v;
            }
            self.ready.wait().await;
        }
    }
}

/// Why no frame could be read.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The connection failed (reset, TLS failure): the peer is gone.
    Io(std::io::Error),
    /// The bytes are not a frame: a protocol error.
    Frame(sortie_core::bus::FrameError),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Frame(e) => write!(f, "{e}"),
        }
    }
}

/// Reads from `conn` until one whole frame is buffered in `buf`, and decodes it. `Ok(None)` at
/// the end of the stream. Linear in the bytes read: frames leave `buf` by an offset
/// (`FrameBuf`), however small and many they are.
pub(crate) async fn read_frame<S: monoio::io::AsyncReadRent>(
    conn: &mut conn::Conn<S>,
    buf: &mut FrameBuf,
) -> Result<Option<Frame>, ReadError> {
    read_checked(conn, buf, false).await
}

/// The next frame already in `buf`, without reading: a read brings several frames at a time,
/// and a lane's loop takes those without setting up its wait for the next read (and for its
/// stop) once per frame.
pub(crate) fn buffered_frame(buf: &mut FrameBuf) -> Result<Option<Frame>, ReadError> {
    buf.next_frame().map_err(ReadError::Frame)
}

/// Reads a connection's first frame, which must be a `Hello` no longer than the largest valid
/// one: anything else fails as soon as its five header bytes are in, before the rest is
/// buffered (decision 101).
pub(crate) async fn read_hello<S: monoio::io::AsyncReadRent>(
    conn: &mut conn::Conn<S>,
    buf: &mut FrameBuf,
) -> Result<Option<Frame>, ReadError> {
    read_checked(conn, buf, true).await
}

async fn read_checked<S: monoio::io::AsyncReadRent>(
    conn: &mut conn::Conn<S>,
    buf: &mut FrameBuf,
    is_first: bool,
) -> Result<Option<Frame>, ReadError> {
    loop {
        if is_first {
            sortie_core::bus::check_first_frame(buf.pending()).map_err(ReadError::Frame)?;
        }
        if let Some(f) = buf.next_frame().map_err(ReadError::Frame)? {
            return Ok(Some(f));
        }
        match conn.read(buf.spare()).await {
            Ok(0) => return Ok(None),
            Ok(_) => {}
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
}

/// A connection handed from the core that accepted it to the core its hello names.
pub struct Handoff {
    pub(crate) stream: std::net::TcpStream,
    pub(crate) tls: Option<rustls::Connection>,
    pub(crate) hello: Box<sortie_core::bus::Hello>,
    pub(crate) rest: FrameBuf,
}
