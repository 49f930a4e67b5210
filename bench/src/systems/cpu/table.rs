//! [`CpuTable`]: the persistent TurboHash-style table the `cpu` baseline runs on the host.
//!
//! See the parent module for the design and the crash argument; [`super::layout`] for the
//! bytes.

use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use host_pm::{CreateOptions, Observer, PersistMode, Pool, PoolError, Region};
use rustc_hash::FxHashMap;

use super::layout::{BUCKET_BYTES, Geometry, OVERFLOW, Place};
use super::workers::{SpinBarrier, Workers};
use gphash::hash::hash_words;
use gphash::{Error, Result};
use gphash::{OpKind, Status};

/// Pool line size.
const LINE: u64 = host_pm::LINE_BYTES;
/// A batch wakes one thread per this many operations (at least one, at most all).
const OPS_PER_THREAD: usize = 256;

/// How to build a [`CpuTable`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuConfig {
    /// Key width in bytes (a multiple of 4, at most 236).
    pub key_bytes: usize,
    /// Value size in bytes (1..=65536).
    pub value_bytes: usize,
    /// Keys the table must hold; it is sized so that they fill 75 % of its slots. The table does
    /// not resize: an insertion that finds its probe window full fails the batch with
    /// [`Error::TableFull`].
    pub capacity: u64,
    /// Host threads that run a batch; 0 = all (`available_parallelism`).
    pub threads: usize,
    /// Shards (a power of two); 0 = about four per thread (fewer for small tables).
    pub shards: usize,
    /// Hash seed.
    pub seed: u64,
}

impl Default for CpuConfig {
    fn default() -> Self {
        CpuConfig {
            key_bytes: 8,
            value_bytes: 8,
            capacity: 1 << 20,
            threads: 0,
            shards: 0,
            seed: 0x5EED_C0DE,
        }
    }
}

/// What opening a pool found and repaired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Whether the pool had been closed cleanly.
    pub clean: bool,
    /// Keys found (valid slots).
    pub keys: u64,
    /// Value cells that were in use.
    pub cells_in_use: u64,
    /// Overflow bits cleared because no key needs them any more (after deletions).
    pub overflow_cleared: u64,
    /// Overflow bits that were missing and were set (never expected: a sign of damage).
    pub overflow_set: u64,
}

/// The volatile state of one shard: its free value cells (global indices, a stack).
#[derive(Clone, Debug, Default)]
struct ShardState {
    free: Vec<u32>,
}

/// One shard's bytes and state, borrowed exclusively by the thread that owns it.
struct ShardMut<'a> {
    index: usize,
    buckets: &'a mut [u8],
    cells: &'a mut [u8],
    state: &'a mut ShardState,
}

/// A persistent hash table on a host-pm pool, run by host threads that each own whole shards.
pub struct CpuTable {
    pool: Pool,
    geo: Geometry,
    table: Region,
    heap: Region,
    shards: Vec<ShardState>,
    workers: Workers,
    /// One per worker thread.
    scratch: Vec<Scratch>,
    len: u64,
    recovery: Recovery,
    poisoned: Option<String>,
}

impl std::fmt::Debug for CpuTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuTable")
            .field("geometry", &self.geo)
            .field("threads", &self.workers.threads())
            .field("len", &self.len)
            .field("pool", &self.pool)
            .finish()
    }
}

/// All host threads when `threads` is 0.
fn resolve_threads(threads: usize) -> usize {
    if threads > 0 { threads } else { std::thread::available_parallelism().map_or(1, |n| n.get()) }
}

fn corrupt(what: String) -> Error {
    Error::Pool(PoolError::Corrupt { what })
}

/// Metadata word of bucket `b` of a shard.
fn meta(buckets: &[u8], b: usize) -> u64 {
    let at = b * BUCKET_BYTES;
    u64::from_le_bytes(buckets[at..at + 8].try_into().unwrap())
}

/// One aligned 8-byte store (little-endian), the commit primitive.
fn store_u64(bytes: &mut [u8], at: usize, v: u64) {
    let word: &mut u64 = bytemuck::from_bytes_mut(&mut bytes[at..at + 8]);
    // SAFETY: `word` is a valid, aligned (bytemuck checked it) and exclusively borrowed u64; an
    // atomic view of it for one store is sound and makes the store a single instruction.
    unsafe { AtomicU64::from_ptr(word) }.store(v.to_le(), Ordering::Relaxed);
}

/// One aligned 4-byte store (little-endian): a cell-index swap.
fn store_u32(bytes: &mut [u8], at: usize, v: u32) {
    let word: &mut u32 = bytemuck::from_bytes_mut(&mut bytes[at..at + 4]);
    // SAFETY: as in `store_u64`.
    unsafe { AtomicU32::from_ptr(word) }.store(v.to_le(), Ordering::Relaxed);
}

