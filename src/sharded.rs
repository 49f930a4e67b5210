//! A table spread over several pools by a hash of the key: more keys than one table's 32-bit
//! slot numbers and state words reach (`docs/design.md`, "Pools past 16 GiB"), and growth one
//! shard at a time, each pause moving a shard's keys rather than the whole table's (TurboHash's
//! segments, seed 003, at the scale of whole tables).
//!
//! Each shard is a [`GpHash`] of its own in `DIR/shard-NNNN.pool`; the shards share the host's
//! GPUs, in turn.
//! The file `DIR/gphash-shards` names how many there are and the table's identity, which each
//! shard's header records with its number (so a pool put in another shard's place is refused).
//! It is written last when the table is made, so a directory without it holds nothing
//! acknowledged.

use std::fs;
use std::hash::BuildHasher;
use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, mpsc};

use rayon::prelude::*;

use crate::batch::{Batch, BatchResult};
use crate::error::{Error, Result};
use crate::index::{Config, Executor, GpHash, Options};
use crate::layout::{SHARD_NUMBER_WORD, SHARD_TABLE_WORD, TARGET_LOAD};
use crate::profile::Laps;
use crate::protocol::{OpKind, Status};
use crate::recovery::CheckReport;
use gphash_gpu::Gpu;
use host_pm::Pool;

/// The file that names a directory's shards.
const MANIFEST: &str = "gphash-shards";
/// Its first line: the format and its version. Version 1 (no `table` line) is still read;
/// its shards' places are not checked.
const MANIFEST_HEAD: &str = "gphash-shards 2";
const MANIFEST_HEAD_V1: &str = "gphash-shards 1";
/// The most shards a table has (each is a pool, an engine and its GPU buffers).
pub const MAX_SHARDS: usize = 1024;
/// The load at which a shard grows before a batch that may add keys to it, one shard a batch
/// (the one furthest past its load to grow at), less the load the batch's inserts and upserts
/// could add to that shard if all of them went there, but not below [`TARGET_LOAD`]: so that
/// shards of equal load, which would otherwise fill up in the same batch (at the load factor of
/// the first growth: `BENCHMARKS.md`, "Growth and recovery") and make that batch wait
/// for all of their growths, grow in turn, each before it is full; and a table made for its
/// keys (sized for [`TARGET_LOAD`]) does not grow ahead before it holds them.
pub const GROW_AHEAD_LOAD: f64 = 0.85;

/// A table of `GpHash` shards, each key in the one [`ShardedGpHash::shard_of`] names.
///
/// A batch is cut by shard and each shard runs its part on a thread of its own, as
/// [`GpHash::execute`] or [`GpHash::execute_ordered`] would. Each key's operations are in one
/// part, in batch order, so each key's results are those the call promises (one-by-one
/// application for `execute_ordered`). What differs from one table:
/// - a shard that fails leaves its part of the batch without effect, but the parts of the other
///   shards stand ([`Error::Shard`] names both and holds the results of the parts that
///   took effect);
/// - a call of another thread may run between the parts of two shards.
///
/// Before a batch that may add keys, one shard near full grows (with [`Options::grow`]; see
/// [`GROW_AHEAD_LOAD`]), so that a batch mostly waits for one shard's growth, not for all of
/// theirs.
///
/// A crash leaves each key as it was before the batch or after it, as in each shard.
pub struct ShardedGpHash {
    dir: PathBuf,
    /// Shared with the [`Workers`]' jobs while they run.
    shards: Arc<Vec<GpHash>>,
    /// A thread for each shard, made at the first batch of several parts.
    workers: OnceLock<Workers>,
    /// Whether shards grow ahead of need ([`GROW_AHEAD_LOAD`]); per shard, whether a thread is
    /// growing it ahead (so two threads never both do), and whether a growth ahead failed (it
    /// is not tried again: the shard grows when it must, or says why not).
    grow_ahead: bool,
    growing: Vec<AtomicBool>,
    ahead_failed: Vec<AtomicBool>,
    key_bytes: usize,
    value_bytes: usize,
}

impl ShardedGpHash {
    /// Creates a table of `shards` new pools in the directory `dir` (made if absent; it must not
    /// hold a sharded table already), on the GPUs [`ShardedGpHash::devices`] gives.
    /// `config.capacity` and `config.max_bytes` are the whole table's, shared evenly; each
    /// shard grows on its own. Each shard's header records a random identity of the table and
    /// the shard's number, which opening checks.
    pub fn create(dir: &Path, config: &Config, shards: usize, options: &Options) -> Result<Self> {
        Self::create_on(dir, config, shards, options, &Self::devices(options)?)
    }

