//! Batches in flight (`GpHash::pipeline`, `GpHash::device_pipeline`): results equal those of
//! the same batches run one call at a time, on the GPU and on the CPU executor, through growth;
//! a failed persist while a later batch runs acknowledges nothing of either.

mod common;
// Only the tests of device batches build it: it needs wgpu, which not every includer of
// `common` links.
#[path = "common/device.rs"]
mod device_buffers;

use device_buffers::{Buffers, download};

use std::sync::Arc;
use std::time::Duration;

use gphash::{Batch, Config, Error, GpHash, GpuOptions, OpKind, Options, Placement, PoolError, Status};
use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};

const KB: usize = 8;
const VB: usize = 16;

/// The batches of a run: reads-only ones (with repeated keys), inserts of fresh keys enough to
/// make a small table grow, then updates and reads of those keys (each depends on the batch
/// before it, which is still in flight), mixed ones with deletes, and an empty one. A batch
/// that changes a key holds it once: `execute` applies the operations on one key in an order
/// it does not promise.
fn batches(rng: &mut StdRng) -> Vec<Batch> {
    let mut out = vec![];
    let mut fresh = 10_000u64;
    for round in 0..24 {
        let n = rng.random_range(1..400);
        let b = match round % 4 {
            0 => {
                let mut b = Batch::new(KB, VB);
                for _ in 0..n {
                    b.get(&common::key(rng.random_range(0..600), KB)).unwrap();
                }
                b
            }
            1 => {
                let mut b = Batch::new(KB, VB);
                for _ in 0..n {
                    b.insert(&common::key(fresh, KB), &common::value(rng, VB)).unwrap();
                    fresh += 1;
                }
                b
            }
            2 => {
                // The keys the batch before inserted, and a few it did not.
                let mut b = Batch::new(KB, VB);
                for k in fresh - n as u64..fresh + 20 {
                    let key = common::key(k, KB);
                    if rng.random_bool(0.5) { b.update(&key, &common::value(rng, VB)) } else { b.get(&key) }
                        .unwrap();
                }
                b
            }
            _ => {
                let mut b = Batch::new(KB, VB);
                for k in sample(rng, 600, n) {
                    let (key, v) = (common::key(k as u64, KB), common::value(rng, VB));
                    match common::random_kind(rng) {
                        OpKind::Get => b.get(&key),
                        OpKind::Insert => b.insert(&key, &v),
                        OpKind::Upsert => b.upsert(&key, &v),
                        OpKind::Update => b.update(&key, &v),
                        OpKind::Delete => b.delete(&key),
                    }
                    .unwrap();
                }
                b
            }
        };
        out.push(b);
        if round == 9 {
            out.push(Batch::new(KB, VB));
        }
    }
    out
}

/// Runs `batches` through a pipeline of a table made with `options`, taking results at random
/// moments, and compares each with the same batch run by `execute` on a CPU table.
fn matches_one_at_a_time(options: &Options, what: &str) {
    let mut rng = StdRng::seed_from_u64(common::seed(what));
    let dir = common::pool_dir();
    let config = Config { key_bytes: KB as u32, value_bytes: VB as u32, capacity: 256, ..Config::default() };
    let piped = common::table(&dir, "piped", &config, options);
    let reference = common::table(&dir, "reference", &config, &common::cpu_options());
    let batches = batches(&mut rng);
    let mut taken = vec![];
    {
        let mut p = piped.pipeline();
        for b in &batches {
            p.submit(b.clone()).unwrap();
            while p.pending() > 0 && rng.random_bool(0.3) {
                taken.push(p.next().unwrap().unwrap());
            }
        }
        taken.extend(p.by_ref().map(Result::unwrap));
        assert_eq!(p.pending(), 0);
    }
    assert_eq!(taken.len(), batches.len());
    for (i, (b, got)) in batches.iter().zip(&taken).enumerate() {
        let want = reference.execute(b).unwrap();
        assert_eq!(got.statuses, want.statuses, "{what}: statuses of batch {i}");
        for op in 0..b.len() {
            assert_eq!(got.value(op), want.value(op), "{what}: value of op {op} of batch {i}");
        }
    }
    assert!(piped.stats().activity.resizes > 0, "{what}: the table should have grown");
    same_tables(&piped, &reference, what);
}

