//! Parsing a trace from arbitrary bytes gives a batch or a trace error, never a panic, and a
//! parsed batch written back parses to the same batch (see `../harness/parse_trace.rs`).
//!
//! Run: `cargo +nightly fuzz run parse_trace` in this directory. `tests/trace_fuzz.rs` runs the
//! same harness over a seeded corpus and its mutations.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../harness/parse_trace.rs"]
mod harness;

fuzz_target!(|data: &[u8]| {
    harness::check(data);
});
