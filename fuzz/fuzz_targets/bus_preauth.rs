//! Fuzz target: the bus listener before authentication. Bytes arrive in reads of the sizes the
//! input's first byte picks; as the listener does, the first frame is judged from its header
//! (`check_first_frame`) before more is buffered, then taken from a `FrameBuf`. Nothing panics;
//! a first frame let through is a `Hello` no longer than `MAX_HELLO_BYTES`; the frames a
//! `FrameBuf` yields are exactly those `decode` finds in the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sortie_core::bus::{check_first_frame, decode, Decoded, Frame, FrameBuf, MAX_HELLO_BYTES};

fuzz_target!(|data: &[u8]| {
    let Some((&step, bytes)) = data.split_first() else {
        return;
    };
    let step = usize::from(step).max(1);
    let mut buf = FrameBuf::new();
    let mut got = Vec::new();
    let mut first = true;
    'reads: for chunk in bytes.chunks(step) {
        buf.spare().extend_from_slice(chunk);
        loop {
            if first && check_first_frame(buf.pending()).is_err() {
                break 'reads;
            }
            match buf.next_frame() {
                Ok(Some(f)) => {
                    if first {
                        assert!(matches!(f, Frame::Hello(_)));
                        first = false;
                    }
                    got.push(f);
                }
                Ok(None) => break,
                Err(_) => break 'reads,
            }
        }
    }
    // The same bytes decoded in one piece give the same frames, in order.
    let mut rest = bytes;
    for f in &got {
        match decode(rest) {
            Ok(Decoded::Frame(g, used)) => {
                assert_eq!(&g, f);
                if matches!(g, Frame::Hello(_)) && rest.len() == bytes.len() {
                    assert!(used <= 4 + MAX_HELLO_BYTES);
                }
                rest = &rest[used..];
            }
            other => panic!("FrameBuf yielded a frame decode does not: {other:?}"),
        }
    }
});
