// Table addressing. Twins: src/layout.rs (Geometry::candidate and the word offsets) and
// src/hash.rs (top_bucket).

// The TOP_LEVEL high bits; two shifts keep each amount below 32 when TOP_LEVEL is 0.
fn top_bucket(h: u32) -> u32 {
    return (h >> 1u) >> (31u - TOP_LEVEL);
}

// Global bucket index of candidate `c` of a key whose top-level buckets are `tops`.
fn candidate_bucket(tops: array<u32, HASHES>, c: u32) -> u32 {
    let cb = c / SLOTS;
    let level = cb % LEVELS;
    let top = tops[cb / LEVELS];
    let group = top >> (LEVELS - 1u);
    let level_start = (1u << LEVELS) - (1u << (LEVELS - level));
    let local = (top >> level) & ((1u << (LEVELS - 1u - level)) - 1u);
    return group * GROUP_BUCKETS + level_start + local;
}

fn fp_word(bucket: u32, slot: u32) -> u32 {
    return bucket * BUCKET_WORDS + slot;
}

fn state_word(bucket: u32, slot: u32) -> u32 {
    return bucket * BUCKET_WORDS + SLOTS + slot;
}

fn key_word(bucket: u32, slot: u32) -> u32 {
    return bucket * BUCKET_WORDS + 2u * SLOTS + slot * KEY_WORDS;
}

fn state_word_of_id(id: u32) -> u32 {
    return state_word(id / SLOTS, id % SLOTS);
}
