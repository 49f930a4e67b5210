//! Submits recorded with Vulkan itself, on the queue under wgpu: the same kernels (compiled from
//! the same WGSL by naga, as wgpu compiles them), bound to the same buffers, without wgpu's
//! validation, tracking and command buffers, which lengthen the bare round trip and a server's
//! write batch's recording and submitting (docs/lab/latency.md, "Submits through Vulkan
//! itself").
//!
//! What wgpu would do for its own submits, these do themselves: a barrier before each command
//! (the first one's covers wgpu's earlier submits, which may still write what it reads) and
//! after the last (for wgpu's later submits, and for the host's reads); the queue's external
//! synchronization ([`Gpu::submit_lock`]). What they cannot do, the caller must: keep every buffer bound or
//! copied alive until the submit is waited for, and bind only buffers whose contents wgpu
//! already regards as initialized (wgpu clears a buffer the first time one of its own submits
//! uses it, whatever a submit recorded here wrote into it before).

use std::sync::Arc;
use std::time::Instant;

use ash::vk;
use wgpu::hal::api::Vulkan;

use crate::Gpu;
use crate::context::RawVulkan;
use crate::error::{Error, Result};
use crate::hostmem::{WORK_ACCESS, WORK_STAGES, WORK_WRITES};
use crate::resources::Binding;
use crate::resources::grid;
use crate::shader::KernelEntry;

/// A Vulkan error as the plumbing's.
fn failed(what: &'static str) -> impl Fn(vk::Result) -> Error {
    move |r| Error::Gpu(format!("{what}: {r:?}"))
}

/// The raw handle of a wgpu buffer.
fn raw(buffer: &wgpu::Buffer) -> Result<vk::Buffer> {
    // SAFETY: the handle is only recorded; the caller keeps the buffer alive until the submit
    // that uses it was waited for (this module's contract).
    let hal =
        unsafe { buffer.as_hal::<Vulkan>() }.ok_or_else(|| Error::Gpu("a buffer not of Vulkan".into()))?;
    // SAFETY: as above.
    Ok(unsafe { hal.raw_handle() })
}

/// The SPIR-V options wgpu-hal takes on this device for our modules (its `naga_options`, with
/// the runtime checks of [`crate::resources::shader_module`]): the SPIR-V version of the
/// device's Vulkan version, indices restricted to their arrays, buffer accesses unchecked where
/// the device enables `robustBufferAccess2` (restricted otherwise), binding arrays unchecked,
/// no loop bounding, workgroup memory zeroed by the driver where it can; each binding at its
/// group's set.
fn spirv_options(vk: &RawVulkan, gpu: &Gpu) -> naga::back::spv::Options<'static> {
    use naga::proc::BoundsCheckPolicy::{Restrict, Unchecked};
    let (instance, physical) = (&vk.instance, vk.physical);
    // SAFETY: read-only queries of the live instance.
    let version = unsafe { instance.get_physical_device_properties(physical) }.api_version;
    let mut robust = vk::PhysicalDeviceRobustness2FeaturesEXT::default();
    let mut zeroed = vk::PhysicalDeviceVulkan13Features::default();
    let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut robust);
    if version >= vk::API_VERSION_1_3 {
        features = features.push_next(&mut zeroed);
    }
    // SAFETY: as above, into structures chained for the call.
    unsafe { instance.get_physical_device_features2(physical, &mut features) };
    // SAFETY: the extensions wgpu enabled, read.
    let robustness2 = unsafe { gpu.device.as_hal::<Vulkan>() }
        .is_some_and(|d| d.enabled_device_extensions().contains(&ash::ext::robustness2::NAME));
    let robust = robustness2 && robust.robust_buffer_access2 == vk::TRUE;
    let zeroed = version >= vk::API_VERSION_1_3 && zeroed.shader_zero_initialize_workgroup_memory == vk::TRUE;
    naga::back::spv::Options {
        lang_version: match version {
            v if v >= vk::API_VERSION_1_3 => (1, 6),
            v if v >= vk::API_VERSION_1_2 => (1, 5),
            _ => (1, 3),
        },
        flags: naga::back::spv::WriterFlags::empty(),
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: Restrict,
            buffer: if robust { Unchecked } else { Restrict },
            image_load: Restrict,
            binding_array: Unchecked,
        },
        zero_initialize_workgroup_memory: if zeroed {
            naga::back::spv::ZeroInitializeWorkgroupMemoryMode::Native
        } else {
            naga::back::spv::ZeroInitializeWorkgroupMemoryMode::Polyfill
        },
        force_loop_bounding: false,
        ..Default::default()
    }
}

