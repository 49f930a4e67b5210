//! Recovery on open and the consistency check (`gphash check`).
//!
//! Recovery clears every INSERTING slot (claims of a batch that was never acknowledged) and
//! rebuilds the volatile value allocator from the published slots. The check verifies every
//! invariant of the table without changing anything.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use rayon::prelude::*;

use host_pm::{Header, Pool, Region, ResizeRecord};

use crate::hash::{Seeds, locate, value_checksum};
use crate::layout::{Candidate, EMPTY, Geometry, INSERTING, PUBLISHED};
use crate::model::Bitmap;
use crate::profile::Laps;

/// What recovery found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// The pool was just created.
    pub created: bool,
    /// The pool was closed cleanly last time.
    pub clean_shutdown: bool,
    /// INSERTING slots cleared.
    pub cleared_claims: u64,
    /// An interrupted resize was completed (`Some(true)`) or abandoned (`Some(false)`).
    pub resumed_resize: Option<bool>,
    /// Published keys.
    pub items: u64,
    /// The key count was taken from what the last clean close saved, and so is the allocator
    /// when the index first writes (unless the saved bytes fail their checksum then: the
    /// table is scanned for it); the open scanned nothing.
    pub restored: bool,
}

impl fmt::Display for Recovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.created {
            write!(f, "new pool")?;
        } else if self.clean_shutdown {
            let how = if self.restored { "allocator saved at close" } else { "table scanned" };
            write!(f, "clean shutdown; {} keys ({how})", self.items)?;
        } else {
            write!(
                f,
                "recovered after a crash: {} unacknowledged claim(s) cleared; {} keys",
                self.cleared_claims, self.items
            )?;
        }
        match self.resumed_resize {
            Some(true) => write!(f, "; an interrupted resize was completed"),
            Some(false) => write!(f, "; an interrupted resize could not complete and was abandoned"),
            None => Ok(()),
        }
    }
}

/// The value-cell allocator recovery hands to an engine: built by a scan, or still where the
/// last clean close saved it. Reading it is the only work of a clean open that grows with the
/// table (docs/lab/growth-and-recovery.md, "A clean open that reads nothing but the header"), so
/// it stays in the pool until an engine first allocates or frees, or hands it over.
#[derive(Debug)]
pub(crate) enum Allocator {
    Built(Bitmap),
    /// The first `words` words of the close record's region, of the table `geo`. `mark_dirty`
    /// discards that region, so an engine holding this loads it before the pool's first write
    /// ([`crate::engine::Engine::load_allocator`]); a growth needs no allocator from before it.
    Saved {
        words: usize,
        geo: Geometry,
    },
}

impl Allocator {
    /// The bitmap, read from the pool first if it is still there: copied when its checksum
    /// holds, else rebuilt by a scan of the table.
    pub(crate) fn load(&mut self, pool: &mut Pool) -> crate::Result<&mut Bitmap> {
        if let Allocator::Saved { words, geo } = *self {
            assert!(
                pool.header().clean_shutdown,
                "the allocator saved at close is read before the pool's first write frees it"
            );
            let bitmap = match pool.saved_at_close() {
                Some((bytes, _)) => {
                    // The copy faults in a page of fresh memory every 4 KiB, so it runs on all
                    // host threads.
                    let mut copied = Vec::new();
                    crate::bulk::refill(&mut copied, &bytes[..words * 4]);
                    Bitmap::from_words(copied, geo.arenas())
                }
                None => {
                    let (mut rec, table) = (Recovery::default(), pool.header().table_region);
                    let (bitmap, lines) = scan(pool, &geo, table, &mut rec)?;
                    pool.persist_lines(&lines)?;
                    if rec.items != pool.header().closed.items {
                        log::warn!(
                            "the table holds {} keys, its close record says {}",
                            rec.items,
                            pool.header().closed.items
                        );
                    }
                    bitmap
                }
            };
            *self = Allocator::Built(bitmap);
        }
        Ok(self.loaded())
    }

    /// The bitmap, which an engine [`Allocator::load`]s before a batch that writes.
    pub(crate) fn loaded(&mut self) -> &mut Bitmap {
        match self {
            Allocator::Built(bitmap) => bitmap,
            Allocator::Saved { .. } => panic!("an engine loads its allocator before a batch that writes"),
        }
    }

    /// The bitmap itself (see [`Allocator::load`]).
    pub(crate) fn into_bitmap(mut self, pool: &mut Pool) -> crate::Result<Bitmap> {
        self.load(pool)?;
        match self {
            Allocator::Built(bitmap) => Ok(bitmap),
            Allocator::Saved { .. } => unreachable!("loaded above"),
        }
    }
}

