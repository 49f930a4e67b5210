//! The CPU engine: runs the model's stages over the pool mapping. Used where no Vulkan
//! adapter exists, and as the oracle of the kernel tests.

use host_pm::{Pool, Region};

use crate::batch::Encoded;
use crate::engine::{Engine, Input, MAX_BATCH, Mode, Phase, Report, Written};
use crate::error::{Error, Result};
use crate::hash::Seeds;
use crate::layout::Geometry;
use crate::model::{BatchRun, Bitmap, Control, Dirty, Mem, Model};
use crate::recovery::Allocator;

/// Two disjoint regions of the pool mapping, both writable.
pub(crate) fn split_regions(pool: &mut Pool, a: Region, b: Region) -> (&mut [u8], &mut [u8]) {
    let [a, b] = disjoint_regions(pool, [a, b]);
    (a, b)
}

/// Disjoint regions of the pool mapping, each writable, in the order given.
pub(crate) fn disjoint_regions<const N: usize>(pool: &mut Pool, regions: [Region; N]) -> [&mut [u8]; N] {
    let mut order: [usize; N] = std::array::from_fn(|i| i);
    order.sort_by_key(|&i| regions[i].offset);
    let (mut rest, mut base) = (pool.bytes_mut(), 0);
    let mut out: [Option<&mut [u8]>; N] = std::array::from_fn(|_| None);
    for i in order {
        let r = regions[i];
        let (_, from_here) = std::mem::take(&mut rest).split_at_mut((r.offset - base) as usize);
        let (mine, after) = from_here.split_at_mut(r.bytes as usize);
        (out[i], rest, base) = (Some(mine), after, r.end());
    }
    out.map(|r| r.expect("every region placed"))
}

/// Splits the pool mapping into the table and heap words.
pub(crate) fn regions_mut(pool: &mut Pool, table: Region, heap: Region) -> Mem<'_> {
    let (t, h) = split_regions(pool, table, heap);
    Mem { table: bytemuck::cast_slice_mut(t), heap: bytemuck::cast_slice_mut(h) }
}

/// Executes batches with the CPU model.
pub(crate) struct CpuEngine {
    geo: Geometry,
    seeds: Seeds,
    table: Region,
    heap: Region,
    allocator: Allocator,
    reason: String,
    verify_values: bool,
    /// Each slot's batch as run so far, and the report of the phase last started in it.
    slots: [(BatchRun, Option<Report>); SLOTS],
}

/// Batches held at once, as many as the GPU engine holds: the host protocol runs the same
/// way on both.
const SLOTS: usize = 2;

impl CpuEngine {
    /// An engine over the pool's regions, with the allocator recovery gave; reads check their
    /// value's checksum when `verify_values`.
    pub(crate) fn new(
        geo: Geometry,
        seeds: Seeds,
        table: Region,
        heap: Region,
        allocator: Allocator,
        reason: String,
        verify_values: bool,
    ) -> Self {
        CpuEngine { geo, seeds, table, heap, allocator, reason, verify_values, slots: Default::default() }
    }

    /// Runs `stage` over every operation of the batch in `slot` with the lines it writes
    /// collected.
    fn stage(
        &mut self,
        pool: &mut Pool,
        slot: usize,
        batch: &Encoded,
        stage: impl Fn(&Model, &mut Mem, &mut Allocator, &mut Dirty, &mut BatchRun, usize),
    ) -> Report {
        let run = &mut self.slots[slot].0;
        run.control = Control::default();
        let mut dirty =
            Dirty { table_base: self.table.offset / 64, heap_base: self.heap.offset / 64, lines: vec![] };
        let model = Model { geo: &self.geo, seeds: &self.seeds, verify_values: self.verify_values };
        let mut mem = regions_mut(pool, self.table, self.heap);
        for i in 0..batch.len() {
            stage(&model, &mut mem, &mut self.allocator, &mut dirty, run, i);
        }
        Report { control: run.control, written: Written::Lines(dirty.lines) }
    }

