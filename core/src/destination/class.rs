//! Address classification: whether a resolved address is public, and if not, which special-purpose
//! range it belongs to, after unwrapping IPv4 addresses embedded in IPv6 forms.
//!
//! This is on the per-connection path: everything here is a handful of integer comparisons over
//! constant tables, with no allocation and no locks.
//!
//! Sources: the IANA IPv4 and IPv6 Special-Purpose Address Registries (RFC 6890 and its updates),
//! the IANA IPv6 Address Space registry (only `2000::/3` is allocated as global unicast), RFC 4291
//! (IPv4-mapped and IPv4-compatible forms), RFC 6052 and RFC 8215 (NAT64 prefixes), RFC 3056
//! (6to4) and RFC 4380 (Teredo).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::Cidr;

/// What kind of address an IP is, as far as the destination policy cares.
///
/// Every class except [`IpClass::Public`] is denied by default (decision 003); a snapshot's
/// `destinations.allow` list can open them again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpClass {
    /// A globally reachable unicast address.
    Public,
    /// `0.0.0.0` and `::`: on many stacks a connect to it reaches the local host.
    Unspecified,
    /// `0.0.0.0/8` other than `0.0.0.0` ("this network", RFC 791); Linux routes it locally.
    ThisNetwork,
    /// `127.0.0.0/8` and `::1`.
    Loopback,
    /// RFC 1918 private ranges `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`.
    Private,
    /// Carrier-grade NAT shared space `100.64.0.0/10` (RFC 6598).
    Cgnat,
    /// `169.254.0.0/16` and `fe80::/10`.
    LinkLocal,
    /// IPv6 unique local addresses `fc00::/7` (RFC 4193).
    UniqueLocal,
    /// Deprecated IPv6 site-local addresses `fec0::/10` (RFC 3879).
    SiteLocal,
    /// `224.0.0.0/4` and `ff00::/8`.
    Multicast,
    /// The limited broadcast address `255.255.255.255`.
    Broadcast,
    /// Documentation ranges: TEST-NET-1/2/3, `2001:db8::/32` and `3fff::/20` (RFC 9637).
    Documentation,
    /// Benchmarking ranges `198.18.0.0/15` and `2001:2::/48`.
    Benchmarking,
    /// IETF protocol assignments `192.0.0.0/24` and `2001::/23`, apart from the few anycast
    /// services IANA marks globally reachable.
    IetfProtocol,
    /// The deprecated 6to4 relay anycast range `192.88.99.0/24` (RFC 7526).
    Relay6to4,
    /// ORCHID identifiers `2001:10::/28` and ORCHIDv2 `2001:20::/28`: identifiers, not locators.
    Orchid,
    /// The IPv6 discard-only prefix `100::/64` (RFC 6666).
    DiscardOnly,
    /// The local-use NAT64 prefix `64:ff9b:1::/48` (RFC 8215), which only a local translator
    /// serves; it is non-public whatever IPv4 address it carries.
    Nat64LocalUse,
    /// Segment Routing SIDs `5f00::/16` (RFC 9602).
    SegmentRouting,
    /// Reserved space: `240.0.0.0/4`, deprecated IPv4-compatible IPv6 addresses, and IPv6 space
    /// outside `2000::/3` that no other class names.
    Reserved,
    /// A cloud instance metadata endpoint (see [`METADATA_V4`] and [`METADATA_V6`]).
    CloudMetadata,
}

