//! Coarse per-core timers for the request path.
//!
//! Every request waits on a few limits (the write to the client, the stages of the exchange with
//! the destination, the departure watch, the quiet spell before an idle connection gives its
//! buffer back), and almost none of them ever expires: the operation finishes first and the
//! timer is dropped. The runtime's own timers are precise and cost accordingly: a read of the
//! clock per timer, an entry of a hierarchical wheel, a large future to move around. Limits of
//! seconds do not need that. Here a timer is a slot in one vector per core and an index in a
//! bucket of a hashed wheel of 8 ms buckets; one task per core (the ticker) sleeps on a
//! single runtime timer until the earliest occupied bucket, and wakes what is due.
//!
//! The clock behind it is `CLOCK_MONOTONIC_COARSE` (the time of the last scheduler tick: a read
//! without the time-stamp counter), and every deadline is rounded up, so that a timer never
//! fires before its instant and at most about a bucket's length plus the clock's resolution
//! after it (decision 121). [`now`] gives the coarse clock as an [`Instant`] that is never
//! behind the true time: for computing deadlines, not for measuring durations.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// Length of one bucket of the wheel, in nanoseconds (8 ms).
const TICK_NS: u64 = 8_000_000;
/// Buckets of the wheel: one turn is 4.1 s; a longer limit stays in its bucket for more turns.
const BUCKETS: usize = 512;
const WORDS: usize = BUCKETS / 64;

thread_local! {
    static WHEEL: RefCell<Wheel> = RefCell::new(Wheel::new());
    static BASE: Base = Base::capture();
}

/// The pairing of the coarse clock with [`Instant`], taken once per thread.
struct Base {
    instant: Instant,
    /// The coarse clock when `instant` was read, in nanoseconds.
    coarse_ns: u64,
    /// How far the coarse clock may lag the true time: its resolution plus the gap between the
    /// two reads that made the pairing.
    lag_ns: u64,
    /// The coarse clock at the last [`now`] and the instant it gave: the clock moves once per
    /// scheduler tick, and every request between two ticks asks again.
    last: std::cell::Cell<(u64, Instant)>,
}

impl Base {
    fn capture() -> Base {
        let coarse_ns = coarse_ns();
        let instant = Instant::now();
        let res_ns =
            read(libc::CLOCK_MONOTONIC_COARSE, Read::Resolution).clamp(1_000_000, 100_000_000);
        // The coarse read is at most a resolution behind the `Instant` read beside it; the
        // margin covers the time between the two reads.
        let lag_ns = res_ns.saturating_add(100_000);
        Base {
            instant,
            coarse_ns,
            lag_ns,
            last: std::cell::Cell::new((coarse_ns, instant + Duration::from_nanos(lag_ns))),
        }
    }
}

enum Read {
    Time,
    Resolution,
}

/// The time or the resolution of `clock`, in nanoseconds. Through the C library, whose
/// `clock_gettime` reads the vDSO (and works under valgrind, which the raw vDSO lookup of
/// `rustix` does not).
#[allow(unsafe_code)]
fn read(clock: libc::clockid_t, what: Read) -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable `timespec` for the length of the call, which only writes
    // it; a clock the kernel does not know leaves it zero and returns an error, ignored here.
    let _ = unsafe {
        match what {
            Read::Time => libc::clock_gettime(clock, &mut t),
            Read::Resolution => libc::clock_getres(clock, &mut t),
        }
    };
    u64::try_from(t.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(t.tv_nsec).unwrap_or(0))
}

/// The coarse monotonic clock; the precise one on a kernel without it (never zero in practice,
/// so zero means the read failed).
fn coarse_ns() -> u64 {
    match read(libc::CLOCK_MONOTONIC_COARSE, Read::Time) {
        0 => read(libc::CLOCK_MONOTONIC, Read::Time),
        ns => ns,
    }
}

/// The current tick: every instant of it has passed.
fn current_tick() -> u64 {
    coarse_ns() / TICK_NS
}

