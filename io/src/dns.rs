//! Name resolution that never blocks a hot core: one resolver thread runs an asynchronous stub
//! resolver (hickory, on a tokio current-thread runtime, configured from `/etc/resolv.conf` and
//! `/etc/hosts`), and each core keeps a bounded cache of answers for their record TTL
//! (decision 045).
//!
//! Bounds: each core caches at most [`CACHE_ENTRIES`] answers, the least recently used evicted
//! in O(1), and looks up at most [`MAX_PENDING_PER_CORE`] names at once. Concurrent lookups of
//! one name share one query, on one core (one pending entry) and across cores (the pool keeps
//! the names in flight). A positive answer is reused for its TTL clamped to
//! [`MIN_TTL`]..=[`MAX_TTL`]; a failed lookup is remembered for [`NEGATIVE_TTL`]. The resolver
//! thread runs at most [`DnsLimits::in_flight`] lookups at once, taken round robin over the
//! deployments with names waiting, and one deployment never runs more than
//! [`DnsLimits::in_flight_per_tenant`] of them: slow names of one deployment cannot stall the
//! others'.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_channel::oneshot;
use hashlink::LruCache;
use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::TokioResolver;

/// The shortest time a positive answer is reused, whatever its TTL says (a TTL of 0 would
/// otherwise send one query per request).
pub const MIN_TTL: Duration = Duration::from_secs(1);
/// The longest time a positive answer is reused, whatever its TTL says: a changed record is
/// seen within this.
pub const MAX_TTL: Duration = Duration::from_secs(300);
/// How long a failed lookup (no such name, no address, no answer in time) is remembered.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(2);
/// Cached answers per core; the least recently used is evicted beyond this.
pub const CACHE_ENTRIES: usize = 10_000;
/// Names being looked up at once per core; a lookup of one more fails fast as unavailable.
pub const MAX_PENDING_PER_CORE: usize = 1024;

/// Why a name did not resolve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnsError {
    /// The resolver answered with no address or an error, or no server answered in time.
    #[error("name did not resolve: {0}")]
    NotFound(String),
    /// The resolver is saturated (for everyone or for this deployment) or gone.
    #[error("resolver unavailable")]
    Unavailable,
}

type Answer = Result<Vec<IpAddr>, DnsError>;

/// An answer with the time it may be reused until.
#[derive(Debug, Clone)]
struct Fresh {
    answer: Answer,
    expires: Instant,
}

type Reply = oneshot::Sender<Fresh>;

/// Whose lookup it is: the index of the deployment the request runs for, `None` for lookups
/// made for nobody in particular (they share one queue).
pub type Tenant = Option<usize>;

/// The tenant of a deployment known by its id only (a remote worker's assignment names the
/// deployment, not the control's index of it). Two ids may share a tenant, which only merges
/// their fair shares; ids are the operator's, not a client's. A fixed-seed foldhash: the same
/// id gives the same tenant for the process's life, at a fraction of SipHash's cost (this runs
/// for every assignment).
pub fn tenant_of_id(deployment_id: &str) -> Tenant {
    use std::hash::BuildHasher as _;
    Some(foldhash::fast::FixedState::default().hash_one(deployment_id) as usize)
}

/// How much of the resolver one process and one deployment may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DnsLimits {
    /// Lookups running at once, all deployments together.
    pub in_flight: usize,
    /// Lookups of one deployment running at once.
    pub in_flight_per_tenant: usize,
    /// Lookups waiting for a slot, all deployments together; one more fails fast.
    pub queued: usize,
    /// Lookups of one deployment waiting for a slot; one more fails fast.
    pub queued_per_tenant: usize,
}

impl Default for DnsLimits {
    /// 256 lookups at once, a quarter of them for one deployment at most.
    fn default() -> DnsLimits {
        DnsLimits {
            in_flight: 256,
            in_flight_per_tenant: 64,
            queued: 4096,
            queued_per_tenant: 256,
        }
    }
}

