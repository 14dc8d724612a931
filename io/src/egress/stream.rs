//! One upstream connection, plain TCP or TLS, with the read buffer it owns and the facts the
//! pool needs to decide whether it may be reused.
//!
//! On the per-request path: reads go into one reusable buffer; no logging.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
#[cfg(feature = "fingerprints")]
use std::pin::Pin;

use bytes::Bytes;
use monoio::buf::IoBufMut as _;
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt as _};
use monoio::net::TcpStream;
use monoio_rustls::ClientTlsStream;

use crate::fd::{self, PeerState};
pub(crate) use crate::send_ahead::Sent;
use crate::send_ahead::{collect, SecondWriter};

/// Bytes asked for by one read. A TLS record carries at most 16 KiB of plaintext; a larger
/// buffer lets one read drain several records.
pub(crate) const READ_BUF_BYTES: usize = 64 * 1024;

/// The transport under the HTTP/1.1 exchange.
pub(crate) enum Transport {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP, boxed: the session state is large and moves with the connection.
    Tls(Box<ClientTlsStream<TcpStream>>),
    /// TLS to the destination inside TLS to an `https://` upstream proxy.
    TlsInTls(Box<ClientTlsStream<ClientTlsStream<TcpStream>>>),
    /// A fingerprinted (BoringSSL) session on the socket in poll mode, when the destination
    /// chose HTTP/1.1.
    #[cfg(feature = "fingerprints")]
    Boring(Box<super::fingerprint::BoringStream>),
}

/// An upstream connection: its state in a box of its own, so that the pool, the retry loop and
/// each exchange move a pointer rather than the socket, its addresses and its buffers (a
/// connection changes hands several times per request). Its operations are [`ConnState`]'s.
pub(crate) struct Conn(Box<ConnState>);

impl std::ops::Deref for Conn {
    type Target = ConnState;

    fn deref(&self) -> &ConnState {
        &self.0
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut ConnState {
        &mut self.0
    }
}

/// What an upstream connection holds.
pub(crate) struct ConnState {
    transport: Transport,
    /// The descriptor of the TCP stream inside `transport`, which owns it; kept because the TLS
    /// wrapper does not lend out its inner stream.
    fd: RawFd,
    peer: SocketAddr,
    /// The address the destination policy is checked against before reuse: the peer for a
    /// direct connection, the destination address the proxy was asked for through an upstream
    /// proxy, none when the proxy resolved the name (decision 070).
    policy_ip: Option<IpAddr>,
    buf: Vec<u8>,
    /// Whether the last TLS read returned less than it asked for, which means rustls holds no
    /// further decrypted bytes (its reader copies until the caller's buffer or its own queue is
    /// exhausted). Always true for plain TCP, which buffers nothing in user space.
    is_plaintext_drained: bool,
    /// Whether the socket was switched to non-blocking mode for `splice`.
    is_nonblocking: bool,
    /// A plain connection's second descriptor of its socket, for a request head sent while the
    /// answer's read waits (io_uring only, decision 124): made on the connection's second
    /// exchange (a connection used once, as with a destination that closes after each answer,
    /// would pay a descriptor made and closed for nothing), then kept with the connection.
    writer: SecondWriter,
}

impl Conn {
    /// Wraps a connected plain TCP stream.
    pub(crate) fn plain(stream: TcpStream, peer: SocketAddr) -> Conn {
        let fd = stream.as_raw_fd();
        Conn::new(Transport::Plain(stream), fd, peer)
    }

    /// Wraps a TLS stream; `fd` is the descriptor of its TCP stream.
    pub(crate) fn tls(stream: ClientTlsStream<TcpStream>, fd: RawFd, peer: SocketAddr) -> Conn {
        Conn::new(Transport::Tls(Box::new(stream)), fd, peer)
    }

    /// Wraps TLS to the destination inside TLS to an upstream proxy; `fd` is the descriptor of
    /// the TCP stream to the proxy.
    pub(crate) fn tls_in_tls(
        stream: ClientTlsStream<ClientTlsStream<TcpStream>>,
        fd: RawFd,
        peer: SocketAddr,
    ) -> Conn {
        Conn::new(Transport::TlsInTls(Box::new(stream)), fd, peer)
    }

