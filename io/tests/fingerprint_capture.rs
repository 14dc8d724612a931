//! Fingerprints checked by something that is not ours: `curl_cffi` (PyPI; it ships its own
//! impersonating libcurl) impersonating Chrome 131 and Firefox 133 connects to the loopback
//! capture server (TLS + HTTP/2, `sortie_io::egress::fingerprint::capture`), which computes
//! JA4, JA4_r, JA3N and the Akamai string with `sortie_core::fingerprint`. Each must equal the
//! matching profile's expected strings; with feature `fingerprints`, Sortie's own connection
//! with the same profile (through `Egress::execute`) must give the same strings on the same
//! server. Needs python3 with curl_cffi: `scripts/ci-deps.sh` installs it.

mod support;

use std::io::Read as _;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use sortie_core::fingerprint::profile::{Profile, CHROME_131, FIREFOX_133};
use sortie_io::egress::fingerprint::capture::{Capture, CaptureServer};
use sortie_io::egress::fingerprint::compare;

/// Longest wait for one connection.
const LIMIT: Duration = Duration::from_secs(30);

/// curl_cffi impersonating `target` requests `https://localhost:PORT/` from the capture
/// server (certificate not checked: the capture CA is ours); returns its capture after
/// checking that curl_cffi got the server's `200` over HTTP/2.
fn curl_cffi(server: &CaptureServer, target: &str) -> Capture {
    let script = format!(
        "import curl_cffi.requests as r\n\
         resp = r.get('https://localhost:{}/', impersonate='{target}', verify=False, timeout=20)\n\
         print(resp.status_code, resp.http_version)\n",
        server.addr().port()
    );
    let child = Command::new("python3")
        .args(["-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let (out, err, ok) = finish(child);
    assert!(
        ok,
        "curl_cffi failed: {err}\ninstall it with scripts/ci-deps.sh (pip install curl_cffi)"
    );
    // curl's CURL_HTTP_VERSION_2_0 is 3.
    assert_eq!(out.trim(), "200 3", "{err}");
    server.next(LIMIT).expect("curl_cffi's connection captured")
}

/// Waits for the child (bounded), returning stdout, stderr and whether it succeeded.
fn finish(mut child: Child) -> (String, String, bool) {
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut out = String::new();
        let mut err = String::new();
        let _ = stdout.read_to_string(&mut out);
        let _ = stderr.read_to_string(&mut err);
        let _ = tx.send((out, err));
    });
    let Ok((out, err)) = rx.recv_timeout(LIMIT) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("curl_cffi did not finish within {LIMIT:?}");
    };
    let ok = child.wait().map(|s| s.success()).unwrap_or(false);
    (out, err, ok)
}

/// The strings the profile expects, as captured from curl_cffi. The HEADERS priority is
/// compared only when `with_priority`: for Firefox 133 the sources disagree (decision 081) and
/// curl_cffi 0.16.3 sends weight 256 where the profile, after curl-impersonate, sends 42.
fn assert_matches_profile(profile: &Profile, c: &Capture, with_priority: bool) {
    let problems: Vec<String> = compare(profile, c)
        .into_iter()
        .filter(|p| with_priority || !p.starts_with("HEADERS priority"))
        .collect();
    assert_eq!(
        problems,
        Vec::<String>::new(),
        "{}: JA4_r {} JA3N string {}",
        profile.name,
        c.tls.ja4_r,
        c.tls.ja3n_string
    );
}

#[test]
fn curl_cffi_chrome_131_gives_the_profiles_strings() {
    let server = CaptureServer::start().expect("capture server");
    // Chrome shuffles its extensions per connection: JA4, JA4_r and JA3N sort them, so three
    // connections give the same strings, though not the same extension order.
    let mut orders = Vec::new();
    for _ in 0..3 {
        let c = curl_cffi(&server, "chrome131");
        assert_matches_profile(&CHROME_131, &c, true);
        let hello = sortie_core::fingerprint::client_hello::parse_records(&c.client_hello)
            .expect("a ClientHello");
        orders.push(hello.extensions);
    }
    assert!(orders.iter().any(|o| *o != orders[0]), "{orders:?}");
}

#[test]
fn curl_cffi_firefox_133_gives_the_profiles_strings() {
    let server = CaptureServer::start().expect("capture server");
    let c = curl_cffi(&server, "firefox133");
    assert_matches_profile(&FIREFOX_133, &c, false);
}

/// Sortie's profile and curl_cffi's impersonation of the same browser, on the same capture
/// server: the same JA4, JA4_r, JA3N and Akamai string.
#[cfg(feature = "fingerprints")]
#[test]
fn sortie_and_curl_cffi_give_the_same_strings() {
    use sortie_core::request::Method;
    use sortie_io::egress::fingerprint::{verified, verify_at_startup};

    let server = CaptureServer::start().expect("capture server");
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = dir.path().join("capture-ca.pem");
    std::fs::write(&ca, server.ca_pem()).expect("CA written");
    let results = verify_at_startup(Some(&ca)).expect("the self-test runs");
    for r in &results {
        assert!(r.is_pass(), "{}: {:?}", r.profile.name, r.problems);
    }
    for (profile, target) in [(CHROME_131, "chrome131"), (FIREFOX_133, "firefox133")] {
        let theirs = curl_cffi(&server, target);
        let url = format!("https://localhost:{}/", server.addr().port());
        let mut req = support::request(Method::Get, &url);
        req.fingerprint = Some(verified(profile.name).expect("profile verified"));
        let resp = support::run(async move { support::egress(None).execute(&req).await })
            .expect("response");
        assert_eq!(resp.status, 200);
        let ours = server.next(LIMIT).expect("Sortie's connection captured");
        assert_eq!(ours.tls.ja4, theirs.tls.ja4, "{}", profile.name);
        assert_eq!(ours.tls.ja4_r, theirs.tls.ja4_r, "{}", profile.name);
        assert_eq!(ours.tls.ja3n, theirs.tls.ja3n, "{}", profile.name);
        assert_eq!(ours.akamai(), theirs.akamai(), "{}", profile.name);
        if profile.name == CHROME_131.name {
            assert_eq!(
                ours.http2.as_ref().map(|h| h.headers_priority),
                theirs.http2.as_ref().map(|h| h.headers_priority),
            );
        }
    }
}
