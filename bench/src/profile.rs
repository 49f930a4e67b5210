//! `gphash bench profile`: where a batch's time goes, stage by stage (see [`gphash::Profile`]),
//! and on the GPU kernel by kernel (timestamp queries, where the device has them), for search
//! batches (YCSB C, uniform) and insert batches of several sizes, each held to the latency
//! floor measured in the same run: the bare wgpu round trip of as many words.

use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;

use gphash::{
    Activity, Batch, Config, Error, Executor, GpHash, Gpu, KernelTimes, OpKind, Options, Placement, Profile,
    Result,
};

use crate::basic::{key, spread};
use crate::ceiling::{self, RoundTrip};
use crate::systems::DeviceOps;
use crate::vulkan_trip::VulkanRoundTripper;
use crate::ycsb::Uniform;

/// What to profile.
#[derive(Clone, Debug)]
pub struct ProfileBench {
    /// Keys loaded before the measured batches.
    pub keys: u64,
    /// Operations per batch: one table per size.
    pub batches: Vec<usize>,
    /// Repetitions of each measurement (medians, minima and maxima over them).
    pub reps: usize,
    /// Batches in one repetition.
    pub rounds: usize,
    /// Key width.
    pub key_bytes: u32,
    /// Value size.
    pub value_bytes: u32,
    /// Seed of the searched keys.
    pub seed: u64,
    /// Repetitions of the round trip measured at each batch size (the floor).
    pub floor_reps: usize,
    /// Directory of the pool.
    pub pool_dir: PathBuf,
    /// Run each repetition's batches through a [`gphash::Pipeline`] (two in flight) instead
    /// of one `execute_ordered` call at a time; device batches through a
    /// [`gphash::DevicePipeline`].
    pub pipeline: bool,
    /// Run a whole loading phase of the bucket cache after loading the keys (no-op without a
    /// cache), so that the batches measure a loaded cache.
    pub load_cache: bool,
    /// Run the batches as [`gphash::DeviceBatch`]es (`execute_device`): their inputs are
    /// uploaded to device buffers before the timing and their results stay there.
    pub device: bool,
    /// Instead of the stages: this many pairs per repetition of one bare round trip and one
    /// batch (of gets, then of inserts of new keys), timed one after the other, with the
    /// kernels untimed ([`Alternated`]).
    pub alternate: usize,
}

/// One repetition: its batches' wall time and what the index's counters say of it.
#[derive(Clone, Copy, Debug)]
pub struct Rep {
    /// Wall time of its batches (the calls, nothing around them).
    pub wall: Duration,
    /// Time by stage.
    pub profile: Profile,
    /// `Activity::engine_time`: the engine stages of `profile` and the rest of the engine.
    pub engine: Duration,
    /// `Activity::host_time`: the host stages of `profile`.
    pub host: Duration,
}

impl Rep {
    fn between(wall: Duration, before: &Activity, after: &Activity) -> Self {
        Rep {
            wall,
            profile: after.profile.since(&before.profile),
            engine: after.engine_time - before.engine_time,
            host: after.host_time - before.host_time,
        }
    }

    /// The stages of [`Profile`], then the engine's time outside them.
    pub fn stages(&self) -> Vec<(&'static str, Duration)> {
        let mut stages = self.profile.stages().to_vec();
        stages.push(("engine other", self.engine.saturating_sub(self.profile.engine_stages())));
        stages
    }

    /// The sum of [`Rep::stages`].
    pub fn accounted(&self) -> Duration {
        self.stages().iter().map(|&(_, t)| t).sum()
    }
}

/// One workload at one batch size.
#[derive(Clone, Debug)]
pub struct Measured {
    /// `search` or `insert`.
    pub workload: &'static str,
    /// Operations per batch.
    pub batch: usize,
    /// Batches per repetition.
    pub rounds: usize,
    /// The repetitions.
    pub reps: Vec<Rep>,
    /// The bare wgpu round trip of `batch` words, measured in the same run (`None`: no GPU).
    pub floor: Option<RoundTrip>,
    /// Why the kernels are not timed one by one, where they are not.
    pub untimed: Option<String>,
}

