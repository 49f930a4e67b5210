// Allocation stage, first of phase A: every operation that carries a value takes a free cell
// of the heap and the tile writes the value into it. Resets the per-operation records.
// Twin: Model::alloc in src/model.rs.

#include "common/prelude.wgsl"
#include "common/protocol.wgsl"
#include "common/hash.wgsl"
#include "common/tile.wgsl"
#include "common/table.wgsl"
#include "common/probe.wgsl"

// Takes a free cell: scan the bitmap from a word picked by hashing the operation, set the
// lowest clear bit with an atomic OR; the bit we set is ours if it was clear before.
fn alloc_cell(op: u32) -> u32 {
    var w = fmix(op ^ params.seed) % BITMAP_WORDS;
    for (var scanned = 0u; scanned < BITMAP_WORDS;) {
        let bits = atomicLoad(&bitmap[w]);
        if (bits == 0xffffffffu) {
            w = (w + 1u) % BITMAP_WORDS;
            scanned++;
            continue;
        }
        let bit = firstTrailingBit(~bits);
        let before = atomicOr(&bitmap[w], 1u << bit);
        if ((before & (1u << bit)) == 0u) {
            return w * 32u + bit;
        }
    }
    return NONE;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32,
) {
    let t = tile_of(sg_lane, sg_size);
    let me = op_index(wid, nwg, li);
    var cell = NONE;
    if (me < params.n) {
        var phase = 0u;
        if (writes_value(kinds[me])) {
            cell = alloc_cell(me);
            if (cell == NONE) {
                phase = PHASE_NO_CELL;
                count(CTRL_NO_CELL);
            }
        }
        set_op_field(me, ST_PHASE, phase);
        set_op_field(me, ST_SLOT, NONE);
        set_op_field(me, ST_CELL, cell);
        set_op_field(me, ST_FREE, NONE);
    }
    // The tile writes each value with consecutive lanes: one request per cell.
    var pending = cell != NONE;
    loop {
        if (!subgroupAny(pending)) {
            break;
        }
        let turn = take_turn(t, pending, me);
        let c = tile_bcast(t, cell, turn.lead);
        if (turn.busy) {
            for (var w = t.lane; w < CELL_WORDS; w += t.size) {
                heap_store(c * CELL_WORDS + w, vals_in[turn.op * CELL_WORDS + w]);
            }
        }
        if (turn.leader) {
            mark_heap_words(c * CELL_WORDS, CELL_WORDS);
            pending = false;
        }
    }
}