    /// Allocation and phase A, with one report for the whole phase, as the GPU's single
    /// control block gives. A batch of gets allocates nothing, so it leaves an allocator that
    /// is still in the pool unread.
    fn phase_a(&mut self, pool: &mut Pool, slot: usize, batch: &Encoded) -> Result<Report> {
        if batch.len() > MAX_BATCH {
            return Err(Error::BatchTooLarge { len: batch.len() as u64, max: MAX_BATCH as u64 });
        }
        self.slots[slot].0 = BatchRun::new(batch.len(), self.geo.value_words() as usize);
        let mut alloc = Report::nothing();
        if !batch.read_only() {
            self.allocator.load(pool)?;
            alloc = self.stage(pool, slot, batch, |m, mem, allocator, dirty, run, i| {
                m.alloc(mem, allocator.loaded(), dirty, batch, run, i)
            });
        }
        let mut a =
            self.stage(pool, slot, batch, |m, mem, _, dirty, run, i| m.phase_a(mem, dirty, batch, run, i));
        for (total, x) in a.control.iter_mut().zip(alloc.control) {
            *total += x;
        }
        if let (Written::Lines(all), Written::Lines(mut more)) = (&mut a.written, alloc.written) {
            all.append(&mut more);
        }
        Ok(a)
    }
}

fn host<'a>(batch: Input<'a>) -> Result<&'a Encoded> {
    match batch {
        Input::Host(e) => Ok(e),
        Input::Device(_) => Err(Error::MissingFeature("device-buffer batches need the GPU executor".into())),
    }
}

impl Engine for CpuEngine {
    fn mode(&self) -> Mode {
        Mode::Cpu { reason: self.reason.clone() }
    }

    fn max_batch(&self) -> usize {
        MAX_BATCH
    }

    fn slots(&self) -> usize {
        SLOTS
    }

    fn start(&mut self, pool: &mut Pool, slot: usize, phase: Phase, batch: Input) -> Result<()> {
        let batch = host(batch)?;
        let report = match phase {
            Phase::A => self.phase_a(pool, slot, batch)?,
            Phase::Rollback => {
                self.allocator.load(pool)?;
                self.stage(pool, slot, batch, |m, mem, allocator, dirty, run, i| {
                    m.rollback(mem, allocator.loaded(), dirty, &run.states[i])
                })
            }
            Phase::B { publish } => {
                let report = if publish {
                    self.stage(pool, slot, batch, |m, mem, _, dirty, run, i| {
                        m.phase_b(mem, dirty, batch, run, i)
                    })
                } else {
                    Report::nothing()
                };
                let model = Model { geo: &self.geo, seeds: &self.seeds, verify_values: self.verify_values };
                let bitmap = self.allocator.load(pool)?;
                for st in &self.slots[slot].0.states {
                    model.free(bitmap, st);
                }
                report
            }
        };
        self.slots[slot].1 = Some(report);
        Ok(())
    }

    fn finish(&mut self, _pool: &mut Pool, slot: usize) -> Result<Report> {
        Ok(self.slots[slot].1.take().expect("a phase was started in the slot"))
    }

    fn results(&self, slot: usize) -> (&[u32], &[u32]) {
        (&self.slots[slot].0.statuses, &self.slots[slot].0.values)
    }

    fn cache_status(&self) -> crate::cache::CacheStatus {
        crate::cache::CacheStatus::Off { reason: "the CPU executor has no device memory".into() }
    }

    fn bitmap(&mut self, pool: &mut Pool) -> Result<Bitmap> {
        Ok(self.allocator.load(pool)?.clone())
    }

    fn cells_used(&mut self, pool: &mut Pool) -> Result<u64> {
        Ok(self.allocator.load(pool)?.used(self.geo.cells))
    }

    fn load_allocator(&mut self, pool: &mut Pool) -> Result<()> {
        self.allocator.load(pool).map(drop)
    }
}
