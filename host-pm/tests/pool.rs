//! Pool lifecycle on real backends: create, open, A/B headers, damage, locking, growth, close.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use host_pm::{
    Backend, CreateOptions, FORMAT_VERSION, HEADER_AREA, HEADER_COPY_BYTES, Header, PersistMode, Pool,
    PoolError, REGION_ALIGN, Region, decode_header,
};

fn create(path: &Path) -> (Pool, Header) {
    let (h, total) = sample();
    let pool = Pool::create(Some(path), total, &h, &CreateOptions::default()).expect("create");
    (pool, h)
}

/// [`create`], its heap filled with 0xAB; and the sample's length.
fn create_filled(path: &Path) -> (Pool, Header, u64) {
    let (mut pool, h) = create(path);
    pool.region_mut(h.heap_region).fill(0xAB);
    (pool, h, sample().1)
}

/// [`create_filled`], grown by a region of `units` times [`REGION_ALIGN`] past its end, filled
/// with 0xCD: the pool, its header, that region, and the bytes its file then has storage for.
fn with_region_past_the_end(path: &Path, units: u64) -> (Pool, Header, Region, u64) {
    let (mut pool, h, total) = create_filled(path);
    let old = Region { offset: total, bytes: units * REGION_ALIGN };
    pool.grow(old.end()).unwrap();
    pool.region_mut(old).fill(0xCD);
    (pool, h, old, allocated_bytes(path))
}

/// Bytes the file at `path` has storage for.
fn allocated_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().blocks() * 512
}

/// Create, fill both regions, update the header, close, reopen, and check it all came back.
fn round_trip(dir: &Path, backend: Backend, mode: PersistMode) {
    let path = dir.join("pool");
    let (mut pool, h) = create(&path);
    assert_eq!(pool.backend(), backend);
    assert_eq!(pool.persist_mode(), mode);
    assert_eq!(pool.path(), Some(path.as_path()));
    let (_, total) = sample();
    assert_eq!(pool.len(), total);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), total);
    assert_eq!(pool.as_ptr() as usize % 4096, 0);
    // create forces these two fields.
    assert!(!pool.header().clean_shutdown);
    assert_eq!(pool.header().sequence, 1);
    assert_eq!(pool.header().table, h.table);
    assert_eq!(pool.header().user, h.user);

    let table = h.table_region;
    let heap = h.heap_region;
    assert!(pool.region(table).iter().all(|&b| b == 0), "a new pool reads as zero");
    for (i, b) in pool.region_mut(table).iter_mut().enumerate() {
        *b = (i % 253) as u8;
    }
    pool.region_mut(heap)[..5].copy_from_slice(b"hello");
    pool.persist_range(table.offset, table.bytes).unwrap();
    pool.persist_lines(&[heap.offset / 64]).unwrap();

    let mut h2 = *pool.header();
    h2.user = [1, 2, 3, 4, 5, 6, 7, u64::MAX];
    h2.heap_cells = 77;
    pool.write_header(&h2).unwrap();
    assert_eq!(pool.header().sequence, 2);
    pool.close().unwrap();

    let pool = Pool::open(&path).expect("reopen");
    assert_eq!(pool.backend(), backend);
    assert_eq!(pool.len(), total);
    let got = *pool.header();
    assert!(got.clean_shutdown);
    assert_eq!(got.sequence, 3, "close wrote one more header");
    assert_eq!(got.user, h2.user);
    assert_eq!(got.heap_cells, 77);
    assert_eq!(got.table, h.table);
    assert_eq!((got.table_region, got.heap_region), (table, heap));
    assert!(pool.region(table).iter().enumerate().all(|(i, &b)| b == (i % 253) as u8));
    assert_eq!(&pool.region(heap)[..6], b"hello\0");
}

#[test]
fn round_trip_tmpfs() {
    let dir = shm_dir();
    round_trip(dir.path(), Backend::Tmpfs, PersistMode::Fence);
}

#[test]
fn round_trip_tmp_file() {
    // /tmp may be tmpfs or a disk depending on the machine: ask statfs what to expect.
    let dir = tmp_dir();
    let backend = expected_backend(dir.path());
    let mode = if backend == Backend::Tmpfs { PersistMode::Fence } else { PersistMode::Msync };
    round_trip(dir.path(), backend, mode);
}

#[test]
fn round_trip_disk_file() {
    let dir = disk_dir();
    assert_eq!(expected_backend(dir.path()), Backend::File, "the target dir should be on a disk");
    round_trip(dir.path(), Backend::File, PersistMode::Msync);
}

#[test]
fn anonymous_pool() {
    let (h, total) = sample();
    let opts = CreateOptions { max_bytes: Some(total + 2 * REGION_ALIGN) };
    let mut pool = Pool::create(None, total, &h, &opts).unwrap();
    assert_eq!(pool.backend(), Backend::Anonymous);
    assert_eq!(pool.persist_mode(), PersistMode::None);
    assert_eq!(pool.path(), None);
    assert_eq!(pool.len(), total);
    assert_eq!(pool.max_bytes(), Some(total + 2 * REGION_ALIGN));
    // The header is in the pool's first bytes, like on a file.
    let copy = &pool.bytes()[..HEADER_COPY_BYTES as usize];
    assert_eq!(decode_header(copy, total).unwrap().sequence, 1);
    pool.region_mut(h.heap_region)[7] = 42;
    pool.persist_all().unwrap();
    pool.persist_lines(&[3, 1, 3]).unwrap();
    // Growth copies the contents into a larger mapping.
    pool.grow(total + 1).unwrap();
    assert_eq!(pool.len(), total + REGION_ALIGN);
    assert_eq!(pool.region(h.heap_region)[7], 42);
    assert!(pool.bytes()[total as usize..].iter().all(|&b| b == 0));
    assert!(matches!(
        pool.grow(total + 3 * REGION_ALIGN),
        Err(PoolError::OutOfSpace { needed, limit }) if needed == total + 3 * REGION_ALIGN && limit == total + 2 * REGION_ALIGN
    ));
    assert!(matches!(pool.set_persist_mode(PersistMode::Msync), Err(PoolError::InvalidArgument(_))));
    pool.mark_dirty().unwrap();
    pool.close().unwrap();
}

