//! `bench profile`'s accounting (not speed): its stages add up to the wall time of the batches
//! measured, and the breakdowns agree with the index's coarse counters; kernels are timed one
//! by one only when asked, and within the time the host waited for them; the round trip it
//! holds batches to has the shape asked for. And `bench reach`'s kernels read what its model
//! says, each way the device can take.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::sync::Mutex;
use std::time::Duration;

use gphash::{Config, GpHash, GpuOptions, KernelTimes, Placement, Profile};
use gphash_bench::ceiling::{self, Via};
use gphash_bench::profile::{Measured, ProfileBench, Rep};
use gphash_bench::reach::{self, Way};

/// The tests run one at a time: another test's work on the same cores (the harness runs
/// tests in parallel) would stretch a measured batch's wall time past the stages it is made of.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|held| held.into_inner())
}

/// A small profile of batches of 64 and 1,024 with its pool in `dir`: 3 repetitions of 2
/// batches, 5 round trips, one call at a time, host batches.
fn small(dir: &tempfile::TempDir) -> ProfileBench {
    ProfileBench {
        keys: 3000,
        batches: vec![64, 1024],
        reps: 3,
        rounds: 2,
        key_bytes: 8,
        value_bytes: 8,
        seed: 7,
        floor_reps: 5,
        pool_dir: dir.path().into(),
        pipeline: false,
        load_cache: false,
        device: false,
        alternate: 0,
    }
}

fn profile(placement: Placement, pipeline: bool, device: bool) -> Vec<Measured> {
    let dir = common::pool_dir();
    let bench = ProfileBench { pipeline, device, ..small(&dir) };
    let options = common::gpu_options(GpuOptions { placement, ..GpuOptions::default() });
    let mut reported = 0;
    let measured = bench.run(&options, &mut |_| reported += 1).unwrap();
    assert_eq!(reported, measured.len());
    measured
}

fn check(measured: &[Measured]) {
    assert_eq!(
        measured.iter().map(|m| (m.workload, m.batch)).collect::<Vec<_>>(),
        [("search", 64), ("insert", 64), ("search", 1024), ("insert", 1024)]
    );
    for m in measured {
        assert_eq!(m.reps.len(), 3);
        for r in &m.reps {
            let p = &r.profile;
            // The host stages are host_time split; the engine's timed stages lie inside
            // engine_time (so `engine other` is not clamped).
            assert_eq!(p.encode + p.fold + p.decode, r.host, "{m}");
            assert!(p.engine_stages() <= r.engine, "{m}");
            assert!(r.accounted() <= r.wall, "{m}");
            // Every batch was encoded and decoded; every insert batch was ordered (its keys
            // grouped) and persisted; searches, which only read, are never ordered.
            assert!(p.encode > Duration::ZERO && p.decode > Duration::ZERO, "{m}");
            if m.workload == "insert" {
                assert!(p.fold > Duration::ZERO && p.persist > Duration::ZERO, "{m}");
            } else {
                assert_eq!(p.fold, Duration::ZERO, "{m}");
            }
            if common::gpu().is_some() {
                assert!(
                    p.writes > Duration::ZERO && p.submit > Duration::ZERO && p.wait > Duration::ZERO,
                    "{m}"
                );
            }
        }
        stages_cover_the_wall(m);
        // The table prints every stage, the unaccounted rest and the wall time.
        let table = m.to_string();
        for stage in ["encode", "fold", "wait", "lines", "persist", "engine other", "unaccounted", "wall"] {
            assert!(table.lines().any(|l| l.starts_with(stage)), "no {stage} row:\n{table}");
        }
        let timestamps = common::gpu().is_some_and(|g| g.info.timestamps);
        assert_eq!(m.untimed.is_none(), timestamps, "{m}");
        let rows: &[&str] = match (timestamps, m.workload) {
            (false, _) => &["gpu kernels"],
            (true, "search") => &["gpu search", "gpu idle between kernels", "gpu total"],
            (true, _) => &["gpu alloc", "gpu phase_a", "gpu phase_b", "gpu free_cells", "gpu total"],
        };
        for row in rows {
            assert!(table.lines().any(|l| l.starts_with(row)), "no {row} row:\n{table}");
        }
        // A batch of gets runs its lookups alone.
        if timestamps && m.workload == "search" {
            assert!(!table.lines().any(|l| l.starts_with("gpu alloc")), "an alloc row:\n{table}");
        }
        assert_eq!(m.floor.is_some(), common::gpu().is_some(), "{m}");
        if let Some(floor) = m.floor {
            assert_eq!((floor.items, floor.reps), (m.batch as u64, 5));
            assert!(m.floor_ratio().is_some_and(|r| r > 0.0) && table.contains("x this floor"), "{table}");
        }
        if timestamps {
            for r in &m.reps {
                // A search batch submits once (its results come back with phase A), an insert
                // batch twice.
                let submits = if m.workload == "search" { 1 } else { 2 };
                kernel_times_within(&r.profile, submits * m.rounds as u64);
            }
        }
    }
}

