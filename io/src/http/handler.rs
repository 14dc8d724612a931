//! The [`Handler`] trait: what an API, admin or proxy listener plugs into the server.

use sortie_core::error::admin_error_json;

use super::body::Body;
use super::config::DEFAULT_MAX_BODY_BYTES;
use super::request::RequestParts;
use super::response::Response;

/// A request [`Handler::admit`] let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted<A> {
    /// Most body bytes the handler will read.
    pub body_limit: u64,
    /// Handed to [`Handler::handle`].
    pub admission: A,
}

impl Admitted<()> {
    /// Admission with the server's default body limit and nothing to hand on.
    pub fn with_default_limit() -> Admitted<()> {
        Admitted {
            body_limit: DEFAULT_MAX_BODY_BYTES,
            admission: (),
        }
    }
}

/// Answers the requests of one listener on one core.
///
/// Handlers are per core and `!Send`: the server calls them from the connection's task on the
/// core that accepted it.
// The lint warns that callers cannot require the futures to be `Send`; per-core handlers are
// never sent to another thread, so there is nothing to require.
#[allow(async_fn_in_trait)]
pub trait Handler: 'static {
    /// What [`Handler::admit`] learned from the head and hands to [`Handler::handle`], such as
    /// the identity a token authenticated, so that nothing is checked twice; `()` when there is
    /// nothing to pass.
    type Admission;

    /// Admits a request from its head alone, choosing its body limit, or rejects it before any
    /// body byte is read (and before `100 Continue` is sent).
    ///
    /// A declared `Content-Length` above the limit is answered 413 by the server without
    /// calling [`Handler::handle`]; a chunked body that grows past it fails the body read with
    /// [`super::BodyError::TooLarge`].
    fn admit(&self, req: &RequestParts) -> Result<Admitted<Self::Admission>, Response>;

    /// Answers one admitted request. The body is read through `body`; reading it sends the
    /// `100 Continue` a client may be waiting for.
    async fn handle(
        &self,
        req: &RequestParts,
        admission: Self::Admission,
        body: &mut Body<'_>,
    ) -> Response;

    /// The response to a request the server rejects itself: a malformed or oversized head or
    /// body (the [`sortie_core::h1::H1Error`] status), a timeout (408), too many connections
    /// (503). `reason` is a stable snake_case name such as `bare_lf` or `request_timeout`.
    fn error_response(&self, status: u16, reason: &'static str) -> Response {
        Response::json(status, admin_error_json(reason))
    }
}

/// A handler for the server's own tests: admits every request with the default body limit and
/// answers `204` to each.
#[cfg(test)]
pub(crate) struct Minimal;

#[cfg(test)]
impl Handler for Minimal {
    type Admission = ();

    fn admit(&self, _req: &RequestParts) -> Result<Admitted<()>, Response> {
        Ok(Admitted::with_default_limit())
    }

    async fn handle(&self, _req: &RequestParts, _: (), _body: &mut Body<'_>) -> Response {
        Response::new(204)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let head = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        let parts = match sortie_core::h1::parse_request_head(head, &Default::default()) {
            Ok(sortie_core::h1::Parsed::Complete { head, .. }) => {
                RequestParts::from_head(&head, "127.0.0.1:1".parse().unwrap())
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(
            Minimal.admit(&parts).map(|a| a.body_limit),
            Ok(DEFAULT_MAX_BODY_BYTES)
        );
        let r = Minimal.error_response(400, "bare_lf");
        assert_eq!(r.status, 400);
        assert_eq!(
            r.body,
            super::super::ResponseBody::Full(br#"{"error":"bare_lf"}"#[..].into())
        );
        assert_eq!(r.header("content-type"), Some(&b"application/json"[..]));
    }
}
