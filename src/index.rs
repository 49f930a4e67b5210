//! `GpHash`, the owning index: a pool, an engine, and the two-phase batch protocol.
//!
//! Every engine batch runs as: phase A (allocate, look up, claim) -> persist -> phase B
//! (publish, swing, delete) -> persist -> acknowledged. An engine batch in which some insertion
//! finds no slot, or some value no cell, is rolled back after phase A: nothing of it takes
//! effect. A call runs as one engine batch, or, when it repeats keys in an ordered call or is
//! larger than the engine takes, as a read of the keys' states, a fold of each repeated key's
//! operations into one on the host, and engine batches in which every key appears once (the
//! ones applied before a failing one are undone): nothing of a failed call takes effect unless
//! the failure poisons the index.

use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use gphash_gpu::Gpu;
use gphash_gpu::resources::{ImportedRegions, PoolRef};
use host_pm::{Backend, CreateOptions, Header, PersistMode, Pool, ResizeRecord, TableConfig};

use crate::batch::{Batch, BatchResult, Encoded, KeyGroups, Part, Planned};
use crate::cache::{CacheOptions, CacheStatus, Snapshot};
use crate::cpu::CpuEngine;
use crate::device_batch::DeviceBatch;
use crate::engine::{Engine, Input, Mode, Phase, Written};
use crate::error::{Error, Result};
use crate::gpu::engine::{GpuEngine, GpuOptions, largest_batch_anywhere};
use crate::gpu::resize::Warming;
use crate::hash::Seeds;
use crate::heap;
use crate::layout::{Geometry, Layout, TARGET_LOAD};
use crate::model::{Bitmap, Control};
use crate::profile::{Laps, Profile};
use crate::protocol::{OpKind, Status, control};
use crate::recovery::{self, Allocator, CheckReport, Recovery};
use crate::reopen;
use crate::resize;
use crate::table_stats::TableStats;

pub use crate::engine::MAX_BATCH;
pub use pipeline::{DevicePipeline, Pipeline};

mod pipeline;
mod start;

/// An insertion that finds no slot grows the table only if the table would be at least this
/// full with every operation of the batch adding a key: below it, the layout's candidates
/// collide too early for doubling the table to help, and growing would repeat without bound.
pub(crate) const GROW_FROM_LOAD: f64 = 0.5;

/// The share of the heap's cells in use from which its growth's kernels compile ahead
/// (`State::compile_next_growth`).
const HEAP_WARM_FROM: f64 = 0.75;

/// The table to create.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Key width in bytes (a multiple of 4: 8, 16, 32, ...).
    pub key_bytes: u32,
    /// Value size in bytes.
    pub value_bytes: u32,
    /// Levels, hash locations and slots per bucket.
    pub layout: Layout,
    /// Keys the table should hold before it first grows (sized for a load factor of 0.75; the
    /// default, 4096, makes a pool of a few hundred KiB that grows by levels as keys come).
    pub capacity: u64,
    /// Hash seed.
    pub seed: u64,
    /// Largest size the pool may grow to (`None`: no limit but the device's or the disk's).
    pub max_bytes: Option<u64>,
    /// Keep keys in an array of their own instead of in their buckets (an ablation of the
    /// design: a positive search then reads its key with a request of its own; no cache).
    pub keys_apart: bool,
    /// The heap's arenas, as log2 (0 to 5; `None`: the fewest whose state words name a cell
    /// for every slot of the table, one up to 2^32 - 4 slots). More arenas than needed only
    /// cost each allocation stage a pass per arena its subgroups need: for tests.
    pub arena_bits: Option<u32>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            key_bytes: 8,
            value_bytes: 8,
            layout: Layout::default(),
            capacity: 1 << 12,
            seed: 0x9E37_79B9_7F4A_7C15,
            max_bytes: None,
            keys_apart: false,
            arena_bits: None,
        }
    }
}

/// Which executor runs the kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Executor {
    /// The GPU if one can be opened, else the CPU model (reported by `stats`).
    #[default]
    Auto,
    /// A GPU or an error (with [`GpuStartMode::Background`], a GPU that fails to start
    /// leaves the CPU model running instead: the open has returned by then).
    Gpu,
    /// The CPU model.
    Cpu,
}

/// When an index's GPU starts ([`Options::gpu_start`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GpuStartMode {
    /// [`GpuStartMode::Background`] under [`Executor::Auto`], which promises the GPU if one
    /// starts and the CPU model otherwise; [`GpuStartMode::Wait`] under [`Executor::Gpu`],
    /// which promises a GPU or an error from the open.
    #[default]
    Auto,
    /// The open returns once the device is open, the pool imported and the kernels built.
    Wait,
    /// Open without waiting for the GPU. The index opens once its pool has (the header read;
    /// recovered, on the CPU, if it was not closed cleanly) and runs calls on the CPU model
    /// while another thread opens the device, imports the pool and builds the kernels; it
    /// takes the GPU over between two calls once that is done (or in a call that grows the
    /// table, which waits for it), with the allocator as it then stands. Until then
    /// `Stats::mode` says the GPU is starting; a GPU that fails to start leaves the CPU model
    /// running, and [`GpHash::wait_for_gpu`] says why. Device batches, growth, closing and
    /// cache changes wait for the start. No effect with [`Executor::Cpu`].
    Background,
}

/// How to open a table.
#[derive(Clone)]
pub struct Options {
    /// GPU or CPU.
    pub executor: Executor,
    /// GPU settings.
    pub gpu: GpuOptions,
    /// A device to share with other tables (default: open the best one).
    pub device: Option<Arc<Gpu>>,
    /// Grow the table when an insertion finds no empty slot (default). Without growth such a
    /// batch fails with `TableFull`; so it does with growth while the table would be less than
    /// half full (see `GROW_FROM_LOAD`).
    pub grow: bool,
    /// Reads check the checksum of the value they read (off by default: it reads one more word
    /// per value and hashes the value). A read whose value fails it gets [`Status::Corrupt`]
    /// and no value.
    pub verify_values: bool,
    /// When the GPU starts: by default in the background under [`Executor::Auto`] and before
    /// the open returns under [`Executor::Gpu`] (see [`GpuStartMode`]).
    pub gpu_start: GpuStartMode,
    /// Holds the background start, once its work is done, until the test waits on it too
    /// (feature `testing`).
    #[cfg(feature = "testing")]
    pub gpu_start_gate: Option<Arc<std::sync::Barrier>>,
    /// Shown the pool at every persist point (see [`host_pm::Observer`]): for crash tests
    /// (feature `testing`).
    #[cfg(feature = "testing")]
    pub observer: Option<host_pm::Observer>,
    /// Use this persist primitive instead of the backend's (benchmarks: `clwb` on tmpfs to
    /// measure what persistent memory would cost; feature `bench`).
    #[cfg(feature = "bench")]
    pub persist_mode: Option<PersistMode>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            executor: Executor::Auto,
            gpu: GpuOptions::default(),
            device: None,
            grow: true,
            verify_values: false,
            gpu_start: GpuStartMode::Auto,
            #[cfg(feature = "testing")]
            gpu_start_gate: None,
            #[cfg(feature = "testing")]
            observer: None,
            #[cfg(feature = "bench")]
            persist_mode: None,
        }
    }
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Options");
        d.field("executor", &self.executor)
            .field("gpu", &self.gpu)
            .field("device", &self.device)
            .field("grow", &self.grow)
            .field("verify_values", &self.verify_values)
            .field("gpu_start", &self.gpu_start);
        #[cfg(feature = "testing")]
        d.field("observer", &self.observer.is_some());
        #[cfg(feature = "bench")]
        d.field("persist_mode", &self.persist_mode);
        d.finish()
    }
}

/// Counters of the index's work since it was opened.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Activity {
    /// Engine batches acknowledged (a call takes one or more).
    pub batches: u64,
    /// Operations of the engine batches acknowledged.
    pub operations: u64,
    /// Engine batches rolled back (table or heap full).
    pub rolled_back: u64,
    /// Cache lines persisted.
    pub persisted_lines: u64,
    /// Time spent persisting.
    pub persist_time: Duration,
    /// Time spent in the engine (uploads, kernels, readbacks).
    pub engine_time: Duration,
    /// Time spent encoding batches, ordering them and decoding results on the host.
    pub host_time: Duration,
    /// Engine, host and persist time by stage.
    pub profile: Profile,
    /// Times the table grew by a level.
    pub resizes: u64,
    /// Times the value heap grew while the table had slots.
    pub heap_growths: u64,
    /// Time spent growing (the table and the heap).
    pub resize_time: Duration,
    /// Regions of pools the index's GPU device imported in place (each pins the region's
    /// pages; a growth that keeps the pool in place imports only its new regions). A device
    /// shared by several tables (the shards of a sharded table, `Options::device`) counts
    /// theirs too.
    pub region_imports: u64,
}

