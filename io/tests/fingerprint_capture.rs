//! The JA4 and JA3N code of `sortie_core::fingerprint` against ClientHellos that something not
//! ours sends: `curl_cffi` (PyPI; it ships its own impersonating libcurl) impersonating Chrome
//! 131 and Firefox 133 connects to a loopback listener that keeps the first bytes it receives.
//! The JA4 computed from them must be the browsers' published values (the profiles' expected
//! strings). Needs python3 with curl_cffi: `scripts/ci-deps.sh` installs it.

use std::io::Read as _;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sortie_core::fingerprint::client_hello::{parse_records, HelloError};
use sortie_core::fingerprint::tls::fingerprint;

/// The ClientHello bytes curl_cffi sends when impersonating `target` towards `localhost`.
fn capture(target: &str) -> Vec<u8> {
    let listener = TcpListener::bind("127.0.0.1:0").expect("listener");
    let port = listener.local_addr().expect("addr").port();
    let script = format!(
        "import curl_cffi.requests as r\n\
         try:\n    r.get('https://localhost:{port}/', impersonate='{target}', timeout=5)\n\
         except Exception:\n    pass\n"
    );
    let mut child = Command::new("python3")
        .args(["-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    listener.set_nonblocking(true).expect("nonblocking");
    let until = Instant::now() + Duration::from_secs(20);
    let mut conn = loop {
        match listener.accept() {
            Ok((c, _)) => break c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Ok(Some(status)) = child.try_wait() {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        let _ = e.read_to_string(&mut err);
                    }
                    panic!(
                        "curl_cffi did not connect ({status}): {err}\n\
                         install it with scripts/ci-deps.sh (pip install curl_cffi)"
                    );
                }
                assert!(Instant::now() < until, "curl_cffi did not connect");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    conn.set_nonblocking(false).expect("blocking");
    conn.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    // Read until the records hold a whole ClientHello.
    loop {
        let n = conn.read(&mut buf).expect("ClientHello bytes");
        assert!(
            n > 0,
            "curl_cffi closed before its ClientHello was complete"
        );
        bytes.extend_from_slice(&buf[..n]);
        match parse_records(&bytes) {
            Err(HelloError::Incomplete) => continue,
            _ => break,
        }
    }
    drop(conn);
    let _ = child.kill();
    let _ = child.wait();
    bytes
}

#[test]
fn curl_cffi_chrome_131_has_chromes_ja4() {
    // Chrome shuffles its extensions per connection: JA4 and JA3N sort them, so three
    // connections give one JA4 and one JA3N.
    let mut seen = Vec::new();
    for _ in 0..3 {
        let hello = parse_records(&capture("chrome131")).expect("a ClientHello");
        let fp = fingerprint(&hello);
        assert_eq!(
            fp.ja4, "t13d1516h2_8daaf6152771_02713d6af862",
            "{}",
            fp.ja4_r
        );
        seen.push((fp.ja3n, hello.extensions));
    }
    assert!(seen.iter().all(|(j, _)| *j == seen[0].0));
}

#[test]
fn curl_cffi_firefox_133_has_firefoxs_ja4() {
    let hello = parse_records(&capture("firefox133")).expect("a ClientHello");
    let fp = fingerprint(&hello);
    assert_eq!(
        fp.ja4, "t13d1716h2_5b57614c22b0_eeeea6562960",
        "{}",
        fp.ja4_r
    );
}
