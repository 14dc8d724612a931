//! A gate for scripted upstreams: requests wait in the upstream until the test opens the gate,
//! so a request stays in flight exactly as long as the test needs. Dropping the gate opens it.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::upstream::{Request, Script};

/// Longest a gated request waits when the test never opens the gate (bounds every test).
pub const GATE_LIMIT: Duration = Duration::from_secs(30);

pub struct Gate {
    inner: Arc<(Mutex<bool>, Condvar)>,
}

impl Gate {
    pub fn new() -> Gate {
        Gate {
            inner: Arc::new((Mutex::new(false), Condvar::new())),
        }
    }

    /// `then`, run once the gate is open (or after [`GATE_LIMIT`]).
    pub fn script(&self, then: Script) -> Script {
        let inner = self.inner.clone();
        Arc::new(move |r: &Request| {
            let (m, c) = &*inner;
            let deadline = Instant::now() + GATE_LIMIT;
            let mut open = m.lock().unwrap_or_else(|p| p.into_inner());
            while !*open {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                open = c
                    .wait_timeout(open, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            drop(open);
            then(r)
        })
    }

    pub fn open(&self) {
        let (m, c) = &*self.inner;
        *m.lock().unwrap_or_else(|p| p.into_inner()) = true;
        c.notify_all();
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
    }
}
