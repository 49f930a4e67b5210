//! Header validation rules and decoding of hostile bytes.

mod common;

use common::*;
use host_pm::{
    FORMAT_VERSION, HEADER_AREA, HEADER_COPY_BYTES, Header, PoolError, REGION_ALIGN, Region, decode_header,
    encode_header, layout_regions, validate_header,
};

const A: u64 = REGION_ALIGN;

fn region(offset: u64, bytes: u64) -> Region {
    Region { offset, bytes }
}

/// Each rule violated once: the header must be refused, with an error naming the field.
#[test]
fn every_rule_is_enforced() {
    let (base, total) = sample();
    validate_header(&base, total).expect("the sample is valid");
    let t = base.table_region;
    let hp = base.heap_region;
    type Mutation = fn(&mut Header, Region, Region, u64);
    let cases: Vec<(&str, Mutation)> = vec![
        ("key_bytes", |h, _, _, _| h.table.key_bytes = 0),
        ("key_bytes", |h, _, _, _| h.table.key_bytes = 6),
        ("key_bytes", |h, _, _, _| h.table.key_bytes = 260),
        ("value_bytes", |h, _, _, _| h.table.value_bytes = 0),
        ("value_bytes", |h, _, _, _| h.table.value_bytes = 65537),
        ("levels", |h, _, _, _| h.table.levels = 0),
        ("levels", |h, _, _, _| h.table.levels = 9),
        ("hashes", |h, _, _, _| h.table.hashes = 0),
        ("hashes", |h, _, _, _| h.table.hashes = 9),
        ("slots", |h, _, _, _| h.table.slots = 0),
        ("slots", |h, _, _, _| h.table.slots = 65),
        ("top_level", |h, _, _, _| h.table.top_level = 41),
        ("top_level", |h, _, _, _| {
            h.table.levels = 4;
            h.table.top_level = 2;
        }),
        ("heap_cells", |h, _, _, _| h.heap_cells = 0),
        ("table_region is empty", |h, _, _, _| h.table_region.bytes = 0),
        ("heap_region is empty", |h, _, _, _| h.heap_region = Region::default()),
        ("not aligned", |h, t, _, _| h.table_region.offset = t.offset + 64),
        ("not aligned", |h, _, hp, _| h.heap_region.bytes = hp.bytes - 1),
        ("header area", |h, _, _, _| h.table_region.offset = 0),
        ("overlaps", |h, t, _, _| h.heap_region.offset = t.offset),
        ("overlaps", |h, t, hp, _| h.table_region = region(t.offset, hp.end() - t.offset)),
        ("beyond 2^64", |h, _, _, _| h.heap_region.offset = u64::MAX - A + 1),
        ("resize.state", |h, _, _, _| h.resize.state = 16),
        ("new_top_level", |h, _, _, _| h.resize.new_top_level = 41),
        ("resize.new_table", |h, _, _, total| h.resize.new_table = region(total - A, A)),
        ("resize.new_heap", |h, _, _, _| h.resize.new_heap = region(0, A)),
        ("resize.new_heap", |h, _, _, _| h.resize.new_heap = region(A, 0)),
        ("resize.new_table is empty", |h, _, _, _| h.resize.state = 1),
        ("overlaps resize.new_table", |h, _, hp, _| {
            h.resize.state = 1;
            h.resize.new_table = region(hp.offset, A);
        }),
        ("overlaps resize.new_heap", |h, _, _, total| {
            h.resize.state = 1;
            h.resize.new_table = region(total, 2 * A);
            h.resize.new_heap = region(total + A, A);
        }),
        ("resize.new_heap", |h, _, _, total| {
            h.resize.state = 1;
            h.resize.new_table = region(total, A);
            h.resize.new_heap = region(7, 0);
        }),
    ];
    // Make room for resize regions after the heap.
    let file = total + 4 * A;
    for (i, (needle, mutate)) in cases.iter().enumerate() {
        let mut h = base;
        mutate(&mut h, t, hp, total);
        match validate_header(&h, file) {
            Err(PoolError::Corrupt { what }) => {
                assert!(what.contains(needle), "case {i}: {what:?} does not mention {needle:?}")
            }
            other => panic!("case {i} ({needle}): expected Corrupt, got {other:?}"),
        }
        // decode_header applies the same rules to an intact copy.
        assert!(decode_header(&encode_header(&h), file).is_err(), "case {i}");
    }

    // Version 1 and a newer format are both refused as such (version 2 is read).
    for other in [1, FORMAT_VERSION + 1] {
        let mut h = base;
        h.version = other;
        assert!(matches!(
            validate_header(&h, total),
            Err(PoolError::UnsupportedVersion { found, supported: FORMAT_VERSION }) if found == other
        ));
    }
    // Regions past the end of the file: Truncated, with the size needed.
    assert!(matches!(
        validate_header(&base, total - A),
        Err(PoolError::Truncated { file_bytes, needed }) if file_bytes == total - A && needed == total
    ));
}

