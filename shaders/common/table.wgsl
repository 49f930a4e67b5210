// Table addressing. Twins: src/layout.rs (Geometry::candidate and the word offsets) and
// src/hash.rs (top_bucket).
// uses: BUCKET_WORDS, CACHE_ENTRIES, CELL_WORDS, GROUP_BUCKETS, GROUP_SLOTS, GROUP_WORDS, HASHES
// uses: KEYS_APART, KEYS_BASE, KEY_WORDS, LEVELS, LOCATION_BITS, NONE, SLOTS, TOP_LEVEL, Word, cache_map
// uses: ctable_cas_weak, ctable_load, table_load

// Location `location`'s top-level bucket: the TOP_LEVEL high bits of the location's number in
// LOCATION_BITS bits (d-left) followed by the hash. Each shift is split in two so that no
// amount reaches 32: with LOCATION_BITS 0 the location shifts out, with TOP_LEVEL 0 the hash.
fn top_bucket(h: u32, location: u32) -> u32 {
    let placed = ((location << 1u) << (31u - LOCATION_BITS)) | (h >> LOCATION_BITS);
    return (placed >> 1u) >> (31u - TOP_LEVEL);
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

// Word `w` of bucket `bucket` (bucket indices fit 32 bits, slots are named by bucket and slot;
// word addresses are `Word`s, 64 bits in tables over 16 GiB).
fn bucket_word(bucket: u32, w: u32) -> Word {
    return Word(bucket) * Word(BUCKET_WORDS) + Word(w);
}

fn fp_word(bucket: u32, slot: u32) -> Word {
    return bucket_word(bucket, slot);
}

fn state_word(bucket: u32, slot: u32) -> Word {
    return bucket_word(bucket, SLOTS + slot);
}

fn key_word(bucket: u32, slot: u32) -> Word {
    if (KEYS_APART == 1u) {
        return KEYS_BASE + (Word(bucket) * Word(SLOTS) + Word(slot)) * Word(KEY_WORDS);
    }
    return bucket_word(bucket, 2u * SLOTS + slot * KEY_WORDS);
}

// The state word of the slot operation `op` found or claimed in phase A.
fn op_state_word(op: u32) -> Word {
    return state_word(op_field(op, ST_BUCKET), op_field(op, ST_SLOT));
}

// Compare-and-swap on a cached group copy; as `table_cas`.
fn ctable_cas(word: Word, expected: u32, desired: u32) -> u32 {
    var r = ctable_cas_weak(word, expected, desired);
    while (r.y == 0u && r.x == expected) {
        r = ctable_cas_weak(word, expected, desired);
    }
    return r.x;
}

// BktCache (twin: src/cache.rs). An entry holds a group's words exactly as the table does, then,
// in the value windows, the value cell of each of its slots by position in the group.

// The cache entry holding `group`, or NONE.
fn cache_entry(group: u32) -> u32 {
    if (CACHE_ENTRIES == 0u) {
        return NONE;
    }
    return cache_map[group];
}

// Word `w` of bucket `bucket` (a bucket offset such as `SLOTS + slot`), from the cached copy of
// its group when `entry` is one, else from the table.
fn bucket_load(entry: u32, bucket: u32, w: u32) -> u32 {
    if (entry == NONE) {
        return table_load(bucket_word(bucket, w));
    }
    return ctable_load(cached_word(entry, bucket, w));
}

// Where word `w` of `bucket` lies in the copy of its group held by `entry`.
fn cached_word(entry: u32, bucket: u32, w: u32) -> Word {
    return Word(entry * GROUP_WORDS + (bucket % GROUP_BUCKETS) * BUCKET_WORDS + w);
}

// The position of slot `slot` of `bucket` in its group.
fn group_pos(bucket: u32, slot: u32) -> u32 {
    return bucket % GROUP_BUCKETS * SLOTS + slot;
}

// Word `w` of the value of the slot at position `pos` of its group (`group_pos`) in `entry` (the
// cache lives in device memory: its regions stay within 16 GiB, 32-bit offsets).
fn cached_value_word(entry: u32, pos: u32, w: u32) -> Word {
    return Word((entry * GROUP_SLOTS + pos) * CELL_WORDS + w);
}