    /// [`ShardedGpHash::create`] on the GPUs given: shard `i` on `gpus[i % gpus.len()]`; with
    /// none, every shard on the CPU model.
    pub fn create_on(
        dir: &Path,
        config: &Config,
        shards: usize,
        options: &Options,
        gpus: &[Arc<Gpu>],
    ) -> Result<Self> {
        if !(1..=MAX_SHARDS).contains(&shards) {
            return Err(Error::InvalidConfig(format!("{shards} shards: must be 1 to {MAX_SHARDS}")));
        }
        let io = |what: &str| {
            let what = format!("{what} {}", dir.display());
            move |source| Error::Io { what, source }
        };
        fs::create_dir_all(dir).map_err(io("creating the directory"))?;
        let manifest = dir.join(MANIFEST);
        if manifest.exists() {
            let held = std::io::Error::new(std::io::ErrorKind::AlreadyExists, "it holds a sharded table");
            return Err(io("creating a sharded table in")(held));
        }
        // Nothing may stand where a shard's pool goes (a file, a directory, a link to a
        // device): this call removes the pools it made if it fails, and only those.
        if let Some(taken) = (0..shards).map(|i| shard_path(dir, i)).find(|p| fs::symlink_metadata(p).is_ok())
        {
            let why = format!(
                "{} exists: a sharded table's pools go there (left by a create cut short? remove them)",
                taken.display()
            );
            return Err(io("creating a sharded table in")(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                why,
            )));
        }
        let config = Config {
            capacity: shard_capacity(config.capacity, shards),
            max_bytes: config.max_bytes.map(|b| b / shards as u64),
            ..*config
        };
        let table = new_identity();
        let made = in_parallel((0..shards).collect(), |i| {
            let options = on_device(options, gpus, shards, i)?;
            GpHash::create_placed(Some(&shard_path(dir, i)), &config, &options, Some((table, i)))
        });
        // Without the manifest, the pools this call made hold nothing acknowledged: on a
        // failure they are removed (nothing stood in their place before), so that the
        // directory can take a table again.
        let remove = || (0..shards).for_each(|i| drop(fs::remove_file(shard_path(dir, i))));
        let made = Self::from_shards(dir, made, options).inspect_err(|_| remove())?;
        if let Err(e) = write_manifest(dir, &Manifest { shards, table: Some(table) }) {
            let _ = made.close();
            remove();
            return Err(e);
        }
        Ok(made)
    }

    /// Opens the sharded table in `dir`, recovering each shard that was not closed cleanly, on
    /// the GPUs [`ShardedGpHash::devices`] gives.
    pub fn open(dir: &Path, options: &Options) -> Result<Self> {
        Self::open_on(dir, options, &Self::devices(options)?)
    }

    /// [`ShardedGpHash::open`] on the GPUs given, as [`ShardedGpHash::create_on`] uses them.
    /// A pool that is not this table's shard `i` (another table's, or another shard's: files
    /// moved or swapped) is refused before any shard is opened for writing, and checked again
    /// under its lock as it opens.
    pub fn open_on(dir: &Path, options: &Options, gpus: &[Arc<Gpu>]) -> Result<Self> {
        let manifest = read_manifest(dir)?;
        let shards = manifest.shards;
        let placed = in_parallel((0..shards).collect(), |i| manifest.check_place(dir, i));
        placed.into_iter().collect::<Result<Vec<()>>>()?;
        let opened = in_parallel((0..shards).collect(), |i| {
            let path = shard_path(dir, i);
            let options = on_device(options, gpus, shards, i)?;
            GpHash::open_checked(&path, &options, |pool| manifest.check_header(&path, i, pool.header().user))
        });
        let table = Self::from_shards(dir, opened, options)?;
        let widths = |s: &GpHash| (s.geometry().key_bytes, s.geometry().value_bytes);
        if let Some(i) = table.shards.iter().position(|s| widths(s) != widths(&table.shards[0])) {
            let why = format!(
                "shard {i} has {:?}-byte keys and values, shard 0 {:?}",
                widths(&table.shards[i]),
                widths(&table.shards[0])
            );
            let _ = table.close();
            return Err(Error::IncompatiblePool { path: shard_path(dir, i), why });
        }
        Ok(table)
    }

    /// The GPUs shards run on under `options`: `options.device` where it is set; none (the CPU
    /// model) under [`Executor::Cpu`]; else the host's best GPU and its identical twins
    /// ([`Gpu::all`]), so a table's shards spread over all of them. With [`Executor::Auto`] and
    /// no GPU, none.
    pub fn devices(options: &Options) -> Result<Vec<Arc<Gpu>>> {
        match (&options.device, options.executor) {
            (Some(gpu), _) => Ok(vec![gpu.clone()]),
            (None, Executor::Cpu) => Ok(vec![]),
            (None, executor) => match Gpu::all() {
                Ok(gpus) => Ok(gpus),
                Err(e) if executor == Executor::Auto => {
                    log::warn!("no GPU, every shard runs on the CPU model: {e}");
                    Ok(vec![])
                }
                Err(e) => Err(e.into()),
            },
        }
    }

    /// The table of the shards `made` for `dir`, or the first error, the others closed.
    fn from_shards(dir: &Path, made: Vec<Result<GpHash>>, options: &Options) -> Result<Self> {
        if made.iter().all(Result::is_ok) {
            let shards: Vec<GpHash> = made.into_iter().flatten().collect();
            let geo = shards[0].geometry();
            return Ok(ShardedGpHash {
                dir: dir.to_path_buf(),
                grow_ahead: options.grow && shards.len() > 1,
                growing: shards.iter().map(|_| AtomicBool::new(false)).collect(),
                ahead_failed: shards.iter().map(|_| AtomicBool::new(false)).collect(),
                shards: Arc::new(shards),
                workers: OnceLock::new(),
                key_bytes: geo.key_bytes as usize,
                value_bytes: geo.value_bytes as usize,
            });
        }
        let mut first = None;
        for m in made {
            match m {
                Ok(shard) => drop(shard.close()),
                Err(e) => first = first.or(Some(e)),
            }
        }
        Err(first.expect("a shard failed"))
    }

    /// The shard of `key` among `shards`: FNV-1a of its bytes, mixed by SplitMix64's
    /// finaliser, scaled to `shards`. It is independent of the tables' own hashes (a 32-bit
    /// `fmix` of the key's words with the pool's seed), so each shard's keys spread over all
    /// of its buckets.
    pub fn shard_of(key: &[u8], shards: usize) -> usize {
        let mut h: u64 = 0xCBF2_9CE4_8422_2325;
        for &b in key {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
        }
        h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        h ^= h >> 31;
        ((u128::from(h) * shards as u128) >> 64) as usize
    }

    /// The pool files of the sharded table in `dir`, as its manifest names them, without
    /// opening them (for tools that check or inspect each shard).
    pub fn shard_paths(dir: &Path) -> Result<Vec<PathBuf>> {
        Ok((0..read_manifest(dir)?.shards).map(|i| shard_path(dir, i)).collect())
    }

    /// Why each shard's pool that can be read is not in its place (another table's pool, or
    /// another shard's), as opening would refuse it; without opening any for writing (for
    /// tools that check each shard). A table of manifest version 1 names no identity: none.
    pub fn misplaced(dir: &Path) -> Result<Vec<(usize, Error)>> {
        let manifest = read_manifest(dir)?;
        let checked = in_parallel((0..manifest.shards).collect(), |i| (i, manifest.check_place(dir, i)));
        Ok(checked
            .into_iter()
            .filter_map(|(i, placed)| match placed {
                Err(e @ Error::IncompatiblePool { .. }) => Some((i, e)),
                _ => None,
            })
            .collect())
    }

    /// The shards, in the order [`ShardedGpHash::shard_of`] numbers them.
    pub fn shards(&self) -> &[GpHash] {
        &self.shards
    }

    /// The table's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Key width in bytes.
    pub fn key_bytes(&self) -> usize {
        self.key_bytes
    }

    /// Value size in bytes.
    pub fn value_bytes(&self) -> usize {
        self.value_bytes
    }

    /// Published keys, over all shards.
    pub fn len(&self) -> u64 {
        self.shards.iter().map(GpHash::len).sum()
    }

    /// Whether no shard holds a key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots over all shards.
    pub fn slots(&self) -> u64 {
        self.shards.iter().map(|s| s.geometry().slots()).sum()
    }

    /// Each shard's consistency check (see [`GpHash::check`]), all shards at once.
    pub fn check(&self) -> Vec<CheckReport> {
        in_parallel(self.shards.iter().collect(), GpHash::check)
    }

    /// Closes every shard cleanly; the first failure is returned after all were tried.
    pub fn close(self) -> Result<()> {
        let ShardedGpHash { shards, workers, .. } = self;
        // Their threads end, and with them every job's share of the shards.
        drop(workers);
        let shards = Arc::into_inner(shards).expect("no job outlives its batch, nor a batch the table");
        in_parallel(shards, GpHash::close).into_iter().collect()
    }

    /// Runs a batch as [`GpHash::execute`] does, each shard's part on its shard.
    pub fn execute(&self, batch: &Batch) -> Result<BatchResult> {
        self.run(batch, GpHash::execute)
    }

    /// Runs a batch as [`GpHash::execute_ordered`] does: the results of applying its
    /// operations one by one, in order.
    pub fn execute_ordered(&self, batch: &Batch) -> Result<BatchResult> {
        self.run(batch, GpHash::execute_ordered)
    }

    /// Reads concatenated keys.
    pub fn get(&self, keys: &[u8]) -> Result<BatchResult> {
        self.execute(&Batch::of_kind(OpKind::Get, self.key_bytes, self.value_bytes, keys, None)?)
    }

    /// Inserts absent keys (`Exists` for the others).
    pub fn insert(&self, keys: &[u8], values: &[u8]) -> Result<Vec<Status>> {
        self.bulk(OpKind::Insert, keys, Some(values))
    }

    /// Inserts or overwrites keys.
    pub fn upsert(&self, keys: &[u8], values: &[u8]) -> Result<Vec<Status>> {
        self.bulk(OpKind::Upsert, keys, Some(values))
    }

    /// Overwrites present keys (`NotFound` for the others).
    pub fn update(&self, keys: &[u8], values: &[u8]) -> Result<Vec<Status>> {
        self.bulk(OpKind::Update, keys, Some(values))
    }

    /// Removes keys.
    pub fn delete(&self, keys: &[u8]) -> Result<Vec<Status>> {
        self.bulk(OpKind::Delete, keys, None)
    }

    fn bulk(&self, kind: OpKind, keys: &[u8], values: Option<&[u8]>) -> Result<Vec<Status>> {
        let batch = Batch::of_kind(kind, self.key_bytes, self.value_bytes, keys, values)?;
        Ok(self.execute(&batch)?.statuses)
    }

    fn run(&self, batch: &Batch, call: fn(&GpHash, &Batch) -> Result<BatchResult>) -> Result<BatchResult> {
        if batch.key_bytes() != self.key_bytes {
            return Err(Error::KeyWidth { found: batch.key_bytes(), expected: self.key_bytes });
        }
        if batch.value_bytes() != self.value_bytes {
            return Err(Error::ValueSize { found: batch.value_bytes(), expected: self.value_bytes });
        }
        let n = self.shards.len();
        if n == 1 {
            return call(&self.shards[0], batch);
        }
        if u32::try_from(batch.len()).is_err() {
            return Err(Error::BatchTooLarge { len: batch.len() as u64, max: u32::MAX as u64 });
        }
        let mut laps = Laps::start("sharded batch");
        let route: Vec<u32> =
            (0..batch.len()).into_par_iter().map(|i| Self::shard_of(batch.op(i).1, n) as u32).collect();
        laps.lap("route");
        let (parts, cut) = batch.split(route, n);
        laps.lap("split");
        if self.grow_ahead {
            self.grow_one_ahead(&parts.par_iter().map(Batch::adds).collect::<Vec<_>>());
            laps.lap("growth ahead");
        }
        let lens: Vec<usize> = parts.iter().map(Batch::len).collect();
        let work: Vec<(usize, Batch)> =
            parts.into_iter().enumerate().filter(|(_, b)| !b.is_empty()).collect();
        let outcomes = self.on_workers(work, call)?;
        laps.lap("shards");
        let (mut applied, mut failed) = (vec![], vec![]);
        let mut results: Vec<BatchResult> = vec![];
        for (i, outcome) in outcomes {
            // Parts without operations were not run; their (empty) results keep the parts'
            // numbering.
            results.resize_with(i, || BatchResult::new(0, self.value_bytes));
            match outcome {
                Ok(part) => {
                    results.push(part);
                    applied.push(i);
                }
                Err(e) => {
                    // A failed part's place, of its length, for the gathering.
                    results.push(BatchResult::new(lens[i], self.value_bytes));
                    failed.push((i, e));
                }
            }
        }
        if failed.is_empty() {
            let result = BatchResult::gathered(&cut, &results, self.value_bytes);
            laps.lap("gather");
            return Ok(result);
        }
        let shards: Vec<usize> = failed.iter().map(|(i, _)| *i).collect();
        let results = Box::new(BatchResult::gathered_partial(&cut, &results, self.value_bytes, &shards));
        let (shard, source) = failed.remove(0);
        for (i, e) in failed {
            log::error!("shard {i} also failed its part of the batch: {e}");
        }
        Err(Error::Shard { shard, failed: shards, applied, source: Box::new(source), results })
    }
}

