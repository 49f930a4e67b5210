// One round of a batch, second kernel (after the probe, so every claim and key write of the
// round is complete): one invocation per operation, one CAS each.
// - found: swing the reference to the fresh cell (update, upsert) or empty it (delete); a
//   failed CAS that sees another published reference retries with it (a concurrent update of
//   the same key came first); one that sees the entry emptied (a concurrent delete came first)
//   makes an update or delete NOT_FOUND and sends an upsert to the next round, to create the
//   key again;
// - claimed: publish (FILLING -> cell): the cell of the upsert that joined last, if any, else
//   its own;
// - joined: an insert finds the key EXISTS (after its creator); an upsert succeeds (ordered
//   just before the publish of the value that stays).
// A replaced or unused cell is released at once: cells are allocated only by the next batch,
// which starts after this one is durable.
// Twin: SlabModel::apply in src/systems/slab/model.rs.

#include "common/prelude.wgsl"
#include "slab_common.wgsl"

@compute @workgroup_size(WG)
fn commit(inv: Invocation) {
    let op = op_index(inv);
    if (op >= params.n) {
        return;
    }
    let phase = op_get(op, F_PHASE);
    let kind = kinds[op];
    let cell = op_get(op, F_CELL);
    switch (phase) {
        case PH_FOUND: {
            let pos = op_get(op, F_POS);
            var expected = op_get(op, F_REF);
            let desired = select(cell, EMPTY, kind == OP_DELETE);
            loop {
                let seen = table_cas(pos, expected, desired);
                if (seen == expected) {
                    free_cell(expected);
                    mark_table_words(pos, 1u);
                    if (kind == OP_DELETE) {
                        count(C_DELETED);
                    }
                    statuses[op] = STATUS_OK;
                    op_set(op, F_PHASE, PH_DONE);
                    break;
                }
                if (seen < MAX_REF) {
                    expected = seen;
                    continue;
                }
                if (kind == OP_UPSERT) {
                    op_set(op, F_PHASE, PH_PENDING);
                    op_set(op, F_JOINER, 0u);
                    count(C_DEFERRED);
                } else {
                    if (kind == OP_UPDATE) {
                        free_cell(cell);
                    }
                    statuses[op] = STATUS_NOT_FOUND;
                    op_set(op, F_PHASE, PH_DONE);
                }
                break;
            }
        }
        case PH_CLAIMED: {
            let pos = op_get(op, F_POS);
            let joiner = op_get(op, F_JOINER);
            var publish = cell;
            if (joiner != 0u) {
                publish = op_get(joiner - 1u, F_CELL);
                free_cell(cell);
            }
            table_store(pos, publish);
            mark_table_words(pos, 1u);
            count(C_PUBLISHED);
            statuses[op] = STATUS_OK;
            op_set(op, F_PHASE, PH_DONE);
        }
        case PH_JOINED: {
            if (kind == OP_INSERT) {
                free_cell(cell);
                statuses[op] = STATUS_EXISTS;
            } else {
                if (op_get(op_get(op, F_HOLDER), F_JOINER) != op + 1u) {
                    free_cell(cell);
                }
                statuses[op] = STATUS_OK;
            }
            op_set(op, F_PHASE, PH_DONE);
        }
        default: {}
    }
}
