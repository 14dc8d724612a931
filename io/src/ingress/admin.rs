//! The admin API (`/api/v1/admin/...`), `/healthz`, `/readyz` and `/metrics`, independent of
//! the HTTP server: a request comes in as [`AdminRequest`], an [`AdminAnswer`] goes out.
//!
//! Activation order: a validated snapshot is committed to the store first and published to the
//! cores only after the commit succeeded, so a store failure never activates anything.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;
use sortie_core::error::{admin_error_json, AdminErrorKind};
use sortie_core::etag::{etag, require_if_match};
use sortie_core::json::{from_slice_strict, write_str};
use sortie_core::limits::MAX_ADMIN_BODY_BYTES;
use sortie_core::snapshot::{decode_snapshot, SnapshotError, ValidatedSnapshot};
use sortie_core::worker::{
    ActionError, WorkerAction, WorkerRecord, WorkerSettings as CoreSettings,
};

use crate::clock;
use crate::control::core::{cancel_request, list_active};
use crate::control::state::{ControlState, WorkerSlot};
use crate::store::{ColdHandle, ConfigRecord, StoreError, HISTORY_LIMIT};
use crate::tokens::{bearer, token_matches};

/// Longest `X-Service-Actor` value kept in the audit record.
pub const MAX_ACTOR_BYTES: usize = 256;
/// Actor recorded when a mutation carries no `X-Service-Actor`.
pub const UNATTRIBUTED_ACTOR: &str = "unattributed";
/// How long a cancelled request id keeps answering 204 to a repeated DELETE.
pub const CANCEL_MEMORY: Duration = Duration::from_secs(600);
/// Most cancelled ids remembered.
const CANCEL_MEMORY_ENTRIES: usize = 10_000;

/// One admin request as the HTTP layer hands it over.
pub struct AdminRequest<'a> {
    /// Method.
    pub method: &'a str,
    /// Path without the query.
    pub path: &'a str,
    /// `Authorization`.
    pub authorization: Option<&'a [u8]>,
    /// `If-Match`.
    pub if_match: Option<&'a [u8]>,
    /// `X-Service-Actor`.
    pub actor: Option<&'a [u8]>,
    /// The body (at most [`MAX_ADMIN_BODY_BYTES`] + 1 bytes were read).
    pub body: Vec<u8>,
}

/// The answer.
pub struct AdminAnswer {
    /// HTTP status.
    pub status: u16,
    /// `ETag` header, quoted.
    pub etag: Option<String>,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// Body.
    pub body: Vec<u8>,
}

impl AdminAnswer {
    /// 204 without a body: a cancellation that succeeded.
    fn no_content() -> AdminAnswer {
        AdminAnswer {
            status: 204,
            etag: None,
            content_type: "application/json",
            body: vec![],
        }
    }

    fn json(status: u16, body: Vec<u8>) -> AdminAnswer {
        AdminAnswer {
            status,
            etag: None,
            content_type: "application/json",
            body,
        }
    }

    fn error(kind: AdminErrorKind) -> AdminAnswer {
        AdminAnswer::json(kind.http_status(), admin_error_json(kind.as_str()))
    }

    /// An answer of `kind`'s status whose `error` says what failed.
    fn diagnostic(kind: AdminErrorKind, message: &str) -> AdminAnswer {
        AdminAnswer::json(kind.http_status(), admin_error_json(message))
    }

    fn with_etag(mut self, revision: u64) -> AdminAnswer {
        self.etag = Some(etag(revision));
        self
    }
}

/// The diagnostic of a mutation body over [`MAX_ADMIN_BODY_BYTES`] (spec, Admin API rule 2).
pub(crate) fn body_too_large_message() -> String {
    format!("body is larger than {MAX_ADMIN_BODY_BYTES} bytes")
}

/// What the admin API needs.
pub struct AdminContext {
    /// Shared control state.
    pub state: Arc<ControlState>,
    /// The cold thread.
    pub store: ColdHandle,
    /// Renders `/metrics`.
    pub metrics: Arc<dyn Fn() -> String + Send + Sync>,
    /// Serialises mutations of this process so that store commit and activation happen in the
    /// same order.
    pub mutation: futures_util::lock::Mutex<()>,
    cancelled: Mutex<VecDeque<(String, Instant)>>,
}

