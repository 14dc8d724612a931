//! The accept loop of one listener on one core: one task per connection, a connection cap, and
//! graceful shutdown (stop accepting, let in-flight requests finish within a grace period).

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};

use super::config::{CoreServerConfig, ServerConfig};
use super::conn::{serve_connection, Parked, MAX_LINGER_BYTES};
use super::handler::Handler;
use super::park::{Parking, Woken};
use super::race::{race, Either};
use super::response::{encode_head, ConnectionField};
use super::shutdown::{Latch, LatchWait, ShutdownSignal};

/// Connections over the cap that are answered 503 at once; further ones are closed without an
/// answer, so that a flood cannot make the rejections themselves a burden.
pub const MAX_PENDING_REJECTIONS: usize = 64;
/// Time a rejected connection gets to receive its 503.
pub const REJECTION_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause after an accept error such as EMFILE, so that the loop does not spin while the process
/// is out of descriptors.
pub const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// Counts the tasks of one accept loop, so that shutdown can wait for them.
#[derive(Default)]
struct Tracker {
    /// Connections being served (the cap applies to these).
    connections: Cell<usize>,
    /// Rejections being answered.
    rejections: Cell<usize>,
    /// The accept loop, waiting for the counts to reach zero.
    waiter: Cell<Option<Waker>>,
    /// Set when the grace period ends: every remaining task stops.
    hard_stop: Rc<Latch>,
}

impl Tracker {
    fn is_idle(&self) -> bool {
        self.connections.get() == 0 && self.rejections.get() == 0
    }

    fn task_ended(&self) {
        if self.is_idle() {
            if let Some(w) = self.waiter.take() {
                w.wake();
            }
        }
    }
}

/// Decrements its counter when a task ends, however it ends.
struct TaskGuard {
    tracker: Rc<Tracker>,
    is_connection: bool,
}

impl TaskGuard {
    fn new(tracker: &Rc<Tracker>, is_connection: bool) -> TaskGuard {
        let counter = if is_connection {
            &tracker.connections
        } else {
            &tracker.rejections
        };
        counter.set(counter.get().saturating_add(1));
        TaskGuard {
            tracker: Rc::clone(tracker),
            is_connection,
        }
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        let counter = if self.is_connection {
            &self.tracker.connections
        } else {
            &self.tracker.rejections
        };
        counter.set(counter.get().saturating_sub(1));
        self.tracker.task_ended();
    }
}

/// Completes when every task of the tracker has ended.
struct AllEnded<'t>(&'t Tracker);

impl Future for AllEnded<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0.is_idle() {
            return Poll::Ready(());
        }
        self.0.waiter.set(Some(cx.waker().clone()));
        Poll::Pending
    }
}

/// Accepts connections until shutdown, serving each on its own task with
/// [`serve_connection`]; then waits for in-flight connections up to
/// [`ServerConfig::shutdown_grace`] and closes the rest. Returns when no connection remains.
///
/// Past [`ServerConfig::max_connections`], a new connection is answered `503` with
/// `Connection: close` and closed (up to [`MAX_PENDING_REJECTIONS`] at once; beyond that it is
/// closed without an answer).
pub async fn serve<H: Handler>(
    listener: TcpListener,
    handler: Rc<H>,
    cfg: Rc<ServerConfig>,
    shutdown: ShutdownSignal,
) {
    let limits = Rc::new(CoreServerConfig::fixed((*cfg).clone()));
    serve_live(listener, handler, limits, shutdown).await;
}

