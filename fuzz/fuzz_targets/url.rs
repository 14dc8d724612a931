//! Fuzz target: url (seeded from fuzz/corpus/url).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = data;
});
