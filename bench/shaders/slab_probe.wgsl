// One round of a batch, first kernel (and, with `reads_only`, the reads of a batch, before its
// undo log): every pending operation walks its bucket's chain, a
// slab per step, the tile of lanes reading the slab at once (SlabHash's warp-cooperative work
// sharing, with tiles in place of warps). Nothing published changes in this kernel, so every
// lookup sees the state before the round:
// - a read finishes here (the tile copies the value cell); so do an insert that finds its key
//   (EXISTS) and an update or delete that does not (NOT_FOUND);
// - an update, upsert or delete that finds its key records the entry and the reference it
//   saw; the commit kernel swings or empties it with one CAS;
// - an insert or upsert of an absent key registers in the round's claim registry: the first
//   becomes the key's creator and claims a free entry (EMPTY -> FILLING by CAS, the first free
//   entry of the chain, or entry 0 of a new slab linked at the tail by a CAS on the next
//   pointer), then writes the key; later ones join it, so no key is created twice.
// Twin: SlabModel::apply in src/systems/slab/model.rs.

#include "common/prelude.wgsl"
#include "slab_common.wgsl"
#include "common/claims.wgsl"

const STAGE_SEARCH: u32 = 0u;  // looking for the key along the chain
const STAGE_CLAIM: u32 = 1u;   // the key's creator, looking for a free entry from `slab` on

const OUT_NONE: u32 = 0u;       // go on with the next slab
const OUT_FOUND: u32 = 1u;
const OUT_NOT_FOUND: u32 = 2u;
const OUT_JOINED: u32 = 3u;
const OUT_CLAIMED: u32 = 4u;
const OUT_NO_SLAB: u32 = 5u;

fn finish(op: u32, status: u32) {
    statuses[op] = status;
    op_set(op, F_PHASE, PH_DONE);
}

