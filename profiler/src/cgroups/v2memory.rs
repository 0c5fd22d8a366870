//! Dying memory cgroups on cgroup2, per subtree: what the doctor reads on a v2-only host
//! (Debian 12, RHEL 9, current Kubernetes nodes), where /proc/cgroups' memory line has no
//! hierarchy to subtract directories from.
//!
//! Where the count comes from: `nr_dying_subsys_memory` of cgroup.stat (Linux 6.11+) counts
//! exactly the memcgs at and below a cgroup that were removed but are still pinned (by page
//! cache charged to them). Older kernels have only `nr_dying_descendants`, which counts
//! removed cgroups of any kind; it is taken where `memory` is in the cgroup's
//! `cgroup.subtree_control` (its children have memcgs, and a removed cgroup without one is
//! freed at once, so what stays dying there is a memcg).
use std::path::{Path, PathBuf};

use super::{stat_value, subdirs};

/// Dying memcgs of one cgroup2 subtree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MemorySubtree {
    pub path: PathBuf,
    /// Dying memcgs at and below it.
    pub dying: u64,
    /// `file` of its memory.stat, bytes: page cache charged at and below it, the dying
    /// memcgs' included (what `memory.reclaim` there can free).
    pub file_bytes: Option<u64>,
}

/// cgroup2's dying memcgs, with memory enabled below the root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct V2Memory {
    /// The cgroup2 mount point.
    pub mount: PathBuf,
    /// Dying memcgs on the whole host.
    pub dying: u64,
    /// The cgroup.stat key the counts come from (`nr_dying_subsys_memory` or
    /// `nr_dying_descendants`).
    pub source: &'static str,
    /// The root's children with the most dying memcgs, most first (at most 5).
    pub subtrees: Vec<MemorySubtree>,
    /// The deepest subtree holding at least half of the host's dying memcgs (see `holder`).
    pub holder: Option<MemorySubtree>,
}

/// Dying memcgs at and below `dir`, and the key they were read from; None when its
/// children have no memory controller (or it is unreadable).
pub(crate) fn dying_memcgs(dir: &Path) -> Option<(u64, &'static str)> {
    let stat = std::fs::read_to_string(dir.join("cgroup.stat")).ok()?;
    if let Some(n) = stat_value(&stat, "nr_dying_subsys_memory") {
        return Some((n, "nr_dying_subsys_memory"));
    }
    let control = std::fs::read_to_string(dir.join("cgroup.subtree_control")).ok()?;
    if !control.split_whitespace().any(|c| c == "memory") {
        return None;
    }
    Some((
        stat_value(&stat, "nr_dying_descendants")?,
        "nr_dying_descendants",
    ))
}

fn subtree(path: PathBuf, dying: u64) -> MemorySubtree {
    let stat = std::fs::read_to_string(path.join("memory.stat")).unwrap_or_default();
    MemorySubtree {
        file_bytes: stat_value(&stat, "file"),
        path,
        dying,
    }
}

/// Children of `dir` with dying memcgs, most first.
fn ranked_children(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut v: Vec<(PathBuf, u64)> = subdirs(dir)
        .into_iter()
        .filter_map(|c| {
            let (n, _) = dying_memcgs(&c)?;
            (n > 0).then_some((c, n))
        })
        .collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

/// The subtree where the dying memcgs hang: from the root, down into the child with the most
/// as long as it holds at least half of its parent's. A crash-looping unit's removed cgroups
/// are children of its slice, so the slice (or the lab's parent) is where this stops; the
/// root itself is no holder.
fn holder(root: &Path, total: u64) -> Option<MemorySubtree> {
    let (mut at, mut n) = (root.to_owned(), total);
    while let Some((child, m)) = ranked_children(&at).into_iter().next() {
        if m * 2 < n {
            break;
        }
        (at, n) = (child, m);
    }
    (at != root).then(|| subtree(at, n))
}

/// The figures under the cgroup2 mount `root`; None when memory is not enabled below it
/// (a host whose memory controller is bound to v1).
pub(crate) fn v2_memory(root: &Path) -> Option<V2Memory> {
    let (dying, source) = dying_memcgs(root)?;
    let subtrees: Vec<MemorySubtree> = ranked_children(root)
        .into_iter()
        .take(5)
        .map(|(p, n)| subtree(p, n))
        .collect();
    Some(V2Memory {
        mount: root.to_owned(),
        dying,
        source,
        holder: if dying > 0 { holder(root, dying) } else { None },
        subtrees,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake cgroup2 tree: `(path, cgroup.stat, subtree_control, memory.stat)`.
    fn tree(name: &str, dirs: &[(&str, &str, &str, &str)]) -> tempfile::TempDir {
        let root = tempfile::Builder::new()
            .prefix(&format!("v2memory-{name}-"))
            .tempdir()
            .unwrap();
        for (path, stat, control, memory) in dirs {
            let dir = root.path().join(path);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cgroup.stat"), stat).unwrap();
            std::fs::write(dir.join("cgroup.subtree_control"), control).unwrap();
            std::fs::write(dir.join("memory.stat"), memory).unwrap();
        }
        root
    }

    fn dying(n: u64) -> String {
        format!("nr_descendants 3\nnr_dying_descendants {n}\n")
    }

    #[test]
    fn the_holder_is_the_deepest_subtree_with_most_of_them() {
        let root = tree(
            "holder",
            &[
                ("", &dying(460), "cpu memory pids", ""),
                ("system.slice", &dying(420), "memory", "anon 0\nfile 9000\n"),
                ("system.slice/ecs.service", &dying(0), "", "file 10\n"),
                ("system.slice/lab", &dying(400), "memory", "file 8192\n"),
                ("system.slice/lab/a", &dying(0), "", ""),
                ("user.slice", &dying(40), "memory", ""),
                // No memory below it: its dying count is not about memcgs.
                ("init.scope", &dying(7), "", ""),
            ],
        );
        let m = v2_memory(root.path()).unwrap();
        assert_eq!((m.dying, m.source), (460, "nr_dying_descendants"));
        let tops: Vec<(&Path, u64)> = m
            .subtrees
            .iter()
            .map(|s| (s.path.strip_prefix(root.path()).unwrap(), s.dying))
            .collect();
        assert_eq!(
            tops,
            [
                (Path::new("system.slice"), 420),
                (Path::new("user.slice"), 40)
            ]
        );
        let h = m.holder.unwrap();
        assert_eq!(h.path, root.path().join("system.slice/lab"));
        assert_eq!((h.dying, h.file_bytes), (400, Some(8192)));
    }

    #[test]
    fn spread_out_dying_memcgs_have_no_holder_and_the_6_11_key_wins() {
        let stat = |n: u64| format!("nr_dying_descendants 999\nnr_dying_subsys_memory {n}\n");
        let root = tree(
            "spread",
            &[
                ("", &stat(300), "", ""),
                ("a", &stat(100), "", ""),
                ("b", &stat(100), "", ""),
                ("c", &stat(100), "", ""),
            ],
        );
        let m = v2_memory(root.path()).unwrap();
        assert_eq!((m.dying, m.source), (300, "nr_dying_subsys_memory"));
        assert_eq!(m.subtrees.len(), 3);
        assert_eq!(m.holder, None);
    }

    #[test]
    fn memory_bound_to_v1_gives_nothing() {
        // This host's shape: cgroup2 with only perf_event and hugetlb.
        let root = tree("v1", &[("", &dying(12), "hugetlb", "")]);
        assert_eq!(v2_memory(root.path()), None);
    }
}
