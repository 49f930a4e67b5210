// gphash's value cells: a bitmap allocator over binding `bitmap`, with a bit per bitmap word in
// `bitmap_full` set while that word is full (`common/bitmap.wgsl`). The allocation stage only
// sets bits and the release only clears them, in separate passes, so a set summary bit is
// never wrong; one left clear only costs a scan a load.
// Twins: Model::alloc (`Bitmap::full_words` for the summary) and the bitmap updates of
// Model::rollback and the engines' free step.
// uses: BITMAP_WORDS, HEAP_CELLS, NONE, bitmap, bitmap_full, params.seed

#include "common/hash.wgsl"
#include "common/bitmap.wgsl"

fn bitmap_load(w: u32) -> u32 { return atomicLoad(&bitmap[w]); }
fn bitmap_or(w: u32, bits: u32) -> u32 { return atomicOr(&bitmap[w], bits); }
fn bitmap_and(w: u32, bits: u32) { atomicAnd(&bitmap[w], bits); }

// The summary: bit w % 32 of `bitmap_full[w / 32]` set while bitmap word w is full.
fn bitmap_full_run(w: u32) -> u32 {
    // Summary bits from word w on (zeros shifted in past this summary word); the run of ones
    // from bit 0 is the full words from w on (firstTrailingBit(0) is ~0u: all 32).
    let full = atomicLoad(&bitmap_full[w / 32u]) >> (w % 32u);
    return min(firstTrailingBit(~full), 32u - w % 32u);
}
fn bitmap_mark_full(w: u32) { atomicOr(&bitmap_full[w / 32u], 1u << (w % 32u)); }
fn bitmap_mark_free(w: u32) { atomicAnd(&bitmap_full[w / 32u], ~(1u << (w % 32u))); }

// Takes a free cell; the scan starts at a word picked by hashing the operation and skips up to
// 32 words the summary marks full a load: free cells may lie in one block (a heap that grew
// by a quarter after its old cells filled), far from most starting words.
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
