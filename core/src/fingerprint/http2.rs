//! The HTTP/2 client fingerprint in Akamai's format (Shuster and Segal, "Passive
//! Fingerprinting of HTTP/2 Clients", Black Hat EU 2017):
//! `SETTINGS|WINDOW_UPDATE|PRIORITY|pseudo-header order`, computed from the first bytes a client
//! sends on a connection after TLS: the connection preface, then frames up to and including the
//! first request's header block (RFC 9113 §3.4, §4.1, §6).
//!
//! Only the names of the header block's fields are needed, so the HPACK decoding here reads
//! indexes and skips values (RFC 7541 §6); a field whose name is a Huffman-coded literal is not
//! a pseudo-header of any client we know and ends the pseudo-header list. A pseudo-header name
//! that RFC 9113 does not define for requests makes the start malformed (§8.3), so only the
//! letters of the defined names reach the fingerprint, never a `|` or `,` of the client's
//! choosing. Untrusted input: every length is checked, nothing panics, and the input is bounded
//! by [`MAX_PREFACE_BYTES`].

use std::fmt::Write as _;

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The most bytes read before the first header block must have ended.
pub const MAX_PREFACE_BYTES: usize = 64 * 1024;

const FRAME_HEADERS: u8 = 0x1;
const FRAME_PRIORITY: u8 = 0x2;
const FRAME_SETTINGS: u8 = 0x4;
const FRAME_WINDOW_UPDATE: u8 = 0x8;
const FRAME_CONTINUATION: u8 = 0x9;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
const FLAG_ACK: u8 = 0x1;

/// Why bytes are not (yet) an HTTP/2 client start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Http2Error {
    /// More bytes are needed.
    Incomplete,
    /// Not an HTTP/2 client preface and frames.
    Malformed(&'static str),
    /// No header block within [`MAX_PREFACE_BYTES`].
    TooLarge,
}

impl std::fmt::Display for Http2Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Http2Error::Incomplete => f.write_str("the HTTP/2 client start is incomplete"),
            Http2Error::Malformed(why) => write!(f, "not an HTTP/2 client start: {why}"),
            Http2Error::TooLarge => write!(f, "no request within {MAX_PREFACE_BYTES} bytes"),
        }
    }
}

impl std::error::Error for Http2Error {}

/// What the first frames of a client say.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Http2Start {
    /// SETTINGS of the first non-ACK SETTINGS frame, in order.
    pub settings: Vec<(u16, u32)>,
    /// The first connection-level WINDOW_UPDATE increment, if any came before the request.
    pub window_update: Option<u32>,
    /// PRIORITY frames before the request: (stream, exclusive, depends on, weight 1–256).
    pub priorities: Vec<(u32, bool, u32, u16)>,
    /// The request's pseudo-header names in order, without the colon.
    pub pseudo_headers: Vec<String>,
    /// The HEADERS frame's own priority, if it carried one: (exclusive, depends on, weight).
    pub headers_priority: Option<(bool, u32, u16)>,
}

impl Http2Start {
    /// The Akamai fingerprint string, e.g.
    /// `1:65536;2:0;4:6291456;6:262144|15663105|0|m,a,s,p`.
    pub fn akamai(&self) -> String {
        let mut s = String::new();
        for (i, (id, v)) in self.settings.iter().enumerate() {
            if i > 0 {
                s.push(';');
            }
            let _ = write!(s, "{id}:{v}");
        }
        s.push('|');
        match self.window_update {
            Some(w) => {
                let _ = write!(s, "{w}");
            }
            None => s.push_str("00"),
        }
        s.push('|');
        if self.priorities.is_empty() {
            s.push('0');
        }
        for (i, (stream, excl, dep, weight)) in self.priorities.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let _ = write!(s, "{stream}:{}:{dep}:{weight}", u8::from(*excl));
        }
        s.push('|');
        for (i, p) in self.pseudo_headers.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(p.get(..1).unwrap_or(""));
        }
        s
    }
}

/// Parses a client's first bytes: the preface, then frames until the first header block ends.
pub fn parse(bytes: &[u8]) -> Result<Http2Start, Http2Error> {
    let limited = bytes.get(..MAX_PREFACE_BYTES).unwrap_or(bytes);
    match parse_limited(limited) {
        Err(Http2Error::Incomplete) if bytes.len() > MAX_PREFACE_BYTES => Err(Http2Error::TooLarge),
        other => other,
    }
}

