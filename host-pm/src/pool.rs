//! The pool: creation, opening, locking, A/B header writes, persistence, growth.

use std::cmp::Reverse;
use std::ffi::CString;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering, fence};

use memmap2::{MmapMut, MmapOptions};

use crate::map::{Map, Tail};

use crate::backend::{self, Backend, FileInfo, io_err};
use crate::header::{CopyError, Extras, HEADER_COPY_BYTES, Header, decode_raw, encode_raw, validate_header};
use crate::persist::{self, FlushInstr, PersistMode};
use crate::{CloseRecord, HEADER_AREA, LINE_BYTES, PoolError, REGION_ALIGN, Region, Result};

/// One header copy's size as an index.
const COPY: usize = HEADER_COPY_BYTES as usize;

/// Options of [`Pool::create`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreateOptions {
    /// Growth limit in bytes (rounded down to [`REGION_ALIGN`]); `None` = unlimited. Stored in
    /// the header, so it holds after reopening.
    pub max_bytes: Option<u64>,
}

/// The persist primitive in use, with the flush instruction resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Persist {
    Flush(FlushInstr),
    Msync,
    Fence,
    None,
}

impl Persist {
    fn mode(self) -> PersistMode {
        match self {
            Persist::Flush(_) => PersistMode::FlushFence,
            Persist::Msync => PersistMode::Msync,
            Persist::Fence => PersistMode::Fence,
            Persist::None => PersistMode::None,
        }
    }
}

/// An open pool: a mapping of the whole pool, the lock on its file, and its current header.
///
/// Dropping a pool without [`Pool::close`] is what a crash looks like: nothing is written,
/// `clean_shutdown` stays false, and the lock goes with the file descriptor.
pub struct Pool {
    /// A growth's storage being made ahead ([`Pool::prepare_growth`]). Declared first: dropping
    /// the pool waits for it before anything else goes.
    preparing: Option<Preparing>,
    /// Regions being discarded on a thread of its own ([`Pool::discard_in_background`]).
    /// Dropping the pool waits for it too.
    discarding: Option<Discarding>,
    // Declared before `file`: the mapping holds a reference to the open file, and the flock is
    // released only when the last reference goes, so unmap first.
    map: Map,
    file: Option<File>,
    path: Option<PathBuf>,
    backend: Backend,
    persist: Persist,
    /// Pool length in bytes. The mapping may be longer (a devdax device is mapped whole).
    len: u64,
    /// Sizes are rounded up to this (REGION_ALIGN, or the huge page size on hugetlbfs).
    granule: u64,
    /// Size of the devdax device, the hard limit of growth.
    device_bytes: Option<u64>,
    /// Growth limit stored in the header.
    max_bytes: Option<u64>,
    header: Header,
    /// Header copy slot (0 or 1) that holds `header`; the next write goes to the other one.
    slot: usize,
    /// Called with the pool's bytes at every persist point (crash-consistency tests).
    observer: Option<Observer>,
    /// A private view ([`Pool::open_private`]): writes stay in this process, the file is
    /// never written.
    private: bool,
    /// Fault hooks of tests (feature `faults`; empty without it).
    #[cfg_attr(not(feature = "faults"), allow(dead_code))]
    faults: Faults,
}

/// The pool's fault hooks (feature `faults`).
struct Faults {
    /// Persist calls that succeed before every later one fails (`u64::MAX`: all succeed).
    #[cfg(feature = "faults")]
    persists_left: AtomicU64,
    /// What the next background discard waits for before it punches ([`Pool::hold_discards`]).
    #[cfg(feature = "faults")]
    discard_gate: Option<std::sync::Arc<std::sync::Barrier>>,
}

// Derivable only without the feature.
#[allow(clippy::derivable_impls)]
impl Default for Faults {
    fn default() -> Self {
        Faults {
            #[cfg(feature = "faults")]
            persists_left: AtomicU64::new(u64::MAX),
            #[cfg(feature = "faults")]
            discard_gate: None,
        }
    }
}

/// The storage of a growth, made on a thread of its own ([`Pool::prepare_growth`]): a file of
/// `bytes` once the thread returns `Ok`, `Ok(true)` where it mapped them in the pool's
/// reservation too. Dropping it waits for the thread.
struct Preparing {
    bytes: u64,
    /// The byte ranges inside the pool whose pages it made ([`Pool::prepare_room`]).
    holes: Vec<(u64, u64)>,
    thread: Option<std::thread::JoinHandle<Result<bool>>>,
}

impl Preparing {
    /// Whether its thread is still at work.
    fn running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Waits for the thread; the bytes it made, and whether it mapped them, if it made them.
    fn wait(&mut self) -> Option<(u64, bool)> {
        match self.thread.take()?.join() {
            Ok(Ok(mapped)) => Some((self.bytes, mapped)),
            Ok(Err(e)) => {
                log::debug!("the pool's growth was not prepared: {e}");
                None
            }
            Err(_) => {
                log::warn!("the thread preparing the pool's growth panicked");
                None
            }
        }
    }
}

impl Drop for Preparing {
    fn drop(&mut self) {
        self.wait();
    }
}

/// Holes being punched on a thread of its own ([`Pool::discard_in_background`]). Dropping it
/// waits for the thread.
struct Discarding(Option<std::thread::JoinHandle<()>>);

impl Discarding {
    /// Whether its thread may still be punching holes.
    fn running(&self) -> bool {
        self.0.as_ref().is_some_and(|t| !t.is_finished())
    }
}

impl Drop for Discarding {
    fn drop(&mut self) {
        if let Some(Err(_)) = self.0.take().map(std::thread::JoinHandle::join) {
            log::warn!("the thread discarding the pool's old regions panicked");
        }
    }
}

/// Punches a hole over `region` of `file`; where that fails the region stays allocated.
fn punch_hole(file: &File, region: Region) {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: plain syscall on an open descriptor; the caller keeps the range inside the file.
    let r = unsafe {
        libc::fallocate(file.as_raw_fd(), mode, region.offset as libc::off_t, region.bytes as libc::off_t)
    };
    if r != 0 {
        log::debug!(
            "punching a hole failed ({}); the region stays allocated",
            std::io::Error::last_os_error()
        );
    }
}

/// A function shown the whole pool at every persist point: after each `persist_*` call, header
/// write, growth and discard. Crash-consistency tests use it to snapshot the durable states.
pub type Observer = std::sync::Arc<dyn Fn(&[u8]) + Send + Sync>;

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("path", &self.path)
            .field("backend", &self.backend)
            .field("persist", &self.persist.mode())
            .field("len", &self.len)
            .field("max_bytes", &self.max_bytes())
            .field("header", &self.header)
            .field("private", &self.private)
            .finish()
    }
}

/// A header the caller handed in that cannot be stored.
fn refuse(e: PoolError) -> PoolError {
    PoolError::InvalidArgument(format!("refusing to store an invalid header: {e}"))
}

fn to_usize(bytes: u64) -> Result<usize> {
    usize::try_from(bytes)
        .map_err(|_| PoolError::InvalidArgument(format!("{bytes} bytes do not fit the address space")))
}

/// Name used in I/O errors of anonymous pools.
fn anon_path() -> PathBuf {
    PathBuf::from("<anonymous memory>")
}

/// An anonymous pool's memory. It takes RAM as it is written (`MAP_NORESERVE`): a large pool
/// of which a little is used costs that little, where an up-front reservation would refuse any
/// pool larger than RAM and swap.
fn map_anon(bytes: u64) -> Result<Map> {
    MmapOptions::new()
        .len(to_usize(bytes)?)
        .no_reserve_swap()
        .map_anon()
        .map(Map::own)
        .map_err(io_err(&anon_path(), "mmap"))
}

/// Which lock an opener takes on the pool's file.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lock {
    /// Writers: no one else may have the pool open.
    Exclusive,
    /// Private views: other views may look too, writers may not open.
    Shared,
}

/// How long an open waits for a pool's lock before it reports [`PoolError::Locked`]. The lock
/// belongs to the open file, which a mapping keeps: a process killed while a GPU driver had
/// its mapping pinned may hold the lock after it has been reaped, until the driver lets the
/// mapping go.
const LOCK_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// Take the pool's lock, waiting at most [`LOCK_GRACE`] for a holder to let it go.
fn lock(file: &File, path: &Path, kind: Lock) -> Result<()> {
    let op = match kind {
        Lock::Exclusive => libc::LOCK_EX,
        Lock::Shared => libc::LOCK_SH,
    };
    let start = std::time::Instant::now();
    loop {
        // SAFETY: flock on a descriptor that `file` keeps open; no memory is passed.
        if unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) } == 0 {
            if start.elapsed().as_millis() > 0 {
                log::debug!(
                    "waited {:.1} ms for the lock of {}",
                    start.elapsed().as_secs_f64() * 1e3,
                    path.display()
                );
            }
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) if start.elapsed() < LOCK_GRACE => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Some(libc::EWOULDBLOCK) => {
                return Err(PoolError::Locked { path: path.to_path_buf() });
            }
            _ => return Err(io_err(path, "lock")(err)),
        }
    }
}

/// Where a devdax device is mapped: at an address aligned to 1 GiB, the largest alignment a
/// device may ask for (its driver refuses a mapping that starts elsewhere).
const DEVDAX_ALIGN: u64 = 1 << 30;

