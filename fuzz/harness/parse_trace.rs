//! The trace parser's harness, run by the cargo-fuzz target `parse_trace` and, over a seeded
//! corpus and its mutations, by `tests/trace_fuzz.rs`. Any bytes give a batch or a trace error
//! naming a line, never a panic; an error stays short whatever the input; a batch written back
//! with `trace::op_line` parses to the same batch.

use std::path::Path;

use gphash::Error;
use gphash_cli::trace;

/// The key width and value size an input's first byte picks (its low four bits).
pub(crate) fn widths(selector: u8) -> (usize, usize) {
    ([8, 4, 16, 32][usize::from(selector & 3)], [2, 8, 1, 13][usize::from(selector >> 2 & 3)])
}

/// Checks one input: its first byte picks the widths, the rest is the trace. Returns whether
/// the trace parsed.
pub(crate) fn check(data: &[u8]) -> bool {
    let Some((&selector, text)) = data.split_first() else {
        return false;
    };
    let (key_bytes, value_bytes) = widths(selector);
    match trace::parse_bytes(Path::new("fuzz.trace"), text, key_bytes, value_bytes) {
        Ok(batch) => {
            let written: String = (0..batch.len())
                .map(|i| {
                    let (kind, key, value) = batch.op(i);
                    trace::op_line(kind, key, value) + "\n"
                })
                .collect();
            let back =
                trace::parse_bytes(Path::new("written.trace"), written.as_bytes(), key_bytes, value_bytes)
                    .unwrap_or_else(|e| panic!("written back, the trace does not parse: {e}"));
            assert_eq!(back, batch, "written back, the trace parses to another batch");
            true
        }
        // A token is quoted to at most 40 characters (each escaped to at most 10).
        Err(Error::Trace { line, why, .. }) => {
            assert!(line >= 1, "lines count from 1");
            let start: String = why.chars().take(200).collect();
            assert!(why.len() <= 600, "an error of {} bytes: {start}...", why.len());
            false
        }
        Err(other) => panic!("not a trace error: {other}"),
    }
}