/// What the index is and what it holds.
#[derive(Clone, Debug)]
pub struct Stats {
    /// Published keys.
    pub items: u64,
    /// Slots in the table.
    pub slots: u64,
    /// `items / slots`.
    pub load_factor: f64,
    /// Layout.
    pub layout: Layout,
    /// Key width.
    pub key_bytes: u32,
    /// Value size.
    pub value_bytes: u32,
    /// Levels in use: the top level's index (it has `2^top` buckets) down to the bottom's.
    pub levels: (u32, u32),
    /// Value cells in the heap.
    pub cells: u64,
    /// How batches execute.
    pub mode: Mode,
    /// The most operations one engine batch holds (longer calls run as several; 0 without an
    /// engine). While a GPU starts in the background, also no more than its engine will take.
    pub max_batch: usize,
    /// The GPU, if one is used.
    pub adapter: Option<String>,
    /// Its subgroup sizes (min, max).
    pub subgroup_sizes: Option<(u32, u32)>,
    /// The adapter is a software device (lavapipe): the kernels run on the CPU, and timings
    /// say nothing about a GPU.
    pub software_device: bool,
    /// Pool backend.
    pub backend: Backend,
    /// How the pool persists.
    pub persist_mode: PersistMode,
    /// Pool size in bytes.
    pub pool_bytes: u64,
    /// What recovery did on open.
    pub recovery: Recovery,
    /// Work since open.
    pub activity: Activity,
    /// The bucket cache in device memory.
    pub cache: CacheStatus,
    /// Why the index must be reopened, if an earlier failure poisoned it.
    pub poisoned: Option<String>,
    /// How a GPU started in the background took over (`None` until it has, and without a
    /// background start).
    pub gpu_start: Option<GpuStart>,
}

/// How a GPU started in the background took over ([`GpuStartMode::Background`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuStart {
    /// From the end of the open's own work (the header read, the pool recovered) until the
    /// starting thread had the device and, for a pool imported zero-copy, the engine.
    pub ready_after: Duration,
    /// The engine was made on the starting thread (zero-copy); otherwise the index made it
    /// when it took over (a pool copied to the device, which only the index may read).
    pub engine_in_background: bool,
}

impl Stats {
    /// The table's part of the stats.
    pub fn table(&self) -> TableStats {
        TableStats {
            items: self.items,
            slots: self.slots,
            load_factor: self.load_factor,
            layout: self.layout,
            key_bytes: self.key_bytes,
            value_bytes: self.value_bytes,
            levels: self.levels,
            cells: self.cells,
        }
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.table())?;
        writeln!(f, "mode:          {} (engine batches of up to {} operations)", self.mode, self.max_batch)?;
        match (&self.adapter, self.subgroup_sizes) {
            (Some(a), Some((lo, hi))) => writeln!(f, "adapter:       {a} (subgroup size {lo}..{hi})")?,
            _ => writeln!(f, "adapter:       none")?,
        }
        if self.software_device {
            writeln!(f, "               a software Vulkan device on the CPU: its figures are not a GPU's")?;
        }
        writeln!(
            f,
            "pool:          {} bytes, {:?} backend, persist by {}",
            self.pool_bytes, self.backend, self.persist_mode
        )?;
        writeln!(f, "recovery:      {}", self.recovery)?;
        writeln!(f, "cache:         {}", self.cache)?;
        if let Some(why) = &self.poisoned {
            writeln!(f, "poisoned:      {why} (reopen the pool)")?;
        }
        write!(
            f,
            "activity:      {} batches, {} operations, {} rolled back, {} lines persisted\n\
             time:          engine {:.3} s, persist {:.3} s, host encode/decode {:.3} s",
            self.activity.batches,
            self.activity.operations,
            self.activity.rolled_back,
            self.activity.persisted_lines,
            self.activity.engine_time.as_secs_f64(),
            self.activity.persist_time.as_secs_f64(),
            self.activity.host_time.as_secs_f64(),
        )
    }
}

/// Who builds a grown table: the GPU if the index has one.
fn builder<'a>(gpu: &'a std::result::Result<Arc<Gpu>, String>, opts: &'a GpuOptions) -> resize::Builder<'a> {
    match gpu {
        Ok(g) => resize::Builder::Gpu(g, opts),
        Err(_) => resize::Builder::Cpu,
    }
}

/// A persistent GPU hash index.
///
/// The handle is `Send + Sync` and every call takes `&self`: threads share one index by
/// reference (an `Arc<GpHash>`, or scoped threads borrowing it). Calls from several threads
/// are queued on the index's lock and run one at a time, in the order they take the lock (not
/// necessarily the order they arrived), one engine batch
/// at a time (a call's engine batches run together: no other call runs between them); each
/// call is still atomic and acknowledged on its own, as from one thread. So throughput comes
/// from large batches, not from threads: calls from several threads do not run in parallel.
/// A call that panics (a defect) while it runs poisons the index: later calls return
/// [`Error::Poisoned`] and reopening recovers it.
pub struct GpHash {
    state: Mutex<State>,
    /// The GPU, once batches run on one (also in the state, which makes engines with it).
    gpu: Arc<OnceLock<Arc<Gpu>>>,
    /// Key width and value size, which no growth changes.
    key_bytes: usize,
    value_bytes: usize,
}

/// The table and the cache settings a growth's kernels are compiled for.
type GrowthKey = (Geometry, CacheOptions);

/// What the calls of a [`GpHash`] change, behind its lock.
struct State {
    // Dropped before `pool`: the engine's buffers may map the pool's memory. `None` while a
    // resize moves the pool or the cache is replaced, and after either failed to make a new
    // one (the index is then poisoned).
    engine: Option<Box<dyn Engine>>,
    /// A GPU starting in the background (`GpuStartMode::Background`). Joined before
    /// `pool` is dropped or moved: its engine may map the pool's memory.
    starting: Option<start::Starting>,
    /// `GpHash::gpu`, set once batches run on the GPU.
    gpu_cell: Arc<OnceLock<Arc<Gpu>>>,
    /// How the GPU started in the background took over.
    gpu_start: Option<GpuStart>,
    /// How the last engine executed (reported while there is none).
    mode: Mode,
    /// The kernels of the next growth, compiling ahead since the table became half full, for
    /// the table and cache settings they were compiled for (a growth of other ones, after a
    /// growth of the heap or a change of cache, compiles its own).
    next_growth: Option<(GrowthKey, Warming)>,
    /// The same for the next growth of the heap, since the heap was three quarters full.
    next_heap_growth: Option<(GrowthKey, Warming)>,
    pool: Pool,
    geo: Geometry,
    /// The GPU, or why there is none.
    gpu: std::result::Result<Arc<Gpu>, String>,
    options: Options,
    items: u64,
    recovery: Recovery,
    activity: Activity,
    poisoned: Option<String>,
    /// The encoded batch, kept to reuse its allocations.
    encoded: Encoded,
    /// The slot whose phase `step` started last, and when its engine time stopped, until any
    /// other time is accounted: the moment between the start and the wait of the same phase
    /// is engine time too (the engine's wait stage, timed from the submit, spans it).
    started: Option<(usize, Instant)>,
    /// Engines still to fail to be made (tests of failed restarts).
    #[cfg(test)]
    failing_engines: u32,
}

impl fmt::Debug for GpHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.state();
        f.debug_struct("GpHash").field("geometry", &s.geo).field("items", &s.items).finish()
    }
}

/// The states of some keys of a batch before a call.
struct States {
    /// For each operation of the batch, the read of its key (`u32::MAX`: none).
    read_of: Vec<u32>,
    /// The reads' results.
    values: BatchResult,
}

impl States {
    /// The value of operation `i`'s key before the call (`None`: absent), which must have
    /// been read.
    fn of(&self, i: usize) -> Option<&[u8]> {
        self.values.value(self.read_of[i] as usize)
    }
}

/// The header of a new pool holding the table `geo` (hash seed `seed`) in `regions`.
pub(crate) fn new_header(
    geo: &Geometry,
    seed: u64,
    [table_region, heap_region]: [host_pm::Region; 2],
) -> Header {
    let mut header = Header {
        version: host_pm::FORMAT_VERSION,
        table: TableConfig {
            key_bytes: geo.key_bytes,
            value_bytes: geo.value_bytes,
            levels: geo.layout.levels,
            hashes: geo.layout.hashes,
            slots: geo.layout.slots,
            top_level: geo.top_level,
            seed,
        },
        table_region,
        heap_region,
        heap_cells: geo.cells,
        resize: ResizeRecord::default(),
        clean_shutdown: false,
        sequence: 0,
        user: [0; 8],
        closed: host_pm::CloseRecord::default(),
    };
    header.user[crate::layout::KEYS_APART_WORD] = geo.keys_apart as u64;
    header.user[crate::layout::LOCATIONS_APART_WORD] = geo.locations_apart as u64;
    header.user[crate::layout::ARENA_BITS_WORD] = geo.arena_bits as u64;
    header
}

impl GpHash {
    /// Creates a table in a new pool at `path` (`None`: anonymous, volatile memory).
    pub fn create(path: Option<&Path>, config: &Config, options: &Options) -> Result<GpHash> {
        Self::create_placed(path, config, options, None)
    }

    /// [`GpHash::create`]; `shard`: the sharded table's identity and this shard's number, which
    /// the header records (`src/sharded.rs`).
    pub(crate) fn create_placed(
        path: Option<&Path>,
        config: &Config,
        options: &Options,
        shard: Option<(u64, usize)>,
    ) -> Result<GpHash> {
        let geo =
            Geometry::for_capacity(config.layout, config.key_bytes, config.value_bytes, config.capacity)?
                .with_keys_apart(config.keys_apart)?;
        let geo = geo.with_arena_bits(config.arena_bits.unwrap_or(geo.arena_bits))?;
        let (table_region, heap_region, bytes) = host_pm::layout_regions(geo.table_bytes(), geo.heap_bytes());
        let mut header = new_header(&geo, config.seed, [table_region, heap_region]);
        if let Some((table, number)) = shard {
            header.user[crate::layout::SHARD_TABLE_WORD] = table;
            header.user[crate::layout::SHARD_NUMBER_WORD] = number as u64 + 1;
        }
        let pool = Pool::create(path, bytes, &header, &CreateOptions { max_bytes: config.max_bytes })?;
        let index = Self::start(pool, options)?;
        index.state().recovery.created = true;
        Ok(index)
    }

