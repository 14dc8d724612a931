//! Idle keep-alive connections parked without a task.
//!
//! A connection that has been quiet for [`IDLE_RELEASE`] gives back its read buffer and the
//! state of its busy period; what is left (its socket, its limits, its peer and counts) is
//! parked here, in a slot of one vector per listener and core, and its task ends. The socket
//! waits in an epoll set ([`EpollSet`]) instead of holding a runtime operation, and its
//! deadline waits in an ordered set that one timer per listener and core serves. When the
//! socket becomes readable (a next request, or the client closing) the listener starts a new
//! task for the connection where it left off; when the deadline passes first, the connection
//! is closed.
//!
//! So an idle connection costs its slot and its socket's runtime handle, not a task: no future,
//! no waker in the shutdown latches, no runtime operation or timer entry, and nothing that
//! pins allocator pages between the short-lived allocations of busy connections.
//!
//! Once parking has settled (no connection parked for [`SETTLE`]), the waiting side says so
//! ([`Woken::Settled`]), and the listener asks the allocator to give the memory the busy
//! period freed back to the system: otherwise it keeps it for a next burst that may not come,
//! and a core whose connections all sit idle never allocates again to make it do so.
//!
//! [`IDLE_RELEASE`]: super::conn::IDLE_RELEASE

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::future::Future;
use std::io;
use std::os::fd::AsRawFd;
use std::pin::{pin, Pin};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use monoio::net::TcpStream;
use monoio::time::Instant;

use super::race::{race, Either};
use crate::fd::EpollSet;

/// Pause after the runtime failed to wait on the epoll set and nothing was ready, so that a
/// persistent failure does not spin.
const WAIT_ERROR_BACKOFF: Duration = Duration::from_millis(50);
/// Time without a new parked connection after which parking counts as settled. Longer than the
/// allocator's delay before freed memory may be given back (one second for mimalloc).
pub(crate) const SETTLE: Duration = Duration::from_secs(2);

/// What waiting on the parked connections produced.
pub(crate) enum Woken<T> {
    /// These became readable (or closed, or failed): they are no longer parked.
    Ready(Vec<T>),
    /// These reached their deadline: they are no longer parked.
    Expired(Vec<T>),
    /// No connection was parked for [`SETTLE`] after the last one.
    Settled,
}

/// The parked connections of one listener on one core.
pub(crate) struct Parking<T> {
    set: EpollSet,
    state: RefCell<State<T>>,
    /// The waiting side's waker, taken by a park whose deadline comes before the one it sleeps
    /// until.
    waker: Cell<Option<Waker>>,
}

struct State<T> {
    slots: Vec<Slot<T>>,
    /// Indexes of vacant slots.
    free: Vec<u32>,
    /// (deadline, slot index) of every held slot: the earliest first.
    deadlines: BTreeSet<(Instant, u32)>,
    /// The deadline the waiting side sleeps until: `None` while it sleeps without one.
    sleeps_until: Option<Instant>,
    /// When the last connection was parked, until parking is reported settled.
    last_parked: Option<Instant>,
    /// Set once the waiting side is gone: nothing is parked any more.
    is_closed: bool,
}

struct Slot<T> {
    /// Counts the uses of the slot, so that a report meant for an earlier one is told apart.
    generation: u32,
    held: Option<Held<T>>,
}

struct Held<T> {
    item: T,
    deadline: Instant,
}

/// The epoll token of a slot: its generation and index.
fn token(index: u32, generation: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(index)
}

impl<T: AsRawFd> Parking<T> {
    pub(crate) fn new() -> io::Result<Parking<T>> {
        Ok(Parking {
            set: EpollSet::new()?,
            state: RefCell::new(State {
                slots: Vec::new(),
                free: Vec::new(),
                deadlines: BTreeSet::new(),
                sleeps_until: None,
                last_parked: None,
                is_closed: false,
            }),
            waker: Cell::new(None),
        })
    }

