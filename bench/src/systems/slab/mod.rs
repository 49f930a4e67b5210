//! `slab`: SlabHash (Ashkiani et al., IPDPS'18; seed `001`) made persistent with an undo log
//! (SlabHash-GPM), on the GPU through WGSL compute shaders, over a host-pm pool that the GPU
//! reads and writes in place. A baseline gphash is measured against (DESIGN §9).
//!
//! # Layout (`layout.rs`)
//!
//! One bucket per base slab; a slab is 128 bytes (32 words): as many entries of
//! `key words + 1 reference word` as fit in 31 words, and word 31, the next-slab pointer
//! (`NONE = 0xFFFFFFFF`). A reference word is `EMPTY` (`0xFFFFFFFF`, a free entry), `FILLING`
//! (claimed, key being written; invisible to searches) or a value cell of the heap. Chains
//! grow with slabs of a slab pool (a bitmap allocator, volatile, rebuilt on open; a tile's
//! leader scans it from a hashed word and takes a bit with an atomic OR: simpler than
//! SlabAlloc's resident blocks, with the same one-atomic common case). Free slabs are always
//! clean (all ones), so linking one into a chain never exposes stale entries. Values live in
//! fixed-size cells of the heap region (a volatile bitmap allocator, rebuilt on open).
//!
//! # Operations (`shaders/slab_*.wgsl`)
//!
//! Warp-cooperative as in the paper, with tiles of lanes (`common/tile.wgsl` of gphash-gpu) in place of
//! warps: a ballot picks the next pending operation of the tile, the tile reads one slab per
//! step (one request for a 32-lane tile; a 4-lane tile takes 8 passes) and finds the key with
//! ballots. A batch is: cells for new values (`alloc_cells`), the undo log (`log_chains`) and
//! the reads (`probe` serving reads only: they see the table before the batch, a valid order),
//! in one submit; then, unless the batch only reads, rounds of `probe` (walks; creators claim
//! entries, EMPTY -> FILLING, and write keys; new slabs linked by CAS on the tail's next
//! pointer) and `commit` (one CAS per operation: swing, empty, publish). A per-round claim
//! registry makes the first insertion of an absent key its only creator; the others join it,
//! so no key is published twice. An upsert that loses its entry to a concurrent delete goes to
//! a second round, which then completes. Results equal applying the operations one by one in
//! some order.
//!
//! # Crash consistency: the undo log
//!
//! Per batch: (1) `alloc_cells` writes new values into fresh cells (referenced by nothing) and
//! `log_chains` copies the whole chain of every bucket a mutating operation touches into the log
//! region; the host persists those lines, then writes the log header (`LOG_VALID`, count,
//! batch sequence, check word) and persists it. (2) The rounds change the table in place; the
//! host persists the lines they wrote. (3) The host clears the header's first word and persists
//! it: only now is the batch acknowledged. Why it is enough: every slab a batch changes that
//! was reachable before it is on a touched chain and in the log; everything else it writes
//! (fresh cells, slabs linked from the pool) is unreachable once those slabs are restored; old
//! cells go back to the volatile allocator during the batch but only a later batch, after (3),
//! takes cells from it, so a restored reference always finds its value intact. On open,
//! a valid log (check word right; a torn header is invalid, and then nothing changed in place
//! yet) is copied back and invalidated, then the allocators are rebuilt from what is reachable
//! and unreachable slabs are reset to free. A batch that runs out of slabs is rolled back the
//! same way; one that runs out of cells is refused before anything changes in place.

pub mod layout;
pub mod model;
pub mod shader;

use std::path::Path;
use std::sync::Arc;

use host_pm::{CreateOptions, Header, Observer, PersistMode, Pool, Region, ResizeRecord, TableConfig};

pub use layout::SlabGeometry;
pub use model::{Recovered, SlabModel};
use shader::{CONTROL_WORDS, SlabKernel, SlabParams, SlabShaderConfig, ctl};

use crate::systems::{System, Traffic};
use gphash::Gpu;
use gphash::Mode;
use gphash::OpKind;
use gphash::{DeviceBatch, Placement};
use gphash::{Error, Result};
use gphash_gpu::hostmem;
use gphash_gpu::resources::{
    Binding, Pipelines, PoolRef, PoolWindows, batch_layout, bind_group, bind_group_layout, build_pipelines,
    check_bindings, map_read, max_window, read_dirty, record_passes, storage_buffer, writeback_invocations,
};
use gphash_gpu::shader::{BATCH_BUFFERS, Windows};

