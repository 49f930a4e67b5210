// First kernel of a batch: resets the per-operation records, gives every operation that
// carries a value a fresh cell of the heap and writes the value into it (the tile writes each
// value with consecutive lanes: one request per cell). New values never overwrite a cell the
// table references, so undoing the batch never loses an old value.
// Also `release_cells`: a batch that cannot be applied gives its fresh cells back.
// Twin: SlabModel::apply (new_cell) in src/systems/slab/model.rs.

#include "common/prelude.wgsl"
#include "slab_common.wgsl"
#include "common/values.wgsl"

@compute @workgroup_size(WG)
fn alloc_cells(inv: Invocation, sg: Subgroup) {
    let t = tile_of(sg);
    let me = op_index(inv);
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
    write_values(t, me, cell_at(cell));
}

@compute @workgroup_size(WG)
fn release_cells(inv: Invocation) {
    let me = op_index(inv);
    if (me < params.n) {
        free_cell(op_get(me, F_CELL));
        op_set(me, F_CELL, NONE);
    }
}
