// gphash's value cells: a bitmap allocator over region `cellmap` (windows), next-fit. The heap has
// ARENAS arenas (a power of two): arena `p` has bitmap words `p, p + ARENAS, ..`, ARENA_CELLS
// cells, numbered from 0 within it, and holds the cells of the keys whose fingerprint's highest
// ARENA_BITS bits are `p` (twin: `Geometry::cell_index`), so a state word names up to
// ARENAS * 2^32 cells with 32 bits. Binding `allocator` holds a bit per bitmap word, set while
// that word is full (words 0 to ALLOC_CURSOR - 1; `common/bitmap.wgsl`), and a cursor per
// arena (word ALLOC_CURSOR + p): a counter of the arena's cells that subgroups advance with
// `atomicAdd` to claim the cells they look at, so that the batches sweep the arena together,
// each range of cells looked at by one subgroup a lap (a claim that passes the arena's end
// goes on from its start). The allocation stage only sets bits and
// the release only clears them, in separate passes, so a set summary bit is never wrong; one
// left clear only costs a scan a load.
// Twins: Model::alloc (`Bitmap::allocator_words` for the summary and the cursor) and the bitmap
// updates of Model::rollback and the engines' free step.
// uses: ALLOC_CURSOR, ARENAS, ARENA_CELLS, ARENA_WORDS, NONE, Word, allocator, cellmap_and, cellmap_load, cellmap_or

#include "common/bitmap.wgsl"

// The bitmap's words, in the windows of region `cellmap`.
fn bitmap_load(w: u32) -> u32 { return cellmap_load(Word(w)); }
fn bitmap_or(w: u32, bits: u32) -> u32 { return cellmap_or(Word(w), bits); }
fn bitmap_and(w: u32, bits: u32) { cellmap_and(Word(w), bits); }

// The summary: bit w % 32 of `allocator[w / 32]` set while bitmap word w is full.
fn bitmap_full_run(w: u32) -> u32 {
    // Summary bits from word w on (zeros shifted in past this summary word); the run of ones
    // from bit 0 is the full words from w on (firstTrailingBit(0) is ~0u: all 32).
    let full = atomicLoad(&allocator[w / 32u]) >> (w % 32u);
    return min(firstTrailingBit(~full), 32u - w % 32u);
}
fn bitmap_mark_full(w: u32) { atomicOr(&allocator[w / 32u], 1u << (w % 32u)); }
fn bitmap_mark_free(w: u32) { atomicAnd(&allocator[w / 32u], ~(1u << (w % 32u))); }

// Claims a subgroup makes before its lanes still without a cell scan on their own. A claim is
// at most `lanes - 1` words, so one subgroup looks at no more than 24 (lanes - 1) 32 cells (23,808
// at 32 lanes); a sweep across many full words is shared by the batch's subgroups.
const MAX_CLAIMS: u32 = 24u;

// Bits lo to hi - 1 of a word (lo < hi <= 32).
fn bit_range(lo: u32, hi: u32) -> u32 {
    return select(0xffffffffu >> (32u - (hi - lo)), 0xffffffffu, hi - lo == 32u) << lo;
}

// The `n` lowest set bits of `bits`.
fn lowest_bits(bits: u32, n: u32) -> u32 {
    var rest = bits;
    for (var i = 0u; i < n; i++) {
        rest &= rest - 1u;
    }
    return bits & ~rest;
}