/// Map `len` bytes of `file` shared, read-write, in address space reserved for growth up to
/// `limit` bytes (none: [`Map::file`] chooses), at an address aligned to `align` (the page size).
///
/// The mapping is only sound while no one truncates or rewrites the file behind our back; we
/// hold the exclusive flock, which every cooperating opener takes. A process that ignores the
/// lock and truncates the file can make accesses fault (SIGBUS), as with any shared mapping.
fn map_file(file: &File, len: u64, path: &Path, limit: Option<u64>, align: u64) -> Result<Map> {
    Map::file(file, len, limit, align).map_err(io_err(path, "mmap"))
}

/// A private, copy-on-write view of the pool in `file` (opened read-only): stores change this
/// process's copy of a page, never the file. A devdax device refuses private mappings, so its
/// pool (its first `pool_bytes`, read from the header) is copied into anonymous memory.
fn map_private(file: &File, info: &FileInfo, path: &Path) -> Result<Map> {
    let bytes = to_usize(info.bytes)?;
    if info.backend != Backend::DevDax {
        // SAFETY: as in `map_file`; the shared lock keeps cooperating writers out.
        return unsafe { MmapOptions::new().len(bytes).map_copy(file) }
            .map(Map::own)
            .map_err(io_err(path, "mmap"));
    }
    // SAFETY: as above; the read-only mapping lives until the copy is made.
    let device = unsafe { MmapOptions::new().len(bytes).map(file) }.map_err(io_err(path, "mmap"))?;
    let (_, x, _) = choose_header([&device[..COPY], &device[COPY..2 * COPY]], info.bytes, path)?;
    let len = to_usize(x.pool_bytes)?;
    let mut copy = MmapMut::map_anon(len).map_err(io_err(&anon_path(), "mmap"))?;
    copy.copy_from_slice(&device[..len]);
    Ok(Map::own(copy))
}

/// Give the file `bytes` of allocated storage so that running out of space is an error now,
/// not a SIGBUS on a later store into a hole. A tmpfs file's new pages are made on all host
/// threads ([`populate_tmpfs`]) when there are many: `posix_fallocate` zeroes them on one.
fn allocate(file: &File, path: &Path, bytes: u64, backend: Backend) -> Result<()> {
    if backend == Backend::Tmpfs && populate_tmpfs(file, path, bytes, None)? {
        return Ok(());
    }
    // From the file's length on: holes punched inside it (regions given back) stay holes until
    // a region takes them again (`Pool::take_room`).
    let from = file.metadata().map_err(io_err(path, "stat"))?.len() / 4096 * 4096;
    if from >= bytes {
        return Ok(());
    }
    match allocate_range(file, path, from, bytes) {
        Ok(true) => Ok(()),
        // File systems without fallocate (e.g. some tmpfs setups): a sparse extension will do.
        Ok(false) => file.set_len(bytes).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG) => out_of_space(file, bytes),
            _ => io_err(path, "set the length of")(e),
        }),
        Err(e) => Err(e),
    }
}

/// `posix_fallocate` of `[from, to)` of `file`: `Ok(false)` where the file system cannot
/// allocate ahead. A full file system, a quota or a file size limit (`RLIMIT_FSIZE`) is
/// `OutOfSpace`.
fn allocate_range(file: &File, path: &Path, from: u64, to: u64) -> Result<bool> {
    let (Ok(at), Ok(len)) = (libc::off_t::try_from(from), libc::off_t::try_from(to - from)) else {
        return Err(PoolError::InvalidArgument(format!("{to} bytes is too large a file")));
    };
    // SAFETY: plain system call on a descriptor `file` keeps open.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), at, len) } {
        0 => Ok(true),
        libc::EOPNOTSUPP | libc::EINVAL | libc::ENOSYS => Ok(false),
        libc::ENOSPC | libc::EDQUOT | libc::EFBIG => Err(out_of_space(file, to)),
        e => Err(io_err(path, "allocate")(std::io::Error::from_raw_os_error(e))),
    }
}

/// `needed` bytes of `file` that the file system has no room for: it keeps the length it has.
fn out_of_space(file: &File, needed: u64) -> PoolError {
    PoolError::OutOfSpace { needed, limit: file.metadata().map_or(0, |m| m.len()) }
}

/// Makes the pages of a tmpfs file's tail `[from, len)`, which no header names: a process
/// killed while its file grew ([`Pool::grow`], [`Pool::prepare_growth`]) may have left it
/// longer, its new pages not all made. The pool takes the whole file, and a later write into
/// a page never made would fault (`SIGBUS`) on a full tmpfs rather than fail with `OutOfSpace`.
/// Only where the file has pages missing (its allocated blocks fall short of its length), so
/// a clean open after a prepared growth costs a `stat`. Where there is no room, the tail stays
/// as it is, with a warning.
fn allocate_tail(file: &File, path: &Path, from: u64, len: u64) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = file.metadata() else { return };
    if meta.blocks() * 512 >= len {
        return;
    }
    match allocate_range(file, path, from, len) {
        Ok(true) => {}
        failed => log::warn!(
            "{}: the {} bytes past the pool's recorded length have pages missing and could not be made ({failed:?}); \
             a write there on a full tmpfs would fault",
            path.display(),
            len - from,
        ),
    }
}

/// Bytes a tmpfs file must gain before [`populate_tmpfs`] runs threads for them.
const PARALLEL_POPULATE_BYTES: u64 = if cfg!(test) { 1 << 20 } else { 256 << 20 };

/// Extends the tmpfs `file` to `bytes` and makes its new pages on all host threads (each
/// thread's range prefaulted for write, `MADV_POPULATE_WRITE`), so that a full tmpfs is an
/// error here (`OutOfSpace`, the file back at its length) rather than a SIGBUS later. `false`
/// (nothing changed) when the growth is small or the kernel predates `MADV_POPULATE_WRITE`
/// (Linux 5.14): `posix_fallocate` does it then.
///
/// `into`: the pool's reservation past what it maps, up to `bytes` ([`Map::tail`]). The file is
/// mapped there and stays mapped, its pages entered in the page tables the pool will use
/// (else a temporary mapping is used, and the pool's own faults the pages in again). Its
/// contract is that of [`crate::map::Tail::map`].
fn populate_tmpfs(file: &File, path: &Path, bytes: u64, into: Option<&Tail>) -> Result<bool> {
    let old = file.metadata().map_err(io_err(path, "stat"))?.len();
    if bytes < old + PARALLEL_POPULATE_BYTES {
        return Ok(false);
    }
    let page = 4096u64;
    let start = old / page * page;
    file.set_len(bytes).map_err(|e| match e.raw_os_error() {
        Some(libc::EFBIG) => PoolError::OutOfSpace { needed: bytes, limit: old },
        _ => io_err(path, "set the length of")(e),
    })?;
    let shrink =
        |e: PoolError| file.set_len(old).map_or_else(|t| io_err(path, "set the length of")(t), |()| e);
    let errors = match into {
        Some(tail) => {
            // SAFETY: the caller's contract; the tail lies inside the file now.
            let map = unsafe { tail.map(file) };
            populate_on_all_threads(map.map_err(io_err(path, "mmap")).map_err(shrink)?)
        }
        None => {
            // SAFETY: as `map_file`: we hold the exclusive lock, and the range lies inside the file.
            let map = unsafe { MmapOptions::new().offset(start).len(to_usize(bytes - start)?).map_mut(file) }
                .map_err(io_err(path, "mmap"))
                .map_err(shrink)?;
            populate_on_all_threads(stretch(&map))
        }
    };
    match errors.first() {
        None => Ok(true),
        // Unknown advice: an older kernel.
        Some(&libc::EINVAL) => file.set_len(old).map(|()| false).map_err(io_err(path, "set the length of")),
        // A page the tmpfs had no room for.
        Some(&libc::EFAULT | &libc::ENOMEM | &libc::ENOSPC) => {
            Err(shrink(PoolError::OutOfSpace { needed: bytes, limit: old }))
        }
        Some(&e) => Err(shrink(io_err(path, "populate")(std::io::Error::from_raw_os_error(e)))),
    }
}

/// Makes the pages of `range`, free space inside a tmpfs pool's mapping of `file` up to byte
/// `end`, and enters them in the page tables, on all host threads: `false` where the kernel
/// cannot (`posix_fallocate` must then), `OutOfSpace` where the tmpfs has no room.
fn populate_room(range: (usize, usize), (file, path): (&File, &Path), end: u64) -> Result<bool> {
    match populate_on_all_threads(range).first() {
        None => Ok(true),
        Some(&libc::EINVAL) => Ok(false),
        Some(&libc::EFAULT | &libc::ENOMEM | &libc::ENOSPC) => Err(out_of_space(file, end)),
        Some(&e) => Err(io_err(path, "populate")(std::io::Error::from_raw_os_error(e))),
    }
}

/// The address and length of `bytes`, for [`populate_on_all_threads`].
fn stretch(bytes: &[u8]) -> (usize, usize) {
    (bytes.as_ptr() as usize, bytes.len())
}

