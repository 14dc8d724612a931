//! Browser fingerprint profiles on the wire (decision 081): the BoringSSL connector built from
//! each profile's data (`boring.rs`, cargo feature `fingerprints`), the loopback capture server
//! (`capture.rs`) and the self-test that connects to it with every profile and compares what it
//! captured with the profile's expected JA4, JA4_r, JA3N and Akamai strings.
//!
//! A process advertises a profile only after the self-test passed for it:
//! [`verify_at_startup`] runs the self-test once and installs the connectors with the verified
//! profiles; [`verified_profiles`] lists them (what a worker advertises). A build without the
//! feature has no connector, passes no self-test and advertises nothing
//! ([`UNAVAILABLE_REASON`] says why).

#[cfg(feature = "fingerprints")]
mod boring;
pub mod capture;

use std::path::Path;
use std::sync::OnceLock;
#[cfg(feature = "fingerprints")]
use std::time::Duration;

use sortie_core::fingerprint::profile::Profile;
#[cfg(feature = "fingerprints")]
use sortie_core::fingerprint::profile::PROFILES;
use sortie_core::fingerprint::tls::TlsFingerprint;

use self::capture::Capture;

#[cfg(feature = "fingerprints")]
pub(crate) use self::boring::{handshake, is_h2, BoringStream, Connectors, HandshakeError};

/// Whether this build has the fingerprinted connector.
pub const IS_BUILT: bool = cfg!(feature = "fingerprints");

/// What a build without the connector says about its (absent) profiles.
pub const UNAVAILABLE_REASON: &str = "this build has no fingerprinted connector: build with \
     `cargo build --release --features fingerprints` (BoringSSL; needs cmake and libclang)";

/// How long the self-test waits for one profile's connection.
#[cfg(feature = "fingerprints")]
const SELF_TEST_LIMIT: Duration = Duration::from_secs(10);

/// The outcome of the self-test for one profile.
#[derive(Debug, Clone)]
pub struct SelfTest {
    /// The profile.
    pub profile: &'static Profile,
    /// What the capture server saw, when the connection got that far.
    pub capture: Option<Capture>,
    /// Each difference from the profile's expectations (`what: expected …, captured …`), or
    /// why the connection failed; empty when the profile passed.
    pub problems: Vec<String>,
}

impl SelfTest {
    /// Whether every expected string was reproduced.
    pub fn is_pass(&self) -> bool {
        self.problems.is_empty() && self.capture.is_some()
    }

    /// Why the profile was not tried: the linked BoringSSL cannot send it
    /// ([`Profile::unsupported`]). Such a profile is never advertised, and is no failure of
    /// the self-test.
    pub fn unsupported(&self) -> Option<&'static str> {
        self.profile.unsupported
    }
}

/// Compares a capture with what `profile` expects: JA4, JA4_r, JA3N, the Akamai string and,
/// since Akamai's string leaves it out, the HEADERS frame's priority.
pub fn compare(profile: &Profile, c: &Capture) -> Vec<String> {
    let mut problems = Vec::new();
    let tls = tls_strings(profile, c);
    let mut check = |what: &str, expected: &str, got: &str| {
        if expected != got {
            problems.push(format!("{what}: expected {expected}, captured {got}"));
        }
    };
    let e = &profile.expected;
    check("JA4", e.ja4, &tls.ja4);
    check("JA4_r", e.ja4_r, &tls.ja4_r);
    check("JA3N", e.ja3n, &tls.ja3n);
    check("ALPN", "h2", c.alpn.as_deref().unwrap_or("none"));
    check(
        "Akamai",
        e.akamai,
        c.akamai().as_deref().unwrap_or("no HTTP/2"),
    );
    let prio = |p: Option<(bool, u32, u16)>| match p {
        Some((x, d, w)) => format!("exclusive={x} depends_on={d} weight={w}"),
        None => "none".to_string(),
    };
    let got = c.http2.as_ref().and_then(|h| h.headers_priority);
    check(
        "HEADERS priority",
        &prio(profile.http2.headers_priority),
        &prio(got),
    );
    problems
}

/// The TLS strings of a capture as `profile` states them: without the padding extension when
/// the profile's padding varies between connections, as captured otherwise.
pub fn tls_strings(profile: &Profile, c: &Capture) -> TlsFingerprint {
    if !profile.tls.padding_varies {
        return c.tls.clone();
    }
    sortie_core::fingerprint::tls::fingerprint_unpadded(&c.hello)
}

