//! Destination policy: which resolved addresses the gateway may connect to.

mod cidr;

pub use cidr::{Cidr, CidrError};
