//! Erase and reinsert sequences that broke other GPU hash tables, on the GPU and the CPU model,
//! against the one-by-one oracle: each operation in a batch of its own, a whole sequence in one
//! `execute_ordered` batch (the oracle's results), and in one `execute` batch (the results of
//! some order of each key's operations, reads before the batch). After every step: no key is
//! published twice, the content and the item count equal the oracle's, `check` passes and no
//! value cell leaks.
//!
//! - cuCollections issue 606: insert k1, insert k2, erase k1, insert k2 left k2 twice (the
//!   insert reused k1's freed slot without seeing k2 further along).
//! - SlabHash issue 17: erase a key, then insert it if absent.
//! - Erase and reinsert cycles over full candidate buckets (keys chosen to share all of them),
//!   and across resizes, between and inside the sequences.
//!
//! On lavapipe `subgroup_sizes_4_to_128` re-runs these tests at the other subgroup sizes.

mod common;

use std::collections::{HashMap, HashSet};

use common::oracle::{Oracle, assert_same_content, assert_some_order};
use gphash::Geometry;
use gphash::hash::{Seeds, locate};
use gphash::{Batch, Config, Error, GpHash, GpuOptions, OpKind, Options, Placement};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};

const VALUE_BYTES: usize = 8;

/// How a sequence's operations are submitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Each operation in a batch of its own.
    EachAlone,
    /// Each step in one `execute_ordered` batch.
    Ordered,
    /// Each step in one `execute` batch.
    Unordered,
}

const MODES: [Mode; 3] = [Mode::EachAlone, Mode::Ordered, Mode::Unordered];

/// A table under test and the oracle it must equal.
struct Subject {
    name: &'static str,
    table: GpHash,
    oracle: Oracle,
}

/// The same table on the GPU (zero-copy with 32-lane tiles, staged with 8-lane tiles) and on
/// the CPU model, each with its own oracle. The processes that rerun the tests at other
/// subgroup sizes leave the CPU model out: it ran in the parent, and no subgroup changes it.
fn subjects(dir: &tempfile::TempDir, test: &str, config: &Config, grow: bool) -> Vec<Subject> {
    let gpu = |placement, tile| common::gpu_options(GpuOptions { placement, tile, ..GpuOptions::default() });
    let rerun = std::env::var_os(common::EXPECT_SUBGROUP_ENV).is_some();
    [
        ("GPU zero-copy", gpu(Placement::ZeroCopy, 32)),
        ("GPU staged", gpu(Placement::Staged, 8)),
        ("CPU model", common::cpu_options()),
    ]
    .into_iter()
    .filter(|(name, _)| !(rerun && *name == "CPU model"))
    .enumerate()
    .map(|(i, (name, options))| Subject {
        name,
        table: common::table(dir, &format!("{test}{i}"), config, &Options { grow, ..options }),
        oracle: Oracle::default(),
    })
    .collect()
}

impl Subject {
    /// Runs `batch` in `mode` and checks the results and the table against the oracle.
    fn run(&mut self, batch: &Batch, mode: Mode, what: &str) {
        let what = format!("{} {what} ({mode:?})", self.name);
        match mode {
            Mode::EachAlone => {
                for i in 0..batch.len() {
                    let (kind, key, value) = batch.op(i);
                    let mut one = self.table.batch();
                    one.push(kind, key, kind.writes_value().then_some(value)).unwrap();
                    let got = self.table.execute(&one).unwrap_or_else(|e| panic!("{what} op {i}: {e}"));
                    let (status, read) = self.oracle.apply(kind, key, value);
                    assert_eq!(
                        (got.statuses[0], got.value(0)),
                        (status, read.as_deref()),
                        "{what}: op {i} ({kind:?} {key:?})"
                    );
                    self.verify(&format!("{what} after op {i}"));
                }
            }
            Mode::Ordered => {
                let want = self.oracle.run(batch);
                let got = self.table.execute_ordered(batch).unwrap_or_else(|e| panic!("{what}: {e}"));
                for (i, (status, read)) in want.iter().enumerate() {
                    let (kind, key, _) = batch.op(i);
                    assert_eq!(
                        (got.statuses[i], got.value(i)),
                        (*status, read.as_deref()),
                        "{what}: op {i} ({kind:?} {key:?})"
                    );
                }
                self.verify(&what);
            }
            Mode::Unordered => {
                let got = self.table.execute(batch).unwrap_or_else(|e| panic!("{what}: {e}"));
                let after = distinct_entries(&self.table, &what);
                assert_some_order(batch, &got, &self.oracle.map, &after, &what);
                self.oracle.map = after;
                self.verify(&what);
            }
        }
    }

