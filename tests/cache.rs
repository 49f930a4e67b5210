//! The bucket cache against the oracle and its CPU twins: results with loading phases forced
//! often, for every policy; the cache coherent with the pool after every batch; hot keys updated
//! and read across loading phases; access counts as the model computes them.
//!
//! On lavapipe `subgroup_sizes_4_to_128` re-runs these tests at subgroup sizes 4 to 128 (see
//! `common::rerun_at_subgroup_sizes` for why 32 to 128 do not run on lavapipe).

mod common;

use std::collections::{HashMap, HashSet};

use common::oracle::{Oracle, assert_same_content};
use gphash::hash::Seeds;
use gphash::testing::cache;
use gphash::testing::model::Model;
use gphash::{Batch, CacheOptions, CacheStatus, Config, GpHash, GpuOptions, Placement, Policy, Status};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const POLICIES: [Policy; 3] = [Policy::Lfu, Policy::Lru, Policy::Random];

fn options(cache: CacheOptions, tile: u32) -> gphash::Options {
    common::gpu_options(GpuOptions { placement: Placement::ZeroCopy, tile, cache, ..GpuOptions::default() })
}

fn cached_table(
    dir: &tempfile::TempDir,
    name: &str,
    config: &Config,
    cache: CacheOptions,
    tile: u32,
) -> GpHash {
    let t = common::table(dir, name, config, &options(cache, tile));
    if common::gpu().is_some() {
        assert!(matches!(t.stats().cache, CacheStatus::On(_)), "{name}: {}", t.stats().cache);
    }
    t
}

fn pool_words(t: &GpHash) -> (Vec<u32>, Vec<u32>) {
    t.with_pool(|pool| {
        let h = pool.header();
        let words = |r| bytemuck::cast_slice::<u8, u32>(pool.region(r)).to_vec();
        (words(h.table_region), words(h.heap_region))
    })
}

/// The cache holds exactly what the pool holds, and no claim ever found it stale.
fn assert_coherent(t: &GpHash, what: &str) {
    let Some(_) = common::gpu() else { return };
    let snap = t.cache_snapshot().unwrap();
    let (table, heap) = pool_words(t);
    let bad = cache::verify(&t.geometry(), &table, &heap, &snap);
    assert!(bad.is_empty(), "{what}: cache incoherent: {}", bad[..bad.len().min(5)].join("; "));
    if let CacheStatus::On(s) = t.stats().cache {
        assert_eq!(s.stale, 0, "{what}: a claim found a cached copy stale");
    }
}

fn cache_stats(t: &GpHash) -> gphash::CacheStats {
    match t.stats().cache {
        CacheStatus::On(s) => s,
        CacheStatus::Off { reason } => panic!("no cache: {reason}"),
    }
}

/// Runs `batch` ordered: every result is the one-by-one oracle's, and the cache stays coherent.
fn ordered_as_oracle(t: &GpHash, oracle: &mut Oracle, batch: &Batch, what: &str) {
    let want = oracle.run(batch);
    let got = t.execute_ordered(batch).unwrap();
    for (i, (status, value)) in want.iter().enumerate() {
        assert_eq!((got.statuses[i], got.value(i)), (*status, value.as_deref()), "{what} op {i}");
    }
    assert_coherent(t, what);
}

/// A key of a skewed space: low numbers are much more likely (so counting policies find them).
fn skewed(rng: &mut impl Rng, space: u64) -> u64 {
    let x: f64 = rng.random();
    ((x * x * x) * space as f64) as u64 % space
}

