//! Fuzz target: ip_classify (seeded from fuzz/corpus/ip_classify).
//!
//! Input: one flag byte (bit 0 set: IPv4), the 4 or 16 address bytes, then up to eight CIDR
//! records of a flag byte (bit 0: deny instead of allow, bit 1: IPv4), 4 or 16 network bytes and
//! a prefix length byte. The target checks the invariants of classification, canonicalisation and
//! the policy order (deny wins, public passes, non-public needs an allow entry, metadata needs an
//! exact one).
#![no_main]
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use libfuzzer_sys::fuzz_target;
use sortie_core::destination::{
    canonical, classify, classify_v4, Cidr, Denied, DestinationPolicy, IpClass,
};

/// At most this many CIDRs are read, which is more than any snapshot under test needs.
const MAX_CIDRS: usize = 8;

fn take<'a>(data: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if data.len() < n {
        return None;
    }
    let (head, rest) = data.split_at(n);
    *data = rest;
    Some(head)
}

fn read_addr(data: &mut &[u8], is_v4: bool) -> Option<IpAddr> {
    if is_v4 {
        let b: [u8; 4] = take(data, 4)?.try_into().ok()?;
        Some(IpAddr::V4(Ipv4Addr::from(b)))
    } else {
        let b: [u8; 16] = take(data, 16)?.try_into().ok()?;
        Some(IpAddr::V6(Ipv6Addr::from(b)))
    }
}

fn is_exact_host(entry: &Cidr) -> bool {
    matches!(*entry, Cidr::V4 { len: 32, .. } | Cidr::V6 { len: 128, .. })
}

fuzz_target!(|input: &[u8]| {
    let mut data = input;
    let Some(flags) = take(&mut data, 1).and_then(|b| b.first().copied()) else {
        return;
    };
    let Some(ip) = read_addr(&mut data, flags & 1 == 1) else {
        return;
    };
    let mut policy = DestinationPolicy::default();
    while policy.allow.len() + policy.deny.len() < MAX_CIDRS {
        let Some(flag) = take(&mut data, 1).and_then(|b| b.first().copied()) else {
            break;
        };
        let Some(net) = read_addr(&mut data, flag & 2 == 2) else {
            break;
        };
        let Some(len) = take(&mut data, 1).and_then(|b| b.first().copied()) else {
            break;
        };
        let cidr = match net {
            IpAddr::V4(a) => {
                let [a, b, c, d] = a.octets();
                Cidr::v4(a, b, c, d, len % 33)
            }
            IpAddr::V6(a) => Cidr::v6(a.to_bits(), len % 129),
        };
        if flag & 1 == 1 {
            policy.deny.push(cidr);
        } else {
            policy.allow.push(cidr);
        }
    }

    // Canonicalisation is idempotent and only ever unwraps to IPv4.
    let canon = canonical(ip);
    assert_eq!(canonical(canon), canon);
    assert!(canon == ip || canon.is_ipv4());

    // An embedding of a non-public IPv4 address is non-public.
    let class = classify(ip);
    if canon != ip && !classify(canon).is_public() {
        assert!(!class.is_public(), "{ip} embeds non-public {canon}");
    }
    // The mapped form of an IPv4 address is the same address.
    if let IpAddr::V4(v4) = ip {
        assert_eq!(classify(IpAddr::V6(v4.to_ipv6_mapped())), classify_v4(v4));
    }
    assert!(!class.as_str().is_empty());

    // With no lists, exactly the public addresses pass.
    assert_eq!(
        DestinationPolicy::default().check(ip).is_ok(),
        class.is_public()
    );

    // Opening everything opens every class but metadata.
    let open = DestinationPolicy::new(vec![Cidr::v4(0, 0, 0, 0, 0), Cidr::v6(0, 0)], Vec::new());
    assert_eq!(open.check(ip).is_ok(), class != IpClass::CloudMetadata);

    // The policy order under the fuzzed lists.
    let deny_hit = policy
        .deny
        .iter()
        .any(|e| e.contains(ip) || e.contains(canon));
    let result = policy.check(ip);
    let _ = result.map_err(|d| d.to_string());
    match result {
        Ok(()) => {
            assert!(!deny_hit, "{ip} passed a deny entry");
            if !class.is_public() {
                let opened = policy.allow.iter().any(|e| {
                    (e.contains(ip) || e.contains(canon))
                        && (class != IpClass::CloudMetadata || is_exact_host(e))
                });
                assert!(opened, "{ip} ({class}) passed without an allow entry");
            }
        }
        Err(Denied::DenyListed { addr, entry }) => {
            assert_eq!(addr, ip);
            assert!(policy.deny.contains(&entry));
        }
        Err(Denied::NonPublic { addr, class: c }) => {
            assert!(
                !deny_hit,
                "{ip} hit a deny entry but was reported non-public"
            );
            assert_eq!(addr, ip);
            assert_eq!(c, class);
            assert!(!c.is_public());
        }
    }
});
