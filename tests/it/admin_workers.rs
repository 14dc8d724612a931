//! Black-box tests of the admin API's worker resources: the worker list (decision 017 fields),
//! lifecycle actions under per-worker ETags, settings-only workers, and routing that follows
//! the flags at once.

use crate::support;

use std::time::Duration;

use serde_json::{json, Value};
use support::gateway::{
    admin, admin_items, http, request_api, wait_until, worker_item, Gateway, Resp, DEPLOYMENT_TOKEN,
};
use support::upstream::{self, Upstream};

const WORKERS: &str = "/api/v1/admin/workers";

/// A snapshot with a second pool, `res`, that one local worker serves.
const TWO_POOL_SNAPSHOT: &str = r#"{"default_timeout_ms":60000,"routing":{"rules":[{"id":"default","priority":100,"constraints":{},"pools":["direct","res"],"sticky_session_ttl_seconds":0,"allow_sticky_fallback":true}]},"pools":[{"id":"direct"},{"id":"res"}],"destinations":{"allow":["127.0.0.0/8","::1/128"],"deny":[]}}"#;

/// Three local workers, declared out of id order.
const THREE_WORKERS: &str = r#"
[[workers]]
id = "w-c"
capacity = 2
tags = ["slow"]
pools = ["direct"]

[[workers]]
id = "w-a"
capacity = 4
tags = ["residential", "fast"]
country = "us"
region = "us-east"
ip_type = "residential"
pools = ["res", "direct"]
ingress = ["api"]

[[workers]]
id = "w-b"
capacity = 6
country = "DE"
region = "eu-central"
ip_type = "datacenter"
"#;

/// One worker matches the tag `fast`, the other has no tags.
const FAST_AND_PLAIN: &str = r#"
[[workers]]
id = "w-fast"
capacity = 4
tags = ["fast"]

[[workers]]
id = "w-plain"
capacity = 4
"#;

fn list(gw: &Gateway) -> Vec<Value> {
    admin_items(gw, WORKERS)
}

fn act(gw: &Gateway, id: &str, action: &str, if_match: Option<&str>) -> Resp {
    let mut h = vec![("X-Service-Actor", "ops")];
    if let Some(m) = if_match {
        h.push(("If-Match", m));
    }
    admin(gw, "POST", &format!("{WORKERS}/{id}/{action}"), &h, b"")
}

/// Runs an action that must succeed and returns the worker record it answers, checking that
/// the `ETag` header and the record's `etag` field agree.
fn act_ok(gw: &Gateway, id: &str, action: &str, if_match: &str, next: u64) -> Value {
    let r = act(gw, id, action, Some(if_match));
    assert_eq!(r.status, 200, "{action} {id}: {}", r.text());
    let tag = format!("\"{next}\"");
    assert_eq!(r.header("etag"), Some(tag.as_str()), "{action} {id}");
    let v = r.json();
    assert_eq!(v["worker_id"], id);
    assert_eq!(v["etag"], tag.as_str());
    v
}

fn assert_error(r: &Resp, status: u16, error: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    assert_eq!(r.json()["error"], error, "{}", r.text());
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().expect("string").to_string())
        .collect()
}

fn tagged(gw: &Gateway, up: &Upstream, tags: &[&str]) -> Resp {
    request_api(
        gw,
        &json!({"method": "GET", "url": up.url("/t"), "routing": {"tags": tags}}),
    )
}

fn untagged(gw: &Gateway, up: &Upstream) -> Resp {
    request_api(gw, &json!({"method": "GET", "url": up.url("/u")}))
}

fn assert_route_unavailable(r: &Resp) {
    assert_eq!(r.status, 503, "{}", r.text());
    let v = r.json();
    assert_eq!(v["code"], "route_unavailable", "{v}");
    assert_eq!(v["retryable"], true);
}