impl IpClass {
    /// Every class, public first.
    pub const ALL: &'static [IpClass] = &[
        IpClass::Public,
        IpClass::Unspecified,
        IpClass::ThisNetwork,
        IpClass::Loopback,
        IpClass::Private,
        IpClass::Cgnat,
        IpClass::LinkLocal,
        IpClass::UniqueLocal,
        IpClass::SiteLocal,
        IpClass::Multicast,
        IpClass::Broadcast,
        IpClass::Documentation,
        IpClass::Benchmarking,
        IpClass::IetfProtocol,
        IpClass::Relay6to4,
        IpClass::Orchid,
        IpClass::DiscardOnly,
        IpClass::Nat64LocalUse,
        IpClass::SegmentRouting,
        IpClass::Reserved,
        IpClass::CloudMetadata,
    ];

    /// Whether the class is globally reachable unicast, and so allowed by default.
    pub const fn is_public(self) -> bool {
        matches!(self, IpClass::Public)
    }

    /// A stable snake_case name for logs and error details.
    pub const fn as_str(self) -> &'static str {
        match self {
            IpClass::Public => "public",
            IpClass::Unspecified => "unspecified",
            IpClass::ThisNetwork => "this_network",
            IpClass::Loopback => "loopback",
            IpClass::Private => "private",
            IpClass::Cgnat => "cgnat",
            IpClass::LinkLocal => "link_local",
            IpClass::UniqueLocal => "unique_local",
            IpClass::SiteLocal => "site_local",
            IpClass::Multicast => "multicast",
            IpClass::Broadcast => "broadcast",
            IpClass::Documentation => "documentation",
            IpClass::Benchmarking => "benchmarking",
            IpClass::IetfProtocol => "ietf_protocol",
            IpClass::Relay6to4 => "relay_6to4",
            IpClass::Orchid => "orchid",
            IpClass::DiscardOnly => "discard_only",
            IpClass::Nat64LocalUse => "nat64_local_use",
            IpClass::SegmentRouting => "segment_routing",
            IpClass::Reserved => "reserved",
            IpClass::CloudMetadata => "cloud_metadata",
        }
    }
}

impl fmt::Display for IpClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// IPv4 cloud metadata endpoints. They sit inside wider non-public classes (or, for Azure, in
/// public space), and are singled out so that opening the wider class does not open them.
pub const METADATA_V4: &[Ipv4Addr] = &[
    // AWS, GCP, Azure IMDS, OpenStack, DigitalOcean and most others.
    Ipv4Addr::new(169, 254, 169, 254),
    // AWS ECS task metadata and credentials.
    Ipv4Addr::new(169, 254, 170, 2),
    // AWS EKS Pod Identity agent (hands out credentials).
    Ipv4Addr::new(169, 254, 170, 23),
    // Alibaba Cloud.
    Ipv4Addr::new(100, 100, 100, 200),
    // Oracle Cloud Infrastructure.
    Ipv4Addr::new(192, 0, 0, 192),
    // Azure WireServer: a public-space address that serves platform configuration to VMs.
    Ipv4Addr::new(168, 63, 129, 16),
];

/// IPv6 cloud metadata endpoints.
pub const METADATA_V6: &[Ipv6Addr] = &[
    // AWS IMDS over IPv6 (Nitro instances).
    Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254),
    // AWS EKS Pod Identity agent over IPv6.
    Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0023),
];

