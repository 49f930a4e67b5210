// Tiles: groups of `TILE` lanes (fewer on narrower subgroups) that serve one operation at a
// time. A subgroup of 64 lanes runs two 32-lane tiles, a subgroup of 4 one 4-lane tile.
// Reductions use shuffles inside the tile, never whole-subgroup ops, so tiles stay independent.
// Every function here is a subgroup operation: call it from subgroup-uniform control flow.
// uses: TILE

struct Tile {
    size: u32,  // lanes per tile, a power of two
    base: u32,  // first subgroup lane of this tile
    lane: u32,  // lane within the tile
}

// An invocation's place in its subgroup.
struct Subgroup {
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) size: u32,
}

fn tile_of(sg: Subgroup) -> Tile {
    return tile_of_width(sg, TILE);
}

// Tiles of `width` lanes (a power of two; at most TILE and the subgroup's size): a kernel whose
// width is chosen per dispatch.
fn tile_of_width(sg: Subgroup, width: u32) -> Tile {
    let size = min(min(width, TILE), sg.size);
    return Tile(size, sg.lane & ~(size - 1u), sg.lane & (size - 1u));
}

// Bit i set: lane i of this tile has `pred`.
fn tile_ballot(t: Tile, pred: bool) -> u32 {
    let b = subgroupBallot(pred);
    let word = b[t.base >> 5u];
    let mask = select((1u << t.size) - 1u, 0xffffffffu, t.size == 32u);
    return (word >> (t.base & 31u)) & mask;
}

fn tile_bcast(t: Tile, v: u32, src: u32) -> u32 {
    return subgroupShuffle(v, t.base + src);
}

fn tile_min(t: Tile, v: u32) -> u32 {
    var x = v;
    for (var m = 1u; m < t.size; m <<= 1u) {
        x = min(x, subgroupShuffleXor(x, m));
    }
    return x;
}

fn tile_add(t: Tile, v: u32) -> u32 {
    var x = v;
    for (var m = 1u; m < t.size; m <<= 1u) {
        x += subgroupShuffleXor(x, m);
    }
    return x;
}

// The tile's operation: the lowest lane with a pending operation leads it.
struct Turn {
    busy: bool,    // this tile has an operation this round
    leader: bool,  // this lane owns it
    lead: u32,     // the owning lane, within the tile
    op: u32,       // its index in the batch
}

fn take_turn(t: Tile, pending: bool, me: u32) -> Turn {
    let req = tile_ballot(t, pending);
    let busy = req != 0u;
    let lead = select(0u, firstTrailingBit(req), busy);
    let op = tile_bcast(t, me, lead);
    return Turn(busy, busy && t.lane == lead, lead, op);
}
