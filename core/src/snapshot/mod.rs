//! The runtime configuration snapshot: strict decoding of the admin `PUT /api/v1/admin/config`
//! body, semantic validation into an immutable [`ValidatedSnapshot`], and canonical JSON
//! encoding for `GET /api/v1/admin/config`.
//!
//! Two error classes, as the admin API distinguishes them (decision 006): anything
//! the JSON decoder rejects (syntax, wrong type, unknown field, duplicate key, trailing data,
//! over 4 MiB) is [`SnapshotError::Decode`] (400); a well-formed document that fails a semantic
//! rule is [`SnapshotError::Invalid`] (422) whose message names the JSON path, for example
//! `routing.rules[2].pools[0]: unknown pool "x"`.

mod encode;
mod host;
mod proxy;
mod validate;
mod wire;

pub use crate::config_id::{ConfigId, IdError, MAX_ID_BYTES};
pub use host::{normalize_hostname, HostError, HostPattern, MAX_HOSTNAME_BYTES, MAX_LABEL_BYTES};
pub use proxy::{
    parse_env_name, EnvNameError, PasswordError, Placeholder, ProxyAddr, ProxyHost, ProxyResolve,
    ProxyScheme, ProxyUrlError, RenderError, Secret, TemplateError, TemplateValues,
    UsernameTemplate, MAX_ENV_NAME_BYTES, MAX_PROXY_ENDPOINTS, MAX_PROXY_PASSWORD_BYTES,
    MAX_PROXY_URL_BYTES, MAX_USERNAME_TEMPLATE_BYTES,
};

use crate::destination::Cidr;
use crate::hints::{CountryCode, Ingress};
use crate::json::JsonError;
use crate::limits;

/// Most rules in one snapshot (decision 006).
pub const MAX_RULES: usize = 1024;
/// Most pools in one snapshot (decision 006).
pub const MAX_POOLS: usize = 1024;
/// Most pools one rule may list (decision 006).
pub const MAX_POOLS_PER_RULE: usize = 64;
/// Most entries in each of `destinations.allow` and `destinations.deny`.
pub const MAX_DESTINATION_ENTRIES: usize = 1024;
/// Highest rule priority; priorities are `0..=MAX_PRIORITY`, lower is evaluated first.
pub const MAX_PRIORITY: u32 = 1_000_000;
/// Smallest `default_timeout_ms`: the spec's minimum explicit timeout applies to the default too.
pub const MIN_DEFAULT_TIMEOUT_MS: u64 = limits::MIN_TIMEOUT_MS;
/// Largest `default_timeout_ms` (one hour). The static `control.request.max_timeout_ms` caps
/// the value in effect further (spec, Request API rule 3).
pub const MAX_DEFAULT_TIMEOUT_MS: u64 = 3_600_000;
/// Largest `sticky_session_ttl_seconds` (seven days).
pub const MAX_STICKY_TTL_SECONDS: u32 = 7 * 24 * 3600;
/// `allow_sticky_fallback` when a rule omits it: stickiness is a preference (spec, Routing
/// object: "preferring the same eligible worker").
pub const DEFAULT_ALLOWS_STICKY_FALLBACK: bool = true;

/// Why a snapshot was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// The body is not a strict JSON snapshot document: admin answer 400.
    #[error("{0}")]
    Decode(JsonError),
    /// The document is well-formed but breaks a semantic rule: admin answer 422.
    #[error("{path}: {message}")]
    Invalid {
        /// JSON path of the offending value, such as `routing.rules[2].pools[0]`.
        path: String,
        /// What is wrong with it.
        message: String,
    },
}

impl SnapshotError {
    /// The admin API status of this error: 400 for decode errors, 422 for invalid snapshots
    /// (spec, Admin API errors).
    pub const fn http_status(&self) -> u16 {
        match self {
            SnapshotError::Decode(_) => 400,
            SnapshotError::Invalid { .. } => 422,
        }
    }
}

/// Decodes and validates an admin snapshot body in place (simd-json mutates `buf`).
pub fn decode_snapshot(buf: &mut [u8]) -> Result<ValidatedSnapshot, SnapshotError> {
    // Spec, Admin API rule 2: mutation bodies are at most 4 MiB and a single strict JSON value.
    let wire: wire::WireSnapshot =
        crate::json::from_slice_strict(buf, limits::MAX_ADMIN_BODY_BYTES)
            .map_err(SnapshotError::Decode)?;
    validate::validate(wire)
}

