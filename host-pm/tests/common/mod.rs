//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)] // each test binary uses a different subset

use std::fs::OpenOptions;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;

use host_pm::{
    Backend, FORMAT_VERSION, HEADER_COPY_BYTES, Header, REGION_ALIGN, ResizeRecord, TableConfig,
    layout_regions,
};

/// Table region bytes of the sample pool.
pub const TABLE_BYTES: u64 = 4 * REGION_ALIGN;
/// Heap region bytes of the sample pool.
pub const HEAP_BYTES: u64 = 2 * REGION_ALIGN;

/// A valid header and the pool size it needs.
pub fn sample() -> (Header, u64) {
    let (table, heap, total) = layout_regions(TABLE_BYTES, HEAP_BYTES);
    let h = Header {
        version: FORMAT_VERSION,
        table: TableConfig {
            key_bytes: 8,
            value_bytes: 128,
            levels: 2,
            hashes: 2,
            slots: 8,
            top_level: 10,
            seed: 0x1234_5678_9abc_def0,
        },
        table_region: table,
        heap_region: heap,
        heap_cells: 1024,
        resize: ResizeRecord::default(),
        clean_shutdown: true, // create must force it to false
        sequence: 99,         // create must force it to 1
        user: [11, 22, 33, 44, 55, 66, 77, 88],
        closed: host_pm::CloseRecord::default(),
    };
    (h, total)
}

/// A temporary directory on tmpfs.
pub fn shm_dir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm").expect("tempdir on /dev/shm")
}

/// A temporary directory in the target dir, on the build machine's disk (not tmpfs).
pub fn disk_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir in CARGO_TARGET_TMPDIR")
}

/// A temporary directory under the system temp dir (/tmp).
pub fn tmp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// The backend a file in `dir` should get, from the file system type as statfs reports it.
pub fn expected_backend(dir: &Path) -> Backend {
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a valid C string and `st` a plain struct statfs fills in.
    let st = unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        assert_eq!(libc::statfs(c.as_ptr(), &mut st), 0, "statfs {}", dir.display());
        st
    };
    match st.f_type as u32 {
        0x0102_1994 | 0x9584_58f6 => Backend::Tmpfs,
        _ => Backend::File,
    }
}

/// Overwrite bytes of a file in place.
pub fn patch(path: &Path, offset: u64, bytes: &[u8]) {
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

/// Read one header copy of a pool file.
pub fn read_copy(path: &Path, slot: u64) -> Vec<u8> {
    let f = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; HEADER_COPY_BYTES as usize];
    f.read_exact_at(&mut buf, slot * HEADER_COPY_BYTES).unwrap();
    buf
}

/// Recompute the CRC of a header copy after editing it.
pub fn reseal(copy: &mut [u8]) {
    let n = copy.len() - 4;
    let crc = crc32fast::hash(&copy[..n]);
    copy[n..].copy_from_slice(&crc.to_le_bytes());
}

/// Sequence number stored in a raw header copy (bytes 16..24).
pub fn raw_sequence(copy: &[u8]) -> u64 {
    u64::from_le_bytes(copy[16..24].try_into().unwrap())
}

/// xorshift64*: a tiny deterministic generator for fuzz-style loops.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