#[test]
fn create_refuses_an_existing_file() {
    let dir = shm_dir();
    let path = dir.path().join("pool");
    std::fs::write(&path, b"precious").unwrap();
    let (h, total) = sample();
    let err = Pool::create(Some(&path), total, &h, &CreateOptions::default()).unwrap_err();
    match &err {
        PoolError::Io { path: p, op, source } => {
            assert_eq!(p, &path);
            assert_eq!(*op, "create");
            assert_eq!(source.kind(), std::io::ErrorKind::AlreadyExists);
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains(path.to_str().unwrap()), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
}

#[test]
fn create_refuses_bad_input_without_leaving_a_file() {
    let dir = shm_dir();
    let path = dir.path().join("pool");
    let (h, total) = sample();
    // Too small for the header's regions.
    let err = Pool::create(Some(&path), total - REGION_ALIGN, &h, &CreateOptions::default()).unwrap_err();
    assert!(matches!(err, PoolError::InvalidArgument(_)), "{err:?}");
    let mut bad = h;
    bad.table.levels = 0;
    let err = Pool::create(Some(&path), total, &bad, &CreateOptions::default()).unwrap_err();
    assert!(err.to_string().contains("table.levels 0"), "{err}");
    // Above max_bytes (rounded down to REGION_ALIGN).
    let opts = CreateOptions { max_bytes: Some(total - 1) };
    let err = Pool::create(Some(&path), total, &h, &opts).unwrap_err();
    assert!(
        matches!(err, PoolError::OutOfSpace { needed, limit } if needed == total && limit == total - REGION_ALIGN),
        "{err:?}"
    );
    assert!(!path.exists());
    // A character device that is not devdax is refused, and left alone.
    let err = Pool::create(Some(Path::new("/dev/null")), total, &h, &CreateOptions::default()).unwrap_err();
    assert!(err.to_string().contains("not a devdax device"), "{err}");
    assert!(Path::new("/dev/null").exists());
}

#[test]
fn sizes_round_up_to_region_align() {
    let dir = shm_dir();
    let path = dir.path().join("pool");
    let (h, total) = sample();
    let pool = Pool::create(Some(&path), total + 1, &h, &CreateOptions::default()).unwrap();
    assert_eq!(pool.len(), total + REGION_ALIGN);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), total + REGION_ALIGN);
}

/// Path of the header copy holding the highest sequence, and that sequence.
fn newest_slot(path: &Path) -> (u64, u64) {
    let seqs = [raw_sequence(&read_copy(path, 0)), raw_sequence(&read_copy(path, 1))];
    if seqs[1] > seqs[0] { (1, seqs[1]) } else { (0, seqs[0]) }
}

#[test]
fn header_copies_alternate_and_a_torn_newest_copy_falls_back() {
    for dir in [shm_dir(), disk_dir()] {
        let path = dir.path().join("pool");
        let (mut pool, h) = create(&path);
        for n in 1..=5u64 {
            let before = newest_slot(&path);
            let mut next = *pool.header();
            next.user[0] = n;
            pool.write_header(&next).unwrap();
            let after = newest_slot(&path);
            assert_eq!(after.1, n + 1);
            // The new header went into the other slot; the previous one is untouched.
            if n > 1 {
                assert_ne!(after.0, before.0);
            }
            let old = decode_header(&read_copy(&path, 1 - after.0), pool.len()).unwrap();
            let old_user = if n == 1 { h.user[0] } else { n - 1 };
            assert_eq!((old.sequence, old.user[0]), (n, old_user));
        }
        drop(pool);

        // Flip one byte of the newest copy, as a torn write would.
        let (slot, seq) = newest_slot(&path);
        assert_eq!(seq, 6);
        let at = slot * HEADER_COPY_BYTES + 137;
        let byte = read_copy(&path, slot)[137];
        patch(&path, at, &[byte ^ 0x40]);

        let mut pool = Pool::open(&path).unwrap();
        assert_eq!(pool.header().sequence, 5);
        assert_eq!(pool.header().user[0], 4, "the previous header");
        assert_eq!(pool.header().table, h.table);
        // The next write overwrites the damaged copy and wins again.
        let mut next = *pool.header();
        next.user[0] = 100;
        pool.write_header(&next).unwrap();
        drop(pool);
        let pool = Pool::open(&path).unwrap();
        assert_eq!((pool.header().sequence, pool.header().user[0]), (6, 100));
    }
}

