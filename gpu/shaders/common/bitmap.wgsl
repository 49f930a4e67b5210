// Bitmap allocators: bit b of word w is entry 32 w + b, set while the entry is taken. The
// includer says where the words live: `bitmap_load(w) -> u32`, `bitmap_or(w, bits) -> u32`
// (returns the word before) and `bitmap_and(w, bits)`, all atomic.
// uses: NONE, bitmap_and, bitmap_load, bitmap_or

// Takes a clear bit of the bitmap of `nwords` words at word `base`, scanning from word `start`:
// an atomic OR sets the lowest clear bit, which is ours if it was clear before. NONE when full.
fn bitmap_take(base: u32, nwords: u32, start: u32) -> u32 {
    var w = start % nwords;
    for (var scanned = 0u; scanned < nwords;) {
        let bits = bitmap_load(base + w);
        if (bits == 0xffffffffu) {
            w = (w + 1u) % nwords;
            scanned++;
            continue;
        }
        let bit = firstTrailingBit(~bits);
        let before = bitmap_or(base + w, 1u << bit);
        if ((before & (1u << bit)) == 0u) {
            return w * 32u + bit;
        }
    }
    return NONE;
}

// Gives entry `i` of the bitmap at word `base` back.
fn bitmap_release(base: u32, i: u32) {
    bitmap_and(base + i / 32u, ~(1u << (i % 32u)));
}

// The lowest `n` set bits of `bits`.
fn lowest_bits(bits: u32, n: u32) -> u32 {
    var rest = bits;
    var out = 0u;
    for (var i = 0u; i < n && rest != 0u; i++) {
        let low = rest & (~rest + 1u);
        out |= low;
        rest ^= low;
    }
    return out;
}

// The position of set bit `n` (from 0, lowest first) of `bits`.
fn nth_bit(bits: u32, n: u32) -> u32 {
    var rest = bits;
    for (var i = 0u; i < n; i++) {
        rest &= rest - 1u;
    }
    return firstTrailingBit(rest);
}

// A clear bit for every lane of the subgroup that `wants` one, the subgroup's bits adjacent
// where they are clear: lane `lead` (one lane) sets the lowest clear bits of a word for all the
// lanes still waiting with one atomic OR, keeps those that were clear before, and the next
// word is tried once this one is full; lanes take the bits in the order of their lanes. Scans
// from word `start` (the same on every lane). NONE when the bitmap is full. A subgroup
// operation: call it from subgroup-uniform control flow.
fn bitmap_take_run(base: u32, nwords: u32, start: u32, wants: bool, lead: bool) -> u32 {
    let rank = subgroupExclusiveAdd(u32(wants));
    let total = subgroupAdd(u32(wants));
    var w = start % nwords;
    var got = 0u;
    var mine = NONE;
    for (var full = 0u; got < total && full < nwords;) {
        var taken = 0u;
        var was_full = 0u;
        if (lead) {
            let want = lowest_bits(~bitmap_load(base + w), total - got);
            if (want == 0u) {
                was_full = 1u;
            } else {
                taken = want & ~bitmap_or(base + w, want);
            }
        }
        taken = subgroupOr(taken);
        let n = countOneBits(taken);
        if (wants && rank >= got && rank < got + n) {
            mine = w * 32u + nth_bit(taken, rank - got);
        }
        got += n;
        if (subgroupOr(was_full) != 0u) {
            w = (w + 1u) % nwords;
            full++;
        }
    }
    return mine;
}