/// Kernel times present and consistent: every submit timed, nonzero, no more than the span of
/// their submits, and that no more than the time the host spent submitting and waiting (with a
/// little slack for the two clocks).
fn kernel_times_within(p: &Profile, submits: u64) {
    let k = &p.kernels;
    assert!(k.submits >= submits, "{k:?}");
    assert!(k.busy() > Duration::ZERO && k.busy() <= k.span, "{k:?}");
    let host = p.submit + p.wait;
    assert!(k.span <= host + host / 20 + Duration::from_micros(200) * k.submits as u32, "{k:?} in {host:?}");
}

/// Pipelined batches are measured the same way: every batch encoded, decoded and, for
/// inserts, persisted, in every repetition.
#[test]
fn pipelined_profile_measures_every_batch() {
    let _alone = alone();
    for m in profile(Placement::Auto, true, false) {
        assert_eq!(m.reps.len(), 3);
        for r in &m.reps {
            let p = &r.profile;
            assert!(r.wall > Duration::ZERO && p.encode > Duration::ZERO && p.decode > Duration::ZERO, "{m}");
            assert_eq!(p.fold, Duration::ZERO, "{m}");
            assert!(m.workload == "search" || p.persist > Duration::ZERO, "{m}");
        }
    }
}

/// Kernels are timed only when asked, into the profile's kernel times (where the device has
/// timestamp queries); normal batches record none.
#[test]
fn kernel_times_only_when_asked() {
    let _alone = alone();
    let Some(gpu) = common::gpu() else { return };
    for time_kernels in [false, true] {
        let dir = common::pool_dir();
        let config = Config { capacity: 20_000, ..Config::default() };
        let options = common::gpu_options(GpuOptions { time_kernels, ..GpuOptions::default() });
        let index = GpHash::create(Some(&dir.path().join("t.pool")), &config, &options).unwrap();
        let keys: Vec<u8> = (0..5000u64).flat_map(|i| (i * 7 + 1).to_le_bytes()).collect();
        index.insert(&keys, &vec![3; 5000 * 8]).unwrap();
        let values = index.get(&keys).unwrap();
        assert!(values.statuses.iter().all(|&s| s == gphash::Status::Ok), "{:?}", &values.statuses[..4]);
        let p = index.activity().profile;
        if time_kernels && gpu.info.timestamps {
            // An insert batch submits twice (phase A, phase B), a get batch once.
            kernel_times_within(&p, 3);
            let named: Vec<(&str, Duration)> = p.kernels.named().filter(|(_, t)| !t.is_zero()).collect();
            for kernel in ["alloc", "phase_a", "search", "phase_b", "free_cells"] {
                assert!(named.iter().any(|(n, _)| *n == kernel), "{kernel} not timed: {named:?}");
            }
        } else {
            assert_eq!(p.kernels, KernelTimes::default());
        }
        index.close().unwrap();
    }
}

