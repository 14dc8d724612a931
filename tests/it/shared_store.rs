//! Several controls on one PostgreSQL record store (decisions 091–093), black-box: real
//! `sortie serve` and `sortie control` processes on loopback sharing a real PostgreSQL server
//! the tests start (a private cluster, a database per test) and, for receipts, a real
//! S3-compatible server. A revision committed on one control becomes active on the other; the
//! admin API answers from the store on either; a receipt created on one is read and used on the
//! other with a worker URL signed by the first; a sticky session lands on the same remote
//! worker through either control; a control that stops or dies gives back the receipts it
//! held, and an assignment whose outcome was unknown is reverted; an outage of the database
//! leaves the request path serving the last applied snapshot; a bad store setting stops the
//! start with one line.

use crate::support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use support::bus::{control, request_at, spawn_worker, start_worker, wait_worker, WORKER_TOKEN};
use support::gateway::{
    admin, admin_items, http, temp_dir, unb64, wait_until, worker_item, Gateway, GatewayBuilder,
    Resp, DEPLOYMENT_TOKEN, LOOPBACK_SNAPSHOT,
};
use support::postgres::cluster;
use support::receipts::{
    complete, create_request_receipt, put_part, receipt_state, receipts_call, sha256_hex,
};
use support::s3::S3Server;
use support::upstream::{self, Request, Step, Upstream};

/// The variable the test controls read their PostgreSQL URL from.
const URL_ENV: &str = "SORTIE_TEST_STORE_URL";
/// The variable holding the receipt signing key both controls share.
const KEY_ENV: &str = "SORTIE_TEST_SIGNING_KEY";
/// How long a revision committed on one control may take to be active on the other: the
/// notification normally brings it at once; the poll interval (2 s) bounds a lost one.
const FOLLOW_DEADLINE: Duration = Duration::from_secs(10);

/// A control builder on the shared database `url`.
fn on_store(b: GatewayBuilder, url: &str) -> GatewayBuilder {
    on_store_with(b, url, "")
}

/// [`on_store`] with more `[store]` keys.
fn on_store_with(b: GatewayBuilder, url: &str, store_keys: &str) -> GatewayBuilder {
    b.section(&format!(
        "[store]\nbackend = \"postgres\"\nurl_env = \"{URL_ENV}\"\n{store_keys}"
    ))
    .env(URL_ENV, url)
}

fn etag(r: &Resp) -> String {
    r.header("ETag")
        .expect("ETag")
        .trim_matches('"')
        .to_string()
}

