// Staged placement: gathers the dirty lines of the device copy of the pool into a staging
// buffer, which the host scatters into the pool mapping before it persists them.

#include "slab/prelude.wgsl"
#include "common/hash.wgsl"
#include "common/tile.wgsl"
#include "slab_common.wgsl"

@compute @workgroup_size(WG)
fn gather(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let total = min(atomicLoad(&state[C_DIRTY]), params.dirty_cap) * 16u;
    let stride = nwg.x * nwg.y * WG;
    for (var i = op_index(wid, nwg, li); i < total; i += stride) {
        let line = dirty[i / 16u];
        let word = i % 16u;
        if (line >= params.table_line_base && line - params.table_line_base < params.table_lines) {
            staging[i] = table_load((line - params.table_line_base) * 16u + word);
        } else {
            staging[i] = heap_load((line - params.heap_line_base) * 16u + word);
        }
    }
}
