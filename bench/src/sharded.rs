//! A sharded table loaded, searched, checked and reopened (`gphash bench sharded`): tables of
//! more keys than one table's 32-bit slot numbers reach, and the pauses of growth one shard at
//! a time.

use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use rayon::prelude::*;

use gphash::{Config, Error, Options, Result, ShardedGpHash, Status};

use crate::basic::{key, pool_dir, spread};

/// What to run.
#[derive(Clone, Debug)]
pub struct ShardedLoad {
    /// Keys inserted.
    pub keys: u64,
    /// Keys the table is made for (it grows past them, a shard at a time).
    pub capacity: u64,
    /// Shards.
    pub shards: usize,
    /// Operations per batch.
    pub batch: usize,
    /// Key width.
    pub key_bytes: u32,
    /// Value size.
    pub value_bytes: u32,
    /// Loaded keys searched afterwards, drawn at random, their values checked.
    pub searches: u64,
    /// The table's directory, kept after the run (`None`: a temporary one in `pool_dir`).
    pub table_dir: Option<PathBuf>,
    /// Open the table in `table_dir`, made and loaded by an earlier run with the same keys and
    /// widths, instead of making and loading one.
    pub existing: bool,
    /// With `existing`: load keys from this one up to `keys` into the opened table first (the
    /// rest of a load that was cut short).
    pub load_from: Option<u64>,
    /// Check every shard's consistency.
    pub check: bool,
    /// Directory in which the temporary table's directory is made.
    pub pool_dir: PathBuf,
}

/// Operations per second of a phase, and its batches' latencies.
#[derive(Clone, Debug)]
pub struct Phase {
    /// Operations.
    pub ops: u64,
    /// Wall time.
    pub time: Duration,
    /// Median, minimum and maximum batch latency (of a load, its batches that grew no shard);
    /// `None` without such batches.
    pub batches: Option<(Duration, Duration, Duration)>,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        write!(
            f,
            "{} ops in {:.1} s: {:.2} M/s; ",
            self.ops,
            self.time.as_secs_f64(),
            self.ops as f64 / self.time.as_secs_f64() / 1e6
        )?;
        match self.batches {
            Some((p50, min, max)) => {
                write!(f, "batch p50 {:.1} ms (min {:.1}, max {:.1})", ms(p50), ms(min), ms(max))
            }
            None if self.ops == 0 => write!(f, "no batch"),
            None => write!(f, "every batch grew a shard"),
        }
    }
}

/// A batch of the load during which shards grew.
#[derive(Clone, Copy, Debug)]
pub struct GrowthBatch {
    /// Keys loaded before it.
    pub after: u64,
    /// Shards that grew.
    pub growths: u64,
    /// Its latency.
    pub time: Duration,
}

