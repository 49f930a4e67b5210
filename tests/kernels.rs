//! The kernels against the CPU model and the one-by-one oracle, on random operations.
//!
//! On lavapipe these tests also run at other subgroup sizes: `subgroup_sizes_4_to_128` re-runs
//! them in child processes with `LP_NATIVE_VECTOR_WIDTH` = 32 bits a lane (see
//! `common::rerun_at_subgroup_sizes` for why 32 to 128 do not run on lavapipe).

mod common;

use std::collections::{HashMap, HashSet};

use common::oracle::{Oracle, assert_same_content};
use gphash::{Batch, Config, Error, GpHash, GpuOptions, Layout, OpKind, Placement, Status};
use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};

struct Case {
    layout: &'static str,
    key_bytes: u32,
    value_bytes: u32,
    gpu: GpuOptions,
    keys_apart: bool,
    /// The heap's arenas, as log2 (`Config::arena_bits`; `None`: as the table needs, one).
    arena_bits: Option<u32>,
}

fn cases() -> Vec<Case> {
    let opts = |placement, tile, max_window_bytes| GpuOptions {
        placement,
        tile,
        max_window_bytes,
        ..GpuOptions::default()
    };
    // The kernels of pools over 16 GiB (64-bit word addresses, binding arrays), on small ones.
    let wide = |o: GpuOptions| GpuOptions { large_pool_mode: true, ..o };
    vec![
        Case {
            layout: "2L-2H-8S",
            key_bytes: 8,
            value_bytes: 8,
            gpu: opts(Placement::ZeroCopy, 32, None),
            keys_apart: false,
            arena_bits: None,
        },
        Case {
            layout: "2L-2H-8S",
            key_bytes: 32,
            value_bytes: 128,
            gpu: opts(Placement::Staged, 32, None),
            keys_apart: false,
            arena_bits: None,
        },
        Case {
            layout: "4L-2H-16S",
            key_bytes: 16,
            value_bytes: 20,
            gpu: wide(opts(Placement::ZeroCopy, 16, Some(64 << 10))),
            keys_apart: false,
            arena_bits: None,
        },
        Case {
            layout: "1L-2H-8S",
            key_bytes: 4,
            value_bytes: 3,
            gpu: wide(opts(Placement::Staged, 4, Some(64 << 10))),
            keys_apart: false,
            arena_bits: None,
        },
        Case {
            layout: "3L-3H-4S",
            key_bytes: 8,
            value_bytes: 64,
            gpu: opts(Placement::ZeroCopy, 8, None),
            keys_apart: false,
            arena_bits: None,
        },
        // The naive baseline: one invocation per operation, no cooperation.
        Case {
            layout: "2L-2H-8S",
            key_bytes: 16,
            value_bytes: 5,
            gpu: opts(Placement::ZeroCopy, 1, None),
            keys_apart: false,
            arena_bits: None,
        },
        // Keys in an array of their own (the ablation of in-place keys).
        Case {
            layout: "2L-2H-8S",
            key_bytes: 16,
            value_bytes: 12,
            gpu: wide(opts(Placement::ZeroCopy, 32, Some(64 << 10))),
            keys_apart: true,
            arena_bits: None,
        },
        Case {
            layout: "3L-2H-4S",
            key_bytes: 8,
            value_bytes: 1,
            gpu: opts(Placement::Staged, 8, None),
            keys_apart: true,
            arena_bits: None,
        },
        // Heaps of several arenas (each key's cells in the arena its fingerprint names).
        Case {
            layout: "2L-4H-8S",
            key_bytes: 12,
            value_bytes: 24,
            gpu: opts(Placement::ZeroCopy, 16, None),
            keys_apart: false,
            arena_bits: Some(2),
        },
        Case {
            layout: "3L-2H-4S",
            key_bytes: 16,
            value_bytes: 36,
            gpu: wide(opts(Placement::Staged, 4, Some(64 << 10))),
            keys_apart: false,
            arena_bits: Some(5),
        },
        // Volatile: device memory only (its results are compared; its pool is not).
        Case {
            layout: "2L-2H-8S",
            key_bytes: 8,
            value_bytes: 8,
            gpu: opts(Placement::Volatile, 2, None),
            keys_apart: false,
            arena_bits: None,
        },
    ]
}

