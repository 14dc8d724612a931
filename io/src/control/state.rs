//! Control state shared by every core: the active snapshot with its routing table (published
//! lock-free through `arc-swap`), per-worker capacity counters (atomics), sticky pins (sharded),
//! credentials and limits. Writers (admin API, worker registration) are rare and serialised by
//! one mutex; readers on the hot path only load an `Arc`.
//!
//! Sticky pins live in 64 shards chosen by a per-process keyed hash, with a quota per deployment
//! (decision 044). Each pool's upstream proxy is built per activation and published with the
//! snapshot. `ControlState::activate` only moves forward, so the follower and a local commit may
//! publish in either order.

use std::collections::HashMap;
use std::hash::{BuildHasher as _, RandomState};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use sortie_core::config::Config;
use sortie_core::destination::DestinationPolicy;
use sortie_core::routing::{RoutingTable, StickyPins, WorkerIndex};
use sortie_core::snapshot::ValidatedSnapshot;
use sortie_core::upstream_proxy::OutlierPolicy;
use sortie_core::worker::WorkerRegistry;

use super::admission::AdmissionLimits;
use super::core::CoreMailbox;
use crate::egress::{EndpointHealthView, HealthRegistry, ProxyPool};
use crate::tokens::Authenticator;

/// Shards of the sticky pin store; a pin lives in the shard its key hashes to.
const PIN_SHARDS: usize = 64;
/// Pins one shard holds.
const PINS_PER_SHARD: usize = sortie_core::routing::DEFAULT_MAX_STICKY_PINS / PIN_SHARDS;

/// The per-shard pin quota of each of `deployments` deployments (decision 044): the store split
/// evenly, so that every deployment's quota fits at once and no deployment ever loses a pin to
/// another's.
fn pin_quota_per_shard(deployments: usize) -> usize {
    (PINS_PER_SHARD / deployments.max(1)).max(1)
}

/// The static request limits of `[control.request]`.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `control.request.max_timeout_ms`.
    pub max_timeout_ms: u64,
    /// `control.request.max_inline_request_body_bytes`.
    pub max_inline_request_body_bytes: usize,
    /// `control.request.max_inline_response_body_bytes`.
    pub max_inline_response_body_bytes: usize,
    /// `egress.connect_timeout_ms` and `egress.idle_timeout_ms` as the egress stage limits.
    pub egress_timeouts: crate::egress::Timeouts,
    /// `control.proxy.idle_timeout_ms`: the idle limit of a relayed proxy request.
    pub proxy_idle_timeout: Duration,
    /// `control.proxy.tunnel_idle_timeout_ms`: a tunnel with no byte moving is closed.
    pub tunnel_idle_timeout: Duration,
    /// `control.denied_destination_ports`: checked on every ingress before routing.
    pub denied_ports: sortie_core::destination::DeniedPorts,
}

/// One worker's live counters. Stable for the life of the process: tables rebuilt after a
/// snapshot or registry change point at the same slot.
#[derive(Debug)]
pub struct WorkerSlot {
    id: String,
    active: AtomicU32,
    bind_address: Option<IpAddr>,
    /// The config revision a remote worker acknowledged last (0: none yet).
    applied: AtomicU64,
    /// Requests in flight on a remote worker as its last heartbeat reported them, across every
    /// control it serves; `NOT_REPORTED` until its session sent one (decision 069).
    reported: AtomicU64,
    /// [`session_tag`] of the remote worker's connected session; 0 while none is.
    session: AtomicU64,
    /// When the connected session's last heartbeat came (Unix ms; 0: none yet).
    heard: AtomicU64,
}

/// The tag of a session id in [`WorkerSlot`]: its heartbeats are recorded without the registry
/// lock, and only while the tag matches the connected session's. Never 0.
pub fn session_tag(session: &str) -> u64 {
    sortie_core::rendezvous::stable_hash(&[session.as_bytes()]).max(1)
}

/// [`WorkerSlot::reported`] before a heartbeat.
const NOT_REPORTED: u64 = u64::MAX;

impl WorkerSlot {
    /// The worker id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Requests in flight.
    pub fn active(&self) -> u32 {
        self.active.load(Ordering::Relaxed)
    }

    /// The egress source address of a local worker.
    pub fn bind_address(&self) -> Option<IpAddr> {
        self.bind_address
    }

