//! The CPU model of the table: the same layout, hashes and slot protocol as the kernels, one
//! operation at a time. It is the tests' oracle and the executor used where no GPU exists.
//!
//! Each function mirrors one kernel stage (`shaders/<stage>.wgsl`); running every operation
//! of a batch through a stage before the next stage starts is one of the interleavings the
//! GPU may produce, so for batches of distinct keys the results are identical.

use crate::hash::{Seeds, hash_words, locate, value_checksum};
use crate::layout::{Candidate, EMPTY, Geometry, INSERTING, Layout, PUBLISHED};
use std::collections::HashMap;

use crate::batch::Encoded;
use crate::protocol::{NONE, OpKind, OpState, Status, control, phase};

/// The batch control block: counters indexed by [`control`] constants.
pub(crate) type Control = [u32; control::WORDS];

/// The persistent words of a table: its bucket array and its value heap.
pub struct Mem<'a> {
    /// Table region as 32-bit words.
    pub table: &'a mut [u32],
    /// Heap region as 32-bit words.
    pub heap: &'a mut [u32],
}

/// Cache lines written since the last persist, as pool line indices.
#[derive(Debug, Default)]
pub struct Dirty {
    /// Pool offset of the table region, in 64-byte lines.
    pub table_base: u64,
    /// Pool offset of the heap region, in 64-byte lines.
    pub heap_base: u64,
    /// Lines written (unsorted, may repeat).
    pub lines: Vec<u64>,
}

impl Dirty {
    fn words(&mut self, base: u64, first: u64, count: u64) {
        let (a, b) = (first * 4 / 64, ((first + count) * 4).div_ceil(64));
        self.lines.extend((a..b).map(|l| base + l));
    }

    fn table(&mut self, first: u64, count: u64) {
        self.words(self.table_base, first, count)
    }

    fn heap(&mut self, first: u64, count: u64) {
        self.words(self.heap_base, first, count)
    }
}

/// The volatile value-cell allocator: one bit per cell, set = in use. Cells are numbered over
/// the whole heap (`Geometry::cell_index`); arena `p` of `A` has bitmap words `p, p + A, ..`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bitmap {
    /// Bit `i % 32` of word `i / 32` is cell `i`; bits past the last cell are set.
    pub words: Vec<u32>,
    /// Per arena, the bitmap word the next allocation looks at first.
    cursors: Vec<usize>,
}

impl Bitmap {
    /// An allocator with every cell free, in `arenas` arenas.
    pub fn new(cells: u64, arenas: u64) -> Self {
        let mut words = vec![0u32; cells.div_ceil(32) as usize];
        if let Some(last) = words.last_mut() {
            *last = Bitmap::past_cells(cells);
        }
        Bitmap::from_words(words, arenas)
    }

    /// The bits of the last word that lie past the last of `cells` cells: an allocator keeps
    /// them set, so that they are never handed out.
    pub fn past_cells(cells: u64) -> u32 {
        match (cells % 32) as u32 {
            0 => 0,
            tail => !0u32 << tail,
        }
    }

    /// The allocator whose bitmap words are `words` (as the GPU engine holds them).
    pub fn from_words(words: Vec<u32>, arenas: u64) -> Self {
        Bitmap { words, cursors: vec![0; arenas as usize] }
    }

    /// Arenas of the heap.
    fn arenas(&self) -> usize {
        self.cursors.len()
    }

    /// The same allocator over a heap grown from `cells` to `grown` cells (the new ones free).
    pub fn grown(mut self, cells: u64, grown: u64) -> Self {
        let fresh = Bitmap::new(grown, 1);
        // The bits past the old last cell are cells now.
        *self.words.last_mut().expect("a heap has cells") &= !Bitmap::past_cells(cells);
        self.words.extend_from_slice(&fresh.words[self.words.len()..]);
        let last = self.words.len() - 1;
        self.words[last] |= fresh.words[last];
        self
    }

