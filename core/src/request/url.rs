//! Destination URL validation: an absolute `http` or `https` URL, parsed strictly into a
//! [`TargetUrl`] (spec, Request table, field `url`; decision 001 for what the spec leaves open).
//!
//! This is on the per-request path: no allocation beyond the validated result.

use std::fmt::{self, Write as _};
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::limits::MAX_URL_BYTES;

/// The scheme of a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Plain HTTP, default port 80.
    Http,
    /// HTTP over TLS, default port 443.
    Https,
}

impl Scheme {
    /// The scheme's default port.
    pub const fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }

    /// The lowercase scheme name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// The host of a destination.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name: lowercase ASCII labels (IDNs must arrive as A-labels, `xn--…`). Shared, so
    /// that pool keys and lookups clone it without allocating.
    Domain(std::sync::Arc<str>),
    /// An IPv4 literal in strict dotted-decimal form.
    V4(Ipv4Addr),
    /// An IPv6 literal (written in brackets in the URL), without a zone identifier.
    V6(Ipv6Addr),
}

impl fmt::Display for Host {
    /// Writes the host as it appears in a URL authority or a `Host` header.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Domain(d) => f.write_str(d),
            Host::V4(a) => write!(f, "{a}"),
            Host::V6(a) => write!(f, "[{a}]"),
        }
    }
}

/// A validated absolute destination URL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TargetUrl {
    /// `http` or `https`.
    pub scheme: Scheme,
    /// The host, normalised (lowercase name or canonical address).
    pub host: Host,
    /// The effective port: explicit, or the scheme's default.
    pub port: u16,
    /// Whether the URL named the port explicitly and it differs from the default.
    pub has_explicit_port: bool,
    /// Path and query as sent on the request line (origin-form); `/` when the URL had no path.
    pub path_and_query: String,
}

impl TargetUrl {
    /// The value of the `Host` header for this URL: the host, plus the port when it is not the
    /// scheme's default. Built without allocating.
    pub fn authority(&self) -> HostText<'_> {
        let mut t = InlineText::default();
        let _ = match &self.host {
            Host::Domain(d) if !self.has_explicit_port => return HostText::Borrowed(d),
            // A name with its port is longer than an address literal: rare enough (a
            // destination on a port of its own) to be the one case that allocates.
            Host::Domain(d) => {
                let port = crate::decimal::Digits::of(u64::from(self.port));
                let port = port.as_bytes();
                let mut s = String::with_capacity(d.len() + 1 + port.len());
                s.push_str(d);
                s.push(':');
                s.extend(port.iter().map(|&b| char::from(b)));
                return HostText::Owned(s);
            }
            Host::V4(a) => t.push_ipv4(*a),
            Host::V6(a) => write!(t, "[{a}]"),
        };
        if self.has_explicit_port {
            let _ = t.push(b":").and_then(|()| t.push_decimal(self.port));
        }
        HostText::Inline(t)
    }

    /// Appends the bytes of [`TargetUrl::authority`] to `out`, without the text in between: an
    /// address literal is written from its numbers, a name copied.
    pub fn write_authority(&self, out: &mut Vec<u8>) {
        match &self.host {
            Host::Domain(d) => out.extend_from_slice(d.as_bytes()),
            Host::V4(a) => {
                let _ = push_ipv4(out, *a);
            }
            // Rare enough to take the formatted text.
            Host::V6(_) => {
                out.extend_from_slice(self.authority().as_bytes());
                return;
            }
        }
        if self.has_explicit_port {
            out.push(b':');
            out.extend_from_slice(crate::decimal::Digits::of(u64::from(self.port)).as_bytes());
        }
    }

    /// The URL as text, as `Display` writes it, in one allocation of its exact length
    /// (`to_string` grows its buffer piece by piece).
    pub fn to_text(&self) -> String {
        let scheme = self.scheme.as_str();
        let authority = self.authority();
        // The authority's length from its bytes: its `str` view checks formatted text first.
        let len = scheme.len() + 3 + authority.as_bytes().len() + self.path_and_query.len();
        let mut s = String::with_capacity(len);
        s.push_str(scheme);
        s.push_str("://");
        s.push_str(&authority);
        s.push_str(&self.path_and_query);
        s
    }

    /// The host name for TLS SNI, DNS and routing: the domain, or the address literal without
    /// brackets. Built without allocating.
    pub fn host_str(&self) -> HostText<'_> {
        self.host.text()
    }
}

