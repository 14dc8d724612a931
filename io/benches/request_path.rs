//! Benchmark: one request API call through a control core's whole per-request path, with the
//! code the listener runs: `api::authenticate` (the deployment token) and `api::handle`
//! (decode and validate the envelope, route and assign a local worker, the egress exchange on
//! the core's pooled keep-alive connection, encode the result), on a monoio io_uring runtime.
//! The upstream is a loopback server on threads of its own answering 1 KiB; the baseline is
//! the same exchange written by hand on the same runtime (request head out, response in, on one
//! kept-alive connection), measured in the same run.
//!
//! Time is the benchmark thread's own CPU time (`/proc/thread-self/schedstat`: user and
//! kernel), so the upstream's threads are not counted and a regression of the gateway's code
//! shows without a load test. The run prints both paths and their difference, the gateway's
//! own cost per request beyond a bare exchange, and the allocations per request of each path
//! on the benchmark thread (a count that does not move with the machine's load).
//!
//! The counting allocator is the one `unsafe` of the benchmarks: a `GlobalAlloc` cannot be
//! written without it. It only forwards to the allocator the binary installs
//! (`sortie_io::alloc::Allocator`), so that the bench measures what ships.

#![allow(unsafe_code)]

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use monoio::io::{AsyncReadRent, AsyncWriteRentExt as _};
use sortie_core::config::Config;
use sortie_core::snapshot::decode_snapshot;
use sortie_core::worker::{AdvertisedCapabilities, Executor, WorkerRegistry};
use sortie_io::control::core::ActiveRequests;
use sortie_io::control::state::ControlState;
use sortie_io::dispatch::Dispatcher;
use sortie_io::dns::{Resolver, ResolverPool};
use sortie_io::egress::Egress;
use sortie_io::ingress::api;
use sortie_io::metrics::Metrics;
use sortie_io::tokens::Authenticator;

/// The allocator the `sortie` binary runs with, counting what the calling thread allocates.
#[global_allocator]
static GLOBAL: Counting = Counting;

thread_local! {
    /// Allocations (and reallocations) made by this thread, and their bytes.
    static ALLOCATED: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// mimalloc, counting each thread's allocations: the bench thread's count per request is a
/// figure that, unlike time, does not move with the machine's load.
struct Counting;

fn count(bytes: usize) {
    // `try_with`: nothing is counted while the thread's locals are being torn down.
    let _ = ALLOCATED.try_with(|c| {
        let (n, b) = c.get();
        c.set((n + 1, b + bytes as u64));
    });
}

/// This thread's allocations and bytes allocated so far.
fn allocated() -> (u64, u64) {
    ALLOCATED.with(std::cell::Cell::get)
}

// SAFETY: every method forwards its arguments unchanged to the same method of the shipped
// allocator, which upholds `GlobalAlloc`'s contract; counting touches only a thread-local `Cell`
// (const-initialised, so it never allocates).
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's guarantees for `alloc` hold for this forwarded call.
        unsafe { sortie_io::alloc::Allocator.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { sortie_io::alloc::Allocator.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from this allocator, that is from the shipped one, with `layout`.
        unsafe { sortie_io::alloc::Allocator.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: as for `dealloc`, and the caller's guarantees on `new_size` hold.
        unsafe { sortie_io::alloc::Allocator.realloc(ptr, layout, new_size) }
    }
}

const TOKEN: &str = "bench-token-0123456789abcdef";
const BODY_BYTES: usize = 1024;

/// The bench thread's CPU time so far (user and kernel), in nanoseconds.
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat")
        .expect("/proc/thread-self/schedstat (Linux with schedstats)");
    let ns: u64 = stat
        .split_whitespace()
        .next()
        .and_then(|f| f.parse().ok())
        .expect("a CPU time in schedstat");
    Duration::from_nanos(ns)
}

/// A keep-alive HTTP/1.1 server on loopback answering every request with 1 KiB, one thread per
/// connection.
fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the upstream");
    let addr = listener.local_addr().expect("upstream address");
    let mut response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {BODY_BYTES}\r\n\r\n"
    )
    .into_bytes();
    response.extend(std::iter::repeat_n(b'x', BODY_BYTES));
    let response: Arc<[u8]> = response.into();
    // Named threads, so that a profile of the benchmark tells the upstream's samples apart.
    let spawn = |f: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new()
            .name("upstream".into())
            .spawn(f)
            .expect("an upstream thread");
    };
    spawn(Box::new(move || {
        for conn in listener.incoming().flatten() {
            let response = response.clone();
            spawn(Box::new(move || serve(conn, &response)));
        }
    }));
    addr
}

