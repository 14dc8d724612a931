//! TLS to destinations: the process-wide rustls client configuration (explicit ring provider,
//! webpki roots plus an optional operator CA file, ALPN `h2` then `http/1.1`) and the handshake.
//!
//! The handshake runs once per new connection; pooled connections skip it. On a direct
//! connection it runs on the socket in poll mode with tokio-rustls, because that is the form HTTP/2 (the `h2` crate) needs
//! if the destination chooses it; a destination that chooses HTTP/1.1 (or no ALPN) gets the
//! socket back in completion mode with the same rustls session inside monoio-rustls, the form
//! the HTTP/1.1 client reads fastest (decision 080). tokio-rustls buffers no ciphertext of its
//! own, so handing the session over loses nothing. Through an upstream proxy the destination is
//! offered HTTP/1.1 only (monoio-rustls, as before; decision 080).

use std::fmt;
use std::io::BufReader;
use std::net::SocketAddr;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use monoio::net::tcp::stream_poll::TcpStreamPoll;
use monoio::net::TcpStream;
use monoio_rustls::TlsConnector;
use rustls::client::Resumption;
use rustls::pki_types::{DnsName, ServerName};
use rustls::{ClientConfig, RootCertStore};
use sortie_core::error::ApiError;
use sortie_core::request::Host;

use super::error;
use super::stream::Conn;

/// The ALPN name of HTTP/1.1, offered second.
pub const ALPN_HTTP11: &[u8] = b"http/1.1";
/// The ALPN name of HTTP/2 over TLS (RFC 9113 §3.2), offered first.
pub const ALPN_H2: &[u8] = b"h2";
/// TLS sessions each core remembers for resumption.
pub const RESUMPTION_SESSIONS_PER_CORE: usize = 256;

/// Why the client configuration could not be built. Names the CA file and the reason.
#[derive(Debug)]
#[non_exhaustive]
pub enum TlsConfigError {
    /// The CA file could not be opened or read.
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// The CA file holds no PEM certificate, or a PEM section that does not parse.
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A certificate of the CA file is not a usable trust anchor.
    Certificate {
        /// The file.
        path: PathBuf,
        /// Position of the certificate in the file, from 0.
        index: usize,
        /// What rustls said.
        reason: String,
    },
    /// The crypto provider refused the protocol versions.
    Provider(String),
}

impl fmt::Display for TlsConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsConfigError::Read { path, source } => {
                write!(f, "egress ca_file {}: {source}", path.display())
            }
            TlsConfigError::Pem { path, reason } => {
                write!(f, "egress ca_file {}: {reason}", path.display())
            }
            TlsConfigError::Certificate {
                path,
                index,
                reason,
            } => write!(
                f,
                "egress ca_file {}: certificate {index} is not a usable trust anchor: {reason}",
                path.display()
            ),
            TlsConfigError::Provider(reason) => write!(f, "TLS provider: {reason}"),
        }
    }
}

impl std::error::Error for TlsConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TlsConfigError::Read { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Builds the client configuration shared by every core: the ring provider set explicitly (no
/// process default is consulted), the webpki roots plus the certificates of `extra_ca_file`
/// (`[egress] ca_file`, PEM), ALPN `h2` and `http/1.1` in that order (the server picks).
pub fn client_config(extra_ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, TlsConfigError> {
    let roots = root_store(extra_ca_file)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsConfigError::Provider(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP11.to_vec()];
    Ok(Arc::new(config))
}

/// The webpki roots plus the certificates of `extra_ca_file`.
fn root_store(extra_ca_file: Option<&Path>) -> Result<RootCertStore, TlsConfigError> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = extra_ca_file {
        add_ca_file(&mut roots, path)?;
    }
    Ok(roots)
}

/// The certificate verifier of ordinary TLS (webpki roots plus `extra_ca_file`, ring), for the
/// fingerprinted connector: both kinds of connection trust the same certificates.
#[cfg(feature = "fingerprints")]
pub(crate) fn server_verifier(
    extra_ca_file: Option<&Path>,
) -> Result<Arc<dyn rustls::client::danger::ServerCertVerifier>, TlsConfigError> {
    verifier_of(root_store(extra_ca_file)?)
}

/// The same verifier with one more trusted CA certificate (DER), for the self-test's capture
/// server.
#[cfg(feature = "fingerprints")]
pub(crate) fn server_verifier_with(
    extra_ca_der: Option<&[u8]>,
) -> Result<Arc<dyn rustls::client::danger::ServerCertVerifier>, TlsConfigError> {
    let mut roots = root_store(None)?;
    if let Some(der) = extra_ca_der {
        roots
            .add(rustls::pki_types::CertificateDer::from(der.to_vec()))
            .map_err(|e| TlsConfigError::Provider(e.to_string()))?;
    }
    verifier_of(roots)
}

#[cfg(feature = "fingerprints")]
fn verifier_of(
    roots: RootCertStore,
) -> Result<Arc<dyn rustls::client::danger::ServerCertVerifier>, TlsConfigError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| TlsConfigError::Provider(e.to_string()))?;
    Ok(verifier)
}

