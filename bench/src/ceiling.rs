//! Memory ceilings of the device, measured in the same run as the workloads: sequential
//! bandwidth and the rate of random requests (one subgroup reads or writes one run of 128 to
//! 512 contiguous bytes per request), and of 32-bit CAS, in device memory and in host memory
//! imported zero-copy (the way gphash reads a pool). Kernels: `shaders/ceiling.wgsl` and
//! `shaders/ceiling_cas.wgsl`, with the shared hash. And the latency floor of a batch: the bare
//! wgpu round trip of writing its input, one dispatch of a trivial kernel and reading the
//! output back ([`round_trips`]).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gphash::Gpu;
use gphash::{Error, Result};
use gphash_gpu::hostmem::{self, ImportGuard, release_imports};
use gphash_gpu::resources::{dispatch, map_read, scoped, shader_module, single_pipeline};
use gphash_gpu::shader::{self, Files, SHARED};

use crate::basic::spread;
use crate::vulkan_trip::VulkanRoundTripper;

/// Where the measured buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Device-local memory.
    Device,
    /// Anonymous host memory imported zero-copy (as a pool on tmpfs).
    Host,
}

impl fmt::Display for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Memory::Device => "device",
            Memory::Host => "host",
        })
    }
}

/// The ceilings of one memory.
#[derive(Clone, Debug, Default)]
pub struct Ceilings {
    /// Sequential reads, bytes per second.
    pub seq_read: f64,
    /// Sequential writes, bytes per second.
    pub seq_write: f64,
    /// Random reads of 128, 256 and 512 contiguous bytes, requests per second.
    pub random_read: [f64; 3],
    /// Random writes of 128 bytes, requests per second.
    pub random_write: f64,
    /// Random 32-bit compare-and-swaps per second.
    pub cas: f64,
}

impl Ceilings {
    /// The read rate a workload is held to: random reads of 128 to 512 bytes cost the same, so
    /// their median.
    pub fn reads(&self) -> f64 {
        let mut r = self.random_read;
        r.sort_by(f64::total_cmp);
        r[1]
    }

    /// The operation rate this memory allows for operations of traffic `t`: each kind of request
    /// at its measured rate (reads, writes, CAS), one after the other.
    pub fn op_rate(&self, t: &crate::systems::Traffic) -> f64 {
        let secs = t.reads / self.reads() + t.writes / self.random_write + t.atomics / self.cas;
        if secs > 0.0 { 1.0 / secs } else { 0.0 }
    }
}

impl fmt::Display for Ceilings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c] = self.random_read;
        write!(
            f,
            "sequential read {:.1} GB/s, write {:.1} GB/s | random reads {:.1} / {:.1} / {:.1} M requests/s (128 / 256 / 512 B), writes {:.1} M/s, CAS {:.1} M/s",
            self.seq_read / 1e9,
            self.seq_write / 1e9,
            a / 1e6,
            b / 1e6,
            c / 1e6,
            self.random_write / 1e6,
            self.cas / 1e6
        )
    }
}

/// Line sizes of the random-read test.
pub const LINE_BYTES: [u32; 3] = [128, 256, 512];

/// The ceiling kernels, stitched with gphash-gpu's shared files for the hash (`fmix`).
const KERNELS: Files = &[
    ("ceiling.wgsl", include_str!("../shaders/ceiling.wgsl")),
    ("ceiling_cas.wgsl", include_str!("../shaders/ceiling_cas.wgsl")),
];

/// The ceilings' prelude: what `common/hash.wgsl` needs (its key hash, which they never call,
/// is typed on the key's words).
const PRELUDE: &str = "const KEY_WORDS: u32 = 1u;\n";

/// The complete source of a ceiling kernel file.
fn source(file: &str) -> Result<String> {
    Ok(shader::stitch(file, PRELUDE, &[SHARED, KERNELS])?)
}

/// How a ceiling is measured.
#[derive(Clone, Debug)]
pub struct Method {
    /// Buffer size in bytes (a power of two; the device's binding limit caps it).
    pub bytes: u64,
    /// Repetitions of each test (the median is reported).
    pub reps: usize,
    /// Target duration of one repetition.
    pub target: Duration,
}

