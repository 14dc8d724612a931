//! The fingerprinted TLS connector: a BoringSSL context per built-in profile (through `btls`)
//! set up from the profile's data, and the handshake on monoio's poll IO (`tokio-btls`).
//!
//! Certificates are checked by the same webpki verifier and roots as ordinary TLS (the webpki
//! roots plus `[egress] ca_file`), called from BoringSSL's custom verification hook: a
//! fingerprinted connection trusts exactly what an ordinary one does. BoringSSL itself checks
//! the handshake signature with the certificate's key.

use std::io::{self, Read as _};
use std::pin::Pin;
use std::sync::Arc;

use btls::ssl::{
    CertificateCompressionAlgorithm, CertificateCompressor, ExtensionType, KeyShare, Ssl, SslAlert,
    SslContext, SslMethod, SslOptions, SslRef, SslSignatureAlgorithm, SslVerifyError,
    SslVerifyMode, SslVersion,
};
use monoio::net::tcp::stream_poll::TcpStreamPoll;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use sortie_core::fingerprint::profile::{cert_compression, ext, Profile, PROFILES};

/// A fingerprinted TLS session over the socket in poll mode.
pub(crate) type BoringStream = tokio_btls::SslStream<TcpStreamPoll>;

/// The BoringSSL contexts of the built-in profiles, and the verifier they share. A profile
/// BoringSSL refuses keeps the reason instead of a context: its handshakes fail with it, so
/// its self-test fails and it is never advertised, while every other profile works.
pub(crate) struct Connectors {
    by_profile: Vec<(&'static str, Result<SslContext, String>)>,
    verifier: Arc<dyn ServerCertVerifier>,
}

impl std::fmt::Debug for Connectors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self
            .by_profile
            .iter()
            .filter(|(_, c)| c.is_ok())
            .map(|(n, _)| *n)
            .collect();
        f.debug_struct("Connectors")
            .field("profiles", &names)
            .finish()
    }
}

impl Connectors {
    /// A context for every built-in profile; certificates checked by `verifier`.
    pub(crate) fn new(verifier: Arc<dyn ServerCertVerifier>) -> Result<Connectors, String> {
        let by_profile = PROFILES
            .iter()
            .map(|p| {
                (
                    p.name,
                    context(p).map_err(|e| format!("BoringSSL refuses it: {e}")),
                )
            })
            .collect();
        Ok(Connectors {
            by_profile,
            verifier,
        })
    }

    fn context(&self, name: &str) -> Result<&SslContext, String> {
        match self.by_profile.iter().find(|(n, _)| *n == name) {
            Some((_, Ok(c))) => Ok(c),
            Some((_, Err(e))) => Err(e.clone()),
            None => Err(format!("no context for {name}")),
        }
    }
}

/// Why a fingerprinted handshake failed.
#[derive(Debug)]
pub(crate) enum HandshakeError {
    /// The session could not be set up (a profile BoringSSL refuses); a bug of ours.
    Setup(String),
    /// The TLS handshake failed (alert, certificate, protocol or socket error).
    Tls(String),
}

/// Runs the handshake of `profile` to `host` over `tcp`. The server name is sent (SNI) unless
/// `host` is an IP literal; the certificate must be valid for `host`.
pub(crate) async fn handshake(
    connectors: &Connectors,
    profile: &Profile,
    host: &str,
    server_name: ServerName<'static>,
    tcp: TcpStreamPoll,
) -> Result<BoringStream, HandshakeError> {
    let setup = |e: btls::error::ErrorStack| HandshakeError::Setup(e.to_string());
    let ctx = connectors
        .context(profile.name)
        .map_err(HandshakeError::Setup)?;
    let mut ssl = Ssl::new(ctx).map_err(setup)?;
    if matches!(server_name, ServerName::DnsName(_)) {
        ssl.set_hostname(host).map_err(setup)?;
    }
    let has = |e: u16| profile.tls.extensions.contains(&e);
    if !profile.tls.key_shares.is_empty() {
        let shares: Vec<KeyShare> = profile
            .tls
            .key_shares
            .iter()
            .filter_map(|g| key_share(*g))
            .collect();
        ssl.set_client_key_shares(&shares).map_err(setup)?;
    }
    if has(ext::ALPS_OLD) || has(ext::ALPS_NEW) {
        // ALPS for `h2`, with the code point of the browser version (Chrome 131 still used
        // the old one; BoringSSL defaults to the new one).
        ssl.add_application_settings(b"h2").map_err(setup)?;
        ssl.set_alps_use_new_codepoint(has(ext::ALPS_NEW));
    }
    if has(ext::ECH) {
        ssl.set_enable_ech_grease(true);
    }
    let verifier = connectors.verifier.clone();
    ssl.set_custom_verify_callback(SslVerifyMode::PEER, move |ssl| {
        verify(ssl, verifier.as_ref(), &server_name)
    });
    let mut stream = tokio_btls::SslStream::new(ssl, tcp).map_err(setup)?;
    Pin::new(&mut stream)
        .connect()
        .await
        .map_err(|e| HandshakeError::Tls(describe(&e)))?;
    Ok(stream)
}