fn serve(mut conn: TcpStream, response: &[u8]) {
    let _ = conn.set_nodelay(true);
    let mut buf = vec![0u8; 16 * 1024];
    let mut have = 0;
    loop {
        // Requests carry no body: each ends at its blank line.
        while let Some(end) = buf[..have].windows(4).position(|w| w == b"\r\n\r\n") {
            if conn.write_all(response).is_err() {
                return;
            }
            buf.copy_within(end + 4..have, 0);
            have -= end + 4;
        }
        match conn.read(&mut buf[have..]) {
            Ok(0) | Err(_) => return,
            Ok(n) => have += n,
        }
    }
}

/// A control core's request API context with one local worker and loopback destinations
/// allowed.
fn dispatcher() -> Dispatcher {
    let config = Config::from_toml(&format!(
        "[[deployments]]\nid = \"bench\"\ntoken = \"{TOKEN}\"\n\n\
         [admin]\ntoken = \"bench-admin-0123456789abcdef\"\n\n\
         [[workers]]\nid = \"local\"\ncapacity = 100000\n"
    ))
    .expect("bench config");
    let mut snapshot_json = br#"{"default_timeout_ms":60000,"routing":{"rules":[{"id":"default","priority":100,"constraints":{},"pools":["direct"],"sticky_session_ttl_seconds":0,"allow_sticky_fallback":true}]},"pools":[{"id":"direct"}],"destinations":{"allow":["127.0.0.0/8"],"deny":[]}}"#.to_vec();
    let snapshot = decode_snapshot(&mut snapshot_json).expect("bench snapshot");
    let mut registry = WorkerRegistry::new();
    let caps = AdvertisedCapabilities {
        capacity: 100_000,
        ..Default::default()
    }
    .validate()
    .expect("worker capabilities");
    registry
        .register("local", "local", Executor::Local, caps, 0)
        .expect("register the local worker");
    let state = Arc::new(ControlState::new(
        &config,
        Authenticator::new(&[("bench".into(), TOKEN.into())]),
        "bench-admin-0123456789abcdef".into(),
        registry,
        1,
        Arc::new(snapshot),
    ));
    let tls = sortie_io::egress::client_config(None).expect("TLS client config");
    let resolver = Resolver::new(ResolverPool::start().expect("resolver thread"));
    Dispatcher::new(
        state,
        Rc::new(ActiveRequests::default()),
        Rc::new(Egress::new(resolver, &tls)),
        Arc::new(Metrics::new(1)),
        0,
    )
}

