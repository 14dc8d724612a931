//! Graceful shutdown: a process-wide [`ShutdownTrigger`] that the signal thread fires, and the
//! per-core [`ShutdownSignal`] that listeners and connections await.
//!
//! The per-core side is single-threaded (`Rc`, `Cell`): waiting on it costs no atomic and no
//! lock, which matters because every idle keep-alive connection waits on it. The cross-thread
//! hop happens once per core, through a oneshot channel relayed by a small local task.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use futures_channel::oneshot;

/// A one-way flag that many local tasks can await: once set, it stays set and every waiter is
/// woken. Waiters deregister when dropped, so short-lived waits (one per idle period of a
/// connection) do not pile up.
#[derive(Default)]
pub(crate) struct Latch {
    is_set: Cell<bool>,
    waiters: RefCell<WaiterSlots>,
}

#[derive(Default)]
struct WaiterSlots {
    slots: Vec<Option<Waker>>,
    free: Vec<usize>,
}

impl Latch {
    /// Whether the latch has been set.
    pub(crate) fn is_set(&self) -> bool {
        self.is_set.get()
    }

    /// Sets the latch and wakes every waiter. Setting it again does nothing.
    pub(crate) fn set(&self) {
        if self.is_set.replace(true) {
            return;
        }
        // The wakers are taken out before waking so that a waker that polls synchronously
        // cannot find the slots borrowed.
        let slots = std::mem::take(&mut *self.waiters.borrow_mut());
        for waker in slots.slots.into_iter().flatten() {
            waker.wake();
        }
    }

    /// Polls for the latch, registering `cx`'s waker in `slot` while it is not set.
    pub(crate) fn poll_set(&self, slot: &mut Option<usize>, cx: &mut Context<'_>) -> Poll<()> {
        if self.is_set.get() {
            if let Some(index) = slot.take() {
                self.deregister(index);
            }
            return Poll::Ready(());
        }
        let mut waiters = self.waiters.borrow_mut();
        match *slot {
            Some(index) => {
                if let Some(entry) = waiters.slots.get_mut(index) {
                    match entry {
                        Some(w) if w.will_wake(cx.waker()) => {}
                        _ => *entry = Some(cx.waker().clone()),
                    }
                }
            }
            None => {
                let waker = Some(cx.waker().clone());
                let index = match waiters.free.pop() {
                    Some(index) => {
                        if let Some(entry) = waiters.slots.get_mut(index) {
                            *entry = waker;
                        }
                        index
                    }
                    None => {
                        waiters.slots.push(waker);
                        waiters.slots.len().saturating_sub(1)
                    }
                };
                *slot = Some(index);
            }
        }
        Poll::Pending
    }

    /// Forgets the waiter in `index`.
    pub(crate) fn deregister(&self, index: usize) {
        let mut waiters = self.waiters.borrow_mut();
        if let Some(entry) = waiters.slots.get_mut(index) {
            if entry.take().is_some() {
                waiters.free.push(index);
            }
        }
    }

    /// Number of registered waiters, for tests.
    #[cfg(test)]
    fn waiter_count(&self) -> usize {
        self.waiters.borrow().slots.iter().flatten().count()
    }
}

/// A future that completes when a [`Latch`] is set.
pub(crate) struct LatchWait {
    latch: Rc<Latch>,
    slot: Option<usize>,
}

impl LatchWait {
    pub(crate) fn new(latch: Rc<Latch>) -> LatchWait {
        LatchWait { latch, slot: None }
    }
}

impl Future for LatchWait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        this.latch.poll_set(&mut this.slot, cx)
    }
}

impl Drop for LatchWait {
    fn drop(&mut self) {
        if let Some(index) = self.slot.take() {
            self.latch.deregister(index);
        }
    }
}

/// A waiter's place among a [`Latch`]'s wakers, kept across waits ([`LatchSlot::wait`]): a
/// connection waits for the idle close before each of its requests, and registers once for its
/// busy period instead of once per wait; each later wait of the same task finds its own waker
/// in place. Between waits the latch may wake the task for nothing (a task takes a spurious
/// wake-up in its stride); the place is given back when the slot is dropped.
pub(crate) struct LatchSlot {
    latch: Rc<Latch>,
    slot: Option<usize>,
}