    /// Words of the summary of a bitmap of `words` words: a bit per word.
    pub fn summary_words(words: usize) -> usize {
        words.div_ceil(32).max(1)
    }

    /// What the allocation kernels keep beside the bitmap: the summary, bit `w % 32` of word
    /// `w / 32` set when bitmap word `w` is full (no free cell); then a next-fit cursor per
    /// arena, a counter of the arena's cells, where its free cells are thickest: at the first
    /// word of the arena's longest run of words with every cell free (the tail a load left, the
    /// quarter a growth added), else at its first word with a free cell, else 0. One pass: an
    /// open makes it for the whole heap.
    pub fn allocator_words(&self) -> Vec<u32> {
        let arenas = self.arenas();
        let summary = Bitmap::summary_words(self.words.len());
        let mut words = vec![0u32; summary + arenas];
        for (w, &bits) in self.words.iter().enumerate() {
            if bits == !0 {
                words[w / 32] |= 1 << (w % 32);
            }
        }
        for arena in 0..arenas {
            let (mut best, mut best_len, mut run_start, mut first_free) = (0, 0, 0, None);
            for (i, &bits) in self.words.iter().skip(arena).step_by(arenas).enumerate() {
                if bits != !0 && first_free.is_none() {
                    first_free = Some(i);
                }
                if bits != 0 {
                    run_start = i + 1;
                } else if i + 1 - run_start > best_len {
                    (best, best_len) = (run_start, i + 1 - run_start);
                }
            }
            let roomiest = if best_len > 0 { best } else { first_free.unwrap_or(0) };
            words[summary + arena] = (roomiest * 32) as u32;
        }
        words
    }

    /// Takes a free cell of arena `arena`; returns its number within the arena.
    pub fn alloc(&mut self, arena: u32) -> Option<u32> {
        let arenas = self.arenas();
        let mine = (self.words.len() + arenas - 1 - arena as usize) / arenas;
        let cursor = &mut self.cursors[arena as usize];
        for i in 0..mine {
            let j = (*cursor + i) % mine;
            let w = j * arenas + arena as usize;
            if self.words[w] != !0 {
                let bit = (!self.words[w]).trailing_zeros();
                self.words[w] |= 1 << bit;
                *cursor = j;
                return Some((j * 32) as u32 + bit);
            }
        }
        None
    }

    /// Returns heap cell `cell`.
    pub fn free(&mut self, cell: u64) {
        self.words[(cell / 32) as usize] &= !(1 << (cell % 32));
    }

    /// Cells in use.
    pub fn used(&self, cells: u64) -> u64 {
        let set: u64 = self.words.iter().map(|w| w.count_ones() as u64).sum();
        set - (self.words.len() as u64 * 32 - cells)
    }
}

/// One key's candidate slots as probed: what phase A and B decide from.
#[derive(Debug)]
pub struct Probe {
    /// The candidates, in kernel order (`c = (h * L + level) * S + slot`).
    pub candidates: Vec<Candidate>,
    /// The key's fingerprint.
    pub fingerprint: u32,
    /// Per candidate: the state word read.
    pub states: Vec<u32>,
    /// Per candidate: fingerprint and key equal the probed key.
    pub key_equal: Vec<bool>,
}

impl Probe {
    /// First candidate holding the key published.
    pub fn published(&self) -> Option<usize> {
        (0..self.candidates.len()).find(|&c| self.key_equal[c] && self.states[c] >= PUBLISHED)
    }

    /// The candidate an insertion claims: the lowest empty slot of the candidate bucket with the
    /// most empty slots in the highest level that has one (ties: the lowest candidate bucket,
    /// i.e. first hash).
    pub fn empty_target(&self, layout: &Layout) -> Option<usize> {
        let (slots, levels) = (layout.slots, layout.levels as usize);
        let buckets = self.candidates.len() / slots as usize;
        let empties = |cb: usize| {
            (0..slots as usize).filter(|&s| self.states[cb * slots as usize + s] == EMPTY).count()
        };
        // Candidate buckets are numbered `h * levels + level`; the best has the lowest level,
        // then the most empty slots, then the lowest number.
        let best = (0..buckets)
            .map(|cb| (cb, empties(cb)))
            .filter(|&(_, n)| n > 0)
            .min_by_key(|&(cb, n)| (cb % levels, std::cmp::Reverse(n), cb));
        let base = best?.0 * slots as usize;
        (base..base + slots as usize).find(|&c| self.states[c] == EMPTY)
    }
}

