//! `gphash bench ...`: the benchmarks of `gphash_bench`, with their knobs.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use gphash::{Layout, Options, Placement};
use gphash_bench::bktcache::{self, CacheBench};
use gphash_bench::ceiling::{self, Method};
use gphash_bench::profile::ProfileBench;
use gphash_bench::reach;
use gphash_bench::runner::{self, Suite, SystemKind};
use gphash_bench::sharded::ShardedLoad;
use gphash_bench::ycsb::{Distribution, Workload};
use gphash_bench::{Fill, LoadSearch, PersistCost, ResizeRecovery};
use gphash_bench::{plots, traces};
use host_pm::PersistMode;

use crate::progress;
use crate::runs::{PoolDir, RunArgs, measure_ceilings, threads};

/// Benchmarks.
#[derive(Subcommand, Clone)]
pub(crate) enum Bench {
    /// Insert and search throughput per placement.
    LoadSearch(LoadSearchArgs),
    /// The load factor at which each layout first finds no slot for an insertion.
    Fill(FillArgs),
    /// Time to grow a loaded table by one level and to recover it after a crash.
    Resize(ResizeArgs),
    /// Cost of the persist steps per batch on the pools given.
    Persist(PersistArgs),
    /// Memory ceilings of the device: sequential bandwidth and random request rates, in device
    /// memory and in host memory imported zero-copy; and the latency floor of a batch, the bare
    /// wgpu round trip (write, one dispatch, read back) of 4096 to 2^20 words.
    Ceilings(CeilingArgs),
    /// How kernels reach host memory larger than one storage binding: random 128-byte requests
    /// over a region imported zero-copy, through a binding per window, a binding array of
    /// windows, and the region's buffer device address (a SPIR-V kernel passed through), against
    /// the same requests over one window; each way's reads checked against a model.
    Reach(ReachArgs),
    /// YCSB core and micro workloads against gphash and the baselines, with the ceilings of the
    /// same run: a table on stdout, JSON, CSV and SVG plots.
    Suite(SuiteArgs),
    /// gphash against the best CPU map used plainly, in three regimes: G (the caller's batches
    /// on the GPU), H (the caller on the host, through the host API), P (the table past its
    /// cache); a Markdown table per regime, JSON and CSV.
    Scoreboard(crate::scoreboard::ScoreboardArgs),
    /// Index-microbench trace files (a load file and a run file) against the systems.
    Trace(TraceArgs),
    /// The bucket cache: throughput per cache ratio (YCSB A, B, C), under skew, per policy,
    /// and over time across loading phases; a table, JSON, CSV and SVG plots.
    Cache(CacheArgs),
    /// Where a batch's time goes, stage by stage (host encoding, ordering, buffer writes,
    /// submits, waits, readbacks, decoding, persists) and kernel by kernel on the GPU (where it
    /// has timestamp queries), for search and insert batches of each size: medians of several
    /// repetitions, with min and max, and each size's wall time over the bare wgpu round trip.
    Profile(ProfileArgs),
    /// A table of several shards, each a pool of its own, spread over the host's identical GPUs:
    /// loaded (shards grow, mostly one a batch, past `--capacity`), a sample searched with its
    /// values checked, every shard checked, closed and reopened. For tables of more keys than
    /// one table holds (2^32 slots).
    Sharded(ShardedArgs),
}