impl Host {
    /// The host as text: the domain, or the address literal without brackets. Built without
    /// allocating.
    pub fn text(&self) -> HostText<'_> {
        let mut t = InlineText::default();
        let _ = match self {
            Host::Domain(d) => return HostText::Borrowed(d),
            Host::V4(a) => t.push_ipv4(*a),
            Host::V6(a) => write!(t, "{a}"),
        };
        HostText::Inline(t)
    }
}

/// Longest text [`InlineText`] holds: a bracketed IPv6 literal (at most 45 characters, the
/// longest form with an embedded IPv4 address) with `:65535`.
const INLINE_TEXT_BYTES: usize = "[]:65535".len() + 45;

/// A short string on the stack: an address literal, with its port when it has one.
#[derive(Clone, Copy)]
pub struct InlineText {
    buf: [u8; INLINE_TEXT_BYTES],
    len: usize,
}

impl Default for InlineText {
    fn default() -> Self {
        InlineText {
            buf: [0; INLINE_TEXT_BYTES],
            len: 0,
        }
    }
}

impl InlineText {
    /// Appends `n` in decimal.
    fn push_decimal(&mut self, n: u16) -> fmt::Result {
        self.push(crate::decimal::Digits::of(u64::from(n)).as_bytes())
    }

    /// Appends an IPv4 address in dotted decimal, as its `Display` writes it.
    fn push_ipv4(&mut self, a: Ipv4Addr) -> fmt::Result {
        push_ipv4(self, a)
    }

    fn push(&mut self, bytes: &[u8]) -> fmt::Result {
        let end = self.len.checked_add(bytes.len()).ok_or(fmt::Error)?;
        let dst = self.buf.get_mut(self.len..end).ok_or(fmt::Error)?;
        dst.copy_from_slice(bytes);
        self.len = end;
        Ok(())
    }
}

/// Where an address literal's text is appended: the inline text of a [`HostText`], or a head
/// being written.
trait Sink {
    fn put(&mut self, bytes: &[u8]) -> fmt::Result;
}

impl Sink for InlineText {
    fn put(&mut self, bytes: &[u8]) -> fmt::Result {
        self.push(bytes)
    }
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) -> fmt::Result {
        self.extend_from_slice(bytes);
        Ok(())
    }
}

/// Appends an IPv4 address in dotted decimal, as its `Display` writes it: each octet's text
/// and its dot copied from [`OCTET_TEXT`] as one four-byte word over the dot of the octet
/// before, then the whole address appended at once.
fn push_ipv4(out: &mut impl Sink, a: Ipv4Addr) -> fmt::Result {
    let mut text = [0u8; 16];
    let mut len = 0;
    for octet in a.octets() {
        let (digits, n) = OCTET_TEXT.get(usize::from(octet)).ok_or(fmt::Error)?;
        text.get_mut(len..len + 4)
            .ok_or(fmt::Error)?
            .copy_from_slice(digits);
        len += usize::from(*n) + 1;
    }
    // Without the last octet's dot.
    out.put(text.get(..len - 1).ok_or(fmt::Error)?)
}

/// Every octet's decimal text without leading zeros, followed by a dot, and the number of its
/// digits.
#[allow(clippy::indexing_slicing)] // written at compile time, within the arrays
const OCTET_TEXT: [([u8; 4], u8); 256] = {
    let mut table = [([0u8; 4], 0u8); 256];
    let mut o = 0;
    while o < 256 {
        let (h, t, u) = ((o / 100) as u8, (o / 10 % 10) as u8, (o % 10) as u8);
        table[o] = match o {
            0..=9 => ([b'0' + u, b'.', 0, 0], 1),
            10..=99 => ([b'0' + t, b'0' + u, b'.', 0], 2),
            _ => ([b'0' + h, b'0' + t, b'0' + u, b'.'], 3),
        };
        o += 1;
    }
    table
};

impl fmt::Write for InlineText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push(s.as_bytes())
    }
}

/// A host or authority rendered from a [`TargetUrl`]: borrowed when the URL holds the text,
/// otherwise formatted on the stack, or (a name with its port) in a string of its own.
#[derive(Clone)]
pub enum HostText<'a> {
    /// The URL's own text.
    Borrowed(&'a str),
    /// An address literal, with its port when it has one.
    Inline(InlineText),
    /// A name with its port.
    Owned(String),
}

impl HostText<'_> {
    /// The text's bytes, without the UTF-8 check the `str` view makes of formatted text (the
    /// head writer takes bytes).
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            HostText::Borrowed(s) => s.as_bytes(),
            HostText::Owned(s) => s.as_bytes(),
            HostText::Inline(t) => t.buf.get(..t.len).unwrap_or_default(),
        }
    }
}

