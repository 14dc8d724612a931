//! Semantic validation of a decoded snapshot into a [`ValidatedSnapshot`]. Every error names
//! the JSON path of the offending value, indexed as in the submitted document.

use std::collections::{HashMap, HashSet};
use std::fmt::Display;

use super::wire::{WireConstraints, WireDestinations, WirePool, WireRule, WireSnapshot};
use super::{
    parse_env_name, ConfigId, Constraints, Destinations, HostPattern, Pool, ProxyAddr,
    ProxyResolve, ProxyScheme, Rule, Secret, SnapshotError, UpstreamProxy, UsernameTemplate,
    ValidatedSnapshot, DEFAULT_ALLOWS_STICKY_FALLBACK, MAX_DEFAULT_TIMEOUT_MS,
    MAX_DESTINATION_ENTRIES, MAX_POOLS, MAX_POOLS_PER_RULE, MAX_PRIORITY, MAX_PROXY_ENDPOINTS,
    MAX_RULES, MAX_STICKY_TTL_SECONDS, MIN_DEFAULT_TIMEOUT_MS,
};
use crate::destination::Cidr;
use crate::hints::{CountryCode, Ingress};
use crate::limits;

/// Bytes of a submitted value quoted in an error message; the rest is cut so that a hostile
/// value cannot make the message large.
const MAX_QUOTED_BYTES: usize = 64;

fn invalid(path: impl Into<String>, message: impl Display) -> SnapshotError {
    SnapshotError::Invalid {
        path: path.into(),
        message: message.to_string(),
    }
}

/// A submitted string for an error message: cut, then escaped by `Debug`.
fn quoted(s: &str) -> String {
    let mut cut = s.len().min(MAX_QUOTED_BYTES);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    match s.get(..cut) {
        Some(head) if cut < s.len() => format!("{head:?}…"),
        _ => format!("{s:?}"),
    }
}

fn id_at(path: &str, s: &str) -> Result<ConfigId, SnapshotError> {
    ConfigId::parse(s).map_err(|e| invalid(path, format_args!("identifier {}: {e}", quoted(s))))
}

/// Checks an integer against an inclusive range, naming the range in the error.
fn in_range(path: &str, v: i64, min: u64, max: u64) -> Result<u64, SnapshotError> {
    match u64::try_from(v) {
        Ok(u) if (min..=max).contains(&u) => Ok(u),
        _ => Err(invalid(
            path,
            format_args!("{v} is out of range {min}..={max}"),
        )),
    }
}

pub(crate) fn validate(w: WireSnapshot) -> Result<ValidatedSnapshot, SnapshotError> {
    let default_timeout_ms = match w.default_timeout_ms {
        // Spec, Admin resources: 60 seconds when no snapshot value is set.
        None => limits::DEFAULT_TIMEOUT_MS,
        Some(v) => in_range(
            "default_timeout_ms",
            v,
            MIN_DEFAULT_TIMEOUT_MS,
            MAX_DEFAULT_TIMEOUT_MS,
        )?,
    };
    let (pools, pool_index) = validate_pools(w.pools)?;
    let mut rules = validate_rules(w.routing.rules, &pool_index)?;
    // Decision 017: rules are evaluated in ascending priority; equal priorities by rule id.
    rules.sort_by(|a, b| (a.priority, &a.id).cmp(&(b.priority, &b.id)));
    let destinations = validate_destinations(w.destinations.unwrap_or_default())?;
    Ok(ValidatedSnapshot {
        default_timeout_ms,
        rules,
        pools,
        destinations,
    })
}