/// A snapshot that passed every check. It cannot be built any other way than by
/// [`decode_snapshot`] or [`ValidatedSnapshot::default_snapshot`], so holding one proves it is
/// valid. Rules are sorted by `(priority, id)`, the evaluation order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedSnapshot {
    default_timeout_ms: u64,
    rules: Vec<Rule>,
    pools: Vec<Pool>,
    destinations: Destinations,
}

impl ValidatedSnapshot {
    /// The snapshot of a fresh data dir (decision 017): one rule `default`, priority 100, no
    /// constraints, over pool `direct`; `default_timeout_ms` 60000; no destination entries.
    pub fn default_snapshot() -> ValidatedSnapshot {
        let mut buf = DEFAULT_SNAPSHOT_JSON.as_bytes().to_vec();
        match decode_snapshot(&mut buf) {
            Ok(s) => s,
            // The constant is covered by a unit test; this arm only keeps the function total.
            Err(_) => ValidatedSnapshot {
                default_timeout_ms: limits::DEFAULT_TIMEOUT_MS,
                rules: Vec::new(),
                pools: Vec::new(),
                destinations: Destinations::default(),
            },
        }
    }

    /// `default_timeout_ms` as configured (60000 when the snapshot omits it).
    pub fn default_timeout_ms(&self) -> u64 {
        self.default_timeout_ms
    }

    /// The default timeout in effect: the snapshot's value capped by the static
    /// `control.request.max_timeout_ms` (spec, Request API rule 3).
    pub fn effective_default_timeout_ms(&self, max_timeout_ms: u64) -> u64 {
        self.default_timeout_ms.min(max_timeout_ms)
    }

    /// The rules in evaluation order: ascending `(priority, id)`.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The pools in document order. Rules refer to them by index.
    pub fn pools(&self) -> &[Pool] {
        &self.pools
    }

    /// The pool with this id and its index.
    pub fn pool(&self, id: &str) -> Option<(usize, &Pool)> {
        self.pools
            .iter()
            .enumerate()
            .find(|(_, p)| p.id.as_str() == id)
    }

    /// The destination allow and deny ranges.
    pub fn destinations(&self) -> &Destinations {
        &self.destinations
    }

    /// The canonical JSON document: fixed key order, every rule field explicit, normalised
    /// values. Decoding it yields an equal snapshot.
    pub fn to_json(&self) -> Vec<u8> {
        encode::encode(self)
    }
}

/// The JSON of [`ValidatedSnapshot::default_snapshot`].
pub const DEFAULT_SNAPSHOT_JSON: &str = r#"{"default_timeout_ms":60000,"routing":{"rules":[{"id":"default","priority":100,"constraints":{},"pools":["direct"],"sticky_session_ttl_seconds":0,"allow_sticky_fallback":true}]},"pools":[{"id":"direct"}],"destinations":{"allow":[],"deny":[]}}"#;

/// A routing rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    id: ConfigId,
    priority: u32,
    constraints: Constraints,
    pools: Vec<usize>,
    sticky_session_ttl_seconds: u32,
    allows_sticky_fallback: bool,
}

impl Rule {
    /// The rule id, unique in the snapshot.
    pub fn id(&self) -> &ConfigId {
        &self.id
    }

    /// The priority; lower values are evaluated first.
    pub fn priority(&self) -> u32 {
        self.priority
    }

    /// The constraints a request must satisfy for this rule to be selected.
    pub fn constraints(&self) -> &Constraints {
        &self.constraints
    }

    /// Indices into [`ValidatedSnapshot::pools`], in preference order; never empty.
    pub fn pool_indices(&self) -> &[usize] {
        &self.pools
    }

    /// The sliding sticky pin lifetime; zero means no pin.
    pub fn sticky_session_ttl_seconds(&self) -> u32 {
        self.sticky_session_ttl_seconds
    }

    /// Whether another eligible worker may be chosen when the pinned one is unavailable.
    pub fn allows_sticky_fallback(&self) -> bool {
        self.allows_sticky_fallback
    }
}

/// The constraints of a rule. Spec, Routing rule 2: a constraint configured on a rule must be
/// supplied by the request and must match; an omitted value does not satisfy it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Constraints {
    country: Option<CountryCode>,
    region: Option<Box<str>>,
    ip_type: Option<Box<str>>,
    ingress: Option<Ingress>,
    host: Option<HostPattern>,
}

