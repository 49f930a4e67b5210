//! Growing the table by one level, crash-consistently.
//!
//! The table grows when an insertion finds no empty candidate slot (or a value no free cell):
//!
//! 1. [`begin`]: place regions for the grown table and heap in free space of the pool (growing
//!    the file when needed), then durably record them in the header's resize record. The old
//!    table stays the one the header names.
//! 2. [`complete`]: zero the new table, copy the heap (cells keep their indices), build the new
//!    table (every level but the old bottom keeps its buckets at their new places; the keys of
//!    the old bottom level are rehashed, on the GPU with the `relocate` and `rehash` kernels
//!    or on the CPU model), check that it holds exactly the keys of the old one, persist it,
//!    and switch the header to it in one durable write. The old regions are then discarded
//!    (by the caller, on a thread of their own, once the grown table's engine is made).
//!
//! A crash before the switch leaves the old table in charge: open finds the record and runs
//! [`complete`] again from the start. A crash after it leaves the new one. The build runs
//! between batches, so the old table holds no claim.

use std::sync::Arc;

use gphash_gpu::Gpu;
use gphash_gpu::resources::ImportedRegions;
use host_pm::{Pool, Region, ResizeRecord};
use rayon::prelude::*;

use crate::bulk::{DisjointWrites, prefetch};
use crate::cpu::{disjoint_regions, split_regions};
use crate::error::{Error, Result};
use crate::gpu::engine::GpuOptions;
use crate::hash::Seeds;
use crate::layout::{Geometry, PUBLISHED};
use crate::model::{Bitmap, Model};
use crate::placement::place;
use crate::profile::Laps;
use crate::protocol::control;
use crate::recovery::{Recovery, scan};

/// Bytes one host thread zeroes or copies at a time while the grown table is built.
const COPY_TASK_BYTES: usize = 1 << 22;

/// Copies `from` into `to`, of the same length, on all host threads.
pub(crate) fn copy_on_all_threads(to: &mut [u8], from: &[u8]) {
    to.par_chunks_mut(COPY_TASK_BYTES)
        .zip(from.par_chunks(COPY_TASK_BYTES))
        .for_each(|(to, from)| to.copy_from_slice(from));
}

/// Who builds the grown table.
#[derive(Clone, Copy)]
pub(crate) enum Builder<'a> {
    /// The GPU, with these settings.
    Gpu(&'a Arc<Gpu>, &'a GpuOptions),
    /// The CPU model.
    Cpu,
}

/// Where the table one level taller than `geo` goes: its table and heap regions.
/// `OutOfSpace` when the pool cannot grow to hold them.
pub fn plan(pool: &Pool, geo: &Geometry) -> Result<[Region; 2]> {
    let new = geo.grown()?;
    let h = pool.header();
    let placed = place(&[h.table_region, h.heap_region], &[new.table_bytes(), new.heap_bytes()]);
    let end = placed.iter().map(Region::end).max().unwrap_or(0);
    if let Some(limit) = pool.max_bytes()
        && end > limit
    {
        return Err(Error::Pool(host_pm::PoolError::OutOfSpace { needed: end, limit }));
    }
    Ok([placed[0], placed[1]])
}

/// Step 1: reserves the planned regions and durably records them in the header (a pool
/// still marked clean is marked dirty first: what its close saved may lie where they go).
/// Returns whether the new table's region lies past the pool's old end, where a growth's new
/// bytes read as zero ([`Pool::grow`]): then [`complete`] need not zero it.
pub fn begin(pool: &mut Pool, geo: &Geometry, [table, heap]: [Region; 2]) -> Result<Zeroed> {
    let mut laps = Laps::start("growth begin");
    let zeroed = Zeroed(table.offset >= pool.len());
    pool.mark_dirty()?;
    pool.take_room(&[table, heap])?;
    laps.lap("pool grow");
    let mut h = *pool.header();
    h.resize = ResizeRecord {
        state: ResizeRecord::BUILDING,
        new_top_level: geo.top_level + 1,
        new_table: table,
        new_heap: heap,
    };
    pool.write_header(&h)?;
    laps.lap("header");
    log::info!("growing the table from level {}", geo.top_level);
    Ok(zeroed)
}

