//! Batches of operations on host slices, their results, and the fold of a key's operations
//! into one net operation for ordered execution.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::protocol::{OpKind, Status};

/// A batch of operations with fixed-width keys and values, stored column-wise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    key_bytes: usize,
    value_bytes: usize,
    kinds: Vec<OpKind>,
    keys: Vec<u8>,
    values: Vec<u8>,
}

impl Batch {
    /// An empty batch for keys of `key_bytes` and values of `value_bytes`.
    pub fn new(key_bytes: usize, value_bytes: usize) -> Self {
        Batch { key_bytes, value_bytes, kinds: vec![], keys: vec![], values: vec![] }
    }

    /// An empty batch with room for `ops` operations.
    pub fn with_capacity(key_bytes: usize, value_bytes: usize, ops: usize) -> Self {
        Batch {
            key_bytes,
            value_bytes,
            kinds: Vec::with_capacity(ops),
            keys: Vec::with_capacity(ops * key_bytes),
            values: Vec::with_capacity(ops * value_bytes),
        }
    }

    /// Appends operations given as columns: one kind each, their keys concatenated, and one
    /// value each, concatenated (the values of operations that write none are ignored). Three
    /// copies, not one per operation: a server gathers its clients' requests this way.
    pub fn extend_from_columns(&mut self, kinds: &[OpKind], keys: &[u8], values: &[u8]) -> Result<()> {
        let (n, kb, vb) = (kinds.len(), self.key_bytes, self.value_bytes);
        if keys.len() != n * kb {
            return Err(Error::KeysCount { given: keys.len(), ops: n, key_bytes: kb });
        }
        if values.len() != n * vb {
            return Err(Error::ValuesLength { given: values.len(), keys: n, value_bytes: vb });
        }
        let start = self.kinds.len();
        self.kinds.extend_from_slice(kinds);
        self.keys.extend_from_slice(keys);
        self.values.extend_from_slice(values);
        // Operations without a value hold zeros here, as `push` leaves them.
        if !every(kinds, OpKind::writes_value) {
            for (i, _) in kinds.iter().enumerate().filter(|(_, k)| !k.writes_value()) {
                self.values[(start + i) * vb..(start + i + 1) * vb].fill(0);
            }
        }
        Ok(())
    }

    /// Appends one operation; `value` is required exactly for insert, upsert and update.
    pub fn push(&mut self, kind: OpKind, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        if key.len() != self.key_bytes {
            return Err(Error::KeyWidth { found: key.len(), expected: self.key_bytes });
        }
        match (kind.writes_value(), value) {
            (true, Some(v)) if v.len() == self.value_bytes => self.values.extend_from_slice(v),
            (true, Some(v)) => {
                return Err(Error::ValueSize { found: v.len(), expected: self.value_bytes });
            }
            (true, None) => {
                return Err(Error::ValueSize { found: 0, expected: self.value_bytes });
            }
            (false, None) => self.values.resize(self.values.len() + self.value_bytes, 0),
            (false, Some(_)) => {
                return Err(Error::InvalidConfig(format!("{kind:?} takes no value")));
            }
        }
        self.kinds.push(kind);
        self.keys.extend_from_slice(key);
        Ok(())
    }

    /// Appends a read.
    pub fn get(&mut self, key: &[u8]) -> Result<()> {
        self.push(OpKind::Get, key, None)
    }

