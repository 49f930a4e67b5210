//! The GPU executor: the table's kernels, engine, bucket cache and resize, on `gphash_gpu`'s
//! plumbing.

pub(crate) mod cache;
pub(crate) mod engine;
pub(crate) mod resize;
pub(crate) mod shader;
