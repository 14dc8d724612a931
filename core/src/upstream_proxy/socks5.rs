//! The client side of a SOCKS5 handshake (RFC 1928) with username/password authentication
//! (RFC 1929), sans IO: [`Socks5Handshake`] says what to write and consumes what was read,
//! until the proxy has connected the destination or refused.
//!
//! With credentials only method `0x02` is offered, without them only `0x00`: a provider that
//! would accept either must not be allowed to drop the username, which carries the session.

use std::net::{IpAddr, SocketAddr};

/// Protocol version byte of every SOCKS5 message (RFC 1928 §3).
const VERSION: u8 = 0x05;
/// RFC 1929 §2: the sub-negotiation's own version.
const AUTH_VERSION: u8 = 0x01;
const METHOD_NONE: u8 = 0x00;
const METHOD_USERPASS: u8 = 0x02;
const METHOD_NO_ACCEPTABLE: u8 = 0xFF;
const CMD_CONNECT: u8 = 0x01;
const ATYP_V4: u8 = 0x01;
const ATYP_DOMAIN: u8 = 0x03;
const ATYP_V6: u8 = 0x04;
/// RFC 1929 §2: ULEN and PLEN are one byte each.
pub const MAX_CREDENTIAL_BYTES: usize = 255;
/// RFC 1928 §5: a domain name is preceded by its length in one byte.
pub const MAX_DOMAIN_BYTES: usize = 255;

/// Where the proxy is asked to connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Socks5Target<'a> {
    /// An address the gateway resolved and checked (`socks5://`, and IP literals).
    Addr(SocketAddr),
    /// A name the proxy resolves (`socks5h://`).
    Name(&'a str, u16),
}

/// Why the handshake failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Socks5Error {
    /// The proxy accepted none of the offered methods (`0xFF`), e.g. it needs credentials
    /// that were not configured, or refuses the ones offered.
    #[error("the SOCKS5 proxy accepted no offered authentication method")]
    NoAcceptableMethod,
    /// RFC 1929 status other than success.
    #[error("the SOCKS5 proxy rejected the credentials")]
    AuthRejected,
    /// A `REP` other than succeeded.
    #[error("the SOCKS5 proxy refused the connection: {}", reply_name(*.0))]
    Reply(u8),
    /// A message that breaks RFC 1928/1929 (wrong version, a method not offered, reserved
    /// byte set, unknown address type).
    #[error("malformed SOCKS5 reply: {0}")]
    Malformed(&'static str),
    /// A username or password over 255 bytes, or an empty username.
    #[error("SOCKS5 credentials must be 1..=255 bytes")]
    BadCredentials,
    /// A destination name over 255 bytes.
    #[error("the destination name is too long for SOCKS5")]
    NameTooLong,
}

/// The fixed name of a `REP` code (RFC 1928 §6).
pub const fn reply_name(rep: u8) -> &'static str {
    match rep {
        0x01 => "general_failure",
        0x02 => "not_allowed_by_ruleset",
        0x03 => "network_unreachable",
        0x04 => "host_unreachable",
        0x05 => "connection_refused",
        0x06 => "ttl_expired",
        0x07 => "command_not_supported",
        0x08 => "address_type_not_supported",
        _ => "unassigned",
    }
}

/// What to do after feeding the bytes read so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Socks5Step {
    /// The message is incomplete: read more.
    NeedMore,
    /// Drop `consumed` bytes from the front of the buffer and write `out`.
    Send {
        /// Bytes of the input taken by the message.
        consumed: usize,
        /// The next message to the proxy.
        out: Vec<u8>,
    },
    /// The proxy connected the destination; `consumed` bytes were its reply and anything after
    /// them is tunnel data.
    Connected {
        /// Bytes of the input taken by the reply.
        consumed: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    MethodSelection,
    AuthReply,
    ConnectReply,
    Done,
}

/// One handshake: `start` gives the greeting, then [`Socks5Handshake::feed`] is called with the
/// unconsumed bytes read from the proxy.
#[derive(Debug)]
pub struct Socks5Handshake {
    state: State,
    auth: Option<Vec<u8>>,
    request: Vec<u8>,
}

