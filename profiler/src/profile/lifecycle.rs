//! Process lifecycle per program, over `Profile::lifetimes` (the kernel's fork/exec/exit
//! records with exit statuses): starts, exits by status and median lifetime per executable
//! and cgroup, and crash-loop detection. The doctor adds the cgroup each process was moved
//! into (`bpf::churn` attach map) and links it to the cgroup churn; `report --stats` has no
//! cgroups in a capture and groups by executable and parent instead.
use std::collections::{BTreeMap, BTreeSet, HashMap};

pub mod json;

use super::model::Lifetime;

/// A crash loop restarts its program at least this often with failing exits, per minute
/// (docs/doctor.md)...
pub const CRASH_LOOP_PER_MIN: f64 = 5.0;
/// ...and at least this many failing exits were seen (a short window's single failure is
/// not a loop, whatever its rate).
pub const CRASH_LOOP_MIN_FAILS: u64 = 5;

/// One program in one place: the same executable (and comm, which tells scripts of one
/// interpreter apart) in the same place of the cgroup tree, whatever per-attempt ids its
/// cgroups carry (`cgroup_place`): a supervisor that starts each attempt in a new cgroup
/// restarts one program, not dozens that each started once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Program {
    pub comm: String,
    /// Executable path ("" unknown).
    pub exe: String,
    /// The place of its cgroups within their hierarchy, per-attempt ids folded to `*`
    /// (`/system.slice/docker-*.scope`; `cgroup_place`); "" unknown: not moved into one
    /// during the window, nor was its parent.
    pub cgroup: String,
    /// How many distinct cgroups that place stands for (1: restarted in the same one).
    pub cgroups_seen: usize,
    /// Processes that started (forked or exec'd) during the window, by start time.
    pub pids: Vec<u32>,
    /// Exits by how they ended: ("code 2", n), ("signal 9", n), ("unknown", n); most first.
    pub exits: Vec<(String, u64)>,
    /// Exits that count as failures (`failed`).
    pub failing: u64,
    /// Median time from start to exit of the processes that did both in the window, ns.
    pub median_lifetime_ns: Option<u64>,
    /// Who started them: (parent pid, parent comm or "", starts), most first.
    pub parents: Vec<(u32, String, u64)>,
    /// The process that keeps restarting it: the nearest ancestor of its starters that was
    /// still running at the window's end (`supervisor_of`), the one most starts share:
    /// (pid, comm or ""). A runtime that forks a short-lived `runc` or shim per attempt has
    /// one starter per start and one supervisor.
    pub supervisor: Option<(u32, String)>,
    /// Failing exits per minute over the window.
    pub failing_per_min: f64,
    /// Starts per minute over the window.
    pub starts_per_min: f64,
    /// Judged a crash loop (`is_crash_loop`).
    pub crash_loop: bool,
}

impl Program {
    pub fn starts(&self) -> u64 {
        self.pids.len() as u64
    }

    /// The most common failing status ("code 2"), if any failed.
    pub fn failing_status(&self) -> Option<&str> {
        self.exits
            .iter()
            .find(|(how, _)| how != "code 0" && how != "unknown" && !is_clean_signal_name(how))
            .map(|(how, _)| how.as_str())
    }

    /// One program's lifecycle in a line (also `report --stats`).
    pub fn summary(&self) -> String {
        let p = self;
        let exits: Vec<String> = p
            .exits
            .iter()
            .map(|(how, n)| format!("{n} {how}"))
            .collect();
        format!(
            "{}{}: {} started ({:.1}/min), exits: {}; median life {}{}",
            p.name(),
            match (p.cgroup.as_str(), p.cgroups_seen) {
                ("", _) => String::new(),
                (place, 0 | 1) => format!(" in {place}"),
                (place, n) => format!(" in {place} ({n} cgroups)"),
            },
            p.starts(),
            p.starts_per_min,
            if exits.is_empty() {
                "none".to_owned()
            } else {
                exits.join(", ")
            },
            p.median_lifetime_ns
                .map_or("unknown".to_owned(), |ns| format!(
                    "{:.1} ms",
                    ns as f64 / 1e6
                )),
            p.started_by().map_or(String::new(), |s| format!("; {s}"))
        )
    }

