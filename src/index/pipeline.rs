//! Batches in flight: while the GPU runs one batch, the host prepares the next and decodes the
//! results of the one before; reads-only batches run back to back (docs/protocol.md,
//! "Batches in flight").

use std::collections::VecDeque;
use std::sync::MutexGuard;
use std::time::Instant;

use super::{GpHash, State};
use crate::batch::{Batch, BatchResult, Encoded, Part};
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
/// Each of the two slots has its own batch buffers on the device. Dropping it waits for the batches in flight (they take effect or fail as they would have)
/// and discards their results.
pub struct Pipeline<'a> {
    state: MutexGuard<'a, State>,
    flights: VecDeque<Flight>,
    /// Results of batches completed to make room, not yet taken.
    done: VecDeque<Result<BatchResult>>,
    /// Encoded batches to reuse, keeping their allocations.
    spare: Vec<Encoded>,
}

/// A batch in flight.
struct Flight {
    slot: usize,
    batch: Batch,
    encoded: Encoded,
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

impl GpHash {
    /// A pipeline over the index: up to two batches in flight, their results in order (see
    /// [`Pipeline`]). It holds the index's lock until dropped.
    pub fn pipeline(&self) -> Pipeline<'_> {
        Pipeline { state: self.state(), flights: VecDeque::new(), done: VecDeque::new(), spare: vec![] }
    }
}

impl Pipeline<'_> {
    /// Starts `batch`, after every batch submitted before it. When the pipeline is full, the
    /// oldest batch is completed first (its result waits to be taken). A batch
    /// larger than `Stats::max_batch` is refused with `BatchTooLarge`, and one of the wrong
    /// key or value width with `KeyWidth` or `ValueSize`; nothing of it runs. An error of the
    /// index (poisoned) refuses the batch too.
    pub fn submit(&mut self, batch: Batch) -> Result<()> {
        let s = &mut *self.state;
        s.usable()?;
        s.check_widths(&batch)?;
        let max = s.max_batch()?;
        if batch.len() > max {
            return Err(Error::BatchTooLarge { len: batch.len() as u64, max: max as u64 });
        }
        let depth = s.engine()?.slots();
        // Encoded while the GPU still runs the batch before.
        let mut encoded = self.spare.pop().unwrap_or_default();
        let t = Instant::now();
        batch.encode_part(Part::Ops { start: 0, end: batch.len() }, &mut encoded);
        s.host(t, |p| &mut p.encode);
        while self.flights.len() >= depth {
            let r = self.complete();
            self.done.push_back(r);
        }
        // A batch that writes ends (its phases and persists) before the next one starts:
        // no persist runs while the GPU writes the pool. A reads-only one needs no persist, so
        // the next batch's phase A follows it on the GPU at once.
        if let Some(prev) = self.flights.back_mut()
            && matches!(prev.stage, Stage::A)
            && !prev.encoded.read_only()
        {
            let s = &mut *self.state;
            let ended = s.end(prev.slot, Input::Host(&prev.encoded));
            prev.stage = Stage::Ended(ended.map_err(|e| s.failed(e)));
        }
        let s = &mut *self.state;
        // Nothing runs on an index that a batch ahead poisoned.
        s.usable()?;
        let slot = (0..depth).find(|&i| self.flights.iter().all(|f| f.slot != i)).expect("a free slot");
        let stage = if batch.is_empty() {
            Stage::Ended(Ok(()))
        } else {
            match s.start_a(slot, Input::Host(&encoded)) {
                Ok(()) => Stage::A,
                Err(e) => {
                    self.spare.push(encoded);
                    return Err(s.failed(e));
                }
            }
        };
        self.flights.push_back(Flight { slot, batch, encoded, stage });
        Ok(())
    }

    /// Batches submitted whose results were not taken yet.
    pub fn pending(&self) -> usize {
        self.flights.len() + self.done.len()
    }

    /// Takes the oldest batch in flight to its end: its remaining phases and persists, its
    /// results.
    fn complete(&mut self) -> Result<BatchResult> {
        let f = self.flights.pop_front().expect("a batch in flight");
        let s = &mut *self.state;
        let input = Input::Host(&f.encoded);
        let outcome = match f.stage {
            Stage::Ended(Err(e)) => {
                self.spare.push(f.encoded);
                return Err(e);
            }
            Stage::Ended(Ok(())) => Ok(()),
            // A batch poisoned by the failure of one before it is not acknowledged, whatever
            // the GPU did of it.
            Stage::A => s.usable().and_then(|()| s.end(f.slot, input)),
        };
        let n = f.batch.len();
        let mut result = BatchResult::new(n, f.batch.value_bytes());
        self.spare.push(f.encoded);
        if n == 0 {
            // Like an empty call: nothing ran, nothing is counted.
            return outcome.map(|()| result);
        }
        let stored =
            outcome.and_then(|()| s.store(f.slot, &f.batch, Part::Ops { start: 0, end: n }, &mut result));
        s.acknowledge(n, stored).map(|()| result)
    }
}

/// The results, in the order the batches were submitted: [`Iterator::next`] returns the result of
/// the oldest batch whose result was not taken yet, once it is acknowledged or failed, and
/// `None` when there is none (a later `submit` gives it more).
impl Iterator for Pipeline<'_> {
    type Item = Result<BatchResult>;

    fn next(&mut self) -> Option<Result<BatchResult>> {
        self.done.pop_front().or_else(|| (!self.flights.is_empty()).then(|| self.complete()))
    }
}

impl Drop for Pipeline<'_> {
    fn drop(&mut self) {
        while !self.flights.is_empty() {
            // A failure is counted (or poisons the index) as it would be had it been taken.
            let _ = self.complete();
        }
    }
}
