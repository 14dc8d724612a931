//! Integration tests of the record stores: every behaviour of the `RecordStore` contract runs
//! against both backends, SQLite on real database files in temporary data directories and
//! PostgreSQL on a real server the tests start (a private cluster, one database per test);
//! then what only one backend has (SQLite's file, WAL mode and read-only opening; PostgreSQL's
//! connection failures).

use crate::{pg, store_backends};

use std::path::Path;
use std::sync::{Arc, Barrier};

use sortie_core::receipt::ReceiptState;
use sortie_io::store::{
    AccessMode, ConfigRecord, PartRecord, PostgresConfig, PostgresStore, ReceiptRecord,
    RecordStore, SqliteOptions, SqliteStore, StoreError, BOOTSTRAP_ACTION, BOOTSTRAP_ACTOR,
    DATABASE_FILE_NAME, HISTORY_LIMIT, POSTGRES_SCHEMA_VERSION, SCHEMA_VERSION,
};
use store_backends::{Backend, Postgres, Sqlite};

const T0: &str = "2026-01-01T00:00:00.000Z";
const T1: &str = "2026-01-01T00:00:01.000Z";
const T2: &str = "2026-01-01T00:00:02.000Z";
const DEFAULT_SNAPSHOT: &str = r#"{"default_timeout_ms":60000}"#;
/// The expiry the test controls record in their heartbeat rows.
const EXPIRY: std::time::Duration = std::time::Duration::from_secs(10);

fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temporary directory")
}

fn open(dir: &Path) -> SqliteStore {
    SqliteStore::open(dir).expect("store opens")
}

on_both_backends!(
    append_checks_the_expected_revision_and_increments_it,
    a_stale_or_future_expected_revision_is_a_conflict_and_writes_nothing,
    history_is_newest_first_and_honours_the_limit,
    history_is_pruned_to_the_bound_and_revisions_keep_growing,
    bootstrap_creates_revision_one_once,
    worker_settings_use_optimistic_concurrency_per_worker,
    all_worker_settings_are_ordered_by_id_bytes,
    reopening_preserves_history_and_worker_settings,
    a_database_from_a_newer_schema_is_refused_with_a_clear_error,
    a_second_connection_sees_committed_writes_and_conflicts_across_processes_are_detected,
    racing_writers_on_one_revision_have_exactly_one_winner,
    receipts_follow_their_compare_and_set_transitions,
    recovery_moves_only_receipts_untouched_since_the_cutoff,
    a_release_applies_only_while_its_attempt_holds_the_receipt,
);

