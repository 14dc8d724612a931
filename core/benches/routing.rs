//! Benchmark: route selection on the per-request path, with 100 rules and 10, 1,000 and 10,000
//! workers; once with tags that narrow the candidates to at most 10 workers (target: at most
//! 2 µs at 10,000 workers), once with no hints (beyond 64 candidates the most room among a
//! sample, decision 117; at 10 the whole pool), once sticky (the
//! pinned worker), and once a new sticky session without hints: the rendezvous choice over the
//! whole pool (decision 097), whose baseline is `no_hints` in the same run. In the core crate:
//! it needs nothing else.
// A benchmark measures time: the clock rule of `core/clippy.toml` is for the library.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sortie_core::request::Host;
use sortie_core::routing::{
    Ingress, RouteHints, RouteRequest, RoutingTable, StickyPins, WorkerIndex,
};
use sortie_core::snapshot::{decode_snapshot, ConfigId, ValidatedSnapshot};
use sortie_core::worker::{AdvertisedCapabilities, Executor, WorkerRecord};

const RULES: usize = 100;
const GROUP_SIZE: usize = 10;

/// 99 rules whose host constraint the benchmark request does not match, evaluated (and
/// rejected) before the catch-all rule that selects: the worst case of rule scanning.
fn snapshot() -> Arc<ValidatedSnapshot> {
    let mut rules: Vec<String> = (0..RULES - 1)
        .map(|i| {
            format!(
                r#"{{"id":"site-{i}","priority":{i},"constraints":{{"host":"*.site{i}.test"}},"pools":["direct"],"sticky_session_ttl_seconds":600}}"#
            )
        })
        .collect();
    rules.push(
        r#"{"id":"catch-all","priority":1000,"pools":["direct"],"sticky_session_ttl_seconds":600}"#
            .into(),
    );
    let doc = format!(
        r#"{{"routing":{{"rules":[{}]}},"pools":[{{"id":"direct"}}]}}"#,
        rules.join(",")
    );
    let mut buf = doc.into_bytes();
    match decode_snapshot(&mut buf) {
        Ok(s) => Arc::new(s),
        Err(e) => panic!("benchmark snapshot is invalid: {e}"),
    }
}

/// Workers in groups of ten sharing a group tag; all are residential in the US.
fn workers(n: usize) -> Vec<WorkerRecord> {
    (0..n)
        .map(|i| {
            let caps = AdvertisedCapabilities {
                tags: vec!["residential".into(), format!("grp-{}", i / GROUP_SIZE)],
                country: Some("US".into()),
                capacity: 64,
                ..Default::default()
            }
            .validate();
            let (Ok(id), Ok(caps)) = (ConfigId::parse(&format!("w{i:05}")), caps) else {
                panic!("benchmark worker {i} is invalid");
            };
            WorkerRecord::connected(id, "session", Executor::Remote, caps)
        })
        .collect()
}

/// The destination of the benchmark's requests.
fn api_host() -> Host {
    Host::Domain("api.example.com".into())
}

/// The benchmark's request: an API request to a host the 99 site rules do not match.
fn request<'a>(hints: &'a RouteHints, host: &'a Host, tie_break: u64) -> RouteRequest<'a> {
    RouteRequest {
        deployment_id: "dep_default",
        hints,
        ingress: Ingress::Api,
        host,
        tie_break,
    }
}

fn bench_route(c: &mut Criterion) {
    let snap = snapshot();
    let host = api_host();
    let mut group = c.benchmark_group("route");
    group.throughput(Throughput::Elements(1));
    for n in [10, 1_000, 10_000] {
        let table = RoutingTable::build(snap.clone(), &workers(n));
        // Varied load so that capacity comparison does real work.
        let active: Vec<u32> = (0..n).map(|i| (i % 7) as u32).collect();
        let view = |w: WorkerIndex| active.get(w.as_usize()).copied().unwrap_or(0);
        let tagged = RouteHints {
            tags: vec![
                "residential".into(),
                format!("grp-{}", (n / GROUP_SIZE) / 2),
            ],
            ..Default::default()
        };
        let none = RouteHints::default();
        let sticky = RouteHints {
            sticky_session_id: Some("cart-42".into()),
            ..tagged.clone()
        };
        let new_sticky = RouteHints {
            sticky_session_id: Some("cart-42".into()),
            ..Default::default()
        };
        // (name, hints, how far the clock moves per request): past the rule's 600 s TTL, the
        // pin has expired at every request, which then routes as a new session.
        for (name, hints, step_ms) in [
            ("tags", &tagged, 0),
            ("no_hints", &none, 0),
            ("tags_sticky", &sticky, 0),
            ("no_hints_new_sticky", &new_sticky, 601_000),
        ] {
            let mut pins = StickyPins::default();
            let mut tie_break = 0u64;
            let mut now_ms = 1_000u64;
            group.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
                b.iter(|| {
                    tie_break = tie_break.wrapping_add(1);
                    now_ms = now_ms.wrapping_add(step_ms);
                    let req = request(hints, &host, tie_break);
                    black_box(table.route(black_box(&req), &mut pins, now_ms, &view))
                })
            });
        }
    }
    group.finish();
    print_ratios(&snap);
}

/// Nanoseconds per route of `hints` over about `budget`, the clock moving `step_ms` per route.
fn time_per_route(table: &RoutingTable, hints: &RouteHints, step_ms: u64, budget: Duration) -> f64 {
    let n = table.worker_count();
    let active: Vec<u32> = (0..n).map(|i| (i % 7) as u32).collect();
    let view = |w: WorkerIndex| active.get(w.as_usize()).copied().unwrap_or(0);
    let mut pins = StickyPins::default();
    let host = api_host();
    let (mut now_ms, mut calls) = (1_000u64, 0u64);
    let started = Instant::now();
    while started.elapsed() < budget {
        for _ in 0..16 {
            now_ms = now_ms.wrapping_add(step_ms);
            let req = request(hints, &host, calls);
            black_box(table.route(black_box(&req), &mut pins, now_ms, &view)).ok();
        }
        calls += 16;
    }
    started.elapsed().as_nanos() as f64 / calls as f64
}

/// A new sticky session (rendezvous over the whole pool, a pin written) against a request
/// without hints (most room over the whole pool) in the same run: five interleaved rounds per
/// size, the median round reported.
fn print_ratios(snap: &Arc<ValidatedSnapshot>) {
    println!("route, same run, 5 interleaved rounds of 200 ms each (median round):");
    let none = RouteHints::default();
    let new_sticky = RouteHints {
        sticky_session_id: Some("cart-42".into()),
        ..Default::default()
    };
    for n in [10, 1_000, 10_000] {
        let table = RoutingTable::build(snap.clone(), &workers(n));
        let budget = Duration::from_millis(200);
        let mut rounds: Vec<(f64, f64)> = (0..5)
            .map(|_| {
                let base = time_per_route(&table, &none, 0, budget);
                let sticky = time_per_route(&table, &new_sticky, 601_000, budget);
                (base, sticky)
            })
            .collect();
        rounds.sort_by(|a, b| (a.1 / a.0).total_cmp(&(b.1 / b.0)));
        let (base, sticky) = rounds[rounds.len() / 2];
        println!(
            "  {n:>5} workers: no hints {base:10.0} ns  new sticky session {sticky:10.0} ns  \
             ratio {:.2}x",
            sticky / base
        );
    }
}

criterion_group!(benches, bench_route);
criterion_main!(benches);
