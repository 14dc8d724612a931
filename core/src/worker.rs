//! Worker registry model: who the workers are, what they advertise, their operator flags and
//! their connection state, as plain data. The IO layer feeds registrations, disconnects and
//! admin actions in (heartbeats go to the IO layer's per-worker counters, without this
//! registry's lock); routing tables are built from the records.
//!
//! Decisions (009): a worker that advertises no ingress modes serves all three;
//! a worker that advertises no pools belongs to `direct`; a worker is routable only while it is
//! registered and connected (local executors register as connected and never disconnect),
//! enabled and not draining. The per-worker count of active requests is not kept here: it lives
//! in atomics of the IO layer and reaches routing through its `CapacityView`.

use std::collections::BTreeMap;

use crate::config_id::{ConfigId, IdError};
use crate::hints::{CountryCode, Ingress};
use crate::limits;

/// Most tags one worker may advertise.
pub const MAX_WORKER_TAGS: usize = 256;
/// Most pools one worker may belong to.
pub const MAX_WORKER_POOLS: usize = 64;
/// Most fingerprint profiles one worker may advertise.
pub const MAX_WORKER_PROFILES: usize = 64;
/// Largest capacity (concurrent requests) one worker may advertise.
pub const MAX_WORKER_CAPACITY: u32 = 1_000_000;
/// Longest session identifier of a worker registration.
pub const MAX_SESSION_BYTES: usize = 128;
/// Most workers an admin action may give a settings record while no worker of that id has
/// registered (listed as `unregistered`, decision 042). Each is a store row and a registry
/// entry: without a bound, actions on made-up ids would grow both without end.
pub const MAX_UNREGISTERED_WORKERS: usize = 1024;
/// The pool of a worker that names none (decision 017).
pub const DEFAULT_POOL: &str = "direct";

/// Connection state of a worker (decision 017 worker list items).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkerState {
    /// Registered and reachable.
    Connected,
    /// Registered before, its lane is gone.
    Disconnected,
    /// Only an operator settings record exists; the worker never registered.
    Unregistered,
}

impl WorkerState {
    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            WorkerState::Connected => "connected",
            WorkerState::Disconnected => "disconnected",
            WorkerState::Unregistered => "unregistered",
        }
    }
}

/// Where a worker runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Executor {
    /// In the control process (`sortie serve`).
    Local,
    /// A `sortie worker` over the bus.
    Remote,
}

impl Executor {
    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Executor::Local => "local",
            Executor::Remote => "remote",
        }
    }
}

/// A set of ingress modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IngressSet(u8);

impl IngressSet {
    /// Every mode.
    pub const ALL: IngressSet = IngressSet(0b111);

    const fn bit(i: Ingress) -> u8 {
        match i {
            Ingress::Api => 1,
            Ingress::Proxy => 2,
            Ingress::Connect => 4,
        }
    }

    /// The set a worker serves from what it advertised: nothing advertised means every mode.
    pub fn from_advertised(modes: &[Ingress]) -> IngressSet {
        let bits = modes.iter().fold(0u8, |acc, &m| acc | IngressSet::bit(m));
        if bits == 0 {
            IngressSet::ALL
        } else {
            IngressSet(bits)
        }
    }

    /// Whether the set holds `mode`.
    pub const fn contains(self, mode: Ingress) -> bool {
        self.0 & IngressSet::bit(mode) != 0
    }

    /// The modes in the set, in the order api, proxy, connect.
    pub fn iter(self) -> impl Iterator<Item = Ingress> {
        Ingress::ALL.into_iter().filter(move |&m| self.contains(m))
    }
}

/// Why advertised capabilities were refused at admission.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct CapabilityError {
    /// The capability field, such as `tags[3]`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn cap_err(field: impl Into<String>, message: impl Into<String>) -> CapabilityError {
    CapabilityError {
        field: field.into(),
        message: message.into(),
    }
}

/// Capabilities as a worker advertises them (hello frame) or as the config declares them for a
/// local worker: unchecked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdvertisedCapabilities {
    /// Tags; a request's tags must all be among them.
    pub tags: Vec<String>,
    /// Country code, any case.
    pub country: Option<String>,
    /// Region.
    pub region: Option<String>,
    /// IP type.
    pub ip_type: Option<String>,
    /// Ingress mode names; empty means all.
    pub ingress: Vec<String>,
    /// Pool ids; empty means [`DEFAULT_POOL`].
    pub pools: Vec<String>,
    /// Fingerprint profile names that passed the worker's self-test.
    pub fingerprint_profiles: Vec<String>,
    /// Most concurrent requests.
    pub capacity: u32,
}

/// What the control's configuration grants one worker (`[[control.bus.workers]]`, decision
/// 105): most concurrent requests, and the pools and tags it may claim (`None`: any).
#[derive(Debug, Clone, Copy, Default)]
pub struct WorkerGrant<'a> {
    /// Most concurrent requests the control lets it take.
    pub max_capacity: Option<u32>,
    /// The pools it may serve.
    pub pools: Option<&'a [String]>,
    /// The tags it may advertise.
    pub tags: Option<&'a [String]>,
}