/// Now, from the coarse clock: never earlier than the true time, at most about twice the
/// clock's resolution later. Cheaper than [`Instant::now`]; for deadlines, not for durations.
pub(crate) fn now() -> Instant {
    BASE.with(|b| {
        let coarse = coarse_ns();
        let (at, last) = b.last.get();
        if at == coarse {
            return last;
        }
        let ahead = coarse.saturating_sub(b.coarse_ns).saturating_add(b.lag_ns);
        let now = b.instant + Duration::from_nanos(ahead);
        b.last.set((coarse, now));
        now
    })
}

/// Seconds since the Unix epoch, from the coarse wall clock (the last scheduler tick's time); a
/// clock before 1970 reads as the epoch.
pub(crate) fn wall_secs() -> u64 {
    read(libc::CLOCK_REALTIME_COARSE, Read::Time) / 1_000_000_000
}

/// `from + limit`, or a far instant when the sum does not fit (an absurdly long configured
/// limit).
pub(crate) fn deadline(from: Instant, limit: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(365 * 24 * 3600);
    from.checked_add(limit)
        .or_else(|| from.checked_add(FAR))
        .unwrap_or(from)
}

/// The first tick at whose start `at` has certainly passed.
fn tick_of(at: Instant) -> u64 {
    BASE.with(|b| {
        let since = at.saturating_duration_since(b.instant);
        let ns = b
            .coarse_ns
            .saturating_add(nanos(since))
            .saturating_add(b.lag_ns);
        ns.div_ceil(TICK_NS)
    })
}

/// The tick of `limit` from now, computed from the coarse clock alone, without the round trip
/// through an [`Instant`]: the same sum as `tick_of(deadline(now(), limit))` (the clock, the
/// lag of [`now`], the limit, the lag of [`tick_of`]), so a limit fires on the same tick.
fn tick_after(limit: Duration) -> u64 {
    BASE.with(|b| {
        coarse_ns()
            .saturating_add(b.lag_ns.saturating_mul(2))
            .saturating_add(nanos(limit))
            .div_ceil(TICK_NS)
    })
}