/// Clears INSERTING slots (persisting them), counts keys and rebuilds the allocator. A slot
/// that references a cell outside the heap, or a cell that two slots share, is corruption:
/// the pool is refused (run `gphash check` for the full report). After a clean close that
/// saved the allocator ([`save_at_close`]), nothing is scanned: the count is read back and
/// the allocator left where it was saved.
pub(crate) fn recover(pool: &mut Pool, geo: &Geometry) -> crate::Result<(Recovery, Allocator)> {
    let h = *pool.header();
    let mut rec = Recovery { clean_shutdown: h.clean_shutdown, ..Default::default() };
    if h.resize.state == 0
        && let Some(saved) = saved_allocator(pool, geo, &mut rec)
    {
        return Ok((rec, saved));
    }
    let (bitmap, lines) = scan(pool, geo, h.table_region, &mut rec)?;
    pool.persist_lines(&lines)?;
    // An inspection's private view says what recovery would do in its own report.
    if rec.cleared_claims > 0 && !pool.is_private() {
        log::warn!("recovery cleared {} unacknowledged claim(s)", rec.cleared_claims);
    }
    Ok((rec, Allocator::Built(bitmap)))
}

/// The allocator the last clean close saved, if it is there and of this table's size (the
/// bits past the last cell set, as an allocator keeps them). Its words are read, and their
/// checksum checked, when an engine loads it ([`Allocator::load`]).
fn saved_allocator(pool: &Pool, geo: &Geometry, rec: &mut Recovery) -> Option<Allocator> {
    let h = pool.header();
    if !h.clean_shutdown || h.closed.saved.is_empty() {
        return None;
    }
    let (bytes, items) = (pool.region(h.closed.saved), h.closed.items);
    let len = geo.cells.div_ceil(32) as usize * 4;
    if bytes.len() < len {
        log::warn!("the allocator saved at close is too small for {} cells: the table is scanned", geo.cells);
        return None;
    }
    let past = Bitmap::past_cells(geo.cells);
    let last = u32::from_le_bytes(bytes[len - 4..len].try_into().expect("a heap has cells"));
    if last & past != past || items > geo.slots() {
        log::warn!("the allocator saved at close does not fit the table: the table is scanned");
        return None;
    }
    rec.items = items;
    rec.restored = true;
    Some(Allocator::Saved { words: len / 4, geo: *geo })
}

/// Where a clean close saves `bitmap`: a region placed first-fit in the pool's free space,
/// holding its words (the pool grows for it, within its limit). `None` when there is no room:
/// the close is then clean all the same, and the next open scans.
pub(crate) fn save_at_close(pool: &mut Pool, bitmap: &Bitmap) -> Option<Region> {
    let h = *pool.header();
    let bytes: &[u8] = bytemuck::cast_slice(&bitmap.words);
    let [region] = crate::placement::place(&[h.table_region, h.heap_region], &[bytes.len() as u64])[..]
    else {
        unreachable!("one size, one region")
    };
    if let Err(e) = pool.take_room(&[region]) {
        log::info!("no room to save the allocator at close ({e}): the next open scans the table");
        return None;
    }
    pool.region_mut(region)[..bytes.len()].copy_from_slice(bytes);
    Some(region)
}

/// Walks the table in `region` on all host threads: clears INSERTING slots (returning their
/// lines, not yet persisted), counts published keys into `rec` and builds the allocator from
/// their cells.
///
/// A round of buckets is walked in tasks, each listing its slots' cells by the part of the
/// bitmap they fall in; then each part of the bitmap takes its cells from every task's list,
/// with plain writes. Setting the bits with atomic ORs as the slots are found took three
/// quarters of the scan's time: each locked OR waits for its cache line, one at a time.
pub(crate) fn scan(
    pool: &mut Pool,
    geo: &Geometry,
    region: Region,
    rec: &mut Recovery,
) -> crate::Result<(Bitmap, Vec<u64>)> {
    scan_in_rounds(pool, geo, region, rec, [SCAN_ROUND_BUCKETS, SCAN_TASK_BUCKETS])
}