/// `MADV_POPULATE_WRITE` over the `len` bytes at `base`, a stretch of one of the pool's shared
/// mappings, on all host threads: the pages are made where missing and entered in the
/// mapping's page tables; no byte changes. The errors of the threads that failed.
fn populate_on_all_threads((base, len): (usize, usize)) -> Vec<i32> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Whole 2 MiB pages each, so that hugetlbfs (2 MiB pages, read as tmpfs) takes them too;
    // any other page size refuses the advice.
    let part = (len / threads).next_multiple_of(2 << 20).max(2 << 20);
    std::thread::scope(|scope| {
        let parts: Vec<_> = (0..len)
            .step_by(part)
            .map(|at| {
                let len = part.min(len - at);
                scope.spawn(move || {
                    // SAFETY: a range of a shared mapping of the caller's, prefaulted and nothing
                    // else (its bytes do not change).
                    let rc = unsafe {
                        libc::madvise((base + at) as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE)
                    };
                    if rc == 0 {
                        0
                    } else {
                        std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
                    }
                })
            })
            .collect();
        parts.into_iter().map(|t| t.join().unwrap_or(libc::EIO)).filter(|&e| e != 0).collect()
    })
}

/// Make a new directory entry durable.
fn sync_parent_dir(path: &Path) -> Result<()> {
    let dir = parent_dir(path);
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir, "sync directory"))
}

/// The directory a path's entry lives in.
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Open a new file without a name in `dir` (`O_TMPFILE`): it vanishes with its last descriptor
/// unless it is linked into a directory first.
fn open_unnamed(dir: &Path) -> std::io::Result<File> {
    OpenOptions::new().read(true).write(true).custom_flags(libc::O_TMPFILE).mode(0o666).open(dir)
}

/// Whether `open_unnamed` failed because the file system (or kernel) has no unnamed files.
fn unnamed_unsupported(e: &std::io::Error) -> bool {
    // Kernels before O_TMPFILE take it for O_DIRECTORY and answer EISDIR.
    matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL))
}

fn already_exists(path: &Path) -> PoolError {
    io_err(path, "create")(std::io::Error::from_raw_os_error(libc::EEXIST))
}

/// A new pool file while it is built: nobody sees it at its path until [`Staged::publish`]
/// links it there, which fails rather than replace whatever is there by then. A crash before
/// that leaves nothing (an unnamed file goes with its last descriptor) or, where the file
/// system has no unnamed files, a hidden temporary file that blocks no later create.
struct Staged {
    /// The temporary name of the file, where it has one; removed on drop.
    temp: Option<PathBuf>,
}

impl Staged {
    /// An unnamed file in `path`'s directory where the file system allows, else a named one.
    fn new(path: &Path) -> Result<(File, Staged)> {
        // The link at the end refuses an existing path too; this spares building a large file
        // only to find that out.
        if path.symlink_metadata().is_ok() {
            return Err(already_exists(path));
        }
        // An unnamed file is linked through its /proc/self/fd entry.
        if Path::new("/proc/self/fd").is_dir() {
            match open_unnamed(parent_dir(path)) {
                Ok(file) => return Ok((file, Staged { temp: None })),
                Err(e) if unnamed_unsupported(&e) => {}
                Err(e) => return Err(io_err(path, "create")(e)),
            }
        }
        Self::named(path)
    }

    /// A file under a hidden temporary name beside `path`.
    fn named(path: &Path) -> Result<(File, Staged)> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = path
            .file_name()
            .ok_or_else(|| PoolError::InvalidArgument(format!("{}: no file name", path.display())))?
            .to_string_lossy();
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let temp = parent_dir(path).join(format!(".{name}.{}-{n}.creating", std::process::id()));
            match OpenOptions::new().read(true).write(true).create_new(true).open(&temp) {
                Ok(file) => return Ok((file, Staged { temp: Some(temp) })),
                // Left by a killed process that had our pid.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err(path, "create")(e)),
            }
        }
    }

    /// Gives the complete file its name `path`, unless something is there already.
    fn publish(&self, file: &File, path: &Path) -> Result<()> {
        let linked = match &self.temp {
            Some(temp) => std::fs::hard_link(temp, path),
            None => {
                let from = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
                    .expect("a number holds no NUL byte");
                let to = CString::new(path.as_os_str().as_bytes())
                    .map_err(|_| PoolError::InvalidArgument("a path with a NUL byte".to_string()))?;
                // SAFETY: two NUL-terminated strings that outlive the call. The /proc entry
                // is a magic link to the open file, which AT_SYMLINK_FOLLOW links itself.
                let rc = unsafe {
                    libc::linkat(
                        libc::AT_FDCWD,
                        from.as_ptr(),
                        libc::AT_FDCWD,
                        to.as_ptr(),
                        libc::AT_SYMLINK_FOLLOW,
                    )
                };
                if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
            }
        };
        linked.map_err(io_err(path, "create"))
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        // Published or not, the temporary name has served.
        if let Some(temp) = &self.temp {
            let _ = std::fs::remove_file(temp);
        }
    }
}

/// Choose the header copy to trust: the intact copy (magic and checksum right) with the
/// highest sequence, ties to copy 0. If that copy fails validation the pool is reported, not
/// silently rolled back: an intact copy is never the product of a torn write, so an invalid
/// one means the file was damaged (e.g. truncated) after the header was written.
fn choose_header(copies: [&[u8]; 2], file_bytes: u64, path: &Path) -> Result<(Header, Extras, usize)> {
    let results = copies.map(|raw| decode_raw(raw, file_bytes));
    // A pool written by a newer format must not be touched, whatever the other copy says.
    for r in &results {
        if let Err(CopyError::Version(found)) = r {
            return Err(PoolError::UnsupportedVersion { found: *found, supported: crate::FORMAT_VERSION });
        }
    }
    let intact_sequence = |r: &std::result::Result<(Header, Extras), CopyError>| match r {
        Ok((h, _)) => Some(h.sequence),
        Err(CopyError::Invalid { sequence, .. }) => Some(*sequence),
        Err(_) => None,
    };
    let newest = (0..2)
        .filter_map(|i| intact_sequence(&results[i]).map(|s| (s, i)))
        .max_by_key(|&(s, i)| (s, Reverse(i)));
    let [r0, r1] = results;
    match newest {
        Some((_, slot)) => match if slot == 0 { r0 } else { r1 } {
            Ok((h, x)) => Ok((h, x, slot)),
            Err(CopyError::Invalid { sequence, error: PoolError::Corrupt { what } }) => {
                Err(PoolError::Corrupt { what: format!("header copy {slot} (sequence {sequence}): {what}") })
            }
            Err(CopyError::Invalid { error, .. }) => Err(error),
            // Not intact, so not chosen.
            Err(other) => Err(PoolError::Corrupt { what: other.reason() }),
        },
        None => match (r0, r1) {
            (Err(CopyError::BadMagic), Err(CopyError::BadMagic)) => {
                Err(PoolError::NotAPool { path: path.to_path_buf() })
            }
            (a, b) => {
                let reason =
                    |r: std::result::Result<_, CopyError>| r.err().map(|e| e.reason()).unwrap_or_default();
                Err(PoolError::Corrupt {
                    what: format!("no valid header copy: copy 0: {}; copy 1: {}", reason(a), reason(b)),
                })
            }
        },
    }
}

impl Pool {
    /// Create a pool of `bytes` (rounded up to [`REGION_ALIGN`]; to the huge page size on
    /// hugetlbfs) at `path`, write `header` (its `clean_shutdown` forced to false, `sequence`
    /// to 1) into both header copies, persist, and keep the pool locked.
    ///
    /// `path` must not exist, unless it is a devdax device (whose first `bytes` are then
    /// zeroed; a new file is zero already) or a directory. The file is built without a name
    /// (or under a hidden temporary one where the file system has no unnamed files) and
    /// linked at `path` only when complete, never over anything that appeared there meanwhile:
    /// a crash during creation leaves no file at `path`. A directory gets a pool in a file that
    /// has no name at all: it vanishes when the pool is dropped or the process ends, however
    /// it ends (for temporary tables; [`Pool::path`] is then the directory). `None` creates
    /// volatile anonymous memory. The
    /// caller lays out the header's regions, e.g. with [`crate::layout_regions`]; a header that
    /// does not validate against the pool size is refused ([`PoolError::InvalidArgument`]).
    pub fn create(path: Option<&Path>, bytes: u64, header: &Header, opts: &CreateOptions) -> Result<Pool> {
        let total = bytes
            .checked_next_multiple_of(REGION_ALIGN)
            .ok_or_else(|| PoolError::InvalidArgument(format!("pool size {bytes} is too large")))?;
        let mut h = *header;
        h.clean_shutdown = false;
        h.sequence = 1;
        validate_header(&h, total).map_err(refuse)?;
        let limit = opts.max_bytes.map(|m| m - m % REGION_ALIGN);
        check_limit(total, limit)?;
        let Some(path) = path else {
            let map = map_anon(total)?;
            let pool = Pool {
                preparing: None,
                discarding: None,
                map,
                file: None,
                path: None,
                backend: Backend::Anonymous,
                persist: Persist::None,
                len: total,
                granule: REGION_ALIGN,
                device_bytes: None,
                max_bytes: limit,
                header: h,
                slot: 0,
                observer: None,
                faults: Faults::default(),
                private: false,
            };
            return pool.format();
        };
        match std::fs::metadata(path) {
            Ok(m) if m.file_type().is_char_device() => Self::create_devdax(path, total, h, limit),
            Ok(m) if m.is_dir() => {
                let file = open_unnamed(path).map_err(|e| match unnamed_unsupported(&e) {
                    true => PoolError::InvalidArgument(format!(
                        "{}: this file system cannot hold an unnamed pool file (O_TMPFILE): {e}",
                        path.display()
                    )),
                    false => io_err(path, "create")(e),
                })?;
                Self::create_file(file, path, total, limit, h)
            }
            _ => Self::create_staged(path, Staged::new(path)?, total, limit, h),
        }
    }

