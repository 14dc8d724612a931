//! receipt
