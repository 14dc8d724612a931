//! Moving a CONNECT tunnel's bytes (decisions 022 and 024).
//!
//! Each direction starts as a copy loop of io_uring reads and writes through a buffer that
//! grows from 16 to 64 KiB while reads fill it: small exchanges cost two operations each and
//! no extra system call. A direction whose read fills the largest buffer carries bulk data and
//! switches to `splice` (socket → pipe → socket): the kernel hands page references along and
//! the core never touches the bytes (`crate::splice`). Splices never wait (the sockets are
//! switched to non-blocking); readiness comes from the runtime (an io_uring poll, or epoll) on
//! duplicates of the descriptors, so a quiet tunnel costs no thread.
//!
//! A tunnel through an `https://` upstream proxy carries its bytes inside TLS to that proxy:
//! both directions copy through the TLS session, never splice.
//!
//! On the per-tunnel path: no locks; a failed switch is logged at debug and the direction
//! keeps copying.

use std::cell::Cell;
use std::io;
use std::os::fd::{AsRawFd as _, RawFd};

use monoio::io::{
    AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt as _, OwnedWriteHalf, Splitable as _,
};
use monoio::net::TcpStream;

use crate::bus::conn::Conn as BusConn;
use crate::egress::TunnelStream;
use crate::fd;
use crate::splice::{self, PooledPipe};

/// Bytes the first read of a tunnel direction asks for.
const TUNNEL_BUFFER_BYTES: usize = 16 * 1024;
/// The most one read of a tunnel direction asks for; a read that fills it switches the
/// direction to splicing.
const MAX_TUNNEL_BUFFER_BYTES: usize = 64 * 1024;

/// Bytes that arrived before the relay started.
pub(super) struct Early {
    /// What the client sent behind its CONNECT head.
    pub(super) up: Vec<u8>,
    /// What the destination sent behind an upstream proxy's reply (a destination that speaks
    /// first).
    pub(super) down: Vec<u8>,
}

/// Relays a tunnel until both directions ended: first the `early` bytes of each direction,
/// then client → upstream counted in `up_bytes` and upstream → client in `down_bytes`,
/// concurrently. The end (or failure) of one direction shuts down the sending side of the
/// other socket (the half-close); an error of either direction fails the relay once both have
/// stopped.
pub(super) async fn relay(
    client: TcpStream,
    upstream: TunnelStream,
    early: Early,
    up_bytes: &Cell<u64>,
    down_bytes: &Cell<u64>,
) -> io::Result<()> {
    match upstream {
        TunnelStream::Tcp(upstream) => {
            relay_tcp(client, upstream, early, up_bytes, down_bytes).await
        }
        tls @ TunnelStream::Tls(_) => relay_tls(client, tls, early, up_bytes, down_bytes).await,
    }
}

/// [`relay`] to a TCP destination: copies, then splices bulk directions.
///
/// The direction that ends first half-closes the socket it wrote to; the one that ends second
/// does not: both sockets are closed right after it, and the close sends the end itself (one
/// `shutdown` call per tunnel instead of two). A relay dropped half-way (shutdown of the
/// gateway, an operator's cancel) drops the halves, which half-close both sockets as before.
async fn relay_tcp(
    client: TcpStream,
    upstream: TcpStream,
    early: Early,
    up_bytes: &Cell<u64>,
    down_bytes: &Cell<u64>,
) -> io::Result<()> {
    let (client_fd, upstream_fd) = (client.as_raw_fd(), upstream.as_raw_fd());
    let (mut client_read, mut client_write) = client.into_split();
    let (mut up_read, mut up_write) = upstream.into_split();
    let has_ended = Cell::new(false);
    let upload = one_way(
        &mut client_read,
        &mut up_write,
        early.up,
        (client_fd, upstream_fd),
        up_bytes,
        &has_ended,
    );
    let download = one_way(
        &mut up_read,
        &mut client_write,
        early.down,
        (upstream_fd, client_fd),
        down_bytes,
        &has_ended,
    );
    let (u, d) = monoio::join!(upload, download);
    // Put back together, the halves close their socket without the half-close a write
    // half's drop makes.
    drop(client_read.reunite(client_write));
    drop(up_read.reunite(up_write));
    u.and(d)
}

/// One direction of a TCP tunnel: `early`, then [`direction`] from `from` to `to`. At the
/// end, whether the direction ended or failed, the first of the two directions to stop shuts
/// `to`'s socket down for writing (the half-close): the other side then sees the end instead
/// of waiting. `has_ended` tells the two directions apart.
async fn one_way<R: AsyncReadRent>(
    from: &mut R,
    to: &mut OwnedWriteHalf<TcpStream>,
    early: Vec<u8>,
    fds: (RawFd, RawFd),
    counter: &Cell<u64>,
    has_ended: &Cell<bool>,
) -> io::Result<()> {
    let r = async {
        write_early(to, early, counter).await?;
        direction(from, to, Some(fds), counter).await
    }
    .await;
    if !has_ended.replace(true) {
        // The peer may be gone already; its close is the end either way.
        let _ = fd::shutdown_write(&fds.1);
    }
    r
}

