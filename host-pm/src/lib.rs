//! The persistent-memory pool of gphash.
//!
//! One file (or a devdax device, or anonymous memory) holds everything that must survive a
//! crash: a header area with two A/B copies of the [`Header`], then regions (the hash table,
//! the value heap) addressed by byte offsets inside the pool, never by pointers.
//!
//! This crate knows nothing of GPUs or hash tables: it maps the pool, validates the header
//! against the file before anyone touches the regions, writes new headers crash-atomically,
//! and makes byte ranges or 64-byte lines durable with the primitive of the backend
//! ([`PersistMode`]).
//!
//! ```no_run
//! use host_pm::{CreateOptions, Header, Pool, ResizeRecord, TableConfig, layout_regions};
//! # fn main() -> host_pm::Result<()> {
//! let (table, heap, total) = layout_regions(1 << 20, 1 << 20);
//! let header = Header {
//!     version: host_pm::FORMAT_VERSION,
//!     table: TableConfig { key_bytes: 8, value_bytes: 128, levels: 2, hashes: 2, slots: 8,
//!                          top_level: 10, seed: 42 },
//!     table_region: table,
//!     heap_region: heap,
//!     heap_cells: 8192,
//!     resize: ResizeRecord::default(),
//!     clean_shutdown: false,
//!     sequence: 0,
//!     user: [0; 8],
//!     closed: host_pm::CloseRecord::default(),
//! };
//! let path = std::path::Path::new("/dev/shm/example.pool");
//! let mut pool = Pool::create(Some(path), total, &header, &CreateOptions::default())?;
//! pool.region_mut(table)[0] = 1;
//! pool.persist_range(table.offset, 1)?;
//! pool.close()?;
//! let pool = Pool::open(path)?;
//! assert!(pool.header().clean_shutdown);
//! # Ok(()) }
//! ```
//!
//! Linux only: it relies on `flock`, `fstatfs`, `posix_fallocate` and sysfs.

mod backend;
mod header;
mod map;
mod persist;
mod pool;

use std::path::PathBuf;

pub use backend::Backend;
pub use header::{
    CloseRecord, HEADER_COPY_BYTES, Header, MAGIC, Region, ResizeRecord, TableConfig, decode_header,
    encode_header, layout_regions, validate_header,
};
pub use persist::PersistMode;
pub use pool::{CreateOptions, Mapping, Observer, Pool};

/// Persistence granularity: one x86 cache line. Line index `i` covers pool bytes `64 i .. 64 i + 64`.
pub const LINE_BYTES: u64 = 64;
/// Every region offset and size is a multiple of this.
pub const REGION_ALIGN: u64 = 64 * 1024;
/// Bytes reserved at the start of the pool for the header copies; regions start at or after it.
pub const HEADER_AREA: u64 = 64 * 1024;
/// The on-media format version this build writes. Version 2: each value cell ends with a
/// checksum word (version 1 pools are refused as unsupported). Version 3: the header's close
/// record ([`CloseRecord`]). Version 4: the table crate gives meaning to a second user word
/// (gphash: where hash locations hash, `docs/protocol.md`, "Locations apart"), which builds that
/// read version 3 would ignore and so misread such a pool; they refuse version 4 instead.
/// Version 5: the same for a fifth user word (gphash: the heap's arenas, `docs/design.md` §5).
pub const FORMAT_VERSION: u32 = 5;
/// The versions this build reads. A version 2 header reads with an empty close record; every
/// header write writes [`FORMAT_VERSION`].
pub const READABLE_VERSIONS: std::ops::RangeInclusive<u32> = 2..=FORMAT_VERSION;

/// Everything that can go wrong with a pool.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// A system call on the pool file failed.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        /// The pool file (or device, or directory) concerned.
        path: PathBuf,
        /// The operation that failed (`"open"`, `"create"`, `"mmap"`, `"msync"`, ...).
        op: &'static str,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// Neither header copy starts with [`MAGIC`]. `path` is empty when no file is involved
    /// ([`decode_header`] on raw bytes).
    #[error("not a gphash pool (bad magic in both header copies): {}", path.display())]
    NotAPool {
        /// The file that was opened.
        path: PathBuf,
    },
    /// An intact header copy carries a format version this build does not know.
    #[error("pool format version {found} is not supported (this build reads version {supported})")]
    UnsupportedVersion {
        /// Version found in the header.
        found: u32,
        /// [`FORMAT_VERSION`].
        supported: u32,
    },
    /// A checksum, offset, range or size check failed; `what` names the field and the values.
    #[error("corrupt pool: {what}")]
    Corrupt {
        /// Which check failed, with the offending values.
        what: String,
    },
    /// The file is shorter than the header says (or than the header area).
    #[error("pool file is truncated: it has {file_bytes} bytes, {needed} are needed")]
    Truncated {
        /// Size of the file (or device).
        file_bytes: u64,
        /// Bytes the header area or the header's regions need.
        needed: u64,
    },
    /// Another open pool (in this or another process) holds the file's lock.
    #[error("{} is locked: another process (or this one) has the pool open", path.display())]
    Locked {
        /// The pool file.
        path: PathBuf,
    },
    /// The pool would grow beyond its limit (`max_bytes`, or the size of a devdax device).
    #[error("out of space: the pool needs {needed} bytes, its limit is {limit}")]
    OutOfSpace {
        /// Bytes asked for.
        needed: u64,
        /// The limit.
        limit: u64,
    },
    /// The caller passed something unusable (an invalid header, a range outside the pool, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

/// Result of every fallible call of this crate.
pub type Result<T> = std::result::Result<T, PoolError>;