/// SPIR-V of entry point `entry` of `wgsl`, written with `options`.
fn spirv(
    wgsl: &str,
    entry: &str,
    options: &naga::back::spv::Options,
) -> std::result::Result<Vec<u32>, String> {
    let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| e.emit_to_string(wgsl))?;
    let info =
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .map_err(|e| format!("{e:?}"))?;
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: entry.into(),
    };
    naga::back::spv::write_vec(&module, &info, options, Some(&pipeline)).map_err(|e| e.to_string())
}

/// Kernels compiled for submits recorded here, sharing one pipeline layout: bind groups of
/// `Binding`s (set `i` for group `i`) and immediates (push constants).
pub struct DirectPipelines<K> {
    /// Keeps the device alive until these are destroyed.
    gpu: Arc<Gpu>,
    vk: RawVulkan,
    sets: Vec<vk::DescriptorSetLayout>,
    layout: vk::PipelineLayout,
    pipelines: Vec<(K, vk::Pipeline)>,
}

impl<K: KernelEntry + Send> DirectPipelines<K> {
    /// Compiles `kernels` (each on a thread of its own), `source` giving each one's WGSL,
    /// with bind groups of `groups` and `immediates` bytes of immediates.
    pub fn build(
        gpu: &Arc<Gpu>,
        (groups, immediates): (&[&[Binding]], u32),
        kernels: &[K],
        source: impl Fn(K) -> Result<String> + Sync,
    ) -> Result<DirectPipelines<K>> {
        // SAFETY: only objects of this module's own are made and destroyed.
        let vk = unsafe { gpu.vulkan() }.ok_or_else(|| Error::Gpu("the device is not Vulkan".into()))?;
        let (sets, layout, pipelines) = (vec![], vk::PipelineLayout::null(), vec![]);
        let mut made = DirectPipelines { gpu: gpu.clone(), vk, sets, layout, pipelines };
        let d = &made.vk.device;
        for bindings in groups {
            let entries: Vec<vk::DescriptorSetLayoutBinding> = (0..)
                .zip(bindings.iter())
                .map(|(i, b)| {
                    vk::DescriptorSetLayoutBinding::default()
                        .binding(i)
                        .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                        .descriptor_count(b.array.unwrap_or(1))
                        .stage_flags(vk::ShaderStageFlags::COMPUTE)
                })
                .collect();
            let info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&entries);
            // SAFETY: plain object creation on the live device; destroyed by `drop`.
            let set = unsafe { d.create_descriptor_set_layout(&info, None) }
                .map_err(failed("vkCreateDescriptorSetLayout"))?;
            made.sets.push(set);
        }
        let ranges = [vk::PushConstantRange {
            stage_flags: vk::ShaderStageFlags::COMPUTE,
            offset: 0,
            size: immediates,
        }];
        let info = vk::PipelineLayoutCreateInfo::default()
            .set_layouts(&made.sets)
            .push_constant_ranges(if immediates > 0 { &ranges[..] } else { &[] });
        // SAFETY: as above.
        made.layout =
            unsafe { d.create_pipeline_layout(&info, None) }.map_err(failed("vkCreatePipelineLayout"))?;
        let options = spirv_options(&made.vk, gpu);
        let layout = made.layout;
        // As wgpu-hal makes its pipelines: the subgroup size is the device's choice.
        let flags = if gpu.device.features().contains(wgpu::Features::SUBGROUP) {
            vk::PipelineShaderStageCreateFlags::ALLOW_VARYING_SUBGROUP_SIZE
        } else {
            vk::PipelineShaderStageCreateFlags::empty()
        };
        let build = |k: K| -> Result<vk::Pipeline> {
            let code = spirv(&source(k)?, k.entry(), &options)
                .map_err(|e| Error::Shader(format!("{} ({}) for Vulkan itself: {e}", k.file(), k.entry())))?;
            // SAFETY: plain object creation; the module is destroyed once the pipeline is made.
            unsafe {
                let module = d
                    .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&code), None)
                    .map_err(failed("vkCreateShaderModule"))?;
                let name = std::ffi::CString::new(k.entry()).expect("an entry point's name");
                let stage = vk::PipelineShaderStageCreateInfo::default()
                    .flags(flags)
                    .stage(vk::ShaderStageFlags::COMPUTE)
                    .module(module)
                    .name(&name);
                let info = vk::ComputePipelineCreateInfo::default().stage(stage).layout(layout);
                let pipeline = d.create_compute_pipelines(vk::PipelineCache::null(), &[info], None);
                d.destroy_shader_module(module, None);
                pipeline.map(|p| p[0]).map_err(|(_, r)| failed("vkCreateComputePipelines")(r))
            }
        };
        let built: Vec<Result<vk::Pipeline>> = std::thread::scope(|s| {
            let threads: Vec<_> = kernels.iter().map(|&k| s.spawn(move || build(k))).collect();
            threads.into_iter().map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
        });
        // Every pipeline made is kept, so that `drop` destroys it, before an error is returned.
        let mut error = None;
        for (&k, p) in kernels.iter().zip(built) {
            match p {
                Ok(p) => made.pipelines.push((k, p)),
                Err(e) => error = error.or(Some(e)),
            }
        }
        error.map_or(Ok(made), Err)
    }

    /// A set of group `group` binding `resources`, in order from binding 0 (a binding array
    /// takes as many in a row as it holds), as [`crate::resources::bind_group`] binds them.
    pub fn set<'a>(
        &self,
        group: usize,
        bindings: &[Binding],
        resources: impl IntoIterator<Item = wgpu::BindingResource<'a>>,
    ) -> Result<DirectSet> {
        let infos = resources
            .into_iter()
            .map(|r| match r {
                wgpu::BindingResource::Buffer(b) => Ok(vk::DescriptorBufferInfo {
                    buffer: raw(b.buffer)?,
                    offset: b.offset,
                    range: b.size.map_or(vk::WHOLE_SIZE, |s| s.get()),
                }),
                _ => Err(Error::Gpu("a set binds buffers only".into())),
            })
            .collect::<Result<Vec<_>>>()?;
        let total: u32 = bindings.iter().map(|b| b.array.unwrap_or(1)).sum();
        assert_eq!(infos.len(), total as usize, "a resource for each buffer a binding takes");
        let d = &self.vk.device;
        let sizes =
            [vk::DescriptorPoolSize { ty: vk::DescriptorType::STORAGE_BUFFER, descriptor_count: total }];
        let info = vk::DescriptorPoolCreateInfo::default().max_sets(1).pool_sizes(&sizes);
        // SAFETY: plain object creation on the live device; the pool (and its set) is destroyed
        // by the set's `drop`.
        let pool =
            unsafe { d.create_descriptor_pool(&info, None) }.map_err(failed("vkCreateDescriptorPool"))?;
        let set = vk::DescriptorSet::null();
        let mut made = DirectSet { _gpu: self.gpu.clone(), device: d.clone(), pool, set };
        let layouts = [self.sets[group]];
        let alloc = vk::DescriptorSetAllocateInfo::default().descriptor_pool(pool).set_layouts(&layouts);
        // SAFETY: as above.
        made.set =
            unsafe { d.allocate_descriptor_sets(&alloc) }.map_err(failed("vkAllocateDescriptorSets"))?[0];
        let set = made.set;
        let mut at = 0;
        let writes: Vec<vk::WriteDescriptorSet> = (0..)
            .zip(bindings)
            .map(|(i, b)| {
                let n = b.array.unwrap_or(1) as usize;
                at += n;
                vk::WriteDescriptorSet::default()
                    .dst_set(set)
                    .dst_binding(i)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(&infos[at - n..at])
            })
            .collect();
        // SAFETY: the set is idle (just made); its buffers are the caller's to keep alive.
        unsafe { d.update_descriptor_sets(&writes, &[]) };
        Ok(made)
    }
}

