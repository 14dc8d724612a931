//! The ingresses: how a client's request enters the gateway and how its answer leaves.
//!
//! - `web.rs`: the API listener's handler, dispatching by path to the request API, the
//!   receipt API, the embedded dashboard and the OpenAPI documents; and the admin listener's.
//! - `api.rs`: `POST /api/v1/requests`: authenticate, decode and validate the envelope, then
//!   dispatch; encode the result.
//! - `proxy.rs`: the forward proxy: absolute-form requests and CONNECT tunnels, then dispatch.
//! - `tunnel.rs`: the byte relay of an open local tunnel (splice when both ends are plain).
//! - `admin.rs`, `dashboard.rs`, `openapi.rs`: the admin API, its dashboard and documents.

mod access;
pub mod admin;
pub mod api;
pub mod dashboard;
pub mod openapi;
pub mod proxy;
mod tunnel;
pub mod web;
