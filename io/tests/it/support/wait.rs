//! Waiting for a condition with a deadline, the one way the tests wait: polls with a short
//! backoff (1 ms doubling to 20 ms), never a fixed sleep, and fails the test with what it waited
//! for and the last thing it saw.

#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};

/// Calls `f` until it returns `Ok`, for at most `limit`; then fails the test with the last
/// `Err`, which says what was awaited and what was seen instead.
pub fn poll<T>(limit: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(1);
    loop {
        let err = match f() {
            Ok(v) => return v,
            Err(e) => e,
        };
        assert!(Instant::now() < deadline, "{err} (after {limit:?})");
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// Calls `f` until it returns `Some`, for at most `limit`.
pub fn eventually<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    poll(limit, || {
        f().ok_or_else(|| format!("timed out waiting for {what}"))
    })
}

/// Waits until `f` holds, for at most `limit`.
pub fn wait_until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    eventually(limit, what, || f().then_some(()))
}
