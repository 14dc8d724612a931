//! The run's summary: merged counters, percentiles and the lines printed at the end.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::worker::{Tally, UNANSWERED};

/// Scheduler lag above this means the client fell behind its schedule. A timed wait here ends
/// within tens of microseconds of its instant, so a millisecond of lag means connections were all
/// busy or this process waited for a CPU, and the latencies are then those of a lower rate.
pub(crate) const MAX_HEALTHY_LAG_US: u32 = 1000;
/// Below this share of the asked rate the run did not hold its schedule.
const MIN_HELD_SHARE: f64 = 0.95;

/// Everything the report says about one run.
#[derive(Debug)]
pub(crate) struct Summary {
    pub(crate) label: String,
    pub(crate) rate: f64,
    pub(crate) seconds: f64,
    pub(crate) connections: usize,
    pub(crate) sent: u64,
    pub(crate) ok: u64,
    pub(crate) errors: BTreeMap<String, u64>,
    pub(crate) elapsed: Duration,
    pub(crate) reconnects: usize,
    /// Ascending service latencies.
    pub(crate) service_us: Vec<u32>,
    /// Ascending open-loop latencies.
    pub(crate) open_loop_us: Vec<u32>,
    /// Ascending scheduler lags.
    pub(crate) lag_us: Vec<u32>,
}

impl Summary {
    /// Merges the threads' tallies; slots of the `total` never sent count as unanswered.
    pub(crate) fn merge(tallies: Vec<Tally>, total: u64) -> Self {
        let mut summary = Self {
            label: String::new(),
            rate: 0.0,
            seconds: 0.0,
            connections: 0,
            sent: 0,
            ok: 0,
            errors: BTreeMap::new(),
            elapsed: Duration::ZERO,
            reconnects: 0,
            service_us: Vec::new(),
            open_loop_us: Vec::new(),
            lag_us: Vec::new(),
        };
        for tally in tallies {
            summary.sent += tally.sent;
            summary.ok += tally.ok;
            for (kind, count) in tally.errors {
                *summary.errors.entry(kind).or_default() += count;
            }
            summary.service_us.extend(tally.service_us);
            summary.open_loop_us.extend(tally.open_loop_us);
            summary.lag_us.extend(tally.lag_us);
        }
        let unsent = total.saturating_sub(summary.sent);
        if unsent > 0 {
            *summary.errors.entry(UNANSWERED.to_owned()).or_default() += unsent;
        }
        summary.service_us.sort_unstable();
        summary.open_loop_us.sort_unstable();
        summary.lag_us.sort_unstable();
        summary
    }

    /// Failed requests of every kind.
    pub(crate) fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Ok responses per second of the run.
    pub(crate) fn achieved_rps(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.ok as f64 / secs
        } else {
            0.0
        }
    }

    /// `kind: count, ...` in kind order, or `None` without errors.
    pub(crate) fn errors_line(&self) -> Option<String> {
        if self.errors.is_empty() {
            return None;
        }
        let kinds: Vec<String> = self
            .errors
            .iter()
            .map(|(kind, count)| format!("{kind}: {count}"))
            .collect();
        Some(format!(
            "fixedrate {}: errors: {}",
            self.label,
            kinds.join(", ")
        ))
    }

    /// A warning when this client did not hold the asked rate.
    pub(crate) fn warning_line(&self) -> Option<String> {
        let achieved = self.achieved_rps();
        let lag_p99 = percentile(&self.lag_us, 990);
        if achieved >= MIN_HELD_SHARE * self.rate && lag_p99 <= MAX_HEALTHY_LAG_US {
            return None;
        }
        Some(format!(
            "fixedrate {}: warning: this client did not hold {:.0} req/s (achieved {:.0}, \
             scheduler lag p99 {} us); the latencies are of a lower rate",
            self.label, self.rate, achieved, lag_p99
        ))
    }

    /// The machine-readable last line.
    pub(crate) fn result_line(&self) -> String {
        let mut line = String::from("FIXEDRATE_RESULT");
        // Writing to a String cannot fail.
        let _ = write!(
            line,
            " label={} rate={:.0} seconds={:.1} connections={} sent={} ok={} errors={} \
             achieved_rps={:.1} p50_us={} p90_us={} p99_us={} p999_us={} max_us={} \
             open_loop_p50_us={} open_loop_p99_us={} lag_p99_us={} reconnects={}",
            self.label,
            self.rate,
            self.seconds,
            self.connections,
            self.sent,
            self.ok,
            self.error_count(),
            self.achieved_rps(),
            percentile(&self.service_us, 500),
            percentile(&self.service_us, 900),
            percentile(&self.service_us, 990),
            percentile(&self.service_us, 999),
            self.service_us.last().copied().unwrap_or(0),
            percentile(&self.open_loop_us, 500),
            percentile(&self.open_loop_us, 990),
            percentile(&self.lag_us, 990),
            self.reconnects,
        );
        line
    }
}

