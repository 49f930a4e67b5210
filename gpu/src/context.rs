//! The wgpu device gphash runs on: a Vulkan adapter with subgroups, and
//! `VK_EXT_external_memory_host` enabled where the driver has it (for zero-copy pools).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ash::vk;
use wgpu::hal::api::Vulkan;

use crate::error::{Error, Result};

/// Environment variable naming a substring of the adapter to use.
pub const ADAPTER_ENV: &str = "GPHASH_ADAPTER";

/// Environment variable setting [`Gpu::wait_spin`] in microseconds (0: never poll, sleep).
pub const WAIT_SPIN_ENV: &str = "GPHASH_WAIT_SPIN_US";

/// How long a wait for results polls a GPU before it sleeps in the driver
/// ([`Gpu::wait_spin`]): the work of a small batch ends within it, and a polling host sees
/// that sooner than one the driver wakes (docs/lab/latency.md, "Waiting without sleeping");
/// a larger batch costs at most this much of a host thread's time.
pub const WAIT_SPIN: Duration = Duration::from_millis(1);

/// What the device is and what it can do.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Adapter name.
    pub name: String,
    /// Driver name and version.
    pub driver: String,
    /// Kind of device (discrete, CPU, ...).
    pub device_type: wgpu::DeviceType,
    /// Smallest and largest subgroup size the driver may use.
    pub subgroup_sizes: (u32, u32),
    /// Host-pointer import is available (zero-copy pools).
    pub host_import: bool,
    /// Alignment of imported host pointers and sizes.
    pub import_alignment: u64,
    /// Largest storage-buffer binding.
    pub max_binding: u64,
    /// Largest buffer.
    pub max_buffer: u64,
    /// Storage buffers one shader stage may bind.
    pub max_storage_buffers: u32,
    /// Bytes of immediates (push constants) a pipeline may have: the kernels' parameters.
    pub max_immediates: u32,
    /// Compute passes can write timestamps (`wgpu::Features::TIMESTAMP_QUERY`, enabled where
    /// the adapter has it): GPU time per kernel.
    pub timestamps: bool,
    /// Nanoseconds per timestamp tick (0 without timestamps).
    pub timestamp_period: f32,
    /// Kernels may use 64-bit integers (`wgpu::Features::SHADER_INT64`, enabled where the
    /// adapter has it): regions over 16 GiB need them for their word addresses.
    pub int64: bool,
    /// Storage buffers one binding array may hold, indexed non-uniformly (0: no binding arrays
    /// of storage buffers): pools needing more windows than `max_storage_buffers` use them.
    pub binding_arrays: u32,
    /// Bytes of the device's largest device-local memory heap (on a CPU device such as
    /// lavapipe, host memory): what the bucket cache's default budget is a share of.
    pub device_memory: u64,
    /// Buffers may be read through their device addresses by SPIR-V kernels passed through
    /// (`VK_KHR_buffer_device_address` and `wgpu::Features::PASSTHROUGH_SHADERS`, enabled where
    /// the device has both): only `bench reach` uses them, to compare them with the windows
    /// the kernels reach a pool through (docs/design.md, "Pools past 16 GiB").
    pub device_addresses: bool,
}

impl DeviceInfo {
    /// Whether this is a software rasterizer such as lavapipe.
    pub fn is_cpu(&self) -> bool {
        self.device_type == wgpu::DeviceType::Cpu
    }

    /// Whether its device memory is its own, not the host's (a discrete or virtual GPU).
    pub fn has_own_memory(&self) -> bool {
        matches!(self.device_type, wgpu::DeviceType::DiscreteGpu | wgpu::DeviceType::VirtualGpu)
    }
}

