//! The `monoio-http` variant: the `http` variant's work (both heads parsed with httparse, the
//! request rewritten to origin form, the response relayed in one send once complete) written as
//! the gateway is written: one monoio task per client connection on the gateway's runtime and
//! ring setup, awaiting owned-buffer reads and writes. What this row costs beyond the `http` row
//! is the runtime's (tasks, wakers, the op slab, the driver); what the gateway costs beyond this
//! row is the gateway's own.
//!
//! `MONOIO_FORCE_LEGACY_DRIVER` in the environment runs it on the epoll driver instead (for
//! valgrind, which cannot run io_uring).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use monoio::buf::{IoBufMut, SliceMut};
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};

use crate::decisions::Decisions;

/// What each client connection's task does.
pub(crate) enum Work {
    /// `monoio-http`: relay, parsing only what framing needs.
    Relay,
    /// `monoio-decisions`: relay with the forward proxy's decisions.
    Decisions(Arc<Decisions>),
    /// `monoio-api`: answer request API calls with the request API's decisions.
    Api(Arc<Decisions>),
}

/// Runs the relay on this thread until the process is killed.
pub(crate) fn run(listen: &str, upstream: &str, read_bytes: usize, work: Work) -> io::Result<()> {
    let listen: SocketAddr = listen.parse().map_err(io::Error::other)?;
    let upstream: SocketAddr = upstream.parse().map_err(io::Error::other)?;
    let serve = async move {
        let listener = TcpListener::bind(listen).expect("bind the relay's address");
        loop {
            let Ok((client, _)) = listener.accept().await else {
                continue;
            };
            match &work {
                Work::Relay => monoio::spawn(async move {
                    let _ = relay(client, upstream, read_bytes).await;
                }),
                Work::Decisions(d) => {
                    let d = Arc::clone(d);
                    monoio::spawn(async move {
                        let _ = crate::decisions::relay(d, client, upstream, read_bytes).await;
                    })
                }
                Work::Api(d) => {
                    let d = Arc::clone(d);
                    monoio::spawn(async move {
                        let _ = crate::decisions::api_relay(d, client, upstream, read_bytes).await;
                    })
                }
            };
        }
    };
    if std::env::var_os("MONOIO_FORCE_LEGACY_DRIVER").is_some() {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()?
            .block_on(serve);
    } else {
        let mut ring = io_uring::IoUring::builder();
        ring.setup_coop_taskrun();
        monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
            .with_entries(crate::RING_ENTRIES)
            .uring_builder(ring)
            .enable_timer()
            .build()?
            .block_on(serve);
    }
    Ok(())
}

/// Reads into `buf`'s spare capacity (growing it to `read_bytes` free first); `Ok(0)` at end.
pub(crate) async fn read_more(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    read_bytes: usize,
) -> io::Result<usize> {
    buf.reserve(read_bytes);
    let len = buf.len();
    let cap = buf.capacity();
    let spare: SliceMut<Vec<u8>> = std::mem::take(buf).slice_mut(len..cap);
    let (res, spare) = stream.read(spare).await;
    *buf = spare.into_inner();
    res
}

/// One client connection: its own upstream connection, requests relayed one at a time.
async fn relay(mut client: TcpStream, upstream: SocketAddr, read_bytes: usize) -> io::Result<()> {
    client.set_nodelay(true)?;
    let mut up = TcpStream::connect(upstream).await?;
    up.set_nodelay(true)?;
    let mut req: Vec<u8> = Vec::with_capacity(read_bytes);
    let mut resp: Vec<u8> = Vec::with_capacity(read_bytes);
    let mut out: Vec<u8> = Vec::with_capacity(4096);
    loop {
        // A complete request head, rewritten into `out`.
        out.clear();
        let len = loop {
            if let Some(len) = crate::rewrite_request(&req, &mut out) {
                break len;
            }
            out.clear();
            if read_more(&mut client, &mut req, read_bytes).await? == 0 {
                return Ok(());
            }
        };
        req.drain(..len);
        let (res, back) = up.write_all(out).await;
        out = back;
        res?;
        // The whole response (head and `Content-Length` body), then one send.
        resp.clear();
        let total = loop {
            if let Some(total) = crate::parsed_response_length(&resp) {
                break total;
            }
            if read_more(&mut up, &mut resp, read_bytes).await? == 0 {
                return Ok(());
            }
        };
        while resp.len() < total {
            if read_more(&mut up, &mut resp, read_bytes).await? == 0 {
                return Ok(());
            }
        }
        let (res, back) = client.write_all(resp).await;
        resp = back;
        res?;
    }
}
