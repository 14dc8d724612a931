//! Fuzz target: b64 (seeded from fuzz/corpus/b64).
//!
//! Input: any bytes, as a response body or header value the result envelope encodes. The
//! encoders this CPU runs (AVX-512 VBMI blocks, AVX2 blocks) and the one the envelope uses must
//! write what the portable one writes, after whatever the vector already held, and exactly the
//! encoded length. The same bytes as base64 text (a header value or body of a request
//! envelope): the decoder must accept and refuse what the `base64` crate's strict engine does,
//! with the same bytes, and give back whatever was encoded.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte chooses how much of a prefix the vector already holds.
    let prefix_len = data.first().map_or(0, |&b| usize::from(b % 8));
    let prefix = &b"\"prefix\""[..prefix_len];
    let mut portable = prefix.to_vec();
    sortie_b64::encode_append_portable(data, &mut portable);
    assert_eq!(
        Some(portable.len() - prefix_len),
        sortie_b64::encoded_len(data.len())
    );
    let chosen: (&str, sortie_b64::Encoder) = ("encode_append", sortie_b64::encode_append);
    for (name, encode) in sortie_b64::encoders().into_iter().chain([chosen]) {
        let mut out = prefix.to_vec();
        encode(data, &mut out);
        assert_eq!(out, portable, "{name}");
    }
    use base64::Engine as _;
    let reference = base64::engine::general_purpose::STANDARD.decode(data).ok();
    assert_eq!(sortie_b64::decode(data), reference);
    let encoded = portable.get(prefix_len..).unwrap_or_default();
    assert_eq!(sortie_b64::decode(encoded).as_deref(), Some(data));
});