    /// Parks `item` until its socket is ready or `deadline` passes. Gives it back when it cannot
    /// be parked (parking closed, or the kernel refused the socket).
    pub(crate) fn park(&self, item: T, deadline: Instant) -> Result<(), (T, io::Error)> {
        let mut state = self.state.borrow_mut();
        if state.is_closed {
            return Err((item, io::Error::other("parking is closed")));
        }
        let index = match state.free.pop() {
            Some(i) => i,
            None => {
                let Ok(i) = u32::try_from(state.slots.len()) else {
                    return Err((item, io::Error::other("too many parked connections")));
                };
                state.slots.push(Slot {
                    generation: 0,
                    held: None,
                });
                i
            }
        };
        let Some(slot) = state.slots.get_mut(index as usize) else {
            return Err((item, io::Error::other("parking slot missing")));
        };
        slot.generation = slot.generation.wrapping_add(1);
        if let Err(e) = self.set.add_oneshot(&item, token(index, slot.generation)) {
            state.free.push(index);
            return Err((item, e));
        }
        slot.held = Some(Held { item, deadline });
        state.deadlines.insert((deadline, index));
        state.last_parked = Some(Instant::now());
        // The waiting side sleeps past this deadline (or without one): it must look again.
        if state.sleeps_until.is_none_or(|t| deadline < t) {
            if let Some(w) = self.waker.take() {
                w.wake();
            }
        }
        Ok(())
    }

    /// The stream to hand to [`Parking::next`]: the runtime waits on it for the set.
    pub(crate) fn waiter(&self) -> io::Result<TcpStream> {
        self.set.waiter()
    }

    /// How many connections are parked.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.state.borrow().deadlines.len()
    }

    /// Takes the item of slot `index` out of the set and the slot.
    fn take(state: &mut State<T>, set: &EpollSet, index: u32) -> Option<T> {
        let held = state.slots.get_mut(index as usize)?.held.take()?;
        set.remove(&held.item);
        state.deadlines.remove(&(held.deadline, index));
        state.free.push(index);
        Some(held.item)
    }

    /// Takes every parked item out and refuses new ones: for shutdown.
    pub(crate) fn close(&self) -> Vec<T> {
        let mut state = self.state.borrow_mut();
        state.is_closed = true;
        state.deadlines = BTreeSet::new();
        state.free = Vec::new();
        std::mem::take(&mut state.slots)
            .into_iter()
            .filter_map(|slot| slot.held)
            .map(|held| {
                self.set.remove(&held.item);
                held.item
            })
            .collect()
    }

    /// The items whose deadline is not after `now`.
    fn take_expired(&self, now: Instant) -> Vec<T> {
        let mut state = self.state.borrow_mut();
        let mut expired = Vec::new();
        while let Some(&(deadline, index)) = state.deadlines.first() {
            if deadline > now {
                break;
            }
            match Self::take(&mut state, &self.set, index) {
                Some(item) => expired.push(item),
                // Not held: a stale entry (cannot happen; dropped rather than looped on).
                None => {
                    state.deadlines.pop_first();
                }
            }
        }
        expired
    }

    /// The items whose sockets the epoll set reports ready.
    fn take_ready(&self, tokens: &mut Vec<u64>) -> io::Result<Vec<T>> {
        tokens.clear();
        self.set.take_ready(tokens)?;
        let mut state = self.state.borrow_mut();
        let mut ready = Vec::with_capacity(tokens.len());
        for &t in tokens.iter() {
            // The low half is the index, the high half the generation (see `token`).
            let index = (t & u64::from(u32::MAX)) as u32;
            let generation = (t >> 32) as u32;
            let is_current = state
                .slots
                .get(index as usize)
                .is_some_and(|s| s.generation == generation && s.held.is_some());
            if is_current {
                ready.extend(Self::take(&mut state, &self.set, index));
            }
        }
        Ok(ready)
    }

    /// Waits until parked connections are ready or expire, and takes them out, or until
    /// parking has settled. `waiter` is the set's [`EpollSet::waiter`] stream.
    pub(crate) async fn next(&self, waiter: &TcpStream) -> Woken<T> {
        let mut tokens = Vec::new();
        loop {
            let now = Instant::now();
            let expired = self.take_expired(now);
            if !expired.is_empty() {
                return Woken::Expired(expired);
            }
            let until = {
                let mut state = self.state.borrow_mut();
                let settled_at = state.last_parked.map(|t| t + SETTLE);
                if settled_at.is_some_and(|t| t <= now) {
                    state.last_parked = None;
                    return Woken::Settled;
                }
                let first = state.deadlines.first().map(|&(d, _)| d);
                state.sleeps_until = match (first, settled_at) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                state.sleeps_until
            };
            let readable = pin!(waiter.readable(false));
            let nudge = pin!(Nudge {
                waker: &self.waker,
                is_first: true,
            });
            let sleep = pin!(async move {
                match until {
                    Some(t) => monoio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            });
            let failed = match race(readable, race(nudge, sleep)).await {
                Either::Left(res) => res.is_err(),
                // A new earlier deadline, or a deadline reached: look again.
                Either::Right(_) => continue,
            };
            match self.take_ready(&mut tokens) {
                Ok(ready) if !ready.is_empty() => return Woken::Ready(ready),
                Ok(_) if !failed => {}
                Ok(_) => monoio::time::sleep(WAIT_ERROR_BACKOFF).await,
                Err(e) => {
                    tracing::warn!(error = %e, "waiting for idle connections failed");
                    monoio::time::sleep(WAIT_ERROR_BACKOFF).await;
                }
            }
        }
    }
}