/// Whether the grown table's region is known to read as zero: true only right after [`begin`]
/// placed it past the pool's old end. A build resumed after a crash, or a region in free space
/// within the pool (where a discard may have left bytes: devdax, or a file system without
/// holes), is zeroed first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Zeroed(pub bool);

/// Abandons a recorded resize: the header forgets it and its regions are discarded.
pub(crate) fn abandon(pool: &mut Pool) -> Result<()> {
    let mut h = *pool.header();
    let record = h.resize;
    h.resize = ResizeRecord::default();
    pool.write_header(&h)?;
    pool.discard(record.new_table)?;
    pool.discard(record.new_heap)?;
    Ok(())
}

/// A table [`complete`] grew.
pub(crate) struct Grown {
    pub(crate) geo: Geometry,
    /// Its allocator.
    pub(crate) bitmap: Bitmap,
    /// The old regions, which hold nothing any more: the caller discards them
    /// ([`Pool::discard_in_background`]) once it has made the grown table's engine, since
    /// punching their holes slowed that engine's imports down as much as it took
    /// (`docs/lab/growth-and-recovery.md`, "Growth of 16 M keys: imports made once, the mapping
    /// kept, the discard after the engine").
    pub(crate) old_regions: [Region; 2],
    /// Where the GPU built it in place, the imports of the new table and heap, for the grown
    /// table's engine to take over. Nothing moves the pool between the build and the return.
    pub(crate) imported: Option<ImportedRegions>,
}

/// Buckets a task of [`redeal`] takes.
const REDEAL_TASK_BUCKETS: usize = 1 << 14;

/// Values [`redeal`] asks the memory for ahead of the one it copies.
const PREFETCH_AHEAD: usize = 16;

