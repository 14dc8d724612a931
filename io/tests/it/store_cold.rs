//! Integration tests of the cold thread: a real store behind `ColdHandle` (SQLite, and
//! PostgreSQL on the test cluster), driven from monoio runtimes on one and on several threads,
//! with a full queue, a read-only store and shutdown.

use crate::store_backends;

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use sortie_io::store::{
    AccessMode, ColdHandle, ColdThread, RecordStore, SqliteOptions, SqliteStore, StoreError,
    HISTORY_LIMIT,
};
use store_backends::Backend;

const T0: &str = "2026-01-01T00:00:00Z";
const T1: &str = "2026-01-01T00:00:01Z";
const DEFAULT_SNAPSHOT: &str = r#"{"default_timeout_ms":60000}"#;

/// Upper bound on any single wait in these tests; reaching it means a lost wake-up or a hung
/// cold thread, and fails the test instead of hanging it.
const DEADLINE: Duration = Duration::from_secs(30);

fn start(b: &dyn Backend) -> (ColdHandle, std::thread::JoinHandle<()>) {
    ColdThread::start(b.open()).expect("cold thread starts")
}

// The cold thread's contract holds on both backends (PostgreSQL adds a connection thread
// between the cold thread and the database).
on_both_backends!(
    every_operation_answers_inside_a_monoio_runtime,
    two_monoio_threads_append_concurrently_without_losing_a_write,
    a_full_queue_answers_busy_at_once_instead_of_blocking,
    shutdown_serves_queued_work_then_every_call_is_unavailable,
    a_handle_works_from_many_clones_on_many_threads,
);

/// Runs `fut` to completion on a fresh monoio runtime, the kind a hot core runs.
fn block_on<F: Future>(fut: F) -> F::Output {
    let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .enable_timer()
        .build()
        .expect("monoio runtime");
    rt.block_on(fut)
}

/// Awaits `fut` on the current monoio runtime, failing the test at the deadline.
async fn within_deadline<F: Future>(fut: F) -> F::Output {
    match monoio::time::timeout(DEADLINE, fut).await {
        Ok(out) => out,
        Err(_) => panic!("no reply from the cold thread within {DEADLINE:?}"),
    }
}

