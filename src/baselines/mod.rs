//! The baselines gphash is compared with (DESIGN §9), each a [`crate::bench::system::System`].

pub mod cpu;
pub mod slab;
