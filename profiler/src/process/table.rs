//! Facts that vanish with a process, taken while it lives: its exe and comm, and for each user
//! address the file it maps and the offset in that file. The kernel reports every executable
//! mapping, exec, fork and exit as it happens (`kernel_records`, kept in `MappingTable`), so
//! a process that lived 5 ms resolves like one that lived an hour; /proc is read only for
//! processes that existed before the recording. With those, symbolization can happen later,
//! even after the process exits.
use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
    sync::Arc,
};

use blazesym::{
    normalize::{Normalizer, UserMeta},
    symbolize::Reason,
};

use super::{
    files::{FileIds, UserFile},
    kernel_records::{FileIdentity, KernelRecord},
    lifetimes::LifetimeLog,
    mappings::{Mapping, MappingTable},
    perfmap,
};
use crate::{
    profile::{Lifetime, Process},
    util::{FxMap, FxSet},
};

/// One address space of one process: its pid in the low half, in the high half which of its
/// execs (its generation in `MappingTable`). User stacks and addresses are keyed by it, as
/// one pid maps different binaries before and after an exec.
pub(crate) type SpaceId = u64;

/// The pid of a space.
pub(crate) fn space_pid(space: SpaceId) -> u32 {
    space as u32
}

/// The space of `pid`'s generation `generation`.
pub(crate) fn space_id(pid: u32, generation: u32) -> SpaceId {
    u64::from(pid) | (u64::from(generation) << 32)
}

/// Where a user address points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UserLoc {
    /// In `ProcessTable::files[file]`, at this file offset.
    File { file: u32, offset: u64 },
    /// JIT code named by the process's perf map: `ProcessTable::names[_]` (`perfmap`).
    Named(u32),
    /// Anonymous memory, vdso, or the process was gone before we looked.
    Unknown,
}

pub(crate) struct ProcessTable {
    pub(super) processes: BTreeMap<u32, Process>,
    /// Shared with the windows cut from this table (`Collection::cut`), which symbolize
    /// on another thread while this one goes on.
    pub(super) files: Vec<std::sync::Arc<UserFile>>,
    pub(super) file_ids: FileIds,
    /// Executable mappings per process and exec, from the kernel's records.
    pub(super) mappings: MappingTable,
    /// Fork, exec and exit of every process, from the kernel.
    pub(super) lifetimes: LifetimeLog,
    /// Kernel records dropped because a ring was full: mappings may be missing.
    pub(crate) lost_records: u64,
    /// Every (space, address) seen, resolved or not yet.
    pub(super) locs: HashMap<(SpaceId, u64), UserLoc>,
    /// Addresses seen since the last `resolve_pending`, per space.
    pub(super) pending: HashMap<SpaceId, Vec<u64>>,
    /// Addresses in anonymous memory that no perf map named yet, per space, with what is
    /// needed to read its map: JIT code whose map line may come later (a JVM's perf-map-agent
    /// dumps on request). Read by `JitWork`, off the drain thread.
    pub(super) unnamed_anon: HashMap<SpaceId, (perfmap::Source, Vec<u64>)>,
    /// JIT symbol names (`UserLoc::Named`), each once.
    pub(super) names: crate::util::Dense<String>,
    pub(super) normalizer: Normalizer,
    /// Comms read from /proc of parents from before the recording (the kernel never told
    /// us theirs), so a shell or supervisor forking 60 times a second is read once, not at
    /// every fork; dropped at its exec or exit.
    pub(super) parent_comms: FxMap<u32, String>,
}

/// What this span's user addresses need of the process table: shared files, the location of
/// each address, JIT names, and the processes and lifetimes to show.
#[derive(Default)]
pub(crate) struct ProcessFacts {
    pub processes: BTreeMap<u32, Process>,
    /// Indexed by `UserLoc::File::file`; shared with the live table.
    pub files: Vec<Arc<UserFile>>,
    pub locs: HashMap<(SpaceId, u64), UserLoc>,
    /// Indexed by `UserLoc::Named`.
    pub jit_names: crate::util::Dense<String>,
    /// Fork, exec and exit of the processes the comm filter keeps, times as offsets from
    /// the span's start.
    pub lifetimes: Vec<Lifetime>,
}

