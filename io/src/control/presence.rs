//! Control heartbeat rows on a shared record store (decision 094): each control registers
//! itself at start and refreshes its row from the cold thread; a control whose row is older
//! than the expiry it recorded counts as dead, and the others recover the receipts it held.
//! Also the cancel intents through which an admin cancel reaches a request another control runs
//! (decision 095). The periods are settings (`[store]`, decision 099).

use std::sync::Arc;
use std::time::Duration;

use crate::control::state::ControlState;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::store::{ColdHandle, PresenceLane, StoreError};

/// A cancel intent no control carried out within this is removed: the request had ended, or
/// never ran. Longer than [`CANCEL_WAIT`], so the owner can still find it.
pub const CANCEL_INTENT_EXPIRY: Duration = Duration::from_secs(5);

/// How long an admin cancel of a request this control does not run waits for another control
/// to carry it out before answering 404: at least three poll intervals of the owner (the
/// longest `store.cancel_poll_ms` is 1 s), with room for a slow store call.
pub const CANCEL_WAIT: Duration = Duration::from_secs(3);

/// How often a control waiting on a cancel intent checks whether it was carried out.
const CANCEL_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// The periods of this control's presence on a shared store, from `[store]` (decision 099).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How often the control refreshes its row and looks for dead controls.
    pub heartbeat: Duration,
    /// How long after its last beat the others count it dead and recover its `verifying` and
    /// `assigned` receipts; recorded in its row. The default, ten beats, keeps a control that
    /// misses one or two (a store call that waited, a busy cold thread) alive, and recovers one
    /// killed within seconds instead of the two hours of startup recovery (decision 093).
    pub expiry: Duration,
    /// How often the control looks for cancel intents naming requests it may run.
    pub cancel_poll: Duration,
}

impl Timing {
    /// The periods `[store]` sets (validated there).
    pub fn from_config(store: &sortie_core::config::StoreConfig) -> Timing {
        let ms = |v: u32| Duration::from_millis(u64::from(v));
        Timing {
            heartbeat: ms(store.heartbeat_ms),
            expiry: ms(store.control_expiry_ms),
            cancel_poll: ms(store.cancel_poll_ms),
        }
    }
}

/// The running heartbeat of this control; [`Presence::stop`] ends it before the control
/// leaves (or lets its row expire).
#[derive(Debug)]
pub struct Presence {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Presence {
    /// Ends the heartbeat and waits for its thread: after this no beat writes the row.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// Registers this control (blocking, so that its row exists before it serves anything that
/// can hold a receipt) and starts the heartbeat: on a PostgreSQL store a thread of its own
/// beating through the store's heartbeat connection (decision 104), never behind other store
/// calls. `address` is where this control answers, recorded for operators.
pub fn start(cold: &ColdHandle, address: String, timing: Timing) -> Result<Presence, StoreError> {
    let started_at = crate::clock::now_rfc3339();
    {
        let (address, started_at) = (address.clone(), started_at.clone());
        cold.call_blocking(move |s| s.control_heartbeat(&address, &started_at, timing.expiry))?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let Some(lane) = cold.call_blocking(|s| Ok(s.presence_lane()))? else {
        // A store only one control uses keeps no row: nothing to beat.
        return Ok(Presence { stop, thread: None });
    };
    let stopping = stop.clone();
    let thread = std::thread::Builder::new()
        .name("sortie-presence".into())
        .spawn(move || beat_until_stopped(&lane, &address, &started_at, timing, &stopping))
        .map_err(|e| StoreError::Io(format!("cannot start the heartbeat thread: {e}")))?;
    Ok(Presence {
        stop,
        thread: Some(thread),
    })
}

/// The heartbeat loop on its own thread: a beat, then a pause of one period (cut short by
/// [`Presence::stop`]). Outages are logged when they start and when they end.
fn beat_until_stopped(
    lane: &PresenceLane,
    address: &str,
    started_at: &str,
    timing: Timing,
    stop: &AtomicBool,
) {
    let mut failing = false;
    while !stop.load(Ordering::Acquire) {
        let now = crate::clock::now_rfc3339();
        log_beat(
            lane.beat(address, started_at, timing.expiry, &now),
            &mut failing,
        );
        std::thread::park_timeout(timing.heartbeat);
    }
}

fn log_beat(beat: Result<usize, StoreError>, failing: &mut bool) {
    match beat {
        Ok(recovered) => {
            if *failing {
                tracing::info!("control heartbeat restored");
                *failing = false;
            }
            if recovered > 0 {
                tracing::info!(
                    recovered,
                    "receipts held by a control no longer seen were recovered"
                );
            }
        }
        Err(e) => {
            if !*failing {
                tracing::warn!(error = %e, "control heartbeat failed");
                *failing = true;
            }
        }
    }
}

/// Removes this control's row as it stops gracefully, after its cores finished (decision 098):
/// the receipts it still holds (requests cut off by the shutdown deadline) are recovered at once
/// rather than when the row expires. Waits for the store at most one call's timeout; a failure
/// is logged and the row then expires as after a crash.
pub fn leave(cold: &ColdHandle) {
    let now = crate::clock::now_rfc3339();
    match cold.call_blocking(move |s| s.control_leave(&now)) {
        Ok(0) => tracing::info!("control row removed from the shared store"),
        Ok(recovered) => tracing::info!(
            recovered,
            "control row removed from the shared store; receipts still held were recovered"
        ),
        Err(e) => tracing::warn!(error = %e, "cannot remove the control row; it will expire"),
    }
}

/// Starts the cold-thread task that carries out cancel intents: every `poll` it reads the
/// pending intents, cancels those naming requests this control runs, and marks them done so
/// the control that wrote the intent can answer 204.
pub fn watch_cancels(
    cold: &ColdHandle,
    state: Arc<ControlState>,
    poll: Duration,
) -> Result<(), StoreError> {
    cold.spawn(move |ctx| async move {
        let mut failing = false;
        loop {
            match ctx.store(|s| s.pending_cancels(CANCEL_INTENT_EXPIRY)) {
                Ok(ids) => {
                    failing = false;
                    for id in ids {
                        if crate::control::core::cancel_request(&state, &id).await {
                            if let Err(e) = ctx.store(|s| s.cancel_done(&id)) {
                                tracing::warn!(error = %e, "cannot report a cancel carried out");
                            }
                        }
                    }
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "cannot read cancel intents");
                        failing = true;
                    }
                }
            }
            tokio::time::sleep(poll).await;
        }
    })
}

/// Cancels a request another control may run (decision 095): writes a cancel intent and waits
/// up to [`CANCEL_WAIT`] for a control to carry it out. `Ok(false)` when none did, or when the
/// store is not shared.
pub async fn cancel_elsewhere(cold: &ColdHandle, request_id: &str) -> Result<bool, StoreError> {
    let id = request_id.to_owned();
    if !cold.call(move |s| s.request_cancel(&id)).await? {
        return Ok(false);
    }
    let deadline = std::time::Instant::now() + CANCEL_WAIT;
    loop {
        monoio::time::sleep(CANCEL_CHECK_INTERVAL).await;
        let id = request_id.to_owned();
        if cold.call(move |s| s.cancel_carried_out(&id)).await? {
            return Ok(true);
        }
        if std::time::Instant::now() >= deadline {
            return Ok(false);
        }
    }
}
