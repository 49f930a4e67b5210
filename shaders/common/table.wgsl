// Table addressing. Twin: src/layout.rs (Geometry::candidate and the word offsets).

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

// Compare-and-swap that fails only when the word differs from `expected`; returns the word
// seen (success iff it equals `expected`). Weak CAS may fail spuriously: retry those.
fn table_cas(word: u32, expected: u32, desired: u32) -> u32 {
    var r = table_cas_weak(word, expected, desired);
    while (r.y == 0u && r.x == expected) {
        r = table_cas_weak(word, expected, desired);
    }
    return r.x;
}

fn mark_table_words(first: u32, count: u32) {
    mark_words(params.table_line_base, first, count);
}

fn mark_heap_words(first: u32, count: u32) {
    mark_words(params.heap_line_base, first, count);
}
