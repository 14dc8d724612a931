//! Following a shared record store (decision 092): when several controls share one PostgreSQL
//! database, a revision committed by one of them must become the active snapshot of every
//! other. A thread of its own (`sortie-follow`) listens on the database's notification channels
//! and, on a notification or at the latest every [`POLL_INTERVAL`] (the safety net for a lost
//! notification or a dropped listening connection), compares the store's newest revision with
//! the active one and publishes what is newer. Worker settings follow the same way.
//!
//! Reads go through the cold thread like every other store access; the listening connection is
//! the only one this thread owns. When the database is unreachable nothing changes: the cores
//! keep serving the last applied snapshot, and the thread retries at every interval.

use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use sortie_core::snapshot::{decode_snapshot, ConfigId};
use sortie_core::worker::WorkerSettings as CoreSettings;

use crate::control::state::ControlState;
use crate::store::{
    ColdHandle, PostgresConfig, StoreError, WorkerSettings as StoredSettings, CONFIG_CHANNEL,
    WORKERS_CHANNEL,
};

/// The longest a committed revision takes to reach this control when its notification is lost.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// How long [`Follower::stop`] waits for the thread before leaving it to end with the process.
pub const STOP_WAIT: Duration = Duration::from_secs(3);

/// The running follower; dropping it (or [`Follower::stop`]) ends the thread within one
/// interval.
#[derive(Debug)]
pub struct Follower {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Follower {
    /// Starts following. `listen` is the database to `LISTEN` on; without it the follower only
    /// polls.
    pub fn start(
        state: Arc<ControlState>,
        cold: ColdHandle,
        listen: Option<PostgresConfig>,
        interval: Duration,
    ) -> std::io::Result<Follower> {
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("sortie-follow".into())
            .spawn(move || run(&state, &cold, listen.as_ref(), interval, &stopped))?;
        Ok(Follower {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Stops the thread, waiting for it at most [`STOP_WAIT`]: during a database outage it may
    /// be inside a store call, and a stopping process need not wait for that.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        drop(self.stop.take());
        let Some(t) = self.thread.take() else {
            return;
        };
        let deadline = std::time::Instant::now() + STOP_WAIT;
        while !t.is_finished() && std::time::Instant::now() < deadline {
            std::thread::park_timeout(Duration::from_millis(20));
        }
        if t.is_finished() {
            let _ = t.join();
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Whether the stop signal came (a message or the sender's drop).
fn is_stopped(stopped: &mpsc::Receiver<()>) -> bool {
    !matches!(stopped.try_recv(), Err(mpsc::TryRecvError::Empty))
}

fn run(
    state: &ControlState,
    cold: &ColdHandle,
    listen: Option<&PostgresConfig>,
    interval: Duration,
    stopped: &mpsc::Receiver<()>,
) {
    let mut listener: Option<postgres::Client> = None;
    // Log a lost database once per outage, not at every interval.
    let mut is_degraded = false;
    // The newest revision that failed validation here, logged once.
    let mut rejected = 0;
    loop {
        if is_stopped(stopped) {
            return;
        }
        let waited = match (listen, listener.as_mut()) {
            (Some(_), Some(client)) => wait_notification(client, interval),
            (Some(config), None) => match subscribe(config) {
                Ok(client) => {
                    listener = Some(client);
                    // Anything committed while no one listened is caught by the check below.
                    Ok(())
                }
                Err(e) => Err(e),
            },
            (None, _) => Ok(()),
        };
        if waited.is_err() {
            listener = None;
        }
        let synced = sync(state, cold, &mut rejected);
        match (waited.and(synced), is_degraded) {
            (Err(e), false) => {
                tracing::warn!(error = %e, "cannot follow the shared store; serving the last applied configuration");
                is_degraded = true;
            }
            (Ok(()), true) => {
                tracing::info!("following the shared store again");
                is_degraded = false;
            }
            _ => {}
        }
        // Without a listening connection, pace the checks by the interval (a stop ends the
        // wait at once); with one, the wait for a notification did.
        if listener.is_none() {
            match stopped.recv_timeout(interval) {
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                _ => return,
            }
        }
    }
}

/// Opens the listening connection.
fn subscribe(config: &PostgresConfig) -> Result<postgres::Client, StoreError> {
    let mut client = config.connect()?;
    client
        .batch_execute(&format!(
            "LISTEN {CONFIG_CHANNEL}; LISTEN {WORKERS_CHANNEL}"
        ))
        .map_err(|e| StoreError::Database(format!("LISTEN: {e}")))?;
    Ok(client)
}

/// Waits up to `interval` for a notification, then takes every other one already queued (one
/// check covers them all).
fn wait_notification(client: &mut postgres::Client, interval: Duration) -> Result<(), StoreError> {
    use postgres::fallible_iterator::FallibleIterator as _;
    let lost = |e: postgres::Error| StoreError::Database(format!("listening connection: {e}"));
    {
        let mut notifications = client.notifications();
        if notifications
            .timeout_iter(interval)
            .next()
            .map_err(lost)?
            .is_some()
        {
            while notifications.iter().next().map_err(lost)?.is_some() {}
        }
    }
    if client.is_closed() {
        return Err(StoreError::Database(
            "the listening connection closed".into(),
        ));
    }
    Ok(())
}

/// Publishes the store's newest config revision if it is newer than the active one, and the
/// worker settings whose revision is newer than this control's.
fn sync(state: &ControlState, cold: &ColdHandle, rejected: &mut u64) -> Result<(), StoreError> {
    sync_config(state, cold, rejected)?;
    sync_workers(state, cold)
}

fn sync_config(
    state: &ControlState,
    cold: &ColdHandle,
    rejected: &mut u64,
) -> Result<(), StoreError> {
    let head = cold.call_blocking(|s| s.latest_revision())?;
    if head <= state.active().revision || head == *rejected {
        return Ok(());
    }
    let Some(record) = cold.call_blocking(|s| s.latest_config())? else {
        return Ok(());
    };
    let mut bytes = record.snapshot_json.into_bytes();
    let snapshot = match decode_snapshot(&mut bytes) {
        Ok(s) => s,
        Err(e) => {
            // Another control accepted it, this build does not (a mixed-version cluster): keep
            // serving the last snapshot this build understands, and say so once.
            *rejected = record.revision;
            tracing::error!(revision = record.revision, error = %e, "a revision committed by another control does not validate here; keeping the active one");
            return Ok(());
        }
    };
    let payload = snapshot.to_json();
    if state.activate(record.revision, Arc::new(snapshot)) {
        crate::control::core::push_config(state, record.revision, payload);
        tracing::info!(revision = record.revision, actor = %record.actor, action = %record.action, "configuration activated from the shared store");
    }
    Ok(())
}

fn sync_workers(state: &ControlState, cold: &ColdHandle) -> Result<(), StoreError> {
    let stored = cold.call_blocking(|s| s.all_worker_settings())?;
    apply_worker_settings(state, stored);
    Ok(())
}

/// Applies each stored settings record whose revision is newer than this control's (another
/// control committed it); older or equal ones, and ids that are not valid, are left alone.
/// Rebuilds the routing table only when something changed.
pub(crate) fn apply_worker_settings(state: &ControlState, stored: Vec<StoredSettings>) {
    let newer: Vec<_> = state.with_registry(|reg, _| {
        stored
            .into_iter()
            .filter(|s| {
                ConfigId::parse(&s.worker_id).is_ok()
                    && reg
                        .get(&s.worker_id)
                        .is_none_or(|r| r.settings().revision < s.revision)
            })
            .collect()
    });
    if newer.is_empty() {
        return;
    }
    state.update_registry(|reg| {
        for s in newer {
            let Ok(id) = ConfigId::parse(&s.worker_id) else {
                continue;
            };
            // Checked again under the writer lock: a local action may have moved on meanwhile.
            if reg
                .get(&s.worker_id)
                .is_some_and(|r| r.settings().revision >= s.revision)
            {
                continue;
            }
            reg.set_settings(
                id,
                CoreSettings {
                    is_enabled: s.is_enabled,
                    is_draining: s.is_draining,
                    revision: s.revision,
                },
            );
            tracing::info!(worker = %s.worker_id, revision = s.revision, "worker settings followed from the shared store");
        }
    });
}
