// gphash's value cells: a bitmap allocator over binding `bitmap`.
// Twins: Model::alloc and the bitmap updates of Model::rollback and the engines' free step.
// uses: BITMAP_WORDS, HEAP_CELLS, NONE, bitmap, params.seed

#include "common/hash.wgsl"
#include "common/bitmap.wgsl"

fn bitmap_load(w: u32) -> u32 { return atomicLoad(&bitmap[w]); }
fn bitmap_or(w: u32, bits: u32) -> u32 { return atomicOr(&bitmap[w], bits); }
fn bitmap_and(w: u32, bits: u32) { atomicAnd(&bitmap[w], bits); }

// Takes a free cell for every lane that `wants` one: a subgroup's cells are adjacent where the
// heap has them free, so that its values are written as one run. The scan starts at a word
// picked by hashing the subgroup's first operation `first`. A subgroup operation.
fn alloc_cells(wants: bool, lead: bool, first: u32) -> u32 {
    return bitmap_take_run(0u, BITMAP_WORDS, fmix(first ^ params.seed), wants, lead);
}

// A cell beyond the heap (a damaged state word; the open after a clean close does not scan
// the table) frees nothing: its bit would be another cell's.
fn release(cell: u32) {
    if (cell < HEAP_CELLS) {
        bitmap_release(0u, cell);
    }
}