/// [`scan`] in rounds of `round_buckets` buckets, in tasks of at most `task_buckets` (other
/// sizes for tests).
fn scan_in_rounds(
    pool: &mut Pool,
    geo: &Geometry,
    region: Region,
    rec: &mut Recovery,
    [round_buckets, task_buckets]: [usize; 2],
) -> crate::Result<(Bitmap, Vec<u64>)> {
    let task_buckets = task_buckets.min(round_buckets);
    let mut bitmap = Bitmap::new(geo.cells, geo.arenas());
    // A power of two: a cell's part is a shift of it.
    let part_words = bitmap.words.len().div_ceil(SCAN_PARTS).next_power_of_two();
    let stride = geo.bucket_words() as usize;
    let table: &mut [u32] = bytemuck::cast_slice_mut(pool.region_mut(region));
    let buckets = &mut table[..geo.buckets() as usize * stride];
    let mut lines = Vec::new();
    let mut laps = Laps::start("scan");
    // Each task's lists, kept from round to round with their room.
    let mut tasks: Vec<Found> = (0..round_buckets.div_ceil(task_buckets)).map(|_| Found::default()).collect();
    for (round, words) in buckets.chunks_mut(round_buckets * stride).enumerate() {
        let first = (round * round_buckets) as u64;
        let found = &mut tasks[..words.len().div_ceil(task_buckets * stride)];
        let t = Instant::now();
        words.par_chunks_mut(task_buckets * stride).zip(found.par_iter_mut()).enumerate().try_for_each(
            |(task, (words, found))| {
                walk(geo, region, first + (task * task_buckets) as u64, words, part_words, found)
            },
        )?;
        let found = &*found;
        laps.add("walk", t.elapsed());
        let t = Instant::now();
        let twice = bitmap.words.par_chunks_mut(part_words).enumerate().find_map_any(|(part, words)| {
            let base = (part * part_words * 32) as u64;
            for cell in found.iter().flat_map(|f| &f.cells[part]) {
                let (word, bit) = ((cell - base) as usize / 32, 1 << (cell % 32));
                if words[word] & bit != 0 {
                    return Some(*cell);
                }
                words[word] |= bit;
            }
            None
        });
        laps.add("bitmap", t.elapsed());
        if let Some(cell) = twice {
            return Err(referenced_twice(geo, buckets, cell).into());
        }
        for f in found {
            rec.items += f.items;
            rec.cleared_claims += f.cleared;
            lines.extend(&f.lines);
        }
    }
    lines.dedup();
    Ok((bitmap, lines))
}

/// One task of [`scan`]: the buckets from `first` on, in `words`, into `found` (emptied
/// first; its lists keep their room).
fn walk(
    geo: &Geometry,
    region: Region,
    first: u64,
    words: &mut [u32],
    part_words: usize,
    found: &mut Found,
) -> Result<(), host_pm::PoolError> {
    let stride = geo.bucket_words() as usize;
    found.items = 0;
    found.cleared = 0;
    found.lines.clear();
    found.cells.resize_with(SCAN_PARTS, Vec::new);
    found.cells.iter_mut().for_each(Vec::clear);
    let part_shift = (part_words * 32).trailing_zeros();
    // Within a bucket, slot `s`'s state word follows the fingerprints.
    let states = (geo.state_word(0, 0) - geo.fp_word(0, 0)) as usize;
    let ahead = SCAN_PREFETCH_BUCKETS * stride + states;
    let (base, len) = (words.as_ptr(), words.len());
    for (i, bucket) in words.chunks_mut(stride).enumerate() {
        if i * stride + ahead < len {
            crate::bulk::prefetch(base.wrapping_add(i * stride + ahead));
        }
        let bucket_id = first + i as u64;
        let (fps, bucket) = bucket.split_at_mut(states);
        for (s, state) in bucket[..geo.layout.slots as usize].iter_mut().enumerate() {
            if *state == INSERTING {
                *state = EMPTY;
                found.lines.push(region.offset / 64 + geo.state_word(bucket_id, s as u32) * 4 / 64);
                found.cleared += 1;
            } else if *state >= PUBLISHED {
                let cell = geo.published_cell(fps[s], *state).map_err(|why| host_pm::PoolError::Corrupt {
                    what: format!("bucket {bucket_id} slot {s}: {why}; run `gphash check`"),
                })?;
                found.cells[(cell >> part_shift) as usize].push(cell);
                found.items += 1;
            }
        }
    }
    Ok(())
}

/// The error for a cell that two published slots of `buckets` (the table's) name: the second
/// slot is named.
fn referenced_twice(geo: &Geometry, buckets: &[u32], cell: u64) -> host_pm::PoolError {
    let states = (geo.state_word(0, 0) - geo.fp_word(0, 0)) as usize;
    let slots = geo.layout.slots as usize;
    let (bucket_id, s) = buckets
        .chunks(geo.bucket_words() as usize)
        .enumerate()
        .flat_map(|(b, bucket)| (0..slots).map(move |s| (b, s, bucket[s], bucket[states + s])))
        .filter(|&(_, _, fp, state)| state >= PUBLISHED && geo.published_cell(fp, state) == Ok(cell))
        .map(|(b, s, _, _)| (b, s))
        .nth(1)
        .expect("the scan found the cell twice");
    host_pm::PoolError::Corrupt {
        what: format!(
            "bucket {bucket_id} slot {s}: value cell {cell} is referenced twice; run `gphash check`"
        ),
    }
}

