//! [`Body`]: the request body as a handler reads it, streaming from the connection's read
//! buffer through the sans-IO [`BodyDecoder`].
//!
//! On the per-request path: one allocation per chunk read, no logging.

use bytes::Bytes;
use sortie_core::h1::{BodyDecoder, BodyFraming, H1Error};

use super::conn::ConnIo;

/// The interim response sent when a handler starts reading a body the client holds back
/// (RFC 9110 §10.1.1).
pub(crate) const CONTINUE_RESPONSE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
/// [`Body::read_to_end`] reserves at most this much up front, whatever Content-Length claims,
/// so that a large declared length does not allocate before the bytes arrive.
const MAX_PREALLOCATED_BODY_BYTES: u64 = 1024 * 1024;

/// Why reading a request body failed. Every error ends the connection once the response is
/// written; for errors with a [`BodyError::status`], the server writes that error response
/// itself, whatever the handler returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BodyError {
    /// The body exceeds the handler's limit (413).
    #[error("request body exceeds the size limit")]
    TooLarge,
    /// The body's framing is malformed, for example a bad chunk size (400).
    #[error("malformed request body: {0}")]
    Invalid(H1Error),
    /// No body byte arrived within the body read timeout (408).
    #[error("request body read timed out")]
    TimedOut,
    /// The client closed the connection or it failed before the body ended; no response can
    /// be delivered.
    #[error("connection ended before the request body")]
    Disconnected,
}

impl BodyError {
    /// The status of the error response, or `None` when the client cannot receive one.
    pub fn status(self) -> Option<u16> {
        match self {
            BodyError::TooLarge => Some(413),
            BodyError::Invalid(e) => Some(e.status()),
            BodyError::TimedOut => Some(408),
            BodyError::Disconnected => None,
        }
    }

    /// A stable snake_case name for error bodies and logs.
    pub fn reason(self) -> &'static str {
        match self {
            BodyError::TooLarge => H1Error::BodyTooLarge.as_str(),
            BodyError::Invalid(e) => e.as_str(),
            BodyError::TimedOut => "request_timeout",
            BodyError::Disconnected => "disconnected",
        }
    }
}

impl From<H1Error> for BodyError {
    fn from(e: H1Error) -> Self {
        match e {
            H1Error::BodyTooLarge => BodyError::TooLarge,
            other => BodyError::Invalid(other),
        }
    }
}

/// How a body stands once the handler has returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Every byte of the body has been consumed; the connection may carry another request.
    Complete,
    /// Unread bytes may remain; the connection must close after the response.
    MustClose,
    /// Reading failed; answer the error (if the client can receive it) and close.
    Failed(BodyError),
}

/// The body of one request, read incrementally.
///
/// Reading is what sends `100 Continue` to a client that asked for it, so a handler that rejects
/// a request from its head alone should answer without reading.
pub struct Body<'c> {
    io: &'c mut ConnIo,
    decoder: BodyDecoder,
    framing: BodyFraming,
    is_continue_pending: bool,
    error: Option<BodyError>,
    received: u64,
}

impl std::fmt::Debug for Body<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Body")
            .field("framing", &self.framing)
            .field("received", &self.received)
            .field("is_end", &self.is_end())
            .field("error", &self.error)
            .finish()
    }
}