/// Nearest-rank percentile of an ascending slice, in per mille (990 is p99); 0 for an empty one.
pub(crate) fn percentile(sorted: &[u32], per_mille: u64) -> u32 {
    let n = sorted.len() as u64;
    let rank = (n * per_mille).div_ceil(1000).clamp(1, n.max(1));
    usize::try_from(rank - 1)
        .ok()
        .and_then(|i| sorted.get(i))
        .copied()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let hundred: Vec<u32> = (1..=100).collect();
        let thousand: Vec<u32> = (1..=1000).collect();
        let cases: &[(&[u32], u64, u32)] = &[
            (&[], 500, 0),
            (&[7], 999, 7),
            (&[7], 500, 7),
            (&[1, 2], 500, 1),
            (&[1, 2, 3], 500, 2),
            (&hundred, 500, 50),
            (&hundred, 990, 99),
            (&hundred, 999, 100),
            (&thousand, 999, 999),
            (&thousand, 1000, 1000),
        ];
        for (sorted, per_mille, expected) in cases {
            assert_eq!(
                percentile(sorted, *per_mille),
                *expected,
                "{per_mille} of {}",
                sorted.len()
            );
        }
    }

    fn tally(sent: u64, ok: u64, errors: &[(&str, u64)], service: &[u32], lag: &[u32]) -> Tally {
        Tally {
            sent,
            ok,
            errors: errors.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            service_us: service.to_vec(),
            open_loop_us: service.iter().map(|us| us + 10).collect(),
            lag_us: lag.to_vec(),
        }
    }

    #[test]
    fn merges_threads_and_counts_unsent_slots() {
        let tallies = vec![
            tally(3, 2, &[("status 503", 1)], &[300, 100], &[5, 1, 2]),
            tally(2, 2, &[], &[200, 400], &[4, 3]),
        ];
        let mut summary = Summary::merge(tallies, 6);
        summary.label = "direct".to_owned();
        summary.rate = 6.0;
        summary.seconds = 1.0;
        summary.connections = 2;
        summary.elapsed = Duration::from_secs(2);
        summary.reconnects = 1;
        assert_eq!(summary.service_us, [100, 200, 300, 400]);
        assert_eq!(summary.lag_us, [1, 2, 3, 4, 5]);
        assert_eq!(
            summary.errors_line().as_deref(),
            Some("fixedrate direct: errors: not answered within the drain time: 1, status 503: 1")
        );
        assert_eq!(
            summary.result_line(),
            "FIXEDRATE_RESULT label=direct rate=6 seconds=1.0 connections=2 sent=5 ok=4 errors=2 \
             achieved_rps=2.0 p50_us=200 p90_us=400 p99_us=400 p999_us=400 max_us=400 \
             open_loop_p50_us=210 open_loop_p99_us=410 lag_p99_us=5 reconnects=1"
        );
        assert!(summary
            .warning_line()
            .is_some_and(|line| line.contains("achieved 2,")));
    }

    #[test]
    fn warns_on_lag_alone() {
        let lag: Vec<u32> = (0..100).map(|i| if i < 98 { 10 } else { 2000 }).collect();
        let mut summary = Summary::merge(vec![tally(100, 100, &[], &[50; 100], &lag)], 100);
        summary.rate = 100.0;
        summary.elapsed = Duration::from_secs(1);
        assert!(summary
            .warning_line()
            .is_some_and(|line| line.contains("lag p99 2000 us")));
        summary.lag_us = vec![10; 100];
        assert_eq!(summary.warning_line(), None);
    }
}