/// A new slab table's shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlabConfig {
    /// Key width in bytes (a multiple of 4, 4 to 120).
    pub key_bytes: u32,
    /// Value size in bytes.
    pub value_bytes: u32,
    /// Keys the table is sized for.
    pub capacity: u64,
    /// Buckets (base slabs); default: `capacity` at 0.6 of the base slabs' entries.
    pub buckets: Option<u32>,
    /// Pool slabs; default: a quarter of the slabs `capacity` keys fill, plus 64.
    pub pool_slabs: Option<u32>,
    /// Value cells; default: `capacity` plus an eighth plus 1024.
    pub cells: Option<u32>,
    /// Hash seed.
    pub seed: u64,
}

impl SlabConfig {
    /// The default shape for `capacity` keys.
    pub fn new(key_bytes: u32, value_bytes: u32, capacity: u64) -> Self {
        SlabConfig {
            key_bytes,
            value_bytes,
            capacity,
            buckets: None,
            pool_slabs: None,
            cells: None,
            seed: 0x5EED_51AB,
        }
    }

    /// The geometry this configuration gives.
    pub fn geometry(&self) -> Result<SlabGeometry> {
        let d =
            SlabGeometry::for_capacity(self.key_bytes, self.value_bytes, self.capacity, seed32(self.seed))?;
        SlabGeometry::new(
            self.key_bytes,
            self.value_bytes,
            self.buckets.unwrap_or(d.buckets),
            self.pool_slabs.unwrap_or(d.pool_slabs),
            self.cells.unwrap_or(d.cells),
            d.seed,
        )
    }
}

/// The 32-bit bucket-hash seed of a pool's 64-bit seed.
fn seed32(seed: u64) -> u32 {
    gphash::hash::fmix(seed as u32 ^ gphash::hash::fmix((seed >> 32) as u32 ^ 0x51AB_51AB))
}

/// How a slab table runs.
#[derive(Clone)]
pub struct SlabOptions {
    /// Zero-copy (the GPU works in the pool mapping) or staged (a device copy, dirty lines
    /// written back at every persist point). `Volatile` is not offered.
    pub placement: Placement,
    /// Lanes per operation: 4, 8, 16 or 32 (narrower subgroups use all their lanes).
    pub tile: u32,
    /// Largest storage window in bytes (default: the device's binding limit).
    pub max_window_bytes: Option<u64>,
    /// Shown the pool at every persist point (crash tests).
    pub observer: Option<Observer>,
    /// Overrides the pool's persist primitive.
    pub persist_mode: Option<PersistMode>,
}

impl Default for SlabOptions {
    fn default() -> Self {
        SlabOptions {
            placement: Placement::Auto,
            tile: 32,
            max_window_bytes: None,
            observer: None,
            persist_mode: None,
        }
    }
}

impl std::fmt::Debug for SlabOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlabOptions")
            .field("placement", &self.placement)
            .field("tile", &self.tile)
            .field("max_window_bytes", &self.max_window_bytes)
            .field("observer", &self.observer.is_some())
            .field("persist_mode", &self.persist_mode)
            .finish()
    }
}

/// Counters of what the table did since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlabActivity {
    /// Batches acknowledged.
    pub batches: u64,
    /// Rounds (probe + commit) they took.
    pub rounds: u64,
    /// Slabs copied into the undo log.
    pub logged_slabs: u64,
    /// Batches rolled back (no free slab) or refused (no free cell).
    pub rolled_back: u64,
    /// Persist points whose dirty list overflowed (whole regions persisted).
    pub overflows: u64,
}

/// Per-batch device buffers, sized for the largest batch so far.
struct Io {
    cap: u32,
    dirty_cap: u32,
    opstate: wgpu::Buffer,
    claims: wgpu::Buffer,
    dirty: wgpu::Buffer,
    staging: wgpu::Buffer,
    readback: wgpu::Buffer,
}

/// Offsets in the readback buffer.
const RB_DIRTY: u64 = 256;

/// The slab baseline: a persistent SlabHash on the GPU (see the module docs).
pub struct SlabSystem {
    gpu: Arc<Gpu>,
    pool: Option<Pool>,
    geo: SlabGeometry,
    cfg: SlabShaderConfig,
    windows: PoolWindows,
    /// Control words, allocator bitmaps and bucket marks (bound as `control`).
    state: wgpu::Buffer,
    /// The parameters of the next submits (immediates).
    params: SlabParams,
    /// The table's bind group layout (group 0) and the bindings it was made from.
    layout: (wgpu::BindGroupLayout, Vec<Binding>),
    /// The batch's (group 1).
    batch_layout: (wgpu::BindGroupLayout, Vec<Binding>),
    pipelines: Pipelines<SlabKernel>,
    io: Option<Io>,
    track_lines: bool,
    seq: u32,
    items: u64,
    pool_slabs_used: u64,
    recovered: Recovered,
    activity: SlabActivity,
}