#[test]
fn both_copies_damaged() {
    let dir = shm_dir();
    let path = dir.path().join("pool");
    drop(create(&path));
    // Checksums broken in both copies: Corrupt, naming both.
    for slot in 0..2 {
        let byte = read_copy(&path, slot)[40];
        patch(&path, slot * HEADER_COPY_BYTES + 40, &[byte ^ 1]);
    }
    match Pool::open(&path).unwrap_err() {
        PoolError::Corrupt { what } => {
            assert!(what.contains("copy 0: checksum mismatch"), "{what}");
            assert!(what.contains("copy 1: checksum mismatch"), "{what}");
        }
        other => panic!("{other:?}"),
    }
    // Magic wrong in both: not a pool at all.
    patch(&path, 0, b"NOTAPOOL");
    patch(&path, HEADER_COPY_BYTES, b"NOTAPOOL");
    match Pool::open(&path).unwrap_err() {
        PoolError::NotAPool { path: p } => assert_eq!(p, path),
        other => panic!("{other:?}"),
    }
}

#[test]
fn other_version_with_valid_checksum_is_unsupported() {
    let dir = shm_dir();
    let path = dir.path().join("pool");
    drop(create(&path));
    let newer = FORMAT_VERSION + 1;
    let mut copy = read_copy(&path, 1);
    copy[8..12].copy_from_slice(&newer.to_le_bytes());
    reseal(&mut copy);
    // Even one copy written by a newer format stops the open: that format owns the pool now.
    patch(&path, HEADER_COPY_BYTES, &copy);
    let err = Pool::open(&path).unwrap_err();
    assert!(
        matches!(err, PoolError::UnsupportedVersion { found, supported: FORMAT_VERSION } if found == newer),
        "{err:?}"
    );
    patch(&path, 0, &copy);
    let err = Pool::open(&path).unwrap_err();
    assert!(matches!(err, PoolError::UnsupportedVersion { found, .. } if found == newer));
    assert!(err.to_string().contains(&format!("version {newer}")), "{err}");
}

/// A pool of format version 1 (value cells without checksums) gets a clear error.
#[test]
fn version_1_is_unsupported() {
    let dir = shm_dir();
    let path = dir.path().join("pool");
    drop(create(&path));
    let old = 1u32;
    for copy in 0..2 {
        let mut bytes = read_copy(&path, copy);
        bytes[8..12].copy_from_slice(&old.to_le_bytes());
        reseal(&mut bytes);
        patch(&path, copy * HEADER_COPY_BYTES, &bytes);
    }
    let err = Pool::open(&path).unwrap_err();
    assert!(
        matches!(err, PoolError::UnsupportedVersion { found, supported: FORMAT_VERSION } if found == old)
    );
    assert_eq!(
        err.to_string(),
        format!("pool format version {old} is not supported (this build reads version {FORMAT_VERSION})")
    );
}

#[test]
fn files_that_are_not_pools() {
    let dir = shm_dir();
    let zeros = dir.path().join("zeros");
    std::fs::write(&zeros, vec![0u8; 1 << 20]).unwrap();
    assert!(matches!(Pool::open(&zeros), Err(PoolError::NotAPool { .. })));
    let noise = dir.path().join("noise");
    let mut rng = Rng(7);
    let bytes: Vec<u8> = (0..1 << 20).map(|_| rng.next() as u8).collect();
    std::fs::write(&noise, bytes).unwrap();
    assert!(matches!(Pool::open(&noise), Err(PoolError::NotAPool { .. })));
    let missing = dir.path().join("missing");
    match Pool::open(&missing).unwrap_err() {
        PoolError::Io { path, op, source } => {
            assert_eq!((path, op), (missing, "open"));
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("{other:?}"),
    }
    let err = Pool::open(dir.path()).unwrap_err();
    assert!(matches!(err, PoolError::Io { op: "open", .. }), "{err:?}");
    let err = Pool::open(Path::new("/dev/null")).unwrap_err();
    assert!(err.to_string().contains("not a devdax device"), "{err}");
}

#[test]
fn truncated_files() {
    let dir = shm_dir();
    let path = dir.path().join("pool");
    let (_, h) = create(&path);
    let (_, total) = sample();
    let original = std::fs::read(&path).unwrap();
    let cuts = [
        0,
        1,
        100,
        HEADER_COPY_BYTES - 1,
        HEADER_COPY_BYTES,
        HEADER_COPY_BYTES + 10,
        2 * HEADER_COPY_BYTES,
        HEADER_AREA - 1,
        HEADER_AREA,
        h.table_region.offset + 4096,
        h.table_region.end() - 1,
        h.table_region.end(),
        h.heap_region.offset + 12345,
        total - 1,
    ];
    for cut in cuts {
        let p = dir.path().join(format!("cut{cut}"));
        std::fs::write(&p, &original[..cut as usize]).unwrap();
        match Pool::open(&p) {
            Err(PoolError::Truncated { file_bytes, needed }) => {
                assert_eq!(file_bytes, cut);
                let want = if cut < HEADER_AREA { HEADER_AREA } else { total };
                assert_eq!(needed, want, "cut at {cut}");
            }
            other => panic!("cut at {cut}: expected Truncated, got {other:?}"),
        }
    }
}

#[test]
fn a_pool_is_locked_while_open() {
    let dir = shm_dir();
    let path = dir.path().join("pool");
    let (pool, _) = create(&path);
    // flock conflicts between two open file descriptions, even within one process.
    match Pool::open(&path).unwrap_err() {
        PoolError::Locked { path: p } => assert_eq!(p, path),
        other => panic!("{other:?}"),
    }
    drop(pool);
    let pool = Pool::open(&path).expect("lock released by drop");
    assert!(matches!(Pool::open(&path), Err(PoolError::Locked { .. })));
    pool.close().unwrap();
    Pool::open(&path).expect("lock released by close");
}

/// Set in the child of `a_killed_create_leaves_no_file_and_blocks_nothing` to its pool path.
const CREATE_CHILD_ENV: &str = "HOST_PM_CREATE_CHILD";

/// A create killed at any moment leaves at its path either nothing or a complete pool, and no
/// other file; the next create succeeds. The child creates (and removes) large pools, so most
/// kills land while the file is being allocated.
#[test]
fn a_killed_create_leaves_no_file_and_blocks_nothing() {
    const NAME: &str = "a_killed_create_leaves_no_file_and_blocks_nothing";
    if let Some(path) = std::env::var_os(CREATE_CHILD_ENV) {
        let (h, _) = sample();
        loop {
            let pool = Pool::create(Some(path.as_ref()), 256 << 20, &h, &CreateOptions::default()).unwrap();
            pool.close().unwrap();
            std::fs::remove_file(&path).unwrap();
        }
    }
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("seed {seed}");
    let mut rng = Rng(seed | 1);
    let dir = shm_dir();
    let path = dir.path().join("pool");
    let (mut complete, mut absent) = (0, 0);
    for kill in 0..24 {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([NAME, "--exact", "--test-threads=1"])
            .env(CREATE_CHILD_ENV, &path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20 + rng.below(400)));
        assert!(child.try_wait().unwrap().is_none(), "kill {kill}: the child stopped by itself");
        child.kill().unwrap();
        child.wait().unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        if path.exists() {
            let pool = Pool::open(&path).unwrap_or_else(|e| panic!("kill {kill}: a killed create left {e}"));
            assert_eq!(pool.header().table, sample().0.table, "kill {kill}");
            drop(pool);
            assert_eq!(names, ["pool"], "kill {kill}: the pool and nothing else");
            std::fs::remove_file(&path).unwrap();
            complete += 1;
        } else {
            assert!(names.is_empty(), "kill {kill}: left {names:?}");
            absent += 1;
        }
        let (pool, _) = create(&path);
        pool.close().unwrap();
        std::fs::remove_file(&path).unwrap();
    }
    eprintln!("{complete} kills left a complete pool, {absent} no file");
}

