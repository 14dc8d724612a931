//! The upstream proxy of a pool: its endpoints, the username template and the password.
//!
//! Decision 006: an upstream proxy endpoint is `scheme://host:port` with the scheme `http`,
//! `https` (TLS to the proxy), `socks5` or `socks5h` (the proxy resolves names), and no path,
//! query, fragment or user info (credentials belong in `username_template` and `password` or
//! `password_env`). The template may use the placeholders `{country}`, `{region}`, `{ip_type}`
//! and `{session}` and nothing else; a `:` is never allowed because RFC 7617 §2 forbids it in a
//! Basic user-id (and RFC 1929 usernames are sent the same way).

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use super::host::{normalize_hostname, HostError};

/// Longest upstream proxy URL in bytes.
pub const MAX_PROXY_URL_BYTES: usize = 512;
/// Longest username template in bytes.
pub const MAX_USERNAME_TEMPLATE_BYTES: usize = 256;
/// Longest upstream proxy password in bytes.
pub const MAX_PROXY_PASSWORD_BYTES: usize = 1024;

/// Why an upstream proxy URL was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProxyUrlError {
    /// Longer than [`MAX_PROXY_URL_BYTES`].
    #[error("must be at most 512 bytes")]
    TooLong,
    /// The scheme is not `http://`, `https://`, `socks5://` or `socks5h://`.
    #[error("must start with http://, https://, socks5:// or socks5h://")]
    BadScheme,
    /// The URL carries user info; credentials go in username_template and password.
    #[error("must not contain user info; use username_template and password")]
    UserInfo,
    /// The URL has a path, query or fragment.
    #[error("must not have a path, query or fragment")]
    HasPath,
    /// The port is missing, not a number, or not 1..=65535.
    #[error("must have an explicit port 1..=65535")]
    BadPort,
    /// The IPv6 literal is malformed.
    #[error("has a malformed IPv6 literal")]
    BadIpv6,
    /// The host name is malformed.
    #[error("has a malformed host: {0}")]
    BadHost(HostError),
}

/// The host of an upstream proxy.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ProxyHost {
    /// A DNS name, lowercase.
    Name(Box<str>),
    /// An IPv4 literal.
    V4(Ipv4Addr),
    /// An IPv6 literal (written in brackets).
    V6(Ipv6Addr),
}

/// How the gateway talks to an upstream proxy endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProxyScheme {
    /// An HTTP proxy: a `CONNECT` tunnel for every destination (RFC 9110 §9.3.6).
    Http,
    /// An HTTP proxy reached over TLS, then `CONNECT` as for [`ProxyScheme::Http`].
    Https,
    /// SOCKS5 (RFC 1928, RFC 1929); the gateway resolves destination names.
    Socks5,
    /// SOCKS5 where the proxy resolves destination names (the name is sent, `ATYP` 3).
    Socks5h,
}

impl ProxyScheme {
    /// Every scheme.
    pub const ALL: [ProxyScheme; 4] = [
        ProxyScheme::Http,
        ProxyScheme::Https,
        ProxyScheme::Socks5,
        ProxyScheme::Socks5h,
    ];

    /// The scheme as written in a URL, lowercase, without `://`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ProxyScheme::Http => "http",
            ProxyScheme::Https => "https",
            ProxyScheme::Socks5 => "socks5",
            ProxyScheme::Socks5h => "socks5h",
        }
    }

    /// Whether the endpoint speaks SOCKS5 rather than HTTP `CONNECT`.
    pub const fn is_socks(self) -> bool {
        matches!(self, ProxyScheme::Socks5 | ProxyScheme::Socks5h)
    }
}

/// The address of an upstream proxy endpoint: scheme, host and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProxyAddr {
    scheme: ProxyScheme,
    host: ProxyHost,
    port: u16,
}

