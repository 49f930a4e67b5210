//! The library part of the `gphash` command line: the trace format of `gphash replay`, here so
//! that fuzz targets and tests can use it.

pub mod trace;