/// `--alternate`: for each batch size, searches then inserts, each repetition with as many
/// batches as round trips, every batch recorded and waited for (the bench checks each host
/// batch's statuses), and each repetition's ratio that of its medians; host and device
/// batches.
#[test]
fn alternated_batches_and_round_trips() {
    let _alone = alone();
    let Some(_) = common::gpu() else { return };
    for device in [false, true] {
        let dir = common::pool_dir();
        let bench = ProfileBench { reps: 2, device, alternate: 5, ..small(&dir) };
        let options = common::gpu_options(GpuOptions::default());
        let none = ProfileBench { alternate: 0, ..bench.clone() };
        assert!(matches!(none.alternated(&options, &mut |_| {}), Err(gphash::Error::InvalidConfig(_))));
        let mut reported = 0;
        let measured = bench.alternated(&options, &mut |_| reported += 1).unwrap();
        assert_eq!(reported, measured.len());
        assert_eq!(
            measured.iter().map(|m| (m.workload, m.batch, m.device)).collect::<Vec<_>>(),
            [
                ("search", 64, device),
                ("insert", 64, device),
                ("search", 1024, device),
                ("insert", 1024, device)
            ]
        );
        for m in &measured {
            assert_eq!((m.reps.len(), m.vulkan.len(), m.stages.len()), (2, 2, 2), "{m}");
            assert!(m.vulkan.iter().all(|v| v.len() == 5 && v.iter().all(|t| *t > Duration::ZERO)), "{m}");
            for ((batches, trips), stages) in m.reps.iter().zip(&m.stages) {
                assert_eq!((batches.len(), trips.len()), (5, 5), "{m}");
                assert!(batches.iter().chain(trips).all(|t| *t > Duration::ZERO), "{m}");
                assert!(stages.record > Duration::ZERO && stages.wait > Duration::ZERO, "{m}");
                // Only host batches are encoded.
                assert_eq!(stages.encode > Duration::ZERO, !device, "{m}");
            }
            for (r, (batches, trips)) in m.ratios().iter().zip(&m.reps) {
                let median = |xs: &[Duration]| {
                    let mut xs = xs.to_vec();
                    xs.sort();
                    xs[2]
                };
                let want = median(batches).as_secs_f64() / median(trips).as_secs_f64();
                assert!((r - want).abs() < 1e-9, "{r} against {want}: {m}");
            }
            let table = m.to_string();
            assert!(table.contains("batch p50 over round trip p50: median"), "{table}");
        }
    }
}

/// The round trips measured are those asked for, and their medians lie within their extremes.
#[test]
fn round_trip_shape() {
    let _alone = alone();
    let Some(gpu) = common::gpu() else { return };
    // Each count through wgpu and through Vulkan itself; each round trip checks every word it
    // reads back (the input plus one, different input each time), so an `Ok` is a right one.
    let trips = ceiling::round_trips(&gpu, &[1, 4096, 5000], 7).unwrap();
    let (w, v) = (Via::Wgpu, Via::Vulkan);
    assert_eq!(
        trips.iter().map(|t| (t.via, t.items, t.reps)).collect::<Vec<_>>(),
        [(w, 1, 7), (v, 1, 7), (w, 4096, 7), (v, 4096, 7), (w, 5000, 7), (v, 5000, 7)]
    );
    for t in &trips {
        assert!(Duration::ZERO < t.min && t.min <= t.median && t.median <= t.max, "{t}");
    }
}

/// `bench reach` measures every way the device can take over a region of several windows (the
/// last one partial), each checked against the model inside `measure` (a wrong read is an
/// error); it refuses a region or window it cannot split, and a device without host imports.
#[test]
fn reach_ways_read_what_the_model_says() {
    let _alone = alone();
    let Some(gpu) = common::gpu() else { return };
    let info = &gpu.info;
    let window = (256u64 << 10).max(info.import_alignment);
    let method = ceiling::Method { bytes: 0, reps: 2, target: Duration::from_millis(20) };
    let bytes = 8 * window + 3 * reach::LINE_BYTES;
    if !info.host_import {
        let refused = reach::measure(&gpu, (bytes, window), false, &method);
        assert!(matches!(refused, Err(gphash::Error::InvalidConfig(_))), "{refused:?}");
        return;
    }
    let reached = reach::measure(&gpu, (bytes, window), false, &method).unwrap();
    let mut expected = vec![Way::FirstWindow];
    if info.int64 && info.max_storage_buffers > 9 {
        expected.push(Way::Bindings);
    }
    if info.int64 && info.binding_arrays >= 9 {
        expected.push(Way::BindingArray);
    }
    if info.device_addresses {
        expected.push(Way::DeviceAddress);
    }
    assert_eq!(reached.iter().map(|r| r.way).collect::<Vec<_>>(), expected);
    for r in &reached {
        assert_eq!(r.rates.len(), 2, "{:?}", r.way);
        assert!(r.rates.iter().all(|&rate| rate.is_finite() && rate > 0.0), "{r:?}");
        let expected = match r.way {
            Way::FirstWindow => (window, 1),
            Way::DeviceAddress => (bytes, 1),
            _ => (bytes, 9),
        };
        assert_eq!((r.bytes, r.windows), expected, "{:?}", r.way);
    }
    for (bytes, window) in [(100, window), (8 * window, window + 128), (8 * window, 128)] {
        let refused = reach::measure(&gpu, (bytes, window), false, &method);
        assert!(matches!(refused, Err(gphash::Error::InvalidConfig(_))), "{bytes} in windows of {window}");
    }
}

