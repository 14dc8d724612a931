//! The destination policy: the snapshot's `destinations.allow` and `destinations.deny` lists
//! applied to the address a worker is about to connect to.
//!
//! This is on the per-connection path: [`DestinationPolicy::check`] scans two short lists and
//! classifies one address, without allocating. It must be called with the resolved address that
//! is actually connected to, after DNS, so that a name re-resolving to an internal address
//! between check and connect (DNS rebinding) cannot slip through (decision 003).

use std::fmt;
use std::net::IpAddr;

use super::class::{canonical, classify, teredo_server, IpClass};
use super::Cidr;
use crate::error::{ApiError, ErrorCode};

/// Which destinations workers may connect to.
///
/// Deny-by-default for non-public addresses (decision 003). The order of [`check`](Self::check):
///
/// 1. An address in a `deny` entry is denied, whatever `allow` says.
/// 2. A public address (see [`classify`]) is allowed.
/// 3. A non-public address is allowed only when an `allow` entry contains it.
///
/// Both lists are matched against the address as given and against its [`canonical`] form, so
/// `deny = ["10.0.0.0/8"]` also stops `::ffff:10.0.0.1` and `64:ff9b::a00:1`, and
/// `allow = ["127.0.0.0/8"]` also opens `::ffff:127.0.0.1`. The deny list is further matched
/// against the server address inside a Teredo address, since that server is contacted too.
///
/// Cloud metadata endpoints ([`IpClass::CloudMetadata`]) are stricter: an allow entry opens one
/// only when it names exactly that address (a /32 or /128 equal to the address or its canonical
/// form). `allow = ["169.254.0.0/16"]` opens link-local space for a test rig without also opening
/// the credentials endpoint at `169.254.169.254`; an operator who really wants the endpoint has to
/// write it out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestinationPolicy {
    /// Ranges opened despite being non-public (`destinations.allow`).
    pub allow: Vec<Cidr>,
    /// Ranges closed even when public (`destinations.deny`).
    pub deny: Vec<Cidr>,
}

/// Why [`DestinationPolicy::check`] refused an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// The address is in an entry of the deny list.
    DenyListed {
        /// The address that was checked, as given.
        addr: IpAddr,
        /// The first deny entry that contains it.
        entry: Cidr,
    },
    /// The address is not public and no allow entry opens it.
    NonPublic {
        /// The address that was checked, as given.
        addr: IpAddr,
        /// Its class.
        class: IpClass,
    },
}

impl Denied {
    /// The address that was refused.
    pub const fn addr(&self) -> IpAddr {
        match *self {
            Denied::DenyListed { addr, .. } | Denied::NonPublic { addr, .. } => addr,
        }
    }

    /// A short reason for error details and metrics labels: `deny_list` or the class name.
    pub const fn reason(&self) -> &'static str {
        match *self {
            Denied::DenyListed { .. } => "deny_list",
            Denied::NonPublic { class, .. } => class.as_str(),
        }
    }
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Denied::DenyListed { addr, entry } => {
                write!(f, "destination {addr} is in deny range {entry}")
            }
            Denied::NonPublic { addr, class } => write!(
                f,
                "destination {addr} is not public ({class}) and no allow entry opens it"
            ),
        }
    }
}

impl std::error::Error for Denied {}

impl From<Denied> for ApiError {
    /// The client-facing `destination_denied` error. The resolved address stays out of the
    /// message: it would tell a caller what internal names resolve to. Logs use [`Denied`]'s
    /// `Display`, which includes it.
    fn from(d: Denied) -> Self {
        ApiError::new(
            ErrorCode::DestinationDenied,
            "destination address is not allowed by the destination policy",
        )
        .with_detail("reason", d.reason())
    }
}

/// Whether `entry` names exactly the single address `ip`.
fn names_exactly(entry: &Cidr, ip: IpAddr) -> bool {
    let is_host = match *entry {
        Cidr::V4 { len, .. } => len == 32,
        Cidr::V6 { len, .. } => len == 128,
    };
    is_host && entry.contains(ip)
}

impl DestinationPolicy {
    /// A policy with the given lists.
    pub fn new(allow: Vec<Cidr>, deny: Vec<Cidr>) -> Self {
        DestinationPolicy { allow, deny }
    }

    /// Decides whether a worker may connect to `ip`, the resolved address it is about to dial.
    pub fn check(&self, ip: IpAddr) -> Result<(), Denied> {
        let canon = canonical(ip);
        let server = teredo_server(ip).map(IpAddr::V4);
        for entry in &self.deny {
            let hit = entry.contains(ip)
                || entry.contains(canon)
                || server.is_some_and(|s| entry.contains(s));
            if hit {
                return Err(Denied::DenyListed {
                    addr: ip,
                    entry: *entry,
                });
            }
        }
        let class = classify(ip);
        if class.is_public() {
            return Ok(());
        }
        let opened = if class == IpClass::CloudMetadata {
            self.allow
                .iter()
                .any(|e| names_exactly(e, ip) || names_exactly(e, canon))
        } else {
            self.allow
                .iter()
                .any(|e| e.contains(ip) || e.contains(canon))
        };
        if opened {
            Ok(())
        } else {
            Err(Denied::NonPublic { addr: ip, class })
        }
    }

    /// Whether [`check`](Self::check) allows `ip`.
    pub fn allows(&self, ip: IpAddr) -> bool {
        self.check(ip).is_ok()
    }
}
