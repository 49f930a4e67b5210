//! The GPU engine: table and heap bound as storage windows (imported pool memory in
//! zero-copy mode, device buffers in staged mode), the per-batch buffers, and the submits of
//! each phase.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use gphash_gpu::direct::{DirectPipelines, DirectSet, DirectSubmit};
use gphash_gpu::hostmem::{self, HostBuffer};
use gphash_gpu::resources::{
    ErrorScopes, ImportedRegions, Pipelines, PoolRef, PoolWindows, Residence, batch_layout, bind_group,
    bind_group_layout, build_pipelines, download_words, map_read_after, max_window, read_dirty,
    record_passes, scoped, storage_buffer, writeback_invocations,
};
use gphash_gpu::shader::Windows;
use gphash_gpu::timing::PassTimer;
use gphash_gpu::{DeviceInfo, Gpu};
use host_pm::{Pool, Region};

use super::cache::DeviceCache;
use super::shader::{self, CacheConfig, Kernel, KernelConfig, Params};
use crate::cache::{CacheOptions, CacheStatus, Snapshot};
use crate::device_batch::DeviceBatch;
use crate::engine::{Engine, Input, MAX_BATCH, Mode, Phase, Report, Written};
use crate::error::{Error, Result};
use crate::layout::Geometry;
use crate::model::{Bitmap, Control};
use crate::profile::{Laps, Profile};
use crate::protocol::{OpState, control};
use gphash_gpu::resources::Binding;
use gphash_gpu::shader::Reach;

/// Phase A's target invocations per dispatch: a batch smaller than this is spread over more
/// lanes per operation (`GpuEngine::phase_a_lanes`). Measured on the H200:
/// docs/lab/ycsb-suite-history.md, "Phase A spread: small batches fill the GPU", and
/// docs/lab/kernels.md, "Tile width and phase A's spread: measured, defaults kept".
const SPREAD_INVOCATIONS: u64 = 1 << 17;

/// The most invocations a search dispatch over host memory gets (a larger batch of gets gives
/// each lane several operations in turn): with 128-byte values, batches of 2^18 gets and more
/// found fewer keys a second over PCIe than batches of 2^17 with the same tiles (H100), and on
/// the H200 batches of 2^17 fewer than batches of 2^16, whose dispatch has 2^16 operations in
/// flight (docs/lab/device-batches.md, "Searches over PCIe: fewer in flight";
/// docs/lab/ycsb-suite-history.md, "H200 scoreboard: the performance aims in one build").
/// Applies to a zero-copy table whose cache does not hold every group.
const HOST_SEARCH_INVOCATIONS: u64 = 1 << 16;

// The search kernel serves several operations a lane only where each has a lane of its own
// (spread 1): every batch larger than the cap must get spread 1 from `phase_a_lanes`.
const _: () = assert!(SPREAD_INVOCATIONS <= 2 * HOST_SEARCH_INVOCATIONS);

/// Whether a submit recorded with Vulkan itself may run kernel `k`: every batch kernel but the
/// staged write-back (a staged pool's submits stay wgpu's) and the cache's loading: its fills
/// read a plan written through wgpu's queue, which reaches the GPU only with wgpu's next
/// submit, and its decay runs only at the start of a loading phase, with the first fills.
fn direct_kernel(k: Kernel) -> bool {
    !matches!(k, Kernel::Writeback | Kernel::CacheFill | Kernel::CacheDecay)
}

/// Phase A's narrowest tile (for large batches): 4 lanes cover the at most 128 candidate slots
/// of a layout in 32 passes, the most a lane's bit mask of empty candidates holds.
const NARROWEST_TILE: u32 = 4;

/// Where the table lives while the GPU works on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// Zero-copy where the driver imports the pool mapping, staged otherwise (reported).
    #[default]
    Auto,
    /// Zero-copy or an error.
    ZeroCopy,
    /// Always a device-memory copy written back at persist points.
    Staged,
    /// The table lives in device memory only and nothing is written back: the upper bound of
    /// benchmarks (feature `bench`). Nothing persists, the pool on the host goes stale (do not
    /// reopen it) and the table cannot grow.
    #[cfg(feature = "bench")]
    Volatile,
}

impl From<Placement> for gphash_gpu::Placement {
    fn from(p: Placement) -> Self {
        match p {
            Placement::Auto => gphash_gpu::Placement::Auto,
            Placement::ZeroCopy => gphash_gpu::Placement::ZeroCopy,
            Placement::Staged => gphash_gpu::Placement::Staged,
            #[cfg(feature = "bench")]
            Placement::Volatile => gphash_gpu::Placement::Volatile,
        }
    }
}

/// GPU-specific settings.
#[derive(Clone, Debug)]
pub struct GpuOptions {
    /// Zero-copy or staged.
    pub placement: Placement,
    /// Lanes per operation: a power of two up to 32 (1 is the `naive` baseline: one
    /// invocation per operation, no subgroup cooperation). Phase A takes it as its widest tile
    /// and narrows its tiles down to 4 lanes for large batches (`GpuEngine::phase_a_lanes`).
    pub tile: u32,
    /// Largest storage window in bytes (default: the device's binding limit).
    pub max_window_bytes: Option<u64>,
    /// The bucket cache in device memory (used when the pool is zero-copy: otherwise the
    /// table is in device memory already).
    pub cache: CacheOptions,
    /// Time each kernel on the GPU (timestamp queries, where the device has them) into
    /// [`Profile::kernels`]; off by default, so batches record no timestamps.
    pub time_kernels: bool,
    /// The kernels reach the pool as pools over 16 GiB need even where it is smaller: 64-bit
    /// word addresses, each region's windows as one binding array where the device has them,
    /// and the 256-byte dirty lines of a 1 TiB pool (see `docs/design.md`, "Pools past
    /// 16 GiB"); for tests and for measuring the cost.
    pub large_pool_mode: bool,
    /// The cell where the allocator's cursor starts, instead of the start of the bitmap's
    /// longest free run: for tests that put values far into a heap without filling it
    /// (feature `testing`).
    #[cfg(feature = "testing")]
    pub first_cell: Option<u64>,
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            placement: Placement::Auto,
            tile: 32,
            max_window_bytes: None,
            cache: CacheOptions::default(),
            time_kernels: false,
            large_pool_mode: false,
            #[cfg(feature = "testing")]
            first_cell: None,
        }
    }
}

/// What a submit reads back besides the control block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Results {
    None,
    Statuses,
    WithValues,
}

/// Batches the engine holds at once: one runs on the GPU while the host prepares or takes the
/// results of the other (`Engine::slots`).
const SLOTS: usize = 2;

/// One batch's place in the engine: its buffers, its results and, while a submit of it runs,
/// that submit.
#[derive(Default)]
struct Slot {
    /// The slot's submits recorded with Vulkan itself (its batch's, then its tail's), where the
    /// engine records them: first of the fields, so that a slot dropped waits for them before
    /// its buffers go.
    direct: Option<[DirectSubmit; 2]>,
    io: Option<BatchBuffers>,
    /// The bind group of the last device-buffer batch, kept for the next one with the same
    /// buffers and length (`None`: the host batch buffers).
    device_bind: Option<DeviceBind>,
    /// Whether the running batch is a device batch (bound by `device_bind`).
    device: bool,
    /// Whether the running batch's operations are in host memory (`BatchBuffers::host_ops`).
    host: bool,
    /// Operations in the batch.
    n: u32,
    running: Option<Running>,
    /// Phase B of the batch, recorded while its phase A runs (`GpuEngine::start_a`), submitted
    /// if phase B is what follows.
    prepared: Option<Recorded>,
    /// The tail of the slot's last write batch, submitted after its phase B and not waited for
    /// (see [`GpuEngine::closing`]): it reads the batch's input, so the slot's next batch
    /// waits for it before writing or replacing its buffers.
    tail: Option<Tail>,
    /// The last submit's results, copied out of the readback buffer, or where they are in
    /// `BatchBuffers::host_ops`'s outputs (byte ranges), which the kernels wrote in place: the
    /// host reads them there, without a copy ([`Engine::results`]), until the slot's next
    /// submit (which clears the ranges).
    statuses: Vec<u32>,
    values: Vec<u32>,
    in_host: Option<[std::ops::Range<usize>; 2]>,
}

/// A submit recorded, not yet submitted.
struct Recorded {
    kernels: Vec<Kernel>,
    results: Results,
    cmds: Vec<wgpu::CommandBuffer>,
    /// Kernels submitted after `cmds` that the host does not wait for, and their commands.
    tail: Option<(Vec<Kernel>, Vec<wgpu::CommandBuffer>)>,
    passes: u32,
    writeback: bool,
    in_host: bool,
}

/// A tail submitted: through wgpu (done once its flag is set) or recorded with Vulkan itself
/// (the slot's second direct submit).
enum Tail {
    Wgpu { submission: wgpu::SubmissionIndex, done: Arc<AtomicBool> },
    Direct,
}

/// The batch bind group of a device batch and what it binds: the batch's buffers (kinds, keys,
/// values, statuses, found) and length.
struct DeviceBind {
    buffers: [wgpu::Buffer; 5],
    len: u32,
    group: wgpu::BindGroup,
}

