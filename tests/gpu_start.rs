//! A GPU started in the background (`GpuStartMode::Background`): calls run on the CPU
//! model until the GPU takes over, which it does with the allocator as it then stands; growth,
//! device batches, closing and dropping wait for the start; a start that fails leaves the CPU
//! model running. Every result is compared with the one-by-one model.

mod common;
#[path = "common/device.rs"]
mod device_buffers;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::oracle::{Oracle, assert_same_content};
use common::{gpu_options, pool_dir, random_batch, seed};
use gphash::{Config, GpHash, GpuOptions, GpuStartMode, Mode, Options, Status};
use rand::SeedableRng;
use rand::rngs::StdRng;

const KB: usize = 8;
const VB: usize = 16;

/// Options that start the shared GPU in the background, held at `gate` once the engine is
/// made until the test waits on the gate too.
fn background(gate: &Arc<Barrier>) -> Options {
    Options {
        gpu_start: GpuStartMode::Background,
        gpu_start_gate: Some(gate.clone()),
        ..gpu_options(GpuOptions::default())
    }
}

/// The test's side of a gate: released by `release`, or when dropped (a test that fails
/// before must not leave the start waiting, which the index's drop joins). Made after the
/// index, so that it is dropped first.
struct Held(Option<Arc<Barrier>>);

impl Held {
    fn release(&mut self) {
        if let Some(gate) = self.0.take() {
            gate.wait();
        }
    }

    /// Hands the gate to a thread that releases it after `delay`.
    fn release_later(mut self, delay: Duration) -> std::thread::JoinHandle<()> {
        release_later(&self.0.take().expect("held"), delay)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.release();
    }
}

/// Opens `path` with a background start held at a gate, and the test's side of the gate
/// (bound after the index, so dropped first).
fn open_held(path: &std::path::Path) -> (GpHash, Held) {
    let gate = Arc::new(Barrier::new(2));
    let t = GpHash::open(path, &background(&gate)).unwrap();
    (t, Held(Some(gate)))
}

/// The table passes `check` and holds the model's content.
fn assert_modelled(t: &GpHash, oracle: &Oracle, what: &str) {
    let report = t.check();
    assert!(report.ok(), "{what}: {report}");
    assert_same_content(t.entries(), &oracle.map, what);
}

/// Whether the GPU tests run here (`GPHASH_SKIP_GPU_TESTS=1` without a GPU: not these, which
/// start one).
fn have_gpu() -> bool {
    let have = common::gpu().is_some();
    if !have {
        eprintln!("NOT RUN: no GPU to start");
    }
    have
}

/// A test's pool (some keys, closed cleanly), its model, and the randomness that made it.
struct Setup {
    rng: StdRng,
    dir: tempfile::TempDir,
    path: std::path::PathBuf,
    oracle: Oracle,
}

/// The setup of test `name` with a table sized for `capacity` keys; `None` without a GPU.
fn setup(name: &str, capacity: u64) -> Option<Setup> {
    if !have_gpu() {
        return None;
    }
    let mut rng = StdRng::seed_from_u64(seed(name));
    let dir = pool_dir();
    let (path, oracle) = closed_pool(&dir, &mut rng, capacity);
    Some(Setup { rng, dir, path, oracle })
}

/// Releases `gate` from another thread after `delay`, for steps that wait for the start.
fn release_later(gate: &Arc<Barrier>, delay: Duration) -> std::thread::JoinHandle<()> {
    let gate = gate.clone();
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        gate.wait();
    })
}

/// `batches` random ordered calls over keys `0..keys`, each compared with the model.
fn run_calls(t: &GpHash, oracle: &mut Oracle, rng: &mut StdRng, batches: usize, keys: u64) {
    for i in 0..batches {
        let b = random_batch(rng, 300, keys, KB, VB);
        let want = oracle.run(&b);
        let got = t.execute_ordered(&b).unwrap();
        for (j, (status, value)) in want.iter().enumerate() {
            assert_eq!(got.statuses[j], *status, "batch {i}, op {j} ({:?})", b.op(j).0);
            assert_eq!(got.value(j), value.as_deref(), "batch {i}, op {j}");
        }
    }
}

