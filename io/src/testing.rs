//! Helpers the crate's unit tests share (compiled for tests only).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Wake;

/// A waker that counts how often it was woken: `Waker::from(Arc::clone(&counter))`.
#[derive(Default)]
pub(crate) struct CountingWaker(AtomicUsize);

impl CountingWaker {
    /// A counter at zero, shared so that a test keeps it beside the wakers made from it.
    pub(crate) fn new() -> Arc<CountingWaker> {
        Arc::new(CountingWaker::default())
    }

    /// How many times a waker made from it was woken.
    pub(crate) fn wakes(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}
