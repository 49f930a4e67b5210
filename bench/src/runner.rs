//! The workload runner: every system of a suite runs every workload at every batch size, in one
//! process, with the memory ceilings measured in the same run. Each result carries operations
//! per second, batch latencies, modelled requests and bytes per operation and the fraction of
//! the ceiling those requests allow.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

mod host;
mod peer;

pub use peer::{BEST, best_crate};

use crate::answers::Check;
use crate::ceiling::{Ceilings, Memory, RoundTrip};
use crate::systems::cpu::CpuSystem;
use crate::systems::index::GpHashSystem;
use crate::systems::slab::{SlabConfig, SlabOptions, SlabSystem};
use crate::systems::{DeviceOps, System, Traffic, one_at_a_time};
use crate::traces::trace_batch;
use crate::ycsb::{Distribution, Generator, Op, Workload, batch_of};
use gphash::Batch;
use gphash::CacheOptions;
use gphash::Config;
use gphash::DeviceBatch;
use gphash::Gpu;
use gphash::GpuOptions;
use gphash::Placement;
use gphash::{Error, Result};
use gphash::{OpKind, Status};

/// A system of a suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SystemKind {
    /// gphash as designed: pool in host memory read and written in place over PCIe, hot groups
    /// in the bucket cache.
    ZeroCopy,
    /// The same without the cache (ablation).
    NoCache,
    /// gphash on a device copy written back at persist points.
    Staged,
    /// gphash in device memory only, nothing persisted: the upper bound.
    Volatile,
    /// gphash's table with one invocation per operation, no subgroup cooperation (Clevel-GPM
    /// in the paper; also the ablation of cooperation). No cache.
    Naive,
    /// gphash with keys in an array of their own instead of in their buckets (ablation). No cache.
    KeysApart,
    /// SlabHash with an undo log (SlabHash-GPM), zero-copy.
    Slab,
    /// A TurboHash-style persistent hash table on the host's threads.
    Cpu,
    /// gphash called from the host through its public host API (`GpHash::pipeline`: batches
    /// in host memory, results back in host memory), pool and cache as `gphash-zc`.
    Host,
    /// Concurrent hash map crates in host DRAM, used as a CPU program uses them (inline keys
    /// and values, each host thread its own slice of the requests), volatile: scc, papaya and
    /// dashmap each reported, and the best of them.
    CpuMap,
}

impl SystemKind {
    /// Every system.
    pub const ALL: [SystemKind; 10] = [
        SystemKind::ZeroCopy,
        SystemKind::Host,
        SystemKind::NoCache,
        SystemKind::Staged,
        SystemKind::Volatile,
        SystemKind::Naive,
        SystemKind::KeysApart,
        SystemKind::Slab,
        SystemKind::Cpu,
        SystemKind::CpuMap,
    ];

    /// Its name in tables and plots.
    pub fn name(self) -> &'static str {
        match self {
            SystemKind::ZeroCopy => "gphash-zc",
            SystemKind::NoCache => "gphash-nocache",
            SystemKind::Staged => "gphash-staged",
            SystemKind::Volatile => "gphash-volatile",
            SystemKind::Naive => "naive",
            SystemKind::KeysApart => "keys-apart",
            SystemKind::Slab => "slab",
            SystemKind::Cpu => "cpu",
            SystemKind::Host => "gphash-host",
            SystemKind::CpuMap => "cpu-map",
        }
    }

    /// The memory its table lives in, whose ceiling it is held to (`None`: host DRAM through
    /// the CPU, not measured).
    pub fn memory(self) -> Option<Memory> {
        match self {
            SystemKind::Staged | SystemKind::Volatile => Some(Memory::Device),
            SystemKind::Cpu | SystemKind::CpuMap => None,
            _ => Some(Memory::Host),
        }
    }
}

impl std::str::FromStr for SystemKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        SystemKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            let names: Vec<&str> = SystemKind::ALL.iter().map(|k| k.name()).collect();
            Error::InvalidConfig(format!("unknown system {s:?} (one of {})", names.join(", ")))
        })
    }
}

