// Undo log, second kernel of a batch (before any operation changes the table): for every
// bucket a mutating operation of the batch touches, the first such operation (an atomic
// exchange of the bucket's mark with the batch sequence) copies the bucket's whole chain into
// the log region: entry = slab id, then the slab's 32 words. The tile reads a slab (one
// request) and writes its entry (one request) per step. The host persists the entries, then
// writes and persists the log header; only then may the table change.
// Twin: recover() in src/systems/slab/model.rs reads what this writes.

#include "common/prelude.wgsl"
#include "slab_common.wgsl"

@compute @workgroup_size(WG)
fn log_chains(inv: Invocation, sg: Subgroup) {
    let t = tile_of(sg);
    let me = op_index(inv);
    var pending = false;
    if (me < params.n && kinds[me] != OP_GET) {
        let b = bucket_of(load_key(me));
        pending = atomicExchange(&control[MARKS + b], params.seq) != params.seq;
    }
    var cur = NONE;   // the operation whose chain the tile copies
    var slab = NONE;  // the slab it copies next
    loop {
        if (!subgroupAny(pending)) {
            break;
        }
        let turn = take_turn(t, pending, me);
        if (turn.busy && turn.op != cur) {
            cur = turn.op;
            slab = bucket_of(load_key(turn.op));
        }
        var idx = 0u;
        if (turn.leader) {
            idx = atomicAdd(&control[C_LOG_COUNT], 1u);
        }
        idx = tile_bcast(t, idx, turn.lead);
        let fits = turn.busy && idx < LOG_CAP;
        var next = NONE;
        if (turn.busy) {
            for (var w = t.lane; w < 32u; w += t.size) {
                let x = table_load(slab_word(slab) + w);
                if (fits) {
                    table_store(log_word(idx) + 1u + w, x);
                }
                if (w == 31u) {
                    next = x;
                }
            }
        }
        next = tile_bcast(t, next, 31u % t.size);
        if (turn.leader && fits) {
            table_store(log_word(idx), slab);
            mark_table_words(log_word(idx), 33u);
        }
        if (turn.busy) {
            slab = next;
        }
        if (turn.leader && (next == NONE || !fits)) {
            pending = false;
        }
    }
}
