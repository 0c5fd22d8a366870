//! A process's cgroups, from /proc/PID/cgroup (`ID:CONTROLLERS:PATH` lines; cgroup2 is
//! `0::PATH`): the one parser of it, for the collector's process facts and `--cgroup`.

/// One line of /proc/PID/cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProcLine<'a> {
    /// Hierarchy id (0 for cgroup2).
    pub id: &'a str,
    /// Comma-separated controllers and `name=X`; empty for cgroup2.
    pub controllers: &'a str,
    /// Path within the hierarchy (`/` or `/a/b`).
    pub path: &'a str,
}

impl ProcLine<'_> {
    /// The cgroup2 line.
    pub(crate) fn is_v2(&self) -> bool {
        self.id == "0" && self.controllers.is_empty()
    }

    /// Whether the line names `name` among its controllers (or `name=X`).
    pub(crate) fn names(&self, name: &str) -> bool {
        self.controllers.split(',').any(|c| c == name)
    }
}

/// The well-formed lines of /proc/PID/cgroup text.
pub(crate) fn proc_cgroup_lines(text: &str) -> impl Iterator<Item = ProcLine<'_>> {
    text.lines().filter_map(|line| {
        let mut it = line.splitn(3, ':');
        Some(ProcLine {
            id: it.next()?,
            controllers: it.next()?,
            path: it.next()?,
        })
    })
}

/// A process's cgroup paths.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessCgroups {
    pub v2: String,
    pub memory: String,
    pub cpu: String,
}

/// The cgroup2, v1 memory and v1 cpu paths in /proc/PID/cgroup text ("" where absent).
pub fn parse_proc_cgroup(text: &str) -> ProcessCgroups {
    let mut out = ProcessCgroups::default();
    for l in proc_cgroup_lines(text) {
        if l.is_v2() {
            l.path.clone_into(&mut out.v2);
        }
        if l.names("memory") {
            l.path.clone_into(&mut out.memory);
        }
        if l.names("cpu") {
            l.path.clone_into(&mut out.cpu);
        }
    }
    out
}

/// Process `pid`'s cgroups (all empty if it is gone).
pub(crate) fn read_process_cgroups(pid: u32) -> ProcessCgroups {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map(|t| parse_proc_cgroup(&t))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn paths_may_hold_colons() {
        let l: Vec<_> = proc_cgroup_lines("0::/a:b\nbroken\n").collect();
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].path, "/a:b");
        assert!(l[0].is_v2());
    }
}