impl fmt::Display for Measured {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let (wall, wall_min, wall_max) = spread(self.reps.iter().map(|r| r.wall).collect());
        // The kernels start running during `submit` on some drivers (lavapipe).
        let (gpu_window, ..) = spread(self.reps.iter().map(|r| r.profile.submit + r.profile.wait).collect());
        writeln!(
            f,
            "# {} batches of {} operations: {} repetitions of {} batches (medians, min..max)",
            self.workload,
            self.batch,
            self.reps.len(),
            self.rounds
        )?;
        writeln!(
            f,
            "{:<NAME$} {:>11} {:>11} {:>7} {:>23}",
            "stage", "total ms", "ms/batch", "share", "min..max ms"
        )?;
        let mut row = |name: &str, times: Vec<Duration>| {
            let (median, min, max) = spread(times);
            writeln!(
                f,
                "{name:<NAME$} {:>11.3} {:>11.4} {:>6.1}% {:>11.3}..{:<11.3}",
                ms(median),
                ms(median) / self.rounds as f64,
                100.0 * median.as_secs_f64() / wall.as_secs_f64().max(f64::MIN_POSITIVE),
                ms(min),
                ms(max)
            )
        };
        let names: Vec<&str> = self.reps[0].stages().iter().map(|&(n, _)| n).collect();
        for (i, name) in names.iter().enumerate() {
            row(name, self.reps.iter().map(|r| r.stages()[i].1).collect())?;
        }
        row("unaccounted", self.reps.iter().map(|r| r.wall.saturating_sub(r.accounted())).collect())?;
        let kernels: Vec<KernelTimes> = self.reps.iter().map(|r| r.profile.kernels).collect();
        match &self.untimed {
            Some(why) => writeln!(f, "{:<NAME$} {:>11} ({why})", "gpu kernels", "n/a")?,
            None => {
                // Inside `submit` and `wait`: not added to the stages above. Kernels never run are left out.
                for (i, name) in KernelTimes::NAMES.iter().enumerate() {
                    if kernels.iter().any(|k| k.times[i] > Duration::ZERO) {
                        row(&format!("gpu {name}"), kernels.iter().map(|k| k.times[i]).collect())?;
                    }
                }
                row("gpu idle between kernels", kernels.iter().map(KernelTimes::idle).collect())?;
                row("gpu total", kernels.iter().map(|k| k.span).collect())?;
                let (span, ..) = spread(kernels.iter().map(|k| k.span).collect());
                writeln!(
                    f,
                    "{:<NAME$} {:>10.1}% (gpu total over submit + wait, medians)",
                    "gpu share of the wait",
                    100.0 * span.as_secs_f64() / gpu_window.as_secs_f64().max(f64::MIN_POSITIVE)
                )?;
            }
        }
        writeln!(
            f,
            "{:<NAME$} {:>11.3} {:>11.4} {:>6.1}% {:>11.3}..{:<11.3}",
            "wall",
            ms(wall),
            ms(wall) / self.rounds as f64,
            100.0,
            ms(wall_min),
            ms(wall_max)
        )?;
        match (&self.floor, self.floor_ratio()) {
            (Some(t), Some(ratio)) => writeln!(
                f,
                "{:<NAME$} {:>11.4} ms (min {:.4}, max {:.4}): a batch's wall p50 is {ratio:.2}x this floor",
                "round trip",
                ms(t.median),
                ms(t.min),
                ms(t.max)
            ),
            _ => writeln!(f, "{:<NAME$} {:>11} (no GPU)", "round trip", "n/a"),
        }
    }
}

