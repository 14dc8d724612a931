//! The routing table: a validated snapshot joined with a point-in-time worker set, indexed so
//! that route selection costs what the hints leave to check rather than the number of workers.
//!
//! Per-request path: no locks, no IO, no logging; allocation only for the tag ids of a request
//! with tags and for a sticky pin key.
//!
//! Index: for every pool, the sorted indices of its routable workers, and an inverted index
//! from each advertised claim (tag, country, region, IP type) to the sorted indices of the
//! pool's routable workers that advertise it. A request scans the shortest list among its
//! hints and checks the remaining hints per candidate, so a rare tag narrows 10,000 workers to
//! a handful without touching the rest. Operator flags and connection state are folded in at
//! build time: the IO layer rebuilds the table whenever the registry or the snapshot changes,
//! and only the active counts are read live through a [`CapacityView`].

use std::cmp::Reverse;
use std::collections::HashMap;
use std::sync::Arc;

use crate::provider_session::{ProviderSession, ProviderSessionInputs};
use crate::rendezvous;
use crate::snapshot::{ConfigId, Pool, Rule, ValidatedSnapshot};
use crate::worker::{IngressSet, WorkerRecord};
use crate::FastMap;

use super::pins::{PinKey, StickyPins};
use super::{
    CapacityView, CountryCode, Ingress, RouteDecision, RouteError, RouteHints, RouteRequest,
    StickyOutcome, WorkerIndex,
};

/// A claim a worker advertises and a hint can ask for, with strings interned to ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Claim {
    Tag(u32),
    Country(CountryCode),
    Region(u32),
    IpType(u32),
}

/// The per-worker facts selection checks, packed for the scan.
#[derive(Debug, Clone)]
struct Facts {
    /// Interned tag ids, sorted.
    tags: Box<[u32]>,
    country: Option<CountryCode>,
    region: Option<u32>,
    ip_type: Option<u32>,
    ingress: IngressSet,
    max_capacity: u32,
    is_routable: bool,
    /// The worker id's rendezvous hash: where sticky sessions land (decision 097).
    rendezvous: u64,
}

/// The routable members of one pool.
#[derive(Debug, Clone, Default)]
struct PoolMembers {
    /// Every routable member, sorted by worker index.
    all: Vec<u32>,
    /// Claim to sorted member indices.
    by_claim: FastMap<Claim, Vec<u32>>,
}

/// A request's hints resolved against the table's interned claims.
#[derive(Debug)]
struct Wanted {
    tags: Vec<u32>,
    country: Option<CountryCode>,
    region: Option<u32>,
    ip_type: Option<u32>,
    ingress: Ingress,
}

/// How a pool's eligible workers with room are ranked.
#[derive(Debug, Clone, Copy)]
enum Ranking {
    /// The most available capacity; ties go to the first at or after this position of the
    /// candidate list (decision 007).
    MostRoom(u64),
    /// The highest rendezvous score of a sticky session's key, weighted by each worker's
    /// maximum capacity (decision 097).
    Rendezvous(u64),
}

/// What one pool offers a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PoolPick {
    /// No eligible worker: the next pool may be tried.
    NoEligible,
    /// Eligible workers exist and all are at capacity.
    Full,
    /// The eligible worker with the most available capacity.
    Chosen(u32),
}

/// Candidate lists up to this long are scanned whole for the most room; longer ones are
/// sampled first (decision 117).
pub const EXACT_SCAN_LIMIT: usize = 64;
/// Candidates drawn from a longer list; the most room among those eligible wins.
pub const ROOM_SAMPLE: usize = 8;

