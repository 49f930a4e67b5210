//! Which kind of memory backs a pool, found from the open file.

use std::fmt;
use std::fs::File;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::{PoolError, REGION_ALIGN, Result};

/// `f_type` of tmpfs (`linux/magic.h`).
const TMPFS_MAGIC: u32 = 0x0102_1994;
/// `f_type` of hugetlbfs (`linux/magic.h`).
const HUGETLBFS_MAGIC: u32 = 0x9584_58f6;

/// The kind of memory behind a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// A device-dax character device (`/dev/daxX.Y`): persistent memory mapped directly.
    DevDax,
    /// A file on tmpfs or hugetlbfs: emulated PM, survives a process crash but not a reboot.
    Tmpfs,
    /// A file on any other file system, made durable with `msync`.
    File,
    /// Anonymous memory: volatile.
    Anonymous,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::DevDax => "devdax",
            Backend::Tmpfs => "tmpfs",
            Backend::File => "file",
            Backend::Anonymous => "anonymous",
        })
    }
}

/// What `fstat` says a path is, reduced to what classification needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NodeKind {
    Regular,
    CharDevice,
    Other,
}

/// Pick the backend of an open file from its node kind, its file system's `f_type`, and, for
/// a character device, the kernel's device name (`dax0.0`, found through sysfs so that a
/// symlink to the device classifies the same).
pub(crate) fn classify(
    node: NodeKind,
    fs_magic: u32,
    device_name: Option<&str>,
) -> std::result::Result<Backend, String> {
    match node {
        NodeKind::Regular if fs_magic == TMPFS_MAGIC || fs_magic == HUGETLBFS_MAGIC => Ok(Backend::Tmpfs),
        NodeKind::Regular => Ok(Backend::File),
        NodeKind::CharDevice => match device_name {
            Some(name) if name.starts_with("dax") => Ok(Backend::DevDax),
            Some(name) => Err(format!("character device {name} is not a devdax device")),
            None => Err("character device unknown to sysfs".to_string()),
        },
        NodeKind::Other => Err("neither a regular file nor a devdax device".to_string()),
    }
}

/// Parse a sysfs number attribute (decimal, trailing newline).
pub(crate) fn parse_sysfs_u64(s: &str) -> Option<u64> {
    s.trim().parse().ok()
}

/// Everything the pool needs to know about an open file.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FileInfo {
    pub backend: Backend,
    /// File size, or device size for devdax.
    pub bytes: u64,
    /// Sizes are rounded up to this: [`REGION_ALIGN`], or the huge page size on hugetlbfs.
    pub granule: u64,
}

/// Wrap an OS error with the path and the operation it concerns.
pub(crate) fn io_err(path: &Path, op: &'static str) -> impl FnOnce(std::io::Error) -> PoolError {
    let path = path.to_path_buf();
    move |source| PoolError::Io { path, op, source }
}

/// Classify an open file and find its size.
pub(crate) fn probe(file: &File, path: &Path) -> Result<FileInfo> {
    let meta = file.metadata().map_err(io_err(path, "fstat"))?;
    let ft = meta.file_type();
    let invalid = |why: String| PoolError::InvalidArgument(format!("{}: {why}", path.display()));
    if ft.is_char_device() {
        let sys =
            PathBuf::from(format!("/sys/dev/char/{}:{}", libc::major(meta.rdev()), libc::minor(meta.rdev())));
        let name = std::fs::read_link(&sys)
            .ok()
            .and_then(|target| Some(target.file_name()?.to_string_lossy().into_owned()));
        let backend = classify(NodeKind::CharDevice, 0, name.as_deref()).map_err(invalid)?;
        let size_path = sys.join("size");
        let text = std::fs::read_to_string(&size_path).map_err(io_err(&size_path, "read"))?;
        let bytes =
            parse_sysfs_u64(&text).ok_or_else(|| invalid(format!("unreadable device size {text:?}")))?;
        return Ok(FileInfo { backend, bytes, granule: REGION_ALIGN });
    }
    let node = if ft.is_file() { NodeKind::Regular } else { NodeKind::Other };
    // SAFETY: `statfs` is plain old data, so all-zero is a valid value; fstatfs fills it from
    // an fd that `file` keeps open for the duration of the call.
    let st = unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        if libc::fstatfs(file.as_raw_fd(), &mut st) != 0 {
            return Err(io_err(path, "fstatfs")(std::io::Error::last_os_error()));
        }
        st
    };
    // f_type is a signed word of platform width; the magics are 32-bit patterns.
    let magic = st.f_type as u32;
    let backend = classify(node, magic, None).map_err(invalid)?;
    // hugetlbfs files are sized and mapped in whole huge pages (f_bsize).
    let granule = if magic == HUGETLBFS_MAGIC { (st.f_bsize as u64).max(REGION_ALIGN) } else { REGION_ALIGN };
    Ok(FileInfo { backend, bytes: meta.len(), granule })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        use NodeKind::*;
        assert_eq!(classify(Regular, TMPFS_MAGIC, None), Ok(Backend::Tmpfs));
        assert_eq!(classify(Regular, HUGETLBFS_MAGIC, None), Ok(Backend::Tmpfs));
        assert_eq!(classify(Regular, 0xEF53, None), Ok(Backend::File)); // ext4
        assert_eq!(classify(Regular, 0x5846_5342, None), Ok(Backend::File)); // xfs
        assert_eq!(classify(CharDevice, 0, Some("dax0.0")), Ok(Backend::DevDax));
        assert_eq!(classify(CharDevice, 0, Some("dax12.3")), Ok(Backend::DevDax));
        assert!(classify(CharDevice, 0, Some("null")).is_err());
        assert!(classify(CharDevice, 0, None).is_err());
        assert!(classify(Other, TMPFS_MAGIC, None).is_err());
    }

    #[test]
    fn sysfs_numbers() {
        assert_eq!(parse_sysfs_u64("68719476736\n"), Some(1 << 36));
        assert_eq!(parse_sysfs_u64(" 4096 "), Some(4096));
        assert_eq!(parse_sysfs_u64(""), None);
        assert_eq!(parse_sysfs_u64("-1\n"), None);
        assert_eq!(parse_sysfs_u64("0x10"), None);
    }

    #[test]
    fn probe_real_files() {
        let dir = tempfile::tempdir_in("/dev/shm").expect("tempdir on /dev/shm");
        let p = dir.path().join("f");
        let f = File::create(&p).unwrap();
        let info = probe(&f, &p).unwrap();
        assert_eq!(info.backend, Backend::Tmpfs);
        assert_eq!((info.bytes, info.granule), (0, REGION_ALIGN));

        // /dev/null: a character device that is not devdax.
        let f = File::open("/dev/null").unwrap();
        let err = probe(&f, Path::new("/dev/null")).unwrap_err();
        assert!(err.to_string().contains("not a devdax device"), "{err}");
    }

    #[test]
    fn display() {
        let names: Vec<String> = [Backend::DevDax, Backend::Tmpfs, Backend::File, Backend::Anonymous]
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(names, ["devdax", "tmpfs", "file", "anonymous"]);
    }
}
