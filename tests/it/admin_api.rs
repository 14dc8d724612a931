//! Black-box tests of the admin API's config resources, its errors table (spec, Admin API
//! errors), the active-request list and cancellation, health probes and `/metrics`: a real
//! gateway process over a real SQLite file.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{json, Value};
use support::gateway::{
    admin, admin_items, http, request_api, wait_until, Gateway, Resp, ADMIN_TOKEN,
    DEPLOYMENT_TOKEN, LOOPBACK_SNAPSHOT,
};
use support::upstream::{self, Upstream};

/// The admin mutation body limit (spec, Limits: "Admin mutation body 4 MiB").
const MAX_ADMIN_BODY: usize = 4 * 1024 * 1024;
/// The history bound of decision 005.
const HISTORY_LIMIT: usize = 100;

const CONFIG: &str = "/api/v1/admin/config";
const HISTORY: &str = "/api/v1/admin/config/history";
const ROLLBACK: &str = "/api/v1/admin/config/rollback";
const ROLLOUTS: &str = "/api/v1/admin/rollouts";
const REQUESTS: &str = "/api/v1/admin/requests";

/// A complete snapshot: the harness's loopback snapshot with another default timeout, so that
/// every written revision is told apart by `default_timeout_ms`.
fn snapshot(default_timeout_ms: u64) -> Value {
    let mut v: Value = serde_json::from_str(LOOPBACK_SNAPSHOT).expect("loopback snapshot");
    v["default_timeout_ms"] = json!(default_timeout_ms);
    v
}

/// The loopback snapshot without its allow list: loopback destinations are denied again.
fn denying_snapshot() -> Value {
    let mut v = snapshot(60_000);
    v["destinations"]["allow"] = json!([]);
    v
}

fn put_config(gw: &Gateway, if_match: Option<&str>, actor: Option<&str>, body: &[u8]) -> Resp {
    let mut h = vec![("Content-Type", "application/json")];
    if let Some(m) = if_match {
        h.push(("If-Match", m));
    }
    if let Some(a) = actor {
        h.push(("X-Service-Actor", a));
    }
    admin(gw, "PUT", CONFIG, &h, body)
}

fn rollback(gw: &Gateway, if_match: Option<&str>, actor: Option<&str>, body: &[u8]) -> Resp {
    let mut h = vec![("Content-Type", "application/json")];
    if let Some(m) = if_match {
        h.push(("If-Match", m));
    }
    if let Some(a) = actor {
        h.push(("X-Service-Actor", a));
    }
    admin(gw, "POST", ROLLBACK, &h, body)
}

