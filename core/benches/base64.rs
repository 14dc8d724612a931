//! Benchmark: base64 encoding of a response body into the result envelope: the `base64` crate
//! (zero-filled room, then `encode_slice`: the first encoder), `base64-simd` (`encode_append`
//! into spare capacity: the second, and the one used on a CPU without AVX-512 VBMI) and
//! `sortie-b64` (the one used now: AVX-512 VBMI blocks where the CPU has them, AVX2 blocks
//! elsewhere on x86-64), at 16, 29 (a date) and 60 bytes (header values, each encoded on its
//! own), 1 KiB, 64 KiB and 1 MiB, plus the whole
//! result envelope at 64 KiB. After the criterion groups it prints, per size, the time of each
//! encoder and their ratios, measured in interleaved rounds of the same run.
// A benchmark measures time: the clock rule of `core/clippy.toml` is for the library.
#![allow(clippy::disallowed_methods)]
use std::time::{Duration, Instant};

use base64::Engine as _;
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sortie_core::result::{RequestResult, ResultBody, Timing};

/// A short header value, a long one, and bodies.
const SIZES: &[(&str, usize)] = &[
    ("16", 16),
    ("29", 29),
    ("60", 60),
    ("1k", 1024),
    ("64k", 64 * 1024),
    ("1m", 1024 * 1024),
];

/// Deterministic bytes that are not one repeated value.
fn body(len: usize) -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// The encoder used before: room zero-filled by `resize`, then encoded into it.
fn encode_base64_crate(out: &mut Vec<u8>, data: &[u8]) {
    let start = out.len();
    let len = base64::encoded_len(data.len(), true).unwrap_or(0);
    out.resize(start + len, 0);
    let written = base64::engine::general_purpose::STANDARD
        .encode_slice(data, &mut out[start..])
        .unwrap_or(0);
    out.truncate(start + written);
}

/// The encoder used before, and still on a CPU with neither AVX-512 VBMI nor AVX2: SIMD,
/// appended into spare capacity.
fn encode_base64_simd(out: &mut Vec<u8>, data: &[u8]) {
    sortie_b64::encode_append_portable(data, out);
}

/// The encoder used now.
fn encode_sortie_b64(out: &mut Vec<u8>, data: &[u8]) {
    sortie_b64::encode_append(data, out);
}

/// Each call encodes into a fresh buffer, as the envelope does per response.
fn run(encode: fn(&mut Vec<u8>, &[u8]), data: &[u8]) -> usize {
    let mut out = Vec::with_capacity(data.len() / 3 * 4 + 64);
    encode(&mut out, data);
    out.len()
}

fn result_json(data: &[u8]) -> Vec<u8> {
    let headers: &[(&[u8], &[u8])] = &[
        (b"Server", b"nginx"),
        (b"Content-Type", b"application/octet-stream"),
        (b"Content-Length", b"65536"),
    ];
    RequestResult {
        request_id: "req_0123456789abcdef",
        status: 200,
        headers,
        header_names_are_tokens: true,
        body: ResultBody::Inline(data),
        timing: Timing::default(),
    }
    .to_json()
}

fn bench(c: &mut Criterion) {
    // Both encoders must agree before either is timed.
    for (_, len) in SIZES {
        let data = body(*len);
        let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
        encode_base64_crate(&mut a, &data);
        encode_base64_simd(&mut b, &data);
        encode_sortie_b64(&mut c, &data);
        assert!(a == b && a == c, "the encoders disagree at {len} bytes");
    }
    let mut g = c.benchmark_group("base64_encode");
    for (name, len) in SIZES {
        let data = body(*len);
        g.throughput(Throughput::Bytes(*len as u64));
        g.bench_with_input(BenchmarkId::new("base64", name), &data, |b, d| {
            b.iter(|| black_box(run(encode_base64_crate, black_box(d))))
        });
        g.bench_with_input(BenchmarkId::new("base64_simd", name), &data, |b, d| {
            b.iter(|| black_box(run(encode_base64_simd, black_box(d))))
        });
        g.bench_with_input(BenchmarkId::new("sortie_b64", name), &data, |b, d| {
            b.iter(|| black_box(run(encode_sortie_b64, black_box(d))))
        });
    }
    g.finish();
    let data = body(64 * 1024);
    let mut g = c.benchmark_group("result_envelope");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.bench_function("to_json_64k", |b| {
        b.iter(|| black_box(result_json(black_box(&data)).len()))
    });
    g.finish();
    print_ratios();
}

/// Nanoseconds per call of `encode` on `data`, over about `budget`.
fn time_per_call(encode: fn(&mut Vec<u8>, &[u8]), data: &[u8], budget: Duration) -> f64 {
    let started = Instant::now();
    let mut calls = 0u64;
    while started.elapsed() < budget {
        for _ in 0..16 {
            black_box(run(encode, black_box(data)));
        }
        calls += 16;
    }
    started.elapsed().as_nanos() as f64 / calls as f64
}

/// The encoders in the same run: five interleaved rounds per size, the median round (by the
/// ratio of `sortie-b64` to `base64-simd`) reported, so a change in the machine's load between
/// them does not decide it.
fn print_ratios() {
    println!(
        "base64 encode, same run, 5 interleaved rounds of 200 ms each (median round; sortie-b64 \
         uses its {} encoder on this CPU):",
        sortie_b64::encoders().last().map_or("?", |(name, _)| *name)
    );
    for (name, len) in SIZES {
        let data = body(*len);
        let mut rounds: Vec<[f64; 3]> = (0..5)
            .map(|_| {
                let budget = Duration::from_millis(200);
                [
                    time_per_call(encode_base64_crate, &data, budget),
                    time_per_call(encode_base64_simd, &data, budget),
                    time_per_call(encode_sortie_b64, &data, budget),
                ]
            })
            .collect();
        rounds.sort_by(|a, b| (a[1] / a[2]).total_cmp(&(b[1] / b[2])));
        let [crate_ns, simd_ns, b64_ns] = rounds[rounds.len() / 2];
        let mib_s = |ns: f64| *len as f64 / ns * 1e9 / (1024.0 * 1024.0);
        println!(
            "  {name:>3}: base64 {crate_ns:9.0} ns ({:7.0} MiB/s)  base64-simd {simd_ns:9.0} ns ({:7.0} MiB/s)  \
             sortie-b64 {b64_ns:9.0} ns ({:7.0} MiB/s)  sortie-b64 over base64-simd {:.2}x",
            mib_s(crate_ns),
            mib_s(simd_ns),
            mib_s(b64_ns),
            simd_ns / b64_ns
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
