//! `cpu-map`: a strong CPU peer. Each batch is applied by all host threads to a well-known
//! concurrent hash map in host DRAM; in the suite the batch is in host memory, as a CPU
//! application holds it (the copies to and from the device are untimed, [`HostBatches`]). Volatile: nothing is persisted, so it bounds
//! what a host-side table can do without paying for persistence.
//!
//! The map is a parameter ([`HostMap`]): scc, papaya and dashmap each implement it, and the
//! suite runs them as `cpu-map` ([`Chosen`]: scc), `cpu-map-papaya` and `cpu-map-dashmap`, so
//! that the choice is measured on the host that runs the suite. Chosen on the H200 host (16
//! threads, 16 M records, 128-byte values, batch 65,536, BENCHMARKS.md): scc leads LOAD, A, B,
//! D and F under both Zipf 0.99 and uniform keys, by up to 4x over papaya on A; papaya leads
//! C by 8-16%.
//! Swapping the crate is one `impl HostMap` (and its `MapOps`) and the [`Chosen`] alias.
//!
//! # A batch
//!
//! The results are those of applying the batch's operations one by one in batch order: each
//! operation goes to the thread that owns its key (a hash of the key, independent of the map's
//! own), and each thread applies its operations in batch order. Operations on different keys
//! commute, so any interleaving of the threads gives the batch-order results. A batch that
//! only reads is cut into one run of consecutive operations per thread instead ([`Plan`]). Keys are held
//! inline (up to 32 bytes, zero-padded: the key width is fixed per table), values as boxed
//! word slices of the value width.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::systems::{HostBatches, System, Traffic};
use gphash::DeviceBatch;
use gphash::Gpu;
use gphash::{Error, OpKind, Result, Status};

/// A key, zero-padded to the widest key `cpu-map` holds.
pub type Key = [u32; KEY_WORDS];
/// Words of the widest key.
pub const KEY_WORDS: usize = 8;
/// A value: the value width's words.
pub type Value = Box<[u32]>;

/// The concurrent maps `cpu-map` can run on.
#[allow(clippy::len_without_is_empty)]
pub trait HostMap: Send + Sync + Sized {
    /// The map as one thread uses it for a batch (a pinned epoch guard, where the map has one).
    type Session<'a>: MapOps
    where
        Self: 'a;
    /// The crate, for the report.
    const CRATE: &'static str;
    /// An empty map with room for `capacity` keys.
    fn with_capacity(capacity: usize) -> Self;
    /// A session of the calling thread.
    fn session(&self) -> Self::Session<'_>;
    /// Keys held.
    fn len(&self) -> usize;
}

/// One thread's operations on a [`HostMap`].
pub trait MapOps {
    /// Copies the value of `key` into `out`; whether the key is present.
    fn get(&self, key: &Key, out: &mut [u32]) -> bool;
    /// Inserts `key` unless it is present; whether it was inserted.
    fn insert(&self, key: Key, value: &[u32]) -> bool;
    /// Inserts `key` or replaces its value.
    fn upsert(&self, key: Key, value: &[u32]);
    /// Replaces the value of `key` if it is present; whether it was.
    fn update(&self, key: Key, value: &[u32]) -> bool;
    /// Removes `key`; whether it was present.
    fn remove(&self, key: &Key) -> bool;
}

type Hasher = foldhash::fast::RandomState;

/// The map the suite runs.
pub type Chosen = scc::HashMap<Key, Value, Hasher>;

impl HostMap for papaya::HashMap<Key, Value, Hasher> {
    type Session<'a> = papaya::HashMapRef<'a, Key, Value, Hasher, papaya::LocalGuard<'a>>;
    const CRATE: &'static str = "papaya";
    fn with_capacity(capacity: usize) -> Self {
        papaya::HashMap::builder().capacity(capacity).hasher(Hasher::default()).build()
    }
    fn session(&self) -> Self::Session<'_> {
        self.pin()
    }
    fn len(&self) -> usize {
        papaya::HashMap::len(self)
    }
}