/// [`serve`] with limits a reload may replace: each connection is served with the limits in
/// force when it was accepted, and the grace after shutdown is the one in force then.
pub async fn serve_live<H: Handler>(
    listener: TcpListener,
    handler: Rc<H>,
    limits: Rc<CoreServerConfig>,
    shutdown: ShutdownSignal,
) {
    // Responses are written whole; Nagle's algorithm would only delay them. Set once on the
    // listener (it may come from a predecessor or the service manager without it): each accepted
    // connection inherits it.
    if let Err(e) = crate::fd::set_nodelay(&listener) {
        tracing::warn!(error = %e, "cannot set TCP_NODELAY on the listener");
    }
    let tracker = Rc::new(Tracker::default());
    let parking = match Parking::new() {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::error!(error = %e, "cannot park idle connections: they are closed instead");
            None
        }
    };
    let serving = Rc::new(Serving {
        handler: Rc::clone(&handler),
        shutdown: shutdown.clone(),
        tracker: Rc::clone(&tracker),
        parking,
    });
    monoio::spawn(unpark(Rc::clone(&serving)));
    let admit = |stream: TcpStream, peer: std::net::SocketAddr| {
        let cfg = limits.current();
        if tracker.connections.get() >= cfg.max_connections {
            reject_overload(&tracker, stream, &*handler);
            return;
        }
        let guard = TaskGuard::new(&tracker, true);
        spawn_connection(&serving, Parked::accepted(stream, peer, cfg), guard);
    };
    {
        let mut stop = pin!(shutdown.wait());
        // The accept is cancellable: at shutdown it is cancelled and awaited rather than
        // dropped, so that a connection the kernel completed meanwhile is served instead of
        // left open with nobody reading it (on a socket shared with a successor, decision 115,
        // the others were not lost: they wait in the queue for the successor).
        let canceller = monoio::io::Canceller::new();
        loop {
            let mut accept = pin!(listener.cancelable_accept(canceller.handle()));
            match race(stop.as_mut(), accept.as_mut()).await {
                Either::Left(()) => {
                    drop(canceller.cancel());
                    if let Ok((stream, peer)) = accept.await {
                        admit(stream, peer);
                    }
                    break;
                }
                Either::Right(Ok((stream, peer))) => admit(stream, peer),
                Either::Right(Err(e)) => {
                    if is_resource_exhaustion(&e) {
                        tracing::warn!(error = %e, "accept failed: out of resources");
                        let pause = pin!(monoio::time::sleep(ACCEPT_ERROR_BACKOFF));
                        if let Either::Left(()) = race(stop.as_mut(), pause).await {
                            break;
                        }
                    } else {
                        // Errors such as ECONNABORTED concern one connection only.
                        tracing::debug!(error = %e, "accept failed");
                    }
                }
            }
        }
    }
    // Closing the listener stops accepting; with SO_REUSEPORT the kernel sends new connections
    // to the listeners that remain open.
    drop(listener);
    let grace = pin!(monoio::time::sleep(limits.current().shutdown_grace));
    if let Either::Right(()) = race(AllEnded(&tracker), grace).await {
        tracing::info!(
            connections = tracker.connections.get(),
            "shutdown grace period over: closing remaining connections"
        );
        tracker.hard_stop.set();
        AllEnded(&tracker).await;
    }
}

/// What the connections of one listener on one core share.
struct Serving<H> {
    handler: Rc<H>,
    shutdown: ShutdownSignal,
    tracker: Rc<Tracker>,
    /// Idle connections, parked without a task; `None` if the epoll set could not be made.
    parking: Option<Parking<ParkedConnection>>,
}

/// A parked connection and its place in the count.
struct ParkedConnection {
    conn: Parked,
    guard: TaskGuard,
}

impl std::os::fd::AsRawFd for ParkedConnection {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.conn.as_raw_fd()
    }
}

/// Starts the task of a connection, new or coming back from the parking.
fn spawn_connection<H: Handler>(serving: &Rc<Serving<H>>, conn: Parked, guard: TaskGuard) {
    let parker = Rc::clone(serving);
    monoio::spawn(ConnectionTask {
        conn: serve_connection(
            conn,
            Rc::clone(&serving.handler),
            serving.shutdown.clone(),
            move |conn, deadline| parker.park(conn, deadline),
        ),
        hard_stop: LatchWait::new(Rc::clone(&serving.tracker.hard_stop)),
        _guard: guard,
    });
}

impl<H> Serving<H> {
    /// Parks an idle connection until its next request or `deadline`; closes it (by dropping
    /// it) when shutdown has reached idle connections or parking fails.
    fn park(&self, conn: Parked, deadline: monoio::time::Instant) {
        if self.shutdown.is_closing_idle() || self.tracker.hard_stop.is_set() {
            return;
        }
        let Some(parking) = &self.parking else {
            return;
        };
        // Counted from here as parked; the task that parks it ends right after.
        let guard = TaskGuard::new(&self.tracker, true);
        if let Err((c, e)) = parking.park(ParkedConnection { conn, guard }, deadline) {
            tracing::debug!(error = %e, "cannot park an idle connection: closing it");
            c.close();
        }
    }
}

impl ParkedConnection {
    /// Closes the connection and takes it out of the count. The socket is shut down first: a
    /// copy of its descriptor in another process (inherited across a fork, as by a successor
    /// during a binary upgrade) must not keep the client waiting.
    fn close(self) {
        let _ = crate::fd::shutdown_both(&self.conn);
    }
}

/// Serves the parking of one listener on one core: a connection whose client sends again (or
/// leaves) gets a task again; one that reaches its deadline is closed, and so is every parked
/// one when shutdown reaches idle connections or the grace period ends.
async fn unpark<H: Handler>(serving: Rc<Serving<H>>) {
    let Some(parking) = &serving.parking else {
        return;
    };
    let waiter = match parking.waiter() {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(error = %e, "cannot wait for idle connections: closing them");
            parking
                .close()
                .into_iter()
                .for_each(ParkedConnection::close);
            return;
        }
    };
    let mut stop = pin!(serving.shutdown.idle_close());
    let mut hard_stop = pin!(LatchWait::new(Rc::clone(&serving.tracker.hard_stop)));
    loop {
        let next = pin!(parking.next(&waiter));
        match race(race(stop.as_mut(), hard_stop.as_mut()), next).await {
            Either::Left(_) => break,
            Either::Right(Woken::Ready(conns)) => {
                for c in conns {
                    spawn_connection(&serving, c.conn, c.guard);
                }
            }
            Either::Right(Woken::Expired(conns)) => {
                conns.into_iter().for_each(ParkedConnection::close);
            }
            Either::Right(Woken::Settled) => crate::runtime::release_free_memory(),
        }
    }
    parking
        .close()
        .into_iter()
        .for_each(ParkedConnection::close);
}

