// gphash's value cells: a bitmap allocator over binding `bitmap`.
// Twins: Model::alloc and the bitmap updates of Model::rollback and the engines' free step.
// uses: BITMAP_WORDS, HEAP_CELLS, NONE, bitmap, params.seed, params.cell_word

#include "common/hash.wgsl"
#include "common/bitmap.wgsl"

fn bitmap_load(w: u32) -> u32 { return atomicLoad(&bitmap[w]); }
fn bitmap_or(w: u32, bits: u32) -> u32 { return atomicOr(&bitmap[w], bits); }
fn bitmap_and(w: u32, bits: u32) { atomicAnd(&bitmap[w], bits); }

// Cells of the subgroup's operations that carry a value (`want`) in runs: every 32 of them, in
// lane order, take free bits of one word side by side with one CAS, the words in turn from
// `params.cell_word` (where the host's cursor stands) by the operation's place in the batch,
// so that a batch's new values land next to each other where the heap has free words (a load,
// a grown heap). NONE for a lane whose run found its bits taken: it scans on its own
// (`alloc_cell`). Bits past the heap are set, so a run's cells are all in the heap.
// Subgroup-uniform control flow.
fn alloc_run(op: u32, want: bool, lane: u32) -> u32 {
    let wanting = subgroupBallot(want);
    var rank = 0u;  // wanting lanes below this one
    var count = 0u;
    for (var i = 0u; i < 4u; i++) {
        let bits = wanting[i];
        let lo = i * 32u;
        let below = select(select(0u, (1u << ((lane - lo) & 31u)) - 1u, lane > lo), 0xffffffffu, lane >= lo + 32u);
        rank += countOneBits(bits & below);
        count += countOneBits(bits);
    }
    // A subgroup of fewer than 32 lanes runs in its share of a word.
    let first = subgroupMin(op);
    let offset = first % 32u;
    var cell = NONE;
    for (var k = 0u; k * 32u < count; k++) {
        let leads = want && rank == k * 32u;
        var taken = NONE;
        let run = min(count - k * 32u, 32u);
        if (leads && offset + run <= 32u) {
            let bits = select((1u << (run & 31u)) - 1u, 0xffffffffu, run == 32u) << offset;
            let w = (params.cell_word + first / 32u + k) % BITMAP_WORDS;
            let before = atomicLoad(&bitmap[w]);
            if ((before & bits) == 0u && atomicCompareExchangeWeak(&bitmap[w], before, before | bits).exchanged) {
                taken = w;
            }
        }
        let word = subgroupMin(select(NONE, taken, leads));
        if (want && rank / 32u == k && word != NONE) {
            cell = word * 32u + offset + rank % 32u;
        }
    }
    return cell;
}

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
