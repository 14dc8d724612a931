//! Admission limits shared by every core (decision 043): the requests each deployment has in
//! flight on the request API, and the request body bytes all cores hold at once. Both are
//! taken from the request head, before a body byte is read, and given back by a guard's
//! `Drop` when the request ends, however it ends.
//!
//! On the per-request path: two atomic updates to take, two to give back; no lock, no
//! allocation. The counters live for the whole process (leaked once at startup), so a guard
//! holds plain references instead of reference-counted pointers.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use sortie_core::error::{ApiError, ErrorCode};

use crate::tokens::DeploymentRef;

/// `retry_after_ms` of a refusal: in-flight requests end within milliseconds to seconds, and a
/// short hint keeps a well-behaved client from hammering while one is waited for.
pub const ADMISSION_RETRY_AFTER_MS: u64 = 100;

/// The process's admission counters.
#[derive(Debug)]
pub struct AdmissionLimits {
    per_deployment: Box<[AtomicU32]>,
    max_per_deployment: u32,
    body_bytes: AtomicU64,
    max_body_bytes: u64,
}

/// What a request holds while admitted; dropping it gives everything back.
#[derive(Debug)]
pub struct InFlight {
    deployment: &'static AtomicU32,
    budget: &'static AtomicU64,
    body_bytes: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.deployment.fetch_sub(1, Ordering::AcqRel);
        self.budget.fetch_sub(self.body_bytes, Ordering::AcqRel);
    }
}

impl AdmissionLimits {
    /// Counters for `deployments` deployments, each allowed `max_per_deployment` requests in
    /// flight, and a body budget of `max_body_bytes`, for the life of the process.
    pub fn leak(
        deployments: usize,
        max_per_deployment: u32,
        max_body_bytes: u64,
    ) -> &'static AdmissionLimits {
        Box::leak(Box::new(AdmissionLimits {
            per_deployment: (0..deployments).map(|_| AtomicU32::new(0)).collect(),
            max_per_deployment,
            body_bytes: AtomicU64::new(0),
            max_body_bytes,
        }))
    }

    /// Admits one request of `deployment` that may bring up to `body_bytes` of body, or says
    /// which limit refuses it: `executor_capacity_exhausted` with `retry_after_ms` and
    /// `details.reason` (`deployment_concurrency` or `in_flight_body_bytes`).
    pub fn try_admit(
        &'static self,
        deployment: DeploymentRef,
        body_bytes: u64,
    ) -> Result<InFlight, ApiError> {
        let Some(count) = self.per_deployment.get(deployment.index()) else {
            return Err(refusal("deployment_concurrency", 0));
        };
        if count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_per_deployment).then_some(n + 1)
            })
            .is_err()
        {
            return Err(refusal(
                "deployment_concurrency",
                u64::from(self.max_per_deployment),
            ));
        }
        let reserved = self
            .body_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(body_bytes)
                    .filter(|&total| total <= self.max_body_bytes)
            });
        if reserved.is_err() {
            count.fetch_sub(1, Ordering::AcqRel);
            return Err(refusal("in_flight_body_bytes", self.max_body_bytes));
        }
        Ok(InFlight {
            deployment: count,
            budget: &self.body_bytes,
            body_bytes,
        })
    }

    /// Requests `deployment` has in flight.
    pub fn in_flight(&self, deployment: DeploymentRef) -> u32 {
        self.per_deployment
            .get(deployment.index())
            .map_or(0, |c| c.load(Ordering::Acquire))
    }

    /// Body bytes reserved now, over all cores.
    pub fn body_bytes_in_flight(&self) -> u64 {
        self.body_bytes.load(Ordering::Acquire)
    }
}

fn refusal(reason: &'static str, limit: u64) -> ApiError {
    let message = match reason {
        "deployment_concurrency" => {
            "the deployment has its limit of requests in flight (control.request.max_concurrent_per_deployment)"
        }
        _ => "the gateway holds its budget of request body bytes in flight (control.request.max_in_flight_body_bytes)",
    };
    ApiError::new(ErrorCode::ExecutorCapacityExhausted, message)
        .with_retry_after_ms(ADMISSION_RETRY_AFTER_MS)
        .with_detail("reason", reason)
        .with_detail("limit", limit.to_string())
}

/// Concurrent tunnels per deployment, shared by every core.
pub struct TunnelCounts {
    counts: Vec<AtomicU32>,
    max: u32,
}

