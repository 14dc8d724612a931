//! Lowercase hexadecimal digits, written without a table index that could panic: ids, provider
//! sessions, JSON `\u00XX` escapes and chunk sizes share them.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// The lowercase hex digit of the low four bits of `n`.
pub fn digit(n: u8) -> u8 {
    // `n & 0xf` is below 16, the table's length; the fallback is never taken.
    DIGITS.get(usize::from(n & 0xf)).copied().unwrap_or(b'0')
}

/// The two lowercase hex digits of `b`, high first.
pub fn pair(b: u8) -> [u8; 2] {
    [digit(b >> 4), digit(b)]
}

/// The 32 lowercase hex digits of 16 bytes (a random id, a provider session), without
/// allocating.
pub fn encode16(bytes: [u8; 16]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (digits, b) in out.chunks_exact_mut(2).zip(bytes) {
        digits.copy_from_slice(&pair(b));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_and_pairs() {
        assert_eq!(pair(0x00), *b"00");
        assert_eq!(pair(0x9f), *b"9f");
        assert_eq!(pair(0xa0), *b"a0");
        assert_eq!(pair(0xff), *b"ff");
        assert_eq!(digit(0x3c), b'c');
        let mut bytes = [0u8; 16];
        bytes[0] = 0x01;
        bytes[15] = 0xfe;
        assert_eq!(&encode16(bytes), b"010000000000000000000000000000fe");
    }
}
