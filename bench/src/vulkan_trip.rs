//! The bare round trip through Vulkan itself: the same steps as wgpu's ([`RoundTripper`]):
//! write the input, one dispatch of `output[i] = input[i] + 1`, a copy into host memory, the
//! wait and the read, recorded and submitted with `ash` on the queue under wgpu, so that wgpu's
//! share of a round trip (its validation, tracking and command buffers) shows beside it.
//!
//! [`RoundTripper`]: crate::ceiling::RoundTripper

use std::time::{Duration, Instant};

use gphash::{Error, Gpu, Result};
use gphash_gpu::RawVulkan;
use gphash_gpu::ash::vk;
use gphash_gpu::shader;

/// A Vulkan error as the benchmark's.
fn vk_err(what: &'static str) -> impl Fn(vk::Result) -> Error {
    move |r| Error::Gpu(format!("{what}: {r:?}"))
}

/// The round trip's kernel as SPIR-V, from the WGSL wgpu compiles (naga, as wgpu does).
fn spirv(wgsl: &str) -> Result<Vec<u32>> {
    let fail = |e: String| Error::Gpu(format!("the round trip's kernel: {e}"));
    let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| fail(e.emit_to_string(wgsl)))?;
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), Default::default())
        .validate(&module)
        .map_err(|e| fail(format!("{e:?}")))?;
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: "main".into(),
    };
    naga::back::spv::write_vec(&module, &info, &Default::default(), Some(&pipeline))
        .map_err(|e| fail(e.to_string()))
}

/// A buffer and its memory, mapped when host-visible.
struct Memory {
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    mapped: *mut u32,
}

impl Memory {
    /// None yet.
    const NONE: Memory =
        Memory { buffer: vk::Buffer::null(), memory: vk::DeviceMemory::null(), mapped: std::ptr::null_mut() };
}

/// Everything a round trip records and submits; destroyed on drop.
pub struct VulkanRoundTripper<'g> {
    gpu: &'g Gpu,
    vk: RawVulkan,
    input: Memory,
    output: Memory,
    readback: Memory,
    set_layout: vk::DescriptorSetLayout,
    layout: vk::PipelineLayout,
    pipeline: vk::Pipeline,
    pool: vk::DescriptorPool,
    set: vk::DescriptorSet,
    commands: vk::CommandPool,
    cmd: vk::CommandBuffer,
    fence: vk::Fence,
    words: usize,
    rep: u32,
}

