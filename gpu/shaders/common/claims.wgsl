// The claim registry (binding `claims`, cleared before each use): the first operation on an
// absent key becomes its creator, later ones on the same key join it, so no key is created
// twice.
// uses: KEY_WORDS, NONE, claims, keys, params.claims_mask

fn same_key(op: u32, key: array<u32, KEY_WORDS>) -> bool {
    for (var i = 0u; i < KEY_WORDS; i++) {
        if (keys[op * KEY_WORDS + i] != key[i]) {
            return false;
        }
    }
    return true;
}

// Registers `op` as the creator of its key (open addressing from `h`, entries hold op + 1);
// returns the creator's index, `op` itself when it came first.
fn join_claim(op: u32, key: array<u32, KEY_WORDS>, h: u32) -> u32 {
    var i = h & params.claims_mask;
    var holder = NONE;
    while (holder == NONE) {
        let r = atomicCompareExchangeWeak(&claims[i], 0u, op + 1u);
        if (r.exchanged) {
            holder = op;
        } else if (r.old_value != 0u && (r.old_value - 1u == op || same_key(r.old_value - 1u, key))) {
            holder = r.old_value - 1u;
        } else if (r.old_value != 0u) {
            i = (i + 1u) & params.claims_mask;
        }
    }
    return holder;
}