impl std::fmt::Debug for SlabSystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlabSystem").field("geometry", &self.geo).field("items", &self.items).finish()
    }
}

type Control = [u32; CONTROL_WORDS as usize];

impl SlabSystem {
    /// Creates a slab table for `capacity` keys in a new pool at `path` (`None`: anonymous
    /// memory) on `gpu`, with the default shape and options (zero-copy where the driver imports
    /// the pool, 32-lane tiles).
    pub fn create(
        path: Option<&Path>,
        key_bytes: u32,
        value_bytes: u32,
        capacity: u64,
        gpu: Arc<Gpu>,
    ) -> Result<SlabSystem> {
        let config = SlabConfig::new(key_bytes, value_bytes, capacity);
        Self::create_with(path, &config, gpu, &SlabOptions::default())
    }

    /// Creates a slab table of shape `config` in a new pool at `path` (`None`: anonymous
    /// memory) on `gpu`.
    pub fn create_with(
        path: Option<&Path>,
        config: &SlabConfig,
        gpu: Arc<Gpu>,
        options: &SlabOptions,
    ) -> Result<SlabSystem> {
        let geo = config.geometry()?;
        let (table_region, heap_region, bytes) = host_pm::layout_regions(geo.table_bytes(), geo.heap_bytes());
        let mut header = Header {
            version: host_pm::FORMAT_VERSION,
            table: TableConfig {
                key_bytes: geo.key_bytes,
                value_bytes: geo.value_bytes,
                levels: 1,
                hashes: 1,
                slots: geo.entries(),
                top_level: 0,
                seed: config.seed,
            },
            table_region,
            heap_region,
            heap_cells: geo.cells as u64,
            resize: ResizeRecord::default(),
            clean_shutdown: false,
            sequence: 0,
            user: [0; 8],
            closed: host_pm::CloseRecord::default(),
        };
        header.user[1] = geo.buckets as u64;
        header.user[2] = geo.pool_slabs as u64;
        header.user[3] = layout::SLAB_VERSION;
        let mut pool = Pool::create(path, bytes, &header, &CreateOptions::default())?;
        // Every slab free and clean, the log invalid; only then is the pool marked a slab pool
        // (a crash before leaves a pool that open refuses, not a corrupt table).
        let slabs_end = geo.slab_word(geo.slabs() as u32) as usize * 4;
        pool.region_mut(table_region)[layout::LOG_HEADER_WORDS as usize * 4..slabs_end].fill(0xFF);
        pool.persist_range(table_region.offset, slabs_end as u64)?;
        let mut h = *pool.header();
        h.user[0] = layout::SLAB_MAGIC;
        pool.write_header(&h)?;
        Self::start(pool, gpu, options)
    }

    /// Opens the slab table of an existing pool, recovering it if it was not closed cleanly.
    pub fn open(path: &Path, gpu: Arc<Gpu>, options: &SlabOptions) -> Result<SlabSystem> {
        Self::start(Pool::open(path)?, gpu, options)
    }

    /// The geometry a pool's header describes; refuses pools that are not slab tables.
    pub fn geometry_of(pool: &Pool) -> Result<SlabGeometry> {
        let h = pool.header();
        let incompatible = |why: String| Error::IncompatiblePool {
            path: pool.path().map(Path::to_path_buf).unwrap_or_default(),
            why,
        };
        if h.user[0] != layout::SLAB_MAGIC {
            return Err(incompatible(
                "not a slab-table pool (another system made it, or its creation did not finish)".into(),
            ));
        }
        if h.user[3] != layout::SLAB_VERSION {
            return Err(incompatible(format!(
                "slab layout version {} is not {}",
                h.user[3],
                layout::SLAB_VERSION
            )));
        }
        let fit = |x: u64, what: &str| {
            u32::try_from(x).map_err(|_| incompatible(format!("{what} {x} is too large")))
        };
        let geo = SlabGeometry::new(
            h.table.key_bytes,
            h.table.value_bytes,
            fit(h.user[1], "buckets")?,
            fit(h.user[2], "pool slabs")?,
            fit(h.heap_cells, "cells")?,
            seed32(h.table.seed),
        )
        .map_err(|e| incompatible(e.to_string()))?;
        if h.table.slots != geo.entries() {
            return Err(incompatible(format!(
                "{} entries per slab, expected {}",
                h.table.slots,
                geo.entries()
            )));
        }
        h.check_regions(geo.table_bytes(), geo.heap_bytes()).map_err(incompatible)?;
        Ok(geo)
    }

