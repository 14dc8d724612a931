//! Integration tests of egress through upstream proxies against real proxies on loopback:
//! squid (HTTP `CONNECT` with Basic authentication) and dante (SOCKS5 with RFC 1929
//! username/password). The rendered username is read back from each proxy's own log.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sortie_core::destination::DestinationPolicy;
use sortie_core::error::{ApiError, ErrorCode};
use sortie_core::provider_session::{ProviderSession, ProviderSessionInputs};
use sortie_core::request::Method;
use sortie_core::snapshot::{decode_snapshot, TemplateValues};
use sortie_core::upstream_proxy::OutlierPolicy;
use sortie_io::egress::{
    Egress, EgressRequest, EgressResponse, HealthRegistry, ProxyPool, ProxyRoute,
};
use support::proxies::{free_port, wait_for_log, Dante, Squid};
use support::tls::TestCa;
use support::upstream::{self, Options, Upstream};
use support::{detail, egress, expect_code, request, run};

/// The upstream proxy of a one-pool snapshot with the given `upstream_proxy` JSON object.
fn proxy_pool(
    upstream_proxy: &str,
    health: &HealthRegistry,
    outlier: OutlierPolicy,
) -> Arc<ProxyPool> {
    let mut json = format!(
        r#"{{"routing":{{"rules":[]}},"pools":[{{"id":"p","upstream_proxy":{upstream_proxy}}}]}}"#
    )
    .into_bytes();
    let snapshot = decode_snapshot(&mut json).expect("test snapshot is valid");
    let proxy = snapshot
        .pool("p")
        .and_then(|(_, p)| p.upstream_proxy())
        .expect("pool p has an upstream proxy");
    Arc::new(ProxyPool::build(proxy, health, outlier))
}

/// [`proxy_pool`] with the default outlier policy.
fn pool(upstream_proxy: &str, health: &HealthRegistry) -> Arc<ProxyPool> {
    proxy_pool(upstream_proxy, health, OutlierPolicy::default())
}

fn route(pool: &Arc<ProxyPool>, country: &str, session: &str) -> ProxyRoute {
    pool.route(
        &TemplateValues {
            country,
            session,
            ..TemplateValues::default()
        },
        None,
    )
    .expect("username renders")
}

fn via(method: Method, url: &str, route: &ProxyRoute) -> EgressRequest {
    let mut req = request(method, url);
    req.via = Some(route.clone());
    req
}