    /// Builds the pool in the staged file and links it at `path` once it is complete.
    fn create_staged(
        path: &Path,
        (file, staged): (File, Staged),
        total: u64,
        limit: Option<u64>,
        h: Header,
    ) -> Result<Pool> {
        let pool = Self::create_file(file, path, total, limit, h)?;
        let file = pool.file.as_ref().expect("a file pool has its file");
        if pool.backend == Backend::File {
            // Contents and length durable before a name makes them reachable.
            file.sync_all().map_err(io_err(path, "sync"))?;
        }
        staged.publish(file, path)?;
        if pool.backend == Backend::File
            && let Err(e) = sync_parent_dir(path)
        {
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        Ok(pool)
    }

    /// Locks, sizes, maps and formats a new, empty pool file.
    fn create_file(file: File, path: &Path, total: u64, limit: Option<u64>, h: Header) -> Result<Pool> {
        lock(&file, path, Lock::Exclusive)?;
        let info = backend::probe(&file, path)?;
        let total = total
            .checked_next_multiple_of(info.granule)
            .ok_or_else(|| PoolError::InvalidArgument(format!("pool size {total} is too large")))?;
        check_limit(total, limit)?;
        allocate(&file, path, total, info.backend)?;
        let map = map_file(&file, total, path, limit, info.granule)?;
        Pool::assemble(map, file, path, info, total, limit, h).format()
    }

    fn create_devdax(path: &Path, total: u64, h: Header, limit: Option<u64>) -> Result<Pool> {
        let file = OpenOptions::new().read(true).write(true).open(path).map_err(io_err(path, "open"))?;
        lock(&file, path, Lock::Exclusive)?;
        let info = backend::probe(&file, path)?;
        check_limit(total, Some(info.bytes))?;
        // The device is mapped whole, so later growth needs no remapping.
        let map = map_file(&file, info.bytes, path, Some(info.bytes), DEVDAX_ALIGN)?;
        let mut pool = Pool::assemble(map, file, path, info, total, limit, h);
        // A device keeps old contents: zero the pool, durably, before a header points into it.
        pool.bytes_mut().fill(0);
        pool.persist_all()?;
        pool.format()
    }

    fn assemble(
        map: Map,
        file: File,
        path: &Path,
        info: FileInfo,
        len: u64,
        limit: Option<u64>,
        h: Header,
    ) -> Pool {
        let persist = match persist::default_mode(
            info.backend,
            persist::force_flush_from_env(),
            persist::flush_instr(),
        ) {
            PersistMode::FlushFence => persist::flush_instr().map_or(Persist::Fence, Persist::Flush),
            PersistMode::Msync => Persist::Msync,
            PersistMode::Fence => Persist::Fence,
            PersistMode::None => Persist::None,
        };
        if info.backend == Backend::DevDax && persist == Persist::Fence {
            log::warn!(
                "{}: no cache-line flush on this CPU; devdax writes are not durable across power loss",
                path.display()
            );
        }
        Pool {
            preparing: None,
            discarding: None,
            map,
            file: Some(file),
            path: Some(path.to_path_buf()),
            backend: info.backend,
            persist,
            len,
            granule: info.granule,
            device_bytes: (info.backend == Backend::DevDax).then_some(info.bytes),
            max_bytes: limit,
            header: h,
            slot: 0,
            observer: None,
            faults: Faults::default(),
            private: false,
        }
    }

    /// Write the current header into both copies and persist them (creation only).
    fn format(mut self) -> Result<Pool> {
        let raw = encode_raw(&self.header, self.extras());
        self.map[..COPY].copy_from_slice(&raw);
        self.map[COPY..2 * COPY].copy_from_slice(&raw);
        self.persist_range(0, 2 * HEADER_COPY_BYTES)?;
        log::info!(
            "created pool {} ({} bytes, backend {}, persist {})",
            self.display_path().display(),
            self.len,
            self.backend,
            self.persist_mode()
        );
        Ok(self)
    }

    /// Open an existing pool: take its exclusive lock ([`PoolError::Locked`] if held), map it
    /// shared, pick the newest intact header copy, and validate every field against the file
    /// size before returning. Never panics and never reads outside the file, whatever it holds.
    ///
    /// If the newest intact copy (right magic and checksum) fails validation, that error is
    /// returned rather than falling back to the older copy: only a damaged file produces it.
    pub fn open(path: &Path) -> Result<Pool> {
        Self::open_as(path, Lock::Exclusive)
    }

    /// Open an existing pool as a private view that never writes the file: the file is opened
    /// read-only and mapped copy-on-write (a devdax pool is copied into anonymous memory), so
    /// everything done to the pool (recovery, header writes, even [`Pool::close`]) stays in
    /// this process and is gone when it is dropped. Persisting does nothing; growth copies the
    /// view into anonymous memory; discarding leaves the bytes as they are. The header is
    /// chosen and validated as [`Pool::open`] does.
    ///
    /// It takes a shared lock: several views may be open at once, but not while a writer has
    /// the pool open ([`PoolError::Locked`]), whose changes the view would see half-made; and
    /// a writer cannot open the pool while a view is open.
    pub fn open_private(path: &Path) -> Result<Pool> {
        Self::open_as(path, Lock::Shared)
    }

    /// Opens for writing (exclusive lock) or as a private view (shared lock).
    fn open_as(path: &Path, kind: Lock) -> Result<Pool> {
        let private = kind == Lock::Shared;
        let file = OpenOptions::new().read(true).write(!private).open(path).map_err(io_err(path, "open"))?;
        lock(&file, path, kind)?;
        let info = backend::probe(&file, path)?;
        if info.bytes < HEADER_AREA {
            return Err(PoolError::Truncated { file_bytes: info.bytes, needed: HEADER_AREA });
        }
        let map = match (private, info.backend) {
            (true, _) => map_private(&file, &info, path)?,
            (false, Backend::DevDax) => map_file(&file, info.bytes, path, Some(info.bytes), DEVDAX_ALIGN)?,
            // Its growth limit is in the header, read from the mapping.
            (false, _) => map_file(&file, info.bytes, path, None, info.granule)?,
        };
        let (h, x, slot) = choose_header([&map[..COPY], &map[COPY..2 * COPY]], info.bytes, path)?;
        // A devdax pool is as long as its header says; a file pool is the whole file.
        let len = if info.backend == Backend::DevDax { x.pool_bytes } else { info.bytes };
        let max_bytes = (x.max_bytes != 0).then_some(x.max_bytes);
        if let Some(m) = max_bytes
            && len > m
        {
            return Err(PoolError::Corrupt {
                what: format!("the file has {len} bytes, more than its max_bytes {m}"),
            });
        }
        if !private && info.backend == Backend::Tmpfs && len > x.pool_bytes {
            allocate_tail(&file, path, x.pool_bytes, len);
        }
        let mut pool = Pool::assemble(map, file, path, info, len, max_bytes, h);
        pool.slot = slot;
        if private {
            pool.private = true;
            pool.persist = Persist::None;
        }
        log::info!(
            "opened pool {}{} ({} bytes, backend {}, persist {}, header copy {slot}, sequence {}, clean {})",
            path.display(),
            if private { " as a private view" } else { "" },
            len,
            pool.backend,
            pool.persist_mode(),
            h.sequence,
            h.clean_shutdown
        );
        Ok(pool)
    }

    /// The current header (the newest durable copy).
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Write a new header durably. Its `sequence` is set to the current one plus 1; it goes
    /// into the slot of the older copy and is persisted there, so the current copy stays intact
    /// until the new one is durable. A header that fails [`validate_header`] against the pool
    /// length is refused ([`PoolError::InvalidArgument`]) and nothing is written.
    pub fn write_header(&mut self, header: &Header) -> Result<()> {
        let mut h = *header;
        h.sequence = self
            .header
            .sequence
            .checked_add(1)
            .ok_or_else(|| PoolError::InvalidArgument("header sequence exhausted".to_string()))?;
        validate_header(&h, self.len).map_err(refuse)?;
        // A pool of an older readable version is upgraded by its first write.
        h.version = crate::FORMAT_VERSION;
        let slot = 1 - self.slot;
        let raw = encode_raw(&h, self.extras());
        let at = slot * COPY;
        self.map[at..at + COPY].copy_from_slice(&raw);
        self.persist_range(at as u64, HEADER_COPY_BYTES)?;
        self.header = h;
        self.slot = slot;
        Ok(())
    }

    /// What each copy stores beside the header.
    fn extras(&self) -> Extras {
        Extras {
            // A file may have an odd length if something else extended it; record whole units.
            pool_bytes: self.len - self.len % REGION_ALIGN,
            max_bytes: self.max_bytes.unwrap_or(0),
        }
    }

    /// The kind of memory behind the pool.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The persist primitive in use.
    pub fn persist_mode(&self) -> PersistMode {
        self.persist.mode()
    }

    /// Change the persist primitive, e.g. to measure its cost or to run without persistence.
    ///
    /// [`PersistMode::FlushFence`] needs a CPU flush instruction (x86_64);
    /// [`PersistMode::Msync`] needs a file. Weakening the mode weakens durability: that is
    /// the caller's choice.
    pub fn set_persist_mode(&mut self, mode: PersistMode) -> Result<()> {
        if self.private && mode != PersistMode::None {
            return Err(PoolError::InvalidArgument(format!(
                "a private view persists nothing, it cannot use {mode}"
            )));
        }
        self.persist = match mode {
            PersistMode::FlushFence => persist::flush_instr()
                .map(Persist::Flush)
                .ok_or_else(|| PoolError::InvalidArgument("this CPU has no cache-line flush".to_string()))?,
            PersistMode::Msync if self.file.is_none() => {
                return Err(PoolError::InvalidArgument(
                    "msync needs a file-backed pool, this one is anonymous".to_string(),
                ));
            }
            PersistMode::Msync => Persist::Msync,
            PersistMode::Fence => Persist::Fence,
            PersistMode::None => Persist::None,
        };
        Ok(())
    }

    /// Whether this is a private view ([`Pool::open_private`]) that never writes its file.
    pub fn is_private(&self) -> bool {
        self.private
    }

    /// The pool's file or device (the directory of a pool in an unnamed file); `None` for
    /// anonymous memory.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn display_path(&self) -> PathBuf {
        self.path.clone().unwrap_or_else(anon_path)
    }

