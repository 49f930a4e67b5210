//! Executors behind one interface: the GPU engine (`gpu::engine`) and the CPU model engine
//! (`cpu`). `index.rs` drives them through the two-phase protocol, persisting in between.

use std::fmt;

use host_pm::Pool;

use crate::cache::{CacheStatus, Snapshot};
use crate::error::Result;
use crate::gpu::engine::DeviceBatch;
use crate::model::{Bitmap, Control};
use crate::protocol::OpKind;

/// Largest number of operations one engine batch holds (an engine may hold fewer: see
/// [`Engine::max_batch`]). Longer calls run as several engine batches.
pub const MAX_BATCH: usize = 1 << 22;

/// A batch in kernel form: operation codes, key words, value words (cell-padded).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Encoded {
    /// One [`OpKind`] code per operation.
    pub kinds: Vec<u32>,
    /// `key_words` words per operation.
    pub keys: Vec<u32>,
    /// `cell_words` words per operation (zero for operations without a value); empty when no
    /// operation carries a value.
    pub values: Vec<u32>,
}

impl Encoded {
    /// Operations in the batch.
    pub fn len(&self) -> usize {
        self.kinds.len()
    }

    /// Whether the batch has no operations.
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// Whether every operation is a read: no phase B, nothing to persist.
    pub fn read_only(&self) -> bool {
        self.kinds.iter().all(|&k| k == OpKind::Get as u32)
    }

    /// Whether some operation is a read (whose value must be read back).
    pub fn has_reads(&self) -> bool {
        self.kinds.contains(&(OpKind::Get as u32))
    }
}

/// Where a batch's operations come from.
#[derive(Clone, Copy)]
pub enum Input<'a> {
    /// Host slices, encoded.
    Host(&'a Encoded),
    /// Device buffers of a GPU-resident caller; results stay on the device.
    Device(&'a DeviceBatch<'a>),
}

impl Input<'_> {
    /// Operations in the batch.
    pub fn len(&self) -> usize {
        match self {
            Input::Host(e) => e.len(),
            Input::Device(d) => d.len as usize,
        }
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether every operation is known to be a read (device batches are never assumed so).
    pub fn read_only(&self) -> bool {
        matches!(self, Input::Host(e) if e.read_only())
    }
}

/// The cache lines a phase wrote.
#[derive(Debug)]
pub enum Written {
    /// These pool lines (unsorted, may repeat).
    Lines(Vec<u64>),
    /// More than the list could hold: persist every region.
    Overflow,
    /// The pool's persist mode needs no line list (tmpfs, anonymous): only a fence.
    NotTracked,
}

/// What a phase did.
#[derive(Debug)]
pub struct Report {
    /// The control block's counters after the phase.
    pub control: Control,
    /// What to persist.
    pub written: Written,
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

/// One executor of the table's kernels.
pub trait Engine: Send {
    /// How it executes.
    fn mode(&self) -> Mode;

    /// The largest batch it takes (at most [`MAX_BATCH`]); `phase_a` refuses larger ones with
    /// `BatchTooLarge`.
    fn max_batch(&self) -> usize;

    /// Allocation and phase A. For reads-only batches the results are ready afterwards.
    fn phase_a(&mut self, pool: &mut Pool, batch: Input) -> Result<Report>;

    /// Undoes phase A of the current batch (no slot or no cell for some operation).
    fn rollback(&mut self, pool: &mut Pool, batch: Input) -> Result<Report>;

    /// Phase B (when `publish`) and the release of cells.
    fn phase_b(&mut self, pool: &mut Pool, batch: Input, publish: bool) -> Result<Report>;

    /// The current batch's statuses and the value words of its reads (`cell_words` per
    /// operation, or empty when the batch has no read).
    fn results(&self) -> (&[u32], &[u32]);

    /// Value cells in use (for stats).
    fn cells_used(&mut self) -> Result<u64>;

    /// The value-cell allocator as it stands (to hand over to a new engine).
    fn bitmap(&mut self) -> Result<Bitmap>;

    /// Runs a whole loading phase of the bucket cache now (no-op without a cache).
    fn load_cache(&mut self) -> Result<()> {
        Ok(())
    }

    /// The bucket cache: whether there is one, and what it did.
    fn cache_status(&self) -> CacheStatus;

    /// What the bucket cache holds (empty without a cache).
    fn cache_snapshot(&mut self) -> Result<Snapshot> {
        Ok(Snapshot::default())
    }
}
