//! The cold thread: one OS thread that owns the `RecordStore` and the object store, and runs
//! every operation on them, so that hot cores only ever send a command and await a one-shot
//! reply.
//!
//! Hot-core side: [`ColdHandle`]'s async methods never block. They `try_send` on a bounded
//! channel (a full queue fails fast with [`StoreError::Busy`]) and await a
//! `futures_channel::oneshot` reply, which the cold thread completes from its own thread; the
//! waker crosses threads because monoio runs with its `sync` feature.
//!
//! Cold side: a tokio current-thread runtime with a `LocalSet`. Record-store jobs are short and
//! run one at a time, in arrival order. Object-store work (a part upload, a composition, a
//! download) runs as a local task, so that many bodies stream at once, each in bounded chunks
//! over its own small channel, while record-store jobs are served in between.
//!
//! Readiness: the cold thread probes the store every [`READINESS_PROBE_INTERVAL`] (between
//! commands, or when idle) and publishes the outcome in atomics that [`ColdHandle::is_ready`]
//! reads, so a readiness check never queues work: a flood of `/readyz` cannot fill the queue
//! that admin writes need. A probe older than [`READINESS_STALE_AFTER`] (the thread is stuck
//! on a stalled disk) or a stopped thread reads as not ready.

use std::cell::RefCell;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use futures_channel::oneshot;
use tokio::sync::mpsc::{self, error::TrySendError};

use super::objects::Objects;
use super::{ConfigRecord, RecordStore, StoreError, WorkerSettings};

/// Number of commands that may wait for the cold thread before [`ColdHandle`] answers
/// [`StoreError::Busy`]. Admin operations are rare; a queue this deep only fills when the disk
/// has stalled, and then failing fast is better than piling up work on the hot cores.
pub const COMMAND_QUEUE_CAPACITY: usize = 1024;

/// How often the cold thread checks that the store answers.
pub const READINESS_PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// A readiness probe older than this reads as not ready: the cold thread has been inside one
/// operation that long, so admin operations would wait as long.
pub const READINESS_STALE_AFTER: Duration = Duration::from_secs(10);

/// The outcome of the last readiness probe, written by the cold thread only.
#[derive(Debug, Default)]
struct Readiness {
    is_ready: AtomicBool,
    /// `clock::monotonic_ms_at` of the probe.
    probed_at_ms: AtomicU64,
}

/// Name of the cold thread, as shown by `ps -T`, `top -H` and debuggers.
const THREAD_NAME: &str = "sortie-cold";

/// One unit of work for the cold thread: it runs against the store and sends its own reply.
type Job = Box<dyn FnOnce(&mut dyn RecordStore) + Send>;

/// A task for the cold thread's local executor, built there from the shared context.
type Task = Box<dyn FnOnce(Rc<ColdContext>) -> Pin<Box<dyn Future<Output = ()>>> + Send>;

enum Command {
    Run(Job),
    Spawn(Task),
    Shutdown,
}

/// What cold-thread tasks work on: the record store and, when object storage is enabled, the
/// object store. Lives on the cold thread only.
pub struct ColdContext {
    store: RefCell<Box<dyn RecordStore + Send>>,
    objects: Option<Objects>,
}

impl ColdContext {
    /// Runs `f` on the record store. Never hold it across an await: the store is shared by
    /// every task of the thread.
    pub fn store<T>(&self, f: impl FnOnce(&mut dyn RecordStore) -> T) -> T {
        f(&mut **self.store.borrow_mut())
    }

    /// The object store, or `None` when object storage is disabled.
    pub fn objects(&self) -> Option<&Objects> {
        self.objects.as_ref()
    }
}

/// Starts the cold thread.
#[derive(Debug)]
pub struct ColdThread;

impl ColdThread {
    /// Moves `store` onto a new thread named `sortie-cold` that serves commands until every
    /// [`ColdHandle`] is dropped or [`ColdHandle::shutdown`] is called, then drops the store.
    /// Fails only when the OS refuses to create the thread.
    pub fn start(
        store: Box<dyn RecordStore + Send>,
    ) -> Result<(ColdHandle, JoinHandle<()>), StoreError> {
        Self::start_with(store, None, COMMAND_QUEUE_CAPACITY)
    }

    /// [`ColdThread::start`] with a command queue of `capacity` entries (at least 1).
    pub fn start_with_capacity(
        store: Box<dyn RecordStore + Send>,
        capacity: usize,
    ) -> Result<(ColdHandle, JoinHandle<()>), StoreError> {
        Self::start_with(store, None, capacity)
    }

