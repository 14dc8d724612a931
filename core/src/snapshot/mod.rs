//! snapshot