    /// `started by zsuper (pid 10)`, or for one starter per start `started by runc (50
    /// processes) under loop.sh (pid 10)`; None if no start was seen.
    pub fn started_by(&self) -> Option<String> {
        let name = |comm: &str| if comm.is_empty() { "?" } else { comm }.to_owned();
        let (pid, comm, _) = self.parents.first()?;
        let mut s = match self.parents.len() {
            1 => format!("started by {} (pid {pid})", name(comm)),
            n => format!("started by {} ({n} processes)", name(self.starters_comm())),
        };
        if let Some((pid, comm)) = &self.supervisor
            && (self.parents.len() > 1 || self.parents[0].0 != *pid)
        {
            s.push_str(&format!(" under {} (pid {pid})", name(comm)));
        }
        Some(s)
    }

    /// The name most of its starts' starters have ("" if none is named).
    fn starters_comm(&self) -> &str {
        let mut starts: BTreeMap<&str, u64> = BTreeMap::new();
        for (_, comm, n) in self.parents.iter().filter(|p| !p.1.is_empty()) {
            *starts.entry(comm).or_default() += n;
        }
        starts
            .into_iter()
            .max_by_key(|(_, n)| *n)
            .map_or("", |(comm, _)| comm)
    }

    /// Names its starters and supervisor that the records did not (they started before the
    /// window) with `comm_of` (`util::proc_comm` while they run).
    pub fn name_starters(&mut self, comm_of: impl Fn(u32) -> Option<String>) {
        let unnamed = self.parents.iter_mut().map(|(pid, comm, _)| (*pid, comm));
        for (pid, comm) in unnamed.chain(self.supervisor.as_mut().map(|(p, c)| (*p, c))) {
            if comm.is_empty()
                && let Some(c) = comm_of(pid)
            {
                *comm = c;
            }
        }
    }

    /// Name for people: comm, with the executable when it says more.
    pub fn name(&self) -> String {
        let base = self.exe.rsplit('/').next().unwrap_or("");
        if self.comm.is_empty() && self.exe.is_empty() {
            "[unknown]".to_owned()
        } else if self.exe.is_empty() || base == self.comm {
            self.comm.clone()
        } else {
            format!("{} ({})", self.comm, self.exe)
        }
    }
}

/// Signals a service manager treats as a clean stop (systemd's SuccessExitStatus default):
/// SIGHUP, SIGINT, SIGPIPE, SIGTERM.
const CLEAN_SIGNALS: [u8; 4] = [1, 2, 13, 15];

fn is_clean_signal_name(how: &str) -> bool {
    how.strip_prefix("signal ")
        .and_then(|s| s.parse::<u8>().ok())
        .is_some_and(|s| CLEAN_SIGNALS.contains(&s))
}

/// An exit that counts as a failure: a non-zero code, or a signal other than a clean stop.
/// Unknown statuses are not failures.
pub fn failed(l: &Lifetime) -> bool {
    match (l.exit_code(), l.exit_signal()) {
        (Some(c), _) => c != 0,
        (_, Some(s)) => !CLEAN_SIGNALS.contains(&(s & 0x7f)),
        _ => false,
    }
}

/// How a process ended, as `LifetimeStats::exits` names it.
pub fn exit_name(l: &Lifetime) -> String {
    match (l.exit_code(), l.exit_signal()) {
        (Some(c), _) => format!("code {c}"),
        (_, Some(s)) => format!("signal {s}"),
        _ => "unknown".to_owned(),
    }
}

/// The crash-loop rule (docs/doctor.md): at least `CRASH_LOOP_MIN_FAILS` failing exits, at
/// `CRASH_LOOP_PER_MIN` or more per minute, and started again after failing (starts at least
/// as many as failures less one, so a batch of failures that nobody restarts is not a loop).
pub fn is_crash_loop(starts: u64, failing: u64, window_s: f64) -> bool {
    let per_min = failing as f64 * 60.0 / window_s.max(0.001);
    failing >= CRASH_LOOP_MIN_FAILS && per_min >= CRASH_LOOP_PER_MIN && starts + 1 >= failing
}