impl std::ops::Deref for HostText<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            HostText::Borrowed(s) => s,
            HostText::Owned(s) => s,
            // Only whole `&str`s are ever written, so the prefix is UTF-8.
            HostText::Inline(t) => t
                .buf
                .get(..t.len)
                .and_then(|b| std::str::from_utf8(b).ok())
                .unwrap_or_default(),
        }
    }
}

impl fmt::Debug for HostText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl fmt::Display for HostText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self)
    }
}

impl PartialEq<&str> for HostText<'_> {
    fn eq(&self, other: &&str) -> bool {
        **self == **other
    }
}

impl fmt::Display for TargetUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}://{}{}",
            self.scheme.as_str(),
            self.authority(),
            self.path_and_query
        )
    }
}

/// Why a URL was rejected. Every variant is an `invalid_request`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// Longer than [`MAX_URL_BYTES`].
    #[error("url is longer than 8192 bytes")]
    TooLong,
    /// Contains a space, a control character or a non-ASCII byte.
    #[error("url contains a space, control or non-ASCII character (send IDNs as A-labels)")]
    BadCharacter,
    /// Not `http://` or `https://`, or not absolute.
    #[error("url must be an absolute http or https URL")]
    BadScheme,
    /// Carries user information (`user:pass@`).
    #[error("url must not contain user info")]
    UserInfo,
    /// Carries a fragment (`#…`).
    #[error("url must not contain a fragment")]
    Fragment,
    /// The host is empty.
    #[error("url host is empty")]
    EmptyHost,
    /// The host is not a valid DNS name or IPv4 literal.
    #[error("url host is malformed")]
    BadHost,
    /// An IPv6 literal is malformed.
    #[error("url IPv6 literal is malformed")]
    BadIpv6,
    /// An IPv6 literal carries a zone identifier (`%25eth0`).
    #[error("url IPv6 literal must not carry a zone identifier")]
    Ipv6Zone,
    /// The port is empty, not a number, or outside 1..=65535.
    #[error("url port must be a number from 1 to 65535")]
    BadPort,
    /// A percent-escape is not `%` followed by two hex digits.
    #[error("url contains a malformed percent-escape")]
    BadEscape,
}

/// Longest DNS name, without a trailing dot (RFC 1035 §2.3.4).
const MAX_HOSTNAME_BYTES: usize = 253;
/// Longest DNS label (RFC 1035 §2.3.4).
const MAX_LABEL_BYTES: usize = 63;

/// Parses and validates an absolute destination URL.
///
/// On the per-request path, so each part is read once: the whole URL in one pass (visible
/// ASCII, no fragment), the authority in one pass (where it ends, user info, the port's colon),
/// the host in one (see [`parse_host`]).
pub fn parse_target_url(url: &str) -> Result<TargetUrl, UrlError> {
    let b = url.as_bytes();
    if b.len() > MAX_URL_BYTES {
        return Err(UrlError::TooLong);
    }
    check_visible(b)?;
    let (scheme, rest) = split_scheme(url).ok_or(UrlError::BadScheme)?;
    let authority = Authority::scan(rest.as_bytes());
    if authority.has_user_info {
        return Err(UrlError::UserInfo);
    }
    if authority.has_backslash {
        return Err(UrlError::BadHost);
    }
    // Every byte is ASCII (checked above), so each split falls on a character boundary.
    let (auth, path_and_query) = rest.split_at(authority.end);
    let (host, port) = split_host_port(auth, authority.colon)?;
    let host = parse_host(host)?;
    let (port, has_explicit_port) = match port {
        None => (scheme.default_port(), false),
        Some(p) => {
            let p = parse_port(p)?;
            (p, p != scheme.default_port())
        }
    };
    check_escapes(path_and_query.as_bytes())?;
    let path_and_query = if path_and_query.is_empty() {
        "/".to_string()
    } else if path_and_query.starts_with('?') {
        format!("/{path_and_query}")
    } else {
        path_and_query.to_string()
    };
    Ok(TargetUrl {
        scheme,
        host,
        port,
        has_explicit_port,
        path_and_query,
    })
}