/// Whether the session chose HTTP/2 by ALPN.
pub(crate) fn is_h2(stream: &BoringStream) -> bool {
    stream.ssl().selected_alpn_protocol() == Some(b"h2".as_slice())
}

fn describe(e: &btls::ssl::Error) -> String {
    match e.io_error() {
        Some(io) => format!("TLS handshake: {io}"),
        None => format!("TLS handshake: {e}"),
    }
}

/// The certificate chain through rustls's webpki verifier, for `name`.
fn verify(
    ssl: &mut SslRef,
    verifier: &dyn ServerCertVerifier,
    name: &ServerName<'static>,
) -> Result<(), SslVerifyError> {
    let bad = SslVerifyError::Invalid(SslAlert::BAD_CERTIFICATE);
    let chain = ssl.peer_cert_chain().ok_or(bad)?;
    let mut ders = Vec::with_capacity(chain.len());
    for cert in chain {
        ders.push(CertificateDer::from(cert.to_der().map_err(|_| bad)?));
    }
    let (end_entity, intermediates) = ders.split_first().ok_or(bad)?;
    let ocsp = ssl.ocsp_status().unwrap_or_default().to_vec();
    match verifier.verify_server_cert(end_entity, intermediates, name, &ocsp, UnixTime::now()) {
        Ok(_) => Ok(()),
        Err(rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)) => {
            Err(SslVerifyError::Invalid(SslAlert::UNKNOWN_CA))
        }
        Err(rustls::Error::InvalidCertificate(rustls::CertificateError::Expired)) => {
            Err(SslVerifyError::Invalid(SslAlert::CERTIFICATE_EXPIRED))
        }
        Err(_) => Err(bad),
    }
}

/// The BoringSSL context of one profile.
fn context(p: &Profile) -> Result<SslContext, String> {
    let e = |what: &'static str| move |err: btls::error::ErrorStack| format!("{what}: {err}");
    let t = &p.tls;
    let mut b = SslContext::builder(SslMethod::tls()).map_err(e("context"))?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2))
        .map_err(e("min version"))?;
    b.set_max_proto_version(Some(SslVersion::TLS1_3))
        .map_err(e("max version"))?;
    // TLS 1.3 suites in the profile's order too (BoringSSL otherwise fixes their order).
    b.set_preserve_tls13_cipher_list(true);
    b.set_cipher_list(&names(t.ciphers, cipher_name)?)
        .map_err(e("ciphers"))?;
    b.set_curves_list(&names(t.groups, group_name)?)
        .map_err(e("groups"))?;
    // The code points as they are, in order and with Safari's duplicate: BoringSSL writes its
    // verify preferences into `signature_algorithms` as given. It refuses a code point it does
    // not know (Chrome 150's ML-DSA, decision 100), which fails that profile alone.
    let sigalgs: Vec<SslSignatureAlgorithm> = t
        .signature_algorithms
        .iter()
        .map(|a| SslSignatureAlgorithm::from(*a))
        .collect();
    b.set_verify_algorithm_prefs(&sigalgs)
        .map_err(e("signature algorithms"))?;
    b.set_grease_enabled(t.grease);
    let mut alpn = Vec::new();
    for proto in t.alpn {
        alpn.push(u8::try_from(proto.len()).map_err(|_| "ALPN name too long".to_string())?);
        alpn.extend_from_slice(proto.as_bytes());
    }
    b.set_alpn_protos(&alpn).map_err(e("ALPN"))?;
    let has = |x: u16| t.extensions.contains(&x);
    if has(ext::STATUS_REQUEST) {
        b.enable_ocsp_stapling();
    }
    if has(ext::SCT) {
        b.enable_signed_cert_timestamps();
    }
    if !has(ext::SESSION_TICKET) {
        b.set_options(SslOptions::NO_TICKET);
    }
    if !has(ext::PSK_KEY_EXCHANGE_MODES) {
        // Tor Browser offers no resumption at all: no `psk_key_exchange_modes` either.
        b.set_options(SslOptions::NO_PSK_DHE_KE);
    }
    if has(ext::DELEGATED_CREDENTIALS) {
        b.set_delegated_credentials(&names(t.delegated_credentials, sigalg_name)?)
            .map_err(e("delegated credentials"))?;
    }
    if let Some(limit) = t.record_size_limit {
        b.set_record_size_limit(limit);
    }
    for alg in t.cert_compression {
        match *alg {
            cert_compression::ZLIB => b.add_certificate_compression_algorithm(Zlib),
            cert_compression::BROTLI => b.add_certificate_compression_algorithm(Brotli),
            cert_compression::ZSTD => b.add_certificate_compression_algorithm(Zstd),
            other => return Err(format!("certificate compression {other} unknown")),
        }
        .map_err(e("certificate compression"))?;
    }
    if t.permute_extensions {
        b.set_permute_extensions(true);
    } else {
        let order: Vec<ExtensionType> = t
            .extensions
            .iter()
            .map(|x| ExtensionType::from(*x))
            .collect();
        b.set_extension_permutation(&order)
            .map_err(e("extension order"))?;
    }
    // Verification happens in the per-session hook (`verify`); the context holds no roots.
    b.set_verify(SslVerifyMode::PEER);
    Ok(b.build())
}

