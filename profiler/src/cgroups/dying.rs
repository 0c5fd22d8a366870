//! Dying ("zombie") cgroup figures, beside the profiling pipeline: /proc/cgroups, cgroup.stat,
//! slabinfo, meminfo and memory.stat. The doctor and the agent's metrics both use `snapshot`.
//!
//! Why several sources: /proc/cgroups `num_cgroups` counts dying cgroups but directories do
//! not, so their difference is the dying count per controller (v1). cgroup2 reports it
//! directly (`nr_dying_descendants`). Slab and per-CPU memory corroborate, and the v1 memory
//! parent whose cached bytes its live children do not explain points at where they hang.
use std::path::{Path, PathBuf};

use super::{
    ControllerLine, Hierarchy, V2Memory, count_dirs, hierarchies, meminfo_kb, mount_of,
    parse_proc_cgroups, slab_active_objects, stat_value, subdirs, v2_memory, v2_mount,
};

/// Dying cgroups of one v1 controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ControllerDying {
    pub controller: String,
    /// Where its hierarchy is mounted ("" when not on v1).
    pub mount: PathBuf,
    /// From /proc/cgroups, dying included.
    pub num_cgroups: u64,
    /// Directories under the mount, the root included.
    pub live: u64,
    /// `num_cgroups - live`.
    pub dying: u64,
}

/// A cgroup2 subtree and its dying descendants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct V2Subtree {
    pub path: PathBuf,
    pub nr_dying_descendants: u64,
}

/// A v1 memory cgroup whose cached bytes its live children do not account for: the dying
/// children that still hold page cache are charged here (hierarchically).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CacheHolder {
    pub path: PathBuf,
    /// `total_cache` of this cgroup, bytes.
    pub total_cache: u64,
    /// Sum of the live children's `total_cache`, bytes.
    pub children_cache: u64,
    /// `cache` charged to this cgroup itself (not to descendants), bytes.
    pub own_cache: u64,
    pub live_children: u64,
}

impl CacheHolder {
    /// More than half of its cache is unexplained by itself and its live children.
    pub(crate) fn mostly_dying(&self) -> bool {
        self.unexplained() * 2 > self.total_cache
    }

    /// Bytes attributable to dying descendants: total minus own minus live children.
    pub(crate) fn unexplained(&self) -> u64 {
        self.total_cache
            .saturating_sub(self.children_cache)
            .saturating_sub(self.own_cache)
    }
}

/// Everything known about dying cgroups at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    /// v1 controllers with a hierarchy, and their dying counts.
    pub controllers: Vec<ControllerDying>,
    /// cgroup2 mount and its root's `nr_dying_descendants`, if mounted.
    pub v2: Option<(PathBuf, u64)>,
    /// cgroup2 children of the root with the most dying descendants (at most 5).
    pub v2_top: Vec<V2Subtree>,
    /// Dying memcgs on cgroup2 per subtree, and their holder; None unless memory is enabled
    /// below the cgroup2 root.
    pub v2_memory: Option<V2Memory>,
    /// Active `mem_cgroup` slab objects (one per memcg, live or dying), if readable.
    pub mem_cgroup_slab: Option<u64>,
    /// `Percpu:` of /proc/meminfo, kB (each memcg costs a few kB of it).
    pub percpu_kb: Option<u64>,
    /// v1 memory cgroups with cache their live children don't explain, largest first (<= 5).
    pub cache_holders: Vec<CacheHolder>,
}

impl Snapshot {
    /// Dying count of `controller`, if it has a v1 hierarchy.
    pub(crate) fn dying(&self, controller: &str) -> Option<u64> {
        self.controllers
            .iter()
            .find(|c| c.controller == controller)
            .map(|c| c.dying)
    }
}

/// Reads the current figures. Missing files give empty parts, never an error: the doctor
/// reports what it could see.
pub(crate) fn snapshot() -> Snapshot {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let mounts = hierarchies();
    let (controllers, v2) = dying_in(&mounts);
    let v2_top = v2
        .as_ref()
        .map(|(p, _)| v2_top_subtrees(p))
        .unwrap_or_default();
    let memory = mount_of(&mounts, "memory");
    Snapshot {
        controllers,
        v2,
        v2_top,
        v2_memory: v2_mount(&mounts).and_then(v2_memory),
        mem_cgroup_slab: slab_active_objects(&read("/proc/slabinfo"), "mem_cgroup"),
        percpu_kb: meminfo_kb(&read("/proc/meminfo"), "Percpu"),
        cache_holders: memory.map(|m| cache_holders(&m, 5)).unwrap_or_default(),
    }
}

