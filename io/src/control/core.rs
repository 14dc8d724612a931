//! Per-core control context: the requests this core is running (so the admin API can list and
//! cancel them) and the core's mailbox, through which other threads reach them without a lock.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use futures_channel::{mpsc, oneshot};
use futures_util::StreamExt as _;

use sortie_core::ids::RequestId;

use super::state::ControlState;

/// An active request as the admin API lists it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ActiveItem {
    /// The request id.
    pub request_id: String,
    /// Its deployment.
    pub deployment_id: String,
}

/// What another thread may ask of a core.
pub enum CoreCommand {
    /// List the requests running on the core.
    ListActive(oneshot::Sender<Vec<ActiveItem>>),
    /// Cancel a request if it runs on the core; answers whether it did.
    Cancel(String, oneshot::Sender<bool>),
    /// Take over a bus lane another core accepted (its hello names this core).
    AdoptLane(Box<crate::bus::Handoff>),
    /// Push a configuration revision to the remote workers whose lane 0 is on this core.
    PushConfig(u64, Arc<Vec<u8>>),
    /// Say `GoAway` on every lane of this core: the control hands over to its successor, and
    /// the workers dial it while these lanes finish what they carry (decision 115).
    GoAwayAll(String),
}

/// The sending side of a core's mailbox (`Send + Sync`).
#[derive(Clone)]
pub struct CoreMailbox {
    tx: mpsc::UnboundedSender<CoreCommand>,
}

impl CoreMailbox {
    /// Sends a command; false when the core is gone.
    pub fn send(&self, cmd: CoreCommand) -> bool {
        self.tx.unbounded_send(cmd).is_ok()
    }
}

/// The receiving side, owned by the core.
pub struct MailboxReceiver {
    rx: mpsc::UnboundedReceiver<CoreCommand>,
}

/// A mailbox pair for one core.
pub fn mailbox() -> (CoreMailbox, MailboxReceiver) {
    let (tx, rx) = mpsc::unbounded();
    (CoreMailbox { tx }, MailboxReceiver { rx })
}

/// Completes when an operator cancels the request. It names the request's place in its core's
/// table (`ActiveRequests`), where the cancel mark and the waker live: starting a request
/// allocates nothing for it. Once the request has left the table it never completes.
pub struct Cancelled {
    owner: Rc<ActiveRequests>,
    index: usize,
    generation: u32,
}

impl Cancelled {
    /// Whether the request was cancelled, without waiting.
    pub fn is_set(&self) -> bool {
        let slab = self.owner.slab.borrow();
        slab.entry(self.index, self.generation)
            .is_some_and(|e| e.is_cancelled)
    }
}

impl Future for Cancelled {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        // A waker replaced is dropped after the borrow: a waker's drop runs foreign code.
        let _replaced = {
            let mut slab = this.owner.slab.borrow_mut();
            let Some(e) = slab.entry_mut(this.index, this.generation) else {
                // The request has ended: nothing can cancel it any more.
                return Poll::Pending;
            };
            if e.is_cancelled {
                return Poll::Ready(());
            }
            match &e.waker {
                Some(w) if w.will_wake(cx.waker()) => None,
                _ => e.waker.replace(cx.waker().clone()),
            }
        };
        Poll::Pending
    }
}

struct Entry {
    request_id: RequestId,
    deployment_id: Arc<str>,
    /// Set by an operator's cancel; read by the request's [`Cancelled`].
    is_cancelled: bool,
    waker: Option<Waker>,
}

/// Requests running on this core: a slab, so that starting and ending a request hashes
/// nothing; listing and cancelling (operator actions) scan it.
#[derive(Default)]
pub struct ActiveRequests {
    slab: RefCell<Slab>,
}

#[derive(Default)]
struct Slab {
    slots: Vec<Slot>,
    free: Vec<usize>,
    len: usize,
}

/// One place of the slab. Its generation counts the requests it has held, so that a
/// [`Cancelled`] of a request that has ended never reads the next one's.
#[derive(Default)]
struct Slot {
    generation: u32,
    entry: Option<Entry>,
}