    /// No key twice, the oracle's content and count, every invariant, no leaked value cell.
    fn verify(&mut self, what: &str) {
        distinct_entries(&self.table, what);
        assert_same_content(self.table.entries(), &self.oracle.map, what);
        let report = self.table.check();
        assert!(report.ok(), "{what}: {report}");
        assert_eq!(self.table.len(), self.oracle.map.len() as u64, "{what}: item count");
        assert_eq!(self.table.cells_used().unwrap(), self.table.len(), "{what}: value cells in use");
    }

    /// An insertion of `key` finds no empty candidate slot: with growth off the batch is
    /// refused whole and the table is unchanged.
    fn assert_full(&mut self, key: &[u8], what: &str) {
        let what = format!("{} {what}", self.name);
        match self.table.insert(key, &[0xAB; VALUE_BYTES]) {
            Err(Error::TableFull { failed: 1, .. }) => {}
            other => panic!("{what}: expected TableFull, got {other:?}"),
        }
        self.verify(&what);
    }
}

/// The table's entries as a map, after checking that no key is published twice.
fn distinct_entries(table: &GpHash, what: &str) -> HashMap<Vec<u8>, Vec<u8>> {
    let mut seen = HashMap::new();
    for (key, value) in table.entries() {
        if let Some(other) = seen.insert(key.clone(), value.clone()) {
            panic!("{what}: key {key:?} is published twice (values {other:?} and {value:?})");
        }
    }
    seen
}

fn key(k: u64) -> Vec<u8> {
    common::key(k, 8)
}