fn is_cpu(t: &GpHash) -> bool {
    matches!(t.stats().mode, Mode::Cpu { .. })
}

/// A pool with some keys, closed cleanly, and the model of its content.
fn closed_pool(dir: &tempfile::TempDir, rng: &mut StdRng, capacity: u64) -> (std::path::PathBuf, Oracle) {
    let path = dir.path().join("t.pool");
    let config = Config { key_bytes: KB as u32, value_bytes: VB as u32, capacity, ..Config::default() };
    let t = GpHash::create(Some(&path), &config, &gpu_options(GpuOptions::default())).unwrap();
    let mut oracle = Oracle::default();
    run_calls(&t, &mut oracle, rng, 4, 2_000);
    t.close().unwrap();
    (path, oracle)
}

#[test]
fn calls_run_on_the_cpu_until_the_gpu_takes_over_with_the_allocator_as_it_stands() {
    let Some(Setup { mut rng, dir: _dir, path, mut oracle }) = setup("takes_over", 8_192) else {
        return;
    };
    let (t, mut held) = open_held(&path);
    match t.stats().mode {
        Mode::Cpu { reason } => assert!(reason.contains("starting"), "{reason}"),
        other => panic!("a background start runs on the CPU first, not {other}"),
    }
    assert!(t.gpu().is_none(), "no GPU runs the batches yet");
    // Inserts on the CPU take cells the GPU's allocator must not hand out again.
    run_calls(&t, &mut oracle, &mut rng, 6, 4_000);
    assert!(is_cpu(&t), "the start is held at the gate");
    held.release();
    let gpu = t.wait_for_gpu().unwrap().clone();
    assert_eq!(t.stats().mode, Mode::ZeroCopy, "the GPU took over (pools go on /dev/shm)");
    let start = t.stats().gpu_start.expect("reported");
    assert!(start.engine_in_background, "a pool imported zero-copy gets its engine on the starting thread");
    assert!(Arc::ptr_eq(&gpu, t.gpu().unwrap()));
    run_calls(&t, &mut oracle, &mut rng, 12, 4_000);
    assert_modelled(&t, &oracle, "after the GPU took over");
    t.close().unwrap();
    let t = GpHash::open(&path, &common::cpu_options()).unwrap();
    assert_same_content(t.entries(), &oracle.map, "reopened");
}

/// Gets alone before the takeover leave the allocator the close saved unread in the pool: the
/// takeover reads it from there (the pool still clean), and the GPU's inserts then take only
/// free cells.
#[test]
fn reads_before_the_takeover_leave_the_saved_allocator_to_it() {
    let Some(Setup { mut rng, dir: _dir, path, mut oracle }) = setup("reads_first", 8_192) else {
        return;
    };
    let (t, mut held) = open_held(&path);
    assert!(t.stats().recovery.restored, "{}", t.stats().recovery);
    let keys: Vec<u8> = (0..2_000).flat_map(|k| common::key(k, KB)).collect();
    let found = t.get(&keys).unwrap();
    for (i, key) in keys.chunks(KB).enumerate() {
        assert_eq!(found.value(i), oracle.map.get(key).map(Vec::as_slice), "get {i} on the CPU");
    }
    assert!(is_cpu(&t), "the start is held at the gate");
    t.with_pool(|pool| assert!(pool.header().clean_shutdown, "gets leave the pool clean"));
    held.release();
    t.wait_for_gpu().unwrap();
    assert!(!is_cpu(&t), "the GPU took over: {}", t.stats().mode);
    run_calls(&t, &mut oracle, &mut rng, 12, 6_000);
    assert_modelled(&t, &oracle, "after the GPU took over");
}

