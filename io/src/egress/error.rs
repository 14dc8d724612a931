//! How every failure of an upstream exchange becomes one error of the registry: DNS, connect,
//! TLS, timeouts, resets, malformed responses and the response size limit.
//!
//! Messages and details never carry body bytes, header values or resolved addresses (a caller
//! must not learn what internal names resolve to, decision 003); they name the stage and a
//! fixed reason.

use std::io;

use sortie_core::error::{ApiError, ErrorCode, TimeoutType};
use sortie_core::h1::H1Error;

use crate::dns::DnsError;

/// The stage of an exchange, named in the `stage` detail of timeouts and resets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Dns,
    Connect,
    TlsHandshake,
    RequestWrite,
    ResponseHeader,
    ResponseBody,
}

impl Stage {
    /// The contract's `timeout_type` for a total deadline that expired in this stage.
    pub(crate) const fn timeout_type(self) -> TimeoutType {
        match self {
            Stage::Dns => TimeoutType::TotalDeadline,
            Stage::Connect | Stage::TlsHandshake => TimeoutType::Connect,
            Stage::RequestWrite => TimeoutType::Upload,
            Stage::ResponseHeader => TimeoutType::ResponseHeader,
            Stage::ResponseBody => TimeoutType::Download,
        }
    }

    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Stage::Dns => "dns",
            Stage::Connect => "connect",
            Stage::TlsHandshake => "tls_handshake",
            Stage::RequestWrite => "request_write",
            Stage::ResponseHeader => "response_header",
            Stage::ResponseBody => "response_body",
        }
    }
}

/// The limit that fired: the stage's own limit, or the request's total deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expired {
    /// The per-attempt connect limit (`upstream_connect_timeout`).
    ConnectAttempt,
    /// The stage limit of the given type (`timeout_exceeded`).
    Stage(TimeoutType),
    /// The total deadline (`timeout_exceeded`, `total_deadline_timeout`).
    TotalDeadline,
}

/// The error for a limit that fired during `stage`.
pub(crate) fn timeout(expired: Expired, stage: Stage) -> ApiError {
    let e = match expired {
        Expired::ConnectAttempt => ApiError::timeout(
            ErrorCode::UpstreamConnectTimeout,
            TimeoutType::Connect,
            "connecting to the destination timed out",
        ),
        Expired::Stage(TimeoutType::ResponseHeader) => ApiError::timeout(
            ErrorCode::TimeoutExceeded,
            TimeoutType::ResponseHeader,
            "the destination did not send a complete response head in time",
        ),
        Expired::Stage(TimeoutType::Idle) => ApiError::timeout(
            ErrorCode::TimeoutExceeded,
            TimeoutType::Idle,
            "no bytes moved between gateway and destination for the idle interval",
        ),
        Expired::Stage(other) => ApiError::timeout(
            ErrorCode::TimeoutExceeded,
            other,
            "a stage of the upstream exchange timed out",
        ),
        // Spec, errors table: timeout_exceeded means the total deadline expired, and its
        // timeout_type names the stage it expired in; total_deadline_timeout is left for a
        // deadline that expired outside the upstream exchange's stages (name resolution).
        Expired::TotalDeadline => ApiError::timeout(
            ErrorCode::TimeoutExceeded,
            stage.timeout_type(),
            "the total deadline expired",
        )
        .with_detail("deadline", "total"),
    };
    e.with_detail("stage", stage.as_str())
}

/// `upstream_dns_failure` for a name that did not resolve.
pub(crate) fn dns_failure(e: &DnsError) -> ApiError {
    let reason = match e {
        DnsError::NotFound(_) => "name did not resolve",
        DnsError::Unavailable => "resolver unavailable",
    };
    ApiError::new(
        ErrorCode::UpstreamDnsFailure,
        "the destination host name did not resolve",
    )
    .with_detail("reason", reason)
}

