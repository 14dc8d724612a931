//! etag