    /// Takes one unit of capacity if fewer than `max` are in use. Routing read the counter a
    /// moment ago; this closes the race between two cores choosing the same last slot.
    pub fn try_acquire(&self, max: u32) -> bool {
        self.active
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    /// The config revision the worker acknowledged last.
    pub fn applied(&self) -> u64 {
        self.applied.load(Ordering::Relaxed)
    }

    /// A remote worker's own count of requests in flight from its last heartbeat (all its
    /// controls'), if its session sent one.
    pub fn reported(&self) -> Option<u32> {
        u32::try_from(self.reported.load(Ordering::Relaxed)).ok()
    }

    /// Records a remote worker's own count of requests in flight from its heartbeat.
    pub fn set_reported(&self, active: u32) {
        self.reported.store(u64::from(active), Ordering::Relaxed);
    }

    /// Records a heartbeat of the session tagged `session` (see [`session_tag`]): when it came
    /// and the load it reported (decision 069). A session that is not the connected one, a
    /// superseded or standby one, is ignored. Lock-free: heartbeats never wait for the
    /// registry's writer, which may be rebuilding routing.
    pub fn heartbeat(&self, session: u64, now_unix_ms: u64, active: u32) {
        if self.session.load(Ordering::Acquire) == session {
            self.set_reported(active);
            self.heard.fetch_max(now_unix_ms, Ordering::Relaxed);
        }
    }

    /// When the connected session's last heartbeat came, if one did.
    pub fn last_heard(&self) -> Option<u64> {
        match self.heard.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t),
        }
    }

    /// Records a revision the worker acknowledged.
    pub fn set_applied(&self, revision: u64) {
        self.applied.fetch_max(revision, Ordering::Relaxed);
    }

    /// Returns one unit of capacity.
    pub fn release(&self) {
        let _ = self
            .active
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

/// Everything a request is routed and executed against; replaced as a whole on activation.
/// In-flight requests keep the `Arc` they started with.
pub struct Active {
    /// Config revision of the snapshot.
    pub revision: u64,
    /// The validated snapshot.
    pub snapshot: Arc<ValidatedSnapshot>,
    /// The routing table over the snapshot and the worker registry.
    pub table: RoutingTable,
    /// The snapshot's destination policy.
    pub policy: Arc<DestinationPolicy>,
    /// Counters aligned with `table.workers()`; `None` for workers without a local slot.
    pub slots: Vec<Option<Arc<WorkerSlot>>>,
    /// The upstream proxy of each pool, aligned with `snapshot.pools()`; `None` for direct
    /// pools.
    pub proxies: Vec<Option<Arc<ProxyPool>>>,
    /// The registry generation the table was built from (see
    /// [`ControlState::register_remote_batched`]).
    pub generation: u64,
}

impl Active {
    /// The upstream proxy of a pool, when it has one.
    pub fn proxy(&self, pool: usize) -> Option<&Arc<ProxyPool>> {
        self.proxies.get(pool).and_then(Option::as_ref)
    }

    /// The slot of a routed worker.
    pub fn slot(&self, index: WorkerIndex) -> Option<&Arc<WorkerSlot>> {
        self.slots.get(index.as_usize()).and_then(Option::as_ref)
    }

    /// Requests in flight on a worker (the routing capacity view).
    pub fn active_on(&self, index: WorkerIndex) -> u32 {
        self.slot(index).map_or(0, |s| s.active())
    }
}

struct Writer {
    registry: WorkerRegistry,
    slots: HashMap<String, Arc<WorkerSlot>>,
    /// Counts registry changes whose republication was deferred to a batch.
    generation: u64,
}

/// During a registration storm, registrations republish the routing table at most once per
/// batch interval: one rebuild covers all that came meanwhile (decision 116). The interval is
/// this at least, and ten times the last rebuild's duration, so that rebuilds take at most a
/// tenth of a core however large the fleet; it is never longer than [`MAX_REGISTRATION_BATCH`].
pub const REGISTRATION_BATCH: Duration = Duration::from_millis(5);
/// `last_publish_ms` before the first republication for a registration.
const NEVER_PUBLISHED: u64 = u64::MAX;
/// The longest batch interval.
pub const MAX_REGISTRATION_BATCH: Duration = Duration::from_millis(250);

/// Upstream proxy endpoint health, shared by every snapshot's proxy pools.
fn proxy_health() -> &'static HealthRegistry {
    static HEALTH: OnceLock<HealthRegistry> = OnceLock::new();
    HEALTH.get_or_init(HealthRegistry::default)
}

