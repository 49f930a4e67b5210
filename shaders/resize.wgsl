// Resizing into a table one level taller (TOP_LEVEL = SOURCE_TOP_LEVEL + 1). The old table is
// `source_load`; the new one, zeroed, is the table. Every level of the old table but its bottom
// keeps its buckets (a level-l bucket keeps its index in level l; only the grouping changes):
// `relocate` copies them. The keys of the old bottom level are inserted into the new table with
// their state words as they are: `rehash`, one key per tile at a time, as phase A claims slots
// (where the grown heap has more arenas, the host then deals the values to them:
// `resize::redeal`). The new table becomes visible only when the host switches the header to it.
// Twins: Geometry::grown_bucket in src/layout.rs, Model::relocate and Model::rehash.

#include "common/prelude.wgsl"
#include "common/protocol.wgsl"
#include "common/hash.wgsl"
#include "common/tile.wgsl"
#include "common/table.wgsl"
#include "common/probe.wgsl"

// First bucket of level `depth` (0 = top) inside a group.
fn level_start(depth: u32) -> u32 {
    return (1u << LEVELS) - (1u << (LEVELS - depth));
}

// Where old bucket `b` goes in the new table, or NONE for the old bottom level.
fn grown_bucket(b: u32) -> u32 {
    let p = b % GROUP_BUCKETS;
    var depth = 0u;
    while (p >= level_start(depth + 1u)) {
        depth++;
    }
    if (depth == LEVELS - 1u) {
        return NONE;
    }
    let index = b / GROUP_BUCKETS * (1u << (LEVELS - 1u - depth)) + (p - level_start(depth));
    let d = depth + 1u;
    let group = index >> (LEVELS - 1u - d);
    return group * GROUP_BUCKETS + level_start(d) + (index & ((1u << (LEVELS - 1u - d)) - 1u));
}

// Copies word `w` of the old table where it goes, if it stays.
fn relocate_word(w: Word) {
    if (KEYS_APART == 1u && w >= SOURCE_KEYS_BASE) {
        // A key of the old key array follows its slot's bucket.
        let k = w - SOURCE_KEYS_BASE;
        let id = k / Word(KEY_WORDS);
        let to = grown_bucket(u32(id / Word(SLOTS)));
        if (to != NONE) {
            table_store(key_word(to, u32(id % Word(SLOTS))) + k % Word(KEY_WORDS), source_load(w));
        }
        return;
    }
    let to = grown_bucket(u32(w / Word(BUCKET_WORDS)));
    if (to != NONE) {
        table_store(bucket_word(to, u32(w % Word(BUCKET_WORDS))), source_load(w));
    }
}

// The old table's words (`SOURCE_WORDS`), with one invocation per old bucket (`params.n`):
// invocation i copies words i, i + n, i + 2n, ..., so adjacent invocations copy adjacent words
// and every count fits 32 bits.
@compute @workgroup_size(WG)
fn relocate(inv: Invocation) {
    let i = op_index(inv);
    if (i >= params.n) {
        return;
    }
    for (var w = Word(i); w < SOURCE_WORDS; w += Word(params.n)) {
        relocate_word(w);
    }
}

// Where the key of a slot of the old table begins.
fn source_key_word(bucket: u32, slot: u32) -> Word {
    if (KEYS_APART == 1u) {
        return SOURCE_KEYS_BASE + (Word(bucket) * Word(SLOTS) + Word(slot)) * Word(KEY_WORDS);
    }
    return key_word(bucket, slot);
}

// The slots of the old bottom level (`SOURCE_BOTTOM_SLOTS`: old groups * SLOTS, which may pass
// 2^32), with `params.n` invocations: invocation i takes slots i, i + n, i + 2n, ..., a round
// at a time, every invocation in every round (the tiles take turns within a subgroup).
@compute @workgroup_size(WG)
fn rehash(inv: Invocation, sg: Subgroup) {
    let t = tile_of(sg);
    let me = op_index(inv);
    for (var round = Word(0u); round < SOURCE_BOTTOM_SLOTS; round += Word(params.n)) {
        rehash_slot(t, me, round);
    }
}

// Old bottom slot `first + me` (`me` < params.n) into the new table. Subgroup-uniform.
fn rehash_slot(t: Tile, me: u32, first: Word) {
    let id = first + Word(me);
    var state = EMPTY;
    if (me < params.n && id < SOURCE_BOTTOM_SLOTS) {
        state = source_load(state_word(bottom_of(id), u32(id % Word(SLOTS))));
    }
    var pending = state >= PUBLISHED;
    loop {
        if (!subgroupAny(pending)) {
            break;
        }
        let turn = take_turn(t, pending, me);
        let its = first + Word(turn.op);
        var key: array<u32, KEY_WORDS>;
        if (turn.busy) {
            for (var i = 0u; i < KEY_WORDS; i++) {
                key[i] = source_load(source_key_word(bottom_of(its), u32(its % Word(SLOTS))) + Word(i));
            }
        }
        let loc = locate(key);
        let p = probe(t, turn.busy, key, loc);
        let chosen = choose_empty(t, p);
        // Published at once: nothing else reads the new table before the switch.
        let won = claim(t, turn.busy, loc, key, chosen, tile_bcast(t, state, turn.lead));
        if (turn.leader) {
            if (chosen == NONE) {
                count(CTRL_FULL);
                pending = false;
            } else if (won) {
                count(CTRL_PUBLISHED);
                pending = false;
            }
        }
    }
}

// The old bottom bucket of old bottom slot `id` (its group's last bucket).
fn bottom_of(id: Word) -> u32 {
    return (u32(id / Word(SLOTS)) + 1u) * GROUP_BUCKETS - 1u;
}