    /// Appends an insert-if-absent.
    pub fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.push(OpKind::Insert, key, Some(value))
    }

    /// Appends an insert-or-overwrite.
    pub fn upsert(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.push(OpKind::Upsert, key, Some(value))
    }

    /// Appends an overwrite of a present key.
    pub fn update(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.push(OpKind::Update, key, Some(value))
    }

    /// Appends a removal.
    pub fn delete(&mut self, key: &[u8]) -> Result<()> {
        self.push(OpKind::Delete, key, None)
    }

    /// Builds a batch of one kind from concatenated keys (and values).
    pub fn of_kind(
        kind: OpKind,
        key_bytes: usize,
        value_bytes: usize,
        keys: &[u8],
        values: Option<&[u8]>,
    ) -> Result<Self> {
        if key_bytes == 0 || !keys.len().is_multiple_of(key_bytes) {
            return Err(Error::KeysLength { given: keys.len(), key_bytes });
        }
        let n = keys.len() / key_bytes;
        let values = match (kind.writes_value(), values) {
            (true, Some(v)) if v.len() == n * value_bytes => v.to_vec(),
            (true, v) => {
                let given = v.map_or(0, <[u8]>::len);
                return Err(Error::ValuesLength { given, keys: n, value_bytes });
            }
            (false, None) => vec![0; n * value_bytes],
            (false, Some(_)) => {
                return Err(Error::InvalidConfig(format!("{kind:?} takes no value")));
            }
        };
        Ok(Batch { key_bytes, value_bytes, kinds: vec![kind; n], keys: keys.to_vec(), values })
    }

    /// Operations in the batch.
    pub fn len(&self) -> usize {
        self.kinds.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// Operation `i`: kind, key, value (zeros for operations without one).
    pub fn op(&self, i: usize) -> (OpKind, &[u8], &[u8]) {
        (
            self.kinds[i],
            &self.keys[i * self.key_bytes..(i + 1) * self.key_bytes],
            &self.values[i * self.value_bytes..(i + 1) * self.value_bytes],
        )
    }

    /// Key width in bytes.
    pub fn key_bytes(&self) -> usize {
        self.key_bytes
    }

    /// Value size in bytes.
    pub fn value_bytes(&self) -> usize {
        self.value_bytes
    }

    /// The batch cut into `parts` batches by `route` (the part of each operation), each with
    /// its operations in batch order, and where each operation went. On all threads: each
    /// stretch of the batch counts its operations per part, which gives it its place in each
    /// part, and then copies them there.
    pub(crate) fn split(&self, route: Vec<u32>, parts: usize) -> (Vec<Batch>, Cut) {
        let (kb, vb) = (self.key_bytes, self.value_bytes);
        let stretch = route.len().div_ceil(4 * rayon::current_num_threads()).max(4096);
        let counts: Vec<Vec<usize>> = route
            .par_chunks(stretch)
            .map(|c| {
                c.iter().fold(vec![0; parts], |mut k, &r| {
                    k[r as usize] += 1;
                    k
                })
            })
            .collect();
        // Each stretch's first place in each part, and the parts' sizes.
        let mut sizes = vec![0usize; parts];
        let starts: Vec<Vec<usize>> = (counts.iter())
            .map(|k| {
                let start = sizes.clone();
                sizes.iter_mut().zip(k).for_each(|(s, n)| *s += n);
                start
            })
            .collect();
        let mut out: Vec<Batch> = (sizes.par_iter())
            .map(|&n| Batch {
                key_bytes: kb,
                value_bytes: vb,
                kinds: vec![OpKind::Get; n],
                keys: vec![0; n * kb],
                values: vec![0; n * vb],
            })
            .collect();
        // Each part's columns cut into the stretches' shares of them.
        // A stretch's share of one part: its kinds, keys and values.
        type Share<'a> = (&'a mut [OpKind], &'a mut [u8], &'a mut [u8]);
        let mut shares: Vec<Vec<Share<'_>>> = counts.iter().map(|_| vec![]).collect();
        for (p, b) in out.iter_mut().enumerate() {
            let (mut kinds, mut keys, mut values) = (&mut b.kinds[..], &mut b.keys[..], &mut b.values[..]);
            for (c, k) in counts.iter().enumerate() {
                let n = k[p];
                let (kind, rest) = std::mem::take(&mut kinds).split_at_mut(n);
                let (key, krest) = std::mem::take(&mut keys).split_at_mut(n * kb);
                let (value, vrest) = std::mem::take(&mut values).split_at_mut(n * vb);
                (kinds, keys, values) = (rest, krest, vrest);
                shares[c].push((kind, key, value));
            }
        }
        let mut rank = vec![0u32; route.len()];
        (route.par_chunks(stretch), rank.par_chunks_mut(stretch), shares, starts)
            .into_par_iter()
            .enumerate()
            .for_each(|(c, (route, rank, mut shares, starts))| {
                let mut filled = vec![0usize; parts];
                for (j, (&r, rank)) in route.iter().zip(rank).enumerate() {
                    let (i, p) = (c * stretch + j, r as usize);
                    let (kinds, keys, values) = &mut shares[p];
                    let at = filled[p];
                    kinds[at] = self.kinds[i];
                    keys[at * kb..(at + 1) * kb].copy_from_slice(&self.keys[i * kb..(i + 1) * kb]);
                    values[at * vb..(at + 1) * vb].copy_from_slice(&self.values[i * vb..(i + 1) * vb]);
                    *rank = (starts[p] + at) as u32;
                    filled[p] += 1;
                }
            });
        (out, Cut { route, rank })
    }

    /// Operations that may add a key (inserts and upserts).
    pub(crate) fn adds(&self) -> usize {
        self.kinds.iter().filter(|&&k| matches!(k, OpKind::Insert | OpKind::Upsert)).count()
    }

    /// Whether every operation is a read: the call changes nothing.
    pub(crate) fn read_only(&self) -> bool {
        every(&self.kinds, |k| k == OpKind::Get)
    }

    /// The batch in kernel form, into `e` (whose allocations are reused).
    pub fn encode(&self, e: &mut Encoded) {
        self.encode_part(Part::whole(self), e)
    }

    /// Operations `part` in kernel form, into `e` (whose allocations are reused).
    pub(crate) fn encode_part(&self, part: Part, e: &mut Encoded) {
        let (kb, vb) = (self.key_bytes, self.value_bytes);
        let padded = vb.div_ceil(4) * 4;
        e.kinds.clear();
        e.keys.clear();
        e.values.clear();
        // Below, bytes are copied into words as they are: the host is little-endian, as the
        // device and the pool are.
        match part {
            Part::Ops { start, end } => {
                crate::bulk::refill(&mut e.kinds, bytemuck::cast_slice(&self.kinds[start..end]));
                // Whole words (a key width that is not is refused by `check_widths` first).
                let keys = &self.keys[start * kb..end * kb];
                crate::bulk::refill(&mut e.keys, &keys[..keys.len() / 4 * 4]);
                if !every(&self.kinds[start..end], |k| !k.writes_value()) {
                    // Operations that write no value have zeros in `self.values`.
                    let own = &self.values[start * vb..end * vb];
                    if padded == vb {
                        crate::bulk::refill(&mut e.values, own);
                    } else {
                        e.values.resize((end - start) * padded / 4, 0);
                        let values: &mut [u8] = bytemuck::cast_slice_mut(&mut e.values);
                        for (to, from) in values.chunks_exact_mut(padded).zip(own.chunks_exact(vb)) {
                            to[..vb].copy_from_slice(from);
                        }
                    }
                }
            }
            Part::Planned(plan) => {
                e.kinds.extend(plan.iter().map(|p| p.kind as u32));
                e.keys.resize(plan.len() * kb / 4, 0);
                let keys: &mut [u8] = bytemuck::cast_slice_mut(&mut e.keys);
                for (to, p) in keys.chunks_exact_mut(kb).zip(plan) {
                    to.copy_from_slice(&self.keys[p.key * kb..(p.key + 1) * kb]);
                }
                if plan.iter().any(|p| p.kind.writes_value()) {
                    // Operations that write no value get zero words.
                    e.values.resize(plan.len() * padded / 4, 0);
                    let values: &mut [u8] = bytemuck::cast_slice_mut(&mut e.values);
                    for (to, p) in values.chunks_exact_mut(padded).zip(plan) {
                        if p.kind.writes_value() {
                            to[..vb].copy_from_slice(&self.values[p.value * vb..(p.value + 1) * vb]);
                        }
                    }
                }
            }
        }
        let get = OpKind::Get as u32;
        e.reads = if e.kinds.len() < PARALLEL_COUNT {
            e.kinds.iter().filter(|&&k| k == get).count()
        } else {
            e.kinds.par_iter().filter(|&&k| k == get).count()
        };
    }

    /// The batch's operations grouped by key, in batch order.
    pub(crate) fn key_groups(&self) -> KeyGroups {
        let (n, kb) = (self.len(), self.key_bytes);
        // Most batches repeat no key: a pass through a hash set says so without the sort, a
        // large share of an insert batch's host time (docs/lab/latency.md, "A small batch's
        // host time by function"; docs/lab/host-path.md, "A batch's keys told distinct"). The
        // set may also say "maybe" of distinct keys (too many probes, hashes alike in the bits
        // it keeps): the chains, or the sort, decide.
        let hashes = if n < PARALLEL_GROUPING {
            let hashes: Vec<u64> = self.keys.chunks_exact(kb).map(key_hash).collect();
            if distinct_hashes(hashes.iter().copied()) {
                return KeyGroups::none(n);
            }
            // Some key repeats (a server's batch of 1,000 SETs on a million keys does, more
            // often than not): its operations chained by hash, not sorted.
            if let Some(groups) = self.chained_groups(&hashes) {
                return groups;
            }
            Some(hashes)
        } else {
            if distinct_hashes_on_all_threads(n, |i| key_hash(&self.keys[i * kb..(i + 1) * kb])) {
                return KeyGroups::none(n);
            }
            None
        };
        self.sorted_groups(hashes)
    }

    /// [`Batch::key_groups`] on one thread from the keys' `hashes` (any: a test gives equal
    /// hashes to different keys): each operation chained to the one before it of the same hash
    /// through a linear-probing table of each hash's first and last operation. `None` when the
    /// probes pass 8 a hash on average, as in [`distinct_hashes`]: the caller sorts.
    fn chained_groups(&self, hashes: &[u64]) -> Option<KeyGroups> {
        const NONE: u32 = u32::MAX;
        let mask = table_words(hashes.len()) - 1;
        let (mut first, mut last) = (vec![NONE; mask + 1], vec![NONE; mask + 1]);
        let mut next = vec![NONE; hashes.len()];
        // The table's slots whose hash has several operations.
        let mut chained = vec![];
        let mut probes_left = 8 * hashes.len();
        for (i, &h) in (0..u32::MAX).zip(hashes) {
            let mut s = slot(h, mask);
            loop {
                let f = first[s];
                if f == NONE {
                    (first[s], last[s]) = (i, i);
                    break;
                }
                if hashes[f as usize] == h {
                    if last[s] == f {
                        chained.push(s);
                    }
                    next[last[s] as usize] = i;
                    last[s] = i;
                    break;
                }
                if probes_left == 0 {
                    return None;
                }
                probes_left -= 1;
                s = (s + 1) & mask;
            }
        }
        let chain = |s: usize| {
            std::iter::successors(Some(first[s]), |&i| Some(next[i as usize]).filter(|&j| j != NONE))
        };
        Some(self.groups_of_runs(chained.into_iter().map(chain)))
    }

    /// [`Batch::key_groups`] by sorting, whatever the keys: from the keys' `hashes` when given.
    fn sorted_groups(&self, hashes: Option<Vec<u64>>) -> KeyGroups {
        let (n, kb) = (self.len(), self.key_bytes);
        // Each operation's key hash (its top half) over its index, sorted (whole: the low halves
        // are distinct): the operations of a key are adjacent, in batch order. On all host
        // threads for large batches.
        let same_hash = |a: &u64, b: &u64| (a ^ b) >> 32 == 0;
        let pair = |(i, h): (usize, &mut u64)| *h = *h & !u64::from(u32::MAX) | i as u64;
        let mut pairs = hashes.unwrap_or_else(|| self.keys.par_chunks_exact(kb).map(key_hash).collect());
        if n < PARALLEL_SORT {
            pairs.iter_mut().enumerate().for_each(pair);
            pairs.sort_unstable();
        } else {
            pairs.par_iter_mut().enumerate().for_each(pair);
            pairs.par_sort_unstable();
        }
        let runs = pairs.chunk_by(same_hash).filter(|run| run.len() > 1);
        self.groups_of_runs(runs.map(|run| run.iter().map(|&p| p as u32)))
    }

    /// The groups of [`Batch::key_groups`] from `runs` of operations (each in batch order)
    /// whose keys' hashes are equal. A run holds one key's operations or, rarely, several
    /// keys' whose hashes collide: a stable sort by key separates them.
    fn groups_of_runs(&self, runs: impl Iterator<Item = impl Iterator<Item = u32>>) -> KeyGroups {
        let (n, kb) = (self.len(), self.key_bytes);
        let key = |i: &u32| &self.keys[*i as usize * kb..(*i as usize + 1) * kb];
        // Every group's operations, and where each group is in them.
        let (mut ops, mut spans) = (vec![], vec![]);
        let mut run_ops = vec![];
        for run in runs {
            run_ops.clear();
            run_ops.extend(run);
            if !run_ops.iter().all(|i| key(i) == key(&run_ops[0])) {
                run_ops.sort_by(|a, b| key(a).cmp(key(b)));
            }
            for group in run_ops.chunk_by(|a, b| key(a) == key(b)).filter(|g| g.len() > 1) {
                spans.push(ops.len()..ops.len() + group.len());
                ops.extend_from_slice(group);
            }
        }
        // In the order of their first operations, whichever way they were found.
        spans.sort_unstable_by_key(|span| ops[span.start]);
        let mut groups = KeyGroups::none(n);
        let mut grouped = vec![false; n];
        for span in spans {
            groups.repeated.extend_from_slice(&ops[span.clone()]);
            groups.ends.push(groups.repeated.len() as u32);
            ops[span].iter().for_each(|&i| grouped[i as usize] = true);
        }
        if groups.repeats() {
            groups.single = (0..u32::MAX).zip(&grouped).filter(|&(_, &g)| !g).map(|(i, _)| i).collect();
        }
        groups
    }

    /// Whether `ops`, the operations of one key in batch order, start with an upsert and
    /// delete nothing: the key then exists after the first and ends with the last value
    /// written, whatever it held before.
    pub(crate) fn overwrites(&self, ops: &[u32]) -> bool {
        self.kinds[ops[0] as usize] == OpKind::Upsert
            && ops.iter().all(|&i| self.kinds[i as usize] != OpKind::Delete)
    }

    /// Applies `ops`, the operations of one key in batch order, one by one from the key's
    /// value before them (`before`, `None` when absent): writes each one's result into
    /// `result`, and returns the one operation that takes the key from `before` to its final
    /// state, with the status it must give (`None` when the key ends as it began). Its `key`
    /// is `ops[0]`.
    pub(crate) fn fold_key(
        &self,
        ops: &[u32],
        before: Option<&[u8]>,
        result: &mut BatchResult,
    ) -> Option<Planned> {
        /// Where the key's current value is.
        #[derive(Clone, Copy)]
        enum Value {
            Before,
            Absent,
            Written(usize),
        }
        let mut value = if before.is_some() { Value::Before } else { Value::Absent };
        for i in ops.iter().map(|&i| i as usize) {
            let current = match value {
                Value::Before => before,
                Value::Absent => None,
                Value::Written(w) => Some(self.op(w).2),
            };
            let (status, found) = match (self.kinds[i], current) {
                (OpKind::Get, Some(v)) => (Status::Ok, Some(v)),
                (OpKind::Get | OpKind::Update | OpKind::Delete, None) => (Status::NotFound, None),
                (OpKind::Insert, Some(_)) => (Status::Exists, None),
                (OpKind::Insert | OpKind::Upsert | OpKind::Update, _) => {
                    value = Value::Written(i);
                    (Status::Ok, None)
                }
                (OpKind::Delete, Some(_)) => {
                    value = Value::Absent;
                    (Status::Ok, None)
                }
            };
            result.set(i, status, found);
        }
        let key = ops[0] as usize;
        let net = |kind, value| Planned { kind, key, value, expect: Some(Status::Ok) };
        match (before, value) {
            (_, Value::Before) | (None, Value::Absent) => None,
            (Some(_), Value::Absent) => Some(net(OpKind::Delete, key)),
            (Some(old), Value::Written(w)) if old == self.op(w).2 => None,
            (Some(_), Value::Written(w)) => Some(net(OpKind::Update, w)),
            (None, Value::Written(w)) => Some(net(OpKind::Insert, w)),
        }
    }
}

