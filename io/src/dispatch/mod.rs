//! One request's way from an ingress to a worker and back, the same for every ingress: the
//! request API (inline and receipt bodies), the forward proxy's absolute-form requests and its
//! CONNECT tunnels.
//!
//! 1. `assign`: routing (spec, Routing rules 1-6) and one unit of the chosen worker's
//!    capacity, held by the `Assigned` until it is dropped.
//! 2. The ingress's attempt on that worker: the local executor (`crate::egress`) or a remote
//!    worker over the bus (`crate::remote`), behind one closure.
//! 3. An attempt that ended without an answer (refused, or its worker lost) goes to the rule of
//!    `sortie_core::dispatch`, which says whether another worker is tried or what the answer is.
//!
//! `run` is that loop, the only one. A request that outlives its handler (a relayed response
//! body, an open tunnel) keeps what it owns in one typed `Holding`: its place in the active
//! list, its capacity, and a CONNECT tunnel's per-deployment permit.
//!
//! `streamed.rs`: exchanges whose request body comes from a receipt or whose response body goes
//! to one, and the receipt hold of an attempt.

pub(crate) mod streamed;

use std::ops::AsyncFnMut;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use sortie_core::dispatch::{after_failure, Attempt, BodyState, Failure, Next};
use sortie_core::error::{ApiError, ErrorCode};
use sortie_core::routing::{Ingress, RouteHints, RouteRequest, StickyPins, WorkerIndex};
use sortie_core::snapshot::TemplateValues;

use crate::control::admission::TunnelPermit;
use crate::control::core::{ActiveGuard, ActiveRequests};
use crate::control::state::{Active, ControlState, WorkerSlot};
use crate::egress::Egress;
use crate::metrics::Metrics;
use crate::tokens::DeploymentRef;

/// What one core needs to dispatch requests of every ingress.
pub struct Dispatcher {
    /// Shared control state.
    pub state: Arc<ControlState>,
    /// Requests running on this core.
    pub active: Rc<ActiveRequests>,
    /// This core's egress executor.
    pub egress: Rc<Egress>,
    /// Metrics, written to this core's shard.
    pub metrics: Arc<Metrics>,
    /// This core's index.
    pub core: usize,
    /// Counts this core's finished requests into `metrics`.
    pub(crate) recorder: crate::metrics::CoreRecorder,
    /// Pins used for requests without a sticky id (never touched by routing then).
    no_pins: std::cell::RefCell<StickyPins>,
    /// The last token this core authenticated, with its deployment: clients send the same
    /// token request after request, and a constant-time compare with it saves the SHA-256 of
    /// the full lookup. The entry holds for one generation of tokens (a reload makes a new
    /// one), so it cannot outlive a replaced token.
    pub(crate) last_token: std::cell::RefCell<Option<(Vec<u8>, DeploymentRef, u64)>>,
    /// The receipt service when object storage is enabled.
    pub receipts: Option<Arc<crate::control::receipts::Receipts>>,
    /// This core's bus lanes, when remote workers may attach.
    pub bus: Option<Rc<crate::remote::BusCore>>,
    /// Counts the requests this core routed, to rotate ties among equally free workers: a
    /// count of its own, not one every core's requests change. Starts at the core's index, so
    /// that cores do not begin their rotations at the same worker.
    route_counter: std::cell::Cell<u64>,
    /// The active snapshot as this core last loaded it, with the publication count it was
    /// current at ([`Dispatcher::active_snapshot`]). The `Rc` around the shared `Arc` is the
    /// point: one allocation per publication buys a reference count only this core changes.
    #[allow(clippy::redundant_allocation)]
    active_seen: std::cell::RefCell<Option<(u64, Rc<Arc<Active>>)>>,
}