/// Random mixed batches (same keys repeating within a batch), loading phases every hundred
/// engine operations: every status and value read equals the one-by-one oracle's (ordered
/// mode), the content equals it, and the cache stays coherent with the pool.
#[test]
fn cached_results_match_the_oracle_with_frequent_loading() {
    let seed = common::seed("cached_results_match_the_oracle_with_frequent_loading");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    for (pi, policy) in POLICIES.into_iter().enumerate() {
        for (ri, (ratio, tile, key_bytes, value_bytes)) in
            [(0.1, 32, 8, 8), (0.5, 8, 32, 100), (1.0, 4, 16, 4)].into_iter().enumerate()
        {
            let cfg =
                Config { key_bytes, value_bytes, capacity: 1500, seed: rng.random(), ..Config::default() };
            // Ordered batches run their repeated keys folded, as fewer engine operations than the
            // batch holds: a short period still gives several loading phases.
            let opts = CacheOptions { ratio: Some(ratio), policy, period: 100, ..CacheOptions::default() };
            let what = format!("{policy} ratio {ratio} tile {tile} key {key_bytes}");
            let t = cached_table(&dir, &format!("t{pi}{ri}"), &cfg, opts, tile);
            let mut oracle = Oracle::default();
            let space = (t.geometry().slots() as f64 * 0.5) as u64;
            for round in 0..12 {
                let mut batch = t.batch();
                for _ in 0..rng.random_range(1..400) {
                    let kind = common::random_kind(&mut rng);
                    let v = common::value(&mut rng, value_bytes as usize);
                    let k = common::key(skewed(&mut rng, space), key_bytes as usize);
                    batch.push(kind, &k, kind.writes_value().then_some(&v[..])).unwrap();
                }
                let want = oracle.run(&batch);
                let got = t.execute_ordered(&batch).unwrap_or_else(|e| panic!("{what} round {round}: {e}"));
                for (i, (status, value)) in want.iter().enumerate() {
                    assert_eq!(got.statuses[i], *status, "{what} round {round} op {i} ({:?})", batch.op(i).0);
                    assert_eq!(got.value(i), value.as_deref(), "{what} round {round} op {i}: value");
                }
                assert_coherent(&t, &format!("{what} round {round}"));
            }
            assert_same_content(t.entries(), &oracle.map, &what);
            assert!(t.check().ok(), "{what}: {}", t.check());
            if common::gpu().is_some() {
                let s = cache_stats(&t);
                // A cache for every group loads once; the others at every period.
                let phases = if ratio == 1.0 { s.loads == 1 } else { s.loads >= 3 };
                assert!(phases, "{what}: {} loading phases", s.loads);
                assert!(s.groups_loaded > 0 && s.cached > 0, "{what}: nothing was loaded: {s}");
                assert!(s.hits > 0, "{what}: the cache served nothing: {s}");
                // Counted by the write-through, which trails phase B: its count comes back with
                // a later submit's control block, and is not lost.
                assert!(s.refresh_reads > 0, "{what}: no write-through counted: {s:?}");
            }
        }
    }
}

/// Hot keys upserted several times in one batch, deleted and reinserted, with a loading phase
/// before every batch: a read never returns anything but the last acknowledged value, the same
/// value the pool holds.
#[test]
fn hot_keys_updated_then_read_across_loading_phases() {
    let seed = common::seed("hot_keys_updated_then_read_across_loading_phases");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    for policy in POLICIES {
        let cfg =
            Config { key_bytes: 8, value_bytes: 16, capacity: 2000, seed: rng.random(), ..Config::default() };
        let opts = CacheOptions { ratio: Some(0.3), policy, period: 1, ..CacheOptions::default() };
        let t = cached_table(&dir, &format!("hot-{policy}"), &cfg, opts, 32);
        let hot: Vec<Vec<u8>> = (0..40).map(|k| common::key(k, 8)).collect();
        let cold: Vec<u8> = (1000..1600).flat_map(|k| common::key(k, 8)).collect();
        let zeros = vec![0u8; 600 * 16];
        t.insert(&cold, &zeros).unwrap();
        let mut latest: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        for round in 0..30 {
            // Several upserts of each hot key in one (unordered) batch, and some deletes.
            let mut writes = t.batch();
            for k in &hot {
                for _ in 0..3 {
                    writes.upsert(k, &common::value(&mut rng, 16)).unwrap();
                }
                if rng.random_bool(0.1) {
                    writes.delete(k).unwrap();
                }
            }
            let r = t.execute(&writes).unwrap();
            assert!(r.statuses.iter().all(|s| matches!(s, Status::Ok | Status::NotFound)));
            // What the pool now holds for the hot keys is what was acknowledged.
            let pool: HashMap<Vec<u8>, Vec<u8>> = t.entries().into_iter().collect();
            latest.clear();
            for k in &hot {
                if let Some(v) = pool.get(k) {
                    latest.insert(k.clone(), v.clone());
                }
            }
            // Reads (also cold ones, so cold groups keep being counted) see exactly that.
            let mut reads = t.batch();
            for k in &hot {
                reads.get(k).unwrap();
            }
            for _ in 0..50 {
                let c = rng.random_range(0..600);
                reads.get(&cold[c * 8..c * 8 + 8]).unwrap();
            }
            let got = t.execute(&reads).unwrap();
            for (i, k) in hot.iter().enumerate() {
                assert_eq!(got.value(i), latest.get(k).map(|v| &v[..]), "{policy} round {round} hot key {i}");
            }
            for i in hot.len()..reads.len() {
                assert_eq!(got.value(i), Some(&[0u8; 16][..]), "{policy} round {round}: cold read {i}");
            }
            assert_coherent(&t, &format!("{policy} round {round}"));
        }
        if common::gpu().is_some() {
            let s = cache_stats(&t);
            assert!(s.hits > 0 && s.value_reads_saved > 0, "{policy}: the cache served nothing: {s}");
        }
    }
}