fn parse_limited(bytes: &[u8]) -> Result<Http2Start, Http2Error> {
    let bad = Http2Error::Malformed;
    let head = bytes.get(..PREFACE.len()).ok_or(Http2Error::Incomplete)?;
    if head != PREFACE {
        return Err(if PREFACE.starts_with(bytes) {
            Http2Error::Incomplete
        } else {
            bad("no connection preface")
        });
    }
    let mut rest = bytes.get(PREFACE.len()..).unwrap_or_default();
    let mut start = Http2Start::default();
    let mut has_settings = false;
    let mut block: Vec<u8> = Vec::new();
    let mut in_block = false;
    loop {
        let (ty, flags, stream, payload, tail) = frame(rest)?;
        rest = tail;
        if in_block {
            if ty != FRAME_CONTINUATION {
                return Err(bad("a header block was interrupted"));
            }
            block.extend_from_slice(payload);
            if flags & FLAG_END_HEADERS != 0 {
                break;
            }
            continue;
        }
        match ty {
            FRAME_SETTINGS if flags & FLAG_ACK == 0 && !has_settings => {
                has_settings = true;
                for pair in payload.chunks(6) {
                    match pair {
                        [a, b, c, d, e, f] => start.settings.push((
                            u16::from_be_bytes([*a, *b]),
                            u32::from_be_bytes([*c, *d, *e, *f]),
                        )),
                        _ => return Err(bad("a SETTINGS payload is not a multiple of 6")),
                    }
                }
            }
            FRAME_WINDOW_UPDATE if stream == 0 && start.window_update.is_none() => {
                let [a, b, c, d] = payload else {
                    return Err(bad("a WINDOW_UPDATE payload is not 4 bytes"));
                };
                start.window_update = Some(u32::from_be_bytes([*a, *b, *c, *d]) & 0x7fff_ffff);
            }
            FRAME_PRIORITY => {
                let (excl, dep, weight) = priority_fields(payload)?;
                start.priorities.push((stream, excl, dep, weight));
            }
            FRAME_HEADERS => {
                let mut p = payload;
                let mut pad = 0usize;
                if flags & FLAG_PADDED != 0 {
                    let (n, tail) = p.split_first().ok_or(bad("no pad length"))?;
                    pad = usize::from(*n);
                    p = tail;
                }
                if flags & FLAG_PRIORITY != 0 {
                    let fields = p.get(..5).ok_or(bad("short HEADERS priority"))?;
                    start.headers_priority = Some(priority_fields(fields)?);
                    p = p.get(5..).unwrap_or_default();
                }
                let end = p
                    .len()
                    .checked_sub(pad)
                    .ok_or(bad("padding exceeds the frame"))?;
                block.extend_from_slice(p.get(..end).unwrap_or_default());
                if flags & FLAG_END_HEADERS != 0 {
                    break;
                }
                in_block = true;
            }
            _ => {}
        }
    }
    start.pseudo_headers = pseudo_header_names(&block)?;
    Ok(start)
}

/// The next frame: type, flags, stream, payload, and the bytes after it.
#[allow(clippy::type_complexity)]
fn frame(b: &[u8]) -> Result<(u8, u8, u32, &[u8], &[u8]), Http2Error> {
    let header = b.get(..9).ok_or(Http2Error::Incomplete)?;
    let [l0, l1, l2, ty, flags, s0, s1, s2, s3] = header else {
        return Err(Http2Error::Incomplete);
    };
    let len = usize::from(*l0) << 16 | usize::from(*l1) << 8 | usize::from(*l2);
    let stream = u32::from_be_bytes([*s0, *s1, *s2, *s3]) & 0x7fff_ffff;
    let payload = b.get(9..9 + len).ok_or(Http2Error::Incomplete)?;
    Ok((
        *ty,
        *flags,
        stream,
        payload,
        b.get(9 + len..).unwrap_or_default(),
    ))
}

/// (exclusive, depends on, weight 1–256) of a 5-byte priority field (RFC 9113 §6.3).
fn priority_fields(p: &[u8]) -> Result<(bool, u32, u16), Http2Error> {
    let [a, b, c, d, w] = p else {
        return Err(Http2Error::Malformed("a priority field is not 5 bytes"));
    };
    let raw = u32::from_be_bytes([*a, *b, *c, *d]);
    Ok((raw >> 31 == 1, raw & 0x7fff_ffff, u16::from(*w) + 1))
}

/// The request pseudo-header fields without the colon (RFC 9113 §8.3.1; `:protocol`, RFC 8441
/// §4).
const REQUEST_PSEUDO_HEADERS: [&str; 5] = ["authority", "method", "path", "scheme", "protocol"];