impl Dispatcher {
    /// A context for one core.
    pub fn new(
        state: Arc<ControlState>,
        active: Rc<ActiveRequests>,
        egress: Rc<Egress>,
        metrics: Arc<Metrics>,
        core: usize,
    ) -> Self {
        Dispatcher {
            state,
            active,
            egress,
            recorder: crate::metrics::CoreRecorder::new(Arc::clone(&metrics), core),
            metrics,
            core,
            no_pins: std::cell::RefCell::new(StickyPins::new(1)),
            last_token: std::cell::RefCell::new(None),
            receipts: None,
            bus: None,
            route_counter: std::cell::Cell::new(core as u64),
            active_seen: std::cell::RefCell::new(None),
        }
    }

    /// The active snapshot and table, as [`ControlState::active`] returns them. A core keeps
    /// the one it loaded last and loads again only once another has been published: a request
    /// reads one shared counter instead of taking a reference on the shared snapshot (a count
    /// every core's requests would otherwise change, on one cache line). Until its next
    /// request after a publication, a core holds the snapshot before it alive.
    ///
    /// [`ControlState::active`]: crate::control::state::ControlState::active
    #[allow(clippy::redundant_allocation)]
    pub fn active_snapshot(&self) -> Rc<Arc<Active>> {
        let published = self.state.published();
        let mut seen = self.active_seen.borrow_mut();
        if let Some((at, active)) = seen.as_ref() {
            if *at == published {
                return Rc::clone(active);
            }
        }
        // Loaded after the count was read: at least as new as the publication it counts.
        let active = Rc::new(self.state.active());
        *seen = Some((published, Rc::clone(&active)));
        active
    }
}

/// What routing needs of a request, the same on every attempt.
#[derive(Clone, Copy)]
pub(crate) struct Route<'a> {
    /// The configuration the request started under.
    pub(crate) active: &'a Active,
    /// The deployment id.
    pub(crate) deployment: &'a str,
    /// The request's routing hints.
    pub(crate) hints: &'a RouteHints,
    /// How the request entered.
    pub(crate) ingress: Ingress,
    /// The destination host (rule `host` constraints).
    pub(crate) host: &'a sortie_core::request::Host,
    /// A named fingerprint profile the worker must advertise (request API only).
    pub(crate) fingerprint: Option<&'a str>,
    /// When the request started (sticky pin expiry is measured from it).
    pub(crate) started: Instant,
}

/// What the resend rule needs to know of a request besides the attempt.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Resend {
    /// The caller allows the request to be sent twice.
    pub(crate) is_replayable: bool,
    /// Where the request's body is.
    pub(crate) body: BodyState,
}

/// Routes the request and runs `attempt` on the chosen worker; after an attempt that ended
/// without an answer, the rule of `sortie_core::dispatch` decides whether another worker (not
/// one that failed it before) gets it. The failed worker's unit of capacity goes back before
/// routing runs again. Answers the attempt's result with the assignment it ran on.
pub(crate) async fn run<T>(
    ctx: &Dispatcher,
    route: &Route<'_>,
    resend: Resend,
    mut attempt: impl AsyncFnMut(&Assigned) -> Result<T, Failure>,
) -> Result<(T, Assigned), ApiError> {
    let mut failed: Vec<WorkerIndex> = Vec::new();
    // A table newer than the request's, when registrations were waiting for their batched
    // republication and routing found no eligible worker (decision 116).
    #[allow(clippy::redundant_allocation)]
    let mut fresh: Option<Rc<Arc<Active>>> = None;
    loop {
        let current = match &fresh {
            Some(a) => Route {
                active: a,
                ..*route
            },
            None => *route,
        };
        let assigned = match assign(ctx, &current, &failed) {
            Err(e)
                if e.code == ErrorCode::RouteUnavailable
                    && fresh.is_none()
                    && failed.is_empty()
                    && ctx.state.is_newer_than(route.active) =>
            {
                ctx.state.publish_if_stale();
                fresh = Some(ctx.active_snapshot());
                continue;
            }
            other => other?,
        };
        let failure = match attempt(&assigned).await {
            Ok(t) => return Ok((t, assigned)),
            Err(f) => f,
        };
        let worker_id = assigned.decision.worker_id.as_str();
        if let Failure::Refused(reason) = &failure {
            tracing::debug!(
                target: "sortie::dispatch",
                worker = %worker_id,
                %reason,
                "assignment refused"
            );
        }
        let facts = Attempt {
            worker_id,
            failed_before: failed.len(),
            is_replayable: resend.is_replayable,
            body: resend.body,
        };
        match after_failure(failure, &facts) {
            Next::Another => {
                failed.push(assigned.decision.worker);
                drop(assigned);
            }
            Next::Fail(e) => return Err(e),
        }
    }
}

