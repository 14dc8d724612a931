//! Fuzz target: h1_request_head (seeded from fuzz/corpus/h1_request_head).
//!
//! Parses arbitrary bytes as a request head under the default limits and under tight ones,
//! and checks that an accepted head is strict and does not depend on the bytes after it, and
//! that the entry point lending the parser's fields decides the same as the collecting one.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sortie_core::h1::{parse_request_head, parse_request_head_with, HeadLimits, Parsed};

const TIGHT: HeadLimits = HeadLimits { max_head_bytes: 256, max_headers: 4, max_target_bytes: 32 };

fuzz_target!(|data: &[u8]| {
    for limits in [HeadLimits::REQUEST, TIGHT] {
        let parsed = parse_request_head(data, &limits);
        let lent = parse_request_head_with(data, &limits, |start, fields| {
            (*start, fields.iter().collect::<Vec<_>>())
        });
        match (&parsed, &lent) {
            (
                Ok(Parsed::Complete { head, consumed_len: a }),
                Ok(Parsed::Complete { head: (start, fields), consumed_len: b }),
            ) => {
                assert_eq!((a, head.start()), (b, start));
                let collected: Vec<_> =
                    head.headers().iter().map(|h| (h.name(), h.value())).collect();
                assert_eq!(&collected, fields);
            }
            (Ok(Parsed::Partial), Ok(Parsed::Partial)) => {}
            (Err(a), Err(b)) => assert_eq!(a, b),
            other => panic!("the two entry points disagree: {other:?}"),
        }
        let Ok(Parsed::Complete { head, consumed_len }) = parsed else {
            continue;
        };
        assert!(consumed_len <= data.len() && consumed_len <= limits.max_head_bytes);
        let raw = &data[..consumed_len];
        assert!(raw.ends_with(b"\r\n\r\n"));
        assert!(!raw.windows(2).any(|w| w[1] == b'\n' && w[0] != b'\r'), "bare LF accepted");
        assert!(head.target().len() <= limits.max_target_bytes);
        assert!(head.headers().len() <= limits.max_headers);
        let lengths = head.headers().values("content-length").count();
        assert!(lengths <= 1);
        assert!(!(lengths == 1 && head.headers().contains("transfer-encoding")));
        assert!(head.headers().values("host").count() <= 1);
        // The head alone parses to the same result; one byte less is incomplete.
        match parse_request_head(raw, &limits) {
            Ok(Parsed::Complete { head: again, consumed_len: n }) => {
                assert_eq!(n, consumed_len);
                assert_eq!(again, head);
            }
            other => panic!("head alone parsed as {other:?}"),
        }
        assert_eq!(parse_request_head(&raw[..consumed_len - 1], &limits), Ok(Parsed::Partial));
    }
});