    /// [`ColdThread::start`] with an object store and a queue of `capacity` entries.
    pub fn start_with(
        store: Box<dyn RecordStore + Send>,
        objects: Option<Objects>,
        capacity: usize,
    ) -> Result<(ColdHandle, JoinHandle<()>), StoreError> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let readiness = Arc::new(Readiness::default());
        let published = readiness.clone();
        let join = std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || serve(store, objects, rx, &published))
            .map_err(|e| StoreError::Io(format!("cannot start the cold thread: {e}")))?;
        Ok((ColdHandle { tx, readiness }, join))
    }
}

/// The cold thread's loop. Commands are served in arrival order; a shutdown serves what was
/// queued before it, then stops (object tasks still running are dropped, which fails their
/// callers and leaves no partial object: see `objects`).
fn serve(
    store: Box<dyn RecordStore + Send>,
    objects: Option<Objects>,
    mut rx: mpsc::Receiver<Command>,
    readiness: &Readiness,
) {
    tracing::debug!("cold thread started");
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the cold thread's runtime");
            return;
        }
    };
    let ctx = Rc::new(ColdContext {
        store: RefCell::new(store),
        objects,
    });
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let mut next_probe = probe(&ctx, readiness);
        loop {
            let wait = tokio::time::Instant::from_std(next_probe);
            // `recv` ends once every sender is gone and the queue is empty: the drop-to-stop
            // path.
            let command = match tokio::time::timeout_at(wait, rx.recv()).await {
                Ok(Some(command)) => command,
                Ok(None) => break,
                Err(_) => {
                    next_probe = probe(&ctx, readiness);
                    continue;
                }
            };
            if Instant::now() >= next_probe {
                next_probe = probe(&ctx, readiness);
            }
            match command {
                Command::Run(job) => run(&ctx, job),
                Command::Spawn(task) => {
                    // A panic inside a task is caught by the runtime; its reply sender is
                    // dropped on the way, so the caller sees `Unavailable`.
                    tokio::task::spawn_local(task(ctx.clone()));
                }
                Command::Shutdown => {
                    while let Ok(command) = rx.try_recv() {
                        if let Command::Run(job) = command {
                            run(&ctx, job);
                        }
                    }
                    break;
                }
            }
        }
    });
    readiness.is_ready.store(false, Ordering::Release);
    tracing::debug!("cold thread stopped");
}

/// Runs the readiness probe and publishes it; returns when the next one is due.
fn probe(ctx: &ColdContext, readiness: &Readiness) -> Instant {
    let is_ready = match ctx.store.try_borrow_mut() {
        Ok(mut store) => matches!(
            catch_unwind(AssertUnwindSafe(|| store.probe())),
            Ok(Ok(true))
        ),
        Err(_) => false,
    };
    let now = Instant::now();
    readiness
        .probed_at_ms
        .store(crate::clock::monotonic_ms_at(now), Ordering::Release);
    readiness.is_ready.store(is_ready, Ordering::Release);
    now + READINESS_PROBE_INTERVAL
}

/// Runs one job. A panic inside the store is a bug, but it must not take the persistence of
/// the whole gateway down with it: the job's reply sender is dropped while unwinding, so its
/// caller sees [`StoreError::Unavailable`], and the next command is served normally (an
/// interrupted SQLite transaction rolls back when its guard drops).
fn run(ctx: &ColdContext, job: Job) {
    let Ok(mut store) = ctx.store.try_borrow_mut() else {
        tracing::error!("the record store is in use by a job that did not finish");
        return;
    };
    if catch_unwind(AssertUnwindSafe(|| job(&mut **store))).is_err() {
        tracing::error!("a store operation panicked on the cold thread; its caller got an error");
    }
}

/// A cheap, cloneable handle to the cold thread, usable from any thread or monoio runtime.
///
/// Every async method queues one operation without blocking and awaits its reply. Errors: the
/// store's own, [`StoreError::Busy`] when the queue is full, [`StoreError::Unavailable`] when
/// the thread has stopped.
#[derive(Debug, Clone)]
pub struct ColdHandle {
    tx: mpsc::Sender<Command>,
    readiness: Arc<Readiness>,
}

impl ColdHandle {
    /// Whether the store answered the cold thread's last probe with a configuration, and that
    /// probe is recent. Reads two atomics; queues nothing.
    pub fn is_ready(&self) -> bool {
        let now = crate::clock::monotonic_ms_at(Instant::now());
        let at = self.readiness.probed_at_ms.load(Ordering::Acquire);
        let stale_ms = u64::try_from(READINESS_STALE_AFTER.as_millis()).unwrap_or(u64::MAX);
        self.readiness.is_ready.load(Ordering::Acquire) && now.saturating_sub(at) <= stale_ms
    }

