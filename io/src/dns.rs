//! Name resolution that never blocks a hot core: lookups run on a small pool of resolver threads
//! (the system resolver, so `/etc/hosts` and `nsswitch` apply) and answers are cached per core
//! with a TTL. Concurrent lookups of the same name on one core share one resolver call.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs as _};
use std::rc::Rc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Sender, TrySendError};
use futures_channel::oneshot;

/// How long a positive answer is reused. The system resolver does not expose record TTLs.
pub const POSITIVE_TTL: Duration = Duration::from_secs(30);
/// How long a failed lookup is remembered.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(2);
/// Resolver threads of the process.
pub const RESOLVER_THREADS: usize = 4;
/// Lookups queued for the resolver threads before new ones fail fast.
pub const RESOLVER_QUEUE: usize = 4096;
/// Cached names per core; the oldest entries are dropped beyond this.
pub const CACHE_ENTRIES: usize = 10_000;

/// Why a name did not resolve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnsError {
    /// The resolver answered with no address or an error.
    #[error("name did not resolve: {0}")]
    NotFound(String),
    /// The resolver pool is saturated or gone.
    #[error("resolver unavailable")]
    Unavailable,
}

struct Job {
    host: String,
    reply: oneshot::Sender<Result<Vec<IpAddr>, DnsError>>,
}

/// The process-wide pool of resolver threads.
#[derive(Clone)]
pub struct ResolverPool {
    tx: Sender<Job>,
}

impl ResolverPool {
    /// Starts the resolver threads.
    pub fn start() -> io::Result<ResolverPool> {
        let (tx, rx) = bounded::<Job>(RESOLVER_QUEUE);
        for i in 0..RESOLVER_THREADS {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("sortie-dns-{i}"))
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        let _ = job.reply.send(lookup_blocking(&job.host));
                    }
                })?;
        }
        Ok(ResolverPool { tx })
    }

    fn submit(
        &self,
        host: &str,
    ) -> Result<oneshot::Receiver<Result<Vec<IpAddr>, DnsError>>, DnsError> {
        let (reply, rx) = oneshot::channel();
        match self.tx.try_send(Job {
            host: host.to_string(),
            reply,
        }) {
            Ok(()) => Ok(rx),
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                Err(DnsError::Unavailable)
            }
        }
    }
}

fn lookup_blocking(host: &str) -> Result<Vec<IpAddr>, DnsError> {
    match (host, 0u16).to_socket_addrs() {
        Ok(it) => {
            let mut v: Vec<IpAddr> = Vec::new();
            for a in it.map(|a: SocketAddr| a.ip()) {
                if !v.contains(&a) {
                    v.push(a);
                }
            }
            if v.is_empty() {
                Err(DnsError::NotFound("no addresses".into()))
            } else {
                Ok(v)
            }
        }
        Err(e) => Err(DnsError::NotFound(e.to_string())),
    }
}

type Waiters = Vec<oneshot::Sender<Result<Vec<IpAddr>, DnsError>>>;

enum Entry {
    Ready {
        answer: Result<Vec<IpAddr>, DnsError>,
        expires: Instant,
    },
    Pending(Waiters),
}

/// A per-core cache in front of the resolver pool. Not `Send`: each core owns one.
#[derive(Clone)]
pub struct Resolver {
    pool: ResolverPool,
    cache: Rc<RefCell<HashMap<String, Entry>>>,
}

impl Resolver {
    /// A cache for one core.
    pub fn new(pool: ResolverPool) -> Resolver {
        Resolver {
            pool,
            cache: Rc::new(RefCell::new(HashMap::new())),
        }
    }

    /// Resolves `host` (a DNS name; literals should not be passed here). The lookup itself runs
    /// in a task of its own, so a caller that gives up (deadline, cancellation) never leaves the
    /// cache entry pending for the callers after it.
    pub async fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, DnsError> {
        let now = Instant::now();
        let (tx, rx) = oneshot::channel();
        let start_lookup = {
            let mut cache = self.cache.borrow_mut();
            match cache.get_mut(host) {
                Some(Entry::Ready { answer, expires }) if *expires > now => {
                    return answer.clone();
                }
                Some(Entry::Pending(waiters)) => {
                    waiters.push(tx);
                    false
                }
                _ => {
                    if cache.len() >= CACHE_ENTRIES {
                        cache.retain(|_, e| match e {
                            Entry::Ready { expires, .. } => *expires > now,
                            Entry::Pending(_) => true,
                        });
                    }
                    cache.insert(host.to_string(), Entry::Pending(vec![tx]));
                    true
                }
            }
        };
        if start_lookup {
            let this = self.clone();
            let host = host.to_string();
            monoio::spawn(async move { this.lookup_and_publish(host).await });
        }
        rx.await.unwrap_or(Err(DnsError::Unavailable))
    }

    async fn lookup_and_publish(self, host: String) {
        let answer = match self.pool.submit(&host) {
            Ok(rx) => rx.await.unwrap_or(Err(DnsError::Unavailable)),
            Err(e) => Err(e),
        };
        let ttl = if answer.is_ok() {
            POSITIVE_TTL
        } else {
            NEGATIVE_TTL
        };
        let prev = self.cache.borrow_mut().insert(
            host,
            Entry::Ready {
                answer: answer.clone(),
                expires: Instant::now() + ttl,
            },
        );
        if let Some(Entry::Pending(waiters)) = prev {
            for w in waiters {
                let _ = w.send(answer.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_localhost_and_caches() {
        let pool = ResolverPool::start().unwrap();
        crate::runtime::run_on(crate::runtime::Driver::detect(), async move {
            let r = Resolver::new(pool);
            let a = r.resolve("localhost").await.unwrap();
            assert!(a.iter().all(|ip| ip.is_loopback()), "{a:?}");
            let r2 = r.clone();
            let other = monoio::spawn(async move { r2.resolve("localhost").await });
            assert_eq!(r.resolve("localhost").await.unwrap(), a);
            assert_eq!(other.await.unwrap(), a);
            let e = r.resolve("does-not-exist.invalid").await.unwrap_err();
            assert!(matches!(e, DnsError::NotFound(_)));
            // A caller that gives up must not leave the entry pending for the next one.
            let r3 = r.clone();
            let abandoned = monoio::spawn(async move {
                monoio::time::timeout(
                    std::time::Duration::from_nanos(1),
                    r3.resolve("localhost.localdomain"),
                )
                .await
            });
            let _ = abandoned.await;
            let _ = monoio::time::timeout(
                std::time::Duration::from_secs(10),
                r.resolve("localhost.localdomain"),
            )
            .await
            .expect("a later lookup completes");
        });
    }
}