/// A duration in nanoseconds, in 64-bit arithmetic; beyond a century it stays at a century
/// (a deadline past it never fires either way).
fn nanos(d: Duration) -> u64 {
    const CENTURY_NS: u64 = 100 * 365 * 24 * 3600 * 1_000_000_000;
    d.as_secs()
        .checked_mul(1_000_000_000)
        .and_then(|ns| ns.checked_add(u64::from(d.subsec_nanos())))
        .map_or(CENTURY_NS, |ns| ns.min(CENTURY_NS))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum EntryState {
    Vacant,
    Waiting,
    Fired,
}

struct Entry {
    generation: u32,
    state: EntryState,
    tick: u64,
    /// Position of the entry's index in its bucket, while it waits.
    at: u32,
    waker: Option<Waker>,
}

/// A registered timer: its slot, the slot's use and the wheel's.
#[derive(Clone, Copy)]
struct Handle {
    index: u32,
    generation: u32,
    epoch: u32,
}

struct Wheel {
    entries: Vec<Entry>,
    free: Vec<u32>,
    buckets: Vec<Vec<u32>>,
    occupied: [u64; WORDS],
    waiting: usize,
    /// Every tick up to this one has been processed.
    done: u64,
    /// Changes when the wheel is reset for a new runtime on the thread, so that handles of the
    /// runtime before do not reach the new entries.
    epoch: u32,
    ticker: Ticker,
    /// Wakers to wake once the wheel is no longer borrowed, kept for its allocation.
    due: Vec<Waker>,
    /// The waker of the timer cancelled last, kept for the next registration: a task that
    /// finishes an operation and starts the next under a new limit (the usual sequence of a
    /// request) registers with the waker it gave back, without a clone and a drop (two atomic
    /// reference-count changes each). At most one per core, so it holds at most one task's
    /// memory beyond its end.
    spare: Option<Waker>,
}

#[derive(Default)]
struct Ticker {
    is_spawned: bool,
    /// The tick the ticker sleeps until; `None` while it waits for a first timer.
    sleeps_until: Option<u64>,
    waker: Option<Waker>,
}

/// What registering found.
enum Registered {
    Waiting(Handle),
    /// The deadline has passed already.
    Due,
}

impl Wheel {
    fn new() -> Wheel {
        Wheel {
            entries: Vec::new(),
            free: Vec::new(),
            buckets: (0..BUCKETS).map(|_| Vec::new()).collect(),
            occupied: [0; WORDS],
            waiting: 0,
            done: current_tick(),
            epoch: 0,
            ticker: Ticker::default(),
            due: Vec::new(),
            spare: None,
        }
    }

    fn entry(&mut self, h: Handle) -> Option<&mut Entry> {
        if h.epoch != self.epoch {
            return None;
        }
        self.entries
            .get_mut(h.index as usize)
            .filter(|e| e.generation == h.generation && e.state != EntryState::Vacant)
    }

    /// Registers a timer for `tick`; says whether the ticker must be woken (or spawned) to
    /// honour it.
    fn register(&mut self, tick: u64, waker: &Waker) -> (Registered, bool) {
        if tick <= self.done {
            return (Registered::Due, false);
        }
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let Ok(i) = u32::try_from(self.entries.len()) else {
                    return (Registered::Due, false);
                };
                self.entries.push(Entry {
                    generation: 0,
                    state: EntryState::Vacant,
                    tick: 0,
                    at: 0,
                    waker: None,
                });
                i
            }
        };
        let b = bucket_of(tick);
        let Some(bucket) = self.buckets.get_mut(b) else {
            self.free.push(index);
            return (Registered::Due, false);
        };
        let at = u32::try_from(bucket.len()).unwrap_or(u32::MAX);
        bucket.push(index);
        if let Some(word) = self.occupied.get_mut(b / 64) {
            *word |= 1 << (b % 64);
        }
        let Some(e) = self.entries.get_mut(index as usize) else {
            return (Registered::Due, false);
        };
        e.generation = e.generation.wrapping_add(1);
        e.state = EntryState::Waiting;
        e.tick = tick;
        e.at = at;
        e.waker = Some(match self.spare.take() {
            Some(spare) if spare.will_wake(waker) => spare,
            other => {
                self.spare = other;
                waker.clone()
            }
        });
        let handle = Handle {
            index,
            generation: e.generation,
            epoch: self.epoch,
        };
        self.waiting += 1;
        let must_wake = match self.ticker.sleeps_until {
            None => true,
            Some(t) => tick < t,
        };
        (Registered::Waiting(handle), must_wake)
    }

    /// Takes the entry's index out of its bucket.
    fn unlink(&mut self, index: u32, tick: u64, at: u32) {
        let b = bucket_of(tick);
        let Some(bucket) = self.buckets.get_mut(b) else {
            return;
        };
        let at = at as usize;
        if bucket.get(at) != Some(&index) {
            return;
        }
        bucket.swap_remove(at);
        if let Some(&moved) = bucket.get(at) {
            if let Some(m) = self.entries.get_mut(moved as usize) {
                m.at = at as u32;
            }
        }
        if bucket.is_empty() {
            if let Some(word) = self.occupied.get_mut(b / 64) {
                *word &= !(1 << (b % 64));
            }
        }
    }

    /// Frees the timer behind `h`, keeping its waker as the spare; gives back the spare it
    /// replaces, to be dropped once the wheel is no longer borrowed.
    fn cancel(&mut self, h: Handle) -> Option<Waker> {
        let (state, tick, at, waker) = {
            let e = self.entry(h)?;
            let out = (e.state, e.tick, e.at, e.waker.take());
            e.state = EntryState::Vacant;
            out
        };
        if state == EntryState::Waiting {
            self.unlink(h.index, tick, at);
            self.waiting = self.waiting.saturating_sub(1);
        }
        self.free.push(h.index);
        match waker {
            Some(w) => self.spare.replace(w),
            None => None,
        }
    }

    /// Fires every timer whose tick is at or before `now` into `self.due`.
    fn advance(&mut self, now: u64) {
        if now <= self.done {
            return;
        }
        let span = (now - self.done).min(BUCKETS as u64);
        for step in 1..=span {
            let b = bucket_of(self.done.wrapping_add(step));
            let Some(bucket) = self.buckets.get_mut(b) else {
                continue;
            };
            let mut i = 0;
            while let Some(&index) = bucket.get(i) {
                let fire = self
                    .entries
                    .get(index as usize)
                    .is_some_and(|e| e.tick <= now);
                if !fire {
                    i += 1;
                    continue;
                }
                bucket.swap_remove(i);
                if let Some(&moved) = bucket.get(i) {
                    if let Some(m) = self.entries.get_mut(moved as usize) {
                        m.at = i as u32;
                    }
                }
                if let Some(e) = self.entries.get_mut(index as usize) {
                    e.state = EntryState::Fired;
                    if let Some(w) = e.waker.take() {
                        self.due.push(w);
                    }
                }
                self.waiting = self.waiting.saturating_sub(1);
            }
            if bucket.is_empty() {
                if let Some(word) = self.occupied.get_mut(b / 64) {
                    *word &= !(1 << (b % 64));
                }
            }
        }
        self.done = now;
    }

    /// The first tick after `done` whose bucket holds a timer (of this turn or a later one).
    fn next_occupied(&self) -> Option<u64> {
        if self.waiting == 0 {
            return None;
        }
        let start = bucket_of(self.done.wrapping_add(1));
        (0..BUCKETS).find_map(|d| {
            let b = (start + d) % BUCKETS;
            let word = self.occupied.get(b / 64)?;
            (word & (1 << (b % 64)) != 0).then(|| self.done + 1 + d as u64)
        })
    }
}

