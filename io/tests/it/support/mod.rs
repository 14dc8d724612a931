//! Shared fixtures of the io integration tests: loopback HTTP/1.1 upstreams whose behaviour each
//! test scripts (plain or TLS), a test CA, and helpers that run a future on a monoio runtime of
//! the driver the process would pick, with a hard bound.
//!
//! A test module imports it with `use crate::support;`. Not every module uses every fixture.

#![allow(dead_code, unreachable_pub)]

pub mod http_server;
pub mod nginx;
pub mod postgres;
pub mod proxies;
pub mod tls;
pub mod upstream;
pub mod wait;

use std::future::Future;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use sortie_core::destination::DestinationPolicy;
use sortie_core::error::{ApiError, ErrorCode};
use sortie_core::request::{parse_target_url, Method};
use sortie_io::dns::{Resolver, ResolverPool};
use sortie_io::egress::{client_config, Egress, EgressRequest, PoolLimits, Timeouts};
use sortie_io::runtime::{run_on, Driver};

/// Upper bound on any test body; reaching it means a hang, and fails the test instead.
pub const TEST_BOUND: Duration = Duration::from_secs(30);

/// Runs `fut` to completion on a fresh runtime of the detected driver (io_uring, or epoll with
/// `MONOIO_FORCE_LEGACY_DRIVER=1`), failing the test after [`TEST_BOUND`].
pub fn run<F: Future>(fut: F) -> F::Output {
    let mut out = None;
    run_on(Driver::detect(), async {
        match monoio::time::timeout(TEST_BOUND, fut).await {
            Ok(v) => out = Some(v),
            Err(_) => panic!("test did not finish within {TEST_BOUND:?}"),
        }
    });
    out.expect("the runtime ran the test to completion")
}

/// The process-wide resolver threads, started once for all tests of a file.
pub fn resolver() -> Resolver {
    static POOL: OnceLock<ResolverPool> = OnceLock::new();
    let pool = POOL.get_or_init(|| ResolverPool::start().expect("resolver threads start"));
    Resolver::new(pool.clone())
}

/// An egress client trusting the webpki roots and, optionally, a test CA file.
pub fn egress(ca_file: Option<&Path>) -> Egress {
    let tls = client_config(ca_file).expect("client TLS config builds");
    Egress::new(resolver(), &tls)
}

/// An egress client with the given pool limits.
pub fn egress_with_pool(ca_file: Option<&Path>, limits: PoolLimits) -> Egress {
    let tls = client_config(ca_file).expect("client TLS config builds");
    Egress::with_pool_limits(resolver(), &tls, limits)
}

/// The policy of tests: loopback IPv4 opened, everything else at its default.
pub fn loopback_policy() -> Arc<DestinationPolicy> {
    Arc::new(DestinationPolicy::new(
        vec!["127.0.0.0/8".parse().expect("cidr")],
        vec![],
    ))
}

/// Short stage limits so that timeout tests stay fast.
pub fn short_timeouts() -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(2),
        response_header: Some(Duration::from_secs(5)),
        idle: Duration::from_secs(5),
    }
}

/// A request to `url` under the loopback policy, due in 10 seconds, with short limits.
pub fn request(method: Method, url: &str) -> EgressRequest {
    let url = parse_target_url(url).expect("test URL parses");
    let mut req = EgressRequest::new(
        method,
        url,
        Instant::now() + Duration::from_secs(10),
        loopback_policy(),
    );
    req.timeouts = short_timeouts();
    req
}

/// The value of a response header (first occurrence, case-insensitive name).
pub fn header<'a>(headers: &'a sortie_io::egress::ResponseFields, name: &str) -> Option<&'a str> {
    std::str::from_utf8(headers.value(name.as_bytes())?).ok()
}

/// The value of an error detail.
pub fn detail<'a>(e: &'a ApiError, key: &str) -> Option<&'a str> {
    e.details
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Asserts the error's code and returns it for further checks.
#[track_caller]
pub fn expect_code(
    result: Result<sortie_io::egress::EgressResponse, ApiError>,
    code: ErrorCode,
) -> ApiError {
    match result {
        Ok(r) => panic!("expected {code}, got a {} response", r.status),
        Err(e) => {
            assert_eq!(e.code, code, "{e:?}");
            e
        }
    }
}

/// Waits until `cond` holds, checking between short pauses of the runtime, and fails the test
/// after `limit`. For conditions another thread makes true (an upstream closing a connection).
pub async fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < until,
            "condition not reached within {limit:?}"
        );
        monoio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A second loopback address for source-address tests.
pub fn loopback_alias() -> IpAddr {
    IpAddr::from([127, 0, 0, 2])
}

/// Set in the child process [`run_alone`] starts, to the test it runs.
const ALONE_ENV: &str = "SORTIE_TEST_ALONE";

/// Runs the test `name` (its path in this binary, e.g. `egress_h2::some_test`) in a child
/// process of this test binary, alone. `None` in that child: the caller runs its body there.
/// `Some(stderr)` in the parent, once the child ran exactly that one test and it passed. For
/// tests that install process-wide state (the fingerprinted connectors, installed once per
/// process with the first caller's CA) or measure the process itself.
pub fn run_alone(name: &str) -> Option<String> {
    if std::env::var_os(ALONE_ENV).is_some_and(|v| v == name) {
        return None;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(ALONE_ENV, name)
        .output()
        .expect("the test binary starts again");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "{name} failed alone:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("test result: ok. 1 passed"),
        "{name} did not run exactly one test:\n{stdout}"
    );
    Some(stderr.into_owned())
}