/// `bench sharded` settings.
#[derive(Args, Clone)]
pub(crate) struct ShardedArgs {
    /// Keys inserted.
    #[arg(long, default_value_t = 1 << 24)]
    keys: u64,
    /// Keys the table is made for (default: `--keys`, so no shard grows).
    #[arg(long)]
    capacity: Option<u64>,
    /// Shards.
    #[arg(long, default_value_t = 16)]
    shards: usize,
    /// Operations per batch.
    #[arg(long, default_value_t = 1 << 20, value_parser = at_least_one)]
    batch: usize,
    /// Key width in bytes.
    #[arg(long, default_value_t = 8)]
    key_bytes: u32,
    /// Value size in bytes.
    #[arg(long, default_value_t = 8)]
    value_bytes: u32,
    /// Loaded keys searched afterwards, drawn at random, their values checked.
    #[arg(long, default_value_t = 1 << 24)]
    searches: u64,
    /// The table's directory, kept after the run (default: a temporary one in --pool-dir).
    #[arg(long)]
    table: Option<PathBuf>,
    /// Open the table in --table, made and loaded by an earlier run with the same --keys and
    /// widths, instead of making and loading one.
    #[arg(long, requires = "table")]
    existing: bool,
    /// With --existing: first load the keys from this one up to --keys (the rest of a load
    /// that was cut short).
    #[arg(long, requires = "existing")]
    load_from: Option<u64>,
    /// Skip the consistency check of every shard.
    #[arg(long)]
    no_check: bool,
    #[command(flatten)]
    dir: PoolDir,
}

