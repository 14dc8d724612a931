//! The command line: flags parsed by hand, their bounds, the loopback target and the request.

use std::net::{IpAddr, Ipv6Addr};

/// The longest schedule accepted, so that no argument can start a long run.
pub(crate) const MAX_SECONDS: f64 = 15.0;
/// The highest rate accepted.
pub(crate) const MAX_RATE: f64 = 200_000.0;
/// The most connections accepted.
pub(crate) const MAX_CONNECTIONS: usize = 1024;
/// The most event-loop threads accepted: one holds 50,000 requests per second, and the
/// machine the load runs on has few cores to share with the server under test.
pub(crate) const MAX_THREADS: usize = 8;

const DEFAULT_SECONDS: f64 = 10.0;
const DEFAULT_CONNECTIONS: usize = 32;
const DEFAULT_THREADS: usize = 1;

/// Printed with `--help` and after every argument error.
pub(crate) const USAGE: &str = "\
usage: sortie-fixedrate --url URL --rate R [options]

Open-loop HTTP/1.1 load at a fixed request rate, for latency at a known load.

  --url URL          loopback http:// URL (127.0.0.0/8, ::1 or localhost)
  --rate R           requests per second, in (0, 200000]
  --seconds S        schedule length, in (0, 15] (default 10)
  --connections N    keep-alive connections, in [1, 1024] (default 32)
  --threads N        event-loop threads sharing the connections, in [1, 8] and at most
                     the connections (default 1)
  --method M         request method (default GET)
  --header 'N: v'    request header, repeatable
  --body TEXT        request body (sets Content-Length)
  --expect TEXT      text every 2xx body must contain to count as ok
  --proxy URL        send to this loopback forward proxy instead, in absolute form
                     (the request line names --url)
  --label NAME       name printed with the results (default target)
  -h, --help         this text";

/// What the command line asks for.
#[derive(Debug, PartialEq)]
pub(crate) enum Command {
    /// Print the usage text.
    Help,
    /// Run the load.
    Run(Box<Options>),
}

/// The checked options of a run.
#[derive(Debug, PartialEq)]
pub(crate) struct Options {
    pub(crate) target: Target,
    /// A forward proxy to send the requests to, in absolute form.
    pub(crate) proxy: Option<Target>,
    pub(crate) rate: f64,
    pub(crate) seconds: f64,
    pub(crate) connections: usize,
    pub(crate) threads: usize,
    pub(crate) method: String,
    pub(crate) headers: Vec<String>,
    pub(crate) body: Option<String>,
    pub(crate) expect: Option<String>,
    pub(crate) label: String,
}

/// The loopback server named by `--url`.
#[derive(Debug, PartialEq)]
pub(crate) struct Target {
    pub(crate) host: Host,
    pub(crate) port: u16,
    /// Path and query, as sent in the request line.
    pub(crate) path: String,
}

/// A host that is loopback by construction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Host {
    /// An address literal, checked to be loopback.
    Loopback(IpAddr),
    /// The name `localhost`, whose resolved addresses are checked before use.
    Localhost,
}

impl Target {
    /// The value of the Host header (RFC 9112 §3.2: host and port of the target URI).
    pub(crate) fn authority(&self) -> String {
        match self.host {
            Host::Loopback(IpAddr::V6(ip)) => format!("[{ip}]:{}", self.port),
            Host::Loopback(IpAddr::V4(ip)) => format!("{ip}:{}", self.port),
            Host::Localhost => format!("localhost:{}", self.port),
        }
    }

    /// The host as given, for name resolution and messages.
    pub(crate) fn host_text(&self) -> String {
        match self.host {
            Host::Loopback(ip) => ip.to_string(),
            Host::Localhost => "localhost".to_owned(),
        }
    }
}

