//! gphash: a persistent, lock-free hash index that GPUs drive through Vulkan compute shaders.
//!
//! ```no_run
//! use gphash::{Config, GpHash, Options, Status};
//!
//! let mut index = GpHash::create(Some("/dev/shm/example.pool".as_ref()), &Config::default(), &Options::default())?;
//! let keys: Vec<u8> = [1u64, 2, 3].iter().flat_map(|k| k.to_le_bytes()).collect();
//! let values: Vec<u8> = [10u64, 20, 30].iter().flat_map(|v| v.to_le_bytes()).collect();
//! assert_eq!(index.insert(&keys, &values)?, vec![Status::Ok; 3]);
//! let found = index.get(&keys)?;
//! assert_eq!(found.value(1), Some(&20u64.to_le_bytes()[..]));
//! println!("{}", index.stats());
//! index.close()?;
//! # Ok::<(), gphash::Error>(())
//! ```
#![warn(missing_docs)]

pub mod batch;
pub mod cache;
pub mod cpu;
mod device_batch;
pub mod engine;
pub mod error;
pub mod gpu;
pub mod hash;
pub mod index;
pub mod layout;
pub mod model;
pub mod protocol;
pub mod recovery;
pub mod resize;

pub use batch::{Batch, BatchResult, Encoded};
pub use cache::{CacheOptions, CacheStats, CacheStatus, Policy};
pub use device_batch::DeviceBatch;
pub use engine::Mode;
pub use error::{Error, Result};
pub use gphash_gpu::Gpu;
pub use gpu::engine::{GpuOptions, Placement};
pub use index::{Config, Executor, GpHash, Options, Stats};
pub use layout::Layout;
pub use protocol::{OpKind, Status};