/// What a suite runs.
#[derive(Clone, Debug)]
pub struct Suite {
    /// Workloads, run in this order after LOAD (which always runs first).
    pub workloads: Vec<Workload>,
    /// Systems.
    pub systems: Vec<SystemKind>,
    /// Key widths.
    pub key_bytes: Vec<u32>,
    /// Value size.
    pub value_bytes: u32,
    /// Records loaded.
    pub records: u64,
    /// Operations of a micro workload.
    pub micro_ops: u64,
    /// Operations of a core (macro) workload.
    pub macro_ops: u64,
    /// Batch sizes of every workload.
    pub batches: Vec<usize>,
    /// Batch size of the load.
    pub load_batch: usize,
    /// Key distributions, each workload run under every one (`None`: the workload's default).
    pub distributions: Vec<Option<Distribution>>,
    /// Seed of the workloads.
    pub seed: u64,
    /// Directory of the pools.
    pub pool_dir: PathBuf,
    /// Host threads of the `cpu` and `cpu-map` systems.
    pub cpu_threads: usize,
    /// The bucket cache of `gphash-zc`.
    pub cache: CacheOptions,
    /// Lanes that serve one operation in the gphash systems (`naive` has 1).
    pub tile: u32,
    /// Runs of each workload at each batch size (the table restored in between, untimed); the
    /// record is the median run, with the slowest and fastest rates. The load runs once.
    pub reps: usize,
    /// The gphash systems run each group of uploaded batches through a device pipeline (two in
    /// flight: `GpHash::device_pipeline`); the rate is then the group's operations over the
    /// span from its first submit to its last end.
    pub in_flight: bool,
    /// Leave the gphash systems' pools in a directory of `pool_dir` (for `gphash check`)
    /// instead of removing each after its runs.
    pub keep_pools: bool,
}

/// One measured (system, workload, key width, batch size).
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    /// System name.
    pub system: String,
    /// Workload name.
    pub workload: String,
    /// Key width.
    pub key_bytes: u32,
    /// Value size.
    pub value_bytes: u32,
    /// Operations per batch.
    pub batch: usize,
    /// Operations (YCSB transactions: a read-modify-write counts once).
    pub operations: u64,
    /// Operations per second: the median of the runs.
    pub ops_per_s: f64,
    /// The slowest run's operations per second.
    pub ops_per_s_min: f64,
    /// The fastest run's operations per second.
    pub ops_per_s_max: f64,
    /// Runs measured.
    pub reps: usize,
    /// Median batch latency of the median run, milliseconds.
    pub p50_ms: f64,
    /// 99th-percentile batch latency, milliseconds.
    pub p99_ms: f64,
    /// Modelled memory requests per operation.
    pub requests_per_op: f64,
    /// Modelled bytes per operation.
    pub bytes_per_op: f64,
    /// The operation rate the ceiling allows for those requests (random requests per second
    /// of the table's memory / requests per operation); 0 where not measured.
    pub ceiling_ops_per_s: f64,
    /// `ops_per_s / ceiling_ops_per_s`, in percent (0 where not measured).
    pub ceiling_pct: f64,
    /// Operations whose status was not the one the workload implies (a read of a loaded key
    /// that found nothing, say): 0 unless something is wrong.
    pub unexpected: u64,
    /// Device, memory placement and persistence.
    pub setting: String,
}

impl Record {
    /// The heading of the stdout table, aligned with [`Record::line`].
    pub fn heading() -> String {
        format!(
            "{:<16} {:<8} {:>4} {:>8} {:>17} {:>20}  {:>16}  {:>16}  {:>12} {:>12}  {}",
            "# system",
            "workload",
            "key",
            "batch",
            "throughput",
            "min..max (runs)",
            "median latency",
            "p99 latency",
            "requests",
            "bytes",
            "share of the ceiling (Mops/s)"
        )
    }

    /// One line of the stdout table.
    pub fn line(&self) -> String {
        let ceiling = if self.ceiling_pct > 0.0 {
            format!("{:5.1}% of {:8.2}", self.ceiling_pct, self.ceiling_ops_per_s / 1e6)
        } else {
            " ".repeat(17)
        };
        let unexpected = if self.unexpected > 0 {
            format!("  ({} unexpected statuses!)", self.unexpected)
        } else {
            String::new()
        };
        format!(
            "{:<16} {:<8} {:>3}B {:>8} {:>10.3} Mops/s {:>20}  p50 {:>9.3} ms  p99 {:>9.3} ms  {:>5.2} req/op {:>7.0} B/op  {ceiling}{unexpected}",
            self.system,
            self.workload,
            self.key_bytes,
            self.batch,
            self.ops_per_s / 1e6,
            format!("{:.3}..{:.3} ({})", self.ops_per_s_min / 1e6, self.ops_per_s_max / 1e6, self.reps),
            self.p50_ms,
            self.p99_ms,
            self.requests_per_op,
            self.bytes_per_op
        )
    }
}