/// Deals the values of the grown table `new`, whose heap has more arenas than `old`'s, to them:
/// its state words, copied from `old`'s table, name cells of `old`'s heap (`from`); each
/// published value goes to the next cell of its key's arena in the new heap (`to`), in bucket
/// order, and its state word is renumbered. Only the growth whose slots first need more arenas
/// does this (past 2^32 - 4 slots, then each doubling of them). On all host threads, tasks of
/// `task_buckets` buckets: one pass counts each task's values of each arena, so that each task
/// knows its first cell of each arena; a second deals them. A damaged state word is found by the
/// count, before anything is dealt (where there are several, the error names one of them).
fn redeal(
    old: &Geometry,
    new: &Geometry,
    table: &mut [u32],
    from: &[u32],
    to: &mut [u32],
    task_buckets: usize,
) -> Result<()> {
    let (cw, arenas) = (new.cell_words() as usize, new.arenas() as usize);
    let bucket_words = new.bucket_words() as usize;
    let task_words = task_buckets * bucket_words;
    let buckets = &mut table[..new.keys_base() as usize];
    // A task's published slots: the word of the state, the fingerprint and the state, in
    // bucket order (a task's first bucket is bucket 0 of its words).
    fn published<'a>(new: &'a Geometry, part: &'a [u32]) -> impl Iterator<Item = (usize, u32, u32)> + 'a {
        let buckets = (part.len() / new.bucket_words() as usize) as u64;
        (0..buckets).flat_map(move |b| (0..new.layout.slots).map(move |s| (b, s))).filter_map(
            move |(b, s)| {
                let at = new.state_word(b, s) as usize;
                (part[at] >= PUBLISHED).then(|| (at, part[new.fp_word(b, s) as usize], part[at]))
            },
        )
    }
    let cell_of = |fp: u32, state: u32, task: usize, at: usize| {
        old.published_cell(fp, state).map_err(|why| {
            let (bucket, slot) =
                (task * task_buckets + at / bucket_words, at % bucket_words - new.layout.slots as usize);
            Error::Pool(host_pm::PoolError::Corrupt { what: format!("bucket {bucket} slot {slot}: {why}") })
        })
    };
    let counts = buckets
        .par_chunks(task_words)
        .enumerate()
        .map(|(task, part)| {
            let mut count = vec![0u64; arenas];
            for (at, fp, state) in published(new, part) {
                cell_of(fp, state, task, at)?;
                count[new.arena_of(fp) as usize] += 1;
            }
            Ok(count)
        })
        .collect::<Result<Vec<_>>>()?;
    // Each task's first cell of each arena: past the cells of the tasks before it.
    let mut next = vec![0u64; arenas];
    let firsts: Vec<Vec<u64>> = counts
        .iter()
        .map(|count| {
            let first = next.clone();
            next.iter_mut().zip(count).for_each(|(n, c)| *n += c);
            first
        })
        .collect();
    if let Some(arena) = next.iter().position(|&n| n > new.arena_cells()) {
        return Err(Error::Resize(format!(
            "arena {arena} of the grown heap has {} cells for {} values",
            new.arena_cells(),
            next[arena]
        )));
    }
    let heap_words = to.len();
    let heap = DisjointWrites(std::ptr::NonNull::from(to).cast());
    buckets.par_chunks_mut(task_words).zip(firsts).for_each(|(part, mut next)| {
        let cells: Vec<(usize, u32, usize)> = published(new, part)
            .map(|(at, fp, state)| {
                (at, fp, old.published_cell(fp, state).expect("checked by the count") as usize)
            })
            .collect();
        for (i, &(at, fp, cell)) in cells.iter().enumerate() {
            // The values are read in no order: ask for a later one's lines ahead.
            if let Some(&(_, _, ahead)) = cells.get(i + PREFETCH_AHEAD) {
                (0..cw).step_by(16).for_each(|w| prefetch(&from[ahead * cw + w]));
                prefetch(&from[ahead * cw + cw - 1]);
            }
            let arena = new.arena_of(fp) as usize;
            let local = next[arena];
            next[arena] += 1;
            let dst = new.cell_index(arena as u32, local as u32) as usize * cw;
            assert!(dst + cw <= heap_words, "cell {local} of arena {arena} past the heap");
            let value = &from[cell * cw..][..cw];
            // SAFETY: `dst..dst + cw` lies in `to` (asserted), which `to`'s borrow holds until
            // every task is done. Cells `firsts[task][arena] ..` of the counted values of the
            // task are its own: each (arena, local) is one cell, and the tasks' ranges of
            // locals are disjoint. `from` is other memory.
            unsafe { std::ptr::copy_nonoverlapping(value.as_ptr(), heap.at(dst * 4).cast::<u32>(), cw) };
            part[at] = PUBLISHED + local as u32;
        }
    });
    Ok(())
}