    fn start(mut pool: Pool, gpu: Arc<Gpu>, options: &SlabOptions) -> Result<SlabSystem> {
        pool.set_observer(options.observer.clone());
        if let Some(mode) = options.persist_mode {
            pool.set_persist_mode(mode)?;
        }
        if ![4, 8, 16, 32].contains(&options.tile) {
            return Err(Error::InvalidConfig(format!(
                "slab tile of {} lanes: must be 4, 8, 16 or 32",
                options.tile
            )));
        }
        if gpu.info.subgroup_sizes.0 < 4 {
            return Err(Error::MissingFeature(format!(
                "{} has subgroups of {} lanes; the slab kernels need at least 4",
                gpu.info.name, gpu.info.subgroup_sizes.0
            )));
        }
        if options.placement == Placement::Volatile {
            return Err(Error::InvalidConfig(
                "the slab baseline runs zero-copy or staged, not volatile".into(),
            ));
        }
        let geo = Self::geometry_of(&pool)?;
        let mut recovered = model::recover(&mut pool, &geo)?;
        pool.mark_dirty()?;
        log::info!(
            "opened slab table {}: {recovered}",
            pool.path().map_or("in anonymous memory".into(), |p| p.display().to_string())
        );
        let header = *pool.header();
        let (table_region, heap_region) = (header.table_region, header.heap_region);
        let window = max_window(&gpu.info, options.max_window_bytes);
        let cfg = SlabShaderConfig {
            geo,
            tile: options.tile,
            table: Windows::cover(geo.table_words(), window),
            heap: Windows::cover(geo.heap_words(), window),
        };
        check_bindings("the slab table", cfg.bindings().len() as u32 + BATCH_BUFFERS, &gpu.info)?;
        let windows = PoolWindows::place(
            &gpu,
            PoolRef::Owned(&mut pool),
            options.placement.into(),
            [
                (table_region, cfg.table, geo.table_words(), "slab table"),
                (heap_region, cfg.heap, geo.heap_words(), "slab heap"),
            ],
            0,
            None,
        )?;
        let track_lines = windows.tracks_lines(pool.persist_mode());
        let dev = &gpu.device;
        let state = storage_buffer(dev, "slab state", cfg.state_words() * 4);
        let bindings = cfg.bindings();
        let layout = (bind_group_layout(dev, "slab", &bindings), bindings);
        let batch_layout = batch_layout(dev);
        let layouts = [&layout.0, &batch_layout.0];
        let pipelines = build_pipelines(&gpu, (&layouts, SlabParams::BYTES), &SlabKernel::ALL, |k| {
            shader::source(k, &cfg)
        })?;
        let pool_slabs_used = recovered.pool_slabs_used;
        let items = recovered.items;
        let mut system = SlabSystem {
            gpu,
            pool: Some(pool),
            geo,
            cfg,
            windows,
            state,
            params: SlabParams::default(),
            layout,
            batch_layout,
            pipelines,
            io: None,
            track_lines,
            seq: 0,
            items,
            pool_slabs_used,
            recovered: Recovered::default(),
            activity: SlabActivity::default(),
        };
        system.load_state(&recovered)?;
        recovered.slab_bits = vec![];
        recovered.cell_bits = vec![];
        system.recovered = recovered;
        Ok(system)
    }

    /// Writes the allocators of `rec` into the device state; clears the control words and the
    /// bucket marks.
    fn load_state(&mut self, rec: &Recovered) -> Result<()> {
        let mut words = vec![0u32; self.cfg.state_words() as usize];
        // Pool slab `i` is slab `buckets + i`; bits past the pool stay set.
        let b = self.geo.buckets as u64;
        let pool_bits = &mut words[self.cfg.slab_bitmap() as usize..self.cfg.cell_bitmap() as usize];
        pool_bits.fill(u32::MAX);
        for i in 0..self.geo.pool_slabs as u64 {
            let s = b + i;
            if rec.slab_bits[(s / 32) as usize] & (1 << (s % 32)) == 0 {
                pool_bits[(i / 32) as usize] &= !(1 << (i % 32));
            }
        }
        let cells = self.cfg.cell_bitmap() as usize;
        words[cells..cells + rec.cell_bits.len()].copy_from_slice(&rec.cell_bits);
        self.gpu.queue.write_buffer(&self.state, 0, bytemuck::cast_slice(&words));
        self.seq = 0;
        self.gpu.submit([]);
        Ok(())
    }

    fn pool(&self) -> &Pool {
        self.pool.as_ref().expect("the pool is open until close")
    }

    fn pool_mut(&mut self) -> &mut Pool {
        self.pool.as_mut().expect("the pool is open until close")
    }

    /// The table's geometry.
    pub fn geometry(&self) -> &SlabGeometry {
        &self.geo
    }