/// A count of at least one (a batch of none would never end a load).
fn at_least_one(arg: &str) -> Result<usize, String> {
    match arg.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// `bench profile` settings.
#[derive(Args, Clone)]
pub(crate) struct ProfileArgs {
    /// Keys loaded before the measured batches.
    #[arg(long, default_value_t = 1 << 20)]
    keys: u64,
    /// Operations per batch, one table each.
    #[arg(long, value_delimiter = ',', default_value = "4096,65536,1048576")]
    batches: Vec<usize>,
    /// Repetitions of each measurement.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Batches in one repetition.
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Key width in bytes.
    #[arg(long, default_value_t = 8)]
    key_bytes: u32,
    /// Value size in bytes (8 or 128 in the figures).
    #[arg(long, default_value_t = 8)]
    value_bytes: u32,
    /// Seed of the searched keys.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Repetitions of the bare wgpu round trip measured at each batch size (the floor a
    /// batch's wall time is held to).
    #[arg(long, default_value_t = ceiling::ROUND_TRIP_REPS)]
    floor_reps: usize,
    /// Run the batches through a pipeline (two in flight: the host prepares and decodes one
    /// batch while the GPU runs the other) instead of one call at a time; with --device, a
    /// pipeline of device batches.
    #[arg(long)]
    pipeline: bool,
    /// Load the bucket cache whole after the keys (a loading phase), so that the batches
    /// measure a loaded cache (set --cache-period high to keep later phases out).
    #[arg(long)]
    load_cache: bool,
    /// Run the batches as device batches (`execute_device`): inputs uploaded to device
    /// buffers before the timing, results left there.
    #[arg(long)]
    device: bool,
    /// A volatile table in device memory, nothing persisted (the upper bound; in place of
    /// --placement).
    #[arg(long)]
    volatile: bool,
    /// Instead of the stages: per repetition, this many pairs of a bare round trip and one
    /// batch (of gets, then of inserts; kernels untimed), timed in turn after half a second of
    /// them untimed; each repetition's median batch over its median round trip.
    #[arg(long, default_value_t = 0, conflicts_with = "pipeline")]
    alternate: usize,
    #[command(flatten)]
    dir: PoolDir,
}

/// `bench cache` settings.
#[derive(Args, Clone)]
pub(crate) struct CacheArgs {
    /// Records loaded.
    #[arg(long, default_value_t = 1 << 24)]
    records: u64,
    /// Measured operations of each repetition of a point.
    #[arg(long, default_value_t = 1 << 22)]
    ops: u64,
    /// Repetitions of each point (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Operations whose accesses the policy counts before each point's cache is loaded.
    #[arg(long, default_value_t = 1 << 22)]
    warmup: u64,
    /// Operations per batch.
    #[arg(long, default_value_t = 1 << 16)]
    batch: usize,
    /// Key width in bytes.
    #[arg(long, default_value_t = 8)]
    key_bytes: u32,
    /// Value size in bytes.
    #[arg(long, default_value_t = 128)]
    value_bytes: u32,
    /// Workloads of the ratio figure.
    #[arg(long, value_delimiter = ',', default_value = "a,b,c")]
    workloads: Vec<Workload>,
    /// Cache ratios of the ratio figure.
    #[arg(long, value_delimiter = ',', default_value = "0,0.1,0.2,0.4")]
    ratios: Vec<f64>,
    /// Zipfian constants of the skew figure (YCSB C, no cache and --ratio).
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.7,0.9,0.99,1.1,1.2")]
    thetas: Vec<f64>,
    /// Policies compared (YCSB A and C at --ratio).
    #[arg(long, value_delimiter = ',', default_value = "lfu,lru,random")]
    policies: Vec<gphash::Policy>,
    /// Cache ratio of the skew, policy and timeline figures.
    #[arg(long, default_value_t = 0.2)]
    ratio: f64,
    /// Operations of the timeline (0: none).
    #[arg(long, default_value_t = 1 << 25)]
    timeline_ops: u64,
    /// Operations between loading phases in the timeline.
    #[arg(long, default_value_t = 1 << 23)]
    period: u64,
    /// Seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Directory for cache.json, cache.csv, cache-timeline.csv and the plots.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
    #[command(flatten)]
    dir: PoolDir,
}

/// `bench suite` settings.
#[derive(Args, Clone)]
pub(crate) struct SuiteArgs {
    /// Workloads (load runs first in any case): a, b, c, d, f, search+, search-, insert, update, delete.
    #[arg(long, value_delimiter = ',', default_value = "c,b,a,f,d,search+,search-,update,insert,delete")]
    workloads: Vec<Workload>,
    /// Systems: gphash-zc (with its cache, set by --cache-*), gphash-host (the same called
    /// through the host API), gphash-nocache, gphash-staged, gphash-volatile, naive,
    /// keys-apart, slab, cpu, cpu-map (scc, papaya and dashmap used plainly, each reported, and
    /// the best of them).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "gphash-zc,gphash-nocache,gphash-staged,gphash-volatile,naive,keys-apart,slab,cpu,cpu-map"
    )]
    systems: Vec<SystemKind>,
    /// Key widths in bytes.
    #[arg(long, value_delimiter = ',', default_value = "8,32")]
    key_bytes: Vec<u32>,
    /// Value size in bytes.
    #[arg(long, default_value_t = 128)]
    value_bytes: u32,
    /// Records loaded.
    #[arg(long, default_value_t = 1 << 24)]
    records: u64,
    /// Operations of each micro workload.
    #[arg(long, default_value_t = 1 << 24)]
    micro_ops: u64,
    /// Operations of each core workload.
    #[arg(long, default_value_t = 1 << 26)]
    macro_ops: u64,
    /// Batch sizes (`sweep`: every power of two from 2^8 to 2^20).
    #[arg(long, default_value = "4096,65536")]
    batches: String,
    /// Batch size of the load.
    #[arg(long, default_value_t = 1 << 16)]
    load_batch: usize,
    /// Key distributions instead of each workload's default (zipf:0.99, uniform, latest):
    /// every workload runs under each one given.
    #[arg(long, value_delimiter = ',')]
    distribution: Vec<Distribution>,
    /// Keep the gphash systems' pools (closed) in a directory of --pool-dir, for `gphash check`.
    #[arg(long)]
    keep_pools: bool,
    /// Run the gphash systems' batches two in flight (a device pipeline), as an application
    /// that keeps the GPU busy would; the rate is then operations over the span of the batches.
    #[arg(long)]
    in_flight: bool,
    #[command(flatten)]
    run: RunArgs,
    /// Directory for results.json, results.csv and the plots.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
    #[command(flatten)]
    dir: PoolDir,
}

