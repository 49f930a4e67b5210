//! Device resources shared by the engine and the resize: windows of pool regions (imported
//! or uploaded), pipelines, bind group layouts, readbacks.

use host_pm::{Backend, Pool, Region};

use super::context::{DeviceInfo, Gpu};
use super::engine::Placement;
use super::hostmem::{self, ImportGuard};
use super::shader::{self, Kernel, KernelConfig, WORKGROUP, Windows};
use crate::error::{Error, Result};

/// Dispatches `invocations` invocations (two-dimensional beyond 65535 workgroups).
pub fn dispatch(pass: &mut wgpu::ComputePass<'_>, invocations: u64) {
    let groups = invocations.div_ceil(WORKGROUP as u64).max(1);
    let x = groups.min(65535);
    pass.dispatch_workgroups(x as u32, groups.div_ceil(x) as u32, 1);
}

/// Maps `range` of a MAP_READ buffer, hands the bytes to `f`, unmaps.
pub fn map_read(
    gpu: &Gpu,
    buf: &wgpu::Buffer,
    range: std::ops::Range<u64>,
    f: impl FnOnce(&[u8]),
) -> Result<()> {
    let slice = buf.slice(range);
    let (tx, rx) = std::sync::mpsc::channel();
    slice.map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    gpu.wait()?;
    rx.recv()
        .map_err(|e| Error::Gpu(format!("mapping lost: {e}")))?
        .map_err(|e| Error::Gpu(format!("mapping a readback buffer: {e}")))?;
    {
        let view =
            slice.get_mapped_range().map_err(|e| Error::Gpu(format!("reading a readback buffer: {e:?}")))?;
        f(&view);
    }
    buf.unmap();
    Ok(())
}

/// The bind group layout of a kernel configuration: the uniform parameters at binding 0, then
/// storage buffers (read-only where the shaders declare them so).
pub fn bind_group_layout(dev: &wgpu::Device, cfg: &KernelConfig) -> wgpu::BindGroupLayout {
    let (bindings, read_only) = cfg.bindings();
    let entries: Vec<wgpu::BindGroupLayoutEntry> = (0..bindings)
        .map(|i| wgpu::BindGroupLayoutEntry {
            binding: i,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: match i {
                    0 => wgpu::BufferBindingType::Uniform,
                    _ => wgpu::BufferBindingType::Storage { read_only: read_only(i) },
                },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        })
        .collect();
    dev.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some("gphash"),
        entries: &entries,
    })
}

/// Compiles `kernels` for a configuration; a validation error names the kernel.
pub fn build_pipelines(
    gpu: &Gpu,
    cfg: &KernelConfig,
    layout: &wgpu::BindGroupLayout,
    kernels: &[Kernel],
) -> Result<Vec<(Kernel, wgpu::ComputePipeline)>> {
    let dev = &gpu.device;
    let pl = dev.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some("gphash"),
        bind_group_layouts: &[Some(layout)],
        immediate_size: 0,
    });
    let mut out = vec![];
    for &k in kernels {
        let src = shader::source(k, cfg)?;
        let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(k.file()),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
        let pipeline = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(k.file()),
            layout: Some(&pl),
            module: &module,
            entry_point: Some(k.entry()),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Shader(format!("{} ({}): {e}", k.file(), k.entry())));
        }
        out.push((k, pipeline));
    }
    Ok(out)
}

/// Imports every window of a region of the pool mapping; `Err` says why the driver refused.
///
/// A small probe goes first: the NVIDIA driver refuses `MAP_SHARED` files on disk filesystems
/// only after pinning what it was asked to import, and a refused import of hundreds of MiB
/// leaves later allocations out of memory.
pub fn import_region(
    gpu: &Gpu,
    pool: &mut Pool,
    region: Region,
    win: Windows,
    guard: &ImportGuard,
    label: &str,
) -> std::result::Result<Vec<wgpu::Buffer>, String> {
    let base = pool.as_mut_ptr();
    let import = |at: u64, len: u64| {
        // SAFETY: the range lies inside the pool mapping, which outlives the buffers: their
        // owners wait until `guard` reports every import destroyed before the pool moves.
        unsafe { hostmem::import(gpu, base.add((region.offset + at) as usize), len, guard, label) }
    };
    import(0, region.bytes.min(host_pm::REGION_ALIGN))?.destroy();
    release_imports(gpu, guard);
    (0..win.count)
        .map(|i| {
            let at = i as u64 * win.words() * 4;
            import(at, (region.bytes - at).min(win.words() * 4))
        })
        .collect()
}

/// Why a pool is not imported zero-copy, if it is not: staged placement was asked for, or the
/// pool is a file on a disk filesystem under automatic placement (NVIDIA refuses those, and a
/// refused import leaves later allocations of the device out of memory).
pub fn staged_reason(pool: &Pool, placement: Placement) -> Option<String> {
    match (placement, pool.backend()) {
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
            Ok(buf)
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
        let rb = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("download"),
            size: len,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(buf, 0, &rb, 0, len);
        gpu.queue.submit([enc.finish()]);
        let dst = &mut pool.bytes_mut()[at as usize..(at + len) as usize];
        map_read(gpu, &rb, 0..len, |bytes| dst.copy_from_slice(bytes))?;
    }
    Ok(())
}

/// The largest storage window the device and the options allow.
pub fn max_window(info: &DeviceInfo, max_window_bytes: Option<u64>) -> u64 {
    max_window_bytes.unwrap_or(info.max_binding).min(info.max_binding).min(info.max_buffer)
}

/// Waits until every buffer imported under `guard` is destroyed (the pool may then move).
pub fn release_imports(gpu: &Gpu, guard: &ImportGuard) {
    // wgpu frees buffers that never took part in a submit at the next submit.
    gpu.queue.submit([]);
    for _ in 0..100 {
        if guard.live() == 0 {
            return;
        }
        let _ = gpu.wait();
    }
    log::error!("{} imported buffers still alive after their owner was dropped", guard.live());
}

/// Refuses a configuration with more storage bindings than the device allows.
pub fn check_bindings(cfg: &KernelConfig, info: &DeviceInfo) -> Result<()> {
    let storage = cfg.bindings().0 - 1;
    if storage > info.max_storage_buffers {
        return Err(Error::InvalidConfig(format!(
            "the table needs {storage} storage bindings; {} allows {}",
            info.name, info.max_storage_buffers
        )));
    }
    Ok(())
}
