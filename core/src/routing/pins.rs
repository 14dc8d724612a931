//! Sticky pins as data: which worker a `(deployment, sticky_session_id)` pair was routed to, in
//! which rule and pool, and until when (spec, Routing rule 4). Time is a parameter in
//! milliseconds on a monotonic clock the caller chooses.
//!
//! The store is bounded (decision 008): when it is full, expired pins are
//! evicted first and then the pin closest to expiry. Each pin is evicted at most once, so
//! eviction is amortised O(log n) per insertion.

use std::collections::{BTreeMap, HashMap};

use crate::snapshot::ConfigId;

/// A sensible bound for one store: 65,536 pins, a few MiB.
pub const DEFAULT_MAX_STICKY_PINS: usize = 65_536;

/// The key of a pin: a deployment and a sticky session id, encoded once per request so that
/// lookup, extension and insertion share one allocation. The encoding
/// `<deployment byte length>:<deployment><session>` is unambiguous.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PinKey(Box<str>);

impl PinKey {
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

/// A bounded map of sticky pins with sliding expiry.
#[derive(Debug)]
pub struct StickyPins {
    max_entries: usize,
    entries: HashMap<PinKey, Entry>,
    /// `(expires_at_ms, seq)` of every entry, so the earliest expiry is found in O(log n).
    by_expiry: BTreeMap<(u64, u64), PinKey>,
    next_seq: u64,
}

impl Default for StickyPins {
    fn default() -> Self {
        StickyPins::new(DEFAULT_MAX_STICKY_PINS)
    }
}

impl StickyPins {
    /// An empty store holding at most `max_entries` pins (at least one).
    pub fn new(max_entries: usize) -> StickyPins {
        StickyPins {
            max_entries: max_entries.max(1),
            entries: HashMap::new(),
            by_expiry: BTreeMap::new(),
            next_seq: 0,
        }
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
        if self.entries.len() >= self.max_entries {
            self.evict_expired(now_ms, usize::MAX);
        }
        while self.entries.len() >= self.max_entries {
            // Still full of live pins: drop the one closest to expiry.
            let Some((_, victim)) = self.by_expiry.pop_first() else {
                break;
            };
            self.entries.remove(&victim);
        }
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        let expires_at_ms = now_ms.saturating_add(ttl_ms);
        self.by_expiry.insert((expires_at_ms, seq), key.clone());
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
        self.by_expiry.remove(&(entry.pin.expires_at_ms, entry.seq));
        Some(entry.pin)
    }

    /// Evicts up to `budget` expired pins, earliest first; returns how many. The IO layer may
    /// call this from a timer so memory follows the live pin count; insertion also calls it when
    /// the store is full.
    pub fn evict_expired(&mut self, now_ms: u64, budget: usize) -> usize {
        let mut evicted = 0;
        while evicted < budget {
            match self.by_expiry.first_key_value() {
                Some((&(expires, _), _)) if expires <= now_ms => {
                    if let Some((_, key)) = self.by_expiry.pop_first() {
                        self.entries.remove(&key);
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

    #[test]
    fn keys_are_unambiguous() {
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