fn bench_request_path(c: &mut Criterion) {
    let up = upstream();
    let mut rt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .enable_timer()
        .build()
        .expect("an io_uring runtime (the kernel must offer io_uring)");
    // The core's egress starts tasks of its own: it is built on the runtime.
    let ctx = rt.block_on(async { dispatcher() });
    let authorization = format!("Bearer {TOKEN}").into_bytes();
    let envelope = format!(r#"{{"method":"GET","url":"http://{up}/kib","timeout_ms":5000}}"#);
    let request_head = format!("GET /kib HTTP/1.1\r\nHost: {up}\r\n\r\n").into_bytes();
    let raw = rt.block_on(async { monoio::net::TcpStream::connect(up).await });
    let raw = std::cell::RefCell::new(Some(raw.expect("connect to the upstream")));

    // One API call; checked to be a 200 carrying the upstream's 200.
    let call = || async {
        let deployment = match api::authenticate(&ctx, Some(&authorization)) {
            Ok(d) => d,
            Err(a) => panic!("authentication failed: {}", a.status),
        };
        let answer = api::handle(
            &ctx,
            deployment,
            Some(b"application/json"),
            envelope.clone().into_bytes(),
        )
        .await;
        assert_eq!(
            answer.status,
            200,
            "{}",
            String::from_utf8_lossy(answer.document())
        );
    };
    // One bare exchange: the head out, the whole response in.
    let exchange = || async {
        let mut s = raw.borrow_mut().take().expect("the raw connection");
        let (r, _) = s.write_all(request_head.clone()).await;
        r.expect("write the request");
        let mut got = 0;
        let mut buf = Vec::with_capacity(8 * 1024);
        while got < BODY_BYTES + 64 {
            let (r, b) = s.read(buf).await;
            let n = r.expect("read the response");
            assert!(n > 0, "the upstream closed");
            got += n;
            buf = b;
            buf.clear();
        }
        *raw.borrow_mut() = Some(s);
    };
    // Warm the pool and the caches.
    rt.block_on(async {
        for _ in 0..200 {
            call().await;
            exchange().await;
        }
    });

    // The thread CPU of `n` API calls (or bare exchanges), one after the other.
    let cpu_of = |rt: &mut monoio::Runtime<monoio::time::TimeDriver<monoio::IoUringDriver>>,
                  n: u64,
                  api_path: bool|
     -> Duration {
        let start = thread_cpu();
        rt.block_on(async {
            for _ in 0..n {
                if api_path {
                    call().await;
                } else {
                    exchange().await;
                }
            }
        });
        thread_cpu() - start
    };
    let mut group = c.benchmark_group("request_path");
    group.throughput(Throughput::Elements(1));
    for (name, api_path) in [("api_1k_local_worker", true), ("bare_exchange_1k", false)] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| cpu_of(&mut rt, iters, api_path))
        });
    }
    group.finish();

    // Same run, interleaved rounds: the gateway's own CPU per request beyond a bare exchange.
    const N: u64 = 2_000;
    let mut per = |api_path: bool| cpu_of(&mut rt, N, api_path).as_nanos() as f64 / N as f64;
    let mut rounds: Vec<(f64, f64)> = (0..5).map(|_| (per(true), per(false))).collect();
    rounds.sort_by(|a, b| (a.0 - a.1).total_cmp(&(b.0 - b.1)));
    let (api_ns, bare_ns) = rounds[rounds.len() / 2];
    // Allocations per request of each path, on this thread (the gateway's work; the upstream's
    // threads are not counted).
    let mut allocs = |api_path: bool| {
        let before = allocated();
        cpu_of(&mut rt, N, api_path);
        let after = allocated();
        (
            (after.0 - before.0) as f64 / N as f64,
            (after.1 - before.1) as f64 / N as f64,
        )
    };
    let (api_allocs, bare_allocs) = (allocs(true), allocs(false));
    println!(
        "request_path, allocations per request on the gateway's thread: api {:.1} ({:.0} bytes), \
         bare exchange {:.1} ({:.0} bytes)",
        api_allocs.0, api_allocs.1, bare_allocs.0, bare_allocs.1
    );
    println!(
        "request_path, same run, 5 interleaved rounds of 2,000 (median round), thread CPU per \
         request: api {:.1} µs, bare exchange {:.1} µs, the gateway's own {:.1} µs ({:.2}x)",
        api_ns / 1000.0,
        bare_ns / 1000.0,
        (api_ns - bare_ns) / 1000.0,
        api_ns / bare_ns
    );
}

criterion_group!(benches, bench_request_path);
criterion_main!(benches);