fn snapshot(n: u64) -> String {
    format!(r#"{{"default_timeout_ms":{n}}}"#)
}

/// Appends `count` records on top of whatever is stored, each naming its own revision.
fn append_many(store: &mut dyn RecordStore, count: u64) -> u64 {
    let mut revision = store
        .latest_config()
        .expect("latest")
        .map_or(0, |r| r.revision);
    for _ in 0..count {
        revision = store
            .append_config(revision, &snapshot(revision + 1), "alice", "update", T1)
            .expect("append")
            .revision;
    }
    revision
}

fn revisions(records: &[ConfigRecord]) -> Vec<u64> {
    records.iter().map(|r| r.revision).collect()
}

#[test]
fn open_creates_the_data_dir_and_the_database_file() {
    let dir = temp_dir();
    let data_dir = dir.path().join("nested").join("sortie-data");
    let mut store = open(&data_dir);
    assert_eq!(store.path(), data_dir.join(DATABASE_FILE_NAME));
    assert!(store.path().is_file());
    assert_eq!(store.latest_config(), Ok(None));
    assert_eq!(store.history(10), Ok(Vec::new()));
}

#[test]
fn the_database_file_is_in_wal_mode_at_the_current_schema_version() {
    let dir = temp_dir();
    let store = open(dir.path());
    drop(store);
    let conn = rusqlite::Connection::open(dir.path().join(DATABASE_FILE_NAME)).expect("open");
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .expect("journal_mode");
    assert_eq!(mode, "wal", "WAL is persistent in the file");
    let version: u32 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .expect("user_version");
    assert_eq!(version, SCHEMA_VERSION);
}

fn append_checks_the_expected_revision_and_increments_it(b: &dyn Backend) {
    let mut store = b.open();
    let first = store
        .append_config(0, DEFAULT_SNAPSHOT, "alice", "update", T0)
        .expect("first append on an empty history");
    assert_eq!(
        first,
        ConfigRecord {
            revision: 1,
            snapshot_json: DEFAULT_SNAPSHOT.into(),
            actor: "alice".into(),
            action: "update".into(),
            created_at: T0.into(),
        }
    );
    let second = store
        .append_config(1, &snapshot(2), "bob", "rollback", T1)
        .expect("second append");
    assert_eq!(second.revision, 2);
    assert_eq!(store.latest_config(), Ok(Some(second.clone())));
    assert_eq!(store.config_at(1), Ok(Some(first)));
    assert_eq!(store.config_at(2), Ok(Some(second)));
    assert_eq!(store.config_at(3), Ok(None));
    assert_eq!(store.config_at(0), Ok(None));
    assert_eq!(store.config_at(u64::MAX), Ok(None));
}

fn a_stale_or_future_expected_revision_is_a_conflict_and_writes_nothing(b: &dyn Backend) {
    let mut store = b.open();
    append_many(&mut *store, 3);
    let before = store.history(HISTORY_LIMIT).expect("history");
    for expected in [0, 1, 2, 4, 99, u64::MAX] {
        assert_eq!(
            store.append_config(expected, &snapshot(9), "mallory", "update", T1),
            Err(StoreError::RevisionConflict { current: 3 }),
            "expected revision {expected}"
        );
    }
    assert_eq!(store.history(HISTORY_LIMIT), Ok(before));
}

fn history_is_newest_first_and_honours_the_limit(b: &dyn Backend) {
    let mut store = b.open();
    append_many(&mut *store, 5);
    let all = store.history(100).expect("history");
    assert_eq!(revisions(&all), [5, 4, 3, 2, 1]);
    for record in &all {
        assert_eq!(record.snapshot_json, snapshot(record.revision));
    }
    assert_eq!(revisions(&store.history(2).expect("history")), [5, 4]);
    assert_eq!(store.history(0), Ok(Vec::new()));
    assert_eq!(store.history(usize::MAX).expect("history").len(), 5);
}

fn history_is_pruned_to_the_bound_and_revisions_keep_growing(b: &dyn Backend) {
    let mut store = b.open();
    let bound = HISTORY_LIMIT as u64;
    let latest = append_many(&mut *store, bound + 50);
    assert_eq!(latest, bound + 50);

    let kept = store.history(usize::MAX).expect("history");
    let expected: Vec<u64> = (51..=bound + 50).rev().collect();
    assert_eq!(revisions(&kept), expected, "the newest {bound} are kept");
    assert_eq!(store.config_at(50), Ok(None), "pruned");
    assert_eq!(store.config_at(1), Ok(None), "pruned");
    assert!(store.config_at(51).expect("read").is_some());

    // A pruned revision number is never handed out again.
    let next = store
        .append_config(latest, &snapshot(latest + 1), "alice", "update", T1)
        .expect("append after pruning");
    assert_eq!(next.revision, latest + 1);
    assert_eq!(
        store.history(usize::MAX).expect("history").len(),
        HISTORY_LIMIT
    );
}

fn bootstrap_creates_revision_one_once(b: &dyn Backend) {
    let mut store = b.open();
    let first = store.bootstrap(DEFAULT_SNAPSHOT, T0).expect("bootstrap");
    assert_eq!(
        first,
        ConfigRecord {
            revision: 1,
            snapshot_json: DEFAULT_SNAPSHOT.into(),
            actor: BOOTSTRAP_ACTOR.into(),
            action: BOOTSTRAP_ACTION.into(),
            created_at: T0.into(),
        }
    );
    assert_eq!(store.bootstrap(&snapshot(1), T1), Ok(first.clone()));
    assert_eq!(store.history(10), Ok(vec![first]));

    // Once the history has moved on, bootstrap answers the newest record and adds nothing.
    let update = store
        .append_config(1, &snapshot(2), "alice", "update", T1)
        .expect("append");
    assert_eq!(store.bootstrap(DEFAULT_SNAPSHOT, T1), Ok(update));
    assert_eq!(store.history(10).expect("history").len(), 2);
}

fn worker_settings_use_optimistic_concurrency_per_worker(b: &dyn Backend) {
    let mut store = b.open();
    assert_eq!(store.worker_settings("w1"), Ok(None));

    // No record yet: the current revision is 0.
    assert_eq!(
        store.update_worker_settings("w1", 1, true, true, "alice", T0),
        Err(StoreError::RevisionConflict { current: 0 })
    );
    let created = store
        .update_worker_settings("w1", 0, true, true, "alice", T0)
        .expect("create");
    assert_eq!(created.revision, 1);
    assert!(created.is_enabled && created.is_draining);
    assert_eq!(created.actor, "alice");
    assert_eq!(created.updated_at, T0);

    assert_eq!(
        store.update_worker_settings("w1", 0, false, false, "bob", T1),
        Err(StoreError::RevisionConflict { current: 1 })
    );
    assert_eq!(store.worker_settings("w1"), Ok(Some(created.clone())));

    let updated = store
        .update_worker_settings("w1", 1, false, true, "bob", T1)
        .expect("update");
    assert_eq!(updated.revision, 2);
    assert!(!updated.is_enabled && updated.is_draining);
    assert_eq!(store.worker_settings("w1"), Ok(Some(updated.clone())));

    // Another worker's revisions are independent.
    let other = store
        .update_worker_settings("w0", 0, true, false, "carol", T1)
        .expect("other worker");
    assert_eq!(other.revision, 1);
    assert_eq!(store.all_worker_settings(), Ok(vec![other, updated]));
}

fn all_worker_settings_are_ordered_by_id_bytes(b: &dyn Backend) {
    let mut store = b.open();
    for id in ["local-b", "Local-Z", "local-a", "w10", "w2", "é"] {
        store
            .update_worker_settings(id, 0, true, false, "alice", T0)
            .expect("create");
    }
    let ids: Vec<String> = store
        .all_worker_settings()
        .expect("list")
        .into_iter()
        .map(|w| w.worker_id)
        .collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted);
    assert_eq!(ids, ["Local-Z", "local-a", "local-b", "w10", "w2", "é"]);
}

fn reopening_preserves_history_and_worker_settings(b: &dyn Backend) {
    let (history, workers) = {
        let mut store = b.open();
        store.bootstrap(DEFAULT_SNAPSHOT, T0).expect("bootstrap");
        append_many(&mut *store, 7);
        store
            .update_worker_settings("w1", 0, false, true, "alice", T1)
            .expect("worker");
        (
            store.history(HISTORY_LIMIT).expect("history"),
            store.all_worker_settings().expect("workers"),
        )
    };
    let mut store = b.open();
    assert_eq!(store.history(HISTORY_LIMIT), Ok(history.clone()));
    assert_eq!(store.all_worker_settings(), Ok(workers));
    assert_eq!(
        store.latest_config().expect("latest").map(|r| r.revision),
        Some(8)
    );
    assert_eq!(
        history.last().map(|r| r.action.as_str()),
        Some(BOOTSTRAP_ACTION)
    );
    // Appending continues from the reopened state.
    let next = store
        .append_config(8, &snapshot(9), "alice", "update", T1)
        .expect("append after reopen");
    assert_eq!(next.revision, 9);
}

fn a_database_from_a_newer_schema_is_refused_with_a_clear_error(b: &dyn Backend) {
    drop(b.open());
    let newer = b.set_newer_schema();
    let err = b.try_open().err().expect("a newer schema is refused");
    assert_eq!(
        err,
        StoreError::NewerSchema {
            found: newer,
            supported: b.supported()
        }
    );
    let message = err.to_string();
    assert!(message.contains(&newer.to_string()), "{message}");
    assert!(message.contains("newer"), "{message}");
}

#[test]
fn a_read_only_open_refuses_a_newer_schema_too() {
    let backend = Sqlite(temp_dir());
    drop(backend.open());
    let newer = backend.set_newer_schema();
    let read_only = SqliteOptions {
        access: AccessMode::ReadOnly,
        ..SqliteOptions::default()
    };
    assert_eq!(
        SqliteStore::open_with(backend.0.path(), read_only).map(|_| ()),
        Err(StoreError::NewerSchema {
            found: newer,
            supported: SCHEMA_VERSION
        })
    );
}

