//! One bus connection: plain TCP or TLS (rustls driven by hand over the runtime's socket), with
//! a reader and a writer half that run as two tasks of one core.
//!
//! rustls is driven directly (`read_tls`, `process_new_packets`, `write_tls`) rather than
//! through a stream adapter because a lane is handed from the core that accepted it to the core
//! its hello names: the TCP descriptor and the `rustls::Connection` (which is `Send`) cross
//! threads, and the receiving core builds its halves around them.

use std::cell::RefCell;
use std::io::{self, Read as _, Write as _};
use std::rc::Rc;
use std::sync::Arc;

use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt as _, OwnedReadHalf};
use monoio::io::{OwnedWriteHalf, Splitable as _};
use monoio::net::TcpStream;

/// The most bytes read from the socket at a time.
const READ_BYTES: usize = 64 * 1024;
/// Bytes read at a time on a new connection: a lane at rest carries heartbeats of a few bytes,
/// and an idle worker's lanes should cost little memory (and no page faults) on a control
/// with thousands of them. A read that fills the buffer doubles it, up to [`READ_BYTES`].
const FIRST_READ_BYTES: usize = 4 * 1024;

/// A TLS session shared by the two halves of one connection.
type Tls = Rc<RefCell<rustls::Connection>>;

/// One side of a bus connection: the whole stream before it is split, or one half.
pub(crate) struct Conn<S> {
    io: S,
    tls: Option<Tls>,
    /// Ciphertext read from the socket (unused without TLS, whose bytes are read straight into
    /// the caller's buffer), fed to the session from `raw_at` on: feeding stops at a record that
    /// leaves plaintext to read, so the session's plaintext buffer never overflows, and resumes
    /// once it was read.
    raw: Vec<u8>,
    raw_at: usize,
    /// Bytes the next read asks for: doubled by every read that filled it.
    read_size: usize,
    /// Ciphertext on its way to the socket (the writing side's buffer, reused).
    sealed: Vec<u8>,
}

