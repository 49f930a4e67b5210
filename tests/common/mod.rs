//! Shared helpers of the integration tests.
#![allow(dead_code, unreachable_pub)]

pub mod crash;
pub mod killed;
pub mod oracle;

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, OnceLock};

use gphash::{Executor, Gpu, GpuOptions, Options};
use rand::Rng;

/// Set in child test processes to the subgroup size their lavapipe must use.
pub const EXPECT_SUBGROUP_ENV: &str = "GPHASH_EXPECT_SUBGROUP";

/// The subgroup sizes vendors use: Intel 8 to 32, NVIDIA 32, AMD 32 and 64 (wave64), lavapipe
/// 4 to 16 (and others up to 128). lavapipe reports `LP_NATIVE_VECTOR_WIDTH / 32` lanes.
pub const SUBGROUP_SIZES: [u32; 6] = [4, 8, 16, 32, 64, 128];

/// Exit status of a child process whose lavapipe reports the subgroup size asked for but does
/// not run compute shaders that wide (so gphash refuses it): the size cannot be tested here.
const UNTESTABLE: i32 = 77;

/// Whether `t`'s small host batches are recorded and submitted with Vulkan itself: a pool
/// imported in place on a GPU that imports host memory (docs/design.md, "Submits through Vulkan
/// itself"; a pool the file system keeps from the GPU lands staged).
pub fn submits_through_vulkan(t: &gphash::GpHash) -> bool {
    t.stats().mode == gphash::Mode::ZeroCopy && gpu().is_some_and(|g| g.info.host_import)
}