/// The shared control state.
pub struct ControlState {
    active: ArcSwap<Active>,
    /// How many times `active` was replaced; raised (release) after each store, so a core that
    /// reads the same count (acquire) as when it last loaded `active` may keep what it loaded
    /// ([`crate::dispatch::Dispatcher::active_snapshot`]).
    published: AtomicU64,
    writer: Mutex<Writer>,
    /// `Writer::generation`, readable without the lock: the routing table is stale while the
    /// active one was built from an older generation.
    routing_generation: AtomicU64,
    /// A batched republication is scheduled.
    publish_scheduled: AtomicBool,
    /// When the table was last rebuilt for a registration, in monotonic milliseconds.
    last_publish_ms: AtomicU64,
    /// How long the last rebuild took, in microseconds.
    last_build_us: AtomicU64,
    pins: Box<[Mutex<StickyPins>]>,
    /// Picks a key's pin shard. Keyed at random per process (SipHash): shard selection cannot
    /// be predicted from outside, so no one can aim sessions at one shard.
    pin_hasher: RandomState,
    /// Static limits.
    pub limits: Limits,
    /// Deployment token check.
    pub auth: Authenticator,
    /// Requests in flight per deployment and body bytes in flight (decision 043).
    pub admission: &'static AdmissionLimits,
    /// The admin token; a reload may replace it (decision 114).
    pub admin_token: ArcSwap<String>,
    /// `log.access`: one access line per request (decision 113); a reload may change it.
    access_log: AtomicBool,
    /// The cores' mailboxes, set once the cores are running.
    pub mailboxes: OnceLock<Vec<CoreMailbox>>,
}

fn policy_of(s: &ValidatedSnapshot) -> DestinationPolicy {
    DestinationPolicy::new(
        s.destinations().allow().to_vec(),
        s.destinations().deny().to_vec(),
    )
}

impl ControlState {
    /// Builds the state from the static config, the resolved tokens, the worker registry (local
    /// workers registered, persisted settings restored) and the active snapshot.
    pub fn new(
        config: &Config,
        auth: Authenticator,
        admin_token: String,
        registry: WorkerRegistry,
        revision: u64,
        snapshot: Arc<ValidatedSnapshot>,
    ) -> ControlState {
        let mut slots = HashMap::new();
        for w in &config.workers {
            let bind_address = w.bind_address.as_deref().and_then(|b| b.parse().ok());
            slots.insert(
                w.id.clone(),
                Arc::new(WorkerSlot {
                    id: w.id.clone(),
                    active: AtomicU32::new(0),
                    bind_address,
                    applied: AtomicU64::new(0),
                    reported: AtomicU64::new(NOT_REPORTED),
                    session: AtomicU64::new(0),
                    heard: AtomicU64::new(0),
                }),
            );
        }
        let r = &config.control.request;
        let writer = Writer {
            registry,
            slots,
            generation: 0,
        };
        let active = Self::build(&writer, revision, snapshot);
        ControlState {
            active: ArcSwap::from_pointee(active),
            published: AtomicU64::new(0),
            writer: Mutex::new(writer),
            routing_generation: AtomicU64::new(0),
            publish_scheduled: AtomicBool::new(false),
            last_publish_ms: AtomicU64::new(NEVER_PUBLISHED),
            last_build_us: AtomicU64::new(0),
            pins: (0..PIN_SHARDS)
                .map(|_| {
                    Mutex::new(StickyPins::with_quota(
                        PINS_PER_SHARD,
                        pin_quota_per_shard(auth.len()),
                    ))
                })
                .collect(),
            pin_hasher: RandomState::new(),
            limits: Limits {
                max_timeout_ms: r.max_timeout_ms,
                max_inline_request_body_bytes: r.max_inline_request_body_bytes,
                max_inline_response_body_bytes: r.max_inline_response_body_bytes,
                egress_timeouts: crate::egress::Timeouts {
                    connect: Duration::from_millis(config.egress.connect_timeout_ms),
                    response_header: None,
                    idle: Duration::from_millis(config.egress.idle_timeout_ms),
                },
                proxy_idle_timeout: Duration::from_millis(config.control.proxy.idle_timeout_ms),
                tunnel_idle_timeout: Duration::from_millis(
                    config.control.proxy.tunnel_idle_timeout_ms,
                ),
                denied_ports: sortie_core::destination::DeniedPorts::new(
                    &config.control.denied_destination_ports,
                )
                .unwrap_or_default(),
            },
            admission: AdmissionLimits::leak(
                auth.len(),
                r.max_concurrent_per_deployment,
                r.max_in_flight_body_bytes,
            ),
            auth,
            admin_token: ArcSwap::from_pointee(admin_token),
            access_log: AtomicBool::new(config.log.access),
            mailboxes: OnceLock::new(),
        }
    }