impl TargetUrl {
    /// A target URL from parts that were parsed before, as the worker bus carries them: each
    /// part passes the checks [`parse_target_url`] makes of it, so a peer's bytes never make a
    /// URL that text could not have. A name is checked as a host and must be in the form the
    /// parser keeps it (lowercase); an address needs no check. `has_explicit_port` follows
    /// from the port.
    pub fn from_parts(
        scheme: Scheme,
        host: Host,
        port: u16,
        path_and_query: &str,
    ) -> Result<TargetUrl, UrlError> {
        let host = match host {
            // A name as the parser keeps it (lowercase): one form per URL, so that the parts
            // of a decoded frame write back to the same bytes.
            Host::Domain(name) => match parse_host(&name)? {
                Host::Domain(checked) if *checked == *name => Host::Domain(name),
                _ => return Err(UrlError::BadHost),
            },
            address => address,
        };
        if port == 0 {
            return Err(UrlError::BadPort);
        }
        let b = path_and_query.as_bytes();
        if b.len() > MAX_URL_BYTES {
            return Err(UrlError::TooLong);
        }
        if b.first() != Some(&b'/') {
            return Err(UrlError::BadCharacter);
        }
        check_visible(b)?;
        check_escapes(b)?;
        Ok(TargetUrl {
            scheme,
            host,
            port,
            has_explicit_port: port != scheme.default_port(),
            path_and_query: path_and_query.to_string(),
        })
    }
}

/// Only visible ASCII: a space or control byte could split the request line upstream, and
/// non-ASCII hosts must be sent as A-labels (decision 001). One branchless pass finds a
/// fragment's `#` too.
fn check_visible(b: &[u8]) -> Result<(), UrlError> {
    // Two byte-wide accumulators rather than a fold over a pair of flags: a loop the compiler
    // turns into vector code.
    let (mut invisible, mut hash) = (0u8, 0u8);
    for &c in b {
        invisible |= u8::from(c.wrapping_sub(0x21) > 0x7e - 0x21);
        hash |= u8::from(c == b'#');
    }
    if invisible != 0 {
        return Err(UrlError::BadCharacter);
    }
    if hash != 0 {
        return Err(UrlError::Fragment);
    }
    Ok(())
}

/// What one pass over the bytes after `scheme://` finds.
struct Authority {
    /// Where the authority ends: the first `/` or `?`, or the end.
    end: usize,
    /// Whether it holds an `@` (user information).
    has_user_info: bool,
    /// Whether it holds a `\` (which some resolvers and clients read as a path separator).
    has_backslash: bool,
    /// The first `:` in it.
    colon: Option<usize>,
}

impl Authority {
    fn scan(rest: &[u8]) -> Authority {
        let mut a = Authority {
            end: rest.len(),
            has_user_info: false,
            has_backslash: false,
            colon: None,
        };
        for (i, &c) in rest.iter().enumerate() {
            match c {
                b'/' | b'?' => {
                    a.end = i;
                    break;
                }
                b'@' => a.has_user_info = true,
                b'\\' => a.has_backslash = true,
                b':' if a.colon.is_none() => a.colon = Some(i),
                _ => {}
            }
        }
        a
    }
}

/// `http://` or `https://`, in any case, and what follows it: the first four bytes compared as
/// one word folded to lowercase, then the rest byte by byte.
fn split_scheme(url: &str) -> Option<(Scheme, &str)> {
    let b = url.as_bytes();
    let word = u32::from_le_bytes(b.get(..4)?.try_into().ok()?);
    // Setting bit 5 of each byte lowercases letters; no other byte becomes one of `http`.
    if word | 0x2020_2020 != u32::from_le_bytes(*b"http") {
        return None;
    }
    let (scheme, len) = match b.get(4..)? {
        [b':', b'/', b'/', ..] => (Scheme::Http, 7),
        [s, b':', b'/', b'/', ..] if s | 0x20 == b's' => (Scheme::Https, 8),
        _ => return None,
    };
    Some((scheme, url.get(len..)?))
}

/// Splits `host[:port]` or `[v6][:port]`; `colon` is the authority's first `:`.
fn split_host_port(
    authority: &str,
    colon: Option<usize>,
) -> Result<(&str, Option<&str>), UrlError> {
    if authority.is_empty() {
        return Err(UrlError::EmptyHost);
    }
    if let Some(rest) = authority.strip_prefix('[') {
        let close = rest.find(']').ok_or(UrlError::BadIpv6)?;
        let after = &rest[close + 1..];
        let host = &authority[..close + 2];
        return match after {
            "" => Ok((host, None)),
            a => match a.strip_prefix(':') {
                Some(p) => Ok((host, Some(p))),
                None => Err(UrlError::BadIpv6),
            },
        };
    }
    match colon {
        Some(at) => Ok((
            authority.get(..at).unwrap_or_default(),
            Some(authority.get(at + 1..).unwrap_or_default()),
        )),
        None => Ok((authority, None)),
    }
}

