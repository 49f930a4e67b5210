//! The scoreboard: gphash against the CPU peer (`cpu-map`, the best of scc, papaya and dashmap
//! used plainly) in the three regimes a user meets, each named by where the caller and the
//! table are:
//!
//! - **G**: the caller's batches on the GPU (`GpHash::execute_device`), the table cached whole;
//! - **H**: the caller on the host through the public host API (`GpHash::pipeline`), the table
//!   cached whole;
//! - **P**: the table past its cache: a larger table with the cache held to a budget, and with
//!   no cache; the peer at the same record count.
//!
//! Every figure is the median of the suite's runs with the slowest and fastest, beside the peer
//! and the ceilings measured in the same process.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::ceiling::{Ceilings, Memory, RoundTrip};
use crate::runner::{self, Record, Suite, SystemKind};
use crate::ycsb::{Distribution, Workload};
use gphash::{CacheOptions, Gpu, Result};

/// A regime of the scoreboard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Regime {
    /// The caller's batches on the GPU, the table cached whole.
    G,
    /// The caller on the host through the public host API, the table cached whole.
    H,
    /// The table past its cache.
    P,
}

impl Regime {
    /// Every regime.
    pub const ALL: [Regime; 3] = [Regime::G, Regime::H, Regime::P];

    /// What it measures, for the tables' headings.
    pub fn title(self) -> &'static str {
        match self {
            Regime::G => "G: the caller's batches on the GPU (execute_device), the table cached whole",
            Regime::H => {
                "H: the caller on the host through the public host API (GpHash::pipeline), the table cached whole"
            }
            Regime::P => "P: the table past its cache (device batches)",
        }
    }
}

impl std::str::FromStr for Regime {
    type Err = gphash::Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "g" => Ok(Regime::G),
            "h" => Ok(Regime::H),
            "p" => Ok(Regime::P),
            _ => Err(gphash::Error::InvalidConfig(format!("regime {s:?}: one of g, h, p"))),
        }
    }
}

/// What a scoreboard runs.
#[derive(Clone, Debug)]
pub struct Scoreboard {
    /// Regimes, in this order.
    pub regimes: Vec<Regime>,
    /// Records loaded in G and H.
    pub records: u64,
    /// Records loaded in P.
    pub past_records: u64,
    /// Device memory the cache may take in P, in bytes.
    pub past_cache_bytes: u64,
    /// Workloads after the load.
    pub workloads: Vec<Workload>,
    /// Key distributions, each workload run under every one.
    pub distributions: Vec<Distribution>,
    /// Operations of each workload.
    pub ops: u64,
    /// Batch sizes of the gphash systems.
    pub batches: Vec<usize>,
    /// Key width.
    pub key_bytes: u32,
    /// Value size.
    pub value_bytes: u32,
    /// Runs of each workload.
    pub reps: usize,
    /// Seed of the workloads.
    pub seed: u64,
    /// Directory of the pools.
    pub pool_dir: PathBuf,
    /// Host threads of the peer.
    pub cpu_threads: usize,
    /// Lanes that serve one operation in the gphash systems.
    pub tile: u32,
}

/// One row of a regime's table: a gphash system's record of a workload beside the peer's.
#[derive(Clone, Debug)]
pub struct Row {
    /// The regime.
    pub regime: Regime,
    /// gphash's record.
    pub gphash: Record,
    /// The best crate's record.
    pub peer: Record,
    /// The crate that was best.
    pub peer_crate: String,
    /// The operation rate the run's measured ceilings allow gphash (0: not measured): in G the
    /// device memory's random-request rate over the modelled requests of an operation (the
    /// table is cached whole), in H the PCIe wire ([`wire_ceiling`]), in P host memory's
    /// random-request rates over the modelled requests (the cache not counted).
    pub ceiling: f64,
}

impl Row {
    /// gphash's rate over the peer's.
    pub fn ratio(&self) -> f64 {
        self.gphash.ops_per_s / self.peer.ops_per_s.max(1e-12)
    }
}

/// Everything one scoreboard measured.
#[derive(Debug)]
pub struct Results {
    /// The rows, regime by regime.
    pub rows: Vec<Row>,
    /// Every record of the runs behind them, with the regime each belongs to.
    pub records: Vec<(Regime, Record)>,
}

