//! IO shell of the Sortie egress gateway: everything that touches a socket, a file or a clock.
//! Decisions are made by `sortie-core`; this crate drives it.

pub mod alloc;
pub mod bus;
pub mod clock;
pub mod control;
pub mod dispatch;
pub mod dns;
pub mod egress;
mod fd;
pub mod http;
pub mod ingress;
pub mod metrics;
pub mod remote;
pub mod runtime;
mod send_ahead;
pub mod serve;
mod splice;
pub mod store;
pub mod systemd;
#[cfg(test)]
mod testing;
pub(crate) mod timer;
pub mod tokens;
pub mod upgrade;
pub mod worker;
