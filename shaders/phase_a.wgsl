// Phase A: look every key up. Reads finish here (verified reads check their value's checksum).
// The first operation of the batch that inserts an absent key registers in the batch's claim
// registry and claims the lowest empty slot of the key's least-loaded candidate bucket
// (EMPTY -> INSERTING), then writes fingerprint and key; later operations on that key join it,
// so a key is claimed at most once per batch. Nothing published changes in this phase, so every
// lookup sees the state before the batch. A batch of gets runs `search` instead: the lookups
// alone, with nothing of the claims in its registers.
// Twin: Model::phase_a in src/model.rs (for both entry points).

#include "common/prelude.wgsl"
#include "common/protocol.wgsl"
#include "common/hash.wgsl"
#include "common/tile.wgsl"
#include "common/table.wgsl"
#include "common/probe.wgsl"
#include "common/claims.wgsl"

// Finishes an operation in this phase; a fresh cell it will not publish goes back. A get has no
// cell.
fn finish(op: u32, kind: u32, status: u32) {
    statuses[op] = status;
    set_op_field(op, ST_PHASE, PHASE_DONE);
    set_op_field(op, ST_FREE, select(op_field(op, ST_CELL), NONE, kind == OP_GET));
}

// Records an access of operation `op` to `group` for the loading phases' choice of hot groups:
// one operation in `count_every`, picked by a hash of the operation and the batch (twin:
// `cache::counted`), so that hot groups' counters are not every operation's contended atomic.
fn note_access(op: u32, group: u32) {
    if (CACHE_ENTRIES == 0u || params.count_every == 0u) {
        return;
    }
    if (fmix(op ^ (params.stamp * 0x9e3779b9u)) % params.count_every != 0u) {
        return;
    }
    if (CACHE_COUNT == 1u) {
        atomicAdd(&cache_counts[group], 1u);
    } else if (CACHE_COUNT == 2u) {
        atomicMax(&cache_counts[group], params.stamp);
    }
}

// Records what the operation touched, for the loading phases (its target group, or the group
// of every hash location when it has no target) and the cache's statistics.
fn note(op: u32, loc: Located, target_bucket: u32, target_entry: u32, table_reads: u32, cached_value: bool) {
    if (CACHE_ENTRIES == 0u) {
        return;
    }
    if (target_bucket != NONE) {
        note_access(op, target_bucket / GROUP_BUCKETS);
        tally_add(CTRL_CACHE_TARGETS, 1u);
        tally_add(CTRL_CACHE_HITS, u32(target_entry != NONE));
    } else {
        for (var h = 0u; h < HASHES; h++) {
            note_access(op, loc.tops[h] >> (LEVELS - 1u));
        }
    }
    tally_add(CTRL_CACHE_GROUPS_SAVED, HASHES - table_reads);
    tally_add(CTRL_CACHE_VALUES_SAVED, u32(cached_value));
}

// Where the tile found its key (the same on every lane): `bucket` and `entry` are NONE when it
// did not.
struct Hit {
    found: bool,
    bucket: u32,
    slot: u32,
    state: u32,
    entry: u32,
}

fn tile_hit(t: Tile, p: LaneProbe) -> Hit {
    let lanes = tile_ballot(t, p.found_bucket != NONE);
    let src = select(0u, firstTrailingBit(lanes), lanes != 0u);
    return Hit(lanes != 0u, tile_bcast(t, p.found_bucket, src), tile_bcast(t, p.found_slot, src),
        tile_bcast(t, p.found_state, src), tile_bcast(t, p.found_entry, src));
}

// What a get read: its value (not when the state word is damaged), and whether the value is
// damaged (a state word beyond the heap, or a checksum that fails); the same on every lane.
struct Read {
    value: bool,
    corrupt: bool,
}