    /// Opens the table in an existing pool, recovering it if it was not closed cleanly.
    pub fn open(path: &Path, options: &Options) -> Result<GpHash> {
        Self::open_checked(path, options, |_| Ok(()))
    }

    /// [`GpHash::open`], refused with `check`'s error where the pool, just opened (under its
    /// lock, before recovery writes anything), fails it (a sharded table's shard in its place).
    pub(crate) fn open_checked(
        path: &Path,
        options: &Options,
        check: impl FnOnce(&Pool) -> Result<()>,
    ) -> Result<GpHash> {
        let t = Instant::now();
        let pool = Pool::open(path)?;
        check(&pool)?;
        log::debug!("pool open: {:.2} ms", t.elapsed().as_secs_f64() * 1e3);
        Self::start(pool, options)
    }

    /// Validates the table configuration of an opened pool.
    pub fn geometry_of(pool: &Pool) -> Result<Geometry> {
        let h = pool.header();
        let t = &h.table;
        let incompatible = |why: String| Error::IncompatiblePool {
            path: pool.path().map(Path::to_path_buf).unwrap_or_default(),
            why,
        };
        let layout = Layout { levels: t.levels, hashes: t.hashes, slots: t.slots };
        let flag = |word: usize, what: &str| match h.user[word] {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(incompatible(format!("unknown {what} {other}"))),
        };
        let keys_apart = flag(crate::layout::KEYS_APART_WORD, "key placement")?;
        let locations_apart = flag(crate::layout::LOCATIONS_APART_WORD, "placement of hash locations")?;
        let arena_bits = u32::try_from(h.user[crate::layout::ARENA_BITS_WORD]).unwrap_or(u32::MAX);
        let geo = Geometry::new(layout, t.key_bytes, t.value_bytes, t.top_level, 1)
            .and_then(|g| {
                g.with_keys_apart(keys_apart)?
                    .with_locations_apart(locations_apart)?
                    .with_heap(arena_bits, h.heap_cells)
            })
            .map_err(|e| incompatible(e.to_string()))?;
        h.check_regions(geo.table_bytes(), geo.heap_bytes()).map_err(incompatible)?;
        Ok(geo)
    }

    fn start(mut pool: Pool, options: &Options) -> Result<GpHash> {
        #[cfg(feature = "testing")]
        pool.set_observer(options.observer.clone());
        #[cfg(feature = "bench")]
        if let Some(mode) = options.persist_mode {
            pool.set_persist_mode(mode)?;
        }
        let mut laps = Laps::start("start");
        let geo = Self::geometry_of(&pool)?;
        let background = match options.gpu_start {
            GpuStartMode::Auto => options.executor == Executor::Auto,
            GpuStartMode::Wait => false,
            GpuStartMode::Background => options.executor != Executor::Cpu,
        };
        let gpu = match (options.executor, &options.device) {
            (Executor::Cpu, _) => Err("the CPU executor was requested".to_string()),
            _ if background => Err(STARTING.to_string()),
            (_, Some(g)) => Ok(g.clone()),
            (exec, None) => match Gpu::new() {
                Ok(g) => Ok(g),
                Err(e) if exec == Executor::Auto => {
                    log::warn!("no GPU, running on the CPU model: {e}");
                    Err(e.to_string())
                }
                Err(e) => return Err(e.into()),
            },
        };
        laps.lap("device");
        let (geo, recovery, allocator) = reopen::recover_pool(&mut pool, &geo, builder(&gpu, &options.gpu))?;
        laps.lap("recovery");
        // The pool is marked dirty only before its first write (see `protocol` and `grow`): an
        // index opened and dropped without writing leaves a cleanly closed pool clean.
        log::info!(
            "opened {}: {recovery}",
            pool.path().map_or("anonymous memory".into(), |p| p.display().to_string())
        );
        let items = recovery.items;
        let starting = background
            .then(|| {
                let h = *pool.header();
                let seeds = Seeds::new(h.table.seed, geo.layout.hashes);
                let (mapping, regions) = (pool.mapping(), [h.table_region, h.heap_region]);
                start::Starting::spawn(options, start::Target { geo, seeds, mapping, regions })
            })
            .transpose()?;
        let gpu_cell = Arc::new(OnceLock::new());
        if let Ok(g) = &gpu {
            let _ = gpu_cell.set(g.clone());
        }
        let mut state = State {
            engine: None,
            starting,
            gpu_cell: gpu_cell.clone(),
            gpu_start: None,
            mode: Mode::Cpu { reason: "no engine yet".into() },
            next_growth: None,
            next_heap_growth: None,
            pool,
            geo,
            gpu,
            options: options.clone(),
            items,
            recovery,
            activity: Activity::default(),
            poisoned: None,
            encoded: Encoded::default(),
            started: None,
            #[cfg(test)]
            failing_engines: 0,
        };
        let engine = state.make_engine(allocator)?;
        state.install(engine);
        laps.lap("engine");
        Ok(GpHash {
            gpu: gpu_cell,
            key_bytes: state.geo.key_bytes as usize,
            value_bytes: state.geo.value_bytes as usize,
            state: Mutex::new(state),
        })
    }

