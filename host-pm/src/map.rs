//! The pool's memory: a file mapped shared at the start of address space reserved for its
//! growth, or memory of its own (anonymous, or a private copy of the file).
//!
//! A file pool grows by mapping its new bytes right after the old ones, inside the
//! reservation. Nothing mapped moves: a GPU's import of a region made before a growth stays
//! valid after it (a growth of 16 M keys released and imported its old table again), and the
//! pages already in the page tables stay there (a fresh mapping faulted every page in again,
//! one fault at a time as a GPU import pinned it). Only a growth past the reservation maps the
//! file anew, elsewhere.

use std::fs::File;
use std::io;
use std::ops::{Deref, DerefMut};
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use memmap2::MmapMut;

/// A file pool reserves address space for this many times its length, and at least
/// [`MIN_RESERVE`], at most [`MAX_RESERVE`] (or up to its growth limit, where it has one).
/// A reservation costs no memory (`PROT_NONE`, `MAP_NORESERVE`), but x86-64 gives a process
/// 128 TiB of address space: all the pools of a process reserve at most [`RESERVE_BUDGET`]
/// together (32 shards of 1 TiB reserve that), and a pool past it reserves its length alone.
const RESERVE_FACTOR: u64 = 16;
/// Small in unit tests, so that they grow past a reservation.
const MIN_RESERVE: u64 = if cfg!(test) { 4 << 20 } else { 16 << 30 };
const MAX_RESERVE: u64 = 4 << 40;
const RESERVE_BUDGET: u64 = 64 << 40;

/// Bytes all reservations hold now.
static RESERVED: AtomicU64 = AtomicU64::new(0);

/// Huge pages are entered in the page tables only at addresses aligned to them: the file's
/// mapping starts at such an address whatever the page size.
const MIN_ALIGN: usize = 2 << 20;

/// Each mapping made gets a number of its own ([`Map::id`]).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The pool's memory, as one slice of the bytes mapped.
pub(crate) struct Map {
    mem: Mem,
    id: u64,
}

enum Mem {
    /// Anonymous memory or a private copy: it grows by being copied.
    Own(MmapMut),
    /// A file, mapped shared from the start of a reservation.
    File(Reserved),
}

impl Map {
    /// Memory of its own.
    pub(crate) fn own(map: MmapMut) -> Map {
        Map { mem: Mem::Own(map), id: next_id() }
    }

    /// The first `len` bytes of `file`, mapped shared at the start of a reservation for
    /// `limit` bytes (none: [`RESERVE_FACTOR`] times `len`), aligned to `align` bytes (its
    /// page size). Where the address space is short, it reserves `len` bytes alone.
    pub(crate) fn file(file: &File, len: u64, limit: Option<u64>, align: u64) -> io::Result<Map> {
        let len = to_usize(len)?;
        let want = limit.unwrap_or(len as u64 * RESERVE_FACTOR).clamp(MIN_RESERVE, MAX_RESERVE);
        let held = RESERVED.load(Ordering::Relaxed);
        let want = if held.saturating_add(want) > RESERVE_BUDGET { len as u64 } else { want };
        let align = (align as usize).max(MIN_ALIGN);
        let reserved = Reserved::new(to_usize(want)?.max(len), align)
            .or_else(|e| {
                log::debug!("no address space reserved for the pool's growth ({e}): it moves as it grows");
                Reserved::new(len, align)
            })
            .and_then(|mut r| r.map(file, len).map(|()| r))?;
        Ok(Map { mem: Mem::File(reserved), id: next_id() })
    }

    /// The mapping's number: an import of its memory is valid with this number only.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The most bytes it maps without moving.
    pub(crate) fn reach(&self) -> usize {
        match &self.mem {
            Mem::Own(m) => m.len(),
            Mem::File(r) => r.reach(),
        }
    }

    /// Maps `file` up to its first `len` bytes where they are, if they are within
    /// [`Map::reach`] (false if they are not). Bytes already mapped stay as they are.
    pub(crate) fn extend(&mut self, file: &File, len: u64) -> io::Result<bool> {
        let len = to_usize(len)?;
        match &mut self.mem {
            Mem::File(r) if len <= r.reach() => r.map(file, len).map(|()| true),
            Mem::File(_) | Mem::Own(_) => Ok(len <= self.len()),
        }
    }