impl TunnelCounts {
    /// Counters for `deployments` deployments, each limited to `max` tunnels.
    pub fn new(deployments: usize, max: u32) -> TunnelCounts {
        TunnelCounts {
            counts: (0..deployments).map(|_| AtomicU32::new(0)).collect(),
            max,
        }
    }

    /// Takes one tunnel of the deployment, or `None` at its limit.
    pub(crate) fn try_take(self: &Arc<Self>, d: DeploymentRef) -> Option<TunnelPermit> {
        let c = self.counts.get(d.index())?;
        c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < self.max).then_some(n + 1)
        })
        .ok()?;
        Some(TunnelPermit {
            counts: Arc::clone(self),
            index: d.index(),
        })
    }

    /// The limit of each deployment.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// Tunnels the deployment holds now.
    pub fn current(&self, d: DeploymentRef) -> u32 {
        self.counts
            .get(d.index())
            .map_or(0, |c| c.load(Ordering::Acquire))
    }
}

/// One tunnel of a deployment, given back when dropped.
pub(crate) struct TunnelPermit {
    counts: Arc<TunnelCounts>,
    index: usize,
}

impl Drop for TunnelPermit {
    fn drop(&mut self) {
        if let Some(c) = self.counts.counts.get(self.index) {
            c.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::Authenticator;

    fn dep(i: usize) -> DeploymentRef {
        crate::tokens::Authenticator::new(&[
            ("a".into(), "token-aaaaaaaaaaaaaaaa".into()),
            ("b".into(), "token-bbbbbbbbbbbbbbbb".into()),
        ])
        .authenticate(if i == 0 {
            b"token-aaaaaaaaaaaaaaaa"
        } else {
            b"token-bbbbbbbbbbbbbbbb"
        })
        .unwrap()
    }

    #[test]
    fn limits_refuse_with_the_reason_and_guards_give_back() {
        let limits = AdmissionLimits::leak(2, 2, 100);
        let (a, b) = (dep(0), dep(1));
        let first = limits.try_admit(a, 40).unwrap();
        let second = limits.try_admit(a, 40).unwrap();
        let e = limits.try_admit(a, 0).unwrap_err();
        assert_eq!(e.code, ErrorCode::ExecutorCapacityExhausted);
        assert_eq!(e.retry_after_ms, Some(ADMISSION_RETRY_AFTER_MS));
        assert!(e
            .details
            .contains(&("reason".into(), "deployment_concurrency".into())));
        assert!(e.details.contains(&("limit".into(), "2".into())));
        // Another deployment is not held back by the first one's count, only by the budget.
        let e = limits.try_admit(b, 21).unwrap_err();
        assert!(e
            .details
            .contains(&("reason".into(), "in_flight_body_bytes".into())));
        assert_eq!(limits.in_flight(b), 0, "a refused request holds nothing");
        let third = limits.try_admit(b, 20).unwrap();
        assert_eq!(limits.body_bytes_in_flight(), 100);
        drop((first, second, third));
        assert_eq!((limits.in_flight(a), limits.body_bytes_in_flight()), (0, 0));
    }

    fn deployments() -> (Authenticator, DeploymentRef, DeploymentRef) {
        let auth = Authenticator::new(&[
            ("dep_a".to_string(), "token-a".to_string()),
            ("dep_b".to_string(), "token-b".to_string()),
        ]);
        let a = auth.authenticate(b"token-a").unwrap();
        let b = auth.authenticate(b"token-b").unwrap();
        (auth, a, b)
    }

    #[test]
    fn tunnel_limit_is_per_deployment_and_permits_give_back() {
        let (_auth, a, b) = deployments();
        let counts = Arc::new(TunnelCounts::new(2, 2));
        let first = counts.try_take(a).expect("first");
        let second = counts.try_take(a).expect("second");
        assert!(counts.try_take(a).is_none(), "a third tunnel of dep_a");
        assert_eq!(counts.current(a), 2);
        // Another deployment has its own count.
        let other = counts.try_take(b).expect("dep_b");
        assert_eq!(counts.current(b), 1);
        drop(first);
        assert_eq!(counts.current(a), 1);
        let again = counts.try_take(a).expect("a slot came back");
        drop((second, other, again));
        assert_eq!((counts.current(a), counts.current(b)), (0, 0));
    }
}