/// The revision a control has active: its rollouts answer.
fn active_revision(gw: &Gateway) -> u64 {
    let r = admin(gw, "GET", "/api/v1/admin/rollouts", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["config_version"].as_u64().expect("config_version")
}

fn put_config(gw: &Gateway, if_match: &str, snapshot: &str) -> Resp {
    admin(
        gw,
        "PUT",
        "/api/v1/admin/config",
        &[
            ("If-Match", if_match),
            ("Content-Type", "application/json"),
            ("X-Service-Actor", "ops"),
        ],
        snapshot.as_bytes(),
    )
}

/// The error code a request to a closed loopback port gets: `destination_denied` once the
/// snapshot denies loopback, a connection failure while it allows it.
fn loopback_code(gw: &Gateway) -> String {
    let r = request_at(
        gw.api,
        &json!({"method": "GET", "url": "http://127.0.0.1:9/", "timeout_ms": 5000}),
    );
    r.json()["code"].as_str().unwrap_or_default().to_string()
}

/// The loopback snapshot with loopback denied again (no destination allowed).
fn closed_snapshot() -> String {
    LOOPBACK_SNAPSHOT.replace(r#""allow":["127.0.0.0/8","::1/128"]"#, r#""allow":[]"#)
}

#[test]
fn an_activation_on_one_control_reaches_the_other() {
    let url = cluster().fresh_database("activation");
    let a = on_store(Gateway::builder(), &url).start();
    let b = on_store(Gateway::builder(), &url).start();

    // One bootstrap record, seen by both.
    for gw in [&a, &b] {
        let r = admin(gw, "GET", "/api/v1/admin/config", &[], b"");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(etag(&r), "1");
        assert_eq!(r.json()["revision"], 1);
        assert_eq!(active_revision(gw), 1);
    }
    assert_ne!(loopback_code(&b), "destination_denied");

    // A commits revision 2; B applies it on its cores, not only in its answers.
    let put = put_config(&a, "\"1\"", &closed_snapshot());
    assert_eq!(put.status, 200, "{}", put.text());
    assert_eq!(etag(&put), "2");
    wait_until(FOLLOW_DEADLINE, "B to activate revision 2", || {
        active_revision(&b) == 2
    });
    assert_eq!(loopback_code(&b), "destination_denied");

    // GET config and history answer from the store on either control.
    let on_b = admin(&b, "GET", "/api/v1/admin/config", &[], b"");
    assert_eq!(etag(&on_b), "2");
    assert_eq!(on_b.json()["actor"], "ops");
    assert_eq!(
        on_b.json()["snapshot"],
        put_config_snapshot(&a),
        "the same snapshot"
    );
    let history = |gw: &Gateway| -> Vec<u64> {
        admin_items(gw, "/api/v1/admin/config/history")
            .iter()
            .map(|r| r["revision"].as_u64().expect("revision"))
            .collect()
    };
    assert_eq!(history(&a), [2, 1]);
    assert_eq!(history(&b), [2, 1]);

    // B's stale write loses exactly as a local one would.
    let stale = put_config(&b, "\"1\"", LOOPBACK_SNAPSHOT);
    assert_eq!(stale.status, 409, "{}", stale.text());
    assert_eq!(stale.json()["error"], "revision_conflict");

    // B rolls back to revision 1 (as revision 3); A follows.
    let rollback = admin(
        &b,
        "POST",
        "/api/v1/admin/config/rollback",
        &[
            ("If-Match", "2"),
            ("Content-Type", "application/json"),
            ("X-Service-Actor", "ops"),
        ],
        br#"{"config_version":1}"#,
    );
    assert_eq!(rollback.status, 200, "{}", rollback.text());
    assert_eq!(etag(&rollback), "3");
    wait_until(FOLLOW_DEADLINE, "A to activate revision 3", || {
        active_revision(&a) == 3
    });
    assert_ne!(loopback_code(&a), "destination_denied");

    // Worker settings: B drains the local worker. An action on A judges If-Match against the
    // store at once (A's follower may not have run yet): "0" is stale, "1" is current.
    let drain = admin(
        &b,
        "POST",
        "/api/v1/admin/workers/local/drain",
        &[("If-Match", "0"), ("X-Service-Actor", "ops")],
        b"",
    );
    assert_eq!(drain.status, 200, "{}", drain.text());
    let stale = admin(
        &a,
        "POST",
        "/api/v1/admin/workers/local/undrain",
        &[("If-Match", "0"), ("X-Service-Actor", "ops")],
        b"",
    );
    assert_eq!(stale.status, 409, "{}", stale.text());
    let disable = admin(
        &a,
        "POST",
        "/api/v1/admin/workers/local/disable",
        &[("If-Match", "1"), ("X-Service-Actor", "ops")],
        b"",
    );
    assert_eq!(disable.status, 200, "{}", disable.text());
    assert_eq!(etag(&disable), "2");
    // Both flags reach B by the follower: drained here, disabled there.
    wait_until(FOLLOW_DEADLINE, "B to see the worker disabled", || {
        let w = worker_item(&admin_items(&b, "/api/v1/admin/workers"), "local").clone();
        w["enabled"] == false && w["draining"] == true
    });
    let on_a = worker_item(&admin_items(&a, "/api/v1/admin/workers"), "local").clone();
    assert_eq!(
        (on_a["enabled"].clone(), on_a["draining"].clone()),
        (json!(false), json!(true))
    );
}

/// The snapshot of the config record a control answers.
/// The receipt signing key the controls of a test share.
fn shared_key() -> String {
    (0..32u8).map(|i| format!("{:02x}", i * 7 + 3)).collect()
}

/// A control builder on the shared database `url` with receipts in the shared bucket `s3`,
/// signed with the shared `key`.
fn with_receipts(b: GatewayBuilder, url: &str, s3: &S3Server, key: &str) -> GatewayBuilder {
    with_receipts_and(b, url, s3, key, "")
}

/// [`with_receipts`] with more `[store]` keys.
fn with_receipts_and(
    b: GatewayBuilder,
    url: &str,
    s3: &S3Server,
    key: &str,
    store_keys: &str,
) -> GatewayBuilder {
    on_store_with(b, url, store_keys)
        .section(&s3.section(&format!("signing_key_env = \"{KEY_ENV}\"\n")))
        .env("TEST_S3_AK", "AKTEST")
        .env("TEST_S3_SK", "SKTEST")
        .env(KEY_ENV, key)
}

fn put_config_snapshot(gw: &Gateway) -> serde_json::Value {
    admin(gw, "GET", "/api/v1/admin/config", &[], b"").json()["snapshot"].clone()
}

/// A receipt created, uploaded and completed on control A is read on control B; a request on
/// A sends it through a remote worker attached to A, whose signed URL (signed by A) points at
/// B's API (`control.bus.api_base_url`): B verifies A's signature with the shared key and
/// streams the payload from the shared bucket. The receipt is then consumed for both.
#[test]
fn a_receipt_created_on_one_control_is_read_and_used_on_the_other() {
    let url = cluster().fresh_database("receipts");
    let s3 = S3Server::start();
    let key = shared_key();
    let shared = |b: GatewayBuilder| with_receipts(b, &url, &s3, &key);
    let b = shared(Gateway::builder()).start();
    let a = shared(
        Gateway::builder()
            .control_mode()
            .control("bus_listen = \"127.0.0.1:0\"")
            .section(&format!(
                "[control.bus]\ntoken = \"{WORKER_TOKEN}\"\nplaintext = true\nheartbeat_ms = 500\n\
                 api_base_url = \"http://{}\"\n",
                b.api
            )),
    )
    .start();
    let _worker = start_worker("wa", a.bus.expect("bus listener"), None, "");
    wait_worker(&a, "wa", "connected");

    let body = upstream::pattern(300 * 1024 + 11);
    let id = create_request_receipt(&a, &body);
    // Parts may go to either control: the parts table and the bucket are shared.
    let half = body.len() / 2;
    put_part(&a, &id, 1, &body[..half]);
    put_part(&b, &id, 2, &body[half..]);
    complete(&a, &id);

    // Read on B: the same receipt, verified, both parts.
    let on_b = receipts_call(&b, "GET", &format!("/api/v1/receipts/{id}"), b"");
    assert_eq!(on_b.status, 200, "{}", on_b.text());
    let v = on_b.json();
    assert_eq!(v["state"], "verified", "{v}");
    assert_eq!(v["sha256_hex"], sha256_hex(&body));
    assert_eq!(v["parts"].as_array().map(Vec::len), Some(2), "{v}");

    // Used through A's worker, fetched from B with A's signature.
    let echo = Upstream::start(upstream::echo());
    let r = request_at(
        a.api,
        &json!({"method": "POST", "url": echo.url("/shared"),
                "body": {"mode": "receipt", "receipt_id": id}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["status"], 200, "{v}");
    let echoed = unb64(&v["body"]["data_base64"]);
    let end = echoed
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("echoed head")
        + 4;
    assert!(echoed[end..] == body[..], "the receipt body differs");
    assert_eq!(receipt_state(&b, &id), "consumed");
    assert_eq!(receipt_state(&a, &id), "consumed");
    for line in a.stdout.try_iter().chain(b.stdout.try_iter()) {
        assert!(
            !line.contains("signature="),
            "a signed URL was printed: {line}"
        );
        assert!(!line.contains(&key), "the signing key was printed: {line}");
    }
}

/// An admin cancel sent to control B ends a request control A runs (decision 095): B writes a
/// cancel intent, A carries it out, and B answers 204 (and 204 again on a repeat). Each control
/// lists only the requests it runs; a request id no control runs is 404 on B.
#[test]
fn a_cancel_sent_to_one_control_ends_a_request_the_other_runs() {
    let url = cluster().fresh_database("cancel");
    let a = on_store(Gateway::builder(), &url).start();
    let b = on_store(Gateway::builder(), &url).start();
    let stall = Upstream::start(upstream::slow_head(Duration::from_secs(120)));
    let (api, target) = (a.api, stall.url("/stall"));
    let caller = std::thread::spawn(move || {
        request_at(
            api,
            &json!({"method": "GET", "url": target, "timeout_ms": 60_000}),
        )
    });
    const REQUESTS: &str = "/api/v1/admin/requests";
    wait_until(Duration::from_secs(20), "A to list the request", || {
        admin_items(&a, REQUESTS).len() == 1
    });
    let id = admin_items(&a, REQUESTS)[0]["request_id"]
        .as_str()
        .expect("request_id")
        .to_string();
    assert!(
        admin_items(&b, REQUESTS).is_empty(),
        "B lists only the requests it runs"
    );

    let path = format!("{REQUESTS}/{id}");
    let sent = Instant::now();
    let r = admin(&b, "DELETE", &path, &[], b"");
    assert_eq!(r.status, 204, "{}", r.text());
    assert!(r.body.is_empty());
    let answer = caller.join().expect("caller thread");
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "{:?}",
        sent.elapsed()
    );
    assert_eq!(answer.status, 499, "{}", answer.text());
    let v = answer.json();
    assert_eq!(v["code"], "cancelled", "{v}");
    assert_eq!(v["request_id"], id.as_str());
    assert!(admin_items(&a, REQUESTS).is_empty());

    // Spec, Admin rule 4: repeating the cancellation is safe.
    let r = admin(&b, "DELETE", &path, &[], b"");
    assert_eq!(r.status, 204, "{}", r.text());
    // A request no control runs.
    let r = admin(&b, "DELETE", &format!("{REQUESTS}/req_nobody"), &[], b"");
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.json()["error"], "request_not_found", "{}", r.text());
}

/// Sticky sessions agree across controls (decision 097): two `sortie control` processes on
/// one store and three remote workers dialling both. Each control pins sessions in its own
/// memory, yet every session lands on the same worker through either control, whichever order
/// the sessions arrive in; when a session's worker stops, both controls move it to the same
/// next worker.
#[test]
fn a_sticky_session_lands_on_the_same_worker_through_either_control() {
    let url = cluster().fresh_database("sticky");
    let sticky = LOOPBACK_SNAPSHOT.replace(
        r#""sticky_session_ttl_seconds":0"#,
        r#""sticky_session_ttl_seconds":600"#,
    );
    assert_ne!(sticky, LOOPBACK_SNAPSHOT);
    let start = || {
        on_store(control("127.0.0.1:0", None), &url)
            .snapshot(Some(&sticky))
            .start()
    };
    let (a, b) = (start(), start());
    // Each worker's source address tells which one sent a request.
    let ids = ["w1", "w2", "w3"];
    let mut workers: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let config = temp_dir("sticky-worker").join("worker.toml");
            std::fs::write(
                &config,
                format!(
                    "[worker]\nid = \"{id}\"\ncontrols = [\"{}\", \"{}\"]\ntoken = \"{WORKER_TOKEN}\"\n\
                     plaintext = true\ncores = 1\nbind_address = \"127.0.0.{}\"\n",
                    a.bus.expect("bus of a"),
                    b.bus.expect("bus of b"),
                    i + 2
                ),
            )
            .expect("worker config");
            spawn_worker(id, config)
        })
        .collect();
    for id in ids {
        wait_worker(&a, id, "connected");
        wait_worker(&b, id, "connected");
    }
    let up = Upstream::start(std::sync::Arc::new(|r: &Request| {
        vec![Step::Write(upstream::response(
            200,
            &[],
            r.peer.ip().to_string().as_bytes(),
        ))]
    }));
    let sent_by = |gw: &Gateway, session: &str| -> String {
        let r = request_at(
            gw.api,
            &json!({"method": "GET", "url": up.url("/sticky"),
                    "routing": {"sticky_session_id": session}}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        String::from_utf8(unb64(&r.json()["body"]["data_base64"])).expect("address")
    };
    let sessions: Vec<String> = (0..12).map(|i| format!("cart-{i}")).collect();
    // A in order, B in reverse: per-control choices by load and request count would differ.
    let on_a: Vec<String> = sessions.iter().map(|s| sent_by(&a, s)).collect();
    let mut on_b: Vec<String> = sessions.iter().rev().map(|s| sent_by(&b, s)).collect();
    on_b.reverse();
    assert_eq!(
        on_a, on_b,
        "the same worker per session through either control"
    );
    let used: std::collections::BTreeSet<&String> = on_a.iter().collect();
    assert!(used.len() >= 2, "12 sessions all on one worker: {on_a:?}");
    // Pinned: the same again through both.
    for (s, at) in sessions.iter().zip(&on_a) {
        assert_eq!(&sent_by(&b, s), at);
        assert_eq!(&sent_by(&a, s), at);
    }

    // The worker of the first session stops: both controls move its sessions to the same next
    // worker, and leave the others where they were.
    let gone = on_a[0].clone();
    let index = (2..5)
        .position(|i| format!("127.0.0.{i}") == gone)
        .expect("a worker address");
    workers[index].kill9();
    for gw in [&a, &b] {
        wait_worker(gw, ids[index], "disconnected");
    }
    let after_a: Vec<String> = sessions.iter().map(|s| sent_by(&a, s)).collect();
    let mut after_b: Vec<String> = sessions.iter().rev().map(|s| sent_by(&b, s)).collect();
    after_b.reverse();
    assert_eq!(after_a, after_b, "the same fallback through either control");
    for ((s, before), after) in sessions.iter().zip(&on_a).zip(&after_a) {
        assert_ne!(after, &gone, "{s}");
        if before != &gone {
            assert_eq!(after, before, "{s} moved although its worker stayed");
        }
    }
}

/// Sends a request to `on` whose body is receipt `id` and whose destination `stall` never
/// answers, and waits until `other` sees the receipt assigned. The connection is returned so
/// that the request stays open.
fn hold_receipt(on: &Gateway, other: &Gateway, id: &str, stall: &Upstream) -> std::net::TcpStream {
    let envelope = json!({"method": "POST", "url": stall.url("/stall"), "timeout_ms": 60_000,
                          "body": {"mode": "receipt", "receipt_id": id}})
    .to_string();
    let mut held = std::net::TcpStream::connect(on.api).expect("connect");
    std::io::Write::write_all(
        &mut held,
        format!(
            "POST /api/v1/requests HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{envelope}",
            support::gateway::DEPLOYMENT_TOKEN,
            envelope.len()
        )
        .as_bytes(),
    )
    .expect("send the request");
    wait_until(
        Duration::from_secs(20),
        "the receipt to be assigned",
        || receipt_state(other, id) == "assigned",
    );
    held
}

/// A control stopped with SIGTERM removes its heartbeat row as it exits (decision 098), and a
/// receipt a request still held when the shutdown deadline cut it off is `verified` again the
/// moment the control is gone, not once its row would have expired. What it waits for: the
/// request (its upstream stalls for 120 s) runs through the 10 s shutdown grace, the core cuts
/// it off at the grace and stops, and the control, whose wait for its cores lasts the grace
/// plus a margin, leaves: the exit comes after the grace and before grace plus margin.
#[test]
fn a_control_stopped_gracefully_removes_its_row_and_returns_what_it_held() {
    let url = cluster().fresh_database("leave");
    let s3 = S3Server::start();
    let key = shared_key();
    let b = with_receipts(Gateway::builder(), &url, &s3, &key).start();
    let mut a = with_receipts(Gateway::builder(), &url, &s3, &key).start();
    let mut db = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    assert_eq!(db_i64(&mut db, "SELECT count(*) FROM controls", &[]), 2);

    let body = upstream::pattern(1000);
    let id = create_request_receipt(&a, &body);
    put_part(&a, &id, 1, &body);
    complete(&a, &id);
    let stall = Upstream::start(upstream::slow_head(Duration::from_secs(120)));
    let held = hold_receipt(&a, &b, &id, &stall);

    let stopping = Instant::now();
    let status = a.terminate();
    let took = stopping.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(15),
        "exited after {took:?}: the request was to run through the 10 s grace, no longer"
    );
    assert_eq!(
        db_i64(&mut db, "SELECT count(*) FROM controls", &[]),
        1,
        "only B's row is left"
    );
    assert_eq!(receipt_state(&b, &id), "verified");
    drop(held);
}

/// An assignment whose `COMMIT` outlasts the store call (15 s) answers the request with
/// `control_internal_error` and may still commit; the control then reverts it, and the revert
/// applies because this attempt's assignment is the one recorded (decision 098). The database
/// stalls the `COMMIT` with a deferred trigger waiting on a lock the test holds, and logs each
/// receipt change that commits.
#[test]
fn an_assignment_whose_outcome_is_unknown_is_reverted() {
    let url = cluster().fresh_database("unknown");
    let s3 = S3Server::start();
    let gw = with_receipts(Gateway::builder(), &url, &s3, &shared_key()).start();
    let body = upstream::pattern(1000);
    let id = create_request_receipt(&gw, &body);
    put_part(&gw, &id, 1, &body);
    complete(&gw, &id);

    let mut db = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    db.batch_execute(
        "CREATE TABLE committed (state TEXT NOT NULL, at TIMESTAMPTZ DEFAULT clock_timestamp()); \
         CREATE FUNCTION stall_commit() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_advisory_xact_lock(4242); \
         INSERT INTO committed (state) VALUES (NEW.state); RETURN NULL; END $$; \
         CREATE CONSTRAINT TRIGGER stall AFTER UPDATE ON receipts \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION stall_commit(); \
         SELECT pg_advisory_lock(4242);",
    )
    .expect("a stalling commit");
    let echo = Upstream::start(upstream::echo());
    let send = || {
        request_at(
            gw.api,
            &json!({"method": "POST", "url": echo.url("/unknown"),
                    "body": {"mode": "receipt", "receipt_id": id}}),
        )
    };
    let r = send();
    assert_eq!(r.status, 500, "{}", r.text());
    assert_eq!(r.json()["code"], "control_internal_error", "{}", r.text());
    db.batch_execute("SELECT pg_advisory_unlock(4242)")
        .expect("unlock");

    // The assignment commits once the lock is free, then the revert does.
    let committed = |db: &mut postgres::Client| -> Vec<String> {
        db.query("SELECT state FROM committed ORDER BY at", &[])
            .expect("log")
            .iter()
            .map(|row| row.get(0))
            .collect()
    };
    wait_until(
        Duration::from_secs(30),
        "the assignment to be reverted",
        || committed(&mut db).len() >= 2,
    );
    assert_eq!(committed(&mut db), ["assigned", "verified"]);
    db.batch_execute("DROP TRIGGER stall ON receipts")
        .expect("drop the trigger");
    assert_eq!(receipt_state(&gw, &id), "verified");
    // Usable again.
    let r = send();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(receipt_state(&gw, &id), "consumed");
}

/// One number from the test database.
fn db_i64(
    db: &mut postgres::Client,
    sql: &str,
    params: &[&(dyn postgres::types::ToSql + Sync)],
) -> i64 {
    db.query_one(sql, params).expect(sql).get(0)
}

/// A control killed (SIGKILL) while a request holds a receipt leaves it `assigned`. While that
/// control lives and refreshes its heartbeat row, the other control leaves its receipt alone
/// for longer than the expiry; once it is killed, the other sees its row expire and puts the
/// receipt back to `verified` within the expiry (not the two hours of startup recovery), and
/// the receipt is usable again. The killed control's own settings (`store.heartbeat_ms`,
/// `store.control_expiry_ms`: 2 s where the other keeps the default 10 s) decide when
/// (decision 099).
#[test]
fn the_receipts_of_a_killed_control_are_recovered_by_the_other() {
    const EXPIRY_MS: i64 = 2_000;
    let (url, _s3, b, a) = pair_with_a_fast_expiring("heartbeat", EXPIRY_MS);
    let mut db = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    assert_eq!(db_i64(&mut db, "SELECT count(*) FROM controls", &[]), 2);

    let body = upstream::pattern(64 * 1024 + 5);
    let id = create_request_receipt(&a, &body);
    put_part(&a, &id, 1, &body);
    complete(&a, &id);

    // A request on A holds the receipt while its destination stalls; the connection stays
    // open until A is killed.
    let stall = Upstream::start(upstream::slow_head(Duration::from_secs(120)));
    let held = hold_receipt(&a, &b, &id, &stall);
    let holder: Option<String> = db
        .query_one("SELECT holder FROM receipts WHERE receipt_id = $1", &[&id])
        .expect("holder")
        .get(0);
    let holder = holder.expect("an assigned receipt names its control");
    let beat = |db: &mut postgres::Client| {
        db_i64(
            db,
            "SELECT last_seen_unix_ms FROM controls WHERE control_id = $1",
            &[&holder],
        )
    };
    let first = beat(&mut db);

    // Both controls beat past one expiry (B ran its recovery all along): A's receipt stays.
    wait_until(
        Duration::from_secs(30),
        "both controls to beat for longer than the expiry",
        || {
            db_i64(&mut db, "SELECT min(last_seen_unix_ms) FROM controls", &[])
                > first + EXPIRY_MS + 1_000
        },
    );
    assert_eq!(receipt_state(&b, &id), "assigned");

    drop(a);
    let killed = Instant::now();
    wait_until(Duration::from_secs(30), "B to recover A's receipt", || {
        receipt_state(&b, &id) == "verified"
    });
    let took = killed.elapsed();
    // Recovered through the expiry A's row records: not before it could expire (its last beat
    // was at most 200 ms before the kill), and promptly after, well before B's own 10 s.
    assert!(
        took >= Duration::from_millis(1_700),
        "recovered after {took:?}"
    );
    assert!(took <= Duration::from_secs(8), "recovered after {took:?}");
    assert_eq!(
        db_i64(
            &mut db,
            "SELECT count(*) FROM controls WHERE control_id = $1",
            &[&holder]
        ),
        0,
        "the dead control's row is removed"
    );
    drop(held);

    // The recovered receipt is sent by B.
    let echo = Upstream::start(upstream::echo());
    let r = request_at(
        b.api,
        &json!({"method": "POST", "url": echo.url("/again"),
                "body": {"mode": "receipt", "receipt_id": id}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["status"], 200, "{}", r.text());
    assert_eq!(receipt_state(&b, &id), "consumed");
}

/// While the database refuses this control, requests keep being served on the last applied
/// snapshot, admin reads fail with a store diagnostic and readiness reports it; once the
/// database is back, a revision committed meanwhile by another control is applied.
#[test]
fn an_unreachable_store_leaves_the_request_path_serving_the_last_snapshot() {
    let url = cluster().fresh_database("outage");
    let db = url.rsplit('/').next().expect("database name").to_string();
    let gw = on_store(Gateway::builder(), &url).start();
    let echo = Upstream::start(upstream::echo());
    let ok = |gw: &Gateway| {
        request_at(gw.api, &json!({"method": "GET", "url": echo.url("/up")})).status == 200
    };
    assert!(ok(&gw));

    let mut admin_db = cluster().admin();
    let cut = |admin_db: &mut postgres::Client, allow: bool| {
        admin_db
            .batch_execute(&format!(
                "ALTER DATABASE {db} WITH ALLOW_CONNECTIONS {allow}"
            ))
            .expect("alter database");
        if !allow {
            admin_db
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
                    &[&db],
                )
                .expect("terminate sessions");
        }
    };
    cut(&mut admin_db, false);
    wait_until(
        Duration::from_secs(20),
        "readiness to report the store",
        || admin(&gw, "GET", "/readyz", &[], b"").status == 503,
    );
    let r = admin(&gw, "GET", "/api/v1/admin/config", &[], b"");
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(r.text().contains("store"), "{}", r.text());
    assert!(!r.text().contains(URL_ENV), "{}", r.text());
    for _ in 0..20 {
        assert!(ok(&gw), "the request path stopped during the outage");
    }

    // Meanwhile another writer commits revision 2, without a notification.
    cut(&mut admin_db, true);
    write_revision(&url, 2, &closed_snapshot(), false);
    // No notification was sent: the periodic check brings it.
    wait_until(FOLLOW_DEADLINE, "the control to catch up", || {
        admin(&gw, "GET", "/readyz", &[], b"").status == 200 && active_revision(&gw) == 2
    });
    assert_eq!(loopback_code(&gw), "destination_denied");
}

/// Commits revision `revision` (the head must be at `revision - 1`) as another control would,
/// with its notification or, to exercise the periodic check, without.
fn write_revision(url: &str, revision: i64, snapshot: &str, notify: bool) {
    let mut other = postgres::Client::connect(url, postgres::NoTls).expect("connect");
    let mut tx = other.transaction().expect("begin");
    let moved = tx
        .execute(
            "UPDATE config_head SET revision = $1 WHERE id = 1 AND revision = $2",
            &[&revision, &(revision - 1)],
        )
        .expect("move head");
    assert_eq!(moved, 1, "the head is not at {}", revision - 1);
    tx.execute(
        "INSERT INTO config_records (revision, snapshot, actor, action, created_at) \
         VALUES ($1, $2, 'ops', 'update', '2026-01-01T00:00:00.000Z')",
        &[&revision, &snapshot],
    )
    .expect("insert");
    if notify {
        tx.execute(
            "SELECT pg_notify('sortie_config', $1)",
            &[&revision.to_string()],
        )
        .expect("notify");
    }
    tx.commit().expect("commit");
}

/// A revision this build does not accept (as a newer control's could be) is not applied: the
/// control keeps its snapshot, and applies the next valid revision.
#[test]
fn a_revision_that_does_not_validate_here_is_skipped() {
    let url = cluster().fresh_database("invalid");
    let gw = on_store(Gateway::builder(), &url).start();
    write_revision(
        &url,
        2,
        r#"{"default_timeout_ms":60000,"from_the_future":true}"#,
        true,
    );
    // The store answers it; the control keeps serving revision 1.
    wait_until(FOLLOW_DEADLINE, "the store to answer revision 2", || {
        etag(&admin(&gw, "GET", "/api/v1/admin/config", &[], b"")) == "2"
    });
    wait_until(FOLLOW_DEADLINE, "the follower to log the refusal", || {
        gw.stdout
            .try_iter()
            .any(|l| l.contains("does not validate here"))
    });
    assert_eq!(active_revision(&gw), 1);
    assert_ne!(loopback_code(&gw), "destination_denied");
    write_revision(&url, 3, &closed_snapshot(), true);
    wait_until(FOLLOW_DEADLINE, "revision 3 to be active", || {
        active_revision(&gw) == 3
    });
    assert_eq!(loopback_code(&gw), "destination_denied");
}

/// Runs `sortie serve` on a config with a PostgreSQL store and returns its exit code and
/// stderr, failing if it does not exit within 20 s.
fn failed_start(dir: &Path, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let config = dir.join("sortie.toml");
    std::fs::write(
        &config,
        format!(
            "[control]\napi_listen = \"127.0.0.1:0\"\ndata_dir = {:?}\n\n[store]\n\
             backend = \"postgres\"\nurl_env = \"{URL_ENV}\"\n",
            dir.join("data").display().to_string()
        ),
    )
    .expect("config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sortie"))
        .args(["serve", "--config"])
        .arg(&config)
        .env_remove(URL_ENV)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sortie");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Ok(Some(s)) = child.try_wait() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("sortie did not exit on a bad store");
        }
        std::thread::park_timeout(Duration::from_millis(20));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read as _;
        let _ = e.read_to_string(&mut err);
    }
    (status.code(), err)
}