#[test]
fn growth_during_a_background_start_waits_for_it_and_runs_on_the_gpu() {
    let Some(Setup { mut rng, dir: _dir, path, mut oracle }) = setup("growth", 1_024) else {
        return;
    };
    let gate = Arc::new(Barrier::new(2));
    let t = GpHash::open(&path, &background(&gate)).unwrap();
    // Long enough for the batches before the growth to run on the CPU model.
    let releaser = release_later(&gate, Duration::from_secs(2));
    let before = t.geometry().top_level;
    let mut grew_on = None;
    for i in 0..40u64 {
        assert!(is_cpu(&t), "batch {i}: the start is held until the growth waits for it");
        let mut b = gphash::Batch::new(KB, VB);
        for k in 0..500 {
            let key = common::key(100_000 + i * 500 + k, KB);
            b.insert(&key, &common::value(&mut rng, VB)).unwrap();
        }
        let want = oracle.run(&b);
        let got = t.execute_ordered(&b).unwrap();
        assert!(want.iter().enumerate().all(|(j, (s, _))| got.statuses[j] == *s), "batch {i}");
        if t.geometry().top_level > before {
            grew_on = Some(i);
            break;
        }
    }
    let grew_on = grew_on.expect("the inserts grow the table");
    releaser.join().unwrap();
    assert!(!is_cpu(&t), "growth waited for the start and made its engine on the GPU: {}", t.stats().mode);
    assert!(t.activity().resizes >= 1, "batch {grew_on} grew the table");
    run_calls(&t, &mut oracle, &mut rng, 6, 130_000);
    assert_modelled(&t, &oracle, "after growth");
}

#[test]
fn closing_and_dropping_wait_for_the_start_and_lose_nothing() {
    let Some(Setup { mut rng, dir: _dir, path, mut oracle }) = setup("close", 8_192) else {
        return;
    };
    let (t, held) = open_held(&path);
    run_calls(&t, &mut oracle, &mut rng, 3, 4_000);
    let releaser = held.release_later(Duration::from_millis(100));
    let closing = std::time::Instant::now();
    t.close().unwrap();
    assert!(closing.elapsed() >= Duration::from_millis(50), "the close waited for the start");
    releaser.join().unwrap();
    let t = GpHash::open(&path, &common::cpu_options()).unwrap();
    assert!(t.stats().recovery.clean_shutdown, "closed during the start: cleanly");
    assert_same_content(t.entries(), &oracle.map, "closed during the start");
    drop(t);

    let (t, held) = open_held(&path);
    run_calls(&t, &mut oracle, &mut rng, 3, 4_000);
    let releaser = held.release_later(Duration::from_millis(100));
    let dropping = std::time::Instant::now();
    drop(t);
    assert!(dropping.elapsed() >= Duration::from_millis(50), "the drop waited for the start");
    releaser.join().unwrap();
    let t = GpHash::open(&path, &common::cpu_options()).unwrap();
    assert!(t.check().ok(), "dropped during the start: recovered");
    assert_same_content(t.entries(), &oracle.map, "dropped during the start");
}

#[test]
fn a_device_batch_waits_for_the_start() {
    let Some(Setup { rng: _, dir: _dir, path, oracle }) = setup("device", 8_192) else {
        return;
    };
    let gpu = common::gpu().unwrap();
    let mut b = gphash::Batch::new(KB, VB);
    let keys: Vec<_> = oracle.map.keys().take(200).cloned().collect();
    for k in &keys {
        b.get(k).unwrap();
    }
    b.get(&common::key(1 << 40, KB)).unwrap();
    let buffers = device_buffers::Buffers::new(&gpu, &b, true);
    let gate = Arc::new(Barrier::new(2));
    let t = GpHash::open(&path, &background(&gate)).unwrap();
    let releaser = release_later(&gate, Duration::from_millis(100));
    t.execute_device(&buffers.batch()).unwrap();
    releaser.join().unwrap();
    assert!(!is_cpu(&t), "{}", t.stats().mode);
    let statuses = device_buffers::download(&gpu, &buffers.buffers[3]);
    let found = device_buffers::download(&gpu, &buffers.buffers[4]);
    let vw = VB / 4;
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(statuses[i], Status::Ok as u32, "get {i}");
        let value: &[u8] = bytemuck::cast_slice(&found[i * vw..(i + 1) * vw]);
        assert_eq!(value, &oracle.map[k][..], "get {i}");
    }
    assert_eq!(statuses[keys.len()], Status::NotFound as u32);
}

