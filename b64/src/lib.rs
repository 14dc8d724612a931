//! Base64 (the standard alphabet, padded) appended to a vector, for the result envelope; and
//! its strict decoding, for the request envelope's header values and body and the forward
//! proxy's `Basic` credentials ([`decode`]).
//!
//! The envelope carries every response body and header value in base64, so the encoder is on
//! the request API's path once per field and once per body: at 64 KiB it was the largest
//! single cost of a request's user time. On a CPU with AVX-512 VBMI, [`encode_append`] encodes
//! 48 bytes into 64 characters with three instructions (a byte permutation that puts each
//! group's three bytes where its four characters take their bits from, one multishift that
//! takes the four six-bit fields of each group, one permutation that looks the characters up
//! in the alphabet), and the bytes after the last whole block in the same way through masked
//! loads and stores. With AVX2 only (Zen 2 and 3, Skylake and Cascade Lake), the same steps in
//! 24-byte blocks. Elsewhere it is `base64-simd` (SSE4.1, NEON or scalar).
//!
//! The `unsafe` of this crate is in those block encoders: the intrinsics, behind the CPU's
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
    {
        if vbmi::available() {
            vbmi::encode_append(data, out);
            return;
        }
        if avx2::available() {
            avx2::encode_append(data, out);
            return;
        }
    }
    encode_append_portable(data, out);
}

/// An encoder with the contract of [`encode_append`].
pub type Encoder = fn(&[u8], &mut Vec<u8>);

/// Every encoder this CPU can run, by name, the portable one first: what the tests, the fuzz
/// target and the benchmark compare. [`encode_append`] uses the last.
pub fn encoders() -> Vec<(&'static str, Encoder)> {
    let mut all: Vec<(&'static str, Encoder)> = vec![("base64-simd", encode_append_portable)];
    #[cfg(target_arch = "x86_64")]
    {
        if avx2::available() {
            all.push(("avx2", avx2::encode_append));
        }
        if vbmi::available() {
            all.push(("avx512-vbmi", vbmi::encode_append));
        }
    }
    all
}

/// The encoder of [`encode_append`] when the CPU has neither AVX-512 VBMI nor AVX2 (and the
/// reference the tests and the benchmark compare with).
pub fn encode_append_portable(data: &[u8], out: &mut Vec<u8>) {
    base64_simd::STANDARD.encode_append(data, out);
}

/// The bytes of `input`, standard base64 with its `=` padding, or `None` when it is anything
/// else: a byte outside the alphabet (whitespace included), a length that is not a multiple of
/// four, padding other than at the end, or bits after the last byte's that are not zero (so
/// that every byte string has exactly one encoding). The rules of the `base64` crate's
/// `STANDARD` engine, which the tests hold it to; done by `base64-simd`, whose vector code
/// decodes a header value of a few dozen characters in about half the instructions.
pub fn decode(input: &[u8]) -> Option<Vec<u8>> {
    base64_simd::STANDARD.decode_to_vec(input).ok()
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
        // `available()` is checked by the callers (`encode_append`, `encoders`).
        super::append_with(data, out, encode);
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
            super::pad_tail(dst, n);
        }
    }
}

/// Writes the padding of a last group of fewer than three bytes: `n` (not a multiple of 3
/// for any to be written) is the length of the tail whose `n.div_ceil(3) * 4` characters stand
/// at `dst`, and the one or two of them past its bytes become `=`.
///
/// # Safety
///
/// `dst` is valid for writes of `n.div_ceil(3) * 4` bytes.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline]
unsafe fn pad_tail(dst: *mut u8, n: usize) {
    let out_len = n.div_ceil(3) * 4;
    // SAFETY: the one or two bytes written end at `out_len`, within what the caller vouches for.
    unsafe {
        match n % 3 {
            1 => dst
                .add(out_len - 2)
                .cast::<[u8; 2]>()
                .write_unaligned(*b"=="),
            2 => dst.add(out_len - 1).write(b'='),
            _ => {}
        }
    }
}

/// Reserves the encoded length of `data` in `out` and runs `encode` into it; `encode` must
/// initialise exactly `encoded_len(data.len())` bytes at the pointer it is given.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn append_with(data: &[u8], out: &mut Vec<u8>, encode: unsafe fn(&[u8], *mut u8)) {
    let Some(len) = encoded_len(data.len()) else {
        // Not representable: let the vector report it as any oversized request does.
        out.reserve(usize::MAX);
        return;
    };
    out.reserve(len);
    let start = out.len();
    // SAFETY: the caller checked the CPU features `encode` needs, and `reserve` left at least
    // `len` bytes of spare capacity after `start`, which `encode` writes and nothing past.
    unsafe { encode(data, out.as_mut_ptr().add(start)) };
    // SAFETY: `encode` initialised the `len` bytes after `start`, within the capacity.
    unsafe { out.set_len(start + len) };
}