#[test]
fn the_worker_list_is_ordered_by_id_and_carries_every_field() {
    let gw = Gateway::builder()
        .snapshot(Some(TWO_POOL_SNAPSHOT))
        .workers(THREE_WORKERS)
        .start();
    let items = list(&gw);
    let ids: Vec<&str> = items
        .iter()
        .map(|w| w["worker_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["w-a", "w-b", "w-c"]);
    for w in &items {
        let mut keys: Vec<&str> = w.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "capacity",
                "country",
                "draining",
                "enabled",
                "etag",
                "executor",
                "fingerprint_profiles",
                "ingress",
                "ip_type",
                "last_seen",
                "pools",
                "region",
                "session",
                "state",
                "tags",
                "worker_id"
            ],
            "{w}"
        );
        assert_eq!(w["state"], "connected");
        assert_eq!(w["executor"], "local");
        assert_eq!(w["enabled"], true);
        assert_eq!(w["draining"], false);
        assert_eq!(w["etag"], "\"0\"");
        assert!(w["session"].is_string(), "{w}");
        let seen = w["last_seen"].as_str().expect("last_seen");
        assert!(
            seen.len() >= 20 && seen.ends_with('Z') && seen.as_bytes()[10] == b'T',
            "{seen}"
        );
        // Local workers advertise the profiles this process's self-test verified: every
        // built-in one this build can send with the fingerprinted connector, none without it
        // (decisions 082, 100).
        // The record lists them sorted by name.
        let expected: Vec<String> = if cfg!(feature = "fingerprints") {
            let mut names: Vec<String> = sortie_core::fingerprint::profile::PROFILES
                .iter()
                .filter(|p| p.unsupported.is_none())
                .map(|p| p.name.to_string())
                .collect();
            names.sort();
            names
        } else {
            Vec::new()
        };
        assert_eq!(strings(&w["fingerprint_profiles"]), expected);
    }

    let a = worker_item(&items, "w-a");
    assert_eq!(
        a["capacity"],
        json!({"active": 0, "available": 4, "max": 4})
    );
    let mut pools = strings(&a["pools"]);
    pools.sort();
    assert_eq!(pools, ["direct", "res"]);
    assert_eq!(strings(&a["tags"]), ["fast", "residential"]);
    assert_eq!(a["country"], "US");
    assert_eq!(a["region"], "us-east");
    assert_eq!(a["ip_type"], "residential");
    assert_eq!(strings(&a["ingress"]), ["api"]);

    let b = worker_item(&items, "w-b");
    assert_eq!(
        b["capacity"],
        json!({"active": 0, "available": 6, "max": 6})
    );
    // Decision 017: a local worker without `pools` belongs to `direct`.
    assert_eq!(strings(&b["pools"]), ["direct"]);
    assert_eq!(strings(&b["tags"]), Vec::<String>::new());
    assert_eq!(b["country"], "DE");
    assert_eq!(b["region"], "eu-central");
    assert_eq!(b["ip_type"], "datacenter");
    let mut ingress = strings(&b["ingress"]);
    ingress.sort();
    assert_eq!(ingress, ["api", "connect", "proxy"]);

    let c = worker_item(&items, "w-c");
    assert_eq!(c["capacity"]["max"], 2);
    assert_eq!(strings(&c["tags"]), ["slow"]);
    assert!(
        c["country"].is_null() && c["region"].is_null() && c["ip_type"].is_null(),
        "{c}"
    );
}

