//! Shared helpers of the integration tests.
#![allow(dead_code)]

pub mod oracle;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use gphash::{Executor, Gpu, GpuOptions, Options};
use rand::Rng;

/// Set in child test processes to the subgroup size their lavapipe must use.
pub const EXPECT_SUBGROUP_ENV: &str = "GPHASH_EXPECT_SUBGROUP";

/// The GPU all tests of a process share. Without one the tests fail (under `CI=true` always;
/// elsewhere unless `GPHASH_SKIP_GPU_TESTS=1` says to run the CPU executor instead, loudly).
pub fn gpu() -> Option<Arc<Gpu>> {
    static GPU: OnceLock<Option<Arc<Gpu>>> = OnceLock::new();
    GPU.get_or_init(|| match Gpu::new() {
        Ok(g) => {
            eprintln!("GPU tests run on {} (subgroup sizes {:?})", g.info.name, g.info.subgroup_sizes);
            if let Ok(want) = std::env::var(EXPECT_SUBGROUP_ENV)
                && g.info.is_cpu()
            {
                let want: u32 = want.parse().unwrap();
                assert_eq!(g.info.subgroup_sizes, (want, want), "LP_NATIVE_VECTOR_WIDTH did not take effect");
            }
            Some(g)
        }
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => panic!("CI=true and no GPU: {e}"),
        Err(e) if std::env::var("GPHASH_SKIP_GPU_TESTS").as_deref() == Ok("1") => {
            eprintln!("WARNING: no GPU ({e}); GPHASH_SKIP_GPU_TESTS=1, GPU tests run on the CPU executor");
            None
        }
        Err(e) => panic!(
            "no GPU: {e} (install a Vulkan driver such as Mesa's lavapipe, or set GPHASH_SKIP_GPU_TESTS=1)"
        ),
    })
    .clone()
}

/// Options that run on the shared GPU (or the CPU when the tests were told to skip the GPU).
pub fn gpu_options(gpu: GpuOptions) -> Options {
    match self::gpu() {
        Some(g) => Options { executor: Executor::Gpu, gpu, device: Some(g), ..Options::default() },
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

/// Key number `k` as `width` bytes (distinct numbers give distinct keys).
pub fn key(k: u64, width: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(width);
    let mut x = k;
    while out.len() < width {
        out.extend_from_slice(&x.to_le_bytes());
        x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17) ^ k;
    }
    out.truncate(width);
    if width < 8 {
        out.copy_from_slice(&k.to_le_bytes()[..width]);
    }
    out
}

/// A random value.
pub fn value(rng: &mut impl Rng, width: usize) -> Vec<u8> {
    (0..width).map(|_| rng.random()).collect()
}

/// Seed for randomized tests: `GPHASH_TEST_SEED` or a fresh one, printed so a failure can be replayed.
pub fn seed(test: &str) -> u64 {
    let seed =
        std::env::var("GPHASH_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("{test}: GPHASH_TEST_SEED={seed}");
    seed
}

/// A new table named `name` in `dir`.
pub fn table(
    dir: &tempfile::TempDir,
    name: &str,
    config: &gphash::Config,
    options: &Options,
) -> gphash::GpHash {
    gphash::GpHash::create(Some(&dir.path().join(name)), config, options).unwrap()
}

/// A new table on the shared GPU with default GPU settings.
pub fn gpu_table(dir: &tempfile::TempDir, config: &gphash::Config) -> gphash::GpHash {
    table(dir, "gpu.pool", config, &gpu_options(GpuOptions::default()))
}
