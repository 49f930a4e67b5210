// Staged placement, for every table: gathers the dirty lines of the device copy of the pool
// into a staging buffer, which the host scatters into the pool mapping before it persists them.

#include "common/prelude.wgsl"
#include "common/ops.wgsl"
#include "common/pool.wgsl"

@compute @workgroup_size(WG)
fn main(inv: Invocation) {
    let words = params.line_words;
    let total = Word(min(atomicLoad(&control[CTRL_DIRTY_COUNT]), params.dirty_cap)) * Word(words);
    for (var i = Word(op_index(inv)); i < total; i += Word(invocations(inv))) {
        let line = dirty[i / Word(words)];
        let word = u32(i % Word(words));
        if (line >= params.table_line_base && line - params.table_line_base < params.table_lines) {
            staging[i] = table_load(Word(line - params.table_line_base) * Word(words) + Word(word));
        } else {
            staging[i] = heap_load(Word(line - params.heap_line_base) * Word(words) + Word(word));
        }
    }
}
