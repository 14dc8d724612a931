//! Black-box test: a client that closes its connection while its request API call waits on a
//! slow upstream ends that request at once: it leaves the active list, frees its worker's
//! capacity and closes the upstream connection, well before the upstream would have answered,
//! and is counted as `cancelled`.

use crate::support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::gateway::{admin, admin_items, wait_until, Gateway, DEPLOYMENT_TOKEN};

const REQUESTS: &str = "/api/v1/admin/requests";
const WORKERS: &str = "/api/v1/admin/workers";
/// How long the upstream waits, silent, for the gateway to close: far longer than the release
/// may take.
const UPSTREAM_PAUSE: Duration = Duration::from_secs(10);
/// How soon after the client leaves the request must be gone.
const RELEASE_WITHIN: Duration = Duration::from_secs(2);

fn active_requests(gw: &Gateway) -> Vec<Value> {
    admin_items(gw, REQUESTS)
}

fn active_capacity(gw: &Gateway) -> u64 {
    admin_items(gw, WORKERS)
        .iter()
        .map(|w| w["capacity"]["active"].as_u64().expect("capacity.active"))
        .sum()
}

/// An upstream that reads one request head and never answers; it reports when the gateway
/// closed the connection (EOF or reset), or that it did not within [`UPSTREAM_PAUSE`].
fn silent_upstream() -> (String, mpsc::Receiver<Option<Instant>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/slow", listener.local_addr().expect("addr"));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().expect("accept");
        conn.set_read_timeout(Some(UPSTREAM_PAUSE))
            .expect("timeout");
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        let closed = loop {
            match conn.read(&mut buf) {
                Ok(0) => break true,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
                Err(_) => break false,
            }
        };
        assert!(seen.starts_with(b"GET /slow HTTP/1.1\r\n"), "{seen:?}");
        let _ = tx.send(closed.then(Instant::now));
    });
    (url, rx)
}

/// How many io_uring instances process `pid` holds open (`anon_inode:[io_uring]` among its
/// descriptors): one per core when the cores run on io_uring, none on epoll.
fn io_uring_instances(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the gateway's descriptors")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy() == "anon_inode:[io_uring]")
        .count()
}

/// Whether this kernel lets processes create io_uring instances (`io_uring_disabled`, from
/// Linux 6.6; 0 allows everyone, and a kernel without the setting allows them too).
fn kernel_offers_io_uring() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").map_or(true, |v| v.trim() == "0")
}

#[test]
fn client_leaving_mid_request_releases_it_at_once() {
    let gw = Gateway::builder().cores(2).start();
    // The suite must test the driver production runs: where the kernel offers io_uring, the
    // cores run on it (a silent fall-back to epoll would test epoll twice).
    assert!(
        kernel_offers_io_uring(),
        "this kernel refuses io_uring: the suite cannot test it"
    );
    // The listeners accept before the cores have started: wait for the cores' rings, one per
    // core (a core that fell back to epoll alone would leave one missing).
    wait_until(
        Duration::from_secs(10),
        "both cores to run on io_uring, which the kernel offers",
        || io_uring_instances(gw.child.id()) == 2,
    );
    assert_release_on_departure(&gw);
}

/// The watch waits on a duplicate of the client's descriptor; with the epoll driver that
/// duplicate is registered separately, so both drivers are checked.
#[test]
fn client_leaving_is_noticed_with_the_epoll_driver_too() {
    let gw = Gateway::builder()
        .env("MONOIO_FORCE_LEGACY_DRIVER", "1")
        .start();
    assert_release_on_departure(&gw);
    // Checked once the cores have served a request: they run, and without io_uring.
    assert_eq!(io_uring_instances(gw.child.id()), 0, "epoll was forced");
}

fn assert_release_on_departure(gw: &Gateway) {
    let (url, upstream_closed) = silent_upstream();
    assert!(active_requests(gw).is_empty());

    let envelope = json!({"method": "GET", "url": url, "timeout_ms": 60000}).to_string();
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
        active_requests(gw).len() == 1
    });
    assert_eq!(active_capacity(gw), 1);

    let closed_at = Instant::now();
    drop(client);
    wait_until(RELEASE_WITHIN, "the request to be released", || {
        active_requests(gw).is_empty() && active_capacity(gw) == 0
    });
    println!("released {:?} after the client closed", closed_at.elapsed());
    let upstream_closed_at = upstream_closed
        .recv_timeout(UPSTREAM_PAUSE + Duration::from_secs(5))
        .expect("upstream report")
        .expect("the gateway left its upstream connection open");
    assert!(upstream_closed_at.duration_since(closed_at) < RELEASE_WITHIN);
    let metrics = admin(gw, "GET", "/metrics", &[], b"").text();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("sortie_requests_total{")
                && l.contains("outcome=\"cancelled\",ingress=\"api\"} 1")),
        "{metrics}"
    );
}
