//! Workload trace files in the index-microbench style: one operation a line,
//!
//! ```text
//! INSERT <key>
//! READ <key>
//! UPDATE <key>
//! DELETE <key>
//! SCAN <key> <n>      (refused: a hash index cannot scan)
//! ```
//!
//! usually as a load file (the inserts of YCSB's load phase) and a run file (its transactions).
//! A key is a decimal u64, YCSB's hashed integer, optionally with the `user` prefix that YCSB
//! prints (`user6284781860667377211`). Blank lines and lines starting with `#` are skipped;
//! operation names are case-insensitive.
//!
//! [`read_trace`] gives [`Op`]s whose `id` is the key integer itself; [`trace_key`] maps it to
//! key bytes (little-endian for 8-byte keys) and [`trace_batch`] builds a [`Batch`].
//! [`write_trace`] writes a generator's operations in this format.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;

use crate::ycsb::{Op, batch_with};
use gphash::Batch;
use gphash::OpKind;
use gphash::{Error, Result};

/// Reads a whole trace file. The first malformed line, or a `SCAN`, is an [`Error::Trace`]
/// naming the file and the line.
pub fn read_trace(path: impl AsRef<Path>) -> Result<Vec<Op>> {
    let path = path.as_ref();
    let file = File::open(path)
        .map_err(|source| Error::Io { what: format!("open trace {}", path.display()), source })?;
    parse_trace(path, BufReader::new(file))
}

/// Parses a trace from `reader`; `path` names it in errors.
pub fn parse_trace(path: &Path, mut reader: impl BufRead) -> Result<Vec<Op>> {
    let mut ops = vec![];
    let mut buf = Vec::new();
    let mut number = 0;
    loop {
        buf.clear();
        let read = reader
            .read_until(b'\n', &mut buf)
            .map_err(|source| Error::Io { what: format!("read trace {}", path.display()), source })?;
        if read == 0 {
            return Ok(ops);
        }
        number += 1;
        let err = |why: String| Error::Trace { path: path.to_path_buf(), line: number, why };
        let line = std::str::from_utf8(&buf).map_err(|_| err("not UTF-8".into()))?.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let kind = match fields[0].to_ascii_uppercase().as_str() {
            "INSERT" => OpKind::Insert,
            "READ" => OpKind::Get,
            "UPDATE" => OpKind::Update,
            "DELETE" => OpKind::Delete,
            "SCAN" => {
                return Err(err("SCAN: a hash index cannot scan (YCSB workload E is not supported)".into()));
            }
            other => {
                return Err(err(format!(
                    "unknown operation {other:?} (expected INSERT, READ, UPDATE, DELETE)"
                )));
            }
        };
        let [_, key] = fields[..] else {
            return Err(err(format!(
                "{} takes exactly one key, found {} field(s)",
                fields[0],
                fields.len() - 1
            )));
        };
        let digits = key.strip_prefix("user").unwrap_or(key);
        let id =
            digits.parse::<u64>().ok().filter(|_| digits.bytes().all(|b| b.is_ascii_digit())).ok_or_else(
                || err(format!("key {key:?} is not a decimal u64 (optionally prefixed by \"user\")")),
            )?;
        ops.push(Op { kind, id });
    }
}

/// Writes `ops` as a trace file (keys without the `user` prefix). Upserts have no
/// index-microbench form and are an [`Error::Trace`] naming the line they would take.
pub fn write_trace(path: impl AsRef<Path>, ops: &[Op]) -> Result<()> {
    let path = path.as_ref();
    let io = |source| Error::Io { what: format!("write trace {}", path.display()), source };
    let mut out = BufWriter::new(File::create(path).map_err(io)?);
    for (i, op) in ops.iter().enumerate() {
        let name = match op.kind {
            OpKind::Insert => "INSERT",
            OpKind::Get => "READ",
            OpKind::Update => "UPDATE",
            OpKind::Delete => "DELETE",
            OpKind::Upsert => {
                return Err(Error::Trace {
                    path: path.to_path_buf(),
                    line: i + 1,
                    why: "an upsert has no index-microbench form".into(),
                });
            }
        };
        writeln!(out, "{name} {}", op.id).map_err(io)?;
    }
    out.flush().map_err(io)
}

/// The key bytes of trace key `id` (a trace holds YCSB's hashed integers already):
/// [`crate::key_bytes`] of it.
pub fn trace_key(id: u64, key_bytes: usize) -> Vec<u8> {
    crate::key_bytes(id, key_bytes)
}