/// How far ahead of its bucket [`scan`]'s walk asks for the state words: the walk reads half
/// of each bucket's lines, whose stride the hardware prefetcher follows poorly. 32 buckets
/// (4 KiB) ahead shortened the crash scan on 4 KiB and 2 MiB pages, 8 buckets less
/// (`docs/lab/growth-and-recovery.md`, "The recovery scan with its state words asked for ahead").
const SCAN_PREFETCH_BUCKETS: usize = 32;

/// Buckets one task of [`scan`] walks: enough to outweigh a task's cost and its lists.
const SCAN_TASK_BUCKETS: usize = 1 << 14;

/// Buckets of one round of [`scan`]: the cells its tasks list take at most 4 bytes a slot
/// of these (64 MiB with 8-slot buckets), whatever the table's size.
const SCAN_ROUND_BUCKETS: usize = 1 << 21;

/// The parts of the bitmap that [`scan`] fills in parallel, at most: few enough that a
/// task's lists stay in the cache while it appends to them, and each part of the bitmap at
/// most 64 KiB up to 32 M cells (8 MiB at 2^32), in the cache while its bits are set. 256
/// parts were slower on the 2-core VM, 16 no faster (docs/lab/growth-and-recovery.md, "A clean
/// open that reads nothing but the header; recovery's scan without atomics").
const SCAN_PARTS: usize = 64;

/// What one task of [`scan`] found.
#[derive(Default)]
struct Found {
    items: u64,
    cleared: u64,
    lines: Vec<u64>,
    /// The cells of the task's published slots, by the part of the bitmap they fall in.
    cells: Vec<Vec<u64>>,
}

/// A resize record (`host_pm` checked that its regions lie in the pool without overlaps) must
/// describe the table one level taller, in regions large enough for it.
fn check_resize_record(geo: &Geometry, header: &Header, report: &mut CheckReport) {
    let r = header.resize;
    let mut bad =
        |what: String| report.violations.push(Violation { at: None, what: format!("resize record: {what}") });
    if r.state == 0 {
        return;
    }
    if r.state != ResizeRecord::BUILDING {
        bad(format!("unknown state {}", r.state));
        return;
    }
    if header.clean_shutdown {
        bad("a cleanly closed pool has a resize in progress".into());
    }
    match geo.grown() {
        Ok(g) if r.new_top_level != g.top_level => {
            bad(format!("grows to level {} from level {}", r.new_top_level, geo.top_level))
        }
        Ok(g) if r.new_table.bytes < g.table_bytes() || r.new_heap.bytes < g.heap_bytes() => bad(format!(
            "regions of {} and {} bytes cannot hold the grown table",
            r.new_table.bytes, r.new_heap.bytes
        )),
        Ok(_) => {}
        Err(e) => bad(format!("the table cannot grow: {e}")),
    }
}

/// One violated invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Where (bucket and slot), if it is about one slot.
    pub at: Option<Candidate>,
    /// What is wrong.
    pub what: String,
}

/// The result of a consistency check.
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    /// Published keys.
    pub items: u64,
    /// Slots in the table.
    pub slots: u64,
    /// INSERTING slots (normal after a crash: recovery clears them).
    pub claims: u64,
    /// Everything that is wrong.
    pub violations: Vec<Violation>,
}

impl CheckReport {
    /// Whether the pool is consistent.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "keys: {} in {} slots; unacknowledged claims: {}", self.items, self.slots, self.claims)?;
        for v in self.violations.iter().take(50) {
            match v.at {
                Some(c) => writeln!(f, "VIOLATION bucket {} slot {}: {}", c.bucket, c.slot, v.what)?,
                None => writeln!(f, "VIOLATION {}", v.what)?,
            }
        }
        if self.violations.len() > 50 {
            writeln!(f, "... and {} more violations", self.violations.len() - 50)?;
        }
        if self.ok() {
            write!(f, "consistent")
        } else {
            write!(f, "INCONSISTENT: {} violation(s)", self.violations.len())
        }
    }
}

