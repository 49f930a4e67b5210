//! The demo: a table in a temporary pool, loaded with a progress bar, then a mixed and a
//! read-only workload, every value verified, with throughput, load factor, mode and device.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use gphash::{Config, GpHash, Options, Status};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::{announce_cpu_fallback, progress};

/// Demo settings.
#[derive(Args, Clone)]
pub(crate) struct DemoArgs {
    /// Keys to load.
    #[arg(long, default_value_t = 1 << 20)]
    keys: u64,
    /// Operations of the mixed and of the read-only workload.
    #[arg(long, default_value_t = 1 << 20)]
    ops: u64,
    /// Operations per batch.
    #[arg(long, default_value_t = 1 << 16)]
    batch: u64,
    /// Directory of the demo's pool: a file without a name there, gone when the demo ends,
    /// however it ends [default: /dev/shm, else the system's temporary directory].
    #[arg(long)]
    dir: Option<PathBuf>,
}

impl Default for DemoArgs {
    fn default() -> Self {
        DemoArgs { keys: 1 << 20, ops: 1 << 20, batch: 1 << 16, dir: None }
    }
}

/// Key `i`: scattered over the key space, as hashed YCSB keys are.
fn key(i: u64) -> u64 {
    gphash::hash::fmix(i as u32) as u64 | (i << 32)
}

fn bytes(xs: &[u64]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub(crate) fn run(args: &DemoArgs, options: &Options) -> gphash::Result<()> {
    let shm = Path::new("/dev/shm");
    let dir =
        args.dir.clone().unwrap_or_else(|| if shm.is_dir() { shm.into() } else { std::env::temp_dir() });
    if !dir.is_dir() {
        return Err(gphash::Error::InvalidConfig(format!("--dir {} is not a directory", dir.display())));
    }
    let config = Config { capacity: args.keys, ..Config::default() };
    // A directory gets a pool in a file that is never named: a killed demo leaves nothing.
    let index = GpHash::create(Some(&dir), &config, options)?;
    announce_cpu_fallback(&index, options);
    let stats = index.stats();
    println!(
        "gphash demo: pool in an unnamed file in {} ({:?}, persist by {})",
        dir.display(),
        stats.backend,
        stats.persist_mode
    );
    println!("  device: {}", stats.adapter.as_deref().unwrap_or("none"));
    if stats.software_device {
        println!("          a software Vulkan device on the CPU: the figures below are not a GPU's");
    }
    println!("  mode:   {}", stats.mode);
    let batch = args.batch.max(1);
    let mut expect: Vec<u64> = (0..args.keys).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();

    let bar = progress(args.keys, "load");
    let t = Instant::now();
    for start in (0..args.keys).step_by(batch as usize) {
        let ids: Vec<u64> = (start..(start + batch).min(args.keys)).collect();
        let keys: Vec<u64> = ids.iter().map(|&i| key(i)).collect();
        let values: Vec<u64> = ids.iter().map(|&i| expect[i as usize]).collect();
        let st = index.insert(&bytes(&keys), &bytes(&values))?;
        assert!(st.iter().all(|s| *s == Status::Ok), "fresh keys insert");
        bar.inc(ids.len() as u64);
    }
    bar.finish_and_clear();
    let load = rate(args.keys, t);
    // The first loading phase of the cache is due after --cache-period operations; the demo
    // runs one now, from the accesses of the load.
    index.load_cache()?;

    let mut rng = Xoshiro256PlusPlus::seed_from_u64(42);
    let bar = progress(args.ops, "mixed");
    let t = Instant::now();
    for start in (0..args.ops).step_by(batch as usize) {
        let n = batch.min(args.ops - start);
        let mut b = index.batch();
        let mut ids = vec![];
        for _ in 0..n {
            let i = rng.random_range(0..args.keys);
            if rng.random_bool(0.5) {
                b.get(&key(i).to_le_bytes())?;
                ids.push(None);
            } else {
                let v: u64 = rng.random();
                b.upsert(&key(i).to_le_bytes(), &v.to_le_bytes())?;
                ids.push(Some((i, v)));
            }
        }
        // Batch order matters for a key read and written in one batch: run it ordered.
        index.execute_ordered(&b)?;
        for (i, v) in ids.into_iter().flatten() {
            expect[i as usize] = v;
        }
        bar.inc(n);
    }
    bar.finish_and_clear();
    let mixed = rate(args.ops, t);

    let bar = progress(args.ops, "read");
    let t = Instant::now();
    let mut wrong = 0u64;
    for start in (0..args.ops).step_by(batch as usize) {
        let n = batch.min(args.ops - start);
        let ids: Vec<u64> = (0..n).map(|_| rng.random_range(0..args.keys)).collect();
        let found = index.get(&bytes(&ids.iter().map(|&i| key(i)).collect::<Vec<_>>()))?;
        for (j, &i) in ids.iter().enumerate() {
            wrong += (found.value(j) != Some(&expect[i as usize].to_le_bytes()[..])) as u64;
        }
        bar.inc(n);
    }
    bar.finish_and_clear();
    let read = rate(args.ops, t);

    let report = index.check();
    let stats = index.stats();
    println!("  loaded {} keys:                 {load}", args.keys);
    println!("  mixed 50% get / 50% upsert:      {mixed}");
    println!("  uniform gets:                    {read}");
    println!(
        "  batch size {batch}; load factor {:.3} ({} keys in {} slots)",
        stats.load_factor, stats.items, stats.slots
    );
    println!("  cache: {}", stats.cache);
    println!(
        "  values verified: {} wrong of {} reads; check: {}",
        wrong,
        args.ops,
        if report.ok() { "consistent" } else { "INCONSISTENT" }
    );
    index.close()?;
    if wrong > 0 || !report.ok() {
        return Err(gphash::Error::Gpu(format!("the demo read {wrong} wrong values; {report}")));
    }
    Ok(())
}

fn rate(ops: u64, t: Instant) -> String {
    let s = t.elapsed().as_secs_f64();
    format!("{:>10.3} M ops/s ({s:.2} s)", ops as f64 / s / 1e6)
}