impl Constraints {
    /// Required country, uppercase.
    pub fn country(&self) -> Option<CountryCode> {
        self.country
    }

    /// Required region (exact, case-sensitive).
    pub fn region(&self) -> Option<&str> {
        self.region.as_deref()
    }

    /// Required IP type (exact, case-sensitive).
    pub fn ip_type(&self) -> Option<&str> {
        self.ip_type.as_deref()
    }

    /// Required ingress mode.
    pub fn ingress(&self) -> Option<Ingress> {
        self.ingress
    }

    /// Required destination host pattern.
    pub fn host(&self) -> Option<&HostPattern> {
        self.host.as_ref()
    }

    /// Whether no constraint is configured.
    pub fn is_empty(&self) -> bool {
        self.country.is_none()
            && self.region.is_none()
            && self.ip_type.is_none()
            && self.ingress.is_none()
            && self.host.is_none()
    }
}

/// A pool: a named set of workers, optionally egressing through an upstream proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    id: ConfigId,
    upstream_proxy: Option<UpstreamProxy>,
}

impl Pool {
    /// The pool id, unique in the snapshot.
    pub fn id(&self) -> &ConfigId {
        &self.id
    }

    /// The upstream proxy, when the pool does not egress directly.
    pub fn upstream_proxy(&self) -> Option<&UpstreamProxy> {
        self.upstream_proxy.as_ref()
    }
}

/// The upstream proxy of a pool: one provider (one id, one set of credentials) reached through
/// one or more endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamProxy {
    id: ConfigId,
    /// 1..=[`MAX_PROXY_ENDPOINTS`] endpoints, distinct, in the order given.
    endpoints: Vec<ProxyAddr>,
    username_template: Option<UsernameTemplate>,
    password: Option<Secret>,
    password_env: Option<Box<str>>,
    resolve: Option<ProxyResolve>,
}

impl UpstreamProxy {
    /// The proxy id, an input of the provider session derivation.
    pub fn id(&self) -> &ConfigId {
        &self.id
    }

    /// The endpoints, never empty (`url` gives one, `urls` several).
    pub fn endpoints(&self) -> &[ProxyAddr] {
        &self.endpoints
    }

    /// Who resolves destination names for `endpoint` (decision 070): `socks5h` endpoints always
    /// send names; the others follow `resolve`, by default the gateway.
    pub fn resolve_for(&self, endpoint: &ProxyAddr) -> ProxyResolve {
        match (endpoint.scheme(), self.resolve) {
            (ProxyScheme::Socks5h, _) => ProxyResolve::Proxy,
            (_, Some(r)) => r,
            (_, None) => ProxyResolve::Gateway,
        }
    }

    /// The `resolve` field as written, if it was.
    pub fn resolve(&self) -> Option<ProxyResolve> {
        self.resolve
    }

    /// The name of the environment variable holding the password, when it is not inline.
    pub fn password_env(&self) -> Option<&str> {
        self.password_env.as_deref()
    }

    /// The username template, if the proxy authenticates.
    pub fn username_template(&self) -> Option<&UsernameTemplate> {
        self.username_template.as_ref()
    }

    /// The password, if any.
    pub fn password(&self) -> Option<&Secret> {
        self.password.as_ref()
    }
}

/// The destination policy entries of a snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Destinations {
    allow: Vec<Cidr>,
    deny: Vec<Cidr>,
}

impl Destinations {
    /// Ranges opened in the deny-by-default policy (decision 017).
    pub fn allow(&self) -> &[Cidr] {
        &self.allow
    }

    /// Ranges closed in addition to the built-in ones.
    pub fn deny(&self) -> &[Cidr] {
        &self.deny
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example snapshot of decision 017's shape.
    const EXAMPLE_SNAPSHOT: &str = r#"{
      "default_timeout_ms": 60000,
      "routing": { "rules": [
        { "id": "default", "priority": 100,
          "constraints": { "country": "US", "region": "us-east", "ip_type": "residential",
                           "ingress": "api", "host": "*.example.com" },
          "pools": ["direct"],
          "sticky_session_ttl_seconds": 600,
          "allow_sticky_fallback": true } ] },
      "pools": [
        { "id": "direct" },
        { "id": "acme-us", "upstream_proxy": { "id": "acme", "url": "http://proxy.acme.test:8000",
          "username_template": "cust-7-country-{country}-session-{session}", "password": "..." } } ],
      "destinations": { "allow": ["127.0.0.0/8", "::1/128"], "deny": ["203.0.113.0/24"] }
    }"#;

