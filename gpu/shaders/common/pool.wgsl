// Writing the pool's regions through the prelude's window accessors: a strong compare-and-swap
// on table words, and the dirty-line list (the host persists exactly the lines listed).
// uses: CTRL_DIRTY_COUNT, control, dirty, table_cas_weak, params.dirty_cap, params.heap_line_base
// uses: params.table_line_base, params.track_lines

// Compare-and-swap that fails only when the word differs from `expected`; returns the word
// seen (success iff it equals `expected`). Weak CAS may fail spuriously: retry those.
fn table_cas(word: u32, expected: u32, desired: u32) -> u32 {
    var r = table_cas_weak(word, expected, desired);
    while (r.y == 0u && r.x == expected) {
        r = table_cas_weak(word, expected, desired);
    }
    return r.x;
}

// Appends one pool cache line to the dirty list.
fn mark_line(line: u32) {
    if (params.track_lines == 0u) {
        return;
    }
    let i = atomicAdd(&control[CTRL_DIRTY_COUNT], 1u);
    if (i < params.dirty_cap) {
        dirty[i] = line;
    }
}

// Marks the lines holding `count` words starting at word `first` of a region.
fn mark_words(line_base: u32, first: u32, count: u32) {
    for (var l = first / 16u; l <= (first + count - 1u) / 16u; l++) {
        mark_line(line_base + l);
    }
}

fn mark_table_words(first: u32, count: u32) {
    mark_words(params.table_line_base, first, count);
}

fn mark_heap_words(first: u32, count: u32) {
    mark_words(params.heap_line_base, first, count);
}
