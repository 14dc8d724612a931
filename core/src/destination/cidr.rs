//! CIDR ranges (`10.0.0.0/8`, `::1/128`) as used by the snapshot's `destinations` lists and the
//! built-in deny ranges.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An IPv4 or IPv6 network: the address with host bits cleared and the prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cidr {
    /// An IPv4 network.
    V4 {
        /// Network address, host bits zero.
        net: u32,
        /// Prefix length, 0..=32.
        len: u8,
    },
    /// An IPv6 network.
    V6 {
        /// Network address, host bits zero.
        net: u128,
        /// Prefix length, 0..=128.
        len: u8,
    },
}

/// Why a CIDR string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// The address part is not an IP address.
    #[error("not an IP address")]
    BadAddress,
    /// The prefix length is missing, not a number, or too long for the family.
    #[error("prefix length must be 0..=32 for IPv4 and 0..=128 for IPv6")]
    BadPrefix,
    /// The address has bits set beyond the prefix (`10.0.0.1/8`): probably a typo.
    #[error("host bits are set beyond the prefix length")]
    HostBitsSet,
}

const fn mask32(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - len as u32)
    }
}

const fn mask128(len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        u128::MAX << (128 - len as u32)
    }
}

impl Cidr {
    /// A v4 network; `len` must be at most 32 and `net` may have host bits (they are cleared).
    pub const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> Cidr {
        let ip = u32::from_be_bytes([a, b, c, d]);
        Cidr::V4 {
            net: ip & mask32(len),
            len,
        }
    }

    /// A v6 network from its 128-bit value; host bits are cleared.
    pub const fn v6(ip: u128, len: u8) -> Cidr {
        Cidr::V6 {
            net: ip & mask128(len),
            len,
        }
    }

    /// Whether `ip` is inside the network. An IPv4 network never contains an IPv6 address and
    /// vice versa: callers canonicalise embedded addresses first.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (*self, ip) {
            (Cidr::V4 { net, len }, IpAddr::V4(a)) => u32::from(a) & mask32(len) == net,
            (Cidr::V6 { net, len }, IpAddr::V6(a)) => u128::from(a) & mask128(len) == net,
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    /// Parses `addr/len`, or a bare address meaning a single host (/32 or /128).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => {
                if l.is_empty() || l.len() > 3 || !l.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(CidrError::BadPrefix);
                }
                (a, Some(l.parse::<u8>().map_err(|_| CidrError::BadPrefix)?))
            }
            None => (s, None),
        };
        match addr.parse::<IpAddr>().map_err(|_| CidrError::BadAddress)? {
            IpAddr::V4(a) => {
                let len = len.unwrap_or(32);
                if len > 32 {
                    return Err(CidrError::BadPrefix);
                }
                let ip = u32::from(a);
                if ip & !mask32(len) != 0 {
                    return Err(CidrError::HostBitsSet);
                }
                Ok(Cidr::V4 { net: ip, len })
            }
            IpAddr::V6(a) => {
                let len = len.unwrap_or(128);
                if len > 128 {
                    return Err(CidrError::BadPrefix);
                }
                let ip = u128::from(a);
                if ip & !mask128(len) != 0 {
                    return Err(CidrError::HostBitsSet);
                }
                Ok(Cidr::V6 { net: ip, len })
            }
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Cidr::V4 { net, len } => write!(f, "{}/{}", Ipv4Addr::from(net), len),
            Cidr::V6 { net, len } => write!(f, "{}/{}", Ipv6Addr::from(net), len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_contains() {
        let c: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(c.contains("10.255.1.2".parse().unwrap()));
        assert!(!c.contains("11.0.0.0".parse().unwrap()));
        assert!(!c.contains("::ffff:10.0.0.1".parse().unwrap()));
        let c: Cidr = "::1/128".parse().unwrap();
        assert!(c.contains("::1".parse().unwrap()));
        let c: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(c.contains("8.8.8.8".parse().unwrap()));
        let c: Cidr = "127.0.0.1".parse().unwrap();
        assert_eq!(c.to_string(), "127.0.0.1/32");
        assert_eq!(
            "fe80::/10".parse::<Cidr>().unwrap().to_string(),
            "fe80::/10"
        );
    }

    #[test]
    fn rejects_bad_forms() {
        for (s, e) in [
            ("10.0.0.1/8", CidrError::HostBitsSet),
            ("10.0.0.0/33", CidrError::BadPrefix),
            ("10.0.0.0/", CidrError::BadPrefix),
            ("10.0.0.0/+8", CidrError::BadPrefix),
            ("10.0.0.0/0008", CidrError::BadPrefix),
            ("::/129", CidrError::BadPrefix),
            ("example.com/8", CidrError::BadAddress),
            ("", CidrError::BadAddress),
            ("fe80::1%eth0/64", CidrError::BadAddress),
        ] {
            assert_eq!(s.parse::<Cidr>(), Err(e), "{s}");
        }
    }
}
