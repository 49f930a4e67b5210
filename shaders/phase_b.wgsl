// Phase B, after phase A is persisted: each operation makes one CAS on a state word. Found
// slots are swung (update, upsert) or emptied (delete); claims are published
// (INSERTING -> 2 + cell); an upsert that joined a claim overwrites its value, an insert that
// joined one finds the key existing. Operations on the same key linearize in CAS order.
// Twin: Model::phase_b in src/model.rs.

#include "common/prelude.wgsl"
#include "common/protocol.wgsl"
#include "common/table.wgsl"

// Replaces `word` by `desired` whatever it holds; returns what it held.
fn swap_state(word: u32, desired: u32) -> u32 {
    var cur = table_load(word);
    loop {
        let seen = table_cas(word, cur, desired);
        if (seen == cur) {
            break;
        }
        cur = seen;
    }
    mark_table_words(word, 1u);
    return cur;
}

// Update, upsert or delete of a key that phase A found published.
fn swing(op: u32, kind: u32, cell: u32) {
    let word = state_word_of_id(op_field(op, ST_SLOT));
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

// A claim of this batch: publish it, unless an upsert that joined it already wrote its value.
fn publish(op: u32, cell: u32) {
    let word = state_word_of_id(op_field(op, ST_SLOT));
    if (table_cas(word, INSERTING, cell + PUBLISHED) != INSERTING) {
        set_op_field(op, ST_FREE, cell);
    }
    mark_table_words(word, 1u);
    count(CTRL_PUBLISHED);
    statuses[op] = STATUS_OK;
}

// An operation that joined another's claim of its key.
fn follow(op: u32, kind: u32, cell: u32) {
    if (kind == OP_UPSERT) {
        let claim = op_field(op_field(op, ST_SLOT), ST_SLOT);
        let old = swap_state(state_word_of_id(claim), cell + PUBLISHED);
        set_op_field(op, ST_FREE, select(NONE, old - PUBLISHED, old >= PUBLISHED));
        statuses[op] = STATUS_OK;
    } else {
        set_op_field(op, ST_FREE, cell);
        statuses[op] = STATUS_EXISTS;
    }
}

@compute @workgroup_size(WG)
fn main(inv: Invocation) {
    let me = op_index(inv);
    if (me >= params.n) {
        return;
    }
    let kind = kinds[me];
    let cell = op_field(me, ST_CELL);
    switch (op_field(me, ST_PHASE)) {
        case PHASE_FOUND: {
            swing(me, kind, cell);
        }
        case PHASE_CLAIMED: {
            publish(me, cell);
        }
        case PHASE_JOINED: {
            follow(me, kind, cell);
        }
        default: {}
    }
}
