//! Cgroup churn charged to who causes it. A supervisor that creates and removes each
//! attempt's cgroup through short-lived helpers (`mkdir`, `rmdir`, a runtime's hook or shim)
//! is the churner; counted per process, its churn would be split into one small line per
//! helper. So the counts of a helper (a process gone by the end that made or removed at most
//! `HELPER_MAX_CHANGES` cgroups in each hierarchy: a tool run once per attempt, such as
//! `mkdir` or `runc`, which makes the container's cgroup in every v1 hierarchy) go to its
//! nearest ancestor still running (`lifecycle::supervisor_of`), with the helpers named
//! (`ChurnCount::via`). A gone process that made many cgroups did the churn itself, and
//! keeps it. The tracer runs a
//! moment longer than the profile's records: a helper of those edges, whose parent no record
//! names, goes to the supervisor whose helpers share its name and parent cgroup.
use std::collections::{BTreeMap, HashMap};

use crate::{
    bpf::churn::ChurnCount,
    profile::{Lifetime, lifecycle::supervisor_of},
};

/// cgroups a helper makes and removes in its life at most, per hierarchy (`mkdir -p` of a
/// few levels).
const HELPER_MAX_CHANGES: u64 = 4;

/// `churn` with each short-lived process's counts moved to its long-lived ancestor, most
/// cgroups created and removed first. `alive` tells whether a process still runs (its exit
/// may have come after the last record read); `hierarchies` is how many cgroup hierarchies
/// are mounted.
pub(crate) fn charge_to_supervisors(
    churn: Vec<ChurnCount>,
    lifetimes: &[Lifetime],
    hierarchies: usize,
    alive: impl Fn(u32) -> bool,
) -> Vec<ChurnCount> {
    let life: HashMap<u32, &Lifetime> = lifetimes.iter().map(|l| (l.pid, l)).collect();
    let mut comm: HashMap<u32, String> =
        lifetimes.iter().map(|l| (l.pid, l.comm.clone())).collect();
    comm.extend(churn.iter().map(|c| (c.pid, c.comm.clone())));
    let mut by_owner: BTreeMap<u32, ChurnCount> = BTreeMap::new();
    // A helper whose parent no record names is one of the edges.
    let max_changes = HELPER_MAX_CHANGES * hierarchies.max(1) as u64;
    let helper = |c: &ChurnCount| !alive(c.pid) && c.mkdirs + c.rmdirs <= max_changes;
    let (edges, known): (Vec<ChurnCount>, Vec<ChurnCount>) = churn
        .into_iter()
        .partition(|c| helper(c) && life.get(&c.pid).is_none_or(|l| l.ppid == 0));
    for c in known {
        let owner = if helper(&c) {
            supervisor_of(c.pid, &life, &alive)
        } else {
            c.pid
        };
        let e = by_owner.entry(owner).or_insert_with(|| ChurnCount {
            pid: owner,
            comm: comm.get(&owner).cloned().unwrap_or_default(),
            ..ChurnCount::default()
        });
        add(e, c);
    }
    for c in edges {
        let owner = by_owner
            .values()
            .find(|o| {
                o.via.iter().any(|v| v.0 == c.comm)
                    && o.parents
                        .iter()
                        .any(|p| c.parents.iter().any(|q| q.0 == p.0))
            })
            .map_or(c.pid, |o| o.pid);
        let e = by_owner.entry(owner).or_insert_with(|| ChurnCount {
            pid: c.pid,
            comm: c.comm.clone(),
            ..ChurnCount::default()
        });
        add(e, c);
    }
    let mut out: Vec<ChurnCount> = by_owner.into_values().collect();
    for c in &mut out {
        c.parents.sort_by_key(|p| std::cmp::Reverse(p.1));
        c.via.sort_by_key(|v| std::cmp::Reverse(v.1));
    }
    out.sort_by_key(|c| std::cmp::Reverse(c.mkdirs + c.rmdirs));
    out
}