/// The access counts of LFU (increments) and LRU (batch stamps) equal those of the CPU twin
/// `cache::touches`, batch after batch (no loading phase: counts would halve).
#[test]
fn access_counts_match_the_model() {
    let seed = common::seed("access_counts_match_the_model");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    let Some(_) = common::gpu() else { return };
    for policy in [Policy::Lfu, Policy::Lru] {
        let cfg =
            Config { key_bytes: 16, value_bytes: 8, capacity: 2000, seed: rng.random(), ..Config::default() };
        // One access in 3 counted, as phase A samples them.
        let every = 3;
        let opts = CacheOptions {
            ratio: Some(0.25),
            policy,
            period: u64::MAX,
            sample: every,
            ..CacheOptions::default()
        };
        let t = cached_table(&dir, &format!("counts-{policy}"), &cfg, opts, 16);
        let geo = t.geometry();
        let seeds = Seeds::new(t.with_pool(|pool| pool.header().table.seed), geo.layout.hashes);
        let model = Model { geo: &geo, seeds: &seeds, verify_values: false };
        let space = (geo.slots() as f64 * 0.5) as u64;
        let mut counts = vec![0u32; geo.groups() as usize];
        for round in 1..=10u32 {
            let mut batch = t.batch();
            let mut seen = HashSet::new();
            for _ in 0..rng.random_range(1..500) {
                let kind = common::random_kind(&mut rng);
                let k = common::key(skewed(&mut rng, space), 16);
                // Distinct keys: the twin reads the table before and after the batch.
                if seen.insert(k.clone()) {
                    batch.push(kind, &k, kind.writes_value().then_some(&[7u8; 8][..])).unwrap();
                }
            }
            let (before, _) = pool_words(&t);
            t.execute(&batch).unwrap();
            let (after, _) = pool_words(&t);
            let mut encoded = gphash::Encoded::default();
            batch.encode(&mut encoded);
            let counted = |&(op, _): &(usize, u32)| cache::counted(op as u32, round, every);
            for (_, g) in cache::touches(&model, &before, &after, &encoded).into_iter().filter(counted) {
                match policy {
                    Policy::Lfu => counts[g as usize] += 1,
                    _ => counts[g as usize] = round,
                }
            }
            let got = t.cache_snapshot().unwrap().counts;
            let differ = (0..counts.len()).filter(|&g| counts[g] != got[g]).count();
            assert_eq!(differ, 0, "{policy} round {round}: {differ} groups counted differently");
        }
        // A loading phase ages LFU counts (the `decay` kernel halves each); LRU stamps stay.
        t.load_cache().unwrap();
        let aged: Vec<u32> = match policy {
            Policy::Lfu => counts.iter().map(|c| c >> 1).collect(),
            _ => counts.clone(),
        };
        let got = t.cache_snapshot().unwrap().counts;
        let differ = (0..aged.len()).filter(|&g| aged[g] != got[g]).count();
        assert_eq!(differ, 0, "{policy}: {differ} groups aged differently by a loading phase");
    }
}

