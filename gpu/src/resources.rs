//! Device resources of a table's kernels: windows of pool regions (imported or uploaded),
//! pipelines, bind group layouts, readbacks.

use std::sync::Arc;

use host_pm::{Backend, Mapping, PersistMode, Pool, Region};

use super::context::{DeviceInfo, Gpu};
use super::hostmem::{self, ImportGuard, release_imports, release_imports_to};
use super::shader::{BATCH_BUFFERS, KernelEntry, WORKGROUP, Windows};
use super::timing::PassTimer;
use crate::error::{Error, Result};
// Kept reachable here, beside the resources they guard.
pub use crate::error::{ErrorScopes, scoped};

/// Dispatches `invocations` invocations (two-dimensional beyond 65535 workgroups).
pub fn dispatch(pass: &mut wgpu::ComputePass<'_>, invocations: u64) {
    let [x, y, z] = grid(invocations);
    pass.dispatch_workgroups(x, y, z);
}

/// The workgroups of a dispatch of `invocations`: rows of at most 65,535 (the least limit of a
/// grid's dimension).
pub fn grid(invocations: u64) -> [u32; 3] {
    let groups = invocations.div_ceil(WORKGROUP as u64).max(1);
    let x = groups.min(65535);
    [x as u32, groups.div_ceil(x) as u32, 1]
}

/// Maps `range` of a MAP_READ buffer, hands the bytes to `f`, unmaps.
pub fn map_read(
    gpu: &Gpu,
    buf: &wgpu::Buffer,
    range: std::ops::Range<u64>,
    f: impl FnOnce(&[u8]),
) -> Result<()> {
    map_read_after(gpu, None, buf, range, f)
}

/// [`map_read`] of a buffer that `submission` writes (`None`: any submission so far): waits
/// for that submission only, so that later ones keep running.
pub fn map_read_after(
    gpu: &Gpu,
    submission: Option<wgpu::SubmissionIndex>,
    buf: &wgpu::Buffer,
    range: std::ops::Range<u64>,
    f: impl FnOnce(&[u8]),
) -> Result<()> {
    let slice = buf.slice(range);
    let (tx, rx) = std::sync::mpsc::channel();
    {
        // A map submits the buffer's pending queue writes, if any: a submit like any other.
        let _queue = gpu.submit_lock();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
    }
    // A small batch's work ends while the host polls; a longer one's wait sleeps in the driver.
    let mapped = match gpu.poll_until(|| rx.try_recv().ok())? {
        Some(r) => r,
        None => {
            gpu.wait_for(submission)?;
            rx.recv().map_err(|e| Error::Gpu(format!("mapping lost: {e}")))?
        }
    };
    mapped.map_err(|e| Error::Gpu(format!("mapping a readback buffer: {e}")))?;
    {
        let view =
            slice.get_mapped_range().map_err(|e| Error::Gpu(format!("reading a readback buffer: {e:?}")))?;
        f(&view);
    }
    buf.unmap();
    Ok(())
}

/// Reads the first `words` words of a storage buffer (made with `COPY_SRC`) back to the host.
pub fn download_words(gpu: &Gpu, buffer: &wgpu::Buffer, words: u64) -> Result<Vec<u32>> {
    let size = (words * 4).max(4);
    let staging = scoped(&gpu.device, "downloading a buffer", || {
        let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("download"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(buffer, 0, &staging, 0, size);
        gpu.submit([enc.finish()]);
        staging
    })?;
    let mut out = vec![];
    map_read(gpu, &staging, 0..size, |b| out = bytemuck::cast_slice(b).to_vec())?;
    Ok(out)
}

/// One binding of a kernel configuration: a storage buffer, or a binding array of them. The
/// kernels' parameters are immediates (push constants), not a binding: writing them at a
/// submit allocates nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The shaders declare it read-only.
    pub read_only: bool,
    /// A binding array of this many buffers (`None`: one buffer).
    pub array: Option<u32>,
}

impl Binding {
    /// Bindings 0 to `count - 1`, each one buffer, read-only where `read_only` says.
    pub fn plain(count: u32, read_only: impl Fn(u32) -> bool) -> Vec<Binding> {
        (0..count).map(|i| Binding { read_only: read_only(i), array: None }).collect()
    }

    /// Buffers the binding takes.
    fn buffers(self) -> usize {
        self.array.unwrap_or(1) as usize
    }
}