#[test]
fn boundary_values_are_accepted() {
    let (base, total) = sample();
    let file = total + 4 * A;
    let mut h = base;
    h.table.key_bytes = 256;
    h.table.value_bytes = 65536;
    h.table.levels = 8;
    h.table.hashes = 8;
    h.table.slots = 64;
    h.table.top_level = 40;
    validate_header(&h, file).unwrap();
    h.table.key_bytes = 4;
    h.table.value_bytes = 1;
    h.table.levels = 1;
    h.table.hashes = 1;
    h.table.slots = 1;
    h.table.top_level = 0;
    validate_header(&h, file).unwrap();
    h.table.levels = 3;
    h.table.top_level = 2;
    validate_header(&h, file).unwrap();
    // A resize with a table and a heap beside the old regions; adjacent regions do not overlap.
    h.resize.state = 15;
    h.resize.new_top_level = 40;
    h.resize.new_table = region(total, 3 * A);
    h.resize.new_heap = region(total + 3 * A, A);
    validate_header(&h, file).unwrap();
    h.resize.new_heap = Region::default();
    validate_header(&h, file).unwrap();
    assert_eq!(decode_header(&encode_header(&h), file).unwrap(), h);
    // The smallest pool.
    let (t, hp, total) = layout_regions(1, 1);
    assert_eq!(total, HEADER_AREA + 2 * A);
    let small = Header { table_region: t, heap_region: hp, ..base };
    validate_header(&small, total).unwrap();
}

#[test]
fn decode_round_trip_and_error_kinds() {
    let (h, total) = sample();
    let raw = encode_header(&h);
    assert_eq!(raw.len() as u64, HEADER_COPY_BYTES);
    assert_eq!(decode_header(&raw, total).unwrap(), h);

    let mut bad = raw.clone();
    bad[0] = b'X';
    assert!(matches!(decode_header(&bad, total), Err(PoolError::NotAPool { .. })));
    let mut bad = raw.clone();
    bad[2000] = 1;
    let err = decode_header(&bad, total).unwrap_err();
    assert!(err.to_string().contains("checksum mismatch"), "{err}");
    let mut bad = raw.clone();
    bad[8] = 9;
    reseal(&mut bad);
    assert!(matches!(decode_header(&bad, total), Err(PoolError::UnsupportedVersion { found: 9, .. })));
    assert!(matches!(
        decode_header(&raw, total - 1),
        Err(PoolError::Truncated { needed, .. }) if needed == total
    ));
}

fn check_decoded(raw: &[u8], file: u64) {
    if let Ok(h) = decode_header(raw, file) {
        // Whatever decodes must be a header the pool would accept, and re-encode to itself.
        validate_header(&h, file).expect("decoded headers are valid");
        assert_eq!(decode_header(&encode_header(&h), file).unwrap(), h);
    }
}

/// Random and mutated bytes never panic the decoder.
#[test]
fn decode_never_panics() {
    let (h, total) = sample();
    let file = total + 4 * A;
    let valid = encode_header(&h);
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut accepted = 0;
    for round in 0..6000 {
        let mut raw = valid.clone();
        match round % 4 {
            // A few flipped bits: the checksum catches them.
            0 => {
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(raw.len() as u64) as usize;
                    raw[i] ^= 1 << rng.below(8);
                }
            }
            // Random words in the field area, checksum fixed up: validation must catch them.
            1 | 2 => {
                for _ in 0..1 + rng.below(3) {
                    let at = rng.below(216 / 4) as usize * 4;
                    let v = match rng.below(4) {
                        0 => 0,
                        1 => u64::MAX,
                        2 => rng.below(1 << 20),
                        _ => rng.next(),
                    };
                    let width = if rng.below(2) == 0 { 4 } else { 8.min(216 - at) };
                    raw[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
                }
                if round % 4 == 2 {
                    raw[..8].copy_from_slice(b"GPHASHPM");
                }
                reseal(&mut raw);
            }
            // Pure noise, sometimes of the wrong length.
            _ => {
                let len = match rng.below(4) {
                    0 => rng.below(5000) as usize,
                    _ => raw.len(),
                };
                raw = (0..len).map(|_| rng.next() as u8).collect();
                if len >= 8 && rng.below(2) == 0 {
                    raw[..8].copy_from_slice(b"GPHASHPM");
                }
            }
        }
        let file_bytes = match rng.below(4) {
            0 => rng.next(),
            1 => 0,
            _ => file,
        };
        if decode_header(&raw, file_bytes).is_ok() {
            accepted += 1;
        }
        check_decoded(&raw, file_bytes);
    }
    // Mutations of user words and the seed are legal: some must pass, most must not.
    assert!(accepted > 0 && accepted < 3000, "accepted {accepted}");
}

#[test]
fn user_words_and_seed_are_opaque() {
    let (mut h, total) = sample();
    h.user = [u64::MAX, 0, 1, 2, 3, 4, 5, u64::MAX - 1];
    h.table.seed = u64::MAX;
    h.sequence = u64::MAX;
    h.clean_shutdown = true;
    assert_eq!(decode_header(&encode_header(&h), total).unwrap(), h);
}
