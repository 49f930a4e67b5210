//! Executors behind one interface: the GPU engine (`gpu::engine`) and the CPU model engine
//! (`cpu`). `index.rs` drives them through the two-phase protocol, persisting in between.

use std::fmt;

use host_pm::Pool;

use crate::batch::Encoded;
use crate::cache::{CacheStatus, Snapshot};
use crate::device_batch::DeviceBatch;
use crate::error::Result;
use crate::model::{Bitmap, Control};
use crate::profile::Profile;
/// Largest number of operations one engine batch holds (an engine may hold fewer: see
/// [`Engine::max_batch`]). Longer calls run as several engine batches.
pub const MAX_BATCH: usize = 1 << 22;

/// Where a batch's operations come from.
#[derive(Clone, Copy)]
pub(crate) enum Input<'a> {
    /// Host slices, encoded.
    Host(&'a Encoded),
    /// Device buffers of a GPU-resident caller; results stay on the device.
    Device(&'a DeviceBatch<'a>),
}

impl Input<'_> {
    /// Operations in the batch.
    pub(crate) fn len(&self) -> usize {
        match self {
            Input::Host(e) => e.len(),
            Input::Device(d) => d.len as usize,
        }
    }

    /// Whether the batch is empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether every operation is a read: checked on the host for host batches, declared by
    /// the caller for device batches (the kernel refuses anything else in them).
    pub(crate) fn read_only(&self) -> bool {
        match self {
            Input::Host(e) => e.read_only(),
            Input::Device(d) => d.reads_only,
        }
    }
}

/// A step of the two-phase protocol for one batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Allocation and phase A. For reads-only batches the results are ready afterwards.
    A,
    /// Undoes phase A (no slot or no cell for some operation); releases the batch's cells.
    Rollback,
    /// Phase B (when `publish`) and the release of the cells the batch replaced or did not
    /// use (reused by a later batch only, whose phase A is submitted after this persist).
    B { publish: bool },
}

/// The cache lines a phase wrote.
#[derive(Debug)]
pub(crate) enum Written {
    /// These pool lines (unsorted, may repeat).
    Lines(Vec<u64>),
    /// More than the list could hold: persist every region.
    Overflow,
    /// The pool's persist mode needs no line list (tmpfs, anonymous): only a fence.
    NotTracked,
}

/// What a phase did.
#[derive(Debug)]
pub(crate) struct Report {
    /// The control block's counters after the phase.
    pub control: Control,
    /// What to persist.
    pub written: Written,
}

impl Report {
    /// A phase that did nothing: no counts, nothing to persist.
    pub(crate) fn nothing() -> Report {
        Report { control: Control::default(), written: Written::Lines(vec![]) }
    }
}

/// How the table is executed, as reported by `stats` and the CLI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The GPU reads and writes the pool mapping in place.
    ZeroCopy,
    /// The GPU works on a device-memory copy; dirty lines are written back at persist points.
    Staged {
        /// Why zero-copy was not used.
        reason: String,
    },
    /// The GPU works on a device-memory copy and nothing is written back (benchmarks only).
    Volatile,
    /// No GPU: the CPU model executes the batches.
    Cpu {
        /// Why no GPU was used.
        reason: String,
    },
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::ZeroCopy => write!(f, "zero-copy (the GPU reads and writes the pool in place)"),
            Mode::Staged { reason } => {
                write!(f, "staged (device copy, written back at persist points: {reason})")
            }
            Mode::Volatile => {
                write!(f, "volatile (device memory only; nothing persists: a benchmark upper bound)")
            }
            Mode::Cpu { reason } => write!(f, "CPU fallback ({reason})"),
        }
    }
}

impl From<gphash_gpu::Residence> for Mode {
    fn from(r: gphash_gpu::Residence) -> Self {
        match r {
            gphash_gpu::Residence::ZeroCopy => Mode::ZeroCopy,
            gphash_gpu::Residence::Staged { reason } => Mode::Staged { reason },
            gphash_gpu::Residence::Volatile => Mode::Volatile,
        }
    }
}

/// One executor of the table's kernels.
pub(crate) trait Engine: Send {
    /// How it executes.
    fn mode(&self) -> Mode;

    /// The largest batch it takes (at most [`MAX_BATCH`]); phase A refuses larger ones with
    /// `BatchTooLarge`.
    fn max_batch(&self) -> usize;

    /// Batches it holds at once, each in its own slot (`0..slots()`): while the batch of one
    /// slot runs, the host can start another slot's batch or take its results.
    fn slots(&self) -> usize;

    /// Starts `phase` of `batch` in `slot` (phase A fills the slot; a rollback or phase B
    /// follow phase A of the same batch, taken by `finish`). It may run before `finish` is
    /// called, or only then; `finish` waits for it.
    fn start(&mut self, pool: &mut Pool, slot: usize, phase: Phase, batch: Input) -> Result<()>;

    /// Waits for the phase last started in `slot` and reports it. After phase A of a
    /// reads-only batch, or phase B, [`Engine::results`] holds the batch's results.
    fn finish(&mut self, pool: &mut Pool, slot: usize) -> Result<Report>;

    /// The statuses of the batch in `slot` and the value words of its reads (`value_words`
    /// per operation, or empty when the batch has no read).
    fn results(&self, slot: usize) -> (&[u32], &[u32]);

    /// Value cells in use (for stats).
    fn cells_used(&mut self, pool: &mut Pool) -> Result<u64>;

    /// The value-cell allocator as it stands (to hand over to a new engine).
    fn bitmap(&mut self, pool: &mut Pool) -> Result<Bitmap>;

    /// Reads the allocator the last clean close saved, if the engine was given it unread: the
    /// index calls it before the pool's first write, which frees that region (`mark_dirty`).
    fn load_allocator(&mut self, _pool: &mut Pool) -> Result<()> {
        Ok(())
    }

    /// Runs a whole loading phase of the bucket cache now (no-op without a cache).
    fn load_cache(&mut self) -> Result<()> {
        Ok(())
    }

    /// The configuration the engine's kernels were compiled for, if it has kernels.
    #[cfg(test)]
    fn kernel_config(&self) -> Option<&crate::gpu::shader::KernelConfig> {
        None
    }

    /// The bucket cache: whether there is one, and what it did.
    fn cache_status(&self) -> CacheStatus;

    /// What the bucket cache holds (empty without a cache).
    fn cache_snapshot(&mut self) -> Result<Snapshot> {
        Ok(Snapshot::default())
    }

    /// Its stages' time since the last call (the engine stages of [`Profile`]; nothing for an
    /// engine that does not break its time down).
    fn take_profile(&mut self) -> Profile {
        Profile::default()
    }

    /// Drops the engine but for its imports of the pool's regions, which it hands on (none
    /// where it imported nothing): a growth that keeps the pool in place builds from them, and
    /// releases them with the old regions ([`Pool::give_back_after`]).
    fn into_imports(self: Box<Self>) -> Option<gphash_gpu::resources::ImportedRegions> {
        None
    }
}