/// The bind group layout of a kernel configuration's `bindings`.
pub fn bind_group_layout(dev: &wgpu::Device, label: &str, bindings: &[Binding]) -> wgpu::BindGroupLayout {
    let entries: Vec<wgpu::BindGroupLayoutEntry> = bindings
        .iter()
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupLayoutEntry {
            binding: i as u32,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only: b.read_only },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: b.array.map(|n| std::num::NonZeroU32::new(n).expect("a binding array holds a buffer")),
        })
        .collect();
    dev.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(label), entries: &entries })
}

/// The layout of a batch's bind group ([`crate::shader::BATCH_BINDINGS`]).
pub fn batch_layout(dev: &wgpu::Device) -> (wgpu::BindGroupLayout, Vec<Binding>) {
    let bindings = Binding::plain(BATCH_BUFFERS, |i| i < 3);
    (bind_group_layout(dev, "batch", &bindings), bindings)
}

/// A bind group of `layout` (made from `bindings`) binding `resources` (whole buffers or
/// ranges), in order from binding 0: a binding array takes as many in a row as it holds.
pub fn bind_group<'a>(
    dev: &wgpu::Device,
    label: &str,
    (layout, bindings): (&wgpu::BindGroupLayout, &[Binding]),
    resources: impl IntoIterator<Item = wgpu::BindingResource<'a>>,
) -> wgpu::BindGroup {
    let mut resources = resources.into_iter();
    let taken: Vec<Vec<wgpu::BindingResource>> =
        bindings.iter().map(|b| resources.by_ref().take(b.buffers()).collect()).collect();
    assert!(resources.next().is_none(), "{label}: more resources than bindings");
    let arrays: Vec<Vec<wgpu::BufferBinding>> = taken
        .iter()
        .zip(bindings)
        .map(|(r, b)| match b.array {
            None => Vec::new(),
            Some(_) => r
                .iter()
                .map(|r| match r {
                    wgpu::BindingResource::Buffer(b) => b.clone(),
                    _ => panic!("{label}: a binding array of buffers holds buffers"),
                })
                .collect(),
        })
        .collect();
    let entries: Vec<wgpu::BindGroupEntry> = taken
        .into_iter()
        .zip(bindings)
        .zip(&arrays)
        .enumerate()
        .map(|(i, ((mut r, b), array))| wgpu::BindGroupEntry {
            binding: i as u32,
            resource: match b.array {
                None => r.pop().unwrap_or_else(|| panic!("{label}: binding {i} has no resource")),
                Some(_) => wgpu::BindingResource::BufferArray(array),
            },
        })
        .collect();
    dev.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(label), layout, entries: &entries })
}

/// A storage buffer of `size` bytes (at least 16) the host can copy into and out of.
pub fn storage_buffer(dev: &wgpu::Device, label: &str, size: u64) -> wgpu::Buffer {
    dev.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: size.max(16),
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    })
}

/// Compiled kernels.
pub struct Pipelines<K>(Vec<(K, wgpu::ComputePipeline)>);

impl<K: KernelEntry> Pipelines<K> {
    /// The pipeline of kernel `k`, which must have been built.
    pub fn get(&self, k: K) -> &wgpu::ComputePipeline {
        &self.0.iter().find(|(kk, _)| *kk == k).expect("every kernel is built").1
    }

    /// The kernels and their pipelines, in the order they were built.
    pub fn iter(&self) -> impl Iterator<Item = &(K, wgpu::ComputePipeline)> {
        self.0.iter()
    }
}

/// A shader module of gphash's own WGSL, with wgpu's bounds checks but without its loop
/// bounding: wgpu gives every loop a 64-bit iteration counter that breaks it at 2^64 rounds, a
/// guard for untrusted shaders that costs these kernels a measurable share of their time
/// (docs/lab/kernels.md, "Kernels without wgpu's loop bounding"). Every loop of gphash's kernels ends:
/// over constant bounds, over a batch, or retrying a CAS that another operation won.
pub fn shader_module(dev: &wgpu::Device, label: &str, wgsl: String) -> wgpu::ShaderModule {
    let checks =
        wgpu::ShaderRuntimeChecks { force_loop_bounding: false, ..wgpu::ShaderRuntimeChecks::checked() };
    // SAFETY: the only check turned off is loop bounding, and gphash's loops terminate (above);
    // reads and writes stay bounds-checked.
    unsafe {
        dev.create_shader_module_trusted(
            wgpu::ShaderModuleDescriptor {
                label: Some(label),
                source: wgpu::ShaderSource::Wgsl(wgsl.into()),
            },
            checks,
        )
    }
}

