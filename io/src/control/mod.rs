//! The control plane of one process: shared state, per-core context, and the API handlers.

pub mod admin;
pub mod core;
pub mod state;
