//! What the workload benchmarks (`bench suite`, `bench scoreboard` and the others that make
//! pools) share: where pools go, the settings of repeated runs, the host threads, the ceilings
//! measured in the same process.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use gphash_bench::ceiling::{self, Ceilings, Memory, Method, RoundTrip};

/// Where pools go.
#[derive(Args, Clone)]
pub(crate) struct PoolDir {
    /// Directory of the pools (tmpfs imports zero-copy).
    #[arg(long, default_value = "/dev/shm")]
    pub(crate) pool_dir: PathBuf,
}

/// The settings of repeated workload runs.
#[derive(Args, Clone)]
pub(crate) struct RunArgs {
    /// Runs of each workload at each batch size (the table restored between them): the median
    /// run is reported, with the slowest and fastest. The load runs once.
    #[arg(long, default_value_t = 5)]
    pub(crate) reps: usize,
    /// Seed of the workloads.
    #[arg(long, default_value_t = 42)]
    pub(crate) seed: u64,
    /// Host threads of the cpu and cpu-map systems (default: all).
    #[arg(long)]
    pub(crate) cpu_threads: Option<usize>,
    /// Buffer size of the ceiling measurements in MiB (0: measure neither the ceilings nor the
    /// round trips).
    #[arg(long, default_value_t = 1024)]
    pub(crate) ceiling_mib: u64,
}

/// `n` threads, or all the host has.
pub(crate) fn threads(n: Option<usize>) -> usize {
    n.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// A memory and its ceilings.
pub(crate) type MemoryCeilings = (Memory, Ceilings);

/// The memory ceilings over buffers of `mib` MiB and the bare round trips, printed (`mib` 0:
/// neither).
pub(crate) fn measure_ceilings(
    gpu: &Arc<gphash::Gpu>,
    mib: u64,
) -> gphash::Result<(Vec<MemoryCeilings>, Vec<RoundTrip>)> {
    if mib == 0 {
        return Ok((vec![], vec![]));
    }
    let ceilings = ceiling::measure(gpu, &Method { bytes: mib << 20, ..Method::default() })?;
    for (memory, c) in &ceilings {
        println!("# ceiling {memory:<7} {c}");
    }
    let round_trips = ceiling::round_trips(gpu, &ceiling::ROUND_TRIP_ITEMS, ceiling::ROUND_TRIP_REPS)?;
    for t in &round_trips {
        println!("# round trip {t}");
    }
    Ok((ceilings, round_trips))
}
