//! `gphash bench`: load and search throughput of one table configuration under each placement,
//! medians of several passes, with batch latencies.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use gphash::{Config, GpHash, Options, Placement, Status};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::progress;

/// Benchmark settings.
#[derive(Args, Clone)]
pub struct BenchArgs {
    /// Keys loaded.
    #[arg(long, default_value_t = 1 << 24)]
    keys: u64,
    /// Operations per batch.
    #[arg(long, default_value_t = 1 << 16)]
    batch: usize,
    /// Search passes over all keys (the median is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Key width in bytes.
    #[arg(long, default_value_t = 8)]
    key_bytes: u32,
    /// Value size in bytes.
    #[arg(long, default_value_t = 8)]
    value_bytes: u32,
    /// Placements to compare.
    #[arg(long, value_delimiter = ',', default_value = "zero-copy,staged")]
    placements: Vec<String>,
    /// Directory of the pools (tmpfs imports zero-copy).
    #[arg(long, default_value = "/dev/shm")]
    pool_dir: PathBuf,
}

struct Pass {
    rate: f64,
    latencies: Vec<Duration>,
}

fn pass(
    batches: &[Vec<u8>],
    ops_per_batch: &[usize],
    mut f: impl FnMut(&[u8]) -> gphash::Result<()>,
) -> gphash::Result<Pass> {
    let mut latencies = Vec::with_capacity(batches.len());
    let t = Instant::now();
    for b in batches {
        let s = Instant::now();
        f(b)?;
        latencies.push(s.elapsed());
    }
    let ops: usize = ops_per_batch.iter().sum();
    Ok(Pass {
        rate: ops as f64 / t.elapsed().as_secs_f64(),
        latencies,
    })
}

fn percentile(xs: &mut [Duration], p: f64) -> Duration {
    xs.sort();
    xs[((xs.len() - 1) as f64 * p).round() as usize]
}

fn row(label: &str, placement: &str, p: &mut [Pass]) {
    p.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    let median = &mut p[p.len() / 2];
    let (p50, p99) = (
        percentile(&mut median.latencies, 0.5),
        percentile(&mut median.latencies, 0.99),
    );
    println!(
        "{label:<10} {placement:<10} {:>10.2} Mops/s   p50 {:>9.3} ms   p99 {:>9.3} ms   ({} passes)",
        median.rate / 1e6,
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        p.len()
    );
}

pub fn run(args: &BenchArgs, base: &Options) -> gphash::Result<()> {
    let kb = args.key_bytes as usize;
    let mut ids: Vec<u64> = (0..args.keys).collect();
    let key = |i: u64| {
        let mut k = vec![0u8; kb];
        let h = (gphash::hash::fmix(i as u32) as u64) | (i << 32);
        for (j, c) in k.chunks_mut(8).enumerate() {
            let w = h.rotate_left(j as u32 * 13).to_le_bytes();
            c.copy_from_slice(&w[..c.len()]);
        }
        k
    };
    let chunk = |ids: &[u64]| -> (Vec<Vec<u8>>, Vec<usize>) {
        let b: Vec<Vec<u8>> = ids
            .chunks(args.batch)
            .map(|c| c.iter().flat_map(|&i| key(i)).collect())
            .collect();
        (b, ids.chunks(args.batch).map(|c| c.len()).collect())
    };
    let (load_batches, sizes) = chunk(&ids);
    let values: Vec<Vec<u8>> = load_batches
        .iter()
        .map(|b| vec![7u8; b.len() / kb * args.value_bytes as usize])
        .collect();
    ids.shuffle(&mut Xoshiro256PlusPlus::seed_from_u64(1));
    let (search_batches, search_sizes) = chunk(&ids);
    for placement in &args.placements {
        let mut options = base.clone();
        options.gpu.placement = match placement.as_str() {
            "zero-copy" => Placement::ZeroCopy,
            "staged" => Placement::Staged,
            other => {
                return Err(gphash::Error::InvalidConfig(format!(
                    "unknown placement {other}"
                )));
            }
        };
        let dir = tempfile::tempdir_in(&args.pool_dir).map_err(|source| gphash::Error::Io {
            what: format!("temporary directory in {}", args.pool_dir.display()),
            source,
        })?;
        let config = Config {
            key_bytes: args.key_bytes,
            value_bytes: args.value_bytes,
            capacity: args.keys,
            ..Config::default()
        };
        let mut index = GpHash::create(Some(&dir.path().join("bench.pool")), &config, &options)?;
        let stats = index.stats();
        println!(
            "# {} | {} | {} keys, batch {}",
            stats.adapter.as_deref().unwrap_or("cpu"),
            stats.mode,
            args.keys,
            args.batch
        );
        let bar = progress(args.keys, "load");
        let mut next = 0;
        let mut load = vec![pass(&load_batches, &sizes, |b| {
            let st = index.insert(b, &values[next])?;
            debug_assert!(st.iter().all(|s| *s == Status::Ok));
            next += 1;
            bar.inc(st.len() as u64);
            Ok(())
        })?];
        bar.finish_and_clear();
        let mut searches = vec![];
        for _ in 0..args.reps {
            searches.push(pass(&search_batches, &search_sizes, |b| {
                index.get(b).map(|_| ())
            })?);
        }
        row("insert", placement, &mut load);
        row("search", placement, &mut searches);
        let a = index.stats().activity;
        println!(
            "# load factor {:.3}; time in engine {:.3} s, persist {:.3} s, host encode/decode {:.3} s",
            index.stats().load_factor,
            a.engine_time.as_secs_f64(),
            a.persist_time.as_secs_f64(),
            a.host_time.as_secs_f64()
        );
        index.close()?;
    }
    Ok(())
}
