//! YCSB-style workload generation: the request distributions of YCSB's `core` package and the
//! operation mixes of its core workloads, as batches of operations on integer key ids.
//!
//! | here | YCSB |
//! |---|---|
//! | [`fnv64`] | `Utils.fnvhash64` |
//! | [`Zipfian`] | `ZipfianGenerator` (Gray et al., SIGMOD'94) |
//! | [`ScrambledZipfian`] | `ScrambledZipfianGenerator` (the `zipfian` request distribution) |
//! | [`Latest`] | `SkewedLatestGenerator` (the `latest` request distribution) |
//! | [`Uniform`] | `UniformLongGenerator` (the `uniform` request distribution) |
//! | [`Generator`] | `CoreWorkload` (`doTransaction*`, `nextKeynum`, the insert key sequence) |
//! | [`Workload::Load`] .. [`Workload::F`] | the LOAD phase and `workloads/workloada` .. `workloadf` |
//!
//! Workload E (scans) is left out: a hash index cannot scan. The micro workloads
//! ([`Workload::PositiveSearch`] .. [`Workload::Delete`]) are GPHash's single-operation runs.
//!
//! Key ids are `u64`: the loaded records are ids `0..records`, the transaction phase's inserts
//! take ids `records, records + 1, ...`, and negative searches use ids at or above
//! `records + operations`. [`batch_of`] turns ids into key bytes with [`crate::key`] and
//! gives every write a deterministic pseudo-random value ([`value_of`]).
//!
//! What follows YCSB exactly, and where it deviates (each deviation is a YCSB quirk that would
//! only put ids out of range or make the mix inconsistent):
//! - Zipfian sampling is YCSB's formula, including its approximation for ranks above 2; its
//!   zeta constants are summed directly for up to 65 536 terms and by Euler–Maclaurin beyond
//!   (about 1e-12 relative of the direct sum), and the scrambled generator uses YCSB's pinned
//!   [`SCRAMBLED_ZETAN`] for theta 0.99 over [`SCRAMBLED_ITEMS`]` + 1` items.
//! - When a Zipfian's item count grows, zeta is extended incrementally as YCSB does, but `eta`
//!   is recomputed with the new count (YCSB keeps the count of construction there); when it
//!   shrinks, zeta is recomputed (YCSB by default keeps the larger zeta).
//! - A Zipfian draw that rounds up to the item count is clamped to the last item.
//! - YCSB's formula holds for theta in `[0, 1)` only (it divides by `1 - theta`). For the skew
//!   sweeps beyond (theta 1 to 1.2, as GPHash's Figure 12), the scrambled generator's inner draw
//!   over the same `[0, SCRAMBLED_ITEMS]` is exact rejection-inversion sampling (Hörmann and
//!   Derflinger, `rand_distr::Zipf`); the scrambling is YCSB's.
//! - With a Zipfian request distribution the key chooser spans
//!   `records + operations * insert_proportion * 2` ids (plus one: YCSB's bound is inclusive) and
//!   draws above the last acknowledged id are redrawn (`CoreWorkload.nextKeynum`).
//! - `latest` is `max - zipf(max)` with `max` the last acknowledged id, so as in YCSB id 0 is never
//!   read by it.
//! - `uniform` draws over the loaded records only, as YCSB's `UniformLongGenerator(insertstart,
//!   insertstart + insertcount - 1)`.
//! - The operation of each transaction is drawn independently with the workload's proportions
//!   (YCSB's `DiscreteGenerator`), so a mix holds only on average.
//! - YCSB acknowledges an insert when the database returns; here the inserts a batch generates
//!   become readable at the end of that batch (when it would be persisted), so a read never
//!   targets an insert of its own batch.

use std::fmt;
use std::str::FromStr;

use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use rustc_hash::FxHashMap;

use gphash::Batch;
use gphash::OpKind;
use gphash::{Error, Result};

/// YCSB's default Zipfian constant (`ZipfianGenerator.ZIPFIAN_CONSTANT`).
pub const ZIPFIAN_CONSTANT: f64 = 0.99;

/// The largest item of the scrambled generator's inner Zipfian (`ScrambledZipfianGenerator.
/// ITEM_COUNT`): it draws over `[0, SCRAMBLED_ITEMS]`.
pub const SCRAMBLED_ITEMS: u64 = 10_000_000_000;

/// YCSB's precomputed zeta for the scrambled generator with theta 0.99
/// (`ScrambledZipfianGenerator.ZETAN`): zeta(1e10, 0.99). (A published YCSB version pairs it
/// with 1e16 items, whose zeta is about 45.1; the constant belongs to 1e10.)
pub const SCRAMBLED_ZETAN: f64 = 26.46902820178302;

/// The largest Zipfian constant a request distribution takes (skew sweeps).
pub const MAX_THETA: f64 = 2.0;

/// Ids below this map to distinct keys through [`crate::key`] (which keeps only the low
/// 32 bits of an id); [`Generator::new`] refuses configurations that would produce larger ids.
pub const MAX_IDS: u64 = 1 << 32;

const FNV_OFFSET_BASIS_64: u64 = 0xCBF2_9CE4_8422_2325;
const FNV_PRIME_64: u64 = 0x0000_0100_0000_01B3;

/// YCSB's `Utils.fnvhash64`: FNV-1a over the 8 bytes of `x`, low byte first, then the absolute
/// value of the hash read as a signed 64-bit integer.
///
/// As Java's `Math.abs(Long.MIN_VALUE)`, the absolute value of `i64::MIN` stays `i64::MIN`,
/// returned here as its bit pattern `1 << 63` (the only result at or above `1 << 63`).
pub fn fnv64(x: u64) -> u64 {
    let mut h = FNV_OFFSET_BASIS_64;
    for byte in x.to_le_bytes() {
        h ^= u64::from(byte);
        h = h.wrapping_mul(FNV_PRIME_64);
    }
    (h as i64).wrapping_abs() as u64
}

/// Terms summed one by one before Euler–Maclaurin takes over.
const DIRECT_TERMS: u64 = 1 << 16;
/// Where the Euler–Maclaurin tail starts in a long sum.
const EULER_MACLAURIN_START: u64 = 1000;

/// zeta(n, theta) = sum over i in 1..=n of i^-theta (YCSB `ZipfianGenerator.zeta`).
pub fn zeta(n: u64, theta: f64) -> f64 {
    power_sum(1, n, theta)
}

/// zeta(to, theta) given `zeta_from` = zeta(from, theta): adds the terms `from + 1 ..= to`, as
/// YCSB's incremental `zeta(st, n, theta, initialsum)`. `to < from` returns `zeta_from`.
pub fn zeta_extend(from: u64, to: u64, theta: f64, zeta_from: f64) -> f64 {
    zeta_from + power_sum(from + 1, to, theta)
}

