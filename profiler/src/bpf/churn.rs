//! The cgroup churn tracer, user side: loads `churn_mkdir` / `churn_rmdir` from the embedded
//! object onto the cgroup_mkdir / cgroup_rmdir raw tracepoints and reads the counts; and
//! `churn_attach` on cgroup_attach_task, which says which process went into which cgroup.
use aya::{
    Ebpf,
    maps::{HashMap, MapData},
    programs::RawTracePoint,
};
use profiler_common::churn::{
    AttachKey, ChurnKey, ChurnPathKey, EVENT_MKDIR, MAP_ATTACH, MAP_CHURN, MAP_CHURN_PATHS,
    PROGRAM_ATTACH, PROGRAM_MKDIR, PROGRAM_RMDIR,
};

use super::BpfError;

/// One process's cgroup churn.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ChurnCount {
    pub pid: u32,
    pub comm: String,
    /// cgroups created (all hierarchies).
    pub mkdirs: u64,
    /// cgroups removed (all hierarchies).
    pub rmdirs: u64,
    /// Parents (paths within a hierarchy, e.g. `/profiler-lab`) with mkdirs + rmdirs under
    /// each, most first.
    pub parents: Vec<(String, u64)>,
    /// Short-lived helpers whose churn was charged to this process (`doctor`): (comm,
    /// processes), most first; empty as the tracer counts.
    pub via: Vec<(String, u64)>,
}

/// The tracer, attached while it lives.
pub(crate) struct ChurnTracer {
    // Kept for the links: dropping it detaches.
    _ebpf: Ebpf,
    counts: HashMap<MapData, ChurnKey, u64>,
    /// An LRU hash map: aya reads it as a `HashMap`.
    paths: HashMap<MapData, ChurnPathKey, u64>,
    /// None when the kernel's BTF has no `task_struct.tgid` or the tracepoint is refused.
    attach: Option<HashMap<MapData, AttachKey, u64>>,
}

impl ChurnTracer {
    /// Loads and attaches both programs. Needs CAP_BPF + CAP_PERFMON (or root).
    pub(crate) fn start() -> Result<Self, BpfError> {
        let mut ebpf = super::load_tracer(&[MAP_CHURN_PATHS, MAP_ATTACH], &[])?;
        let tgid_offset = super::task::TaskOffsets::get().tgid;
        for (name, tracepoint) in [
            (PROGRAM_MKDIR, "cgroup_mkdir"),
            (PROGRAM_RMDIR, "cgroup_rmdir"),
        ] {
            let program: &mut RawTracePoint = ebpf
                .program_mut(name)
                .ok_or(BpfError::Missing("churn program"))?
                .try_into()?;
            program.load().map_err(|e| super::rejected(name, e))?;
            program.attach(tracepoint)?;
        }
        let counts = HashMap::try_from(
            ebpf.take_map(MAP_CHURN)
                .ok_or(BpfError::Missing("churn map"))?,
        )?;
        let paths = HashMap::try_from(
            ebpf.take_map(MAP_CHURN_PATHS)
                .ok_or(BpfError::Missing("churn paths map"))?,
        )?;
        // Which process ran in which cgroup is a nicety: churn is still counted without it.
        let attach = match tgid_offset {
            None => {
                log::warn!(
                    "cannot find task_struct.tgid in /sys/kernel/btf/vmlinux: processes are not linked to cgroups"
                );
                None
            }
            Some(_) => attach_program(&mut ebpf)
                .map_err(|e| {
                    log::warn!(
                        "processes are not linked to cgroups: {}",
                        crate::util::chain(&e)
                    );
                })
                .ok(),
        };
        Ok(Self {
            _ebpf: ebpf,
            counts,
            paths,
            attach,
        })
    }

    /// Counts so far, one entry per process, most churn first.
    pub(crate) fn counts(&self) -> Vec<ChurnCount> {
        by_process(self.counts.iter().flatten(), self.paths.iter().flatten())
    }

    /// Counts and attaches since the last take (or the start), and the maps emptied for the
    /// next: a tracer that runs for good (the agent's) reads it window by window. What the
    /// kernel adds between the read and the removal of a key is lost (a count or two).
    pub(crate) fn take(&mut self) -> (Vec<ChurnCount>, Option<Vec<(u32, String)>>) {
        let counts: Vec<(ChurnKey, u64)> = self.counts.iter().flatten().collect();
        for (key, _) in &counts {
            let _ = self.counts.remove(key);
        }
        let paths: Vec<(ChurnPathKey, u64)> = self.paths.iter().flatten().collect();
        for (key, _) in &paths {
            let _ = self.paths.remove(key);
        }
        let attaches = self.attaches();
        if let Some(map) = &mut self.attach {
            let keys: Vec<AttachKey> = map.keys().flatten().collect();
            for key in &keys {
                let _ = map.remove(key);
            }
        }
        (by_process(counts.into_iter(), paths.into_iter()), attaches)
    }

    /// Processes moved into cgroups so far: (pid, path within its hierarchy), sorted. A
    /// process moved into several hierarchies (one per v1 controller) has one entry per
    /// distinct path; None when attaches are not traced on this kernel.
    pub(crate) fn attaches(&self) -> Option<Vec<(u32, String)>> {
        let map = self.attach.as_ref()?;
        let mut v: Vec<(u32, String)> = map
            .iter()
            .flatten()
            .map(|(k, _)| (k.pid, crate::util::comm_str(&k.path)))
            .collect();
        v.sort();
        v.dedup();
        Some(v)
    }
}

/// The maps' counts per process, most churn first: totals from `counts`, the parents they
/// happened under from `paths` (which may have lost the oldest paths of a burst).
fn by_process(
    counts: impl Iterator<Item = (ChurnKey, u64)>,
    paths: impl Iterator<Item = (ChurnPathKey, u64)>,
) -> Vec<ChurnCount> {
    let mut by_pid = std::collections::BTreeMap::<u32, ChurnCount>::new();
    for (key, n) in counts {
        let e = by_pid.entry(key.pid).or_insert_with(|| ChurnCount {
            pid: key.pid,
            comm: crate::util::comm_str(&key.comm),
            ..ChurnCount::default()
        });
        if key.event == EVENT_MKDIR {
            e.mkdirs += n;
        } else {
            e.rmdirs += n;
        }
    }
    for (key, n) in paths {
        let Some(e) = by_pid.get_mut(&key.pid) else {
            continue;
        };
        let parent = parent_of(&crate::util::comm_str(&key.path)).to_owned();
        match e.parents.iter_mut().find(|p| p.0 == parent) {
            Some(p) => p.1 += n,
            None => e.parents.push((parent, n)),
        }
    }
    let mut v: Vec<ChurnCount> = by_pid.into_values().collect();
    for c in &mut v {
        c.parents.sort_by_key(|p| std::cmp::Reverse(p.1));
    }
    v.sort_by_key(|c| std::cmp::Reverse(c.mkdirs + c.rmdirs));
    v
}

/// `/a/b` of `/a/b/c`, `/` of `/c`.
fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

fn attach_program(ebpf: &mut Ebpf) -> Result<HashMap<MapData, AttachKey, u64>, BpfError> {
    let program: &mut RawTracePoint = ebpf
        .program_mut(PROGRAM_ATTACH)
        .ok_or(BpfError::Missing("attach program"))?
        .try_into()?;
    program.load()?;
    program.attach("cgroup_attach_task")?;
    Ok(HashMap::try_from(
        ebpf.take_map(MAP_ATTACH)
            .ok_or(BpfError::Missing("attach map"))?,
    )?)
}