/// Checks every invariant of the table in `pool` (whose header is valid: `Pool::open` checked
/// it, and whose regions fit `geo`: [`crate::GpHash::geometry_of`] checked them): each
/// published key sits in one of its own candidate slots with its own fingerprint, no key is
/// published twice, value cells are in range, not shared and hold their checksum, and a
/// cleanly closed pool holds no INSERTING slot. On all host threads, with one bit per cell and
/// no map of keys: a second copy of a key can only be in its own candidate slots.
pub fn check(pool: &Pool, geo: &Geometry, header: &Header) -> CheckReport {
    let mut report = CheckReport { slots: geo.slots(), ..Default::default() };
    check_resize_record(geo, header, &mut report);
    let scan = CheckScan {
        geo,
        seeds: Seeds::new(header.table.seed, geo.layout.hashes),
        table: bytemuck::cast_slice(pool.region(header.table_region)),
        heap: bytemuck::cast_slice(pool.region(header.heap_region)),
        clean: header.clean_shutdown,
        used: Bitmap::new(geo.cells, 1).words.into_iter().map(AtomicU32::new).collect(),
    };
    // Buckets in tasks on all host threads, their findings joined in bucket order.
    let tasks = geo.buckets().div_ceil(SCAN_TASK_BUCKETS as u64);
    let parts: Vec<Checked> =
        (0..tasks).into_par_iter().map(|t| scan.buckets(t * SCAN_TASK_BUCKETS as u64)).collect();
    let mut found = Checked::default();
    for part in parts {
        found.items += part.items;
        found.claims += part.claims;
        found.findings.extend(part.findings);
        found.shared.extend(part.shared);
    }
    if !found.shared.is_empty() {
        scan.attribute_shared_cells(&mut found);
    }
    report.items = found.items;
    report.claims = found.claims;
    report.violations.extend(found.findings.into_iter().map(|(v, _)| v));
    let used = Bitmap::from_words(scan.used.into_iter().map(AtomicU32::into_inner).collect(), geo.arenas());
    if header.clean_shutdown && !header.closed.saved.is_empty() {
        check_saved(pool, geo, header, &used, &mut report);
    }
    report
}

/// What [`check`] reads, and the cells it has seen referenced.
struct CheckScan<'a> {
    geo: &'a Geometry,
    seeds: Seeds,
    table: &'a [u32],
    heap: &'a [u32],
    clean: bool,
    used: Vec<AtomicU32>,
}

/// What a task of [`check`] found: violations in slot order, each with the value cell it is
/// about (a range or checksum finding, which a cell that several slots reference changes), and
/// the cells it found already referenced by another slot.
#[derive(Default)]
struct Checked {
    items: u64,
    claims: u64,
    findings: Vec<(Violation, Option<u64>)>,
    shared: Vec<u64>,
}