impl Default for Method {
    fn default() -> Self {
        Method { bytes: 1 << 30, reps: 5, target: Duration::from_millis(300) }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    words: u32,
    iters: u32,
    line_words: u32,
    seed: u32,
}

/// The compiled ceiling kernels and the buffers of one memory.
struct Bench<'a> {
    gpu: &'a Gpu,
    layout: wgpu::BindGroupLayout,
    pipelines: Vec<(&'static str, wgpu::ComputePipeline)>,
    params: wgpu::Buffer,
    sink: wgpu::Buffer,
}

impl<'a> Bench<'a> {
    fn new(gpu: &'a Gpu) -> Result<Bench<'a>> {
        let dev = &gpu.device;
        let entry = |binding, ty| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer { ty, has_dynamic_offset: false, min_binding_size: None },
            count: None,
        };
        let storage = wgpu::BufferBindingType::Storage { read_only: false };
        let layout = dev.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("ceiling"),
            entries: &[entry(0, wgpu::BufferBindingType::Uniform), entry(1, storage), entry(2, storage)],
        });
        let pl = dev.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("ceiling"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        // Stitched before the error scope opens: a failure returns with no scope left open.
        let sources = [source("ceiling.wgsl")?, source("ceiling_cas.wgsl")?];
        let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
        // Compiled as gphash's kernels are, so that the ceilings hold them to the same code.
        let [main, cas] = sources.map(|src| shader_module(dev, "ceiling", src));
        let pipelines = [
            ("seq_read", &main),
            ("seq_write", &main),
            ("random_read", &main),
            ("random_write", &main),
            ("cas", &cas),
        ]
        .into_iter()
        .map(|(entry, module)| {
            let p = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: Some(&pl),
                module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            });
            (entry, p)
        })
        .collect();
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Shader(format!("ceiling kernels: {e}")));
        }
        let buffer = |label, size, usage| {
            dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage,
                mapped_at_creation: false,
            })
        };
        let params = buffer("params", 16, wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST);
        let sink = buffer("sink", 1 << 20, wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC);
        Ok(Bench { gpu, layout, pipelines, params, sink })
    }

    /// Runs kernel `entry` over `data` `reps` times after calibrating its work to the target
    /// duration; the median wall time per unit of work (`units(iters)`).
    fn time(
        &self,
        entry: &str,
        data: &wgpu::Buffer,
        line_words: u32,
        invocations: u64,
        method: &Method,
        units: impl Fn(u32) -> f64,
    ) -> Result<f64> {
        let dev = &self.gpu.device;
        let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("ceiling"),
            layout: &self.layout,
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: self.params.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 1, resource: data.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 2, resource: self.sink.as_entire_binding() },
            ],
        });
        let pipeline = &self.pipelines.iter().find(|(e, _)| *e == entry).expect("known entry").1;
        let words = (data.size() / 4) as u32;
        let run = |iters: u32, seed: u32| -> Result<Duration> {
            let p = Params { words, iters, line_words, seed };
            self.gpu.queue.write_buffer(&self.params, 0, bytemuck::bytes_of(&p));
            let mut enc = dev.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(pipeline);
                pass.set_bind_group(0, &bind, &[]);
                dispatch(&mut pass, invocations);
            }
            self.gpu.submit([]);
            self.gpu.wait()?;
            let t = Instant::now();
            self.gpu.submit([enc.finish()]);
            self.gpu.wait()?;
            Ok(t.elapsed())
        };
        let rates = calibrated(method, units, run)?;
        // The sink keeps the reads alive; reading it back also proves the kernels ran.
        let mut sum = 0u32;
        map_read_sink(self.gpu, &self.sink, &mut sum)?;
        Ok(rates[rates.len() / 2])
    }

    fn measure(&self, data: &wgpu::Buffer, method: &Method) -> Result<Ceilings> {
        let info = &self.gpu.info;
        let sg = info.subgroup_sizes.1.max(1) as u64;
        let words = data.size() / 4;
        // Sequential: each invocation streams vec4s with a grid stride; enough invocations to
        // fill the device.
        let seq_inv: u64 = 1 << 20;
        let seq_bytes = |iters: u32| iters as f64 * data.size() as f64;
        let seq_read = self.time("seq_read", data, 4, seq_inv, method, seq_bytes)?;
        let seq_write = self.time("seq_write", data, 4, seq_inv, method, seq_bytes)?;
        // Random: one request per subgroup per iteration.
        let subgroups: u64 = 1 << 16;
        let requests = |iters: u32| iters as f64 * subgroups as f64;
        let mut random_read = [0.0; 3];
        for (i, bytes) in LINE_BYTES.into_iter().enumerate() {
            random_read[i] = self.time("random_read", data, bytes / 4, subgroups * sg, method, requests)?;
        }
        let random_write = self.time("random_write", data, 32, subgroups * sg, method, requests)?;
        let cas_inv: u64 = (1 << 20).min(words);
        let cas = self.time("cas", data, 1, cas_inv, method, |iters| iters as f64 * cas_inv as f64)?;
        Ok(Ceilings { seq_read, seq_write, random_read, random_write, cas })
    }
}