impl ProcessTable {
    /// What symbolizing a window needs of this table: the processes, the files (shared),
    /// the JIT names, and the locations of the window's addresses only.
    pub(crate) fn window_facts(&self, addrs: impl Iterator<Item = (SpaceId, u64)>) -> ProcessFacts {
        ProcessFacts {
            processes: self.processes.clone(),
            files: self.files.clone(),
            locs: addrs
                .filter_map(|k| self.locs.get(&k).map(|l| (k, *l)))
                .collect(),
            jit_names: self.names.clone(),
            lifetimes: Vec::new(),
        }
    }

    /// The lifetimes logged since the last take (those of live processes carry on).
    pub(crate) fn take_lifetimes(&mut self) -> LifetimeLog {
        self.lifetimes.take_window()
    }

    /// Forgets the processes `is_alive` says are gone; starts afresh (keeping the kernel's
    /// lifetimes of live processes) when the table outgrows `bounds`, and then returns true.
    pub(crate) fn prune(
        &mut self,
        is_alive: &mut dyn FnMut(u32) -> bool,
        bounds: TableBounds,
    ) -> bool {
        self.processes.retain(|pid, _| is_alive(*pid));
        self.locs
            .retain(|(space, _), _| is_alive(space_pid(*space)));
        let dead: Vec<u32> = self.mappings.pids().filter(|&p| !is_alive(p)).collect();
        for pid in dead {
            self.mappings.remove(pid);
        }
        let reset = self.files.len() > bounds.files
            || self.locs.len() > bounds.locs
            || self.names.len() > bounds.locs;
        if reset {
            log::info!(
                "process table reset ({} files, {} addresses): live processes are read again",
                self.files.len(),
                self.locs.len()
            );
            let lifetimes = std::mem::take(&mut self.lifetimes);
            *self = ProcessTable::default();
            self.lifetimes = lifetimes;
        }
        reset
    }

    /// Whether `pid` has been seen (a sample, or /proc read for it).
    pub(crate) fn knows(&self, pid: u32) -> bool {
        self.processes.contains_key(&pid)
    }

    /// Whether the kernel's records hold an executable mapping of `pid` at `addr` at
    /// `time_ns`.
    pub(crate) fn maps_address(&self, pid: u32, time_ns: u64, addr: u64) -> bool {
        self.mappings
            .space_at(pid, time_ns)
            .is_some_and(|(_, space)| space.lookup(addr).is_some())
    }
}

/// How much a process table remembers across windows at most; past it the table starts
/// afresh (live processes are simply read again when next seen), which bounds open handles
/// and memory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TableBounds {
    /// Mapped files.
    pub files: usize,
    /// Addresses (and JIT names).
    pub locs: usize,
}

impl Default for ProcessTable {
    fn default() -> Self {
        Self {
            processes: BTreeMap::new(),
            files: Vec::new(),
            file_ids: FileIds::default(),
            mappings: MappingTable::default(),
            lifetimes: LifetimeLog::default(),
            lost_records: 0,
            locs: HashMap::new(),
            pending: HashMap::new(),
            unnamed_anon: HashMap::new(),
            names: crate::util::Dense::default(),
            normalizer: new_normalizer(),
            parent_comms: FxMap::default(),
        }
    }
}

impl ProcessTable {
    /// Notes a sample of `pid` at `time_ns` with these user addresses; returns the address
    /// space they belong to. The kernel's records up to `time_ns` must be applied first.
    pub(crate) fn saw(&mut self, pid: u32, time_ns: u64, user_addrs: &[u64]) -> SpaceId {
        if pid == 0 {
            return 0; // the idle task
        }
        let space = self.space_at(pid, time_ns);
        if !self.processes.contains_key(&pid) {
            let mut p = self.born_here(pid).unwrap_or_else(|| read_process(pid));
            // Gone before we looked: the kernel told us what it ran.
            if p.comm.is_empty() {
                self.lifetimes
                    .comm(pid)
                    .unwrap_or_default()
                    .clone_into(&mut p.comm);
            }
            if p.exe.is_empty() {
                self.lifetimes
                    .exe(pid)
                    .unwrap_or_default()
                    .clone_into(&mut p.exe);
            }
            self.processes.insert(pid, p);
        }
        for &addr in user_addrs {
            self.locs.entry((space, addr)).or_insert_with(|| {
                self.pending.entry(space).or_default().push(addr);
                UserLoc::Unknown
            });
        }
        space
    }