impl AdvertisedCapabilities {
    /// Holds what a worker advertises to what the control grants it (decision 105): a capacity
    /// above the grant is clipped to it (the worker still serves, at the granted bound); a pool
    /// or tag outside the grant refuses the worker, naming it, since routing by a claim the
    /// control never made would send it requests it may not take.
    pub fn apply_grant(&mut self, grant: &WorkerGrant<'_>) -> Result<(), CapabilityError> {
        if let Some(max) = grant.max_capacity {
            self.capacity = self.capacity.min(max);
        }
        if let Some(pools) = grant.pools {
            let claimed: Vec<&str> = if self.pools.is_empty() {
                vec![DEFAULT_POOL]
            } else {
                self.pools.iter().map(String::as_str).collect()
            };
            if let Some(p) = claimed.iter().find(|p| !pools.iter().any(|g| g == *p)) {
                return Err(cap_err(
                    "pools",
                    format!("pool {p:?} is not granted to this worker"),
                ));
            }
        }
        if let Some(tags) = grant.tags {
            if let Some(t) = self.tags.iter().find(|t| !tags.contains(t)) {
                return Err(cap_err(
                    "tags",
                    format!("tag {t:?} is not granted to this worker"),
                ));
            }
        }
        Ok(())
    }
}

fn claim(field: &str, s: String, max: usize) -> Result<Box<str>, CapabilityError> {
    if s.is_empty() {
        return Err(cap_err(field, "must not be empty"));
    }
    if s.len() > max {
        return Err(cap_err(field, format!("must be at most {max} bytes")));
    }
    Ok(s.into_boxed_str())
}

impl AdvertisedCapabilities {
    /// Admission check: every claim within the limits a request hint has (spec, Routing
    /// object), ids in the identifier grammar, capacity `1..=MAX_WORKER_CAPACITY`.
    pub fn validate(self) -> Result<WorkerCapabilities, CapabilityError> {
        if self.tags.len() > MAX_WORKER_TAGS {
            return Err(cap_err("tags", format!("at most {MAX_WORKER_TAGS} tags")));
        }
        let mut tags = Vec::with_capacity(self.tags.len());
        for (i, t) in self.tags.into_iter().enumerate() {
            tags.push(claim(
                &format!("tags[{i}]"),
                t,
                limits::MAX_ROUTING_TAG_BYTES,
            )?);
        }
        tags.sort();
        let before = tags.len();
        tags.dedup();
        if tags.len() != before {
            return Err(cap_err("tags", "tags must be unique"));
        }
        let country = match self.country {
            None => None,
            Some(c) => Some(
                CountryCode::parse(&c)
                    .ok_or_else(|| cap_err("country", "not an assigned ISO 3166-1 alpha-2 code"))?,
            ),
        };
        let region = self
            .region
            .map(|r| claim("region", r, limits::MAX_ROUTING_FIELD_BYTES))
            .transpose()?;
        let ip_type = self
            .ip_type
            .map(|t| claim("ip_type", t, limits::MAX_ROUTING_FIELD_BYTES))
            .transpose()?;
        let mut modes = Vec::with_capacity(self.ingress.len());
        for (i, m) in self.ingress.iter().enumerate() {
            modes.push(Ingress::from_wire(m).ok_or_else(|| {
                cap_err(
                    format!("ingress[{i}]"),
                    "must be one of api, proxy, connect",
                )
            })?);
        }
        if self.pools.len() > MAX_WORKER_POOLS {
            return Err(cap_err(
                "pools",
                format!("at most {MAX_WORKER_POOLS} pools"),
            ));
        }
        let mut pools = Vec::with_capacity(self.pools.len().max(1));
        for (i, p) in self.pools.iter().enumerate() {
            let id =
                ConfigId::parse(p).map_err(|e| cap_err(format!("pools[{i}]"), e.to_string()))?;
            if pools.contains(&id) {
                return Err(cap_err(format!("pools[{i}]"), "pool listed twice"));
            }
            pools.push(id);
        }
        if pools.is_empty() {
            pools.push(ConfigId::parse(DEFAULT_POOL).map_err(|e| cap_err("pools", e.to_string()))?);
        }
        if self.fingerprint_profiles.len() > MAX_WORKER_PROFILES {
            return Err(cap_err(
                "fingerprint_profiles",
                format!("at most {MAX_WORKER_PROFILES} profiles"),
            ));
        }
        let mut profiles = Vec::with_capacity(self.fingerprint_profiles.len());
        for (i, p) in self.fingerprint_profiles.into_iter().enumerate() {
            profiles.push(claim(
                &format!("fingerprint_profiles[{i}]"),
                p,
                limits::MAX_PROFILE_NAME_BYTES,
            )?);
        }
        profiles.sort();
        profiles.dedup();
        if !(1..=MAX_WORKER_CAPACITY).contains(&self.capacity) {
            return Err(cap_err(
                "capacity",
                format!("must be 1..={MAX_WORKER_CAPACITY}"),
            ));
        }
        Ok(WorkerCapabilities {
            tags,
            country,
            region,
            ip_type,
            ingress: IngressSet::from_advertised(&modes),
            pools,
            fingerprint_profiles: profiles,
            max_capacity: self.capacity,
        })
    }
}

