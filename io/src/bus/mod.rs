//! The worker bus transport: lanes between a control and its remote workers over TCP or TLS,
//! carrying the frames of `sortie_core::bus` (protocol in `docs/bus-protocol.md`, decisions
//! 060–062).
//!
//! - `conn.rs`: one connection, plain or TLS, split into a reader and a writer task.
//! - `control.rs`: the control side: the listener, admission, the hand-over of a lane to the
//!   core its hello names, per-core lane tables, and remote execution of a routed request.
//! - `ingress.rs`: the forward proxy's absolute-form requests and CONNECT tunnels on remote
//!   workers (streamed bodies and tunnel bytes under the worker's credit).
//! - `worker.rs`: `sortie worker`: lanes to every control, registration, execution of
//!   assignments with the egress client, heartbeats, reconnection.

pub(crate) mod conn;
pub mod control;
pub(crate) mod ingress;
pub mod worker;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use sortie_core::bus::{encode, EncodeError, Frame};

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

/// Frames waiting to be written on one lane, already encoded; the lane's writer task takes
/// them all at once.
#[derive(Default)]
pub(crate) struct Outbox {
    buf: RefCell<Vec<u8>>,
    /// Bytes the writer took and is still writing.
    writing: Cell<usize>,
    ready: Notify,
    is_closed: Cell<bool>,
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
        if self.is_closed.get() {
            return Ok(());
        }
        encode(frame, &mut self.buf.borrow_mut())?;
        self.ready.notify();
        Ok(())
    }

    /// Bytes queued or being written.
    pub(crate) fn queued(&self) -> usize {
        self.buf.borrow().len() + self.writing.get()
    }

    /// Stops the writer after what is queued.
    pub(crate) fn close(&self) {
        self.is_closed.set(true);
        self.ready.notify();
        self.wake_drained();
    }

    /// The writer task: writes what is queued until the outbox closes or a write fails.
    pub(crate) async fn run<S: monoio::io::AsyncWriteRent>(&self, mut conn: conn::Conn<S>) {
        let mut spare = Vec::new();
        loop {
            let pending = {
                let mut b = self.buf.borrow_mut();
                if b.is_empty() {
                    None
                } else {
                    spare.clear();
                    Some(std::mem::replace(&mut *b, std::mem::take(&mut spare)))
                }
            };
            match pending {
                Some(bytes) => {
                    self.writing.set(bytes.len());
                    let (r, back) = conn.write_all(bytes).await;
                    self.writing.set(0);
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
/// the end of the stream.
pub(crate) async fn read_frame<S: monoio::io::AsyncReadRent>(
    conn: &mut conn::Conn<S>,
    buf: &mut Vec<u8>,
) -> Result<Option<Frame>, ReadError> {
    loop {
        match sortie_core::bus::decode(buf) {
            Ok(sortie_core::bus::Decoded::Frame(f, used)) => {
                buf.drain(..used);
                return Ok(Some(f));
            }
            Ok(sortie_core::bus::Decoded::Partial(_)) => {}
            Err(e) => return Err(ReadError::Frame(e)),
        }
        match conn.read(buf).await {
            Ok(0) => return Ok(None),
            Ok(_) => {}
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
}