/// The `i`-th draw of a request's sample: SplitMix64 over the tie-break and the draw number,
/// so a request's draws are spread over the list and the next request's differ.
fn sample_draw(tie_break: u64, i: u64) -> u64 {
    let mut z = tie_break
        .wrapping_mul(ROOM_SAMPLE as u64)
        .wrapping_add(i)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Interns a string, returning its id.
fn intern(map: &mut FastMap<Box<str>, u32>, s: &str) -> u32 {
    if let Some(&id) = map.get(s) {
        return id;
    }
    let id = u32::try_from(map.len()).unwrap_or(u32::MAX);
    map.insert(s.into(), id);
    id
}

/// A snapshot's rules and pools joined with a worker set; see the module documentation.
#[derive(Debug, Clone)]
pub struct RoutingTable {
    snapshot: Arc<ValidatedSnapshot>,
    records: Vec<WorkerRecord>,
    facts: Vec<Facts>,
    by_id: FastMap<ConfigId, u32>,
    tag_ids: FastMap<Box<str>, u32>,
    region_ids: FastMap<Box<str>, u32>,
    ip_type_ids: FastMap<Box<str>, u32>,
    /// Aligned with `snapshot.pools()`.
    pools: Vec<PoolMembers>,
}

impl RoutingTable {
    /// Builds the table. Workers are indexed in iteration order (the registry iterates by
    /// worker id); a repeated worker id is ignored after its first record. Workers that are not
    /// routable are kept for lookups but are in no candidate list; pools a worker names that
    /// the snapshot does not define are ignored.
    pub fn build<'a>(
        snapshot: Arc<ValidatedSnapshot>,
        workers: impl IntoIterator<Item = &'a WorkerRecord>,
    ) -> RoutingTable {
        let pool_ids: HashMap<&str, usize> = snapshot
            .pools()
            .iter()
            .enumerate()
            .map(|(i, p)| (p.id().as_str(), i))
            .collect();
        let mut pools = vec![PoolMembers::default(); snapshot.pools().len()];
        let mut table_records = Vec::new();
        let mut facts = Vec::new();
        let mut by_id = FastMap::default();
        let mut tag_ids = FastMap::default();
        let mut region_ids = FastMap::default();
        let mut ip_type_ids = FastMap::default();
        for record in workers {
            let Ok(index) = u32::try_from(table_records.len()) else {
                break;
            };
            if by_id.contains_key(record.id()) {
                continue;
            }
            by_id.insert(record.id().clone(), index);
            let f = match record.capabilities() {
                None => Facts {
                    tags: Box::new([]),
                    country: None,
                    region: None,
                    ip_type: None,
                    ingress: IngressSet::ALL,
                    max_capacity: 0,
                    is_routable: false,
                    rendezvous: 0,
                },
                Some(c) => {
                    let mut tags: Vec<u32> =
                        c.tags().iter().map(|t| intern(&mut tag_ids, t)).collect();
                    tags.sort_unstable();
                    Facts {
                        tags: tags.into_boxed_slice(),
                        country: c.country(),
                        region: c.region().map(|r| intern(&mut region_ids, r)),
                        ip_type: c.ip_type().map(|t| intern(&mut ip_type_ids, t)),
                        ingress: c.ingress(),
                        max_capacity: c.max_capacity(),
                        is_routable: record.is_routable(),
                        rendezvous: rendezvous::stable_hash(&[record.id().as_str().as_bytes()]),
                    }
                }
            };
            if f.is_routable {
                let claims: Vec<Claim> = f
                    .tags
                    .iter()
                    .map(|&t| Claim::Tag(t))
                    .chain(f.country.map(Claim::Country))
                    .chain(f.region.map(Claim::Region))
                    .chain(f.ip_type.map(Claim::IpType))
                    .collect();
                let member_of = record.capabilities().map_or(&[][..], |c| c.pools());
                for pool in member_of.iter().filter_map(|p| pool_ids.get(p.as_str())) {
                    let Some(members) = pools.get_mut(*pool) else {
                        continue;
                    };
                    members.all.push(index);
                    for claim in &claims {
                        members.by_claim.entry(*claim).or_default().push(index);
                    }
                }
            }
            facts.push(f);
            table_records.push(record.clone());
        }
        RoutingTable {
            snapshot,
            records: table_records,
            facts,
            by_id,
            tag_ids,
            region_ids,
            ip_type_ids,
            pools,
        }
    }

    /// The snapshot the table was built from.
    pub fn snapshot(&self) -> &Arc<ValidatedSnapshot> {
        &self.snapshot
    }

    /// Number of workers in the table.
    pub fn worker_count(&self) -> usize {
        self.records.len()
    }

    /// The record of a worker.
    pub fn worker(&self, index: WorkerIndex) -> Option<&WorkerRecord> {
        self.records.get(index.as_usize())
    }

    /// The index of a worker id.
    pub fn worker_index(&self, id: &str) -> Option<WorkerIndex> {
        self.by_id.get(id).map(|&i| WorkerIndex(i))
    }

    /// The workers, in index order.
    pub fn workers(&self) -> &[WorkerRecord] {
        &self.records
    }

    /// The workers of pool `pool` (an index into the snapshot's pools) that are eligible for a
    /// request with these hints on this ingress, capacity aside. For diagnostics and tests;
    /// selection uses the same index.
    pub fn eligible_workers(
        &self,
        pool: usize,
        hints: &RouteHints,
        ingress: Ingress,
    ) -> Vec<WorkerIndex> {
        let Some(want) = self.resolve(hints, ingress) else {
            return Vec::new();
        };
        self.candidates(pool, &want)
            .iter()
            .filter(|&&w| self.is_eligible(w, &want))
            .map(|&w| WorkerIndex(w))
            .collect()
    }

    /// Selects a rule, a pool and a worker for a request (spec, Routing rules 1 to 7).
    ///
    /// The selected rule is the first in `(priority, id)` order whose configured constraints
    /// all match; its pools are tried in order and the next pool only when the earlier one has
    /// no eligible worker. Among eligible workers with room, the one with the most available
    /// capacity wins; ties go to the first at or after `tie_break` (modulo the candidate count)
    /// in index order (decision 007). A candidate list longer than [`EXACT_SCAN_LIMIT`] is
    /// sampled first: the most room among [`ROOM_SAMPLE`] drawn candidates, the whole list
    /// only when none of them is eligible with room (decision 117). A sticky session first tries its
    /// pinned worker (decision 008); without a usable pin, its worker is the eligible one with
    /// room that ranks highest by rendezvous hashing of `(deployment, session)`, so every control
    /// with the same workers chooses the same one (decision 097). The pin store is updated: new
    /// pins, sliding expiry, re-pins.
    pub fn route<C: CapacityView + ?Sized>(
        &self,
        req: &RouteRequest<'_>,
        pins: &mut StickyPins,
        now_ms: u64,
        capacity: &C,
    ) -> Result<RouteDecision, RouteError> {
        // Spec, Routing rules 1 and 2: ascending priority, first rule whose constraints match.
        let Some((rule_index, rule)) = self.snapshot.rules().iter().enumerate().find(|(_, r)| {
            super::matching::matches(r.constraints(), req.hints, req.ingress, req.host)
        }) else {
            return Err(RouteError::NoMatch);
        };
        let want = self.resolve(req.hints, req.ingress);
        let sticky_id = req
            .hints
            .sticky_session_id
            .as_deref()
            .filter(|s| !s.is_empty());
        let ttl_ms = u64::from(rule.sticky_session_ttl_seconds()).saturating_mul(1000);
        // Spec, Routing rule 4; a TTL of zero means the rule keeps no pins.
        let pin_key = match sticky_id {
            Some(s) if ttl_ms > 0 => Some(PinKey::new(req.deployment_id, s)),
            _ => None,
        };
        let mut outcome = StickyOutcome::NotSticky;
        if let Some(key) = &pin_key {
            outcome = StickyOutcome::NewPin;
            let pin = pins
                .lookup(key, now_ms)
                .filter(|p| &p.rule_id == rule.id())
                .cloned();
            if let Some(pin) = pin {
                let pinned = want
                    .as_ref()
                    .and_then(|w| self.pinned(&pin.worker_id, &pin.pool_id, rule, w));
                match pinned {
                    Some((pool, worker)) => {
                        if self.available(worker, capacity) > 0 {
                            pins.touch(key, now_ms, ttl_ms);
                            return self
                                .decision(
                                    req,
                                    rule_index,
                                    rule,
                                    pool,
                                    worker,
                                    StickyOutcome::Pinned,
                                )
                                .ok_or_else(|| RouteError::Unavailable {
                                    rule_id: rule.id().clone(),
                                });
                        }
                        // The pinned worker is there but full: without fallback the session's only
                        // eligible worker is at capacity, which is retryable.
                        if !rule.allows_sticky_fallback() {
                            return Err(RouteError::CapacityExhausted {
                                rule_id: rule.id().clone(),
                            });
                        }
                    }
                    None => {
                        if !rule.allows_sticky_fallback() {
                            return Err(RouteError::StickyUnavailable {
                                rule_id: rule.id().clone(),
                            });
                        }
                    }
                }
                outcome = StickyOutcome::Repinned;
            }
        }
        // Spec, Routing rule 3: a hint that no worker advertises leaves no eligible worker.
        let Some(want) = want else {
            return Err(RouteError::Unavailable {
                rule_id: rule.id().clone(),
            });
        };
        // Hashed only past the pinned fast path: a live pin costs no SHA-256 (decision 097).
        let ranking = match &pin_key {
            Some(_) => Ranking::Rendezvous(rendezvous::stable_hash(&[
                req.deployment_id.as_bytes(),
                sticky_id.unwrap_or_default().as_bytes(),
            ])),
            None => Ranking::MostRoom(req.tie_break),
        };
        for &pool in rule.pool_indices() {
            match self.pick(pool, &want, capacity, ranking) {
                PoolPick::NoEligible => continue,
                // Spec, Routing rule 5; decision 017: no fall-through to the next pool or rule.
                PoolPick::Full => {
                    return Err(RouteError::CapacityExhausted {
                        rule_id: rule.id().clone(),
                    })
                }
                PoolPick::Chosen(worker) => {
                    let Some(decision) =
                        self.decision(req, rule_index, rule, pool, worker, outcome)
                    else {
                        continue;
                    };
                    if let Some(key) = pin_key {
                        pins.pin(
                            key,
                            decision.rule_id.clone(),
                            decision.pool_id.clone(),
                            decision.worker_id.clone(),
                            now_ms,
                            ttl_ms,
                        );
                    }
                    return Ok(decision);
                }
            }
        }
        Err(RouteError::Unavailable {
            rule_id: rule.id().clone(),
        })
    }

    /// Resolves hints to interned claims; `None` when a hinted claim is advertised by no
    /// worker at all, so nothing can be eligible.
    fn resolve(&self, hints: &RouteHints, ingress: Ingress) -> Option<Wanted> {
        let mut tags = Vec::with_capacity(hints.tags.len());
        for t in &hints.tags {
            tags.push(*self.tag_ids.get(t.as_str())?);
        }
        let region = match &hints.region {
            None => None,
            Some(r) => Some(*self.region_ids.get(r.as_str())?),
        };
        let ip_type = match &hints.ip_type {
            None => None,
            Some(t) => Some(*self.ip_type_ids.get(t.as_str())?),
        };
        Some(Wanted {
            tags,
            country: hints.country,
            region,
            ip_type,
            ingress,
        })
    }

    /// The shortest candidate list of a pool for the wanted claims: every member when nothing
    /// is hinted, empty when some hinted claim has no member.
    fn candidates(&self, pool: usize, want: &Wanted) -> &[u32] {
        let Some(members) = self.pools.get(pool) else {
            return &[];
        };
        let claims = want
            .tags
            .iter()
            .map(|&t| Claim::Tag(t))
            .chain(want.country.map(Claim::Country))
            .chain(want.region.map(Claim::Region))
            .chain(want.ip_type.map(Claim::IpType));
        let mut shortest: &[u32] = &members.all;
        for claim in claims {
            match members.by_claim.get(&claim) {
                None => return &[],
                Some(list) if list.len() < shortest.len() => shortest = list,
                Some(_) => {}
            }
        }
        shortest
    }

    /// Whether a worker advertises every wanted claim and the ingress mode (spec, Routing rules
    /// 3 and 6) and is routable. Pool membership is the caller's to check.
    fn is_eligible(&self, worker: u32, want: &Wanted) -> bool {
        let Some(f) = self.facts.get(worker as usize) else {
            return false;
        };
        f.is_routable
            && f.ingress.contains(want.ingress)
            && want.country.is_none_or(|c| f.country == Some(c))
            && want.region.is_none_or(|r| f.region == Some(r))
            && want.ip_type.is_none_or(|t| f.ip_type == Some(t))
            && want.tags.iter().all(|t| f.tags.binary_search(t).is_ok())
    }

    fn available<C: CapacityView + ?Sized>(&self, worker: u32, capacity: &C) -> u32 {
        let max = self
            .facts
            .get(worker as usize)
            .map_or(0, |f| f.max_capacity);
        max.saturating_sub(capacity.active(WorkerIndex(worker)))
    }

    /// The eligible worker of `pool` with room that ranks highest; the first in candidate
    /// order (worker id order) among equals.
    fn pick<C: CapacityView + ?Sized>(
        &self,
        pool: usize,
        want: &Wanted,
        capacity: &C,
        ranking: Ranking,
    ) -> PoolPick {
        let list = self.candidates(pool, want);
        let n = list.len();
        if n == 0 {
            return PoolPick::NoEligible;
        }
        if let Ranking::MostRoom(tie_break) = ranking {
            if n > EXACT_SCAN_LIMIT {
                if let Some(w) = self.sampled_most_room(list, want, capacity, tie_break) {
                    return PoolPick::Chosen(w);
                }
                // No drawn candidate is eligible with room: the whole list decides, so that
                // `Full` and `NoEligible` stay exact.
            }
        }
        let mut any_eligible = false;
        // (position, worker, room) of every eligible candidate with room, in candidate order.
        let with_room = list
            .iter()
            .enumerate()
            .filter(|&(_, &w)| self.is_eligible(w, want))
            .inspect(|_| any_eligible = true)
            .filter_map(|(pos, &w)| {
                let room = self.available(w, capacity);
                (room > 0).then_some((pos, w, room))
            });
        let chosen = match ranking {
            Ranking::MostRoom(tie_break) => {
                // `n` fits in u64 and the remainder is below `n`, so neither conversion can
                // fail.
                let start =
                    usize::try_from(tie_break % u64::try_from(n).unwrap_or(u64::MAX)).unwrap_or(0);
                // Distance from the tie-break position, walking forward with wrap-around: the
                // nearer wins among equal room. Distances differ, so there is one maximum.
                with_room
                    .max_by_key(|&(pos, _, room)| {
                        let distance = if pos >= start {
                            pos - start
                        } else {
                            pos + (n - start)
                        };
                        (room, Reverse(distance))
                    })
                    .map(|(_, w, _)| w)
            }
            Ranking::Rendezvous(key) => self.rendezvous_choice(key, with_room.map(|(_, w, _)| w)),
        };
        match (chosen, any_eligible) {
            (Some(w), _) => PoolPick::Chosen(w),
            (None, true) => PoolPick::Full,
            (None, false) => PoolPick::NoEligible,
        }
    }

    /// The most room among [`ROOM_SAMPLE`] candidates drawn from a long list, the first drawn
    /// among equals; `None` when no drawn candidate is eligible with room (decision 117).
    fn sampled_most_room<C: CapacityView + ?Sized>(
        &self,
        list: &[u32],
        want: &Wanted,
        capacity: &C,
        tie_break: u64,
    ) -> Option<u32> {
        let n = u64::try_from(list.len()).unwrap_or(u64::MAX).max(1);
        let mut best: Option<(u32, u32)> = None;
        for i in 0..ROOM_SAMPLE as u64 {
            let pos = usize::try_from(sample_draw(tie_break, i) % n).unwrap_or(0);
            let Some(&w) = list.get(pos) else { continue };
            if !self.is_eligible(w, want) {
                continue;
            }
            let room = self.available(w, capacity);
            if room > best.map_or(0, |(_, r)| r) {
                best = Some((w, room));
            }
        }
        best.map(|(w, _)| w)
    }

    /// The highest weighted rendezvous score for `key` among `workers` (decision 097); the
    /// first among equal scores. Draws are compared directly between workers of equal capacity,
    /// so a pool of equal workers takes no logarithm.
    fn rendezvous_choice(&self, key: u64, workers: impl Iterator<Item = u32>) -> Option<u32> {
        // (worker, weight, draw, the score once computed) of the best so far.
        let mut best: Option<(u32, u32, u64, Option<f64>)> = None;
        for w in workers {
            let f = self.facts.get(w as usize);
            let weight = f.map_or(0, |f| f.max_capacity);
            let draw = rendezvous::draw(key, f.map_or(0, |f| f.rendezvous));
            let is_better = match &mut best {
                None => true,
                Some((_, best_weight, best_draw, _)) if *best_weight == weight => draw > *best_draw,
                Some((_, best_weight, best_draw, best_score)) => {
                    let b = *best_score
                        .get_or_insert_with(|| rendezvous::score(*best_draw, *best_weight));
                    rendezvous::score(draw, weight) > b
                }
            };
            if is_better {
                best = Some((w, weight, draw, None));
            }
        }
        best.map(|(w, ..)| w)
    }

    /// The pinned worker and its pool index, if it is still eligible for this rule and these
    /// hints in the pinned pool. Decision 008: a live pin keeps its pool even
    /// when an earlier pool of the rule has workers again.
    fn pinned(
        &self,
        worker_id: &ConfigId,
        pool_id: &ConfigId,
        rule: &Rule,
        want: &Wanted,
    ) -> Option<(usize, u32)> {
        let &worker = self.by_id.get(worker_id)?;
        let pools = self.snapshot.pools();
        let &pool = rule
            .pool_indices()
            .iter()
            .find(|&&p| pools.get(p).is_some_and(|p| p.id() == pool_id))?;
        let members = self.pools.get(pool)?;
        if members.all.binary_search(&worker).is_err() || !self.is_eligible(worker, want) {
            return None;
        }
        Some((pool, worker))
    }

    /// The decision for a chosen worker; `None` only if the indices were not built from this
    /// table, which selection never does.
    fn decision(
        &self,
        req: &RouteRequest<'_>,
        rule_index: usize,
        rule: &Rule,
        pool_index: usize,
        worker: u32,
        sticky: StickyOutcome,
    ) -> Option<RouteDecision> {
        let pool: &Pool = self.snapshot.pools().get(pool_index)?;
        let record = self.records.get(worker as usize)?;
        // Spec, Routing rule 7: only with a non-empty sticky id, a rule TTL above zero and a
        // pool behind an upstream proxy.
        let provider_session = match (
            req.hints.sticky_session_id.as_deref(),
            pool.upstream_proxy(),
        ) {
            (Some(sticky), Some(proxy))
                if !sticky.is_empty() && rule.sticky_session_ttl_seconds() > 0 =>
            {
                Some(ProviderSession::derive(&ProviderSessionInputs::from_hints(
                    req.deployment_id,
                    pool.id().as_str(),
                    proxy.id().as_str(),
                    req.hints,
                    sticky,
                )))
            }
            _ => None,
        };
        Some(RouteDecision {
            rule: rule_index,
            rule_id: rule.id().clone(),
            pool: pool_index,
            pool_id: pool.id().clone(),
            worker: WorkerIndex(worker),
            worker_id: record.id().clone(),
            sticky,
            provider_session,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::decode_snapshot;
    use crate::worker::{AdvertisedCapabilities, Executor, WorkerSettings, WorkerState};

    fn snapshot(json: &str) -> Arc<ValidatedSnapshot> {
        let mut buf = json.as_bytes().to_vec();
        Arc::new(decode_snapshot(&mut buf).unwrap())
    }

    /// A worker advertising `capacity`, pools and tags; other claims are set with the helpers.
    #[derive(Clone)]
    struct W {
        id: &'static str,
        caps: AdvertisedCapabilities,
        settings: WorkerSettings,
        state: WorkerState,
    }

    fn w(id: &'static str, pools: &[&str], capacity: u32) -> W {
        W {
            id,
            caps: AdvertisedCapabilities {
                pools: pools.iter().map(|p| p.to_string()).collect(),
                capacity,
                ..Default::default()
            },
            settings: WorkerSettings::default(),
            state: WorkerState::Connected,
        }
    }

    impl W {
        fn tags(mut self, tags: &[&str]) -> W {
            self.caps.tags = tags.iter().map(|t| t.to_string()).collect();
            self
        }
        fn country(mut self, c: &str) -> W {
            self.caps.country = Some(c.into());
            self
        }
        fn region(mut self, r: &str) -> W {
            self.caps.region = Some(r.into());
            self
        }
        fn ip_type(mut self, t: &str) -> W {
            self.caps.ip_type = Some(t.into());
            self
        }
        fn ingress(mut self, modes: &[&str]) -> W {
            self.caps.ingress = modes.iter().map(|m| m.to_string()).collect();
            self
        }
        fn draining(mut self) -> W {
            self.settings.is_draining = true;
            self
        }
        fn disabled(mut self) -> W {
            self.settings.is_enabled = false;
            self
        }
        fn state(mut self, s: WorkerState) -> W {
            self.state = s;
            self
        }
        fn record(&self) -> WorkerRecord {
            WorkerRecord::connected(
                ConfigId::parse(self.id).unwrap(),
                "session",
                Executor::Remote,
                self.caps.clone().validate().unwrap(),
            )
            .with_settings(self.settings)
            .with_state(self.state)
        }
    }

    fn table(snap: &Arc<ValidatedSnapshot>, workers: &[W]) -> RoutingTable {
        let records: Vec<WorkerRecord> = workers.iter().map(W::record).collect();
        RoutingTable::build(snap.clone(), &records)
    }

    fn hints() -> RouteHints {
        RouteHints::default()
    }

    fn tags(t: &[&str]) -> RouteHints {
        RouteHints {
            tags: t.iter().map(|s| s.to_string()).collect(),
            ..hints()
        }
    }

    fn sticky(id: &str) -> RouteHints {
        RouteHints {
            sticky_session_id: Some(id.into()),
            ..hints()
        }
    }

    /// The worker rendezvous hashing chooses for `(deployment, session)` among `workers`
    /// (id, maximum capacity), computed apart from the table.
    fn rendezvous_choice(deployment: &str, session: &str, workers: &[(&str, u32)]) -> String {
        let key = rendezvous::stable_hash(&[deployment.as_bytes(), session.as_bytes()]);
        let score = |&(id, cap): &(&str, u32)| {
            rendezvous::weighted_score(key, rendezvous::stable_hash(&[id.as_bytes()]), cap)
        };
        let best = workers
            .iter()
            .max_by(|a, b| score(a).total_cmp(&score(b)))
            .unwrap();
        best.0.to_string()
    }

    /// A session id of deployment "dep" that rendezvous hashing sends to `want` among
    /// `workers`.
    fn session_for(want: &str, workers: &[(&str, u32)]) -> String {
        (0..)
            .map(|i| format!("s{i}"))
            .find(|s| rendezvous_choice("dep", s, workers) == want)
            .unwrap()
    }

    /// Routes with a per-worker active count by worker id.
    struct Env {
        table: RoutingTable,
        pins: StickyPins,
        active: HashMap<&'static str, u32>,
    }

    impl Env {
        fn new(snap: &Arc<ValidatedSnapshot>, workers: &[W]) -> Env {
            Env {
                table: table(snap, workers),
                pins: StickyPins::new(64),
                active: HashMap::new(),
            }
        }

        fn rebuild(&mut self, workers: &[W]) {
            self.table = table(self.table.snapshot(), workers);
        }

        fn route_full(
            &mut self,
            deployment: &str,
            h: &RouteHints,
            ingress: Ingress,
            host: &str,
            now: u64,
            tie_break: u64,
        ) -> Result<RouteDecision, RouteError> {
            let active = &self.active;
            let table = &self.table;
            let view = |i: WorkerIndex| {
                table
                    .worker(i)
                    .and_then(|r| active.get(r.id().as_str()).copied())
                    .unwrap_or(0)
            };
            // Parsed as a request's URL would give it: an address literal as an address.
            let host = crate::request::parse_host(host)
                .unwrap_or_else(|_| crate::request::Host::Domain(host.into()));
            let req = RouteRequest {
                deployment_id: deployment,
                hints: h,
                ingress,
                host: &host,
                tie_break,
            };
            table.route(&req, &mut self.pins, now, &view)
        }

        fn route_at(&mut self, h: &RouteHints, now: u64) -> Result<RouteDecision, RouteError> {
            self.route_full("dep", h, Ingress::Api, "example.com", now, 0)
        }

        fn pick(&mut self, h: &RouteHints) -> Result<String, RouteError> {
            self.route_at(h, 0).map(|d| d.worker_id.to_string())
        }
    }

    const ONE_POOL: &str = r#"{"routing":{"rules":[{"id":"all","priority":1,"pools":["direct"]}]},"pools":[{"id":"direct"}]}"#;

    #[test]
    fn first_matching_rule_wins_without_fall_through() {
        let snap = snapshot(
            r#"{"routing":{"rules":[
                {"id":"us","priority":10,"constraints":{"country":"US"},"pools":["empty"]},
                {"id":"catch-all","priority":20,"pools":["direct"]}]},
              "pools":[{"id":"direct"},{"id":"empty"}]}"#,
        );
        let mut env = Env::new(&snap, &[w("a", &["direct"], 1).country("US")]);
        let us = RouteHints {
            country: CountryCode::parse("US"),
            ..hints()
        };
        // The US rule is selected and its pool is empty: no fall-through to the catch-all.
        assert_eq!(
            env.route_at(&us, 0),
            Err(RouteError::Unavailable {
                rule_id: ConfigId::parse("us").unwrap()
            })
        );
        let d = env.route_at(&hints(), 0).unwrap();
        assert_eq!(
            (d.rule_id.as_str(), d.rule, d.pool_id.as_str()),
            ("catch-all", 1, "direct")
        );
    }

    #[test]
    fn equal_priorities_are_ordered_by_id() {
        let snap = snapshot(
            r#"{"routing":{"rules":[
                {"id":"b","priority":5,"pools":["pb"]},
                {"id":"a","priority":5,"pools":["pa"]}]},
              "pools":[{"id":"pa"},{"id":"pb"}]}"#,
        );
        let mut env = Env::new(&snap, &[w("wa", &["pa"], 1), w("wb", &["pb"], 1)]);
        let d = env.route_at(&hints(), 0).unwrap();
        assert_eq!((d.rule_id.as_str(), d.worker_id.as_str()), ("a", "wa"));
    }

    #[test]
    fn rule_constraints_must_be_supplied_and_match() {
        let snap = snapshot(
            r#"{"routing":{"rules":[
                {"id":"res","priority":1,"constraints":{"ip_type":"residential","region":"us-east"},"pools":["direct"]},
                {"id":"connect","priority":2,"constraints":{"ingress":"connect"},"pools":["direct"]},
                {"id":"host","priority":3,"constraints":{"host":"*.example.com"},"pools":["direct"]}]},
              "pools":[{"id":"direct"}]}"#,
        );
        let mut env = Env::new(
            &snap,
            &[w("a", &[], 10).ip_type("residential").region("us-east")],
        );
        let res = RouteHints {
            ip_type: Some("residential".into()),
            region: Some("us-east".into()),
            ..hints()
        };
        let cases: Vec<(RouteHints, Ingress, &str, Result<&str, RouteError>)> = vec![
            (res.clone(), Ingress::Api, "x.test", Ok("res")),
            // One constraint supplied, the other omitted: the rule does not match.
            (
                RouteHints {
                    region: None,
                    ..res.clone()
                },
                Ingress::Api,
                "x.test",
                Err(RouteError::NoMatch),
            ),
            (hints(), Ingress::Connect, "x.test", Ok("connect")),
            (hints(), Ingress::Proxy, "a.example.com", Ok("host")),
            (
                hints(),
                Ingress::Proxy,
                "example.com",
                Err(RouteError::NoMatch),
            ),
            (hints(), Ingress::Api, "x.test", Err(RouteError::NoMatch)),
        ];
        for (h, ingress, host, expected) in cases {
            let got = env
                .route_full("dep", &h, ingress, host, 0, 0)
                .map(|d| d.rule_id.to_string());
            assert_eq!(
                got.as_deref().map_err(Clone::clone),
                expected,
                "{h:?} {ingress:?} {host}"
            );
        }
    }

    #[test]
    fn hints_need_exact_claims() {
        let snap = snapshot(ONE_POOL);
        let workers = [
            w("bare", &[], 100),
            w("us", &[], 10).country("US"),
            w("us-res", &[], 5)
                .country("US")
                .ip_type("residential")
                .tags(&["fast", "cheap"]),
            w("de", &[], 10)
                .country("DE")
                .region("eu-central")
                .tags(&["fast"]),
        ];
        let mut env = Env::new(&snap, &workers);
        let country = |c| RouteHints {
            country: CountryCode::parse(c),
            ..hints()
        };
        let cases: Vec<(RouteHints, Result<&str, RouteError>)> = vec![
            // No hints: capacity decides among all.
            (hints(), Ok("bare")),
            // A missing claim is not a wildcard: "bare" is out.
            (country("US"), Ok("us")),
            (country("DE"), Ok("de")),
            (
                RouteHints {
                    ip_type: Some("residential".into()),
                    ..country("US")
                },
                Ok("us-res"),
            ),
            (tags(&["fast"]), Ok("de")),
            (tags(&["fast", "cheap"]), Ok("us-res")),
            (
                RouteHints {
                    region: Some("eu-central".into()),
                    ..tags(&["fast"])
                },
                Ok("de"),
            ),
        ];
        for (h, expected) in cases {
            assert_eq!(
                env.pick(&h).as_deref().map_err(Clone::clone),
                expected,
                "{h:?}"
            );
        }
        let all = ConfigId::parse("all").unwrap();
        for h in [
            country("FR"),
            tags(&["fast", "slow"]),
            tags(&["FAST"]),
            RouteHints {
                region: Some("eu-central".into()),
                ..country("US")
            },
            RouteHints {
                ip_type: Some("Residential".into()),
                ..hints()
            },
        ] {
            assert_eq!(
                env.pick(&h),
                Err(RouteError::Unavailable {
                    rule_id: all.clone()
                }),
                "{h:?}"
            );
        }
    }

    #[test]
    fn ingress_capability() {
        let snap = snapshot(ONE_POOL);
        let mut env = Env::new(
            &snap,
            &[
                w("api-only", &[], 100).ingress(&["api"]),
                w("all-modes", &[], 1),
            ],
        );
        for (ingress, expected) in [
            (Ingress::Api, "api-only"),
            (Ingress::Proxy, "all-modes"),
            (Ingress::Connect, "all-modes"),
        ] {
            let d = env
                .route_full("dep", &hints(), ingress, "h.test", 0, 0)
                .unwrap();
            assert_eq!(d.worker_id.as_str(), expected, "{ingress:?}");
        }
        let mut env = Env::new(&snap, &[w("proxy-only", &[], 1).ingress(&["proxy"])]);
        assert!(matches!(
            env.route_full("dep", &hints(), Ingress::Connect, "h.test", 0, 0),
            Err(RouteError::Unavailable { .. })
        ));
    }

    #[test]
    fn pool_preference() {
        let snap = snapshot(
            r#"{"routing":{"rules":[{"id":"r","priority":1,"pools":["first","second"]}]},
              "pools":[{"id":"second"},{"id":"first"}]}"#,
        );
        let workers = [w("f", &["first"], 1), w("s", &["second"], 100)];
        let mut env = Env::new(&snap, &workers);
        // The first pool wins even though the second has more room.
        let d = env.route_at(&hints(), 0).unwrap();
        assert_eq!(
            (d.pool_id.as_str(), d.pool, d.worker_id.as_str()),
            ("first", 1, "f")
        );
        // First pool full: capacity exhausted, the second pool is not tried.
        env.active.insert("f", 1);
        assert_eq!(
            env.route_at(&hints(), 0),
            Err(RouteError::CapacityExhausted {
                rule_id: ConfigId::parse("r").unwrap()
            })
        );
        // First pool without an eligible worker: the second is tried.
        env.rebuild(&[w("f", &["first"], 1).draining(), w("s", &["second"], 100)]);
        assert_eq!(env.pick(&hints()).unwrap(), "s");
        // A hint only the second pool can satisfy also moves on.
        env.rebuild(&[w("f", &["first"], 5), w("s", &["second"], 1).tags(&["x"])]);
        env.active.clear();
        assert_eq!(env.pick(&tags(&["x"])).unwrap(), "s");
        // Both pools without eligible workers: unavailable.
        env.rebuild(&[w("f", &["first"], 5).disabled(), w("s", &["other"], 5)]);
        assert!(matches!(
            env.route_at(&hints(), 0),
            Err(RouteError::Unavailable { .. })
        ));
    }

    #[test]
    fn excluded_workers() {
        let snap = snapshot(ONE_POOL);
        let unavailable = Err(RouteError::Unavailable {
            rule_id: ConfigId::parse("all").unwrap(),
        });
        for (worker, expected) in [
            (w("x", &[], 1), Ok("x".to_string())),
            (w("x", &[], 1).draining(), unavailable.clone()),
            (w("x", &[], 1).disabled(), unavailable.clone()),
            (
                w("x", &[], 1).state(WorkerState::Disconnected),
                unavailable.clone(),
            ),
            (
                w("x", &[], 1).state(WorkerState::Unregistered),
                unavailable.clone(),
            ),
            (w("x", &["elsewhere"], 1), unavailable.clone()),
        ] {
            let mut env = Env::new(&snap, &[worker]);
            assert_eq!(env.pick(&hints()), expected);
        }
        // A settings-only record (no capabilities) is in the table but never eligible.
        let mut reg = crate::worker::WorkerRegistry::new();
        reg.apply_action("ghost", crate::worker::WorkerAction::Enable, 0)
            .unwrap();
        let t = RoutingTable::build(snap.clone(), reg.iter());
        assert_eq!(t.worker_count(), 1);
        assert!(t.eligible_workers(0, &hints(), Ingress::Api).is_empty());
    }

    #[test]
    fn capacity_decides_and_ties_rotate() {
        let snap = snapshot(ONE_POOL);
        let workers = [w("a", &[], 4), w("b", &[], 4), w("c", &[], 4)];
        let mut env = Env::new(&snap, &workers);
        assert_eq!(env.pick(&hints()).unwrap(), "a");
        env.active.insert("a", 1);
        assert_eq!(env.pick(&hints()).unwrap(), "b");
        env.active.insert("b", 2);
        assert_eq!(env.pick(&hints()).unwrap(), "c");
        env.active.insert("c", 1);
        // a and c have 3 free; the tie goes to the first at or after the tie-break position.
        let by_tie = |env: &mut Env, t| {
            env.route_full("dep", &hints(), Ingress::Api, "h", 0, t)
                .unwrap()
                .worker_id
                .to_string()
        };
        assert_eq!(by_tie(&mut env, 0), "a");
        assert_eq!(by_tie(&mut env, 1), "c");
        assert_eq!(by_tie(&mut env, 2), "c");
        assert_eq!(by_tie(&mut env, 3), "a");
        assert_eq!(by_tie(&mut env, u64::MAX), "a");
        // An active count above the maximum counts as full, not as an overflow.
        env.active.insert("a", 100);
        env.active.insert("b", 4);
        env.active.insert("c", 4);
        assert!(matches!(
            env.route_at(&hints(), 0),
            Err(RouteError::CapacityExhausted { .. })
        ));
    }

    #[test]
    fn error_distinctions() {
        let snap = snapshot(
            r#"{"routing":{"rules":[
                {"id":"strict","priority":1,"constraints":{"region":"r"},"pools":["direct"],"sticky_session_ttl_seconds":60,"allow_sticky_fallback":false},
                {"id":"open","priority":2,"pools":["direct"]}]},
              "pools":[{"id":"direct"}]}"#,
        );
        let region = |r: &str| RouteHints {
            region: Some(r.into()),
            ..hints()
        };
        let sticky_region = RouteHints {
            sticky_session_id: Some("s".into()),
            ..region("r")
        };
        let mut env = Env::new(&snap, &[w("a", &[], 1).region("r")]);
        // Pin the session to "a", then take "a" away.
        assert_eq!(
            env.route_at(&sticky_region, 0).unwrap().sticky,
            StickyOutcome::NewPin
        );
        env.rebuild(&[
            w("a", &[], 1).region("r").draining(),
            w("b", &[], 1).region("r"),
        ]);
        let strict = ConfigId::parse("strict").unwrap();
        let open = ConfigId::parse("open").unwrap();
        let snap2 = snapshot(
            r#"{"routing":{"rules":[{"id":"us","priority":1,"constraints":{"country":"US"},"pools":["direct"]}]},"pools":[{"id":"direct"}]}"#,
        );
        let mut no_match = Env::new(&snap2, &[w("a", &[], 1)]);
        assert_eq!(no_match.route_at(&hints(), 0), Err(RouteError::NoMatch));
        assert_eq!(
            env.route_at(&sticky_region, 1),
            Err(RouteError::StickyUnavailable {
                rule_id: strict.clone()
            })
        );
        // "strict" does not match region "zz"; "open" does, and no worker claims "zz".
        assert_eq!(
            env.route_at(&region("zz"), 1),
            Err(RouteError::Unavailable {
                rule_id: open.clone()
            })
        );
        let mut none = Env::new(&snap, &[]);
        assert_eq!(
            none.route_at(&hints(), 0),
            Err(RouteError::Unavailable {
                rule_id: open.clone()
            })
        );
        env.active.insert("b", 1);
        assert_eq!(
            env.route_at(&region("r"), 1),
            Err(RouteError::CapacityExhausted {
                rule_id: strict.clone()
            })
        );
    }

    #[test]
    fn sticky_pin_slides_with_virtual_time() {
        let snap = snapshot(
            r#"{"routing":{"rules":[{"id":"r","priority":1,"pools":["direct"],"sticky_session_ttl_seconds":10}]},"pools":[{"id":"direct"}]}"#,
        );
        let mut env = Env::new(&snap, &[w("a", &[], 10), w("b", &[], 10)]);
        let session = session_for("a", &[("a", 10), ("b", 10)]);
        let s = sticky(&session);
        let d = env.route_at(&s, 1_000).unwrap();
        assert_eq!(
            (d.worker_id.as_str(), d.sticky),
            ("a", StickyOutcome::NewPin)
        );
        // "b" now has more room, but the pin holds, and each use slides the expiry.
        env.active.insert("a", 5);
        let mut now = 1_000;
        for _ in 0..5 {
            now += 9_999;
            let d = env.route_at(&s, now).unwrap();
            assert_eq!(
                (d.worker_id.as_str(), d.sticky),
                ("a", StickyOutcome::Pinned),
                "at {now}"
            );
        }
        let key = PinKey::new("dep", &session);
        assert_eq!(
            env.pins.lookup(&key, now).unwrap().expires_at_ms,
            now + 10_000
        );
        // Ten seconds without use: the pin expired and the session routes as a new one: to
        // its rendezvous choice while that has room, else to the next one.
        now += 10_000;
        let d = env.route_at(&s, now).unwrap();
        assert_eq!(
            (d.worker_id.as_str(), d.sticky),
            ("a", StickyOutcome::NewPin)
        );
        now += 10_000;
        env.active.insert("a", 10);
        let d = env.route_at(&s, now).unwrap();
        assert_eq!(
            (d.worker_id.as_str(), d.sticky),
            ("b", StickyOutcome::NewPin)
        );
        assert_eq!(env.pins.lookup(&key, now).unwrap().worker_id.as_str(), "b");
        // Another deployment with the same session id has its own pin, at its own choice.
        env.active.clear();
        let other = env
            .route_full("other", &s, Ingress::Api, "h", now, 0)
            .unwrap();
        assert_eq!(
            (other.worker_id.to_string(), other.sticky),
            (
                rendezvous_choice("other", &session, &[("a", 10), ("b", 10)]),
                StickyOutcome::NewPin
            )
        );
        assert_eq!(env.pins.len(), 2);
    }

    #[test]
    fn no_pin_without_sticky_id_or_ttl() {
        let snap = snapshot(
            r#"{"routing":{"rules":[
                {"id":"ttl0","priority":1,"constraints":{"region":"r0"},"pools":["direct"],"sticky_session_ttl_seconds":0,"allow_sticky_fallback":false},
                {"id":"ttl","priority":2,"pools":["direct"],"sticky_session_ttl_seconds":60}]},
              "pools":[{"id":"direct"}]}"#,
        );
        let mut env = Env::new(&snap, &[w("a", &[], 10).region("r0")]);
        let ttl0 = RouteHints {
            region: Some("r0".into()),
            ..sticky("s")
        };
        assert_eq!(
            env.route_at(&ttl0, 0).unwrap().sticky,
            StickyOutcome::NotSticky
        );
        assert_eq!(
            env.route_at(&sticky(""), 0).unwrap().sticky,
            StickyOutcome::NotSticky
        );
        assert_eq!(
            env.route_at(&hints(), 0).unwrap().sticky,
            StickyOutcome::NotSticky
        );
        assert!(env.pins.is_empty());
        assert_eq!(
            env.route_at(&sticky("s"), 0).unwrap().sticky,
            StickyOutcome::NewPin
        );
        assert_eq!(env.pins.len(), 1);
    }

    #[test]
    fn sticky_fallback_on_and_off() {
        let doc = |fallback: bool| {
            format!(
                r#"{{"routing":{{"rules":[{{"id":"r","priority":1,"pools":["direct"],"sticky_session_ttl_seconds":60,"allow_sticky_fallback":{fallback}}}]}},"pools":[{{"id":"direct"}}]}}"#
            )
        };
        let r = ConfigId::parse("r").unwrap();
        // Each case: how worker "a" (pinned) changes; expected outcome with fallback on and off.
        type Expected = Result<(&'static str, StickyOutcome), RouteError>;
        type Case = (
            &'static str,
            Vec<W>,
            HashMap<&'static str, u32>,
            Expected,
            Expected,
        );
        let cases: Vec<Case> = vec![
            (
                "still fine",
                vec![w("a", &[], 2), w("b", &[], 9)],
                HashMap::new(),
                Ok(("a", StickyOutcome::Pinned)),
                Ok(("a", StickyOutcome::Pinned)),
            ),
            (
                "drained",
                vec![w("a", &[], 2).draining(), w("b", &[], 9)],
                HashMap::new(),
                Ok(("b", StickyOutcome::Repinned)),
                Err(RouteError::StickyUnavailable { rule_id: r.clone() }),
            ),
            (
                "disconnected",
                vec![
                    w("a", &[], 2).state(WorkerState::Disconnected),
                    w("b", &[], 9),
                ],
                HashMap::new(),
                Ok(("b", StickyOutcome::Repinned)),
                Err(RouteError::StickyUnavailable { rule_id: r.clone() }),
            ),
            (
                "gone",
                vec![w("b", &[], 9)],
                HashMap::new(),
                Ok(("b", StickyOutcome::Repinned)),
                Err(RouteError::StickyUnavailable { rule_id: r.clone() }),
            ),
            (
                "left the pool",
                vec![w("a", &["other"], 2), w("b", &[], 9)],
                HashMap::new(),
                Ok(("b", StickyOutcome::Repinned)),
                Err(RouteError::StickyUnavailable { rule_id: r.clone() }),
            ),
            (
                "full",
                vec![w("a", &[], 2), w("b", &[], 9)],
                HashMap::from([("a", 2)]),
                Ok(("b", StickyOutcome::Repinned)),
                Err(RouteError::CapacityExhausted { rule_id: r.clone() }),
            ),
            (
                "gone, nobody else",
                vec![],
                HashMap::new(),
                Err(RouteError::Unavailable { rule_id: r.clone() }),
                Err(RouteError::StickyUnavailable { rule_id: r.clone() }),
            ),
            (
                "gone, others full",
                vec![w("b", &[], 1)],
                HashMap::from([("b", 1)]),
                Err(RouteError::CapacityExhausted { rule_id: r.clone() }),
                Err(RouteError::StickyUnavailable { rule_id: r.clone() }),
            ),
        ];
        let s = sticky(&session_for("a", &[("a", 2), ("b", 1)]));
        for (name, workers, active, with_fallback, without_fallback) in cases {
            for (fallback, expected) in [
                (true, with_fallback.clone()),
                (false, without_fallback.clone()),
            ] {
                let snap = snapshot(&doc(fallback));
                let mut env = Env::new(&snap, &[w("a", &[], 2), w("b", &[], 1)]);
                assert_eq!(env.pick(&s).unwrap(), "a");
                env.rebuild(&workers);
                env.active = active.clone();
                let got = env
                    .route_at(&s, 1_000)
                    .map(|d| (d.worker_id.to_string(), d.sticky));
                let got = got
                    .as_ref()
                    .map(|(w, o)| (w.as_str(), *o))
                    .map_err(Clone::clone);
                assert_eq!(got, expected, "{name}, fallback {fallback}");
                if let Ok((worker, StickyOutcome::Repinned)) = expected {
                    let key = PinKey::new("dep", s.sticky_session_id.as_deref().unwrap());
                    let pin = env.pins.lookup(&key, 1_000).unwrap();
                    assert_eq!(pin.worker_id.as_str(), worker, "{name}: re-pinned");
                }
            }
        }
    }

    #[test]
    fn pins_belong_to_their_rule() {
        let snap = snapshot(
            r#"{"routing":{"rules":[
                {"id":"de","priority":1,"constraints":{"country":"DE"},"pools":["direct"],"sticky_session_ttl_seconds":60,"allow_sticky_fallback":false},
                {"id":"any","priority":2,"pools":["direct"],"sticky_session_ttl_seconds":60}]},
              "pools":[{"id":"direct"}]}"#,
        );
        let mut env = Env::new(&snap, &[w("a", &[], 5), w("b", &[], 5).country("DE")]);
        let session = session_for("a", &[("a", 5), ("b", 5)]);
        assert_eq!(env.pick(&sticky(&session)).unwrap(), "a");
        // The same session under another rule: the "any" pin is not this rule's, so it is
        // neither preferred nor "unavailable"; the session is pinned anew.
        let de = RouteHints {
            country: CountryCode::parse("DE"),
            ..sticky(&session)
        };
        let d = env.route_at(&de, 1).unwrap();
        assert_eq!(
            (d.worker_id.as_str(), d.sticky),
            ("b", StickyOutcome::NewPin)
        );
        assert_eq!(
            env.pins
                .lookup(&PinKey::new("dep", &session), 1)
                .unwrap()
                .rule_id
                .as_str(),
            "de"
        );
    }

    const STICKY_POOL: &str = r#"{"routing":{"rules":[{"id":"r","priority":1,"pools":["direct"],"sticky_session_ttl_seconds":60}]},"pools":[{"id":"direct"}]}"#;

    /// Two controls (two tables built from the same workers in different orders, each with its
    /// own pins and request counter) send every new sticky session to the same worker, and it
    /// is the rendezvous choice.
    #[test]
    fn sticky_sessions_land_on_the_same_worker_in_every_table() {
        let snap = snapshot(STICKY_POOL);
        let workers: Vec<W> = ["w1", "w2", "w3", "w4", "w5"]
            .iter()
            .map(|id| w(id, &[], 8))
            .collect();
        let reversed: Vec<W> = workers.iter().rev().cloned().collect();
        let mut a = Env::new(&snap, &workers);
        let mut b = Env::new(&snap, &reversed);
        let weights: Vec<(&str, u32)> = workers.iter().map(|w| (w.id, 8)).collect();
        for i in 0..200u64 {
            let h = sticky(&format!("session-{i}"));
            let on_a = a
                .route_full("dep", &h, Ingress::Api, "h", 0, i)
                .unwrap()
                .worker_id;
            let on_b = b
                .route_full("dep", &h, Ingress::Api, "h", 0, i.wrapping_mul(7) + 3)
                .unwrap()
                .worker_id;
            assert_eq!(on_a, on_b, "session-{i}");
            assert_eq!(
                on_a.as_str(),
                rendezvous_choice("dep", &format!("session-{i}"), &weights)
            );
        }
    }

    /// Sessions spread over the workers in proportion to their maximum capacity.
    #[test]
    fn sticky_sessions_spread_by_capacity() {
        let count = |workers: &[W], sessions: u32| -> HashMap<String, u32> {
            let mut env = Env::new(&snapshot(STICKY_POOL), workers);
            let mut n = HashMap::new();
            for i in 0..sessions {
                let id = env.pick(&sticky(&format!("spread-{i}"))).unwrap();
                *n.entry(id).or_insert(0) += 1;
            }
            n
        };
        // Four equal workers, 8,000 sessions: 2,000 each expected, with a standard deviation
        // near 39; ±200 is over five of them.
        let equal: Vec<W> = ["a", "b", "c", "d"]
            .iter()
            .map(|id| w(id, &[], 10))
            .collect();
        let n = count(&equal, 8_000);
        for id in ["a", "b", "c", "d"] {
            let got = n.get(id).copied().unwrap_or(0);
            assert!((1_800..=2_200).contains(&got), "{id}: {got} of 8000: {n:?}");
        }
        // Capacities 10 and 30: a quarter and three quarters.
        let n = count(&[w("small", &[], 10), w("large", &[], 30)], 8_000);
        let small = n.get("small").copied().unwrap_or(0);
        assert!((1_800..=2_200).contains(&small), "{n:?}");
    }

    /// A full chosen worker sends the session to its next-highest worker, the one it would get
    /// without the full one; a worker that leaves moves only its own sessions.
    #[test]
    fn sticky_sessions_fall_back_to_the_next_highest_worker() {
        let snap = snapshot(STICKY_POOL);
        let ids = ["w1", "w2", "w3", "w4"];
        let all: Vec<W> = ids.iter().map(|id| w(id, &[], 4)).collect();
        let weights: Vec<(&str, u32)> = ids.iter().map(|id| (*id, 4)).collect();
        let without = |gone: &str| -> Vec<(&str, u32)> {
            weights
                .iter()
                .copied()
                .filter(|(id, _)| *id != gone)
                .collect()
        };
        for i in 0..100 {
            let session = format!("fb-{i}");
            let first = rendezvous_choice("dep", &session, &weights);
            let second = rendezvous_choice("dep", &session, &without(&first));
            // Full: the next-highest with room, pinned as a new pin.
            let mut env = Env::new(&snap, &all);
            env.active
                .insert(*ids.iter().find(|id| **id == first).unwrap(), 4);
            let d = env.route_at(&sticky(&session), 0).unwrap();
            assert_eq!(
                (d.worker_id.to_string(), d.sticky),
                (second.clone(), StickyOutcome::NewPin),
                "{session}"
            );
        }
        // w3 leaves: the sessions it had move, every other session stays where it was.
        let mut before = Env::new(&snap, &all);
        let rest: Vec<W> = all.iter().filter(|w| w.id != "w3").cloned().collect();
        let mut after = Env::new(&snap, &rest);
        let mut moved = 0;
        for i in 0..400 {
            let h = sticky(&format!("leave-{i}"));
            let (was, is) = (before.pick(&h).unwrap(), after.pick(&h).unwrap());
            if was == "w3" {
                moved += 1;
                assert_ne!(is, "w3");
            } else {
                assert_eq!(was, is, "leave-{i} moved although its worker stayed");
            }
        }
        assert!(moved > 50, "w3 held {moved} of 400 sessions");
    }

    /// Without a sticky id, capacity decides as before (decision 007): rendezvous hashing
    /// applies to sticky sessions only.
    #[test]
    fn unsticky_requests_still_go_to_the_most_room() {
        let snap = snapshot(STICKY_POOL);
        let mut env = Env::new(&snap, &[w("a", &[], 10), w("b", &[], 10)]);
        env.active.insert("a", 3);
        for _ in 0..4 {
            assert_eq!(env.pick(&hints()).unwrap(), "b");
        }
    }

    #[test]
    fn pinned_pool_is_kept_while_live() {
        let snap = snapshot(
            r#"{"routing":{"rules":[{"id":"r","priority":1,"pools":["first","second"],"sticky_session_ttl_seconds":60}]},
              "pools":[{"id":"first"},{"id":"second"}]}"#,
        );
        let mut env = Env::new(&snap, &[w("s", &["second"], 5)]);
        assert_eq!(
            env.route_at(&sticky("x"), 0).unwrap().pool_id.as_str(),
            "second"
        );
        env.rebuild(&[w("f", &["first"], 5), w("s", &["second"], 5)]);
        let d = env.route_at(&sticky("x"), 1).unwrap();
        assert_eq!(
            (d.worker_id.as_str(), d.sticky),
            ("s", StickyOutcome::Pinned)
        );
        // Without a pin, the first pool wins.
        assert_eq!(env.pick(&sticky("y")).unwrap(), "f");
    }

    #[test]
    fn provider_session_rules() {
        let snap = snapshot(
            r#"{"routing":{"rules":[
                {"id":"sticky","priority":1,"constraints":{"ingress":"api"},"pools":["acme","acme-2","direct"],"sticky_session_ttl_seconds":60},
                {"id":"ttl0","priority":2,"pools":["acme"],"sticky_session_ttl_seconds":0}]},
              "pools":[{"id":"direct"},
                {"id":"acme","upstream_proxy":{"id":"acme","url":"http://proxy.acme.test:8000"}},
                {"id":"acme-2","upstream_proxy":{"id":"acme","url":"http://proxy.acme.test:8000"}}]}"#,
        );
        let proxy_workers = [
            w("p1", &["acme"], 5).country("US"),
            w("p2", &["acme"], 5).country("US"),
            w("q", &["acme-2"], 5).country("US"),
        ];
        let mut env = Env::new(&snap, &proxy_workers);
        let us = |s: &str| RouteHints {
            country: CountryCode::parse("us"),
            sticky_session_id: Some(s.into()),
            ..hints()
        };
        // A session whose rendezvous choice is p1.
        let s1 = session_for("p1", &[("p1", 5), ("p2", 5)]);
        let d1 = env.route_at(&us(&s1), 0).unwrap();
        assert_eq!(d1.worker_id.as_str(), "p1");
        let expected = ProviderSession::derive(&ProviderSessionInputs {
            deployment_id: "dep",
            pool_id: "acme",
            upstream_proxy_id: "acme",
            country: CountryCode::parse("US"),
            region: None,
            ip_type: None,
            sticky_session_id: &s1,
        });
        assert_eq!(d1.provider_session, Some(expected));
        // Fallback inside the same pool keeps the provider session on another worker.
        env.rebuild(&[
            w("p2", &["acme"], 5).country("US"),
            w("q", &["acme-2"], 5).country("US"),
        ]);
        let d2 = env.route_at(&us(&s1), 1).unwrap();
        assert_eq!(
            (d2.worker_id.as_str(), d2.sticky),
            ("p2", StickyOutcome::Repinned)
        );
        assert_eq!(d2.provider_session, Some(expected));
        // Fallback to another pool derives a new one.
        env.rebuild(&[w("q", &["acme-2"], 5).country("US")]);
        let d3 = env.route_at(&us(&s1), 2).unwrap();
        assert_eq!(d3.pool_id.as_str(), "acme-2");
        assert!(d3.provider_session.is_some() && d3.provider_session != Some(expected));
        // No sticky id, an empty one, a TTL of zero, or a direct pool: no provider session.
        assert_eq!(
            env.route_at(
                &RouteHints {
                    sticky_session_id: None,
                    ..us("")
                },
                3
            )
            .unwrap()
            .provider_session,
            None
        );
        assert_eq!(env.route_at(&us(""), 3).unwrap().provider_session, None);
        let d = env.route_full("dep", &us("s9"), Ingress::Proxy, "h", 3, 0);
        assert_eq!(
            d.unwrap_err(),
            RouteError::Unavailable {
                rule_id: ConfigId::parse("ttl0").unwrap()
            }
        );
        env.rebuild(&[w("p1", &["acme"], 5).country("US")]);
        let d = env
            .route_full("dep", &us("s9"), Ingress::Proxy, "h", 3, 0)
            .unwrap();
        assert_eq!((d.rule_id.as_str(), d.provider_session), ("ttl0", None));
        env.rebuild(&[w("d", &["direct"], 5).country("US")]);
        let d = env.route_at(&us(&s1), 4).unwrap();
        assert_eq!((d.pool_id.as_str(), d.provider_session), ("direct", None));
    }

    #[test]
    fn lookups_and_duplicates() {
        let snap = snapshot(ONE_POOL);
        let t = table(&snap, &[w("b", &[], 1), w("a", &[], 1), w("b", &[], 7)]);
        assert_eq!(t.worker_count(), 2);
        let b = t.worker_index("b").unwrap();
        assert_eq!(
            t.worker(b).unwrap().capabilities().unwrap().max_capacity(),
            1
        );
        assert_eq!(t.worker_index("a").map(WorkerIndex::as_usize), Some(1));
        assert!(t.worker_index("c").is_none());
        assert_eq!(t.workers().len(), 2);
        assert_eq!(t.eligible_workers(0, &hints(), Ingress::Api).len(), 2);
        assert!(t.eligible_workers(9, &hints(), Ingress::Api).is_empty());
    }

    /// A small deterministic generator (SplitMix64) for the randomised comparison.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn chance(&mut self, percent: u64) -> bool {
            self.below(100) < percent
        }
    }

    const TAGS: [&str; 6] = ["t0", "t1", "t2", "t3", "t4", "t5"];
    const COUNTRIES: [&str; 3] = ["US", "DE", "FR"];
    const REGIONS: [&str; 3] = ["r0", "r1", "r2"];
    const IP_TYPES: [&str; 2] = ["residential", "datacenter"];
    const POOLS: [&str; 3] = ["p0", "p1", "p2"];
    const MODES: [Ingress; 3] = Ingress::ALL;

    fn pick_from<'a>(rng: &mut Rng, items: &[&'a str]) -> &'a str {
        items[rng.below(items.len() as u64) as usize]
    }

    fn random_worker(rng: &mut Rng, i: usize) -> WorkerRecord {
        let id: &'static str = Box::leak(format!("w{i:04}").into_boxed_str());
        let pools: Vec<&str> = POOLS.iter().copied().filter(|_| rng.chance(50)).collect();
        let tags: Vec<&str> = TAGS.iter().copied().filter(|_| rng.chance(40)).collect();
        let modes: Vec<&str> = MODES
            .iter()
            .filter(|_| rng.chance(50))
            .map(|m| m.as_str())
            .collect();
        let mut x = w(id, &pools, 1 + rng.below(4) as u32)
            .tags(&tags)
            .ingress(&modes);
        if rng.chance(70) {
            x = x.country(pick_from(rng, &COUNTRIES));
        }
        if rng.chance(60) {
            x = x.region(pick_from(rng, &REGIONS));
        }
        if rng.chance(60) {
            x = x.ip_type(pick_from(rng, &IP_TYPES));
        }
        if rng.chance(10) {
            x = x.draining();
        }
        if rng.chance(10) {
            x = x.disabled();
        }
        if rng.chance(10) {
            x = x.state(WorkerState::Disconnected);
        }
        x.record()
    }

    fn random_hints(rng: &mut Rng) -> RouteHints {
        let mut h = RouteHints::default();
        for t in TAGS.iter().chain(["unknown"].iter()) {
            if rng.chance(15) {
                h.tags.push(t.to_string());
            }
        }
        if rng.chance(50) {
            h.country = CountryCode::parse(pick_from(rng, &["US", "DE", "FR", "GB"]));
        }
        if rng.chance(40) {
            h.region = Some(pick_from(rng, &["r0", "r1", "r2", "r9"]).into());
        }
        if rng.chance(40) {
            h.ip_type = Some(pick_from(rng, &["residential", "datacenter", "mobile"]).into());
        }
        h
    }

    /// The spec's eligibility, read directly off the records with no index.
    fn brute_force_eligible(
        records: &[WorkerRecord],
        pool: &str,
        h: &RouteHints,
        ingress: Ingress,
    ) -> Vec<usize> {
        records
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                let Some(c) = r.capabilities() else {
                    return false;
                };
                r.is_routable()
                    && c.serves_pool(pool)
                    && c.ingress().contains(ingress)
                    && h.tags.iter().all(|t| c.has_tag(t))
                    && h.country.is_none_or(|x| c.country() == Some(x))
                    && h.region.as_deref().is_none_or(|x| c.region() == Some(x))
                    && h.ip_type.as_deref().is_none_or(|x| c.ip_type() == Some(x))
            })
            .map(|(i, _)| i)
            .collect()
    }

    #[test]
    fn index_agrees_with_brute_force() {
        let snap = snapshot(
            r#"{"routing":{"rules":[{"id":"r","priority":1,"pools":["p0","p1","p2"]}]},
              "pools":[{"id":"p0"},{"id":"p1"},{"id":"p2"}]}"#,
        );
        let mut rng = Rng(0x5eed);
        let mut sampled_routes = 0;
        for round in 0..40 {
            let n = 1 + rng.below(240) as usize;
            let records: Vec<WorkerRecord> = (0..n).map(|i| random_worker(&mut rng, i)).collect();
            let t = RoutingTable::build(snap.clone(), &records);
            let max: Vec<u32> = records
                .iter()
                .map(|r| r.capabilities().map_or(0, |c| c.max_capacity()))
                .collect();
            for _ in 0..50 {
                let h = random_hints(&mut rng);
                let ingress = MODES[rng.below(3) as usize];
                let active: Vec<u32> = max
                    .iter()
                    .map(|&m| rng.below(u64::from(m) + 1) as u32)
                    .collect();
                let mut expected = Err(RouteError::Unavailable {
                    rule_id: ConfigId::parse("r").unwrap(),
                });
                let mut sampled = false;
                for (p, pool) in POOLS.iter().enumerate() {
                    let brute = brute_force_eligible(&records, pool, &h, ingress);
                    let indexed: Vec<usize> = t
                        .eligible_workers(p, &h, ingress)
                        .into_iter()
                        .map(WorkerIndex::as_usize)
                        .collect();
                    assert_eq!(
                        indexed, brute,
                        "round {round}, pool {pool}, {h:?}, {ingress:?}"
                    );
                    if brute.is_empty() {
                        continue;
                    }
                    // Most available capacity, ties to the lowest index (tie_break 0). A
                    // longer candidate list is sampled (decision 117): any eligible worker with
                    // room is then a right answer, checked below.
                    let best = brute
                        .iter()
                        .copied()
                        .filter(|&i| max[i] > active[i])
                        .max_by_key(|&i| (max[i] - active[i], std::cmp::Reverse(i)));
                    let want = t.resolve(&h, ingress);
                    sampled =
                        want.is_some_and(|w| t.candidates(p, &w).len() > super::EXACT_SCAN_LIMIT);
                    expected = match best {
                        Some(i) => Ok((i, *pool)),
                        None => Err(RouteError::CapacityExhausted {
                            rule_id: ConfigId::parse("r").unwrap(),
                        }),
                    };
                    break;
                }
                let view = |i: WorkerIndex| active[i.as_usize()];
                let req = RouteRequest {
                    deployment_id: "d",
                    hints: &h,
                    ingress,
                    host: &crate::request::Host::Domain("h".into()),
                    tie_break: 0,
                };
                let got = t
                    .route(&req, &mut StickyPins::new(4), 0, &view)
                    .map(|d| (d.worker.as_usize(), POOLS[d.pool]));
                match (&got, &expected) {
                    (Ok((w, pool)), Ok((_, expected_pool))) if sampled => {
                        let p = POOLS.iter().position(|x| x == pool).unwrap();
                        assert_eq!(pool, expected_pool, "round {round}, {h:?}, {ingress:?}");
                        assert!(
                            brute_force_eligible(&records, POOLS[p], &h, ingress).contains(w)
                                && max[*w] > active[*w],
                            "round {round}: sampled worker {w} is not eligible with room"
                        );
                        sampled_routes += 1;
                    }
                    _ => assert_eq!(got, expected, "round {round}, {h:?}, {ingress:?}"),
                }
            }
        }
        assert!(sampled_routes > 0, "no round routed through a sampled list");
    }

    /// `n` workers of pool "p", all of capacity 10, ids in index order.
    fn large_pool(n: usize) -> RoutingTable {
        let snap = snapshot(
            r#"{"routing":{"rules":[{"id":"r","priority":1,"pools":["p"]}]},"pools":[{"id":"p"}]}"#,
        );
        let records: Vec<WorkerRecord> = (0..n)
            .map(|i| {
                let caps = AdvertisedCapabilities {
                    pools: vec!["p".into()],
                    capacity: 10,
                    ..Default::default()
                };
                WorkerRecord::connected(
                    ConfigId::parse(&format!("w{i:05}")).unwrap(),
                    "session",
                    Executor::Remote,
                    caps.validate().unwrap(),
                )
            })
            .collect();
        RoutingTable::build(snap, &records)
    }

    fn route_large(t: &RoutingTable, tie_break: u64, active: &[u32]) -> Result<usize, RouteError> {
        let h = hints();
        let req = RouteRequest {
            deployment_id: "d",
            hints: &h,
            ingress: Ingress::Api,
            host: &crate::request::Host::Domain("h".into()),
            tie_break,
        };
        let view = |i: WorkerIndex| active[i.as_usize()];
        t.route(&req, &mut StickyPins::new(4), 0, &view)
            .map(|d| d.worker.as_usize())
    }

    #[test]
    fn long_lists_are_sampled_and_stay_exact_at_the_edges() {
        let n = 1_000;
        let t = large_pool(n);
        // Idle: consecutive requests spread; no worker takes more than a few of 2,000.
        let idle = vec![0u32; n];
        let mut hits = vec![0u32; n];
        for tb in 0..2_000u64 {
            hits[route_large(&t, tb, &idle).unwrap()] += 1;
        }
        let used = hits.iter().filter(|&&h| h > 0).count();
        assert!(
            used > 800,
            "2,000 idle routes used only {used} of {n} workers"
        );
        assert!(*hits.iter().max().unwrap() <= 10, "{:?}", hits.iter().max());

        // Half full, the other half with room 1 to 10: the chosen worker has room, and on
        // average much more than the pool's mean room.
        let active: Vec<u32> = (0..n)
            .map(|i| if i % 2 == 0 { 10 } else { (i as u32 / 2) % 10 })
            .collect();
        let mut room_sum = 0u64;
        for tb in 0..2_000u64 {
            let w = route_large(&t, tb, &active).unwrap();
            assert!(active[w] < 10, "worker {w} is full");
            room_sum += u64::from(10 - active[w]);
        }
        let mean_room: f64 = active.iter().map(|&a| f64::from(10 - a)).sum::<f64>() / n as f64;
        let chosen_room = room_sum as f64 / 2_000.0;
        assert!(
            chosen_room > 2.5 * mean_room,
            "chosen room {chosen_room:.2} against a pool mean of {mean_room:.2}"
        );

        // One worker with room among 1,000 full ones: the sample misses it and the whole list
        // finds it, whatever the draw.
        let mut one = vec![10u32; n];
        one[777] = 9;
        for tb in 0..50u64 {
            assert_eq!(route_large(&t, tb, &one), Ok(777));
        }
        // All full: capacity exhausted, exactly as an unsampled pool says it.
        let full = vec![10u32; n];
        assert_eq!(
            route_large(&t, 3, &full),
            Err(RouteError::CapacityExhausted {
                rule_id: ConfigId::parse("r").unwrap()
            })
        );
        // At the limit the scan is still whole: most room, ties from the tie-break position.
        let small = large_pool(EXACT_SCAN_LIMIT);
        let mut load = vec![5u32; EXACT_SCAN_LIMIT];
        load[40] = 1;
        load[50] = 1;
        assert_eq!(route_large(&small, 0, &load), Ok(40));
        assert_eq!(route_large(&small, 45, &load), Ok(50));
    }
}
