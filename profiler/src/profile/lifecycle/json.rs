//! A program's lifecycle as JSON: one object per program, the same in `doctor --json` (which
//! adds who made its cgroups) and the agent's /api/programs.
use serde::Serialize;

use super::Program;

#[derive(Serialize)]
pub struct ProgramJson<'a> {
    pub comm: &'a str,
    pub exe: &'a str,
    /// The place of its cgroups, per-attempt ids as `*` (`cgroup_place`); "" unknown.
    pub cgroup: &'a str,
    /// Distinct cgroups `cgroup` stands for.
    pub cgroups_seen: usize,
    pub starts: u64,
    pub starts_per_min: f64,
    pub failing_exits: u64,
    pub failing_per_min: f64,
    pub failing_status: Option<&'a str>,
    pub exits: Vec<Exit<'a>>,
    pub median_lifetime_ms: Option<f64>,
    pub parents: Vec<Parent<'a>>,
    /// The nearest long-lived ancestor of its starters (`Program::supervisor`).
    pub supervisor: Option<Supervisor<'a>>,
    pub crash_loop: bool,
    /// The pids of its starts, only for a crash loop (bounded by the restarts a window holds).
    pub pids: &'a [u32],
}

#[derive(Serialize)]
pub struct Exit<'a> {
    pub status: &'a str,
    pub count: u64,
}

#[derive(Serialize)]
pub struct Parent<'a> {
    pub pid: u32,
    pub comm: &'a str,
    pub starts: u64,
}

#[derive(Serialize)]
pub struct Supervisor<'a> {
    pub pid: u32,
    pub comm: &'a str,
}

impl<'a> From<&'a Program> for ProgramJson<'a> {
    fn from(p: &'a Program) -> Self {
        ProgramJson {
            comm: &p.comm,
            exe: &p.exe,
            cgroup: &p.cgroup,
            cgroups_seen: p.cgroups_seen,
            starts: p.starts(),
            starts_per_min: round(p.starts_per_min, 2),
            failing_exits: p.failing,
            failing_per_min: round(p.failing_per_min, 2),
            failing_status: p.failing_status(),
            exits: (p.exits.iter())
                .map(|(status, count)| Exit {
                    status,
                    count: *count,
                })
                .collect(),
            median_lifetime_ms: p.median_lifetime_ns.map(|ns| round(ns as f64 / 1e6, 3)),
            parents: (p.parents.iter())
                .map(|(pid, comm, starts)| Parent {
                    pid: *pid,
                    comm,
                    starts: *starts,
                })
                .collect(),
            supervisor: (p.supervisor.as_ref()).map(|(pid, comm)| Supervisor { pid: *pid, comm }),
            crash_loop: p.crash_loop,
            pids: if p.crash_loop { &p.pids } else { &[] },
        }
    }
}

fn round(x: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (x * scale).round() / scale
}
