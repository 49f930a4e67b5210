// gphash's value cells: a bitmap allocator over binding `bitmap`, with a bit per bitmap word in
// `bitmap_full` set while that word is full (its first FULL_WORDS words), and after them a bit
// per summary word set while all 32 words it covers are full. The allocation stage only sets bits and the
// release only clears them, never at once (separate passes), so a set summary bit is never
// wrong; one left clear only costs a scan a load.
// Twins: Model::alloc (`Bitmap::full_words` for the summary) and the bitmap updates of
// Model::rollback and the engines' free step.
// uses: BITMAP_WORDS, FULL_WORDS, HEAP_CELLS, NONE, bitmap, bitmap_full, params.seed

#include "common/hash.wgsl"
#include "common/bitmap.wgsl"

fn bitmap_load(w: u32) -> u32 { return atomicLoad(&bitmap[w]); }
fn bitmap_or(w: u32, bits: u32) -> u32 { return atomicOr(&bitmap[w], bits); }
fn bitmap_and(w: u32, bits: u32) { atomicAnd(&bitmap[w], bits); }

// Marks bitmap word `w` full in the summary, and its summary word when that fills.
fn mark_full(w: u32) {
    let s = w / 32u;
    let before = atomicOr(&bitmap_full[s], 1u << (w % 32u));
    if ((before | (1u << (w % 32u))) == 0xffffffffu) {
        atomicOr(&bitmap_full[FULL_WORDS + s / 32u], 1u << (s % 32u));
    }
}

// Takes a free cell; the scan starts at a word picked by hashing the operation and skips the
// words the summary marks full, up to 32 a load (1,024 where whole summary words are full):
// free cells may lie in one block (a heap that grew by a quarter after its old cells filled),
// far from most starting words.
fn alloc_cell(op: u32) -> u32 {
    var w = fmix(op ^ params.seed) % BITMAP_WORDS;
    for (var scanned = 0u; scanned < BITMAP_WORDS;) {
        // Second-level bits from w's summary word on: a run of full summary words is skipped to
        // the start of the first one not full (never past BITMAP_WORDS: the bits of summary
        // words past the bitmap are never set).
        let sw = w / 32u;
        let full_sw = atomicLoad(&bitmap_full[FULL_WORDS + sw / 32u]) >> (sw % 32u);
        if ((full_sw & 1u) != 0u) {
            let next = (sw + min(firstTrailingBit(~full_sw), 32u - sw % 32u)) * 32u;
            scanned += next - w;
            w = next % BITMAP_WORDS;
            continue;
        }
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
        let sw = cell / 1024u;
        atomicAnd(&bitmap_full[sw], ~(1u << ((cell / 32u) % 32u)));
        atomicAnd(&bitmap_full[FULL_WORDS + sw / 32u], ~(1u << (sw % 32u)));
    }
}