/// What [`ShardedLoad`] measured.
#[derive(Clone, Debug)]
pub struct ShardedFigures {
    /// GPUs the shards ran on (0: the CPU model).
    pub gpus: usize,
    /// Making the table (pools, imports, engines), or opening it.
    pub start: (&'static str, Duration),
    /// Loading its keys.
    pub load: Option<Phase>,
    /// The load's batches during which shards grew.
    pub growth_batches: Vec<GrowthBatch>,
    /// Searching the sample.
    pub search: Option<Phase>,
    /// Keys over all shards, and the fewest and most in one shard.
    pub keys: (u64, u64, u64),
    /// Slots over all shards, and the most in one.
    pub slots: (u64, u64),
    /// Bytes of the pool files.
    pub pool_bytes: u64,
    /// The consistency check of every shard: its time and whether all passed.
    pub check: Option<(Duration, bool)>,
    /// A clean close, and the open after it.
    pub close: Duration,
    /// See `close`.
    pub reopen: Duration,
}

impl fmt::Display for ShardedFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = |d: Duration| d.as_secs_f64();
        writeln!(f, "gpus          {}", self.gpus)?;
        writeln!(f, "{:<13} {:.2} s", self.start.0, s(self.start.1))?;
        if let Some(load) = &self.load {
            writeln!(f, "load          {load}")?;
            let growths: u64 = self.growth_batches.iter().map(|g| g.growths).sum();
            writeln!(f, "growths       {growths} of a shard, in {} batches", self.growth_batches.len())?;
            for g in &self.growth_batches {
                writeln!(
                    f,
                    "  batch after {} keys: {} growth(s), {:.1} ms",
                    g.after,
                    g.growths,
                    s(g.time) * 1e3
                )?;
            }
        }
        if let Some(search) = &self.search {
            writeln!(f, "search        {search} (values checked)")?;
        }
        let (keys, fewest, most) = self.keys;
        let power = if keys > 0 { format!(" (2^{:.3})", (keys as f64).log2()) } else { String::new() };
        writeln!(f, "keys          {keys}{power}; per shard {fewest} to {most}")?;
        writeln!(f, "slots         {} (most in one shard: {})", self.slots.0, self.slots.1)?;
        writeln!(f, "pool files    {:.2} GiB", self.pool_bytes as f64 / (1u64 << 30) as f64)?;
        if let Some((time, ok)) = self.check {
            writeln!(f, "check         {} in {:.1} s", if ok { "consistent" } else { "FAILED" }, s(time))?;
        }
        write!(f, "close {:.2} s, open after it {:.3} s", s(self.close), s(self.reopen))
    }
}

/// The value stored under key number `i`.
fn value(i: u64, bytes: usize) -> Vec<u8> {
    (0..bytes).map(|b| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> ((b % 8) * 8)) as u8 ^ b as u8).collect()
}

/// The bytes `f` gives each of `ids`, one after another.
fn concatenated(
    ids: impl ParallelIterator<Item = u64>,
    bytes: usize,
    f: fn(u64, usize) -> Vec<u8>,
) -> Vec<u8> {
    ids.flat_map_iter(|i| f(i, bytes)).collect()
}

/// [`spread`] of `latencies`, unless there are none (no keys, or a growth in every batch).
fn spread_of(latencies: Vec<Duration>) -> Option<(Duration, Duration, Duration)> {
    (!latencies.is_empty()).then(|| spread(latencies))
}

impl ShardedLoad {
    /// Runs it; `progress` is told of each batch's operations.
    pub fn run(&self, options: &Options, progress: &dyn Fn(u64)) -> Result<ShardedFigures> {
        // The same devices for the start and the reopen, so the reopen's time is the table's.
        let gpus = ShardedGpHash::devices(options)?;
        let temporary = match &self.table_dir {
            Some(_) => None,
            None => Some(pool_dir(&self.pool_dir)?),
        };
        let path = match (&self.table_dir, &temporary) {
            (Some(dir), _) => dir.clone(),
            (None, t) => t.as_ref().expect("a temporary directory").path().join("sharded"),
        };
        let t = Instant::now();
        let (table, start) = if self.existing {
            (ShardedGpHash::open_on(&path, options, &gpus)?, "open")
        } else {
            let config = Config {
                key_bytes: self.key_bytes,
                value_bytes: self.value_bytes,
                capacity: self.capacity,
                ..Config::default()
            };
            (ShardedGpHash::create_on(&path, &config, self.shards, options, &gpus)?, "create")
        };
        let start = (start, t.elapsed());
        let from = match (self.existing, self.load_from) {
            (false, _) => Some(0),
            (true, from) => from,
        };
        let (load, growth_batches) = match from {
            None => (None, vec![]),
            Some(from) => {
                let (load, growths) = self.load(&table, from, progress)?;
                (Some(load), growths)
            }
        };
        // An empty table has no key to search for.
        let search =
            (self.searches > 0 && self.keys > 0).then(|| self.search(&table, progress)).transpose()?;
        if table.len() != self.keys {
            return Err(Error::Inconsistent(format!(
                "the table holds {} keys, not {}",
                table.len(),
                self.keys
            )));
        }
        let per_shard: Vec<u64> = table.shards().iter().map(|s| s.len()).collect();
        let keys = (table.len(), *per_shard.iter().min().unwrap(), *per_shard.iter().max().unwrap());
        let most_slots = table.shards().iter().map(|s| s.geometry().slots()).max().unwrap_or(0);
        let slots = (table.slots(), most_slots);
        let check = self.check.then(|| {
            let t = Instant::now();
            let ok = table.check().iter().all(|r| r.ok());
            (t.elapsed(), ok)
        });
        let t = Instant::now();
        table.close()?;
        let close = t.elapsed();
        let pool_bytes = std::fs::read_dir(&path)
            .and_then(|entries| {
                entries.map(|e| e.and_then(|e| e.metadata()).map(|m| m.len())).sum::<std::io::Result<u64>>()
            })
            .map_err(|source| Error::Io { what: format!("sizing {}", path.display()), source })?;
        let t = Instant::now();
        let table = ShardedGpHash::open_on(&path, options, &gpus)?;
        let reopen = t.elapsed();
        if table.len() != keys.0 {
            return Err(Error::Inconsistent(format!(
                "{} keys after reopening, {} before",
                table.len(),
                keys.0
            )));
        }
        table.close()?;
        Ok(ShardedFigures {
            gpus: gpus.len(),
            start,
            load,
            growth_batches,
            search,
            keys,
            slots,
            pool_bytes,
            check,
            close,
            reopen,
        })
    }