/// sum over i in a..=b of i^-theta, for a >= 1.
fn power_sum(a: u64, b: u64, theta: f64) -> f64 {
    let f = |i: u64| (i as f64).powf(-theta);
    if a > b {
        return 0.0;
    }
    if b - a < DIRECT_TERMS {
        return (a..=b).map(f).sum();
    }
    let m = a.max(EULER_MACLAURIN_START);
    let head: f64 = (a..m).map(f).sum();
    head + euler_maclaurin(m as f64, b as f64, theta)
}

/// sum over i in m..=n of i^-theta by Euler–Maclaurin to the fifth derivative; for m >= 1000
/// the remainder is below 1e-20.
fn euler_maclaurin(m: f64, n: f64, t: f64) -> f64 {
    let f = |x: f64| x.powf(-t);
    let d1 = |x: f64| -t * x.powf(-t - 1.0);
    let d3 = |x: f64| -t * (t + 1.0) * (t + 2.0) * x.powf(-t - 3.0);
    let d5 = |x: f64| -t * (t + 1.0) * (t + 2.0) * (t + 3.0) * (t + 4.0) * x.powf(-t - 5.0);
    let integral = if (t - 1.0).abs() < 1e-12 {
        n.ln() - m.ln()
    } else {
        (n.powf(1.0 - t) - m.powf(1.0 - t)) / (1.0 - t)
    };
    integral + (f(m) + f(n)) / 2.0 + (d1(n) - d1(m)) / 12.0 - (d3(n) - d3(m)) / 720.0
        + (d5(n) - d5(m)) / 30240.0
}

/// YCSB's `ZipfianGenerator`: items `min..=max`, item `min` the most popular, with the
/// probability of rank r proportional to r^-theta.
#[derive(Clone, Debug)]
pub struct Zipfian {
    base: u64,
    /// Current item count.
    n: u64,
    theta: f64,
    alpha: f64,
    zeta2: f64,
    zetan: f64,
    eta: f64,
    half_pow_theta: f64,
}

impl Zipfian {
    /// A generator over `min..=max` with constant `theta`, computing zeta(max - min + 1).
    ///
    /// # Panics
    /// If `max < min`, the range holds every u64, or `theta` is not in `[0, 1)`.
    pub fn new(min: u64, max: u64, theta: f64) -> Self {
        let n = Self::count(min, max);
        Self::with_zetan(min, max, theta, zeta(n, theta))
    }

    /// A generator over `min..=max` with a precomputed zeta(max - min + 1, theta), as YCSB's
    /// `ZipfianGenerator(min, max, constant, zetan)`.
    ///
    /// # Panics
    /// As [`Zipfian::new`].
    pub fn with_zetan(min: u64, max: u64, theta: f64, zetan: f64) -> Self {
        assert!((0.0..1.0).contains(&theta), "Zipfian constant {theta} is not in [0, 1)");
        let n = Self::count(min, max);
        let mut z = Zipfian {
            base: min,
            n,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zeta2: zeta(2, theta),
            zetan,
            eta: 0.0,
            half_pow_theta: 0.5f64.powf(theta),
        };
        z.eta = z.eta_for(n);
        z
    }

    fn count(min: u64, max: u64) -> u64 {
        assert!(max >= min, "empty Zipfian range {min}..={max}");
        (max - min).checked_add(1).expect("Zipfian range of 2^64 items")
    }