/// A directory gets a pool in a file without a name: usable and growable like any tmpfs pool,
/// invisible in the directory, gone when dropped.
#[test]
fn a_directory_gets_an_unnamed_pool() {
    let dir = shm_dir();
    let (h, total) = sample();
    let mut pool = Pool::create(Some(dir.path()), total, &h, &CreateOptions::default()).unwrap();
    assert_eq!((pool.backend(), pool.path()), (Backend::Tmpfs, Some(dir.path())));
    pool.region_mut(h.table_region)[5] = 7;
    pool.persist_range(h.table_region.offset, 64).unwrap();
    pool.grow(total + REGION_ALIGN).unwrap();
    assert_eq!(pool.region(h.table_region)[5], 7);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the pool file has no name");
    pool.close().unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

fn grow_on(dir: &Path, backend: Backend) {
    let path = dir.join("pool");
    let (h, total) = sample();
    let limit = total + 8 * REGION_ALIGN;
    let opts = CreateOptions { max_bytes: Some(limit + 100) };
    let mut pool = Pool::create(Some(&path), total, &h, &opts).unwrap();
    assert_eq!(pool.backend(), backend);
    assert_eq!(pool.max_bytes(), Some(limit));
    pool.region_mut(h.heap_region).fill(0xAB);
    pool.persist_range(h.heap_region.offset, h.heap_region.bytes).unwrap();

    pool.grow(total - REGION_ALIGN).unwrap(); // no-op
    assert_eq!(pool.len(), total);
    pool.grow(total + 4 * REGION_ALIGN - 5).unwrap();
    let grown = total + 4 * REGION_ALIGN;
    assert_eq!(pool.len(), grown);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), grown);
    assert!(pool.region(h.heap_region).iter().all(|&b| b == 0xAB), "contents preserved");
    assert!(pool.bytes()[total as usize..].iter().all(|&b| b == 0), "new bytes are zero");
    let err = pool.grow(limit + 1).unwrap_err();
    assert!(
        matches!(err, PoolError::OutOfSpace { needed, limit: l } if needed == limit + REGION_ALIGN && l == limit),
        "{err:?}"
    );
    assert_eq!(pool.len(), grown);

    // Record a resize into the grown area, the way the table crate will.
    let new_table = Region { offset: total, bytes: 3 * REGION_ALIGN };
    pool.region_mut(new_table)[..3].copy_from_slice(b"new");
    pool.persist_range(new_table.offset, 3).unwrap();
    let mut next = *pool.header();
    next.resize.state = 2;
    next.resize.new_top_level = 11;
    next.resize.new_table = new_table;
    pool.write_header(&next).unwrap();
    drop(pool);

    let mut pool = Pool::open(&path).unwrap();
    assert_eq!(pool.len(), grown);
    assert_eq!(pool.max_bytes(), Some(limit), "max_bytes survives reopen");
    assert_eq!(pool.header().resize, next.resize);
    assert_eq!(&pool.region(new_table)[..3], b"new");
    // Growth that no header records yet (a crash after grow) still opens.
    pool.grow(limit).unwrap();
    drop(pool);
    let pool = Pool::open(&path).unwrap();
    assert_eq!(pool.len(), limit);
    assert_eq!(pool.header().resize, next.resize);
}

