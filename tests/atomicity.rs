//! Calls are all or nothing: a batch that fails takes no effect, whether it repeats keys
//! (ordered batches fold them) or takes several engine batches; ordered batches equal
//! one-by-one application however their keys repeat.

mod common;

use std::collections::HashMap;

use common::oracle::{Oracle, assert_same_content};
use gphash::{Batch, Config, Error, GpHash, GpuOptions, OpKind, Options, Placement, Status};
use host_pm::PoolError;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The executors the tests run on: the GPU (zero-copy and staged), the GPU with bindings of
/// 16 KiB (engine batches of a few hundred operations, so calls take several), and the CPU.
fn executors() -> Vec<(&'static str, Options)> {
    let gpu = |placement| common::gpu_options(GpuOptions { placement, ..GpuOptions::default() });
    let limited = Options {
        device: common::gpu().map(|_| common::gpu_with_binding_limit(16 << 10)),
        ..gpu(Placement::ZeroCopy)
    };
    vec![
        ("gpu zero-copy", gpu(Placement::ZeroCopy)),
        ("gpu staged", gpu(Placement::Staged)),
        ("gpu, 16 KiB bindings", limited),
        ("cpu", common::cpu_options()),
    ]
}

/// A table in `dir` whose pool may not grow beyond its size at creation.
fn table_at_its_limit(dir: &tempfile::TempDir, name: &str, cfg: &Config, options: &Options) -> GpHash {
    let path = dir.path().join(name);
    let size = GpHash::create(Some(&path), cfg, &common::cpu_options()).unwrap().stats().pool_bytes;
    std::fs::remove_file(&path).unwrap();
    let t = common::table(dir, name, &Config { max_bytes: Some(size), ..*cfg }, options);
    assert_eq!(t.stats().pool_bytes, size);
    t
}

fn content(t: &GpHash) -> HashMap<Vec<u8>, Vec<u8>> {
    t.entries().into_iter().collect()
}

/// A failed ordered batch that once took effect in part: `U 1 v`, 600 reads of absent keys, then
/// 600 inserts of them, on a pool at its size limit. The inserts need the table to grow, which
/// fails with OutOfSpace: the call fails and key 1 keeps its value (ordered execution used to
/// apply the update and the reads in a first round of its own).
#[test]
fn a_failed_ordered_batch_takes_no_effect() {
    let dir = common::pool_dir();
    for (name, options) in executors() {
        let cfg = Config { capacity: 200, ..Default::default() };
        let t = table_at_its_limit(&dir, name, &cfg, &options);
        let keys: Vec<u8> = (0..100).flat_map(|k| common::key(k, 8)).collect();
        t.insert(&keys, &keys).unwrap();
        let before = content(&t);
        let mut batch = t.batch();
        batch.update(&common::key(1, 8), &[0xEE; 8]).unwrap();
        for k in 1000..1600 {
            batch.get(&common::key(k, 8)).unwrap();
        }
        for k in 1000..1600 {
            batch.insert(&common::key(k, 8), &[0xAB; 8]).unwrap();
        }
        match t.execute_ordered(&batch) {
            Err(Error::Pool(PoolError::OutOfSpace { .. })) => {}
            other => panic!("{name}: {:?}", other.map(|r| r.statuses.len())),
        }
        assert_same_content(t.entries(), &before, &format!("{name}: after the failed batch"));
        assert!(t.check().ok(), "{name}: {}", t.check());
        assert_eq!(t.cells_used().unwrap(), t.len(), "{name}: cells of the failed batch leaked");
        assert_eq!(t.get(&common::key(1, 8)).unwrap().value(0), Some(&common::key(1, 8)[..]), "{name}");
        assert_eq!(t.stats().poisoned, None, "{name}: a rolled-back call leaves the index usable");
    }
}