#[test]
fn a_start_that_fails_leaves_the_cpu_model_running() {
    let Some(Setup { mut rng, dir: _dir, path, mut oracle }) = setup("fails", 8_192) else {
        return;
    };
    // A tile no engine takes: the engine fails to be made, in the background and again when
    // the index takes the GPU over.
    let options = Options {
        gpu_start: GpuStartMode::Background,
        ..gpu_options(GpuOptions { tile: 3, ..GpuOptions::default() })
    };
    let t = GpHash::open(&path, &options).unwrap();
    let why = t.wait_for_gpu().unwrap_err().to_string();
    assert!(why.contains("no engine could be made") && why.contains("tile of 3 lanes"), "{why}");
    match t.stats().mode {
        Mode::Cpu { reason } => assert!(reason.contains("tile of 3 lanes"), "{reason}"),
        other => panic!("the CPU model runs on, not {other}"),
    }
    assert!(t.gpu().is_none());
    run_calls(&t, &mut oracle, &mut rng, 6, 4_000);
    let mut deletes = gphash::Batch::new(KB, VB);
    for k in oracle.map.keys().take(100).cloned().collect::<Vec<_>>() {
        deletes.delete(&k).unwrap();
    }
    oracle.run(&deletes);
    assert!(t.execute(&deletes).unwrap().statuses.iter().all(|s| *s == Status::Ok));
    assert_same_content(t.entries(), &oracle.map, "on the CPU model");
}

#[test]
fn a_pipeline_takes_the_gpu_over_between_its_batches() {
    let Some(Setup { mut rng, dir: _dir, path, mut oracle }) = setup("pipeline", 8_192) else {
        return;
    };
    let (t, mut held) = open_held(&path);
    let mut pipe = t.pipeline();
    for i in 0..12 {
        if i == 4 {
            held.release();
            // The thread ends once past the gate.
            std::thread::sleep(Duration::from_millis(100));
        }
        // Distinct keys: a pipeline's batch runs as `execute`, whose order for repeated keys
        // is its own.
        let mut b = gphash::Batch::new(KB, VB);
        for k in rand::seq::index::sample(&mut rng, 4_000, 300) {
            let (key, v) = (common::key(k as u64, KB), common::value(&mut rng, VB));
            match common::random_kind(&mut rng) {
                gphash::OpKind::Get => b.get(&key),
                gphash::OpKind::Delete => b.delete(&key),
                kind => b.push(kind, &key, Some(&v)),
            }
            .unwrap();
        }
        let want = oracle.run(&b);
        pipe.submit(b).unwrap();
        // Taken at once: nothing is in flight at the next submit, where the GPU may take over.
        let got = pipe.next().expect("a result").unwrap();
        for (j, (status, value)) in want.iter().enumerate() {
            assert_eq!(got.statuses[j], *status, "batch {i}, op {j}");
            assert_eq!(got.value(j), value.as_deref(), "batch {i}, op {j}");
        }
    }
    drop(pipe);
    let stats = t.stats();
    assert!(stats.gpu_start.is_some(), "the pipeline took the GPU over: {}", stats.mode);
    assert!(!is_cpu(&t));
    assert_same_content(t.entries(), &oracle.map, "after the pipeline");
}

