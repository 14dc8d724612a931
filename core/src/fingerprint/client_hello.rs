//! A TLS ClientHello as fingerprints see it: the fields JA4 and JA3 are computed from, parsed
//! from the bytes a client sends first on a connection (TLS records, RFC 8446 §5.1, carrying a
//! handshake message of type `client_hello`, §4.1.2).
//!
//! The input is untrusted: every length is checked against what is there, nothing panics, and
//! the message is bounded by [`MAX_CLIENT_HELLO_BYTES`].

use std::fmt;

/// The largest ClientHello accepted. A real one is under 2 KiB (a post-quantum key share adds
/// about 1.2 KiB); the handshake length field allows 16 MiB, which a capture must not buffer.
pub const MAX_CLIENT_HELLO_BYTES: usize = 64 * 1024;

/// Record content type `handshake` (RFC 8446 §5.1).
const CONTENT_HANDSHAKE: u8 = 22;
/// Handshake message type `client_hello` (RFC 8446 §4).
const HANDSHAKE_CLIENT_HELLO: u8 = 1;

/// Extension numbers used by the fingerprints.
pub const EXT_SERVER_NAME: u16 = 0x0000;
/// `supported_groups`.
pub const EXT_SUPPORTED_GROUPS: u16 = 0x000a;
/// `ec_point_formats`.
pub const EXT_EC_POINT_FORMATS: u16 = 0x000b;
/// `signature_algorithms`.
pub const EXT_SIGNATURE_ALGORITHMS: u16 = 0x000d;
/// `application_layer_protocol_negotiation`.
pub const EXT_ALPN: u16 = 0x0010;
/// `supported_versions`.
pub const EXT_SUPPORTED_VERSIONS: u16 = 0x002b;
/// `key_share` extension type.
pub const EXT_KEY_SHARE: u16 = 0x0033;
/// `compress_certificate` extension type.
pub const EXT_COMPRESS_CERTIFICATE: u16 = 0x001b;
/// `delegated_credentials` extension type.
pub const EXT_DELEGATED_CREDENTIALS: u16 = 0x0022;
/// `record_size_limit` extension type.
pub const EXT_RECORD_SIZE_LIMIT: u16 = 0x001c;

/// Why bytes are not (yet) a ClientHello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelloError {
    /// More bytes are needed: the records end before the message does.
    Incomplete,
    /// The bytes are not a TLS handshake record carrying a ClientHello, or a length field
    /// points past its container.
    Malformed(&'static str),
    /// The message is longer than [`MAX_CLIENT_HELLO_BYTES`].
    TooLarge,
}

impl fmt::Display for HelloError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HelloError::Incomplete => f.write_str("the ClientHello is incomplete"),
            HelloError::Malformed(why) => write!(f, "not a ClientHello: {why}"),
            HelloError::TooLarge => write!(f, "ClientHello over {MAX_CLIENT_HELLO_BYTES} bytes"),
        }
    }
}

impl std::error::Error for HelloError {}

/// The fields of a ClientHello that fingerprints use, in wire order, GREASE values kept (each
/// fingerprint decides what to drop).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientHello {
    /// `legacy_version`.
    pub legacy_version: u16,
    /// Cipher suites.
    pub ciphers: Vec<u16>,
    /// Extension types.
    pub extensions: Vec<u16>,
    /// `supported_versions` (extension 43).
    pub supported_versions: Vec<u16>,
    /// `signature_algorithms` (extension 13).
    pub signature_algorithms: Vec<u16>,
    /// `supported_groups` (extension 10).
    pub groups: Vec<u16>,
    /// `ec_point_formats` (extension 11).
    pub point_formats: Vec<u8>,
    /// ALPN protocol names (extension 16), in order.
    pub alpn: Vec<Vec<u8>>,
    /// The groups of the `key_share` entries (extension 51), in order.
    pub key_shares: Vec<u16>,
    /// `compress_certificate` algorithms (extension 27), in order.
    pub cert_compression: Vec<u16>,
    /// `delegated_credentials` signature algorithms (extension 34), in order.
    pub delegated_credentials: Vec<u16>,
    /// The `record_size_limit` value (extension 28), when sent.
    pub record_size_limit: Option<u16>,
}

