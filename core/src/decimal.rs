//! Decimal digits of an unsigned integer, written without `core::fmt` and without an index
//! that could panic: body lengths in heads, numbers in the result envelope, ports and IPv4
//! octets in host text share them (all on the per-request path, where `core::fmt`'s width and
//! padding machinery costs several times as much).

/// Digits of `u64::MAX`.
const U64_DIGITS: usize = 20;

/// The decimal digits of a number, most significant first, on the stack.
pub struct Digits {
    buf: [u8; U64_DIGITS],
    start: usize,
}

impl Digits {
    /// The digits of `n`; `0` has one.
    pub fn of(mut n: u64) -> Digits {
        let mut buf = [0u8; U64_DIGITS];
        let mut start = buf.len();
        for slot in buf.iter_mut().rev() {
            // `n % 10` is below 10, so the cast is exact.
            *slot = b'0' + (n % 10) as u8;
            start -= 1;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        Digits { buf, start }
    }

    /// The digits as ASCII bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(self.start..).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_say_what_display_says() {
        let mut n = 1u64;
        let mut cases = vec![0, 9, 10, 99, 100, u64::MAX, u64::MAX / 10];
        while let Some(next) = n.checked_mul(7) {
            cases.extend([n - 1, n, n + 1]);
            n = next;
        }
        for n in cases {
            assert_eq!(Digits::of(n).as_bytes(), n.to_string().as_bytes(), "{n}");
        }
    }
}
