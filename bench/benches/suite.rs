//! `cargo bench --bench suite`: a short run of `gphash bench suite` (every system, every
//! workload, both key widths) and of `gphash bench cache` on the best device, lavapipe
//! included. It proves that the benchmarks run end to end and that no system answers an
//! operation wrongly (statuses are checked), not how fast anything is: use `gphash bench` on
//! real hardware for figures.

use gphash::{CacheOptions, Gpu, Policy};
use gphash_bench::bktcache::CacheBench;
use gphash_bench::runner::{self, Suite, SystemKind};
use gphash_bench::ycsb::Workload;

fn main() -> gphash::Result<()> {
    let gpu = Gpu::new()?;
    let dir =
        if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm".into() } else { std::env::temp_dir() };
    let suite = Suite {
        workloads: vec![
            Workload::C,
            Workload::B,
            Workload::A,
            Workload::F,
            Workload::D,
            Workload::PositiveSearch,
            Workload::NegativeSearch,
            Workload::Update,
            Workload::Insert,
            Workload::Delete,
        ],
        systems: SystemKind::ALL.to_vec(),
        key_bytes: vec![8, 32],
        value_bytes: 128,
        records: 8192,
        micro_ops: 2048,
        macro_ops: 4096,
        batches: vec![1024],
        load_batch: 4096,
        distributions: vec![None],
        seed: 42,
        pool_dir: dir.clone(),
        cpu_threads: 2,
        cache: CacheOptions { period: 4096, ..CacheOptions::default() },
        tile: 32,
        keep_pools: false,
        in_flight: false,
        reps: 2,
    };
    println!("# {} ({})", gpu.info.name, gpu.info.driver);
    println!("{}", runner::Record::heading());
    let records = runner::run(&suite, &gpu, &[], &|_| {}, &mut |r| println!("{}", r.line()))?;
    let wrong: u64 = records.iter().map(|r| r.unexpected).sum();
    let cache = CacheBench {
        records: 8192,
        ops: 4096,
        reps: 1,
        warmup: 4096,
        batch: 1024,
        key_bytes: 8,
        value_bytes: 128,
        workloads: vec![Workload::C],
        ratios: vec![0.0, 0.2],
        thetas: vec![0.99],
        policies: vec![Policy::Lfu, Policy::Random],
        ratio: 0.2,
        timeline_ops: 16384,
        period: 4096,
        seed: 7,
        pool_dir: dir,
    };
    cache.run(&gpu, &mut |line| println!("{line}"))?;
    if wrong > 0 {
        return Err(gphash::Error::InvalidConfig(format!("{wrong} operations answered unexpectedly")));
    }
    Ok(())
}