/// The settings of the gphash systems that a suite chooses.
#[derive(Clone, Copy, Debug)]
struct Tuning {
    /// The bucket cache of `gphash-zc`.
    cache: CacheOptions,
    /// Lanes per operation (`naive` has 1).
    tile: u32,
}

/// A system of the suite, made for one key width, and the pool file it made.
#[allow(clippy::too_many_arguments)]
fn create(
    kind: SystemKind,
    gpu: &Arc<Gpu>,
    dir: &Path,
    key_bytes: u32,
    value_bytes: u32,
    capacity: u64,
    cpu_threads: usize,
    Tuning { cache, tile }: Tuning,
) -> Result<(Box<dyn System>, Option<PathBuf>)> {
    let path = dir.join(format!("{}-{key_bytes}.pool", kind.name()));
    let gphash = |placement, tile, cache, keys_apart| -> Result<(Box<dyn System>, Option<PathBuf>)> {
        let config = Config { key_bytes, value_bytes, capacity, keys_apart, ..Config::default() };
        let path = (placement != Placement::Volatile).then_some(path.clone());
        let s = GpHashSystem::create(kind.name(), path.as_deref(), &config, gpu, placement, tile, cache)?;
        Ok((Box::new(s), path))
    };
    let off = CacheOptions::off();
    match kind {
        SystemKind::ZeroCopy => gphash(Placement::ZeroCopy, tile, cache, false),
        SystemKind::NoCache => gphash(Placement::ZeroCopy, tile, off, false),
        SystemKind::Staged => gphash(Placement::Staged, tile, off, false),
        SystemKind::Volatile => gphash(Placement::Volatile, tile, off, false),
        SystemKind::Naive => gphash(Placement::ZeroCopy, 1, off, false),
        SystemKind::KeysApart => gphash(Placement::ZeroCopy, tile, off, true),
        SystemKind::Slab => {
            let config = SlabConfig::new(key_bytes, value_bytes, capacity);
            let options = SlabOptions { placement: Placement::ZeroCopy, ..SlabOptions::default() };
            Ok((Box::new(SlabSystem::create_with(Some(&path), &config, gpu.clone(), &options)?), Some(path)))
        }
        SystemKind::Cpu => {
            // It cannot grow, and its 16-bucket probing fills up near load 0.6 with wide keys:
            // sized for `capacity` at load 0.56 rather than 0.75.
            let room = capacity * 4 / 3;
            let s = CpuSystem::create(Some(&path), key_bytes, value_bytes, room, gpu.clone(), cpu_threads)?;
            Ok((Box::new(s), Some(path)))
        }
        SystemKind::Host | SystemKind::CpuMap => {
            Err(Error::InvalidConfig(format!("{}: not a system of device batches", kind.name())))
        }
    }
}

/// The modelled traffic of each kind of operation, computed once per run (a model may scan the
/// table): found (`hit`) or not.
struct TrafficTable([[Traffic; 2]; 5]);

impl TrafficTable {
    /// The traffic `of` gives each kind, found or not.
    fn new(of: impl Fn(OpKind, bool) -> Traffic) -> Self {
        let kinds = [OpKind::Get, OpKind::Insert, OpKind::Upsert, OpKind::Update, OpKind::Delete];
        TrafficTable(kinds.map(|k| [of(k, false), of(k, true)]))
    }

    /// Operations' traffic: reads hit unless they search for absent keys (`negative`); inserts
    /// are of new keys; updates and deletes find their keys.
    fn of_batch(&self, ops: &[Op], negative: bool) -> Traffic {
        ops.iter().fold(Traffic::default(), |t, op| {
            let hit = match op.kind {
                OpKind::Get => !negative,
                OpKind::Insert => false,
                _ => true,
            };
            t.plus(self.0[op.kind as usize - 1][hit as usize])
        })
    }
}

/// How a run's operations run and what they should answer.
#[derive(Clone, Debug)]
struct How {
    /// What every operation should answer (device batches: its status).
    check: Check,
    /// Whether the operations look for keys that are absent (their traffic).
    negative: bool,
    /// Through the system's pipeline ([`System::run_in_flight`]).
    in_flight: bool,
}