/// The error for a failed TCP connect. Refusals and unreachable networks are the
/// destination's side (`upstream_connection_refused`); exhaustion of local resources or a
/// source address this host does not have are the gateway's own (`executor_internal_error`).
pub(crate) fn connect_failure(e: &io::Error) -> ApiError {
    let refused = |reason: &str| {
        ApiError::new(
            ErrorCode::UpstreamConnectionRefused,
            "the destination refused or could not take the connection",
        )
        .with_detail("reason", reason)
    };
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => refused("connection refused"),
        Some(libc::ENETUNREACH) => refused("network unreachable"),
        Some(libc::EHOSTUNREACH) => refused("host unreachable"),
        Some(libc::ECONNRESET) | Some(libc::ECONNABORTED) => refused("connection reset"),
        // The kernel gave up retransmitting SYNs before our own limit fired.
        Some(libc::ETIMEDOUT) => ApiError::timeout(
            ErrorCode::UpstreamConnectTimeout,
            TimeoutType::Connect,
            "connecting to the destination timed out",
        )
        .with_detail("stage", Stage::Connect.as_str()),
        Some(libc::EADDRNOTAVAIL) | Some(libc::EADDRINUSE) => {
            internal("no local address or port is available for the egress connection")
        }
        Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOBUFS) | Some(libc::ENOMEM) => {
            internal("the egress executor is out of sockets or memory")
        }
        _ => refused("connect failed"),
    }
}

/// `executor_internal_error` with a fixed message.
pub(crate) fn internal(message: &str) -> ApiError {
    ApiError::new(ErrorCode::ExecutorInternalError, message)
}

/// `upstream_tls_failure` for a failed handshake or a TLS error after it, with a safe reason.
pub(crate) fn tls_failure(e: &io::Error) -> ApiError {
    ApiError::new(
        ErrorCode::UpstreamTlsFailure,
        "the TLS session with the destination failed",
    )
    .with_detail("reason", tls_reason(e))
}

/// `upstream_tls_failure` of a fingerprinted (BoringSSL) handshake, with BoringSSL's reason
/// (library error codes and alert names; no names or key material).
#[cfg(feature = "fingerprints")]
pub(crate) fn tls_message(reason: &str) -> ApiError {
    ApiError::new(
        ErrorCode::UpstreamTlsFailure,
        "the TLS session with the destination failed",
    )
    .with_detail("reason", reason)
}

/// Whether an IO error carries a TLS protocol or certificate error from rustls.
pub(crate) fn is_tls_error(e: &io::Error) -> bool {
    rustls_error(e).is_some()
}

fn rustls_error(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

/// A short, fixed description of a TLS failure: variant names only, never the names,
/// times or algorithm identifiers some rustls errors carry.
fn tls_reason(e: &io::Error) -> String {
    use rustls::Error as E;
    let Some(err) = rustls_error(e) else {
        return match e.kind() {
            io::ErrorKind::UnexpectedEof => "connection closed during the handshake".into(),
            io::ErrorKind::ConnectionReset => "connection reset during the handshake".into(),
            _ => "transport error during the handshake".into(),
        };
    };
    match err {
        E::InvalidCertificate(c) => format!("invalid certificate: {}", certificate_reason(c)),
        E::AlertReceived(alert) => format!("alert received: {alert:?}"),
        E::NoCertificatesPresented => "no certificate presented".into(),
        E::PeerIncompatible(_) => "peer incompatible".into(),
        E::PeerMisbehaved(_) => "peer misbehaved".into(),
        E::NoApplicationProtocol => "no common application protocol".into(),
        E::DecryptError => "decrypt error".into(),
        E::InvalidMessage(_) | E::InappropriateMessage { .. } => "invalid message".into(),
        E::InappropriateHandshakeMessage { .. } => "unexpected handshake message".into(),
        E::PeerSentOversizedRecord => "oversized record".into(),
        _ => "handshake failed".into(),
    }
}

fn certificate_reason(c: &rustls::CertificateError) -> &'static str {
    use rustls::CertificateError as C;
    match c {
        C::BadEncoding => "BadEncoding",
        C::Expired | C::ExpiredContext { .. } => "Expired",
        C::NotValidYet | C::NotValidYetContext { .. } => "NotValidYet",
        C::Revoked => "Revoked",
        C::UnhandledCriticalExtension => "UnhandledCriticalExtension",
        C::UnknownIssuer => "UnknownIssuer",
        C::UnknownRevocationStatus => "UnknownRevocationStatus",
        C::ExpiredRevocationList | C::ExpiredRevocationListContext { .. } => {
            "ExpiredRevocationList"
        }
        C::BadSignature => "BadSignature",
        C::NotValidForName | C::NotValidForNameContext { .. } => "NotValidForName",
        C::InvalidPurpose | C::InvalidPurposeContext { .. } => "InvalidPurpose",
        C::ApplicationVerificationFailure => "ApplicationVerificationFailure",
        _ => "Other",
    }
}

