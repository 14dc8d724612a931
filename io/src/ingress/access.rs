//! The access log (decision 113): with `log.access = true`, one line per request of the
//! request API, the forward proxy and CONNECT, at level info with target `sortie::access`,
//! in the process's log format (text or JSON). It names the destination by scheme, host and
//! port only: never a path or query (they may carry the caller's secrets), a credential, or a
//! signed URL.

use std::time::Instant;

use sortie_core::hints::Ingress;

/// One request's line.
pub(crate) struct Access<'a> {
    pub(crate) ingress: Ingress,
    pub(crate) request_id: &'a str,
    pub(crate) deployment: &'a str,
    /// The destination's method, or `-` when the request never got that far.
    pub(crate) method: &'a str,
    /// `scheme://host:port` (or `host:port` for CONNECT), or `-`.
    pub(crate) destination: &'a str,
    /// The status the client got.
    pub(crate) status: u16,
    /// `ok` or the registry code.
    pub(crate) outcome: &'a str,
    pub(crate) started: Instant,
}

impl Access<'_> {
    /// Writes the line.
    pub(crate) fn log(&self) {
        tracing::info!(
            target: "sortie::access",
            ingress = self.ingress.as_str(),
            request_id = self.request_id,
            deployment = self.deployment,
            method = self.method,
            destination = self.destination,
            status = self.status,
            outcome = self.outcome,
            duration_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "access"
        );
    }
}

/// The scheme, host and port of a forward proxy's request target: an absolute-form URL loses
/// its user information, path, query and fragment; an authority (CONNECT) stays as it is.
pub(crate) fn destination_of(target: &str) -> std::borrow::Cow<'_, str> {
    let (scheme_len, rest) = match target.find("://") {
        Some(i) => (i + 3, target.get(i + 3..).unwrap_or_default()),
        None => (0, target),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = rest.get(..authority_end).unwrap_or_default();
    match authority.rfind('@') {
        Some(at) => format!(
            "{}{}",
            target.get(..scheme_len).unwrap_or_default(),
            authority.get(at + 1..).unwrap_or_default()
        )
        .into(),
        None => target
            .get(..scheme_len + authority_end)
            .unwrap_or_default()
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destination_keeps_scheme_host_and_port_only() {
        for (target, want) in [
            ("http://example.com/a?key=secret", "http://example.com"),
            ("https://example.com:8443?x=1", "https://example.com:8443"),
            ("http://user:pass@example.com:80/p", "http://example.com:80"),
            ("http://[::1]:8080#frag", "http://[::1]:8080"),
            ("example.com:443", "example.com:443"),
            ("", ""),
        ] {
            assert_eq!(destination_of(target), want, "{target}");
        }
    }
}