/// `piped` holds what `reference` holds, passes its check, and leaks no cell: every cell a
/// batch replaced or did not use went back to the allocator.
fn same_tables(piped: &GpHash, reference: &GpHash, what: &str) {
    let (mut a, mut b) = (piped.entries(), reference.entries());
    a.sort();
    b.sort();
    assert_eq!(a, b, "{what}: the tables differ");
    assert!(piped.check().ok(), "{what}: {}", piped.check());
    assert_eq!(piped.cells_used().unwrap(), piped.len(), "{what}: cells leaked");
}

/// A pipeline runs out of cells no sooner than one call at a time (here without growth, which
/// would hide it): a batch's freed cells are back before the next batch allocates.
fn cells_as_one_at_a_time(options: Options, what: &str) {
    let dir = common::pool_dir();
    let options = Options { grow: false, ..options };
    let config = Config { capacity: 2400, value_bytes: 12, ..Default::default() };
    let t = common::table(&dir, "p", &config, &options);
    let stats = t.stats();
    let keys: Vec<Vec<u8>> = (0..1600).map(|k| common::key(k, 8)).collect();
    let n = keys.len() as u64;
    assert!(stats.cells >= 2 * n && stats.cells < 3 * n, "{what}: the heap holds 2 batches' values, not 3");
    let all = |v: u8| {
        let mut b = t.batch();
        for k in &keys {
            b.upsert(k, &[v; 12]).unwrap();
        }
        b
    };
    for v in 0..3 {
        t.execute(&all(v)).unwrap();
    }
    let mut p = t.pipeline();
    for v in 3..6 {
        p.submit(all(v)).unwrap();
    }
    for (i, r) in p.by_ref().enumerate() {
        assert!(r.is_ok_and(|r| r.statuses.iter().all(|&s| s == Status::Ok)), "{what}: pipelined batch {i}");
    }
    drop(p);
    assert_eq!(t.get(&keys[7]).unwrap().value(0), Some(&[5; 12][..]), "{what}");
}

#[test]
fn a_pipeline_runs_out_of_cells_no_sooner_than_one_call_at_a_time() {
    cells_as_one_at_a_time(common::gpu_options(Default::default()), "gpu");
    cells_as_one_at_a_time(common::cpu_options(), "cpu");
}

#[test]
fn pipelined_batches_match_one_at_a_time_on_the_gpu() {
    matches_one_at_a_time(&common::gpu_options(Default::default()), "gpu");
}

/// Waits that poll the device until the work ends (a GPU's default) and waits that poll once
/// (before most batches' work ends) and then sleep in the driver read what waits that only
/// sleep read (a CPU device's default, the test above on lavapipe).
#[test]
fn pipelined_batches_match_one_at_a_time_whether_waits_poll_or_sleep() {
    let Some(g) = common::gpu() else {
        panic!("the waits for a GPU need one");
    };
    for (wait_spin, what) in
        [(Duration::from_secs(10), "polling"), (Duration::from_nanos(1), "polling, then sleeping")]
    {
        let gpu = Arc::new(g.alike(g.info.clone(), wait_spin));
        let options = Options { device: Some(gpu), ..common::gpu_options(Default::default()) };
        matches_one_at_a_time(&options, what);
    }
}

#[test]
fn pipelined_batches_match_one_at_a_time_on_the_cpu() {
    matches_one_at_a_time(&common::cpu_options(), "cpu");
}

/// Which pipeline a test drives: `GpHash::pipeline` with host batches, or
/// `GpHash::device_pipeline` with the same batches in device buffers.
#[derive(Clone, Copy)]
enum Through {
    Host,
    Device,
}