impl AdminContext {
    /// A context over the state and store.
    pub fn new(
        state: Arc<ControlState>,
        store: ColdHandle,
        metrics: Arc<dyn Fn() -> String + Send + Sync>,
    ) -> AdminContext {
        AdminContext {
            state,
            store,
            metrics,
            mutation: futures_util::lock::Mutex::new(()),
            cancelled: Mutex::new(VecDeque::new()),
        }
    }

    fn remember_cancel(&self, id: &str) {
        let mut q = self.cancelled.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        while q
            .front()
            .is_some_and(|(_, t)| now.duration_since(*t) > CANCEL_MEMORY)
            || q.len() >= CANCEL_MEMORY_ENTRIES
        {
            q.pop_front();
        }
        q.push_back((id.to_string(), now));
    }

    fn was_cancelled(&self, id: &str) -> bool {
        let q = self.cancelled.lock().unwrap_or_else(|p| p.into_inner());
        q.iter()
            .any(|(i, t)| i == id && t.elapsed() <= CANCEL_MEMORY)
    }
}

fn store_error(e: &StoreError) -> AdminAnswer {
    match e {
        StoreError::RevisionConflict { .. } => AdminAnswer::error(AdminErrorKind::RevisionConflict),
        other => AdminAnswer::diagnostic(AdminErrorKind::InternalError, &format!("store: {other}")),
    }
}

fn parse_actor(v: Option<&[u8]>) -> Result<String, AdminAnswer> {
    match v {
        None => Ok(UNATTRIBUTED_ACTOR.to_string()),
        Some(b) => {
            let s = std::str::from_utf8(b.trim_ascii()).map_err(|_| {
                AdminAnswer::diagnostic(
                    AdminErrorKind::InvalidRequest,
                    "X-Service-Actor must be UTF-8",
                )
            })?;
            if s.is_empty() || s.len() > MAX_ACTOR_BYTES || s.chars().any(char::is_control) {
                return Err(AdminAnswer::diagnostic(
                    AdminErrorKind::InvalidRequest,
                    "X-Service-Actor must be 1 to 256 bytes of printable text",
                ));
            }
            Ok(s.to_string())
        }
    }
}

fn if_match(req: &AdminRequest<'_>) -> Result<u64, AdminAnswer> {
    let v = match req.if_match {
        None => None,
        Some(b) => Some(
            std::str::from_utf8(b)
                .map_err(|_| AdminAnswer::error(AdminErrorKind::InvalidIfMatch))?,
        ),
    };
    require_if_match(v).map_err(|e| AdminAnswer::error(e.kind()))
}

fn record_json(r: &ConfigRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(r.snapshot_json.len() + 128);
    write_record(&mut out, r);
    out
}

fn write_record(out: &mut Vec<u8>, r: &ConfigRecord) {
    out.extend_from_slice(b"{\"snapshot\":");
    out.extend_from_slice(r.snapshot_json.as_bytes());
    out.extend_from_slice(b",\"actor\":");
    write_str(out, &r.actor);
    out.extend_from_slice(b",\"action\":");
    write_str(out, &r.action);
    out.extend_from_slice(b",\"created_at\":");
    write_str(out, &r.created_at);
    out.extend_from_slice(format!(",\"revision\":{}}}", r.revision).as_bytes());
}

fn snapshot_error(e: &SnapshotError) -> AdminAnswer {
    match e {
        SnapshotError::Decode(j) => AdminAnswer::diagnostic(
            AdminErrorKind::InvalidRequest,
            &format!("invalid JSON: {j}"),
        ),
        SnapshotError::Invalid { path, .. } => {
            // Decision 013: the 422 body carries the path and the message beside the error key.
            let mut out = Vec::new();
            out.extend_from_slice(b"{\"error\":\"invalid_snapshot\",\"path\":");
            write_str(&mut out, path);
            out.extend_from_slice(b",\"message\":");
            write_str(&mut out, &e.to_string());
            out.push(b'}');
            AdminAnswer::json(422, out)
        }
    }
}

