//! Host names and the `host` constraint of a routing rule: an exact host or `*.suffix`.
//!
//! Decision 010: patterns are normalised to lowercase; `*.example.com`
//! matches every name strictly below `example.com` (`a.example.com`, `a.b.example.com`) and not
//! the apex `example.com` itself; an exact pattern may also be an IPv4 literal. Destination hosts
//! are compared case-insensitively, ignoring one trailing dot.

use std::fmt;
use std::net::Ipv4Addr;

/// Longest host name in bytes (RFC 1035 §2.3.4, as text without the trailing dot).
pub const MAX_HOSTNAME_BYTES: usize = 253;
/// Longest label in bytes (RFC 1035 §2.3.4).
pub const MAX_LABEL_BYTES: usize = 63;

/// Why a host name or host pattern was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// The name is empty.
    #[error("host must not be empty")]
    Empty,
    /// The name is longer than 253 bytes.
    #[error("host must be at most 253 bytes")]
    TooLong,
    /// A label is empty (`a..b`, a leading or trailing dot).
    #[error("host has an empty label")]
    EmptyLabel,
    /// A label is longer than 63 bytes.
    #[error("host label must be at most 63 bytes")]
    LabelTooLong,
    /// A byte outside letters, digits, `-` and `_`.
    #[error("host may only contain ASCII letters, digits, '-', '_' and '.'")]
    BadCharacter,
    /// A label begins or ends with `-`.
    #[error("host label must not begin or end with '-'")]
    BadHyphen,
    /// The last label is numeric but the whole name is not an IPv4 address.
    #[error("host with a numeric last label must be an IPv4 address")]
    NumericName,
    /// A `*` other than a leading `*.`.
    #[error("the only wildcard form is a leading '*.'")]
    BadWildcard,
}

/// Validates a host name that is already lowercase. An all-numeric last label is accepted only
/// when `allows_ipv4` and the whole name is a dotted-quad IPv4 address, so `1.2.3` or
/// `example.123` cannot be mistaken for addresses.
fn check_hostname(s: &str, allows_ipv4: bool) -> Result<(), HostError> {
    if s.is_empty() {
        return Err(HostError::Empty);
    }
    if s.len() > MAX_HOSTNAME_BYTES {
        return Err(HostError::TooLong);
    }
    let mut last = "";
    for label in s.split('.') {
        if label.is_empty() {
            return Err(HostError::EmptyLabel);
        }
        if label.len() > MAX_LABEL_BYTES {
            return Err(HostError::LabelTooLong);
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err(if label.contains('*') {
                HostError::BadWildcard
            } else {
                HostError::BadCharacter
            });
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(HostError::BadHyphen);
        }
        last = label;
    }
    if last.bytes().all(|b| b.is_ascii_digit()) {
        // WHATWG URL host parsing treats a numeric last label as an IPv4 address.
        if allows_ipv4 && s.parse::<Ipv4Addr>().is_ok() {
            return Ok(());
        }
        return Err(HostError::NumericName);
    }
    Ok(())
}

/// Lowercases and validates a host name (letters, digits, `-`, `_`; or an IPv4 literal).
pub fn normalize_hostname(s: &str) -> Result<Box<str>, HostError> {
    let lower = s.to_ascii_lowercase();
    check_hostname(&lower, true)?;
    Ok(lower.into_boxed_str())
}

/// The `host` constraint of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// Matches exactly this host (lowercase).
    Exact(Box<str>),
    /// `*.suffix`: matches any name with at least one label before `.suffix`; never the apex.
    AnySubdomainOf(Box<str>),
}

impl HostPattern {
    /// Parses `host` or `*.suffix`, normalising to lowercase.
    pub fn parse(s: &str) -> Result<HostPattern, HostError> {
        let lower = s.to_ascii_lowercase();
        match lower.strip_prefix("*.") {
            Some(suffix) => {
                check_hostname(suffix, false)?;
                Ok(HostPattern::AnySubdomainOf(suffix.into()))
            }
            None => {
                check_hostname(&lower, true)?;
                Ok(HostPattern::Exact(lower.into_boxed_str()))
            }
        }
    }

    /// Whether the destination host matches. Case is ignored and so is a single trailing dot
    /// (`Example.COM.` is `example.com`). No allocation: this runs for every rule on the
    /// per-request path.
    pub fn matches(&self, host: &str) -> bool {
        let host = host.strip_suffix('.').unwrap_or(host).as_bytes();
        match self {
            HostPattern::Exact(h) => host.eq_ignore_ascii_case(h.as_bytes()),
            HostPattern::AnySubdomainOf(suffix) => {
                let suffix = suffix.as_bytes();
                // At least one byte of label plus the separating dot before the suffix.
                let Some(split) = host.len().checked_sub(suffix.len() + 1) else {
                    return false;
                };
                split > 0
                    && host.get(split) == Some(&b'.')
                    && host
                        .get(split + 1..)
                        .is_some_and(|tail| tail.eq_ignore_ascii_case(suffix))
            }
        }
    }

