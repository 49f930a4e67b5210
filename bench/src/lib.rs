//! Benchmarks: the basic figures (`basic`), and the workload runner that drives gphash and the
//! baselines through one interface (`system`).

pub mod basic;
pub mod bktcache;
pub mod ceiling;
pub mod plots;
pub mod runner;
pub mod system;
pub mod systems;
pub mod traces;
pub mod ycsb;

pub use basic::{
    Fill, Filled, LoadSearch, PersistCost, PersistFigures, ResizeFigures, ResizeRecovery, Row, key, key_bytes,
};
