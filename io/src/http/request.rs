//! [`RequestParts`]: an owned, compact copy of a parsed request head that a handler keeps across
//! awaits while the connection's read buffer moves on.
//!
//! On the per-request path: three allocations per request (text, values, spans), no logging.

use std::net::SocketAddr;
use std::ops::Range;

#[cfg(test)]
use sortie_core::h1::RequestHead;
use sortie_core::h1::{BodyFraming, RequestStart, TargetForm, Version};

/// Where one header field's name and value live in a [`RequestParts`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldSpan {
    name: Range<usize>,
    value: Range<usize>,
}

/// The head of one request, owned.
///
/// Method, target and header names are ASCII (the parser checked them) and share one string;
/// header values share one byte vector, because a value may hold obs-text bytes that are not
/// UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestParts {
    text: String,
    values: Vec<u8>,
    method_end: usize,
    fields: Vec<FieldSpan>,
    target_form: TargetForm,
    version: Version,
    framing: BodyFraming,
    is_keep_alive: bool,
    expects_continue: bool,
    peer: SocketAddr,
}

impl RequestParts {
    /// Copies a parsed head into new parts. For tests: a connection refills the parts of its
    /// busy period instead ([`RequestParts::fill`]).
    #[cfg(test)]
    pub fn from_head(head: &RequestHead<'_>, peer: SocketAddr) -> RequestParts {
        let mut parts = RequestParts::empty(peer);
        let fields = head.headers().iter().map(|h| (h.name(), h.value()));
        parts.fill(head.start(), fields, peer);
        parts
    }

    /// Parts holding no request yet: allocate nothing until [`RequestParts::fill`]ed.
    pub fn empty(peer: SocketAddr) -> RequestParts {
        RequestParts {
            text: String::new(),
            values: Vec::new(),
            method_end: 0,
            fields: Vec::new(),
            target_form: TargetForm::Origin,
            version: Version::Http11,
            framing: BodyFraming::None,
            is_keep_alive: true,
            expects_continue: false,
            peer,
        }
    }

