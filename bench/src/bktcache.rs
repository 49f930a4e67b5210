//! The bucket cache's figures (`gphash bench cache`): throughput with cache ratios, under skew,
//! per policy, and over time across loading phases. One table is loaded once; each point sets a
//! new cache on it ([`GpHash::set_cache`]), runs a warm-up whose accesses the policy counts,
//! loads the cache on demand ([`GpHash::load_cache`]) and measures with membership frozen.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::plots;
use crate::runner::quantile_ms;
use crate::systems::DeviceOps;
use crate::ycsb::{Distribution, Generator, Workload, batch_of};
use gphash::Gpu;
use gphash::{CacheOptions, CacheStatus, Policy};
use gphash::{Config, Executor, GpHash, Options};
use gphash::{Error, Result};
use gphash::{GpuOptions, Placement};

/// What `gphash bench cache` runs.
#[derive(Clone, Debug)]
pub struct CacheBench {
    /// Records loaded.
    pub records: u64,
    /// Measured operations of each repetition of a point.
    pub ops: u64,
    /// Repetitions of each point (its figure is their median).
    pub reps: usize,
    /// Operations before the cache of a point is loaded.
    pub warmup: u64,
    /// Operations per batch.
    pub batch: usize,
    /// Key width.
    pub key_bytes: u32,
    /// Value size.
    pub value_bytes: u32,
    /// Workloads of the ratio section.
    pub workloads: Vec<Workload>,
    /// Cache ratios of the ratio section (0: no cache).
    pub ratios: Vec<f64>,
    /// Zipfian constants of the skew section (workload C, no cache and `ratio`).
    pub thetas: Vec<f64>,
    /// Policies of the policy section (workloads A and C at `ratio`).
    pub policies: Vec<Policy>,
    /// The cache ratio of the skew, policy and timeline sections.
    pub ratio: f64,
    /// Operations of the timeline (workload C, loading every `period`; 0: no timeline).
    pub timeline_ops: u64,
    /// Operations between loading phases in the timeline.
    pub period: u64,
    /// Seed.
    pub seed: u64,
    /// Directory of the pool (`/dev/shm` for zero-copy).
    pub pool_dir: PathBuf,
}

/// One measured configuration.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    /// `ratio`, `skew` or `policy`.
    pub section: String,
    /// Workload.
    pub workload: String,
    /// Zipfian constant.
    pub theta: f64,
    /// Cache ratio (0: none).
    pub ratio: f64,
    /// Policy.
    pub policy: String,
    /// Operations per second (median of the repetitions).
    pub ops_per_s: f64,
    /// Median batch latency, ms.
    pub p50_ms: f64,
    /// 99th-percentile batch latency, ms.
    pub p99_ms: f64,
    /// Hit rate while measuring.
    pub hit_rate: f64,
    /// Requests to host memory saved per operation while measuring.
    pub saved_requests_per_op: f64,
}

/// One batch of the timeline.
#[derive(Clone, Debug, Serialize)]
pub struct Tick {
    /// End of the batch, seconds since the timeline started.
    pub t_s: f64,
    /// Its duration, seconds (a loading slice before it included).
    pub secs: f64,
    /// Its operations.
    pub ops: u64,
    /// Whether a loading slice ran before it.
    pub loading: bool,
    /// Hit rate of its operations.
    pub hit_rate: f64,
}

/// What the timeline shows: throughput before the first loading phase, during loading phases,
/// and between them once the cache is full.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TimelineSummary {
    /// Operations per second of the batches before the first loading phase (cold cache).
    pub cold_ops_per_s: f64,
    /// Of the batches during loading phases.
    pub loading_ops_per_s: f64,
    /// Of the batches between loading phases once one has completed.
    pub steady_ops_per_s: f64,
    /// Loading phases seen.
    pub loads: u64,
}

/// Everything `gphash bench cache` measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CacheFigures {
    /// The device.
    pub device: String,
    /// The configurations measured.
    pub points: Vec<Point>,
    /// The timeline's batches.
    pub timeline: Vec<Tick>,
    /// Its summary.
    pub summary: TimelineSummary,
}

