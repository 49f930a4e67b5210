//! BktCache: hot groups of the table copied into device memory (see `docs/cache.md`).
//!
//! The unit is a **group**: the candidate buckets of one hash location lie in one group, so a
//! cached group answers a whole probe of that location. An entry holds the group's words as they
//! are in the pool, and the value cell of each of its published slots (a positive search of a
//! cached key makes no request to host memory at all). The mapping group -> entry (`F`) and
//! entry -> group (`G`) live in device memory; membership is frozen between loading phases.
//!
//! This module is the host side shared by the GPU engine and the tests: options and policies,
//! the choice of hot groups, the plan of a loading phase, statistics, and the CPU twins of the
//! kernels in `shaders/cache.wgsl` and of the access counting in `shaders/phase_a.wgsl`.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::DeviceInfo;
use crate::batch::Encoded;
use crate::error::{Error, Result};
use crate::layout::{Geometry, PUBLISHED};
use crate::model::Model;
use crate::protocol::{NONE, OpKind};

/// How a loading phase picks the groups to cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Policy {
    /// The most frequently accessed groups since the last loading phases (counts halve at
    /// every loading phase, so old popularity fades).
    #[default]
    Lfu,
    /// The most recently accessed groups (each access stamps its group with the batch number).
    Lru,
    /// Groups drawn uniformly at random at every loading phase (no counting at all).
    Random,
}

impl Policy {
    /// How phase A records accesses (`CACHE_COUNT` in the kernels): 0 none, 1 add, 2 stamp.
    pub fn count_mode(self) -> u32 {
        match self {
            Policy::Lfu => 1,
            Policy::Lru => 2,
            Policy::Random => 0,
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Policy::Lfu => "lfu",
            Policy::Lru => "lru",
            Policy::Random => "random",
        })
    }
}

impl FromStr for Policy {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "lfu" => Ok(Policy::Lfu),
            "lru" => Ok(Policy::Lru),
            "random" => Ok(Policy::Random),
            _ => Err(Error::InvalidConfig(format!("cache policy {s:?}: one of lfu, lru, random"))),
        }
    }
}

/// Cache settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheOptions {
    /// Cached groups as a fraction of the table's groups, 0 (no cache) to 1 (all of them),
    /// within `max_bytes`. `None` (the default): all of them on a GPU with memory of its own
    /// ([`DeviceInfo::has_own_memory`](crate::DeviceInfo::has_own_memory)), none on a CPU
    /// device or an integrated GPU, whose device memory is the host memory the pool is
    /// already in (there the cache only adds copies: docs/lab/cache.md, "The whole table cached
    /// by default").
    pub ratio: Option<f64>,
    /// Device memory the cache's entries may take (a group and its value cells each; the map
    /// and access counts, 8 bytes a group, come on top). `None`: half the device's memory
    /// ([`DeviceInfo::device_memory`](crate::DeviceInfo::device_memory)), and no more than
    /// three quarters of what the device reports free when the table opens (other processes
    /// may hold the rest), so that a table larger than that is cached in part rather than
    /// failing for want of memory. Should the device still run out of memory for the cache,
    /// it is made with half the entries, down to none ([`CacheStats::limited`] says why).
    pub max_bytes: Option<u64>,
    /// How hot groups are picked.
    pub policy: Policy,
    /// Operations between the starts of two loading phases.
    pub period: u64,
    /// Share of the time of the batches during a loading phase that the loading may take: the
    /// phase proceeds in slices between batches, each sized to this budget.
    pub load_share: f64,
    /// Phase A counts one access in this many (LFU, LRU; 0: none, membership then changes only
    /// by what was counted before): sampling keeps hot groups' counters from being contended by
    /// every operation, and they remain by far the largest.
    pub sample: u32,
    /// Seed of the random policy.
    pub seed: u64,
    /// Fault injection (feature `testing`): the device runs out of memory for any cache whose
    /// entries take more than this many bytes.
    #[cfg(feature = "testing")]
    pub fail_above: Option<u64>,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            ratio: None,
            max_bytes: None,
            policy: Policy::Lfu,
            period: 1 << 22,
            load_share: 0.2,
            sample: 8,
            seed: 7,
            #[cfg(feature = "testing")]
            fail_above: None,
        }
    }
}

