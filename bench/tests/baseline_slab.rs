//! The `slab` baseline (SlabHash made persistent with an undo log) against the one-by-one
//! oracle and its CPU twin, its undo log against crashes, and its pools across reopening.
//!
//! On lavapipe `subgroup_sizes_4_to_128` re-runs the GPU tests in child processes at subgroup
//! sizes 4 to 128 (see `common::rerun_at_subgroup_sizes` for why 32 to 128 do not run there).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::oracle::{Oracle, assert_same_content};
use gphash::{Batch, Error, Gpu, OpKind, Placement, Status};
use gphash_bench::systems::slab::{self, SlabConfig, SlabModel, SlabOptions, SlabSystem};
use gphash_bench::systems::{System, run_host};
use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};

fn gpu() -> Arc<Gpu> {
    common::gpu().expect("the slab baseline runs on a GPU only")
}

struct Case {
    key_bytes: u32,
    value_bytes: u32,
    /// Buckets; few buckets make chains of many slabs.
    buckets: Option<u32>,
    /// Keys drawn from this many.
    space: usize,
    options: SlabOptions,
}

fn options(placement: Placement, tile: u32, max_window_bytes: Option<u64>) -> SlabOptions {
    SlabOptions { placement, tile, max_window_bytes, ..SlabOptions::default() }
}

fn cases() -> Vec<Case> {
    vec![
        // Chains of about 6 slabs of 10 entries.
        Case { key_bytes: 8, value_bytes: 8, buckets: Some(8), space: 600, options: SlabOptions::default() },
        // Chains of about 8 slabs of 3 entries; msync of exactly the lines the kernels list.
        Case {
            key_bytes: 32,
            value_bytes: 128,
            buckets: Some(16),
            space: 400,
            options: SlabOptions {
                persist_mode: Some(host_pm::PersistMode::Msync),
                ..options(Placement::ZeroCopy, 32, None)
            },
        },
        // The default shape (mostly one slab per bucket), small windows, 8-lane tiles.
        Case {
            key_bytes: 8,
            value_bytes: 128,
            buckets: None,
            space: 3000,
            options: options(Placement::ZeroCopy, 8, Some(64 << 10)),
        },
        // Staged: the device copy, dirty lines written back at every persist point.
        Case {
            key_bytes: 32,
            value_bytes: 8,
            buckets: Some(32),
            space: 700,
            options: options(Placement::Staged, 16, None),
        },
        // An odd value size, 4-lane tiles.
        Case {
            key_bytes: 8,
            value_bytes: 12,
            buckets: Some(4),
            space: 300,
            options: options(Placement::Auto, 4, None),
        },
    ]
}

fn config(case: &Case, seed: u64) -> SlabConfig {
    let mut c = SlabConfig::new(case.key_bytes, case.value_bytes, case.space as u64);
    c.buckets = case.buckets;
    // Room for every key of the space in the worst chains.
    c.pool_slabs = Some((case.space as u32).div_ceil(slab::SlabGeometry::entries_for(case.key_bytes)) + 64);
    c.seed = seed;
    c
}

/// The oracle and the twin see the batch in order.
fn expected(oracle: &mut Oracle, twin: &mut SlabModel, batch: &Batch) -> Vec<(Status, Option<Vec<u8>>)> {
    let want = oracle.run(batch);
    for (i, w) in want.iter().enumerate() {
        let (kind, key, value) = batch.op(i);
        let got = twin.apply(kind, key, value).expect("the twin has room");
        assert_eq!(&got, w, "twin op {i} ({kind:?}) differs from the oracle");
    }
    want
}

fn check_allocators(t: &SlabSystem, what: &str) {
    let (cells, slabs) = t.allocated().unwrap();
    assert_eq!(cells, t.len(), "{what}: a value cell leaked or was freed twice");
    assert_eq!(slabs, t.pool_slabs_used(), "{what}: the slab allocator disagrees with the chains");
}