/// Capabilities that passed admission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCapabilities {
    tags: Vec<Box<str>>,
    country: Option<CountryCode>,
    region: Option<Box<str>>,
    ip_type: Option<Box<str>>,
    ingress: IngressSet,
    pools: Vec<ConfigId>,
    fingerprint_profiles: Vec<Box<str>>,
    max_capacity: u32,
}

impl WorkerCapabilities {
    /// Tags, sorted and unique.
    pub fn tags(&self) -> &[Box<str>] {
        &self.tags
    }

    /// Whether the worker advertises exactly this tag.
    pub fn has_tag(&self, tag: &str) -> bool {
        self.tags.binary_search_by(|t| (**t).cmp(tag)).is_ok()
    }

    /// Country claim.
    pub fn country(&self) -> Option<CountryCode> {
        self.country
    }

    /// Region claim.
    pub fn region(&self) -> Option<&str> {
        self.region.as_deref()
    }

    /// IP type claim.
    pub fn ip_type(&self) -> Option<&str> {
        self.ip_type.as_deref()
    }

    /// Ingress modes served.
    pub fn ingress(&self) -> IngressSet {
        self.ingress
    }

    /// Pools the worker belongs to; never empty.
    pub fn pools(&self) -> &[ConfigId] {
        &self.pools
    }

    /// Whether the worker belongs to the pool.
    pub fn serves_pool(&self, pool: &str) -> bool {
        self.pools.iter().any(|p| p.as_str() == pool)
    }

    /// Fingerprint profiles, sorted and unique.
    pub fn fingerprint_profiles(&self) -> &[Box<str>] {
        &self.fingerprint_profiles
    }

    /// Whether the worker advertises this profile, by exact, case-sensitive name (decision 017).
    pub fn advertises_profile(&self, name: &str) -> bool {
        self.fingerprint_profiles
            .binary_search_by(|p| (**p).cmp(name))
            .is_ok()
    }

    /// Most concurrent requests.
    pub fn max_capacity(&self) -> u32 {
        self.max_capacity
    }
}

/// Operator settings of a worker, persisted per worker id; `revision` is its ETag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WorkerSettings {
    /// Cleared by `disable`, set by `enable`.
    pub is_enabled: bool,
    /// Set by `drain`, cleared by `undrain`.
    pub is_draining: bool,
    /// Bumped by every action; 0 when no settings record exists yet (decision 017).
    pub revision: u64,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        WorkerSettings {
            is_enabled: true,
            is_draining: false,
            revision: 0,
        }
    }
}

/// An admin action on a worker (`POST /api/v1/admin/workers/{worker_id}/{action}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkerAction {
    /// Stop assigning new requests; in-flight ones finish.
    Drain,
    /// Resume assigning.
    Undrain,
    /// Exclude from routing.
    Disable,
    /// Include in routing again.
    Enable,
}

impl WorkerAction {
    /// Every action.
    pub const ALL: [WorkerAction; 4] = [
        WorkerAction::Drain,
        WorkerAction::Undrain,
        WorkerAction::Disable,
        WorkerAction::Enable,
    ];

    /// The path segment.
    pub const fn as_str(self) -> &'static str {
        match self {
            WorkerAction::Drain => "drain",
            WorkerAction::Undrain => "undrain",
            WorkerAction::Disable => "disable",
            WorkerAction::Enable => "enable",
        }
    }

    /// Parses a path segment; anything else is the admin API's "unknown action" (400).
    pub fn from_wire(s: &str) -> Option<WorkerAction> {
        WorkerAction::ALL.into_iter().find(|a| a.as_str() == s)
    }

    /// Applies the action's flag change to settings (the revision is the caller's business).
    pub fn apply(self, s: &mut WorkerSettings) {
        match self {
            WorkerAction::Drain => s.is_draining = true,
            WorkerAction::Undrain => s.is_draining = false,
            WorkerAction::Disable => s.is_enabled = false,
            WorkerAction::Enable => s.is_enabled = true,
        }
    }
}

/// The `capacity` object of a worker list item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacitySummary {
    /// Requests in flight.
    pub active: u32,
    /// `max - active`, never negative.
    pub available: u32,
    /// Advertised capacity; 0 for a worker that never registered.
    pub max: u32,
}

/// One worker as the registry knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerRecord {
    id: ConfigId,
    session: Option<Box<str>>,
    executor: Executor,
    state: WorkerState,
    capabilities: Option<WorkerCapabilities>,
    settings: WorkerSettings,
    last_seen_unix_ms: Option<u64>,
}

