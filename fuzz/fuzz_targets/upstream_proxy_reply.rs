//! Fuzz target: the replies of upstream proxies. The `CONNECT` reply parser and the SOCKS5
//! handshake must never panic on any bytes, never report more bytes consumed than they were
//! given, and a SOCKS5 handshake ends connected at most once.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sortie_core::upstream_proxy::connect::{parse_connect_reply, ConnectReply};
use sortie_core::upstream_proxy::socks5::{Socks5Handshake, Socks5Step, Socks5Target};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    // CONNECT: every prefix parses without panicking; a complete reply stays complete.
    for end in [rest.len() / 2, rest.len()] {
        match parse_connect_reply(&rest[..end]) {
            Ok(ConnectReply::Established { consumed, status }) => {
                assert!(consumed <= end);
                assert!((200..300).contains(&status));
            }
            Ok(ConnectReply::Refused { status }) => assert!(!(200..300).contains(&status)),
            Ok(ConnectReply::Partial) | Err(_) => {}
        }
    }
    // SOCKS5: the proxy's bytes arrive in pieces of a size chosen by the input.
    let creds = (mode & 1 == 1).then_some(("user-s1", "pw"));
    let target = if mode & 2 == 2 {
        Socks5Target::Name("example.com", 443)
    } else {
        Socks5Target::Addr(([127, 0, 0, 1], 8080).into())
    };
    let piece = usize::from(mode >> 2).max(1);
    let Ok((mut hs, _greeting)) = Socks5Handshake::start(target, creds) else {
        return;
    };
    let mut buf: Vec<u8> = Vec::new();
    let mut connected = false;
    for chunk in rest.chunks(piece) {
        buf.extend_from_slice(chunk);
        loop {
            match hs.feed(&buf) {
                Ok(Socks5Step::NeedMore) => break,
                Ok(Socks5Step::Send { consumed, out }) => {
                    assert!(consumed <= buf.len() && !out.is_empty());
                    buf.drain(..consumed);
                }
                Ok(Socks5Step::Connected { consumed }) => {
                    assert!(consumed <= buf.len() && !connected);
                    connected = true;
                    buf.drain(..consumed);
                }
                Err(_) => return,
            }
        }
    }
});
