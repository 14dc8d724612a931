//! Clients of the forward proxy for black-box tests: curl through a gateway's proxy listener,
//! its output read as a response, raw CONNECT tunnels; and the provider session the upstream
//! proxy tests' username carries.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Output};
use std::time::Duration;

use sortie_core::provider_session::{ProviderSession, ProviderSessionInputs};

use super::gateway::{parse_response, Gateway, Resp, DEPLOYMENT_TOKEN};

pub const CURL_MISSING: &str = "curl must be installed (scripts/ci-deps.sh installs it)";

/// The test deployment's proxy credentials, `user:password` (decision 020).
pub fn proxy_user() -> String {
    format!("dep_test:{DEPLOYMENT_TOKEN}")
}

pub fn proxy_url(gw: &Gateway) -> String {
    format!("http://{}", gw.proxy.expect("proxy listener"))
}

/// A quiet curl through the gateway's proxy with a 30 s limit.
pub fn curl_command(gw: &Gateway) -> Command {
    let mut command = Command::new("curl");
    command.args(["-s", "--max-time", "30", "-x", &proxy_url(gw)]);
    command
}

/// Runs curl through the gateway's proxy with `args`, the response heads included in its
/// output; fails the test if curl is missing.
pub fn curl(gw: &Gateway, args: &[&str]) -> Output {
    curl_command(gw)
        .args(["-S", "-i"])
        .args(args)
        .output()
        .expect(CURL_MISSING)
}

/// [`curl`] with the test deployment's proxy credentials.
pub fn curl_as_test(gw: &Gateway, args: &[&str]) -> Output {
    let user = proxy_user();
    let mut all = vec!["--proxy-user", user.as_str()];
    all.extend_from_slice(args);
    curl(gw, &all)
}

/// [`curl_as_test`] read as a response, which must be a `200` (the message shows the answer
/// and curl's errors otherwise).
pub fn curl_ok(gw: &Gateway, args: &[&str]) -> Resp {
    let out = curl_as_test(gw, args);
    let r = curl_response(&out);
    assert_eq!(
        r.status,
        200,
        "{} {}",
        r.text(),
        String::from_utf8_lossy(&out.stderr)
    );
    r
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// curl's output as a response: the final head and its body, past any head that another
/// follows at once (a CONNECT's `200`, a `100 Continue`).
pub fn curl_response(out: &Output) -> Resp {
    let mut raw = &out.stdout[..];
    while let Some(end) = find(raw, b"\r\n\r\n") {
        if raw[end + 4..].starts_with(b"HTTP/1.") {
            raw = &raw[end + 4..];
        } else {
            break;
        }
    }
    parse_response(raw)
}

/// The data of a chunked body (no extensions or trailers expected).
pub fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = find(raw, b"\r\n").expect("chunk-size line");
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..line_end]).unwrap(), 16)
            .expect("hex chunk size");
        if size == 0 {
            return out;
        }
        let data = &raw[line_end + 2..];
        out.extend_from_slice(&data[..size]);
        raw = &data[size + 2..];
    }
}

pub fn base64_basic(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// Opens a tunnel to `127.0.0.1:port` through the gateway with the test deployment's
/// credentials and the `extra` header fields, and returns the stream and the status line.
pub fn open_tunnel_with(gw: &Gateway, port: u16, extra: &[(&str, &str)]) -> (TcpStream, String) {
    let mut s = TcpStream::connect(gw.proxy.unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let auth = base64_basic(&proxy_user());
    let fields: String = extra.iter().map(|(n, v)| format!("{n}: {v}\r\n")).collect();
    write!(
        s,
        "CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nProxy-Authorization: Basic {auth}\r\n{fields}\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let status = text.lines().next().unwrap_or_default().to_string();
    (s, status)
}

/// [`open_tunnel_with`] without extra fields.
pub fn open_tunnel(gw: &Gateway, port: u16) -> (TcpStream, String) {
    open_tunnel_with(gw, port, &[])
}

/// The provider session routing derives for the test deployment in pool `acme` behind the
/// upstream proxy `acme` (decision 011).
pub fn session(country: &str, sticky: &str) -> String {
    let s = ProviderSession::derive(&ProviderSessionInputs {
        deployment_id: "dep_test",
        pool_id: "acme",
        upstream_proxy_id: "acme",
        country: sortie_core::routing::CountryCode::parse(country),
        region: None,
        ip_type: None,
        sticky_session_id: sticky,
    });
    String::from_utf8(s.to_hex().to_vec()).expect("hex")
}
