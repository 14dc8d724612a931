//! Noticing a client that leaves while its request is served, so that the handler can be
//! dropped (and with it the upstream work and the capacity it holds) instead of running to its
//! deadline for nobody.
//!
//! Watching costs nothing for a request answered within [`ServerConfig::departure_watch_after`]
//! but one timer: only then is the connection's descriptor duplicated and waited on, so the
//! handler's own reads of the original are untouched. A close, a reset or a half-close counts
//! as leaving, even behind bytes the server has not read yet (a pipelined request).
//!
//! [`ServerConfig::departure_watch_after`]: super::ServerConfig::departure_watch_after

use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use crate::fd::{self, PeerState};

/// How often a connection with unread bytes is checked again: unread bytes keep the socket
/// readable, so readiness cannot tell when it closes.
pub const RECHECK_WITH_UNREAD_BYTES: Duration = Duration::from_millis(100);

/// Completes when the client behind `fd` has left; pending forever while it stays.
///
/// `fd` must stay open for as long as this future lives: the connection that owns it drops the
/// watch before closing. The first wait is on the connection's `timer`, set again by each
/// request (see [`crate::timer::Timer`]).
pub(crate) async fn client_departure(fd: RawFd, after: Duration, timer: &mut crate::timer::Timer) {
    timer.sleep(after).await;
    let watch = match fd::duplicate_stream(fd) {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(error = %e, "cannot watch the client connection");
            return std::future::pending().await;
        }
    };
    loop {
        match fd::peer_state(watch.as_raw_fd()) {
            PeerState::Gone => return,
            PeerState::Unread => crate::timer::sleep(RECHECK_WITH_UNREAD_BYTES).await,
            PeerState::Quiet => {
                // Readable means bytes, an end of stream or an error: the next round tells
                // which. A failed wait is retried after a pause rather than in a tight loop.
                if watch.readable(false).await.is_err() {
                    crate::timer::sleep(RECHECK_WITH_UNREAD_BYTES).await;
                }
            }
        }
    }
}
