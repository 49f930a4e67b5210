//! One index shared by threads: 8 threads run random mixed batches through one `GpHash`, on
//! the GPU and on the CPU executor. Each thread owns a range of keys, whose results must be
//! those of a per-thread oracle; all of them also upsert and read a few shared keys, which
//! must end as some order of whole calls leaves them.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use gphash::{Config, GpHash, GpuOptions, OpKind, Options, Status, TypedIndex};
use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};

const THREADS: u64 = 8;
/// Keys each thread owns.
const PRIVATE: u64 = 300;
/// Keys every thread upserts and reads (numbered after the private ones).
const SHARED: u64 = 24;
const ROUNDS: u64 = 12;

/// The handles are shared across threads by reference.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    shared::<GpHash>();
    shared::<TypedIndex<u64, u64>>();
};

fn shared_key(j: u64) -> u64 {
    THREADS * PRIVATE + j
}

/// What one thread saw of the shared keys.
#[derive(Default)]
struct SharedLog {
    /// Per shared key, the last value this thread wrote to it.
    last_written: HashMap<u64, u64>,
    /// Every value this thread wrote to a shared key.
    written: HashSet<(u64, u64)>,
    /// Every value this thread read from a shared key.
    read: Vec<(u64, u64)>,
}

/// Runs `ROUNDS` random batches of thread `thread` on `t`, checking each result on a private
/// key against the thread's oracle. Returns the oracle and what the thread did to shared keys.
fn worker(t: &GpHash, thread: u64, seed: u64) -> (HashMap<u64, u64>, SharedLog) {
    let mut rng = StdRng::seed_from_u64(seed ^ thread.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut oracle: HashMap<u64, u64> = HashMap::new();
    let mut log = SharedLog::default();
    // Values are tagged with their writer: thread in the high word, a sequence number below.
    let mut seq = 0u64;
    for round in 0..ROUNDS {
        // Ordered calls may repeat keys; unordered ones use each key once (their operations on
        // one key would take effect in an unspecified order).
        let ordered = round % 2 == 0;
        let n = rng.random_range(20..200);
        let private: Vec<u64> = if ordered {
            (0..n).map(|_| rng.random_range(0..PRIVATE)).collect()
        } else {
            sample(&mut rng, PRIVATE as usize, n).iter().map(|i| i as u64).collect()
        };
        let shared: Vec<u64> = if ordered {
            (0..8).map(|_| rng.random_range(0..SHARED)).collect()
        } else {
            sample(&mut rng, SHARED as usize, 8).iter().map(|i| i as u64).collect()
        };
        let mut ops: Vec<(OpKind, u64, u64)> = vec![];
        for i in private {
            seq += 1;
            ops.push((common::random_kind(&mut rng), thread * PRIVATE + i, thread << 32 | seq));
        }
        for j in shared {
            seq += 1;
            let kind = if rng.random_bool(0.7) { OpKind::Upsert } else { OpKind::Get };
            let at = rng.random_range(0..=ops.len());
            ops.insert(at, (kind, shared_key(j), thread << 32 | seq));
        }
        let mut batch = t.batch();
        for &(kind, k, v) in &ops {
            let value =
                matches!(kind, OpKind::Insert | OpKind::Upsert | OpKind::Update).then(|| v.to_le_bytes());
            batch.push(kind, &common::key(k, 8), value.as_ref().map(|v| &v[..])).unwrap();
        }
        let result = if ordered { t.execute_ordered(&batch) } else { t.execute(&batch) }
            .unwrap_or_else(|e| panic!("thread {thread} round {round}: {e}"));
        for (i, &(kind, k, v)) in ops.iter().enumerate() {
            let got =
                (result.statuses[i], result.value(i).map(|b| u64::from_le_bytes(b.try_into().unwrap())));
            let what = || format!("thread {thread} round {round} op {i}: {kind:?} of key {k}");
            if k >= THREADS * PRIVATE {
                match kind {
                    OpKind::Upsert => {
                        assert_eq!(got, (Status::Ok, None), "{}", what());
                        log.last_written.insert(k, v);
                        log.written.insert((k, v));
                    }
                    _ => match got {
                        (Status::Ok, Some(read)) => log.read.push((k, read)),
                        (Status::NotFound, None) => {}
                        other => panic!("{}: {other:?}", what()),
                    },
                }
                continue;
            }
            let before = oracle.get(&k).copied();
            let expected = match (kind, before) {
                (OpKind::Get, Some(old)) => (Status::Ok, Some(old)),
                (OpKind::Insert, Some(_)) => (Status::Exists, None),
                (OpKind::Get | OpKind::Update | OpKind::Delete, None) => (Status::NotFound, None),
                (OpKind::Delete, Some(_)) => {
                    oracle.remove(&k);
                    (Status::Ok, None)
                }
                (OpKind::Insert | OpKind::Upsert | OpKind::Update, _) => {
                    oracle.insert(k, v);
                    (Status::Ok, None)
                }
            };
            assert_eq!(got, expected, "{}", what());
        }
    }
    (oracle, log)
}

/// Runs the workers on `t` shared through an `Arc`, then checks the table's content.
fn threads_share_one_index(options: &Options, test: &str) {
    let seed = common::seed(test);
    let dir = common::pool_dir();
    // Small enough that the table grows while the threads run.
    let config = Config { capacity: 600, ..Config::default() };
    let t = Arc::new(common::table(&dir, "threads.pool", &config, options));
    let workers: Vec<_> = (0..THREADS)
        .map(|thread| {
            let t = Arc::clone(&t);
            std::thread::spawn(move || worker(&t, thread, seed))
        })
        .collect();
    let done: Vec<_> = workers.into_iter().map(|w| w.join().expect("a worker failed")).collect();

    let entries = t.entries();
    let stored: HashMap<u64, u64> = entries
        .iter()
        .map(|(k, v)| {
            let k = (0..THREADS * PRIVATE + SHARED)
                .find(|&n| common::key(n, 8) == *k)
                .expect("a key never written");
            (k, u64::from_le_bytes(v[..].try_into().unwrap()))
        })
        .collect();
    assert_eq!(stored.len(), entries.len(), "{test}: a key is published twice");
    let report = t.check();
    assert!(report.ok(), "{test}: {report:?}");

    let mut expected_items = 0;
    for (thread, (oracle, _)) in done.iter().enumerate() {
        let range = thread as u64 * PRIVATE..(thread as u64 + 1) * PRIVATE;
        let mine: HashMap<u64, u64> =
            stored.iter().filter(|(k, _)| range.contains(k)).map(|(&k, &v)| (k, v)).collect();
        assert_eq!(&mine, oracle, "{test}: thread {thread}'s keys");
        expected_items += oracle.len() as u64;
    }
    let written: HashSet<(u64, u64)> = done.iter().flat_map(|(_, log)| log.written.iter().copied()).collect();
    for (thread, (_, log)) in done.iter().enumerate() {
        for read in &log.read {
            assert!(written.contains(read), "{test}: thread {thread} read {read:?}, which nobody wrote");
        }
    }
    for j in 0..SHARED {
        let k = shared_key(j);
        // The call that wrote last is some thread's last call that wrote the key.
        let lasts: Vec<u64> = done.iter().filter_map(|(_, log)| log.last_written.get(&k).copied()).collect();
        match stored.get(&k) {
            Some(v) => assert!(
                lasts.contains(v),
                "{test}: shared key {k} holds {v:#x}, not a last write of {lasts:x?}"
            ),
            None => assert!(lasts.is_empty(), "{test}: shared key {k} was written and is absent"),
        }
        expected_items += !lasts.is_empty() as u64;
    }
    assert_eq!(t.len(), expected_items, "{test}: item count");
    let activity = t.stats().activity;
    assert!(activity.resizes > 0, "{test}: the table grew while the threads ran");
    assert_eq!(activity.rolled_back, 0, "{test}: the table grows instead");
    Arc::into_inner(t).expect("the workers are done").close().unwrap();
}

#[test]
fn threads_share_one_index_on_the_gpu() {
    threads_share_one_index(&common::gpu_options(GpuOptions::default()), "threads_gpu");
}

#[test]
fn threads_share_one_index_on_the_cpu() {
    threads_share_one_index(&common::cpu_options(), "threads_cpu");
}

/// A batch from another thread never lands between the engine batches of a call: a call too
/// large for one engine batch, racing calls that read all of its keys, is seen whole or not
/// at all.
#[test]
fn a_call_of_several_engine_batches_is_seen_whole() {
    let dir = common::pool_dir();
    // Bindings this small make engine batches of a few hundred operations.
    let options = Options {
        device: Some(common::gpu_with_binding_limit(16 << 10)),
        ..common::gpu_options(GpuOptions::default())
    };
    let t = common::table(&dir, "whole.pool", &Config { capacity: 4000, ..Config::default() }, &options);
    let max = t.stats().max_batch as u64;
    assert!(max < 1000, "engine batches of {max}");
    let n = 2 * max + max / 2;
    let keys: Vec<u8> = (0..n).flat_map(|k| common::key(k, 8)).collect();
    std::thread::scope(|s| {
        s.spawn(|| {
            for round in 1..=3u64 {
                let values: Vec<u8> = (0..n).flat_map(|_| round.to_le_bytes()).collect();
                t.upsert(&keys, &values).unwrap();
            }
        });
        for _ in 0..4 {
            let found = t.get(&keys).unwrap();
            let seen: HashSet<Option<&[u8]>> = (0..n as usize).map(|i| found.value(i)).collect();
            assert_eq!(seen.len(), 1, "a read saw parts of two calls");
        }
    });
    assert_eq!(t.len(), n);
}
