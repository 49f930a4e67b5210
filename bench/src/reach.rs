//! How a kernel reaches a region of host memory larger than one storage binding
//! (docs/design.md, "Pools past 16 GiB"): the rate of random 128-byte requests over a region
//! imported zero-copy, read through
//! - a binding per window, the accessor switching on the window (small pools' way, as many
//!   windows as the device has storage bindings);
//! - one binding array of the windows, 64-bit word addresses (large pools' way);
//! - the region's buffer device address, in a SPIR-V kernel passed through (WGSL has no
//!   device addresses);
//!
//! and, for reference, the same requests over the region's first window alone, one binding.
//! Kernels: `shaders/reach.wgsl` (with the generated accessors of `gphash_gpu::shader`) and
//! `shaders/reach_address.comp`; each computes what [`model`] does.

use std::borrow::Cow;
use std::fmt;
use std::time::{Duration, Instant};

use gphash::{Error, Gpu, Result};
use gphash_gpu::hostmem::{self, ImportGuard, release_imports};
use gphash_gpu::resources::{
    Binding, bind_group, bind_group_layout, dispatch, download_words, shader_module,
};
use gphash_gpu::shader::{self, Files, Reach, SHARED, WORKGROUP, Windows};
use rayon::prelude::*;

use crate::ceiling::{Method, calibrated};

/// Bytes of one request: a line of 32 words, one per invocation.
pub const LINE_BYTES: u64 = 128;

/// Requests in flight per run: 32 invocations each.
const REQUESTS: u64 = 1 << 16;

/// The words the kernels read (each invocation one word of its request's line).
const INVOCATIONS: u64 = REQUESTS * 32;

/// Requests per invocation group in the check run, whose results are compared.
const CHECK_ITERS: u32 = 3;

/// How the kernel reaches the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// The region's first window alone, one binding: the reference.
    FirstWindow,
    /// A binding per window, the accessor switching.
    Bindings,
    /// One binding array of the windows, 64-bit word addresses.
    BindingArray,
    /// The region's buffer device address.
    DeviceAddress,
}

impl fmt::Display for Way {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Way::FirstWindow => "first window, one binding",
            Way::Bindings => "a binding per window",
            Way::BindingArray => "binding array",
            Way::DeviceAddress => "device address",
        })
    }
}

/// The requests of one way.
#[derive(Clone, Debug)]
pub struct Reached {
    /// How.
    pub way: Way,
    /// Bytes of the region its requests spread over.
    pub bytes: u64,
    /// Windows the region was split in (1 for a device address).
    pub windows: u32,
    /// Requests per second, sorted (one per repetition).
    pub rates: Vec<f64>,
}

impl Reached {
    /// The median rate.
    pub fn median(&self) -> f64 {
        self.rates[self.rates.len() / 2]
    }
}

/// The kernel file, stitched with gphash-gpu's shared files for the hash (`fmix`).
const KERNELS: Files = &[("reach.wgsl", include_str!("../shaders/reach.wgsl"))];

/// The device-address kernel, compiled from `shaders/reach_address.comp` (the command is at its
/// head).
const ADDRESS_SPIRV: &[u8] = include_bytes!("../shaders/reach_address.spv");

/// The kernels' immediates (`Params` of both).
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    base: u64,
    lines: u32,
    iters: u32,
    seed: u32,
    check: u32,
}

/// Word `i` of the region: what the host writes there before the runs.
pub fn word(i: u64) -> u32 {
    gphash::hash::fmix(i as u32 ^ (i >> 32) as u32 ^ 0x5bd1_e995)
}

/// What invocation `me` of a run of `iters` requests each (seed `seed`) over `lines` lines
/// computes: the XOR of the words it read.
pub fn model(me: u32, lines: u32, iters: u32, seed: u32) -> u32 {
    let fmix = gphash::hash::fmix;
    (0..iters).fold(0, |acc, it| {
        let line = fmix(((me / 32).wrapping_mul(0x9e37_79b9)) ^ fmix(it.wrapping_add(seed))) % lines;
        acc ^ word(line as u64 * 32 + (me % 32) as u64)
    })
}