impl ShardedGpHash {
    /// Runs `call` on each part of `work` on its shard's thread, outcomes in the order of
    /// `work` (one part runs on the caller's thread). A part that panicked panics here, once
    /// every part is done.
    fn on_workers(
        &self,
        work: Vec<(usize, Batch)>,
        call: fn(&GpHash, &Batch) -> Result<BatchResult>,
    ) -> Result<Vec<(usize, Result<BatchResult>)>> {
        if let [(i, part)] = &work[..] {
            return Ok(vec![(*i, call(&self.shards[*i], part))]);
        }
        let workers = match self.workers.get() {
            Some(w) => w,
            None => {
                // Two first batches at once each start threads; the second's end unused.
                let started = Workers::start(self.shards.len())?;
                self.workers.get_or_init(|| started)
            }
        };
        let (done, outcomes) = mpsc::channel();
        for (i, part) in work {
            let (shards, done) = (self.shards.clone(), done.clone());
            let job: Job = Box::new(move || {
                let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| call(&shards[i], &part)));
                // The caller waits for every part.
                let _ = done.send((i, outcome));
            });
            // A thread ends only once its sender is dropped: its jobs catch their panics.
            workers.jobs[i].send(job).expect("a shard's thread runs while the table is open");
        }
        drop(done);
        // Every part's outcome first: a panic is passed on once all are done.
        let outcomes: Vec<_> = outcomes.into_iter().collect();
        let mut ran = Vec::with_capacity(outcomes.len());
        for (i, outcome) in outcomes {
            match outcome {
                Ok(result) => ran.push((i, result)),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        ran.sort_by_key(|(i, _)| *i);
        Ok(ran)
    }

    /// Grows one shard ahead of need before a batch that may add `adds[i]` keys to shard `i`:
    /// among the shards it adds to, the one furthest past its load to grow at (see
    /// [`GROW_AHEAD_LOAD`]), if any. A failure is logged, not returned: the batch may still
    /// fit, and a shard that must grow grows in its own call.
    fn grow_one_ahead(&self, adds: &[usize]) {
        // The shards grow one a batch: the batch's inserts and upserts as a whole measure how
        // soon each must start.
        let all = adds.iter().sum::<usize>() as f64;
        let past = |i: usize| {
            let s = &self.shards[i];
            let slots = s.geometry().slots() as f64;
            s.len() as f64 / slots - (GROW_AHEAD_LOAD - all / slots).max(TARGET_LOAD)
        };
        let fullest = (0..self.shards.len())
            .filter(|&i| adds[i] > 0 && !self.ahead_failed[i].load(Ordering::Relaxed))
            .map(|i| (i, past(i)))
            .filter(|&(_, past)| past >= 0.0)
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let Some((i, _)) = fullest else { return };
        // Another thread's call may be growing it, or may have grown it since: look again
        // once it is ours.
        if self.growing[i].compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return;
        }
        if past(i) >= 0.0
            && let Err(e) = self.shards[i].grow()
        {
            log::warn!("shard {i} could not grow ahead of need: {e}");
            self.ahead_failed[i].store(true, Ordering::Relaxed);
        }
        self.growing[i].store(false, Ordering::Release);
    }
}