/// Runs `batch` on the GPU table and on the model: every status and value read equals the
/// oracle's (which applies the batch too).
fn same_as_oracle(gpu: &GpHash, cpu: &GpHash, oracle: &mut Oracle, batch: &Batch, what: &str) {
    let want = oracle.run(batch);
    let g = gpu.execute(batch).unwrap_or_else(|e| panic!("{what}: {e}"));
    let c = cpu.execute(batch).unwrap();
    for (i, (status, value)) in want.iter().enumerate() {
        let what = format!("{what} op {i} ({:?})", batch.op(i).0);
        assert_eq!((g.statuses[i], g.value(i)), (*status, value.as_deref()), "{what}: GPU");
        assert_eq!((c.statuses[i], c.value(i)), (*status, value.as_deref()), "{what}: model");
    }
}

/// The GPU and the CPU model run the same batches of distinct keys, each followed by a batch
/// of gets alone (the search kernel): their statuses, the values they read and their contents
/// equal the oracle's, the value cells in their pools
/// (checksum words included) are the same for each key, and every invariant holds.
#[test]
fn gpu_matches_model_on_random_batches() {
    let seed = common::seed("gpu_matches_model_on_random_batches");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    for (ci, case) in cases().iter().enumerate() {
        let cfg = Config {
            key_bytes: case.key_bytes,
            value_bytes: case.value_bytes,
            layout: case.layout.parse().unwrap(),
            capacity: 3000,
            seed: rng.random(),
            max_bytes: None,
            keys_apart: case.keys_apart,
            arena_bits: case.arena_bits,
        };
        let what = format!(
            "{} key {} value {} apart {} arenas {:?} {:?}",
            case.layout, case.key_bytes, case.value_bytes, case.keys_apart, case.arena_bits, case.gpu
        );
        let mut gpu = common::table(&dir, &format!("g{ci}"), &cfg, &common::gpu_options(case.gpu.clone()));
        let mut cpu = common::table(&dir, &format!("c{ci}"), &cfg, &common::cpu_options());
        let mut oracle = Oracle::default();
        // Keys drawn from a space that keeps the load factor near 0.6 at most.
        let space = (gpu.geometry().slots() as f64 * 0.6) as usize;
        for round in 0..6 {
            let n = rng.random_range(1..1500.min(space));
            let mut batch = gpu.batch();
            for k in sample(&mut rng, space, n) {
                let kind = common::random_kind(&mut rng);
                let v = common::value(&mut rng, case.value_bytes as usize);
                batch
                    .push(
                        kind,
                        &common::key(k as u64, case.key_bytes as usize),
                        kind.writes_value().then_some(&v[..]),
                    )
                    .unwrap();
            }
            same_as_oracle(&gpu, &cpu, &mut oracle, &batch, &format!("{what} round {round}"));
            // A batch of gets alone runs the search kernel: keys of the space, found or not.
            let mut gets = gpu.batch();
            for k in sample(&mut rng, space, n) {
                gets.push(OpKind::Get, &common::key(k as u64, case.key_bytes as usize), None).unwrap();
            }
            same_as_oracle(&gpu, &cpu, &mut oracle, &gets, &format!("{what} round {round} gets"));
            for (name, t) in [("GPU", &mut gpu), ("model", &mut cpu)] {
                if case.gpu.placement == Placement::Volatile && name == "GPU" {
                    // Its pool is never written: read every key of the space through the GPU.
                    let keys: Vec<u8> =
                        (0..space as u64).flat_map(|k| common::key(k, case.key_bytes as usize)).collect();
                    let got = t.get(&keys).unwrap();
                    for k in 0..space {
                        let key = &keys[k * case.key_bytes as usize..(k + 1) * case.key_bytes as usize];
                        assert_eq!(
                            got.value(k),
                            oracle.map.get(key).map(|v| &v[..]),
                            "{what} round {round}: key {k}"
                        );
                    }
                } else {
                    assert_same_content(t.entries(), &oracle.map, &format!("{what} round {round} {name}"));
                    let report = t.check();
                    assert!(report.ok(), "{what} round {round} {name}: {report}");
                }
                assert_eq!(t.len(), oracle.map.len() as u64, "{what} {name}: item count");
                assert_eq!(
                    t.cells_used().unwrap(),
                    t.len(),
                    "{what} {name}: a value cell leaked or was freed twice"
                );
            }
            if case.gpu.placement != Placement::Volatile {
                assert_same_cells(&gpu, &cpu, &format!("{what} round {round}"));
            }
        }
    }
}