impl DeviceBind {
    fn binds(&self, d: &DeviceBatch) -> bool {
        self.len == d.len && self.buffers.iter().zip(d.buffers()).all(|(a, b)| a == b)
    }
}

/// How the host learns that a submit in flight ran, and where it finds its results.
enum Completion {
    /// Through wgpu, its results copied into the slot's readback buffer, which is mapped.
    Mapped(wgpu::SubmissionIndex),
    /// Through wgpu, its results in host memory ([`HostOps`]): the flag is set once it ran.
    Flagged(wgpu::SubmissionIndex, Arc<AtomicBool>),
    /// Recorded with Vulkan itself (the slot's first direct submit), its results in host
    /// memory.
    Direct,
}

/// A submit in flight, to be taken by `GpuEngine::collect`.
struct Running {
    completion: Completion,
    kernels: Vec<Kernel>,
    results: Results,
    /// Passes recorded (the timed ones).
    passes: u32,
    /// Whether the staged write-back gather ran after the kernels.
    writeback: bool,
    /// When the host turned from the submit, having recorded what follows it: the profile's
    /// wait starts here.
    submitted: Instant,
}

/// Buffers sized for the largest batch so far.
struct BatchBuffers {
    cap: u32,
    dirty_cap: u32,
    layout: ReadbackLayout,
    /// The operations of batches larger than [`HOST_OPS_MAX`] (or of all, where the driver
    /// imports no host memory), made at the first.
    device_ops: Option<Ops<[wgpu::Buffer; 5]>>,
    /// The operations of smaller batches, made at the first.
    host_ops: Option<Ops<HostOps>>,
    dirty: wgpu::Buffer,
    staging: wgpu::Buffer,
    claims: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// The table's bind group with these working buffers.
    bind: wgpu::BindGroup,
    /// Whether a submit through wgpu bound `bind`: wgpu then regards every buffer it binds as
    /// initialized, and a submit recorded with Vulkan itself may bind them too (wgpu clears a
    /// buffer at its own first use, whatever was written into it before).
    wgpu_used: bool,
    /// `bind` for submits recorded with Vulkan itself (where the engine records them).
    direct: Option<DirectSet>,
}

/// A slot's operations (kinds, keys, input values) and results (statuses, found values) for
/// host batches of up to `cap` operations, and the batch bind group that binds them: device
/// buffers (the inputs written through wgpu's staging memory, the results copied to the
/// readback buffer, which the host maps), or [`HostOps`].
struct Ops<B> {
    cap: u32,
    buffers: B,
    bind: wgpu::BindGroup,
    /// `bind` for submits recorded with Vulkan itself (host memory only, where the engine
    /// records such submits).
    direct: Option<DirectSet>,
}

/// A slot's operations and results in host memory that the kernels read and write in place,
/// with the control block's copy: two imports, since a dispatch may not bind one buffer both
/// read-only and read-write.
struct HostOps {
    /// Kinds, keys and input values.
    inputs: HostBuffer,
    /// The control block's copy, statuses and found values.
    outputs: HostBuffer,
    /// Byte offsets of the control block's copy (in `outputs`), then of kinds, keys, input
    /// values (in `inputs`), statuses and found values (in `outputs`), each on a 256-byte
    /// boundary (binding offsets must be aligned).
    at: [usize; 6],
}

/// The largest batch whose operations and results live in host memory ([`HostOps`]):
/// no staging copy, copy command or mapping. That made batches of 4,096 and 16,384 faster,
/// while a limit of 2^16 made batches of 65,536 gets slower, their kernels reading and
/// writing over PCIe (docs/lab/latency.md, "A small batch's operations in host memory").
const HOST_OPS_MAX: u32 = 1 << 14;

impl HostOps {
    /// Host memory for the control block and the five operation buffers of `bytes` each
    /// (`Err`: why the driver would not import it).
    fn new(gpu: &Arc<Gpu>, bytes: [u64; 5]) -> std::result::Result<HostOps, String> {
        let up = |x: u64| x.max(4).next_multiple_of(256) as usize;
        let mut at = [0; 6];
        let (mut inputs, mut outputs) = (0, up((control::WORDS * 4) as u64));
        for (i, b) in bytes.into_iter().enumerate() {
            let end = if i < 3 { &mut inputs } else { &mut outputs };
            at[i + 1] = *end;
            *end += up(b);
        }
        let inputs = HostBuffer::new(gpu, inputs as u64, "batch inputs")?;
        let outputs = HostBuffer::new(gpu, outputs as u64, "batch outputs")?;
        Ok(HostOps { inputs, outputs, at })
    }

    /// Buffer `i` (0: kinds ... 4: found values) as bound, `bytes` long.
    fn binding(&self, i: usize, bytes: u64) -> wgpu::BindingResource<'_> {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: if i < 3 { self.inputs.buffer() } else { self.outputs.buffer() },
            offset: self.at[i + 1] as u64,
            size: wgpu::BufferSize::new(bytes.max(4)),
        })
    }

    /// Writes a host batch's operations in place.
    fn write(&mut self, e: &crate::batch::Encoded) {
        let at = self.at;
        // SAFETY: the engine writes a slot's inputs only between its submits (`start_a`), after
        // the slot's last tail ended (`GpuEngine::reserve`), and a slot's submits run one at a
        // time, each collected before the next starts.
        let memory = unsafe { self.inputs.bytes_mut() };
        for (i, words) in [&e.kinds, &e.keys, &e.values].into_iter().enumerate() {
            let bytes: &[u8] = bytemuck::cast_slice(words);
            crate::bulk::copy(&mut memory[at[i + 1]..at[i + 1] + bytes.len()], bytes);
        }
    }
}

/// Offsets inside the readback buffer.
#[derive(Clone, Copy)]
struct ReadbackLayout {
    /// The kernels' timestamps, after the control block (none where kernels are not timed).
    timestamps: u64,
    statuses: u64,
    values: u64,
    lines: u64,
    total: u64,
}

impl ReadbackLayout {
    fn new(
        cap: u64,
        dirty_cap: u64,
        value_words: u64,
        staged_line: Option<u64>,
        timestamp_bytes: u64,
    ) -> Self {
        let up = |x: u64| x.div_ceil(256) * 256;
        let timestamps = 256;
        let statuses = timestamps + up(timestamp_bytes);
        let values = statuses + up(cap * 4);
        let lines = values + up(cap * value_words * 4);
        let staging = lines + up(dirty_cap * 4);
        let total = staging + dirty_cap * staged_line.unwrap_or(0);
        ReadbackLayout { timestamps, statuses, values, lines, total }
    }
}

