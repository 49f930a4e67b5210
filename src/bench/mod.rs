//! Benchmarks: the basic figures (`basic`), and the workload runner that drives gphash and the
//! baselines through one interface (`system`).

pub mod basic;
pub mod system;

pub use basic::{
    Fill, Filled, LoadSearch, PersistCost, PersistFigures, ResizeFigures, ResizeRecovery, Row, key,
};
