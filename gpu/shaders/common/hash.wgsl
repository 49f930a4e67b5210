// Key hashing: MurmurHash3-style 32-bit hashes over the key's words, and value checksums.
// Twin: gphash's src/hash.rs; change both together.
// uses: KEY_WORDS

fn rotl(x: u32, r: u32) -> u32 {
    return (x << r) | (x >> (32u - r));
}

fn fmix(h0: u32) -> u32 {
    var h = h0;
    h ^= h >> 16u;
    h *= 0x85ebca6bu;
    h ^= h >> 13u;
    h *= 0xc2b2ae35u;
    return h ^ (h >> 16u);
}

fn hash_key(key: array<u32, KEY_WORDS>, seed: u32) -> u32 {
    var h = seed;
    for (var i = 0u; i < KEY_WORDS; i++) {
        let k = rotl(key[i] * 0xcc9e2d51u, 15u) * 0x1b873593u;
        h = rotl(h ^ k, 13u) * 5u + 0xe6546b64u;
    }
    return fmix(h ^ (KEY_WORDS * 4u));
}

// Value checksums (twin: `value_checksum` in src/hash.rs): CHECKSUM_BASE plus, for each value
// word, a bijective mix of the word and its position. A sum, so a tile adds its lanes' terms
// with one reduction in any order.
const CHECKSUM_BASE: u32 = 0x6a09e667u;

fn checksum_term(i: u32, w: u32) -> u32 {
    return fmix(w ^ ((i + 1u) * 0x9e3779b9u));
}