impl ProxyAddr {
    /// Parses `scheme://host:port` with an optional single trailing `/`. The scheme is matched
    /// case-insensitively; the canonical form is lowercase.
    pub fn parse_url(s: &str) -> Result<ProxyAddr, ProxyUrlError> {
        if s.len() > MAX_PROXY_URL_BYTES {
            return Err(ProxyUrlError::TooLong);
        }
        let (scheme, rest) = ProxyScheme::ALL
            .into_iter()
            .find_map(|scheme| {
                let name = scheme.as_str();
                let head = s.get(..name.len() + 3)?;
                let is_match = head.get(..name.len())?.eq_ignore_ascii_case(name)
                    && head.get(name.len()..)? == "://";
                is_match.then(|| (scheme, s.get(name.len() + 3..).unwrap_or("")))
            })
            .ok_or(ProxyUrlError::BadScheme)?;
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains('@') {
            return Err(ProxyUrlError::UserInfo);
        }
        if authority.contains(['/', '?', '#', '\\']) {
            return Err(ProxyUrlError::HasPath);
        }
        let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
            let (literal, after) = bracketed.split_once(']').ok_or(ProxyUrlError::BadIpv6)?;
            let ip = literal
                .parse::<Ipv6Addr>()
                .map_err(|_| ProxyUrlError::BadIpv6)?;
            let port = after.strip_prefix(':').ok_or(ProxyUrlError::BadPort)?;
            (ProxyHost::V6(ip), port)
        } else {
            let (host, port) = authority.rsplit_once(':').ok_or(ProxyUrlError::BadPort)?;
            let host = match host.parse::<Ipv4Addr>() {
                Ok(ip) => ProxyHost::V4(ip),
                Err(_) => {
                    ProxyHost::Name(normalize_hostname(host).map_err(ProxyUrlError::BadHost)?)
                }
            };
            (host, port)
        };
        Ok(ProxyAddr {
            scheme,
            host,
            port: parse_port(port)?,
        })
    }

    /// The scheme.
    pub fn scheme(&self) -> ProxyScheme {
        self.scheme
    }

    /// The host.
    pub fn host(&self) -> &ProxyHost {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The canonical URL, `scheme://host:port`.
    pub fn to_url(&self) -> String {
        format!("{}://{self}", self.scheme.as_str())
    }
}

fn parse_port(s: &str) -> Result<u16, ProxyUrlError> {
    crate::request::port_number(s).ok_or(ProxyUrlError::BadPort)
}

impl fmt::Display for ProxyAddr {
    /// Writes `host:port`, with IPv6 literals in brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            ProxyHost::Name(n) => write!(f, "{n}:{}", self.port),
            ProxyHost::V4(ip) => write!(f, "{ip}:{}", self.port),
            ProxyHost::V6(ip) => write!(f, "[{ip}]:{}", self.port),
        }
    }
}

/// A value substituted into a username template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placeholder {
    /// `{country}`: the request's normalised country hint, or empty.
    Country,
    /// `{region}`: the request's region hint, or empty.
    Region,
    /// `{ip_type}`: the request's IP type hint, or empty.
    IpType,
    /// `{session}`: the provider session (32 lowercase hex), or empty when none was derived.
    Session,
}

impl Placeholder {
    /// Every placeholder.
    pub const ALL: [Placeholder; 4] = [
        Placeholder::Country,
        Placeholder::Region,
        Placeholder::IpType,
        Placeholder::Session,
    ];

    /// The name between the braces.
    pub const fn name(self) -> &'static str {
        match self {
            Placeholder::Country => "country",
            Placeholder::Region => "region",
            Placeholder::IpType => "ip_type",
            Placeholder::Session => "session",
        }
    }
}

/// Why a username template was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The template is empty (omit the field instead).
    #[error("must not be empty")]
    Empty,
    /// Longer than [`MAX_USERNAME_TEMPLATE_BYTES`].
    #[error("must be at most 256 bytes")]
    TooLong,
    /// A byte that is not visible ASCII, or a `:` (RFC 7617 §2: not allowed in a user-id).
    #[error("may only contain visible ASCII other than ':'")]
    BadCharacter,
    /// A `{` without a matching `}`, or a stray `}`.
    #[error("has an unbalanced brace")]
    UnbalancedBrace,
    /// A placeholder other than country, region, ip_type and session.
    #[error(
        "unknown placeholder {{{0}}}; allowed: {{country}}, {{region}}, {{ip_type}}, {{session}}"
    )]
    UnknownPlaceholder(String),
}

/// Why a username could not be rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// A substituted value has a byte outside `[A-Za-z0-9._~-]`, which could change the meaning
    /// of the username at the provider or break Basic authentication.
    #[error("value for {{{}}} contains a character that cannot be placed in a proxy username", .0.name())]
    UnsafeValue(Placeholder),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Segment {
    Literal(Box<str>),
    Value(Placeholder),
}

