//! Fingerprints checked by something that is not ours: `curl_cffi` (PyPI; it ships its own
//! impersonating libcurl) impersonating every one of its targets connects to the loopback
//! capture server (TLS + HTTP/2, `sortie_io::egress::fingerprint::capture`), which computes
//! JA4, JA4_r, JA3N and the Akamai string with `sortie_core::fingerprint`. Each must equal the
//! expected strings of the profile that takes the target's name as an alias; with feature
//! `fingerprints`, Sortie's own connection with the same profile (through `Egress::execute`)
//! must give the same strings on the same server in the same run. Needs python3 with
//! curl_cffi: `scripts/ci-deps.sh` installs the pinned version.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use sortie_core::fingerprint::profile::{self, Profile, CHROME_131, FIREFOX_133, PROFILES};
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

/// How a capture from curl_cffi differs from what the profile expects. Firefox 133's HEADERS
/// priority is left out: the sources disagree (decision 081), and curl_cffi 0.16.3 sends weight
/// 256 where the profile, after curl-impersonate, sends 42.
fn differences(profile: &Profile, c: &Capture) -> Vec<String> {
    let with_priority = profile.name != FIREFOX_133.name;
    compare(profile, c)
        .into_iter()
        .filter(|p| with_priority || !p.starts_with("HEADERS priority"))
        .collect()
}

/// The strings the profile expects, as captured from curl_cffi ([`differences`]).
fn assert_matches_profile(profile: &Profile, c: &Capture) {
    assert_eq!(
        differences(profile, c),
        Vec::<String>::new(),
        "{}: JA4_r {} JA3N string {}",
        profile.name,
        c.tls.ja4_r,
        c.tls.ja3n_string
    );
}

#[test]
fn curl_cffi_chrome_131_shuffles_its_extensions_with_the_same_strings() {
    let server = CaptureServer::start().expect("capture server");
    // Chrome shuffles its extensions per connection: JA4, JA4_r and JA3N sort them, so three
    // connections give the same strings, though not the same extension order.
    let mut orders = Vec::new();
    for _ in 0..3 {
        let c = curl_cffi(&server, "chrome131");
        assert_matches_profile(&CHROME_131, &c);
        orders.push(c.hello.extensions);
    }
    assert!(orders.iter().any(|o| *o != orders[0]), "{orders:?}");
}

