// Memory ceilings: random 32-bit compare-and-swaps, one per invocation and iteration.

#include "common/prelude.wgsl"
#include "common/hash.wgsl"

struct Params {
    words: u32,
    iters: u32,
    line_words: u32,
    seed: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> data: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read_write> sink: array<u32>;

@compute @workgroup_size(128)
fn cas(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let me = (wid.y * nwg.x + wid.x) * 128u + li;
    var won = 0u;
    for (var it = 0u; it < params.iters; it++) {
        let w = fmix(me * 0x9e3779b9u ^ fmix(it + params.seed)) % params.words;
        let r = atomicCompareExchangeWeak(&data[w], it, it + 1u);
        won += u32(r.exchanged);
    }
    if (won == 0xffffffffu) {
        sink[me % 256u] = won;
    }
}
