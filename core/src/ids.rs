//! ids
