//! The cgroups `record --cgroup PATH` names: each found in a mounted hierarchy, and the test
//! whether a process is in one of them or below.
use std::path::{Path, PathBuf};

use super::{Hierarchy, is_at_or_below, proc_cgroup_lines};

/// One `--cgroup PATH`, found in a hierarchy: tasks in `path` or below it are wanted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CgroupTarget {
    /// The path as given.
    pub given: String,
    pub hierarchy: Hierarchy,
    /// Relative to the hierarchy's root: `/` or `/a/b`.
    pub path: String,
}

impl CgroupTarget {
    /// A cgroup2 target can be filtered in the kernel (bpf_current_task_under_cgroup).
    pub(crate) fn is_v2(&self) -> bool {
        self.hierarchy.v2
    }

    /// The cgroup's directory.
    pub(crate) fn dir(&self) -> PathBuf {
        self.hierarchy.dir(&self.path)
    }

    /// `cgroup2` or `the cgroup v1 memory hierarchy`.
    pub(crate) fn hierarchy_name(&self) -> String {
        self.hierarchy.describe()
    }

    /// Whether a process whose /proc/PID/cgroup reads `proc_cgroup` is in this cgroup or below.
    pub(crate) fn contains(&self, proc_cgroup: &str) -> bool {
        proc_cgroup_lines(proc_cgroup).any(|l| {
            let same_hierarchy = if self.is_v2() {
                l.is_v2()
            } else {
                self.hierarchy.proc_names().any(|n| l.names(&n))
            };
            same_hierarchy && is_at_or_below(l.path, &self.path)
        })
    }
}

/// A `--cgroup PATH` found in no mounted hierarchy; `mounts` lists where it was looked for.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "no cgroup named {given} under {mounts}; list them with `systemd-cgls` or `find /sys/fs/cgroup -mindepth 1 -type d`"
)]
pub(crate) struct NoSuchCgroup {
    pub given: String,
    pub mounts: String,
}

/// Finds `given` (a path relative to a hierarchy, or a full path under a mount point) among
/// `hierarchies`. A relative path found in cgroup2 is taken there (the kernel can filter it);
/// otherwise in every v1 hierarchy that has it.
pub(crate) fn resolve_target(
    given: &str,
    hierarchies: &[Hierarchy],
) -> Result<Vec<CgroupTarget>, NoSuchCgroup> {
    let target = |h: &Hierarchy, path: String| CgroupTarget {
        given: given.to_owned(),
        hierarchy: h.clone(),
        path,
    };
    // A full path: under the mount point it names (the longest that matches; symlinks such
    // as /sys/fs/cgroup/cpu -> cpu,cpuacct followed).
    let full = std::fs::canonicalize(given).ok().filter(|p| p.is_dir());
    if let Some(full) = &full {
        let under = hierarchies
            .iter()
            .filter(|h| full.starts_with(&h.mount))
            .max_by_key(|h| h.mount.as_os_str().len());
        if let Some(h) = under {
            let rel = full.strip_prefix(&h.mount).unwrap_or(Path::new(""));
            return Ok(vec![target(h, format!("/{}", rel.display()))]);
        }
    }
    let rel = format!("/{}", given.trim_matches('/'));
    let exists = |h: &Hierarchy| h.dir(&rel).is_dir();
    if let Some(h) = hierarchies.iter().find(|h| h.v2 && exists(h)) {
        return Ok(vec![target(h, rel)]);
    }
    let v1: Vec<CgroupTarget> = hierarchies
        .iter()
        .filter(|h| exists(h))
        .map(|h| target(h, rel.clone()))
        .collect();
    if v1.is_empty() {
        return Err(NoSuchCgroup {
            given: given.to_owned(),
            mounts: mount_list(hierarchies),
        });
    }
    Ok(v1)
}

/// The mount points, short: `/sys/fs/cgroup/{cpu,memory,unified}` when they share a parent.
fn mount_list(hierarchies: &[Hierarchy]) -> String {
    let mounts: Vec<&Path> = hierarchies.iter().map(|h| h.mount.as_path()).collect();
    let parent = mounts.first().and_then(|m| m.parent());
    let names: Option<Vec<String>> = mounts
        .iter()
        .map(|m| {
            (m.parent() == parent)
                .then(|| m.file_name().map(|n| n.to_string_lossy().into_owned()))
                .flatten()
        })
        .collect();
    match (parent, names) {
        (_, _) if mounts.is_empty() => {
            "any mounted cgroup hierarchy (none in /proc/self/mountinfo)".to_owned()
        }
        (Some(parent), Some(names)) if names.len() > 1 => {
            format!("{}/{{{}}}", parent.display(), names.join(","))
        }
        _ => mounts
            .iter()
            .map(|m| m.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroups::{fixtures::HYBRID, mounts::parse_mountinfo};

    #[test]
    fn target_contains_its_hierarchy_descendants_only() {
        let h = parse_mountinfo(HYBRID);
        let memory = CgroupTarget {
            given: "/lab".into(),
            hierarchy: h[3].clone(),
            path: "/lab".into(),
        };
        let proc = |mem: &str| format!("9:name=systemd:/x\n4:memory:{mem}\n0::/lab\n");
        assert!(memory.contains(&proc("/lab")));
        assert!(memory.contains(&proc("/lab/a/b")));
        assert!(!memory.contains(&proc("/laboratory")));
        assert!(!memory.contains(&proc("/")));
        let v2 = CgroupTarget {
            hierarchy: h[0].clone(),
            ..memory.clone()
        };
        assert!(v2.contains(&proc("/")));
        assert!(!v2.contains("0::/other\n4:memory:/lab\n"));
        let root = CgroupTarget {
            path: "/".into(),
            ..memory
        };
        assert!(root.contains(&proc("/anything")));
        // A named hierarchy is matched by its `name=` line.
        let systemd = CgroupTarget {
            hierarchy: h[1].clone(),
            path: "/x".into(),
            given: "/x".into(),
        };
        assert!(systemd.contains(&proc("/")));
    }

    #[test]
    fn a_missing_cgroup_is_one_clear_error() {
        let h = parse_mountinfo(HYBRID);
        let e = resolve_target("/no/such/cgroup-xyz", &h)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "no cgroup named /no/such/cgroup-xyz under \
                 /sys/fs/cgroup/{unified,systemd,cpu,cpuacct,memory,cpuset}; list them with "
            ),
            "{e}"
        );
        assert!(!e.contains('\n'));
    }

    #[test]
    fn a_full_path_is_taken_in_the_hierarchy_mounted_there() {
        let Some(mount) = crate::cgroups::cgroup2_mount() else {
            return;
        };
        let t = resolve_target(mount.to_str().unwrap(), &crate::cgroups::hierarchies()).unwrap();
        assert_eq!(t.len(), 1);
        assert!(t[0].is_v2());
        assert_eq!(t[0].path, "/");
    }
}
