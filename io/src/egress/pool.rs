//! The per-core keep-alive pool: idle upstream connections by (worker, scheme, host, port,
//! source address), reused newest first, with an idle expiry and caps per key and per core.
//!
//! Per core and lock-free: the pool lives in a `RefCell` owned by one core's executor and is
//! never borrowed across an `.await`. A connection enters the pool only through [`Pool::put`],
//! which the client calls after a response was read completely with keep-alive allowed on both
//! sides; a connection held by a cancelled or failed exchange is dropped (closed) instead, so
//! the pool never holds one in an unknown state.
//!
//! Work on the request path is bounded by the per-key cap, never by the pool's size: checkout
//! looks at one key's list, and a return to a full core is refused rather than making room.
//! Expired connections and those their peer closed are closed by [`Pool::sweep`], which each
//! core runs on a timer every [`PoolLimits::sweep_interval`] (see `Egress`).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use sortie_core::destination::DestinationPolicy;
use sortie_core::request::{Host, Scheme};
use sortie_core::snapshot::ConfigId;

use super::stream::Conn;
use super::upstream_proxy::ViaKey;
use crate::fd::PeerState;

/// How long an idle connection is kept. Servers commonly close idle connections after 5 to 75
/// seconds; a connection they closed is caught by the peek on checkout.
/// `egress.pool_idle_timeout_ms` sets it per process.
pub const POOL_IDLE_TIMEOUT: Duration =
    Duration::from_millis(sortie_core::limits::DEFAULT_POOL_IDLE_TIMEOUT_MS);
/// A connection idle for less than this is reused without the peek, a system call per request
/// under load (with 64 busy connections at 50,000 requests/s a connection idles about a
/// millisecond between requests). A server that closes idle connections after this long or
/// longer (servers and balancers use 100 ms to minutes) is always caught, since a connection it
/// closed has been idle at least that long; a close it announces (`Connection: close`) needs no
/// peek. A server that closes silently sooner is caught only by the stale-connection retry of a
/// `replayable` request.
pub const POOL_PEEK_AFTER: Duration = Duration::from_millis(20);
/// Idle connections kept per key.
pub const POOL_MAX_IDLE_PER_KEY: usize = 64;
/// Idle connections kept per core, over all keys.
pub const POOL_MAX_IDLE_TOTAL: usize = 4096;
/// How often each core closes expired idle connections and those their peer closed. The sweep
/// costs one non-waiting socket check per idle connection (at most [`POOL_MAX_IDLE_TOTAL`]),
/// off the request path; a connection outlives its idle timeout by at most this long.
pub const POOL_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// The pool's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLimits {
    /// An idle connection older than this is closed instead of reused.
    pub idle_timeout: Duration,
    /// Idle connections kept per key.
    pub max_idle_per_key: usize,
    /// Idle connections kept per core.
    pub max_idle_total: usize,
    /// A connection idle for at least this long is peeked before reuse.
    pub peek_after: Duration,
    /// Period of the core's sweep timer; zero starts no timer (the owner calls
    /// `Egress::sweep_idle` itself).
    pub sweep_interval: Duration,
}

impl Default for PoolLimits {
    fn default() -> Self {
        PoolLimits {
            idle_timeout: POOL_IDLE_TIMEOUT,
            max_idle_per_key: POOL_MAX_IDLE_PER_KEY,
            max_idle_total: POOL_MAX_IDLE_TOTAL,
            peek_after: POOL_PEEK_AFTER,
            sweep_interval: POOL_SWEEP_INTERVAL,
        }
    }
}

/// What a pooled connection may be reused for: the same worker identity, destination and
/// source address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PoolKey {
    pub(crate) worker_id: ConfigId,
    pub(crate) scheme: Scheme,
    pub(crate) host: Host,
    pub(crate) port: u16,
    pub(crate) bind: Option<IpAddr>,
    /// The upstream proxy endpoint and username, for connections through one.
    pub(crate) via: Option<ViaKey>,
    /// The browser profile of fingerprinted connections: never shared with ordinary ones.
    pub(crate) profile: Option<&'static str>,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

#[derive(Default)]
struct Inner {
    /// Per key, oldest first: reuse pops the newest from the back.
    by_key: sortie_core::FastMap<PoolKey, VecDeque<Idle>>,
    /// Sum of the list lengths.
    total: usize,
}

/// The idle connections of one core.
pub(crate) struct Pool {
    limits: PoolLimits,
    inner: RefCell<Inner>,
}

impl Pool {
    pub(crate) fn new(limits: PoolLimits) -> Pool {
        Pool {
            limits,
            inner: RefCell::new(Inner::default()),
        }
    }

