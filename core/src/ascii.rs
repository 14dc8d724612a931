//! Byte work eight bytes at a time, on the per-request path.
//!
//! Field names, `Connection` tokens and codings are matched against constants on every
//! request and response, several times each. [`eq_lower`] folds only the received side (the
//! known side is lowercase already) and does it eight bytes at a time, where
//! `<[u8]>::eq_ignore_ascii_case` folds both sides byte by byte. [`position`] finds the first
//! byte of a class (one JSON escapes, one a URL may not hold) the same way: a word's bytes are
//! tested at once by [`bytes_eq`] and [`bytes_below`], which are exact (no byte's result
//! depends on its neighbours).
//!
//! It is also the one home of the field byte rules ([`is_tchar`], [`is_token`],
//! [`is_field_value`]) that the envelope's header checks and `h1`'s parsers and writers share.

/// Each byte's lowest bit.
const LSB: u64 = 0x0101_0101_0101_0101;
/// Each byte's highest bit.
const MSB: u64 = 0x8080_8080_8080_8080;

/// `w` with its bytes `A`..=`Z` made lowercase and every other byte unchanged.
#[inline]
fn fold(w: u64) -> u64 {
    let low7 = w & !MSB;
    // High bit set where a byte (less its own high bit) is at least `A`, resp. above `Z`:
    // adding to seven-bit bytes never carries into the next byte.
    let at_least_a = low7 + LSB * u64::from(0x80 - b'A');
    let above_z = low7 + LSB * u64::from(0x80 - b'Z' - 1);
    // Upper-case letters: ASCII (high bit clear), at least `A`, not above `Z`.
    let upper = !w & at_least_a & !above_z & MSB;
    // 0x80 >> 2 is 0x20, the case bit.
    w | (upper >> 2)
}

/// Eight bytes of `b` from `at` as a word (`b` holds them: the callers check lengths).
#[inline]
fn word(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    if let Some(src) = b.get(at..at + 8) {
        w.copy_from_slice(src);
    }
    u64::from_le_bytes(w)
}

/// The high bit of each byte of `w` that is not zero: `(b & 0x7f) + 0x7f` sets it for a
/// non-zero low part without carrying into the next byte, and `| w` for a set high bit.
#[inline]
fn nonzero(w: u64) -> u64 {
    (((w & !MSB) + !MSB) | w) & MSB
}

/// The high bit of each byte of `w` equal to `b`, and no other bit.
#[inline]
pub fn bytes_eq(w: u64, b: u8) -> u64 {
    !nonzero(w ^ (LSB * u64::from(b))) & MSB
}

/// The high bit of each byte of `w` below `n` (at most 0x80), and no other bit: a byte is at
/// least `n` when its high bit is set or its low seven bits plus `0x80 - n` reach the high
/// bit (without carrying into the next byte).
#[inline]
pub fn bytes_below(w: u64, n: u8) -> u64 {
    debug_assert!(n <= 0x80);
    let at_least = ((w & !MSB) + LSB * u64::from(0x80u8.saturating_sub(n))) | w;
    !at_least & MSB
}

