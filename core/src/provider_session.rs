//! Provider session derivation (spec, Routing rules 7 and 8): a pseudonymous, deterministic
//! 128-bit value that an upstream proxy provider uses to keep the same exit IP for a sticky
//! session, identical on every control instance and every eligible worker.
//!
//! Encoding (decision 011): SHA-256 over the domain-separation tag
//! [`DOMAIN_TAG`] followed by the fields deployment id, pool id, upstream proxy id, normalised
//! country (uppercase, or empty), region (or empty), IP type (or empty) and sticky session id,
//! each item (the tag included) written as its byte length in 4-byte big-endian followed by its
//! bytes. The session is the first 16 bytes of the digest, rendered as 32 lowercase hex
//! characters.

use std::fmt;

use crate::hints::{CountryCode, RouteHints};

/// Domain-separation tag, the first item of the derivation input. A new derivation gets a new
/// tag, so values of different versions can never collide by construction.
pub const DOMAIN_TAG: &[u8] = b"sortie-provider-session-v1";

/// The inputs of the derivation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProviderSessionInputs<'a> {
    /// The deployment that sent the request.
    pub deployment_id: &'a str,
    /// The selected pool.
    pub pool_id: &'a str,
    /// The pool's upstream proxy.
    pub upstream_proxy_id: &'a str,
    /// The request's country hint, normalised to uppercase.
    pub country: Option<CountryCode>,
    /// The request's region hint.
    pub region: Option<&'a str>,
    /// The request's IP type hint.
    pub ip_type: Option<&'a str>,
    /// The caller's sticky session id; non-empty when a session is derived at all.
    pub sticky_session_id: &'a str,
}

impl<'a> ProviderSessionInputs<'a> {
    /// The inputs for a request's hints in a pool behind an upstream proxy.
    pub fn from_hints(
        deployment_id: &'a str,
        pool_id: &'a str,
        upstream_proxy_id: &'a str,
        hints: &'a RouteHints,
        sticky_session_id: &'a str,
    ) -> Self {
        ProviderSessionInputs {
            deployment_id,
            pool_id,
            upstream_proxy_id,
            country: hints.country,
            region: hints.region.as_deref(),
            ip_type: hints.ip_type.as_deref(),
            sticky_session_id,
        }
    }
}

/// A derived provider session: 128 bits, shown as 32 lowercase hex characters.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProviderSession([u8; 16]);

impl ProviderSession {
    /// Derives the session. Every input is bounded by a contract limit far below 4 GiB (at most
    /// the 4 MiB admin or request body), so each length fits the 4-byte prefix.
    pub fn derive(inputs: &ProviderSessionInputs<'_>) -> ProviderSession {
        let country = inputs.country;
        let fields: [&[u8]; 8] = [
            DOMAIN_TAG,
            inputs.deployment_id.as_bytes(),
            inputs.pool_id.as_bytes(),
            inputs.upstream_proxy_id.as_bytes(),
            country.as_ref().map_or(&b""[..], |c| c.as_str().as_bytes()),
            inputs.region.unwrap_or("").as_bytes(),
            inputs.ip_type.unwrap_or("").as_bytes(),
            inputs.sticky_session_id.as_bytes(),
        ];
        let digest = crate::rendezvous::sha256_of_fields(fields);
        let mut out = [0u8; 16];
        for (o, d) in out.iter_mut().zip(digest.as_ref()) {
            *o = *d;
        }
        ProviderSession(out)
    }

    /// Reads the 32 lowercase hex characters of [`ProviderSession::to_hex`] back (the worker
    /// bus carries a session that way); anything else is `None`.
    pub fn from_hex(s: &str) -> Option<ProviderSession> {
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let b = s.as_bytes();
        if b.len() != 32 {
            return None;
        }
        let mut out = [0u8; 16];
        for (o, pair) in out.iter_mut().zip(b.chunks_exact(2)) {
            *o = digit(*pair.first()?)? << 4 | digit(*pair.get(1)?)?;
        }
        Some(ProviderSession(out))
    }

    /// The 16 bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The 32 lowercase hex characters, without allocating.
    pub fn to_hex(&self) -> [u8; 32] {
        crate::hex::encode16(self.0)
    }
}