pin_project_lite::pin_project! {
    /// The task of one connection: its future, dropped as soon as the hard stop comes, and its
    /// place in the count. A struct rather than an `async` block, which would keep the
    /// connection's future twice (once captured, once pinned): this is the state every idle
    /// connection keeps.
    struct ConnectionTask<F> {
        #[pin]
        conn: F,
        hard_stop: LatchWait,
        _guard: TaskGuard,
    }
}

impl<F: Future<Output = ()>> Future for ConnectionTask<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        // The hard stop first, as `race` would.
        if Pin::new(this.hard_stop).poll(cx).is_ready() {
            return Poll::Ready(());
        }
        this.conn.poll(cx)
    }
}

/// The 503 answer to connections over the cap.
fn overload_response<H: Handler>(handler: &H) -> Bytes {
    let response = handler.error_response(503, "too_many_connections");
    let mut out = Vec::with_capacity(128);
    match encode_head(&mut out, &response, false, ConnectionField::Close) {
        Ok(has_body) => {
            if has_body {
                if let Some(b) = response.body.whole() {
                    out.extend_from_slice(b);
                }
            }
            Bytes::from(out)
        }
        Err(_) => Bytes::from_static(
            b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
        ),
    }
}

fn reject_overload<H: Handler>(tracker: &Rc<Tracker>, stream: TcpStream, handler: &H) {
    if tracker.rejections.get() >= MAX_PENDING_REJECTIONS {
        // Dropping the stream closes it.
        return;
    }
    let guard = TaskGuard::new(tracker, false);
    let hard_stop = LatchWait::new(Rc::clone(&tracker.hard_stop));
    let answer = overload_response(handler);
    monoio::spawn(async move {
        let _guard = guard;
        let reject = pin!(monoio::time::timeout(
            REJECTION_TIMEOUT,
            answer_and_close(stream, answer)
        ));
        race(hard_stop, reject).await;
    });
}

/// Writes `answer`, shuts down the write side and discards input until the client closes, so
/// that the close does not reset the connection before the client reads the answer.
async fn answer_and_close(mut stream: TcpStream, answer: Bytes) {
    let (res, _) = stream.write_all(answer).await;
    if res.is_err() || stream.shutdown().await.is_err() {
        return;
    }
    let mut buf = Vec::with_capacity(1024);
    let mut discarded = 0usize;
    loop {
        buf.clear();
        let (res, b) = stream.read(buf).await;
        buf = b;
        match res {
            Ok(n) if n > 0 => {
                discarded = discarded.saturating_add(n);
                if discarded > MAX_LINGER_BYTES {
                    return;
                }
            }
            _ => return,
        }
    }
}

fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_count_and_wake_the_waiter_at_zero() {
        let tracker = Rc::new(Tracker::default());
        let a = TaskGuard::new(&tracker, true);
        let b = TaskGuard::new(&tracker, false);
        assert_eq!(tracker.connections.get(), 1);
        assert_eq!(tracker.rejections.get(), 1);
        assert!(!tracker.is_idle());
        drop(a);
        assert!(!tracker.is_idle());
        drop(b);
        assert!(tracker.is_idle());
    }

    /// What an accepted connection relies on instead of a `setsockopt` of its own: the
    /// listener has `TCP_NODELAY` once serving starts, and the kernel hands it on.
    #[test]
    fn accepted_connections_inherit_no_delay_from_the_listener() {
        let nodelay = |fd: std::os::fd::RawFd| crate::fd::has_nodelay(&fd).unwrap();
        crate::runtime::run_on(crate::runtime::Driver::detect(), async move {
            let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = std_listener.local_addr().unwrap();
            let listener = TcpListener::from_std(std_listener).unwrap();
            let fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
            assert!(!nodelay(fd));
            let shutdown = ShutdownSignal::new();
            let serving = monoio::spawn(serve(
                listener,
                Rc::new(crate::http::handler::Minimal),
                Rc::new(ServerConfig::default()),
                shutdown.clone(),
            ));
            let mut client = TcpStream::connect(addr).await.unwrap();
            let (res, _) = client
                .write_all(&b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"[..])
                .await;
            res.unwrap();
            let (res, buf) = client.read(vec![0u8; 1024]).await;
            let n = res.unwrap();
            assert!(buf[..n].starts_with(b"HTTP/1.1 204"));
            assert!(nodelay(fd));
            shutdown.trigger();
            drop(client);
            serving.await;
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        crate::fd::set_nodelay(&listener).unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        assert!(nodelay(std::os::fd::AsRawFd::as_raw_fd(&accepted)));
    }

    #[test]
    fn resource_errors_are_told_apart() {
        assert!(is_resource_exhaustion(&io::Error::from_raw_os_error(
            libc::EMFILE
        )));
        assert!(!is_resource_exhaustion(&io::Error::from_raw_os_error(
            libc::ECONNABORTED
        )));
    }
}
