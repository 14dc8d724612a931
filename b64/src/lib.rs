//! Base64 (the standard alphabet, padded) appended to a vector, for the result envelope.
//!
//! The envelope carries every response body and header value in base64, so the encoder is on
//! the request API's path once per field and once per body: at 64 KiB it was the largest
//! single cost of a request's user time. On a CPU with AVX-512 VBMI, [`encode_append`] encodes
//! 48 bytes into 64 characters with three instructions (a byte permutation that puts each
//! group's three bytes where its four characters take their bits from, one multishift that
//! takes the four six-bit fields of each group, one permutation that looks the characters up
//! in the alphabet), and the bytes after the last whole block in the same way through masked
//! loads and stores. Elsewhere it is `base64-simd` (AVX2, SSE4.1, NEON or scalar).
//!
//! The one `unsafe` of this crate is that block encoder: the intrinsics, behind the CPU's
//! features checked at run time, and the writes into the vector's spare capacity, reserved
//! for the exact encoded length first.

/// The length of the base64 of `n` bytes, padded; `None` if it does not fit a `usize`.
pub fn encoded_len(n: usize) -> Option<usize> {
    n.div_ceil(3).checked_mul(4)
}

/// Appends the base64 of `data` (standard alphabet, `=` padding) to `out`.
///
/// # Panics
///
/// Only as `Vec::reserve` does: when the encoded length overflows (`data` longer than three
/// quarters of the address space) or the allocation fails.
pub fn encode_append(data: &[u8], out: &mut Vec<u8>) {
    #[cfg(target_arch = "x86_64")]
    if vbmi::available() {
        vbmi::encode_append(data, out);
        return;
    }
    encode_append_portable(data, out);
}