/// A batch's operations by key: those whose key no other operation has, and the others'.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct KeyGroups {
    /// Operations whose key no other operation has, in batch order; empty when no key repeats
    /// (every operation is one then).
    single: Vec<u32>,
    /// The operations of each key that several operations have, key after key (in the order
    /// of their first operations), each key's in batch order.
    repeated: Vec<u32>,
    /// Where each key's operations end in `repeated`.
    ends: Vec<u32>,
    /// Operations in the batch.
    len: usize,
}

impl KeyGroups {
    /// `n` operations, none of whose keys repeats.
    fn none(n: usize) -> Self {
        KeyGroups { single: vec![], repeated: vec![], ends: vec![], len: n }
    }

    /// Whether some key has several operations.
    pub(crate) fn repeats(&self) -> bool {
        !self.ends.is_empty()
    }

    /// Operations whose key no other operation has, in batch order.
    pub(crate) fn single(&self) -> impl Iterator<Item = usize> + '_ {
        let all = if self.repeats() { 0..0 } else { 0..self.len };
        self.single.iter().map(|&i| i as usize).chain(all)
    }

    /// The operations of each key that several operations have, in batch order.
    pub(crate) fn repeated(&self) -> impl Iterator<Item = &[u32]> + '_ {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(&self.ends).map(|(start, &end)| &self.repeated[start as usize..end as usize])
    }
}

/// Whether every one of `kinds` satisfies `f`, without an early exit inside each stretch of
/// 4,096: a loop that may stop at any element is not vectorised, and was slow over large
/// batches (docs/lab/host-path.md, "Large host batches encoded and decoded on all host
/// threads").
fn every(kinds: &[OpKind], f: impl Fn(OpKind) -> bool) -> bool {
    kinds.chunks(4096).all(|c| c.iter().fold(true, |all, &k| all & f(k)))
}

/// Operations from which a batch's keys are told distinct on all host threads. Below it one thread is
/// faster: waking the threads costs more than they save (docs/lab/host-path.md, "A batch's keys
/// told distinct").
const PARALLEL_GROUPING: usize = 1 << 16;

/// Operations from which a batch whose keys may repeat sorts them on all host threads.
const PARALLEL_SORT: usize = 1 << 14;

/// Operations from which a part's results are decoded on all host threads.
const PARALLEL_OPS: usize = 1 << 16;

/// Operations from which an encoded part's reads are counted on all host threads (at 65,536,
/// encoding on all threads of the H200's host took longer than on one: docs/lab/host-path.md,
/// "Large host batches encoded and decoded on all host threads").
const PARALLEL_COUNT: usize = 1 << 18;

/// Operations a task decodes in a part decoded on all host threads.
const STRETCH_OPS: usize = 1 << 14;

/// A stretch of a part's results to decode: the kernels' status codes, the operations' kinds,
/// and where their statuses, read flags and values go.
type Stretch<'a> = (&'a [u32], &'a [OpKind], &'a mut [Status], &'a mut [bool], &'a mut [u8]);

/// Whether the `hashes` (64-bit, well mixed: 32 bits would collide for a batch of 2^18 distinct
/// keys) are pairwise distinct: linear probing in a table of at least twice their number, a
/// slot's word the hash (0: empty; the hash 0 has a flag of its own). `false` also when the
/// probes pass 8 a hash on average: hashes chosen to share their slots' bits (keys picked by a
/// client) would make the pass quadratic, and the caller then sorts, which never is.
fn distinct_hashes(hashes: impl ExactSizeIterator<Item = u64>) -> bool {
    let mut probes_left = 8 * hashes.len();
    let mask = table_words(hashes.len()) - 1;
    let mut table = vec![0u64; mask + 1];
    let mut zero = false;
    for h in hashes {
        if h == 0 {
            if std::mem::replace(&mut zero, true) {
                return false;
            }
            continue;
        }
        let mut i = slot(h, mask);
        while table[i] != 0 {
            if table[i] == h || probes_left == 0 {
                return false;
            }
            probes_left -= 1;
            i = (i + 1) & mask;
        }
        table[i] = h;
    }
    true
}

/// The words of a table for `n` hashes: a power of two, at least twice their number.
fn table_words(n: usize) -> usize {
    (n * 2).next_power_of_two().max(2)
}

/// The slot where a hash's probes start in a table of `mask + 1` words (a power of two): its
/// top bits, which a multiply mixes best; the low ones of sequential integer keys' hashes made
/// runs of more than [`MAX_PROBES`] words.
fn slot(hash: u64, mask: usize) -> usize {
    (hash >> (u64::BITS - mask.count_ones())) as usize & mask
}

/// [`distinct_hashes`] on all host threads for the `n` hashes `hash(0..n)`, in the table kept
/// between calls ([`HashTable::distinct`]).
fn distinct_hashes_on_all_threads(n: usize, hash: impl Fn(usize) -> u64 + Sync) -> bool {
    let mut table = match shared_set() {
        Some(mut shared) => shared.take_if_it_holds(table_words(n)),
        // Another thread's call has it.
        None => HashTable::default(),
    };
    let distinct = table.distinct(n, hash);
    if let Some(mut shared) = shared_set() {
        shared.keep(table);
    }
    distinct
}