/// The batches measured: uniform gets of the loaded keys, inserts of keys not loaded yet.
struct Batches {
    rng: Xoshiro256PlusPlus,
    uniform: Uniform,
    next_new: u64,
    key_bytes: usize,
    value_bytes: usize,
}

impl Batches {
    fn new(bench: &ProfileBench) -> Self {
        Batches {
            rng: Xoshiro256PlusPlus::seed_from_u64(bench.seed),
            uniform: Uniform::new(0, bench.keys.max(1)),
            next_new: bench.keys,
            key_bytes: bench.key_bytes as usize,
            value_bytes: bench.value_bytes as usize,
        }
    }

    /// A batch of `n` operations of `workload` (`search` or `insert`).
    fn next(&mut self, workload: &str, n: usize) -> Result<Batch> {
        let (kb, vb) = (self.key_bytes, self.value_bytes);
        if workload == "search" {
            let keys: Vec<u8> = (0..n).flat_map(|_| key(self.uniform.next(&mut self.rng), kb)).collect();
            Batch::of_kind(OpKind::Get, kb, vb, &keys, None)
        } else {
            let first = self.next_new;
            self.next_new += n as u64;
            let keys: Vec<u8> = (first..self.next_new).flat_map(|i| key(i, kb)).collect();
            Batch::of_kind(OpKind::Insert, kb, vb, &keys, Some(&vec![9; n * vb]))
        }
    }
}

/// A loaded table and what measures it.
struct Loaded {
    gpu: Option<std::sync::Arc<Gpu>>,
    untimed: Option<String>,
    index: GpHash,
    _dir: tempfile::TempDir,
}

/// Batches and bare round trips of as many words, timed in turn (`bench profile --alternate`):
/// both see the same clock and the same load of the host, so that the ratio of their medians
/// is the batch's cost over the latency floor.
#[derive(Clone, Debug)]
pub struct Alternated {
    /// `search` or `insert`.
    pub workload: &'static str,
    /// Operations per batch (and words per round trip).
    pub batch: usize,
    /// Device batches (`execute_device`), or host batches (`execute_ordered`).
    pub device: bool,
    /// Pairs per repetition.
    pub pairs: usize,
    /// Per repetition: the batches' and the round trips' times.
    pub reps: Vec<(Vec<Duration>, Vec<Duration>)>,
    /// Per repetition: the times of the same round trips through Vulkan itself, timed in
    /// each pair too ([`crate::vulkan_trip`]; none where the device imports no host memory).
    pub vulkan: Vec<Vec<Duration>>,
    /// Per repetition, the index's stages over its batches (the host's recording and
    /// submitting do not depend on the GPU's clock, unlike the batches' and round trips'
    /// times).
    pub stages: Vec<Profile>,
}

impl Alternated {
    /// Per repetition, the median batch over the median round trip.
    pub fn ratios(&self) -> Vec<f64> {
        self.reps
            .iter()
            .map(|(b, t)| {
                let (b, t) = (quantile(b, 0.5), quantile(t, 0.5));
                b.as_secs_f64() / t.as_secs_f64().max(f64::MIN_POSITIVE)
            })
            .collect()
    }
}

/// The `q` quantile of `xs` (not empty).
fn quantile(xs: &[Duration], q: f64) -> Duration {
    let mut xs = xs.to_vec();
    xs.sort();
    xs[((xs.len() - 1) as f64 * q).round() as usize]
}

