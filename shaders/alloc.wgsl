// Allocation stage, first of phase A: every operation that carries a value takes a free cell
// of its key's arena (next-fit from the arena's cursor: `alloc_cells`, once per arena that the
// subgroup's operations need), and the tile writes the value and its checksum into it. Resets
// the per-operation records, each with its key's arena, which holds every cell it names.
// Twin: Model::alloc in src/model.rs.

#include "common/prelude.wgsl"
#include "common/protocol.wgsl"
#include "common/hash.wgsl"
#include "common/tile.wgsl"
#include "common/cells.wgsl"
#include "common/values.wgsl"

// Spread as phase A is (`owned`): the tile writes its operations' values one at a time, each
// a load of the input and a store to the pool, so a 32-lane tile serving 32 operations took
// 67-75 µs for any batch up to 4,096 on the H200 (BENCHMARKS.md, "The server's write batches").
@compute @workgroup_size(WG)
fn main(inv: Invocation, sg: Subgroup) {
    let t = tile_of(sg);
    let o = owned(inv);
    let me = o.op;
    let want = o.owns && writes_value(kinds[me]);
    var arena = 0u;
    var cell = NONE;
    if (ARENAS == 1u) {
        cell = alloc_cells(want, 0u, sg.lane, sg.size);
    } else {
        if (o.owns) {
            arena = arena_of(hash_key(load_key(me), FINGERPRINT_SEED));
        }
        // One arena at a time, the lowest that a lane still waits for (subgroup-uniform).
        var waiting = want;
        loop {
            let next = subgroupMin(select(NONE, arena, waiting));
            if (next == NONE) {
                break;
            }
            let mine = waiting && arena == next;
            let c = alloc_cells(mine, next, sg.lane, sg.size);
            if (mine) {
                cell = c;
                waiting = false;
            }
        }
    }
    if (o.owns) {
        var phase = 0u;
        if (want) {
            if (cell == NONE) {
                phase = PHASE_NO_CELL;
                count(CTRL_NO_CELL);
            } else {
                tally_add(CTRL_ALLOCATED, 1u);
            }
        }
        set_op_field(me, ST_PHASE, phase);
        set_op_field(me, ST_BUCKET, NONE);
        set_op_field(me, ST_SLOT, 0u);
        set_op_field(me, ST_CELL, cell);
        set_op_field(me, ST_FREE, NONE);
        set_op_field(me, ST_LAST_WRITE, 0u);
        set_op_field(me, ST_FIRST_DELETE, NONE);
        set_op_field(me, ST_ARENA, arena);
    }
    write_values(t, me, heap_cell(arena, cell));
    flush_tally(sg.lane);
}