impl CheckScan<'_> {
    /// The key published at `here` and its state word, if it is published there.
    fn published(&self, here: Candidate) -> Option<(&[u32], u32)> {
        let g = self.geo;
        let state = self.table[g.state_word(here.bucket, here.slot) as usize];
        (state >= PUBLISHED).then(|| {
            let k = g.key_word(here.bucket, here.slot) as usize;
            (&self.table[k..k + g.key_words() as usize], state)
        })
    }

    /// Checks the [`SCAN_TASK_BUCKETS`] buckets from `first`.
    fn buckets(&self, first: u64) -> Checked {
        let g = self.geo;
        let mut out = Checked::default();
        for bucket in first..(first + SCAN_TASK_BUCKETS as u64).min(g.buckets()) {
            for slot in 0..g.layout.slots {
                let here = Candidate { bucket, slot };
                let mut bad =
                    |what: String, cell| out.findings.push((Violation { at: Some(here), what }, cell));
                let state = self.table[g.state_word(bucket, slot) as usize];
                if state == INSERTING {
                    out.claims += 1;
                    if self.clean {
                        bad("INSERTING slot in a cleanly closed pool".into(), None);
                    }
                    continue;
                }
                let Some((key, state)) = self.published(here) else { continue };
                out.items += 1;
                let (tops, fp) = locate(key, &self.seeds, g.top_level, g.location_bits());
                let stored_fp = self.table[g.fp_word(bucket, slot) as usize];
                if stored_fp != fp {
                    bad(format!("fingerprint {stored_fp:#x} is not the key's {fp:#x}"), None);
                }
                // One pass over the candidates: whether `here` is one, and the last one before
                // it that holds the same key (a key is published in its candidate slots only).
                let (mut placed, mut before) = (false, None);
                let slots = g.layout.slots;
                let buckets =
                    (0..g.layout.candidates() / slots).map(|cb| g.candidate(&tops, cb * slots).bucket);
                for c in buckets.flat_map(|bucket| (0..slots).map(move |slot| Candidate { bucket, slot })) {
                    placed |= c == here;
                    let same = || {
                        self.table[g.fp_word(c.bucket, c.slot) as usize] == fp
                            && self.published(c).is_some_and(|(k, _)| k == key)
                    };
                    if c < here && before.is_none_or(|b| c > b) && same() {
                        before = Some(c);
                    }
                }
                if !placed {
                    bad(format!("key {key:x?} is not in one of its candidate buckets"), None);
                } else if let Some(before) = before {
                    let at = format!("bucket {} slot {}", before.bucket, before.slot);
                    bad(format!("key {key:x?} is also published at {at}"), None);
                }
                let cell = match g.published_cell(stored_fp, state) {
                    Ok(cell) => cell,
                    Err(why) => {
                        // No heap cell: with several arenas its number may be another's index.
                        bad(why, None);
                        continue;
                    }
                };
                let bit = 1 << (cell % 32);
                if self.used[(cell / 32) as usize].fetch_or(bit, Ordering::Relaxed) & bit != 0 {
                    out.shared.push(cell);
                }
                if let Some(why) = self.checksum_fault(cell) {
                    bad(why, Some(cell));
                }
            }
        }
        out
    }

    /// Why the checksum of value cell `cell` is wrong, if it is.
    fn checksum_fault(&self, cell: u64) -> Option<String> {
        let (vw, cw) = (self.geo.value_words() as usize, self.geo.cell_words() as usize);
        let at = cell as usize * cw;
        let (stored, want) = (self.heap[at + vw], value_checksum(&self.heap[at..at + vw]));
        (stored != want)
            .then(|| format!("value cell {cell}: checksum {stored:#010x} is not its value's {want:#010x}"))
    }

    /// Cells that several slots reference (a corruption, so rare): the first slot in table
    /// order keeps its cell's checksum finding, each later one is told the slot before it.
    fn attribute_shared_cells(&self, found: &mut Checked) {
        let shared: std::collections::HashSet<u64> = found.shared.iter().copied().collect();
        found.findings.retain(|(_, cell)| !cell.is_some_and(|c| shared.contains(&c)));
        let mut last: std::collections::HashMap<u64, Candidate> = Default::default();
        let g = self.geo;
        for bucket in 0..g.buckets() {
            for slot in 0..g.layout.slots {
                let here = Candidate { bucket, slot };
                let fp = self.table[g.fp_word(bucket, slot) as usize];
                let Some(Ok(cell)) = self.published(here).map(|(_, state)| g.published_cell(fp, state))
                else {
                    continue;
                };
                if !shared.contains(&cell) {
                    continue;
                }
                let what = match last.insert(cell, here) {
                    Some(before) => Some(format!(
                        "value cell {cell} also referenced by bucket {} slot {}",
                        before.bucket, before.slot
                    )),
                    None => self.checksum_fault(cell),
                };
                if let Some(what) = what {
                    found.findings.push((Violation { at: Some(here), what }, Some(cell)));
                }
            }
        }
        // In slot order, as the scan reports them (a stable sort keeps each slot's findings in
        // the order they were made).
        found.findings.sort_by_key(|(v, _)| v.at);
    }
}