    fn decode(doc: &str) -> Result<ValidatedSnapshot, SnapshotError> {
        let mut buf = doc.as_bytes().to_vec();
        decode_snapshot(&mut buf)
    }

    fn round_trip(s: &ValidatedSnapshot) -> ValidatedSnapshot {
        let mut json = s.to_json();
        decode_snapshot(&mut json).unwrap()
    }

    #[test]
    fn design_example_decodes() {
        let s = decode(EXAMPLE_SNAPSHOT).unwrap();
        assert_eq!(s.default_timeout_ms(), 60_000);
        let [rule] = s.rules() else {
            panic!("one rule expected")
        };
        assert_eq!(rule.id(), &"default");
        assert_eq!(rule.priority(), 100);
        assert_eq!(rule.sticky_session_ttl_seconds(), 600);
        assert!(rule.allows_sticky_fallback());
        assert_eq!(rule.pool_indices(), &[0]);
        let c = rule.constraints();
        assert_eq!(c.country().map(|c| c.to_string()).as_deref(), Some("US"));
        assert_eq!(c.region(), Some("us-east"));
        assert_eq!(c.ip_type(), Some("residential"));
        assert_eq!(c.ingress(), Some(Ingress::Api));
        assert_eq!(
            c.host().map(|h| h.to_string()).as_deref(),
            Some("*.example.com")
        );
        let (i, acme) = s.pool("acme-us").unwrap();
        assert_eq!(i, 1);
        let proxy = acme.upstream_proxy().unwrap();
        assert_eq!(proxy.id(), &"acme");
        assert_eq!(proxy.endpoints().len(), 1);
        assert_eq!(proxy.endpoints()[0].to_url(), "http://proxy.acme.test:8000");
        assert_eq!(proxy.endpoints()[0].port(), 8000);
        assert_eq!(
            proxy.resolve_for(&proxy.endpoints()[0]),
            ProxyResolve::Gateway
        );
        assert!(proxy
            .username_template()
            .unwrap()
            .uses(Placeholder::Session));
        assert_eq!(proxy.password().unwrap().expose(), "...");
        assert!(s.pool("direct").unwrap().1.upstream_proxy().is_none());
        let allow: Vec<String> = s
            .destinations()
            .allow()
            .iter()
            .map(|c| c.to_string())
            .collect();
        assert_eq!(allow, ["127.0.0.0/8", "::1/128"]);
        assert_eq!(s.destinations().deny().len(), 1);
        assert_eq!(round_trip(&s), s);
    }

    #[test]
    fn default_snapshot_matches_the_design() {
        let s = ValidatedSnapshot::default_snapshot();
        assert_eq!(s.default_timeout_ms(), 60_000);
        assert_eq!(s.rules().len(), 1);
        let rule = &s.rules()[0];
        assert_eq!(rule.id(), &"default");
        assert_eq!(rule.priority(), 100);
        assert!(rule.constraints().is_empty());
        assert_eq!(rule.sticky_session_ttl_seconds(), 0);
        assert_eq!(s.pools().len(), 1);
        assert_eq!(s.pools()[0].id(), &"direct");
        assert!(s.destinations().allow().is_empty() && s.destinations().deny().is_empty());
        // The constant is already canonical.
        assert_eq!(s.to_json(), DEFAULT_SNAPSHOT_JSON.as_bytes());
        assert_eq!(round_trip(&s), s);
    }

    #[test]
    fn omitted_fields_take_their_defaults() {
        let s = decode(
            r#"{"routing":{"rules":[{"id":"r","priority":5,"pools":["p"]}]},"pools":[{"id":"p"}]}"#,
        )
        .unwrap();
        assert_eq!(s.default_timeout_ms(), limits::DEFAULT_TIMEOUT_MS);
        assert_eq!(s.rules()[0].sticky_session_ttl_seconds(), 0);
        assert_eq!(
            s.rules()[0].allows_sticky_fallback(),
            DEFAULT_ALLOWS_STICKY_FALLBACK
        );
        assert!(s.rules()[0].constraints().is_empty());
        assert!(s.destinations().allow().is_empty());
        assert_eq!(
            String::from_utf8(s.to_json()).unwrap(),
            r#"{"default_timeout_ms":60000,"routing":{"rules":[{"id":"r","priority":5,"constraints":{},"pools":["p"],"sticky_session_ttl_seconds":0,"allow_sticky_fallback":true}]},"pools":[{"id":"p"}],"destinations":{"allow":[],"deny":[]}}"#
        );
    }

