//! Resizing on the GPU: the grown table is built from the old one with the `relocate` and
//! `rehash` kernels (`shaders/resize.wgsl`), in place in the pool (zero-copy) or on device
//! copies that are then written back (staged).

use std::sync::Arc;

use gphash_gpu::Gpu;
use gphash_gpu::hostmem::{self, ImportGuard};
use gphash_gpu::resources::{
    ErrorScopes, bind_group, bind_group_layout, build_pipelines, download_region, import_region, map_read,
    max_window, record_passes, release_imports, staged_reason, upload_region,
};
use gphash_gpu::shader::{Reach, Windows};
use host_pm::{Pool, Region};

use super::engine::GpuOptions;
use super::shader::{
    self, CacheConfig, FIRST_WINDOW_BINDING, Kernel, KernelConfig, Params, Source, TABLE_BINDINGS,
};
use crate::error::Result;
use crate::hash::Seeds;
use crate::layout::Geometry;
use crate::model::Control;
use crate::profile::Laps;
use crate::protocol::control;

/// Builds the table `new` (zeroed, in region `new_region`) from `old` (in `old_region`);
/// returns the control block (keys rehashed, keys that found no slot).
pub(crate) fn build(
    gpu: &Arc<Gpu>,
    opts: &GpuOptions,
    pool: &mut Pool,
    seeds: &Seeds,
    (old, old_region): (&Geometry, Region),
    (new, new_region): (&Geometry, Region),
) -> Result<Control> {
    let window = max_window(&gpu.info, opts.max_window_bytes);
    let mut cfg = KernelConfig {
        geo: *new,
        seeds: seeds.clone(),
        tile: opts.tile,
        table: Windows::cover(new.table_words(), window),
        // The resize kernels touch no heap: one small dummy window.
        heap: Windows::cover(16, 64),
        cache: CacheConfig::off(),
        source: Some(Source {
            windows: Windows::cover(old.table_words(), window),
            top_level: old.top_level,
            keys_base: old.keys_base(),
            words: old.table_words(),
        }),
        // The resize kernels read no value.
        verify_values: false,
        reach: Reach::default(),
    };
    cfg.settle_reach(&gpu.info, opts.large_pool_mode)?;
    let source = cfg.source.expect("set above").windows;
    let mut laps = Laps::start("growth on the GPU");
    let guard = ImportGuard::default();
    let mapping = pool.mapping();
    let imported = match staged_reason(mapping.backend(), opts.placement.into()) {
        Some(reason) => Err(reason),
        None => import_region(gpu, &mapping, old_region, source, &guard, "old table")
            .and_then(|o| Ok((o, import_region(gpu, &mapping, new_region, cfg.table, &guard, "new table")?))),
    };
    let (from, to, staged) = match imported {
        Ok((o, n)) => (o, n, false),
        Err(reason) => {
            log::info!("resizing on device copies: {reason}");
            release_imports(gpu, &guard);
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
    let layout = bind_group_layout(dev, "resize", &bindings);
    // The resize kernels use no batch buffers: the table's bind group alone.
    let pipelines =
        build_pipelines(gpu, (&[&layout], Params::BYTES), &Kernel::RESIZE, |k| shader::source(k, &cfg))?;
    laps.lap("pipelines");
    // The control block; every other buffer but the tables is unused (one dummy window each for
    // the heap and the cache).
    let control_binding = TABLE_BINDINGS.iter().position(|b| b.0 == "control").expect("bound") as u32;
    let mut entries: Vec<&wgpu::Buffer> = (0..FIRST_WINDOW_BINDING)
        .map(|i| match i {
            _ if i == control_binding => &ctl,
            _ if bindings[i as usize].read_only => &unused_ro,
            _ => &unused_rw,
        })
        .collect();
    entries.extend(to.iter());
    entries.extend([&unused_rw, &unused_rw, &unused_rw]);
    entries.extend(from.iter());
    let bind = bind_group(dev, "resize", (&layout, &bindings), entries.iter().map(|b| b.as_entire_binding()));

    // One submit per kernel, each with its own invocation count in the parameters.
    let rehash_slots = old.groups() * old.layout.slots as u64;
    for ((kernel, pipeline), n) in pipelines.iter().zip([old.buckets(), rehash_slots]) {
        let p = Params { n: n as u32, ..Params::default() };
        let mut enc = dev.create_command_encoder(&Default::default());
        record_passes(&mut enc, (&[&bind], bytemuck::bytes_of(&p)), [(pipeline, n)], None);
        if *kernel == Kernel::Rehash {
            enc.copy_buffer_to_buffer(&ctl, 0, &readback, 0, (control::WORDS * 4) as u64);
        }
        gpu.queue.submit([enc.finish()]);
    }
    if !staged {
        gpu.queue.submit([hostmem::host_read_barrier(gpu)]);
    }
    // Checked before anything is read back: a refused submit built nothing.
    let built = scopes.pop(|| "building the grown table".into()).and_then(|()| {
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
    // Imported windows reference the pool, which may move next: released whatever happened.
    drop(bind);
    for b in from.into_iter().chain(to) {
        b.destroy();
    }
    release_imports(gpu, &guard);
    laps.lap("release");
    Ok(built?)
}