/// Compiles one WGSL kernel (entry point `main`) with the bind group layout wgpu derives from
/// it; a validation error names `label`.
pub fn single_pipeline(dev: &wgpu::Device, label: &str, wgsl: String) -> Result<wgpu::ComputePipeline> {
    let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
    let module = shader_module(dev, label, wgsl);
    let pipeline = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(label),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    match pollster::block_on(scope.pop()) {
        Some(e) => Err(Error::Shader(format!("{label}: {e}"))),
        None => Ok(pipeline),
    }
}

/// Compiles `kernels`, `source` giving each one's WGSL, with bind groups of `layouts` (the
/// table's, then the batch's) and `immediates` bytes of immediates (their parameters, a
/// `var<immediate>` of that size); a validation error names the kernel.
pub fn build_pipelines<K: KernelEntry + Send>(
    gpu: &Gpu,
    (layouts, immediates): (&[&wgpu::BindGroupLayout], u32),
    kernels: &[K],
    source: impl Fn(K) -> Result<String> + Sync,
) -> Result<Pipelines<K>> {
    let dev = &gpu.device;
    if immediates > gpu.info.max_immediates {
        return Err(Error::MissingFeature(format!(
            "the kernels take {immediates} bytes of parameters as immediates; {} allows {}",
            gpu.info.name, gpu.info.max_immediates
        )));
    }
    // A bind group layout the device refused makes this layout invalid: one error here instead
    // of one per kernel (the layout's own reason goes to the device's uncaptured-error log).
    let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
    let pl = dev.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: None,
        bind_group_layouts: &layouts.iter().map(|&l| Some(l)).collect::<Vec<_>>(),
        immediate_size: immediates,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(Error::Gpu(format!("the kernels' bindings: {e}")));
    }
    // Each kernel compiles on its own thread (error scopes are per thread): an engine's start
    // waits for the slowest kernel, not for their sum.
    let build = |k: K| -> Result<wgpu::ComputePipeline> {
        let src = source(k)?;
        let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = shader_module(dev, k.file(), src);
        let pipeline = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(k.entry()),
            layout: Some(&pl),
            module: &module,
            entry_point: Some(k.entry()),
            compilation_options: Default::default(),
            cache: None,
        });
        match pollster::block_on(scope.pop()) {
            Some(e) => Err(Error::Shader(format!("{} ({}): {e}", k.file(), k.entry()))),
            None => Ok(pipeline),
        }
    };
    let built: Vec<Result<wgpu::ComputePipeline>> = std::thread::scope(|s| {
        let threads: Vec<_> = kernels.iter().map(|&k| s.spawn(move || build(k))).collect();
        threads.into_iter().map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    });
    let out = kernels.iter().copied().zip(built).map(|(k, p)| Ok((k, p?))).collect::<Result<Vec<_>>>()?;
    Ok(Pipelines(out))
}

/// Records `invocations` invocations of each pipeline, in order, with bind groups `binds` (0,
/// 1, ...) and `immediates` (the kernels' parameters); returns the number of kernels.
///
/// Timed (`timer`), each kernel is a compute pass of its own that writes its timestamps.
/// Untimed, they are the dispatches of one pass: the pipelines share one layout, so the bind
/// groups and immediates are set once, and wgpu still orders the dispatches (each is a usage
/// scope of its own, with the barriers a pass per kernel had), while recording a pass and
/// binding its groups costs the host each time (docs/lab/latency.md, "Batches timed in turn with
/// the round trip; one compute pass a submit").
pub fn record_passes<'a>(
    enc: &mut wgpu::CommandEncoder,
    (binds, immediates): (&[&wgpu::BindGroup], &[u8]),
    passes: impl IntoIterator<Item = (&'a wgpu::ComputePipeline, u64)>,
    timer: Option<&PassTimer>,
) -> u32 {
    let bind = |pass: &mut wgpu::ComputePass<'_>| {
        for (i, &group) in binds.iter().enumerate() {
            pass.set_bind_group(i as u32, group, &[]);
        }
        pass.set_immediates(0, immediates);
    };
    let mut recorded = 0;
    match timer {
        Some(t) => {
            for (pipeline, invocations) in passes {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: t.writes(recorded),
                });
                pass.set_pipeline(pipeline);
                bind(&mut pass);
                dispatch(&mut pass, invocations);
                recorded += 1;
            }
        }
        None => {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for (pipeline, invocations) in passes {
                pass.set_pipeline(pipeline);
                if recorded == 0 {
                    bind(&mut pass);
                }
                dispatch(&mut pass, invocations);
                recorded += 1;
            }
        }
    }
    recorded
}

