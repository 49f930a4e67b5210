//! The basic benchmarks: load and search per placement (medians of several passes, with batch
//! latencies), load factor at the first resize, resize and recovery time, persist cost.

use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_xoshiro::Xoshiro256PlusPlus;

use gphash::Placement;
use gphash::{Config, Executor, GpHash, GpuStartMode, Options};
use gphash::{Error, Result};

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
    /// The heap's arenas, as log2 (`Config::arena_bits`; `None`: as the table needs).
    pub arena_bits: Option<u32>,
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

/// A bijective mix of 64-bit integers (SplitMix64's finaliser: every step is invertible).
fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The key bytes of the integer `k`: its 8 bytes little-endian first (narrower keys keep its
/// low bytes), then, for wider keys, words derived from it.
pub fn key_bytes(k: u64, bytes: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.next_multiple_of(8));
    let mut h = k;
    while out.len() < bytes {
        out.extend_from_slice(&h.to_le_bytes());
        h = mix64(h ^ 0x9E37_79B9_7F4A_7C15);
    }
    out.truncate(bytes);
    out
}

/// The key of record `i`, as YCSB names it with hashed insert order: the integer
/// `fnvhash64(i)` ([`key_bytes`] of it). Distinct records get distinct keys but for FNV
/// collisions (about n^2 / 2^64 among n records).
pub fn key(i: u64, bytes: usize) -> Vec<u8> {
    key_bytes(crate::ycsb::fnv64(i), bytes)
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
            let dir = pool_dir(&self.pool_dir)?;
            let config = Config {
                key_bytes: self.key_bytes,
                value_bytes: self.value_bytes,
                capacity: self.keys,
                arena_bits: self.arena_bits,
                ..Config::default()
            };
            let index = GpHash::create(Some(&dir.path().join("bench.pool")), &config, &options)?;
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

/// The load factor at which a layout first finds no empty slot for an insertion.
#[derive(Clone, Debug)]
pub struct Fill {
    /// Layout.
    pub layout: gphash::Layout,
    /// About how many slots the table has.
    pub slots: u64,
    /// Insertions per batch (the figure's resolution).
    pub batch: usize,
    /// Key width.
    pub key_bytes: u32,
    /// Directory of the pool.
    pub pool_dir: PathBuf,
}

/// What [`Fill`] measured.
#[derive(Clone, Debug)]
pub struct Filled {
    /// Slots of the table.
    pub slots: u64,
    /// Keys inserted before the first insertion that found no slot.
    pub items: u64,
    /// Times of the batches before the heap's first growth, and after it (the batches that
    /// grew the heap left out): where a heap's free cells lie changes how fast inserts find them.
    pub batch_times: [Vec<Duration>; 2],
}

impl Filled {
    /// `items / slots`.
    pub fn load(&self) -> f64 {
        self.items as f64 / self.slots as f64
    }
}

/// Median, minimum and maximum.
pub fn spread(mut xs: Vec<Duration>) -> (Duration, Duration, Duration) {
    xs.sort();
    (xs[xs.len() / 2], xs[0], xs[xs.len() - 1])
}

/// A temporary pool directory in `dir`.
pub(crate) fn pool_dir(dir: &std::path::Path) -> Result<tempfile::TempDir> {
    tempfile::tempdir_in(dir).map_err(|source| Error::Io {
        what: format!("creating a pool directory in {}", dir.display()),
        source,
    })
}

impl Fill {
    /// Inserts distinct keys in batches until one makes the table grow by a level (the heap,
    /// sized for the target load, grows on its own before that).
    pub fn run(&self, base: &Options) -> Result<Filled> {
        let dir = pool_dir(&self.pool_dir)?;
        let capacity = (self.slots as f64 * gphash::TARGET_LOAD) as u64;
        let config = Config {
            layout: self.layout,
            key_bytes: self.key_bytes,
            value_bytes: 8,
            capacity,
            ..Config::default()
        };
        let index = GpHash::create(Some(&dir.path().join("fill.pool")), &config, base)?;
        let slots = index.geometry().slots();
        let kb = self.key_bytes as usize;
        let mut items = 0u64;
        let mut batch_times = [vec![], vec![]];
        let values = vec![0; self.batch * 8];
        loop {
            let keys: Vec<u8> = (items..items + self.batch as u64).flat_map(|i| key(i, kb)).collect();
            let growths = index.activity().heap_growths;
            let t = Instant::now();
            index.insert(&keys, &values)?;
            let spent = t.elapsed();
            let activity = index.activity();
            if activity.resizes > 0 {
                // The batch that found no slot made the table grow; the load is the one before it.
                return Ok(Filled { slots, items, batch_times });
            }
            if activity.heap_growths == growths {
                batch_times[(growths > 0) as usize].push(spent);
            }
            items += self.batch as u64;
        }
    }
}

/// The time to grow a loaded table by a level, and to recover it after a crash.
#[derive(Clone, Debug)]
pub struct ResizeRecovery {
    /// Keys loaded.
    pub keys: u64,
    /// Value size.
    pub value_bytes: u32,
    /// Directory of the pool.
    pub pool_dir: PathBuf,
}

/// What [`ResizeRecovery`] measured.
#[derive(Clone, Debug)]
pub struct ResizeFigures {
    /// Slots before and after the resize.
    pub slots: (u64, u64),
    /// Growing the loaded table by one level.
    pub resize: Duration,
    /// Opening it after a crash (dropped without close): recovery scan and engine start.
    pub recovery: Duration,
    /// The recovery scan's sequential ceiling, measured before it: the bytes the scan walks
    /// (the buckets, which hold the state words) and the time to read them through a fresh
    /// mapping of the pool on all host threads.
    pub scan_ceiling: (u64, Duration),
    /// Opening it after a clean close.
    pub clean_open: Duration,
    /// With a background GPU start (`None` on the CPU), after a clean close and after a crash:
    /// until the open returned, until a get of one key returned (run on the CPU model), until
    /// an upsert of it returned (the first write: after a clean close, it reads the allocator
    /// the close saved), and until the GPU took over.
    pub background_open: Option<[[Duration; 4]; 2]>,
    /// Opening the GPU, once, before the table (every open above shares it).
    pub device: Duration,
    /// Device and mode.
    pub setting: String,
}

impl ResizeRecovery {
    /// Loads the keys, grows the table once, drops it, reopens it twice. The GPU is opened
    /// once and shared, so that the opens measure the table's own start.
    pub fn run(&self, options: &Options, progress: &dyn Fn(u64)) -> Result<ResizeFigures> {
        let t = Instant::now();
        let options = &shared_device(options);
        let device = t.elapsed();
        let dir = pool_dir(&self.pool_dir)?;
        let path = dir.path().join("resize.pool");
        let config = Config { value_bytes: self.value_bytes, capacity: self.keys, ..Config::default() };
        let index = GpHash::create(Some(&path), &config, options)?;
        let stats = index.stats();
        let setting = format!("{} | {}", stats.adapter.as_deref().unwrap_or("no GPU"), stats.mode);
        let values = vec![3u8; (1 << 16) * self.value_bytes as usize];
        for start in (0..self.keys).step_by(1 << 16) {
            let n = (1 << 16).min(self.keys - start);
            let keys: Vec<u8> = (start..start + n).flat_map(|i| key(i, 8)).collect();
            index.insert(&keys, &values[..n as usize * self.value_bytes as usize])?;
            progress(n);
        }
        let before = index.geometry().slots();
        let t = Instant::now();
        index.grow()?;
        let resize = t.elapsed();
        let after = index.geometry().slots();
        drop(index);
        let scan_ceiling = read_buckets(&path)?;
        let t = Instant::now();
        let index = GpHash::open(&path, options)?;
        let recovery = t.elapsed();
        if index.len() != self.keys {
            return Err(Error::Resize(format!("{} keys after the resize, not {}", index.len(), self.keys)));
        }
        index.close()?;
        let t = Instant::now();
        let index = GpHash::open(&path, options)?;
        let clean_open = t.elapsed();
        index.close()?;
        let background_open = if options.executor == Executor::Cpu {
            None
        } else {
            let open = || -> Result<([Duration; 4], GpHash)> {
                let t = Instant::now();
                let index =
                    GpHash::open(&path, &Options { gpu_start: GpuStartMode::Background, ..options.clone() })?;
                let opened = t.elapsed();
                let found = index.get(&key(0, 8))?;
                let got = t.elapsed();
                let upserted = index.upsert(&key(0, 8), &values[..self.value_bytes as usize])?;
                let wrote = t.elapsed();
                index.wait_for_gpu()?;
                let ready = t.elapsed();
                if found.statuses[0] != gphash::Status::Ok || upserted[0] != gphash::Status::Ok {
                    return Err(Error::Resize(format!(
                        "after a background open, key 0: get {:?}, upsert {:?}",
                        found.statuses[0], upserted[0]
                    )));
                }
                Ok(([opened, got, wrote, ready], index))
            };
            let (clean, index) = open()?;
            // It wrote: dropped, it leaves a crash to recover from.
            drop(index);
            let (crashed, index) = open()?;
            index.close()?;
            Some([clean, crashed])
        };
        Ok(ResizeFigures {
            slots: (before, after),
            resize,
            recovery,
            scan_ceiling,
            clean_open,
            background_open,
            device,
            setting,
        })
    }
}

/// The bytes of the buckets of the pool at `path` (what a recovery scan walks), and the time
/// to read them through a fresh mapping on all host threads.
fn read_buckets(path: &std::path::Path) -> Result<(u64, Duration)> {
    use rayon::prelude::*;
    let pool = host_pm::Pool::open_private(path)?;
    let geo = GpHash::geometry_of(&pool)?;
    let bytes = geo.buckets() * geo.bucket_words() as u64 * 4;
    let t = Instant::now();
    let words: &[u64] = bytemuck::cast_slice(&pool.region(pool.header().table_region)[..bytes as usize]);
    let folded =
        words.par_chunks(1 << 13).map(|c| c.iter().fold(0, |a, &w| a ^ w)).reduce(|| 0, |a, b| a ^ b);
    let took = t.elapsed();
    std::hint::black_box(folded);
    Ok((bytes, took))
}

/// `options` with a device every table opened with them shares, opened now where it would
/// be opened by each table.
fn shared_device(options: &Options) -> Options {
    let mut options = options.clone();
    if options.device.is_none() && options.executor != Executor::Cpu {
        options.device = gphash::Gpu::new().ok();
    }
    options
}

/// The cost of the persist steps per batch, for one pool.
#[derive(Clone, Debug)]
pub struct PersistCost {
    /// Keys loaded first.
    pub keys: u64,
    /// Upserts of loaded keys measured.
    pub updates: u64,
    /// Operations per batch.
    pub batch: usize,
    /// Directory of the pool (its filesystem decides the backend).
    pub pool_dir: PathBuf,
}

/// What [`PersistCost`] measured over the updates.
#[derive(Clone, Debug)]
pub struct PersistFigures {
    /// Backend and persist primitive.
    pub pool: String,
    /// How batches ran.
    pub mode: String,
    /// Batches measured.
    pub batches: u64,
    /// Cache lines persisted per batch (0 where the primitive is a fence).
    pub lines_per_batch: f64,
    /// Time in persist calls per batch.
    pub persist_per_batch: Duration,
    /// Time in the engine per batch.
    pub engine_per_batch: Duration,
}

impl PersistCost {
    /// Loads the keys, then measures batches of upserts.
    pub fn run(&self, options: &Options) -> Result<PersistFigures> {
        let dir = pool_dir(&self.pool_dir)?;
        let config = Config { capacity: self.keys, ..Config::default() };
        let index = GpHash::create(Some(&dir.path().join("persist.pool")), &config, options)?;
        let values = vec![5u8; self.batch * 8];
        for start in (0..self.keys).step_by(self.batch) {
            let n = (self.batch as u64).min(self.keys - start);
            let keys: Vec<u8> = (start..start + n).flat_map(|i| key(i, 8)).collect();
            index.insert(&keys, &values[..n as usize * 8])?;
        }
        let before = index.stats().activity;
        let mut ids: Vec<u64> = (0..self.keys).collect();
        ids.shuffle(&mut Xoshiro256PlusPlus::seed_from_u64(2));
        for chunk in ids.iter().cycle().take(self.updates as usize).collect::<Vec<_>>().chunks(self.batch) {
            let keys: Vec<u8> = chunk.iter().flat_map(|&&i| key(i, 8)).collect();
            index.upsert(&keys, &values[..chunk.len() * 8])?;
        }
        let stats = index.stats();
        let a = &stats.activity;
        let batches = a.batches - before.batches;
        let per = |d: Duration| d / batches.max(1) as u32;
        Ok(PersistFigures {
            pool: format!("{:?} ({})", stats.backend, stats.persist_mode),
            mode: stats.mode.to_string(),
            batches,
            lines_per_batch: (a.persisted_lines - before.persisted_lines) as f64 / batches.max(1) as f64,
            persist_per_batch: per(a.persist_time - before.persist_time),
            engine_per_batch: per(a.engine_time - before.engine_time),
        })
    }
}
