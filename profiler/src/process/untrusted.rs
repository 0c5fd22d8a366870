//! The trust boundary of collection and symbolization: every file opened on behalf of another
//! process (its perf map, the binaries it maps, their debug files) is opened here, inside that
//! process's root, without blocking, and only if it is a regular file. The process may be
//! hostile: its paths can be symlinks to root-only files, FIFOs nobody writes, /dev/zero.
//!
//! With `openat2` (Linux 5.6+) paths resolve with RESOLVE_IN_ROOT relative to an O_PATH fd of
//! /proc/PID/root, so an absolute symlink in a container lands in the container's root, never
//! the host's, and `..` cannot climb out; RESOLVE_NO_MAGICLINKS refuses /proc/self/fd-style
//! links, which jump anywhere. Where `openat2` is missing (ENOSYS: an old kernel, or a seccomp
//! policy that hides it; EPERM: one that refuses it) the fallback walks the path one component
//! at a time with O_NOFOLLOW and refuses every symlink and every `..`: stricter, and safe for
//! the paths we open, which come from /proc/PID/maps (the kernel prints them with symlinks
//! already resolved) or are fixed names (/tmp/perf-N.map).
use std::{
    ffi::CString,
    fs::File,
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::{ffi::OsStrExt as _, fs::MetadataExt as _},
    },
    path::{Component, Path},
};

/// Why a file was not opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenError {
    #[error(transparent)]
    Io(#[from] io::Error),
    /// A FIFO, device, socket or directory: reading it could block forever or never end.
    #[error("not a regular file but a {0}")]
    NotRegular(&'static str),
    /// Only in the fallback without openat2: a symlink or `..` on the way.
    #[error("a symlink or `..` in the path, refused without openat2")]
    Unsafe,
}

/// The root directory a process sees, held open (O_PATH): paths are resolved against it, and
/// it stays valid after the process exits.
#[derive(Debug)]
pub(crate) struct Root(OwnedFd);

impl Root {
    /// The root of process `pid` (its mount namespace and chroot).
    pub(crate) fn of_process(pid: u32) -> io::Result<Self> {
        Self::open_dir(&format!("/proc/{pid}/root"))
    }

    /// Our own root: for paths named in our mount namespace (the host's /tmp/perf-PID.map, a
    /// binary whose process is gone, /usr/lib/debug).
    pub(crate) fn host() -> io::Result<Self> {
        Self::open_dir("/")
    }

    /// A directory to act as a root (tests use a scratch directory).
    pub(crate) fn open_dir(path: &str) -> io::Result<Self> {
        let c = CString::new(path).map_err(io::Error::other)?;
        // SAFETY: a NUL-terminated path; the returned fd is ours alone.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd nothing else owns.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Opens `path` (absolute or not, always taken from this root) read-only, non-blocking,
    /// and only if it is a regular file.
    pub(crate) fn open(&self, path: &Path) -> Result<File, OpenError> {
        let file = match self.openat2(path) {
            // ENOSYS: no openat2. EPERM: a seccomp policy that refuses it (older container
            // runtimes' default); a real EPERM fails the stricter walk just the same.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {
                self.open_walking(path)?
            }
            other => other?,
        };
        regular(&file)?;
        Ok(file)
    }

    /// RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS from this root.
    fn openat2(&self, path: &Path) -> io::Result<File> {
        let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
        // SAFETY: open_how is plain integers; all zero is its documented empty value.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = FLAGS as u64;
        how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
        // SAFETY: openat2 reads the NUL-terminated path and `how` (size passed); the fd
        // returned is ours alone.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.0.as_raw_fd(),
                c.as_ptr(),
                &raw const how,
                size_of::<libc::open_how>(),
            )
        };
        owned(fd as i32)
    }

    /// The fallback without openat2: one component at a time, never following a symlink
    /// (O_NOFOLLOW makes a symlink fail: ELOOP for the file, ENOTDIR for a directory opened
    /// O_PATH | O_DIRECTORY), never `..`.
    fn open_walking(&self, path: &Path) -> Result<File, OpenError> {
        let mut parts = Vec::new();
        for c in path.components() {
            match c {
                Component::Normal(name) => parts.push(name),
                Component::RootDir | Component::CurDir => {}
                Component::ParentDir | Component::Prefix(_) => return Err(OpenError::Unsafe),
            }
        }
        let Some((last, dirs)) = parts.split_last() else {
            return Err(OpenError::NotRegular("directory"));
        };
        let mut dir: Option<OwnedFd> = None;
        for name in dirs {
            let at = dir.as_ref().unwrap_or(&self.0).as_raw_fd();
            let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
            dir = Some(openat(at, name.as_bytes(), flags).map_err(symlink_refused)?);
        }
        let at = dir.as_ref().unwrap_or(&self.0).as_raw_fd();
        let fd = openat(at, last.as_bytes(), FLAGS | libc::O_NOFOLLOW).map_err(symlink_refused)?;
        Ok(File::from(fd))
    }
}

