//! The CPU twin of the slab table: the same layout and operations, applied one by one, and
//! the host side of the protocol (reading the table, recovery with the undo log).
//!
//! Twin of `shaders/slab_probe.wgsl` and `shaders/slab_commit.wgsl`: a search walks the
//! bucket's chain; an insertion of an absent key takes the first free entry of the chain (a
//! new slab linked at the tail when there is none); update swings the reference word to a
//! fresh cell; delete empties the reference word. The GPU serves many operations at once and
//! may pick other free entries and cells; contents and results are what the tests compare.

use host_pm::Pool;

use super::layout::{
    EMPTY, FILLING, LOG_ENTRY_WORDS, LOG_VALID, MAX_REF, NEXT_WORD, NONE, SLAB_WORDS, SlabGeometry, log_check,
};
use gphash::{Error, Result};
use gphash::{OpKind, Status};

/// Walks the chain of `bucket`: its slab ids, in order. `Err` names a pointer out of range or
/// a cycle.
pub fn chain(geo: &SlabGeometry, table: &[u32], bucket: u32) -> std::result::Result<Vec<u32>, String> {
    let mut out = vec![bucket];
    let mut s = bucket;
    loop {
        let next = table[(geo.slab_word(s) + NEXT_WORD) as usize];
        if next == NONE {
            return Ok(out);
        }
        if next < geo.buckets || next as u64 >= geo.slabs() {
            return Err(format!("slab {s} of bucket {bucket} points to slab {next}, not a pool slab"));
        }
        if out.len() as u64 > geo.slabs() || out.contains(&next) {
            return Err(format!("the chain of bucket {bucket} has a cycle at slab {next}"));
        }
        out.push(next);
        s = next;
    }
}

/// The key words of entry `e` of slab `s`.
fn key_of<'a>(geo: &SlabGeometry, table: &'a [u32], s: u32, e: u32) -> &'a [u32] {
    let at = (geo.slab_word(s) + e * geo.entry_words()) as usize;
    &table[at..at + geo.key_words() as usize]
}

/// Every published key with its value, bucket by bucket (keys and values as bytes).
pub fn entries(geo: &SlabGeometry, table: &[u32], heap: &[u32]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = vec![];
    for b in 0..geo.buckets {
        for s in chain(geo, table, b).map_err(corrupt)? {
            for e in 0..geo.entries() {
                let r = table[geo.ref_word(s, e) as usize];
                if r >= MAX_REF {
                    continue;
                }
                if r >= geo.cells {
                    return Err(corrupt(format!("slab {s} entry {e} references cell {r} of {}", geo.cells)));
                }
                let key: Vec<u8> = key_of(geo, table, s, e).iter().flat_map(|w| w.to_le_bytes()).collect();
                let cw = geo.cell_words() as usize;
                let cell = &heap[r as usize * cw..(r as usize + 1) * cw];
                let mut value: Vec<u8> = cell.iter().flat_map(|w| w.to_le_bytes()).collect();
                value.truncate(geo.value_bytes as usize);
                out.push((key, value));
            }
        }
    }
    Ok(out)
}

/// The published keys of every bucket (as bytes, sorted): what the GPU and the twin must agree
/// on exactly, whatever entries and slabs each picked.
pub fn bucket_keys(geo: &SlabGeometry, table: &[u32]) -> Result<Vec<Vec<Vec<u8>>>> {
    (0..geo.buckets)
        .map(|b| {
            let mut keys = vec![];
            for s in chain(geo, table, b).map_err(corrupt)? {
                for e in 0..geo.entries() {
                    if table[geo.ref_word(s, e) as usize] < MAX_REF {
                        keys.push(key_of(geo, table, s, e).iter().flat_map(|w| w.to_le_bytes()).collect());
                    }
                }
            }
            keys.sort();
            Ok(keys)
        })
        .collect()
}

fn corrupt(what: String) -> Error {
    Error::Pool(host_pm::PoolError::Corrupt { what: format!("slab table: {what}") })
}

/// The state of the undo log in a table region: `Some((entries, batch sequence))` when valid.
pub fn log_state(geo: &SlabGeometry, table: &[u32]) -> Option<(u32, u32)> {
    let (magic, count, seq, check) = (table[0], table[1], table[2], table[3]);
    (magic == LOG_VALID && check == log_check(count, seq) && count <= geo.log_capacity())
        .then_some((count, seq))
}