/// AVX2: 24 bytes into 32 characters per block, for the CPUs without AVX-512 VBMI (Zen 2 and 3,
/// Skylake and Cascade Lake). The steps of the AVX-512 block done with the instructions AVX2
/// has: a byte shuffle within each 128-bit half puts each group's three bytes where its four
/// characters take their bits from; two multiplications of 16-bit lanes move each six-bit field
/// to its own byte; a saturating subtraction and a comparison sort the fields into the
/// alphabet's five ranges, and a shuffle looks up what to add to a field of each range to make
/// its character. A block reads its 24 bytes as two overlapping 16-byte loads, so nothing past
/// the input is read; the last 1 to 23 bytes are gathered into a block in registers, zeros
/// after them, and only their characters are stored.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2 {
    use std::arch::x86_64::{
        __m256i, _mm256_castsi256_si128, _mm256_extracti128_si256, _mm256_set1_epi32,
        _mm256_set1_epi8, _mm256_set_epi64x, _mm256_set_m128i, _mm256_setr_epi8,
        _mm256_storeu_si256, _mm_cvtsi128_si32, _mm_loadu_si128, _mm_srli_si128, _mm_storel_epi64,
        _mm_storeu_si128,
    };

    /// Input bytes of a block: 24.
    const BLOCK_IN: usize = 24;
    /// Characters of a block: 32.
    const BLOCK_OUT: usize = 32;

    /// Whether the CPU has AVX2 (cached by the standard library after the first call).
    pub(crate) fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx2")
    }

    pub(crate) fn encode_append(data: &[u8], out: &mut Vec<u8>) {
        // `available()` is checked by the callers (`encode_append`, `encoders`).
        super::append_with(data, out, encode);
    }

    /// The constants of a block, made once per call and kept in registers.
    #[derive(Clone, Copy)]
    struct Constants {
        gather: __m256i,
        high_mask: __m256i,
        high_mul: __m256i,
        low_mask: __m256i,
        low_mul: __m256i,
        letters_end: __m256i,
        upper_end: __m256i,
        upper_range: __m256i,
        offsets: __m256i,
    }

    impl Constants {
        #[inline]
        #[target_feature(enable = "avx2")]
        fn new() -> Constants {
            Constants {
                // Each 32-bit lane i gets the bytes (3i + 1, 3i, 3i + 2, 3i + 1) of its group:
                // the low half holds bytes 0..12 at 0..12, the high half bytes 12..24 at 4..16.
                gather: _mm256_setr_epi8(
                    1, 0, 2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10, //
                    5, 4, 6, 5, 8, 7, 9, 8, 11, 10, 12, 11, 14, 13, 15, 14,
                ),
                high_mask: _mm256_set1_epi32(0x0fc0_fc00),
                high_mul: _mm256_set1_epi32(0x0400_0040),
                low_mask: _mm256_set1_epi32(0x003f_03f0),
                low_mul: _mm256_set1_epi32(0x0100_0010),
                letters_end: _mm256_set1_epi8(51),
                upper_end: _mm256_set1_epi8(26),
                upper_range: _mm256_set1_epi8(13),
                // What to add to a field of each range (see `block`) to make its character.
                offsets: _mm256_setr_epi8(
                    71, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -19, -16, 65, 0, 0, //
                    71, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -19, -16, 65, 0, 0,
                ),
            }
        }
    }

    /// The 32 characters of 24 bytes.
    ///
    /// Written as instructions rather than intrinsics: the compiler rewrites a multiplication of
    /// 16-bit lanes by powers of two into shifts, and AVX2 has no shift of 16-bit lanes by a
    /// different count each, so each of the two multiplications became five or six instructions
    /// (`base64-simd`'s loop, built by the same compiler, has them too).
    ///
    /// `input` holds the 24 bytes as [`load`] lays them out.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn block(input: __m256i, k: &Constants) -> __m256i {
        let mut chars = input;
        // SAFETY: registers only; AVX2 is enabled for this function.
        unsafe {
            std::arch::asm!(
                "vpshufb {x}, {x}, {gather}",
                // In a lane's low 16 bits (bytes 3i, 3i + 1 from the top), the first field is
                // bits 10..16 and the second bits 4..10; in its high 16 bits (3i + 1, 3i + 2),
                // the third is bits 6..12 and the fourth bits 0..6. The high product shifts the
                // first right by 10 and the third by 6, into bytes 0 and 2; the low product
                // shifts the second left by 4 and the fourth by 8, into bytes 1 and 3.
                "vpand {t}, {x}, {high_mask}",
                "vpmulhuw {t}, {t}, {high_mul}",
                "vpand {x}, {x}, {low_mask}",
                "vpmullw {x}, {x}, {low_mul}",
                "vpor {x}, {x}, {t}",
                // The range of each field: 0 for 26..=51 (a-z), 1..=10 for 52..=61 (digits),
                // 11 for 62 (+), 12 for 63 (/), 13 for 0..=25 (A-Z); then what to add to a
                // field of that range to make its character.
                "vpsubusb {t}, {x}, {letters_end}",
                "vpcmpgtb {u}, {upper_end}, {x}",
                "vpand {u}, {u}, {upper_range}",
                "vpor {t}, {t}, {u}",
                "vpshufb {t}, {offsets}, {t}",
                "vpaddb {x}, {x}, {t}",
                x = inout(ymm_reg) chars,
                t = out(ymm_reg) _,
                u = out(ymm_reg) _,
                gather = in(ymm_reg) k.gather,
                high_mask = in(ymm_reg) k.high_mask,
                high_mul = in(ymm_reg) k.high_mul,
                low_mask = in(ymm_reg) k.low_mask,
                low_mul = in(ymm_reg) k.low_mul,
                letters_end = in(ymm_reg) k.letters_end,
                upper_end = in(ymm_reg) k.upper_end,
                upper_range = in(ymm_reg) k.upper_range,
                offsets = in(ymm_reg) k.offsets,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        chars
    }

    /// The 24 bytes at `src` as [`block`] takes them: bytes 0..16 in the low half, 8..24 in the
    /// high half (two overlapping loads, so nothing past the 24 bytes is read).
    ///
    /// # Safety
    ///
    /// `src` is valid for reads of 24 bytes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load(src: *const u8) -> __m256i {
        // SAFETY: bytes 0..16 and 8..24 of `src` are readable (the caller's contract).
        unsafe {
            _mm256_set_m128i(
                _mm_loadu_si128(src.add(8).cast()),
                _mm_loadu_si128(src.cast()),
            )
        }
    }

    /// The little-endian word of the `bytes` (at most 8) and zeros after them, read with at most
    /// two loads that overlap rather than byte by byte.
    #[inline]
    fn word(bytes: &[u8]) -> u64 {
        let n = bytes.len();
        let u32_at = |at: usize| {
            bytes
                .get(at..at + 4)
                .and_then(|b| <[u8; 4]>::try_from(b).ok())
                .map_or(0, |b| u64::from(u32::from_le_bytes(b)))
        };
        match n {
            8.. => bytes
                .get(..8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map_or(0, u64::from_le_bytes),
            // The second load ends at the last byte; the bytes it shares with the first are
            // shifted out.
            4.. => u32_at(0) | (u32_at(n - 4) >> (8 * (8 - n)) << 32),
            _ => bytes
                .iter()
                .rev()
                .fold(0, |word, &b| (word << 8) | u64::from(b)),
        }
    }

    /// The last 1 to 23 bytes of the input laid out as [`load`] does, followed by zeros (what
    /// the padding bits of the last group's characters must be), built in registers: a copy to
    /// the stack would make the vector load wait for the small stores.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn load_tail(rest: &[u8]) -> __m256i {
        let (first, second) = rest.split_at(rest.len().min(8));
        let (second, third) = second.split_at(second.len().min(8));
        let [w0, w1, w2] = [word(first), word(second), word(third)].map(|w| w as i64);
        _mm256_set_epi64x(w2, w1, w1, w0)
    }

    /// Stores the first `len` characters of `chars` (4 to 32, a multiple of 4) at `dst`.
    ///
    /// # Safety
    ///
    /// `dst` is valid for writes of `len` bytes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn store_first(chars: __m256i, len: usize, mut dst: *mut u8) {
        // SAFETY: each store writes within the first `len` bytes at `dst`, moving past them.
        unsafe {
            if len == 32 {
                _mm256_storeu_si256(dst.cast(), chars);
                return;
            }
            let mut half = _mm256_castsi256_si128(chars);
            let mut left = len;
            if left >= 16 {
                _mm_storeu_si128(dst.cast(), half);
                half = _mm256_extracti128_si256::<1>(chars);
                dst = dst.add(16);
                left -= 16;
            }
            if left >= 8 {
                _mm_storel_epi64(dst.cast(), half);
                half = _mm_srli_si128::<8>(half);
                dst = dst.add(8);
                left -= 8;
            }
            if left >= 4 {
                dst.cast::<i32>().write_unaligned(_mm_cvtsi128_si32(half));
            }
        }
    }

    /// Writes the `encoded_len(data.len())` characters of `data` to `dst`.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2, and `dst` is valid for writes of `encoded_len(data.len())` bytes.
    #[target_feature(enable = "avx2")]
    unsafe fn encode(data: &[u8], mut dst: *mut u8) {
        let k = Constants::new();
        let mut chunks = data.chunks_exact(BLOCK_IN);
        for chunk in &mut chunks {
            // SAFETY: the chunk's 24 bytes are readable; a whole block's 32 characters are
            // within the `encoded_len` bytes at `dst` (24 bytes encode to 32), which moves past
            // them.
            unsafe {
                _mm256_storeu_si256(dst.cast(), block(load(chunk.as_ptr()), &k));
                dst = dst.add(BLOCK_OUT);
            }
        }
        let rest = chunks.remainder();
        let n = rest.len();
        if n == 0 {
            return;
        }
        let out_len = n.div_ceil(3) * 4;
        // SAFETY: `out_len` characters remain of the `encoded_len` bytes at `dst`; the padding
        // overwrites the last one or two of them.
        unsafe {
            store_first(block(load_tail(rest), &k), out_len, dst);
            super::pad_tail(dst, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    /// Decoding accepts and refuses what the `base64` crate's strict engine does, with the
    /// same bytes: every string of up to five characters from the alphabet's edges, padding,
    /// whitespace, the URL-safe alphabet's letters and NUL, then generated strings of every
    /// length up to 96 with a padding or a stray byte put in.
    #[test]
    fn decoding_agrees_with_the_base64_crate() {
        let reference = |b: &[u8]| base64::engine::general_purpose::STANDARD.decode(b).ok();
        let symbols = b"AQgwBv/+=9 \r-_\0";
        let mut s = Vec::new();
        for len in 0..=5u32 {
            for mut i in 0..symbols.len().pow(len) {
                s.clear();
                for _ in 0..len {
                    s.push(symbols[i % symbols.len()]);
                    i /= symbols.len();
                }
                assert_eq!(
                    decode(&s),
                    reference(&s),
                    "{:?}",
                    s.escape_ascii().to_string()
                );
            }
        }
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..200_000u64 {
            let len = (round % 97) as usize;
            s.clear();
            s.extend((0..len).map(|_| ALPHABET[(next() % 64) as usize]));
            match next() % 6 {
                0 => s.push(b'='),
                1 => s.extend_from_slice(b"=="),
                2 if len > 0 => {
                    let at = (next() % len as u64) as usize;
                    s[at] = b"=\r\n -_*\0"[(next() % 8) as usize];
                }
                _ => {}
            }
            assert_eq!(
                decode(&s),
                reference(&s),
                "{:?}",
                s.escape_ascii().to_string()
            );
        }
        // Every encoded length, from the crate's encoder, decodes back.
        for len in 0..=300usize {
            let data: Vec<u8> = (0..len).map(|i| (i * 151 % 256) as u8).collect();
            let text = base64::engine::general_purpose::STANDARD.encode(&data);
            assert_eq!(decode(text.as_bytes()), Some(data), "{len}");
        }
    }

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
            let chosen: (&str, Encoder) = ("encode_append", encode_append);
            for (name, encode) in encoders().into_iter().chain([chosen]) {
                let mut out = prefix.to_vec();
                encode(data, &mut out);
                assert_eq!(&out[..prefix.len()], prefix);
                assert_eq!(
                    &out[prefix.len()..],
                    &want[..],
                    "{name}, {} bytes",
                    data.len()
                );
            }
        }
        assert_eq!(encoded_len(data.len()), Some(want.len()));
    }

    /// Every length around the block edges up to several blocks, random content and the
    /// extremes of each byte, against the `base64` crate; each after a prefix already in the
    /// vector, as the envelope appends.
    #[test]
    fn agrees_with_the_base64_crate() {
        let names: Vec<&str> = encoders().iter().map(|(name, _)| *name).collect();
        eprintln!("encoders this CPU runs: {}", names.join(", "));
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