#[test]
fn a_read_only_store_refuses_writes_and_keeps_its_data() {
    let dir = temp_dir();
    let latest = {
        let mut store = open(dir.path());
        store.bootstrap(DEFAULT_SNAPSHOT, T0).expect("bootstrap");
        append_many(&mut store, 2);
        store
            .update_worker_settings("w1", 0, true, false, "alice", T0)
            .expect("worker");
        store.latest_config().expect("latest")
    };
    let options = SqliteOptions {
        access: AccessMode::ReadOnly,
        ..SqliteOptions::default()
    };
    let mut store = SqliteStore::open_with(dir.path(), options).expect("read-only open");
    assert_eq!(
        store.append_config(3, &snapshot(4), "alice", "update", T1),
        Err(StoreError::ReadOnly)
    );
    assert_eq!(
        store.update_worker_settings("w1", 1, false, false, "alice", T1),
        Err(StoreError::ReadOnly)
    );
    assert_eq!(store.latest_config(), Ok(latest));
    assert_eq!(
        store
            .worker_settings("w1")
            .expect("read")
            .map(|w| w.revision),
        Some(1)
    );
    drop(store);
    let mut store = open(dir.path());
    assert_eq!(
        store.latest_config().expect("latest").map(|r| r.revision),
        Some(3)
    );
}

#[test]
fn a_read_only_open_of_a_missing_database_fails_without_creating_it() {
    let dir = temp_dir();
    let options = SqliteOptions {
        access: AccessMode::ReadOnly,
        ..SqliteOptions::default()
    };
    let err = SqliteStore::open_with(dir.path(), options).expect_err("nothing to open");
    assert!(
        matches!(err, StoreError::Database(ref m) if m.contains(DATABASE_FILE_NAME)),
        "{err:?}"
    );
    assert!(!dir.path().join(DATABASE_FILE_NAME).exists());
}

#[test]
fn a_file_that_is_not_a_database_is_reported_as_corrupt() {
    let dir = temp_dir();
    std::fs::write(
        dir.path().join(DATABASE_FILE_NAME),
        b"this is not an SQLite database, just some text that is long enough to be a header",
    )
    .expect("write");
    let err = SqliteStore::open(dir.path()).expect_err("garbage refused");
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
}

#[test]
fn a_data_dir_that_is_a_file_is_an_io_error() {
    let dir = temp_dir();
    let file = dir.path().join("occupied");
    std::fs::write(&file, b"x").expect("write");
    let err = SqliteStore::open(&file.join("data")).expect_err("cannot create");
    assert!(matches!(err, StoreError::Io(_)), "{err:?}");
}

fn a_second_connection_sees_committed_writes_and_conflicts_across_processes_are_detected(
    backend: &dyn Backend,
) {
    // Two stores on one database stand in for two processes (two controls) sharing it: the
    // compare-and-set is atomic between them.
    let mut a = backend.open();
    let mut b = backend.open();
    a.bootstrap(DEFAULT_SNAPSHOT, T0).expect("bootstrap");
    assert_eq!(
        b.latest_config().expect("read").map(|r| r.revision),
        Some(1)
    );
    a.append_config(1, &snapshot(2), "alice", "update", T1)
        .expect("a appends");
    assert_eq!(
        b.append_config(1, &snapshot(2), "bob", "update", T1),
        Err(StoreError::RevisionConflict { current: 2 })
    );
}

fn racing_writers_on_one_revision_have_exactly_one_winner(backend: &dyn Backend) {
    // Several connections append on the same revision at the same moment, as several controls
    // taking one admin write each would: one commits, every other gets the conflict naming
    // the winner's revision, and the history holds exactly one new record.
    const WRITERS: usize = 6;
    let mut first = backend.open();
    first.bootstrap(DEFAULT_SNAPSHOT, T0).expect("bootstrap");
    let stores: Vec<_> = (0..WRITERS).map(|_| backend.open()).collect();
    let barrier = Arc::new(Barrier::new(WRITERS));
    let threads: Vec<_> = stores
        .into_iter()
        .enumerate()
        .map(|(i, mut store)| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                store.append_config(1, &snapshot(100 + i as u64), &format!("w{i}"), "update", T1)
            })
        })
        .collect();
    let results: Vec<_> = threads
        .into_iter()
        .map(|t| t.join().expect("writer thread"))
        .collect();
    let winners: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    for r in &results {
        match r {
            Ok(rec) => assert_eq!(rec.revision, 2),
            Err(e) => assert_eq!(*e, StoreError::RevisionConflict { current: 2 }),
        }
    }
    let history = first.history(10).expect("history");
    assert_eq!(revisions(&history), [2, 1]);
    assert_eq!(
        history.first().map(|r| &r.actor),
        winners.first().map(|w| &w.actor)
    );
}

fn receipt(id: &str, key: Option<&str>) -> ReceiptRecord {
    ReceiptRecord {
        receipt_id: id.into(),
        deployment_id: "dep".into(),
        direction: "request".into(),
        state: ReceiptState::Uploading,
        size_bytes: 10,
        sha256_hex: "ab".repeat(32),
        idempotency_key: key.map(str::to_owned),
        parts: Vec::new(),
        created_at: T0.into(),
        updated_at: T0.into(),
        expires_at: T2.into(),
        expires_unix_ms: 2_000,
        failure: None,
    }
}

fn part(number: u32, key: &str) -> PartRecord {
    PartRecord {
        number,
        size_bytes: 5,
        sha256_hex: "cd".repeat(32),
        object_key: key.into(),
    }
}