/// A device and its queue, shared by every table opened on it.
pub struct Gpu {
    /// The wgpu device.
    pub device: wgpu::Device,
    /// Its queue.
    pub queue: wgpu::Queue,
    /// What it is.
    pub info: DeviceInfo,
    /// How long a wait for results ([`crate::resources::map_read_after`]) polls the device
    /// before it sleeps in the driver: [`WAIT_SPIN`] on a GPU, none on a CPU device (whose
    /// work runs on the host's own cores); [`WAIT_SPIN_ENV`] overrides it.
    pub wait_spin: Duration,
    /// Regions of a pool imported in place so far ([`Gpu::region_imports`]).
    region_imports: std::sync::atomic::AtomicU64,
    /// Held while anything submits to the queue ([`Gpu::submit_lock`]); shared with every
    /// handle on the same queue ([`Gpu::alike`]).
    submitting: std::sync::Arc<std::sync::Mutex<()>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("info", &self.info).finish()
    }
}

impl Gpu {
    /// Regions of a pool imported in place on this device so far
    /// ([`crate::resources::import_region`]): each pins the region's pages, which takes time of
    /// its own, so a growth hands imports on rather than import a region again.
    pub fn region_imports(&self) -> u64 {
        self.region_imports.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Another handle on the same device and queue, seen as `info` says and waiting as
    /// `wait_spin` says, with counts of its own (tests disguise a device with it).
    pub fn alike(&self, info: DeviceInfo, wait_spin: Duration) -> Gpu {
        Gpu {
            device: self.device.clone(),
            queue: self.queue.clone(),
            info,
            wait_spin,
            region_imports: Default::default(),
            submitting: self.submitting.clone(),
        }
    }

    /// Counts a region imported in place.
    pub(crate) fn count_region_import(&self) {
        self.region_imports.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Bytes of device memory this process may still take from the largest device-local heap,
    /// now (`VK_EXT_memory_budget`; `None` where the device does not report it).
    pub fn device_memory_available(&self) -> Option<u64> {
        device_memory_available(&self.device)
    }

    /// Opens the best Vulkan adapter (or the one `GPHASH_ADAPTER` names), unchecked: `Gpu::new`
    /// (`probe.rs`) also makes sure its subgroups run the lanes they report. `Err(NoAdapter)`
    /// when none exists; `Err(MissingFeature)` when the adapter lacks subgroups.
    pub(crate) fn open_best() -> Result<Gpu> {
        let instance = compute_instance()?;
        Self::open(Self::best_adapter(&instance)?)
    }

    /// Opens the best adapter and every other one of the same name and type (the host's
    /// identical GPUs, each once: adapters on the same PCI bus are one GPU), unchecked, as
    /// [`Gpu::open_best`]. A twin that fails to open is left out, with a warning.
    pub(crate) fn open_alike() -> Result<Vec<Gpu>> {
        let instance = compute_instance()?;
        let best = Self::best_adapter(&instance)?;
        let info = best.get_info();
        let mut buses = vec![info.device_pci_bus_id.clone()];
        let mut gpus = vec![Self::open(best)?];
        for adapter in pollster::block_on(instance.enumerate_adapters(wgpu::Backends::VULKAN)) {
            let a = adapter.get_info();
            let twin = (&a.name, a.device_type) == (&info.name, info.device_type);
            if !twin || a.device_pci_bus_id.is_empty() || buses.contains(&a.device_pci_bus_id) {
                continue;
            }
            buses.push(a.device_pci_bus_id.clone());
            match Self::open(adapter) {
                Ok(gpu) => gpus.push(gpu),
                Err(e) => log::warn!("{} at {} is left out: {e}", a.name, a.device_pci_bus_id),
            }
        }
        Ok(gpus)
    }

    fn best_adapter(instance: &wgpu::Instance) -> Result<wgpu::Adapter> {
        let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::VULKAN));
        let adapter = match std::env::var(ADAPTER_ENV) {
            Ok(want) => adapters
                .into_iter()
                .find(|a| a.get_info().name.contains(&want))
                .ok_or_else(|| Error::NoAdapter(format!("no Vulkan adapter matches {ADAPTER_ENV}={want}")))?,
            Err(_) => pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                force_fallback_adapter: false,
                compatible_surface: None,
                apply_limit_buckets: false,
            }))
            .map_err(|e| Error::NoAdapter(format!("no Vulkan adapter: {e}")))?,
        };
        Ok(adapter)
    }

    fn open(adapter: wgpu::Adapter) -> Result<Gpu> {
        let ainfo = adapter.get_info();
        if !adapter.features().contains(wgpu::Features::SUBGROUP) {
            return Err(Error::MissingFeature(format!(
                "adapter {} has no subgroup operations (wgpu::Features::SUBGROUP)",
                ainfo.name
            )));
        }
        // The kernels' parameters are immediates (Vulkan's push constants, which every Vulkan
        // device has; wgpu asks for the feature).
        if !adapter.features().contains(wgpu::Features::IMMEDIATES) {
            return Err(Error::MissingFeature(format!(
                "adapter {} has no immediates (push constants, wgpu::Features::IMMEDIATES)",
                ainfo.name
            )));
        }
        // Timestamps are wanted, never required: only profiles use them.
        let timestamps = adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY);
        // 64-bit integers and binding arrays likewise: only large pools need them.
        let int64 = adapter.features().contains(wgpu::Features::SHADER_INT64);
        let arrays = wgpu::Features::BUFFER_BINDING_ARRAY
            | wgpu::Features::STORAGE_RESOURCE_BINDING_ARRAY
            | wgpu::Features::SAMPLED_TEXTURE_AND_STORAGE_BUFFER_ARRAY_NON_UNIFORM_INDEXING;
        let has_arrays = adapter.features().contains(arrays);
        // Device addresses likewise: only `bench reach` uses them. Vulkan 1.2 at least: the
        // address is asked for through its core entry point.
        // SAFETY: a capability query on the adapter's hal.
        let has_addresses = unsafe { adapter.as_hal::<Vulkan>() }.is_some_and(|hal| {
            let caps = hal.physical_device_capabilities();
            caps.properties().api_version >= vk::API_VERSION_1_2
                && caps.supports_extension(ash::khr::buffer_device_address::NAME)
        });
        let device_addresses =
            has_addresses && adapter.features().contains(wgpu::Features::PASSTHROUGH_SHADERS);
        let wanted = [
            (timestamps, wgpu::Features::TIMESTAMP_QUERY),
            (int64, wgpu::Features::SHADER_INT64),
            (has_arrays, arrays),
            (device_addresses, wgpu::Features::PASSTHROUGH_SHADERS),
        ];
        let features = wanted
            .into_iter()
            .filter(|w| w.0)
            .fold(wgpu::Features::SUBGROUP | wgpu::Features::IMMEDIATES, |f, w| f | w.1);
        let limits = adapter.limits();
        let ext = ash::ext::external_memory_host::NAME;
        // wgpu enables device addresses only for ray tracing, which is never asked for here, so
        // the feature is added to the device's creation once, by the callback.
        let addresses = ash::khr::buffer_device_address::NAME;
        let mut address_feature =
            vk::PhysicalDeviceBufferDeviceAddressFeatures::default().buffer_device_address(true);
        // SAFETY: the hal adapter is only used to query capabilities and to open the device
        // with extra extensions (and the feature of one) that the physical device reports.
        let open = unsafe {
            let hal = adapter
                .as_hal::<Vulkan>()
                .ok_or_else(|| Error::NoAdapter(format!("{} is not a Vulkan adapter", ainfo.name)))?;
            let has_ext = hal.physical_device_capabilities().supports_extension(ext);
            let feature = &mut address_feature;
            hal.open_with_callback(
                features,
                &limits,
                &wgpu::MemoryHints::Performance,
                Some(Box::new(move |args: wgpu::hal::vulkan::CreateDeviceCallbackArgs| {
                    if has_ext && !args.extensions.contains(&ext) {
                        args.extensions.push(ext);
                    }
                    if device_addresses && !args.extensions.contains(&addresses) {
                        args.extensions.push(addresses);
                        *args.create_info = args.create_info.push_next(feature);
                    }
                })),
            )
        }
        .map_err(|e| Error::Gpu(format!("opening {}: {e}", ainfo.name)))?;
        // SAFETY: `open` came from this adapter's hal with the same features and limits.
        let (device, queue) = unsafe {
            adapter.create_device_from_hal::<Vulkan>(
                open,
                &wgpu::DeviceDescriptor {
                    label: Some("gphash"),
                    required_features: features,
                    required_limits: limits.clone(),
                    experimental_features: wgpu::ExperimentalFeatures::disabled(),
                    memory_hints: wgpu::MemoryHints::Performance,
                    trace: wgpu::Trace::Off,
                },
            )
        }
        .map_err(|e| Error::Gpu(format!("creating the device on {}: {e}", ainfo.name)))?;
        device.on_uncaptured_error(Arc::new(|e| log::error!("uncaptured wgpu error: {e}")));

        let (host_import, import_alignment) = import_support(&device);
        let device_memory = device_memory(&device);
        let info = DeviceInfo {
            name: ainfo.name.clone(),
            driver: format!("{} {}", ainfo.driver, ainfo.driver_info).trim().to_string(),
            device_type: ainfo.device_type,
            subgroup_sizes: (ainfo.subgroup_min_size, ainfo.subgroup_max_size),
            host_import,
            import_alignment,
            max_binding: limits.max_storage_buffer_binding_size.min(i32::MAX as u64),
            max_buffer: limits.max_buffer_size,
            max_storage_buffers: limits.max_storage_buffers_per_shader_stage,
            max_immediates: limits.max_immediate_size,
            timestamps,
            timestamp_period: if timestamps { queue.get_timestamp_period() } else { 0.0 },
            int64,
            binding_arrays: if has_arrays { limits.max_binding_array_elements_per_shader_stage } else { 0 },
            device_memory,
            device_addresses,
        };
        log::info!("gphash device: {info:?}");
        let wait_spin =
            wait_spin_from_env()?.unwrap_or(if info.is_cpu() { Duration::ZERO } else { WAIT_SPIN });
        Ok(Gpu {
            device,
            queue,
            info,
            wait_spin,
            region_imports: Default::default(),
            submitting: Default::default(),
        })
    }

    /// The raw Vulkan handles of the device, for host-memory import.
    pub(crate) fn raw(&self) -> Option<(ash::Device, ash::Instance, vk::PhysicalDevice)> {
        // SAFETY: only the device's handles are taken, not its queue.
        let v = unsafe { self.vulkan() }?;
        Some((v.device, v.instance, v.physical))
    }

    /// The Vulkan objects under the device and its queue, for work recorded and submitted
    /// without wgpu ([`crate::direct`]).
    ///
    /// # Safety
    /// A queue is externally synchronized in Vulkan: the caller submits to `queue` only under
    /// [`Gpu::submit_lock`], and destroys nothing wgpu owns.
    pub(crate) unsafe fn vulkan(&self) -> Option<RawVulkan> {
        // SAFETY: the handles are cloned out; the device outlives every use (Gpu owns it).
        let hal = unsafe { self.device.as_hal::<Vulkan>() }?;
        Some(RawVulkan {
            device: hal.raw_device().clone(),
            instance: hal.shared_instance().raw_instance().clone(),
            physical: hal.raw_physical_device(),
            queue: hal.raw_queue(),
            family: hal.queue_family_index(),
        })
    }

    /// The queue's lock: Vulkan wants a queue's submits one at a time, which wgpu ensures for
    /// its own only; submits recorded with Vulkan itself ([`crate::direct`]) take the same
    /// lock as wgpu's submits of this crate's users ([`Gpu::submit`]).
    pub fn submit_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.submitting.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Submits `cmds` through wgpu, under [`Gpu::submit_lock`]. Work of one's own on a device
    /// that an index uses goes this way, not through `queue.submit`: the index's engine may
    /// submit to the same queue without wgpu. (wgpu also submits its pending queue writes
    /// when a buffer is mapped or `on_submitted_work_done` is registered; this crate takes the
    /// lock around both, and so must a caller that does either while an index runs.)
    pub fn submit(&self, cmds: impl IntoIterator<Item = wgpu::CommandBuffer>) -> wgpu::SubmissionIndex {
        let _queue = self.submit_lock();
        self.queue.submit(cmds)
    }

    /// Waits until the queue is idle.
    pub fn wait(&self) -> Result<()> {
        self.wait_for(None)
    }

    /// Polls the device without sleeping until `done` gives a value, for at most
    /// [`Gpu::wait_spin`]; `None` when that passed first.
    pub fn poll_until<T>(&self, mut done: impl FnMut() -> Option<T>) -> Result<Option<T>> {
        if self.wait_spin.is_zero() {
            return Ok(None);
        }
        let started = Instant::now();
        loop {
            self.device
                .poll(wgpu::PollType::Poll)
                .map_err(|e| Error::Gpu(format!("polling the GPU: {e}")))?;
            if let Some(v) = done() {
                return Ok(Some(v));
            }
            if started.elapsed() >= self.wait_spin {
                return Ok(None);
            }
            std::hint::spin_loop();
        }
    }

    /// A flag the queue sets once every submit so far has run (from a poll), for
    /// [`Gpu::wait_flag`]: nothing need be mapped to learn it.
    pub fn work_done_flag(&self) -> Arc<AtomicBool> {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        // It submits the queue's pending writes first, if any: a submit like any other.
        let _queue = self.submit_lock();
        self.queue.on_submitted_work_done(move || flag.store(true, Ordering::Release));
        done
    }

    /// Waits until `done`, a [`Gpu::work_done_flag`] made right after `submission`, is set:
    /// polling without sleeping first, then sleeping in the driver.
    pub fn wait_flag(&self, done: &AtomicBool, submission: &wgpu::SubmissionIndex) -> Result<()> {
        if self.poll_until(|| done.load(Ordering::Acquire).then_some(()))?.is_none() {
            self.wait_for(Some(submission.clone()))?;
        }
        Ok(())
    }

    /// Waits until `submission` has run (`None`: every submission so far), not for the ones
    /// after it: the host can take one batch's results while the next runs.
    pub fn wait_for(&self, submission: Option<wgpu::SubmissionIndex>) -> Result<()> {
        self.device
            .poll(wgpu::PollType::Wait { submission_index: submission, timeout: None })
            .map(|_| ())
            .map_err(|e| Error::Gpu(format!("waiting for the GPU: {e}")))
    }
}

