//! The result file of `gphash replay`: after a kill at any instant it holds a whole number of
//! complete result lines, those of a prefix of the persisted batches (the last batch persisted
//! before the kill may be missing: its lines were not yet swapped in).
//!
//! Appending a batch's lines to the file could be cut short by a kill (a write of many pages
//! is not atomic), leaving a torn last line. Instead two files hold the same lines: the one
//! named `--out`, which only ever grows by whole batches, and a hidden spare beside it. A
//! batch's lines are appended to the spare and synced, then `renameat2(RENAME_EXCHANGE)` swaps
//! the two names in one atomic step, and the lines are appended to the other file, now the
//! spare. Each batch costs two appends of its own lines and an exchange, not a copy of the
//! whole output. A kill leaves the output whole; at worst the spare (a hidden file named
//! `.OUT.replay-PID-TIME` beside it) stays behind.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use host_pm::{HEADER_COPY_BYTES, MAGIC};

use crate::Error;

/// The result file, both its names and files.
pub(crate) struct ResultFile {
    path: PathBuf,
    spare_path: PathBuf,
    /// The file named `path`.
    out: File,
    /// The file named `spare_path`: the same lines as `out` between batches.
    spare: File,
    dir: File,
}

/// The `(device, inode)` of a file.
fn identity(m: &std::fs::Metadata) -> (u64, u64) {
    (m.dev(), m.ino())
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| format!("{what}: {e}").into()
}

/// `renameat2` of two paths with `flags` (`RENAME_EXCHANGE`, `RENAME_NOREPLACE`).
fn rename2(from: &Path, to: &Path, flags: libc::c_uint) -> std::io::Result<()> {
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: two NUL-terminated strings that outlive the call.
    let rc = unsafe { libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), flags) };
    if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// Whether `file` starts like a pool: the magic of either header copy.
fn holds_pool_magic(file: &mut File) -> std::io::Result<bool> {
    let mut head = vec![0u8; HEADER_COPY_BYTES as usize + MAGIC.len()];
    let mut got = 0;
    while got < head.len() {
        match file.read(&mut head[got..])? {
            0 => break,
            n => got += n,
        }
    }
    let copy1 = HEADER_COPY_BYTES as usize;
    Ok(head[..MAGIC.len()] == MAGIC
        || (got >= copy1 + MAGIC.len() && head[copy1..copy1 + MAGIC.len()] == MAGIC))
}

/// Takes `file`'s exclusive flock without waiting (the lock an open pool holds); false when
/// another open file holds it.
fn try_lock(file: &File) -> std::io::Result<bool> {
    loop {
        // SAFETY: flock on a descriptor that `file` keeps open.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => return Ok(false),
            _ => return Err(e),
        }
    }
}

/// An existing `--out`, checked and locked, so that nobody opens it as a pool before it is
/// replaced.
struct Existing {
    identity: (u64, u64),
    _locked: File,
}

/// Refuses an output that would destroy something it must not: one of `keep` (the pool, the
/// trace) by any path, a file locked by another process (an open pool), a file that starts
/// like a pool, or anything but a regular file. Nothing is written.
fn check(out: &Path, keep: &[(&str, &Path)]) -> Result<Option<Existing>, Error> {
    let refuse = |why: String| -> Error { format!("refusing --out {}: {why}", out.display()).into() };
    let meta = match std::fs::metadata(out) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && out.symlink_metadata().is_ok() => {
            return Err(refuse("it is a symbolic link to nothing; give the path of a file".into()));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(format!("cannot inspect --out {}", out.display()))(e)),
    };
    for (what, path) in keep {
        let kept = std::fs::metadata(path).map_err(io(format!("cannot inspect {}", path.display())))?;
        if identity(&meta) == identity(&kept) {
            return Err(refuse(format!(
                "it is the {what} {} (the same file); give another path",
                path.display()
            )));
        }
    }
    if out.symlink_metadata().map_err(io(format!("cannot inspect --out {}", out.display())))?.is_symlink() {
        return Err(refuse("it is a symbolic link; give the path of the file itself".into()));
    }
    if !meta.is_file() {
        return Err(refuse("it is not a regular file; --out names a file that replay replaces".into()));
    }
    let mut file = File::open(out).map_err(io(format!("cannot open --out {}", out.display())))?;
    if !try_lock(&file).map_err(io(format!("cannot lock --out {}", out.display())))? {
        return Err(refuse("another process holds its lock (is it a pool in use?)".into()));
    }
    if holds_pool_magic(&mut file).map_err(io(format!("cannot read --out {}", out.display())))? {
        return Err(refuse("it holds a gphash pool; give another path".into()));
    }
    // The file opened, locked and read must be the one whose path was compared with `keep`:
    // otherwise a rename in between could swap a pool in after the checks.
    let opened = file.metadata().map_err(io(format!("cannot inspect --out {}", out.display())))?;
    if identity(&opened) != identity(&meta) {
        return Err(refuse("it was replaced while it was being checked; try again".into()));
    }
    Ok(Some(Existing { identity: identity(&opened), _locked: file }))
}

