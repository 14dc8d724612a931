//! Per-core control context: the requests this core is running (so the admin API can list and
//! cancel them) and the core's mailbox, through which other threads reach them without a lock.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use futures_channel::{mpsc, oneshot};
use futures_util::StreamExt as _;

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
}

/// The sending side of a core's mailbox (`Send + Sync`).
#[derive(Clone)]
pub struct CoreMailbox {
    tx: mpsc::UnboundedSender<CoreCommand>,
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

struct Entry {
    deployment_id: String,
    cancel: Option<oneshot::Sender<()>>,
}

/// Requests running on this core.
#[derive(Default)]
pub struct ActiveRequests {
    map: RefCell<HashMap<String, Entry>>,
}

/// Removes the request from the active set when dropped (on completion, error or cancel).
pub struct ActiveGuard {
    owner: Rc<ActiveRequests>,
    request_id: String,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.owner.map.borrow_mut().remove(&self.request_id);
    }
}

impl ActiveRequests {
    /// Registers a request; the receiver fires when an operator cancels it.
    pub fn track(
        self: &Rc<Self>,
        request_id: &str,
        deployment_id: &str,
    ) -> (ActiveGuard, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        self.map.borrow_mut().insert(
            request_id.to_string(),
            Entry {
                deployment_id: deployment_id.to_string(),
                cancel: Some(tx),
            },
        );
        (
            ActiveGuard {
                owner: self.clone(),
                request_id: request_id.to_string(),
            },
            rx,
        )
    }

    /// The requests running now.
    pub fn list(&self) -> Vec<ActiveItem> {
        self.map
            .borrow()
            .iter()
            .map(|(id, e)| ActiveItem {
                request_id: id.clone(),
                deployment_id: e.deployment_id.clone(),
            })
            .collect()
    }

    /// Fires the cancel signal of a request. Repeating it on a request still winding down
    /// answers true again.
    pub fn cancel(&self, request_id: &str) -> bool {
        match self.map.borrow_mut().get_mut(request_id) {
            Some(e) => {
                if let Some(tx) = e.cancel.take() {
                    let _ = tx.send(());
                }
                true
            }
            None => false,
        }
    }

    /// Number of requests running on this core.
    pub fn len(&self) -> usize {
        self.map.borrow().len()
    }

    /// Whether no request runs on this core.
    pub fn is_empty(&self) -> bool {
        self.map.borrow().is_empty()
    }
}

/// Serves the core's mailbox until every sender is gone.
pub async fn run_mailbox(mut rx: MailboxReceiver, active: Rc<ActiveRequests>) {
    while let Some(cmd) = rx.rx.next().await {
        match cmd {
            CoreCommand::ListActive(reply) => {
                let _ = reply.send(active.list());
            }
            CoreCommand::Cancel(id, reply) => {
                let _ = reply.send(active.cancel(&id));
            }
        }
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