/// Invocations of the staged write-back kernel for a dirty list of `dirty_cap` lines.
pub fn writeback_invocations(dirty_cap: u32) -> u64 {
    (dirty_cap as u64 * 16).min(1 << 20)
}

/// Where a pool's regions live while the GPU works on them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// Zero-copy where the driver imports the pool mapping, staged otherwise (reported).
    #[default]
    Auto,
    /// Zero-copy or an error.
    ZeroCopy,
    /// Always a device-memory copy written back at persist points.
    Staged,
    /// A device-memory copy that is never written back (the upper bound of benchmarks):
    /// nothing persists and the pool on the host goes stale.
    Volatile,
}

/// Where a pool's regions ended up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Residence {
    /// The GPU reads and writes the pool mapping in place.
    ZeroCopy,
    /// The GPU works on a device-memory copy; dirty lines are written back at persist points.
    Staged {
        /// Why zero-copy was not used.
        reason: String,
    },
    /// The GPU works on a device-memory copy and nothing is written back.
    Volatile,
}

/// A region of a pool as storage windows on the device.
pub struct RegionWindows {
    /// The region.
    pub region: Region,
    /// How it is split into windows.
    pub windows: Windows,
    /// A buffer per window: imported pool memory, or a device copy.
    pub buffers: Vec<wgpu::Buffer>,
}

/// Regions of the pool imported zero-copy under one guard, handed from one user to the next
/// without importing them again (a growth's build hands the grown table and heap to its engine:
/// importing pins every page, a large part of a growth: docs/lab/growth-and-recovery.md, "Growth
/// of 16 M keys: imports made once, the mapping kept, the discard after the engine"). Their
/// owner keeps the pool in place while they live. Dropped, they destroy their buffers and wait
/// until the driver has released them.
pub struct ImportedRegions {
    /// The mapping they were imported from ([`Mapping::id`]): used with another, they are
    /// released and the regions imported again.
    mapping: u64,
    /// Each region, how it is split into windows, and a buffer per window.
    parts: Vec<RegionWindows>,
    /// The guard that counts their buffers and nothing else.
    guard: ImportGuard,
    gpu: Arc<Gpu>,
}

impl ImportedRegions {
    /// None yet from `mapping`, under a guard of their own.
    pub fn new(gpu: &Arc<Gpu>, mapping: &Mapping) -> Self {
        ImportedRegions {
            mapping: mapping.id(),
            parts: vec![],
            guard: ImportGuard::default(),
            gpu: gpu.clone(),
        }
    }

    /// The guard to import under before [`ImportedRegions::add`]ing.
    pub fn guard(&self) -> &ImportGuard {
        &self.guard
    }

    /// `buffers`, imported under [`ImportedRegions::guard`] as `region` in `windows`.
    pub fn add(&mut self, region: Region, windows: Windows, buffers: Vec<wgpu::Buffer>) {
        self.parts.push(RegionWindows { region, windows, buffers });
    }

    /// The buffers of `region` in `windows`, if held and imported from `mapping`; the others
    /// stay. Whoever takes them destroys them, or [`ImportedRegions::add`]s them back.
    pub fn take_from(
        &mut self,
        mapping: &Mapping,
        region: Region,
        windows: Windows,
    ) -> Option<Vec<wgpu::Buffer>> {
        (self.mapping == mapping.id()).then(|| self.take(region, windows))?
    }

    /// The buffers of `region`, in whatever windows (none if not held); they stay counted by
    /// the guard until they are dropped.
    pub fn take_region(&mut self, region: Region) -> Vec<wgpu::Buffer> {
        let (taken, kept) = std::mem::take(&mut self.parts).into_iter().partition(|p| p.region == region);
        self.parts = kept;
        taken.into_iter().flat_map(|p: RegionWindows| p.buffers).collect()
    }