impl MapOps for papaya::HashMapRef<'_, Key, Value, Hasher, papaya::LocalGuard<'_>> {
    fn get(&self, key: &Key, out: &mut [u32]) -> bool {
        self.get(key).map(|v| out.copy_from_slice(v)).is_some()
    }
    fn insert(&self, key: Key, value: &[u32]) -> bool {
        self.try_insert_with(key, || value.into()).is_ok()
    }
    fn upsert(&self, key: Key, value: &[u32]) {
        self.insert(key, value.into());
    }
    fn update(&self, key: Key, value: &[u32]) -> bool {
        self.update(key, |_| value.into()).is_some()
    }
    fn remove(&self, key: &Key) -> bool {
        self.remove(key).is_some()
    }
}

impl HostMap for dashmap::DashMap<Key, Value, Hasher> {
    type Session<'a> = &'a Self;
    const CRATE: &'static str = "dashmap";
    fn with_capacity(capacity: usize) -> Self {
        dashmap::DashMap::with_capacity_and_hasher(capacity, Hasher::default())
    }
    fn session(&self) -> &Self {
        self
    }
    fn len(&self) -> usize {
        dashmap::DashMap::len(self)
    }
}

impl MapOps for &dashmap::DashMap<Key, Value, Hasher> {
    fn get(&self, key: &Key, out: &mut [u32]) -> bool {
        dashmap::DashMap::get(self, key).map(|v| out.copy_from_slice(&v)).is_some()
    }
    fn insert(&self, key: Key, value: &[u32]) -> bool {
        match self.entry(key) {
            dashmap::Entry::Vacant(e) => {
                e.insert(value.into());
                true
            }
            dashmap::Entry::Occupied(_) => false,
        }
    }
    fn upsert(&self, key: Key, value: &[u32]) {
        dashmap::DashMap::insert(self, key, value.into());
    }
    fn update(&self, key: Key, value: &[u32]) -> bool {
        self.get_mut(&key).map(|mut v| v.copy_from_slice(value)).is_some()
    }
    fn remove(&self, key: &Key) -> bool {
        dashmap::DashMap::remove(self, key).is_some()
    }
}

impl HostMap for scc::HashMap<Key, Value, Hasher> {
    type Session<'a> = &'a Self;
    const CRATE: &'static str = "scc";
    fn with_capacity(capacity: usize) -> Self {
        scc::HashMap::with_capacity_and_hasher(capacity, Hasher::default())
    }
    fn session(&self) -> &Self {
        self
    }
    fn len(&self) -> usize {
        scc::HashMap::len(self)
    }
}

impl MapOps for &scc::HashMap<Key, Value, Hasher> {
    fn get(&self, key: &Key, out: &mut [u32]) -> bool {
        self.read_sync(key, |_, v| out.copy_from_slice(v)).is_some()
    }
    fn insert(&self, key: Key, value: &[u32]) -> bool {
        self.insert_sync(key, value.into()).is_ok()
    }
    fn upsert(&self, key: Key, value: &[u32]) {
        self.upsert_sync(key, value.into());
    }
    fn update(&self, key: Key, value: &[u32]) -> bool {
        self.update_sync(&key, |_, v| v.copy_from_slice(value)).is_some()
    }
    fn remove(&self, key: &Key) -> bool {
        self.remove_sync(key).is_some()
    }
}

/// The `cpu-map` system over a map `M`.
pub struct CpuMapSystem<M: HostMap = Chosen> {
    table: Table<M>,
    host: HostBatches,
}

/// The map and the threads that apply batches to it.
struct Table<M> {
    map: M,
    key_words: usize,
    value_words: usize,
    pool: rayon::ThreadPool,
}

impl<M: HostMap> std::fmt::Debug for CpuMapSystem<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuMapSystem").field("map", &M::CRATE).field("threads", &self.threads()).finish()
    }
}

