//! The CPU engine: runs the model's stages over the pool mapping. Used where no Vulkan
//! adapter exists, and as the oracle of the kernel tests.

use host_pm::{Pool, Region};

use crate::engine::{Encoded, Engine, Mode, Report, Written};
use crate::error::Result;
use crate::hash::Seeds;
use crate::layout::Geometry;
use crate::model::{Bitmap, Control, Dirty, Mem, Model};
use crate::protocol::{OpKind, OpState, control};

/// Splits the pool mapping into the table and heap words.
pub fn regions_mut(pool: &mut Pool, table: Region, heap: Region) -> Mem<'_> {
    let bytes = pool.bytes_mut();
    let (t, h) = if table.offset < heap.offset {
        let (a, b) = bytes.split_at_mut(heap.offset as usize);
        (&mut a[table.offset as usize..table.end() as usize], &mut b[..heap.bytes as usize])
    } else {
        let (a, b) = bytes.split_at_mut(table.offset as usize);
        (&mut b[..table.bytes as usize], &mut a[heap.offset as usize..heap.end() as usize])
    };
    Mem { table: bytemuck::cast_slice_mut(t), heap: bytemuck::cast_slice_mut(h) }
}

/// Executes batches with the CPU model.
pub struct CpuEngine {
    geo: Geometry,
    seeds: Seeds,
    table: Region,
    heap: Region,
    bitmap: Bitmap,
    reason: String,
    states: Vec<OpState>,
    statuses: Vec<u32>,
    values: Vec<u32>,
}

impl CpuEngine {
    /// An engine over the pool's regions, with the allocator rebuilt at recovery.
    pub fn new(geo: Geometry, seeds: Seeds, table: Region, heap: Region, bitmap: Bitmap, reason: String) -> Self {
        CpuEngine { geo, seeds, table, heap, bitmap, reason, states: vec![], statuses: vec![], values: vec![] }
    }

    fn dirty(&self) -> Dirty {
        Dirty { table_base: self.table.offset / 64, heap_base: self.heap.offset / 64, lines: vec![] }
    }

    fn report(control: Control, dirty: Dirty) -> Report {
        Report { control, written: Written::Lines(dirty.lines) }
    }
}

fn kind(code: u32) -> OpKind {
    OpKind::from_code(code).expect("batches are encoded from OpKind")
}

impl Engine for CpuEngine {
    fn mode(&self) -> Mode {
        Mode::Cpu { reason: self.reason.clone() }
    }

    fn phase_a(&mut self, pool: &mut Pool, batch: &Encoded) -> Result<Report> {
        let n = batch.len();
        let (kw, cw) = (self.geo.key_words() as usize, self.geo.cell_words() as usize);
        self.states = vec![OpState::INITIAL; n];
        self.statuses = vec![0; n];
        self.values = vec![0; n * cw];
        let mut ctl = Control::default();
        let mut dirty = self.dirty();
        let model = Model { geo: &self.geo, seeds: &self.seeds };
        let mut mem = regions_mut(pool, self.table, self.heap);
        for i in 0..n {
            let value = &batch.values[i * cw..(i + 1) * cw];
            model.alloc(&mut mem, &mut self.bitmap, &mut dirty, kind(batch.kinds[i]), value, &mut self.states[i], &mut ctl);
        }
        for i in 0..n {
            model.phase_a(
                &mut mem,
                &mut dirty,
                kind(batch.kinds[i]),
                &batch.keys[i * kw..(i + 1) * kw],
                &mut self.states[i],
                &mut self.statuses[i],
                &mut self.values[i * cw..(i + 1) * cw],
                &mut ctl,
            );
        }
        Ok(Self::report(ctl, dirty))
    }

    fn rollback(&mut self, pool: &mut Pool, _batch: &Encoded) -> Result<Report> {
        let mut dirty = self.dirty();
        let model = Model { geo: &self.geo, seeds: &self.seeds };
        let mut mem = regions_mut(pool, self.table, self.heap);
        for st in &self.states {
            model.rollback(&mut mem, &mut self.bitmap, &mut dirty, st);
        }
        Ok(Self::report(Control::default(), dirty))
    }

    fn phase_b(&mut self, pool: &mut Pool, batch: &Encoded, publish: bool) -> Result<Report> {
        let kw = self.geo.key_words() as usize;
        let mut ctl = Control::default();
        let mut dirty = self.dirty();
        let model = Model { geo: &self.geo, seeds: &self.seeds };
        let mut mem = regions_mut(pool, self.table, self.heap);
        if publish {
            for i in 0..batch.len() {
                model.phase_b(
                    &mut mem,
                    &mut dirty,
                    kind(batch.kinds[i]),
                    &batch.keys[i * kw..(i + 1) * kw],
                    &mut self.states[i],
                    &mut self.statuses[i],
                    &mut ctl,
                );
            }
        }
        for st in &self.states {
            model.free(&mut self.bitmap, st);
        }
        debug_assert_eq!(ctl[control::FULL], 0);
        Ok(Self::report(ctl, dirty))
    }

    fn results(&mut self, statuses: &mut [u32], values: &mut [u32]) -> Result<()> {
        statuses.copy_from_slice(&self.statuses);
        values.copy_from_slice(&self.values);
        Ok(())
    }

    fn cells_used(&mut self) -> Result<u64> {
        Ok(self.bitmap.used(self.geo.cells))
    }
}
