//! The `cpu` baseline (`gphash_bench::systems::cpu`): its table against the oracle, reopening,
//! crash images, and the System path through the GPU.
//!
//! `GPHASH_TEST_SEED` replays a run; `GPHASH_CRASH_IMAGES` sets how many crash images to test
//! (default 600). Without a Vulkan device the GPU test prints a warning and only the host parts
//! run, except under `CI=true`, where it fails.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::crash::{Content, CrashRun, assert_whole_or_absent};
use common::oracle::{Oracle, assert_same_content};
use gphash::{Batch, Encoded, Error, OpKind, Status};
use gphash_bench::systems::cpu::{CpuConfig, CpuSystem, CpuTable};
use gphash_bench::systems::{System, run_host};
use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};

fn encode(batch: &Batch) -> Encoded {
    let mut e = Encoded::default();
    batch.encode(&mut e);
    e
}

/// Runs `batch` on the table and holds every status and value read to the oracle.
fn run_checked(t: &mut CpuTable, oracle: &mut Oracle, batch: &Batch, what: &str) {
    let e = encode(batch);
    let (statuses, found) =
        t.execute(&e.kinds, &e.keys, &e.values).unwrap_or_else(|err| panic!("{what}: {err}"));
    let want = oracle.run(batch);
    let cw = batch.value_bytes().div_ceil(4);
    let bytes: &[u8] = bytemuck::cast_slice(&found);
    for (i, (status, value)) in want.iter().enumerate() {
        assert_eq!(
            Status::from_code(statuses[i]),
            Some(*status),
            "{what}: operation {i} {:?}",
            batch.op(i).0
        );
        let got = &bytes[i * cw * 4..(i + 1) * cw * 4];
        match value {
            Some(v) => assert_eq!(&got[..v.len()], &v[..], "{what}: operation {i} read another value"),
            None => assert!(got.iter().all(|&b| b == 0), "{what}: operation {i} returned a value"),
        }
    }
    t.check().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(t.len(), oracle.map.len() as u64, "{what}: len");
    assert_eq!(t.cells_in_use(), t.len(), "{what}: cells in use");
}

#[test]
fn table_matches_the_oracle() {
    let seed = common::seed("table_matches_the_oracle");
    let mut rng = StdRng::seed_from_u64(seed);
    for key_bytes in [8, 16, 32] {
        for value_bytes in [8, 128] {
            for threads in [1, 4] {
                let config = CpuConfig {
                    key_bytes,
                    value_bytes,
                    capacity: 3000,
                    threads,
                    shards: 16,
                    seed: rng.random(),
                };
                let mut t = CpuTable::create(None, &config).unwrap();
                let mut oracle = Oracle::default();
                for b in 0..25 {
                    let n = [1, 7, 300, 1000][b % 4];
                    let batch = common::random_batch(&mut rng, n, 1500, key_bytes, value_bytes);
                    let what =
                        format!("seed {seed}, {key_bytes}/{value_bytes} bytes, {threads} threads, batch {b}");
                    run_checked(&mut t, &mut oracle, &batch, &what);
                }
                assert_same_content(
                    t.entries(),
                    &oracle.map,
                    &format!("seed {seed}, {key_bytes}/{value_bytes}"),
                );
            }
        }
    }
}

#[test]
fn many_threads_and_shards_on_a_larger_table() {
    let seed = common::seed("many_threads_and_shards_on_a_larger_table");
    let mut rng = StdRng::seed_from_u64(seed);
    let config =
        CpuConfig { key_bytes: 8, value_bytes: 16, capacity: 60_000, threads: 8, ..CpuConfig::default() };
    let mut t = CpuTable::create(None, &config).unwrap();
    assert_eq!(t.geometry().shards, 32);
    let mut oracle = Oracle::default();
    for b in 0..12 {
        let batch = common::random_batch(&mut rng, 20_000, 50_000, 8, 16);
        run_checked(&mut t, &mut oracle, &batch, &format!("seed {seed}, batch {b}"));
    }
    assert_same_content(t.entries(), &oracle.map, "larger table");
    // Different thread counts see the same table.
    for threads in [1, 3, 64] {
        t.set_threads(threads);
        let batch = common::random_batch(&mut rng, 5000, 50_000, 8, 16);
        run_checked(&mut t, &mut oracle, &batch, &format!("seed {seed}, {threads} threads"));
    }
}

