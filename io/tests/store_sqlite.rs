//! Integration tests of the SQLite record store on real database files in temporary data
//! directories: optimistic concurrency, history bound and pruning, bootstrap, worker
//! settings, reopening, schema versions and failures.

use std::path::Path;

use sortie_io::store::{
    AccessMode, ConfigRecord, RecordStore, SqliteOptions, SqliteStore, StoreError,
    BOOTSTRAP_ACTION, BOOTSTRAP_ACTOR, DATABASE_FILE_NAME, HISTORY_LIMIT, SCHEMA_VERSION,
};

const T0: &str = "2026-01-01T00:00:00Z";
const T1: &str = "2026-01-01T00:00:01Z";
const DEFAULT_SNAPSHOT: &str = r#"{"default_timeout_ms":60000}"#;

fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temporary directory")
}

fn open(dir: &Path) -> SqliteStore {
    SqliteStore::open(dir).expect("store opens")
}

fn snapshot(n: u64) -> String {
    format!(r#"{{"default_timeout_ms":{n}}}"#)
}

/// Appends `count` records on top of whatever is stored, each naming its own revision.
fn append_many(store: &mut SqliteStore, count: u64) -> u64 {
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

#[test]
fn append_checks_the_expected_revision_and_increments_it() {
    let dir = temp_dir();
    let mut store = open(dir.path());
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

#[test]
fn a_stale_or_future_expected_revision_is_a_conflict_and_writes_nothing() {
    let dir = temp_dir();
    let mut store = open(dir.path());
    append_many(&mut store, 3);
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

#[test]
fn history_is_newest_first_and_honours_the_limit() {
    let dir = temp_dir();
    let mut store = open(dir.path());
    append_many(&mut store, 5);
    let all = store.history(100).expect("history");
    assert_eq!(revisions(&all), [5, 4, 3, 2, 1]);
    for record in &all {
        assert_eq!(record.snapshot_json, snapshot(record.revision));
    }
    assert_eq!(revisions(&store.history(2).expect("history")), [5, 4]);
    assert_eq!(store.history(0), Ok(Vec::new()));
    assert_eq!(store.history(usize::MAX).expect("history").len(), 5);
}

#[test]
fn history_is_pruned_to_the_bound_and_revisions_keep_growing() {
    let dir = temp_dir();
    let mut store = open(dir.path());
    let bound = HISTORY_LIMIT as u64;
    let latest = append_many(&mut store, bound + 50);
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

#[test]
fn bootstrap_creates_revision_one_once() {
    let dir = temp_dir();
    let mut store = open(dir.path());
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

#[test]
fn worker_settings_use_optimistic_concurrency_per_worker() {
    let dir = temp_dir();
    let mut store = open(dir.path());
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

#[test]
fn all_worker_settings_are_ordered_by_id_bytes() {
    let dir = temp_dir();
    let mut store = open(dir.path());
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

#[test]
fn reopening_preserves_history_and_worker_settings() {
    let dir = temp_dir();
    let (history, workers) = {
        let mut store = open(dir.path());
        store.bootstrap(DEFAULT_SNAPSHOT, T0).expect("bootstrap");
        append_many(&mut store, 7);
        store
            .update_worker_settings("w1", 0, false, true, "alice", T1)
            .expect("worker");
        (
            store.history(HISTORY_LIMIT).expect("history"),
            store.all_worker_settings().expect("workers"),
        )
    };
    let mut store = open(dir.path());
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

#[test]
fn a_database_from_a_newer_schema_is_refused_with_a_clear_error() {
    let dir = temp_dir();
    drop(open(dir.path()));
    let newer = SCHEMA_VERSION + 1;
    {
        let conn = rusqlite::Connection::open(dir.path().join(DATABASE_FILE_NAME)).expect("open");
        conn.pragma_update(None, "user_version", newer)
            .expect("set version");
    }
    let err = SqliteStore::open(dir.path()).expect_err("newer schema refused");
    assert_eq!(
        err,
        StoreError::NewerSchema {
            found: newer,
            supported: SCHEMA_VERSION
        }
    );
    let message = err.to_string();
    assert!(message.contains(&newer.to_string()), "{message}");
    assert!(message.contains("newer"), "{message}");
    // Read-only opening refuses it too.
    let read_only = SqliteOptions {
        access: AccessMode::ReadOnly,
        ..SqliteOptions::default()
    };
    assert_eq!(
        SqliteStore::open_with(dir.path(), read_only).map(|_| ()),
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

#[test]
fn a_second_connection_sees_committed_writes_and_conflicts_across_processes_are_detected() {
    // Two stores on one file stand in for two processes sharing a data directory: the
    // immediate transaction makes check-and-insert atomic between them.
    let dir = temp_dir();
    let mut a = open(dir.path());
    let mut b = open(dir.path());
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
