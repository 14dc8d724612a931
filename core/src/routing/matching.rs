//! Rule matching (spec, Routing rule 2): a constraint configured on a rule must be supplied by
//! the request and must match; an omitted value does not satisfy it. The snapshot holds the
//! constraints as data; the decision is made here.

use crate::hints::{Ingress, RouteHints};
use crate::request::Host;
use crate::snapshot::Constraints;

/// Whether a request with these hints, arriving on `ingress` for destination `host`, satisfies
/// every constraint `c` configures.
pub fn matches(c: &Constraints, hints: &RouteHints, ingress: Ingress, host: &Host) -> bool {
    c.country().is_none_or(|want| hints.country == Some(want))
        && c.region()
            .is_none_or(|want| hints.region.as_deref() == Some(want))
        && c.ip_type()
            .is_none_or(|want| hints.ip_type.as_deref() == Some(want))
        && c.ingress().is_none_or(|want| want == ingress)
        && c.host().is_none_or(|pattern| pattern.matches_host(host))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hints::CountryCode;
    use crate::snapshot::{decode_snapshot, ValidatedSnapshot};

    #[test]
    fn constraint_matching_table() {
        let mut doc = r#"{"routing":{"rules":[{"id":"r","priority":1,"pools":["p"],
                "constraints":{"country":"US","region":"us-east","ip_type":"residential","ingress":"proxy","host":"*.example.com"}}]},
              "pools":[{"id":"p"}]}"#
            .as_bytes()
            .to_vec();
        let s = decode_snapshot(&mut doc).unwrap();
        let c = s.rules()[0].constraints();
        let full = RouteHints {
            country: CountryCode::parse("us"),
            region: Some("us-east".into()),
            ip_type: Some("residential".into()),
            ..Default::default()
        };
        let dom = |name: &str| Host::Domain(name.into());
        assert!(matches(c, &full, Ingress::Proxy, &dom("a.example.com")));
        let cases: Vec<(RouteHints, Ingress, &str)> = vec![
            (
                RouteHints {
                    country: None,
                    ..full.clone()
                },
                Ingress::Proxy,
                "a.example.com",
            ),
            (
                RouteHints {
                    country: CountryCode::parse("DE"),
                    ..full.clone()
                },
                Ingress::Proxy,
                "a.example.com",
            ),
            (
                RouteHints {
                    region: None,
                    ..full.clone()
                },
                Ingress::Proxy,
                "a.example.com",
            ),
            (
                RouteHints {
                    region: Some("US-EAST".into()),
                    ..full.clone()
                },
                Ingress::Proxy,
                "a.example.com",
            ),
            (
                RouteHints {
                    ip_type: None,
                    ..full.clone()
                },
                Ingress::Proxy,
                "a.example.com",
            ),
            (
                RouteHints {
                    ip_type: Some("datacenter".into()),
                    ..full.clone()
                },
                Ingress::Proxy,
                "a.example.com",
            ),
            (full.clone(), Ingress::Api, "a.example.com"),
            (full.clone(), Ingress::Connect, "a.example.com"),
            (full.clone(), Ingress::Proxy, "example.com"),
            (full.clone(), Ingress::Proxy, "a.example.org"),
            (full.clone(), Ingress::Proxy, ""),
        ];
        for (hints, ingress, host) in cases {
            assert!(
                !matches(c, &hints, ingress, &dom(host)),
                "{hints:?} {ingress:?} {host}"
            );
        }
        // A rule without constraints matches anything, hints or not.
        let d = ValidatedSnapshot::default_snapshot();
        let none = &d.rules()[0].constraints();
        assert!(matches(
            none,
            &RouteHints::default(),
            Ingress::Connect,
            &dom("")
        ));
        assert!(matches(none, &full, Ingress::Api, &dom("x")));
    }
}