    /// Zero-copy or staged (and why).
    pub fn mode(&self) -> Mode {
        self.windows.residence.clone().into()
    }

    /// What recovery did when the table was opened.
    pub fn recovered(&self) -> &Recovered {
        &self.recovered
    }

    /// What the table did since it was opened.
    pub fn activity(&self) -> SlabActivity {
        self.activity
    }

    /// Pool slabs linked into chains.
    pub fn pool_slabs_used(&self) -> u64 {
        self.pool_slabs_used
    }

    /// The pool's table region.
    pub fn table_region(&self) -> Region {
        self.windows.table.region
    }

    /// The table region's words as the pool holds them (after a batch: its durable content).
    pub fn table_words(&self) -> &[u32] {
        bytemuck::cast_slice(
            &self.pool().region(self.windows.table.region)[..self.geo.table_bytes() as usize],
        )
    }

    fn heap_words(&self) -> &[u32] {
        bytemuck::cast_slice(&self.pool().region(self.windows.heap.region)[..self.geo.heap_bytes() as usize])
    }

    /// Every published key with its value, read from the pool.
    pub fn entries(&self) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        model::entries(&self.geo, self.table_words(), self.heap_words())
    }

    /// The published keys of each bucket, sorted (to compare with the twin).
    pub fn bucket_keys(&self) -> Result<Vec<Vec<Vec<u8>>>> {
        model::bucket_keys(&self.geo, self.table_words())
    }

    /// The undo log's state in the pool: `Some((entries, batch))` while a batch is in flight.
    pub fn log_state(&self) -> Option<(u32, u32)> {
        model::log_state(&self.geo, self.table_words())
    }

    /// Average slabs per chain.
    pub fn chain_slabs(&self) -> f64 {
        (self.geo.buckets as u64 + self.pool_slabs_used) as f64 / self.geo.buckets as f64
    }

    /// Value cells and pool slabs the device allocators hold (a leak check: after a batch the
    /// cells equal [`System::len`] and the slabs [`SlabSystem::pool_slabs_used`]).
    pub fn allocated(&self) -> Result<(u64, u64)> {
        let words = crate::systems::download(&self.gpu, &self.state)?;
        let ones = |r: std::ops::Range<u32>| -> u64 {
            words[r.start as usize..r.end as usize].iter().map(|w| w.count_ones() as u64).sum()
        };
        let slab_tail = self.cfg.slab_bitmap_words() as u64 * 32 - self.geo.pool_slabs as u64;
        let cell_tail = self.geo.cell_bitmap_words() as u64 * 32 - self.geo.cells as u64;
        let slabs = ones(self.cfg.slab_bitmap()..self.cfg.cell_bitmap()) - slab_tail;
        let cells = ones(self.cfg.cell_bitmap()..self.cfg.marks()) - cell_tail;
        Ok((cells, slabs))
    }

    /// Clean close: the pool is marked closed. Dropping the table instead is a crash.
    pub fn close(mut self) -> Result<()> {
        self.release_gpu();
        match self.pool.take() {
            Some(pool) => Ok(pool.close()?),
            None => Ok(()),
        }
    }

    /// Destroys the buffers that reference the pool mapping and waits until they are gone.
    fn release_gpu(&mut self) {
        self.io = None;
        self.windows.release(&self.gpu);
    }

    /// Makes sure the per-batch buffers hold `n` operations.
    fn reserve(&mut self, n: u32) {
        if self.io.as_ref().is_some_and(|io| io.cap >= n) {
            return;
        }
        let cap = n.next_power_of_two().max(256);
        // Lines per operation: its cell, the slabs it logs (3 lines per entry, assumed 4 per
        // operation), its claim and link, its CAS. More falls back to whole regions.
        let per_op = (self.geo.cell_words() / 16 + 2 + 12 + 4) as u64;
        let limit = if self.windows.staged() { 1 << 22 } else { 1 << 24 };
        let dirty_cap = if self.track_lines { (cap as u64 * per_op).min(limit) as u32 } else { 0 };
        let dev = &self.gpu.device;
        let storage = |label, size| storage_buffer(dev, label, size);
        let staged = self.windows.staged();
        let staging_bytes = if staged { dirty_cap as u64 * self.windows.line_bytes() } else { 0 };
        self.io = Some(Io {
            cap,
            dirty_cap,
            opstate: storage("slab opstate", cap as u64 * 4 * 8),
            // The claim registry, at most half full.
            claims: storage("slab claims", cap as u64 * 2 * 4),
            dirty: storage("slab dirty", dirty_cap as u64 * 4),
            staging: storage("slab staging", staging_bytes),
            readback: dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some("slab readback"),
                size: RB_DIRTY + (dirty_cap as u64 * 4).next_multiple_of(256) + staging_bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        });
    }

    /// The bind groups of `batch`: the table's with the working buffers, and the batch's.
    fn bind_groups(&self, batch: &DeviceBatch) -> [wgpu::BindGroup; 2] {
        let io = self.io.as_ref().expect("reserved");
        let work = [&io.opstate, &self.state, &io.claims, &io.dirty, &io.staging]
            .into_iter()
            .chain(self.windows.buffers())
            .map(wgpu::Buffer::as_entire_binding);
        let ops = batch.bindings(self.geo.key_words(), self.geo.cell_words());
        let dev = &self.gpu.device;
        [
            bind_group(dev, "slab", (&self.layout.0, &self.layout.1), work),
            bind_group(dev, "slab batch", (&self.batch_layout.0, &self.batch_layout.1), ops),
        ]
    }

    fn check_batch(&self, batch: &DeviceBatch) -> Result<()> {
        batch.validate(self.geo.key_words(), self.geo.cell_words())?;
        let n = batch.len;
        if n > u32::MAX / 8 {
            return Err(Error::InvalidConfig(format!("a batch of {n} operations is too large")));
        }
        Ok(())
    }

    /// Sets the parameters of the next submits.
    fn set_params(&mut self, n: u32, reads_only: bool) {
        let io = self.io.as_ref().expect("reserved");
        let (table_line_base, heap_line_base, table_lines) = self.windows.lines();
        self.params = SlabParams {
            n,
            seq: self.seq,
            dirty_cap: io.dirty_cap,
            claims_mask: (io.claims.size() / 4 - 1) as u32,
            track_lines: self.track_lines as u32,
            table_line_base,
            heap_line_base,
            table_lines,
            line_words: self.windows.line_words(),
            reads_only: reads_only as u32,
        };
    }

    /// The next batch sequence; the bucket marks restart when it wraps.
    fn next_seq(&mut self) {
        self.seq = self.seq.wrapping_add(1);
        if self.seq == 0 {
            let marks = self.cfg.marks() as u64 * 4;
            let mut enc = self.gpu.device.create_command_encoder(&Default::default());
            enc.clear_buffer(&self.state, marks, Some(self.geo.buckets as u64 * 4));
            self.gpu.submit([enc.finish()]);
            self.seq = 1;
        }
    }

    /// Records `kernels` (a compute pass each, so wgpu orders them with barriers), the staged
    /// gather, and the copy of the control words; submits, waits, returns the control words.
    fn submit(&mut self, binds: &[wgpu::BindGroup; 2], kernels: &[SlabKernel], n: u32) -> Result<Control> {
        let io = self.io.as_ref().expect("reserved");
        let mut enc = self.gpu.device.create_command_encoder(&Default::default());
        enc.clear_buffer(&self.state, 0, Some(CONTROL_WORDS as u64 * 4));
        if kernels.contains(&SlabKernel::Probe) {
            enc.clear_buffer(&io.claims, 0, None);
        }
        let gather = self
            .windows
            .staged()
            .then(|| (self.pipelines.get(SlabKernel::Gather), writeback_invocations(io.dirty_cap)));
        let passes = kernels.iter().map(|&k| (self.pipelines.get(k), n as u64));
        let binds = [&binds[0], &binds[1]];
        record_passes(&mut enc, (&binds, bytemuck::bytes_of(&self.params)), passes.chain(gather), None);
        enc.copy_buffer_to_buffer(&self.state, 0, &io.readback, 0, CONTROL_WORDS as u64 * 4);
        let mut cmds = vec![enc.finish()];
        if !self.windows.staged() {
            cmds.push(hostmem::host_read_barrier(&self.gpu));
        }
        self.gpu.submit(cmds);
        let mut control = Control::default();
        map_read(&self.gpu, &io.readback, 0..CONTROL_WORDS as u64 * 4, |b| {
            control.copy_from_slice(bytemuck::cast_slice(b))
        })?;
        Ok(control)
    }

    /// Makes the lines the last submit wrote durable (staged: copies them into the pool first).
    fn persist_written(&mut self, control: &Control) -> Result<()> {
        if !self.track_lines {
            return Ok(self.pool().persist_lines(&[])?);
        }
        let io = self.io.as_ref().expect("reserved");
        let count = control[ctl::DIRTY];
        if count > io.dirty_cap {
            self.activity.overflows += 1;
            let pool = self.pool.as_mut().expect("open");
            if self.windows.staged() {
                self.windows.download(&self.gpu, pool)?;
            }
            let (table, heap) = (self.windows.table.region, self.windows.heap.region);
            pool.persist_range(table.offset, table.bytes)?;
            return Ok(pool.persist_range(heap.offset, heap.bytes)?);
        }
        if count == 0 {
            return Ok(self.pool().persist_lines(&[])?);
        }
        let staging = self.windows.staged().then_some(&io.staging);
        let pool = self.pool.as_mut().expect("open");
        let lines = read_dirty(
            &self.gpu,
            (&io.dirty, staging),
            &io.readback,
            (RB_DIRTY, count),
            self.windows.line_shift,
            pool,
        )?;
        Ok(pool.persist_lines(&lines)?)
    }

    /// Writes the first words of the log header (and the device copy's, staged) and persists them.
    fn write_log_header(&mut self, words: &[u32]) -> Result<()> {
        let region = self.windows.table.region;
        let offset = region.offset;
        let pool = self.pool_mut();
        let table: &mut [u32] = bytemuck::cast_slice_mut(&mut pool.region_mut(region)[..16]);
        table[..words.len()].copy_from_slice(words);
        pool.persist_range(offset, words.len() as u64 * 4)?;
        if self.windows.staged() {
            self.gpu.queue.write_buffer(&self.windows.table.buffers[0], 0, bytemuck::cast_slice(words));
        }
        Ok(())
    }

    /// Undoes a batch that ran out of slabs: the log is copied back (recovery, on the live
    /// pool), the allocators rebuilt; staged, the device copy of the table is reloaded.
    fn roll_back(&mut self) -> Result<()> {
        let geo = self.geo;
        let pool = self.pool.as_mut().expect("open");
        let rec = model::recover(pool, &geo)?;
        if self.windows.staged() {
            let bytes = &self.pool().region(self.windows.table.region)[..geo.table_bytes() as usize];
            let window = self.cfg.table.words() as usize * 4;
            for (i, buf) in self.windows.table.buffers.iter().enumerate() {
                let at = i * window;
                let end = (at + window).min(bytes.len());
                self.gpu.queue.write_buffer(buf, 0, &bytes[at..end]);
            }
        }
        self.items = rec.items;
        self.pool_slabs_used = rec.pool_slabs_used;
        self.load_state(&rec)?;
        self.activity.rolled_back += 1;
        Ok(())
    }

    /// Runs one batch: cells and undo log, rounds of probe and commit, persists (module docs).
    fn execute(&mut self, batch: &DeviceBatch) -> Result<()> {
        self.check_batch(batch)?;
        let n = batch.len;
        if n == 0 {
            return Ok(());
        }
        self.reserve(n);
        self.next_seq();
        self.set_params(n, true);
        let bind = self.bind_groups(batch);

        // (1) New values into fresh cells, the touched chains into the log, and the reads (they
        // see the table before the batch: a valid order puts them first).
        let c = self.submit(&bind, &[SlabKernel::Alloc, SlabKernel::Log, SlabKernel::Probe], n)?;
        if c[ctl::BAD_KIND] > 0 || c[ctl::NO_CELL] > 0 || c[ctl::LOG_COUNT] > self.geo.log_capacity() {
            self.submit(&bind, &[SlabKernel::Release], n)?;
            self.activity.rolled_back += 1;
            return Err(if c[ctl::BAD_KIND] > 0 {
                Error::InvalidConfig(format!(
                    "{} operations of the batch have unknown codes",
                    c[ctl::BAD_KIND]
                ))
            } else if c[ctl::NO_CELL] > 0 {
                Error::HeapFull { failed: c[ctl::NO_CELL] as u64 }
            } else {
                Error::Gpu(format!("undo log overflow: {} slabs logged", c[ctl::LOG_COUNT]))
            });
        }
        if c[ctl::MUTATING] == 0 {
            // Reads only: nothing was written, nothing to persist.
            self.activity.batches += 1;
            return Ok(());
        }
        let logged = c[ctl::LOG_COUNT];
        self.persist_written(&c)?;
        self.write_log_header(&[layout::LOG_VALID, logged, self.seq, layout::log_check(logged, self.seq)])?;

        // (2) Rounds, in place.
        self.set_params(n, false);
        let (mut published, mut deleted, mut new_slabs) = (0u64, 0u64, 0u64);
        for round in 0.. {
            let c = self.submit(&bind, &[SlabKernel::Probe, SlabKernel::Commit], n)?;
            self.activity.rounds += 1;
            if c[ctl::NO_SLAB] > 0 {
                self.roll_back()?;
                let load = self.items as f64 / self.geo.entry_capacity() as f64;
                return Err(Error::TableFull { failed: c[ctl::NO_SLAB] as u64, load, early: false });
            }
            published += c[ctl::PUBLISHED] as u64;
            deleted += c[ctl::DELETED] as u64;
            new_slabs += c[ctl::NEW_SLABS] as u64;
            self.persist_written(&c)?;
            if c[ctl::DEFERRED] == 0 {
                break;
            }
            if round >= 8 {
                return Err(Error::Gpu(format!(
                    "{} upserts still deferred after {round} rounds",
                    c[ctl::DEFERRED]
                )));
            }
        }

        // (3) Invalidate the log: the batch is acknowledged.
        self.write_log_header(&[0])?;
        self.items = self.items + published - deleted;
        self.pool_slabs_used += new_slabs;
        self.activity.batches += 1;
        self.activity.logged_slabs += logged as u64;
        Ok(())
    }
}