fn receipts_follow_their_compare_and_set_transitions(backend: &dyn Backend) {
    let mut a = backend.open();
    let mut b = backend.open();
    // On a shared store a control takes receipts only under its lease (decision 110).
    a.control_heartbeat("127.0.0.1:1", T0, EXPIRY)
        .expect("a beats");
    b.control_heartbeat("127.0.0.1:2", T0, EXPIRY)
        .expect("b beats");
    let created = a
        .create_receipt(&receipt("rcpt_1", Some("k1")))
        .expect("create");
    assert_eq!(created, receipt("rcpt_1", Some("k1")));
    // The same idempotency key from another connection answers the stored receipt.
    let again = b
        .create_receipt(&receipt("rcpt_2", Some("k1")))
        .expect("retry");
    assert_eq!(again.receipt_id, "rcpt_1");
    assert_eq!(b.receipt("dep", "rcpt_2"), Ok(None));
    assert_eq!(
        b.receipt("other", "rcpt_1"),
        Ok(None),
        "scoped to its deployment"
    );

    assert_eq!(
        b.put_receipt_part("dep", "rcpt_1", &part(2, "o2"), T1),
        Ok(true)
    );
    assert_eq!(
        a.put_receipt_part("dep", "rcpt_1", &part(1, "o1"), T1),
        Ok(true)
    );
    // A replaced part keeps one row, pointing at the new object.
    assert_eq!(
        a.put_receipt_part("dep", "rcpt_1", &part(1, "o1b"), T1),
        Ok(true)
    );
    let stored = b.receipt("dep", "rcpt_1").expect("read").expect("exists");
    let keys: Vec<_> = stored
        .parts
        .iter()
        .map(|p| (p.number, p.object_key.as_str()))
        .collect();
    assert_eq!(keys, [(1, "o1b"), (2, "o2")]);
    assert_eq!(stored.updated_at, T1);

    // The state moves only from the state named; the loser writes nothing.
    assert_eq!(
        a.set_receipt_state(
            "dep",
            "rcpt_1",
            ReceiptState::Uploading,
            ReceiptState::Verifying,
            T2,
            None
        ),
        Ok(true)
    );
    assert_eq!(
        b.set_receipt_state(
            "dep",
            "rcpt_1",
            ReceiptState::Uploading,
            ReceiptState::Verifying,
            T2,
            None
        ),
        Ok(false)
    );
    assert_eq!(
        b.put_receipt_part("dep", "rcpt_1", &part(3, "o3"), T2),
        Ok(false),
        "no part once verification started"
    );
    // Only the control that holds the verifying receipt concludes it on a shared store
    // (decision 110); SQLite has one control and no holder.
    let by_other = b.set_receipt_state(
        "dep",
        "rcpt_1",
        ReceiptState::Verifying,
        ReceiptState::Verified,
        T2,
        None,
    );
    assert_eq!(by_other, Ok(a.control_id().is_none()));
    if a.control_id().is_none() {
        // Put back where the shared-store path is.
        assert_eq!(
            b.set_receipt_state(
                "dep",
                "rcpt_1",
                ReceiptState::Verified,
                ReceiptState::Verifying,
                T2,
                None
            ),
            Ok(true)
        );
    }
    assert_eq!(
        a.set_receipt_state(
            "dep",
            "rcpt_1",
            ReceiptState::Verifying,
            ReceiptState::Rejected,
            T2,
            Some("checksum mismatch")
        ),
        Ok(true)
    );
    let rejected = a.receipt("dep", "rcpt_1").expect("read").expect("exists");
    assert_eq!(rejected.state, ReceiptState::Rejected);
    assert_eq!(rejected.failure.as_deref(), Some("checksum mismatch"));
    assert_eq!(rejected.parts.len(), 2);

    // Expiry: due once the time has come, never while assigned.
    a.create_receipt(&receipt("rcpt_3", None)).expect("create");
    let mut due = a.due_receipts(2_000, 10).expect("due");
    due.sort();
    assert_eq!(
        due,
        [
            ("dep".to_string(), "rcpt_1".to_string()),
            ("dep".into(), "rcpt_3".into())
        ]
    );
    assert_eq!(a.due_receipts(1_999, 10), Ok(Vec::new()));
    assert_eq!(a.due_receipts(2_000, 1).expect("due").len(), 1);
}

/// The state of receipt `id` of deployment `dep`, which must exist.
fn state(store: &mut Box<dyn RecordStore + Send>, id: &str) -> ReceiptState {
    store
        .receipt("dep", id)
        .expect("read")
        .expect("exists")
        .state
}

fn recovery_moves_only_receipts_untouched_since_the_cutoff(backend: &dyn Backend) {
    let mut store = backend.open();
    for (id, state, at) in [
        ("rcpt_old_verifying", ReceiptState::Verifying, T0),
        ("rcpt_old_assigned", ReceiptState::Assigned, T0),
        ("rcpt_new_assigned", ReceiptState::Assigned, T2),
        ("rcpt_old_verified", ReceiptState::Verified, T0),
    ] {
        let mut r = receipt(id, None);
        r.state = state;
        r.updated_at = at.into();
        store.create_receipt(&r).expect("create");
    }
    assert_eq!(store.recover_receipts(T2, Some(T1)), Ok(2));
    assert_eq!(
        state(&mut store, "rcpt_old_verifying"),
        ReceiptState::Uploading
    );
    assert_eq!(
        state(&mut store, "rcpt_old_assigned"),
        ReceiptState::Verified
    );
    assert_eq!(
        state(&mut store, "rcpt_new_assigned"),
        ReceiptState::Assigned,
        "a live one is left alone"
    );
    assert_eq!(
        state(&mut store, "rcpt_old_verified"),
        ReceiptState::Verified
    );
    // One control alone on its store: every interrupted receipt.
    assert_eq!(store.recover_receipts(T2, None), Ok(1));
}

/// A verified receipt of deployment `dep`.
fn verified(store: &mut Box<dyn RecordStore + Send>, id: &str) {
    let mut r = receipt(id, None);
    r.state = ReceiptState::Verified;
    store.create_receipt(&r).expect("create");
}

