//! Identifiers of snapshot objects (rules, pools, upstream proxies) and of workers.
//!
//! One grammar for all of them keeps ids safe to print in logs, paths and error messages: 1 to
//! [`MAX_ID_BYTES`] bytes of ASCII letters, digits, `.`, `_` and `-`, case-sensitive.

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

/// Longest identifier, in bytes (decision 006: the spec names no limit).
pub const MAX_ID_BYTES: usize = 64;

/// A validated identifier. Cloning is a reference-count increment, so routing decisions can
/// carry ids without allocating.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConfigId(Arc<str>);

/// Why an identifier was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The identifier is the empty string.
    #[error("must not be empty")]
    Empty,
    /// The identifier is longer than [`MAX_ID_BYTES`].
    #[error("must be at most 64 bytes")]
    TooLong,
    /// The identifier has a byte outside `[A-Za-z0-9._-]`.
    #[error("may only contain ASCII letters, digits, '.', '_' and '-'")]
    BadCharacter,
}

impl ConfigId {
    /// Parses an identifier.
    pub fn parse(s: &str) -> Result<ConfigId, IdError> {
        if s.is_empty() {
            return Err(IdError::Empty);
        }
        if s.len() > MAX_ID_BYTES {
            return Err(IdError::TooLong);
        }
        if !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(IdError::BadCharacter);
        }
        Ok(ConfigId(Arc::from(s)))
    }

    /// The identifier text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for ConfigId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for ConfigId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ConfigId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for ConfigId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for ConfigId {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for ConfigId {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_grammar() {
        for ok in [
            "a",
            "default",
            "acme-us",
            "pool_1.eu",
            "A-Z",
            &"x".repeat(64),
        ] {
            assert_eq!(ConfigId::parse(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn rejects_outside_the_grammar() {
        let long = "x".repeat(65);
        for (bad, e) in [
            ("", IdError::Empty),
            (long.as_str(), IdError::TooLong),
            ("a b", IdError::BadCharacter),
            ("a/b", IdError::BadCharacter),
            ("é", IdError::BadCharacter),
            ("a\"", IdError::BadCharacter),
            ("a\n", IdError::BadCharacter),
        ] {
            assert_eq!(ConfigId::parse(bad), Err(e), "{bad:?}");
        }
    }

    #[test]
    fn borrows_as_str_for_map_lookups() {
        let mut m = std::collections::HashMap::new();
        m.insert(ConfigId::parse("direct").unwrap(), 1);
        assert_eq!(m.get("direct"), Some(&1));
    }
}