/// By default a GPU starts in the background under `Executor::Auto` (the open waits for
/// nothing but the pool) and before the open returns under `Executor::Gpu` (which promises a
/// GPU or an error from the open); `GpuStartMode::Wait` waits under either.
#[test]
fn the_default_start_is_in_the_background_unless_a_gpu_was_demanded() {
    let Some(Setup { mut rng, dir: _dir, path, mut oracle }) = setup("default_start", 8_192) else {
        return;
    };
    let gate = Arc::new(Barrier::new(2));
    let auto = Options {
        executor: gphash::Executor::Auto,
        gpu_start_gate: Some(gate.clone()),
        ..gpu_options(GpuOptions::default())
    };
    assert_eq!(auto.gpu_start, GpuStartMode::Auto, "the default");
    let t = GpHash::open(&path, &auto).unwrap();
    let held = Held(Some(gate));
    assert!(t.gpu_starting(), "Auto opens without waiting for the GPU");
    assert!(is_cpu(&t), "{}", t.stats().mode);
    run_calls(&t, &mut oracle, &mut rng, 3, 4_000);
    drop(held);
    t.wait_for_gpu().unwrap();
    assert!(!t.gpu_starting() && !is_cpu(&t), "{}", t.stats().mode);
    run_calls(&t, &mut oracle, &mut rng, 3, 4_000);
    assert_modelled(&t, &oracle, "after the default background start");
    t.close().unwrap();

    for (what, options) in [
        ("Gpu", gpu_options(GpuOptions::default())),
        (
            "Auto, Wait",
            Options {
                executor: gphash::Executor::Auto,
                gpu_start: GpuStartMode::Wait,
                ..gpu_options(GpuOptions::default())
            },
        ),
    ] {
        let t = GpHash::open(&path, &options).unwrap();
        assert!(!t.gpu_starting() && !is_cpu(&t), "{what}: the open waited for the GPU: {}", t.stats().mode);
        assert!(t.stats().gpu_start.is_none(), "{what}: nothing took over");
        t.close().unwrap();
    }
}

/// While a GPU starts, the CPU model's engine batches are no larger than the GPU's engine
/// takes, whatever the values and the placement: a call that grows the table takes the GPU
/// over in the middle, and goes on in engine batches of the size it had.
#[test]
fn batches_during_the_start_fit_the_engine_that_takes_over() {
    if !have_gpu() {
        return;
    }
    let dir = pool_dir();
    for value_bytes in [8u32, 1_024, 16_384] {
        for placement in [gphash::Placement::ZeroCopy, gphash::Placement::Staged] {
            let path = dir.path().join(format!("v{value_bytes}-{placement:?}.pool"));
            let what = format!("{value_bytes}-byte values, {placement:?}");
            let config = Config { key_bytes: KB as u32, value_bytes, capacity: 1_000, ..Config::default() };
            let gpu = GpuOptions { placement, ..GpuOptions::default() };
            GpHash::create(Some(&path), &config, &gpu_options(gpu.clone())).unwrap().close().unwrap();
            let gate = Arc::new(Barrier::new(2));
            let options = Options {
                gpu_start: GpuStartMode::Background,
                gpu_start_gate: Some(gate.clone()),
                ..gpu_options(gpu)
            };
            let t = GpHash::open(&path, &options).unwrap();
            let mut held = Held(Some(gate));
            let starting = t.stats().max_batch;
            held.release();
            t.wait_for_gpu().unwrap();
            let engine = t.stats().max_batch;
            assert!(
                (1..=engine).contains(&starting),
                "{what}: {starting} operations a batch while starting, {engine} on the GPU"
            );
            assert!(starting < gphash::MAX_BATCH, "{what}: the CPU model's own limit is not the bound");
        }
    }
}

/// A pool `name` of `capacity` keys made on `device` (a GPU whose bindings are limited: engine
/// batches of a few hundred operations), closed, and the engine batches it takes there.
fn limited_pool(
    dir: &tempfile::TempDir,
    name: &str,
    device: &Arc<gphash::Gpu>,
    capacity: u64,
) -> (std::path::PathBuf, usize) {
    let path = dir.path().join(name);
    let config = Config { key_bytes: KB as u32, value_bytes: VB as u32, capacity, ..Config::default() };
    let options = Options { device: Some(device.clone()), ..gpu_options(GpuOptions::default()) };
    let t = GpHash::create(Some(&path), &config, &options).unwrap();
    let engine = t.stats().max_batch;
    t.close().unwrap();
    (path, engine)
}

