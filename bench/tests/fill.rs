//! `bench fill`: the default layout (2L-2H-8S, each hash location in a half of the top level of
//! its own) first finds no slot past a load of 0.915 at 393 K slots (issue 13 asks 0.90 at any
//! size; it reaches 0.913 at 25 M), on the CPU model and on the GPU's kernels alike. With every
//! location over the whole level it stopped at 0.906 here (0.912 on the model), and at 0.896
//! at 25 M slots.

#[path = "../../tests/common/mod.rs"]
mod common;

use gphash::{GpuOptions, Layout};
use gphash_bench::Fill;

#[test]
fn the_default_layout_fills_past_nine_tenths() {
    for (what, options) in
        [("model", common::cpu_options()), ("GPU", common::gpu_options(GpuOptions::default()))]
    {
        let dir = common::pool_dir();
        let fill = Fill {
            layout: Layout::default(),
            slots: 1 << 18,
            batch: 1024,
            key_bytes: 8,
            pool_dir: dir.path().into(),
        };
        let f = fill.run(&options).unwrap();
        assert!(
            f.load() >= 0.915,
            "{what}: first growth at a load of {:.4} ({} keys in {} slots)",
            f.load(),
            f.items,
            f.slots
        );
    }
}