impl CacheOptions {
    /// No cache.
    pub fn off() -> Self {
        CacheOptions { ratio: Some(0.0), ..CacheOptions::default() }
    }

    /// Checks the ranges.
    pub fn validate(&self) -> Result<()> {
        if let Some(r) = self.ratio
            && !(0.0..=1.0).contains(&r)
        {
            return Err(Error::InvalidConfig(format!("cache ratio {r}: must be 0 to 1")));
        }
        if self.period == 0 {
            return Err(Error::InvalidConfig("cache period: must be at least 1 operation".into()));
        }
        if !(self.load_share > 0.0 && self.load_share <= 1.0) {
            return Err(Error::InvalidConfig(format!(
                "cache load share {}: must be in (0, 1]",
                self.load_share
            )));
        }
        Ok(())
    }

    /// The ratio on `device`: the one asked, or the device's default.
    pub fn ratio_on(&self, device: &DeviceInfo) -> f64 {
        self.ratio.unwrap_or(if device.has_own_memory() { 1.0 } else { 0.0 })
    }

    /// Entries the ratio asks for a table of `groups` groups on `device`, budget aside.
    pub fn wanted_entries(&self, groups: u64, device: &DeviceInfo) -> u64 {
        ((groups as f64 * self.ratio_on(device)).round() as u64).min(groups)
    }

    /// The bytes the cache's entries may take on `device` with `available` bytes of its memory
    /// free (`None`: not reported), and what sets that limit.
    pub fn budget(&self, device: &DeviceInfo, available: Option<u64>) -> (u64, &'static str) {
        if let Some(most) = self.max_bytes {
            return (most, "its budget (max_bytes)");
        }
        let half = device.device_memory / 2;
        match available.map(|a| a / 4 * 3) {
            Some(free) if free < half => (free, "three quarters of the device memory free at the open"),
            _ => (half, "half the device's memory"),
        }
    }

    /// Entries of the cache of a table of `groups` groups, entries of `entry_bytes` each, on
    /// `device` with `available` bytes of its memory free (`None`: not reported): those
    /// wanted, within the budget.
    pub fn entries(&self, groups: u64, entry_bytes: u64, device: &DeviceInfo, available: Option<u64>) -> u32 {
        let budget = self.budget(device, available).0 / entry_bytes.max(1);
        self.wanted_entries(groups, device).min(budget).min(u32::MAX as u64 - 1) as u32
    }
}

/// Words of one cache entry's group copy, and of its value cells.
pub(crate) fn entry_words(geo: &Geometry) -> (u64, u64) {
    (geo.group_words(), geo.group_slots() * geo.cell_words() as u64)
}

/// What the cache did since the index was opened.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CacheStats {
    /// Policy.
    pub policy: Policy,
    /// Entries over the table's groups.
    pub ratio: f64,
    /// Entries (groups it can hold).
    pub entries: u32,
    /// Entries holding a group now.
    pub cached: u32,
    /// Why the cache holds fewer groups than its ratio asks (a budget, the device's free
    /// memory, or an out-of-memory error at its creation), if it does.
    pub limited: Option<String>,
    /// Operations that found their key or claimed a slot (the hit rate's denominator).
    pub targets: u64,
    /// Of those, operations whose slot was in a cached group.
    pub hits: u64,
    /// Loading phases started.
    pub loads: u64,
    /// Whether a loading phase is in progress.
    pub loading: bool,
    /// Groups copied into entries by loading phases.
    pub groups_loaded: u64,
    /// Time spent choosing hot groups and running the loading slices.
    pub load_time: Duration,
    /// Group reads served by the cache, or skipped because a cached group held the key.
    pub group_reads_saved: u64,
    /// Value reads served by the cache.
    pub value_reads_saved: u64,
    /// Reads of state words by the write-through refresh (the cache's own cost).
    pub refresh_reads: u64,
    /// Claims that found a cached copy stale (always 0: a test asserts it).
    pub stale: u64,
    /// Bytes of one group read.
    pub group_bytes: u64,
    /// Bytes of one value cell.
    pub cell_bytes: u64,
}

