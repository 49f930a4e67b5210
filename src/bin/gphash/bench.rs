//! `gphash bench`: load and search throughput per placement (see `gphash::bench`).

use std::path::PathBuf;

use clap::Args;
use gphash::bench::LoadSearch;
use gphash::{Options, Placement};

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
    /// Placements to compare (zero-copy, staged).
    #[arg(long, value_delimiter = ',', default_value = "zero-copy,staged")]
    placements: Vec<String>,
    /// Directory of the pools (tmpfs imports zero-copy).
    #[arg(long, default_value = "/dev/shm")]
    pool_dir: PathBuf,
}

pub fn run(args: &BenchArgs, options: &Options) -> gphash::Result<()> {
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
        pool_dir: args.pool_dir.clone(),
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