/// What one run measured.
#[derive(Clone, Debug)]
struct Measured {
    transactions: u64,
    latencies: Vec<Duration>,
    /// Time spent running the operations (see [`Timed::busy`]).
    busy: Duration,
    traffic: Traffic,
    /// Operations that did not answer as [`How::check`] expects.
    unexpected: u64,
}

/// Device memory for the batches uploaded ahead of a group's runs.
const GROUP_BYTES: usize = 1 << 30;

/// Untimed reads before a group's timed runs: long enough for the GPU to raise its clock.
const WARM_UP: Duration = Duration::from_millis(500);

/// Runs batches of operations through a system. The uploads are not timed (a GPU-resident
/// application already holds its batches): the batches are uploaded a group at a time (up to
/// `GROUP_BYTES` of them), the system reads the first batch's keys for `WARM_UP`, untimed,
/// then the group runs back to back, each batch timed, as such an application runs them; their
/// statuses are checked afterwards, untimed, against `expect`. Making, uploading and checking
/// each batch between the timed ones left the GPU idle most of the time, and the H200 then
/// runs at 345 MHz instead of 1,980, its kernels up to 3x slower than under a steady load
/// (BENCHMARKS.md, "The GPU's clock and the suite"). Each batch comes with the transactions it
/// holds.
fn measure(
    system: &mut dyn System,
    gpu: &Gpu,
    mut batches: impl Iterator<Item = (Vec<Op>, u64)>,
    to_batch: &dyn Fn(&[Op]) -> Batch,
    how: How,
    progress: &dyn Fn(u64),
) -> Result<Measured> {
    let How { check, negative, in_flight } = how;
    let table = TrafficTable::new(|k, hit| system.traffic(k, hit));
    let mut m = Measured {
        transactions: 0,
        latencies: vec![],
        busy: Duration::ZERO,
        traffic: Traffic::default(),
        unexpected: 0,
    };
    // Kept until every batch is timed: wgpu frees a dropped buffer's memory at its next poll,
    // which would be a timed batch's (milliseconds for a batch of 2^22).
    let (mut uploaded, mut warm): (Vec<DeviceOps>, Option<DeviceOps>) = (vec![], None);
    while let Some(head) = batches.next() {
        let first = to_batch(&head.0);
        // Kind, key, value in and out, status.
        let op_bytes = 8 + first.key_bytes() + 2 * first.value_bytes();
        let room = (GROUP_BYTES / (first.len().max(1) * op_bytes)).max(1);
        let group: Vec<(Vec<Op>, u64)> =
            std::iter::once(head).chain(batches.by_ref().take(room - 1)).collect();
        for (i, (ops, _)) in group.iter().enumerate() {
            let batch = if i == 0 { None } else { Some(to_batch(ops)) };
            let batch = batch.as_ref().unwrap_or(&first);
            match uploaded.get_mut(i) {
                Some(d) => d.load(gpu, batch),
                None => uploaded.push(DeviceOps::new(gpu, batch)),
            }
        }
        gpu.wait()?;
        warm_up(system, gpu, &first, &mut warm, in_flight)?;
        let group_batches: Vec<DeviceBatch> = uploaded[..group.len()].iter().map(DeviceOps::batch).collect();
        let timed = if in_flight {
            system.run_in_flight(&group_batches)?
        } else {
            one_at_a_time(system, &group_batches)?
        };
        m.latencies.extend(timed.latencies);
        m.busy += timed.busy;
        for ((ops, transactions), device) in group.iter().zip(&uploaded) {
            m.unexpected += device.unexpected(gpu, ops, &check)?;
            m.traffic = m.traffic.plus(table.of_batch(ops, negative));
            m.transactions += transactions;
            progress(*transactions);
        }
    }
    Ok(m)
}

/// Runs reads of the keys of `batch` through `system`, untimed, for `WARM_UP`, from the buffers
/// kept in `warm`.
/// In flight, the reads go through the system's pipeline, so that both of its slots hold
/// buffers for the batch's size before the timing (a slot's first batch of a larger size
/// makes them).
fn warm_up(
    system: &mut dyn System,
    gpu: &Gpu,
    batch: &Batch,
    warm: &mut Option<DeviceOps>,
    in_flight: bool,
) -> Result<()> {
    let mut reads = Batch::new(batch.key_bytes(), batch.value_bytes());
    for i in 0..batch.len() {
        reads.get(batch.op(i).1)?;
    }
    let device = DeviceOps::reuse(warm, gpu, &reads);
    let started = Instant::now();
    while started.elapsed() < WARM_UP {
        if in_flight {
            system.run_in_flight(&[device.batch(), device.batch()])?;
        } else {
            one_at_a_time(system, &[device.batch()])?;
        }
    }
    Ok(gpu.wait()?)
}