impl CacheStats {
    /// `hits / targets`.
    pub fn hit_rate(&self) -> f64 {
        if self.targets == 0 { 0.0 } else { self.hits as f64 / self.targets as f64 }
    }

    /// Requests to the table's memory saved, net of the refresh reads.
    pub fn requests_saved(&self) -> i64 {
        (self.group_reads_saved + self.value_reads_saved) as i64 - self.refresh_reads as i64
    }

    /// Bytes read from the table's memory saved, net of the refresh reads (4 bytes each).
    pub fn bytes_saved(&self) -> i64 {
        (self.group_reads_saved * self.group_bytes + self.value_reads_saved * self.cell_bytes) as i64
            - 4 * self.refresh_reads as i64
    }
}

impl fmt::Display for CacheStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {:.0}% ({} entries, {} cached); hit rate {:.1}% ({} of {}); {} loads of {} groups in {:.3} s; \
             saved {} requests, {:.1} MB",
            self.policy,
            self.ratio * 100.0,
            self.entries,
            self.cached,
            self.hit_rate() * 100.0,
            self.hits,
            self.targets,
            self.loads,
            self.groups_loaded,
            self.load_time.as_secs_f64(),
            self.requests_saved(),
            self.bytes_saved() as f64 / 1e6
        )?;
        match &self.limited {
            Some(why) => write!(f, "; limited by {why}"),
            None => Ok(()),
        }
    }
}

/// Whether an index has a cache, and what it did.
#[derive(Clone, Debug, PartialEq)]
pub enum CacheStatus {
    /// No cache, and why.
    Off {
        /// Why.
        reason: String,
    },
    /// A cache and its statistics.
    On(CacheStats),
}

impl fmt::Display for CacheStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheStatus::Off { reason } => write!(f, "off ({reason})"),
            CacheStatus::On(s) => s.fmt(f),
        }
    }
}

/// The groups a loading phase caches: up to `k` of them. LFU and LRU take the groups with the
/// highest counts (ties: the lower group), then, when `spare` asks for it, groups that were not
/// counted (the lowest first) while entries are left: accesses are sampled, so an uncounted
/// group may still be in use. Only a whole load asked for by the caller takes them: a periodic
/// phase loads in slices between batches, and copying every cold group there slowed YCSB
/// (docs/lab/cache.md, "A whole cache load fills its spare entries"). `plan` never lets an
/// uncounted group displace a cached one. Random draws `k` groups uniformly.
pub(crate) fn select(policy: Policy, counts: &[u32], k: usize, seed: u64, spare: bool) -> Vec<u32> {
    let k = k.min(counts.len());
    match policy {
        Policy::Random => sample(counts.len(), k, seed),
        Policy::Lfu | Policy::Lru => {
            let mut hot: Vec<u32> = (0..counts.len() as u32).filter(|&g| counts[g as usize] > 0).collect();
            let order = |a: &u32, b: &u32| counts[*b as usize].cmp(&counts[*a as usize]).then(a.cmp(b));
            if hot.len() > k {
                hot.select_nth_unstable_by(k, order);
                hot.truncate(k);
            }
            if spare {
                let cold = (0..counts.len() as u32).filter(|&g| counts[g as usize] == 0);
                let room = k - hot.len();
                hot.extend(cold.take(room));
            }
            hot
        }
    }
}

