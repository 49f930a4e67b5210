//! Batches in flight: while the GPU runs one batch, the host prepares the next and decodes the
//! results of the one before; reads-only batches run back to back (docs/protocol.md,
//! "Batches in flight"). Host batches ([`Pipeline`]) and device batches ([`DevicePipeline`])
//! share the schedule ([`Flights`]); they differ in what they hold while in flight and what
//! a completed batch gives back.

use std::collections::VecDeque;
use std::sync::MutexGuard;
use std::time::Instant;

use super::{GpHash, State};
use crate::batch::{Batch, BatchResult, Encoded, Part};
use crate::device_batch::DeviceBatch;
use crate::engine::Input;
use crate::error::{Error, Result};

/// Batches in flight through one [`GpHash`], from [`GpHash::pipeline`].
///
/// Each batch runs as [`GpHash::execute`] would run it, after every batch submitted before
/// it (it sees their effects), and its result comes back from the pipeline, an iterator over
/// the results, in the order submitted. While the GPU runs one batch, the host encodes the
/// next one and decodes the results of the one before; a reads-only batch and the one after it
/// run on the GPU back to back. A batch that writes ends (its phases and persists) before the
/// next batch's phase A is submitted: no persist runs while the GPU writes the pool. A batch
/// is acknowledged (its result `Ok`) only once its own persists are done; when a batch fails so
/// that the index is poisoned, the batches after it fail too.
///
/// The pipeline holds the index's lock: other calls on the index wait until it is dropped (so
/// the thread that holds a pipeline must not call the index itself: it would wait forever).
/// Each of the two slots has its own batch buffers on the device. Dropping it waits for the
/// batches in flight (they take effect or fail as they would have) and discards their results.
pub struct Pipeline<'a> {
    flights: Flights<'a, HostLoad>,
    /// Results of batches completed to make room, not yet taken.
    done: VecDeque<Result<BatchResult>>,
    /// Encoded batches to reuse, keeping their allocations.
    spare: Vec<Encoded>,
}

/// Device batches in flight through one [`GpHash`], from [`GpHash::device_pipeline`]: what
/// [`Pipeline`] is to [`GpHash::execute`], this is to [`GpHash::execute_device`].
///
/// Batches run in the order submitted, each after the effects of those before it, with the
/// schedule of [`Pipeline`]: two in flight, reads-only batches back to back on the GPU, a
/// batch that writes ended (and persisted) before the next one starts. A batch's statuses and
/// found values are in its buffers once the pipeline yields its `Ok` (in the order submitted);
/// until then the GPU may still write them. Two batches in flight must not share output
/// buffers: the later one may overwrite the earlier one's results before they are yielded.
/// The pipeline holds the index's lock until dropped; dropping it waits for the batches in
/// flight.
pub struct DevicePipeline<'a, 'b> {
    flights: Flights<'a, DeviceBatch<'b>>,
    /// Outcomes of batches completed to make room, not yet taken.
    done: VecDeque<Result<()>>,
}

impl GpHash {
    /// A pipeline over the index: up to two batches in flight, their results in order (see
    /// [`Pipeline`]). It holds the index's lock until dropped.
    pub fn pipeline(&self) -> Pipeline<'_> {
        let mut state = self.state();
        state.adopt_gpu(false);
        Pipeline { flights: Flights::new(state), done: VecDeque::new(), spare: vec![] }
    }

    /// A pipeline of device batches over the index: up to two in flight, their outcomes in
    /// order (see [`DevicePipeline`]). It holds the index's lock until dropped.
    pub fn device_pipeline<'b>(&self) -> DevicePipeline<'_, 'b> {
        let mut state = self.state();
        state.adopt_gpu(true);
        DevicePipeline { flights: Flights::new(state), done: VecDeque::new() }
    }
}

