// gphash's value cells: a bitmap allocator over binding `bitmap`.
// Twins: Model::alloc and the bitmap updates of Model::rollback and the engines' free step.
// uses: BITMAP_WORDS, HEAP_CELLS, NONE, bitmap, params.seed

#include "common/hash.wgsl"
#include "common/bitmap.wgsl"

fn bitmap_load(w: u32) -> u32 { return atomicLoad(&bitmap[w]); }
fn bitmap_or(w: u32, bits: u32) -> u32 { return atomicOr(&bitmap[w], bits); }
fn bitmap_and(w: u32, bits: u32) { atomicAnd(&bitmap[w], bits); }

// Takes a free cell; the scan starts at a word picked by hashing the operation.
fn alloc_cell(op: u32) -> u32 {
    return bitmap_take(0u, BITMAP_WORDS, fmix(op ^ params.seed));
}

// A cell beyond the heap (a damaged state word; the open after a clean close does not scan
// the table) frees nothing: its bit would be another cell's.
fn release(cell: u32) {
    if (cell < HEAP_CELLS) {
        bitmap_release(0u, cell);
    }
}