/// curl_cffi's target names, from its `BrowserType` enum.
fn curl_cffi_targets() -> Vec<String> {
    let script = "from curl_cffi.requests.impersonate import BrowserType\n\
                  print(' '.join(b.value for b in BrowserType))\n";
    let child = Command::new("python3")
        .args(["-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let (out, err, ok) = finish(child);
    assert!(ok, "curl_cffi: {err}\ninstall it with scripts/ci-deps.sh");
    out.split_whitespace().map(String::from).collect()
}

/// Every target curl_cffi offers is the name (an alias) of a built-in profile, so a user
/// moving from curl_cffi renames nothing; a curl_cffi release with a new target fails here
/// until its profile is recorded (scripts/record-profiles.py).
#[test]
fn every_curl_cffi_target_names_a_profile() {
    let targets = curl_cffi_targets();
    assert!(targets.len() >= 38, "{targets:?}");
    let missing: Vec<&String> = targets
        .iter()
        .filter(|t| profile::resolve(t).is_none())
        .collect();
    assert!(missing.is_empty(), "no profile for {missing:?}");
}

/// curl_cffi's connections, one per profile, in lockstep with the capture server: python
/// prints a line after each request and waits for one before the next, so each capture is
/// taken for the right target.
fn curl_cffi_each(server: &CaptureServer, targets: &[&str]) -> Vec<Capture> {
    let script = "import sys\n\
                  import curl_cffi.requests as r\n\
                  port = sys.argv[1]\n\
                  for t in sys.argv[2:]:\n\
                  \x20   resp = r.get(f'https://localhost:{port}/', impersonate=t, verify=False, timeout=20)\n\
                  \x20   print(t, resp.status_code, resp.http_version, flush=True)\n\
                  \x20   sys.stdin.readline()\n";
    let port = server.addr().port().to_string();
    let mut child = Command::new("python3")
        .args(["-c", script, &port])
        .args(targets)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 runs");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut out = Vec::with_capacity(targets.len());
    for target in targets {
        let c = server.next(LIMIT);
        let line = lines.next().and_then(Result::ok).unwrap_or_default();
        // curl's CURL_HTTP_VERSION_2_0 is 3.
        assert_eq!(line, format!("{target} 200 3"), "curl_cffi {target}");
        out.push(c.unwrap_or_else(|e| panic!("curl_cffi {target}: {e}")));
        let _ = stdin.write_all(b"next\n");
        let _ = stdin.flush();
    }
    drop(stdin);
    let _ = child.wait();
    out
}

/// The curl_cffi target each profile is compared with: its first alias that curl_cffi offers.
fn compared_targets() -> Vec<(&'static Profile, &'static str)> {
    let targets = curl_cffi_targets();
    PROFILES
        .iter()
        .filter_map(|p| {
            p.aliases
                .iter()
                .find(|a| targets.iter().any(|t| t == *a))
                .map(|a| (p, *a))
        })
        .collect()
}

/// curl_cffi's connection for each profile it has a target for (at least its 38), with the
/// profile and the target.
fn curl_cffi_for_every_profile(
    server: &CaptureServer,
) -> (Vec<(&'static Profile, &'static str)>, Vec<Capture>) {
    let pairs = compared_targets();
    assert!(pairs.len() >= 38, "{}", pairs.len());
    let targets: Vec<&str> = pairs.iter().map(|(_, t)| *t).collect();
    let captures = curl_cffi_each(server, &targets);
    (pairs, captures)
}

/// Every profile recorded from curl_cffi gives, through curl_cffi, the profile's JA4, JA4_r,
/// JA3N, Akamai string and HEADERS priority (Firefox 133's priority excepted, decision 081).
#[test]
fn every_curl_cffi_target_gives_its_profiles_strings() {
    let server = CaptureServer::start().expect("capture server");
    let (pairs, captures) = curl_cffi_for_every_profile(&server);
    let mut failures = Vec::new();
    for ((profile, target), c) in pairs.iter().zip(&captures) {
        let problems = differences(profile, c);
        if !problems.is_empty() {
            failures.push(format!("{} ({target}): {problems:?}", profile.name));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Sortie's profile and curl_cffi's impersonation of the same browser, for every target, on
/// the same capture server in the same run: the same JA4, JA4_r, JA3N, Akamai string and
/// HEADERS priority (Firefox 133's priority excepted, decision 081). In a process of its own:
/// the profiles' connectors trust the CA of the first test in a process that installs them.
#[cfg(feature = "fingerprints")]
#[test]
fn sortie_and_curl_cffi_give_the_same_strings_for_every_target() {
    let name = "fingerprint_capture::sortie_and_curl_cffi_give_the_same_strings_for_every_target";
    if crate::support::run_alone(name).is_some() {
        return;
    }
    use sortie_core::request::Method;
    use sortie_io::egress::fingerprint::{tls_strings, verified, verify_at_startup};

    let server = CaptureServer::start().expect("capture server");
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = dir.path().join("capture-ca.pem");
    std::fs::write(&ca, server.ca_pem()).expect("CA written");
    let results = verify_at_startup(Some(&ca)).expect("the self-test runs");
    for r in &results {
        assert!(
            r.is_pass() || r.unsupported().is_some(),
            "{}: {:?}",
            r.profile.name,
            r.problems
        );
    }
    let (pairs, theirs) = curl_cffi_for_every_profile(&server);
    let mut failures = Vec::new();
    for ((profile, target), theirs) in pairs.iter().zip(&theirs) {
        if let Some(why) = profile.unsupported {
            // Its data is checked against curl_cffi by the test above; this build cannot send
            // it (decision 100), and a request naming it is refused.
            assert!(verified(profile.name).is_none(), "{}", profile.name);
            eprintln!("{} ({target}): not sent by this build: {why}", profile.name);
            continue;
        }
        let url = format!("https://localhost:{}/", server.addr().port());
        let mut req = crate::support::request(Method::Get, &url);
        req.fingerprint = Some(verified(profile.name).expect("profile verified"));
        let resp =
            crate::support::run(async move { crate::support::egress(None).execute(&req).await })
                .expect("response");
        assert_eq!(resp.status, 200);
        let ours = server.next(LIMIT).expect("Sortie's connection captured");
        let prio = |c: &Capture| c.http2.as_ref().map(|h| h.headers_priority);
        // Without padding where it comes and goes between connections (decision 100).
        let (o, t) = (tls_strings(profile, &ours), tls_strings(profile, theirs));
        let same = o.ja4 == t.ja4
            && o.ja4_r == t.ja4_r
            && o.ja3n == t.ja3n
            && ours.akamai() == theirs.akamai()
            && (profile.name == FIREFOX_133.name || prio(&ours) == prio(theirs));
        if !same {
            failures.push(format!(
                "{} ({target}): ours {} {:?} {:?}, curl_cffi's {} {:?} {:?}",
                profile.name,
                o.ja4_r,
                ours.akamai(),
                prio(&ours),
                t.ja4_r,
                theirs.akamai(),
                prio(theirs)
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