    /// Where the file's bytes from those mapped up to `len` would go, for another thread to
    /// map them ahead ([`Tail::map`]); none past the reservation, or for memory of its own.
    pub(crate) fn tail(&self, len: u64) -> Option<Tail> {
        let Mem::File(r) = &self.mem else { return None };
        let len = usize::try_from(len).ok()?;
        (len > r.mapped && len <= r.reach()).then(|| r.tail(len))
    }

    /// Takes in a [`Tail`] another thread mapped: the file is mapped up to its first `len` bytes.
    pub(crate) fn tail_mapped(&mut self, len: u64) {
        if let (Mem::File(r), Ok(len)) = (&mut self.mem, usize::try_from(len))
            && len > r.mapped
            && len <= r.reach()
        {
            r.mapped = len;
        }
    }

    /// `msync` of `len` bytes from `offset`, both within the mapping.
    pub(crate) fn flush_range(&self, offset: usize, len: usize) -> io::Result<()> {
        match &self.mem {
            Mem::Own(m) => m.flush_range(offset, len),
            Mem::File(r) => {
                assert!(
                    offset.checked_add(len).is_some_and(|end| end <= r.mapped),
                    "msync outside the mapping"
                );
                let page = offset % page_size();
                // SAFETY: a range of our own mapping, started at a page boundary.
                let rc = unsafe { libc::msync(r.base.add(offset - page).cast(), len + page, libc::MS_SYNC) };
                if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
            }
        }
    }
}

impl Deref for Map {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.mem {
            Mem::Own(m) => m,
            // SAFETY: the first `mapped` bytes of the reservation map the file, read-write.
            Mem::File(r) => unsafe { std::slice::from_raw_parts(r.base, r.mapped) },
        }
    }
}

impl DerefMut for Map {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.mem {
            Mem::Own(m) => m,
            // SAFETY: as in `deref`; `&mut self` makes the slice the only one.
            Mem::File(r) => unsafe { std::slice::from_raw_parts_mut(r.base, r.mapped) },
        }
    }
}

/// The system's page size.
fn page_size() -> usize {
    // SAFETY: plain system call.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

fn to_usize(bytes: u64) -> io::Result<usize> {
    usize::try_from(bytes).map_err(|_| io::Error::from_raw_os_error(libc::ENOMEM))
}

/// Address space reserved (`PROT_NONE`), of which the first `mapped` bytes map a file.
struct Reserved {
    /// What `mmap` returned, unmapped on drop.
    raw: (*mut u8, usize),
    /// The aligned start.
    base: *mut u8,
    reserved: usize,
    mapped: usize,
    /// A stretch the reservation lost ([`Tail::map`]): the addresses from `.0` to `.1` may be
    /// another mapping's now, so nothing from `.0` on is mapped any more, and only what
    /// follows `.1` is unmapped on drop.
    lost: Arc<OnceLock<(usize, usize)>>,
}

// SAFETY: the reservation is plain memory owned by the pool, as a `MmapMut` is.
unsafe impl Send for Reserved {}
// SAFETY: `&self` gives read access only.
unsafe impl Sync for Reserved {}

impl Reserved {
    fn new(bytes: usize, align: usize) -> io::Result<Reserved> {
        let raw_len = bytes.checked_add(align).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        // SAFETY: a new anonymous mapping no one can touch (PROT_NONE).
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                raw_len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let raw = raw.cast::<u8>();
        // SAFETY: less than `align` bytes into the `bytes + align` just reserved.
        let base = unsafe { raw.add(raw.align_offset(align)) };
        RESERVED.fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(Reserved { raw: (raw, raw_len), base, reserved: bytes, mapped: 0, lost: Default::default() })
    }

    /// The bytes from `base` it may map: up to a lost stretch, if it lost one.
    fn reach(&self) -> usize {
        self.lost.get().map_or(self.reserved, |&(start, _)| start - self.base as usize)
    }

    /// The stretch that maps the file from `mapped` up to `len` bytes (within [`Reserved::reach`]).
    fn tail(&self, len: usize) -> Tail {
        Tail {
            at: self.base as usize + self.mapped,
            offset: self.mapped as u64,
            len: len - self.mapped,
            lost: self.lost.clone(),
        }
    }

    /// Maps the file up to its first `len` bytes (within [`Reserved::reach`]).
    fn map(&mut self, file: &File, len: usize) -> io::Result<()> {
        if len > self.mapped {
            // SAFETY: the reservation lives in `self`, and `&mut self` keeps others out of it.
            unsafe { self.tail(len).map(file)? };
            self.mapped = len;
        }
        Ok(())
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        let (start, end) = (self.raw.0 as usize, self.raw.0 as usize + self.raw.1);
        let ours = match self.lost.get() {
            Some(&(from, to)) => [(start, from), (to, end)],
            None => [(start, end), (end, end)],
        };
        for (from, to) in ours.into_iter().filter(|(from, to)| to > from) {
            // SAFETY: stretches of the reservation, ours; no slice of them outlives the pool.
            unsafe { libc::munmap(from as *mut libc::c_void, to - from) };
        }
        RESERVED.fetch_sub(self.reserved as u64, Ordering::Relaxed);
    }
}

/// A stretch of a reservation that maps the file from `offset` on ([`Map::tail`]).
pub(crate) struct Tail {
    at: usize,
    offset: u64,
    len: usize,
    /// The reservation's record of a stretch it lost.
    lost: Arc<OnceLock<(usize, usize)>>,
}

impl Tail {
    /// Maps the file there, read-write and shared; returns where (its address and length).
    ///
    /// # Safety
    /// The reservation must outlive the mapping's use, and no other thread may map or use that
    /// stretch meanwhile (the pool waits for the thread that maps it before it maps, reads
    /// or unmaps anything past what it has mapped).
    pub(crate) unsafe fn map(&self, file: &File) -> io::Result<(usize, usize)> {
        let offset =
            libc::off_t::try_from(self.offset).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        // SAFETY: replaces part of the reservation (the caller's contract) with the file.
        // `MAP_NORESERVE`: hugetlbfs takes no huge pages ahead for it (its pages are made, or
        // refused, before they are used), so that a shortage cannot fail the call.
        let at = unsafe {
            libc::mmap(
                self.at as *mut libc::c_void,
                self.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_NORESERVE,
                file.as_raw_fd(),
                offset,
            )
        };
        if at == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            self.reserve_again();
            return Err(e);
        }
        Ok((at as usize, self.len))
    }
}