impl LatchSlot {
    /// A future that completes when the latch is set.
    pub(crate) fn wait(&mut self) -> SlotWait<'_> {
        SlotWait { slot: self }
    }
}

impl Drop for LatchSlot {
    fn drop(&mut self) {
        if let Some(index) = self.slot.take() {
            self.latch.deregister(index);
        }
    }
}

/// [`LatchSlot::wait`]'s future.
pub(crate) struct SlotWait<'a> {
    slot: &'a mut LatchSlot,
}

impl Future for SlotWait<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let s = &mut *self.get_mut().slot;
        s.latch.poll_set(&mut s.slot, cx)
    }
}

/// The cross-thread half: fired once by whoever handles SIGTERM/SIGINT, it shuts down every
/// core that derived a [`ShutdownSignal`] from it.
#[derive(Clone, Default)]
pub struct ShutdownTrigger {
    shared: Arc<TriggerShared>,
}

#[derive(Default)]
struct TriggerShared {
    is_triggered: AtomicBool,
    /// How long connections idle between requests stay open once the trigger fires, in
    /// milliseconds: 0 (close at once) unless [`ShutdownTrigger::trigger_lingering`] fired it.
    linger_ms: AtomicU64,
    relays: Mutex<Vec<oneshot::Sender<()>>>,
}

impl TriggerShared {
    fn linger(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.linger_ms.load(Ordering::SeqCst))
    }
}

impl std::fmt::Debug for ShutdownTrigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShutdownTrigger")
            .field("is_triggered", &self.is_triggered())
            .finish()
    }
}

impl ShutdownTrigger {
    /// A trigger that has not fired.
    pub fn new() -> ShutdownTrigger {
        ShutdownTrigger::default()
    }

    /// Fires the trigger: every derived signal, on every core, reports shutdown. Firing twice
    /// does nothing more.
    pub fn trigger(&self) {
        self.shared.is_triggered.store(true, Ordering::SeqCst);
        // A poisoned lock only means another thread panicked while pushing a sender; the
        // vector itself is intact, so shutdown still reaches every core.
        let relays = std::mem::take(
            &mut *self
                .shared
                .relays
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for relay in relays {
            // A core whose runtime has already ended dropped its receiver; nothing to wake.
            let _ = relay.send(());
        }
    }

    /// Fires the trigger for a hand-over to a successor process (decision 115): as
    /// [`ShutdownTrigger::trigger`], except that connections idle between requests stay open
    /// for `linger`, each answering its next request with `Connection: close`, so that a
    /// client moves to the successor at its next request instead of racing a close.
    pub fn trigger_lingering(&self, linger: std::time::Duration) {
        let ms = u64::try_from(linger.as_millis()).unwrap_or(u64::MAX);
        self.shared.linger_ms.store(ms, Ordering::SeqCst);
        self.trigger();
    }

    /// Whether the trigger has fired.
    pub fn is_triggered(&self) -> bool {
        self.shared.is_triggered.load(Ordering::SeqCst)
    }

    /// The per-core signal that follows this trigger. Call it on the core's thread; the relay
    /// from the trigger to the core starts the first time the signal is awaited there.
    pub fn signal(&self) -> ShutdownSignal {
        let signal = ShutdownSignal::new();
        let mut relays = self
            .shared
            .relays
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Checked under the lock: `trigger` sets the flag before draining the senders, so a
        // signal made concurrently either sees the flag or has its sender drained.
        if self.shared.is_triggered.load(Ordering::SeqCst) {
            signal.inner.latch.set();
            signal.inner.idle.set();
        } else {
            let (tx, rx) = oneshot::channel();
            relays.push(tx);
            signal.inner.relay.set(Some(rx));
            *signal.inner.remote.borrow_mut() = Some(Arc::clone(&self.shared));
        }
        signal
    }
}

/// The per-core shutdown signal: cheap to clone, `!Send`, awaited by accept loops and idle
/// connections. Set by [`ShutdownSignal::trigger`] locally or by the [`ShutdownTrigger`] it was
/// derived from.
#[derive(Clone, Default)]
pub struct ShutdownSignal {
    inner: Rc<SignalInner>,
}

#[derive(Default)]
struct SignalInner {
    latch: Rc<Latch>,
    /// Set when connections idle between requests close: with the shutdown, or a linger
    /// after it (a hand-over, [`ShutdownTrigger::trigger_lingering`]).
    idle: Rc<Latch>,
    /// The receiving end of the trigger's relay, until the relay task takes it.
    relay: Cell<Option<oneshot::Receiver<()>>>,
    /// The trigger's flag, so that [`ShutdownSignal::is_shutdown`] is exact even before the
    /// relay task has run.
    remote: RefCell<Option<Arc<TriggerShared>>>,
}

impl std::fmt::Debug for ShutdownSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShutdownSignal")
            .field("is_shutdown", &self.is_shutdown())
            .finish()
    }
}

