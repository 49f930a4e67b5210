//! Persist primitives: cache-line flushes, fences, and the page runs that `msync` needs.

use std::fmt;
use std::sync::OnceLock;

use crate::{Backend, LINE_BYTES};

/// How a pool makes its writes durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PersistMode {
    /// Flush each dirty cache line (`clwb`, else `clflushopt`, else `clflush`), then one `sfence`.
    FlushFence,
    /// `msync(MS_SYNC)` of the pages covering the dirty bytes.
    Msync,
    /// A sequentially consistent fence: the memory itself survives a process crash (tmpfs).
    Fence,
    /// Nothing: volatile memory.
    None,
}

impl fmt::Display for PersistMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PersistMode::FlushFence => match flush_instr() {
                Some(instr) => write!(f, "{}+sfence", instr.name()),
                None => f.write_str("flush+sfence"),
            },
            PersistMode::Msync => f.write_str("msync"),
            PersistMode::Fence => f.write_str("fence"),
            PersistMode::None => f.write_str("none"),
        }
    }
}

/// The cache-line write-back instruction in use, best first.
// Only x86_64 constructs these; other targets never choose a flush.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FlushInstr {
    /// Writes the line back and may keep it cached.
    Clwb,
    /// Writes back and evicts; weakly ordered, so many can be in flight.
    Clflushopt,
    /// Writes back and evicts; serialised, the slowest.
    Clflush,
}

impl FlushInstr {
    pub(crate) fn name(self) -> &'static str {
        match self {
            FlushInstr::Clwb => "clwb",
            FlushInstr::Clflushopt => "clflushopt",
            FlushInstr::Clflush => "clflush",
        }
    }
}