#[test]
fn a_missing_url_or_an_unreachable_server_stops_the_start_with_one_line() {
    let dir = temp_dir("pgstart");
    let (code, err) = failed_start(&dir, &[]);
    // The file itself is valid: the variable is read at start, not by check-config.
    let checked = Command::new(env!("CARGO_BIN_EXE_sortie"))
        .arg("check-config")
        .arg(dir.join("sortie.toml"))
        .output()
        .expect("run check-config");
    let said = String::from_utf8_lossy(&checked.stdout);
    assert!(
        checked.status.success() && said.contains("store postgres"),
        "{said}"
    );
    assert_eq!(code, Some(1), "{err}");
    let line = err.lines().last().unwrap_or_default();
    assert!(line.starts_with("sortie: store:"), "{err}");
    assert!(line.contains(URL_ENV) && line.contains("not set"), "{err}");

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let url = format!("postgres://sortie:pg-secret-word@127.0.0.1:{port}/sortie");
    let started = Instant::now();
    let (code, err) = failed_start(&dir, &[(URL_ENV, &url)]);
    assert_eq!(code, Some(1), "{err}");
    assert!(started.elapsed() < Duration::from_secs(15), "not fast");
    let line = err.lines().last().unwrap_or_default();
    assert!(
        line.contains(&format!(
            "cannot connect to PostgreSQL at 127.0.0.1:{port}/sortie"
        )),
        "{err}"
    );
    assert!(
        !err.contains("pg-secret-word"),
        "the password was printed: {err}"
    );
}

