//! Which samples the user wants beyond the in-kernel filters: by comm, and by cgroup where
//! the kernel cannot filter (cgroup v1, or v1 and v2 mixed).
use std::collections::HashMap;

/// Which samples the user wants, beyond the in-kernel pid filter.
#[derive(Clone, Debug, Default)]
pub(crate) struct CommFilter(pub Vec<String>);

impl CommFilter {
    pub(super) fn wants(&self, comm: &str) -> bool {
        self.0.is_empty() || self.0.iter().any(|c| c == comm)
    }
}

/// `--cgroup` targets filtered here rather than in the kernel (cgroup v1 ones, or all of them
/// when v1 and v2 are mixed): a process is kept when /proc/PID/cgroup puts it in one of them
/// or below, decided at its first sample.
#[derive(Clone, Debug, Default)]
pub(crate) struct CgroupFilter {
    targets: Vec<crate::cgroups::CgroupTarget>,
    decided: HashMap<u32, bool>,
}

impl CgroupFilter {
    pub(crate) fn new(targets: Vec<crate::cgroups::CgroupTarget>) -> Self {
        Self {
            targets,
            decided: HashMap::new(),
        }
    }

    pub(super) fn wants(&mut self, pid: u32) -> bool {
        if self.targets.is_empty() {
            return true;
        }
        let targets = &self.targets;
        *self.decided.entry(pid).or_insert_with(|| {
            // The idle task (pid 0) has no /proc entry; it is in every root cgroup.
            let text = match std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
                Ok(t) => t,
                Err(_) if pid == 0 => return targets.iter().any(|t| t.path == "/"),
                Err(_) => return false, // gone before we looked: cannot tell
            };
            targets.iter().any(|t| t.contains(&text))
        })
    }
}
