// gphash's value cells: a bitmap allocator over binding `bitmap`, with a bit per bitmap word in
// `bitmap_full` set while that word is full. The allocation stage only sets bits and the
// release only clears them, never at once (separate passes), so a set summary bit is never
// wrong; one left clear only costs a scan a load.
// Twins: Model::alloc (`Bitmap::full_words` for the summary) and the bitmap updates of
// Model::rollback and the engines' free step.
// uses: BITMAP_WORDS, HEAP_CELLS, NONE, bitmap, bitmap_full, params.seed

#include "common/hash.wgsl"
#include "common/bitmap.wgsl"

fn bitmap_load(w: u32) -> u32 { return atomicLoad(&bitmap[w]); }
fn bitmap_or(w: u32, bits: u32) -> u32 { return atomicOr(&bitmap[w], bits); }
fn bitmap_and(w: u32, bits: u32) { atomicAnd(&bitmap[w], bits); }

// Marks bitmap word `w` full in the summary.
fn mark_full(w: u32) {
    atomicOr(&bitmap_full[w / 32u], 1u << (w % 32u));
}

// Takes a free cell; the scan starts at a word picked by hashing the operation and skips the
// words the summary marks full up to 32 a load: free cells may lie in one block (a heap that
// grew by a quarter after its old cells filled), far from most starting words.
fn alloc_cell(op: u32) -> u32 {
    var w = fmix(op ^ params.seed) % BITMAP_WORDS;
    for (var scanned = 0u; scanned < BITMAP_WORDS;) {
        // Summary bits from word w on (zeros shifted in past this summary word).
        let full = atomicLoad(&bitmap_full[w / 32u]) >> (w % 32u);
        if ((full & 1u) != 0u) {
            // The full words from w on within this summary word; firstTrailingBit(0) is ~0u.
            let skip = min(firstTrailingBit(~full), 32u - w % 32u);
            w = (w + skip) % BITMAP_WORDS;
            scanned += skip;
            continue;
        }
        let bits = atomicLoad(&bitmap[w]);
        if (bits == 0xffffffffu) {
            mark_full(w);
            w = (w + 1u) % BITMAP_WORDS;
            scanned++;
            continue;
        }
        let bit = firstTrailingBit(~bits);
        let before = atomicOr(&bitmap[w], 1u << bit);
        if ((before & (1u << bit)) == 0u) {
            if ((before | (1u << bit)) == 0xffffffffu) {
                mark_full(w);
            }
            return w * 32u + bit;
        }
    }
    return NONE;
}

// A cell beyond the heap (a damaged state word; the open after a clean close does not scan
// the table) frees nothing: its bit would be another cell's.
fn release(cell: u32) {
    if (cell < HEAP_CELLS) {
        bitmap_release(0u, cell);
        atomicAnd(&bitmap_full[cell / 1024u], ~(1u << ((cell / 32u) % 32u)));
    }
}