impl ClientHello {
    /// Whether the SNI extension is present.
    pub fn has_sni(&self) -> bool {
        self.extensions.contains(&EXT_SERVER_NAME)
    }
}

/// Whether `v` is a GREASE value (RFC 8701 §2: `0x?A?A` with both bytes equal).
pub const fn is_grease(v: u16) -> bool {
    v & 0x0f0f == 0x0a0a && v >> 8 == v & 0xff
}

/// Parses the ClientHello at the start of `bytes`, the first bytes a client sent on a
/// connection: one or more handshake records whose fragments together hold the message.
pub fn parse_records(bytes: &[u8]) -> Result<ClientHello, HelloError> {
    let mut message: Vec<u8> = Vec::new();
    let mut rest = bytes;
    loop {
        let mut r = Reader(rest);
        let header = r.take(5).ok_or(HelloError::Incomplete)?;
        let (ty, len) = match header {
            [ty, _, _, hi, lo] => (*ty, usize::from(u16::from_be_bytes([*hi, *lo]))),
            _ => return Err(HelloError::Incomplete),
        };
        if ty != CONTENT_HANDSHAKE {
            return Err(HelloError::Malformed(
                "the first record is not a handshake record",
            ));
        }
        let fragment = r.take(len).ok_or(HelloError::Incomplete)?;
        message.extend_from_slice(fragment);
        rest = r.0;
        if message.len() > MAX_CLIENT_HELLO_BYTES + 4 {
            return Err(HelloError::TooLarge);
        }
        match message_len(&message)? {
            Some(total) if message.len() >= total => {
                return parse_message(message.get(..total).unwrap_or_default());
            }
            _ => {}
        }
    }
}

/// The length of the handshake message (header included) once its header is there.
fn message_len(message: &[u8]) -> Result<Option<usize>, HelloError> {
    match message {
        [ty, a, b, c, ..] => {
            if *ty != HANDSHAKE_CLIENT_HELLO {
                return Err(HelloError::Malformed(
                    "the handshake message is not a ClientHello",
                ));
            }
            let len = usize::from(*a) << 16 | usize::from(*b) << 8 | usize::from(*c);
            if len > MAX_CLIENT_HELLO_BYTES {
                return Err(HelloError::TooLarge);
            }
            Ok(Some(len + 4))
        }
        _ => Ok(None),
    }
}

/// Parses one complete handshake message (type, 24-bit length, body).
pub fn parse_message(message: &[u8]) -> Result<ClientHello, HelloError> {
    let bad = HelloError::Malformed;
    let mut m = Reader(message);
    if m.u8().ok_or(bad("empty message"))? != HANDSHAKE_CLIENT_HELLO {
        return Err(bad("the handshake message is not a ClientHello"));
    }
    let len = m.u24().ok_or(bad("truncated header"))?;
    let mut body = Reader(m.take(len).ok_or(HelloError::Incomplete)?);
    let mut hello = ClientHello {
        legacy_version: body.u16().ok_or(bad("no version"))?,
        ..ClientHello::default()
    };
    body.take(32).ok_or(bad("no random"))?;
    body.vec8().ok_or(bad("bad session id"))?;
    hello.ciphers = u16s(body.vec16().ok_or(bad("bad cipher suites"))?);
    body.vec8().ok_or(bad("bad compression methods"))?;
    if body.0.is_empty() {
        // A ClientHello without extensions (TLS 1.2 and older allow it).
        return Ok(hello);
    }
    let mut exts = Reader(body.vec16().ok_or(bad("bad extensions"))?);
    while !exts.0.is_empty() {
        let ty = exts.u16().ok_or(bad("truncated extension"))?;
        let data = exts.vec16().ok_or(bad("truncated extension"))?;
        hello.extensions.push(ty);
        let mut d = Reader(data);
        match ty {
            EXT_SUPPORTED_VERSIONS => {
                hello
                    .supported_versions
                    .extend(u16s(d.vec8().ok_or(bad("bad supported_versions"))?));
            }
            EXT_SIGNATURE_ALGORITHMS => {
                hello
                    .signature_algorithms
                    .extend(u16s(d.vec16().ok_or(bad("bad signature_algorithms"))?));
            }
            EXT_SUPPORTED_GROUPS => {
                hello
                    .groups
                    .extend(u16s(d.vec16().ok_or(bad("bad supported_groups"))?));
            }
            EXT_EC_POINT_FORMATS => {
                hello.point_formats = d.vec8().ok_or(bad("bad ec_point_formats"))?.to_vec();
            }
            EXT_ALPN => {
                let mut list = Reader(d.vec16().ok_or(bad("bad ALPN"))?);
                while !list.0.is_empty() {
                    hello
                        .alpn
                        .push(list.vec8().ok_or(bad("bad ALPN name"))?.to_vec());
                }
            }
            EXT_KEY_SHARE => {
                let mut list = Reader(d.vec16().ok_or(bad("bad key_share"))?);
                while !list.0.is_empty() {
                    hello
                        .key_shares
                        .push(list.u16().ok_or(bad("bad key_share entry"))?);
                    list.vec16().ok_or(bad("bad key_share entry"))?;
                }
            }
            EXT_COMPRESS_CERTIFICATE => {
                hello
                    .cert_compression
                    .extend(u16s(d.vec8().ok_or(bad("bad compress_certificate"))?));
            }
            EXT_DELEGATED_CREDENTIALS => {
                hello
                    .delegated_credentials
                    .extend(u16s(d.vec16().ok_or(bad("bad delegated_credentials"))?));
            }
            EXT_RECORD_SIZE_LIMIT => {
                hello.record_size_limit = Some(d.u16().ok_or(bad("bad record_size_limit"))?);
            }
            _ => {}
        }
    }
    Ok(hello)
}