/// The batch buffers for `cap` operations: the bound ones (label and bytes) and the readback
/// (with room for `timestamp_bytes` of kernel timestamps).
struct BatchSizes {
    dirty_cap: u32,
    bound: [(&'static str, u64); 9],
    readback: ReadbackLayout,
}

impl BatchSizes {
    /// `staged_line`: the bytes of a dirty line that the write-back copies (none unless staged).
    fn new(cap: u64, geo: &Geometry, staged_line: Option<u64>, timestamp_bytes: u64) -> Self {
        let (kw, vw, cw) = (geo.key_words() as u64, geo.value_words() as u64, geo.cell_words() as u64);
        // Lines one operation can write in one phase: its cell, then fingerprint, state and key.
        let per_op = cw / 16 + kw / 16 + 8;
        let dirty_cap = (cap * per_op).min(u32::MAX as u64 / 16) as u32;
        let lines = dirty_cap as u64;
        BatchSizes {
            dirty_cap,
            // In the order `reserve` binds them.
            bound: [
                ("kinds", cap * 4),
                ("keys", cap * kw * 4),
                ("vals_in", cap * vw * 4),
                ("statuses", cap * 4),
                ("vals_out", cap * vw * 4),
                ("opstate", cap * OpState::WORDS * 4),
                ("dirty", lines * 4),
                ("staging", staged_line.map_or(16, |line| lines * line)),
                // The claim registry, at most half full.
                ("claims", cap * 2 * 4),
            ],
            readback: ReadbackLayout::new(cap, lines, vw, staged_line, timestamp_bytes),
        }
    }

    /// Whether a device with these limits can hold them: every bound buffer within the
    /// binding limit, every buffer within the buffer limit.
    fn fit(&self, max_binding: u64, max_buffer: u64) -> bool {
        self.bound.iter().all(|&(_, bytes)| bytes <= max_binding.min(max_buffer))
            && self.readback.total <= max_buffer
    }
}

/// Dirty lines of 256 bytes (shift 2) under `GpuOptions::large_pool_mode`, as a pool of 1 TiB
/// has them: the tests cover the coarse lines on small pools.
const LARGE_POOL_MODE_LINE_SHIFT: u32 = 2;

/// The bytes of a dirty line that the staged write-back copies (none unless staged).
fn staged_line(windows: &PoolWindows) -> Option<u64> {
    windows.staged().then(|| windows.line_bytes())
}

/// The largest batch whose buffers the device can hold: a power of two (the claim registry
/// is indexed by a mask) no larger than [`MAX_BATCH`].
fn largest_batch(
    geo: &Geometry,
    staged_line: Option<u64>,
    timestamp_bytes: u64,
    info: &DeviceInfo,
) -> Result<u32> {
    largest_fitting(geo, staged_line, timestamp_bytes, info.max_binding, info.max_buffer).ok_or_else(|| {
        Error::InvalidConfig(format!(
            "{}-byte values: the buffers of even one operation exceed what {} can bind",
            geo.value_bytes, info.name
        ))
    })
}

fn largest_fitting(
    geo: &Geometry,
    staged_line: Option<u64>,
    timestamp_bytes: u64,
    max_binding: u64,
    max_buffer: u64,
) -> Option<u32> {
    (0..=MAX_BATCH.trailing_zeros()).rev().map(|shift| 1u32 << shift).find(|&cap| {
        BatchSizes::new(cap as u64, geo, staged_line, timestamp_bytes).fit(max_binding, max_buffer)
    })
}

/// The largest batch an engine for `geo`, its pool of `pool_bytes`, takes on `device` (`None`:
/// any device with WebGPU's default buffer limits or more, 128 MiB a binding and 256 MiB a
/// buffer) however it is placed: staged, its kernels timed, with the dirty lines of the pool
/// after a growth (the grown table and heap placed past its end). A CPU model waiting for a
/// GPU to start runs batches no larger: a growth takes the GPU over in the middle of a batch.
pub(crate) fn largest_batch_anywhere(
    geo: &Geometry,
    pool_bytes: u64,
    opts: &GpuOptions,
    device: Option<&DeviceInfo>,
) -> usize {
    let grown = geo.grown().unwrap_or(*geo);
    let after_growth = pool_bytes.saturating_add(grown.table_bytes()).saturating_add(grown.heap_bytes());
    let mode_shift = if opts.large_pool_mode { LARGE_POOL_MODE_LINE_SHIFT } else { 0 };
    let line_bytes = 64 << gphash_gpu::resources::line_shift(after_growth).max(mode_shift);
    let timestamps = PassTimer::bytes(Kernel::BATCH.len() as u32);
    let (binding, buffer) = device.map_or((128 << 20, 256 << 20), |d| (d.max_binding, d.max_buffer));
    largest_fitting(geo, Some(line_bytes), timestamps, binding, buffer).map_or(1, |n| n as usize)
}

/// Room in the readback buffer for the timestamps of a submit's kernels.
fn timestamp_bytes(timer: &Option<PassTimer>) -> u64 {
    timer.as_ref().map_or(0, |t| PassTimer::bytes(t.max_passes()))
}

/// The windows of an engine being made: released if it fails to be made, so that no import
/// of the pool outlives the failure (the pool may then move).
struct Placed<'a>(Option<PoolWindows>, &'a Gpu);

impl<'a> Placed<'a> {
    fn new(gpu: &'a Gpu, windows: PoolWindows) -> Self {
        Placed(Some(windows), gpu)
    }
}

impl Drop for Placed<'_> {
    fn drop(&mut self) {
        if let Some(w) = &mut self.0 {
            w.release(self.1);
        }
    }
}

/// Executes batches on a GPU.
pub(crate) struct GpuEngine {
    gpu: Arc<Gpu>,
    cfg: KernelConfig,
    windows: PoolWindows,
    cache: DeviceCache,
    /// The value-cell allocator's bitmap, in the windows `cfg.bitmap` says.
    bitmap: Vec<wgpu::Buffer>,
    /// A bit per bitmap word, set while the word is full, and the next-fit cursors (see
    /// `shaders/common/cells.wgsl`).
    allocator: wgpu::Buffer,
    control: wgpu::Buffer,
    /// The table's bind group layout (group 0) and the bindings it was made from.
    layout: (wgpu::BindGroupLayout, Vec<Binding>),
    /// The batch's (group 1).
    batch_layout: (wgpu::BindGroupLayout, Vec<Binding>),
    pipelines: Pipelines<Kernel>,
    slots: [Slot; SLOTS],
    /// The largest batch the buffers can hold on this device.
    max_batch: u32,
    track_lines: bool,
    /// Whether small host batches keep their operations in host memory ([`HOST_OPS_MAX`]):
    /// the driver imports host memory, and did so far.
    ops_in_host_memory: bool,
    /// Batches started (the LRU stamp).
    batches: u32,
    /// Fills of the cache slice in the current submit.
    fills: u32,
    /// Time the current batch has spent in the engine (the loading slices' budget).
    busy: Duration,
    /// Time by stage since the index last took it.
    profile: Profile,
    /// Times the kernels of each submit (`GpuOptions::time_kernels` on a device with
    /// timestamps).
    timer: Option<PassTimer>,
    /// The kernels compiled for submits recorded with Vulkan itself ([`direct_kernel`]),
    /// where the engine records them ([`GpuEngine::direct_serves`]).
    direct: Option<DirectPipelines<Kernel>>,
    /// `GpuOptions::first_cell`.
    #[cfg(feature = "testing")]
    first_cell: Option<u64>,
}

/// Whether an engine for `geo` has a bucket cache: only a table in host memory (imported in
/// place) gains from a copy of its hot groups in device memory, and only with its keys in its
/// buckets.
fn has_cache(zero_copy: bool, geo: &Geometry) -> bool {
    zero_copy && !geo.keys_apart
}

/// A table's bind group layout, a batch's, and the batch kernels.
type EnginePipelines =
    ((wgpu::BindGroupLayout, Vec<Binding>), (wgpu::BindGroupLayout, Vec<Binding>), Pipelines<Kernel>);

impl GpuEngine {
    /// Binds the pool's table and heap regions (imported, or copied to the device) and builds
    /// the kernels; reads check their value's checksum when `verify_values`. Its allocator is
    /// set by [`GpuEngine::set_allocator`] before its first batch. `imported`: the table and
    /// heap regions, already imported (by a growth's build), which it takes over.
    pub(crate) fn new(
        gpu: Arc<Gpu>,
        cfg_base: (crate::layout::Geometry, crate::hash::Seeds),
        mut pool: PoolRef,
        [table_region, heap_region]: [Region; 2],
        opts: &GpuOptions,
        verify_values: bool,
        imported: Option<ImportedRegions>,
    ) -> Result<Self> {
        let (geo, seeds) = cfg_base;
        let mut cfg = Self::base_config(&gpu, (geo, seeds), opts, verify_values)?;
        let max_window = max_window(&gpu.info, opts.max_window_bytes);
        let mut laps = Laps::start("engine");
        let scopes = ErrorScopes::push(&gpu.device);
        let persist = pool.mapping().persist_mode();
        let mut placed = Placed::new(
            &gpu,
            PoolWindows::place(
                &gpu,
                pool,
                opts.placement.into(),
                [
                    (table_region, cfg.table, geo.table_words(), "table"),
                    (heap_region, cfg.heap, geo.heap_words(), "heap"),
                ],
                if opts.large_pool_mode { LARGE_POOL_MODE_LINE_SHIFT } else { 0 },
                imported,
            )?,
        );
        let windows = placed.0.as_ref().expect("placed");
        laps.lap("windows");
        let cached = has_cache(windows.residence == Residence::ZeroCopy, &geo);
        let cache = DeviceCache::new(&gpu, &geo, &opts.cache, cached, max_window)?;
        laps.lap("cache");
        cfg.cache = cache.config();
        cfg.settle_reach(&gpu.info, opts.large_pool_mode)?;
        let dev = &gpu.device;
        // Filled by `set_allocator`.
        let bitmap_words = cfg.bitmap_words() as usize;
        let bitmap_buf: Vec<wgpu::Buffer> = (0..cfg.bitmap.count)
            .map(|i| storage_buffer(dev, "bitmap", cfg.bitmap.len(i, bitmap_words as u64) * 4))
            .collect();
        let allocator_words = Bitmap::summary_words(bitmap_words) + geo.arenas() as usize;
        let allocator_buf = storage_buffer(dev, "allocator", allocator_words as u64 * 4);
        let control_buf = storage_buffer(dev, "control", (control::WORDS * 4) as u64);
        laps.lap("allocator");
        let (layout, batch_layout, pipelines) = Self::pipelines(&gpu, &cfg)?;
        laps.lap("pipelines");
        let track_lines = windows.tracks_lines(persist);
        // A submit runs each batch kernel at most once.
        let timer = if opts.time_kernels { PassTimer::new(&gpu, Kernel::BATCH.len() as u32)? } else { None };
        let max_batch = largest_batch(&geo, staged_line(windows), timestamp_bytes(&timer), &gpu.info)?;
        // Only host batches in host memory are recorded with Vulkan itself, untimed, over a
        // pool that needs no write-back; without these kernels every submit is wgpu's.
        // A device that cannot make them leaves every submit to wgpu.
        let (direct, mut submits) = (gpu.info.host_import && timer.is_none() && !windows.staged())
            .then(|| -> gphash_gpu::Result<_> {
                let pipelines = Self::direct_pipelines(&gpu, &cfg, [&layout.1, &batch_layout.1])?;
                let submits = (0..SLOTS)
                    .map(|_| Ok([DirectSubmit::new(&gpu)?, DirectSubmit::new(&gpu)?]))
                    .collect::<gphash_gpu::Result<Vec<_>>>()?;
                Ok((pipelines, submits))
            })
            .and_then(|made| made.map_err(|e| log::warn!("every submit goes through wgpu: {e}")).ok())
            .map_or((None, vec![]), |(p, s)| (Some(p), s));
        laps.lap("direct");
        gpu.submit([]);
        scopes.pop(|| "creating the engine".into())?;
        laps.lap("rest");
        let windows = placed.0.take().expect("placed");
        drop(placed);
        let ops_in_host_memory = gpu.info.host_import;
        Ok(GpuEngine {
            gpu,
            cfg,
            windows,
            cache,
            bitmap: bitmap_buf,
            allocator: allocator_buf,
            control: control_buf,
            layout,
            batch_layout,
            pipelines,
            slots: std::array::from_fn(|_| Slot { direct: submits.pop(), ..Default::default() }),
            max_batch,
            track_lines,
            ops_in_host_memory,
            batches: 0,
            fills: 0,
            busy: Duration::ZERO,
            profile: Profile::default(),
            timer,
            direct,
            #[cfg(feature = "testing")]
            first_cell: opts.first_cell,
        })
    }

