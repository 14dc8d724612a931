//! The control plane of one process: shared state, per-core context, and the API handlers.

pub mod admin;
pub mod api;
pub mod core;
pub mod openapi;
pub mod proxy;
pub mod state;
pub mod web;
