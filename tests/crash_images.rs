//! The power-failure model. A run of batches (growing the table several times) is recorded at
//! every persist point. A crash image is the durable state at one persist point plus any
//! subset of the 8-byte words written before the next one (the rest lost). Every image must
//! recover to: all acknowledged batches applied, and each operation of the batch in flight
//! either whole or absent; `check` finds nothing wrong; a read-only inspection before recovery
//! predicts what recovery does and finds the image consistent. Runs end with a clean close,
//! whose images (the allocator saved, then the header marked clean) are tested too.
//!
//! `GPHASH_CRASH_IMAGES` sets how many images to test (default 2000); `GPHASH_TEST_SEED`
//! replays a run.

mod common;
#[path = "common/device.rs"]
mod device_buffers;

use common::crash::{Content, CrashRun, assert_whole_or_absent};
use common::oracle::Oracle;
use gphash::{CacheOptions, Config, GpuOptions, Options};
use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};

/// Batches of distinct keys (each operation of a batch stands alone) over keys that later
/// batches repeat.
fn random_batch(t: &gphash::GpHash, rng: &mut StdRng) -> gphash::Batch {
    let mut batch = t.batch();
    for k in sample(rng, 6000, 150) {
        let key = common::key(k as u64, 8);
        let v = common::value(rng, 12);
        match rng.random_range(0..10) {
            0..5 => batch.insert(&key, &v).unwrap(),
            5..7 => batch.upsert(&key, &v).unwrap(),
            7 => batch.update(&key, &v).unwrap(),
            8 => batch.delete(&key).unwrap(),
            _ => batch.get(&key).unwrap(),
        }
    }
    batch
}

/// Submits `batches` to the pipeline `p`, taking outcomes (each acknowledged by its index) at
/// random moments while one is in flight and always while two are.
fn in_flight<'a, P: Iterator<Item = gphash::Result<R>>, B, R>(
    p: &mut P,
    batches: &'a [B],
    mut submit: impl FnMut(&mut P, &'a B) -> gphash::Result<()>,
    pending: impl Fn(&P) -> usize,
    rng: &mut StdRng,
    mut acknowledge: impl FnMut(usize),
) {
    let mut next = 0;
    for b in batches {
        submit(p, b).unwrap();
        while pending(p) > 1 || (pending(p) > 0 && rng.random_bool(0.2)) {
            p.next().unwrap().unwrap();
            acknowledge(next);
            next += 1;
        }
    }
    for r in p {
        r.unwrap();
        acknowledge(next);
        next += 1;
    }
}

/// How a run's batches are applied.
#[derive(Clone, Copy, PartialEq)]
enum Run {
    OneAtATime,
    /// `GpHash::pipeline`: host batches in flight.
    Pipeline,
    /// `GpHash::device_pipeline`: the same batches in device buffers, in flight.
    DevicePipeline,
}

/// A run of 40 batches, applied as `how` says, recorded at every persist point; then its crash
/// images.
fn crash_images(how: Run, what: &str) {
    let seed = common::seed(what);
    let mut rng = StdRng::seed_from_u64(seed);
    let wanted: usize =
        std::env::var("GPHASH_CRASH_IMAGES").ok().and_then(|s| s.parse().ok()).unwrap_or(2000);
    // In a pipeline a result may be taken a submit after it was acknowledged, when two more
    // batches are in flight.
    let mut run = if how == Run::OneAtATime { CrashRun::default() } else { CrashRun::with_depth(3) };
    // A bucket cache on every device (by default a CPU device has none): its claims decide on
    // the cached copy before the pool's CAS, which the images must survive.
    let gpu = GpuOptions {
        cache: CacheOptions { ratio: Some(0.5), ..CacheOptions::default() },
        ..GpuOptions::default()
    };
    let options = Options { observer: Some(run.observer()), ..common::gpu_options(gpu) };
    let dir = common::pool_dir();
    let t =
        common::table(&dir, "run", &Config { capacity: 64, value_bytes: 12, ..Default::default() }, &options);
    let mut oracle = Oracle::default();
    let batches: Vec<_> = (0..40).map(|_| random_batch(&t, &mut rng)).collect();
    let mut acknowledge = |i: usize| {
        oracle.run(&batches[i]);
        run.acknowledged(batches[i].clone(), &oracle.map);
    };
    match how {
        Run::OneAtATime => {
            for (i, b) in batches.iter().enumerate() {
                t.execute(b).unwrap();
                acknowledge(i);
            }
        }
        Run::Pipeline => {
            let mut p = t.pipeline();
            in_flight(&mut p, &batches, |p, b| p.submit(b.clone()), |p| p.pending(), &mut rng, acknowledge);
        }
        Run::DevicePipeline => {
            let gpu = common::gpu().expect("device batches need a GPU");
            let buffers: Vec<_> =
                batches.iter().map(|b| device_buffers::Buffers::new(&gpu, b, false)).collect();
            let mut p = t.device_pipeline();
            in_flight(&mut p, &buffers, |p, b| p.submit(b.batch()), |p| p.pending(), &mut rng, acknowledge);
        }
    }
    assert!(t.stats().activity.resizes >= 3, "the run must cross resizes");
    // The images of the close (the allocator saved, then the clean header) recover too.
    t.close().unwrap();

    run.check_images(wanted, &mut rng, seed, &dir.path().join("image"), verify);
}