/// Decision 098: an assignment names its attempt, and a release (or the revert of an
/// assignment whose outcome was unknown) applies only while that attempt holds the receipt.
fn a_release_applies_only_while_its_attempt_holds_the_receipt(backend: &dyn Backend) {
    let (mut a, mut b) = (backend.open(), backend.open());
    a.control_heartbeat("127.0.0.1:1", T0, EXPIRY)
        .expect("a beats");
    b.control_heartbeat("127.0.0.1:2", T0, EXPIRY)
        .expect("b beats");
    verified(&mut a, "rcpt_1");
    assert_eq!(a.assign_receipt("dep", "rcpt_1", "t1", T1), Ok(true));
    assert_eq!(
        b.assign_receipt("dep", "rcpt_1", "t2", T1),
        Ok(false),
        "one attempt at a time"
    );
    assert_eq!(
        a.release_receipt("dep", "rcpt_1", "t2", ReceiptState::Verified, T2),
        Ok(false),
        "another attempt's release changes nothing"
    );
    assert_eq!(state(&mut a, "rcpt_1"), ReceiptState::Assigned);
    assert_eq!(
        a.release_receipt("dep", "rcpt_1", "t1", ReceiptState::Consumed, T2),
        Ok(true)
    );
    assert_eq!(state(&mut b, "rcpt_1"), ReceiptState::Consumed);
    assert_eq!(
        a.release_receipt("dep", "rcpt_1", "t1", ReceiptState::Verified, T2),
        Ok(false),
        "a repeated release is harmless"
    );
    assert_eq!(state(&mut b, "rcpt_1"), ReceiptState::Consumed);

    // An assignment answered with an unknown outcome that did not happen: meanwhile another
    // attempt took the receipt, and the first one's revert leaves it with that attempt.
    verified(&mut a, "rcpt_2");
    assert_eq!(b.assign_receipt("dep", "rcpt_2", "t4", T1), Ok(true));
    assert_eq!(
        b.release_receipt("dep", "rcpt_2", "t3", ReceiptState::Verified, T2),
        Ok(false)
    );
    assert_eq!(state(&mut a, "rcpt_2"), ReceiptState::Assigned);
    // One that did happen is reverted.
    assert_eq!(
        b.release_receipt("dep", "rcpt_2", "t4", ReceiptState::Verified, T2),
        Ok(true)
    );
    assert_eq!(state(&mut a, "rcpt_2"), ReceiptState::Verified);
    // Only an assigned receipt is released, and only a verified one assigned.
    assert_eq!(
        a.release_receipt("dep", "rcpt_2", "t4", ReceiptState::Consumed, T2),
        Ok(false)
    );
    assert_eq!(a.assign_receipt("dep", "rcpt_1", "t5", T2), Ok(false));
    assert_eq!(a.assign_receipt("other", "rcpt_2", "t5", T2), Ok(false));

    // On a shared store the holder is checked too: the attempt's token released by another
    // control changes nothing. One control alone on SQLite has no holder.
    assert_eq!(a.assign_receipt("dep", "rcpt_2", "t6", T2), Ok(true));
    let by_other = b.release_receipt("dep", "rcpt_2", "t6", ReceiptState::Verified, T2);
    if a.control_id().is_some() {
        assert_eq!(by_other, Ok(false));
        assert_eq!(state(&mut a, "rcpt_2"), ReceiptState::Assigned);
    } else {
        assert_eq!(by_other, Ok(true));
    }
}

/// Decision 110: a control whose lease lapsed takes no receipt, and what it held and another
/// control recovered and took it cannot move on any more; once it beats again it takes
/// receipts again.
#[test]
fn a_control_whose_lease_lapsed_changes_no_receipt_it_no_longer_holds() {
    let expiry = std::time::Duration::from_secs(10);
    let backend = Postgres::new("fence");
    let (mut a, mut b) = (backend.open(), backend.open());
    let a_id = a.control_id().expect("a control id").to_owned();
    a.control_heartbeat("127.0.0.1:1", T0, EXPIRY)
        .expect("a beats");
    b.control_heartbeat("127.0.0.1:2", T0, EXPIRY)
        .expect("b beats");
    verified(&mut a, "rcpt_assigned");
    assert_eq!(a.assign_receipt("dep", "rcpt_assigned", "t1", T1), Ok(true));
    let mut r = receipt("rcpt_verifying", None);
    r.state = ReceiptState::Uploading;
    a.create_receipt(&r).expect("create");
    let verifying = |s: &mut Box<dyn RecordStore + Send>, from, to| {
        s.set_receipt_state("dep", "rcpt_verifying", from, to, T1, None)
    };
    assert_eq!(
        verifying(&mut a, ReceiptState::Uploading, ReceiptState::Verifying),
        Ok(true)
    );
    verified(&mut a, "rcpt_free");

    // a's beats stop reaching the store: its row ages past its expiry.
    let mut c = backend.config().connect().expect("connect");
    c.execute(
        "UPDATE controls SET last_seen_unix_ms = last_seen_unix_ms - 60000 WHERE control_id = $1",
        &[&a_id],
    )
    .expect("age a's row");
    // Without a live lease a takes nothing, even before anyone recovered anything.
    assert_eq!(a.assign_receipt("dep", "rcpt_free", "t2", T2), Ok(false));
    assert_eq!(state(&mut b, "rcpt_free"), ReceiptState::Verified);

    // b recovers a's receipts and takes both again.
    assert_eq!(b.recover_dead_controls(expiry, T2), Ok(2));
    assert_eq!(b.assign_receipt("dep", "rcpt_assigned", "t3", T2), Ok(true));
    assert_eq!(
        verifying(&mut b, ReceiptState::Uploading, ReceiptState::Verifying),
        Ok(true)
    );
    // a's late conclusions of what it held change nothing: b holds them now.
    assert_eq!(
        a.release_receipt("dep", "rcpt_assigned", "t1", ReceiptState::Consumed, T2),
        Ok(false)
    );
    assert_eq!(
        verifying(&mut a, ReceiptState::Verifying, ReceiptState::Verified),
        Ok(false)
    );
    assert_eq!(state(&mut b, "rcpt_assigned"), ReceiptState::Assigned);
    assert_eq!(state(&mut b, "rcpt_verifying"), ReceiptState::Verifying);
    // The holder concludes its own.
    assert_eq!(
        verifying(&mut b, ReceiptState::Verifying, ReceiptState::Verified),
        Ok(true)
    );
    // a beats again: a live lease, a new holder of what it takes.
    a.control_heartbeat("127.0.0.1:1", T0, EXPIRY)
        .expect("a beats again");
    assert_eq!(a.assign_receipt("dep", "rcpt_free", "t4", T2), Ok(true));
}

/// Decision 098: a control that stops gracefully removes its row and recovers the receipts it
/// still holds in the same transaction; the others' are left alone, and its heartbeat writes
/// nothing afterwards. SQLite keeps no rows.
#[test]
fn a_control_that_leaves_removes_its_row_and_returns_what_it_held() {
    let backend = Postgres::new("leave");
    let (mut a, mut b) = (backend.open(), backend.open());
    a.control_heartbeat("127.0.0.1:1", T0, EXPIRY)
        .expect("a beats");
    b.control_heartbeat("127.0.0.1:2", T0, EXPIRY)
        .expect("b beats");
    for (store, id) in [(&mut a, "rcpt_of_a"), (&mut b, "rcpt_of_b")] {
        verified(store, id);
        assert_eq!(store.assign_receipt("dep", id, "attempt", T1), Ok(true));
    }
    let mut verifying = receipt("rcpt_verifying", None);
    verifying.state = ReceiptState::Uploading;
    a.create_receipt(&verifying).expect("create");
    let moved = a.set_receipt_state(
        "dep",
        "rcpt_verifying",
        ReceiptState::Uploading,
        ReceiptState::Verifying,
        T1,
        None,
    );
    assert_eq!(moved, Ok(true));
    let mut c = backend.config().connect().expect("connect");
    let rows = |c: &mut ::postgres::Client| -> i64 {
        c.query_one("SELECT count(*) FROM controls", &[])
            .expect("count")
            .get(0)
    };
    assert_eq!(rows(&mut c), 2);

    assert_eq!(a.control_leave(T2), Ok(2));
    assert_eq!(rows(&mut c), 1, "a's row is gone at once");
    assert_eq!(state(&mut b, "rcpt_of_a"), ReceiptState::Verified);
    assert_eq!(state(&mut b, "rcpt_verifying"), ReceiptState::Uploading);
    assert_eq!(state(&mut b, "rcpt_of_b"), ReceiptState::Assigned);
    assert_eq!(
        a.release_receipt("dep", "rcpt_of_a", "attempt", ReceiptState::Consumed, T2),
        Ok(false),
        "a late release after leaving changes nothing"
    );
    assert_eq!(a.control_heartbeat("127.0.0.1:1", T2, EXPIRY), Ok(()));
    assert_eq!(rows(&mut c), 1, "no heartbeat after leaving");

    let mut alone = Sqlite::new().open();
    assert_eq!(alone.control_leave(T2), Ok(0));
}