fn parse_port(p: &str) -> Result<u16, UrlError> {
    port_number(p).ok_or(UrlError::BadPort)
}

/// A port as written in an authority: one to five ASCII digits, 1..=65535 (leading zeros
/// allowed). The one rule for destination URLs, CONNECT targets and upstream proxy addresses.
pub fn port_number(p: &str) -> Option<u16> {
    if p.is_empty() || p.len() > 5 {
        return None;
    }
    let mut value = 0u32;
    for &c in p.as_bytes() {
        if !c.is_ascii_digit() {
            return None;
        }
        value = value * 10 + u32::from(c - b'0');
    }
    u16::try_from(value).ok().filter(|&n| n != 0)
}

/// Parses the host part of an authority (brackets included for IPv6).
///
/// A name whose last label is numeric (or a `0x` literal) is an address: only strict
/// dotted-decimal IPv4 is accepted, so that obfuscated forms (`0x7f.1`, `2130706433`,
/// `017.0.0.1`) cannot slip past the destination policy through a resolver that reads them
/// differently. Anything else must be a DNS name of valid labels; it is kept lowercase.
pub fn parse_host(host: &str) -> Result<Host, UrlError> {
    if host.is_empty() {
        return Err(UrlError::EmptyHost);
    }
    if let Some(inner) = host.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or(UrlError::BadIpv6)?;
        // RFC 6874 zone identifiers (`fe80::1%25eth0`) are meaningless off-link and rejected
        // (spec: IPv6 zone identifiers are rejected).
        if inner.contains('%') {
            return Err(UrlError::Ipv6Zone);
        }
        return inner
            .parse::<Ipv6Addr>()
            .map(Host::V6)
            .map_err(|_| UrlError::BadIpv6);
    }
    if host.len() > MAX_HOSTNAME_BYTES {
        return Err(UrlError::BadHost);
    }
    let bytes = host.as_bytes();
    let last_start = bytes
        .iter()
        .rposition(|&c| c == b'.')
        .map_or(0, |dot| dot + 1);
    let last = bytes.get(last_start..).unwrap_or_default();
    if !last.is_empty() && (last.iter().all(u8::is_ascii_digit) || is_hex_literal(last)) {
        return parse_strict_ipv4(bytes)
            .map(Host::V4)
            .ok_or(UrlError::BadHost);
    }
    if !is_valid_name(bytes) {
        return Err(UrlError::BadHost);
    }
    Ok(Host::Domain(if bytes.iter().any(u8::is_ascii_uppercase) {
        host.to_ascii_lowercase().into()
    } else {
        host.into()
    }))
}

/// Whether a byte may stand in a label: a letter, digit, hyphen or underscore, from a table.
fn is_label_byte(c: u8) -> bool {
    #[allow(clippy::indexing_slicing)] // written at compile time, within the array
    const LABEL: [bool; 256] = {
        let mut table = [false; 256];
        let mut c = 0;
        while c < 256 {
            let b = c as u8;
            table[c] = b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
            c += 1;
        }
        table
    };
    LABEL.get(usize::from(c)).copied().unwrap_or(false)
}

/// Labels of 1 to 63 letters, digits, hyphens or underscores separated by single dots, none
/// starting or ending with a hyphen: one pass. Underscores are accepted because real HTTP hosts
/// carry them (decision 001).
fn is_valid_name(name: &[u8]) -> bool {
    // Length of the label being read, and the byte before the current one.
    let (mut len, mut prev) = (0usize, b'.');
    for &c in name {
        if c == b'.' {
            if len == 0 || prev == b'-' {
                return false;
            }
            len = 0;
        } else {
            if !is_label_byte(c) || (len == 0 && c == b'-') {
                return false;
            }
            len += 1;
            if len > MAX_LABEL_BYTES {
                return false;
            }
        }
        prev = c;
    }
    len > 0 && prev != b'-'
}

fn is_hex_literal(label: &[u8]) -> bool {
    match label {
        [b'0', x, digits @ ..] if x | 0x20 == b'x' && !digits.is_empty() => {
            digits.iter().all(u8::is_ascii_hexdigit)
        }
        _ => false,
    }
}

