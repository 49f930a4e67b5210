//! GPU plumbing of gphash, knowing nothing of its table: a Vulkan device through wgpu
//! ([`context`]), zero-copy import of host memory such as a pool mapping ([`hostmem`]), a pool's
//! regions as storage windows imported or copied to the device, pipelines, bind groups and
//! readbacks ([`resources`]), GPU time per compute pass ([`timing`]), and WGSL sources: the
//! `#include` stitcher, the pieces of a generated prelude every table shares, and the shader
//! code every table's kernels may include ([`shader`], `shaders/`).

pub mod context;
pub mod direct;
pub mod error;
pub mod hostmem;
mod probe;
pub mod resources;
pub mod shader;
pub mod timing;

pub use context::{DeviceInfo, Gpu};
pub use error::{Error, Result};
pub use resources::{Placement, Residence};