/// Where the resolver thread sends its queries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsSetup {
    /// `None`: the system's configuration (`/etc/resolv.conf`, `/etc/hosts`). Otherwise these
    /// servers over UDP (and TCP for truncated answers), without the hosts file.
    pub servers: Option<Vec<SocketAddr>>,
    /// The time one query to one server may take, when `servers` is given (the system
    /// configuration's own `timeout` option applies otherwise).
    pub query_timeout: Duration,
    /// The resolver's bounds.
    pub limits: DnsLimits,
}

impl Default for DnsSetup {
    fn default() -> DnsSetup {
        DnsSetup {
            servers: None,
            query_timeout: Duration::from_secs(5),
            limits: DnsLimits::default(),
        }
    }
}

/// The resolver thread's shared state: names waiting per tenant, served round robin over the
/// tenants with work, and the replies waiting for each name in flight (queued or running), so
/// that every core missing the same name shares one lookup. Locked on a cache miss and when a
/// lookup starts or ends, never on a cache hit.
struct PoolState {
    limits: DnsLimits,
    /// Replies per name queued or being looked up.
    waiting: HashMap<String, Vec<Reply>>,
    queues: HashMap<Tenant, VecDeque<String>>,
    /// Tenants with queued names, in round-robin order.
    turn: VecDeque<Tenant>,
    running: HashMap<Tenant, usize>,
    running_total: usize,
    queued: usize,
    is_closed: bool,
}

impl PoolState {
    fn new(limits: DnsLimits) -> PoolState {
        PoolState {
            limits,
            waiting: HashMap::new(),
            queues: HashMap::new(),
            turn: VecDeque::new(),
            running: HashMap::new(),
            running_total: 0,
            queued: 0,
            is_closed: false,
        }
    }
}

struct Shared {
    state: Mutex<PoolState>,
    /// Wakes the resolver thread: a name was queued, a lookup ended, or the pool closed.
    wake: tokio::sync::Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Stops the resolver thread when the last handle of the pool is dropped.
struct Closer(Arc<Shared>);

impl Drop for Closer {
    fn drop(&mut self) {
        self.0.lock().is_closed = true;
        self.0.wake.notify_one();
    }
}

/// The process-wide resolver thread.
#[derive(Clone)]
pub struct ResolverPool {
    shared: Arc<Shared>,
    _closer: Arc<Closer>,
}

impl ResolverPool {
    /// Starts the resolver thread with the system's configuration and the default bounds.
    pub fn start() -> io::Result<ResolverPool> {
        ResolverPool::start_with(DnsSetup::default())
    }