/// A generator's batches with the transactions each holds; the delete operations are kept in
/// `deleted` (to restore them after the run).
fn batches<'a>(
    g: &'a mut Generator,
    size: usize,
    deleted: &'a mut Vec<Op>,
) -> impl Iterator<Item = (Vec<Op>, u64)> + 'a {
    std::iter::from_fn(move || {
        let before = g.produced();
        let ops = g.next_batch(size);
        if ops.is_empty() {
            return None;
        }
        deleted.extend(ops.iter().filter(|o| o.kind == OpKind::Delete).copied());
        Some((ops, g.produced() - before))
    })
}

/// Inserts new keys of every run of the suite: the table is sized for the loaded records and
/// the largest of these (with room to spare), so that no run makes a table grow.
fn largest_insert_run(suite: &Suite) -> u64 {
    let inserts = |w: &Workload| (ops_of(suite, *w) as f64 * w.mix().insert * 1.1) as u64;
    suite.workloads.iter().map(inserts).max().unwrap_or(0)
}

/// One system of a suite as the suite drives it: how it runs a stream of operations and puts
/// the table back as it was loaded.
trait Driven {
    /// Its name in the records.
    fn name(&self) -> String;
    /// Device, memory placement and persistence, for the report.
    fn setting(&self) -> String;
    /// Runs the operations of `stream`, timed, and checks their answers after them, untimed.
    fn measure(&mut self, stream: Stream<'_>, how: How) -> Result<Measured>;
    /// Applies `undo` (untimed): inserts of deleted keys with their loaded values, deletes
    /// of inserted ones.
    fn restore(&mut self, undo: &[Op]) -> Result<()>;
}

/// The operations of one run: a generator's, cut into batches of `batch`, with the values
/// of `seed`; the deletes it made are kept in `deleted`.
struct Stream<'a> {
    generator: &'a mut Generator,
    batch: usize,
    seed: u64,
    deleted: &'a mut Vec<Op>,
}

impl Stream<'_> {
    /// Its batches with the transactions each holds.
    fn batches(self) -> impl Iterator<Item = (Vec<Op>, u64)> {
        batches(self.generator, self.batch, self.deleted)
    }
}

/// Hears of a system's runs of a workload: the system's name, the workload's, the batch size,
/// the runs and the system's setting.
type Report<'a> = dyn FnMut(&str, &str, usize, &[Measured], &str) + 'a;

/// The load, then every workload under every distribution at each of `sizes`, `reps` times
/// each (the table restored in between, untimed); `report` hears of each (workload, batch
/// size) with its runs.
fn drive(suite: &Suite, system: &mut dyn Driven, sizes: &[usize], report: &mut Report<'_>) -> Result<()> {
    let (records, vb) = (suite.records, suite.value_bytes as usize);
    let mut check =
        Check { expect: Status::Ok, records, seeds: vec![suite.seed], value_bytes: vb, inserts_race: false };
    let mut load = Generator::new(Workload::Load, None, records, records, suite.seed)?;
    let mut none = vec![];
    let stream =
        Stream { generator: &mut load, batch: suite.load_batch, seed: suite.seed, deleted: &mut none };
    let how = How { check: check.clone(), negative: false, in_flight: suite.in_flight };
    let m = system.measure(stream, how)?;
    report(&system.name(), "load", suite.load_batch, &[m], &system.setting());
    let runs_of = suite.workloads.iter().filter(|w| **w != Workload::Load);
    for (&workload, &distribution) in runs_of.flat_map(|w| suite.distributions.iter().map(move |d| (w, d))) {
        // The same operations at every batch size; updates write values of their own.
        let seed = suite.seed ^ crate::ycsb::fnv64(workload as u64 + 1);
        if !check.seeds.contains(&seed) {
            check.seeds.push(seed);
        }
        let negative = workload == Workload::NegativeSearch;
        check.expect = if negative { Status::NotFound } else { Status::Ok };
        let name = run_name(workload, distribution, suite.distributions.len());
        for &batch in sizes {
            let mut runs = vec![];
            for _ in 0..suite.reps.max(1) {
                let mut g = Generator::new(workload, distribution, records, ops_of(suite, workload), seed)?;
                let mut deleted = vec![];
                let stream = Stream { generator: &mut g, batch, seed, deleted: &mut deleted };
                let how = How { check: check.clone(), negative, in_flight: suite.in_flight };
                runs.push(system.measure(stream, how)?);
                // Untimed: deleted keys come back and inserted ones go, so every run finds the
                // table as loaded.
                let mut undo: Vec<Op> =
                    deleted.iter().map(|o| Op { kind: OpKind::Insert, id: o.id }).collect();
                undo.extend((records..records + g.inserted()).map(|id| Op { kind: OpKind::Delete, id }));
                system.restore(&undo)?;
            }
            report(&system.name(), &name, batch, &runs, &system.setting());
        }
    }
    Ok(())
}

