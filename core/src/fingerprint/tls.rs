//! TLS client fingerprints of a parsed ClientHello: JA4 and its raw form JA4_r (FoxIO's
//! `technical_details/JA4.md`), and JA3N (JA3 with the extension list sorted, for clients that
//! shuffle their extensions on purpose, as Chrome and rustls do).

use std::fmt::Write as _;

use md5::Digest as _;

use super::client_hello::{is_grease, ClientHello, EXT_ALPN, EXT_SERVER_NAME};

/// The TLS fingerprints of one ClientHello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFingerprint {
    /// JA4, e.g. `t13d1516h2_8daaf6152771_02713d6af862`.
    pub ja4: String,
    /// JA4_r: the same with the sorted lists in place of their hashes.
    pub ja4_r: String,
    /// The JA3N string (`version,ciphers,sorted extensions,groups,point formats`).
    pub ja3n_string: String,
    /// MD5 of [`TlsFingerprint::ja3n_string`], lowercase hex.
    pub ja3n: String,
}

/// Computes the fingerprints of `hello` as sent over TCP (JA4's `t`).
pub fn fingerprint(hello: &ClientHello) -> TlsFingerprint {
    let (ja4, ja4_r) = ja4(hello);
    let ja3n_string = ja3n_string(hello);
    let ja3n = hex(&md5::Md5::digest(ja3n_string.as_bytes()));
    TlsFingerprint {
        ja4,
        ja4_r,
        ja3n_string,
        ja3n,
    }
}

/// The padding extension (RFC 7685), which BoringSSL adds when the ClientHello would otherwise
/// be between 256 and 511 bytes long: its presence follows the length of the server name and
/// of a randomly sized ECH GREASE payload.
pub const EXT_PADDING: u16 = 0x0015;

/// The fingerprints of `hello` as if it carried no padding extension: for browsers whose
/// padding comes and goes between connections (a profile's `padding_varies`), the strings that
/// stay the same.
pub fn fingerprint_unpadded(hello: &ClientHello) -> TlsFingerprint {
    let mut h = hello.clone();
    h.extensions.retain(|e| *e != EXT_PADDING);
    fingerprint(&h)
}

fn no_grease(v: &[u16]) -> Vec<u16> {
    v.iter().copied().filter(|x| !is_grease(*x)).collect()
}

