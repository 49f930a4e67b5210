//! A tmpfs pool that cannot get the room for a large growth (its new pages made on all host
//! threads) refuses it with `OutOfSpace` and keeps its length and contents. The file system is
//! made "full" for the pool with `RLIMIT_FSIZE` (no privilege needed): extending a file past it
//! fails with `EFBIG`, whether the growth was prepared ahead or not. The limit holds for the whole process, so this file has one test.

mod common;

use common::*;
use host_pm::{Backend, CreateOptions, Pool, PoolError};

#[test]
fn a_large_tmpfs_growth_without_room_is_refused_and_loses_nothing() {
    // SAFETY: ignoring a signal installs no handler code.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let dir = shm_dir();
    let path = dir.path().join("pool");
    let (h, total) = sample();
    let mut pool = Pool::create(Some(&path), total, &h, &CreateOptions::default()).unwrap();
    assert_eq!(pool.backend(), Backend::Tmpfs);
    pool.region_mut(h.heap_region).fill(0xAB);
    let big = total + (512 << 20);
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain system calls with a valid pointer to a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim), 0);
        let open = lim.rlim_cur;
        lim.rlim_cur = (total + (64 << 20)).min(lim.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
        // Prepared ahead, the growth fails on its thread; `grow` then tries and reports it.
        pool.prepare_growth(big);
        let err = pool.grow(big).unwrap_err();
        lim.rlim_cur = open;
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
        assert!(matches!(err, PoolError::OutOfSpace { .. }), "{err:?}");
    }
    assert_eq!(pool.len(), total);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), total, "the file keeps its length");
    assert!(pool.region(h.heap_region).iter().all(|&b| b == 0xAB), "contents kept");
    // (A growth with room is `tmpfs_growth_is_populated_in_parallel` in `pool.rs`: 512 MiB
    // of pages here could exceed a CI machine's /dev/shm.)
    pool.grow(total + (1 << 20)).unwrap();
    assert_eq!(pool.len(), total + (1 << 20), "a growth that fits still happens");
}