/// `bench trace` settings.
#[derive(Args, Clone)]
pub(crate) struct TraceArgs {
    /// Load file (INSERT lines).
    #[arg(long)]
    load: PathBuf,
    /// Run file (READ, INSERT, UPDATE, DELETE lines).
    #[arg(long)]
    run: PathBuf,
    /// Systems.
    #[arg(long, value_delimiter = ',', default_value = "gphash-zc,slab,cpu")]
    systems: Vec<SystemKind>,
    /// Key width in bytes.
    #[arg(long, default_value_t = 8)]
    key_bytes: u32,
    /// Value size in bytes.
    #[arg(long, default_value_t = 128)]
    value_bytes: u32,
    /// Operations per batch.
    #[arg(long, default_value_t = 1 << 16)]
    batch: usize,
    #[command(flatten)]
    dir: PoolDir,
}

/// `bench ceilings` settings.
#[derive(Args, Clone)]
pub(crate) struct CeilingArgs {
    /// Buffer size in MiB (capped by the device's binding limit; 0: memory ceilings not measured).
    #[arg(long, default_value_t = 1024)]
    mib: u64,
    /// Repetitions of each memory ceiling (the median is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Items (32-bit words) of the bare round trips measured (through wgpu and through Vulkan itself): write, one dispatch, read.
    #[arg(long, value_delimiter = ',', default_value = "4096,65536,1048576")]
    round_trip_items: Vec<u64>,
    /// Repetitions of each round trip (median, min and max are reported; 0: none measured).
    #[arg(long, default_value_t = ceiling::ROUND_TRIP_REPS)]
    round_trip_reps: usize,
}

/// `bench reach` settings.
#[derive(Args, Clone)]
pub(crate) struct ReachArgs {
    /// Bytes of host memory the requests spread over, in MiB.
    #[arg(long, default_value_t = 16 << 10)]
    mib: u64,
    /// Bytes of a window, in MiB (a power of two under the device's binding size: on the H200,
    /// whose bindings stop 4 bytes short of 2 GiB, 1024, the engine's windows there).
    #[arg(long, default_value_t = 1024)]
    window_mib: u64,
    /// Repetitions of each way (median, min and max are reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Ask for the host memory in transparent huge pages (2 MiB on x86-64).
    #[arg(long)]
    huge_pages: bool,
}

/// `bench load-search` settings.
#[derive(Args, Clone)]
pub(crate) struct LoadSearchArgs {
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
    /// Placements to compare (zero-copy, staged).
    #[arg(long, value_delimiter = ',', default_value = "zero-copy,staged")]
    placements: Vec<String>,
    /// The heap's arenas, as log2, 0 to 5 (default: as the table needs, one up to 2^32 - 4
    /// slots): to measure what several cost a table that does not need them.
    #[arg(long)]
    arena_bits: Option<u32>,
    #[command(flatten)]
    dir: PoolDir,
}

/// `bench fill` settings.
#[derive(Args, Clone)]
pub(crate) struct FillArgs {
    /// Layouts measured.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "2L-2H-8S,2L-2H-4S,2L-2H-16S,3L-2H-8S,4L-2H-8S,2L-3H-8S,1L-2H-8S"
    )]
    layouts: Vec<Layout>,
    /// About how many slots each table has.
    #[arg(long, default_value_t = 1 << 20)]
    slots: u64,
    /// Insertions per batch (the figure's resolution).
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    #[command(flatten)]
    dir: PoolDir,
}

/// `bench resize` settings.
#[derive(Args, Clone)]
pub(crate) struct ResizeArgs {
    /// Keys loaded before the resize.
    #[arg(long, default_value_t = 1 << 24)]
    keys: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 8)]
    value_bytes: u32,
    #[command(flatten)]
    dir: PoolDir,
}

/// `bench persist` settings.
#[derive(Args, Clone)]
pub(crate) struct PersistArgs {
    /// Keys loaded first.
    #[arg(long, default_value_t = 1 << 22)]
    keys: u64,
    /// Upserts measured.
    #[arg(long, default_value_t = 1 << 22)]
    updates: u64,
    /// Operations per batch.
    #[arg(long, default_value_t = 1 << 16)]
    batch: usize,
    /// Pool directories to compare; `DIR:clwb` forces cache-line flushes there (what
    /// persistent memory would cost), `DIR:msync` forces msync.
    #[arg(long, value_delimiter = ',', default_value = "/dev/shm,/dev/shm:clwb,/var/tmp")]
    pools: Vec<String>,
}

