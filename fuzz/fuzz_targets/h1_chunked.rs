//! Fuzz target: h1_chunked (seeded from fuzz/corpus/h1_chunked).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = data;
});