    /// The kernels' configuration for a table of `geo`, without a cache.
    fn base_config(
        gpu: &Gpu,
        (geo, seeds): (Geometry, crate::hash::Seeds),
        opts: &GpuOptions,
        verify_values: bool,
    ) -> Result<KernelConfig> {
        // A lane keeps one bit per pass over the candidates: at most 32 passes.
        if !opts.tile.is_power_of_two() || opts.tile > 32 || opts.tile * 32 < geo.layout.candidates() {
            return Err(Error::InvalidConfig(format!(
                "tile of {} lanes: must be a power of two up to 32, and at least {} for {} candidate slots",
                opts.tile,
                geo.layout.candidates().div_ceil(32),
                geo.layout.candidates()
            )));
        }
        let [table, heap] = Self::windows(&gpu.info, opts, &geo);
        let bitmap = Windows::cover(geo.cells.div_ceil(32), max_window(&gpu.info, opts.max_window_bytes));
        let mut cfg = KernelConfig {
            table,
            heap,
            bitmap,
            geo,
            seeds,
            tile: opts.tile,
            cache: CacheConfig::off(),
            source: None,
            verify_values,
            reach: Reach::default(),
        };
        cfg.settle_reach(&gpu.info, opts.large_pool_mode)?;
        Ok(cfg)
    }

    /// How the engine of a table of `geo` splits its table and heap regions into windows (a
    /// growth's build imports the grown regions the same way, to hand them on).
    pub(crate) fn windows(info: &DeviceInfo, opts: &GpuOptions, geo: &Geometry) -> [Windows; 2] {
        let max_window = max_window(info, opts.max_window_bytes);
        [Windows::cover(geo.table_words(), max_window), Windows::cover(geo.heap_words(), max_window)]
    }

    /// The table's bind group layout, the batch's, and the batch kernels compiled for `cfg`.
    fn pipelines(gpu: &Gpu, cfg: &KernelConfig) -> Result<EnginePipelines> {
        let dev = &gpu.device;
        let bindings = cfg.bindings();
        let layout = (bind_group_layout(dev, "gphash", &bindings), bindings);
        let batch_layout = batch_layout(dev);
        let layouts = [&layout.0, &batch_layout.0];
        let pipelines =
            build_pipelines(gpu, (&layouts, Params::BYTES), &Kernel::BATCH, |k| shader::source(k, cfg))?;
        Ok((layout, batch_layout, pipelines))
    }

    /// The kernels of `cfg` that submits recorded with Vulkan itself run ([`direct_kernel`]),
    /// with the table's bindings and the batch's (`groups`).
    fn direct_pipelines(
        gpu: &Arc<Gpu>,
        cfg: &KernelConfig,
        groups: [&[Binding]; 2],
    ) -> gphash_gpu::Result<DirectPipelines<Kernel>> {
        let kernels: Vec<Kernel> = Kernel::BATCH.into_iter().filter(|&k| direct_kernel(k)).collect();
        let source = |k| shader::source(k, cfg).map_err(|e| gphash_gpu::Error::Shader(e.to_string()));
        DirectPipelines::build(gpu, (&groups, Params::BYTES), &kernels, source)
    }

    /// Compiles, and drops, the kernels an engine for a table of `geo` would compile, with
    /// the cache it would plan for a pool imported in place (`zero_copy`) or not, once `freed`
    /// bytes of device memory more are free: the driver keeps what it compiled, so the engine
    /// made later for that table starts without compiling (a growth's, made after the build).
    /// The kernels for submits recorded with Vulkan itself too, where that engine would have
    /// them (a pool imported in place, untimed kernels).
    pub(crate) fn warm(
        gpu: &Arc<Gpu>,
        table: (Geometry, crate::hash::Seeds),
        placed: (bool, u64),
        opts: &GpuOptions,
        verify_values: bool,
    ) -> Result<()> {
        let cfg = Self::planned_config(gpu, table, placed, opts, verify_values)?;
        let (layout, batch_layout, _) = Self::pipelines(gpu, &cfg)?;
        if placed.0 && gpu.info.host_import && !opts.time_kernels {
            Self::direct_pipelines(gpu, &cfg, [&layout.1, &batch_layout.1])?;
        }
        Ok(())
    }

    /// The kernels' configuration [`GpuEngine::warm`] compiles.
    pub(crate) fn planned_config(
        gpu: &Gpu,
        (geo, seeds): (Geometry, crate::hash::Seeds),
        (zero_copy, freed): (bool, u64),
        opts: &GpuOptions,
        verify_values: bool,
    ) -> Result<KernelConfig> {
        let mut cfg = Self::base_config(gpu, (geo, seeds), opts, verify_values)?;
        let max_window = max_window(&gpu.info, opts.max_window_bytes);
        cfg.cache =
            DeviceCache::planned(gpu, &geo, &opts.cache, (has_cache(zero_copy, &geo), freed), max_window)?;
        cfg.settle_reach(&gpu.info, opts.large_pool_mode)?;
        Ok(cfg)
    }

    /// Makes `bitmap` the value-cell allocator (of the size the engine was made for): the
    /// allocator as it stands when the engine takes over from another.
    /// A write the device refused is an error: the engine must not run with any other
    /// allocator (a cell it took for free could be another key's).
    pub(crate) fn set_allocator(&mut self, bitmap: &Bitmap) -> Result<()> {
        assert_eq!(bitmap.words.len(), self.cfg.bitmap_words() as usize, "a bitmap of another heap");
        let allocator = bitmap.allocator_words();
        #[cfg(feature = "testing")]
        let allocator = match self.first_cell {
            // The cursors (cells of each arena) are the last words: each starts as far into
            // its arena as `cell` is into the heap.
            Some(cell) => {
                let arenas = self.cfg.geo.arenas() as usize;
                let local = (cell >> self.cfg.geo.arena_bits) as u32;
                [&allocator[..allocator.len() - arenas], &vec![local; arenas]].concat()
            }
            None => allocator,
        };
        let q = &self.gpu.queue;
        scoped(&self.gpu.device, "writing the value-cell allocator", || {
            let per_window = self.cfg.bitmap.words() as usize;
            for (window, words) in self.bitmap.iter().zip(bitmap.words.chunks(per_window)) {
                q.write_buffer(window, 0, bytemuck::cast_slice(words));
            }
            q.write_buffer(&self.allocator, 0, bytemuck::cast_slice(&allocator));
            // wgpu copies queue writes at its next submit: submitted now, so that a submit
            // recorded with Vulkan itself, which wgpu does not see, finds them done.
            self.gpu.submit([]);
        })
        .map_err(Error::from)
    }

    /// Makes sure the batch buffers of `slot` hold `n` operations (at most `max_batch`).
    fn reserve(&mut self, slot: usize, n: u32) -> Result<()> {
        // The slot's last tail reads its input: it ends before the input is written or its
        // buffers replaced.
        match self.slots[slot].tail.take() {
            Some(Tail::Wgpu { submission, done }) => self.gpu.wait_flag(&done, &submission)?,
            Some(Tail::Direct) => self.slots[slot].direct.as_mut().expect("a direct tail ran")[1].wait()?,
            None => {}
        }
        if self.slots[slot].io.as_ref().is_some_and(|io| io.cap >= n) {
            return Ok(());
        }
        let cap = n.next_power_of_two().max(256).min(self.max_batch);
        let sizes = self.batch_sizes(cap);
        let scopes = ErrorScopes::push(&self.gpu.device);
        let dev = &self.gpu.device;
        let [.., opstate, dirty, staging, claims] = sizes.bound;
        let [opstate, dirty, staging, claims] =
            [opstate, dirty, staging, claims].map(|(label, bytes)| storage_buffer(dev, label, bytes));
        let readback = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: sizes.readback.total,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let bind = self.bind_group([&opstate, &dirty, &staging, &claims]);
        scopes.pop(|| format!("the buffers of a batch of {cap} operations"))?;
        let work = [&opstate, &dirty, &staging, &claims];
        let direct = self.direct_set(|p| p.set(0, &self.layout.1, self.table_resources(work)));
        // The operation buffers do not depend on the others: they are kept.
        let old = self.slots[slot].io.take();
        let (device_ops, host_ops) = old.map_or((None, None), |io| (io.device_ops, io.host_ops));
        self.slots[slot].io = Some(BatchBuffers {
            cap,
            dirty_cap: sizes.dirty_cap,
            layout: sizes.readback,
            device_ops,
            host_ops,
            dirty,
            staging,
            claims,
            readback,
            bind,
            wgpu_used: false,
            direct,
        });
        Ok(())
    }