    /// Pool length in bytes (what [`Pool::bytes`] covers).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when the pool has no bytes (never, for a created or opened pool).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Growth limit: the smaller of the stored `max_bytes` and, for devdax, the device size.
    pub fn max_bytes(&self) -> Option<u64> {
        match (self.max_bytes, self.device_bytes) {
            (Some(m), Some(d)) => Some(m.min(d)),
            (m, d) => m.or(d),
        }
    }

    /// Base of the mapping (page aligned). Invalidated by a [`Pool::grow`] that moves it.
    pub fn as_ptr(&self) -> *const u8 {
        self.map.as_ptr()
    }

    /// Mutable base of the mapping (page aligned). Invalidated by a [`Pool::grow`] that moves it.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// The mapping's address range and kind, for a thread that must know where the pool lies
    /// without touching its bytes (a GPU importing it while the owner keeps using it).
    pub fn mapping(&mut self) -> Mapping {
        Mapping {
            base: self.as_mut_ptr(),
            len: self.len,
            id: self.map.id(),
            backend: self.backend,
            persist: self.persist_mode(),
        }
    }

    /// The whole pool.
    pub fn bytes(&self) -> &[u8] {
        &self.map[..self.len as usize]
    }

    /// The whole pool, writable. Writes are durable only after a persist call.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len as usize;
        &mut self.map[..len]
    }

    /// Byte range of a region, checked against the pool.
    fn span(&self, r: Region) -> std::ops::Range<usize> {
        assert!(
            r.offset.checked_add(r.bytes).is_some_and(|end| end <= self.len),
            "region {r:?} is outside the pool of {} bytes",
            self.len
        );
        r.offset as usize..r.end() as usize
    }

    /// The bytes of a region. Panics if `r` is outside the pool (a bug of the caller: regions
    /// come from a validated header).
    pub fn region(&self, r: Region) -> &[u8] {
        let span = self.span(r);
        &self.map[span]
    }

    /// The bytes of a region, writable. Panics if `r` is outside the pool.
    pub fn region_mut(&mut self, r: Region) -> &mut [u8] {
        let span = self.span(r);
        &mut self.map[span]
    }

    fn msync(&self, start: u64, len: u64) -> Result<()> {
        self.map.flush_range(start as usize, len as usize).map_err(io_err(&self.display_path(), "msync"))
    }

    /// Persist mapping bytes `start..end` (already checked to be inside the mapping).
    fn persist_span(&self, start: u64, end: u64) -> Result<()> {
        match self.persist {
            Persist::Flush(instr) => {
                persist::flush_lines(instr, &self.map[start as usize..end as usize]);
                persist::store_fence();
            }
            Persist::Msync => self.msync(start, end - start)?,
            Persist::Fence => fence(Ordering::SeqCst),
            Persist::None => {}
        }
        Ok(())
    }

    /// Make `len` bytes at pool offset `offset` durable: flush each 64-byte line and fence once,
    /// `msync(MS_SYNC)` the covering pages, fence, or nothing, per [`Pool::persist_mode`].
    /// A range outside the pool is [`PoolError::InvalidArgument`].
    pub fn persist_range(&self, offset: u64, len: u64) -> Result<()> {
        self.injected_fault()?;
        let end = offset.checked_add(len).filter(|&end| end <= self.len).ok_or_else(|| {
            PoolError::InvalidArgument(format!(
                "persist range {offset:#x}+{len:#x} is outside the pool of {:#x} bytes",
                self.len
            ))
        })?;
        if len > 0 {
            self.persist_span(offset, end)?;
        }
        self.observe();
        Ok(())
    }

    /// Fault injection (feature `faults`): after `after` more successful persist calls
    /// (`persist_lines`, `persist_range`, `persist_all`), every one fails with an injected I/O
    /// error, as a failing `msync` would, and persists nothing; `None` ends the injection.
    #[cfg(feature = "faults")]
    pub fn fail_persists(&self, after: Option<u64>) {
        self.faults.persists_left.store(after.unwrap_or(u64::MAX), std::sync::atomic::Ordering::SeqCst);
    }

    /// Fault injection (feature `faults`): the next [`Pool::discard_in_background`] that runs
    /// on a thread punches nothing until it and another thread have both reached `gate` (a
    /// barrier of two), so that a test can show who waits for it.
    #[cfg(feature = "faults")]
    pub fn hold_discards(&mut self, gate: std::sync::Arc<std::sync::Barrier>) {
        self.faults.discard_gate = Some(gate);
    }

    /// The injected failure of this persist call, if [`Pool::fail_persists`] asked for one.
    fn injected_fault(&self) -> Result<()> {
        #[cfg(feature = "faults")]
        {
            use std::sync::atomic::Ordering::SeqCst;
            let left = self.faults.persists_left.load(SeqCst);
            if left == 0 {
                return Err(PoolError::Io {
                    path: self.path.clone().unwrap_or_default(),
                    op: "persist (injected fault)",
                    source: std::io::Error::other("injected persist failure"),
                });
            }
            if left != u64::MAX {
                self.faults.persists_left.store(left - 1, SeqCst);
            }
        }
        Ok(())
    }

    /// Shows the pool to the observer, if there is one.
    fn observe(&self) {
        if let Some(o) = &self.observer {
            o(&self.map[..self.len as usize]);
        }
    }

    /// Sets (or removes) the function shown the pool at every persist point.
    pub fn set_observer(&mut self, observer: Option<Observer>) {
        // Its snapshots must not race holes still being punched.
        drop(self.discarding.take());
        self.observer = observer;
    }

    /// Make the given 64-byte lines durable (line `i` = pool bytes `64 i .. 64 i + 64`). The
    /// list may be unsorted and hold duplicates. Flushes each line and fences once; with msync,
    /// merges the lines into runs of adjacent pages: one run is synced alone, several by one
    /// `fdatasync` of the file (one device flush instead of one per run).
    /// A line outside the pool is [`PoolError::InvalidArgument`] and nothing is persisted.
    pub fn persist_lines(&self, lines: &[u64]) -> Result<()> {
        self.injected_fault()?;
        let Some(&max) = lines.iter().max() else {
            // Nothing written, but a fence still orders what comes next.
            if self.persist == Persist::Fence {
                fence(Ordering::SeqCst);
            }
            self.observe();
            return Ok(());
        };
        let line_count = self.len.div_ceil(LINE_BYTES);
        if max >= line_count {
            return Err(PoolError::InvalidArgument(format!(
                "line {max} is outside the pool of {line_count} lines"
            )));
        }
        match self.persist {
            Persist::Flush(instr) => {
                for &line in lines {
                    let start = line * LINE_BYTES;
                    let end = (start + LINE_BYTES).min(self.len);
                    persist::flush_lines(instr, &self.map[start as usize..end as usize]);
                }
                persist::store_fence();
            }
            Persist::Msync => {
                // The mapping starts on a page boundary, so pool offsets and pages agree.
                let runs = persist::page_runs(lines, persist::page_size());
                match (runs.as_slice(), &self.file) {
                    // Every msync is a device cache flush (a journal commit on ext4): scattered
                    // lines as one msync per run cost a flush each (docs/lab/server.md, "The
                    // Redis-protocol server"). One fdatasync writes the same pages (and any
                    // other dirty page of the file, which is never wrong) with one flush.
                    ([_, _, ..], Some(file)) => {
                        file.sync_data().map_err(io_err(&self.display_path(), "fdatasync"))?
                    }
                    _ => {
                        for (start, len) in runs {
                            self.msync(start, len.min(self.len - start))?;
                        }
                    }
                }
            }
            Persist::Fence => fence(Ordering::SeqCst),
            Persist::None => {}
        }
        self.observe();
        Ok(())
    }

    /// Make the whole pool durable.
    pub fn persist_all(&self) -> Result<()> {
        self.persist_range(0, self.len)
    }

    /// Starts making the storage of a pool of `new_bytes` (rounded as [`Pool::grow`] rounds
    /// it) on a thread of its own, so that a later [`Pool::grow`] to at most that size finds it
    /// made. On tmpfs, making and zeroing a growth's pages is the largest part of what a growth
    /// costs (`docs/lab/growth-and-recovery.md`, "Growth and recovery of 16 M keys, 4 KiB and
    /// 2 MiB pages"); elsewhere there is nothing to gain (a disk file's `fallocate` is quick, a
    /// devdax device has its storage), and this does nothing. Nor for a private view, or past
    /// [`Pool::max_bytes`].
    ///
    /// The file grows, with zeroed pages, past the pool's length; the pool's length and bytes
    /// do not change. Where the growth maps in place ([`Pool::grows_in_place`]), the new pages
    /// are mapped past the pool's end too, ready for the growth. [`Pool::grow`] and dropping the
    /// pool wait for the thread first; one that failed (a full tmpfs) leaves the file as it
    /// was, and `grow` reports it.
    pub fn prepare_growth(&mut self, new_bytes: u64) {
        self.prepare(new_bytes, vec![]);
    }

    /// [`Pool::prepare_growth`] of the room `regions` will take ([`Pool::take_room`]): past
    /// the pool's end, and within it where a discard left holes, whose pages are made and
    /// entered in the page tables on all host threads too (made on one thread by `take_room`,
    /// and faulted in one at a time by an import, they slowed a growth whose heap went where an
    /// earlier growth left holes: docs/lab/growth-and-recovery.md, "Growth of 16 M keys in
    /// place: a mapping that never moves, room made ahead"). The holes are left to
    /// `take_room` while a discard may still be punching them.
    pub fn prepare_room(&mut self, regions: &[Region]) {
        let end = regions.iter().map(Region::end).max().unwrap_or(0);
        let punching = self.discarding.as_ref().is_some_and(Discarding::running);
        let holes = match punching {
            true => vec![],
            false => regions
                .iter()
                .filter(|r| r.offset < self.len && !r.is_empty())
                .map(|r| (r.offset, r.end().min(self.len)))
                .collect(),
        };
        self.prepare(end, holes);
    }

    /// [`Pool::prepare_room`] of the file up to `new_bytes` and of `holes` (byte ranges inside
    /// the pool), once: again only for more bytes or other holes.
    fn prepare(&mut self, new_bytes: u64, holes: Vec<(u64, u64)>) {
        let Some(new) = new_bytes.checked_next_multiple_of(self.granule) else { return };
        if self.backend != Backend::Tmpfs || self.private {
            return;
        }
        let prepared = self.preparing.as_ref().map_or(self.len, |p| p.bytes).max(self.len);
        let new = new.max(prepared);
        let same_holes = self.preparing.as_ref().map_or(holes.is_empty(), |p| p.holes == holes);
        // One still running is left to finish: the next call starts this one.
        if (new == prepared && same_holes) || self.preparing.as_ref().is_some_and(Preparing::running) {
            return;
        }
        if check_limit(new, self.max_bytes()).is_err() {
            return;
        }
        // Two threads must never extend the file at once; what the done one mapped is taken in.
        self.prepared();
        let (Some(file), Some(path)) = (&self.file, &self.path) else { return };
        let (file, path) = match file.try_clone() {
            Ok(file) => (file, path.clone()),
            Err(e) => {
                log::debug!("the pool's growth is not prepared: {e}");
                return;
            }
        };
        let tail = self.map.tail(new);
        let base = self.map.as_ptr() as usize;
        let ranges = holes.clone();
        let thread = std::thread::Builder::new().name("gphash-prepare".into()).spawn(move || {
            let t = std::time::Instant::now();
            for (start, end) in ranges {
                // Free space inside the pool's mapping, which stays in place and mapped until
                // this thread is done (`Pool::grow`, `Pool::take_room` and dropping the pool
                // wait for it); no region holds it, and no discard is punching it.
                populate_room((base + start as usize, (end - start) as usize), (&file, &path), end)?;
            }
            // SAFETY: the tail lies past what the pool maps, and the pool waits for this thread
            // before it maps, reads or unmaps anything there (`Pool::prepared`, and the field
            // order of `Pool`).
            let populated = populate_tmpfs(&file, &path, new, tail.as_ref())?;
            if !populated {
                allocate(&file, &path, new, Backend::Tmpfs)?;
            }
            log::debug!("storage for {new} bytes prepared in {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
            Ok(populated && tail.is_some())
        });
        match thread {
            Ok(thread) => self.preparing = Some(Preparing { bytes: new, holes, thread: Some(thread) }),
            Err(e) => log::debug!("the pool's growth is not prepared: no thread ({e})"),
        }
    }

    /// Grow the pool to `new_bytes` (rounded up to [`REGION_ALIGN`], or to the huge page
    /// size); the new bytes read as zero. A size not above the current length is a no-op.
    /// Storage [`Pool::prepare_growth`] made is used, once its thread is done; a
    /// [`Pool::discard_in_background`] is waited for first, whatever the size.
    ///
    /// The mapping moves only past [`Pool::grows_in_place`]: pointers and slices taken before
    /// are invalid then. Beyond
    /// [`Pool::max_bytes`] (a devdax pool cannot pass its device) the error is
    /// [`PoolError::OutOfSpace`]. The header is not changed: the caller records new regions
    /// with [`Pool::write_header`] once it has filled them.
    pub fn grow(&mut self, new_bytes: u64) -> Result<()> {
        // Even when the pool is long enough: the caller may take room where holes are punched.
        drop(self.discarding.take());
        let limit = self.max_bytes();
        let new = new_bytes
            .checked_next_multiple_of(self.granule)
            .ok_or(PoolError::OutOfSpace { needed: new_bytes, limit: limit.unwrap_or(u64::MAX) })?;
        if new <= self.len {
            return Ok(());
        }
        check_limit(new, limit)?;
        let prepared = self.prepared();
        let old = self.len;
        match (self.backend, &self.file, &self.path) {
            // A private view copies itself below, leaving the file as it is.
            (Backend::DevDax, _, _) if !self.private => {
                // Mapped whole at open: zero the new part durably, as a fresh file would read.
                self.map[old as usize..new as usize].fill(0);
                self.persist_span(old, new)?;
            }
            (Backend::Tmpfs | Backend::File, Some(file), Some(path)) if !self.private => {
                if prepared < new {
                    allocate(file, path, new, self.backend)?;
                }
                if self.backend == Backend::File {
                    // The new length must be durable before a header can point past the old one.
                    file.sync_data().map_err(io_err(path, "sync"))?;
                }
                self.remap(new)?;
            }
            _ => {
                // Anonymous memory or a private view (or a pool without its file, which
                // cannot happen): copy.
                let mut map = map_anon(new)?;
                map[..old as usize].copy_from_slice(&self.map[..old as usize]);
                self.map = map;
            }
        }
        self.len = new;
        self.observe();
        log::debug!("grew pool {} from {old} to {new} bytes", self.display_path().display());
        Ok(())
    }

    /// Maps the pool's file, now `new` bytes long, up to its end. Within the address space
    /// reserved for it ([`Pool::grows_in_place`]) the new bytes are mapped after the old ones
    /// and nothing moves: imports of the pool stay valid, and its pages stay in the page tables
    /// (a fresh mapping faulted every page in again, and an import of a region, which pins its
    /// pages one fault at a time where they are not mapped, was slow on 4 KiB pages:
    /// docs/lab/growth-and-recovery.md, "Growth of 16 M keys: imports made once, the mapping
    /// kept, the discard after the engine"). Past it, the file is mapped anew elsewhere. On
    /// tmpfs the new pages are entered in the page tables too, on all host threads, unless
    /// [`Pool::prepare_growth`] did it.
    fn remap(&mut self, new: u64) -> Result<()> {
        let (Some(file), Some(path)) = (&self.file, &self.path) else {
            return Err(PoolError::InvalidArgument("a pool without its file cannot be remapped".into()));
        };
        let old = self.map.len();
        if !self.map.extend(file, new).map_err(io_err(path, "mmap"))? {
            log::debug!("the pool outgrew the address space reserved for it: it is mapped anew");
            self.map = map_file(file, new, path, self.max_bytes(), self.granule)?;
        }
        // Not on hugetlbfs: a few huge pages cost their imports little to fault in, and entering
        // them took longer than it saved on a tmpfs of 2 MiB pages.
        if self.backend == Backend::Tmpfs && self.granule == REGION_ALIGN && self.map.len() > old {
            let errors = populate_on_all_threads(stretch(&self.map[old..]));
            if let Some(e) = errors.first() {
                log::debug!("the new pages were not all entered in the page tables (errno {e})");
            }
        }
        Ok(())
    }

    /// Waits for a growth being prepared ([`Pool::prepare_growth`]); the bytes of file it made
    /// (0 if none), which the mapping takes in where the thread mapped them.
    fn prepared(&mut self) -> u64 {
        match self.preparing.take().and_then(|mut p| p.wait()) {
            Some((bytes, mapped)) => {
                if mapped {
                    self.map.tail_mapped(bytes);
                }
                bytes
            }
            None => 0,
        }
    }

    /// Whether growing to `bytes` keeps the mapping where it is, so that whatever imported the
    /// pool's memory (a GPU) may keep it through [`Pool::grow`]: a file pool within the address
    /// space reserved for it, a devdax device within its size. Memory of the pool's own
    /// (anonymous, a private view) is copied as it grows.
    pub fn grows_in_place(&self, bytes: u64) -> bool {
        bytes <= self.len
            || bytes
                .checked_next_multiple_of(self.granule)
                .is_some_and(|b| usize::try_from(b).is_ok_and(|b| b <= self.map.reach()))
    }

    /// Give back the storage of a region that holds nothing any more (the regions a resize
    /// left behind): a hole is punched in file and tmpfs pools, anonymous pages are dropped; it
    /// reads as zeros afterwards. Devdax memory cannot be given back and is left as it is, and
    /// so is a private view.
    /// Where the filesystem cannot punch holes the region simply stays allocated.
    pub fn discard(&mut self, region: Region) -> Result<()> {
        self.check_discard(region)?;
        drop(self.discarding.take());
        if region.is_empty() {
            return Ok(());
        }
        match (self.backend, &self.file) {
            // A private view leaves the file, and so its own bytes, as they are.
            (Backend::Tmpfs | Backend::File, Some(file)) if !self.private => punch_hole(file, region),
            (Backend::Anonymous, _) => {
                // SAFETY: the range lies inside our own private anonymous mapping.
                unsafe {
                    libc::madvise(
                        self.map.as_mut_ptr().add(region.offset as usize).cast(),
                        region.bytes as usize,
                        libc::MADV_DONTNEED,
                    );
                }
            }
            _ => {}
        }
        self.observe();
        Ok(())
    }

    /// [`Pool::discard`] of `regions` on a thread of its own, where holes are punched in a file
    /// (punching those of a grown table's old regions held up a growth on `/dev/shm`:
    /// docs/lab/growth-and-recovery.md, "Growth of 16 M keys: imports made once, the mapping
    /// kept, the discard after the engine"). The regions must hold nothing any more; what is in
    /// them reads as it was or as zeros until the thread is done. [`Pool::grow`], [`Pool::discard`] and
    /// dropping the pool wait for it first: room for new regions is only ever taken through
    /// `grow` ([`Pool::take_room`]), so nothing is written where a hole is still being punched. Elsewhere, with an
    /// observer (whose snapshots would race the thread), or without a thread, this is `discard`.
    pub fn discard_in_background(&mut self, regions: &[Region]) -> Result<()> {
        self.discard_in_background_after(regions, ())
    }

    /// [`Pool::discard_in_background`], dropping `holding` first, on the same thread: what still
    /// holds the regions' memory and takes time to let it go (a GPU's import of a grown table's
    /// old regions, which unpins their pages).
    pub fn discard_in_background_after(
        &mut self,
        regions: &[Region],
        holding: impl Send + 'static,
    ) -> Result<()> {
        regions.iter().try_for_each(|&r| self.check_discard(r))?;
        drop(self.discarding.take());
        let file = match (self.backend, &self.file, self.private, &self.observer) {
            (Backend::Tmpfs | Backend::File, Some(file), false, None) => file.try_clone().ok(),
            _ => None,
        };
        let regions: Vec<Region> = regions.iter().copied().filter(|r| !r.is_empty()).collect();
        if let Some(file) = file {
            let punching = regions.clone();
            #[cfg(feature = "faults")]
            let gate = self.faults.discard_gate.take();
            // A thread the system refuses drops it here, with the closure.
            let thread = std::thread::Builder::new().name("gphash-discard".into()).spawn(move || {
                drop(holding);
                #[cfg(feature = "faults")]
                if let Some(gate) = gate {
                    gate.wait();
                }
                punching.into_iter().for_each(|r| punch_hole(&file, r))
            });
            if let Ok(thread) = thread {
                self.discarding = Some(Discarding(Some(thread)));
                return Ok(());
            }
        } else {
            drop(holding);
        }
        regions.into_iter().try_for_each(|r| self.discard(r))
    }

    /// Room for `regions`, placed in the pool's free space: the pool grows to hold them
    /// ([`Pool::grow`]), and their parts inside its old length, where a discard may have left
    /// holes, get storage, so that filling them on a full file system is `OutOfSpace` now, not a
    /// `SIGBUS` on a later store. Devdax, anonymous memory and a private view have their storage
    /// already, and so does a file system that cannot allocate ahead.
    pub fn take_room(&mut self, regions: &[Region]) -> Result<()> {
        let below = self.len;
        self.grow(regions.iter().map(Region::end).max().unwrap_or(0))?;
        let (Some(file), Some(path)) = (&self.file, &self.path) else { return Ok(()) };
        if self.private || !matches!(self.backend, Backend::Tmpfs | Backend::File) {
            return Ok(());
        }
        for r in regions.iter().filter(|r| r.offset < below) {
            let (start, end) = (r.offset, r.end().min(below));
            // On tmpfs, made on all host threads and entered in the page tables, as a growth's
            // new pages are ([`Pool::prepare_room`] may have done it).
            if self.backend == Backend::Tmpfs
                && populate_room(stretch(&self.map[start as usize..end as usize]), (file, path), end)?
            {
                continue;
            }
            allocate_range(file, path, start, end)?;
        }
        Ok(())
    }

    /// [`Pool::discard_in_background`] of regions a durable header no longer names: a failure
    /// only leaves storage allocated, so it is logged, not returned (the caller has switched
    /// already, and must carry on with what it switched to).
    pub fn give_back(&mut self, regions: &[Region]) {
        self.give_back_after(regions, ());
    }

    /// [`Pool::give_back`], dropping `holding` first ([`Pool::discard_in_background_after`]).
    pub fn give_back_after(&mut self, regions: &[Region], holding: impl Send + 'static) {
        if let Err(e) = self.discard_in_background_after(regions, holding) {
            log::warn!("the regions a switch left behind stay allocated: {e}");
        }
    }

    /// A discard of `region` is refused outside the pool's regions.
    fn check_discard(&self, region: Region) -> Result<()> {
        if region.end() > self.len || region.offset < HEADER_AREA {
            return Err(PoolError::InvalidArgument(format!(
                "discard of {:#x}+{:#x}: outside the pool's regions ({:#x} bytes)",
                region.offset, region.bytes, self.len
            )));
        }
        Ok(())
    }

    /// Clean close: a durable header write with `clean_shutdown = true`, then unmap and unlock.
    /// (A private view writes that header into its own copy only: the file stays as it was.)
    ///
    /// With msync the whole pool is synced first (only dirty pages cost anything), so the flag
    /// never claims data that is not durable. With cache-line flushes the caller must have
    /// persisted what it wrote: flushing a whole device would take seconds.
    pub fn close(self) -> Result<()> {
        self.close_saving(None)
    }

    /// [`Pool::close`], saving what the table crate needs to start again without a scan:
    /// `saved` = the region (in free space of the pool, which it must already cover) holding
    /// those bytes, and a count kept beside them. The region is persisted and checksummed, and
    /// the same header write that sets `clean_shutdown` records it ([`CloseRecord`]).
    pub fn close_saving(mut self, saved: Option<(Region, u64)>) -> Result<()> {
        if self.persist == Persist::Msync {
            self.persist_all()?;
        }
        let mut h = self.header;
        h.clean_shutdown = true;
        h.closed = CloseRecord::default();
        if let Some((region, items)) = saved {
            self.persist_range(region.offset, region.bytes)?;
            h.closed = CloseRecord { saved: region, items, checksum: crc32fast::hash(self.region(region)) };
        }
        self.write_header(&h)
        // `self` drops here: the mapping, then the file, which releases the lock.
    }

    /// Closes a pool that nothing has written since it was opened clean, leaving its header as
    /// it is: the close record keeps its checksum, so saved bytes damaged since still fail it
    /// at the next open (checksummed again, they would pass). A pool marked dirty is closed as
    /// [`Pool::close`] closes it.
    pub fn close_unchanged(self) -> Result<()> {
        if !self.header.clean_shutdown {
            return self.close();
        }
        Ok(())
        // `self` drops here: the mapping, then the file, which releases the lock.
    }

    /// What the last clean close saved ([`Pool::close_saving`]): its bytes and count, when the
    /// pool was closed cleanly with a record whose bytes still match their checksum, and
    /// nothing has been written since. `None` otherwise (the table crate then scans).
    pub fn saved_at_close(&self) -> Option<(&[u8], u64)> {
        let closed = self.header.closed;
        if !self.header.clean_shutdown || closed.saved.is_empty() {
            return None;
        }
        let bytes = self.region(closed.saved);
        if crc32fast::hash(bytes) != closed.checksum {
            log::warn!("what was saved at close does not match its checksum: the table is scanned");
            return None;
        }
        Some((bytes, closed.items))
    }

    /// Mark the pool open-and-dirty (`clean_shutdown = false`) durably; the table crate calls it
    /// before its first write after open, so that a crash during writes is never taken for a
    /// clean shutdown. What was saved at close goes with the flag: its region is free again.
    /// Writes nothing if the flag is already false.
    pub fn mark_dirty(&mut self) -> Result<()> {
        if !self.header.clean_shutdown {
            return Ok(());
        }
        let mut h = self.header;
        let saved = h.closed.saved;
        h.clean_shutdown = false;
        h.closed = CloseRecord::default();
        self.write_header(&h)?;
        if !saved.is_empty() {
            self.discard(saved)?;
        }
        Ok(())
    }
}