impl Pipeline<'_> {
    /// Starts `batch`, after every batch submitted before it. When the pipeline is full, the
    /// oldest batch is completed first (its result waits to be taken). A batch larger than a
    /// GPU still starting in the background may take waits for the start (the batches in
    /// flight end first). A batch larger than `Stats::max_batch` is refused with
    /// `BatchTooLarge`, and one of the wrong key or value width with `KeyWidth` or
    /// `ValueSize`; nothing of it runs. An error of the index (poisoned) refuses the batch too.
    pub fn submit(&mut self, batch: Batch) -> Result<()> {
        if self.flights.queue.is_empty() {
            // Nothing in flight: a GPU started in the background may take over.
            self.flights.state.adopt_gpu(false);
        }
        let s = &mut *self.flights.state;
        s.usable()?;
        s.check_widths(&batch)?;
        if batch.len() > s.max_batch()? && s.starting.is_some() {
            // Larger than a GPU still starting may take: the batches in flight end, and the
            // GPU takes over first, so that its engine's own limit applies.
            while !self.flights.queue.is_empty() {
                let r = self.complete();
                self.done.push_back(r);
            }
            self.flights.state.adopt_gpu(true);
        }
        let s = &mut *self.flights.state;
        let max = s.max_batch()?;
        if batch.len() > max {
            return Err(Error::BatchTooLarge { len: batch.len() as u64, max: max as u64 });
        }
        // Encoded while the GPU still runs the batch before.
        let mut encoded = self.spare.pop().unwrap_or_default();
        let t = Instant::now();
        batch.encode_part(Part::Ops { start: 0, end: batch.len() }, &mut encoded);
        s.host(t, |p| &mut p.encode);
        while self.flights.full()? {
            let r = self.complete();
            self.done.push_back(r);
        }
        self.flights.launch(HostLoad { batch, encoded })
    }

    /// Batches submitted whose results were not taken yet.
    pub fn pending(&self) -> usize {
        self.flights.queue.len() + self.done.len()
    }

    /// Takes the oldest batch in flight to its end: its remaining phases and persists, its
    /// results.
    fn complete(&mut self) -> Result<BatchResult> {
        let (HostLoad { batch, encoded }, slot, ended) = self.flights.complete();
        self.spare.push(encoded);
        let outcome = ended?;
        let n = batch.len();
        let mut result = BatchResult::new(n, batch.value_bytes());
        if n == 0 {
            // Like an empty call: nothing ran, nothing is counted.
            return outcome.map(|()| result);
        }
        let s = &mut *self.flights.state;
        let stored =
            outcome.and_then(|()| s.store(slot, &batch, Part::Ops { start: 0, end: n }, &mut result));
        s.acknowledge(n, stored).map(|()| result)
    }
}

impl<'b> DevicePipeline<'_, 'b> {
    /// Starts `batch`, after every batch submitted before it. When the pipeline is full, the
    /// oldest batch is completed first (its outcome waits to be taken). A batch larger than
    /// the engine takes (`BatchTooLarge`) or with buffers too small or without `STORAGE`
    /// usage (`InvalidConfig`) is refused before anything of it runs, as is any batch while
    /// the index is poisoned.
    pub fn submit(&mut self, batch: DeviceBatch<'b>) -> Result<()> {
        let s = &mut *self.flights.state;
        s.usable()?;
        let max = s.engine()?.max_batch();
        if batch.len as usize > max {
            return Err(Error::BatchTooLarge { len: batch.len as u64, max: max as u64 });
        }
        batch.validate(s.geo.key_words(), s.geo.value_words())?;
        while self.flights.full()? {
            let r = self.complete();
            self.done.push_back(r);
        }
        self.flights.launch(batch)
    }

    /// Batches submitted whose outcomes were not taken yet.
    pub fn pending(&self) -> usize {
        self.flights.queue.len() + self.done.len()
    }

    /// Takes the oldest batch in flight to its end (its remaining phases and persists),
    /// counted as [`GpHash::execute_device`] counts it.
    fn complete(&mut self) -> Result<()> {
        let (batch, _, ended) = self.flights.complete();
        let outcome = ended?;
        self.flights.state.acknowledge(batch.len as usize, outcome)
    }
}

/// The outcomes, in the order the batches were submitted: [`Iterator::next`] returns the
/// result of the oldest batch whose result was not taken yet, once it is acknowledged or failed,
/// and `None` when there is none (a later `submit` gives it more).
impl Iterator for Pipeline<'_> {
    type Item = Result<BatchResult>;

    fn next(&mut self) -> Option<Result<BatchResult>> {
        self.done.pop_front().or_else(|| (!self.flights.queue.is_empty()).then(|| self.complete()))
    }
}