impl<'g> VulkanRoundTripper<'g> {
    /// The objects of a round trip of `items` words (at least one), through the queue under
    /// `gpu`. The caller submits nothing else to the GPU from another thread while it lives.
    pub fn new(gpu: &'g Gpu, items: u64) -> Result<VulkanRoundTripper<'g>> {
        // SAFETY: the round trip submits from the thread that times it, between wgpu's submits
        // of the same thread (the caller's contract), and destroys only what it made.
        let vk = unsafe { gpu.vulkan() }.ok_or_else(|| Error::Gpu("the device is not Vulkan".into()))?;
        let words = items.max(1) as usize;
        let code = spirv(&crate::ceiling::round_trip_source())?;
        let mut t = VulkanRoundTripper {
            gpu,
            vk,
            input: Memory::NONE,
            output: Memory::NONE,
            readback: Memory::NONE,
            set_layout: vk::DescriptorSetLayout::null(),
            layout: vk::PipelineLayout::null(),
            pipeline: vk::Pipeline::null(),
            pool: vk::DescriptorPool::null(),
            set: vk::DescriptorSet::null(),
            commands: vk::CommandPool::null(),
            cmd: vk::CommandBuffer::null(),
            fence: vk::Fence::null(),
            words,
            rep: 0,
        };
        // SAFETY: objects created on the live device; whatever was made is destroyed by `drop`
        // (null handles are ignored there), also when a step fails.
        unsafe { t.build(&code)? };
        Ok(t)
    }

    /// Makes the round trip's objects.
    unsafe fn build(&mut self, code: &[u32]) -> Result<()> {
        let bytes = self.words as u64 * 4;
        let usage = vk::BufferUsageFlags::STORAGE_BUFFER;
        let host = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        // SAFETY: the caller's (`new`'s) contract.
        unsafe {
            // As wgpu's: the input written by the host, the output in device memory, the
            // readback in host memory (cached where the device has it).
            self.input = self.memory(bytes, usage, host, vk::MemoryPropertyFlags::empty())?;
            self.output = self.memory(
                bytes,
                usage | vk::BufferUsageFlags::TRANSFER_SRC,
                vk::MemoryPropertyFlags::DEVICE_LOCAL,
                vk::MemoryPropertyFlags::empty(),
            )?;
            self.readback = self.memory(
                bytes,
                vk::BufferUsageFlags::TRANSFER_DST,
                host,
                vk::MemoryPropertyFlags::HOST_CACHED,
            )?;
            let d = &self.vk.device;
            let binding = |b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            };
            let bindings = [binding(0), binding(1)];
            self.set_layout = d
                .create_descriptor_set_layout(
                    &vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings),
                    None,
                )
                .map_err(vk_err("vkCreateDescriptorSetLayout"))?;
            let set_layouts = [self.set_layout];
            self.layout = d
                .create_pipeline_layout(
                    &vk::PipelineLayoutCreateInfo::default().set_layouts(&set_layouts),
                    None,
                )
                .map_err(vk_err("vkCreatePipelineLayout"))?;
            let module = d
                .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(code), None)
                .map_err(vk_err("vkCreateShaderModule"))?;
            let stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(module)
                .name(c"main");
            let info = vk::ComputePipelineCreateInfo::default().stage(stage).layout(self.layout);
            let made = d.create_compute_pipelines(vk::PipelineCache::null(), &[info], None);
            d.destroy_shader_module(module, None);
            self.pipeline = made.map_err(|(_, r)| vk_err("vkCreateComputePipelines")(r))?[0];
            let sizes =
                [vk::DescriptorPoolSize { ty: vk::DescriptorType::STORAGE_BUFFER, descriptor_count: 2 }];
            self.pool = d
                .create_descriptor_pool(
                    &vk::DescriptorPoolCreateInfo::default().max_sets(1).pool_sizes(&sizes),
                    None,
                )
                .map_err(vk_err("vkCreateDescriptorPool"))?;
            let alloc =
                vk::DescriptorSetAllocateInfo::default().descriptor_pool(self.pool).set_layouts(&set_layouts);
            self.set = d.allocate_descriptor_sets(&alloc).map_err(vk_err("vkAllocateDescriptorSets"))?[0];
            let whole = |m: &Memory| [vk::DescriptorBufferInfo { buffer: m.buffer, offset: 0, range: bytes }];
            let (input, output) = (whole(&self.input), whole(&self.output));
            let write = |b, info| {
                vk::WriteDescriptorSet::default()
                    .dst_set(self.set)
                    .dst_binding(b)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(info)
            };
            d.update_descriptor_sets(&[write(0, &input), write(1, &output)], &[]);
            let pool = vk::CommandPoolCreateInfo::default()
                .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER)
                .queue_family_index(self.vk.family);
            self.commands = d.create_command_pool(&pool, None).map_err(vk_err("vkCreateCommandPool"))?;
            let alloc = vk::CommandBufferAllocateInfo::default()
                .command_pool(self.commands)
                .level(vk::CommandBufferLevel::PRIMARY)
                .command_buffer_count(1);
            self.cmd = d.allocate_command_buffers(&alloc).map_err(vk_err("vkAllocateCommandBuffers"))?[0];
            self.fence = d.create_fence(&Default::default(), None).map_err(vk_err("vkCreateFence"))?;
        }
        Ok(())
    }

    /// A buffer of `bytes` with memory of the `need` properties (and `prefer` too where the
    /// device has such memory), mapped when host-visible.
    unsafe fn memory(
        &self,
        bytes: u64,
        usage: vk::BufferUsageFlags,
        need: vk::MemoryPropertyFlags,
        prefer: vk::MemoryPropertyFlags,
    ) -> Result<Memory> {
        let d = &self.vk.device;
        // SAFETY: the caller's (`new`'s) contract; the buffer is destroyed if its memory fails.
        unsafe {
            let info = vk::BufferCreateInfo::default().size(bytes).usage(usage);
            let buffer = d.create_buffer(&info, None).map_err(vk_err("vkCreateBuffer"))?;
            let req = d.get_buffer_memory_requirements(buffer);
            let props = self.vk.instance.get_physical_device_memory_properties(self.vk.physical);
            let types = &props.memory_types[..props.memory_type_count as usize];
            let fits = |i: usize, flags| {
                req.memory_type_bits & (1 << i) != 0 && types[i].property_flags.contains(flags)
            };
            let Some(index) = (0..types.len())
                .find(|&i| fits(i, need | prefer))
                .or_else(|| (0..types.len()).find(|&i| fits(i, need)))
            else {
                d.destroy_buffer(buffer, None);
                return Err(Error::Gpu(format!("no memory type with {need:?} for the round trip")));
            };
            let alloc =
                vk::MemoryAllocateInfo::default().allocation_size(req.size).memory_type_index(index as u32);
            let memory = match d.allocate_memory(&alloc, None) {
                Ok(m) => m,
                Err(r) => {
                    d.destroy_buffer(buffer, None);
                    return Err(vk_err("vkAllocateMemory")(r));
                }
            };
            let mut m = Memory { buffer, memory, mapped: std::ptr::null_mut() };
            let bound = d.bind_buffer_memory(buffer, memory, 0);
            let mapped = bound.and_then(|()| {
                if need.contains(vk::MemoryPropertyFlags::HOST_VISIBLE) {
                    d.map_memory(memory, 0, vk::WHOLE_SIZE, Default::default()).map(|p| p.cast())
                } else {
                    Ok(std::ptr::null_mut())
                }
            });
            match mapped {
                Ok(p) => m.mapped = p,
                Err(r) => {
                    Self::free(d, &m);
                    return Err(vk_err("binding or mapping the round trip's memory")(r));
                }
            }
            Ok(m)
        }
    }

    /// Destroys a buffer and frees its memory.
    unsafe fn free(d: &gphash_gpu::ash::Device, m: &Memory) {
        // SAFETY: the caller's: nothing uses `m` any more (null handles are ignored).
        unsafe {
            d.destroy_buffer(m.buffer, None);
            d.free_memory(m.memory, None);
        }
    }

    /// Words of each round trip.
    pub fn items(&self) -> u64 {
        self.words as u64
    }

    /// One round trip, timed: the input written into host memory the device reads, the command
    /// buffer recorded (one dispatch, a copy into host memory, barriers) and submitted with a
    /// fence, the wait (polling first, as the engine's waits do) and the copy of the words out.
    /// `Err` if the words read back are not the input plus one.
    pub fn once(&mut self) -> Result<Duration> {
        let n = self.words;
        let rep = self.rep;
        self.rep = self.rep.wrapping_add(1);
        let words: Vec<u32> = (0..n).map(|i| (i as u32) ^ (rep << 24)).collect();
        let mut read = vec![0u32; n];
        let d = &self.vk.device;
        let started = Instant::now();
        // SAFETY: the buffers hold `n` words and are mapped; the command buffer and fence are
        // idle (the last round trip waited for its fence); the queue's use is the caller's.
        unsafe {
            std::ptr::copy_nonoverlapping(words.as_ptr(), self.input.mapped, n);
            let cmd = self.cmd;
            d.begin_command_buffer(
                cmd,
                &vk::CommandBufferBeginInfo::default().flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
            )
            .map_err(vk_err("vkBeginCommandBuffer"))?;
            d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, self.pipeline);
            d.cmd_bind_descriptor_sets(cmd, vk::PipelineBindPoint::COMPUTE, self.layout, 0, &[self.set], &[]);
            // The grid of `gphash_gpu::resources::dispatch`.
            let groups = (n as u64).div_ceil(shader::WORKGROUP as u64).max(1);
            let x = groups.min(65535);
            d.cmd_dispatch(cmd, x as u32, groups.div_ceil(x) as u32, 1);
            let barrier = |src_stage, src, dst_stage, dst| {
                let b = vk::MemoryBarrier::default().src_access_mask(src).dst_access_mask(dst);
                d.cmd_pipeline_barrier(cmd, src_stage, dst_stage, Default::default(), &[b], &[], &[]);
            };
            barrier(
                vk::PipelineStageFlags::COMPUTE_SHADER,
                vk::AccessFlags::SHADER_WRITE,
                vk::PipelineStageFlags::TRANSFER,
                vk::AccessFlags::TRANSFER_READ,
            );
            let region = vk::BufferCopy { src_offset: 0, dst_offset: 0, size: n as u64 * 4 };
            d.cmd_copy_buffer(cmd, self.output.buffer, self.readback.buffer, &[region]);
            barrier(
                vk::PipelineStageFlags::TRANSFER,
                vk::AccessFlags::TRANSFER_WRITE,
                vk::PipelineStageFlags::HOST,
                vk::AccessFlags::HOST_READ,
            );
            d.end_command_buffer(cmd).map_err(vk_err("vkEndCommandBuffer"))?;
            let cmds = [cmd];
            let submit = vk::SubmitInfo::default().command_buffers(&cmds);
            d.queue_submit(self.vk.queue, &[submit], self.fence).map_err(vk_err("vkQueueSubmit"))?;
            self.wait()?;
            d.reset_fences(&[self.fence]).map_err(vk_err("vkResetFences"))?;
            std::ptr::copy_nonoverlapping(self.readback.mapped, read.as_mut_ptr(), n);
        }
        let took = started.elapsed();
        if let Some(i) = (0..n).find(|&i| read[i] != words[i].wrapping_add(1)) {
            return Err(Error::Gpu(format!(
                "Vulkan round trip of {n} words: word {i} read back as {} for {}",
                read[i], words[i]
            )));
        }
        Ok(took)
    }

    /// Waits for the fence: polling for as long as the engine's waits poll, then in the driver.
    unsafe fn wait(&self) -> Result<()> {
        let d = &self.vk.device;
        let started = Instant::now();
        // SAFETY: the fence is live and was submitted (the caller's).
        unsafe {
            while started.elapsed() < self.gpu.wait_spin {
                if d.get_fence_status(self.fence).map_err(vk_err("vkGetFenceStatus"))? {
                    return Ok(());
                }
                std::hint::spin_loop();
            }
            d.wait_for_fences(&[self.fence], true, u64::MAX).map_err(vk_err("vkWaitForFences"))
        }
    }
}

impl Drop for VulkanRoundTripper<'_> {
    fn drop(&mut self) {
        let d = &self.vk.device;
        // SAFETY: every round trip waited for its fence, so nothing made here is in use; null
        // handles (a `new` that failed part way) are ignored by Vulkan's destroy calls.
        unsafe {
            d.destroy_fence(self.fence, None);
            d.destroy_command_pool(self.commands, None);
            d.destroy_descriptor_pool(self.pool, None);
            d.destroy_pipeline(self.pipeline, None);
            d.destroy_pipeline_layout(self.layout, None);
            d.destroy_descriptor_set_layout(self.set_layout, None);
            for m in [&self.input, &self.output, &self.readback] {
                Self::free(d, m);
            }
        }
    }
}
