// Phase B, after phase A is persisted: at most one CAS per key. A found key's changes are
// applied by its lead (swung to the last writer's cell, or emptied by a delete); claims are
// published (INSERTING -> 2 + cell); an upsert that joined a claim overwrites its value, an
// insert that joined one finds the key existing.
// Twin: Model::phase_b in src/model.rs.

#include "common/prelude.wgsl"
#include "common/protocol.wgsl"
#include "common/table.wgsl"

// Replaces `word` by `desired` whatever it holds; returns what it held.
fn swap_state(word: Word, desired: u32) -> u32 {
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

// Update, upsert or delete of a key that phase A found published. The operations on the key
// linearize as its writes in batch order, then its deletes (the first deletes the key, the
// others find nothing): the final state is EMPTY if any deletes, else the last writer's cell.
// Only the lead changes the slot, with one CAS nothing else contends for; the operation that
// decides the final state (last writer, or first delete) releases the old cell, every other
// writer its own.
fn change(op: u32, kind: u32, cell: u32, lead: u32) {
    let last_write = op_field(lead, ST_LAST_WRITE);
    let first_delete = op_field(lead, ST_FIRST_DELETE);
    let deleted = first_delete != NONE;
    let old = op_field(op, ST_FOUND);
    if (op == lead) {
        let word = op_state_word(op);
        var desired = EMPTY;
        if (!deleted) {
            desired = op_field(last_write - 1u, ST_CELL) + PUBLISHED;
        }
        table_cas(word, old, desired);
        mark_table_words(word, 1u);
        if (deleted) {
            count(CTRL_DELETED);
        }
    }
    if (decides(op, lead)) {
        set_op_field(op, ST_FREE, old - PUBLISHED);
    } else {
        set_op_field(op, ST_FREE, cell);
    }
    statuses[op] = select(STATUS_OK, STATUS_NOT_FOUND, kind == OP_DELETE && op != first_delete);
}

// A claim of this batch: publish it, unless an upsert that joined it already wrote its value.
fn publish(op: u32, cell: u32) {
    let word = op_state_word(op);
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
        let old = swap_state(op_state_word(op_field(op, ST_BUCKET)), cell + PUBLISHED);
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
        case PHASE_FOUND, PHASE_FOLLOWS: {
            change(me, kind, cell, lead_of(me));
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
