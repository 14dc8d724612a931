//! Fuzz target: the forward proxy's parsers of untrusted fields (Basic credentials, routing-hint
//! headers, the CONNECT authority) must never panic, and what they accept is well formed.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sortie_core::proxy::{parse_basic, parse_connect_target, route_hints};

fuzz_target!(|data: &[u8]| {
    if let Some(c) = parse_basic(data) {
        assert!(!c.user().contains(&b':'));
    }
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok((_, port)) = parse_connect_target(s) {
            assert!(port != 0);
        }
    }
    // Name and value split at the first NUL; names chosen to reach every hint.
    let (name, value) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&b"X-Service-Route-Tags"[..], data),
    };
    if let Ok(name) = std::str::from_utf8(name) {
        if let Ok(h) = route_hints([(name, value), ("X-Service-Route-Region", value)]) {
            assert!(h.tags.iter().all(|t| !t.is_empty() && t.len() <= 64));
        }
    }
});