/// A system of device batches ([`System`]) as the suite drives it.
struct OnDevice<'a> {
    system: &'a mut dyn System,
    gpu: &'a Gpu,
    suite: &'a Suite,
    key_bytes: usize,
    progress: &'a dyn Fn(u64),
}

impl Driven for OnDevice<'_> {
    fn name(&self) -> String {
        self.system.name()
    }

    fn setting(&self) -> String {
        self.system.setting()
    }

    fn measure(&mut self, stream: Stream<'_>, how: How) -> Result<Measured> {
        let (kb, vb, seed) = (self.key_bytes, self.suite.value_bytes as usize, stream.seed);
        let to_batch = |ops: &[Op]| batch_of(ops, kb, vb, seed);
        measure(&mut *self.system, self.gpu, stream.batches(), &to_batch, how, self.progress)
    }

    fn restore(&mut self, undo: &[Op]) -> Result<()> {
        let (kb, vb) = (self.key_bytes, self.suite.value_bytes as usize);
        restore(&mut *self.system, self.gpu, undo, self.suite.load_batch, kb, vb, self.suite.seed)
    }
}

/// The name of a workload's records run under `distribution`, one of `distributions`: the
/// distribution is named where there are several.
pub fn run_name(workload: Workload, distribution: Option<Distribution>, distributions: usize) -> String {
    match distribution {
        Some(d) if distributions > 1 => format!("{workload} {d}"),
        _ => workload.to_string(),
    }
}

/// Runs a suite; `ceilings` are those measured in the same run; `progress` hears of every
/// batch's operations; `record` of every result as it is made.
pub fn run(
    suite: &Suite,
    gpu: &Arc<Gpu>,
    ceilings: &[(Memory, Ceilings)],
    progress: &dyn Fn(u64),
    record: &mut dyn FnMut(&Record),
) -> Result<Vec<Record>> {
    let mut out = vec![];
    let dir = crate::basic::pool_dir(&suite.pool_dir)?;
    let capacity = suite.records + largest_insert_run(suite) + 1024;
    let vb = suite.value_bytes;
    let tuning = Tuning { cache: suite.cache, tile: suite.tile };
    for &key_bytes in &suite.key_bytes {
        for &kind in &suite.systems {
            let mut report =
                |system: &str, workload: &str, batch: usize, runs: &[Measured], setting: &str| {
                    let mut rs: Vec<Record> = runs
                        .iter()
                        .map(|m| summarize(kind, setting, workload, key_bytes, vb, batch, m, ceilings))
                        .collect();
                    let mut r = median_run(&mut rs);
                    r.system = system.to_string();
                    record(&r);
                    out.push(r);
                };
            match kind {
                SystemKind::CpuMap => {
                    peer::run(suite, key_bytes, capacity, progress, &mut report)?;
                    continue;
                }
                SystemKind::Host => {
                    host::run(suite, gpu, dir.path(), key_bytes, capacity, progress, &mut report)?;
                    continue;
                }
                _ => {}
            }
            let (mut system, pool) =
                create(kind, gpu, dir.path(), key_bytes, vb, capacity, suite.cpu_threads, tuning)?;
            let mut on_device =
                OnDevice { system: &mut *system, gpu, suite, key_bytes: key_bytes as usize, progress };
            drive(suite, &mut on_device, &suite.batches, &mut report)?;
            // A kept pool is closed cleanly, as a user's would be.
            system.close()?;
            if let Some(p) = pool.filter(|_| !suite.keep_pools) {
                // Pools are large: each goes before the next system makes its own.
                std::fs::remove_file(&p)
                    .map_err(|source| Error::Io { what: format!("removing {}", p.display()), source })?;
            }
        }
    }
    if suite.keep_pools {
        println!("# pools kept in {}", dir.keep().display());
    }
    Ok(out)
}

