//! Control heartbeat rows on a shared record store (decision 094): each control registers
//! itself at start and refreshes its row from the cold thread; a control whose row is older
//! than [`CONTROL_EXPIRY`] counts as dead, and the others recover the receipts it held.

use std::time::Duration;

use crate::store::{ColdHandle, StoreError};

/// How often a control refreshes its row and looks for dead controls.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);

/// A control not seen for this long counts as dead and its `verifying` and `assigned`
/// receipts are recovered by the others. Ten heartbeats: a control that misses one or two
/// (a store call that waited, a busy cold thread) stays alive; one killed is recovered within
/// seconds instead of the two hours of startup recovery (decision 093).
pub const CONTROL_EXPIRY: Duration = Duration::from_secs(10);

/// Registers this control (blocking, so that its row exists before it serves anything that
/// can hold a receipt) and starts the heartbeat on the cold thread. `address` is where this
/// control answers, recorded for operators.
pub fn start(cold: &ColdHandle, address: String) -> Result<(), StoreError> {
    let started_at = crate::clock::now_rfc3339();
    {
        let (address, started_at) = (address.clone(), started_at.clone());
        cold.call_blocking(move |s| s.control_heartbeat(&address, &started_at))?;
    }
    cold.spawn(move |ctx| async move {
        // Outages are logged when they start and when they end, not at every beat.
        let mut failing = false;
        loop {
            let now = crate::clock::now_rfc3339();
            let beat = ctx.store(|s| {
                s.control_heartbeat(&address, &started_at)?;
                s.recover_dead_controls(CONTROL_EXPIRY, &now)
            });
            match beat {
                Ok(recovered) => {
                    if failing {
                        tracing::info!("control heartbeat restored");
                        failing = false;
                    }
                    if recovered > 0 {
                        tracing::info!(
                            recovered,
                            "receipts held by a control no longer seen were recovered"
                        );
                    }
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "control heartbeat failed");
                        failing = true;
                    }
                }
            }
            tokio::time::sleep(HEARTBEAT_INTERVAL).await;
        }
    })
}