/// Storage prepared ahead is used by the growth it was made for; dropping the pool waits
/// for it; a preparation past `max_bytes` or below the length does nothing.
#[test]
fn a_prepared_growth_is_used_and_waited_for() {
    let dir = shm_dir();
    let path = dir.path().join("pool");
    let (h, total) = sample();
    let limit = total + 64 * REGION_ALIGN;
    let mut pool = Pool::create(Some(&path), total, &h, &CreateOptions { max_bytes: Some(limit) }).unwrap();
    pool.region_mut(h.heap_region).fill(0xAB);
    pool.prepare_growth(limit + 1);
    pool.prepare_growth(total - 1);
    pool.prepare_growth(total + 8 * REGION_ALIGN - 3);
    assert_eq!(pool.len(), total, "preparing leaves the pool's length");
    assert!(pool.region(h.heap_region).iter().all(|&b| b == 0xAB));
    pool.grow(total + 5 * REGION_ALIGN).unwrap();
    let grown = total + 8 * REGION_ALIGN;
    assert_eq!(std::fs::metadata(&path).unwrap().len(), grown, "the prepared file");
    assert_eq!(pool.len(), total + 5 * REGION_ALIGN);
    assert!(pool.region(h.heap_region).iter().all(|&b| b == 0xAB), "contents preserved");
    assert!(pool.bytes()[total as usize..].iter().all(|&b| b == 0), "new bytes are zero");
    pool.prepare_growth(total + 40 * REGION_ALIGN);
    drop(pool);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), total + 40 * REGION_ALIGN, "waited for at drop");
    let pool = Pool::open(&path).unwrap();
    assert_eq!(pool.len(), total + 40 * REGION_ALIGN, "prepared storage no header names still opens");
    assert!(pool.region(h.heap_region).iter().all(|&b| b == 0xAB));
}

/// A tmpfs pool whose file a killed growth left longer than any header says, its tail a hole,
/// gets the tail's pages at open: a later write there cannot fault on a full tmpfs.
#[test]
fn a_tail_left_by_a_killed_growth_gets_its_pages_at_open() {
    let dir = shm_dir();
    let path = dir.path().join("pool");
    let (pool, h, total) = create_filled(&path);
    pool.persist_range(h.heap_region.offset, h.heap_region.bytes).unwrap();
    pool.close().unwrap();
    let long = total + 16 * REGION_ALIGN;
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(long).unwrap();
    let blocks = allocated_bytes;
    assert!(blocks(&path) < long, "the tail is a hole");
    let pool = Pool::open(&path).unwrap();
    assert_eq!(pool.len(), long);
    assert!(blocks(&path) >= long, "the tail's pages are made");
    assert!(pool.region(h.heap_region).iter().all(|&b| b == 0xAB), "contents kept");
    assert!(pool.bytes()[total as usize..].iter().all(|&b| b == 0));
}

/// Regions discarded on a thread of their own read as zeros, their pages given back, once
/// `grow` (even one that need not lengthen the pool) or dropping the pool returns; the other
/// regions keep their bytes; a region outside the pool is refused and nothing is discarded. A
/// growth past the end leaves the hole as it is, and `take_room` gives it its pages again.
#[test]
fn a_discard_in_the_background_is_done_before_room_is_taken() {
    let dir = shm_dir();
    let path = dir.path().join("pool");
    let blocks = allocated_bytes;
    // Large enough that its holes take a while to punch.
    let (mut pool, h, old, _) = with_region_past_the_end(&path, 256);
    let outside = Region { offset: old.end() + 2 * REGION_ALIGN, bytes: REGION_ALIGN };
    let refused = pool.discard_in_background(&[old, outside]);
    assert!(matches!(refused, Err(PoolError::InvalidArgument(_))), "{refused:?}");
    assert!(pool.region(old).iter().all(|&b| b == 0xCD), "nothing discarded");
    let before = blocks(&path);
    pool.discard_in_background(&[old]).unwrap();
    pool.grow(old.end()).unwrap();
    // Before reading the hole: a read fault on tmpfs makes its page again.
    assert!(blocks(&path) + old.bytes <= before, "its pages given back once grow returns");
    // A growth past the end leaves the hole a hole; the region taken again gets its pages.
    pool.grow(old.end() + REGION_ALIGN).unwrap();
    assert!(blocks(&path) + old.bytes <= before + REGION_ALIGN, "a growth keeps the hole");
    pool.take_room(&[old]).unwrap();
    assert!(blocks(&path) >= before, "take_room gives the region its pages back");
    assert!(pool.region(old).iter().all(|&b| b == 0), "discarded");
    assert!(pool.region(h.heap_region).iter().all(|&b| b == 0xAB), "the heap kept");
    pool.region_mut(old).fill(0xEE);
    pool.discard_in_background(&[old]).unwrap();
    drop(pool);
    assert!(blocks(&path) + old.bytes <= before + REGION_ALIGN, "its pages given back once the pool dropped");
    let pool = Pool::open(&path).unwrap();
    assert!(pool.region(old).iter().all(|&b| b == 0));
    assert!(pool.region(h.heap_region).iter().all(|&b| b == 0xAB));
}

