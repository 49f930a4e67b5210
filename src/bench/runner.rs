//! The workload runner: every system of a suite runs every workload at every batch size, in one
//! process, with the memory ceilings measured in the same run. Each result carries operations
//! per second, batch latencies, modelled requests and bytes per operation and the fraction of
//! the ceiling those requests allow.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::batch::Batch;
use crate::bench::ceiling::{Ceilings, Memory};
use crate::bench::system::{DeviceOps, System, Traffic};
use crate::bench::systems::GpHashSystem;
use crate::bench::ycsb::{Distribution, Generator, Op, Workload, batch_of};
use crate::error::{Error, Result};
use crate::gpu::context::Gpu;
use crate::gpu::engine::Placement;
use crate::index::Config;
use crate::protocol::OpKind;

/// A system of a suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SystemKind {
    /// gphash, pool in host memory read and written in place over PCIe.
    ZeroCopy,
    /// gphash on a device copy written back at persist points.
    Staged,
    /// gphash in device memory only, nothing persisted: the upper bound.
    Volatile,
    /// gphash's table with one invocation per operation, no subgroup cooperation.
    Naive,
    /// SlabHash with an undo log (SlabHash-GPM).
    Slab,
    /// A TurboHash-style persistent hash table on the host's threads.
    Cpu,
}

impl SystemKind {
    /// Every system.
    pub const ALL: [SystemKind; 6] = [
        SystemKind::ZeroCopy,
        SystemKind::Staged,
        SystemKind::Volatile,
        SystemKind::Naive,
        SystemKind::Slab,
        SystemKind::Cpu,
    ];

    /// Its name in tables and plots.
    pub fn name(self) -> &'static str {
        match self {
            SystemKind::ZeroCopy => "gphash-zc",
            SystemKind::Staged => "gphash-staged",
            SystemKind::Volatile => "gphash-volatile",
            SystemKind::Naive => "naive",
            SystemKind::Slab => "slab",
            SystemKind::Cpu => "cpu",
        }
    }

    /// The memory its table lives in, whose ceiling it is held to (`None`: host DRAM through
    /// the CPU, not measured).
    pub fn memory(self) -> Option<Memory> {
        match self {
            SystemKind::ZeroCopy | SystemKind::Naive | SystemKind::Slab => Some(Memory::Host),
            SystemKind::Staged | SystemKind::Volatile => Some(Memory::Device),
            SystemKind::Cpu => None,
        }
    }
}

impl std::str::FromStr for SystemKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        SystemKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            Error::InvalidConfig(format!(
                "unknown system {s:?} (one of gphash-zc, gphash-staged, gphash-volatile, naive, slab, cpu)"
            ))
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
    /// Key distribution (`None`: each workload's default).
    pub distribution: Option<Distribution>,
    /// Seed of the workloads.
    pub seed: u64,
    /// Directory of the pools.
    pub pool_dir: PathBuf,
    /// Host threads of the `cpu` system.
    pub cpu_threads: usize,
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
    /// Operations per second.
    pub ops_per_s: f64,
    /// Median batch latency, milliseconds.
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
    /// Device, memory placement and persistence.
    pub setting: String,
}

