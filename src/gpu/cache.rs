//! The bucket cache's device buffers and its loading phases (the kernels are in
//! `shaders/cache.wgsl`, the policies and twins in [`crate::cache`]).
//!
//! A loading phase starts every `period` operations: the host reads the access counts, picks
//! the hot groups, plans the fills, and then runs them in slices between batches. Each slice is
//! recorded into the submit of a batch, before its phase A (no extra round trip), and sized so
//! that loading adds at most `load_share` to the time of the batches it runs with: operations
//! never stop, and none is in flight while an entry is replaced. A cache with an entry for every
//! group has nothing to choose: it loads every group in one phase from its first batch, counts
//! no accesses, and then stays as it is.

use std::time::{Duration, Instant};

use gphash_gpu::Gpu;
use gphash_gpu::resources::{download_words, storage_buffer};
use gphash_gpu::shader::Windows;

use super::shader::CacheConfig;
use crate::cache::{self, CacheOptions, CacheStats, Fill, Policy, Snapshot};
use crate::error::Result;
use crate::layout::Geometry;
use crate::protocol::{NONE, control};

/// Fills of the first slice of a loading phase (later slices follow the time budget).
const FIRST_SLICE: usize = 256;

/// The cache of one engine.
pub(crate) struct DeviceCache {
    opts: CacheOptions,
    cfg: CacheConfig,
    groups: u64,
    /// Group -> entry.
    pub map: wgpu::Buffer,
    /// Entry -> group.
    pub owner: wgpu::Buffer,
    /// Per-group access counts or stamps.
    pub counts: wgpu::Buffer,
    /// The fills of the current slice.
    pub plan: wgpu::Buffer,
    /// Group copies, one buffer per window.
    pub table: Vec<wgpu::Buffer>,
    /// Value cells, one buffer per window.
    pub heap: Vec<wgpu::Buffer>,
    /// Host mirror of `owner`.
    owner_host: Vec<u32>,
    /// Fills of the loading phase in progress, and how many are done.
    fills: Vec<Fill>,
    done: usize,
    slice: usize,
    /// Fills of the slice that ran with the last batch.
    last_slice: u32,
    ops_since_load: u64,
    /// Average time a batch spends in the engine (loading excluded).
    batch_time: Option<Duration>,
    stats: CacheStats,
}

/// The cache's device buffers.
struct Buffers {
    map: wgpu::Buffer,
    owner: wgpu::Buffer,
    counts: wgpu::Buffer,
    plan: wgpu::Buffer,
    table: Vec<wgpu::Buffer>,
    heap: Vec<wgpu::Buffer>,
}

impl Buffers {
    /// The buffers of a cache laid out as `cfg` says, of `(gw, vw)` words an entry (group,
    /// values), or the device's out-of-memory error (uninitialised: see `DeviceCache::new`).
    fn new(
        gpu: &Gpu,
        groups: u64,
        cfg: &CacheConfig,
        (gw, vw): (u64, u64),
    ) -> std::result::Result<Self, String> {
        let dev = &gpu.device;
        let storage = |label: &str, words: u64| storage_buffer(dev, label, words * 4);
        let entries = cfg.entries;
        let on = entries > 0;
        let (buffers, oom) = gphash_gpu::error::catch_out_of_memory(dev, || {
            let map = storage("cache map", if on { groups } else { 4 });
            let counts = storage("cache counts", if on { groups } else { 4 });
            let owner = storage("cache owner", entries.max(4) as u64);
            let plan = storage("cache plan", 1 + 2 * entries.max(4) as u64);
            let windows = |label: &str, w: Windows, total: u64| -> Vec<wgpu::Buffer> {
                (0..w.count).map(|i| storage(label, if on { w.len(i, total) } else { 16 })).collect()
            };
            let table = windows("cache groups", cfg.table, entries as u64 * gw);
            let heap = windows("cache values", cfg.heap, entries as u64 * vw);
            Buffers { map, owner, counts, plan, table, heap }
        });
        oom.map_or(Ok(buffers), Err)
    }
}

