//! Destination policy: which resolved addresses the gateway may connect to.
//!
//! [`classify`] names the special-purpose range an address is in, [`canonical`] unwraps IPv4
//! addresses embedded in IPv6 forms, and [`DestinationPolicy`] applies the snapshot's allow and
//! deny lists on top of the deny-by-default rule for non-public addresses (decision 003).

mod cidr;
mod class;
mod policy;
mod ports;

pub use cidr::{Cidr, CidrError};
pub use class::{canonical, classify, classify_v4, classify_v6, IpClass, METADATA_V4, METADATA_V6};
pub use policy::{Denied, DestinationPolicy};
pub use ports::{DeniedPorts, DEFAULT_DENIED_DESTINATION_PORTS};

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    use IpClass::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn cidrs(list: &[&str]) -> Vec<Cidr> {
        list.iter()
            .map(|s| s.parse().unwrap_or_else(|e| panic!("{s}: {e:?}")))
            .collect()
    }

    /// Every special-purpose range with its first and last address and the neighbours just
    /// outside, plus embedded forms and well-known public addresses.
    const CLASS_MATRIX: &[(&str, IpClass)] = &[
        // 0.0.0.0/8 "this network"; 0.0.0.0 itself is the unspecified address.
        ("0.0.0.0", Unspecified),
        ("0.0.0.1", ThisNetwork),
        ("0.255.255.255", ThisNetwork),
        ("1.0.0.0", Public),
        ("1.1.1.1", Public),
        // 10.0.0.0/8.
        ("9.255.255.255", Public),
        ("10.0.0.0", Private),
        ("10.255.255.255", Private),
        ("11.0.0.0", Public),
        // 100.64.0.0/10, with Alibaba's metadata endpoint inside it.
        ("100.63.255.255", Public),
        ("100.64.0.0", Cgnat),
        ("100.127.255.255", Cgnat),
        ("100.128.0.0", Public),
        ("100.100.100.200", CloudMetadata),
        ("100.100.100.199", Cgnat),
        ("100.100.100.201", Cgnat),
        // 127.0.0.0/8.
        ("126.255.255.255", Public),
        ("127.0.0.0", Loopback),
        ("127.0.0.1", Loopback),
        ("127.255.255.255", Loopback),
        ("128.0.0.0", Public),
        // 169.254.0.0/16, with the metadata endpoints inside it.
        ("169.253.255.255", Public),
        ("169.254.0.0", LinkLocal),
        ("169.254.255.255", LinkLocal),
        ("169.255.0.0", Public),
        ("169.254.169.254", CloudMetadata),
        ("169.254.169.253", LinkLocal),
        ("169.254.169.255", LinkLocal),
        ("169.254.170.2", CloudMetadata),
        ("169.254.170.23", CloudMetadata),
        ("169.254.170.3", LinkLocal),
        // 172.16.0.0/12.
        ("172.15.255.255", Public),
        ("172.16.0.0", Private),
        ("172.31.255.255", Private),
        ("172.32.0.0", Public),
        // 192.0.0.0/24 with its globally reachable anycast addresses and Oracle's metadata.
        ("191.255.255.255", Public),
        ("192.0.0.0", IetfProtocol),
        ("192.0.0.8", IetfProtocol),
        ("192.0.0.9", Public),
        ("192.0.0.10", Public),
        ("192.0.0.11", IetfProtocol),
        ("192.0.0.170", IetfProtocol),
        ("192.0.0.192", CloudMetadata),
        ("192.0.0.255", IetfProtocol),
        ("192.0.1.0", Public),
        // 192.0.2.0/24 TEST-NET-1.
        ("192.0.2.0", Documentation),
        ("192.0.2.255", Documentation),
        ("192.0.3.0", Public),
        // AS112 and AMT ranges IANA marks globally reachable.
        ("192.31.196.1", Public),
        ("192.52.193.1", Public),
        ("192.175.48.1", Public),
        // 192.88.99.0/24 deprecated 6to4 relay anycast.
        ("192.88.98.255", Public),
        ("192.88.99.0", Relay6to4),
        ("192.88.99.255", Relay6to4),
        ("192.88.100.0", Public),
        // 192.168.0.0/16.
        ("192.167.255.255", Public),
        ("192.168.0.0", Private),
        ("192.168.255.255", Private),
        ("192.169.0.0", Public),
        // 198.18.0.0/15.
        ("198.17.255.255", Public),
        ("198.18.0.0", Benchmarking),
        ("198.19.255.255", Benchmarking),
        ("198.20.0.0", Public),
        // 198.51.100.0/24 TEST-NET-2.
        ("198.51.99.255", Public),
        ("198.51.100.0", Documentation),
        ("198.51.100.255", Documentation),
        ("198.51.101.0", Public),
        // 203.0.113.0/24 TEST-NET-3.
        ("203.0.112.255", Public),
        ("203.0.113.0", Documentation),
        ("203.0.113.255", Documentation),
        ("203.0.114.0", Public),
        // 224.0.0.0/4 and 240.0.0.0/4, with limited broadcast at the very top.
        ("223.255.255.255", Public),
        ("224.0.0.0", Multicast),
        ("239.255.255.255", Multicast),
        ("240.0.0.0", Reserved),
        ("255.255.255.254", Reserved),
        ("255.255.255.255", Broadcast),
        // Public IPv4, including Azure's WireServer, which is public space but a metadata service.
        ("8.8.8.8", Public),
        ("9.9.9.9", Public),
        ("168.63.129.15", Public),
        ("168.63.129.16", CloudMetadata),
        ("168.63.129.17", Public),
        ("223.5.5.5", Public),
        // IPv6 fixed addresses.
        ("::", Unspecified),
        ("::1", Loopback),
        // ::ffff:0:0/96 IPv4-mapped: the class of the IPv4 address.
        ("::ffff:0.0.0.0", Unspecified),
        ("::ffff:127.0.0.1", Loopback),
        ("::ffff:10.0.0.1", Private),
        ("::ffff:169.254.169.254", CloudMetadata),
        ("::ffff:8.8.8.8", Public),
        ("::ffff:255.255.255.255", Broadcast),
        // ::/96 IPv4-compatible (deprecated): reserved even for a public IPv4 address.
        ("::2", ThisNetwork),
        ("::127.0.0.1", Loopback),
        ("::10.0.0.1", Private),
        ("::169.254.169.254", CloudMetadata),
        ("::8.8.8.8", Reserved),
        ("::1:0:0", Reserved),
        ("::fffe:ffff:ffff", Reserved),
        ("::1:0:0:0", Reserved),
        // SIIT's IPv4-translated form ::ffff:0:0:0/96 is not unwrapped; it is reserved space.
        ("::ffff:0:8.8.8.8", Reserved),
        // 64:ff9b::/96 well-known NAT64 prefix.
        ("64:ff9b::8.8.8.8", Public),
        ("64:ff9b::127.0.0.1", Loopback),
        ("64:ff9b::192.168.1.1", Private),
        ("64:ff9b::169.254.169.254", CloudMetadata),
        ("64:ff9b::1:0:0", Reserved),
        ("64:ff9a:ffff:ffff:ffff:ffff:ffff:ffff", Reserved),
        // 64:ff9b:1::/48 local-use NAT64 prefix: never public.
        ("64:ff9b:1::8.8.8.8", Nat64LocalUse),
        ("64:ff9b:1:ffff:ffff:ffff:808:808", Nat64LocalUse),
        ("64:ff9b:1::10.0.0.1", Private),
        ("64:ff9b:1::100.100.100.200", CloudMetadata),
        ("64:ff9b:2::8.8.8.8", Reserved),
        // 100::/64 discard-only (the /64 after it is RFC 9780's dummy prefix, reserved too).
        ("100::", DiscardOnly),
        ("100::ffff:ffff:ffff:ffff", DiscardOnly),
        ("100:0:0:1::", Reserved),
        // 2001::/32 Teredo: the client (inverted low 32 bits) and the server must both be public.
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", Documentation),
        ("2001:0:808:808::f7f7:f7f7", Public),
        ("2001:0:808:808::80ff:fffe", Loopback),
        ("2001:0:808:808::f5ff:fffe", Private),
        ("2001:0:a00:1::f7f7:f7f7", Private),
        ("2001:0:808:808::5601:5601", CloudMetadata),
        // 2001::/23 IETF protocol assignments and the ranges carved out of it.
        ("2001:1::", IetfProtocol),
        ("2001:1::1", Public),
        ("2001:1::2", Public),
        ("2001:1::3", Public),
        ("2001:1::4", IetfProtocol),
        ("2001:2::", Benchmarking),
        ("2001:2:0:ffff:ffff:ffff:ffff:ffff", Benchmarking),
        ("2001:2:1::", IetfProtocol),
        ("2001:3::1", Public),
        ("2001:4:112::1", Public),
        ("2001:4:113::1", IetfProtocol),
        ("2001:f:ffff:ffff:ffff:ffff:ffff:ffff", IetfProtocol),
        ("2001:10::", Orchid),
        ("2001:1f:ffff:ffff:ffff:ffff:ffff:ffff", Orchid),
        ("2001:20::", Orchid),
        ("2001:2f:ffff:ffff:ffff:ffff:ffff:ffff", Orchid),
        ("2001:30::1", Public),
        ("2001:3f:ffff:ffff:ffff:ffff:ffff:ffff", Public),
        ("2001:40::", IetfProtocol),
        ("2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff", IetfProtocol),
        ("2001:200::", Public),
        // 2001:db8::/32 documentation.
        ("2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", Public),
        ("2001:db8::", Documentation),
        ("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", Documentation),
        ("2001:db9::", Public),
        // 2002::/16 6to4: the class of the embedded IPv4 address.
        ("2002:808:808::1", Public),
        ("2002:7f00:1::", Loopback),
        ("2002:a00:1::", Private),
        ("2002:a9fe:a9fe::", CloudMetadata),
        ("2002:c0a8:101:ffff:ffff:ffff:ffff:ffff", Private),
        ("2001:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Public),
        ("2003::", Public),
        // Global unicast 2000::/3 and its edges.
        ("1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Reserved),
        ("2000::", Public),
        ("2606:4700::1111", Public),
        ("2620:4f:8000::1", Public),
        ("2a00:1450:4001::1", Public),
        ("3ffe:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Public),
        // 3fff::/20 documentation (RFC 9637).
        ("3fff::", Documentation),
        ("3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff", Documentation),
        ("3fff:1000::", Public),
        ("4000::", Reserved),
        // 5f00::/16 segment routing SIDs.
        ("5eff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Reserved),
        ("5f00::", SegmentRouting),
        ("5f00:ffff:ffff:ffff:ffff:ffff:ffff:ffff", SegmentRouting),
        ("5f01::", Reserved),
        // fc00::/7 unique local, with AWS metadata inside it.
        ("fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Reserved),
        ("fc00::", UniqueLocal),
        ("fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", UniqueLocal),
        ("fd00:ec2::254", CloudMetadata),
        ("fd00:ec2::23", CloudMetadata),
        ("fd00:ec2::253", UniqueLocal),
        ("fe00::", Reserved),
        // fe80::/10 link-local and fec0::/10 site-local.
        ("fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Reserved),
        ("fe80::", LinkLocal),
        ("fe80::1", LinkLocal),
        ("febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", LinkLocal),
        ("fec0::", SiteLocal),
        ("feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", SiteLocal),
        // ff00::/8 multicast.
        ("ff00::", Multicast),
        ("ff02::1", Multicast),
        ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Multicast),
    ];

    #[test]
    fn class_matrix() {
        for &(s, want) in CLASS_MATRIX {
            assert_eq!(classify(ip(s)), want, "{s}");
        }
    }

    #[test]
    fn every_class_appears_in_the_matrix() {
        for class in IpClass::ALL {
            assert!(
                CLASS_MATRIX.iter().any(|&(_, c)| c == *class),
                "{class} is not covered"
            );
        }
    }

    /// A small deterministic generator, so the sweep below needs no extra dependency.
    fn xorshift(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn agrees_with_std_predicates() {
        // Whatever the standard library calls special must never classify as public.
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for i in 0..200_000u64 {
            let r = xorshift(&mut seed);
            let v4 = std::net::Ipv4Addr::from_bits(if i < 65_536 {
                // Walk the first and last address of every /16 as well as random ones.
                ((i as u32) << 16) | if i % 2 == 0 { 0 } else { 0xffff }
            } else {
                r as u32
            });
            let special = v4.is_private()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation()
                || v4.is_unspecified();
            if special {
                assert!(!classify_v4(v4).is_public(), "{v4}");
            }
            let hi = u128::from(xorshift(&mut seed));
            let v6 = std::net::Ipv6Addr::from_bits(hi << 64 | u128::from(r));
            let special = v6.is_loopback()
                || v6.is_multicast()
                || v6.is_unspecified()
                || v6.is_unique_local()
                || v6.is_unicast_link_local();
            if special {
                assert!(!classify_v6(v6).is_public(), "{v6}");
            }
            // An embedding never makes a non-public IPv4 address public.
            if !classify_v4(v4).is_public() {
                let bits = u128::from(v4.to_bits());
                for form in [
                    0xffff_u128 << 32 | bits,
                    bits,
                    0x0064_ff9b_u128 << 96 | bits,
                    0x0064_ff9b_0001_u128 << 80 | (r as u128) << 32 | bits,
                    0x2002_u128 << 112 | bits << 80 | u128::from(r),
                    0x2001_0000_u128 << 96 | (r as u128) << 32 | (!bits & 0xffff_ffff),
                    0x2001_0000_u128 << 96 | bits << 64 | u128::from(r as u32),
                ] {
                    let v6 = std::net::Ipv6Addr::from_bits(form);
                    assert!(!classify_v6(v6).is_public(), "{v6} embeds {v4}");
                }
            }
        }
    }

    #[test]
    fn metadata_lists_classify_as_metadata() {
        for a in METADATA_V4 {
            assert_eq!(classify_v4(*a), CloudMetadata, "{a}");
            assert_eq!(
                classify(IpAddr::V6(a.to_ipv6_mapped())),
                CloudMetadata,
                "{a}"
            );
        }
        for a in METADATA_V6 {
            assert_eq!(classify_v6(*a), CloudMetadata, "{a}");
        }
    }

    #[test]
    fn default_policy_allows_exactly_the_public_addresses() {
        let policy = DestinationPolicy::default();
        for &(s, class) in CLASS_MATRIX {
            let got = policy.check(ip(s));
            if class.is_public() {
                assert_eq!(got, Ok(()), "{s}");
            } else {
                assert_eq!(got, Err(Denied::NonPublic { addr: ip(s), class }), "{s}");
            }
        }
    }

    #[test]
    fn policy_matrix() {
        // (allow, deny, address, expected outcome: None = allowed, Some(reason) = denied).
        type Row = (
            &'static [&'static str],
            &'static [&'static str],
            &'static str,
            Option<&'static str>,
        );
        let table: &[Row] = &[
            // Public addresses pass unless denied.
            (&[], &[], "8.8.8.8", None),
            (&[], &[], "1.1.1.1", None),
            (&[], &[], "2606:4700::1111", None),
            (&[], &["8.8.8.0/24"], "8.8.8.8", Some("deny_list")),
            (&[], &["8.8.8.0/24"], "8.8.9.8", None),
            (
                &[],
                &["2606:4700::/32"],
                "2606:4700::1111",
                Some("deny_list"),
            ),
            // The snapshot's loopback allowance opens loopback in every form.
            (&["127.0.0.0/8", "::1/128"], &[], "127.0.0.1", None),
            (&["127.0.0.0/8", "::1/128"], &[], "127.255.255.254", None),
            (&["127.0.0.0/8", "::1/128"], &[], "::1", None),
            (&["127.0.0.0/8", "::1/128"], &[], "::ffff:127.0.0.1", None),
            (&["127.0.0.0/8", "::1/128"], &[], "64:ff9b::7f00:1", None),
            (&["127.0.0.0/8", "::1/128"], &[], "2002:7f00:1::", None),
            // ... and nothing else.
            (
                &["127.0.0.0/8", "::1/128"],
                &[],
                "10.0.0.1",
                Some("private"),
            ),
            (
                &["127.0.0.0/8", "::1/128"],
                &[],
                "::2",
                Some("this_network"),
            ),
            (
                &["127.0.0.0/8", "::1/128"],
                &[],
                "0.0.0.0",
                Some("unspecified"),
            ),
            (&["127.0.0.0/8", "::1/128"], &[], "::", Some("unspecified")),
            (
                &["127.0.0.0/8", "::1/128"],
                &[],
                "fe80::1",
                Some("link_local"),
            ),
            (&["::1/128"], &[], "127.0.0.1", Some("loopback")),
            (&["127.0.0.0/8"], &[], "::1", Some("loopback")),
            // Deny overrides allow, on the raw and the canonical address.
            (
                &["127.0.0.0/8"],
                &["127.0.0.2/32"],
                "127.0.0.2",
                Some("deny_list"),
            ),
            (
                &["127.0.0.0/8"],
                &["127.0.0.2/32"],
                "::ffff:127.0.0.2",
                Some("deny_list"),
            ),
            (&["127.0.0.0/8"], &["127.0.0.2/32"], "127.0.0.3", None),
            (
                &["10.0.0.0/8"],
                &["10.0.0.0/8"],
                "10.1.1.1",
                Some("deny_list"),
            ),
            (
                &["::/0", "0.0.0.0/0"],
                &["::ffff:0:0/96"],
                "::ffff:8.8.8.8",
                Some("deny_list"),
            ),
            (&[], &["203.0.113.0/24"], "203.0.113.7", Some("deny_list")),
            (&[], &["8.8.8.8/32"], "::ffff:8.8.8.8", Some("deny_list")),
            (&[], &["8.8.8.8/32"], "64:ff9b::808:808", Some("deny_list")),
            (&[], &["8.8.8.8/32"], "2002:808:808::1", Some("deny_list")),
            (
                &[],
                &["8.8.8.8/32"],
                "2001:0:909:909::f7f7:f7f7",
                Some("deny_list"),
            ),
            // A Teredo server on the deny list stops the tunnel too.
            (
                &[],
                &["9.9.9.9/32"],
                "2001:0:909:909::f7f7:f7f7",
                Some("deny_list"),
            ),
            (&[], &[], "2001:0:909:909::f7f7:f7f7", None),
            // Allow entries open the range they name, in any embedded form.
            (&["10.0.0.0/8"], &[], "10.0.0.1", None),
            (&["10.0.0.0/8"], &[], "::ffff:10.0.0.1", None),
            (&["10.0.0.0/8"], &[], "2002:a00:1::", None),
            (&["10.0.0.0/8"], &[], "172.16.0.1", Some("private")),
            (&["fc00::/7"], &[], "fd12:3456::1", None),
            (&["fc00::/7"], &[], "fe80::1", Some("link_local")),
            (&["100.64.0.0/10"], &[], "100.64.0.1", None),
            (&["64:ff9b:1::/48"], &[], "64:ff9b:1::808:808", None),
            (&[], &[], "64:ff9b:1::808:808", Some("nat64_local_use")),
            (&["2002::/16"], &[], "2002:a00:1::", None),
            // Metadata endpoints need an exact allow entry, even inside an opened range.
            (&["169.254.0.0/16"], &[], "169.254.1.1", None),
            (
                &["169.254.0.0/16"],
                &[],
                "169.254.169.254",
                Some("cloud_metadata"),
            ),
            (
                &["0.0.0.0/0", "::/0"],
                &[],
                "169.254.169.254",
                Some("cloud_metadata"),
            ),
            (
                &["0.0.0.0/0", "::/0"],
                &[],
                "::ffff:169.254.169.254",
                Some("cloud_metadata"),
            ),
            (
                &["0.0.0.0/0", "::/0"],
                &[],
                "2002:a9fe:a9fe::",
                Some("cloud_metadata"),
            ),
            (
                &["0.0.0.0/0", "::/0"],
                &[],
                "fd00:ec2::254",
                Some("cloud_metadata"),
            ),
            (
                &["0.0.0.0/0", "::/0"],
                &[],
                "100.100.100.200",
                Some("cloud_metadata"),
            ),
            (
                &["0.0.0.0/0", "::/0"],
                &[],
                "192.0.0.192",
                Some("cloud_metadata"),
            ),
            (
                &["0.0.0.0/0", "::/0"],
                &[],
                "169.254.170.2",
                Some("cloud_metadata"),
            ),
            (
                &["0.0.0.0/0", "::/0"],
                &[],
                "168.63.129.16",
                Some("cloud_metadata"),
            ),
            (&["fc00::/7"], &[], "fd00:ec2::254", Some("cloud_metadata")),
            (
                &["fd00:ec2::254/127"],
                &[],
                "fd00:ec2::254",
                Some("cloud_metadata"),
            ),
            (&["169.254.169.254/32"], &[], "169.254.169.254", None),
            (&["169.254.169.254/32"], &[], "::ffff:169.254.169.254", None),
            (
                &["169.254.169.254/32"],
                &[],
                "169.254.170.2",
                Some("cloud_metadata"),
            ),
            (
                &["::ffff:169.254.169.254/128"],
                &[],
                "::ffff:169.254.169.254",
                None,
            ),
            (&["fd00:ec2::254/128"], &[], "fd00:ec2::254", None),
            (&["100.100.100.200/32"], &[], "100.100.100.200", None),
            (
                &["169.254.169.254/32"],
                &["169.254.169.254/32"],
                "169.254.169.254",
                Some("deny_list"),
            ),
            // Opening everything opens every non-metadata class.
            (&["0.0.0.0/0", "::/0"], &[], "10.0.0.1", None),
            (&["0.0.0.0/0", "::/0"], &[], "255.255.255.255", None),
            (&["0.0.0.0/0", "::/0"], &[], "ff02::1", None),
            // Families do not cross: an IPv4 allow entry does not open native IPv6 space.
            (&["0.0.0.0/0"], &[], "fe80::1", Some("link_local")),
            (&["::/0"], &[], "10.0.0.1", Some("private")),
        ];
        for &(allow, deny, addr, want) in table {
            let policy = DestinationPolicy::new(cidrs(allow), cidrs(deny));
            let got = policy.check(ip(addr));
            assert_eq!(
                got.err().map(|d| d.reason()),
                want,
                "allow={allow:?} deny={deny:?} addr={addr}"
            );
            assert_eq!(policy.allows(ip(addr)), want.is_none());
        }
    }

    #[test]
    fn denial_names_the_entry_and_reads_well() {
        let policy = DestinationPolicy::new(vec![], cidrs(&["203.0.113.0/24", "8.8.8.0/24"]));
        let d = policy.check(ip("8.8.8.8")).unwrap_err();
        assert_eq!(
            d,
            Denied::DenyListed {
                addr: ip("8.8.8.8"),
                entry: cidrs(&["8.8.8.0/24"])[0]
            }
        );
        assert_eq!(d.addr(), ip("8.8.8.8"));
        assert_eq!(
            d.to_string(),
            "destination 8.8.8.8 is in deny range 8.8.8.0/24"
        );
        let d = policy.check(ip("::ffff:10.0.0.1")).unwrap_err();
        assert_eq!(
            d.to_string(),
            "destination ::ffff:10.0.0.1 is not public (private) and no allow entry opens it"
        );
    }

    #[test]
    fn api_error_hides_the_address() {
        let d = DestinationPolicy::default()
            .check(ip("10.9.8.7"))
            .unwrap_err();
        let e = crate::error::ApiError::from(d);
        assert_eq!(e.code, crate::error::ErrorCode::DestinationDenied);
        assert_eq!(e.http_status(), 403);
        assert!(!e.message.contains("10.9.8.7"));
        assert_eq!(
            e.details,
            vec![("reason".to_string(), "private".to_string())]
        );
    }
}
