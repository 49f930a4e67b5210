//! A pool on a file system that cannot give it more room: the insertion that needs growth is
//! refused with `OutOfSpace` (not an I/O error that poisons the index), nothing acknowledged is
//! lost, and the table keeps serving reads, updates, deletes and the insertions that fit; once
//! there is room again, it grows.
//!
//! The file system is made "full" for the pool with `RLIMIT_FSIZE` (no privilege needed):
//! extending a file past it fails with `EFBIG`, as a full disk fails with `ENOSPC`. The limit
//! holds for the whole process, so this file has one test and runs alone in its process.

mod common;

use common::oracle::Oracle;
use gphash::{Config, Error, GpHash, GpuOptions, PoolError, Status};

/// Sets the soft file size limit of this process (`None`: back to the hard limit).
fn file_size_limit(bytes: Option<u64>) {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain system calls with a valid pointer to a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim), 0);
        lim.rlim_cur = bytes.map_or(lim.rlim_max, |b| b.min(lim.rlim_max));
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
    }
}

#[test]
fn a_full_file_system_refuses_growth_and_loses_nothing() {
    // Writing past the limit would otherwise kill the process with SIGXFSZ.
    // SAFETY: ignoring a signal installs no handler code.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let dir = common::pool_dir();
    for (name, options) in
        [("gpu", common::gpu_options(GpuOptions::default())), ("cpu", common::cpu_options())]
    {
        let path = dir.path().join(name);
        // Large enough that other files the process writes (a driver's shader cache) fit.
        let t = GpHash::create(Some(&path), &Config { capacity: 300_000, ..Default::default() }, &options)
            .unwrap();
        let size = t.stats().pool_bytes;
        // Drivers may back their buffers with files the limit also caps (Mesa 25's lavapipe
        // allocates memfds, descriptor pools' too): the batch buffers of both engine slots,
        // and a small batch's (its operations in host memory, its descriptor sets for submits
        // recorded with Vulkan itself), exist before it is set.
        let warm: Vec<u8> = (0..20_000u64).flat_map(|k| common::key(k, 8)).collect();
        for _ in 0..2 {
            t.get(&warm).unwrap();
            t.get(&warm[..8]).unwrap();
        }
        file_size_limit(Some(size));
        let mut oracle = Oracle::default();
        let (mut refused, mut k) = (None, 0u64);
        while refused.is_none() && k < 1_000_000 {
            let mut batch = t.batch();
            for _ in 0..20_000 {
                batch.insert(&common::key(k, 8), &k.to_le_bytes()).unwrap();
                k += 1;
            }
            match t.execute(&batch) {
                Ok(r) => {
                    assert!(r.statuses.iter().all(|&s| s == Status::Ok), "{name}");
                    oracle.run(&batch);
                }
                Err(Error::Pool(PoolError::OutOfSpace { limit, .. })) => {
                    assert_eq!(limit, size, "{name}: the pool could not grow past its length");
                    refused = Some(batch);
                }
                Err(e) => panic!("{name}: {e}"),
            }
        }
        let refused = refused.unwrap_or_else(|| panic!("{name}: the table never needed to grow"));
        let stats = t.stats();
        assert_eq!((stats.poisoned, stats.pool_bytes), (None, size), "{name}");
        assert_eq!(t.len(), oracle.map.len() as u64, "{name}");
        let mut entries = t.entries();
        entries.sort();
        let mut want: Vec<_> = oracle.map.clone().into_iter().collect();
        want.sort();
        assert!(entries == want, "{name}: the acknowledged keys changed");
        // Still serving: a read, an update, a delete, an insertion that fits.
        let (first, second) = (common::key(0, 8), common::key(1, 8));
        assert_eq!(t.get(&first).unwrap().value(0), Some(&0u64.to_le_bytes()[..]), "{name}");
        assert_eq!(t.update(&first, &[9; 8]).unwrap(), vec![Status::Ok], "{name}");
        assert_eq!(t.get(&first).unwrap().value(0), Some(&[9; 8][..]), "{name}");
        assert_eq!(t.delete(&second).unwrap(), vec![Status::Ok], "{name}");
        assert_eq!(t.insert(&second, &[7; 8]).unwrap(), vec![Status::Ok], "{name}");
        assert!(t.check().ok(), "{name}: {}", t.check());
        // Room again: the refused batch now grows the table.
        file_size_limit(None);
        assert!(t.execute(&refused).unwrap().statuses.iter().all(|&s| s == Status::Ok), "{name}");
        assert!(t.stats().pool_bytes > size, "{name}: the pool grew");
        t.close().unwrap();
        let t = GpHash::open(&path, &common::cpu_options()).unwrap();
        assert!(t.check().ok(), "{name}");
        assert_eq!(t.get(&first).unwrap().value(0), Some(&[9; 8][..]), "{name}");
    }
}