impl WorkerRecord {
    /// A connected worker with default settings: the form local executors and tests use.
    pub fn connected(
        id: ConfigId,
        session: &str,
        executor: Executor,
        capabilities: WorkerCapabilities,
    ) -> WorkerRecord {
        WorkerRecord {
            id,
            session: Some(session.into()),
            executor,
            state: WorkerState::Connected,
            capabilities: Some(capabilities),
            settings: WorkerSettings::default(),
            last_seen_unix_ms: None,
        }
    }

    fn unregistered(id: ConfigId, settings: WorkerSettings) -> WorkerRecord {
        WorkerRecord {
            id,
            session: None,
            executor: Executor::Remote,
            state: WorkerState::Unregistered,
            capabilities: None,
            settings,
            last_seen_unix_ms: None,
        }
    }

    /// The same record with other settings.
    pub fn with_settings(mut self, settings: WorkerSettings) -> WorkerRecord {
        self.settings = settings;
        self
    }

    /// The same record in another state.
    pub fn with_state(mut self, state: WorkerState) -> WorkerRecord {
        self.state = state;
        self
    }

    /// Worker id.
    pub fn id(&self) -> &ConfigId {
        &self.id
    }

    /// Session of the current or last registration.
    pub fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }

    /// Local or remote.
    pub fn executor(&self) -> Executor {
        self.executor
    }

    /// Connection state.
    pub fn state(&self) -> WorkerState {
        self.state
    }

    /// Capabilities of the current or last registration.
    pub fn capabilities(&self) -> Option<&WorkerCapabilities> {
        self.capabilities.as_ref()
    }

    /// Operator settings.
    pub fn settings(&self) -> WorkerSettings {
        self.settings
    }

    /// Whether the worker is enabled.
    pub fn is_enabled(&self) -> bool {
        self.settings.is_enabled
    }

    /// Whether the worker is draining.
    pub fn is_draining(&self) -> bool {
        self.settings.is_draining
    }

    /// Last registration or disconnect, in Unix milliseconds as the IO layer observed it (a
    /// connected remote worker's heartbeats are kept beside it, in the IO layer).
    pub fn last_seen_unix_ms(&self) -> Option<u64> {
        self.last_seen_unix_ms
    }

    /// Whether routing may assign new requests to the worker: connected, registered, enabled
    /// and not draining.
    pub fn is_routable(&self) -> bool {
        self.state == WorkerState::Connected
            && self.capabilities.is_some()
            && self.settings.is_enabled
            && !self.settings.is_draining
    }

    /// The list item's capacity given the live active count.
    pub fn capacity(&self, active: u32) -> CapacitySummary {
        let max = self.capabilities.as_ref().map_or(0, |c| c.max_capacity);
        CapacitySummary {
            active,
            available: max.saturating_sub(active),
            max,
        }
    }
}

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// The worker id is not in the identifier grammar.
    #[error("worker id: {0}")]
    InvalidId(IdError),
    /// The session is empty, too long, or not visible ASCII.
    #[error("session must be 1..=128 bytes of visible ASCII")]
    InvalidSession,
    /// A remote worker claimed the id of a local executor, or the reverse.
    #[error("worker id is taken by a {} executor", .0.as_str())]
    ExecutorMismatch(Executor),
}

/// Why an admin action was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    /// The worker id is not in the identifier grammar.
    #[error("worker id: {0}")]
    InvalidId(IdError),
    /// `If-Match` named another revision (409 `revision_conflict`).
    #[error("revision conflict: current revision is {current}")]
    RevisionConflict {
        /// The revision the next attempt must carry.
        current: u64,
    },
    /// The id is unknown and [`MAX_UNREGISTERED_WORKERS`] unregistered workers already have
    /// settings records.
    #[error("at most {limit} workers that never registered may have settings")]
    TooManyUnregistered {
        /// The bound.
        limit: usize,
    },
}

/// All workers known to one control instance, ordered by worker id.
#[derive(Debug, Clone, Default)]
pub struct WorkerRegistry {
    workers: BTreeMap<ConfigId, WorkerRecord>,
}

impl WorkerRegistry {
    /// An empty registry.
    pub fn new() -> WorkerRegistry {
        WorkerRegistry::default()
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether there is no record.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// The record of a worker.
    pub fn get(&self, id: &str) -> Option<&WorkerRecord> {
        self.workers.get(id)
    }

    /// Records ordered by worker id, as the worker list shows them and as routing tables index
    /// them.
    pub fn iter(&self) -> impl Iterator<Item = &WorkerRecord> {
        self.workers.values()
    }

    /// Loads persisted settings at startup. A worker that has not registered yet is listed as
    /// `unregistered` and is not routable.
    pub fn restore_settings(&mut self, id: ConfigId, settings: WorkerSettings) {
        self.set_settings(id, settings);
    }

    /// Registers (or re-registers) a worker. Operator settings survive re-registration. A new
    /// session replaces the previous one, which is returned so the IO layer can close that
    /// lane: the newest registration of an id wins.
    pub fn register(
        &mut self,
        id: &str,
        session: &str,
        executor: Executor,
        capabilities: WorkerCapabilities,
        now_unix_ms: u64,
    ) -> Result<Option<Box<str>>, RegisterError> {
        let id = ConfigId::parse(id).map_err(RegisterError::InvalidId)?;
        if session.is_empty()
            || session.len() > MAX_SESSION_BYTES
            || !session.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(RegisterError::InvalidSession);
        }
        let record = self
            .workers
            .entry(id.clone())
            .or_insert_with(|| WorkerRecord::unregistered(id, WorkerSettings::default()));
        if record.state != WorkerState::Unregistered && record.executor != executor {
            return Err(RegisterError::ExecutorMismatch(record.executor));
        }
        let previous = match record.session.take() {
            Some(s) if record.state == WorkerState::Connected && &*s != session => Some(s),
            _ => None,
        };
        record.session = Some(session.into());
        record.executor = executor;
        record.state = WorkerState::Connected;
        record.capabilities = Some(capabilities);
        record.last_seen_unix_ms = Some(now_unix_ms);
        Ok(previous)
    }

