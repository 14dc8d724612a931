//! Sticky pins as data: which worker a `(deployment, sticky_session_id)` pair was routed to, in
//! which rule and pool, and until when (spec, Routing rule 4). Time is a parameter in
//! milliseconds on a monotonic clock the caller chooses.
//!
//! The store is bounded (decision 008) and shared fairly between deployments (decision 044):
//! each deployment holds at most its quota, and a deployment at its quota evicts its own pin
//! closest to expiry. When the store as a whole is full, expired pins go first, then the pin
//! closest to expiry of the deployment holding the most pins: a deployment can only push out
//! pins of deployments holding at least as many as it does. Each pin is evicted at most once,
//! so eviction is amortised O(log n) per insertion, plus a scan of the deployments present
//! when the store is full of live pins.

use std::collections::{BTreeMap, HashMap};

use crate::config_id::ConfigId;

/// A sensible bound for one store: 65,536 pins, a few MiB.
pub const DEFAULT_MAX_STICKY_PINS: usize = 65_536;

/// The key of a pin: a deployment and a sticky session id, encoded once per request so that
/// lookup, extension and insertion share one allocation. The encoding
/// `<deployment byte length>:<deployment><session>` is unambiguous.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PinKey(Box<str>);

impl PinKey {
    /// The deployment part of the key.
    pub fn deployment(&self) -> &str {
        let (len, rest) = self.0.split_once(':').unwrap_or(("0", &self.0));
        let len = len.parse::<usize>().unwrap_or(0);
        rest.get(..len).unwrap_or_default()
    }

    /// The key of `(deployment_id, sticky_session_id)`.
    pub fn new(deployment_id: &str, sticky_session_id: &str) -> PinKey {
        PinKey(
            format!("{}:{deployment_id}{sticky_session_id}", deployment_id.len()).into_boxed_str(),
        )
    }
}

/// Where a sticky session is pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    /// The rule that selected the worker; the pin applies only while that rule is selected.
    pub rule_id: ConfigId,
    /// The pool the worker was chosen from.
    pub pool_id: ConfigId,
    /// The worker.
    pub worker_id: ConfigId,
    /// The pin is valid while `now_ms < expires_at_ms`.
    pub expires_at_ms: u64,
}

#[derive(Debug)]
struct Entry {
    pin: Pin,
    seq: u64,
}

/// A bounded map of sticky pins with sliding expiry and a quota per deployment.
#[derive(Debug)]
pub struct StickyPins {
    max_entries: usize,
    max_per_deployment: usize,
    entries: HashMap<PinKey, Entry>,
    /// `(expires_at_ms, seq)` of every entry, so the earliest expiry is found in O(log n).
    by_expiry: BTreeMap<(u64, u64), PinKey>,
    /// The same, per deployment: its count and its own earliest expiry.
    by_deployment: HashMap<Box<str>, BTreeMap<(u64, u64), PinKey>>,
    next_seq: u64,
}

impl Default for StickyPins {
    fn default() -> Self {
        StickyPins::new(DEFAULT_MAX_STICKY_PINS)
    }
}

impl StickyPins {
    /// An empty store holding at most `max_entries` pins (at least one), any deployment up to
    /// all of them.
    pub fn new(max_entries: usize) -> StickyPins {
        StickyPins::with_quota(max_entries, max_entries)
    }

    /// An empty store holding at most `max_entries` pins, at most `max_per_deployment` of one
    /// deployment (both at least one).
    pub fn with_quota(max_entries: usize, max_per_deployment: usize) -> StickyPins {
        StickyPins {
            max_entries: max_entries.max(1),
            max_per_deployment: max_per_deployment.max(1),
            entries: HashMap::new(),
            by_expiry: BTreeMap::new(),
            by_deployment: HashMap::new(),
            next_seq: 0,
        }
    }

    /// Pins held for `deployment`, expired ones not yet evicted included.
    pub fn count_of(&self, deployment: &str) -> usize {
        self.by_deployment.get(deployment).map_or(0, BTreeMap::len)
    }

