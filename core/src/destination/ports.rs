//! Destination ports no ingress connects to (`control.denied_destination_ports`, decision 103):
//! checked on the port a request names (its URL, an absolute-form target, a CONNECT authority),
//! before routing, so a remote worker or an upstream proxy never sees it either.

use crate::error::{ApiError, ErrorCode};

/// A short list of refused ports, held by value (the per-request limits are `Copy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeniedPorts {
    ports: [u16; DeniedPorts::MAX],
    len: usize,
}

impl DeniedPorts {
    /// Most ports the list holds (`control.denied_destination_ports`).
    pub const MAX: usize = 16;

    /// The list of `ports`, or `None` when there are more than [`DeniedPorts::MAX`].
    pub fn new(ports: &[u16]) -> Option<DeniedPorts> {
        let mut out = DeniedPorts {
            ports: [0; DeniedPorts::MAX],
            len: 0,
        };
        for p in ports {
            *out.ports.get_mut(out.len)? = *p;
            out.len += 1;
        }
        Some(out)
    }

    /// `destination_denied` when `port` is refused, naming the port (reason `port`).
    pub fn check(&self, port: u16) -> Result<(), ApiError> {
        if self
            .ports
            .get(..self.len)
            .unwrap_or_default()
            .contains(&port)
        {
            return Err(ApiError::new(
                ErrorCode::DestinationDenied,
                format!("destination port {port} is refused (control.denied_destination_ports)"),
            )
            .with_detail("reason", "port"));
        }
        Ok(())
    }
}

/// Default of `control.denied_destination_ports`: SMTP relay, the port an open egress is
/// abused for first.
pub const DEFAULT_DENIED_DESTINATION_PORTS: &[u16] = &[25];

impl Default for DeniedPorts {
    /// SMTP relay (25), as `control.denied_destination_ports` defaults to.
    fn default() -> Self {
        DeniedPorts::new(DEFAULT_DENIED_DESTINATION_PORTS).unwrap_or(DeniedPorts {
            ports: [0; DeniedPorts::MAX],
            len: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_ports_are_named_and_others_pass() {
        let d = DeniedPorts::default();
        let e = d.check(25).unwrap_err();
        assert_eq!(e.code, ErrorCode::DestinationDenied);
        assert!(e.message.contains("port 25"), "{}", e.message);
        assert!(d.check(587).is_ok() && d.check(443).is_ok() && d.check(0).is_ok());
        let none = DeniedPorts::new(&[]).unwrap();
        assert!(none.check(25).is_ok());
        assert!(DeniedPorts::new(&[1; 17]).is_none());
        assert!(DeniedPorts::new(&[1; 16]).is_some());
    }
}
