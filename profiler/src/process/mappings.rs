//! Per-process executable mappings in time, built from the kernel's records
//! (`kernel_records`): which file, at which offset, each (pid, address range) maps, and since
//! when. An exec starts a new address space; a fork copies the parent's. Samples are resolved
//! against the space in force at their time, so a process that execs another binary is
//! attributed to each binary in turn. The in-kernel unwinder needs the same shape:
//! (pid, address) -> (binary, file offset).
use std::{fs::File, os::unix::fs::MetadataExt as _, path::PathBuf, sync::Arc};

use crate::util::FxMap;

/// One executable mapping of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mapping {
    /// First address, inclusive.
    pub start: u64,
    /// End address, exclusive.
    pub end: u64,
    /// File offset of `start`, bytes (so `addr - start + file_offset` is the file offset).
    pub file_offset: u64,
    /// Index into `ProcessTable::files`.
    pub file: u32,
}

/// One address space of a process: from a fork or an exec to the next exec.
#[derive(Clone, Debug, Default)]
pub(crate) struct AddressSpace {
    /// CLOCK_MONOTONIC time it came into force, ns (0: before the recording).
    pub since_ns: u64,
    /// Every executable mapping of the space is here: it began during the recording (exec, or
    /// fork of a complete space). A process that existed before the recording is not complete:
    /// what is missing is looked up in /proc.
    pub complete: bool,
    /// Sorted by `start`, not overlapping.
    maps: Vec<Mapping>,
}

impl AddressSpace {
    /// The mapping holding `addr`.
    pub(crate) fn lookup(&self, addr: u64) -> Option<&Mapping> {
        let i = self.maps.partition_point(|m| m.start <= addr);
        self.maps[..i].last().filter(|m| addr < m.end)
    }

    /// Every mapping, by address.
    pub(crate) fn mappings(&self) -> &[Mapping] {
        &self.maps
    }

    /// Adds `m`; what it overlaps was unmapped or replaced (the kernel sends no munmap for
    /// mappings, so a new mapping over an old range is how replacement shows).
    fn insert(&mut self, m: Mapping) {
        let mut kept = Vec::with_capacity(self.maps.len() + 2);
        for old in self.maps.drain(..) {
            if old.end <= m.start || old.start >= m.end {
                kept.push(old);
                continue;
            }
            if old.start < m.start {
                kept.push(Mapping {
                    end: m.start,
                    ..old
                });
            }
            if old.end > m.end {
                kept.push(Mapping {
                    start: m.end,
                    file_offset: old.file_offset + (m.end - old.start),
                    ..old
                });
            }
        }
        kept.push(m);
        kept.sort_by_key(|m| m.start);
        self.maps = kept;
    }
}

/// Address spaces of every process the kernel told us about, oldest first per pid.
#[derive(Default)]
pub(crate) struct MappingTable {
    spaces: FxMap<u32, Vec<AddressSpace>>,
}

impl MappingTable {
    /// The space `pid` had at `time_ns` and its index (its generation: 0 for the first one we
    /// know of, +1 for each exec or pid reuse); None when the kernel told us nothing of `pid`.
    pub(crate) fn space_at(&self, pid: u32, time_ns: u64) -> Option<(u32, &AddressSpace)> {
        let spaces = self.spaces.get(&pid)?;
        let i = spaces.partition_point(|s| s.since_ns <= time_ns);
        // A sample older than every space known: the process existed before its first
        // record (a pre-existing process that mapped something new): generation 0.
        let i = i.saturating_sub(1);
        Some((i as u32, &spaces[i]))
    }

    /// `pid`'s space of generation `generation` (see `space_at`).
    pub(crate) fn space(&self, pid: u32, generation: u32) -> Option<&AddressSpace> {
        self.spaces.get(&pid)?.get(generation as usize)
    }

    /// How many spaces `pid` has had (0: the kernel told us nothing of it).
    pub(crate) fn generations(&self, pid: u32) -> u32 {
        self.spaces.get(&pid).map_or(0, |s| s.len() as u32)
    }

    /// `pid` ran exec at `time_ns`: a new, empty, complete space.
    pub(crate) fn exec(&mut self, pid: u32, time_ns: u64) {
        // A process from before the recording: what it ran until now is its generation 0
        // (in /proc only, and no longer there: its samples stay unknown, not misnamed).
        self.spaces
            .entry(pid)
            .or_insert_with(|| vec![AddressSpace::default()]);
        self.push(
            pid,
            AddressSpace {
                since_ns: time_ns,
                complete: true,
                maps: Vec::new(),
            },
        );
    }

    /// `pid` forked from `ppid` at `time_ns` with a copy of its mappings. `parent_seed`
    /// gives the parent's mappings when the table knows nothing of it (a process that
    /// existed before the recording, read from /proc now).
    pub(crate) fn fork(
        &mut self,
        pid: u32,
        ppid: u32,
        time_ns: u64,
        parent_seed: impl FnOnce() -> Option<Vec<Mapping>>,
    ) {
        if !self.spaces.contains_key(&ppid)
            && let Some(maps) = parent_seed()
        {
            let mut seeded = AddressSpace::default();
            for m in maps {
                seeded.insert(m);
            }
            // Complete as far as /proc showed it; later mappings come as records.
            seeded.complete = true;
            self.spaces.insert(ppid, vec![seeded]);
        }
        let space = match self.space_at(ppid, time_ns) {
            Some((_, parent)) => AddressSpace {
                since_ns: time_ns,
                ..parent.clone()
            },
            None => AddressSpace {
                since_ns: time_ns,
                complete: false,
                maps: Vec::new(),
            },
        };
        self.push(pid, space);
    }