#[test]
fn postgres_schema_is_at_the_current_version_and_migrating_twice_is_a_no_op() {
    let url = pg::cluster().fresh_database("schema");
    let backend = Postgres(url);
    // Two controls starting at once: both open, one migrates, the other finds it done.
    let opened: Vec<_> = (0..2)
        .map(|_| {
            let config = backend.config();
            std::thread::spawn(move || PostgresStore::open(&config).map(|_| ()))
        })
        .collect();
    for t in opened {
        assert_eq!(t.join().expect("thread"), Ok(()));
    }
    let mut c = backend.config().connect().expect("connect");
    let version: i32 = c
        .query_one("SELECT version FROM sortie_schema", &[])
        .expect("version")
        .get(0);
    assert_eq!(u32::try_from(version), Ok(POSTGRES_SCHEMA_VERSION));
}

/// Decision 094: receipts held by a control whose heartbeat row expired are recovered by
/// another; those of live controls, and the caller's own, are left alone. SQLite keeps no rows.
#[test]
fn receipts_of_a_control_whose_row_expired_are_recovered_by_another() {
    let expiry = std::time::Duration::from_secs(10);
    let backend = Postgres::new("heartbeat");
    let (mut a, mut b) = (backend.open(), backend.open());
    let a_id = a.control_id().expect("a control id").to_owned();
    assert_ne!(
        Some(a_id.as_str()),
        b.control_id(),
        "each open mints its own id"
    );
    a.control_heartbeat("127.0.0.1:1", T0, EXPIRY)
        .expect("a beats");
    b.control_heartbeat("127.0.0.1:2", T0, EXPIRY)
        .expect("b beats");
    for (store, id) in [(&mut a, "rcpt_of_a"), (&mut b, "rcpt_of_b")] {
        let mut r = receipt(id, None);
        r.state = ReceiptState::Verified;
        store.create_receipt(&r).expect("create");
        let moved = store.set_receipt_state(
            "dep",
            id,
            ReceiptState::Verified,
            ReceiptState::Assigned,
            T1,
            None,
        );
        assert_eq!(moved, Ok(true));
    }
    assert_eq!(b.recover_dead_controls(expiry, T2), Ok(0), "a is alive");

    // a stops beating: its row is older than the expiry by the store's clock.
    let mut c = backend.config().connect().expect("connect");
    c.execute(
        "UPDATE controls SET last_seen_unix_ms = last_seen_unix_ms - 60000 WHERE control_id = $1",
        &[&a_id],
    )
    .expect("age a's row");
    assert_eq!(a.recover_dead_controls(expiry, T2), Ok(0), "never its own");
    assert_eq!(b.recover_dead_controls(expiry, T2), Ok(1));
    assert_eq!(state(&mut b, "rcpt_of_a"), ReceiptState::Verified);
    assert_eq!(state(&mut b, "rcpt_of_b"), ReceiptState::Assigned);
    let rows: i64 = c
        .query_one("SELECT count(*) FROM controls", &[])
        .expect("count")
        .get(0);
    assert_eq!(rows, 1, "the dead control's row is removed");

    let mut alone = Sqlite::new().open();
    assert_eq!(alone.control_id(), None);
    assert_eq!(alone.control_heartbeat("127.0.0.1:1", T0, EXPIRY), Ok(()));
    assert_eq!(alone.recover_dead_controls(expiry, T2), Ok(0));
}

/// Decision 099: each control is judged by the expiry its own row records, whatever the
/// reader's setting; a row without one (written by an earlier version) by the reader's.
#[test]
fn each_control_is_judged_by_the_expiry_its_row_records() {
    use std::time::Duration;
    let backend = Postgres::new("own_expiry");
    let (mut patient, mut strict, mut reader) = (backend.open(), backend.open(), backend.open());
    patient
        .control_heartbeat("127.0.0.1:1", T0, Duration::from_secs(120))
        .expect("beat");
    strict
        .control_heartbeat("127.0.0.1:2", T0, Duration::from_secs(20))
        .expect("beat");
    reader
        .control_heartbeat("127.0.0.1:3", T0, Duration::from_secs(1))
        .expect("beat");
    for (store, id) in [(&mut patient, "rcpt_patient"), (&mut strict, "rcpt_strict")] {
        verified(store, id);
        assert_eq!(store.assign_receipt("dep", id, "attempt", T1), Ok(true));
    }
    // Both rows last seen a minute ago.
    let mut c = backend.config().connect().expect("connect");
    c.execute(
        "UPDATE controls SET last_seen_unix_ms = last_seen_unix_ms - 60000 \
         WHERE control_id <> $1",
        &[&reader.control_id().expect("an id")],
    )
    .expect("age the rows");
    // The reader's own 1 s does not apply to them; the strict one's 20 s has passed.
    assert_eq!(
        reader.recover_dead_controls(Duration::from_secs(1), T2),
        Ok(1)
    );
    assert_eq!(state(&mut reader, "rcpt_strict"), ReceiptState::Verified);
    assert_eq!(state(&mut reader, "rcpt_patient"), ReceiptState::Assigned);
    // A row without an expiry is judged by the reader's.
    c.execute("UPDATE controls SET expiry_ms = NULL", &[])
        .expect("an earlier version's row");
    assert_eq!(
        reader.recover_dead_controls(Duration::from_secs(600), T2),
        Ok(0)
    );
    assert_eq!(
        reader.recover_dead_controls(Duration::from_secs(30), T2),
        Ok(1)
    );
    assert_eq!(state(&mut reader, "rcpt_patient"), ReceiptState::Verified);
}