pub(crate) fn run(bench: &Bench, options: &Options) -> gphash::Result<()> {
    match bench {
        Bench::Suite(a) => suite(a, options),
        Bench::Scoreboard(a) => crate::scoreboard::run(a, options),
        Bench::Cache(a) => cache(a),
        Bench::Trace(a) => {
            let gpu = gphash::Gpu::new()?;
            let (load, run) = (traces::read_trace(&a.load)?, traces::read_trace(&a.run)?);
            let bar = progress((load.len() + run.len()) as u64 * a.systems.len() as u64, "trace");
            let records = runner::run_traces(
                &a.systems,
                &gpu,
                (&load, &run),
                a.batch,
                a.key_bytes,
                a.value_bytes,
                &a.dir.pool_dir,
                threads(None),
                &[],
                &|n| bar.inc(n),
            )?;
            bar.finish_and_clear();
            println!("{}", runner::Record::heading());
            records.iter().for_each(|r| println!("{}", r.line()));
            Ok(())
        }
        Bench::Ceilings(a) => {
            let gpu = gphash::Gpu::new()?;
            let method = Method { bytes: a.mib << 20, reps: a.reps, ..Method::default() };
            println!("# {} ({})", gpu.info.name, gpu.info.driver);
            if a.mib > 0 {
                for (memory, c) in ceiling::measure(&gpu, &method)? {
                    println!("{memory:<7} {c}");
                }
            }
            if a.round_trip_reps > 0 {
                for t in ceiling::round_trips(&gpu, &a.round_trip_items, a.round_trip_reps)? {
                    println!("round trip {t}");
                }
            }
            Ok(())
        }
        Bench::Reach(a) => {
            let gpu = gphash::Gpu::new()?;
            let method = Method { reps: a.reps, ..Method::default() };
            println!("# {} ({})", gpu.info.name, gpu.info.driver);
            let pages = if a.huge_pages { "transparent huge pages" } else { "the host's default pages" };
            println!(
                "# random 128-byte requests over {} MiB of host memory ({pages}), windows of {} MiB",
                a.mib, a.window_mib
            );
            let reached = reach::measure(&gpu, (a.mib << 20, a.window_mib << 20), a.huge_pages, &method)?;
            let reference = reached.iter().find(|r| r.way == reach::Way::FirstWindow).map(|r| r.median());
            println!(
                "{:<26} {:>10} {:>8} {:>12} {:>10} {:>10} {:>8}",
                "way", "MiB", "windows", "M req/s", "min", "max", "ratio"
            );
            for r in &reached {
                let ratio = reference.map_or(String::from("-"), |f| format!("{:.3}", r.median() / f));
                println!(
                    "{:<26} {:>10} {:>8} {:>12.1} {:>10.1} {:>10.1} {:>8}",
                    r.way.to_string(),
                    r.bytes >> 20,
                    r.windows,
                    r.median() / 1e6,
                    r.rates[0] / 1e6,
                    r.rates[r.rates.len() - 1] / 1e6,
                    ratio
                );
            }
            Ok(())
        }
        Bench::LoadSearch(a) => load_search(a, options),
        Bench::Sharded(a) => {
            let bench = ShardedLoad {
                keys: a.keys,
                capacity: a.capacity.unwrap_or(a.keys),
                shards: a.shards,
                batch: a.batch,
                key_bytes: a.key_bytes,
                value_bytes: a.value_bytes,
                searches: a.searches,
                table_dir: a.table.clone(),
                existing: a.existing,
                load_from: a.load_from,
                check: !a.no_check,
                pool_dir: a.dir.pool_dir.clone(),
            };
            let bar = progress(if a.existing { 0 } else { a.keys } + a.searches, "bench");
            let figures = bench.run(options, &|n| bar.inc(n))?;
            bar.finish_and_clear();
            match &a.table {
                Some(dir) if a.existing => {
                    println!("# the table in {}, {} keys, batch {}", dir.display(), a.keys, a.batch)
                }
                _ => println!(
                    "# {} keys of {} bytes, values of {} bytes, {} shards made for {} keys, batch {}",
                    a.keys, a.key_bytes, a.value_bytes, a.shards, bench.capacity, a.batch
                ),
            }
            println!("{figures}");
            Ok(())
        }
        Bench::Profile(a) => {
            let bench = ProfileBench {
                keys: a.keys,
                batches: a.batches.clone(),
                reps: a.reps,
                rounds: a.rounds,
                key_bytes: a.key_bytes,
                value_bytes: a.value_bytes,
                seed: a.seed,
                floor_reps: a.floor_reps,
                pool_dir: a.dir.pool_dir.clone(),
                pipeline: a.pipeline,
                load_cache: a.load_cache,
                device: a.device,
                alternate: a.alternate,
            };
            let mut options = options.clone();
            if a.volatile {
                options.gpu.placement = Placement::Volatile;
            }
            if a.alternate > 0 {
                println!(
                    "# {} keys of {} bytes, {}-byte values, loaded; {}batches of gets, then of inserts, alternated with round trips",
                    a.keys,
                    a.key_bytes,
                    a.value_bytes,
                    if a.volatile { "a volatile table in device memory; " } else { "" }
                );
                bench.alternated(&options, &mut |m| println!("{m}"))?;
                return Ok(());
            }
            println!(
                "# {} keys of {} bytes, {}-byte values, loaded; {}",
                a.keys,
                a.key_bytes,
                a.value_bytes,
                if a.pipeline && a.device {
                    "pipelined device batches (two in flight, GpHash::device_pipeline; stages overlap, so they may add up to more than the wall time)"
                } else if a.pipeline {
                    "pipelined batches (two in flight; stages overlap, so they may add up to more than the wall time)"
                } else if a.device {
                    "device batches (execute_device: inputs uploaded before the timing, results left on the device)"
                } else {
                    "execute_ordered batches, one call at a time"
                }
            );
            if a.volatile {
                println!("# a volatile table in device memory, nothing persisted");
            }
            bench.run(&options, &mut |m| println!("{m}"))?;
            Ok(())
        }
        Bench::Fill(a) => {
            println!("# load factor at the first insertion that finds no slot (about {} slots)", a.slots);
            for &layout in &a.layouts {
                let f = Fill {
                    layout,
                    slots: a.slots,
                    batch: a.batch,
                    key_bytes: 8,
                    pool_dir: a.dir.pool_dir.clone(),
                }
                .run(options)?;
                println!("{layout:<10} load {:.4}   ({} keys in {} slots)", f.load(), f.items, f.slots);
                let [before, after] = f.batch_times.map(|times| match times.len() {
                    0 => "no batch".to_string(),
                    n => {
                        let (med, min, max) = gphash_bench::spread(times);
                        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
                        format!("{:.2} ms ({:.2}-{:.2}; {n} batches)", ms(med), ms(min), ms(max))
                    }
                });
                println!("           insert batch: {before} before the heap's first growth, {after} after");
            }
            Ok(())
        }
        Bench::Resize(a) => {
            let bar = progress(a.keys, "load");
            let r =
                ResizeRecovery { keys: a.keys, value_bytes: a.value_bytes, pool_dir: a.dir.pool_dir.clone() }
                    .run(options, &|n| bar.inc(n))?;
            bar.finish_and_clear();
            println!("# {} keys, values of {} bytes | {}", a.keys, a.value_bytes, r.setting);
            println!("resize {} -> {} slots: {:.3} s", r.slots.0, r.slots.1, r.resize.as_secs_f64());
            println!("recovery after a crash: {:.3} s", r.recovery.as_secs_f64());
            let (bytes, took) = r.scan_ceiling;
            println!(
                "scan ceiling: the buckets' {:.1} MB read through a fresh mapping on all host threads in {:.1} ms ({:.1} GB/s)",
                bytes as f64 / 1e6,
                took.as_secs_f64() * 1e3,
                bytes as f64 / took.as_secs_f64() / 1e9
            );
            println!("open after a clean close: {:.3} s", r.clean_open.as_secs_f64());
            let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
            for ([opened, got, wrote, ready], after) in
                r.background_open.into_iter().flatten().zip(["a clean close", "a crash"])
            {
                println!(
                    "open after {after} with a background GPU start: {:.2} ms (a get on the CPU done at {:.2} ms, an upsert at {:.2} ms, the GPU took over at {:.1} ms)",
                    ms(opened),
                    ms(got),
                    ms(wrote),
                    ms(ready)
                );
            }
            println!("(opening the GPU, shared by every open: {:.3} s)", r.device.as_secs_f64());
            Ok(())
        }
        Bench::Persist(a) => {
            println!("# {} upserts of {} loaded keys, batches of {}", a.updates, a.keys, a.batch);
            for spec in &a.pools {
                let (dir, mode) = match spec.split_once(':') {
                    Some((d, "clwb")) => (d, Some(PersistMode::FlushFence)),
                    Some((d, "msync")) => (d, Some(PersistMode::Msync)),
                    Some((_, other)) => {
                        return Err(gphash::Error::InvalidConfig(format!("unknown persist mode {other}")));
                    }
                    None => (spec.as_str(), None),
                };
                let opts = Options { persist_mode: mode, ..options.clone() };
                let c =
                    PersistCost { keys: a.keys, updates: a.updates, batch: a.batch, pool_dir: dir.into() };
                let f = c.run(&opts)?;
                println!(
                    "{spec:<16} {:<34} persist {:>8.3} ms/batch   {:>9.0} lines/batch   engine {:>8.3} ms/batch   [{}]",
                    f.pool,
                    f.persist_per_batch.as_secs_f64() * 1e3,
                    f.lines_per_batch,
                    f.engine_per_batch.as_secs_f64() * 1e3,
                    f.mode
                );
            }
            Ok(())
        }
    }
}

