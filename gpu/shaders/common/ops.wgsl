// What the kernels of every table (gphash's and the slab baseline's) share on top of their
// generated prelude: operation and result codes, the invocation's operation and its key, the
// control counters.
// Twin: gphash's src/protocol.rs (OpKind, Status); the numbers must match (a test in gphash's
// src/gpu/shader.rs compares them).
// uses: KEY_WORDS, WG, control, keys

const OP_GET: u32 = 1u;
const OP_INSERT: u32 = 2u;
const OP_UPSERT: u32 = 3u;
const OP_UPDATE: u32 = 4u;
const OP_DELETE: u32 = 5u;

const STATUS_OK: u32 = 1u;
const STATUS_NOT_FOUND: u32 = 2u;
const STATUS_EXISTS: u32 = 3u;
const STATUS_CORRUPT: u32 = 4u;

const NONE: u32 = 0xffffffffu;

// Control word 0 of every table: dirty lines appended (the others are each table's own).
const CTRL_DIRTY_COUNT: u32 = 0u;

fn writes_value(kind: u32) -> bool {
    return kind == OP_INSERT || kind == OP_UPSERT || kind == OP_UPDATE;
}

// Where an invocation stands in its dispatch: workgroups may be laid out in two dimensions.
struct Invocation {
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
}

// The operation of this invocation.
fn op_index(inv: Invocation) -> u32 {
    return (inv.wid.y * inv.nwg.x + inv.wid.x) * WG + inv.li;
}

// Invocations in the dispatch.
fn invocations(inv: Invocation) -> u32 {
    return inv.nwg.x * inv.nwg.y * WG;
}

fn load_key(op: u32) -> array<u32, KEY_WORDS> {
    var key: array<u32, KEY_WORDS>;
    for (var i = 0u; i < KEY_WORDS; i++) {
        key[i] = keys[op * KEY_WORDS + i];
    }
    return key;
}

fn count(counter: u32) {
    atomicAdd(&control[counter], 1u);
}