@compute @workgroup_size(WG)
fn probe(inv: Invocation, sg: Subgroup) {
    let t = tile_of(sg);
    let me = op_index(inv);
    // The first probe of a batch runs before the log is durable and serves reads only.
    var pending = me < params.n && op_get(me, F_PHASE) == PH_PENDING;
    if (pending && params.reads_only != 0u) {
        pending = kinds[me] == OP_GET;
    }
    // The tile's walk, the same on every lane of the tile.
    var cur = NONE;            // the operation served
    var slab = NONE;           // the slab read next
    var stage = STAGE_SEARCH;
    var free_slab = NONE;      // the first free entry the search passed
    var free_entry = 0u;
    loop {
        if (!subgroupAny(pending)) {
            break;
        }
        let turn = take_turn(t, pending, me);
        let op = turn.op;
        var kind = 0u;
        var key: array<u32, KEY_WORDS>;
        if (turn.busy) {
            kind = kinds[op];
            key = load_key(op);
            if (op != cur) {
                cur = op;
                slab = bucket_of(key);
                stage = STAGE_SEARCH;
                free_slab = NONE;
            }
        }
        let v = read_slab(t, turn.busy, slab, key);
        let found = entry_found(v);
        let found_ref = slab_word_value(t, select(0u, found * ENTRY_WORDS + KEY_WORDS, found != NONE));
        let here = first_claimable(v);
        let read = slab;

        var out = OUT_NONE;
        var claim_at = NONE;  // reference word to claim (EMPTY -> FILLING)
        var extend = false;   // link a new slab after `slab`, the tail
        var join = false;
        if (turn.busy) {
            if (stage == STAGE_SEARCH) {
                if (found != NONE) {
                    out = OUT_FOUND;
                } else {
                    if (free_slab == NONE && here != NONE) {
                        free_slab = slab;
                        free_entry = here;
                    }
                    if (v.next != NONE) {
                        slab = v.next;
                    } else if (creates_key(kind)) {
                        join = true;
                    } else {
                        out = OUT_NOT_FOUND;
                    }
                }
            } else if (here != NONE) {
                claim_at = ref_word(slab, here);
            } else if (v.next != NONE) {
                slab = v.next;
            } else {
                extend = true;
            }
        }

        // An absent key: the first operation of the round on it creates it, the others join.
        var holder = NONE;
        if (turn.leader && join) {
            holder = join_claim(op, key, hash_key(key, SEED ^ 0x2545f491u));
        }
        holder = tile_bcast(t, holder, turn.lead);
        if (join && holder != op) {
            out = OUT_JOINED;
        } else if (join) {
            stage = STAGE_CLAIM;
            if (free_slab != NONE) {
                slab = free_slab;
                claim_at = ref_word(free_slab, free_entry);
            } else {
                extend = true;
            }
        }

        // A full chain: take a free slab (always clean) and link it at the tail by a CAS on
        // the tail's next pointer; a lost race gives the slab back and follows the winner's.
        var ext = NONE;
        var linked = 0u;
        if (turn.leader && extend) {
            var fresh = NONE;
            if (POOL_SLABS > 0u) {
                fresh = bitmap_take(SLAB_BITMAP, SLAB_BITMAP_WORDS, fmix(op ^ (params.seq * 0x85ebca6bu)));
            }
            if (fresh != NONE) {
                fresh += BUCKETS;
                let old = table_cas(slab_word(slab) + 31u, NONE, fresh);
                if (old == NONE) {
                    ext = fresh;
                    linked = 1u;
                    count(C_NEW_SLABS);
                    mark_table_words(slab_word(slab) + 31u, 1u);
                } else {
                    bitmap_release(SLAB_BITMAP, fresh - BUCKETS);
                    ext = old;
                }
            }
        }
        ext = tile_bcast(t, ext, turn.lead);
        linked = tile_bcast(t, linked, turn.lead);
        if (extend && ext == NONE) {
            out = OUT_NO_SLAB;
        } else if (extend) {
            slab = ext;
            if (linked == 1u) {
                claim_at = ref_word(ext, 0u);
            }
        }

        // The claim, then the key: lanes write its words (FILLING entries match no search).
        var won = false;
        if (turn.leader && claim_at != NONE) {
            won = table_cas(claim_at, EMPTY, FILLING) == EMPTY;
        }
        let claimed = tile_ballot(t, won) != 0u;
        if (claimed) {
            for (var w = t.lane; w < KEY_WORDS; w += t.size) {
                table_store(claim_at - KEY_WORDS + w, key[w]);
            }
            out = OUT_CLAIMED;
        } else if (claim_at != NONE) {
            // Another creator took the entry first: read the slab again.
            stage = STAGE_CLAIM;
        }

        // A read that found its key: the tile copies the value (one request per cell).
        if (turn.busy && out == OUT_FOUND && kind == OP_GET && found_ref < CELLS) {
            for (var w = t.lane; w < VALUE_WORDS; w += t.size) {
                vals_out[op * VALUE_WORDS + w] = heap_load(found_ref * CELL_WORDS + w);
            }
        }

        if (turn.leader && out != OUT_NONE) {
            pending = false;
            switch (out) {
                case OUT_FOUND: {
                    if (kind == OP_GET) {
                        finish(op, STATUS_OK);
                    } else if (kind == OP_INSERT) {
                        free_cell(op_get(op, F_CELL));
                        finish(op, STATUS_EXISTS);
                    } else {
                        op_set(op, F_POS, ref_word(read, found));
                        op_set(op, F_REF, found_ref);
                        op_set(op, F_PHASE, PH_FOUND);
                    }
                }
                case OUT_NOT_FOUND: {
                    free_cell(op_get(op, F_CELL));
                    finish(op, STATUS_NOT_FOUND);
                }
                case OUT_JOINED: {
                    op_set(op, F_HOLDER, holder);
                    if (kind == OP_UPSERT) {
                        atomicMax(&opstate[holder * OP_FIELDS + F_JOINER], op + 1u);
                    }
                    op_set(op, F_PHASE, PH_JOINED);
                }
                case OUT_CLAIMED: {
                    op_set(op, F_POS, claim_at);
                    op_set(op, F_PHASE, PH_CLAIMED);
                    mark_table_words(claim_at - KEY_WORDS, ENTRY_WORDS);
                }
                default: {
                    op_set(op, F_PHASE, PH_NO_SLAB);
                    count(C_NO_SLAB);
                }
            }
        }
    }
}