/// `k` distinct numbers below `n`, each `k`-subset equally likely for a random `seed`: the
/// first `k` steps of a Fisher-Yates shuffle of `0..n`, the displaced entries kept in a map.
fn sample(n: usize, k: usize, seed: u64) -> Vec<u32> {
    // SplitMix64: a full-period 64-bit generator, plenty for picking groups.
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    // Uniform below `m` (Lemire's multiply-shift, rejecting the few biased draws).
    let mut below = |m: u64| {
        let threshold = m.wrapping_neg() % m;
        loop {
            let p = next() as u128 * m as u128;
            if p as u64 >= threshold {
                return (p >> 64) as u64;
            }
        }
    };
    let mut moved: HashMap<usize, usize> = HashMap::with_capacity(k);
    (0..k)
        .map(|i| {
            let j = i + below((n - i) as u64) as usize;
            let at_j = moved.get(&j).copied().unwrap_or(j);
            let at_i = moved.get(&i).copied().unwrap_or(i);
            moved.insert(j, at_i);
            at_j as u32
        })
        .collect()
}

/// One step of a loading phase: entry `entry` drops the group it holds and takes `group`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fill {
    /// The entry.
    pub entry: u32,
    /// The group it takes.
    pub group: u32,
}

/// How much more often a group must have been accessed than a cached one to take its entry
/// (LFU): popularity that merely wobbles between loading phases moves nothing.
pub(crate) const HYSTERESIS: u64 = 2;

/// The fills that make the cache hold `chosen`: groups already cached stay where they are;
/// every other chosen group takes an entry that holds nothing or a group not chosen. `owner`
/// is the group each entry holds (`NONE`: nothing). With `counts` (LFU), the hottest new groups
/// go first, into the entries of the coldest groups, and a new group displaces a cached one only
/// if it has more than [`HYSTERESIS`] times its count.
pub(crate) fn plan(owner: &[u32], chosen: &[u32], groups: u64, counts: Option<&[u32]>) -> Vec<Fill> {
    let mut wanted = vec![false; groups as usize];
    for &g in chosen {
        wanted[g as usize] = true;
    }
    let mut cached = vec![false; groups as usize];
    for &g in owner.iter().filter(|&&g| g != NONE) {
        cached[g as usize] = true;
    }
    let count = |g: u32| counts.map_or(0, |c| c[g as usize] as u64);
    let mut free: Vec<u32> = (0..owner.len() as u32)
        .filter(|&e| owner[e as usize] == NONE || !wanted[owner[e as usize] as usize])
        .collect();
    let mut new: Vec<u32> = chosen.iter().copied().filter(|&g| !cached[g as usize]).collect();
    if counts.is_some() {
        let held = |e: u32| (owner[e as usize] != NONE).then(|| count(owner[e as usize]));
        free.sort_by_key(|&e| held(e));
        new.sort_by_key(|&g| std::cmp::Reverse(count(g)));
    }
    free.into_iter()
        .zip(new)
        .take_while(|&(e, g)| {
            let old = owner[e as usize];
            counts.is_none() || old == NONE || count(g) > HYSTERESIS * count(old)
        })
        .map(|(entry, group)| Fill { entry, group })
        .collect()
}

/// The CPU twin of a cache entry (`fill` and `refresh` in `shaders/cache.wgsl`): the words of
/// group `group` of `table`, and the value cell of each published slot (zero for the others).
pub fn expected_entry(geo: &Geometry, table: &[u32], heap: &[u32], group: u64) -> (Vec<u32>, Vec<u32>) {
    let gw = geo.group_words() as usize;
    let words = table[group as usize * gw..(group as usize + 1) * gw].to_vec();
    let cw = geo.cell_words() as usize;
    let mut values = vec![0; geo.group_slots() as usize * cw];
    let buckets = geo.layout.group_buckets() as u64;
    for b in 0..buckets {
        for s in 0..geo.layout.slots {
            let state = table[geo.state_word(group * buckets + b, s) as usize];
            let fp = table[geo.fp_word(group * buckets + b, s) as usize];
            if let Some(Ok(cell)) = (state >= PUBLISHED).then(|| geo.published_cell(fp, state)) {
                let pos = (b * geo.layout.slots as u64 + s as u64) as usize;
                let cell = cell as usize;
                values[pos * cw..(pos + 1) * cw].copy_from_slice(&heap[cell * cw..(cell + 1) * cw]);
            }
        }
    }
    (words, values)
}