/// A compiled way and what it binds.
struct Kernel {
    pipeline: wgpu::ComputePipeline,
    bind: wgpu::BindGroup,
    base: u64,
}

/// Measures each way over `bytes` of host memory (a multiple of 128) in windows of
/// `window_bytes` (a power of two), and checks that each read what [`model`] says. A way the
/// device cannot take (too many windows for its bindings, no binding arrays or 64-bit
/// integers, no device addresses) is left out, with a warning. With `huge_pages` the memory is
/// asked for in transparent huge pages (`MADV_HUGEPAGE`; how much the kernel gave is logged).
pub fn measure(
    gpu: &Gpu,
    (bytes, window_bytes): (u64, u64),
    huge_pages: bool,
    method: &Method,
) -> Result<Vec<Reached>> {
    let info = &gpu.info;
    let invalid = |why: String| Err(Error::InvalidConfig(why));
    if bytes == 0 || !bytes.is_multiple_of(LINE_BYTES) || bytes / LINE_BYTES > u32::MAX as u64 {
        return invalid(format!(
            "{bytes} bytes: must be a positive multiple of 128 of fewer than 2^32 lines"
        ));
    }
    // `Windows` makes windows of 64 words at least.
    if !window_bytes.is_power_of_two() || window_bytes < 256 || window_bytes > info.max_binding {
        return invalid(format!(
            "windows of {window_bytes} bytes: must be a power of two from 256 to the device's binding size ({})",
            info.max_binding
        ));
    }
    let align = info.import_alignment.max(1);
    if !info.host_import || !window_bytes.is_multiple_of(align) {
        return invalid(format!("host memory imports of {window_bytes}-byte windows are not available here"));
    }
    let mut host = memmap2::MmapMut::map_anon(bytes.next_multiple_of(align) as usize)
        .map_err(|source| Error::Io { what: "mapping host memory for `bench reach`".into(), source })?;
    if huge_pages {
        host.advise(memmap2::Advice::HugePage)
            .map_err(|source| Error::Io { what: "asking for huge pages".into(), source })?;
    }
    host.par_chunks_mut(1 << 20).enumerate().for_each(|(c, chunk)| {
        let first = (c as u64) << 18;
        for (i, w) in chunk.chunks_exact_mut(4).enumerate() {
            w.copy_from_slice(&word(first + i as u64).to_ne_bytes());
        }
    });
    if huge_pages {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let huge =
            meminfo.lines().find(|l| l.starts_with("AnonHugePages:")).unwrap_or("AnonHugePages: unknown");
        log::info!("{} MiB asked for in huge pages; the host now has {huge}", bytes >> 20);
    }
    let sink = gphash_gpu::resources::storage_buffer(&gpu.device, "reach sink", INVOCATIONS * 4);
    let guard = ImportGuard::default();
    let region = Region { base: host.as_mut_ptr(), bytes, window_bytes, align };
    let mut out = Vec::new();
    // Each phase drops its imports whatever its outcome, and they are released before the next
    // phase and before the memory is unmapped.
    let windows = through_windows(gpu, &region, (&sink, &guard), method, &mut out);
    release_imports(gpu, &guard);
    windows?;
    if info.device_addresses {
        let address = through_address(gpu, &region, (&sink, &guard), method, &mut out);
        release_imports(gpu, &guard);
        address?;
    } else {
        log::warn!("{} is not measured: the device has no buffer device addresses", Way::DeviceAddress);
    }
    drop(host);
    Ok(out)
}

/// The host memory measured: `bytes` at `base`, split in windows of `window_bytes`, imports
/// rounded up to `align`.
struct Region {
    base: *mut u8,
    bytes: u64,
    window_bytes: u64,
    align: u64,
}