/// Adds `c`'s counts to `owner`'s; a helper's comm goes to `via`.
fn add(owner: &mut ChurnCount, c: ChurnCount) {
    owner.mkdirs += c.mkdirs;
    owner.rmdirs += c.rmdirs;
    for (path, n) in c.parents {
        match owner.parents.iter_mut().find(|p| p.0 == path) {
            Some(p) => p.1 += n,
            None => owner.parents.push((path, n)),
        }
    }
    if c.pid == owner.pid {
        return;
    }
    match owner.via.iter_mut().find(|v| v.0 == c.comm) {
        Some(v) => v.1 += 1,
        None => owner.via.push((c.comm, 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn churn(pid: u32, comm: &str, mkdirs: u64, rmdirs: u64) -> ChurnCount {
        ChurnCount {
            pid,
            comm: comm.into(),
            mkdirs,
            rmdirs,
            parents: vec![("/zsvc".into(), mkdirs + rmdirs)],
            via: Vec::new(),
        }
    }

    /// Whether `pid` still runs: the records saw it and no exit (the tests' /proc).
    fn alive(lives: &[Lifetime], pid: u32) -> bool {
        lives.iter().any(|l| l.pid == pid && l.exit_ns.is_none())
    }

    fn life(pid: u32, ppid: u32, comm: &str, exited: bool) -> Lifetime {
        Lifetime {
            pid,
            ppid,
            comm: comm.into(),
            fork_ns: Some(1),
            exit_ns: exited.then_some(2),
            ..Lifetime::default()
        }
    }

    /// A supervisor (pid 10, from before the window) runs `mkdir` and `rmdir` for each
    /// attempt, and a hook shell that runs one more `mkdir`: all of it is the supervisor's.
    #[test]
    fn helpers_churn_is_their_supervisors() {
        let mut counts = vec![churn(7, "cron-job", 1, 0)];
        let mut lives = vec![life(7, 1, "cron-job", false), life(30, 10, "hook", true)];
        for i in 0..5 {
            counts.push(churn(100 + 2 * i, "mkdir", 1, 0));
            counts.push(churn(101 + 2 * i, "rmdir", 0, 1));
            lives.push(life(100 + 2 * i, 10, "mkdir", true));
            lives.push(life(101 + 2 * i, 10, "rmdir", true));
        }
        counts.push(churn(31, "mkdir", 1, 0));
        lives.push(life(31, 30, "mkdir", true));
        lives.push(life(10, 0, "zsuper", false));
        let out = charge_to_supervisors(counts, &lives, 1, |pid| alive(&lives, pid));
        assert_eq!(out.len(), 2, "{out:?}");
        let s = &out[0];
        assert_eq!(
            (s.pid, s.comm.as_str(), s.mkdirs, s.rmdirs),
            (10, "zsuper", 6, 5)
        );
        assert_eq!(s.parents, [("/zsvc".to_owned(), 11)]);
        assert_eq!(s.via, [("mkdir".to_owned(), 6), ("rmdir".to_owned(), 5)]);
        // A long-lived process keeps its own churn, helped by nobody.
        assert_eq!((out[1].pid, out[1].mkdirs, out[1].via.len()), (7, 1, 0));
    }

    /// A helper whose parent the window never saw stays as it is.
    #[test]
    fn an_orphan_helper_keeps_its_churn() {
        let out = charge_to_supervisors(
            vec![churn(5, "mkdir", 3, 0)],
            &[life(5, 0, "mkdir", true)],
            1,
            |_| false,
        );
        assert_eq!(
            (out[0].pid, out[0].comm.as_str(), out[0].mkdirs),
            (5, "mkdir", 3)
        );
    }

    /// Helpers of the window's edges (no record of them) go to the supervisor whose helpers
    /// they are like: same name, same parent cgroup. Others stay their own.
    #[test]
    fn helpers_at_the_edges_follow_their_likes() {
        let counts = vec![
            churn(100, "mkdir", 1, 0),
            churn(99, "mkdir", 1, 0),
            churn(98, "rmdir", 0, 1),
            ChurnCount {
                parents: vec![("/elsewhere".into(), 1)],
                ..churn(97, "mkdir", 1, 0)
            },
        ];
        let lives = [life(100, 10, "mkdir", true), life(10, 0, "zsuper", false)];
        let out = charge_to_supervisors(counts, &lives, 1, |pid| alive(&lives, pid));
        let s = out.iter().find(|c| c.pid == 10).unwrap();
        assert_eq!((s.mkdirs, s.rmdirs), (2, 0), "{out:?}");
        assert_eq!(s.via, [("mkdir".to_owned(), 2)]);
        // rmdir: the supervisor ran no rmdir the window saw; /elsewhere: another parent.
        assert_eq!(out.len(), 3, "{out:?}");
    }

    /// A short-lived process that made many cgroups (a script creating 500) did the churn
    /// itself: it keeps it, whoever started it.
    #[test]
    fn a_gone_process_with_much_churn_keeps_it() {
        let lives = [life(5, 4, "lab", true), life(4, 0, "test-runner", false)];
        let out = charge_to_supervisors(vec![churn(5, "lab", 500, 500)], &lives, 1, |pid| {
            alive(&lives, pid)
        });
        assert_eq!(
            (out[0].pid, out[0].comm.as_str(), out[0].mkdirs),
            (5, "lab", 500)
        );
        assert!(out[0].via.is_empty());
    }
}