    /// Starts the resolver thread. Without a usable system configuration the thread still
    /// runs (IP literals need no lookup) and every lookup fails; the reason is logged once.
    pub fn start_with(setup: DnsSetup) -> io::Result<ResolverPool> {
        let shared = Arc::new(Shared {
            state: Mutex::new(PoolState::new(setup.limits)),
            wake: tokio::sync::Notify::new(),
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name("sortie-dns".into())
            .spawn(move || {
                let local = tokio::task::LocalSet::new();
                local.block_on(&rt, serve_lookups(thread_shared, setup));
            })?;
        Ok(ResolverPool {
            _closer: Arc::new(Closer(shared.clone())),
            shared,
        })
    }

    /// Asks the resolver thread for `host` on behalf of `tenant`, joining a lookup of the same
    /// name already queued or running for any core.
    fn submit(&self, host: &str, tenant: Tenant) -> Result<oneshot::Receiver<Fresh>, DnsError> {
        let (reply, rx) = oneshot::channel();
        let is_new = enqueue(&mut self.shared.lock(), host, tenant, reply)?;
        if is_new {
            self.shared.wake.notify_one();
        }
        Ok(rx)
    }

    /// Names queued or being looked up now, over all cores.
    pub fn lookups_in_flight(&self) -> usize {
        self.shared.lock().waiting.len()
    }
}

/// Queues `host` for `tenant`, or adds `reply` to the lookup of `host` already queued or
/// running; returns whether a new lookup was queued.
fn enqueue(st: &mut PoolState, host: &str, tenant: Tenant, reply: Reply) -> Result<bool, DnsError> {
    if let Some(waiting) = st.waiting.get_mut(host) {
        waiting.push(reply);
        return Ok(false);
    }
    let queued_by_tenant = st.queues.get(&tenant).map_or(0, VecDeque::len);
    if st.is_closed
        || st.queued >= st.limits.queued
        || queued_by_tenant >= st.limits.queued_per_tenant
    {
        return Err(DnsError::Unavailable);
    }
    st.waiting.insert(host.to_string(), vec![reply]);
    st.queues
        .entry(tenant)
        .or_default()
        .push_back(host.to_string());
    if queued_by_tenant == 0 {
        st.turn.push_back(tenant);
    }
    st.queued += 1;
    Ok(true)
}

/// The next name to look up, if a slot is free: the first tenant in turn below its running
/// limit gives its oldest name, and goes to the back of the turn if it has more.
fn next_job(st: &mut PoolState) -> Option<(Tenant, String)> {
    if st.running_total >= st.limits.in_flight {
        return None;
    }
    for _ in 0..st.turn.len() {
        let tenant = st.turn.pop_front()?;
        if st.running.get(&tenant).copied().unwrap_or(0) >= st.limits.in_flight_per_tenant {
            st.turn.push_back(tenant);
            continue;
        }
        let queue = st.queues.get_mut(&tenant)?;
        let host = queue.pop_front()?;
        if queue.is_empty() {
            st.queues.remove(&tenant);
        } else {
            st.turn.push_back(tenant);
        }
        st.queued = st.queued.saturating_sub(1);
        st.running_total += 1;
        *st.running.entry(tenant).or_default() += 1;
        return Some((tenant, host));
    }
    None
}

/// Ends the lookup of `host` for `tenant`: frees its slot and returns everyone waiting for it.
fn finish(st: &mut PoolState, tenant: Tenant, host: &str) -> Vec<Reply> {
    st.running_total = st.running_total.saturating_sub(1);
    if let Some(n) = st.running.get_mut(&tenant) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            st.running.remove(&tenant);
        }
    }
    st.waiting.remove(host).unwrap_or_default()
}

/// Builds the stub resolver: hickory's own cache is off (each core caches, with the TTL this
/// resolver reports), and both address families are asked for at once.
fn build_resolver(setup: &DnsSetup) -> Result<TokioResolver, hickory_resolver::net::NetError> {
    let mut builder = match &setup.servers {
        None => TokioResolver::builder_tokio()?,
        Some(servers) => {
            let config = ResolverConfig::from_name_servers(
                servers
                    .iter()
                    .map(|s| {
                        let mut udp = ConnectionConfig::udp();
                        udp.port = s.port();
                        let mut tcp = ConnectionConfig::tcp();
                        tcp.port = s.port();
                        NameServerConfig::new(s.ip(), true, vec![udp, tcp])
                    })
                    .collect(),
            );
            let mut b = TokioResolver::builder_with_config(config, TokioRuntimeProvider::default());
            b.options_mut().timeout = setup.query_timeout;
            b.options_mut().attempts = 1;
            b.options_mut().use_hosts_file = ResolveHosts::Never;
            b
        }
    };
    let opts = builder.options_mut();
    opts.cache_size = 0;
    opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    builder.build()
}

/// The resolver thread: starts lookups in the fair order while slots are free, each in a task
/// of its own, and answers everyone waiting for a name when its lookup ends.
async fn serve_lookups(shared: Arc<Shared>, setup: DnsSetup) {
    let resolver = match build_resolver(&setup) {
        Ok(r) => Some(Rc::new(r)),
        Err(e) => {
            tracing::warn!(error = %e, "no usable resolver configuration; names will not resolve");
            None
        }
    };
    loop {
        let jobs = {
            let mut st = shared.lock();
            if st.is_closed {
                return;
            }
            std::iter::from_fn(|| next_job(&mut st)).collect::<Vec<_>>()
        };
        for (tenant, host) in jobs {
            let shared = shared.clone();
            let resolver = resolver.clone();
            tokio::task::spawn_local(async move {
                let fresh = match resolver {
                    Some(r) => lookup(&r, &host).await,
                    None => negative("no resolver configuration".into()),
                };
                let replies = finish(&mut shared.lock(), tenant, &host);
                // A slot is free for the next name.
                shared.wake.notify_one();
                for reply in replies {
                    let _ = reply.send(fresh.clone());
                }
            });
        }
        shared.wake.notified().await;
    }
}

fn negative(why: String) -> Fresh {
    Fresh {
        answer: Err(DnsError::NotFound(why)),
        expires: Instant::now() + NEGATIVE_TTL,
    }
}

/// One lookup: the addresses in the order the resolver gives them, without repeats, reusable
/// for the records' TTL clamped to [`MIN_TTL`]..=[`MAX_TTL`].
async fn lookup(resolver: &TokioResolver, host: &str) -> Fresh {
    let started = Instant::now();
    match resolver.lookup_ip(host).await {
        Ok(found) => {
            let mut addrs: Vec<IpAddr> = Vec::new();
            for a in found.iter() {
                if !addrs.contains(&a) {
                    addrs.push(a);
                }
            }
            if addrs.is_empty() {
                return negative("no addresses".into());
            }
            let ttl = found
                .valid_until()
                .saturating_duration_since(started)
                .clamp(MIN_TTL, MAX_TTL);
            Fresh {
                answer: Ok(addrs),
                expires: started + ttl,
            }
        }
        Err(e) => negative(e.to_string()),
    }
}

struct Cache {
    ready: LruCache<String, Fresh>,
    /// Callers waiting for a name this core is looking up.
    pending: HashMap<String, Vec<Reply>>,
}

/// A per-core cache in front of the resolver thread. Not `Send`: each core owns one.
#[derive(Clone)]
pub struct Resolver {
    pool: ResolverPool,
    cache: Rc<RefCell<Cache>>,
}

impl Resolver {
    /// A cache of [`CACHE_ENTRIES`] answers for one core.
    pub fn new(pool: ResolverPool) -> Resolver {
        Resolver::with_capacity(pool, CACHE_ENTRIES)
    }