impl Scoreboard {
    /// The suite of a regime: its systems, table size and cache.
    fn suite(&self, regime: Regime) -> Suite {
        let (systems, records, cache) = match regime {
            Regime::G => (vec![SystemKind::ZeroCopy], self.records, whole_cache()),
            Regime::H => (vec![SystemKind::Host], self.records, whole_cache()),
            Regime::P => (
                vec![SystemKind::ZeroCopy, SystemKind::NoCache],
                self.past_records,
                CacheOptions {
                    ratio: Some(1.0),
                    max_bytes: Some(self.past_cache_bytes),
                    ..CacheOptions::default()
                },
            ),
        };
        Suite {
            workloads: self.workloads.clone(),
            systems,
            key_bytes: vec![self.key_bytes],
            value_bytes: self.value_bytes,
            records,
            micro_ops: self.ops,
            macro_ops: self.ops,
            batches: self.batches.clone(),
            load_batch: *self.batches.iter().max().unwrap_or(&(1 << 16)),
            distributions: self.distributions.iter().copied().map(Some).collect(),
            seed: self.seed,
            pool_dir: self.pool_dir.clone(),
            cpu_threads: self.cpu_threads,
            cache,
            tile: self.tile,
            reps: self.reps,
            in_flight: false,
            keep_pools: false,
        }
    }

    /// Runs every regime with the peer at its record count (G and H share one peer run);
    /// `ceilings` were measured in the same process; `record` hears of every record made.
    pub fn run(
        &self,
        gpu: &Arc<Gpu>,
        ceilings: &[(Memory, Ceilings)],
        progress: &dyn Fn(u64),
        record: &mut dyn FnMut(Regime, &Record),
    ) -> Result<Results> {
        // Refused before any run rather than after gphash's.
        crate::systems::cpu_map::supports(self.key_bytes as usize, self.value_bytes as usize)?;
        let mut records: Vec<(Regime, Record)> = vec![];
        let mut peer_of_cached: Option<Vec<Record>> = None;
        for &regime in &self.regimes {
            let mut suite = self.suite(regime);
            let shares_peer = regime != Regime::P && peer_of_cached.is_some();
            if !shares_peer {
                suite.systems.push(SystemKind::CpuMap);
            }
            let got = runner::run(&suite, gpu, ceilings, progress, &mut |r| record(regime, r))?;
            if regime != Regime::P && peer_of_cached.is_none() {
                peer_of_cached =
                    Some(got.iter().filter(|r| r.system.starts_with("cpu-map")).cloned().collect());
            }
            if shares_peer {
                records.extend(peer_of_cached.iter().flatten().map(|r| (regime, r.clone())));
            }
            records.extend(got.into_iter().map(|r| (regime, r)));
        }
        let rows = self.rows(&records, ceilings);
        Ok(Results { rows, records })
    }

    /// The rows of every regime, from its records.
    fn rows(&self, records: &[(Regime, Record)], ceilings: &[(Memory, Ceilings)]) -> Vec<Row> {
        let of_memory = |memory| ceilings.iter().find(|(m, _)| *m == memory).map(|(_, c)| c);
        let (host, device) = (of_memory(Memory::Host), of_memory(Memory::Device));
        let mut rows = vec![];
        for &regime in &self.regimes {
            let of = |system: &str, workload: &str| {
                records.iter().find(|(g, r)| *g == regime && r.system == system && r.workload == workload)
            };
            let systems = self.suite(regime).systems;
            for (workload, name) in self.workload_names() {
                let Some((_, peer)) = of(runner::BEST, &name) else { continue };
                for kind in &systems {
                    for (_, g) in records
                        .iter()
                        .filter(|(g, r)| *g == regime && r.system == kind.name() && r.workload == name)
                    {
                        let ceiling = match regime {
                            Regime::G => device.map_or(0.0, |c| c.reads() / g.requests_per_op.max(1e-12)),
                            Regime::H => host
                                .map_or(0.0, |c| wire_ceiling(c, workload, self.key_bytes, self.value_bytes)),
                            Regime::P => g.ceiling_ops_per_s,
                        };
                        let peer_crate = runner::best_crate(&peer.setting).to_string();
                        rows.push(Row { regime, gphash: g.clone(), peer: peer.clone(), peer_crate, ceiling });
                    }
                }
            }
        }
        rows
    }

    /// Each workload with its name in the records, the load first.
    fn workload_names(&self) -> Vec<(Workload, String)> {
        let mut out = vec![(Workload::Load, "load".to_string())];
        for &w in self.workloads.iter().filter(|w| **w != Workload::Load) {
            for &d in &self.distributions {
                out.push((w, runner::run_name(w, Some(d), self.distributions.len())));
            }
        }
        out
    }
}

