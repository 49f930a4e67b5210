//! `gphash bench scoreboard`: gphash against the best CPU map used plainly, in the three
//! regimes of `gphash_bench::scoreboard`.

use std::path::PathBuf;

use clap::Args;
use gphash::Options;
use gphash_bench::scoreboard::{self, Regime, Scoreboard};
use gphash_bench::ycsb::{Distribution, Workload};

use crate::progress;
use crate::runs::{PoolDir, RunArgs, measure_ceilings, threads};

/// `bench scoreboard` settings.
#[derive(Args, Clone)]
pub(crate) struct ScoreboardArgs {
    /// Regimes: g (the caller's batches on the GPU), h (the caller on the host, through the
    /// host API), p (the table past its cache).
    #[arg(long, value_delimiter = ',', default_value = "g,h,p")]
    regimes: Vec<Regime>,
    /// Records loaded in g and h (the table cached whole).
    #[arg(long, default_value_t = 1 << 24)]
    records: u64,
    /// Records loaded in p.
    #[arg(long, default_value_t = 100_000_000)]
    past_records: u64,
    /// Device memory the cache may take in p, in MiB (p also runs without a cache). Hold it
    /// to a quarter of the table or less.
    #[arg(long, default_value_t = 4096)]
    past_cache_mib: u64,
    /// Workloads after the load.
    #[arg(long, value_delimiter = ',', default_value = "c,b,a,f")]
    workloads: Vec<Workload>,
    /// Key distributions: every workload runs under each.
    #[arg(long, value_delimiter = ',', default_value = "uniform,zipf:0.99")]
    distribution: Vec<Distribution>,
    /// Operations of each workload.
    #[arg(long, default_value_t = 1 << 23)]
    ops: u64,
    /// Batch sizes of the gphash systems.
    #[arg(long, value_delimiter = ',', default_value = "65536")]
    batches: Vec<usize>,
    /// Key width in bytes.
    #[arg(long, default_value_t = 8)]
    key_bytes: u32,
    /// Value size in bytes.
    #[arg(long, default_value_t = 128)]
    value_bytes: u32,
    #[command(flatten)]
    run: RunArgs,
    /// Directory for scoreboard.md and each regime's results.json and results.csv.
    #[arg(long, default_value = "scoreboard-results")]
    out: PathBuf,
    #[command(flatten)]
    dir: PoolDir,
}

pub(crate) fn run(a: &ScoreboardArgs, options: &Options) -> gphash::Result<()> {
    if a.batches.contains(&0) {
        return Err(gphash::Error::InvalidConfig("a batch size of 0".into()));
    }
    let gpu = gphash::Gpu::new()?;
    let board = Scoreboard {
        regimes: a.regimes.clone(),
        records: a.records,
        past_records: a.past_records,
        past_cache_bytes: a.past_cache_mib << 20,
        workloads: a.workloads.clone(),
        distributions: a.distribution.clone(),
        ops: a.ops,
        batches: a.batches.clone(),
        key_bytes: a.key_bytes,
        value_bytes: a.value_bytes,
        reps: a.run.reps,
        seed: a.run.seed,
        pool_dir: a.dir.pool_dir.clone(),
        cpu_threads: threads(a.run.cpu_threads),
        tile: options.gpu.tile,
    };
    let device = format!("{} ({}), {} host threads", gpu.info.name, gpu.info.driver, board.cpu_threads);
    println!("# {device}");
    let (ceilings, round_trips) = measure_ceilings(&gpu, a.run.ceiling_mib)?;
    let bar = progress(0, "scoreboard");
    println!("{}", gphash_bench::runner::Record::heading());
    let mut seen: Vec<(Regime, String)> = vec![];
    let mut print = |g: Regime, r: &gphash_bench::runner::Record| {
        bar.suspend(|| {
            if !seen.iter().any(|(s, n)| *s == g && *n == r.system) {
                seen.push((g, r.system.clone()));
                println!("# {g:?} {}: {}", r.system, r.setting);
            }
            println!("{g:?} {}", r.line())
        })
    };
    let results = board.run(&gpu, &ceilings, &|n| bar.inc(n), &mut |g, r| print(g, r))?;
    bar.finish_and_clear();
    println!("\n{}", scoreboard::markdown(&board, &results, &device));
    scoreboard::write_files(&board, &results, &device, &ceilings, &round_trips, &a.out)?;
    println!("# scoreboard.md and each regime's records in {}", a.out.display());
    Ok(())
}