/// The ways through windows (each imported on its own), onto `out`.
fn through_windows(
    gpu: &Gpu,
    r: &Region,
    (sink, guard): (&wgpu::Buffer, &ImportGuard),
    method: &Method,
    out: &mut Vec<Reached>,
) -> Result<()> {
    let info = &gpu.info;
    let windows = Windows::cover(r.bytes / 4, r.window_bytes);
    let imported: Vec<wgpu::Buffer> = (0..windows.count)
        .map(|i| {
            let at = i as u64 * r.window_bytes;
            let len = (r.bytes - at).min(r.window_bytes).next_multiple_of(r.align);
            // SAFETY: inside the mapping, which the caller unmaps only once the imports are
            // released.
            unsafe { hostmem::import(gpu, r.base.add(at as usize), len, guard, "reach window") }
        })
        .collect::<std::result::Result<_, _>>()
        .map_err(|why| Error::Gpu(format!("importing the windows: {why}")))?;
    let first = Windows { count: 1, shift: windows.shift };
    let ways = [
        (Way::FirstWindow, Reach::default(), first, r.bytes.min(r.window_bytes)),
        (Way::Bindings, Reach { wide: true, arrays: false }, windows, r.bytes),
        (Way::BindingArray, Reach { wide: true, arrays: true }, windows, r.bytes),
    ];
    for (way, reach, w, span) in ways {
        let fits = match way {
            Way::Bindings => w.count < info.max_storage_buffers && info.int64,
            Way::BindingArray => w.count <= info.binding_arrays && info.int64,
            _ => true,
        };
        if !fits {
            log::warn!("{way} is not measured: the device cannot bind {} windows that way", w.count);
            continue;
        }
        let kernel = windows_kernel(gpu, reach, w, sink, &imported[..w.count as usize])?;
        out.push(run(gpu, way, &kernel, sink, (span, w.count), method)?);
    }
    imported.iter().for_each(wgpu::Buffer::destroy);
    Ok(())
}

/// The way through the region's device address (one import of it all), onto `out`; a region
/// the driver will not import that way is left out, with a warning.
fn through_address(
    gpu: &Gpu,
    r: &Region,
    (sink, guard): (&wgpu::Buffer, &ImportGuard),
    method: &Method,
    out: &mut Vec<Reached>,
) -> Result<()> {
    let len = r.bytes.next_multiple_of(r.align);
    // SAFETY: the whole mapping, which the caller unmaps only once the import is released.
    match unsafe { hostmem::import_addressable(gpu, r.base, len, guard, "reach region") } {
        Ok((buffer, base)) => {
            let reached = address_kernel(gpu, sink, base)
                .and_then(|kernel| run(gpu, Way::DeviceAddress, &kernel, sink, (r.bytes, 1), method));
            buffer.destroy();
            out.push(reached?);
        }
        Err(why) => log::warn!("{} is not measured: {why}", Way::DeviceAddress),
    }
    Ok(())
}

/// The layout of a way's bindings: the sink, then `windows` (as a binding array or not).
fn layout(gpu: &Gpu, windows: Option<(Windows, bool)>) -> (wgpu::BindGroupLayout, Vec<Binding>) {
    let mut bindings = vec![Binding { read_only: false, array: None }];
    match windows {
        Some((w, true)) => bindings.push(Binding { read_only: false, array: Some(w.count) }),
        Some((w, false)) => bindings.extend(Binding::plain(w.count, |_| false)),
        None => {}
    }
    (bind_group_layout(&gpu.device, "reach", &bindings), bindings)
}

fn pipeline(gpu: &Gpu, layout: &wgpu::BindGroupLayout, module: &wgpu::ShaderModule) -> wgpu::ComputePipeline {
    let dev = &gpu.device;
    let pl = dev.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some("reach"),
        bind_group_layouts: &[Some(layout)],
        immediate_size: std::mem::size_of::<Params>() as u32,
    });
    dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("reach"),
        layout: Some(&pl),
        module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    })
}