impl<K: KernelEntry> DirectPipelines<K> {
    /// The pipeline of kernel `k`, which must have been built.
    fn get(&self, k: K) -> vk::Pipeline {
        self.pipelines.iter().find(|(kk, _)| *kk == k).expect("every kernel is built").1
    }
}

impl<K> Drop for DirectPipelines<K> {
    fn drop(&mut self) {
        let d = &self.vk.device;
        // SAFETY: the owner waited for every submit that used them (this module's contract).
        unsafe {
            for &(_, p) in &self.pipelines {
                d.destroy_pipeline(p, None);
            }
            d.destroy_pipeline_layout(self.layout, None);
            for &s in &self.sets {
                d.destroy_descriptor_set_layout(s, None);
            }
        }
    }
}

/// A descriptor set of [`DirectPipelines::set`]: wgpu's bind group, for submits recorded here.
pub struct DirectSet {
    /// Keeps the device alive until the set is destroyed.
    _gpu: Arc<Gpu>,
    device: ash::Device,
    pool: vk::DescriptorPool,
    set: vk::DescriptorSet,
}

impl Drop for DirectSet {
    fn drop(&mut self) {
        // SAFETY: the owner waited for every submit that used the set.
        unsafe { self.device.destroy_descriptor_pool(self.pool, None) };
    }
}