    /// The state behind the lock, waiting for the call that holds it. A call that panicked
    /// while it held the lock may have left the state half-changed: the index is then
    /// poisoned (every later call returns [`Error::Poisoned`]), and this never panics.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|held| {
            let mut state = held.into_inner();
            state.poison_after_panic();
            state
        })
    }

    /// Grows the table by one level now, crash-consistently (see `src/resize.rs`); it also grows
    /// by itself when an insertion finds no empty slot. On failure the table is unchanged; if no
    /// engine can then be made for it, the index is poisoned (reopening recovers it).
    pub fn grow(&self) -> Result<()> {
        self.state().grow()
    }

    /// Closes the table cleanly: the next open needs no recovery.
    pub fn close(self) -> Result<()> {
        let state = self.state.into_inner().unwrap_or_else(|held| {
            let mut state = held.into_inner();
            state.poison_after_panic();
            state
        });
        state.close()
    }

    /// The table's geometry (growth changes it: a copy of what it is now).
    pub fn geometry(&self) -> Geometry {
        self.state().geo
    }

    /// The GPU, if batches run on one. `None` while a background start is still going
    /// ([`GpuStartMode::Background`]); [`GpHash::wait_for_gpu`] waits for it.
    pub fn gpu(&self) -> Option<&Arc<Gpu>> {
        self.gpu.get()
    }

    /// The most operations one engine batch holds ([`Stats::max_batch`], without the rest of
    /// the stats).
    pub fn max_batch(&self) -> usize {
        self.state().batch_limit()
    }

    /// Whether a GPU is starting in the background ([`GpuStartMode::Background`]) and has not
    /// taken over yet: batches run on the CPU model meanwhile.
    pub fn gpu_starting(&self) -> bool {
        self.state().starting.is_some()
    }

    /// Waits until a GPU started in the background runs the batches and returns it; without a
    /// background start, the GPU batches run on. `Err` says why batches run on the CPU model:
    /// the CPU executor was asked for, no GPU was found (under [`Executor::Auto`]), or the
    /// background start failed.
    pub fn wait_for_gpu(&self) -> Result<&Arc<Gpu>> {
        let mut s = self.state();
        s.adopt_gpu(true);
        match &s.gpu {
            Ok(_) => Ok(self.gpu.get().expect("set when the GPU took over")),
            Err(why) => Err(Error::Gpu(why.clone())),
        }
    }

    /// Runs `f` on the pool, holding the index's lock meanwhile: no call runs until it returns
    /// (and a call of this index from `f` would wait for ever).
    pub fn with_pool<R>(&self, f: impl FnOnce(&Pool) -> R) -> R {
        f(&self.state().pool)
    }

    /// Published keys.
    pub fn len(&self) -> u64 {
        self.state().items
    }

    /// Whether the table holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Load factor, mode, device, pool and activity.
    pub fn stats(&self) -> Stats {
        self.state().stats()
    }

    /// The work since open (what [`GpHash::stats`] reports of it, without its device reads).
    pub fn activity(&self) -> Activity {
        self.state().activity_now()
    }

    /// Replaces the bucket cache by one with these settings (empty: it fills at its first
    /// loading phase, or at [`GpHash::load_cache`]). The table is untouched.
    /// If no engine can be made with the new settings, the old ones stay; if none can be made
    /// with those either, the index is poisoned (reopening recovers it).
    pub fn set_cache(&self, cache: CacheOptions) -> Result<()> {
        self.state().set_cache(cache)
    }

    /// Runs a whole loading phase of the bucket cache now: the hot groups so far are cached
    /// when this returns, and the entries they leave take groups no access was counted in
    /// (the cache then stays frozen until its next period).
    pub fn load_cache(&self) -> Result<()> {
        let mut s = self.state();
        s.adopt_gpu(true);
        let t = Instant::now();
        let loaded = s.engine()?.load_cache();
        // Its engine time and kernels are counted now, not with the next batch's.
        s.engine_done(t);
        loaded
    }

    /// What the bucket cache holds now (for tests and diagnostics; empty without a cache).
    pub fn cache_snapshot(&self) -> Result<Snapshot> {
        self.state().engine()?.cache_snapshot()
    }

    /// Value cells in use.
    pub fn cells_used(&self) -> Result<u64> {
        let mut state = self.state();
        let (engine, pool) = state.usable_parts()?;
        engine.cells_used(pool)
    }

    /// Checks every invariant of the table (see [`recovery::check`]).
    pub fn check(&self) -> CheckReport {
        let s = self.state();
        recovery::check(&s.pool, &s.geo, s.pool.header())
    }

    /// Every published key and its value, in table order.
    pub fn entries(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let s = self.state();
        let h = s.pool.header();
        let table: &[u32] = bytemuck::cast_slice(s.pool.region(h.table_region));
        let heap: &[u8] = s.pool.region(h.heap_region);
        let g = &s.geo;
        let cell_bytes = g.cell_words() as usize * 4;
        let mut out = Vec::with_capacity(s.items as usize);
        for bucket in 0..g.buckets() {
            for slot in 0..g.layout.slots {
                let state = table[g.state_word(bucket, slot) as usize];
                let fp = table[g.fp_word(bucket, slot) as usize];
                // A cell beyond the heap is a damaged state word (`check` names it): left out.
                if let Some(Ok(cell)) =
                    (state >= crate::layout::PUBLISHED).then(|| g.published_cell(fp, state))
                {
                    let k = g.key_word(bucket, slot) as usize;
                    let key = bytemuck::cast_slice(&table[k..k + g.key_words() as usize]).to_vec();
                    let at = cell as usize * cell_bytes;
                    out.push((key, heap[at..at + g.value_bytes as usize].to_vec()));
                }
            }
        }
        out
    }

    /// A batch for this table's key and value widths.
    pub fn batch(&self) -> Batch {
        Batch::new(self.key_bytes, self.value_bytes)
    }

    /// Reads keys (concatenated, `key_bytes` each).
    pub fn get(&self, keys: &[u8]) -> Result<BatchResult> {
        self.execute(&Batch::of_kind(OpKind::Get, self.key_bytes, self.value_bytes, keys, None)?)
    }

    fn apply(&self, kind: OpKind, keys: &[u8], values: Option<&[u8]>) -> Result<Vec<Status>> {
        let b = Batch::of_kind(kind, self.key_bytes, self.value_bytes, keys, values)?;
        Ok(self.execute(&b)?.statuses)
    }

    /// Inserts absent keys (`Exists` for present ones).
    pub fn insert(&self, keys: &[u8], values: &[u8]) -> Result<Vec<Status>> {
        self.apply(OpKind::Insert, keys, Some(values))
    }

    /// Inserts or overwrites.
    pub fn upsert(&self, keys: &[u8], values: &[u8]) -> Result<Vec<Status>> {
        self.apply(OpKind::Upsert, keys, Some(values))
    }

    /// Overwrites present keys (`NotFound` for absent ones).
    pub fn update(&self, keys: &[u8], values: &[u8]) -> Result<Vec<Status>> {
        self.apply(OpKind::Update, keys, Some(values))
    }

    /// Removes keys (`NotFound` for absent ones).
    pub fn delete(&self, keys: &[u8]) -> Result<Vec<Status>> {
        self.apply(OpKind::Delete, keys, None)
    }

    /// Runs a mixed batch. Operations on different keys are independent. Operations on the
    /// same key in one batch are linearizable in some order (not necessarily batch order):
    /// reads see the state before the batch (a batch larger than `Stats::max_batch` runs in
    /// batch order instead), and no key is ever published twice. Use
    /// [`GpHash::execute_ordered`] for batch-order semantics. On an error nothing of the batch
    /// has taken effect (see [`GpHash::execute_ordered`] for what a crash may leave).
    pub fn execute(&self, batch: &Batch) -> Result<BatchResult> {
        self.state().call(batch, false)
    }

    /// Runs a batch with the results of applying its operations one by one, in order.
    ///
    /// A key that several operations share and some of them change is read first (one
    /// read-only engine batch for all of them; not a key the call upserts first and never
    /// deletes, when it fits one engine batch: such a key's results do not depend on it); its
    /// operations are applied on the host from that state, which gives their results, and the engine applies only their net effect (an
    /// insert, an update, a delete, or nothing), in one engine batch with the other operations;
    /// a key the batch only reads runs its reads as they are. A batch that only reads runs
    /// as [`GpHash::execute`] runs it (every read of a key sees the same value). A batch larger
    /// than the engine takes runs as several engine batches, each key in one of them; a call
    /// of another thread runs before or after the whole call, never between them.
    ///
    /// On an error nothing of the batch has taken effect: an engine batch that fails is
    /// rolled back, and those before it are undone. A crash (or an error that poisons the
    /// index) in the middle leaves each key as it was before the batch or as after it.
    pub fn execute_ordered(&self, batch: &Batch) -> Result<BatchResult> {
        self.state().call(batch, true)
    }

    /// Runs a batch held in device buffers (see [`DeviceBatch`]), with the semantics of
    /// [`GpHash::execute`]; statuses and found values are written to the batch's buffers.
    /// A batch larger than the engine takes (`BatchTooLarge`) is refused before anything runs.
    pub fn execute_device(&self, batch: &DeviceBatch) -> Result<()> {
        self.state().execute_device(batch)
    }
}

/// The reason the index runs on the CPU model while a background start goes on.
const STARTING: &str = "the GPU is starting in the background";

impl State {
    /// Takes over the GPU started in the background once it is ready (`wait`: waits for it),
    /// handing it the allocator as it stands. A GPU that did not start, or whose engine could
    /// not be made, leaves the CPU model running, with the reason in `mode`.
    fn adopt_gpu(&mut self, wait: bool) {
        let Some(starting) = self.starting.take_if(|s| wait || s.finished()) else {
            return;
        };
        let start::Started { gpu, engine, took } = starting.join();
        let engine_in_background = matches!(engine, Some(Ok(_)));
        if self.poisoned.is_some() {
            // Nothing runs until the pool is reopened; the engine goes, its imports released.
            return;
        }
        let outcome = gpu.map_err(|why| format!("the GPU did not start: {why}")).and_then(|gpu| {
            self.gpu = Ok(gpu.clone());
            let made = self.bitmap().and_then(|bitmap| match engine {
                Some(Ok(mut e)) => {
                    e.set_allocator(&bitmap)?;
                    Ok(Box::new(e) as Box<dyn Engine>)
                }
                Some(Err(e)) => {
                    log::info!("the background start made no engine ({e}); making one now");
                    self.make_engine(Allocator::Built(bitmap))
                }
                None => self.make_engine(Allocator::Built(bitmap)),
            });
            match made {
                Ok(e) => {
                    self.install(e);
                    Ok(gpu)
                }
                Err(e) => Err(format!("no engine could be made on the GPU: {e}")),
            }
        });
        match outcome {
            Ok(gpu) => {
                log::info!(
                    "the GPU took over; it was ready {:.1} ms after the open's own work",
                    took.as_secs_f64() * 1e3
                );
                let _ = self.gpu_cell.set(gpu);
                self.gpu_start = Some(GpuStart { ready_after: took, engine_in_background });
            }
            Err(why) => {
                log::warn!("{why}; batches run on the CPU model");
                self.gpu = Err(why.clone());
                if let Mode::Cpu { reason } = &mut self.mode {
                    *reason = why;
                }
            }
        }
    }

    /// Makes `engine` the one that runs batches.
    fn install(&mut self, engine: Box<dyn Engine>) {
        self.mode = engine.mode();
        self.engine = Some(engine);
    }

    /// An engine for the current table, with its allocator.
    fn make_engine(&mut self, allocator: Allocator) -> Result<Box<dyn Engine>> {
        self.make_engine_taking(allocator, None)
    }

    /// [`State::make_engine`]; a GPU engine takes over the imports of the table and heap
    /// regions in `imported` (a growth's build made them), which are released otherwise.
    fn make_engine_taking(
        &mut self,
        allocator: Allocator,
        imported: Option<ImportedRegions>,
    ) -> Result<Box<dyn Engine>> {
        #[cfg(test)]
        if self.failing_engines > 0 {
            self.failing_engines -= 1;
            return Err(Error::Gpu("injected failure to make an engine".into()));
        }
        let h = *self.pool.header();
        let seeds = Seeds::new(h.table.seed, self.geo.layout.hashes);
        Ok(match &self.gpu {
            Ok(gpu) => {
                // Read first: a scan, when the saved bytes fail their checksum, may clear claims
                // that a staged engine's copy of the table would otherwise keep.
                let bitmap = allocator.into_bitmap(&mut self.pool)?;
                let mut engine = GpuEngine::new(
                    gpu.clone(),
                    (self.geo, seeds),
                    PoolRef::Owned(&mut self.pool),
                    [h.table_region, h.heap_region],
                    &self.options.gpu,
                    self.options.verify_values,
                    imported,
                )?;
                engine.set_allocator(&bitmap)?;
                Box::new(engine)
            }
            Err(reason) => Box::new(CpuEngine::new(
                self.geo,
                seeds,
                h.table_region,
                h.heap_region,
                allocator,
                reason.clone(),
                self.options.verify_values,
            )),
        })
    }

    /// The engine, unless the index is poisoned.
    fn engine(&mut self) -> Result<&mut dyn Engine> {
        self.usable()?;
        Ok(self.engine.as_deref_mut().expect("an engine exists unless the index is poisoned"))
    }

    /// The allocator as the engine holds it.
    fn bitmap(&mut self) -> Result<Bitmap> {
        let (engine, pool) = self.usable_parts()?;
        engine.bitmap(pool)
    }

