// Bitmap allocators: bit b of word w is entry 32 w + b, set while the entry is taken. The
// includer says where the words live: `bitmap_load(w) -> u32`, `bitmap_or(w, bits) -> u32`
// (returns the word before) and `bitmap_and(w, bits)`, all atomic; and how it summarises full
// words: `bitmap_full_run(w) -> u32`, how many words from `w` on it knows to be full (0 when
// it keeps no summary), `bitmap_mark_full(w)` when a scan sees or makes word `w` full, and
// `bitmap_mark_free(w)` when an entry of it is given back. Takes only set summary bits and
// releases only clear them, never at once, so a word a summary calls full is full.
// uses: NONE, bitmap_and, bitmap_full_run, bitmap_load, bitmap_mark_free, bitmap_mark_full, bitmap_or

// Takes a clear bit of the bitmap of `nwords` words at word `base`, scanning from word `start`
// past the words known full: an atomic OR sets the lowest clear bit, which is ours if it was
// clear before. NONE when full.
fn bitmap_take(base: u32, nwords: u32, start: u32) -> u32 {
    return bitmap_take_every(base, nwords, start, 1u);
}

// `bitmap_take` over the `nwords` words `base`, `base + stride`, `base + 2 stride`, ...: entry
// 32 i + b is bit b of the i-th of them.
fn bitmap_take_every(base: u32, nwords: u32, start: u32, stride: u32) -> u32 {
    var w = start % nwords;
    for (var scanned = 0u; scanned < nwords;) {
        let at = base + w * stride;
        // The summary's runs are of adjacent words: with a stride, whether this one is full.
        let skip = min(min(bitmap_full_run(at), nwords - w), select(1u, 32u, stride == 1u));
        if (skip > 0u) {
            w = (w + skip) % nwords;
            scanned += skip;
            continue;
        }
        let bits = bitmap_load(at);
        if (bits == 0xffffffffu) {
            bitmap_mark_full(at);
            w = (w + 1u) % nwords;
            scanned++;
            continue;
        }
        let bit = firstTrailingBit(~bits);
        let before = bitmap_or(at, 1u << bit);
        if ((before & (1u << bit)) == 0u) {
            if ((before | (1u << bit)) == 0xffffffffu) {
                bitmap_mark_full(at);
            }
            return w * 32u + bit;
        }
    }
    return NONE;
}

// Gives entry `i` of the bitmap at word `base` back.
fn bitmap_release(base: u32, i: u32) {
    bitmap_and(base + i / 32u, ~(1u << (i % 32u)));
    bitmap_mark_free(base + i / 32u);
}
