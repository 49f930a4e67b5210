// One-shot probe: the lanes of a tile read all candidate slots of one key at once.
// Twin: Model::probe in src/model.rs.

struct Located {
    tops: array<u32, HASHES>,  // top-level bucket per hash location
    fp: u32,                   // fingerprint
}

// Passes over the candidate slots: lane `l` handles candidates l, l + size, l + 2 size, ...
fn tile_passes(t: Tile) -> u32 {
    return (CANDIDATES + t.size - 1u) / t.size;
}

fn locate(key: array<u32, KEY_WORDS>) -> Located {
    var loc: Located;
    for (var h = 0u; h < HASHES; h++) {
        loc.tops[h] = top_bucket(hash_key(key, LOCATION_SEEDS[h]));
    }
    loc.fp = hash_key(key, FINGERPRINT_SEED);
    return loc;
}

fn key_at(key: array<u32, KEY_WORDS>, word: u32) -> bool {
    for (var i = 0u; i < KEY_WORDS; i++) {
        if (table_load(word + i) != key[i]) {
            return false;
        }
    }
    return true;
}

// What one lane saw of its candidates.
struct LaneProbe {
    empty: u32,        // bit k: candidate k * size + lane is EMPTY
    found_slot: u32,   // first of its candidates holding the key published (slot id), or NONE
    found_state: u32,  // that slot's state word
}

fn probe_lane(t: Tile, busy: bool, key: array<u32, KEY_WORDS>, loc: Located) -> LaneProbe {
    var p = LaneProbe(0u, NONE, 0u);
    for (var k = 0u; k < tile_passes(t); k++) {
        let c = k * t.size + t.lane;
        if (!busy || c >= CANDIDATES) {
            continue;
        }
        let bucket = candidate_bucket(loc.tops, c);
        let s = c % SLOTS;
        let state = table_load(state_word(bucket, s));
        let fp = table_load(fp_word(bucket, s));
        if (state == EMPTY) {
            p.empty |= 1u << k;
            continue;
        }
        if (state == INSERTING || p.found_slot != NONE || fp != loc.fp || !key_at(key, key_word(bucket, s))) {
            continue;
        }
        p.found_slot = bucket * SLOTS + s;
        p.found_state = state;
    }
    return p;
}

// The candidate a new key takes: the lowest empty slot of the candidate bucket with the most
// empty slots (the lowest candidate bucket on ties), or NONE when every candidate is taken.
// The same on every lane of the tile.
fn choose_empty(t: Tile, p: LaneProbe) -> u32 {
    var best_bucket = 0u;
    var best_empty = 0u;
    for (var cb = 0u; cb < CANDIDATE_BUCKETS; cb++) {
        var n = 0u;
        for (var k = 0u; k < tile_passes(t); k++) {
            let c = k * t.size + t.lane;
            if (c / SLOTS == cb && ((p.empty >> k) & 1u) == 1u) {
                n++;
            }
        }
        let total = tile_add(t, n);
        if (total > best_empty) {
            best_empty = total;
            best_bucket = cb;
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

// Takes candidate `chosen` (EMPTY -> `state`) when `wanted`, then writes the key and its
// fingerprint into it; true on every lane of the tile when the slot was taken. A false return
// with `wanted` means another operation took the slot first: probe again.
fn claim(t: Tile, wanted: bool, loc: Located, key: array<u32, KEY_WORDS>, chosen: u32, state: u32) -> bool {
    let bucket = candidate_bucket(loc.tops, chosen);
    let slot = chosen % SLOTS;
    var won = false;
    if (wanted && chosen != NONE && chosen % t.size == t.lane) {
        won = table_cas(state_word(bucket, slot), EMPTY, state) == EMPTY;
    }
    let claimed = tile_ballot(t, won) != 0u;
    if (claimed) {
        // Key words and fingerprint in one store instruction across the tile.
        for (var w = t.lane; w <= KEY_WORDS; w += t.size) {
            if (w < KEY_WORDS) {
                table_store(key_word(bucket, slot) + w, key[w]);
            } else {
                table_store(fp_word(bucket, slot), loc.fp);
            }
        }
    }
    return claimed;
}