/// Small host batches (their operations and results in host memory) are recorded and
/// submitted with Vulkan itself once a submit through wgpu has bound their slot's buffers,
/// the tails of their write batches too, with the oracle's results (the GPU's and the CPU
/// model's); a timed engine, a staged pool and a batch too large for host memory go through
/// wgpu. The table's contents, its cells and its invariants are checked after.
#[test]
fn small_host_batches_are_submitted_through_vulkan_itself() {
    if common::gpu().is_none() {
        return;
    }
    let mut rng =
        StdRng::seed_from_u64(common::seed("small_host_batches_are_submitted_through_vulkan_itself"));
    let dir = common::pool_dir();
    let cfg = Config { key_bytes: 8, value_bytes: 16, capacity: 40_000, ..Default::default() };
    let timed = GpuOptions { time_kernels: true, ..GpuOptions::default() };
    let staged = GpuOptions { placement: Placement::Staged, ..GpuOptions::default() };
    for (name, gpu, direct) in
        [("default", GpuOptions::default(), true), ("timed", timed, false), ("staged", staged, false)]
    {
        let t = common::table(&dir, name, &cfg, &common::gpu_options(gpu));
        let direct = direct && common::submits_through_vulkan(&t);
        let cpu = common::table(&dir, &format!("{name}-model"), &cfg, &common::cpu_options());
        let mut oracle = Oracle::default();
        let space = 3000;
        for round in 0..8 {
            let mut batch = t.batch();
            let n = rng.random_range(1..400);
            for k in sample(&mut rng, space, n) {
                let kind = common::random_kind(&mut rng);
                let v = common::value(&mut rng, 16);
                batch.push(kind, &common::key(k as u64, 8), kind.writes_value().then_some(&v[..])).unwrap();
            }
            same_as_oracle(&t, &cpu, &mut oracle, &batch, &format!("{name} round {round}"));
        }
        let p = t.activity().profile;
        // The first batch's submits are wgpu's; with the rounds' writes, some tails are Vulkan's.
        assert!(p.wgpu_submits > 0, "{name}: {p:?}");
        if direct {
            assert!(p.vulkan_submits >= 8, "{name}: {p:?}");
        } else {
            assert_eq!(p.vulkan_submits, 0, "{name}: {p:?}");
        }
        // Gets of more keys than host memory holds for a batch (16,384) go through wgpu.
        let before = t.activity().profile;
        let keys: Vec<u8> = (0..20_000u64).flat_map(|k| common::key(k, 8)).collect();
        let got = t.get(&keys).unwrap();
        for k in 0..space {
            assert_eq!(
                got.value(k),
                oracle.map.get(&common::key(k as u64, 8)).map(|v| &v[..]),
                "{name}: key {k}"
            );
        }
        let large = t.activity().profile.since(&before);
        assert_eq!((large.vulkan_submits, large.wgpu_submits > 0), (0, true), "{name}: {large:?}");
        assert_same_content(t.entries(), &oracle.map, name);
        assert_eq!(t.cells_used().unwrap(), t.len(), "{name}: a value cell leaked or was freed twice");
        let report = t.check();
        assert!(report.ok(), "{name}: {report}");
    }
}

