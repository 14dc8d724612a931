//! Fuzz target: the ClientHello parser and the TLS fingerprints computed from what it parses
//! must never panic; a parsed hello's JA4 always has its three parts and 12-character hashes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sortie_core::fingerprint::{client_hello, tls};

fuzz_target!(|data: &[u8]| {
    if let Ok(hello) = client_hello::parse_records(data) {
        let fp = tls::fingerprint(&hello);
        let parts: Vec<&str> = fp.ja4.split('_').collect();
        assert_eq!(parts.len(), 3, "{}", fp.ja4);
        assert_eq!(parts[0].len(), 10, "{}", fp.ja4);
        assert!(parts[1].len() == 12 && parts[2].len() == 12, "{}", fp.ja4);
        assert_eq!(fp.ja3n.len(), 32);
    }
});