impl fmt::Display for Alternated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let kind = if self.device { "device batches" } else { "host batches (execute_ordered)" };
        writeln!(
            f,
            "# {} batches of {} operations, {kind}, alternated with bare round trips of {} words (through wgpu, and through Vulkan itself): {} repetitions of {} pairs",
            self.workload,
            self.batch,
            self.batch,
            self.reps.len(),
            self.pairs
        )?;
        writeln!(
            f,
            "{:<4} {:>13} {:>13} {:>15} {:>15} {:>7} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "rep",
            "batch p50 ms",
            "batch p99 ms",
            "round trip p50",
            "round trip p99",
            "ratio",
            "Vulkan p50",
            "record µs",
            "submit µs",
            "wait µs",
            "other µs",
            "rest µs"
        )?;
        let per_batch = |secs: f64| secs * 1e6 / self.pairs.max(1) as f64;
        let mut ratios = self.ratios();
        let reps = self.reps.iter().zip(&self.vulkan).zip(&ratios).zip(&self.stages);
        for (i, ((((b, t), v), r), p)) in reps.enumerate() {
            // The other stages (encoding, queue writes, readback, decoding, ...), and what the
            // batch took beyond all stages: waiting for the last batch's tail, buffers made,
            // cache slices, error scopes, the index's and the engine's bookkeeping (signed:
            // stages that overlapped the batches' calls would show as negative).
            let staged: Duration = p.stages().iter().map(|(_, d)| *d).sum();
            let other = staged.saturating_sub(p.record + p.submit + p.wait);
            let rest = b.iter().sum::<Duration>().as_secs_f64() - staged.as_secs_f64();
            writeln!(
                f,
                "{i:<4} {:>13.4} {:>13.4} {:>15.4} {:>15.4} {r:>6.2}x {:>11.4} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                ms(quantile(b, 0.5)),
                ms(quantile(b, 0.99)),
                ms(quantile(t, 0.5)),
                ms(quantile(t, 0.99)),
                if v.is_empty() { f64::NAN } else { ms(quantile(v, 0.5)) },
                per_batch(p.record.as_secs_f64()),
                per_batch(p.submit.as_secs_f64()),
                per_batch(p.wait.as_secs_f64()),
                per_batch(other.as_secs_f64()),
                per_batch(rest)
            )?;
        }
        ratios.sort_by(f64::total_cmp);
        writeln!(
            f,
            "batch p50 over round trip p50: median {:.2}x (min {:.2}, max {:.2}) of {} repetitions",
            ratios[ratios.len() / 2],
            ratios[0],
            ratios[ratios.len() - 1],
            ratios.len()
        )?;
        // Each stage's time a batch over all repetitions: what "other" is made of.
        let mut all = Profile::default();
        self.stages.iter().for_each(|p| all += *p);
        let batches = (self.pairs * self.stages.len()).max(1) as f64;
        let stages = all.stages().map(|(name, d)| format!("{name} {:.1}", d.as_secs_f64() * 1e6 / batches));
        writeln!(f, "µs a batch by stage: {}", stages.join(", "))
    }
}

/// Width of a table's first column.
const NAME: usize = 24;

impl Measured {
    /// A batch's wall time (the median repetition's, per batch) over the round trip's median.
    pub fn floor_ratio(&self) -> Option<f64> {
        let floor = self.floor?;
        let (wall, ..) = spread(self.reps.iter().map(|r| r.wall).collect());
        Some(wall.as_secs_f64() / self.rounds as f64 / floor.median.as_secs_f64().max(f64::MIN_POSITIVE))
    }
}