impl DeviceCache {
    /// A cache of `opts.ratio` of the table's groups within its budget (none when `enabled`
    /// is false). Should the device run out of memory for its buffers (a GPU that other
    /// processes share), it is made again with half the entries, down to none.
    pub(crate) fn new(
        gpu: &Gpu,
        geo: &Geometry,
        opts: &CacheOptions,
        enabled: bool,
        max_window: u64,
    ) -> Result<Self> {
        let mut laps = crate::profile::Laps::start("cache");
        let (mut entries, mut limited) = Self::planned_entries(gpu, geo, opts, enabled, 0)?;
        laps.lap("plan");
        let (gw, vw) = cache::entry_words(geo);
        let entry_bytes = (gw + vw) * 4;
        let groups = geo.groups();
        if let Some(why) = &limited {
            log::info!(
                "cache limited to {entries} entries ({} MiB) by {why}",
                (entries as u64 * entry_bytes) >> 20
            );
        }
        let (cfg, buffers) = loop {
            let cfg = Self::config_for(geo, opts, entries, max_window);
            let made = Buffers::new(gpu, groups, &cfg, (gw, vw));
            // Fault injection: the device has no memory beyond `fail_above` bytes.
            #[cfg(feature = "testing")]
            let made = made.and_then(|b| match opts.fail_above {
                Some(most) if entries as u64 * entry_bytes > most => Err("injected".to_string()),
                _ => Ok(b),
            });
            let oom = match made {
                Ok(b) => break (cfg, b),
                Err(e) => format!("out of device memory for a cache of {entries} entries ({e})"),
            };
            if entries == 0 {
                return Err(crate::error::Error::Gpu(oom));
            }
            log::warn!("{oom}: the cache is made again with {} entries", entries / 2);
            limited = Some(format!("the device's memory: {oom}"));
            entries /= 2;
        };
        laps.lap("buffers");
        let every_group = entries as u64 >= groups;
        let Buffers { map, owner, counts, plan, table, heap } = buffers;
        // Written only once every buffer exists: a write into a buffer the device had no
        // memory for would be an error of its own.
        if entries > 0 {
            gpu.queue.write_buffer(&map, 0, bytemuck::cast_slice(&vec![NONE; groups as usize]));
            gpu.queue.write_buffer(&owner, 0, bytemuck::cast_slice(&vec![NONE; entries as usize]));
        }
        laps.lap("writes");
        Ok(DeviceCache {
            opts: *opts,
            cfg,
            groups,
            map,
            owner,
            counts,
            plan,
            table,
            heap,
            owner_host: vec![NONE; entries as usize],
            fills: vec![],
            done: 0,
            slice: FIRST_SLICE,
            last_slice: 0,
            ops_since_load: if every_group { opts.period } else { 0 },
            batch_time: None,
            stats: CacheStats {
                policy: opts.policy,
                ratio: entries as f64 / groups.max(1) as f64,
                entries,
                limited,
                group_bytes: geo.group_bytes(),
                cell_bytes: geo.cell_words() as u64 * 4,
                ..CacheStats::default()
            },
        })
    }

    /// How the kernels see the cache [`DeviceCache::new`] would make for `geo` once `freed`
    /// more bytes of device memory are free (another engine's cache, dropped first), unless
    /// the device then has too little memory for it.
    pub(crate) fn planned(
        gpu: &Gpu,
        geo: &Geometry,
        opts: &CacheOptions,
        (enabled, freed): (bool, u64),
        max_window: u64,
    ) -> Result<CacheConfig> {
        let (entries, _) = Self::planned_entries(gpu, geo, opts, enabled, freed)?;
        Ok(Self::config_for(geo, opts, entries, max_window))
    }

    /// The entries of a cache of `opts.ratio` of the table's groups within its budget (with
    /// `freed` more bytes free than now), and what limited them below that, before any buffer
    /// is made.
    fn planned_entries(
        gpu: &Gpu,
        geo: &Geometry,
        opts: &CacheOptions,
        enabled: bool,
        freed: u64,
    ) -> Result<(u32, Option<String>)> {
        opts.validate()?;
        if !enabled {
            return Ok((0, None));
        }
        let (gw, vw) = cache::entry_words(geo);
        let groups = geo.groups();
        let available = gpu.device_memory_available().map(|a| a + freed);
        log::debug!("device memory available: {available:?} bytes");
        let entries = opts.entries(groups, (gw + vw) * 4, &gpu.info, available);
        let mut limited = None;
        if (entries as u64) < opts.wanted_entries(groups, &gpu.info).min(u32::MAX as u64 - 1) {
            limited = Some(opts.budget(&gpu.info, available).1.to_string());
        }
        // Kernels address each region with 32-bit word indices.
        let limit = (u32::MAX as u64 / gw.max(vw)) as u32;
        if entries > limit {
            return Ok((limit, Some("the 16 GiB a region's 32-bit word indices address".into())));
        }
        Ok((entries, limited))
    }