    /// Wraps a fingerprinted TLS session; `fd` is the descriptor of its TCP stream.
    #[cfg(feature = "fingerprints")]
    pub(crate) fn boring(
        stream: super::fingerprint::BoringStream,
        fd: RawFd,
        peer: SocketAddr,
    ) -> Conn {
        Conn::new(Transport::Boring(Box::new(stream)), fd, peer)
    }

    /// Replaces the address the policy is checked against on reuse.
    pub(crate) fn with_policy_ip(mut self, ip: Option<IpAddr>) -> Conn {
        self.policy_ip = ip;
        self
    }

    fn new(transport: Transport, fd: RawFd, peer: SocketAddr) -> Conn {
        Conn(Box::new(ConnState {
            transport,
            fd,
            peer,
            policy_ip: Some(peer.ip()),
            // Allocated by the first read, and given back whenever the connection idles.
            buf: Vec::new(),
            is_plaintext_drained: true,
            is_nonblocking: monoio::utils::is_legacy(),
            writer: SecondWriter::default(),
        }))
    }

    /// Sends `data` on `writer` (lent by [`ConnState::take_writer`], given back here) while `answer`
    /// reads on the connection (decision 124, [`collect`]): the send's completion wakes no
    /// task of its own; it is collected by `until`. Done by then but for a failure: the answer
    /// came, or the connection broke.
    pub(crate) async fn send_with_answer<T>(
        &mut self,
        mut writer: Box<TcpStream>,
        data: Vec<u8>,
        until: std::time::Instant,
        answer: impl AsyncFnOnce(&mut Conn) -> T,
    ) -> (T, Sent) {
        let len = data.len();
        let out = {
            let mut send = std::pin::pin!(writer.write(data));
            let answer = answer(self).await;
            (
                answer,
                collect(send.as_mut(), len, until, &mut crate::timer::Timer::unset()).await,
            )
        };
        self.writer.put(writer);
        out
    }
}

impl ConnState {
    /// The address the destination policy is checked against before reuse, if any.
    pub(crate) fn policy_ip(&self) -> Option<IpAddr> {
        self.policy_ip
    }

    /// The second descriptor of a plain connection's socket, taken out for one send made
    /// while the connection reads ([`Conn::send_with_answer`] gives it back); `None` for TLS, on
    /// the epoll driver (which makes a send when it is polled, not when it is created), on the
    /// connection's first exchange, or if the descriptor cannot be duplicated.
    pub(crate) fn take_writer(&mut self) -> Option<Box<TcpStream>> {
        let Transport::Plain(stream) = &self.transport else {
            return None;
        };
        self.writer.take(stream)
    }

    /// The address connected to.
    pub(crate) fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Whether the connection is plain TCP.
    pub(crate) fn is_plain(&self) -> bool {
        matches!(self.transport, Transport::Plain(_))
    }

    /// The TCP stream of a plain connection, switched to non-blocking mode for `splice`
    /// (`crate::splice`); `None` for TLS, whose bytes must pass through user space.
    pub(crate) fn plain_for_splice(&mut self) -> io::Result<Option<&TcpStream>> {
        let Transport::Plain(stream) = &self.transport else {
            return Ok(None);
        };
        if !self.is_nonblocking {
            // Kept for the connection's life: io_uring's receive and send operations wait
            // through their own poll whatever the flag, and the epoll driver sets it anyway.
            fd::set_nonblocking(stream)?;
            self.is_nonblocking = true;
        }
        Ok(Some(stream))
    }

    /// Whether the TLS layer holds no decrypted bytes that were not handed out yet.
    pub(crate) fn is_plaintext_drained(&self) -> bool {
        self.is_plaintext_drained
    }

