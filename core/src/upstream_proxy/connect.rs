//! The HTTP `CONNECT` handshake with an upstream proxy (RFC 9110 §9.3.6), sans IO: the request
//! head with Basic proxy credentials (RFC 7617, RFC 9110 §11.7.2) and the parser of the reply.
//!
//! The reply is parsed by the response codec of `h1` with the method `CONNECT`, so a 2xx ends
//! the HTTP part of the connection at the end of its head (RFC 9112 §6.3 rule 2).

use base64::Engine as _;

use crate::h1::{parse_response_head, write_request_head, HeadLimits, OutgoingBody, Parsed};

/// Interim (1xx) replies skipped before the final one; more means a broken proxy.
pub const MAX_INTERIM_REPLIES: usize = 4;

/// Writes `CONNECT authority HTTP/1.1` with `Host: authority` and, when credentials are given,
/// `Proxy-Authorization: Basic base64(user:password)`. `authority` is `host:port` with IPv6
/// literals in brackets. The user holds no `:` (the snapshot forbids it in templates).
pub fn write_connect_request(
    out: &mut Vec<u8>,
    authority: &str,
    credentials: Option<(&str, &str)>,
) -> Result<(), crate::h1::H1Error> {
    let auth = credentials.map(|(user, password)| {
        let mut plain = Vec::with_capacity(user.len() + 1 + password.len());
        plain.extend_from_slice(user.as_bytes());
        plain.push(b':');
        plain.extend_from_slice(password.as_bytes());
        let mut v = b"Basic ".to_vec();
        v.extend_from_slice(
            base64::engine::general_purpose::STANDARD
                .encode(plain)
                .as_bytes(),
        );
        v
    });
    let fields = auth
        .iter()
        .map(|v| (&b"Proxy-Authorization"[..], v.as_slice()));
    write_request_head(
        out,
        "CONNECT",
        authority,
        authority.as_bytes(),
        fields,
        OutgoingBody::None,
    )
}

/// What a buffer holding the start of a `CONNECT` reply says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectReply {
    /// The final head is not complete yet; read more.
    Partial,
    /// A 2xx: the tunnel is open. `consumed` bytes were the reply's heads; anything after them
    /// is already tunnel data.
    Established {
        /// The status (200..=299).
        status: u16,
        /// Bytes of the buffer taken by the reply.
        consumed: usize,
    },
    /// Any other final status (407 asks for credentials; 502, 503, 403 ... refuse the tunnel).
    Refused {
        /// The status.
        status: u16,
    },
}

/// Why a `CONNECT` reply is unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConnectReplyError {
    /// The head breaks HTTP/1.1.
    #[error("malformed reply to CONNECT: {0}")]
    Malformed(crate::h1::H1Error),
    /// More than [`MAX_INTERIM_REPLIES`] interim replies, or a 101.
    #[error("unexpected interim reply to CONNECT")]
    UnexpectedInterim,
}

/// Parses the proxy's reply to `CONNECT` from the start of `buf`, skipping interim replies.
pub fn parse_connect_reply(buf: &[u8]) -> Result<ConnectReply, ConnectReplyError> {
    let mut at = 0usize;
    for _ in 0..=MAX_INTERIM_REPLIES {
        let rest = buf.get(at..).unwrap_or_default();
        match parse_response_head(rest, "CONNECT", &HeadLimits::RESPONSE) {
            Ok(Parsed::Partial) => return Ok(ConnectReply::Partial),
            Ok(Parsed::Complete { head, consumed_len }) => {
                if head.is_switching_protocols() {
                    return Err(ConnectReplyError::UnexpectedInterim);
                }
                if head.is_informational() {
                    at = at.saturating_add(consumed_len);
                    continue;
                }
                let status = head.status();
                return Ok(if (200..300).contains(&status) {
                    ConnectReply::Established {
                        status,
                        consumed: at.saturating_add(consumed_len).min(buf.len()),
                    }
                } else {
                    ConnectReply::Refused { status }
                });
            }
            Err(e) => return Err(ConnectReplyError::Malformed(e)),
        }
    }
    Err(ConnectReplyError::UnexpectedInterim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads() {
        let mut out = Vec::new();
        write_connect_request(&mut out, "example.com:443", Some(("user-US", "p:w"))).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\
             Proxy-Authorization: Basic dXNlci1VUzpwOnc=\r\n\r\n"
        );
        let mut out = Vec::new();
        write_connect_request(&mut out, "[::1]:80", None).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "CONNECT [::1]:80 HTTP/1.1\r\nHost: [::1]:80\r\n\r\n"
        );
    }

    #[test]
    fn replies() {
        let table: &[(&[u8], Result<ConnectReply, ConnectReplyError>)] = &[
            (b"", Ok(ConnectReply::Partial)),
            (
                b"HTTP/1.1 200 Connection established\r\n",
                Ok(ConnectReply::Partial),
            ),
            (
                b"HTTP/1.1 200 Connection established\r\n\r\n",
                Ok(ConnectReply::Established {
                    status: 200,
                    consumed: 39,
                }),
            ),
            (
                b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello",
                Ok(ConnectReply::Established {
                    status: 200,
                    consumed: 38,
                }),
            ),
            (
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
                Ok(ConnectReply::Established {
                    status: 204,
                    consumed: 52,
                }),
            ),
            (
                b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic\r\n\r\n",
                Ok(ConnectReply::Refused { status: 407 }),
            ),
            (
                b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 100\r\n\r\npartial",
                Ok(ConnectReply::Refused { status: 502 }),
            ),
            (
                b"HTTP/1.1 101 Switching\r\n\r\n",
                Err(ConnectReplyError::UnexpectedInterim),
            ),
            (
                b"HTTP/1.1 100 A\r\n\r\nHTTP/1.1 100 A\r\n\r\nHTTP/1.1 100 A\r\n\r\n\
                  HTTP/1.1 100 A\r\n\r\nHTTP/1.1 100 A\r\n\r\nHTTP/1.1 200 OK\r\n\r\n",
                Err(ConnectReplyError::UnexpectedInterim),
            ),
        ];
        for (input, want) in table {
            assert_eq!(
                &parse_connect_reply(input),
                want,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
        assert!(matches!(
            parse_connect_reply(b"SSH-2.0-OpenSSH\r\n\r\n"),
            Err(ConnectReplyError::Malformed(_))
        ));
        assert!(matches!(
            parse_connect_reply(b"HTTP/1.1 200 OK\n\n"),
            Err(ConnectReplyError::Malformed(_))
        ));
    }
}
