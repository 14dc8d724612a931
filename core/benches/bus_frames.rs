//! Benchmarks of bus frames.
//!
//! `bus_small_frames_64k_read`: a lane's read buffer flooded with the smallest frames (7-byte
//! `GoAway`s, as one authenticated peer could send them), 64 KiB per read. Baseline in the same
//! run: the former reader, which removed each decoded frame from the front of the buffer (a
//! move of everything behind it per frame: quadratic in the frames per read); against it
//! `FrameBuf`, which takes frames by an offset and moves what is left once per read.
//! Throughput is in bytes, so criterion prints the CPU per MB of each.
//!
//! `bus_assign`: the control writing one request's `Assign` into a lane's outbox. Baseline in
//! the same run: building an owned `Assign` from the request's parts (every string and header
//! field copied, the frame boxed) and encoding that `Frame`, as the control did; against it
//! `encode_assign` from borrowed parts.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use sortie_core::bus::{
    decode, encode, encode_assign, Assign, AssignRef, AssignUrl, BodySource, Decoded, Frame,
    FrameBuf,
};

/// One read's worth of 7-byte frames (64 KiB, cut mid-frame as a read would be).
fn flood() -> Vec<u8> {
    let mut one = Vec::new();
    encode(
        &Frame::GoAway {
            reason: String::new(),
        },
        &mut one,
    )
    .expect("a frame");
    assert_eq!(one.len(), 7);
    one.iter().copied().cycle().take(64 * 1024).collect()
}

fn drain_per_frame(read: &[u8]) -> usize {
    let mut buf = read.to_vec();
    let mut n = 0;
    while let Ok(Decoded::Frame(f, used)) = decode(&buf) {
        black_box(f);
        buf.drain(..used);
        n += 1;
    }
    n
}

fn frame_buf(read: &[u8]) -> usize {
    let mut fb = FrameBuf::new();
    fb.spare().extend_from_slice(read);
    let mut n = 0;
    while let Ok(Some(f)) = fb.next_frame() {
        black_box(f);
        n += 1;
    }
    // The next read's compaction: what is left moves once.
    black_box(fb.spare().len());
    n
}

fn bench(c: &mut Criterion) {
    let read = flood();
    assert_eq!(drain_per_frame(&read), frame_buf(&read));
    let mut g = c.benchmark_group("bus_small_frames_64k_read");
    g.throughput(Throughput::Bytes(read.len() as u64));
    g.bench_function("drain_per_frame_baseline", |b| {
        b.iter(|| drain_per_frame(black_box(&read)))
    });
    g.bench_function("frame_buf", |b| b.iter(|| frame_buf(black_box(&read))));
    g.finish();
}

/// The parts of one request as the control holds them when it assigns it.
struct Parts {
    request_id: String,
    url: String,
    headers: Vec<(&'static [u8], &'static [u8])>,
    body: BodySource,
}

fn parts() -> Parts {
    Parts {
        request_id: "req_0123456789abcdef0123456789abcdef".into(),
        url: "https://api.example.com/v1/items?page=2&sort=desc".into(),
        headers: vec![
            (b"accept", b"application/json"),
            (b"user-agent", b"sortie-bench/1.0 (+https://example.com)"),
            (b"x-trace-id", b"4bf92f3577b34da6a3ce929d0e0e4736"),
            (b"cookie", b"session=0123456789abcdef; theme=dark"),
        ],
        body: BodySource::Empty,
    }
}

fn owned_baseline(p: &Parts, out: &mut Vec<u8>) {
    // Every string and header field copied into an owned `Assign` first, then encoded.
    let a = Assign::new(assign_ref(p));
    encode(&Frame::Assign(Box::new(a)), out).expect("encodes");
}

fn assign_ref(p: &Parts) -> AssignRef<'_, &'static [u8], &'static [u8]> {
    AssignRef {
        stream: 7,
        request_id: &p.request_id,
        deployment_id: "acme",
        deadline_ms: 30_000,
        is_replayable: true,
        ingress: 0,
        method: "GET",
        url: AssignUrl::Text(&p.url),
        headers: &p.headers,
        body: &p.body,
        pool: "residential",
        provider_session: None,
        proxy_username: None,
        fingerprint_profile: None,
        max_response_bytes: 10 << 20,
        window: 256 * 1024,
    }
}

fn borrowed(p: &Parts, out: &mut Vec<u8>) {
    encode_assign(&assign_ref(p), out).expect("encodes");
}

fn bench_assign(c: &mut Criterion) {
    let p = parts();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    owned_baseline(&p, &mut a);
    borrowed(&p, &mut b);
    assert_eq!(a, b, "both write the same frame");
    let mut g = c.benchmark_group("bus_assign");
    let mut out = Vec::with_capacity(4096);
    g.bench_function("owned_baseline", |bch| {
        bch.iter(|| {
            out.clear();
            owned_baseline(black_box(&p), &mut out);
        })
    });
    g.bench_function("borrowed", |bch| {
        bch.iter(|| {
            out.clear();
            borrowed(black_box(&p), &mut out);
        })
    });
    g.finish();
}

criterion_group!(benches, bench, bench_assign);
criterion_main!(benches);