    /// The engine and the pool, unless the index is poisoned.
    fn usable_parts(&mut self) -> Result<(&mut dyn Engine, &mut Pool)> {
        self.usable()?;
        Ok(self.parts())
    }

    /// The engine and the pool, borrowed together.
    fn parts(&mut self) -> (&mut dyn Engine, &mut Pool) {
        // Nothing runs on a poisoned index, and an index without an engine is poisoned.
        (self.engine.as_deref_mut().expect("an engine exists unless the index is poisoned"), &mut self.pool)
    }

    /// `Poisoned` if an earlier failure left the index unusable.
    fn usable(&self) -> Result<()> {
        match &self.poisoned {
            Some(why) => Err(Error::Poisoned(why.clone())),
            None => Ok(()),
        }
    }

    /// After a step that dropped the engine to make another: if none could be made, nothing
    /// can run until the index is reopened (which recovers).
    fn poison_without_engine(&mut self, outcome: &Result<()>) {
        if self.engine.is_none() {
            let why = outcome.as_ref().err().map_or_else(String::new, ToString::to_string);
            self.poisoned = Some(format!("no engine could be made for the table: {why}"));
        }
    }

    /// The work since open, with the device's count of region imports.
    fn activity_now(&self) -> Activity {
        Activity {
            region_imports: self.gpu.as_ref().map_or(0, |g| g.region_imports()),
            ..self.activity.clone()
        }
    }

    /// Drops the engine before the pool grows to `end` bytes, but for its imports of the pool
    /// where the pool keeps its place (`Pool::grows_in_place`), which it returns; elsewhere
    /// the pool moves, and they go with the engine.
    fn drop_engine_for_growth(&mut self, end: u64) -> Option<ImportedRegions> {
        let engine = self.engine.take()?;
        self.pool.grows_in_place(end).then(|| engine.into_imports())?
    }

    /// See [`GpHash::grow`].
    fn grow(&mut self) -> Result<()> {
        self.usable()?;
        // The started engine may map the pool, which may move: growth runs on the GPU.
        self.adopt_gpu(true);
        if self.mode == Mode::Volatile {
            return Err(Error::Resize("a volatile table cannot grow: size it for its keys".into()));
        }
        let t = Instant::now();
        let mut laps = Laps::start("growth");
        let regions = resize::plan(&self.pool, &self.geo)?;
        // The build reads the old table through the imports, which are released with the old
        // regions, on the thread that discards them.
        let held = self.drop_engine_for_growth(regions.iter().map(host_pm::Region::end).max().unwrap_or(0));
        laps.lap("old engine dropped");
        let outcome = self.resize_and_restart(regions, held);
        laps.lap("build and engine");
        self.poison_without_engine(&outcome);
        outcome?;
        self.activity.resizes += 1;
        self.activity.resize_time += t.elapsed();
        Ok(())
    }

    /// Grows the value heap by a quarter (`src/heap.rs`), for a batch whose `failed`
    /// operations found no free cell while the table had slots for them.
    fn grow_heap(&mut self, failed: u64) -> Result<()> {
        self.usable()?;
        self.adopt_gpu(true);
        if self.mode == Mode::Volatile {
            return Err(Error::HeapFull { failed });
        }
        let t = Instant::now();
        let new = heap::grown(&self.geo, failed)?;
        let key = (new, self.options.gpu.cache);
        let mut warming = self.next_heap_growth.take().filter(|(k, _)| *k == key).map(|(_, w)| w);
        let bitmap = self.bitmap()?;
        let region = heap::plan(&mut self.pool, &new)?;
        // The grown heap's engine takes the table's import over.
        let mut held = self.drop_engine_for_growth(region.end());
        // The old heap's import goes with its region, which a moved heap gives back.
        let old_heap =
            held.as_mut().map(|h| h.take_region(self.pool.header().heap_region)).unwrap_or_default();
        let grown = heap::grow(&mut self.pool, &self.geo, &new, region, old_heap);
        // On failure the header still names the old heap: carry on with it.
        let bitmap = match grown {
            Ok(()) => {
                let bitmap = bitmap.grown(self.geo.cells, new.cells);
                self.geo = new;
                bitmap
            }
            Err(_) => bitmap,
        };
        if let Some(w) = &mut warming {
            w.engine_compiled();
        }
        let outcome = self
            .make_engine_taking(Allocator::Built(bitmap), held)
            .map(|engine| self.install(engine))
            .and(grown);
        self.poison_without_engine(&outcome);
        outcome?;
        self.activity.heap_growths += 1;
        self.activity.resize_time += t.elapsed();
        Ok(())
    }

    /// Once the table is half full (growth may follow from then on), starts compiling the
    /// kernels of its growth by a level, once per table and cache setting: a growth then
    /// compiles nothing (a large part of a growth where the driver had not compiled them before:
    /// docs/lab/growth-and-recovery.md, "Growth with its kernels compiled ahead"). Compiling
    /// while the pool grows gained nothing: both take
    /// every host core. Likewise, once the heap is three quarters full, the kernels of the
    /// heap's growth.
    fn compile_next_growth(&mut self) {
        let half_full = self.items as f64 >= GROW_FROM_LOAD * self.geo.slots() as f64;
        // Below the most cells the kernels address, where `heap::grown` would log its refusal.
        let heap_filling = self.items as f64 >= HEAP_WARM_FROM * self.geo.cells as f64
            && self.geo.cells < crate::layout::MAX_CELLS;
        if !(half_full || heap_filling) || !self.options.grow || self.mode == Mode::Volatile {
            return;
        }
        let (cache, verify) = (self.options.gpu.cache, self.options.verify_values);
        let key = self.growth_key();
        let table = half_full && self.next_growth.as_ref().is_none_or(|(k, _)| *k != key);
        let heap = heap_filling
            .then(|| heap::grown(&self.geo, 0).ok())
            .flatten()
            .filter(|&grown| self.next_heap_growth.as_ref().is_none_or(|(k, _)| *k != (grown, cache)));
        if !table && heap.is_none() {
            return;
        }
        // Asked only when kernels are to compile: it counts the cached groups, a measurable
        // share of the server's batcher thread when asked after every batch (docs/lab/server.md,
        // "The server's front end and its batcher").
        let (Ok(gpu), Some(placed)) = (&self.gpu, self.placed_as()) else { return };
        let seed = self.pool.header().table.seed;
        if table {
            let warming = Warming::start(gpu, &self.options.gpu, (&self.geo, seed), placed, verify);
            self.next_growth = Some((key, warming));
        }
        if let Some(grown) = heap {
            let warming = Warming::heap_growth(gpu, &self.options.gpu, (&grown, seed), placed, verify);
            self.next_heap_growth = Some(((grown, cache), warming));
        }
    }

    /// Once the table holds more keys than it is made for ([`TARGET_LOAD`]), starts making the
    /// pool's storage for its growth by a level on a thread of its own
    /// ([`Pool::prepare_growth`]; tmpfs only): making and zeroing those pages was the largest
    /// part of a growth (`docs/lab/growth-and-recovery.md`, "Growth and recovery of 16 M keys,
    /// 4 KiB and 2 MiB pages"). A table made for its keys takes no memory ahead.
    fn prepare_next_growth(&mut self) {
        let past = self.items as f64 > TARGET_LOAD * self.geo.slots() as f64;
        if !past || !self.options.grow || self.mode == Mode::Volatile {
            return;
        }
        if let Ok(regions) = resize::plan(&self.pool, &self.geo) {
            self.pool.prepare_room(&regions);
        }
    }

    /// How the grown table's engine will be placed, as far as its kernels tell: in place (as
    /// this engine is), with its cache planned as if this engine's, which a growth drops
    /// first, were free (its bytes). `None` without an engine.
    fn placed_as(&self) -> Option<(bool, u64)> {
        let engine = self.engine.as_ref()?;
        let (gw, vw) = crate::cache::entry_words(&self.geo);
        let cache = match engine.cache_status() {
            CacheStatus::On(c) => c.entries as u64 * (gw + vw) * 4,
            CacheStatus::Off { .. } => 0,
        };
        Some((self.mode == Mode::ZeroCopy, cache))
    }

    /// What the kernels of the next growth are compiled for.
    fn growth_key(&self) -> GrowthKey {
        (self.geo, self.options.gpu.cache)
    }

    /// Builds the grown table in `regions` and makes an engine for it, or, when the build
    /// fails, forgets it and makes an engine for the old table again.
    fn resize_and_restart(
        &mut self,
        regions: [host_pm::Region; 2],
        mut held: Option<ImportedRegions>,
    ) -> Result<()> {
        let builder = builder(&self.gpu, &self.options.gpu);
        let key = self.growth_key();
        let mut warming = self.next_growth.take().filter(|(k, _)| *k == key).map(|(_, w)| w);
        let grown = resize::begin(&mut self.pool, &self.geo, regions).and_then(|zeroed| {
            if let Some(w) = &mut warming {
                w.build_compiled();
            }
            resize::complete(&mut self.pool, builder, &self.geo, self.items, zeroed, held.as_mut())
        });
        match grown {
            Ok(resize::Grown { geo, bitmap, old_regions, imported }) => {
                self.geo = geo;
                let mut laps = Laps::start("engine after growth");
                if let Some(w) = &mut warming {
                    w.engine_compiled();
                }
                laps.lap("compiled ahead");
                let engine = self.make_engine_taking(Allocator::Built(bitmap), imported);
                laps.lap("engine");
                // After the engine: its imports of the new regions ran slower beside the holes
                // being punched.
                self.pool.give_back_after(&old_regions, held);
                self.install(engine?);
                Ok(())
            }
            Err(e) => {
                drop(held);
                // The old table is intact: forget the resize and carry on with it.
                if self.pool.header().resize.state != 0 {
                    resize::abandon(&mut self.pool)?;
                }
                let (_, allocator) = recovery::recover(&mut self.pool, &self.geo)?;
                let engine = self.make_engine(allocator)?;
                self.install(engine);
                Err(e)
            }
        }
    }