/// HPACK static-table names of the pseudo-header fields (RFC 7541 Appendix A, indexes 1–7).
fn static_name(index: usize) -> Option<&'static str> {
    match index {
        1 => Some(":authority"),
        2 | 3 => Some(":method"),
        4 | 5 => Some(":path"),
        6 | 7 => Some(":scheme"),
        8..=61 => Some(""),
        _ => None,
    }
}

/// The pseudo-header names at the start of a header block, without the colon.
fn pseudo_header_names(block: &[u8]) -> Result<Vec<String>, Http2Error> {
    let bad = Http2Error::Malformed;
    let mut out = Vec::new();
    // Names this block added to the dynamic table, newest first (RFC 7541 §2.3.3: index 62 is
    // the newest). An empty table at the connection's first block.
    let mut dynamic: Vec<String> = Vec::new();
    let mut b = block;
    while let Some(&first) = b.first() {
        let name = if first & 0x80 != 0 {
            let (idx, tail) = integer(b, 7).ok_or(bad("bad HPACK index"))?;
            b = tail;
            lookup(idx, &dynamic).ok_or(bad("HPACK index out of range"))?
        } else if first & 0xe0 == 0x20 {
            // Dynamic table size update.
            let (_, tail) = integer(b, 5).ok_or(bad("bad HPACK size update"))?;
            b = tail;
            continue;
        } else {
            let (prefix, adds) = if first & 0xc0 == 0x40 {
                (6, true)
            } else {
                (4, false)
            };
            let (idx, tail) = integer(b, prefix).ok_or(bad("bad HPACK literal"))?;
            b = tail;
            let name = if idx == 0 {
                let (raw, huffman, tail) = string(b).ok_or(bad("bad HPACK name"))?;
                b = tail;
                if huffman {
                    String::new()
                } else {
                    String::from_utf8_lossy(raw).into_owned()
                }
            } else {
                lookup(idx, &dynamic).ok_or(bad("HPACK index out of range"))?
            };
            let (_, _, tail) = string(b).ok_or(bad("bad HPACK value"))?;
            b = tail;
            if adds {
                dynamic.insert(0, name.clone());
            }
            name
        };
        match name.strip_prefix(':') {
            Some(p) if REQUEST_PSEUDO_HEADERS.contains(&p) => out.push(p.to_string()),
            Some(_) => return Err(bad("undefined request pseudo-header")),
            None => break,
        }
    }
    Ok(out)
}

fn lookup(index: usize, dynamic: &[String]) -> Option<String> {
    match index {
        0 => None,
        1..=61 => static_name(index).map(str::to_string),
        _ => dynamic.get(index - 62).cloned(),
    }
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 §5.1), bounded to 2^28.
fn integer(b: &[u8], n: u32) -> Option<(usize, &[u8])> {
    let (first, mut rest) = b.split_first()?;
    let max = (1usize << n) - 1;
    let mut v = usize::from(*first) & max;
    if v < max {
        return Some((v, rest));
    }
    let mut shift = 0u32;
    loop {
        let (byte, tail) = rest.split_first()?;
        rest = tail;
        v = v.checked_add(usize::from(byte & 0x7f).checked_shl(shift)?)?;
        if byte & 0x80 == 0 || shift > 21 {
            return (byte & 0x80 == 0 && v < 1 << 28).then_some((v, rest));
        }
        shift += 7;
    }
}