    /// Marks the worker disconnected when `session` is its current session; the disconnect of a
    /// superseded session is ignored, so a quick reconnect is not undone by the old lane closing.
    pub fn disconnect(&mut self, id: &str, session: &str, now_unix_ms: u64) -> bool {
        match self.workers.get_mut(id) {
            Some(r)
                if r.state == WorkerState::Connected && r.session.as_deref() == Some(session) =>
            {
                r.state = WorkerState::Disconnected;
                r.last_seen_unix_ms = Some(now_unix_ms);
                true
            }
            _ => false,
        }
    }

    /// Applies an admin action under optimistic concurrency: `if_match` must equal the worker's
    /// settings revision (0 for a worker without a settings record, decision 017). A worker id
    /// that is unknown gets a settings record and is listed as `unregistered`, within
    /// [`MAX_UNREGISTERED_WORKERS`].
    pub fn apply_action(
        &mut self,
        id: &str,
        action: WorkerAction,
        if_match: u64,
    ) -> Result<&WorkerRecord, ActionError> {
        let id = ConfigId::parse(id).map_err(ActionError::InvalidId)?;
        let next = self.plan_action(&id, action, if_match)?;
        Ok(self.set_settings(id, next))
    }

    /// The settings an admin action would give the worker, with the revision moved on, without
    /// changing anything: the caller commits them to the store, then applies them with
    /// [`WorkerRegistry::set_settings`], which cannot fail. Checks the revision and the bound
    /// on unregistered workers.
    pub fn plan_action(
        &self,
        id: &ConfigId,
        action: WorkerAction,
        if_match: u64,
    ) -> Result<WorkerSettings, ActionError> {
        let record = self.workers.get(id.as_str());
        let mut next = record.map(|r| r.settings).unwrap_or_default();
        if next.revision != if_match {
            return Err(ActionError::RevisionConflict {
                current: next.revision,
            });
        }
        if record.is_none() && self.unregistered_count() >= MAX_UNREGISTERED_WORKERS {
            return Err(ActionError::TooManyUnregistered {
                limit: MAX_UNREGISTERED_WORKERS,
            });
        }
        action.apply(&mut next);
        next.revision = if_match.saturating_add(1);
        Ok(next)
    }

    /// Sets a worker's settings as committed to the store; an unknown id gets a record listed
    /// as `unregistered`.
    pub fn set_settings(&mut self, id: ConfigId, settings: WorkerSettings) -> &WorkerRecord {
        self.workers
            .entry(id.clone())
            .and_modify(|r| r.settings = settings)
            .or_insert_with(|| WorkerRecord::unregistered(id, settings))
    }

    /// Forgets the remote workers disconnected for at least `after_ms` at `now_unix_ms`, and
    /// returns their ids. A worker with operator settings (an admin action was applied to it)
    /// keeps them, listed as `unregistered` as after a restart, so a disabled worker that comes
    /// back is still disabled; one without is removed. Connected and local workers stay.
    pub fn forget_disconnected(&mut self, now_unix_ms: u64, after_ms: u64) -> Vec<ConfigId> {
        let is_gone = |r: &WorkerRecord| {
            r.state == WorkerState::Disconnected
                && r.executor == Executor::Remote
                && r.last_seen_unix_ms
                    .is_some_and(|seen| now_unix_ms.saturating_sub(seen) >= after_ms)
        };
        let gone: Vec<ConfigId> = self
            .workers
            .values()
            .filter(|r| is_gone(r))
            .map(|r| r.id.clone())
            .collect();
        for id in &gone {
            let keeps_settings = self
                .workers
                .get(id.as_str())
                .is_some_and(|r| r.settings.revision != 0);
            if keeps_settings {
                if let Some(r) = self.workers.get_mut(id.as_str()) {
                    *r = WorkerRecord::unregistered(id.clone(), r.settings);
                }
            } else {
                self.workers.remove(id.as_str());
            }
        }
        gone
    }