    fn eta_for(&self, n: u64) -> f64 {
        (1.0 - (2.0 / n as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2 / self.zetan)
    }

    /// The current item count.
    pub fn items(&self) -> u64 {
        self.n
    }

    /// The Zipfian constant.
    pub fn theta(&self) -> f64 {
        self.theta
    }

    /// zeta(items, theta) as used by the sampler.
    pub fn zetan(&self) -> f64 {
        self.zetan
    }

    /// One draw over the current items (YCSB `nextValue()`).
    pub fn next<R: Rng + ?Sized>(&mut self, rng: &mut R) -> u64 {
        self.sample(rng.random::<f64>())
    }

    /// One draw over `min .. min + items` (YCSB `nextLong(itemcount)`): when `items` grew, zeta
    /// is extended from the old count to the new one; when it shrank, zeta is recomputed.
    ///
    /// # Panics
    /// If `items` is 0.
    pub fn next_in<R: Rng + ?Sized>(&mut self, rng: &mut R, items: u64) -> u64 {
        assert!(items > 0, "Zipfian over no items");
        if items != self.n {
            self.zetan = if items > self.n {
                zeta_extend(self.n, items, self.theta, self.zetan)
            } else {
                zeta(items, self.theta)
            };
            self.n = items;
            self.eta = self.eta_for(items);
        }
        self.next(rng)
    }

    /// YCSB's formula for a uniform `u` in `[0, 1)`.
    fn sample(&self, u: f64) -> u64 {
        let uz = u * self.zetan;
        if uz < 1.0 {
            return self.base;
        }
        if uz < 1.0 + self.half_pow_theta {
            return self.base + 1;
        }
        let r = (self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        self.base + r.min(self.n - 1)
    }
}

/// YCSB's `ScrambledZipfianGenerator`: a [`Zipfian`] over `[0, SCRAMBLED_ITEMS]` whose draw `z`
/// becomes `min + fnv64(z) % itemcount`, so the popular items are scattered over `min..=max`.
#[derive(Clone, Debug)]
pub struct ScrambledZipfian {
    min: u64,
    items: u64,
    inner: Inner,
}

/// The inner draw of a [`ScrambledZipfian`]: YCSB's formula (theta below 1), or exact
/// rejection-inversion sampling (theta 1 and above, where the formula does not hold).
#[derive(Clone, Debug)]
enum Inner {
    Ycsb(Zipfian),
    Exact(rand_distr::Zipf<f64>),
}

impl ScrambledZipfian {
    /// A generator over `min..=max`. For theta 0.99 the inner Zipfian uses the pinned
    /// [`SCRAMBLED_ZETAN`]; otherwise its zeta is computed (theta below 1) or it samples exactly
    /// (theta 1 and above).
    ///
    /// # Panics
    /// If `max < min`, the range holds every u64, or `theta` is not in `[0, MAX_THETA]`.
    pub fn new(min: u64, max: u64, theta: f64) -> Self {
        let items = Zipfian::count(min, max);
        let inner = if theta == ZIPFIAN_CONSTANT {
            Inner::Ycsb(Zipfian::with_zetan(0, SCRAMBLED_ITEMS, theta, SCRAMBLED_ZETAN))
        } else if theta < 1.0 {
            Inner::Ycsb(Zipfian::new(0, SCRAMBLED_ITEMS, theta))
        } else {
            assert!(theta <= MAX_THETA, "Zipfian constant {theta} is not in [0, {MAX_THETA}]");
            Inner::Exact(rand_distr::Zipf::new(SCRAMBLED_ITEMS as f64 + 1.0, theta).expect("valid Zipf"))
        };
        ScrambledZipfian { min, items, inner }
    }

    /// The number of items, `max - min + 1`.
    pub fn items(&self) -> u64 {
        self.items
    }

    /// The inner Zipfian's zeta (`None` where it samples exactly, theta 1 and above).
    pub fn zetan(&self) -> Option<f64> {
        match &self.inner {
            Inner::Ycsb(z) => Some(z.zetan()),
            Inner::Exact(_) => None,
        }
    }

    /// One draw in `min..=max`. (YCSB's signed `%` would put the one hash `1 << 63` below `min`;
    /// here the remainder is unsigned and always in range.)
    pub fn next<R: Rng + ?Sized>(&mut self, rng: &mut R) -> u64 {
        let z = match &mut self.inner {
            Inner::Ycsb(z) => z.next(rng),
            // Ranks 1..=n, the most popular first, as YCSB's 0-based draw.
            Inner::Exact(z) => rng.sample(*z) as u64 - 1,
        };
        self.min + fnv64(z) % self.items
    }
}

/// YCSB's `SkewedLatestGenerator` (workload D): `max - zipf(max)` where `max` is the last
/// acknowledged id and `zipf(max)` is a [`Zipfian`] over `[0, max)` that grows with it, so the
/// newest record is the most popular. As in YCSB, id 0 is never drawn once `max > 0`.
#[derive(Clone, Debug)]
pub struct Latest {
    theta: f64,
    zipf: Option<Zipfian>,
}

impl Latest {
    /// A generator with Zipfian constant `theta`.
    ///
    /// # Panics
    /// If `theta` is not in `[0, 1)`.
    pub fn new(theta: f64) -> Self {
        assert!((0.0..1.0).contains(&theta), "Zipfian constant {theta} is not in [0, 1)");
        Latest { theta, zipf: None }
    }

    /// One draw when `count` records (ids `0..count`) are acknowledged: an id in `1..count`,
    /// or 0 when `count` is 1.
    ///
    /// # Panics
    /// If `count` is 0.
    pub fn next<R: Rng + ?Sized>(&mut self, rng: &mut R, count: u64) -> u64 {
        assert!(count > 0, "latest over no records");
        let max = count - 1;
        if max == 0 {
            return 0;
        }
        let z = match &mut self.zipf {
            Some(z) => z.next_in(rng, max),
            None => self.zipf.insert(Zipfian::new(0, max - 1, self.theta)).next(rng),
        };
        max - z
    }
}

/// Uniform draws over `min .. min + items` (YCSB `UniformLongGenerator`).
#[derive(Clone, Copy, Debug)]
pub struct Uniform {
    min: u64,
    items: u64,
}

impl Uniform {
    /// A generator over `min .. min + items`.
    ///
    /// # Panics
    /// If `items` is 0.
    pub fn new(min: u64, items: u64) -> Self {
        assert!(items > 0, "uniform over no items");
        Uniform { min, items }
    }

    /// One draw.
    pub fn next<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        self.min + rng.random_range(0..self.items)
    }
}

/// A request distribution: how reads and updates pick their keys.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Distribution {
    /// YCSB's `zipfian`: the scrambled Zipfian with constant `theta` over the loaded records and
    /// the expected inserts.
    Zipfian {
        /// The Zipfian constant, in `[0, MAX_THETA]` (YCSB's formula below 1, exact sampling
        /// from 1).
        theta: f64,
    },
    /// YCSB's `uniform` over the loaded records.
    Uniform,
    /// YCSB's `latest`: skewed towards the most recent insert.
    Latest,
}

impl Default for Distribution {
    fn default() -> Self {
        Distribution::Zipfian { theta: ZIPFIAN_CONSTANT }
    }
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Distribution::Zipfian { theta } => write!(f, "zipf:{theta}"),
            Distribution::Uniform => f.write_str("uniform"),
            Distribution::Latest => f.write_str("latest"),
        }
    }
}

impl FromStr for Distribution {
    type Err = Error;

    /// `uniform`, `latest`, `zipf` (theta 0.99) or `zipf:THETA` with THETA in `[0, MAX_THETA]`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::InvalidConfig(format!(
                "distribution {s:?}: expected uniform, latest, zipf or zipf:THETA with THETA in [0, {MAX_THETA}]"
            ))
        };
        match s.trim().to_ascii_lowercase().as_str() {
            "uniform" => Ok(Distribution::Uniform),
            "latest" => Ok(Distribution::Latest),
            "zipf" | "zipfian" => Ok(Distribution::default()),
            other => {
                let theta = other
                    .strip_prefix("zipf:")
                    .or_else(|| other.strip_prefix("zipfian:"))
                    .ok_or_else(bad)?
                    .parse::<f64>()
                    .map_err(|_| bad())?;
                if !(0.0..=MAX_THETA).contains(&theta) {
                    return Err(bad());
                }
                Ok(Distribution::Zipfian { theta })
            }
        }
    }
}

/// A workload: YCSB's LOAD and core workloads A, B, C, D, F, and GPHash's micro workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Workload {
    /// Inserts of all records, ids `0..records` in order (YCSB's load phase).
    Load,
    /// 50% read, 50% update (update heavy).
    A,
    /// 95% read, 5% update (read mostly).
    B,
    /// 100% read.
    C,
    /// 95% read, 5% insert, reads by the `latest` distribution (read latest).
    D,
    /// 50% read, 50% read-modify-write.
    F,
    /// Reads of loaded keys.
    PositiveSearch,
    /// Reads of keys never inserted (ids at or above `records + operations`).
    NegativeSearch,
    /// Inserts of new keys (ids `records, records + 1, ...`).
    Insert,
    /// Updates of loaded keys.
    Update,
    /// Deletes of loaded keys, each at most once, uniformly whatever the distribution.
    Delete,
}

/// The proportions of a workload's operations (each workload's sum to 1).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Mix {
    /// Reads.
    pub read: f64,
    /// Updates.
    pub update: f64,
    /// Inserts of new keys.
    pub insert: f64,
    /// Read-modify-writes (a read then an update of the same key).
    pub read_modify_write: f64,
    /// Deletes.
    pub delete: f64,
}

