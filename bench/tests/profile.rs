//! `bench profile`'s accounting (not speed): its stages add up to the wall time of the batches
//! measured, and the breakdowns agree with the index's coarse counters.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use gphash::{GpuOptions, Placement};
use gphash_bench::profile::{Measured, ProfileBench};

fn profile(placement: Placement) -> Vec<Measured> {
    let dir = common::pool_dir();
    let bench = ProfileBench {
        keys: 3000,
        batches: vec![64, 1024],
        reps: 3,
        rounds: 2,
        key_bytes: 8,
        value_bytes: 8,
        seed: 7,
        pool_dir: dir.path().into(),
    };
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
            let (wall, accounted) = (r.wall.as_secs_f64(), r.accounted().as_secs_f64());
            assert!(accounted <= wall, "{m}");
            assert!((wall - accounted) <= 0.1 * wall, "stages {accounted} s of {wall} s:\n{m}");
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
        // The table prints every stage, the unaccounted rest and the wall time.
        let table = m.to_string();
        for stage in ["encode", "fold", "wait", "lines", "persist", "engine other", "unaccounted", "wall"] {
            assert!(table.lines().any(|l| l.starts_with(stage)), "no {stage} row:\n{table}");
        }
    }
}

#[test]
fn stages_add_up_zero_copy() {
    check(&profile(Placement::Auto));
}

#[test]
fn stages_add_up_staged() {
    let measured = profile(Placement::Staged);
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