// The value of the tile's get `op`, which found its key when `found_get`, into the batch's output:
// consecutive lanes, one request per cell (none for a cached group). A damaged value is not
// handed out: zeros instead.
fn read_value(t: Tile, found_get: bool, op: u32, hit: Hit, fp: u32) -> Read {
    // A published cell beyond the heap is a damaged state word: the read reports CORRUPT.
    let cell = hit.state - PUBLISHED;
    let damaged = found_get && cell >= ARENA_CELLS;
    let at = heap_cell(arena_of(fp), cell);
    let reads = found_get && !damaged;
    // Verified reads fetch the checksum word too: it follows the value in the same request.
    let read_words = VALUE_WORDS + VERIFY_VALUES;
    var terms = 0u;
    var stored = 0u;
    if (reads) {
        for (var w = t.lane; w < read_words; w += t.size) {
            var v: u32;
            if (hit.entry == NONE) {
                v = heap_load(cell_word(at, w));
            } else {
                v = cheap_load(cached_value_word(hit.entry, group_pos(hit.bucket, hit.slot), w));
            }
            if (w < VALUE_WORDS) {
                vals_out[op * VALUE_WORDS + w] = v;
                terms += checksum_term(w, v);
            } else {
                stored = v;
            }
        }
    }
    var corrupt = damaged;
    if (VERIFY_VALUES == 1u) {
        // The same on every lane of the tile (both sums run on every lane).
        let sum = CHECKSUM_BASE + tile_add(t, terms);
        let want = tile_add(t, stored);
        corrupt = corrupt || (reads && sum != want);
    }
    if (corrupt) {
        for (var w = t.lane; w < VALUE_WORDS; w += t.size) {
            vals_out[op * VALUE_WORDS + w] = 0u;
        }
    }
    return Read(reads, corrupt);
}

fn get_status(found: bool, r: Read) -> u32 {
    if (r.corrupt) {
        return STATUS_CORRUPT;
    }
    return select(STATUS_NOT_FOUND, STATUS_OK, found);
}

// One attempt at the tile's operation; false when it must be retried (a lost claim race).
fn step(t: Tile, turn: Turn) -> bool {
    let op = turn.op;
    var kind = 0u;
    var key: array<u32, KEY_WORDS>;
    if (turn.busy) {
        kind = kinds[op];
        key = load_key(op);
    }
    let loc = locate(key);
    let p = probe(t, turn.busy, key, loc);
    let hit = tile_hit(t, p);
    let found = hit.found;
    let found_state = hit.state;
    let found_entry = hit.entry;

    let new_key = turn.busy && !found && (kind == OP_INSERT || kind == OP_UPSERT);
    // The first operation on a key registers (a key is found by all operations of the batch or
    // by none): it claims a slot for a new key, or leads the changes of a found one.
    let changes = turn.busy && found && (kind == OP_UPSERT || kind == OP_UPDATE || kind == OP_DELETE);
    var claimant = NONE;
    if (turn.leader && (new_key || changes)) {
        claimant = join_claim(op, key, loc.fp);
    }
    claimant = tile_bcast(t, claimant, turn.lead);
    let joins = new_key && claimant != op;
    let wants_slot = new_key && !joins;
    // Reads, updates and deletes never claim: skip the reductions when no tile of the subgroup
    // has a new key (the test is subgroup-uniform, as the reductions require).
    var chosen = NONE;
    var won = false;
    if (subgroupAny(wants_slot)) {
        chosen = choose_empty(t, p);
        won = claim(t, wants_slot, loc, key, chosen, INSERTING);
    }
    let bucket = candidate_bucket(loc.tops, chosen);
    let slot = chosen % SLOTS;
    let r = read_value(t, turn.busy && found && kind == OP_GET, op, hit, loc.fp);

    if (!turn.leader) {
        return true;
    }
    if (found) {
        note(op, loc, hit.bucket, found_entry, table_group_reads(loc, found_entry), r.value && found_entry != NONE);
    } else if (won) {
        note(op, loc, bucket, candidate_entry(loc, chosen), table_group_reads(loc, NONE), false);
    } else if (!wants_slot || chosen == NONE) {
        note(op, loc, NONE, NONE, table_group_reads(loc, NONE), false);
    }
    if (kind == OP_GET) {
        finish(op, kind, get_status(found, r));
    } else if (found && kind == OP_INSERT) {
        finish(op, kind, STATUS_EXISTS);
    } else if (found) {
        // Lead or follower, each tells the lead what it does to the key.
        if (claimant == op) {
            set_op_field(op, ST_PHASE, PHASE_FOUND);
            set_op_field(op, ST_BUCKET, hit.bucket);
            set_op_field(op, ST_SLOT, hit.slot);
        } else {
            set_op_field(op, ST_PHASE, PHASE_FOLLOWS);
            set_op_field(op, ST_BUCKET, claimant);
        }
        set_op_field(op, ST_FOUND, found_state);
        if (kind == OP_DELETE) {
            atomicMin(&opstate[claimant * ST_WORDS + ST_FIRST_DELETE], op);
        } else {
            atomicMax(&opstate[claimant * ST_WORDS + ST_LAST_WRITE], op + 1u);
        }
        tally_add(CTRL_NEED_B, 1u);
    } else if (joins) {
        set_op_field(op, ST_PHASE, PHASE_JOINED);
        set_op_field(op, ST_BUCKET, claimant);
        tally_add(CTRL_NEED_B, 1u);
    } else if (!wants_slot) {
        finish(op, kind, STATUS_NOT_FOUND);
    } else if (chosen == NONE) {
        set_op_field(op, ST_PHASE, PHASE_FULL);
        tally_add(CTRL_FULL, 1u);
    } else if (won) {
        set_op_field(op, ST_PHASE, PHASE_CLAIMED);
        set_op_field(op, ST_BUCKET, bucket);
        set_op_field(op, ST_SLOT, slot);
        mark_table_words(fp_word(bucket, slot), 1u);
        mark_table_words(state_word(bucket, slot), 1u);
        mark_table_words(key_word(bucket, slot), KEY_WORDS);
        tally_add(CTRL_NEED_B, 1u);
    } else {
        return false;
    }
    return true;
}