fn check_limit(needed: u64, limit: Option<u64>) -> Result<()> {
    match limit {
        Some(limit) if needed > limit => Err(PoolError::OutOfSpace { needed, limit }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::encode_header;
    use crate::{ResizeRecord, TableConfig, layout_regions};

    fn header(seq: u64) -> Header {
        let (t, h, _) = layout_regions(REGION_ALIGN, REGION_ALIGN);
        Header {
            version: crate::FORMAT_VERSION,
            table: TableConfig {
                key_bytes: 8,
                value_bytes: 8,
                levels: 1,
                hashes: 1,
                slots: 1,
                top_level: 0,
                seed: 0,
            },
            table_region: t,
            heap_region: h,
            heap_cells: 1,
            resize: ResizeRecord::default(),
            clean_shutdown: false,
            sequence: seq,
            user: [0; 8],
            closed: CloseRecord::default(),
        }
    }

    const FILE: u64 = 1 << 20;

    fn choose(a: &[u8], b: &[u8]) -> Result<(Header, Extras, usize)> {
        choose_header([a, b], FILE, Path::new("p"))
    }

    /// The pool size `header` needs.
    fn pool_bytes() -> u64 {
        crate::layout_regions(REGION_ALIGN, REGION_ALIGN).2
    }

    fn assert_exists_error(err: &PoolError) {
        assert!(
            matches!(err, PoolError::Io { op: "create", source, .. } if source.kind() == std::io::ErrorKind::AlreadyExists),
            "{err:?}"
        );
    }

    #[test]
    fn a_staged_pool_never_replaces_what_appeared_at_its_path() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("pool");
        for named in [false, true] {
            let staged = if named { Staged::named(&path) } else { Staged::new(&path) }.unwrap();
            assert_eq!(staged.1.temp.is_some(), named, "tmpfs has unnamed files");
            std::fs::write(&path, b"appeared meanwhile").unwrap();
            let err = Pool::create_staged(&path, staged, pool_bytes(), None, header(1)).unwrap_err();
            assert_exists_error(&err);
            assert_eq!(std::fs::read(&path).unwrap(), b"appeared meanwhile");
            std::fs::remove_file(&path).unwrap();
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "no temporary file is left");
        }
    }

    /// A file pool grows where it is while its reservation lasts: its address and mapping
    /// number stay (a GPU's import of it made before the growth stays valid), and a prepared
    /// growth's pages are mapped, and in the page tables, before the growth. Past the
    /// reservation it is mapped anew, its bytes kept, under another number.
    #[test]
    fn a_pool_grows_in_place_until_it_outgrows_its_reservation() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let mut pool =
            Pool::create(Some(dir.path()), pool_bytes(), &header(1), &CreateOptions::default()).unwrap();
        let len = pool.len();
        let reach = pool.map.reach() as u64;
        assert_eq!(reach, (len * 16).max(4 << 20), "the reservation for a pool without a limit");
        pool.bytes_mut()[len as usize - 1] = 9;
        let (base, id) = (pool.as_ptr(), pool.mapping().id());

        let prepared = len + 2 * PARALLEL_POPULATE_BYTES;
        pool.prepare_growth(prepared);
        assert_eq!(pool.prepared(), prepared);
        assert_eq!(pool.map.len() as u64, prepared, "the preparing thread mapped the new pages");
        assert_eq!(pool.len(), len, "and the pool is as long as it was");
        pool.grow(prepared).unwrap();
        assert_eq!((pool.as_ptr(), pool.mapping().id(), pool.len()), (base, id, prepared));
        assert_eq!(pool.bytes()[len as usize - 1], 9);
        assert!(pool.bytes()[len as usize..].iter().all(|&b| b == 0));

        assert!(pool.grows_in_place(reach) && !pool.grows_in_place(reach + 1));
        pool.grow(reach).unwrap();
        assert_eq!((pool.as_ptr(), pool.mapping().id()), (base, id), "grown to the reservation's end");
        pool.bytes_mut()[reach as usize - 1] = 7;
        pool.grow(reach + 1).unwrap();
        assert_ne!(pool.mapping().id(), id, "mapped anew past the reservation");
        assert_eq!((pool.bytes()[len as usize - 1], pool.bytes()[reach as usize - 1]), (9, 7));
        assert!(pool.grows_in_place(16 * reach), "in a reservation for its new length");
    }

    /// A tmpfs file grown by more than [`PARALLEL_POPULATE_BYTES`] gets its pages on all host
    /// threads: every byte allocated (its blocks counted), reading as zeros, earlier bytes kept.
    #[test]
    fn tmpfs_growth_is_populated_in_parallel() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("grown");
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path).unwrap();
        allocate(&file, &path, 4096, Backend::Tmpfs).unwrap();
        std::fs::write(&path, [7u8; 4096]).unwrap();
        let bytes = 4096 + 3 * PARALLEL_POPULATE_BYTES + 12_288;
        assert!(populate_tmpfs(&file, &path, bytes, None).unwrap(), "a large growth is populated");
        let meta = file.metadata().unwrap();
        assert_eq!(meta.len(), bytes);
        assert!(meta.blocks() * 512 >= bytes, "{} of {bytes} bytes allocated", meta.blocks() * 512);
        let map = map_file(&file, bytes, &path, None, 4096).unwrap();
        assert!(map[..4096].iter().all(|&b| b == 7));
        assert!(map[4096..].iter().all(|&b| b == 0));
        assert!(
            !populate_tmpfs(&file, &path, bytes + 4096, None).unwrap(),
            "a small growth is left to fallocate"
        );
        assert_eq!(file.metadata().unwrap().len(), bytes, "and changes nothing");
    }

    #[test]
    fn a_leftover_temporary_file_blocks_no_create() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("pool");
        // What a create killed on a file system without unnamed files leaves.
        let (file, staged) = Staged::named(&path).unwrap();
        let leftover = staged.temp.clone().unwrap();
        std::mem::forget(staged);
        drop(file);
        let pool =
            Pool::create_staged(&path, Staged::named(&path).unwrap(), pool_bytes(), None, header(1)).unwrap();
        pool.close().unwrap();
        assert_eq!(Pool::open(&path).unwrap().header().sequence, 2);
        let mut names: Vec<PathBuf> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
        names.sort();
        assert_eq!(names, [leftover, path], "the pool and the leftover, nothing else");
    }

    #[test]
    fn newest_intact_copy_wins() {
        let (a, b) = (encode_header(&header(3)), encode_header(&header(4)));
        assert_eq!(choose(&a, &b).unwrap().2, 1);
        assert_eq!(choose(&b, &a).unwrap().2, 0);
        // Ties go to copy 0.
        assert_eq!(choose(&a, &a).unwrap().2, 0);
        // A torn newest copy falls back to the older one.
        let mut torn = b.clone();
        torn[100] ^= 1;
        assert_eq!(choose(&a, &torn).unwrap().0.sequence, 3);
        let zero = vec![0u8; COPY];
        assert_eq!(choose(&zero, &a).unwrap().2, 1);
    }

    #[test]
    fn intact_but_invalid_newest_copy_is_reported() {
        let old = encode_header(&header(3));
        let mut bad = header(4);
        bad.heap_cells = 0;
        let err = choose(&old, &encode_header(&bad)).unwrap_err();
        assert!(err.to_string().contains("header copy 1 (sequence 4): heap_cells is 0"), "{err}");
        // An older invalid copy does not matter.
        let mut older = header(2);
        older.heap_cells = 0;
        assert_eq!(choose(&encode_header(&older), &old).unwrap().0.sequence, 3);
    }

    #[test]
    fn errors_when_no_copy_is_usable() {
        let zero = vec![0u8; COPY];
        assert!(matches!(choose(&zero, &zero), Err(PoolError::NotAPool { .. })));
        let mut torn = encode_header(&header(1));
        torn[30] ^= 4;
        match choose(&torn, &zero) {
            Err(PoolError::Corrupt { what }) => {
                assert!(what.contains("copy 0: checksum mismatch"), "{what}");
                assert!(what.contains("copy 1: bad magic"), "{what}");
            }
            other => panic!("{other:?}"),
        }
    }
}

/// Where a pool's mapping lies ([`Pool::mapping`]): an address, not access to the bytes. The
/// address is valid until the pool moves (a [`Pool::grow`] past [`Pool::grows_in_place`]) or
/// is dropped, and its first `len` bytes until the pool grows; whoever uses it elsewhere must
/// be done with it by then.
#[derive(Clone, Copy, Debug)]
pub struct Mapping {
    base: *mut u8,
    len: u64,
    id: u64,
    backend: Backend,
    persist: PersistMode,
}

// SAFETY: a `Mapping` is an address and some facts about it, and nothing here dereferences
// the address. Whoever hands it to code that does (a GPU import) keeps the pool in place until
// that code is done with it: the lifetime is the holder's contract, not the type's.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Mutable base of the mapping (page aligned).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.base
    }

    /// Pool length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when the pool has no bytes (never, for a created or opened pool).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The mapping's number, different for each mapping a process makes: memory imported from
    /// one mapping is that of another only if their numbers are the same (a pool that grew in
    /// place keeps its number; one that moved does not).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The kind of memory behind the pool.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The persist primitive the pool used when the mapping was taken.
    pub fn persist_mode(&self) -> PersistMode {
        self.persist
    }
}
