//! Integration tests of the per-core keep-alive pool: reuse proven by the upstream's connection
//! count, keys, caps, stale connections the upstream closed while idle, and the rule that only
//! a replayable request is sent again after a reused connection broke.

use crate::support;

use std::time::Duration;

use sortie_core::error::ErrorCode;
use sortie_core::request::Method;
use sortie_core::snapshot::ConfigId;
use sortie_io::egress::PoolLimits;
use support::upstream::{self, Options, Upstream};
use support::{detail, egress, egress_with_pool, expect_code, header, request, run, wait_until};

#[test]
fn keep_alive_reuses_one_connection() {
    let up = Upstream::start(upstream::echo());
    run(async {
        let egress = egress(None);
        for i in 0..5 {
            let resp = egress
                .execute(&request(Method::Get, &up.url(&format!("/{i}"))))
                .await
                .expect("response");
            assert_eq!(resp.is_connection_reused, i > 0);
            assert_eq!(header(&resp.headers, "x-conn-seq"), Some("0"));
            assert_eq!(header(&resp.headers, "x-req-seq"), Some(&*i.to_string()));
            if i > 0 {
                assert_eq!(resp.connect_ms, 0);
            }
        }
        assert_eq!(up.connections(), 1);
        assert_eq!(up.requests(), 5);
        assert_eq!(egress.idle_connections(), 1);
    });
}

#[test]
fn concurrent_requests_open_parallel_connections_and_pool_them() {
    let up = Upstream::start(upstream::slow_head(Duration::from_millis(50)));
    run(async {
        let egress = egress(None);
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let egress = egress.clone();
            let req = request(Method::Get, &up.url("/"));
            tasks.push(monoio::spawn(async move { egress.execute(&req).await }));
        }
        for t in tasks {
            t.await.expect("response");
        }
        assert_eq!(up.connections(), 4);
        assert_eq!(egress.idle_connections(), 4);
        // Reuse takes them one by one without opening more.
        for _ in 0..4 {
            let resp = egress
                .execute(&request(Method::Get, &up.url("/")))
                .await
                .expect("response");
            assert!(resp.is_connection_reused);
        }
        assert_eq!(up.connections(), 4);
    });
}

#[test]
fn pool_is_keyed_by_worker_and_capped() {
    // Slow enough that overlapping requests really overlap: a fast answer could complete the
    // first before the second starts, and the second would reuse its connection.
    let up = Upstream::start(upstream::slow_head(Duration::from_millis(20)));
    run(async {
        let limits = PoolLimits {
            max_idle_per_key: 1,
            ..PoolLimits::default()
        };
        let egress = egress_with_pool(None, limits);
        let mut a = request(Method::Get, &up.url("/"));
        a.worker_id = ConfigId::parse("worker-a").unwrap();
        let mut b = a.clone();
        b.worker_id = ConfigId::parse("worker-b").unwrap();
        egress.execute(&a).await.expect("a");
        let resp = egress.execute(&b).await.expect("b");
        // Another worker never gets worker-a's connection.
        assert!(!resp.is_connection_reused);
        assert_eq!(up.connections(), 2);
        assert_eq!(egress.idle_connections(), 2);
        assert!(
            egress
                .execute(&a)
                .await
                .expect("a again")
                .is_connection_reused
        );
        assert_eq!(up.connections(), 2);
        // Two overlapping requests of worker-a need two connections; only one stays pooled.
        let (first, second) = (egress.clone(), egress.clone());
        let (a1, a2) = (a.clone(), a.clone());
        let t1 = monoio::spawn(async move { first.execute(&a1).await });
        let t2 = monoio::spawn(async move { second.execute(&a2).await });
        t1.await.expect("a1");
        t2.await.expect("a2");
        assert_eq!(up.connections(), 3);
        assert_eq!(egress.idle_connections(), 2);
    });
}

#[test]
fn disabled_pool_keeps_nothing() {
    let up = Upstream::start(upstream::echo());
    run(async {
        let limits = PoolLimits {
            max_idle_total: 0,
            ..PoolLimits::default()
        };
        let egress = egress_with_pool(None, limits);
        for _ in 0..2 {
            let resp = egress
                .execute(&request(Method::Get, &up.url("/")))
                .await
                .expect("response");
            assert!(!resp.is_connection_reused);
        }
        assert_eq!(up.connections(), 2);
        assert_eq!(egress.idle_connections(), 0);
    });
}

#[test]
fn connection_closed_by_the_upstream_while_idle_is_not_reused() {
    let options = Options {
        idle_close_after: Some(Duration::from_millis(50)),
        ..Options::default()
    };
    let up = Upstream::start_with(upstream::echo(), options);
    run(async {
        let egress = egress(None);
        // Not replayable: the stale connection must be caught before sending, not by a retry.
        let req = request(Method::Post, &up.url("/"));
        assert!(!req.is_replayable);
        egress.execute(&req).await.expect("first response");
        assert_eq!(egress.idle_connections(), 1);
        wait_until(Duration::from_secs(5), || up.idle_closes() == 1).await;
        let resp = egress.execute(&req).await.expect("second response");
        assert!(!resp.is_connection_reused);
        assert_eq!(header(&resp.headers, "x-conn-seq"), Some("1"));
        assert_eq!(up.connections(), 2);
        assert_eq!(up.requests(), 2);
    });
}