struct Installed {
    verified: Vec<&'static Profile>,
    #[cfg(feature = "fingerprints")]
    connectors: Option<std::sync::Arc<Connectors>>,
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();

/// The names of the profiles this process verified at startup, in the built-in order: what a
/// worker of this process advertises. Empty before [`verify_at_startup`], and always in a build
/// without the `fingerprints` feature.
pub fn verified_profiles() -> Vec<String> {
    INSTALLED
        .get()
        .map(|i| i.verified.iter().map(|p| p.name.to_string()).collect())
        .unwrap_or_default()
}

/// The verified profile named `name`, if this process verified it.
pub fn verified(name: &str) -> Option<&'static Profile> {
    INSTALLED
        .get()?
        .verified
        .iter()
        .copied()
        .find(|p| p.name == name)
}

/// The connectors of the verified profiles.
#[cfg(feature = "fingerprints")]
pub(crate) fn connectors() -> Option<&'static Connectors> {
    INSTALLED.get()?.connectors.as_deref()
}

/// Runs the self-test once for the process and installs the connectors (trusting the webpki
/// roots plus `ca_file`, as ordinary TLS does) with the profiles that passed; later calls
/// return the first call's outcome. In a build without the feature nothing is tested and
/// nothing is advertised.
pub fn verify_at_startup(ca_file: Option<&Path>) -> Result<Vec<SelfTest>, String> {
    #[cfg(feature = "fingerprints")]
    {
        static FIRST: OnceLock<Result<Vec<SelfTest>, String>> = OnceLock::new();
        FIRST
            .get_or_init(|| {
                let verifier = super::tls::server_verifier(ca_file).map_err(|e| e.to_string())?;
                let connectors = std::sync::Arc::new(Connectors::new(verifier)?);
                let results = self_test()?;
                let verified = results
                    .iter()
                    .filter(|r| r.is_pass())
                    .map(|r| r.profile)
                    .collect();
                let _ = INSTALLED.set(Installed {
                    verified,
                    connectors: Some(connectors),
                });
                Ok(results)
            })
            .clone()
    }
    #[cfg(not(feature = "fingerprints"))]
    {
        let _ = ca_file;
        let _ = INSTALLED.set(Installed {
            verified: Vec::new(),
        });
        Ok(Vec::new())
    }
}

/// The loopback self-test of every built-in profile: a capture server, one connection per
/// profile through the fingerprinted connector and the profile's HTTP/2 settings (a `GET /`
/// with a few headers), each capture compared with the profile's expectations. Runs on a
/// thread of its own (a monoio runtime), so it can be called from anywhere. A build without
/// the feature tests nothing.
pub fn self_test() -> Result<Vec<SelfTest>, String> {
    #[cfg(feature = "fingerprints")]
    {
        std::thread::Builder::new()
            .name("fingerprint-self-test".into())
            .spawn(run_self_test)
            .map_err(|e| format!("thread: {e}"))?
            .join()
            .map_err(|_| "the self-test thread panicked".to_string())?
    }
    #[cfg(not(feature = "fingerprints"))]
    {
        Ok(Vec::new())
    }
}

#[cfg(feature = "fingerprints")]
fn run_self_test() -> Result<Vec<SelfTest>, String> {
    let server = capture::CaptureServer::start()?;
    let verifier =
        super::tls::server_verifier_with(Some(server.ca_der())).map_err(|e| e.to_string())?;
    let connectors = Connectors::new(verifier)?;
    let mut out = Vec::with_capacity(PROFILES.len());
    // One profile after the other on a runtime of the driver the process uses; each capture is
    // taken before the next connection starts (waiting blocks this thread, which runs nothing
    // else).
    crate::runtime::run_on(crate::runtime::Driver::detect(), async {
        for profile in PROFILES {
            if profile.unsupported.is_some() {
                out.push(SelfTest {
                    profile,
                    capture: None,
                    problems: Vec::new(),
                });
                continue;
            }
            let sent = probe(&connectors, profile, server.addr()).await;
            let captured = server.next(SELF_TEST_LIMIT);
            let (capture, mut problems) = match (captured, sent) {
                (Ok(c), sent) => {
                    let mut p = compare(profile, &c);
                    p.extend(sent.err());
                    (Some(c), p)
                }
                (Err(server_side), Ok(())) => (None, vec![server_side]),
                (Err(server_side), Err(e)) => (None, vec![e, format!("capture: {server_side}")]),
            };
            problems.dedup();
            out.push(SelfTest {
                profile,
                capture,
                problems,
            });
        }
    });
    Ok(out)
}

