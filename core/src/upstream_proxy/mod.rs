//! Egress through upstream proxies, the decisions (decisions 006, 070, 071): the handshakes
//! with HTTP `CONNECT` proxies (`connect`) and SOCKS5 proxies (`socks5`), the choice of an
//! endpoint in a pool of several, the outlier ejection numbers, and the fixed `fact` of every
//! `upstream_proxy_failure`.

pub mod connect;
pub mod socks5;

use crate::error::{ApiError, ErrorCode};
use crate::provider_session::ProviderSession;

/// Consecutive failures of one endpoint that eject it (Envoy's `consecutive_5xx` default).
pub const EJECT_AFTER_CONSECUTIVE_FAILURES: u32 = 5;
/// The first ejection's length; the n-th ejection in a row lasts n times as long (Envoy's
/// `base_ejection_time` default).
pub const BASE_EJECTION_MS: u64 = 30_000;
/// The longest ejection (Envoy's `max_ejection_time` default).
pub const MAX_EJECTION_MS: u64 = 300_000;

/// When and for how long an endpoint is taken out of the choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutlierPolicy {
    /// Consecutive failures that eject.
    pub consecutive_failures: u32,
    /// Length of the first ejection.
    pub base_ejection_ms: u64,
    /// Upper bound of an ejection.
    pub max_ejection_ms: u64,
}

impl Default for OutlierPolicy {
    fn default() -> Self {
        OutlierPolicy {
            consecutive_failures: EJECT_AFTER_CONSECUTIVE_FAILURES,
            base_ejection_ms: BASE_EJECTION_MS,
            max_ejection_ms: MAX_EJECTION_MS,
        }
    }
}

impl OutlierPolicy {
    /// The length of the `nth` ejection in a row (from 1): `base * nth`, at most the maximum.
    pub fn ejection_ms(&self, nth: u32) -> u64 {
        self.base_ejection_ms
            .saturating_mul(u64::from(nth.max(1)))
            .min(self.max_ejection_ms)
    }
}

/// Chooses the endpoint of a pool of `n` (n ≥ 1) for one new connection.
///
/// With a provider session: rendezvous hashing over the available endpoints, so the same
/// session always gets the same endpoint while it is available, and when one is ejected only
/// its own sessions move, spread over the others. Without: round robin from `rr`, skipping
/// unavailable ones. When none is available every endpoint is a candidate again (a pool
/// that ejected everything would otherwise fail every request).
pub fn choose_endpoint(
    n: usize,
    session: Option<&ProviderSession>,
    rr: usize,
    is_available: impl Fn(usize) -> bool,
) -> usize {
    if n <= 1 {
        return 0;
    }
    let any_available = (0..n).any(&is_available);
    let candidate = |i: usize| !any_available || is_available(i);
    match session {
        Some(s) => {
            let b = s.as_bytes();
            let mut lo = [0u8; 8];
            let mut hi = [0u8; 8];
            lo.copy_from_slice(b.get(..8).unwrap_or(&[0; 8]));
            hi.copy_from_slice(b.get(8..).unwrap_or(&[0; 8]));
            let seed = u64::from_le_bytes(lo) ^ u64::from_le_bytes(hi).rotate_left(29);
            (0..n)
                .filter(|&i| candidate(i))
                .max_by_key(|&i| {
                    crate::rendezvous::mix64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                })
                .unwrap_or(0)
        }
        None => (0..n)
            .map(|k| (rr.wrapping_add(k)) % n)
            .find(|&i| candidate(i))
            .unwrap_or(0),
    }
}

/// The phase of the proxy path that failed: the `fact` detail of `upstream_proxy_failure`.
/// Failures after the tunnel is up keep the ordinary upstream codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProxyFact {
    /// The proxy could not be reached: its name did not resolve, it refused, the network was
    /// unreachable, or the TCP connect timed out.
    Connect,
    /// The TLS session with an `https://` proxy failed.
    Tls,
    /// The proxy refused the credentials: `407`, a SOCKS5 method or RFC 1929 rejection.
    Auth,
    /// The proxy's credentials are not available to the executor (`password_env` unset).
    Credentials,
    /// The proxy answered but refused the tunnel: a non-2xx `CONNECT` status or a SOCKS5
    /// reply other than succeeded.
    Tunnel,
    /// The proxy's reply breaks HTTP/1.1 or RFC 1928/1929.
    Protocol,
    /// The proxy closed or reset the connection during the handshake.
    Closed,
    /// The handshake with the proxy did not finish within the connect limit.
    Timeout,
}

