// The slab table (SlabHash made persistent with an undo log): codes, per-operation records,
// addressing, allocators and the tile-cooperative slab read shared by the slab kernels.
// Twin: src/baselines/slab/layout.rs (addresses) and model.rs (operations); change together.

const OP_GET: u32 = 1u;
const OP_INSERT: u32 = 2u;
const OP_UPSERT: u32 = 3u;
const OP_UPDATE: u32 = 4u;
const OP_DELETE: u32 = 5u;

const STATUS_OK: u32 = 1u;
const STATUS_NOT_FOUND: u32 = 2u;
const STATUS_EXISTS: u32 = 3u;

const NONE: u32 = 0xffffffffu;
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

// Control words at the start of `state`; the host reads and clears them around each submit.
const C_DIRTY: u32 = 0u;
const C_NO_CELL: u32 = 1u;
const C_NO_SLAB: u32 = 2u;
const C_LOG_COUNT: u32 = 3u;
const C_PUBLISHED: u32 = 4u;
const C_DELETED: u32 = 5u;
const C_DEFERRED: u32 = 6u;
const C_NEW_SLABS: u32 = 7u;
const C_BAD_KIND: u32 = 8u;
const C_MUTATING: u32 = 9u;

fn writes_value(kind: u32) -> bool {
    return kind == OP_INSERT || kind == OP_UPSERT || kind == OP_UPDATE;
}

fn creates_key(kind: u32) -> bool {
    return kind == OP_INSERT || kind == OP_UPSERT;
}

fn op_get(op: u32, f: u32) -> u32 {
    return atomicLoad(&opstate[op * OP_FIELDS + f]);
}

fn op_set(op: u32, f: u32, v: u32) {
    atomicStore(&opstate[op * OP_FIELDS + f], v);
}

// The operation of this invocation: workgroups may be laid out in two dimensions.
fn op_index(wid: vec3<u32>, nwg: vec3<u32>, li: u32) -> u32 {
    return (wid.y * nwg.x + wid.x) * WG + li;
}

fn count(c: u32) {
    atomicAdd(&state[c], 1u);
}

// Appends one pool cache line to the dirty list; the host persists exactly these lines.
fn mark_line(line: u32) {
    if (params.track_lines == 0u) {
        return;
    }
    let i = atomicAdd(&state[C_DIRTY], 1u);
    if (i < params.dirty_cap) {
        dirty[i] = line;
    }
}

fn mark_words(line_base: u32, first: u32, n: u32) {
    for (var l = first / 16u; l <= (first + n - 1u) / 16u; l++) {
        mark_line(line_base + l);
    }
}

fn mark_table_words(first: u32, n: u32) {
    mark_words(params.table_line_base, first, n);
}

fn mark_heap_words(first: u32, n: u32) {
    mark_words(params.heap_line_base, first, n);
}

fn slab_word(s: u32) -> u32 {
    return SLAB_BASE + s * 32u;
}

fn log_word(i: u32) -> u32 {
    return LOG_BASE + i * 33u;
}

fn load_key(op: u32) -> array<u32, KEY_WORDS> {
    var key: array<u32, KEY_WORDS>;
    for (var i = 0u; i < KEY_WORDS; i++) {
        key[i] = keys[op * KEY_WORDS + i];
    }
    return key;
}

// Twin: SlabGeometry::bucket.
fn bucket_of(key: array<u32, KEY_WORDS>) -> u32 {
    return hash_key(key, SEED) % BUCKETS;
}

// Compare-and-swap that fails only when the word differs from `expected`; returns the word
// seen (success iff it equals `expected`).
fn table_cas(word: u32, expected: u32, desired: u32) -> u32 {
    var r = table_cas_weak(word, expected, desired);
    while (r.y == 0u && r.x == expected) {
        r = table_cas_weak(word, expected, desired);
    }
    return r.x;
}

// Takes a clear bit of the bitmap at `state[base ..base + words]`, scanning from word `start`:
// an atomic OR sets the lowest clear bit, which is ours if it was clear before. NONE when full.
fn bitmap_take(base: u32, nwords: u32, start: u32) -> u32 {
    var w = start % nwords;
    for (var scanned = 0u; scanned < nwords;) {
        let bits = atomicLoad(&state[base + w]);
        if (bits == 0xffffffffu) {
            w = (w + 1u) % nwords;
            scanned++;
            continue;
        }
        let bit = firstTrailingBit(~bits);
        let before = atomicOr(&state[base + w], 1u << bit);
        if ((before & (1u << bit)) == 0u) {
            return w * 32u + bit;
        }
    }
    return NONE;
}

fn bitmap_release(base: u32, i: u32) {
    atomicAnd(&state[base + i / 32u], ~(1u << (i % 32u)));
}

fn free_cell(c: u32) {
    if (c < CELLS) {
        bitmap_release(CELL_BITMAP, c);
    }
}

// The tile's operation: the lowest lane with a pending operation leads it.
struct Turn {
    busy: bool,    // this tile has an operation this round
    leader: bool,  // this lane owns it
    lead: u32,     // the owning lane, within the tile
    op: u32,       // its index in the batch
}

fn take_turn(t: Tile, pending: bool, me: u32) -> Turn {
    let req = tile_ballot(t, pending);
    let busy = req != 0u;
    let lead = select(0u, firstTrailingBit(req), busy);
    let op = tile_bcast(t, me, lead);
    return Turn(busy, busy && t.lane == lead, lead, op);
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