    /// Reads what is available (waiting for at least one byte) and returns it; an empty slice
    /// means EOF. A TLS peer that closes without `close_notify` also reads as EOF: many servers
    /// do, and the HTTP framing, not TLS, decides whether the message was complete.
    pub(crate) async fn read_some(&mut self) -> io::Result<&[u8]> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        // A read dropped by a timeout takes its buffer with it; never ask for zero bytes, which
        // would read as EOF.
        buf.reserve(READ_BUF_BYTES);
        let n = if let Transport::Plain(s) = &mut self.transport {
            let (res, buf) = s.read(buf).await;
            self.buf = buf;
            let n = res?;
            // Plain TCP buffers nothing in user space, whatever the read filled.
            self.is_plaintext_drained = true;
            n
        } else {
            // Boxed for the reason `read_append` gives.
            Box::pin(self.read_some_secured(buf)).await?
        };
        Ok(self.buf.get(..n).unwrap_or_default())
    }

    /// [`ConnState::read_some`] on a TLS transport: how many bytes `self.buf` received.
    async fn read_some_secured(&mut self, buf: Vec<u8>) -> io::Result<usize> {
        let asked = buf.capacity();
        let (res, buf) = match &mut self.transport {
            Transport::Tls(s) => s.read(buf).await,
            Transport::TlsInTls(s) => s.read(buf).await,
            #[cfg(feature = "fingerprints")]
            Transport::Boring(s) => {
                let mut buf = buf;
                let res = poll_read_vec(s, &mut buf, 0, asked).await;
                (res, buf)
            }
            // Read by the caller.
            Transport::Plain(_) => (Err(io::ErrorKind::Unsupported.into()), buf),
        };
        self.buf = buf;
        match res {
            Ok(n) => {
                // rustls may hold more when the read filled what was asked.
                self.is_plaintext_drained = n < asked;
                Ok(n)
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                self.is_plaintext_drained = true;
                self.buf.clear();
                Ok(0)
            }
            Err(e) => Err(e),
        }
    }

    /// Reads what is available (waiting for at least one byte, at most `max`) straight into
    /// the spare capacity of `out`, appending; returns how many bytes came, 0 at EOF (as
    /// [`ConnState::read_some`]). Saves the copy out of the connection's own buffer when the caller
    /// relays the bytes as they are. If the future is dropped, `out` is left empty.
    pub(crate) async fn read_append(&mut self, out: &mut Vec<u8>, max: usize) -> io::Result<usize> {
        let mut buf = std::mem::take(out);
        let len = buf.len();
        let max = max.max(1);
        if buf.capacity() == 0 {
            // A fresh buffer (a response head's) is made at its size: the growth path of
            // `reserve` costs several times an allocation's own work.
            buf = Vec::with_capacity(max);
        } else {
            buf.reserve(max);
        }
        let end = len.saturating_add(max).min(buf.capacity());
        if let Transport::Plain(s) = &mut self.transport {
            let (res, slice) = s.read(buf.slice_mut(len..end)).await;
            *out = slice.into_inner();
            // Plain TCP buffers nothing in user space.
            if res.is_ok() {
                self.is_plaintext_drained = true;
            }
            return res;
        }
        // The TLS reads' futures are several times the size of a plain read's: in a box of
        // their own, so that the plain path's future (moved into each limit that wraps it)
        // stays small. One allocation per TLS read, beside the record's decryption.
        Box::pin(self.read_append_secured(buf, len, end, out)).await
    }