/// Runs index-microbench trace files (a load file, then a run file) through each system, keys
/// as [`trace_batch`] maps them.
#[allow(clippy::too_many_arguments)]
pub fn run_traces(
    systems: &[SystemKind],
    gpu: &Arc<Gpu>,
    (load, run_ops): (&[Op], &[Op]),
    batch: usize,
    key_bytes: u32,
    value_bytes: u32,
    pool_dir: &Path,
    cpu_threads: usize,
    ceilings: &[(Memory, Ceilings)],
    progress: &dyn Fn(u64),
) -> Result<Vec<Record>> {
    let dir = crate::basic::pool_dir(pool_dir)?;
    let inserts = run_ops.iter().filter(|o| o.kind == OpKind::Insert).count() as u64;
    let mut out = vec![];
    let to_batch = |ops: &[Op]| trace_batch(ops, key_bytes as usize, value_bytes as usize, 0);
    // A trace's reads may miss: statuses are not checked.
    let unchecked = Check {
        expect: Status::Ok,
        records: 0,
        seeds: vec![],
        value_bytes: value_bytes as usize,
        inserts_race: false,
    };
    for &kind in systems {
        let capacity = load.len() as u64 + inserts;
        let tuning = Tuning { cache: CacheOptions::default(), tile: GpuOptions::default().tile };
        let (mut system, pool) =
            create(kind, gpu, dir.path(), key_bytes, value_bytes, capacity, cpu_threads, tuning)?;
        let setting = system.setting();
        for (name, ops) in [("trace-load", load), ("trace-run", run_ops)] {
            let chunks = ops.chunks(batch.max(1)).map(|c| (c.to_vec(), c.len() as u64));
            let m = measure(
                &mut *system,
                gpu,
                chunks,
                &to_batch,
                How { check: unchecked.clone(), negative: false, in_flight: false },
                progress,
            )?;
            let m = Measured { unexpected: 0, ..m };
            out.push(summarize(kind, &setting, name, key_bytes, value_bytes, batch, &m, ceilings));
        }
        drop(system);
        if let Some(p) = pool {
            let _ = std::fs::remove_file(p);
        }
    }
    Ok(out)
}

/// Applies `ops` (untimed) in batches of `batch`.
fn restore(
    system: &mut dyn System,
    gpu: &Gpu,
    ops: &[Op],
    batch: usize,
    key_bytes: usize,
    value_bytes: usize,
    seed: u64,
) -> Result<()> {
    let mut kept: Option<DeviceOps> = None;
    for chunk in ops.chunks(batch.max(1)) {
        let device = DeviceOps::reuse(&mut kept, gpu, &batch_of(chunk, key_bytes, value_bytes, seed));
        system.run(&device.batch())?;
    }
    Ok(())
}

fn ops_of(suite: &Suite, w: Workload) -> u64 {
    match w {
        Workload::A | Workload::B | Workload::C | Workload::D | Workload::F => suite.macro_ops,
        Workload::Delete => suite.micro_ops.min(suite.records),
        _ => suite.micro_ops,
    }
}

/// The `q` quantile (0 to 1) of batch latencies, in milliseconds (0 without any).
pub fn quantile_ms(latencies: &[Duration], q: f64) -> f64 {
    let mut ms: Vec<f64> = latencies.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    ms.get(((ms.len().max(1) - 1) as f64 * q).round() as usize).copied().unwrap_or_default()
}