/// Dotted-decimal with exactly four parts, each 0..=255 without leading zeros: one pass.
fn parse_strict_ipv4(s: &[u8]) -> Option<Ipv4Addr> {
    let mut out = [0u8; 4];
    // Parts finished, and the value and digit count of the one being read.
    let (mut n, mut value, mut digits) = (0usize, 0u16, 0u8);
    for &c in s {
        if c == b'.' {
            *out.get_mut(n)? = octet(value, digits)?;
            (n, value, digits) = (n + 1, 0, 0);
        } else if c.is_ascii_digit() {
            // A fourth digit, or a second after a leading zero.
            if digits == 3 || (digits == 1 && value == 0) {
                return None;
            }
            value = value * 10 + u16::from(c - b'0');
            digits += 1;
        } else {
            return None;
        }
    }
    *out.get_mut(n)? = octet(value, digits)?;
    (n == 3).then(|| Ipv4Addr::from(out))
}

/// A finished part of a dotted-decimal address: at least one digit, at most 255.
fn octet(value: u16, digits: u8) -> Option<u8> {
    if digits == 0 {
        return None;
    }
    u8::try_from(value).ok()
}

fn check_escapes(b: &[u8]) -> Result<(), UrlError> {
    // Most paths hold no escape: one search (the standard library's `memchr`) says so.
    if !b.contains(&b'%') {
        return Ok(());
    }
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        if c == b'%' {
            match (b.get(i + 1), b.get(i + 2)) {
                (Some(h), Some(l)) if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => i += 3,
                _ => return Err(UrlError::BadEscape),
            }
        } else {
            i += 1;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte value, at every position of a path long enough for vector code and its tail:
    /// only visible ASCII passes, and a `#` is a fragment.
    #[test]
    fn every_byte_is_judged_visible_or_not() {
        for len in [1usize, 7, 31, 32, 33, 70] {
            for at in 0..len {
                for c in 0..=255u8 {
                    let mut b = vec![b'a'; len];
                    b[at] = c;
                    let want = if !(0x21..=0x7e).contains(&c) {
                        Err(UrlError::BadCharacter)
                    } else if c == b'#' {
                        Err(UrlError::Fragment)
                    } else {
                        Ok(())
                    };
                    assert_eq!(check_visible(&b), want, "byte {c:#x} at {at} of {len}");
                }
            }
        }
    }

    /// The scheme is read as a case-insensitive prefix would read it: every string of up to
    /// nine bytes from the letters of the schemes in both cases, their punctuation and a few
    /// others, against `https://` then `http://` stripped as text.
    #[test]
    fn schemes_split_as_case_insensitive_prefixes() {
        fn reference(url: &str) -> Option<(Scheme, &str)> {
            let strip = |prefix: &str| {
                url.get(..prefix.len())
                    .filter(|head| head.eq_ignore_ascii_case(prefix))
                    .map(|_| &url[prefix.len()..])
            };
            strip("https://")
                .map(|r| (Scheme::Https, r))
                .or_else(|| strip("http://").map(|r| (Scheme::Http, r)))
        }
        let alphabet = [
            "h", "H", "t", "T", "p", "P", "s", "S", ":", "/", "x", "é", "\u{0}", "(",
        ];
        // A deterministic walk through strings built from the alphabet.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut url = String::new();
        for i in 0..300_000u64 {
            url.clear();
            // Most strings start as a scheme would, so that the interesting cases are common.
            let start = match i % 4 {
                0 => "http",
                1 => "HTTPS",
                2 => "hTtP",
                _ => "",
            };
            url.push_str(start);
            for _ in 0..(next() % 6) {
                url.push_str(alphabet[(next() % alphabet.len() as u64) as usize]);
            }
            assert_eq!(split_scheme(&url), reference(&url), "{url:?}");
        }
        for url in [
            "http://", "https://", "HTTP://a", "httpS://", "http:/", "https:/", "htt", "",
        ] {
            assert_eq!(split_scheme(url), reference(url), "{url:?}");
        }
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for o in 0..=255u8 {
            for a in [
                Ipv4Addr::new(o, 0, 9, 10),
                Ipv4Addr::new(99, o, 100, 255),
                Ipv4Addr::new(255, 1, o, 0),
                Ipv4Addr::new(0, 200, 55, o),
                Ipv4Addr::new(o, o, o, o),
            ] {
                let mut out = b"x".to_vec();
                push_ipv4(&mut out, a).unwrap();
                assert_eq!(out, format!("x{a}").into_bytes());
                let mut inline = InlineText::default();
                inline.push_ipv4(a).unwrap();
                assert_eq!(&inline.buf[..inline.len], a.to_string().as_bytes());
            }
        }
    }

    #[test]
    fn accepts_and_normalises() {
        let cases: &[(&str, &str, &str, u16, &str)] = &[
            // (input, scheme, authority, port, path_and_query)
            ("http://example.com", "http", "example.com", 80, "/"),
            (
                "https://Example.COM/a/b?c=d",
                "https",
                "example.com",
                443,
                "/a/b?c=d",
            ),
            ("HTTPS://example.com:443/", "https", "example.com", 443, "/"),
            (
                "http://example.com:8080/x",
                "http",
                "example.com:8080",
                8080,
                "/x",
            ),
            ("http://example.com?q=1", "http", "example.com", 80, "/?q=1"),
            ("http://127.0.0.1:9/", "http", "127.0.0.1:9", 9, "/"),
            (
                "http://10.200.3.45:65535/",
                "http",
                "10.200.3.45:65535",
                65535,
                "/",
            ),
            ("http://[::1]:8080/p", "http", "[::1]:8080", 8080, "/p"),
            ("http://[2001:DB8::1]/", "http", "[2001:db8::1]", 80, "/"),
            (
                "http://xn--bcher-kva.example/",
                "http",
                "xn--bcher-kva.example",
                80,
                "/",
            ),
            (
                "http://_dmarc.example.com/",
                "http",
                "_dmarc.example.com",
                80,
                "/",
            ),
            (
                "http://a.b/%20x?y=%7B|}",
                "http",
                "a.b",
                80,
                "/%20x?y=%7B|}",
            ),
            ("http://localhost/", "http", "localhost", 80, "/"),
            ("http://0.0.0.0:00080/", "http", "0.0.0.0", 80, "/"),
            ("http://a-b.c_d.E1/", "http", "a-b.c_d.e1", 80, "/"),
        ];
        for (input, scheme, authority, port, pq) in cases {
            let u = parse_target_url(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(u.scheme.as_str(), *scheme, "{input}");
            assert_eq!(u.authority(), *authority, "{input}");
            let mut written = b"prefix ".to_vec();
            u.write_authority(&mut written);
            assert_eq!(written, format!("prefix {authority}").as_bytes(), "{input}");
            assert_eq!(u.port, *port, "{input}");
            assert_eq!(u.to_text(), u.to_string(), "{input}");
            assert_eq!(u.to_text().capacity(), u.to_text().len(), "{input}");
            assert_eq!(u.path_and_query, *pq, "{input}");
        }
    }

    /// The longest accepted names and literals render whole, with their port.
    #[test]
    fn longest_hosts_render_whole() {
        let label = "a".repeat(63);
        let name = format!("{label}.{label}.{label}.{}", "b".repeat(61));
        assert_eq!(name.len(), MAX_HOSTNAME_BYTES);
        let u = parse_target_url(&format!("https://{name}:65535/")).unwrap();
        assert_eq!(&*u.authority(), format!("{name}:65535"));
        assert_eq!(u.authority().as_bytes(), format!("{name}:65535").as_bytes());
        assert_eq!(&*u.host_str(), name);
        let v6 = "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255";
        let u = parse_target_url(&format!("http://[{v6}]:65535/")).unwrap();
        let canonical = v6.parse::<Ipv6Addr>().unwrap().to_string();
        assert_eq!(&*u.authority(), format!("[{canonical}]:65535"));
        assert_eq!(
            u.authority().as_bytes(),
            format!("[{canonical}]:65535").as_bytes()
        );
        assert_eq!(&*u.host_str(), canonical);
        let u = parse_target_url("http://10.0.0.1/").unwrap();
        assert_eq!(u.authority(), "10.0.0.1");
        assert_eq!(u.host_str(), "10.0.0.1");
    }

    /// The hand-written decimal rendering of addresses and ports says what `Display` says.
    #[test]
    fn addresses_and_ports_render_as_display_does() {
        let octets = [0u8, 1, 9, 10, 42, 99, 100, 199, 200, 255];
        let ports = [
            1u16, 9, 10, 81, 99, 100, 443, 999, 1000, 8080, 9999, 10000, 65535,
        ];
        for (i, &a) in octets.iter().enumerate() {
            for &b in &octets[i..] {
                let addr = Ipv4Addr::new(a, b, octets[(i + 3) % octets.len()], b ^ a);
                for &port in &ports {
                    let u = parse_target_url(&format!("http://{addr}:{port}/")).unwrap();
                    assert_eq!(&*u.host_str(), addr.to_string());
                    assert_eq!(&*u.authority(), format!("{addr}:{port}"));
                    let d = parse_target_url(&format!("http://h{a}.example:{port}/")).unwrap();
                    assert_eq!(&*d.authority(), format!("h{a}.example:{port}"));
                }
            }
        }
        for o in 0..=255u8 {
            let addr = Ipv4Addr::new(o, 255 - o, o / 3, o);
            let u = parse_target_url(&format!("http://{addr}/")).unwrap();
            assert_eq!(&*u.authority(), addr.to_string());
            assert_eq!(u.authority().as_bytes(), addr.to_string().as_bytes());
        }
    }

    /// The port rule that destination URLs, CONNECT targets and upstream proxy addresses share.
    #[test]
    fn port_numbers() {
        for (text, want) in [
            ("1", Some(1)),
            ("080", Some(80)),
            ("00443", Some(443)),
            ("65535", Some(65535)),
            ("", None),
            ("0", None),
            ("00000", None),
            ("65536", None),
            ("99999", None),
            ("000080", None),
            ("8a", None),
            ("+80", None),
            (" 80", None),
            ("８0", None),
        ] {
            assert_eq!(port_number(text), want, "{text:?}");
        }
    }

    #[test]
    fn rejects_with_precise_reason() {
        use UrlError::*;
        let long = format!("http://a.com/{}", "x".repeat(MAX_URL_BYTES));
        let cases: &[(&str, UrlError)] = &[
            (&long, TooLong),
            ("ftp://example.com/", BadScheme),
            ("example.com/", BadScheme),
            ("//example.com/", BadScheme),
            ("http:/example.com", BadScheme),
            ("javascript:alert(1)", BadScheme),
            ("http://user@example.com/", UserInfo),
            ("http://user:pw@example.com/", UserInfo),
            ("http://example.com/#frag", Fragment),
            ("http://example.com#", Fragment),
            // An invisible byte is the error wherever it is, before or after a `#`, in the
            // first word of eight bytes or a later one, or in the tail.
            ("http://example.com/#frag x", BadCharacter),
            ("http://e.com/a#\x7f", BadCharacter),
            ("http:/\x01", BadCharacter),
            ("http://e/\x7f#", BadCharacter),
            ("http:///path", EmptyHost),
            ("http://", EmptyHost),
            ("http://:80/", EmptyHost),
            ("http://exa mple.com/", BadCharacter),
            ("http://example.com/\r\nX: y", BadCharacter),
            ("http://bücher.example/", BadCharacter),
            ("http://[fe80::1%25eth0]/", Ipv6Zone),
            ("http://[fe80::1%eth0]/", Ipv6Zone),
            ("http://[::1/", BadIpv6),
            ("http://[::g]/", BadIpv6),
            ("http://[::1]x/", BadIpv6),
            ("http://example.com:/", BadPort),
            ("http://example.com:0/", BadPort),
            ("http://example.com:65536/", BadPort),
            ("http://example.com:-1/", BadPort),
            ("http://example.com:80:80/", BadPort),
            ("http://-bad.example/", BadHost),
            ("http://bad-.example/", BadHost),
            ("http://a..b/", BadHost),
            ("http://example.com./", BadHost),
            ("http://ex!ample.com/", BadHost),
            ("http://0x7f.0.0.1/", BadHost),
            ("http://0x7f000001/", BadHost),
            ("http://2130706433/", BadHost),
            ("http://127.1/", BadHost),
            ("http://017.0.0.1/", BadHost),
            ("http://256.0.0.1/", BadHost),
            ("http://1.2.3.4.5/", BadHost),
            ("http://1.2.3.4./", BadHost),
            ("http://1.2.3.1000/", BadHost),
            ("http://1.2..3/", BadHost),
            ("http://.1.2.3/", BadHost),
            ("http://a.b-/", BadHost),
            ("http://a.-b/", BadHost),
            ("http://a\\b.com/", BadHost),
            ("http://example.com/%zz", BadEscape),
            ("http://example.com/%4", BadEscape),
        ];
        for (input, want) in cases {
            assert_eq!(parse_target_url(input), Err(*want), "{input}");
        }
        let label64 = format!("http://{}.com/", "a".repeat(64));
        assert_eq!(parse_target_url(&label64), Err(BadHost));
        let name254 = format!("http://{}.aa/", vec!["a".repeat(63); 4].join("."));
        assert_eq!(parse_target_url(&name254), Err(BadHost));
    }
}