/// The WGSL kernel over `windows` bound as `reach` says.
fn windows_kernel(
    gpu: &Gpu,
    reach: Reach,
    windows: Windows,
    sink: &wgpu::Buffer,
    imported: &[wgpu::Buffer],
) -> Result<Kernel> {
    let mut prelude = String::new();
    shader::write_consts(&mut prelude, 32, 1, (1, 1), &[]);
    shader::write_windows(&mut prelude, 1, &[("pool", false, windows)], reach);
    let source = reach.enables().to_string() + &shader::stitch("reach.wgsl", &prelude, &[SHARED, KERNELS])?;
    let (layout, bindings) = layout(gpu, Some((windows, reach.arrays)));
    let dev = &gpu.device;
    let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
    let module = shader_module(dev, "reach", source);
    let pipeline = pipeline(gpu, &layout, &module);
    let resources = std::iter::once(sink).chain(imported).map(wgpu::Buffer::as_entire_binding);
    let bind = bind_group(dev, "reach", (&layout, &bindings), resources);
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(Error::Shader(format!("reach kernel ({windows:?}, {reach:?}): {e}")));
    }
    Ok(Kernel { pipeline, bind, base: 0 })
}

/// The SPIR-V kernel reading the region at device address `base`.
fn address_kernel(gpu: &Gpu, sink: &wgpu::Buffer, base: u64) -> Result<Kernel> {
    assert_eq!(WORKGROUP, 128, "reach_address.comp's local_size_x is the kernels' workgroup");
    let (layout, bindings) = layout(gpu, None);
    let dev = &gpu.device;
    let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
    let words: Vec<u32> =
        ADDRESS_SPIRV.chunks_exact(4).map(|w| u32::from_le_bytes(w.try_into().unwrap())).collect();
    let entry = wgpu::PassthroughShaderEntryPoint { name: "main".into(), workgroup_size: (WORKGROUP, 1, 1) };
    // SAFETY: SPIR-V that spirv-val accepts for Vulkan 1.2 (made by glslangValidator from
    // `reach_address.comp`), whose bindings and immediates are the layout's; its loads stay
    // within the region (`line < lines`).
    let module = unsafe {
        dev.create_shader_module_passthrough(wgpu::ShaderModuleDescriptorPassthrough {
            label: Some("reach address"),
            entry_points: Cow::Owned(vec![entry]),
            spirv: Some(Cow::Owned(words)),
            ..Default::default()
        })
    };
    let pipeline = pipeline(gpu, &layout, &module);
    let bind = bind_group(dev, "reach", (&layout, &bindings), [sink.as_entire_binding()]);
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(Error::Shader(format!("reach address kernel: {e}")));
    }
    Ok(Kernel { pipeline, bind, base })
}

/// Checks `kernel` against the model over `lines`, then times it.
fn run(
    gpu: &Gpu,
    way: Way,
    kernel: &Kernel,
    sink: &wgpu::Buffer,
    (bytes, windows): (u64, u32),
    method: &Method,
) -> Result<Reached> {
    let lines = (bytes / LINE_BYTES) as u32;
    let once = |iters: u32, seed: u32, check: bool| -> Result<Duration> {
        let p = Params { base: kernel.base, lines, iters, seed, check: check as u32 };
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&kernel.pipeline);
            pass.set_bind_group(0, &kernel.bind, &[]);
            pass.set_immediates(0, bytemuck::bytes_of(&p));
            dispatch(&mut pass, INVOCATIONS);
        }
        let cmds = enc.finish();
        let t = Instant::now();
        gpu.submit([cmds]);
        gpu.wait()?;
        Ok(t.elapsed())
    };
    let seed = 7;
    once(CHECK_ITERS, seed, true)?;
    let got = download_words(gpu, sink, INVOCATIONS)?;
    if let Some(me) =
        (0..INVOCATIONS as u32).find(|&me| got[me as usize] != model(me, lines, CHECK_ITERS, seed))
    {
        return Err(Error::Gpu(format!(
            "{way}: invocation {me} read {:#x}, the model {:#x}",
            got[me as usize],
            model(me, lines, CHECK_ITERS, seed)
        )));
    }
    let rates =
        calibrated(method, |iters| iters as f64 * REQUESTS as f64, |iters, seed| once(iters, seed, false))?;
    Ok(Reached { way, bytes, windows, rates })
}
