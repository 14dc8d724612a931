//! Fuzz target: envelope (seeded from fuzz/corpus/envelope).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = data;
});
