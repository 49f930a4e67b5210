// Phase B, after phase A is persisted: swing or clear the slots phase A found, resolve claims of
// the same key made in this batch (the lowest slot id survives) and publish the survivors
// (INSERTING -> 2 + cell). Every change is one CAS on a state word.
// Twin: Model::phase_b in src/model.rs.

#include "common/prelude.wgsl"
#include "common/protocol.wgsl"
#include "common/hash.wgsl"
#include "common/tile.wgsl"
#include "common/table.wgsl"
#include "common/probe.wgsl"

// Update, upsert or delete of a key that phase A found published.
fn swing(op: u32) {
    let word = state_word_of_id(op_field(op, ST_SLOT));
    let kind = kinds[op];
    let cell = op_field(op, ST_CELL);
    let desired = select(cell + PUBLISHED, EMPTY, kind == OP_DELETE);
    var cur = table_load(word);
    loop {
        if (cur < PUBLISHED) {
            // A delete of this batch came first: this batch orders an update before that
            // delete (applied, then deleted) and a second delete after it (nothing to delete).
            statuses[op] = select(STATUS_OK, STATUS_NOT_FOUND, kind == OP_DELETE);
            set_op_field(op, ST_FREE, cell);
            return;
        }
        let seen = table_cas(word, cur, desired);
        if (seen == cur) {
            break;
        }
        cur = seen;
    }
    mark_table_words(word, 1u);
    set_op_field(op, ST_FREE, cur - PUBLISHED);
    if (kind == OP_DELETE) {
        count(CTRL_DELETED);
    }
    statuses[op] = STATUS_OK;
}

// A claimed slot: publish it if it is the surviving claim of its key, else give it up.
fn resolve(t: Tile, turn: Turn) {
    let op = turn.op;
    var key: array<u32, KEY_WORDS>;
    if (turn.busy) {
        key = load_key(op);
    }
    let p = probe_lane(t, turn.busy, key, locate(key));
    let winner = tile_min(t, p.live_slot);
    if (!turn.leader) {
        return;
    }
    let mine = op_field(op, ST_SLOT);
    let cell = op_field(op, ST_CELL);
    let word = state_word_of_id(mine);
    if (winner == mine) {
        if (table_cas(word, INSERTING, cell + PUBLISHED) != INSERTING) {
            // An upsert of the same key already wrote its value over this claim.
            set_op_field(op, ST_FREE, cell);
        }
        count(CTRL_PUBLISHED);
        statuses[op] = STATUS_OK;
    } else {
        table_store(word, EMPTY);
        if (kinds[op] == OP_UPSERT) {
            // Ordered after the surviving claim: overwrite its value.
            let survivor = state_word_of_id(winner);
            var cur = table_load(survivor);
            loop {
                let seen = table_cas(survivor, cur, cell + PUBLISHED);
                if (seen == cur) {
                    break;
                }
                cur = seen;
            }
            mark_table_words(survivor, 1u);
            set_op_field(op, ST_FREE, select(NONE, cur - PUBLISHED, cur >= PUBLISHED));
            statuses[op] = STATUS_OK;
        } else {
            set_op_field(op, ST_FREE, cell);
            statuses[op] = STATUS_EXISTS;
        }
    }
    mark_table_words(word, 1u);
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32,
) {
    let t = tile_of(sg_lane, sg_size);
    let me = op_index(wid, nwg, li);
    var phase = 0u;
    if (me < params.n) {
        phase = op_field(me, ST_PHASE);
    }
    // Found slots need no probe: each invocation swings its own, all in flight at once.
    if (phase == PHASE_FOUND) {
        swing(me);
    }
    var pending = phase == PHASE_CLAIMED;
    loop {
        if (!subgroupAny(pending)) {
            break;
        }
        let turn = take_turn(t, pending, me);
        resolve(t, turn);
        if (turn.leader) {
            pending = false;
        }
    }
}