    /// Workers listed as `unregistered`: settings records without a registration.
    pub fn unregistered_count(&self) -> usize {
        self.workers
            .values()
            .filter(|r| r.state == WorkerState::Unregistered)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Disconnected remote workers are forgotten after the bound; settings outlive the record.
    #[test]
    fn disconnected_workers_are_forgotten_after_the_bound_keeping_their_settings() {
        let caps = || {
            AdvertisedCapabilities {
                capacity: 4,
                ..AdvertisedCapabilities::default()
            }
            .validate()
            .unwrap()
        };
        let mut reg = WorkerRegistry::new();
        for id in ["gone", "disabled", "recent", "connected"] {
            reg.register(id, "s1", Executor::Remote, caps(), 1_000)
                .unwrap();
        }
        reg.register("local", "l", Executor::Local, caps(), 1_000)
            .unwrap();
        reg.apply_action("disabled", WorkerAction::Disable, 0)
            .unwrap();
        assert!(reg.disconnect("gone", "s1", 2_000));
        assert!(reg.disconnect("disabled", "s1", 2_000));
        assert!(reg.disconnect("recent", "s1", 5_000));
        // Not yet: the bound counts from the disconnect.
        assert!(reg.forget_disconnected(2_999, 1_000).is_empty());
        let gone = reg.forget_disconnected(3_000, 1_000);
        let gone: Vec<&str> = gone.iter().map(ConfigId::as_str).collect();
        assert_eq!(gone, ["disabled", "gone"]);
        assert!(reg.get("gone").is_none());
        let d = reg.get("disabled").unwrap();
        assert_eq!(d.state(), WorkerState::Unregistered);
        assert!(!d.is_enabled());
        assert!(d.capabilities().is_none() && d.session().is_none());
        for id in ["recent", "connected", "local"] {
            assert!(reg.get(id).is_some(), "{id}");
        }
        // The disabled worker comes back disabled.
        reg.register("disabled", "s2", Executor::Remote, caps(), 9_000)
            .unwrap();
        let d = reg.get("disabled").unwrap();
        assert_eq!(d.state(), WorkerState::Connected);
        assert!(!d.is_enabled() && !d.is_routable());
    }

    /// A grant clips capacity and refuses pools and tags beyond it (decision 105).
    #[test]
    fn a_grant_clips_capacity_and_refuses_claims_beyond_it() {
        let pools = vec!["direct".to_string(), "acme".to_string()];
        let tags = vec!["fast".to_string()];
        let grant = WorkerGrant {
            max_capacity: Some(8),
            pools: Some(&pools),
            tags: Some(&tags),
        };
        let mut a = AdvertisedCapabilities {
            capacity: 100,
            tags: vec!["fast".into()],
            ..Default::default()
        };
        a.apply_grant(&grant).unwrap();
        assert_eq!(a.capacity, 8);
        let mut low = AdvertisedCapabilities {
            capacity: 3,
            pools: vec!["acme".into()],
            ..Default::default()
        };
        low.apply_grant(&grant).unwrap();
        assert_eq!(low.capacity, 3);
        let mut greedy = AdvertisedCapabilities {
            pools: vec!["other".into()],
            ..Default::default()
        };
        assert_eq!(greedy.apply_grant(&grant).unwrap_err().field, "pools");
        let mut tagged = AdvertisedCapabilities {
            tags: vec!["slow".into()],
            ..Default::default()
        };
        assert_eq!(tagged.apply_grant(&grant).unwrap_err().field, "tags");
        // No pools claimed means the default pool, which must be granted too.
        let only_acme = vec!["acme".to_string()];
        let mut default_pool = AdvertisedCapabilities::default();
        let g = WorkerGrant {
            pools: Some(&only_acme),
            ..Default::default()
        };
        assert!(default_pool.apply_grant(&g).is_err());
        let mut any = AdvertisedCapabilities::default();
        assert!(any.apply_grant(&WorkerGrant::default()).is_ok());
    }

    fn caps(tags: &[&str]) -> AdvertisedCapabilities {
        AdvertisedCapabilities {
            tags: tags.iter().map(|t| t.to_string()).collect(),
            capacity: 4,
            ..Default::default()
        }
    }

    #[test]
    fn admission_normalises() {
        let c = AdvertisedCapabilities {
            tags: vec!["b".into(), "a".into()],
            country: Some("us".into()),
            region: Some("us-east".into()),
            ip_type: Some("residential".into()),
            ingress: vec!["proxy".into(), "connect".into()],
            pools: vec!["acme-us".into()],
            fingerprint_profiles: vec!["chrome_131".into(), "chrome_131".into()],
            capacity: 8,
        }
        .validate()
        .unwrap();
        assert_eq!(c.tags(), &["a".into(), "b".into()] as &[Box<str>]);
        assert!(c.has_tag("a") && !c.has_tag("A"));
        assert_eq!(c.country().unwrap().as_str(), "US");
        assert!(!c.ingress().contains(Ingress::Api));
        assert_eq!(
            c.ingress().iter().collect::<Vec<_>>(),
            [Ingress::Proxy, Ingress::Connect]
        );
        assert!(c.serves_pool("acme-us") && !c.serves_pool("direct"));
        assert!(c.advertises_profile("chrome_131") && !c.advertises_profile("Chrome_131"));
        assert_eq!(c.fingerprint_profiles().len(), 1);
        assert_eq!(c.max_capacity(), 8);
    }

    #[test]
    fn admission_defaults() {
        let c = caps(&[]).validate().unwrap();
        assert_eq!(c.ingress(), IngressSet::ALL);
        assert_eq!(c.pools(), &[ConfigId::parse("direct").unwrap()]);
        assert!(c.country().is_none() && c.region().is_none() && c.ip_type().is_none());
    }

    #[test]
    fn admission_rejects() {
        let long_tag = "t".repeat(65);
        let many_tags: Vec<String> = (0..=MAX_WORKER_TAGS).map(|i| format!("t{i}")).collect();
        let cases: Vec<(AdvertisedCapabilities, &str)> = vec![
            (
                AdvertisedCapabilities {
                    capacity: 0,
                    ..caps(&[])
                },
                "capacity",
            ),
            (
                AdvertisedCapabilities {
                    capacity: MAX_WORKER_CAPACITY + 1,
                    ..caps(&[])
                },
                "capacity",
            ),
            (caps(&["a", "a"]), "tags"),
            (caps(&[""]), "tags[0]"),
            (caps(&["ok", long_tag.as_str()]), "tags[1]"),
            (
                AdvertisedCapabilities {
                    tags: many_tags,
                    ..caps(&[])
                },
                "tags",
            ),
            (
                AdvertisedCapabilities {
                    country: Some("XX".into()),
                    ..caps(&[])
                },
                "country",
            ),
            (
                AdvertisedCapabilities {
                    region: Some(String::new()),
                    ..caps(&[])
                },
                "region",
            ),
            (
                AdvertisedCapabilities {
                    ip_type: Some("x".repeat(129)),
                    ..caps(&[])
                },
                "ip_type",
            ),
            (
                AdvertisedCapabilities {
                    ingress: vec!["api".into(), "API".into()],
                    ..caps(&[])
                },
                "ingress[1]",
            ),
            (
                AdvertisedCapabilities {
                    pools: vec!["a b".into()],
                    ..caps(&[])
                },
                "pools[0]",
            ),
            (
                AdvertisedCapabilities {
                    pools: vec!["a".into(), "a".into()],
                    ..caps(&[])
                },
                "pools[1]",
            ),
            (
                AdvertisedCapabilities {
                    fingerprint_profiles: vec!["x".repeat(65)],
                    ..caps(&[])
                },
                "fingerprint_profiles[0]",
            ),
        ];
        for (c, field) in cases {
            assert_eq!(c.clone().validate().unwrap_err().field, field, "{c:?}");
        }
    }

    #[test]
    fn registration_lifecycle() {
        let mut reg = WorkerRegistry::new();
        let c = caps(&["a"]).validate().unwrap();
        assert_eq!(
            reg.register("w1", "s1", Executor::Remote, c.clone(), 10),
            Ok(None)
        );
        let r = reg.get("w1").unwrap();
        assert_eq!(r.state(), WorkerState::Connected);
        assert!(r.is_routable());
        assert_eq!(r.last_seen_unix_ms(), Some(10));
        // A new session supersedes the old one; the old lane's disconnect is then ignored.
        assert_eq!(
            reg.register("w1", "s2", Executor::Remote, c.clone(), 40),
            Ok(Some("s1".into()))
        );
        assert!(!reg.disconnect("w1", "s1", 50));
        assert_eq!(reg.get("w1").unwrap().state(), WorkerState::Connected);
        assert!(reg.disconnect("w1", "s2", 60));
        let r = reg.get("w1").unwrap();
        assert_eq!(r.state(), WorkerState::Disconnected);
        assert!(!r.is_routable());
        // Reconnecting after a disconnect supersedes nothing.
        assert_eq!(
            reg.register("w1", "s3", Executor::Remote, c.clone(), 70),
            Ok(None)
        );
        assert_eq!(
            reg.register("w1", "s4", Executor::Local, c.clone(), 80),
            Err(RegisterError::ExecutorMismatch(Executor::Remote))
        );
        assert!(matches!(
            reg.register("bad id", "s", Executor::Remote, c.clone(), 0),
            Err(RegisterError::InvalidId(_))
        ));
        for bad in ["", "a b", &"s".repeat(129)] {
            assert_eq!(
                reg.register("w2", bad, Executor::Remote, c.clone(), 0),
                Err(RegisterError::InvalidSession)
            );
        }
    }

    #[test]
    fn actions_use_per_worker_revisions() {
        let mut reg = WorkerRegistry::new();
        let c = caps(&[]).validate().unwrap();
        reg.register("w1", "s", Executor::Remote, c.clone(), 0)
            .unwrap();
        assert_eq!(
            reg.apply_action("w1", WorkerAction::Drain, 1).unwrap_err(),
            ActionError::RevisionConflict { current: 0 }
        );
        let r = reg.apply_action("w1", WorkerAction::Drain, 0).unwrap();
        assert!(r.is_draining() && !r.is_routable());
        assert_eq!(r.settings().revision, 1);
        let r = reg.apply_action("w1", WorkerAction::Disable, 1).unwrap();
        assert!(!r.is_enabled());
        let r = reg.apply_action("w1", WorkerAction::Undrain, 2).unwrap();
        assert!(!r.is_draining() && !r.is_routable());
        let r = reg.apply_action("w1", WorkerAction::Enable, 3).unwrap();
        assert!(r.is_routable());
        assert_eq!(r.settings().revision, 4);
        // Settings survive a re-registration.
        reg.apply_action("w1", WorkerAction::Drain, 4).unwrap();
        reg.register("w1", "s9", Executor::Remote, c.clone(), 0)
            .unwrap();
        assert!(reg.get("w1").unwrap().is_draining());
        assert_eq!(reg.get("w1").unwrap().settings().revision, 5);
    }

    #[test]
    fn settings_only_workers_are_unregistered() {
        let mut reg = WorkerRegistry::new();
        let r = reg.apply_action("ghost", WorkerAction::Disable, 0).unwrap();
        assert_eq!(r.state(), WorkerState::Unregistered);
        assert_eq!(r.settings().revision, 1);
        assert!(!r.is_routable());
        assert_eq!(
            r.capacity(0),
            CapacitySummary {
                active: 0,
                available: 0,
                max: 0
            }
        );
        // Registering keeps the operator's choice.
        reg.register(
            "ghost",
            "s",
            Executor::Remote,
            caps(&[]).validate().unwrap(),
            5,
        )
        .unwrap();
        let r = reg.get("ghost").unwrap();
        assert_eq!(r.state(), WorkerState::Connected);
        assert!(!r.is_enabled() && !r.is_routable());
        assert!(matches!(
            reg.apply_action("a/b", WorkerAction::Enable, 0),
            Err(ActionError::InvalidId(_))
        ));
        reg.restore_settings(
            ConfigId::parse("persisted").unwrap(),
            WorkerSettings {
                is_enabled: true,
                is_draining: true,
                revision: 7,
            },
        );
        assert_eq!(
            reg.get("persisted").unwrap().state(),
            WorkerState::Unregistered
        );
        assert_eq!(
            reg.apply_action("persisted", WorkerAction::Undrain, 7)
                .unwrap()
                .settings(),
            WorkerSettings {
                is_enabled: true,
                is_draining: false,
                revision: 8
            }
        );
        let ids: Vec<&str> = reg.iter().map(|r| r.id().as_str()).collect();
        assert_eq!(ids, ["ghost", "persisted"]);
    }

    #[test]
    fn capacity_summary_saturates() {
        let r = WorkerRecord::connected(
            ConfigId::parse("w").unwrap(),
            "s",
            Executor::Local,
            caps(&[]).validate().unwrap(),
        );
        assert_eq!(
            r.capacity(1),
            CapacitySummary {
                active: 1,
                available: 3,
                max: 4
            }
        );
        assert_eq!(
            r.capacity(9),
            CapacitySummary {
                active: 9,
                available: 0,
                max: 4
            }
        );
    }

    #[test]
    fn names_round_trip() {
        for a in WorkerAction::ALL {
            assert_eq!(WorkerAction::from_wire(a.as_str()), Some(a));
        }
        assert_eq!(WorkerAction::from_wire("restart"), None);
        assert_eq!(WorkerState::Unregistered.as_str(), "unregistered");
        assert_eq!(Executor::Local.as_str(), "local");
        assert_eq!(IngressSet::from_advertised(&[]), IngressSet::ALL);
        assert_eq!(
            IngressSet::from_advertised(&[Ingress::Api]).iter().count(),
            1
        );
    }

    #[test]
    fn planning_changes_nothing_and_unknown_ids_are_bounded() {
        let mut reg = WorkerRegistry::new();
        let ghost = ConfigId::parse("ghost-0").unwrap();
        let next = reg.plan_action(&ghost, WorkerAction::Drain, 0).unwrap();
        assert!(next.is_draining && next.revision == 1);
        assert!(reg.is_empty());
        assert_eq!(
            reg.plan_action(&ghost, WorkerAction::Drain, 3),
            Err(ActionError::RevisionConflict { current: 0 })
        );
        for i in 0..MAX_UNREGISTERED_WORKERS {
            reg.apply_action(&format!("ghost-{i}"), WorkerAction::Drain, 0)
                .unwrap();
        }
        let over = ConfigId::parse("ghost-over").unwrap();
        assert_eq!(
            reg.plan_action(&over, WorkerAction::Drain, 0),
            Err(ActionError::TooManyUnregistered {
                limit: MAX_UNREGISTERED_WORKERS
            })
        );
        // A known id still moves on.
        assert!(reg.plan_action(&ghost, WorkerAction::Undrain, 1).is_ok());
    }
}
