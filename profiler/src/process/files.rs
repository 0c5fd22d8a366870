//! The binaries processes map, each opened once and kept open while its process lives, so
//! that it symbolizes after the process has exited, in another mount namespace, or once
//! deleted. Files are known by identity (device and inode, or GNU build id), never by path
//! alone: one path names different files in different containers.
use std::{
    collections::HashMap,
    fs::File,
    os::unix::fs::{FileExt as _, MetadataExt as _},
    path::{Path, PathBuf},
    sync::Arc,
};

use super::{
    kernel_records::FileIdentity,
    untrusted::{self, OpenError, Root},
};

/// A mapped file that user addresses fall in.
#[derive(Debug)]
pub(crate) struct UserFile {
    /// Path as the process saw it (in its own mount namespace).
    pub path: PathBuf,
    /// GNU build id, when the file has one.
    pub build_id: Option<Vec<u8>>,
    /// The file itself, opened while the process lived: it stays readable after the process
    /// exits, in another mount namespace, or once deleted.
    pub handle: Option<File>,
    /// (device, inode) of `handle`, read once: the unwind loader keys tables by it for every
    /// process that maps the file (`MappingSpec::key`).
    pub key: Option<(u64, u64)>,
}

impl UserFile {
    /// A path that reads this very file now, for blazesym: the kept handle's, else that of
    /// the recorded path opened now (as safely as at first sight: the process may have put a
    /// FIFO there since), with that new handle, which must live while the path is used.
    pub(crate) fn readable_path(&self) -> Result<(PathBuf, Option<File>), OpenError> {
        match &self.handle {
            Some(f) => Ok((untrusted::fd_path(f), None)),
            None => {
                let f = Root::host()?.open(&self.path)?;
                Ok((untrusted::fd_path(&f), Some(f)))
            }
        }
    }
}

/// Open file handles kept at most, below the usual descriptor limit; beyond it files are read
/// by path (fine for host binaries that stay on disk).
const MAX_HANDLES: usize = 4096;

/// Ids of the files in a `Vec<Arc<UserFile>>`, by identity. None: not an ELF file.
#[derive(Default)]
pub(super) struct FileIds {
    by_inode: HashMap<(u64, u64), Option<u32>>,
    by_build_id: HashMap<Vec<u8>, Option<u32>>,
    /// The vDSO (`vdso`): None until first asked for, then its id if it could be copied.
    #[expect(
        clippy::option_option,
        reason = "not asked yet, asked and failed, copied"
    )]
    vdso: Option<Option<(u32, u64)>>,
}

impl FileIds {
    /// The id of the file `path` names in `pid`'s mount namespace (from /proc/PID/maps),
    /// opening it on first sight. None for a file that is not ELF (see `intern`).
    pub(super) fn by_path(
        &mut self,
        files: &mut Vec<Arc<UserFile>>,
        pid: u32,
        path: &Path,
        build_id: Option<&[u8]>,
    ) -> Option<u32> {
        let handle = open_in_process(pid, path, None);
        let key = handle
            .as_ref()
            .and_then(|f| f.metadata().ok())
            .map_or((u64::MAX, files.len() as u64), |m| (m.dev(), m.ino()));
        if let Some(&id) = self.by_inode.get(&key) {
            return id;
        }
        let id = intern(files, handle, path, build_id.map(<[u8]>::to_vec));
        self.by_inode.insert(key, id);
        if let (Some(b), Some(id)) = (build_id, id) {
            self.by_build_id.entry(b.to_vec()).or_insert(Some(id));
        }
        id
    }