impl Tail {
    /// After a failed `MAP_FIXED`, which may have unmapped the stretch without mapping it
    /// (Linux leaves a gap where a file's mapping fails after the old range went): reserves it
    /// again where nothing has taken it; else (something is mapped there, ours or not) records
    /// it lost, so that nothing maps or unmaps there again and the pool moves as it grows.
    fn reserve_again(&self) {
        // SAFETY: `MAP_FIXED_NOREPLACE` takes the stretch only where it is free, and what it
        // takes is `PROT_NONE`.
        let again = unsafe {
            libc::mmap(
                self.at as *mut libc::c_void,
                self.len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if again as usize == self.at {
            return;
        }
        if again != libc::MAP_FAILED {
            // A kernel without `MAP_FIXED_NOREPLACE` put it elsewhere.
            // SAFETY: what this call just mapped.
            unsafe { libc::munmap(again, self.len) };
        }
        log::warn!(
            "the pool gave up part of the address space reserved for its growth: it moves as it grows"
        );
        let _ = self.lost.set((self.at, self.at + self.len));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stretch whose mapping fails is given up where it may not be the reservation's any
    /// more: the reach stops before it, a growth past it is not made in place, and what is
    /// mapped stays as it was.
    #[test]
    fn a_stretch_that_fails_to_map_is_given_up() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(dir.path().join("pool"))
            .unwrap();
        file.set_len(1 << 20).unwrap();
        let mut map = Map::file(&file, 64 << 10, None, 4096).unwrap();
        map[10] = 7;
        assert!(map.reach() >= 1 << 20);
        let mut tail = map.tail(128 << 10).unwrap();
        // Not a multiple of the page size: the kernel refuses the mapping.
        tail.offset += 1;
        // SAFETY: the reservation outlives the call, and nothing else maps there.
        assert!(unsafe { tail.map(&file) }.is_err());
        assert_eq!(map.reach(), 64 << 10, "the reach stops at the stretch given up");
        assert!(map.tail(128 << 10).is_none());
        assert!(!map.extend(&file, 128 << 10).unwrap(), "no growth in place past it");
        assert!(map.extend(&file, 64 << 10).unwrap());
        assert_eq!((map.len(), map[10]), (64 << 10, 7));
    }
}
