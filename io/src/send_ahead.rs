//! A send put on the ring while a read of the same socket waits, and collected only once that
//! read is done (io_uring; decisions 124 and 125): its completion then wakes no task of its own.
//!
//! On io_uring every completion a task waits for wakes it, and each wake-up polls the task's
//! whole chain of futures again. A send followed by a read costs two; a send made first and
//! polled only after the read costs one, and both reach the kernel in the same submission.
//!
//! The runtime's send and receive each hold the stream they were made on for as long as they
//! run, so the send goes on a second descriptor of the socket ([`crate::fd::second_handle`]).
//! The epoll driver makes a send when it is first polled, not when it is created: there the
//! send would wait for the read, so [`SecondWriter::take`] lends nothing and callers send first.

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use monoio::net::TcpStream;
use monoio::BufResult;

/// Most bytes of a send made ahead of a read ([`collect`]): what the send buffer of a socket whose
/// earlier sends were acknowledged takes whole. A short send leaves its rest unsent until it is
/// collected, while the peer may wait for that rest before it sends what the read waits for.
pub(crate) const MAX_SENT_AHEAD_BYTES: usize = 8 * 1024;

/// The second descriptor of a socket, made when it is first needed: on the second request for
/// it, so that a socket used for one exchange only pays no descriptor made and closed for
/// nothing. Boxed, so that what holds it stays small.
#[derive(Default)]
pub(crate) struct SecondWriter {
    writer: Option<Box<TcpStream>>,
    has_asked: bool,
}

impl SecondWriter {
    /// A second descriptor of `stream`'s socket, lent for one send (give it back with
    /// [`SecondWriter::put`]): `None` on the first request, on the epoll driver, or when the
    /// descriptor cannot be duplicated (the descriptor limit).
    pub(crate) fn take(&mut self, stream: &TcpStream) -> Option<Box<TcpStream>> {
        if !std::mem::replace(&mut self.has_asked, true) || monoio::utils::is_legacy() {
            return None;
        }
        if self.writer.is_none() {
            self.writer = crate::fd::second_handle(stream).ok().map(Box::new);
        }
        self.writer.take()
    }

    /// Gives back the descriptor [`SecondWriter::take`] lent.
    pub(crate) fn put(&mut self, writer: Box<TcpStream>) {
        self.writer = Some(writer);
    }

    /// Closes the second descriptor, if one was made, and starts over: the next request for
    /// one is again a first.
    pub(crate) fn release(&mut self) {
        *self = SecondWriter::default();
    }
}

/// What became of a send made ahead of a read ([`collect`]), of a buffer of type `T`.
pub(crate) enum Sent<T = Vec<u8>> {
    /// The socket took it whole; the buffer comes back.
    Whole(T),
    /// The socket took the first `.0` bytes only (its buffer was full); the buffer comes back.
    Short(usize, T),
    /// The send failed.
    Failed,
    /// Not done by the limit.
    NotDone,
}

/// Collects a send made with `writer.write(data)` (of `len` bytes) before another future ran to
/// its end, waiting for it until `until` if it is not done yet. The caller pins the send where
/// it makes it, then awaits its other future, then this:
///
/// ```ignore
/// let len = data.len();
/// let mut send = std::pin::pin!(writer.write(data)); // on the ring from here
/// let answer = read_answer().await;                   // the only wake-up
/// let sent = send_ahead::collect(send.as_mut(), len, until).await;
/// ```
///
/// Not a function that takes the other future: that future would be moved into the function's
/// own state, a copy of its whole size per call.
pub(crate) async fn collect<F, T>(
    send: Pin<&mut F>,
    len: usize,
    until: Instant,
    timer: &mut crate::timer::Timer,
) -> Sent<T>
where
    F: Future<Output = BufResult<usize, T>>,
{
    match timer.within(until, send).await {
        Some((Ok(n), data)) if n == len => Sent::Whole(data),
        Some((Ok(n), data)) if n > 0 => Sent::Short(n, data),
        Some(_) => Sent::Failed,
        None => Sent::NotDone,
    }
}
