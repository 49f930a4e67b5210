//! Benchmarks shared by `gphash bench` and `cargo bench`: load a table, then search every key,
//! under each placement; medians of several passes, with batch latencies.

use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::error::{Error, Result};
use crate::gpu::engine::Placement;
use crate::index::{Config, GpHash, Options};

/// What to measure.
#[derive(Clone, Debug)]
pub struct LoadSearch {
    /// Keys loaded (and searched).
    pub keys: u64,
    /// Operations per batch.
    pub batch: usize,
    /// Search passes over all keys (the median is reported).
    pub reps: usize,
    /// Key width.
    pub key_bytes: u32,
    /// Value size.
    pub value_bytes: u32,
    /// Placements compared.
    pub placements: Vec<Placement>,
    /// Directory of the pools.
    pub pool_dir: PathBuf,
}

/// One measured workload under one placement.
#[derive(Clone, Debug)]
pub struct Row {
    /// `insert` or `search`.
    pub workload: &'static str,
    /// Placement requested.
    pub placement: Placement,
    /// Median operations per second.
    pub rate: f64,
    /// Median pass's batch latencies: 50th and 99th percentile.
    pub p50: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Passes measured.
    pub passes: usize,
    /// Device and mode, as `stats` reports them.
    pub setting: String,
}

impl fmt::Display for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<8} {:<10} {:>9.2} Mops/s   p50 {:>8.3} ms   p99 {:>8.3} ms   ({} passes)",
            self.workload,
            format!("{:?}", self.placement),
            self.rate / 1e6,
            self.p50.as_secs_f64() * 1e3,
            self.p99.as_secs_f64() * 1e3,
            self.passes
        )
    }
}

struct Pass {
    rate: f64,
    latencies: Vec<Duration>,
}

fn pass(batches: &[Vec<u8>], ops: usize, mut f: impl FnMut(usize, &[u8]) -> Result<()>) -> Result<Pass> {
    let mut latencies = Vec::with_capacity(batches.len());
    let t = Instant::now();
    for (i, b) in batches.iter().enumerate() {
        let s = Instant::now();
        f(i, b)?;
        latencies.push(s.elapsed());
    }
    Ok(Pass { rate: ops as f64 / t.elapsed().as_secs_f64(), latencies })
}

fn row(workload: &'static str, placement: Placement, setting: &str, mut passes: Vec<Pass>) -> Row {
    passes.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    let n = passes.len();
    let median = &mut passes[n / 2];
    median.latencies.sort();
    let at = |p: f64| median.latencies[((median.latencies.len() - 1) as f64 * p).round() as usize];
    Row {
        workload,
        placement,
        rate: median.rate,
        p50: at(0.5),
        p99: at(0.99),
        passes: n,
        setting: setting.into(),
    }
}

/// Key `i` of width `bytes`: distinct for distinct `i`, scattered over the key space.
pub fn key(i: u64, bytes: usize) -> Vec<u8> {
    let h = (crate::hash::fmix(i as u32) as u64) | (i << 32);
    (0..bytes).map(|j| (h.rotate_left((j / 8) as u32 * 13) >> (8 * (j % 8))) as u8).collect()
}

impl LoadSearch {
    /// Runs the benchmark; `progress` is told of each batch's operations.
    pub fn run(&self, base: &Options, progress: &dyn Fn(u64)) -> Result<Vec<Row>> {
        let (kb, vb) = (self.key_bytes as usize, self.value_bytes as usize);
        let batches = |ids: &[u64]| -> Vec<Vec<u8>> {
            ids.chunks(self.batch.max(1)).map(|c| c.iter().flat_map(|&i| key(i, kb)).collect()).collect()
        };
        let mut ids: Vec<u64> = (0..self.keys).collect();
        let load = batches(&ids);
        let values: Vec<Vec<u8>> = load.iter().map(|b| vec![7u8; b.len() / kb * vb]).collect();
        ids.shuffle(&mut Xoshiro256PlusPlus::seed_from_u64(1));
        let search = batches(&ids);
        let ops = self.keys as usize;
        let mut rows = vec![];
        for &placement in &self.placements {
            let mut options = base.clone();
            options.gpu.placement = placement;
            let dir = tempfile::tempdir_in(&self.pool_dir).map_err(|source| Error::Io {
                what: format!("creating a pool directory in {}", self.pool_dir.display()),
                source,
            })?;
            let config = Config {
                key_bytes: self.key_bytes,
                value_bytes: self.value_bytes,
                capacity: self.keys,
                ..Config::default()
            };
            let mut index = GpHash::create(Some(&dir.path().join("bench.pool")), &config, &options)?;
            let stats = index.stats();
            let setting = format!("{} | {}", stats.adapter.as_deref().unwrap_or("no GPU"), stats.mode);
            let inserted = pass(&load, ops, |i, b| {
                index.insert(b, &values[i])?;
                progress((b.len() / kb) as u64);
                Ok(())
            })?;
            let searches = (0..self.reps)
                .map(|_| pass(&search, ops, |_, b| index.get(b).map(|_| progress((b.len() / kb) as u64))))
                .collect::<Result<Vec<_>>>()?;
            if index.len() != self.keys {
                return Err(Error::Gpu(format!(
                    "the benchmark table holds {} keys, not {}",
                    index.len(),
                    self.keys
                )));
            }
            rows.push(row("insert", placement, &setting, vec![inserted]));
            rows.push(row("search", placement, &setting, searches));
            index.close()?;
        }
        Ok(rows)
    }
}
