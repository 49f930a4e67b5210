//! Growing the value heap without growing the table.
//!
//! A table sized for `capacity` keys gets a heap of about that many cells
//! ([`Geometry::cells_for_keys`]); insertions beyond it, while the table still has slots, run
//! out of cells first. The heap then grows by a quarter, crash-consistently and without a
//! record: in place when the space after it is free (the pool grows, and one header write
//! makes the new cells part of it), else into a new region (the cells copied and persisted
//! before one header write switches to it; the old region is then discarded). Cells keep their
//! indices, so nothing in the table changes. A crash before the header write leaves the old
//! heap, whose cells nothing else touched.

use host_pm::{Pool, Region};

use crate::error::{Error, Result};
use crate::layout::Geometry;
use crate::placement::{place, region_bytes};
use crate::profile::Laps;
use crate::resize::copy_on_all_threads;

/// The geometry of `geo`'s table with its heap grown by a quarter ([`Geometry::with_cells`]),
/// or to the most cells its arenas' state words address ([`Geometry::most_cells`], no fewer
/// than the table's slots); `HeapFull` (naming `failed` operations) when it has them already.
pub(crate) fn grown(geo: &Geometry, failed: u64) -> Result<Geometry> {
    let most = geo.most_cells();
    let new = geo.with_cells((geo.cells + geo.cells / 4 + 1024).min(most))?;
    if new.cells <= geo.cells {
        log::info!("the heap cannot grow: it has the {most} cells its arenas address");
        return Err(Error::HeapFull { failed });
    }
    Ok(new)
}

/// Where the heap of `new`'s cells goes: in place where the space after the heap is free,
/// else in free space of the pool. The pool is marked dirty first.
pub(crate) fn plan(pool: &mut Pool, new: &Geometry) -> Result<Region> {
    pool.mark_dirty()?;
    let h = *pool.header();
    let bytes = region_bytes(new.heap_bytes());
    let in_place = Region { offset: h.heap_region.offset, bytes };
    // A dirty pool has no close record and, between batches, no resize record: the table is
    // the only other region.
    Ok(if h.table_region.overlaps(&in_place) {
        place(&[h.table_region, h.heap_region], &[bytes])[0]
    } else {
        in_place
    })
}

/// Grows the heap of `geo`'s table in `pool` to `new`'s cells, into `region` ([`plan`]; see
/// the module docs). `holding`: what still holds the old heap's memory (a GPU's import), dropped
/// before a moved heap's old region is discarded.
pub(crate) fn grow(
    pool: &mut Pool,
    geo: &Geometry,
    new: &Geometry,
    region: Region,
    holding: impl Send + 'static,
) -> Result<()> {
    let mut laps = Laps::start("heap growth");
    let h = *pool.header();
    let moved = region.offset != h.heap_region.offset;
    pool.take_room(&[region])?;
    laps.lap("pool grow");
    if moved {
        let old = geo.heap_bytes() as usize;
        let (from, to) = crate::cpu::split_regions(pool, h.heap_region, region);
        copy_on_all_threads(&mut to[..old], &from[..old]);
        pool.persist_range(region.offset, region.bytes)?;
        laps.lap("copy");
    }
    let mut switched = h;
    switched.heap_region = region;
    switched.heap_cells = new.cells;
    pool.write_header(&switched)?;
    if moved {
        pool.give_back_after(&[h.heap_region], holding);
    }
    laps.lap("switch");
    log::info!(
        "the heap grew from {} to {} cells{}",
        geo.cells,
        new.cells,
        if moved { ", moved" } else { " in place" }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use host_pm::CreateOptions;

    use super::*;
    use crate::GpHash;
    use crate::layout::{Layout, MAX_CELLS};

    /// An anonymous pool for `geo` whose heap comes first (`heap_first`) or last, its cells
    /// filled with a pattern.
    fn pool(geo: &Geometry, heap_first: bool) -> Pool {
        let (t, h) = (region_bytes(geo.table_bytes()), region_bytes(geo.heap_bytes()));
        let first = host_pm::HEADER_AREA;
        let (table_region, heap_region) = if heap_first {
            (Region { offset: first + h, bytes: t }, Region { offset: first, bytes: h })
        } else {
            (Region { offset: first, bytes: t }, Region { offset: first + t, bytes: h })
        };
        let header = crate::index::new_header(geo, 1, [table_region, heap_region]);
        let mut pool = Pool::create(None, first + t + h, &header, &CreateOptions::default()).unwrap();
        for (i, b) in pool.region_mut(heap_region)[..geo.heap_bytes() as usize].iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        pool
    }

    #[test]
    fn a_heap_grows_in_place_or_moves_with_its_cells() {
        let geo = Geometry::for_capacity(Layout::default(), 8, 8, 50_000).unwrap();
        let new = grown(&geo, 1).unwrap();
        assert!(new.cells >= geo.cells + geo.cells / 4);
        // The grown heap needs more 64 KiB units than the old region has.
        assert!(region_bytes(new.heap_bytes()) > region_bytes(geo.heap_bytes()));
        for heap_first in [false, true] {
            let mut pool = pool(&geo, heap_first);
            let before = *pool.header();
            let region = plan(&mut pool, &new).unwrap();
            grow(&mut pool, &geo, &new, region, ()).unwrap();
            let after = *pool.header();
            assert_eq!(after.heap_cells, new.cells);
            assert!(after.heap_region.bytes >= new.heap_bytes());
            assert_eq!(after.table_region, before.table_region);
            // In place when nothing follows the heap; past the table when the table does.
            assert_eq!(after.heap_region.offset == before.heap_region.offset, !heap_first);
            let cells = &pool.region(after.heap_region)[..geo.heap_bytes() as usize];
            assert!(cells.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8), "cells keep their bytes");
            assert!(GpHash::geometry_of(&pool).unwrap().cells == new.cells);
        }
    }

    #[test]
    fn a_grown_allocator_keeps_its_cells_and_frees_the_new_ones() {
        for (cells, grown_to) in [(40u64, 50u64), (40, 70), (64, 200), (1, 33)] {
            let mut bitmap = crate::model::Bitmap::new(cells, 1);
            let taken: Vec<u32> = (0..cells / 2 + 1).map(|_| bitmap.alloc(0).unwrap()).collect();
            let mut bitmap = bitmap.grown(cells, grown_to);
            assert_eq!(bitmap.used(grown_to), taken.len() as u64, "{cells} -> {grown_to}");
            let mut fresh = vec![];
            while let Some(c) = bitmap.alloc(0) {
                fresh.push(c);
            }
            assert_eq!(fresh.len() as u64 + taken.len() as u64, grown_to, "{cells} -> {grown_to}");
            assert!(fresh.iter().all(|c| !taken.contains(c) && (*c as u64) < grown_to));
        }
    }

    #[test]
    fn a_heap_grows_to_the_cells_the_kernels_address_then_is_full() {
        // Cells are named with 32 bits: a heap of 3.6 G cells grows to 2^32 - 4, not by a
        // quarter, and no further.
        let large = Geometry::new(Layout::default(), 8, 8, 10, 3_600_000_000).unwrap();
        let largest = grown(&large, 7).unwrap();
        assert_eq!(largest.cells, MAX_CELLS);
        assert_eq!(MAX_CELLS, (1 << 32) - 4);
        assert!(matches!(grown(&largest, 7), Err(Error::HeapFull { failed: 7 })));
        assert!(largest.with_cells(MAX_CELLS + 1).is_err());
    }
}