#[test]
fn sweep_closes_connections_the_upstream_closed() {
    let options = Options {
        idle_close_after: Some(Duration::from_millis(50)),
        ..Options::default()
    };
    let up = Upstream::start_with(upstream::echo(), options);
    run(async {
        // Swept by hand only, to see each connection go.
        let limits = PoolLimits {
            sweep_interval: Duration::ZERO,
            ..PoolLimits::default()
        };
        let egress = egress_with_pool(None, limits);
        egress
            .execute(&request(Method::Get, &up.url("/")))
            .await
            .expect("response");
        assert_eq!(egress.sweep_idle(), 0);
        assert_eq!(egress.idle_connections(), 1);
        wait_until(Duration::from_secs(5), || up.idle_closes() == 1).await;
        assert_eq!(egress.sweep_idle(), 1);
        assert_eq!(egress.idle_connections(), 0);
    });
}

/// Nothing but the core's timer closes these: no request comes for their key, and nobody calls
/// the sweep. One expires, the other is closed by its upstream.
#[test]
fn the_core_timer_sweeps_idle_connections() {
    let closing = Upstream::start_with(
        upstream::echo(),
        Options {
            idle_close_after: Some(Duration::from_millis(50)),
            ..Options::default()
        },
    );
    let quiet = Upstream::start(upstream::echo());
    run(async {
        let limits = PoolLimits {
            idle_timeout: Duration::from_millis(200),
            ..PoolLimits::default()
        };
        let egress = egress_with_pool(None, limits);
        for up in [&closing, &quiet] {
            egress
                .execute(&request(Method::Get, &up.url("/")))
                .await
                .expect("response");
        }
        assert_eq!(egress.idle_connections(), 2);
        wait_until(Duration::from_secs(10), || egress.idle_connections() == 0).await;
    });
}

#[test]
fn expired_idle_connection_is_not_reused() {
    let up = Upstream::start(upstream::echo());
    run(async {
        let limits = PoolLimits {
            idle_timeout: Duration::from_millis(30),
            ..PoolLimits::default()
        };
        let egress = egress_with_pool(None, limits);
        let req = request(Method::Get, &up.url("/"));
        egress.execute(&req).await.expect("response");
        let pooled_at = std::time::Instant::now();
        wait_until(Duration::from_secs(5), || {
            pooled_at.elapsed() > Duration::from_millis(40)
        })
        .await;
        let resp = egress.execute(&req).await.expect("response");
        assert!(!resp.is_connection_reused);
        assert_eq!(up.connections(), 2);
    });
}

#[test]
fn replayable_request_is_retried_once_on_a_fresh_connection() {
    let up = Upstream::start(upstream::drop_later_requests());
    run(async {
        let egress = egress(None);
        let mut req = request(Method::Put, &up.url("/item"));
        req.body = bytes::Bytes::from_static(b"payload");
        req.is_replayable = true;
        egress.execute(&req).await.expect("first response");
        // The pooled connection looks healthy, but the upstream drops the next request on it.
        let resp = egress.execute(&req).await.expect("retried response");
        assert!(!resp.is_connection_reused);
        assert_eq!(header(&resp.headers, "x-conn-seq"), Some("1"));
        assert!(resp.body.ends_with(b"\r\n\r\npayload"));
        assert_eq!(up.connections(), 2);
        assert_eq!(up.requests(), 3);
    });
}

#[test]
fn non_replayable_request_is_not_retried() {
    let up = Upstream::start(upstream::drop_later_requests());
    run(async {
        let egress = egress(None);
        let req = request(Method::Post, &up.url("/charge"));
        egress.execute(&req).await.expect("first response");
        let e = expect_code(egress.execute(&req).await, ErrorCode::UpstreamReset);
        assert_eq!(detail(&e, "stage"), Some("response_header"));
        // The upstream saw the request once on the reused connection and nothing more.
        assert_eq!(up.connections(), 1);
        assert_eq!(up.requests(), 2);
    });
}

#[test]
fn extra_bytes_after_a_response_prevent_reuse() {
    let mut raw = upstream::response(200, &[], b"ok");
    raw.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nforge");
    let up = Upstream::start(upstream::fixed(raw));
    run(async {
        let egress = egress(None);
        let req = request(Method::Get, &up.url("/"));
        let resp = egress.execute(&req).await.expect("response");
        assert_eq!(resp.body, b"ok");
        assert_eq!(egress.idle_connections(), 0);
        let resp = egress.execute(&req).await.expect("response");
        assert_eq!(resp.body, b"ok");
        assert!(!resp.is_connection_reused);
    });
}