impl Options {
    /// The bytes of the one request every slot sends.
    pub(crate) fn request(&self) -> Vec<u8> {
        // Through a forward proxy the request line names the whole URL (RFC 9112 §3.2.2).
        let request_target = match self.proxy {
            Some(_) => format!("http://{}{}", self.target.authority(), self.target.path),
            None => self.target.path.clone(),
        };
        let mut head = format!(
            "{} {} HTTP/1.1\r\nHost: {}\r\n",
            self.method,
            request_target,
            self.target.authority()
        );
        for header in &self.headers {
            head.push_str(header);
            head.push_str("\r\n");
        }
        if let Some(body) = &self.body {
            head.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        let mut request = head.into_bytes();
        if let Some(body) = &self.body {
            request.extend_from_slice(body.as_bytes());
        }
        request
    }

    /// Whether the method is HEAD, whose responses carry no body.
    pub(crate) fn is_head(&self) -> bool {
        self.method.eq_ignore_ascii_case("HEAD")
    }
}

/// Parses the arguments after the program name.
pub(crate) fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let mut url = None;
    let mut rate = None;
    let mut seconds = None;
    let mut connections = None;
    let mut threads = None;
    let mut method = None;
    let mut headers = Vec::new();
    let mut body = None;
    let mut expect = None;
    let mut label = None;
    let mut proxy = None;

    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(Command::Help);
        }
        // Both `--flag value` and `--flag=value` are accepted.
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_owned(), Some(value.to_owned()))
            }
            _ => (arg, None),
        };
        let known = [
            "--url",
            "--rate",
            "--seconds",
            "--connections",
            "--threads",
            "--method",
            "--header",
            "--body",
            "--expect",
            "--label",
            "--proxy",
        ];
        if !known.contains(&flag.as_str()) {
            return Err(format!("unknown argument '{flag}'"));
        }
        let value = match inline {
            Some(value) => value,
            None => args.next().ok_or_else(|| format!("{flag} needs a value"))?,
        };
        let slot = match flag.as_str() {
            "--url" => &mut url,
            "--rate" => &mut rate,
            "--seconds" => &mut seconds,
            "--connections" => &mut connections,
            "--threads" => &mut threads,
            "--method" => &mut method,
            "--body" => &mut body,
            "--expect" => &mut expect,
            "--label" => &mut label,
            "--proxy" => &mut proxy,
            _ => {
                headers.push(value);
                continue;
            }
        };
        if slot.replace(value).is_some() {
            return Err(format!("{flag} given twice"));
        }
    }

    let url = url.ok_or("--url is required")?;
    let rate = parse_number(&rate.ok_or("--rate is required")?, "--rate")?;
    if !(rate > 0.0 && rate <= MAX_RATE) {
        return Err(format!("--rate must be in (0, {MAX_RATE}]"));
    }
    let seconds = match seconds {
        Some(text) => parse_number(&text, "--seconds")?,
        None => DEFAULT_SECONDS,
    };
    if !(seconds > 0.0 && seconds <= MAX_SECONDS) {
        return Err(format!("--seconds must be in (0, {MAX_SECONDS}]"));
    }
    let connections = match connections {
        Some(text) => text
            .parse::<usize>()
            .map_err(|_| format!("--connections: '{text}' is not a count"))?,
        None => DEFAULT_CONNECTIONS,
    };
    if !(1..=MAX_CONNECTIONS).contains(&connections) {
        return Err(format!("--connections must be in [1, {MAX_CONNECTIONS}]"));
    }
    let threads = match threads {
        Some(text) => text
            .parse::<usize>()
            .map_err(|_| format!("--threads: '{text}' is not a count"))?,
        None => DEFAULT_THREADS,
    };
    if !(1..=MAX_THREADS).contains(&threads) {
        return Err(format!("--threads must be in [1, {MAX_THREADS}]"));
    }
    // A thread without a connection could send nothing, and its share of the slots would go
    // unsent.
    if threads > connections {
        return Err("--threads must not exceed --connections".to_owned());
    }
    let method = method.unwrap_or_else(|| "GET".to_owned());
    // RFC 9110 §9.1: a method is a token.
    if method.is_empty() || !method.bytes().all(is_token_byte) {
        return Err(format!("--method: '{method}' is not an HTTP method token"));
    }
    for header in &headers {
        // RFC 9110 §5.1: a field name is a token; a CR or LF in either part would end the
        // field early and change the request.
        let name = header
            .split_once(':')
            .map(|(name, _)| name)
            .unwrap_or_default();
        if name.is_empty() || !name.bytes().all(is_token_byte) || header.contains(['\r', '\n']) {
            return Err(format!("--header: '{header}' is not 'Name: value'"));
        }
    }
    Ok(Command::Run(Box::new(Options {
        target: parse_url(&url)?,
        proxy: proxy.as_deref().map(parse_url).transpose()?,
        rate,
        seconds,
        connections,
        threads,
        method,
        headers,
        body,
        expect,
        label: label.unwrap_or_else(|| "target".to_owned()),
    })))
}

fn parse_number(text: &str, flag: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .map_err(|_| format!("{flag}: '{text}' is not a number"))
}