    /// Takes the newest healthy idle connection for `key`. Connections that expired, that the
    /// peer closed or wrote to (seen by a peek once idle for [`PoolLimits::peek_after`]), or
    /// whose address the current policy no longer allows are closed on the way.
    pub(crate) fn checkout(
        &self,
        key: &PoolKey,
        policy: &DestinationPolicy,
        now: Instant,
    ) -> Option<Conn> {
        let mut inner = self.inner.borrow_mut();
        let Inner { by_key, total } = &mut *inner;
        let list = by_key.get_mut(key)?;
        let before = list.len();
        let mut found = None;
        while let Some(entry) = list.pop_back() {
            // One clock difference per entry, for both questions asked of it.
            let idle_for = now.saturating_duration_since(entry.since);
            if idle_for >= self.limits.idle_timeout {
                // Everything older is expired too: the list is ordered oldest first.
                list.clear();
                break;
            }
            // The policy of the request at hand applies, not the one the connection was
            // opened under: a new snapshot may have closed the address since.
            if entry.conn.policy_ip().is_some_and(|ip| !policy.allows(ip)) {
                continue;
            }
            if idle_for < self.limits.peek_after || entry.conn.idle_state() == PeerState::Quiet {
                found = Some(entry.conn);
                break;
            }
        }
        *total = total.saturating_sub(before - list.len());
        // An emptied list stays for the connection that comes back to it (the sweep removes
        // lists that stay empty): no key copied, no list made again, on the request path.
        found
    }

    /// Returns a connection whose exchange ended cleanly. A key at its cap closes its oldest
    /// connection to keep this one; a core at its cap closes this one (making room would mean
    /// looking through the whole pool on the request path; the sweep timer makes room instead).
    /// Returns whether it was kept.
    /// The key is copied only for a key the pool has no list for.
    pub(crate) fn put(&self, key: &PoolKey, mut conn: Conn, now: Instant) -> bool {
        if self.limits.max_idle_per_key == 0 || self.limits.max_idle_total == 0 {
            return false;
        }
        let mut inner = self.inner.borrow_mut();
        let Inner { by_key, total } = &mut *inner;
        let is_core_full = *total >= self.limits.max_idle_total;
        if let Some(list) = by_key.get_mut(key) {
            if list.len() >= self.limits.max_idle_per_key {
                // Keep the newest: close the oldest of this key; the total stays.
                list.pop_front();
            } else if is_core_full {
                return false;
            } else {
                *total += 1;
            }
            conn.release_read_buffer();
            list.push_back(Idle { conn, since: now });
            return true;
        }
        if is_core_full {
            return false;
        }
        *total += 1;
        conn.release_read_buffer();
        by_key
            .entry(key.clone())
            .or_default()
            .push_back(Idle { conn, since: now });
        true
    }

    /// Closes expired connections and those the peer closed or wrote to; returns how many were
    /// closed.
    pub(crate) fn sweep(&self, now: Instant) -> usize {
        let mut closed = 0;
        let mut inner = self.inner.borrow_mut();
        let Inner { by_key, total } = &mut *inner;
        by_key.retain(|_, list| {
            let before = list.len();
            list.retain(|e| {
                !is_expired(&self.limits, e, now) && e.conn.idle_state() == PeerState::Quiet
            });
            closed += before - list.len();
            !list.is_empty()
        });
        *total = total.saturating_sub(closed);
        closed
    }

    /// Idle connections held.
    pub(crate) fn len(&self) -> usize {
        self.inner.borrow().total
    }
}