/// The index of the first byte of `s` for which `is` holds. `mask` gives, for a word of eight
/// bytes read little-endian, the high bit of each byte for which `is` holds (and no other
/// bit): whole words are tested with it, the tail of under eight bytes with `is`.
#[inline]
pub fn position(s: &[u8], mask: impl Fn(u64) -> u64, is: impl Fn(u8) -> bool) -> Option<usize> {
    let mut chunks = s.chunks_exact(8);
    let mut at = 0;
    for c in &mut chunks {
        let m = mask(u64::from_le_bytes(c.try_into().unwrap_or([0; 8])));
        if m != 0 {
            return Some(at + (m.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| is(b))
        .map(|p| at + p)
}

/// Whether `name` equals `lower` with ASCII letters in any case. `lower` must be lowercase
/// (a constant such as `b"content-length"`): the same answer as
/// `name.eq_ignore_ascii_case(lower)` for any `name`.
#[inline]
pub fn eq_lower(name: &[u8], lower: &[u8]) -> bool {
    debug_assert!(!lower.iter().any(u8::is_ascii_uppercase), "{lower:?}");
    let len = name.len();
    if len != lower.len() {
        return false;
    }
    if len < 8 {
        // Padded to a word: the zero padding is equal on both sides and folds to itself.
        let mut a = [0u8; 8];
        let mut b = [0u8; 8];
        if let (Some(a), Some(b)) = (a.get_mut(..len), b.get_mut(..len)) {
            a.copy_from_slice(name);
            b.copy_from_slice(lower);
        }
        return fold(u64::from_le_bytes(a)) == u64::from_le_bytes(b);
    }
    // Whole words, the last one overlapping the one before when the length is not a multiple
    // of eight.
    let mut at = 0;
    while at + 8 < len {
        if fold(word(name, at)) != word(lower, at) {
            return false;
        }
        at += 8;
    }
    fold(word(name, len - 8)) == word(lower, len - 8)
}

/// Whether `b` is an RFC 9110 §5.6.2 `tchar`: a byte of a token (a field name, a method).
#[allow(clippy::indexing_slicing)] // 256 entries, indexed by a byte
pub const fn is_tchar(b: u8) -> bool {
    TCHAR[b as usize]
}

/// `tchar` membership of every byte, so the check is one load.
#[allow(clippy::indexing_slicing)] // written at compile time, below 256
const TCHAR: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        t[i] = matches!(b,
            b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-' | b'.' | b'^' | b'_'
            | b'`' | b'|' | b'~' | b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z');
        i += 1;
    }
    t
};

/// Whether `s` is a non-empty `token`: the rule of a field name, written or received.
pub fn is_token(s: &[u8]) -> bool {
    // Folded over every byte without an early exit: a lookup and an `and` a byte, no branch.
    !s.is_empty() && s.iter().fold(true, |ok, &b| ok & is_tchar(b))
}

/// RFC 9110 §5.5: `field-vchar = VCHAR / obs-text`, with SP and HTAB allowed inside a value.
pub const fn is_field_value_byte(b: u8) -> bool {
    b == b'\t' || (b >= 0x20 && b != 0x7f)
}

/// Whether every byte of `value` is a field-value byte ([`is_field_value_byte`]): no CR, LF,
/// NUL or other control byte but HTAB. Every field of every head the gateway writes checked,
/// and every value an envelope names, passes here. A fold without an early exit or branches.
/// (A word-at-a-time form of it measured no cheaper for the values of an ordinary request,
/// 8 to 64 bytes: 117 against 112 instructions a value.)
pub fn is_field_value(value: &[u8]) -> bool {
    !value.iter().fold(false, |bad, &b| {
        bad | (((b < 0x20) & (b != b'\t')) | (b == 0x7f))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The field value check against the byte rule: every byte value at every position of
    /// values of every length up to 70, the rest of the value a valid byte.
    #[test]
    fn field_value_check_agrees_with_the_byte_rule() {
        for len in 1..=70 {
            for b in 0..=255u8 {
                for at in 0..len {
                    let mut v = vec![b'a'; len];
                    v[at] = b;
                    assert_eq!(
                        is_field_value(&v),
                        is_field_value_byte(b),
                        "byte {b} at {at} of {len}"
                    );
                }
            }
        }
        assert!(is_field_value(b""));
        assert!(is_field_value(
            &(0x20..=0xffu8).filter(|&b| b != 0x7f).collect::<Vec<_>>()
        ));
        assert!(is_field_value(b"a\tb"));
    }

    /// Every byte value at every position of a word, among neighbours of every kind: the
    /// masks mark exactly the bytes the scalar tests do, and `position` finds the first.
    #[test]
    fn byte_masks_are_exact() {
        let neighbours = [0u8, 0x01, 0x1f, 0x20, 0x22, 0x5c, 0x7f, 0x80, 0xff];
        for b in 0..=255u8 {
            for &n in &neighbours {
                for at in 0..8 {
                    let mut bytes = [n; 8];
                    bytes[at] = b;
                    let w = u64::from_le_bytes(bytes);
                    for c in [0u8, b'"', b'#', b'\\', 0x7f, 0xff] {
                        let want = bytes
                            .iter()
                            .enumerate()
                            .fold(0u64, |m, (i, &x)| m | (u64::from(x == c) << (i * 8 + 7)));
                        assert_eq!(bytes_eq(w, c), want, "{bytes:?} == {c:#x}");
                    }
                    for limit in [0x01u8, 0x20, 0x21, 0x7f, 0x80] {
                        let want = bytes
                            .iter()
                            .enumerate()
                            .fold(0u64, |m, (i, &x)| m | (u64::from(x < limit) << (i * 8 + 7)));
                        assert_eq!(bytes_below(w, limit), want, "{bytes:?} < {limit:#x}");
                    }
                }
            }
        }
        let is = |b: u8| b < 0x20 || b == b'"';
        let mask = |w: u64| bytes_below(w, 0x20) | bytes_eq(w, b'"');
        for len in 0..40 {
            let clean = vec![b'a'; len];
            assert_eq!(position(&clean, mask, is), None);
            for at in 0..len {
                for b in [0u8, 0x1f, b'"'] {
                    let mut s = clean.clone();
                    s[at] = b;
                    if at + 1 < len {
                        s[len - 1] = b'"';
                    }
                    assert_eq!(position(&s, mask, is), Some(at), "{s:?}");
                }
            }
        }
    }

    #[test]
    fn fold_lowercases_letters_only() {
        for b in 0..=255u8 {
            let w = u64::from_le_bytes([b, 0, b'Z', b'@', b'[', 0x80 | b'A', b, 0xff]);
            let want = u64::from_le_bytes([
                b.to_ascii_lowercase(),
                0,
                b'z',
                b'@',
                b'[',
                0x80 | b'A',
                b.to_ascii_lowercase(),
                0xff,
            ]);
            assert_eq!(fold(w), want, "{b:#x}");
        }
    }

    /// The same answer as the standard comparison: every byte against every lowercase byte at
    /// each position of short and long names, and generated names of every length up to 40.
    #[test]
    fn agrees_with_eq_ignore_ascii_case() {
        let names: [&[u8]; 6] = [
            b"",
            b"te",
            b"date",
            b"connection",
            b"content-length",
            b"proxy-authorization_x-1~",
        ];
        for lower in names {
            for at in 0..lower.len() {
                for b in 0..=255u8 {
                    let mut name = lower.to_vec();
                    name[at] = b;
                    assert_eq!(
                        eq_lower(&name, lower),
                        name.eq_ignore_ascii_case(lower),
                        "{name:?} {lower:?}"
                    );
                }
            }
            assert!(eq_lower(&lower.to_ascii_uppercase(), lower));
            assert!(!eq_lower(lower, b"x"));
        }
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let alphabet = b"aAzZ@[`{-_09\r\x7f\xc1\xe1";
        for _ in 0..200_000 {
            let len = (next() % 41) as usize;
            let lower: Vec<u8> = (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize].to_ascii_lowercase())
                .collect();
            let name: Vec<u8> = lower
                .iter()
                .map(|&c| match next() % 4 {
                    0 => c.to_ascii_uppercase(),
                    1 if next() % 8 == 0 => alphabet[(next() % alphabet.len() as u64) as usize],
                    _ => c,
                })
                .collect();
            assert_eq!(
                eq_lower(&name, &lower),
                name.eq_ignore_ascii_case(&lower),
                "{name:?} {lower:?}"
            );
        }
    }
}