// Takes a free cell of arena `arena` (subgroup-uniform) for each lane of the subgroup with
// `want` set and returns its number in the arena, next-fit: the subgroup
// claims the next cells from the arena's cursor (as many as it still needs at the density of free
// cells it last found, doubled while it finds none; at most `lanes - 1` words, so that a claim
// that starts inside a word spans a word per lane at most), each lane looks
// at a word of the claim, and the free cells found go to the lanes in order. A lap of the
// counter within one pass may hand two subgroups the same cells: the `atomicOr` that takes
// them says which are really won. Lanes left without a cell after MAX_CLAIMS claims scan on
// their own (`bitmap_take_every`), which finds NONE only when the arena is full. Neighbouring
// operations get neighbouring cells where the arena has free words (a load, a grown heap), so
// their values reach the pool as neighbouring lines.
// Subgroup-uniform control flow.
fn alloc_cells(want: bool, arena: u32, lane: u32, lanes: u32) -> u32 {
    var cell = NONE;
    var claim = 0u;
    var pos = 0u;
    for (var tries = 0u; tries < MAX_CLAIMS; tries++) {
        let waiting = want && cell == NONE;
        let rank = subgroupExclusiveAdd(u32(waiting));  // waiting lanes below this one
        let count = subgroupAdd(u32(waiting));
        if (count == 0u) {
            break;
        }
        claim = min(max(claim, count), max(lanes - 1u, 1u) * 32u);
        var counter = 0u;
        if (lane == 0u) {
            counter = atomicAdd(&allocator[ALLOC_CURSOR + arena], claim);
        }
        pos = subgroupBroadcast(counter, 0u) % ARENA_CELLS;
        // The claim's cells from `pos` to the arena's end, then from cell 0 on (a claim cut at
        // the end goes on at the start, never over its own first cells): a lane a word.
        let end = pos + min(claim, ARENA_CELLS - pos);
        let words = (end - 1u) / 32u - pos / 32u + 1u;
        let wrap = min(claim - (end - pos), pos);
        var w = pos / 32u + lane;
        var lo = max(pos, w * 32u) - w * 32u;
        var hi = min(end - w * 32u, 32u);
        if (lane >= words) {
            w = lane - words;
            lo = 0u;
            hi = min(wrap - min(wrap, w * 32u), 32u);
        }
        // The bitmap word of the arena's word `w`.
        let at = w * ARENAS + arena;
        var free = 0u;
        if (lo < hi) {
            free = ~bitmap_load(at) & bit_range(lo, hi);
        }
        let found = countOneBits(free);
        let before = subgroupExclusiveAdd(found);
        let total = subgroupAdd(found);
        // The waiting lanes of ranks `before` on take this word's free cells, lowest first.
        let mine = lowest_bits(free, min(found, count - min(count, before)));
        var won = 0u;
        if (mine != 0u) {
            let old = bitmap_or(at, mine);
            won = mine & ~old;
            if ((old | mine) == 0xffffffffu) {
                bitmap_mark_full(at);
            }
        }
        // The lane whose word holds this lane's cell: the last with `before` at most its rank.
        var j = 0u;
        for (var step = lanes / 2u; step > 0u; step /= 2u) {
            let b = subgroupShuffle(before, min(j + step, lanes - 1u));
            if (j + step < lanes && b <= rank) {
                j += step;
            }
        }
        // Shuffled by every lane: a lane that is not waiting may be the one read from.
        let its_before = subgroupShuffle(before, j);
        let its_mine = subgroupShuffle(mine, j);
        let its_won = subgroupShuffle(won, j);
        let its_w = subgroupShuffle(w, j);
        if (waiting && rank < total) {
            let bit = firstTrailingBit(its_mine & ~lowest_bits(its_mine, rank - its_before));
            if ((its_won & (1u << bit)) != 0u) {
                cell = its_w * 32u + bit;
            }
        }
        // Claim the rest at the density of free cells just found among those looked at (a
        // claim wrapped past the lanes is looked at in part), a quarter more; double the claim
        // while none is found.
        let looked = end - pos + min(wrap, (lanes - min(lanes, words)) * 32u);
        let rest = count - min(count, total);
        claim = select(rest * looked / max(total, 1u) + rest / 4u + 1u, claim * 2u, total == 0u);
    }
    if (want && cell == NONE) {
        cell = bitmap_take_every(arena, ARENA_WORDS, pos / 32u, ARENAS);
    }
    return cell;
}

// Gives cell `local` of arena `arena` back. A cell beyond the heap (a damaged state word; the
// open after a clean close does not scan the table) frees nothing: its bit would be another
// cell's.
fn release(arena: u32, local: u32) {
    if (local < ARENA_CELLS) {
        let c = heap_cell(arena, local);
        bitmap_and(c.x, ~(1u << c.y));
        bitmap_mark_free(c.x);
    }
}
