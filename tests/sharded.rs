//! Sharded tables (`ShardedGpHash`): results equal the model's, each key lives in the shard its
//! hash names, shards grow on their own, a failing shard leaves the others' parts applied and
//! says so, and a table is never replaced or opened without its manifest.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::oracle::{Oracle, assert_same_content};
use gphash::{Batch, Config, Error, GpHash, GpuOptions, OpKind, Options, ShardedGpHash, Status};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn options() -> Options {
    common::gpu_options(GpuOptions { max_window_bytes: Some(1 << 20), ..GpuOptions::default() })
}

/// Every key of every shard, after checking that each lies in the shard its hash names.
fn content(t: &ShardedGpHash) -> Vec<(Vec<u8>, Vec<u8>)> {
    let n = t.shards().len();
    let mut all = vec![];
    for (i, shard) in t.shards().iter().enumerate() {
        for (k, v) in shard.entries() {
            assert_eq!(ShardedGpHash::shard_of(&k, n), i, "a key in the wrong shard");
            all.push((k, v));
        }
    }
    all
}

/// Random ordered batches over few keys (so keys repeat within a batch) and unordered batches
/// of distinct keys, on four shards that start small and grow: every result is the model's,
/// before and after a reopen.
#[test]
fn sharded_tables_match_the_model() {
    let seed = common::seed("sharded_tables_match_the_model");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    let path = dir.path().join("sharded");
    let config = Config { capacity: 64, value_bytes: 12, ..Config::default() };
    let t = ShardedGpHash::create(&path, &config, 4, &options()).unwrap();
    let mut oracle = Oracle::default();
    let space = 3_000u64;
    for round in 0..24 {
        let mut batch = Batch::new(8, 12);
        let ordered = round % 3 != 2;
        let mut keys: Vec<u64> = (0..rng.random_range(1..600)).map(|_| rng.random_range(0..space)).collect();
        if !ordered {
            keys.sort_unstable();
            keys.dedup();
        }
        for k in keys {
            let (kind, v) = (common::random_kind(&mut rng), common::value(&mut rng, 12));
            batch.push(kind, &common::key(k, 8), kind.writes_value().then_some(&v[..])).unwrap();
        }
        let result = if ordered { t.execute_ordered(&batch) } else { t.execute(&batch) }.unwrap();
        let want = oracle.run(&batch);
        for (i, (status, value)) in want.iter().enumerate() {
            assert_eq!(
                (result.statuses[i], result.value(i)),
                (*status, value.as_deref()),
                "round {round}, operation {i} ({:?})",
                batch.op(i).0
            );
        }
        assert_eq!(t.len(), oracle.map.len() as u64, "round {round}");
    }
    let grown: Vec<u64> = t.shards().iter().map(|s| s.activity().resizes).collect();
    assert!(grown.iter().all(|&g| g > 0), "each shard should have grown: {grown:?}");
    // A batch's parts ran on the shards' threads at once, and where the shards' pools are
    // imported in place, each recorded and submitted some of them with Vulkan itself, beside
    // the others' submits through wgpu on the same queue (docs/design.md §6).
    for (i, shard) in t.shards().iter().enumerate() {
        let p = shard.activity().profile;
        if common::submits_through_vulkan(shard) {
            assert!(p.vulkan_submits > 0 && p.wgpu_submits > 0, "shard {i}: {p:?}");
        }
    }
    assert_same_content(content(&t), &oracle.map, "before closing");
    assert!(t.check().iter().all(|r| r.ok()));
    t.close().unwrap();
    // Reopened on two device handles (one device here): the shards alternate between them.
    let t = match common::gpu() {
        Some(g) => {
            let twin = common::gpu_with_binding_limit(g.info.max_binding);
            let t = ShardedGpHash::open_on(&path, &options(), &[g.clone(), twin.clone()]).unwrap();
            for (i, shard) in t.shards().iter().enumerate() {
                let on = shard.gpu().expect("a shard on a GPU");
                assert!(std::sync::Arc::ptr_eq(on, [&g, &twin][i % 2]), "shard {i}");
            }
            t
        }
        None => ShardedGpHash::open(&path, &options()).unwrap(),
    };
    assert_same_content(content(&t), &oracle.map, "after reopening");
    let keys: Vec<u8> = (0..space).flat_map(|k| common::key(k, 8)).collect();
    let found = t.get(&keys).unwrap();
    for k in 0..space as usize {
        assert_eq!(found.value(k), oracle.map.get(&common::key(k as u64, 8)).map(|v| &v[..]), "key {k}");
    }
    t.close().unwrap();
}