    /// Runs `op` on the cold thread and awaits its result. The building block of the typed
    /// methods, public so that callers can group several store calls into one round trip.
    pub async fn call<T, F>(&self, op: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut dyn RecordStore) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        self.enqueue(Box::new(move |store| {
            // The caller may have stopped waiting; then nobody wants the result.
            let _ = reply.send(op(store));
        }))?;
        answer.await.unwrap_or(Err(StoreError::Unavailable))
    }

    /// Runs `op` on the cold thread and blocks the calling thread until it is done. For
    /// startup, shutdown and command-line code only: never call it on a hot core.
    pub fn call_blocking<T, F>(&self, op: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut dyn RecordStore) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        self.enqueue(Box::new(move |store| {
            let _ = reply.send(op(store));
        }))?;
        answer.recv().unwrap_or(Err(StoreError::Unavailable))
    }

    fn enqueue(&self, job: Job) -> Result<(), StoreError> {
        self.send(Command::Run(job))
    }

    fn send(&self, command: Command) -> Result<(), StoreError> {
        self.tx.try_send(command).map_err(|e| match e {
            TrySendError::Full(_) => StoreError::Busy,
            TrySendError::Closed(_) => StoreError::Unavailable,
        })
    }

    /// Starts the future `op` builds as a task on the cold thread without waiting for it (a
    /// download that feeds a channel, the expiry sweep).
    pub fn spawn<F, Fut>(&self, op: F) -> Result<(), StoreError>
    where
        F: FnOnce(Rc<ColdContext>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        self.send(Command::Spawn(Box::new(move |ctx| Box::pin(op(ctx)))))
    }

    /// Runs the future `op` builds as a task on the cold thread and awaits its result. For
    /// object-store work that streams: the task may await (channels, the S3 client) while the
    /// thread serves other commands.
    pub async fn run_task<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Rc<ColdContext>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + 'static,
    {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Spawn(Box::new(move |ctx| {
            Box::pin(async move {
                let _ = reply.send(op(ctx).await);
            })
        })))?;
        answer.await.unwrap_or(Err(StoreError::Unavailable))
    }

    /// Asks the cold thread to stop after serving every command queued before this one. Later
    /// calls on any handle fail with [`StoreError::Unavailable`]. Waits for room in the queue,
    /// so call it from the thread that shuts the process down, not from a hot core; join the
    /// thread's `JoinHandle` to wait until the store is closed.
    pub fn shutdown(&self) {
        // An error means the thread is already gone, which is the goal.
        let _ = self.tx.blocking_send(Command::Shutdown);
    }

    /// See [`RecordStore::latest_config`].
    pub async fn latest_config(&self) -> Result<Option<ConfigRecord>, StoreError> {
        self.call(|store| store.latest_config()).await
    }

    /// See [`RecordStore::config_at`].
    pub async fn config_at(&self, revision: u64) -> Result<Option<ConfigRecord>, StoreError> {
        self.call(move |store| store.config_at(revision)).await
    }

    /// See [`RecordStore::append_config`]. The snapshot is taken by value so that a large
    /// document moves to the cold thread without a copy.
    pub async fn append_config(
        &self,
        expected_revision: u64,
        snapshot_json: String,
        actor: &str,
        action: &str,
        created_at: &str,
    ) -> Result<ConfigRecord, StoreError> {
        let (actor, action, created_at) =
            (actor.to_owned(), action.to_owned(), created_at.to_owned());
        self.call(move |store| {
            store.append_config(
                expected_revision,
                &snapshot_json,
                &actor,
                &action,
                &created_at,
            )
        })
        .await
    }

    /// See [`RecordStore::history`].
    pub async fn history(&self, limit: usize) -> Result<Vec<ConfigRecord>, StoreError> {
        self.call(move |store| store.history(limit)).await
    }

    /// See [`RecordStore::bootstrap`].
    pub async fn bootstrap(
        &self,
        default_snapshot_json: String,
        created_at: &str,
    ) -> Result<ConfigRecord, StoreError> {
        let created_at = created_at.to_owned();
        self.call(move |store| store.bootstrap(&default_snapshot_json, &created_at))
            .await
    }

    /// See [`RecordStore::worker_settings`].
    pub async fn worker_settings(
        &self,
        worker_id: &str,
    ) -> Result<Option<WorkerSettings>, StoreError> {
        let worker_id = worker_id.to_owned();
        self.call(move |store| store.worker_settings(&worker_id))
            .await
    }

    /// See [`RecordStore::all_worker_settings`].
    pub async fn all_worker_settings(&self) -> Result<Vec<WorkerSettings>, StoreError> {
        self.call(|store| store.all_worker_settings()).await
    }

    /// See [`RecordStore::update_worker_settings`].
    pub async fn update_worker_settings(
        &self,
        worker_id: &str,
        expected_revision: u64,
        is_enabled: bool,
        is_draining: bool,
        actor: &str,
        updated_at: &str,
    ) -> Result<WorkerSettings, StoreError> {
        let (worker_id, actor, updated_at) = (
            worker_id.to_owned(),
            actor.to_owned(),
            updated_at.to_owned(),
        );
        self.call(move |store| {
            store.update_worker_settings(
                &worker_id,
                expected_revision,
                is_enabled,
                is_draining,
                &actor,
                &updated_at,
            )
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store with no data, enough to exercise the thread's plumbing without a disk.
    struct EmptyStore;

    impl RecordStore for EmptyStore {
        fn latest_config(&mut self) -> Result<Option<ConfigRecord>, StoreError> {
            Ok(None)
        }
        fn config_at(&mut self, _: u64) -> Result<Option<ConfigRecord>, StoreError> {
            Ok(None)
        }
        fn append_config(
            &mut self,
            _: u64,
            _: &str,
            _: &str,
            _: &str,
            _: &str,
        ) -> Result<ConfigRecord, StoreError> {
            Err(StoreError::ReadOnly)
        }
        fn history(&mut self, _: usize) -> Result<Vec<ConfigRecord>, StoreError> {
            Ok(Vec::new())
        }
        fn bootstrap(&mut self, _: &str, _: &str) -> Result<ConfigRecord, StoreError> {
            Err(StoreError::ReadOnly)
        }
        fn worker_settings(&mut self, _: &str) -> Result<Option<WorkerSettings>, StoreError> {
            Ok(None)
        }
        fn all_worker_settings(&mut self) -> Result<Vec<WorkerSettings>, StoreError> {
            Ok(Vec::new())
        }
        fn update_worker_settings(
            &mut self,
            _: &str,
            _: u64,
            _: bool,
            _: bool,
            _: &str,
            _: &str,
        ) -> Result<WorkerSettings, StoreError> {
            Err(StoreError::ReadOnly)
        }
        fn create_receipt(
            &mut self,
            _: &crate::store::ReceiptRecord,
        ) -> Result<crate::store::ReceiptRecord, StoreError> {
            Err(StoreError::ReadOnly)
        }
        fn receipt(
            &mut self,
            _: &str,
            _: &str,
        ) -> Result<Option<crate::store::ReceiptRecord>, StoreError> {
            Ok(None)
        }
        fn put_receipt_part(
            &mut self,
            _: &str,
            _: &str,
            _: &crate::store::PartRecord,
            _: &str,
        ) -> Result<bool, StoreError> {
            Err(StoreError::ReadOnly)
        }
        fn set_receipt_state(
            &mut self,
            _: &str,
            _: &str,
            _: sortie_core::receipt::ReceiptState,
            _: sortie_core::receipt::ReceiptState,
            _: &str,
            _: Option<&str>,
        ) -> Result<bool, StoreError> {
            Err(StoreError::ReadOnly)
        }
        fn assign_receipt(
            &mut self,
            _: &str,
            _: &str,
            _: &str,
            _: &str,
        ) -> Result<bool, StoreError> {
            Err(StoreError::ReadOnly)
        }
        fn release_receipt(
            &mut self,
            _: &str,
            _: &str,
            _: &str,
            _: sortie_core::receipt::ReceiptState,
            _: &str,
        ) -> Result<bool, StoreError> {
            Err(StoreError::ReadOnly)
        }
        fn due_receipts(&mut self, _: u64, _: usize) -> Result<Vec<(String, String)>, StoreError> {
            Ok(Vec::new())
        }
        fn recover_receipts(&mut self, _: &str, _: Option<&str>) -> Result<usize, StoreError> {
            Ok(0)
        }
    }

    #[test]
    fn the_thread_is_named_and_answers_blocking_calls() {
        let (handle, join) = ColdThread::start(Box::new(EmptyStore)).expect("thread starts");
        let name = handle
            .call_blocking(|_| Ok(std::thread::current().name().map(str::to_owned)))
            .expect("reply");
        assert_eq!(name.as_deref(), Some(THREAD_NAME));
        assert_eq!(handle.call_blocking(|s| s.latest_config()), Ok(None));
        drop(handle);
        join.join().expect("thread ends when the last handle drops");
    }

    #[test]
    fn a_panicking_operation_fails_its_caller_and_spares_the_thread() {
        let (handle, join) = ColdThread::start(Box::new(EmptyStore)).expect("thread starts");
        let panicked: Result<(), StoreError> = handle.call_blocking(|_| panic!("store bug"));
        assert_eq!(panicked, Err(StoreError::Unavailable));
        assert_eq!(handle.call_blocking(|s| s.history(5)), Ok(Vec::new()));
        handle.shutdown();
        join.join().expect("thread ends after shutdown");
        assert_eq!(
            handle.call_blocking(|s| s.latest_config()),
            Err(StoreError::Unavailable)
        );
    }
}
