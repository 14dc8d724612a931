//! Why an HTTP/1.1 head or body was rejected, with the status a server answers.

/// A violation of HTTP/1.1 message syntax or framing, or of one of our limits.
///
/// Every variant means the connection must be closed after the error response (if any) has been
/// written: once framing is in doubt, bytes that follow cannot be trusted to start a new
/// message (RFC 9112 §6.3, §11.2).
///
/// [`H1Error::status`] is the status a server answers when a *request* fails with the error.
/// When an upstream *response* fails to parse, the status does not apply: the client maps any
/// `H1Error` to its own upstream error instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum H1Error {
    /// The head did not end within the head byte limit.
    #[error("message head exceeds the size limit")]
    HeadTooLarge,
    /// The head has more header fields than the limit allows.
    #[error("message head has too many header fields")]
    TooManyHeaders,
    /// The request-target exceeds its length limit.
    #[error("request-target exceeds the length limit")]
    TargetTooLong,
    /// A line ends in LF without the CR before it.
    #[error("line ends in a bare LF")]
    BareLf,
    /// A CR is not followed by LF.
    #[error("CR not followed by LF")]
    BareCr,
    /// A field line starts with whitespace (obsolete line folding).
    #[error("obsolete line folding in a field line")]
    ObsFold,
    /// Whitespace between a field name and its colon.
    #[error("whitespace between field name and colon")]
    WhitespaceBeforeColon,
    /// A field name is empty or holds a byte outside `tchar`.
    #[error("invalid field name")]
    InvalidHeaderName,
    /// A field value holds a control byte.
    #[error("invalid field value")]
    InvalidHeaderValue,
    /// The method is not a token.
    #[error("invalid method")]
    InvalidMethod,
    /// The request-target is empty, holds a byte outside visible ASCII, or has a form the
    /// method does not allow.
    #[error("invalid request-target")]
    InvalidTarget,
    /// The HTTP-version is not of the form `HTTP/DIGIT.DIGIT`.
    #[error("malformed HTTP version")]
    InvalidVersion,
    /// The HTTP-version is well formed but neither 1.0 nor 1.1.
    #[error("unsupported HTTP version")]
    UnsupportedVersion,
    /// The status line of a response is malformed or its code is outside 100..=599.
    #[error("invalid status line")]
    InvalidStatus,
    /// An HTTP/1.1 request has no Host field.
    #[error("HTTP/1.1 request without Host")]
    MissingHost,
    /// A request has more than one Host field line.
    #[error("more than one Host field")]
    DuplicateHost,
    /// The Host field value is not `uri-host [ ":" port ]`.
    #[error("invalid Host field value")]
    InvalidHost,
    /// A request has both Content-Length and Transfer-Encoding.
    #[error("both Content-Length and Transfer-Encoding")]
    ContentLengthWithTransferEncoding,
    /// Content-Length is given more than once (or as a list) in a request, or with differing
    /// values in a response.
    #[error("duplicate Content-Length")]
    DuplicateContentLength,
    /// Content-Length is not a decimal number that fits in 64 bits.
    #[error("invalid Content-Length")]
    InvalidContentLength,
    /// Transfer-Encoding is empty, does not end in `chunked`, or applies `chunked` twice.
    #[error("invalid Transfer-Encoding")]
    InvalidTransferEncoding,
    /// Transfer-Encoding names a coding other than `chunked`.
    #[error("unsupported transfer coding")]
    UnsupportedTransferCoding,
    /// An HTTP/1.0 message carries Transfer-Encoding.
    #[error("Transfer-Encoding in an HTTP/1.0 message")]
    TransferEncodingInHttp10,
    /// Expect names something other than `100-continue`.
    #[error("unsupported expectation")]
    UnsupportedExpectation,
    /// A chunk-size is empty or not hexadecimal.
    #[error("invalid chunk size")]
    InvalidChunkSize,
    /// A chunk-size has more hex digits than fit in 64 bits.
    #[error("chunk size has too many digits")]
    ChunkSizeTooLong,
    /// A chunk extension does not follow the `chunk-ext` grammar.
    #[error("invalid chunk extension")]
    InvalidChunkExtension,
    /// Chunk extensions of one body exceed their byte limit.
    #[error("chunk extensions exceed the size limit")]
    ChunkExtensionsTooLarge,
    /// Chunk data is not followed by CRLF.
    #[error("chunk data not followed by CRLF")]
    UnterminatedChunk,
    /// A trailer field line is malformed.
    #[error("invalid trailer field")]
    InvalidTrailer,
    /// The trailer section exceeds its byte limit.
    #[error("trailer section exceeds the size limit")]
    TrailersTooLarge,
    /// The body exceeds the body size limit.
    #[error("body exceeds the size limit")]
    BodyTooLarge,
}

impl H1Error {
    /// The status a server answers when a request fails with this error.
    ///
    /// `InvalidStatus` cannot come from a request; it answers 502 because only an upstream
    /// response produces it.
    pub const fn status(self) -> u16 {
        match self {
            H1Error::HeadTooLarge | H1Error::TooManyHeaders | H1Error::TrailersTooLarge => 431,
            H1Error::TargetTooLong => 414,
            H1Error::UnsupportedVersion => 505,
            H1Error::UnsupportedTransferCoding => 501,
            H1Error::UnsupportedExpectation => 417,
            H1Error::BodyTooLarge => 413,
            H1Error::InvalidStatus => 502,
            H1Error::BareLf
            | H1Error::BareCr
            | H1Error::ObsFold
            | H1Error::WhitespaceBeforeColon
            | H1Error::InvalidHeaderName
            | H1Error::InvalidHeaderValue
            | H1Error::InvalidMethod
            | H1Error::InvalidTarget
            | H1Error::InvalidVersion
            | H1Error::MissingHost
            | H1Error::DuplicateHost
            | H1Error::InvalidHost
            | H1Error::ContentLengthWithTransferEncoding
            | H1Error::DuplicateContentLength
            | H1Error::InvalidContentLength
            | H1Error::InvalidTransferEncoding
            | H1Error::TransferEncodingInHttp10
            | H1Error::InvalidChunkSize
            | H1Error::ChunkSizeTooLong
            | H1Error::InvalidChunkExtension
            | H1Error::ChunkExtensionsTooLarge
            | H1Error::UnterminatedChunk
            | H1Error::InvalidTrailer => 400,
        }
    }