/// As for [`Pipeline`]: the oldest outcome not taken yet, once its batch is acknowledged (its
/// results in its buffers) or failed.
impl Iterator for DevicePipeline<'_, '_> {
    type Item = Result<()>;

    fn next(&mut self) -> Option<Result<()>> {
        self.done.pop_front().or_else(|| (!self.flights.queue.is_empty()).then(|| self.complete()))
    }
}

impl Drop for Pipeline<'_> {
    fn drop(&mut self) {
        while !self.flights.queue.is_empty() {
            // A failure is counted (or poisons the index) as it would be had it been taken.
            let _ = self.complete();
        }
    }
}

impl Drop for DevicePipeline<'_, '_> {
    fn drop(&mut self) {
        while !self.flights.queue.is_empty() {
            let _ = self.complete();
        }
    }
}

/// What a batch in flight runs from.
trait Load {
    fn input(&self) -> Input<'_>;
}

/// A host batch and its encoding.
struct HostLoad {
    batch: Batch,
    encoded: Encoded,
}

impl Load for HostLoad {
    fn input(&self) -> Input<'_> {
        Input::Host(&self.encoded)
    }
}

impl Load for DeviceBatch<'_> {
    fn input(&self) -> Input<'_> {
        Input::Device(self)
    }
}

/// The schedule of batches in flight, whatever they run from: the index's lock and the batches
/// in the order submitted, each in a slot of the engine.
struct Flights<'a, L> {
    state: MutexGuard<'a, State>,
    queue: VecDeque<Flight<L>>,
}

/// A batch in flight.
struct Flight<L> {
    slot: usize,
    load: L,
    stage: Stage,
}

/// How far a batch in flight has gone.
enum Stage {
    /// Phase A is submitted.
    A,
    /// Nothing more runs: the batch is acknowledged (its results wait in its slot, to be
    /// decoded), empty, or failed (the failure counted).
    Ended(Result<()>),
}

impl<'a, L: Load> Flights<'a, L> {
    fn new(state: MutexGuard<'a, State>) -> Self {
        Flights { state, queue: VecDeque::new() }
    }

    /// Whether every slot of the engine holds a batch (the oldest must complete first).
    fn full(&mut self) -> Result<bool> {
        Ok(self.queue.len() >= self.state.engine()?.slots())
    }

    /// Starts `load` in a free slot, once the batch before it, if it writes, has ended.
    fn launch(&mut self, load: L) -> Result<()> {
        // A batch that writes ends (its phases and persists) before the next one starts:
        // no persist runs while the GPU writes the pool. A reads-only one needs no persist, so
        // the next batch's phase A follows it on the GPU at once.
        let s = &mut *self.state;
        if let Some(prev) = self.queue.back_mut()
            && matches!(prev.stage, Stage::A)
            && !prev.load.input().read_only()
        {
            let ended = s.end(prev.slot, prev.load.input());
            prev.stage = Stage::Ended(ended.map_err(|e| s.failed(e)));
        }
        // Nothing runs on an index that a batch ahead poisoned.
        s.usable()?;
        let depth = s.engine()?.slots();
        let slot = (0..depth).find(|&i| self.queue.iter().all(|f| f.slot != i)).expect("a free slot");
        let stage = if load.input().is_empty() {
            Stage::Ended(Ok(()))
        } else {
            s.start_a(slot, load.input()).map_err(|e| s.failed(e))?;
            Stage::A
        };
        self.queue.push_back(Flight { slot, load, stage });
        Ok(())
    }

    /// Takes the oldest batch in flight to its end (its remaining phases and persists): the
    /// batch, its slot (whose results it may decode before the next launch), and `Err` for a
    /// failure already counted, else the outcome still to acknowledge.
    fn complete(&mut self) -> (L, usize, Result<Result<()>>) {
        let f = self.queue.pop_front().expect("a batch in flight");
        let s = &mut *self.state;
        let ended = match f.stage {
            Stage::Ended(Err(e)) => Err(e),
            Stage::Ended(Ok(())) => Ok(Ok(())),
            // A batch poisoned by the failure of one before it is not acknowledged, whatever
            // the GPU did of it.
            Stage::A => Ok(s.usable().and_then(|()| s.end(f.slot, f.load.input()))),
        };
        (f.load, f.slot, ended)
    }
}
