//! Prometheus metrics: requests by deployment, ingress and outcome (request API and forward proxy),
//! ended tunnels and their bytes, stage latency histograms, active
//! requests, worker capacity and the config revision. Each core writes only its own shard (no
//! cross-core contention on the hot path); `/metrics` sums the shards.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sortie_core::routing::Ingress;

/// Upper bounds of the latency buckets, in milliseconds.
const BUCKETS_MS: [u64; 14] = [
    1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000,
];
/// The stages timed for every request.
pub const STAGES: [&str; 4] = ["routing", "assignment", "egress", "total"];

struct Histogram {
    buckets: [AtomicU64; BUCKETS_MS.len()],
    count: AtomicU64,
    sum_ms: AtomicU64,
}

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_ms: AtomicU64::new(0),
        }
    }

    fn observe(&self, ms: u64) {
        if let Some(i) = BUCKETS_MS.iter().position(|&b| ms <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ms.fetch_add(ms, Ordering::Relaxed);
    }
}

/// One request count of one core's shard: a (deployment, ingress, outcome) as
/// [`Metrics::counter`] finds it, shared with the core that counts into it
/// ([`CoreRecorder`]).
pub type Counter = Arc<AtomicU64>;

/// One deployment's request counts by (ingress, outcome).
type ByOutcome = sortie_core::FastMap<(Ingress, &'static str), Counter>;

struct Shard {
    /// Deployment → (ingress, outcome) → count; looked up by `&str`, so a known deployment
    /// allocates nothing.
    requests: Mutex<sortie_core::FastMap<String, ByOutcome>>,
    stages: [Histogram; 4],
    /// Tunnels ended, and the bytes they carried up (client to destination) and down.
    tunnels: [AtomicU64; 3],
    /// Response body bytes the forward proxy spliced socket to socket (decision 025).
    spliced: AtomicU64,
}

/// The gauges of one scrape, read from the control's state by its owner.
#[derive(Debug, Default)]
pub struct Gauges {
    /// Revision of the active configuration snapshot.
    pub revision: u64,
    /// Every registered worker.
    pub workers: Vec<WorkerGauge>,
    /// Health of every upstream proxy endpoint.
    pub proxy_endpoints: Vec<crate::egress::EndpointHealthView>,
}

/// One worker's gauges.
#[derive(Debug)]
pub struct WorkerGauge {
    /// The worker id.
    pub id: String,
    /// Requests in flight on it from this control.
    pub active: u32,
    /// Its capacity.
    pub capacity: u32,
    /// A connected remote worker's own load as its last heartbeat reported.
    pub reported: Option<u32>,
}

/// All metrics of the process.
pub struct Metrics {
    shards: Vec<Shard>,
}

impl Metrics {
    /// Metrics for `cores` cores.
    pub fn new(cores: usize) -> Metrics {
        Metrics {
            shards: (0..cores.max(1))
                .map(|_| Shard {
                    requests: Mutex::new(HashMap::default()),
                    stages: std::array::from_fn(|_| Histogram::new()),
                    tunnels: std::array::from_fn(|_| AtomicU64::new(0)),
                    spliced: AtomicU64::new(0),
                })
                .collect(),
        }
    }

    /// The count of requests of `deployment` by `ingress` with `outcome` on `core`'s shard,
    /// made at zero when there is none yet.
    pub fn counter(
        &self,
        core: usize,
        ingress: Ingress,
        deployment: &str,
        outcome: &'static str,
    ) -> Option<Counter> {
        let shard = self.shards.get(core % self.shards.len())?;
        let mut m = shard.requests.lock().unwrap_or_else(|p| p.into_inner());
        let by_outcome = match m.get_mut(deployment) {
            Some(by_outcome) => by_outcome,
            None => m.entry(deployment.to_string()).or_default(),
        };
        Some(Arc::clone(
            by_outcome.entry((ingress, outcome)).or_default(),
        ))
    }

    /// Adds one request's stage timings in ms (`[routing, assignment, egress, total]`) to
    /// `core`'s histograms.
    fn observe_stages(&self, core: usize, stages: [u64; 4]) {
        if let Some(shard) = self.shards.get(core % self.shards.len()) {
            for (h, v) in shard.stages.iter().zip(stages) {
                h.observe(v);
            }
        }
    }

    /// Records `bytes` of a relayed response body spliced socket to socket on `core`.
    pub fn record_spliced(&self, core: usize, bytes: u64) {
        if let Some(shard) = self.shards.get(core % self.shards.len()) {
            shard.spliced.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Records one ended CONNECT tunnel on `core` and the bytes it carried each way.
    pub fn record_tunnel(&self, core: usize, up: u64, down: u64) {
        let Some(shard) = self.shards.get(core % self.shards.len()) else {
            return;
        };
        for (c, v) in shard.tunnels.iter().zip([1, up, down]) {
            c.fetch_add(v, Ordering::Relaxed);
        }
    }

    /// Renders the Prometheus text format, the counters of every shard beside `gauges`.
    pub fn render(&self, gauges: &Gauges) -> String {
        let mut out = String::with_capacity(4096);
        let mut totals: HashMap<(String, &'static str, &'static str), u64> = HashMap::new();
        for s in &self.shards {
            for (dep, by_outcome) in s.requests.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                for ((ingress, outcome), v) in by_outcome {
                    *totals
                        .entry((dep.clone(), ingress.as_str(), *outcome))
                        .or_default() += v.load(Ordering::Relaxed);
                }
            }
        }
        let mut keys: Vec<_> = totals.into_iter().collect();
        keys.sort();
        out.push_str("# HELP sortie_requests_total Request API calls and proxied requests by deployment, outcome (ok or error code) and ingress (api, proxy: absolute-form, connect).\n# TYPE sortie_requests_total counter\n");
        for ((dep, ingress, outcome), n) in keys {
            let _ = writeln!(
                out,
                "sortie_requests_total{{deployment=\"{}\",outcome=\"{outcome}\",ingress=\"{ingress}\"}} {n}",
                escape(&dep)
            );
        }
        out.push_str("# HELP sortie_request_stage_seconds Request API latency by stage.\n# TYPE sortie_request_stage_seconds histogram\n");
        for (i, stage) in STAGES.iter().enumerate() {
            let mut cum = 0u64;
            for (b, bound) in BUCKETS_MS.iter().enumerate() {
                cum += self
                    .shards
                    .iter()
                    .map(|s| s.stages[i].buckets[b].load(Ordering::Relaxed))
                    .sum::<u64>();
                let _ = writeln!(
                    out,
                    "sortie_request_stage_seconds_bucket{{stage=\"{stage}\",le=\"{}\"}} {cum}",
                    *bound as f64 / 1000.0
                );
            }
            let count: u64 = self
                .shards
                .iter()
                .map(|s| s.stages[i].count.load(Ordering::Relaxed))
                .sum();
            let sum: u64 = self
                .shards
                .iter()
                .map(|s| s.stages[i].sum_ms.load(Ordering::Relaxed))
                .sum();
            let _ = writeln!(
                out,
                "sortie_request_stage_seconds_bucket{{stage=\"{stage}\",le=\"+Inf\"}} {count}"
            );
            let _ = writeln!(
                out,
                "sortie_request_stage_seconds_sum{{stage=\"{stage}\"}} {}",
                sum as f64 / 1000.0
            );
            let _ = writeln!(
                out,
                "sortie_request_stage_seconds_count{{stage=\"{stage}\"}} {count}"
            );
        }
        let tunnel = |i: usize| -> u64 {
            self.shards
                .iter()
                .map(|s| s.tunnels[i].load(Ordering::Relaxed))
                .sum()
        };
        let spliced: u64 = self
            .shards
            .iter()
            .map(|s| s.spliced.load(Ordering::Relaxed))
            .sum();
        out.push_str("# HELP sortie_proxy_spliced_bytes_total Response body bytes the forward proxy moved socket to socket.\n# TYPE sortie_proxy_spliced_bytes_total counter\n");
        let _ = writeln!(out, "sortie_proxy_spliced_bytes_total {spliced}");
        out.push_str("# HELP sortie_tunnels_total CONNECT tunnels that ended.\n# TYPE sortie_tunnels_total counter\n");
        let _ = writeln!(out, "sortie_tunnels_total {}", tunnel(0));
        out.push_str("# HELP sortie_tunnel_bytes_total Bytes carried by ended tunnels, up (client to destination) and down.\n# TYPE sortie_tunnel_bytes_total counter\n");
        let _ = writeln!(
            out,
            "sortie_tunnel_bytes_total{{direction=\"up\"}} {}",
            tunnel(1)
        );
        let _ = writeln!(
            out,
            "sortie_tunnel_bytes_total{{direction=\"down\"}} {}",
            tunnel(2)
        );
        out.push_str("# HELP sortie_config_revision Revision of the active configuration snapshot.\n# TYPE sortie_config_revision gauge\n");
        let _ = writeln!(out, "sortie_config_revision {}", gauges.revision);
        // The text format wants all samples of a family in one group after its TYPE line, so
        // the per-worker values are written family by family.
        let workers: Vec<(String, u32, u32, Option<u32>)> = gauges
            .workers
            .iter()
            .map(|w| (escape(&w.id), w.active, w.capacity, w.reported))
            .collect();
        let all_active: u64 = workers.iter().map(|(_, n, _, _)| u64::from(*n)).sum();
        out.push_str("# HELP sortie_worker_active_requests Requests in flight per worker.\n# TYPE sortie_worker_active_requests gauge\n");
        for (id, n, _, _) in &workers {
            let _ = writeln!(out, "sortie_worker_active_requests{{worker=\"{id}\"}} {n}");
        }
        out.push_str("# HELP sortie_worker_capacity Advertised capacity per worker.\n# TYPE sortie_worker_capacity gauge\n");
        for (id, _, max, _) in &workers {
            let _ = writeln!(out, "sortie_worker_capacity{{worker=\"{id}\"}} {max}");
        }
        // The heartbeat's load: a worker serving several controls counts all their requests,
        // where `sortie_worker_active_requests` counts this control's (decision 069).
        out.push_str("# HELP sortie_worker_reported_active_requests Requests in flight on a connected remote worker as its last heartbeat reported, across every control it serves.\n# TYPE sortie_worker_reported_active_requests gauge\n");
        for (id, _, _, reported) in &workers {
            if let Some(n) = reported {
                let _ = writeln!(
                    out,
                    "sortie_worker_reported_active_requests{{worker=\"{id}\"}} {n}"
                );
            }
        }
        out.push_str("# HELP sortie_active_requests Requests in flight.\n# TYPE sortie_active_requests gauge\n");
        let _ = writeln!(out, "sortie_active_requests {all_active}");
        render_proxy_endpoints(&mut out, &gauges.proxy_endpoints);
        out
    }
}

/// One core's way to record its finished requests: the ingress each came by, its outcome (`ok`
/// or the error code) and, for transported requests, the stage timings in ms (`[routing,
/// assignment, egress, total]`). It keeps the counter of the
/// (deployment, ingress, outcome) it counted last, so that a core serving one deployment's
/// requests counts each with one atomic add, without the shard's lock and its two hash
/// look-ups. Any other request looks its counter up as before and becomes the one kept.
pub struct CoreRecorder {
    metrics: Arc<Metrics>,
    core: usize,
    last: RefCell<Option<Last>>,
}

/// The counter a [`CoreRecorder`] counted into last, with what it counts.
struct Last {
    deployment: String,
    ingress: Ingress,
    outcome: &'static str,
    counter: Counter,
}

impl CoreRecorder {
    /// The recorder of `core`.
    pub fn new(metrics: Arc<Metrics>, core: usize) -> CoreRecorder {
        CoreRecorder {
            metrics,
            core,
            last: RefCell::new(None),
        }
    }

    /// Records one finished request on this recorder's core.
    pub fn record(
        &self,
        ingress: Ingress,
        deployment: &str,
        outcome: &'static str,
        stages: Option<[u64; 4]>,
    ) {
        let mut last = self.last.borrow_mut();
        match &mut *last {
            Some(l)
                if l.ingress == ingress && l.outcome == outcome && l.deployment == deployment =>
            {
                l.counter.fetch_add(1, Ordering::Relaxed);
            }
            other => {
                if let Some(counter) = self
                    .metrics
                    .counter(self.core, ingress, deployment, outcome)
                {
                    counter.fetch_add(1, Ordering::Relaxed);
                    match other {
                        // The name's buffer is kept: no allocation for a deployment that fits.
                        Some(l) => {
                            l.deployment.clear();
                            l.deployment.push_str(deployment);
                            l.ingress = ingress;
                            l.outcome = outcome;
                            l.counter = counter;
                        }
                        None => {
                            *other = Some(Last {
                                deployment: deployment.to_string(),
                                ingress,
                                outcome,
                                counter,
                            })
                        }
                    }
                }
            }
        }
        drop(last);
        if let Some(s) = stages {
            self.metrics.observe_stages(self.core, s);
        }
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The upstream proxy endpoint families (decision 071): ejections and failures counted since
/// the process started, and whether each endpoint is ejected now. Labels are the proxy id and
/// the endpoint URL, which never holds credentials.
fn render_proxy_endpoints(out: &mut String, endpoints: &[crate::egress::EndpointHealthView]) {
    type Field = fn(&crate::egress::EndpointHealthView) -> u64;
    let families: [(&str, &str, &str, Field); 3] = [
        (
            "sortie_upstream_proxy_ejections_total",
            "counter",
            "Times an upstream proxy endpoint was ejected after consecutive failures.",
            |e| e.ejections_total,
        ),
        (
            "sortie_upstream_proxy_failures_total",
            "counter",
            "Failures counted against an upstream proxy endpoint (unreachable, TLS, reset, timeout, malformed reply).",
            |e| e.failures_total,
        ),
        (
            "sortie_upstream_proxy_ejected",
            "gauge",
            "1 while an upstream proxy endpoint is ejected.",
            |e| u64::from(e.is_ejected),
        ),
    ];
    for (name, kind, help, value) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for e in endpoints {
            let _ = writeln!(
                out,
                "{name}{{proxy=\"{}\",endpoint=\"{}\"}} {}",
                escape(&e.proxy_id),
                escape(&e.endpoint),
                value(e)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(text: &str, deployment: &str, outcome: &str, ingress: &str) -> u64 {
        let series = format!(
            "sortie_requests_total{{deployment=\"{deployment}\",outcome=\"{outcome}\",ingress=\"{ingress}\"}} "
        );
        text.lines()
            .find_map(|l| l.strip_prefix(&series))
            .map_or(0, |n| n.parse().unwrap())
    }

    /// A core's recorder counts each request into its own (deployment, ingress, outcome), the
    /// one it kept or another, and the counts of every core add up.
    #[test]
    fn a_core_counts_each_request_where_it_belongs() {
        let metrics = Arc::new(Metrics::new(2));
        let first = CoreRecorder::new(Arc::clone(&metrics), 0);
        let second = CoreRecorder::new(Arc::clone(&metrics), 1);
        for _ in 0..3 {
            first.record(Ingress::Api, "alpha", "ok", Some([0, 1, 2, 3]));
        }
        first.record(Ingress::Api, "alphabet", "ok", None);
        first.record(Ingress::Api, "alpha", "route_no_match", None);
        first.record(Ingress::Proxy, "alpha", "ok", None);
        first.record(Ingress::Api, "alpha", "ok", None);
        second.record(Ingress::Api, "alpha", "ok", None);
        second.record(Ingress::Api, "beta", "ok", None);
        let text = metrics.render(&Gauges::default());
        assert_eq!(count(&text, "alpha", "ok", "api"), 5);
        assert_eq!(count(&text, "alphabet", "ok", "api"), 1);
        assert_eq!(count(&text, "alpha", "route_no_match", "api"), 1);
        assert_eq!(count(&text, "alpha", "ok", "proxy"), 1);
        assert_eq!(count(&text, "beta", "ok", "api"), 1);
        assert!(
            text.contains("sortie_request_stage_seconds_count{stage=\"total\"} 3"),
            "{text}"
        );
    }
}