    /// After a call panicked while it held the lock: nothing runs until the index is reopened.
    fn poison_after_panic(&mut self) {
        self.poisoned.get_or_insert_with(|| "a call panicked while it held the index".into());
    }

    /// Closes the table cleanly, unless it is poisoned: the next open needs no recovery.
    /// The allocator is saved beside the table so that the next open needs no scan.
    fn close(mut self) -> Result<()> {
        // The started engine may map the pool, which saving may grow.
        drop(self.starting.take());
        let State { mut engine, mut pool, poisoned, items, .. } = self;
        if poisoned.is_some() {
            // Leave the pool marked dirty: the next open recovers it. The engine may map the
            // pool: it goes first.
            drop(engine);
            return Ok(());
        }
        if pool.header().clean_shutdown && !pool.header().closed.saved.is_empty() {
            // Nothing was written since the open: what the last close saved still holds, under
            // its own checksum.
            drop(engine);
            return Ok(pool.close_unchanged()?);
        }
        let saved = match engine.take() {
            Some(mut engine) => {
                let bitmap = engine.bitmap(&mut pool)?;
                // The engine may map the pool, which saving may grow.
                drop(engine);
                recovery::save_at_close(&mut pool, &bitmap).map(|region| (region, items))
            }
            None => None,
        };
        // The engine may map the pool, which closing unmaps.
        drop(engine);
        Ok(pool.close_saving(saved)?)
    }

    fn stats(&self) -> Stats {
        let t = TableStats::of(&self.geo, self.items);
        Stats {
            items: t.items,
            slots: t.slots,
            load_factor: t.load_factor,
            layout: t.layout,
            key_bytes: t.key_bytes,
            value_bytes: t.value_bytes,
            levels: t.levels,
            cells: t.cells,
            mode: self.mode.clone(),
            max_batch: self.batch_limit(),
            adapter: self.gpu.as_ref().map(|g| format!("{} ({})", g.info.name, g.info.driver)).ok(),
            subgroup_sizes: self.gpu.as_ref().map(|g| g.info.subgroup_sizes).ok(),
            software_device: self.gpu.as_ref().is_ok_and(|g| g.info.is_cpu()),
            backend: self.pool.backend(),
            persist_mode: self.pool.persist_mode(),
            pool_bytes: self.pool.len(),
            recovery: self.recovery.clone(),
            activity: self.activity_now(),
            cache: match &self.engine {
                Some(engine) => engine.cache_status(),
                None => CacheStatus::Off { reason: "the index has no engine".into() },
            },
            poisoned: self.poisoned.clone(),
            gpu_start: self.gpu_start,
        }
    }

    /// See [`GpHash::set_cache`].
    fn set_cache(&mut self, cache: CacheOptions) -> Result<()> {
        cache.validate()?;
        self.adopt_gpu(true);
        let bitmap = self.bitmap()?;
        let old = std::mem::replace(&mut self.options.gpu.cache, cache);
        self.engine = None;
        let outcome = match self.make_engine(Allocator::Built(bitmap.clone())) {
            Ok(engine) => {
                self.install(engine);
                Ok(())
            }
            Err(e) => {
                self.options.gpu.cache = old;
                self.make_engine(Allocator::Built(bitmap)).map(|engine| self.install(engine)).and(Err(e))
            }
        };
        self.poison_without_engine(&outcome);
        outcome
    }

    /// A batch for this table's key and value widths.
    fn batch(&self) -> Batch {
        Batch::new(self.geo.key_bytes as usize, self.geo.value_bytes as usize)
    }

    /// A call: one engine batch when it fits and, if `ordered`, repeats no key; folded
    /// otherwise (batch order is one of the orders an unordered call allows). A call that
    /// only reads is never folded: every read of a key sees the same value, and the engine
    /// batches of a split one change nothing that could need undoing.
    fn call(&mut self, batch: &Batch, ordered: bool) -> Result<BatchResult> {
        self.usable()?;
        self.adopt_gpu(false);
        self.check_widths(batch)?;
        let split = batch.len() > self.max_batch()?;
        if batch.read_only() || !(ordered || split) {
            return self.run_as_is(batch);
        }
        if u32::try_from(batch.len()).is_err() {
            // Folding numbers the operations in 32 bits.
            return Err(Error::BatchTooLarge { len: batch.len() as u64, max: u32::MAX.into() });
        }
        let t = Instant::now();
        let groups = batch.key_groups();
        self.host(t, |p| &mut p.fold);
        if !(split || groups.repeats()) {
            return self.run_as_is(batch);
        }
        let mut result = BatchResult::new(batch.len(), batch.value_bytes());
        self.folded(batch, &groups, split, &mut result)?;
        Ok(result)
    }

    /// The most operations one engine batch holds.
    fn max_batch(&self) -> Result<usize> {
        self.usable()?;
        Ok(self.batch_limit())
    }

    /// The most operations one engine batch holds (0 without an engine).
    fn batch_limit(&self) -> usize {
        let limit = self.engine.as_ref().map_or(0, |e| e.max_batch().min(MAX_BATCH));
        match self.starting {
            // The CPU model's batches, while a GPU starts, are ones its engine takes too: a
            // growth takes it over in the middle of a batch.
            Some(_) => {
                let device = self.options.device.as_ref().map(|g| &g.info);
                limit.min(largest_batch_anywhere(&self.geo, self.pool.len(), &self.options.gpu, device))
            }
            None => limit,
        }
    }

    /// Runs a batch with every key once: reads the states of the keys that `groups` repeats
    /// (and, when the batch is `split` into several engine batches, of every key it may
    /// change), folds each repeated key's operations into their net effect, then runs the
    /// single operations and the net effects.
    fn folded(
        &mut self,
        batch: &Batch,
        groups: &KeyGroups,
        split: bool,
        result: &mut BatchResult,
    ) -> Result<()> {
        // A key only read needs neither its state nor a fold: its reads all see one value
        // (nothing in the call changes it) and run as they are.
        let only_reads = |ops: &[u32]| ops.iter().all(|&i| batch.op(i as usize).0 == OpKind::Get);
        // Nor does a key that the call overwrites first and never deletes, where nothing may
        // need undoing (one engine batch, which rolls back whole): every result follows from
        // its first upsert, and the key ends with the last value written, whatever it held.
        let blind = |ops: &[u32]| !split && batch.overwrites(ops);
        let firsts =
            groups.repeated().filter(|ops| !only_reads(ops) && !blind(ops)).map(|ops| ops[0] as usize);
        let changes = |&i: &usize| split && batch.op(i).0 != OpKind::Get;
        let before = self.read_states(batch, firsts.chain(groups.single().filter(changes)))?;
        let t = Instant::now();
        let mut plan: Vec<Planned> = groups.single().map(|i| Planned::own(batch, i)).collect();
        for ops in groups.repeated() {
            if only_reads(ops) {
                plan.extend(ops.iter().map(|&i| Planned::own(batch, i as usize)));
            } else if blind(ops) {
                // Folded as if the key were absent, which gives the same results after its
                // first upsert; its net effect is then an insert of the last value, which an
                // upsert makes right whatever the key held.
                let net = batch.fold_key(ops, None, result).map(|p| Planned { kind: OpKind::Upsert, ..p });
                plan.extend(net);
            } else {
                plan.extend(batch.fold_key(ops, before.of(ops[0] as usize), result));
            }
        }
        self.host(t, |p| &mut p.fold);
        let Err((applied, e)) = self.run_parts(batch, &plan, result) else {
            return Ok(());
        };
        if applied > 0
            && self.poisoned.is_none()
            && let Err(undo) = self.undo(batch, &plan[..applied], &before, result)
        {
            let why = format!("{e}; undoing the {applied} operations applied before it failed: {undo}");
            self.poisoned = Some(why.clone());
            return Err(Error::Poisoned(why));
        }
        Err(e)
    }

    /// The states of the keys of operations `ops` of `batch`, read (nothing to persist, nothing
    /// to undo).
    fn read_states(&mut self, batch: &Batch, ops: impl Iterator<Item = usize>) -> Result<States> {
        let mut read_of = vec![u32::MAX; batch.len()];
        let mut keys = vec![];
        for (r, i) in ops.enumerate() {
            read_of[i] = r as u32;
            keys.extend_from_slice(batch.op(i).1);
        }
        let reads = Batch::of_kind(OpKind::Get, batch.key_bytes(), batch.value_bytes(), &keys, None)?;
        let values = self.run_as_is(&reads)?;
        // A value that fails its checksum is neither absent nor known: no result can be
        // computed from it, and an undo could not restore it.
        let corrupt = values.statuses.iter().filter(|&&s| s == Status::Corrupt).count();
        if corrupt > 0 {
            return Err(Error::CorruptValues { keys: corrupt as u64 });
        }
        Ok(States { read_of, values })
    }