/// A write batch, then a second one submitted behind it (encoded while the first one runs);
/// the persist of the first one's phase B fails. Neither is acknowledged: the first fails, the
/// second is refused before anything of it runs, the index is poisoned, and after a reopen
/// every acknowledged key holds its acknowledged value or the failed batch's (it was not
/// acknowledged, so either may be found), never the second batch's.
fn failed_persist(options: &Options, through: Through, what: &str) {
    let dir = common::pool_dir();
    let path = dir.path().join("p");
    let config = Config { key_bytes: KB as u32, value_bytes: VB as u32, capacity: 4096, ..Config::default() };
    let t = GpHash::create(Some(&path), &config, options).unwrap();
    let keys: Vec<u8> = (0..1000).flat_map(|k| common::key(k, KB)).collect();
    let old = |k: u64| [k.to_le_bytes(), [1; 8]].concat();
    let new = |k: u64| [k.to_le_bytes(), [2; 8]].concat();
    let values: Vec<u8> = (0..1000).flat_map(old).collect();
    assert!(t.insert(&keys, &values).unwrap().iter().all(|&s| s == Status::Ok));
    let mut updates = Batch::new(KB, VB);
    for k in 0..500 {
        updates.update(&common::key(k, KB), &new(k)).unwrap();
    }
    let mut inserts = Batch::new(KB, VB);
    for k in 1000..1500 {
        inserts.insert(&common::key(k, KB), &new(k)).unwrap();
    }
    // A key already there: phase A writes its status (`Exists`), which a refused batch must
    // leave unwritten; fresh inserts get theirs only in phase B.
    inserts.insert(&common::key(0, KB), &new(0)).unwrap();
    // The first persist (phase A of the updates) succeeds, the next ones fail.
    t.with_pool(|pool| pool.fail_persists(Some(1)));
    let injected = |r: &Result<(), Error>| {
        matches!(r, Err(Error::Pool(PoolError::Io { op: "persist (injected fault)", .. })))
    };
    match through {
        Through::Host => {
            let mut p = t.pipeline();
            p.submit(updates).unwrap();
            let second = p.submit(inserts);
            assert!(matches!(second, Err(Error::Poisoned(_))), "{what}: {second:?}");
            let first = p.next().unwrap().map(drop);
            assert!(injected(&first), "{what}: {first:?}");
            assert!(p.next().is_none());
        }
        Through::Device => {
            let gpu = common::gpu().expect("device batches need a GPU");
            let (updates, inserts) =
                (Buffers::new(&gpu, &updates, false), Buffers::new(&gpu, &inserts, false));
            {
                let mut p = t.device_pipeline();
                p.submit(updates.batch()).unwrap();
                let second = p.submit(inserts.batch());
                assert!(matches!(second, Err(Error::Poisoned(_))), "{what}: {second:?}");
                let first = p.next().unwrap().map(drop);
                assert!(injected(&first), "{what}: {first:?}");
                assert!(p.next().is_none());
            }
            let statuses = download(&gpu, &inserts.buffers[3]);
            assert!(statuses.iter().all(|&s| s == u32::MAX), "{what}: the refused batch did not run");
        }
    }
    let stats = t.stats();
    assert!(stats.poisoned.as_deref().is_some_and(|why| why.contains("injected")), "{what}: {stats}");
    assert!(matches!(t.get(&keys[..KB]), Err(Error::Poisoned(_))));
    t.with_pool(|pool| pool.fail_persists(None));
    t.close().unwrap();

    let t = GpHash::open(&path, options).unwrap();
    assert!(t.check().ok(), "{what}: {}", t.check());
    assert_eq!(t.len(), 1000, "{what}: only the acknowledged keys");
    let found = t.get(&keys).unwrap();
    for k in 0..1000u64 {
        let v = found.value(k as usize).unwrap_or_else(|| panic!("{what}: key {k} lost"));
        assert!(v == old(k) || (k < 500 && v == new(k)), "{what}: key {k} holds {v:?}");
    }
    let fresh: Vec<u8> = (1000..1500).flat_map(|k| common::key(k, KB)).collect();
    assert!(t.get(&fresh).unwrap().statuses.iter().all(|&s| s == Status::NotFound), "{what}");
}

#[test]
fn a_failed_persist_acknowledges_nothing_of_its_batch_nor_of_the_next_on_the_gpu() {
    failed_persist(&common::gpu_options(Default::default()), Through::Host, "gpu");
}

#[test]
fn a_failed_persist_acknowledges_nothing_of_its_batch_nor_of_the_next_on_the_cpu() {
    failed_persist(&common::cpu_options(), Through::Host, "cpu");
}

#[test]
fn a_failed_persist_acknowledges_nothing_of_its_device_batch_nor_of_the_next() {
    failed_persist(&common::gpu_options(Default::default()), Through::Device, "device");
}