fn bucket_of(tick: u64) -> usize {
    (tick % BUCKETS as u64) as usize
}

/// Starts over for a new runtime on this thread: the timers of the one before (whose tasks it
/// never polls again) are forgotten, and the next timer spawns a ticker on the new runtime.
pub(crate) fn reset() {
    let old = WHEEL.with(|w| {
        let mut w = w.borrow_mut();
        let epoch = w.epoch.wrapping_add(1);
        let old = std::mem::replace(&mut *w, Wheel::new());
        w.epoch = epoch;
        old
    });
    // Dropping wakers may drop tasks, whose timers reach the wheel again: not while it is
    // borrowed.
    drop(old);
}

/// Registers, spawning or waking the ticker when needed.
fn register(tick: u64, waker: &Waker) -> Registered {
    let (registered, spawn, wake) = WHEEL.with(|w| {
        let mut w = w.borrow_mut();
        let (registered, must_wake) = w.register(tick, waker);
        if !must_wake {
            return (registered, false, None);
        }
        if !w.ticker.is_spawned {
            w.ticker.is_spawned = true;
            return (registered, true, None);
        }
        (registered, false, w.ticker.waker.take())
    });
    if spawn {
        monoio::spawn(Tick { sleep: None });
    }
    if let Some(w) = wake {
        w.wake();
    }
    registered
}

fn cancel(h: Handle) {
    let waker = WHEEL.with(|w| w.borrow_mut().cancel(h));
    drop(waker);
}

/// Whether the timer behind `h` fired; refreshes its waker while it waits.
fn check(h: Handle, waker: &Waker) -> bool {
    let old = WHEEL.with(|w| {
        let mut w = w.borrow_mut();
        match w.entry(h) {
            Some(e) if e.state == EntryState::Waiting => {
                if e.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    return Ok(None);
                }
                Ok(e.waker.replace(waker.clone()))
            }
            // Fired, or forgotten by a reset: either way it will not wake anything any more.
            _ => Err(()),
        }
    });
    match old {
        Ok(old) => {
            drop(old);
            false
        }
        Err(()) => true,
    }
}