    /// A cache of `entries` answers (at least one) for one core.
    pub fn with_capacity(pool: ResolverPool, entries: usize) -> Resolver {
        Resolver {
            pool,
            cache: Rc::new(RefCell::new(Cache {
                ready: LruCache::new(entries.max(1)),
                pending: HashMap::new(),
            })),
        }
    }

    /// Answers cached on this core, expired ones not yet evicted included.
    pub fn cached_names(&self) -> usize {
        self.cache.borrow().ready.len()
    }

    /// Resolves `host` (a DNS name; literals should not be passed here) for `tenant`. The
    /// lookup itself runs in a task of its own, so a caller that gives up (deadline,
    /// cancellation) never leaves the cache entry pending for the callers after it.
    pub async fn resolve(&self, host: &str, tenant: Tenant) -> Result<Vec<IpAddr>, DnsError> {
        let (tx, rx) = oneshot::channel();
        let is_first = {
            let mut cache = self.cache.borrow_mut();
            if let Some(c) = cache.ready.get(host) {
                if c.expires > Instant::now() {
                    return c.answer.clone();
                }
            }
            if let Some(waiters) = cache.pending.get_mut(host) {
                waiters.push(tx);
                false
            } else if cache.pending.len() >= MAX_PENDING_PER_CORE {
                return Err(DnsError::Unavailable);
            } else {
                cache.pending.insert(host.to_string(), vec![tx]);
                true
            }
        };
        if is_first {
            let this = self.clone();
            let host = host.to_string();
            monoio::spawn(async move { this.lookup_and_publish(host, tenant).await });
        }
        rx.await.map_or(Err(DnsError::Unavailable), |f| f.answer)
    }