/// The place of a cgroup in its tree: its path with the ids a runtime or service manager
/// makes anew for every attempt folded to `*`, so the cgroups of one program's restarts
/// share it. Folded: UUIDs (pod UIDs, with `-` or `_`), hex ids of 12 digits or more
/// (container ids in `docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`, a
/// bare `/docker/<id>`, systemd's `run-r<id>.scope`) and decimal numbers (run and attempt
/// counters: `run-100`, `attempt7`, `run-u42.scope`). Names stay: `kubelet.service`,
/// `burstable`.
pub fn cgroup_place(path: &str) -> String {
    path.split('/').map(fold_ids).collect::<Vec<_>>().join("/")
}

/// One path component with its per-attempt ids folded (`cgroup_place`).
fn fold_ids(component: &str) -> String {
    let b = component.as_bytes();
    let mut out = String::with_capacity(component.len());
    let mut i = 0;
    while i < b.len() {
        let run = |is: fn(&u8) -> bool| b[i..].iter().take_while(|c| is(c)).count();
        let starts = |is: fn(&u8) -> bool| i == 0 || !is(&b[i - 1]);
        // A UUID wherever it starts (`pod` + UID: the `d` is a hex digit); other ids as whole
        // runs, never a run's tail.
        let id_len = uuid_at(&b[i..])
            .or_else(|| {
                let hex = run(u8::is_ascii_hexdigit);
                (hex >= 12 && starts(u8::is_ascii_hexdigit)).then_some(hex)
            })
            .or_else(|| {
                let digits = run(u8::is_ascii_digit);
                (digits > 0 && starts(u8::is_ascii_digit)).then_some(digits)
            });
        match id_len {
            Some(n) => {
                if !out.ends_with('*') {
                    out.push('*');
                }
                i += n;
            }
            None => {
                let next = component[i..].chars().next().expect("i is a char boundary");
                out.push(next);
                i += next.len_utf8();
            }
        }
    }
    out
}

/// The length of a UUID (8-4-4-4-12 hex digits, `-` or `_` between) at the start of `b`.
fn uuid_at(b: &[u8]) -> Option<usize> {
    const GROUPS: [usize; 5] = [8, 4, 4, 4, 12];
    let mut at = 0;
    for (n, len) in GROUPS.into_iter().enumerate() {
        if n > 0 {
            matches!(b.get(at), Some(b'-' | b'_')).then_some(())?;
            at += 1;
        }
        let group = b.get(at..at + len)?;
        group.iter().all(u8::is_ascii_hexdigit).then_some(())?;
        at += len;
    }
    // Not the head of a longer hex run.
    (!b.get(at).is_some_and(u8::is_ascii_hexdigit)).then_some(at)
}

/// Where each process ran: `attaches` are (pid, cgroup path) moves seen during the window; a
/// process never moved inherits its parent's (fork keeps the cgroup). Pids are assumed not
/// reused within the window.
pub fn cgroup_of(lifetimes: &[Lifetime], attaches: &[(u32, String)]) -> HashMap<u32, String> {
    let mut of: HashMap<u32, String> = HashMap::new();
    for (pid, path) in attaches {
        // Moved into several hierarchies (one per v1 controller): the deepest path names the
        // service best (a controller the manager does not use keeps the process at `/`).
        let e = of.entry(*pid).or_default();
        if path.len() > e.len() {
            e.clone_from(path);
        }
    }
    let parent: HashMap<u32, u32> = lifetimes
        .iter()
        .filter(|l| l.ppid != 0)
        .map(|l| (l.pid, l.ppid))
        .collect();
    for l in lifetimes {
        if of.contains_key(&l.pid) {
            continue;
        }
        // Walk up a few generations (a shell that forks a helper that forks a worker).
        let mut p = l.ppid;
        for _ in 0..8 {
            if let Some(path) = of.get(&p) {
                let path = path.clone();
                of.insert(l.pid, path);
                break;
            }
            match parent.get(&p) {
                Some(&pp) if pp != 0 => p = pp,
                _ => break,
            }
        }
    }
    of
}