/// A validated username template.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct UsernameTemplate {
    raw: Box<str>,
    segments: Vec<Segment>,
}

/// The values a username template is rendered with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TemplateValues<'a> {
    /// Normalised country, or empty.
    pub country: &'a str,
    /// Region, or empty.
    pub region: &'a str,
    /// IP type, or empty.
    pub ip_type: &'a str,
    /// Provider session in hex, or empty.
    pub session: &'a str,
}

impl UsernameTemplate {
    /// Parses a template.
    pub fn parse(s: &str) -> Result<UsernameTemplate, TemplateError> {
        if s.is_empty() {
            return Err(TemplateError::Empty);
        }
        if s.len() > MAX_USERNAME_TEMPLATE_BYTES {
            return Err(TemplateError::TooLong);
        }
        if !s.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
            return Err(TemplateError::BadCharacter);
        }
        let mut segments = Vec::new();
        let mut rest = s;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                None => {
                    segments.push(Segment::Literal(rest.into()));
                    break;
                }
                Some(at) => {
                    let (literal, tail) = rest.split_at(at);
                    if !literal.is_empty() {
                        segments.push(Segment::Literal(literal.into()));
                    }
                    let inner = tail
                        .strip_prefix('{')
                        .ok_or(TemplateError::UnbalancedBrace)?;
                    let (name, after) = inner
                        .split_once('}')
                        .ok_or(TemplateError::UnbalancedBrace)?;
                    if name.contains('{') {
                        return Err(TemplateError::UnbalancedBrace);
                    }
                    let p = Placeholder::ALL
                        .into_iter()
                        .find(|p| p.name() == name)
                        .ok_or_else(|| TemplateError::UnknownPlaceholder(name.to_string()))?;
                    segments.push(Segment::Value(p));
                    rest = after;
                }
            }
        }
        Ok(UsernameTemplate {
            raw: s.into(),
            segments,
        })
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// Whether the template uses `p`.
    pub fn uses(&self, p: Placeholder) -> bool {
        self.segments.contains(&Segment::Value(p))
    }

    /// Renders the username. A missing value renders as the empty string; a value with a byte
    /// outside `[A-Za-z0-9._~-]` is refused rather than escaped, because providers do not
    /// decode usernames.
    pub fn render(&self, values: &TemplateValues<'_>) -> Result<String, RenderError> {
        let mut out = String::with_capacity(self.raw.len() + 48);
        for seg in &self.segments {
            match seg {
                Segment::Literal(l) => out.push_str(l),
                Segment::Value(p) => {
                    let v = match p {
                        Placeholder::Country => values.country,
                        Placeholder::Region => values.region,
                        Placeholder::IpType => values.ip_type,
                        Placeholder::Session => values.session,
                    };
                    if !v.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-')
                    }) {
                        return Err(RenderError::UnsafeValue(*p));
                    }
                    out.push_str(v);
                }
            }
        }
        Ok(out)
    }
}

impl fmt::Debug for UsernameTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("UsernameTemplate").field(&self.raw).finish()
    }
}

/// Why a password was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PasswordError {
    /// Empty (omit the field instead).
    #[error("must not be empty")]
    Empty,
    /// Longer than [`MAX_PROXY_PASSWORD_BYTES`].
    #[error("must be at most 1024 bytes")]
    TooLong,
    /// Contains a control character.
    #[error("must not contain control characters")]
    ControlCharacter,
}

/// A credential that never appears in `Debug` output, so a logged snapshot or decision cannot
/// leak it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Secret(Box<str>);

impl Secret {
    /// Validates an upstream proxy password.
    pub fn parse_password(s: &str) -> Result<Secret, PasswordError> {
        if s.is_empty() {
            return Err(PasswordError::Empty);
        }
        if s.len() > MAX_PROXY_PASSWORD_BYTES {
            return Err(PasswordError::TooLong);
        }
        if s.chars().any(char::is_control) {
            return Err(PasswordError::ControlCharacter);
        }
        Ok(Secret(s.into()))
    }

