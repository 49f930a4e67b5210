//! `HOST_PM_FORCE_FLUSH=1` puts tmpfs and file pools on the cache-line flush path.
//!
//! The variable is read when a pool is created or opened. Setting it inside this process would
//! race with other test threads, so the test re-runs itself in a child process with the
//! variable set, and the child checks the effect.

mod common;

use std::process::Command;

use common::*;
use host_pm::{Backend, CreateOptions, PersistMode, Pool};

#[test]
fn env_var_forces_flush_fence() {
    if std::env::var("HOST_PM_FORCE_FLUSH").as_deref() == Ok("1") {
        return with_force_flush();
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "env_var_forces_flush_fence", "--nocapture"])
        .env("HOST_PM_FORCE_FLUSH", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("1 passed"), "the child test did not run:\n{stdout}");
}

/// The child's checks.
fn with_force_flush() {
    let shm = shm_dir();
    let disk = disk_dir();
    let (h, total) = sample();
    for (dir, backend) in [(shm.path(), Backend::Tmpfs), (disk.path(), Backend::File)] {
        let path = dir.join("pool");
        let mut pool = Pool::create(Some(&path), total, &h, &CreateOptions::default()).unwrap();
        assert_eq!(pool.backend(), backend);
        if cfg!(target_arch = "x86_64") {
            assert_eq!(pool.persist_mode(), PersistMode::FlushFence);
            assert!(pool.persist_mode().to_string().ends_with("+sfence"));
        }
        pool.region_mut(h.table_region)[100] = 9;
        pool.persist_lines(&[h.table_region.offset / 64 + 1, 0, 0]).unwrap();
        pool.persist_range(h.table_region.offset, 4096).unwrap();
        pool.close().unwrap();
        let pool = Pool::open(&path).unwrap();
        if cfg!(target_arch = "x86_64") {
            assert_eq!(pool.persist_mode(), PersistMode::FlushFence, "open honours it too");
        }
        assert_eq!(pool.region(h.table_region)[100], 9);
        assert!(pool.header().clean_shutdown);
    }
    // Anonymous memory is volatile: flushing it would buy nothing.
    let pool = Pool::create(None, total, &h, &CreateOptions::default()).unwrap();
    assert_eq!(pool.persist_mode(), PersistMode::None);
}