/// A batch of trace operations with keys [`trace_key`] and, for writes, the values
/// [`crate::ycsb::value_of`]`(id, seed, value_bytes)`.
pub fn trace_batch(ops: &[Op], key_bytes: usize, value_bytes: usize, seed: u64) -> Batch {
    batch_with(ops, key_bytes, value_bytes, seed, trace_key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ycsb::{Generator, Workload, fnv64, value_of};

    fn parse(text: &str) -> Result<Vec<Op>> {
        parse_trace(Path::new("t.trace"), text.as_bytes())
    }

    fn trace_error_line(r: Result<Vec<Op>>) -> (usize, String) {
        match r {
            Err(Error::Trace { line, why, .. }) => (line, why),
            other => panic!("expected a trace error, got {other:?}"),
        }
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let mut ops = vec![];
        for w in [Workload::Load, Workload::A, Workload::D, Workload::F, Workload::Delete] {
            let mut g = Generator::new(w, None, 1000, 1000, 9).unwrap();
            while !g.done() {
                ops.extend(g.next_batch(100));
            }
        }
        let path = dir.path().join("run.trace");
        write_trace(&path, &ops).unwrap();
        assert_eq!(read_trace(&path).unwrap(), ops);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().next(), Some("INSERT 0"));
        // Upserts cannot be written.
        let upsert = [Op { kind: OpKind::Get, id: 1 }, Op { kind: OpKind::Upsert, id: 1 }];
        assert_eq!(trace_error_line(write_trace(&path, &upsert).map(|()| vec![])).0, 2);
        // A missing file is an I/O error.
        assert!(matches!(read_trace(dir.path().join("absent")), Err(Error::Io { .. })));
    }

    #[test]
    fn ycsb_keys_and_formatting() {
        let ops = parse(
            "# load\nINSERT user6284781860667377211\n\nREAD 123\n  update   user123  \r\nDELETE 0\nread 18446744073709551615\n",
        )
        .unwrap();
        assert_eq!(
            ops,
            [
                Op { kind: OpKind::Insert, id: fnv64(0) },
                Op { kind: OpKind::Get, id: 123 },
                Op { kind: OpKind::Update, id: 123 },
                Op { kind: OpKind::Delete, id: 0 },
                Op { kind: OpKind::Get, id: u64::MAX },
            ]
        );
        assert!(parse("").unwrap().is_empty());
    }

    #[test]
    fn scan_is_refused_with_its_line() {
        let (line, why) = trace_error_line(parse("INSERT 1\nREAD 1\nSCAN user1 100\n"));
        assert_eq!(line, 3);
        assert!(why.contains("SCAN") && why.contains("cannot scan"), "{why}");
        let shown = parse("\n\nSCAN 5 10").unwrap_err().to_string();
        assert!(shown.starts_with("t.trace:3:"), "{shown}");
    }

    #[test]
    fn malformed_lines_name_their_line() {
        for (text, line) in [
            ("INSERT 1\nFOO 2\n", 2),
            ("READ\n", 1),
            ("READ 1\nREAD 1 2\n", 2),
            ("READ 1\n\nREAD user\n", 3),
            ("READ -1\n", 1),
            ("READ +1\n", 1),
            ("READ 0x10\n", 1),
            ("READ 18446744073709551616\n", 1),
            ("READ userx12\n", 1),
        ] {
            assert_eq!(trace_error_line(parse(text)).0, line, "{text:?}");
        }
        let bytes: &[u8] = b"READ 1\nREAD \xff\n";
        assert_eq!(trace_error_line(parse_trace(Path::new("t"), bytes)).0, 2);
    }

    #[test]
    fn keys_and_batches() {
        assert_eq!(trace_key(0x0102, 8), vec![2, 1, 0, 0, 0, 0, 0, 0]);
        // A trace holds hashed keys already: record 7's key is the trace key fnvhash64(7).
        assert_eq!(trace_key(crate::ycsb::fnv64(7), 32), crate::key(7, 32));
        assert_eq!(&trace_key(7, 32)[..8], &7u64.to_le_bytes());
        let ops = [Op { kind: OpKind::Insert, id: 9 }, Op { kind: OpKind::Get, id: 9 }];
        let b = trace_batch(&ops, 8, 16, 1);
        assert_eq!(b.len(), 2);
        assert_eq!(b.op(0).1, 9u64.to_le_bytes());
        assert_eq!(b.op(0).2, value_of(9, 1, 16));
        assert_eq!(b.op(1).0, OpKind::Get);
    }
}
