//! Process lifetimes as the kernel reports them (fork, exec, exit records and exit statuses),
//! kept while recording in CLOCK_MONOTONIC ns and handed to the profile as
//! `profile::Lifetime`s. Every process that starts or ends is kept, sampled or not.
use crate::util::FxMap;

use crate::profile::Lifetime;

/// Lifetimes in the order their processes first showed up; times are CLOCK_MONOTONIC ns.
#[derive(Default)]
pub(crate) struct LifetimeLog {
    entries: Vec<Lifetime>,
    /// The current entry of each pid (a reused pid gets a new one at its fork).
    current: FxMap<u32, usize>,
}

impl LifetimeLog {
    pub(crate) fn fork(&mut self, pid: u32, ppid: u32, time_ns: u64, parent_comm: Option<String>) {
        // Each CPU has its own ring, read one after the other: a process that lives between
        // two reads has its exec or exit read before its fork. Those belong to this fork.
        if let Some(&i) = self.current.get(&pid) {
            let e = &mut self.entries[i];
            let first = [e.exec_ns, e.exit_ns].into_iter().flatten().min();
            if e.fork_ns.is_none() && first.is_some_and(|t| t >= time_ns) {
                e.fork_ns = Some(time_ns);
                e.ppid = ppid;
                if e.comm.is_empty() {
                    e.comm = parent_comm.unwrap_or_default();
                }
                return;
            }
        }
        self.current.insert(pid, self.entries.len());
        self.entries.push(Lifetime {
            pid,
            ppid,
            comm: parent_comm.unwrap_or_default(),
            fork_ns: Some(time_ns),
            ..Lifetime::default()
        });
    }

    pub(crate) fn exec(&mut self, pid: u32, time_ns: u64, comm: &str) {
        let e = self.entry(pid);
        e.exec_ns = Some(time_ns);
        comm.clone_into(&mut e.comm);
        e.exe.clear(); // the first executable mapping after the exec is the new one
    }

    /// An executable mapping of `pid`: the first one after an exec is the executable.
    pub(crate) fn mapped(&mut self, pid: u32, path: &str) {
        if let Some(&i) = self.current.get(&pid) {
            let e = &mut self.entries[i];
            if e.exec_ns.is_some() && e.exe.is_empty() {
                path.clone_into(&mut e.exe);
            }
        }
    }

    pub(crate) fn exit(&mut self, pid: u32, time_ns: u64) {
        self.entry(pid).exit_ns.get_or_insert(time_ns);
    }

    /// The exit status (BPF, wait(2) form); it may come before or after the exit record.
    pub(crate) fn status(&mut self, pid: u32, time_ns: u64, status: u32) {
        let e = self.entry(pid);
        e.exit_ns.get_or_insert(time_ns);
        e.exit_status = Some(status);
    }

    /// The comm the kernel last reported for `pid`.
    pub(crate) fn comm(&self, pid: u32) -> Option<&str> {
        let e = &self.entries[*self.current.get(&pid)?];
        (!e.comm.is_empty()).then_some(e.comm.as_str())
    }

    /// The executable the kernel last reported for `pid`.
    pub(crate) fn exe(&self, pid: u32) -> Option<&str> {
        let e = &self.entries[*self.current.get(&pid)?];
        (!e.exe.is_empty()).then_some(e.exe.as_str())
    }

    #[cfg(test)]
    fn entries(&self) -> &[Lifetime] {
        &self.entries
    }

    /// Every lifetime, times made offsets from `start_mono_ns` (events before it, read late,
    /// count as at the start).
    pub(crate) fn to_profile(&self, start_mono_ns: u64) -> Vec<Lifetime> {
        let off = |t: Option<u64>| t.map(|t| t.saturating_sub(start_mono_ns));
        let mut v: Vec<Lifetime> = self
            .entries
            .iter()
            .filter(|e| e.started() || e.exit_ns.is_some())
            .map(|e| Lifetime {
                fork_ns: off(e.fork_ns),
                exec_ns: off(e.exec_ns),
                exit_ns: off(e.exit_ns),
                ..e.clone()
            })
            .collect();
        v.sort_by_key(|l| (l.pid, l.fork_ns));
        v
    }

    /// Starts a new log (the agent, each window): processes still running keep their
    /// entry, so that a later exit finds its fork, exec and comm.
    pub(crate) fn take_window(&mut self) -> Self {
        // Sized like the last window: under churn it holds hundreds of lifetimes, which grew
        // the vector and map from empty every window.
        let next = Self {
            entries: Vec::with_capacity(self.entries.len()),
            current: FxMap::with_capacity_and_hasher(
                self.current.len(),
                std::hash::BuildHasherDefault::default(),
            ),
        };
        let old = std::mem::replace(self, next);
        for (&pid, &i) in &old.current {
            let e = &old.entries[i];
            if e.exit_ns.is_none() {
                self.current.insert(pid, self.entries.len());
                self.entries.push(Lifetime {
                    // Reported in the window it happened in, not again.
                    fork_ns: None,
                    exec_ns: None,
                    ..e.clone()
                });
            }
        }
        old
    }

    /// The current entry of `pid`, made when the kernel tells of a process we had no fork of.
    fn entry(&mut self, pid: u32) -> &mut Lifetime {
        let i = *self.current.entry(pid).or_insert_with(|| {
            self.entries.push(Lifetime {
                pid,
                ..Lifetime::default()
            });
            self.entries.len() - 1
        });
        &mut self.entries[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_read_after_its_exit_joins_it() {
        let mut log = LifetimeLog::default();
        // Read in this order from two CPUs' rings: exit status, exec, exit, then the fork.
        log.status(7, 300, 3 << 8);
        log.exec(7, 200, "fx-burn");
        log.exit(7, 301);
        log.fork(7, 1, 100, Some("sh".into()));
        let all = log.entries();
        assert_eq!(all.len(), 1, "{all:?}");
        let e = &all[0];
        assert_eq!(
            (e.fork_ns, e.exec_ns, e.exit_ns),
            (Some(100), Some(200), Some(300))
        );
        assert_eq!(
            (e.ppid, e.comm.as_str(), e.exit_code()),
            (1, "fx-burn", Some(3))
        );
        // The pid used again by a later process: a new entry.
        log.fork(7, 1, 400, Some("sh".into()));
        assert_eq!(log.entries().len(), 2);
        assert_eq!(log.to_profile(100)[1].fork_ns, Some(300));
    }
}