/// Batches large enough that phase A narrows its tiles below the configured width (4 lanes
/// serving their lanes' operations in turns, while the other kernels keep 32-lane tiles), every
/// kind of operation, between smaller ones whose operations and results the kernels read and
/// write in host memory (up to 16,384 operations, where the driver imports host memory): the
/// same results and table as the model.
#[test]
fn gpu_matches_model_on_large_batches() {
    let seed = common::seed("gpu_matches_model_on_large_batches");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    let cfg = Config { value_bytes: 8, capacity: 160_000, seed: rng.random(), ..Default::default() };
    let wide = GpuOptions { placement: Placement::ZeroCopy, tile: 32, ..GpuOptions::default() };
    let gpu = common::table(&dir, "g", &cfg, &common::gpu_options(wide));
    let cpu = common::table(&dir, "c", &cfg, &common::cpu_options());
    let mut oracle = Oracle::default();
    let space = 100_000;
    // 2^17 / 70,000 rounds to one invocation per operation: 4-lane tiles, 4 operations each.
    for (round, n) in [70_000usize, 3_000, 40_000, 16_384, 70_000, 500].into_iter().enumerate() {
        let mut batch = gpu.batch();
        for k in sample(&mut rng, space, n) {
            let kind = common::random_kind(&mut rng);
            let v = common::value(&mut rng, 8);
            batch.push(kind, &common::key(k as u64, 8), kind.writes_value().then_some(&v[..])).unwrap();
        }
        same_as_oracle(&gpu, &cpu, &mut oracle, &batch, &format!("round {round}"));
        for (name, t) in [("GPU", &gpu), ("model", &cpu)] {
            assert_same_content(t.entries(), &oracle.map, &format!("round {round} {name}"));
            assert_eq!(t.len(), oracle.map.len() as u64, "round {round} {name}: item count");
        }
        assert!(gpu.check().ok(), "round {round}: {}", gpu.check());
    }
}

/// The value cells of every key (value words, then the checksum word the allocation stage
/// computed) are the same in the GPU's pool and in the CPU model's.
fn assert_same_cells(gpu: &gphash::GpHash, cpu: &gphash::GpHash, what: &str) {
    let (g, c) = (common::stored_cells(gpu), common::stored_cells(cpu));
    assert_eq!(g.len(), c.len(), "{what}: published keys");
    for (key, cell) in &c {
        let (value, checksum) = cell.split_at(cell.len() - 1);
        assert_eq!(checksum[0], gphash::hash::value_checksum(value), "{what}: key {key:x?}: model checksum");
        assert_eq!(g.get(key), Some(cell), "{what}: key {key:x?}: GPU cell (value words, checksum)");
    }
}

/// Values of odd sizes and the largest size, written and read (verified) by both engines:
/// the same cells and checksums in both pools, every read right, `check` clean.
#[test]
fn odd_value_sizes_keep_their_checksums() {
    let seed = common::seed("odd_value_sizes_keep_their_checksums");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    for value_bytes in [1u32, 3, 5, 65536] {
        let cfg = Config {
            value_bytes,
            layout: "1L-1H-8S".parse().unwrap(),
            capacity: 6,
            seed: rng.random(),
            ..Default::default()
        };
        let verified = |o: gphash::Options| gphash::Options { verify_values: true, ..o };
        let gpu_opts = verified(common::gpu_options(GpuOptions { tile: 8, ..GpuOptions::default() }));
        let mut gpu = common::table(&dir, &format!("g{value_bytes}"), &cfg, &gpu_opts);
        let mut cpu = common::table(&dir, &format!("c{value_bytes}"), &cfg, &verified(common::cpu_options()));
        let mut oracle = Oracle::default();
        for round in 0..3 {
            let mut batch = gpu.batch();
            for k in sample(&mut rng, 6, 4) {
                let kind = [OpKind::Upsert, OpKind::Get, OpKind::Insert][rng.random_range(0..3)];
                let v = common::value(&mut rng, value_bytes as usize);
                batch.push(kind, &common::key(k as u64, 8), kind.writes_value().then_some(&v[..])).unwrap();
            }
            let want = oracle.run(&batch);
            let what = format!("{value_bytes}-byte values, round {round}");
            for (name, t) in [("GPU", &mut gpu), ("model", &mut cpu)] {
                let got = t.execute(&batch).unwrap_or_else(|e| panic!("{what} {name}: {e}"));
                for (i, (status, value)) in want.iter().enumerate() {
                    assert_eq!(
                        (got.statuses[i], got.value(i)),
                        (*status, value.as_deref()),
                        "{what} {name} op {i}"
                    );
                }
                assert!(t.check().ok(), "{what} {name}: {}", t.check());
            }
            assert_same_cells(&gpu, &cpu, &what);
        }
    }
}

