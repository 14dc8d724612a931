//! Fuzz target: URL validation must never panic; an accepted URL re-renders to a URL that parses
//! to the same value and carries no byte that could split a request line, and its parts (as the
//! worker bus carries them) make the same URL again. A name and a path that
//! `TargetUrl::from_parts` accepts give a URL that text would have parsed to the same value.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sortie_core::request::{parse_target_url, Host, Scheme, TargetUrl};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(u) = parse_target_url(s) {
        let rendered = u.to_string();
        assert!(rendered.bytes().all(|b| (0x21..=0x7e).contains(&b)));
        let again = parse_target_url(&rendered).expect("re-rendered URL parses");
        assert_eq!(again, u);
        assert!(u.port != 0);
        let parts = TargetUrl::from_parts(u.scheme, u.host.clone(), u.port, &u.path_and_query);
        assert_eq!(parts.as_ref(), Ok(&u));
    }
    // The string cut at its first `/` into a name and a path: whatever passes must render to
    // text that parses back to the same URL.
    if let Some(at) = s.find('/') {
        let (name, path) = s.split_at(at);
        for host in [Host::V4([127, 0, 0, 1].into()), Host::Domain(name.into())] {
            if let Ok(u) = TargetUrl::from_parts(Scheme::Https, host, 8443, path) {
                let rendered = u.to_string();
                assert!(rendered.bytes().all(|b| (0x21..=0x7e).contains(&b)));
                let again = parse_target_url(&rendered).expect("parts render to a URL");
                assert_eq!(again, u);
            }
        }
    }
});