/// The rates (`units(iters)` over the time of `run(iters, seed)`) of `method.reps` runs, sorted,
/// with the work per run (`iters`) calibrated to `method.target`: doubled until one run lasts a
/// tenth of it, then scaled to it.
pub(crate) fn calibrated(
    method: &Method,
    units: impl Fn(u32) -> f64,
    run: impl Fn(u32, u32) -> Result<Duration>,
) -> Result<Vec<f64>> {
    let mut iters = 1u32;
    while run(iters, 0)? < method.target / 10 && iters < 1 << 20 {
        iters *= 2;
    }
    let scaled =
        ((iters as f64) * (method.target.as_secs_f64() / run(iters, 1)?.as_secs_f64()).max(1.0)) as u32;
    let mut rates: Vec<f64> = (0..method.reps.max(1))
        .map(|r| Ok(units(scaled) / run(scaled, 2 + r as u32)?.as_secs_f64()))
        .collect::<Result<_>>()?;
    rates.sort_by(f64::total_cmp);
    Ok(rates)
}

fn map_read_sink(gpu: &Gpu, sink: &wgpu::Buffer, sum: &mut u32) -> Result<()> {
    let rb = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("sink readback"),
        size: 256,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(sink, 0, &rb, 0, 256);
    gpu.submit([enc.finish()]);
    Ok(map_read(gpu, &rb, 0..256, |b| {
        *sum = bytemuck::cast_slice::<u8, u32>(b).iter().fold(0, |a, &w| a ^ w)
    })?)
}

/// Measures the ceilings of device memory and of imported host memory.
pub fn measure(gpu: &Gpu, method: &Method) -> Result<Vec<(Memory, Ceilings)>> {
    let bench = Bench::new(gpu)?;
    let bytes = method.bytes.min(gpu.info.max_binding.next_power_of_two() / 2).max(1 << 20);
    let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let device = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("ceiling device"),
        size: bytes,
        usage,
        mapped_at_creation: false,
    });
    let mut out = vec![(Memory::Device, bench.measure(&device, method)?)];
    drop(device);
    let mut host = memmap2::MmapMut::map_anon(bytes as usize)
        .map_err(|source| Error::Io { what: "mapping host memory for the ceilings".into(), source })?;
    let guard = ImportGuard::default();
    // SAFETY: the mapping outlives the import: we wait for its release before unmapping.
    let imported = unsafe { hostmem::import(gpu, host.as_mut_ptr(), bytes, &guard, "ceiling host") };
    match imported {
        Ok(buffer) => {
            let c = bench.measure(&buffer, method);
            buffer.destroy();
            drop(buffer);
            release_imports(gpu, &guard);
            out.push((Memory::Host, c?));
        }
        Err(why) => log::warn!("host-memory ceilings not measured: {why}"),
    }
    drop(host);
    Ok(out)
}