    /// Inserts keys `from..keys`; the load's figures and its batches that grew shards.
    fn load(
        &self,
        table: &ShardedGpHash,
        from: u64,
        progress: &dyn Fn(u64),
    ) -> Result<(Phase, Vec<GrowthBatch>)> {
        let (kb, vb) = (self.key_bytes as usize, self.value_bytes as usize);
        let batch = self.batch.max(1) as u64;
        let growths =
            |table: &ShardedGpHash| table.shards().iter().map(|s| s.activity().resizes).sum::<u64>();
        let (mut latencies, mut growth_batches) = (vec![], vec![]);
        let t = Instant::now();
        for start in (from..self.keys).step_by(batch as usize) {
            let ids = start..(start + batch).min(self.keys);
            let keys = concatenated(ids.clone().into_par_iter(), kb, key);
            let values = concatenated(ids.into_par_iter(), vb, value);
            let before = growths(table);
            let s = Instant::now();
            let statuses = table.insert(&keys, &values)?;
            let spent = s.elapsed();
            if let Some(i) = statuses.iter().position(|&s| s != Status::Ok) {
                let key = start + i as u64;
                return Err(Error::Inconsistent(format!("insert of key {key} gave {:?}", statuses[i])));
            }
            match growths(table) - before {
                0 => latencies.push(spent),
                grew => growth_batches.push(GrowthBatch { after: start, growths: grew, time: spent }),
            }
            progress(statuses.len() as u64);
        }
        let ops = self.keys.saturating_sub(from);
        Ok((Phase { ops, time: t.elapsed(), batches: spread_of(latencies) }, growth_batches))
    }

    /// Reads `searches` loaded keys drawn at random and checks their values.
    fn search(&self, table: &ShardedGpHash, progress: &dyn Fn(u64)) -> Result<Phase> {
        let (kb, vb) = (self.key_bytes as usize, self.value_bytes as usize);
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
        let sample: Vec<u64> = (0..self.searches).map(|_| rng.random_range(0..self.keys.max(1))).collect();
        let mut latencies = vec![];
        let t = Instant::now();
        for ids in sample.chunks(self.batch.max(1)) {
            let keys = concatenated(ids.par_iter().copied(), kb, key);
            let s = Instant::now();
            let found = table.get(&keys)?;
            latencies.push(s.elapsed());
            if let Some(j) = (0..ids.len()).find(|&j| found.value(j) != Some(&value(ids[j], vb)[..])) {
                return Err(Error::Inconsistent(format!("key {} read {:?}", ids[j], found.value(j))));
            }
            progress(ids.len() as u64);
        }
        Ok(Phase { ops: self.searches, time: t.elapsed(), batches: spread_of(latencies) })
    }
}