/// A table without cache and one with a whole-table cache give the same results on the same
/// batches (the cache changes where data is read, never what).
#[test]
fn whole_table_cache_is_transparent() {
    let seed = common::seed("whole_table_cache_is_transparent");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    let cfg =
        Config { key_bytes: 8, value_bytes: 32, capacity: 3000, seed: rng.random(), ..Config::default() };
    let whole =
        CacheOptions { ratio: Some(1.0), policy: Policy::Random, period: 1, ..CacheOptions::default() };
    let cached = cached_table(&dir, "whole", &cfg, whole, 32);
    let plain = common::table(&dir, "plain", &cfg, &options(CacheOptions::off(), 32));
    let space = (cached.geometry().slots() as f64 * 0.6) as u64;
    for round in 0..8 {
        let mut batch: Batch = cached.batch();
        for _ in 0..rng.random_range(1..1500) {
            let kind = common::random_kind(&mut rng);
            let v = common::value(&mut rng, 32);
            batch
                .push(
                    kind,
                    &common::key(rng.random_range(0..space), 8),
                    kind.writes_value().then_some(&v[..]),
                )
                .unwrap();
        }
        let a = cached.execute_ordered(&batch).unwrap();
        let b = plain.execute_ordered(&batch).unwrap();
        assert_eq!(a.statuses, b.statuses, "round {round}");
        for i in 0..batch.len() {
            assert_eq!(a.value(i), b.value(i), "round {round} op {i}");
        }
        assert_coherent(&cached, &format!("round {round}"));
    }
    if common::gpu().is_some() {
        let s = cache_stats(&cached);
        // Every group is cached after the first loading phase: most targets hit.
        assert_eq!(s.cached as u64, cached.geometry().groups());
        assert!(s.hit_rate() > 0.5, "{s}");
    }
}

/// A cache with an entry for every group (the default on a GPU with memory of its own) loads
/// them all from the first batch, without waiting for a period's operations, in one loading
/// phase that nothing repeats: every later read of a key hits.
#[test]
fn a_cache_for_every_group_loads_them_from_the_first_batch() {
    let seed = common::seed("a_cache_for_every_group_loads_them_from_the_first_batch");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    let cfg =
        Config { key_bytes: 8, value_bytes: 16, capacity: 3000, seed: rng.random(), ..Config::default() };
    // LFU, and a period no run reaches: only having every group can start the phase.
    let every = CacheOptions { ratio: Some(1.0), period: u64::MAX, ..CacheOptions::default() };
    let t = cached_table(&dir, "every", &cfg, every, 32);
    let Some(_) = common::gpu() else { return };
    let keys: Vec<u64> = (0..2000).map(|_| rng.random()).collect();
    let mut load: Batch = t.batch();
    for &k in &keys {
        load.upsert(&common::key(k, 8), &common::value(&mut rng, 16)).unwrap();
    }
    t.execute_ordered(&load).unwrap();
    let mut gets: Batch = t.batch();
    for &k in &keys {
        gets.get(&common::key(k, 8)).unwrap();
    }
    let groups = t.geometry().groups();
    for round in 0..4 {
        let r = t.execute(&gets).unwrap();
        assert!(r.statuses.iter().all(|&s| s == Status::Ok), "round {round}");
        assert_coherent(&t, &format!("round {round}"));
    }
    let s = cache_stats(&t);
    assert_eq!((s.entries as u64, s.cached as u64, s.loads), (groups, groups, 1), "{s}");
    // The last round's reads all hit (the first batches ran while the phase loaded).
    let before = s.hits;
    t.execute(&gets).unwrap();
    let after = cache_stats(&t);
    assert_eq!(after.hits - before, keys.len() as u64, "{after}");
    assert_eq!(after.loads, 1, "{after}");
}