/// Read-only; O_NONBLOCK so a FIFO's open returns at once instead of waiting for a writer
/// (and a regular file ignores it); O_NOCTTY so a terminal cannot become ours.
const FLAGS: i32 = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;

fn openat(dir: i32, name: &[u8], flags: i32) -> io::Result<OwnedFd> {
    let c = CString::new(name).map_err(io::Error::other)?;
    // SAFETY: a NUL-terminated name relative to a directory fd we hold.
    let fd = unsafe { libc::openat(dir, c.as_ptr(), flags) };
    owned(fd).map(OwnedFd::from)
}

fn owned(fd: i32) -> io::Result<File> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd from the kernel that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn symlink_refused(e: io::Error) -> OpenError {
    match e.raw_os_error() {
        Some(libc::ELOOP | libc::ENOTDIR) => OpenError::Unsafe,
        _ => OpenError::Io(e),
    }
}

/// Refuses anything but a regular file (fstat of the open file: no race with the path).
pub(crate) fn regular(file: &File) -> Result<std::fs::Metadata, OpenError> {
    let meta = file.metadata()?;
    let kind = match meta.mode() & libc::S_IFMT {
        libc::S_IFREG => return Ok(meta),
        libc::S_IFIFO => "FIFO",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        libc::S_IFSOCK => "socket",
        libc::S_IFDIR => "directory",
        _ => "special file",
    };
    Err(OpenError::NotRegular(kind))
}

/// `/proc/self/fd/N` of an open file, for libraries that take a path (blazesym): they then
/// read exactly the file we checked, whatever its path names by then.
pub(crate) fn fd_path(file: &File) -> std::path::PathBuf {
    format!("/proc/self/fd/{}", file.as_raw_fd()).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    fn scratch(label: &str) -> tempfile::TempDir {
        let dir = tempfile::Builder::new()
            .prefix(&format!("profiler-untrusted-{label}-"))
            .tempdir()
            .unwrap();
        std::fs::create_dir_all(dir.path().join("tmp")).unwrap();
        dir
    }

    #[test]
    fn absolute_symlinks_resolve_inside_the_root() {
        let scratch_dir = scratch("inroot");
        let dir = scratch_dir.path();
        std::fs::write(dir.join("inside.map"), "inside").unwrap();
        std::os::unix::fs::symlink("/inside.map", dir.join("tmp/abs")).unwrap();
        std::os::unix::fs::symlink("../../../../../../inside.map", dir.join("tmp/up")).unwrap();
        let root = Root::open_dir(dir.to_str().unwrap()).unwrap();
        for link in ["/tmp/abs", "tmp/up"] {
            let mut text = String::new();
            root.open(Path::new(link))
                .unwrap()
                .read_to_string(&mut text)
                .unwrap();
            assert_eq!(text, "inside", "{link}");
        }
        // The host's file of that name is out of reach, whatever it is.
        assert!(root.open(Path::new("/etc/passwd")).is_err());
        // The fallback refuses links altogether rather than resolve them against the host.
        assert!(matches!(
            root.open_walking(Path::new("/tmp/abs")),
            Err(OpenError::Unsafe)
        ));
        assert!(matches!(
            root.open_walking(Path::new("/tmp/../inside.map")),
            Err(OpenError::Unsafe)
        ));
        assert!(root.open_walking(Path::new("/inside.map")).is_ok());
    }

    #[test]
    fn special_files_are_refused_without_blocking() {
        let scratch_dir = scratch("special");
        let dir = scratch_dir.path();
        let fifo = CString::new(dir.join("tmp/fifo").as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let root = Root::open_dir(dir.to_str().unwrap()).unwrap();
        // A blocking open of a FIFO nobody writes would never return: this test would hang.
        for open in [Root::open, Root::open_walking_checked] {
            let e = open(&root, Path::new("/tmp/fifo")).unwrap_err();
            assert_eq!(e.to_string(), "not a regular file but a FIFO");
            let e = open(&root, Path::new("/tmp")).unwrap_err();
            assert_eq!(e.to_string(), "not a regular file but a directory");
        }
        let host = Root::host().unwrap();
        let e = host.open(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(e.to_string(), "not a regular file but a character device");
        // Magic links jump anywhere: refused.
        assert!(host.open(Path::new("/proc/self/exe")).is_err());
    }

    impl Root {
        fn open_walking_checked(&self, path: &Path) -> Result<File, OpenError> {
            let f = self.open_walking(path)?;
            regular(&f)?;
            Ok(f)
        }
    }
}