impl Socks5Handshake {
    /// Prepares the handshake and returns it with the greeting to write first.
    pub fn start(
        target: Socks5Target<'_>,
        credentials: Option<(&str, &str)>,
    ) -> Result<(Socks5Handshake, Vec<u8>), Socks5Error> {
        let auth = match credentials {
            None => None,
            Some((user, password)) => {
                let (u, p) = (user.as_bytes(), password.as_bytes());
                if u.is_empty() || u.len() > MAX_CREDENTIAL_BYTES || p.len() > MAX_CREDENTIAL_BYTES
                {
                    return Err(Socks5Error::BadCredentials);
                }
                let mut m = Vec::with_capacity(3 + u.len() + p.len());
                m.push(AUTH_VERSION);
                m.push(u.len() as u8);
                m.extend_from_slice(u);
                m.push(p.len() as u8);
                m.extend_from_slice(p);
                Some(m)
            }
        };
        let mut request = vec![VERSION, CMD_CONNECT, 0x00];
        let port = match target {
            Socks5Target::Addr(sa) => {
                match sa.ip() {
                    IpAddr::V4(a) => {
                        request.push(ATYP_V4);
                        request.extend_from_slice(&a.octets());
                    }
                    IpAddr::V6(a) => {
                        request.push(ATYP_V6);
                        request.extend_from_slice(&a.octets());
                    }
                }
                sa.port()
            }
            Socks5Target::Name(name, port) => {
                if name.is_empty() || name.len() > MAX_DOMAIN_BYTES {
                    return Err(Socks5Error::NameTooLong);
                }
                request.push(ATYP_DOMAIN);
                request.push(name.len() as u8);
                request.extend_from_slice(name.as_bytes());
                port
            }
        };
        request.extend_from_slice(&port.to_be_bytes());
        let method = if auth.is_some() {
            METHOD_USERPASS
        } else {
            METHOD_NONE
        };
        let hs = Socks5Handshake {
            state: State::MethodSelection,
            auth,
            request,
        };
        Ok((hs, vec![VERSION, 1, method]))
    }