/// IPv4 special-purpose ranges. The first entry containing an address decides its class, so
/// more specific entries come before the ranges that enclose them; an address no entry contains
/// is public.
const V4_RANGES: &[(Cidr, IpClass)] = &[
    (Cidr::v4(0, 0, 0, 0, 32), IpClass::Unspecified),
    (Cidr::v4(0, 0, 0, 0, 8), IpClass::ThisNetwork),
    (Cidr::v4(10, 0, 0, 0, 8), IpClass::Private),
    (Cidr::v4(100, 64, 0, 0, 10), IpClass::Cgnat),
    (Cidr::v4(127, 0, 0, 0, 8), IpClass::Loopback),
    (Cidr::v4(169, 254, 0, 0, 16), IpClass::LinkLocal),
    (Cidr::v4(172, 16, 0, 0, 12), IpClass::Private),
    // IANA marks the PCP (RFC 7723) and TURN (RFC 8155) anycast addresses globally reachable,
    // although the /24 around them is not.
    (Cidr::v4(192, 0, 0, 9, 32), IpClass::Public),
    (Cidr::v4(192, 0, 0, 10, 32), IpClass::Public),
    (Cidr::v4(192, 0, 0, 0, 24), IpClass::IetfProtocol),
    (Cidr::v4(192, 0, 2, 0, 24), IpClass::Documentation),
    (Cidr::v4(192, 88, 99, 0, 24), IpClass::Relay6to4),
    (Cidr::v4(192, 168, 0, 0, 16), IpClass::Private),
    (Cidr::v4(198, 18, 0, 0, 15), IpClass::Benchmarking),
    (Cidr::v4(198, 51, 100, 0, 24), IpClass::Documentation),
    (Cidr::v4(203, 0, 113, 0, 24), IpClass::Documentation),
    (Cidr::v4(224, 0, 0, 0, 4), IpClass::Multicast),
    (Cidr::v4(255, 255, 255, 255, 32), IpClass::Broadcast),
    (Cidr::v4(240, 0, 0, 0, 4), IpClass::Reserved),
];

/// IPv6 special-purpose ranges, first match wins as for [`V4_RANGES`]. Embedded IPv4 forms are
/// handled before this table; an address no entry contains is reserved (`::/0` at the end),
/// because IANA allocates only `2000::/3` as global unicast.
const V6_RANGES: &[(Cidr, IpClass)] = &[
    // Inside 2001::/23 IANA marks these anycast services globally reachable: PCP, TURN and
    // DNS-SD SRP anycast, AMT (RFC 7450), AS112-v6 (RFC 7535) and DRIP DETs (RFC 9374).
    (
        Cidr::v6(0x2001_0001_0000_0000_0000_0000_0000_0001, 128),
        IpClass::Public,
    ),
    (
        Cidr::v6(0x2001_0001_0000_0000_0000_0000_0000_0002, 128),
        IpClass::Public,
    ),
    (
        Cidr::v6(0x2001_0001_0000_0000_0000_0000_0000_0003, 128),
        IpClass::Public,
    ),
    (
        Cidr::v6(0x2001_0003_0000_0000_0000_0000_0000_0000, 32),
        IpClass::Public,
    ),
    (
        Cidr::v6(0x2001_0004_0112_0000_0000_0000_0000_0000, 48),
        IpClass::Public,
    ),
    (
        Cidr::v6(0x2001_0030_0000_0000_0000_0000_0000_0000, 28),
        IpClass::Public,
    ),
    (
        Cidr::v6(0x2001_0002_0000_0000_0000_0000_0000_0000, 48),
        IpClass::Benchmarking,
    ),
    (
        Cidr::v6(0x2001_0010_0000_0000_0000_0000_0000_0000, 28),
        IpClass::Orchid,
    ),
    (
        Cidr::v6(0x2001_0020_0000_0000_0000_0000_0000_0000, 28),
        IpClass::Orchid,
    ),
    (
        Cidr::v6(0x2001_0000_0000_0000_0000_0000_0000_0000, 23),
        IpClass::IetfProtocol,
    ),
    (
        Cidr::v6(0x2001_0db8_0000_0000_0000_0000_0000_0000, 32),
        IpClass::Documentation,
    ),
    (
        Cidr::v6(0x3fff_0000_0000_0000_0000_0000_0000_0000, 20),
        IpClass::Documentation,
    ),
    (
        Cidr::v6(0x2000_0000_0000_0000_0000_0000_0000_0000, 3),
        IpClass::Public,
    ),
    (
        Cidr::v6(0x0100_0000_0000_0000_0000_0000_0000_0000, 64),
        IpClass::DiscardOnly,
    ),
    (
        Cidr::v6(0x5f00_0000_0000_0000_0000_0000_0000_0000, 16),
        IpClass::SegmentRouting,
    ),
    (
        Cidr::v6(0xfc00_0000_0000_0000_0000_0000_0000_0000, 7),
        IpClass::UniqueLocal,
    ),
    (
        Cidr::v6(0xfe80_0000_0000_0000_0000_0000_0000_0000, 10),
        IpClass::LinkLocal,
    ),
    (
        Cidr::v6(0xfec0_0000_0000_0000_0000_0000_0000_0000, 10),
        IpClass::SiteLocal,
    ),
    (
        Cidr::v6(0xff00_0000_0000_0000_0000_0000_0000_0000, 8),
        IpClass::Multicast,
    ),
    (Cidr::v6(0, 0), IpClass::Reserved),
];

