//! The GPU executor: the table's kernels, engine, bucket cache and resize, on `gphash_gpu`'s
//! plumbing.

pub mod cache;
pub mod engine;
pub mod resize;
pub mod shader;