impl<'c> Body<'c> {
    pub(crate) fn new(
        io: &'c mut ConnIo,
        decoder: BodyDecoder,
        framing: BodyFraming,
        expects_continue: bool,
    ) -> Body<'c> {
        // RFC 9110 §10.1.1: "A server MAY omit sending a 100 (Continue) response if it has
        // already received some or all of the content for the corresponding request".
        let is_continue_pending =
            expects_continue && !decoder.is_done() && io.buffered().is_empty();
        Body {
            io,
            decoder,
            framing,
            is_continue_pending,
            error: None,
            received: 0,
        }
    }

    /// How the body is delimited.
    pub fn framing(&self) -> BodyFraming {
        self.framing
    }

    /// Whether the whole body has been read (always true for a request without a body).
    pub fn is_end(&self) -> bool {
        self.decoder.is_done()
    }

    /// Body bytes read so far (decoded: chunk framing not counted).
    pub fn received(&self) -> u64 {
        self.received
    }

    /// The next piece of the body, `None` at its end. Pieces are at most one read buffer long.
    pub async fn read_chunk(&mut self) -> Result<Option<Bytes>, BodyError> {
        let mut out = Vec::new();
        if self.fill(&mut out).await? {
            Ok(Some(Bytes::from(out)))
        } else {
            Ok(None)
        }
    }

    /// The rest of the body, failing with [`BodyError::TooLarge`] past `limit` bytes (on top of
    /// the limit chosen by [`super::Handler::admit`]).
    pub async fn read_to_end(&mut self, limit: u64) -> Result<Vec<u8>, BodyError> {
        let declared = match self.framing {
            BodyFraming::ContentLength(n) => n.saturating_sub(self.received),
            BodyFraming::None | BodyFraming::Chunked => 0,
        };
        let reserve = declared.min(limit).min(MAX_PREALLOCATED_BODY_BYTES);
        let mut out = Vec::with_capacity(usize::try_from(reserve).unwrap_or(0));
        while self.fill(&mut out).await? {
            if out.len() as u64 > limit {
                return Err(self.fail(BodyError::TooLarge));
            }
        }
        Ok(out)
    }

    /// Decodes the buffered body bytes into `out`, without reading: `Some(true)` when data was
    /// appended, `Some(false)` at the end of the body, `None` when a read must come first.
    fn take_buffered(&mut self, out: &mut Vec<u8>) -> Result<Option<bool>, BodyError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        loop {
            if self.decoder.is_done() {
                return Ok(Some(false));
            }
            let input = self.io.buffered();
            if input.is_empty() {
                return Ok(None);
            }
            let before = out.len();
            let progress = self
                .decoder
                .decode(input, &mut |data| out.extend_from_slice(data));
            let progress = match progress {
                Ok(p) => p,
                Err(e) => return Err(self.fail(BodyError::from(e))),
            };
            self.io.consume(progress.consumed);
            let added = out.len().saturating_sub(before);
            if added > 0 {
                self.received = self.received.saturating_add(added as u64);
                return Ok(Some(true));
            }
            // Only framing bytes (a chunk-size line, a trailer) were consumed. The decoder
            // takes all of its input unless the body ended, so the buffer is now empty or the
            // body is done.
            if progress.consumed == 0 {
                return Ok(None);
            }
        }
    }

    /// Decodes body bytes into `out`, reading from the socket when nothing is buffered.
    /// Returns `true` when data was appended and `false` at the end of the body.
    async fn fill(&mut self, out: &mut Vec<u8>) -> Result<bool, BodyError> {
        loop {
            if let Some(more) = self.take_buffered(out)? {
                return Ok(more);
            }
            if self.is_continue_pending {
                self.is_continue_pending = false;
                if self.io.write_all_timed(CONTINUE_RESPONSE).await.is_err() {
                    return Err(self.fail(BodyError::Disconnected));
                }
            }
            self.io.prepare_body_read();
            let timeout = self.io.cfg.body_read_timeout;
            match crate::timer::within_for(timeout, self.io.read_more()).await {
                None => return Err(self.fail(BodyError::TimedOut)),
                Some(Ok(0)) | Some(Err(_)) => return Err(self.fail(BodyError::Disconnected)),
                Some(Ok(_)) => {}
            }
        }
    }

    fn fail(&mut self, e: BodyError) -> BodyError {
        self.error = Some(e);
        e
    }

    /// What [`Body::settle`] comes to without reading, when that is known: the body read whole
    /// (the common case: a request without one, or a handler that read it), failed, or too
    /// much to drain; `None` when bytes must be read and discarded first. The connection asks
    /// this before it makes the future of `settle`.
    pub(crate) fn settled_now(&self, max_drain: u64, is_closing: bool) -> Option<Settled> {
        if let Some(e) = self.error {
            return Some(Settled::Failed(e));
        }
        if self.decoder.is_done() {
            return Some(Settled::Complete);
        }
        if self.is_continue_pending || is_closing {
            return Some(Settled::MustClose);
        }
        if let BodyFraming::ContentLength(n) = self.framing {
            if n.saturating_sub(self.received) > max_drain {
                return Some(Settled::MustClose);
            }
        }
        None
    }

    /// [`Body::read_to_end`] when the rest of the body is in the buffer already (a request API
    /// envelope nearly always is: it comes with its head), decoded without a future; `None`,
    /// with nothing taken, when a read must come first.
    pub fn take_to_end(&mut self, limit: u64) -> Option<Result<Vec<u8>, BodyError>> {
        let rest = match self.framing {
            BodyFraming::ContentLength(n) => n.saturating_sub(self.received),
            BodyFraming::None => 0,
            BodyFraming::Chunked => return None,
        };
        if self.error.is_some() || (self.io.buffered().len() as u64) < rest {
            return None;
        }
        let mut out = Vec::with_capacity(usize::try_from(rest.min(limit)).unwrap_or(0));
        loop {
            match self.take_buffered(&mut out) {
                Ok(Some(true)) if out.len() as u64 > limit => {
                    return Some(Err(self.fail(BodyError::TooLarge)))
                }
                Ok(Some(true)) => {}
                Ok(Some(false)) => return Some(Ok(out)),
                // The buffer held the whole length: the decoder cannot want more.
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// Brings the body to a state where the connection can continue or must close: after an
    /// error, nothing more; with `100 Continue` never sent, close (the client may or may not
    /// send the body); otherwise discard up to `max_drain` unread bytes.
    pub(crate) async fn settle(&mut self, max_drain: u64, is_closing: bool) -> Settled {
        if let Some(settled) = self.settled_now(max_drain, is_closing) {
            return settled;
        }
        let mut scratch = Vec::new();
        let mut drained = 0u64;
        loop {
            scratch.clear();
            match self.fill(&mut scratch).await {
                Ok(true) => {
                    drained = drained.saturating_add(scratch.len() as u64);
                    if drained > max_drain {
                        return Settled::MustClose;
                    }
                }
                Ok(false) => return Settled::Complete,
                // A body the handler did not want fails only the connection, not its answer.
                Err(_) => return Settled::MustClose,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_statuses_and_reasons() {
        let table: &[(BodyError, Option<u16>, &str)] = &[
            (BodyError::TooLarge, Some(413), "body_too_large"),
            (
                BodyError::Invalid(H1Error::InvalidChunkSize),
                Some(400),
                "invalid_chunk_size",
            ),
            (
                BodyError::Invalid(H1Error::TrailersTooLarge),
                Some(431),
                "trailers_too_large",
            ),
            (BodyError::TimedOut, Some(408), "request_timeout"),
            (BodyError::Disconnected, None, "disconnected"),
        ];
        for (e, status, reason) in table {
            assert_eq!(e.status(), *status, "{e:?}");
            assert_eq!(e.reason(), *reason, "{e:?}");
        }
        assert_eq!(BodyError::from(H1Error::BodyTooLarge), BodyError::TooLarge);
        assert_eq!(
            BodyError::from(H1Error::UnterminatedChunk),
            BodyError::Invalid(H1Error::UnterminatedChunk)
        );
    }
}
