//! Growth: tables grow by a level instead of failing, on the GPU (zero-copy and staged) and on
//! the CPU model, interrupted resizes resume on open, and a pool that cannot grow says so
//! without losing anything.

mod common;

use common::oracle::{Oracle, assert_same_content};
use gphash::{Config, Error, GpHash, GpuOptions, Layout, Options, Placement};
use host_pm::PoolError;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn random_batch(t: &GpHash, rng: &mut StdRng, space: u64, n: usize, value_bytes: usize) -> gphash::Batch {
    let mut batch = t.batch();
    for _ in 0..n {
        let k = common::key(rng.random_range(0..space), t.geometry().key_bytes as usize);
        let v = common::value(rng, value_bytes);
        match rng.random_range(0..10) {
            0..6 => batch.insert(&k, &v).unwrap(),
            6..8 => batch.upsert(&k, &v).unwrap(),
            8 => batch.delete(&k).unwrap(),
            _ => batch.get(&k).unwrap(),
        }
    }
    batch
}

/// From a table of a few hundred slots to tens of thousands of keys: every batch applies, the
/// content always equals the oracle's, and every invariant holds.
#[test]
fn tables_grow_instead_of_failing() {
    let seed = common::seed("tables_grow_instead_of_failing");
    let mut rng = StdRng::seed_from_u64(seed);
    let gpu = |placement| {
        common::gpu_options(GpuOptions {
            placement,
            tile: 32,
            max_window_bytes: Some(1 << 20),
            ..GpuOptions::default()
        })
    };
    // The last two keep keys apart from their buckets.
    let cases: [(&str, &str, Options, bool); 6] = [
        ("2L-2H-8S", "gpu zero-copy", gpu(Placement::ZeroCopy), false),
        // Three hash locations do not split the top level: each hashes into all of it.
        ("4L-3H-4S", "gpu staged", gpu(Placement::Staged), false),
        ("1L-2H-8S", "gpu zero-copy", gpu(Placement::ZeroCopy), false),
        ("3L-2H-8S", "cpu", common::cpu_options(), false),
        ("2L-2H-8S", "gpu zero-copy, keys apart", gpu(Placement::ZeroCopy), true),
        ("3L-2H-4S", "cpu, keys apart", common::cpu_options(), true),
    ];
    for (layout, name, options, keys_apart) in cases {
        let dir = common::pool_dir();
        let cfg = Config {
            layout: layout.parse::<Layout>().unwrap(),
            capacity: 100,
            value_bytes: 12,
            keys_apart,
            ..Default::default()
        };
        let t = common::table(&dir, "p", &cfg, &options);
        let first_slots = t.geometry().slots();
        let mut oracle = Oracle::default();
        for round in 0..8 {
            let batch = random_batch(&t, &mut rng, 40_000, 2500, 12);
            let want = oracle.run(&batch);
            let got =
                t.execute_ordered(&batch).unwrap_or_else(|e| panic!("{layout} {name} round {round}: {e}"));
            for (i, (status, value)) in want.iter().enumerate() {
                assert_eq!(
                    (got.statuses[i], got.value(i)),
                    (*status, value.as_deref()),
                    "{layout} {name} op {i}"
                );
            }
            assert_same_content(t.entries(), &oracle.map, &format!("{layout} {name} round {round}"));
            assert!(t.check().ok(), "{layout} {name} round {round}: {}", t.check());
            assert_eq!(t.cells_used().unwrap(), t.len());
        }
        let s = t.stats();
        assert!(s.activity.resizes >= 3, "{layout} {name}: {} resizes", s.activity.resizes);
        assert_eq!(
            s.slots,
            first_slots << s.activity.resizes,
            "{layout} {name}: each resize doubles the slots"
        );
        assert!(s.levels.0 > s.levels.1 || layout.starts_with("1L"));
        eprintln!("{layout} {name}: {} resizes, load factor {:.3}", s.activity.resizes, s.load_factor);
        t.close().unwrap();
        // The grown table reopens as it was.
        let t = GpHash::open(&dir.path().join("p"), &common::cpu_options()).unwrap();
        assert_same_content(t.entries(), &oracle.map, &format!("{layout} {name} reopened"));
        assert_eq!(t.geometry().keys_apart, keys_apart, "{layout} {name}: key placement survives reopening");
        let two = t.geometry().layout.hashes == 2;
        assert_eq!(t.geometry().locations_apart, two, "{layout} {name}: location placement survives growth");
    }
}

