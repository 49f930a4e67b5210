//! The trace parser's fuzz harness (`fuzz/harness/parse_trace.rs`, also the cargo-fuzz target
//! `parse_trace`) over a seeded corpus of valid traces and random mutations of them: bytes
//! flipped, inserted and deleted, multibyte and invalid UTF-8, signs, huge tokens, fields added
//! and dropped, lines spliced. None may panic; every trace that parses must round-trip.
//!
//! `GPHASH_TRACE_FUZZ` sets the number of inputs (default 200000); `GPHASH_TEST_SEED` replays a
//! run.

#[path = "../../tests/common/mod.rs"]
mod common;

#[path = "../../fuzz/harness/parse_trace.rs"]
mod harness;

use std::time::Instant;

use gphash::OpKind;
use gphash_cli::trace;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const KINDS: [OpKind; 5] = [OpKind::Insert, OpKind::Upsert, OpKind::Update, OpKind::Get, OpKind::Delete];

/// A valid trace for the widths that `selector` picks, in the forms the parser reads: hex keys
/// with and without `0x`, decimal 8-byte keys, comments, blank lines, tabs, CRLF.
fn seed_input(rng: &mut StdRng, selector: u8) -> Vec<u8> {
    let (key_bytes, value_bytes) = harness::widths(selector);
    let mut text = String::from("# seed trace\n");
    for _ in 0..rng.random_range(1..12) {
        let kind = KINDS[rng.random_range(0..KINDS.len())];
        let mut key: Vec<u8> = (0..key_bytes).map(|_| rng.random()).collect();
        let value: Vec<u8> = (0..value_bytes).map(|_| rng.random()).collect();
        let mut line = match rng.random_range(0..3) {
            0 => trace::op_line(kind, &key, &value),
            1 => {
                // Without 0x an 8-byte key needs a letter: make its first digit one.
                key[0] |= 0xa0;
                trace::op_line(kind, &key, &value).replacen("0x", "", 1)
            }
            _ if key_bytes == 8 => {
                let k: u64 = rng.random::<u64>() >> rng.random_range(0..64);
                let written = trace::op_line(kind, &k.to_le_bytes(), &value);
                written.replacen(&written[2..20], &k.to_string(), 1)
            }
            _ => trace::op_line(kind, &key, &value).to_uppercase().replacen("0X", "0x", 1),
        };
        match rng.random_range(0..6) {
            0 => line.push_str("  # note"),
            1 => line = line.replace(' ', "\t"),
            2 => line.push('\r'),
            3 => text.push('\n'),
            _ => {}
        }
        text.push_str(&line);
        text.push('\n');
    }
    let mut data = vec![selector];
    data.extend_from_slice(text.as_bytes());
    data
}

fn insert(data: &mut Vec<u8>, at: usize, bytes: &[u8]) {
    data.splice(at..at, bytes.iter().copied());
}

/// One to four random edits of `data` (its first byte, the widths, included).
fn mutate(rng: &mut StdRng, corpus: &[Vec<u8>], data: &mut Vec<u8>) {
    const INSERTS: [&str; 14] = [
        "\u{e9}",
        "\u{20ac}",
        "\u{1f600}",
        "\u{a0}",
        "\u{2028}",
        "+",
        "-",
        "0x",
        "#",
        " ",
        "\t",
        "\n",
        "\r\n",
        "\u{0}",
    ];
    for _ in 0..rng.random_range(1..5) {
        let at = rng.random_range(0..=data.len());
        match rng.random_range(0..10) {
            0 if !data.is_empty() => {
                let i = rng.random_range(0..data.len());
                data[i] ^= 1 << rng.random_range(0..8);
            }
            1 => data.insert(at, rng.random()),
            2 => {
                let s = INSERTS[rng.random_range(0..INSERTS.len())];
                insert(data, at, s.as_bytes());
            }
            // Not UTF-8: a byte that starts nothing, a lone continuation, a cut-off character.
            3 => insert(data, at, &[[0xff], [0x80], [0xc3]][rng.random_range(0..3)]),
            4 => {
                // A huge token: one repeated character, up to 200 KB.
                let c = b"0af+z\xc3"[rng.random_range(0..6)];
                let n = 1usize << rng.random_range(4..18);
                insert(data, at, &vec![c; n]);
            }
            5 => {
                // A field more, or one less: a copy of the token here, or the token removed.
                let start = data[..at].iter().rposition(|&b| b == b' ').map_or(0, |p| p + 1);
                let end =
                    data[at..].iter().position(|&b| b == b' ' || b == b'\n').map_or(data.len(), |p| at + p);
                if rng.random_bool(0.5) {
                    let token = [&b" "[..], &data[start..end]].concat();
                    insert(data, end, &token);
                } else {
                    data.drain(start..end);
                }
            }
            6 => {
                let end = (at + rng.random_range(0..40)).min(data.len());
                data.drain(at..end);
            }
            7 => {
                // A line of another input spliced in.
                let other = &corpus[rng.random_range(0..corpus.len())];
                let lines: Vec<&[u8]> = other[1..].split(|&b| b == b'\n').collect();
                let line = lines[rng.random_range(0..lines.len())];
                insert(data, at, &[line, b"\n"].concat());
            }
            8 if !data.is_empty() => data[0] = rng.random(),
            _ => data.truncate(at),
        }
    }
}

#[test]
fn arbitrary_traces_parse_or_fail_cleanly_and_round_trip() {
    let seed = common::seed("arbitrary_traces_parse_or_fail_cleanly_and_round_trip");
    let mut rng = StdRng::seed_from_u64(seed);
    let inputs: usize =
        std::env::var("GPHASH_TRACE_FUZZ").ok().and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let corpus: Vec<Vec<u8>> = (0..64).map(|i| seed_input(&mut rng, i as u8 % 16)).collect();
    for (i, input) in corpus.iter().enumerate() {
        assert!(harness::check(input), "seed input {i} is valid:\n{}", String::from_utf8_lossy(input));
    }
    let t = Instant::now();
    let mut parsed = 0;
    for i in 0..inputs {
        let mut data = corpus[rng.random_range(0..corpus.len())].clone();
        mutate(&mut rng, &corpus, &mut data);
        let outcome = std::panic::catch_unwind(|| harness::check(&data));
        match outcome {
            Ok(ok) => parsed += usize::from(ok),
            Err(_) => panic!("seed {seed}, input {i} panicked: {:?}", String::from_utf8_lossy(&data)),
        }
    }
    eprintln!("{inputs} mutated traces in {:.2?}; {parsed} still parsed", t.elapsed());
    assert!(parsed > inputs / 20, "mutations leave some traces valid, so round trips are tested");
}