/// A call that takes several engine batches and fails in a later one (the table cannot grow)
/// takes no effect: the engine batches before the failing one are undone. Executed both
/// ordered and not, with updates, deletes, upserts and repeated keys in the first engine
/// batches.
#[test]
fn a_failed_call_of_several_engine_batches_takes_no_effect() {
    let Some(_) = common::gpu() else {
        panic!("engine batches smaller than a call need a GPU with a binding limit");
    };
    let seed = common::seed("a_failed_call_of_several_engine_batches_takes_no_effect");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    let options = Options {
        device: Some(common::gpu_with_binding_limit(16 << 10)),
        ..common::gpu_options(GpuOptions::default())
    };
    for (round, ordered) in [false, true, false, true].into_iter().enumerate() {
        let cfg = Config { capacity: 600, ..Default::default() };
        let t = table_at_its_limit(&dir, &format!("t{round}"), &cfg, &options);
        let max = t.stats().max_batch;
        assert!(max < 1000, "16 KiB bindings hold a batch of {max}");
        let keys: Vec<u8> = (0..500).flat_map(|k| common::key(k, 8)).collect();
        t.insert(&keys, &keys).unwrap();
        let before = content(&t);
        let mut batch = t.batch();
        for k in 0..500 {
            let (key, v) = (common::key(k, 8), common::value(&mut rng, 8));
            match rng.random_range(0..4) {
                0 => batch.update(&key, &v).unwrap(),
                1 => batch.delete(&key).unwrap(),
                2 => batch.upsert(&key, &v).unwrap(),
                _ => batch.get(&key).unwrap(),
            }
        }
        // Repeated keys, existing and new.
        for k in (0..40).chain(5000..5040) {
            let (key, v) = (common::key(k, 8), common::value(&mut rng, 8));
            batch.upsert(&key, &v).unwrap();
            batch.delete(&key).unwrap();
            batch.insert(&key, &v).unwrap();
        }
        // More new keys than the table holds.
        for k in 10_000..13_000 {
            batch.insert(&common::key(k, 8), &common::value(&mut rng, 8)).unwrap();
        }
        assert!(batch.len() > 3 * max);
        let batches = t.stats().activity.batches;
        let outcome = if ordered { t.execute_ordered(&batch) } else { t.execute(&batch) };
        match outcome {
            Err(Error::Pool(PoolError::OutOfSpace { .. })) => {}
            other => panic!("round {round}: {:?}", other.map(|r| r.statuses.len())),
        }
        let what = format!("round {round} (ordered {ordered})");
        assert_same_content(t.entries(), &before, &what);
        assert!(t.check().ok(), "{what}: {}", t.check());
        assert_eq!(t.cells_used().unwrap(), t.len(), "{what}: cells leaked");
        assert_eq!(t.stats().poisoned, None, "{what}");
        assert!(t.stats().activity.rolled_back > 0, "{what}");
        // The read of the keys' states, at least one engine batch applied before the failing
        // one, and the two of the undo (deletes, then restores).
        let acknowledged = t.stats().activity.batches - batches;
        assert!(acknowledged >= 4, "{what}: {acknowledged} engine batches: nothing was undone");
        // Still usable, and a call that fits applies.
        let part: Vec<u8> = (0..100).flat_map(|k| common::key(k, 8)).collect();
        assert_eq!(t.delete(&part).unwrap(), vec![gphash::Status::Ok; 100], "{what}");
    }
}

/// A random batch on a few keys, each repeated many times, in every order of every kind.
fn storm(t: &GpHash, rng: &mut StdRng, keys: u64, n: usize) -> Batch {
    let mut batch = t.batch();
    let value_bytes = t.geometry().value_bytes as usize;
    for _ in 0..n {
        let key = common::key(rng.random_range(0..keys), t.geometry().key_bytes as usize);
        let v = common::value(rng, value_bytes);
        let kind = [OpKind::Get, OpKind::Insert, OpKind::Upsert, OpKind::Update, OpKind::Delete]
            [rng.random_range(0..5)];
        batch.push(kind, &key, kind.writes_value().then_some(&v[..])).unwrap();
    }
    batch
}

/// Ordered batches of many repeats of few keys (and some single keys) equal a sequential map,
/// operation by operation and in content, on every executor and across calls that take
/// several engine batches.
#[test]
fn ordered_batches_equal_a_sequential_map() {
    let seed = common::seed("ordered_batches_equal_a_sequential_map");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    for (name, options) in executors() {
        // 8-byte values make 12-byte cells (value and checksum): the table fits the 32 bindings
        // the limited device offers at 16 KiB each.
        let cfg = Config { capacity: 3000, value_bytes: 8, seed: rng.random(), ..Default::default() };
        let t = common::table(&dir, name, &cfg, &options);
        let mut oracle = Oracle::default();
        let max = t.stats().max_batch;
        for round in 0..30 {
            // Few keys (each repeated many times), or many keys (a call larger than the
            // engine takes where it takes few).
            let (keys, n) = match round % 3 {
                0 => (4, rng.random_range(1..200)),
                1 => (40, rng.random_range(1..400)),
                _ => (2000, rng.random_range(1..(2 * max).min(3000))),
            };
            let batch = storm(&t, &mut rng, keys, n);
            let want = oracle.run(&batch);
            let got = t.execute_ordered(&batch).unwrap_or_else(|e| panic!("{name} round {round}: {e}"));
            for (i, (status, value)) in want.iter().enumerate() {
                assert_eq!(
                    (got.statuses[i], got.value(i)),
                    (*status, value.as_deref()),
                    "{name} round {round} op {i} ({:?})",
                    batch.op(i).0
                );
            }
            assert_same_content(t.entries(), &oracle.map, &format!("{name} round {round}"));
            assert!(t.check().ok(), "{name} round {round}: {}", t.check());
            assert_eq!(t.cells_used().unwrap(), t.len(), "{name} round {round}");
        }
        let s = t.stats();
        eprintln!("{name}: {} engine batches, engine batches of up to {max}", s.activity.batches);
    }
}

