//! gphash's benchmarks: the basic figures (`basic`), the bucket cache's (`bktcache`), the
//! memory ceilings (`ceiling`), how kernels reach a large region (`reach`), the bare round trip through Vulkan itself (`vulkan_trip`), where a batch's time goes (`profile`), and the workload runner (`runner`: YCSB and micro workloads,
//! `ycsb`, and trace files, `traces`) that drives gphash and the baselines through one interface
//! (`systems`).

pub mod answers;
pub mod basic;
pub mod bktcache;
pub mod ceiling;
pub mod plots;
pub mod profile;
pub mod reach;
pub mod runner;
pub mod scoreboard;
pub mod sharded;
pub mod systems;
pub mod traces;
pub mod vulkan_trip;
pub mod ycsb;

pub use basic::{
    Fill, Filled, LoadSearch, PersistCost, PersistFigures, ResizeFigures, ResizeRecovery, Row, key,
    key_bytes, spread,
};
