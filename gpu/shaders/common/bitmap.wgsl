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