/// Random batches of distinct keys, all operation kinds: statuses and values read equal the
/// oracle's; the pool's content equals the oracle's map; every bucket holds the keys the twin's
/// bucket holds; the log is invalid after each batch; no cell or slab leaks.
#[test]
fn gpu_distinct_keys_match_oracle_and_twin() {
    let seed = common::seed("gpu_distinct_keys_match_oracle_and_twin");
    let mut rng = StdRng::seed_from_u64(seed);
    let gpu = gpu();
    let dir = common::pool_dir();
    for (ci, case) in cases().into_iter().enumerate() {
        let what = format!("key {} value {} {:?}", case.key_bytes, case.value_bytes, case.options);
        let cfg = config(&case, rng.random());
        let path = dir.path().join(format!("d{ci}.pool"));
        let mut t = SlabSystem::create_with(Some(&path), &cfg, gpu.clone(), &case.options).unwrap();
        let mut twin = SlabModel::new(*t.geometry());
        let mut oracle = Oracle::default();
        let (kb, vb) = (case.key_bytes as usize, case.value_bytes as usize);
        for round in 0..5 {
            // The first round loads; later ones mix.
            let n = if round == 0 { case.space * 2 / 3 } else { rng.random_range(1..case.space / 2) };
            let mut batch = Batch::new(kb, vb);
            for k in sample(&mut rng, case.space, n) {
                let kind = if round == 0 { OpKind::Insert } else { common::random_kind(&mut rng) };
                let v = common::value(&mut rng, vb);
                batch.push(kind, &common::key(k as u64, kb), kind.writes_value().then_some(&v[..])).unwrap();
            }
            let want = expected(&mut oracle, &mut twin, &batch);
            let got = run_host(&mut t, &gpu, &batch).unwrap_or_else(|e| panic!("{what} round {round}: {e}"));
            for (i, w) in want.iter().enumerate() {
                assert_eq!(&got[i], w, "{what} round {round} op {i} ({:?})", batch.op(i).0);
            }
            assert_same_content(t.entries().unwrap(), &oracle.map, &format!("{what} round {round}"));
            assert_eq!(t.bucket_keys().unwrap(), slab::model::bucket_keys(&twin.geo, &twin.table).unwrap());
            assert_eq!(t.len(), oracle.map.len() as u64, "{what} round {round}: item count");
            assert_eq!(t.log_state(), None, "{what} round {round}: a finished batch leaves the log invalid");
            check_allocators(&t, &format!("{what} round {round}"));
        }
        if case.buckets.is_some() {
            assert!(
                t.pool_slabs_used() >= 2 * t.geometry().buckets as u64,
                "{what}: expected chains of several slabs, {} pool slabs for {} buckets",
                t.pool_slabs_used(),
                t.geometry().buckets
            );
        }
        assert!(t.activity().rounds <= t.activity().batches, "{what}: distinct keys need one round at most");
        eprintln!("{what}: {} | chain {:.2} slabs", t.setting(), t.chain_slabs());
    }
}

/// Thousands of insertions racing down a few long chains in one batch: new slabs are linked
/// at the tails by CAS while other tiles walk past them; nothing is lost, nothing is doubled,
/// and a second batch mixes every kind of operation over the grown chains.
#[test]
fn gpu_chains_grow_under_contention() {
    let seed = common::seed("gpu_chains_grow_under_contention");
    let mut rng = StdRng::seed_from_u64(seed);
    let gpu = gpu();
    let dir = common::pool_dir();
    let space = 12_000usize;
    let mut cfg = SlabConfig::new(8, 8, space as u64);
    cfg.buckets = Some(16);
    cfg.pool_slabs = Some(space as u32 / 5);
    cfg.seed = rng.random();
    let path = dir.path().join("grow.pool");
    let mut t = SlabSystem::create_with(Some(&path), &cfg, gpu.clone(), &SlabOptions::default()).unwrap();
    let mut twin = SlabModel::new(*t.geometry());
    let mut oracle = Oracle::default();
    for round in 0..2 {
        let mut batch = Batch::new(8, 8);
        for k in sample(&mut rng, space, space * 2 / 3) {
            let kind = if round == 0 { OpKind::Insert } else { common::random_kind(&mut rng) };
            let v = common::value(&mut rng, 8);
            batch.push(kind, &common::key(k as u64, 8), kind.writes_value().then_some(&v[..])).unwrap();
        }
        let want = expected(&mut oracle, &mut twin, &batch);
        let got = run_host(&mut t, &gpu, &batch).unwrap();
        for (i, w) in want.iter().enumerate() {
            assert_eq!(&got[i], w, "round {round} op {i} ({:?})", batch.op(i).0);
        }
        assert_same_content(t.entries().unwrap(), &oracle.map, &format!("round {round}"));
        assert_eq!(t.bucket_keys().unwrap(), slab::model::bucket_keys(&twin.geo, &twin.table).unwrap());
        check_allocators(&t, &format!("round {round}"));
    }
    assert!(t.chain_slabs() > 30.0, "chains of {} slabs", t.chain_slabs());
}