    /// The id of the file an MMAP2 record names (`identity` as the kernel gave it), opening
    /// it on first sight through `pid`'s own view of it. None when it is not ELF, or when no
    /// file with that identity can be opened any more (its addresses then stay unknown
    /// rather than being named from another file).
    pub(super) fn by_identity(
        &mut self,
        files: &mut Vec<Arc<UserFile>>,
        pid: u32,
        range: (u64, u64),
        path: &Path,
        identity: &FileIdentity,
    ) -> Option<u32> {
        let known = match identity {
            FileIdentity::BuildId(b) => self.by_build_id.get(b.as_slice()),
            FileIdentity::Inode(dev, ino) => self.by_inode.get(&(*dev, *ino)),
        };
        if let Some(&id) = known {
            return id;
        }
        let handle = open_in_process(pid, path, Some(range)).filter(|f| same_file(f, identity));
        let Some(handle) = handle else {
            log::debug!(
                "pid {pid}: {} is gone or is another file now: its addresses stay unknown",
                path.display()
            );
            return None;
        };
        // One file, one id, however it was first named: the kernel gives a build id when it
        // can read it from memory, else device and inode, and /proc gives the latter.
        let inode = handle.metadata().ok().map(|m| (m.dev(), m.ino()));
        let build_id = match identity {
            FileIdentity::BuildId(b) => Some(b.as_slice().to_vec()),
            FileIdentity::Inode(..) => crate::process::file_build_id(&handle),
        };
        let id = match (
            inode.and_then(|k| self.by_inode.get(&k).copied()),
            build_id
                .as_ref()
                .and_then(|b| self.by_build_id.get(b).copied()),
        ) {
            (Some(id), _) | (None, Some(id)) => id,
            (None, None) => intern(files, Some(handle), path, build_id.clone()),
        };
        if let Some(key) = inode {
            self.by_inode.entry(key).or_insert(id);
        }
        if let Some(b) = build_id {
            self.by_build_id.entry(b).or_insert(id);
        }
        id
    }
}

impl FileIds {
    /// The id of the kernel's vDSO image, for a `[vdso]` mapping of `len` bytes. Every
    /// process of one kernel and ABI maps the same image, so ours, copied once into an
    /// anonymous file, names theirs (`clock_gettime` that falls back to a system call has
    /// its leaf there). None for a mapping of another size (another ABI's vDSO).
    pub(super) fn vdso(&mut self, files: &mut Vec<Arc<UserFile>>, len: u64) -> Option<u32> {
        let (id, own_len) = (*self.vdso.get_or_insert_with(|| {
            let (handle, len) = copy_own_vdso()?;
            let id = intern(files, Some(handle), Path::new("[vdso]"), None)?;
            Some((id, len))
        }))?;
        (own_len == len).then_some(id)
    }
}

/// Our own vDSO, copied from memory into a memfd: (file, length in bytes).
fn copy_own_vdso() -> Option<(File, u64)> {
    use std::io::Write as _;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = maps.lines().find(|l| l.ends_with("[vdso]"))?;
    let (start, end) = line.split_whitespace().next()?.split_once('-')?;
    let (start, end) = (
        u64::from_str_radix(start, 16).ok()?,
        u64::from_str_radix(end, 16).ok()?,
    );
    // SAFETY: the kernel maps the vDSO readable for the life of the process; we copy it.
    let image = unsafe { std::slice::from_raw_parts(start as *const u8, (end - start) as usize) };
    // SAFETY: a plain memfd_create with a NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"profiler-vdso".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a new descriptor we own.
    let mut file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    file.write_all(image).ok()?;
    Some((file, end - start))
}

/// Opens the file `pid` maps at `path` (and, when known, at `range` of its address space):
/// the mapping itself through /proc/PID/map_files while the mapping exists (exactly the mapped
/// file, even deleted or in another mount namespace), else the path in the process's root,
/// else in ours. Every open on behalf of a process is here: non-blocking, regular files only,
/// and paths never followed out of the process's root (`untrusted`).
pub(super) fn open_in_process(pid: u32, path: &Path, range: Option<(u64, u64)>) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    range
        .and_then(|(start, end)| {
            // The kernel's own link to the mapped file: no path of the process's to resolve.
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
                .open(format!("/proc/{pid}/map_files/{start:x}-{end:x}"))
                .ok()
                .filter(|f| untrusted::regular(f).is_ok())
        })
        .or_else(|| Root::of_process(pid).ok()?.open(path).ok())
        .or_else(|| Root::host().ok()?.open(path).ok())
}

/// Whether `f` is the file the kernel identified: same device and inode, or same build id.
fn same_file(f: &File, identity: &FileIdentity) -> bool {
    match identity {
        FileIdentity::Inode(dev, ino) => f
            .metadata()
            .is_ok_and(|m| m.dev() == *dev && m.ino() == *ino),
        FileIdentity::BuildId(b) => {
            crate::process::file_build_id(f).as_deref() == Some(b.as_slice())
        }
    }
}