impl Drop for SlabSystem {
    fn drop(&mut self) {
        // Imported buffers reference the pool mapping: they go (and the GPU stops using them)
        // before the pool is unmapped. Without `close` the pool stays marked open: a crash.
        self.release_gpu();
    }
}

/// Requests and bytes one operation costs in the pool (the GPU's accesses over PCIe in
/// zero-copy placement), with `chain` slabs per bucket on average:
///
/// - a search reads slabs until it finds the key, `(chain + 1) / 2` on average (one request
///   of 128 bytes each for a 32-lane tile), or the whole chain when the key is absent;
/// - a read that finds its key reads its cell: 1 request;
/// - a mutating operation first logs its bucket's chain: `chain` slab reads and `chain` log
///   writes of 132 bytes (counted in full per operation: exact when the batch touches each
///   bucket once, an upper bound otherwise); it writes its value into a fresh cell (insert,
///   upsert, update): 1 request;
/// - a new key is a claim CAS, the key write and the publish CAS (3 requests; a slab linked at
///   the tail is one more CAS, rare and not counted); a swing or a delete is 1 CAS.
///
/// The host's persists (log entries, log header twice, written lines) are not GPU requests.
pub fn traffic(geo: &SlabGeometry, chain: f64, kind: OpKind, hit: bool) -> Traffic {
    let slab = 128.0;
    let cell = (geo.cell_words() * 4) as f64;
    let key = geo.key_bytes as f64;
    let walk = if hit { (chain + 1.0) / 2.0 } else { chain };
    let t = |reads, writes, atomics, bytes| Traffic { reads, writes, atomics, bytes };
    let mut sum = t(walk, 0.0, 0.0, walk * slab);
    if kind != OpKind::Get {
        sum = sum.plus(t(chain, chain, 0.0, chain * (slab + 4.0 * layout::LOG_ENTRY_WORDS as f64)));
    }
    if kind.writes_value() {
        sum = sum.plus(t(0.0, 1.0, 0.0, cell));
    }
    sum.plus(match (kind, hit) {
        (OpKind::Get, true) => t(1.0, 0.0, 0.0, cell),
        (OpKind::Insert | OpKind::Upsert, false) => t(0.0, 1.0, 2.0, 8.0 + key),
        (OpKind::Update | OpKind::Upsert | OpKind::Delete, true) => t(0.0, 0.0, 1.0, 4.0),
        _ => Traffic::default(),
    })
}