    /// The buffers of `region` in `windows`, if held; the others stay.
    fn take(&mut self, region: Region, windows: Windows) -> Option<Vec<wgpu::Buffer>> {
        let i = self.parts.iter().position(|p| (p.region, p.windows) == (region, windows))?;
        Some(self.parts.swap_remove(i).buffers)
    }

    /// The guard, once every buffer not taken is destroyed: it counts those taken from now on.
    fn into_guard(mut self) -> ImportGuard {
        self.parts.drain(..).flat_map(|p| p.buffers).for_each(|b| b.destroy());
        std::mem::take(&mut self.guard)
    }
}

impl Drop for ImportedRegions {
    fn drop(&mut self) {
        self.parts.drain(..).flat_map(|p| p.buffers).for_each(|b| b.destroy());
        release_imports(&self.gpu, &self.guard);
    }
}

/// The largest dirty line: 64 KiB, the alignment of every region, so that a line never
/// straddles two regions nor ends past one.
pub const MAX_LINE_SHIFT: u32 = 10;

/// The dirty lines of a pool of `bytes` are `64 << shift` bytes: the kernels number them with
/// 32 bits, so 64-byte lines reach 256 GiB, and each doubling of the line doubles the reach
/// (1 TiB with 256-byte lines, up to 256 TiB with lines of 64 KiB).
pub fn line_shift(bytes: u64) -> u32 {
    let lines = bytes.div_ceil(64).max(1);
    (u64::BITS - (lines - 1).leading_zeros()).saturating_sub(32)
}

/// A pool's table and heap regions as storage windows: imported zero-copy where the placement
/// and the pool allow it and the driver agrees, device copies otherwise (staged, or volatile
/// where asked).
pub struct PoolWindows {
    /// Zero-copy, staged (and why) or volatile.
    pub residence: Residence,
    /// The table region.
    pub table: RegionWindows,
    /// The heap region.
    pub heap: RegionWindows,
    /// The kernels list dirty lines of `64 << line_shift` bytes (see [`line_shift`]).
    pub line_shift: u32,
    guard: ImportGuard,
    /// The mapping the windows imported ([`Mapping::id`]).
    mapping: u64,
}

/// The pool [`PoolWindows::place`] binds: the pool itself (any placement), or only where its
/// mapping lies, while its owner may be writing it on another thread (zero-copy only: its
/// bytes are never read, so a copy of them cannot be torn).
pub enum PoolRef<'a> {
    /// The pool, not in use elsewhere meanwhile.
    Owned(&'a mut Pool),
    /// The pool's mapping. The caller keeps the pool in place (not grown, moved or dropped)
    /// until the windows are released ([`PoolWindows::release`]): they import its memory.
    Mapping(Mapping),
}

impl PoolRef<'_> {
    /// Where the pool's mapping lies.
    pub fn mapping(&mut self) -> Mapping {
        match self {
            PoolRef::Owned(pool) => pool.mapping(),
            PoolRef::Mapping(m) => *m,
        }
    }
}