/// Just the dying counts: per v1 controller, and the cgroup2 root's. The cheap part of
/// `snapshot` (no slab figures, no memory.stat walk) that the agent reads every window.
pub(crate) fn dying_counts() -> Vec<(String, u64)> {
    let (controllers, v2) = dying_in(&hierarchies());
    controllers
        .into_iter()
        .map(|c| (c.controller, c.dying))
        .chain(v2.map(|(_, n)| ("v2".to_owned(), n)))
        .collect()
}

fn dying_in(mounts: &[Hierarchy]) -> (Vec<ControllerDying>, Option<(PathBuf, u64)>) {
    let proc_cgroups = std::fs::read_to_string("/proc/cgroups").unwrap_or_default();
    let controllers = dying_per_controller(&parse_proc_cgroups(&proc_cgroups), mounts);
    let v2 = mounts.iter().find(|m| m.v2).map(|m| {
        let stat = std::fs::read_to_string(m.mount.join("cgroup.stat")).unwrap_or_default();
        (
            m.mount.clone(),
            stat_value(&stat, "nr_dying_descendants").unwrap_or(0),
        )
    });
    (controllers, v2)
}

/// `num_cgroups` of one controller right now (dying included).
pub fn num_cgroups(controller: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/cgroups").ok()?;
    parse_proc_cgroups(&text)
        .into_iter()
        .find(|c| c.name == controller)
        .map(|c| c.num_cgroups)
}

fn dying_per_controller(lines: &[ControllerLine], mounts: &[Hierarchy]) -> Vec<ControllerDying> {
    lines
        .iter()
        .filter(|l| l.enabled && l.hierarchy != 0)
        .filter_map(|l| {
            let mount = mount_of(mounts, &l.name)?;
            let live = count_dirs(&mount);
            Some(ControllerDying {
                controller: l.name.clone(),
                mount,
                num_cgroups: l.num_cgroups,
                live,
                dying: l.num_cgroups.saturating_sub(live),
            })
        })
        .collect()
}

fn v2_top_subtrees(root: &Path) -> Vec<V2Subtree> {
    let mut top: Vec<V2Subtree> = subdirs(root)
        .into_iter()
        .filter_map(|path| {
            let stat = std::fs::read_to_string(path.join("cgroup.stat")).ok()?;
            let n = stat_value(&stat, "nr_dying_descendants")?;
            (n > 0).then_some(V2Subtree {
                path,
                nr_dying_descendants: n,
            })
        })
        .collect();
    top.sort_by_key(|t| std::cmp::Reverse(t.nr_dying_descendants));
    top.truncate(5);
    top
}

/// v1 memory cgroups under `root` (root included) ranked by cache their live children don't
/// explain; only those with at least 1 MiB unexplained.
pub(crate) fn cache_holders(root: &Path, max: usize) -> Vec<CacheHolder> {
    let mut out = Vec::new();
    collect_holders(root, &mut out);
    out.retain(|h| h.unexplained() >= 1 << 20);
    // A parent whose cache is mostly unexplained is where dying children hang (a busy parent
    // with a little unexplained cache is the host's trickle); then by bytes.
    out.sort_by(|a, b| {
        (b.mostly_dying(), b.unexplained()).cmp(&(a.mostly_dying(), a.unexplained()))
    });
    out.truncate(max);
    out
}

fn collect_holders(dir: &Path, out: &mut Vec<CacheHolder>) -> u64 {
    let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
    let total_cache = stat_value(&stat, "total_cache").unwrap_or(0);
    let own_cache = stat_value(&stat, "cache").unwrap_or(0);
    let children = subdirs(dir);
    let children_cache = children.iter().map(|c| collect_holders(c, out)).sum();
    out.push(CacheHolder {
        path: dir.to_owned(),
        total_cache,
        children_cache,
        own_cache,
        live_children: children.len() as u64,
    });
    total_cache
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroups::fixtures::PROC_CGROUPS;

    #[test]
    fn holder_unexplained_cache() {
        let h = CacheHolder {
            path: "/x".into(),
            total_cache: 10 << 20,
            children_cache: 1 << 20,
            own_cache: 0,
            live_children: 1,
        };
        assert_eq!(h.unexplained(), 9 << 20);
    }

    #[test]
    fn dying_counts_from_a_fake_tree() {
        let dir = tempfile::Builder::new()
            .prefix("cgroups-test-")
            .tempdir()
            .unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::create_dir_all(dir.path().join("c")).unwrap();
        assert_eq!(count_dirs(dir.path()), 4);
        let mounts = vec![Hierarchy {
            mount: dir.path().to_path_buf(),
            controllers: vec!["memory".into()],
            v2: false,
            name: None,
        }];
        let d = dying_per_controller(&parse_proc_cgroups(PROC_CGROUPS), &mounts);
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].live, d[0].dying), (4, 525));
    }
}
