//! Deadlines of idle connections, kept by one timer per core instead of one per connection.
//!
//! A runtime timer entry is large (the runtime pads its parts to cache lines: a future that
//! holds one is several hundred bytes and 128-byte aligned), and an idle keep-alive connection
//! needs nothing else but its socket. So the wait of an idle connection registers its deadline
//! here, in a per-core ordered map, and one task per core sleeps until the earliest deadline
//! and wakes the waits whose time has come. Registering costs a map insertion when a
//! connection goes idle and a removal when its next request comes: never on the busy path.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use monoio::time::Instant;

/// The deadlines of one core.
#[derive(Default)]
struct Deadlines {
    /// Waiting deadlines by (deadline, id): the earliest first.
    waiting: BTreeMap<(Instant, u64), Waker>,
    next_id: u64,
    /// The ticker task, once it runs on this core's runtime, and its waker while it waits.
    is_ticking: bool,
    ticker: Option<Waker>,
    /// The deadline the ticker sleeps until, if it sleeps.
    ticker_until: Option<Instant>,
}

thread_local! {
    static DEADLINES: RefCell<Deadlines> = RefCell::new(Deadlines::default());
}

/// Completes at `deadline`, as `monoio::time::sleep_until` would, holding only its key.
pub(crate) fn until(deadline: Instant) -> IdleDeadline {
    IdleDeadline {
        deadline,
        key: Cell::new(None),
    }
}

/// The future returned by [`until`].
pub(crate) struct IdleDeadline {
    deadline: Instant,
    key: Cell<Option<u64>>,
}

impl Future for IdleDeadline {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if Instant::now() >= this.deadline {
            this.deregister();
            return Poll::Ready(());
        }
        DEADLINES.with(|d| {
            let mut d = d.borrow_mut();
            let id = match this.key.get() {
                Some(id) => id,
                None => {
                    let id = d.next_id;
                    d.next_id = d.next_id.wrapping_add(1);
                    this.key.set(Some(id));
                    id
                }
            };
            match d.waiting.get_mut(&(this.deadline, id)) {
                Some(w) if w.will_wake(cx.waker()) => {}
                Some(w) => *w = cx.waker().clone(),
                None => {
                    d.waiting.insert((this.deadline, id), cx.waker().clone());
                }
            }
            // The ticker sleeps until a later deadline, or not at all: it must look again.
            if d.ticker_until.is_none_or(|t| this.deadline < t) {
                if let Some(t) = d.ticker.take() {
                    t.wake();
                }
            }
            if !d.is_ticking {
                d.is_ticking = true;
                monoio::spawn(tick());
            }
        });
        Poll::Pending
    }
}

impl IdleDeadline {
    fn deregister(&self) {
        if let Some(id) = self.key.take() {
            // During a thread's teardown the map may be gone already; nothing is left to do.
            let _ = DEADLINES.try_with(|d| {
                if let Ok(mut d) = d.try_borrow_mut() {
                    d.waiting.remove(&(self.deadline, id));
                }
            });
        }
    }
}

impl Drop for IdleDeadline {
    fn drop(&mut self) {
        self.deregister();
    }
}

/// Marks the ticker stopped when its task is dropped (its runtime ended), so that a later
/// runtime on the same thread starts its own.
struct TickerGuard;

impl Drop for TickerGuard {
    fn drop(&mut self) {
        let _ = DEADLINES.try_with(|d| {
            if let Ok(mut d) = d.try_borrow_mut() {
                d.is_ticking = false;
                d.ticker = None;
                d.ticker_until = None;
            }
        });
    }
}

/// The ticker of one core: wakes every wait whose deadline passed, then sleeps until the next
/// deadline, or until a wait registers an earlier one.
async fn tick() {
    let _guard = TickerGuard;
    loop {
        let now = Instant::now();
        let (due, next) = DEADLINES.with(|d| {
            let mut d = d.borrow_mut();
            let mut due = Vec::new();
            while let Some(entry) = d.waiting.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                due.push(entry.remove());
            }
            let next = d.waiting.first_key_value().map(|(k, _)| k.0);
            d.ticker_until = next;
            (due, next)
        });
        // Woken outside the borrow: a waker may poll at once.
        for w in due {
            w.wake();
        }
        let nudge = Nudge { is_first: true };
        match next {
            Some(when) => {
                let sleep = std::pin::pin!(monoio::time::sleep_until(when));
                let nudge = std::pin::pin!(nudge);
                super::race::race(nudge, sleep).await;
            }
            None => nudge.await,
        }
    }
}

/// Pends once, leaving the ticker's waker where a new earlier deadline finds it.
struct Nudge {
    is_first: bool,
}

impl Future for Nudge {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if !this.is_first {
            return Poll::Ready(());
        }
        this.is_first = false;
        DEADLINES.with(|d| d.borrow_mut().ticker = Some(cx.waker().clone()));
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn run<F: Future>(f: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .enable_timer()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    #[test]
    fn deadlines_complete_in_order_and_dropped_ones_are_forgotten() {
        run(async {
            let start = Instant::now();
            let order = std::rc::Rc::new(RefCell::new(Vec::new()));
            let mut tasks = Vec::new();
            for (i, ms) in [(0u32, 120u64), (1, 40), (2, 80)] {
                let order = order.clone();
                tasks.push(monoio::spawn(async move {
                    until(start + Duration::from_millis(ms)).await;
                    order.borrow_mut().push(i);
                }));
            }
            // One that is dropped before its time leaves nothing behind.
            let mut dropped = Box::pin(until(start + Duration::from_millis(60)));
            let mut cx = Context::from_waker(Waker::noop());
            assert!(dropped.as_mut().poll(&mut cx).is_pending());
            drop(dropped);
            for t in tasks {
                t.await;
            }
            assert_eq!(*order.borrow(), [1, 2, 0]);
            assert!(start.elapsed() >= Duration::from_millis(120));
            assert!(DEADLINES.with(|d| d.borrow().waiting.is_empty()));
            // A deadline in the past completes at once.
            until(start).await;
        });
    }
}