    /// [`HostPattern::matches`] for a parsed destination: a name as it is, an address by its
    /// text without brackets (written here, so that a request no rule asks about its host
    /// does not pay for it).
    pub fn matches_host(&self, host: &crate::request::Host) -> bool {
        match host {
            crate::request::Host::Domain(name) => self.matches(name),
            address => self.matches(&address.text()),
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Exact(h) => f.write_str(h),
            HostPattern::AnySubdomainOf(s) => write!(f, "*.{s}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_normalises() {
        for (input, canonical) in [
            ("example.com", "example.com"),
            ("Example.COM", "example.com"),
            ("*.Example.com", "*.example.com"),
            ("*.com", "*.com"),
            ("localhost", "localhost"),
            ("10.0.0.1", "10.0.0.1"),
            ("xn--bcher-kva.example", "xn--bcher-kva.example"),
            ("_srv.example.com", "_srv.example.com"),
            ("a-b.c", "a-b.c"),
        ] {
            assert_eq!(
                HostPattern::parse(input).unwrap().to_string(),
                canonical,
                "{input}"
            );
        }
    }

    #[test]
    fn rejects_malformed_patterns() {
        let long_label = format!("{}.com", "a".repeat(64));
        let long_name = format!("{}a.com", "a.".repeat(126));
        for (input, e) in [
            ("", HostError::Empty),
            ("*", HostError::BadWildcard),
            ("*.", HostError::Empty),
            ("a.*.com", HostError::BadWildcard),
            ("*example.com", HostError::BadWildcard),
            ("**.example.com", HostError::BadWildcard),
            ("*.*.example.com", HostError::BadWildcard),
            ("example..com", HostError::EmptyLabel),
            (".example.com", HostError::EmptyLabel),
            ("example.com.", HostError::EmptyLabel),
            ("-a.com", HostError::BadHyphen),
            ("a-.com", HostError::BadHyphen),
            ("exa mple.com", HostError::BadCharacter),
            ("bücher.de", HostError::BadCharacter),
            ("example.com:80", HostError::BadCharacter),
            ("[::1]", HostError::BadCharacter),
            (long_label.as_str(), HostError::LabelTooLong),
            (long_name.as_str(), HostError::TooLong),
            ("1.2.3", HostError::NumericName),
            ("example.123", HostError::NumericName),
            ("*.0.1", HostError::NumericName),
            ("*.10.0.0.1", HostError::NumericName),
            ("256.1.1.1", HostError::NumericName),
        ] {
            assert_eq!(HostPattern::parse(input), Err(e), "{input:?}");
        }
    }

    #[test]
    fn matching_table() {
        let cases: &[(&str, &str, bool)] = &[
            ("example.com", "example.com", true),
            ("example.com", "EXAMPLE.com", true),
            ("example.com", "example.com.", true),
            ("example.com", "www.example.com", false),
            ("example.com", "example.co", false),
            ("example.com", "", false),
            ("*.example.com", "a.example.com", true),
            ("*.example.com", "A.B.Example.Com", true),
            ("*.example.com", "a.example.com.", true),
            ("*.example.com", "example.com", false),
            ("*.example.com", ".example.com", false),
            ("*.example.com", "badexample.com", false),
            ("*.example.com", "a.example.com.evil", false),
            ("*.example.com", "xample.com", false),
            ("*.example.com", "", false),
            ("*.example.com", ".", false),
            ("10.0.0.1", "10.0.0.1", true),
            ("10.0.0.1", "10.0.0.10", false),
        ];
        for &(pattern, host, expected) in cases {
            let p = HostPattern::parse(pattern).unwrap();
            assert_eq!(p.matches(host), expected, "{pattern} vs {host:?}");
        }
    }

    /// A parsed destination matches as its text does: a name as it is, an address by its
    /// text without brackets, an address never by a name's pattern.
    #[test]
    fn parsed_hosts_match_as_their_text() {
        use crate::request::{parse_host, Host};
        let cases: &[(&str, &str, bool)] = &[
            ("10.0.0.1", "10.0.0.1", true),
            ("10.0.0.1", "10.0.0.10", false),
            ("*.example.com", "a.example.com", true),
            ("*.example.com", "example.com", false),
            ("example.com", "example.com", true),
            ("*.example.com", "[::1]", false),
            ("example.com", "10.0.0.1", false),
        ];
        for &(pattern, host, expected) in cases {
            let p = HostPattern::parse(pattern).unwrap();
            let h = parse_host(host).unwrap();
            assert_eq!(p.matches_host(&h), expected, "{pattern} vs {host:?}");
            assert_eq!(
                p.matches_host(&h),
                p.matches(&h.text()),
                "{pattern} vs {host:?}"
            );
        }
        assert!(matches!(parse_host("10.0.0.1"), Ok(Host::V4(_))));
    }

    #[test]
    fn hostname_normalisation() {
        assert_eq!(
            &*normalize_hostname("Proxy.Acme.TEST").unwrap(),
            "proxy.acme.test"
        );
        assert_eq!(&*normalize_hostname("192.0.2.1").unwrap(), "192.0.2.1");
        assert_eq!(
            normalize_hostname("*.acme.test"),
            Err(HostError::BadWildcard)
        );
    }

    #[test]
    fn matching_never_panics_on_odd_bytes() {
        let p = HostPattern::parse("*.é.com").err();
        assert_eq!(p, Some(HostError::BadCharacter));
        let p = HostPattern::parse("*.b.com").unwrap();
        for host in ["é.b.com", "ééé", "\u{0}.b.com", "..b.com", "b.com"] {
            let _ = p.matches(host);
        }
        assert!(p.matches("é.b.com"));
    }
}