/// Groups the lifetimes of a window of `window_s` into programs, most failing exits first
/// (then most starts). With `by_parent` (captures and the agent, which keep no cgroups) the
/// supervisor (`supervisor_of` the parent) stands in for the cgroup: one supervisor
/// restarting one program, through one short-lived starter per attempt or none.
pub fn programs<S: std::hash::BuildHasher>(
    lifetimes: &[Lifetime],
    cgroups: &HashMap<u32, String, S>,
    by_parent: bool,
    window_s: f64,
) -> Vec<Program> {
    let in_window = within_window(lifetimes, window_s);
    let life: HashMap<u32, &Lifetime> = in_window.iter().map(|l| (l.pid, l)).collect();
    let alive = |pid: u32| life.get(&pid).is_none_or(|l| l.exit_ns.is_none());
    let mut out: Vec<Program> = group_by_place(&in_window, cgroups, by_parent, &life, &alive)
        .into_iter()
        .map(|((comm, exe, place), (ls, seen))| {
            let mut p = program(ls, &life, &alive, window_s);
            (p.comm, p.exe, p.cgroups_seen) = (comm, exe, seen.len());
            if !by_parent {
                // Only a program moved into a cgroup by its starter, as a service manager or
                // container runtime starts a service, can be a crash loop in the doctor: a
                // shell loop running `grep` (exit 1) is not.
                p.crash_loop &= !place.is_empty();
                p.cgroup = place;
            }
            p
        })
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse((p.failing, p.starts())));
    out
}

/// `programs` cut to what a report shows: every crash loop, and the `n` others first in
/// order (the most failing exits).
pub fn loops_and_top(mut programs: Vec<Program>, n: usize) -> Vec<Program> {
    let mut others = 0;
    programs.retain(|p| {
        others += usize::from(!p.crash_loop);
        p.crash_loop || others <= n
    });
    programs
}

/// The lifetimes as the window saw them. Records read after the window closed (the last
/// drain) belong to no window: a start after it is dropped, an exit after it is not yet an
/// exit (the exit-status tracepoint is detached by then, so its status would read as
/// unknown). Records from before the window (read at its start, before the exit-status
/// tracepoint was attached) carry offset 0 (`process::lifetimes` clamps them there): a
/// process that ended there is left out, one that started there counts as started before
/// the window.
fn within_window(lifetimes: &[Lifetime], window_s: f64) -> Vec<Lifetime> {
    let window_ns = (window_s.max(0.0) * 1e9) as u64;
    lifetimes
        .iter()
        .filter(|l| l.fork_ns.or(l.exec_ns).is_none_or(|t| t <= window_ns))
        .filter(|l| l.exit_ns != Some(0))
        .map(|l| {
            let mut l = l.clone();
            if l.exit_ns.is_some_and(|t| t > window_ns) {
                (l.exit_ns, l.exit_status) = (None, None);
            }
            if l.fork_ns == Some(0) {
                l.fork_ns = None;
            }
            if l.exec_ns == Some(0) {
                l.exec_ns = None;
            }
            l
        })
        .collect()
}

/// (comm, exe, place) -> its lifetimes and the cgroups the place stands for.
type Groups<'a> = BTreeMap<(String, String, String), (Vec<&'a Lifetime>, BTreeSet<&'a str>)>;