#[test]
fn crash_images_recover_to_acknowledged_states() {
    crash_images(Run::OneAtATime, "crash_images_recover_to_acknowledged_states");
}

/// The same with batches in flight: reads-only batches back to back, encoding and decoding
/// beside the GPU's work.
#[test]
fn crash_images_of_a_pipeline_recover_to_acknowledged_states() {
    crash_images(Run::Pipeline, "crash_images_of_a_pipeline_recover_to_acknowledged_states");
}

/// The same with device batches in flight (`execute_device`'s path: inputs and results in
/// device buffers).
#[test]
fn crash_images_of_a_device_pipeline_recover_to_acknowledged_states() {
    crash_images(Run::DevicePipeline, "crash_images_of_a_device_pipeline_recover_to_acknowledged_states");
}

/// A pipelined run on the CPU executor (which runs each phase when it starts) whose every
/// batch replaces every value: from the third batch on, allocation must wrap onto cells that
/// earlier batches freed. A later batch's phase A that ran before the persist of the phase B
/// that freed them would overwrite cells a crash image still references.
#[test]
fn crash_images_of_a_pipeline_whose_next_batch_needs_the_freed_cells() {
    let what = "crash_images_of_a_pipeline_whose_next_batch_needs_the_freed_cells";
    let seed = common::seed(what);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut run = CrashRun::with_depth(3);
    let options = Options { observer: Some(run.observer()), ..common::cpu_options() };
    let dir = common::pool_dir();
    let config = Config { capacity: 1600, value_bytes: 12, ..Default::default() };
    let t = common::table(&dir, "run", &config, &options);
    let keys: Vec<Vec<u8>> = (0..1600).map(|k| common::key(k, 8)).collect();
    let stats = t.stats();
    assert!(stats.cells < stats.slots + 2 * keys.len() as u64, "3 batches' values exceed the heap");
    let batches: Vec<_> = (0..4)
        .map(|_| {
            let mut b = t.batch();
            for k in &keys {
                b.upsert(k, &common::value(&mut rng, 12)).unwrap();
            }
            b
        })
        .collect();
    let mut oracle = Oracle::default();
    let mut p = t.pipeline();
    let mut acknowledge = |next: usize, r: gphash::Result<gphash::BatchResult>| {
        r.unwrap();
        oracle.run(&batches[next]);
        run.acknowledged(batches[next].clone(), &oracle.map);
    };
    let mut next = 0;
    for b in &batches {
        p.submit(b.clone()).unwrap();
        while p.pending() > 1 {
            acknowledge(next, p.next().unwrap());
            next += 1;
        }
    }
    for r in p {
        acknowledge(next, r);
        next += 1;
    }
    drop(t);
    let wanted = std::env::var("GPHASH_CRASH_IMAGES").ok().and_then(|s| s.parse().ok()).unwrap_or(100);
    run.check_images(wanted, &mut rng, seed, &dir.path().join("image"), verify);
}

/// The image at `path` recovers to `acked`, with each operation of the batches `in_flight`
/// (each with the content its complete application gives) whole or absent.
fn verify(path: &std::path::Path, acked: &Content, in_flight: &[(&gphash::Batch, &Content)], what: &str) {
    // Inspected first: read-only, it predicts what opening does.
    let (_, t) = common::killed::inspect_and_open(path, what);
    let report = t.check();
    assert!(report.ok(), "{what}: {report}");
    let got: Content = t.entries().into_iter().collect();
    assert_whole_or_absent(&got, acked, in_flight, what);
}

/// A run whose insertions outgrow the heap before the table: every image taken while the heap
/// grows (pool grown, header switched) recovers to the acknowledged state.
#[test]
fn crash_images_of_a_heap_growth_recover_to_acknowledged_states() {
    let what = "crash_images_of_a_heap_growth_recover_to_acknowledged_states";
    let seed = common::seed(what);
    let mut rng = StdRng::seed_from_u64(seed);
    let wanted: usize = std::env::var("GPHASH_CRASH_IMAGES").ok().and_then(|s| s.parse().ok()).unwrap_or(100);
    let mut run = CrashRun::default();
    let options = Options { observer: Some(run.observer()), ..common::cpu_options() };
    let dir = common::pool_dir();
    let t = common::table(
        &dir,
        "run",
        &Config { capacity: 16_000, value_bytes: 12, ..Default::default() },
        &options,
    );
    let mut oracle = Oracle::default();
    for start in (0..21_000u64).step_by(3000) {
        let mut batch = t.batch();
        for k in start..start + 3000 {
            batch.insert(&common::key(k, 8), &common::value(&mut rng, 12)).unwrap();
        }
        t.execute(&batch).unwrap();
        oracle.run(&batch);
        run.acknowledged(batch, &oracle.map);
    }
    let activity = t.stats().activity;
    assert!(activity.heap_growths > 0 && activity.resizes == 0, "{activity:?}");
    t.close().unwrap();
    run.check_images(wanted, &mut rng, seed, &dir.path().join("image"), verify);
}