    /// The quota of one deployment.
    pub fn max_per_deployment(&self) -> usize {
        self.max_per_deployment
    }

    /// Number of pins held, expired ones not yet evicted included.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no pin is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The bound.
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// The live pin of `key`. An expired pin is evicted and reported as absent.
    pub fn lookup(&mut self, key: &PinKey, now_ms: u64) -> Option<&Pin> {
        let expires = self.entries.get(key)?.pin.expires_at_ms;
        if now_ms >= expires {
            self.remove(key);
            return None;
        }
        self.entries.get(key).map(|e| &e.pin)
    }

    /// Slides the expiry of a live pin to `now_ms + ttl_ms`; false when there is none.
    pub fn touch(&mut self, key: &PinKey, now_ms: u64, ttl_ms: u64) -> bool {
        let Some(entry) = self.entries.get_mut(key) else {
            return false;
        };
        if now_ms >= entry.pin.expires_at_ms {
            self.remove(key);
            return false;
        }
        let old = (entry.pin.expires_at_ms, entry.seq);
        entry.pin.expires_at_ms = now_ms.saturating_add(ttl_ms);
        let new = (entry.pin.expires_at_ms, entry.seq);
        if let Some(k) = self.by_expiry.remove(&old) {
            self.by_expiry.insert(new, k);
        }
        if let Some(own) = self.by_deployment.get_mut(key.deployment()) {
            if let Some(k) = own.remove(&old) {
                own.insert(new, k);
            }
        }
        true
    }

    /// Pins `key` to a worker until `now_ms + ttl_ms`, replacing any previous pin of the key.
    pub fn pin(
        &mut self,
        key: PinKey,
        rule_id: ConfigId,
        pool_id: ConfigId,
        worker_id: ConfigId,
        now_ms: u64,
        ttl_ms: u64,
    ) {
        self.remove(&key);
        let deployment = key.deployment();
        if self.count_of(deployment) >= self.max_per_deployment
            || self.entries.len() >= self.max_entries
        {
            self.evict_expired(now_ms, usize::MAX);
        }
        while self.count_of(deployment) >= self.max_per_deployment {
            // At its quota with live pins: the deployment gives up its own pin closest to
            // expiry, never another deployment's.
            if !self.evict_earliest_of(deployment) {
                break;
            }
        }
        while self.entries.len() >= self.max_entries {
            // The store is full of live pins: the deployment holding the most gives one up
            // (the inserting one when it ties for the most).
            let largest = self
                .by_deployment
                .iter()
                .map(|(d, own)| (own.len(), d.as_ref() == deployment, d.clone()))
                .max_by_key(|(n, is_self, _)| (*n, *is_self))
                .map(|(_, _, d)| d);
            match largest {
                Some(d) if self.evict_earliest_of(&d) => {}
                _ => break,
            }
        }
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        let expires_at_ms = now_ms.saturating_add(ttl_ms);
        self.by_expiry.insert((expires_at_ms, seq), key.clone());
        match self.by_deployment.get_mut(deployment) {
            Some(own) => {
                own.insert((expires_at_ms, seq), key.clone());
            }
            None => {
                let own = BTreeMap::from([((expires_at_ms, seq), key.clone())]);
                self.by_deployment.insert(deployment.into(), own);
            }
        }
        self.entries.insert(
            key,
            Entry {
                pin: Pin {
                    rule_id,
                    pool_id,
                    worker_id,
                    expires_at_ms,
                },
                seq,
            },
        );
    }

    /// Removes the pin of `key`.
    pub fn remove(&mut self, key: &PinKey) -> Option<Pin> {
        let entry = self.entries.remove(key)?;
        let at = (entry.pin.expires_at_ms, entry.seq);
        self.by_expiry.remove(&at);
        self.forget_in_deployment(key.deployment(), &at);
        Some(entry.pin)
    }

