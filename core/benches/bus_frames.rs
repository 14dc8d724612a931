//! Benchmark: a lane's read buffer flooded with the smallest frames (7-byte `GoAway`s, as one
//! authenticated peer could send them), 64 KiB per read. Baseline in the same run: the former
//! reader, which removed each decoded frame from the front of the buffer (a move of everything
//! behind it per frame: quadratic in the frames per read); against it `FrameBuf`, which takes
//! frames by an offset and moves what is left once per read. Throughput is in bytes, so
//! criterion prints the CPU per MB of each.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use sortie_core::bus::{decode, encode, Decoded, Frame, FrameBuf};

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

criterion_group!(benches, bench);
criterion_main!(benches);