    /// The sizes of the buffers of a batch of `cap` operations.
    fn batch_sizes(&self, cap: u32) -> BatchSizes {
        BatchSizes::new(cap as u64, &self.cfg.geo, staged_line(&self.windows), timestamp_bytes(&self.timer))
    }

    /// Makes sure `slot` (reserved for `n`) has operation buffers for a host batch of `n`: in
    /// host memory up to [`HOST_OPS_MAX`] where the driver imports it, device buffers
    /// otherwise. Says which.
    fn reserve_ops(&mut self, slot: usize, n: u32) -> Result<bool> {
        let host = n <= HOST_OPS_MAX && self.ops_in_host_memory;
        let io = self.slots[slot].io.as_ref().expect("reserved");
        let held =
            if host { io.host_ops.as_ref().map(|o| o.cap) } else { io.device_ops.as_ref().map(|o| o.cap) };
        if held.is_some_and(|cap| cap >= n) {
            return Ok(host);
        }
        let cap = n.next_power_of_two().max(256).min(if host { HOST_OPS_MAX } else { self.max_batch });
        let [kinds, keys, vals_in, statuses, vals_out, ..] = self.batch_sizes(cap).bound;
        let sizes = [kinds, keys, vals_in, statuses, vals_out];
        let scopes = ErrorScopes::push(&self.gpu.device);
        if host {
            match HostOps::new(&self.gpu, sizes.map(|(_, bytes)| bytes)) {
                Ok(buffers) => {
                    let bound = || std::array::from_fn::<_, 5, _>(|i| buffers.binding(i, sizes[i].1));
                    let bind = self.batch_bind_group(bound());
                    let direct = self.direct_set(|p| p.set(1, &self.batch_layout.1, bound()));
                    let s = &mut self.slots[slot];
                    // Results in the memory replaced are gone with it.
                    s.in_host = None;
                    s.io.as_mut().expect("reserved").host_ops = Some(Ops { cap, buffers, bind, direct });
                }
                Err(why) => {
                    log::warn!("batches' operations stay in device buffers: {why}");
                    self.ops_in_host_memory = false;
                    scopes.pop(|| "importing host memory for a batch".into())?;
                    return self.reserve_ops(slot, n);
                }
            }
        } else {
            let dev = &self.gpu.device;
            let buffers = sizes.map(|(label, bytes)| storage_buffer(dev, label, bytes));
            let bind = self.batch_bind_group(buffers.each_ref().map(wgpu::Buffer::as_entire_binding));
            let io = self.slots[slot].io.as_mut().expect("reserved");
            io.device_ops = Some(Ops { cap, buffers, bind, direct: None });
        }
        scopes.pop(|| format!("the operation buffers of a batch of {cap}"))?;
        Ok(host)
    }

    /// The table's bind group with a slot's working buffers (`opstate`, `dirty`, `staging`,
    /// `claims`).
    fn bind_group(&self, work: [&wgpu::Buffer; 4]) -> wgpu::BindGroup {
        bind_group(&self.gpu.device, "gphash", (&self.layout.0, &self.layout.1), self.table_resources(work))
    }

    /// A descriptor set `make` makes for submits recorded with Vulkan itself, where the engine
    /// records them; a set the device refuses leaves the batches it would bind to wgpu.
    fn direct_set(
        &self,
        make: impl FnOnce(&DirectPipelines<Kernel>) -> gphash_gpu::Result<DirectSet>,
    ) -> Option<DirectSet> {
        let made = make(self.direct.as_ref()?);
        made.map_err(|e| log::warn!("these buffers' submits go through wgpu: {e}")).ok()
    }