fn validate_pools(
    wire: Vec<WirePool>,
) -> Result<(Vec<Pool>, HashMap<ConfigId, usize>), SnapshotError> {
    if wire.len() > MAX_POOLS {
        return Err(invalid(
            "pools",
            format_args!("at most {MAX_POOLS} pools are allowed"),
        ));
    }
    let mut index = HashMap::with_capacity(wire.len());
    let mut pools = Vec::with_capacity(wire.len());
    for (i, p) in wire.into_iter().enumerate() {
        let id_path = format!("pools[{i}].id");
        let id = id_at(&id_path, &p.id)?;
        if index.insert(id.clone(), i).is_some() {
            return Err(invalid(id_path, format_args!("duplicate pool id \"{id}\"")));
        }
        let upstream_proxy = match p.upstream_proxy {
            None => None,
            Some(u) => {
                let at = |field: &str| format!("pools[{i}].upstream_proxy.{field}");
                let proxy_id = id_at(&at("id"), &u.id)?;
                let endpoints = validate_endpoints(&at, u.url, u.urls)?;
                let username_template = u
                    .username_template
                    .map(|t| UsernameTemplate::parse(&t))
                    .transpose()
                    .map_err(|e| invalid(at("username_template"), e))?;
                let password = u
                    .password
                    .map(|s| Secret::parse_password(&s))
                    .transpose()
                    .map_err(|e| invalid(at("password"), e))?;
                let password_env = u
                    .password_env
                    .map(|s| parse_env_name(&s))
                    .transpose()
                    .map_err(|e| invalid(at("password_env"), e))?;
                if password.is_some() && password_env.is_some() {
                    return Err(invalid(
                        at("password_env"),
                        "password and password_env are alternatives; give at most one",
                    ));
                }
                let resolve = match u.resolve {
                    None => None,
                    Some(r) => Some(ProxyResolve::parse(&r).ok_or_else(|| {
                        invalid(
                            at("resolve"),
                            format_args!("{}: must be \"gateway\" or \"proxy\"", quoted(&r)),
                        )
                    })?),
                };
                let has_socks5h = endpoints.iter().any(|e| e.scheme() == ProxyScheme::Socks5h);
                if has_socks5h && resolve == Some(ProxyResolve::Gateway) {
                    // Decision 070: socks5h means the proxy resolves names; asking the gateway
                    // to resolve them as well is a contradiction, not a preference.
                    return Err(invalid(
                        at("resolve"),
                        "\"gateway\" contradicts a socks5h:// endpoint, whose proxy resolves names",
                    ));
                }
                Some(UpstreamProxy {
                    id: proxy_id,
                    endpoints,
                    username_template,
                    password,
                    password_env,
                    resolve,
                })
            }
        };
        pools.push(Pool { id, upstream_proxy });
    }
    Ok((pools, index))
}

/// `url` (one endpoint) or `urls` (1..=64 distinct endpoints), exactly one of them.
fn validate_endpoints(
    at: &dyn Fn(&str) -> String,
    url: Option<String>,
    urls: Option<Vec<String>>,
) -> Result<Vec<ProxyAddr>, SnapshotError> {
    let parse = |path: String, s: &str| {
        ProxyAddr::parse_url(s).map_err(|e| invalid(path, format_args!("{}: {e}", quoted(s))))
    };
    match (url, urls) {
        (Some(url), None) => Ok(vec![parse(at("url"), &url)?]),
        (None, Some(urls)) => {
            if urls.is_empty() || urls.len() > MAX_PROXY_ENDPOINTS {
                return Err(invalid(
                    at("urls"),
                    format_args!("must list 1..={MAX_PROXY_ENDPOINTS} endpoints"),
                ));
            }
            let mut out: Vec<ProxyAddr> = Vec::with_capacity(urls.len());
            for (j, s) in urls.iter().enumerate() {
                let addr = parse(at(&format!("urls[{j}]")), s)?;
                if out.contains(&addr) {
                    return Err(invalid(
                        at(&format!("urls[{j}]")),
                        format_args!("duplicate endpoint {}", quoted(s)),
                    ));
                }
                out.push(addr);
            }
            Ok(out)
        }
        (Some(_), Some(_)) => Err(invalid(
            at("urls"),
            "url and urls are alternatives; give exactly one",
        )),
        (None, None) => Err(invalid(at("url"), "url or urls is required")),
    }
}