/// Two keys with the same shard hash land in one shard and one thread, where a batch tells
/// its distinct keys apart by that hash and then by the key itself: every mix of operations
/// on the pair keeps them apart.
#[test]
fn keys_sharing_a_hash_stay_apart_in_a_batch() {
    let config =
        CpuConfig { key_bytes: 8, value_bytes: 8, capacity: 1000, threads: 2, ..CpuConfig::default() };
    let mut t = CpuTable::create(None, &config).unwrap();
    let seed = t.geometry().shard_seed;
    let words = |k: &[u8]| -> Vec<u32> {
        k.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
    };
    // Both words vary (a hash of one varying word may be a bijection); 2^20 keys of 32-bit
    // hashes hold a pair with certainty in practice.
    let mut seen = std::collections::HashMap::new();
    let (a, b) = (0u64..1 << 20)
        .find_map(|k| {
            let key = k.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes().to_vec();
            let h = gphash::hash::hash_words(&words(&key), seed);
            seen.insert(h, key.clone()).map(|other| (other, key))
        })
        .expect("two keys with one shard hash");
    assert_ne!(a, b);
    let mut oracle = Oracle::default();
    let mut batch = Batch::new(8, 8);
    batch.insert(&a, &[1; 8]).unwrap();
    batch.get(&b).unwrap();
    batch.insert(&b, &[2; 8]).unwrap();
    batch.get(&a).unwrap();
    batch.get(&b).unwrap();
    batch.update(&a, &[3; 8]).unwrap();
    batch.delete(&b).unwrap();
    batch.get(&a).unwrap();
    batch.get(&b).unwrap();
    batch.upsert(&b, &[4; 8]).unwrap();
    batch.insert(&a, &[5; 8]).unwrap();
    run_checked(&mut t, &mut oracle, &batch, "first batch");
    let mut batch = Batch::new(8, 8);
    batch.get(&a).unwrap();
    batch.get(&b).unwrap();
    batch.delete(&a).unwrap();
    batch.upsert(&b, &[6; 8]).unwrap();
    batch.get(&a).unwrap();
    batch.get(&b).unwrap();
    run_checked(&mut t, &mut oracle, &batch, "second batch");
    assert_same_content(t.entries(), &oracle.map, "keys sharing a hash");
}

/// Batches of reads with one write: only the thread owning the written key's shard commits,
/// the others sit the commit out.
#[test]
fn a_write_among_reads_commits_alone() {
    let seed = common::seed("a_write_among_reads_commits_alone");
    let mut rng = StdRng::seed_from_u64(seed);
    let config = CpuConfig { key_bytes: 8, value_bytes: 8, capacity: 5000, threads: 4, shards: 16, seed: 7 };
    let mut t = CpuTable::create(None, &config).unwrap();
    let mut oracle = Oracle::default();
    let mut load = Batch::new(8, 8);
    for k in 0..2000 {
        load.insert(&common::key(k, 8), &common::value(&mut rng, 8)).unwrap();
    }
    run_checked(&mut t, &mut oracle, &load, "load");
    for b in 0..8u64 {
        let mut batch = Batch::new(8, 8);
        for k in 0..1024 {
            batch.get(&common::key((k * 7 + b) % 2500, 8)).unwrap();
        }
        let written = common::key(b * 300, 8);
        match b % 3 {
            0 => batch.upsert(&written, &common::value(&mut rng, 8)).unwrap(),
            1 => batch.delete(&written).unwrap(),
            _ => batch.insert(&common::key(3000 + b, 8), &common::value(&mut rng, 8)).unwrap(),
        }
        batch.get(&written).unwrap();
        run_checked(&mut t, &mut oracle, &batch, &format!("seed {seed}, batch {b}"));
    }
    assert_same_content(t.entries(), &oracle.map, "a write among reads");
}