/// Batches of several MiB of values, which the host copies on all its threads (into the
/// kernels' input, into the queue's staging memory, out of the readback, into the results):
/// every value read back is the one written, on the GPU and on the model, in place and staged.
#[test]
fn batches_of_several_mib_of_values_read_back_whole() {
    let seed = common::seed("batches_of_several_mib_of_values_read_back_whole");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    let cfg = Config { value_bytes: 1000, capacity: 5000, seed: rng.random(), ..Default::default() };
    let keys: Vec<Vec<u8>> = (0..4000u64).map(|k| common::key(k, 8)).collect();
    let values: Vec<Vec<u8>> = keys.iter().map(|_| common::value(&mut rng, 1000)).collect();
    let staged = GpuOptions { placement: Placement::Staged, ..GpuOptions::default() };
    let engines = [
        ("GPU", common::gpu_options(GpuOptions::default())),
        ("GPU staged", common::gpu_options(staged)),
        ("model", common::cpu_options()),
    ];
    for (name, opts) in engines {
        let t = common::table(&dir, name, &cfg, &opts);
        let mut inserts = t.batch();
        for (k, v) in keys.iter().zip(&values) {
            inserts.insert(k, v).unwrap();
        }
        let done = t.execute(&inserts).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(done.statuses.iter().all(|&s| s == Status::Ok), "{name}: every insert succeeds");
        let mut reads = t.batch();
        keys.iter().for_each(|k| reads.get(k).unwrap());
        let got = t.execute(&reads).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (i, v) in values.iter().enumerate() {
            assert_eq!(got.value(i), Some(&v[..]), "{name}: key {i}");
        }
        assert!(t.check().ok(), "{name}: {}", t.check());
    }
}

/// A batch of inserts into a heap with free words takes its cells side by side (next-fit
/// claims from the allocator's cursor): their values stream to the pool.
#[test]
fn batches_of_inserts_take_neighbouring_cells() {
    let Some(gpu) = common::gpu() else {
        eprintln!("NOT RUN: no GPU (the model allocates one cell after another anyway)");
        return;
    };
    let dir = common::pool_dir();
    let cfg = Config { capacity: 100_000, seed: 7, ..Default::default() };
    let t = common::gpu_table(&dir, &cfg);
    let mut taken = HashSet::new();
    for round in 0..2u64 {
        let mut b = t.batch();
        for k in 0..4096u64 {
            b.insert(&common::key(round * 4096 + k, 8), &k.to_le_bytes()).unwrap();
        }
        let done = t.execute(&b).unwrap();
        assert!(done.statuses.iter().all(|&s| s == Status::Ok));
        let mut cells: Vec<u64> =
            common::published_cells(&t).into_iter().map(|(_, c)| c).filter(|c| taken.insert(*c)).collect();
        cells.sort_unstable();
        assert_eq!(cells.len(), 4096, "round {round}");
        // Scattered cells (one free word each, as before the runs) would leave about 4,095 gaps.
        let gaps = cells.windows(2).filter(|w| w[1] != w[0] + 1).count();
        let sg = gpu.info.subgroup_sizes;
        assert!(gaps <= 16, "round {round}, subgroups {sg:?}: {gaps} gaps between the batch's cells");
    }
    assert!(t.check().ok(), "{}", t.check());
}

