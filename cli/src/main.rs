//! `gphash`: create, inspect, check and drive persistent GPU hash tables. With no command it
//! runs a short demo on a temporary pool.

mod bench;
mod demo;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use gphash::{CacheOptions, Config, Executor, GpHash, GpuOptions, Layout, Options, Placement, Policy};
use gphash_cli::trace;
use indicatif::{ProgressBar, ProgressStyle};

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
    /// Lanes that serve one operation (4, 8, 16 or 32).
    #[arg(long, global = true, default_value_t = 32)]
    tile: u32,
    /// Bucket cache in device memory, as a fraction of the table's groups (0: none; 1: all).
    /// Used when the pool is zero-copy.
    #[arg(long, global = true, default_value_t = CacheOptions::default().ratio)]
    cache_ratio: f64,
    /// How loading phases pick the groups to cache: lfu, lru or random.
    #[arg(long, global = true, default_value_t = Policy::Lfu)]
    cache_policy: Policy,
    /// Operations between two loading phases of the cache.
    #[arg(long, global = true, default_value_t = CacheOptions::default().period)]
    cache_period: u64,
    /// The cache counts one access in this many for LFU and LRU (0: none).
    #[arg(long, global = true, default_value_t = CacheOptions::default().sample)]
    cache_sample: u32,
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
    fn options(&self) -> Options {
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
                    policy: self.cache_policy,
                    period: self.cache_period,
                    sample: self.cache_sample,
                    ..CacheOptions::default()
                },
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
        /// grows by a level whenever an insertion finds no empty slot).
        #[arg(long, default_value_t = 1 << 20)]
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
        /// Result file, one line per operation.
        #[arg(long)]
        out: PathBuf,
        /// Operations per batch.
        #[arg(long, default_value_t = 1 << 16)]
        batch: usize,
    },
    /// Show what a pool holds and how it would run.
    Stats {
        /// Pool path.
        pool: PathBuf,
    },
    /// Verify every invariant of a pool; exit 1 with a report when one fails.
    Check {
        /// Pool path.
        pool: PathBuf,
    },
    /// The demo that runs when no command is given.
    Demo(demo::DemoArgs),
    /// Benchmarks (throughput, load factor, resize and recovery time, persist cost).
    #[command(subcommand)]
    Bench(bench::Bench),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let options = cli.exec.options();
    let result = match cli.command {
        None => demo::run(&demo::DemoArgs::default(), &options),
        Some(Command::Demo(args)) => demo::run(&args, &options),
        Some(Command::Bench(args)) => bench::run(&args, &options),
        Some(Command::Create { pool, key_bytes, value_bytes, layout, capacity, max_bytes }) => {
            let config = Config { key_bytes, value_bytes, layout, capacity, max_bytes, ..Config::default() };
            create(&pool, &config, &options)
        }
        Some(Command::Replay { pool, trace, out, batch }) => replay(&pool, &trace, &out, batch, &options),
        Some(Command::Stats { pool }) => stats(&pool, &options),
        Some(Command::Check { pool }) => return check(&pool),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gphash: {e}");
            ExitCode::FAILURE
        }
    }
}

fn create(path: &Path, config: &Config, options: &Options) -> gphash::Result<()> {
    let index = GpHash::create(Some(path), config, options)?;
    println!("created {}", path.display());
    println!("{}", index.stats());
    index.close()
}

fn stats(path: &Path, options: &Options) -> gphash::Result<()> {
    let index = GpHash::open(path, options)?;
    println!("{}", index.stats());
    index.close()
}

fn check(path: &Path) -> ExitCode {
    let report = host_pm::Pool::open(path)
        .map_err(gphash::Error::from)
        .and_then(|pool| Ok((GpHash::geometry_of(&pool)?, pool)))
        .map(|(geo, pool)| gphash::check(&pool, &geo, pool.header()));
    match report {
        Ok(r) => {
            println!("{r}");
            if r.ok() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Err(e) => {
            println!("cannot check {}: {e}", path.display());
            ExitCode::FAILURE
        }
    }
}

fn replay(
    path: &Path,
    trace_path: &Path,
    out_path: &Path,
    batch_size: usize,
    options: &Options,
) -> gphash::Result<()> {
    let io = |what: String| move |source| gphash::Error::Io { what, source };
    if batch_size == 0 {
        return Err(gphash::Error::InvalidConfig("--batch must be at least 1".into()));
    }
    let mut index = GpHash::open(path, options)?;
    let g = *index.geometry();
    let text =
        std::fs::read_to_string(trace_path).map_err(io(format!("reading {}", trace_path.display())))?;
    let ops = trace::parse(trace_path, &text, g.key_bytes as usize, g.value_bytes as usize)?;
    let mut out = File::create(out_path).map_err(io(format!("creating {}", out_path.display())))?;
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
        out.write_all(lines.as_bytes()).map_err(io(format!("writing {}", out_path.display())))?;
        out.sync_data().map_err(io(format!("syncing {}", out_path.display())))?;
        bar.inc(batch.len() as u64);
    }
    bar.finish_and_clear();
    eprintln!("replayed {} operations; {}", ops.len(), index.stats().mode);
    index.close()
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