#[test]
fn malformed_batches_change_nothing() {
    let mut t = CpuTable::create(None, &CpuConfig { capacity: 100, ..CpuConfig::default() }).unwrap();
    assert_eq!(t.execute(&[], &[], &[]).unwrap(), (vec![], vec![]));
    let ok = Status::Ok as u32;
    assert_eq!(t.execute(&[2], &[1, 2], &[3, 4]).unwrap().0, vec![ok]);
    assert!(matches!(t.execute(&[9], &[1, 2], &[3, 4]), Err(Error::InvalidConfig(_))));
    assert!(matches!(t.execute(&[2], &[1], &[3, 4]), Err(Error::InvalidConfig(_))));
    assert!(matches!(t.execute(&[2], &[5, 2], &[]), Err(Error::InvalidConfig(_))));
    // Reads need no values.
    let (s, found) = t.execute(&[1, 1], &[1, 2, 7, 7], &[]).unwrap();
    assert_eq!(s, vec![ok, Status::NotFound as u32]);
    assert_eq!(found, vec![3, 4, 0, 0]);
    assert_eq!(t.len(), 1);
    t.check().unwrap();
}

#[test]
fn full_table_and_full_heap_roll_the_batch_back() {
    // One shard of 8 buckets of 18 slots (144 slots) and 152 value cells.
    let config = CpuConfig { capacity: 100, shards: 1, threads: 1, ..CpuConfig::default() };
    let mut t = CpuTable::create(None, &config).unwrap();
    assert_eq!((t.geometry().buckets, t.geometry().slots, t.geometry().cells), (8, 18, 152));
    let mut oracle = Oracle::default();
    let mut load = Batch::new(8, 8);
    for k in 0..100u64 {
        load.insert(&common::key(k, 8), &k.to_le_bytes()).unwrap();
    }
    run_checked(&mut t, &mut oracle, &load, "load");

    // 100 updates need 100 fresh cells while the old ones are live: only 52 are free.
    let mut update = Batch::new(8, 8);
    for k in 0..100u64 {
        update.update(&common::key(k, 8), &(k + 1000).to_le_bytes()).unwrap();
    }
    let e = encode(&update);
    assert!(matches!(t.execute(&e.kinds, &e.keys, &e.values), Err(Error::HeapFull { failed: 48 })));
    t.check().unwrap();
    assert_same_content(t.entries(), &oracle.map, "after the heap-full batch");
    assert_eq!(t.cells_in_use(), 100);

    // More keys than slots.
    let mut grow = Batch::new(8, 8);
    for k in 100..200u64 {
        grow.upsert(&common::key(k, 8), &k.to_le_bytes()).unwrap();
    }
    let e = encode(&grow);
    match t.execute(&e.kinds, &e.keys, &e.values) {
        Err(Error::TableFull { failed, .. }) => assert!(failed > 0),
        other => panic!("{other:?}"),
    }
    t.check().unwrap();
    assert_same_content(t.entries(), &oracle.map, "after the table-full batch");

    // Smaller batches of both kinds still go through.
    let mut half = Batch::new(8, 8);
    for k in 0..50u64 {
        half.update(&common::key(k, 8), &(k + 2000).to_le_bytes()).unwrap();
    }
    run_checked(&mut t, &mut oracle, &half, "half the updates");
    let mut more = Batch::new(8, 8);
    for k in 100..140u64 {
        more.insert(&common::key(k, 8), &k.to_le_bytes()).unwrap();
    }
    run_checked(&mut t, &mut oracle, &more, "40 more keys");
}

