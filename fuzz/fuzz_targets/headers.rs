//! Fuzz target: headers (seeded from fuzz/corpus/headers).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = data;
});