/// The per-core task that wakes due timers.
struct Tick {
    sleep: Option<(u64, Pin<Box<monoio::time::Sleep>>)>,
}

impl Future for Tick {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            let now = current_tick();
            let (due, next) = WHEEL.with(|w| {
                let mut w = w.borrow_mut();
                w.advance(now);
                let due = std::mem::take(&mut w.due);
                let next = w.next_occupied();
                w.ticker.sleeps_until = next;
                if !w
                    .ticker
                    .waker
                    .as_ref()
                    .is_some_and(|k| k.will_wake(cx.waker()))
                {
                    w.ticker.waker = Some(cx.waker().clone());
                }
                (due, next)
            });
            let mut due = due;
            for waker in due.drain(..) {
                waker.wake();
            }
            // Give the vector back for its allocation.
            WHEEL.with(|w| {
                let mut w = w.borrow_mut();
                if w.due.capacity() < due.capacity() {
                    w.due = due;
                }
            });
            let Some(next) = next else {
                this.sleep = None;
                return Poll::Pending;
            };
            let sleep = match &mut this.sleep {
                Some((t, s)) if *t == next => s,
                slot => {
                    let wait_ns = next.saturating_mul(TICK_NS).saturating_sub(coarse_ns());
                    let s = Box::pin(monoio::time::sleep(Duration::from_nanos(wait_ns)));
                    &mut slot.insert((next, s)).1
                }
            };
            match sleep.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(()) => this.sleep = None,
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// [`within`]'s future, and [`Timer::within`]'s (`T` a connection's timer, borrowed).
    pub(crate) struct Within<F, T = Timer> {
        #[pin]
        fut: F,
        timer: T,
    }
}

/// A timer's registration, freed when dropped.
///
/// Either one limit's ([`within`], [`sleep`]: made for one wait, dropped with it), or the
/// timer of a connection for one kind of limit, set again for each wait ([`Timer::within`],
/// [`Timer::sleep`]). The second kind keeps its registration when a wait ends: the next wait
/// of the same limit starts later, so its deadline is later, and the registration of the wait
/// before fires first; only then, if the wait still runs, is it moved to the later tick. A
/// connection serving requests back to back thus registers once per span of the limit rather
/// than once per request, at the cost of one early wake-up of its task per span.
pub(crate) struct Timer {
    /// The tick the current wait ends at.
    tick: u64,
    /// The registration and the tick it is for: the tick of this wait or of one before.
    handle: Option<(Handle, u64)>,
}

impl Timer {
    fn new(at: Instant) -> Timer {
        Timer::at_tick(tick_of(at))
    }

    fn at_tick(tick: u64) -> Timer {
        Timer { tick, handle: None }
    }

    /// A timer to be set by each wait that uses it.
    pub(crate) const fn unset() -> Timer {
        Timer {
            tick: 0,
            handle: None,
        }
    }

    /// Whether the deadline passed; registers on the first call, and moves a registration
    /// for an earlier tick (of a wait before) to this wait's once it fires.
    fn is_due(&mut self, waker: &Waker) -> bool {
        if let Some((h, at)) = self.handle {
            if at <= self.tick && !check(h, waker) {
                return false;
            }
            // Fired (or for a later tick than this wait's): the registration is done with.
            self.handle = None;
            cancel(h);
            if at == self.tick {
                return true;
            }
        }
        match register(self.tick, waker) {
            Registered::Waiting(h) => {
                self.handle = Some((h, self.tick));
                false
            }
            Registered::Due => true,
        }
    }

    /// Runs `fut` for at most `limit` from now, on this timer.
    #[inline(always)]
    pub(crate) fn within_for<F: Future>(
        &mut self,
        limit: Duration,
        fut: F,
    ) -> Within<F, &mut Timer> {
        self.tick = tick_after(limit);
        Within { fut, timer: self }
    }

