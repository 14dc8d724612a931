//! Fuzz target: header validation must never panic, and an accepted header holds what the head
//! writer would check: a token name of at most the limit that names no managed field, a value
//! without control bytes but HTAB. Written unchecked, it makes the same head as the checked
//! writer does.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sortie_core::h1::{write_request_head_of, write_request_head_to, OutgoingBody};
use sortie_core::limits::MAX_HEADER_NAME_BYTES;
use sortie_core::request::{is_tchar, parse_target_url, rejection_reason, validate_header};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let (name, value) = s.split_once('\u{0}').unwrap_or((s, ""));
    if let Ok(h) = validate_header(0, name, value) {
        assert!(!h.name().is_empty() && h.name().bytes().all(is_tchar));
        assert!(h.name().len() <= MAX_HEADER_NAME_BYTES);
        assert!(rejection_reason(h.name()).is_none());
        assert!(!h.value().iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f));
        let url = parse_target_url("http://a.example/").expect("a valid URL");
        let (mut checked, mut unchecked) = (Vec::new(), Vec::new());
        let fields = [(h.name().as_bytes(), h.value())];
        write_request_head_to(&mut checked, "GET", &url, fields, b"", OutgoingBody::None)
            .expect("the checked writer takes what validation accepted");
        let one = [h];
        write_request_head_of(&mut unchecked, "GET", &url, &one, b"", OutgoingBody::None)
            .expect("the head is written");
        assert_eq!(checked, unchecked);
    }
});