/// [`SHARED_SET`], unless another thread holds it. A panic while it was held (none can, in
/// `take` and `keep`) left a table that is still a table: the lock's poison is ignored.
fn shared_set() -> Option<MutexGuard<'static, HashTable>> {
    match SHARED_SET.try_lock() {
        Ok(shared) => Some(shared),
        Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// Puts hash `h` into `table` (of `mask + 1` words, shared by threads) in `generation`: `Err`
/// when it finds `h` there, or after [`MAX_PROBES`] probes. Two equal hashes follow the same
/// probes, so the second finds the first's word, or loses the swap to it and then finds it.
fn insert(table: &[AtomicU64], mask: usize, generation: u64, h: u64) -> std::result::Result<(), ()> {
    let want = generation << GENERATION_SHIFT | h & HASH_BITS;
    let mut at = slot(h, mask);
    let mut probes = 0;
    while probes < MAX_PROBES {
        let word = table[at].load(Ordering::Relaxed);
        if word == want {
            return Err(());
        }
        // A word of another generation is empty in this one.
        if word >> GENERATION_SHIFT != generation {
            match table[at].compare_exchange(word, want, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                // Taken meanwhile: look at it again.
                Err(_) => continue,
            }
        }
        probes += 1;
        at = (at + 1) & mask;
    }
    Err(())
}

/// A table of [`distinct_hashes_on_all_threads`], kept between calls so that a large batch's
/// check neither allocates nor clears one: a word is a hash's low 48 bits under a 16-bit
/// generation, each call one more, and words of other generations are empty.
#[derive(Default)]
struct HashTable {
    words: Vec<AtomicU64>,
    generation: u64,
}

impl HashTable {
    /// Whether the `n` hashes `hash(0..n)` are pairwise distinct, on all host threads: each
    /// goes into the table with a compare-and-swap. Two equal hashes follow the same probes, so
    /// the second finds the first's word, or loses the swap to it. `false` also past
    /// [`MAX_PROBES`] probes for one hash, or when two hashes agree in the 48 bits a word keeps
    /// (the caller's sort decides).
    fn distinct(&mut self, n: usize, hash: impl Fn(usize) -> u64 + Sync) -> bool {
        let words = table_words(n);
        let generation = self.next_generation(words);
        let (table, mask) = (&self.words[..words], words - 1);
        let insert = |h: u64| insert(table, mask, generation, h);
        let stretches = (0..n.div_ceil(STRETCH_HASHES)).into_par_iter();
        let distinct = stretches.try_for_each(|stretch| {
            // The words for hashes a few ahead are asked for before they are needed: the table
            // is larger than the caches, and each probe a miss.
            let ops = stretch * STRETCH_HASHES..n.min((stretch + 1) * STRETCH_HASHES);
            let hashes: Vec<u64> = ops.map(&hash).collect();
            for (k, &h) in hashes.iter().enumerate() {
                if let Some(&ahead) = hashes.get(k + PREFETCH_HASHES) {
                    crate::bulk::prefetch(&table[slot(ahead, mask)]);
                }
                insert(h)?;
            }
            Ok::<(), ()>(())
        });
        distinct.is_ok()
    }

    /// This table, taken (it is left empty) if it has at least `words` words; else a new one.
    fn take_if_it_holds(&mut self, words: usize) -> HashTable {
        if self.words.len() >= words { std::mem::take(self) } else { HashTable::default() }
    }

    /// Readies the table for a call on its first `words` words: its next generation, after
    /// the table is made (on all threads: zeroing 16 MiB for 2^20 operations on one would take
    /// as long as the check) or, once the generations run out, cleared.
    fn next_generation(&mut self, words: usize) -> u64 {
        if self.words.len() < words {
            self.words = (0..words).into_par_iter().map(|_| AtomicU64::new(0)).collect();
            self.generation = 0;
        }
        if self.generation == u64::from(u16::MAX) {
            self.words.par_iter().for_each(|w| w.store(0, Ordering::Relaxed));
            self.generation = 0;
        }
        self.generation += 1;
        self.generation
    }

    /// Keeps `table` as the shared one unless it is too large to keep, or smaller than it.
    fn keep(&mut self, table: HashTable) {
        if table.words.len() <= KEPT_WORDS && table.words.len() >= self.words.len() {
            *self = table;
        }
    }
}

/// The table kept between calls of all indexes of the process (one at a time takes it).
static SHARED_SET: Mutex<HashTable> = Mutex::new(HashTable { words: Vec::new(), generation: 0 });

/// Where a word of the shared table keeps its generation, and the hash bits below it.
const GENERATION_SHIFT: u32 = 48;
const HASH_BITS: u64 = (1 << GENERATION_SHIFT) - 1;

/// The largest table kept between calls (32 MiB: batches of up to 2^21 operations).
const KEPT_WORDS: usize = 1 << 22;

/// Hashes a task of [`distinct_hashes_on_all_threads`] inserts, and how far ahead of its
/// insertion a hash's word is asked for.
const STRETCH_HASHES: usize = 1 << 12;
const PREFETCH_HASHES: usize = 16;

/// The most slots [`distinct_hashes_on_all_threads`] probes for one hash before it gives up (the
/// caller sorts): a table at most half full rarely has runs this long unless the hashes were
/// chosen to share their slots' bits.
const MAX_PROBES: usize = 64;

/// A hash of a key that every bit of it moves, from its 8-byte words (the last one
/// zero-padded).
fn key_hash(key: &[u8]) -> u64 {
    // A folded multiply (the high and low halves of a 128-bit product) per word.
    let mix = |h: u64, word: u64| {
        let product = u128::from(h ^ word) * 0x9E37_79B9_7F4A_7C15;
        (product as u64) ^ (product >> 64) as u64
    };
    let mut words = key.chunks_exact(8);
    let mut h = words.by_ref().fold(0, |h, w| mix(h, u64::from_le_bytes(w.try_into().unwrap())));
    if !words.remainder().is_empty() {
        let mut last = [0; 8];
        last[..words.remainder().len()].copy_from_slice(words.remainder());
        h = mix(h, u64::from_le_bytes(last));
    }
    h
}

/// One operation of an engine batch that runs (a part of) a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Planned {
    /// What the engine does.
    pub kind: OpKind,
    /// The batch operation whose key it uses, and where its result goes.
    pub key: usize,
    /// The batch operation whose value it writes (for kinds that write one).
    pub value: usize,
    /// `Some(status)`: the net change of a key that several operations of the batch share,
    /// whose result must be `status` and goes nowhere.
    pub expect: Option<Status>,
}

impl Planned {
    /// Operation `i` of `batch`, as it is.
    pub(crate) fn own(batch: &Batch, i: usize) -> Self {
        Planned { kind: batch.kinds[i], key: i, value: i, expect: None }
    }
}

/// The operations of one engine batch.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Part<'a> {
    /// Operations `start..end` of the batch, as they are.
    Ops { start: usize, end: usize },
    /// These.
    Planned(&'a [Planned]),
}

impl Part<'_> {
    /// Every operation of `batch`, as it is.
    pub(crate) fn whole(batch: &Batch) -> Self {
        Part::Ops { start: 0, end: batch.len() }
    }

    /// Operations in the part.
    pub(crate) fn len(&self) -> usize {
        match self {
            Part::Ops { start, end } => end - start,
            Part::Planned(p) => p.len(),
        }
    }
}

/// A batch in kernel form: operation codes, key words, value words (zero-padded to whole words).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Encoded {
    /// One [`OpKind`] code per operation.
    pub kinds: Vec<u32>,
    /// `key_words` words per operation.
    pub keys: Vec<u32>,
    /// `value_words` words per operation (zero for operations without a value); empty when no
    /// operation carries a value.
    pub values: Vec<u32>,
    /// The reads among `kinds`, counted by [`Batch::encode`] (which every field comes from):
    /// the engine asks whether a batch reads, and only reads, several times a batch.
    reads: usize,
}

impl Encoded {
    /// Operations in the batch.
    pub fn len(&self) -> usize {
        self.kinds.len()
    }

    /// Whether the batch has no operations.
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// Whether every operation is a read: no phase B, nothing to persist.
    pub fn read_only(&self) -> bool {
        self.reads == self.kinds.len()
    }

    /// Whether some operation is a read (whose value must be read back).
    pub fn has_reads(&self) -> bool {
        self.reads > 0
    }
}