impl Slab {
    fn entry(&self, index: usize, generation: u32) -> Option<&Entry> {
        self.slots
            .get(index)
            .filter(|s| s.generation == generation)
            .and_then(|s| s.entry.as_ref())
    }

    fn entry_mut(&mut self, index: usize, generation: u32) -> Option<&mut Entry> {
        self.slots
            .get_mut(index)
            .filter(|s| s.generation == generation)
            .and_then(|s| s.entry.as_mut())
    }

    fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.slots.iter().filter_map(|s| s.entry.as_ref())
    }
}

/// Removes the request from the active set when dropped (on completion, error or cancel).
pub struct ActiveGuard {
    owner: Rc<ActiveRequests>,
    index: usize,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        // Taken out under the borrow, dropped after it: a waker's drop runs foreign code.
        let entry = {
            let mut slab = self.owner.slab.borrow_mut();
            let entry = slab.slots.get_mut(self.index).and_then(|s| s.entry.take());
            if entry.is_some() {
                slab.len -= 1;
                slab.free.push(self.index);
            }
            entry
        };
        drop(entry);
    }
}

impl ActiveRequests {
    /// Registers a request; the returned future completes when an operator cancels it.
    pub fn track(
        self: &Rc<Self>,
        request_id: RequestId,
        deployment_id: Arc<str>,
    ) -> (ActiveGuard, Cancelled) {
        let entry = Entry {
            request_id,
            deployment_id,
            is_cancelled: false,
            waker: None,
        };
        let mut slab = self.slab.borrow_mut();
        let index = match slab.free.pop() {
            Some(i) => i,
            None => {
                slab.slots.push(Slot::default());
                slab.slots.len() - 1
            }
        };
        let generation = match slab.slots.get_mut(index) {
            Some(slot) => {
                slot.generation = slot.generation.wrapping_add(1);
                slot.entry = Some(entry);
                slot.generation
            }
            None => 0,
        };
        slab.len += 1;
        drop(slab);
        (
            ActiveGuard {
                owner: Rc::clone(self),
                index,
            },
            Cancelled {
                owner: Rc::clone(self),
                index,
                generation,
            },
        )
    }

    /// The requests running now.
    pub fn list(&self) -> Vec<ActiveItem> {
        self.slab
            .borrow()
            .entries()
            .map(|e| ActiveItem {
                request_id: e.request_id.to_string(),
                deployment_id: e.deployment_id.to_string(),
            })
            .collect()
    }

    /// Fires the cancel signal of a request. Repeating it on a request still winding down
    /// answers true again.
    pub fn cancel(&self, request_id: &str) -> bool {
        let waker = {
            let mut slab = self.slab.borrow_mut();
            let Some(e) = slab
                .slots
                .iter_mut()
                .filter_map(|s| s.entry.as_mut())
                .find(|e| e.request_id.as_str() == request_id)
            else {
                return false;
            };
            e.is_cancelled = true;
            e.waker.take()
        };
        // Woken outside the borrow: the task it wakes may be this one.
        if let Some(w) = waker {
            w.wake();
        }
        true
    }

    /// Number of requests running on this core.
    pub fn len(&self) -> usize {
        self.slab.borrow().len
    }