/// Words that the threads of a batch write (each its own operations' words) through a
/// shared view.
fn atomic_view(words: &mut [u32]) -> &[AtomicU32] {
    // SAFETY: AtomicU32 has the size, alignment and bit validity of u32, and the exclusive
    // borrow keeps every other access out while the view lives.
    unsafe { &*(words as *mut [u32] as *const [AtomicU32]) }
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

/// Whether the key stored at `at` equals `key`.
fn key_eq(bytes: &[u8], at: usize, key: &[u32]) -> bool {
    bytes[at..at + key.len() * 4]
        .chunks_exact(4)
        .zip(key)
        .all(|(b, &w)| u32::from_le_bytes(b.try_into().unwrap()) == w)
}

/// Asks for the cache lines of `bytes[at..at + len]` ahead of their use (x86_64; elsewhere a
/// no-op).
#[inline(always)]
fn prefetch(bytes: &[u8], at: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let start = bytes[at..at + len].as_ptr();
        let skew = start as usize % 64;
        for o in (0..len + skew).step_by(64) {
            // SAFETY: SSE is part of x86_64; a prefetch is a hint that never faults, whatever
            // the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_sub(skew).wrapping_add(o).cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (bytes, at, len);
}

/// Pool lines covering `len` bytes at pool offset `at`, appended to `out`.
fn push_lines(out: &mut Vec<u64>, at: u64, len: u64) {
    out.extend(at / LINE..(at + len).div_ceil(LINE));
}

/// Where a published key lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct At {
    bucket: usize,
    slot: usize,
    cell: u32,
}

/// Searches a shard for `key`: buckets from its home on, tag-matching valid slots only, until
/// a bucket without the overflow bit or the probe limit.
fn find(geo: &Geometry, buckets: &[u8], place: Place, key: &[u32]) -> Option<At> {
    for d in 0..geo.probe {
        let b = (place.home + d) % geo.buckets;
        let base = b * BUCKET_BYTES;
        let m = meta(buckets, b);
        let mut valid = m & geo.slot_mask();
        while valid != 0 {
            let i = valid.trailing_zeros() as usize;
            valid &= valid - 1;
            if buckets[base + 8 + i] == place.tag {
                let at = base + geo.slot_offset(i);
                if key_eq(buckets, at + 4, key) {
                    return Some(At { bucket: b, slot: i, cell: read_u32(buckets, at) });
                }
            }
        }
        if m & OVERFLOW == 0 {
            break;
        }
    }
    None
}

/// The value a key holds while a batch is planned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Val {
    /// Absent.
    Absent,
    /// The durable value in this global cell.
    Cell(u32),
    /// The value of operation `i` of the batch.
    Op(u32),
}

/// One distinct key of a thread's share of a batch.
#[derive(Clone, Copy, Debug)]
struct KeyState {
    /// The batch operation whose key it is (the first that names it).
    op: u32,
    /// The next distinct key with the same shard hash ([`NO_KEY`]: none).
    next: u32,
    place: Place,
    /// Where the key is published before the batch.
    at: Option<At>,
    /// Its value after the operations planned so far.
    value: Val,
    /// Whether some operation changed it.
    dirty: bool,
}

/// End of a [`KeyState::next`] chain.
const NO_KEY: u32 = u32::MAX;

/// What one thread planned for its shards: lines to persist, commits, cells taken and freed.
#[derive(Debug, Default)]
struct Plan {
    /// Lines written in phase 1 (data), when the persist mode needs them.
    lines1: Vec<u64>,
    /// Lines phase 2 writes (commits), when the persist mode needs them.
    lines2: Vec<u64>,
    /// Per global bucket: valid bits to set and to clear.
    bitmaps: FxHashMap<usize, (u64, u64)>,
    /// Cell-index swaps: global bucket, slot, new cell.
    refs: Vec<(usize, usize, u32)>,
    /// Cells taken from the free lists (returned if the batch is rolled back).
    allocated: Vec<u32>,
    /// Cells released once the batch is durable.
    freed: Vec<u32>,
    /// Keys published by the batch.
    inserted: u64,
    /// Keys removed by the batch.
    deleted: u64,
    /// Insertions without a free slot in their probe window.
    full: u64,
    /// Cells wanted from an empty free list.
    no_cell: u64,
}

impl Plan {
    fn commits(&self) -> bool {
        !self.bitmaps.is_empty() || !self.refs.is_empty()
    }

    /// Empties the plan, keeping its capacity.
    fn clear(&mut self) {
        self.lines1.clear();
        self.lines2.clear();
        self.bitmaps.clear();
        self.refs.clear();
        self.allocated.clear();
        self.freed.clear();
        (self.inserted, self.deleted, self.full, self.no_cell) = (0, 0, 0, 0);
    }
}

/// One input chunk's operations per worker: (operation index, shard hash).
type Partition = Vec<Vec<(u32, u32)>>;

/// One worker's buffers, kept from batch to batch: allocating them per batch lets the
/// allocator hand their pages back to the kernel between batches and fault them in again
/// (zeroed) during the next, which cost write batches more than their work
/// (docs/lab/ycsb-suite-history.md, "cpu-map").
#[derive(Debug, Default)]
struct Scratch {
    /// The partition of this worker's input chunk (lent to the batch's [`Shared`]).
    partition: Partition,
    /// This worker's operations (index, shard hash), in batch order.
    ops: Vec<(u32, u32)>,
    places: Vec<Place>,
    found_at: Vec<Option<At>>,
    /// Shard hash -> first of the distinct keys with that hash (chained by `KeyState::next`).
    index: FxHashMap<u32, u32>,
    keys: Vec<KeyState>,
    /// Per global bucket: slots taken by this batch's insertions.
    claimed: FxHashMap<usize, u64>,
    /// What the worker planned.
    plan: Plan,
}