impl<M: HostMap> CpuMapSystem<M> {
    /// An empty map with room for `capacity` keys of `key_bytes` (4 to 32, a multiple of 4)
    /// and values of `value_bytes`, run by `threads` host threads (0 = all), fed from `gpu`.
    pub fn create(
        key_bytes: u32,
        value_bytes: u32,
        capacity: u64,
        gpu: Arc<Gpu>,
        threads: usize,
    ) -> Result<Self> {
        if key_bytes == 0 || !key_bytes.is_multiple_of(4) || key_bytes as usize > KEY_WORDS * 4 {
            return Err(Error::InvalidConfig(format!(
                "cpu-map: key width {key_bytes} bytes: must be a multiple of 4, 4 to {}",
                KEY_WORDS * 4
            )));
        }
        if value_bytes == 0 {
            return Err(Error::InvalidConfig("cpu-map: values must have at least one byte".into()));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("cpu-map {i}"))
            .build()
            .map_err(|e| Error::InvalidConfig(format!("cpu-map: starting its threads: {e}")))?;
        let table = Table {
            map: M::with_capacity(capacity as usize),
            key_words: key_bytes as usize / 4,
            value_words: value_bytes.div_ceil(4) as usize,
            pool,
        };
        let host = HostBatches::new(gpu, table.key_words, table.value_words);
        Ok(CpuMapSystem { table, host })
    }

    /// Host threads applying batches.
    pub fn threads(&self) -> usize {
        self.table.pool.current_num_threads()
    }

    /// Applies a batch held on the host (the encoding of [`DeviceBatch`]): its statuses and
    /// found values, as if applied one by one in batch order. A malformed batch changes nothing.
    pub fn execute(&self, kinds: &[u32], keys: &[u32], values: &[u32]) -> Result<(Vec<u32>, Vec<u32>)> {
        self.table.execute(kinds, keys, values)
    }
}

impl<M: HostMap> Table<M> {
    fn execute(&self, kinds: &[u32], keys: &[u32], values: &[u32]) -> Result<(Vec<u32>, Vec<u32>)> {
        let (n, kw, vw) = (kinds.len(), self.key_words, self.value_words);
        if keys.len() != n * kw {
            return Err(Error::InvalidConfig(format!(
                "cpu-map: {} key words for {n} operations",
                keys.len()
            )));
        }
        let mut ops = Vec::with_capacity(n);
        for (i, &k) in kinds.iter().enumerate() {
            let kind = OpKind::from_code(k)
                .ok_or_else(|| Error::InvalidConfig(format!("cpu-map: operation {i}: kind code {k}")))?;
            if kind.writes_value() && values.len() < (i + 1) * vw {
                return Err(Error::InvalidConfig(format!("cpu-map: operation {i} has no value")));
            }
            ops.push(kind);
        }
        let threads = self.pool.current_num_threads();
        let plan = Plan::new(&self.pool, &ops, keys, kw, threads);
        let mut statuses = vec![0u32; n];
        let mut found = vec![0u32; n * vw];
        let (out_s, out_f) = (as_atomic(&mut statuses), as_atomic(&mut found));
        let (map, ops, plan) = (&self.map, &ops, &plan);
        self.pool.broadcast(|ctx| {
            let session = map.session();
            let mut read = vec![0u32; vw];
            for i in plan.of(ctx.index()) {
                let mut key = [0u32; KEY_WORDS];
                key[..kw].copy_from_slice(&keys[i * kw..(i + 1) * kw]);
                let value = || &values[i * vw..(i + 1) * vw];
                let status = match ops[i] {
                    OpKind::Get => {
                        let hit = session.get(&key, &mut read);
                        if hit {
                            for (w, &v) in out_f[i * vw..(i + 1) * vw].iter().zip(&read) {
                                w.store(v, Ordering::Relaxed);
                            }
                        }
                        status(hit, Status::NotFound)
                    }
                    OpKind::Insert => status(session.insert(key, value()), Status::Exists),
                    OpKind::Upsert => {
                        session.upsert(key, value());
                        Status::Ok
                    }
                    OpKind::Update => status(session.update(key, value()), Status::NotFound),
                    OpKind::Delete => status(session.remove(&key), Status::NotFound),
                };
                out_s[i].store(status as u32, Ordering::Relaxed);
            }
        });
        Ok((statuses, found))
    }
}

/// Which operations each thread applies. A batch that only reads is cut into one run of
/// consecutive operations per thread (reads of a key commute). Otherwise each operation goes
/// to the thread that owns its key, in batch order, so that the operations of a key apply one
/// by one: the owners are computed on all threads, then the operations are listed owner by
/// owner (a counting sort), so that each thread walks only its own.
enum Plan {
    Runs { n: usize, threads: usize },
    Owned { order: Vec<u32>, starts: Vec<usize> },
}