    /// Whether generation `space` may run a Python interpreter: false only when the kernel's
    /// records hold all of its mappings (it began during the recording, or its parent's were
    /// read from /proc) and none is a file named like one. A string test per mapping, no
    /// read: most processes of a churn (`/bin/true`) are decided without touching /proc.
    pub(crate) fn may_run_python(&self, space: SpaceId) -> bool {
        let generation = (space >> 32) as u32;
        match self.mappings.space(space_pid(space), generation) {
            Some(s) if s.complete => s.mappings().iter().any(|m| {
                self.files
                    .get(m.file as usize)
                    .and_then(|f| f.path.to_str())
                    .is_none_or(crate::process::interpreter_named)
            }),
            _ => true,
        }
    }

    /// A process whose exec the kernel's records told (it began during the recording): its
    /// comm and executable from them, only its cgroups read from /proc. Under a churn of
    /// short-lived processes that is one /proc read per new process instead of three (the
    /// exe link, comm, cgroup). None: read it all from /proc. The comm is the one exec set
    /// (a later prctl rename is not in the records; each sample carries its thread's own).
    fn born_here(&self, pid: u32) -> Option<Process> {
        let (comm, exe) = (self.lifetimes.comm(pid)?, self.lifetimes.exe(pid)?);
        let cgroups = crate::cgroups::read_process_cgroups(pid);
        Some(Process {
            pid,
            comm: comm.to_owned(),
            exe: exe.to_owned(),
            cgroup: cgroups.v2,
            memory_cgroup: cgroups.memory,
            cpu_cgroup: cgroups.cpu,
        })
    }

    /// The address space `pid` had at `time_ns`, as far as the kernel's records read so far
    /// tell (its first generation when they tell nothing of it).
    pub(crate) fn space_at(&self, pid: u32, time_ns: u64) -> SpaceId {
        space_id(
            pid,
            self.mappings.space_at(pid, time_ns).map_or(0, |(g, _)| g),
        )
    }

    /// `apply_except` with every process kept.
    #[cfg(test)]
    pub(crate) fn apply(&mut self, records: &[KernelRecord]) {
        self.apply_except(records, &FxSet::default());
    }

    /// Applies the kernel's records (in time order): mappings, execs, forks, exits. Of the
    /// processes in `unseen` (born and gone unsampled within `records`) only the lifetimes
    /// are kept: their mappings could serve no sample.
    pub(crate) fn apply_except(&mut self, records: &[KernelRecord], unseen: &FxSet<u32>) {
        for r in records {
            match r {
                KernelRecord::Map { pid, path, .. } if unseen.contains(pid) => {
                    if path.starts_with('/') && !path.starts_with("//") {
                        self.lifetimes.mapped(*pid, path);
                    }
                }
                KernelRecord::Exec { pid, time_ns, comm } if unseen.contains(pid) => {
                    self.lifetimes.exec(*pid, *time_ns, comm);
                }
                KernelRecord::Fork { pid, ppid, time_ns } if unseen.contains(pid) => {
                    let comm = self.fork_comm(*ppid);
                    self.lifetimes.fork(*pid, *ppid, *time_ns, comm);
                }
                KernelRecord::Map {
                    pid,
                    time_ns,
                    start,
                    end,
                    pgoff,
                    path,
                    id,
                } => {
                    let file = if path == "[vdso]" {
                        self.file_ids.vdso(&mut self.files, end - start)
                    } else if !path.starts_with('/') || path.starts_with("//") {
                        None // "//anon", "[uprobes]": no file to read
                    } else {
                        self.lifetimes.mapped(*pid, path);
                        self.file_ids.by_identity(
                            &mut self.files,
                            *pid,
                            (*start, *end),
                            Path::new(path),
                            id,
                        )
                    };
                    let Some(file) = file else {
                        continue;
                    };
                    let m = Mapping {
                        start: *start,
                        end: *end,
                        // The vDSO image is mapped whole from its start.
                        file_offset: if path == "[vdso]" { 0 } else { *pgoff },
                        file,
                    };
                    self.mappings.map(*pid, *time_ns, m);
                }
                KernelRecord::Exec { pid, time_ns, comm } => {
                    self.parent_comms.remove(pid);
                    self.mappings.exec(*pid, *time_ns);
                    self.lifetimes.exec(*pid, *time_ns, comm);
                }
                KernelRecord::Fork { pid, ppid, time_ns } => {
                    // A parent from before the recording: its mappings from /proc, once (it
                    // surely lives: it just forked).
                    let seed = if self.mappings.generations(*ppid) == 0 {
                        self.read_maps(*ppid)
                    } else {
                        None
                    };
                    self.mappings.fork(*pid, *ppid, *time_ns, || seed);
                    let comm = self.fork_comm(*ppid);
                    self.lifetimes.fork(*pid, *ppid, *time_ns, comm);
                }
                KernelRecord::Exit { pid, time_ns } => {
                    self.parent_comms.remove(pid);
                    self.lifetimes.exit(*pid, *time_ns);
                }
                KernelRecord::Lost(n) => self.lost_records += n,
            }
        }
    }