/// Pends once, leaving its waker where a park with an earlier deadline finds it; completes when
/// polled again.
struct Nudge<'a> {
    waker: &'a Cell<Option<Waker>>,
    is_first: bool,
}

impl Future for Nudge<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if !this.is_first {
            return Poll::Ready(());
        }
        this.is_first = false;
        this.waker.set(Some(cx.waker().clone()));
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{run_on, Driver};
    use std::io::Write as _;
    use std::os::fd::RawFd;

    struct Conn(TcpStream, u32);

    impl AsRawFd for Conn {
        fn as_raw_fd(&self) -> RawFd {
            self.0.as_raw_fd()
        }
    }

    fn pair(listener: &std::net::TcpListener) -> (std::net::TcpStream, TcpStream) {
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        (client, TcpStream::from_std(accepted).unwrap())
    }

    fn ids(items: &[Conn]) -> Vec<u32> {
        let mut v: Vec<u32> = items.iter().map(|c| c.1).collect();
        v.sort_unstable();
        v
    }

    /// Readiness and deadlines, on both runtime drivers: the ready one comes back, the quiet
    /// one expires at its deadline and not before, and a closed parking refuses new ones.
    fn ready_and_expired(driver: Driver) {
        run_on(driver, async {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let parking = Parking::new().unwrap();
            let waiter = parking.waiter().unwrap();
            let (mut c1, s1) = pair(&listener);
            let (_c2, s2) = pair(&listener);
            let (c3, s3) = pair(&listener);
            let start = Instant::now();
            let far = start + Duration::from_secs(60);
            parking.park(Conn(s1, 1), far).ok().unwrap();
            parking
                .park(Conn(s2, 2), start + Duration::from_millis(150))
                .ok()
                .unwrap();
            parking.park(Conn(s3, 3), far).ok().unwrap();
            assert_eq!(parking.len(), 3);

            c1.write_all(b"GET").unwrap();
            match parking.next(&waiter).await {
                Woken::Ready(items) => assert_eq!(ids(&items), [1]),
                _ => panic!("not ready"),
            }
            // A client that closes is ready too (its connection then reads the end).
            drop(c3);
            match parking.next(&waiter).await {
                Woken::Ready(items) => assert_eq!(ids(&items), [3]),
                _ => panic!("not ready"),
            }
            match parking.next(&waiter).await {
                Woken::Expired(items) => assert_eq!(ids(&items), [2]),
                _ => panic!("not expired"),
            }
            assert!(start.elapsed() >= Duration::from_millis(150));
            assert_eq!(parking.len(), 0);

            // Slots are reused under a new generation; closing gives back what is parked.
            let (_c4, s4) = pair(&listener);
            parking.park(Conn(s4, 4), far).ok().unwrap();
            assert_eq!(ids(&parking.close()), [4]);
            let (_c5, s5) = pair(&listener);
            assert!(parking.park(Conn(s5, 5), far).is_err());
        });
    }

    #[test]
    fn parked_connections_come_back_ready_or_expired_io_uring() {
        ready_and_expired(Driver::detect());
    }

    #[test]
    fn parked_connections_come_back_ready_or_expired_epoll() {
        ready_and_expired(Driver::Legacy);
    }

    /// A park with an earlier deadline than the one the waiting side sleeps until wakes it.
    #[test]
    fn an_earlier_deadline_wakes_the_waiting_side() {
        run_on(Driver::detect(), async {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let parking = std::rc::Rc::new(Parking::new().unwrap());
            let waiter = parking.waiter().unwrap();
            let start = Instant::now();
            let (_c1, s1) = pair(&listener);
            parking
                .park(Conn(s1, 1), start + Duration::from_secs(60))
                .ok()
                .unwrap();
            let (_c2, s2) = pair(&listener);
            let later = std::rc::Rc::clone(&parking);
            monoio::spawn(async move {
                monoio::time::sleep(Duration::from_millis(20)).await;
                later
                    .park(Conn(s2, 2), Instant::now() + Duration::from_millis(30))
                    .ok()
                    .unwrap();
            });
            match parking.next(&waiter).await {
                Woken::Expired(items) => assert_eq!(ids(&items), [2]),
                _ => panic!("not expired"),
            }
            assert!(start.elapsed() < Duration::from_secs(5));
        });
    }
}
