//! Fuzz target: snapshot (seeded from fuzz/corpus/snapshot).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = data;
});
