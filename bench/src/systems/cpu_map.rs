//! `cpu-map`: the CPU peer, a concurrent hash map crate used the way a CPU program uses it.
//!
//! Keys and values are held inline at the table's widths (`[u8; K]` and `[u8; V]`,
//! monomorphized: no boxes, no padding), and every host thread applies its own contiguous slice
//! of the request stream that the GPU systems get in batches, from start to end, with no batch,
//! barrier or plan between its requests. Reads copy their values out, as a program that uses
//! them does. The results are checked afterwards, untimed: every status, and every value read
//! against the values the workloads wrote for its key.
//!
//! scc, papaya and dashmap all run ([`ConcurrentMap`]); the suite reports each crate and the
//! best of them. Volatile: nothing is persisted, so the peer pays for no durability.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::answers::Check;
use crate::systems::Traffic;
use crate::ycsb::{Op, value_of};
use gphash::{Error, OpKind, Result, Status};

/// The hasher of every map: foldhash, the fast one that hashbrown uses by default.
pub type Hasher = foldhash::fast::RandomState;

/// Key widths the peer is built for, in bytes.
pub const KEY_WIDTHS: [usize; 5] = [4, 8, 12, 16, 32];
/// Value widths the peer is built for, in bytes.
pub const VALUE_WIDTHS: [usize; 9] = [8, 16, 20, 32, 64, 128, 256, 512, 1024];

/// The map crates the peer runs, in the order they run.
pub const CRATES: [&str; 3] = ["scc", "papaya", "dashmap"];

/// Requests a papaya handle serves before it is pinned again (a guard held for a whole run
/// would keep every replaced entry alive until its end).
const REPIN: usize = 1024;

/// One request of a stream, its key and value inline (a read's value is unused).
#[derive(Clone, Copy, Debug)]
pub struct Request<const K: usize, const V: usize> {
    /// What it does.
    pub kind: OpKind,
    /// The key.
    pub key: [u8; K],
    /// The value an insert, upsert or update writes.
    pub value: [u8; V],
}

/// A concurrent map of `[u8; K]` keys to `[u8; V]` values.
#[allow(clippy::len_without_is_empty)]
pub trait ConcurrentMap<const K: usize, const V: usize>: Send + Sync + Sized {
    /// The map as one thread uses it for a run of requests (a pinned epoch guard, where the
    /// map has one).
    type Handle<'a>: Handle<K, V>
    where
        Self: 'a;
    /// The crate, for the report.
    const CRATE: &'static str;
    /// An empty map with room for `capacity` keys.
    fn with_capacity(capacity: usize) -> Self;
    /// A handle for the calling thread.
    fn handle(&self) -> Self::Handle<'_>;
    /// Keys held.
    fn len(&self) -> usize;
}

/// One thread's operations on a [`ConcurrentMap`].
pub trait Handle<const K: usize, const V: usize> {
    /// The value of `key`.
    fn get(&self, key: &[u8; K]) -> Option<[u8; V]>;
    /// Inserts `key` unless it is present; whether it was inserted.
    fn insert(&self, key: [u8; K], value: [u8; V]) -> bool;
    /// Inserts `key` or replaces its value.
    fn upsert(&self, key: [u8; K], value: [u8; V]);
    /// Replaces the value of `key` if it is present; whether it was.
    fn update(&self, key: &[u8; K], value: [u8; V]) -> bool;
    /// Removes `key`; whether it was present.
    fn remove(&self, key: &[u8; K]) -> bool;
}

/// scc's map.
pub type Scc<const K: usize, const V: usize> = scc::HashMap<[u8; K], [u8; V], Hasher>;
/// papaya's map.
pub type Papaya<const K: usize, const V: usize> = papaya::HashMap<[u8; K], [u8; V], Hasher>;
/// dashmap's map.
pub type Dash<const K: usize, const V: usize> = dashmap::DashMap<[u8; K], [u8; V], Hasher>;

impl<const K: usize, const V: usize> ConcurrentMap<K, V> for Scc<K, V> {
    type Handle<'a> = &'a Self;
    const CRATE: &'static str = "scc";
    fn with_capacity(capacity: usize) -> Self {
        scc::HashMap::with_capacity_and_hasher(capacity, Hasher::default())
    }
    fn handle(&self) -> &Self {
        self
    }
    fn len(&self) -> usize {
        scc::HashMap::len(self)
    }
}