#[test]
fn actions_use_per_worker_etags() {
    let gw = Gateway::builder().workers(FAST_AND_PLAIN).start();

    let v = act_ok(&gw, "w-fast", "drain", "\"0\"", 1);
    assert_eq!(v["draining"], true);
    assert_eq!(v["enabled"], true);
    assert_eq!(v["state"], "connected");
    let items = list(&gw);
    assert_eq!(worker_item(&items, "w-fast")["draining"], true);
    assert_eq!(worker_item(&items, "w-fast")["etag"], "\"1\"");
    // The other worker's ETag is its own.
    assert_eq!(worker_item(&items, "w-plain")["etag"], "\"0\"");
    assert_eq!(worker_item(&items, "w-plain")["draining"], false);

    // A stale, a future or a foreign ETag conflicts and changes nothing.
    for stale in ["\"0\"", "0", "\"2\""] {
        assert_error(
            &act(&gw, "w-fast", "undrain", Some(stale)),
            409,
            "revision_conflict",
        );
    }
    assert_error(
        &act(&gw, "w-plain", "drain", Some("\"1\"")),
        409,
        "revision_conflict",
    );
    let items = list(&gw);
    assert_eq!(worker_item(&items, "w-fast")["draining"], true);
    assert_eq!(worker_item(&items, "w-plain")["etag"], "\"0\"");

    // Bare numeric contents are accepted too.
    let v = act_ok(&gw, "w-fast", "undrain", "1", 2);
    assert_eq!(v["draining"], false);
    let v = act_ok(&gw, "w-fast", "disable", "\"2\"", 3);
    assert_eq!(v["enabled"], false);
    let v = act_ok(&gw, "w-fast", "enable", "\"3\"", 4);
    assert_eq!(v["enabled"], true);
    // Repeating an action that changes no flag still moves the ETag on.
    let v = act_ok(&gw, "w-fast", "enable", "\"4\"", 5);
    assert_eq!(v["enabled"], true);
    act_ok(&gw, "w-plain", "disable", "\"0\"", 1);

    assert_error(&act(&gw, "w-fast", "drain", None), 428, "if_match_required");
    for bad in ["W/\"5\"", "*", "abc"] {
        assert_error(
            &act(&gw, "w-fast", "drain", Some(bad)),
            400,
            "invalid_if_match",
        );
    }
    for action in ["reboot", "DRAIN", "drain2"] {
        let r = act(&gw, "w-fast", action, Some("\"5\""));
        assert_eq!(r.status, 400, "{action}: {}", r.text());
    }
    let r = act(&gw, "bad!id", "drain", Some("\"0\""));
    assert_eq!(r.status, 400, "{}", r.text());

    let items = list(&gw);
    let fast = worker_item(&items, "w-fast");
    assert_eq!(
        (fast["enabled"].clone(), fast["draining"].clone()),
        (json!(true), json!(false))
    );
    assert_eq!(fast["etag"], "\"5\"");
    let plain = worker_item(&items, "w-plain");
    assert_eq!(plain["enabled"], false);
    assert_eq!(plain["etag"], "\"1\"");
    assert_eq!(
        items.len(),
        2,
        "refused actions created no record: {items:?}"
    );
}

#[test]
fn routing_follows_drain_and_disable_at_once() {
    let up = Upstream::start(upstream::fixed(upstream::response(200, &[], b"ok")));
    let gw = Gateway::builder().workers(FAST_AND_PLAIN).start();
    assert_eq!(tagged(&gw, &up, &["fast"]).status, 200);

    act_ok(&gw, "w-fast", "drain", "\"0\"", 1);
    // Every core sees the change: each request is a new connection, spread over the cores.
    for _ in 0..6 {
        assert_route_unavailable(&tagged(&gw, &up, &["fast"]));
    }
    // Requests that any worker may serve go to the other one.
    for _ in 0..4 {
        assert_eq!(untagged(&gw, &up).status, 200);
    }
    act_ok(&gw, "w-fast", "undrain", "\"1\"", 2);
    assert_eq!(tagged(&gw, &up, &["fast"]).status, 200);

    act_ok(&gw, "w-fast", "disable", "\"2\"", 3);
    assert_route_unavailable(&tagged(&gw, &up, &["fast"]));
    act_ok(&gw, "w-plain", "drain", "\"0\"", 1);
    assert_route_unavailable(&untagged(&gw, &up));
    act_ok(&gw, "w-fast", "enable", "\"3\"", 4);
    assert_eq!(tagged(&gw, &up, &["fast"]).status, 200);
    assert_eq!(untagged(&gw, &up).status, 200);
}

