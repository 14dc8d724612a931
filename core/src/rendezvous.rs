//! Rendezvous (highest-random-weight) hashing: every member of a set gets a score from a key and
//! its own hash, and the highest score wins. The choice depends only on the key and the set, so
//! two processes with the same set choose the same member without talking to each other, and
//! when a member leaves only the keys it won move, each to its own next-highest member.
//!
//! The hashes are fixed functions of bytes (SHA-256, then the SplitMix64 finaliser), never
//! keyed per process: several controls must agree (decision 097).

use ring::digest;

/// Domain separation for [`stable_hash`], so these hashes never equal another use of SHA-256
/// over the same fields.
const DOMAIN_TAG: &[u8] = b"sortie-rendezvous-v1";

/// A fixed 64-bit mixer (the finaliser of SplitMix64): spreads rendezvous scores.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// SHA-256 over the fields, each prefixed by its length (4 bytes, big-endian), so `("ab", "c")`
/// and `("a", "bc")` differ. Every field here is bounded by a contract limit far below 4 GiB.
pub fn sha256_of_fields<'a>(fields: impl IntoIterator<Item = &'a [u8]>) -> digest::Digest {
    let mut ctx = digest::Context::new(&digest::SHA256);
    for field in fields {
        let len = u32::try_from(field.len()).unwrap_or(u32::MAX);
        ctx.update(&len.to_be_bytes());
        ctx.update(field);
    }
    ctx.finish()
}

/// The first 8 bytes (big-endian) of [`sha256_of_fields`] over a domain tag and the fields. The
/// same on every platform and in every process.
pub fn stable_hash(fields: &[&[u8]]) -> u64 {
    let d = sha256_of_fields(std::iter::once(DOMAIN_TAG).chain(fields.iter().copied()));
    let mut out = [0u8; 8];
    for (o, b) in out.iter_mut().zip(d.as_ref()) {
        *o = *b;
    }
    u64::from_be_bytes(out)
}

/// The pair's draw: 52 uniform bits from a key and a member (its [`stable_hash`]). Among
/// members of equal weight the higher draw has the higher [`score`], so a caller may compare
/// draws and take a logarithm only between members of different weights.
pub fn draw(key: u64, member: u64) -> u64 {
    mix64(key ^ mix64(member)) >> 12
}

/// The weighted score of a [`draw`]: with `u` the draw as a number in (0, 1),
/// `weight / -ln(u)`. A member of weight `w` wins a share `w / Σw` of the keys (weighted
/// rendezvous hashing). A weight of 0 never wins against a positive one.
pub fn score(draw: u64, weight: u32) -> f64 {
    // The draw centred in its interval: `k + 0.5` with `k < 2^52` has 53 significant bits, so
    // it is exact, and `u` is never 0 or 1: the logarithm is finite and negative.
    let u = ((draw & ((1 << 52) - 1)) as f64 + 0.5) / (1u64 << 52) as f64;
    f64::from(weight) / -u.ln()
}

/// [`score`] of the [`draw`] of a key and a member.
pub fn weighted_score(key: u64, member: u64, weight: u32) -> f64 {
    score(draw(key, member), weight)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_hash_is_fixed_and_length_prefixed() {
        // A fixed value: a change here changes where every sticky session lands, which several
        // controls of mixed versions would then disagree on.
        assert_eq!(stable_hash(&[b"dep", b"session"]), 0x8d67_1e33_3e50_6be7);
        assert_ne!(stable_hash(&[b"ab", b"c"]), stable_hash(&[b"a", b"bc"]));
        assert_ne!(stable_hash(&[b"abc"]), stable_hash(&[b"ab", b"c"]));
    }

    #[test]
    fn scores_are_finite_positive_and_follow_the_weight() {
        for key in 0..1_000u64 {
            let key = mix64(key);
            let s = weighted_score(key, 7, 10);
            assert!(s.is_finite() && s > 0.0, "{s}");
            assert!(weighted_score(key, 7, 20) > s);
            assert_eq!(weighted_score(key, 7, 0), 0.0);
        }
        // The extreme draws stay finite; a higher draw scores higher at equal weight.
        for d in [0u64, (1 << 52) - 1] {
            let s = score(d, 1);
            assert!(s.is_finite() && s > 0.0, "{d}: {s}");
        }
        assert!(score(0, 1) < score(1, 1));
        assert!(score((1 << 52) - 2, 1) < score((1 << 52) - 1, 1));
        for key in 0..1_000u64 {
            let (a, b) = (draw(key, 1), draw(key, 2));
            assert_eq!(a > b, score(a, 5) > score(b, 5), "key {key}");
        }
    }
}