/// One connection of `profile` to the capture server at `addr` (named `localhost`, so that
/// SNI is sent as to any named destination): handshake, HTTP/2 start, `GET /`, response head.
#[cfg(feature = "fingerprints")]
async fn probe(
    connectors: &Connectors,
    profile: &'static Profile,
    addr: std::net::SocketAddr,
) -> Result<(), String> {
    use rustls::pki_types::ServerName;
    use sortie_core::request::{parse_target_url, Method};

    let tcp = monoio::time::timeout(SELF_TEST_LIMIT, monoio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| format!("connect: {e}"))?;
    // As every egress connection: small writes (the HTTP/2 start) go out at once instead of
    // waiting on the capture server's delayed ACK.
    tcp.set_nodelay(true)
        .map_err(|e| format!("TCP_NODELAY: {e}"))?;
    let tcp = tcp
        .try_into_poll_io()
        .map_err(|(e, _)| format!("poll IO: {e}"))?;
    let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let tls = monoio::time::timeout(
        SELF_TEST_LIMIT,
        handshake(connectors, profile, "localhost", name, tcp),
    )
    .await
    .map_err(|_| "the TLS handshake timed out".to_string())?
    .map_err(|e| match e {
        HandshakeError::Setup(s) | HandshakeError::Tls(s) => s,
    })?;
    if !is_h2(&tls) {
        return Err("the capture server did not choose h2".into());
    }
    let conn = super::h2conn::H2Conn::start(tls, addr, Some(&profile.http2))
        .await
        .map_err(|e| e.message.clone())?;
    let url = parse_target_url(&format!("https://localhost:{}/", addr.port()))
        .map_err(|e| e.to_string())?;
    let fields: [(&str, &[u8]); 3] = [
        ("user-agent", b"sortie-self-test"),
        ("accept", b"*/*"),
        ("accept-encoding", b"identity"),
    ];
    let order = profile.order_headers(fields.iter().map(|(n, _)| *n));
    let ordered = order.iter().filter_map(|&i| fields.get(i).copied());
    let timeouts = super::Timeouts::default();
    let deadline = std::time::Instant::now() + SELF_TEST_LIMIT;
    let length = super::streaming::BodyLength::None;
    let head = super::h2conn::request_head(Method::Get, &url, ordered, length)
        .map_err(|e| e.message.clone())?;
    let mut body = bytes::Bytes::new();
    let sent = super::h2conn::send(&conn, head, length, &mut body, &timeouts, deadline)
        .await
        .map_err(|f| f.error.message.clone())?;
    let resp = super::h2conn::response_head(sent, Method::Get, &timeouts, deadline)
        .await
        .map_err(|f| f.error.message.clone())?;
    if resp.status != 200 {
        return Err(format!("the capture server answered {}", resp.status));
    }
    Ok(())
}

/// Runs the fingerprint self-test of this process, logs each profile's outcome and returns
/// the names of the profiles that passed.
pub fn verify_and_log(ca_file: Option<&Path>) -> Vec<String> {
    if !IS_BUILT {
        tracing::info!("no fingerprint profiles: {}", UNAVAILABLE_REASON);
        return Vec::new();
    }
    match verify_at_startup(ca_file) {
        Ok(results) => {
            for r in &results {
                if r.is_pass() {
                    tracing::debug!(profile = r.profile.name, "fingerprint self-test passed");
                } else if let Some(why) = r.unsupported() {
                    tracing::debug!(
                        profile = r.profile.name,
                        why,
                        "fingerprint profile not expressible by this build; not advertised"
                    );
                } else {
                    tracing::warn!(
                        profile = r.profile.name,
                        problems = %r.problems.join("; "),
                        "fingerprint self-test failed; the profile is not advertised"
                    );
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "fingerprint self-test could not run"),
    }
    let verified = verified_profiles();
    tracing::info!(
        profiles = verified.len(),
        "fingerprint self-test done; `sortie fingerprints` lists them"
    );
    verified
}
