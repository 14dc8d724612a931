//! Fuzz target: the parser of a client's first HTTP/2 frames (preface, SETTINGS,
//! WINDOW_UPDATE, PRIORITY, the first header block's HPACK names) must never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sortie_core::fingerprint::http2;

fuzz_target!(|data: &[u8]| {
    let mut with_preface = http2::PREFACE.to_vec();
    with_preface.extend_from_slice(data);
    for input in [data, &with_preface[..]] {
        if let Ok(start) = http2::parse(input) {
            let akamai = start.akamai();
            assert_eq!(akamai.matches('|').count(), 3, "{akamai}");
        }
    }
});