    /// `pid` mapped `m` at `time_ns`.
    pub(crate) fn map(&mut self, pid: u32, time_ns: u64, m: Mapping) {
        let spaces = self.spaces.entry(pid).or_insert_with(|| {
            // First news of a process that existed before the recording.
            vec![AddressSpace::default()]
        });
        let i = spaces
            .partition_point(|s| s.since_ns <= time_ns)
            .saturating_sub(1);
        spaces[i].insert(m);
    }

    /// Forgets `pid` (the agent, once a process has exited and its samples are resolved).
    pub(crate) fn remove(&mut self, pid: u32) {
        self.spaces.remove(&pid);
    }

    /// Pids known.
    pub(crate) fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.spaces.keys().copied()
    }

    fn push(&mut self, pid: u32, space: AddressSpace) {
        let spaces = self.spaces.entry(pid).or_default();
        let i = spaces.partition_point(|s| s.since_ns <= space.since_ns);
        spaces.insert(i, space);
    }
}

/// One executable file mapping of a process.
#[derive(Clone, Debug)]
pub(crate) struct MappingSpec {
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// Offset in the file of `start`.
    pub(crate) file_offset: u64,
    /// A path that reads the file now (e.g. through /proc/PID/root), for logs and when
    /// `file` is None.
    pub(crate) path: PathBuf,
    /// The mapped file itself, opened by the collector when the kernel reported the mapping
    /// (so it reads after the process exited, or in another mount namespace).
    pub(crate) file: Option<Arc<File>>,
    /// (device, inode) of `file` when the collector knows it already; else `key` reads it.
    pub(crate) key: Option<(u64, u64)>,
}

impl PartialEq for MappingSpec {
    fn eq(&self, o: &Self) -> bool {
        (self.start, self.end, self.file_offset, &self.path)
            == (o.start, o.end, o.file_offset, &o.path)
    }
}
impl Eq for MappingSpec {}

impl MappingSpec {
    pub(crate) fn open(&self) -> Option<File> {
        match &self.file {
            Some(f) => f.try_clone().ok(),
            None => File::open(&self.path).ok(),
        }
    }

    /// (device, inode) of the file, without opening it when it is open already, and without
    /// a syscall when the collector read it when it opened the file (a process's mappings
    /// are looked up at each load: an fstat each is a visible share of the agent's CPU under
    /// churn).
    pub(crate) fn key(&self) -> Option<(u64, u64)> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn m(start: u64, end: u64, file_offset: u64, file: u32) -> Mapping {
        Mapping {
            start,
            end,
            file_offset,
            file,
        }
    }

    #[test]
    fn exec_replaces_the_space_in_time_order() {
        let mut t = MappingTable::default();
        t.fork(10, 1, 100, || Some(vec![m(0x1000, 0x2000, 0, 7)]));
        t.exec(10, 200);
        t.map(10, 201, m(0x1000, 0x3000, 0x1000, 8));
        let (g0, before) = t.space_at(10, 150).unwrap();
        let (g1, after) = t.space_at(10, 250).unwrap();
        assert_eq!((g0, g1), (0, 1));
        assert_eq!(
            before.lookup(0x1800).unwrap().file,
            7,
            "the parent's binary"
        );
        assert_eq!(after.lookup(0x1800).unwrap().file, 8, "the exec'd binary");
        assert!(before.complete && after.complete);
        // The parent was seeded from "/proc" and is complete as well.
        assert_eq!(t.space_at(1, 0).unwrap().1.lookup(0x1fff).unwrap().file, 7);
        assert!(after.lookup(0x3000).is_none(), "end is exclusive");
    }

    #[test]
    fn records_read_out_of_order_still_land_in_their_space() {
        let mut t = MappingTable::default();
        // The child's exec (another CPU) is read before its fork.
        t.exec(20, 300);
        t.map(20, 301, m(0x5000, 0x6000, 0, 3));
        t.fork(20, 2, 250, || None);
        assert!(!t.space_at(20, 260).unwrap().1.complete, "parent unknown");
        assert_eq!(
            t.space_at(20, 400).unwrap().1.lookup(0x5000).unwrap().file,
            3
        );
    }

    #[test]
    fn a_new_mapping_cuts_what_it_overlaps() {
        let mut s = AddressSpace::default();
        s.insert(m(0x1000, 0x5000, 0x100, 1));
        s.insert(m(0x2000, 0x3000, 0, 2));
        let files: Vec<(u64, u64, u64, u32)> = s
            .mappings()
            .iter()
            .map(|m| (m.start, m.end, m.file_offset, m.file))
            .collect();
        assert_eq!(
            files,
            [
                (0x1000, 0x2000, 0x100, 1),
                (0x2000, 0x3000, 0, 2),
                (0x3000, 0x5000, 0x2100, 1)
            ]
        );
    }

    #[test]
    fn a_pre_existing_process_is_incomplete() {
        let mut t = MappingTable::default();
        t.map(30, 500, m(0x7000, 0x8000, 0, 4));
        let (g, s) = t.space_at(30, 10).unwrap();
        assert_eq!(g, 0);
        assert!(
            !s.complete,
            "mappings made before the recording are in /proc only"
        );
        assert!(t.space_at(31, 10).is_none());
        // It execs: samples before are in its old space, not the new binary's.
        t.exec(31, 600);
        assert_eq!(
            t.space_at(31, 10).map(|(g, s)| (g, s.complete)),
            Some((0, false))
        );
        assert_eq!(
            t.space_at(31, 700).map(|(g, s)| (g, s.complete)),
            Some((1, true))
        );
    }

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
