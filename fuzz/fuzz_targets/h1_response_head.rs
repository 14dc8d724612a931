//! Fuzz target: h1_response_head (seeded from fuzz/corpus/h1_response_head).
//!
//! The first byte picks the request method the response answers; the rest is parsed as a
//! response head, and an accepted head must not depend on the bytes after it. Every field's
//! offsets (which the egress client slices its kept buffer by) must lie within the head and
//! point at the field's own bytes, and the entry point that gives only those offsets must agree
//! with the one that collects the fields, error for error. An HTTP/1.1 head's field lines, copied as they are into a
//! written head (as the forward proxy relays them), must parse back as the same fields.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sortie_core::h1::{
    parse_response_head, parse_response_head_offsets, write_response_head, HeadLimits, HeadPart,
    OutgoingBody, Parsed,
    ResponseFraming, Version,
};

const METHODS: [&str; 4] = ["GET", "HEAD", "CONNECT", "POST"];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, input)) = data.split_first() else {
        return;
    };
    let method = METHODS[usize::from(selector) % METHODS.len()];
    let limits = HeadLimits::RESPONSE;
    let collected = parse_response_head(input, method, &limits);
    // The egress client's entry point, which gives the fields' offsets instead of collecting
    // them, applies the same rules: the same result or error, the same ranges.
    let mut offsets = Vec::new();
    match (&collected, parse_response_head_offsets(input, method, &limits, &mut offsets)) {
        (
            Ok(Parsed::Complete { head, consumed_len: a }),
            Ok(Parsed::Complete { head: start, consumed_len: b }),
        ) => {
            assert_eq!((head.start(), *a), (start, b));
            assert_eq!(head.headers().len(), offsets.len());
            let range = |(s, e): (u32, u32)| s as usize..e as usize;
            for (h, f) in head.headers().iter().zip(&offsets) {
                assert_eq!((h.name_range(), h.value_range()), (range(f.name), range(f.value)));
            }
        }
        (Ok(Parsed::Partial), Ok(Parsed::Partial)) => assert!(offsets.is_empty()),
        (Err(a), Err(b)) => {
            assert_eq!(*a, b);
            assert!(offsets.is_empty(), "a refused head left fields behind");
        }
        (a, b) => panic!("the entry points disagree: {a:?} against {b:?}"),
    }
    let Ok(Parsed::Complete { head, consumed_len }) = collected else {
        return;
    };
    assert!(consumed_len <= input.len());
    let raw = &input[..consumed_len];
    assert!(raw.ends_with(b"\r\n\r\n"));
    assert!(!raw.windows(2).any(|w| w[1] == b'\n' && w[0] != b'\r'), "bare LF accepted");
    assert!((100..=599).contains(&head.status()));
    for h in head.headers() {
        let (name, value) = (h.name_range(), h.value_range());
        assert!(name.end <= consumed_len && value.end <= consumed_len);
        assert_eq!(raw.get(name), Some(h.name().as_bytes()));
        assert_eq!(raw.get(value), Some(h.value()));
    }
    if method == "HEAD" && head.status() != 101 {
        assert_eq!(head.framing(), ResponseFraming::None);
    }
    if matches!(head.framing(), ResponseFraming::CloseDelimited | ResponseFraming::Tunnel) {
        assert!(!head.is_keep_alive());
    }
    if let (Some(first), Version::Http11) = (head.headers().iter().next(), head.version()) {
        let lines = &raw[first.name_range().start..consumed_len - 2];
        let mut out = Vec::new();
        write_response_head(
            &mut out,
            head.status(),
            [HeadPart::ParsedLines(lines)],
            OutgoingBody::None,
        )
        .expect("a parsed status is written");
        match parse_response_head(&out, method, &limits) {
            Ok(Parsed::Complete {
                head: written,
                consumed_len: n,
            }) => {
                assert_eq!(n, out.len());
                assert_eq!(written.headers().len(), head.headers().len());
                for (w, h) in written.headers().iter().zip(head.headers().iter()) {
                    assert_eq!((w.name(), w.value()), (h.name(), h.value()));
                }
            }
            other => panic!("relayed lines parsed as {other:?}"),
        }
    }
    match parse_response_head(raw, method, &limits) {
        Ok(Parsed::Complete { head: again, consumed_len: n }) => {
            assert_eq!(n, consumed_len);
            assert_eq!(again, head);
        }
        other => panic!("head alone parsed as {other:?}"),
    }
});