/// An HPACK string literal (RFC 7541 §5.2): its bytes, whether Huffman-coded, the rest.
fn string(b: &[u8]) -> Option<(&[u8], bool, &[u8])> {
    let huffman = b.first()? & 0x80 != 0;
    let (len, rest) = integer(b, 7)?;
    let (s, tail) = rest.split_at_checked(len)?;
    Some((s, huffman, tail))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_bytes(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[ty, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn settings(pairs: &[(u16, u32)]) -> Vec<u8> {
        pairs
            .iter()
            .flat_map(|(i, v)| {
                let mut x = i.to_be_bytes().to_vec();
                x.extend_from_slice(&v.to_be_bytes());
                x
            })
            .collect()
    }

    /// Chrome's first flight as curl-impersonate and the Akamai reference describe it:
    /// SETTINGS, WINDOW_UPDATE, then HEADERS with priority (exclusive, on 0, weight 256) and the
    /// pseudo-headers m,a,s,p as static-table references and literals.
    fn chrome_like() -> Vec<u8> {
        let mut b = PREFACE.to_vec();
        b.extend(frame_bytes(
            FRAME_SETTINGS,
            0,
            0,
            &settings(&[(1, 65536), (2, 0), (4, 6291456), (6, 262144)]),
        ));
        b.extend(frame_bytes(
            FRAME_WINDOW_UPDATE,
            0,
            0,
            &15663105u32.to_be_bytes(),
        ));
        let mut block = vec![0x82]; // :method GET (indexed 2)
        block.extend([0x41, 3]); // :authority, literal with indexing, name index 1
        block.extend(b"a.b");
        block.push(0x87); // :scheme https (indexed 7)
        block.extend([0x04, 2]); // :path, literal without indexing, name index 4
        block.extend(b"/x");
        block.extend([0x40, 0x0a]); // a literal name, not Huffman: user-agent
        block.extend(b"user-agent");
        block.extend([1, b'z']);
        let mut payload = vec![0x80, 0, 0, 0, 255];
        payload.extend(&block);
        b.extend(frame_bytes(
            FRAME_HEADERS,
            FLAG_END_HEADERS | FLAG_PRIORITY | 0x1,
            1,
            &payload,
        ));
        b
    }

    #[test]
    fn chrome_akamai_string() {
        let b = chrome_like();
        let start = parse(&b).unwrap();
        assert_eq!(
            start.akamai(),
            "1:65536;2:0;4:6291456;6:262144|15663105|0|m,a,s,p"
        );
        assert_eq!(start.headers_priority, Some((true, 0, 256)));
        for n in 0..b.len() {
            assert_eq!(parse(&b[..n]), Err(Http2Error::Incomplete), "{n}");
        }
    }

    #[test]
    fn priority_frames_and_continuation() {
        let mut b = PREFACE.to_vec();
        b.extend(frame_bytes(FRAME_SETTINGS, 0, 0, &settings(&[(1, 65536)])));
        b.extend(frame_bytes(FRAME_PRIORITY, 0, 3, &[0, 0, 0, 0, 200]));
        b.extend(frame_bytes(FRAME_PRIORITY, 0, 9, &[0x80, 0, 0, 7, 0]));
        // :method, :path in HEADERS; :authority via a dynamic-table reference in CONTINUATION.
        b.extend(frame_bytes(
            FRAME_HEADERS,
            0,
            13,
            &[0x82, 0x41, 1, b'h', 0x84],
        ));
        b.extend(frame_bytes(
            FRAME_CONTINUATION,
            FLAG_END_HEADERS,
            13,
            &[0xbe, 0x87],
        ));
        let start = parse(&b).unwrap();
        assert_eq!(start.akamai(), "1:65536|00|3:0:0:201,9:1:7:1|m,a,p,a,s");
    }

    /// A first flight whose header block is `:method GET` then a literal field `name: v`.
    fn with_literal_field(name: &[u8]) -> Vec<u8> {
        let mut block = vec![0x82, 0x00, name.len() as u8];
        block.extend(name);
        block.extend([1, b'v']);
        let mut b = PREFACE.to_vec();
        b.extend(frame_bytes(FRAME_SETTINGS, 0, 0, &settings(&[(1, 65536)])));
        b.extend(frame_bytes(FRAME_HEADERS, FLAG_END_HEADERS, 1, &block));
        b
    }

    #[test]
    fn only_defined_request_pseudo_headers_reach_the_fingerprint() {
        // Found by fuzzing: a literal `:|` put a separator of the client's choosing into the
        // string (and `:` an empty letter).
        for name in [&b":|"[..], b":", b":,m", b":status", b":\x06"] {
            assert!(
                matches!(
                    parse(&with_literal_field(name)),
                    Err(Http2Error::Malformed(_))
                ),
                "{name:?}"
            );
        }
        let start = parse(&with_literal_field(b":protocol")).unwrap();
        assert_eq!(start.akamai(), "1:65536|00|0|m,p");
        let start = parse(&with_literal_field(b"x-custom")).unwrap();
        assert_eq!(start.akamai(), "1:65536|00|0|m");
    }

    #[test]
    fn rejects_what_is_not_http2() {
        assert!(matches!(
            parse(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
            Err(Http2Error::Malformed(_))
        ));
        let mut b = PREFACE.to_vec();
        b.extend(frame_bytes(FRAME_SETTINGS, 0, 0, &[0, 1, 0]));
        assert!(matches!(parse(&b), Err(Http2Error::Malformed(_))));
        let mut b = PREFACE.to_vec();
        b.extend(frame_bytes(
            FRAME_HEADERS,
            FLAG_END_HEADERS,
            1,
            &[0xff, 0xff],
        ));
        assert!(matches!(parse(&b), Err(Http2Error::Malformed(_))));
        let mut big = PREFACE.to_vec();
        big.resize(MAX_PREFACE_BYTES + 10, 0);
        assert_eq!(parse(&big), Err(Http2Error::TooLarge));
    }
}