/// The cache as the device holds it (downloaded for tests and checks).
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Group -> entry (`NONE`: not cached).
    pub map: Vec<u32>,
    /// Entry -> group (`NONE`: empty entry).
    pub owner: Vec<u32>,
    /// Per group: its access count (LFU) or last-access stamp (LRU).
    pub counts: Vec<u32>,
    /// The entries' group copies, `group_words` each.
    pub table: Vec<u32>,
    /// The entries' value cells, `group_slots * cell_words` each.
    pub values: Vec<u32>,
}

/// Compares a snapshot with the pool: the two mappings are inverse, and every entry that holds
/// a group holds exactly the group's words and the values of its published slots. Returns the
/// violations (empty: coherent).
pub fn verify(geo: &Geometry, table: &[u32], heap: &[u32], snap: &Snapshot) -> Vec<String> {
    let mut bad = vec![];
    let (gw, vw) = entry_words(geo);
    for (g, &e) in snap.map.iter().enumerate() {
        if e != NONE && snap.owner.get(e as usize) != Some(&(g as u32)) {
            bad.push(format!("group {g} maps to entry {e}, which holds {:?}", snap.owner.get(e as usize)));
        }
    }
    for (e, &g) in snap.owner.iter().enumerate() {
        if g == NONE {
            continue;
        }
        if snap.map.get(g as usize) != Some(&(e as u32)) {
            bad.push(format!("entry {e} holds group {g}, which maps to {:?}", snap.map.get(g as usize)));
            continue;
        }
        let (words, values) = expected_entry(geo, table, heap, g as u64);
        let (e, g) = (e as u64, g as u64);
        if snap.table[(e * gw) as usize..((e + 1) * gw) as usize] != words[..] {
            bad.push(format!("entry {e}: its copy of group {g} differs from the pool"));
        }
        // Only the cells of published slots are defined.
        let cw = geo.cell_words() as u64;
        for pos in 0..geo.group_slots() {
            let (b, s) = (pos / geo.layout.slots as u64, (pos % geo.layout.slots as u64) as u32);
            let state = table[geo.state_word(g * geo.layout.group_buckets() as u64 + b, s) as usize];
            let at = (e * vw + pos * cw) as usize;
            if state >= PUBLISHED
                && snap.values[at..at + cw as usize] != values[(pos * cw) as usize..((pos + 1) * cw) as usize]
            {
                bad.push(format!("entry {e} (group {g}): the value of slot {pos} differs from the pool"));
            }
        }
    }
    bad
}

/// Whether phase A counts the access of operation `op` of the batch numbered `stamp`, counting
/// one in `every` (twin of `note_access` in `shaders/common/table.wgsl`).
pub fn counted(op: u32, stamp: u32, every: u32) -> bool {
    every != 0 && crate::hash::fmix(op ^ stamp.wrapping_mul(0x9E37_79B9)).is_multiple_of(every)
}