    /// A cache of `entries` entries for `geo`, as the kernels see it. A cache for every group
    /// has nothing to choose: no counts, one phase from the first batch.
    fn config_for(geo: &Geometry, opts: &CacheOptions, entries: u32, max_window: u64) -> CacheConfig {
        let (gw, vw) = cache::entry_words(geo);
        match entries {
            0 => CacheConfig::off(),
            _ => CacheConfig {
                entries,
                count_mode: if entries as u64 >= geo.groups() { 0 } else { opts.policy.count_mode() },
                table: Windows::cover(entries as u64 * gw, max_window),
                heap: Windows::cover(entries as u64 * vw, max_window),
            },
        }
    }

    /// How the kernels see it.
    pub(crate) fn config(&self) -> CacheConfig {
        self.cfg
    }

    /// The options it was made with.
    pub(crate) fn opts(&self) -> &CacheOptions {
        &self.opts
    }

    /// Whether it has entries.
    pub(crate) fn enabled(&self) -> bool {
        self.cfg.entries > 0
    }

    /// Phase A counts one access in this many (0: none).
    pub(crate) fn count_every(&self) -> u32 {
        if self.counts_accesses() { self.opts.sample } else { 0 }
    }

    /// Whether the policy counts accesses (and a loading phase must read the counts).
    pub(crate) fn counts_accesses(&self) -> bool {
        self.cfg.count_mode != 0
    }

    /// What it did so far.
    pub(crate) fn stats(&self) -> CacheStats {
        CacheStats {
            cached: self.owner_host.iter().filter(|&&g| g != NONE).count() as u32,
            loading: self.loading(),
            ..self.stats.clone()
        }
    }

    /// Notes the start of a batch of `ops` operations, after one that spent `previous` in the
    /// engine (zero for the first). True when a loading slice should run with it: a loading
    /// phase is in progress, or one is due.
    ///
    /// The slices' size follows the time budget: a batch that ran a slice took `previous`, the
    /// average batch without one takes `batch_time`; the difference is what the slice cost.
    pub(crate) fn batch_starts(&mut self, ops: u64, previous: Duration) -> bool {
        if !self.enabled() {
            return false;
        }
        match (std::mem::take(&mut self.last_slice), self.batch_time) {
            (_, _) if previous.is_zero() => {}
            (0, avg) => self.batch_time = Some(avg.map_or(previous, |avg| (avg * 7 + previous) / 8)),
            (fills, Some(batch)) => {
                let extra = previous.saturating_sub(batch);
                self.stats.load_time += extra;
                let share = self.opts.load_share;
                let budget = batch.as_secs_f64() * share / (1.0 - share).max(1e-3);
                let scale = (budget / extra.as_secs_f64().max(1e-6)).clamp(0.25, 4.0);
                self.slice = ((fills as f64 * scale) as usize).max(16).min(self.cfg.entries as usize);
                log::debug!(
                    "cache slice of {fills} fills: {extra:?} over a batch of {batch:?}; next {}",
                    self.slice
                );
            }
            (_, None) => {}
        }
        self.ops_since_load = self.ops_since_load.saturating_add(ops);
        self.loading() || (self.ops_since_load >= self.opts.period && !self.complete())
    }

    /// Whether it has an entry for every group of the table.
    fn holds_every_group(&self) -> bool {
        self.cfg.entries as u64 >= self.groups
    }

    /// Whether it holds every group of the table already: no loading phase can change it.
    fn complete(&self) -> bool {
        self.holds_every_group() && self.stats.loads > 0 && !self.loading()
    }

