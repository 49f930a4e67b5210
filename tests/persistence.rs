//! Reopening pools (after a clean close and after a drop), recovery of unacknowledged claims,
//! and bad input: corrupted, truncated, foreign and locked pools, wrong key and value widths.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::oracle::{Oracle, assert_same_content};
use gphash::{Config, Error, GpHash, GpuOptions, Options, Placement, Status};
use host_pm::{HEADER_COPY_BYTES, PoolError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Automatic placement (zero-copy where the driver imports the pool: on lavapipe always, on
/// NVIDIA for tmpfs but not for disk files), staged, and the CPU model.
fn options() -> Vec<(&'static str, Options)> {
    let gpu = |placement| common::gpu_options(GpuOptions { placement, ..Default::default() });
    vec![("auto", gpu(Placement::Auto)), ("staged", gpu(Placement::Staged)), ("cpu", common::cpu_options())]
}

fn fill(t: &GpHash, oracle: &mut Oracle, rng: &mut StdRng, n: usize) {
    let mut batch = t.batch();
    for _ in 0..n {
        let k = common::key(rng.random_range(0..3000), 8);
        let v = common::value(rng, 8);
        match rng.random_range(0..10) {
            0..6 => batch.upsert(&k, &v).unwrap(),
            6..8 => batch.delete(&k).unwrap(),
            _ => batch.insert(&k, &v).unwrap(),
        }
    }
    oracle.run(&batch);
    t.execute_ordered(&batch).unwrap();
}

/// Every executor reopens what every other wrote, after a clean close and after a drop.
#[test]
fn pools_reopen_with_every_acknowledged_operation() {
    let seed = common::seed("pools_reopen_with_every_acknowledged_operation");
    let mut rng = StdRng::seed_from_u64(seed);
    for dir in [common::pool_dir(), common::disk_dir()] {
        let path = dir.path().join("p");
        let cfg = Config { capacity: 4000, ..Default::default() };
        let mut oracle = Oracle::default();
        let opts = options();
        let mut t = GpHash::create(Some(&path), &cfg, &opts[0].1).unwrap();
        for (i, (name, next)) in opts.iter().cycle().skip(1).take(6).enumerate() {
            fill(&t, &mut oracle, &mut rng, 700);
            let closed = i % 2 == 0;
            if closed {
                t.close().unwrap();
            } else {
                drop(t);
            }
            t = GpHash::open(&path, next).unwrap();
            let what = format!(
                "{} reopened by {name} after a {}",
                path.display(),
                if closed { "close" } else { "drop" }
            );
            let rec = &t.stats().recovery;
            assert_eq!(rec.clean_shutdown, closed, "{what}");
            assert_eq!(rec.restored, closed, "{what}: a clean close saves the allocator");
            assert_eq!(rec.cleared_claims, 0, "{what}");
            assert_eq!(t.len(), oracle.map.len() as u64, "{what}");
            assert_same_content(t.entries(), &oracle.map, &what);
            assert!(t.check().ok(), "{what}");
        }
        t.close().unwrap();
    }
}

/// A clean close saves the allocator and the key count; the next open starts from them
/// without a scan, and insertions after it take only free cells. Saved bytes that fail their
/// checksum are ignored (the first write scans the table for the allocator); a saved
/// allocator that disagrees with the table is a violation for `check`.
#[test]
fn a_clean_close_saves_the_allocator() {
    let seed = common::seed("a_clean_close_saves_the_allocator");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    let path = dir.path().join("p");
    for (name, opts) in options() {
        let _ = std::fs::remove_file(&path);
        let cfg = Config { capacity: 4000, ..Default::default() };
        let mut oracle = Oracle::default();
        let t = GpHash::create(Some(&path), &cfg, &opts).unwrap();
        fill(&t, &mut oracle, &mut rng, 2000);
        t.close().unwrap();
        let t = GpHash::open(&path, &opts).unwrap();
        let rec = t.stats().recovery;
        assert!(rec.restored && rec.clean_shutdown, "{name}: {rec}");
        assert_eq!(t.len(), oracle.map.len() as u64, "{name}");
        assert!(t.check().ok(), "{name}: {}", t.check());
        // New keys take cells: a restored allocator that lost a used cell would hand it out
        // and overwrite a value.
        fill(&t, &mut oracle, &mut rng, 2000);
        assert_same_content(t.entries(), &oracle.map, name);
        assert!(t.check().ok(), "{name}");
        t.close().unwrap();

        // Damaged saved bytes: the open scans, and check reports the damage.
        let saved = host_pm::Pool::open(&path).unwrap().header().closed.saved;
        // Its bits flipped: a fixed byte could be the one already there.
        let byte = std::fs::read(&path).unwrap()[saved.offset as usize];
        patch(&path, saved.offset, &[!byte]);
        // A session that only reads closes the pool as it found it: checksummed again, the
        // damaged bytes would be trusted at the next open.
        let t = GpHash::open(&path, &opts).unwrap();
        t.get(&common::key(1, 8)).unwrap();
        t.close().unwrap();
        let t = GpHash::open(&path, &opts).unwrap();
        // The open reads only the close record: the bytes are checked when they are read.
        assert!(t.stats().recovery.restored, "{name}");
        assert_eq!(t.len(), oracle.map.len() as u64, "{name}");
        let report = t.check();
        assert!(report.to_string().contains("do not match their checksum"), "{name}: {report}");
        // Damaged bytes trusted would free used cells, whose values new keys would overwrite.
        fill(&t, &mut oracle, &mut rng, 500);
        assert_same_content(t.entries(), &oracle.map, name);
        assert!(t.check().ok(), "{name}: {}", t.check());
        t.close().unwrap();

        // A saved allocator with a used cell marked free, checksummed anew: check finds it.
        let mut pool = host_pm::Pool::open(&path).unwrap();
        let closed = pool.header().closed;
        let bytes = pool.region_mut(closed.saved);
        let at = bytes.iter().position(|&b| b != 0 && b != 0xff).expect("a partly used word");
        bytes[at] &= bytes[at] - 1;
        pool.close_saving(Some((closed.saved, closed.items))).unwrap();
        let report = gphash::inspect(&path).unwrap().found;
        assert!(report.to_string().contains("1 cell(s) marked otherwise"), "{name}: {report}");
    }
}

/// The open after a clean close does not scan the table: a state word damaged since then
/// (a cell beyond the heap) makes reads of its key say CORRUPT, an upsert replaces it without
/// freeing any other cell, and `check` names it.
#[test]
fn damage_after_a_clean_close_is_contained() {
    let dir = common::pool_dir();
    let path = dir.path().join("p");
    for (name, opts) in options() {
        let _ = std::fs::remove_file(&path);
        let t = GpHash::create(Some(&path), &Config { capacity: 1000, ..Default::default() }, &opts).unwrap();
        let keys: Vec<u8> = (0..300).flat_map(|k| common::key(k, 8)).collect();
        t.insert(&keys, &keys).unwrap();
        t.close().unwrap();
        let (damaged, key) = {
            let pool = host_pm::Pool::open(&path).unwrap();
            let geo = GpHash::geometry_of(&pool).unwrap();
            let table: &[u32] = bytemuck::cast_slice(pool.region(pool.header().table_region));
            let (b, s) = (0..geo.buckets())
                .flat_map(|b| (0..geo.layout.slots).map(move |s| (b, s)))
                .find(|&(b, s)| table[geo.state_word(b, s) as usize] >= 2)
                .unwrap();
            let k = geo.key_word(b, s) as usize;
            let key: Vec<u8> = bytemuck::cast_slice(&table[k..k + 2]).to_vec();
            (pool.header().table_region.offset + geo.state_word(b, s) * 4, key)
        };
        patch(&path, damaged, &0xFFFF_FFF0u32.to_le_bytes());
        let t = GpHash::open(&path, &opts).unwrap();
        assert!(t.stats().recovery.restored, "{name}");
        assert!(t.check().to_string().contains("beyond the heap"), "{name}");
        assert_eq!(t.get(&key).unwrap().statuses[0], Status::Corrupt, "{name}");
        let listed = t.entries();
        assert!(listed.iter().all(|(k, _)| k != &key), "{name}: the damaged slot is not listed");
        assert_eq!(listed.len(), 299, "{name}");
        assert_eq!(t.upsert(&key, &[9; 8]).unwrap(), vec![Status::Ok], "{name}");
        assert_eq!(t.get(&key).unwrap().value(0), Some(&[9u8; 8][..]), "{name}");
        let others: Vec<u8> = keys.chunks(8).filter(|k| *k != &key[..]).flatten().copied().collect();
        let found = t.get(&others).unwrap();
        for (i, k) in others.chunks(8).enumerate() {
            assert_eq!(found.value(i), Some(k), "{name}: an untouched key keeps its value");
        }
        let report = t.check();
        assert!(report.ok(), "{name}: {report}");
        t.close().unwrap();
    }
}

/// A pool is marked dirty right before its first write, not at open: an index that only
/// reads, or fails before writing, leaves a cleanly closed pool clean.
#[test]
fn only_writes_mark_a_pool_dirty() {
    let dir = common::pool_dir();
    let path = dir.path().join("p");
    for (name, opts) in options() {
        let _ = std::fs::remove_file(&path);
        let t = GpHash::create(Some(&path), &Config { capacity: 1000, ..Default::default() }, &opts).unwrap();
        let keys: Vec<u8> = (0..100).flat_map(|k| common::key(k, 8)).collect();
        t.insert(&keys, &keys).unwrap();
        t.close().unwrap();
        let reopen = || GpHash::open(&path, &opts).unwrap();
        let clean = |t: &GpHash| t.stats().recovery.clean_shutdown;

        drop(reopen());
        let t = reopen();
        assert!(clean(&t), "{name}: an index opened and dropped wrote nothing");
        assert_eq!(t.get(&keys).unwrap().value(7), Some(&keys[56..64]));
        drop(t);
        let t = reopen();
        assert!(clean(&t), "{name}: reads do not mark the pool dirty");
        assert!(t.insert(&keys[..8], &[0; 9]).is_err(), "a refused batch writes nothing");
        drop(t);
        let t = reopen();
        assert!(clean(&t), "{name}: a refused batch does not mark the pool dirty");
        t.delete(&keys[..8]).unwrap();
        drop(t);
        let t = reopen();
        assert!(!clean(&t), "{name}: a write marks the pool dirty");
        assert_eq!(t.len(), 99);
        t.close().unwrap();
        let t = reopen();
        t.grow().unwrap();
        drop(t);
        assert!(!clean(&reopen()), "{name}: growing marks the pool dirty");
    }
}

/// Word offset (in the pool file) of the state word of the first slot of bucket 0.
fn first_state_offset(path: &Path) -> (u64, u32) {
    let pool = host_pm::Pool::open(path).unwrap();
    let geo = GpHash::geometry_of(&pool).unwrap();
    (pool.header().table_region.offset + geo.state_word(0, 0) * 4, geo.layout.slots)
}

fn patch(path: &Path, offset: u64, bytes: &[u8]) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(bytes).unwrap();
}

/// A claim left by a batch that was never acknowledged is cleared on open.
#[test]
fn recovery_clears_unacknowledged_claims() {
    let dir = common::pool_dir();
    let path = dir.path().join("p");
    let t =
        GpHash::create(Some(&path), &Config { capacity: 1000, ..Default::default() }, &common::cpu_options())
            .unwrap();
    let keys: Vec<u8> = (0..100).flat_map(|k| common::key(k, 8)).collect();
    t.insert(&keys, &keys).unwrap();
    let before: HashMap<_, _> = t.entries().into_iter().collect();
    drop(t);
    // Mark every empty slot of bucket 0 INSERTING, as a crash between the phases leaves it.
    let (at, slots) = first_state_offset(&path);
    let bytes = std::fs::read(&path).unwrap();
    let mut planted = 0;
    for s in 0..slots as u64 {
        let o = (at + 4 * s) as usize;
        if bytes[o..o + 4] == [0; 4] {
            patch(&path, o as u64, &1u32.to_le_bytes());
            planted += 1;
        }
    }
    assert!(planted > 0);
    let t = GpHash::open(&path, &common::gpu_options(GpuOptions::default())).unwrap();
    assert_eq!(t.stats().recovery.cleared_claims, planted);
    assert!(!t.stats().recovery.clean_shutdown);
    assert_same_content(t.entries(), &before, "after recovery");
    assert!(t.check().ok());
    t.close().unwrap();
    let t = GpHash::open(&path, &common::cpu_options()).unwrap();
    assert_eq!(t.stats().recovery.cleared_claims, 0, "the clearing was persisted");
}

fn expect_pool_error(path: &Path, what: &str, ok: impl Fn(&PoolError) -> bool) {
    match GpHash::open(path, &common::cpu_options()) {
        Err(Error::Pool(e)) if ok(&e) => eprintln!("{what}: {e}"),
        other => panic!("{what}: unexpected {other:?}"),
    }
}

/// Truncated, corrupted, foreign-version and locked pools get a clear error and are left as
/// they were.
#[test]
fn bad_pools_are_refused_without_damage() {
    let dir = common::pool_dir();
    let path = dir.path().join("p");
    let t =
        GpHash::create(Some(&path), &Config { capacity: 1000, ..Default::default() }, &common::cpu_options())
            .unwrap();
    // Locked while open.
    expect_pool_error(&path, "second open", |e| matches!(e, PoolError::Locked { .. }));
    t.close().unwrap();
    let good = std::fs::read(&path).unwrap();
    let restore = || std::fs::write(&path, &good).unwrap();

    std::fs::write(&path, &good[..good.len() / 2]).unwrap();
    expect_pool_error(&path, "truncated", |e| matches!(e, PoolError::Truncated { .. }));
    assert_eq!(std::fs::read(&path).unwrap(), good[..good.len() / 2], "a refused pool is not touched");

    restore();
    for copy in 0..2 {
        patch(&path, copy * HEADER_COPY_BYTES + 30, &[0x5A]);
    }
    expect_pool_error(&path, "flipped header bytes", |e| matches!(e, PoolError::Corrupt { .. }));

    restore();
    let mut h = host_pm::decode_header(&good[..HEADER_COPY_BYTES as usize], good.len() as u64).unwrap();
    h.version = 9;
    for copy in 0..2 {
        patch(&path, copy * HEADER_COPY_BYTES, &host_pm::encode_header(&h));
    }
    expect_pool_error(&path, "unknown version", |e| {
        matches!(e, PoolError::UnsupportedVersion { found: 9, .. })
    });

    // A slot referencing a cell beyond the heap: the scan after a crash refuses the pool.
    restore();
    let mut pool = host_pm::Pool::open(&path).unwrap();
    pool.mark_dirty().unwrap();
    drop(pool);
    let (at, _) = first_state_offset(&path);
    let damaged = 0xFFFF_FFF0u32.to_le_bytes();
    patch(&path, at, &damaged);
    expect_pool_error(&path, "slot referencing a cell beyond the heap", |e| {
        matches!(e, PoolError::Corrupt { .. })
    });

    std::fs::write(&path, b"not a pool at all").unwrap();
    expect_pool_error(&path, "not a pool", |e| {
        matches!(e, PoolError::Truncated { .. } | PoolError::NotAPool { .. })
    });
}

/// Keys and values of the wrong width are refused and the table is unchanged.
#[test]
fn wrong_widths_are_refused() {
    let dir = common::pool_dir();
    let cfg = Config { key_bytes: 16, value_bytes: 8, capacity: 500, ..Default::default() };
    let t = common::gpu_table(&dir, &cfg);
    let k = common::key(1, 16);
    assert_eq!(t.insert(&k, &[1; 8]).unwrap(), vec![Status::Ok]);
    assert!(matches!(t.get(&[0; 15]), Err(Error::KeysLength { given: 15, key_bytes: 16 })));
    assert!(matches!(
        t.insert(&common::key(2, 16), &[0; 9]),
        Err(Error::ValuesLength { given: 9, keys: 1, .. })
    ));
    assert!(matches!(t.upsert(&k, &[0; 4]), Err(Error::ValuesLength { given: 4, keys: 1, .. })));
    let foreign = gphash::Batch::new(8, 8);
    assert!(matches!(t.execute(&foreign), Err(Error::KeyWidth { found: 8, expected: 16 })));
    assert_eq!(t.get(&k).unwrap().value(0), Some(&[1u8; 8][..]));
    assert_eq!(t.len(), 1);
}

/// A corpus of randomly damaged pools (header and contents): opening, checking and using each
/// gives a result or a typed error, never a panic.
#[test]
fn damaged_pools_never_panic() {
    let seed = common::seed("damaged_pools_never_panic");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    let pristine = dir.path().join("pristine");
    let t = GpHash::create(
        Some(&pristine),
        &Config { capacity: 300, ..Default::default() },
        &common::cpu_options(),
    )
    .unwrap();
    let keys: Vec<u8> = (0..200).flat_map(|k| common::key(k, 8)).collect();
    t.insert(&keys, &keys).unwrap();
    t.close().unwrap();
    let good = std::fs::read(&pristine).unwrap();
    let (mut opened, mut refused) = (0, 0);
    for i in 0..400 {
        let mut bytes = good.clone();
        for _ in 0..rng.random_range(1..8) {
            let at = if rng.random_bool(0.5) {
                rng.random_range(0..8192)
            } else {
                rng.random_range(0..bytes.len())
            };
            bytes[at] ^= 1 << rng.random_range(0..8);
        }
        let path = dir.path().join("damaged");
        std::fs::write(&path, &bytes).unwrap();
        let options =
            if i % 10 == 0 { common::gpu_options(GpuOptions::default()) } else { common::cpu_options() };
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match GpHash::open(&path, &options) {
                Ok(t) => {
                    let _ = t.check().to_string();
                    let _ = t.get(&keys[..80]);
                    let _ = t.insert(&common::key(9999, 8), &[1; 8]);
                    true
                }
                Err(_) => false,
            }));
        match outcome {
            Ok(true) => opened += 1,
            Ok(false) => refused += 1,
            Err(_) => panic!("seed {seed}, damage {i}: a damaged pool made gphash panic"),
        }
    }
    eprintln!("{opened} damaged pools opened, {refused} refused");
    assert!(refused > 0, "header damage must be refused");
}