/// `DIR/shard-NNNN.pool`.
fn shard_path(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("shard-{i:04}.pool"))
}

/// A shard's share of `capacity` keys: the mean with four standard deviations of a binomial
/// share to spare, so that no shard of a table filled to its capacity is likely to grow.
fn shard_capacity(capacity: u64, shards: usize) -> u64 {
    let mean = capacity as f64 / shards as f64;
    (mean + 4.0 * mean.sqrt()).ceil().max(1.0) as u64
}

/// `options` for shard `i` of `shards` on `gpus`. Where the cache's budget is not set, the
/// shards on one GPU share the one a table would have alone there (half its memory, or three
/// quarters of what is free if that is less), rather than each taking it; a budget that is set
/// is each shard's.
fn on_device(options: &Options, gpus: &[Arc<Gpu>], shards: usize, i: usize) -> Result<Options> {
    let mut options = options.clone();
    match (gpus.len(), options.executor) {
        (0, Executor::Gpu) => return Err(Error::NoAdapter("no GPU for the shards".into())),
        (0, _) => options.executor = Executor::Cpu,
        (n, _) => {
            let gpu = &gpus[i % n];
            let cache = &mut options.gpu.cache;
            if cache.max_bytes.is_none() {
                let (alone, _) = cache.budget(&gpu.info, gpu.device_memory_available());
                cache.max_bytes = Some(alone / shards_on(i % n, shards, n) as u64);
            }
            options.device = Some(gpu.clone());
        }
    }
    Ok(options)
}