    /// Whether no request runs on this core.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Sends a newly activated configuration to every remote worker (through core 0, which holds
/// every worker's lane 0).
pub fn push_config(state: &ControlState, version: u64, payload: Vec<u8>) {
    if let Some(m) = state.mailboxes.get().and_then(|m| m.first()) {
        m.send(CoreCommand::PushConfig(version, Arc::new(payload)));
    }
}

/// The receiving end of the mailbox, for the core that serves it.
impl MailboxReceiver {
    /// The next command, or `None` once every sender is gone.
    pub async fn next(&mut self) -> Option<CoreCommand> {
        self.rx.next().await
    }
}

/// Lists the active requests of every core, ordered by request id.
pub async fn list_active(state: &Arc<ControlState>) -> Vec<ActiveItem> {
    let mut out = Vec::new();
    let Some(boxes) = state.mailboxes.get() else {
        return out;
    };
    let mut replies = Vec::with_capacity(boxes.len());
    for b in boxes {
        let (tx, rx) = oneshot::channel();
        if b.tx.unbounded_send(CoreCommand::ListActive(tx)).is_ok() {
            replies.push(rx);
        }
    }
    for r in replies {
        if let Ok(items) = r.await {
            out.extend(items);
        }
    }
    out.sort();
    out
}

/// Cancels a request on whichever core runs it; answers whether one did.
pub async fn cancel_request(state: &Arc<ControlState>, request_id: &str) -> bool {
    let Some(boxes) = state.mailboxes.get() else {
        return false;
    };
    let mut replies = Vec::with_capacity(boxes.len());
    for b in boxes {
        let (tx, rx) = oneshot::channel();
        if b.tx
            .unbounded_send(CoreCommand::Cancel(request_id.to_string(), tx))
            .is_ok()
        {
            replies.push(rx);
        }
    }
    let mut found = false;
    for r in replies {
        found |= r.await.unwrap_or(false);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn track_list_cancel_and_release() {
        let active = Rc::new(ActiveRequests::default());
        let [id_a, id_b, id_c] = [1, 2, 3].map(|n| sortie_core::ids::request_id([n; 16]));
        let (a, mut a_cancelled) = active.track(id_a, "d1".into());
        let (b, _) = active.track(id_b, "d2".into());
        assert_eq!(active.len(), 2);
        let mut items = active.list();
        items.sort();
        assert_eq!(items[0].request_id, id_a.as_str());
        assert_eq!(items[1].deployment_id, "d2");

        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut a_cancelled).poll(&mut cx).is_pending());
        assert!(active.cancel(&id_a));
        assert!(
            active.cancel(&id_a),
            "repeats answer true while the request winds down"
        );
        assert!(Pin::new(&mut a_cancelled).poll(&mut cx).is_ready());
        assert!(!active.cancel("req_zzz"));

        drop(a);
        assert_eq!(active.len(), 1);
        assert!(!active.cancel(&id_a));
        // The freed slot is reused.
        let (c, _) = active.track(id_c, "d1".into());
        assert_eq!(active.len(), 2);
        drop(b);
        drop(c);
        assert!(active.is_empty());
        assert!(active.list().is_empty());
    }

    /// A request's `Cancelled` reads its own request only: once the request has ended and its
    /// place went to the next one, cancelling the next one does not reach it, and it is never
    /// set again.
    #[test]
    fn an_ended_request_does_not_see_the_cancel_of_the_one_in_its_place() {
        let active = Rc::new(ActiveRequests::default());
        let [id_a, id_b] = [1, 2].map(|n| sortie_core::ids::request_id([n; 16]));
        let (a, mut a_cancelled) = active.track(id_a, "d1".into());
        drop(a);
        let (_b, mut b_cancelled) = active.track(id_b, "d1".into());
        assert!(active.cancel(&id_b));

        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut b_cancelled).poll(&mut cx).is_ready());
        assert!(b_cancelled.is_set());
        assert!(Pin::new(&mut a_cancelled).poll(&mut cx).is_pending());
        assert!(!a_cancelled.is_set());
    }

    /// A cancel wakes the task that waits on it.
    #[test]
    fn a_cancel_wakes_the_waiting_request() {
        use crate::testing::CountingWaker;
        let active = Rc::new(ActiveRequests::default());
        let id = sortie_core::ids::request_id([7; 16]);
        let (_guard, mut cancelled) = active.track(id, "d1".into());
        let count = CountingWaker::new();
        let waker = Waker::from(Arc::clone(&count));
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut cancelled).poll(&mut cx).is_pending());
        assert_eq!(count.wakes(), 0);
        assert!(active.cancel(&id));
        assert_eq!(count.wakes(), 1);
        assert!(Pin::new(&mut cancelled).poll(&mut cx).is_ready());
    }
}