/// In place, a growth imports only the grown table and heap (the build reads the old table
/// through the old engine's imports, and the grown engine takes the build's over), and a heap's
/// growth only the new heap (its engine takes the table's over); the content stays the oracle's.
#[test]
fn growth_in_place_imports_only_the_new_regions() {
    let Some(g) = common::gpu() else {
        eprintln!("NOT RUN: no GPU");
        return;
    };
    let dir = common::pool_dir();
    // A device of its own, whose count no other test's imports add to.
    let options = Options {
        device: Some(std::sync::Arc::new(g.alike(g.info.clone(), g.wait_spin))),
        ..common::gpu_options(GpuOptions { placement: Placement::ZeroCopy, ..GpuOptions::default() })
    };
    let cfg = Config { capacity: 20_000, value_bytes: 8, ..Default::default() };
    let t = common::table(&dir, "p", &cfg, &options);
    let counts = |t: &GpHash| {
        let a = t.activity();
        (a.resizes, a.heap_growths, a.region_imports)
    };
    let (mut resizes, mut heap_growths, mut imports) = counts(&t);
    assert_eq!((resizes, heap_growths, imports), (0, 0, 2), "the engine imports the table and the heap");
    let mut oracle = Oracle::default();
    for k in 0..40u64 {
        let mut batch = t.batch();
        for i in 0..2000 {
            let key = k * 2000 + i;
            batch.insert(&common::key(key, 8), &key.to_le_bytes()).unwrap();
        }
        oracle.run(&batch);
        t.execute(&batch).unwrap();
        let (r, h, i) = counts(&t);
        assert_eq!(
            i - imports,
            2 * (r - resizes) + (h - heap_growths),
            "batch {k}: {r} resizes, {h} heap growths"
        );
        (resizes, heap_growths, imports) = (r, h, i);
    }
    assert!(resizes >= 1 && heap_growths >= 1, "{resizes} resizes, {heap_growths} heap growths");
    assert_same_content(t.entries(), &oracle.map, "after the growths");
    assert!(t.check().ok(), "{}", t.check());
}

/// A pool that cannot grow (a size limit, as a devdax device has) refuses the batch that needs
/// growth with OutOfSpace; nothing is lost and the table keeps serving.
#[test]
fn a_pool_that_cannot_grow_loses_nothing() {
    let dir = common::pool_dir();
    for (name, options) in
        [("gpu", common::gpu_options(GpuOptions::default())), ("cpu", common::cpu_options())]
    {
        let path = dir.path().join(name);
        let cfg = Config { capacity: 200, ..Default::default() };
        let size = GpHash::create(Some(&path), &cfg, &common::cpu_options()).unwrap().stats().pool_bytes;
        std::fs::remove_file(&path).unwrap();
        let cfg = Config { max_bytes: Some(size), ..cfg };
        let t = common::table(&dir, name, &cfg, &options);
        let mut oracle = Oracle::default();
        let mut refused = 0;
        for k in 0..40u64 {
            let mut batch = t.batch();
            for i in 0..50 {
                batch.insert(&common::key(k * 50 + i, 8), &(k * 50 + i).to_le_bytes()).unwrap();
            }
            match t.execute(&batch) {
                Ok(_) => {
                    oracle.run(&batch);
                }
                Err(Error::Pool(PoolError::OutOfSpace { limit, .. })) => {
                    assert_eq!(limit, size);
                    refused += 1;
                }
                Err(e) => panic!("{name}: {e}"),
            }
            assert_same_content(t.entries(), &oracle.map, name);
        }
        assert!(refused > 0, "{name}: the table never needed to grow");
        assert_eq!(t.stats().pool_bytes, size, "{name}: the pool stayed within its limit");
        assert!(t.check().ok());
        // Still usable: reads, deletes, and inserts that fit.
        let some = common::key(0, 8);
        assert_eq!(t.get(&some).unwrap().value(0), Some(&0u64.to_le_bytes()[..]));
        assert_eq!(t.delete(&some).unwrap(), vec![gphash::Status::Ok]);
        assert_eq!(t.insert(&some, &[1; 8]).unwrap(), vec![gphash::Status::Ok]);
    }
}

/// A crash between recording a resize and switching to the grown table (here: before the
/// build, and halfway through it) leaves the old table in charge; open completes the resize.
#[test]
fn an_interrupted_resize_completes_on_open() {
    let dir = common::pool_dir();
    for (half_built, options) in
        [(false, common::gpu_options(GpuOptions::default())), (true, common::cpu_options())]
    {
        let path = dir.path().join(format!("p{half_built}"));
        let cfg = Config { capacity: 500, ..Default::default() };
        let t = GpHash::create(Some(&path), &cfg, &options).unwrap();
        let keys: Vec<u8> = (0..300).flat_map(|k| common::key(k, 8)).collect();
        t.insert(&keys, &keys).unwrap();
        let before: std::collections::HashMap<_, _> = t.entries().into_iter().collect();
        let top = t.geometry().top_level;
        t.close().unwrap();

        common::interrupt_growth(&path, half_built);

        let t = GpHash::open(&path, &options).unwrap();
        let s = t.stats();
        assert_eq!(s.recovery.resumed_resize, Some(true), "{}", s.recovery);
        assert_eq!(t.geometry().top_level, top + 1);
        assert_same_content(t.entries(), &before, "after the resumed resize");
        assert!(t.check().ok());
        assert_eq!(t.with_pool(|pool| pool.header().resize.state), 0);
    }
}