/// Shards on GPU `g` of `gpus` when shard `i` runs on GPU `i % gpus`.
fn shards_on(g: usize, shards: usize, gpus: usize) -> usize {
    shards / gpus + usize::from(g < shards % gpus)
}

/// A job for a shard's thread.
type Job = Box<dyn FnOnce() + Send>;

/// A thread for each shard, kept while the table is open, which runs the jobs sent to it in
/// turn: a batch's parts go to their shards' threads. A thread made for each part of each
/// batch made sharded searches slower (`docs/lab/growth-and-recovery.md`, "Sharded batches on
/// threads kept for each shard"). Dropping it ends and joins the threads.
struct Workers {
    jobs: Vec<mpsc::Sender<Job>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Workers {
    /// `shards` threads, or an error where the system refuses one.
    fn start(shards: usize) -> Result<Workers> {
        let mut workers = Workers { jobs: Vec::with_capacity(shards), threads: Vec::with_capacity(shards) };
        for i in 0..shards {
            let (send, jobs) = mpsc::channel::<Job>();
            let thread = std::thread::Builder::new()
                .name(format!("gphash-shard-{i}"))
                .spawn(move || jobs.into_iter().for_each(|job| job()))
                .map_err(|source| Error::Io { what: format!("starting the thread of shard {i}"), source })?;
            workers.jobs.push(send);
            workers.threads.push(thread);
        }
        Ok(workers)
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        // Without their senders, the threads' loops end.
        self.jobs.clear();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Runs `f` on every item, each on a thread of its own (inline for one), results in order.
fn in_parallel<I: Send, T: Send>(items: Vec<I>, f: impl Fn(I) -> T + Sync) -> Vec<T> {
    if items.len() == 1 {
        return items.into_iter().map(f).collect();
    }
    let f = &f;
    std::thread::scope(|s| {
        let running: Vec<_> = items.into_iter().map(|item| s.spawn(move || f(item))).collect();
        running
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect()
    })
}

/// What a table's manifest says.
#[derive(Debug, PartialEq, Eq)]
struct Manifest {
    shards: usize,
    /// The table's identity, which each shard's header records with its number
    /// (`SHARD_TABLE_WORD`, `SHARD_NUMBER_WORD`); `None` in a version 1 manifest.
    table: Option<u64>,
}

impl Manifest {
    /// Refuses the pool at shard `i`'s path if its header does not name this table and shard
    /// `i`, reading it through a private view (nothing is written to it).
    fn check_place(&self, dir: &Path, i: usize) -> Result<()> {
        if self.table.is_none() {
            return Ok(());
        }
        let path = shard_path(dir, i);
        let user = Pool::open_private(&path)?.header().user;
        self.check_header(&path, i, user)
    }

    /// Refuses the pool at `path`, shard `i`'s place, unless its header's user words `user`
    /// name this table and shard `i`.
    fn check_header(&self, path: &Path, i: usize, user: [u64; 8]) -> Result<()> {
        let Some(table) = self.table else { return Ok(()) };
        let (found, number) = (user[SHARD_TABLE_WORD], user[SHARD_NUMBER_WORD]);
        if (found, number) == (table, i as u64 + 1) {
            return Ok(());
        }
        let shard = |n: u64| n.checked_sub(1).map_or("an unnumbered shard".into(), |n| format!("shard {n}"));
        let is = match (found, number) {
            (0, 0) => "a pool of no sharded table".to_string(),
            (t, n) if t == table => format!("this table's {}", shard(n)),
            (t, n) => format!("{} of table {t:016x}", shard(n)),
        };
        let why = format!("it is not shard {i} of table {table:016x} but {is}: put in its place by hand?");
        Err(Error::IncompatiblePool { path: path.to_path_buf(), why })
    }
}

/// A new table's identity: random, so that no two tables' shards share it.
fn new_identity() -> u64 {
    std::hash::RandomState::new().hash_one((std::time::SystemTime::now(), std::process::id())).max(1)
}

/// Publishes the manifest: written and synced under a temporary name, then linked to its own
/// name, which fails rather than replace one that exists; then the directory and its parent
/// (which may just have got it) are synced. A failed sync takes the manifest back.
fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<()> {
    let io =
        |what: &'static str| move |source| Error::Io { what: format!("{what} in {}", dir.display()), source };
    let temp = dir.join(format!(".{MANIFEST}.{}", std::process::id()));
    let mut file = fs::File::create(&temp).map_err(io("writing the shards' manifest"))?;
    let table = manifest.table.expect("new manifests name their table");
    let text = format!("{MANIFEST_HEAD}\nshards {}\ntable {table:016x}\n", manifest.shards);
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io("writing the shards' manifest"))?;
    let linked = fs::hard_link(&temp, dir.join(MANIFEST));
    let _ = fs::remove_file(&temp);
    linked.map_err(io("publishing the shards' manifest"))?;
    let sync = |d: &Path| fs::File::open(d).and_then(|d| d.sync_all());
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    sync(dir).and_then(|()| sync(parent)).map_err(|e| {
        let _ = fs::remove_file(dir.join(MANIFEST));
        io("syncing the directory")(e)
    })
}

/// The manifest of `dir`.
fn read_manifest(dir: &Path) -> Result<Manifest> {
    let path = dir.join(MANIFEST);
    let bad = |why: &str| Error::IncompatiblePool { path: path.clone(), why: why.into() };
    let text = fs::read_to_string(&path).map_err(|source| match source.kind() {
        std::io::ErrorKind::InvalidData => bad("it is not text"),
        _ => Error::Io {
            what: format!(
                "opening the sharded table in {}: no readable {MANIFEST} (a table whose creation was \
             interrupted has shard pools but no manifest, and holds nothing acknowledged)",
                dir.display()
            ),
            source,
        },
    })?;
    let mut lines = text.lines();
    let v1 = match lines.next() {
        Some(MANIFEST_HEAD) => false,
        Some(MANIFEST_HEAD_V1) => true,
        _ => return Err(bad(&format!("the first line is not `{MANIFEST_HEAD}` (or version 1's)"))),
    };
    let shards = lines
        .next()
        .and_then(|l| l.strip_prefix("shards "))
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|n| (1..=MAX_SHARDS).contains(n))
        .ok_or_else(|| bad(&format!("the second line is not `shards N` with N from 1 to {MAX_SHARDS}")))?;
    let table = match v1 {
        true => None,
        false => Some(
            lines
                .next()
                .and_then(|l| l.strip_prefix("table "))
                .filter(|id| {
                    id.len() == 16 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                })
                .and_then(|id| u64::from_str_radix(id, 16).ok())
                .ok_or_else(|| bad("the third line is not `table` and 16 hexadecimal digits"))?,
        ),
    };
    if lines.next().is_some() {
        return Err(bad("it has more lines than its version's"));
    }
    Ok(Manifest { shards, table })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The threads each part of the last batches ran on, by the shard they ran for.
    static RAN_ON: std::sync::Mutex<Vec<(usize, Option<String>)>> = std::sync::Mutex::new(Vec::new());

    /// [`GpHash::execute`], noting the thread and the part's shard; a part of shard 1 with 13
    /// operations panics.
    fn noted(shard: &GpHash, part: &Batch) -> Result<BatchResult> {
        // The test's parts hold keys `3 k + i` for shard `i`.
        let i = (u64::from_le_bytes(part.op(0).1.try_into().unwrap()) % 3) as usize;
        RAN_ON.lock().unwrap().push((i, std::thread::current().name().map(String::from)));
        assert!(!(i == 1 && part.len() == 13), "an injected panic");
        shard.execute(part)
    }

    /// A batch's parts run on their shards' threads, the same ones batch after batch; a part
    /// that panics passes its panic to the caller once the others are done, and the threads
    /// serve the next batch.
    #[test]
    fn parts_run_on_threads_kept_for_their_shards() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options { executor: Executor::Cpu, ..Options::default() };
        let t = ShardedGpHash::create(&dir.path().join("t"), &Config::default(), 3, &options).unwrap();
        let parts = |n: usize| -> Vec<(usize, Batch)> {
            (0..3)
                .map(|i| {
                    let mut b = Batch::new(8, 8);
                    (0..n + i)
                        .for_each(|k| b.insert(&(k as u64 * 3 + i as u64).to_le_bytes(), &[1; 8]).unwrap());
                    (i, b)
                })
                .collect()
        };
        for round in 0..3 {
            RAN_ON.lock().unwrap().clear();
            let ran = t.on_workers(parts(20 + round), noted).unwrap();
            assert_eq!(
                ran.iter().map(|(i, r)| (*i, r.is_ok())).collect::<Vec<_>>(),
                [(0, true), (1, true), (2, true)]
            );
            let mut on = RAN_ON.lock().unwrap().clone();
            on.sort();
            let want: Vec<_> = (0..3).map(|i| (i, Some(format!("gphash-shard-{i}")))).collect();
            assert_eq!(on, want, "round {round}");
        }
        let threads: Vec<_> = t.workers.get().unwrap().threads.iter().map(|t| t.thread().id()).collect();
        // Shard 1's part of 13 operations panics.
        RAN_ON.lock().unwrap().clear();
        let panicked = std::panic::catch_unwind(AssertUnwindSafe(|| t.on_workers(parts(12), noted)));
        assert!(panicked.is_err(), "the part's panic reaches the caller");
        assert_eq!(RAN_ON.lock().unwrap().len(), 3, "every part ran before the panic came through");
        RAN_ON.lock().unwrap().clear();
        assert!(t.on_workers(parts(30), noted).unwrap().iter().all(|(_, r)| r.is_ok()));
        let kept: Vec<_> = t.workers.get().unwrap().threads.iter().map(|t| t.thread().id()).collect();
        assert_eq!(kept, threads, "the same threads");
        assert_eq!(RAN_ON.lock().unwrap().len(), 3);
        // One part runs on the caller's thread.
        RAN_ON.lock().unwrap().clear();
        t.on_workers(parts(40).into_iter().take(1).collect(), noted).unwrap();
        assert_eq!(*RAN_ON.lock().unwrap(), [(0, std::thread::current().name().map(String::from))]);
        t.close().unwrap();
    }

