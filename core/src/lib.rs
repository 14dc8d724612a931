//! Sans-IO decisions of the Sortie egress gateway.
//!
//! Nothing in this crate performs IO or reads a clock: time, randomness and bytes are inputs,
//! decisions are outputs. That keeps every rule deterministic, unit-testable and fuzzable.

#![forbid(unsafe_code)]
// Nothing a client, worker or upstream sends may panic the process: no unwrap, expect, panic
// or index that could fail outside tests (clock reads are refused by `core/clippy.toml`).
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod ascii;
pub mod bus;
pub mod config;
pub mod config_id;
pub mod decimal;
pub mod destination;
pub mod dispatch;
pub mod error;
pub mod etag;
pub mod fingerprint;
pub mod h1;
pub mod hex;
pub mod hints;
pub mod ids;
pub mod json;
pub mod limits;
pub mod provider_session;
pub mod proxy;
pub mod receipt;
pub mod rendezvous;
pub mod request;
pub mod result;
pub mod routing;
pub mod snapshot;
pub mod upstream_proxy;
pub mod worker;

/// A map looked up on the per-request path (the connection pool, metrics, the routing table,
/// the bus's streams and lanes): seeded foldhash, which costs a fraction of SipHash on these
/// short keys. Build one with `FastMap::default()`.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// The set counterpart of [`FastMap`], for sets looked up on the same paths. Build one with
/// `FastSet::default()`.
pub type FastSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;