/// What a clean close saved must be what a scan finds: the key count, and the allocator's bit
/// set for exactly the cells that published slots reference.
fn check_saved(pool: &Pool, geo: &Geometry, header: &Header, used: &Bitmap, report: &mut CheckReport) {
    let closed = header.closed;
    let mut bad = |what: String| {
        report.violations.push(Violation { at: None, what: format!("allocator saved at close: {what}") })
    };
    let bytes = pool.region(closed.saved);
    if crc32fast::hash(bytes) != closed.checksum {
        return bad("its bytes do not match their checksum".into());
    }
    if closed.items != report.items {
        bad(format!("{} keys recorded, {} in the table", closed.items, report.items));
    }
    let words = geo.cells.div_ceil(32) as usize;
    if bytes.len() < words * 4 {
        return bad(format!("{} bytes cannot hold {} cells", bytes.len(), geo.cells));
    }
    let saved: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes[..words * 4]);
    let wrong = (0..geo.cells)
        .filter(|&c| {
            (saved[(c / 32) as usize] >> (c % 32)) & 1 != (used.words[(c / 32) as usize] >> (c % 32)) & 1
        })
        .count();
    if wrong > 0 {
        bad(format!("{wrong} cell(s) marked otherwise than the table uses them"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, Executor, GpHash, Options};

    /// A pool file in `dir` closed cleanly with `keys` keys, a third deleted (so that its
    /// allocator has free cells between used ones), opened as a pool with its geometry.
    fn closed_pool(dir: &tempfile::TempDir, keys: u64) -> (Pool, Geometry) {
        let path = dir.path().join("p");
        let options = Options { executor: Executor::Cpu, ..Options::default() };
        let config = Config { capacity: keys * 6 / 5, ..Config::default() };
        let t = GpHash::create(Some(&path), &config, &options).unwrap();
        let all: Vec<u8> = (0..keys).flat_map(u64::to_le_bytes).collect();
        t.insert(&all, &all).unwrap();
        let odd: Vec<u8> = (0..keys).filter(|k| k % 3 == 1).flat_map(u64::to_le_bytes).collect();
        t.delete(&odd).unwrap();
        t.close().unwrap();
        let pool = Pool::open(&path).unwrap();
        let geo = GpHash::geometry_of(&pool).unwrap();
        (pool, geo)
    }

    /// The allocator a scan of the table builds.
    fn scanned(pool: &mut Pool, geo: &Geometry) -> Bitmap {
        let table = pool.header().table_region;
        scan(pool, geo, table, &mut Recovery::default()).unwrap().0
    }

    /// An open after a clean close leaves the allocator in the pool; loaded, it is the one a
    /// scan builds, and so it is when its saved bytes fail their checksum (the load scans).
    #[test]
    fn the_saved_allocator_is_read_when_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let (mut pool, geo) = closed_pool(&dir, 500);
        let truth = scanned(&mut pool, &geo);
        let (rec, mut allocator) = recover(&mut pool, &geo).unwrap();
        assert!(rec.restored && rec.items == 500 - 167, "{rec}");
        assert!(matches!(allocator, Allocator::Saved { .. }), "{allocator:?}");
        assert_eq!(allocator.load(&mut pool).unwrap().words, truth.words);
        assert!(matches!(allocator, Allocator::Built(_)));

        let saved = pool.header().closed.saved;
        let first = pool.region(saved)[0];
        pool.region_mut(saved)[0] = !first;
        let (rec, allocator) = recover(&mut pool, &geo).unwrap();
        assert!(rec.restored, "the open reads no saved word but the last");
        assert_eq!(
            allocator.into_bitmap(&mut pool).unwrap().words,
            truth.words,
            "damaged bytes are scanned past"
        );
    }

    /// The slots of the table whose state word satisfies `keep`, in order: bucket, slot and
    /// state word.
    fn slots_where(pool: &Pool, geo: &Geometry, keep: impl Fn(u32) -> bool) -> Vec<(u64, u32, u32)> {
        let words: &[u32] = bytemuck::cast_slice(pool.region(pool.header().table_region));
        (0..geo.buckets())
            .flat_map(|b| (0..geo.layout.slots).map(move |s| (b, s, words[geo.state_word(b, s) as usize])))
            .filter(|&(.., state)| keep(state))
            .collect()
    }

    /// The allocator, key count and claims a scan finds, the slow way: slot by slot.
    fn walked(pool: &Pool, geo: &Geometry) -> (Vec<u32>, u64, Vec<u64>) {
        let table: &[u32] = bytemuck::cast_slice(pool.region(pool.header().table_region));
        let mut bitmap = Bitmap::new(geo.cells, geo.arenas());
        let (mut items, mut claims) = (0, vec![]);
        for b in 0..geo.buckets() {
            for s in 0..geo.layout.slots {
                match table[geo.state_word(b, s) as usize] {
                    INSERTING => claims.push(geo.state_word(b, s)),
                    state if state >= PUBLISHED => {
                        let fp = table[geo.fp_word(b, s) as usize];
                        let cell = geo.published_cell(fp, state).unwrap();
                        bitmap.words[(cell / 32) as usize] |= 1 << (cell % 32);
                        items += 1;
                    }
                    _ => {}
                }
            }
        }
        (bitmap.words, items, claims)
    }

    /// A scan in rounds and tasks of every size finds what a walk slot by slot finds: every
    /// published cell, the key count, and the claims, which it clears and whose lines it
    /// returns in order, once each.
    #[test]
    fn a_scan_in_rounds_finds_every_cell_and_claim() {
        let dir = tempfile::tempdir().unwrap();
        // Enough buckets for rounds of several tasks, and a bitmap of several words a part.
        let (mut pool, geo) = closed_pool(&dir, 30_000);
        assert!(geo.cells / 32 > 64 * 4, "{} cells", geo.cells);
        let table = pool.header().table_region;
        // Claims in some empty slots, as a crash in phase A leaves them.
        let mut claimed = 0;
        for b in (0..geo.buckets()).step_by(7) {
            let at = geo.state_word(b, b as u32 % geo.layout.slots) as usize * 4;
            let word = &mut pool.region_mut(table)[at..at + 4];
            if word == EMPTY.to_le_bytes() {
                word.copy_from_slice(&INSERTING.to_le_bytes());
                claimed += 1;
            }
        }
        assert!(claimed > 10, "{claimed} claims");
        let (words, items, claims) = walked(&pool, &geo);
        let mut lines: Vec<u64> = claims.iter().map(|w| (table.offset + w * 4) / 64).collect();
        lines.dedup();
        let bytes = pool.region(table).to_vec();
        for round in [[1, 1], [3, 2], [1000, 64], [1000, 1000], [SCAN_ROUND_BUCKETS, SCAN_TASK_BUCKETS]] {
            pool.region_mut(table).copy_from_slice(&bytes);
            let mut rec = Recovery::default();
            let (bitmap, found) = scan_in_rounds(&mut pool, &geo, table, &mut rec, round).unwrap();
            assert_eq!(bitmap.words, words, "rounds and tasks of {round:?} buckets");
            assert_eq!((rec.items, rec.cleared_claims), (items, claims.len() as u64), "{round:?}");
            assert_eq!(found, lines, "{round:?}");
            assert_eq!(walked(&pool, &geo).2, Vec::<u64>::new(), "{round:?}: the claims are cleared");
        }
    }

    /// Two published slots naming one cell refuse the pool, naming the second slot.
    #[test]
    fn a_cell_named_twice_is_refused_with_its_second_slot() {
        let dir = tempfile::tempdir().unwrap();
        let (mut pool, geo) = closed_pool(&dir, 500);
        let table = pool.header().table_region;
        let published = slots_where(&pool, &geo, |state| state >= PUBLISHED);
        let ((_, _, state), (b1, s1, _)) = (published[3], published[published.len() - 2]);
        let at = geo.state_word(b1, s1) as usize * 4;
        pool.region_mut(table)[at..at + 4].copy_from_slice(&state.to_le_bytes());
        for round in [[2, 1], [SCAN_ROUND_BUCKETS, SCAN_TASK_BUCKETS]] {
            let err = scan_in_rounds(&mut pool, &geo, table, &mut Recovery::default(), round).unwrap_err();
            let want = format!("bucket {b1} slot {s1}: value cell {} is referenced twice", state - PUBLISHED);
            assert!(err.to_string().contains(&want), "{round:?}: {err}");
        }
    }

    /// A published state naming a cell past the heap refuses the pool, naming its slot, in
    /// whichever task of a round it lies; the cell just before the end is accepted.
    #[test]
    fn a_cell_beyond_the_heap_is_refused_with_its_slot() {
        let dir = tempfile::tempdir().unwrap();
        let (mut pool, geo) = closed_pool(&dir, 500);
        let table = pool.header().table_region;
        let (b, s, _) = slots_where(&pool, &geo, |state| state == EMPTY)[40];
        let at = geo.state_word(b, s) as usize * 4;
        for (cell, refused) in
            [(geo.cells as u32, true), (u32::MAX - PUBLISHED, true), (geo.cells as u32 - 1, false)]
        {
            pool.region_mut(table)[at..at + 4].copy_from_slice(&(PUBLISHED + cell).to_le_bytes());
            for round in [[1, 1], [3, 2], [SCAN_ROUND_BUCKETS, SCAN_TASK_BUCKETS]] {
                let scanned = scan_in_rounds(&mut pool, &geo, table, &mut Recovery::default(), round);
                if refused {
                    let err = scanned.unwrap_err().to_string();
                    let want = format!(
                        "bucket {b} slot {s}: value cell {cell} beyond the heap of {} cells",
                        geo.cells
                    );
                    assert!(err.contains(&want), "{round:?}: {err}");
                } else {
                    // 500 keys take the first cells: the last one is free.
                    scanned.unwrap();
                }
            }
        }
    }

    /// A pool marked dirty has freed what its close saved: loading it then is a bug, not a
    /// silent scan.
    #[test]
    #[should_panic(expected = "before the pool's first write frees it")]
    fn a_saved_allocator_is_not_read_after_the_first_write() {
        let dir = tempfile::tempdir().unwrap();
        let (mut pool, geo) = closed_pool(&dir, 500);
        let (_, mut allocator) = recover(&mut pool, &geo).unwrap();
        pool.mark_dirty().unwrap();
        let _ = allocator.load(&mut pool);
    }
}
