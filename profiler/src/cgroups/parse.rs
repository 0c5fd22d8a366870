//! Pure parsers of the kernel's cgroup-related text files, tested on real-shaped text.
use std::path::PathBuf;

/// One line of /proc/cgroups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerLine {
    pub name: String,
    /// Hierarchy id; 0 = not mounted on v1 (bound to cgroup2 or unused).
    pub hierarchy: u32,
    /// cgroups of this controller, dying ones included.
    pub num_cgroups: u64,
    pub enabled: bool,
}

/// Parses /proc/cgroups (`#subsys_name hierarchy num_cgroups enabled`).
pub fn parse_proc_cgroups(text: &str) -> Vec<ControllerLine> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some(ControllerLine {
                name: f.next()?.to_owned(),
                hierarchy: f.next()?.parse().ok()?,
                num_cgroups: f.next()?.parse().ok()?,
                enabled: f.next()? == "1",
            })
        })
        .collect()
}

/// A cgroup filesystem mount from /proc/self/mountinfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupMount {
    pub path: PathBuf,
    /// v1 controllers on it (e.g. `cpu`, `cpuacct` for a combined mount); empty for cgroup2.
    pub controllers: Vec<String>,
    pub v2: bool,
}

/// The cgroup and cgroup2 mounts in mountinfo text. v1 controllers come from the super
/// options (`rw,cpu,cpuacct`), which also name combined hierarchies like `cpu,cpuacct`.
pub fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    text.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let path = left.split_whitespace().nth(4)?;
            let mut r = right.split_whitespace();
            let fstype = r.next()?;
            let _source = r.next()?;
            let opts = r.next().unwrap_or("");
            let v2 = match fstype {
                "cgroup2" => true,
                "cgroup" => false,
                _ => return None,
            };
            const NOT_CONTROLLERS: [&str; 4] = ["rw", "ro", "xattr", "noprefix"];
            let controllers = if v2 {
                Vec::new()
            } else {
                opts.split(',')
                    .filter(|o| !o.contains('=') && !NOT_CONTROLLERS.contains(o))
                    .map(str::to_owned)
                    .collect()
            };
            Some(CgroupMount {
                path: PathBuf::from(unescape_mount_path(path)),
                controllers,
                v2,
            })
        })
        .collect()
}

/// mountinfo escapes spaces and the like as `\040`.
fn unescape_mount_path(p: &str) -> String {
    p.replace("\\040", " ").replace("\\011", "\t")
}

/// `key value` lines (cgroup.stat, memory.stat): the value of `key`.
pub fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Active objects of slab cache `name` in /proc/slabinfo.
pub fn slab_active_objects(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next()? == name).then(|| f.next()?.parse().ok())?
    })
}

/// A /proc/meminfo field in kB (e.g. `Percpu`).
pub fn meminfo_kb(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The v1 mount point of `controller`.
pub fn mount_of(mounts: &[CgroupMount], controller: &str) -> Option<PathBuf> {
    mounts
        .iter()
        .find(|m| !m.v2 && m.controllers.iter().any(|c| c == controller))
        .map(|m| m.path.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const PROC_CGROUPS: &str = "#subsys_name\thierarchy\tnum_cgroups\tenabled\n\
        cpuset\t3\t1\t1\ncpu\t1\t1\t1\ncpuacct\t1\t1\t1\nmemory\t4\t529\t1\n\
        net_cls\t0\t1\t1\nhugetlb\t0\t1\t1\n";

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
";

    #[test]
    fn proc_cgroups_lines() {
        let l = parse_proc_cgroups(PROC_CGROUPS);
        assert_eq!(l.len(), 6);
        assert_eq!(
            l[3],
            ControllerLine {
                name: "memory".into(),
                hierarchy: 4,
                num_cgroups: 529,
                enabled: true
            }
        );
    }

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
    fn stat_files() {
        let stat = "nr_descendants 3\nnr_dying_descendants 412\n";
        assert_eq!(stat_value(stat, "nr_dying_descendants"), Some(412));
        assert_eq!(stat_value(stat, "nr_dying"), None);
        let mem = "cache 4096\nrss 0\ntotal_cache 2052096\ntotal_rss 12\n";
        assert_eq!(stat_value(mem, "cache"), Some(4096));
        assert_eq!(stat_value(mem, "total_cache"), Some(2_052_096));
    }

    #[test]
    fn slabinfo_and_meminfo() {
        let slab = "slabinfo - version: 2.1\n\
            # name <active_objs> <num_objs> <objsize>\n\
            mem_cgroup_per_node   600    600   1024 \n\
            mem_cgroup            570    574   2240   14    8 : tunables 0 0 0\n";
        assert_eq!(slab_active_objects(slab, "mem_cgroup"), Some(570));
        let mem = "MemTotal:        4000000 kB\nPercpu:             2688 kB\n";
        assert_eq!(meminfo_kb(mem, "Percpu"), Some(2688));
        assert_eq!(meminfo_kb(mem, "Per"), None);
    }
}