/// How an IPv6 address carries an IPv4 address, if it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Embedding {
    /// `::ffff:a.b.c.d` (RFC 4291 §2.5.5.2): the IPv4 address itself on a dual-stack socket.
    Mapped(Ipv4Addr),
    /// `::a.b.c.d` (RFC 4291 §2.5.5.1), deprecated.
    Compatible(Ipv4Addr),
    /// `64:ff9b::a.b.c.d` (RFC 6052), the well-known NAT64 prefix.
    Nat64(Ipv4Addr),
    /// `64:ff9b:1::/48` (RFC 8215); the IPv4 address is read in the /96 format.
    Nat64LocalUse(Ipv4Addr),
    /// `2002:AABB:CCDD::/48` (RFC 3056 §2): the IPv4 address is bits 16..48.
    SixToFour(Ipv4Addr),
    /// `2001:0:SSSS:SSSS:flags:port:CCCC:CCCC` (RFC 4380 §4): server bits 32..64 and the client
    /// address obfuscated (every bit inverted) in bits 96..128.
    Teredo {
        /// The Teredo server the client registered with.
        server: Ipv4Addr,
        /// The client's public address, de-obfuscated.
        client: Ipv4Addr,
    },
}

impl Embedding {
    /// The IPv4 address that traffic to the IPv6 address is finally delivered to.
    pub(crate) const fn destination(self) -> Ipv4Addr {
        match self {
            Embedding::Mapped(a)
            | Embedding::Compatible(a)
            | Embedding::Nat64(a)
            | Embedding::Nat64LocalUse(a)
            | Embedding::SixToFour(a) => a,
            Embedding::Teredo { client, .. } => client,
        }
    }
}

/// The low 32 bits of a 128-bit address as an IPv4 address. The cast keeps exactly those bits.
const fn low32(bits: u128) -> Ipv4Addr {
    Ipv4Addr::from_bits(bits as u32)
}

/// Finds the IPv4 address embedded in `ip`, if it is one of the forms the policy unwraps.
pub(crate) const fn embedding(ip: Ipv6Addr) -> Option<Embedding> {
    let bits = ip.to_bits();
    let high96 = bits >> 32;
    if high96 == 0xffff {
        return Some(Embedding::Mapped(low32(bits)));
    }
    // `::` and `::1` are IPv6 addresses in their own right, not compatible forms of 0.0.0.0
    // and 0.0.0.1.
    if high96 == 0 && bits > 1 {
        return Some(Embedding::Compatible(low32(bits)));
    }
    if high96 == 0x0064_ff9b_0000_0000_0000_0000 {
        return Some(Embedding::Nat64(low32(bits)));
    }
    if bits >> 80 == 0x0064_ff9b_0001 {
        return Some(Embedding::Nat64LocalUse(low32(bits)));
    }
    if bits >> 112 == 0x2002 {
        return Some(Embedding::SixToFour(low32(bits >> 80)));
    }
    if bits >> 96 == 0x2001_0000 {
        return Some(Embedding::Teredo {
            server: low32(bits >> 64),
            client: low32(!bits),
        });
    }
    None
}

