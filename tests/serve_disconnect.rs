//! Black-box test: a client that closes its connection while its request API call waits on a
//! slow upstream ends that request at once: it leaves the active list and frees its worker's
//! capacity, well before the upstream would have answered.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::gateway::{admin, wait_until, Gateway, DEPLOYMENT_TOKEN};
use support::upstream::{self, Upstream};

const REQUESTS: &str = "/api/v1/admin/requests";
const WORKERS: &str = "/api/v1/admin/workers";
/// How slowly the upstream answers: far longer than the release may take.
const UPSTREAM_PAUSE: Duration = Duration::from_secs(5);
/// How soon after the client leaves the request must be gone.
const RELEASE_WITHIN: Duration = Duration::from_secs(2);

fn active_requests(gw: &Gateway) -> Vec<Value> {
    let r = admin(gw, "GET", REQUESTS, &[], b"");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()["items"].as_array().expect("items").clone()
}

fn active_capacity(gw: &Gateway) -> u64 {
    let w = admin(gw, "GET", WORKERS, &[], b"").json();
    w["items"]
        .as_array()
        .expect("workers")
        .iter()
        .map(|w| w["capacity"]["active"].as_u64().expect("capacity.active"))
        .sum()
}

#[test]
fn client_leaving_mid_request_releases_it_at_once() {
    let slow = Upstream::start(upstream::slow_head(UPSTREAM_PAUSE));
    let gw = Gateway::start();
    assert!(active_requests(&gw).is_empty());

    let envelope =
        json!({"method": "GET", "url": slow.url("/slow"), "timeout_ms": 60000}).to_string();
    let mut client = TcpStream::connect(gw.api).expect("connect");
    let head = format!(
        "POST /api/v1/requests HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {DEPLOYMENT_TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        gw.api,
        envelope.len()
    );
    client.write_all(head.as_bytes()).expect("write head");
    client.write_all(envelope.as_bytes()).expect("write body");

    wait_until(Duration::from_secs(10), "the request to be listed", || {
        active_requests(&gw).len() == 1
    });
    assert_eq!(active_capacity(&gw), 1);

    let closed_at = Instant::now();
    drop(client);
    wait_until(RELEASE_WITHIN, "the request to be released", || {
        active_requests(&gw).is_empty() && active_capacity(&gw) == 0
    });
    println!("released {:?} after the client closed", closed_at.elapsed());
}