/// Room a discard left as holes inside the pool, and room past its end, are made ahead by
/// `prepare_room` on a thread of its own (the file's blocks come back before `take_room` runs),
/// not while a discard may still be punching them; `take_room` then finds them made and zero.
#[test]
fn room_in_holes_is_made_ahead() {
    let dir = shm_dir();
    let path = dir.path().join("pool");
    let (mut pool, h, old, before) = with_region_past_the_end(&path, 64);
    pool.discard(old).unwrap();
    assert!(allocated_bytes(&path) + old.bytes <= before, "holes punched");
    let past = Region { offset: old.end(), bytes: 16 * REGION_ALIGN };
    pool.prepare_room(&[old, past]);
    let made = std::time::Instant::now();
    while allocated_bytes(&path) < before + past.bytes {
        assert!(made.elapsed().as_secs() < 20, "the holes' pages were not made ahead");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(pool.len(), old.end(), "the pool keeps its length until it takes the room");
    pool.take_room(&[old, past]).unwrap();
    assert_eq!(pool.len(), past.end());
    assert!(pool.region(old).iter().chain(pool.region(past)).all(|&b| b == 0), "the room reads as zeros");
    assert!(pool.region(h.heap_region).iter().all(|&b| b == 0xAB), "the heap kept");
}

/// Every call that may take room where holes are being punched, or show the pool to an
/// observer, waits for a background discard: held back by a fault hook until a thread opens
/// its gate a while later, the discard must be done when each of them returns.
#[test]
fn what_comes_after_a_discard_in_the_background_waits_for_it() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    type Waiter = fn(Pool, Region) -> Option<Pool>;
    let waiters: [(&str, Waiter); 5] = [
        ("grow past the end", |mut p, old| p.grow(old.end() + REGION_ALIGN).map(|()| p).ok()),
        ("grow within the pool", |mut p, old| p.grow(old.end()).map(|()| p).ok()),
        ("discard", |mut p, old| p.discard(Region { offset: old.offset, bytes: 0 }).map(|()| p).ok()),
        ("set_observer", |mut p, _| {
            p.set_observer(None);
            Some(p)
        }),
        ("drop", |p, _| {
            drop(p);
            None
        }),
    ];
    for (what, wait) in waiters {
        let dir = shm_dir();
        let path = dir.path().join("pool");
        let (mut pool, _, old, before) = with_region_past_the_end(&path, 16);
        let gate = Arc::new(std::sync::Barrier::new(2));
        pool.hold_discards(gate.clone());
        pool.discard_in_background(&[old]).unwrap();
        let opened = Arc::new(AtomicBool::new(false));
        let opener = {
            let opened = opened.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(200));
                opened.store(true, Ordering::SeqCst);
                gate.wait();
            })
        };
        let pool = wait(pool, old);
        assert!(opened.load(Ordering::SeqCst), "{what} returned while the discard was held back");
        assert!(allocated_bytes(&path) + old.bytes <= before + REGION_ALIGN, "{what}: the holes are punched");
        if let Some(pool) = pool {
            assert!(pool.region(old).iter().all(|&b| b == 0), "{what}: the region reads as zeros");
        }
        opener.join().unwrap();
    }
}

/// The bytes of this process's mapping that holds `at` which are in its page tables (the
/// mapping's `Rss` in `/proc/self/smaps`).
fn mapped_bytes(at: *const u8) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((start, end)) = first.split_once('-')
            && let (Ok(start), Ok(end)) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16))
        {
            inside = (start..end).contains(&(at as usize));
        } else if inside && let Some(kb) = line.strip_prefix("Rss:") {
            return kb.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap() * 1024;
        }
    }
    panic!("no mapping holds {at:?}");
}

/// A tmpfs pool's growth keeps the pages it had in its page tables (`mremap`; a fresh
/// mapping faulted each in again, and imports pin them one fault at a time) and enters the new
/// ones too.
#[test]
fn a_grown_tmpfs_pool_keeps_its_pages_mapped() {
    let dir = shm_dir();
    let path = dir.path().join("pool");
    let (mut pool, h, total) = create_filled(&path);
    let all = pool.bytes().iter().map(|&b| b as u64).sum::<u64>();
    assert!(all > 0 && mapped_bytes(pool.bytes().as_ptr()) >= total, "every page read");
    let grown = total + 256 * REGION_ALIGN;
    pool.grow(grown).unwrap();
    assert!(mapped_bytes(pool.bytes().as_ptr()) >= grown, "old and new pages mapped after the growth");
    assert!(pool.region(h.heap_region).iter().all(|&b| b == 0xAB));
}

#[test]
fn grow_tmpfs() {
    grow_on(shm_dir().path(), Backend::Tmpfs);
}

#[test]
fn grow_disk_file() {
    grow_on(disk_dir().path(), Backend::File);
}

#[test]
fn clean_shutdown_flag() {
    let dir = shm_dir();
    let path = dir.path().join("pool");
    let (pool, _) = create(&path);
    drop(pool); // crash-like
    let mut pool = Pool::open(&path).unwrap();
    assert!(!pool.header().clean_shutdown);
    let seq = pool.header().sequence;
    pool.mark_dirty().unwrap();
    assert_eq!(pool.header().sequence, seq, "already dirty: nothing written");
    pool.close().unwrap();

    let mut pool = Pool::open(&path).unwrap();
    assert!(pool.header().clean_shutdown);
    pool.mark_dirty().unwrap();
    assert!(!pool.header().clean_shutdown);
    assert_eq!(pool.header().sequence, seq + 2);
    drop(pool);
    let pool = Pool::open(&path).unwrap();
    assert!(!pool.header().clean_shutdown, "mark_dirty is durable");
}