    /// Evicts the pin of `deployment` closest to expiry; false when it has none.
    fn evict_earliest_of(&mut self, deployment: &str) -> bool {
        let first = self
            .by_deployment
            .get(deployment)
            .and_then(|own| own.first_key_value().map(|(_, k)| k.clone()));
        match first {
            Some(key) => self.remove(&key).is_some(),
            None => false,
        }
    }

    fn forget_in_deployment(&mut self, deployment: &str, at: &(u64, u64)) {
        if let Some(own) = self.by_deployment.get_mut(deployment) {
            own.remove(at);
            if own.is_empty() {
                self.by_deployment.remove(deployment);
            }
        }
    }

    /// Evicts up to `budget` expired pins, earliest first; returns how many. The IO layer may
    /// call this from a timer so memory follows the live pin count; insertion also calls it when
    /// the store is full.
    pub fn evict_expired(&mut self, now_ms: u64, budget: usize) -> usize {
        let mut evicted = 0;
        while evicted < budget {
            match self.by_expiry.first_key_value() {
                Some((&(expires, _), _)) if expires <= now_ms => {
                    if let Some((at, key)) = self.by_expiry.pop_first() {
                        self.entries.remove(&key);
                        self.forget_in_deployment(key.deployment(), &at);
                        evicted += 1;
                    }
                }
                _ => break,
            }
        }
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ConfigId {
        ConfigId::parse(s).unwrap()
    }

    fn pin(store: &mut StickyPins, session: &str, worker: &str, now: u64, ttl: u64) {
        store.pin(
            PinKey::new("dep", session),
            id("r"),
            id("p"),
            id(worker),
            now,
            ttl,
        );
    }

    /// Decision 044: a deployment that pins session after session pushes out its own pins,
    /// never another deployment's.
    #[test]
    fn one_deployment_cannot_push_out_the_pins_of_another() {
        let mut s = StickyPins::with_quota(8, 4);
        for i in 0..3 {
            s.pin(
                PinKey::new("quiet", &format!("q{i}")),
                id("r"),
                id("p"),
                id("w"),
                0,
                100,
            );
        }
        for i in 0..1000 {
            s.pin(
                PinKey::new("noisy", &format!("n{i}")),
                id("r"),
                id("p"),
                id("w"),
                1,
                1_000,
            );
        }
        for i in 0..3 {
            let k = PinKey::new("quiet", &format!("q{i}"));
            assert!(s.lookup(&k, 50).is_some(), "quiet pin q{i} was pushed out");
        }
        assert_eq!(s.count_of("noisy"), 4);
        assert!(s.lookup(&PinKey::new("noisy", "n999"), 50).is_some());
        // Without quotas (every deployment may take the whole store), a full store gives up a
        // pin of the deployment holding the most, not the one closest to expiry.
        let mut s = StickyPins::new(4);
        s.pin(PinKey::new("quiet", "q"), id("r"), id("p"), id("w"), 0, 10);
        for i in 0..100 {
            s.pin(
                PinKey::new("noisy", &format!("n{i}")),
                id("r"),
                id("p"),
                id("w"),
                1,
                1_000,
            );
        }
        assert!(s.lookup(&PinKey::new("quiet", "q"), 5).is_some());
        assert_eq!((s.len(), s.count_of("noisy")), (4, 3));
        assert_eq!(s.entries.len(), s.by_expiry.len());
    }

    #[test]
    fn keys_are_unambiguous() {
        assert_eq!(PinKey::new("1:a", "b").deployment(), "1:a");
        assert_eq!(PinKey::new("dep", ":x").deployment(), "dep");
        assert_ne!(PinKey::new("ab", "c"), PinKey::new("a", "bc"));
        assert_ne!(PinKey::new("1:a", "b"), PinKey::new("1", ":ab"));
        assert_eq!(PinKey::new("d", "s"), PinKey::new("d", "s"));
    }

    #[test]
    fn expiry_is_exclusive_and_sliding() {
        let mut s = StickyPins::new(10);
        let k = PinKey::new("dep", "s1");
        pin(&mut s, "s1", "w1", 1_000, 500);
        assert_eq!(
            s.lookup(&k, 1_499).map(|p| p.worker_id.as_str()),
            Some("w1")
        );
        assert!(s.touch(&k, 1_400, 500));
        assert_eq!(s.lookup(&k, 1_899).map(|p| p.expires_at_ms), Some(1_900));
        assert!(s.lookup(&k, 1_900).is_none());
        assert!(s.is_empty(), "an expired pin is evicted on lookup");
        assert!(!s.touch(&k, 1_900, 500));
    }

    #[test]
    fn touch_of_an_expired_pin_evicts_it() {
        let mut s = StickyPins::new(10);
        let k = PinKey::new("dep", "s1");
        pin(&mut s, "s1", "w1", 0, 10);
        assert!(!s.touch(&k, 10, 10));
        assert!(s.is_empty());
    }

    #[test]
    fn pinning_again_replaces() {
        let mut s = StickyPins::new(10);
        pin(&mut s, "s1", "w1", 0, 100);
        pin(&mut s, "s1", "w2", 50, 100);
        assert_eq!(s.len(), 1);
        let p = s.lookup(&PinKey::new("dep", "s1"), 60).unwrap();
        assert_eq!((p.worker_id.as_str(), p.expires_at_ms), ("w2", 150));
        assert_eq!(
            s.remove(&PinKey::new("dep", "s1")).unwrap().worker_id,
            id("w2")
        );
        assert!(s.is_empty() && s.by_expiry.is_empty());
    }

    #[test]
    fn full_store_evicts_expired_first_then_earliest_expiry() {
        let mut s = StickyPins::new(3);
        pin(&mut s, "a", "w", 0, 100); // expires 100
        pin(&mut s, "b", "w", 0, 300); // expires 300
        pin(&mut s, "c", "w", 0, 200); // expires 200
                                       // At 150 "a" is expired: it goes, the live ones stay.
        pin(&mut s, "d", "w", 150, 1000);
        assert_eq!(s.len(), 3);
        assert!(s.lookup(&PinKey::new("dep", "a"), 150).is_none());
        for live in ["b", "c", "d"] {
            assert!(s.lookup(&PinKey::new("dep", live), 150).is_some(), "{live}");
        }
        // All live: the one closest to expiry ("c", 200) goes.
        pin(&mut s, "e", "w", 160, 1000);
        assert_eq!(s.len(), 3);
        assert!(s.lookup(&PinKey::new("dep", "c"), 160).is_none());
        assert!(s.lookup(&PinKey::new("dep", "b"), 160).is_some());
        assert_eq!(s.entries.len(), s.by_expiry.len());
    }

    #[test]
    fn sweeping_respects_the_budget() {
        let mut s = StickyPins::new(100);
        for i in 0..10 {
            pin(&mut s, &format!("s{i}"), "w", 0, 10 + i);
        }
        assert_eq!(s.evict_expired(14, 3), 3);
        assert_eq!(s.evict_expired(14, 100), 2);
        assert_eq!(s.evict_expired(14, 100), 0);
        assert_eq!(s.len(), 5);
        assert_eq!(s.entries.len(), s.by_expiry.len());
    }

    #[test]
    fn zero_bound_still_holds_one_pin() {
        let mut s = StickyPins::new(0);
        assert_eq!(s.max_entries(), 1);
        pin(&mut s, "a", "w", 0, 10);
        pin(&mut s, "b", "w", 0, 10);
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn huge_ttl_saturates() {
        let mut s = StickyPins::new(2);
        pin(&mut s, "a", "w", u64::MAX - 1, u64::MAX);
        assert_eq!(
            s.lookup(&PinKey::new("dep", "a"), u64::MAX - 1)
                .unwrap()
                .expires_at_ms,
            u64::MAX
        );
    }
}