/// Where [`Batch::split`] put each operation of a batch: its part, and its place there.
pub(crate) struct Cut {
    route: Vec<u32>,
    rank: Vec<u32>,
}

/// Results of a batch: a status per operation and the values of successful reads.
#[derive(Clone, Debug)]
pub struct BatchResult {
    /// One status per operation, in batch order.
    pub statuses: Vec<Status>,
    /// A value's room per operation once some operation has read one; empty until then, so
    /// that a batch of writes fills no values (zeroing them cost a measurable share of a
    /// server's batch of SETs: docs/lab/server.md, "The server's write batches").
    values: Vec<u8>,
    value_bytes: usize,
    reads: Vec<bool>,
}

/// Equal results: the same statuses, and the same values where operations read one.
impl PartialEq for BatchResult {
    fn eq(&self, other: &Self) -> bool {
        self.statuses == other.statuses
            && self.reads == other.reads
            && self.value_bytes == other.value_bytes
            && (0..self.len()).all(|i| self.value(i) == other.value(i))
    }
}

impl Eq for BatchResult {}

impl BatchResult {
    pub(crate) fn new(n: usize, value_bytes: usize) -> Self {
        BatchResult {
            statuses: crate::bulk::filled(Status::NotFound, n),
            values: vec![],
            value_bytes,
            reads: crate::bulk::filled(false, n),
        }
    }

    /// Every operation's room for a value, made when first asked for.
    fn values_mut(&mut self) -> &mut [u8] {
        if self.values.is_empty() {
            self.values = crate::bulk::filled(0, self.statuses.len() * self.value_bytes);
        }
        &mut self.values
    }

    /// Stores the results of the operations of `part` from kernel output: `statuses` holds one
    /// code per operation, `values` `value_words` words per operation or nothing when no
    /// operation reads. An invalid code, a missing result, or a net change whose status is not
    /// the one expected is an `Inconsistent` error.
    pub(crate) fn scatter(
        &mut self,
        batch: &Batch,
        part: Part,
        statuses: &[u32],
        values: &[u32],
    ) -> Result<()> {
        let n = part.len();
        let vb = self.value_bytes;
        let padded = vb.div_ceil(4) * 4;
        let bytes: &[u8] = bytemuck::cast_slice(values);
        if statuses.len() != n || !(bytes.is_empty() || bytes.len() == n * padded) {
            return Err(Error::Inconsistent(format!(
                "{} statuses and {} value bytes for {n} operations",
                statuses.len(),
                bytes.len()
            )));
        }
        let decode = |code: u32, kind: OpKind| {
            Status::from_code(code)
                .ok_or_else(|| Error::Inconsistent(format!("status code {code} for a {kind:?}")))
        };
        // The value operation `j` read, if it is a read that found its key.
        let found = |j: usize, kind: OpKind, status: Status| match (kind, status) {
            (OpKind::Get, Status::Ok) if bytes.is_empty() => {
                Err(Error::Inconsistent("a read found its key but no value came back".into()))
            }
            (OpKind::Get, Status::Ok) => Ok(Some(&bytes[j * padded..j * padded + vb])),
            _ => Ok(None),
        };
        match part {
            Part::Ops { start, end } => {
                let bulk = !bytes.is_empty() && padded == vb;
                if bulk {
                    // Values of operations that are not successful reads are never handed out.
                    // The whole batch's go straight into a new vector: each byte written once.
                    if self.values.is_empty() && start == 0 && end == self.statuses.len() {
                        crate::bulk::refill(&mut self.values, bytes);
                    } else {
                        crate::bulk::copy(&mut self.values_mut()[start * vb..end * vb], bytes);
                    }
                }
                // A stretch of the part's operations from its `first`: their statuses, whether
                // they read a value, and (when not copied in bulk above) the values.
                let stretch = |first: usize, (codes, kinds, out, reads, values): Stretch<'_>| {
                    for (j, ((&code, &kind), (status, read))) in
                        codes.iter().zip(kinds).zip(out.iter_mut().zip(reads)).enumerate()
                    {
                        *status = decode(code, kind)?;
                        let value = found(first + j, kind, *status)?;
                        *read = value.is_some();
                        if let Some(v) = value.filter(|_| !bulk) {
                            values[j * vb..(j + 1) * vb].copy_from_slice(v);
                        }
                    }
                    Ok(())
                };
                let kinds = &batch.kinds[start..end];
                // Without values back no operation reads one (`found` says so first).
                if !bytes.is_empty() {
                    self.values_mut();
                }
                let (out, reads) = (&mut self.statuses[start..end], &mut self.reads[start..end]);
                let values: &mut [u8] = match self.values.is_empty() {
                    true => &mut [],
                    false => &mut self.values[start * vb..end * vb],
                };
                if n < PARALLEL_OPS {
                    return stretch(0, (statuses, kinds, out, reads, values));
                }
                // Large parts on all host threads, a stretch a task (each with its values' share,
                // empty when there are none).
                let parts = statuses.par_chunks(STRETCH_OPS).zip(kinds.par_chunks(STRETCH_OPS));
                let own = out.par_chunks_mut(STRETCH_OPS).zip(reads.par_chunks_mut(STRETCH_OPS));
                let values: Vec<&mut [u8]> = match values.is_empty() {
                    true => (0..n.div_ceil(STRETCH_OPS)).map(|_| <&mut [u8]>::default()).collect(),
                    // Values are at least a byte (`Config::validate`).
                    false => values.chunks_mut(STRETCH_OPS * vb).collect(),
                };
                let stretches: Vec<Result<()>> = (parts.zip(own).zip(values).enumerate())
                    .map(|(c, (((codes, kinds), (out, reads)), values))| {
                        stretch(c * STRETCH_OPS, (codes, kinds, out, reads, values))
                    })
                    .collect();
                // The first error in batch order, whichever task met it first.
                stretches.into_iter().collect::<Result<()>>()?;
            }
            Part::Planned(plan) => {
                for (j, (&code, p)) in statuses.iter().zip(plan).enumerate() {
                    let status = decode(code, p.kind)?;
                    match p.expect {
                        Some(want) if status != want => {
                            return Err(Error::Inconsistent(format!(
                                "a {:?} that the call's reads say must give {want:?} gave {status:?}",
                                p.kind
                            )));
                        }
                        Some(_) => {}
                        None => self.set(p.key, status, found(j, p.kind, status)?),
                    }
                }
            }
        }
        Ok(())
    }

    /// Sets operation `i`'s result: its status and, for a read that found its key, the value.
    pub(crate) fn set(&mut self, i: usize, status: Status, found: Option<&[u8]>) {
        let vb = self.value_bytes;
        self.statuses[i] = status;
        self.reads[i] = found.is_some();
        if let Some(v) = found {
            self.values_mut()[i * vb..(i + 1) * vb].copy_from_slice(v);
        }
    }

    /// The results of a batch cut by [`Batch::split`] from those of its parts, on all threads.
    pub(crate) fn gathered(cut: &Cut, parts: &[BatchResult], value_bytes: usize) -> BatchResult {
        let mut all = BatchResult::new(cut.route.len(), value_bytes);
        let from = |i: usize| (&parts[cut.route[i] as usize], cut.rank[i] as usize);
        (all.statuses.par_iter_mut(), all.reads.par_iter_mut()).into_par_iter().enumerate().for_each(
            |(i, (status, read))| {
                let (part, k) = from(i);
                (*status, *read) = (part.statuses[k], part.reads[k]);
            },
        );
        if value_bytes > 0 && parts.iter().any(|p| !p.values.is_empty()) {
            all.values_mut().par_chunks_mut(value_bytes).enumerate().for_each(|(i, value)| {
                let (part, k) = from(i);
                if part.reads[k] {
                    value.copy_from_slice(&part.values[k * value_bytes..(k + 1) * value_bytes]);
                }
            });
        }
        all
    }

    /// [`BatchResult::gathered`] where the parts of the shards in `failed` took no effect: their
    /// places in `parts` hold anything of their length.
    pub(crate) fn gathered_partial(
        cut: &Cut,
        parts: &[BatchResult],
        value_bytes: usize,
        failed: &[usize],
    ) -> PartialResult {
        let result = BatchResult::gathered(cut, parts, value_bytes);
        let took_effect = cut.route.par_iter().map(|&s| !failed.contains(&(s as usize))).collect();
        PartialResult { result, took_effect }
    }

    /// Operations in the batch.
    pub fn len(&self) -> usize {
        self.statuses.len()
    }

    /// Whether the batch was empty.
    pub fn is_empty(&self) -> bool {
        self.statuses.is_empty()
    }

    /// The value read by operation `i`, if it is a get that found its key.
    pub fn value(&self, i: usize) -> Option<&[u8]> {
        self.reads[i].then(|| &self.values[i * self.value_bytes..(i + 1) * self.value_bytes])
    }
}