    /// The secret itself; call only where it is sent, never where it is logged.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Most endpoints one upstream proxy may list.
pub const MAX_PROXY_ENDPOINTS: usize = 64;
/// Longest `password_env` name in bytes.
pub const MAX_ENV_NAME_BYTES: usize = 128;

/// Who resolves destination names when a pool egresses through an upstream proxy (decision
/// 070).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProxyResolve {
    /// The gateway resolves the name, checks every address against the destination policy and
    /// asks the proxy for the allowed address literal: the proxy connects exactly where the
    /// policy allowed. The default.
    Gateway,
    /// The name is sent to the proxy, which resolves it (providers geo-resolve at the exit);
    /// the destination policy then applies to IP literal destinations only.
    Proxy,
}

impl ProxyResolve {
    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            ProxyResolve::Gateway => "gateway",
            ProxyResolve::Proxy => "proxy",
        }
    }

    /// Parses the wire name.
    pub fn parse(s: &str) -> Option<ProxyResolve> {
        match s {
            "gateway" => Some(ProxyResolve::Gateway),
            "proxy" => Some(ProxyResolve::Proxy),
            _ => None,
        }
    }
}

/// Why a `password_env` name was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EnvNameError {
    /// Empty, longer than [`MAX_ENV_NAME_BYTES`], or not `[A-Za-z_][A-Za-z0-9_]*`.
    #[error("must be an environment variable name: 1..=128 bytes of [A-Za-z0-9_], not starting with a digit")]
    Invalid,
}