    /// [`ConnState::read_append`] on a TLS transport, into `buf[len..end]`, left in `out`.
    async fn read_append_secured(
        &mut self,
        buf: Vec<u8>,
        len: usize,
        end: usize,
        out: &mut Vec<u8>,
    ) -> io::Result<usize> {
        #[cfg(feature = "fingerprints")]
        if let Transport::Boring(s) = &mut self.transport {
            let mut buf = buf;
            let res = poll_read_vec(s, &mut buf, len, end).await;
            *out = buf;
            return match res {
                Ok(n) => {
                    // BoringSSL may hold more decrypted bytes when the read filled the space.
                    self.is_plaintext_drained = n < end - len;
                    Ok(n)
                }
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    self.is_plaintext_drained = true;
                    Ok(0)
                }
                Err(e) => Err(e),
            };
        }
        let (res, slice) = match &mut self.transport {
            Transport::Tls(s) => s.read(buf.slice_mut(len..end)).await,
            Transport::TlsInTls(s) => s.read(buf.slice_mut(len..end)).await,
            // Read by the callers above.
            Transport::Plain(_) => (
                Err(io::ErrorKind::Unsupported.into()),
                buf.slice_mut(len..end),
            ),
            #[cfg(feature = "fingerprints")]
            Transport::Boring(_) => (
                Err(io::ErrorKind::Unsupported.into()),
                buf.slice_mut(len..end),
            ),
        };
        *out = slice.into_inner();
        match res {
            Ok(n) => {
                // rustls may hold more when the read filled what was asked.
                self.is_plaintext_drained = n < end - len;
                Ok(n)
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                self.is_plaintext_drained = true;
                Ok(0)
            }
            Err(e) => Err(e),
        }
    }

    /// Writes all of `data`.
    pub(crate) async fn write_all(&mut self, data: Bytes) -> io::Result<()> {
        self.write_all_from(data).await.0
    }

    /// [`ConnState::write_all`] that gives the buffer back, written or not, for a caller that may
    /// send it again (a request head retried on another connection). A dropped write loses it.
    pub(crate) async fn write_all_from<T>(&mut self, data: T) -> (io::Result<()>, T)
    where
        T: monoio::buf::IoBuf + AsRef<[u8]> + 'static,
    {
        if let Transport::Plain(s) = &mut self.transport {
            let (res, data) = s.write_all(data).await;
            return (res.map(drop), data);
        }
        // Boxed for the reason `read_append` gives.
        Box::pin(self.write_all_secured(data)).await
    }

    /// [`ConnState::write_all_from`] on a TLS transport, flushed.
    async fn write_all_secured<T>(&mut self, data: T) -> (io::Result<()>, T)
    where
        T: monoio::buf::IoBuf + AsRef<[u8]> + 'static,
    {
        let (res, data) = match &mut self.transport {
            Transport::Tls(s) => s.write_all(data).await,
            Transport::TlsInTls(s) => s.write_all(data).await,
            #[cfg(feature = "fingerprints")]
            Transport::Boring(s) => {
                let res = poll_write_all(s, data.as_ref()).await;
                (res.map(|()| data.as_ref().len()), data)
            }
            // Written by the caller.
            Transport::Plain(_) => (Err(io::ErrorKind::Unsupported.into()), data),
        };
        if let Err(e) = res {
            return (Err(e), data);
        }
        let flushed = match &mut self.transport {
            Transport::Plain(_) => Ok(()),
            Transport::Tls(s) => s.flush().await,
            Transport::TlsInTls(s) => s.flush().await,
            #[cfg(feature = "fingerprints")]
            Transport::Boring(s) => {
                let s = &mut **s;
                std::future::poll_fn(|cx| tokio::io::AsyncWrite::poll_flush(Pin::new(&mut *s), cx))
                    .await
            }
        };
        (flushed, data)
    }

    /// Frees the read buffer of a connection going idle: a pooled connection then costs its
    /// socket (and TLS session) only, not [`READ_BUF_BYTES`], which over a full pool would be
    /// hundreds of megabytes per core. The next read allocates a fresh one.
    pub(crate) fn release_read_buffer(&mut self) {
        self.buf = Vec::new();
    }

    /// Bytes held by the read buffer.
    #[cfg(test)]
    pub(crate) fn read_buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Checks the socket of an idle connection for a close or unasked bytes, without waiting.
    pub(crate) fn idle_state(&self) -> PeerState {
        fd::peer_state(self.fd)
    }
}

/// One read of a poll-mode stream into `buf[start..end]` (zero-filled first; safe code cannot
/// hand out uninitialised capacity); `buf` ends after the bytes read.
#[cfg(feature = "fingerprints")]
async fn poll_read_vec<S>(
    s: &mut S,
    buf: &mut Vec<u8>,
    start: usize,
    end: usize,
) -> io::Result<usize>
where
    S: tokio::io::AsyncRead + Unpin,
{
    buf.resize(end.max(start), 0);
    let res = std::future::poll_fn(|cx| {
        let mut rb = tokio::io::ReadBuf::new(buf.get_mut(start..).unwrap_or_default());
        tokio::io::AsyncRead::poll_read(Pin::new(&mut *s), cx, &mut rb)
            .map_ok(|()| rb.filled().len())
    })
    .await;
    buf.truncate(start + *res.as_ref().unwrap_or(&0));
    res
}

