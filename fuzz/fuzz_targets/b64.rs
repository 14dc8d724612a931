//! Fuzz target: b64 (seeded from fuzz/corpus/b64).
//!
//! Input: any bytes, as a response body or header value the result envelope encodes. The
//! encoder the envelope uses (AVX-512 VBMI blocks where the CPU has them) must write what the
//! portable one writes, after whatever the vector already held, and exactly the encoded length.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte chooses how much of a prefix the vector already holds.
    let prefix_len = data.first().map_or(0, |&b| usize::from(b % 8));
    let prefix = &b"\"prefix\""[..prefix_len];
    let mut fast = prefix.to_vec();
    sortie_b64::encode_append(data, &mut fast);
    let mut portable = prefix.to_vec();
    sortie_b64::encode_append_portable(data, &mut portable);
    assert_eq!(fast, portable);
    assert_eq!(
        Some(fast.len() - prefix_len),
        sortie_b64::encoded_len(data.len())
    );
});
