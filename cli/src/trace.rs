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
//! Fields are separated by ASCII white space; `#` starts a comment; the file is UTF-8.
//! Hex digits are the ASCII `0-9`, `a-f` and `A-F`, and nothing else (no sign, no space).
//!
//! - A key of 8 bytes is a decimal u64 when its token holds decimal digits alone (stored
//!   little-endian: `1` is the key `01 00 .. 00`), and hex otherwise: 16 digits after `0x`,
//!   or 16 digits among which a letter `a-f`, giving the key's bytes in order.
//! - A key of any other width is hex of exactly `2 * key_bytes` digits, `0x` optional.
//! - A value is hex of exactly `2 * value_bytes` digits, `0x` optional.
//!
//! [`op_line`] writes operations in this form (keys always with `0x`), and what it writes
//! parses back to the same operations.

use std::path::Path;

use gphash::{Batch, BatchResult, Error, OpKind, Result, Status};

/// Characters of a malformed token that an error quotes (a token may be a whole huge line).
const QUOTED_CHARS: usize = 40;

/// Parses a whole trace; the first malformed line (or one that is not UTF-8) is an error
/// naming it, before anything runs.
pub fn parse_bytes(path: &Path, bytes: &[u8], key_bytes: usize, value_bytes: usize) -> Result<Batch> {
    let mut batch = Batch::new(key_bytes, value_bytes);
    for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
        let err = |why: String| Error::Trace { path: path.to_path_buf(), line: i + 1, why };
        let line = std::str::from_utf8(line)
            .map_err(|e| err(format!("not UTF-8 (byte {} of the line)", e.valid_up_to() + 1)))?;
        let fields: Vec<&str> = line.split('#').next().unwrap_or("").split_ascii_whitespace().collect();
        let Some(&op) = fields.first() else {
            continue;
        };
        let (kind, takes_value) = match op {
            "I" => (OpKind::Insert, true),
            "P" => (OpKind::Upsert, true),
            "U" => (OpKind::Update, true),
            "R" => (OpKind::Get, false),
            "D" => (OpKind::Delete, false),
            other => {
                return Err(err(format!("unknown operation {} (expected I, P, U, R or D)", quote(other))));
            }
        };
        let want = 1 + takes_value as usize;
        if fields.len() != want + 1 {
            return Err(err(format!("{op} takes {want} field(s) after it, found {}", fields.len() - 1)));
        }
        let key =
            parse_key(fields[1], key_bytes).map_err(|why| err(format!("key {}: {why}", quote(fields[1]))))?;
        let value = match takes_value {
            true => Some(hex(fields[2], value_bytes).map_err(|why| {
                err(format!(
                    "value {}: expected {} hex digits for a {value_bytes}-byte value, {why}",
                    quote(fields[2]),
                    2 * value_bytes
                ))
            })?),
            false => None,
        };
        batch.push(kind, &key, value.as_deref()).map_err(|e| err(e.to_string()))?;
    }
    Ok(batch)
}

/// A token for an error message: quoted, cut after [`QUOTED_CHARS`] characters with its
/// length in bytes said.
fn quote(token: &str) -> String {
    match token.char_indices().nth(QUOTED_CHARS) {
        None => format!("{token:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes)", &token[..cut], token.len()),
    }
}

fn parse_key(token: &str, key_bytes: usize) -> std::result::Result<Vec<u8>, String> {
    if key_bytes != 8 {
        return hex(token, key_bytes).map_err(|why| {
            format!("expected {} hex digits for a {key_bytes}-byte key, {why}", 2 * key_bytes)
        });
    }
    if token.bytes().all(|b| b.is_ascii_digit()) {
        return token
            .bytes()
            .try_fold(0u64, |k, d| k.checked_mul(10)?.checked_add(u64::from(d - b'0')))
            .map(|k| k.to_le_bytes().to_vec())
            .ok_or_else(|| format!("a decimal key must be at most {}", u64::MAX));
    }
    hex(token, 8).map_err(|why| format!("expected a decimal u64 or 16 hex digits, {why}"))
}