#[test]
fn reopening_keeps_content_and_rebuilds_allocators() {
    let seed = common::seed("reopening_keeps_content_and_rebuilds_allocators");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    let path = dir.path().join("cpu.pool");
    let config = CpuConfig { key_bytes: 16, value_bytes: 40, capacity: 4000, threads: 3, shards: 8, seed: 9 };
    let mut t = CpuTable::create(Some(&path), &config).unwrap();
    let mut oracle = Oracle::default();
    for b in 0..10 {
        let batch = common::random_batch(&mut rng, 800, 3000, 16, 40);
        run_checked(&mut t, &mut oracle, &batch, &format!("seed {seed}, batch {b}"));
    }
    assert!(matches!(CpuTable::open(&path, 2), Err(Error::Pool(host_pm::PoolError::Locked { .. }))));
    t.close().unwrap();

    let mut t = CpuTable::open(&path, 2).unwrap();
    let r = t.recovery();
    assert!(r.clean);
    assert_eq!((r.keys, r.cells_in_use), (oracle.map.len() as u64, oracle.map.len() as u64));
    assert_eq!(t.geometry().shards, 8);
    t.check().unwrap();
    assert_same_content(t.entries(), &oracle.map, "after close");
    for b in 0..5 {
        let batch = common::random_batch(&mut rng, 800, 3000, 16, 40);
        run_checked(&mut t, &mut oracle, &batch, &format!("seed {seed}, reopened batch {b}"));
    }
    drop(t);

    let mut t = CpuTable::open(&path, 0).unwrap();
    assert!(!t.recovery().clean);
    assert_eq!(t.recovery().keys, oracle.map.len() as u64);
    t.check().unwrap();
    assert_same_content(t.entries(), &oracle.map, "after a drop");
    // Allocators work after recovery: fill up to the capacity and empty again.
    let mut fill = Batch::new(16, 40);
    for k in 0..4000 {
        fill.insert(&common::key(k, 16), &common::value(&mut rng, 40)).unwrap();
    }
    run_checked(&mut t, &mut oracle, &fill, "fill to capacity");
    let mut empty = Batch::new(16, 40);
    for k in 0..4000 {
        empty.delete(&common::key(k, 16)).unwrap();
    }
    run_checked(&mut t, &mut oracle, &empty, "delete everything");
    assert!(t.is_empty());
    t.close().unwrap();

    // A pool of another format is refused.
    let other = dir.path().join("gphash.pool");
    let small = gphash::Config { capacity: 64, ..Default::default() };
    gphash::GpHash::create(Some(&other), &small, &common::cpu_options()).unwrap().close().unwrap();
    assert!(matches!(CpuTable::open(&other, 1), Err(Error::IncompatiblePool { .. })));
}

#[test]
fn damage_is_reported_on_open() {
    let dir = common::pool_dir();
    let path = dir.path().join("cpu.pool");
    let config = CpuConfig { capacity: 100, shards: 1, threads: 1, ..CpuConfig::default() };
    let mut t = CpuTable::create(Some(&path), &config).unwrap();
    let mut b = Batch::new(8, 8);
    for k in 0..2u64 {
        b.insert(&common::key(k, 8), &k.to_le_bytes()).unwrap();
    }
    let e = encode(&b);
    t.execute(&e.kinds, &e.keys, &e.values).unwrap();
    // Point the second key's slot at the first key's cell.
    let table = t.pool().header().table_region.offset as usize;
    let g = t.geometry().clone();
    let bytes = t.pool_mut().bytes_mut();
    let mut slots = vec![];
    for b in 0..g.buckets {
        let m = u64::from_le_bytes(bytes[table + b * 256..][..8].try_into().unwrap());
        slots.extend((0..g.slots).filter(|&i| m >> i & 1 == 1).map(|i| table + b * 256 + g.slot_offset(i)));
    }
    assert_eq!(slots.len(), 2);
    let cell: [u8; 4] = bytes[slots[0]..slots[0] + 4].try_into().unwrap();
    bytes[slots[1]..slots[1] + 4].copy_from_slice(&cell);
    t.pool().persist_all().unwrap();
    drop(t);
    match CpuTable::open(&path, 1) {
        Err(Error::Pool(host_pm::PoolError::Corrupt { what })) => {
            assert!(what.contains("referenced twice"), "{what}")
        }
        other => panic!("{other:?}"),
    }
}

/// A crash image is the durable pool at one persist point plus any subset of the 8-byte words
/// written before the next one. Each must reopen to: every acknowledged batch applied, each key
/// of the batch in flight as before it or as after it.
#[test]
fn crash_images_recover_to_acknowledged_states() {
    let seed = common::seed("crash_images_recover_to_acknowledged_states");
    let mut rng = StdRng::seed_from_u64(seed);
    let wanted: usize = std::env::var("GPHASH_CRASH_IMAGES").ok().and_then(|s| s.parse().ok()).unwrap_or(600);
    let mut run = CrashRun::default();
    let dir = common::pool_dir();
    let config = CpuConfig { key_bytes: 8, value_bytes: 12, capacity: 400, threads: 2, shards: 4, seed: 3 };
    let mut t = CpuTable::create(Some(&dir.path().join("run")), &config).unwrap();
    t.set_observer(Some(run.observer())).unwrap();

    let mut oracle = Oracle::default();
    for b in 0..40 {
        // Mostly distinct keys; every third batch repeats keys (each key still ends before or after).
        let batch = if b % 3 == 2 {
            common::random_batch(&mut rng, 120, 150, 8, 12)
        } else {
            let mut batch = Batch::new(8, 12);
            for k in sample(&mut rng, 500, 120) {
                let key = common::key(k as u64, 8);
                let v = common::value(&mut rng, 12);
                match rng.random_range(0..10) {
                    0..4 => batch.insert(&key, &v).unwrap(),
                    4..6 => batch.upsert(&key, &v).unwrap(),
                    6 => batch.update(&key, &v).unwrap(),
                    7..9 => batch.delete(&key).unwrap(),
                    _ => batch.get(&key).unwrap(),
                }
            }
            batch
        };
        run_checked(&mut t, &mut oracle, &batch, &format!("seed {seed}, batch {b}"));
        run.acknowledged(batch, &oracle.map);
    }
    drop(t);

    let written = run.written();
    assert!(written >= 60, "{written} persist intervals wrote something");
    assert!(!run.grew(), "the pool never grows");
    run.check_images(wanted, &mut rng, seed, &dir.path().join("image"), verify);
}

