//! The cgroup filesystem, the one copy of it: mounted hierarchies (mountinfo), a process's
//! cgroups (/proc/PID/cgroup), the cgroups `--cgroup` names, path predicates, the tree walker
//! and the dying-cgroup figures (v1 per controller, cgroup2 per subtree). Used by the collector (process facts, cgroup ids, the
//! userspace `--cgroup` filter), the CLI (`record --cgroup`), the doctor, the agent's metrics
//! and the lab. Pure parsers are tested on text shaped like the real files.
mod dying;
mod mounts;
mod parse;
mod proc;
mod target;
mod tree;
mod v2memory;

#[cfg(test)]
pub(crate) use dying::ControllerDying;
pub use dying::num_cgroups;
pub(crate) use dying::{CacheHolder, Snapshot, dying_counts, snapshot};
pub(crate) use mounts::Hierarchy;
pub(crate) use mounts::{cgroup2_mount, hierarchies};
pub use mounts::{memory_mount, mount_of, parse_mountinfo, v2_mount};
pub(crate) use parse::ControllerLine;
pub use parse::{meminfo_kb, parse_proc_cgroups, slab_active_objects, stat_value};
pub use proc::parse_proc_cgroup;
pub(crate) use proc::{proc_cgroup_lines, read_process_cgroups};
pub(crate) use target::{CgroupTarget, resolve_target};
pub(crate) use tree::{cgroup2_paths, count_dirs, is_at_or_below, subdirs};
pub(crate) use v2memory::{MemorySubtree, V2Memory, v2_memory};

/// Text shaped like the real files, shared by the tests of the parsers and their users.
#[cfg(test)]
mod fixtures {
    pub(crate) const PROC_CGROUPS: &str = "#subsys_name\thierarchy\tnum_cgroups\tenabled\n\
        cpuset\t3\t1\t1\ncpu\t1\t1\t1\ncpuacct\t1\t1\t1\nmemory\t4\t529\t1\n\
        net_cls\t0\t1\t1\nhugetlb\t0\t1\t1\n";

    pub(crate) const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
";

    pub(crate) const HYBRID: &str = "\
35 25 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
36 35 0:31 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
37 35 0:32 / /sys/fs/cgroup/systemd rw,nosuid shared:11 - cgroup cgroup rw,xattr,name=systemd
40 35 0:35 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:14 - cgroup cgroup rw,cpu,cpuacct
41 35 0:36 / /sys/fs/cgroup/memory rw,nosuid shared:15 - cgroup cgroup rw,memory
42 35 0:37 / /sys/fs/cgroup/cpuset rw,nosuid shared:16 - cgroup cgroup rw,cpuset,clone_children
";
}
