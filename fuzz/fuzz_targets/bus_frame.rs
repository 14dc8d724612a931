//! Fuzz target: the bus frame decoder must never panic; a decoded frame re-encodes to the exact
//! bytes it came from, and a lane state machine fed the frames never panics either.
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
        assert_eq!(&again[..], &rest[..used]);
        let _ = control.receive(&frame);
        control.admit();
        let _ = worker.receive(&frame);
        rest = &rest[used..];
    }
});
