//! Identifiers: requests are `req_` and receipts `rcpt_` followed by 32 lowercase hex digits
//! (128 random bits). Randomness is an input; the io crate draws it from the OS.

/// Prefix of request ids (spec, Request result).
pub const REQUEST_ID_PREFIX: &str = "req_";
/// Prefix of receipt ids (decision 001).
pub const RECEIPT_ID_PREFIX: &str = "rcpt_";

fn render(prefix: &str, random: [u8; 16]) -> String {
    let mut s = String::with_capacity(prefix.len() + 32);
    s.push_str(prefix);
    s.extend(crate::hex::encode16(random).map(char::from));
    s
}

fn has_shape(s: &str, prefix: &str) -> bool {
    s.len() == prefix.len() + 32
        && s.starts_with(prefix)
        && s.as_bytes()
            .get(prefix.len()..)
            .is_some_and(|id| id.iter().all(|&b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// Length of a request id: its prefix and 32 hex digits.
const REQUEST_ID_LEN: usize = REQUEST_ID_PREFIX.len() + 32;

/// A request id, held inline: every request gets one, and an owned string would cost an
/// allocation each time. Dereferences to the id's text.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestId([u8; REQUEST_ID_LEN]);

impl RequestId {
    /// The id's text.
    pub fn as_str(&self) -> &str {
        // Always ASCII: the prefix and hex digits.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::ops::Deref for RequestId {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

/// A request id from 16 random bytes.
pub fn request_id(random: [u8; 16]) -> RequestId {
    let mut id = [0u8; REQUEST_ID_LEN];
    let (prefix, digits) = id.split_at_mut(REQUEST_ID_PREFIX.len());
    prefix.copy_from_slice(REQUEST_ID_PREFIX.as_bytes());
    digits.copy_from_slice(&crate::hex::encode16(random));
    RequestId(id)
}

/// A receipt id from 16 random bytes.
pub fn receipt_id(random: [u8; 16]) -> String {
    render(RECEIPT_ID_PREFIX, random)
}

/// Whether `s` has the shape of a request id.
pub fn is_request_id(s: &str) -> bool {
    has_shape(s, REQUEST_ID_PREFIX)
}

/// Whether `s` has the shape of a receipt id.
pub fn is_receipt_id(s: &str) -> bool {
    has_shape(s, RECEIPT_ID_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let r = request_id([0xab; 16]);
        assert_eq!(r.as_str(), format!("req_{}", "ab".repeat(16)));
        assert_eq!(
            request_id([0x0f; 16]).to_string(),
            format!("req_{}", "0f".repeat(16))
        );
        assert!(is_request_id(&r));
        assert!(!is_receipt_id(&r));
        let c = receipt_id([1; 16]);
        assert!(is_receipt_id(&c));
        for bad in [
            "",
            "req_",
            "req_AB",
            &format!("req_{}", "AB".repeat(16)),
            &format!("rcpt_{}", "0".repeat(33)),
        ] {
            assert!(!is_request_id(bad) && !is_receipt_id(bad), "{bad}");
        }
    }
}
