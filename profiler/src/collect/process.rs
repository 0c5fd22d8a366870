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

use super::{
    perfmap::{self, PerfMap},
    untrusted::{OpenError, Root},
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
    /// A path that reads this very file now, for blazesym: the kept handle's, else that of
    /// the recorded path opened now (as safely as at first sight: the process may have put a
    /// FIFO there since), with that new handle, which must live while the path is used.
    pub fn readable_path(&self) -> Result<(PathBuf, Option<std::fs::File>), OpenError> {
        match &self.handle {
            Some(f) => Ok((super::untrusted::fd_path(f), None)),
            None => {
                let f = Root::host()?.open(&self.path)?;
                Ok((super::untrusted::fd_path(&f), Some(f)))
            }
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
    /// Addresses in anonymous memory that no perf map named yet, per pid, with what is needed
    /// to read its map: JIT code whose map line may come later (a JVM's perf-map-agent dumps
    /// on request). Read by `JitWork`, off the drain thread.
    unnamed_anon: HashMap<u32, (perfmap::Source, Vec<u64>)>,
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
                    self.queue_jit(pid, addrs);
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
            if !anon.is_empty() {
                self.queue_jit(pid, anon);
            }
        }
    }

    /// Notes anonymous-memory addresses of `pid` for its perf map. Only cheap /proc reads
    /// here (this runs on the drain thread); the map itself is read by `JitWork::read`.
    fn queue_jit(&mut self, pid: u32, addrs: Vec<u64>) {
        use std::collections::hash_map::Entry;
        match self.unnamed_anon.entry(pid) {
            Entry::Occupied(mut e) => e.get_mut().1.extend(addrs),
            Entry::Vacant(e) => {
                // Gone already: nothing says whose map /tmp/perf-PID.map would be.
                if let Some(src) = perfmap::Source::of(pid) {
                    e.insert((src, addrs));
                }
            }
        }
    }

    /// Takes the addresses waiting for a perf map, to be read (`JitWork::read`, blocking file
    /// work) where no samples are drained and no HTTP is served, then given back to
    /// `apply_jit_names`.
    fn jit_work(&mut self) -> JitWork {
        JitWork(std::mem::take(&mut self.unnamed_anon).into_iter().collect())
    }

    /// Names the addresses `names` found; keeps the rest waiting for a later read while
    /// their process lives (its map may grow).
    fn apply_jit_names(&mut self, names: JitNames) {
        for (pid, src, mut addrs, map) in names.0 {
            for &addr in &addrs {
                if self.locs.get(&(pid, addr)) != Some(&UserLoc::Unknown) {
                    continue;
                }
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
            addrs.retain(|a| self.locs.get(&(pid, *a)) == Some(&UserLoc::Unknown));
            if !addrs.is_empty() && std::path::Path::new(&format!("/proc/{pid}")).exists() {
                self.unnamed_anon
                    .entry(pid)
                    .or_insert((src, Vec::new()))
                    .1
                    .extend(addrs);
            }
        }
    }

    /// Reads the perf maps of the processes with unnamed anonymous-memory addresses, on a
    /// blocking thread (the caller's may drain samples or serve HTTP), and names them.
    pub async fn name_jit_code(&mut self) -> std::io::Result<()> {
        let work = self.jit_work();
        let names = tokio::task::spawn_blocking(move || work.read())
            .await
            .map_err(std::io::Error::other)?;
        self.apply_jit_names(names);
        Ok(())
    }
}

/// Perf maps to read: (pid, source, addresses), sent to a blocking thread.
struct JitWork(Vec<(u32, (perfmap::Source, Vec<u64>))>);

/// `JitWork` done: each process's map (empty when it has none or it was refused).
struct JitNames(Vec<(u32, perfmap::Source, Vec<u64>, PerfMap)>);

impl JitWork {
    /// Reads each process's map once. Blocking file work, bounded by the map caps.
    fn read(self) -> JitNames {
        JitNames(
            self.0
                .into_iter()
                .map(|(pid, (src, mut addrs))| {
                    addrs.sort_unstable();
                    addrs.dedup();
                    let map = perfmap::read(pid, &src).unwrap_or_default();
                    (pid, src, addrs, map)
                })
                .collect(),
        )
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
    // In the process's root (the host's when it is gone). Non-blocking and regular files
    // only: the path is the process's to replace (by a FIFO, say) after it mapped the file.
    let handle = Root::of_process(pid)
        .or_else(|_| Root::host())
        .map_err(OpenError::from)
        .and_then(|root| root.open(path))
        .map_err(|e| log::debug!("pid {pid}: {} not opened: {e}", path.display()))
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
    let build = |query: bool| {
        Normalizer::builder()
            .enable_procmap_query(query)
            .enable_vma_caching(false)
            .enable_build_ids(true)
            .enable_build_id_caching(true)
            .build()
    };
    let probe = build(true);
    let here = new_normalizer as fn() -> Normalizer as usize as u64;
    if probe
        .normalize_user_addrs(std::process::id().into(), &[here])
        .is_ok()
    {
        probe
    } else {
        build(false)
    }
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