impl PoolWindows {
    /// Binds the table and the heap, each `(region, windows, words in use, label)`, with dirty
    /// lines as large as the regions' reach needs and at least `64 << min_line_shift` bytes.
    /// `imported`: regions already imported from this mapping, each used where it is the
    /// table's or the heap's region in its windows (the others released; what is not there is
    /// imported).
    pub fn place(
        gpu: &Gpu,
        mut pool: PoolRef,
        placement: Placement,
        [table, heap]: [(Region, Windows, u64, &str); 2],
        min_line_shift: u32,
        imported: Option<ImportedRegions>,
    ) -> Result<Self> {
        let line_shift = line_shift(table.0.end().max(heap.0.end())).max(min_line_shift);
        if line_shift > MAX_LINE_SHIFT {
            return Err(Error::InvalidConfig(format!(
                "pools beyond {} TiB are not supported",
                (64u64 << MAX_LINE_SHIFT << 32) >> 40
            )));
        }
        let mapping = pool.mapping();
        let reason = staged_reason(mapping.backend(), placement);
        let same_mapping = |i: &ImportedRegions| i.mapping == mapping.id();
        let (handed, guard) = match imported {
            Some(mut i) if reason.is_none() && same_mapping(&i) => {
                let handed = [i.take(table.0, table.1), i.take(heap.0, heap.1)];
                (handed, i.into_guard())
            }
            other => {
                // Released before anything is imported or copied.
                drop(other);
                ([None, None], ImportGuard::default())
            }
        };
        let [t, h] = handed;
        let imported = match reason {
            Some(reason) => Err(reason),
            None => {
                let import = |(region, windows, _, label): (Region, Windows, u64, &str), held| match held {
                    Some(buffers) => Ok(buffers),
                    None => import_region(gpu, &mapping, region, windows, &guard, label),
                };
                import(table, t).and_then(|t| Ok((t, import(heap, h)?)))
            }
        };
        let (t, h, residence) = match (imported, pool) {
            (Ok((t, h)), _) => (t, h, Residence::ZeroCopy),
            (Err(reason), PoolRef::Mapping(_)) => {
                release_imports(gpu, &guard);
                return Err(Error::Gpu(format!(
                    "zero-copy import of the pool failed ({reason}); a pool in use elsewhere is not copied"
                )));
            }
            (Err(reason), _) if placement == Placement::ZeroCopy => {
                release_imports(gpu, &guard);
                return Err(Error::Gpu(format!("zero-copy import of the pool failed: {reason}")));
            }
            (Err(reason), PoolRef::Owned(pool)) => {
                // Buffers imported before the failure must be gone before the pool is read.
                release_imports(gpu, &guard);
                let t = upload_region(gpu, pool, table.0, table.1, table.2, table.3)?;
                let h = upload_region(gpu, pool, heap.0, heap.1, heap.2, heap.3)?;
                let residence = match placement {
                    Placement::Volatile => Residence::Volatile,
                    _ => Residence::Staged { reason },
                };
                (t, h, residence)
            }
        };
        Ok(PoolWindows {
            residence,
            table: RegionWindows { region: table.0, windows: table.1, buffers: t },
            heap: RegionWindows { region: heap.0, windows: heap.1, buffers: h },
            line_shift,
            guard,
            mapping: mapping.id(),
        })
    }

    /// The regions imported in place, handed on: the windows keep nothing. None where they are
    /// device copies.
    pub fn take_imported(&mut self, gpu: &Arc<Gpu>) -> Option<ImportedRegions> {
        if self.residence != Residence::ZeroCopy {
            return None;
        }
        let parts = [&mut self.table, &mut self.heap].map(|r| RegionWindows {
            region: r.region,
            windows: r.windows,
            buffers: std::mem::take(&mut r.buffers),
        });
        Some(ImportedRegions {
            mapping: self.mapping,
            parts: parts.into(),
            guard: std::mem::take(&mut self.guard),
            gpu: gpu.clone(),
        })
    }

    /// Whether the windows are device copies written back at persist points.
    pub fn staged(&self) -> bool {
        matches!(self.residence, Residence::Staged { .. })
    }

    /// Whether the kernels list the lines they write: staged (they are copied back) and
    /// zero-copy with a persist primitive that works on lines; not volatile, nor when the pool
    /// only fences.
    pub fn tracks_lines(&self, persist: PersistMode) -> bool {
        match self.residence {
            Residence::Staged { .. } => true,
            Residence::Volatile => false,
            _ => !matches!(persist, PersistMode::Fence | PersistMode::None),
        }
    }

    /// The table's windows, then the heap's, as the kernels bind them.
    pub fn buffers(&self) -> impl Iterator<Item = &wgpu::Buffer> {
        self.table.buffers.iter().chain(&self.heap.buffers)
    }

    /// Words of a dirty line (the kernels' `Params::line_words`).
    pub fn line_words(&self) -> u32 {
        16 << self.line_shift
    }

    /// Bytes of a dirty line.
    pub fn line_bytes(&self) -> u64 {
        self.line_words() as u64 * 4
    }

    /// Pool offsets of the table and the heap, and the table's size, in dirty lines (the
    /// kernels' `table_line_base`, `heap_line_base`, `table_lines`).
    pub fn lines(&self) -> (u32, u32, u32) {
        let (t, h, line) = (self.table.region, self.heap.region, self.line_bytes());
        ((t.offset / line) as u32, (h.offset / line) as u32, (t.bytes / line) as u32)
    }

