// The probe of one key by its tile: the lanes read the candidate slots of cached groups from
// device memory first (BktCache), then the table's top-level candidates, then its lower levels,
// each round only when the rounds before did not find the key.
// Twin: Model::probe in src/model.rs.
// uses: CANDIDATES, CANDIDATE_BUCKETS, CTRL_CACHE_STALE, EMPTY, FINGERPRINT_SEED, HASHES
// uses: INSERTING, KEY_WORDS, LEVELS, LOCATION_SEEDS, NONE, SLOTS, Tile, bucket_load, cache_entry
// uses: cached_word, candidate_bucket, count, ctable_cas, ctable_load, ctable_store, fp_word
// uses: hash_key, key_word, state_word, table_cas, table_load, table_store, tile_add, tile_ballot
// uses: Word, tile_min, top_bucket

struct Located {
    tops: array<u32, HASHES>,     // top-level bucket per hash location
    entries: array<u32, HASHES>,  // cache entry holding each location's group, or NONE
    fp: u32,                      // fingerprint
}

// Passes over the candidate slots: lane `l` handles candidates l, l + size, l + 2 size, ...
fn tile_passes(t: Tile) -> u32 {
    return (CANDIDATES + t.size - 1u) / t.size;
}

fn locate(key: array<u32, KEY_WORDS>) -> Located {
    var loc: Located;
    for (var h = 0u; h < HASHES; h++) {
        loc.tops[h] = top_bucket(hash_key(key, LOCATION_SEEDS[h]), h);
        loc.entries[h] = cache_entry(loc.tops[h] >> (LEVELS - 1u));
    }
    loc.fp = hash_key(key, FINGERPRINT_SEED);
    return loc;
}

// The cache entry candidate `c` is read from (NONE: the table).
fn candidate_entry(loc: Located, c: u32) -> u32 {
    return loc.entries[min(c, CANDIDATES - 1u) / (SLOTS * LEVELS)];
}

// Whether the slot holds `key` (a cached copy holds the keys in its buckets: with keys apart
// there is no cache).
fn key_at(key: array<u32, KEY_WORDS>, entry: u32, bucket: u32, slot: u32) -> bool {
    for (var i = 0u; i < KEY_WORDS; i++) {
        var w: u32;
        if (entry == NONE) {
            w = table_load(key_word(bucket, slot) + Word(i));
        } else {
            w = ctable_load(cached_word(entry, bucket, 2u * SLOTS + slot * KEY_WORDS + i));
        }
        if (w != key[i]) {
            return false;
        }
    }
    return true;
}

// What one lane saw of its candidates.
struct LaneProbe {
    empty: u32,         // bit k: candidate k * size + lane is EMPTY
    found_bucket: u32,  // the bucket of its first candidate holding the key published, or NONE
    found_slot: u32,    // that candidate's slot in the bucket
    found_state: u32,   // that slot's state word
    found_entry: u32,  // the cache entry it was read from, or NONE
}

// Reads this lane's candidates in levels `top .. end` (0: the top level) that lie in cached
// groups (`cached`) or in the others.
fn probe_lane(t: Tile, busy: bool, key: array<u32, KEY_WORDS>, loc: Located, cached: bool, top: u32, end: u32) -> LaneProbe {
    var p = LaneProbe(0u, NONE, 0u, 0u, NONE);
    for (var k = 0u; k < tile_passes(t); k++) {
        let c = k * t.size + t.lane;
        let level = (c / SLOTS) % LEVELS;
        if (!busy || c >= CANDIDATES || level < top || level >= end) {
            continue;
        }
        let entry = candidate_entry(loc, c);
        if ((entry != NONE) != cached) {
            continue;
        }
        let bucket = candidate_bucket(loc.tops, c);
        let s = c % SLOTS;
        let state = bucket_load(entry, bucket, SLOTS + s);
        let fp = bucket_load(entry, bucket, s);
        if (state == EMPTY) {
            p.empty |= 1u << k;
            continue;
        }
        if (state == INSERTING || p.found_bucket != NONE || fp != loc.fp || !key_at(key, entry, bucket, s)) {
            continue;
        }
        p.found_bucket = bucket;
        p.found_slot = s;
        p.found_state = state;
        p.found_entry = entry;
    }
    return p;
}

