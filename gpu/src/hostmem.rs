//! Zero-copy import of host memory (the pool mapping, and a batch's operations in
//! [`HostBuffer`]) as wgpu storage buffers, through `VK_EXT_external_memory_host`; the wait
//! for the driver to let go of imports; and the barrier that makes GPU writes visible to the
//! host.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ash::vk;
use wgpu::hal::api::Vulkan;

use super::context::Gpu;

/// Counts imported buffers whose Vulkan objects are still alive. The pool mapping must not be
/// unmapped or moved while it is non-zero.
#[derive(Clone, Debug, Default)]
pub struct ImportGuard(Arc<AtomicUsize>);

impl ImportGuard {
    /// Imported buffers not yet destroyed.
    pub fn live(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// Imports `len` bytes at `ptr` as a storage buffer. `Err` carries the driver's reason; the
/// caller falls back to staged mode and reports why.
///
/// # Safety
/// `ptr .. ptr + len` must be a live, writable mapping aligned to the device's import
/// alignment, and must stay mapped until `guard.live()` drops back (the buffer's destruction
/// callback decrements it after the Vulkan objects are freed).
pub unsafe fn import(
    gpu: &Gpu,
    ptr: *mut u8,
    len: u64,
    guard: &ImportGuard,
    label: &str,
) -> Result<wgpu::Buffer, String> {
    // SAFETY: the caller's contract.
    unsafe { import_as(gpu, (ptr, len), guard, label, Import::default()) }.map(|(buffer, _)| buffer)
}

/// [`import`], and the buffer's device address, for kernels that read it through one
/// (`DeviceInfo::device_addresses`; `bench reach`).
///
/// # Safety
/// As [`import`].
pub unsafe fn import_addressable(
    gpu: &Gpu,
    ptr: *mut u8,
    len: u64,
    guard: &ImportGuard,
    label: &str,
) -> Result<(wgpu::Buffer, u64), String> {
    if !gpu.info.device_addresses {
        return Err("the device has no buffer device addresses".into());
    }
    let how = Import { addressable: true, ..Import::default() };
    // SAFETY: the caller's contract.
    unsafe { import_as(gpu, (ptr, len), guard, label, how) }
}

/// What an import asks for beyond a storage buffer.
#[derive(Clone, Copy, Default)]
struct Import {
    /// Refused unless the memory type is host-coherent (host and GPU then see each other's
    /// writes with no flush or invalidate).
    coherent_only: bool,
    /// The buffer has a device address (returned; 0 otherwise).
    addressable: bool,
}

/// [`import`] as `how` says, with the buffer's device address when it has one (else 0).
///
/// # Safety
/// As [`import`].
unsafe fn import_as(
    gpu: &Gpu,
    (ptr, len): (*mut u8, u64),
    guard: &ImportGuard,
    label: &str,
    how: Import,
) -> Result<(wgpu::Buffer, u64), String> {
    let align = gpu.info.import_alignment;
    if !gpu.info.host_import {
        return Err("the driver lacks VK_EXT_external_memory_host".into());
    }
    if align == 0 || !(ptr as u64).is_multiple_of(align) || !len.is_multiple_of(align) {
        return Err(format!("{ptr:p} + {len} is not aligned to {align} bytes"));
    }
    let (raw, inst, pd) = gpu.raw().ok_or("not a Vulkan device")?;
    let handle = vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;
    let ext = ash::ext::external_memory_host::Device::new(&inst, &raw);
    let mut host_props = vk::MemoryHostPointerPropertiesEXT::default();
    // SAFETY: valid device, handle type and pointer (caller contract).
    let r = unsafe {
        (ext.fp().get_memory_host_pointer_properties_ext)(
            raw.handle(),
            handle,
            ptr as *const c_void,
            &mut host_props,
        )
    };
    if r != vk::Result::SUCCESS {
        return Err(format!("vkGetMemoryHostPointerPropertiesEXT: {r:?}"));
    }
    let mut external = vk::ExternalMemoryBufferCreateInfo::default().handle_types(handle);
    let info = vk::BufferCreateInfo::default()
        .size(len)
        .usage(
            vk::BufferUsageFlags::STORAGE_BUFFER
                | vk::BufferUsageFlags::TRANSFER_SRC
                | vk::BufferUsageFlags::TRANSFER_DST
                | if how.addressable {
                    vk::BufferUsageFlags::SHADER_DEVICE_ADDRESS
                } else {
                    vk::BufferUsageFlags::empty()
                },
        )
        .sharing_mode(vk::SharingMode::EXCLUSIVE)
        .push_next(&mut external);
    // SAFETY: plain object creation on a live device.
    let buf = unsafe { raw.create_buffer(&info, None) }.map_err(|e| format!("vkCreateBuffer: {e:?}"))?;
    // SAFETY: `buf` was just created on `raw`; destroyed on every error path below.
    let req = unsafe { raw.get_buffer_memory_requirements(buf) };
    // SAFETY: a read-only query on the physical device of this live instance.
    let mem_props = unsafe { inst.get_physical_device_memory_properties(pd) };
    let bits = req.memory_type_bits & host_props.memory_type_bits;
    // The host keeps reading and writing the mapping (recovery, persist), which the spec allows
    // only for HOST_VISIBLE import types.
    let pick = |want: vk::MemoryPropertyFlags| {
        (0..mem_props.memory_type_count).find(|&i| {
            bits & (1 << i) != 0 && mem_props.memory_types[i as usize].property_flags.contains(want)
        })
    };
    let destroy = |why: String| {
        // SAFETY: `buf` is not bound or in use.
        unsafe { raw.destroy_buffer(buf, None) };
        Err(why)
    };
    let Some(index) = pick(vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT)
        .or_else(|| if how.coherent_only { None } else { pick(vk::MemoryPropertyFlags::HOST_VISIBLE) })
    else {
        return destroy(format!(
            "no host-visible memory type can import it (pointer types {:#x}, buffer types {:#x})",
            host_props.memory_type_bits, req.memory_type_bits
        ));
    };
    if req.size > len {
        return destroy(format!("the buffer needs {} bytes, more than {len}", req.size));
    }
    let mut import =
        vk::ImportMemoryHostPointerInfoEXT::default().handle_type(handle).host_pointer(ptr as *mut c_void);
    let mut flags = vk::MemoryAllocateFlagsInfo::default().flags(vk::MemoryAllocateFlags::DEVICE_ADDRESS);
    let mut alloc = vk::MemoryAllocateInfo::default()
        .allocation_size(len)
        .memory_type_index(index)
        .push_next(&mut import);
    if how.addressable {
        alloc = alloc.push_next(&mut flags);
    }
    // SAFETY: import of a live, aligned host range (caller contract).
    let mem = match unsafe { raw.allocate_memory(&alloc, None) } {
        Ok(m) => m,
        Err(e) => return destroy(format!("vkAllocateMemory (host pointer import): {e:?}")),
    };
    // SAFETY: fresh buffer and memory of sufficient size.
    if let Err(e) = unsafe { raw.bind_buffer_memory(buf, mem, 0) } {
        // SAFETY: `mem` was just allocated, is bound to nothing and is freed only here.
        unsafe { raw.free_memory(mem, None) };
        return destroy(format!("vkBindBufferMemory: {e:?}"));
    }
    let address = if how.addressable {
        // SAFETY: a buffer bound to memory allocated with a device address, on a device with
        // the feature enabled (`DeviceInfo::device_addresses`, which `import_addressable` checks).
        unsafe { raw.get_buffer_device_address(&vk::BufferDeviceAddressInfo::default().buffer(buf)) }
    } else {
        0
    };

    let counter = guard.0.clone();
    counter.fetch_add(1, Ordering::AcqRel);
    let raw_cb = raw.clone();
    // SAFETY: wgpu calls the callback once, after the GPU stopped using the buffer; we own both
    // Vulkan objects.
    let hal_buf = unsafe {
        wgpu::hal::vulkan::Buffer::from_raw_externally_owned(
            buf,
            Box::new(move || {
                raw_cb.destroy_buffer(buf, None);
                raw_cb.free_memory(mem, None);
                counter.fetch_sub(1, Ordering::AcqRel);
            }),
        )
    };
    // SAFETY: the hal buffer was created on this device with the usages declared here.
    let buffer = unsafe {
        gpu.device.create_buffer_from_hal::<Vulkan>(
            hal_buf,
            &wgpu::BufferDescriptor {
                label: Some(label),
                size: len,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            },
        )
    };
    Ok((buffer, address))
}

/// A command buffer holding only a barrier that makes shader and transfer writes visible to
/// host reads (wgpu does this only for mappable buffers). Submit it after the work.
pub fn host_read_barrier(gpu: &Gpu) -> wgpu::CommandBuffer {
    barrier(gpu, vk::PipelineStageFlags::HOST, vk::AccessFlags::HOST_READ)
}

/// A command buffer holding only a barrier that orders every shader and transfer write
/// submitted before it before every shader and transfer access after it, whatever wgpu
/// tracks: for work the host submits without waiting for what runs before it.
pub fn compute_barrier(gpu: &Gpu) -> wgpu::CommandBuffer {
    barrier(gpu, WORK_STAGES, WORK_ACCESS)
}

/// The stages of the engine's commands: dispatches and copies (and fills).
pub(crate) const WORK_STAGES: vk::PipelineStageFlags = vk::PipelineStageFlags::from_raw(
    vk::PipelineStageFlags::COMPUTE_SHADER.as_raw() | vk::PipelineStageFlags::TRANSFER.as_raw(),
);

/// Their writes.
pub(crate) const WORK_WRITES: vk::AccessFlags = vk::AccessFlags::from_raw(
    vk::AccessFlags::SHADER_WRITE.as_raw() | vk::AccessFlags::TRANSFER_WRITE.as_raw(),
);

/// Their reads and writes.
pub(crate) const WORK_ACCESS: vk::AccessFlags = vk::AccessFlags::from_raw(
    WORK_WRITES.as_raw() | vk::AccessFlags::SHADER_READ.as_raw() | vk::AccessFlags::TRANSFER_READ.as_raw(),
);

/// A command buffer holding only a barrier from shader and transfer writes to `dst` accesses.
fn barrier(gpu: &Gpu, dst_stages: vk::PipelineStageFlags, dst: vk::AccessFlags) -> wgpu::CommandBuffer {
    let raw = gpu.raw().map(|(device, _, _)| device);
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    // SAFETY: records one barrier into the encoder's live Vulkan command buffer.
    unsafe {
        enc.as_hal_mut::<Vulkan, _, _>(|e| {
            let (Some(e), Some(raw)) = (e, raw) else {
                return;
            };
            let barrier = vk::MemoryBarrier::default().src_access_mask(WORK_WRITES).dst_access_mask(dst);
            raw.cmd_pipeline_barrier(
                e.raw_handle(),
                WORK_STAGES,
                dst_stages,
                vk::DependencyFlags::empty(),
                &[barrier],
                &[],
                &[],
            );
        })
    };
    enc.finish()
}

/// Host memory of its own, imported as one storage buffer: the host writes a batch's inputs
/// into it and reads its results out of it in place, with no staging copy, no copy command
/// and no mapping on either side.
///
/// The host must touch it only while no submit that uses it runs (the engine's slots), and a
/// submit whose shaders or copies write it must end with [`host_read_barrier`].
pub struct HostBuffer {
    /// `None` once dropped (before the memory is freed).
    buffer: Option<wgpu::Buffer>,
    memory: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
    guard: ImportGuard,
    gpu: Arc<Gpu>,
}

// SAFETY: the memory is owned by the value, like a `Box<[u8]>`; the GPU's access to it is
// ordered by the submits that use it (see the type's contract).
unsafe impl Send for HostBuffer {}
// SAFETY: as for `Send`; through `&self` the host only reads, under `bytes`'s contract.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// `len` bytes (rounded up to the import alignment), zeroed and imported. `Err` carries
    /// why the driver would not import them (the caller falls back to device buffers).
    pub fn new(gpu: &Arc<Gpu>, len: u64, label: &str) -> Result<Self, String> {
        let align = gpu.info.import_alignment.max(1);
        let len = len.max(1).next_multiple_of(align);
        let layout =
            std::alloc::Layout::from_size_align(len as usize, align as usize).map_err(|e| e.to_string())?;
        // SAFETY: a layout of non-zero size.
        let memory = std::ptr::NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| format!("no host memory for {len} bytes"))?;
        let guard = ImportGuard::default();
        // Coherent only: nothing flushes it.
        let how = Import { coherent_only: true, ..Import::default() };
        // SAFETY: `memory` is `len` writable bytes aligned to the import alignment, freed only
        // in `drop` after `guard` counts no live import.
        match unsafe { import_as(gpu, (memory.as_ptr(), len), &guard, label, how) } {
            Ok((buffer, _)) => {
                Ok(HostBuffer { buffer: Some(buffer), memory, layout, guard, gpu: gpu.clone() })
            }
            Err(e) => {
                // SAFETY: allocated above with `layout`; nothing imported it.
                unsafe { std::alloc::dealloc(memory.as_ptr(), layout) };
                Err(e)
            }
        }
    }