/// The reading half of a split connection.
pub(crate) type ReadConn = Conn<OwnedReadHalf<TcpStream>>;
/// The writing half of a split connection.
pub(crate) type WriteConn = Conn<OwnedWriteHalf<TcpStream>>;

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl Conn<TcpStream> {
    /// A plain TCP connection.
    pub(crate) fn plain(io: TcpStream) -> Conn<TcpStream> {
        let _ = io.set_nodelay(true);
        Conn {
            io,
            tls: None,
            raw: Vec::new(),
            raw_at: 0,
            read_size: FIRST_READ_BYTES,
            sealed: Vec::new(),
        }
    }

    /// Leaves this connection's liveness to the kernel's keepalive probes, `every` apart
    /// (decision 118).
    pub(crate) fn keep_alive(&self, every: std::time::Duration) {
        if let Err(e) = crate::fd::set_lane_keepalive(&self.io, every) {
            tracing::warn!(error = %e, "cannot set TCP keepalive on a bus lane");
        }
    }

    /// A connection whose TLS session is already established (handed over from another core).
    pub(crate) fn with_session(io: TcpStream, tls: rustls::Connection) -> Conn<TcpStream> {
        let _ = io.set_nodelay(true);
        Conn {
            io,
            tls: Some(Rc::new(RefCell::new(tls))),
            raw: Vec::new(),
            raw_at: 0,
            read_size: FIRST_READ_BYTES,
            sealed: Vec::new(),
        }
    }

    /// A CONNECT tunnel's connection to its destination, driven like a bus connection: raw TCP
    /// as it is, TLS to an `https://` upstream proxy taken apart from its stream adapter into
    /// the socket and the session (the adapter reads straight into the session's buffer, so no
    /// ciphertext is left behind), so that its two halves never share more than the session.
    pub(crate) fn tunnel(upstream: crate::egress::TunnelStream) -> Conn<TcpStream> {
        match upstream {
            crate::egress::TunnelStream::Tcp(tcp) => Conn::plain(tcp),
            crate::egress::TunnelStream::Tls(tls) => {
                let (tcp, session) = tls.into_parts();
                Conn::with_session(tcp, session.into())
            }
        }
    }

    /// Runs the TLS handshake as the server.
    pub(crate) async fn accept_tls(
        io: TcpStream,
        config: Arc<rustls::ServerConfig>,
    ) -> io::Result<Conn<TcpStream>> {
        let tls = rustls::ServerConnection::new(config).map_err(tls_error)?;
        Conn::handshake(io, tls.into()).await
    }

    /// Runs the TLS handshake as the client, verifying the server's certificate for `name`.
    pub(crate) async fn connect_tls(
        io: TcpStream,
        config: Arc<rustls::ClientConfig>,
        name: rustls::pki_types::ServerName<'static>,
    ) -> io::Result<Conn<TcpStream>> {
        let tls = rustls::ClientConnection::new(config, name).map_err(tls_error)?;
        Conn::handshake(io, tls.into()).await
    }

    async fn handshake(io: TcpStream, tls: rustls::Connection) -> io::Result<Conn<TcpStream>> {
        let mut c = Conn::with_session(io, tls);
        loop {
            c.flush_tls().await?;
            let is_handshaking = c.tls.as_ref().is_some_and(|t| t.borrow().is_handshaking());
            if !is_handshaking {
                return Ok(c);
            }
            match c.fill_tls().await {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(_) => {}
                Err(e) => {
                    // The session queued an alert saying why (a missing or untrusted client
                    // certificate, say): send it, so the peer can tell its operator.
                    let _ = c.flush_tls().await;
                    return Err(e);
                }
            }
        }
    }

    /// The descriptor and TLS session, to hand the connection to another core. Fails while the
    /// TLS session is shared (never, before [`Conn::split`]).
    pub(crate) fn into_parts(
        self,
    ) -> io::Result<(std::net::TcpStream, Option<rustls::Connection>)> {
        use std::os::fd::AsRawFd as _;
        if self.tls.is_some() && self.raw_at < self.raw.len() {
            // Never the case for a lane (its peer waits for the hello's answer), but the bytes
            // would be lost with the handover.
            return Err(io::Error::other(
                "ciphertext read but not fed to the TLS session",
            ));
        }
        let std = crate::fd::duplicate_std(self.io.as_raw_fd())?;
        let tls = match self.tls {
            None => None,
            Some(t) => Some(
                Rc::try_unwrap(t)
                    .map_err(|_| io::Error::other("TLS session still shared"))?
                    .into_inner(),
            ),
        };
        Ok((std, tls))
    }

    /// Whether the peer's TLS certificate (verified during the handshake against the client
    /// CA of the listener) names `worker_id` as a DNS name in its subject alternative names
    /// (decision 109). `false` without TLS, without a certificate or for an id that is not a
    /// DNS name.
    pub(crate) fn peer_names(&self, worker_id: &str) -> bool {
        let Some(tls) = &self.tls else {
            return false;
        };
        let tls = tls.borrow();
        let Some(cert) = tls.peer_certificates().and_then(|c| c.first()) else {
            return false;
        };
        let Ok(name) = rustls::pki_types::ServerName::try_from(worker_id) else {
            return false;
        };
        if !matches!(name, rustls::pki_types::ServerName::DnsName(_)) {
            return false;
        }
        rustls::server::ParsedCertificate::try_from(cert)
            .is_ok_and(|parsed| rustls::client::verify_server_name(&parsed, &name).is_ok())
    }

    /// The local address of the connection (the control's address as the worker dialled it).
    pub(crate) fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.io.local_addr().ok()
    }

    /// The reading and writing halves.
    pub(crate) fn split(self) -> (ReadConn, WriteConn) {
        let (r, w) = self.io.into_split();
        (
            Conn {
                io: r,
                tls: self.tls.clone(),
                raw: self.raw,
                raw_at: self.raw_at,
                read_size: self.read_size,
                sealed: Vec::new(),
            },
            Conn {
                io: w,
                tls: self.tls,
                raw: Vec::new(),
                raw_at: 0,
                read_size: FIRST_READ_BYTES,
                sealed: self.sealed,
            },
        )
    }
}

