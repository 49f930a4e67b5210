// BktCache kernels. Twins: `expected_entry` (what an entry must hold) and `plan` in src/cache.rs.
//
// `refresh` runs after phase B (and after a rollback), in the same submit: the table holds the
// batch's final words by then, so copying them is coherent whatever order the batch's CASes
// took. `fill` runs a slice of a loading phase in the submit of the next batch, before its
// phase A (a barrier between): no operation can read an entry while it is replaced. `decay` halves the LFU counts.

#include "common/prelude.wgsl"
#include "common/protocol.wgsl"
#include "common/hash.wgsl"
#include "common/tile.wgsl"
#include "common/table.wgsl"

// The slot an operation changed (or tried to) in phase B, as the operation whose record
// names it (its ST_BUCKET and ST_SLOT), or NONE.
fn changed_slot(op: u32) -> u32 {
    switch (op_field(op, ST_PHASE)) {
        case PHASE_CLAIMED: {
            return op;
        }
        case PHASE_FOUND, PHASE_FOLLOWS: {
            // The lead's one CAS changed the key's slot; the operation that decided the final
            // state writes it through, the others of the key need not read it again.
            let lead = lead_of(op);
            return select(NONE, lead, decides(op, lead));
        }
        case PHASE_JOINED: {
            // An upsert that joined a claim wrote its value into the claimed slot.
            if (kinds[op] == OP_UPSERT) {
                return op_field(op, ST_BUCKET);
            }
            return NONE;
        }
        default: {
            return NONE;
        }
    }
}

// Writes one operation's slot through to its cached copy: the state word as the table holds it
// now; for a claim, the key and fingerprint (from the operation itself); and the value cell, from
// the operation's input, when the slot now references the cell this operation wrote.
@compute @workgroup_size(WG)
fn refresh(inv: Invocation, sg: Subgroup) {
    let me = op_index(inv);
    var named_by = NONE;
    if (me < params.n) {
        named_by = changed_slot(me);
    }
    var bucket = NONE;
    var slot = 0u;
    var entry = NONE;
    if (named_by != NONE) {
        bucket = op_field(named_by, ST_BUCKET);
        slot = op_field(named_by, ST_SLOT);
        entry = cache_entry(bucket / GROUP_BUCKETS);
    }
    if (entry != NONE) {
        let state = table_load(state_word(bucket, slot));
        tally_add(CTRL_CACHE_REFRESHED, 1u);
        if (op_field(me, ST_PHASE) == PHASE_CLAIMED && KEYS_APART == 0u) {
            let key = load_key(me);
            for (var i = 0u; i < KEY_WORDS; i++) {
                ctable_store(cached_word(entry, bucket, 2u * SLOTS + slot * KEY_WORDS + i), key[i]);
            }
            ctable_store(cached_word(entry, bucket, slot), hash_key(key, FINGERPRINT_SEED));
        }
        ctable_store(cached_word(entry, bucket, SLOTS + slot), state);
        let cell = op_field(me, ST_CELL);
        if (state >= PUBLISHED && state - PUBLISHED == cell) {
            // The cell as the allocation stage wrote it: the value, then its checksum.
            var checksum = CHECKSUM_BASE;
            for (var w = 0u; w < VALUE_WORDS; w++) {
                let v = vals_in[me * VALUE_WORDS + w];
                cheap_store(cached_value_word(entry, group_pos(bucket, slot), w), v);
                checksum += checksum_term(w, v);
            }
            cheap_store(cached_value_word(entry, group_pos(bucket, slot), VALUE_WORDS), checksum);
        }
    }
    flush_tally(sg.lane);
}

// One fill of a loading slice per tile (`cache_plan` holds the number of fills, then entry,
// group pairs; the dispatch has TILE invocations per fill): the entry drops its group (unmapped first), takes a copy of
// the new group and of the value of each published slot, and is mapped. Lanes copy with
// consecutive words; each reads the state words of its own slot positions, so a group costs a
// few parallel reads of the table and one read per published value.
@compute @workgroup_size(WG)
fn fill(inv: Invocation, sg: Subgroup) {
    let t = tile_of(sg);
    let item = op_index(inv) / t.size;
    let busy = item < cache_plan[0];
    var entry = NONE;
    var group = 0u;
    if (busy) {
        entry = cache_plan[1u + 2u * item];
        group = cache_plan[2u + 2u * item];
        if (t.lane == 0u) {
            let old = cache_owner[entry];
            if (old != NONE) {
                cache_map[old] = NONE;
            }
        }
        for (var w = t.lane; w < GROUP_WORDS; w += t.size) {
            ctable_store(Word(entry * GROUP_WORDS + w), table_load(Word(group) * Word(GROUP_WORDS) + Word(w)));
        }
    }
    for (var first = 0u; first < GROUP_SLOTS; first += t.size) {
        let pos = first + t.lane;
        var state = EMPTY;
        var fp = 0u;
        if (busy && pos < GROUP_SLOTS) {
            let bucket = group * GROUP_BUCKETS + pos / SLOTS;
            state = table_load(state_word(bucket, pos % SLOTS));
            if (ARENAS > 1u) {
                fp = table_load(fp_word(bucket, pos % SLOTS));
            }
        }
        // One published position at a time, every tile of the subgroup in step.
        var published = tile_ballot(t, state >= PUBLISHED);
        loop {
            if (!subgroupAny(published != 0u)) {
                break;
            }
            let has = published != 0u;
            let src = select(0u, firstTrailingBit(published), has);
            published &= published - 1u;
            let cell = heap_cell(arena_of(tile_bcast(t, fp, src)), tile_bcast(t, state, src) - PUBLISHED);
            if (has) {
                for (var w = t.lane; w < CELL_WORDS; w += t.size) {
                    cheap_store(cached_value_word(entry, first + src, w), heap_load(cell_word(cell, w)));
                }
            }
        }
    }
    if (busy && t.lane == 0u) {
        cache_map[group] = entry;
        cache_owner[entry] = group;
        tally_add(CTRL_CACHE_FILLED, 1u);
    }
    flush_tally(sg.lane);
}

// LFU ageing at each loading phase: every count halves (one invocation per group).
@compute @workgroup_size(WG)
fn decay(inv: Invocation) {
    let g = op_index(inv);
    if (g < GROUPS) {
        atomicStore(&cache_counts[g], atomicLoad(&cache_counts[g]) >> 1u);
    }
}
