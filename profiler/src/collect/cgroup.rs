//! cgroup facts for attribution: a process's cgroup paths (v2 and the v1 memory and cpu
//! hierarchies) from /proc/PID/cgroup, and the path of each cgroup v2 id samples carry, found
//! by walking the cgroup2 mount (the id is the directory's inode number); and the cgroups
//! `record --cgroup PATH` names, found in the mounted hierarchies.
use std::{collections::HashMap, os::unix::fs::MetadataExt as _, path::Path};

/// A process's cgroup paths.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessCgroups {
    pub v2: String,
    pub memory: String,
    pub cpu: String,
}

/// Parses /proc/PID/cgroup text: `ID:CONTROLLERS:PATH` lines; v2 is `0::PATH`.
pub fn parse_proc_cgroup(text: &str) -> ProcessCgroups {
    let mut out = ProcessCgroups::default();
    for line in text.lines() {
        let mut it = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            out.v2 = path.to_owned();
        }
        for c in controllers.split(',') {
            match c {
                "memory" => out.memory = path.to_owned(),
                "cpu" => out.cpu = path.to_owned(),
                _ => {}
            }
        }
    }
    out
}

pub fn read_process_cgroups(pid: u32) -> ProcessCgroups {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map(|t| parse_proc_cgroup(&t))
        .unwrap_or_default()
}

/// Where cgroup2 is mounted (`/sys/fs/cgroup` on unified hosts, `/sys/fs/cgroup/unified` on
/// hybrid ones), from /proc/self/mountinfo.
pub fn cgroup2_mount() -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        (post.split_whitespace().next()? == "cgroup2")
            .then(|| pre.split_whitespace().nth(4).map(str::to_owned))?
    })
}

/// Paths of the cgroup v2 ids in `wanted`, found by walking the cgroup2 tree. Ids of cgroups
/// already removed stay unknown.
pub fn cgroup2_paths(wanted: &[u64]) -> HashMap<u64, String> {
    let mut found = HashMap::new();
    let Some(mount) = cgroup2_mount() else {
        return found;
    };
    let mut todo: Vec<std::path::PathBuf> = vec![mount.clone().into()];
    while let Some(dir) = todo.pop() {
        if found.len() == wanted.len() {
            break;
        }
        let Ok(meta) = std::fs::metadata(&dir) else {
            continue;
        };
        if wanted.contains(&meta.ino()) {
            let rel = dir.strip_prefix(&mount).unwrap_or(Path::new(""));
            found.insert(meta.ino(), format!("/{}", rel.display()));
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        todo.extend(
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
    found
}

/// A cgroup hierarchy mounted on this host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hierarchy {
    /// Mount point, e.g. `/sys/fs/cgroup/memory` or `/sys/fs/cgroup/unified`.
    pub mount: String,
    /// Its v1 controllers as /proc/PID/cgroup names them (`memory`, `cpu`, `cpuacct`,
    /// `name=systemd`); empty for cgroup2.
    pub controllers: Vec<String>,
}

/// Every cgroup hierarchy mounted, from /proc/self/mountinfo text (each mounted once).
pub fn parse_hierarchies(mountinfo: &str) -> Vec<Hierarchy> {
    // Mount options of v1 hierarchies that are not controllers.
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
    let mut out: Vec<Hierarchy> = Vec::new();
    for line in mountinfo.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let mut post = post.split_whitespace();
        let (Some(fstype), Some(_source), options) = (post.next(), post.next(), post.next()) else {
            continue;
        };
        let Some(mount) = pre.split_whitespace().nth(4) else {
            continue;
        };
        let controllers = match fstype {
            "cgroup2" => Vec::new(),
            "cgroup" => options
                .unwrap_or("")
                .split(',')
                .filter(|o| {
                    o.starts_with("name=") || !(o.contains('=') || NOT_CONTROLLERS.contains(o))
                })
                .map(str::to_owned)
                .collect(),
            _ => continue,
        };
        if !out.iter().any(|h| h.controllers == controllers) {
            out.push(Hierarchy {
                mount: mount.to_owned(),
                controllers,
            });
        }
    }
    out
}

/// The hierarchies mounted here.
pub fn hierarchies() -> Vec<Hierarchy> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_hierarchies(&t))
        .unwrap_or_default()
}

/// One `--cgroup PATH`, found in a hierarchy: tasks in `path` or below it are wanted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupTarget {
    /// The path as given.
    pub given: String,
    pub hierarchy: Hierarchy,
    /// Relative to the hierarchy's root: `/` or `/a/b`.
    pub path: String,
}

impl CgroupTarget {
    /// A cgroup2 target can be filtered in the kernel (bpf_current_task_under_cgroup).
    pub fn is_v2(&self) -> bool {
        self.hierarchy.controllers.is_empty()
    }

    /// The cgroup's directory.
    pub fn dir(&self) -> std::path::PathBuf {
        Path::new(&self.hierarchy.mount).join(self.path.trim_start_matches('/'))
    }

    /// `cgroup2` or `the cgroup v1 memory hierarchy`.
    pub fn hierarchy_name(&self) -> String {
        if self.is_v2() {
            "cgroup2".to_owned()
        } else {
            format!(
                "the cgroup v1 {} hierarchy",
                self.hierarchy.controllers.join(",")
            )
        }
    }

