//! `cargo bench`: a short load-and-search run on the best device (lavapipe included). It
//! proves that the benchmark runs, not how fast anything is: use `gphash bench` on real
//! hardware for figures.

use gphash::Placement;
use gphash::{GpuStartMode, Options};
use gphash_bench::LoadSearch;

fn main() -> gphash::Result<()> {
    let dir =
        if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm".into() } else { std::env::temp_dir() };
    let bench = LoadSearch {
        keys: 1 << 16,
        batch: 1 << 12,
        reps: 3,
        key_bytes: 8,
        value_bytes: 8,
        placements: vec![Placement::Auto, Placement::Staged],
        arena_bits: None,
        pool_dir: dir,
    };
    // The GPU times its batches from the first one: the open waits for it.
    let options = Options { gpu_start: GpuStartMode::Wait, ..Options::default() };
    for row in bench.run(&options, &|_| {})? {
        println!("{row}   [{}]", row.setting);
    }
    Ok(())
}
