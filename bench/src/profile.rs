//! `gphash bench profile`: where a batch's time goes, stage by stage (see [`gphash::Profile`]),
//! for search batches (YCSB C, uniform) and insert batches of several sizes.

use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;

use gphash::{Activity, Batch, Config, GpHash, OpKind, Options, Profile, Result};

use crate::basic::key;
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
    /// Directory of the pool.
    pub pool_dir: PathBuf,
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
}

/// Median, minimum and maximum.
fn spread(mut xs: Vec<Duration>) -> (Duration, Duration, Duration) {
    xs.sort();
    (xs[xs.len() / 2], xs[0], xs[xs.len() - 1])
}

impl fmt::Display for Measured {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let (wall, wall_min, wall_max) = spread(self.reps.iter().map(|r| r.wall).collect());
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
            "{:<14} {:>11} {:>11} {:>7} {:>23}",
            "stage", "total ms", "ms/batch", "share", "min..max ms"
        )?;
        let mut row = |name: &str, times: Vec<Duration>| {
            let (median, min, max) = spread(times);
            writeln!(
                f,
                "{name:<14} {:>11.3} {:>11.4} {:>6.1}% {:>11.3}..{:<11.3}",
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
        writeln!(
            f,
            "{:<14} {:>11} (the device is opened without timestamp queries: kernels are not timed one by one)",
            "gpu kernels", "n/a"
        )?;
        writeln!(
            f,
            "{:<14} {:>11.3} {:>11.4} {:>6.1}% {:>11.3}..{:<11.3}",
            "wall",
            ms(wall),
            ms(wall) / self.rounds as f64,
            100.0,
            ms(wall_min),
            ms(wall_max)
        )
    }
}

impl ProfileBench {
    /// Loads the keys, then measures search and insert batches at each batch size; `report`
    /// is given each measurement as it completes.
    pub fn run(&self, options: &Options, report: &mut dyn FnMut(&Measured)) -> Result<Vec<Measured>> {
        let (kb, vb) = (self.key_bytes as usize, self.value_bytes as usize);
        let (reps, rounds) = (self.reps.max(1), self.rounds.max(1));
        let inserted: u64 = self.batches.iter().map(|&b| (b * reps * rounds) as u64).sum();
        let dir = crate::basic::pool_dir(&self.pool_dir)?;
        // Room for every insertion: no growth during a measurement.
        let config = Config {
            key_bytes: self.key_bytes,
            value_bytes: self.value_bytes,
            capacity: self.keys + inserted,
            ..Config::default()
        };
        let index = GpHash::create(Some(&dir.path().join("profile.pool")), &config, options)?;
        let load = 1 << 16;
        for start in (0..self.keys).step_by(load) {
            let end = (start + load as u64).min(self.keys);
            let keys: Vec<u8> = (start..end).flat_map(|i| key(i, kb)).collect();
            index.insert(&keys, &vec![7; (end - start) as usize * vb])?;
        }
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(self.seed);
        let uniform = Uniform::new(0, self.keys.max(1));
        let mut next_new = self.keys;
        let mut out = vec![];
        for &batch in &self.batches {
            for workload in ["search", "insert"] {
                let mut measured = Measured { workload, batch, rounds, reps: vec![] };
                for _ in 0..reps {
                    let batches = (0..rounds)
                        .map(|_| {
                            let ids: Vec<u64> = if workload == "search" {
                                (0..batch).map(|_| uniform.next(&mut rng)).collect()
                            } else {
                                next_new += batch as u64;
                                (next_new - batch as u64..next_new).collect()
                            };
                            let keys: Vec<u8> = ids.iter().flat_map(|&i| key(i, kb)).collect();
                            match workload {
                                "search" => Batch::of_kind(OpKind::Get, kb, vb, &keys, None),
                                _ => {
                                    Batch::of_kind(OpKind::Insert, kb, vb, &keys, Some(&vec![9; batch * vb]))
                                }
                            }
                        })
                        .collect::<Result<Vec<_>>>()?;
                    let before = index.activity();
                    let t = Instant::now();
                    for b in &batches {
                        index.execute_ordered(b)?;
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
}
