//! The bare round trip through Vulkan itself: the steps of wgpu's ([`RoundTripper`]): write
//! the input, one dispatch of `output[i] = input[i] + 1`, a copy into host memory, the wait and
//! the read, recorded and submitted as the engine's host batches are
//! ([`gphash_gpu::direct`]): the input and the copy in host memory imported for the device,
//! no wgpu on the way. Beside wgpu's, it shows what wgpu's validation, tracking and command
//! buffers add to a submit.
//!
//! [`RoundTripper`]: crate::ceiling::RoundTripper

use std::sync::Arc;
use std::time::{Duration, Instant};

use gphash::{Error, Gpu, Result};
use gphash_gpu::direct::{DirectPipelines, DirectSet, DirectSubmit};
use gphash_gpu::hostmem::HostBuffer;
use gphash_gpu::resources::{Binding, storage_buffer};
use gphash_gpu::shader::KernelEntry;

/// The round trip's one kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Increment;

impl KernelEntry for Increment {
    fn file(self) -> &'static str {
        "round trip"
    }

    fn entry(self) -> &'static str {
        "main"
    }
}

/// What a round trip records and submits. Its fields drop in order: the submit (which waits
/// for what still runs) before what it used.
pub struct VulkanRoundTripper {
    submit: DirectSubmit,
    set: DirectSet,
    pipelines: DirectPipelines<Increment>,
    input: HostBuffer,
    output: wgpu::Buffer,
    readback: HostBuffer,
    words: usize,
    rep: u32,
}

impl VulkanRoundTripper {
    /// The round trip of `items` words (at least one) through `kernel`, the WGSL of wgpu's
    /// round trip (`ceiling::round_trip_source`). `Err` on a device that imports no host
    /// memory.
    fn new(gpu: &Arc<Gpu>, items: u64, kernel: &str) -> Result<VulkanRoundTripper> {
        let words = items.max(1) as usize;
        let bytes = words as u64 * 4;
        // The kernel's input read-only, its output read-write.
        let bindings = Binding::plain(2, |i| i == 0);
        let source = |_| Ok(kernel.to_string());
        let pipelines = DirectPipelines::build(gpu, (&[&bindings[..]], 0), &[Increment], source)?;
        let host =
            |label| HostBuffer::new(gpu, bytes, label).map_err(|e| Error::Gpu(format!("{label}: {e}")));
        let (input, readback) = (host("round trip input")?, host("round trip readback")?);
        // Never bound by a wgpu submit, which would zero it at its first use: the module's rule
        // for buffers wgpu also uses does not concern it.
        let output = storage_buffer(&gpu.device, "round trip output", bytes);
        let input_binding = wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: input.buffer(),
            offset: 0,
            // The kernel takes the input's length for the words it has.
            size: wgpu::BufferSize::new(bytes),
        });
        let set = pipelines.set(0, &bindings, [input_binding, output.as_entire_binding()])?;
        let submit = DirectSubmit::new(gpu)?;
        Ok(VulkanRoundTripper { submit, set, pipelines, input, output, readback, words, rep: 0 })
    }

    /// [`VulkanRoundTripper::new`] where the device imports host memory, else `None`.
    pub fn on(gpu: &Arc<Gpu>, items: u64, kernel: &str) -> Result<Option<VulkanRoundTripper>> {
        gpu.info.host_import.then(|| Self::new(gpu, items, kernel)).transpose()
    }

    /// Words of each round trip.
    pub fn items(&self) -> u64 {
        self.words as u64
    }

    /// One round trip, timed: the input written into host memory the device reads, the
    /// dispatch and the copy into host memory recorded and submitted, the wait (polling first,
    /// as the engine's waits do) and the copy of the words out. `Err` if the words read back
    /// are not the input plus one.
    pub fn once(&mut self) -> Result<Duration> {
        let n = self.words;
        let rep = self.rep;
        self.rep = self.rep.wrapping_add(1);
        // Different words each time: a stale readback cannot pass the check.
        let words: Vec<u32> = (0..n).map(|i| (i as u32) ^ (rep << 24)).collect();
        let mut read = vec![0u32; n];
        let bytes = n * 4;
        let started = Instant::now();
        // SAFETY: no submit runs: the last one was waited for.
        let input = unsafe { self.input.bytes_mut() };
        input[..bytes].copy_from_slice(bytemuck::cast_slice(&words));
        let rec = self.submit.record(&self.pipelines)?;
        rec.bind(&[&self.set], &[]);
        rec.dispatch(&self.pipelines, Increment, n as u64);
        rec.copy((&self.output, 0), (self.readback.buffer(), 0), bytes as u64)?;
        rec.submit()?;
        self.submit.wait()?;
        // SAFETY: the submit that wrote it ended, behind its host-read barrier.
        bytemuck::cast_slice_mut(&mut read).copy_from_slice(&unsafe { self.readback.bytes() }[..bytes]);
        let took = started.elapsed();
        if let Some(i) = (0..n).find(|&i| read[i] != words[i].wrapping_add(1)) {
            return Err(Error::Gpu(format!(
                "Vulkan round trip of {n} words: word {i} read back as {} for {}",
                read[i], words[i]
            )));
        }
        Ok(took)
    }
}