impl ProfileBench {
    /// Opens the device and the table (kernels timed or not), with room for `inserted` more
    /// keys than it loads, and loads them.
    fn load(&self, options: &Options, time_kernels: bool, inserted: u64) -> Result<Loaded> {
        let vb = self.value_bytes as usize;
        let kb = self.key_bytes as usize;
        // The index and the round trips share one device, as `GpHash` would pick it.
        let gpu = match (options.executor, &options.device) {
            (Executor::Cpu, _) => None,
            (_, Some(g)) => Some(g.clone()),
            (Executor::Auto, None) => Gpu::new().inspect_err(|e| log::warn!("no GPU: {e}")).ok(),
            (Executor::Gpu, None) => Some(Gpu::new()?),
        };
        let untimed = match &gpu {
            None => Some("the CPU engine runs no kernels".to_string()),
            Some(g) if !g.info.timestamps => Some(format!("{} has no timestamp queries", g.info.name)),
            Some(_) if !time_kernels => Some("kernels untimed".to_string()),
            Some(_) => None,
        };
        let options = Options {
            device: gpu.clone(),
            gpu: gphash::GpuOptions { time_kernels, ..options.gpu.clone() },
            ..options.clone()
        };
        if self.device && gpu.is_none() {
            return Err(Error::InvalidConfig("device batches need a GPU".into()));
        }
        let dir = crate::basic::pool_dir(&self.pool_dir)?;
        // Room for every insertion: no growth during a measurement.
        let config = Config {
            key_bytes: self.key_bytes,
            value_bytes: self.value_bytes,
            capacity: self.keys + inserted,
            ..Config::default()
        };
        // A volatile table has no pool file.
        let path = (options.gpu.placement != Placement::Volatile).then(|| dir.path().join("profile.pool"));
        let index = GpHash::create(path.as_deref(), &config, &options)?;
        let load = 1 << 16;
        for start in (0..self.keys).step_by(load) {
            let end = (start + load as u64).min(self.keys);
            let keys: Vec<u8> = (start..end).flat_map(|i| key(i, kb)).collect();
            index.insert(&keys, &vec![7; (end - start) as usize * vb])?;
        }
        if self.load_cache {
            index.load_cache()?;
        }
        Ok(Loaded { gpu, untimed, index, _dir: dir })
    }

    /// Loads the keys, then measures search and insert batches at each batch size; `report`
    /// is given each measurement as it completes.
    pub fn run(&self, options: &Options, report: &mut dyn FnMut(&Measured)) -> Result<Vec<Measured>> {
        let (reps, rounds) = (self.reps.max(1), self.rounds.max(1));
        let inserted: u64 = self.batches.iter().map(|&b| (b * reps * rounds) as u64).sum();
        let Loaded { gpu, untimed, index, _dir } = self.load(options, true, inserted)?;
        let mut make = Batches::new(self);
        let mut out = vec![];
        for &batch in &self.batches {
            let floor = match &gpu {
                Some(g) => Some(ceiling::round_trips(g, &[batch as u64], self.floor_reps)?[0]),
                None => None,
            };
            for workload in ["search", "insert"] {
                let mut measured =
                    Measured { workload, batch, rounds, reps: vec![], floor, untimed: untimed.clone() };
                for _ in 0..reps {
                    let batches =
                        (0..rounds).map(|_| make.next(workload, batch)).collect::<Result<Vec<_>>>()?;
                    let uploaded: Vec<DeviceOps> = match &gpu {
                        Some(g) if self.device => {
                            let ops = batches.iter().map(|b| DeviceOps::new(g, b)).collect();
                            // The buffers' contents reach the device with the next submit: an
                            // empty one, waited for, so that the timed batches do not carry it.
                            g.submit([]);
                            g.wait()?;
                            ops
                        }
                        _ => vec![],
                    };
                    let before = index.activity();
                    let t = Instant::now();
                    if self.device && self.pipeline {
                        let mut p = index.device_pipeline();
                        for ops in &uploaded {
                            p.submit(ops.batch())?;
                            while p.pending() > 1 {
                                p.next().expect("a batch is pending")?;
                            }
                        }
                        for r in p {
                            r?;
                        }
                    } else if self.device {
                        for ops in &uploaded {
                            index.execute_device(&ops.batch())?;
                        }
                    } else if self.pipeline {
                        // Each batch's keys are distinct: `execute` and `execute_ordered` agree.
                        let mut p = index.pipeline();
                        for b in batches {
                            p.submit(b)?;
                            while p.pending() > 1 {
                                p.next().expect("a batch is pending")?;
                            }
                        }
                        for r in p {
                            r?;
                        }
                    } else {
                        for b in &batches {
                            index.execute_ordered(b)?;
                        }
                    }
                    let wall = t.elapsed();
                    measured.reps.push(Rep::between(wall, &before, &index.activity()));
                }
                report(&measured);
                out.push(measured);
            }
        }
        index.close()?;
        Ok(out)
    }