/// Validates the name of an environment variable that holds a proxy password (POSIX portable
/// names: letters, digits and `_`, not starting with a digit).
pub fn parse_env_name(s: &str) -> Result<Box<str>, EnvNameError> {
    let ok = !s.is_empty()
        && s.len() <= MAX_ENV_NAME_BYTES
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(s.into())
    } else {
        Err(EnvNameError::Invalid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_urls_accepted() {
        for (input, canonical) in [
            ("http://proxy.acme.test:8000", "http://proxy.acme.test:8000"),
            (
                "http://proxy.acme.test:8000/",
                "http://proxy.acme.test:8000",
            ),
            ("HTTP://Proxy.Acme.Test:8000", "http://proxy.acme.test:8000"),
            ("http://127.0.0.1:3128", "http://127.0.0.1:3128"),
            ("http://[::1]:3128", "http://[::1]:3128"),
            ("http://[2001:DB8::1]:1", "http://[2001:db8::1]:1"),
            ("http://localhost:65535", "http://localhost:65535"),
            ("http://p:08080", "http://p:8080"),
            ("HTTPS://Proxy.Test:443/", "https://proxy.test:443"),
            ("socks5://127.0.0.1:1080", "socks5://127.0.0.1:1080"),
            ("SOCKS5H://[::1]:1080", "socks5h://[::1]:1080"),
        ] {
            assert_eq!(
                ProxyAddr::parse_url(input).unwrap().to_url(),
                canonical,
                "{input}"
            );
        }
    }

    #[test]
    fn proxy_urls_rejected() {
        let long = format!("http://{}.test:1", "a".repeat(600));
        for (input, e) in [
            ("socks4://proxy.test:1080", ProxyUrlError::BadScheme),
            ("socks5:/proxy.test:1080", ProxyUrlError::BadScheme),
            ("httpx://proxy.test:1", ProxyUrlError::BadScheme),
            ("proxy.test:8000", ProxyUrlError::BadScheme),
            ("http:/", ProxyUrlError::BadScheme),
            ("", ProxyUrlError::BadScheme),
            ("http://user:pw@proxy.test:8000", ProxyUrlError::UserInfo),
            ("http://proxy.test:8000/path", ProxyUrlError::HasPath),
            ("http://proxy.test:8000?x", ProxyUrlError::HasPath),
            ("http://proxy.test:8000#f", ProxyUrlError::HasPath),
            ("http://proxy.test:8000//", ProxyUrlError::HasPath),
            ("http://proxy.test", ProxyUrlError::BadPort),
            ("http://proxy.test:", ProxyUrlError::BadPort),
            ("http://proxy.test:0", ProxyUrlError::BadPort),
            ("http://proxy.test:65536", ProxyUrlError::BadPort),
            ("http://proxy.test:+80", ProxyUrlError::BadPort),
            ("http://proxy.test:123456", ProxyUrlError::BadPort),
            ("http://[::1]", ProxyUrlError::BadPort),
            ("http://[::1:80", ProxyUrlError::BadIpv6),
            ("http://[fe80::1%eth0]:80", ProxyUrlError::BadIpv6),
            ("http://[zz]:80", ProxyUrlError::BadIpv6),
            (
                "http://::1:80",
                ProxyUrlError::BadHost(HostError::BadCharacter),
            ),
            ("http://:80", ProxyUrlError::BadHost(HostError::Empty)),
            (
                "http://a_b..c:80",
                ProxyUrlError::BadHost(HostError::EmptyLabel),
            ),
            (
                "http://1.2.3:80",
                ProxyUrlError::BadHost(HostError::NumericName),
            ),
            (long.as_str(), ProxyUrlError::TooLong),
        ] {
            assert_eq!(ProxyAddr::parse_url(input), Err(e), "{input:?}");
        }
    }

    #[test]
    fn templates_parse_and_render() {
        let t = UsernameTemplate::parse("cust-7-country-{country}-session-{session}").unwrap();
        assert!(t.uses(Placeholder::Country) && t.uses(Placeholder::Session));
        assert!(!t.uses(Placeholder::Region));
        let v = TemplateValues {
            country: "US",
            session: "00ff",
            ..Default::default()
        };
        assert_eq!(t.render(&v).unwrap(), "cust-7-country-US-session-00ff");
        let t = UsernameTemplate::parse("{region}{ip_type}").unwrap();
        let v = TemplateValues {
            region: "us-east",
            ip_type: "residential",
            ..Default::default()
        };
        assert_eq!(t.render(&v).unwrap(), "us-eastresidential");
        assert_eq!(t.render(&TemplateValues::default()).unwrap(), "");
        let t = UsernameTemplate::parse("plain-user").unwrap();
        assert_eq!(t.render(&TemplateValues::default()).unwrap(), "plain-user");
    }

    #[test]
    fn render_refuses_unsafe_values() {
        let t = UsernameTemplate::parse("u-{region}").unwrap();
        for bad in ["us east", "a:b", "a@b", "é", "a\nb", "a-{b}"] {
            let v = TemplateValues {
                region: bad,
                ..Default::default()
            };
            assert_eq!(
                t.render(&v),
                Err(RenderError::UnsafeValue(Placeholder::Region)),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn templates_rejected() {
        let long = "a".repeat(257);
        for (input, e) in [
            ("", TemplateError::Empty),
            (long.as_str(), TemplateError::TooLong),
            ("user:x", TemplateError::BadCharacter),
            ("user name", TemplateError::BadCharacter),
            ("usér", TemplateError::BadCharacter),
            ("u-{country", TemplateError::UnbalancedBrace),
            ("u-country}", TemplateError::UnbalancedBrace),
            ("u-{{country}}", TemplateError::UnbalancedBrace),
            ("u-{zone}", TemplateError::UnknownPlaceholder("zone".into())),
            ("u-{}", TemplateError::UnknownPlaceholder(String::new())),
            (
                "u-{Country}",
                TemplateError::UnknownPlaceholder("Country".into()),
            ),
        ] {
            assert_eq!(UsernameTemplate::parse(input), Err(e), "{input:?}");
        }
    }

    #[test]
    fn env_names_and_resolve_modes() {
        for good in ["PROXY_PASSWORD", "_x", "a1", &"A".repeat(128)] {
            assert!(parse_env_name(good).is_ok(), "{good}");
        }
        for bad in ["", "1A", "A-B", "A B", "A=B", "ä", &"A".repeat(129)] {
            assert_eq!(parse_env_name(bad), Err(EnvNameError::Invalid), "{bad}");
        }
        for r in [ProxyResolve::Gateway, ProxyResolve::Proxy] {
            assert_eq!(ProxyResolve::parse(r.as_str()), Some(r));
        }
        assert_eq!(ProxyResolve::parse("Gateway"), None);
        assert!(ProxyScheme::Socks5h.is_socks() && !ProxyScheme::Https.is_socks());
    }

    #[test]
    fn secrets_are_redacted_in_debug() {
        let s = Secret::parse_password("hunter2").unwrap();
        assert_eq!(s.expose(), "hunter2");
        assert!(!format!("{s:?}").contains("hunter2"));
        assert_eq!(Secret::parse_password(""), Err(PasswordError::Empty));
        assert_eq!(
            Secret::parse_password("a\u{7f}"),
            Err(PasswordError::ControlCharacter)
        );
        assert_eq!(
            Secret::parse_password(&"p".repeat(1025)),
            Err(PasswordError::TooLong)
        );
        assert!(Secret::parse_password("pä ss:word").is_ok());
    }
}