/// The cache of G and H: every group.
fn whole_cache() -> CacheOptions {
    CacheOptions { ratio: Some(1.0), ..CacheOptions::default() }
}

/// The rate at which host batches of `workload` can cross PCIe, each direction at the rate
/// the GPU reads (`seq_read`) or writes (`seq_write`) host memory, for the bytes the
/// operations need (not those an encoding moves): a kind word, the key and any value written
/// in; a status word and any value read out.
pub fn wire_ceiling(host: &Ceilings, workload: Workload, key_bytes: u32, value_bytes: u32) -> f64 {
    let m = workload.mix();
    let (k, v) = (key_bytes as f64, value_bytes as f64);
    let (reads, writes) = match workload {
        Workload::Load => (0.0, 1.0),
        _ => (m.read + m.read_modify_write, m.update + m.insert + m.read_modify_write),
    };
    let ops = reads + writes + m.delete;
    let inward = ops * (4.0 + k) + writes * v;
    let outward = ops * 4.0 + reads * v;
    let secs = (inward / host.seq_read).max(outward / host.seq_write);
    if secs > 0.0 { 1.0 / secs } else { 0.0 }
}

/// The scoreboard as Markdown: one table per regime, its settings under it.
pub fn markdown(board: &Scoreboard, results: &Results, device: &str) -> String {
    let mut s = String::new();
    for regime in &board.regimes {
        let rows: Vec<&Row> = results.rows.iter().filter(|r| r.regime == *regime).collect();
        let records = if *regime == Regime::P { board.past_records } else { board.records };
        let _ = writeln!(s, "### {}\n", regime.title());
        let _ = writeln!(
            s,
            "{records} records, {}-byte keys, {}-byte values, {} operations a workload, {} runs each; {device}\n",
            board.key_bytes, board.value_bytes, board.ops, board.reps
        );
        let _ = writeln!(
            s,
            "| workload | system | batch | gphash M ops/s (min-max) | best CPU map M ops/s (min-max) | gphash / CPU map | ceiling M ops/s (gphash's share) |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|");
        for r in rows {
            let ceiling = if r.ceiling > 0.0 {
                format!("{:.1} ({:.0}%)", r.ceiling / 1e6, 100.0 * r.gphash.ops_per_s / r.ceiling)
            } else {
                "not measured".into()
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} {} | {:.2}x | {ceiling} |",
                r.gphash.workload,
                r.gphash.system,
                r.gphash.batch,
                rate(&r.gphash),
                rate(&r.peer),
                r.peer_crate,
                r.ratio()
            );
        }
        if let Some(r) = results.rows.iter().find(|r| r.regime == *regime) {
            let _ = writeln!(s, "\ngphash: {}\n", r.gphash.setting);
        }
        let behind: Vec<String> = results
            .rows
            .iter()
            .filter(|r| r.regime == *regime && r.ratio() < 1.0)
            .map(|r| format!("{} ({})", r.gphash.workload, r.gphash.system))
            .collect();
        if !behind.is_empty() {
            let _ = writeln!(s, "Behind the CPU map: {}.\n", behind.join(", "));
        }
    }
    s
}

/// A record's median rate with its slowest and fastest, in M ops/s.
fn rate(r: &Record) -> String {
    format!("{:.1} ({:.1}-{:.1})", r.ops_per_s / 1e6, r.ops_per_s_min / 1e6, r.ops_per_s_max / 1e6)
}

/// Writes `scoreboard.md` and every record (JSON and CSV, a file pair per regime) to `dir`.
pub fn write_files(
    board: &Scoreboard,
    results: &Results,
    device: &str,
    ceilings: &[(Memory, Ceilings)],
    round_trips: &[RoundTrip],
    dir: &Path,
) -> Result<()> {
    let io = |what: String| move |source| gphash::Error::Io { what, source };
    for regime in &board.regimes {
        let of: Vec<Record> =
            results.records.iter().filter(|(g, _)| g == regime).map(|(_, r)| r.clone()).collect();
        let sub = dir.join(format!("{regime:?}").to_lowercase());
        runner::write_files(&of, ceilings, round_trips, &sub)?;
    }
    let path = dir.join("scoreboard.md");
    std::fs::write(&path, markdown(board, results, device)).map_err(io(format!("writing {}", path.display())))
}