impl Record {
    /// The heading of the stdout table, aligned with [`Record::line`].
    pub fn heading() -> String {
        format!(
            "{:<16} {:<8} {:>4} {:>8} {:>17}  {:>16}  {:>16}  {:>12} {:>12}  {}",
            "# system",
            "workload",
            "key",
            "batch",
            "throughput",
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
        format!(
            "{:<16} {:<8} {:>3}B {:>8} {:>10.3} Mops/s  p50 {:>9.3} ms  p99 {:>9.3} ms  {:>5.2} req/op {:>7.0} B/op  {ceiling}",
            self.system,
            self.workload,
            self.key_bytes,
            self.batch,
            self.ops_per_s / 1e6,
            self.p50_ms,
            self.p99_ms,
            self.requests_per_op,
            self.bytes_per_op
        )
    }
}

/// A system of the suite, made for one key width.
fn create(
    kind: SystemKind,
    gpu: &Arc<Gpu>,
    dir: &Path,
    key_bytes: u32,
    value_bytes: u32,
    capacity: u64,
    cpu_threads: usize,
) -> Result<Box<dyn System>> {
    let path = dir.join(format!("{}-{key_bytes}.pool", kind.name()));
    let config = Config { key_bytes, value_bytes, capacity, ..Config::default() };
    let gphash = |placement, tile| -> Result<Box<dyn System>> {
        let path = (placement != Placement::Volatile).then_some(path.as_path());
        Ok(Box::new(GpHashSystem::create(
            kind.name(),
            path,
            &config,
            gpu,
            placement,
            tile,
            crate::cache::CacheOptions::off(),
        )?))
    };
    match kind {
        SystemKind::ZeroCopy => gphash(Placement::ZeroCopy, 32),
        SystemKind::Staged => gphash(Placement::Staged, 32),
        SystemKind::Volatile => gphash(Placement::Volatile, 32),
        SystemKind::Naive => gphash(Placement::ZeroCopy, 1),
        SystemKind::Slab => Ok(Box::new(crate::baselines::slab::SlabSystem::create(
            Some(&path),
            key_bytes,
            value_bytes,
            capacity,
            gpu.clone(),
        )?)),
        SystemKind::Cpu => Ok(Box::new(crate::baselines::cpu::CpuSystem::create(
            Some(&path),
            key_bytes,
            value_bytes,
            capacity,
            gpu.clone(),
            cpu_threads,
        )?)),
    }
}

/// The modelled traffic of a batch: reads hit unless they search for absent keys
/// (`negative`); inserts of new keys miss; updates and deletes find their keys.
fn traffic(system: &dyn System, negative: bool, ops: &[Op]) -> Traffic {
    let mut t = Traffic::default();
    for op in ops {
        let hit = match op.kind {
            OpKind::Get => !negative,
            OpKind::Insert => false,
            _ => true,
        };
        let one = system.traffic(op.kind, hit);
        t.requests += one.requests;
        t.bytes += one.bytes;
    }
    t
}

/// What one run measured.
struct Measured {
    transactions: u64,
    latencies: Vec<Duration>,
    traffic: Traffic,
}

/// Runs batches of operations through a system; the upload of each batch is not timed (a
/// GPU-resident application already holds it). Each batch comes with the transactions it
/// holds; `negative` says reads miss.
#[allow(clippy::too_many_arguments)]
fn measure(
    system: &mut dyn System,
    gpu: &Gpu,
    batches: impl Iterator<Item = (Vec<Op>, u64)>,
    negative: bool,
    key_bytes: u32,
    value_bytes: u32,
    seed: u64,
    progress: &dyn Fn(u64),
) -> Result<Measured> {
    let mut m = Measured { transactions: 0, latencies: vec![], traffic: Traffic::default() };
    for (ops, transactions) in batches {
        let b: Batch = batch_of(&ops, key_bytes as usize, value_bytes as usize, seed);
        let device = DeviceOps::new(gpu, &b);
        gpu.wait()?;
        let t = Instant::now();
        system.run(&device.batch())?;
        m.latencies.push(t.elapsed());
        let t = traffic(system, negative, &ops);
        m.traffic.requests += t.requests;
        m.traffic.bytes += t.bytes;
        m.transactions += transactions;
        progress(transactions);
    }
    Ok(m)
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
    let dir = tempfile::tempdir_in(&suite.pool_dir).map_err(|source| Error::Io {
        what: format!("creating a pool directory in {}", suite.pool_dir.display()),
        source,
    })?;
    let inserts: u64 =
        suite.workloads.iter().filter(|w| w.mix().insert > 0.0).map(|w| ops_of(suite, *w)).sum::<u64>()
            * suite.batches.len() as u64;
    for &key_bytes in &suite.key_bytes {
        for &kind in &suite.systems {
            let capacity = suite.records + inserts;
            let mut system =
                create(kind, gpu, dir.path(), key_bytes, suite.value_bytes, capacity, suite.cpu_threads)?;
            let setting = system.setting();
            let mut report = |workload: Workload, batch: usize, m: &Measured| {
                let r = summarize(kind, &setting, workload, key_bytes, suite.value_bytes, batch, m, ceilings);
                record(&r);
                out.push(r);
            };
            let mut load = Generator::new(Workload::Load, None, suite.records, suite.records, suite.seed)?;
            let mut none = vec![];
            let loaded = batches(&mut load, suite.load_batch, &mut none);
            let m = measure(
                &mut *system,
                gpu,
                loaded,
                false,
                key_bytes,
                suite.value_bytes,
                suite.seed,
                progress,
            )?;
            report(Workload::Load, suite.load_batch, &m);
            let mut records = suite.records;
            for &workload in suite.workloads.iter().filter(|w| **w != Workload::Load) {
                for (i, &batch) in suite.batches.iter().enumerate() {
                    let seed = suite.seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    let mut generator =
                        Generator::new(workload, suite.distribution, records, ops_of(suite, workload), seed)?;
                    let mut deleted = vec![];
                    let negative = workload == Workload::NegativeSearch;
                    let ops = batches(&mut generator, batch, &mut deleted);
                    let m = measure(
                        &mut *system,
                        gpu,
                        ops,
                        negative,
                        key_bytes,
                        suite.value_bytes,
                        suite.seed,
                        progress,
                    )?;
                    report(workload, batch, &m);
                    // Inserted keys stay (ids above the records are new each time); deleted
                    // ones go back, untimed, so every run finds the table as loaded.
                    records += m.transactions * (workload.mix().insert > 0.0) as u64;
                    restore(&mut *system, gpu, &deleted, batch, key_bytes, suite.value_bytes, suite.seed)?;
                }
            }
        }
    }
    Ok(out)
}

/// Runs index-microbench trace files (a load file, then a run file) through each system.
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
    let dir = tempfile::tempdir_in(pool_dir).map_err(|source| Error::Io {
        what: format!("creating a pool directory in {}", pool_dir.display()),
        source,
    })?;
    let inserts = run_ops.iter().filter(|o| o.kind == OpKind::Insert).count() as u64;
    let mut out = vec![];
    for &kind in systems {
        let capacity = load.len() as u64 + inserts;
        let mut system = create(kind, gpu, dir.path(), key_bytes, value_bytes, capacity, cpu_threads)?;
        let setting = system.setting();
        for (name, ops) in [("trace-load", load), ("trace-run", run_ops)] {
            let chunks = ops.chunks(batch.max(1)).map(|c| (c.to_vec(), c.len() as u64));
            let m = measure(&mut *system, gpu, chunks, false, key_bytes, value_bytes, 0, progress)?;
            out.push(summarize(kind, &setting, name, key_bytes, value_bytes, batch, &m, ceilings));
        }
    }
    Ok(out)
}

