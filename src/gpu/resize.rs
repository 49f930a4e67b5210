//! Resizing on the GPU: the grown table is built from the old one with the `relocate` and
//! `rehash` kernels (`shaders/resize.wgsl`), in place in the pool (zero-copy) or on device
//! copies that are then written back (staged).

use std::sync::{Arc, Condvar, Mutex, Once, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gphash_gpu::Gpu;
use gphash_gpu::hostmem::{self, ImportGuard, release_imports};
use gphash_gpu::resources::{
    ErrorScopes, ImportedRegions, Pipelines, bind_group, bind_group_layout, build_pipelines, download_region,
    import_region, map_read, max_window, record_passes, staged_reason, upload_region,
};
use gphash_gpu::shader::{Reach, Windows};
use host_pm::{Pool, Region};

use super::engine::{GpuEngine, GpuOptions};
use super::shader::{
    self, CacheConfig, FIRST_WINDOW_BINDING, Kernel, KernelConfig, Params, Source, TABLE_BINDINGS,
};
use crate::error::Result;
use crate::hash::Seeds;
use crate::layout::Geometry;
use crate::model::Control;
use crate::profile::Laps;
use crate::protocol::control;

/// The kernels of a growth, compiling ahead of it on threads of their own: those of [`build`]
/// and those of the grown table's engine. Each is compiled and dropped; the driver keeps what
/// it compiled, so the build and the engine that follow start without compiling. Dropping it
/// waits for them, and so does the process's exit ([`Compiling`]): a process that exits while
/// the driver compiles crashes in the driver's teardown (a segmentation fault after every
/// test passed, on the H200).
pub(crate) struct Warming {
    build: Option<JoinHandle<()>>,
    engine: Option<JoinHandle<()>>,
}

impl Warming {
    /// Starts compiling the kernels that growing `old` by a level needs ([`compile_ahead`]:
    /// not on a device that is the host's CPU). `placed`: whether the pool is imported in place (so
    /// the grown table's engine has a cache), and the device bytes of the cache the growth
    /// drops first (the grown table's is planned as if they were free).
    pub(crate) fn start(
        gpu: &Arc<Gpu>,
        opts: &GpuOptions,
        (old, table_seed): (&Geometry, u64),
        placed: (bool, u64),
        verify_values: bool,
    ) -> Self {
        let Ok(new) = old.grown() else { return Warming { build: None, engine: None } };
        let seeds = Seeds::new(table_seed, new.layout.hashes);
        let (o, s) = (opts.clone(), seeds.clone());
        let old = *old;
        let build = compile_ahead(gpu, "the growth's kernels", move |gpu| {
            pipelines(gpu, &config(gpu, &o, &s, &old, &new)?).map(drop)
        });
        let engine = warm_engine(gpu, opts, (new, seeds), placed, verify_values);
        Warming { build, engine }
    }

    /// Starts compiling the kernels of the engine of `grown`, the table with its heap grown
    /// (`crate::heap::grown`): a heap growth builds nothing, but its new cell count is in its
    /// engine's kernels, whose compile was most of each heap growth's time
    /// (`docs/lab/growth-and-recovery.md`, "A heap growth's kernels compiled ahead"). As
    /// [`Warming::start`] otherwise.
    pub(crate) fn heap_growth(
        gpu: &Arc<Gpu>,
        opts: &GpuOptions,
        (grown, table_seed): (&Geometry, u64),
        placed: (bool, u64),
        verify_values: bool,
    ) -> Self {
        let seeds = Seeds::new(table_seed, grown.layout.hashes);
        Warming { build: None, engine: warm_engine(gpu, opts, (*grown, seeds), placed, verify_values) }
    }

    /// Waits for the build's kernels.
    pub(crate) fn build_compiled(&mut self) {
        join(self.build.take());
    }

    /// Waits for the grown table's engine's kernels.
    pub(crate) fn engine_compiled(&mut self) {
        join(self.engine.take());
    }
}

impl Drop for Warming {
    fn drop(&mut self) {
        self.build_compiled();
        self.engine_compiled();
    }
}

/// Compiles the kernels of `table`'s engine ahead ([`GpuEngine::warm`]).
fn warm_engine(
    gpu: &Arc<Gpu>,
    opts: &GpuOptions,
    table: (Geometry, Seeds),
    placed: (bool, u64),
    verify_values: bool,
) -> Option<JoinHandle<()>> {
    let opts = opts.clone();
    compile_ahead(gpu, "the grown table's kernels", move |gpu| {
        GpuEngine::warm(gpu, table, placed, &opts, verify_values)
    })
}

/// Compiles ahead still running, and the signal that one ended.
static COMPILING: Mutex<usize> = Mutex::new(0);
static COMPILED: Condvar = Condvar::new();

/// The longest the process's exit waits for compiles ahead: one that hangs in the driver does
/// not hold it for ever.
const EXIT_WAIT: Duration = Duration::from_secs(10);

/// A compile ahead, counted in [`COMPILING`] while it lives. The process's exit waits for the
/// count to reach zero (`wait_for_compiles`, registered with `atexit` at the first one), since
/// an index that is never dropped (leaked, or a `std::process::exit`) never joins its
/// [`Warming`]. Exit handlers run in the reverse order of their registration, and the shared
/// libraries' destructors after all of them: this one runs before a teardown the driver
/// registered when it was loaded with the device; one it registered later would run first.
struct Compiling;

impl Compiling {
    fn start() -> Self {
        static AT_EXIT: Once = Once::new();
        AT_EXIT.call_once(|| {
            // SAFETY: registers a function that takes nothing, returns nothing and never unwinds.
            if unsafe { libc::atexit(wait_for_compiles) } != 0 {
                log::debug!("the exit will not wait for compiles ahead: atexit refused");
            }
        });
        *COMPILING.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        Compiling
    }
}

impl Drop for Compiling {
    fn drop(&mut self) {
        *COMPILING.lock().unwrap_or_else(PoisonError::into_inner) -= 1;
        COMPILED.notify_all();
    }
}

/// At the process's exit: waits for the compiles ahead still running, up to [`EXIT_WAIT`].
extern "C" fn wait_for_compiles() {
    let running = COMPILING.lock().unwrap_or_else(PoisonError::into_inner);
    drop(COMPILED.wait_timeout_while(running, EXIT_WAIT, |n| *n > 0));
}

/// Runs `compile` on a thread of its own, logging how long it took or why it failed; nothing
/// on a device that is the host's CPU (whose compiles would take the cores the table's work
/// runs on; lavapipe keeps nothing between compiles).
fn compile_ahead(
    gpu: &Arc<Gpu>,
    what: &'static str,
    compile: impl FnOnce(&Arc<Gpu>) -> Result<()> + Send + 'static,
) -> Option<JoinHandle<()>> {
    if gpu.info.is_cpu() {
        return None;
    }
    let gpu = gpu.clone();
    // Counted before the thread starts: an exit right after the spawn waits for it too.
    let compiling = Compiling::start();
    // A thread the system refuses only costs the growth its compile.
    let thread = std::thread::Builder::new().name("gphash-compile-ahead".into());
    thread
        .spawn(move || {
            let _compiling = compiling;
            let t = Instant::now();
            // Its errors are its own, not the device's uncaptured ones.
            let scopes = ErrorScopes::push(&gpu.device);
            let compiled = compile(&gpu).and_then(|()| Ok(scopes.pop(|| what.to_string())?));
            match compiled {
                Ok(()) => log::debug!("{what} compiled ahead in {:.2} ms", t.elapsed().as_secs_f64() * 1e3),
                Err(e) => log::debug!("{what} not compiled ahead: {e}"),
            }
            // Its share of the device goes before the exit may go on.
            drop(gpu);
        })
        .inspect_err(|e| log::debug!("{what} not compiled ahead: no thread ({e})"))
        .ok()
}

/// Waits for a compile ahead; one that panicked costs the growth nothing but the compile.
fn join(thread: Option<JoinHandle<()>>) {
    if let Some(Err(_)) = thread.map(JoinHandle::join) {
        log::warn!("a compile ahead of a growth panicked");
    }
}

/// The resize kernels' configuration for growing `old` into `new`.
fn config(
    gpu: &Gpu,
    opts: &GpuOptions,
    seeds: &Seeds,
    old: &Geometry,
    new: &Geometry,
) -> Result<KernelConfig> {
    let window = max_window(&gpu.info, opts.max_window_bytes);
    // The grown table as its engine will bind it: the build hands its import on.
    let [table, _] = GpuEngine::windows(&gpu.info, opts, new);
    let mut cfg = KernelConfig {
        geo: *new,
        seeds: seeds.clone(),
        tile: opts.tile,
        table,
        // The resize kernels touch no heap and no allocator: one small dummy window each.
        heap: Windows::cover(16, 64),
        bitmap: Windows::cover(16, 64),
        cache: CacheConfig::off(),
        source: Some(Source {
            windows: Windows::cover(old.table_words(), window),
            top_level: old.top_level,
            keys_base: old.keys_base(),
            words: old.table_words(),
            bottom_slots: old.groups() * old.layout.slots as u64,
        }),
        // The resize kernels read no value.
        verify_values: false,
        reach: Reach::default(),
    };
    cfg.settle_reach(&gpu.info, opts.large_pool_mode)?;
    Ok(cfg)
}

/// The resize kernels' bind group layout (they use no batch buffers: the table's bind group
/// alone) and the kernels, compiled for `cfg`.
fn pipelines(gpu: &Gpu, cfg: &KernelConfig) -> Result<(wgpu::BindGroupLayout, Pipelines<Kernel>)> {
    let layout = bind_group_layout(&gpu.device, "resize", &cfg.bindings());
    let pipelines =
        build_pipelines(gpu, (&[&layout], Params::BYTES), &Kernel::RESIZE, |k| shader::source(k, cfg))?;
    Ok((layout, pipelines))
}

/// Builds the table `new` (zeroed, in region `new_region`) from `old` (in `old_region`);
/// returns the control block (keys rehashed, keys that found no slot) and, where the pool was
/// imported in place, the imports of the new table and of its heap (in `new_heap`, already
/// filled), for the grown table's engine to take over. `held`: the old table's engine's
/// imports, where the pool kept its place: the old table is read through them (importing it
/// again slowed a growth: docs/lab/growth-and-recovery.md, "Growth of 16 M keys in place: a
/// mapping that never moves, room made ahead"), and they are left there.
pub(crate) fn build(
    gpu: &Arc<Gpu>,
    opts: &GpuOptions,
    pool: &mut Pool,
    seeds: &Seeds,
    (old, old_region): (&Geometry, Region),
    (new, new_region, new_heap): (&Geometry, Region, Region),
    mut held: Option<&mut ImportedRegions>,
) -> Result<(Control, Option<ImportedRegions>)> {
    let cfg = config(gpu, opts, seeds, old, new)?;
    let source = cfg.source.expect("set above").windows;
    let mut laps = Laps::start("growth on the GPU");
    // Before the imports: a failure here leaves nothing imported to release.
    let (layout, pipelines) = pipelines(gpu, &cfg)?;
    laps.lap("pipelines");
    // The old table's imports are released after the build (those taken from `held` go back
    // there), the new regions' handed on.
    let mapping = pool.mapping();
    let (guard, mut handed) = (ImportGuard::default(), ImportedRegions::new(gpu, &mapping));
    let reason = staged_reason(mapping.backend(), opts.placement.into());
    let held_old = match (&reason, held.as_deref_mut()) {
        (None, Some(h)) => h.take_from(&mapping, old_region, source),
        _ => None,
    };
    let reused = held_old.is_some();
    let imported = match reason {
        Some(reason) => Err(reason),
        None => held_old
            .map_or_else(|| import_region(gpu, &mapping, old_region, source, &guard, "old table"), Ok)
            .and_then(|o| {
                Ok((o, import_region(gpu, &mapping, new_region, cfg.table, handed.guard(), "new table")?))
            }),
    };
    let (from, to, staged) = match imported {
        Ok((o, n)) => (o, n, false),
        Err(reason) => {
            log::info!("resizing on device copies: {reason}");
            release_imports(gpu, &guard);
            release_imports(gpu, handed.guard());
            let o = upload_region(gpu, pool, old_region, source, old.table_words(), "old table")?;
            let n = upload_region(gpu, pool, new_region, cfg.table, new.table_words(), "new table")?;
            (o, n, true)
        }
    };
    laps.lap("windows");
    let dev = &gpu.device;
    let scopes = ErrorScopes::push(dev);
    let buffer = |label, size: u64, usage| {
        dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage,
            mapped_at_creation: false,
        })
    };
    let storage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let ctl = buffer("control", (control::WORDS * 4) as u64, storage);
    let readback = buffer(
        "control readback",
        (control::WORDS * 4) as u64,
        wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
    );
    // Bindings the resize kernels do not use.
    let (unused_ro, unused_rw) = (buffer("unused", 256, storage), buffer("unused", 256, storage));
    let bindings = cfg.bindings();
    // The control block; every other buffer but the tables is unused (one dummy window each for
    // the heap, the cache's two regions and the allocator's bitmap).
    let control_binding = TABLE_BINDINGS.iter().position(|b| b.0 == "control").expect("bound") as u32;
    let mut entries: Vec<&wgpu::Buffer> = (0..FIRST_WINDOW_BINDING)
        .map(|i| match i {
            _ if i == control_binding => &ctl,
            _ if bindings[i as usize].read_only => &unused_ro,
            _ => &unused_rw,
        })
        .collect();
    entries.extend(to.iter());
    entries.extend([&unused_rw, &unused_rw, &unused_rw, &unused_rw]);
    entries.extend(from.iter());
    let bind = bind_group(dev, "resize", (&layout, &bindings), entries.iter().map(|b| b.as_entire_binding()));

    // One submit per kernel, each with its own invocation count in the parameters.
    // Invocations: one per old bucket, and one per old bottom slot, or 2^31 taking several
    // each where there are 2^32 or more (then the table's words are 64-bit: no round overflows).
    let bottom_slots = old.groups() * old.layout.slots as u64;
    let rehash_slots = if bottom_slots < 1 << 32 { bottom_slots } else { 1 << 31 };
    for ((kernel, pipeline), n) in pipelines.iter().zip([old.buckets(), rehash_slots]) {
        let p = Params { n: n as u32, ..Params::default() };
        let mut enc = dev.create_command_encoder(&Default::default());
        record_passes(&mut enc, (&[&bind], bytemuck::bytes_of(&p)), [(pipeline, n)], None);
        if *kernel == Kernel::Rehash {
            enc.copy_buffer_to_buffer(&ctl, 0, &readback, 0, (control::WORDS * 4) as u64);
        }
        gpu.submit([enc.finish()]);
    }
    if !staged {
        gpu.submit([hostmem::host_read_barrier(gpu)]);
    }
    // Checked before anything is read back: a refused submit built nothing.
    let submitted = scopes.pop(|| "building the grown table".into());
    laps.lap("submit");
    if !staged && submitted.is_ok() {
        // While the kernels run, the heap the grown table's engine binds, as it will split it.
        let [_, windows] = GpuEngine::windows(&gpu.info, opts, new);
        match import_region(gpu, &mapping, new_heap, windows, handed.guard(), "heap") {
            Ok(buffers) => handed.add(new_heap, windows, buffers),
            Err(e) => log::debug!("the grown heap is imported by its engine: {e}"),
        }
    }
    laps.lap("heap import");
    let built = submitted.and_then(|()| {
        let mut out = Control::default();
        map_read(gpu, &readback, 0..(control::WORDS * 4) as u64, |b| {
            out.copy_from_slice(bytemuck::cast_slice(b))
        })?;
        if staged {
            download_region(gpu, &to, cfg.table, new_region, pool)?;
        }
        Ok(out)
    });
    laps.lap("kernels");
    // Imported windows reference the pool, which may move next: released whatever happened,
    // but for the new table's, handed on after a build that succeeded.
    drop(bind);
    match held {
        Some(held) if reused && !staged => held.add(old_region, source, from),
        _ => from.into_iter().for_each(|b| b.destroy()),
    }
    release_imports(gpu, &guard);
    handed.add(new_region, cfg.table, to);
    let handed = (!staged && built.is_ok()).then_some(handed);
    laps.lap("release");
    Ok((built?, handed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process that exits (`std::process::exit`, no destructor runs) while a compile ahead
    /// runs waits for it: the test runs itself again as a child that exits at once.
    #[test]
    fn the_exit_waits_for_compiles_ahead() {
        const CHILD: &str = "GPHASH_TEST_EXIT_WAIT_MARKER";
        if let Ok(marker) = std::env::var(CHILD) {
            let compiling = Compiling::start();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                std::fs::write(&marker, b"compiled").expect("marker written");
                drop(compiling);
            });
            std::process::exit(0);
        }
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("marker");
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "gpu::resize::tests::the_exit_waits_for_compiles_ahead", "--test-threads", "1"])
            .env(CHILD, &marker)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "the child exited with {status}");
        assert_eq!(std::fs::read(&marker).ok().as_deref(), Some(&b"compiled"[..]), "the exit waited");
    }
}