/// Options that start `device` in the background, held at `gate`.
fn limited_background(device: &Arc<gphash::Gpu>, gate: &Arc<Barrier>) -> Options {
    Options { device: Some(device.clone()), ..background(gate) }
}

/// A call larger than the GPU's engine takes, made while the GPU starts, that grows the table
/// (and so takes the GPU over in its middle) completes, every key as the model has it.
#[test]
fn a_call_that_grows_the_table_during_the_start_completes_on_the_gpu() {
    if !have_gpu() {
        return;
    }
    let device = common::gpu_with_binding_limit(16 << 10);
    let dir = pool_dir();
    let (path, engine) = {
        let (_, engine) = limited_pool(&dir, "probe.pool", &device, 1_000);
        // Room for a quarter of the call: it grows the table.
        limited_pool(&dir, "t.pool", &device, (engine / 4) as u64)
    };
    let mut rng = StdRng::seed_from_u64(seed("grows_mid_call"));
    let mut batch = gphash::Batch::new(KB, VB);
    for k in 0..(engine + engine / 8) as u64 {
        batch.insert(&common::key(k, KB), &common::value(&mut rng, VB)).unwrap();
    }
    let mut oracle = Oracle::default();
    oracle.run(&batch);
    let gate = Arc::new(Barrier::new(2));
    let t = GpHash::open(&path, &limited_background(&device, &gate)).unwrap();
    // Released while the call runs on the CPU model, before its growth waits for the start.
    let releaser = release_later(&gate, Duration::from_millis(200));
    let done = t.execute(&batch).unwrap();
    assert!(done.statuses.iter().all(|s| *s == Status::Ok), "every insert of the call");
    releaser.join().unwrap();
    assert!(!is_cpu(&t), "the growth took the GPU over: {}", t.stats().mode);
    assert_eq!(t.stats().max_batch, engine, "the GPU's engine batches");
    assert!(t.activity().resizes >= 1, "the call grew the table");
    assert_modelled(&t, &oracle, "after the call");
}

/// A pipeline's batch larger than a GPU still starting may take waits for the start, and then
/// runs on the GPU, where it fits.
#[test]
fn a_pipeline_batch_larger_than_the_start_allows_waits_for_the_gpu() {
    if !have_gpu() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(seed("pipeline_waits"));
    let dir = pool_dir();
    let device = common::gpu_with_binding_limit(16 << 10);
    let (path, engine) = limited_pool(&dir, "t.pool", &device, 4 * 1_024);
    let mut oracle = Oracle::default();
    let gate = Arc::new(Barrier::new(2));
    let t = GpHash::open(&path, &limited_background(&device, &gate)).unwrap();
    let held = Held(Some(gate));
    let starting = t.stats().max_batch;
    assert!(starting < engine, "the start allows {starting}, the GPU {engine}");
    let mut pipe = t.pipeline();
    let releaser = held.release_later(Duration::from_millis(100));
    for round in 0..3 {
        let mut b = gphash::Batch::new(KB, VB);
        for k in rand::seq::index::sample(&mut rng, 100_000, engine) {
            b.upsert(&common::key(k as u64, KB), &common::value(&mut rng, VB)).unwrap();
        }
        let want = oracle.run(&b);
        pipe.submit(b).unwrap();
        let got = pipe.next().expect("a result").unwrap();
        assert!(want.iter().enumerate().all(|(j, (s, _))| got.statuses[j] == *s), "round {round}");
    }
    drop(pipe);
    releaser.join().unwrap();
    assert!(!is_cpu(&t), "the GPU took over: {}", t.stats().mode);
    assert_modelled(&t, &oracle, "after the pipeline");
}