    /// Runs `fut` until `at`, on this timer.
    #[inline(always)]
    pub(crate) fn within<F: Future>(&mut self, at: Instant, fut: F) -> Within<F, &mut Timer> {
        self.tick = tick_of(at);
        Within { fut, timer: self }
    }

    /// Completes once `limit` from now has passed, on this timer.
    pub(crate) fn sleep(&mut self, limit: Duration) -> Sleep<&mut Timer> {
        self.tick = tick_after(limit);
        Sleep { timer: self }
    }

    /// Completes once `at` has passed, on this timer.
    pub(crate) fn sleep_until(&mut self, at: Instant) -> Sleep<&mut Timer> {
        self.tick = tick_of(at);
        Sleep { timer: self }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        if let Some((h, _)) = self.handle.take() {
            cancel(h);
        }
    }
}

/// A timer owned or borrowed by the future that waits on it.
pub(crate) trait TimerRef {
    fn timer(&mut self) -> &mut Timer;
}

impl TimerRef for Timer {
    fn timer(&mut self) -> &mut Timer {
        self
    }
}

impl TimerRef for &mut Timer {
    fn timer(&mut self) -> &mut Timer {
        self
    }
}

/// Runs `fut` until `at`: `None` when the deadline came first.
#[inline(always)]
pub(crate) fn within<F: Future>(at: Instant, fut: F) -> Within<F> {
    Within {
        fut,
        timer: Timer::new(at),
    }
}

/// Runs `fut` for at most `limit` from now.
#[inline(always)]
pub(crate) fn within_for<F: Future>(limit: Duration, fut: F) -> Within<F> {
    Within {
        fut,
        timer: Timer::at_tick(tick_after(limit)),
    }
}