@compute @workgroup_size(WG)
fn main(inv: Invocation, sg: Subgroup) {
    let t = tile_of_width(sg, params.tile);
    let o = owned(inv);
    var pending = false;
    if (o.owns) {
        pending = kinds[o.op] == OP_GET || op_field(o.op, ST_PHASE) != PHASE_NO_CELL;
    }
    loop {
        if (!subgroupAny(pending)) {
            break;
        }
        let turn = take_turn(t, pending, o.op);
        let done = step(t, turn);
        if (turn.leader && done) {
            pending = false;
        }
    }
    flush_tally(sg.lane);
}

// A batch of gets: `main`'s lookups alone, spread the same way. It runs without the allocation
// stage and writes no per-operation record (nothing reads them: no phase B follows). An
// operation that is not a get is not run, only counted (the host refuses the batch). A dispatch
// of fewer invocations than operations (`params.spread` 1: the host caps the requests a batch
// over host memory keeps in flight) gives each lane every `invocations`-th operation in turn.
@compute @workgroup_size(WG)
fn search(inv: Invocation, sg: Subgroup) {
    let t = tile_of_width(sg, params.tile);
    let o = owned(inv);
    let stride = invocations(inv) / params.spread;
    var op = params.n;
    if (o.owns) {
        op = next_get(o.op, stride);
    }
    var pending = op < params.n;
    loop {
        if (!subgroupAny(pending)) {
            break;
        }
        let turn = take_turn(t, pending, op);
        var key: array<u32, KEY_WORDS>;
        if (turn.busy) {
            key = load_key(turn.op);
        }
        let loc = locate(key);
        let hit = tile_hit(t, probe(t, turn.busy, key, loc));
        let r = read_value(t, turn.busy && hit.found, turn.op, hit, loc.fp);
        if (turn.leader) {
            note(turn.op, loc, hit.bucket, hit.entry, table_group_reads(loc, hit.entry), r.value && hit.entry != NONE);
            statuses[turn.op] = get_status(hit.found, r);
            op = next_get(op + stride, stride);
            pending = op < params.n;
        }
    }
    flush_tally(sg.lane);
}

// The first get among operations `first`, `first + stride`, ... of the batch (`params.n` if none),
// counting those that are not gets, which are not run.
fn next_get(first: u32, stride: u32) -> u32 {
    var op = first;
    while (op < params.n && kinds[op] != OP_GET) {
        count(CTRL_REFUSED);
        op += stride;
    }
    return min(op, params.n);
}