fn names(ids: &[u16], name: fn(u16) -> Option<&'static str>) -> Result<String, String> {
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        out.push(name(*id).ok_or_else(|| format!("code point {id:#06x} has no BoringSSL name"))?);
    }
    Ok(out.join(":"))
}

/// BoringSSL's name of a cipher suite code point: every suite the linked BoringSSL knows
/// (btls adds the CBC-SHA256/384 and 3DES suites Safari and old browsers still offer).
fn cipher_name(id: u16) -> Option<&'static str> {
    btls::ssl::SslCipher::from_value(id).map(|c| c.name())
}

fn group_name(id: u16) -> Option<&'static str> {
    Some(match id {
        0x11ec => "X25519MLKEM768",
        0x6399 => "X25519Kyber768Draft00",
        0x001d => "X25519",
        0x0017 => "P-256",
        0x0018 => "P-384",
        0x0019 => "P-521",
        0x0100 => "ffdhe2048",
        0x0101 => "ffdhe3072",
        _ => return None,
    })
}

fn key_share(id: u16) -> Option<KeyShare> {
    Some(match id {
        0x11ec => KeyShare::X25519_MLKEM768,
        0x6399 => KeyShare::X25519_KYBER768_DRAFT00,
        0x001d => KeyShare::X25519,
        0x0017 => KeyShare::P256,
        0x0018 => KeyShare::P384,
        0x0019 => KeyShare::P521,
        0x0100 => KeyShare::FFDHE2048,
        0x0101 => KeyShare::FFDHE3072,
        _ => return None,
    })
}

fn sigalg_name(id: u16) -> Option<&'static str> {
    Some(match id {
        0x0403 => "ecdsa_secp256r1_sha256",
        0x0503 => "ecdsa_secp384r1_sha384",
        0x0603 => "ecdsa_secp521r1_sha512",
        0x0804 => "rsa_pss_rsae_sha256",
        0x0805 => "rsa_pss_rsae_sha384",
        0x0806 => "rsa_pss_rsae_sha512",
        0x0401 => "rsa_pkcs1_sha256",
        0x0501 => "rsa_pkcs1_sha384",
        0x0601 => "rsa_pkcs1_sha512",
        0x0203 => "ecdsa_sha1",
        0x0201 => "rsa_pkcs1_sha1",
        0x0807 => "ed25519",
        _ => return None,
    })
}

/// Certificate decompressors (RFC 8879). Only decompression: a client never sends a
/// certificate here. The output is bounded by the length the server declared (BoringSSL's
/// buffer refuses more).
struct Zlib;
struct Brotli;
struct Zstd;

/// The largest certificate chain accepted decompressed (BoringSSL caps the declared length
/// at 2^24 as well).
const MAX_CERT_CHAIN_BYTES: usize = 1 << 24;

