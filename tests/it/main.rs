//! The black-box tests of the `sortie` binary, one test binary with a module per surface: a
//! real `sortie serve` (or `control` / `worker`) process, real loopback upstreams, real
//! sockets, real SQLite files, PostgreSQL and an S3 service where a test needs them. One binary
//! links the dependencies once and shares the fixtures of [`support`] (one PostgreSQL server
//! per run, one resolver pool).
//!
//! Run one module with `cargo test --test it <module>::`, e.g. `cargo test --test it bus::`.

mod support;

mod admin_api;
mod admin_workers;
mod bus;
mod bus_ingress;
mod dashboard;
mod faults;
mod fingerprints;
mod openapi;
mod persistence;
mod proxy;
mod receipts;
mod request_api;
mod serve_disconnect;
mod serve_http;
mod serve_process;
mod shared_store;
mod slow_clients;
mod smuggling;
mod tidy;
mod upgrade;
mod upstream_proxy;
