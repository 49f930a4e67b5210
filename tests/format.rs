//! Pools made by earlier builds open, read, write and grow with this one.
//!
//! `fixtures/pool-2026-11-25.pool.gz` was made by the build of 2026-11-25 (`03d8006`), before
//! each hash location had a part of the top level of its own (header user word 1 = 0):
//!
//! ```sh
//! gphash create --key-bytes 8 --value-bytes 8 --capacity 1000 --executor cpu old.pool
//! gphash replay old.pool --trace trace.txt --out res.txt --batch 256 --executor cpu
//! ```
//!
//! where `trace.txt` inserts keys 1 to 1,500 (decimal, so key `k` is `k` little-endian) with
//! value [`old_value`]`(k)`, then deletes each `k` divisible by 7 and updates each other `k`
//! divisible by 5 to `old_value(k + 1)`. The table grew once (1,536 to 3,072 slots) and was
//! closed cleanly with 1,286 keys.

mod common;

use std::collections::HashMap;
use std::io::Read;

use gphash::{GpHash, GpuOptions, Status};

const OLD_POOL: &[u8] = include_bytes!("fixtures/pool-2026-11-25.pool.gz");

fn old_value(k: u64) -> u64 {
    k.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// What the fixture holds: key `k` (little-endian) to its value's bytes (big-endian: the trace
/// gives a value's bytes in order, as hex).
fn old_contents() -> HashMap<u64, [u8; 8]> {
    (1..=1500u64)
        .filter(|k| k % 7 != 0)
        .map(|k| (k, old_value(if k % 5 == 0 { k + 1 } else { k }).to_be_bytes()))
        .collect()
}

/// Every key of `want` reads its value, and every other key of 1 to `up_to` reads nothing.
fn assert_holds(t: &GpHash, want: &HashMap<u64, [u8; 8]>, up_to: u64, what: &str) {
    let keys: Vec<u8> = (1..=up_to).flat_map(u64::to_le_bytes).collect();
    let got = t.get(&keys).unwrap();
    for k in 1..=up_to {
        let i = k as usize - 1;
        assert_eq!(got.value(i), want.get(&k).map(|v| &v[..]), "{what}: key {k}");
    }
    assert_eq!(t.len(), want.len() as u64, "{what}: key count");
    let report = t.check();
    assert!(report.ok(), "{what}: {report}");
}

#[test]
fn a_pool_of_2026_11_25_opens_reads_writes_and_grows() {
    let dir = common::pool_dir();
    let path = dir.path().join("old.pool");
    let mut bytes = vec![];
    flate2::read::GzDecoder::new(OLD_POOL).read_to_end(&mut bytes).unwrap();
    std::fs::write(&path, bytes).unwrap();
    let mut want = old_contents();
    assert_eq!(want.len(), 1286);

    let t = GpHash::open(&path, &common::gpu_options(GpuOptions::default())).unwrap();
    let geo = t.geometry();
    assert!(!geo.locations_apart, "the header's word 1 is 0: every location hashes into the whole level");
    assert_eq!(geo.location_bits(), 0);
    assert_holds(&t, &want, 1500, "opened");

    // New keys go where the old placement puts them, through two growths of the table: in
    // chunks until the table has grown twice (where a growth comes depends on which slots the
    // GPU's concurrent inserts took, so not on the count of keys alone).
    let slots = geo.slots();
    let mut last = 1500;
    while t.geometry().slots() < 4 * slots {
        assert!(last < 20_000, "no second growth by {last} keys: {} slots", t.geometry().slots());
        let new: Vec<u64> = (last + 1..=last + 500).collect();
        let keys: Vec<u8> = new.iter().flat_map(|k| k.to_le_bytes()).collect();
        let values: Vec<u8> = new.iter().flat_map(|&k| old_value(k).to_be_bytes()).collect();
        assert!(t.insert(&keys, &values).unwrap().iter().all(|s| *s == Status::Ok));
        want.extend(new.iter().map(|&k| (k, old_value(k).to_be_bytes())));
        last += 500;
    }
    assert!(!t.geometry().locations_apart, "growth keeps the placement");
    assert_holds(&t, &want, last, "after inserts and growth");
    t.close().unwrap();

    // Reopened on the CPU model, the table is what the GPU left; the pool is now of this
    // build's format version, which the builds that would misread it refuse.
    let t = GpHash::open(&path, &common::cpu_options()).unwrap();
    assert!(!t.geometry().locations_apart);
    assert_eq!(t.with_pool(|pool| pool.header().version), host_pm::FORMAT_VERSION);
    assert_holds(&t, &want, last, "reopened");
}