impl ShutdownSignal {
    /// A local signal that only [`ShutdownSignal::trigger`] sets.
    pub fn new() -> ShutdownSignal {
        ShutdownSignal::default()
    }

    /// Sets the signal on this core; idle connections close at once.
    pub fn trigger(&self) {
        self.inner.latch.set();
        self.inner.idle.set();
    }

    /// Whether shutdown has begun.
    pub fn is_shutdown(&self) -> bool {
        self.inner.latch.is_set()
            || self
                .inner
                .remote
                .borrow()
                .as_ref()
                .is_some_and(|shared| shared.is_triggered.load(Ordering::Relaxed))
    }

    /// Whether connections idle between requests must close now: shutdown began, and the
    /// linger of a hand-over, if any, is over.
    pub fn is_closing_idle(&self) -> bool {
        self.inner.idle.is_set()
            || self.inner.remote.borrow().as_ref().is_some_and(|shared| {
                shared.is_triggered.load(Ordering::Relaxed) && shared.linger().is_zero()
            })
    }

    /// Starts the relay task from the trigger, once, and sets the latches the trigger's flag
    /// already calls for.
    fn follow_trigger(&self) {
        if let Some(rx) = self.inner.relay.take() {
            let latch = Rc::clone(&self.inner.latch);
            let idle = Rc::clone(&self.inner.idle);
            let shared = self.inner.remote.borrow().clone();
            monoio::spawn(async move {
                // A dropped trigger never fires: only a sent value shuts the core down.
                if rx.await.is_ok() {
                    latch.set();
                    let linger = shared.map(|s| s.linger()).unwrap_or_default();
                    if !linger.is_zero() {
                        monoio::time::sleep(linger).await;
                    }
                    idle.set();
                }
            });
        }
        if self.is_shutdown() {
            self.inner.latch.set();
        }
        if self.is_closing_idle() {
            self.inner.idle.set();
        }
    }

    /// A future that completes once shutdown has begun. Must be polled inside a monoio runtime
    /// (the first wait starts the relay task from the trigger).
    pub fn wait(&self) -> ShutdownWait {
        self.follow_trigger();
        ShutdownWait {
            wait: LatchWait::new(Rc::clone(&self.inner.latch)),
        }
    }

    /// A future that completes once connections idle between requests must close
    /// ([`ShutdownSignal::is_closing_idle`]). Must be polled inside a monoio runtime.
    pub fn idle_close(&self) -> ShutdownWait {
        self.follow_trigger();
        ShutdownWait {
            wait: LatchWait::new(Rc::clone(&self.inner.idle)),
        }
    }

    /// A place among the waiters for the moment connections idle between requests must close
    /// ([`ShutdownSignal::is_closing_idle`]), for a connection's every wait between its requests
    /// ([`LatchSlot`]). Must be made inside a monoio runtime.
    pub(crate) fn idle_close_slot(&self) -> LatchSlot {
        self.follow_trigger();
        LatchSlot {
            latch: Rc::clone(&self.inner.idle),
            slot: None,
        }
    }
}

/// Completes when a [`ShutdownSignal`] is set.
pub struct ShutdownWait {
    wait: LatchWait,
}