#[test]
fn write_header_refuses_invalid_headers() {
    let dir = shm_dir();
    let path = dir.path().join("pool");
    let (mut pool, h) = create(&path);
    let (_, total) = sample();
    let mut overlap = h;
    overlap.heap_region.offset = h.table_region.offset + REGION_ALIGN;
    let mut beyond = h;
    beyond.heap_region.bytes = total; // ends past the pool
    let mut version = h;
    version.version = FORMAT_VERSION + 1;
    for bad in [overlap, beyond, version] {
        let err = pool.write_header(&bad).unwrap_err();
        assert!(matches!(err, PoolError::InvalidArgument(_)), "{err:?}");
    }
    assert_eq!(pool.header().sequence, 1);
    drop(pool);
    let pool = Pool::open(&path).unwrap();
    assert_eq!(pool.header().sequence, 1);
    assert_eq!(pool.header().heap_region, h.heap_region);
}

/// Every persist entry point on every backend, with each mode the backend allows.
#[test]
fn persist_calls_on_every_backend() {
    let shm = shm_dir();
    let disk = disk_dir();
    let (h, total) = sample();
    let paths: [Option<PathBuf>; 3] = [Some(shm.path().join("p")), Some(disk.path().join("p")), None];
    for path in &paths {
        let mut pool = Pool::create(path.as_deref(), total, &h, &CreateOptions::default()).unwrap();
        let lines = total / 64;
        let mut modes =
            vec![pool.persist_mode(), PersistMode::FlushFence, PersistMode::Fence, PersistMode::None];
        if path.is_some() {
            modes.push(PersistMode::Msync);
        }
        for mode in modes {
            pool.set_persist_mode(mode).unwrap();
            assert_eq!(pool.persist_mode(), mode);
            pool.bytes_mut()[HEADER_AREA as usize + 70] ^= 1;
            pool.persist_range(HEADER_AREA + 3, 200).unwrap();
            pool.persist_range(total - 1, 1).unwrap();
            pool.persist_range(total, 0).unwrap();
            // Several page runs (one fdatasync under msync), then one run (one msync).
            pool.persist_lines(&[lines - 1, 2000, 1025, 1024, 2000, 1100, 3]).unwrap();
            pool.persist_lines(&[4, 5, 63]).unwrap();
            pool.persist_lines(&[]).unwrap();
            pool.persist_all().unwrap();
            for (off, len) in [(total, 1), (total - 1, 2), (u64::MAX, 2)] {
                let err = pool.persist_range(off, len).unwrap_err();
                assert!(matches!(err, PoolError::InvalidArgument(_)), "{mode}: {err:?}");
            }
            let err = pool.persist_lines(&[0, lines]).unwrap_err();
            assert!(matches!(err, PoolError::InvalidArgument(_)), "{mode}: {err:?}");
            assert!(pool.persist_lines(&[u64::MAX]).is_err());
        }
        // The header path (write_header persists) works in the strongest mode too.
        pool.set_persist_mode(PersistMode::FlushFence).unwrap();
        let next = *pool.header();
        pool.write_header(&next).unwrap();
        pool.close().unwrap();
    }
}

#[test]
#[should_panic(expected = "outside the pool")]
fn region_outside_the_pool_is_a_bug() {
    let (h, total) = sample();
    let pool = Pool::create(None, total, &h, &CreateOptions::default()).unwrap();
    let _ = pool.region(Region { offset: total - 64, bytes: 128 });
}

#[test]
fn pool_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Pool>();
}

/// Everything done to a private view stays in it: the file's bytes and times do not change.
fn private_view_on(dir: &Path) {
    let path = dir.join("pool");
    let (mut pool, h) = create(&path);
    pool.region_mut(h.heap_region)[..5].copy_from_slice(b"hello");
    pool.persist_range(h.heap_region.offset, 5).unwrap();
    drop(pool); // not closed cleanly
    let before = std::fs::read(&path).unwrap();
    let modified = std::fs::metadata(&path).unwrap().modified().unwrap();

    let mut view = Pool::open_private(&path).unwrap();
    assert!(view.is_private());
    assert_eq!(view.persist_mode(), PersistMode::None);
    assert_eq!(view.bytes(), &before[..], "the view shows the file");
    assert!(!view.header().clean_shutdown);
    let seq = view.header().sequence;
    view.region_mut(h.heap_region)[..5].copy_from_slice(b"world");
    view.persist_all().unwrap();
    view.persist_lines(&[h.heap_region.offset / 64]).unwrap();
    assert_eq!(&view.region(h.heap_region)[..5], b"world", "the view sees its own writes");
    let mut next = *view.header();
    next.user[0] = 12345;
    view.write_header(&next).unwrap();
    assert_eq!(view.header().sequence, seq + 1);
    let err = view.set_persist_mode(PersistMode::Msync).unwrap_err();
    assert!(err.to_string().contains("private view"), "{err}");
    view.set_persist_mode(PersistMode::None).unwrap();
    view.discard(h.table_region).unwrap();
    let (_, total) = sample();
    view.grow(total + 2 * REGION_ALIGN).unwrap();
    assert_eq!(view.len(), total + 2 * REGION_ALIGN);
    assert_eq!(&view.region(h.heap_region)[..5], b"world", "growth keeps the view's bytes");
    view.close().unwrap();

    assert_eq!(std::fs::read(&path).unwrap(), before, "the file is byte-identical");
    assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), modified);
    let pool = Pool::open(&path).unwrap();
    assert!(!pool.header().clean_shutdown, "the view's clean close stayed in the view");
    assert_eq!(pool.header().sequence, seq);
}