    /// Whether a process whose /proc/PID/cgroup reads `proc_cgroup` is in this cgroup or below.
    pub fn contains(&self, proc_cgroup: &str) -> bool {
        proc_cgroup.lines().any(|line| {
            let mut it = line.splitn(3, ':');
            let (Some(id), Some(controllers), Some(path)) = (it.next(), it.next(), it.next())
            else {
                return false;
            };
            let same_hierarchy = if self.is_v2() {
                id == "0" && controllers.is_empty()
            } else {
                controllers
                    .split(',')
                    .any(|c| self.hierarchy.controllers.iter().any(|h| h == c))
            };
            same_hierarchy && is_at_or_below(path, &self.path)
        })
    }
}

/// `path` is `root` or a descendant of it (whole components only).
fn is_at_or_below(path: &str, root: &str) -> bool {
    let root = root.trim_end_matches('/');
    root.is_empty()
        || path == root
        || path
            .strip_prefix(root)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Finds `given` (a path relative to a hierarchy, or a full path under a mount point) among
/// `hierarchies`. A relative path found in cgroup2 is taken there (the kernel can filter it);
/// otherwise in every v1 hierarchy that has it. Err: a one-line message for the user.
pub fn resolve_target(given: &str, hierarchies: &[Hierarchy]) -> Result<Vec<CgroupTarget>, String> {
    let target = |h: &Hierarchy, path: String| CgroupTarget {
        given: given.to_owned(),
        hierarchy: h.clone(),
        path,
    };
    // A full path: under the mount point it names (the longest that matches; symlinks such
    // as /sys/fs/cgroup/cpu -> cpu,cpuacct followed).
    let full = std::fs::canonicalize(given)
        .ok()
        .filter(|p| p.is_dir())
        .map(|p| p.display().to_string());
    if let Some(full) = &full {
        let under = hierarchies
            .iter()
            .filter(|h| is_at_or_below(full, &h.mount))
            .max_by_key(|h| h.mount.len());
        if let Some(h) = under {
            let rel = full[h.mount.trim_end_matches('/').len()..].to_owned();
            let rel = if rel.is_empty() { "/".to_owned() } else { rel };
            return Ok(vec![target(h, rel)]);
        }
    }
    let rel = format!("/{}", given.trim_matches('/'));
    let exists = |h: &Hierarchy| {
        Path::new(&h.mount)
            .join(rel.trim_start_matches('/'))
            .is_dir()
    };
    if let Some(h) = hierarchies
        .iter()
        .find(|h| h.controllers.is_empty() && exists(h))
    {
        return Ok(vec![target(h, rel)]);
    }
    let v1: Vec<CgroupTarget> = hierarchies
        .iter()
        .filter(|h| exists(h))
        .map(|h| target(h, rel.clone()))
        .collect();
    if v1.is_empty() {
        let mounts = mount_list(hierarchies);
        return Err(format!(
            "no cgroup named {given} under {mounts}; list them with `systemd-cgls` or \
             `find /sys/fs/cgroup -mindepth 1 -type d`"
        ));
    }
    Ok(v1)
}

/// The mount points, short: `/sys/fs/cgroup/{cpu,memory,unified}` when they share a parent.
fn mount_list(hierarchies: &[Hierarchy]) -> String {
    let mounts: Vec<&Path> = hierarchies.iter().map(|h| Path::new(&h.mount)).collect();
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
        _ => hierarchies
            .iter()
            .map(|h| h.mount.as_str())
            .collect::<Vec<_>>()
            .join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
35 25 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
36 35 0:31 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
37 35 0:32 / /sys/fs/cgroup/systemd rw,nosuid shared:11 - cgroup cgroup rw,xattr,name=systemd
40 35 0:35 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:14 - cgroup cgroup rw,cpu,cpuacct
41 35 0:36 / /sys/fs/cgroup/memory rw,nosuid shared:15 - cgroup cgroup rw,memory
42 35 0:37 / /sys/fs/cgroup/cpuset rw,nosuid shared:16 - cgroup cgroup rw,cpuset,clone_children
";

    #[test]
    fn hierarchies_of_a_hybrid_host() {
        let h = parse_hierarchies(HYBRID);
        let names: Vec<(&str, String)> = h
            .iter()
            .map(|h| (h.mount.as_str(), h.controllers.join(",")))
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
    fn target_contains_its_hierarchy_descendants_only() {
        let h = parse_hierarchies(HYBRID);
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
    }

    #[test]
    fn a_missing_cgroup_is_one_clear_error() {
        let h = parse_hierarchies(HYBRID);
        let e = resolve_target("/no/such/cgroup-xyz", &h).unwrap_err();
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
    fn hybrid_v1_host() {
        let text = "9:name=systemd:/\n4:memory:/process_api/15a9\n2:cpuacct:/\n1:cpu,cpuacct:/kubepods/pod1\n0::/\n";
        assert_eq!(
            parse_proc_cgroup(text),
            ProcessCgroups {
                v2: "/".into(),
                memory: "/process_api/15a9".into(),
                cpu: "/kubepods/pod1".into()
            }
        );
    }

    #[test]
    fn unified_host() {
        let c = parse_proc_cgroup("0::/system.slice/kubelet.service\n");
        assert_eq!(c.v2, "/system.slice/kubelet.service");
        assert_eq!(c.memory, "");
    }

    #[test]
    fn finds_the_root_cgroup_by_inode() {
        let Some(mount) = cgroup2_mount() else { return };
        let ino = std::fs::metadata(&mount).unwrap().ino();
        assert_eq!(
            cgroup2_paths(&[ino]).get(&ino).map(String::as_str),
            Some("/")
        );
    }
}