/// What every thread of a batch reads.
struct Shared<'a> {
    geo: &'a Geometry,
    kinds: &'a [u32],
    keys: &'a [u32],
    values: &'a [u32],
    statuses: &'a [AtomicU32],
    found: &'a [AtomicU32],
    table_offset: u64,
    heap_offset: u64,
    need_lines: bool,
    workers: usize,
    /// Worker of each shard.
    owner: Vec<u32>,
    /// Per input chunk (one per worker): per worker, its operations (index, shard hash).
    chunks: Vec<OnceLock<Partition>>,
    barrier: SpinBarrier,
}

/// First shard of worker `w` of `workers` over `shards` shards.
fn first_shard(w: usize, workers: usize, shards: usize) -> usize {
    w * shards / workers
}

/// The shards' bytes and states split into `workers` groups of consecutive shards.
fn split<'a>(
    pool: &'a mut Pool,
    states: &'a mut [ShardState],
    geo: &Geometry,
    table: Region,
    heap: Region,
    workers: usize,
) -> Vec<Vec<ShardMut<'a>>> {
    let bytes = pool.bytes_mut();
    let (front, back) = bytes.split_at_mut(heap.offset as usize);
    let table_bytes = &mut front[table.offset as usize..][..geo.table_bytes() as usize];
    let heap_bytes = &mut back[..geo.heap_bytes() as usize];
    let mut all = table_bytes
        .chunks_mut(geo.buckets * BUCKET_BYTES)
        .zip(heap_bytes.chunks_mut(geo.cells * geo.cell_bytes))
        .zip(states.iter_mut())
        .enumerate()
        .map(|(index, ((buckets, cells), state))| ShardMut { index, buckets, cells, state });
    (0..workers)
        .map(|w| {
            let count = first_shard(w + 1, workers, geo.shards) - first_shard(w, workers, geo.shards);
            all.by_ref().take(count).collect()
        })
        .collect()
}