/// Items of the round trips `bench ceilings` and `bench suite` measure.
pub const ROUND_TRIP_ITEMS: [u64; 3] = [4096, 1 << 16, 1 << 20];

/// Repetitions of each round trip they measure.
pub const ROUND_TRIP_REPS: usize = 200;

/// How a round trip is recorded and submitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// Through wgpu, as the engine's batches are: the floor a batch's latency is measured against.
    Wgpu,
    /// Through Vulkan itself ([`VulkanRoundTripper`]): what wgpu's validation, tracking and
    /// command buffers add shows as the difference.
    Vulkan,
}

impl fmt::Display for Via {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Via::Wgpu => "wgpu",
            Via::Vulkan => "Vulkan",
        })
    }
}

/// The bare round trip of `items` 32-bit words: the least a batch of that many operations
/// can take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoundTrip {
    /// Through wgpu or Vulkan itself.
    pub via: Via,
    /// Words written, incremented and read back.
    pub items: u64,
    /// Repetitions measured.
    pub reps: usize,
    /// Their median.
    pub median: Duration,
    /// Their minimum.
    pub min: Duration,
    /// Their maximum.
    pub max: Duration,
}

impl fmt::Display for RoundTrip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        write!(
            f,
            "{:<6} {:>8} items: median {:.4} ms, min {:.4} ms, max {:.4} ms ({} repetitions)",
            self.via,
            self.items,
            ms(self.median),
            ms(self.min),
            ms(self.max),
            self.reps
        )
    }
}

/// The round trip's kernel: one invocation per word.
const ROUND_TRIP: &str = "
@group(0) @binding(0) var<storage, read> input: array<u32>;
@group(0) @binding(1) var<storage, read_write> output: array<u32>;
@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = (wid.y * nwg.x + wid.x) * WGu + li;
    if (i < arrayLength(&input)) {
        output[i] = input[i] + 1u;
    }
}";

pub(crate) fn round_trip_source() -> String {
    ROUND_TRIP.replace("WG", &shader::WORKGROUP.to_string())
}

/// Measures the round trip of each of `items` words, `reps` times each (after a few unmeasured
/// ones): `queue.write_buffer` of the input, one dispatch of `output[i] = input[i] + 1`, a copy
/// into a mappable buffer, the map and the copy of the words out, as an engine's batch does;
/// and, timed in turn with it where the device imports host memory, the same through Vulkan
/// itself ([`VulkanRoundTripper`]). For each count, wgpu's round trip then Vulkan's. `Err` if
/// the words read back are not the input plus one.
pub fn round_trips(gpu: &Arc<Gpu>, items: &[u64], reps: usize) -> Result<Vec<RoundTrip>> {
    let pipeline = RoundTripper::pipeline(gpu)?;
    let mut out = vec![];
    for &n in items {
        let mut wgpu = RoundTripper::with_pipeline(gpu, pipeline.clone(), n)?;
        let mut vulkan = VulkanRoundTripper::on(gpu, n, &round_trip_source())?;
        const WARMUP: usize = 3;
        let (mut a, mut b) = (vec![], vec![]);
        for rep in 0..WARMUP + reps.max(1) {
            let t = wgpu.once()?;
            let v = vulkan.as_mut().map(VulkanRoundTripper::once).transpose()?;
            if rep >= WARMUP {
                a.push(t);
                b.extend(v);
            }
        }
        for (via, times) in [(Via::Wgpu, a), (Via::Vulkan, b)] {
            if !times.is_empty() {
                let (median, min, max) = spread(times);
                out.push(RoundTrip { via, items: wgpu.items(), reps: reps.max(1), median, min, max });
            }
        }
    }
    Ok(out)
}

/// The bare round trip of a number of words, ready to be timed one at a time (`bench profile
/// --alternate` times it between a table's batches).
pub struct RoundTripper<'g> {
    gpu: &'g Gpu,
    pipeline: wgpu::ComputePipeline,
    input: wgpu::Buffer,
    output: wgpu::Buffer,
    readback: wgpu::Buffer,
    bind: wgpu::BindGroup,
    words: Vec<u32>,
    read: Vec<u32>,
    rep: u32,
}

