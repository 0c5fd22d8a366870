//! Facts that vanish with a process, taken while it lives: its exe and comm, and for each user
//! address the file it maps and the offset in that file ("normalization", via blazesym). With
//! those, symbolization can happen later, even after the process exits.
use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
};

use blazesym::{
    normalize::{Normalizer, UserMeta},
    symbolize::Reason,
};

use crate::profile::Process;

/// A mapped file that user addresses fall in.
#[derive(Debug)]
pub struct UserFile {
    /// Path as the process saw it (in its own mount namespace).
    pub path: PathBuf,
    /// GNU build id, when the file has one.
    pub build_id: Option<Vec<u8>>,
    /// The file itself, opened through /proc/PID/root while the process lived: it stays
    /// readable after the process exits, in another mount namespace, or once deleted.
    pub handle: Option<std::fs::File>,
}

impl UserFile {
    /// A path that reads this very file now: the kept handle, else the recorded path.
    pub fn readable_path(&self) -> PathBuf {
        match &self.handle {
            Some(f) => PathBuf::from(format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(f)
            )),
            None => self.path.clone(),
        }
    }
}

/// Open file handles kept at most, below the usual descriptor limit; beyond it files are read
/// by path (fine for host binaries that stay on disk).
const MAX_HANDLES: usize = 4096;

/// Where a user address points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UserLoc {
    /// In `ProcessTable::files[file]`, at this file offset.
    File { file: u32, offset: u64 },
    /// JIT code named by the process's perf map: `ProcessTable::names[_]` (`perfmap`).
    Named(u32),
    /// Anonymous memory, vdso, or the process was gone before we looked.
    Unknown,
}

pub struct ProcessTable {
    pub processes: BTreeMap<u32, Process>,
    pub files: Vec<UserFile>,
    /// Files by identity (device, inode): one path can name different files in different
    /// containers, and one file can have several paths. None: not an ELF file (see `file_id`).
    file_ids: HashMap<(u64, u64), Option<u32>>,
    /// Every (pid, address) seen, resolved or not yet.
    pub locs: HashMap<(u32, u64), UserLoc>,
    /// Addresses seen since the last `resolve_pending`, per pid.
    pending: HashMap<u32, Vec<u64>>,
    /// Addresses in anonymous memory that no perf map named yet, per pid: JIT code whose
    /// map line may come later (a JVM's perf-map-agent dumps on request). `retry_jit_names`.
    unnamed_anon: HashMap<u32, Vec<u64>>,
    /// JIT symbol names (`UserLoc::Named`), each once.
    pub names: Vec<String>,
    name_ids: HashMap<String, u32>,
    normalizer: Normalizer,
}

impl Default for ProcessTable {
    fn default() -> Self {
        Self {
            processes: BTreeMap::new(),
            files: Vec::new(),
            file_ids: HashMap::new(),
            locs: HashMap::new(),
            pending: HashMap::new(),
            unnamed_anon: HashMap::new(),
            names: Vec::new(),
            name_ids: HashMap::new(),
            normalizer: new_normalizer(),
        }
    }
}

impl ProcessTable {
    /// Notes a sample of `pid` with these user addresses.
    pub fn saw(&mut self, pid: u32, user_addrs: &[u64]) {
        if pid == 0 {
            return; // the idle task
        }
        self.processes
            .entry(pid)
            .or_insert_with(|| read_process(pid));
        for &addr in user_addrs {
            self.locs.entry((pid, addr)).or_insert_with(|| {
                self.pending.entry(pid).or_default().push(addr);
                UserLoc::Unknown
            });
        }
    }

    /// Maps every pending address to (file, offset), reading /proc/PID/maps of live processes.
    pub fn resolve_pending(&mut self) {
        for (pid, addrs) in std::mem::take(&mut self.pending) {
            let normalized = match self.normalizer.normalize_user_addrs(pid.into(), &addrs) {
                Ok(n) => n,
                Err(e) => {
                    log::debug!("pid {pid}: cannot read its mappings: {e}");
                    self.name_jit_code(pid, &addrs);
                    continue; // the rest stay Unknown
                }
            };
            let metas: Vec<Option<u32>> = normalized
                .meta
                .iter()
                .map(|meta| match meta {
                    UserMeta::Elf(elf) => file_id(
                        &mut self.files,
                        &mut self.file_ids,
                        pid,
                        &elf.path,
                        elf.build_id.as_deref(),
                    ),
                    _ => None,
                })
                .collect();
            let mut anon = Vec::new();
            for (&addr, &(offset, meta)) in addrs.iter().zip(&normalized.outputs) {
                if let Some(Some(file)) = metas.get(meta) {
                    self.locs.insert(
                        (pid, addr),
                        UserLoc::File {
                            file: *file,
                            offset,
                        },
                    );
                } else if let Some(UserMeta::Unknown(u)) = normalized.meta.get(meta)
                    && u.reason == Reason::MissingComponent
                {
                    anon.push(addr);
                }
            }
            self.name_jit_code(pid, &addrs);
            anon.retain(|a| self.locs.get(&(pid, *a)) == Some(&UserLoc::Unknown));
            if !anon.is_empty() {
                self.unnamed_anon.entry(pid).or_default().extend(anon);
            }
        }
    }