    /// Replaces these parts with a copy of a parsed head (`start` and its `fields` in order,
    /// as [`sortie_core::h1::parse_request_head_with`] lends them), reusing their buffers: a
    /// connection copies each of its requests into the same parts, so that only its first
    /// requests grow them. One pass over the fields: the buffers keep their size from request
    /// to request, so sizing them first would cost every request a pass for the first one's
    /// sake.
    pub fn fill<'f>(
        &mut self,
        start: &RequestStart<'_>,
        fields: impl Iterator<Item = (&'f str, &'f [u8])>,
        peer: SocketAddr,
    ) {
        self.text.clear();
        self.values.clear();
        self.fields.clear();
        self.text.push_str(start.method());
        self.method_end = self.text.len();
        self.text.push_str(start.target());
        for (name, value) in fields {
            let name_start = self.text.len();
            self.text.push_str(name);
            let value_start = self.values.len();
            self.values.extend_from_slice(value);
            self.fields.push(FieldSpan {
                name: name_start..self.text.len(),
                value: value_start..self.values.len(),
            });
        }
        self.target_form = start.target_form();
        self.version = start.version();
        self.framing = start.framing();
        self.is_keep_alive = start.is_keep_alive();
        self.expects_continue = start.expects_continue();
        self.peer = peer;
    }

    /// The method token, case preserved.
    pub fn method(&self) -> &str {
        self.text.get(..self.method_end).unwrap_or_default()
    }

    /// Whether this is a HEAD request (the response carries headers only).
    pub fn is_head(&self) -> bool {
        self.method() == "HEAD"
    }

    /// The request-target as sent.
    pub fn target(&self) -> &str {
        let end = self
            .fields
            .first()
            .map_or(self.text.len(), |f| f.name.start);
        self.text.get(self.method_end..end).unwrap_or_default()
    }

    /// The path part of an origin-form target (the target up to `?`).
    pub fn path(&self) -> &str {
        let target = self.target();
        match query_mark(target) {
            Some(at) => target.get(..at).unwrap_or(target),
            None => target,
        }
    }

    /// The query of the target, without the `?`.
    pub fn query(&self) -> Option<&str> {
        let target = self.target();
        target.get(query_mark(target)? + 1..)
    }

    /// Which form the target has.
    pub fn target_form(&self) -> TargetForm {
        self.target_form
    }

    /// The protocol version of the request.
    pub fn version(&self) -> Version {
        self.version
    }

    /// How the request body is delimited.
    pub fn framing(&self) -> BodyFraming {
        self.framing
    }

    /// Whether the client allows the connection to carry another request.
    pub fn is_keep_alive(&self) -> bool {
        self.is_keep_alive
    }

    /// Whether the client waits for `100 Continue` before sending the body.
    pub fn expects_continue(&self) -> bool {
        self.expects_continue
    }

    /// The client's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Number of header field lines.
    pub fn header_count(&self) -> usize {
        self.fields.len()
    }

    /// Every header field in received order, names as sent.
    pub fn headers(&self) -> impl Iterator<Item = (&str, &[u8])> + '_ {
        self.fields.iter().map(|f| self.field(f))
    }

    /// The value of the first field named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|f| self.is_named(f, name))
            .map(|f| self.values.get(f.value.clone()).unwrap_or_default())
    }

    /// The values of every field named `name` (case-insensitive), in received order.
    pub fn header_values<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'s [u8]> + 's {
        self.fields
            .iter()
            .filter(move |f| self.is_named(f, name))
            .map(|f| self.values.get(f.value.clone()).unwrap_or_default())
    }

    /// Whether the field is named `name` (case-insensitive). By length first and as bytes: a
    /// request's head is searched several times, and most of its fields differ in length from
    /// the one sought.
    fn is_named(&self, f: &FieldSpan, name: &str) -> bool {
        f.name.len() == name.len()
            && self
                .text
                .as_bytes()
                .get(f.name.clone())
                .is_some_and(|n| n.eq_ignore_ascii_case(name.as_bytes()))
    }

    /// Bytes the parts' buffers hold, used or not.
    pub fn capacity_bytes(&self) -> usize {
        self.text
            .capacity()
            .saturating_add(self.values.capacity())
            .saturating_add(
                self.fields
                    .capacity()
                    .saturating_mul(std::mem::size_of::<FieldSpan>()),
            )
    }

    /// The Host field value, if any.
    pub fn host(&self) -> Option<&[u8]> {
        self.header("host")
    }

    fn field(&self, f: &FieldSpan) -> (&str, &[u8]) {
        (
            self.text.get(f.name.clone()).unwrap_or_default(),
            self.values.get(f.value.clone()).unwrap_or_default(),
        )
    }
}

/// Where the `?` that starts a target's query is. A byte search: `char` pattern searchers cost
/// several times as much, and the request API asks for the path of every request.
fn query_mark(target: &str) -> Option<usize> {
    target.bytes().position(|b| b == b'?')
}

#[cfg(test)]
mod tests {
    use super::*;
    use sortie_core::h1::{parse_request_head, parse_request_head_with, HeadLimits, Parsed};

    fn parts(raw: &[u8]) -> RequestParts {
        match parse_request_head(raw, &HeadLimits::REQUEST) {
            Ok(Parsed::Complete { head, .. }) => {
                RequestParts::from_head(&head, "127.0.0.1:9".parse().unwrap())
            }
            other => panic!("{other:?}"),
        }
    }