/// `GET /api/v1/admin/config`, checking that the ETag is the quoted revision.
fn config(gw: &Gateway) -> Value {
    let r = admin(gw, "GET", CONFIG, &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let revision = v["revision"].as_u64().expect("revision");
    assert_eq!(r.header("etag"), Some(format!("\"{revision}\"").as_str()));
    v
}

fn history(gw: &Gateway) -> Vec<Value> {
    admin_items(gw, HISTORY)
}

fn revisions(items: &[Value]) -> Vec<u64> {
    items
        .iter()
        .map(|i| i["revision"].as_u64().expect("revision"))
        .collect()
}

fn error_of(r: &Resp) -> String {
    r.json()["error"]
        .as_str()
        .expect("error string")
        .to_string()
}

fn assert_admin_error(r: &Resp, status: u16, error: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(error_of(r), error, "{}", r.text());
}

/// An RFC 3339 UTC timestamp such as `2026-11-04T10:11:12Z` or with fractional seconds.
fn is_rfc3339_utc(s: &str) -> bool {
    let b = s.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| r.clone().all(|i| b.get(i).is_some_and(u8::is_ascii_digit));
    b.len() >= 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && s.ends_with('Z')
}

fn get_through(gw: &Gateway, up: &Upstream) -> Resp {
    request_api(gw, &json!({"method": "GET", "url": up.url("/x")}))
}

#[test]
fn config_reads_and_writes_carry_quoted_etags_and_the_actor() {
    let gw = Gateway::start();

    let r = admin(&gw, "GET", CONFIG, &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("etag"), Some("\"1\""));
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = r.json();
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(
        keys,
        ["action", "actor", "created_at", "revision", "snapshot"]
    );
    assert_eq!(v["revision"], 1);
    assert_eq!(v["action"], "bootstrap");
    assert_eq!(v["actor"], "sortie");
    assert!(is_rfc3339_utc(v["created_at"].as_str().unwrap()), "{v}");
    let bootstrap: Value = serde_json::from_str(LOOPBACK_SNAPSHOT).unwrap();
    assert_eq!(v["snapshot"], bootstrap);

    // Spec, Admin rule 1: the quoted ETag ...
    let s2 = snapshot(2_000);
    let r = put_config(
        &gw,
        Some("\"1\""),
        Some("alice@example.test"),
        s2.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("etag"), Some("\"2\""));
    let v = r.json();
    assert_eq!(v["revision"], 2);
    assert_eq!(v["action"], "update");
    assert_eq!(v["actor"], "alice@example.test");
    assert_eq!(v["snapshot"], s2);
    assert!(is_rfc3339_utc(v["created_at"].as_str().unwrap()), "{v}");

    // ... or its bare numeric contents.
    let s3 = snapshot(3_000);
    let r = put_config(&gw, Some("2"), Some("bob"), s3.to_string().as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("etag"), Some("\"3\""));
    assert_eq!(r.json()["actor"], "bob");

    // Without X-Service-Actor the record still names an actor.
    let s4 = snapshot(4_000);
    let r = put_config(&gw, Some("\"3\""), None, s4.to_string().as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    let anonymous = r.json()["actor"].as_str().unwrap().to_string();
    assert!(!anonymous.is_empty());

    let v = config(&gw);
    assert_eq!(v["revision"], 4);
    assert_eq!(v["snapshot"], s4);

    // History: newest first, each record whole.
    let items = history(&gw);
    assert_eq!(revisions(&items), [4, 3, 2, 1]);
    let actors: Vec<&str> = items.iter().map(|i| i["actor"].as_str().unwrap()).collect();
    assert_eq!(
        actors,
        [anonymous.as_str(), "bob", "alice@example.test", "sortie"]
    );
    let actions: Vec<&str> = items
        .iter()
        .map(|i| i["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["update", "update", "update", "bootstrap"]);
    assert_eq!(items[1]["snapshot"], s3);
    assert_eq!(items[3]["snapshot"], bootstrap);

    // HEAD answers like GET without a body.
    let r = admin(&gw, "HEAD", CONFIG, &[], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("etag"), Some("\"4\""));
}

#[test]
fn if_match_is_required_and_must_name_the_current_revision() {
    let gw = Gateway::start();
    let body = snapshot(2_000).to_string();

    // 428 on every mutation that lacks If-Match.
    assert_admin_error(
        &put_config(&gw, None, None, body.as_bytes()),
        428,
        "if_match_required",
    );
    assert_admin_error(
        &rollback(&gw, None, None, br#"{"config_version":1}"#),
        428,
        "if_match_required",
    );
    assert_admin_error(
        &admin(&gw, "POST", "/api/v1/admin/workers/local/drain", &[], b""),
        428,
        "if_match_required",
    );

    // 400 for anything that is neither "N" nor N.
    for bad in [
        "W/\"1\"",
        "*",
        "abc",
        "\"1",
        "1\"",
        "\"\"",
        "-1",
        "1.0",
        "\"1\", \"2\"",
        "01",
    ] {
        assert_admin_error(
            &put_config(&gw, Some(bad), None, body.as_bytes()),
            400,
            "invalid_if_match",
        );
        assert_admin_error(
            &rollback(&gw, Some(bad), None, br#"{"config_version":1}"#),
            400,
            "invalid_if_match",
        );
        assert_admin_error(
            &admin(
                &gw,
                "POST",
                "/api/v1/admin/workers/local/drain",
                &[("If-Match", bad)],
                b"",
            ),
            400,
            "invalid_if_match",
        );
    }
    assert_eq!(config(&gw)["revision"], 1);

    let r = put_config(&gw, Some("\"1\""), None, body.as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());

    // 409 for a stale or a future revision; nothing is written.
    let other = snapshot(9_000).to_string();
    for stale in ["\"1\"", "1", "\"0\"", "\"3\"", "18446744073709551615"] {
        assert_admin_error(
            &put_config(&gw, Some(stale), None, other.as_bytes()),
            409,
            "revision_conflict",
        );
        assert_admin_error(
            &rollback(&gw, Some(stale), None, br#"{"config_version":1}"#),
            409,
            "revision_conflict",
        );
    }
    let v = config(&gw);
    assert_eq!(v["revision"], 2);
    assert_eq!(v["snapshot"], snapshot(2_000));
    assert_eq!(revisions(&history(&gw)), [2, 1]);
}

/// Sends a request head announcing `content_length` body bytes and no body, and reads the
/// answer: the server must refuse from the head alone.
fn head_only(gw: &Gateway, method: &str, path: &str, content_length: usize) -> Resp {
    let addr = gw.admin.expect("admin listener");
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\
         If-Match: \"1\"\r\nContent-Type: application/json\r\nContent-Length: {content_length}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).expect("write head");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    support::gateway::parse_response(&raw)
}

/// Every admin route but the probes needs the token, and it is checked from the head: a
/// request announcing a body without sending it is answered 401 at once (the body is never
/// awaited) and its connection closed.
#[test]
fn a_request_without_the_admin_token_is_refused_from_its_head() {
    let gw = Gateway::start();
    let addr = gw.admin.expect("admin listener");
    let routes = [
        ("PUT", CONFIG),
        ("POST", ROLLBACK),
        ("POST", "/api/v1/admin/workers/local/drain"),
        ("GET", CONFIG),
        ("DELETE", "/api/v1/admin/requests/req_x"),
        ("GET", "/metrics"),
        ("PUT", "/no/such/route"),
    ];
    for (method, path) in routes {
        for auth in ["", "Authorization: Bearer wrong-token\r\n"] {
            let mut s = TcpStream::connect(addr).expect("connect");
            // Far shorter than any server timeout: an answer this soon came from the head.
            s.set_read_timeout(Some(Duration::from_secs(5))).ok();
            let head = format!(
                "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}\
                 Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            );
            s.write_all(head.as_bytes()).expect("write head");
            let mut raw = Vec::new();
            let read = s.read_to_end(&mut raw);
            assert!(
                read.is_ok(),
                "{method} {path}: no answer and no close: {read:?}"
            );
            let r = support::gateway::parse_response(&raw);
            assert_eq!(r.status, 401, "{method} {path} [{auth}]: {}", r.text());
            assert_eq!(error_of(&r), "admin_auth_required");
        }
    }
    // The probes stay open.
    for path in ["/healthz", "/readyz"] {
        let r = http(addr, "GET", path, &[], b"");
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
}

/// A snapshot document padded with trailing whitespace (valid JSON) to exactly `len` bytes.
fn padded_snapshot(timeout_ms: u64, len: usize) -> Vec<u8> {
    let mut b = snapshot(timeout_ms).to_string().into_bytes();
    assert!(b.len() <= len);
    b.resize(len, b' ');
    b
}

#[test]
fn undecodable_bodies_are_400_and_activate_nothing() {
    let up = Upstream::start(upstream::fixed(upstream::response(200, &[], b"ok")));
    let gw = Gateway::start();
    let good = snapshot(2_000).to_string();
    let mut nested_unknown = snapshot(2_000);
    nested_unknown["routing"]["rules"][0]["weight"] = json!(1);
    let mut top_unknown = snapshot(2_000);
    top_unknown["comment"] = json!("x");
    let mut wrong_type = snapshot(2_000);
    wrong_type["default_timeout_ms"] = json!("2000");
    let mut invalid_utf8 = good.clone().into_bytes();
    let at = invalid_utf8
        .windows(6)
        .position(|w| w == b"direct")
        .unwrap();
    invalid_utf8[at] = 0xff;

    let bodies: Vec<(&str, Vec<u8>)> = vec![
        ("syntax", b"{\"default_timeout_ms\":".to_vec()),
        ("not json", b"hello".to_vec()),
        ("empty", Vec::new()),
        ("array", b"[]".to_vec()),
        (
            "unknown top-level field",
            top_unknown.to_string().into_bytes(),
        ),
        (
            "unknown nested field",
            nested_unknown.to_string().into_bytes(),
        ),
        ("trailing value", format!("{good} {{}}").into_bytes()),
        ("trailing garbage", format!("{good}x").into_bytes()),
        ("two documents", format!("{good}{good}").into_bytes()),
        ("wrong type", wrong_type.to_string().into_bytes()),
        ("invalid UTF-8", invalid_utf8),
        (
            "one byte over 4 MiB",
            padded_snapshot(2_000, MAX_ADMIN_BODY + 1),
        ),
    ];
    for (what, body) in &bodies {
        let r = put_config(&gw, Some("\"1\""), None, body);
        assert_eq!(r.status, 400, "{what}: {}", r.text());
        assert!(!error_of(&r).is_empty(), "{what}");
    }

    // A declared length far over the limit is refused before the body is sent, with the same
    // status as any other oversized body.
    let r = head_only(&gw, "PUT", CONFIG, 5 * MAX_ADMIN_BODY);
    assert_eq!(r.status, 400, "{}", r.text());

    for (what, body) in [
        ("string version", &br#"{"config_version":"1"}"#[..]),
        ("unknown field", br#"{"config_version":1,"force":true}"#),
        ("trailing data", br#"{"config_version":1} 2"#),
        ("negative", br#"{"config_version":-1}"#),
        ("missing field", br#"{}"#),
        ("syntax", br#"{"config_version":"#),
    ] {
        let r = rollback(&gw, Some("\"1\""), None, body);
        assert_eq!(r.status, 400, "rollback {what}: {}", r.text());
    }
    let r = admin(
        &gw,
        "POST",
        "/api/v1/admin/workers/local/drain",
        &[("If-Match", "\"0\"")],
        b"{\"reason\":\"x\"}",
    );
    assert_eq!(r.status, 400, "{}", r.text());

    // Durable and published state unchanged.
    let v = config(&gw);
    assert_eq!(v["revision"], 1);
    assert_eq!(revisions(&history(&gw)), [1]);
    assert_eq!(get_through(&gw, &up).status, 200);
    let w = admin(&gw, "GET", "/api/v1/admin/workers", &[], b"").json();
    assert_eq!(w["items"][0]["draining"], false);
    assert_eq!(w["items"][0]["etag"], "\"0\"");

    // A body of exactly 4 MiB is within the limit.
    let r = put_config(
        &gw,
        Some("\"1\""),
        None,
        &padded_snapshot(5_000, MAX_ADMIN_BODY),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["snapshot"], snapshot(5_000));
}

#[test]
fn semantically_invalid_snapshots_are_422_naming_the_path() {
    let up = Upstream::start(upstream::fixed(upstream::response(200, &[], b"ok")));
    let gw = Gateway::start();
    assert_eq!(get_through(&gw, &up).status, 200);

    // Each case would deny loopback if anything of it were activated.
    let mut unknown_pool = denying_snapshot();
    unknown_pool["routing"]["rules"][0]["pools"] = json!(["direct", "nowhere"]);
    let mut duplicate_pool = denying_snapshot();
    duplicate_pool["pools"] = json!([{"id": "direct"}, {"id": "direct"}]);
    let mut bad_cidr = denying_snapshot();
    bad_cidr["destinations"]["deny"] = json!(["10.0.0.0/8", "300.1.2.3/32"]);
    let mut short_timeout = denying_snapshot();
    short_timeout["default_timeout_ms"] = json!(999);

    for (doc, path) in [
        (unknown_pool, "routing.rules[0].pools[1]"),
        (duplicate_pool, "pools[1].id"),
        (bad_cidr, "destinations.deny[1]"),
        (short_timeout, "default_timeout_ms"),
    ] {
        let r = put_config(
            &gw,
            Some("\"1\""),
            Some("mallory"),
            doc.to_string().as_bytes(),
        );
        assert_eq!(r.status, 422, "{path}: {}", r.text());
        let v = r.json();
        assert_eq!(v["error"], "invalid_snapshot", "{v}");
        assert_eq!(v["path"], path, "{v}");
        assert!(r.header("etag").is_none());
    }
    let v = config(&gw);
    assert_eq!(v["revision"], 1);
    assert_eq!(v["action"], "bootstrap");
    assert_eq!(revisions(&history(&gw)), [1]);
    assert_eq!(get_through(&gw, &up).status, 200);
}

#[test]
fn every_admin_route_needs_the_admin_token() {
    let gw = Gateway::start();
    let admin_addr = gw.admin.expect("admin listener");
    let body = snapshot(2_000).to_string();
    let routes: &[(&str, &str, &[u8])] = &[
        ("GET", CONFIG, b""),
        ("PUT", CONFIG, body.as_bytes()),
        ("GET", HISTORY, b""),
        ("POST", ROLLBACK, br#"{"config_version":1}"#),
        ("GET", ROLLOUTS, b""),
        ("GET", "/api/v1/admin/workers", b""),
        ("POST", "/api/v1/admin/workers/local/drain", b""),
        ("GET", REQUESTS, b""),
        ("DELETE", "/api/v1/admin/requests/req_x", b""),
        ("GET", "/metrics", b""),
        ("GET", "/api/v1/admin/nothing-here", b""),
    ];
    let deployment = format!("Bearer {DEPLOYMENT_TOKEN}");
    let wrong = format!("Bearer {ADMIN_TOKEN}x");
    let truncated = format!("Bearer {}", &ADMIN_TOKEN[..ADMIN_TOKEN.len() - 1]);
    let basic = format!("Basic {ADMIN_TOKEN}");
    let credentials: &[Option<&str>] = &[
        None,
        Some(&deployment),
        Some(&wrong),
        Some(&truncated),
        Some(&basic),
        Some(ADMIN_TOKEN),
        Some("Bearer "),
    ];
    for (method, path, b) in routes {
        for cred in credentials {
            let mut h = vec![("If-Match", "\"1\""), ("Content-Type", "application/json")];
            if let Some(c) = cred {
                h.push(("Authorization", c));
            }
            let r = http(admin_addr, method, path, &h, b);
            assert_admin_error(&r, 401, "admin_auth_required");
        }
    }
    // Nothing was changed by the refused mutations.
    let v = config(&gw);
    assert_eq!(v["revision"], 1);
    let w = admin(&gw, "GET", "/api/v1/admin/workers", &[], b"").json();
    assert_eq!(w["items"][0]["etag"], "\"0\"");

    // The probes are open.
    for p in ["/healthz", "/readyz"] {
        let r = http(admin_addr, "GET", p, &[], b"");
        assert_eq!(r.status, 200, "{p}: {}", r.text());
    }
}

#[test]
fn history_keeps_the_newest_hundred_records_contiguously() {
    let gw = Gateway::start();
    let writes = HISTORY_LIMIT + 5;
    for i in 1..=writes {
        let rev = i as u64;
        let r = put_config(
            &gw,
            Some(&rev.to_string()),
            Some("loop"),
            snapshot(1_000 + rev).to_string().as_bytes(),
        );
        assert_eq!(r.status, 200, "write {i}: {}", r.text());
        assert_eq!(r.header("etag"), Some(format!("\"{}\"", rev + 1).as_str()));
    }
    let newest = writes as u64 + 1;
    let items = history(&gw);
    assert_eq!(items.len(), HISTORY_LIMIT);
    let expected: Vec<u64> = (newest + 1 - HISTORY_LIMIT as u64..=newest).rev().collect();
    assert_eq!(revisions(&items), expected);
    for item in &items {
        let rev = item["revision"].as_u64().unwrap();
        assert_eq!(
            item["snapshot"],
            snapshot(1_000 + rev - 1),
            "revision {rev}"
        );
        assert_eq!(item["action"], "update");
    }
    assert_eq!(config(&gw)["revision"], newest);

    // A pruned revision cannot be rolled back to, a kept one can.
    let etag = newest.to_string();
    let r = rollback(&gw, Some(&etag), None, br#"{"config_version":1}"#);
    assert_eq!(r.status, 422, "{}", r.text());
    let oldest = newest + 1 - HISTORY_LIMIT as u64;
    let r = rollback(
        &gw,
        Some(&etag),
        None,
        format!("{{\"config_version\":{oldest}}}").as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["revision"], newest + 1);
    let items = history(&gw);
    assert_eq!(items.len(), HISTORY_LIMIT);
    assert_eq!(items[0]["revision"], newest + 1);
    assert_eq!(items[0]["snapshot"], snapshot(1_000 + oldest - 1));
    assert_eq!(items[HISTORY_LIMIT - 1]["revision"], oldest + 1);
}

#[test]
fn rollback_reapplies_an_old_snapshot_as_a_new_audited_revision() {
    let up = Upstream::start(upstream::fixed(upstream::response(200, &[], b"ok")));
    let gw = Gateway::start();
    assert_eq!(get_through(&gw, &up).status, 200);

    let s2 = snapshot(7_000);
    assert_eq!(
        put_config(&gw, Some("1"), None, s2.to_string().as_bytes()).status,
        200
    );
    let r = put_config(
        &gw,
        Some("2"),
        Some("ops"),
        denying_snapshot().to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    for _ in 0..6 {
        let denied = get_through(&gw, &up);
        assert_eq!(denied.status, 403, "{}", denied.text());
        assert_eq!(denied.json()["code"], "destination_denied");
    }

    let target = br#"{"config_version":2}"#;
    assert_admin_error(&rollback(&gw, None, None, target), 428, "if_match_required");
    assert_admin_error(
        &rollback(&gw, Some("W/\"3\""), None, target),
        400,
        "invalid_if_match",
    );
    assert_admin_error(
        &rollback(&gw, Some("\"2\""), None, target),
        409,
        "revision_conflict",
    );
    for unknown in [0u64, 4, 99, u64::MAX] {
        let r = rollback(
            &gw,
            Some("\"3\""),
            None,
            format!("{{\"config_version\":{unknown}}}").as_bytes(),
        );
        assert_eq!(r.status, 422, "version {unknown}: {}", r.text());
        assert!(!error_of(&r).is_empty());
    }
    assert_eq!(config(&gw)["revision"], 3);
    assert_eq!(get_through(&gw, &up).status, 403);

    let r = rollback(&gw, Some("\"3\""), Some("carol"), target);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("etag"), Some("\"4\""));
    let v = r.json();
    assert_eq!(v["revision"], 4);
    assert_eq!(v["action"], "rollback");
    assert_eq!(v["actor"], "carol");
    assert_eq!(v["snapshot"], s2);

    // The rolled-back snapshot routes at once, on every core: loopback is allowed again.
    for _ in 0..6 {
        assert_eq!(get_through(&gw, &up).status, 200);
    }
    let v = config(&gw);
    assert_eq!(v["revision"], 4);
    assert_eq!(v["snapshot"], s2);
    let items = history(&gw);
    assert_eq!(revisions(&items), [4, 3, 2, 1]);
    let actions: Vec<&str> = items
        .iter()
        .map(|i| i["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["rollback", "update", "update", "bootstrap"]);

    // Rolling back to the bootstrap record works too, and the ETag must be refreshed.
    assert_admin_error(
        &rollback(&gw, Some("\"3\""), None, br#"{"config_version":1}"#),
        409,
        "revision_conflict",
    );
    let r = rollback(&gw, Some("4"), None, br#"{"config_version":1}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["snapshot"],
        serde_json::from_str::<Value>(LOOPBACK_SNAPSHOT).unwrap()
    );
}

const TWO_WORKERS: &str = r#"
[[workers]]
id = "w-b"
capacity = 3

[[workers]]
id = "w-a"
capacity = 5
"#;

fn rollout(gw: &Gateway) -> Value {
    let r = admin(gw, "GET", ROLLOUTS, &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

#[test]
fn rollouts_follow_activations() {
    let gw = Gateway::builder().workers(TWO_WORKERS).start();
    let applied = |version: u64| {
        json!({
            "config_version": version,
            "control": {"status": "applied"},
            "entries": [
                {"worker_id": "w-a", "status": "applied"},
                {"worker_id": "w-b", "status": "applied"},
            ],
        })
    };
    assert_eq!(rollout(&gw), applied(1));
    assert_eq!(
        put_config(&gw, Some("1"), None, snapshot(2_000).to_string().as_bytes()).status,
        200
    );
    assert_eq!(rollout(&gw), applied(2));

    // A refused write changes nothing.
    assert_eq!(
        put_config(&gw, Some("1"), None, snapshot(3_000).to_string().as_bytes()).status,
        409
    );
    let mut bad = snapshot(3_000);
    bad["pools"] = json!([]);
    assert_eq!(
        put_config(&gw, Some("2"), None, bad.to_string().as_bytes()).status,
        422
    );
    assert_eq!(rollout(&gw), applied(2));

    assert_eq!(
        rollback(&gw, Some("2"), None, br#"{"config_version":1}"#).status,
        200
    );
    assert_eq!(rollout(&gw), applied(3));
    // Worker actions change worker state, not the config version.
    let r = admin(
        &gw,
        "POST",
        "/api/v1/admin/workers/w-a/drain",
        &[("If-Match", "\"0\"")],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(rollout(&gw)["config_version"], 3);
}

fn active_ids(gw: &Gateway) -> Vec<Value> {
    admin_items(gw, REQUESTS)
}

#[test]
fn operators_list_and_cancel_active_requests() {
    let slow = Upstream::start(upstream::slow_head(Duration::from_secs(20)));
    let fast = Upstream::start(upstream::fixed(upstream::response(200, &[], b"ok")));
    let gw = Gateway::builder().workers(TWO_WORKERS).start();
    assert!(active_ids(&gw).is_empty());

    // A request that already finished is no cancellation target.
    let done = get_through(&gw, &fast);
    assert_eq!(done.status, 200);
    let done_id = done.json()["request_id"].as_str().unwrap().to_string();
    let r = admin(&gw, "DELETE", &format!("{REQUESTS}/{done_id}"), &[], b"");
    assert_admin_error(&r, 404, "request_not_found");

    let api = gw.api;
    let url = slow.url("/slow");
    let caller = std::thread::spawn(move || {
        let auth = format!("Bearer {DEPLOYMENT_TOKEN}");
        http(
            api,
            "POST",
            "/api/v1/requests",
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            json!({"method": "GET", "url": url, "timeout_ms": 60000})
                .to_string()
                .as_bytes(),
        )
    });
    let mut items = Vec::new();
    wait_until(
        Duration::from_secs(20),
        "the slow request to be listed",
        || {
            items = active_ids(&gw);
            !items.is_empty()
        },
    );
    assert_eq!(items.len(), 1, "{items:?}");
    let mut keys: Vec<&str> = items[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort();
    assert_eq!(keys, ["deployment_id", "request_id"]);
    assert_eq!(items[0]["deployment_id"], "dep_test");
    let id = items[0]["request_id"].as_str().unwrap().to_string();
    assert!(id.starts_with("req_"), "{id}");

    // The request holds one unit of capacity on one worker while it runs.
    let workers = admin(&gw, "GET", "/api/v1/admin/workers", &[], b"").json();
    let busy: u64 = workers["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["capacity"]["active"].as_u64().unwrap())
        .sum();
    assert_eq!(busy, 1, "{workers}");
    let metrics = admin(&gw, "GET", "/metrics", &[], b"").text();
    assert!(
        metrics.lines().any(|l| l == "sortie_active_requests 1"),
        "{metrics}"
    );

    let path = format!("{REQUESTS}/{id}");
    let r = admin(&gw, "DELETE", &path, &[], b"");
    assert_eq!(r.status, 204, "{}", r.text());
    assert!(r.body.is_empty());

    let answer = caller.join().expect("caller thread");
    assert_eq!(answer.status, 499, "{}", answer.text());
    let v = answer.json();
    assert_eq!(v["code"], "cancelled");
    assert_eq!(v["request_id"], id.as_str());
    assert_eq!(v["retryable"], false);

    // Spec, Admin rule 4: repeating the cancellation is safe.
    let r = admin(&gw, "DELETE", &path, &[], b"");
    assert_eq!(r.status, 204, "{}", r.text());
    assert!(r.body.is_empty());
    wait_until(Duration::from_secs(10), "the active list to empty", || {
        active_ids(&gw).is_empty()
    });
    let r = admin(&gw, "DELETE", &path, &[], b"");
    assert_eq!(r.status, 204, "{}", r.text());

    for unknown in ["req_00000000000000000000000000", "nothing", "req_"] {
        let r = admin(&gw, "DELETE", &format!("{REQUESTS}/{unknown}"), &[], b"");
        assert_admin_error(&r, 404, "request_not_found");
    }
    let workers = admin(&gw, "GET", "/api/v1/admin/workers", &[], b"").json();
    for w in workers["items"].as_array().unwrap() {
        assert_eq!(w["capacity"]["active"], 0, "{workers}");
    }
}

/// Checks the Prometheus text format's grouping rule: every sample of a metric family follows
/// its `# TYPE` line, with no other family's lines in between, and a family appears once.
fn assert_families_grouped(metrics: &str) {
    let mut seen: Vec<String> = Vec::new();
    let mut current: Option<String> = None;
    for line in metrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split_whitespace().next().unwrap().to_string();
            assert!(
                !seen.contains(&name),
                "second TYPE line for {name}:\n{metrics}"
            );
            seen.push(name.clone());
            current = Some(name);
        } else if line.starts_with("# HELP ") || line.is_empty() {
            continue;
        } else {
            let name: String = line
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let family = current.as_deref().expect("a sample before any TYPE line");
            let belongs = name == family
                || ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|s| name.strip_suffix(s) == Some(family));
            assert!(
                belongs,
                "sample {line:?} is not in the group of {family}:\n{metrics}"
            );
        }
    }
}

fn metric(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn probes_and_metrics() {
    let up = Upstream::start(upstream::fixed(upstream::response(200, &[], b"ok")));
    let gw = Gateway::builder().workers(TWO_WORKERS).start();
    let addr = gw.admin.expect("admin listener");
    for p in ["/healthz", "/readyz"] {
        let r = http(addr, "GET", p, &[], b"");
        assert_eq!(r.status, 200, "{p}");
    }
    assert_admin_error(
        &http(addr, "GET", "/metrics", &[], b""),
        401,
        "admin_auth_required",
    );
    let dep = format!("Bearer {DEPLOYMENT_TOKEN}");
    assert_admin_error(
        &http(addr, "GET", "/metrics", &[("Authorization", &dep)], b""),
        401,
        "admin_auth_required",
    );

    assert_eq!(get_through(&gw, &up).status, 200);
    assert_eq!(get_through(&gw, &up).status, 200);
    let refused = request_api(&gw, &json!({"method": "GET", "url": "http://127.0.0.1:1/"}));
    assert_eq!(refused.status, 502, "{}", refused.text());

    let r = admin(&gw, "GET", "/metrics", &[], b"");
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    let m = r.text();
    assert_families_grouped(&m);
    assert_eq!(
        metric(
            &m,
            "sortie_requests_total{deployment=\"dep_test\",outcome=\"ok\",ingress=\"api\"}"
        ),
        Some(2.0),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "sortie_requests_total{deployment=\"dep_test\",outcome=\"upstream_connection_refused\",ingress=\"api\"}"
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(metric(&m, "sortie_config_revision"), Some(1.0), "{m}");
    assert_eq!(
        metric(&m, "sortie_worker_capacity{worker=\"w-a\"}"),
        Some(5.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "sortie_worker_capacity{worker=\"w-b\"}"),
        Some(3.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "sortie_worker_active_requests{worker=\"w-a\"}"),
        Some(0.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "sortie_request_stage_seconds_count{stage=\"total\"}"),
        Some(2.0),
        "{m}"
    );

    assert_eq!(
        put_config(&gw, Some("1"), None, snapshot(2_000).to_string().as_bytes()).status,
        200
    );
    assert_eq!(
        rollback(&gw, Some("2"), None, br#"{"config_version":1}"#).status,
        200
    );
    let m = admin(&gw, "GET", "/metrics", &[], b"").text();
    assert_eq!(metric(&m, "sortie_config_revision"), Some(3.0), "{m}");
    assert_eq!(config(&gw)["revision"], 3);
}

#[test]
fn concurrent_writers_with_the_same_etag_get_one_success() {
    const WRITERS: u64 = 8;
    let up = Upstream::start(upstream::fixed(upstream::response(200, &[], b"ok")));
    let gw = Gateway::start();
    let addr = gw.admin.expect("admin listener");
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(WRITERS as usize));
    let threads: Vec<_> = (0..WRITERS)
        .map(|i| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let body = snapshot(2_000 + i).to_string();
                barrier.wait();
                let auth = format!("Bearer {ADMIN_TOKEN}");
                let headers = [("Authorization", auth.as_str()), ("If-Match", "\"1\"")];
                (i, http(addr, "PUT", CONFIG, &headers, body.as_bytes()))
            })
        })
        .collect();
    let answers: Vec<(u64, Resp)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let winners: Vec<u64> = answers
        .iter()
        .filter(|(_, r)| r.status == 200)
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(
        winners.len(),
        1,
        "{:?}",
        answers.iter().map(|(_, r)| r.status).collect::<Vec<_>>()
    );
    for (_, r) in answers.iter().filter(|(_, r)| r.status != 200) {
        assert_admin_error(r, 409, "revision_conflict");
    }
    let v = config(&gw);
    assert_eq!(v["revision"], 2);
    assert_eq!(v["snapshot"], snapshot(2_000 + winners[0]));
    assert_eq!(revisions(&history(&gw)), [2, 1]);
    assert_eq!(get_through(&gw, &up).status, 200);
}

#[test]
fn a_malformed_actor_is_refused_before_anything_is_written() {
    let gw = Gateway::start();
    let body = snapshot(2_000).to_string();
    let long = "a".repeat(257);
    for actor in [long.as_str(), "tab\there"] {
        let r = put_config(&gw, Some("\"1\""), Some(actor), body.as_bytes());
        assert_eq!(r.status, 400, "{actor:?}: {}", r.text());
        let r = rollback(&gw, Some("\"1\""), Some(actor), br#"{"config_version":1}"#);
        assert_eq!(r.status, 400, "{actor:?}: {}", r.text());
    }
    assert_eq!(config(&gw)["revision"], 1);
    let longest = "a".repeat(256);
    let r = put_config(&gw, Some("\"1\""), Some(&longest), body.as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["actor"], longest.as_str());
}
