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

/// The two digits of every number below 100, `00` to `99`, in order.
#[allow(clippy::indexing_slicing)] // written at compile time, within the array
const PAIRS: [[u8; 2]; 100] = {
    let mut table = [[0u8; 2]; 100];
    let mut i = 0;
    while i < 100 {
        table[i] = [b'0' + (i / 10) as u8, b'0' + (i % 10) as u8];
        i += 1;
    }
    table
};

impl Digits {
    /// The digits of `n`; `0` has one. Two digits per division, from a table.
    pub fn of(mut n: u64) -> Digits {
        let mut buf = [0u8; U64_DIGITS];
        let mut start = buf.len();
        while n >= 100 {
            start -= 2;
            put_pair(&mut buf, start, n % 100);
            n /= 100;
        }
        if n >= 10 {
            start -= 2;
            put_pair(&mut buf, start, n);
        } else {
            start -= 1;
            if let Some(slot) = buf.get_mut(start) {
                // `n` is below 10 here.
                *slot = b'0' + n as u8;
            }
        }
        Digits { buf, start }
    }

    /// The digits as ASCII bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(self.start..).unwrap_or_default()
    }
}

/// Writes the two digits of `pair` (below 100) at `at` of `buf`.
fn put_pair(buf: &mut [u8; U64_DIGITS], at: usize, pair: u64) {
    // `pair` is below 100, so the cast is exact and the pair is in the table.
    let digits = PAIRS.get(pair as usize).copied().unwrap_or_default();
    if let Some(slot) = buf.get_mut(at..at + 2) {
        slot.copy_from_slice(&digits);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_say_what_display_says() {
        let mut n = 1u64;
        // Every number of up to five digits (ports, statuses, small lengths), then the
        // boundaries of longer ones.
        let mut cases: Vec<u64> = (0..100_000).collect();
        cases.extend([u64::MAX, u64::MAX / 10]);
        let mut p = 10u64;
        while let Some(next) = p.checked_mul(10) {
            cases.extend([p - 1, p, p + 1]);
            p = next;
        }
        while let Some(next) = n.checked_mul(7) {
            cases.extend([n - 1, n, n + 1]);
            n = next;
        }
        for n in cases {
            assert_eq!(Digits::of(n).as_bytes(), n.to_string().as_bytes(), "{n}");
        }
    }
}
