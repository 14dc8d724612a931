//! Fuzz target: the bus frame decoder must never panic; a decoded frame re-encodes to the exact
//! bytes it came from (a `Response` whose fields came as one block re-encodes field by field,
//! to bytes that decode to the same frame), and a lane state machine fed the frames never
//! panics either.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sortie_core::bus::{decode, encode, ControlLane, Decoded, WorkerLane};

fuzz_target!(|data: &[u8]| {
    let mut control = ControlLane::new();
    let mut worker = WorkerLane::new();
    let mut rest = data;
    while let Ok(Decoded::Frame(frame, used)) = decode(rest) {
        let mut again = Vec::new();
        encode(&frame, &mut again).expect("a decoded frame encodes");
        if rest.get(4) == Some(&0x1a) {
            let Ok(Decoded::Frame(same, n)) = decode(&again) else {
                panic!("a re-encoded block response does not decode");
            };
            assert_eq!((same, n), (frame.clone(), again.len()));
        } else {
            assert_eq!(&again[..], &rest[..used]);
        }
        let _ = control.receive(&frame);
        control.admit();
        let _ = worker.receive(&frame);
        rest = &rest[used..];
    }
});
