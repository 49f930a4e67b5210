//! Key hashing: one 32-bit MurmurHash3-style hash per seed, over the key's 32-bit words.
//!
//! The GPU has no guaranteed 64-bit integers, so everything is u32 arithmetic. A key has `H`
//! location hashes (their high bits pick the top-level bucket, so a bucket of level `t` is
//! always the parent of the two buckets of level `t + 1` it shares with) and one fingerprint.
//! In tables whose locations are apart ([`crate::layout::Geometry::location_bits`]), the
//! top-level bucket's highest bits are the location's number instead: location `h` hashes into
//! part `h` of the table (d-left hashing, whose ties go to the first part).
//!
//! Value cells carry a checksum ([`value_checksum`]): a sum of one bijective mix per value
//! word, so that a tile of lanes computes it with one shuffle reduction.
//!
//! Twin: `gpu/shaders/common/hash.wgsl` (`top_bucket`: `shaders/common/table.wgsl`); change both
//! together.

/// Seeds of one table: `H` location hashes, then the fingerprint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seeds {
    /// One seed per hash location.
    pub locations: Vec<u32>,
    /// Seed of the fingerprint hash.
    pub fingerprint: u32,
}

impl Seeds {
    /// Derives the seeds of a table from its 64-bit pool seed.
    pub fn new(seed: u64, hashes: u32) -> Self {
        let derive = |i: u32| fmix((seed as u32) ^ (i + 1).wrapping_mul(0x9E37_79B9)) ^ (seed >> 32) as u32;
        Seeds { locations: (0..hashes).map(derive).collect(), fingerprint: derive(hashes) }
    }
}

/// MurmurHash3's 32-bit finaliser.
pub fn fmix(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85EB_CA6B);
    h ^= h >> 13;
    h = h.wrapping_mul(0xC2B2_AE35);
    h ^ (h >> 16)
}

/// Hash of a key given as 32-bit words.
pub fn hash_words(key: &[u32], seed: u32) -> u32 {
    let mut h = seed;
    for &w in key {
        let k = w.wrapping_mul(0xCC9E_2D51).rotate_left(15).wrapping_mul(0x1B87_3593);
        h = (h ^ k).rotate_left(13).wrapping_mul(5).wrapping_add(0xE654_6B64);
    }
    fmix(h ^ (key.len() as u32 * 4))
}

/// The checksum of a cell whose value words are all zero is never zero (pinned for every cell
/// size by a test): a cell that was never written fails its check.
pub const CHECKSUM_BASE: u32 = 0x6A09_E667;

/// What value word `w` at position `i` of its cell adds to the cell's checksum: for each
/// position a bijection of the word, so a change of any one word always changes the sum.
pub fn checksum_term(i: u32, w: u32) -> u32 {
    fmix(w ^ i.wrapping_add(1).wrapping_mul(0x9E37_79B9))
}

/// The checksum stored after the value words of a cell: [`CHECKSUM_BASE`] plus the terms of
/// every word, modulo 2^32 (an order-free sum: lanes add their words' terms in any order).
pub fn value_checksum(words: &[u32]) -> u32 {
    (0..).zip(words).fold(CHECKSUM_BASE, |sum, (i, &w)| sum.wrapping_add(checksum_term(i, w)))
}

/// Top-level bucket of location `location`'s hash in a top level of `2^top_level` buckets:
/// the `top_level` high bits of the location's number (`location_bits` of them; 0: every
/// location hashes into the whole level) followed by the hash. A level of fewer buckets than
/// locations has locations share them; every level's bucket is the parent of the next's.
///
/// Each shift is split in two, as in the kernel, so that no amount reaches 32: with
/// `location_bits` 0 the location shifts out entirely, and with `top_level` 0 so does the hash.
pub fn top_bucket(hash: u32, location: u32, top_level: u32, location_bits: u32) -> u32 {
    let placed = ((location << 1) << (31 - location_bits)) | (hash >> location_bits);
    (placed >> 1) >> (31 - top_level)
}

/// The top-level bucket of every hash location of `key`, and its fingerprint.
pub fn locate(key: &[u32], seeds: &Seeds, top_level: u32, location_bits: u32) -> (Vec<u32>, u32) {
    let tops = (0..)
        .zip(&seeds.locations)
        .map(|(h, &s)| top_bucket(hash_words(key, s), h, top_level, location_bits))
        .collect();
    (tops, hash_words(key, seeds.fingerprint))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur_finaliser_matches_reference_values() {
        // Reference values of MurmurHash3's fmix32.
        assert_eq!(fmix(0), 0);
        assert_eq!(fmix(1), 0x514E_28B7);
    }

    #[test]
    fn value_checksums_are_pinned() {
        // The same numbers as `checksum_term` in gpu/shaders/common/hash.wgsl must give.
        assert_eq!(value_checksum(&[0]), 0xFCD4_1575);
        assert_eq!(value_checksum(&[1]), 0xA0E8_9B6A);
        assert_eq!(value_checksum(&[1, 2, 3]), 0xBFE6_0AD3);
        assert_eq!(value_checksum(&[0xDEAD_BEEF, 0, 0xFFFF_FFFF]), 0x411A_4D47);
    }

    #[test]
    fn no_cell_of_zeros_has_a_zero_checksum() {
        // Every cell size a table can have: 1 to 16384 value words.
        let mut sum = CHECKSUM_BASE;
        for i in 0..16384 {
            sum = sum.wrapping_add(checksum_term(i, 0));
            assert_ne!(sum, 0, "a cell of {} zero words", i + 1);
        }
    }

    #[test]
    fn every_single_word_change_changes_the_checksum() {
        let words = [0x0102_0304u32, 0, 0xFFFF_FFFF, 7];
        let sum = value_checksum(&words);
        for i in 0..words.len() {
            for flip in [1u32, 0x80, 0x100, 0x8000_0000, 0xFFFF_FFFF, 0x5A5A_0000] {
                let mut changed = words;
                changed[i] ^= flip;
                assert_ne!(value_checksum(&changed), sum, "word {i} ^ {flip:#x}");
            }
        }
    }

    #[test]
    fn top_buckets_nest_across_levels() {
        for (hashes, bits) in [(2, 0), (2, 1), (4, 2), (3, 0)] {
            let seeds = Seeds::new(42, hashes);
            for k in 0..1000u32 {
                let key = [k, k ^ 0xFFFF];
                let (t10, _) = locate(&key, &seeds, 10, bits);
                let (t11, _) = locate(&key, &seeds, 11, bits);
                for h in 0..hashes as usize {
                    assert_eq!(t11[h] >> 1, t10[h], "bucket of level 10 is the parent in level 11");
                    // Apart, location h's buckets are the h-th part of the level.
                    assert_eq!(t10[h] >> (10 - bits), if bits == 0 { 0 } else { h as u32 });
                }
                // Levels of fewer buckets than locations nest too: location h's high bits.
                for t in 0..=bits {
                    let (up, down) = (locate(&key, &seeds, t + 1, bits).0, locate(&key, &seeds, t, bits).0);
                    for h in 0..hashes as usize {
                        assert_eq!(up[h] >> 1, down[h], "level {t} under level {}", t + 1);
                        if t < bits {
                            assert_eq!(up[h], h as u32 >> (bits - t - 1));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn seeds_differ_per_location_and_table() {
        let a = Seeds::new(1, 3);
        let b = Seeds::new(2, 3);
        assert_ne!(a, b);
        assert_ne!(a.locations[0], a.locations[1]);
        assert_ne!(a.locations[2], a.fingerprint);
    }
}