    #[test]
    fn shards_are_even_and_stable() {
        let mut counts = [0u32; 7];
        for k in 0u64..70_000 {
            counts[ShardedGpHash::shard_of(&k.to_le_bytes(), 7)] += 1;
        }
        assert!(counts.iter().all(|&c| (9_500..10_500).contains(&c)), "{counts:?}");
        assert_eq!(ShardedGpHash::shard_of(b"any key", 1), 0);
        // The route is part of the on-disk format: a key's shard never changes between builds.
        assert_eq!(ShardedGpHash::shard_of(&42u64.to_le_bytes(), 16), 14);
    }

    #[test]
    fn shards_share_the_gpus_evenly() {
        for (shards, gpus) in [(1, 1), (32, 2), (5, 2), (3, 4), (1024, 3)] {
            let on: Vec<usize> = (0..gpus).map(|g| shards_on(g, shards, gpus)).collect();
            assert_eq!(on.iter().sum::<usize>(), shards, "{shards} shards on {gpus} GPUs: {on:?}");
            for (g, &n) in on.iter().enumerate() {
                assert_eq!(n, (0..shards).filter(|i| i % gpus == g).count(), "GPU {g} of {gpus}");
            }
        }
    }

    #[test]
    fn a_shard_has_room_for_its_share() {
        assert_eq!(shard_capacity(0, 4), 1);
        assert_eq!(shard_capacity(1600, 16), 140);
        assert_eq!(shard_capacity(1 << 32, 16), (1 << 28) + (1 << 16));
    }