impl CertificateCompressor for Zlib {
    const ALGORITHM: CertificateCompressionAlgorithm = CertificateCompressionAlgorithm::ZLIB;
    const CAN_COMPRESS: bool = false;
    const CAN_DECOMPRESS: bool = true;

    fn decompress<W: io::Write>(&self, input: &[u8], output: &mut W) -> io::Result<()> {
        contained("zlib", || {
            let out = miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(
                input,
                MAX_CERT_CHAIN_BYTES,
            )
            .map_err(|e| io::Error::other(format!("zlib: {e:?}")))?;
            output.write_all(&out)
        })
    }
}

impl CertificateCompressor for Brotli {
    const ALGORITHM: CertificateCompressionAlgorithm = CertificateCompressionAlgorithm::BROTLI;
    const CAN_COMPRESS: bool = false;
    const CAN_DECOMPRESS: bool = true;

    fn decompress<W: io::Write>(&self, input: &[u8], output: &mut W) -> io::Result<()> {
        contained("brotli", || {
            let mut r = brotli_decompressor::Decompressor::new(input, 4096)
                .take(MAX_CERT_CHAIN_BYTES as u64);
            io::copy(&mut r, output).map(|_| ())
        })
    }
}

impl CertificateCompressor for Zstd {
    const ALGORITHM: CertificateCompressionAlgorithm = CertificateCompressionAlgorithm::ZSTD;
    const CAN_COMPRESS: bool = false;
    const CAN_DECOMPRESS: bool = true;

    fn decompress<W: io::Write>(&self, input: &[u8], output: &mut W) -> io::Result<()> {
        contained("zstd", || {
            let r = ruzstd::decoding::StreamingDecoder::new(input)
                .map_err(|e| io::Error::other(format!("zstd: {e}")))?;
            io::copy(&mut r.take(MAX_CERT_CHAIN_BYTES as u64), output).map(|_| ())
        })
    }
}

/// Runs a decompressor on the server's bytes. BoringSSL calls it from C on a hot core: a
/// panic in the decoder must neither unwind across that boundary (an abort) nor stop the
/// process under the panic policy; it fails this handshake as a decompression error does.
fn contained(what: &str, f: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
    crate::runtime::contain_panic(what, f).unwrap_or_else(|e| Err(io::Error::other(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_code_point_has_a_boringssl_name() {
        for p in PROFILES {
            names(p.tls.ciphers, cipher_name).unwrap();
            names(p.tls.groups, group_name).unwrap();
            names(p.tls.delegated_credentials, sigalg_name).unwrap();
            assert!(
                p.tls.key_shares.iter().all(|k| key_share(*k).is_some()),
                "{}",
                p.name
            );
        }
    }

    /// BoringSSL takes every profile but those the catalogue marks as beyond it, and refuses
    /// those (were one accepted, its `unsupported` line should go).
    #[test]
    fn every_profile_builds_a_context_unless_marked_unsupported() {
        for p in PROFILES {
            match (context(p), p.unsupported) {
                (Ok(_), None) => {}
                (Err(e), None) => panic!("{}: {e}", p.name),
                (Ok(_), Some(why)) => panic!("{} builds, yet is marked: {why}", p.name),
                (Err(_), Some(_)) => {}
            }
        }
    }

    /// A decoder that panics on a server's bytes fails that decompression; nothing unwinds
    /// into BoringSSL.
    #[test]
    fn a_decoder_panic_fails_its_decompression() {
        let e = contained("zstd", || panic!("a decoder bug")).unwrap_err();
        assert_eq!(e.to_string(), "zstd panicked");
        assert!(contained("zstd", || Ok(())).is_ok());
    }

    #[test]
    fn decompressors_round_trip_and_refuse_garbage() {
        let chain = b"certificate chain bytes, repeated; ".repeat(100);
        let z = miniz_oxide::deflate::compress_to_vec_zlib(&chain, 6);
        let mut out = Vec::new();
        Zlib.decompress(&z, &mut out).unwrap();
        assert_eq!(out, chain);
        let mut out = Vec::new();
        assert!(Zlib.decompress(b"not zlib", &mut out).is_err());
        assert!(Zstd.decompress(b"not zstd", &mut Vec::new()).is_err());
        assert!(Brotli.decompress(&[0xff; 16], &mut Vec::new()).is_err());
    }
}
