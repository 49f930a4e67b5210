//! Opening a pool from arbitrary bytes: decoding a header copy, then opening the bytes as a
//! whole pool file (recovery included) and checking it, must give a result or a typed error,
//! never a panic or an out-of-bounds access.
//!
//! Run: `cargo +nightly fuzz run open_pool` in this directory. The tests run the same code
//! over a corpus of mutated pools (`tests/persistence.rs`, `host-pm/tests/header.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = host_pm::decode_header(data, data.len() as u64);
    let dir = std::path::Path::new("/dev/shm");
    let path = dir.join(format!("gphash-fuzz-{}.pool", std::process::id()));
    if std::fs::write(&path, data).is_ok() {
        let options = gphash::Options { executor: gphash::Executor::Cpu, ..Default::default() };
        if let Ok(index) = gphash::GpHash::open(&path, &options) {
            let _ = index.check();
        }
        let _ = std::fs::remove_file(&path);
    }
});