/// Many operations on a few keys in each batch: no key is published twice, none is lost or
/// invented, and each key's results fit a serial order (reads see the state before the batch).
#[test]
fn gpu_repeated_keys_publish_each_key_once() {
    let seed = common::seed("gpu_repeated_keys_publish_each_key_once");
    let mut rng = StdRng::seed_from_u64(seed);
    let gpu = gpu();
    let dir = common::pool_dir();
    for (ci, (kb, buckets)) in [(8usize, 2u32), (32, 4)].into_iter().enumerate() {
        let mut cfg = SlabConfig::new(kb as u32, 8, 200);
        cfg.buckets = Some(buckets);
        cfg.pool_slabs = Some(200);
        cfg.cells = Some(20_000);
        cfg.seed = rng.random();
        let path = dir.path().join(format!("r{ci}.pool"));
        let mut t = SlabSystem::create_with(Some(&path), &cfg, gpu.clone(), &SlabOptions::default()).unwrap();
        // Inserts of one absent key: exactly one wins.
        let mut batch = Batch::new(kb, 8);
        for i in 0..500u64 {
            batch.insert(&common::key(1000, kb), &i.to_le_bytes()).unwrap();
        }
        let r = run_host(&mut t, &gpu, &batch).unwrap();
        assert_eq!(r.iter().filter(|(s, _)| *s == Status::Ok).count(), 1, "one insert of a new key wins");
        assert!(r.iter().all(|(s, _)| matches!(s, Status::Ok | Status::Exists)));
        assert_eq!(t.len(), 1);
        let mut before: HashMap<Vec<u8>, Vec<u8>> = t.entries().unwrap().into_iter().collect();
        for round in 0..6 {
            let keys: Vec<Vec<u8>> = (0..12).map(|k| common::key(k, kb)).collect();
            let mut batch = Batch::new(kb, 8);
            let mut written: HashMap<Vec<u8>, HashSet<Vec<u8>>> = HashMap::new();
            for i in 0..3000u64 {
                let key = &keys[rng.random_range(0..keys.len())];
                let kind = common::random_kind(&mut rng);
                let v = (i + 10_000 * round).to_le_bytes().to_vec();
                if kind.writes_value() {
                    written.entry(key.clone()).or_default().insert(v.clone());
                }
                batch.push(kind, key, kind.writes_value().then_some(&v[..])).unwrap();
            }
            let r = run_host(&mut t, &gpu, &batch).unwrap_or_else(|e| panic!("round {round}: {e}"));
            let entries = t.entries().unwrap();
            let after: HashMap<Vec<u8>, Vec<u8>> = entries.iter().cloned().collect();
            assert_eq!(after.len(), entries.len(), "round {round}: a key is published twice");
            for key in &keys {
                let ops: Vec<usize> = (0..batch.len()).filter(|&i| batch.op(i).1 == &key[..]).collect();
                let batch = &batch;
                let of = |k: OpKind| ops.iter().copied().filter(move |&i| batch.op(i).0 == k);
                let ok = |i: &usize| r[*i].0 == Status::Ok;
                let has = |k: OpKind| of(k).next().is_some();
                let pre = before.get(key);
                for i in of(OpKind::Get) {
                    assert_eq!(r[i].1.as_ref(), pre, "round {round}: a get sees the state before the batch");
                }
                let inserts_ok = of(OpKind::Insert).filter(ok).count();
                let deletes_ok = of(OpKind::Delete).filter(ok).count();
                match pre {
                    None => {
                        assert!(
                            of(OpKind::Update).chain(of(OpKind::Delete)).all(|i| r[i].0 == Status::NotFound)
                        );
                        assert!(inserts_ok <= 1, "round {round}: {inserts_ok} inserts of one absent key won");
                        assert!(of(OpKind::Upsert).all(|i| ok(&i)));
                        let created = has(OpKind::Insert) || has(OpKind::Upsert);
                        assert_eq!(after.contains_key(key), created, "round {round}: key lost or invented");
                        if created && !has(OpKind::Upsert) {
                            assert_eq!(inserts_ok, 1, "round {round}: some insert must win");
                        }
                        // Nothing deletes the new key: a winning insert comes before every
                        // upsert, so an upsert's value stays.
                        if has(OpKind::Upsert) {
                            let upserted: HashSet<&[u8]> =
                                of(OpKind::Upsert).map(|i| batch.op(i).2).collect();
                            assert!(
                                upserted.contains(&after[key][..]),
                                "round {round}: an upsert's value stays"
                            );
                        }
                    }
                    Some(_) => {
                        // Deletes run in the commit, after every probe: inserts find the key, and
                        // exactly one delete wins unless an upsert re-creates the key after it.
                        assert!(of(OpKind::Insert).all(|i| r[i].0 == Status::Exists));
                        assert!(of(OpKind::Upsert).all(|i| ok(&i)));
                        if has(OpKind::Delete) {
                            assert_eq!(deletes_ok, 1, "round {round}: exactly one delete wins");
                            let recreated = after.contains_key(key);
                            assert!(
                                !recreated || has(OpKind::Upsert),
                                "round {round}: deleted key came back"
                            );
                        } else {
                            assert!(after.contains_key(key), "round {round}: key lost");
                            assert!(of(OpKind::Update).all(|i| ok(&i)));
                            let swung: HashSet<&[u8]> =
                                of(OpKind::Update).chain(of(OpKind::Upsert)).map(|i| batch.op(i).2).collect();
                            if !swung.is_empty() {
                                assert!(
                                    swung.contains(&after[key][..]),
                                    "round {round}: the last swing stays"
                                );
                            }
                        }
                    }
                }
                if let Some(v) = after.get(key) {
                    let from_batch = written.get(key).is_some_and(|w| w.contains(v));
                    assert!(from_batch || pre == Some(v), "round {round}: value from nowhere");
                }
            }
            assert_eq!(t.len(), after.len() as u64, "round {round}: item count");
            check_allocators(&t, &format!("round {round}"));
            before = after;
        }
        eprintln!("repeated keys, key {kb}: {:?}", t.activity());
    }
}