    /// Staged: copies both regions back into the pool mapping whole.
    pub fn download(&self, gpu: &Gpu, pool: &mut Pool) -> Result<()> {
        for r in [&self.table, &self.heap] {
            download_region(gpu, &r.buffers, r.windows, r.region, pool)?;
        }
        Ok(())
    }

    /// Destroys the windows and waits until the driver let go of them (imported ones
    /// reference the pool mapping, which may then be unmapped or moved).
    pub fn release(&mut self, gpu: &Gpu) {
        for b in self.table.buffers.drain(..).chain(self.heap.buffers.drain(..)) {
            b.destroy();
        }
        release_imports(gpu, &self.guard);
    }
}

/// The dirty list of a submit: copies its first `count` lines of `64 << line_shift` bytes (and,
/// staged, their contents gathered in `staging`) into `readback` at `at`, then writes the
/// contents into the pool mapping (staged) and returns the pool's 64-byte lines they cover.
pub fn read_dirty(
    gpu: &Gpu,
    (dirty, staging): (&wgpu::Buffer, Option<&wgpu::Buffer>),
    readback: &wgpu::Buffer,
    (at, count): (u64, u32),
    line_shift: u32,
    pool: &mut Pool,
) -> Result<Vec<u64>> {
    let line = 64usize << line_shift;
    let list_bytes = (count as u64 * 4).next_multiple_of(256);
    let data_bytes = if staging.is_some() { count as u64 * line as u64 } else { 0 };
    // Checked before anything is written into the pool mapping.
    scoped(&gpu.device, "reading the dirty lines back", || {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(dirty, 0, readback, at, count as u64 * 4);
        if let Some(staging) = staging {
            enc.copy_buffer_to_buffer(staging, 0, readback, at + list_bytes, data_bytes);
        }
        gpu.submit([enc.finish()]);
    })?;
    let mut lines = Vec::with_capacity((count as usize) << line_shift);
    let dst = pool.bytes_mut();
    map_read(gpu, readback, at..at + list_bytes + data_bytes, |bytes| {
        let list: &[u32] = bytemuck::cast_slice(&bytes[..count as usize * 4]);
        let data = &bytes[list_bytes as usize..];
        for (i, &listed) in list.iter().enumerate() {
            if staging.is_some() {
                let at = listed as usize * line;
                dst[at..at + line].copy_from_slice(&data[i * line..(i + 1) * line]);
            }
            lines.extend(pool_lines(listed, line_shift));
        }
    })?;
    Ok(lines)
}

/// The pool's 64-byte lines that dirty line `listed` of `64 << line_shift` bytes covers.
fn pool_lines(listed: u32, line_shift: u32) -> std::ops::Range<u64> {
    let first = (listed as u64) << line_shift;
    first..first + (1 << line_shift)
}

/// Imports every window of a region of the pool mapping; `Err` says why the driver refused.
///
/// A small probe goes first: the NVIDIA driver refuses `MAP_SHARED` files on disk filesystems
/// only after pinning what it was asked to import, and a refused import of hundreds of MiB
/// leaves later allocations out of memory.
pub fn import_region(
    gpu: &Gpu,
    mapping: &Mapping,
    region: Region,
    win: Windows,
    guard: &ImportGuard,
    label: &str,
) -> std::result::Result<Vec<wgpu::Buffer>, String> {
    assert!(region.end() <= mapping.len(), "region {region:?} is outside the pool");
    let base = mapping.as_mut_ptr();
    let import = |at: u64, len: u64| {
        // SAFETY: the range lies inside the pool mapping, which outlives the buffers: their
        // owners wait until `guard` reports every import destroyed before the pool moves.
        unsafe { hostmem::import(gpu, base.add((region.offset + at) as usize), len, guard, label) }
    };
    // Other regions' windows may be alive under the same guard: wait for the probe alone.
    let alive = guard.live();
    import(0, region.bytes.min(host_pm::REGION_ALIGN))?.destroy();
    release_imports_to(gpu, guard, alive);
    let buffers = (0..win.count)
        .map(|i| {
            let at = i as u64 * win.words() * 4;
            import(at, (region.bytes - at).min(win.words() * 4))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    gpu.count_region_import();
    Ok(buffers)
}

/// Why a pool is not imported zero-copy, if it is not: staged placement was asked for, or the
/// pool is a file on a disk filesystem under automatic placement (NVIDIA refuses those, and a
/// refused import leaves later allocations of the device out of memory).
pub fn staged_reason(backend: Backend, placement: Placement) -> Option<String> {
    match (placement, backend) {
        (Placement::Staged, _) => Some("staged placement was requested".into()),
        (Placement::Volatile, _) => Some("volatile placement was requested".into()),
        (Placement::Auto, Backend::File) => {
            Some("the pool is a file on a disk filesystem, which drivers do not import reliably".into())
        }
        _ => None,
    }
}

/// Staged mode: a device buffer per window, filled from the pool.
pub fn upload_region(
    gpu: &Gpu,
    pool: &Pool,
    region: Region,
    win: Windows,
    words: u64,
    label: &str,
) -> Result<Vec<wgpu::Buffer>> {
    let bytes = &pool.bytes()[region.offset as usize..region.end() as usize];
    (0..win.count)
        .map(|i| {
            let len = win.len(i, words) * 4;
            let at = (i as u64 * win.words() * 4) as usize;
            scoped(&gpu.device, &format!("uploading the {label}"), || {
                let buf = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size: len,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_DST
                        | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                });
                for chunk in (0..len as usize).step_by(64 << 20) {
                    let end = (chunk + (64 << 20)).min(len as usize);
                    gpu.queue.write_buffer(&buf, chunk as u64, &bytes[at + chunk..at + end]);
                }
                buf
            })
        })
        .collect()
}

