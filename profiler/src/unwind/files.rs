//! The files the unwinder reads: a process's executable mappings as the collector reports
//! them (`MappingSpec`: where, which file, its identity) and read-only views of their bytes
//! for the table compiler. Used by the `loader` and the compile `pool`.
use std::os::unix::fs::MetadataExt as _;

/// A binary's identity: (device, inode).
pub(crate) type BinaryKey = (u64, u64);

/// A read-only view of a file's bytes.
pub(super) struct Mmap {
    ptr: *mut libc::c_void,
    len: usize,
    /// The file's (device, inode, size, mtime, ctime) when it was mapped: any write since
    /// changes the ctime.
    identity: [i64; 5],
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

impl super::table::Image for Mmap {
    /// Drops the whole pages of `range` from this process (`MADV_DONTNEED`): they are file
    /// pages never written, so a later read faults in the same bytes from the page cache.
    fn done_with(&self, range: std::ops::Range<usize>) {
        let page = crate::util::page_size();
        let start = range.start.next_multiple_of(page);
        let end = range.end.min(self.len) / page * page;
        if start < end {
            // SAFETY: whole pages inside the mapping; see above for what a read then sees.
            unsafe { libc::madvise(self.ptr.byte_add(start), end - start, libc::MADV_DONTNEED) };
        }
    }

    fn identity(&self) -> Option<[i64; 5]> {
        Some(self.identity)
    }
}

/// # Safety
/// The file must not be truncated while the view lives.
pub(super) unsafe fn memmap(file: &std::fs::File) -> Option<Mmap> {
    let meta = file.metadata().ok()?;
    let len = usize::try_from(meta.len()).ok().filter(|l| *l > 0)?;
    let nanos = |s: i64, ns: i64| s.saturating_mul(1_000_000_000).saturating_add(ns);
    let identity = [
        meta.dev() as i64,
        meta.ino() as i64,
        meta.size() as i64,
        nanos(meta.mtime(), meta.mtime_nsec()),
        nanos(meta.ctime(), meta.ctime_nsec()),
    ];
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
    (ptr != libc::MAP_FAILED).then_some(Mmap { ptr, len, identity })
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use super::*;

    /// kB resident of this process's mapping that starts at `at` (/proc/self/smaps).
    fn resident_kb(at: *const u8) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let start = format!("{:x}-", at as usize);
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&start));
        lines
            .find_map(|l| l.strip_prefix("Rss:"))
            .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("the mapping is in smaps")
    }

    /// Minor page faults of this thread so far.
    fn minor_faults() -> i64 {
        // SAFETY: getrusage writes the struct it is given.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        assert_eq!(
            unsafe { libc::getrusage(libc::RUSAGE_THREAD, &raw mut usage) },
            0
        );
        usage.ru_minflt
    }

    /// A big library (rustc's own: 150 MB, 90 MB of it code, no build id) compiled from its
    /// mapping keeps a few MB of it resident, not the code the padding scan and the content
    /// hash read, and gives the same table as from its bytes read into memory.
    #[test]
    fn a_big_binary_compiles_with_few_pages_resident() {
        let sysroot = std::process::Command::new("rustc")
            .args(["--print", "sysroot"])
            .output()
            .expect("rustc runs");
        let lib = std::path::Path::new(String::from_utf8_lossy(&sysroot.stdout).trim()).join("lib");
        // rustup's toolchains keep it in lib/, Debian's rustc in lib/x86_64-linux-gnu/.
        let in_dir = |dir: &std::path::Path| {
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .collect::<Vec<_>>()
        };
        let path = in_dir(&lib)
            .into_iter()
            .chain(in_dir(&lib.join("x86_64-linux-gnu")))
            .find(|p| p.to_string_lossy().contains("librustc_driver-"))
            .unwrap_or_else(|| panic!("no librustc_driver in {}", lib.display()));
        let file = File::open(&path).unwrap();
        // SAFETY: a read-only view of a toolchain file nobody truncates.
        let image = unsafe { memmap(&file) }.unwrap();
        let len = image.len() as u64;
        assert!(len > 64 << 20, "{} is {len} bytes", path.display());
        let key = super::super::cache::key(&image);
        let table = super::super::table::compile(&image).unwrap();
        let kb = resident_kb(image.as_ptr());
        assert!(kb < len / 1024 / 8, "{kb} kB of {} resident", len / 1024);
        // The same file mapped again is not hashed again: its key costs a few page faults,
        // not one per 64 KiB of the file.
        // SAFETY: as above.
        let again = unsafe { memmap(&file) }.unwrap();
        let faults = minor_faults();
        assert_eq!(super::super::cache::key(&again), key);
        let faults = minor_faults() - faults;
        assert!(faults < 200, "{faults} page faults for a key known already");
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(super::super::cache::key(&bytes), key);
        let read = super::super::table::compile(&bytes).unwrap();
        assert_eq!((read.rows.len(), read.fdes), (table.rows.len(), table.fdes));
        assert!(read.rows == table.rows && read.padding == table.padding);
        assert!(
            table.padding.len() > 1000,
            "{} padding gaps",
            table.padding.len()
        );
    }
}