/// What recovery found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Slabs copied back from a valid undo log (an unacknowledged batch undone), if there was one.
    pub undone: Option<u32>,
    /// Published keys.
    pub items: u64,
    /// Pool slabs linked into chains.
    pub pool_slabs_used: u64,
    /// Unreachable slabs that held data (of an undone batch) and were reset to free.
    pub cleaned_slabs: u64,
    /// Entries left FILLING and cleared.
    pub cleared_filling: u64,
    /// The slab allocator: bit `s` set when slab `s` is in use (base slabs always are; bits past
    /// the last slab are set).
    pub slab_bits: Vec<u32>,
    /// The cell allocator: bit `c` set when cell `c` is referenced (bits past the last set).
    pub cell_bits: Vec<u32>,
}

impl std::fmt::Display for Recovered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.undone {
            Some(n) => write!(f, "undid an interrupted batch ({n} slabs restored from the undo log); ")?,
            None => write!(f, "no interrupted batch; ")?,
        }
        write!(
            f,
            "{} keys, {} pool slabs in use, {} free slabs reset, {} unfinished entries cleared",
            self.items, self.pool_slabs_used, self.cleaned_slabs, self.cleared_filling
        )
    }
}

/// A bitmap of `bits` bits with the bits past the end set.
fn bitmap(bits: u64) -> Vec<u32> {
    let mut words = vec![0u32; bits.div_ceil(32) as usize];
    if !bits.is_multiple_of(32) {
        *words.last_mut().unwrap() = !0u32 << (bits % 32);
    }
    words
}

fn set_bit(words: &mut [u32], i: u64) -> bool {
    let (w, b) = ((i / 32) as usize, 1u32 << (i % 32));
    let was = words[w] & b != 0;
    words[w] |= b;
    was
}

/// Brings a pool to a consistent state and rebuilds the allocators.
///
/// 1. A valid undo log (header magic and check word right) means a batch was not acknowledged:
///    its slabs are copied back and persisted, then the log is invalidated and persisted.
///    Copying back is idempotent, so a crash during recovery recovers again.
/// 2. Every chain is walked: pointers must lead to pool slabs without cycles, published
///    references to distinct cells. Entries left FILLING are cleared.
/// 3. Pool slabs on no chain are free; those holding anything are reset to all-ones (free slabs
///    are always clean, so a slab linked into a chain never shows stale entries).
pub fn recover(pool: &mut Pool, geo: &SlabGeometry) -> Result<Recovered> {
    let region = pool.header().table_region;
    let base = region.offset;
    let mut rec = Recovered::default();
    let mut persist: Vec<(u64, u64)> = vec![];
    {
        let table: &mut [u32] =
            bytemuck::cast_slice_mut(&mut pool.region_mut(region)[..geo.table_bytes() as usize]);
        if let Some((count, _)) = log_state(geo, table) {
            for i in 0..count {
                let at = geo.log_word(i) as usize;
                let s = table[at];
                if s as u64 >= geo.slabs() {
                    return Err(corrupt(format!("undo log entry {i} names slab {s} of {}", geo.slabs())));
                }
                let dst = geo.slab_word(s) as usize;
                table.copy_within(at + 1..at + LOG_ENTRY_WORDS as usize, dst);
                persist.push((dst as u64 * 4, SLAB_WORDS as u64 * 4));
            }
            rec.undone = Some(count);
        }
    }
    if rec.undone.is_some() {
        for &(at, len) in &persist {
            pool.persist_range(base + at, len)?;
        }
        persist.clear();
        let table: &mut [u32] = bytemuck::cast_slice_mut(&mut pool.region_mut(region)[..16]);
        table[0] = 0;
        pool.persist_range(base, 4)?;
    }
    let mut slab_bits = bitmap(geo.slabs());
    let mut cell_bits = bitmap(geo.cells as u64);
    {
        let table: &mut [u32] =
            bytemuck::cast_slice_mut(&mut pool.region_mut(region)[..geo.table_bytes() as usize]);
        for b in 0..geo.buckets {
            let slabs = chain(geo, table, b).map_err(corrupt)?;
            for &s in &slabs {
                if set_bit(&mut slab_bits, s as u64) {
                    return Err(corrupt(format!("slab {s} is on two chains")));
                }
                if s >= geo.buckets {
                    rec.pool_slabs_used += 1;
                }
                for e in 0..geo.entries() {
                    let w = geo.ref_word(s, e) as usize;
                    match table[w] {
                        EMPTY => {}
                        FILLING => {
                            table[w] = EMPTY;
                            rec.cleared_filling += 1;
                            persist.push((w as u64 * 4, 4));
                        }
                        r if r < geo.cells => {
                            if set_bit(&mut cell_bits, r as u64) {
                                return Err(corrupt(format!("cell {r} is referenced twice")));
                            }
                            rec.items += 1;
                        }
                        r => return Err(corrupt(format!("slab {s} entry {e} holds reference {r:#x}"))),
                    }
                }
            }
        }
        for s in geo.buckets..geo.slabs() as u32 {
            let at = geo.slab_word(s) as usize;
            let slab = &mut table[at..at + SLAB_WORDS as usize];
            if slab_bits[(s / 32) as usize] & (1 << (s % 32)) == 0 && slab.iter().any(|&w| w != EMPTY) {
                slab.fill(EMPTY);
                rec.cleaned_slabs += 1;
                persist.push((at as u64 * 4, SLAB_WORDS as u64 * 4));
            }
        }
    }
    for &(at, len) in &persist {
        pool.persist_range(base + at, len)?;
    }
    rec.slab_bits = slab_bits;
    rec.cell_bits = cell_bits;
    Ok(rec)
}