/// Staged mode: copies a region's device windows back into the pool mapping.
pub fn download_region(
    gpu: &Gpu,
    buffers: &[wgpu::Buffer],
    win: Windows,
    region: Region,
    pool: &mut Pool,
) -> Result<()> {
    for (i, buf) in buffers.iter().enumerate() {
        let at = region.offset + i as u64 * win.words() * 4;
        let len = buf.size().min(region.end() - at);
        // Checked before anything is written into the pool mapping.
        let rb = scoped(&gpu.device, "downloading a region", || {
            let rb = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("download"),
                size: len,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(buf, 0, &rb, 0, len);
            gpu.submit([enc.finish()]);
            rb
        })?;
        let dst = &mut pool.bytes_mut()[at as usize..(at + len) as usize];
        map_read(gpu, &rb, 0..len, |bytes| dst.copy_from_slice(bytes))?;
    }
    Ok(())
}

/// The largest storage window the device and the options allow.
pub fn max_window(info: &DeviceInfo, max_window_bytes: Option<u64>) -> u64 {
    max_window_bytes.unwrap_or(info.max_binding).min(info.max_binding).min(info.max_buffer)
}

/// Refuses a configuration of `storage` storage bindings for `what` when the device allows
/// fewer.
pub fn check_bindings(what: &str, storage: u32, info: &DeviceInfo) -> Result<()> {
    if storage > info.max_storage_buffers {
        return Err(Error::InvalidConfig(format!(
            "{what} needs {storage} storage bindings; {} allows {}",
            info.name, info.max_storage_buffers
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 64-byte lines up to 256 GiB, each doubling of the pool past it a doubling of the line.
    #[test]
    fn lines_widen_past_256_gib() {
        assert_eq!(line_shift(0), 0);
        assert_eq!(line_shift(1 << 20), 0);
        assert_eq!(line_shift(256 << 30), 0);
        assert_eq!(line_shift((256 << 30) + 1), 1);
        assert_eq!(line_shift(512 << 30), 1);
        assert_eq!(line_shift(1 << 40), 2);
        assert_eq!(line_shift(256 << 40), MAX_LINE_SHIFT);
        assert_eq!(line_shift((256 << 40) + 1), MAX_LINE_SHIFT + 1);
        for shift in 0..=MAX_LINE_SHIFT {
            let bytes = 64u64 << shift << 32;
            assert_eq!(line_shift(bytes), shift, "{bytes} bytes");
            // Every dirty line of such a pool is numbered with 32 bits.
            assert!((bytes - 1) / (64 << shift) <= u32::MAX as u64);
        }
    }

    /// A dirty line covers the pool's 64-byte lines of its bytes, and no other.
    #[test]
    fn a_dirty_line_covers_its_pool_lines() {
        assert_eq!(pool_lines(7, 0), 7..8);
        assert_eq!(pool_lines(7, 2), 28..32);
        assert_eq!(pool_lines(u32::MAX, 2), (u32::MAX as u64) * 4..(u32::MAX as u64 + 1) * 4);
    }
}