#[test]
fn a_settings_record_for_an_unregistered_worker_is_listed_but_never_routed() {
    let up = Upstream::start(upstream::fixed(upstream::response(200, &[], b"ok")));
    let gw = Gateway::builder().workers(FAST_AND_PLAIN).start();

    let v = act_ok(&gw, "ghost", "disable", "\"0\"", 1);
    assert_eq!(v["state"], "unregistered");
    assert_eq!(v["enabled"], false);
    let v = act_ok(&gw, "ghost", "enable", "\"1\"", 2);
    assert_eq!(v["enabled"], true);
    assert_eq!(v["draining"], false);

    let items = list(&gw);
    let ids: Vec<&str> = items
        .iter()
        .map(|w| w["worker_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["ghost", "w-fast", "w-plain"]);
    let ghost = worker_item(&items, "ghost");
    assert_eq!(ghost["state"], "unregistered");
    assert_eq!(ghost["etag"], "\"2\"");
    assert_eq!(ghost["capacity"]["max"], 0);
    assert_eq!(ghost["capacity"]["available"], 0);
    assert_eq!(strings(&ghost["pools"]), Vec::<String>::new());

    // It takes no part in rollouts ...
    let rollout = admin(&gw, "GET", "/api/v1/admin/rollouts", &[], b"").json();
    let entries: Vec<&str> = rollout["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["worker_id"].as_str().unwrap())
        .collect();
    assert_eq!(entries, ["w-fast", "w-plain"]);

    // ... and, enabled and not draining, still gets no request when nothing else can serve.
    act_ok(&gw, "w-fast", "drain", "\"0\"", 1);
    act_ok(&gw, "w-plain", "drain", "\"0\"", 1);
    assert_route_unavailable(&untagged(&gw, &up));
    act_ok(&gw, "w-plain", "undrain", "\"1\"", 2);
    assert_eq!(untagged(&gw, &up).status, 200);
}

#[test]
fn a_drained_worker_finishes_its_running_request() {
    let slow = Upstream::start(upstream::slow_head(Duration::from_millis(1500)));
    let gw = Gateway::builder()
        .workers("[[workers]]\nid = \"solo\"\ncapacity = 2\n")
        .start();
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
            json!({"method": "GET", "url": url}).to_string().as_bytes(),
        )
    });
    wait_until(Duration::from_secs(10), "the request to start", || {
        worker_item(&list(&gw), "solo")["capacity"]["active"] == 1
    });

    // The action answers the live record, including the work still running on the worker.
    let v = act_ok(&gw, "solo", "drain", "\"0\"", 1);
    assert_eq!(v["draining"], true);
    assert_eq!(
        v["capacity"],
        json!({"active": 1, "available": 1, "max": 2})
    );
    assert_route_unavailable(&untagged(&gw, &slow));

    let answer = caller.join().expect("caller");
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["status"], 200);
    assert_eq!(worker_item(&list(&gw), "solo")["capacity"]["active"], 0);
}

/// Decision 042: actions on ids no worker registered create settings records only up to
/// 1024; past that they are refused with 400 and nothing is stored, while actions on known
/// workers (registered or already recorded) go on.
#[test]
fn settings_records_for_unknown_workers_are_bounded() {
    const BOUND: usize = 1024;
    let gw = Gateway::start();
    let drain = |id: &str, revision: u64| {
        let tag = format!("\"{revision}\"");
        admin(
            &gw,
            "POST",
            &format!("{WORKERS}/{id}/drain"),
            &[("If-Match", &tag)],
            b"",
        )
    };
    for i in 0..BOUND {
        let r = drain(&format!("ghost-{i}"), 0);
        assert_eq!(r.status, 200, "ghost-{i}: {}", r.text());
    }
    let r = drain("ghost-over", 0);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("1024"), "{}", r.text());
    let items = admin_items(&gw, WORKERS);
    assert!(items.iter().all(|w| w["worker_id"] != "ghost-over"));
    let unregistered = items
        .iter()
        .filter(|w| w["state"] == "unregistered")
        .count();
    assert_eq!(unregistered, BOUND);
    // Known ids are not affected by the bound.
    let r = admin(
        &gw,
        "POST",
        &format!("{WORKERS}/ghost-7/undrain"),
        &[("If-Match", "\"1\"")],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = drain("local", 0);
    assert_eq!(r.status, 200, "{}", r.text());
}
