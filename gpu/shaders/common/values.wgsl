// New values: each operation's value goes into its fresh cell of the heap, written by the
// operation's tile with consecutive lanes (one request per cell).

// Writes the value of operation `me` into `cell` (NONE: nothing to write). A subgroup
// operation: call it from subgroup-uniform control flow.
fn write_values(t: Tile, me: u32, cell: u32) {
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