impl std::fmt::Debug for ShutdownWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShutdownWait").finish_non_exhaustive()
    }
}

impl Future for ShutdownWait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.get_mut().wait).poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::pin;
    use std::time::Duration;

    fn block_on<F: Future<Output = ()>>(fut: F) {
        crate::runtime::run_on(crate::runtime::Driver::detect(), fut);
    }

    use crate::testing::CountingWaker;

    #[test]
    fn latch_wakes_every_waiter_and_forgets_dropped_ones() {
        let latch = Rc::new(Latch::default());
        let counter = CountingWaker::new();
        let waker = Waker::from(Arc::clone(&counter));
        let mut cx = Context::from_waker(&waker);
        let mut waits: Vec<_> = (0..3)
            .map(|_| Box::pin(LatchWait::new(Rc::clone(&latch))))
            .collect();
        for wait in &mut waits {
            assert_eq!(wait.as_mut().poll(&mut cx), Poll::Pending);
            // Polling again reuses the slot.
            assert_eq!(wait.as_mut().poll(&mut cx), Poll::Pending);
        }
        let mut dropped = Box::pin(LatchWait::new(Rc::clone(&latch)));
        assert_eq!(dropped.as_mut().poll(&mut cx), Poll::Pending);
        assert_eq!(latch.waiter_count(), 4);
        drop(dropped);
        assert_eq!(latch.waiter_count(), 3);
        latch.set();
        latch.set();
        assert_eq!(counter.wakes(), 3);
        for wait in &mut waits {
            assert_eq!(wait.as_mut().poll(&mut cx), Poll::Ready(()));
        }
        assert!(latch.is_set());
        assert_eq!(latch.waiter_count(), 0);
    }

    /// A slot registers on its first wait and keeps its place across later ones; the latch
    /// completes a wait in progress and every one after; a dropped slot gives its place back.
    #[test]
    fn a_slot_keeps_its_place_across_waits() {
        let latch = Rc::new(Latch::default());
        let counter = CountingWaker::new();
        let waker = Waker::from(Arc::clone(&counter));
        let mut cx = Context::from_waker(&waker);
        let mut slot = LatchSlot {
            latch: Rc::clone(&latch),
            slot: None,
        };
        for _ in 0..3 {
            let mut wait = pin!(slot.wait());
            assert_eq!(wait.as_mut().poll(&mut cx), Poll::Pending);
            assert_eq!(latch.waiter_count(), 1);
        }
        let mut other = LatchSlot {
            latch: Rc::clone(&latch),
            slot: None,
        };
        assert_eq!(pin!(other.wait()).poll(&mut cx), Poll::Pending);
        assert_eq!(latch.waiter_count(), 2);
        drop(other);
        assert_eq!(latch.waiter_count(), 1);
        latch.set();
        assert_eq!(counter.wakes(), 1);
        for _ in 0..2 {
            assert_eq!(pin!(slot.wait()).poll(&mut cx), Poll::Ready(()));
        }
        drop(slot);
        assert_eq!(latch.waiter_count(), 0);
    }

    #[test]
    fn trigger_reaches_a_core_from_another_thread() {
        let trigger = ShutdownTrigger::new();
        let remote = trigger.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let core = std::thread::spawn(move || {
            block_on(async move {
                let signal = remote.signal();
                assert!(!signal.is_shutdown());
                let _ = tx.send(());
                signal.wait().await;
                assert!(signal.is_shutdown());
            });
        });
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        trigger.trigger();
        assert!(trigger.is_triggered());
        core.join().unwrap();
    }

    #[test]
    fn signal_made_after_trigger_is_already_set() {
        let trigger = ShutdownTrigger::new();
        trigger.trigger();
        let signal = trigger.signal();
        assert!(signal.is_shutdown());
        block_on(async move { signal.wait().await });
    }

    #[test]
    fn local_signal_is_set_by_its_own_trigger_only() {
        let signal = ShutdownSignal::new();
        let clone = signal.clone();
        assert!(!clone.is_shutdown());
        signal.trigger();
        assert!(clone.is_shutdown());
    }
}