#[test]
fn a_private_view_never_writes_its_file() {
    private_view_on(shm_dir().path());
    private_view_on(disk_dir().path());
}

#[test]
fn private_views_share_the_lock_and_keep_writers_out() {
    let dir = shm_dir();
    let path = dir.path().join("pool");
    let (pool, _) = create(&path);
    // A writer has it open: a view would see its changes half-made.
    assert!(matches!(Pool::open_private(&path), Err(PoolError::Locked { .. })));
    pool.close().unwrap();
    let a = Pool::open_private(&path).unwrap();
    let b = Pool::open_private(&path).expect("views share the lock");
    assert!(matches!(Pool::open(&path), Err(PoolError::Locked { .. })));
    drop(a);
    assert!(matches!(Pool::open(&path), Err(PoolError::Locked { .. })));
    drop(b);
    Pool::open(&path).expect("the last view released the lock");
}

#[test]
fn a_private_view_validates_like_open() {
    let dir = shm_dir();
    let zeros = dir.path().join("zeros");
    std::fs::write(&zeros, vec![0u8; 1 << 20]).unwrap();
    assert!(matches!(Pool::open_private(&zeros), Err(PoolError::NotAPool { .. })));
    let path = dir.path().join("pool");
    drop(create(&path));
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut");
    std::fs::write(&cut, &bytes[..bytes.len() - 1]).unwrap();
    assert!(matches!(Pool::open_private(&cut), Err(PoolError::Truncated { .. })));
    let mut copy = read_copy(&path, 1);
    let newer = FORMAT_VERSION + 1;
    copy[8..12].copy_from_slice(&newer.to_le_bytes());
    reseal(&mut copy);
    patch(&path, HEADER_COPY_BYTES, &copy);
    assert!(
        matches!(Pool::open_private(&path), Err(PoolError::UnsupportedVersion { found, .. }) if found == newer)
    );
    let missing = dir.path().join("missing");
    assert!(matches!(Pool::open_private(&missing), Err(PoolError::Io { op: "open", .. })));
}

/// What a clean close saves comes back on the next open, checksummed; damage makes it absent
/// (the table crate then scans), and the first write after an open forgets it.
#[test]
fn saved_at_close_lifecycle() {
    let dir = shm_dir();
    let path = dir.path().join("pool");
    let (mut pool, h) = create(&path);
    let saved = Region { offset: h.heap_region.end(), bytes: REGION_ALIGN };
    pool.grow(saved.end()).unwrap();
    let bytes: Vec<u8> = (0..REGION_ALIGN).map(|i| (i * 7 % 251) as u8).collect();
    pool.region_mut(saved).copy_from_slice(&bytes);
    pool.close_saving(Some((saved, 42))).unwrap();

    let mut pool = Pool::open(&path).unwrap();
    assert!(pool.header().clean_shutdown);
    assert_eq!(pool.header().closed.saved, saved);
    assert_eq!(pool.saved_at_close(), Some((&bytes[..], 42)));
    pool.mark_dirty().unwrap();
    assert_eq!(pool.saved_at_close(), None);
    assert_eq!(pool.header().closed, host_pm::CloseRecord::default());
    assert!(pool.region(saved).iter().all(|&b| b == 0), "the saved region is discarded");
    drop(pool);
    // Reopened after a crash: nothing saved.
    let pool = Pool::open(&path).unwrap();
    assert_eq!(pool.saved_at_close(), None);

    // A close saving nothing records nothing; one whose bytes are damaged later reads as absent.
    pool.close().unwrap();
    assert_eq!(Pool::open(&path).unwrap().header().closed, host_pm::CloseRecord::default());
    let mut pool = Pool::open(&path).unwrap();
    pool.region_mut(saved).copy_from_slice(&bytes);
    pool.close_saving(Some((saved, 42))).unwrap();
    patch(&path, saved.offset + 100, &[bytes[100] ^ 1]);
    let pool = Pool::open(&path).unwrap();
    assert!(pool.header().clean_shutdown);
    assert_eq!(pool.saved_at_close(), None);
    // Closed unchanged, the record keeps its checksum: the damage is still found.
    pool.close_unchanged().unwrap();
    let pool = Pool::open(&path).unwrap();
    assert_eq!((pool.header().closed.saved, pool.header().closed.items), (saved, 42));
    assert_eq!(pool.saved_at_close(), None, "damaged bytes are not blessed by a close");
}

/// An open waits a moment for a holder that is letting the lock go (as a killed process's
/// mapping does while a GPU driver unpins it), then takes it.
#[test]
fn open_waits_for_a_lock_being_released() {
    let dir = shm_dir();
    let path = dir.path().join("pool");
    let (pool, _) = create(&path);
    let holder = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        drop(pool);
    });
    let start = std::time::Instant::now();
    let reopened = Pool::open(&path).expect("the lock is let go within the grace period");
    assert!(start.elapsed() >= std::time::Duration::from_millis(150), "{:?}", start.elapsed());
    holder.join().unwrap();
    drop(reopened);
}