impl<F: Future, T: TimerRef> Future for Within<F, T> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(v) = this.fut.poll(cx) {
            return Poll::Ready(Some(v));
        }
        if this.timer.timer().is_due(cx.waker()) {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

/// [`sleep`]'s future, and [`Timer::sleep`]'s.
pub(crate) struct Sleep<T = Timer> {
    timer: T,
}

/// Completes once `at` has passed.
#[cfg(test)]
pub(crate) fn sleep_until(at: Instant) -> Sleep {
    Sleep {
        timer: Timer::new(at),
    }
}

/// Completes once `limit` from now has passed.
pub(crate) fn sleep(limit: Duration) -> Sleep {
    Sleep {
        timer: Timer::at_tick(tick_after(limit)),
    }
}

impl<T: TimerRef + Unpin> Future for Sleep<T> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.get_mut().timer.timer().is_due(cx.waker()) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{run_on, Driver};

    #[test]
    fn now_is_never_behind_the_true_time() {
        for _ in 0..1000 {
            let before = Instant::now();
            assert!(now() >= before);
        }
        let coarse = now();
        assert!(coarse <= Instant::now() + Duration::from_millis(250));
    }

    /// A limit from now lands on the tick it would through an `Instant` deadline: between two
    /// such ticks taken around it (the coarse clock may move between the reads).
    #[test]
    fn ticks_after_a_limit_match_ticks_of_its_deadline() {
        for ms in [0u64, 1, 7, 8, 9, 100, 999, 1_000, 30_000, 86_400_000] {
            let limit = Duration::from_millis(ms) + Duration::from_nanos(ms % 7);
            let before = tick_of(deadline(now(), limit));
            let direct = tick_after(limit);
            let later = tick_of(deadline(now(), limit));
            assert!(before <= direct && direct <= later, "{limit:?}");
        }
        assert_eq!(nanos(Duration::from_nanos(1_234)), 1_234);
        assert_eq!(
            nanos(Duration::MAX),
            nanos(Duration::from_secs(200 * 365 * 24 * 3600))
        );
    }

    #[test]
    fn the_coarse_wall_clock_agrees_with_the_system_clock() {
        let precise = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(wall_secs().abs_diff(precise) <= 1);
    }

    /// Timers fire in order, never before their instant and not much after it, on both drivers.
    #[test]
    fn timers_fire_after_their_instant_and_in_order() {
        for driver in [Driver::detect(), Driver::Legacy] {
            run_on(driver, async {
                let start = Instant::now();
                let order = std::rc::Rc::new(RefCell::new(Vec::new()));
                let mut tasks = Vec::new();
                for ms in [120u64, 30, 70, 5, 300] {
                    let order = order.clone();
                    tasks.push(monoio::spawn(async move {
                        let at = start + Duration::from_millis(ms);
                        sleep_until(at).await;
                        let late = Instant::now().duration_since(at);
                        order.borrow_mut().push(ms);
                        late
                    }));
                }
                for t in tasks {
                    let late = t.await;
                    assert!(late < Duration::from_millis(200), "fired {late:?} late");
                }
                assert_eq!(*order.borrow(), vec![5, 30, 70, 120, 300]);
            });
        }
    }

    /// A connection's timer keeps one registration across waits whose deadlines move later,
    /// and still ends every wait at its own deadline: after the registration of a wait before
    /// fired, and when a wait's deadline is earlier than the registration's.
    #[test]
    fn a_timer_set_again_keeps_its_registration_and_ends_each_wait_on_time() {
        for driver in [Driver::detect(), Driver::Legacy] {
            run_on(driver, async {
                let waiting = || WHEEL.with(|w| w.borrow().waiting);
                let limit = Duration::from_millis(150);
                let mut timer = Timer::unset();
                let first = {
                    let quick = monoio::time::sleep(Duration::from_millis(5));
                    assert!(timer.within_for(limit, quick).await.is_some());
                    timer.handle.map(|(_, at)| at)
                };
                assert!(first.is_some());
                // Later waits of the same limit, each finished first: no new registration.
                for _ in 0..5 {
                    let quick = monoio::time::sleep(Duration::from_millis(5));
                    assert!(timer.within_for(limit, quick).await.is_some());
                    assert_eq!(timer.handle.map(|(_, at)| at), first);
                    assert_eq!(waiting(), 1);
                }
                // A wait that runs out: the first registration fires before its deadline, and
                // the wait goes on to its own.
                let start = Instant::now();
                let cut = timer.within_for(limit, std::future::pending::<()>()).await;
                assert!(cut.is_none());
                let took = start.elapsed();
                assert!(took >= limit, "ended after {took:?}");
                assert!(
                    took < limit + Duration::from_millis(200),
                    "ended after {took:?}"
                );
                assert!(timer.handle.is_none());
                // A shorter limit than the one registered: the registration moves earlier.
                let quick = monoio::time::sleep(Duration::from_millis(5));
                assert!(timer
                    .within_for(Duration::from_secs(30), quick)
                    .await
                    .is_some());
                let start = Instant::now();
                timer.sleep(Duration::from_millis(40)).await;
                let took = start.elapsed();
                assert!(took >= Duration::from_millis(40), "ended after {took:?}");
                assert!(took < Duration::from_millis(500), "ended after {took:?}");
                // Dropped, it leaves nothing in the wheel.
                let quick = monoio::time::sleep(Duration::from_millis(5));
                assert!(timer.within_for(limit, quick).await.is_some());
                assert_eq!(waiting(), 1);
                drop(timer);
                assert_eq!(waiting(), 0);
            });
        }
    }

    /// A limit beyond one turn of the wheel waits its turns; a deadline in the past is due at
    /// once; an operation that finishes first wins and leaves no timer behind.
    #[test]
    fn long_limits_past_deadlines_and_finished_operations() {
        run_on(Driver::detect(), async {
            let long = BUCKETS as u64 * TICK_NS + 300_000_000;
            let start = Instant::now();
            sleep(Duration::from_nanos(long)).await;
            assert!(start.elapsed() >= Duration::from_nanos(long));

            assert!(within(
                Instant::now() - Duration::from_millis(5),
                std::future::pending::<()>()
            )
            .await
            .is_none());

            for _ in 0..1000 {
                let v = within_for(Duration::from_secs(30), async { 7 }).await;
                assert_eq!(v, Some(7));
            }
            let quick = within_for(
                Duration::from_secs(30),
                monoio::time::sleep(Duration::from_millis(20)),
            )
            .await;
            assert!(quick.is_some());
            WHEEL.with(|w| assert_eq!(w.borrow().waiting, 0));

            let cut = within_for(Duration::from_millis(40), std::future::pending::<()>()).await;
            assert!(cut.is_none());
            assert!(start.elapsed() >= Duration::from_millis(40));
        });
    }

    /// Many timers sharing buckets, most dropped before they fire: the wheel keeps its books.
    #[test]
    fn dropped_timers_leave_the_wheel_consistent() {
        run_on(Driver::detect(), async {
            let mut keep = Vec::new();
            for i in 0..2000u64 {
                let mut s = Box::pin(sleep(Duration::from_millis(10 + i % 50)));
                let _ = s.as_mut().poll(&mut Context::from_waker(Waker::noop()));
                if i % 10 == 0 {
                    keep.push(s);
                }
            }
            WHEEL.with(|w| assert_eq!(w.borrow().waiting, 200));
            for s in keep {
                s.await;
            }
            WHEEL.with(|w| {
                let w = w.borrow();
                assert_eq!(w.waiting, 0);
                assert!(w.buckets.iter().all(Vec::is_empty));
                assert!(w.occupied.iter().all(|&x| x == 0));
            });
        });
    }

    #[test]
    fn a_cancelled_timers_waker_serves_the_same_task_only() {
        use crate::testing::CountingWaker;
        use std::sync::Arc;
        run_on(Driver::detect(), async {
            let a = CountingWaker::new();
            let b = CountingWaker::new();
            let wa = Waker::from(Arc::clone(&a));
            let wb = Waker::from(Arc::clone(&b));
            // Registered: the wheel holds a clone of A's waker.
            let mut s1 = Box::pin(sleep(Duration::from_secs(30)));
            assert!(s1.as_mut().poll(&mut Context::from_waker(&wa)).is_pending());
            assert_eq!(Arc::strong_count(&a), 3);
            // Cancelled: the clone stays as the spare, and the next timer of A takes it.
            drop(s1);
            assert_eq!(Arc::strong_count(&a), 3);
            let mut s2 = Box::pin(sleep(Duration::from_secs(30)));
            assert!(s2.as_mut().poll(&mut Context::from_waker(&wa)).is_pending());
            assert_eq!(Arc::strong_count(&a), 3);
            drop(s2);
            // Another task's timer never takes A's waker: it gets its own, and only it is woken.
            let mut s3 = Box::pin(sleep(Duration::from_millis(20)));
            assert!(s3.as_mut().poll(&mut Context::from_waker(&wb)).is_pending());
            assert_eq!(Arc::strong_count(&b), 3);
            crate::timer::sleep(Duration::from_millis(60)).await;
            assert_eq!(b.wakes(), 1);
            assert_eq!(a.wakes(), 0);
            assert!(s3.as_mut().poll(&mut Context::from_waker(&wb)).is_ready());
            // A fired timer gave its waker to the wake: the spare is still A's.
            drop(s3);
            assert_eq!(Arc::strong_count(&a), 3);
            // A cancelled timer of B's takes the spare's place; A's is dropped.
            let mut s4 = Box::pin(sleep(Duration::from_secs(30)));
            assert!(s4.as_mut().poll(&mut Context::from_waker(&wb)).is_pending());
            drop(s4);
            assert_eq!(Arc::strong_count(&a), 2);
            assert_eq!(Arc::strong_count(&b), 3);
        });
    }
}