/// The image at `path` recovers to `acked`, with each key of the batch `in_flight` (with the
/// content its complete application gives) as before or as after it.
fn verify(path: &std::path::Path, acked: &Content, in_flight: &[(&Batch, &Content)], what: &str) {
    let t = CpuTable::open(path, 2).unwrap_or_else(|e| panic!("{what}: open failed: {e}"));
    t.check().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(t.cells_in_use(), t.len(), "{what}: cells in use");
    assert_eq!(t.recovery().overflow_set, 0, "{what}: a key was published before its probe path said so");
    let got: Content = t.entries().into_iter().collect();
    assert_whole_or_absent(&got, acked, in_flight, what);
}

/// The System path: batches in device buffers, copied to the host and back.
#[test]
fn system_through_the_gpu_matches_the_oracle() {
    let gpu = match gphash::Gpu::new() {
        Ok(g) => g,
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => panic!("CI=true and no GPU: {e}"),
        Err(e) => {
            eprintln!(
                "\n**********\nWARNING: no GPU ({e}): the cpu baseline's device path is NOT tested, only its host parts\n**********\n"
            );
            return;
        }
    };
    eprintln!("device path on {}", gpu.info.name);
    let seed = common::seed("system_through_the_gpu_matches_the_oracle");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    for (key_bytes, value_bytes) in [(8, 128), (32, 8)] {
        let path = dir.path().join(format!("sys-{key_bytes}.pool"));
        let mut system =
            CpuSystem::create(Some(&path), key_bytes, value_bytes, 5000, gpu.clone(), 4).unwrap();
        assert_eq!(system.name(), "cpu");
        assert!(system.setting().starts_with("4 host threads | pool "), "{}", system.setting());
        let mut oracle = Oracle::default();
        for b in 0..8 {
            let batch = common::random_batch(
                &mut rng,
                [1, 500, 2000, 33][b % 4],
                3000,
                key_bytes as usize,
                value_bytes as usize,
            );
            let got = run_host(&mut system, &gpu, &batch).unwrap();
            let want = oracle.run(&batch);
            assert_eq!(got, want, "seed {seed}, {key_bytes}-byte keys, batch {b}");
            assert_eq!(system.len(), oracle.map.len() as u64);
        }
        // A read-only batch: no values move back for other operations, reads still get theirs.
        let mut reads = Batch::new(key_bytes as usize, value_bytes as usize);
        for k in 0..200 {
            reads.get(&common::key(k, key_bytes as usize)).unwrap();
        }
        assert_eq!(run_host(&mut system, &gpu, &reads).unwrap(), oracle.run(&reads));
        assert!(
            run_host(&mut system, &gpu, &Batch::new(key_bytes as usize, value_bytes as usize))
                .unwrap()
                .is_empty()
        );
        let hit = system.traffic(OpKind::Get, true);
        assert!(hit.requests() >= 3.0 && hit.bytes == hit.requests() * 64.0, "{hit:?}");
        system.table().check().unwrap();
        assert_same_content(system.table().entries(), &oracle.map, "device path");
        system.close().unwrap();
        let reopened = CpuSystem::open(&path, gpu.clone(), 2).unwrap();
        assert_eq!(reopened.len(), oracle.map.len() as u64);
    }
}