/// The results of a sharded batch whose parts took effect on some shards only
/// ([`crate::Error::Shard`]): in batch order, those of the operations whose shard's part took
/// effect, and nothing for the others.
#[derive(Clone, PartialEq, Eq)]
pub struct PartialResult {
    result: BatchResult,
    took_effect: Vec<bool>,
}

/// Counts only: an error's `{:?}` should not print a whole batch.
impl std::fmt::Debug for PartialResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartialResult")
            .field("operations", &self.len())
            .field("took_effect", &self.took_effect.iter().filter(|&&t| t).count())
            .finish()
    }
}

impl PartialResult {
    /// Operations in the batch.
    pub fn len(&self) -> usize {
        self.took_effect.len()
    }

    /// Whether the batch was empty.
    pub fn is_empty(&self) -> bool {
        self.took_effect.is_empty()
    }

    /// Whether operation `i` took effect (its shard's part did).
    pub fn took_effect(&self, i: usize) -> bool {
        self.took_effect[i]
    }

    /// Operation `i`'s status, if it took effect.
    pub fn status(&self, i: usize) -> Option<Status> {
        self.took_effect[i].then(|| self.result.statuses[i])
    }

    /// The value read by operation `i`, if it took effect and is a get that found its key.
    pub fn value(&self, i: usize) -> Option<&[u8]> {
        self.took_effect[i].then(|| self.result.value(i)).flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cut and put back together on all threads, a batch gives each part its operations in
    /// batch order, and each operation its part's result: batches of several stretches and of
    /// less than one, empty, and one part; routes that fill every part or leave some empty.
    #[test]
    fn split_and_gathered_agree_with_one_by_one() {
        let (kb, vb) = (8usize, 12usize);
        // Operations, parts, and the part of operation `i`.
        type Case = (usize, usize, fn(u64) -> u64);
        let cases: [Case; 5] = [
            (50_000, 7, |i| (i * i + 3 * i) % 7), // parts 1, 2 and 6 stay empty
            (50_000, 7, |i| (i * 0x9E37_79B9) % 7),
            (1_000, 5, |i| i % 5),
            (0, 3, |i| i % 3),
            (9_000, 1, |_| 0),
        ];
        for (n, parts, part_of) in cases {
            let mut b = Batch::new(kb, vb);
            let mut route = vec![];
            for i in 0..n as u64 {
                let key = (i * 0x9E37_79B9_7F4A_7C15).to_le_bytes();
                match i % 3 {
                    0 => b.get(&key).unwrap(),
                    1 => b.upsert(&key, &[i as u8; 12]).unwrap(),
                    _ => b.delete(&key).unwrap(),
                }
                route.push(part_of(i) as u32);
            }
            let (cut_parts, cut) = b.split(route.clone(), parts);
            assert_eq!(cut_parts.len(), parts);
            let mut results = vec![];
            for (p, part) in cut_parts.iter().enumerate() {
                let mine: Vec<usize> = (0..n).filter(|&i| route[i] as usize == p).collect();
                assert_eq!(part.len(), mine.len(), "{n} operations, part {p}");
                let mut r = BatchResult::new(part.len(), vb);
                for (j, &i) in mine.iter().enumerate() {
                    assert_eq!(part.op(j), b.op(i), "{n} operations, part {p}, operation {j}");
                    // A made-up result that names the operation: reads of even ones find a value.
                    let value = [(i % 251) as u8; 12];
                    let status = if i % 2 == 0 { Status::Ok } else { Status::NotFound };
                    r.set(j, status, (i % 2 == 0 && b.op(i).0 == OpKind::Get).then_some(&value[..]));
                }
                results.push(r);
            }
            let all = BatchResult::gathered(&cut, &results, vb);
            assert_eq!(all.len(), n);
            for i in 0..n {
                let want = if i % 2 == 0 { Status::Ok } else { Status::NotFound };
                assert_eq!(all.statuses[i], want, "{n} operations, operation {i}");
                let value = (i % 2 == 0 && b.op(i).0 == OpKind::Get).then_some([(i % 251) as u8; 12]);
                assert_eq!(all.value(i), value.as_ref().map(|v| &v[..]), "{n} operations, operation {i}");
            }
        }
    }

    #[test]
    fn widths_are_checked() {
        let mut b = Batch::new(8, 4);
        assert!(matches!(b.get(&[0; 7]), Err(Error::KeyWidth { found: 7, expected: 8 })));
        assert!(matches!(b.insert(&[0; 8], &[0; 5]), Err(Error::ValueSize { .. })));
        assert!(b.push(OpKind::Insert, &[0; 8], None).is_err());
        assert!(b.push(OpKind::Delete, &[0; 8], Some(&[0; 4])).is_err());
        assert!(b.is_empty(), "a refused operation is not appended");
        let keys = Batch::of_kind(OpKind::Get, 8, 4, &[0; 12], None).unwrap_err();
        assert_eq!(keys.to_string(), "12 bytes of keys are not a whole number of 8-byte keys");
        let values = Batch::of_kind(OpKind::Insert, 8, 8, &[0; 16], Some(&[0; 8])).unwrap_err();
        assert_eq!(values.to_string(), "8 bytes of values for 2 key(s): 2 value(s) of 8 bytes are 16 bytes");
    }

    #[test]
    fn columns_extend_a_batch_as_pushes_do() {
        let ops = [
            (OpKind::Upsert, 1u64, 10u32),
            (OpKind::Get, 2, 99),
            (OpKind::Delete, 3, 99),
            (OpKind::Insert, 4, 40),
        ];
        let mut pushed = Batch::new(8, 4);
        let (mut kinds, mut keys, mut values) = (vec![], vec![], vec![]);
        for &(kind, key, value) in &ops {
            pushed
                .push(kind, &key.to_le_bytes(), kind.writes_value().then_some(&value.to_le_bytes()[..]))
                .unwrap();
            kinds.push(kind);
            keys.extend_from_slice(&key.to_le_bytes());
            // Values of operations that write none are ignored.
            values.extend_from_slice(&value.to_le_bytes());
        }
        let mut extended = Batch::with_capacity(8, 4, 2);
        extended.extend_from_columns(&kinds[..1], &keys[..8], &values[..4]).unwrap();
        extended.extend_from_columns(&kinds[1..], &keys[8..], &values[4..]).unwrap();
        assert_eq!(extended, pushed);
        assert_eq!(extended.op(1).2, [0; 4], "a get's value is zeros");
        let e = extended.extend_from_columns(&kinds, &keys[1..], &values).unwrap_err();
        assert_eq!(e.to_string(), "31 bytes of keys for 4 operation(s): 4 key(s) of 8 bytes are 32 bytes");
        let e = extended.extend_from_columns(&kinds, &keys, &values[4..]).unwrap_err();
        assert!(matches!(e, Error::ValuesLength { .. }), "{e}");
        assert_eq!(extended.len(), 4, "a refused extension appends nothing");
    }

    /// Asserts that `b.key_groups()` holds each key that several operations of `b` have, with
    /// its operations in batch order, and the others' operations in batch order.
    fn assert_grouped_by_key(b: &Batch) {
        let mut by_key: std::collections::HashMap<&[u8], Vec<u32>> = Default::default();
        for i in 0..b.len() {
            by_key.entry(b.op(i).1).or_default().push(i as u32);
        }
        let mut want: Vec<Vec<u32>> = by_key.into_values().filter(|ops| ops.len() > 1).collect();
        want.sort();
        let mut want_single: Vec<usize> =
            (0..b.len()).filter(|&i| !want.iter().any(|ops| ops.contains(&(i as u32)))).collect();
        want_single.sort();
        let groups = b.key_groups();
        assert_eq!(groups.repeats(), !want.is_empty());
        assert_eq!(groups.single().collect::<Vec<_>>(), want_single);
        let mut got: Vec<Vec<u32>> = groups.repeated().map(<[u32]>::to_vec).collect();
        got.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn distinct_hashes_finds_any_equal_pair() {
        // On one thread and on all, which must say the same.
        let distinct = |v: &[u64]| {
            let one = distinct_hashes(v.iter().copied());
            assert_eq!(distinct_hashes_on_all_threads(v.len(), |i| v[i]), one, "{v:?}");
            one
        };
        assert!(distinct(&[]));
        assert!(distinct(&[7]));
        // Equal in the bits that pick the slot (the top ones), distinct otherwise: probed past,
        // not matched (slot 0 of 8); then past the table's end (slots 7, 0, 1 of 8).
        let top = u64::MAX;
        assert!(distinct(&[1, 2, 3, top]));
        assert!(!distinct(&[1, 2, 3, 2]));
        assert!(distinct(&[top, top - 1, top - 2, 1]));
        assert!(!distinct(&[top, top - 1, top - 2, top - 1]));
        assert!(!distinct(&[top, 0, top]));
        assert!(distinct(&[7, 15, 23]));
        assert!(!distinct(&[7, 15, 23, 15]));
        // The hash 0, which the tables keep apart from their empty words.
        assert!(distinct(&[0, 1, 2]));
        assert!(!distinct(&[0, 1, 0]));
        // Key hashes as a batch has them (some share a slot), then one of them once more at
        // four places; past 2^18 of them, where their top halves collide.
        for n in [5000u64, 300_000] {
            let all: Vec<u64> = (0..n).map(|i| key_hash(&i.to_le_bytes())).collect();
            assert!(distinct(&all));
            for at in [0, 1, n / 2, n - 1] {
                let mut twice = all.clone();
                twice.insert(at as usize, all[(n - 1 - at) as usize]);
                assert!(!distinct(&twice));
            }
        }
        // Hashes that all share their slot's bits give up (the caller sorts) within 8 probes a
        // hash on average on one thread, 64 on all, not after n^2 / 2.
        let crowded: Vec<u64> = (1..4000u64).collect();
        assert!(!distinct(&crowded));
        // Those hashes do differ: the sort then finds no repeat.
        let mut b = Batch::new(8, 4);
        crowded.iter().for_each(|k| b.upsert(&k.to_le_bytes(), &[0; 4]).unwrap());
        assert!(!b.sorted_groups(None).repeats());
    }

    #[test]
    fn threads_inserting_one_hash_at_once_let_one_in() {
        use std::sync::atomic::AtomicUsize;
        // As many threads as run at once (spinning), so that their swaps meet.
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 4);
        const ROUNDS: usize = 20_000;
        // Each round: a table whose words are of another generation (each taken by a swap), the
        // same hash inserted by every thread at once, and, first, by some threads another one
        // that starts at the same slot (so the probes pass words taken meanwhile).
        let stale = 1u64 << GENERATION_SHIFT | 77;
        let tables: Vec<Vec<AtomicU64>> =
            (0..ROUNDS).map(|_| (0..8).map(|_| AtomicU64::new(stale)).collect()).collect();
        let hash = |round: usize| (round as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let arrived = AtomicUsize::new(0);
        let tally: Vec<AtomicUsize> = (0..ROUNDS).map(|_| AtomicUsize::new(0)).collect();
        std::thread::scope(|scope| {
            for t in 0..threads {
                let (tables, arrived, tally) = (&tables, &arrived, &tally);
                scope.spawn(move || {
                    for (round, table) in tables.iter().enumerate() {
                        // A barrier that spins: the threads leave it within nanoseconds.
                        arrived.fetch_add(1, Ordering::SeqCst);
                        let mut spins = 0u32;
                        while arrived.load(Ordering::SeqCst) < (round + 1) * threads {
                            // Not forever, on a host busy with other tests.
                            spins += 1;
                            if spins.is_multiple_of(1024) {
                                std::thread::yield_now();
                            }
                            std::hint::spin_loop();
                        }
                        if t == 1 {
                            let _ = insert(table, 7, 2, hash(round) ^ 2);
                        }
                        if insert(table, 7, 2, hash(round)).is_ok() {
                            tally[round].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        for (round, (table, tally)) in tables.iter().zip(&tally).enumerate() {
            assert_eq!(tally.load(Ordering::Relaxed), 1, "round {round}: inserted more than once");
            let want = 2 << GENERATION_SHIFT | hash(round) & HASH_BITS;
            assert_eq!(table.iter().filter(|w| w.load(Ordering::Relaxed) == want).count(), 1);
        }
    }

    #[test]
    fn a_kept_hash_table_forgets_earlier_calls() {
        let mut table = HashTable::default();
        let all: Vec<u64> = (0..100_000u64).map(|i| key_hash(&i.to_le_bytes())).collect();
        let mut twice = all[..1000].to_vec();
        twice.push(all[500]);
        for _ in 0..3 {
            // The same hashes in each call: distinct within it.
            assert!(table.distinct(all.len(), |i| all[i]));
            // A smaller call on the same table still finds a repeat.
            assert!(!table.distinct(twice.len(), |i| twice[i]));
        }
        // When the generations run out the table is cleared, and the calls after it are right.
        table.generation = u64::from(u16::MAX) - 1;
        for _ in 0..3 {
            assert!(table.distinct(all.len(), |i| all[i]));
            assert!(!table.distinct(twice.len(), |i| twice[i]));
        }
        assert_eq!(table.generation, 5, "cleared once, at the second call");
    }

    #[test]
    fn key_groups_separate_repeated_keys_in_order() {
        let batch = |keys: &[u64]| {
            let mut b = Batch::new(8, 4);
            for k in keys {
                b.upsert(&k.to_le_bytes(), &[0; 4]).unwrap();
            }
            b
        };
        let b = batch(&[1, 2, 1, 1, 3, 2, 4]);
        let groups = b.key_groups();
        assert_eq!(groups.single().collect::<Vec<_>>(), [4, 6]);
        assert_eq!(groups.repeated().count(), 2);
        assert_grouped_by_key(&b);
        // Without repeats, every operation is single.
        assert_grouped_by_key(&batch(&[5, 1, 9]));
        assert_grouped_by_key(&batch(&[]));
        // Batches grouped on one thread and on all (PARALLEL_GROUPING), with and without repeats.
        for (n, keys) in [(1000, 300), (5000, 2000), (5000, u64::MAX), (100_000, 60_000), (100_000, u64::MAX)]
        {
            let mut k = 12345u64;
            let mut next = || {
                k = k.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                (k >> 11) % keys
            };
            let b = batch(&(0..n).map(|_| next()).collect::<Vec<_>>());
            assert_grouped_by_key(&b);
            // The sort alone (which runs when the hash set says "maybe") groups them the same.
            assert_eq!(b.sorted_groups(None), b.key_groups());
        }
        // Chains of hashes that different keys share (hashes given, not the keys'): the keys
        // are told apart as the sort tells them; and chains whose probes run too long give up.
        let keys = [1, 2, 1, 1, 3, 2, 4, 3, 9];
        let b = batch(&keys);
        let hashes_of: [fn(u64) -> u64; 4] = [|_| 7, |k| k % 2, |k| k / 4, |k| k];
        for hash in hashes_of {
            let hashes: Vec<u64> = keys.iter().map(|&k| hash(k)).collect();
            assert_eq!(b.chained_groups(&hashes), Some(b.sorted_groups(None)), "{hashes:?}");
        }
        let b = batch(&(0..200).collect::<Vec<_>>());
        assert_eq!(b.chained_groups(&(0..200).collect::<Vec<_>>()), None, "200 hashes in one slot");
        // Keys whose hashes share their top halves, the part that is sorted.
        let scattered = (0..1u64 << 18).map(|k| k.wrapping_mul(0xD6E8_FEB8_6659_FD93).rotate_left(29));
        let mut hashes: Vec<(u64, u64)> = scattered.map(|k| (key_hash(&k.to_le_bytes()) >> 32, k)).collect();
        hashes.sort_unstable();
        let (a, c) = hashes.windows(2).find(|w| w[0].0 == w[1].0).map(|w| (w[0].1, w[1].1)).unwrap();
        for keys in [[a, c, a, 5, c], [a, c, a, 5, 6], [a, c, 7, 5, 6]] {
            assert_grouped_by_key(&batch(&keys));
        }
    }

    /// Every sequence of up to four operations on one key, from either state: the results and
    /// the net operation equal one-by-one application.
    #[test]
    fn folds_equal_one_by_one_application() {
        use OpKind::*;
        let kinds = [Get, Insert, Upsert, Update, Delete];
        let key = 7u32.to_le_bytes();
        for len in 1..=4u32 {
            for code in 0..5u32.pow(len) {
                let seq: Vec<OpKind> = (0..len).map(|d| kinds[(code / 5u32.pow(d) % 5) as usize]).collect();
                for before in [None, Some([9u8; 4])] {
                    let mut b = Batch::new(4, 4);
                    for (i, &kind) in seq.iter().enumerate() {
                        let v = [i as u8; 4];
                        b.push(kind, &key, kind.writes_value().then_some(&v[..])).unwrap();
                    }
                    // One by one.
                    let mut state = before.map(|v| v.to_vec());
                    let mut want = vec![];
                    for i in 0..b.len() {
                        let (kind, _, v) = b.op(i);
                        want.push(match (kind, &state) {
                            (Get, Some(s)) => (Status::Ok, Some(s.clone())),
                            (Get | Update | Delete, None) => (Status::NotFound, None),
                            (Insert, Some(_)) => (Status::Exists, None),
                            (Insert | Upsert | Update, _) => {
                                state = Some(v.to_vec());
                                (Status::Ok, None)
                            }
                            (Delete, Some(_)) => {
                                state = None;
                                (Status::Ok, None)
                            }
                        });
                    }
                    let mut result = BatchResult::new(b.len(), 4);
                    let ops: Vec<u32> = (0..b.len() as u32).collect();
                    let net = b.fold_key(&ops, before.as_ref().map(|v| &v[..]), &mut result);
                    let got: Vec<_> = (0..b.len())
                        .map(|i| (result.statuses[i], result.value(i).map(<[u8]>::to_vec)))
                        .collect();
                    assert_eq!(got, want, "{seq:?} from {before:?}");
                    // The net operation takes `before` to `state`.
                    let after = match net {
                        None => before.map(|v| v.to_vec()),
                        Some(p) => {
                            assert_eq!(p.expect, Some(Status::Ok));
                            match (p.kind, before) {
                                (Insert, None) | (Update, Some(_)) => Some(b.op(p.value).2.to_vec()),
                                (Delete, Some(_)) => None,
                                other => panic!("{seq:?}: net {other:?}"),
                            }
                        }
                    };
                    assert_eq!(after, state, "{seq:?} from {before:?}: net {net:?}");
                    if b.overwrites(&ops) {
                        // Folded without the key's state (as absent): the same results, and a
                        // net insert of what the key ends with, which the index runs as an upsert.
                        let mut blind = BatchResult::new(b.len(), 4);
                        let net = b.fold_key(&ops, None, &mut blind).expect("an overwritten key changes");
                        let got: Vec<_> = (0..b.len())
                            .map(|i| (blind.statuses[i], blind.value(i).map(<[u8]>::to_vec)))
                            .collect();
                        assert_eq!(got, want, "{seq:?} from {before:?}, folded blind");
                        assert_eq!(
                            (net.kind, Some(b.op(net.value).2.to_vec())),
                            (Insert, state.clone()),
                            "{seq:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn encoding_pads_values_to_whole_words() {
        let mut b = Batch::new(4, 3);
        b.insert(&7u32.to_le_bytes(), &[1, 2, 3]).unwrap();
        b.get(&9u32.to_le_bytes()).unwrap();
        let mut e = Encoded::default();
        b.encode(&mut e);
        assert_eq!(e.kinds, vec![OpKind::Insert as u32, OpKind::Get as u32]);
        assert_eq!(e.keys, vec![7, 9]);
        assert_eq!(e.values, vec![0x0003_0201, 0]);
        b.encode_part(Part::Ops { start: 1, end: 2 }, &mut e);
        assert_eq!(e.keys, vec![9]);
        assert!(e.values.is_empty(), "reads carry no values");
        // A net change takes its key from one operation and its value from another; a delete
        // of an insert's key carries no value.
        let net = |kind, key, value| Planned { kind, key, value, expect: Some(Status::Ok) };
        let planned = [net(OpKind::Update, 1, 0), net(OpKind::Delete, 0, 0)];
        b.encode_part(Part::Planned(&planned), &mut e);
        assert_eq!(e.kinds, vec![OpKind::Update as u32, OpKind::Delete as u32]);
        assert_eq!(e.keys, vec![9, 7]);
        assert_eq!(e.values, vec![0x0003_0201, 0]);
    }

    /// Parts large enough to be encoded and decoded on all threads give what small ones give,
    /// op by op: with values of whole words (copied in bulk) and of odd widths, reads and writes
    /// mixed, and a part that starts inside the batch.
    #[test]
    fn large_parts_encode_and_decode_as_small_ones() {
        for vb in [8, 5] {
            let n = PARALLEL_OPS.max(PARALLEL_COUNT) + STRETCH_OPS + 77;
            let mut b = Batch::new(8, vb);
            let value = |i: usize| (0..vb).map(|j| (i * 31 + j) as u8).collect::<Vec<u8>>();
            for i in 0..n {
                let key = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes();
                match i % 3 {
                    0 => b.insert(&key, &value(i)).unwrap(),
                    1 => b.delete(&key).unwrap(),
                    _ => b.get(&key).unwrap(),
                }
            }
            let padded = vb.div_ceil(4) * 4;
            for (start, end) in [(0, n), (STRETCH_OPS + 3, n), (5, 9)] {
                let mut e = Encoded::default();
                b.encode_part(Part::Ops { start, end }, &mut e);
                let reads = (start..end).filter(|&i| b.op(i).0 == OpKind::Get).count();
                assert_eq!(e.len(), end - start);
                assert_eq!((e.read_only(), e.has_reads()), (reads == end - start, reads > 0));
                for (j, i) in (start..end).enumerate() {
                    let (kind, key, _) = b.op(i);
                    assert_eq!(e.kinds[j], kind as u32, "{vb}-byte values: op {i}'s kind");
                    assert_eq!(bytemuck::cast_slice::<u32, u8>(&e.keys[j * 2..j * 2 + 2]), key);
                }
                // Every other read finds its key, with a value made from its index.
                let status = |i: usize| match b.op(i).0 {
                    OpKind::Get if i.is_multiple_of(2) => Status::Ok,
                    OpKind::Get | OpKind::Delete => Status::NotFound,
                    _ => Status::Ok,
                };
                let codes: Vec<u32> = (start..end).map(|i| status(i) as u32).collect();
                let mut words = vec![0u32; (end - start) * padded / 4];
                let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
                for (j, i) in (start..end).enumerate() {
                    bytes[j * padded..j * padded + vb].copy_from_slice(&value(i));
                }
                let mut r = BatchResult::new(n, vb);
                r.scatter(&b, Part::Ops { start, end }, &codes, &words).unwrap();
                for i in 0..n {
                    let inside = (start..end).contains(&i);
                    let want = if inside { status(i) } else { Status::NotFound };
                    assert_eq!(r.statuses[i], want, "{vb}-byte values, part {start}..{end}: op {i}");
                    let read = inside && b.op(i).0 == OpKind::Get && want == Status::Ok;
                    assert_eq!(r.value(i), read.then(|| value(i)).as_deref(), "op {i}'s value");
                }
                // A code no status has is refused, wherever it is; of two, the first in batch
                // order is named.
                let mut bad = codes.clone();
                *bad.last_mut().unwrap() = 0xdead;
                let mut r = BatchResult::new(n, vb);
                assert!(r.scatter(&b, Part::Ops { start, end }, &bad, &words).is_err());
                bad[0] = 0xbeef;
                let e = r.scatter(&b, Part::Ops { start, end }, &bad, &words).unwrap_err();
                assert!(e.to_string().contains(&0xbeef.to_string()), "{e}");
            }
        }
    }

    /// A batch reads only, and carries values, by each of its kinds, wherever the one that
    /// differs stands in the stretches that `every` scans.
    #[test]
    fn one_kind_anywhere_decides_what_a_batch_is() {
        let n = 10_000;
        for at in [None, Some(0), Some(4095), Some(4096), Some(n - 1)] {
            let mut b = Batch::new(4, 4);
            for i in 0..n {
                let key = (i as u32).to_le_bytes();
                match at == Some(i) {
                    true => b.insert(&key, &[1, 2, 3, 4]).unwrap(),
                    false => b.get(&key).unwrap(),
                }
            }
            assert_eq!(b.read_only(), at.is_none(), "insert at {at:?}");
            let mut e = Encoded::default();
            b.encode(&mut e);
            assert_eq!(e.values.is_empty(), at.is_none(), "insert at {at:?}: values carried");
            assert_eq!(e.read_only(), at.is_none());
        }
    }
}
