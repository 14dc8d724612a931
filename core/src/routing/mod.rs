//! Routing: rule selection, worker eligibility and selection, sticky pins.

mod hints;

pub use hints::{CountryCode, Ingress, RouteHints};
