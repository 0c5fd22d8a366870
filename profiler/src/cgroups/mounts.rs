//! The cgroup hierarchies mounted on this host, from /proc/self/mountinfo: the one parser of
//! it (the dying counts, `record --cgroup` and the cgroup2 id lookup all start here).
use std::path::{Path, PathBuf};

/// A mounted cgroup hierarchy (each hierarchy once, at its first mount point).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hierarchy {
    /// Mount point, e.g. `/sys/fs/cgroup/memory` or `/sys/fs/cgroup/unified`.
    pub mount: PathBuf,
    /// cgroup2 (the unified hierarchy).
    pub v2: bool,
    /// v1 controllers on it (`cpu`, `cpuacct` for a combined mount); empty for cgroup2 and
    /// for a named hierarchy without controllers.
    pub controllers: Vec<String>,
    /// A v1 hierarchy's `name=` option (`systemd`), if any.
    pub name: Option<String>,
}

impl Hierarchy {
    /// The names /proc/PID/cgroup gives this hierarchy's line: its controllers, then
    /// `name=X` (cgroup2's line has none: `0::PATH`).
    pub(crate) fn proc_names(&self) -> impl Iterator<Item = String> + '_ {
        self.controllers
            .iter()
            .cloned()
            .chain(self.name.iter().map(|n| format!("name={n}")))
    }

    /// `cgroup2`, or `the cgroup v1 memory hierarchy`.
    pub(crate) fn describe(&self) -> String {
        if self.v2 {
            "cgroup2".to_owned()
        } else {
            format!(
                "the cgroup v1 {} hierarchy",
                self.proc_names().collect::<Vec<_>>().join(",")
            )
        }
    }

    /// The directory of `path` (relative to the hierarchy's root: `/` or `/a/b`).
    pub(crate) fn dir(&self, path: &str) -> PathBuf {
        self.mount.join(path.trim_start_matches('/'))
    }
}

/// Mount options of v1 hierarchies that are not controllers.
const NOT_CONTROLLERS: &[&str] = &[
    "rw",
    "ro",
    "xattr",
    "noprefix",
    "clone_children",
    "cpuset_v2_mode",
    "favordynmods",
    "nofavordynmods",
];

/// Every cgroup and cgroup2 hierarchy in mountinfo text, each once (a hierarchy mounted
/// twice is the same hierarchy). v1 controllers come from the super options
/// (`rw,cpu,cpuacct`), which also name combined hierarchies like `cpu,cpuacct`.
pub fn parse_mountinfo(text: &str) -> Vec<Hierarchy> {
    let mut out: Vec<Hierarchy> = Vec::new();
    for line in text.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let mut post = post.split_whitespace();
        let (Some(fstype), Some(_source)) = (post.next(), post.next()) else {
            continue;
        };
        let options = post.next().unwrap_or("");
        let Some(mount) = pre.split_whitespace().nth(4) else {
            continue;
        };
        let v2 = match fstype {
            "cgroup2" => true,
            "cgroup" => false,
            _ => continue,
        };
        let (mut controllers, mut name) = (Vec::new(), None);
        if !v2 {
            for o in options.split(',') {
                if let Some(n) = o.strip_prefix("name=") {
                    name = Some(n.to_owned());
                } else if !o.contains('=') && !NOT_CONTROLLERS.contains(&o) && !o.is_empty() {
                    controllers.push(o.to_owned());
                }
            }
        }
        let h = Hierarchy {
            mount: PathBuf::from(unescape_mount_path(mount)),
            v2,
            controllers,
            name,
        };
        let same =
            |o: &Hierarchy| (o.v2, &o.controllers, &o.name) == (h.v2, &h.controllers, &h.name);
        if !out.iter().any(same) {
            out.push(h);
        }
    }
    out
}

/// mountinfo escapes space, tab, newline and backslash in paths as octal (`\040`).
fn unescape_mount_path(p: &str) -> String {
    p.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// The hierarchies mounted here (empty if mountinfo cannot be read).
pub(crate) fn hierarchies() -> Vec<Hierarchy> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_mountinfo(&t))
        .unwrap_or_default()
}

/// The v1 mount point of `controller`.
pub fn mount_of(hierarchies: &[Hierarchy], controller: &str) -> Option<PathBuf> {
    hierarchies
        .iter()
        .find(|h| !h.v2 && h.controllers.iter().any(|c| c == controller))
        .map(|h| h.mount.clone())
}

/// The cgroup2 mount point (`/sys/fs/cgroup` on unified hosts, `/sys/fs/cgroup/unified` on
/// hybrid ones).
pub fn v2_mount(hierarchies: &[Hierarchy]) -> Option<&Path> {
    hierarchies.iter().find(|h| h.v2).map(|h| h.mount.as_path())
}

/// The v1 memory mount of this host.
pub fn memory_mount() -> Option<PathBuf> {
    mount_of(&hierarchies(), "memory")
}

/// This host's cgroup2 mount point.
pub(crate) fn cgroup2_mount() -> Option<PathBuf> {
    v2_mount(&hierarchies()).map(Path::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroups::fixtures::{HYBRID, MOUNTINFO};

    #[test]
    fn mountinfo_combined_and_v2() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m.len(), 4, "{m:?}");
        assert_eq!(m[0].controllers, ["cpu", "cpuacct"]);
        assert_eq!(
            mount_of(&m, "cpuacct").unwrap(),
            Path::new("/sys/fs/cgroup/cpu,cpuacct")
        );
        assert_eq!(
            mount_of(&m, "memory").unwrap(),
            Path::new("/sys/fs/cgroup/memory")
        );
        assert!(m[2].controllers.is_empty(), "name=systemd is no controller");
        assert!(m[3].v2);
        assert_eq!(mount_of(&m, "hugetlb"), None);
    }

    #[test]
    fn hierarchies_of_a_hybrid_host() {
        let h = parse_mountinfo(HYBRID);
        let names: Vec<(&str, String)> = h
            .iter()
            .map(|h| {
                (
                    h.mount.to_str().unwrap(),
                    h.proc_names().collect::<Vec<_>>().join(","),
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                ("/sys/fs/cgroup/unified", String::new()),
                ("/sys/fs/cgroup/systemd", "name=systemd".into()),
                ("/sys/fs/cgroup/cpu,cpuacct", "cpu,cpuacct".into()),
                ("/sys/fs/cgroup/memory", "memory".into()),
                ("/sys/fs/cgroup/cpuset", "cpuset".into()),
            ]
        );
    }

    #[test]
    fn escaped_paths_and_repeated_mounts() {
        let text = "\
50 35 0:36 / /mnt/my\\040cgroups rw - cgroup cgroup rw,memory
51 35 0:36 / /mnt/again rw - cgroup cgroup rw,memory
52 35 0:31 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw
";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 2, "{m:?}");
        assert_eq!(m[0].mount, Path::new("/mnt/my cgroups"));
        assert_eq!(v2_mount(&m), Some(Path::new("/sys/fs/cgroup")));
        assert_eq!(m[1].describe(), "cgroup2");
        assert_eq!(m[0].describe(), "the cgroup v1 memory hierarchy");
    }
}