    /// The imported buffer.
    pub fn buffer(&self) -> &wgpu::Buffer {
        self.buffer.as_ref().expect("live until dropped")
    }

    /// The memory, to read results.
    ///
    /// # Safety
    /// No submit that writes the buffer may run while the slice lives, and those before it must
    /// have ended behind [`host_read_barrier`].
    pub unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: `layout.size()` bytes owned by `self`, initialised (zeroed at allocation), not
        // written by the GPU while borrowed (the caller's contract).
        unsafe { std::slice::from_raw_parts(self.memory.as_ptr(), self.layout.size()) }
    }

    /// The memory, to write inputs.
    ///
    /// # Safety
    /// No submit that reads or writes the buffer may run while the slice lives.
    pub unsafe fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `bytes`, borrowed exclusively, and not read by the GPU meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.memory.as_ptr(), self.layout.size()) }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if let Some(b) = self.buffer.take() {
            b.destroy();
        }
        release_imports(&self.gpu, &self.guard);
        if self.guard.live() == 0 {
            // SAFETY: allocated in `new` with `layout`; the driver let go of its import.
            unsafe { std::alloc::dealloc(self.memory.as_ptr(), self.layout) };
        }
        // Otherwise leaked: the driver may still reach the memory (`release_imports` logged it).
    }
}

/// Waits until every buffer imported under `guard` is destroyed (the pool may then move).
pub fn release_imports(gpu: &Gpu, guard: &ImportGuard) {
    release_imports_to(gpu, guard, 0)
}

/// Waits until no more than `alive` buffers imported under `guard` are left.
pub(crate) fn release_imports_to(gpu: &Gpu, guard: &ImportGuard, alive: usize) {
    // wgpu frees buffers that never took part in a submit at the next submit.
    gpu.submit([]);
    for _ in 0..100 {
        if guard.live() <= alive {
            return;
        }
        let _ = gpu.wait();
    }
    log::error!("{} imported buffers still alive after their owner was dropped", guard.live() - alive);
}