/// The cache's statistics, or zeros without a cache.
fn cache_counters(t: &GpHash) -> (u64, u64, i64, u64, bool) {
    match t.stats().cache {
        CacheStatus::On(s) => (s.hits, s.targets, s.requests_saved(), s.loads, s.loading),
        CacheStatus::Off { .. } => (0, 0, 0, 0, false),
    }
}

/// Runs up to `ops` operations of `g` (fewer when it ends first) in batches; returns each
/// batch's latency.
fn run(t: &GpHash, gpu: &Gpu, g: &mut Generator, ops: u64, b: &CacheBench) -> Result<Vec<Duration>> {
    let mut lat = vec![];
    let mut kept = None;
    let end = g.produced() + ops;
    while g.produced() < end && !g.done() {
        let n = b.batch.min((end - g.produced()) as usize);
        let batch = batch_of(&g.next_batch(n), b.key_bytes as usize, b.value_bytes as usize, b.seed);
        let device = DeviceOps::reuse(&mut kept, gpu, &batch);
        gpu.wait()?;
        let start = Instant::now();
        t.execute_device(&device.batch())?;
        lat.push(start.elapsed());
    }
    Ok(lat)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or_default()
}

impl CacheBench {
    /// Loads the table and measures every section; `progress` hears of each point as it is made.
    pub fn run(&self, gpu: &Arc<Gpu>, progress: &mut dyn FnMut(&str)) -> Result<CacheFigures> {
        let dir = crate::basic::pool_dir(&self.pool_dir)?;
        let options = Options {
            executor: Executor::Gpu,
            gpu: GpuOptions {
                placement: Placement::ZeroCopy,
                cache: CacheOptions::off(),
                ..GpuOptions::default()
            },
            device: Some(gpu.clone()),
            ..Options::default()
        };
        let config = Config {
            key_bytes: self.key_bytes,
            value_bytes: self.value_bytes,
            capacity: self.records,
            ..Config::default()
        };
        let t = GpHash::create(Some(&dir.path().join("cache.pool")), &config, &options)?;
        let mut load = Generator::new(Workload::Load, None, self.records, self.records, self.seed)?;
        run(&t, gpu, &mut load, self.records, self)?;
        progress(&format!("loaded {} records; {}", self.records, t.stats().mode));

        let mut out =
            CacheFigures { device: format!("{} ({})", gpu.info.name, gpu.info.driver), ..Default::default() };
        let zipf = |theta| Distribution::Zipfian { theta };
        let mut grid: Vec<(&str, Workload, f64, f64, Policy)> = vec![];
        for &w in &self.workloads {
            grid.extend(self.ratios.iter().map(|&r| ("ratio", w, 0.99, r, Policy::Lfu)));
        }
        for &theta in &self.thetas {
            grid.extend([0.0, self.ratio].map(|r| ("skew", Workload::C, theta, r, Policy::Lfu)));
        }
        for w in [Workload::A, Workload::C] {
            grid.extend(self.policies.iter().map(|&p| ("policy", w, 0.99, self.ratio, p)));
        }
        for (i, &(section, workload, theta, ratio, policy)) in grid.iter().enumerate() {
            let p = self.point(&t, gpu, (section, workload, zipf(theta), ratio, policy), i as u64)?;
            progress(&format!(
                "{section:<6} {workload:<3} theta {theta:<4} cache {:>3.0}% {policy:<6} {:8.2} Mops/s  p50 {:.3} ms  hit rate {:5.1}%",
                ratio * 100.0,
                p.ops_per_s / 1e6,
                p.p50_ms,
                p.hit_rate * 100.0
            ));
            out.points.push(p);
        }
        if self.timeline_ops > 0 {
            (out.timeline, out.summary) = self.timeline(&t, gpu)?;
            let s = &out.summary;
            progress(&format!(
                "timeline: cold {:.2} Mops/s, during {} loading phases {:.2} Mops/s, steady {:.2} Mops/s",
                s.cold_ops_per_s / 1e6,
                s.loads,
                s.loading_ops_per_s / 1e6,
                s.steady_ops_per_s / 1e6
            ));
        }
        t.close()?;
        Ok(out)
    }

