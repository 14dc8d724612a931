//! State shared by every core of a control process and the services on it: the active
//! configuration and worker registry (`state`), following the shared store (`follow`), presence
//! and recovery across controls (`presence`), admission limits (`admission`), the per-core
//! active-request table and mailbox (`core`), and the receipt service (`receipts`).
//!
//! Nothing here handles a client request's way through the gateway: the ingresses are in
//! `crate::ingress`, routing and execution in `crate::dispatch`.

pub mod admission;
pub mod core;
pub mod follow;
pub mod presence;
pub mod receipts;
pub mod state;
