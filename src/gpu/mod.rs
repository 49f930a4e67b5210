//! The GPU executor: device, host-memory import, kernels, engine.

pub mod cache;
pub mod context;
pub mod engine;
pub mod hostmem;
pub mod resize;
pub mod resources;
pub mod shader;