impl Workload {
    /// Every workload, in the order of the enum.
    pub const ALL: [Workload; 11] = [
        Workload::Load,
        Workload::A,
        Workload::B,
        Workload::C,
        Workload::D,
        Workload::F,
        Workload::PositiveSearch,
        Workload::NegativeSearch,
        Workload::Insert,
        Workload::Update,
        Workload::Delete,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Load => "load",
            Workload::A => "a",
            Workload::B => "b",
            Workload::C => "c",
            Workload::D => "d",
            Workload::F => "f",
            Workload::PositiveSearch => "search+",
            Workload::NegativeSearch => "search-",
            Workload::Insert => "insert",
            Workload::Update => "update",
            Workload::Delete => "delete",
        }
    }

    /// The operation proportions.
    pub fn mix(self) -> Mix {
        let m = Mix::default();
        match self {
            Workload::Load | Workload::Insert => Mix { insert: 1.0, ..m },
            Workload::A => Mix { read: 0.5, update: 0.5, ..m },
            Workload::B => Mix { read: 0.95, update: 0.05, ..m },
            Workload::C | Workload::PositiveSearch | Workload::NegativeSearch => Mix { read: 1.0, ..m },
            Workload::D => Mix { read: 0.95, insert: 0.05, ..m },
            Workload::F => Mix { read: 0.5, read_modify_write: 0.5, ..m },
            Workload::Update => Mix { update: 1.0, ..m },
            Workload::Delete => Mix { delete: 1.0, ..m },
        }
    }

    /// The request distribution when none is given: `latest` for D, the scrambled Zipfian 0.99
    /// otherwise (LOAD, Insert and Delete choose no keys by distribution).
    pub fn default_distribution(self) -> Distribution {
        match self {
            Workload::D => Distribution::Latest,
            _ => Distribution::default(),
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Workload {
    type Err = Error;

    /// One of the names of [`Workload::name`] (case-insensitive).
    fn from_str(s: &str) -> Result<Self> {
        let lower = s.trim().to_ascii_lowercase();
        Workload::ALL.into_iter().find(|w| w.name() == lower).ok_or_else(|| {
            let names: Vec<&str> = Workload::ALL.iter().map(|w| w.name()).collect();
            Error::InvalidConfig(format!("workload {s:?}: expected one of {}", names.join(", ")))
        })
    }
}

/// One operation on the key with id `id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Op {
    /// What it does.
    pub kind: OpKind,
    /// The key's id (see [`crate::key`]).
    pub id: u64,
}

/// How reads and updates choose ids.
#[derive(Clone, Debug)]
enum Chooser {
    Scrambled(ScrambledZipfian),
    Uniform(Uniform),
    Latest(Latest),
}

/// Generates a workload's operations in batches, deterministically from a seed.
///
/// A run produces `operations` transactions (LOAD: `records` inserts). Each is one [`Op`],
/// except F's read-modify-write, which is a `Get` then an `Update` of the same id and counts as
/// one transaction; when the pair does not fit a batch, its `Update` opens the next batch.
#[derive(Clone, Debug)]
pub struct Generator {
    workload: Workload,
    distribution: Distribution,
    records: u64,
    operations: u64,
    rng: Xoshiro256PlusPlus,
    chooser: Chooser,
    /// Transactions produced.
    produced: u64,
    /// New inserts generated (ids `records .. records + inserted`).
    inserted: u64,
    /// Ids `0..readable` may be read (the loaded records and the acknowledged inserts).
    readable: u64,
    /// The second half of a read-modify-write that did not fit the last batch.
    pending: Option<Op>,
    /// Sparse Fisher–Yates state of Delete: position -> id where they differ.
    shuffled: FxHashMap<u64, u64>,
}

impl Generator {
    /// A generator of `workload` over `records` loaded records (ids `0..records`) for
    /// `operations` transactions, choosing keys by `distribution` (`None`: the workload's
    /// [`Workload::default_distribution`]); the same arguments give the same operations.
    ///
    /// Errors (`InvalidConfig`): a workload that reads, updates or deletes with no records;
    /// more deletes than records; ids that would reach [`MAX_IDS`].
    pub fn new(
        workload: Workload,
        distribution: Option<Distribution>,
        records: u64,
        operations: u64,
        seed: u64,
    ) -> Result<Self> {
        let distribution = distribution.unwrap_or(workload.default_distribution());
        let mix = workload.mix();
        let invalid = |why: String| Err(Error::InvalidConfig(format!("workload {workload}: {why}")));
        if let Distribution::Zipfian { theta } = distribution
            && !(0.0..=MAX_THETA).contains(&theta)
        {
            return invalid(format!("Zipfian constant {theta} is not in [0, {MAX_THETA}]"));
        }
        let chooses_keys = !matches!(workload, Workload::Load | Workload::Insert);
        if chooses_keys && records == 0 && operations > 0 {
            return invalid("no records to read, update or delete".into());
        }
        if workload == Workload::Delete && operations > records {
            return invalid(format!(
                "{operations} deletes of {records} records: each key is deleted at most once"
            ));
        }
        let largest = match workload {
            Workload::Load => Some(records),
            Workload::NegativeSearch => records.checked_mul(2).and_then(|r| r.checked_add(operations)),
            _ => records.checked_add(operations),
        };
        if largest.is_none_or(|end| end > MAX_IDS) {
            return invalid(format!(
                "{records} records and {operations} operations need ids beyond 2^32, which bench::key cannot tell apart"
            ));
        }
        // CoreWorkload: expectednewkeys = (int) (opcount * insertproportion * 2.0).
        let expected_new = (operations as f64 * mix.insert * 2.0) as u64;
        let chooser = match distribution {
            Distribution::Zipfian { theta } => {
                Chooser::Scrambled(ScrambledZipfian::new(0, records + expected_new, theta))
            }
            Distribution::Uniform => Chooser::Uniform(Uniform::new(0, records.max(1))),
            Distribution::Latest => Chooser::Latest(Latest::new(ZIPFIAN_CONSTANT)),
        };
        Ok(Generator {
            workload,
            distribution,
            records,
            operations,
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
            chooser,
            produced: 0,
            inserted: 0,
            readable: records,
            pending: None,
            shuffled: FxHashMap::default(),
        })
    }

    /// The workload.
    pub fn workload(&self) -> Workload {
        self.workload
    }

    /// The request distribution in use.
    pub fn distribution(&self) -> Distribution {
        self.distribution
    }

    /// The loaded records.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// The transactions of the run: `records` for LOAD, `operations` otherwise.
    pub fn total(&self) -> u64 {
        if self.workload == Workload::Load { self.records } else { self.operations }
    }

    /// Transactions produced so far.
    pub fn produced(&self) -> u64 {
        self.produced
    }

    /// New inserts produced so far (ids `records .. records + inserted()`).
    pub fn inserted(&self) -> u64 {
        self.inserted
    }

    /// Ids below this are readable: the loaded records and the inserts of earlier batches.
    pub fn readable(&self) -> u64 {
        self.readable
    }

    /// Whether every transaction has been produced (and no half of one is pending).
    pub fn done(&self) -> bool {
        self.produced >= self.total() && self.pending.is_none()
    }

    /// The next at most `n` operations (fewer only at the end of the run, empty once
    /// [`Generator::done`]). The inserts they contain become readable after this call.
    pub fn next_batch(&mut self, n: usize) -> Vec<Op> {
        let mut ops = Vec::with_capacity(n);
        if n == 0 {
            return ops;
        }
        ops.extend(self.pending.take());
        while ops.len() < n && self.produced < self.total() {
            self.transaction(&mut ops);
        }
        if ops.len() > n {
            self.pending = ops.pop();
        }
        self.readable = self.records + self.inserted;
        ops
    }

    /// Appends one transaction's operations.
    fn transaction(&mut self, ops: &mut Vec<Op>) {
        let op = |kind, id| Op { kind, id };
        self.produced += 1;
        match self.workload {
            Workload::Load => ops.push(op(OpKind::Insert, self.produced - 1)),
            Workload::Insert => ops.push(op(OpKind::Insert, self.new_id())),
            Workload::Delete => {
                let id = self.next_shuffled();
                ops.push(op(OpKind::Delete, id));
            }
            Workload::NegativeSearch => {
                let id = self.records + self.operations + self.choose();
                ops.push(op(OpKind::Get, id));
            }
            _ => {
                let mix = self.workload.mix();
                let u: f64 = self.rng.random();
                if u < mix.read {
                    let id = self.choose();
                    ops.push(op(OpKind::Get, id));
                } else if u < mix.read + mix.update {
                    let id = self.choose();
                    ops.push(op(OpKind::Update, id));
                } else if u < mix.read + mix.update + mix.insert {
                    ops.push(op(OpKind::Insert, self.new_id()));
                } else {
                    debug_assert!(mix.read_modify_write > 0.0);
                    let id = self.choose();
                    ops.push(op(OpKind::Get, id));
                    ops.push(op(OpKind::Update, id));
                }
            }
        }
    }

    /// The id of the next new insert.
    fn new_id(&mut self) -> u64 {
        self.inserted += 1;
        self.records + self.inserted - 1
    }

    /// A readable id by the request distribution (YCSB `nextKeynum`).
    fn choose(&mut self) -> u64 {
        let readable = self.readable;
        match &mut self.chooser {
            Chooser::Scrambled(z) => loop {
                let id = z.next(&mut self.rng);
                if id < readable {
                    return id;
                }
            },
            Chooser::Uniform(u) => u.next(&mut self.rng),
            Chooser::Latest(l) => l.next(&mut self.rng, readable),
        }
    }

    /// The next id of a uniform random permutation of `0..records` (sparse Fisher–Yates).
    fn next_shuffled(&mut self) -> u64 {
        let i = self.produced - 1;
        let j = self.rng.random_range(i..self.records);
        let at_j = self.shuffled.get(&j).copied().unwrap_or(j);
        let at_i = self.shuffled.remove(&i).unwrap_or(i);
        if j != i {
            self.shuffled.insert(j, at_i);
        }
        at_j
    }
}

/// The value that [`batch_of`] gives id `id` under `seed`: `value_bytes` pseudo-random bytes
/// (splitmix64 of the id and the seed).
pub fn value_of(id: u64, seed: u64, value_bytes: usize) -> Vec<u8> {
    let mut id_state = id;
    let mut state = seed ^ splitmix64(&mut id_state);
    let mut out = Vec::with_capacity(value_bytes + 8);
    while out.len() < value_bytes {
        out.extend_from_slice(&splitmix64(&mut state).to_le_bytes());
    }
    out.truncate(value_bytes);
    out
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A batch of `ops` with keys [`crate::key`]`(id, key_bytes)` and, for inserts, upserts
/// and updates, the values [`value_of`]`(id, seed, value_bytes)`.
pub fn batch_of(ops: &[Op], key_bytes: usize, value_bytes: usize, seed: u64) -> Batch {
    batch_with(ops, key_bytes, value_bytes, seed, crate::key)
}

/// [`batch_of`] with another mapping of ids to keys (which must give `key_bytes` bytes).
pub(crate) fn batch_with(
    ops: &[Op],
    key_bytes: usize,
    value_bytes: usize,
    seed: u64,
    key: impl Fn(u64, usize) -> Vec<u8>,
) -> Batch {
    let mut batch = Batch::new(key_bytes, value_bytes);
    for op in ops {
        let value = op.kind.writes_value().then(|| value_of(op.id, seed, value_bytes));
        batch
            .push(op.kind, &key(op.id, key_bytes), value.as_deref())
            .expect("key and value widths match the batch");
    }
    batch
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustc_hash::FxHashSet;

    fn rng(seed: u64) -> Xoshiro256PlusPlus {
        Xoshiro256PlusPlus::seed_from_u64(seed)
    }

    /// FNV-1a 64 over bytes, straight from the definition.
    fn fnv1a(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xCBF2_9CE4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3))
    }

    #[test]
    fn fnv64_matches_ycsb() {
        // The published FNV-1a 64 test vectors pin the byte loop.
        assert_eq!(fnv1a(b""), 0xCBF2_9CE4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xAF63_DC4C_8601_EC8C);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_F739_67E8);
        // All-zero input by hand: the basis, then 8 rounds of xor 0 and multiply.
        let mut h = 0xCBF2_9CE4_8422_2325u64;
        for _ in 0..8 {
            h = h.wrapping_mul(0x100_0000_01B3);
        }
        assert_eq!(h, 0xA8C7_F832_281A_39C5);
        // Negative as i64: YCSB's Math.abs negates it. This is YCSB's famous first key,
        // `user6284781860667377211`.
        assert_eq!(fnv64(0), h.wrapping_neg());
        assert_eq!(fnv64(0), 6_284_781_860_667_377_211);
        assert_eq!(fnv64(1), 8_517_097_267_634_966_620);
        assert_eq!(fnv64(2), 1_820_151_046_732_198_393);
        for x in [0u64, 1, 2, 0x61, 12_345_678_901_234, u64::MAX, 1 << 63] {
            let raw = fnv1a(&x.to_le_bytes()) as i64;
            assert_eq!(fnv64(x), raw.wrapping_abs() as u64);
            assert!(fnv64(x) <= 1 << 63);
        }
        // Math.abs(Long.MIN_VALUE) is Long.MIN_VALUE, i.e. bit pattern 1 << 63.
        assert_eq!(i64::MIN.wrapping_abs() as u64, 1 << 63);
    }

    #[test]
    fn zeta_small_n_is_the_direct_sum() {
        for theta in [0.0, 0.5, 0.99] {
            for n in [1u64, 2, 3, 10, 1000] {
                let direct: f64 = (1..=n).map(|i| 1.0 / (i as f64).powf(theta)).sum();
                assert!((zeta(n, theta) - direct).abs() < 1e-12 * direct, "n {n} theta {theta}");
            }
        }
        assert_eq!(zeta(2, 0.99), 1.0 + 2f64.powf(-0.99));
        assert_eq!(zeta_extend(10, 1000, 0.99, zeta(10, 0.99)), zeta(10, 0.99) + power_sum(11, 1000, 0.99));
    }

    #[test]
    fn zeta_euler_maclaurin_matches_direct_sum() {
        for theta in [0.5, 0.99] {
            let n = 2_000_000u64;
            let direct: f64 = (1..=n).map(|i| (i as f64).powf(-theta)).sum();
            let fast = zeta(n, theta);
            assert!(((fast - direct) / direct).abs() < 1e-11, "theta {theta}: {fast} vs {direct}");
            // Incremental extension over a long stretch agrees too.
            let ext = zeta_extend(1000, n, theta, zeta(1000, theta));
            assert!(((ext - direct) / direct).abs() < 1e-11);
        }
    }

    #[test]
    fn scrambled_constant_is_pinned_and_is_zeta_of_1e10() {
        assert_eq!(SCRAMBLED_ZETAN, 26.46902820178302);
        assert_eq!(SCRAMBLED_ITEMS, 10_000_000_000);
        let computed = zeta(SCRAMBLED_ITEMS, ZIPFIAN_CONSTANT);
        assert!((computed - SCRAMBLED_ZETAN).abs() < 1e-9, "{computed}");
        // Not the 1e16 of one published version.
        assert!((zeta(10_000_000_000_000_000, ZIPFIAN_CONSTANT) - 45.12).abs() < 0.01);
        // The generator uses the constant for 0.99 and computes zeta otherwise.
        let g = ScrambledZipfian::new(0, 999, ZIPFIAN_CONSTANT);
        assert_eq!(g.zetan(), Some(SCRAMBLED_ZETAN));
        let Inner::Ycsb(inner) = &g.inner else { panic!("YCSB's formula for 0.99") };
        assert_eq!(inner.items(), SCRAMBLED_ITEMS + 1);
        let g = ScrambledZipfian::new(0, 999, 0.9);
        let z = g.zetan().unwrap();
        assert!((z - zeta(SCRAMBLED_ITEMS + 1, 0.9)).abs() < 1e-12 * z);
    }

    /// From theta 1 on the inner draw is exact: the most popular items' frequencies follow
    /// `1 / (rank^theta zeta)` (for theta 1.2 and 1e10 + 1 items zeta is about 5.542).
    #[test]
    fn exact_zipfian_beyond_one_has_the_expected_head() {
        let mut g = ScrambledZipfian::new(0, 999_999, 1.2);
        assert_eq!(g.zetan(), None);
        let mut r = rng(11);
        let mut counts: FxHashMap<u64, u64> = FxHashMap::default();
        let samples = 200_000;
        for _ in 0..samples {
            *counts.entry(g.next(&mut r)).or_default() += 1;
        }
        let zeta12: f64 = 5.5416;
        let top = *counts.get(&(fnv64(0) % 1_000_000)).unwrap() as f64 / samples as f64;
        assert!((top - 1.0 / zeta12).abs() < 0.01, "rank 1: {top}");
        let second = *counts.get(&(fnv64(1) % 1_000_000)).unwrap() as f64 / samples as f64;
        assert!((second - 2f64.powf(-1.2) / zeta12).abs() < 0.01, "rank 2: {second}");
        assert!(Distribution::from_str("zipf:1.2").is_ok() && Distribution::from_str("zipf:2.5").is_err());
    }

    #[test]
    fn zipfian_head_frequencies() {
        let n = 1000u64;
        let theta = 0.99;
        let mut z = Zipfian::new(0, n - 1, theta);
        let zn = zeta(n, theta);
        assert!((z.zetan() - zn).abs() < 1e-12);
        let samples = 200_000;
        let mut counts = vec![0u64; n as usize];
        let mut r = rng(7);
        for _ in 0..samples {
            let s = z.next(&mut r);
            assert!(s < n);
            counts[s as usize] += 1;
        }
        let f0 = counts[0] as f64 / samples as f64;
        let f1 = counts[1] as f64 / samples as f64;
        let p0 = 1.0 / zn;
        let p1 = 2f64.powf(-theta) / zn;
        assert!((f0 / p0 - 1.0).abs() < 0.03, "rank 1: {f0} vs {p0}");
        assert!((f1 / p1 - 1.0).abs() < 0.03, "rank 2: {f1} vs {p1}");
        // Popularity falls off: the first 10 ranks outweigh the last 500.
        assert!(counts[..10].iter().sum::<u64>() > counts[500..].iter().sum::<u64>());
        // An offset range.
        let mut z = Zipfian::new(50, 59, theta);
        let mut r = rng(8);
        for _ in 0..10_000 {
            assert!((50..60).contains(&z.next(&mut r)));
        }
    }

    #[test]
    fn zipfian_grows_incrementally() {
        let mut z = Zipfian::new(0, 99, 0.99);
        let mut r = rng(9);
        for items in [100u64, 150, 1000, 100_000] {
            for _ in 0..1000 {
                assert!(z.next_in(&mut r, items) < items);
            }
            assert_eq!(z.items(), items);
            assert!((z.zetan() - zeta(items, 0.99)).abs() < 1e-10 * z.zetan(), "items {items}");
        }
        // Shrinking recomputes.
        z.next_in(&mut r, 10);
        assert!((z.zetan() - zeta(10, 0.99)).abs() < 1e-12);
        // Degenerate sizes.
        let mut one = Zipfian::new(5, 5, 0.99);
        let mut two = Zipfian::new(0, 1, 0.99);
        for _ in 0..1000 {
            assert_eq!(one.next(&mut r), 5);
            assert!(two.next(&mut r) < 2);
        }
    }

    #[test]
    fn scrambled_zipfian_scatters_the_hot_items() {
        let items = 1000u64;
        let mut g = ScrambledZipfian::new(0, items - 1, ZIPFIAN_CONSTANT);
        let mut r = rng(10);
        let mut counts = vec![0u64; items as usize];
        for _ in 0..200_000 {
            let s = g.next(&mut r);
            assert!(s < items);
            counts[s as usize] += 1;
        }
        let mut ranked: Vec<u64> = (0..items).collect();
        ranked.sort_by_key(|&i| std::cmp::Reverse(counts[i as usize]));
        // The hottest ids are the hashes of the Zipfian's first ranks, not 0, 1, 2.
        assert_eq!(ranked[0], fnv64(0) % items);
        assert_eq!(ranked[0], 211);
        assert_eq!(ranked[1], fnv64(1) % items);
        assert_ne!(ranked[..3].iter().copied().collect::<FxHashSet<_>>(), (0..3).collect());
        // Still skewed: rank 1 of 1e10 has probability 1/26.47.
        let f = counts[ranked[0] as usize] as f64 / 200_000.0;
        assert!(f > 0.035 && f < 0.045, "{f}");
        // With an offset.
        let mut g = ScrambledZipfian::new(1000, 1009, ZIPFIAN_CONSTANT);
        for _ in 0..1000 {
            assert!((1000..1010).contains(&g.next(&mut r)));
        }
    }

    #[test]
    fn latest_favours_recent_ids() {
        let mut l = Latest::new(ZIPFIAN_CONSTANT);
        let mut r = rng(11);
        let count = 1000u64;
        let samples = 100_000;
        let mut recent = 0;
        for _ in 0..samples {
            let s = l.next(&mut r, count);
            assert!((1..count).contains(&s));
            recent += u64::from(s >= count - count / 10);
        }
        assert!(recent as f64 / samples as f64 > 0.6, "{recent}");
        // It follows the count as it grows, and the newest id is the hottest.
        let mut newest = 0;
        for count in 1000..3000u64 {
            let s = l.next(&mut r, count);
            assert!(s < count);
            newest += u64::from(s == count - 1);
        }
        assert!(newest > 200, "{newest}");
        assert_eq!(l.next(&mut r, 1), 0);
    }

    #[test]
    fn uniform_covers_its_range() {
        let u = Uniform::new(10, 5);
        let mut r = rng(12);
        let mut seen = FxHashSet::default();
        for _ in 0..1000 {
            let s = u.next(&mut r);
            assert!((10..15).contains(&s));
            seen.insert(s);
        }
        assert_eq!(seen.len(), 5);
    }

    #[test]
    fn names_round_trip() {
        let names: Vec<String> = Workload::ALL.iter().map(|w| w.to_string()).collect();
        assert_eq!(
            names,
            ["load", "a", "b", "c", "d", "f", "search+", "search-", "insert", "update", "delete"]
        );
        for w in Workload::ALL {
            assert_eq!(w.to_string().parse::<Workload>().unwrap(), w);
            let m = w.mix();
            let sum = m.read + m.update + m.insert + m.read_modify_write + m.delete;
            assert!((sum - 1.0).abs() < 1e-12, "{w}");
        }
        assert_eq!("A".parse::<Workload>().unwrap(), Workload::A);
        assert!("e".parse::<Workload>().is_err());
        for d in [
            Distribution::Zipfian { theta: 0.99 },
            Distribution::Zipfian { theta: 0.5 },
            Distribution::Uniform,
            Distribution::Latest,
        ] {
            assert_eq!(d.to_string().parse::<Distribution>().unwrap(), d);
        }
        assert_eq!(Distribution::default().to_string(), "zipf:0.99");
        assert_eq!("zipf".parse::<Distribution>().unwrap(), Distribution::default());
        assert_eq!("zipf:1.2".parse::<Distribution>().unwrap(), Distribution::Zipfian { theta: 1.2 });
        for bad in ["zipf:2.5", "zipf:-0.1", "zipf:x", "hotspot", ""] {
            assert!(bad.parse::<Distribution>().is_err(), "{bad}");
        }
        assert_eq!(Workload::D.default_distribution(), Distribution::Latest);
        assert_eq!(Workload::A.default_distribution(), Distribution::Zipfian { theta: 0.99 });
    }

    fn all_ops(g: &mut Generator, batch: usize) -> Vec<Op> {
        let mut ops = vec![];
        while !g.done() {
            let b = g.next_batch(batch);
            assert!(!b.is_empty() && b.len() <= batch);
            ops.extend(b);
        }
        assert!(g.next_batch(batch).is_empty());
        ops
    }

    fn count(ops: &[Op], kind: OpKind) -> u64 {
        ops.iter().filter(|o| o.kind == kind).count() as u64
    }

    #[test]
    fn workload_mixes() {
        let (records, operations) = (200_000u64, 100_000u64);
        for w in Workload::ALL {
            let mut g = Generator::new(w, None, records, operations, 1).unwrap();
            let ops = all_ops(&mut g, 4096);
            let total = g.total() as f64;
            assert_eq!(g.produced(), g.total());
            let m = w.mix();
            // Every transaction has exactly one op besides the Update of a read-modify-write.
            let updates_alone = count(&ops, OpKind::Update) as f64 - m.read_modify_write * total;
            let gets_alone = count(&ops, OpKind::Get) as f64 - m.read_modify_write * total;
            let near = |got: f64, want: f64| (got / total - want).abs() < 0.01;
            assert!(near(gets_alone, m.read), "{w}: reads {gets_alone}");
            assert!(near(updates_alone, m.update), "{w}: updates {updates_alone}");
            assert!(near(count(&ops, OpKind::Insert) as f64, m.insert), "{w}: inserts");
            assert!(near(count(&ops, OpKind::Delete) as f64, m.delete), "{w}: deletes");
            assert_eq!(count(&ops, OpKind::Upsert), 0);
            if w == Workload::F {
                // Each transaction reads once.
                assert_eq!(count(&ops, OpKind::Get), operations);
            } else {
                assert_eq!(ops.len() as f64, total, "{w}");
            }
            // Reads and updates target readable ids.
            if !matches!(w, Workload::NegativeSearch | Workload::Load | Workload::Insert | Workload::D) {
                assert!(ops.iter().all(|o| o.id < records), "{w}");
            }
        }
    }

    #[test]
    fn load_inserts_every_record_once_in_order() {
        let mut g = Generator::new(Workload::Load, None, 10_000, 123, 5).unwrap();
        let ops = all_ops(&mut g, 999);
        assert_eq!(ops.len(), 10_000);
        for (i, op) in ops.iter().enumerate() {
            assert_eq!(*op, Op { kind: OpKind::Insert, id: i as u64 });
        }
    }

    #[test]
    fn inserts_take_new_ids_in_order() {
        let mut g = Generator::new(Workload::Insert, None, 500, 1000, 5).unwrap();
        let ops = all_ops(&mut g, 64);
        assert_eq!(ops.iter().map(|o| o.id).collect::<Vec<_>>(), (500..1500).collect::<Vec<_>>());
        assert_eq!(g.inserted(), 1000);
        assert_eq!(g.readable(), 1500);
    }

    #[test]
    fn deletes_are_distinct_and_uniform() {
        let records = 1000u64;
        let mut g = Generator::new(Workload::Delete, None, records, records, 3).unwrap();
        let ops = all_ops(&mut g, 100);
        let ids: FxHashSet<u64> = ops.iter().map(|o| o.id).collect();
        assert_eq!(ids.len(), records as usize);
        assert!(ids.iter().all(|&i| i < records));
        // A permutation, not the identity.
        assert!(ops.iter().enumerate().filter(|(i, o)| o.id == *i as u64).count() < 20);
        // Half of the records: spread over the whole range.
        let mut g = Generator::new(Workload::Delete, None, 100_000, 50_000, 4).unwrap();
        let ops = all_ops(&mut g, 4096);
        let low = ops.iter().filter(|o| o.id < 50_000).count();
        assert!((24_000..26_000).contains(&low), "{low}");
        assert_eq!(ops.iter().map(|o| o.id).collect::<FxHashSet<_>>().len(), 50_000);
        assert!(Generator::new(Workload::Delete, None, 10, 11, 0).is_err());
    }

    #[test]
    fn negative_searches_miss() {
        let (records, operations) = (10_000u64, 20_000u64);
        for d in [None, Some(Distribution::Uniform), Some(Distribution::Latest)] {
            let mut g = Generator::new(Workload::NegativeSearch, d, records, operations, 6).unwrap();
            let ops = all_ops(&mut g, 1000);
            assert!(ops.iter().all(|o| o.kind == OpKind::Get && o.id >= records + operations));
            assert!(ops.iter().all(|o| o.id < 2 * records + operations));
        }
    }

    #[test]
    fn d_reads_only_acknowledged_inserts() {
        let records = 1000u64;
        for d in [None, Some(Distribution::Zipfian { theta: 0.99 }), Some(Distribution::Uniform)] {
            let mut g = Generator::new(Workload::D, d, records, 50_000, 8).unwrap();
            let mut next_insert = records;
            let mut recent = 0u64;
            let mut reads = 0u64;
            while !g.done() {
                let readable = records + g.inserted();
                assert_eq!(g.readable(), readable);
                for op in g.next_batch(100) {
                    match op.kind {
                        OpKind::Get => {
                            assert!(op.id < readable, "{op:?} with {readable} readable");
                            reads += 1;
                            recent += u64::from(op.id + 100 >= readable);
                        }
                        OpKind::Insert => {
                            assert_eq!(op.id, next_insert);
                            next_insert += 1;
                        }
                        other => panic!("{other:?} in workload D"),
                    }
                }
            }
            if d.is_none() {
                // Read latest: most reads hit the newest 100 ids.
                assert!(recent * 2 > reads, "{recent} of {reads}");
            }
        }
    }

    #[test]
    fn read_modify_write_pairs_survive_batch_boundaries() {
        for batch in [1usize, 2, 7, 4096] {
            let mut g = Generator::new(Workload::F, None, 1000, 5000, 2).unwrap();
            let ops = all_ops(&mut g, batch);
            assert_eq!(count(&ops, OpKind::Get), 5000);
            for (i, op) in ops.iter().enumerate() {
                if op.kind == OpKind::Update {
                    assert_eq!(ops[i - 1], Op { kind: OpKind::Get, id: op.id });
                }
            }
            // The same operations whatever the batch size.
            let mut g = Generator::new(Workload::F, None, 1000, 5000, 2).unwrap();
            assert_eq!(all_ops(&mut g, 3), ops);
        }
    }

    #[test]
    fn deterministic_by_seed() {
        for w in Workload::ALL {
            let run = |seed| {
                let mut g = Generator::new(w, None, 10_000, 10_000, seed).unwrap();
                all_ops(&mut g, 512)
            };
            assert_eq!(run(42), run(42), "{w}");
            if !matches!(w, Workload::Load | Workload::Insert) {
                assert_ne!(run(42), run(43), "{w}");
            }
        }
    }

    #[test]
    fn invalid_configurations() {
        assert!(Generator::new(Workload::A, None, 0, 10, 0).is_err());
        assert!(Generator::new(Workload::Insert, None, 0, 10, 0).is_ok());
        assert!(Generator::new(Workload::A, Some(Distribution::Zipfian { theta: 1.0 }), 10, 10, 0).is_ok());
        assert!(Generator::new(Workload::A, Some(Distribution::Zipfian { theta: 3.0 }), 10, 10, 0).is_err());
        assert!(Generator::new(Workload::Insert, None, 1 << 31, 1 << 31, 0).is_ok());
        assert!(Generator::new(Workload::Insert, None, 1 << 31, (1 << 31) + 1, 0).is_err());
        assert!(Generator::new(Workload::NegativeSearch, None, 1 << 31, 1, 0).is_err());
    }

    #[test]
    fn batches_carry_keys_and_values() {
        let ops = [
            Op { kind: OpKind::Insert, id: 3 },
            Op { kind: OpKind::Get, id: 3 },
            Op { kind: OpKind::Update, id: 4 },
            Op { kind: OpKind::Delete, id: 5 },
        ];
        let (kb, vb) = (32, 128);
        let b = batch_of(&ops, kb, vb, 77);
        assert_eq!(b.len(), 4);
        for (i, op) in ops.iter().enumerate() {
            let (kind, key, value) = b.op(i);
            assert_eq!(kind, op.kind);
            assert_eq!(key, crate::key(op.id, kb));
            if op.kind.writes_value() {
                assert_eq!(value, value_of(op.id, 77, vb));
            } else {
                assert_eq!(value, vec![0u8; vb]);
            }
        }
        assert_eq!(value_of(3, 77, vb), value_of(3, 77, vb));
        assert_ne!(value_of(3, 77, vb), value_of(3, 78, vb));
        assert_ne!(value_of(3, 77, vb), value_of(4, 77, vb));
        assert_eq!(value_of(3, 77, 5), value_of(3, 77, vb)[..5]);
        assert!(value_of(3, 77, vb).iter().any(|&b| b != 0));
    }
}