    /// A short stable name for logs and metrics labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            H1Error::HeadTooLarge => "head_too_large",
            H1Error::TooManyHeaders => "too_many_headers",
            H1Error::TargetTooLong => "target_too_long",
            H1Error::BareLf => "bare_lf",
            H1Error::BareCr => "bare_cr",
            H1Error::ObsFold => "obs_fold",
            H1Error::WhitespaceBeforeColon => "whitespace_before_colon",
            H1Error::InvalidHeaderName => "invalid_header_name",
            H1Error::InvalidHeaderValue => "invalid_header_value",
            H1Error::InvalidMethod => "invalid_method",
            H1Error::InvalidTarget => "invalid_target",
            H1Error::InvalidVersion => "invalid_version",
            H1Error::UnsupportedVersion => "unsupported_version",
            H1Error::InvalidStatus => "invalid_status",
            H1Error::MissingHost => "missing_host",
            H1Error::DuplicateHost => "duplicate_host",
            H1Error::InvalidHost => "invalid_host",
            H1Error::ContentLengthWithTransferEncoding => "content_length_with_transfer_encoding",
            H1Error::DuplicateContentLength => "duplicate_content_length",
            H1Error::InvalidContentLength => "invalid_content_length",
            H1Error::InvalidTransferEncoding => "invalid_transfer_encoding",
            H1Error::UnsupportedTransferCoding => "unsupported_transfer_coding",
            H1Error::TransferEncodingInHttp10 => "transfer_encoding_in_http10",
            H1Error::UnsupportedExpectation => "unsupported_expectation",
            H1Error::InvalidChunkSize => "invalid_chunk_size",
            H1Error::ChunkSizeTooLong => "chunk_size_too_long",
            H1Error::InvalidChunkExtension => "invalid_chunk_extension",
            H1Error::ChunkExtensionsTooLarge => "chunk_extensions_too_large",
            H1Error::UnterminatedChunk => "unterminated_chunk",
            H1Error::InvalidTrailer => "invalid_trailer",
            H1Error::TrailersTooLarge => "trailers_too_large",
            H1Error::BodyTooLarge => "body_too_large",
        }
    }

    /// Every variant, for exhaustive tests of the tables above.
    pub const ALL: &'static [H1Error] = &[
        H1Error::HeadTooLarge,
        H1Error::TooManyHeaders,
        H1Error::TargetTooLong,
        H1Error::BareLf,
        H1Error::BareCr,
        H1Error::ObsFold,
        H1Error::WhitespaceBeforeColon,
        H1Error::InvalidHeaderName,
        H1Error::InvalidHeaderValue,
        H1Error::InvalidMethod,
        H1Error::InvalidTarget,
        H1Error::InvalidVersion,
        H1Error::UnsupportedVersion,
        H1Error::InvalidStatus,
        H1Error::MissingHost,
        H1Error::DuplicateHost,
        H1Error::InvalidHost,
        H1Error::ContentLengthWithTransferEncoding,
        H1Error::DuplicateContentLength,
        H1Error::InvalidContentLength,
        H1Error::InvalidTransferEncoding,
        H1Error::UnsupportedTransferCoding,
        H1Error::TransferEncodingInHttp10,
        H1Error::UnsupportedExpectation,
        H1Error::InvalidChunkSize,
        H1Error::ChunkSizeTooLong,
        H1Error::InvalidChunkExtension,
        H1Error::ChunkExtensionsTooLarge,
        H1Error::UnterminatedChunk,
        H1Error::InvalidTrailer,
        H1Error::TrailersTooLarge,
        H1Error::BodyTooLarge,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_snake_case() {
        let mut seen = HashSet::new();
        for e in H1Error::ALL {
            let name = e.as_str();
            assert!(seen.insert(name), "duplicate name {name}");
            assert!(name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
        }
        assert_eq!(seen.len(), H1Error::ALL.len());
    }

    #[test]
    fn statuses_are_the_documented_set() {
        let allowed = [400, 413, 414, 417, 431, 501, 502, 505];
        for e in H1Error::ALL {
            assert!(
                allowed.contains(&e.status()),
                "{e:?} maps to {}",
                e.status()
            );
        }
        let table = [
            (H1Error::HeadTooLarge, 431),
            (H1Error::TooManyHeaders, 431),
            (H1Error::TargetTooLong, 414),
            (H1Error::UnsupportedVersion, 505),
            (H1Error::InvalidVersion, 400),
            (H1Error::UnsupportedTransferCoding, 501),
            (H1Error::UnsupportedExpectation, 417),
            (H1Error::BodyTooLarge, 413),
            (H1Error::BareLf, 400),
            (H1Error::DuplicateContentLength, 400),
        ];
        for (e, status) in table {
            assert_eq!(e.status(), status, "{e:?}");
        }
    }

    #[test]
    fn display_is_a_phrase() {
        assert_eq!(H1Error::BareLf.to_string(), "line ends in a bare LF");
        for e in H1Error::ALL {
            assert!(!e.to_string().is_empty());
        }
    }
}
