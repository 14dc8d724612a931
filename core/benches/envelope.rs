//! Benchmark: decode + validate request envelopes with simd-json (the production path) and with
//! serde_json on the same types: the smallest useful envelope, ~1 KiB with 10 headers, and a
//! 1 MiB inline body.
use base64::Engine as _;
use criterion::{
    black_box, criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput,
};
use sortie_core::request::{decode_request, validate, RequestEnvelope, ValidationContext};

const PROFILES: &[&str] = &["chrome_131", "firefox_133"];

fn ctx() -> ValidationContext<'static> {
    ValidationContext {
        max_inline_request_body_bytes: 2 * 1024 * 1024,
        max_timeout_ms: 120_000,
        default_timeout_ms: 60_000,
        is_object_storage_enabled: true,
        fingerprint_profiles: PROFILES,
    }
}

fn typical_envelope() -> Vec<u8> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let headers = [
        ("Accept", "application/json, text/plain, */*"),
        ("Accept-Language", "en-US,en;q=0.9"),
        ("Accept-Encoding", "gzip, deflate, br"),
        (
            "User-Agent",
            "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 Chrome/131.0",
        ),
        ("Cache-Control", "no-cache"),
        ("X-Request-Trace", "4bf92f3577b34da6a3ce929d0e0e4736"),
        (
            "Authorization",
            "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjMifQ.abc",
        ),
        ("Cookie", "session=abc123; theme=dark; lang=en"),
        ("Referer", "https://www.example.com/products/list?page=2"),
        ("Content-Type", "application/json"),
    ];
    let hs: Vec<String> = headers
        .iter()
        .map(|(n, v)| format!(r#"{{"name":"{n}","value_base64":"{}"}}"#, b64(v)))
        .collect();
    format!(
        r#"{{"method":"POST","url":"https://api.example.com/v2/orders/search?limit=50&cursor=abc",
"headers":[{}],"body":{{"mode":"inline_base64","data_base64":"{}"}},
"routing":{{"tags":["residential"],"country":"us","region":"us-east","sticky_session_id":"user-42"}},
"timeout_ms":30000,"replayable":false}}"#,
        hs.join(","),
        b64(r#"{"query":"shoes","filters":{"size":42}}"#)
    )
    .into_bytes()
}

/// The smallest useful envelope: a GET with a timeout and nothing else, as the load scripts
/// send it.
fn minimal_envelope() -> Vec<u8> {
    br#"{"method":"GET","url":"http://127.0.0.1:18081/kib","timeout_ms":5000}"#.to_vec()
}

fn large_envelope() -> Vec<u8> {
    let body = vec![0x5au8; 1024 * 1024];
    format!(
        r#"{{"method":"PUT","url":"https://upload.example.com/blob","body":{{"mode":"inline_base64","data_base64":"{}"}}}}"#,
        base64::engine::general_purpose::STANDARD.encode(body)
    )
    .into_bytes()
}

fn bench(c: &mut Criterion) {
    let ctx = ctx();
    for (name, doc) in [
        ("minimal", minimal_envelope()),
        ("typical_1k", typical_envelope()),
        ("inline_1mib", large_envelope()),
    ] {
        let mut g = c.benchmark_group(format!("envelope/{name}"));
        g.throughput(Throughput::Bytes(doc.len() as u64));
        // simd-json parses in place: production hands it the request body buffer it owns, so
        // the copy of the input is setup here, not measured.
        g.bench_with_input(BenchmarkId::new("simd_json", doc.len()), &doc, |b, doc| {
            b.iter_batched_ref(
                || doc.clone(),
                |scratch| black_box(decode_request(scratch, &ctx).map(|r| r.timeout_ms).ok()),
                BatchSize::LargeInput,
            )
        });
        g.bench_with_input(BenchmarkId::new("serde_json", doc.len()), &doc, |b, doc| {
            b.iter(|| {
                let env: RequestEnvelope = serde_json::from_slice(doc).expect("valid");
                black_box(validate(env, &ctx).map(|r| r.timeout_ms).ok())
            })
        });
        // The JSON decoding alone, without validation, to show what each parser costs.
        g.bench_with_input(
            BenchmarkId::new("simd_json_decode_only", doc.len()),
            &doc,
            |b, doc| {
                b.iter_batched_ref(
                    || doc.clone(),
                    |scratch| {
                        let env: Result<RequestEnvelope<'_>, _> =
                            sortie_core::json::from_slice_strict(scratch, usize::MAX);
                        black_box(env.is_ok())
                    },
                    BatchSize::LargeInput,
                )
            },
        );
        g.bench_with_input(
            BenchmarkId::new("serde_json_decode_only", doc.len()),
            &doc,
            |b, doc| {
                b.iter(|| {
                    let env: Result<RequestEnvelope<'_>, _> = serde_json::from_slice(doc);
                    black_box(env.is_ok())
                })
            },
        );
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