/// One command buffer and the timeline semaphore its submits signal (as wgpu's do: the host
/// polls its value in user space, where a fence's status may take a call into the kernel): a
/// submit recorded, submitted and waited for, then the next.
pub struct DirectSubmit {
    /// Keeps the device alive until these are destroyed.
    gpu: Arc<Gpu>,
    vk: RawVulkan,
    pool: vk::CommandPool,
    cmd: vk::CommandBuffer,
    timeline: vk::Semaphore,
    /// The value the last submit signals.
    submits: u64,
    /// Submitted and not yet seen done.
    pending: bool,
}

impl DirectSubmit {
    /// A command buffer on the queue under `gpu`.
    pub fn new(gpu: &Arc<Gpu>) -> Result<DirectSubmit> {
        // SAFETY: submits go through `Gpu::submit_lock`, and only objects made here are destroyed.
        let vk = unsafe { gpu.vulkan() }.ok_or_else(|| Error::Gpu("the device is not Vulkan".into()))?;
        let d = vk.device.clone();
        let info = vk::CommandPoolCreateInfo::default()
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER)
            .queue_family_index(vk.family);
        // SAFETY: plain object creation on the live device; destroyed by `drop` (null handles
        // of a failed step are ignored there).
        let pool = unsafe { d.create_command_pool(&info, None) }.map_err(failed("vkCreateCommandPool"))?;
        let mut made = DirectSubmit {
            gpu: gpu.clone(),
            vk,
            pool,
            cmd: vk::CommandBuffer::null(),
            timeline: vk::Semaphore::null(),
            submits: 0,
            pending: false,
        };
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: as above.
        unsafe {
            made.cmd = d.allocate_command_buffers(&alloc).map_err(failed("vkAllocateCommandBuffers"))?[0];
            let mut timeline =
                vk::SemaphoreTypeCreateInfo::default().semaphore_type(vk::SemaphoreType::TIMELINE);
            let info = vk::SemaphoreCreateInfo::default().push_next(&mut timeline);
            made.timeline = d.create_semaphore(&info, None).map_err(failed("vkCreateSemaphore"))?;
        }
        Ok(made)
    }

    /// Starts recording for kernels of `pipelines` (what a failed recording left is reset).
    /// The last submit must have been waited for.
    pub fn record<'a, K>(&'a mut self, pipelines: &'a DirectPipelines<K>) -> Result<Recorder<'a>> {
        assert!(!self.pending, "a submit recorded here is waited for before the next is recorded");
        let (d, cmd) = (&self.vk.device, self.cmd);
        let begin = vk::CommandBufferBeginInfo::default().flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // SAFETY: the command buffer is not pending (its last submit was waited for); its pool
        // lets it be reset, also from the recording state a failed recording left.
        unsafe {
            d.reset_command_buffer(cmd, vk::CommandBufferResetFlags::empty())
                .map_err(failed("vkResetCommandBuffer"))?;
            d.begin_command_buffer(cmd, &begin).map_err(failed("vkBeginCommandBuffer"))?;
        }
        Ok(Recorder { layout: pipelines.layout, submit: self })
    }

    /// Whether the last submit ran (without waiting).
    pub fn done(&self) -> Result<bool> {
        // SAFETY: the semaphore is live.
        let reached = || unsafe { self.vk.device.get_semaphore_counter_value(self.timeline) };
        Ok(!self.pending || reached().map_err(failed("vkGetSemaphoreCounterValue"))? >= self.submits)
    }

    /// Waits in the driver for the last submit.
    fn block(&self) -> std::result::Result<(), vk::Result> {
        let (semaphores, values) = ([self.timeline], [self.submits]);
        let info = vk::SemaphoreWaitInfo::default().semaphores(&semaphores).values(&values);
        // SAFETY: the semaphore is live.
        unsafe { self.vk.device.wait_semaphores(&info, u64::MAX) }
    }

    /// Waits for the last submit: polling for [`Gpu::wait_spin`], then in the driver.
    pub fn wait(&mut self) -> Result<()> {
        if !self.pending {
            return Ok(());
        }
        let started = Instant::now();
        while !self.done()? {
            if started.elapsed() >= self.gpu.wait_spin {
                self.block().map_err(failed("vkWaitSemaphores"))?;
                break;
            }
            std::hint::spin_loop();
        }
        self.pending = false;
        Ok(())
    }
}