/// Lifetimes grouped into programs: the same comm and executable in the same place
/// (`cgroup_place`, or with `by_parent` the supervisor of its parent).
fn group_by_place<'a, S: std::hash::BuildHasher>(
    lifetimes: &'a [Lifetime],
    cgroups: &'a HashMap<u32, String, S>,
    by_parent: bool,
    life: &HashMap<u32, &Lifetime>,
    alive: &impl Fn(u32) -> bool,
) -> Groups<'a> {
    let mut groups = Groups::new();
    for l in lifetimes {
        let cgroup = cgroups.get(&l.pid).map_or("", String::as_str);
        let place = if by_parent {
            format!("under {}", supervisor_of(l.ppid, life, alive))
        } else {
            cgroup_place(cgroup)
        };
        let (ls, seen) = groups
            .entry((l.comm.clone(), l.exe.clone(), place))
            .or_default();
        ls.push(l);
        if !cgroup.is_empty() {
            seen.insert(cgroup);
        }
    }
    groups
}

/// One program's starts, exits, lifetimes, starters and supervisor over a window of
/// `window_s`; its name and place are the caller's to fill. `life` names the starters.
fn program(
    mut ls: Vec<&Lifetime>,
    life: &HashMap<u32, &Lifetime>,
    alive: &impl Fn(u32) -> bool,
    window_s: f64,
) -> Program {
    ls.sort_by_key(|l| l.fork_ns.or(l.exec_ns).unwrap_or(0));
    let started: Vec<&&Lifetime> = ls.iter().filter(|l| l.started()).collect();
    let mut exits: BTreeMap<String, u64> = BTreeMap::new();
    let mut lives: Vec<u64> = Vec::new();
    let mut failing = 0;
    let mut parents: BTreeMap<u32, u64> = BTreeMap::new();
    let mut supervisors: BTreeMap<u32, u64> = BTreeMap::new();
    for l in &ls {
        if l.started() {
            *parents.entry(l.ppid).or_default() += 1;
            *supervisors
                .entry(supervisor_of(l.ppid, life, alive))
                .or_default() += 1;
        }
        let Some(exit) = l.exit_ns else { continue };
        *exits.entry(exit_name(l)).or_default() += 1;
        failing += u64::from(failed(l));
        if let Some(start) = l.fork_ns.or(l.exec_ns) {
            lives.push(exit.saturating_sub(start));
        }
    }
    lives.sort_unstable();
    let mut exits: Vec<(String, u64)> = exits.into_iter().collect();
    exits.sort_by_key(|e| std::cmp::Reverse(e.1));
    let comm_of = |pid: u32| life.get(&pid).map_or("", |l| l.comm.as_str()).to_owned();
    let mut parents: Vec<(u32, String, u64)> = parents
        .into_iter()
        .map(|(p, n)| (p, comm_of(p), n))
        .collect();
    let supervisor = (supervisors.into_iter())
        .filter(|(pid, _)| *pid != 0)
        .max_by_key(|(pid, n)| (*n, std::cmp::Reverse(*pid)))
        .map(|(pid, _)| (pid, comm_of(pid)));
    parents.sort_by_key(|p| std::cmp::Reverse(p.2));
    let starts = started.len() as u64;
    let minutes = window_s.max(0.001) / 60.0;
    Program {
        pids: started.iter().map(|l| l.pid).collect(),
        exits,
        failing,
        median_lifetime_ns: lives.get(lives.len() / 2).copied(),
        parents,
        supervisor,
        failing_per_min: failing as f64 / minutes,
        starts_per_min: starts as f64 / minutes,
        crash_loop: is_crash_loop(starts, failing, window_s),
        ..Program::default()
    }
}

/// Generations walked up from a process to its supervisor at most (a shell that runs a
/// hook that runs `runc` that runs the program).
const MAX_GENERATIONS: usize = 8;

/// `pid`, or its nearest ancestor still running, if `pid` is gone: the long-lived process a
/// short-lived one works for. A chain that leaves what the records saw stops at the last
/// process known.
pub fn supervisor_of<S: std::hash::BuildHasher>(
    pid: u32,
    life: &HashMap<u32, &Lifetime, S>,
    alive: &impl Fn(u32) -> bool,
) -> u32 {
    let mut at = pid;
    for _ in 0..MAX_GENERATIONS {
        match life.get(&at) {
            Some(l) if !alive(at) && l.ppid != 0 => at = l.ppid,
            _ => break,
        }
    }
    at
}

#[cfg(test)]
mod tests;
