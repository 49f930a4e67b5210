// gphash's protocol: phase markers, slot states, control words and the per-operation record,
// on top of what every table shares.
// Twin: src/protocol.rs; the numbers must match (a test in src/gpu/shader.rs compares them).
// uses: ARENAS, ARENA_BITS, control, opstate, params.spread, params.n

#include "common/ops.wgsl"
#include "common/pool.wgsl"

const PHASE_DONE: u32 = 1u;
const PHASE_FOUND: u32 = 2u;
const PHASE_CLAIMED: u32 = 3u;
const PHASE_FULL: u32 = 4u;
const PHASE_NO_CELL: u32 = 5u;
const PHASE_JOINED: u32 = 6u;
const PHASE_FOLLOWS: u32 = 7u;

const EMPTY: u32 = 0u;
const INSERTING: u32 = 1u;
const PUBLISHED: u32 = 2u;

// Control words after CTRL_DIRTY_COUNT (0).
const CTRL_NEED_B: u32 = 1u;
const CTRL_FULL: u32 = 2u;
const CTRL_NO_CELL: u32 = 3u;
const CTRL_PUBLISHED: u32 = 4u;
const CTRL_DELETED: u32 = 5u;
const CTRL_CACHE_TARGETS: u32 = 6u;
const CTRL_CACHE_HITS: u32 = 7u;
const CTRL_CACHE_GROUPS_SAVED: u32 = 8u;
const CTRL_CACHE_VALUES_SAVED: u32 = 9u;
const CTRL_CACHE_REFRESHED: u32 = 10u;
const CTRL_CACHE_STALE: u32 = 11u;
const CTRL_CACHE_FILLED: u32 = 12u;
const CTRL_ALLOCATED: u32 = 13u;
const CTRL_REFUSED: u32 = 14u;
const CTRL_WORDS: u32 = 16u;

// Per-operation record (9 words), twin of `OpState`.
const ST_PHASE: u32 = 0u;
const ST_BUCKET: u32 = 1u;
const ST_CELL: u32 = 2u;
const ST_FREE: u32 = 3u;
const ST_LAST_WRITE: u32 = 4u;
const ST_FIRST_DELETE: u32 = 5u;
const ST_FOUND: u32 = 6u;
const ST_ARENA: u32 = 7u;
const ST_SLOT: u32 = 8u;
const ST_WORDS: u32 = 9u;

// A key's value cells are all in the arena its fingerprint names (`common/cells.wgsl`).
// The arena of the key whose fingerprint is `fp`.
fn arena_of(fp: u32) -> u32 {
    return (fp >> 1u) >> (31u - ARENA_BITS);
}

// Cell `local` of arena `arena`, as `cell_word` takes it; NONE stays NONE.
fn heap_cell(arena: u32, local: u32) -> vec2<u32> {
    return select(vec2((local >> 5u) * ARENAS + arena, local & 31u), vec2(NONE, 0u), local == NONE);
}

fn op_field(op: u32, field: u32) -> u32 {
    return atomicLoad(&opstate[op * ST_WORDS + field]);
}

fn set_op_field(op: u32, field: u32, v: u32) {
    atomicStore(&opstate[op * ST_WORDS + field], v);
}

// The lead of the changes to a found key that `op` takes part in (FOUND: itself; FOLLOWS: the
// one it recorded).
fn lead_of(op: u32) -> u32 {
    return select(op, op_field(op, ST_BUCKET), op_field(op, ST_PHASE) == PHASE_FOLLOWS);
}

// Whether `op` decides its found key's final state: the first delete if the batch deletes the
// key, else the last writer (see `change` in phase_b.wgsl).
fn decides(op: u32, lead: u32) -> bool {
    let first_delete = op_field(lead, ST_FIRST_DELETE);
    return select(op + 1u == op_field(lead, ST_LAST_WRITE), op == first_delete, first_delete != NONE);
}

// Per-invocation counts, added to the control block once per subgroup by `flush_tally`: the
// hot kernels would otherwise make every operation contend for the same few atomic words.
var<private> tally: array<u32, CTRL_WORDS>;

fn tally_add(counter: u32, n: u32) {
    tally[counter] += n;
}

// Call from subgroup-uniform control flow, once at the end of the kernel.
fn flush_tally(sg_lane: u32) {
    for (var c = 0u; c < CTRL_WORDS; c++) {
        let total = subgroupAdd(tally[c]);
        if (sg_lane == 0u && total != 0u) {
            atomicAdd(&control[c], total);
        }
    }
}

// The dispatch has `params.spread` invocations per operation (a power of two up to the tile's
// width), and the lanes whose invocation index is a multiple of it own one operation each: a
// tile serves its lanes' operations one at a time, so a small batch is spread out to one
// operation per tile and fills the GPU. Phase A's tiles are `params.tile` lanes wide: wide for
// small batches (each probe's candidates read at once), narrow for large ones (more operations'
// reads in flight per subgroup); the allocation stage's are as wide as can be (a value written
// a whole line at a time). Each operation has exactly one owner whatever the mapping of
// invocations to lanes.
struct Owned {
    op: u32,     // the operation of this invocation's lane
    owns: bool,  // the lane owns it (the first of its invocations, within the batch)
}

fn owned(inv: Invocation) -> Owned {
    let me = op_index(inv);
    let op = me / params.spread;
    return Owned(op, me % params.spread == 0u && op < params.n);
}