impl System for SlabSystem {
    fn name(&self) -> String {
        "slab".into()
    }

    fn setting(&self) -> String {
        let pool = self.pool();
        format!(
            "{} | slab, tile {} | {} | pool {:?} ({:?}) | {} buckets, {} entries per slab",
            self.gpu.info.name,
            self.cfg.tile,
            self.mode(),
            pool.backend(),
            pool.persist_mode(),
            self.geo.buckets,
            self.geo.entries()
        )
    }

    fn run(&mut self, batch: &DeviceBatch) -> Result<()> {
        self.execute(batch)
    }

    fn len(&self) -> u64 {
        self.items
    }

    fn traffic(&self, kind: OpKind, hit: bool) -> Traffic {
        traffic(&self.geo, self.chain_slabs(), kind, hit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_of_one_slab_chains() {
        let g = SlabGeometry::new(8, 128, 100, 10, 1000, 1).unwrap();
        let get = traffic(&g, 1.0, OpKind::Get, true);
        assert_eq!((get.requests(), get.bytes), (2.0, 256.0));
        assert_eq!(traffic(&g, 1.0, OpKind::Get, false).requests(), 1.0);
        // Log (read + write), value, walk, claim + key + publish.
        assert_eq!(traffic(&g, 1.0, OpKind::Insert, false).requests(), 7.0);
        assert_eq!(traffic(&g, 1.0, OpKind::Update, true).requests(), 5.0);
        assert_eq!(traffic(&g, 1.0, OpKind::Delete, true).requests(), 4.0);
        assert_eq!(traffic(&g, 2.0, OpKind::Get, false).requests(), 2.0);
    }
}