    /// Runs a batch as it is, as engine batches of at most `max_batch` operations in batch
    /// order, each acknowledged on its own: one engine batch when it fits, or a batch whose
    /// keys are distinct, or one that only reads.
    fn run_as_is(&mut self, batch: &Batch) -> Result<BatchResult> {
        let mut result = BatchResult::new(batch.len(), batch.value_bytes());
        self.in_engine_batches(batch.len(), |s, start, end| {
            s.run(batch, Part::Ops { start, end }, &mut result)
        })
        .map_err(|(_, e)| e)?;
        Ok(result)
    }

    /// Runs `plan` as engine batches of at most `max_batch` operations, in order. On an error,
    /// also says how many operations of `plan` the engine batches before the failing one
    /// applied.
    fn run_parts(
        &mut self,
        batch: &Batch,
        plan: &[Planned],
        result: &mut BatchResult,
    ) -> std::result::Result<(), (usize, Error)> {
        self.in_engine_batches(plan.len(), |s, start, end| {
            s.run(batch, Part::Planned(&plan[start..end]), result)
        })
    }

    /// Calls `run` on operations `start..end` of `n`, in order, at most `max_batch` at a time
    /// (asked before each: a growth may have made a new engine). On an error, also says how
    /// many operations the engine batches before the failing one applied.
    fn in_engine_batches(
        &mut self,
        n: usize,
        mut run: impl FnMut(&mut Self, usize, usize) -> Result<()>,
    ) -> std::result::Result<(), (usize, Error)> {
        let mut start = 0;
        while start < n {
            let end = (start + self.max_batch().map_err(|e| (start, e))?).min(n);
            run(self, start, end).map_err(|e| (start, e))?;
            start = end;
        }
        Ok(())
    }

    /// Takes the keys that `applied` (operations of a failed call, with their results in
    /// `result`) changed back to their states before the call: first deletes the keys the call
    /// created, then restores the others, so that the restores find the room the table had
    /// before the call.
    fn undo(
        &mut self,
        batch: &Batch,
        applied: &[Planned],
        before: &States,
        result: &BatchResult,
    ) -> Result<()> {
        let (mut deletes, mut restores) = (self.batch(), self.batch());
        for p in applied {
            let status = p.expect.unwrap_or(result.statuses[p.key]);
            if p.kind == OpKind::Get || status != Status::Ok {
                continue;
            }
            let key = batch.op(p.key).1;
            match (before.of(p.key), p.kind) {
                (None, _) => deletes.delete(key)?,
                (Some(old), OpKind::Delete) => restores.insert(key, old)?,
                (Some(old), _) => restores.update(key, old)?,
            }
        }
        for b in [deletes, restores] {
            let done = self.run_as_is(&b)?;
            if let Some(i) = done.statuses.iter().position(|&s| s != Status::Ok) {
                let why = format!("undoing with a {:?} gave {:?}", b.op(i).0, done.statuses[i]);
                return Err(Error::Inconsistent(why));
            }
        }
        Ok(())
    }

    fn check_widths(&self, batch: &Batch) -> Result<()> {
        if batch.key_bytes() != self.geo.key_bytes as usize {
            return Err(Error::KeyWidth { found: batch.key_bytes(), expected: self.geo.key_bytes as usize });
        }
        if batch.value_bytes() != self.geo.value_bytes as usize {
            return Err(Error::ValueSize {
                found: batch.value_bytes(),
                expected: self.geo.value_bytes as usize,
            });
        }
        Ok(())
    }

    /// One engine batch through the protocol, its results stored in `result`. A failure of
    /// the engine or of a persist poisons the index: it must be reopened, which recovers.
    fn run(&mut self, batch: &Batch, part: Part, result: &mut BatchResult) -> Result<()> {
        self.usable()?;
        let n = part.len();
        if n == 0 {
            return Ok(());
        }
        let t = Instant::now();
        let mut encoded = std::mem::take(&mut self.encoded);
        batch.encode_part(part, &mut encoded);
        self.host(t, |p| &mut p.encode);
        let outcome = self.protocol(Input::Host(&encoded));
        self.encoded = encoded;
        let stored = outcome.and_then(|()| self.store(0, batch, part, result));
        self.acknowledge(n, stored)
    }

    /// Stores the results of the batch in `slot`, operations `part` of `batch`, in `result`.
    fn store(&mut self, slot: usize, batch: &Batch, part: Part, result: &mut BatchResult) -> Result<()> {
        let t = Instant::now();
        let (statuses, values) = self.engine()?.results(slot);
        result.scatter(batch, part, statuses, values)?;
        self.host(t, |p| &mut p.decode);
        Ok(())
    }

    /// Counts a batch of `n` operations that ended with `outcome`.
    fn acknowledge(&mut self, n: usize, outcome: Result<()>) -> Result<()> {
        match outcome {
            Ok(()) => {
                self.activity.batches += 1;
                self.activity.operations += n as u64;
                Ok(())
            }
            Err(e) => Err(self.failed(e)),
        }
    }

    /// See [`GpHash::execute_device`].
    fn execute_device(&mut self, batch: &DeviceBatch) -> Result<()> {
        self.usable()?;
        self.adopt_gpu(true);
        let outcome = self.protocol(Input::Device(batch));
        self.acknowledge(batch.len as usize, outcome)
    }

    /// Counts a rolled-back batch, or poisons the index after any other failure (the first
    /// failure names the cause).
    fn failed(&mut self, e: Error) -> Error {
        match e {
            // The batch was rolled back and the table is as it was.
            Error::TableFull { .. }
            | Error::HeapFull { .. }
            | Error::Resize(_)
            | Error::Pool(host_pm::PoolError::OutOfSpace { .. }) => self.activity.rolled_back += 1,
            Error::MissingFeature(_)
            | Error::InvalidConfig(_)
            | Error::BatchTooLarge { .. }
            | Error::NotReadsOnly { .. }
            | Error::CorruptValues { .. } => {}
            _ => {
                self.poisoned.get_or_insert_with(|| e.to_string());
            }
        }
        e
    }