/// [`relay`] through TLS to an `https://` upstream proxy: the tunnel's bytes are the TLS
/// session's plaintext, so both directions copy. The session is driven by hand with the socket
/// split in two (as a bus connection is, `crate::bus::conn`): a record the proxy garbles fails
/// the download alone. The client's half-close ends the session's sending side
/// (`close_notify`, then the TCP half-close); the proxy's close, with or without
/// `close_notify`, ends the download and half-closes the client.
async fn relay_tls(
    client: TcpStream,
    upstream: TunnelStream,
    early: Early,
    up_bytes: &Cell<u64>,
    down_bytes: &Cell<u64>,
) -> io::Result<()> {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut tls_read, mut tls_write) = BusConn::tunnel(upstream).split();
    let upload = async {
        let r = async {
            if !early.up.is_empty() {
                up_bytes.set(early.up.len() as u64);
                let (r, _) = tls_write.write_all(early.up).await;
                r?;
            }
            let mut buf = Vec::with_capacity(TUNNEL_BUFFER_BYTES);
            loop {
                let (res, back) = client_read.read(buf).await;
                buf = back;
                let n = res?;
                if n == 0 {
                    return Ok(());
                }
                up_bytes.set(up_bytes.get().saturating_add(n as u64));
                let (res, back) = tls_write.write_all(buf).await;
                buf = back;
                res?;
                buf.clear();
            }
        }
        .await;
        // The proxy may have closed its connection already (it ended the tunnel first).
        let closed = match tls_write.close_write().await {
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            other => other,
        };
        r.and(closed)
    };
    let download = async {
        let r = async {
            write_early(&mut client_write, early.down, down_bytes).await?;
            let mut plain = Vec::with_capacity(TUNNEL_BUFFER_BYTES);
            loop {
                plain.clear();
                let n = tls_read.read(&mut plain).await?;
                if n == 0 {
                    return Ok(());
                }
                down_bytes.set(down_bytes.get().saturating_add(n as u64));
                let (res, back) = client_write.write_all(plain).await;
                plain = back;
                res?;
            }
        }
        .await;
        drop(client_write);
        r
    };
    let (u, d) = monoio::join!(upload, download);
    u.and(d)
}

/// Writes the bytes the client sent behind its CONNECT head, counting them in `counter`.
async fn write_early<W: AsyncWriteRent>(
    to: &mut W,
    early: Vec<u8>,
    counter: &Cell<u64>,
) -> io::Result<()> {
    if early.is_empty() {
        return Ok(());
    }
    counter.set(early.len() as u64);
    let (res, _) = to.write_all(early).await;
    res.map(drop)
}

/// One direction of a tunnel, `from` → `to`, until `from` ends; the caller then half-closes
/// `to`. Counts the bytes in `counter`. Copies while pieces are small; with the descriptors of
/// two sockets in `splice_fds`, splices once a read fills [`MAX_TUNNEL_BUFFER_BYTES`].
async fn direction<R: AsyncReadRent, W: AsyncWriteRent>(
    from: &mut R,
    to: &mut W,
    splice_fds: Option<(RawFd, RawFd)>,
    counter: &Cell<u64>,
) -> io::Result<()> {
    let mut buf = Vec::with_capacity(TUNNEL_BUFFER_BYTES);
    let mut may_splice = splice_fds.is_some();
    loop {
        let (res, back) = from.read(buf).await;
        buf = back;
        let n = res?;
        if n == 0 {
            return Ok(());
        }
        counter.set(counter.get().saturating_add(n as u64));
        let is_full = n == buf.capacity();
        let (res, back) = to.write_all(buf).await;
        res?;
        buf = back;
        buf.clear();
        if !is_full {
            continue;
        }
        if buf.capacity() < MAX_TUNNEL_BUFFER_BYTES {
            buf.reserve_exact(
                buf.capacity()
                    .saturating_mul(2)
                    .min(MAX_TUNNEL_BUFFER_BYTES),
            );
        } else if let (true, Some(fds)) = (may_splice, splice_fds) {
            match Spliced::prepare(fds) {
                Ok(spliced) => {
                    drop(buf);
                    // `from` and `to` stay alive (and the descriptors open) until it ends.
                    return spliced.pump(counter).await;
                }
                Err(e) => {
                    tracing::debug!(
                        target: "sortie::proxy",
                        error = %e,
                        "tunnel direction cannot splice: copying"
                    );
                    may_splice = false;
                }
            }
        }
    }
}

/// A tunnel direction ready to splice: a pipe, and duplicates of its two descriptors (to wait
/// for readiness on while the halves of the original streams keep them open), switched to
/// non-blocking.
struct Spliced {
    from: TcpStream,
    to: TcpStream,
    pipe: PooledPipe,
}

impl Spliced {
    fn prepare((from, to): (RawFd, RawFd)) -> io::Result<Spliced> {
        let pipe = PooledPipe::take()?;
        let from = fd::duplicate_stream(from)?;
        let to = fd::duplicate_stream(to)?;
        // The flag belongs to the socket's open file, shared with the original descriptor:
        // io_uring operations of the other direction still wait through their own poll.
        fd::set_nonblocking(&from)?;
        fd::set_nonblocking(&to)?;
        Ok(Spliced { from, to, pipe })
    }

    /// Splices until `from` ends (entered after a read that filled the buffer: more is likely
    /// queued). No limit of its own: the tunnel's idle watch ends a quiet tunnel.
    async fn pump(mut self, counter: &Cell<u64>) -> io::Result<()> {
        splice::pump(
            &self.from,
            &self.to,
            &mut self.pipe,
            None,
            || None,
            None,
            counter,
            &mut || {},
        )
        .await
        .map_err(io::Error::from)
    }
}
