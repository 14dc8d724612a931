//! Resolving the destination and opening a TCP connection to it: every resolved address is
//! checked against the destination policy right before it is dialled (DNS-rebinding safe,
//! decision 003), optionally from a configured source address, with a per-attempt limit that never
//! runs past the request's total deadline.
//!
//! On the per-request path: DNS runs on the resolver thread, never on the core.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use monoio::net::TcpStream;
use socket2::{Domain, Protocol, Socket, Type};
use sortie_core::destination::DestinationPolicy;
use sortie_core::error::ApiError;
use sortie_core::request::Host;

use super::error::{self, Expired, Stage};
use crate::dns::{Resolver, Tenant};
use crate::fd;

/// The addresses a host stands for: an IP literal as it is, a name through the resolver (whose
/// lookups survive a caller that gives up at its deadline).
pub(crate) async fn resolve(
    resolver: &Resolver,
    host: &Host,
    deadline: Instant,
    tenant: Tenant,
) -> Result<Vec<IpAddr>, ApiError> {
    let name = match host {
        Host::V4(a) => return Ok(vec![IpAddr::V4(*a)]),
        Host::V6(a) => return Ok(vec![IpAddr::V6(*a)]),
        Host::Domain(d) => d.clone(),
    };
    match within(deadline, resolver.resolve(&name, tenant)).await {
        Some(Ok(addrs)) => Ok(addrs),
        Some(Err(e)) => Err(error::dns_failure(&e)),
        None => Err(error::timeout(Expired::TotalDeadline, Stage::Dns)),
    }
}

/// Connects to the first address that the policy allows and that accepts, in the resolver's
/// order. A refusal, an unreachable network or a per-attempt timeout moves on to the next
/// address; the error of the last attempt is returned when none succeeds.
pub(crate) async fn connect_any(
    addrs: &[IpAddr],
    port: u16,
    bind: Option<IpAddr>,
    policy: &DestinationPolicy,
    attempt_limit: Duration,
    deadline: Instant,
) -> Result<(TcpStream, SocketAddr), ApiError> {
    let mut last_error = None;
    let mut denied = None;
    for &ip in addrs {
        // Decision 003: the check is made on the resolved address that is actually connected to.
        if let Err(d) = policy.check(ip) {
            tracing::debug!(reason = d.reason(), %d, "egress address denied");
            denied.get_or_insert(d);
            continue;
        }
        if bind.is_some_and(|b| b.is_ipv4() != ip.is_ipv4()) {
            // The source address cannot reach this family; another address may match it.
            last_error.get_or_insert_with(|| {
                error::internal(
                    "the egress source address has no destination address of its family",
                )
            });
            continue;
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(error::timeout(Expired::TotalDeadline, Stage::Connect));
        }
        let attempt_end = now.checked_add(attempt_limit).unwrap_or(deadline);
        let (limit, expired) = if attempt_end < deadline {
            (attempt_end, Expired::ConnectAttempt)
        } else {
            (deadline, Expired::TotalDeadline)
        };
        let peer = SocketAddr::new(ip, port);
        match within(limit, connect_one(peer, bind)).await {
            Some(Ok(stream)) => return Ok((stream, peer)),
            Some(Err(e)) => {
                let e = error::connect_failure(&e);
                if e.code == sortie_core::error::ErrorCode::ExecutorInternalError {
                    // A local failure does not depend on the destination address.
                    return Err(e);
                }
                last_error = Some(e);
            }
            None if expired == Expired::TotalDeadline => {
                return Err(error::timeout(expired, Stage::Connect))
            }
            None => last_error = Some(error::timeout(expired, Stage::Connect)),
        }
    }
    match (last_error, denied) {
        (Some(e), _) => Err(e),
        (None, Some(d)) => Err(ApiError::from(d)),
        (None, None) => Err(error::dns_failure(&crate::dns::DnsError::NotFound(
            "no addresses".into(),
        ))),
    }
}

/// Opens one TCP connection. Without a source address the runtime connects: on io_uring a
/// socket and one `connect` operation, without the `fcntl` calls that switch a socket to
/// non-blocking and back and without reading `SO_ERROR` (every tunnel and every new upstream
/// connection pays these). With a source address: socket, bind to it (port 0), a non-blocking
/// connect, then the runtime waits until the socket is writable and `SO_ERROR` says how the
/// connect ended.
async fn connect_one(peer: SocketAddr, bind: Option<IpAddr>) -> io::Result<TcpStream> {
    let Some(source) = bind else {
        let stream = TcpStream::connect_addr(peer).await?;
        stream.set_nodelay(true)?;
        return Ok(stream);
    };
    let socket = Socket::new(Domain::for_address(peer), Type::STREAM, Some(Protocol::TCP))?;
    socket.bind(&SocketAddr::new(source, 0).into())?;
    socket.set_nonblocking(true)?;
    socket.set_nodelay(true)?;
    match socket.connect(&peer.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    let stream = TcpStream::from_std(std::net::TcpStream::from(socket))?;
    // Not relaxed: the epoll driver's cached readiness may be stale for a fresh descriptor, and
    // a connect that has not finished must not be taken for one that has.
    stream.writable(false).await?;
    if let Some(e) = fd::take_error(&stream)? {
        return Err(e);
    }
    if !monoio::utils::is_legacy() {
        fd::set_blocking(&stream)?;
    }
    Ok(stream)
}

/// Runs `fut` until `limit`; `None` when the limit came first (the future is dropped).
///
/// A plain function returning a combinator, not an `async fn`: an `async fn` would keep `fut`
/// twice in its state (as its argument and inside the combinator). The timer is a coarse one
/// of the core ([`crate::timer`]): the stage limits of an exchange are seconds, and almost
/// none of them expires.
#[inline(always)]
pub(crate) fn within<F: std::future::Future>(limit: Instant, fut: F) -> crate::timer::Within<F> {
    crate::timer::within(limit, fut)
}