fn is_expired(limits: &PoolLimits, entry: &Idle, now: Instant) -> bool {
    now.saturating_duration_since(entry.since) >= limits.idle_timeout
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::net::{SocketAddr, TcpListener};

    use crate::runtime::{run_on, Driver};

    /// A pooled connection to a loopback listener, with the server side kept by the caller.
    fn conn(listener: &TcpListener) -> (Conn, std::net::TcpStream) {
        let addr = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(addr).unwrap();
        let (server, _) = listener.accept().unwrap();
        if monoio::utils::is_legacy() {
            client.set_nonblocking(true).unwrap();
        }
        let stream = monoio::net::TcpStream::from_std(client).unwrap();
        (Conn::plain(stream, addr), server)
    }

    fn key(worker: &str) -> PoolKey {
        PoolKey {
            worker_id: ConfigId::parse(worker).unwrap(),
            scheme: Scheme::Http,
            host: Host::V4("127.0.0.1".parse().unwrap()),
            port: 80,
            bind: None,
            via: None,
            profile: None,
        }
    }

    fn loopback_policy() -> DestinationPolicy {
        DestinationPolicy::new(vec!["127.0.0.0/8".parse().unwrap()], vec![])
    }

    /// Waits (bounded) until the peer's close or bytes are visible to a peek.
    fn settle(c: &Conn) {
        let until = Instant::now() + Duration::from_secs(5);
        while c.idle_state() == PeerState::Quiet && Instant::now() < until {
            std::thread::yield_now();
        }
    }

    #[test]
    fn reuse_is_newest_first_per_key_and_checks_health() {
        run_on(Driver::detect(), async {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let pool = Pool::new(PoolLimits::default());
            let policy = loopback_policy();
            let now = Instant::now();
            let (a, _sa) = conn(&l);
            let (b, _sb) = conn(&l);
            let (c, mut sc) = conn(&l);
            let (b_local, c_local): (SocketAddr, SocketAddr) = (monoio_local(&b), monoio_local(&c));
            assert!(pool.put(&key("w1"), a, now));
            assert!(pool.put(&key("w1"), b, now));
            assert!(pool.put(&key("w2"), c, now));
            assert_eq!(pool.len(), 3);
            // Another worker's connections are not shared.
            assert!(pool.checkout(&key("w3"), &policy, now).is_none());
            let got = pool.checkout(&key("w1"), &policy, now).unwrap();
            assert_eq!(monoio_local(&got), b_local);
            assert_eq!(pool.len(), 2);
            // A connection the peer wrote to is out of step and closed on checkout, once it has
            // been idle long enough to be peeked at.
            sc.write_all(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
            let c = pool.inner.borrow();
            let entry = c.by_key.get(&key("w2")).and_then(|l| l.back()).unwrap();
            assert_eq!(monoio_local(&entry.conn), c_local);
            settle(&entry.conn);
            drop(c);
            let peeked = now + POOL_PEEK_AFTER;
            assert!(pool.checkout(&key("w2"), &policy, peeked).is_none());
            assert_eq!(pool.len(), 1);
        });
    }

    /// Under load a connection comes back and goes out again within microseconds; the peek, a
    /// system call, is kept for connections idle long enough for a server to have closed them.
    #[test]
    fn a_connection_just_returned_is_reused_without_the_peek() {
        run_on(Driver::detect(), async {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let pool = Pool::new(PoolLimits::default());
            let policy = loopback_policy();
            let now = Instant::now();
            let (mut a, mut sa) = conn(&l);
            sa.write_all(b"x").unwrap();
            settle(&a);
            // The read buffer goes away while the connection idles.
            a.read_some().await.unwrap();
            assert!(a.read_buffer_capacity() > 0);
            sa.write_all(b"y").unwrap();
            settle(&a);
            assert!(pool.put(&key("w1"), a, now));
            let just_after = now + POOL_PEEK_AFTER / 2;
            let a = pool.checkout(&key("w1"), &policy, just_after).unwrap();
            assert_eq!(a.read_buffer_capacity(), 0);
        });
    }

    fn monoio_local(c: &Conn) -> SocketAddr {
        crate::fd::local_addr(c).unwrap()
    }

    #[test]
    fn expiry_policy_and_caps() {
        run_on(Driver::detect(), async {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let limits = PoolLimits {
                idle_timeout: Duration::from_secs(10),
                max_idle_per_key: 2,
                max_idle_total: 3,
                peek_after: POOL_PEEK_AFTER,
                sweep_interval: Duration::ZERO,
            };
            let pool = Pool::new(limits);
            let policy = loopback_policy();
            let t0 = Instant::now();
            let mut servers = Vec::new();
            for worker in ["a", "a", "a", "b", "c"] {
                let (c, s) = conn(&l);
                servers.push(s);
                pool.put(&key(worker), c, t0);
            }
            // Per key 2 ("a" dropped its oldest), per core 3 ("c" refused).
            assert_eq!(pool.len(), 3);
            assert!(pool.checkout(&key("c"), &policy, t0).is_none());
            // A policy without the loopback allowance refuses the pooled address.
            let strict = DestinationPolicy::default();
            assert!(pool.checkout(&key("b"), &strict, t0).is_none());
            assert_eq!(pool.len(), 2);
            // Expired on checkout, and swept.
            let later = t0 + Duration::from_secs(11);
            assert!(pool.checkout(&key("a"), &policy, later).is_none());
            assert_eq!(pool.len(), 0);
            let (c, _s) = conn(&l);
            pool.put(&key("a"), c, t0);
            assert_eq!(pool.sweep(t0 + Duration::from_secs(1)), 0);
            assert_eq!(pool.sweep(later), 1);
            assert_eq!(pool.len(), 0);
            // A peer that closed is swept too.
            let (c, s) = conn(&l);
            drop(s);
            settle(&c);
            pool.put(&key("a"), c, t0);
            assert_eq!(pool.sweep(t0), 1);
        });
    }

    /// Returning a connection to a full core costs the same whatever the pool holds: the
    /// connection is closed, and dead ones in the pool wait for the sweep timer.
    #[test]
    fn a_full_core_refuses_without_sweeping() {
        run_on(Driver::detect(), async {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let limits = PoolLimits {
                max_idle_total: 2,
                max_idle_per_key: 1,
                ..PoolLimits::default()
            };
            let pool = Pool::new(limits);
            let t0 = Instant::now();
            for worker in ["a", "b"] {
                let (c, s) = conn(&l);
                drop(s);
                settle(&c);
                assert!(pool.put(&key(worker), c, t0));
            }
            let (c, _s) = conn(&l);
            assert!(!pool.put(&key("c"), c, t0));
            assert_eq!(pool.len(), 2);
            // A key at its own cap still trades its oldest for the newest.
            let (c, _t) = conn(&l);
            assert!(pool.put(&key("a"), c, t0 + Duration::from_millis(1)));
            assert_eq!(pool.len(), 2);
            assert_eq!(pool.sweep(t0), 1);
        });
    }
}
