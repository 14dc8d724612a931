//! When each request is due, and which event loop sends it.
//!
//! Slot `i` of the run is due at `start + i / rate`, whether or not earlier requests have been
//! answered. With `n` event loops, loop `t` owns slots `t, t + n, t + 2n, ...`: a fixed share
//! needs no coordination between the loops, and each loop wakes only for its own slots, where a
//! shared counter would wake every loop for every slot.

use std::time::{Duration, Instant};

/// How long to wait for responses still in flight once the schedule is over.
pub(crate) const DRAIN: Duration = Duration::from_secs(5);

/// When each slot is due: slot `i` at `start + i / rate`.
#[derive(Debug)]
pub(crate) struct Schedule {
    start: Instant,
    rate: f64,
    /// After this instant nothing more is sent and nothing more is waited for.
    pub(crate) drain_deadline: Instant,
}

impl Schedule {
    /// A schedule of `total` slots at `rate` per second from `start`.
    pub(crate) fn new(start: Instant, rate: f64, total: u64) -> Self {
        let last = Duration::from_secs_f64(total.saturating_sub(1) as f64 / rate);
        Self {
            start,
            rate,
            drain_deadline: start + last + DRAIN,
        }
    }

    /// The first slot's instant.
    pub(crate) fn start(&self) -> Instant {
        self.start
    }

    /// The instant slot `slot` is due.
    pub(crate) fn instant(&self, slot: u64) -> Instant {
        self.start + Duration::from_secs_f64(slot as f64 / self.rate)
    }
}

/// The slots one event loop owns: every `stride`-th slot of `total`, from `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Share {
    first: u64,
    stride: u64,
    total: u64,
}

impl Share {
    /// Loop `index` of `loops` over a run of `total` slots. A zero `loops` counts as one.
    pub(crate) fn new(index: u64, loops: u64, total: u64) -> Self {
        Self {
            first: index,
            stride: loops.max(1),
            total,
        }
    }

    /// How many slots this loop owns.
    pub(crate) fn len(&self) -> u64 {
        self.total.saturating_sub(self.first).div_ceil(self.stride)
    }

    /// The run-wide number of this loop's `k`-th slot, or `None` past its last.
    pub(crate) fn slot(&self, k: u64) -> Option<u64> {
        let slot = k.checked_mul(self.stride)?.checked_add(self.first)?;
        (slot < self.total).then_some(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_spaces_slots_evenly() {
        let start = Instant::now();
        let schedule = Schedule::new(start, 4.0, 9);
        assert_eq!(schedule.instant(0), start);
        assert_eq!(schedule.instant(2), start + Duration::from_millis(500));
        assert_eq!(
            schedule.drain_deadline,
            start + Duration::from_secs(2) + DRAIN
        );
    }

    #[test]
    fn slots_at_high_rates_stay_within_a_nanosecond() {
        let start = Instant::now();
        let schedule = Schedule::new(start, 27_000.0, 135_000);
        // 134,999 / 27,000 s = 4.999962962... s; the float holds it to well under a nanosecond.
        let last = schedule.instant(134_999) - start;
        assert!(last.as_nanos().abs_diff(4_999_962_963) <= 1, "{last:?}");
    }

    #[test]
    fn shares_partition_the_slots() {
        // (index, loops, total, length, slots)
        let cases: &[(u64, u64, u64, u64, &[u64])] = &[
            (0, 1, 4, 4, &[0, 1, 2, 3]),
            (0, 3, 7, 3, &[0, 3, 6]),
            (1, 3, 7, 2, &[1, 4]),
            (2, 3, 7, 2, &[2, 5]),
            (3, 4, 3, 0, &[]),
            (0, 2, 0, 0, &[]),
            (0, 0, 2, 2, &[0, 1]),
        ];
        for &(index, loops, total, length, slots) in cases {
            let share = Share::new(index, loops, total);
            assert_eq!(share.len(), length, "{share:?}");
            let listed: Vec<u64> = (0..=length).map_while(|k| share.slot(k)).collect();
            assert_eq!(listed, slots, "{share:?}");
            assert_eq!(share.slot(length), None, "{share:?}");
        }
        // Every slot belongs to exactly one of the loops.
        let mut all: Vec<u64> = (0..3)
            .flat_map(|t| {
                let share = Share::new(t, 3, 10);
                (0..share.len()).filter_map(move |k| share.slot(k))
            })
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..10).collect::<Vec<u64>>());
    }

    #[test]
    fn a_huge_index_is_no_slot() {
        let share = Share::new(1, 8, u64::MAX);
        assert_eq!(share.slot(u64::MAX), None);
    }
}
