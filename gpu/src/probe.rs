//! The checked way to open a device: [`Gpu::new`] opens the best adapter and refuses one
//! whose subgroups run fewer lanes than they report (it runs a kernel, so it sits above the
//! device and its readbacks).

use std::sync::Arc;

use crate::context::Gpu;
use crate::error::{Error, Result};
use crate::resources::{download_words, single_pipeline};
use crate::shader::WORKGROUP;

impl Gpu {
    /// Opens the best Vulkan adapter (or the one `GPHASH_ADAPTER` names). `Err(NoAdapter)`
    /// when none exists; `Err(MissingFeature)` when the adapter lacks subgroups or runs fewer
    /// lanes a subgroup than it reports.
    pub fn new() -> Result<Arc<Gpu>> {
        let gpu = Gpu::open_best()?;
        gpu.check_subgroup_width()?;
        Ok(Arc::new(gpu))
    }

    /// Opens the best Vulkan adapter and every other adapter of the same name and type (a
    /// host's identical GPUs; the one `GPHASH_ADAPTER` names and its like), each checked as
    /// [`Gpu::new`] checks one. A twin that fails the check is left out, with a warning; the
    /// best one's failure is the error.
    pub fn all() -> Result<Vec<Arc<Gpu>>> {
        let mut checked = vec![];
        for (i, gpu) in Gpu::open_alike()?.into_iter().enumerate() {
            match gpu.check_subgroup_width() {
                Ok(()) => checked.push(Arc::new(gpu)),
                Err(e) if i == 0 => return Err(e),
                Err(e) => log::warn!("{} is left out: {e}", gpu.info.name),
            }
        }
        Ok(checked)
    }

    /// Refuses a device whose subgroups run fewer lanes than the subgroup size it reports:
    /// a tile would leave the words of its missing lanes unwritten and shuffle from them.
    /// lavapipe does this: with `LP_NATIVE_VECTOR_WIDTH` of 1024 bits or more it reports
    /// subgroups of width / 32 lanes but runs compute shaders at most 16 lanes wide.
    fn check_subgroup_width(&self) -> Result<()> {
        const PROBE: &str = "
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) i: u32, @builtin(subgroup_size) size: u32) {
    let b = subgroupBallot(true);
    out[2u * i] = size;
    out[2u * i + 1u] = countOneBits(b.x) + countOneBits(b.y) + countOneBits(b.z) + countOneBits(b.w);
}";
        let dev = &self.device;
        let wgsl = PROBE.replace("WG", &WORKGROUP.to_string());
        let pipeline = single_pipeline(dev, "subgroup width probe", wgsl)?;
        let out = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("subgroup width probe"),
            size: WORKGROUP as u64 * 8,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[wgpu::BindGroupEntry { binding: 0, resource: out.as_entire_binding() }],
        });
        let mut enc = dev.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(1, 1, 1);
        }
        self.submit([enc.finish()]);
        let words = download_words(self, &out, WORKGROUP as u64 * 2)?;
        match words.chunks(2).find(|w| w[0] != w[1]) {
            None => Ok(()),
            Some(w) => Err(Error::MissingFeature(format!(
                "{} reports subgroups of {} lanes but runs compute shaders {} lanes wide (lavapipe \
                 does so above LP_NATIVE_VECTOR_WIDTH=512); gphash's tiles need the lanes reported",
                self.info.name, w[0], w[1]
            ))),
        }
    }
}