    /// What the table's bind group binds, with a slot's working buffers.
    fn table_resources<'a>(
        &'a self,
        work: [&'a wgpu::Buffer; 4],
    ) -> impl Iterator<Item = wgpu::BindingResource<'a>> {
        let [opstate, dirty, staging, claims] = work;
        let c = &self.cache;
        [opstate, &self.control, dirty, &self.allocator, staging, claims]
            .into_iter()
            .chain([&c.map, &c.owner, &c.counts, &c.plan])
            .chain(self.windows.buffers().chain(&c.table).chain(&c.heap).chain(&self.bitmap))
            .map(wgpu::Buffer::as_entire_binding)
    }

    /// The batch bind group of a batch's operation buffers (`kinds`, `keys`, `vals_in`,
    /// `statuses`, `vals_out`).
    fn batch_bind_group(&self, io: [wgpu::BindingResource; 5]) -> wgpu::BindGroup {
        bind_group(&self.gpu.device, "batch", (&self.batch_layout.0, &self.batch_layout.1), io)
    }

    /// The parameters of a submit for the batch of `n` in `slot`.
    fn params(&mut self, slot: usize, n: u32) -> Params {
        let io = self.slots[slot].io.as_ref().expect("reserved");
        let (table_line_base, heap_line_base, table_lines) = self.windows.lines();
        let (tile, spread) = self.phase_a_lanes(n);
        Params {
            n,
            dirty_cap: io.dirty_cap,
            table_line_base,
            heap_line_base,
            table_lines,
            line_words: self.windows.line_words(),
            claims_mask: (io.claims.size() / 4 - 1) as u32,
            track_lines: self.track_lines as u32,
            stamp: self.batches,
            count_every: self.cache.count_every(),
            spread,
            tile,
        }
    }

    /// Records and submits `kernels` for the batch in `slot` without waiting (`collect` waits).
    fn submit(&mut self, slot: usize, kernels: &[Kernel], results: Results) -> Result<()> {
        if self.direct_serves(slot, kernels) {
            return self.submit_direct(slot, (kernels, &[]), results);
        }
        let recorded = self.record(slot, (kernels, &[]), results)?;
        self.launch(slot, recorded)
    }

    /// Whether the submit of `kernels` for the batch in `slot` is recorded with Vulkan itself:
    /// the engine has the kernels for it, the batch's operations and results are in host memory
    /// (no copy to map, nothing written through wgpu's queue), the kernels are among
    /// [`direct_kernel`], and a submit through wgpu has bound the slot's buffers (see
    /// [`BatchBuffers::wgpu_used`]). Timed engines and staged pools have no such kernels.
    fn direct_serves(&self, slot: usize, kernels: &[Kernel]) -> bool {
        let s = &self.slots[slot];
        let sets = |io: &BatchBuffers| {
            io.direct.is_some() && io.host_ops.as_ref().is_some_and(|h| h.direct.is_some())
        };
        self.direct.is_some()
            && s.host
            && !s.device
            && s.io.as_ref().is_some_and(|io| io.wgpu_used && sets(io))
            && kernels.iter().all(|&k| direct_kernel(k))
    }

    /// Records `kernels` for the batch in `slot` with Vulkan itself, then the copy of the
    /// control block into the batch's host memory (the kernels wrote its results there), and
    /// submits them; then `tail` in a submit of its own that the host does not wait for (see
    /// [`GpuEngine::closing`]). What wgpu's submits order with barriers of their own, each
    /// command here orders with one after it. `results`: what the host reads of the batch's
    /// results, in place.
    fn submit_direct(
        &mut self,
        slot: usize,
        (kernels, tail): (&[Kernel], &[Kernel]),
        results: Results,
    ) -> Result<()> {
        let started = Instant::now();
        let n = self.slots[slot].n;
        let params = self.params(slot, n);
        let written = Instant::now();
        let pipelines = self.direct.as_ref().expect("direct kernels");
        let invocations: Vec<u64> = kernels.iter().chain(tail).map(|&k| self.invocations(k, n)).collect();
        let s = &mut self.slots[slot];
        let io = s.io.as_ref().expect("reserved");
        let host = io.host_ops.as_ref().expect("a batch in host memory");
        let sets =
            [io.direct.as_ref().expect("made with its buffers"), host.direct.as_ref().expect("likewise")];
        let [main, after] = s.direct.as_mut().expect("made with the engine's direct kernels");
        let immediates = bytemuck::bytes_of(&params);
        // Its last results are no longer there to read: this submit may write them.
        s.in_host = None;
        let rec = main.record(pipelines)?;
        // Gets never register in the claim registry.
        if kernels.contains(&Kernel::PhaseA) {
            rec.clear(&io.claims)?;
        }
        rec.bind(&sets, immediates);
        for (&k, &i) in kernels.iter().zip(&invocations) {
            rec.dispatch(pipelines, k, i);
        }
        let control_bytes = (control::WORDS * 4) as u64;
        rec.copy(
            (&self.control, 0),
            (host.buffers.outputs.buffer(), host.buffers.at[0] as u64),
            control_bytes,
        )?;
        // Cleared once copied, as `record` clears it.
        rec.clear(&self.control)?;
        let recorded = Instant::now();
        rec.submit()?;
        if !tail.is_empty() {
            let rec = after.record(pipelines)?;
            rec.bind(&sets, immediates);
            for (&k, &i) in tail.iter().zip(&invocations[kernels.len()..]) {
                rec.dispatch(pipelines, k, i);
            }
            rec.submit()?;
            s.tail = Some(Tail::Direct);
        }
        let submitted = Instant::now();
        let p = &mut self.profile;
        p.writes += written - started;
        p.record += recorded - written;
        p.submit += submitted - recorded;
        p.vulkan_submits += 1 + u64::from(!tail.is_empty());
        let kernels = kernels.to_vec();
        let (completion, passes, writeback) = (Completion::Direct, 0, false);
        s.running = Some(Running { completion, kernels, results, passes, writeback, submitted });
        Ok(())
    }

    /// Records `kernels` for the batch in `slot` (the dispatches of one compute pass, a pass
    /// each when timed: wgpu orders them with barriers; the parameters are immediates), the
    /// write-back gather in staged mode, and the copies of the control block and, when asked,
    /// the results; then `tail`, untimed, in a command buffer of its own that copies nothing.
    fn record(
        &mut self,
        slot: usize,
        (kernels, tail): (&[Kernel], &[Kernel]),
        results: Results,
    ) -> Result<Recorded> {
        let scopes = ErrorScopes::push(&self.gpu.device);
        let started = Instant::now();
        let n = self.slots[slot].n;
        let params = self.params(slot, n);
        let written = Instant::now();
        let s = &self.slots[slot];
        let io = s.io.as_ref().expect("reserved");
        let dev = &self.gpu.device;
        let mut enc = dev.create_command_encoder(&Default::default());
        // Gets never register in the claim registry: a batch of them runs `Search`.
        if kernels.contains(&Kernel::PhaseA) {
            enc.clear_buffer(&io.claims, 0, None);
        }
        let in_host = s.host && !s.device;
        let batch_bind = match &s.device_bind {
            Some(d) if s.device => &d.group,
            _ if in_host => &io.host_ops.as_ref().expect("reserved").bind,
            _ => &io.device_ops.as_ref().expect("reserved").bind,
        };
        // A batch of gets (`Search`) claims nothing: nothing to write back.
        let writes = kernels.iter().any(|k| k.writes_pool());
        let writeback = (self.windows.staged() && writes)
            .then(|| (self.pipelines.get(Kernel::Writeback), writeback_invocations(io.dirty_cap)));
        let timer = self.timer.as_ref();
        let passes = record_passes(
            &mut enc,
            (&[&io.bind, batch_bind], bytemuck::bytes_of(&params)),
            kernels.iter().map(|&k| (self.pipelines.get(k), self.invocations(k, n))).chain(writeback),
            timer,
        );
        let rl = io.layout;
        if let Some(timer) = timer {
            timer.resolve(&mut enc, passes, &io.readback, rl.timestamps);
        }
        let vw = self.cfg.geo.value_words() as u64;
        let control_bytes = (control::WORDS * 4) as u64;
        if in_host {
            // The kernels wrote the results in place.
            let host = &io.host_ops.as_ref().expect("reserved").buffers;
            enc.copy_buffer_to_buffer(
                &self.control,
                0,
                host.outputs.buffer(),
                host.at[0] as u64,
                control_bytes,
            );
        } else {
            enc.copy_buffer_to_buffer(&self.control, 0, &io.readback, 0, control_bytes);
            if results != Results::None && n > 0 {
                // Only host batches ask for results: theirs are in `device_ops`.
                let [.., statuses, vals_out] =
                    &io.device_ops.as_ref().expect("a host batch's operations").buffers;
                enc.copy_buffer_to_buffer(statuses, 0, &io.readback, rl.statuses, n as u64 * 4);
                if results == Results::WithValues {
                    enc.copy_buffer_to_buffer(vals_out, 0, &io.readback, rl.values, n as u64 * vw * 4);
                }
            }
        }
        // Cleared on the GPU once copied (a queue write would stage a buffer of its own), so
        // that the next submit's control block starts at zero but for what a tail between
        // them counts.
        enc.clear_buffer(&self.control, 0, None);
        let mut cmds = vec![enc.finish()];
        // The host reads what the kernels wrote into the pool (persists, recovery) and into
        // host memory of the batch's own; a submit that writes neither (a batch of gets in
        // device buffers) needs no barrier, and each one that writes has its own.
        if in_host || (!self.windows.staged() && writes) {
            cmds.push(hostmem::host_read_barrier(&self.gpu));
        }
        let tail = (!tail.is_empty()).then(|| {
            debug_assert!(tail.iter().all(|k| !k.writes_pool()), "the host persists what it waited for");
            let mut enc = dev.create_command_encoder(&Default::default());
            let passes = tail.iter().map(|&k| (self.pipelines.get(k), self.invocations(k, n)));
            record_passes(&mut enc, (&[&io.bind, batch_bind], bytemuck::bytes_of(&params)), passes, None);
            // Barriers of its own, before and after: no wait of the host orders it.
            let barrier = || hostmem::compute_barrier(&self.gpu);
            (tail.to_vec(), vec![barrier(), enc.finish(), barrier()])
        });
        scopes.pop(|| {
            format!(
                "recording {kernels:?} then {tail:?} for {n} operations",
                tail = tail.as_ref().map(|t| &t.0)
            )
        })?;
        let p = &mut self.profile;
        p.writes += written - started;
        p.record += written.elapsed();
        let (kernels, writeback) = (kernels.to_vec(), writeback.is_some());
        Ok(Recorded { kernels, results, cmds, tail, passes, writeback, in_host })
    }

    /// Submits what was recorded for the batch in `slot`, without waiting.
    fn launch(&mut self, slot: usize, recorded: Recorded) -> Result<()> {
        let Recorded { kernels, results, cmds, tail, passes, writeback, in_host } = recorded;
        // The slot's last results are no longer there to read: this submit may write them.
        self.slots[slot].in_host = None;
        let scopes = ErrorScopes::push(&self.gpu.device);
        let started = Instant::now();
        let submission = self.gpu.submit(cmds);
        // Nothing is mapped to say when host-memory results are there: the queue says (a
        // callback registered now waits for the submits so far, not for the tail after).
        let done = in_host.then(|| self.gpu.work_done_flag());
        // An invalid submit (a buffer beyond a device limit, say) ran nothing: its results are
        // garbage and must not be read, and its tail is not submitted.
        let n = self.slots[slot].n;
        scopes.pop(|| format!("submitting {kernels:?} for {n} operations"))?;
        self.slots[slot].io.as_mut().expect("reserved").wgpu_used = true;
        self.profile.wgpu_submits += 1 + u64::from(tail.is_some());
        if let Some((tail_kernels, cmds)) = tail {
            // Phase B ran: a tail that did not would leave the cache stale, so its failure is
            // the batch's (the index is poisoned and collects nothing).
            let scopes = ErrorScopes::push(&self.gpu.device);
            let submission = self.gpu.submit(cmds);
            let done = self.gpu.work_done_flag();
            scopes.pop(|| format!("submitting {tail_kernels:?} for {n} operations"))?;
            self.slots[slot].tail = Some(Tail::Wgpu { submission, done });
        }
        // The profile's wait starts once both are submitted (the tail's submit is `submit`'s).
        let submitted = Instant::now();
        self.profile.submit += submitted - started;
        let completion = match done {
            Some(done) => Completion::Flagged(submission, done),
            None => Completion::Mapped(submission),
        };
        self.slots[slot].running =
            Some(Running { completion, kernels, results, passes, writeback, submitted });
        Ok(())
    }

    /// Waits for the submit running for `slot` (not for later ones), takes its results and
    /// returns its control block.
    fn collect_control(&mut self, slot: usize) -> Result<Control> {
        let s = &mut self.slots[slot];
        let r = s.running.take().expect("a submit runs for the slot");
        let n = s.n;
        let io = s.io.as_ref().expect("reserved");
        let rl = io.layout;
        let vw = self.cfg.geo.value_words() as u64;
        let mut ctl = Control::default();
        let (statuses, values) = (&mut s.statuses, &mut s.values);
        let end = match r.results {
            Results::None => rl.statuses,
            Results::Statuses => rl.values,
            Results::WithValues => rl.lines,
        };
        let mut mapped = r.submitted;
        let timer = self.timer.as_ref();
        let mut times = None;
        // The byte ranges of the statuses and values at `s` and `v`, empty where not asked for
        // (and then not read back: they may lie past what is).
        let ranges = |[s, v]: [usize; 2]| {
            let range = |on: bool, at: usize, len: usize| if on { at..at + len } else { 0..0 };
            let value_bytes = (n as u64 * vw * 4) as usize;
            [
                range(r.results != Results::None, s, n as usize * 4),
                range(r.results == Results::WithValues, v, value_bytes),
            ]
        };
        let stamps = rl.timestamps as usize..rl.statuses as usize;
        // Whether the results are in the batch's host memory, where the kernels wrote them.
        let in_host = match &r.completion {
            Completion::Mapped(submission) => {
                map_read_after(&self.gpu, Some(submission.clone()), &io.readback, 0..end, |bytes| {
                    mapped = Instant::now();
                    times = timer.map(|t| t.times(&bytes[stamps], r.passes));
                    ctl.copy_from_slice(bytemuck::cast_slice(&bytes[..control::WORDS * 4]));
                    // Refilled in place: the vectors keep their allocations from batch to batch.
                    let [s, v] = ranges([rl.statuses as usize, rl.values as usize]);
                    crate::bulk::refill(statuses, &bytes[s]);
                    crate::bulk::refill(values, &bytes[v]);
                })?;
                false
            }
            Completion::Flagged(submission, done) => {
                self.gpu.wait_flag(done, submission)?;
                mapped = Instant::now();
                if let Some(t) = timer {
                    let range = stamps.start as u64..stamps.end as u64;
                    map_read_after(&self.gpu, Some(submission.clone()), &io.readback, range, |bytes| {
                        times = Some(t.times(bytes, r.passes))
                    })?;
                }
                true
            }
            Completion::Direct => {
                s.direct.as_mut().expect("a direct submit ran")[0].wait()?;
                mapped = Instant::now();
                true
            }
        };
        if in_host {
            let host = &io.host_ops.as_ref().expect("a batch in host memory").buffers;
            // SAFETY: the slot's submit ended (waited for above), behind the host-read barrier,
            // and no other submit uses its host memory.
            let bytes = unsafe { host.outputs.bytes() };
            ctl.copy_from_slice(bytemuck::cast_slice(&bytes[host.at[0]..host.at[0] + control::WORDS * 4]));
            self.slots[slot].in_host = Some(ranges([host.at[4], host.at[5]]));
        }
        let done = Instant::now();
        let p = &mut self.profile;
        p.wait += mapped - r.submitted;
        p.readback += done - mapped;
        if let Some(times) = times {
            // The passes in the order recorded: the kernels, then the write-back's gather.
            let timed = r.kernels.iter().copied().chain(r.writeback.then_some(Kernel::Writeback));
            for (k, t) in timed.zip(times.passes) {
                if let Some(i) = k.batch_index() {
                    p.kernels.times[i] += t;
                }
            }
            p.kernels.span += times.span;
            p.kernels.submits += 1;
        }
        log::debug!("{:?} n={n}: wait {:?}, read back {:?}", r.kernels, mapped - r.submitted, done - mapped);
        Ok(ctl)
    }

    /// The lines the last phase of `slot` wrote; in staged mode their contents are copied into
    /// the pool mapping first.
    fn written(&mut self, pool: &mut Pool, slot: usize, ctl: &Control) -> Result<Written> {
        let io = self.slots[slot].io.as_ref().expect("reserved");
        let count = ctl[control::DIRTY_COUNT];
        if !self.track_lines {
            return Ok(Written::NotTracked);
        }
        if count > io.dirty_cap {
            if self.windows.staged() {
                self.windows.download(&self.gpu, pool)?;
            }
            return Ok(Written::Overflow);
        }
        if count == 0 {
            return Ok(Written::Lines(vec![]));
        }
        let staging = self.windows.staged().then_some(&io.staging);
        let started = Instant::now();
        let lines = read_dirty(
            &self.gpu,
            (&io.dirty, staging),
            &io.readback,
            (io.layout.lines, count),
            self.windows.line_shift,
            pool,
        );
        self.profile.lines += started.elapsed();
        Ok(Written::Lines(lines?))
    }

    /// Waits for the submit of `slot` and reports it.
    fn collect(&mut self, pool: &mut Pool, slot: usize) -> Result<Report> {
        let control = self.collect_control(slot)?;
        self.cache.record(&control);
        let written = self.written(pool, slot, &control)?;
        Ok(Report { control, written })
    }

    /// The cache's work to run with the next submit: a slice of its loading phase (`whole`: the
    /// rest of the phase), starting the phase when none is in progress (hot groups chosen from
    /// the counts read now; LFU counts then halve).
    fn cache_kernels(&mut self, whole: bool) -> Result<Vec<Kernel>> {
        let mut kernels = vec![];
        if !self.cache.loading() {
            let started = Instant::now();
            let counts =
                if self.cache.counts_accesses() { self.cache.download_counts(&self.gpu)? } else { vec![] };
            self.cache.start_load(&counts, started.elapsed(), whole);
            if self.cfg.cache.count_mode == crate::cache::Policy::Lfu.count_mode() {
                kernels.push(Kernel::CacheDecay);
            }
        }
        self.fills = self.cache.next_slice(&self.gpu, whole);
        if self.fills > 0 {
            kernels.push(Kernel::CacheFill);
        }
        Ok(kernels)
    }

    /// Invocations of kernel `k` in a submit for a batch of `n`.
    fn invocations(&self, k: Kernel, n: u32) -> u64 {
        match k {
            Kernel::CacheFill => self.fills as u64 * self.cfg.tile as u64,
            Kernel::Alloc | Kernel::PhaseA => n as u64 * self.phase_a_lanes(n).1 as u64,
            Kernel::Search => {
                let all = n as u64 * self.phase_a_lanes(n).1 as u64;
                // Only a batch larger than the cap runs one invocation per operation (spread 1),
                // the kernel's condition for several operations a lane.
                if self.searches_host_memory() && n as u64 > HOST_SEARCH_INVOCATIONS {
                    all.min(HOST_SEARCH_INVOCATIONS)
                } else {
                    all
                }
            }
            Kernel::CacheDecay => self.cfg.geo.groups(),
            _ => n as u64,
        }
    }

    /// Whether searches read the table in host memory over the bus: zero-copy, not every group
    /// cached.
    fn searches_host_memory(&self) -> bool {
        self.windows.residence == Residence::ZeroCopy
            && u64::from(self.cache.config().entries) < self.cfg.geo.groups()
    }

    /// Phase A's tile width and invocations per operation for a batch of `n`. The dispatch
    /// gets about [`SPREAD_INVOCATIONS`] invocations (a tile serves the operations of its lanes
    /// one at a time, so a small batch with one operation per lane leaves most of the GPU
    /// idle): `want` per operation. Tiles are `want` lanes wide, at least [`NARROWEST_TILE`]
    /// and at most the configured tile and the subgroup: a small batch gets one wide tile per
    /// operation (its probe reads every candidate at once), a large one narrow tiles serving
    /// their lanes' operations in turns (more operations' reads in flight per subgroup, which
    /// lifts large batches: docs/lab/kernels.md, "Phase A's tile width chosen per batch"). The
    /// spread is `want`, at most the tile (one operation per tile), at least 1 (one operation
    /// per lane).
    fn phase_a_lanes(&self, n: u32) -> (u32, u32) {
        let want = (SPREAD_INVOCATIONS / n.max(1) as u64).max(1).next_power_of_two() as u32;
        let widest = self.cfg.tile.min(self.gpu.info.subgroup_sizes.1.max(1));
        let tile = want.max(NARROWEST_TILE).min(widest);
        (tile, want.min(tile))
    }

    /// The kernels that end a batch: phase B (when `publish`) or a rollback, the release of
    /// cells, and the write-through of changed slots to the cache; and which of them are its
    /// tail, submitted after the rest and not waited for.
    ///
    /// The tail of a host batch's phase B is the release of its cells and the cache's
    /// write-through: they write neither the pool nor the results, and the queue runs them
    /// before any later batch, so the host persists phase B and answers without them (a write
    /// batch's wait falls by more than its submit grows: docs/lab/host-path.md, "Phase B's
    /// tail"). Kernels that are timed
    /// stay in one submit, and so do a device batch's, whose input its owner may rewrite once
    /// the call returns (the write-through reads the input), and those of a pool whose dirty
    /// lines the host reads back to persist them: that read is queued after the tail, so it
    /// would wait for it anyway.
    fn closing(&self, phase: Phase, batch: Input) -> (Vec<Kernel>, Vec<Kernel>) {
        let (mut k, changed) = match phase {
            Phase::Rollback => (vec![Kernel::Rollback], true),
            Phase::B { publish: true } => (vec![Kernel::PhaseB, Kernel::FreeCells], true),
            Phase::B { publish: false } => (vec![Kernel::FreeCells], false),
            Phase::A => unreachable!("phase A opens a batch"),
        };
        if self.cache.enabled() && changed {
            k.push(Kernel::CacheRefresh);
        }
        let trails = matches!((phase, batch), (Phase::B { publish: true }, Input::Host(_)))
            && self.timer.is_none()
            && !self.track_lines;
        let tail = if trails { k.split_off(1) } else { vec![] };
        (k, tail)
    }

    /// Phase A of `batch` in `slot`: its input written (or its device buffers bound), a slice of
    /// the cache's loading phase when one is due, allocation and phase A submitted.
    fn start_a(&mut self, slot: usize, batch: Input) -> Result<()> {
        let n = match u32::try_from(batch.len()) {
            Ok(n) if n <= self.max_batch => n,
            _ => return Err(Error::BatchTooLarge { len: batch.len() as u64, max: self.max_batch as u64 }),
        };
        let (kw, vw) = (self.cfg.geo.key_words(), self.cfg.geo.value_words());
        if let Input::Device(d) = batch {
            d.validate(kw, vw)?;
        }
        self.reserve(slot, n)?;
        let host = match batch {
            Input::Host(_) => self.reserve_ops(slot, n)?,
            Input::Device(_) => false,
        };
        self.slots[slot].host = host;
        self.slots[slot].n = n;
        self.batches = self.batches.wrapping_add(1);
        let scopes = ErrorScopes::push(&self.gpu.device);
        let mut kernels = vec![];
        if self.cache.batch_starts(n as u64, std::mem::take(&mut self.busy)) {
            kernels = self.cache_kernels(false)?;
        }
        // A batch of gets allocates nothing and writes nothing: its lookups alone.
        kernels.extend(if batch.read_only() {
            &[Kernel::Search][..]
        } else {
            &[Kernel::Alloc, Kernel::PhaseA]
        });
        let io = self.slots[slot].io.as_mut().expect("reserved");
        let results = match batch {
            Input::Host(e) => {
                let q = &self.gpu.queue;
                let writing = Instant::now();
                match (&mut io.host_ops, &io.device_ops) {
                    (Some(ops), _) if host => ops.buffers.write(e),
                    (_, Some(Ops { buffers: [kinds, keys, vals_in, ..], .. })) => {
                        for (buffer, words) in [(kinds, &e.kinds), (keys, &e.keys), (vals_in, &e.values)] {
                            crate::bulk::write_buffer(q, buffer, bytemuck::cast_slice(words));
                        }
                    }
                    _ => unreachable!("reserve_ops made the batch's operation buffers"),
                }
                self.profile.writes += writing.elapsed();
                // A reads-only batch ends here: its results come back with phase A's control.
                if e.read_only() { Results::WithValues } else { Results::None }
            }
            Input::Device(d) => {
                if !self.slots[slot].device_bind.as_ref().is_some_and(|b| b.binds(d)) {
                    let group = self.batch_bind_group(d.bindings(kw, vw));
                    let buffers = d.buffers().map(Clone::clone);
                    self.slots[slot].device_bind = Some(DeviceBind { buffers, len: d.len, group });
                }
                Results::None
            }
        };
        self.slots[slot].device = matches!(batch, Input::Device(_));
        scopes.pop(|| format!("the input of a batch of {n} operations"))?;
        let submitted = self.submit(slot, &kernels, results);
        self.fills = 0;
        submitted?;
        // Phase B recorded while phase A runs: a write batch then waits for phase A only to
        // persist it and submit, which shortens the server's write batches of SETs
        // (docs/lab/server.md, "The server's write batches").
        let (kernels, tail) = self.closing(Phase::B { publish: true }, batch);
        // A phase B recorded with Vulkan itself is recorded when it follows, in a few µs.
        if !batch.read_only() && !self.direct_serves(slot, &[&kernels[..], &tail].concat()) {
            // Best effort: phase A runs already, so a failure here belongs to phase B, which
            // then records again when it follows and reports it.
            match self.record(slot, (&kernels, &tail), Self::results_of_b(batch)) {
                Ok(prepared) => {
                    let s = &mut self.slots[slot];
                    s.prepared = Some(prepared);
                    // The recording is counted as such, not as part of phase A's wait.
                    s.running.as_mut().expect("phase A was submitted").submitted = Instant::now();
                }
                Err(e) => log::debug!("phase B not recorded ahead: {e}"),
            }
        }
        Ok(())
    }

    /// What phase B of `batch` reads back.
    fn results_of_b(batch: Input) -> Results {
        match batch {
            Input::Host(e) if e.has_reads() => Results::WithValues,
            Input::Host(_) => Results::Statuses,
            Input::Device(_) => Results::None,
        }
    }
}