    /// Tries the perf maps again for anonymous-memory addresses none named yet: the map may
    /// have been written after they were first seen. One read per such live process; the
    /// agent calls this once per window, `record` once before symbolizing.
    pub fn retry_jit_names(&mut self) {
        for (pid, mut addrs) in std::mem::take(&mut self.unnamed_anon) {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                continue; // exited: its map is of no use now, and it will not grow
            }
            self.name_jit_code(pid, &addrs);
            addrs.retain(|a| self.locs.get(&(pid, *a)) == Some(&UserLoc::Unknown));
            if !addrs.is_empty() {
                self.unnamed_anon.insert(pid, addrs);
            }
        }
    }

    /// Names `addrs` still unknown from `pid`'s perf map, read at most once per call: a JIT
    /// appends to it as it compiles, so a later pass sees newer code.
    fn name_jit_code(&mut self, pid: u32, addrs: &[u64]) {
        let mut map = None;
        for &addr in addrs {
            if self.locs.get(&(pid, addr)) != Some(&UserLoc::Unknown) {
                continue;
            }
            let map = map.get_or_insert_with(|| super::perfmap::read(pid).unwrap_or_default());
            let Some(name) = map.lookup(addr) else {
                continue;
            };
            let next = self.names.len() as u32;
            let id = *self.name_ids.entry(name.to_owned()).or_insert_with(|| {
                self.names.push(name.to_owned());
                next
            });
            self.locs.insert((pid, addr), UserLoc::Named(id));
        }
    }
}

/// The id of the file `path` names in `pid`'s mount namespace, opening it on first sight.
/// None for a file that is not ELF: a return address that lands in a mapped data file (the
/// locale archive, say) comes from a frame-pointer walk through code built without them,
/// and `LC_CTYPE+0xc6b` would be a made-up frame; such addresses stay unknown.
fn file_id(
    files: &mut Vec<UserFile>,
    ids: &mut HashMap<(u64, u64), Option<u32>>,
    pid: u32,
    path: &std::path::Path,
    build_id: Option<&[u8]>,
) -> Option<u32> {
    use std::os::unix::fs::{FileExt as _, MetadataExt as _};
    let in_ns =
        PathBuf::from(format!("/proc/{pid}/root")).join(path.strip_prefix("/").unwrap_or(path));
    let handle = std::fs::File::open(&in_ns)
        .or_else(|_| std::fs::File::open(path))
        .ok();
    let key = handle
        .as_ref()
        .and_then(|f| f.metadata().ok())
        .map_or((u64::MAX, files.len() as u64), |m| (m.dev(), m.ino()));
    if let Some(&id) = ids.get(&key) {
        return id;
    }
    let mut magic = [0u8; 4];
    if let Some(f) = &handle
        && f.read_exact_at(&mut magic, 0).is_ok()
        && magic != *b"\x7fELF"
    {
        ids.insert(key, None);
        return None;
    }
    let handle = handle.filter(|_| files.len() < MAX_HANDLES);
    files.push(UserFile {
        path: path.to_owned(),
        build_id: build_id.map(<[u8]>::to_vec),
        handle,
    });
    let id = files.len() as u32 - 1;
    ids.insert(key, Some(id));
    Some(id)
}

/// A normalizer that looks up only the mappings it needs: with the PROCMAP_QUERY ioctl (Linux
/// 6.11+) one query per new address, instead of reading and parsing all of /proc/PID/maps,
/// which dominated the collector's own CPU use on busy hosts. No VMA caching: a process may map
/// new code (dlopen) between two looks, and a per-pid cache would grow with pid churn.
fn new_normalizer() -> Normalizer {
    build_normalizer(procmap_query_supported())
}

fn build_normalizer(procmap_query: bool) -> Normalizer {
    Normalizer::builder()
        .enable_procmap_query(procmap_query)
        .enable_vma_caching(false)
        .enable_build_ids(true)
        .enable_build_id_caching(true)
        .build()
}

/// Whether this kernel answers PROCMAP_QUERY: one of our own addresses normalized through it.
/// Also reported at start by `bpf::features`.
pub fn procmap_query_supported() -> bool {
    let here = procmap_query_supported as fn() -> bool as usize as u64;
    build_normalizer(true)
        .normalize_user_addrs(std::process::id().into(), &[here])
        .is_ok()
}

fn read_process(pid: u32) -> Process {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim_end().to_owned())
        .unwrap_or_default();
    let cgroups = super::cgroup::read_process_cgroups(pid);
    Process {
        pid,
        comm,
        exe,
        cgroup: cgroups.v2,
        memory_cgroup: cgroups.memory,
        cpu_cgroup: cgroups.cpu,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_elf_files_get_an_id() {
        let (mut files, mut ids) = (Vec::new(), HashMap::new());
        let me = std::process::id();
        let data = std::env::temp_dir().join(format!("profiler-not-elf-{me}"));
        std::fs::write(&data, b"LC_CTYPE data, not code").unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        assert_eq!(file_id(&mut files, &mut ids, me, &data, None), None);
        let id = file_id(&mut files, &mut ids, me, &exe, None);
        assert_eq!(id, Some(0));
        // Known files keep their answer.
        assert_eq!(file_id(&mut files, &mut ids, me, &data, None), None);
        assert_eq!(file_id(&mut files, &mut ids, me, &exe, None), id);
        assert_eq!(files.len(), 1);
        std::fs::remove_file(&data).unwrap();
    }
}
