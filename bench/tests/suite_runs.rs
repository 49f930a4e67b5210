//! The suite's runner end to end on a small table: every workload run `reps` times is reported
//! as its median run with the slowest and fastest rates; no system answers wrongly. Without a
//! Vulkan device the test fails under `CI=true`.

use gphash::{CacheOptions, Gpu};
use gphash_bench::runner::{self, Suite, SystemKind};
use gphash_bench::ycsb::{Distribution, Workload};

/// The device, or `None` with a loud warning where there is none (a failure under `CI=true`).
fn gpu() -> Option<std::sync::Arc<Gpu>> {
    match Gpu::new() {
        Ok(g) => Some(g),
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => panic!("CI=true and no GPU: {e}"),
        Err(e) => {
            eprintln!("\n**********\nWARNING: no GPU ({e}): the suite runner is NOT tested\n**********\n");
            None
        }
    }
}

/// A small suite of C and A on `systems`, its pools in `dir`.
fn small_suite(systems: Vec<SystemKind>, dir: &std::path::Path) -> Suite {
    Suite {
        workloads: vec![Workload::C, Workload::A],
        systems,
        key_bytes: vec![8],
        value_bytes: 16,
        records: 2048,
        micro_ops: 512,
        macro_ops: 1024,
        batches: vec![256],
        load_batch: 1024,
        distributions: vec![None],
        seed: 7,
        pool_dir: dir.to_path_buf(),
        cpu_threads: 2,
        cache: CacheOptions::default(),
        tile: 32,
        keep_pools: false,
        in_flight: false,
        reps: 3,
    }
}

#[test]
fn repeated_runs_report_the_median_with_min_and_max() {
    let Some(gpu) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let systems = vec![SystemKind::ZeroCopy, SystemKind::Host, SystemKind::CpuMap];
    let suite = small_suite(systems, dir.path());
    let mut heard = 0;
    let records = runner::run(&suite, &gpu, &[], &|_| {}, &mut |_| heard += 1).unwrap();
    let systems: Vec<&str> = records.iter().map(|r| r.system.as_str()).collect();
    let each = |s: &'static str| [s; 3];
    let want: Vec<&str> = [
        each("gphash-zc"),
        each("gphash-host"),
        each("cpu-map-scc"),
        each("cpu-map-papaya"),
        each("cpu-map-dashmap"),
        each(runner::BEST),
    ]
    .concat();
    assert_eq!(systems, want, "load, C and A for each system and crate, then the best crate's");
    assert_eq!(heard, records.len());
    for r in &records {
        let what = format!("{} {}", r.system, r.workload);
        assert_eq!(r.reps, if r.workload == "load" { 1 } else { 3 }, "{what}");
        assert!(r.ops_per_s_min > 0.0, "{what}");
        assert!(r.ops_per_s_min <= r.ops_per_s && r.ops_per_s <= r.ops_per_s_max, "{what}: {r:?}");
        assert_eq!(r.unexpected, 0, "{what}");
        assert!(r.line().contains("(3)") || r.reps == 1, "{what}: {}", r.line());
    }
    // The best crate's record is the fastest crate's, named in its setting.
    for best in records.iter().filter(|r| r.system == runner::BEST) {
        let crates =
            records.iter().filter(|r| r.system.starts_with("cpu-map-") && r.workload == best.workload);
        let fastest = crates.max_by(|a, b| a.ops_per_s.total_cmp(&b.ops_per_s)).unwrap();
        assert_eq!(best.ops_per_s, fastest.ops_per_s, "{}", best.workload);
        assert_eq!(
            format!("cpu-map-{}", runner::best_crate(&best.setting)),
            fastest.system,
            "{}",
            best.setting
        );
    }
}

/// Batches two in flight (`--in-flight`) give every expected status, in the pool and in device
/// memory, and their rates and latencies are measured.
#[test]
fn batches_in_flight_give_the_expected_results() {
    let Some(gpu) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let suite = Suite {
        in_flight: true,
        ..small_suite(vec![SystemKind::ZeroCopy, SystemKind::Volatile], dir.path())
    };
    let records = runner::run(&suite, &gpu, &[], &|_| {}, &mut |_| {}).unwrap();
    assert_eq!(records.len(), 2 * 3, "load, C and A for each system");
    for r in &records {
        let what = format!("{} {}", r.system, r.workload);
        assert_eq!(r.unexpected, 0, "{what}");
        assert!(r.ops_per_s_min > 0.0 && r.p50_ms > 0.0 && r.p50_ms <= r.p99_ms, "{what}: {r:?}");
    }
}

/// Every workload runs under each distribution given (named after it), and kept pools are left
/// for `gphash check`: closed cleanly, consistent, with the loaded records.
#[test]
fn distributions_each_run_and_kept_pools_check() {
    let Some(gpu) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let suite = Suite {
        distributions: vec![Some(Distribution::Uniform), Some(Distribution::default())],
        tile: 8,
        reps: 1,
        keep_pools: true,
        in_flight: false,
        ..small_suite(vec![SystemKind::ZeroCopy], dir.path())
    };
    let records = runner::run(&suite, &gpu, &[], &|_| {}, &mut |_| {}).unwrap();
    let names: Vec<&str> = records.iter().map(|r| r.workload.as_str()).collect();
    assert_eq!(names, ["load", "c uniform", "c zipf:0.99", "a uniform", "a zipf:0.99"]);
    assert!(records.iter().all(|r| r.unexpected == 0), "{records:?}");
    let kept: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(kept.len(), 1, "one directory of kept pools: {kept:?}");
    let pool = kept[0].join("gphash-zc-8.pool");
    let t = gphash::GpHash::open(
        &pool,
        &gphash::Options { executor: gphash::Executor::Cpu, ..Default::default() },
    )
    .unwrap();
    assert_eq!(t.len(), 2048);
    assert!(t.stats().recovery.clean_shutdown, "the kept pool was closed cleanly");
    assert!(t.check().ok(), "{}", t.check());
}
