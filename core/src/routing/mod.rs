//! Routing: rule selection, worker eligibility and selection, sticky pins.
//!
//! [`RoutingTable::route`] implements the spec's Routing rules: the first rule in ascending
//! `(priority, id)` order whose configured constraints all match is selected, with no
//! fall-through; its pools are tried in preference order; workers must advertise every hinted
//! claim exactly; capacity and sticky pins decide among eligible workers. The outcome is a
//! [`RouteDecision`] or a [`RouteError`] that maps to exactly one registry code.

pub mod matching;
mod pins;
mod table;

use std::fmt;

pub use crate::hints::{CountryCode, Ingress, RouteHints};
pub use pins::{Pin, PinKey, StickyPins, DEFAULT_MAX_STICKY_PINS};
pub use table::{RoutingTable, EXACT_SCAN_LIMIT, ROOM_SAMPLE};

use crate::config_id::ConfigId;
use crate::error::{ApiError, ErrorCode};
use crate::provider_session::ProviderSession;

/// The position of a worker in a [`RoutingTable`] (index order = the order the table was built
/// from). The IO layer keeps its per-worker active counters in the same order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerIndex(u32);

impl WorkerIndex {
    /// The index as a `usize`, for the caller's own per-worker arrays.
    pub fn as_usize(self) -> usize {
        self.0 as usize
    }
}

/// How many requests each worker has in flight. The IO layer implements it over its atomics;
/// a closure `Fn(WorkerIndex) -> u32` works too.
pub trait CapacityView {
    /// Requests in flight on the worker.
    fn active(&self, worker: WorkerIndex) -> u32;
}

impl<F: Fn(WorkerIndex) -> u32> CapacityView for F {
    fn active(&self, worker: WorkerIndex) -> u32 {
        self(worker)
    }
}

/// A capacity view in which every worker is idle.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllIdle;

impl CapacityView for AllIdle {
    fn active(&self, _worker: WorkerIndex) -> u32 {
        0
    }
}

/// The routing input of one request.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    /// The authenticated deployment.
    pub deployment_id: &'a str,
    /// The validated hints.
    pub hints: &'a RouteHints,
    /// How the request came in.
    pub ingress: Ingress,
    /// The destination host (no port), matched by `host` constraints. An address's text is
    /// written only when a rule asks for it.
    pub host: &'a crate::request::Host,
    /// Rotates the choice among equally free workers; a per-core request counter spreads load,
    /// a constant makes the choice the lowest index.
    pub tie_break: u64,
}

/// What the sticky pin did for a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StickyOutcome {
    /// No pin applies: no sticky id, an empty one, or a rule TTL of zero.
    NotSticky,
    /// The live pin's worker was chosen and the pin's expiry slid forward.
    Pinned,
    /// There was no live pin for this rule; the chosen worker is now pinned.
    NewPin,
    /// The pinned worker was unavailable or full and the rule allows fallback; the chosen
    /// worker is now pinned instead.
    Repinned,
}

/// The outcome of routing one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteDecision {
    /// Index of the selected rule in the snapshot's rules.
    pub rule: usize,
    /// Id of the selected rule.
    pub rule_id: ConfigId,
    /// Index of the pool in the snapshot's pools.
    pub pool: usize,
    /// Id of the pool.
    pub pool_id: ConfigId,
    /// The chosen worker.
    pub worker: WorkerIndex,
    /// Its id.
    pub worker_id: ConfigId,
    /// What the sticky pin did.
    pub sticky: StickyOutcome,
    /// The provider session for the upstream proxy (spec, Routing rule 7).
    pub provider_session: Option<ProviderSession>,
}

/// Why no worker was chosen. Each variant is one registry code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteError {
    /// No rule matched: `route_no_match`.
    NoMatch,
    /// The selected rule's pools have no eligible worker: `route_unavailable`.
    Unavailable {
        /// The selected rule.
        rule_id: ConfigId,
    },
    /// Eligible workers exist and all are at capacity: `executor_capacity_exhausted`.
    CapacityExhausted {
        /// The selected rule.
        rule_id: ConfigId,
    },
    /// The pinned worker is unavailable and the rule forbids fallback:
    /// `sticky_session_unavailable`.
    StickyUnavailable {
        /// The selected rule.
        rule_id: ConfigId,
    },
}

impl RouteError {
    /// The registry code.
    pub fn code(&self) -> ErrorCode {
        match self {
            RouteError::NoMatch => ErrorCode::RouteNoMatch,
            RouteError::Unavailable { .. } => ErrorCode::RouteUnavailable,
            RouteError::CapacityExhausted { .. } => ErrorCode::ExecutorCapacityExhausted,
            RouteError::StickyUnavailable { .. } => ErrorCode::StickySessionUnavailable,
        }
    }

    /// The error for the client.
    pub fn to_api_error(&self) -> ApiError {
        ApiError::new(self.code(), self.to_string())
    }
}

impl fmt::Display for RouteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteError::NoMatch => f.write_str("no routing rule matched the request"),
            RouteError::Unavailable { rule_id } => {
                write!(f, "rule \"{rule_id}\": no eligible worker in its pools")
            }
            RouteError::CapacityExhausted { rule_id } => {
                write!(f, "rule \"{rule_id}\": every eligible worker is at capacity")
            }
            RouteError::StickyUnavailable { rule_id } => write!(
                f,
                "rule \"{rule_id}\": the sticky session's worker is unavailable and fallback is disabled"
            ),
        }
    }
}

impl std::error::Error for RouteError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_their_registry_codes() {
        let r = ConfigId::parse("r").unwrap();
        let cases = [
            (RouteError::NoMatch, "route_no_match", 404, false),
            (
                RouteError::Unavailable { rule_id: r.clone() },
                "route_unavailable",
                503,
                true,
            ),
            (
                RouteError::CapacityExhausted { rule_id: r.clone() },
                "executor_capacity_exhausted",
                503,
                true,
            ),
            (
                RouteError::StickyUnavailable { rule_id: r.clone() },
                "sticky_session_unavailable",
                503,
                false,
            ),
        ];
        for (e, code, status, retryable) in cases {
            let api = e.to_api_error();
            assert_eq!(api.code.as_str(), code);
            assert_eq!(api.http_status(), status);
            assert_eq!(api.code.is_retryable(), retryable);
            assert_eq!(api.message, e.to_string());
        }
    }

    #[test]
    fn closures_are_capacity_views() {
        let view = |w: WorkerIndex| w.0 * 2;
        assert_eq!(view.active(WorkerIndex(3)), 6);
        assert_eq!(AllIdle.active(WorkerIndex(3)), 0);
        assert_eq!(WorkerIndex(7).as_usize(), 7);
    }
}