fn cache(a: &CacheArgs) -> gphash::Result<()> {
    let gpu = gphash::Gpu::new()?;
    let bench = CacheBench {
        records: a.records,
        ops: a.ops,
        reps: a.reps,
        warmup: a.warmup,
        batch: a.batch,
        key_bytes: a.key_bytes,
        value_bytes: a.value_bytes,
        workloads: a.workloads.clone(),
        ratios: a.ratios.clone(),
        thetas: a.thetas.clone(),
        policies: a.policies.clone(),
        ratio: a.ratio,
        timeline_ops: a.timeline_ops,
        period: a.period,
        seed: a.seed,
        pool_dir: a.dir.pool_dir.clone(),
    };
    println!(
        "# {} ({}): bucket cache, {} records, batch {}",
        gpu.info.name, gpu.info.driver, a.records, a.batch
    );
    let figures = bench.run(&gpu, &mut |line| println!("{line}"))?;
    bktcache::write_files(&figures, &a.out)?;
    bktcache::plot(&figures, &a.out)?;
    println!("# results and plots in {}", a.out.display());
    Ok(())
}

fn suite(a: &SuiteArgs, options: &Options) -> gphash::Result<()> {
    let gpu = gphash::Gpu::new()?;
    let batches: Vec<usize> = match a.batches.as_str() {
        "sweep" => (8..=20).map(|p| 1 << p).collect(),
        list => list
            .split(',')
            .map(|b| b.trim().parse().map_err(|_| gphash::Error::InvalidConfig(format!("batch size {b:?}"))))
            .collect::<gphash::Result<_>>()?,
    };
    let suite = Suite {
        workloads: a.workloads.clone(),
        systems: a.systems.clone(),
        key_bytes: a.key_bytes.clone(),
        value_bytes: a.value_bytes,
        records: a.records,
        micro_ops: a.micro_ops,
        macro_ops: a.macro_ops,
        batches: batches.clone(),
        load_batch: a.load_batch,
        distributions: match a.distribution.as_slice() {
            [] => vec![None],
            given => given.iter().copied().map(Some).collect(),
        },
        seed: a.run.seed,
        pool_dir: a.dir.pool_dir.clone(),
        cpu_threads: threads(a.run.cpu_threads),
        cache: options.gpu.cache,
        tile: options.gpu.tile,
        reps: a.run.reps,
        keep_pools: a.keep_pools,
        in_flight: a.in_flight,
    };
    println!("# {} ({}), {} host threads", gpu.info.name, gpu.info.driver, suite.cpu_threads);
    if suite.in_flight {
        println!("# the gphash systems' batches two in flight (--in-flight)");
    }
    let (ceilings, round_trips) = measure_ceilings(&gpu, a.run.ceiling_mib)?;
    println!(
        "# {} records, keys {:?} bytes, values {} bytes, {} micro / {} core operations, batches {:?}",
        a.records, a.key_bytes, a.value_bytes, a.micro_ops, a.macro_ops, batches
    );
    let per_workload = |w: &Workload| {
        if matches!(w, Workload::A | Workload::B | Workload::C | Workload::D | Workload::F) {
            a.macro_ops
        } else {
            a.micro_ops
        }
    };
    let total = (a.records + a.workloads.iter().map(per_workload).sum::<u64>() * batches.len() as u64)
        * (a.systems.len() * a.key_bytes.len()) as u64;
    let bar = progress(total, "suite");
    println!("{}", runner::Record::heading());
    // Printed past the bar: `ProgressBar::println` prints nothing where stdout is not a terminal.
    let print = |r: &runner::Record| bar.suspend(|| println!("{}", r.line()));
    let records = runner::run(&suite, &gpu, &ceilings, &|n| bar.inc(n), &mut |r| print(r))?;
    bar.finish_and_clear();
    runner::write_files(&records, &ceilings, &round_trips, &a.out)?;
    for &k in &a.key_bytes {
        for w in std::iter::once(Workload::Load).chain(a.workloads.iter().copied()) {
            plots::curves(&records, &w.to_string(), k, &a.out)?;
        }
        for &b in &batches {
            plots::comparison(&records, k, b, &a.out)?;
        }
    }
    println!("# results and plots in {}", a.out.display());
    Ok(())
}