    /// One point: a fresh cache, a warm-up, a load on demand, then `reps` measured runs.
    fn point(
        &self,
        t: &GpHash,
        gpu: &Gpu,
        (section, workload, dist, ratio, policy): (&str, Workload, Distribution, f64, Policy),
        index: u64,
    ) -> Result<Point> {
        t.set_cache(CacheOptions {
            ratio: Some(ratio),
            policy,
            period: u64::MAX,
            ..CacheOptions::default()
        })?;
        let total = self.warmup + self.ops * self.reps as u64;
        let seed = self.seed ^ (index + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut g = Generator::new(workload, Some(dist), self.records, total, seed)?;
        run(t, gpu, &mut g, self.warmup, self)?;
        t.load_cache()?;
        let (hits0, targets0, saved0, _, _) = cache_counters(t);
        let mut rates = vec![];
        let mut all = vec![];
        for _ in 0..self.reps {
            let lat = run(t, gpu, &mut g, self.ops, self)?;
            rates.push(self.ops as f64 / lat.iter().map(Duration::as_secs_f64).sum::<f64>());
            all.extend(lat);
        }
        let (hits, targets, saved, _, _) = cache_counters(t);
        let measured = (self.ops * self.reps as u64).max(1) as f64;
        Ok(Point {
            section: section.into(),
            workload: workload.to_string(),
            theta: match dist {
                Distribution::Zipfian { theta } => theta,
                _ => 0.0,
            },
            ratio,
            policy: policy.to_string(),
            ops_per_s: median(rates),
            p50_ms: quantile_ms(&all, 0.5),
            p99_ms: quantile_ms(&all, 0.99),
            hit_rate: if targets > targets0 {
                (hits - hits0) as f64 / (targets - targets0) as f64
            } else {
                0.0
            },
            saved_requests_per_op: (saved - saved0) as f64 / measured,
        })
    }

    /// Workload C with loading phases every `period` operations, batch by batch.
    fn timeline(&self, t: &GpHash, gpu: &Gpu) -> Result<(Vec<Tick>, TimelineSummary)> {
        let policy = Policy::Lfu;
        t.set_cache(CacheOptions {
            ratio: Some(self.ratio),
            policy,
            period: self.period,
            ..CacheOptions::default()
        })?;
        let mut g = Generator::new(Workload::C, None, self.records, self.timeline_ops, self.seed ^ 0x5EED)?;
        let mut ticks = vec![];
        let start = Instant::now();
        while !g.done() {
            let (hits0, targets0, _, loads0, loading0) = cache_counters(t);
            let before = g.produced();
            let lat = run(t, gpu, &mut g, self.batch as u64, self)?;
            let (hits, targets, _, loads, loading) = cache_counters(t);
            ticks.push(Tick {
                t_s: start.elapsed().as_secs_f64(),
                secs: lat.iter().map(Duration::as_secs_f64).sum(),
                ops: g.produced() - before,
                loading: loading0 || loading || loads > loads0,
                hit_rate: if targets > targets0 {
                    (hits - hits0) as f64 / (targets - targets0) as f64
                } else {
                    0.0
                },
            });
        }
        Ok((ticks.clone(), summarize(&ticks, cache_counters(t).3)))
    }
}

/// Throughput of the timeline's batches before, during and between loading phases.
fn summarize(ticks: &[Tick], loads: u64) -> TimelineSummary {
    let rate = |sel: &dyn Fn(usize, &Tick) -> bool| {
        let (ops, secs) = ticks
            .iter()
            .enumerate()
            .filter(|(i, t)| sel(*i, t))
            .fold((0u64, 0.0), |(o, s), (_, t)| (o + t.ops, s + t.secs));
        if secs > 0.0 { ops as f64 / secs } else { 0.0 }
    };
    let first_load = ticks.iter().position(|t| t.loading).unwrap_or(ticks.len());
    let first_done = first_load + ticks[first_load..].iter().position(|t| !t.loading).unwrap_or(0);
    TimelineSummary {
        cold_ops_per_s: rate(&|i, _| i < first_load),
        loading_ops_per_s: rate(&|_, t| t.loading),
        steady_ops_per_s: rate(&|i, t| i >= first_done && first_done > first_load && !t.loading),
        loads,
    }
}

/// Draws the figures as SVG files in `dir`: throughput per cache ratio for each workload, under
/// skew, per policy, and over time across loading phases.
pub fn plot(figures: &CacheFigures, dir: &std::path::Path) -> Result<()> {
    let section = |name: &'static str| figures.points.iter().filter(move |p| p.section == name);
    let pct = |r: f64| format!("cache {:.0}%", r * 100.0);
    let ratios: Vec<&Point> = section("ratio").collect();
    if !ratios.is_empty() {
        let workloads = plots::distinct(ratios.iter().map(|p| &p.workload));
        let series = plots::distinct(ratios.iter().map(|p| pct(p.ratio)));
        let value = |w: usize, s: usize| {
            ratios
                .iter()
                .find(|p| p.workload == workloads[w] && pct(p.ratio) == series[s])
                .map(|p| p.ops_per_s / 1e6)
        };
        let caption = format!("bucket cache (LFU, Zipfian 0.99) on {}", figures.device);
        plots::grouped_bars(
            &dir.join("cache-ratios.svg"),
            caption,
            ("YCSB workload", &workloads),
            &series,
            value,
        )?;
    }
    let skew: Vec<&Point> = section("skew").collect();
    if !skew.is_empty() {
        let series: Vec<plots::Line> = plots::distinct(skew.iter().map(|p| pct(p.ratio)))
            .into_iter()
            .map(|name| {
                let pts =
                    skew.iter().filter(|p| pct(p.ratio) == name).map(|p| (p.theta, p.ops_per_s / 1e6, false));
                let pts = pts.collect();
                (name, pts)
            })
            .collect();
        let caption = "YCSB C: throughput against the Zipfian constant".to_string();
        plots::lines(&dir.join("cache-skew.svg"), caption, ("Zipfian constant", "M operations/s"), &series)?;
    }
    let policies: Vec<&Point> = section("policy").collect();
    if !policies.is_empty() {
        let workloads = plots::distinct(policies.iter().map(|p| &p.workload));
        let series = plots::distinct(policies.iter().map(|p| &p.policy));
        let value = |w: usize, s: usize| {
            policies
                .iter()
                .find(|p| p.workload == workloads[w] && p.policy == series[s])
                .map(|p| p.ops_per_s / 1e6)
        };
        let caption = "cache policies (Zipfian 0.99)".to_string();
        plots::grouped_bars(
            &dir.join("cache-policies.svg"),
            caption,
            ("YCSB workload", &workloads),
            &series,
            value,
        )?;
    }
    if !figures.timeline.is_empty() {
        let pts = figures.timeline.iter().map(|t| (t.t_s, t.ops as f64 / t.secs.max(1e-9) / 1e6, t.loading));
        let series = vec![("YCSB C, batch by batch (red: loading)".to_string(), pts.collect())];
        let caption = "throughput across the cache's loading phases".to_string();
        plots::lines(&dir.join("cache-timeline.svg"), caption, ("time (s)", "M operations/s"), &series)?;
    }
    Ok(())
}

/// Writes the figures as JSON and CSV files in `dir`.
pub fn write_files(figures: &CacheFigures, dir: &std::path::Path) -> Result<()> {
    let io = |what: String| move |source| Error::Io { what, source };
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let path = dir.join("cache.json");
    std::fs::write(&path, serde_json::to_string_pretty(figures).expect("figures serialize"))
        .map_err(io(format!("writing {}", path.display())))?;
    let mut csv = String::from(
        "section,workload,theta,ratio,policy,ops_per_s,p50_ms,p99_ms,hit_rate,saved_requests_per_op\n",
    );
    for p in &figures.points {
        csv += &format!(
            "{},{},{},{},{},{:.1},{:.4},{:.4},{:.4},{:.3}\n",
            p.section,
            p.workload,
            p.theta,
            p.ratio,
            p.policy,
            p.ops_per_s,
            p.p50_ms,
            p.p99_ms,
            p.hit_rate,
            p.saved_requests_per_op
        );
    }
    let path = dir.join("cache.csv");
    std::fs::write(&path, csv).map_err(io(format!("writing {}", path.display())))?;
    let mut tl = String::from("t_s,secs,ops,loading,hit_rate\n");
    for t in &figures.timeline {
        tl += &format!("{:.6},{:.6},{},{},{:.4}\n", t.t_s, t.secs, t.ops, t.loading as u8, t.hit_rate);
    }
    let path = dir.join("cache-timeline.csv");
    std::fs::write(&path, tl).map_err(io(format!("writing {}", path.display())))
}
