//! gphash: a persistent, lock-free hash index that GPUs drive through Vulkan compute shaders.
//!
//! ```no_run
//! use gphash::{Config, GpHash, Options, Status};
//!
//! let index = GpHash::create(Some("/dev/shm/example.pool".as_ref()), &Config::default(), &Options::default())?;
//! let keys: Vec<u8> = [1u64, 2, 3].iter().flat_map(|k| k.to_le_bytes()).collect();
//! let values: Vec<u8> = [10u64, 20, 30].iter().flat_map(|v| v.to_le_bytes()).collect();
//! assert_eq!(index.insert(&keys, &values)?, vec![Status::Ok; 3]);
//! let found = index.get(&keys)?;
//! assert_eq!(found.value(1), Some(&20u64.to_le_bytes()[..]));
//! println!("{}", index.stats());
//! index.close()?;
//! # Ok::<(), gphash::Error>(())
//! ```
//!
//! [`TypedIndex`] is the same index with typed keys and values.
//!
//! The index is this crate; the GPU plumbing under it (device, host-memory import, storage
//! windows, the WGSL stitcher) is `gphash-gpu`, the pool file is `host-pm`. What a user of the
//! index meets is re-exported here, among it the pool's error, backend and persist mode.
//!
//! Features: `bench` adds the hooks of the benchmarks (`Placement::Volatile`,
//! `Options::persist_mode`); `testing` (which implies `bench`) adds the internals gphash's own
//! tests use (`Options::observer`, the `testing` module). Neither is a stable API.

mod batch;
mod bulk;
// The `testing` module re-exports the cache's CPU twins: without the feature they are unused.
#[cfg_attr(not(feature = "testing"), allow(dead_code, unreachable_pub))]
mod cache;
mod cpu;
mod device_batch;
mod engine;
mod error;
mod gpu;
pub mod hash;
mod heap;
mod index;
mod inspect;
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
mod layout;
// Items that the `testing` module re-exports (or that its model's methods take: `OpState`) are
// `pub`; without the feature they are unreachable.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
mod model;
mod placement;
mod profile;
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
mod protocol;
mod recovery;
mod reopen;
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
mod resize;
mod sharded;
mod table_stats;
mod typed;

pub use batch::{Batch, BatchResult, Encoded, PartialResult};
pub use cache::{CacheOptions, CacheStats, CacheStatus, Policy, Snapshot as CacheSnapshot};
pub use device_batch::DeviceBatch;
pub use engine::Mode;
pub use error::{Error, Result};
pub use gphash_gpu::{DeviceInfo, Gpu};
pub use gpu::engine::{GpuOptions, Placement};
pub use host_pm::{Backend, PersistMode, Pool, PoolError};
pub use index::{
    Activity, Config, DevicePipeline, Executor, GpHash, GpuStart, GpuStartMode, MAX_BATCH, Options, Pipeline,
    Stats,
};
pub use inspect::{Inspection, inspect};
pub use layout::{Candidate, Geometry, Layout, MAX_CELLS, TARGET_LOAD};
pub use profile::{KernelTimes, Profile};
pub use protocol::{OpKind, Status};
pub use recovery::{CheckReport, Recovery, Violation, check};
pub use sharded::{GROW_AHEAD_LOAD, MAX_SHARDS, ShardedGpHash};
pub use table_stats::TableStats;
pub use typed::{TypedBatch, TypedIndex, TypedResult};

/// Internals for gphash's own tests (feature `testing`): the CPU twins of the kernels and of the
/// bucket cache, and the steps of a resize (for crash injection). Not a stable API.
#[cfg(feature = "testing")]
pub mod testing {
    /// The CPU model of the table, the oracle of the kernel tests.
    pub mod model {
        pub use crate::model::Model;
    }

    /// The bucket cache's CPU twins and checks.
    pub mod cache {
        pub use crate::cache::{counted, expected_entry, touches, verify};
    }

    /// The table's slot encoding, to read and damage pools in tests.
    pub mod layout {
        pub use crate::layout::{PUBLISHED, set_slots_per_arena};
    }

    /// The steps of growing a table, to interrupt one between them.
    pub mod resize {
        pub use crate::resize::{begin, plan};
    }
}