impl<S: AsyncReadRent + AsyncWriteRent> Conn<S> {
    /// Writes whatever the TLS session wants to send.
    async fn flush_tls(&mut self) -> io::Result<()> {
        let Some(tls) = &self.tls else { return Ok(()) };
        let mut out = Vec::new();
        {
            let mut t = tls.borrow_mut();
            while t.wants_write() {
                t.write_tls(&mut out)?;
            }
        }
        if !out.is_empty() {
            let (r, _) = self.io.write_all(out).await;
            r?;
        }
        Ok(())
    }
}

impl<S: AsyncReadRent> Conn<S> {
    /// Feeds the TLS session what is left of the last read, or else reads ciphertext once and
    /// feeds it; the byte count fed or read (0 at EOF).
    async fn fill_tls(&mut self) -> io::Result<usize> {
        let n = match self.raw.len().saturating_sub(self.raw_at) {
            0 => self.read_raw().await?,
            left => left,
        };
        self.feed_tls()?;
        Ok(n)
    }

    /// Reads from the socket into `raw`, replacing what it held (all of it fed already).
    async fn read_raw(&mut self) -> io::Result<usize> {
        let mut buf = std::mem::take(&mut self.raw);
        buf.clear();
        self.raw_at = 0;
        if buf.capacity() < self.read_size {
            buf.reserve_exact(self.read_size);
        }
        let (r, buf) = self.io.read(buf).await;
        self.grow_if_filled(&r, buf.capacity());
        self.raw = buf;
        r
    }

    /// Doubles the next read's size (up to [`READ_BYTES`]) after a read that filled all the
    /// `room` it was given.
    fn grow_if_filled(&mut self, read: &io::Result<usize>, room: usize) {
        if read.as_ref().is_ok_and(|&n| n > 0 && n >= room) {
            self.read_size = (self.read_size * 2).min(READ_BYTES);
        }
    }

    /// Without TLS: one read straight into `out`'s spare capacity, `read_size` bytes at most (no
    /// copy through `raw`). `out` is taken for the read: a read dropped before it completes
    /// loses what `out` held, as the caller's loop, which ends with it, does too.
    async fn read_plain(&mut self, out: &mut Vec<u8>) -> io::Result<usize> {
        use monoio::buf::IoBufMut as _;
        let mut buf = std::mem::take(out);
        let len = buf.len();
        buf.reserve(self.read_size);
        let (r, slice) = self.io.read(buf.slice_mut(len..len + self.read_size)).await;
        *out = slice.into_inner();
        self.grow_if_filled(&r, self.read_size);
        r
    }

    /// Feeds `raw` from `raw_at` to the TLS session until it is all fed or a record left
    /// plaintext to read: rustls refuses more records while its plaintext buffer is full, so
    /// the reader drains it before the rest is fed.
    fn feed_tls(&mut self) -> io::Result<()> {
        let Some(tls) = &self.tls else { return Ok(()) };
        let mut t = tls.borrow_mut();
        while let Some(mut rest) = self.raw.get(self.raw_at..).filter(|r| !r.is_empty()) {
            let n = t.read_tls(&mut rest)?;
            if n == 0 {
                break;
            }
            self.raw_at = self.raw_at.saturating_add(n);
            let state = t.process_new_packets().map_err(tls_error)?;
            if state.plaintext_bytes_to_read() > 0 {
                break;
            }
        }
        Ok(())
    }