    /// At each batch size, for batches of uniform gets and then of inserts of new keys,
    /// [`ProfileBench::alternate`] pairs per repetition of a bare round trip and a batch (a
    /// device batch with [`ProfileBench::device`]), after half a second of them untimed so
    /// that the GPU's clock is up.
    pub fn alternated(
        &self,
        options: &Options,
        report: &mut dyn FnMut(&Alternated),
    ) -> Result<Vec<Alternated>> {
        if self.alternate == 0 {
            return Err(Error::InvalidConfig("alternated batches need at least one pair".into()));
        }
        // The warm-up searches.
        const WARM_UP: Duration = Duration::from_millis(500);
        let inserted: u64 =
            self.batches.iter().map(|&b| (b * self.alternate * self.reps.max(1)) as u64).sum();
        let Loaded { gpu, index, _dir, .. } = self.load(options, false, inserted)?;
        let gpu = gpu.ok_or_else(|| Error::InvalidConfig("a round trip needs a GPU".into()))?;
        let mut make = Batches::new(self);
        // A device batch's buffers are the same from batch to batch, as an application's on the
        // GPU would be. Its next operations are uploaded before it runs and not waited for, so
        // the timed batch may wait for their copy. (With a host wait for them, the round trips
        // of a run of device batches were slower than in a run of host batches; the cause was
        // not isolated: docs/lab/latency.md, "Batches timed in turn with the round trip".)
        let mut live: Option<DeviceOps> = None;
        let mut run = |batch: &Batch| -> Result<Duration> {
            if self.device {
                let ops = DeviceOps::reuse(&mut live, &gpu, batch);
                let t = Instant::now();
                index.execute_device(&ops.batch())?;
                Ok(t.elapsed())
            } else {
                let t = Instant::now();
                let result = index.execute_ordered(batch)?;
                let took = t.elapsed();
                // Every key searched was loaded; every key inserted is new.
                if let Some(i) = result.statuses.iter().position(|&s| s != gphash::Status::Ok) {
                    return Err(Error::Inconsistent(format!(
                        "operation {i} of a batch: {:?}",
                        result.statuses[i]
                    )));
                }
                Ok(took)
            }
        };
        let mut out = vec![];
        for &n in &self.batches {
            let mut trips = ceiling::RoundTripper::new(&gpu, n as u64)?;
            let mut vulkan = VulkanRoundTripper::on(&gpu, n as u64, &ceiling::round_trip_source())?;
            for workload in ["search", "insert"] {
                let warm = Instant::now();
                while warm.elapsed() < WARM_UP {
                    trips.once()?;
                    vulkan.as_mut().map(VulkanRoundTripper::once).transpose()?;
                    run(&make.next("search", n)?)?;
                }
                let mut measured = Alternated {
                    workload,
                    batch: n,
                    device: self.device,
                    pairs: self.alternate,
                    reps: vec![],
                    vulkan: vec![],
                    stages: vec![],
                };
                for _ in 0..self.reps.max(1) {
                    let (mut batches, mut floor, mut raw) = (vec![], vec![], vec![]);
                    let before = index.activity().profile;
                    for _ in 0..self.alternate {
                        let batch = make.next(workload, n)?;
                        floor.push(trips.once()?);
                        raw.extend(vulkan.as_mut().map(VulkanRoundTripper::once).transpose()?);
                        batches.push(run(&batch)?);
                    }
                    measured.stages.push(index.activity().profile.since(&before));
                    measured.reps.push((batches, floor));
                    measured.vulkan.push(raw);
                }
                report(&measured);
                out.push(measured);
            }
        }
        drop(live);
        index.close()?;
        Ok(out)
    }
}