/// A part committed between the parts `complete` reads and its change to `verifying` (here
/// part 2, written by a transaction that holds the receipt's row as a part write does, so
/// `complete` reads the parts without it and then waits) is composed: `complete` reads the
/// parts again once none can be added, and the receipt is verified with both.
#[test]
fn a_part_committed_while_complete_waits_is_composed() {
    let url = cluster().fresh_database("complete_race");
    let s3 = S3Server::start();
    let key = shared_key();
    let a = with_receipts(Gateway::builder(), &url, &s3, &key).start();
    let body = upstream::pattern(200 * 1024 + 5);
    let id = create_request_receipt(&a, &body);
    let half = body.len() / 2;
    put_part(&a, &id, 1, &body[..half]);
    put_part(&a, &id, 2, &body[half..]);

    // Part 2's row leaves the table (its object stays in the bucket) ...
    let mut db = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    let row = db
        .query_one(
            "SELECT size_bytes, sha256_hex, object_key FROM receipt_parts \
             WHERE receipt_id = $1 AND number = 2",
            &[&id],
        )
        .expect("part 2");
    let (size, sha, object): (i64, String, String) = (row.get(0), row.get(1), row.get(2));
    db.execute(
        "DELETE FROM receipt_parts WHERE receipt_id = $1 AND number = 2",
        &[&id],
    )
    .expect("remove part 2");
    // ... and comes back in a transaction holding the receipt's row.
    let mut tx = db.transaction().expect("begin");
    tx.execute(
        "SELECT 1 FROM receipts WHERE receipt_id = $1 FOR UPDATE",
        &[&id],
    )
    .expect("lock the receipt");
    tx.execute(
        "INSERT INTO receipt_parts (receipt_id, number, size_bytes, sha256_hex, object_key) \
         VALUES ($1, 2, $2, $3, $4)",
        &[&id, &size, &sha, &object],
    )
    .expect("part 2 again");

    let api = a.api;
    let path = format!("/api/v1/receipts/{id}/complete");
    let completing = std::thread::spawn(move || {
        let auth = format!("Bearer {DEPLOYMENT_TOKEN}");
        http(api, "POST", &path, &[("Authorization", auth.as_str())], b"")
    });
    // `complete` has read the parts and waits on the row for its change to verifying.
    let mut watch = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    wait_until(
        Duration::from_secs(20),
        "complete to wait on the row",
        || {
            db_i64(
                &mut watch,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock'",
                &[],
            ) == 1
        },
    );
    tx.commit().expect("commit part 2");

    let r = completing.join().expect("complete thread");
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["state"], "verified", "{v}");
    assert_eq!(v["parts"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(v["size_bytes"], body.len(), "{v}");
}

/// Two controls with receipts on a fresh database `name` and one bucket: B on the default
/// timing, A beating every 200 ms with an expiry of `expiry_ms` (decision 099). Returns the
/// database URL, the S3 server (keep it alive), B and A.
fn pair_with_a_fast_expiring(name: &str, expiry_ms: i64) -> (String, S3Server, Gateway, Gateway) {
    let url = cluster().fresh_database(name);
    let s3 = S3Server::start();
    let key = shared_key();
    let b = with_receipts(Gateway::builder(), &url, &s3, &key).start();
    let a = with_receipts_and(
        Gateway::builder(),
        &url,
        &s3,
        &key,
        &format!("heartbeat_ms = 200\ncontrol_expiry_ms = {expiry_ms}\n"),
    )
    .start();
    (url, s3, b, a)
}

/// A control whose store calls are stuck keeps its heartbeat (decision 104): the beat has a
/// connection of its own, so one slow call cannot get a live control declared dead while it
/// still holds receipts. The database stalls A's receipt assignment at its `COMMIT` (a deferred
/// trigger waits on a lock the test holds) for 5 s, more than A's 2 s expiry; A's row must stay
/// fresh all along, and B must recover nothing.
#[test]
fn a_control_whose_store_calls_stall_keeps_its_heartbeat() {
    let (url, _s3, b, a) = pair_with_a_fast_expiring("beat", 2_000);
    let body = upstream::pattern(1000);
    let id = create_request_receipt(&a, &body);
    put_part(&a, &id, 1, &body);
    complete(&a, &id);
    let mut db = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    assert_eq!(db_i64(&mut db, "SELECT count(*) FROM controls", &[]), 2);
    db.batch_execute(
        "CREATE FUNCTION stall_commit() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_advisory_xact_lock(4343); RETURN NULL; END $$; \
         CREATE CONSTRAINT TRIGGER stall AFTER UPDATE ON receipts \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION stall_commit(); \
         SELECT pg_advisory_lock(4343);",
    )
    .expect("a stalling commit");
    let echo = Upstream::start(upstream::echo());
    let api = a.api;
    let url_echo = echo.url("/stalled");
    let request = std::thread::spawn(move || {
        request_at(
            api,
            &json!({"method": "POST", "url": url_echo,
                    "body": {"mode": "receipt", "receipt_id": id}}),
        )
    });
    // A's row: the one B is not.
    let b_id = control_id_of(&mut db, &b);
    let a_rows = |db: &mut postgres::Client| {
        db_i64(
            db,
            "SELECT count(*) FROM controls WHERE control_id <> $1",
            &[&b_id],
        )
    };
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        assert_eq!(a_rows(&mut db), 1, "A's row was removed while A was alive");
        std::thread::sleep(Duration::from_millis(100));
    }
    db.batch_execute("SELECT pg_advisory_unlock(4343)")
        .expect("unlock");
    let r = request.join().expect("the request thread");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(a_rows(&mut db), 1);
}

/// The id of control `gw` in the `controls` table, by the address it recorded.
fn control_id_of(db: &mut postgres::Client, gw: &Gateway) -> String {
    let address = gw.admin.expect("an admin listener").to_string();
    let row = db
        .query_one(
            "SELECT control_id FROM controls WHERE address = $1",
            &[&address],
        )
        .expect("the control's row");
    row.get(0)
}