/// The best flush instruction of this CPU, detected once; `None` off x86_64.
pub(crate) fn flush_instr() -> Option<FlushInstr> {
    static DETECTED: OnceLock<Option<FlushInstr>> = OnceLock::new();
    *DETECTED.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Option<FlushInstr> {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // Leaf 0 gives the highest standard leaf; leaf 7 may be missing on old CPUs.
    let max_leaf = __cpuid(0).eax;
    let ebx7 = if max_leaf >= 7 { __cpuid_count(7, 0).ebx } else { 0 };
    Some(if ebx7 & (1 << 24) != 0 {
        FlushInstr::Clwb
    } else if ebx7 & (1 << 23) != 0 {
        FlushInstr::Clflushopt
    } else {
        // clflush is part of SSE2, which every x86_64 CPU has.
        FlushInstr::Clflush
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Option<FlushInstr> {
    None
}

/// The persist mode a backend gets by default. `force_flush` (`HOST_PM_FORCE_FLUSH=1`) makes
/// tmpfs and file pools flush cache lines too, so that path runs without real PM.
pub(crate) fn default_mode(backend: Backend, force_flush: bool, flush: Option<FlushInstr>) -> PersistMode {
    match (backend, flush) {
        (Backend::DevDax, Some(_)) => PersistMode::FlushFence,
        (Backend::Tmpfs | Backend::File, Some(_)) if force_flush => PersistMode::FlushFence,
        // Without a flush instruction we cannot reach the persistence domain from user space:
        // a fence is the best a devdax mapping gets (the pool warns about it).
        (Backend::DevDax | Backend::Tmpfs, _) => PersistMode::Fence,
        (Backend::File, _) => PersistMode::Msync,
        (Backend::Anonymous, _) => PersistMode::None,
    }
}

/// True when the environment asks for cache-line flushes on tmpfs and file pools.
pub(crate) fn force_flush_from_env() -> bool {
    std::env::var_os("HOST_PM_FORCE_FLUSH").is_some_and(|v| v == "1")
}

/// Write back every cache line that overlaps `mem` (no fence: the caller fences once).
#[cfg(target_arch = "x86_64")]
pub(crate) fn flush_lines(instr: FlushInstr, mem: &[u8]) {
    use std::arch::asm;
    let start = mem.as_ptr() as usize & !(LINE_BYTES as usize - 1);
    let end = mem.as_ptr() as usize + mem.len();
    for addr in (start..end).step_by(LINE_BYTES as usize) {
        let p = addr as *const u8;
        // SAFETY: `p` is the start of a cache line holding a byte of `mem`; lines never cross
        // a page, so the line is mapped. Write-back instructions change no memory contents.
        // The asm is not `nomem`, so the compiler keeps earlier stores before it.
        unsafe {
            match instr {
                FlushInstr::Clwb => {
                    asm!("clwb [{0}]", in(reg) p, options(nostack, preserves_flags))
                }
                FlushInstr::Clflushopt => {
                    asm!("clflushopt [{0}]", in(reg) p, options(nostack, preserves_flags))
                }
                FlushInstr::Clflush => {
                    asm!("clflush [{0}]", in(reg) p, options(nostack, preserves_flags))
                }
            }
        }
    }
}

/// Off x86_64 no flush is ever chosen ([`flush_instr`] is `None`); keep the call sites simple.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn flush_lines(_instr: FlushInstr, _mem: &[u8]) {}

/// Order all earlier flushes and stores before any later store.
pub(crate) fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence only orders memory operations; SSE is part of the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// The system page size.
pub(crate) fn page_size() -> u64 {
    static PAGE: OnceLock<u64> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf reads a constant of the running system.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        u64::try_from(p).ok().filter(|&p| p >= LINE_BYTES).unwrap_or(4096)
    })
}

/// Merge 64-byte line indices (unsorted, duplicates allowed) into runs of whole pages:
/// `(byte offset, byte length)`, sorted, each run a maximal stretch of adjacent dirty pages.
/// `page_bytes` is a power of two of at least [`LINE_BYTES`].
pub(crate) fn page_runs(lines: &[u64], page_bytes: u64) -> Vec<(u64, u64)> {
    let lines_per_page = page_bytes / LINE_BYTES;
    let mut pages: Vec<u64> = lines.iter().map(|l| l / lines_per_page).collect();
    pages.sort_unstable();
    pages.dedup();
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for page in pages {
        match runs.last_mut() {
            Some((first, count)) if *first + *count == page => *count += 1,
            _ => runs.push((page, 1)),
        }
    }
    runs.into_iter().map(|(first, count)| (first * page_bytes, count * page_bytes)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_runs_merge() {
        assert_eq!(page_runs(&[], 4096), vec![]);
        // Lines 0..64 are page 0, 64..128 page 1, ...
        assert_eq!(page_runs(&[0], 4096), vec![(0, 4096)]);
        assert_eq!(page_runs(&[63, 0, 5, 5], 4096), vec![(0, 4096)]);
        assert_eq!(page_runs(&[64, 0], 4096), vec![(0, 8192)]);
        assert_eq!(
            // Pages 3, 1, 0, 2, 2, 15, 1.
            page_runs(&[200, 64, 0, 130, 129, 1000, 64], 4096),
            vec![(0, 4 * 4096), (15 * 4096, 4096)]
        );
        // Larger pages merge more lines.
        assert_eq!(page_runs(&[0, 1023, 1024], 65536), vec![(0, 2 * 65536)]);
    }

    #[test]
    fn page_runs_match_brute_force() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for round in 0..200 {
            let n = round % 40;
            let lines: Vec<u64> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % 2048
                })
                .collect();
            let runs = page_runs(&lines, 4096);
            let mut dirty = [false; 2048 / 64];
            for &l in &lines {
                dirty[(l / 64) as usize] = true;
            }
            let mut covered = [false; 2048 / 64];
            for w in runs.windows(2) {
                assert!(w[0].0 + w[0].1 < w[1].0, "runs {runs:?} not maximal/sorted");
            }
            for &(off, len) in &runs {
                assert_eq!((off % 4096, len % 4096), (0, 0));
                for p in off / 4096..(off + len) / 4096 {
                    covered[p as usize] = true;
                }
            }
            assert_eq!(dirty, covered, "lines {lines:?}");
        }
    }

    #[test]
    fn modes_per_backend() {
        let flush = Some(FlushInstr::Clwb);
        assert_eq!(default_mode(Backend::DevDax, false, flush), PersistMode::FlushFence);
        assert_eq!(default_mode(Backend::Tmpfs, false, flush), PersistMode::Fence);
        assert_eq!(default_mode(Backend::File, false, flush), PersistMode::Msync);
        assert_eq!(default_mode(Backend::Anonymous, false, flush), PersistMode::None);
        assert_eq!(default_mode(Backend::Tmpfs, true, flush), PersistMode::FlushFence);
        assert_eq!(default_mode(Backend::File, true, flush), PersistMode::FlushFence);
        assert_eq!(default_mode(Backend::Anonymous, true, flush), PersistMode::None);
        // No flush instruction (not x86_64).
        assert_eq!(default_mode(Backend::DevDax, false, None), PersistMode::Fence);
        assert_eq!(default_mode(Backend::File, true, None), PersistMode::Msync);
    }

    #[test]
    fn display_names() {
        let flush = PersistMode::FlushFence.to_string();
        assert!(
            ["clwb+sfence", "clflushopt+sfence", "clflush+sfence", "flush+sfence"].contains(&flush.as_str()),
            "{flush}"
        );
        assert_eq!(PersistMode::Msync.to_string(), "msync");
        assert_eq!(PersistMode::Fence.to_string(), "fence");
        assert_eq!(PersistMode::None.to_string(), "none");
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn flush_instructions_on_ordinary_memory() {
        assert!(flush_instr().is_some(), "x86_64 always has a flush");
        // Try every instruction this CPU has, not only the best one.
        let ebx7 = std::arch::x86_64::__cpuid_count(7, 0).ebx;
        let usable = [
            (FlushInstr::Clwb, ebx7 & (1 << 24) != 0),
            (FlushInstr::Clflushopt, ebx7 & (1 << 23) != 0),
            (FlushInstr::Clflush, true),
        ];
        let mut buf: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        for (instr, _) in usable.into_iter().filter(|&(_, has)| has) {
            buf[17] ^= 0xff;
            // Unaligned start and odd length: lines at both ends are partial.
            flush_lines(instr, &buf[3..9_999]);
            flush_lines(instr, &buf[..0]);
            store_fence();
            buf[17] ^= 0xff;
        }
        assert!(buf.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    }
}