    /// Plaintext the TLS session holds, appended to `out`; `Ok(None)` once the peer closed the
    /// session cleanly.
    fn drain_plain(&self, out: &mut Vec<u8>) -> io::Result<Option<usize>> {
        let Some(tls) = &self.tls else {
            return Ok(Some(0));
        };
        let mut t = tls.borrow_mut();
        let before = out.len();
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match t.reader().read(&mut chunk) {
                Ok(0) => {
                    let n = out.len() - before;
                    return Ok(if n == 0 { None } else { Some(n) });
                }
                Ok(n) => out.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Ok(Some(out.len() - before))
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Appends the next plaintext bytes to `out`; 0 at the end of the stream.
    pub(crate) async fn read(&mut self, out: &mut Vec<u8>) -> io::Result<usize> {
        if self.tls.is_none() {
            return self.read_plain(out).await;
        }
        loop {
            match self.drain_plain(out)? {
                None => return Ok(0),
                Some(0) => {}
                Some(n) => return Ok(n),
            }
            if self.fill_tls().await? == 0 {
                return Ok(0);
            }
        }
    }
}

impl<S: AsyncWriteRent> Conn<S> {
    /// Ends the sending side: `close_notify` first when TLS, then the TCP half-close.
    pub(crate) async fn close_write(&mut self) -> io::Result<()> {
        if let Some(tls) = &self.tls {
            let mut out = Vec::new();
            {
                let mut t = tls.borrow_mut();
                t.send_close_notify();
                while t.wants_write() {
                    t.write_tls(&mut out)?;
                }
            }
            if !out.is_empty() {
                let (r, _) = self.io.write_all(out).await;
                r?;
            }
        }
        self.io.shutdown().await
    }

    /// Writes `plain` whole (encrypted when TLS); gives the buffer back for reuse.
    pub(crate) async fn write_all(&mut self, plain: Vec<u8>) -> (io::Result<()>, Vec<u8>) {
        let Some(tls) = &self.tls else {
            let (r, buf) = self.io.write_all(plain).await;
            return (r.map(|_| ()), buf);
        };
        let mut out = std::mem::take(&mut self.sealed);
        out.clear();
        {
            let mut t = tls.borrow_mut();
            let mut at = 0;
            while at < plain.len() {
                match t.writer().write(&plain[at..]) {
                    Ok(n) => at += n,
                    Err(e) => return (Err(e), plain),
                }
                while t.wants_write() {
                    if let Err(e) = t.write_tls(&mut out) {
                        return (Err(e), plain);
                    }
                }
            }
        }
        let (r, buf) = self.io.write_all(out).await;
        self.sealed = buf;
        (r.map(|_| ()), plain)
    }
}

/// A certificate chain and its private key, from PEM files named by the configuration keys
/// `key` + `.tls_cert_file` / `.tls_key_file` (for messages).
pub(crate) struct CertKey<'a> {
    /// `control.bus` or `worker`.
    pub(crate) key: &'a str,
    /// The chain's file.
    pub(crate) cert_file: &'a str,
    /// The key's file.
    pub(crate) key_file: &'a str,
}

/// Why a bus TLS configuration could not be built: each names the setting and the file.
#[derive(Debug, thiserror::Error)]
pub enum BusTlsError {
    /// A file could not be read, or not as PEM.
    #[error("{setting} {file}: {source}")]
    Read {
        /// The setting that names the file.
        setting: String,
        /// The file.
        file: String,
        /// Why.
        source: io::Error,
    },
    /// A certificate file holds no certificate.
    #[error("{setting} {file}: no certificate")]
    NoCertificate {
        /// The setting that names the file.
        setting: String,
        /// The file.
        file: String,
    },
    /// A key file holds no private key.
    #[error("{setting} {file}: no private key")]
    NoKey {
        /// The setting that names the file.
        setting: String,
        /// The file.
        file: String,
    },
    /// rustls refused what was read: a certificate, a key, or a verifier over the CA.
    #[error("{what}: {source}")]
    Refused {
        /// The setting (and file) refused.
        what: String,
        /// rustls's reason.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn refused<E: std::error::Error + Send + Sync + 'static>(
    what: impl Into<String>,
) -> impl FnOnce(E) -> BusTlsError {
    let what = what.into();
    move |e| BusTlsError::Refused {
        what,
        source: Box::new(e),
    }
}

/// A file named by `setting` that could not be read.
fn unreadable(setting: &str, file: &str) -> impl FnOnce(io::Error) -> BusTlsError {
    let (setting, file) = (setting.to_string(), file.to_string());
    move |source| BusTlsError::Read {
        setting,
        file,
        source,
    }
}

type Identity = (
    Vec<rustls::pki_types::CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
);

impl CertKey<'_> {
    fn load(&self) -> Result<Identity, BusTlsError> {
        let (k, cert_file, key_file) = (self.key, self.cert_file, self.key_file);
        let cert_setting = format!("{k}.tls_cert_file");
        let certs: Vec<_> = rustls_pemfile::certs(&mut io::BufReader::new(
            std::fs::File::open(cert_file).map_err(unreadable(&cert_setting, cert_file))?,
        ))
        .collect::<Result<_, _>>()
        .map_err(unreadable(&cert_setting, cert_file))?;
        if certs.is_empty() {
            return Err(BusTlsError::NoCertificate {
                setting: cert_setting,
                file: cert_file.into(),
            });
        }
        let key_setting = format!("{k}.tls_key_file");
        let key = rustls_pemfile::private_key(&mut io::BufReader::new(
            std::fs::File::open(key_file).map_err(unreadable(&key_setting, key_file))?,
        ))
        .map_err(unreadable(&key_setting, key_file))?
        .ok_or_else(|| BusTlsError::NoKey {
            setting: key_setting.clone(),
            file: key_file.into(),
        })?;
        Ok((certs, key))
    }
}

/// The certificates of a PEM CA file as trust roots; `key` names the setting in messages.
fn roots(key: &str, file: &str) -> Result<rustls::RootCertStore, BusTlsError> {
    let mut roots = rustls::RootCertStore::empty();
    let f = std::fs::File::open(file).map_err(unreadable(key, file))?;
    for cert in rustls_pemfile::certs(&mut io::BufReader::new(f)) {
        let cert = cert.map_err(unreadable(key, file))?;
        roots.add(cert).map_err(refused(format!("{key} {file}")))?;
    }
    if roots.is_empty() {
        return Err(BusTlsError::NoCertificate {
            setting: key.into(),
            file: file.into(),
        });
    }
    Ok(roots)
}

/// The bus listener's TLS configuration from PEM files (`control.bus.tls_cert_file`,
/// `tls_key_file`), ring provider set explicitly. With `client_ca_file`
/// (`control.bus.tls_client_ca_file`) every worker must present a certificate chaining to it
/// (decision 109).
pub(crate) fn server_config(
    identity: &CertKey<'_>,
    client_ca_file: Option<&str>,
) -> Result<Arc<rustls::ServerConfig>, BusTlsError> {
    let (certs, key) = identity.load()?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(refused("control.bus"))?;
    let builder = match client_ca_file {
        None => builder.with_no_client_auth(),
        Some(file) => {
            let roots = roots("control.bus.tls_client_ca_file", file)?;
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(refused(format!("control.bus.tls_client_ca_file {file}")))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(certs, key)
        .map_err(refused("control.bus"))?;
    Ok(Arc::new(config))
}

/// A worker's TLS configuration: only the certificates of `worker.ca_file` are trusted; with
/// `identity` (`worker.tls_cert_file`, `tls_key_file`) the worker presents its certificate to
/// controls that ask for one.
pub(crate) fn client_config(
    ca_file: &str,
    identity: Option<&CertKey<'_>>,
) -> Result<Arc<rustls::ClientConfig>, BusTlsError> {
    let roots = roots("worker.ca_file", ca_file)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(refused("worker"))?
        .with_root_certificates(roots);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some(id) => {
            let (certs, key) = id.load()?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(refused("worker.tls_cert_file"))?
        }
    };
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bad file is named with the setting that points at it, and the reason is typed.
    #[test]
    fn bad_tls_files_are_named_with_their_setting() {
        let dir = tempfile::tempdir().expect("dir");
        let missing = dir.path().join("missing.pem");
        let missing = missing.to_str().expect("utf-8 path");
        let e = client_config(missing, None).expect_err("refused");
        assert!(matches!(e, BusTlsError::Read { .. }), "{e}");
        assert!(
            e.to_string()
                .starts_with(&format!("worker.ca_file {missing}: ")),
            "{e}"
        );

        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let empty = empty.to_str().expect("utf-8 path");
        let e = client_config(empty, None).expect_err("refused");
        assert!(matches!(e, BusTlsError::NoCertificate { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            format!("worker.ca_file {empty}: no certificate")
        );

        let identity = CertKey {
            key: "control.bus",
            cert_file: empty,
            key_file: missing,
        };
        let e = server_config(&identity, None).expect_err("refused");
        assert_eq!(
            e.to_string(),
            format!("control.bus.tls_cert_file {empty}: no certificate")
        );
    }
}