/// A shard that cannot take its part (a table full, growth off) fails alone: the error names it,
/// its part took no effect, the other shards' parts did.
#[test]
fn a_failing_shard_leaves_the_others_applied() {
    let dir = common::pool_dir();
    let path = dir.path().join("sharded");
    let options = Options { grow: false, ..options() };
    let t =
        ShardedGpHash::create(&path, &Config { capacity: 400, ..Config::default() }, 3, &options).unwrap();
    // Shard 0 gets far more keys than its slots; the others a few each.
    let mut per_shard = [0u32; 3];
    let mut keys = vec![];
    for k in 0u64.. {
        let key = common::key(k, 8);
        let s = ShardedGpHash::shard_of(&key, 3);
        if per_shard[s] < [2_000, 50, 50][s] {
            per_shard[s] += 1;
            keys.extend_from_slice(&key);
        }
        if per_shard == [2_000, 50, 50] {
            break;
        }
    }
    let values = vec![7u8; keys.len()];
    let in_shard_0 = |key: &[u8]| ShardedGpHash::shard_of(key, 3) == 0;
    match t.insert(&keys, &values) {
        Err(Error::Shard { shard: 0, failed, applied, source, results }) => {
            assert_eq!((failed, applied), (vec![0], vec![1, 2]));
            assert!(matches!(*source, Error::TableFull { .. }), "{source}");
            assert_eq!(results.len(), 2_100);
            for (i, key) in keys.chunks(8).enumerate() {
                let want = (!in_shard_0(key)).then_some(Status::Ok);
                assert_eq!((results.took_effect(i), results.status(i)), (want.is_some(), want), "insert {i}");
            }
        }
        other => panic!("expected shard 0 to fail alone: {other:?}"),
    }
    assert_eq!(t.shards().iter().map(GpHash::len).collect::<Vec<_>>(), [0, 50, 50]);
    // Each key inserted again, then read, then overwritten, in one ordered batch: shard 0 fails
    // again, and the error holds the others' results, found values among them.
    let mut batch = Batch::new(8, 8);
    for key in keys.chunks(8) {
        batch.push(OpKind::Insert, key, Some(&[9; 8])).unwrap();
        batch.push(OpKind::Get, key, None).unwrap();
        batch.push(OpKind::Update, key, Some(&[3; 8])).unwrap();
    }
    match t.execute_ordered(&batch) {
        Err(Error::Shard { shard: 0, results, .. }) => {
            for (i, key) in keys.chunks(8).enumerate() {
                let got: Vec<_> = (3 * i..3 * i + 3).map(|j| (results.status(j), results.value(j))).collect();
                let want = if in_shard_0(key) {
                    vec![(None, None); 3]
                } else {
                    vec![
                        (Some(Status::Exists), None),
                        (Some(Status::Ok), Some(&[7u8; 8][..])),
                        (Some(Status::Ok), None),
                    ]
                };
                assert_eq!(got, want, "key {i}");
            }
        }
        other => panic!("expected shard 0 to fail alone: {other:?}"),
    }
    assert_eq!(t.shards().iter().map(GpHash::len).collect::<Vec<_>>(), [0, 50, 50]);
    let found = t.get(&keys).unwrap();
    for (i, key) in keys.chunks(8).enumerate() {
        assert_eq!(found.value(i), (!in_shard_0(key)).then_some(&[3u8; 8][..]), "key {i}");
    }
    assert!(matches!(t.get(&[0; 7]), Err(Error::KeysLength { .. })));
    assert!(matches!(t.execute(&Batch::new(16, 8)), Err(Error::KeyWidth { found: 16, expected: 8 })));
    t.close().unwrap();
}