/// Decision 094 for a control alone on its store: restarted, it is a new control, and it
/// recovers the `assigned` receipts its previous process held as soon as that process's row
/// is older than the expiry, without the two hours of startup recovery.
#[test]
fn a_restarted_control_recovers_the_receipts_of_its_previous_process() {
    let expiry = std::time::Duration::from_secs(10);
    let backend = Postgres::new("restart");
    let mut before = backend.open();
    let old_id = before.control_id().expect("a control id").to_owned();
    before
        .control_heartbeat("127.0.0.1:1", T0, EXPIRY)
        .expect("beat");
    let mut r = receipt("rcpt_held", None);
    r.state = ReceiptState::Verified;
    before.create_receipt(&r).expect("create");
    let moved = before.set_receipt_state(
        "dep",
        "rcpt_held",
        ReceiptState::Verified,
        ReceiptState::Assigned,
        T1,
        None,
    );
    assert_eq!(moved, Ok(true));
    drop(before);

    let mut after = backend.open();
    assert_ne!(after.control_id(), Some(old_id.as_str()));
    after
        .control_heartbeat("127.0.0.1:1", T1, EXPIRY)
        .expect("beat");
    assert_eq!(
        after.recover_dead_controls(expiry, T2),
        Ok(0),
        "the previous row is still fresh"
    );
    let mut c = backend.config().connect().expect("connect");
    c.execute(
        "UPDATE controls SET last_seen_unix_ms = last_seen_unix_ms - 60000 WHERE control_id = $1",
        &[&old_id],
    )
    .expect("age the previous row");
    assert_eq!(after.recover_dead_controls(expiry, T2), Ok(1));
    assert_eq!(state(&mut after, "rcpt_held"), ReceiptState::Verified);
}

/// Decision 095: a cancel intent is pending for every control until one marks it done, a
/// repeat renews it, and an intent older than the expiry is removed. SQLite writes none.
#[test]
fn cancel_intents_are_pending_until_carried_out_and_expire() {
    let expiry = std::time::Duration::from_secs(5);
    let backend = Postgres::new("cancel_intents");
    let (mut a, mut b) = (backend.open(), backend.open());
    assert_eq!(b.request_cancel("req_1"), Ok(true));
    assert_eq!(b.request_cancel("req_2"), Ok(true));
    let mut pending = a.pending_cancels(expiry).expect("pending");
    pending.sort();
    assert_eq!(pending, ["req_1", "req_2"]);
    assert_eq!(b.cancel_carried_out("req_1"), Ok(false));
    a.cancel_done("req_1").expect("done");
    assert_eq!(b.cancel_carried_out("req_1"), Ok(true));
    assert_eq!(b.pending_cancels(expiry), Ok(vec!["req_2".to_string()]));
    // A repeat makes it pending again.
    assert_eq!(b.request_cancel("req_1"), Ok(true));
    assert_eq!(b.cancel_carried_out("req_1"), Ok(false));

    let mut c = backend.config().connect().expect("connect");
    c.execute(
        "UPDATE cancel_intents SET created_unix_ms = created_unix_ms - 60000 \
         WHERE request_id = 'req_2'",
        &[],
    )
    .expect("age an intent");
    assert_eq!(a.pending_cancels(expiry), Ok(vec!["req_1".to_string()]));
    assert_eq!(b.cancel_carried_out("req_2"), Ok(false), "removed");

    let mut alone = Sqlite::new().open();
    assert_eq!(alone.request_cancel("req_1"), Ok(false));
    assert_eq!(alone.pending_cancels(expiry), Ok(Vec::new()));
}

/// Decision 096: a write that waited past its caller's deadline (here on a row lock another
/// session holds) answers `Busy` and never takes effect, not even once the lock is released; a
/// write queued behind it past its deadline is not run either. A write whose `COMMIT` was under
/// way when the caller gave up (here a deferred trigger makes the `COMMIT` wait on a lock)
/// answers `OutcomeUnknown`, not a retryable `Busy`: it may still take effect, and the
/// attempt's revert (decision 098) undoes it.
#[test]
fn a_write_answered_busy_never_takes_effect_later() {
    use std::time::{Duration, Instant};
    let backend = Postgres::new("deadline");
    let mut store = PostgresStore::open(&backend.config()).expect("store opens");
    store.bootstrap(DEFAULT_SNAPSHOT, T0).expect("bootstrap");
    store
        .control_heartbeat("127.0.0.1:1", T0, EXPIRY)
        .expect("beats");
    for id in ["rcpt_late", "rcpt_unknown"] {
        let mut r = receipt(id, None);
        r.state = ReceiptState::Verified;
        store.create_receipt(&r).expect("create");
    }
    // Each attempt names itself (decision 098): its token is the receipt id.
    let assign = |store: &mut PostgresStore, id: &str| store.assign_receipt("dep", id, id, T1);
    let revert = |store: &mut PostgresStore, id: &str| {
        store.release_receipt("dep", id, id, ReceiptState::Verified, T2)
    };

    let mut locker = backend.config().connect().expect("connect");
    let mut tx = locker.transaction().expect("begin");
    tx.execute(
        "SELECT 1 FROM receipts WHERE receipt_id = 'rcpt_late' FOR UPDATE",
        &[],
    )
    .expect("lock the receipt");
    tx.execute("SELECT 1 FROM config_head WHERE id = 1 FOR UPDATE", &[])
        .expect("lock the config head");
    store.set_call_timeout(Duration::from_millis(500));
    let started = Instant::now();
    assert_eq!(assign(&mut store, "rcpt_late"), Err(StoreError::Busy));
    assert!(started.elapsed() < Duration::from_secs(5));
    // Queued behind the write still waiting on the lock.
    assert_eq!(
        store
            .append_config(1, &snapshot(2), "alice", "update", T1)
            .map(|r| r.revision),
        Err(StoreError::Busy)
    );
    tx.commit().expect("release the locks");
    store.set_call_timeout(sortie_io::store::CALL_TIMEOUT);
    // The connection thread works through both jobs before this read: neither wrote.
    assert_eq!(
        store
            .receipt("dep", "rcpt_late")
            .expect("read")
            .expect("exists")
            .state,
        ReceiptState::Verified
    );
    assert_eq!(store.latest_revision(), Ok(1));
    let holder: Option<String> = locker
        .query_one(
            "SELECT holder FROM receipts WHERE receipt_id = 'rcpt_late'",
            &[],
        )
        .expect("holder")
        .get(0);
    assert_eq!(holder, None);
    assert_eq!(
        revert(&mut store, "rcpt_late"),
        Ok(false),
        "after Busy the revert finds nothing to undo"
    );

    // A `COMMIT` that waits: a deferred trigger takes an advisory lock the test holds.
    locker
        .batch_execute(
            "CREATE FUNCTION stall_commit() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NULL; END $$; \
             CREATE CONSTRAINT TRIGGER stall AFTER UPDATE ON receipts \
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION stall_commit(); \
             SELECT pg_advisory_lock(4242);",
        )
        .expect("a stalling commit");
    store.set_call_timeout(Duration::from_millis(500));
    assert_eq!(
        assign(&mut store, "rcpt_unknown"),
        Err(StoreError::OutcomeUnknown)
    );
    locker
        .batch_execute("SELECT pg_advisory_unlock(4242)")
        .expect("unlock");
    store.set_call_timeout(sortie_io::store::CALL_TIMEOUT);
    // This one did take effect once its COMMIT could finish.
    assert_eq!(
        store
            .receipt("dep", "rcpt_unknown")
            .expect("read")
            .expect("exists")
            .state,
        ReceiptState::Assigned
    );
    // The revert the control queues after an unknown outcome returns it (decision 098).
    assert_eq!(revert(&mut store, "rcpt_unknown"), Ok(true));
    assert_eq!(
        store
            .receipt("dep", "rcpt_unknown")
            .expect("read")
            .expect("exists")
            .state,
        ReceiptState::Verified
    );
}