    fn build(w: &Writer, revision: u64, snapshot: Arc<ValidatedSnapshot>) -> Active {
        let policy = Arc::new(policy_of(&snapshot));
        let table = RoutingTable::build(snapshot.clone(), w.registry.iter());
        let slots = table
            .workers()
            .iter()
            .map(|r| w.slots.get(r.id().as_str()).cloned())
            .collect();
        let proxies = snapshot
            .pools()
            .iter()
            .map(|p| {
                p.upstream_proxy().map(|u| {
                    Arc::new(ProxyPool::build(
                        u,
                        proxy_health(),
                        OutlierPolicy::default(),
                    ))
                })
            })
            .collect();
        Active {
            revision,
            snapshot,
            table,
            policy,
            slots,
            proxies,
            generation: w.generation,
        }
    }

    /// The active snapshot and table; cheap, lock-free.
    pub fn active(&self) -> Arc<Active> {
        self.active.load_full()
    }

    /// How many times the active snapshot and table were replaced: when a core reads the same
    /// count as before its last [`ControlState::active`], what that returned is still current.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Acquire)
    }

    fn writer(&self) -> MutexGuard<'_, Writer> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes a new snapshot (already committed to the store) to every core, unless the same
    /// or a newer revision is active already: with several controls the follower (decision
    /// 092) and a local commit may publish in either order, the newest revision must win, and
    /// a revision is published (and pushed to workers) once. Returns whether this call made
    /// `revision` the active one.
    pub fn activate(&self, revision: u64, snapshot: Arc<ValidatedSnapshot>) -> bool {
        let w = self.writer();
        if self.active.load().revision >= revision {
            return false;
        }
        self.active
            .store(Arc::new(Self::build(&w, revision, snapshot)));
        self.published.fetch_add(1, Ordering::Release);
        true
    }

    /// Runs `f` on the worker registry, then republishes the routing table so that every core
    /// routes by the new worker state at once.
    pub fn update_registry<R>(&self, f: impl FnOnce(&mut WorkerRegistry) -> R) -> R {
        let mut w = self.writer();
        let out = f(&mut w.registry);
        self.publish(&w);
        out
    }

    /// Registers a remote worker's session (all its lanes are up) and makes it routable at once;
    /// settings recorded earlier for the id apply. Gives the worker its capacity slot, kept for
    /// the life of the process.
    pub fn register_remote(
        &self,
        id: &str,
        session: &str,
        caps: sortie_core::worker::WorkerCapabilities,
        now_unix_ms: u64,
    ) -> Result<Arc<WorkerSlot>, sortie_core::worker::RegisterError> {
        let mut w = self.writer();
        let slot = Self::register_in(&mut w, id, session, caps, now_unix_ms)?;
        self.publish(&w);
        Ok(slot)
    }

    /// [`ControlState::register_remote`] for the bus, where registrations come in storms (a
    /// control's start, a network back): a registration republishes the routing table at
    /// once unless one did within [`REGISTRATION_BATCH`]; then one republication at the end of
    /// that interval covers every registration meanwhile, so that a storm of N costs about
    /// N / batch rebuilds instead of N (decision 116). Until then the registry already lists
    /// the worker, and a request that finds no eligible worker in a stale table has it rebuilt
    /// ([`ControlState::publish_if_stale`]). Must run on a core (it schedules on the runtime).
    pub fn register_remote_batched(
        self: &Arc<Self>,
        id: &str,
        session: &str,
        caps: sortie_core::worker::WorkerCapabilities,
        now_unix_ms: u64,
    ) -> Result<Arc<WorkerSlot>, sortie_core::worker::RegisterError> {
        let mut w = self.writer();
        let slot = Self::register_in(&mut w, id, session, caps, now_unix_ms)?;
        w.generation = w.generation.wrapping_add(1);
        self.routing_generation
            .store(w.generation, Ordering::Release);
        let now = crate::clock::monotonic_ms_at(std::time::Instant::now());
        let batch = self.registration_batch();
        let last = self.last_publish_ms.load(Ordering::Relaxed);
        let is_quiet = last == NEVER_PUBLISHED
            || now.saturating_sub(last) >= u64::try_from(batch.as_millis()).unwrap_or(u64::MAX);
        if is_quiet && !self.publish_scheduled.load(Ordering::Acquire) {
            self.last_publish_ms.store(now, Ordering::Relaxed);
            self.publish(&w);
            return Ok(slot);
        }
        drop(w);
        if !self.publish_scheduled.swap(true, Ordering::AcqRel) {
            let me = self.clone();
            monoio::spawn(async move {
                monoio::time::sleep(batch).await;
                me.publish_scheduled.store(false, Ordering::Release);
                me.publish_if_stale();
            });
        }
        Ok(slot)
    }

    /// The batch interval of registrations now: [`REGISTRATION_BATCH`], or ten times the last
    /// rebuild, up to [`MAX_REGISTRATION_BATCH`].
    fn registration_batch(&self) -> Duration {
        let ten_builds = Duration::from_micros(self.last_build_us.load(Ordering::Relaxed) * 10);
        ten_builds.clamp(REGISTRATION_BATCH, MAX_REGISTRATION_BATCH)
    }

    /// Whether the registry changed since `active` was built (registrations may still wait
    /// for their batched republication).
    pub fn is_newer_than(&self, active: &Active) -> bool {
        active.generation != self.routing_generation.load(Ordering::Acquire)
    }

    /// Republishes the routing table if registrations are waiting for it; whether it did.
    pub fn publish_if_stale(&self) -> bool {
        let w = self.writer();
        if self.active.load().generation == w.generation {
            return false;
        }
        let now = crate::clock::monotonic_ms_at(std::time::Instant::now());
        self.last_publish_ms.store(now, Ordering::Relaxed);
        self.publish(&w);
        true
    }

    /// Rebuilds the routing table from the registry under the writer lock and publishes it
    /// with the active snapshot; every republication of a registry change goes through here,
    /// so the rebuild time the registration batch scales with is that of any rebuild.
    fn publish(&self, w: &Writer) {
        let started = std::time::Instant::now();
        let cur = self.active.load_full();
        self.active
            .store(Arc::new(Self::build(w, cur.revision, cur.snapshot.clone())));
        self.published.fetch_add(1, Ordering::Release);
        drop(cur);
        let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.last_build_us.store(took, Ordering::Relaxed);
    }

    /// The registry half of a registration: the record and the worker's capacity slot.
    fn register_in(
        w: &mut Writer,
        id: &str,
        session: &str,
        caps: sortie_core::worker::WorkerCapabilities,
        now_unix_ms: u64,
    ) -> Result<Arc<WorkerSlot>, sortie_core::worker::RegisterError> {
        w.registry.register(
            id,
            session,
            sortie_core::worker::Executor::Remote,
            caps,
            now_unix_ms,
        )?;
        let slot = w
            .slots
            .entry(id.to_string())
            .or_insert_with(|| {
                Arc::new(WorkerSlot {
                    id: id.to_string(),
                    active: AtomicU32::new(0),
                    bind_address: None,
                    applied: AtomicU64::new(0),
                    reported: AtomicU64::new(NOT_REPORTED),
                    session: AtomicU64::new(0),
                    heard: AtomicU64::new(0),
                })
            })
            .clone();
        // A new session has applied, reported and been heard nothing yet.
        slot.applied.store(0, Ordering::Relaxed);
        slot.reported.store(NOT_REPORTED, Ordering::Relaxed);
        slot.heard.store(0, Ordering::Relaxed);
        slot.session.store(session_tag(session), Ordering::Release);
        Ok(slot)
    }

    /// Marks a remote worker's session disconnected (ignored for a superseded session) and
    /// republishes routing.
    pub fn disconnect_remote(&self, id: &str, session: &str, now_unix_ms: u64) {
        let mut w = self.writer();
        if w.registry.disconnect(id, session, now_unix_ms) {
            if let Some(slot) = w.slots.get(id) {
                slot.session.store(0, Ordering::Release);
            }
            self.publish(&w);
        }
    }

    /// Whether each request writes an access line (`log.access`).
    pub fn access_log(&self) -> bool {
        self.access_log.load(Ordering::Relaxed)
    }

    /// Sets `log.access` (a reload).
    pub fn set_access_log(&self, on: bool) {
        self.access_log.store(on, Ordering::Relaxed);
    }

    /// Forgets the remote workers disconnected for at least `after` (their records and
    /// capacity slots; operator settings stay), republishes routing when any was, and returns
    /// how many.
    pub fn forget_disconnected(&self, now_unix_ms: u64, after: Duration) -> usize {
        let mut w = self.writer();
        let after_ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        let gone = w.registry.forget_disconnected(now_unix_ms, after_ms);
        if gone.is_empty() {
            return 0;
        }
        for id in &gone {
            w.slots.remove(id.as_str());
        }
        self.publish(&w);
        gone.len()
    }

    /// The counters of worker `id`, if it has a slot (a local worker, or a remote one that
    /// registered and was not forgotten).
    pub fn slot_of(&self, id: &str) -> Option<Arc<WorkerSlot>> {
        self.writer().slots.get(id).cloned()
    }

    /// Reads the worker registry.
    pub fn with_registry<R>(
        &self,
        f: impl FnOnce(&WorkerRegistry, &HashMap<String, Arc<WorkerSlot>>) -> R,
    ) -> R {
        let w = self.writer();
        f(&w.registry, &w.slots)
    }

    /// The health of every upstream proxy endpoint any snapshot named, for `/metrics`.
    pub fn proxy_endpoints(&self) -> Vec<EndpointHealthView> {
        proxy_health().view(crate::clock::monotonic_ms_at(std::time::Instant::now()))
    }

    /// The gauges of a `/metrics` scrape: the active revision, every registered worker's load
    /// and capacity, and the upstream proxy endpoints' health.
    pub fn gauges(&self) -> crate::metrics::Gauges {
        let revision = self.active().revision;
        let workers = self.with_registry(|reg, slots| {
            reg.iter()
                .map(|w| {
                    let slot = slots.get(w.id().as_str());
                    let active = slot.map_or(0, |s| s.active());
                    crate::metrics::WorkerGauge {
                        id: w.id().as_str().to_string(),
                        active,
                        capacity: w.capacity(active).max,
                        // A remote worker's own load, while its session is connected.
                        reported: slot
                            .and_then(|s| s.reported())
                            .filter(|_| w.state() == sortie_core::worker::WorkerState::Connected),
                    }
                })
                .collect()
        });
        crate::metrics::Gauges {
            revision,
            workers,
            proxy_endpoints: self.proxy_endpoints(),
        }
    }

    /// The pin shard of a (deployment, sticky session) pair.
    pub fn pin_shard(&self, deployment: &str, session: &str) -> usize {
        (self.pin_hasher.hash_one((deployment, session)) as usize) % self.pins.len()
    }

    /// Runs `f` with the pin shard of a (deployment, sticky session) pair.
    pub fn with_pins<R>(
        &self,
        deployment: &str,
        session: &str,
        f: impl FnOnce(&mut StickyPins) -> R,
    ) -> R {
        let shard = self.pin_shard(deployment, session);
        let mut g = self.pins[shard].lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> ControlState {
        let mut json = sortie_core::snapshot::DEFAULT_SNAPSHOT_JSON
            .as_bytes()
            .to_vec();
        let snapshot = sortie_core::snapshot::decode_snapshot(&mut json).unwrap();
        ControlState::new(
            &Config::default(),
            Authenticator::new(&[]),
            "admin-token-for-tests".into(),
            WorkerRegistry::new(),
            1,
            Arc::new(snapshot),
        )
    }

    /// A registration storm: the first registration republishes at once, the next ones within
    /// the batch wait for one rebuild (the table is stale meanwhile, and a request that finds
    /// no worker in it has it rebuilt), then the scheduled rebuild publishes them all.
    #[test]
    fn registrations_in_a_storm_share_one_rebuild() {
        let caps = || {
            sortie_core::worker::AdvertisedCapabilities {
                tags: vec![],
                country: None,
                region: None,
                ip_type: None,
                ingress: vec![],
                pools: vec![],
                fingerprint_profiles: vec![],
                capacity: 4,
            }
            .validate()
            .unwrap()
        };
        crate::runtime::run_on(crate::runtime::Driver::detect(), async {
            let s = Arc::new(state());
            s.register_remote_batched("w-0", "s0", caps(), 1).unwrap();
            let first = s.active();
            assert!(
                !s.is_newer_than(&first),
                "a lone registration is published at once"
            );
            assert_eq!(first.table.workers().len(), 1);
            for i in 1..50 {
                s.register_remote_batched(&format!("w-{i}"), "s0", caps(), 1)
                    .unwrap();
            }
            let stale = s.active();
            assert!(Arc::ptr_eq(&first, &stale), "no rebuild per registration");
            assert!(s.is_newer_than(&stale));
            monoio::time::sleep(MAX_REGISTRATION_BATCH + Duration::from_millis(50)).await;
            let batched = s.active();
            assert_eq!(
                batched.table.workers().len(),
                50,
                "one rebuild published them all"
            );
            assert!(!s.is_newer_than(&batched));
            // A request that finds a stale table has it rebuilt on the spot.
            s.register_remote_batched("w-late", "s0", caps(), 1)
                .unwrap();
            s.register_remote_batched("w-later", "s0", caps(), 1)
                .unwrap();
            assert!(s.publish_if_stale());
            assert_eq!(s.active().table.workers().len(), 52);
            assert!(!s.publish_if_stale(), "nothing left to publish");
        });
    }

    /// Two processes (here: two states) place the same sessions in different shards: the
    /// shard hash is keyed per process, so nobody outside can aim sessions at one shard.
    #[test]
    fn pin_shards_are_keyed_per_process() {
        let (a, b) = (state(), state());
        let shards = |s: &ControlState| -> Vec<usize> {
            (0..64)
                .map(|i| s.pin_shard("dep", &format!("session-{i}")))
                .collect()
        };
        assert_eq!(shards(&a), shards(&a), "stable within a process");
        assert_ne!(shards(&a), shards(&b));
    }

    #[test]
    fn a_revision_is_published_once_and_never_replaced_by_an_older_one() {
        let s = state();
        let snapshot = s.active().snapshot.clone();
        // The admin path and the follower may both see revision 2: only the first publishes it
        // (and pushes it to workers).
        assert!(s.activate(2, snapshot.clone()));
        assert!(!s.activate(2, snapshot.clone()));
        assert!(!s.activate(1, snapshot.clone()));
        assert_eq!(s.active().revision, 2);
        assert!(s.activate(3, snapshot));
        assert_eq!(s.active().revision, 3);
    }

    /// A heartbeat counts for the connected session only: not for another session of the same
    /// id, and not once the session disconnected.
    #[test]
    fn heartbeats_count_for_the_connected_session_only() {
        let caps = sortie_core::worker::AdvertisedCapabilities {
            capacity: 4,
            ..Default::default()
        }
        .validate()
        .unwrap();
        let s = state();
        let slot = s.register_remote("w1", "s1", caps, 10).unwrap();
        assert_eq!(slot.last_heard(), None);
        slot.heartbeat(session_tag("s1"), 20, 3);
        assert_eq!((slot.last_heard(), slot.reported()), (Some(20), Some(3)));
        slot.heartbeat(session_tag("other"), 30, 5);
        assert_eq!((slot.last_heard(), slot.reported()), (Some(20), Some(3)));
        s.disconnect_remote("w1", "s1", 40);
        slot.heartbeat(session_tag("s1"), 50, 7);
        assert_eq!((slot.last_heard(), slot.reported()), (Some(20), Some(3)));
    }

    #[test]
    fn every_deployment_quota_fits_the_store_at_once() {
        for deployments in [0, 1, 2, 3, 100, 5000] {
            let q = pin_quota_per_shard(deployments);
            assert!(q >= 1);
            assert!(q * deployments.max(1) <= PINS_PER_SHARD.max(deployments));
        }
        assert_eq!(pin_quota_per_shard(1), PINS_PER_SHARD);
        assert_eq!(pin_quota_per_shard(2), PINS_PER_SHARD / 2);
    }
}