/// The Vulkan objects under a [`Gpu`] ([`Gpu::vulkan`]).
#[derive(Clone)]
pub(crate) struct RawVulkan {
    /// The logical device.
    pub device: ash::Device,
    /// Its instance.
    pub instance: ash::Instance,
    /// Its physical device.
    pub physical: vk::PhysicalDevice,
    /// The queue wgpu submits to.
    pub queue: vk::Queue,
    /// That queue's family.
    pub family: u32,
}

/// [`WAIT_SPIN_ENV`] as a duration, if set.
fn wait_spin_from_env() -> Result<Option<Duration>> {
    let Some(v) = std::env::var_os(WAIT_SPIN_ENV) else { return Ok(None) };
    let us: u64 = v
        .to_str()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Error::InvalidConfig(format!("{WAIT_SPIN_ENV}={v:?}: expected whole microseconds")))?;
    Ok(Some(Duration::from_micros(us)))
}

/// Window-system surface extensions, which a compute-only instance does not enable.
const WINDOW_SURFACE_EXTENSIONS: [&std::ffi::CStr; 3] =
    [ash::khr::xlib_surface::NAME, ash::khr::xcb_surface::NAME, ash::khr::wayland_surface::NAME];

/// A Vulkan instance without window-system surface extensions. wgpu enables every one the
/// loader offers; Mesa's implicit device-select layer then connects to the Wayland (and X)
/// display at each enumeration of the devices, and libwayland prints "error: XDG_RUNTIME_DIR
/// is invalid or not set" where there is none. gphash creates no surfaces, and wgpu-hal checks
/// its list of enabled extensions before it would use one.
fn compute_instance() -> Result<wgpu::Instance> {
    let desc = wgpu::InstanceDescriptor::new_without_display_handle();
    let hal_desc = wgpu::hal::InstanceDescriptor {
        name: "gphash",
        flags: desc.flags,
        memory_budget_thresholds: desc.memory_budget_thresholds,
        backend_options: desc.backend_options,
        telemetry: None,
        display: None,
    };
    let drop_surfaces = |args: wgpu::hal::vulkan::CreateInstanceCallbackArgs| {
        args.extensions.retain(|e| !WINDOW_SURFACE_EXTENSIONS.contains(e));
    };
    // SAFETY: wgpu-hal asks callbacks not to remove extensions because it may rely on them;
    // these only create window surfaces, which gphash never does, and wgpu-hal keeps the list
    // it enabled and refuses such a surface when its extension is not in it.
    let hal =
        unsafe { wgpu::hal::vulkan::Instance::init_with_callback(&hal_desc, Some(Box::new(drop_surfaces))) }
            .map_err(|e| Error::NoAdapter(format!("cannot create a Vulkan instance: {e}")))?;
    // SAFETY: `hal` is a valid Vulkan instance that wgpu takes over.
    Ok(unsafe { wgpu::Instance::from_hal::<Vulkan>(hal) })
}

