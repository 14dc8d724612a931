//! Fuzz target: snapshot (seeded from fuzz/corpus/snapshot). Decoding an admin snapshot body
//! must never panic, and a snapshot that validates must survive its own canonical encoding:
//! decode(encode(s)) == s, and the encoding is a fixed point.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sortie_core::snapshot::decode_snapshot;

fuzz_target!(|data: &[u8]| {
    // The decoder parses in place, so it gets its own copy.
    let mut buf = data.to_vec();
    let Ok(snapshot) = decode_snapshot(&mut buf) else {
        return;
    };
    let encoded = snapshot.to_json();
    let mut again = encoded.clone();
    match decode_snapshot(&mut again) {
        Ok(decoded) => {
            assert_eq!(decoded, snapshot, "canonical JSON decodes to another snapshot");
            assert_eq!(decoded.to_json(), encoded, "canonical JSON is not a fixed point");
        }
        Err(e) => panic!("canonical JSON of a valid snapshot was rejected: {e}"),
    }
});