/// Adds a file; None for a file that is not ELF: a return address that lands in a mapped
/// data file (the locale archive, say) comes from a frame-pointer walk through code built
/// without them, and `LC_CTYPE+0xc6b` would be a made-up frame; such addresses stay unknown.
fn intern(
    files: &mut Vec<Arc<UserFile>>,
    handle: Option<File>,
    path: &Path,
    build_id: Option<Vec<u8>>,
) -> Option<u32> {
    let mut magic = [0u8; 4];
    if let Some(f) = &handle
        && f.read_exact_at(&mut magic, 0).is_ok()
        && magic != *b"\x7fELF"
    {
        return None;
    }
    let handle = handle.filter(|_| files.len() < MAX_HANDLES);
    let key = handle.as_ref().and_then(|f| {
        use std::os::unix::fs::MetadataExt as _;
        f.metadata().ok().map(|m| (m.dev(), m.ino()))
    });
    files.push(Arc::new(UserFile {
        path: path.to_owned(),
        build_id,
        handle,
        key,
    }));
    Some(files.len() as u32 - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_elf_files_get_an_id() {
        let (mut files, mut ids) = (Vec::new(), FileIds::default());
        let me = std::process::id();
        let dir = tempfile::Builder::new()
            .prefix("profiler-not-elf-")
            .tempdir()
            .unwrap();
        let data = dir.path().join("not-elf");
        std::fs::write(&data, b"LC_CTYPE data, not code").unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        assert_eq!(ids.by_path(&mut files, me, &data, None), None);
        let id = ids.by_path(&mut files, me, &exe, None);
        assert_eq!(id, Some(0));
        // Known files keep their answer.
        assert_eq!(ids.by_path(&mut files, me, &data, None), None);
        assert_eq!(ids.by_path(&mut files, me, &exe, None), id);
        assert_eq!(files.len(), 1);
    }

    #[test]
    fn the_vdso_is_named_from_our_own_copy() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let Some(line) = maps.lines().find(|l| l.ends_with("[vdso]")) else {
            eprintln!("no vDSO in this process: nothing to check");
            return;
        };
        let (a, b) = line
            .split_whitespace()
            .next()
            .unwrap()
            .split_once('-')
            .unwrap();
        let len = u64::from_str_radix(b, 16).unwrap() - u64::from_str_radix(a, 16).unwrap();
        let (mut files, mut ids) = (Vec::new(), FileIds::default());
        assert_eq!(ids.vdso(&mut files, len), Some(0));
        assert_eq!(ids.vdso(&mut files, len + 4096), None, "another ABI's vDSO");
        assert_eq!(files.len(), 1, "copied once");
        let names = crate::symbolize::UserSymbolizer::default().symbolize_file(
            &files[0].readable_path().unwrap().0,
            &[vdso_symbol_offset(&files[0], "__vdso_clock_gettime")],
        );
        // The vDSO names it twice (clock_gettime is an alias): either is right.
        assert!(
            names[0]
                .as_deref()
                .is_some_and(|n| n.ends_with("clock_gettime")),
            "{names:?}"
        );
    }

    /// The file offset of `name` in the ELF image `f` (the vDSO's vaddrs are its offsets).
    fn vdso_symbol_offset(f: &UserFile, name: &str) -> u64 {
        use object::{Object as _, ObjectSymbol as _};
        let bytes = std::fs::read(f.readable_path().unwrap().0).unwrap();
        let elf = object::File::parse(&*bytes).unwrap();
        elf.dynamic_symbols()
            .find(|s| s.name() == Ok(name))
            .map(|s| s.address())
            .expect("symbol in the vDSO")
    }

    #[test]
    fn a_file_with_another_identity_is_not_used() {
        let (mut files, mut ids) = (Vec::new(), FileIds::default());
        let me = std::process::id();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let m = std::fs::metadata(&exe).unwrap();
        let wrong = FileIdentity::Inode(m.dev(), m.ino() + 1);
        assert_eq!(ids.by_identity(&mut files, me, (0, 0), &exe, &wrong), None);
        let right = FileIdentity::Inode(m.dev(), m.ino());
        let id = ids.by_identity(&mut files, me, (0, 0), &exe, &right);
        assert_eq!(id, Some(0));
        // The same file found by path later has the same id.
        assert_eq!(ids.by_path(&mut files, me, &exe, None), id);
        let bogus = FileIdentity::BuildId(crate::process::kernel_records::BuildId::new(&[1, 2, 3]));
        assert_eq!(ids.by_identity(&mut files, me, (0, 0), &exe, &bogus), None);
    }
}
