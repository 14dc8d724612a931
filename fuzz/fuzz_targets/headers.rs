//! Fuzz target: header validation must never panic, and an accepted header carries a token name
//! and a value without CR, LF or NUL.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sortie_core::request::{is_tchar, validate_header};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let (name, value) = s.split_once('\u{0}').unwrap_or((s, ""));
    if let Ok(h) = validate_header(0, name, value) {
        assert!(!h.name.is_empty() && h.name.bytes().all(is_tchar));
        assert!(!h.value.iter().any(|&b| b == b'\r' || b == b'\n' || b == 0));
    }
});