/// `bench reach`'s kernels at every subgroup size lavapipe gives (they use no subgroup
/// operation, so the size must change nothing they read).
#[test]
fn reach_at_subgroup_sizes_4_to_128() {
    let _alone = alone();
    if common::gpu().is_none() {
        return;
    }
    common::rerun_at_subgroup_sizes(&["reach_ways_read_what_the_model_says"], 1);
}

#[test]
fn stages_add_up_zero_copy() {
    let _alone = alone();
    check(&profile(Placement::Auto, false, false));
}

#[test]
fn stages_add_up_staged() {
    let _alone = alone();
    let measured = profile(Placement::Staged, false, false);
    check(&measured);
    if common::gpu().is_some() {
        // Staged inserts read back the lines they wrote with their contents.
        assert!(
            measured
                .iter()
                .filter(|m| m.workload == "insert")
                .all(|m| m.reps.iter().all(|r| r.profile.lines > Duration::ZERO))
        );
    }
}

/// Device batches (a volatile table): inputs are already on the device, so the host neither
/// encodes nor decodes; the engine's stages and the kernels account for the wall time.
#[test]
fn device_batches_have_no_host_stages() {
    let _alone = alone();
    if common::gpu().is_none() {
        return;
    }
    for m in profile(Placement::Volatile, false, true) {
        assert_eq!(m.reps.len(), 3);
        for r in &m.reps {
            let p = &r.profile;
            submitted_without_host_stages(r, &m);
            assert!(r.accounted() <= r.wall, "{m}");
            if common::gpu().is_some_and(|g| g.info.timestamps) {
                let submits = if m.workload == "search" { 1 } else { 2 };
                kernel_times_within(p, submits * m.rounds as u64);
            }
        }
        stages_cover_the_wall(&m);
    }
}

/// The stages cover the batches' wall time but for 10%. A rep whose thread was preempted
/// between two stages (2 cores shared with the harness) leaves that time unaccounted, so the
/// bound holds for the best rep, not for every one.
fn stages_cover_the_wall(m: &Measured) {
    let unaccounted = |r: &Rep| 1.0 - r.accounted().as_secs_f64() / r.wall.as_secs_f64();
    let best = m.reps.iter().map(unaccounted).fold(f64::INFINITY, f64::min);
    assert!(best <= 0.1, "{:.1}% of the best rep unaccounted:\n{m}", 100.0 * best);
}

/// Device batches through a device pipeline (a volatile table): nothing encoded or decoded
/// on the host, every batch submitted and waited for.
#[test]
fn pipelined_device_batches_have_no_host_stages() {
    let _alone = alone();
    if common::gpu().is_none() {
        return;
    }
    let measured = profile(Placement::Volatile, true, true);
    assert_eq!(measured.len(), 4);
    for m in &measured {
        assert_eq!(m.reps.len(), 3);
        for r in &m.reps {
            submitted_without_host_stages(r, m);
            assert!(r.wall > Duration::ZERO, "{m}");
        }
    }
}

/// A repetition of device batches: nothing encoded, folded or decoded on the host, and its
/// batches submitted and waited for.
fn submitted_without_host_stages(r: &Rep, m: &Measured) {
    let p = &r.profile;
    assert_eq!(
        (p.encode, p.fold, p.decode, r.host),
        (Duration::ZERO, Duration::ZERO, Duration::ZERO, Duration::ZERO),
        "{m}"
    );
    assert!(p.submit > Duration::ZERO && p.wait > Duration::ZERO, "{m}");
}
