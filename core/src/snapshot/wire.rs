//! The runtime snapshot as it appears on the wire (admin `PUT /api/v1/admin/config` body):
//! serde types that reject unknown fields at every level. They hold unchecked values; only
//! [`super::validate`] turns them into a [`super::ValidatedSnapshot`].
//!
//! Integers are decoded as `i64` so that a negative or too-large value is a semantic error with
//! a path (422) rather than a decode error (400).

use serde::Deserialize;

/// The whole snapshot.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WireSnapshot {
    #[serde(default)]
    pub(crate) default_timeout_ms: Option<i64>,
    pub(crate) routing: WireRouting,
    pub(crate) pools: Vec<WirePool>,
    #[serde(default)]
    pub(crate) destinations: Option<WireDestinations>,
}

/// `routing`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WireRouting {
    pub(crate) rules: Vec<WireRule>,
}

/// `routing.rules[]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WireRule {
    pub(crate) id: String,
    pub(crate) priority: i64,
    #[serde(default)]
    pub(crate) constraints: Option<WireConstraints>,
    pub(crate) pools: Vec<String>,
    #[serde(default)]
    pub(crate) sticky_session_ttl_seconds: Option<i64>,
    #[serde(default)]
    pub(crate) allow_sticky_fallback: Option<bool>,
}

/// `routing.rules[].constraints`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WireConstraints {
    #[serde(default)]
    pub(crate) country: Option<String>,
    #[serde(default)]
    pub(crate) region: Option<String>,
    #[serde(default)]
    pub(crate) ip_type: Option<String>,
    #[serde(default)]
    pub(crate) ingress: Option<String>,
    #[serde(default)]
    pub(crate) host: Option<String>,
}

/// `pools[]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WirePool {
    pub(crate) id: String,
    #[serde(default)]
    pub(crate) upstream_proxy: Option<WireUpstreamProxy>,
}

/// `pools[].upstream_proxy`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WireUpstreamProxy {
    pub(crate) id: String,
    #[serde(default)]
    pub(crate) url: Option<String>,
    #[serde(default)]
    pub(crate) urls: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) username_template: Option<String>,
    #[serde(default)]
    pub(crate) password: Option<String>,
    #[serde(default)]
    pub(crate) password_env: Option<String>,
    #[serde(default)]
    pub(crate) resolve: Option<String>,
}

/// `destinations`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WireDestinations {
    #[serde(default)]
    pub(crate) allow: Vec<String>,
    #[serde(default)]
    pub(crate) deny: Vec<String>,
}