fn validate_rules(
    wire: Vec<WireRule>,
    pool_index: &HashMap<ConfigId, usize>,
) -> Result<Vec<Rule>, SnapshotError> {
    if wire.len() > MAX_RULES {
        return Err(invalid(
            "routing.rules",
            format_args!("at most {MAX_RULES} rules are allowed"),
        ));
    }
    let mut seen = HashSet::with_capacity(wire.len());
    let mut rules = Vec::with_capacity(wire.len());
    for (i, r) in wire.into_iter().enumerate() {
        let at = |field: &str| format!("routing.rules[{i}].{field}");
        let id = id_at(&at("id"), &r.id)?;
        if !seen.insert(id.clone()) {
            return Err(invalid(
                at("id"),
                format_args!("duplicate rule id \"{id}\""),
            ));
        }
        let priority = in_range(&at("priority"), r.priority, 0, u64::from(MAX_PRIORITY))?;
        let constraints = validate_constraints(i, r.constraints.unwrap_or_default())?;
        if r.pools.is_empty() {
            return Err(invalid(at("pools"), "a rule must list at least one pool"));
        }
        if r.pools.len() > MAX_POOLS_PER_RULE {
            return Err(invalid(
                at("pools"),
                format_args!("a rule may list at most {MAX_POOLS_PER_RULE} pools"),
            ));
        }
        let mut pools = Vec::with_capacity(r.pools.len());
        for (j, name) in r.pools.iter().enumerate() {
            let path = format!("routing.rules[{i}].pools[{j}]");
            let Some(&p) = pool_index.get(name.as_str()) else {
                return Err(invalid(path, format_args!("unknown pool {}", quoted(name))));
            };
            if pools.contains(&p) {
                return Err(invalid(
                    path,
                    format_args!("pool {} is listed twice", quoted(name)),
                ));
            }
            pools.push(p);
        }
        let ttl = match r.sticky_session_ttl_seconds {
            None => 0,
            Some(v) => in_range(
                &at("sticky_session_ttl_seconds"),
                v,
                0,
                u64::from(MAX_STICKY_TTL_SECONDS),
            )?,
        };
        rules.push(Rule {
            id,
            // Both were range-checked against u32 bounds above.
            priority: u32::try_from(priority).unwrap_or(MAX_PRIORITY),
            constraints,
            pools,
            sticky_session_ttl_seconds: u32::try_from(ttl).unwrap_or(MAX_STICKY_TTL_SECONDS),
            allows_sticky_fallback: r
                .allow_sticky_fallback
                .unwrap_or(DEFAULT_ALLOWS_STICKY_FALLBACK),
        });
    }
    Ok(rules)
}

/// A region or IP type value: the request-side limits of the spec (non-empty, at most 128
/// bytes), and no control characters, which no proxy header could carry.
fn claim_value(path: String, s: String) -> Result<Box<str>, SnapshotError> {
    if s.is_empty() {
        return Err(invalid(path, "must not be empty"));
    }
    if s.len() > limits::MAX_ROUTING_FIELD_BYTES {
        return Err(invalid(
            path,
            format_args!("must be at most {} bytes", limits::MAX_ROUTING_FIELD_BYTES),
        ));
    }
    if s.chars().any(char::is_control) {
        return Err(invalid(path, "must not contain control characters"));
    }
    Ok(s.into_boxed_str())
}

fn validate_constraints(i: usize, c: WireConstraints) -> Result<Constraints, SnapshotError> {
    let at = |field: &str| format!("routing.rules[{i}].constraints.{field}");
    let country = match c.country {
        None => None,
        Some(s) => Some(CountryCode::parse(&s).ok_or_else(|| {
            invalid(
                at("country"),
                format_args!("{} is not an assigned ISO 3166-1 alpha-2 code", quoted(&s)),
            )
        })?),
    };
    let region = c.region.map(|s| claim_value(at("region"), s)).transpose()?;
    let ip_type = c
        .ip_type
        .map(|s| claim_value(at("ip_type"), s))
        .transpose()?;
    let ingress = match c.ingress {
        None => None,
        Some(s) => Some(Ingress::from_wire(&s).ok_or_else(|| {
            invalid(
                at("ingress"),
                format_args!(
                    "{} is not one of \"api\", \"proxy\", \"connect\"",
                    quoted(&s)
                ),
            )
        })?),
    };
    let host = match c.host {
        None => None,
        Some(s) => Some(
            HostPattern::parse(&s)
                .map_err(|e| invalid(at("host"), format_args!("{}: {e}", quoted(&s))))?,
        ),
    };
    Ok(Constraints {
        country,
        region,
        ip_type,
        ingress,
        host,
    })
}

fn cidr_list(field: &str, wire: Vec<String>) -> Result<Vec<Cidr>, SnapshotError> {
    if wire.len() > MAX_DESTINATION_ENTRIES {
        return Err(invalid(
            format!("destinations.{field}"),
            format_args!("at most {MAX_DESTINATION_ENTRIES} entries are allowed"),
        ));
    }
    let mut out: Vec<Cidr> = Vec::with_capacity(wire.len());
    for (i, s) in wire.iter().enumerate() {
        let path = format!("destinations.{field}[{i}]");
        let c: Cidr = s
            .parse()
            .map_err(|e| invalid(&path, format_args!("{}: {e}", quoted(s))))?;
        if out.contains(&c) {
            return Err(invalid(path, format_args!("{c} is listed twice")));
        }
        out.push(c);
    }
    Ok(out)
}

