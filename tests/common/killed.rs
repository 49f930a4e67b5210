//! Pools as a kill leaves them: the pool recorded at the persist points of a run on the CPU
//! model, one of them written out as the pool file.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use gphash::{Config, GpHash, Options};

/// A table of `config` holding keys `0..keys` (acknowledged), then the pool at every persist
/// point of `then`.
fn recorded(config: &Config, keys: u64, then: impl FnOnce(&GpHash)) -> Vec<Vec<u8>> {
    let snapshots = Arc::new(Mutex::new(vec![]));
    let recording = Arc::new(AtomicBool::new(false));
    let observer: host_pm::Observer = {
        let (snapshots, recording) = (snapshots.clone(), recording.clone());
        Arc::new(move |bytes: &[u8]| {
            if recording.load(Ordering::Relaxed) {
                snapshots.lock().unwrap().push(bytes.to_vec());
            }
        })
    };
    let dir = super::pool_dir();
    let options = Options { observer: Some(observer), ..super::cpu_options() };
    let mut t = GpHash::create(Some(&dir.path().join("run")), config, &options).unwrap();
    let all: Vec<u8> = (0..keys).flat_map(|k| super::key(k, 8)).collect();
    t.insert(&all, &all).unwrap();
    recording.store(true, Ordering::Relaxed);
    then(&mut t);
    drop(t);
    std::mem::take(&mut *snapshots.lock().unwrap())
}

/// Writes to `path` a pool killed between the two phases of a batch of insertions: it holds
/// 300 acknowledged keys and the claims (INSERTING slots) of 100 more.
pub fn with_claims(path: &Path) {
    let config = Config { capacity: 1000, ..Config::default() };
    let snapshots = recorded(&config, 300, |t| {
        let more: Vec<u8> = (300..400).flat_map(|k| super::key(k, 8)).collect();
        t.insert(&more, &more).unwrap();
    });
    // The first persist point of the batch is phase A's: its claims are durable.
    std::fs::write(path, &snapshots[0]).unwrap();
}

/// Writes to `path` a pool killed while the table grew: the resize is recorded in the header,
/// the grown table built (persisted, `built`) or not yet, the header not switched to it.
pub fn mid_resize(path: &Path, built: bool) {
    let config = Config { capacity: 200, ..Config::default() };
    let snapshots = recorded(&config, 120, |t| t.grow().unwrap());
    let resizing: Vec<&Vec<u8>> = snapshots
        .iter()
        .filter(|s| {
            std::fs::write(path, s).unwrap();
            host_pm::Pool::open(path).unwrap().header().resize.state != 0
        })
        .collect();
    assert!(resizing.len() >= 2, "the resize has several persist points");
    let pick = if built { resizing.last() } else { resizing.first() };
    std::fs::write(path, pick.unwrap()).unwrap();
}

/// Whole-file bytes and modification time of `path`.
pub fn fingerprint(path: &Path) -> (Vec<u8>, std::time::SystemTime) {
    (std::fs::read(path).unwrap(), std::fs::metadata(path).unwrap().modified().unwrap())
}

/// Inspects the pool at `path` (which must leave the file as it was and find it consistent),
/// then opens it on the CPU model, which recovers it as the inspection predicted.
pub fn inspect_and_open(path: &Path, what: &str) -> (gphash::Inspection, GpHash) {
    let before = fingerprint(path);
    let found = gphash::inspect(path).unwrap_or_else(|e| panic!("{what}: inspect failed: {e}"));
    assert!(fingerprint(path) == before, "{what}: inspect changed the pool file");
    assert!(found.consistent(), "{what}: {found}");
    let t = GpHash::open(path, &super::cpu_options()).unwrap_or_else(|e| panic!("{what}: open failed: {e}"));
    let (predicted, opened) = (found.recovery.as_ref().unwrap(), t.stats());
    assert_eq!(predicted.cleared_claims, opened.recovery.cleared_claims, "{what}");
    assert_eq!(predicted.resumed_resize, opened.recovery.resumed_resize, "{what}");
    assert_eq!(found.stats, opened.table(), "{what}: the predicted table is the recovered one");
    (found, t)
}