/// A batch that needs more slabs than the pool has is rolled back whole (through the undo
/// log); one whose values find too few free cells is refused. The table is unchanged and keeps
/// working.
#[test]
fn gpu_full_pool_rolls_back() {
    let gpu = gpu();
    let dir = common::pool_dir();
    for placement in [Placement::ZeroCopy, Placement::Staged] {
        let mut cfg = SlabConfig::new(8, 8, 30);
        cfg.buckets = Some(2);
        cfg.pool_slabs = Some(2);
        cfg.cells = Some(60);
        let path = dir.path().join(format!("full-{placement:?}.pool"));
        let opts = options(placement, 32, None);
        let mut t = SlabSystem::create_with(Some(&path), &cfg, gpu.clone(), &opts).unwrap();
        let k = |i: u64| common::key(i, 8);
        let load =
            Batch::of_kind(OpKind::Insert, 8, 8, &(0..25).flat_map(k).collect::<Vec<u8>>(), Some(&[7; 200]))
                .unwrap();
        assert!(run_host(&mut t, &gpu, &load).unwrap().iter().all(|(s, _)| *s == Status::Ok));
        let content: HashMap<Vec<u8>, Vec<u8>> = t.entries().unwrap().into_iter().collect();
        // 40 entries in all, and deletes free theirs only after the claims: 20 more keys cannot fit.
        let mut batch = Batch::new(8, 8);
        for i in 0..10 {
            batch.update(&k(i), &[1; 8]).unwrap();
            batch.delete(&k(10 + i)).unwrap();
        }
        for i in 100..120 {
            batch.insert(&k(i), &[2; 8]).unwrap();
        }
        match run_host(&mut t, &gpu, &batch) {
            Err(Error::TableFull { .. }) => {}
            other => panic!("{placement:?}: expected TableFull, got {other:?}"),
        }
        assert_same_content(t.entries().unwrap(), &content, &format!("{placement:?} after the rollback"));
        assert_eq!(t.len(), 25);
        assert_eq!(t.log_state(), None);
        check_allocators(&t, &format!("{placement:?} after the rollback"));
        // 25 values and 36 updates need 61 cells of 60.
        let many = Batch::of_kind(OpKind::Update, 8, 8, &k(3).repeat(36), Some(&vec![5; 8 * 36])).unwrap();
        assert!(matches!(run_host(&mut t, &gpu, &many), Err(Error::HeapFull { .. })), "{placement:?}");
        assert_same_content(t.entries().unwrap(), &content, &format!("{placement:?} after HeapFull"));
        check_allocators(&t, &format!("{placement:?} after HeapFull"));
        // Still usable, and reopening finds the same table.
        let mut small = Batch::new(8, 8);
        small.delete(&k(0)).unwrap();
        small.insert(&k(200), &[3; 8]).unwrap();
        assert_eq!(run_host(&mut t, &gpu, &small).unwrap(), vec![(Status::Ok, None); 2]);
        assert_eq!(t.activity().rolled_back, 2);
        let content: HashMap<Vec<u8>, Vec<u8>> = t.entries().unwrap().into_iter().collect();
        t.close().unwrap();
        let t = SlabSystem::open(&path, gpu.clone(), &opts).unwrap();
        assert_same_content(t.entries().unwrap(), &content, &format!("{placement:?} reopened"));
        check_allocators(&t, &format!("{placement:?} reopened"));
    }
}