/// The engine batches of an ordered call: one read of the repeated keys whose results depend
/// on what they held, and one batch with every key once (no longer one batch per repetition).
/// Keys that the call overwrites first and never deletes need no read: such a call takes one
/// engine batch.
#[test]
fn ordered_batches_take_two_engine_batches() {
    let dir = common::pool_dir();
    for (name, options) in executors() {
        let t = common::table(&dir, name, &Config { capacity: 1000, ..Default::default() }, &options);
        t.insert(&common::key(1, 8), &99u64.to_le_bytes()).unwrap();
        // Keys 0 to 2 repeated: upserted first (blind), or, for key 2 in the second call,
        // updated first (its result depends on whether it exists: read first).
        for (call, first_of_key_2, engine_batches) in [(0u64, OpKind::Upsert, 1), (1, OpKind::Update, 2)] {
            let mut batch = t.batch();
            for i in 0..50u64 {
                let kind = if i == 2 { first_of_key_2 } else { OpKind::Upsert };
                batch.push(kind, &common::key(i % 3, 8), Some(&(1000 * call + i).to_le_bytes())).unwrap();
                batch.insert(&common::key(100 * (call + 1) + i, 8), &i.to_le_bytes()).unwrap();
            }
            let before = t.stats().activity.batches;
            let got = t.execute_ordered(&batch).unwrap();
            assert_eq!(t.stats().activity.batches - before, engine_batches, "{name}, call {call}");
            assert!(got.statuses.iter().all(|&s| s == Status::Ok), "{name}, call {call}: {:?}", got.statuses);
            for k in 0..3 {
                let last = 1000 * call + (0..50u64).filter(|i| i % 3 == k).max().unwrap();
                let value = t.get(&common::key(k, 8)).unwrap();
                assert_eq!(value.value(0), Some(&last.to_le_bytes()[..]), "{name}, call {call}");
            }
        }
    }
}

/// A call that only reads is never folded: repeated reads of a key, ordered or not, take one
/// engine batch (or, in a call larger than the engine takes, one per `max_batch` operations)
/// and give the results of one-by-one application.
#[test]
fn read_only_calls_take_one_engine_batch() {
    let mut rng = StdRng::seed_from_u64(common::seed("read_only_calls_take_one_engine_batch"));
    let dir = common::pool_dir();
    for (name, options) in executors() {
        let cfg = Config { capacity: 3000, value_bytes: 8, seed: rng.random(), ..Default::default() };
        let t = common::table(&dir, name, &cfg, &options);
        let mut oracle = Oracle::default();
        let mut load = t.batch();
        for k in 0..200 {
            load.insert(&common::key(k, 8), &common::value(&mut rng, 8)).unwrap();
        }
        oracle.run(&load);
        t.execute(&load).unwrap();
        let max = t.stats().max_batch;
        // Fits one engine batch; more than the engine takes where it takes few.
        for n in [300, (2 * max + 7).min(3000)] {
            // Present and absent keys, each read several times.
            let mut batch = t.batch();
            for _ in 0..n {
                batch.get(&common::key(rng.random_range(0..300), 8)).unwrap();
            }
            let want = oracle.run(&batch);
            let keys: Vec<u8> = (0..n).flat_map(|i| batch.op(i).1.to_vec()).collect();
            let calls: [(&str, &dyn Fn() -> gphash::Result<gphash::BatchResult>); 3] = [
                ("execute_ordered", &|| t.execute_ordered(&batch)),
                ("execute", &|| t.execute(&batch)),
                ("get", &|| t.get(&keys)),
            ];
            for (call, run) in calls {
                let before = t.stats().activity.batches;
                let got = run().unwrap();
                let what = format!("{name}, {call} of {n} reads");
                assert_eq!(t.stats().activity.batches - before, n.div_ceil(max) as u64, "{what}");
                for (i, (status, value)) in want.iter().enumerate() {
                    assert_eq!(
                        (got.statuses[i], got.value(i)),
                        (*status, value.as_deref()),
                        "{what}: op {i}"
                    );
                }
            }
        }
        assert_same_content(t.entries(), &oracle.map, name);
    }
}