impl<'g> RoundTripper<'g> {
    fn pipeline(gpu: &Gpu) -> Result<wgpu::ComputePipeline> {
        Ok(single_pipeline(&gpu.device, "round trip kernel", round_trip_source())?)
    }

    /// The buffers of a round trip of `items` words (at least one).
    pub fn new(gpu: &'g Gpu, items: u64) -> Result<RoundTripper<'g>> {
        RoundTripper::with_pipeline(gpu, RoundTripper::pipeline(gpu)?, items)
    }

    fn with_pipeline(gpu: &'g Gpu, pipeline: wgpu::ComputePipeline, items: u64) -> Result<RoundTripper<'g>> {
        let dev = &gpu.device;
        let n = items.max(1);
        let bytes = n * 4;
        let (input, output, readback, bind) = scoped(dev, "the round trip's buffers", || {
            let buffer = |label, usage| {
                dev.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size: bytes,
                    usage,
                    mapped_at_creation: false,
                })
            };
            let input =
                buffer("round trip input", wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST);
            let output =
                buffer("round trip output", wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC);
            let readback =
                buffer("round trip readback", wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST);
            let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("round trip"),
                layout: &pipeline.get_bind_group_layout(0),
                entries: &[
                    wgpu::BindGroupEntry { binding: 0, resource: input.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 1, resource: output.as_entire_binding() },
                ],
            });
            (input, output, readback, bind)
        })?;
        Ok(RoundTripper {
            gpu,
            pipeline,
            input,
            output,
            readback,
            bind,
            words: vec![0; n as usize],
            read: Vec::with_capacity(n as usize),
            rep: 0,
        })
    }

    /// Words of each round trip.
    pub fn items(&self) -> u64 {
        self.words.len() as u64
    }

    /// One round trip, timed: `queue.write_buffer` of the input, one dispatch of
    /// `output[i] = input[i] + 1`, a copy into a mappable buffer, the map and the copy of the
    /// words out, as an engine's batch does. `Err` if the words read back are not the input
    /// plus one.
    pub fn once(&mut self) -> Result<Duration> {
        let (gpu, n) = (self.gpu, self.words.len());
        let bytes = n as u64 * 4;
        // Different words each time: a stale readback cannot pass the check.
        let rep = self.rep;
        self.rep = self.rep.wrapping_add(1);
        self.words.iter_mut().enumerate().for_each(|(i, w)| *w = (i as u32) ^ (rep << 24));
        let started = Instant::now();
        gpu.queue.write_buffer(&self.input, 0, bytemuck::cast_slice(&self.words));
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&self.pipeline);
            pass.set_bind_group(0, &self.bind, &[]);
            dispatch(&mut pass, n as u64);
        }
        enc.copy_buffer_to_buffer(&self.output, 0, &self.readback, 0, bytes);
        gpu.submit([enc.finish()]);
        self.read.clear();
        let read = &mut self.read;
        map_read(gpu, &self.readback, 0..bytes, |b| {
            read.extend_from_slice(bytemuck::cast_slice::<u8, u32>(b))
        })?;
        let took = started.elapsed();
        if let Some(i) = (0..n).find(|&i| self.read[i] != self.words[i].wrapping_add(1)) {
            return Err(Error::Gpu(format!(
                "round trip of {n} words: word {i} read back as {} for {}",
                self.read[i], self.words[i]
            )));
        }
        Ok(took)
    }
}

#[cfg(test)]
mod tests {
    use super::{KERNELS, Params, round_trip_source, source};

    /// The kernels validate, and read the uniform with the layout the host writes.
    #[test]
    fn ceiling_kernels_validate() {
        for (file, _) in KERNELS {
            let module = gphash_gpu::shader::check(file, &source(file).unwrap()).unwrap();
            let rust = gphash_gpu::rust_layout!(Params { words, iters, line_words, seed });
            assert_eq!(gphash_gpu::shader::wgsl_layout(&module, "Params"), Some(rust));
        }
        gphash_gpu::shader::check("round trip", &round_trip_source()).unwrap();
    }
}