    /// Parts refilled by a shorter head hold that head alone, in the buffers of the first.
    #[test]
    fn fill_replaces_the_previous_request() {
        let peer = "127.0.0.1:9".parse().unwrap();
        let long = b"POST /long/target?q=1 HTTP/1.1\r\nHost: a.example\r\nX-1: one\r\n\
                     X-2: two\r\nContent-Length: 2\r\nConnection: close\r\n\r\n";
        let short = b"GET /s HTTP/1.0\r\nHost: b\r\n\r\n";
        let mut p = RequestParts::empty(peer);
        assert_eq!(p.capacity_bytes(), 0);
        // Filled as the connection fills them, from the parser's own fields.
        let refill = |p: &mut RequestParts, raw: &[u8]| {
            let parsed = parse_request_head_with(raw, &HeadLimits::REQUEST, |start, fields| {
                p.fill(start, fields.iter(), peer)
            });
            assert!(matches!(parsed, Ok(Parsed::Complete { .. })), "{raw:?}");
        };
        for raw in [&long[..], &short[..]] {
            refill(&mut p, raw);
        }
        let kept = p.capacity_bytes();
        assert!(kept > 0);
        assert_eq!(p.method(), "GET");
        assert_eq!(p.target(), "/s");
        assert_eq!(p.version(), Version::Http10);
        assert_eq!(p.framing(), BodyFraming::None);
        assert!(!p.is_keep_alive());
        assert_eq!(p.header_count(), 1);
        assert_eq!(p.headers().collect::<Vec<_>>(), [("Host", &b"b"[..])]);
        assert_eq!(p.header("x-1"), None);
        // The same head again fits in what the parts hold.
        refill(&mut p, long);
        assert_eq!(p.capacity_bytes(), kept);
        assert_eq!(p.header("x-2"), Some(&b"two"[..]));
    }

    #[test]
    fn copies_every_part_of_the_head() {
        let p = parts(
            b"POST /a/b?x=1 HTTP/1.1\r\nHost: h.example\r\nX-A: 1\r\nx-a: \xff2\r\n\
              Content-Length: 3\r\nExpect: 100-continue\r\n\r\n",
        );
        assert_eq!(p.method(), "POST");
        assert_eq!(p.target(), "/a/b?x=1");
        assert_eq!(p.path(), "/a/b");
        assert_eq!(p.query(), Some("x=1"));
        assert_eq!(p.target_form(), TargetForm::Origin);
        assert_eq!(p.version(), Version::Http11);
        assert_eq!(p.framing(), BodyFraming::ContentLength(3));
        assert!(p.is_keep_alive());
        assert!(p.expects_continue());
        assert!(!p.is_head());
        assert_eq!(p.host(), Some(&b"h.example"[..]));
        assert_eq!(p.header_count(), 5);
        let xa: Vec<&[u8]> = p.header_values("X-a").collect();
        assert_eq!(xa, vec![&b"1"[..], &b"\xff2"[..]]);
        let names: Vec<&str> = p.headers().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            ["Host", "X-A", "x-a", "Content-Length", "Expect"].to_vec()
        );
        assert_eq!(p.header("missing"), None);
        assert_eq!(p.header("x-b"), None);
        assert_eq!(p.header("X-"), None);
        assert_eq!(p.header("CONTENT-LENGTH"), Some(&b"3"[..]));
        assert_eq!(p.peer().port(), 9);
    }

    #[test]
    fn head_without_fields_and_http10() {
        let p = parts(b"HEAD / HTTP/1.0\r\n\r\n");
        assert!(p.is_head());
        assert_eq!(p.target(), "/");
        assert_eq!(p.query(), None);
        assert_eq!(p.path(), "/");
        let p = parts(b"GET /p? HTTP/1.1\r\nHost: h\r\n\r\n");
        assert_eq!((p.path(), p.query()), ("/p", Some("")));
        let p = parts(b"HEAD / HTTP/1.0\r\n\r\n");
        assert_eq!(p.header_count(), 0);
        assert!(!p.is_keep_alive());
        assert_eq!(p.version(), Version::Http10);
        assert_eq!(p.framing(), BodyFraming::None);
    }
}