    async fn lookup_and_publish(self, host: String, tenant: Tenant) {
        let fresh = match self.pool.submit(&host, tenant) {
            Ok(rx) => rx.await.ok(),
            Err(_) => None,
        };
        let mut cache = self.cache.borrow_mut();
        let waiters = cache.pending.remove(&host).unwrap_or_default();
        let fresh = match fresh {
            // Over capacity, the least recently used answer goes: O(1).
            Some(f) => {
                cache.ready.insert(host, f.clone());
                f
            }
            // A saturated resolver is not an answer about the name: nothing is cached.
            None => Fresh {
                answer: Err(DnsError::Unavailable),
                expires: Instant::now(),
            },
        };
        drop(cache);
        for w in waiters {
            let _ = w.send(fresh.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// A small DNS server on loopback for the tests: `A 127.0.0.1` for every name (`AAAA`
    /// answered with no data), with a TTL of N for names starting `ttlN-` and 60 otherwise;
    /// NXDOMAIN for names starting `nx`; no answer at all for names starting `blackhole`;
    /// the answer 300 ms late for names starting `delay`. It counts the `A` queries per name.
    struct TestDns {
        addr: SocketAddr,
        queries: Arc<Mutex<HashMap<String, usize>>>,
        stop: Arc<AtomicBool>,
    }

    impl TestDns {
        fn start() -> TestDns {
            let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
            sock.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            let addr = sock.local_addr().unwrap();
            let queries = Arc::new(Mutex::new(HashMap::new()));
            let stop = Arc::new(AtomicBool::new(false));
            let (q, s) = (queries.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 1500];
                while !s.load(Ordering::Relaxed) {
                    let Ok((n, peer)) = sock.recv_from(&mut buf) else {
                        continue;
                    };
                    let Some((name, qtype, answer)) = respond(&buf[..n]) else {
                        continue;
                    };
                    if qtype == 1 {
                        *q.lock().unwrap().entry(name.clone()).or_insert(0) += 1;
                    }
                    if name.starts_with("blackhole") {
                        continue;
                    }
                    if name.starts_with("delay") {
                        let sock = sock.try_clone().unwrap();
                        std::thread::spawn(move || {
                            std::thread::sleep(Duration::from_millis(300));
                            let _ = sock.send_to(&answer, peer);
                        });
                    } else {
                        let _ = sock.send_to(&answer, peer);
                    }
                }
            });
            TestDns {
                addr,
                queries,
                stop,
            }
        }

        fn queries(&self, name: &str) -> usize {
            self.queries.lock().unwrap().get(name).copied().unwrap_or(0)
        }

        fn pool(&self, limits: DnsLimits) -> ResolverPool {
            ResolverPool::start_with(DnsSetup {
                servers: Some(vec![self.addr]),
                query_timeout: Duration::from_secs(3),
                limits,
            })
            .unwrap()
        }
    }

    impl Drop for TestDns {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::Relaxed);
        }
    }

