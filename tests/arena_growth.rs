//! Growth across arenas, end to end: the growth whose slots first need more arenas deals every
//! value to its key's arena in the grown heap and renumbers its state word (`resize::redeal`),
//! and the grown table's kernels allocate in its arenas; on the GPU (zero-copy, and staged with
//! small windows) and on the CPU model. Real tables need 2^32 slots for a second arena, more than
//! a test can grow, so this binary has a table take an arena for each 2,048 slots
//! (`testing::layout::set_slots_per_arena`): the same steps at a small size. The setting is the
//! process's, hence this binary of its own, whose tests all set the same.

mod common;

use common::oracle::{Oracle, assert_same_content};
use gphash::{Config, GpHash, GpuOptions, Placement};
use rand::SeedableRng;
use rand::rngs::StdRng;

#[test]
fn growth_deals_the_values_to_more_arenas() {
    gphash::testing::layout::set_slots_per_arena(2048);
    let mut rng = StdRng::seed_from_u64(common::seed("growth_deals_the_values_to_more_arenas"));
    let gpu = |placement, window| {
        common::gpu_options(GpuOptions { placement, max_window_bytes: window, ..GpuOptions::default() })
    };
    let cases = [
        ("gpu zero-copy", gpu(Placement::ZeroCopy, None)),
        ("gpu staged, windows of 64 KiB", gpu(Placement::Staged, Some(64 << 10))),
        ("cpu", common::cpu_options()),
    ];
    for (name, options) in cases {
        let dir = common::pool_dir();
        let cfg = Config { capacity: 100, value_bytes: 12, ..Default::default() };
        let t = common::table(&dir, "p", &cfg, &options);
        let mut arenas = vec![t.geometry().arenas()];
        let mut oracle = Oracle::default();
        // 35,000 operations over 40,000 keys leave about 13,000 of them: more than 12,288 slots
        // hold, about half of 24,576 (growths come near a load of 0.9).
        for round in 0..14 {
            let batch = common::random_batch(&mut rng, 2500, 40_000, 8, 12);
            let want = oracle.run(&batch);
            let got = t.execute_ordered(&batch).unwrap_or_else(|e| panic!("{name} round {round}: {e}"));
            for (i, (status, value)) in want.iter().enumerate() {
                assert_eq!((got.statuses[i], got.value(i)), (*status, value.as_deref()), "{name} op {i}");
            }
            assert_same_content(t.entries(), &oracle.map, &format!("{name} round {round}"));
            let check = t.check();
            assert!(check.ok(), "{name} round {round}: {check}");
            assert_eq!(t.cells_used().unwrap(), t.len(), "{name} round {round}");
            let geo = t.geometry();
            // An arena for each 2,048 slots, whole bitmap words of each.
            assert_eq!(geo.arenas(), geo.slots().div_ceil(2048).next_power_of_two().min(32), "{name}");
            assert!(geo.arenas() == 1 || geo.cells.is_multiple_of(32 * geo.arenas()), "{name}");
            arenas.push(geo.arenas());
        }
        arenas.dedup();
        // From one arena, each growth dealt the values again.
        assert_eq!(arenas, [1, 2, 4, 8, 16], "{name}: {} keys", t.len());
        eprintln!("{name}: arenas {arenas:?}, {} keys, {} slots", t.len(), t.geometry().slots());
        let geo = t.geometry();
        t.close().unwrap();
        // The arenas are the pool's: it reopens with them, its content the oracle's, on the CPU
        // model and on the GPU, which goes on inserting into them.
        for (how, reopen) in [("cpu", common::cpu_options()), ("gpu", gpu(Placement::ZeroCopy, None))] {
            let t = GpHash::open(&dir.path().join("p"), &reopen).unwrap();
            assert_eq!(t.geometry(), geo, "{name}, reopened on the {how}");
            assert_same_content(t.entries(), &oracle.map, &format!("{name}, reopened on the {how}"));
            let batch = common::random_batch(&mut rng, 500, 40_000, 8, 12);
            let want = oracle.run(&batch);
            let got = t.execute_ordered(&batch).unwrap();
            assert!(
                want.iter()
                    .enumerate()
                    .all(|(i, (s, v))| (got.statuses[i], got.value(i)) == (*s, v.as_deref()))
            );
            assert_same_content(
                t.entries(),
                &oracle.map,
                &format!("{name}, reopened on the {how}, a batch on"),
            );
            assert!(t.check().ok(), "{name}, reopened on the {how}: {}", t.check());
            t.close().unwrap();
        }
    }
}

/// A growth into more arenas interrupted after its record, with garbage where its build had got
/// to, completes on open: the build and the dealing of the values are redone from the start.
#[test]
fn an_interrupted_growth_into_more_arenas_completes_on_open() {
    gphash::testing::layout::set_slots_per_arena(2048);
    let dir = common::pool_dir();
    for (half_built, options) in
        [(false, common::gpu_options(GpuOptions::default())), (true, common::cpu_options())]
    {
        let path = dir.path().join(format!("p{half_built}"));
        let cfg = Config { capacity: 1000, ..Default::default() };
        let t = GpHash::create(Some(&path), &cfg, &options).unwrap();
        // 1,536 slots in one arena, to grow into 3,072 in two.
        assert_eq!((t.geometry().slots(), t.geometry().arenas()), (1536, 1));
        let keys: Vec<u8> = (0..900).flat_map(|k| common::key(k, 8)).collect();
        let values: Vec<u8> = (0..900u64).flat_map(|k| (k * 7).to_le_bytes()).collect();
        t.insert(&keys, &values).unwrap();
        let before: std::collections::HashMap<_, _> = t.entries().into_iter().collect();
        t.close().unwrap();

        common::interrupt_growth(&path, half_built);

        let t = GpHash::open(&path, &options).unwrap();
        assert_eq!(t.stats().recovery.resumed_resize, Some(true), "{}", t.stats().recovery);
        assert_eq!((t.geometry().slots(), t.geometry().arenas()), (3072, 2));
        assert_same_content(t.entries(), &before, "after the resumed growth");
        assert!(t.check().ok(), "{}", t.check());
    }
}