/// The `bytes` bytes that `token` spells in hex (`0x` optional), or what is wrong with it
/// (completing "expected N hex digits, ...").
fn hex(token: &str, bytes: usize) -> std::result::Result<Vec<u8>, String> {
    let digits = token.strip_prefix("0x").unwrap_or(token);
    if let Some(at) = digits.bytes().position(|b| !b.is_ascii_hexdigit()) {
        let c = digits[at..].chars().next().expect("a non-hex byte starts a character");
        return Err(format!(
            "found {c:?} (not a hex digit) at character {}",
            token.len() - digits.len() + at + 1
        ));
    }
    if digits.len() != 2 * bytes {
        return Err(format!("found {}", digits.len()));
    }
    let nibble = |b: u8| (b as char).to_digit(16).expect("checked to be a hex digit") as u8;
    Ok(digits.as_bytes().chunks_exact(2).map(|p| nibble(p[0]) << 4 | nibble(p[1])).collect())
}

fn push_hex(s: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    s.reserve(2 * bytes.len());
    for &b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
}

/// The trace line (without its newline) of one operation; `value` is ignored for reads and
/// deletes. [`parse_bytes`] reads it back as the same operation.
pub fn op_line(kind: OpKind, key: &[u8], value: &[u8]) -> String {
    let mut s = String::from(match kind {
        OpKind::Insert => "I 0x",
        OpKind::Upsert => "P 0x",
        OpKind::Update => "U 0x",
        OpKind::Get => "R 0x",
        OpKind::Delete => "D 0x",
    });
    push_hex(&mut s, key);
    if kind.writes_value() {
        s.push(' ');
        push_hex(&mut s, value);
    }
    s
}

