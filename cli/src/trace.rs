//! Trace files for `gphash replay`: one operation a line.
//!
//! ```text
//! I key value   insert if absent   -> OK | EXISTS
//! P key value   upsert             -> OK
//! U key value   update             -> OK | NOTFOUND
//! R key         read               -> the value in lowercase hex | NOTFOUND
//! D key         delete             -> OK | NOTFOUND
//! # comment
//! ```
//!
//! A key is hex of exactly `key_bytes` bytes (`2 * key_bytes` digits, `0x` optional), or, for
//! 8-byte keys, a decimal u64 stored little-endian. A value is hex of exactly `value_bytes`.

use std::fmt::Write;
use std::path::Path;

use gphash::{Batch, BatchResult, Error, OpKind, Result, Status};

/// Parses a whole trace; the first malformed line is an error naming it, before anything runs.
pub fn parse(path: &Path, text: &str, key_bytes: usize, value_bytes: usize) -> Result<Batch> {
    let mut batch = Batch::new(key_bytes, value_bytes);
    for (i, line) in text.lines().enumerate() {
        let err = |why: String| Error::Trace { path: path.to_path_buf(), line: i + 1, why };
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (kind, takes_value) = match fields[0] {
            "I" => (OpKind::Insert, true),
            "P" => (OpKind::Upsert, true),
            "U" => (OpKind::Update, true),
            "R" => (OpKind::Get, false),
            "D" => (OpKind::Delete, false),
            other => {
                return Err(err(format!("unknown operation {other:?} (expected I, P, U, R or D)")));
            }
        };
        let want = 2 + takes_value as usize;
        if fields.len() != want {
            return Err(err(format!(
                "{} takes {} field(s) after it, found {}",
                fields[0],
                want - 1,
                fields.len() - 1
            )));
        }
        let key =
            parse_key(fields[1], key_bytes).map_err(|why| err(format!("key {:?}: {why}", fields[1])))?;
        let value = match takes_value {
            true => Some(
                hex(fields[2], value_bytes).map_err(|why| err(format!("value {:?}: {why}", fields[2])))?,
            ),
            false => None,
        };
        batch.push(kind, &key, value.as_deref()).map_err(|e| err(e.to_string()))?;
    }
    Ok(batch)
}

fn parse_key(token: &str, key_bytes: usize) -> std::result::Result<Vec<u8>, String> {
    let digits = token.strip_prefix("0x").unwrap_or(token);
    if digits.len() == 2 * key_bytes || token.starts_with("0x") {
        return hex(token, key_bytes);
    }
    if key_bytes != 8 {
        return Err(format!("expected {} hex digits for a {key_bytes}-byte key", 2 * key_bytes));
    }
    token
        .parse::<u64>()
        .map(|k| k.to_le_bytes().to_vec())
        .map_err(|_| "expected a decimal u64 or 16 hex digits".to_string())
}

fn hex(token: &str, bytes: usize) -> std::result::Result<Vec<u8>, String> {
    let digits = token.strip_prefix("0x").unwrap_or(token);
    if digits.len() != 2 * bytes {
        return Err(format!("expected {} hex digits ({bytes} bytes), found {}", 2 * bytes, digits.len()));
    }
    (0..bytes)
        .map(|i| u8::from_str_radix(&digits[2 * i..2 * i + 2], 16).map_err(|_| "not hexadecimal".to_string()))
        .collect()
}

/// The result line of operation `i`.
pub fn result_line(batch: &Batch, result: &BatchResult, i: usize) -> String {
    match (batch.op(i).0, result.statuses[i]) {
        (OpKind::Get, Status::Ok) => {
            let mut s = String::with_capacity(2 * batch.value_bytes());
            for b in result.value(i).expect("a found read has a value") {
                write!(s, "{b:02x}").unwrap();
            }
            s
        }
        (_, Status::Ok) => "OK".into(),
        (_, Status::NotFound) => "NOTFOUND".into(),
        (_, Status::Exists) => "EXISTS".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str) -> Result<Batch> {
        parse(Path::new("t"), text, 8, 2)
    }

    #[test]
    fn parses_every_operation_and_both_key_forms() {
        let b = parse_str(
            "# header\nI 1 abcd\nP 0x0100000000000000 0102\n\nU 2 ffff # tail\nR 1\nD 0200000000000000\n",
        )
        .unwrap();
        assert_eq!(b.len(), 5);
        assert_eq!(b.op(0), (OpKind::Insert, &1u64.to_le_bytes()[..], &[0xab, 0xcd][..]));
        assert_eq!(b.op(1).1, &1u64.to_le_bytes()[..], "hex keys are the bytes in order");
        assert_eq!(b.op(3).0, OpKind::Get);
        assert_eq!(b.op(4).1, &2u64.to_le_bytes()[..]);
    }

    #[test]
    fn malformed_lines_name_their_number() {
        for (text, line) in [
            ("R 1\nX 1\n", 2),
            ("R 1\nR\n", 2),
            ("I 1 abc\n", 1),
            ("I 1 zz\n", 1),
            ("\n\nR -1\n", 3),
            ("R 1 2\n", 1),
            ("D 0x01\n", 1),
        ] {
            match parse_str(text) {
                Err(Error::Trace { line: l, .. }) => assert_eq!(l, line, "{text:?}"),
                other => panic!("{text:?}: {other:?}"),
            }
        }
        let wide = parse(Path::new("t"), "R 12\n", 16, 2);
        assert!(matches!(wide, Err(Error::Trace { line: 1, .. })), "decimal keys are for 8-byte keys only");
    }
}