/// The big-endian 16-bit values of a list's bytes, in order (a trailing odd byte is ignored).
fn u16s(list: &[u8]) -> Vec<u16> {
    let mut r = Reader(list);
    std::iter::from_fn(|| r.u16()).collect()
}

/// A cursor over untrusted bytes; every read is checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = self.0.split_at_checked(n)?;
        self.0 = tail;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1)?.first().copied()
    }

    fn u16(&mut self) -> Option<u16> {
        match self.take(2)? {
            [a, b] => Some(u16::from_be_bytes([*a, *b])),
            _ => None,
        }
    }

    fn u24(&mut self) -> Option<usize> {
        match self.take(3)? {
            [a, b, c] => Some(usize::from(*a) << 16 | usize::from(*b) << 8 | usize::from(*c)),
            _ => None,
        }
    }

    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }

    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }
}

/// Builds ClientHello record bytes from field lists, for tests of this crate and of the
/// fingerprints (the extension bodies are minimal but well formed).
#[cfg(test)]
pub(crate) fn build_record(hello: &ClientHello, sni: Option<&str>) -> Vec<u8> {
    fn vec16(out: &mut Vec<u8>, data: &[u8]) {
        out.extend_from_slice(&(data.len() as u16).to_be_bytes());
        out.extend_from_slice(data);
    }
    let mut body = Vec::new();
    body.extend_from_slice(&hello.legacy_version.to_be_bytes());
    body.extend_from_slice(&[7; 32]);
    body.push(0);
    let ciphers: Vec<u8> = hello.ciphers.iter().flat_map(|c| c.to_be_bytes()).collect();
    vec16(&mut body, &ciphers);
    body.extend_from_slice(&[1, 0]);
    let mut exts = Vec::new();
    for &ty in &hello.extensions {
        exts.extend_from_slice(&ty.to_be_bytes());
        let mut data = Vec::new();
        let list16 = |v: &[u16]| -> Vec<u8> { v.iter().flat_map(|x| x.to_be_bytes()).collect() };
        match ty {
            EXT_SERVER_NAME => {
                let name = sni.unwrap_or("example.com").as_bytes();
                let mut entry = vec![0];
                vec16(&mut entry, name);
                vec16(&mut data, &entry);
            }
            EXT_SUPPORTED_VERSIONS => {
                let l = list16(&hello.supported_versions);
                data.push(l.len() as u8);
                data.extend_from_slice(&l);
            }
            EXT_SIGNATURE_ALGORITHMS => vec16(&mut data, &list16(&hello.signature_algorithms)),
            EXT_SUPPORTED_GROUPS => vec16(&mut data, &list16(&hello.groups)),
            EXT_EC_POINT_FORMATS => {
                data.push(hello.point_formats.len() as u8);
                data.extend_from_slice(&hello.point_formats);
            }
            EXT_ALPN => {
                let mut l = Vec::new();
                for p in &hello.alpn {
                    l.push(p.len() as u8);
                    l.extend_from_slice(p);
                }
                vec16(&mut data, &l);
            }
            EXT_KEY_SHARE => {
                let mut l = Vec::new();
                for g in &hello.key_shares {
                    l.extend_from_slice(&g.to_be_bytes());
                    vec16(&mut l, &[1, 2, 3]);
                }
                vec16(&mut data, &l);
            }
            EXT_COMPRESS_CERTIFICATE => {
                let l = list16(&hello.cert_compression);
                data.push(l.len() as u8);
                data.extend_from_slice(&l);
            }
            EXT_DELEGATED_CREDENTIALS => vec16(&mut data, &list16(&hello.delegated_credentials)),
            EXT_RECORD_SIZE_LIMIT => {
                if let Some(v) = hello.record_size_limit {
                    data.extend_from_slice(&v.to_be_bytes());
                }
            }
            _ => {}
        }
        vec16(&mut exts, &data);
    }
    vec16(&mut body, &exts);
    let mut msg = vec![HANDSHAKE_CLIENT_HELLO];
    msg.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    msg.extend_from_slice(&body);
    let mut rec = vec![CONTENT_HANDSHAKE, 3, 1];
    vec16(&mut rec, &msg);
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ClientHello {
        ClientHello {
            legacy_version: 0x0303,
            ciphers: vec![0x1a1a, 0x1301, 0xc02b],
            extensions: vec![
                0x2a2a, 0, 0x0010, 0x002b, 0x000d, 0x000a, 0x000b, 0xff01, 0x0033, 0x001b, 0x0022,
                0x001c,
            ],
            supported_versions: vec![0x3a3a, 0x0304, 0x0303],
            signature_algorithms: vec![0x0403, 0x0804],
            groups: vec![0x4a4a, 0x001d],
            point_formats: vec![0],
            alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            key_shares: vec![0x4a4a, 0x11ec, 0x001d],
            cert_compression: vec![2],
            delegated_credentials: vec![0x0403],
            record_size_limit: Some(16_385),
        }
    }

    #[test]
    fn round_trips_through_records_and_fragments() {
        let hello = sample();
        let rec = build_record(&hello, None);
        assert_eq!(parse_records(&rec).unwrap(), hello);
        // The same message split over two records.
        let msg = &rec[5..];
        let (a, b) = msg.split_at(40);
        let mut two = vec![22, 3, 1, 0, a.len() as u8];
        two.extend_from_slice(a);
        two.extend_from_slice(&[22, 3, 1]);
        two.extend_from_slice(&(b.len() as u16).to_be_bytes());
        two.extend_from_slice(b);
        assert_eq!(parse_records(&two).unwrap(), hello);
        // Every prefix is incomplete, never a panic or a wrong answer.
        for n in 0..rec.len() {
            assert_eq!(parse_records(&rec[..n]), Err(HelloError::Incomplete), "{n}");
        }
    }

    #[test]
    fn rejects_what_is_not_a_client_hello() {
        assert!(matches!(
            parse_records(b"GET / HTTP/1.1\r\n\r\n"),
            Err(HelloError::Malformed(_))
        ));
        let mut rec = build_record(&sample(), None);
        rec[5] = 2; // server_hello
        assert!(matches!(parse_records(&rec), Err(HelloError::Malformed(_))));
        let huge = [22, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff];
        assert_eq!(parse_records(&huge), Err(HelloError::TooLarge));
    }

    #[test]
    fn grease_values() {
        for v in [0x0a0a, 0x1a1a, 0xaaaa, 0xfafa] {
            assert!(is_grease(v), "{v:04x}");
        }
        for v in [0x0a1a, 0x1301, 0x0000, 0xabab] {
            assert!(!is_grease(v), "{v:04x}");
        }
    }
}