impl Drop for DirectSubmit {
    fn drop(&mut self) {
        // A submit still running (its owner failed before waiting) finishes first; if even
        // that fails, the device is lost and nothing runs.
        if self.pending {
            let _ = self.block();
        }
        // SAFETY: nothing runs that uses them; null handles are ignored.
        unsafe {
            self.vk.device.destroy_semaphore(self.timeline, None);
            self.vk.device.destroy_command_pool(self.pool, None);
        }
    }
}

/// The commands of a submit being recorded ([`DirectSubmit::record`]): a barrier precedes each
/// command, so that it sees what those before it wrote (wgpu's earlier submits' too), as wgpu
/// orders the dispatches of a pass; [`Recorder::submit`] ends it.
pub struct Recorder<'a> {
    submit: &'a mut DirectSubmit,
    layout: vk::PipelineLayout,
}

impl Recorder<'_> {
    /// A barrier from every dispatch's and copy's writes before to the `after` stages' `access`
    /// (the engine's barriers through wgpu: `hostmem::WORK_STAGES`).
    fn barrier(&self, after: vk::PipelineStageFlags, access: vk::AccessFlags) {
        let b = vk::MemoryBarrier::default().src_access_mask(WORK_WRITES).dst_access_mask(access);
        // SAFETY: recording into the command buffer `record` began.
        unsafe {
            self.submit.vk.device.cmd_pipeline_barrier(
                self.submit.cmd,
                WORK_STAGES,
                after,
                Default::default(),
                &[b],
                &[],
                &[],
            )
        };
    }

    /// The barrier before a command.
    fn then(&self) {
        self.barrier(WORK_STAGES, WORK_ACCESS);
    }

    /// Ends the recording, with a barrier that makes its writes visible to everything after it
    /// and to the host, and submits it, under the queue's lock.
    pub fn submit(self) -> Result<()> {
        self.barrier(WORK_STAGES | vk::PipelineStageFlags::HOST, WORK_ACCESS | vk::AccessFlags::HOST_READ);
        let s = self.submit;
        let (cmds, signals, values) = ([s.cmd], [s.timeline], [s.submits + 1]);
        let mut timeline = vk::TimelineSemaphoreSubmitInfo::default().signal_semaphore_values(&values);
        let submit = vk::SubmitInfo::default()
            .command_buffers(&cmds)
            .signal_semaphores(&signals)
            .push_next(&mut timeline);
        let d = &s.vk.device;
        // SAFETY: the command buffer was recorded by `record`; the queue is taken only under
        // the lock every submit of this process takes.
        unsafe {
            d.end_command_buffer(s.cmd).map_err(failed("vkEndCommandBuffer"))?;
            let _queue = s.gpu.submit_lock();
            d.queue_submit(s.vk.queue, &[submit], vk::Fence::null()).map_err(failed("vkQueueSubmit"))?;
        }
        s.submits += 1;
        s.pending = true;
        Ok(())
    }

    /// Binds `sets` (set 0, 1, ...) and `immediates` for the dispatches that follow.
    pub fn bind(&self, sets: &[&DirectSet], immediates: &[u8]) {
        let (d, cmd) = (&self.submit.vk.device, self.submit.cmd);
        let sets: Vec<vk::DescriptorSet> = sets.iter().map(|s| s.set).collect();
        let compute = vk::PipelineBindPoint::COMPUTE;
        // SAFETY: recording; the sets and layout are live (the caller's).
        unsafe {
            d.cmd_bind_descriptor_sets(cmd, compute, self.layout, 0, &sets, &[]);
            if !immediates.is_empty() {
                d.cmd_push_constants(cmd, self.layout, vk::ShaderStageFlags::COMPUTE, 0, immediates);
            }
        }
    }

    /// `invocations` invocations of kernel `k` of `pipelines`, on wgpu's grid ([`grid`]).
    pub fn dispatch<K: KernelEntry>(&self, pipelines: &DirectPipelines<K>, k: K, invocations: u64) {
        self.then();
        let (d, cmd) = (&self.submit.vk.device, self.submit.cmd);
        let [x, y, z] = grid(invocations);
        // SAFETY: recording; the pipeline is live (the caller's).
        unsafe {
            d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, pipelines.get(k));
            d.cmd_dispatch(cmd, x, y, z);
        }
    }

    /// Zeroes `buffer` (all of it).
    pub fn clear(&self, buffer: &wgpu::Buffer) -> Result<()> {
        let buffer = raw(buffer)?;
        self.then();
        // SAFETY: recording; the buffer is the caller's to keep alive.
        unsafe { self.submit.vk.device.cmd_fill_buffer(self.submit.cmd, buffer, 0, vk::WHOLE_SIZE, 0) };
        Ok(())
    }

    /// Copies `bytes` from `src` at `from` to `dst` at `to`.
    pub fn copy(
        &self,
        (src, from): (&wgpu::Buffer, u64),
        (dst, to): (&wgpu::Buffer, u64),
        bytes: u64,
    ) -> Result<()> {
        let (src, dst) = (raw(src)?, raw(dst)?);
        let region = vk::BufferCopy { src_offset: from, dst_offset: to, size: bytes };
        self.then();
        // SAFETY: recording; the buffers are the caller's to keep alive.
        unsafe { self.submit.vk.device.cmd_copy_buffer(self.submit.cmd, src, dst, &[region]) };
        Ok(())
    }
}