/// Phase 1 of one worker: partition, apply the operations to a volatile overlay in batch
/// order (statuses and read values are final here), then write the data of every net change
/// out of place.
fn plan(sh: &Shared<'_>, w: usize, group: &mut [ShardMut<'_>], scratch: &mut Scratch) {
    let geo = sh.geo;
    let (kw, cw) = (geo.key_words(), geo.cell_words());
    let n = sh.kinds.len();
    let key_of = |i: usize| &sh.keys[i * kw..(i + 1) * kw];
    // Partition: this worker hashes its chunk of the batch for everyone.
    let (lo, hi) = (w * n / sh.workers, (w + 1) * n / sh.workers);
    let mut lists = std::mem::take(&mut scratch.partition);
    lists.resize_with(sh.workers, Vec::new);
    lists.iter_mut().for_each(Vec::clear);
    for i in lo..hi {
        let h = hash_words(key_of(i), geo.shard_seed);
        lists[sh.owner[geo.shard_of(h)] as usize].push((i as u32, h));
    }
    let _ = sh.chunks[w].set(lists);
    if sh.workers > 1 {
        sh.barrier.wait();
    }
    let base = group.first().map_or(0, |s| s.index);
    let Scratch { ops, places, found_at, index, keys, claimed, plan: p, .. } = scratch;
    ops.clear();
    for c in &sh.chunks {
        ops.extend_from_slice(&c.get().expect("every worker partitions its chunk")[w]);
    }
    places.clear();
    places.extend(ops.iter().map(|&(i, h)| geo.place_with(key_of(i as usize), h)));
    let count = ops.len();

    // Software pipeline over the (memory-bound) lookups: the home bucket of operation
    // `t + 2 * AHEAD` is prefetched, operation `t + AHEAD` is looked up (and the cell it found
    // prefetched), operation `t` is applied. Lookups read the table as it was before the batch,
    // which nothing changes until the loop ends.
    const AHEAD: usize = 8;
    let lookup = |t: usize| {
        let shard = &group[places[t].shard - base];
        let at = find(geo, shard.buckets, places[t], key_of(ops[t].0 as usize));
        if let Some(a) = at {
            prefetch(
                shard.cells,
                (a.cell as usize - shard.index * geo.cells) * geo.cell_bytes,
                geo.cell_bytes,
            );
        }
        at
    };
    let prefetch_home = |t: usize| {
        prefetch(group[places[t].shard - base].buckets, places[t].home * BUCKET_BYTES, BUCKET_BYTES);
    };
    (0..count.min(2 * AHEAD)).for_each(prefetch_home);
    found_at.clear();
    found_at.extend((0..count.min(AHEAD)).map(lookup));
    found_at.resize(count, None);

    index.clear();
    index.reserve(count);
    keys.clear();
    let ok = Status::Ok as u32;
    for (t, &(i, h)) in ops.iter().enumerate() {
        if t + 2 * AHEAD < count {
            prefetch_home(t + 2 * AHEAD);
        }
        if t + AHEAD < count {
            found_at[t + AHEAD] = lookup(t + AHEAD);
        }
        let i = i as usize;
        let key = key_of(i);
        let head = index.entry(h).or_insert(NO_KEY);
        let mut k = *head;
        while k != NO_KEY && key_of(keys[k as usize].op as usize) != key {
            k = keys[k as usize].next;
        }
        if k == NO_KEY {
            let (place, at) = (places[t], found_at[t]);
            let value = at.map_or(Val::Absent, |a| Val::Cell(a.cell));
            keys.push(KeyState { op: i as u32, next: *head, place, at, value, dirty: false });
            k = (keys.len() - 1) as u32;
            *head = k;
        }
        let k = k as usize;
        let st = &mut keys[k];
        let present = st.value != Val::Absent;
        let kind = OpKind::from_code(sh.kinds[i]).expect("operation codes are checked before the batch");
        let status = match (kind, present) {
            (OpKind::Get, true) => {
                let out = &sh.found[i * cw..(i + 1) * cw];
                match st.value {
                    Val::Cell(c) => {
                        let shard = &group[st.place.shard - base];
                        let at = (c as usize - shard.index * geo.cells) * geo.cell_bytes;
                        for (o, b) in out.iter().zip(shard.cells[at..at + geo.cell_bytes].chunks_exact(4)) {
                            o.store(u32::from_le_bytes(b.try_into().unwrap()), Ordering::Relaxed);
                        }
                    }
                    Val::Op(j) => {
                        let j = j as usize;
                        for (o, &v) in out.iter().zip(&sh.values[j * cw..(j + 1) * cw]) {
                            o.store(v, Ordering::Relaxed);
                        }
                    }
                    Val::Absent => unreachable!("present"),
                }
                ok
            }
            (OpKind::Get | OpKind::Update | OpKind::Delete, false) => Status::NotFound as u32,
            (OpKind::Insert, true) => Status::Exists as u32,
            (OpKind::Insert | OpKind::Upsert | OpKind::Update, _) => {
                st.value = Val::Op(i as u32);
                st.dirty = true;
                ok
            }
            (OpKind::Delete, true) => {
                st.value = Val::Absent;
                st.dirty = true;
                ok
            }
        };
        sh.statuses[i].store(status, Ordering::Relaxed);
    }

    // Net changes, in first-seen order. Only free space is written here: cells not referenced
    // by any valid slot, slots whose valid bit is clear, overflow bits (which only lengthen
    // searches).
    p.clear();
    claimed.clear();
    let mask = geo.slot_mask();
    let cell_line = |c: u32| sh.heap_offset + c as u64 * geo.cell_bytes as u64;
    let bucket_at = |gb: usize| sh.table_offset + (gb * BUCKET_BYTES) as u64;
    for st in keys.iter().filter(|s| s.dirty) {
        let shard = &mut group[st.place.shard - base];
        let first_bucket = shard.index * geo.buckets;
        let write_cell = |shard: &mut ShardMut<'_>, c: u32, j: u32| {
            let at = (c as usize - shard.index * geo.cells) * geo.cell_bytes;
            let src = &sh.values[j as usize * cw..(j as usize + 1) * cw];
            for (d, &v) in shard.cells[at..at + geo.cell_bytes].chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&v.to_le_bytes());
            }
        };
        match (st.at, st.value) {
            (None, Val::Op(j)) => {
                let Some(cell) = shard.state.free.pop() else {
                    p.no_cell += 1;
                    continue;
                };
                p.allocated.push(cell);
                let home = st.place.home;
                let spot = (0..geo.probe).find_map(|d| {
                    let b = (home + d) % geo.buckets;
                    let taken =
                        meta(shard.buckets, b) | claimed.get(&(first_bucket + b)).copied().unwrap_or(0);
                    let free = !taken & mask;
                    (free != 0).then(|| (d, b, free.trailing_zeros() as usize))
                });
                let Some((d, b, slot)) = spot else {
                    p.full += 1;
                    continue;
                };
                let gb = first_bucket + b;
                *claimed.entry(gb).or_default() |= 1 << slot;
                write_cell(shard, cell, j);
                let at = b * BUCKET_BYTES + geo.slot_offset(slot);
                shard.buckets[at..at + 4].copy_from_slice(&cell.to_le_bytes());
                let key = key_of(st.op as usize);
                for (dst, &w) in shard.buckets[at + 4..at + geo.slot_bytes].chunks_exact_mut(4).zip(key) {
                    dst.copy_from_slice(&w.to_le_bytes());
                }
                shard.buckets[b * BUCKET_BYTES + 8 + slot] = st.place.tag;
                // Buckets passed over say so before the key can be published.
                for e in 0..d {
                    let ob = (home + e) % geo.buckets;
                    let m = meta(shard.buckets, ob);
                    if m & OVERFLOW == 0 {
                        store_u64(shard.buckets, ob * BUCKET_BYTES, m | OVERFLOW);
                        if sh.need_lines {
                            p.lines1.push(bucket_at(first_bucket + ob) / LINE);
                        }
                    }
                }
                if sh.need_lines {
                    push_lines(&mut p.lines1, cell_line(cell), geo.cell_bytes as u64);
                    push_lines(
                        &mut p.lines1,
                        bucket_at(gb) + geo.slot_offset(slot) as u64,
                        geo.slot_bytes as u64,
                    );
                    p.lines1.push(bucket_at(gb) / LINE);
                    p.lines2.push(bucket_at(gb) / LINE);
                }
                p.bitmaps.entry(gb).or_default().0 |= 1 << slot;
                p.inserted += 1;
            }
            (Some(at), Val::Absent) => {
                let gb = first_bucket + at.bucket;
                p.bitmaps.entry(gb).or_default().1 |= 1 << at.slot;
                p.freed.push(at.cell);
                p.deleted += 1;
                if sh.need_lines {
                    p.lines2.push(bucket_at(gb) / LINE);
                }
            }
            (Some(at), Val::Op(j)) => {
                let Some(cell) = shard.state.free.pop() else {
                    p.no_cell += 1;
                    continue;
                };
                p.allocated.push(cell);
                write_cell(shard, cell, j);
                let gb = first_bucket + at.bucket;
                p.refs.push((gb, at.slot, cell));
                p.freed.push(at.cell);
                if sh.need_lines {
                    push_lines(&mut p.lines1, cell_line(cell), geo.cell_bytes as u64);
                    p.lines2.push((bucket_at(gb) + geo.slot_offset(at.slot) as u64) / LINE);
                }
            }
            // Absent before and after, or untouched: nothing to write.
            (None, _) | (Some(_), Val::Cell(_)) => {}
        }
    }
}