/// Paths served without the admin token: the probes. (The HTTP adapter adds its own: the
/// OpenAPI document and the dashboard's files.)
pub(crate) fn is_public_path(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz")
}

/// Whether `authorization` carries the admin bearer token (constant-time comparison).
pub(crate) fn is_authorized(ctx: &AdminContext, authorization: Option<&[u8]>) -> bool {
    authorization
        .and_then(bearer)
        .is_some_and(|t| token_matches(&ctx.state.admin_token.load(), t))
}

/// Serves one admin request.
pub async fn handle(ctx: &AdminContext, req: AdminRequest<'_>) -> AdminAnswer {
    match (req.method, req.path) {
        ("GET" | "HEAD", "/healthz") => {
            return AdminAnswer {
                status: 200,
                etag: None,
                content_type: "text/plain",
                body: b"ok\n".to_vec(),
            }
        }
        ("GET" | "HEAD", "/readyz") => {
            // From the cold thread's last probe: a readiness check queues nothing, so a flood
            // of them cannot crowd out admin writes.
            return if ctx.store.is_ready() {
                AdminAnswer {
                    status: 200,
                    etag: None,
                    content_type: "text/plain",
                    body: b"ready\n".to_vec(),
                }
            } else {
                AdminAnswer::diagnostic(AdminErrorKind::StoreUnavailable, "store unavailable")
            };
        }
        _ => {}
    }
    // The HTTP adapter already refused a missing or wrong token from the head; checked again
    // so that this function stands on its own.
    if !is_authorized(ctx, req.authorization) {
        return AdminAnswer::error(AdminErrorKind::AuthRequired);
    }
    if req.body.len() > MAX_ADMIN_BODY_BYTES {
        return AdminAnswer::diagnostic(AdminErrorKind::InvalidRequest, &body_too_large_message());
    }
    let segments: Vec<&str> = req.path.trim_start_matches('/').split('/').collect();
    match (req.method, segments.as_slice()) {
        ("GET", ["metrics"]) => AdminAnswer {
            status: 200,
            etag: None,
            content_type: "text/plain; version=0.0.4",
            body: (ctx.metrics)().into_bytes(),
        },
        ("GET", ["api", "v1", "admin", "config"]) => match ctx.store.latest_config().await {
            Ok(Some(r)) => AdminAnswer::json(200, record_json(&r)).with_etag(r.revision),
            Ok(None) => AdminAnswer::diagnostic(
                AdminErrorKind::InternalError,
                "store holds no configuration",
            ),
            Err(e) => store_error(&e),
        },
        ("PUT", ["api", "v1", "admin", "config"]) => put_config(ctx, req).await,
        ("GET", ["api", "v1", "admin", "config", "history"]) => {
            match ctx.store.history(HISTORY_LIMIT).await {
                Ok(items) => {
                    let mut out = b"{\"items\":[".to_vec();
                    for (i, r) in items.iter().enumerate() {
                        if i > 0 {
                            out.push(b',');
                        }
                        write_record(&mut out, r);
                    }
                    out.extend_from_slice(b"]}");
                    AdminAnswer::json(200, out)
                }
                Err(e) => store_error(&e),
            }
        }
        ("POST", ["api", "v1", "admin", "config", "rollback"]) => rollback(ctx, req).await,
        ("GET", ["api", "v1", "admin", "rollouts"]) => rollouts(ctx),
        ("GET", ["api", "v1", "admin", "workers"]) => workers(ctx),
        ("POST", ["api", "v1", "admin", "workers", id, action]) => {
            let (id, action) = (id.to_string(), action.to_string());
            worker_action(ctx, req, &id, &action).await
        }
        ("GET", ["api", "v1", "admin", "requests"]) => {
            let items = list_active(&ctx.state).await;
            let mut out = b"{\"items\":[".to_vec();
            for (i, it) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(b"{\"request_id\":");
                write_str(&mut out, &it.request_id);
                out.extend_from_slice(b",\"deployment_id\":");
                write_str(&mut out, &it.deployment_id);
                out.push(b'}');
            }
            out.extend_from_slice(b"]}");
            AdminAnswer::json(200, out)
        }
        ("DELETE", ["api", "v1", "admin", "requests", id]) => {
            let id = id.to_string();
            if cancel_request(&ctx.state, &id).await {
                ctx.remember_cancel(&id);
                AdminAnswer::no_content()
            } else if ctx.was_cancelled(&id) {
                // Spec, Admin rule 4: cancellation may be repeated safely.
                AdminAnswer::no_content()
            } else {
                // Not ours: on a shared store another control may run it (decision 095).
                match crate::control::presence::cancel_elsewhere(&ctx.store, &id).await {
                    Ok(true) => {
                        ctx.remember_cancel(&id);
                        AdminAnswer::no_content()
                    }
                    Ok(false) => AdminAnswer::error(AdminErrorKind::RequestNotFound),
                    Err(e) => store_error(&e),
                }
            }
        }
        (_, ["api", "v1", "admin", ..]) | (_, ["metrics"]) => {
            AdminAnswer::diagnostic(AdminErrorKind::NotFound, "no such admin route or method")
        }
        _ => AdminAnswer::diagnostic(AdminErrorKind::NotFound, "not found"),
    }
}