/// RFC 9110 §5.6.2: tchar.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Parses `http://HOST[:PORT][/PATH][?QUERY]` and refuses any host that is not loopback.
pub(crate) fn parse_url(url: &str) -> Result<Target, String> {
    let scheme_len = "http://".len();
    let rest = match url.get(..scheme_len) {
        Some(scheme) if scheme.eq_ignore_ascii_case("http://") => &url[scheme_len..],
        _ => return Err("only http:// URLs are supported".to_owned()),
    };
    // The fragment is never sent (RFC 9110 §4.2.4).
    let rest = rest.split('#').next().unwrap_or_default();
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path_and_query) = rest.split_at(authority_end);
    if authority.contains('@') {
        return Err("URLs with user information are not supported".to_owned());
    }
    let (host_text, port_text) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or("unclosed '[' in the URL's host")?;
        match after.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if after.is_empty() => (host, None),
            None => return Err("bad URL authority".to_owned()),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host_text.is_empty() {
        return Err("the URL has no host".to_owned());
    }
    let host = if host_text.eq_ignore_ascii_case("localhost") {
        Host::Localhost
    } else {
        let ip = if authority.starts_with('[') {
            host_text.parse::<Ipv6Addr>().map(IpAddr::V6).ok()
        } else {
            host_text.parse::<IpAddr>().ok().filter(IpAddr::is_ipv4)
        };
        match ip {
            Some(ip) if ip.is_loopback() => Host::Loopback(ip),
            _ => return Err(format!("refusing a non-loopback target: {host_text}")),
        }
    };
    let port = match port_text {
        None => 80,
        Some(text) => match text.parse::<u16>() {
            Ok(port) if port != 0 && text.bytes().all(|b| b.is_ascii_digit()) => port,
            _ => return Err(format!("bad port '{text}' in the URL")),
        },
    };
    let path = if path_and_query.starts_with('/') {
        path_and_query.to_owned()
    } else {
        format!("/{path_and_query}")
    };
    // RFC 9112 §3.2: the request target has no whitespace or control characters.
    if path.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err("the URL's path has a space or control character".to_owned());
    }
    Ok(Target { host, port, path })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn args(text: &[&str]) -> Vec<String> {
        text.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn urls() {
        let v4 = |a, b, c, d| Host::Loopback(IpAddr::V4(Ipv4Addr::new(a, b, c, d)));
        let cases: &[(&str, Host, u16, &str)] = &[
            (
                "http://127.0.0.1:18090/small",
                v4(127, 0, 0, 1),
                18090,
                "/small",
            ),
            ("HTTP://127.1.2.3", v4(127, 1, 2, 3), 80, "/"),
            (
                "http://127.0.0.1:8080?a=1#frag",
                v4(127, 0, 0, 1),
                8080,
                "/?a=1",
            ),
            ("http://127.0.0.1/p?q=1", v4(127, 0, 0, 1), 80, "/p?q=1"),
            (
                "http://[::1]:9/x",
                Host::Loopback(IpAddr::V6(Ipv6Addr::LOCALHOST)),
                9,
                "/x",
            ),
            ("http://LocalHost:81/", Host::Localhost, 81, "/"),
        ];
        for (url, host, port, path) in cases {
            let target = parse_url(url);
            assert_eq!(
                target,
                Ok(Target {
                    host: *host,
                    port: *port,
                    path: (*path).to_owned()
                }),
                "{url}"
            );
        }
    }

    #[test]
    fn rejected_urls() {
        let cases = [
            ("https://127.0.0.1/", "only http://"),
            ("127.0.0.1:80", "only http://"),
            ("http://10.0.0.1/", "non-loopback"),
            ("http://example.com/", "non-loopback"),
            ("http://[::2]/", "non-loopback"),
            ("http://::1/", "non-loopback"),
            ("http://127.1/", "non-loopback"),
            ("http://[::1/", "unclosed"),
            ("http://[::1]x/", "bad URL authority"),
            ("http:///path", "no host"),
            ("http://:80/", "no host"),
            ("http://u@127.0.0.1/", "user information"),
            ("http://127.0.0.1:0/", "bad port"),
            ("http://127.0.0.1:+80/", "bad port"),
            ("http://127.0.0.1:65536/", "bad port"),
            ("http://127.0.0.1:/", "bad port"),
            ("http://127.0.0.1/a b", "space or control"),
        ];
        for (url, expected) in cases {
            let error = parse_url(url).err().unwrap_or_default();
            assert!(error.contains(expected), "{url}: {error}");
        }
    }

    #[test]
    fn flags() {
        let parsed = parse(args(&[
            "--url=http://127.0.0.1:1/a",
            "--rate",
            "2500.5",
            "--seconds",
            "3",
            "--connections=4",
            "--threads",
            "2",
            "--method",
            "POST",
            "--header",
            "A: 1",
            "--header=B: 2",
            "--body",
            "{}",
            "--expect",
            "ok",
            "--label",
            "gw",
        ]));
        let Ok(Command::Run(options)) = parsed else {
            panic!("not a run: {parsed:?}");
        };
        assert_eq!(
            (
                options.rate,
                options.seconds,
                options.connections,
                options.threads
            ),
            (2500.5, 3.0, 4, 2)
        );
        assert_eq!(options.headers, ["A: 1", "B: 2"]);
        assert_eq!(
            (options.expect.as_deref(), options.label.as_str()),
            (Some("ok"), "gw")
        );
        assert_eq!(
            options.request(),
            b"POST /a HTTP/1.1\r\nHost: 127.0.0.1:1\r\nA: 1\r\nB: 2\r\nContent-Length: 2\r\n\r\n{}"
        );
    }

    #[test]
    fn defaults() {
        let parsed = parse(args(&["--url", "http://[::1]:7/", "--rate", "10"]));
        let Ok(Command::Run(options)) = parsed else {
            panic!("not a run: {parsed:?}");
        };
        assert_eq!(
            (options.seconds, options.connections, options.threads),
            (DEFAULT_SECONDS, DEFAULT_CONNECTIONS, DEFAULT_THREADS)
        );
        assert_eq!(
            (options.method.as_str(), options.label.as_str()),
            ("GET", "target")
        );
        assert!(!options.is_head());
        assert_eq!(
            options.request(),
            b"GET / HTTP/1.1\r\nHost: [::1]:7\r\n\r\n"
        );
    }

    #[test]
    fn through_a_proxy_the_request_line_names_the_url() {
        let parsed = parse(args(&[
            "--url",
            "http://127.0.0.1:9/x?y",
            "--proxy",
            "http://127.0.0.1:3128",
            "--rate",
            "10",
        ]));
        let Ok(Command::Run(options)) = parsed else {
            panic!("not a run: {parsed:?}");
        };
        assert_eq!(options.proxy.as_ref().map(|p| p.port), Some(3128));
        assert_eq!(
            options.request(),
            b"GET http://127.0.0.1:9/x?y HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n"
        );
        // The proxy must be on loopback too.
        assert!(parse(args(&[
            "--url",
            "http://127.0.0.1:9/",
            "--proxy",
            "http://10.0.0.1:3128",
            "--rate",
            "1"
        ]))
        .is_err());
    }

    #[test]
    fn help() {
        assert_eq!(parse(args(&["--rate", "1", "-h"])), Ok(Command::Help));
    }

    #[test]
    fn rejected_flags() {
        let url = "http://127.0.0.1/";
        let cases: &[(&[&str], &str)] = &[
            (&["--rate", "1"], "--url is required"),
            (&["--url", url], "--rate is required"),
            (&["--url", url, "--rate"], "needs a value"),
            (&["--url", url, "--rate", "0"], "--rate must be"),
            (&["--url", url, "--rate", "NaN"], "--rate must be"),
            (&["--url", url, "--rate", "200001"], "--rate must be"),
            (&["--url", url, "--rate", "fast"], "not a number"),
            (
                &["--url", url, "--rate", "1", "--seconds", "16"],
                "--seconds must be",
            ),
            (
                &["--url", url, "--rate", "1", "--seconds", "-1"],
                "--seconds must be",
            ),
            (
                &["--url", url, "--rate", "1", "--connections", "0"],
                "--connections must be",
            ),
            (
                &["--url", url, "--rate", "1", "--connections", "1025"],
                "--connections must be",
            ),
            (
                &["--url", url, "--rate", "1", "--connections", "2.5"],
                "not a count",
            ),
            (
                &["--url", url, "--rate", "1", "--threads", "0"],
                "--threads must be",
            ),
            (
                &["--url", url, "--rate", "1", "--threads", "9"],
                "--threads must be",
            ),
            (
                &["--url", url, "--rate", "1", "--threads", "one"],
                "not a count",
            ),
            (
                &[
                    "--url",
                    url,
                    "--rate",
                    "1",
                    "--connections",
                    "2",
                    "--threads",
                    "3",
                ],
                "must not exceed --connections",
            ),
            (&["--url", url, "--rate", "1", "--rate", "2"], "given twice"),
            (
                &["--url", url, "--rate", "1", "--method", "GET /"],
                "method token",
            ),
            (
                &["--url", url, "--rate", "1", "--header", "NoColon"],
                "Name: value",
            ),
            (
                &["--url", url, "--rate", "1", "--header", "A: 1\r\nB: 2"],
                "Name: value",
            ),
            (
                &["--url", url, "--rate", "1", "--verbose"],
                "unknown argument",
            ),
            (
                &["--url", "http://192.168.1.1/", "--rate", "1"],
                "non-loopback",
            ),
        ];
        for (arguments, expected) in cases {
            let error = parse(args(arguments)).err().unwrap_or_default();
            assert!(error.contains(expected), "{arguments:?}: {error}");
        }
    }
}