// The whole probe of the tile's key: cached groups first; then the table's top-level candidates
// of every hash location, and its lower levels only when the key was not found above. Inserts
// fill lower levels only when the key's top-level buckets are full (`choose_empty`), so the top
// level holds most keys (about 88% at a load of 0.75 for 2L-2H-8S, all of them up to about 0.6),
// and a positive search mostly reads half the table's candidate buckets over PCIe. Every lane of
// the tile gets its own candidates' view: all of them when the key is absent.
fn probe(t: Tile, busy: bool, key: array<u32, KEY_WORDS>, loc: Located) -> LaneProbe {
    var p = probe_lane(t, busy, key, loc, true, 0u, LEVELS);
    var found = tile_ballot(t, p.found_bucket != NONE) != 0u;
    // Round 0 reads the top level, round 1 the levels below it.
    for (var round = 0u; round < 2u; round++) {
        let q = probe_lane(t, busy && !found, key, loc, false, round, select(1u, LEVELS, round == 1u));
        // Each candidate is read in at most one pass, and the key is in at most one slot.
        p.empty |= q.empty;
        if (q.found_bucket != NONE) {
            p.found_bucket = q.found_bucket;
            p.found_slot = q.found_slot;
            p.found_state = q.found_state;
            p.found_entry = q.found_entry;
        }
        found = tile_ballot(t, p.found_bucket != NONE) != 0u;
    }
    return p;
}

// Hash locations whose group the probe read from the table: none when the key was found in a
// cached group (`found_entry`; NONE when it was not found or not in a cached group).
fn table_group_reads(loc: Located, found_entry: u32) -> u32 {
    if (found_entry != NONE) {
        return 0u;
    }
    var n = 0u;
    for (var h = 0u; h < HASHES; h++) {
        n += u32(loc.entries[h] == NONE);
    }
    return n;
}

// The candidate a new key takes: the lowest empty slot of the candidate bucket with the most
// empty slots in the highest level that has one (the lowest candidate bucket on ties), or NONE
// when every candidate is taken. Lower levels, whose buckets each serve two buckets of the level
// above, are an overflow: filled only when the key's upper buckets are, they keep room for the
// keys whose upper buckets fill first (2L-2H-8S first fails at a load of about 0.90 instead of
// 0.81-0.86, and searches find most keys in their top-level buckets). With each location in a
// part of its own (LOCATION_BITS), the tie rule is d-left's "go left": 0.91-0.92. The same on
// every lane.
fn choose_empty(t: Tile, p: LaneProbe) -> u32 {
    var best_bucket = 0u;
    var best_empty = 0u;
    var best_level = LEVELS;
    for (var cb = 0u; cb < CANDIDATE_BUCKETS; cb++) {
        var n = 0u;
        for (var k = 0u; k < tile_passes(t); k++) {
            let c = k * t.size + t.lane;
            if (c / SLOTS == cb && ((p.empty >> k) & 1u) == 1u) {
                n++;
            }
        }
        let total = tile_add(t, n);
        let level = cb % LEVELS;
        if (total > 0u && (level < best_level || (level == best_level && total > best_empty))) {
            best_empty = total;
            best_bucket = cb;
            best_level = level;
        }
    }
    var mine = NONE;
    for (var k = 0u; k < tile_passes(t); k++) {
        let c = k * t.size + t.lane;
        if (c / SLOTS == best_bucket && ((p.empty >> k) & 1u) == 1u) {
            mine = min(mine, c);
        }
    }
    return tile_min(t, mine);
}

// EMPTY -> `state` on a slot. In a cached group the copy decides between claimants (every
// operation of the batch probed that copy), then the table follows; the table's CAS cannot then
// fail, since the copy and the table agree between batches. Should it fail, the copy takes the
// table's word and the claim is lost (retried), and the stale copy is counted.
fn claim_slot(entry: u32, bucket: u32, slot: u32, state: u32) -> bool {
    if (entry == NONE) {
        return table_cas(state_word(bucket, slot), EMPTY, state) == EMPTY;
    }
    let copy = cached_word(entry, bucket, SLOTS + slot);
    if (ctable_cas(copy, EMPTY, state) != EMPTY) {
        return false;
    }
    let seen = table_cas(state_word(bucket, slot), EMPTY, state);
    if (seen != EMPTY) {
        ctable_store(copy, seen);
        count(CTRL_CACHE_STALE);
        return false;
    }
    return true;
}

// Takes candidate `chosen` (EMPTY -> `state`) when `wanted`, then writes the key and its
// fingerprint into it; true on every lane of the tile when the slot was taken. A false return
// with `wanted` means another operation took the slot first: probe again. (A cached copy
// receives the key and fingerprint from the write-through refresh after phase B.)
fn claim(t: Tile, wanted: bool, loc: Located, key: array<u32, KEY_WORDS>, chosen: u32, state: u32) -> bool {
    let bucket = candidate_bucket(loc.tops, chosen);
    let slot = chosen % SLOTS;
    var won = false;
    if (wanted && chosen != NONE && chosen % t.size == t.lane) {
        won = claim_slot(candidate_entry(loc, chosen), bucket, slot, state);
    }
    let claimed = tile_ballot(t, won) != 0u;
    if (claimed) {
        // Key words and fingerprint in one store instruction across the tile.
        for (var w = t.lane; w <= KEY_WORDS; w += t.size) {
            if (w < KEY_WORDS) {
                table_store(key_word(bucket, slot) + Word(w), key[w]);
            } else {
                table_store(fp_word(bucket, slot), loc.fp);
            }
        }
    }
    return claimed;
}

