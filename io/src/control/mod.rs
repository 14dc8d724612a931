//! The control plane of one process: shared state, per-core context, the API handlers and the
//! embedded operator dashboard.

pub mod admin;
pub mod admission;
pub mod api;
pub mod core;
pub mod dashboard;
pub mod follow;
pub mod openapi;
pub mod presence;
pub mod proxy;
pub mod receipts;
pub mod state;
mod streamed;
mod tunnel;
pub mod web;