/// Ordered execution equals applying the operations one by one, on heavily repeated keys.
#[test]
fn ordered_mode_equals_one_by_one() {
    let seed = common::seed("ordered_mode_equals_one_by_one");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    let cfg = Config { capacity: 2000, value_bytes: 12, ..Default::default() };
    let t = common::gpu_table(&dir, &cfg);
    let mut oracle = Oracle::default();
    for _ in 0..4 {
        let mut batch = t.batch();
        for _ in 0..600 {
            let kind = common::random_kind(&mut rng);
            let v = common::value(&mut rng, 12);
            let k = common::key(rng.random_range(0..40), 8);
            batch.push(kind, &k, kind.writes_value().then_some(&v[..])).unwrap();
        }
        let want = oracle.run(&batch);
        let got = t.execute_ordered(&batch).unwrap();
        for (i, (status, value)) in want.iter().enumerate() {
            assert_eq!(
                (got.statuses[i], got.value(i)),
                (*status, value.as_deref()),
                "op {i} {:?}",
                batch.op(i).0
            );
        }
        assert_same_content(t.entries(), &oracle.map, "ordered");
        assert_eq!(t.cells_used().unwrap(), t.len());
    }
}

/// Many subgroups inserting, updating and deleting the same few keys in one batch: no key is
/// published twice, no key is lost, and each key's results fit a serial order.
#[test]
fn same_key_storms_stay_linearizable() {
    let seed = common::seed("same_key_storms_stay_linearizable");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = common::pool_dir();
    let cfg = Config { capacity: 1000, value_bytes: 8, ..Default::default() };
    let t = common::gpu_table(&dir, &cfg);
    let mut before: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    for round in 0..6 {
        let keys: Vec<Vec<u8>> = (0..6).map(|k| common::key(k, 8)).collect();
        let mut batch = t.batch();
        let mut written: HashMap<Vec<u8>, HashSet<Vec<u8>>> = HashMap::new();
        for i in 0..3000u64 {
            let key = &keys[rng.random_range(0..keys.len())];
            let kind = common::random_kind(&mut rng);
            let v = i.to_le_bytes().to_vec();
            if kind.writes_value() {
                written.entry(key.clone()).or_default().insert(v.clone());
            }
            batch.push(kind, key, kind.writes_value().then_some(&v[..])).unwrap();
        }
        let r = t.execute(&batch).unwrap();
        let report = t.check();
        assert!(report.ok(), "round {round}: {report}");
        let after: HashMap<Vec<u8>, Vec<u8>> = t.entries().into_iter().collect();
        for key in &keys {
            let ops: Vec<usize> = (0..batch.len()).filter(|&i| batch.op(i).1 == &key[..]).collect();
            let batch = &batch;
            let of = |k: OpKind| ops.iter().copied().filter(move |&i| batch.op(i).0 == k);
            let ok = |i: &usize| r.statuses[*i] == Status::Ok;
            let pre = before.get(key);
            // Reads see the state before the batch.
            for i in of(OpKind::Get) {
                assert_eq!(r.value(i), pre.map(|v| &v[..]), "round {round}: get sees the pre-batch value");
            }
            let inserts_ok = of(OpKind::Insert).filter(ok).count();
            let deletes_ok = of(OpKind::Delete).filter(ok).count();
            let has = |k: OpKind| of(k).next().is_some();
            match pre {
                None => {
                    assert!(
                        of(OpKind::Update)
                            .chain(of(OpKind::Delete))
                            .all(|i| r.statuses[i] == Status::NotFound)
                    );
                    assert!(
                        inserts_ok <= 1,
                        "round {round}: {inserts_ok} inserts of one absent key succeeded"
                    );
                    assert!(of(OpKind::Upsert).all(|i| ok(&i)));
                    let claimed = has(OpKind::Insert) || has(OpKind::Upsert);
                    assert_eq!(after.contains_key(key), claimed, "round {round}: key lost or invented");
                    if claimed && !has(OpKind::Upsert) {
                        assert_eq!(inserts_ok, 1, "round {round}: some insert must win");
                    }
                }
                Some(_) => {
                    assert!(of(OpKind::Insert).all(|i| r.statuses[i] == Status::Exists));
                    assert!(of(OpKind::Update).chain(of(OpKind::Upsert)).all(|i| ok(&i)));
                    assert_eq!(
                        deletes_ok,
                        has(OpKind::Delete) as usize,
                        "round {round}: exactly one delete wins"
                    );
                    assert_eq!(
                        after.contains_key(key),
                        !has(OpKind::Delete),
                        "round {round}: key lost or kept"
                    );
                    // Combined changes of a present key: writes in batch order, then deletes.
                    if let Some(first) = of(OpKind::Delete).next() {
                        assert!(ok(&first), "round {round}: the first delete in batch order wins");
                    } else if let Some(last) = of(OpKind::Update).chain(of(OpKind::Upsert)).max() {
                        let want = batch.op(last).2;
                        assert_eq!(
                            after.get(key).map(|v| &v[..]),
                            Some(want),
                            "round {round}: the last writer's value"
                        );
                    }
                }
            }
            if let Some(v) = after.get(key) {
                let from_batch = written.get(key).is_some_and(|w| w.contains(v));
                assert!(from_batch || pre == Some(v), "round {round}: value from nowhere");
            }
        }
        assert_eq!(t.cells_used().unwrap(), t.len());
        before = after;
    }
}

