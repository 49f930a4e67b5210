// Allocation stage, first of phase A: every operation that carries a value takes a free cell
// of the heap (a subgroup's cells adjacent where they are free) and its value and checksum are
// written into it. Resets the per-operation records.
// Twin: Model::alloc in src/model.rs.

#include "common/prelude.wgsl"
#include "common/protocol.wgsl"
#include "common/hash.wgsl"
#include "common/tile.wgsl"
#include "common/cells.wgsl"
#include "common/values.wgsl"

@compute @workgroup_size(WG)
fn main(inv: Invocation, sg: Subgroup) {
    let t = tile_of(sg);
    let me = op_index(inv);
    let live = me < params.n;
    let wants = live && writes_value(kinds[me]);
    let cell = alloc_cells(wants, sg.lane == 0u, subgroupBroadcastFirst(me));
    if (live) {
        var phase = 0u;
        if (wants && cell == NONE) {
            phase = PHASE_NO_CELL;
            count(CTRL_NO_CELL);
        } else if (wants) {
            tally_add(CTRL_ALLOCATED, 1u);
        }
        set_op_field(me, ST_PHASE, phase);
        set_op_field(me, ST_SLOT, NONE);
        set_op_field(me, ST_CELL, cell);
        set_op_field(me, ST_FREE, NONE);
        set_op_field(me, ST_LAST_WRITE, 0u);
        set_op_field(me, ST_FIRST_DELETE, NONE);
    }
    write_values(t, me, cell);
    flush_tally(sg.lane);
}
