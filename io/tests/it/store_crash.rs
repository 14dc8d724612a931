//! Crash safety of the record stores: a child process appends configs in a loop and is killed
//! with SIGKILL at a random moment, several times; after each kill the database must open,
//! hold every write the child saw committed, and contain only whole records with contiguous
//! revisions. On SQLite the kill lands inside the database file's writer; on PostgreSQL it cuts
//! the client mid-transaction, which the server must roll back.
//!
//! A SIGKILL shows that commits are atomic (WAL) and that a reopened database is consistent;
//! it cannot show durability against a power cut, which rests on `synchronous=FULL`.
//!
//! The child is this test binary re-executed with `CHILD_DIR_ENV` set (to a data directory or
//! a database URL), running only `crash_writer_child`; without the variable that test does
//! nothing.

use crate::store_backends;

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sortie_io::store::HISTORY_LIMIT;
use store_backends::{open_locator, Backend};

/// Names the database the child writes to (a data directory or a URL); its presence selects
/// the writer mode.
const CHILD_DIR_ENV: &str = "SORTIE_STORE_CRASH_WRITER_DIR";

/// Kill rounds per test run.
const ROUNDS: usize = 10;

/// Commits the parent waits for in each round before the random delay, so that over all
/// rounds the history outgrows its bound and pruning runs under the knife as well.
const MIN_COMMITS_PER_ROUND: u64 = (HISTORY_LIMIT as u64) / (ROUNDS as u64) + 2;

/// Longest random delay between the child's first commit and its kill.
const MAX_KILL_DELAY_MS: u64 = 40;

/// Bound on waiting for the child to start writing.
const DEADLINE: Duration = Duration::from_secs(60);

/// Size of the padding in each snapshot: large enough that a record spans several database
/// pages, so a torn write would show.
const PADDING_BYTES: usize = 12 * 1024;

const T0: &str = "2026-01-01T00:00:00Z";

/// The snapshot written for `revision`: it names its own revision and carries a padding whose
/// length and content are derived from it, so a reader can tell a whole record from a torn one.
fn snapshot_for(revision: u64) -> String {
    let fill = char::from(b'a' + (revision % 26) as u8);
    let padding: String = std::iter::repeat_n(fill, PADDING_BYTES).collect();
    format!(r#"{{"revision":{revision},"padding":"{padding}"}}"#)
}

fn check_snapshot(revision: u64, snapshot_json: &str) {
    let value: serde_json::Value = serde_json::from_str(snapshot_json)
        .unwrap_or_else(|e| panic!("revision {revision}: snapshot is not whole JSON: {e}"));
    assert_eq!(value["revision"].as_u64(), Some(revision));
    assert_eq!(snapshot_json, snapshot_for(revision), "revision {revision}");
}

/// The writer mode: appends forever, announcing each commit on stdout, until killed.
#[test]
fn crash_writer_child() {
    let Ok(locator) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let mut store = open_locator(&locator);
    let mut latest = store
        .latest_config()
        .expect("latest")
        .map_or(0, |r| r.revision);
    let mut worker_revision = store
        .worker_settings("w1")
        .expect("worker settings")
        .map_or(0, |w| w.revision);
    loop {
        let next = latest + 1;
        let record = store
            .append_config(latest, &snapshot_for(next), "writer", "update", T0)
            .expect("append");
        latest = record.revision;
        // Interleave a worker-settings write so both tables are under the knife.
        worker_revision = store
            .update_worker_settings(
                "w1",
                worker_revision,
                next.is_multiple_of(2),
                false,
                "writer",
                T0,
            )
            .expect("worker settings")
            .revision;
        // stdout is line-buffered: each line reaches the parent as soon as it is printed.
        println!("committed {latest} {worker_revision}");
    }
}

/// A random delay in `0..=max_ms` milliseconds, from the standard library's per-process random
/// hash keys (no extra dependency for one number).
fn random_delay(max_ms: u64) -> Duration {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(max_ms);
    Duration::from_millis(hasher.finish() % (max_ms + 1))
}

/// Reads the child's stdout on a helper thread and forwards each committed revision pair.
fn forward_commits(stdout: std::process::ChildStdout) -> crossbeam_channel::Receiver<(u64, u64)> {
    let (tx, rx) = crossbeam_channel::unbounded();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let mut words = line.split_whitespace();
            if words.next() != Some("committed") {
                continue;
            }
            let numbers: Option<(u64, u64)> =
                (|| Some((words.next()?.parse().ok()?, words.next()?.parse().ok()?)))();
            if let Some(pair) = numbers {
                if tx.send(pair).is_err() {
                    break;
                }
            }
        }
    });
    rx
}

/// Opens the store after a kill and checks every invariant; returns the latest revision.
fn verify_after_kill(b: &dyn Backend, last_seen: (u64, u64), previous_latest: u64) -> u64 {
    let mut store = b.open();
    let history = store.history(usize::MAX).expect("history");
    let latest = history.first().map_or(0, |r| r.revision);
    assert!(
        latest >= last_seen.0,
        "the child saw revision {} committed but the store has {latest}",
        last_seen.0
    );
    assert!(latest > previous_latest, "the round wrote something");
    assert!(history.len() <= HISTORY_LIMIT);
    assert_eq!(
        history.len() as u64,
        latest.min(HISTORY_LIMIT as u64),
        "the newest records are all kept"
    );
    for pair in history.windows(2) {
        assert_eq!(
            pair[0].revision,
            pair[1].revision + 1,
            "revisions contiguous"
        );
    }
    for record in &history {
        check_snapshot(record.revision, &record.snapshot_json);
        assert_eq!(record.actor, "writer");
    }
    let worker = store
        .worker_settings("w1")
        .expect("worker settings")
        .expect("written at least once");
    assert!(worker.revision >= last_seen.1);
    drop(store);
    b.check_integrity();
    latest
}

on_both_backends!(sigkill_mid_write_leaves_whole_contiguous_records);

fn sigkill_mid_write_leaves_whole_contiguous_records(b: &dyn Backend) {
    let exe = std::env::current_exe().expect("test binary path");
    let mut latest = 0;
    for round in 0..ROUNDS {
        let mut child = Command::new(&exe)
            .args([
                "store_crash::crash_writer_child",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR_ENV, b.locator())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the writer");
        let commits = forward_commits(child.stdout.take().expect("piped stdout"));
        let started = Instant::now();
        let mut last_seen = (0, 0);
        while last_seen.0 < latest + MIN_COMMITS_PER_ROUND {
            let left = DEADLINE.saturating_sub(started.elapsed());
            last_seen = commits
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("round {round}: the writer stalled at {last_seen:?}"));
        }
        // The sleep is the experiment, not synchronisation: the child is committing in a loop,
        // and a random delay lands the kill at a random point of a later write.
        std::thread::sleep(random_delay(MAX_KILL_DELAY_MS));
        child.kill().expect("SIGKILL the writer");
        let status = child.wait().expect("reap the writer");
        assert!(!status.success(), "round {round}: the writer was killed");
        // Everything the child printed before dying was committed before it printed it.
        while let Ok(pair) = commits.recv_timeout(DEADLINE.saturating_sub(started.elapsed())) {
            last_seen = pair;
        }
        latest = verify_after_kill(b, last_seen, latest);
    }
    assert!(
        latest > HISTORY_LIMIT as u64,
        "the rounds wrote past the history bound, so pruning ran"
    );
}