impl fmt::Display for ProviderSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = self.to_hex();
        // Hex digits are ASCII by construction.
        f.write_str(std::str::from_utf8(&hex).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for ProviderSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProviderSession({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs<'a>(
        country: &str,
        region: Option<&'a str>,
        ip_type: Option<&'a str>,
        sticky: &'a str,
    ) -> ProviderSessionInputs<'a> {
        ProviderSessionInputs {
            deployment_id: "dep_default",
            pool_id: "acme-us",
            upstream_proxy_id: "acme",
            country: CountryCode::parse(country),
            region,
            ip_type,
            sticky_session_id: sticky,
        }
    }

    /// Vectors cross-checked with Python's hashlib; see docs/decisions/provider-session.md.
    #[test]
    fn test_vectors() {
        let cases = [
            (
                inputs("us", Some("us-east"), Some("residential"), "cart-42"),
                "c7e9309974935c0fe4aed16040d50aad",
            ),
            (
                inputs("", None, None, "s"),
                "90f2c91f2796f21bfe1348b0eff707ba",
            ),
            (
                ProviderSessionInputs {
                    deployment_id: "dep_b",
                    pool_id: "p",
                    upstream_proxy_id: "x",
                    country: CountryCode::parse("DE"),
                    region: None,
                    ip_type: Some("mobile"),
                    sticky_session_id: "späti ✓",
                },
                "237f76e1f784918f3b93ab737fd32e53",
            ),
        ];
        for (i, expected) in cases {
            assert_eq!(ProviderSession::derive(&i).to_string(), expected, "{i:?}");
        }
    }

    #[test]
    fn output_shape() {
        let s = ProviderSession::derive(&inputs("US", None, None, "x")).to_string();
        assert_eq!(s.len(), 32);
        assert!(s
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_eq!(
            format!("{:?}", ProviderSession([0xab; 16])),
            format!("ProviderSession({})", "ab".repeat(16))
        );
    }

    #[test]
    fn every_input_changes_the_session() {
        let base = inputs("US", Some("r"), Some("t"), "s");
        let b = ProviderSession::derive(&base);
        let variants = [
            ProviderSessionInputs {
                deployment_id: "other",
                ..base
            },
            ProviderSessionInputs {
                pool_id: "other",
                ..base
            },
            ProviderSessionInputs {
                upstream_proxy_id: "other",
                ..base
            },
            ProviderSessionInputs {
                country: CountryCode::parse("DE"),
                ..base
            },
            ProviderSessionInputs {
                country: None,
                ..base
            },
            ProviderSessionInputs {
                region: Some("r2"),
                ..base
            },
            ProviderSessionInputs {
                ip_type: None,
                ..base
            },
            ProviderSessionInputs {
                sticky_session_id: "s2",
                ..base
            },
        ];
        for v in variants {
            assert_ne!(ProviderSession::derive(&v), b, "{v:?}");
        }
        // Country is normalised before derivation: case does not matter.
        assert_eq!(
            ProviderSession::derive(&inputs("us", Some("r"), Some("t"), "s")),
            b
        );
    }

    #[test]
    fn length_prefixes_keep_field_boundaries() {
        // Without the prefixes these two would hash the same concatenation.
        let a = ProviderSessionInputs {
            region: Some("ab"),
            ip_type: Some("c"),
            ..inputs("", None, None, "s")
        };
        let b = ProviderSessionInputs {
            region: Some("a"),
            ip_type: Some("bc"),
            ..inputs("", None, None, "s")
        };
        assert_ne!(ProviderSession::derive(&a), ProviderSession::derive(&b));
        // An absent value and an empty one are the same input by definition.
        let c = ProviderSessionInputs {
            region: Some(""),
            ..inputs("", None, None, "s")
        };
        assert_eq!(
            ProviderSession::derive(&c),
            ProviderSession::derive(&inputs("", None, None, "s"))
        );
    }

    #[test]
    fn from_hints_takes_the_normalised_hints() {
        let hints = RouteHints {
            country: CountryCode::parse("us"),
            region: Some("us-east".into()),
            ip_type: Some("residential".into()),
            sticky_session_id: Some("cart-42".into()),
            ..Default::default()
        };
        let i =
            ProviderSessionInputs::from_hints("dep_default", "acme-us", "acme", &hints, "cart-42");
        assert_eq!(
            i,
            inputs("US", Some("us-east"), Some("residential"), "cart-42")
        );
    }

    #[test]
    fn hex_reads_back() {
        let s = ProviderSession([0xab; 16]);
        let hex = s.to_hex();
        let text = std::str::from_utf8(&hex).unwrap();
        assert_eq!(ProviderSession::from_hex(text), Some(s));
        assert_eq!(ProviderSession::from_hex(&text[1..]), None);
        assert_eq!(ProviderSession::from_hex(&text.to_uppercase()), None);
        assert_eq!(ProviderSession::from_hex(&"g".repeat(32)), None);
    }
}