/// What a search of the twin saw.
struct Search {
    /// The key's reference word (index) and reference, when published.
    found: Option<(usize, u32)>,
    /// The first free entry of the chain (slab, entry).
    free: Option<(u32, u32)>,
    /// The last slab of the chain.
    tail: u32,
}

/// The slab table on the CPU, applied one operation at a time (the twin of the kernels).
#[derive(Clone, Debug)]
pub struct SlabModel {
    /// Geometry.
    pub geo: SlabGeometry,
    /// Table region words (log header, slabs, log).
    pub table: Vec<u32>,
    /// Heap words.
    pub heap: Vec<u32>,
    slab_bits: Vec<u32>,
    cell_bits: Vec<u32>,
    items: u64,
}

/// A slab table that ran out of slabs or cells (the GPU rolls such a batch back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    /// No free pool slab.
    Slabs,
    /// No free value cell.
    Cells,
}

impl SlabModel {
    /// An empty table: every slab free (all ones), the log invalid.
    pub fn new(geo: SlabGeometry) -> Self {
        let mut table = vec![EMPTY; geo.table_words() as usize];
        table[..super::layout::LOG_HEADER_WORDS as usize].fill(0);
        let mut slab_bits = bitmap(geo.slabs());
        for b in 0..geo.buckets as u64 {
            set_bit(&mut slab_bits, b);
        }
        SlabModel {
            geo,
            table,
            heap: vec![0; geo.heap_words() as usize],
            slab_bits,
            cell_bits: bitmap(geo.cells as u64),
            items: 0,
        }
    }

    /// Published keys.
    pub fn len(&self) -> u64 {
        self.items
    }

    /// Whether no key is published.
    pub fn is_empty(&self) -> bool {
        self.items == 0
    }

    fn take(bits: &mut [u32]) -> Option<u32> {
        let w = bits.iter().position(|&w| w != u32::MAX)?;
        let b = (!bits[w]).trailing_zeros();
        bits[w] |= 1 << b;
        Some(w as u32 * 32 + b)
    }

    fn release(bits: &mut [u32], i: u32) {
        bits[(i / 32) as usize] &= !(1 << (i % 32));
    }

    /// Searches `key` along its chain.
    fn search(&self, key: &[u32]) -> Search {
        let g = &self.geo;
        let mut free = None;
        let mut s = g.bucket(key);
        loop {
            for e in 0..g.entries() {
                let w = g.ref_word(s, e) as usize;
                let r = self.table[w];
                if r < MAX_REF && key_of(g, &self.table, s, e) == key {
                    return Search { found: Some((w, r)), free, tail: s };
                }
                if r == EMPTY && free.is_none() {
                    free = Some((s, e));
                }
            }
            let next = self.table[(g.slab_word(s) + NEXT_WORD) as usize];
            if next == NONE {
                return Search { found: None, free, tail: s };
            }
            s = next;
        }
    }

    fn new_cell(&mut self, value: &[u8]) -> std::result::Result<u32, Full> {
        let c = Self::take(&mut self.cell_bits).ok_or(Full::Cells)?;
        let cw = self.geo.cell_words() as usize;
        let mut cell = vec![0u8; cw * 4];
        cell[..value.len()].copy_from_slice(value);
        for (i, w) in cell.chunks_exact(4).enumerate() {
            self.heap[c as usize * cw + i] = u32::from_le_bytes(w.try_into().unwrap());
        }
        Ok(c)
    }

