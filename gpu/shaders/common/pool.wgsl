// Writing the pool's regions through the prelude's window accessors: a strong compare-and-swap
// on table words, and the dirty-line list (the host persists exactly the lines listed).
// uses: CELL_WORDS, CTRL_DIRTY_COUNT, NONE, Word, control, dirty, table_cas_weak, params.dirty_cap
// uses: params.heap_line_base, params.line_words, params.table_line_base, params.track_lines

// Compare-and-swap that fails only when the word differs from `expected`; returns the word
// seen (success iff it equals `expected`). Weak CAS may fail spuriously: retry those.
fn table_cas(word: Word, expected: u32, desired: u32) -> u32 {
    var r = table_cas_weak(word, expected, desired);
    while (r.y == 0u && r.x == expected) {
        r = table_cas_weak(word, expected, desired);
    }
    return r.x;
}

// Appends one dirty line (64 bytes, or more in pools past 256 GiB) to the dirty list.
fn mark_line(line: u32) {
    if (params.track_lines == 0u) {
        return;
    }
    let i = atomicAdd(&control[CTRL_DIRTY_COUNT], 1u);
    if (i < params.dirty_cap) {
        dirty[i] = line;
    }
}

// Marks the dirty lines holding `count` words starting at word `first` of a region (numbered
// with 32 bits: lines of `params.line_words` words reach 2^32 of them).
fn mark_words(line_base: u32, first: Word, count: u32) {
    let line = Word(params.line_words);
    let last = u32((first + Word(count) - Word(1u)) / line);
    for (var l = u32(first / line); l <= last; l++) {
        mark_line(line_base + l);
    }
}

fn mark_table_words(first: Word, count: u32) {
    mark_words(params.table_line_base, first, count);
}

fn mark_heap_words(first: Word, count: u32) {
    mark_words(params.heap_line_base, first, count);
}

// Word `w` of value cell `32 c.x + c.y` in the heap (bit `c.y` of allocator word `c.x`: a heap
// may have more cells than 32 bits number, never more bitmap words).
fn cell_word(c: vec2<u32>, w: u32) -> Word {
    return (Word(c.x) * Word(32u) + Word(c.y)) * Word(CELL_WORDS) + Word(w);
}

// The cell `cell` of a heap of fewer than 2^32 cells, as `cell_word` takes it; NONE stays NONE.
fn cell_at(cell: u32) -> vec2<u32> {
    return select(vec2(cell / 32u, cell % 32u), vec2(NONE, 0u), cell == NONE);
}