#[allow(clippy::too_many_arguments)]
fn summarize(
    kind: SystemKind,
    setting: &str,
    workload: impl std::fmt::Display,
    key_bytes: u32,
    value_bytes: u32,
    batch: usize,
    m: &Measured,
    ceilings: &[(Memory, Ceilings)],
) -> Record {
    let seconds = m.busy.as_secs_f64();
    let ops = m.transactions.max(1) as f64;
    let ops_per_s = m.transactions as f64 / seconds.max(1e-12);
    let requests_per_op = m.traffic.requests() / ops;
    let per_op = m.traffic.times(1.0 / ops);
    let ceiling = kind
        .memory()
        .and_then(|mem| ceilings.iter().find(|(m, _)| *m == mem))
        .map_or(0.0, |(_, c)| c.op_rate(&per_op));
    Record {
        system: kind.name().into(),
        workload: workload.to_string(),
        key_bytes,
        value_bytes,
        batch,
        operations: m.transactions,
        ops_per_s,
        ops_per_s_min: ops_per_s,
        ops_per_s_max: ops_per_s,
        reps: 1,
        p50_ms: quantile_ms(&m.latencies, 0.5),
        p99_ms: quantile_ms(&m.latencies, 0.99),
        requests_per_op,
        bytes_per_op: m.traffic.bytes / ops,
        ceiling_ops_per_s: ceiling,
        ceiling_pct: if ceiling > 0.0 { 100.0 * ops_per_s / ceiling } else { 0.0 },
        unexpected: m.unexpected,
        setting: setting.into(),
    }
}

/// The record of the median run of `runs` (by rate; the lower middle of an even count), with
/// the slowest and fastest rates and every run's unexpected statuses.
fn median_run(runs: &mut [Record]) -> Record {
    runs.sort_by(|a, b| a.ops_per_s.total_cmp(&b.ops_per_s));
    let mut r = runs[(runs.len() - 1) / 2].clone();
    r.ops_per_s_min = runs[0].ops_per_s;
    r.ops_per_s_max = runs[runs.len() - 1].ops_per_s;
    r.reps = runs.len();
    r.unexpected = runs.iter().map(|x| x.unexpected).sum();
    r
}

/// Writes the records as JSON and CSV files in `dir`, the JSON with the ceilings and round
/// trips measured in the same run.
pub fn write_files(
    records: &[Record],
    ceilings: &[(Memory, Ceilings)],
    round_trips: &[RoundTrip],
    dir: &Path,
) -> Result<()> {
    let io = |what: String| move |source| Error::Io { what, source };
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    #[derive(Serialize)]
    struct Ceiling<'a> {
        memory: String,
        seq_read_bytes_per_s: f64,
        seq_write_bytes_per_s: f64,
        random_read_requests_per_s: &'a [f64; 3],
        random_write_requests_per_s: f64,
        cas_per_s: f64,
    }
    let cs: Vec<Ceiling> = ceilings
        .iter()
        .map(|(m, c)| Ceiling {
            memory: m.to_string(),
            seq_read_bytes_per_s: c.seq_read,
            seq_write_bytes_per_s: c.seq_write,
            random_read_requests_per_s: &c.random_read,
            random_write_requests_per_s: c.random_write,
            cas_per_s: c.cas,
        })
        .collect();
    #[derive(Serialize)]
    struct Trip {
        via: String,
        items: u64,
        reps: usize,
        median_s: f64,
        min_s: f64,
        max_s: f64,
    }
    let trips: Vec<Trip> = round_trips
        .iter()
        .map(|t| Trip {
            via: t.via.to_string(),
            items: t.items,
            reps: t.reps,
            median_s: t.median.as_secs_f64(),
            min_s: t.min.as_secs_f64(),
            max_s: t.max.as_secs_f64(),
        })
        .collect();
    let json = serde_json::json!({ "ceilings": cs, "round_trip": trips, "records": records });
    let path = dir.join("results.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json).expect("records serialize"))
        .map_err(io(format!("writing {}", path.display())))?;
    let mut csv = String::from(
        "system,workload,key_bytes,value_bytes,batch,operations,ops_per_s,ops_per_s_min,ops_per_s_max,reps,p50_ms,p99_ms,requests_per_op,bytes_per_op,ceiling_ops_per_s,ceiling_pct,unexpected\n",
    );
    for r in records {
        csv += &format!(
            "{},{},{},{},{},{},{:.1},{:.1},{:.1},{},{:.4},{:.4},{:.3},{:.1},{:.1},{:.2},{}\n",
            r.system,
            r.workload,
            r.key_bytes,
            r.value_bytes,
            r.batch,
            r.operations,
            r.ops_per_s,
            r.ops_per_s_min,
            r.ops_per_s_max,
            r.reps,
            r.p50_ms,
            r.p99_ms,
            r.requests_per_op,
            r.bytes_per_op,
            r.ceiling_ops_per_s,
            r.ceiling_pct,
            r.unexpected
        );
    }
    let path = dir.join("results.csv");
    std::fs::write(&path, csv).map_err(io(format!("writing {}", path.display())))
}
