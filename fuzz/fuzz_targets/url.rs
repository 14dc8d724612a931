//! Fuzz target: URL validation must never panic; an accepted URL re-renders to a URL that parses
//! to the same value and carries no byte that could split a request line.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sortie_core::request::parse_target_url;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(u) = parse_target_url(s) {
        let rendered = u.to_string();
        assert!(rendered.bytes().all(|b| (0x21..=0x7e).contains(&b)));
        let again = parse_target_url(&rendered).expect("re-rendered URL parses");
        assert_eq!(again, u);
        assert!(u.port != 0);
    }
});
