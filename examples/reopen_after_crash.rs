//! Crash and recovery: a child process writes batches to a pool and is killed (SIGKILL)
//! without closing it; the parent reopens the pool, shows what recovery did, and checks that
//! every batch the child saw acknowledged is there.
//!
//! `cargo run --release --example reopen_after_crash`

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use gphash::TypedIndex;

/// Set in the child process to the pool it writes.
const CHILD_POOL: &str = "GPHASH_EXAMPLE_CHILD_POOL";
/// Keys per batch.
const BATCH: u64 = 2000;
/// Acknowledged batches the parent waits for before the kill.
const KILL_AFTER: u64 = 10;

/// The value stored for `key`, so that the parent can check it.
fn value_of(key: u64) -> u64 {
    key.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The keys and values of batch `b`.
fn batch(b: u64) -> Vec<(u64, u64)> {
    (b * BATCH..(b + 1) * BATCH).map(|k| (k, value_of(k))).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Some(pool) = std::env::var_os(CHILD_POOL) {
        return child(Path::new(&pool));
    }
    let dir = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir())?;
    let path = dir.path().join("crash.pool");

    // The child reports each acknowledged batch on stdout; the pipe keeps what it wrote.
    let mut child =
        Command::new(std::env::current_exe()?).env(CHILD_POOL, &path).stdout(Stdio::piped()).spawn()?;
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut acked = 0;
    for line in lines.by_ref() {
        if line?.starts_with("acked") {
            acked += 1;
        }
        if acked == KILL_AFTER {
            // The child is now most likely inside its next batch.
            child.kill()?;
            break;
        }
    }
    // Acknowledgements written before the kill.
    acked += lines.map_while(Result::ok).filter(|l| l.starts_with("acked")).count() as u64;
    let status = child.wait()?;
    println!("child killed ({status}) after {acked} acknowledged batches");
    assert!(acked >= KILL_AFTER, "the child failed before the kill (see its stderr)");

    // Reopen: recovery clears the claims of the batch in flight (there are some when the kill
    // landed between its two phases), completes an interrupted resize, rebuilds the allocator.
    let map = TypedIndex::<u64, u64>::open(&path)?;
    let stats = map.stats();
    println!("recovery: {}", stats.recovery);
    assert!(!stats.recovery.clean_shutdown, "the child never closed the pool");

    // Every acknowledged batch holds, value for value.
    for b in 0..acked {
        let (keys, values): (Vec<u64>, Vec<u64>) = batch(b).into_iter().unzip();
        let found = map.get_many(&keys)?;
        assert!(found.iter().zip(&values).all(|(f, v)| *f == Some(*v)), "batch {b} lost");
    }
    // The batch in flight at the kill: each key is whole or absent, never torn.
    let (keys, values): (Vec<u64>, Vec<u64>) = batch(acked).into_iter().unzip();
    let found = map.get_many(&keys)?;
    assert!(found.iter().zip(&values).all(|(f, v)| f.is_none() || *f == Some(*v)));
    let survived = found.iter().filter(|f| f.is_some()).count();
    println!("batch in flight: {survived} of {BATCH} keys published before the kill");
    assert_eq!(map.len(), acked * BATCH + survived as u64);
    assert!(map.index().check().ok(), "{}", map.index().check());
    println!("all {} keys of the {acked} acknowledged batches are there", acked * BATCH);
    map.close()?;
    Ok(())
}

/// Writes batches until killed, printing a line after each is acknowledged (persisted).
fn child(pool: &Path) -> Result<(), Box<dyn std::error::Error>> {
    // A small table: it grows while batches come, so the kill may also land in a resize.
    let map = TypedIndex::<u64, u64>::create(pool, 1000)?;
    for b in 0..1000 {
        map.insert_many(&batch(b))?;
        println!("acked {b}");
    }
    // Not reached while the parent is alive: end without closing the pool, as a crash would.
    std::process::abort();
}