fn hex4_list(v: &[u16]) -> String {
    let mut s = String::with_capacity(v.len() * 5);
    for (i, x) in v.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{x:04x}");
    }
    s
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The first 12 hex characters of SHA-256 of `s`; twelve zeros for an empty list (JA4.md:
/// "If there are no ciphers ... the value of JA4_b is set to 000000000000").
fn hash12(s: &str) -> String {
    if s.is_empty() {
        return "000000000000".into();
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
    let mut h = hex(digest.as_ref());
    h.truncate(12);
    h
}

/// JA4's version field: the highest non-GREASE `supported_versions` value, else the legacy
/// version.
fn version(hello: &ClientHello) -> &'static str {
    let v = no_grease(&hello.supported_versions)
        .into_iter()
        .max()
        .unwrap_or(hello.legacy_version);
    match v {
        0x0304 => "13",
        0x0303 => "12",
        0x0302 => "11",
        0x0301 => "10",
        0x0300 => "s3",
        0x0002 => "s2",
        0xfeff => "d1",
        0xfefd => "d2",
        0xfefc => "d3",
        _ => "00",
    }
}

/// JA4's ALPN field: first and last character of the first ALPN value when both are
/// alphanumeric, else the first and last hex digit of the value; `00` without one.
fn alpn(hello: &ClientHello) -> String {
    let Some(first) = hello.alpn.first() else {
        return "00".into();
    };
    match (first.first(), first.last()) {
        (Some(&a), Some(&z)) if a.is_ascii_alphanumeric() && z.is_ascii_alphanumeric() => {
            format!("{}{}", a as char, z as char)
        }
        (Some(_), Some(_)) => {
            let h = hex(first);
            let a = h.chars().next().unwrap_or('0');
            let z = h.chars().last().unwrap_or('0');
            format!("{a}{z}")
        }
        _ => "00".into(),
    }
}

fn ja4(hello: &ClientHello) -> (String, String) {
    let ciphers = no_grease(&hello.ciphers);
    let exts = no_grease(&hello.extensions);
    let a = format!(
        "t{}{}{:02}{:02}{}",
        version(hello),
        if hello.has_sni() { 'd' } else { 'i' },
        ciphers.len().min(99),
        exts.len().min(99),
        alpn(hello),
    );
    let mut sorted_ciphers = ciphers;
    sorted_ciphers.sort_unstable();
    let mut sorted_exts: Vec<u16> = exts
        .into_iter()
        .filter(|e| *e != EXT_SERVER_NAME && *e != EXT_ALPN)
        .collect();
    sorted_exts.sort_unstable();
    let b_raw = hex4_list(&sorted_ciphers);
    let exts_raw = hex4_list(&sorted_exts);
    let sigs = no_grease(&hello.signature_algorithms);
    // JA4.md: with no signature algorithms, the string ends without an underscore.
    let c_raw = if sigs.is_empty() || exts_raw.is_empty() {
        exts_raw.clone()
    } else {
        format!("{exts_raw}_{}", hex4_list(&sigs))
    };
    let c_hash = if exts_raw.is_empty() {
        "000000000000".into()
    } else {
        hash12(&c_raw)
    };
    (
        format!("{a}_{}_{c_hash}", hash12(&b_raw)),
        format!("{a}_{b_raw}_{c_raw}"),
    )
}

fn dec_list<T: std::fmt::Display>(v: impl Iterator<Item = T>) -> String {
    let mut s = String::new();
    for (i, x) in v.enumerate() {
        if i > 0 {
            s.push('-');
        }
        let _ = write!(s, "{x}");
    }
    s
}

/// JA3 (`SSLVersion,Ciphers,Extensions,EllipticCurves,EllipticCurvePointFormats`, decimal,
/// GREASE removed) with the extensions sorted.
fn ja3n_string(hello: &ClientHello) -> String {
    let mut exts = no_grease(&hello.extensions);
    exts.sort_unstable();
    format!(
        "{},{},{},{},{}",
        hello.legacy_version,
        dec_list(no_grease(&hello.ciphers).into_iter()),
        dec_list(exts.into_iter()),
        dec_list(no_grease(&hello.groups).into_iter()),
        dec_list(hello.point_formats.iter()),
    )
}

#[cfg(test)]
mod tests {
    use super::super::client_hello::{build_record, parse_records};
    use super::*;

    /// The worked example of FoxIO's JA4 specification (FoxIO-LLC/ja4,
    /// `technical_details/JA4.md`, sections "Cipher hash", "Extension hash" and "Raw
    /// Output"): its cipher, extension and signature-algorithm lists, with GREASE values added
    /// where a browser puts them (they must not count).
    fn foxio_example() -> ClientHello {
        let mut extensions = vec![0x0a0a];
        extensions.extend([
            0x001b, 0x0000, 0x0033, 0x0010, 0x4469, 0x0017, 0x002d, 0x000d, 0x0005, 0x0023, 0x0012,
            0x002b, 0xff01, 0x000b, 0x000a, 0x0015,
        ]);
        extensions.push(0xfafa);
        let mut ciphers = vec![0x2a2a];
        ciphers.extend([
            0x1301, 0x1302, 0x1303, 0xc02b, 0xc02f, 0xc02c, 0xc030, 0xcca9, 0xcca8, 0xc013, 0xc014,
            0x009c, 0x009d, 0x002f, 0x0035,
        ]);
        ClientHello {
            legacy_version: 0x0303,
            ciphers,
            extensions,
            supported_versions: vec![0x5a5a, 0x0304, 0x0303],
            signature_algorithms: vec![
                0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501, 0x0806, 0x0601,
            ],
            groups: vec![0x6a6a, 0x001d, 0x0017, 0x0018],
            point_formats: vec![0],
            alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            key_shares: vec![0x6a6a, 0x001d],
            cert_compression: vec![2],
            ..ClientHello::default()
        }
    }

    #[test]
    fn foxio_ja4_vectors() {
        let hello = parse_records(&build_record(&foxio_example(), None)).unwrap();
        let fp = fingerprint(&hello);
        // JA4.md, "Example".
        assert_eq!(fp.ja4, "t13d1516h2_8daaf6152771_e5627efa2ab1");
        // JA4.md, "Raw Output".
        assert_eq!(
            fp.ja4_r,
            "t13d1516h2_002f,0035,009c,009d,1301,1302,1303,c013,c014,c02b,c02c,c02f,c030,cca8,\
             cca9_0005,000a,000b,000d,0012,0015,0017,001b,0023,002b,002d,0033,4469,ff01_0403,\
             0804,0401,0503,0805,0501,0806,0601"
        );
        // JA4.md, "Extension hash": without signature algorithms, no trailing underscore.
        let mut no_sigs = hello.clone();
        no_sigs.signature_algorithms.clear();
        let fp = fingerprint(&no_sigs);
        assert_eq!(fp.ja4, "t13d1516h2_8daaf6152771_6d807ffa2a79");
    }

    #[test]
    fn fields_of_part_a() {
        let mut h = foxio_example();
        h.extensions.retain(|e| *e != EXT_SERVER_NAME);
        h.supported_versions.clear();
        h.alpn = vec![b"http/1.1".to_vec()];
        let fp = fingerprint(&h);
        assert!(fp.ja4.starts_with("t12i1515h1_"), "{}", fp.ja4);
        // JA4.md, "ALPN Extension Value": non-alphanumeric ends use the hex digits.
        for (value, want) in [
            (&[0xab][..], "ab"),
            (&[0xab, 0xcd], "ad"),
            (&[0x30, 0xab], "3b"),
            (&[0x30, 0x31, 0xab, 0xcd], "3d"),
            (&[0x30, 0xab, 0xcd, 0x31], "01"),
            (b"x", "xx"),
        ] {
            h.alpn = vec![value.to_vec()];
            assert_eq!(alpn(&h), want, "{value:?}");
        }
        h.alpn.clear();
        assert_eq!(alpn(&h), "00");
        let empty = ClientHello::default();
        let fp = fingerprint(&empty);
        assert_eq!(fp.ja4, "t00i000000_000000000000_000000000000");
    }

    #[test]
    fn ja3n_sorts_extensions_and_drops_grease() {
        let fp = fingerprint(&foxio_example());
        assert_eq!(
            fp.ja3n_string,
            "771,4865-4866-4867-49195-49199-49196-49200-52393-52392-49171-49172-156-157-47-53,\
             0-5-10-11-13-16-18-21-23-27-35-43-45-51-17513-65281,29-23-24,0"
        );
        assert_eq!(fp.ja3n.len(), 32);
        // The order of extensions on the wire does not change JA3N (or JA4).
        let mut shuffled = foxio_example();
        shuffled.extensions.reverse();
        let again = fingerprint(&shuffled);
        assert_eq!(again.ja3n, fp.ja3n);
        assert_eq!(again.ja4, fp.ja4);
    }
}
