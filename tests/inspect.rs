//! `gphash::inspect`: a read-only check of a pool that predicts what recovery does, and writes
//! nothing, on clean pools and on pools left by a kill.

mod common;

use std::path::Path;

use common::killed::{fingerprint, inspect_and_open, mid_resize, with_claims};
use gphash::{Config, GpHash, inspect};

/// Inspects `path` and opens it (see `inspect_and_open`); the opened table checks clean.
fn inspect_then_open(path: &Path) -> gphash::Inspection {
    let (found, t) = inspect_and_open(path, &path.display().to_string());
    assert!(t.check().ok());
    found
}

#[test]
fn a_clean_pool_is_checked_as_found() {
    let dir = common::pool_dir();
    let path = dir.path().join("clean");
    let t = GpHash::create(Some(&path), &Config::default(), &common::cpu_options()).unwrap();
    let keys: Vec<u8> = (0..500).flat_map(|k| common::key(k, 8)).collect();
    t.insert(&keys, &keys).unwrap();
    t.close().unwrap();
    let found = inspect_then_open(&path);
    assert!(found.clean());
    assert!(found.consistent());
    assert!(found.recovered.is_none(), "recovery changes nothing");
    assert_eq!(found.stats.items, 500);
    assert_eq!(found.verdict(), "consistent");
}

#[test]
fn claims_of_a_killed_batch_are_predicted() {
    let dir = common::pool_dir();
    let path = dir.path().join("claims");
    with_claims(&path);
    let found = inspect_then_open(&path);
    assert!(!found.clean());
    assert_eq!(found.found.claims, 100, "the killed batch claimed a slot per key");
    assert_eq!(found.recovery.as_ref().unwrap().cleared_claims, 100);
    let after = found.recovered.as_ref().expect("recovery clears claims");
    assert_eq!((after.claims, after.items), (0, 300));
    assert_eq!(
        found.verdict(),
        "not closed cleanly; recovery would clear 100 unacknowledged claim(s); consistent after recovery"
    );
}

#[test]
fn an_interrupted_resize_is_checked_as_completed() {
    let dir = common::pool_dir();
    for built in [false, true] {
        let path = dir.path().join(format!("resize-{built}"));
        mid_resize(&path, built);
        let levels_found = {
            let p = host_pm::Pool::open(&path).unwrap();
            GpHash::geometry_of(&p).unwrap().top_level
        };
        let found = inspect_then_open(&path);
        assert!(!found.clean());
        assert_eq!(found.recovery.as_ref().unwrap().resumed_resize, Some(true));
        assert_eq!(found.stats.levels.0, levels_found + 1, "checked as the grown table");
        assert_eq!(found.stats.items, 120);
        assert!(found.recovered.as_ref().unwrap().ok());
        assert!(found.verdict().ends_with("complete an interrupted resize; consistent after recovery"));
    }
}

#[test]
fn a_pool_recovery_would_refuse_is_inconsistent_and_left_alone() {
    let dir = common::pool_dir();
    let path = dir.path().join("refused");
    with_claims(&path);
    {
        // A published slot whose value cell lies beyond the heap.
        let mut p = host_pm::Pool::open(&path).unwrap();
        let geo = GpHash::geometry_of(&p).unwrap();
        let region = p.header().table_region;
        let table: &mut [u32] = bytemuck::cast_slice_mut(p.region_mut(region));
        let state = (0..geo.buckets())
            .flat_map(|b| (0..geo.layout.slots).map(move |s| geo.state_word(b, s) as usize))
            .find(|&w| table[w] >= 2)
            .unwrap();
        table[state] = 2 + geo.cells as u32 + 5;
    }
    let before = fingerprint(&path);
    let found = inspect(&path).unwrap();
    assert!(fingerprint(&path) == before, "inspect changed the pool file");
    assert!(!found.consistent());
    assert!(found.recovery.as_ref().unwrap_err().contains("beyond the heap"), "{found}");
    let text = found.to_string();
    assert!(text.contains("recovery would refuse the pool"), "{text}");
    assert!(text.ends_with("INCONSISTENT: 2 violation(s)"), "{text}");
}

#[test]
fn a_pool_open_for_writing_is_not_inspected() {
    let dir = common::pool_dir();
    let path = dir.path().join("busy");
    let t = GpHash::create(Some(&path), &Config::default(), &common::cpu_options()).unwrap();
    let err = inspect(&path).unwrap_err();
    assert!(matches!(err, gphash::Error::Pool(host_pm::PoolError::Locked { .. })), "{err}");
    t.close().unwrap();
    inspect(&path).unwrap();
    // The inspection let go of its lock: the pool opens for writing.
    GpHash::open(&path, &common::cpu_options()).unwrap().close().unwrap();
}