/// Creating never replaces a table; opening needs the manifest and shards of one width.
#[test]
fn a_sharded_table_is_never_replaced() {
    let dir = common::pool_dir();
    let path = dir.path().join("sharded");
    let t = ShardedGpHash::create(&path, &Config::default(), 2, &options()).unwrap();
    let keys: Vec<u8> = (0..100u64).flat_map(|k| common::key(k, 8)).collect();
    assert!(t.insert(&keys, &vec![1; 800]).unwrap().iter().all(|&s| s == Status::Ok));
    t.close().unwrap();
    let again = ShardedGpHash::create(&path, &Config::default(), 3, &options()).err().unwrap();
    assert!(again.to_string().contains("it holds a sharded table"), "{again}");
    let t = ShardedGpHash::open(&path, &options()).unwrap();
    assert_eq!((t.len(), t.shards().len()), (100, 2));
    let want: HashMap<Vec<u8>, Vec<u8>> = keys.chunks(8).map(|k| (k.to_vec(), vec![1; 8])).collect();
    assert_same_content(content(&t), &want, "after a refused create");
    t.close().unwrap();
    // Shards without a manifest (a create cut short) are refused, never opened as empty.
    std::fs::remove_file(path.join("gphash-shards")).unwrap();
    let open = ShardedGpHash::open(&path, &options()).err().unwrap();
    assert!(open.to_string().contains("no readable gphash-shards"), "{open}");
    // A shard of other widths, in its place (its header's words naming it).
    let mixed = dir.path().join("mixed");
    drop(ShardedGpHash::create(&mixed, &Config::default(), 2, &options()).unwrap().close());
    let shard1 = mixed.join("shard-0001.pool");
    let user = gphash::Pool::open_private(&shard1).unwrap().header().user;
    std::fs::remove_file(&shard1).unwrap();
    let wide = Config { key_bytes: 16, ..Config::default() };
    GpHash::create(Some(&shard1), &wide, &options()).unwrap().close().unwrap();
    let open = ShardedGpHash::open(&mixed, &options()).err().unwrap();
    assert!(open.to_string().contains("a pool of no sharded table"), "{open}");
    let mut pool = gphash::Pool::open(&shard1).unwrap();
    let mut h = *pool.header();
    h.user = user;
    pool.write_header(&h).unwrap();
    pool.close().unwrap();
    let open = ShardedGpHash::open(&mixed, &options()).err().unwrap();
    assert!(open.to_string().contains("shard 1 has (16, 8)-byte keys and values"), "{open}");
    // Anything where a shard's pool goes (a file, a directory) is refused before a pool is
    // made, and left alone.
    let stray = dir.path().join("stray");
    std::fs::create_dir_all(stray.join("shard-0002.pool")).unwrap();
    std::fs::write(stray.join("shard-0001.pool"), b"not ours").unwrap();
    let failed = ShardedGpHash::create(&stray, &Config::default(), 3, &options()).err().unwrap();
    assert!(failed.to_string().contains("shard-0001.pool exists"), "{failed}");
    let mut left: Vec<String> =
        std::fs::read_dir(&stray).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    left.sort();
    assert_eq!(left, ["shard-0001.pool", "shard-0002.pool"]);
    assert_eq!(std::fs::read(stray.join("shard-0001.pool")).unwrap(), b"not ours");
    std::fs::remove_file(stray.join("shard-0001.pool")).unwrap();
    let failed = ShardedGpHash::create(&stray, &Config::default(), 3, &options()).err().unwrap();
    assert!(failed.to_string().contains("shard-0002.pool exists"), "{failed}");
    assert!(stray.join("shard-0002.pool").is_dir());
    // Without a device given, the shards take the host's GPUs; under the CPU executor, none.
    if common::gpu().is_some() {
        assert!(!ShardedGpHash::devices(&Options::default()).unwrap().is_empty());
    }
    let cpu = Options { executor: gphash::Executor::Cpu, ..Options::default() };
    assert!(ShardedGpHash::devices(&cpu).unwrap().is_empty());
    let zero =
        ShardedGpHash::create(&dir.path().join("none"), &Config::default(), 0, &options()).err().unwrap();
    assert!(zero.to_string().contains("0 shards"), "{zero}");
}