impl<const K: usize, const V: usize> Handle<K, V> for &Scc<K, V> {
    fn get(&self, key: &[u8; K]) -> Option<[u8; V]> {
        self.read_sync(key, |_, v| *v)
    }
    fn insert(&self, key: [u8; K], value: [u8; V]) -> bool {
        self.insert_sync(key, value).is_ok()
    }
    fn upsert(&self, key: [u8; K], value: [u8; V]) {
        self.upsert_sync(key, value);
    }
    fn update(&self, key: &[u8; K], value: [u8; V]) -> bool {
        self.update_sync(key, |_, v| *v = value).is_some()
    }
    fn remove(&self, key: &[u8; K]) -> bool {
        self.remove_sync(key).is_some()
    }
}

impl<const K: usize, const V: usize> ConcurrentMap<K, V> for Papaya<K, V> {
    type Handle<'a> = papaya::HashMapRef<'a, [u8; K], [u8; V], Hasher, papaya::LocalGuard<'a>>;
    const CRATE: &'static str = "papaya";
    fn with_capacity(capacity: usize) -> Self {
        papaya::HashMap::builder().capacity(capacity).hasher(Hasher::default()).build()
    }
    fn handle(&self) -> Self::Handle<'_> {
        self.pin()
    }
    fn len(&self) -> usize {
        papaya::HashMap::len(self)
    }
}

impl<const K: usize, const V: usize> Handle<K, V>
    for papaya::HashMapRef<'_, [u8; K], [u8; V], Hasher, papaya::LocalGuard<'_>>
{
    fn get(&self, key: &[u8; K]) -> Option<[u8; V]> {
        papaya::HashMapRef::get(self, key).copied()
    }
    fn insert(&self, key: [u8; K], value: [u8; V]) -> bool {
        self.try_insert(key, value).is_ok()
    }
    fn upsert(&self, key: [u8; K], value: [u8; V]) {
        papaya::HashMapRef::insert(self, key, value);
    }
    fn update(&self, key: &[u8; K], value: [u8; V]) -> bool {
        papaya::HashMapRef::update(self, *key, |_| value).is_some()
    }
    fn remove(&self, key: &[u8; K]) -> bool {
        papaya::HashMapRef::remove(self, key).is_some()
    }
}

impl<const K: usize, const V: usize> ConcurrentMap<K, V> for Dash<K, V> {
    type Handle<'a> = &'a Self;
    const CRATE: &'static str = "dashmap";
    fn with_capacity(capacity: usize) -> Self {
        dashmap::DashMap::with_capacity_and_hasher(capacity, Hasher::default())
    }
    fn handle(&self) -> &Self {
        self
    }
    fn len(&self) -> usize {
        dashmap::DashMap::len(self)
    }
}

impl<const K: usize, const V: usize> Handle<K, V> for &Dash<K, V> {
    fn get(&self, key: &[u8; K]) -> Option<[u8; V]> {
        dashmap::DashMap::get(self, key).map(|v| *v)
    }
    fn insert(&self, key: [u8; K], value: [u8; V]) -> bool {
        match self.entry(key) {
            dashmap::Entry::Vacant(e) => {
                e.insert(value);
                true
            }
            dashmap::Entry::Occupied(_) => false,
        }
    }
    fn upsert(&self, key: [u8; K], value: [u8; V]) {
        dashmap::DashMap::insert(self, key, value);
    }
    fn update(&self, key: &[u8; K], value: [u8; V]) -> bool {
        self.get_mut(key).map(|mut v| *v = value).is_some()
    }
    fn remove(&self, key: &[u8; K]) -> bool {
        dashmap::DashMap::remove(self, key).is_some()
    }
}

/// What a thread writes while it applies its slice: one status code per request and the
/// values its reads found, in order. Kept between runs so that its pages are touched before
/// any timed run writes them.
#[derive(Debug)]
struct Lane<const V: usize> {
    statuses: Vec<u8>,
    found: Vec<[u8; V]>,
}

impl<const V: usize> Lane<V> {
    /// Room for `n` requests, `reads` of them reads, touched now.
    fn ready(&mut self, n: usize, reads: usize) {
        self.statuses.clear();
        self.statuses.resize(n, u8::MAX);
        self.statuses.clear();
        self.found.clear();
        self.found.resize(reads, [0; V]);
        self.found.clear();
    }
}

/// One run of a stream: its time and the length of each thread's slice.
struct Ran {
    took: Duration,
    /// Requests per thread's slice.
    slice: usize,
}

/// A map crate's peer over one table: the map, its threads' lanes, and the stream's requests.
pub struct Peer<M: ConcurrentMap<K, V>, const K: usize, const V: usize> {
    map: M,
    threads: usize,
    lanes: Vec<Lane<V>>,
}

