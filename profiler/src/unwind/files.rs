//! The files the unwinder reads: a process's executable mappings as the collector reports
//! them (`MappingSpec`: where, which file, its identity) and read-only views of their bytes
//! for the table compiler. Used by the `loader` and the compile `pool`.
use std::{fs::File, os::unix::fs::MetadataExt as _, path::PathBuf, sync::Arc};

/// One executable file mapping of a process.
#[derive(Clone, Debug)]
pub struct MappingSpec {
    pub start: u64,
    pub end: u64,
    /// Offset in the file of `start`.
    pub file_offset: u64,
    /// A path that reads the file now (e.g. through /proc/PID/root), for logs and when
    /// `file` is None.
    pub path: PathBuf,
    /// The mapped file itself, opened by the collector when the kernel reported the mapping
    /// (so it reads after the process exited, or in another mount namespace).
    pub file: Option<Arc<File>>,
    /// (device, inode) of `file` when the collector knows it already; else `key` reads it.
    pub key: Option<(u64, u64)>,
}

impl PartialEq for MappingSpec {
    fn eq(&self, o: &Self) -> bool {
        (self.start, self.end, self.file_offset, &self.path)
            == (o.start, o.end, o.file_offset, &o.path)
    }
}
impl Eq for MappingSpec {}

impl MappingSpec {
    pub(super) fn open(&self) -> Option<File> {
        match &self.file {
            Some(f) => f.try_clone().ok(),
            None => File::open(&self.path).ok(),
        }
    }

    /// (device, inode) of the file, without opening it when it is open already, and without
    /// a syscall when the collector read it when it opened the file (a process's mappings
    /// are looked up at each load: an fstat each was 4% of the agent's CPU under churn).
    pub(super) fn key(&self) -> Option<(u64, u64)> {
        if let Some(k) = self.key {
            return Some(k);
        }
        let meta = match &self.file {
            Some(f) => f.metadata().ok()?,
            None => std::fs::metadata(&self.path).ok()?,
        };
        Some((meta.dev(), meta.ino()))
    }
}

/// A binary's identity: (device, inode).
pub type BinaryKey = (u64, u64);

/// A read-only view of a file's bytes.
pub(super) struct Mmap {
    ptr: *mut libc::c_void,
    len: usize,
}

impl std::ops::Deref for Mmap {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` bytes mapped readable at `ptr` for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr.cast(), self.len) }
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: the region mapped in `memmap`.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// # Safety
/// The file must not be truncated while the view lives.
pub(super) unsafe fn memmap(file: &std::fs::File, len: u64) -> Option<Mmap> {
    let len = usize::try_from(len).ok().filter(|l| *l > 0)?;
    // SAFETY: a private read-only mapping of an open file.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            std::os::fd::AsRawFd::as_raw_fd(file),
            0,
        )
    };
    (ptr != libc::MAP_FAILED).then_some(Mmap { ptr, len })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The identity the collector read when it opened the file is used as it is: no stat
    /// (here the path does not even exist).
    #[test]
    fn a_known_identity_needs_no_stat() {
        let m = |key| MappingSpec {
            start: 0x1000,
            end: 0x2000,
            file_offset: 0,
            path: "/nonexistent/profiler-test/lib.so".into(),
            file: None,
            key,
        };
        assert_eq!(m(Some((7, 42))).key(), Some((7, 42)));
        assert_eq!(
            m(None).key(),
            None,
            "unknown: read from the path, which is missing"
        );
    }
}