/// Inserts back the keys a delete run removed.
fn restore(
    system: &mut dyn System,
    gpu: &Gpu,
    deleted: &[Op],
    batch: usize,
    key_bytes: u32,
    value_bytes: u32,
    seed: u64,
) -> Result<()> {
    for chunk in deleted.chunks(batch.max(1)) {
        let ops: Vec<Op> = chunk.iter().map(|o| Op { kind: OpKind::Insert, id: o.id }).collect();
        let device = DeviceOps::new(gpu, &batch_of(&ops, key_bytes as usize, value_bytes as usize, seed));
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
    let mut lat = m.latencies.clone();
    lat.sort();
    let at =
        |p: f64| lat.get(((lat.len().max(1) - 1) as f64 * p).round() as usize).copied().unwrap_or_default();
    let seconds: f64 = m.latencies.iter().map(Duration::as_secs_f64).sum();
    let ops = m.transactions.max(1) as f64;
    let ops_per_s = m.transactions as f64 / seconds.max(1e-12);
    let requests_per_op = m.traffic.requests / ops;
    let ceiling = kind
        .memory()
        .and_then(|mem| ceilings.iter().find(|(m, _)| *m == mem))
        .map_or(0.0, |(_, c)| c.requests() / requests_per_op.max(1e-12));
    Record {
        system: kind.name().into(),
        workload: workload.to_string(),
        key_bytes,
        value_bytes,
        batch,
        operations: m.transactions,
        ops_per_s,
        p50_ms: at(0.5).as_secs_f64() * 1e3,
        p99_ms: at(0.99).as_secs_f64() * 1e3,
        requests_per_op,
        bytes_per_op: m.traffic.bytes / ops,
        ceiling_ops_per_s: ceiling,
        ceiling_pct: if ceiling > 0.0 { 100.0 * ops_per_s / ceiling } else { 0.0 },
        setting: setting.into(),
    }
}

/// Writes the records as JSON and CSV files in `dir`.
pub fn write_files(records: &[Record], ceilings: &[(Memory, Ceilings)], dir: &Path) -> Result<()> {
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
    let json = serde_json::json!({ "ceilings": cs, "records": records });
    let path = dir.join("results.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json).expect("records serialize"))
        .map_err(io(format!("writing {}", path.display())))?;
    let mut csv = String::from(
        "system,workload,key_bytes,value_bytes,batch,operations,ops_per_s,p50_ms,p99_ms,requests_per_op,bytes_per_op,ceiling_ops_per_s,ceiling_pct\n",
    );
    for r in records {
        csv += &format!(
            "{},{},{},{},{},{},{:.1},{:.4},{:.4},{:.3},{:.1},{:.1},{:.2}\n",
            r.system,
            r.workload,
            r.key_bytes,
            r.value_bytes,
            r.batch,
            r.operations,
            r.ops_per_s,
            r.p50_ms,
            r.p99_ms,
            r.requests_per_op,
            r.bytes_per_op,
            r.ceiling_ops_per_s,
            r.ceiling_pct
        );
    }
    let path = dir.join("results.csv");
    std::fs::write(&path, csv).map_err(io(format!("writing {}", path.display())))
}