/// Step 2: builds the grown table of the header's resize record from the current one, which
/// holds `items` keys, and switches the header to it ([`Grown`] says what it returns). `held`:
/// imports of the pool the GPU may read the old table through (`crate::gpu::resize::build`).
pub(crate) fn complete(
    pool: &mut Pool,
    builder: Builder,
    old: &Geometry,
    items: u64,
    zeroed: Zeroed,
    held: Option<&mut ImportedRegions>,
) -> Result<Grown> {
    let h = *pool.header();
    let record = h.resize;
    let new = old.grown()?;
    let corrupt =
        |what: String| Error::Pool(host_pm::PoolError::Corrupt { what: format!("resize record: {what}") });
    if record.state != ResizeRecord::BUILDING {
        return Err(corrupt(format!("unknown state {}", record.state)));
    }
    if record.new_top_level != new.top_level {
        return Err(corrupt(format!("grows to level {} from level {}", record.new_top_level, old.top_level)));
    }
    if record.new_table.bytes < new.table_bytes() || record.new_heap.bytes < new.heap_bytes() {
        return Err(corrupt("its regions are smaller than the grown table needs".into()));
    }
    let mut laps = Laps::start("growth build");
    // Whatever an interrupted build (or an earlier use of the space) left in the new table's
    // region is cleared first.
    if !zeroed.0 {
        pool.region_mut(record.new_table).par_chunks_mut(COPY_TASK_BYTES).for_each(|c| c.fill(0));
    }
    laps.lap("zero table");
    // With the arenas it had, the heap is copied as it is (cells keep their numbers); with more,
    // its values are dealt to them once the new table is built.
    let redealt = new.arena_bits != old.arena_bits;
    if !redealt {
        let (from, to) = split_regions(pool, h.heap_region, record.new_heap);
        let heap = old.heap_bytes() as usize;
        copy_on_all_threads(&mut to[..heap], &from[..heap]);
        laps.lap("copy heap");
    }
    let seeds = Seeds::new(h.table.seed, new.layout.hashes);
    let (failed, imported) = match builder {
        Builder::Gpu(gpu, opts) => {
            let (c, imported) = crate::gpu::resize::build(
                gpu,
                opts,
                pool,
                &seeds,
                (old, h.table_region),
                (&new, record.new_table, record.new_heap),
                held,
            )?;
            (c[control::FULL] as u64, imported)
        }
        Builder::Cpu => {
            let (from, to) = split_regions(pool, h.table_region, record.new_table);
            let (from, to): (&[u32], &mut [u32]) = (bytemuck::cast_slice(from), bytemuck::cast_slice_mut(to));
            let model = Model { geo: &new, seeds: &seeds, verify_values: false };
            model.relocate(old, from, to);
            (model.rehash(old, from, to), None)
        }
    };
    laps.lap("build");
    if failed > 0 {
        return Err(Error::Resize(format!(
            "{failed} key(s) of the bottom level found no slot in the grown table"
        )));
    }
    if redealt {
        let [table, from, to] = disjoint_regions(pool, [record.new_table, h.heap_region, record.new_heap]);
        let to = &mut to[..new.heap_bytes() as usize];
        redeal(
            old,
            &new,
            bytemuck::cast_slice_mut(table),
            bytemuck::cast_slice(from),
            bytemuck::cast_slice_mut(to),
            REDEAL_TASK_BUCKETS,
        )?;
        laps.lap("deal the values to the arenas");
    }
    let mut counted = Recovery::default();
    let (bitmap, _) = scan(pool, &new, record.new_table, &mut counted)?;
    laps.lap("scan");
    if counted.items != items || counted.cleared_claims != 0 {
        return Err(Error::Resize(format!(
            "the grown table holds {} keys, the old one {items}",
            counted.items
        )));
    }
    pool.persist_range(record.new_table.offset, record.new_table.bytes)?;
    pool.persist_range(record.new_heap.offset, record.new_heap.bytes)?;
    laps.lap("persist");
    let mut switched = h;
    switched.table.top_level = new.top_level;
    switched.table_region = record.new_table;
    switched.heap_region = record.new_heap;
    switched.heap_cells = new.cells;
    switched.user[crate::layout::ARENA_BITS_WORD] = new.arena_bits as u64;
    switched.resize = ResizeRecord::default();
    pool.write_header(&switched)?;
    laps.lap("switch");
    log::info!("the table grew to level {}: {} slots, {} keys", new.top_level, new.slots(), items);
    Ok(Grown { geo: new, bitmap, old_regions: [h.table_region, h.heap_region], imported })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::value_checksum;
    use crate::{Config, Executor, GpHash, Options};

    fn value(k: u64) -> Vec<u8> {
        (0..12).map(|i| (k as u8).wrapping_mul(31).wrapping_add(i)).collect()
    }

    /// Values dealt to four arenas keep their keys: each key's state word names a cell of its
    /// arena holding its value and checksum, no cell twice; tasks of a few buckets on all threads
    /// deal them as one task does; keys in their buckets or apart.
    #[test]
    fn values_dealt_to_more_arenas_keep_their_keys() {
        for keys_apart in [false, true] {
            let config = Config { capacity: 5000, value_bytes: 12, keys_apart, ..Config::default() };
            let cpu = Options { executor: Executor::Cpu, ..Options::default() };
            let t = GpHash::create(None, &config, &cpu).unwrap();
            let mut batch = t.batch();
            for k in 0..4000u64 {
                batch.insert(&k.to_le_bytes(), &value(k)).unwrap();
            }
            t.execute(&batch).unwrap();
            let old = t.geometry();
            assert_eq!(old.keys_apart, keys_apart);
            let new = old.with_arena_bits(2).unwrap();
            let (table, from): (Vec<u32>, Vec<u32>) = t.with_pool(|pool| {
                let h = pool.header();
                (
                    bytemuck::pod_collect_to_vec(pool.region(h.table_region)),
                    bytemuck::pod_collect_to_vec(pool.region(h.heap_region)),
                )
            });
            // Tasks of 7 buckets deal exactly what one task does.
            let dealt = |task_buckets| {
                let (mut table, mut to) = (table.clone(), vec![0u32; new.heap_words() as usize]);
                redeal(&old, &new, &mut table, &from, &mut to, task_buckets).unwrap();
                (table, to)
            };
            // A state word beyond the old heap in the last task is named, and the count finds it
            // before any task deals a value.
            let (b, s) = (0..old.buckets())
                .rev()
                .flat_map(|b| (0..old.layout.slots).rev().map(move |s| (b, s)))
                .find(|&(b, s)| table[old.state_word(b, s) as usize] >= PUBLISHED)
                .unwrap();
            assert!(b >= 7, "bucket {b}: not in a later task than the first");
            let at = old.state_word(b, s) as usize;
            let mut damaged = table.clone();
            damaged[at] = PUBLISHED + old.cells as u32;
            let mut to = vec![0u32; new.heap_words() as usize];
            let e = redeal(&old, &new, &mut damaged, &from, &mut to, 7).unwrap_err().to_string();
            assert!(e.contains(&format!("bucket {b} slot {s}: value cell")), "{e}");
            assert!(
                to.iter().all(|&w| w == 0)
                    && damaged[..at] == table[..at]
                    && damaged[at + 1..] == table[at + 1..]
            );
            let (table, to) = dealt(new.buckets() as usize);
            assert!((table.clone(), to.clone()) == dealt(7));
            let seeds = Seeds::new(config.seed, new.layout.hashes);
            let model = Model { geo: &new, seeds: &seeds, verify_values: false };
            let (cw, mut cells) = (new.cell_words() as usize, std::collections::HashSet::new());
            let mut arenas = vec![0; 4];
            for k in 0..4000u64 {
                let key: Vec<u32> = bytemuck::pod_collect_to_vec(&k.to_le_bytes());
                let probe = model.probe(&table, &key);
                let c = probe.published().expect("every key published");
                let cell = new.published_cell(probe.fingerprint, probe.states[c]).unwrap();
                let arena = new.arena_of(probe.fingerprint);
                assert_eq!(new.cell_local(cell).0, arena, "key {k}");
                arenas[arena as usize] += 1;
                assert!(cells.insert(cell), "key {k}: cell {cell} twice");
                let words = &to[cell as usize * cw..][..cw];
                assert_eq!(bytemuck::cast_slice::<u32, u8>(&words[..3]), &value(k)[..], "key {k}");
                assert_eq!(words[3], value_checksum(&words[..3]), "key {k}");
            }
            assert!(arenas.iter().all(|&n| n > 800), "{arenas:?}");
        }
    }
}
