// Memory ceilings (src/ceiling.rs): sequential bandwidth and random requests, over one
// buffer of vec4s. `sink` keeps every read alive.

#include "common/prelude.wgsl"
#include "common/hash.wgsl"

struct Params {
    words: u32,       // 32-bit words in the buffer (a multiple of 4)
    iters: u32,       // passes (sequential) or requests per subgroup (random)
    line_words: u32,  // words per random request (a multiple of 4)
    seed: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> data: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> sink: array<u32>;

fn invocation(wid: vec3<u32>, nwg: vec3<u32>, li: u32) -> u32 {
    return (wid.y * nwg.x + wid.x) * 128u + li;
}

fn total(nwg: vec3<u32>) -> u32 {
    return nwg.x * nwg.y * 128u;
}

@compute @workgroup_size(128)
fn seq_read(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let me = invocation(wid, nwg, li);
    var acc = vec4<u32>(0u);
    for (var it = 0u; it < params.iters; it++) {
        for (var i = me; i < params.words / 4u; i += total(nwg)) {
            acc ^= data[i];
        }
    }
    if (acc.x == 0x12345678u) {
        sink[me % 256u] = acc.y ^ acc.z ^ acc.w;
    }
}

@compute @workgroup_size(128)
fn seq_write(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let me = invocation(wid, nwg, li);
    for (var it = 0u; it < params.iters; it++) {
        for (var i = me; i < params.words / 4u; i += total(nwg)) {
            data[i] = vec4<u32>(i, it, params.seed, 1u);
        }
    }
}

// One request per subgroup and iteration: a random run of `line_words` words, read by the
// subgroup's lanes together.
@compute @workgroup_size(128)
fn random_read(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) size: u32,
) {
    let me = invocation(wid, nwg, li);
    let subgroup = me / size;
    let lines = params.words / params.line_words;
    var acc = vec4<u32>(0u);
    for (var it = 0u; it < params.iters; it++) {
        let line = fmix(subgroup * 0x9e3779b9u ^ fmix(it + params.seed)) % lines;
        for (var v = lane; v < params.line_words / 4u; v += size) {
            acc ^= data[line * (params.line_words / 4u) + v];
        }
    }
    if (acc.x == 0x12345678u) {
        sink[me % 256u] = acc.y ^ acc.z ^ acc.w;
    }
}

@compute @workgroup_size(128)
fn random_write(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) size: u32,
) {
    let me = invocation(wid, nwg, li);
    let subgroup = me / size;
    let lines = params.words / params.line_words;
    for (var it = 0u; it < params.iters; it++) {
        let line = fmix(subgroup * 0x9e3779b9u ^ fmix(it + params.seed)) % lines;
        for (var v = lane; v < params.line_words / 4u; v += size) {
            data[line * (params.line_words / 4u) + v] = vec4<u32>(line, it, v, 1u);
        }
    }
}