/// The GPU and the model, each with growth off.
fn without_growth() -> [(&'static str, gphash::Options); 2] {
    [("GPU", common::gpu_options(GpuOptions::default())), ("model", common::cpu_options())]
        .map(|(name, opts)| (name, gphash::Options { grow: false, ..opts }))
}

/// With growth off, a batch with an insertion that finds no slot is rolled back whole; so is
/// one whose values find no free cell. The table is unchanged and keeps working.
#[test]
fn full_table_and_full_heap_roll_back() {
    let dir = common::pool_dir();
    for (name, opts) in without_growth() {
        let cfg = Config { layout: "1L-1H-8S".parse::<Layout>().unwrap(), capacity: 1, ..Default::default() };
        let t = common::table(&dir, name, &cfg, &opts);
        assert_eq!(t.geometry().slots(), 8);
        let k = |i: u64| common::key(i, 8);
        let keys: Vec<u8> = (0..8).flat_map(k).collect();
        t.insert(&keys, &keys).unwrap();
        let mut batch = t.batch();
        batch.upsert(&k(1), &[9; 8]).unwrap();
        batch.get(&k(2)).unwrap();
        batch.insert(&k(9), &[9; 8]).unwrap();
        batch.delete(&k(3)).unwrap();
        let before = t.activity().profile;
        match t.execute(&batch) {
            Err(Error::TableFull { failed: 1, .. }) => {}
            other => panic!("{name}: expected TableFull, got {other:?}"),
        }
        // Where the engine submits through Vulkan itself, phase A and the rollback were
        // recorded there (the insert before bound the slot through wgpu).
        if name == "GPU" && common::submits_through_vulkan(&t) {
            let p = t.activity().profile.since(&before);
            assert_eq!((p.vulkan_submits, p.wgpu_submits), (2, 0), "{name}: {p:?}");
        }
        let unchanged: HashMap<Vec<u8>, Vec<u8>> = (0..8).map(|i| (k(i), k(i))).collect();
        assert_same_content(t.entries(), &unchanged, name);
        assert_eq!(t.cells_used().unwrap(), 8, "{name}: rollback released the batch's cells");
        // More updates in one batch than free cells: the heap is full, nothing applies.
        let many = Batch::of_kind(
            OpKind::Update,
            8,
            8,
            &k(0).repeat(t.geometry().cells as usize),
            Some(&vec![5; 8 * t.geometry().cells as usize]),
        )
        .unwrap();
        assert!(matches!(t.execute(&many), Err(Error::HeapFull { .. })), "{name}");
        assert_same_content(t.entries(), &unchanged, name);
        // Gets where those updates found no cell, in both batch slots: a batch of gets runs
        // without the allocation stage that resets the records, and must not read them.
        let gets =
            Batch::of_kind(OpKind::Get, 8, 8, &k(4).repeat(t.geometry().cells as usize), None).unwrap();
        for _ in 0..2 {
            let got = t.execute(&gets).unwrap();
            assert!(got.statuses.iter().all(|&s| s == Status::Ok), "{name}: {:?}", got.statuses);
            assert!((0..gets.len()).all(|i| got.value(i) == Some(&k(4)[..])), "{name}");
        }
        assert!(t.check().ok());
        // Still usable.
        assert_eq!(t.delete(&k(3)).unwrap(), vec![Status::Ok]);
        assert_eq!(t.insert(&k(9), &k(9)).unwrap(), vec![Status::Ok]);
        assert_eq!(t.len(), 8);
        assert_eq!(t.stats().activity.rolled_back, 2);
    }
}

/// A heap filled to its last cell (every bitmap word full, so the allocation's summary marks
/// them all), then half emptied by deletes scattered over every word: with growth off, as many
/// inserts as the deletes freed all find a cell. A summary bit left set by a release would hide
/// its word's free cells, and these inserts would fail with `HeapFull`.
#[test]
fn cells_freed_in_full_words_are_found_again() {
    let dir = common::pool_dir();
    for (name, opts) in without_growth() {
        let cfg = Config { capacity: 20_000, seed: 3, ..Default::default() };
        let t = common::table(&dir, name, &cfg, &opts);
        let (cells, slots) = (t.geometry().cells, t.geometry().slots());
        assert!(
            (cells as f64) < slots as f64 * 0.6,
            "{name}: a heap of {cells} cells fills before {slots} slots"
        );
        let k = |i: u64| common::key(i, 8);
        let insert = |keys: &mut dyn Iterator<Item = u64>| {
            let mut b = t.batch();
            keys.for_each(|i| b.insert(&k(i), &i.to_le_bytes()).unwrap());
            let done = t.execute(&b).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(done.statuses.iter().all(|&s| s == Status::Ok), "{name}");
        };
        for start in (0..cells).step_by(4096) {
            insert(&mut (start..(start + 4096).min(cells)));
        }
        assert_eq!(t.cells_used().unwrap(), cells, "{name}: the heap is full");
        let mut more = t.batch();
        more.insert(&k(cells), &[1; 8]).unwrap();
        assert!(matches!(t.execute(&more), Err(Error::HeapFull { .. })), "{name}");
        let mut deletes = t.batch();
        (0..cells).step_by(2).for_each(|i| deletes.delete(&k(i)).unwrap());
        t.execute(&deletes).unwrap();
        let freed = cells.div_ceil(2);
        insert(&mut (cells..cells + freed));
        assert_eq!(t.cells_used().unwrap(), cells, "{name}: the heap is full again");
        assert_eq!(t.len(), cells);
        assert!(t.check().ok(), "{name}: {}", t.check());
    }
}

/// Re-runs the tests above at the subgroup sizes lavapipe can be given. On a device whose
/// subgroup size is fixed by the hardware, the tests above already ran at that size.
#[test]
fn subgroup_sizes_4_to_128() {
    common::rerun_at_subgroup_sizes(
        &[
            "gpu_matches_model",
            "ordered_mode",
            "same_key_storms",
            "full_table",
            "odd_value_sizes",
            "cells_freed",
            "batches_of_inserts",
        ],
        8,
    );
}