/// The URL's own `options=` (here a `search_path`) is kept: the store's statement timeout is
/// added to it, so the schema lands where the URL says and the timeout still applies.
#[test]
fn the_urls_options_are_kept_beside_the_statement_timeout() {
    let url = pg::cluster().fresh_database("options");
    let mut admin = Postgres(url.clone()).config().connect().expect("connect");
    admin
        .batch_execute("CREATE SCHEMA gateway")
        .expect("create the schema");
    let with_path = format!("{url}?options=-c%20search_path%3Dgateway");
    let config = PostgresConfig::parse(&with_path, None).expect("URL");
    let mut store = PostgresStore::open(&config).expect("store opens");
    assert_eq!(
        store.bootstrap(DEFAULT_SNAPSHOT, T0).map(|r| r.revision),
        Ok(1)
    );
    let in_gateway: i64 = admin
        .query_one("SELECT count(*) FROM gateway.config_records", &[])
        .expect("the records are in the URL's schema")
        .get(0);
    assert_eq!(in_gateway, 1);
    let in_public: i64 = admin
        .query_one(
            "SELECT count(*) FROM information_schema.tables \
             WHERE table_schema = 'public' AND table_name = 'config_records'",
            &[],
        )
        .expect("public tables")
        .get(0);
    assert_eq!(in_public, 0);
    let mut session = config.connect().expect("connect");
    let row = session
        .query_one(
            "SELECT current_setting('search_path'), current_setting('statement_timeout')",
            &[],
        )
        .expect("settings");
    assert_eq!(row.get::<_, String>(0), "gateway");
    assert_eq!(row.get::<_, String>(1), "10s");
}

#[test]
fn an_unreachable_postgres_fails_fast_with_a_one_line_reason() {
    // A loopback port nobody listens on (the kernel just handed it out and it was closed).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let url = format!("postgres://sortie:secret-password@127.0.0.1:{port}/x");
    let config = PostgresConfig::parse(&url, None).expect("URL");
    let started = std::time::Instant::now();
    let err = PostgresStore::open(&config).expect_err("nothing listens");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let text = err.to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}/x")), "{text}");
    assert!(text.contains("cannot connect"), "{text}");
    assert!(!text.contains('\n'), "{text}");
    assert!(!text.contains("secret-password"), "{text}");
}

#[test]
fn a_postgres_store_reconnects_after_its_connection_is_killed() {
    let url = pg::cluster().fresh_database("reconnect");
    let backend = Postgres(url);
    let mut store = backend.open();
    store.bootstrap(DEFAULT_SNAPSHOT, T0).expect("bootstrap");
    // The server ends every session of this database but the killer's own, as a restart or a
    // failover does.
    let mut killer = backend.config().connect().expect("connect");
    let killed: i64 = killer
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .expect("terminate")
        .get(0);
    assert!(killed >= 1);
    // The call that meets the dead connection may fail; the store then reconnects.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match store.latest_revision() {
            Ok(revision) => {
                assert_eq!(revision, 1);
                break;
            }
            Err(e) => assert!(
                std::time::Instant::now() < deadline,
                "no reconnection within 20 s: {e}"
            ),
        }
    }
    assert_eq!(
        store
            .append_config(1, &snapshot(2), "alice", "update", T1)
            .map(|r| r.revision),
        Ok(2)
    );
}

#[test]
fn postgres_over_tls_verifies_the_server_certificate() {
    let url = pg::cluster().fresh_database("tls");
    let tls_url = format!("{url}?sslmode=require");
    let ca = pg::cluster().ca.clone();
    let config = PostgresConfig::parse(&tls_url, Some(&ca)).expect("URL");
    assert!(config.is_tls());
    let mut store = PostgresStore::open(&config).expect("opens over TLS");
    assert_eq!(
        store.bootstrap(DEFAULT_SNAPSHOT, T0).map(|r| r.revision),
        Ok(1)
    );
    let is_tls = |config: &PostgresConfig| -> bool {
        config
            .connect()
            .expect("connect")
            .query_one(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .expect("pg_stat_ssl")
            .get(0)
    };
    assert!(is_tls(&config), "the session is not encrypted");

    // Without the CA the server's certificate is not trusted: the start fails, in one line.
    let untrusted = PostgresConfig::parse(&tls_url, None).expect("URL");
    let err = PostgresStore::open(&untrusted).expect_err("an unknown issuer");
    let text = err.to_string();
    assert!(text.contains("cannot connect to PostgreSQL"), "{text}");
    assert!(text.to_lowercase().contains("certificate"), "{text}");
    assert!(!text.contains('\n'), "{text}");

    // The default (`prefer`) stays on plain TCP, as before TLS was supported.
    assert!(!is_tls(&PostgresConfig::parse(&url, None).expect("URL")));
}