/// A pool put in another shard's place, or one of another table, is refused before it is
/// opened for writing, and the table opens again once the files are back in place.
#[test]
fn shards_out_of_place_are_refused() {
    let dir = common::pool_dir();
    let (path, other) = (dir.path().join("sharded"), dir.path().join("other"));
    let t = ShardedGpHash::create(&path, &Config::default(), 3, &options()).unwrap();
    let keys: Vec<u8> = (0..300u64).flat_map(|k| common::key(k, 8)).collect();
    assert!(t.insert(&keys, &vec![7; 2400]).unwrap().iter().all(|&s| s == Status::Ok));
    t.close().unwrap();
    ShardedGpHash::create(&other, &Config::default(), 3, &options()).unwrap().close().unwrap();
    let shard = |d: &Path, i: usize| d.join(format!("shard-{i:04}.pool"));
    let bytes = |p: &Path| std::fs::read(p).unwrap();
    let refused = |why: &str| {
        let before: Vec<Vec<u8>> = (0..3).map(|i| bytes(&shard(&path, i))).collect();
        let e = ShardedGpHash::open(&path, &options()).err().unwrap();
        assert!(matches!(e, Error::IncompatiblePool { .. }) && e.to_string().contains(why), "{e}");
        let after: Vec<Vec<u8>> = (0..3).map(|i| bytes(&shard(&path, i))).collect();
        assert!(before == after, "a refused open wrote to a pool");
        let misplaced = ShardedGpHash::misplaced(&path).unwrap();
        misplaced.iter().map(|(i, _)| *i).collect::<Vec<_>>()
    };
    // Two shards swapped.
    let swap = |a: usize, b: usize| {
        let temp = path.join("swap");
        std::fs::rename(shard(&path, a), &temp).unwrap();
        std::fs::rename(shard(&path, b), shard(&path, a)).unwrap();
        std::fs::rename(&temp, shard(&path, b)).unwrap();
    };
    swap(0, 2);
    assert_eq!(refused("this table's shard 2"), [0, 2]);
    swap(0, 2);
    assert!(ShardedGpHash::misplaced(&path).unwrap().is_empty());
    // Another table's shard 1, in the same place.
    let own = path.join("own");
    std::fs::rename(shard(&path, 1), &own).unwrap();
    std::fs::copy(shard(&other, 1), shard(&path, 1)).unwrap();
    let manifest = std::fs::read_to_string(other.join("gphash-shards")).unwrap();
    let id = manifest.lines().nth(2).unwrap().strip_prefix("table ").unwrap();
    assert_eq!(refused(&format!("but shard 1 of table {id}")), [1]);
    std::fs::rename(&own, shard(&path, 1)).unwrap();
    let t = ShardedGpHash::open(&path, &options()).unwrap();
    let want: HashMap<Vec<u8>, Vec<u8>> = keys.chunks(8).map(|k| (k.to_vec(), vec![7; 8])).collect();
    assert_same_content(content(&t), &want, "with every shard back in place");
    t.close().unwrap();
}

/// Shards of equal load grow ahead of need, one a batch, where batches are small against the
/// table: no batch waits for two growths, and the content stays the model's.
#[test]
fn shards_grow_one_a_batch() {
    let dir = common::pool_dir();
    let t = ShardedGpHash::create(
        &dir.path().join("sharded"),
        &Config { capacity: 4_000, ..Config::default() },
        4,
        &options(),
    )
    .unwrap();
    let growths = |t: &ShardedGpHash| t.shards().iter().map(|s| s.activity().resizes).sum::<u64>();
    let mut want = HashMap::new();
    let mut most = 0;
    for start in (0..30_000u64).step_by(100) {
        let keys: Vec<u8> = (start..start + 100).flat_map(|k| common::key(k, 8)).collect();
        let values: Vec<u8> = (start..start + 100).flat_map(|k| k.to_le_bytes()).collect();
        let before = growths(&t);
        assert!(t.insert(&keys, &values).unwrap().iter().all(|&s| s == Status::Ok));
        most = most.max(growths(&t) - before);
        want.extend((start..start + 100).map(|k| (common::key(k, 8), k.to_le_bytes().to_vec())));
    }
    let grown = growths(&t);
    assert!(grown >= 8, "the shards grew {grown} times");
    assert_eq!(most, 1, "a batch waited for {most} growths");
    assert_same_content(content(&t), &want, "after growing");
    t.close().unwrap();
}