    /// Applies one operation; the status and, for a get that finds its key, the value.
    pub fn apply(
        &mut self,
        kind: OpKind,
        key: &[u8],
        value: &[u8],
    ) -> std::result::Result<(Status, Option<Vec<u8>>), Full> {
        let g = self.geo;
        let key: Vec<u32> = key.chunks_exact(4).map(|w| u32::from_le_bytes(w.try_into().unwrap())).collect();
        let Search { found, free, tail } = self.search(&key);
        Ok(match (kind, found) {
            (OpKind::Get, Some((_, r))) => {
                let cw = g.cell_words() as usize;
                let mut v: Vec<u8> = self.heap[r as usize * cw..(r as usize + 1) * cw]
                    .iter()
                    .flat_map(|w| w.to_le_bytes())
                    .collect();
                v.truncate(g.value_bytes as usize);
                (Status::Ok, Some(v))
            }
            (OpKind::Insert, Some(_)) => (Status::Exists, None),
            (OpKind::Update | OpKind::Upsert, Some((w, r))) => {
                let c = self.new_cell(value)?;
                self.table[w] = c;
                Self::release(&mut self.cell_bits, r);
                (Status::Ok, None)
            }
            (OpKind::Delete, Some((w, r))) => {
                self.table[w] = EMPTY;
                Self::release(&mut self.cell_bits, r);
                self.items -= 1;
                (Status::Ok, None)
            }
            (OpKind::Get | OpKind::Update | OpKind::Delete, None) => (Status::NotFound, None),
            (OpKind::Insert | OpKind::Upsert, None) => {
                let (s, e) = match free {
                    Some(f) => f,
                    None => {
                        let mut bits = self.slab_bits.clone();
                        let s = Self::take(&mut bits).ok_or(Full::Slabs)?;
                        self.slab_bits = bits;
                        self.table[(g.slab_word(tail) + NEXT_WORD) as usize] = s;
                        (s, 0)
                    }
                };
                let c = self.new_cell(value)?;
                let at = (g.slab_word(s) + e * g.entry_words()) as usize;
                self.table[at..at + key.len()].copy_from_slice(&key);
                self.table[at + key.len()] = c;
                self.items += 1;
                (Status::Ok, None)
            }
        })
    }

    /// Every published key with its value.
    pub fn entries(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        entries(&self.geo, &self.table, &self.heap).expect("the twin's table is consistent")
    }

    /// Pool slabs linked into chains.
    pub fn pool_slabs_used(&self) -> u64 {
        let used: u64 = self.slab_bits.iter().map(|w| w.count_ones() as u64).sum();
        used - (self.slab_bits.len() as u64 * 32 - self.geo.slabs()) - self.geo.buckets as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twin_chains_grow_and_entries_are_reused() {
        let geo = SlabGeometry::new(8, 8, 2, 20, 200, 5).unwrap();
        let mut m = SlabModel::new(geo);
        let key = |k: u64| k.to_le_bytes();
        for k in 0..60u64 {
            assert_eq!(m.apply(OpKind::Insert, &key(k), &key(k + 1)).unwrap().0, Status::Ok);
        }
        assert_eq!(m.len(), 60);
        assert!(m.pool_slabs_used() >= 4, "60 keys in 2 buckets of 10 entries need chains");
        assert_eq!(m.apply(OpKind::Insert, &key(3), &key(0)).unwrap().0, Status::Exists);
        assert_eq!(m.apply(OpKind::Get, &key(3), &[]).unwrap(), (Status::Ok, Some(key(4).to_vec())));
        let used = m.pool_slabs_used();
        for k in 0..30u64 {
            assert_eq!(m.apply(OpKind::Delete, &key(k), &[]).unwrap().0, Status::Ok);
        }
        for k in 100..130u64 {
            m.apply(OpKind::Upsert, &key(k), &key(k)).unwrap();
        }
        assert_eq!(m.pool_slabs_used(), used, "deleted entries are reused before new slabs");
        assert_eq!(m.entries().len(), 60);
        let keys = bucket_keys(&geo, &m.table).unwrap();
        assert_eq!(keys.iter().map(Vec::len).sum::<usize>(), 60);
    }

    #[test]
    fn twin_reports_full() {
        let geo = SlabGeometry::new(8, 8, 1, 0, 100, 5).unwrap();
        let mut m = SlabModel::new(geo);
        for k in 0..10u64 {
            m.apply(OpKind::Insert, &k.to_le_bytes(), &[0; 8]).unwrap();
        }
        assert_eq!(m.apply(OpKind::Insert, &99u64.to_le_bytes(), &[0; 8]), Err(Full::Slabs));
    }
}