fn validate_destinations(d: WireDestinations) -> Result<Destinations, SnapshotError> {
    Ok(Destinations {
        allow: cidr_list("allow", d.allow)?,
        deny: cidr_list("deny", d.deny)?,
    })
}

#[cfg(test)]
mod tests {
    use super::super::decode_snapshot;
    use super::*;

    fn check(doc: &str) -> Result<ValidatedSnapshot, SnapshotError> {
        let mut buf = doc.as_bytes().to_vec();
        decode_snapshot(&mut buf)
    }

    fn with_rule(rule: &str) -> String {
        format!(r#"{{"routing":{{"rules":[{rule}]}},"pools":[{{"id":"direct"}},{{"id":"b"}}]}}"#)
    }

    fn with_pool(pool: &str) -> String {
        format!(r#"{{"routing":{{"rules":[]}},"pools":[{pool}]}}"#)
    }

    fn invalid_at(doc: &str) -> (String, String) {
        match check(doc) {
            Err(SnapshotError::Invalid { path, message }) => (path, message),
            other => panic!("expected a semantic error for {doc}, got {other:?}"),
        }
    }

    #[test]
    fn semantic_errors_name_the_path() {
        let long_region = "r".repeat(129);
        let region_doc = with_rule(&format!(
            r#"{{"id":"a","priority":1,"pools":["direct"],"constraints":{{"region":"{long_region}"}}}}"#
        ));
        let many_pools: Vec<String> = (0..65).map(|i| format!("\"p{i}\"")).collect();
        let cases: Vec<(String, &str, &str)> = vec![
            (
                with_rule(r#"{"id":"a","priority":1,"pools":["x"]}"#),
                "routing.rules[0].pools[0]",
                "unknown pool \"x\"",
            ),
            (
                with_rule(
                    r#"{"id":"a","priority":1,"pools":["direct"]},{"id":"b","priority":2,"pools":["direct"]},{"id":"c","priority":3,"pools":["direct","zzz"]}"#,
                ),
                "routing.rules[2].pools[1]",
                "unknown pool \"zzz\"",
            ),
            (
                with_rule(r#"{"id":"a","priority":1,"pools":["direct","direct"]}"#),
                "routing.rules[0].pools[1]",
                "listed twice",
            ),
            (
                with_rule(r#"{"id":"a","priority":1,"pools":[]}"#),
                "routing.rules[0].pools",
                "at least one pool",
            ),
            (
                with_rule(&format!(
                    r#"{{"id":"a","priority":1,"pools":[{}]}}"#,
                    many_pools.join(",")
                )),
                "routing.rules[0].pools",
                "at most 64",
            ),
            (
                with_rule(
                    r#"{"id":"a","priority":1,"pools":["direct"]},{"id":"a","priority":2,"pools":["b"]}"#,
                ),
                "routing.rules[1].id",
                "duplicate rule id \"a\"",
            ),
            (with_rule(r#"{"id":"","priority":1,"pools":["direct"]}"#), "routing.rules[0].id", "empty"),
            (
                with_rule(r#"{"id":"a b","priority":1,"pools":["direct"]}"#),
                "routing.rules[0].id",
                "identifier \"a b\"",
            ),
            (
                with_rule(r#"{"id":"a","priority":-1,"pools":["direct"]}"#),
                "routing.rules[0].priority",
                "-1 is out of range 0..=1000000",
            ),
            (
                with_rule(r#"{"id":"a","priority":1000001,"pools":["direct"]}"#),
                "routing.rules[0].priority",
                "out of range",
            ),
            (
                with_rule(r#"{"id":"a","priority":1,"pools":["direct"],"sticky_session_ttl_seconds":604801}"#),
                "routing.rules[0].sticky_session_ttl_seconds",
                "604801 is out of range 0..=604800",
            ),
            (
                with_rule(r#"{"id":"a","priority":1,"pools":["direct"],"sticky_session_ttl_seconds":-5}"#),
                "routing.rules[0].sticky_session_ttl_seconds",
                "out of range",
            ),
            (
                with_rule(r#"{"id":"a","priority":1,"pools":["direct"],"constraints":{"country":"XX"}}"#),
                "routing.rules[0].constraints.country",
                "\"XX\" is not an assigned ISO 3166-1 alpha-2 code",
            ),
            (
                with_rule(r#"{"id":"a","priority":1,"pools":["direct"],"constraints":{"country":"USA"}}"#),
                "routing.rules[0].constraints.country",
                "not an assigned",
            ),
            (
                with_rule(r#"{"id":"a","priority":1,"pools":["direct"],"constraints":{"ingress":"API"}}"#),
                "routing.rules[0].constraints.ingress",
                "\"API\" is not one of",
            ),
            (
                with_rule(r#"{"id":"a","priority":1,"pools":["direct"],"constraints":{"host":"a.*.com"}}"#),
                "routing.rules[0].constraints.host",
                "wildcard",
            ),
            (
                with_rule(r#"{"id":"a","priority":1,"pools":["direct"],"constraints":{"region":""}}"#),
                "routing.rules[0].constraints.region",
                "must not be empty",
            ),
            (region_doc, "routing.rules[0].constraints.region", "at most 128 bytes"),
            (
                with_rule(r#"{"id":"a","priority":1,"pools":["direct"],"constraints":{"ip_type":"a\tb"}}"#),
                "routing.rules[0].constraints.ip_type",
                "control characters",
            ),
            (
                r#"{"default_timeout_ms":999,"routing":{"rules":[]},"pools":[]}"#.into(),
                "default_timeout_ms",
                "999 is out of range 1000..=3600000",
            ),
            (
                r#"{"default_timeout_ms":3600001,"routing":{"rules":[]},"pools":[]}"#.into(),
                "default_timeout_ms",
                "out of range",
            ),
            (with_pool(r#"{"id":"p"},{"id":"p"}"#), "pools[1].id", "duplicate pool id \"p\""),
            (with_pool(r#"{"id":"p/q"}"#), "pools[0].id", "may only contain"),
            (
                with_pool(r#"{"id":"p","upstream_proxy":{"id":"","url":"http://a.test:1"}}"#),
                "pools[0].upstream_proxy.id",
                "empty",
            ),
            (
                with_pool(r#"{"id":"p","upstream_proxy":{"id":"x","url":"ftp://a.test:1"}}"#),
                "pools[0].upstream_proxy.url",
                "http://, https://, socks5:// or socks5h://",
            ),
            (
                with_pool(r#"{"id":"p","upstream_proxy":{"id":"x"}}"#),
                "pools[0].upstream_proxy.url",
                "url or urls is required",
            ),
            (
                with_pool(
                    r#"{"id":"p","upstream_proxy":{"id":"x","url":"http://a.test:1","urls":["http://b.test:1"]}}"#,
                ),
                "pools[0].upstream_proxy.urls",
                "alternatives",
            ),
            (
                with_pool(r#"{"id":"p","upstream_proxy":{"id":"x","urls":[]}}"#),
                "pools[0].upstream_proxy.urls",
                "1..=64",
            ),
            (
                with_pool(
                    r#"{"id":"p","upstream_proxy":{"id":"x","urls":["http://a.test:1","HTTP://A.test:1/"]}}"#,
                ),
                "pools[0].upstream_proxy.urls[1]",
                "duplicate endpoint",
            ),
            (
                with_pool(
                    r#"{"id":"p","upstream_proxy":{"id":"x","urls":["http://a.test:1","socks5://b"]}}"#,
                ),
                "pools[0].upstream_proxy.urls[1]",
                "explicit port",
            ),
            (
                with_pool(
                    r#"{"id":"p","upstream_proxy":{"id":"x","url":"http://a.test:1","password":"x","password_env":"P"}}"#,
                ),
                "pools[0].upstream_proxy.password_env",
                "alternatives",
            ),
            (
                with_pool(
                    r#"{"id":"p","upstream_proxy":{"id":"x","url":"http://a.test:1","password_env":"1P"}}"#,
                ),
                "pools[0].upstream_proxy.password_env",
                "environment variable name",
            ),
            (
                with_pool(
                    r#"{"id":"p","upstream_proxy":{"id":"x","url":"http://a.test:1","resolve":"dns"}}"#,
                ),
                "pools[0].upstream_proxy.resolve",
                "must be \"gateway\" or \"proxy\"",
            ),
            (
                with_pool(
                    r#"{"id":"p","upstream_proxy":{"id":"x","url":"socks5h://a.test:1","resolve":"gateway"}}"#,
                ),
                "pools[0].upstream_proxy.resolve",
                "contradicts",
            ),
            (
                with_pool(r#"{"id":"p","upstream_proxy":{"id":"x","url":"http://u:p@a.test:1"}}"#),
                "pools[0].upstream_proxy.url",
                "user info",
            ),
            (
                with_pool(
                    r#"{"id":"p","upstream_proxy":{"id":"x","url":"http://a.test:1","username_template":"u-{zone}"}}"#,
                ),
                "pools[0].upstream_proxy.username_template",
                "unknown placeholder {zone}",
            ),
            (
                with_pool(
                    r#"{"id":"p","upstream_proxy":{"id":"x","url":"http://a.test:1","password":""}}"#,
                ),
                "pools[0].upstream_proxy.password",
                "empty",
            ),
            (
                r#"{"routing":{"rules":[]},"pools":[],"destinations":{"allow":["10.0.0.1/8"]}}"#
                    .into(),
                "destinations.allow[0]",
                "\"10.0.0.1/8\": host bits",
            ),
            (
                r#"{"routing":{"rules":[]},"pools":[],"destinations":{"deny":["1.2.3.0/24","bad"]}}"#
                    .into(),
                "destinations.deny[1]",
                "not an IP address",
            ),
            (
                r#"{"routing":{"rules":[]},"pools":[],"destinations":{"deny":["::1","::1/128"]}}"#
                    .into(),
                "destinations.deny[1]",
                "::1/128 is listed twice",
            ),
        ];
        for (doc, path, fragment) in cases {
            let (got_path, message) = invalid_at(&doc);
            assert_eq!(got_path, path, "{doc}");
            assert!(
                message.contains(fragment),
                "{message:?} lacks {fragment:?} for {doc}"
            );
            let e = SnapshotError::Invalid {
                path: got_path,
                message,
            };
            assert_eq!(e.http_status(), 422);
            assert!(e.to_string().starts_with(path));
        }
    }

    #[test]
    fn count_limits() {
        let rules: Vec<String> = (0..=MAX_RULES)
            .map(|i| format!(r#"{{"id":"r{i}","priority":1,"pools":["direct"]}}"#))
            .collect();
        let doc = with_rule(&rules.join(","));
        assert_eq!(invalid_at(&doc).0, "routing.rules");
        let ok = with_rule(&rules[..MAX_RULES].join(","));
        assert_eq!(check(&ok).unwrap().rules().len(), MAX_RULES);

        let pools: Vec<String> = (0..=MAX_POOLS)
            .map(|i| format!(r#"{{"id":"p{i}"}}"#))
            .collect();
        assert_eq!(invalid_at(&with_pool(&pools.join(","))).0, "pools");
        assert_eq!(
            check(&with_pool(&pools[..MAX_POOLS].join(",")))
                .unwrap()
                .pools()
                .len(),
            MAX_POOLS
        );

        let cidrs: Vec<String> = (0..=MAX_DESTINATION_ENTRIES)
            .map(|i| format!("\"10.{}.{}.0/24\"", i / 256, i % 256))
            .collect();
        let doc = format!(
            r#"{{"routing":{{"rules":[]}},"pools":[],"destinations":{{"allow":[{}]}}}}"#,
            cidrs.join(",")
        );
        assert_eq!(invalid_at(&doc).0, "destinations.allow");
    }

    #[test]
    fn quoted_values_are_bounded_and_escaped() {
        assert_eq!(quoted("x"), "\"x\"");
        assert_eq!(quoted("a\"b\n"), "\"a\\\"b\\n\"");
        let long = "é".repeat(100);
        let q = quoted(&long);
        assert!(q.len() < 80 && q.ends_with('…'), "{q}");
        let doc = with_rule(&format!(
            r#"{{"id":"a","priority":1,"pools":["{}"]}}"#,
            "z".repeat(5000)
        ));
        assert!(invalid_at(&doc).1.len() < 120);
    }

    #[test]
    fn boundaries_are_inclusive() {
        let doc = r#"{"default_timeout_ms":1000,"routing":{"rules":[{"id":"a","priority":0,"pools":["direct"],"sticky_session_ttl_seconds":604800},{"id":"b","priority":1000000,"pools":["direct"],"sticky_session_ttl_seconds":0}]},"pools":[{"id":"direct"}]}"#;
        let s = check(doc).unwrap();
        assert_eq!(s.default_timeout_ms(), 1000);
        assert_eq!(s.rules()[0].priority(), 0);
        assert_eq!(s.rules()[0].sticky_session_ttl_seconds(), 604_800);
        assert_eq!(s.rules()[1].priority(), 1_000_000);
        let doc = r#"{"default_timeout_ms":3600000,"routing":{"rules":[]},"pools":[]}"#;
        assert_eq!(check(doc).unwrap().default_timeout_ms(), 3_600_000);
    }
}