/// A device that runs out of memory for the cache (a GPU other processes share; injected
/// here) gets a cache of half the entries, then half again, down to none: the table opens,
/// its results are the oracle's, and its statistics say why the cache is smaller.
#[test]
fn a_cache_the_device_has_no_memory_for_is_made_smaller() {
    let seed = common::seed("a_cache_the_device_has_no_memory_for_is_made_smaller");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    let cfg =
        Config { key_bytes: 8, value_bytes: 16, capacity: 3000, seed: rng.random(), ..Config::default() };
    let geo = gphash::Geometry::for_capacity(cfg.layout, 8, 16, cfg.capacity).unwrap();
    let entry_bytes = geo.group_bytes() + geo.group_slots() * geo.cell_words() as u64 * 4;
    let most = entry_bytes * geo.groups() / 3;
    let every = CacheOptions { ratio: Some(1.0), period: u64::MAX, ..CacheOptions::default() };
    let short = CacheOptions { fail_above: Some(most), ..every };
    let t = cached_table(&dir, "short", &cfg, short, 32);
    let Some(_) = common::gpu() else { return };
    let s = cache_stats(&t);
    // Halved from every group until the entries fit: a quarter of the groups.
    assert_eq!(s.entries as u64, geo.groups() / 4, "{s}");
    assert!(s.entries as u64 * entry_bytes <= most && 2 * s.entries as u64 * entry_bytes > most, "{s}");
    assert!(s.limited.as_deref().is_some_and(|w| w.contains("injected")), "{s}");
    let mut oracle = Oracle::default();
    for round in 0..4 {
        let mut batch = t.batch();
        for _ in 0..1500 {
            let k = common::key(rng.random_range(0..2500), 8);
            batch.upsert(&k, &common::value(&mut rng, 16)).unwrap();
            batch.get(&k).unwrap();
        }
        ordered_as_oracle(&t, &mut oracle, &batch, &format!("round {round}"));
    }
    assert_same_content(t.entries(), &oracle.map, "after the rounds");
    // No memory at all: no cache, and the reason says so.
    let none = CacheOptions { fail_above: Some(0), ..every };
    let t = common::table(&dir, "none", &cfg, &options(none, 32));
    match t.stats().cache {
        CacheStatus::Off { reason } => assert!(reason.contains("injected"), "{reason}"),
        CacheStatus::On(s) => panic!("a cache with no memory: {s}"),
    }
    t.upsert(&common::key(1, 8), &[7; 16]).unwrap();
    assert_eq!(t.get(&common::key(1, 8)).unwrap().value(0), Some(&[7u8; 16][..]));
}

/// A cached table that grows by several levels while its cache loads often: every key stays
/// readable with its latest value (the engine and its cache are rebuilt at each resize, empty,
/// and refilled by the next loading phase).
#[test]
fn cache_is_rebuilt_across_resizes() {
    let seed = common::seed("cache_is_rebuilt_across_resizes");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    let cfg = Config { key_bytes: 8, value_bytes: 8, capacity: 200, seed: rng.random(), ..Config::default() };
    let opts = CacheOptions { ratio: Some(0.5), period: 64, ..CacheOptions::default() };
    let t = cached_table(&dir, "grows", &cfg, opts, 32);
    let mut oracle = Oracle::default();
    let slots = t.geometry().slots();
    for round in 0..16u64 {
        let mut batch = t.batch();
        for k in round * 150..(round + 1) * 150 {
            batch.insert(&common::key(k, 8), &k.to_le_bytes()).unwrap();
            // Reads and updates of earlier keys keep their groups hot.
            let old = common::key(rng.random_range(0..=k), 8);
            batch.upsert(&old, &rng.random::<u64>().to_le_bytes()).unwrap();
            batch.get(&old).unwrap();
        }
        ordered_as_oracle(&t, &mut oracle, &batch, &format!("round {round}"));
    }
    assert!(t.stats().activity.resizes >= 2, "the table grew {} times", t.stats().activity.resizes);
    assert!(t.geometry().slots() > 4 * slots);
    assert_same_content(t.entries(), &oracle.map, "after growing");
}