/// The result line of operation `i`.
pub fn result_line(batch: &Batch, result: &BatchResult, i: usize) -> String {
    match (batch.op(i).0, result.statuses[i]) {
        (OpKind::Get, Status::Ok) => {
            let mut s = String::new();
            push_hex(&mut s, result.value(i).expect("a found read has a value"));
            s
        }
        (_, Status::Ok) => "OK".into(),
        (_, Status::NotFound) => "NOTFOUND".into(),
        (_, Status::Exists) => "EXISTS".into(),
        // A verified read whose stored value fails its checksum.
        (_, Status::Corrupt) => "CORRUPT".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str) -> Result<Batch> {
        parse_bytes(Path::new("t"), text.as_bytes(), 8, 2)
    }

    fn why(r: Result<Batch>) -> String {
        match r {
            Err(Error::Trace { why, .. }) => why,
            other => panic!("expected a trace error, got {other:?}"),
        }
    }

    #[test]
    fn parses_every_operation_and_both_key_forms() {
        let b = parse_str(
            "# header\nI 1 abcd\nP 0x0100000000000000 0102\n\nU 2 ffff # tail\r\nR 1\nD 020000000000000a\n",
        )
        .unwrap();
        assert_eq!(b.len(), 5);
        assert_eq!(b.op(0), (OpKind::Insert, &1u64.to_le_bytes()[..], &[0xab, 0xcd][..]));
        assert_eq!(b.op(1).1, &1u64.to_le_bytes()[..], "hex keys are the bytes in order");
        assert_eq!(b.op(3).0, OpKind::Get);
        assert_eq!(b.op(4).1, &0x0a00_0000_0000_0002u64.to_le_bytes()[..], "a letter makes it hex");
    }

    #[test]
    fn sixteen_decimal_digits_are_a_decimal_key() {
        let b = parse_str("R 1507859731177065\nR 0000000000000001\nR 0x0000000000000001\n").unwrap();
        assert_eq!(b.op(0).1, 1507859731177065u64.to_le_bytes());
        assert_eq!(b.op(1).1, 1u64.to_le_bytes());
        assert_eq!(b.op(2).1, 1u64.to_be_bytes(), "0x makes it hex: the bytes in order");
        assert_eq!(parse_str("R 18446744073709551615\n").unwrap().op(0).1, u64::MAX.to_le_bytes());
        assert!(why(parse_str("R 18446744073709551616\n")).contains("at most 18446744073709551615"));
        // Other widths read hex only, even of decimal digits alone.
        let wide = parse_bytes(Path::new("t"), b"R 00000000000000000000000000000001\n", 16, 2).unwrap();
        assert_eq!(wide.op(0).1[15], 1);
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
            ("R 1\nR 2\n\u{ff}\n", 3),
        ] {
            match parse_str(text) {
                Err(Error::Trace { line: l, .. }) => assert_eq!(l, line, "{text:?}"),
                other => panic!("{text:?}: {other:?}"),
            }
        }
        let wide = parse_bytes(Path::new("t"), b"R 12\n", 16, 2);
        assert!(matches!(wide, Err(Error::Trace { line: 1, .. })), "decimal keys are for 8-byte keys only");
        let not_utf8 = parse_bytes(Path::new("t"), b"R 1\n# caf\xe9\n", 8, 2);
        assert!(matches!(not_utf8, Err(Error::Trace { line: 2, .. })), "{not_utf8:?}");
    }

    #[test]
    fn multibyte_characters_are_errors_not_panics() {
        // 16 bytes: the same length as a valid key, with byte offsets inside characters.
        let key = format!("a{}b", "\u{e9}".repeat(7));
        assert_eq!(key.len(), 16);
        assert!(why(parse_str(&format!("R {key}\n"))).contains("'\u{e9}' (not a hex digit) at character 2"));
        assert!(why(parse_str(&format!("R 0x{key}\n"))).contains("not a hex digit"));
        assert!(why(parse_str("I 1 a\u{e9}b\n")).contains("value"));
        assert!(why(parse_str("I 1 \u{e9}\u{e9}\n")).contains("not a hex digit"));
        assert!(why(parse_str("\u{e9} 1\n")).contains("unknown operation"));
    }

    #[test]
    fn signs_are_not_digits() {
        for text in ["R 0x+1+2+3+4+5+6+7+8\n", "R +7\n", "R -7\n", "I 1 +abc\n", "I 1 0x+abc\n", "R 0x-1\n"] {
            assert!(why(parse_str(text)).contains("not a hex digit"), "{text:?}");
        }
        let sixteen_with_sign = parse_bytes(Path::new("t"), b"R +1+2+3+4+5+6+7+8+9+a+b+c+d+e+f+\n", 16, 2);
        assert!(sixteen_with_sign.is_err());
    }

    #[test]
    fn errors_quote_a_short_prefix_of_a_huge_token() {
        let huge = "z".repeat(100_000_000 / 1000);
        for text in [format!("R {huge}\n"), format!("I 1 {huge}\n"), format!("{huge} 1\n")] {
            let shown = parse_str(&text).unwrap_err().to_string();
            assert!(shown.len() < 200, "{} bytes: {}", shown.len(), &shown[..200]);
            assert!(shown.contains(&format!("({} bytes)", huge.len())), "{shown}");
            assert!(shown.contains(&format!("\"{}\"...", "z".repeat(QUOTED_CHARS))), "{shown}");
        }
        // A short token is quoted whole.
        assert!(why(parse_str("R xyz\n")).starts_with("key \"xyz\": "));
    }

    #[test]
    fn written_lines_read_back() {
        let mut b = Batch::new(8, 3);
        b.insert(&[1, 2, 3, 4, 5, 6, 7, 8], &[0xff, 0, 0x10]).unwrap();
        b.get(&[9; 8]).unwrap();
        b.delete(&[0; 8]).unwrap();
        b.upsert(&[0xab; 8], &[1, 2, 3]).unwrap();
        b.update(&[0; 8], &[0; 3]).unwrap();
        let text: String = (0..b.len())
            .map(|i| {
                let (kind, key, value) = b.op(i);
                op_line(kind, key, value) + "\n"
            })
            .collect();
        assert!(text.starts_with("I 0x0102030405060708 ff0010\nR 0x0909090909090909\n"), "{text}");
        let back = parse_bytes(Path::new("t"), text.as_bytes(), 8, 3).unwrap();
        assert_eq!(
            (0..b.len()).map(|i| b.op(i)).collect::<Vec<_>>(),
            (0..back.len()).map(|i| back.op(i)).collect::<Vec<_>>()
        );
    }
}