/// `upstream_reset`: the connection broke or closed before the response was complete.
pub(crate) fn reset(stage: Stage, what: &str) -> ApiError {
    ApiError::new(ErrorCode::UpstreamReset, what).with_detail("stage", stage.as_str())
}

/// `upstream_reset` at the request's write: the connection broke while the request was sent.
pub(crate) fn request_write_broke() -> ApiError {
    reset(
        Stage::RequestWrite,
        "the connection broke while the request was sent",
    )
}

/// `protocol_error` (502) for a response that breaks HTTP/1.1; `side` says who broke it.
pub(crate) fn protocol_error(e: H1Error) -> ApiError {
    ApiError::new(
        ErrorCode::ProtocolError,
        format!("the destination sent a malformed response: {e}"),
    )
    .with_detail("side", "upstream")
    .with_detail("reason", e.as_str())
}

/// `protocol_error` for a response that is well formed but not allowed here.
pub(crate) fn protocol_violation(reason: &'static str, message: &str) -> ApiError {
    ApiError::new(ErrorCode::ProtocolError, message)
        .with_detail("side", "upstream")
        .with_detail("reason", reason)
}

/// `body_too_large` for a response body over the limit; no partial body is returned.
pub(crate) fn response_too_large(limit: usize) -> ApiError {
    ApiError::new(
        ErrorCode::BodyTooLarge,
        format!("the response body is larger than {limit} bytes"),
    )
    .with_detail("direction", "response")
    .with_detail("limit_bytes", limit.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detail<'a>(e: &'a ApiError, key: &str) -> Option<&'a str> {
        e.details
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn connect_errors_map_by_errno() {
        let table: &[(i32, ErrorCode, &str)] = &[
            (
                libc::ECONNREFUSED,
                ErrorCode::UpstreamConnectionRefused,
                "connection refused",
            ),
            (
                libc::ENETUNREACH,
                ErrorCode::UpstreamConnectionRefused,
                "network unreachable",
            ),
            (
                libc::EHOSTUNREACH,
                ErrorCode::UpstreamConnectionRefused,
                "host unreachable",
            ),
            (libc::ETIMEDOUT, ErrorCode::UpstreamConnectTimeout, ""),
            (libc::EADDRNOTAVAIL, ErrorCode::ExecutorInternalError, ""),
            (libc::EMFILE, ErrorCode::ExecutorInternalError, ""),
            (
                libc::EPROTO,
                ErrorCode::UpstreamConnectionRefused,
                "connect failed",
            ),
        ];
        for &(errno, code, reason) in table {
            let e = connect_failure(&io::Error::from_raw_os_error(errno));
            assert_eq!(e.code, code, "errno {errno}");
            if !reason.is_empty() {
                assert_eq!(detail(&e, "reason"), Some(reason), "errno {errno}");
            }
        }
        let e = connect_failure(&io::Error::from_raw_os_error(libc::ETIMEDOUT));
        assert_eq!(e.timeout_type, Some(TimeoutType::Connect));
    }

    #[test]
    fn timeouts_name_code_type_and_stage() {
        let table: &[(Expired, Stage, ErrorCode, TimeoutType)] = &[
            (
                Expired::ConnectAttempt,
                Stage::Connect,
                ErrorCode::UpstreamConnectTimeout,
                TimeoutType::Connect,
            ),
            (
                Expired::Stage(TimeoutType::ResponseHeader),
                Stage::ResponseHeader,
                ErrorCode::TimeoutExceeded,
                TimeoutType::ResponseHeader,
            ),
            (
                Expired::Stage(TimeoutType::Idle),
                Stage::ResponseBody,
                ErrorCode::TimeoutExceeded,
                TimeoutType::Idle,
            ),
            (
                Expired::TotalDeadline,
                Stage::Dns,
                ErrorCode::TimeoutExceeded,
                TimeoutType::TotalDeadline,
            ),
            (
                Expired::TotalDeadline,
                Stage::Connect,
                ErrorCode::TimeoutExceeded,
                TimeoutType::Connect,
            ),
            (
                Expired::TotalDeadline,
                Stage::RequestWrite,
                ErrorCode::TimeoutExceeded,
                TimeoutType::Upload,
            ),
            (
                Expired::TotalDeadline,
                Stage::ResponseHeader,
                ErrorCode::TimeoutExceeded,
                TimeoutType::ResponseHeader,
            ),
            (
                Expired::TotalDeadline,
                Stage::ResponseBody,
                ErrorCode::TimeoutExceeded,
                TimeoutType::Download,
            ),
        ];
        for &(expired, stage, code, ty) in table {
            let e = timeout(expired, stage);
            assert_eq!(e.code, code);
            assert_eq!(e.timeout_type, Some(ty));
            assert_eq!(detail(&e, "timeout_type"), Some(ty.as_str()));
            assert_eq!(detail(&e, "stage"), Some(stage.as_str()));
        }
    }

    #[test]
    fn tls_reasons_are_fixed_strings() {
        let wrap = |e: rustls::Error| io::Error::new(io::ErrorKind::InvalidData, e);
        let table: &[(rustls::Error, &str)] = &[
            (
                rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
                "invalid certificate: UnknownIssuer",
            ),
            (
                rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName),
                "invalid certificate: NotValidForName",
            ),
            (
                rustls::Error::AlertReceived(rustls::AlertDescription::HandshakeFailure),
                "alert received: HandshakeFailure",
            ),
            (
                rustls::Error::NoApplicationProtocol,
                "no common application protocol",
            ),
            (rustls::Error::General("secret".into()), "handshake failed"),
        ];
        for (err, reason) in table {
            let io_err = wrap(err.clone());
            assert!(is_tls_error(&io_err));
            let e = tls_failure(&io_err);
            assert_eq!(e.code, ErrorCode::UpstreamTlsFailure);
            assert_eq!(detail(&e, "reason"), Some(*reason));
        }
        let eof = io::Error::new(io::ErrorKind::UnexpectedEof, "tls handshake eof");
        assert!(!is_tls_error(&eof));
        assert_eq!(
            detail(&tls_failure(&eof), "reason"),
            Some("connection closed during the handshake")
        );
    }

    #[test]
    fn response_errors_carry_side_and_limits() {
        let e = protocol_error(H1Error::BareLf);
        assert_eq!(e.code, ErrorCode::ProtocolError);
        assert_eq!(e.http_status(), 502);
        assert_eq!(detail(&e, "side"), Some("upstream"));
        assert_eq!(detail(&e, "reason"), Some("bare_lf"));
        let e = response_too_large(1024);
        assert_eq!(e.code, ErrorCode::BodyTooLarge);
        assert_eq!(detail(&e, "direction"), Some("response"));
        assert_eq!(detail(&e, "limit_bytes"), Some("1024"));
        let e = dns_failure(&DnsError::Unavailable);
        assert_eq!(e.code, ErrorCode::UpstreamDnsFailure);
        assert_eq!(detail(&e, "reason"), Some("resolver unavailable"));
    }
}