/// Whether [`encode_append`] uses the AVX-512 VBMI encoder on this CPU.
pub fn uses_avx512_vbmi() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        vbmi::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The encoder of [`encode_append`] when the CPU does not have AVX-512 VBMI (and the reference
/// the tests and the benchmark compare with).
pub fn encode_append_portable(data: &[u8], out: &mut Vec<u8>) {
    base64_simd::STANDARD.encode_append(data, out);
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod vbmi {
    use std::arch::x86_64::{
        __m512i, _mm512_loadu_si512, _mm512_mask_storeu_epi8, _mm512_maskz_loadu_epi8,
        _mm512_multishift_epi64_epi8, _mm512_permutexvar_epi8, _mm512_set1_epi64,
        _mm512_setr_epi32, _mm512_storeu_si512,
    };

    /// The standard alphabet, one character per six-bit value.
    static ALPHABET: [u8; 64] =
        *b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    /// Input bytes of a block: 48.
    const BLOCK_IN: usize = 48;
    /// Characters of a block: 64.
    const BLOCK_OUT: usize = 64;

    /// Whether the CPU has the instructions the block encoder uses (the detection is cached
    /// by the standard library: an atomic load after the first call).
    pub(crate) fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vbmi")
    }

    pub(crate) fn encode_append(data: &[u8], out: &mut Vec<u8>) {
        let Some(len) = super::encoded_len(data.len()) else {
            // Not representable: let the vector report it as any oversized request does.
            out.reserve(usize::MAX);
            return;
        };
        out.reserve(len);
        let start = out.len();
        // SAFETY: `available()` found the features `encode` is compiled for (the caller checks
        // it before calling this function), and `reserve` left at least `len` bytes of spare
        // capacity after `start`, which `encode` writes and nothing past.
        unsafe { encode(data, out.as_mut_ptr().add(start)) };
        // SAFETY: `encode` initialised the `len` bytes after `start`, within the capacity.
        unsafe { out.set_len(start + len) };
    }

    /// Four characters from each group of three bytes in the low 48 bytes of `input`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    fn block(input: __m512i, gather: __m512i, shifts: __m512i, alphabet: __m512i) -> __m512i {
        // Each 32-bit lane i gets the bytes (3i + 1, 3i, 3i + 2, 3i + 1): as a little-endian
        // word, every six-bit field of the group then starts at a fixed bit offset.
        let lanes = _mm512_permutexvar_epi8(gather, input);
        // Each byte takes the eight bits at its offset (10, 4, 22, 16 in a lane): the low six
        // are the field; the permutation below ignores the top two.
        let fields = _mm512_multishift_epi64_epi8(shifts, lanes);
        _mm512_permutexvar_epi8(fields, alphabet)
    }

    /// Writes the `encoded_len(data.len())` characters of `data` to `dst`.
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512 F, BW and VBMI, and `dst` is valid for writes of
    /// `encoded_len(data.len())` bytes.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    unsafe fn encode(data: &[u8], mut dst: *mut u8) {
        let gather = _mm512_setr_epi32(
            0x0102_0001,
            0x0405_0304,
            0x0708_0607,
            0x0a0b_090a,
            0x0d0e_0c0d,
            0x1011_0f10,
            0x1314_1213,
            0x1617_1516,
            0x191a_1819,
            0x1c1d_1b1c,
            0x1f20_1e1f,
            0x2223_2122,
            0x2526_2425,
            0x2829_2728,
            0x2b2c_2a2b,
            0x2e2f_2d2e,
        );
        let shifts = _mm512_set1_epi64(0x3036_242a_1016_040a);
        // SAFETY: `ALPHABET` is 64 readable bytes; the load is unaligned.
        let alphabet = unsafe { _mm512_loadu_si512(ALPHABET.as_ptr().cast()) };
        let mut chunks = data.chunks_exact(BLOCK_IN);
        for chunk in &mut chunks {
            // SAFETY: the mask selects the chunk's 48 bytes, all readable; masked-off bytes
            // are not read.
            let input = unsafe { _mm512_maskz_loadu_epi8(u64::MAX >> 16, chunk.as_ptr().cast()) };
            // SAFETY: a whole block's 64 characters are within the `encoded_len` bytes at
            // `dst` (48 input bytes encode to 64); `dst` moves past them.
            unsafe {
                _mm512_storeu_si512(dst.cast(), block(input, gather, shifts, alphabet));
                dst = dst.add(BLOCK_OUT);
            }
        }
        let rest = chunks.remainder();
        if rest.is_empty() {
            return;
        }
        // 1 to 47 bytes: the bytes past them load as zero, which is what the padding bits of
        // the last group's characters must be.
        let n = rest.len();
        let out_len = n.div_ceil(3) * 4;
        // SAFETY: the mask selects the `n` readable bytes of `rest`.
        let input = unsafe { _mm512_maskz_loadu_epi8(u64::MAX >> (64 - n), rest.as_ptr().cast()) };
        let chars = block(input, gather, shifts, alphabet);
        // SAFETY: `out_len` (at most 64) characters remain of the `encoded_len` bytes at
        // `dst`; the mask writes exactly those, and the padding overwrites the last one or two.
        unsafe {
            _mm512_mask_storeu_epi8(dst.cast(), u64::MAX >> (64 - out_len), chars);
            match n % 3 {
                1 => {
                    dst.add(out_len - 2).write(b'=');
                    dst.add(out_len - 1).write(b'=');
                }
                2 => dst.add(out_len - 1).write(b'='),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    fn reference(data: &[u8]) -> Vec<u8> {
        base64::engine::general_purpose::STANDARD
            .encode(data)
            .into_bytes()
    }

    /// Deterministic bytes that are not one repeated value.
    fn bytes(len: usize, seed: u32) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect()
    }

    fn check(data: &[u8]) {
        let want = reference(data);
        for prefix in [&b""[..], b"\"", b"0123456789abcdefghijklmnopqrstuvwxyz"] {
            for encode in [encode_append, encode_append_portable] {
                let mut out = prefix.to_vec();
                encode(data, &mut out);
                assert_eq!(&out[..prefix.len()], prefix);
                assert_eq!(&out[prefix.len()..], &want[..], "{} bytes", data.len());
            }
        }
        assert_eq!(encoded_len(data.len()), Some(want.len()));
    }

    /// Every length around the block edges up to several blocks, random content and the
    /// extremes of each byte, against the `base64` crate; each after a prefix already in the
    /// vector, as the envelope appends.
    #[test]
    fn agrees_with_the_base64_crate() {
        eprintln!(
            "the AVX-512 VBMI encoder is {} on this CPU",
            if uses_avx512_vbmi() {
                "in use"
            } else {
                "not available (base64-simd is used)"
            }
        );
        for len in 0..=300 {
            check(&bytes(len, len as u32 + 7));
            check(&vec![0u8; len]);
            check(&vec![0xffu8; len]);
        }
        let all: Vec<u8> = (0..=255u8).collect();
        check(&all);
        for len in [1023, 1024, 1025, 4096, 65_535, 65_536, 65_537, 1 << 20] {
            check(&bytes(len, 0x9e37_79b9));
        }
        // Every byte value at every position of a block and of its tail.
        for at in 0..50 {
            for b in 0..=255u8 {
                let mut data = vec![0x5au8; 50];
                data[at] = b;
                check(&data);
            }
        }
    }

    #[test]
    fn lengths_that_do_not_fit() {
        assert_eq!(encoded_len(usize::MAX), None);
        assert_eq!(encoded_len(0), Some(0));
        assert_eq!(encoded_len(1), Some(4));
        assert_eq!(encoded_len(3), Some(4));
        assert_eq!(encoded_len(4), Some(8));
    }
}
