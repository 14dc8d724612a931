//! Fixtures of the black-box tests: a real `sortie serve` process and loopback upstreams (the
//! same scripted upstreams and test CA the io crate's egress tests use).
#![allow(dead_code, unreachable_pub)]

pub mod bus;
pub mod gate;
pub mod gateway;
#[path = "../../../io/tests/it/support/postgres.rs"]
pub mod postgres;
#[path = "../../../io/tests/it/support/proxies.rs"]
pub mod proxies;
pub mod proxy;
pub mod receipts;
pub mod s3;
#[path = "../../../io/tests/it/support/tls.rs"]
pub mod tls;
#[path = "../../../io/tests/it/support/upstream.rs"]
pub mod upstream;
#[path = "../../../io/tests/it/support/wait.rs"]
pub mod wait;