impl Engine for GpuEngine {
    fn mode(&self) -> Mode {
        self.windows.residence.clone().into()
    }

    fn max_batch(&self) -> usize {
        self.max_batch as usize
    }

    fn slots(&self) -> usize {
        SLOTS
    }

    fn start(&mut self, _pool: &mut Pool, slot: usize, phase: Phase, batch: Input) -> Result<()> {
        let started = Instant::now();
        // What was recorded ahead for this batch is used only if phase B (as recorded) follows.
        let prepared = self.slots[slot].prepared.take();
        let submitted = match phase {
            Phase::A => self.start_a(slot, batch),
            Phase::Rollback => self.submit(slot, &self.closing(phase, batch).0, Results::None),
            Phase::B { .. } => {
                let ((kernels, tail), results) = (self.closing(phase, batch), Self::results_of_b(batch));
                if self.direct_serves(slot, &[&kernels[..], &tail].concat()) {
                    self.busy += started.elapsed();
                    return self.submit_direct(slot, (&kernels, &tail), results);
                }
                let recorded_tail = |p: &Recorded| p.tail.as_ref().map_or(&[][..], |t| &t.0[..]) == &tail[..];
                match prepared {
                    Some(p) if p.kernels == kernels && recorded_tail(&p) && p.results == results => {
                        self.launch(slot, p)
                    }
                    _ => self.record(slot, (&kernels, &tail), results).and_then(|r| self.launch(slot, r)),
                }
            }
        };
        self.busy += started.elapsed();
        submitted
    }