/// Bytes of the largest device-local memory heap (0 where Vulkan reports none).
fn device_memory(device: &wgpu::Device) -> u64 {
    // SAFETY: a read-only query on live handles owned by `device`.
    unsafe {
        let Some(hal) = device.as_hal::<Vulkan>() else {
            return 0;
        };
        let inst = hal.shared_instance().raw_instance();
        let props = inst.get_physical_device_memory_properties(hal.raw_physical_device());
        let heaps = &props.memory_heaps[..props.memory_heap_count as usize];
        heaps
            .iter()
            .filter(|h| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
            .map(|h| h.size)
            .max()
            .unwrap_or(0)
    }
}

/// Bytes the device says it can still give this process from its largest device-local heap
/// (`VK_EXT_memory_budget`: the heap's budget less this process's use), or `None` where the
/// device does not say.
fn device_memory_available(device: &wgpu::Device) -> Option<u64> {
    // SAFETY: a read-only query on live handles owned by `device`; the budget structure is
    // chained only where the extension that defines it is enabled.
    unsafe {
        let hal = device.as_hal::<Vulkan>()?;
        // The query below is Vulkan 1.1's (a 1.0 instance has it only as an extension).
        let shared = hal.shared_instance();
        if !hal.enabled_device_extensions().contains(&ash::ext::memory_budget::NAME)
            || shared.instance_api_version() < vk::API_VERSION_1_1
        {
            return None;
        }
        let inst = shared.raw_instance();
        let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
        let mut props = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
        inst.get_physical_device_memory_properties2(hal.raw_physical_device(), &mut props);
        let heaps = props.memory_properties.memory_heaps;
        let count = (props.memory_properties.memory_heap_count as usize).min(vk::MAX_MEMORY_HEAPS);
        (0..count)
            .filter(|&i| heaps[i].flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
            .max_by_key(|&i| heaps[i].size)
            .map(|i| budget.heap_budget[i].saturating_sub(budget.heap_usage[i]))
    }
}

/// Whether `VK_EXT_external_memory_host` is enabled on the device, and its alignment.
fn import_support(device: &wgpu::Device) -> (bool, u64) {
    // SAFETY: read-only queries on live handles owned by `device`.
    unsafe {
        let Some(hal) = device.as_hal::<Vulkan>() else {
            return (false, 0);
        };
        if !hal.enabled_device_extensions().contains(&ash::ext::external_memory_host::NAME) {
            return (false, 0);
        }
        let inst = hal.shared_instance().raw_instance();
        let mut host = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
        let mut props = vk::PhysicalDeviceProperties2::default().push_next(&mut host);
        inst.get_physical_device_properties2(hal.raw_physical_device(), &mut props);
        (true, host.min_imported_host_pointer_alignment)
    }
}