    /// The query's name (lower case, no final dot), type, and the answer to send.
    fn respond(q: &[u8]) -> Option<(String, u16, Vec<u8>)> {
        let mut labels = Vec::new();
        let mut i = 12;
        loop {
            let len = usize::from(*q.get(i)?);
            if len == 0 {
                break;
            }
            labels.push(String::from_utf8_lossy(q.get(i + 1..i + 1 + len)?).to_lowercase());
            i += 1 + len;
        }
        let end = i + 5;
        let qtype = u16::from_be_bytes([*q.get(i + 1)?, *q.get(i + 2)?]);
        let name = labels.join(".");
        let ttl: u32 = labels
            .first()
            .and_then(|l| l.strip_prefix("ttl"))
            .and_then(|l| l.split('-').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(60);
        let is_nx = name.starts_with("nx");
        let has_answer = qtype == 1 && !is_nx;
        let mut out = Vec::new();
        out.extend_from_slice(q.get(..2)?);
        out.extend_from_slice(&[0x81, if is_nx { 0x83 } else { 0x80 }]);
        out.extend_from_slice(&[0, 1, 0, u8::from(has_answer), 0, 0, 0, 0]);
        out.extend_from_slice(q.get(12..end)?);
        if has_answer {
            out.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1]);
            out.extend_from_slice(&ttl.to_be_bytes());
            out.extend_from_slice(&[0, 4, 127, 0, 0, 1]);
        }
        Some((name, qtype, out))
    }

    fn run<F: std::future::Future<Output = ()> + 'static>(f: F) {
        crate::runtime::run_on(crate::runtime::Driver::detect(), f);
    }

    /// Resolves `name` until the server has seen `n` queries for it; returns how long it took.
    async fn resolve_until_queried(r: &Resolver, dns: &TestDns, name: &str, n: usize) -> Duration {
        let started = Instant::now();
        while dns.queries(name) < n {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{name} never asked again"
            );
            let _ = r.resolve(name, None).await;
            monoio::time::sleep(Duration::from_millis(20)).await;
        }
        started.elapsed()
    }

    /// The system configuration: `localhost` from the hosts file; a reserved name fails.
    #[test]
    fn resolves_localhost_with_the_system_configuration() {
        let pool = ResolverPool::start().unwrap();
        run(async move {
            let r = Resolver::new(pool);
            let a = r.resolve("localhost", None).await.unwrap();
            assert!(a.iter().all(|ip| ip.is_loopback()), "{a:?}");
            assert!(r.resolve("does-not-exist.invalid", None).await.is_err());
        });
    }

    /// The cache holds at most its capacity, evicting the least recently used answer: a name
    /// in use stays (the server is asked for it once) while a stream of new names passes.
    #[test]
    fn the_cache_is_bounded_and_keeps_names_in_use() {
        let dns = TestDns::start();
        let pool = dns.pool(DnsLimits::default());
        run(async move {
            let r = Resolver::with_capacity(pool, 64);
            r.resolve("hot.test", None).await.unwrap();
            for i in 0..300u32 {
                r.resolve(&format!("n{i}.test"), Some(7)).await.unwrap();
                r.resolve("hot.test", None).await.unwrap();
                assert!(r.cached_names() <= 64);
            }
            assert_eq!(r.cached_names(), 64);
            assert_eq!(dns.queries("hot.test"), 1, "the name in use was evicted");
            assert!(r.cache.borrow().ready.peek("n0.test").is_none());
        });
    }

    /// An answer is reused for its TTL and asked for again after it; a TTL of 0 is raised to
    /// [`MIN_TTL`] and a long one lowered to [`MAX_TTL`].
    #[test]
    fn answers_are_reused_for_their_clamped_ttl() {
        let dns = TestDns::start();
        let pool = dns.pool(DnsLimits::default());
        run(async move {
            let r = Resolver::new(pool);
            r.resolve("ttl2-a.test", None).await.unwrap();
            r.resolve("ttl2-a.test", None).await.unwrap();
            assert_eq!(dns.queries("ttl2-a.test"), 1, "reused within its TTL");
            let waited = resolve_until_queried(&r, &dns, "ttl2-a.test", 2).await;
            assert!(
                waited >= Duration::from_millis(1500),
                "asked again after {waited:?}"
            );

            r.resolve("ttl0-b.test", None).await.unwrap();
            r.resolve("ttl0-b.test", None).await.unwrap();
            assert_eq!(
                dns.queries("ttl0-b.test"),
                1,
                "a TTL of 0 is raised to MIN_TTL"
            );

            let asked = Instant::now();
            r.resolve("ttl86400-c.test", None).await.unwrap();
            let expires = r
                .cache
                .borrow_mut()
                .ready
                .get("ttl86400-c.test")
                .unwrap()
                .expires;
            assert!(expires <= asked + MAX_TTL + Duration::from_secs(1));
            assert!(expires >= asked + MAX_TTL - Duration::from_secs(5));
        });
    }

    /// Concurrent lookups of one name, from one core and from two, are one query, even when
    /// the resolver has no free slot for the second core's lookup.
    #[test]
    fn concurrent_lookups_of_one_name_share_one_query() {
        let dns = TestDns::start();
        // One slot: a lookup that waits for it joins the running one instead of following it.
        let pool = dns.pool(DnsLimits {
            in_flight: 1,
            ..DnsLimits::default()
        });
        run(async move {
            let cores = [Resolver::new(pool.clone()), Resolver::new(pool)];
            let mut tasks = Vec::new();
            for i in 0..40 {
                let r = cores[i % 2].clone();
                tasks.push(monoio::spawn(async move {
                    r.resolve("delay-shared.test", None).await
                }));
            }
            for t in tasks {
                assert!(t.await.is_ok());
            }
            // A name asked for after them runs after any other lookup queued before it.
            cores[1].resolve("after.test", None).await.unwrap();
            assert_eq!(dns.queries("delay-shared.test"), 1);
        });
    }

    /// A name that does not exist is remembered for [`NEGATIVE_TTL`], then asked again.
    #[test]
    fn failed_lookups_are_remembered_briefly() {
        let dns = TestDns::start();
        let pool = dns.pool(DnsLimits::default());
        run(async move {
            let r = Resolver::new(pool);
            for _ in 0..5 {
                let e = r.resolve("nx-gone.test", None).await.unwrap_err();
                assert!(matches!(e, DnsError::NotFound(_)), "{e:?}");
            }
            assert_eq!(dns.queries("nx-gone.test"), 1);
            let waited = resolve_until_queried(&r, &dns, "nx-gone.test", 2).await;
            assert!(
                waited >= NEGATIVE_TTL - Duration::from_millis(200),
                "{waited:?}"
            );
        });
    }

    /// A deployment whose names never answer holds at most its share of the lookup slots:
    /// another deployment's name resolves at once, not after the first one's timeouts.
    #[test]
    fn one_deployment_cannot_hold_the_resolver() {
        let dns = TestDns::start();
        let pool = dns.pool(DnsLimits {
            in_flight: 4,
            in_flight_per_tenant: 3,
            queued: 64,
            queued_per_tenant: 16,
        });
        run(async move {
            let r = Resolver::new(pool);
            for i in 0..10 {
                let r = r.clone();
                monoio::spawn(async move {
                    let _ = r.resolve(&format!("blackhole-{i}.test"), Some(0)).await;
                });
            }
            // Every slow name is queued or running before the other deployment asks.
            let started = Instant::now();
            while r.pool.lookups_in_flight() < 10 || dns.queries("blackhole-0.test") == 0 {
                assert!(started.elapsed() < Duration::from_secs(5));
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
            let asked = Instant::now();
            r.resolve("fast.test", Some(1)).await.unwrap();
            assert!(
                asked.elapsed() < Duration::from_secs(1),
                "{:?}",
                asked.elapsed()
            );
            // Past its queue bound (7 of its names wait now), the slow deployment's next names
            // fail fast.
            let refused = (10..30)
                .map(|i| r.pool.submit(&format!("blackhole-{i}.test"), Some(0)))
                .position(|s| s.is_err());
            assert_eq!(refused, Some(9));
        });
    }

    /// The fair order: tenants take turns, and one at its running limit waits while the
    /// others go on.
    #[test]
    fn tenants_take_turns_within_their_limits() {
        let mut st = PoolState::new(DnsLimits {
            in_flight: 5,
            in_flight_per_tenant: 3,
            queued: 1000,
            queued_per_tenant: 200,
        });
        let push = |st: &mut PoolState, host: &str, tenant: Tenant| {
            let (reply, _rx) = oneshot::channel();
            enqueue(st, host, tenant, reply).unwrap()
        };
        for i in 0..100 {
            push(&mut st, &format!("slow-{i}.a.example"), Some(0));
        }
        push(&mut st, "b.example", Some(1));
        push(&mut st, "c.example", None);
        assert!(!push(&mut st, "c.example", Some(2)), "one name, one lookup");
        let order: Vec<Tenant> = std::iter::from_fn(|| next_job(&mut st))
            .map(|j| j.0)
            .collect();
        assert_eq!(order, vec![Some(0), Some(1), None, Some(0), Some(0)]);
        assert_eq!(st.waiting.get("c.example").map(Vec::len), Some(2));
        let replies = finish(&mut st, None, "c.example");
        assert_eq!(replies.len(), 2);
        // A free slot, but tenant 0 is at its limit and nobody else waits.
        assert_eq!(next_job(&mut st), None);
        finish(&mut st, Some(0), "slow-0.a.example");
        assert_eq!(next_job(&mut st).map(|j| j.0), Some(Some(0)));
    }
}