/// The address the policy reasons about: an IPv4 address embedded in an IPv6 form (mapped,
/// compatible, NAT64, 6to4, Teredo client) is unwrapped; anything else is returned unchanged.
/// `canonical(canonical(ip)) == canonical(ip)` for every address.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match embedding(v6) {
            Some(e) => IpAddr::V4(e.destination()),
            None => ip,
        },
    }
}

/// Classifies an address. An IPv6 form embedding a non-public IPv4 address takes that
/// address's class (`::ffff:127.0.0.1` is [`IpClass::Loopback`]).
pub fn classify(ip: IpAddr) -> IpClass {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

/// Classifies an IPv4 address.
pub fn classify_v4(ip: Ipv4Addr) -> IpClass {
    if is_metadata_v4(ip) {
        return IpClass::CloudMetadata;
    }
    let addr = IpAddr::V4(ip);
    for &(range, class) in V4_RANGES {
        if range.contains(addr) {
            return class;
        }
    }
    IpClass::Public
}

/// Classifies an IPv6 address, unwrapping embedded IPv4 forms first.
pub fn classify_v6(ip: Ipv6Addr) -> IpClass {
    // Fixed addresses of their own first, so that `::` and `::1` are not read as embeddings and
    // metadata addresses win over the unique-local range around them.
    match ip.to_bits() {
        0 => return IpClass::Unspecified,
        1 => return IpClass::Loopback,
        _ => {}
    }
    if METADATA_V6.contains(&ip) {
        return IpClass::CloudMetadata;
    }
    if let Some(e) = embedding(ip) {
        return classify_embedding(e);
    }
    let addr = IpAddr::V6(ip);
    for &(range, class) in V6_RANGES {
        if range.contains(addr) {
            return class;
        }
    }
    // Unreachable in practice: the table ends with `::/0`.
    IpClass::Reserved
}

/// The class of an IPv6 form carrying an IPv4 address: a non-public embedded address makes the
/// form non-public; otherwise the prefix decides.
fn classify_embedding(e: Embedding) -> IpClass {
    match e {
        // These deliver to the embedded address and add nothing of their own. RFC 6052 §3.1
        // forbids the well-known NAT64 prefix for non-global IPv4 addresses, so a non-public
        // one there is treated as the address it names.
        Embedding::Mapped(a) | Embedding::Nat64(a) | Embedding::SixToFour(a) => classify_v4(a),
        Embedding::Compatible(a) | Embedding::Nat64LocalUse(a) => {
            let inner = classify_v4(a);
            if !inner.is_public() {
                inner
            } else if matches!(e, Embedding::Compatible(_)) {
                IpClass::Reserved
            } else {
                IpClass::Nat64LocalUse
            }
        }
        // Both ends of a Teredo tunnel are contacted, so both must be public.
        Embedding::Teredo { server, client } => {
            let client_class = classify_v4(client);
            if client_class.is_public() {
                classify_v4(server)
            } else {
                client_class
            }
        }
    }
}

/// Whether the address is one of the [`METADATA_V4`] endpoints.
fn is_metadata_v4(ip: Ipv4Addr) -> bool {
    METADATA_V4.contains(&ip)
}

/// The Teredo server embedded in `ip`, which the deny list is also checked against.
pub(crate) fn teredo_server(ip: IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V6(v6) => match embedding(v6) {
            Some(Embedding::Teredo { server, .. }) => Some(server),
            _ => None,
        },
        IpAddr::V4(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn tables_are_ordered_most_specific_first() {
        // An entry placed after a wider entry that contains it would never be reached.
        for table in [V4_RANGES, V6_RANGES] {
            for (i, (later, _)) in table.iter().enumerate() {
                for (earlier, _) in &table[..i] {
                    let shadowed = match (*earlier, *later) {
                        (Cidr::V4 { len: el, .. }, Cidr::V4 { net, len }) => {
                            el <= len && earlier.contains(IpAddr::V4(Ipv4Addr::from(net)))
                        }
                        (Cidr::V6 { len: el, .. }, Cidr::V6 { net, len }) => {
                            el <= len && earlier.contains(IpAddr::V6(Ipv6Addr::from(net)))
                        }
                        _ => false,
                    };
                    assert!(!shadowed, "{later} is shadowed by {earlier}");
                }
            }
        }
    }

    #[test]
    fn embeddings_are_found() {
        let v4 = Ipv4Addr::new(192, 0, 2, 33);
        for (s, want) in [
            ("::ffff:192.0.2.33", Some(Embedding::Mapped(v4))),
            ("::192.0.2.33", Some(Embedding::Compatible(v4))),
            ("64:ff9b::192.0.2.33", Some(Embedding::Nat64(v4))),
            ("64:ff9b:1::192.0.2.33", Some(Embedding::Nat64LocalUse(v4))),
            (
                "64:ff9b:1:ab::192.0.2.33",
                Some(Embedding::Nat64LocalUse(v4)),
            ),
            ("2002:c000:0221::1", Some(Embedding::SixToFour(v4))),
            (
                "2002:c000:0221:ffff:ffff:ffff:ffff:ffff",
                Some(Embedding::SixToFour(v4)),
            ),
            // RFC 4380 §4's example: server 65.54.227.120, client 192.0.2.45.
            (
                "2001:0:4136:e378:8000:63bf:3fff:fdd2",
                Some(Embedding::Teredo {
                    server: Ipv4Addr::new(65, 54, 227, 120),
                    client: Ipv4Addr::new(192, 0, 2, 45),
                }),
            ),
            ("::", None),
            ("::1", None),
            ("::ffff:0:1.2.3.4", None),
            ("64:ff9b:2::1.2.3.4", None),
            ("2003::1", None),
            ("2001:1::1", None),
        ] {
            let IpAddr::V6(v6) = ip(s) else {
                panic!("{s} is not IPv6")
            };
            assert_eq!(embedding(v6), want, "{s}");
        }
    }

    #[test]
    fn canonical_unwraps_and_is_idempotent() {
        for (s, want) in [
            ("10.1.2.3", "10.1.2.3"),
            ("::ffff:10.1.2.3", "10.1.2.3"),
            ("::10.1.2.3", "10.1.2.3"),
            ("::2", "0.0.0.2"),
            ("::", "::"),
            ("::1", "::1"),
            ("64:ff9b::a01:203", "10.1.2.3"),
            ("64:ff9b:1::a01:203", "10.1.2.3"),
            ("2002:a01:203::", "10.1.2.3"),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "192.0.2.45"),
            ("2606:4700::1111", "2606:4700::1111"),
        ] {
            let c = canonical(ip(s));
            assert_eq!(c, ip(want), "{s}");
            assert_eq!(canonical(c), c, "{s}");
        }
    }

    #[test]
    fn every_class_has_a_distinct_name() {
        let mut names: Vec<&str> = IpClass::ALL.iter().map(|c| c.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), IpClass::ALL.len());
        assert_eq!(IpClass::Cgnat.to_string(), "cgnat");
        assert_eq!(IpClass::ALL.iter().filter(|c| c.is_public()).count(), 1);
    }

    #[test]
    fn mapped_form_classifies_like_its_ipv4_address() {
        // Spot-check every /8 edge: the mapped form must never disagree with the plain form.
        for first in 0..=255u8 {
            for rest in [[0, 0, 0], [255, 255, 255], [169, 254, 1], [0, 0, 9]] {
                let v4 = Ipv4Addr::new(first, rest[0], rest[1], rest[2]);
                assert_eq!(classify_v6(v4.to_ipv6_mapped()), classify_v4(v4), "{v4}");
                let nat64 = Ipv6Addr::from_bits(0x0064_ff9b_u128 << 96 | u128::from(v4.to_bits()));
                assert_eq!(classify_v6(nat64), classify_v4(v4), "{v4}");
            }
        }
    }
}