    /// Consumes the front of `buf` (everything read and not yet consumed).
    pub fn feed(&mut self, buf: &[u8]) -> Result<Socks5Step, Socks5Error> {
        match self.state {
            State::MethodSelection => {
                let [version, method] = match buf.get(..2) {
                    Some(&[v, m]) => [v, m],
                    _ => return Ok(Socks5Step::NeedMore),
                };
                if version != VERSION {
                    return Err(Socks5Error::Malformed("method selection version"));
                }
                match (method, self.auth.take()) {
                    (METHOD_NO_ACCEPTABLE, _) => Err(Socks5Error::NoAcceptableMethod),
                    (METHOD_USERPASS, Some(auth)) => {
                        self.state = State::AuthReply;
                        Ok(Socks5Step::Send {
                            consumed: 2,
                            out: auth,
                        })
                    }
                    (METHOD_NONE, None) => {
                        self.state = State::ConnectReply;
                        Ok(Socks5Step::Send {
                            consumed: 2,
                            out: std::mem::take(&mut self.request),
                        })
                    }
                    _ => Err(Socks5Error::Malformed("a method that was not offered")),
                }
            }
            State::AuthReply => {
                let [version, status] = match buf.get(..2) {
                    Some(&[v, s]) => [v, s],
                    _ => return Ok(Socks5Step::NeedMore),
                };
                // RFC 1929 says 0x01; some servers answer with the SOCKS version instead.
                if version != AUTH_VERSION && version != VERSION {
                    return Err(Socks5Error::Malformed("authentication reply version"));
                }
                if status != 0 {
                    return Err(Socks5Error::AuthRejected);
                }
                self.state = State::ConnectReply;
                Ok(Socks5Step::Send {
                    consumed: 2,
                    out: std::mem::take(&mut self.request),
                })
            }
            State::ConnectReply => {
                let Some(&[version, rep, rsv, atyp]) = buf.get(..4) else {
                    return Ok(Socks5Step::NeedMore);
                };
                if version != VERSION {
                    return Err(Socks5Error::Malformed("reply version"));
                }
                if rep != 0 {
                    // The rest of a failure reply carries nothing we use.
                    return Err(Socks5Error::Reply(rep));
                }
                if rsv != 0 {
                    return Err(Socks5Error::Malformed("reserved byte set"));
                }
                let addr_len = match atyp {
                    ATYP_V4 => 4,
                    ATYP_V6 => 16,
                    ATYP_DOMAIN => match buf.get(4) {
                        Some(&n) => 1 + usize::from(n),
                        None => return Ok(Socks5Step::NeedMore),
                    },
                    _ => return Err(Socks5Error::Malformed("unknown address type")),
                };
                let total = 4 + addr_len + 2;
                if buf.len() < total {
                    return Ok(Socks5Step::NeedMore);
                }
                self.state = State::Done;
                Ok(Socks5Step::Connected { consumed: total })
            }
            State::Done => Err(Socks5Error::Malformed("bytes after the handshake")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a handshake against scripted proxy replies; returns what the client wrote.
    fn run(
        target: Socks5Target<'_>,
        creds: Option<(&str, &str)>,
        replies: &[&[u8]],
    ) -> (Vec<Vec<u8>>, Result<usize, Socks5Error>) {
        let (mut hs, first) = Socks5Handshake::start(target, creds).unwrap();
        let mut written = vec![first];
        for reply in replies {
            // Byte by byte, to prove partial input is handled.
            let mut buf = Vec::new();
            let mut step = Socks5Step::NeedMore;
            for b in reply.iter() {
                buf.push(*b);
                match hs.feed(&buf) {
                    Ok(Socks5Step::NeedMore) => continue,
                    Ok(s) => {
                        step = s;
                        break;
                    }
                    Err(e) => return (written, Err(e)),
                }
            }
            match step {
                Socks5Step::Send { consumed, out } => {
                    assert_eq!(consumed, buf.len());
                    written.push(out);
                }
                Socks5Step::Connected { consumed } => return (written, Ok(consumed)),
                Socks5Step::NeedMore => return (written, Err(Socks5Error::Malformed("short"))),
            }
        }
        (written, Err(Socks5Error::Malformed("unfinished")))
    }

    #[test]
    fn with_credentials_and_a_name() {
        let (w, r) = run(
            Socks5Target::Name("example.com", 443),
            Some(("user-s1", "pw")),
            &[b"\x05\x02", b"\x01\x00", b"\x05\x00\x00\x03\x03abc\x01\xbb"],
        );
        assert_eq!(r, Ok(10));
        assert_eq!(w[0], b"\x05\x01\x02");
        assert_eq!(w[1], b"\x01\x07user-s1\x02pw");
        assert_eq!(w[2], b"\x05\x01\x00\x03\x0bexample.com\x01\xbb");
    }

    #[test]
    fn without_credentials_and_addresses() {
        let (w, r) = run(
            Socks5Target::Addr("127.0.0.1:8080".parse().unwrap()),
            None,
            &[b"\x05\x00", b"\x05\x00\x00\x01\x7f\x00\x00\x01\x1f\x90"],
        );
        assert_eq!(r, Ok(10));
        assert_eq!(
            w,
            [
                &b"\x05\x01\x00"[..],
                b"\x05\x01\x00\x01\x7f\x00\x00\x01\x1f\x90"
            ]
        );
        let (w, r) = run(
            Socks5Target::Addr("[::1]:1".parse().unwrap()),
            None,
            &[
                b"\x05\x00",
                &[&b"\x05\x00\x00\x04"[..], &[0; 16], b"\x00\x01"].concat(),
            ],
        );
        assert_eq!(r, Ok(22));
        assert_eq!(w[1].len(), 22);
    }

    #[test]
    fn failures() {
        let name = Socks5Target::Name("a.test", 80);
        let creds = Some(("u", "p"));
        type Case<'a> = (Option<(&'a str, &'a str)>, &'a [&'a [u8]], Socks5Error);
        let table: &[Case<'_>] = &[
            (creds, &[b"\x05\xff"], Socks5Error::NoAcceptableMethod),
            (None, &[b"\x05\xff"], Socks5Error::NoAcceptableMethod),
            (
                creds,
                &[b"\x05\x00"],
                Socks5Error::Malformed("a method that was not offered"),
            ),
            (
                None,
                &[b"\x05\x02"],
                Socks5Error::Malformed("a method that was not offered"),
            ),
            (
                None,
                &[b"\x04\x00"],
                Socks5Error::Malformed("method selection version"),
            ),
            (
                creds,
                &[b"\x05\x02", b"\x01\x01"],
                Socks5Error::AuthRejected,
            ),
            (
                creds,
                &[b"\x05\x02", b"\x02\x00"],
                Socks5Error::Malformed("authentication reply version"),
            ),
            (
                None,
                &[b"\x05\x00", b"\x05\x05\x00\x01"],
                Socks5Error::Reply(5),
            ),
            (
                None,
                &[b"\x05\x00", b"\x05\x00\x01\x01"],
                Socks5Error::Malformed("reserved byte set"),
            ),
            (
                None,
                &[b"\x05\x00", b"\x05\x00\x00\x09"],
                Socks5Error::Malformed("unknown address type"),
            ),
            (
                None,
                &[b"\x05\x00", b"\x04\x00\x00\x01"],
                Socks5Error::Malformed("reply version"),
            ),
        ];
        for (creds, replies, want) in table {
            let (_, r) = run(name, *creds, replies);
            assert_eq!(r, Err(*want), "{replies:?}");
        }
        assert_eq!(reply_name(5), "connection_refused");
        assert_eq!(reply_name(0x42), "unassigned");
        assert_eq!(
            Socks5Handshake::start(name, Some(("", "p"))).unwrap_err(),
            Socks5Error::BadCredentials
        );
        let long = "a".repeat(256);
        assert_eq!(
            Socks5Handshake::start(name, Some(("u", &long))).unwrap_err(),
            Socks5Error::BadCredentials
        );
        assert_eq!(
            Socks5Handshake::start(Socks5Target::Name(&long, 1), None).unwrap_err(),
            Socks5Error::NameTooLong
        );
    }

    #[test]
    fn done_refuses_more() {
        let (mut hs, _) = Socks5Handshake::start(Socks5Target::Name("a", 1), None).unwrap();
        assert!(matches!(hs.feed(b"\x05\x00"), Ok(Socks5Step::Send { .. })));
        assert_eq!(
            hs.feed(b"\x05\x00\x00\x01\x00\x00\x00\x00\x00\x00"),
            Ok(Socks5Step::Connected { consumed: 10 })
        );
        assert!(hs.feed(b"x").is_err());
    }
}
