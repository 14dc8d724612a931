//! The integration tests of `sortie-io`, one test binary with a module per subsystem: the
//! egress client against scripted loopback upstreams (plain, TLS, HTTP/2, through proxies), the
//! HTTP server driven byte by byte from std sockets, the record stores on SQLite and PostgreSQL,
//! and the fingerprinted handshakes. One binary links the dependencies once and shares the
//! fixtures of [`support`] (one PostgreSQL server per run, one resolver pool).
//!
//! Run one module with `cargo test -p sortie-io --test it <module>::`.

mod support;
use support::postgres as pg;
/// The record-store backends and `on_both_backends!`, declared before the modules that use
/// the macro.
#[path = "support/store_backends.rs"]
#[macro_use]
mod store_backends;

mod admin_readiness;
mod egress_connect;
mod egress_h2;
mod egress_http;
mod egress_pool;
mod egress_streaming;
mod egress_timeouts;
mod egress_tls;
mod fingerprint_capture;
mod http_server;
mod http_server_disconnect;
mod http_server_lifecycle;
mod store_cold;
mod store_crash;
mod store_records;
mod upstream_proxy;
