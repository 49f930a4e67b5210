//! Shared helpers of the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use gphash::{Executor, Gpu, GpuOptions, Options};

/// The GPU all tests of a process share. Without one the tests fail (under `CI=true` always;
/// elsewhere unless `GPHASH_SKIP_GPU_TESTS=1` says to run the CPU executor instead, loudly).
pub fn gpu() -> Option<Arc<Gpu>> {
    static GPU: OnceLock<Option<Arc<Gpu>>> = OnceLock::new();
    GPU.get_or_init(|| match Gpu::new() {
        Ok(g) => {
            eprintln!("GPU tests run on {} (subgroup sizes {:?})", g.info.name, g.info.subgroup_sizes);
            Some(g)
        }
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => panic!("CI=true and no GPU: {e}"),
        Err(e) if std::env::var("GPHASH_SKIP_GPU_TESTS").as_deref() == Ok("1") => {
            eprintln!("WARNING: no GPU ({e}); GPHASH_SKIP_GPU_TESTS=1, GPU tests run on the CPU executor");
            None
        }
        Err(e) => panic!("no GPU: {e} (install a Vulkan driver such as Mesa's lavapipe, or set GPHASH_SKIP_GPU_TESTS=1)"),
    })
    .clone()
}

/// Options that run on the shared GPU (or the CPU when the tests were told to skip the GPU).
pub fn gpu_options(gpu: GpuOptions) -> Options {
    match self::gpu() {
        Some(g) => Options { executor: Executor::Gpu, gpu, device: Some(g) },
        None => cpu_options(),
    }
}

/// Options that run on the CPU model.
pub fn cpu_options() -> Options {
    Options { executor: Executor::Cpu, ..Default::default() }
}

/// A fresh directory for pools: on tmpfs where there is one (zero-copy imports work there).
pub fn pool_dir() -> tempfile::TempDir {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() { tempfile::tempdir_in(shm).unwrap() } else { tempfile::tempdir().unwrap() }
}
