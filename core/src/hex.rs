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
/// allocating. Every request makes an id: eight bytes at a time in a 128-bit word rather than
/// a table lookup per digit (a third of the instructions).
pub fn encode16(bytes: [u8; 16]) -> [u8; 32] {
    let [a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7] = bytes;
    let low = u64::from_le_bytes([a0, a1, a2, a3, a4, a5, a6, a7]);
    let high = u64::from_le_bytes([b0, b1, b2, b3, b4, b5, b6, b7]);
    let mut out = [0u8; 32];
    let (first, second) = out.split_at_mut(16);
    first.copy_from_slice(&digits8(low).to_le_bytes());
    second.copy_from_slice(&digits8(high).to_le_bytes());
    out
}

/// The 16 hex digits of the eight bytes of `x` (little-endian: byte 0 first), high digit of
/// each byte first, as a little-endian 128-bit word.
fn digits8(x: u64) -> u128 {
    const LOW_BYTES: u128 = 0x00ff_00ff_00ff_00ff_00ff_00ff_00ff_00ff;
    const NIBBLES: u128 = 0x0f0f_0f0f_0f0f_0f0f_0f0f_0f0f_0f0f_0f0f;
    const ONES: u128 = 0x0101_0101_0101_0101_0101_0101_0101_0101;
    // Byte i moves to bits 16i..16i+8: each byte gets a 16-bit lane of its own.
    let mut x = u128::from(x);
    x = (x | (x << 32)) & 0x0000_0000_ffff_ffff_0000_0000_ffff_ffff;
    x = (x | (x << 16)) & 0x0000_ffff_0000_ffff_0000_ffff_0000_ffff;
    x = (x | (x << 8)) & LOW_BYTES;
    // In each lane the high nibble goes to the lane's first byte, the low one to its second.
    let n = ((x >> 4) & NIBBLES) | ((x & NIBBLES) << 8);
    // A nibble of 10 or more has bit 4 set once 6 is added: it becomes a letter, 39 places
    // after the digits' range ('a' is '0' + 49). No sum carries into the next byte.
    let letters = ((n + 6 * ONES) >> 4) & ONES;
    n + 0x30 * ONES + letters * 39
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

    /// Every byte value in every position, against the digits one byte at a time.
    #[test]
    fn encode16_agrees_with_pairs() {
        for start in 0..=255u8 {
            let bytes: [u8; 16] = std::array::from_fn(|i| start.wrapping_add((i * 17) as u8));
            let want: Vec<u8> = bytes.iter().flat_map(|&b| pair(b)).collect();
            assert_eq!(encode16(bytes).as_slice(), want.as_slice(), "{bytes:02x?}");
        }
    }
}