/// Re-runs the GPU tests at the subgroup sizes lavapipe can be given.
#[test]
fn subgroup_sizes_4_to_128() {
    common::rerun_at_subgroup_sizes(&["gpu_"], 6);
}

/// Snapshots of the pool at every persist point while `recording` is set.
#[derive(Clone, Default)]
struct Recorder {
    recording: Arc<AtomicBool>,
    snaps: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Recorder {
    fn observer(&self) -> host_pm::Observer {
        let me = self.clone();
        Arc::new(move |bytes: &[u8]| {
            if me.recording.load(Ordering::SeqCst) {
                me.snaps.lock().unwrap().push(bytes.to_vec());
            }
        })
    }
}

fn table_of(snap: &[u8], t: &SlabSystem) -> Vec<u32> {
    let r = t.table_region();
    bytemuck::pod_collect_to_vec(&snap[r.offset as usize..(r.offset + t.geometry().table_bytes()) as usize])
}

/// Opens an image without a GPU: recovery, then the content.
fn recover_image(path: &Path, image: &[u8]) -> (slab::Recovered, HashMap<Vec<u8>, Vec<u8>>) {
    std::fs::write(path, image).unwrap();
    let mut pool = host_pm::Pool::open(path).unwrap();
    let geo = SlabSystem::geometry_of(&pool).unwrap();
    let rec = slab::model::recover(&mut pool, &geo).unwrap();
    let h = *pool.header();
    let table: Vec<u32> =
        bytemuck::pod_collect_to_vec(&pool.region(h.table_region)[..geo.table_bytes() as usize]);
    let heap: Vec<u32> =
        bytemuck::pod_collect_to_vec(&pool.region(h.heap_region)[..geo.heap_bytes() as usize]);
    assert_eq!(slab::model::log_state(&geo, &table), None, "recovery leaves the log invalid");
    let entries = slab::model::entries(&geo, &table, &heap).unwrap();
    let map: HashMap<Vec<u8>, Vec<u8>> = entries.iter().cloned().collect();
    assert_eq!(map.len(), entries.len(), "a key is published twice after recovery");
    drop(pool);
    std::fs::remove_file(path).unwrap();
    (rec, map)
}

/// The undo log: crash images taken while the log is valid, with any part of the batch's
/// in-place writes, recover to the table before the batch; an image taken after the log was
/// invalidated holds the batch; a torn log header undoes nothing that happened.
#[test]
fn gpu_undo_log_restores_the_table_before_the_batch() {
    let seed = common::seed("gpu_undo_log_restores_the_table_before_the_batch");
    let mut rng = StdRng::seed_from_u64(seed);
    for placement in [Placement::ZeroCopy, Placement::Staged] {
        undo_case(placement, &mut rng);
    }
}

fn undo_case(placement: Placement, rng: &mut StdRng) {
    let gpu = gpu();
    let dir = common::pool_dir();
    let rec = Recorder::default();
    let opts = SlabOptions { observer: Some(rec.observer()), ..options(placement, 32, None) };
    let mut cfg = SlabConfig::new(8, 16, 400);
    cfg.buckets = Some(16);
    cfg.pool_slabs = Some(100);
    cfg.seed = rng.random();
    let path = dir.path().join("undo.pool");
    let mut t = SlabSystem::create_with(Some(&path), &cfg, gpu.clone(), &opts).unwrap();
    let mut oracle = Oracle::default();
    let mut load = Batch::new(8, 16);
    for k in 0..250u64 {
        load.insert(&common::key(k, 8), &common::value(rng, 16)).unwrap();
    }
    oracle.run(&load);
    run_host(&mut t, &gpu, &load).unwrap();
    let before = oracle.map.clone();
    // A batch that updates, deletes, inserts into free entries and links new slabs.
    let mut batch = Batch::new(8, 16);
    for k in 0..400u64 {
        let key = common::key(k, 8);
        let v = common::value(rng, 16);
        match k % 5 {
            0 => batch.update(&key, &v).unwrap(),
            1 => batch.delete(&key).unwrap(),
            2 => batch.upsert(&key, &v).unwrap(),
            3 => batch.insert(&key, &v).unwrap(),
            _ => batch.get(&key).unwrap(),
        }
    }
    oracle.run(&batch);
    let slabs_before = t.pool_slabs_used();
    rec.recording.store(true, Ordering::SeqCst);
    run_host(&mut t, &gpu, &batch).unwrap();
    rec.recording.store(false, Ordering::SeqCst);
    assert!(t.pool_slabs_used() > slabs_before, "the batch links new slabs");
    assert_eq!(t.log_state(), None, "a clean batch leaves an invalid log");
    let after = oracle.map.clone();
    assert_same_content(t.entries().unwrap(), &after, "after the batch");
    let snaps = rec.snaps.lock().unwrap().clone();
    let geo = *t.geometry();
    let valid: Vec<usize> = (0..snaps.len())
        .filter(|&i| slab::model::log_state(&geo, &table_of(&snaps[i], &t)).is_some())
        .collect();
    assert!(!valid.is_empty(), "the log was valid at some persist point");
    let (first, last) = (valid[0], *valid.last().unwrap());
    assert!(first > 0 && last + 1 < snaps.len());
    let (count, _) = slab::model::log_state(&geo, &table_of(&snaps[first], &t)).unwrap();
    assert!(count as u64 >= geo.buckets as u64, "every touched chain is logged ({count} slabs)");
    let images = dir.path().join("image.pool");

    // Every persist point while the log is valid, and random mixes of the words written
    // between the first one and the last one (8-byte atomicity), recover to `before`.
    let base = &snaps[first];
    let target = &snaps[last];
    let diff: Vec<usize> =
        (0..base.len() / 8).filter(|&w| base[w * 8..w * 8 + 8] != target[w * 8..w * 8 + 8]).collect();
    assert!(diff.len() > 50, "the batch wrote in place: {} words", diff.len());
    for (i, snap) in snaps.iter().enumerate().take(last + 1).skip(first) {
        let (r, map) = recover_image(&images, snap);
        assert_eq!(r.undone, Some(count));
        assert_same_content(map.into_iter().collect(), &before, &format!("persist point {i}"));
    }
    for image_no in 0..60 {
        let keep = [0.05, 0.3, 0.5, 0.8, 1.0][image_no % 5];
        let mut image = base.clone();
        for &w in &diff {
            if rng.random_bool(keep) {
                image[w * 8..w * 8 + 8].copy_from_slice(&target[w * 8..w * 8 + 8]);
            }
        }
        let (r, map) = recover_image(&images, &image);
        assert_eq!(r.undone, Some(count), "image {image_no}");
        assert_same_content(map.into_iter().collect(), &before, &format!("image {image_no} (keep {keep})"));
    }
    // Torn log headers before the log is durable: nothing changed in place, nothing to undo.
    let pre = &snaps[first - 1];
    let header_words: Vec<usize> =
        (0..pre.len() / 8).filter(|&w| pre[w * 8..w * 8 + 8] != base[w * 8..w * 8 + 8]).collect();
    assert!(header_words.len() <= 2, "only the log header changes at the log's persist point");
    for mask in 0..(1 << header_words.len()) {
        let mut image = pre.clone();
        for (b, &w) in header_words.iter().enumerate() {
            if mask & (1 << b) != 0 {
                image[w * 8..w * 8 + 8].copy_from_slice(&base[w * 8..w * 8 + 8]);
            }
        }
        let (_, map) = recover_image(&images, &image);
        assert_same_content(map.into_iter().collect(), &before, &format!("torn header {mask:b}"));
    }
    // Once the invalidation is durable, the batch holds.
    let (r, map) = recover_image(&images, snaps.last().unwrap());
    assert_eq!(r.undone, None);
    assert_same_content(map.into_iter().collect(), &after, "after the invalidation");

    // A recovered image runs on the GPU: the allocators rebuilt from it work.
    for image_no in 0..2 {
        let mut image = base.clone();
        for &w in &diff {
            if rng.random_bool(0.5) {
                image[w * 8..w * 8 + 8].copy_from_slice(&target[w * 8..w * 8 + 8]);
            }
        }
        let p = dir.path().join(format!("crash{image_no}.pool"));
        std::fs::write(&p, &image).unwrap();
        let mut t2 = SlabSystem::open(&p, gpu.clone(), &options(placement, 32, None)).unwrap();
        assert_eq!(t2.recovered().undone, Some(count));
        assert_same_content(t2.entries().unwrap(), &before, "reopened image");
        check_allocators(&t2, "reopened image");
        let mut o = Oracle { map: before.clone() };
        let want = o.run(&batch);
        let got = run_host(&mut t2, &gpu, &batch).unwrap();
        assert_eq!(got, want, "the batch again, on the recovered table");
        assert_same_content(t2.entries().unwrap(), &after, "the batch again");
        check_allocators(&t2, "the batch again");
    }
}

/// Close and reopen; drop without closing (a crash between batches) and reopen: the content,
/// the count and the allocators survive, and the table keeps working.
#[test]
fn gpu_reopen_after_close_and_after_a_crash() {
    let seed = common::seed("gpu_reopen_after_close_and_after_a_crash");
    let mut rng = StdRng::seed_from_u64(seed);
    let gpu = gpu();
    let dir = common::pool_dir();
    let path = dir.path().join("reopen.pool");
    let mut cfg = SlabConfig::new(32, 128, 500);
    cfg.buckets = Some(32);
    cfg.pool_slabs = Some(300);
    let mut t = SlabSystem::create_with(Some(&path), &cfg, gpu.clone(), &SlabOptions::default()).unwrap();
    let mut oracle = Oracle::default();
    let step = |t: &mut SlabSystem, oracle: &mut Oracle, rng: &mut StdRng| {
        let mut batch = Batch::new(32, 128);
        for k in sample(rng, 500, 200) {
            let kind = common::random_kind(rng);
            let v = common::value(rng, 128);
            batch.push(kind, &common::key(k as u64, 32), kind.writes_value().then_some(&v[..])).unwrap();
        }
        assert_eq!(run_host(t, &gpu, &batch).unwrap(), oracle.run(&batch));
    };
    for _ in 0..3 {
        step(&mut t, &mut oracle, &mut rng);
    }
    let len = t.len();
    t.close().unwrap();
    assert!(host_pm::Pool::open(&path).unwrap().header().clean_shutdown);
    let mut t = SlabSystem::open(&path, gpu.clone(), &SlabOptions::default()).unwrap();
    assert_eq!(t.recovered().undone, None);
    assert_eq!(t.len(), len);
    assert_same_content(t.entries().unwrap(), &oracle.map, "after close");
    check_allocators(&t, "after close");
    step(&mut t, &mut oracle, &mut rng);
    drop(t);
    let mut t = SlabSystem::open(&path, gpu.clone(), &SlabOptions::default()).unwrap();
    assert_eq!(t.recovered().undone, None, "a crash between batches leaves nothing to undo");
    assert_same_content(t.entries().unwrap(), &oracle.map, "after a crash");
    check_allocators(&t, "after a crash");
    step(&mut t, &mut oracle, &mut rng);
    assert_same_content(t.entries().unwrap(), &oracle.map, "after a crash, then a batch");
    t.close().unwrap();
    // A gphash pool is not a slab pool.
    let other = dir.path().join("gphash.pool");
    gphash::GpHash::create(
        Some(&other),
        &gphash::Config { capacity: 100, ..Default::default() },
        &common::cpu_options(),
    )
    .unwrap()
    .close()
    .unwrap();
    assert!(matches!(
        SlabSystem::open(&other, gpu.clone(), &SlabOptions::default()),
        Err(Error::IncompatiblePool { .. })
    ));
}