/// Layouts with fewer than 8 candidate slots per key are refused at create, with the minimum
/// named; nothing is created.
#[test]
fn layouts_that_collide_at_once_are_refused() {
    let dir = common::pool_dir();
    for layout in [Layout { levels: 1, hashes: 1, slots: 1 }, Layout { levels: 1, hashes: 1, slots: 4 }] {
        let path = dir.path().join(layout.to_string());
        let cfg = Config { layout, ..Default::default() };
        match GpHash::create(Some(&path), &cfg, &common::cpu_options()) {
            Err(Error::InvalidConfig(why)) => assert!(why.contains("at least 8"), "{layout}: {why}"),
            other => panic!("{layout}: expected InvalidConfig, got {other:?}"),
        }
        assert!(!path.exists(), "{layout}: a pool was created");
    }
}

/// A layout whose keys collide while the table is mostly empty (one bucket of 8 slots per key)
/// does not grow again and again: the insertion that finds no slot at a low load factor fails
/// with TableFull saying so, the batch is rolled back, and the table neither grew nor changed.
#[test]
fn early_collisions_fail_instead_of_growing() {
    let dir = common::pool_dir();
    let cfg = Config { layout: "1L-1H-8S".parse().unwrap(), capacity: 6000, ..Default::default() };
    let t = common::table(&dir, "p", &cfg, &common::cpu_options());
    let (slots, pool_bytes) = (t.geometry().slots(), t.stats().pool_bytes);
    let mut oracle = Oracle::default();
    let mut failure = None;
    for b in 0..slots / 64 {
        let mut batch = t.batch();
        for i in 0..64 {
            let k = b * 64 + i;
            batch.insert(&common::key(k, 8), &k.to_le_bytes()).unwrap();
        }
        match t.execute(&batch) {
            Ok(_) => {
                oracle.run(&batch);
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let e = failure.expect("a table of 8-slot buckets filled without a collision");
    eprintln!("{e}");
    match &e {
        Error::TableFull { load, early: true, .. } => assert!(*load < 0.5, "{e}"),
        other => panic!("expected TableFull at a low load factor, got {other:?}"),
    }
    assert!(e.to_string().contains("collides too early"), "{e}");
    let s = t.stats();
    assert_eq!((s.activity.resizes, s.slots, t.stats().pool_bytes), (0, slots, pool_bytes), "the table grew");
    assert_eq!(s.activity.rolled_back, 1);
    assert_same_content(t.entries(), &oracle.map, "after the refused batch");
    assert!(t.check().ok(), "{}", t.check());
    // Still usable.
    let k = common::key(slots, 8);
    assert_eq!(t.delete(&common::key(0, 8)).unwrap(), vec![gphash::Status::Ok]);
    assert_eq!(t.get(&k).unwrap().statuses, vec![gphash::Status::NotFound]);
}

/// Inserts keys `from..to` in batches of 5,000, into `t` and `oracle`.
fn insert(t: &GpHash, oracle: &mut Oracle, from: u64, to: u64) {
    for start in (from..to).step_by(5000) {
        let mut batch = t.batch();
        for k in start..(start + 5000).min(to) {
            batch.insert(&common::key(k, 8), &(k * 3).to_le_bytes()).unwrap();
        }
        oracle.run(&batch);
        t.execute(&batch).unwrap();
    }
}

/// A table holds about as many value cells as the keys it was made for (at most 10% unused at
/// that load); insertions beyond them, while the table has slots, grow the heap and not the
/// table, on every executor, and the grown heap reopens after a close and after a crash.
#[test]
fn the_heap_grows_before_the_table() {
    let dir = common::pool_dir();
    let gpu = |placement| common::gpu_options(GpuOptions { placement, ..GpuOptions::default() });
    for (name, options) in [
        ("gpu zero-copy", gpu(Placement::ZeroCopy)),
        ("gpu staged", gpu(Placement::Staged)),
        ("cpu", common::cpu_options()),
    ] {
        let path = dir.path().join(name.replace(' ', "-"));
        let capacity = 100_000u64;
        let t = GpHash::create(Some(&path), &Config { capacity, ..Default::default() }, &options).unwrap();
        let mut oracle = Oracle::default();
        insert(&t, &mut oracle, 0, capacity);
        let s = t.stats();
        let unused = 1.0 - s.items as f64 / s.cells as f64;
        assert!(unused <= 0.10, "{name}: {:.3} of {} cells unused at the target load", unused, s.cells);
        assert_eq!(s.activity.heap_growths, 0, "{name}");
        // Beyond it, up to a load the table holds without growing.
        let slots = s.slots;
        insert(&t, &mut oracle, capacity, (slots as f64 * 0.8) as u64);
        let s = t.stats();
        assert!(s.activity.heap_growths > 0, "{name}: the heap never grew");
        assert_eq!((s.activity.resizes, s.slots), (0, slots), "{name}: the table did not grow");
        assert!(s.cells > s.items, "{name}");
        assert_same_content(t.entries(), &oracle.map, name);
        assert!(t.check().ok(), "{name}: {}", t.check());
        t.close().unwrap();
        let t = GpHash::open(&path, &options).unwrap();
        assert!(t.stats().recovery.restored, "{name}");
        insert(&t, &mut oracle, 200_000, 201_000);
        drop(t);
        let t = GpHash::open(&path, &common::cpu_options()).unwrap();
        assert_same_content(t.entries(), &oracle.map, &format!("{name} reopened after a crash"));
        assert!(t.check().ok(), "{name}");
    }
}

/// Without growth, a heap out of cells refuses the batch with `HeapFull`, and nothing is lost.
#[test]
fn without_growth_a_full_heap_refuses_the_batch() {
    let dir = common::pool_dir();
    for (name, options) in
        [("gpu", common::gpu_options(GpuOptions::default())), ("cpu", common::cpu_options())]
    {
        let options = Options { grow: false, ..options };
        let t = common::table(&dir, name, &Config { capacity: 20_000, ..Default::default() }, &options);
        let mut oracle = Oracle::default();
        let mut refused = 0;
        for start in (0..30_000u64).step_by(1000) {
            let mut batch = t.batch();
            for k in start..start + 1000 {
                batch.insert(&common::key(k, 8), &k.to_le_bytes()).unwrap();
            }
            match t.execute(&batch) {
                Ok(_) => {
                    oracle.run(&batch);
                }
                Err(Error::HeapFull { .. }) => refused += 1,
                Err(e) => panic!("{name}: {e}"),
            }
        }
        assert!(refused > 0, "{name}: the heap never ran out");
        assert_same_content(t.entries(), &oracle.map, name);
        assert!(t.check().ok(), "{name}");
    }
}

/// Past the load a table is made for, its pool's file gets the next level's storage before the
/// table grows (on tmpfs); the growth that follows, after a reopen, loses nothing.
#[test]
fn the_next_growth_is_prepared_past_the_load_a_table_is_made_for() {
    let dir = common::pool_dir();
    let path = dir.path().join("p");
    let options = common::gpu_options(GpuOptions::default());
    let t =
        GpHash::create(Some(&path), &Config { capacity: 20_000, ..Default::default() }, &options).unwrap();
    // Growth is prepared on tmpfs only: the test needs it.
    assert_eq!(t.stats().backend, gphash::Backend::Tmpfs, "{} is not on tmpfs", path.display());
    let (slots, level) = (t.geometry().slots(), t.geometry().top_level);
    let grown_table = t.geometry().grown().unwrap().table_bytes();
    let mut want = std::collections::HashMap::new();
    let mut next = 0u64;
    let mut insert = |t: &GpHash, n: u64| {
        let keys: Vec<u8> = (next..next + n).flat_map(|k| common::key(k, 8)).collect();
        assert!(t.insert(&keys, &keys).unwrap().iter().all(|&s| s == gphash::Status::Ok));
        want.extend(keys.chunks(8).map(|k| (k.to_vec(), k.to_vec())));
        next += n;
    };
    while (t.len() + 500) as f64 <= 0.75 * slots as f64 {
        insert(&t, 500);
    }
    let before = std::fs::metadata(&path).unwrap().len();
    insert(&t, (0.02 * slots as f64) as u64);
    assert_eq!(t.geometry().top_level, level, "the table has not grown yet");
    // Closing waits for the preparation.
    t.close().unwrap();
    let after = std::fs::metadata(&path).unwrap().len();
    assert!(
        after >= before + grown_table,
        "{before} -> {after} bytes: the next table ({grown_table}) was not prepared"
    );
    let t = GpHash::open(&path, &options).unwrap();
    while t.geometry().top_level == level {
        insert(&t, 500);
    }
    assert_same_content(t.entries(), &want, "after the prepared growth");
    assert!(t.check().ok(), "{}", t.check());
    t.close().unwrap();
}
