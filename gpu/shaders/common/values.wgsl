// New values: each operation's value goes into its fresh cell of the heap, written by the
// operation's tile with consecutive lanes (one request per cell). Where cells have a checksum
// word (CELL_WORDS > VALUE_WORDS), the tile sums its lanes' checksum terms and one lane writes
// it after the value, in the same phase: it is persisted with the value, before any publish.
// uses: CELL_WORDS, CHECKSUM_BASE, NONE, Tile, VALUE_WORDS, cell_word, checksum_term, heap_store
// uses: mark_heap_words, take_turn, tile_add, tile_bcast, vals_in

// Writes the value of operation `me` into `cell` (`cell_word`'s form; word NONE: nothing to
// write). A subgroup operation: call it from subgroup-uniform control flow.
fn write_values(t: Tile, me: u32, cell: vec2<u32>) {
    var pending = cell.x != NONE;
    loop {
        if (!subgroupAny(pending)) {
            break;
        }
        let turn = take_turn(t, pending, me);
        let c = vec2(tile_bcast(t, cell.x, turn.lead), tile_bcast(t, cell.y, turn.lead));
        var terms = 0u;
        if (turn.busy) {
            for (var w = t.lane; w < VALUE_WORDS; w += t.size) {
                let v = vals_in[turn.op * VALUE_WORDS + w];
                heap_store(cell_word(c, w), v);
                terms += checksum_term(w, v);
            }
        }
        if (CELL_WORDS > VALUE_WORDS) {
            let checksum = CHECKSUM_BASE + tile_add(t, terms);
            if (turn.busy && t.lane == 0u) {
                heap_store(cell_word(c, VALUE_WORDS), checksum);
            }
        }
        if (turn.leader) {
            mark_heap_words(cell_word(c, 0u), CELL_WORDS);
            pending = false;
        }
    }
}