/// What a request owns while its answer is still on its way to the client (a relayed body, an
/// open tunnel): its place in the core's active list, its unit of worker capacity and, for a
/// CONNECT tunnel, its deployment's tunnel permit. Dropped when the answer ends, however it
/// ends.
pub(crate) struct Holding {
    _tracked: ActiveGuard,
    _assigned: Assigned,
    _tunnel: Option<TunnelPermit>,
}

impl Holding {
    /// What a request holds from its assignment on.
    pub(crate) fn new(
        tracked: ActiveGuard,
        assigned: Assigned,
        tunnel: Option<TunnelPermit>,
    ) -> Holding {
        Holding {
            _tracked: tracked,
            _assigned: assigned,
            _tunnel: tunnel,
        }
    }
}

/// A request that routing placed on a local worker, holding one unit of its capacity until
/// dropped.
pub(crate) struct Assigned {
    /// What routing chose.
    pub(crate) decision: sortie_core::routing::RouteDecision,
    /// The chosen worker's executor slot.
    pub(crate) slot: Arc<WorkerSlot>,
    /// When routing finished: read for the request API, whose answer reports it, and for no
    /// other ingress (a precise clock read per request).
    pub(crate) routed: Option<Instant>,
    /// The pool's upstream proxy, when it does not egress directly.
    pub(crate) via: Option<crate::egress::ProxyRoute>,
    /// The worker attaches over the bus (`sortie worker`).
    pub(crate) is_remote: bool,
    _capacity: CapacityGuard,
}

/// Routes a request (spec, Routing rules 1-6), the workers in `excluded` (which failed it
/// already) counted as full, and takes one unit of capacity on the chosen worker. A named
/// fingerprint profile must be advertised by the worker (Request API rule 6); a pool behind an
/// upstream proxy gets its username rendered here, once for every exchange of the request.
pub(crate) fn assign(
    ctx: &Dispatcher,
    route: &Route<'_>,
    excluded: &[WorkerIndex],
) -> Result<Assigned, ApiError> {
    let (state, active) = (&ctx.state, route.active);
    let (deployment, hints, started) = (route.deployment, route.hints, route.started);
    let tie_break = ctx.route_counter.get();
    ctx.route_counter.set(tie_break.wrapping_add(1));
    let route_req = RouteRequest {
        deployment_id: deployment,
        hints,
        ingress: route.ingress,
        host: route.host,
        tie_break,
    };
    let capacity = |w| {
        if excluded.contains(&w) {
            u32::MAX
        } else {
            active.active_on(w)
        }
    };
    let now_ms = crate::clock::monotonic_ms_at(started);
    let decision = match hints.sticky_session_id.as_deref().filter(|s| !s.is_empty()) {
        Some(sid) => state.with_pins(deployment, sid, |pins| {
            active.table.route(&route_req, pins, now_ms, &capacity)
        }),
        None => active
            .table
            .route(&route_req, &mut ctx.no_pins.borrow_mut(), now_ms, &capacity),
    };
    let decision = decision.map_err(|e| e.to_api_error())?;
    let routed = (route.ingress == Ingress::Api).then(Instant::now);

    if let Some(profile) = route.fingerprint {
        let advertises = active
            .table
            .worker(decision.worker)
            .and_then(|w| w.capabilities())
            .is_some_and(|c| c.advertises_profile(profile));
        if !advertises {
            return Err(ApiError::new(
                ErrorCode::UnsupportedFingerprint,
                format!(
                    "worker {} does not advertise profile {profile}",
                    decision.worker_id.as_str()
                ),
            ));
        }
    }

    // A pool behind an upstream proxy: the username is rendered here, from the request's hints
    // and the provider session routing derived (decision 006), so every exchange of the request
    // uses the same one.
    let via = match active.proxy(decision.pool) {
        None => None,
        Some(pool) => {
            // A remote worker gets the rendered username in its assignment and uses the
            // pool's proxy from its applied configuration (decision 063).
            let session_hex = decision.provider_session.map(|s| s.to_hex());
            let values = TemplateValues {
                country: hints.country.as_ref().map_or("", |c| c.as_str()),
                region: hints.region.as_deref().unwrap_or(""),
                ip_type: hints.ip_type.as_deref().unwrap_or(""),
                session: session_hex
                    .as_ref()
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .unwrap_or(""),
            };
            Some(pool.route(&values, decision.provider_session)?)
        }
    };

    let Some(slot) = active.slot(decision.worker).cloned() else {
        return Err(ApiError::new(
            ErrorCode::RouteUnavailable,
            "selected worker has no local executor",
        ));
    };
    let max = active
        .table
        .worker(decision.worker)
        .and_then(|w| w.capabilities())
        .map_or(0, |c| c.max_capacity());
    if !slot.try_acquire(max) {
        return Err(ApiError::new(
            ErrorCode::ExecutorCapacityExhausted,
            "all eligible workers at capacity",
        ));
    }
    let is_remote = active
        .table
        .worker(decision.worker)
        .is_some_and(|w| w.executor() == sortie_core::worker::Executor::Remote);
    Ok(Assigned {
        decision,
        _capacity: CapacityGuard(slot.clone()),
        slot,
        routed,
        via,
        is_remote,
    })
}