    fn finish(&mut self, pool: &mut Pool, slot: usize) -> Result<Report> {
        let started = Instant::now();
        let report = self.collect(pool, slot);
        self.busy += started.elapsed();
        report
    }

    fn results(&self, slot: usize) -> (&[u32], &[u32]) {
        let s = &self.slots[slot];
        match (&s.in_host, s.io.as_ref().and_then(|io| io.host_ops.as_ref())) {
            (Some([statuses, values]), Some(host)) => {
                // SAFETY: `in_host` is set when the slot's last submit ended (`collect_control`
                // waited for it, behind the host-read barrier) and cleared when the next one is
                // submitted, which cannot happen while this borrow of `self` lives; the kernels
                // of its tail, which may still run, write neither.
                let bytes = unsafe { host.buffers.outputs.bytes() };
                (bytemuck::cast_slice(&bytes[statuses.clone()]), bytemuck::cast_slice(&bytes[values.clone()]))
            }
            _ => (&s.statuses, &s.values),
        }
    }

    #[cfg(test)]
    fn kernel_config(&self) -> Option<&KernelConfig> {
        Some(&self.cfg)
    }

    fn cache_status(&self) -> CacheStatus {
        match &self.windows.residence {
            _ if self.cache.enabled() => CacheStatus::On(self.cache.stats()),
            _ if self.cfg.geo.keys_apart => {
                CacheStatus::Off { reason: "keys are apart from their buckets".into() }
            }
            Residence::ZeroCopy => {
                let opts = self.cache.opts();
                let reason = if opts.ratio_on(&self.gpu.info) > 0.0 {
                    let why = self.cache.stats().limited.unwrap_or_default();
                    format!("no entry fits {why}")
                } else if opts.ratio.is_none() {
                    "the device's memory is the host's, where the pool is".into()
                } else {
                    "cache ratio 0".into()
                };
                CacheStatus::Off { reason }
            }
            _ => CacheStatus::Off { reason: "the table is in device memory already".into() },
        }
    }

    fn cache_snapshot(&mut self) -> Result<Snapshot> {
        self.cache.snapshot(&self.gpu)
    }

    fn take_profile(&mut self) -> Profile {
        std::mem::take(&mut self.profile)
    }

    fn into_imports(mut self: Box<Self>) -> Option<ImportedRegions> {
        // No batch is in flight between calls: nothing else uses the buffers handed on (a
        // batch's tail may still run, before the next engine's work on the same queue).
        self.slots = Default::default();
        self.windows.take_imported(&self.gpu)
    }

    fn cells_used(&mut self, pool: &mut Pool) -> Result<u64> {
        Ok(self.bitmap(pool)?.used(self.cfg.geo.cells))
    }

    fn bitmap(&mut self, _pool: &mut Pool) -> Result<Bitmap> {
        let total = self.cfg.bitmap_words() as u64;
        let mut words = Vec::with_capacity(total as usize);
        // A window's buffer may be longer than its words (buffers are at least 16 bytes).
        for (i, window) in (0..).zip(&self.bitmap) {
            words.extend(download_words(&self.gpu, window, self.cfg.bitmap.len(i, total))?);
        }
        Ok(Bitmap::from_words(words, self.cfg.geo.arenas()))
    }

    fn load_cache(&mut self) -> Result<()> {
        if !self.cache.enabled() {
            return Ok(());
        }
        self.reserve(0, 1)?;
        self.slots[0].n = 0;
        self.slots[0].device = false;
        self.slots[0].host = self.reserve_ops(0, 1)?;
        let kernels = self.cache_kernels(true)?;
        let started = Instant::now();
        let report = self.submit(0, &kernels, Results::None).and_then(|()| self.collect_control(0));
        self.cache.loaded_for(started.elapsed());
        self.fills = 0;
        self.cache.record(&report?);
        Ok(())
    }
}

impl Drop for GpuEngine {
    fn drop(&mut self) {
        // Imported buffers reference the pool mapping: make sure wgpu destroyed them (and the
        // GPU stopped using them) before the pool is unmapped or moved.
        self.slots = Default::default();
        self.windows.release(&self.gpu);
    }
}
