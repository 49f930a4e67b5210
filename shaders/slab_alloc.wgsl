// First kernel of a batch: resets the per-operation records, gives every operation that
// carries a value a fresh cell of the heap and writes the value into it (the tile writes each
// value with consecutive lanes: one request per cell). New values never overwrite a cell the
// table references, so undoing the batch never loses an old value.
// Also `release_cells`: a batch that cannot be applied gives its fresh cells back.
// Twin: SlabModel::apply (new_cell) in src/baselines/slab/model.rs.

#include "slab/prelude.wgsl"
#include "common/hash.wgsl"
#include "common/tile.wgsl"
#include "slab_common.wgsl"

@compute @workgroup_size(WG)
fn alloc_cells(
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
        var phase = PH_PENDING;
        let kind = kinds[me];
        if (kind < OP_GET || kind > OP_DELETE) {
            phase = PH_BAD_KIND;
            count(C_BAD_KIND);
        } else if (kind != OP_GET) {
            count(C_MUTATING);
        }
        if (phase == PH_PENDING && writes_value(kind)) {
            cell = bitmap_take(CELL_BITMAP, CELL_BITMAP_WORDS, fmix(me ^ (params.seq * 0x9e3779b9u)));
            if (cell == NONE) {
                phase = PH_NO_CELL;
                count(C_NO_CELL);
            }
        }
        op_set(me, F_PHASE, phase);
        op_set(me, F_POS, NONE);
        op_set(me, F_REF, NONE);
        op_set(me, F_CELL, cell);
        op_set(me, F_JOINER, 0u);
        op_set(me, F_HOLDER, NONE);
    }
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

@compute @workgroup_size(WG)
fn release_cells(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let me = op_index(wid, nwg, li);
    if (me < params.n) {
        free_cell(op_get(me, F_CELL));
        op_set(me, F_CELL, NONE);
    }
}