fn words(key: &[u8]) -> Vec<u32> {
    key.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// The candidate buckets of `key` in a table of geometry `geo`.
fn candidate_buckets(geo: &Geometry, seeds: &Seeds, key: &[u8]) -> Vec<u64> {
    let (tops, _) = locate(&words(key), seeds, geo.top_level, geo.location_bits());
    (0..geo.layout.candidate_buckets()).map(|b| geo.candidate(&tops, b * geo.layout.slots).bucket).collect()
}

/// `n` keys whose hash locations all fall in the same top-level buckets of level
/// `top_level + depth`: they share every candidate bucket in this table and in the tables up to
/// `depth` levels taller. Those buckets are distinct, so the keys have `L * H * S` candidate
/// slots between them. Key numbers start at `from`.
fn colliding_keys(geo: &Geometry, seed: u64, depth: u32, from: u64, n: usize) -> Vec<Vec<u8>> {
    let seeds = Seeds::new(seed, geo.layout.hashes);
    let tops = |k: &[u8]| locate(&words(k), &seeds, geo.top_level + depth, geo.location_bits()).0;
    let distinct = |k: &Vec<u8>| {
        let b = candidate_buckets(geo, &seeds, k);
        b.iter().collect::<HashSet<_>>().len() == b.len()
    };
    let first = (from..).map(key).find(distinct).unwrap();
    let target = tops(&first);
    (from..).map(key).filter(|k| tops(k) == target).take(n).collect()
}

/// Keys none of whose candidate buckets is one of the collision set's, with their candidate
/// buckets.
fn elsewhere(geo: &Geometry, seed: u64, colliding: &[u8]) -> impl Iterator<Item = (Vec<u8>, Vec<u64>)> {
    let seeds = Seeds::new(seed, geo.layout.hashes);
    let avoid: HashSet<u64> = candidate_buckets(geo, &seeds, colliding).into_iter().collect();
    (1u64 << 40..)
        .map(move |k| {
            let k = key(k);
            let buckets = candidate_buckets(geo, &seeds, &k);
            (k, buckets)
        })
        .filter(move |(_, buckets)| buckets.iter().all(|b| !avoid.contains(b)))
}

/// `n` keys none of whose candidate buckets is one of the collision set's (around them).
fn keys_elsewhere(geo: &Geometry, seed: u64, colliding: &[u8], n: usize) -> Vec<Vec<u8>> {
    elsewhere(geo, seed, colliding).map(|(k, _)| k).take(n).collect()
}

/// `n` keys elsewhere, no bucket a candidate of more than `S` of them (counted once per
/// candidate): each finds an empty candidate slot wherever the others are, in this table and
/// in every taller one (whose buckets are candidates only of keys that shared one here).
fn fillers(geo: &Geometry, seed: u64, colliding: &[u8], n: usize) -> Vec<Vec<u8>> {
    let mut uses: HashMap<u64, u32> = HashMap::new();
    elsewhere(geo, seed, colliding)
        .filter(|(_, buckets)| {
            let room = buckets.iter().all(|b| {
                let here = buckets.iter().filter(|c| *c == b).count() as u32;
                uses.get(b).copied().unwrap_or(0) + here <= geo.layout.slots
            });
            if room {
                buckets.iter().for_each(|b| *uses.entry(*b).or_default() += 1);
            }
            room
        })
        .map(|(k, _)| k)
        .take(n)
        .collect()
}

/// `2n` keys that share every candidate bucket in a one-level table of geometry `geo` and part
/// one level up into two halves of `n` with no candidate bucket in common: the top-level
/// buckets of the second half are the siblings of the first half's. Alternately of each half.
fn parting_keys(geo: &Geometry, seed: u64, n: usize) -> Vec<Vec<u8>> {
    assert_eq!(geo.layout.levels, 1, "a taller table keeps the old top level, shared by both halves");
    let seeds = Seeds::new(seed, geo.layout.hashes);
    let tops = |k: &[u8], level| locate(&words(k), &seeds, level, geo.location_bits()).0;
    let first = colliding_keys(geo, seed, 1, 1, n);
    let (here, up) = (tops(&first[0], geo.top_level), tops(&first[0], geo.top_level + 1));
    let second = (1..).map(key).filter(|k| {
        tops(k, geo.top_level) == here && tops(k, geo.top_level + 1).iter().zip(&up).all(|(a, b)| a != b)
    });
    first.iter().cloned().zip(second).flat_map(|(a, b)| [a, b]).collect()
}

fn value(rng: &mut StdRng) -> Vec<u8> {
    common::value(rng, VALUE_BYTES)
}

/// One batch of `ops`.
fn batch_of(table: &GpHash, ops: &[(OpKind, Vec<u8>, Vec<u8>)]) -> Batch {
    let mut batch = table.batch();
    for (kind, key, value) in ops {
        batch.push(*kind, key, kind.writes_value().then_some(&value[..])).unwrap();
    }
    batch
}

fn config(layout: &str, capacity: u64, rng: &mut StdRng) -> Config {
    Config {
        layout: layout.parse().unwrap(),
        capacity,
        value_bytes: VALUE_BYTES as u32,
        seed: rng.random(),
        ..Config::default()
    }
}

/// cuCollections issue 606: insert k1, insert k2, erase k1, insert k2 must find k2, not claim
/// the slot k1 freed (k1 and k2 share their candidate buckets, so that slot comes first). As
/// one batch, as steps, and around a resize; then over a bucket's worth of colliding pairs.
#[test]
fn cuco_606_insert_after_erasing_a_neighbour_finds_the_key() {
    let mut rng = StdRng::seed_from_u64(common::seed("cuco_606"));
    let dir = common::pool_dir();
    let cfg = config("2L-2H-8S", 200, &mut rng);
    for (mi, mode) in MODES.into_iter().enumerate() {
        for mut s in subjects(&dir, &format!("cuco{mi}-"), &cfg, true) {
            let geo = s.table.geometry();
            let slots = geo.layout.slots as usize;
            let keys = colliding_keys(&geo, cfg.seed, 1, 1, 2 * slots + 2);
            let (k1, k2) = (&keys[0], &keys[1]);
            let (v1, v2, v3) = (value(&mut rng), value(&mut rng), value(&mut rng));
            use OpKind::{Delete as D, Get as G, Insert as I};
            let none = vec![];
            let sequence = vec![
                (I, k1.clone(), v1.clone()),
                (I, k2.clone(), v2.clone()),
                (D, k1.clone(), none.clone()),
                (I, k2.clone(), v3.clone()),
                (G, k1.clone(), none.clone()),
                (G, k2.clone(), none.clone()),
            ];
            s.run(&batch_of(&s.table, &sequence), mode, "606 in one batch");
            // The same as steps, from a table that holds both keys.
            s.run(&batch_of(&s.table, &[(I, k1.clone(), v1.clone())]), mode, "606 k1 back");
            for (i, step) in [&sequence[..2], &sequence[2..4], &sequence[4..]].into_iter().enumerate() {
                s.run(&batch_of(&s.table, step), mode, &format!("606 step {i}"));
            }
            // Around a resize: the keys still share their candidate buckets one level up.
            s.run(&batch_of(&s.table, &[(I, k1.clone(), v1.clone())]), mode, "606 k1 again");
            s.table.grow().unwrap();
            s.verify(&format!("{} 606 grown", s.name));
            s.run(&batch_of(&s.table, &sequence[2..]), mode, "606 after the resize");
            // Every other key of a bucket's worth of colliding pairs erased, then all inserted
            // again: the erased come back once, the others are found.
            let pairs = &keys[2..];
            let inserts: Vec<_> = pairs.iter().map(|k| (I, k.clone(), value(&mut rng))).collect();
            let erase: Vec<_> = pairs.iter().step_by(2).map(|k| (D, k.clone(), none.clone())).collect();
            let reads: Vec<_> = pairs.iter().map(|k| (G, k.clone(), none.clone())).collect();
            s.run(&batch_of(&s.table, &inserts), mode, "pairs inserted");
            s.run(
                &batch_of(&s.table, &[erase.clone(), inserts.clone(), reads.clone()].concat()),
                mode,
                "pairs",
            );
            s.run(&batch_of(&s.table, &erase), mode, "pairs erased");
            s.run(&batch_of(&s.table, &[inserts, reads].concat()), mode, "pairs reinserted");
        }
    }
}

/// SlabHash issue 17: erase a key, then insert it if absent: the insertion succeeds, the key
/// holds the new value once, and a second insertion finds it. With the key's candidate
/// buckets full of colliding keys, so that the freed slot is the only one.
#[test]
fn slabhash_17_insert_if_absent_after_erase() {
    let mut rng = StdRng::seed_from_u64(common::seed("slabhash_17"));
    let dir = common::pool_dir();
    let cfg = config("2L-2H-8S", 200, &mut rng);
    for (mi, mode) in MODES.into_iter().enumerate() {
        for mut s in subjects(&dir, &format!("slab{mi}-"), &cfg, false) {
            let geo = s.table.geometry();
            let candidates = geo.layout.candidates() as usize;
            let keys = colliding_keys(&geo, cfg.seed, 0, 1, candidates + 1);
            use OpKind::{Delete as D, Get as G, Insert as I, Upsert as P};
            let fill: Vec<_> = keys[..candidates].iter().map(|k| (I, k.clone(), value(&mut rng))).collect();
            s.run(&batch_of(&s.table, &fill), Mode::EachAlone, "fill");
            s.assert_full(&keys[candidates], "candidate slots full");
            let none = vec![];
            for (round, k) in keys[..candidates].choose_multiple(&mut rng, 4).enumerate() {
                let sequence = vec![
                    (D, k.clone(), none.clone()),
                    (I, k.clone(), value(&mut rng)),
                    (G, k.clone(), none.clone()),
                    (I, k.clone(), value(&mut rng)),
                    (D, k.clone(), none.clone()),
                    (D, k.clone(), none.clone()),
                    (P, k.clone(), value(&mut rng)),
                    (I, k.clone(), value(&mut rng)),
                    (G, k.clone(), none.clone()),
                ];
                s.run(&batch_of(&s.table, &sequence), mode, &format!("round {round} in one batch"));
                for (i, step) in sequence.chunks(2).enumerate() {
                    s.run(&batch_of(&s.table, step), mode, &format!("round {round} step {i}"));
                }
                // `execute` linearizes a present key's erase after its insertion (Exists):
                // put the key back for the next round.
                s.run(&batch_of(&s.table, &[(P, k.clone(), value(&mut rng))]), mode, "back");
                s.assert_full(&keys[candidates], &format!("round {round}: still full"));
            }
        }
    }
}

/// Erase and reinsert cycles over full candidate buckets, growth off: keys that share all their
/// candidate buckets fill them, then each cycle erases some and puts keys back (the same ones,
/// in the same batch or later; other ones, later). After each cycle the freed slots are all
/// reused and no more (the next colliding insertion finds the table full).
#[test]
fn erase_reinsert_cycles_over_full_candidate_buckets() {
    let mut rng = StdRng::seed_from_u64(common::seed("full_candidate_buckets"));
    let dir = common::pool_dir();
    for (li, layout) in ["2L-2H-8S", "1L-2H-4S", "3L-2H-4S"].into_iter().enumerate() {
        let cfg = config(layout, 600, &mut rng);
        for mut s in subjects(&dir, &format!("full{li}-"), &cfg, false) {
            let geo = s.table.geometry();
            let candidates = geo.layout.candidates() as usize;
            let pool = colliding_keys(&geo, cfg.seed, 0, 1, candidates + candidates / 2);
            let around = keys_elsewhere(&geo, cfg.seed, &pool[0], 150);
            use OpKind::{Delete as D, Get as G, Insert as I, Upsert as P};
            let none = vec![];
            let fresh = |rng: &mut StdRng, kind, k: &Vec<u8>| (kind, k.clone(), value(rng));
            let around_ops: Vec<_> = around.iter().map(|k| fresh(&mut rng, I, k)).collect();
            s.run(&batch_of(&s.table, &around_ops), Mode::Unordered, &format!("{layout} around"));
            let mut present: Vec<Vec<u8>> = pool[..candidates].to_vec();
            let fill: Vec<_> = present.iter().map(|k| fresh(&mut rng, I, k)).collect();
            s.run(&batch_of(&s.table, &fill), Mode::Ordered, &format!("{layout} fill"));
            for cycle in 0..24 {
                let what = format!("{layout} cycle {cycle}");
                present.shuffle(&mut rng);
                let absent: Vec<Vec<u8>> = pool.iter().filter(|k| !present.contains(k)).cloned().collect();
                s.assert_full(&absent[0], &format!("{what}: full"));
                let erased: Vec<Vec<u8>> = present.drain(..rng.random_range(1..=candidates / 2)).collect();
                let mode = MODES[cycle % 3];
                // Erase, read, and the same keys back in one step, with insertions (Exists),
                // upserts and reads of keys that stay. `execute` finds the erased keys present
                // (Exists) and erases them; the others bring them back.
                let mut ops: Vec<_> = erased.iter().map(|k| (D, k.clone(), none.clone())).collect();
                ops.extend(erased.iter().map(|k| (G, k.clone(), none.clone())));
                ops.extend(erased.iter().map(|k| fresh(&mut rng, I, k)));
                ops.extend(present.iter().take(3).map(|k| fresh(&mut rng, I, k)));
                ops.extend(present.iter().take(3).map(|k| fresh(&mut rng, P, k)));
                ops.extend(present.iter().take(3).map(|k| (G, k.clone(), none.clone())));
                s.run(&batch_of(&s.table, &ops), mode, &format!("{what} erase and reinsert"));
                if mode != Mode::Unordered {
                    s.assert_full(&absent[0], &format!("{what}: the same keys fill the freed slots"));
                    let again: Vec<_> = erased.iter().map(|k| (D, k.clone(), none.clone())).collect();
                    s.run(&batch_of(&s.table, &again), mode, &format!("{what} erase again"));
                }
                // Other keys, and some of the erased, fill the freed slots in later batches.
                let mut back: Vec<Vec<u8>> = absent.iter().chain(&erased).cloned().collect();
                back.shuffle(&mut rng);
                back.truncate(erased.len());
                let ops: Vec<_> = back.iter().map(|k| fresh(&mut rng, I, k)).collect();
                s.run(&batch_of(&s.table, &ops), Mode::EachAlone, &format!("{what} refill"));
                present.extend(back);
            }
            let absent = pool.iter().find(|k| !present.contains(k)).unwrap();
            s.assert_full(absent, &format!("{layout} after the cycles"));
            let reads: Vec<_> = pool.iter().chain(&around).map(|k| (G, k.clone(), none.clone())).collect();
            s.run(&batch_of(&s.table, &reads), Mode::Unordered, &format!("{layout} read back"));
        }
    }
}

/// Erase and reinsert cycles across resizes: keys that share all their candidate buckets
/// overfill them inside a step (the step's batch rolls back, the table grows a level, where they
/// part, the batch runs again), and the table also grows between steps.
///
/// Growth for a slot is refused while the table would be less than half full (`GROW_FROM_LOAD`
/// in `src/index.rs`), so filler keys elsewhere load the table to just under half full first.
/// One level up the table is about a quarter full and growth is refused, so the colliding keys
/// must fit whatever the steps do: with one level per key (1L), a taller table has no bucket
/// shared by the two halves of `parting_keys`, and each half has no more keys than a key has
/// candidate slots. (With 2L the old top level would stay shared by both halves, and no set of colliding
/// keys that overfills it could be sure to fit.) The table thus grows exactly twice: once
/// inside the first step, once between steps.
#[test]
fn erase_reinsert_cycles_across_resizes() {
    let mut rng = StdRng::seed_from_u64(common::seed("across_resizes"));
    let dir = common::pool_dir();
    let cfg = config("1L-2H-8S", 100, &mut rng);
    for (mi, mode) in MODES.into_iter().enumerate() {
        for mut s in subjects(&dir, &format!("grow{mi}-"), &cfg, true) {
            let geo = s.table.geometry();
            let candidates = geo.layout.candidates() as usize;
            let pool = parting_keys(&geo, cfg.seed, candidates);
            use OpKind::{Delete as D, Get as G, Insert as I, Upsert as P};
            let none = vec![];
            let fresh = |rng: &mut StdRng, kind, k: &Vec<u8>| (kind, k.clone(), value(rng));
            // With the colliding keys' buckets full, one operation more makes the table half
            // full: the first insertion that finds no slot may grow it.
            let around = fillers(&geo, cfg.seed, &pool[0], geo.slots() as usize / 2 - candidates - 1);
            let around_ops: Vec<_> = around.iter().map(|k| fresh(&mut rng, I, k)).collect();
            s.run(&batch_of(&s.table, &around_ops), Mode::Unordered, "around");
            let fill: Vec<_> = pool[..candidates].iter().map(|k| fresh(&mut rng, I, k)).collect();
            s.run(&batch_of(&s.table, &fill), mode, "fill");
            let mut present: Vec<Vec<u8>> = pool[..candidates].to_vec();
            let top = s.table.geometry().top_level;
            for cycle in 0..6 {
                let what = format!("cycle {cycle}");
                present.shuffle(&mut rng);
                let erased: Vec<Vec<u8>> = present.drain(..4).collect();
                let absent: Vec<Vec<u8>> = pool.iter().filter(|k| !present.contains(k)).cloned().collect();
                // More keys back than were erased (growing the table inside the first step,
                // where they do not fit), and the erased keys erased and put back again.
                let mut ops: Vec<_> = erased.iter().map(|k| (D, k.clone(), none.clone())).collect();
                let mut back = absent.clone();
                back.shuffle(&mut rng);
                back.truncate(6);
                ops.extend(back.iter().map(|k| fresh(&mut rng, I, k)));
                ops.extend(present.iter().take(4).map(|k| fresh(&mut rng, I, k)));
                ops.extend(erased.iter().map(|k| (D, k.clone(), none.clone())));
                ops.extend(erased.iter().map(|k| fresh(&mut rng, P, k)));
                ops.extend(back.iter().chain(&erased).map(|k| (G, k.clone(), none.clone())));
                s.run(&batch_of(&s.table, &ops), mode, &what);
                present = pool.iter().filter(|k| s.oracle.map.contains_key(*k)).cloned().collect();
                if cycle == 0 {
                    let grown = s.table.geometry().top_level - top;
                    assert_eq!(grown, 1, "{} {what}: the table grew {grown} levels inside the step", s.name);
                }
                if cycle == 2 {
                    s.table.grow().unwrap();
                    s.verify(&format!("{} {what} grown", s.name));
                }
            }
            let grown = s.table.geometry().top_level - top;
            assert_eq!(
                grown, 2,
                "{}: the table grew {grown} levels, not 1 inside a step and 1 between",
                s.name
            );
            let reads: Vec<_> = pool.iter().chain(&around).map(|k| (G, k.clone(), none.clone())).collect();
            s.run(&batch_of(&s.table, &reads), Mode::Unordered, "read back");
        }
    }
}

/// Re-runs the tests above at the subgroup sizes lavapipe can be given (see
/// `common::rerun_at_subgroup_sizes`).
#[test]
fn subgroup_sizes_4_to_128() {
    common::rerun_at_subgroup_sizes(&["cuco_606", "slabhash_17", "full_candidate", "across_resizes"], 4);
}
