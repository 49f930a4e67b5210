// The slab table (SlabHash made persistent with an undo log): codes, per-operation records,
// addressing, allocators and the tile-cooperative slab read shared by the slab kernels.
// Twin: src/systems/slab/layout.rs (addresses) and model.rs (operations); change together.
// uses: BUCKETS, CELLS, CELL_BITMAP, ENTRIES, ENTRY_WORDS, KEY_WORDS, LOG_BASE, SEED, SLAB_BASE
// uses: control, opstate, table_load

#include "common/ops.wgsl"
#include "common/pool.wgsl"
#include "common/hash.wgsl"
#include "common/tile.wgsl"
#include "common/bitmap.wgsl"

// Reference words: a free entry, an entry whose key is being written, published cells below.
const EMPTY: u32 = 0xffffffffu;
const FILLING: u32 = 0xfffffffeu;
const MAX_REF: u32 = 0xfffffff0u;

// Where an operation stands (opstate field F_PHASE).
const PH_PENDING: u32 = 0u;  // the next probe serves it
const PH_DONE: u32 = 1u;     // finished, status written
const PH_FOUND: u32 = 2u;    // found its key at F_POS with reference F_REF: commit swings or empties it
const PH_CLAIMED: u32 = 3u;  // claimed the entry at F_POS (FILLING) and wrote its key: commit publishes
const PH_JOINED: u32 = 4u;   // another operation (F_HOLDER) creates its key this round
const PH_NO_SLAB: u32 = 5u;  // no free slab: the batch is rolled back
const PH_NO_CELL: u32 = 6u;  // no free cell: the batch is not applied
const PH_BAD_KIND: u32 = 7u; // unknown operation code: the batch is not applied

// Per-operation record: OP_FIELDS words per operation.
const OP_FIELDS: u32 = 8u;
const F_PHASE: u32 = 0u;
const F_POS: u32 = 1u;     // table word of the entry's reference word
const F_REF: u32 = 2u;     // the reference the probe saw there
const F_CELL: u32 = 3u;    // this operation's fresh value cell, or NONE
const F_JOINER: u32 = 4u;  // creators: 1 + the upsert joiner whose value they publish, or 0
const F_HOLDER: u32 = 5u;  // joiners: the creating operation

// Control words at the start of `control` after CTRL_DIRTY_COUNT (0); the host reads and
// clears them around each submit (twin: `ctl` in src/systems/slab/shader.rs, which a test
// compares with these). The allocators' bitmaps and the bucket marks follow them.
const C_NO_CELL: u32 = 1u;
const C_NO_SLAB: u32 = 2u;
const C_LOG_COUNT: u32 = 3u;
const C_PUBLISHED: u32 = 4u;
const C_DELETED: u32 = 5u;
const C_DEFERRED: u32 = 6u;
const C_NEW_SLABS: u32 = 7u;
const C_BAD_KIND: u32 = 8u;
const C_MUTATING: u32 = 9u;

// The slab and cell bitmaps live in `control` (at SLAB_BITMAP and CELL_BITMAP).
fn bitmap_load(w: u32) -> u32 { return atomicLoad(&control[w]); }
fn bitmap_or(w: u32, bits: u32) -> u32 { return atomicOr(&control[w], bits); }
fn bitmap_and(w: u32, bits: u32) { atomicAnd(&control[w], bits); }
// No summary of full words: SlabHash's allocator scans word by word.
fn bitmap_full_run(w: u32) -> u32 { return 0u; }
fn bitmap_mark_full(w: u32) {}
fn bitmap_mark_free(w: u32) {}

fn creates_key(kind: u32) -> bool {
    return kind == OP_INSERT || kind == OP_UPSERT;
}

fn op_get(op: u32, f: u32) -> u32 {
    return atomicLoad(&opstate[op * OP_FIELDS + f]);
}

fn op_set(op: u32, f: u32, v: u32) {
    atomicStore(&opstate[op * OP_FIELDS + f], v);
}

fn slab_word(s: u32) -> u32 {
    return SLAB_BASE + s * 32u;
}

fn log_word(i: u32) -> u32 {
    return LOG_BASE + i * 33u;
}

// Twin: SlabGeometry::bucket.
fn bucket_of(key: array<u32, KEY_WORDS>) -> u32 {
    return hash_key(key, SEED) % BUCKETS;
}

fn free_cell(c: u32) {
    if (c < CELLS) {
        bitmap_release(CELL_BITMAP, c);
    }
}

// The words of the slab a lane read: word p * size + lane in seen[p] (8 passes for a 4-lane
// tile, 1 for a 32-lane one).
var<private> seen: array<u32, 8>;

// What a tile saw in one slab: bit w of a mask is slab word w.
struct SlabView {
    mismatch: u32,   // key words that differ from the key sought
    published: u32,  // reference words holding a published cell
    claimable: u32,  // reference words of free entries
    next: u32,       // the next-slab pointer
}

fn low_mask(n: u32) -> u32 {
    return select((1u << n) - 1u, 0xffffffffu, n >= 32u);
}

// The tile reads slab `slab` (one 128-byte request for a 32-lane tile) and compares every
// entry with `key`. A subgroup operation: call from subgroup-uniform control flow.
fn read_slab(t: Tile, busy: bool, slab: u32, key: array<u32, KEY_WORDS>) -> SlabView {
    var v = SlabView(0u, 0u, 0u, NONE);
    let passes = 32u / t.size;
    for (var p = 0u; p < passes; p++) {
        let w = p * t.size + t.lane;
        var x = 0u;
        if (busy) {
            x = table_load(slab_word(slab) + w);
        }
        seen[p] = x;
        let j = w % ENTRY_WORDS;
        let in_entry = w < ENTRIES * ENTRY_WORDS;
        let is_key = in_entry && j < KEY_WORDS;
        let is_ref = in_entry && j == KEY_WORDS;
        var want = 0u;
        if (is_key) {
            want = key[j];
        }
        let shift = p * t.size;
        v.mismatch |= tile_ballot(t, is_key && x != want) << shift;
        v.published |= tile_ballot(t, is_ref && x < MAX_REF) << shift;
        v.claimable |= tile_ballot(t, is_ref && x == EMPTY) << shift;
    }
    v.next = slab_word_value(t, 31u);
    return v;
}

// Word `w` of the slab the tile read last, on every lane. A subgroup operation.
fn slab_word_value(t: Tile, w: u32) -> u32 {
    return tile_bcast(t, seen[w / t.size], w % t.size);
}

// The entry holding the key published, or NONE.
fn entry_found(v: SlabView) -> u32 {
    for (var e = 0u; e < ENTRIES; e++) {
        let keymask = low_mask(KEY_WORDS) << (e * ENTRY_WORDS);
        let refbit = 1u << (e * ENTRY_WORDS + KEY_WORDS);
        if ((v.mismatch & keymask) == 0u && (v.published & refbit) != 0u) {
            return e;
        }
    }
    return NONE;
}

// The lowest free entry, or NONE.
fn first_claimable(v: SlabView) -> u32 {
    if (v.claimable == 0u) {
        return NONE;
    }
    return firstTrailingBit(v.claimable) / ENTRY_WORDS;
}

fn ref_word(slab: u32, e: u32) -> u32 {
    return slab_word(slab) + e * ENTRY_WORDS + KEY_WORDS;
}
