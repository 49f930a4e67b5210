//! `gphash`: create, inspect, check and drive persistent GPU hash tables. With no command it
//! runs a short demo on a temporary pool.

mod bench;
mod demo;
mod results;
mod runs;
mod scoreboard;
mod serve;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use gphash::{
    CacheOptions, Config, Executor, GpHash, GpuOptions, GpuStartMode, Layout, Options, Placement, Policy,
};
use gphash_cli::trace;
use indicatif::{ProgressBar, ProgressStyle};
use results::ResultFile;

/// mimalloc: the server's connections allocate per request on many threads, where glibc's
/// allocator took much of their CPU time (docs/lab/server.md, "The server's allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What a command reports on failure: a library error, or a sentence of the command's own.
pub type Error = Box<dyn std::error::Error>;

#[derive(Parser)]
#[command(version, about = "A persistent, lock-free hash index driven by the GPU through Vulkan")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    exec: ExecArgs,
}

/// How batches execute (every command).
#[derive(Args, Clone)]
struct ExecArgs {
    /// GPU, CPU model, or the GPU when one exists.
    #[arg(long, global = true, value_enum, default_value_t = ExecutorArg::Auto)]
    executor: ExecutorArg,
    /// Zero-copy (the GPU works on the pool in place) or staged (a device copy).
    #[arg(long, global = true, value_enum, default_value_t = PlacementArg::Auto)]
    placement: PlacementArg,
    /// Lanes that serve one operation (1, 2, 4, 8, 16 or 32): the widest tile, which phase A
    /// narrows down to 4 lanes for large batches.
    #[arg(long, global = true, default_value_t = 32)]
    tile: u32,
    /// Bucket cache in device memory, as a fraction of the table's groups (0: none; 1: all),
    /// within --cache-max-mib (default: all on a GPU with memory of its own, none on a CPU
    /// device or integrated GPU). Used when the pool is zero-copy.
    #[arg(long, global = true)]
    cache_ratio: Option<f64>,
    /// Device memory the cache's entries may take, in MiB (default: half the GPU's memory).
    #[arg(long, global = true)]
    cache_max_mib: Option<u64>,
    /// How loading phases pick the groups to cache: lfu, lru or random.
    #[arg(long, global = true, default_value_t = Policy::Lfu)]
    cache_policy: Policy,
    /// Operations between two loading phases of the cache.
    #[arg(long, global = true, default_value_t = CacheOptions::default().period)]
    cache_period: u64,
    /// The cache counts one access in this many for LFU and LRU (0: none).
    #[arg(long, global = true, default_value_t = CacheOptions::default().sample)]
    cache_sample: u32,
    /// Reads check their value's checksum; a damaged value reads as CORRUPT.
    #[arg(long, global = true)]
    verify_values: bool,
    /// Kernels reach the pool as pools over 16 GiB need (64-bit word addresses, binding
    /// arrays, the 256-byte dirty lines of a 1 TiB pool) even where it is smaller: to measure
    /// the cost.
    #[arg(long, global = true)]
    large_pool_mode: bool,
    /// When the GPU starts: `background` opens without waiting for it (calls run on the CPU
    /// model until the device, the pool's import and the kernels are ready, then the GPU
    /// takes over), `wait` before the open returns, `auto` in the background under
    /// `--executor auto` and waiting under `--executor gpu`. Default: `auto` for `serve` (the
    /// server answers at once, whatever the pool's size), `wait` for every other command
    /// (they report the mode, and `bench` times the GPU).
    #[arg(long, global = true, value_enum)]
    gpu_start: Option<GpuStartArg>,
}

#[derive(Clone, Copy, ValueEnum)]
enum GpuStartArg {
    Auto,
    Wait,
    Background,
}

#[derive(Clone, Copy, ValueEnum)]
enum ExecutorArg {
    Auto,
    Gpu,
    Cpu,
}

#[derive(Clone, Copy, ValueEnum)]
enum PlacementArg {
    Auto,
    ZeroCopy,
    Staged,
}

