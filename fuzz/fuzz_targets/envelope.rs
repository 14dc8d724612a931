//! Fuzz target: request envelope decoding and validation must never panic, and whatever it
//! accepts must satisfy the contract's limits.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sortie_core::limits;
use sortie_core::request::{decode_request, RequestBody, ValidationContext};

const PROFILES: &[&str] = &["chrome_131", "firefox_133"];

fuzz_target!(|data: &[u8]| {
    let ctx = ValidationContext {
        max_inline_request_body_bytes: 4096,
        max_timeout_ms: 120_000,
        default_timeout_ms: 60_000,
        is_object_storage_enabled: data.first().is_some_and(|b| b & 1 == 1),
        fingerprint_profiles: PROFILES,
    };
    let mut buf = data.to_vec();
    match decode_request(&mut buf, &ctx) {
        Ok(r) => {
            assert!(r.headers.len() <= limits::MAX_HEADERS);
            assert!(r.timeout_ms >= limits::MIN_TIMEOUT_MS.min(ctx.default_timeout_ms));
            assert!(r.timeout_ms <= ctx.max_timeout_ms);
            if let RequestBody::Inline(b) = &r.body {
                assert!(b.len() <= ctx.max_inline_request_body_bytes);
            }
            for h in &r.headers {
                assert!(!h.value().iter().any(|&b| b == b'\r' || b == b'\n' || b == 0));
            }
            assert!(r.routing.tags.len() <= limits::MAX_ROUTING_TAGS);
        }
        Err(e) => {
            let _ = e.to_json("req_fuzz");
        }
    }
});
