//! Per-core control context: the requests this core is running (so the admin API can list and
//! cancel them) and the core's mailbox, through which other threads reach them without a lock.

use std::cell::{Cell, RefCell};
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

/// The cancel signal of one request, shared by the request's future and the core's table: set
/// once, it wakes the request. Per core, so plain cells suffice.
#[derive(Default)]
struct CancelSignal {
    is_set: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

/// Completes when an operator cancels the request.
pub struct Cancelled(Rc<CancelSignal>);

impl Cancelled {
    /// Whether the request was cancelled, without waiting.
    pub fn is_set(&self) -> bool {
        self.0.is_set.get()
    }
}

impl Future for Cancelled {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0.is_set.get() {
            return Poll::Ready(());
        }
        let waker = match self.0.waker.take() {
            Some(w) if w.will_wake(cx.waker()) => w,
            _ => cx.waker().clone(),
        };
        self.0.waker.set(Some(waker));
        Poll::Pending
    }
}

struct Entry {
    request_id: RequestId,
    deployment_id: Arc<str>,
    signal: Rc<CancelSignal>,
}

/// Requests running on this core: a slab, so that starting and ending a request hashes
/// nothing; listing and cancelling (operator actions) scan it.
#[derive(Default)]
pub struct ActiveRequests {
    slab: RefCell<Slab>,
}

#[derive(Default)]
struct Slab {
    entries: Vec<Option<Entry>>,
    free: Vec<usize>,
    len: usize,
}

/// Removes the request from the active set when dropped (on completion, error or cancel).
pub struct ActiveGuard {
    owner: Rc<ActiveRequests>,
    index: usize,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        let mut slab = self.owner.slab.borrow_mut();
        if let Some(slot) = slab.entries.get_mut(self.index) {
            if slot.take().is_some() {
                slab.len -= 1;
                slab.free.push(self.index);
            }
        }
    }
}

impl ActiveRequests {
    /// Registers a request; the returned future completes when an operator cancels it.
    pub fn track(
        self: &Rc<Self>,
        request_id: RequestId,
        deployment_id: Arc<str>,
    ) -> (ActiveGuard, Cancelled) {
        let signal = Rc::new(CancelSignal::default());
        let entry = Entry {
            request_id,
            deployment_id,
            signal: Rc::clone(&signal),
        };
        let mut slab = self.slab.borrow_mut();
        let index = match slab.free.pop() {
            Some(i) => {
                if let Some(slot) = slab.entries.get_mut(i) {
                    *slot = Some(entry);
                }
                i
            }
            None => {
                slab.entries.push(Some(entry));
                slab.entries.len() - 1
            }
        };
        slab.len += 1;
        (
            ActiveGuard {
                owner: Rc::clone(self),
                index,
            },
            Cancelled(signal),
        )
    }

    /// The requests running now.
    pub fn list(&self) -> Vec<ActiveItem> {
        self.slab
            .borrow()
            .entries
            .iter()
            .flatten()
            .map(|e| ActiveItem {
                request_id: e.request_id.to_string(),
                deployment_id: e.deployment_id.to_string(),
            })
            .collect()
    }

    /// Fires the cancel signal of a request. Repeating it on a request still winding down
    /// answers true again.
    pub fn cancel(&self, request_id: &str) -> bool {
        let slab = self.slab.borrow();
        let Some(e) = slab
            .entries
            .iter()
            .flatten()
            .find(|e| e.request_id.as_str() == request_id)
        else {
            return false;
        };
        e.signal.is_set.set(true);
        if let Some(w) = e.signal.waker.take() {
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
}