    /// The comm a child of `ppid` starts with: its parent's.
    fn fork_comm(&mut self, ppid: u32) -> Option<String> {
        match self.lifetimes.comm(ppid) {
            Some(c) => Some(c.to_owned()),
            None => self.parent_comm(ppid),
        }
    }

    /// The comm of `ppid`, a parent the kernel's records did not name: read from /proc
    /// once (`parent_comms`).
    fn parent_comm(&mut self, ppid: u32) -> Option<String> {
        if let Some(c) = self.parent_comms.get(&ppid) {
            return Some(c.clone());
        }
        let c = crate::util::proc_comm(ppid)?;
        // Bounded: exits drop entries, but records may be lost.
        if self.parent_comms.len() >= 4096 {
            self.parent_comms.clear();
        }
        self.parent_comms.insert(ppid, c.clone());
        Some(c)
    }

    /// `pid`'s executable file mappings at `time_ns` for the table walk's loader, each with
    /// the file kept open since the kernel reported it; None unless the kernel's records
    /// hold the whole space (a process from before the recording: read /proc instead).
    pub(crate) fn unwind_mappings(
        &self,
        pid: u32,
        time_ns: u64,
    ) -> Option<Vec<crate::process::MappingSpec>> {
        let (_, space) = self.mappings.space_at(pid, time_ns)?;
        if !space.complete {
            return None;
        }
        space
            .mappings()
            .iter()
            .map(|m| {
                let file = &self.files[m.file as usize];
                Some(crate::process::MappingSpec {
                    start: m.start,
                    end: m.end,
                    file_offset: m.file_offset,
                    path: file.path.clone(),
                    file: Some(std::sync::Arc::new(file.handle.as_ref()?.try_clone().ok()?)),
                    key: file.key,
                })
            })
            .collect()
    }

    /// A process's exit status (from the exit tracepoint).
    pub(crate) fn exited(&mut self, pid: u32, time_ns: u64, status: u32) {
        self.lifetimes.status(pid, time_ns, status);
    }

