//! Recovery on open and the consistency check (`gphash check`).
//!
//! Recovery clears every INSERTING slot (claims of a batch that was never acknowledged) and
//! rebuilds the volatile value allocator from the published slots. The check verifies every
//! invariant of the table without changing anything.

use std::collections::HashMap;
use std::fmt;

use host_pm::{Header, Pool, Region, ResizeRecord};

use crate::hash::{Seeds, locate, value_checksum};
use crate::layout::{Candidate, EMPTY, Geometry, INSERTING, PUBLISHED};
use crate::model::Bitmap;

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
}

impl fmt::Display for Recovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.created {
            write!(f, "new pool")?;
        } else if self.clean_shutdown {
            write!(f, "clean shutdown; {} keys", self.items)?;
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

/// Clears INSERTING slots (persisting them), counts keys and rebuilds the allocator. A slot
/// that references a cell outside the heap, or a cell that two slots share, is corruption:
/// the pool is refused (run `gphash check` for the full report).
pub(crate) fn recover(pool: &mut Pool, geo: &Geometry) -> crate::Result<(Recovery, Bitmap)> {
    let h = *pool.header();
    let mut rec = Recovery { clean_shutdown: h.clean_shutdown, ..Default::default() };
    let (bitmap, lines) = scan(pool, geo, h.table_region, &mut rec)?;
    pool.persist_lines(&lines)?;
    // An inspection's private view says what recovery would do in its own report.
    if rec.cleared_claims > 0 && !pool.is_private() {
        log::warn!("recovery cleared {} unacknowledged claim(s)", rec.cleared_claims);
    }
    Ok((rec, bitmap))
}

/// Walks the table in `region`: clears INSERTING slots (returning their lines, not yet
/// persisted), counts published keys into `rec` and builds the allocator from their cells.
pub(crate) fn scan(
    pool: &mut Pool,
    geo: &Geometry,
    region: Region,
    rec: &mut Recovery,
) -> crate::Result<(Bitmap, Vec<u64>)> {
    let mut bitmap = Bitmap::new(geo.cells);
    let mut lines = vec![];
    let table: &mut [u32] = bytemuck::cast_slice_mut(pool.region_mut(region));
    for bucket in 0..geo.buckets() {
        for s in 0..geo.layout.slots {
            let at = geo.state_word(bucket, s);
            let state = table[at as usize];
            if state == INSERTING {
                table[at as usize] = EMPTY;
                lines.push(region.offset / 64 + at * 4 / 64);
                rec.cleared_claims += 1;
            } else if state >= PUBLISHED {
                let cell = (state - PUBLISHED) as u64;
                let corrupt = |why: String| host_pm::PoolError::Corrupt {
                    what: format!("bucket {bucket} slot {s}: {why}; run `gphash check`"),
                };
                if cell >= geo.cells {
                    return Err(
                        corrupt(format!("value cell {cell} beyond the heap of {} cells", geo.cells)).into()
                    );
                }
                if bitmap.is_used(cell) {
                    return Err(corrupt(format!("value cell {cell} is referenced twice")).into());
                }
                bitmap.words[(cell / 32) as usize] |= 1 << (cell % 32);
                rec.items += 1;
            }
        }
    }
    Ok((bitmap, lines))
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
/// cleanly closed pool holds no INSERTING slot.
pub fn check(pool: &Pool, geo: &Geometry, header: &Header) -> CheckReport {
    let seeds = Seeds::new(header.table.seed, geo.layout.hashes);
    let table: &[u32] = bytemuck::cast_slice(pool.region(header.table_region));
    let heap: &[u32] = bytemuck::cast_slice(pool.region(header.heap_region));
    let (vw, cw) = (geo.value_words() as usize, geo.cell_words() as usize);
    let kw = geo.key_words() as usize;
    let mut report = CheckReport { slots: geo.slots(), ..Default::default() };
    check_resize_record(geo, header, &mut report);
    let mut keys: HashMap<&[u32], Candidate> = HashMap::new();
    let mut cells: HashMap<u64, Candidate> = HashMap::new();
    for bucket in 0..geo.buckets() {
        for s in 0..geo.layout.slots {
            let here = Candidate { bucket, slot: s };
            let mut bad = |what: String| report.violations.push(Violation { at: Some(here), what });
            let state = table[geo.state_word(bucket, s) as usize];
            if state == INSERTING {
                report.claims += 1;
                if header.clean_shutdown {
                    bad("INSERTING slot in a cleanly closed pool".into());
                }
                continue;
            }
            if state < PUBLISHED {
                continue;
            }
            report.items += 1;
            let k = geo.key_word(bucket, s) as usize;
            let key = &table[k..k + kw];
            let (tops, fp) = locate(key, &seeds, geo.top_level);
            if table[geo.fp_word(bucket, s) as usize] != fp {
                bad(format!(
                    "fingerprint {:#x} is not the key's {fp:#x}",
                    table[geo.fp_word(bucket, s) as usize]
                ));
            }
            if !(0..geo.layout.candidates()).any(|c| geo.candidate(&tops, c) == here) {
                bad(format!("key {key:x?} is not in one of its candidate buckets"));
            }
            if let Some(first) = keys.insert(key, here) {
                bad(format!("key {key:x?} is also published at bucket {} slot {}", first.bucket, first.slot));
            }
            let cell = (state - PUBLISHED) as u64;
            if cell >= geo.cells {
                bad(format!("value cell {cell} beyond the heap of {} cells", geo.cells));
            } else if let Some(first) = cells.insert(cell, here) {
                bad(format!(
                    "value cell {cell} also referenced by bucket {} slot {}",
                    first.bucket, first.slot
                ));
            } else {
                let at = cell as usize * cw;
                let (stored, want) = (heap[at + vw], value_checksum(&heap[at..at + vw]));
                if stored != want {
                    bad(format!(
                        "value cell {cell}: checksum {stored:#010x} is not its value's {want:#010x}"
                    ));
                }
            }
        }
    }
    report
}