    /// Whether a loading phase is in progress.
    pub(crate) fn loading(&self) -> bool {
        self.done < self.fills.len()
    }

    /// Starts a loading phase: picks the hot groups from `counts` (downloaded by the caller;
    /// empty for the random policy), and for a `whole` load uncounted groups for the spare
    /// entries, and plans their fills; `elapsed` is what reading the counts took.
    pub(crate) fn start_load(&mut self, counts: &[u32], elapsed: Duration, whole: bool) {
        let t = Instant::now();
        let seed = self.opts.seed ^ self.stats.loads.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let counts: Vec<u32> =
            if counts.is_empty() { vec![0; self.groups as usize] } else { counts.to_vec() };
        let whole = whole || self.holds_every_group();
        let chosen = cache::select(self.opts.policy, &counts, self.cfg.entries as usize, seed, whole);
        let lfu = (self.opts.policy == Policy::Lfu).then_some(&counts[..]);
        self.fills = cache::plan(&self.owner_host, &chosen, self.groups, lfu);
        self.done = 0;
        self.slice = FIRST_SLICE;
        self.ops_since_load = 0;
        self.stats.loads += 1;
        self.stats.load_time += elapsed + t.elapsed();
    }

    /// Uploads the next slice's fills (`whole`: all that are left) to the plan buffer, for the
    /// next submit; returns how many (0: none left). The host mirror takes them at once: they
    /// run before anything reads the mappings again.
    pub(crate) fn next_slice(&mut self, gpu: &Gpu, whole: bool) -> u32 {
        let left = self.fills.len() - self.done;
        let n = if whole { left } else { self.slice.min(left) };
        let fills = &self.fills[self.done..self.done + n];
        // Written only for a fill kernel to read (a queue write waits for wgpu's next submit,
        // and a batch with no fill may be submitted without wgpu).
        if n > 0 {
            let words: Vec<u32> =
                std::iter::once(n as u32).chain(fills.iter().flat_map(|f| [f.entry, f.group])).collect();
            gpu.queue.write_buffer(&self.plan, 0, bytemuck::cast_slice(&words));
        }
        for f in fills {
            self.owner_host[f.entry as usize] = f.group;
        }
        self.done += n;
        self.last_slice = n as u32;
        n as u32
    }

    /// Counts `elapsed` of loading done on its own (a loading phase on demand).
    pub(crate) fn loaded_for(&mut self, elapsed: Duration) {
        self.stats.load_time += elapsed;
        self.last_slice = 0;
    }

    /// Adds a phase's counters to the statistics.
    pub(crate) fn record(&mut self, ctl: &[u32; control::WORDS]) {
        let s = &mut self.stats;
        s.targets += ctl[control::CACHE_TARGETS] as u64;
        s.hits += ctl[control::CACHE_HITS] as u64;
        s.group_reads_saved += ctl[control::CACHE_GROUPS_SAVED] as u64;
        s.value_reads_saved += ctl[control::CACHE_VALUES_SAVED] as u64;
        s.refresh_reads += ctl[control::CACHE_REFRESHED] as u64;
        s.groups_loaded += ctl[control::CACHE_FILLED] as u64;
        s.stale += ctl[control::CACHE_STALE] as u64;
    }

    /// Downloads the counts (`groups` words).
    pub(crate) fn download_counts(&self, gpu: &Gpu) -> Result<Vec<u32>> {
        Ok(download_words(gpu, &self.counts, self.groups)?)
    }

    /// Downloads everything the device holds.
    pub(crate) fn snapshot(&self, gpu: &Gpu) -> Result<Snapshot> {
        if !self.enabled() {
            return Ok(Snapshot::default());
        }
        let concat = |bufs: &[wgpu::Buffer]| -> Result<Vec<u32>> {
            let mut out = vec![];
            for b in bufs {
                out.extend(download_words(gpu, b, b.size() / 4)?);
            }
            Ok(out)
        };
        Ok(Snapshot {
            map: download_words(gpu, &self.map, self.groups)?,
            owner: download_words(gpu, &self.owner, self.cfg.entries as u64)?,
            counts: self.download_counts(gpu)?,
            table: concat(&self.table)?,
            values: concat(&self.heap)?,
        })
    }
}