impl Plan {
    fn new(pool: &rayon::ThreadPool, ops: &[OpKind], keys: &[u32], kw: usize, threads: usize) -> Plan {
        let n = ops.len();
        if ops.iter().all(|&k| k == OpKind::Get) {
            return Plan::Runs { n, threads };
        }
        let mut owners = vec![0u16; n];
        let chunk = n.div_ceil(threads).max(1);
        pool.install(|| {
            rayon::scope(|s| {
                for (c, owned) in owners.chunks_mut(chunk).enumerate() {
                    s.spawn(move |_| {
                        for (j, o) in owned.iter_mut().enumerate() {
                            let i = c * chunk + j;
                            *o = owner(&keys[i * kw..(i + 1) * kw], threads);
                        }
                    });
                }
            })
        });
        let mut starts = vec![0usize; threads + 1];
        for &o in &owners {
            starts[o as usize + 1] += 1;
        }
        for t in 0..threads {
            starts[t + 1] += starts[t];
        }
        let mut next = starts.clone();
        let mut order = vec![0u32; n];
        for (i, &o) in owners.iter().enumerate() {
            order[next[o as usize]] = i as u32;
            next[o as usize] += 1;
        }
        Plan::Owned { order, starts }
    }

    /// The operations of thread `t`, in batch order.
    fn of(&self, t: usize) -> Box<dyn Iterator<Item = usize> + '_> {
        match self {
            Plan::Runs { n, threads } => {
                let chunk = n.div_ceil(*threads);
                Box::new((t * chunk).min(*n)..((t + 1) * chunk).min(*n))
            }
            Plan::Owned { order, starts } => {
                Box::new(order[starts[t]..starts[t + 1]].iter().map(|&i| i as usize))
            }
        }
    }
}

/// The suite's name of the `cpu-map` system on the map crate `krate`.
pub fn cpu_map_name(krate: &str) -> &'static str {
    match krate {
        _ if krate == Chosen::CRATE => "cpu-map",
        "papaya" => "cpu-map-papaya",
        "dashmap" => "cpu-map-dashmap",
        _ => "cpu-map-scc",
    }
}

/// `Ok` where the operation applied, `otherwise` where not.
fn status(applied: bool, otherwise: Status) -> Status {
    if applied { Status::Ok } else { otherwise }
}

/// The thread owning `key` among `threads`.
fn owner(key: &[u32], threads: usize) -> u16 {
    let h =
        key.iter().fold(0x9e37_79b9_7f4a_7c15u64, |h, &w| (h ^ w as u64).wrapping_mul(0xff51_afd7_ed55_8ccd));
    (((h >> 32) * threads as u64) >> 32) as u16
}

/// Words shared by threads that each store to their own.
fn as_atomic(words: &mut [u32]) -> &[AtomicU32] {
    // SAFETY: AtomicU32 has the size and alignment of u32, and the exclusive borrow keeps any
    // other access out for as long as the atomic view lives.
    unsafe { &*(words as *mut [u32] as *const [AtomicU32]) }
}

impl<M: HostMap> System for CpuMapSystem<M> {
    fn name(&self) -> String {
        cpu_map_name(M::CRATE).to_string()
    }

    fn setting(&self) -> String {
        format!("{} host threads | {} in host DRAM, volatile", self.threads(), M::CRATE)
    }

    fn stage(&mut self, batch: &DeviceBatch) -> Result<()> {
        self.host.stage(batch)
    }

    fn run(&mut self, batch: &DeviceBatch) -> Result<()> {
        let table = &self.table;
        self.host.run(batch, |kinds, keys, values| table.execute(kinds, keys, values))
    }

    fn settle(&mut self, batch: &DeviceBatch) -> Result<()> {
        self.host.settle(batch)
    }

    fn len(&self) -> u64 {
        self.table.map.len() as u64
    }

    /// Modelled as an open-addressing table in host DRAM, each 64-byte line one request: a
    /// search reads its group's control line and, on a hit, its entry's line; a read hit also
    /// the lines of its value. An insert writes the control and entry lines and the value; an
    /// update writes the value; a delete the control line. One atomic per operation for the
    /// map's synchronisation.
    fn traffic(&self, kind: OpKind, hit: bool) -> Traffic {
        let value_lines = (self.table.value_words * 4).div_ceil(64) as f64;
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
}
