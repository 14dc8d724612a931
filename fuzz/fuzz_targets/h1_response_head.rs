//! Fuzz target: h1_response_head (seeded from fuzz/corpus/h1_response_head).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = data;
});