/// Polls a future once without a runtime: enough to make a `ColdHandle` call enqueue its
/// command, which it does on first poll.
fn poll_once<F: Future>(fut: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

/// Blocks the cold thread inside a job until the returned sender is dropped or sent to, so a
/// test can fill the queue behind it. Returns once the thread is inside the job.
fn hold_cold_thread(
    handle: &ColdHandle,
) -> (
    crossbeam_channel::Sender<()>,
    std::thread::JoinHandle<Result<(), StoreError>>,
) {
    let (entered_tx, entered_rx) = crossbeam_channel::bounded(1);
    let (release_tx, release_rx) = crossbeam_channel::bounded::<()>(1);
    let holder = handle.clone();
    let join = std::thread::spawn(move || {
        holder.call_blocking(move |_| {
            let _ = entered_tx.send(());
            // Either a release message or the sender's drop ends the wait.
            let _ = release_rx.recv();
            Ok(())
        })
    });
    entered_rx
        .recv_timeout(DEADLINE)
        .expect("the cold thread runs the holding job");
    (release_tx, join)
}

fn every_operation_answers_inside_a_monoio_runtime(b: &dyn Backend) {
    let (handle, join) = start(b);
    block_on(async {
        assert_eq!(within_deadline(handle.latest_config()).await, Ok(None));
        let boot = within_deadline(handle.bootstrap(DEFAULT_SNAPSHOT.into(), T0))
            .await
            .expect("bootstrap");
        assert_eq!(boot.revision, 1);
        let second = within_deadline(handle.append_config(
            1,
            r#"{"default_timeout_ms":1000}"#.into(),
            "alice",
            "update",
            T1,
        ))
        .await
        .expect("append");
        assert_eq!(second.revision, 2);
        assert_eq!(
            within_deadline(handle.append_config(1, "{}".into(), "bob", "update", T1)).await,
            Err(StoreError::RevisionConflict { current: 2 })
        );
        assert_eq!(
            within_deadline(handle.latest_config()).await,
            Ok(Some(second.clone()))
        );
        assert_eq!(
            within_deadline(handle.config_at(1)).await,
            Ok(Some(boot.clone()))
        );
        assert_eq!(
            within_deadline(handle.history(10)).await,
            Ok(vec![second, boot])
        );

        assert_eq!(
            within_deadline(handle.worker_settings("w1")).await,
            Ok(None)
        );
        let w1 = within_deadline(handle.update_worker_settings("w1", 0, true, true, "alice", T0))
            .await
            .expect("worker settings");
        assert_eq!(w1.revision, 1);
        assert_eq!(
            within_deadline(handle.update_worker_settings("w1", 0, true, false, "bob", T1)).await,
            Err(StoreError::RevisionConflict { current: 1 })
        );
        assert_eq!(
            within_deadline(handle.worker_settings("w1")).await,
            Ok(Some(w1.clone()))
        );
        assert_eq!(
            within_deadline(handle.all_worker_settings()).await,
            Ok(vec![w1])
        );
    });
    drop(handle);
    join.join()
        .expect("the thread ends when the last handle drops");
}

/// Appends one record per iteration from one monoio runtime, re-reading the latest revision
/// after every conflict, and returns the revisions it obtained.
fn append_with_retries(handle: ColdHandle, thread: u32, count: u32) -> Vec<u64> {
    block_on(async move {
        let mut won = Vec::new();
        let mut expected = within_deadline(handle.latest_config())
            .await
            .expect("latest")
            .map_or(0, |r| r.revision);
        for seq in 0..count {
            loop {
                let snapshot = format!(r#"{{"thread":{thread},"seq":{seq}}}"#);
                match within_deadline(handle.append_config(
                    expected,
                    snapshot,
                    &format!("thread-{thread}"),
                    "update",
                    T1,
                ))
                .await
                {
                    Ok(record) => {
                        won.push(record.revision);
                        expected = record.revision;
                        break;
                    }
                    Err(StoreError::RevisionConflict { current }) => expected = current,
                    Err(other) => panic!("append failed: {other}"),
                }
            }
        }
        won
    })
}

fn two_monoio_threads_append_concurrently_without_losing_a_write(b: &dyn Backend) {
    const THREADS: u32 = 2;
    const APPENDS: u32 = 200;
    let (handle, join) = start(b);
    handle
        .call_blocking(|store| store.bootstrap(DEFAULT_SNAPSHOT, T0))
        .expect("bootstrap");

    let workers: Vec<_> = (0..THREADS)
        .map(|thread| {
            let handle = handle.clone();
            std::thread::spawn(move || append_with_retries(handle, thread, APPENDS))
        })
        .collect();
    let mut all = BTreeSet::new();
    for worker in workers {
        let won = worker.join().expect("appending thread");
        assert_eq!(won.len(), APPENDS as usize);
        for revision in won {
            assert!(all.insert(revision), "revision {revision} handed out twice");
        }
    }
    let total = u64::from(THREADS * APPENDS);
    let expected: BTreeSet<u64> = (2..=total + 1).collect();
    assert_eq!(
        all, expected,
        "every append got its own revision, none lost"
    );

    let history = handle
        .call_blocking(|store| store.history(usize::MAX))
        .expect("history");
    assert_eq!(history.len(), HISTORY_LIMIT);
    assert_eq!(history.first().map(|r| r.revision), Some(total + 1));
    for pair in history.windows(2) {
        assert_eq!(pair[0].revision, pair[1].revision + 1, "contiguous");
    }
    // Each thread's records appear in its own sequence order.
    for thread in 0..THREADS {
        let seqs: Vec<u64> = history
            .iter()
            .rev()
            .filter(|r| r.actor == format!("thread-{thread}"))
            .map(|r| {
                let value: serde_json::Value =
                    serde_json::from_str(&r.snapshot_json).expect("stored JSON");
                value["seq"].as_u64().expect("seq")
            })
            .collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    }
    handle.shutdown();
    join.join().expect("cold thread");
}

fn a_full_queue_answers_busy_at_once_instead_of_blocking(b: &dyn Backend) {
    let (handle, join) = ColdThread::start_with_capacity(b.open(), 1).expect("start");
    let (release, holder) = hold_cold_thread(&handle);

    block_on(async {
        // The thread is busy and the queue (capacity 1) is empty: this call takes the slot.
        let mut queued = pin!(handle.bootstrap(DEFAULT_SNAPSHOT.into(), T0));
        assert!(poll_once(queued.as_mut()).is_pending());
        // Now the queue is full: both kinds of call fail fast.
        let mut rejected = pin!(handle.latest_config());
        assert_eq!(
            poll_once(rejected.as_mut()),
            Poll::Ready(Err(StoreError::Busy))
        );
        assert_eq!(
            handle.call_blocking(|store| store.latest_config()),
            Err(StoreError::Busy)
        );

        drop(release);
        let boot = within_deadline(queued)
            .await
            .expect("queued call is served");
        assert_eq!(boot.revision, 1);
    });
    assert_eq!(holder.join().expect("holder"), Ok(()));
    drop(handle);
    join.join().expect("cold thread");
}

#[test]
fn a_failing_store_answers_errors_and_keeps_the_latest_config() {
    let dir = tempfile::tempdir().expect("temp dir");
    let latest = {
        let mut store = SqliteStore::open(dir.path()).expect("store");
        store.bootstrap(DEFAULT_SNAPSHOT, T0).expect("bootstrap")
    };
    let options = SqliteOptions {
        access: AccessMode::ReadOnly,
        ..SqliteOptions::default()
    };
    let store = SqliteStore::open_with(dir.path(), options).expect("read-only store");
    let (handle, join) = ColdThread::start(Box::new(store)).expect("start");
    block_on(async {
        assert_eq!(
            within_deadline(handle.append_config(1, "{}".into(), "alice", "update", T1)).await,
            Err(StoreError::ReadOnly)
        );
        assert_eq!(
            within_deadline(handle.update_worker_settings("w1", 0, true, false, "alice", T1)).await,
            Err(StoreError::ReadOnly)
        );
        assert_eq!(
            within_deadline(handle.latest_config()).await,
            Ok(Some(latest.clone()))
        );
        assert_eq!(within_deadline(handle.history(10)).await, Ok(vec![latest]));
    });
    drop(handle);
    join.join().expect("cold thread");
}

fn shutdown_serves_queued_work_then_every_call_is_unavailable(b: &dyn Backend) {
    let (handle, join) = start(b);
    let (release, holder) = hold_cold_thread(&handle);

    block_on(async {
        let mut first = pin!(handle.bootstrap(DEFAULT_SNAPSHOT.into(), T0));
        let mut second = pin!(handle.append_config(1, "{}".into(), "alice", "update", T1));
        assert!(poll_once(first.as_mut()).is_pending());
        assert!(poll_once(second.as_mut()).is_pending());
        handle.shutdown();
        drop(release);
        assert_eq!(within_deadline(first).await.map(|r| r.revision), Ok(1));
        assert_eq!(within_deadline(second).await.map(|r| r.revision), Ok(2));
    });
    assert_eq!(holder.join().expect("holder"), Ok(()));
    join.join().expect("the thread ends after shutdown");

    block_on(async {
        assert_eq!(
            within_deadline(handle.latest_config()).await,
            Err(StoreError::Unavailable)
        );
    });
    assert_eq!(
        handle.call_blocking(|store| store.history(1)),
        Err(StoreError::Unavailable)
    );
    // The store was closed cleanly with the queued writes committed.
    let mut reopened = b.open();
    assert_eq!(
        reopened
            .latest_config()
            .expect("latest")
            .map(|r| r.revision),
        Some(2)
    );
}

fn a_handle_works_from_many_clones_on_many_threads(b: &dyn Backend) {
    let (handle, join) = start(b);
    let readers: Vec<_> = (0..4)
        .map(|i| {
            let handle = handle.clone();
            std::thread::spawn(move || {
                block_on(async move {
                    let id = format!("w{i}");
                    within_deadline(handle.update_worker_settings(&id, 0, true, false, "ops", T0))
                        .await
                })
            })
        })
        .collect();
    for reader in readers {
        assert_eq!(reader.join().expect("thread").map(|w| w.revision), Ok(1));
    }
    let ids: Vec<String> = handle
        .call_blocking(|store| store.all_worker_settings())
        .expect("list")
        .into_iter()
        .map(|w| w.worker_id)
        .collect();
    assert_eq!(ids, ["w0", "w1", "w2", "w3"]);
    drop(handle);
    join.join().expect("cold thread");
}