    #[test]
    fn manifests_are_read_strictly() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read_manifest(dir.path()).unwrap_err().to_string().contains("no readable gphash-shards"));
        let twelve = Manifest { shards: 12, table: Some(0x0123_4567_89ab_cdef) };
        write_manifest(dir.path(), &twelve).unwrap();
        assert_eq!(read_manifest(dir.path()).unwrap(), twelve);
        let again = write_manifest(dir.path(), &Manifest { shards: 3, table: Some(1) }).unwrap_err();
        assert!(again.to_string().contains("publishing"), "{again}");
        assert_eq!(read_manifest(dir.path()).unwrap(), twelve, "an existing manifest is never replaced");
        fs::write(dir.path().join(MANIFEST), "gphash-shards 1\nshards 4\n").unwrap();
        assert_eq!(read_manifest(dir.path()).unwrap(), Manifest { shards: 4, table: None }, "version 1");
        for (text, why) in [
            ("gphash-shards 3\nshards 4\n", "first line"),
            ("gphash-shards 2\nshards 0\ntable 0000000000000001\n", "second line"),
            ("gphash-shards 1\nshards 4096\n", "second line"),
            ("gphash-shards 1\nshards four\n", "second line"),
            ("gphash-shards 1\nshards 4\nmore\n", "more lines"),
            ("gphash-shards 2\nshards 4\n", "third line"),
            ("gphash-shards 2\nshards 4\ntable 12\n", "third line"),
            ("gphash-shards 2\nshards 4\ntable 000000000000000g\n", "third line"),
            ("gphash-shards 2\nshards 4\ntable 000000000000000A\n", "third line"),
            ("gphash-shards 2\nshards 4\ntable +00000000000000a\n", "third line"),
            ("gphash-shards 2\nshards 4\ntable 0000000000000001\nmore\n", "more lines"),
        ] {
            fs::write(dir.path().join(MANIFEST), text).unwrap();
            let e = read_manifest(dir.path()).unwrap_err().to_string();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }
}