fn load_search(args: &LoadSearchArgs, options: &Options) -> gphash::Result<()> {
    let placements = args
        .placements
        .iter()
        .map(|p| match p.as_str() {
            "zero-copy" => Ok(Placement::ZeroCopy),
            "staged" => Ok(Placement::Staged),
            other => Err(gphash::Error::InvalidConfig(format!("unknown placement {other}"))),
        })
        .collect::<gphash::Result<Vec<_>>>()?;
    let bench = LoadSearch {
        keys: args.keys,
        batch: args.batch,
        reps: args.reps,
        key_bytes: args.key_bytes,
        value_bytes: args.value_bytes,
        placements,
        arena_bits: args.arena_bits,
        pool_dir: args.dir.pool_dir.clone(),
    };
    let bar = progress(args.keys * (1 + args.reps as u64) * bench.placements.len() as u64, "bench");
    let rows = bench.run(options, &|n| bar.inc(n))?;
    bar.finish_and_clear();
    println!(
        "# {} keys of {} bytes, values of {} bytes, batch {}",
        args.keys, args.key_bytes, args.value_bytes, args.batch
    );
    let mut setting = "";
    for r in &rows {
        if r.setting != setting {
            setting = &r.setting;
            println!("# {setting}");
        }
        println!("{r}");
    }
    Ok(())
}