impl ResultFile {
    /// Checks `out` (see [`check`]; `keep` are the files it must not be), then replaces it by
    /// an empty file, atomically. Nothing is written before the checks pass.
    pub(crate) fn create(out: &Path, keep: &[(&str, &Path)]) -> Result<ResultFile, Error> {
        let existing = check(out, keep)?;
        let name = out.file_name().ok_or_else(|| format!("--out {} names no file", out.display()))?;
        let dir_path = match out.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        // Unique beside anything a killed replay left.
        let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let hidden = |role: &str| {
            let id = format!("{}-{}", std::process::id(), stamp.as_nanos());
            dir_path.join(format!(".{}.{role}-{id}", name.to_string_lossy()))
        };
        let (new_path, spare_path) = (hidden("new"), hidden("replay"));
        let fresh = |p: &Path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(p)
                .map_err(io(format!("cannot create {} beside --out", p.display())))
        };
        let dir =
            File::open(dir_path).map_err(io(format!("cannot open directory {}", dir_path.display())))?;
        let spare = fresh(&spare_path)?;
        let out_file = match fresh(&new_path) {
            Ok(f) => f,
            Err(e) => {
                let _ = std::fs::remove_file(&spare_path);
                return Err(e);
            }
        };
        // From here on, dropping `file` removes the spare.
        let mut file = ResultFile { path: out.to_path_buf(), spare_path, out: out_file, spare, dir };
        file.publish_empty(&new_path, existing)?;
        // The exchange every batch needs, tried now, before anything is applied: both files are
        // empty, so it changes nothing but their roles.
        file.exchange()?;
        Ok(file)
    }

    /// Puts the empty file at `new` in the place of the output, unless the output changed
    /// since it was checked; what was at the output is then removed.
    fn publish_empty(&self, new: &Path, existing: Option<Existing>) -> Result<(), Error> {
        let out = self.path.display();
        let changed =
            || -> Error { format!("--out {out} changed while it was being checked; try again").into() };
        let Some(existing) = existing else {
            return rename2(new, &self.path, libc::RENAME_NOREPLACE).map_err(|e| {
                let _ = std::fs::remove_file(new);
                match e.kind() {
                    std::io::ErrorKind::AlreadyExists => changed(),
                    _ => io(format!("cannot create --out {out}"))(e),
                }
            });
        };
        if let Err(e) = rename2(new, &self.path, libc::RENAME_EXCHANGE) {
            let _ = std::fs::remove_file(new);
            return Err(io(format!("cannot replace --out {out}"))(e));
        }
        // An exchange loses nothing: it is undone if what it replaced is not what was checked.
        let replaced = std::fs::metadata(new).map_err(io(format!("cannot inspect {}", new.display())))?;
        if identity(&replaced) != existing.identity {
            rename2(new, &self.path, libc::RENAME_EXCHANGE).map_err(io(format!(
                "--out {out} changed while it was being checked, and cannot be restored from {}",
                new.display()
            )))?;
            let _ = std::fs::remove_file(new);
            return Err(changed());
        }
        std::fs::remove_file(new).map_err(io(format!("cannot remove the old output, now {}", new.display())))
    }

    /// Swaps the names of the output and the spare, durably.
    fn exchange(&mut self) -> Result<(), Error> {
        rename2(&self.spare_path, &self.path, libc::RENAME_EXCHANGE).map_err(io(format!(
            "cannot exchange {} and --out {} atomically (renameat2 RENAME_EXCHANGE; put --out on \
             a local file system such as ext4, xfs, btrfs or tmpfs)",
            self.spare_path.display(),
            self.path.display()
        )))?;
        std::mem::swap(&mut self.out, &mut self.spare);
        self.dir.sync_all().map_err(io(format!("cannot sync the directory of --out {}", self.path.display())))
    }

    /// Adds the lines of a persisted batch (whole lines, each ending in a newline): the output
    /// shows all of them or, after a kill, none.
    pub(crate) fn append(&mut self, lines: &[u8]) -> Result<(), Error> {
        let spare = self.spare_path.display();
        self.spare.write_all(lines).map_err(io(format!("cannot write {spare}")))?;
        self.spare.sync_data().map_err(io(format!("cannot sync {spare}")))?;
        self.exchange()?;
        let spare = self.spare_path.display();
        self.spare.write_all(lines).map_err(io(format!("cannot write {spare}")))
    }

    /// Removes the spare: the output stays, complete.
    pub(crate) fn finish(self) -> Result<(), Error> {
        std::fs::remove_file(&self.spare_path)
            .map_err(io(format!("cannot remove {}", self.spare_path.display())))?;
        self.dir.sync_all().map_err(io(format!("cannot sync the directory of --out {}", self.path.display())))
    }
}

impl Drop for ResultFile {
    fn drop(&mut self) {
        // After an error the spare may hold lines the output lacks: it serves no one.
        let _ = std::fs::remove_file(&self.spare_path);
    }
}