struct CapacityGuard(Arc<WorkerSlot>);

impl Drop for CapacityGuard {
    fn drop(&mut self) {
        self.0.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{run_on, Driver};

    /// A core loads the shared snapshot once and keeps it; each publication, of a new revision
    /// or of a rebuilt table, makes its next request load the new one.
    #[test]
    fn a_core_keeps_its_snapshot_until_another_is_published() {
        let mut json = sortie_core::snapshot::DEFAULT_SNAPSHOT_JSON
            .as_bytes()
            .to_vec();
        let snapshot = Arc::new(sortie_core::snapshot::decode_snapshot(&mut json).unwrap());
        let state = Arc::new(ControlState::new(
            &sortie_core::config::Config::default(),
            crate::tokens::Authenticator::new(&[]),
            "admin-token-for-tests".into(),
            sortie_core::worker::WorkerRegistry::new(),
            1,
            Arc::clone(&snapshot),
        ));
        let resolver = crate::dns::ResolverPool::start().unwrap();
        run_on(Driver::detect(), async move {
            let tls = crate::egress::client_config(None).unwrap();
            let egress = Rc::new(Egress::new(crate::dns::Resolver::new(resolver), &tls));
            let ctx = Dispatcher::new(
                Arc::clone(&state),
                Rc::new(ActiveRequests::default()),
                egress,
                Arc::new(crate::metrics::Metrics::new(1)),
                0,
            );
            let first = ctx.active_snapshot();
            assert!(
                Rc::ptr_eq(&first, &ctx.active_snapshot()),
                "kept while nothing changed"
            );
            assert!(Arc::ptr_eq(&first, &state.active()));

            assert!(state.activate(2, Arc::clone(&snapshot)));
            let second = ctx.active_snapshot();
            assert_eq!(second.revision, 2);
            assert!(Arc::ptr_eq(&second, &state.active()));
            assert!(Rc::ptr_eq(&second, &ctx.active_snapshot()));

            // A registry change republishes the table under the same revision.
            state.update_registry(|_| ());
            let third = ctx.active_snapshot();
            assert_eq!(third.revision, 2);
            assert!(
                !Arc::ptr_eq(&second, &third),
                "the rebuilt table, not the one before"
            );
            assert!(Arc::ptr_eq(&third, &state.active()));
        });
    }
}