    #[test]
    fn rules_sorted_by_priority_then_id() {
        let s = decode(
            r#"{"routing":{"rules":[
                {"id":"z","priority":10,"pools":["p"]},
                {"id":"b","priority":5,"pools":["p"]},
                {"id":"a","priority":10,"pools":["p"]},
                {"id":"B","priority":10,"pools":["p"]},
                {"id":"c","priority":0,"pools":["p"]}]},
              "pools":[{"id":"p"}]}"#,
        )
        .unwrap();
        let order: Vec<&str> = s.rules().iter().map(|r| r.id().as_str()).collect();
        assert_eq!(order, ["c", "b", "B", "a", "z"]);
        assert_eq!(round_trip(&s), s);
    }

    #[test]
    fn values_are_normalised_and_round_trip() {
        let s = decode(
            r#"{"default_timeout_ms":1500,"routing":{"rules":[{"id":"r","priority":1,
                "constraints":{"country":"de","host":"API.Example.COM","ingress":"connect"},
                "pools":["b","a"],"sticky_session_ttl_seconds":30,"allow_sticky_fallback":false}]},
              "pools":[{"id":"a","upstream_proxy":{"id":"x","url":"HTTP://Proxy.Test:0080/"}},{"id":"b"}],
              "destinations":{"allow":["127.0.0.1","0:0:0:0:0:0:0:1"],"deny":[]}}"#,
        )
        .unwrap();
        let json = String::from_utf8(s.to_json()).unwrap();
        assert_eq!(
            json,
            r#"{"default_timeout_ms":1500,"routing":{"rules":[{"id":"r","priority":1,"constraints":{"country":"DE","ingress":"connect","host":"api.example.com"},"pools":["b","a"],"sticky_session_ttl_seconds":30,"allow_sticky_fallback":false}]},"pools":[{"id":"a","upstream_proxy":{"id":"x","url":"http://proxy.test:80"}},{"id":"b"}],"destinations":{"allow":["127.0.0.1/32","::1/128"],"deny":[]}}"#
        );
        assert_eq!(s.rules()[0].pool_indices(), &[1, 0]);
        assert_eq!(round_trip(&s), s);
        // Encoding is a fixed point.
        assert_eq!(round_trip(&s).to_json(), s.to_json());
    }

    /// Several endpoints, `password_env` and `resolve` encode canonically and round-trip; one
    /// endpoint given as `urls` encodes as `url`.
    #[test]
    fn proxy_endpoints_round_trip() {
        let s = decode(
            r#"{"routing":{"rules":[]},"pools":[
              {"id":"a","upstream_proxy":{"id":"x","urls":["HTTPS://P1.test:443","socks5h://[::1]:1080"],"username_template":"u-{session}","password_env":"ACME_PASSWORD","resolve":"proxy"}},
              {"id":"b","upstream_proxy":{"id":"y","urls":["socks5://127.0.0.1:1080/"]}}]}"#,
        )
        .unwrap();
        let json = String::from_utf8(s.to_json()).unwrap();
        assert!(json.contains(r#"{"id":"a","upstream_proxy":{"id":"x","urls":["https://p1.test:443","socks5h://[::1]:1080"],"username_template":"u-{session}","password_env":"ACME_PASSWORD","resolve":"proxy"}}"#), "{json}");
        assert!(
            json.contains(
                r#"{"id":"b","upstream_proxy":{"id":"y","url":"socks5://127.0.0.1:1080"}}"#
            ),
            "{json}"
        );
        assert_eq!(round_trip(&s), s);
        assert_eq!(round_trip(&s).to_json(), s.to_json());
        let b = s.pool("b").unwrap().1.upstream_proxy().unwrap();
        assert_eq!(b.resolve_for(&b.endpoints()[0]), ProxyResolve::Gateway);
        let a = s.pool("a").unwrap().1.upstream_proxy().unwrap();
        assert_eq!(a.password_env(), Some("ACME_PASSWORD"));
        assert!(a.password().is_none());
        assert_eq!(a.resolve_for(&a.endpoints()[0]), ProxyResolve::Proxy);
    }

    #[test]
    fn strings_with_escapes_round_trip() {
        let s = decode(
            r#"{"routing":{"rules":[{"id":"r","priority":1,"constraints":{"region":"caf\u00e9 \"x\"","ip_type":"a\\b"},"pools":["p"]}]},
              "pools":[{"id":"p","upstream_proxy":{"id":"x","url":"http://[::1]:1","username_template":"u-{region}","password":"p\u00e4ss \"w\""}}]}"#,
        )
        .unwrap();
        assert_eq!(s.rules()[0].constraints().region(), Some("café \"x\""));
        assert_eq!(s.rules()[0].constraints().ip_type(), Some("a\\b"));
        assert_eq!(round_trip(&s), s);
    }

    #[test]
    fn decode_errors_are_400() {
        let too_big = format!("{{\"x\":\"{}\"}}", "a".repeat(limits::MAX_ADMIN_BODY_BYTES));
        let cases: &[&str] = &[
            "",
            "not json",
            "[]",
            r#"{"routing":{"rules":[]},"pools":[],"extra":1}"#,
            r#"{"routing":{"rules":[],"x":1},"pools":[]}"#,
            r#"{"routing":{"rules":[{"id":"a","priority":1,"pools":["p"],"weight":3}]},"pools":[{"id":"p"}]}"#,
            r#"{"routing":{"rules":[{"id":"a","priority":1,"pools":["p"],"constraints":{"asn":1}}]},"pools":[{"id":"p"}]}"#,
            r#"{"routing":{"rules":[]},"pools":[{"id":"p","upstream_proxy":{"id":"x","url":"http://a:1","tls":true}}]}"#,
            r#"{"routing":{"rules":[]},"pools":[{"id":"p","weight":1}]}"#,
            r#"{"routing":{"rules":[]},"pools":[],"destinations":{"allow":[],"block":[]}}"#,
            r#"{"routing":{"rules":[]}}"#,
            r#"{"pools":[]}"#,
            r#"{"routing":{"rules":[{"priority":1,"pools":["p"]}]},"pools":[{"id":"p"}]}"#,
            r#"{"routing":{"rules":[{"id":"a","pools":["p"]}]},"pools":[{"id":"p"}]}"#,
            r#"{"routing":{"rules":[{"id":"a","priority":"1","pools":["p"]}]},"pools":[{"id":"p"}]}"#,
            r#"{"routing":{"rules":[{"id":"a","priority":1.5,"pools":["p"]}]},"pools":[{"id":"p"}]}"#,
            r#"{"routing":{"rules":[{"id":"a","priority":99999999999999999999,"pools":["p"]}]},"pools":[{"id":"p"}]}"#,
            r#"{"routing":{"rules":[{"id":"a","priority":1,"pools":"p"}]},"pools":[{"id":"p"}]}"#,
            r#"{"routing":{"rules":[{"id":"a","priority":1,"pools":["p"],"allow_sticky_fallback":"yes"}]},"pools":[{"id":"p"}]}"#,
            r#"{"routing":{"rules":[]},"pools":[]} {}"#,
            r#"{"routing":{"rules":[]},"pools":[],"pools":[]}"#,
            r#"{"default_timeout_ms":60000,"default_timeout_ms":60000,"routing":{"rules":[]},"pools":[]}"#,
            &too_big,
        ];
        for doc in cases {
            match decode(doc) {
                Err(e @ SnapshotError::Decode(_)) => assert_eq!(e.http_status(), 400),
                other => panic!("expected a decode error for {:.80}, got {other:?}", doc),
            }
        }
        let mut invalid_utf8 =
            b"{\"routing\":{\"rules\":[]},\"pools\":[{\"id\":\"\xff\"}]}".to_vec();
        assert_eq!(
            decode_snapshot(&mut invalid_utf8),
            Err(SnapshotError::Decode(JsonError::InvalidUtf8))
        );
    }

    #[test]
    fn effective_default_timeout_is_capped() {
        let s =
            decode(r#"{"default_timeout_ms":200000,"routing":{"rules":[]},"pools":[]}"#).unwrap();
        assert_eq!(
            s.effective_default_timeout_ms(limits::DEFAULT_MAX_TIMEOUT_MS),
            120_000
        );
        assert_eq!(s.effective_default_timeout_ms(300_000), 200_000);
    }

    #[test]
    fn empty_rule_set_is_valid() {
        let s = decode(r#"{"routing":{"rules":[]},"pools":[]}"#).unwrap();
        assert!(s.rules().is_empty() && s.pools().is_empty());
        assert_eq!(round_trip(&s), s);
    }
}