/// The GPU all tests of a process share. Without one the tests fail (under `CI=true` always;
/// elsewhere unless `GPHASH_SKIP_GPU_TESTS=1` says to run the CPU executor instead, loudly).
pub fn gpu() -> Option<Arc<Gpu>> {
    static GPU: OnceLock<Option<Arc<Gpu>>> = OnceLock::new();
    GPU.get_or_init(|| match Gpu::new().map_err(gphash::Error::from) {
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
        Err(e @ gphash::Error::MissingFeature(_)) if std::env::var_os(EXPECT_SUBGROUP_ENV).is_some() => {
            // Straight to stderr: the test harness would capture eprintln! and lose it on exit.
            let _ = writeln!(std::io::stderr(), "{e}");
            std::process::exit(UNTESTABLE);
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

/// Re-runs the tests of this test binary whose names contain `filter` in child processes at
/// each of [`SUBGROUP_SIZES`] that lavapipe can be given (`LP_NATIVE_VECTOR_WIDTH` = 32 bits a
/// lane), and checks that `expected` tests passed in each. On a device whose subgroup size is
/// fixed by the hardware, the tests already ran at that size; in a child process this does
/// nothing.
///
/// lavapipe reports 32, 64 and 128 lanes for widths 1024, 2048 and 4096 but runs compute
/// shaders at most 16 lanes wide (llvmpipe's `lp_state_cs.c`: `cs_type.length =
/// MIN2(lp_native_vector_width / 32, 16)`; lanes 16 and up of a reported subgroup do not
/// exist). gphash refuses such a device (`Gpu::new`), so those sizes are reported as not run,
/// with the reason; they run here as soon as a lavapipe runs them.
pub fn rerun_at_subgroup_sizes(filter: &[&str], expected: usize) {
    if std::env::var_os(EXPECT_SUBGROUP_ENV).is_some() {
        eprintln!("child process: the parent runs the subgroup-size matrix");
        return;
    }
    let gpu = gpu().expect("the subgroup-size matrix needs a GPU");
    if !gpu.info.is_cpu() {
        eprintln!(
            "{}: subgroup size {:?} is the hardware's; the tests ran at it",
            gpu.info.name, gpu.info.subgroup_sizes
        );
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for size in SUBGROUP_SIZES {
        let width = size * 32;
        if gpu.info.subgroup_sizes == (size, size) {
            eprintln!("subgroup size {size}: covered by this process");
            continue;
        }
        let out = Command::new(&exe)
            .args(filter)
            .arg("--test-threads=1")
            .env("LP_NATIVE_VECTOR_WIDTH", width.to_string())
            .env(EXPECT_SUBGROUP_ENV, size.to_string())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() == Some(UNTESTABLE) {
            let why = stderr.lines().rev().find(|l| l.contains("lanes wide")).unwrap_or("");
            assert!(
                size > 16 && why.contains(&format!("reports subgroups of {size} lanes")),
                "subgroup size {size}: lavapipe should report it and run it up to 16 lanes:\n{stderr}"
            );
            eprintln!("subgroup size {size}: NOT RUN: {why}");
            continue;
        }
        assert!(out.status.success(), "subgroup size {size}:\n{text}\n{stderr}");
        assert!(
            text.contains(&format!("{expected} passed")),
            "subgroup size {size}: expected {expected} tests to run:\n{text}"
        );
        eprintln!(
            "subgroup size {size}: {}",
            text.lines().rev().find(|l| l.contains("test result")).unwrap_or("")
        );
    }
}

/// The shared GPU as a device whose storage bindings hold at most `max_binding` bytes: the
/// engine sizes its windows and batches by that (smaller batches exercise calls that take
/// several engine batches; a larger limit than the device's exercises its validation errors).
pub fn gpu_with_binding_limit(max_binding: u64) -> Arc<Gpu> {
    let g = gpu().expect("a device with another binding limit needs a GPU");
    let info = gphash::DeviceInfo { max_binding, ..g.info.clone() };
    Arc::new(g.alike(info, g.wait_spin))
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

/// A fresh directory on a disk filesystem (pools there are files that drivers do not import):
/// cargo's target temporary directory, or the system's where that does not exist (a test
/// binary run on another machine).
pub fn disk_dir() -> tempfile::TempDir {
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    if target.is_dir() { tempfile::tempdir_in(target).unwrap() } else { tempfile::tempdir().unwrap() }
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

/// A random operation kind: 25% gets, 30% inserts, 15% each upserts, updates and deletes.
pub fn random_kind(rng: &mut impl Rng) -> gphash::OpKind {
    use gphash::OpKind;
    match rng.random_range(0..100) {
        0..25 => OpKind::Get,
        25..55 => OpKind::Insert,
        55..70 => OpKind::Upsert,
        70..85 => OpKind::Update,
        _ => OpKind::Delete,
    }
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

/// Every published key of a table with the index of its value cell in the heap.
pub fn published_cells(t: &gphash::GpHash) -> Vec<(Vec<u8>, u64)> {
    let g = t.geometry();
    let published = gphash::testing::layout::PUBLISHED;
    t.with_pool(|pool| {
        let table: &[u32] = bytemuck::cast_slice(pool.region(pool.header().table_region));
        let mut cells = vec![];
        for bucket in 0..g.buckets() {
            for s in 0..g.layout.slots {
                let state = table[g.state_word(bucket, s) as usize];
                if state >= published {
                    let k = g.key_word(bucket, s) as usize;
                    let key: &[u8] = bytemuck::cast_slice(&table[k..k + g.key_words() as usize]);
                    let fp = table[g.fp_word(bucket, s) as usize];
                    cells.push((key.to_vec(), g.published_cell(fp, state).expect("a cell of the heap")));
                }
            }
        }
        cells
    })
}

/// Every published key of a table with the words of its value cell as the pool holds them
/// (the value words, then the checksum word).
pub fn stored_cells(t: &gphash::GpHash) -> std::collections::HashMap<Vec<u8>, Vec<u32>> {
    let cw = t.geometry().cell_words() as usize;
    let cells = published_cells(t);
    t.with_pool(|pool| {
        let heap: &[u32] = bytemuck::cast_slice(pool.region(pool.header().heap_region));
        cells.into_iter().map(|(key, cell)| (key, heap[cell as usize * cw..][..cw].to_vec())).collect()
    })
}

/// A random batch of `n` operations over keys `0..keys` (repeats likely), all kinds.
pub fn random_batch(
    rng: &mut impl Rng,
    n: usize,
    keys: u64,
    key_bytes: usize,
    value_bytes: usize,
) -> gphash::Batch {
    let mut b = gphash::Batch::new(key_bytes, value_bytes);
    for _ in 0..n {
        let key = key(rng.random_range(0..keys), key_bytes);
        let v = value(rng, value_bytes);
        match rng.random_range(0..10) {
            0..3 => b.insert(&key, &v).unwrap(),
            3..5 => b.upsert(&key, &v).unwrap(),
            5 => b.update(&key, &v).unwrap(),
            6..8 => b.delete(&key).unwrap(),
            _ => b.get(&key).unwrap(),
        }
    }
    b
}

/// Records a growth of the closed pool at `path` and stops there, as a crash between its record
/// and its switch would: before the build, or (`half_built`) with garbage where the build had got
/// to in the new table and heap.
pub fn interrupt_growth(path: &std::path::Path, half_built: bool) {
    let mut pool = host_pm::Pool::open(path).unwrap();
    let geo = gphash::GpHash::geometry_of(&pool).unwrap();
    let regions = gphash::testing::resize::plan(&pool, &geo).unwrap();
    gphash::testing::resize::begin(&mut pool, &geo, regions).unwrap();
    if half_built {
        for r in [pool.header().resize.new_table, pool.header().resize.new_heap] {
            pool.region_mut(r)[..4096].fill(0xA5);
        }
    }
}
