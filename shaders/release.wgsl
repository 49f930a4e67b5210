// Releasing cells and claims. `free_cells` runs after phase B: cells that this batch replaced
// or did not use go back to the allocator (they are reused only by a later batch, after this
// one is persisted). `rollback` undoes phase A of a batch that cannot complete (no slot or no
// cell for some operation): claims go back to EMPTY, fresh cells are released.
// Twins: the bitmap updates in Model::rollback and the engines' free step.

#include "common/prelude.wgsl"
#include "common/protocol.wgsl"
#include "common/table.wgsl"
#include "common/cells.wgsl"

@compute @workgroup_size(WG)
fn free_cells(inv: Invocation) {
    let me = op_index(inv);
    if (me < params.n) {
        release(op_field(me, ST_ARENA), op_field(me, ST_FREE));
    }
}

@compute @workgroup_size(WG)
fn rollback(inv: Invocation) {
    let me = op_index(inv);
    if (me >= params.n) {
        return;
    }
    if (op_field(me, ST_PHASE) == PHASE_CLAIMED) {
        let word = op_state_word(me);
        table_store(word, EMPTY);
        mark_table_words(word, 1u);
    }
    release(op_field(me, ST_ARENA), op_field(me, ST_CELL));
}