/// The CPU twin of phase A's access counting: the groups one batch's operations touch, given
/// the table before the batch (`before`) and after it (`after`), each with the operation that
/// touches it (phase A counts it if [`counted`]). An operation that finds its
/// key touches the key's group; one that claims a slot for a new key touches the group the key
/// was published in; every other operation (absent key, join, full) touches the group of each
/// of its hash locations, all of which it probed. Operations without a free value cell touch
/// nothing (the batch then rolls back; tests avoid it).
pub fn touches(model: &Model, before: &[u32], after: &[u32], batch: &Encoded) -> Vec<(usize, u32)> {
    let geo = model.geo;
    let kw = geo.key_words() as usize;
    let group_of = |bucket: u64| (bucket / geo.layout.group_buckets() as u64) as u32;
    let mut claimed = std::collections::HashSet::new();
    let mut out = vec![];
    for i in 0..batch.len() {
        let key = &batch.keys[i * kw..(i + 1) * kw];
        let kind = OpKind::from_code(batch.kinds[i]).expect("encoded from OpKind");
        let probe = model.probe(before, key);
        if let Some(c) = probe.published() {
            out.push((i, group_of(probe.candidates[c].bucket)));
            continue;
        }
        if matches!(kind, OpKind::Insert | OpKind::Upsert) && claimed.insert(key.to_vec()) {
            let now = model.probe(after, key);
            let c = now.published().expect("a claimed key is published after its batch");
            out.push((i, group_of(now.candidates[c].bucket)));
            continue;
        }
        let per_location = (geo.layout.levels * geo.layout.slots) as usize;
        let location = |h: usize| (i, group_of(probe.candidates[h * per_location].bucket));
        out.extend((0..geo.layout.hashes as usize).map(location));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Layout;

    #[test]
    fn lfu_takes_the_most_counted_groups_then_cold_ones_when_asked() {
        let counts = [0, 5, 1, 9, 5, 0, 2];
        let mut got = select(Policy::Lfu, &counts, 3, 0, true);
        got.sort();
        assert_eq!(got, vec![1, 3, 4]);
        let mut counted = select(Policy::Lru, &counts, 10, 0, false);
        counted.sort();
        assert_eq!(counted, vec![1, 2, 3, 4, 6]);
        // Room for six: the five counted groups, then the lowest uncounted one.
        let mut six = select(Policy::Lru, &counts, 6, 0, true);
        six.sort();
        assert_eq!(six, vec![0, 1, 2, 3, 4, 6]);
        let mut all = select(Policy::Lfu, &counts, 10, 0, true);
        all.sort();
        assert_eq!(all, (0..7).collect::<Vec<u32>>());
    }

    #[test]
    fn random_draws_distinct_groups_reproducibly() {
        let counts = vec![0; 100];
        let a = select(Policy::Random, &counts, 20, 3, false);
        let mut distinct = a.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 20);
        assert_eq!(a, select(Policy::Random, &counts, 20, 3, false));
        assert_ne!(a, select(Policy::Random, &counts, 20, 4, false));
    }

    #[test]
    fn random_draws_are_uniform() {
        // 3 of 10 groups over 6000 seeds: each group about 1800 times, every one of them drawn.
        let mut times = [0u32; 10];
        for seed in 0..6000 {
            for g in select(Policy::Random, &[0; 10], 3, seed, false) {
                times[g as usize] += 1;
            }
        }
        assert!(times.iter().all(|&t| (1600..2000).contains(&t)), "{times:?}");
        let all = select(Policy::Random, &[0; 10], 10, 1, false);
        assert_eq!(all.iter().collect::<std::collections::HashSet<_>>().len(), 10);
    }

    #[test]
    fn plans_keep_cached_groups_and_reuse_entries_of_cold_ones() {
        // Entries hold groups 4, nothing, 7, 9; groups 7, 2 and 5 are chosen.
        let owner = [4, NONE, 7, 9];
        let fills = plan(&owner, &[7, 2, 5], 10, None);
        assert_eq!(fills, vec![Fill { entry: 0, group: 2 }, Fill { entry: 1, group: 5 }]);
        // More chosen groups than entries: the rest wait for the next phase.
        assert_eq!(plan(&[NONE], &[1, 2], 3, None).len(), 1);
    }

    #[test]
    fn lfu_plans_displace_only_much_colder_groups() {
        // Entries hold groups 4 (count 10), nothing, 9 (count 3); groups 2 (count 25) and 5
        // (count 15) are chosen. The empty entry takes the hottest, 2; group 9 (3) is displaced
        // by 5 (15 > 2 * 3); group 4 (10) would not be by anything below 21.
        let mut counts = vec![0u32; 10];
        (counts[4], counts[9], counts[2], counts[5]) = (10, 3, 25, 15);
        let fills = plan(&[4, NONE, 9], &[2, 5], 10, Some(&counts));
        assert_eq!(fills, vec![Fill { entry: 1, group: 2 }, Fill { entry: 2, group: 5 }]);
        counts[5] = 6;
        // Entries of groups 7 (0), 9 (3) and 4 (10), coldest first: 2 takes 7's, 5 (6) not 9's.
        assert_eq!(plan(&[4, 7, 9], &[2, 5], 10, Some(&counts)), vec![Fill { entry: 1, group: 2 }]);
    }

    #[test]
    fn entries_follow_the_ratio_within_the_budget() {
        let gpu = DeviceInfo {
            name: "a GPU".into(),
            driver: String::new(),
            device_type: wgpu::DeviceType::DiscreteGpu,
            subgroup_sizes: (32, 32),
            host_import: true,
            import_alignment: 4096,
            max_binding: 1 << 30,
            max_buffer: 1 << 30,
            max_storage_buffers: 8,
            max_immediates: 128,
            timestamps: false,
            timestamp_period: 0.0,
            int64: false,
            binding_arrays: 0,
            device_memory: 1 << 30,
            device_addresses: false,
        };
        let cpu = DeviceInfo { device_type: wgpu::DeviceType::Cpu, ..gpu.clone() };
        let o = CacheOptions { ratio: Some(0.2), ..CacheOptions::default() };
        assert_eq!(o.entries(1000, 100, &gpu, None), 200);
        assert_eq!(o.entries(1000, 100, &cpu, None), 200);
        assert_eq!(CacheOptions::off().entries(1000, 100, &gpu, None), 0);
        // By default the whole table on a GPU, within half its memory; none on a CPU device.
        let auto = CacheOptions::default();
        assert_eq!(auto.entries(1000, 100, &gpu, None), 1000);
        assert_eq!(auto.entries(1000, 100, &DeviceInfo { device_memory: 20_000, ..gpu.clone() }, None), 100);
        assert_eq!(auto.entries(1000, 100, &cpu, None), 0);
        assert_eq!(CacheOptions { max_bytes: Some(30_050), ..auto }.entries(1000, 100, &gpu, None), 300);
        assert_eq!(CacheOptions { max_bytes: Some(99), ..o }.entries(1000, 100, &gpu, None), 0);
        assert!(CacheOptions { ratio: Some(1.5), ..o }.validate().is_err());
        assert!(CacheOptions { period: 0, ..o }.validate().is_err());
        // Within three quarters of what the device reports free, whichever is less.
        assert_eq!(auto.entries(1000, 100, &gpu, Some(40_000)), 300);
        assert_eq!(auto.entries(1000, 100, &gpu, Some(1 << 40)), 1000);
        // An explicit budget is taken as given.
        assert_eq!(CacheOptions { max_bytes: Some(30_050), ..auto }.entries(1000, 100, &gpu, Some(0)), 300);
    }

    #[test]
    fn verify_catches_a_stale_copy() {
        let geo = Geometry::new(Layout::default(), 8, 8, 3, 64).unwrap();
        let mut table = vec![0u32; geo.table_words() as usize];
        let heap: Vec<u32> = (0..geo.heap_words() as u32).collect();
        table[geo.state_word(3, 1) as usize] = PUBLISHED + 5;
        let (words, values) = expected_entry(&geo, &table, &heap, 1);
        let mut snap = Snapshot {
            map: vec![NONE; geo.groups() as usize],
            owner: vec![1],
            table: words,
            values,
            counts: vec![],
        };
        snap.map[1] = 0;
        assert!(verify(&geo, &table, &heap, &snap).is_empty());
        // Bucket 3 is the first of group 1: slot 1 of it is position 1 of the entry.
        snap.values[geo.cell_words() as usize] ^= 1;
        assert_eq!(verify(&geo, &table, &heap, &snap).len(), 1);
        snap.map[1] = NONE;
        assert_eq!(verify(&geo, &table, &heap, &snap).len(), 1);
    }
}