impl ProxyFact {
    /// The fixed wire value of `details.fact`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ProxyFact::Connect => "proxy_connect",
            ProxyFact::Tls => "proxy_tls",
            ProxyFact::Auth => "proxy_auth",
            ProxyFact::Credentials => "proxy_credentials",
            ProxyFact::Tunnel => "proxy_tunnel",
            ProxyFact::Protocol => "proxy_protocol",
            ProxyFact::Closed => "proxy_closed",
            ProxyFact::Timeout => "proxy_timeout",
        }
    }

    /// Whether the failure says the endpoint itself is unhealthy (counts towards ejection). A
    /// proxy that answered, even with a refusal, is alive: a 407 or a destination it cannot
    /// reach says nothing about the endpoint.
    pub const fn is_endpoint_failure(self) -> bool {
        matches!(
            self,
            ProxyFact::Connect
                | ProxyFact::Tls
                | ProxyFact::Protocol
                | ProxyFact::Closed
                | ProxyFact::Timeout
        )
    }

    /// `upstream_proxy_failure` with this fact and a fixed message.
    pub fn error(self) -> ApiError {
        let message = match self {
            ProxyFact::Connect => "the upstream proxy could not be reached",
            ProxyFact::Tls => "the TLS session with the upstream proxy failed",
            ProxyFact::Auth => "the upstream proxy rejected the credentials",
            ProxyFact::Credentials => "the upstream proxy's password is not available",
            ProxyFact::Tunnel => "the upstream proxy refused the tunnel",
            ProxyFact::Protocol => "the upstream proxy sent a malformed reply",
            ProxyFact::Closed => "the upstream proxy closed the connection during the handshake",
            ProxyFact::Timeout => "the handshake with the upstream proxy timed out",
        };
        ApiError::new(ErrorCode::UpstreamProxyFailure, message).with_detail("fact", self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(b: u8) -> ProviderSession {
        let sid = format!("s{b}");
        ProviderSession::derive(&crate::provider_session::ProviderSessionInputs {
            deployment_id: "d",
            pool_id: "p",
            upstream_proxy_id: "x",
            country: None,
            region: None,
            ip_type: None,
            sticky_session_id: &sid,
        })
    }

    #[test]
    fn ejection_grows_and_caps() {
        let p = OutlierPolicy::default();
        assert_eq!(p.ejection_ms(0), 30_000);
        assert_eq!(p.ejection_ms(1), 30_000);
        assert_eq!(p.ejection_ms(3), 90_000);
        assert_eq!(p.ejection_ms(11), 300_000);
        assert_eq!(p.ejection_ms(u32::MAX), 300_000);
    }

    #[test]
    fn round_robin_skips_unavailable() {
        let all = |_| true;
        let picks: Vec<usize> = (0..6).map(|rr| choose_endpoint(3, None, rr, all)).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        let not1 = |i| i != 1;
        let picks: Vec<usize> = (0..3)
            .map(|rr| choose_endpoint(3, None, rr, not1))
            .collect();
        assert_eq!(picks, [0, 2, 2]);
        // Nothing available: every endpoint is a candidate again.
        assert_eq!(choose_endpoint(3, None, 4, |_| false), 1);
        assert_eq!(choose_endpoint(1, None, 7, |_| false), 0);
    }

    #[test]
    fn sessions_stick_and_only_the_ejected_endpoints_sessions_move() {
        let n = 4;
        let all = |_| true;
        let mut counts = [0usize; 4];
        let mut moved = 0;
        for b in 0..=255u8 {
            let s = session(b);
            let home = choose_endpoint(n, Some(&s), 0, all);
            assert_eq!(choose_endpoint(n, Some(&s), 99, all), home, "stable");
            counts[home] += 1;
            let without2 = choose_endpoint(n, Some(&s), 0, |i| i != 2);
            if home == 2 {
                assert_ne!(without2, 2);
                moved += 1;
            } else {
                assert_eq!(without2, home, "only endpoint 2's sessions move");
            }
        }
        assert_eq!(moved, counts[2]);
        // Spread: no endpoint takes fewer than a third of its share of 256 sessions.
        assert!(counts.iter().all(|&c| c > 256 / 4 / 3), "{counts:?}");
    }

    #[test]
    fn facts_are_fixed_and_classified() {
        let e = ProxyFact::Auth.error();
        assert_eq!(e.code, ErrorCode::UpstreamProxyFailure);
        assert_eq!(e.http_status(), 502);
        assert_eq!(e.details, [("fact".to_string(), "proxy_auth".to_string())]);
        assert!(ProxyFact::Connect.is_endpoint_failure());
        assert!(!ProxyFact::Tunnel.is_endpoint_failure());
        assert!(!ProxyFact::Auth.is_endpoint_failure());
    }
}