    /// The executable file mappings of a live process, from /proc/PID/maps.
    fn read_maps(&mut self, pid: u32) -> Option<Vec<Mapping>> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        let mut maps = Vec::new();
        for line in text.lines() {
            // start-end perms offset major:minor inode path
            let mut f = line.split_ascii_whitespace();
            let (Some(range), Some(perms), Some(off), Some(dev), Some(ino)) =
                (f.next(), f.next(), f.next(), f.next(), f.next())
            else {
                continue;
            };
            let path = f.collect::<Vec<_>>().join(" ");
            let vdso = path == "[vdso]";
            if perms.as_bytes().get(2) != Some(&b'x') || !(path.starts_with('/') || vdso) {
                continue;
            }
            let hex = |s: &str| u64::from_str_radix(s, 16).ok();
            let (Some((start, end)), Some(off), Some((maj, min)), Ok(ino)) = (
                range
                    .split_once('-')
                    .and_then(|(a, b)| Some((hex(a)?, hex(b)?))),
                hex(off),
                dev.split_once(':')
                    .and_then(|(a, b)| Some((hex(a)?, hex(b)?))),
                ino.parse::<u64>(),
            ) else {
                continue;
            };
            if vdso {
                if let Some(file) = self.file_ids.vdso(&mut self.files, end - start) {
                    maps.push(Mapping {
                        start,
                        end,
                        file_offset: 0,
                        file,
                    });
                }
                continue;
            }
            let identity = FileIdentity::Inode(libc::makedev(maj as u32, min as u32), ino);
            if let Some(file) = self.file_ids.by_identity(
                &mut self.files,
                pid,
                (start, end),
                Path::new(&path),
                &identity,
            ) {
                maps.push(Mapping {
                    start,
                    end,
                    file_offset: off,
                    file,
                });
            }
        }
        Some(maps)
    }

    /// Maps every pending address to (file, offset): from the kernel's mappings, else (a
    /// process from before the recording) from /proc/PID/maps of the live process.
    pub(crate) fn resolve_pending(&mut self) {
        for (space, addrs) in std::mem::take(&mut self.pending) {
            let pid = space_pid(space);
            let generation = (space >> 32) as u32;
            let known = self.mappings.space(pid, generation);
            // A sample taken inside execve, after the new image's exec record, still has the
            // old image's user registers (start_thread sets the new ones last): an address
            // the new space lacks is looked up in the one before.
            let before = generation
                .checked_sub(1)
                .and_then(|g| self.mappings.space(pid, g));
            let mut rest = Vec::new();
            for &addr in &addrs {
                let found = known
                    .and_then(|s| s.lookup(addr))
                    .or_else(|| before.and_then(|s| s.lookup(addr)));
                match found {
                    Some(m) => {
                        let offset = addr - m.start + m.file_offset;
                        self.locs.insert(
                            (space, addr),
                            UserLoc::File {
                                file: m.file,
                                offset,
                            },
                        );
                    }
                    None => rest.push(addr),
                }
            }
            if rest.is_empty() {
                continue;
            }
            // /proc shows only the current space, and a complete one has all its files:
            // what is left is anonymous memory (JIT code, perhaps).
            let current = generation + 1 >= self.mappings.generations(pid);
            if known.is_some_and(|s| s.complete) || !current {
                self.queue_jit(space, rest);
                continue;
            }
            self.resolve_from_proc(space, &rest);
        }
    }

    /// Today's way for processes from before the recording: blazesym reads their mappings.
    fn resolve_from_proc(&mut self, space: SpaceId, addrs: &[u64]) {
        let pid = space_pid(space);
        let normalized = match self.normalizer.normalize_user_addrs(pid.into(), addrs) {
            Ok(n) => n,
            Err(e) => {
                log::debug!("pid {pid}: cannot read its mappings: {e}");
                self.queue_jit(space, addrs.to_vec());
                return; // the rest stay Unknown
            }
        };
        let metas: Vec<Option<u32>> = normalized
            .meta
            .iter()
            .map(|meta| match meta {
                UserMeta::Elf(elf) => {
                    self.file_ids
                        .by_path(&mut self.files, pid, &elf.path, elf.build_id.as_deref())
                }
                _ => None,
            })
            .collect();
        let mut anon = Vec::new();
        for (&addr, &(offset, meta)) in addrs.iter().zip(&normalized.outputs) {
            if let Some(Some(file)) = metas.get(meta) {
                self.locs.insert(
                    (space, addr),
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
            self.queue_jit(space, anon);
        }
    }
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
pub(crate) fn procmap_query_supported() -> bool {
    let here = procmap_query_supported as fn() -> bool as usize as u64;
    build_normalizer(true)
        .normalize_user_addrs(std::process::id().into(), &[here])
        .is_ok()
}

fn read_process(pid: u32) -> Process {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let comm = crate::util::proc_comm(pid).unwrap_or_default();
    let cgroups = crate::cgroups::read_process_cgroups(pid);
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
pub(crate) mod tests;
