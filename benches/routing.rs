//! Benchmark: route selection on the per-request path, with 100 rules and 10, 1,000 and 10,000
//! workers; once with tags that narrow the candidates to at most 10 workers (target: at most
//! 2 µs at 10,000 workers), once with no hints (a scan of the whole pool), and once sticky.

use std::sync::Arc;

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
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

fn bench_route(c: &mut Criterion) {
    let snap = snapshot();
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
        for (name, hints) in [
            ("tags", &tagged),
            ("no_hints", &none),
            ("tags_sticky", &sticky),
        ] {
            let mut pins = StickyPins::default();
            let mut tie_break = 0u64;
            group.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
                b.iter(|| {
                    tie_break = tie_break.wrapping_add(1);
                    let req = RouteRequest {
                        deployment_id: "dep_default",
                        hints,
                        ingress: Ingress::Api,
                        host: "api.example.com",
                        tie_break,
                    };
                    black_box(table.route(black_box(&req), &mut pins, 1_000, &view))
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_route);
criterion_main!(benches);
