//! Quick start: a typed map of `u64` keys and `u32` values in a temporary pool.
//!
//! `cargo run --release --example quick_start`

use gphash::TypedIndex;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A pool on tmpfs where there is one: it survives a crash of the process, and a GPU maps it
    // without copies. The directory and the pool are removed when `dir` is dropped.
    let dir = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir())?;
    let path = dir.path().join("quick_start.pool");

    // The pool's key width and value size are the types' sizes: 8 and 4 bytes. The table
    // grows by itself past its capacity.
    let map = TypedIndex::<u64, u32>::create(&path, 10_000)?;

    // Single-key calls. Each one is persisted when it returns.
    assert!(map.insert(&1, &100)?);
    assert!(!map.insert(&1, &999)?, "insert never overwrites a present key");
    assert_eq!(map.get(&1)?, Some(100));
    assert!(map.update(&1, &101)?);
    assert!(!map.update(&2, &200)?, "update needs a present key");
    map.upsert(&2, &200)?; // inserts or overwrites
    assert!(map.remove(&1)?);
    assert_eq!(map.get(&1)?, None);

    // Calls over slices run as one batch: one persist (and, once the GPU has taken over from
    // the CPU model that runs calls while it starts, one submission to it).
    let entries: Vec<(u64, u32)> = (10..1010).map(|k| (k, k as u32 * 3)).collect();
    assert!(map.insert_many(&entries)?.iter().all(|&inserted| inserted));
    assert_eq!(map.get_many(&[10, 500, 5000])?, [Some(30), Some(1500), None]);
    assert_eq!(map.remove_many(&[10, 11, 5000])?, [true, true, false]);

    // What the index is (mode: GPU zero-copy, staged, or the CPU model) and what it holds.
    println!("{}", map.stats());
    map.close()?;

    // A cleanly closed pool opens without recovery, with everything in it.
    let map = TypedIndex::<u64, u32>::open(&path)?;
    println!("\nreopened: {}", map.stats().recovery);
    assert_eq!(map.len(), 999);
    map.close()?;
    Ok(())
}