/// Runs `batches` through a device pipeline of a table placed by `placement` (reads-only
/// batches declared so, one of them holding an insert, which is refused while the batches
/// around it go on), taking outcomes at random moments, and compares each batch's statuses and
/// found values with the same batch run by `execute` on a CPU table.
fn device_matches_one_at_a_time(placement: Placement, what: &str) {
    let Some(gpu) = common::gpu() else {
        panic!("device batches need a GPU");
    };
    let mut rng = StdRng::seed_from_u64(common::seed(what));
    let dir = common::pool_dir();
    // A volatile table cannot grow: it gets room for every key.
    let volatile = placement == Placement::Volatile;
    let capacity = if volatile { 20_000 } else { 256 };
    let config = Config { key_bytes: KB as u32, value_bytes: VB as u32, capacity, ..Config::default() };
    let options = common::gpu_options(GpuOptions { placement, ..Default::default() });
    let path = (!volatile).then(|| dir.path().join("piped"));
    let piped = GpHash::create(path.as_deref(), &config, &options).unwrap();
    let reference = common::table(&dir, "reference", &config, &common::cpu_options());
    let mut batches = batches(&mut rng);
    // A reads-only batch with an insert among its gets: refused (`NotReadsOnly`), nothing of it
    // written; its gets ran.
    let refused = batches.len();
    let mut bad = Batch::new(KB, VB);
    bad.get(&common::key(3, KB)).unwrap();
    bad.insert(&common::key(1 << 40, KB), &[9; VB]).unwrap();
    batches.push(bad);
    batches.rotate_right(3);
    let refused = (refused + 3) % batches.len();
    let reads_only = |b: &Batch| (0..b.len()).all(|i| b.op(i).0 == OpKind::Get);
    let buffers: Vec<Buffers> = batches
        .iter()
        .enumerate()
        .map(|(i, b)| Buffers::new(&gpu, b, i == refused || reads_only(b)))
        .collect();
    let mut outcomes = vec![];
    {
        let mut p = piped.device_pipeline();
        for b in &buffers {
            p.submit(b.batch()).unwrap();
            while p.pending() > 0 && rng.random_bool(0.3) {
                outcomes.push(p.next().unwrap());
            }
        }
        outcomes.extend(p.by_ref());
        assert_eq!(p.pending(), 0);
    }
    assert_eq!(outcomes.len(), batches.len());
    for (i, ((b, d), outcome)) in batches.iter().zip(&buffers).zip(outcomes).enumerate() {
        let statuses = download(&gpu, &d.buffers[3]);
        let found = download(&gpu, &d.buffers[4]);
        if i == refused {
            assert!(matches!(outcome, Err(Error::NotReadsOnly { count: 1 })), "{what}: {outcome:?}");
            assert_eq!(statuses[1], u32::MAX, "{what}: the refused insert did not run");
            let want = reference.get(&common::key(3, KB)).unwrap();
            assert_eq!(statuses[0], want.statuses[0] as u32, "{what}: the refused batch's get");
            continue;
        }
        outcome.unwrap_or_else(|e| panic!("{what}: batch {i}: {e}"));
        let want = reference.execute(b).unwrap();
        for op in 0..b.len() {
            assert_eq!(statuses[op], want.statuses[op] as u32, "{what}: status of op {op} of batch {i}");
            if let Some(v) = want.value(op) {
                let got: &[u8] = bytemuck::cast_slice(&found[op * VB / 4..(op + 1) * VB / 4]);
                assert_eq!(got, v, "{what}: value of op {op} of batch {i}");
            }
        }
    }
    assert!(volatile || piped.stats().activity.resizes > 0, "{what}: the table should have grown");
    assert_eq!(piped.len(), reference.len(), "{what}: keys");
    if !volatile {
        // A volatile table's pool goes stale: its keys are compared through the gets above.
        same_tables(&piped, &reference, what);
    }
}

#[test]
fn pipelined_device_batches_match_one_at_a_time() {
    device_matches_one_at_a_time(Placement::Auto, "device, in the pool");
    device_matches_one_at_a_time(Placement::Volatile, "device, volatile");
}

/// Bad input to a pipeline is refused before anything of it runs, and the batches around it
/// go on.
#[test]
fn a_pipeline_refuses_bad_batches_and_goes_on() {
    let dir = common::pool_dir();
    let config = Config { key_bytes: KB as u32, value_bytes: VB as u32, capacity: 1024, ..Config::default() };
    let t = common::table(&dir, "p", &config, &common::gpu_options(Default::default()));
    let mut p = t.pipeline();
    let mut good = Batch::new(KB, VB);
    good.insert(&common::key(1, KB), &[7; VB]).unwrap();
    p.submit(good).unwrap();
    assert!(matches!(p.submit(Batch::new(4, VB)), Err(Error::KeyWidth { found: 4, expected: 8 })));
    assert!(matches!(p.submit(Batch::new(KB, 8)), Err(Error::ValueSize { found: 8, expected: 16 })));
    let mut read = Batch::new(KB, VB);
    read.get(&common::key(1, KB)).unwrap();
    p.submit(read).unwrap();
    assert_eq!(p.pending(), 2);
    assert_eq!(p.next().unwrap().unwrap().statuses, vec![Status::Ok]);
    assert_eq!(p.next().unwrap().unwrap().value(0), Some(&[7; VB][..]));
    assert!(p.next().is_none());
}
