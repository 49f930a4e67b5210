//! The CPU peer (`gphash_bench::systems::cpu_map`): every crate's answers against an oracle
//! that applies the operations one by one, on one thread and on several; the untimed check
//! that the suite relies on catches wrong statuses and wrong values.

use std::collections::HashMap;

use gphash::{OpKind, Status};
use gphash_bench::answers::Check;
use gphash_bench::systems::cpu_map::{self, ConcurrentMap, Dash, Papaya, Peer, Scc, Widths};
use gphash_bench::ycsb::{Op, value_of};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SEED: u64 = 0x5eed;

/// The answers of applying `ops` one by one to `map` (id -> seed of its value).
fn oracle(
    ops: &[Op],
    map: &mut HashMap<u64, u64>,
    seed: u64,
    value_bytes: usize,
) -> Vec<(u8, Option<Vec<u8>>)> {
    ops.iter()
        .map(|op| {
            let present = map.contains_key(&op.id);
            let applied = match op.kind {
                OpKind::Get => {
                    return map.get(&op.id).map_or((Status::NotFound as u8, None), |&s| {
                        (Status::Ok as u8, Some(value_of(op.id, s, value_bytes)))
                    });
                }
                OpKind::Insert if present => false,
                OpKind::Update | OpKind::Delete if !present => false,
                OpKind::Delete => map.remove(&op.id).is_some(),
                _ => {
                    map.insert(op.id, seed);
                    true
                }
            };
            let otherwise = if op.kind == OpKind::Insert { Status::Exists } else { Status::NotFound };
            (if applied { Status::Ok } else { otherwise } as u8, None)
        })
        .collect()
}

/// Random operations of every kind over ids `from..from + keys`.
fn random_ops(rng: &mut StdRng, n: usize, from: u64, keys: u64) -> Vec<Op> {
    let kinds = [OpKind::Get, OpKind::Insert, OpKind::Upsert, OpKind::Update, OpKind::Delete];
    (0..n).map(|_| Op { kind: kinds[rng.random_range(0..5)], id: from + rng.random_range(0..keys) }).collect()
}

/// One crate's answers against the oracle: one thread over shared keys, then four threads
/// each over keys of its own slice (so that no order between threads matters).
fn matches_the_oracle<M: ConcurrentMap<K, V>, const K: usize, const V: usize>() {
    let mut rng = StdRng::seed_from_u64(SEED ^ K as u64 ^ (V as u64) << 8);
    let what = format!("{} with {K}-byte keys and {V}-byte values", M::CRATE);
    let mut peer = Peer::<M, K, V>::new(1000, 1);
    let mut map = HashMap::new();
    for round in 0..4u64 {
        let ops = random_ops(&mut rng, 2000, 0, 300);
        peer.run_ops(&ops, SEED + round, &unchecked(V));
        let want = oracle(&ops, &mut map, SEED + round, V);
        let got: Vec<(u8, Option<Vec<u8>>)> =
            peer.answers(&ops).into_iter().map(|(s, v)| (s, v.map(|v| v.to_vec()))).collect();
        assert_eq!(got, want, "{what}, round {round}");
        assert_eq!(peer.len(), map.len(), "{what}, round {round}");
    }
    let mut peer = Peer::<M, K, V>::new(1000, 4);
    let mut map = HashMap::new();
    let ops: Vec<Op> = (0..4).flat_map(|t| random_ops(&mut rng, 500, t * 1000, 100)).collect();
    peer.run_ops(&ops, SEED, &unchecked(V));
    let want = oracle(&ops, &mut map, SEED, V);
    let got: Vec<(u8, Option<Vec<u8>>)> =
        peer.answers(&ops).into_iter().map(|(s, v)| (s, v.map(|v| v.to_vec()))).collect();
    assert_eq!(got, want, "{what} on four threads");
    assert_eq!(peer.len(), map.len(), "{what} on four threads");
}

/// A check that only counts.
fn unchecked(value_bytes: usize) -> Check {
    Check { expect: Status::Ok, records: 0, seeds: vec![], value_bytes, inserts_race: false }
}

struct EveryCrate;

impl Widths for EveryCrate {
    type Out = ();
    fn call<const K: usize, const V: usize>(self) {
        matches_the_oracle::<Scc<K, V>, K, V>();
        matches_the_oracle::<Papaya<K, V>, K, V>();
        matches_the_oracle::<Dash<K, V>, K, V>();
    }
}

#[test]
fn every_crate_matches_the_oracle() {
    for (k, v) in [(8, 128), (12, 20), (32, 8), (4, 1024)] {
        cpu_map::with_widths(k, v, EveryCrate).unwrap();
    }
}

#[test]
fn the_check_catches_wrong_statuses_and_values() {
    let records = 1000;
    let mut peer = Peer::<Scc<8, 16>, 8, 16>::new(2 * records, 3);
    let load: Vec<Op> = (0..records).map(|id| Op { kind: OpKind::Insert, id }).collect();
    let check =
        Check { expect: Status::Ok, records, seeds: vec![SEED], value_bytes: 16, inserts_race: false };
    assert_eq!(peer.run_ops(&load, SEED, &check).1, 0, "a load of new keys");
    assert_eq!(peer.run_ops(&load, SEED, &check).1, records, "inserts of present keys answer Exists");
    let reads: Vec<Op> = (0..records).map(|id| Op { kind: OpKind::Get, id }).collect();
    assert_eq!(peer.run_ops(&reads, SEED, &check).1, 0, "reads of loaded keys");
    let other = Check { seeds: vec![SEED + 1], ..check.clone() };
    assert_eq!(peer.run_ops(&reads, SEED, &other).1, records, "values of another seed are wrong");
    let either = Check { seeds: vec![SEED + 1, SEED], ..check.clone() };
    assert_eq!(peer.run_ops(&reads, SEED, &either).1, 0, "a value of any seed written is right");
    // Reads of absent keys: wrong below `records` (they were loaded); above it, a race with
    // another thread's insert where the threads race, wrong where batches run in order.
    let absent: Vec<Op> = (0..10).map(|i| Op { kind: OpKind::Get, id: 5000 + i }).collect();
    let racing = Check { inserts_race: true, ..check.clone() };
    assert_eq!(peer.run_ops(&absent, SEED, &racing).1, 0);
    assert_eq!(peer.run_ops(&absent, SEED, &check).1, 10);
    assert_eq!(peer.run_ops(&absent, SEED, &Check { records: 6000, ..racing }).1, 10);
    let negative = Check { expect: Status::NotFound, ..check };
    assert_eq!(peer.run_ops(&absent, SEED, &negative).1, 0, "negative searches");
    assert_eq!(peer.run_ops(&reads[..7], SEED, &negative).1, 7, "a negative search that finds its key");
}

#[test]
fn widths_it_is_not_built_for_are_refused() {
    for (k, v) in [(5, 128), (8, 100), (64, 8)] {
        let e = cpu_map::with_widths(k, v, EveryCrate).unwrap_err().to_string();
        assert!(e.contains(&format!("{k}-byte keys and {v}-byte values")), "{e}");
    }
}