    /// Phase A, persist, phase B (or rollback), persist, in slot 0: nothing else is in flight.
    fn protocol(&mut self, batch: Input) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        self.start_a(0, batch)?;
        self.end(0, batch)
    }

    /// Starts phase A of `batch` in `slot`.
    fn start_a(&mut self, slot: usize, batch: Input) -> Result<()> {
        if !batch.read_only() {
            // What the last close saved is freed by `mark_dirty`: read it first.
            let (engine, pool) = self.parts();
            engine.load_allocator(pool)?;
            // Durable before phase A writes anything: a crash from here on leaves a pool
            // that says it needs recovery. A no-op once the pool is dirty.
            self.pool.mark_dirty()?;
        }
        self.step(slot, Phase::A, batch)
    }

    /// Starts `phase` of `batch` in `slot`.
    fn step(&mut self, slot: usize, phase: Phase, batch: Input) -> Result<()> {
        let t = Instant::now();
        let (engine, pool) = self.parts();
        let started = engine.start(pool, slot, phase, batch);
        let stopped = self.engine_done(t);
        self.started = Some((slot, stopped));
        started
    }

    /// Waits for the phase last started in `slot`, persists what it wrote (unless it is phase A
    /// of a reads-only batch, which wrote nothing) and returns its control block.
    fn settle(&mut self, slot: usize, reads_only: bool) -> Result<Control> {
        let t = match self.started.take() {
            Some((started, stopped)) if started == slot => stopped,
            _ => Instant::now(),
        };
        let (engine, pool) = self.parts();
        let report = engine.finish(pool, slot);
        self.engine_done(t);
        let report = report?;
        if !reads_only {
            self.persist(&report.written)?;
        }
        Ok(report.control)
    }

    /// Takes `batch`, whose phase A runs in `slot`, to its end: waits for phase A and persists
    /// it, then runs phase B and persists it, unless the batch needs none (a reads-only batch's
    /// results are complete after phase A, and it persists nothing; device batches hold theirs
    /// already). A batch rolled back because the table (or its heap) is full runs again after
    /// the table grew, unless growth is off: only when nothing else is in flight.
    fn end(&mut self, slot: usize, batch: Input) -> Result<()> {
        // Where a batch that grew the table spends the time from its rollback on.
        let mut laps: Option<Laps> = None;
        loop {
            let a = self.settle(slot, batch.read_only())?;
            if let Some(l) = &mut laps {
                l.lap("phase A again");
            }
            if a[control::REFUSED] > 0 {
                return Err(Error::NotReadsOnly { count: a[control::REFUSED] as u64 });
            }
            let (full, no_cell) = (a[control::FULL], a[control::NO_CELL]);
            if full == 0 && no_cell == 0 {
                let (publish, allocated) = (a[control::NEED_B] > 0, a[control::ALLOCATED] > 0);
                if batch.read_only() || (matches!(batch, Input::Device(_)) && !publish && !allocated) {
                    return Ok(());
                }
                self.step(slot, Phase::B { publish }, batch)?;
                // Acknowledged once phase B is persisted.
                let b = self.settle(slot, false)?;
                if let Some(l) = &mut laps {
                    l.lap("phase B");
                }
                self.items += b[control::PUBLISHED] as u64;
                self.items -= b[control::DELETED] as u64;
                self.compile_next_growth();
                self.prepare_next_growth();
                return Ok(());
            }
            let l = laps.insert(Laps::start("a growing batch after its phase A"));
            self.step(slot, Phase::Rollback, batch)?;
            self.settle(slot, false)?;
            l.lap("rollback");
            let load = self.items as f64 / self.geo.slots() as f64;
            let early = (self.items + batch.len() as u64) as f64 / (self.geo.slots() as f64) < GROW_FROM_LOAD;
            if !self.options.grow || (full > 0 && early) {
                return Err(if full > 0 {
                    Error::TableFull { failed: full as u64, load, early }
                } else {
                    Error::HeapFull { failed: no_cell as u64 }
                });
            }
            if full > 0 {
                self.grow()?;
            } else {
                // The table has slots; only the heap is short of cells.
                self.grow_heap(no_cell as u64)?;
            }
            if let Some(l) = &mut laps {
                l.lap(if full > 0 { "growth" } else { "heap growth" });
            }
            self.start_a(slot, batch)?;
        }
    }

    fn persist(&mut self, written: &Written) -> Result<()> {
        self.started = None;
        let t = Instant::now();
        match written {
            Written::Lines(lines) => {
                self.pool.persist_lines(lines)?;
                self.activity.persisted_lines += lines.len() as u64;
            }
            Written::Overflow => self.pool.persist_all()?,
            // The pool's persist mode is a fence or nothing: no line list needed.
            Written::NotTracked => self.pool.persist_lines(&[])?,
        }
        let spent = t.elapsed();
        self.activity.persist_time += spent;
        self.activity.profile.persist += spent;
        Ok(())
    }

    /// Adds the host time since `t` to `host_time` and to the stage `stage` picks.
    fn host(&mut self, t: Instant, stage: fn(&mut Profile) -> &mut Duration) {
        self.started = None;
        let spent = t.elapsed();
        self.activity.host_time += spent;
        *stage(&mut self.activity.profile) += spent;
    }

    /// Adds the engine time since `t`, and the engine's own breakdown of it; returns when it
    /// stopped counting.
    fn engine_done(&mut self, t: Instant) -> Instant {
        self.started = None;
        let now = Instant::now();
        self.activity.engine_time += now - t;
        if let Some(engine) = self.engine.as_mut() {
            self.activity.profile += engine.take_profile();
        }
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU table of 200 keys in a pool file in `dir`.
    fn table(dir: &tempfile::TempDir) -> GpHash {
        let options = Options { executor: Executor::Cpu, ..Options::default() };
        let t = GpHash::create(
            Some(&dir.path().join("p")),
            &Config { capacity: 300, ..Config::default() },
            &options,
        )
        .unwrap();
        let keys: Vec<u8> = (0..200u64).flat_map(u64::to_le_bytes).collect();
        t.insert(&keys, &keys).unwrap();
        t
    }

    /// Every call of a poisoned index returns `Poisoned`; `stats` says so, with `why`; nothing
    /// panics. Reopening recovers the table with `keys` keys.
    fn assert_poisoned(t: GpHash, dir: &tempfile::TempDir, keys: u64, why: &str) {
        let poisoned = |r: Result<()>, what: &str| {
            assert!(matches!(r, Err(Error::Poisoned(_))), "{what}: {r:?}");
        };
        let key = 1u64.to_le_bytes();
        poisoned(t.get(&key).map(drop), "get");
        poisoned(t.insert(&7777u64.to_le_bytes(), &key).map(drop), "insert");
        poisoned(t.execute_ordered(&t.batch()).map(drop), "execute_ordered");
        poisoned(t.grow(), "grow");
        poisoned(t.set_cache(crate::cache::CacheOptions::default()), "set_cache");
        poisoned(t.load_cache(), "load_cache");
        poisoned(t.cells_used().map(drop), "cells_used");
        poisoned(t.cache_snapshot().map(drop), "cache_snapshot");
        let stats = t.stats();
        assert!(stats.poisoned.as_deref().is_some_and(|poisoned| poisoned.contains(why)), "{stats}");
        assert!(stats.to_string().contains("poisoned"));
        t.close().unwrap();
        let t =
            GpHash::open(&dir.path().join("p"), &Options { executor: Executor::Cpu, ..Options::default() })
                .unwrap();
        assert_eq!(t.len(), keys);
        assert!(t.check().ok());
    }

    /// A cache change whose engine cannot be made, nor the old one again, poisons the index
    /// (it used to leave it without an engine, and the next call panicked).
    #[test]
    fn a_failed_cache_change_poisons_the_index() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
        let t = table(&dir);
        // Only the new engine fails: the old settings stay and the index works.
        t.state().failing_engines = 1;
        assert!(matches!(t.set_cache(crate::cache::CacheOptions::default()), Err(Error::Gpu(_))));
        assert_eq!(t.stats().poisoned, None);
        assert_eq!(t.get(&1u64.to_le_bytes()).unwrap().value(0), Some(&1u64.to_le_bytes()[..]));
        // Both fail.
        t.state().failing_engines = 2;
        assert!(matches!(t.set_cache(crate::cache::CacheOptions::default()), Err(Error::Gpu(_))));
        assert_poisoned(t, &dir, 200, "injected");
    }

    /// A resize after which no engine can be made for the grown table poisons the index; so
    /// does an insertion whose growth fails that way. Reopening finds the grown table.
    #[test]
    fn a_failed_grow_poisons_the_index() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
        let t = table(&dir);
        let slots = t.geometry().slots();
        t.state().failing_engines = 1;
        assert!(matches!(t.grow(), Err(Error::Gpu(_))));
        let top = t.with_pool(|pool| pool.header().table.top_level);
        assert_eq!(top, t.geometry().top_level, "the grown table is in charge");
        assert_eq!(t.geometry().slots(), 2 * slots);
        assert_poisoned(t, &dir, 200, "injected");

        let dir = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
        let t = table(&dir);
        t.state().failing_engines = 1;
        let keys: Vec<u8> = (1000..2000u64).flat_map(u64::to_le_bytes).collect();
        assert!(matches!(t.insert(&keys, &keys), Err(Error::Gpu(_))), "the insertion needs growth");
        assert_poisoned(t, &dir, 200, "injected");
    }

    /// The kernels compiled ahead of a growth (of the heap, then of the table by a level) are
    /// those the grown table's engine compiles: only then does the driver's cache serve the
    /// growth. Compiling ahead is off on lavapipe, so the configurations are compared, not the
    /// compiles.
    #[test]
    fn kernels_compiled_ahead_are_those_of_the_grown_table() {
        let gpu = match Gpu::new() {
            Ok(gpu) => gpu,
            Err(e)
                if std::env::var("CI").as_deref() != Ok("true")
                    && std::env::var("GPHASH_SKIP_GPU_TESTS").as_deref() == Ok("1") =>
            {
                eprintln!("WARNING: no GPU ({e}); GPHASH_SKIP_GPU_TESTS=1: not run");
                return;
            }
            Err(e) => panic!("no GPU: {e}"),
        };
        let dir = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
        let options = Options { executor: Executor::Gpu, device: Some(gpu), ..Options::default() };
        let config = Config { capacity: 300, ..Config::default() };
        let t = GpHash::create(Some(&dir.path().join("p")), &config, &options).unwrap();
        let keys: Vec<u8> = (0..200u64).flat_map(u64::to_le_bytes).collect();
        t.insert(&keys, &keys).unwrap();
        // As `compile_next_growth` plans them.
        let planned = |grown: fn(&Geometry) -> Geometry| {
            let s = t.state();
            let gpu = s.gpu.clone().unwrap();
            let table = (grown(&s.geo), Seeds::new(s.pool.header().table.seed, s.geo.layout.hashes));
            let placed = s.placed_as().unwrap();
            GpuEngine::planned_config(&gpu, table, placed, &s.options.gpu, s.options.verify_values).unwrap()
        };
        let made = || t.state().engine.as_ref().unwrap().kernel_config().cloned();
        let heap_grown = planned(|g| heap::grown(g, 0).unwrap());
        t.state().grow_heap(1).unwrap();
        assert_eq!(made(), Some(heap_grown), "after a growth of the heap");
        let grown = planned(|g| g.grown().unwrap());
        t.grow().unwrap();
        assert_eq!(made(), Some(grown), "after a growth by a level");
    }

    /// Regions of the pool, in any order, are the bytes at their offsets.
    #[test]
    fn disjoint_regions_are_where_their_offsets_say() {
        let t = GpHash::create(
            None,
            &Config::default(),
            &Options { executor: Executor::Cpu, ..Options::default() },
        )
        .unwrap();
        let mut state = t.state();
        let pool = &mut state.pool;
        let region = |offset: u64, bytes: u64| host_pm::Region { offset: offset << 16, bytes };
        let [c, a, b] = crate::cpu::disjoint_regions(pool, [region(3, 3), region(1, 2), region(2, 65536)]);
        a.fill(1);
        b.fill(2);
        c.fill(3);
        let bytes = pool.bytes_mut();
        assert_eq!(
            (bytes[1 << 16], bytes[(1 << 16) + 2], bytes[2 << 16], bytes[(3 << 16) - 1]),
            (1, 0, 2, 2)
        );
        assert_eq!((bytes[3 << 16], bytes[(3 << 16) + 2], bytes[(3 << 16) + 3]), (3, 3, 0));
    }

    /// A call that panics while it holds the lock poisons the index: later calls (from any
    /// thread) return `Poisoned` instead of panicking, and reopening recovers the table.
    #[test]
    fn a_panic_under_the_lock_poisons_the_index() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
        let t = table(&dir);
        std::thread::scope(|s| {
            let panicked = s.spawn(|| {
                let _held = t.state();
                panic!("a defect while the index is locked");
            });
            assert!(panicked.join().is_err());
        });
        assert!(t.state.is_poisoned());
        assert_poisoned(t, &dir, 200, "panicked");
    }
}