/// One batch's working state: what the kernels keep in device buffers between stages.
#[derive(Debug, Default)]
pub struct BatchRun {
    /// Per-operation records.
    pub states: Vec<OpState>,
    /// Per-operation results.
    pub statuses: Vec<u32>,
    /// Values read by gets (`value_words` per operation).
    pub values: Vec<u32>,
    /// The claim registry: key -> the operation that claims it in this batch.
    pub claims: HashMap<Vec<u32>, u32>,
    /// The control block.
    pub control: Control,
}

impl BatchRun {
    /// The state of a batch of `n` operations before the allocation stage.
    pub fn new(n: usize, value_words: usize) -> Self {
        BatchRun {
            states: vec![OpState::INITIAL; n],
            statuses: vec![0; n],
            values: vec![0; n * value_words],
            ..Default::default()
        }
    }
}

/// The model of one table: geometry and seeds.
pub struct Model<'g> {
    /// Table geometry.
    pub geo: &'g Geometry,
    /// Hash seeds.
    pub seeds: &'g Seeds,
    /// Reads check their value's checksum (`VERIFY_VALUES` of the kernels).
    pub verify_values: bool,
}

impl Model<'_> {
    /// Reads every candidate slot of `key` (twin of `probe` in `common/probe.wgsl`, which skips
    /// the lower levels when the top level holds the key: a key is in at most one slot, so what
    /// it decides from is the same).
    pub fn probe(&self, table: &[u32], key: &[u32]) -> Probe {
        let geo = self.geo;
        let (tops, fingerprint) = locate(key, self.seeds, geo.top_level, geo.location_bits());
        let kw = geo.key_words() as usize;
        let candidates: Vec<Candidate> =
            (0..geo.layout.candidates()).map(|c| geo.candidate(&tops, c)).collect();
        let states = candidates.iter().map(|c| table[geo.state_word(c.bucket, c.slot) as usize]).collect();
        let key_equal = candidates
            .iter()
            .map(|c| {
                let k = geo.key_word(c.bucket, c.slot) as usize;
                table[geo.fp_word(c.bucket, c.slot) as usize] == fingerprint && table[k..k + kw] == *key
            })
            .collect();
        Probe { candidates, fingerprint, states, key_equal }
    }

    /// The state word of the slot operation record `st` names.
    fn state_index(&self, st: &OpState) -> usize {
        self.geo.state_word(st.bucket as u64, st.slot) as usize
    }

    /// Allocation stage (`shaders/alloc.wgsl`) for operation `i`: a fresh cell holding the
    /// operation's value and its checksum.
    pub fn alloc(
        &self,
        mem: &mut Mem,
        bitmap: &mut Bitmap,
        dirty: &mut Dirty,
        batch: &Encoded,
        run: &mut BatchRun,
        i: usize,
    ) {
        let kind = OpKind::from_code(batch.kinds[i]).expect("encoded from OpKind");
        let kw = self.geo.key_words() as usize;
        let st = &mut run.states[i];
        // Every cell the operation names (a delete's too) is in its key's arena.
        st.arena = self.geo.arena_of(hash_words(&batch.keys[i * kw..(i + 1) * kw], self.seeds.fingerprint));
        if !kind.writes_value() {
            return;
        }
        let Some(cell) = bitmap.alloc(st.arena) else {
            st.phase = phase::NO_CELL;
            run.control[control::NO_CELL] += 1;
            return;
        };
        run.control[control::ALLOCATED] += 1;
        let (vw, cw) = (self.geo.value_words() as usize, self.geo.cell_words() as usize);
        let value = &batch.values[i * vw..(i + 1) * vw];
        let at = self.geo.cell_index(st.arena, cell) as usize * cw;
        mem.heap[at..at + vw].copy_from_slice(value);
        mem.heap[at + vw] = value_checksum(value);
        dirty.heap(at as u64, cw as u64);
        st.cell = cell;
    }

    /// Phase A (`shaders/phase_a.wgsl`) for operation `i`: look the key up; reads finish here.
    /// The first operation of the batch that inserts an absent key registers in the batch's
    /// claim registry and claims a slot (EMPTY -> INSERTING, then fingerprint and key); later
    /// operations on that key join it instead, so a key is claimed at most once per batch.
    pub fn phase_a(&self, mem: &mut Mem, dirty: &mut Dirty, batch: &Encoded, run: &mut BatchRun, i: usize) {
        let st = &mut run.states[i];
        if st.phase == phase::NO_CELL {
            return;
        }
        let geo = self.geo;
        let (kw, vw, cw) = (geo.key_words() as usize, geo.value_words() as usize, geo.cell_words() as usize);
        let key = &batch.keys[i * kw..(i + 1) * kw];
        let kind = OpKind::from_code(batch.kinds[i]).expect("encoded from OpKind");
        let probe = self.probe(mem.table, key);
        let found = probe.published();
        let status = &mut run.statuses[i];
        let done = |st: &mut OpState, status: &mut u32, s: Status| {
            st.phase = phase::DONE;
            *status = s as u32;
            // An operation that will not publish its fresh cell gives it back.
            st.free = st.cell;
        };
        match (kind, found) {
            (OpKind::Get, Some(c)) => {
                let local = probe.states[c] - PUBLISHED;
                let cell = self.geo.cell_index(self.geo.arena_of(probe.fingerprint), local);
                // A cell beyond the heap is a damaged state word (not scanned at a clean open).
                let value = ((local as u64) < self.geo.arena_cells())
                    .then(|| &mem.heap[cell as usize * cw..][..vw + 1]);
                if let Some(value) =
                    value.filter(|v| !self.verify_values || value_checksum(&v[..vw]) == v[vw])
                {
                    run.values[i * vw..(i + 1) * vw].copy_from_slice(&value[..vw]);
                    done(st, status, Status::Ok);
                } else {
                    // A damaged value is not handed out (the kernel writes zeros).
                    run.values[i * vw..(i + 1) * vw].fill(0);
                    done(st, status, Status::Corrupt);
                }
            }
            (OpKind::Get | OpKind::Update | OpKind::Delete, None) => done(st, status, Status::NotFound),
            (OpKind::Insert, Some(_)) => done(st, status, Status::Exists),
            (OpKind::Upsert | OpKind::Update | OpKind::Delete, Some(c)) => {
                // The first operation on the key leads its changes; each tells the lead what it does.
                let lead = *run.claims.entry(key.to_vec()).or_insert(i as u32);
                let st = &mut run.states[i];
                (st.phase, st.bucket, st.slot) = if lead == i as u32 {
                    let at = probe.candidates[c];
                    (phase::FOUND, at.bucket as u32, at.slot)
                } else {
                    (phase::FOLLOWS, lead, 0)
                };
                st.found = probe.states[c];
                let lead = &mut run.states[lead as usize];
                if kind == OpKind::Delete {
                    lead.first_delete = lead.first_delete.min(i as u32);
                } else {
                    lead.last_write = lead.last_write.max(i as u32 + 1);
                }
                run.control[control::NEED_B] += 1;
            }
            (OpKind::Insert | OpKind::Upsert, None) => {
                let leader = *run.claims.entry(key.to_vec()).or_insert(i as u32);
                if leader != i as u32 {
                    st.phase = phase::JOINED;
                    st.bucket = leader;
                    run.control[control::NEED_B] += 1;
                    return;
                }
                let Some(c) = probe.empty_target(&self.geo.layout) else {
                    st.phase = phase::FULL;
                    run.control[control::FULL] += 1;
                    return;
                };
                let target = probe.candidates[c];
                mem.table[geo.state_word(target.bucket, target.slot) as usize] = INSERTING;
                mem.table[geo.fp_word(target.bucket, target.slot) as usize] = probe.fingerprint;
                let k = geo.key_word(target.bucket, target.slot) as usize;
                mem.table[k..k + kw].copy_from_slice(key);
                dirty.table(geo.fp_word(target.bucket, target.slot), 1);
                dirty.table(geo.state_word(target.bucket, target.slot), 1);
                dirty.table(k as u64, kw as u64);
                st.phase = phase::CLAIMED;
                (st.bucket, st.slot) = (target.bucket as u32, target.slot);
                run.control[control::NEED_B] += 1;
            }
        }
    }

    /// Phase B (`shaders/phase_b.wgsl`) for operation `i`: the changes of a found key applied
    /// by its lead (writes in batch order, then deletes: emptied if any deletes, else the last
    /// writer's cell), a claim published (INSERTING -> 2 + cell), or the claim it joined acted
    /// on: an upsert overwrites its value, an insert finds the key existing.
    pub fn phase_b(&self, mem: &mut Mem, dirty: &mut Dirty, batch: &Encoded, run: &mut BatchRun, i: usize) {
        let kind = OpKind::from_code(batch.kinds[i]).expect("encoded from OpKind");
        let st = run.states[i];
        let (status, free) = match st.phase {
            phase::FOUND | phase::FOLLOWS => {
                let lead_index = if st.phase == phase::FOUND { i } else { st.bucket as usize };
                let lead = run.states[lead_index];
                let deleted = lead.first_delete != NONE;
                if lead_index == i {
                    let at = self.state_index(&st);
                    mem.table[at] = if deleted {
                        EMPTY
                    } else {
                        run.states[lead.last_write as usize - 1].cell + PUBLISHED
                    };
                    dirty.table(at as u64, 1);
                    if deleted {
                        run.control[control::DELETED] += 1;
                    }
                }
                let decides =
                    if deleted { i as u32 == lead.first_delete } else { i as u32 + 1 == lead.last_write };
                let ok = kind != OpKind::Delete || i as u32 == lead.first_delete;
                (
                    if ok { Status::Ok } else { Status::NotFound },
                    if decides { st.found - PUBLISHED } else { st.cell },
                )
            }
            phase::CLAIMED => {
                let at = self.state_index(&st);
                let cur = mem.table[at];
                mem.table[at] = if cur == INSERTING { st.cell + PUBLISHED } else { cur };
                dirty.table(at as u64, 1);
                run.control[control::PUBLISHED] += 1;
                // An upsert that joined this claim already wrote its value over it.
                (Status::Ok, if cur == INSERTING { NONE } else { st.cell })
            }
            phase::JOINED if kind == OpKind::Upsert => {
                let at = self.state_index(&run.states[st.bucket as usize]);
                let cur = mem.table[at];
                mem.table[at] = st.cell + PUBLISHED;
                dirty.table(at as u64, 1);
                (Status::Ok, if cur >= PUBLISHED { cur - PUBLISHED } else { NONE })
            }
            phase::JOINED => (Status::Exists, st.cell),
            _ => return,
        };
        run.statuses[i] = status as u32;
        run.states[i].free = free;
    }

    /// Resizing, first step (`relocate` in `shaders/resize.wgsl`): every bucket of the old
    /// table but those of its bottom level is copied to its place in the new table `to` (this
    /// model's geometry is the new one).
    pub fn relocate(&self, old: &Geometry, from: &[u32], to: &mut [u32]) {
        let bw = old.bucket_words() as usize;
        let kw = old.key_words() as usize;
        for b in 0..old.buckets() {
            if let Some(nb) = old.grown_bucket(b) {
                let (f, t) = (b as usize * bw, nb as usize * bw);
                to[t..t + bw].copy_from_slice(&from[f..f + bw]);
                // Keys kept apart follow their buckets.
                for s in (0..old.layout.slots).filter(|_| old.keys_apart) {
                    let (f, t) = (old.key_word(b, s) as usize, self.geo.key_word(nb, s) as usize);
                    to[t..t + kw].copy_from_slice(&from[f..f + kw]);
                }
            }
        }
    }

    /// Resizing, second step (`rehash` in `shaders/resize.wgsl`): the keys of the old bottom
    /// level are inserted into the new table with their value cells; returns how many found no
    /// empty slot (then the table must grow further).
    pub fn rehash(&self, old: &Geometry, from: &[u32], to: &mut [u32]) -> u64 {
        let mut failed = 0;
        let kw = old.key_words() as usize;
        for group in 0..old.groups() {
            let b = old.bottom_bucket(group);
            for s in 0..old.layout.slots {
                let state = from[old.state_word(b, s) as usize];
                if state < PUBLISHED {
                    continue;
                }
                let k = old.key_word(b, s) as usize;
                let key = &from[k..k + kw];
                let probe = self.probe(to, key);
                let Some(c) = probe.empty_target(&self.geo.layout) else {
                    failed += 1;
                    continue;
                };
                let at = probe.candidates[c];
                to[self.geo.state_word(at.bucket, at.slot) as usize] = state;
                to[self.geo.fp_word(at.bucket, at.slot) as usize] = probe.fingerprint;
                let nk = self.geo.key_word(at.bucket, at.slot) as usize;
                to[nk..nk + kw].copy_from_slice(key);
            }
        }
        failed
    }

    /// Release after phase B (`free_cells` in `shaders/release.wgsl`).
    pub fn free(&self, bitmap: &mut Bitmap, st: &OpState) {
        self.release(bitmap, st.arena, st.free);
    }

    /// Gives cell `local` of arena `arena` back, unless it is none or beyond the heap (a
    /// damaged state word: its bit would be another cell's).
    fn release(&self, bitmap: &mut Bitmap, arena: u32, local: u32) {
        if (local as u64) < self.geo.arena_cells() {
            bitmap.free(self.geo.cell_index(arena, local));
        }
    }

    /// Rollback (`rollback` in `shaders/release.wgsl`): undo phase A of a batch that cannot complete.
    pub fn rollback(&self, mem: &mut Mem, bitmap: &mut Bitmap, dirty: &mut Dirty, st: &OpState) {
        if st.phase == phase::CLAIMED {
            let at = self.state_index(st);
            mem.table[at] = EMPTY;
            dirty.table(at as u64, 1);
        }
        self.release(bitmap, st.arena, st.cell);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allocator_starts_at_the_longest_free_run() {
        let mut bitmap = Bitmap::new(32 * 100 - 5, 1);
        bitmap.words[..60].fill(!0);
        bitmap.words[70..80].fill(!0);
        let words = bitmap.allocator_words();
        assert_eq!(words.len(), Bitmap::summary_words(100) + 1);
        // Words 0-59 and 70-79 full; word 99 holds free cells before the bits past the heap.
        assert_eq!(words[..4], [!0, 0x0fff_ffff, 0xffc0, 0]);
        // Words 60-69 and 80-98 are free: the cursor goes to the longer run, in cells.
        assert_eq!(words[4], 80 * 32);
        let cursor = |b: &Bitmap| *b.allocator_words().last().unwrap() / 32;
        bitmap.words[80..99].fill(0x10);
        assert_eq!(cursor(&bitmap), 60);
        bitmap.words[60..70].fill(!0);
        assert_eq!(cursor(&bitmap), 80, "no free word: the first with a free cell");
        bitmap.words.fill(!0);
        assert_eq!(cursor(&bitmap), 0, "a full heap");
    }
}