fn add_ca_file(roots: &mut RootCertStore, path: &Path) -> Result<(), TlsConfigError> {
    let file = std::fs::File::open(path).map_err(|source| TlsConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut reader = BufReader::new(file);
    let mut count = 0usize;
    for (index, cert) in rustls_pemfile::certs(&mut reader).enumerate() {
        let cert = cert.map_err(|e| TlsConfigError::Pem {
            path: path.to_path_buf(),
            reason: format!("certificate {index} does not parse: {e}"),
        })?;
        roots.add(cert).map_err(|e| TlsConfigError::Certificate {
            path: path.to_path_buf(),
            index,
            reason: e.to_string(),
        })?;
        count += 1;
    }
    if count == 0 {
        return Err(TlsConfigError::Pem {
            path: path.to_path_buf(),
            reason: "no PEM CERTIFICATE section found".into(),
        });
    }
    Ok(())
}

/// A copy of the shared configuration with its own resumption cache, so that cores never
/// contend on one session store, offering HTTP/1.1 only: the connector of connections through
/// an upstream proxy.
pub(crate) fn per_core_connector(shared: &Arc<ClientConfig>) -> TlsConnector {
    let mut config = ClientConfig::clone(shared);
    config.resumption = Resumption::in_memory_sessions(RESUMPTION_SESSIONS_PER_CORE);
    config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
    TlsConnector::from(Arc::new(config))
}

/// The connector of direct connections: the shared configuration (ALPN `h2`, `http/1.1`) with
/// its own per-core resumption cache.
pub(crate) fn per_core_direct_connector(shared: &Arc<ClientConfig>) -> tokio_rustls::TlsConnector {
    let mut config = ClientConfig::clone(shared);
    config.resumption = Resumption::in_memory_sessions(RESUMPTION_SESSIONS_PER_CORE);
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// The name the certificate must match, also sent as SNI for DNS names (RFC 6066 §3: "Literal
/// IPv4 and IPv6 addresses are not permitted in HostName"; rustls sends none for addresses).
pub(crate) fn server_name(host: &Host) -> Result<ServerName<'static>, ApiError> {
    match host {
        Host::Domain(d) => DnsName::try_from(d.to_string())
            .map(ServerName::DnsName)
            .map_err(|_| error::internal("the destination host is not a valid TLS server name")),
        Host::V4(a) => Ok(ServerName::IpAddress(std::net::IpAddr::V4(*a).into())),
        Host::V6(a) => Ok(ServerName::IpAddress(std::net::IpAddr::V6(*a).into())),
    }
}

/// A TLS session after the handshake, in the form its application protocol runs on.
pub(crate) enum Negotiated {
    /// HTTP/1.1 (or no ALPN answer): the HTTP/1.1 client's connection.
    Http1(Conn),
    /// HTTP/2: the stream in poll mode, for the `h2` crate.
    H2(Box<tokio_rustls::client::TlsStream<TcpStreamPoll>>),
}

/// Runs the TLS handshake over a connected stream (HTTP/1.1 only, through upstream proxies).
/// Any failure is `upstream_tls_failure`.
pub(crate) async fn handshake(
    connector: &TlsConnector,
    name: ServerName<'static>,
    stream: TcpStream,
    peer: SocketAddr,
) -> Result<Conn, ApiError> {
    let fd = stream.as_raw_fd();
    match connector.connect(name, stream).await {
        Ok(tls) => Ok(Conn::tls(tls, fd, peer)),
        Err(e) => Err(error::tls_failure(&std::io::Error::from(e))),
    }
}

/// Runs the TLS handshake of a direct connection, offering `h2` and `http/1.1`, and hands the
/// session over in the form the negotiated protocol runs on. Any failure is
/// `upstream_tls_failure`.
pub(crate) async fn handshake_negotiating(
    connector: &tokio_rustls::TlsConnector,
    name: ServerName<'static>,
    stream: TcpStream,
    peer: SocketAddr,
) -> Result<Negotiated, ApiError> {
    let fd = stream.as_raw_fd();
    let poll = stream
        .try_into_poll_io()
        .map_err(|(e, _)| error::tls_failure(&e))?;
    let tls = connector
        .connect(name, poll)
        .await
        .map_err(|e| error::tls_failure(&e))?;
    if tls.get_ref().1.alpn_protocol() == Some(ALPN_H2) {
        return Ok(Negotiated::H2(Box::new(tls)));
    }
    let (poll, session) = tls.into_inner();
    let stream = poll
        .try_into_comp_io()
        .map_err(|_| error::internal("the TLS socket could not return to completion mode"))?;
    Ok(Negotiated::Http1(Conn::tls(
        monoio_rustls::ClientTlsStream::new(stream, session),
        fd,
        peer,
    )))
}

/// Runs the TLS handshake with the destination inside the TLS session with an `https://`
/// upstream proxy; `fd` is the descriptor of the TCP stream to the proxy. Any failure is
/// `upstream_tls_failure` (the tunnel is up: the destination's TLS failed).
pub(crate) async fn handshake_in_tls(
    connector: &TlsConnector,
    name: ServerName<'static>,
    stream: monoio_rustls::ClientTlsStream<TcpStream>,
    fd: std::os::fd::RawFd,
    peer: SocketAddr,
) -> Result<Conn, ApiError> {
    match connector.connect(name, stream).await {
        Ok(tls) => Ok(Conn::tls_in_tls(tls, fd, peer)),
        Err(e) => Err(error::tls_failure(&std::io::Error::from(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn config_offers_h2_then_http11_with_explicit_provider() {
        let c = client_config(None).unwrap();
        assert_eq!(c.alpn_protocols, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
        assert!(c.crypto_provider().cipher_suites.len() > 1);
    }

    #[test]
    fn ca_file_errors_name_the_file_and_reason() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let e = client_config(Some(&missing)).unwrap_err();
        assert!(matches!(e, TlsConfigError::Read { .. }), "{e:?}");
        assert!(e.to_string().contains("missing.pem"), "{e}");

        let empty = dir.path().join("empty.pem");
        std::fs::File::create(&empty)
            .unwrap()
            .write_all(b"not a pem file\n")
            .unwrap();
        let e = client_config(Some(&empty)).unwrap_err();
        assert!(matches!(e, TlsConfigError::Pem { .. }), "{e:?}");
        assert!(e.to_string().contains("empty.pem"), "{e}");
        assert!(e.to_string().contains("no PEM CERTIFICATE"), "{e}");

        let garbage = dir.path().join("garbage.pem");
        std::fs::File::create(&garbage)
            .unwrap()
            .write_all(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
            .unwrap();
        let e = client_config(Some(&garbage)).unwrap_err();
        assert!(
            matches!(e, TlsConfigError::Certificate { index: 0, .. }),
            "{e:?}"
        );
    }

    #[test]
    fn server_names_for_each_host_form() {
        let table: &[(Host, &str)] = &[
            (Host::Domain("example.com".into()), "DnsName"),
            (Host::V4("127.0.0.1".parse().unwrap()), "IpAddress"),
            (Host::V6("::1".parse().unwrap()), "IpAddress"),
        ];
        for (host, kind) in table {
            let name = server_name(host).unwrap();
            assert!(format!("{name:?}").starts_with(kind), "{host:?}: {name:?}");
        }
    }
}