impl ExecArgs {
    /// The options these arguments give, the GPU starting as `start` unless `--gpu-start` says.
    fn options(&self, start: GpuStartMode) -> Options {
        Options {
            executor: match self.executor {
                ExecutorArg::Auto => Executor::Auto,
                ExecutorArg::Gpu => Executor::Gpu,
                ExecutorArg::Cpu => Executor::Cpu,
            },
            gpu: GpuOptions {
                placement: match self.placement {
                    PlacementArg::Auto => Placement::Auto,
                    PlacementArg::ZeroCopy => Placement::ZeroCopy,
                    PlacementArg::Staged => Placement::Staged,
                },
                tile: self.tile,
                max_window_bytes: None,
                cache: CacheOptions {
                    ratio: self.cache_ratio,
                    max_bytes: self.cache_max_mib.map(|m| m << 20),
                    policy: self.cache_policy,
                    period: self.cache_period,
                    sample: self.cache_sample,
                    ..CacheOptions::default()
                },
                large_pool_mode: self.large_pool_mode,
                ..GpuOptions::default()
            },
            verify_values: self.verify_values,
            gpu_start: match self.gpu_start {
                None => start,
                Some(GpuStartArg::Auto) => GpuStartMode::Auto,
                Some(GpuStartArg::Wait) => GpuStartMode::Wait,
                Some(GpuStartArg::Background) => GpuStartMode::Background,
            },
            ..Options::default()
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Create a table in a new pool file.
    Create {
        /// Pool path (/dev/daxX.Y, a tmpfs file such as /dev/shm/t.pool, or any file).
        pool: PathBuf,
        /// Key width in bytes (a multiple of 4).
        #[arg(long)]
        key_bytes: u32,
        /// Value size in bytes.
        #[arg(long)]
        value_bytes: u32,
        /// Levels, hash locations and slots per bucket.
        #[arg(long, default_value = "2L-2H-8S")]
        layout: Layout,
        /// Keys the table should hold at first (it is sized for a load factor of 0.75 and
        /// grows by a level whenever an insertion finds no empty slot): start small, it grows.
        #[arg(long, default_value_t = Config::default().capacity)]
        capacity: u64,
        /// Largest size the pool file may grow to, in bytes (beyond it: OutOfSpace).
        #[arg(long)]
        max_bytes: Option<u64>,
    },
    /// Apply a trace in batches, with the results of one-by-one application; each batch's
    /// result lines are appended to the output only once the batch is persisted.
    Replay {
        /// Pool path.
        pool: PathBuf,
        /// Trace file (I/P/U/R/D lines).
        #[arg(long)]
        trace: PathBuf,
        /// Result file, one line per operation: replaced (never a pool, nor the trace), then
        /// grown by whole batches, atomically.
        #[arg(long)]
        out: PathBuf,
        /// Operations per batch.
        #[arg(long, default_value_t = 1 << 16)]
        batch: usize,
    },
    /// Show what a pool holds, without writing it or opening a GPU (a pool not closed cleanly
    /// is shown as recovery would leave it).
    Stats {
        /// Pool path.
        pool: PathBuf,
    },
    /// Verify every invariant of a pool without writing it; a pool not closed cleanly is
    /// checked as recovery would leave it. A directory is checked as a sharded table
    /// (`ShardedGpHash`): that each shard's pool is in its place, and each pool. Exit 0:
    /// consistent; 1: inconsistent; 2: could not
    /// check (unreadable, not a pool, another version, in use by another process).
    Check {
        /// Pool path, or a sharded table's directory.
        pool: PathBuf,
        /// Recover a consistent pool that was not closed cleanly (as opening it does) and
        /// close it cleanly. An inconsistent pool is left as it is.
        #[arg(long)]
        repair: bool,
    },
    /// Serve the pool to Redis clients (RESP2): GET, SET, MGET, MSET, DEL, ... in GPU batches.
    Serve(serve::ServeArgs),
    /// The demo that runs when no command is given.
    Demo(demo::DemoArgs),
    /// Benchmarks (throughput, load factor, resize and recovery time, persist cost).
    #[command(subcommand)]
    Bench(bench::Bench),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    // Commands wait for the GPU (they report the mode, and `bench` times the GPU); a server
    // answers at once.
    let options = cli.exec.options(GpuStartMode::Wait);
    let result: Result<(), Error> = match cli.command {
        None => demo::run(&demo::DemoArgs::default(), &options).map_err(Into::into),
        Some(Command::Demo(args)) => demo::run(&args, &options).map_err(Into::into),
        Some(Command::Bench(args)) => bench::run(&args, &options).map_err(Into::into),
        Some(Command::Serve(args)) => serve::run(&args, &cli.exec.options(GpuStartMode::Auto)),
        Some(Command::Create { pool, key_bytes, value_bytes, layout, capacity, max_bytes }) => {
            let config = Config { key_bytes, value_bytes, layout, capacity, max_bytes, ..Config::default() };
            create(&pool, &config, &options)
        }
        Some(Command::Replay { pool, trace, out, batch }) => replay(&pool, &trace, &out, batch, &options),
        Some(Command::Stats { pool }) => stats(&pool).map_err(Into::into),
        Some(Command::Check { pool, repair }) => return check(&pool, repair, &options),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gphash: {e}");
            ExitCode::FAILURE
        }
    }
}

fn create(path: &Path, config: &Config, options: &Options) -> Result<(), Error> {
    if path.is_dir() {
        return Err(
            format!("{} is a directory; give the path of the pool file to create", path.display()).into()
        );
    }
    let index = GpHash::create(Some(path), config, options)?;
    announce_cpu_fallback(&index, options);
    println!("created {}", path.display());
    println!("{}", index.stats());
    Ok(index.close()?)
}

fn stats(path: &Path) -> gphash::Result<()> {
    let found = gphash::inspect(path)?;
    println!("{}", found.stats);
    println!(
        "pool:          {} bytes, {} backend, header sequence {}",
        found.pool_bytes, found.backend, found.header.sequence
    );
    if found.clean() {
        println!("state:         closed cleanly");
    } else {
        println!(
            "state:         not closed cleanly; shown as recovery would leave it ({})",
            found.recovery_plan()
        );
    }
    let check = if found.consistent() { "consistent" } else { "INCONSISTENT (`gphash check` reports it)" };
    println!("check:         {check}");
    println!("mode:          chosen when the pool is opened (stats writes nothing and opens no GPU)");
    Ok(())
}

// Exit statuses of `gphash check`.
const CONSISTENT: u8 = 0;
const INCONSISTENT: u8 = 1;
const CANNOT_CHECK: u8 = 2;

fn check(path: &Path, repair: bool, options: &Options) -> ExitCode {
    if !path.is_dir() {
        return check_pool(path, repair, options);
    }
    // A sharded table: each shard in its place, then each shard's pool in turn (a pool out of
    // place is checked but never repaired: it is not this table's to write); the worst outcome
    // is the table's.
    match gphash::ShardedGpHash::shard_paths(path) {
        Ok(shards) => {
            let mut outcomes = vec![];
            let misplaced: Vec<usize> = match gphash::ShardedGpHash::misplaced(path) {
                Ok(misplaced) => {
                    for (i, why) in &misplaced {
                        println!("shard {i} is out of place, the table does not open: {why}");
                        outcomes.push(ExitCode::from(INCONSISTENT));
                    }
                    misplaced.into_iter().map(|(i, _)| i).collect()
                }
                Err(e) => {
                    println!("cannot check the shards' places: {e}");
                    outcomes.push(ExitCode::from(CANNOT_CHECK));
                    (0..shards.len()).collect()
                }
            };
            for (i, shard) in shards.iter().enumerate() {
                println!("shard {i}: {}", shard.display());
                let repair = repair && !misplaced.contains(&i);
                outcomes.push(check_pool(shard, repair, options));
            }
            let worst =
                [CANNOT_CHECK, INCONSISTENT].into_iter().find(|&c| outcomes.contains(&ExitCode::from(c)));
            ExitCode::from(worst.unwrap_or(CONSISTENT))
        }
        Err(e) => {
            println!("cannot check {}: a directory, but not a sharded table: {e}", path.display());
            ExitCode::from(CANNOT_CHECK)
        }
    }
}

fn check_pool(path: &Path, repair: bool, options: &Options) -> ExitCode {
    let found = match gphash::inspect(path) {
        Ok(found) => found,
        Err(gphash::Error::Pool(host_pm::PoolError::Locked { .. })) => {
            println!(
                "cannot check {}: it is in use (another process has it open for writing)",
                path.display()
            );
            return ExitCode::from(CANNOT_CHECK);
        }
        Err(e) => {
            println!("cannot check {}: {e}", path.display());
            return ExitCode::from(CANNOT_CHECK);
        }
    };
    println!("{found}");
    if !found.consistent() {
        if repair {
            println!("not repaired: recovery cannot make it consistent; the pool is left as it is");
        }
        return ExitCode::from(INCONSISTENT);
    }
    if !repair {
        return ExitCode::from(CONSISTENT);
    }
    if found.clean() {
        println!("closed cleanly: nothing to repair");
        return ExitCode::from(CONSISTENT);
    }
    match recover_and_close(path, options) {
        Ok(true) => ExitCode::from(CONSISTENT),
        Ok(false) => ExitCode::from(INCONSISTENT),
        Err(e) => {
            println!("cannot repair {}: {e}", path.display());
            ExitCode::from(CANNOT_CHECK)
        }
    }
}

/// `check --repair`: opens (which recovers), checks and closes cleanly; whether it is consistent.
fn recover_and_close(path: &Path, options: &Options) -> gphash::Result<bool> {
    let index = GpHash::open(path, options)?;
    println!("repaired: {}", index.stats().recovery);
    let report = index.check();
    println!("{report}");
    index.close()?;
    Ok(report.ok())
}

fn replay(
    path: &Path,
    trace_path: &Path,
    out_path: &Path,
    batch_size: usize,
    options: &Options,
) -> Result<(), Error> {
    if batch_size == 0 {
        return Err("--batch must be at least 1".into());
    }
    // Opening writes nothing to a cleanly closed pool, and nothing below writes to it before
    // the trace is parsed and the output checked and in place.
    let index = GpHash::open(path, options)?;
    announce_cpu_fallback(&index, options);
    let g = index.geometry();
    let text = std::fs::read(trace_path)
        .map_err(|e| format!("cannot read the trace {}: {e}", trace_path.display()))?;
    let ops = trace::parse_bytes(trace_path, &text, g.key_bytes as usize, g.value_bytes as usize)?;
    drop(text);
    let mut out = ResultFile::create(out_path, &[("pool", path), ("trace", trace_path)])?;
    let bar = progress(ops.len() as u64, "replay");
    let mut lines = String::new();
    for start in (0..ops.len()).step_by(batch_size) {
        let end = (start + batch_size).min(ops.len());
        let mut batch = index.batch();
        for i in start..end {
            let (kind, key, value) = ops.op(i);
            batch.push(kind, key, kind.writes_value().then_some(value))?;
        }
        // Persisted when this returns: only then are its lines written.
        let result = index.execute_ordered(&batch)?;
        lines.clear();
        for i in 0..batch.len() {
            lines.push_str(&trace::result_line(&batch, &result, i));
            lines.push('\n');
        }
        out.append(lines.as_bytes())?;
        bar.inc(batch.len() as u64);
    }
    out.finish()?;
    bar.finish_and_clear();
    eprintln!("replayed {} operations; {}", ops.len(), index.stats().mode);
    Ok(index.close()?)
}

/// Says on stderr that `--executor auto` found no GPU and the CPU model runs the table (the
/// library only logs it).
pub fn announce_cpu_fallback(index: &GpHash, options: &Options) {
    match (options.executor, index.stats().mode) {
        (Executor::Auto, gphash::Mode::Cpu { reason }) if index.gpu_starting() => {
            eprintln!("gphash: running on the CPU model of the table until the GPU takes over: {reason}")
        }
        (Executor::Auto, gphash::Mode::Cpu { reason }) => {
            eprintln!("gphash: running on the CPU model of the table, not a GPU: {reason}")
        }
        _ => {}
    }
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg:>8} [{bar:40}] {pos}/{len} ({per_sec}, eta {eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}
