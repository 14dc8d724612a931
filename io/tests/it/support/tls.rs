//! A test certificate authority made with rcgen: a CA certificate written to a PEM file (what
//! `[egress] ca_file` points at) and server configurations for leaf certificates it signs, plus
//! a self-signed server configuration no client trusts.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::ServerConfig;

/// A CA whose certificate lives in a temporary PEM file.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
    _dir: tempfile::TempDir,
    file: PathBuf,
}

impl TestCa {
    /// A fresh CA.
    pub fn new() -> TestCa {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params
            .distinguished_name
            .push(DnType::CommonName, "Sortie test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).expect("CA certificate");
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("ca.pem");
        std::fs::write(&file, cert.pem()).expect("CA file written");
        TestCa {
            cert,
            key,
            _dir: dir,
            file,
        }
    }

    /// The PEM file of the CA certificate.
    pub fn ca_file(&self) -> &Path {
        &self.file
    }

    /// A server configuration with a leaf for `names` (DNS names or IP addresses) signed by
    /// this CA.
    pub fn server_config(&self, names: &[&str]) -> Arc<ServerConfig> {
        let (leaf, key) = self.leaf(names);
        server_config_for(
            vec![leaf.der().clone(), self.cert.der().clone()],
            key.serialize_der(),
        )
    }

    /// A leaf certificate for `names` signed by this CA, with its key.
    fn leaf(&self, names: &[&str]) -> (rcgen::Certificate, KeyPair) {
        let key = KeyPair::generate().expect("leaf key");
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("leaf params");
        params
            .distinguished_name
            .push(DnType::CommonName, "sortie test leaf");
        let leaf = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("leaf certificate");
        (leaf, key)
    }

    /// A leaf for `names` signed by this CA, written as PEM files into `dir` for servers that
    /// read them (nginx): returns the certificate chain file and the key file.
    pub fn leaf_pem_files(&self, names: &[&str], dir: &Path) -> (PathBuf, PathBuf) {
        let (leaf, key) = self.leaf(names);
        let cert_file = dir.join("leaf.pem");
        let key_file = dir.join("leaf.key");
        std::fs::write(&cert_file, format!("{}{}", leaf.pem(), self.cert.pem()))
            .expect("leaf written");
        std::fs::write(&key_file, key.serialize_pem()).expect("key written");
        (cert_file, key_file)
    }

    /// A leaf for `names` signed by this CA as PEM: (certificate chain, PKCS#8 key), for
    /// servers that read files (squid's `https_port`).
    pub fn leaf_pem(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().expect("leaf key");
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("leaf params");
        params
            .distinguished_name
            .push(DnType::CommonName, "sortie test leaf");
        let leaf = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("leaf certificate");
        (
            format!("{}{}", leaf.pem(), self.cert.pem()),
            key.serialize_pem(),
        )
    }

    /// The usual leaf: `localhost` and `127.0.0.1`.
    pub fn localhost_config(&self) -> Arc<ServerConfig> {
        self.server_config(&["localhost", "127.0.0.1"])
    }
}

/// A server configuration with a self-signed certificate for `localhost` and `127.0.0.1` that
/// no client trusts.
pub fn untrusted_config() -> Arc<ServerConfig> {
    let key = KeyPair::generate().expect("key");
    let params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .expect("params");
    let cert = params.self_signed(&key).expect("self-signed certificate");
    server_config_for(vec![cert.der().clone()], key.serialize_der())
}

fn server_config_for(chain: Vec<CertificateDer<'static>>, key_der: Vec<u8>) -> Arc<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(
            chain,
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_der)),
        )
        .expect("server certificate");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}