/// Writes all of `data` to a poll-mode stream.
#[cfg(feature = "fingerprints")]
async fn poll_write_all<S>(s: &mut S, mut data: &[u8]) -> io::Result<()>
where
    S: tokio::io::AsyncWrite + Unpin,
{
    while !data.is_empty() {
        let n = std::future::poll_fn(|cx| {
            tokio::io::AsyncWrite::poll_write(Pin::new(&mut *s), cx, data)
        })
        .await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        data = data.get(n..).unwrap_or_default();
    }
    Ok(())
}

impl AsRawFd for Conn {
    /// The TCP descriptor, open for as long as the connection lives.
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    /// A plain connection is drained after a read that fills the buffer exactly: there is no
    /// user-space layer that could hold more, and a pooled connection must not be refused
    /// (or read again) for it.
    #[test]
    fn a_plain_read_that_fills_the_buffer_leaves_nothing_behind() {
        crate::runtime::run_on(crate::runtime::Driver::detect(), async {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let client = std::net::TcpStream::connect(addr).unwrap();
            let (mut server, _) = listener.accept().unwrap();
            // From a thread: the socket buffers may not take it all before the reads start.
            let writer = std::thread::spawn(move || {
                server.write_all(&vec![7u8; 2 * READ_BUF_BYTES]).unwrap();
                server
            });
            // Wait (bounded) until a whole buffer's worth is queued, so that the read fills it.
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            let mut peek = vec![0u8; READ_BUF_BYTES];
            while client.peek(&mut peek).unwrap() < READ_BUF_BYTES {
                assert!(std::time::Instant::now() < until, "bytes not delivered");
                std::thread::yield_now();
            }
            let mut conn = Conn::plain(TcpStream::from_std(client).unwrap(), addr);
            let n = conn.read_some().await.unwrap().len();
            assert_eq!(n, READ_BUF_BYTES);
            assert!(conn.is_plaintext_drained());
            let mut rest = READ_BUF_BYTES;
            while rest > 0 {
                let n = conn.read_some().await.unwrap().len();
                assert!(n > 0, "early end");
                rest = rest.saturating_sub(n);
            }
            drop(writer.join().unwrap());
        });
    }
}

#[cfg(test)]
mod future_size {
    use super::*;

    /// The size of what `f` returns, without calling it.
    fn returned_size<'a, F, R>(_: F) -> usize
    where
        F: FnOnce(&'a mut Conn, &'a mut Vec<u8>) -> R,
    {
        std::mem::size_of::<R>()
    }

    /// The plain path's futures are moved into every limit that wraps them, per request: the
    /// TLS paths' larger state lives in a box of its own and must not come back into them
    /// (with it inline, each of these was over 1 KiB).
    #[test]
    fn plain_reads_and_writes_stay_small() {
        // `'a` names the borrow each future holds; only the closures' parameters use it.
        #[allow(clippy::extra_unused_lifetimes)]
        fn sizes<'a>() -> [(&'static str, usize); 4] {
            [
                (
                    "read_some",
                    returned_size(|c: &'a mut Conn, _| c.read_some()),
                ),
                (
                    "read_append",
                    returned_size(|c: &'a mut Conn, v| c.read_append(v, 1)),
                ),
                (
                    "write_all",
                    returned_size(|c: &'a mut Conn, _| c.write_all(Bytes::new())),
                ),
                (
                    "read_head",
                    returned_size(|c: &'a mut Conn, v| {
                        crate::egress::client::read_head(c, sortie_core::request::Method::Get, v, 1)
                    }),
                ),
            ]
        }
        for (name, size) in sizes() {
            assert!(size <= 512, "{name}: {size} bytes");
        }
    }
}