impl<M: ConcurrentMap<K, V>, const K: usize, const V: usize> Peer<M, K, V> {
    /// An empty map with room for `capacity` keys, run by `threads` host threads.
    pub fn new(capacity: u64, threads: usize) -> Self {
        let threads = threads.max(1);
        let lanes = (0..threads).map(|_| Lane { statuses: vec![], found: vec![] }).collect();
        Peer { map: M::with_capacity(capacity as usize), threads, lanes }
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Applies `requests`, each thread its own contiguous slice start to end, and returns the
    /// time from the first thread's start to the last one's end. Each thread makes its lane
    /// ready before they start together, and reads the clock itself, since the thread that
    /// started them may not run again before they end.
    fn run(&mut self, requests: &[Request<K, V>]) -> Ran {
        let slice = requests.len().div_ceil(self.threads).max(1);
        let parts = || requests.chunks(slice).chain(std::iter::repeat(&[][..]));
        let start = Barrier::new(self.threads);
        let map = &self.map;
        let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
            let workers: Vec<_> = self
                .lanes
                .iter_mut()
                .zip(parts())
                .map(|(lane, part)| {
                    let start = &start;
                    s.spawn(move || {
                        // Its pages are touched by the thread that writes them.
                        lane.ready(part.len(), part.iter().filter(|r| r.kind == OpKind::Get).count());
                        start.wait();
                        let t = Instant::now();
                        apply(map, part, lane);
                        (t, Instant::now())
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().expect("a peer thread panicked")).collect()
        });
        let first = spans.iter().map(|s| s.0).min().expect("at least one thread");
        let last = spans.iter().map(|s| s.1).max().expect("at least one thread");
        Ran { took: last - first, slice }
    }

    /// Runs `ops` (keys and values made from their ids, values under `seed`) and checks the
    /// results, untimed: a read must find a value that one of `seeds` gives its key, every
    /// other request must take effect; `expect` is the status every request should have (a
    /// read of a key inserted by this stream may also find nothing: another thread's insert
    /// of it may not have run yet). Returns the run's time and the requests that answered
    /// otherwise.
    pub fn run_ops(&mut self, ops: &[Op], seed: u64, check: &Check) -> (Duration, u64) {
        let requests = requests::<K, V>(ops, seed);
        let ran = self.run(&requests);
        let unexpected = self.unexpected(ops, ran.slice, check);
        (ran.took, unexpected)
    }

    /// The requests of the last run (of `ops`) that answered otherwise than `check` expects.
    fn unexpected(&self, ops: &[Op], slice: usize, check: &Check) -> u64 {
        let wrong = |(lane, part): (&Lane<V>, &[Op])| {
            let answers = lane.answers(part);
            let wrong =
                answers.filter(|&(op, status, value)| !check.accepts(op, status, value.map(|v| &v[..])));
            wrong.count() as u64 + part.len().saturating_sub(lane.statuses.len()) as u64
        };
        self.lanes.par_iter().zip(ops.par_chunks(slice)).map(wrong).sum()
    }

    /// The answers of the last run of `ops`, in their order: each status code, and the value
    /// a read found.
    pub fn answers(&self, ops: &[Op]) -> Vec<(u8, Option<[u8; V]>)> {
        let slice = ops.len().div_ceil(self.threads).max(1);
        let lanes = self.lanes.iter().zip(ops.chunks(slice));
        lanes.flat_map(|(lane, part)| lane.answers(part).map(|(_, s, v)| (s, v.copied()))).collect()
    }
}

impl<const V: usize> Lane<V> {
    /// The answers this lane holds for `part`, the slice of operations it applied.
    fn answers<'a>(&'a self, part: &'a [Op]) -> impl Iterator<Item = (&'a Op, u8, Option<&'a [u8; V]>)> {
        let mut found = self.found.iter();
        part.iter().zip(&self.statuses).map(move |(op, &status)| {
            let value = (op.kind == OpKind::Get && status == Status::Ok as u8)
                .then(|| found.next().expect("a value per read that found one"));
            (op, status, value)
        })
    }
}

/// Applies `part` to `map` from one thread, writing its lane.
fn apply<M: ConcurrentMap<K, V>, const K: usize, const V: usize>(
    map: &M,
    part: &[Request<K, V>],
    lane: &mut Lane<V>,
) {
    for run in part.chunks(REPIN) {
        let h = map.handle();
        for r in run {
            let applied = match r.kind {
                OpKind::Get => h.get(&r.key).map(|v| lane.found.push(v)).is_some(),
                OpKind::Insert => h.insert(r.key, r.value),
                OpKind::Upsert => {
                    h.upsert(r.key, r.value);
                    true
                }
                OpKind::Update => h.update(&r.key, r.value),
                OpKind::Delete => h.remove(&r.key),
            };
            let otherwise = if r.kind == OpKind::Insert { Status::Exists } else { Status::NotFound };
            lane.statuses.push(if applied { Status::Ok } else { otherwise } as u8);
        }
    }
}

/// The requests of `ops`: keys [`crate::key`] of their ids, values [`value_of`] under `seed`.
pub fn requests<const K: usize, const V: usize>(ops: &[Op], seed: u64) -> Vec<Request<K, V>> {
    ops.par_iter()
        .map(|op| {
            let mut r = Request { kind: op.kind, key: [0; K], value: [0; V] };
            r.key.copy_from_slice(&crate::key(op.id, K));
            if op.kind.writes_value() {
                r.value.copy_from_slice(&value_of(op.id, seed, V));
            }
            r
        })
        .collect()
}

/// Calls `f` with the key and value widths as constants: the peer is compiled for
/// [`KEY_WIDTHS`] x [`VALUE_WIDTHS`]; other widths are an error.
pub fn with_widths<W: Widths>(key_bytes: usize, value_bytes: usize, f: W) -> Result<W::Out> {
    macro_rules! values {
        ($k:literal) => {
            match value_bytes {
                8 => Ok(f.call::<$k, 8>()),
                16 => Ok(f.call::<$k, 16>()),
                20 => Ok(f.call::<$k, 20>()),
                32 => Ok(f.call::<$k, 32>()),
                64 => Ok(f.call::<$k, 64>()),
                128 => Ok(f.call::<$k, 128>()),
                256 => Ok(f.call::<$k, 256>()),
                512 => Ok(f.call::<$k, 512>()),
                1024 => Ok(f.call::<$k, 1024>()),
                _ => Err(widths(key_bytes, value_bytes)),
            }
        };
    }
    match key_bytes {
        4 => values!(4),
        8 => values!(8),
        12 => values!(12),
        16 => values!(16),
        32 => values!(32),
        _ => Err(widths(key_bytes, value_bytes)),
    }
}

/// Whether the peer is built for `key_bytes`-byte keys and `value_bytes`-byte values (an error
/// naming the widths it is built for otherwise).
pub fn supports(key_bytes: usize, value_bytes: usize) -> Result<()> {
    struct Nothing;
    impl Widths for Nothing {
        type Out = ();
        fn call<const K: usize, const V: usize>(self) {}
    }
    with_widths(key_bytes, value_bytes, Nothing)
}

fn widths(key_bytes: usize, value_bytes: usize) -> Error {
    Error::InvalidConfig(format!(
        "cpu-map: {key_bytes}-byte keys and {value_bytes}-byte values: the peer is built for keys of {KEY_WIDTHS:?} bytes and values of {VALUE_WIDTHS:?}"
    ))
}

/// A computation generic over the key and value widths, for [`with_widths`].
pub trait Widths {
    /// Its result.
    type Out;
    /// Runs it for `K`-byte keys and `V`-byte values.
    fn call<const K: usize, const V: usize>(self) -> Self::Out;
}

/// The peer's memory traffic, modelled as an open-addressing table in host DRAM, each 64-byte
/// line one request: a search reads its group's control line and, on a hit, its entry's line;
/// a read hit also the lines of its value. An insert writes the control and entry lines and the
/// value; an update writes the value; a delete the control line. One atomic per operation for
/// the map's synchronisation.
pub fn traffic(value_bytes: usize, kind: OpKind, hit: bool) -> Traffic {
    let value_lines = value_bytes.div_ceil(64) as f64;
    let (reads, writes) = match (kind, hit) {
        (OpKind::Get, true) => (2.0 + value_lines, 0.0),
        (OpKind::Get | OpKind::Update | OpKind::Delete, false) => (1.0, 0.0),
        (OpKind::Insert, true) => (2.0, 0.0),
        (OpKind::Insert | OpKind::Upsert, false) => (1.0, 2.0 + value_lines),
        (OpKind::Update | OpKind::Upsert, true) => (2.0, value_lines),
        (OpKind::Delete, true) => (2.0, 1.0),
    };
    Traffic { reads, writes, atomics: 1.0, bytes: (reads + writes) * 64.0 }
}
