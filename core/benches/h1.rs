//! Benchmark: HTTP/1.1 codec hot path — request head parsing and writing, and chunked body
//! decoding.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use sortie_core::h1::{
    parse_request_head, write_chunk, write_last_chunk, write_request_head_of,
    write_request_head_to, BodyLimits, ChunkedDecoder, HeadLimits, OutgoingBody, Parsed,
};
use sortie_core::request::{parse_target_url, Header};

/// A typical API request head: 8 header fields, about 400 bytes.
fn typical_request_head() -> Vec<u8> {
    let head = b"POST /api/v1/requests?trace=1 HTTP/1.1\r\n\
        Host: gateway.internal.example:8080\r\n\
        User-Agent: sortie-client/0.1 (linux; x86_64)\r\n\
        Accept: application/json\r\n\
        Accept-Encoding: gzip, deflate, br\r\n\
        Content-Type: application/json\r\n\
        Content-Length: 1024\r\n\
        Authorization: Bearer 0123456789abcdef0123456789abcdef0123456789abcdef\r\n\
        X-Request-Id: 5f0c6c1e-3a4b-4c2d-9e8f-0a1b2c3d4e5f-0a1b2c3d4e5f-0a1b2c3d4e5f\r\n\
        \r\n";
    head.to_vec()
}

fn request_head(c: &mut Criterion) {
    let head = typical_request_head();
    let mut group = c.benchmark_group("h1_request_head");
    group.throughput(Throughput::Bytes(head.len() as u64));
    group.bench_function(format!("parse_{}B_8_headers", head.len()), |b| {
        b.iter(
            || match parse_request_head(black_box(&head), &HeadLimits::REQUEST) {
                Ok(Parsed::Complete { head, consumed_len }) => {
                    black_box(head.framing());
                    consumed_len
                }
                _ => 0,
            },
        )
    });
    group.finish();
}

/// The upstream head of a request API call with an ordinary client's ten headers: written from
/// validated `Header`s as they are (decision 135), and, in the same run, the same fields given
/// one by one to the checked writer, as before.
fn request_head_write(c: &mut Criterion) {
    let fields: [(&str, &[u8]); 10] = [
        ("Accept", b"application/json, text/plain, */*"),
        ("Accept-Language", b"en-US,en;q=0.9"),
        ("Accept-Encoding", b"gzip, deflate, br"),
        (
            "User-Agent",
            b"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 Chrome/131.0",
        ),
        ("Cache-Control", b"no-cache"),
        ("X-Request-Trace", b"4bf92f3577b34da6a3ce929d0e0e4736"),
        (
            "Authorization",
            b"Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjMifQ.abc",
        ),
        ("Cookie", b"session=abc123; theme=dark; lang=en"),
        ("Referer", b"https://www.example.com/products/list?page=2"),
        ("X-Client-Version", b"4.12.0"),
    ];
    let headers: Vec<Header> = fields
        .iter()
        .map(|(n, v)| Header::new(n, v).expect("a valid header"))
        .collect();
    let url = parse_target_url("https://api.example.com/v2/orders/search?limit=50").expect("url");
    let own = b"Connection: keep-alive\r\n";
    let mut group = c.benchmark_group("h1_request_head_write");
    group.bench_function("ten_validated_headers", |b| {
        b.iter(|| {
            let mut out = Vec::with_capacity(256);
            let written = write_request_head_of(
                &mut out,
                "GET",
                &url,
                black_box(&headers),
                own,
                OutgoingBody::None,
            );
            black_box(written.is_ok());
            out.len()
        })
    });
    group.bench_function("ten_fields_checked", |b| {
        b.iter(|| {
            let mut out = Vec::with_capacity(256);
            let pairs = black_box(&headers)
                .iter()
                .map(|h| (h.name().as_bytes(), h.value()));
            let written =
                write_request_head_to(&mut out, "GET", &url, pairs, own, OutgoingBody::None);
            black_box(written.is_ok());
            out.len()
        })
    });
    group.finish();
}

fn chunked_decode(c: &mut Criterion) {
    const BODY: usize = 1024 * 1024;
    const CHUNK: usize = 8 * 1024;
    let data: Vec<u8> = (0..BODY).map(|i| (i % 251) as u8).collect();
    let mut encoded = Vec::with_capacity(BODY + BODY / CHUNK * 16);
    for piece in data.chunks(CHUNK) {
        write_chunk(&mut encoded, piece);
    }
    write_last_chunk(&mut encoded);

    let mut group = c.benchmark_group("h1_chunked");
    group.throughput(Throughput::Bytes(BODY as u64));
    let mut sink = Vec::with_capacity(BODY);
    group.bench_function("decode_1MiB_in_8KiB_chunks", |b| {
        b.iter(|| {
            sink.clear();
            let mut decoder = ChunkedDecoder::new(BodyLimits::with_max_body(u64::MAX));
            // Feed the encoded body the way a socket would: 16 KiB reads.
            for read in black_box(&encoded).chunks(16 * 1024) {
                let _ = decoder.decode(read, &mut |d| sink.extend_from_slice(d));
            }
            assert!(decoder.is_done());
            sink.len()
        })
    });
    group.finish();
}

criterion_group!(benches, request_head, request_head_write, chunked_decode);
criterion_main!(benches);