/// Phase 2 of one worker: every net change becomes visible with one aligned store.
fn commit(geo: &Geometry, group: &mut [ShardMut<'_>], plan: &Plan) {
    let base = group.first().map_or(0, |s| s.index);
    let local = |gb: usize| (gb / geo.buckets - base, gb % geo.buckets);
    for (&gb, &(set, clear)) in &plan.bitmaps {
        let (s, b) = local(gb);
        let buckets = &mut *group[s].buckets;
        let m = meta(buckets, b);
        store_u64(buckets, b * BUCKET_BYTES, (m & !clear) | set);
    }
    for &(gb, slot, cell) in &plan.refs {
        let (s, b) = local(gb);
        store_u32(group[s].buckets, b * BUCKET_BYTES + geo.slot_offset(slot), cell);
    }
}

/// What rebuilding one shard found.
#[derive(Debug, Default)]
struct Rebuilt {
    keys: u64,
    lines: Vec<u64>,
    cleared: u64,
    set: u64,
}

/// Rebuilds a shard's free cells from its valid slots and makes its overflow bits exact.
fn rebuild_shard(geo: &Geometry, table_offset: u64, shard: &mut ShardMut<'_>) -> Result<Rebuilt> {
    let mut used = vec![false; geo.cells];
    let mut needed = vec![false; geo.buckets];
    let mut r = Rebuilt::default();
    let s = shard.index;
    for b in 0..geo.buckets {
        let m = meta(shard.buckets, b);
        if m & !(geo.slot_mask() | OVERFLOW) != 0 {
            return Err(corrupt(format!(
                "shard {s} bucket {b}: metadata word {m:#018x} has bits beyond its slots"
            )));
        }
        let mut valid = m & geo.slot_mask();
        while valid != 0 {
            let i = valid.trailing_zeros() as usize;
            valid &= valid - 1;
            let at = b * BUCKET_BYTES + geo.slot_offset(i);
            let cell = read_u32(shard.buckets, at) as usize;
            let what = || format!("shard {s} bucket {b} slot {i}");
            let local = cell
                .checked_sub(s * geo.cells)
                .filter(|&l| l < geo.cells)
                .ok_or_else(|| corrupt(format!("{}: cell {cell} is not one of the shard's", what())))?;
            if std::mem::replace(&mut used[local], true) {
                return Err(corrupt(format!("{}: cell {cell} is referenced twice", what())));
            }
            let key: Vec<u32> = shard.buckets[at + 4..at + geo.slot_bytes]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let place = geo.place(&key);
            let d = (b + geo.buckets - place.home) % geo.buckets;
            if place.shard != s || d >= geo.probe || shard.buckets[b * BUCKET_BYTES + 8 + i] != place.tag {
                return Err(corrupt(format!(
                    "{}: its key belongs to shard {} bucket {} (tag {:#04x}), not here",
                    what(),
                    place.shard,
                    place.home,
                    place.tag
                )));
            }
            for e in 0..d {
                needed[(place.home + e) % geo.buckets] = true;
            }
            r.keys += 1;
        }
    }
    for (b, &need) in needed.iter().enumerate() {
        let m = meta(shard.buckets, b);
        if need != (m & OVERFLOW != 0) {
            store_u64(shard.buckets, b * BUCKET_BYTES, m ^ OVERFLOW);
            r.lines.push((table_offset + ((s * geo.buckets + b) * BUCKET_BYTES) as u64) / LINE);
            if need { r.set += 1 } else { r.cleared += 1 }
        }
    }
    shard.state.free =
        (0..geo.cells).rev().filter(|&l| !used[l]).map(|l| (s * geo.cells + l) as u32).collect();
    Ok(r)
}

impl CpuTable {
    /// Creates a table in a new pool at `path` (`None`: anonymous memory, volatile).
    pub fn create(path: Option<&Path>, config: &CpuConfig) -> Result<CpuTable> {
        let threads = resolve_threads(config.threads);
        let geo = Geometry::new(
            config.key_bytes,
            config.value_bytes,
            config.capacity,
            threads,
            config.shards,
            config.seed,
        )?;
        let (header, total) = geo.header();
        let pool = Pool::create(path, total, &header, &CreateOptions::default())?;
        let shards = (0..geo.shards)
            .map(|s| ShardState { free: (0..geo.cells).rev().map(|l| (s * geo.cells + l) as u32).collect() })
            .collect();
        log::info!(
            "cpu baseline: {} shards x {} buckets x {} slots, {} cells of {} bytes per shard, {threads} threads",
            geo.shards,
            geo.buckets,
            geo.slots,
            geo.cells,
            geo.cell_bytes
        );
        Ok(CpuTable {
            table: header.table_region,
            heap: header.heap_region,
            pool,
            geo,
            shards,
            workers: Workers::new(threads),
            scratch: vec![],
            len: 0,
            recovery: Recovery { clean: true, ..Recovery::default() },
            poisoned: None,
        })
    }

    /// Opens a pool written by [`CpuTable::create`], closed or not: marks it dirty, rebuilds
    /// the free cells from the valid slots and makes the overflow bits exact (persisted).
    /// `threads` = 0 uses all host threads.
    pub fn open(path: &Path, threads: usize) -> Result<CpuTable> {
        let mut pool = Pool::open(path)?;
        let header = *pool.header();
        let geo = Geometry::from_header(&header, path)?;
        if header.table_region.end() > header.heap_region.offset {
            return Err(Error::IncompatiblePool {
                path: path.to_path_buf(),
                why: "the table region must come before the heap region".to_string(),
            });
        }
        pool.mark_dirty()?;
        let mut t = CpuTable {
            table: header.table_region,
            heap: header.heap_region,
            shards: vec![ShardState::default(); geo.shards],
            pool,
            geo,
            workers: Workers::new(resolve_threads(threads)),
            scratch: vec![],
            len: 0,
            recovery: Recovery { clean: header.clean_shutdown, ..Recovery::default() },
            poisoned: None,
        };
        t.rebuild()?;
        Ok(t)
    }

    fn rebuild(&mut self) -> Result<()> {
        let workers = self.workers.threads().min(self.geo.shards);
        let (geo, offset) = (&self.geo, self.table.offset);
        let groups = split(&mut self.pool, &mut self.shards, geo, self.table, self.heap, workers);
        let results = self.workers.run(groups, |_, mut group: Vec<ShardMut<'_>>| {
            group.iter_mut().map(|s| rebuild_shard(geo, offset, s)).collect::<Result<Vec<_>>>()
        });
        let mut lines = vec![];
        for r in results {
            for r in r? {
                self.recovery.keys += r.keys;
                self.recovery.overflow_cleared += r.cleared;
                self.recovery.overflow_set += r.set;
                lines.extend(r.lines);
            }
        }
        if self.recovery.overflow_set > 0 {
            log::warn!("cpu baseline: {} missing overflow bits were set", self.recovery.overflow_set);
        }
        if !lines.is_empty() {
            self.pool.persist_lines(&lines)?;
        }
        self.len = self.recovery.keys;
        self.recovery.cells_in_use = self.cells_in_use();
        log::info!("cpu baseline: opened {:?}: {:?}", self.pool.path(), self.recovery);
        Ok(())
    }

    /// Clean close: everything is durable already; the header records the clean shutdown.
    /// Dropping the table instead is a crash, which [`CpuTable::open`] recovers from.
    pub fn close(self) -> Result<()> {
        Ok(self.pool.close()?)
    }

    /// Applies a batch: `kinds` holds [`OpKind`] codes, `keys` `key_bytes / 4` words per
    /// operation, `values` `ceil(value_bytes / 4)` words per operation (may be empty when no
    /// operation carries a value: gets and deletes only). Returns a [`Status`] code per operation and, per operation,
    /// `ceil(value_bytes / 4)` words holding the value a successful get found (zeros
    /// otherwise).
    ///
    /// The results and the final state are those of applying the operations one by one in
    /// batch order. When this returns `Ok` the batch is durable. On `Err` (a full probe window,
    /// no free value cell, malformed input) nothing of the batch took effect.
    pub fn execute(&mut self, kinds: &[u32], keys: &[u32], values: &[u32]) -> Result<(Vec<u32>, Vec<u32>)> {
        if let Some(why) = &self.poisoned {
            return Err(Error::Poisoned(why.clone()));
        }
        let geo = &self.geo;
        let (n, kw, cw) = (kinds.len(), geo.key_words(), geo.cell_words());
        if keys.len() != n * kw {
            return Err(Error::InvalidConfig(format!(
                "{} key words for {n} operations of {kw} words",
                keys.len()
            )));
        }
        if let Some(i) = kinds.iter().position(|&k| OpKind::from_code(k).is_none()) {
            return Err(Error::InvalidConfig(format!("operation {i}: unknown operation code {}", kinds[i])));
        }
        let carries_values = kinds.iter().any(|&k| OpKind::from_code(k).is_some_and(OpKind::writes_value));
        let none_needed = values.is_empty() && !carries_values;
        if values.len() != n * cw && !none_needed {
            return Err(Error::InvalidConfig(format!(
                "{} value words for {n} operations of {cw} words",
                values.len()
            )));
        }
        let (mut statuses, mut found) = (vec![0u32; n], vec![0u32; n * cw]);
        if n == 0 {
            return Ok((vec![], vec![]));
        }
        let workers = n.div_ceil(OPS_PER_THREAD).clamp(1, self.workers.threads().min(geo.shards));
        let owner = (0..workers)
            .flat_map(|w| {
                let count = first_shard(w + 1, workers, geo.shards) - first_shard(w, workers, geo.shards);
                std::iter::repeat_n(w as u32, count)
            })
            .collect();
        let shared = Shared {
            geo,
            kinds,
            keys,
            values,
            statuses: atomic_view(&mut statuses),
            found: atomic_view(&mut found),
            table_offset: self.table.offset,
            heap_offset: self.heap.offset,
            need_lines: matches!(self.pool.persist_mode(), PersistMode::FlushFence | PersistMode::Msync),
            workers,
            owner,
            chunks: (0..workers).map(|_| OnceLock::new()).collect(),
            barrier: SpinBarrier::new(workers),
        };

        // Phase 1: plan, read, write the data out of place.
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize_with(workers.max(scratch.len()), Scratch::default);
        let groups = split(&mut self.pool, &mut self.shards, geo, self.table, self.heap, workers);
        let work: Vec<_> = groups.into_iter().zip(scratch.iter_mut()).collect();
        self.workers.run(work, |w, (mut group, scratch)| plan(&shared, w, &mut group, scratch));
        for (s, chunk) in scratch.iter_mut().zip(shared.chunks) {
            s.partition = chunk.into_inner().expect("every worker partitions its chunk");
        }
        let result = self.finish(&scratch[..workers]);
        self.scratch = scratch;
        result.map(|()| (statuses, found))
    }

    /// Phases after planning: persist point 1, commit, persist point 2, then the replaced
    /// and removed cells are freed. A batch that found a full probe window or no free cell is
    /// rolled back instead.
    fn finish(&mut self, scratch: &[Scratch]) -> Result<()> {
        let full: u64 = scratch.iter().map(|s| s.plan.full).sum();
        let no_cell: u64 = scratch.iter().map(|s| s.plan.no_cell).sum();
        if full > 0 || no_cell > 0 {
            self.roll_back(scratch);
            return Err(if full > 0 {
                Error::TableFull { failed: full, load: self.load(), early: false }
            } else {
                Error::HeapFull { failed: no_cell }
            });
        }
        if !scratch.iter().any(|s| s.plan.commits()) {
            return Ok(());
        }
        if let Err(e) = self.persist(scratch, |p| &p.lines1) {
            self.roll_back(scratch);
            return Err(e);
        }
        // Phase 2: commit each key with one aligned store. Workers without commits stay idle.
        let geo = &self.geo;
        let groups = split(&mut self.pool, &mut self.shards, geo, self.table, self.heap, scratch.len());
        let work: Vec<_> = groups.into_iter().zip(scratch).filter(|(_, s)| s.plan.commits()).collect();
        self.workers.run(work, |_, (mut group, s)| commit(geo, &mut group, &s.plan));
        if let Err(e) = self.persist(scratch, |p| &p.lines2) {
            let why = format!("persisting a batch's commit failed: {e}");
            self.poisoned = Some(why);
            return Err(e);
        }
        // Durable: the cells this batch replaced or removed are free now.
        for p in scratch.iter().map(|s| &s.plan) {
            for &c in &p.freed {
                self.shards[c as usize / self.geo.cells].free.push(c);
            }
            self.len = self.len + p.inserted - p.deleted;
        }
        Ok(())
    }

    /// Returns the cells a failed batch took.
    fn roll_back(&mut self, scratch: &[Scratch]) {
        for p in scratch.iter().map(|s| &s.plan) {
            for &c in &p.allocated {
                self.shards[c as usize / self.geo.cells].free.push(c);
            }
        }
    }

    /// One persist point for the lines `lines` selects (just a fence or nothing where the
    /// persist mode ignores lines).
    fn persist(&self, scratch: &[Scratch], lines: impl Fn(&Plan) -> &Vec<u64>) -> Result<()> {
        if matches!(self.pool.persist_mode(), PersistMode::FlushFence | PersistMode::Msync) {
            let all: Vec<u64> = scratch.iter().flat_map(|s| lines(&s.plan).iter().copied()).collect();
            self.pool.persist_lines(&all)?;
        } else {
            self.pool.persist_lines(&[])?;
        }
        Ok(())
    }

    /// Published keys.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no key is published.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Published keys over slots.
    pub fn load(&self) -> f64 {
        self.len as f64 / self.geo.total_slots() as f64
    }

    /// The table's geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    /// Host threads that run a batch (the caller's and parked ones).
    pub fn threads(&self) -> usize {
        self.workers.threads()
    }

    /// Sets the host threads that run a batch (0 = all). A batch wakes one per 256 operations,
    /// and at most one per shard.
    pub fn set_threads(&mut self, threads: usize) {
        let threads = resolve_threads(threads);
        if threads != self.workers.threads() {
            self.workers = Workers::new(threads);
            self.scratch.truncate(threads);
        }
    }

    /// What [`CpuTable::open`] found; for a created table, `clean` and nothing else.
    pub fn recovery(&self) -> Recovery {
        self.recovery
    }

    /// The pool (backend, persist mode, bytes).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The pool, writable: to change its persist mode, or for tests that damage it.
    pub fn pool_mut(&mut self) -> &mut Pool {
        &mut self.pool
    }

    /// Sets the function shown the pool at every persist point (see [`Pool::set_observer`])
    /// and shows it the current, durable pool at once.
    pub fn set_observer(&mut self, observer: Option<Observer>) -> Result<()> {
        self.pool.set_observer(observer);
        Ok(self.pool.persist_lines(&[])?)
    }

    /// Value cells taken (by published keys, when no batch is running: always, between calls).
    pub fn cells_in_use(&self) -> u64 {
        self.shards.iter().map(|s| (self.geo.cells - s.free.len()) as u64).sum()
    }

    fn shard_bytes(&self, s: usize) -> (&[u8], &[u8]) {
        let g = &self.geo;
        let table = self.pool.region(self.table);
        let heap = self.pool.region(self.heap);
        let tb = g.buckets * BUCKET_BYTES;
        let hb = g.cells * g.cell_bytes;
        (&table[s * tb..(s + 1) * tb], &heap[s * hb..(s + 1) * hb])
    }

    /// Every published key and its value, in table order.
    pub fn entries(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let g = &self.geo;
        let mut out = Vec::with_capacity(self.len as usize);
        for s in 0..g.shards {
            let (buckets, cells) = self.shard_bytes(s);
            for b in 0..g.buckets {
                let mut valid = meta(buckets, b) & g.slot_mask();
                while valid != 0 {
                    let i = valid.trailing_zeros() as usize;
                    valid &= valid - 1;
                    let at = b * BUCKET_BYTES + g.slot_offset(i);
                    let cell = read_u32(buckets, at) as usize - s * g.cells;
                    let v = &cells[cell * g.cell_bytes..][..g.value_bytes];
                    out.push((buckets[at + 4..at + g.slot_bytes].to_vec(), v.to_vec()));
                }
            }
        }
        out
    }

    /// Checks the table's invariants: every valid slot's key is found by a search at that
    /// slot (so no key is published twice) with the right tag, cells are the shard's and
    /// referenced once, the free lists hold exactly the other cells, `len` counts the keys.
    pub fn check(&self) -> std::result::Result<(), String> {
        let g = &self.geo;
        let mut keys = 0u64;
        for s in 0..g.shards {
            let (buckets, _) = self.shard_bytes(s);
            let mut used = vec![false; g.cells];
            for b in 0..g.buckets {
                let m = meta(buckets, b);
                if m & !(g.slot_mask() | OVERFLOW) != 0 {
                    return Err(format!("shard {s} bucket {b}: metadata word {m:#018x}"));
                }
                let mut valid = m & g.slot_mask();
                while valid != 0 {
                    let i = valid.trailing_zeros() as usize;
                    valid &= valid - 1;
                    let at = b * BUCKET_BYTES + g.slot_offset(i);
                    let cell = read_u32(buckets, at) as usize;
                    let key: Vec<u32> = buckets[at + 4..at + g.slot_bytes]
                        .chunks_exact(4)
                        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                        .collect();
                    let place = g.place(&key);
                    let here = At { bucket: b, slot: i, cell: cell as u32 };
                    if place.shard != s || find(g, buckets, place, &key) != Some(here) {
                        return Err(format!(
                            "shard {s} bucket {b} slot {i}: key {key:x?} is not found there"
                        ));
                    }
                    match cell.checked_sub(s * g.cells).filter(|&l| l < g.cells) {
                        Some(l) if !used[l] => used[l] = true,
                        _ => {
                            return Err(format!(
                                "shard {s} bucket {b} slot {i}: cell {cell} foreign or shared"
                            ));
                        }
                    }
                    keys += 1;
                }
            }
            let mut free = vec![false; g.cells];
            for &c in &self.shards[s].free {
                let l = (c as usize).checked_sub(s * g.cells).filter(|&l| l < g.cells);
                match l {
                    Some(l) if !used[l] && !free[l] => free[l] = true,
                    _ => return Err(format!("shard {s}: free cell {c} is foreign, in use or listed twice")),
                }
            }
            if let Some(l) = (0..g.cells).find(|&l| !used[l] && !free[l]) {
                return Err(format!("shard {s}: cell {} is neither used nor free", s * g.cells + l));
            }
        }
        if keys != self.len {
            return Err(format!("{keys} keys in the table, len says {}", self.len));
        }
        Ok(())
    }

    /// Mean buckets a search reads: `(miss, hit)`. A miss from bucket `b` reads `b` and every
    /// following bucket while the one before has its overflow bit (up to the probe limit), the
    /// mean over all home buckets; a hit is modelled as reading half of that run beyond the
    /// home bucket.
    pub fn probe_buckets(&self) -> (f64, f64) {
        let g = &self.geo;
        let mut total = 0u64;
        for s in 0..g.shards {
            let (buckets, _) = self.shard_bytes(s);
            for b in 0..g.buckets {
                let mut d = 1;
                while d < g.probe && meta(buckets, (b + d - 1) % g.buckets) & OVERFLOW != 0 {
                    d += 1;
                }
                total += d as u64;
            }
        }
        let miss = total as f64 / (g.shards * g.buckets) as f64;
        (miss, 1.0 + (miss - 1.0) / 2.0)
    }
}