async fn commit_and_activate(
    ctx: &AdminContext,
    expected: u64,
    snapshot: ValidatedSnapshot,
    actor: &str,
    action: &str,
) -> AdminAnswer {
    let json = String::from_utf8_lossy(&snapshot.to_json()).into_owned();
    let _serial = ctx.mutation.lock().await;
    match ctx
        .store
        .append_config(expected, json, actor, action, &clock::now_rfc3339())
        .await
    {
        Ok(record) => {
            let payload = snapshot.to_json();
            if ctx.state.activate(record.revision, Arc::new(snapshot)) {
                crate::control::core::push_config(&ctx.state, record.revision, payload);
            }
            tracing::info!(revision = record.revision, actor = %record.actor, action = %record.action, "configuration activated");
            AdminAnswer::json(200, record_json(&record)).with_etag(record.revision)
        }
        Err(e) => store_error(&e),
    }
}

async fn put_config(ctx: &AdminContext, mut req: AdminRequest<'_>) -> AdminAnswer {
    let expected = match if_match(&req) {
        Ok(r) => r,
        Err(a) => return a,
    };
    let actor = match parse_actor(req.actor) {
        Ok(a) => a,
        Err(a) => return a,
    };
    let snapshot = match decode_snapshot(&mut req.body) {
        Ok(s) => s,
        Err(e) => return snapshot_error(&e),
    };
    commit_and_activate(ctx, expected, snapshot, &actor, "update").await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RollbackBody {
    config_version: u64,
}

async fn rollback(ctx: &AdminContext, mut req: AdminRequest<'_>) -> AdminAnswer {
    let expected = match if_match(&req) {
        Ok(r) => r,
        Err(a) => return a,
    };
    let actor = match parse_actor(req.actor) {
        Ok(a) => a,
        Err(a) => return a,
    };
    let body: RollbackBody = match from_slice_strict(&mut req.body, MAX_ADMIN_BODY_BYTES) {
        Ok(b) => b,
        Err(e) => {
            return AdminAnswer::diagnostic(
                AdminErrorKind::InvalidRequest,
                &format!("invalid JSON: {e}"),
            )
        }
    };
    let record = match ctx.store.config_at(body.config_version).await {
        Ok(Some(r)) => r,
        Ok(None) => {
            return AdminAnswer::json(
                422,
                format!(
                    "{{\"error\":\"unknown_config_version\",\"message\":\"config_version {} is not in the kept history\"}}",
                    body.config_version
                )
                .into_bytes(),
            )
        }
        Err(e) => return store_error(&e),
    };
    let mut bytes = record.snapshot_json.into_bytes();
    let snapshot = match decode_snapshot(&mut bytes) {
        Ok(s) => s,
        Err(e) => return snapshot_error(&e),
    };
    commit_and_activate(ctx, expected, snapshot, &actor, "rollback").await
}

fn rollouts(ctx: &AdminContext) -> AdminAnswer {
    let active = ctx.state.active();
    let mut out = format!(
        "{{\"config_version\":{},\"control\":{{\"status\":\"applied\"}},\"entries\":[",
        active.revision
    )
    .into_bytes();
    // Local workers run in this process: they apply a snapshot the moment it is activated.
    // A connected remote worker is pending until it acknowledges this revision on the bus.
    let mut first = true;
    for (i, w) in active.table.workers().iter().enumerate() {
        let Some(slot) = active.slots.get(i).and_then(Option::as_ref) else {
            continue;
        };
        if w.capabilities().is_none() {
            continue;
        }
        let status = match w.executor() {
            sortie_core::worker::Executor::Local => "applied",
            sortie_core::worker::Executor::Remote => {
                if w.state() != sortie_core::worker::WorkerState::Connected {
                    continue;
                }
                if slot.applied() >= active.revision {
                    "applied"
                } else {
                    "pending"
                }
            }
        };
        if !first {
            out.push(b',');
        }
        first = false;
        out.extend_from_slice(b"{\"worker_id\":");
        write_str(&mut out, w.id().as_str());
        out.extend_from_slice(b",\"status\":");
        write_str(&mut out, status);
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    AdminAnswer::json(200, out)
}

fn write_opt(out: &mut Vec<u8>, v: Option<&str>) {
    match v {
        Some(s) => write_str(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

fn write_list<'a>(out: &mut Vec<u8>, items: impl Iterator<Item = &'a str>) {
    out.push(b'[');
    for (i, s) in items.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(out, s);
    }
    out.push(b']');
}

fn write_worker(out: &mut Vec<u8>, w: &WorkerRecord, slot: Option<&WorkerSlot>) {
    let active = slot.map_or(0, |s| s.active());
    out.extend_from_slice(b"{\"worker_id\":");
    write_str(out, w.id().as_str());
    out.extend_from_slice(b",\"session\":");
    write_opt(out, w.session());
    out.extend_from_slice(b",\"state\":");
    write_str(out, w.state().as_str());
    out.extend_from_slice(
        format!(
            ",\"enabled\":{},\"draining\":{}",
            w.is_enabled(),
            w.is_draining()
        )
        .as_bytes(),
    );
    out.extend_from_slice(b",\"executor\":");
    write_str(out, w.executor().as_str());
    let cap = w.capacity(active);
    out.extend_from_slice(
        format!(
            ",\"capacity\":{{\"active\":{},\"available\":{},\"max\":{}}}",
            cap.active, cap.available, cap.max
        )
        .as_bytes(),
    );
    out.extend_from_slice(b",\"last_seen\":");
    // A connected remote worker's heartbeats are recorded in its slot, without the registry.
    let heard = slot
        .filter(|_| w.state() == sortie_core::worker::WorkerState::Connected)
        .and_then(WorkerSlot::last_heard);
    let seen = w.last_seen_unix_ms().max(heard).map(clock::rfc3339);
    write_opt(out, seen.as_deref());
    let caps = w.capabilities();
    out.extend_from_slice(b",\"pools\":");
    write_list(
        out,
        caps.into_iter()
            .flat_map(|c| c.pools().iter().map(|p| p.as_str())),
    );
    out.extend_from_slice(b",\"tags\":");
    write_list(
        out,
        caps.into_iter().flat_map(|c| c.tags().iter().map(|t| &**t)),
    );
    out.extend_from_slice(b",\"country\":");
    let country = caps.and_then(|c| c.country());
    write_opt(out, country.as_ref().map(|c| c.as_str()));
    out.extend_from_slice(b",\"region\":");
    write_opt(out, caps.and_then(|c| c.region()));
    out.extend_from_slice(b",\"ip_type\":");
    write_opt(out, caps.and_then(|c| c.ip_type()));
    out.extend_from_slice(b",\"ingress\":");
    write_list(
        out,
        caps.into_iter()
            .flat_map(|c| c.ingress().iter().map(|m| m.as_str())),
    );
    out.extend_from_slice(b",\"fingerprint_profiles\":");
    write_list(
        out,
        caps.into_iter()
            .flat_map(|c| c.fingerprint_profiles().iter().map(|p| &**p)),
    );
    out.extend_from_slice(b",\"etag\":");
    write_str(out, &etag(w.settings().revision));
    out.push(b'}');
}

fn workers(ctx: &AdminContext) -> AdminAnswer {
    let out = ctx.state.with_registry(|reg, slots| {
        let mut out = b"{\"items\":[".to_vec();
        for (i, w) in reg.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_worker(&mut out, w, slots.get(w.id().as_str()).map(Arc::as_ref));
        }
        out.extend_from_slice(b"]}");
        out
    });
    AdminAnswer::json(200, out)
}

async fn worker_action(
    ctx: &AdminContext,
    req: AdminRequest<'_>,
    id: &str,
    action: &str,
) -> AdminAnswer {
    let Some(action) = WorkerAction::from_wire(action) else {
        return AdminAnswer::diagnostic(
            AdminErrorKind::InvalidRequest,
            "unknown action: use drain, undrain, disable or enable",
        );
    };
    let Ok(worker_id) = sortie_core::snapshot::ConfigId::parse(id) else {
        return AdminAnswer::diagnostic(
            AdminErrorKind::InvalidRequest,
            "worker id is not a valid identifier",
        );
    };
    let expected = match if_match(&req) {
        Ok(r) => r,
        Err(a) => return a,
    };
    if !req.body.iter().all(u8::is_ascii_whitespace) {
        return AdminAnswer::diagnostic(
            AdminErrorKind::InvalidRequest,
            "worker actions take no body",
        );
    }
    let actor = match parse_actor(req.actor) {
        Ok(a) => a,
        Err(a) => return a,
    };
    // One step (decision 042): every check that can refuse the action runs before the commit,
    // and what follows the commit cannot fail. Worker settings change only here, under the
    // mutation lock, so the plan still holds when it is applied.
    let _serial = ctx.mutation.lock().await;
    // The store holds the truth: another control sharing it may have changed this worker a
    // moment ago, before this control's follower applied it (decision 092). Apply a newer
    // stored record first, so that an If-Match read anywhere is judged against it.
    match ctx.store.worker_settings(id).await {
        Ok(stored) => {
            crate::control::follow::apply_worker_settings(&ctx.state, stored.into_iter().collect());
        }
        Err(e) => return store_error(&e),
    }
    let plan = ctx
        .state
        .with_registry(|reg, _| reg.plan_action(&worker_id, action, expected));
    let next = match plan {
        Ok(next) => next,
        Err(ActionError::RevisionConflict { .. }) => {
            return AdminAnswer::error(AdminErrorKind::RevisionConflict)
        }
        Err(e) => return AdminAnswer::diagnostic(AdminErrorKind::InvalidRequest, &e.to_string()),
    };
    let stored = match ctx
        .store
        .update_worker_settings(
            id,
            expected,
            next.is_enabled,
            next.is_draining,
            &actor,
            &clock::now_rfc3339(),
        )
        .await
    {
        Ok(stored) => stored,
        Err(e) => return store_error(&e),
    };
    // The store's record is the truth; it equals the plan unless the store was changed
    // behind this process's back, and then memory follows the store.
    let committed = CoreSettings {
        is_enabled: stored.is_enabled,
        is_draining: stored.is_draining,
        revision: stored.revision,
    };
    // The answer is the worker record as the list shows it, live capacity included.
    let slot = ctx.state.slot_of(id);
    let body = ctx.state.update_registry(|reg| {
        let mut out = Vec::new();
        write_worker(
            &mut out,
            reg.set_settings(worker_id, committed),
            slot.as_deref(),
        );
        out
    });
    tracing::info!(worker = id, action = action.as_str(), actor = %actor, revision = committed.revision, "worker action");
    AdminAnswer::json(200, body).with_etag(committed.revision)
}
