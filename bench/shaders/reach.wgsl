// `bench reach` (src/reach.rs): random 128-byte requests over a host region read through its
// storage windows, as the kernels read a pool: `pool_load` is the generated prelude's accessor
// (a binding per window, or one binding array). Twin: `reach_address.comp`, which reads the
// same words through the region's device address.

#include "common/prelude.wgsl"
#include "common/hash.wgsl"
// uses: WG, pool_load

// The immediates of both kernels (`base` is the address kernel's; here unused).
struct Params {
    base: vec2<u32>,
    lines: u32,
    iters: u32,
    seed: u32,
    check: u32,
}

var<immediate> params: Params;
@group(0) @binding(0) var<storage, read_write> sink: array<u32>;

// 32 invocations a request: each reads one word of the request's line, so that a subgroup of
// 32 reads a line together, as a search's tile does.
@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let me = (wid.y * nwg.x + wid.x) * WG + li;
    let request = me / 32u;
    var acc = 0u;
    for (var it = 0u; it < params.iters; it++) {
        let line = fmix(request * 0x9e3779b9u ^ fmix(it + params.seed)) % params.lines;
        acc ^= pool_load(Word(line) * Word(32u) + Word(me % 32u));
    }
    if (params.check != 0u || acc == 0x12345678u) {
        sink[me] = acc;
    }
}