/// A cache set on an open table and loaded on demand: the table is untouched, the hot groups are
/// cached when `load_cache` returns, and reads of hot keys are then served by the cache.
#[test]
fn cache_set_and_loaded_on_demand() {
    let dir = common::pool_dir();
    let Some(_) = common::gpu() else { return };
    let cfg = Config { key_bytes: 8, value_bytes: 8, capacity: 4000, ..Config::default() };
    let t = cached_table(
        &dir,
        "on-demand",
        &cfg,
        CacheOptions { ratio: Some(0.1), ..CacheOptions::default() },
        32,
    );
    let keys: Vec<u8> = (0..3000u64).flat_map(|k| common::key(k, 8)).collect();
    let values: Vec<u8> = (0..3000u64).flat_map(|k| k.to_le_bytes()).collect();
    t.insert(&keys, &values).unwrap();
    let before = t.entries();
    // Every access counted: each hot key's group is then among the hottest.
    t.set_cache(CacheOptions { ratio: Some(0.5), period: u64::MAX, sample: 1, ..CacheOptions::default() })
        .unwrap();
    assert_eq!(t.entries(), before, "setting the cache changed the table");
    assert_eq!(cache_stats(&t).entries as u64, t.geometry().groups() / 2);
    let hot = &keys[..80 * 8];
    for _ in 0..3 {
        t.get(hot).unwrap();
    }
    assert_eq!(cache_stats(&t).cached, 0, "nothing loads before the period");
    t.load_cache().unwrap();
    let s = cache_stats(&t);
    assert!(s.cached > 0 && !s.loading && s.loads == 1, "{s}");
    let got = t.get(hot).unwrap();
    for i in 0..80 {
        assert_eq!(got.value(i), Some(&(i as u64).to_le_bytes()[..]));
    }
    let after = cache_stats(&t);
    assert_eq!(after.hits - s.hits, 80, "every hot key was read from the cache: {after}");
    assert_coherent(&t, "on demand");
    assert!(t.set_cache(CacheOptions { ratio: Some(2.0), ..CacheOptions::default() }).is_err());
    assert_eq!(cache_stats(&t).entries, after.entries, "a refused setting keeps the cache");
}

/// Re-runs the tests above at the subgroup sizes lavapipe can be given.
#[test]
fn subgroup_sizes_4_to_128() {
    common::rerun_at_subgroup_sizes(
        &["cached_results", "hot_keys", "access_counts", "whole_table", "cache_is_rebuilt", "cache_set"],
        6,
    );
}

/// Write batches back to back, with nothing between them that waits for the GPU: the cache's
/// write-through of each batch trails its phase B unwaited and reads the batch's input, which
/// the next batch of the same slot overwrites. The cache must still hold exactly what the pool
/// holds, and every read the oracle's value.
#[test]
fn back_to_back_write_batches_leave_the_cache_coherent() {
    let seed = common::seed("back_to_back_write_batches_leave_the_cache_coherent");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    let cfg =
        Config { key_bytes: 8, value_bytes: 64, capacity: 4096, seed: rng.random(), ..Config::default() };
    let every = CacheOptions { ratio: Some(1.0), period: u64::MAX, ..CacheOptions::default() };
    let t = cached_table(&dir, "t", &cfg, every, 32);
    let mut oracle = Oracle::default();
    let keys: Vec<Vec<u8>> = (0..1024).map(|k| common::key(k, 8)).collect();
    for round in 0..60 {
        // Each batch rewrites every key with fresh values: a write-through that read the next
        // batch's input would cache a value the pool does not hold.
        let mut batch = t.batch();
        for k in &keys {
            batch.upsert(k, &common::value(&mut rng, 64)).unwrap();
        }
        oracle.run(&batch);
        t.execute_ordered(&batch).unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
    assert_coherent(&t, "after 60 write batches back to back");
    let got = t.get(&keys.concat()).unwrap();
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(got.value(i), oracle.map.get(k).map(Vec::as_slice), "key {i}");
    }
}