/// An `upstream_proxy` object with credentials: one endpoint (`url`) or several (`urls`).
fn with_auth(id: &str, urls: &[&str], username_template: &str, password: &str) -> String {
    let endpoints = match urls {
        [one] => format!(r#""url":"{one}""#),
        many => format!(r#""urls":{many:?}"#),
    };
    format!(
        r#"{{"id":"{id}",{endpoints},"username_template":"{username_template}","password":"{password}"}}"#
    )
}

/// A `GET url` through `route`.
async fn get(egress: &Egress, url: &str, route: &ProxyRoute) -> Result<EgressResponse, ApiError> {
    egress.execute(&via(Method::Get, url, route)).await
}

/// A `GET url` through `route` whose error must be `upstream_proxy_failure`.
async fn proxy_failure(egress: &Egress, url: &str, route: &ProxyRoute) -> ApiError {
    expect_code(
        get(egress, url, route).await,
        ErrorCode::UpstreamProxyFailure,
    )
}

/// An egress that keeps no idle connection: every request chooses an endpoint.
fn unpooled_egress() -> Egress {
    support::egress_with_pool(
        None,
        sortie_io::egress::PoolLimits {
            max_idle_per_key: 0,
            ..Default::default()
        },
    )
}

/// The destinations behind the proxies: a plain echo and a TLS echo with its test CA.
struct Destinations {
    ca: TestCa,
    plain: Upstream,
    secure: Upstream,
}

fn destinations() -> Destinations {
    let ca = TestCa::new();
    let secure = Upstream::start_with(
        upstream::echo(),
        Options {
            tls: Some(ca.localhost_config()),
            ..Options::default()
        },
    );
    Destinations {
        ca,
        plain: Upstream::start(upstream::echo()),
        secure,
    }
}

#[test]
fn squid_carries_http_and_https_with_the_rendered_username() {
    let squid = Squid::start(&[("cust-US-sess-s1", "pw1")]);
    let Destinations { ca, plain, secure } = destinations();
    let health = HealthRegistry::default();
    let template = "cust-{country}-sess-{session}";
    let proxy = with_auth("sq", &[&squid.url()], template, "pw1");
    let r = route(&pool(&proxy, &health), "US", "s1");
    run(async {
        let egress = egress(Some(ca.ca_file()));
        let resp = get(&egress, &plain.url("/plain"), &r)
            .await
            .expect("http through squid");
        assert_eq!(resp.status, 200);
        assert!(resp.body.starts_with(b"GET /plain HTTP/1.1\r\n"));
        assert_eq!(resp.peer_addr.port(), squid.port(), "the peer is the proxy");
        // The tunnel is pooled under (endpoint, username, destination).
        let again = get(&egress, &plain.url("/again"), &r)
            .await
            .expect("reused");
        assert!(again.is_connection_reused);
        for host in ["localhost", "127.0.0.1"] {
            let resp = get(&egress, &secure.https_url(host, "/tls"), &r)
                .await
                .unwrap_or_else(|e| panic!("https {host} through squid: {e:?}"));
            assert_eq!(resp.status, 200);
            let want = format!("GET /tls HTTP/1.1\r\nHost: {host}:{}\r\n", secure.port());
            assert!(resp.body.starts_with(want.as_bytes()), "{host}");
        }
        drop(egress);
    });
    assert_eq!(plain.connections(), 1);
    // squid logs a CONNECT when its tunnel closes: the dropped client closed all three.
    wait_for_log(&squid.access_log(), "three CONNECT lines", |t| {
        t.matches(" CONNECT ").count() == 3
    });
    let connects = squid.connects();
    assert!(
        connects.iter().all(|(user, _)| user == "cust-US-sess-s1"),
        "{connects:?}"
    );
    // Decision 070: the gateway resolved the names and asked for the checked address.
    let log = std::fs::read_to_string(squid.access_log()).unwrap();
    assert!(!log.contains("localhost"), "{log}");
}

#[test]
fn two_sessions_never_share_a_connection_and_one_session_keeps_its_username() {
    let squid = Squid::start(&[("u-a", "pw"), ("u-b", "pw")]);
    let up = Upstream::start(upstream::echo());
    let health = HealthRegistry::default();
    let pool = pool(
        &with_auth("sq", &[&squid.url()], "u-{session}", "pw"),
        &health,
    );
    let (a, b) = (route(&pool, "", "a"), route(&pool, "", "b"));
    run(async {
        let egress = egress(None);
        for (i, r) in [&a, &b, &a, &b].into_iter().enumerate() {
            let resp = get(&egress, &up.url("/"), r).await.expect("through squid");
            assert_eq!(resp.is_connection_reused, i >= 2, "request {i}");
        }
        assert_eq!(egress.idle_connections(), 2);
        drop(egress);
    });
    assert_eq!(up.connections(), 2);
    wait_for_log(&squid.access_log(), "two CONNECT lines", |t| {
        t.matches(" CONNECT ").count() == 2
    });
    let mut users: Vec<String> = squid.connects().into_iter().map(|(u, _)| u).collect();
    users.sort();
    assert_eq!(users, ["u-a", "u-b"]);
}

#[test]
fn squid_failures_map_to_upstream_proxy_failure() {
    let squid = Squid::start(&[("user", "right")]);
    let up = Upstream::start(upstream::echo());
    let never = Upstream::start(upstream::echo());
    let health = HealthRegistry::default();
    let wrong = pool(&with_auth("sq", &[&squid.url()], "user", "wrong"), &health);
    let right = pool(&with_auth("sq", &[&squid.url()], "user", "right"), &health);
    let down = pool(
        &format!(
            r#"{{"id":"down","url":"http://127.0.0.1:{}"}}"#,
            free_port()
        ),
        &health,
    );
    // A loopback HTTP server that answers every request, CONNECT included, with 502.
    let bad_gateway = Upstream::start(upstream::fixed(upstream::response(502, &[], b"no")));
    let answers_502 = pool(
        &format!(
            r#"{{"id":"gw","url":"http://127.0.0.1:{}"}}"#,
            bad_gateway.port()
        ),
        &health,
    );
    run(async {
        let egress = egress(None);
        let e = proxy_failure(&egress, &up.url("/"), &route(&wrong, "", "")).await;
        assert_eq!(e.upstream_status, Some(407));
        assert_eq!(detail(&e, "fact"), Some("proxy_auth"));
        assert_eq!(e.http_status(), 502);

        let e = proxy_failure(&egress, &up.url("/"), &route(&down, "", "")).await;
        assert_eq!(detail(&e, "fact"), Some("proxy_connect"));
        assert_eq!(e.upstream_status, None);

        let e = proxy_failure(&egress, &up.url("/"), &route(&answers_502, "", "")).await;
        assert_eq!(e.upstream_status, Some(502));
        assert_eq!(detail(&e, "fact"), Some("proxy_tunnel"));

        // squid itself refusing the tunnel: the destination port is closed.
        let closed = format!("http://127.0.0.1:{}/", free_port());
        let e = proxy_failure(&egress, &closed, &route(&right, "", "")).await;
        assert_eq!(detail(&e, "fact"), Some("proxy_tunnel"));
        assert!(
            e.upstream_status.is_some_and(|s| s >= 500),
            "{:?}",
            e.upstream_status
        );
        // The message and details never carry the credentials.
        let text = format!("{e:?}");
        assert!(!text.contains("right") && !text.contains("user"), "{text}");

        // A destination the policy denies never reaches the proxy.
        let mut req = via(Method::Get, &never.url("/"), &route(&right, "", ""));
        req.policy = Arc::new(DestinationPolicy::default());
        expect_code(egress.execute(&req).await, ErrorCode::DestinationDenied);
    });
    let lines = std::fs::read_to_string(squid.access_log()).unwrap_or_default();
    assert!(!lines.contains(&format!(":{} ", never.port())), "{lines}");
    assert_eq!(never.connections(), 0);
}

#[test]
fn a_failing_endpoint_is_ejected_and_comes_back() {
    let users = [("u", "pw")];
    let live = Squid::start(&users);
    let dead_port = free_port();
    let up = Upstream::start(upstream::echo());
    let health = HealthRegistry::default();
    let outlier = OutlierPolicy {
        consecutive_failures: 2,
        base_ejection_ms: 1_500,
        max_ejection_ms: 10_000,
    };
    let dead_url = format!("http://127.0.0.1:{dead_port}");
    let pool = proxy_pool(
        &with_auth("pair", &[&dead_url, &live.url()], "u", "pw"),
        &health,
        outlier,
    );
    let r = route(&pool, "", "");
    let endpoint = |url: &str| {
        health
            .view(0)
            .into_iter()
            .find(|v| v.endpoint == url)
            .expect("endpoint health")
    };
    run(async {
        // No pooling: every request chooses an endpoint.
        let egress = unpooled_egress();
        let mut failures = 0;
        for _ in 0..4 {
            match get(&egress, &up.url("/"), &r).await {
                Ok(resp) => assert_eq!(resp.status, 200),
                Err(e) => {
                    assert_eq!(detail(&e, "fact"), Some("proxy_connect"));
                    failures += 1;
                }
            }
        }
        // Round robin sent every other request to the dead endpoint until it was ejected.
        assert_eq!(failures, 2);
        assert_eq!(endpoint(&dead_url).ejections_total, 1);
        let ejected_at = Instant::now();
        for _ in 0..6 {
            let resp = get(&egress, &up.url("/"), &r)
                .await
                .expect("only the live endpoint is chosen while the other is ejected");
            assert_eq!(resp.status, 200);
        }
        // The endpoint comes back by itself: once the ejection ran out it is tried again,
        // and now a squid listens there.
        let revived = Squid::start_on(dead_port, &users);
        support::wait_until(Duration::from_secs(10), || {
            ejected_at.elapsed() >= Duration::from_millis(1_600)
        })
        .await;
        for _ in 0..4 {
            let resp = get(&egress, &up.url("/"), &r)
                .await
                .expect("both endpoints serve");
            assert_eq!(resp.status, 200);
        }
        drop(egress);
        wait_for_log(
            &revived.access_log(),
            "CONNECT through the revived endpoint",
            |t| t.contains(" CONNECT "),
        );
    });
    assert_eq!(endpoint(&dead_url).ejections_total, 1);
    assert_eq!(endpoint(&dead_url).failures_total, 2);
}

#[test]
fn dante_carries_http_and_https_with_the_rendered_username() {
    let dante = Dante::start(&[("st-s1", "pw1")]);
    let Destinations { ca, plain, secure } = destinations();
    let health = HealthRegistry::default();
    for scheme in ["socks5", "socks5h"] {
        let url = format!("{scheme}://127.0.0.1:{}", dante.port());
        let proxy = with_auth("dt", &[&url], "st-{session}", "pw1");
        let r = route(&pool(&proxy, &health), "", "s1");
        run(async {
            let egress: Egress = egress(Some(ca.ca_file()));
            let resp = get(&egress, &plain.url("/socks"), &r)
                .await
                .unwrap_or_else(|e| panic!("{scheme} http: {e:?}"));
            assert_eq!(resp.status, 200);
            let resp = get(&egress, &secure.https_url("localhost", "/s"), &r)
                .await
                .unwrap_or_else(|e| panic!("{scheme} https: {e:?}"));
            assert_eq!(resp.status, 200);
            assert!(resp.body.starts_with(b"GET /s HTTP/1.1\r\n"));
        });
    }
    let log = wait_for_log(&dante.log(), "four passed connections", |t| {
        t.matches("tcp/connect").count() >= 4
    });
    assert_eq!(dante.users(), ["st-s1"; 4], "{log}");
}

#[test]
fn dante_failures_map_to_upstream_proxy_failure() {
    let dante = Dante::start(&[("st-f1", "right")]);
    let up = Upstream::start(upstream::echo());
    let health = HealthRegistry::default();
    let url = format!("socks5://127.0.0.1:{}", dante.port());
    let pool = |password: &str| pool(&with_auth("dt", &[&url], "st-f1", password), &health);
    let (wrong, right) = (pool("wrong"), pool("right"));
    run(async {
        let egress = egress(None);
        let e = proxy_failure(&egress, &up.url("/"), &route(&wrong, "", "")).await;
        assert_eq!(detail(&e, "fact"), Some("proxy_auth"));
        assert_eq!(e.upstream_status, None);
        let closed = format!("http://127.0.0.1:{}/", free_port());
        let e = proxy_failure(&egress, &closed, &route(&right, "", "")).await;
        assert_eq!(detail(&e, "fact"), Some("proxy_tunnel"));
        assert!(detail(&e, "socks_reply").is_some(), "{e:?}");
    });
}

#[test]
fn https_proxies_carry_http_and_https_and_are_verified() {
    let Destinations { ca, plain, secure } = destinations();
    let (cert, key) = ca.leaf_pem(&["localhost", "127.0.0.1"]);
    let squid = Squid::start_tls(&[("tls-user", "pw")], &cert, &key);
    let health = HealthRegistry::default();
    let url = format!("https://localhost:{}", squid.port());
    let r = route(
        &pool(&with_auth("sq", &[&url], "tls-user", "pw"), &health),
        "",
        "",
    );
    run(async {
        let egress = egress(Some(ca.ca_file()));
        let resp = get(&egress, &plain.url("/p"), &r)
            .await
            .expect("http through an https proxy");
        assert_eq!(resp.status, 200);
        // TLS to the destination inside TLS to the proxy.
        let resp = get(&egress, &secure.https_url("localhost", "/s"), &r)
            .await
            .expect("https through an https proxy");
        assert_eq!(resp.status, 200);
        assert!(resp.body.starts_with(b"GET /s HTTP/1.1\r\n"));
        let again = get(&egress, &secure.https_url("localhost", "/s2"), &r)
            .await
            .expect("pooled");
        assert!(again.is_connection_reused);
        drop(egress);
        // Without the CA the proxy's certificate is refused: the TLS failure is the proxy's.
        let untrusting = support::egress(None);
        let e = proxy_failure(&untrusting, &plain.url("/"), &r).await;
        assert_eq!(detail(&e, "fact"), Some("proxy_tls"));
    });
    wait_for_log(&squid.access_log(), "two CONNECT lines", |t| {
        t.matches(" CONNECT ").count() == 2
    });
    assert!(squid.connects().iter().all(|(u, _)| u == "tls-user"));
}

#[test]
fn a_session_keeps_its_endpoint() {
    let users = [("s-a", "pw"), ("s-b", "pw"), ("s-c", "pw"), ("s-d", "pw")];
    let (one, two) = (Squid::start(&users), Squid::start(&users));
    let up = Upstream::start(upstream::echo());
    let health = HealthRegistry::default();
    let pool = pool(
        &with_auth("pair", &[&one.url(), &two.url()], "s-{session}", "pw"),
        &health,
    );
    let sessions = ["a", "b", "c", "d"];
    run(async {
        let egress = unpooled_egress();
        for _ in 0..3 {
            for s in sessions {
                let r = session_route(&pool, s);
                let resp = get(&egress, &up.url("/"), &r)
                    .await
                    .expect("through a squid");
                assert_eq!(resp.status, 200);
            }
        }
    });
    wait_for_log(&one.access_log(), "CONNECT lines", |_| {
        one.connects().len() + two.connects().len() == 12
    });
    // Each session's three requests all went to one endpoint.
    for s in sessions {
        let user = format!("s-{s}");
        let (n1, n2) = (
            one.connects().iter().filter(|(u, _)| *u == user).count(),
            two.connects().iter().filter(|(u, _)| *u == user).count(),
        );
        assert!(
            (n1, n2) == (3, 0) || (n1, n2) == (0, 3),
            "{user}: {n1} + {n2}"
        );
    }
}

/// A route with a provider session derived from `sticky` (so the endpoint is chosen by it) and
/// `{session}` rendered as `sticky` itself (so the squid log shows which session it was).
fn session_route(pool: &Arc<ProxyPool>, sticky: &str) -> ProxyRoute {
    let session = ProviderSession::derive(&ProviderSessionInputs {
        deployment_id: "d",
        pool_id: "p",
        upstream_proxy_id: "pair",
        country: None,
        region: None,
        ip_type: None,
        sticky_session_id: sticky,
    });
    pool.route(
        &TemplateValues {
            session: sticky,
            ..TemplateValues::default()
        },
        Some(session),
    )
    .expect("username renders")
}
