//! Fuzz target: h1_chunked (seeded from fuzz/corpus/h1_chunked).
//!
//! The first byte picks a split point; the rest is decoded whole, in two pieces split there,
//! and byte by byte. All three must agree on data, consumed bytes, completion and error.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sortie_core::h1::{BodyLimits, ChunkedDecoder, H1Error};

/// Tight limits so that the fuzzer reaches the limit paths.
const LIMITS: BodyLimits =
    BodyLimits { max_body_bytes: 4096, max_extension_bytes: 64, max_trailer_bytes: 128 };

/// Feeds `pieces` in order until the body ends or fails; returns data, consumed and done.
fn feed<'a>(pieces: impl Iterator<Item = &'a [u8]>) -> Result<(Vec<u8>, usize, bool), H1Error> {
    let mut decoder = ChunkedDecoder::new(LIMITS);
    let mut data = Vec::new();
    let mut consumed = 0;
    for piece in pieces {
        let progress = decoder.decode(piece, &mut |d| {
            assert!(!d.is_empty());
            data.extend_from_slice(d);
        })?;
        consumed += progress.consumed;
        if progress.is_done {
            return Ok((data, consumed, true));
        }
        assert_eq!(progress.consumed, piece.len(), "input left over before the end");
    }
    Ok((data, consumed, decoder.is_done()))
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, input)) = data.split_first() else {
        return;
    };
    let split = usize::from(selector) % (input.len() + 1);
    let (left, right) = input.split_at(split);
    let whole = feed(std::iter::once(input));
    let halves = feed([left, right].into_iter());
    let bytes = feed(input.chunks(1));
    assert_eq!(whole, halves, "split at {split}");
    assert_eq!(whole, bytes, "byte by byte");
    if let Ok((body, consumed, _)) = &whole {
        assert!(body.len() as u64 <= LIMITS.max_body_bytes);
        assert!(*consumed <= input.len());
    }
});
