//! `doctor --json`: the findings and the verdict as one JSON object, for scripts and the
//! tests. The schema is the structs below (serde derives it); docs/doctor.md describes it.
//! Figures are rounded as the text shows them, so both renderings agree.
use serde::Serialize;

use super::{
    Findings,
    verdict::{CPU_SATURATED, Verdict, cpu_percent, creator},
};
use crate::profile::lifecycle::{self, Program};

/// The findings and the verdict as JSON (one object, one line).
pub(crate) fn json(f: &Findings, v: &Verdict) -> String {
    serde_json::to_string(&Report::new(f, v)).expect("plain data serializes")
}

/// `x` to `places` decimals (0.1 for shares, 0.001 for seconds).
fn round(x: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (x * scale).round() / scale
}

#[derive(Serialize)]
struct Report<'a> {
    verdict: &'a str,
    holder: Option<&'a str>,
    problems: &'a [String],
    remedies: &'a [String],
    duration_s: f64,
    samples: u64,
    frequency_hz: u32,
    kernel: &'a str,
    /// Dying memory cgroups at the window's start and end.
    dying_memory_start: Option<u64>,
    dying_memory_end: Option<u64>,
    controllers: Vec<Controller<'a>>,
    v2_nr_dying_descendants: Option<u64>,
    v2_memory: Option<V2MemoryJson<'a>>,
    mem_cgroup_slab: Option<u64>,
    percpu_kb: Option<u64>,
    cache_holders: Vec<CacheHolder>,
    churn: Vec<Churn<'a>>,
    churn_error: Option<&'a str>,
    programs: Vec<ProgramJson<'a>>,
    crash_loops: usize,
    attach_error: Option<&'a str>,
    kernel_events: Vec<KernelEvent<'a>>,
    kernel_log_error: Option<&'a str>,
    cpus: Vec<Cpu<'a>>,
    memcg: Vec<Memcg<'a>>,
    memcg_functions_present: &'a [&'static str],
    memcg_functions_absent: &'a [&'static str],
    /// Threads that waited `STARVED_WARN` or more for a CPU; null when not traced.
    starved: Option<Vec<StarvedJson<'a>>>,
}

#[derive(Serialize)]
struct StarvedJson<'a> {
    tid: u32,
    pid: u32,
    comm: &'a str,
    wait_s: f64,
    cpu: u32,
    at_s: f64,
    ran_instead: Vec<RanInsteadJson<'a>>,
}

#[derive(Serialize)]
struct RanInsteadJson<'a> {
    pid: u32,
    comm: &'a str,
    percent: f64,
    function: &'a str,
}

fn starved_json(s: &super::Starved) -> StarvedJson<'_> {
    StarvedJson {
        tid: s.tid,
        pid: s.pid,
        comm: &s.comm,
        wait_s: round(s.wait_s, 3),
        cpu: s.cpu,
        at_s: round(s.at_s, 3),
        ran_instead: (s.instead.iter())
            .map(|r| RanInsteadJson {
                pid: r.pid,
                comm: &r.comm,
                percent: round(r.percent(), 1),
                function: &r.function,
            })
            .collect(),
    }
}

#[derive(Serialize)]
#[expect(
    clippy::struct_field_names,
    reason = "the names are doctor --json's schema"
)]
struct Controller<'a> {
    controller: &'a str,
    mount: String,
    num_cgroups: u64,
    live: u64,
    dying: u64,
}

#[derive(Serialize)]
struct CacheHolder {
    path: String,
    total_cache_bytes: u64,
    children_cache_bytes: u64,
    unexplained_bytes: u64,
    live_children: u64,
}

#[derive(Serialize)]
struct Churn<'a> {
    pid: u32,
    comm: &'a str,
    mkdirs: u64,
    rmdirs: u64,
    mkdirs_per_s: f64,
    parents: Vec<PathCount<'a>>,
    /// Short-lived helpers whose churn is charged here.
    via: Vec<Helper<'a>>,
}

#[derive(Serialize)]
struct Helper<'a> {
    comm: &'a str,
    processes: u64,
}

#[derive(Serialize)]
struct PathCount<'a> {
    path: &'a str,
    events: u64,
}

#[derive(Serialize)]
struct ProgramJson<'a> {
    #[serde(flatten)]
    program: lifecycle::json::ProgramJson<'a>,
    /// Who made its cgroups, with the churn that cost (`verdict::creator`).
    creator: Option<Creator<'a>>,
}

#[derive(Serialize)]
struct Creator<'a> {
    pid: u32,
    comm: &'a str,
    mkdirs: u64,
    rmdirs: u64,
    mkdirs_per_min: f64,
    rmdirs_per_min: f64,
    /// Short-lived helpers whose churn is its (`ChurnCount::via`).
    via: Vec<Helper<'a>>,
}

#[derive(Serialize)]
struct KernelEvent<'a> {
    ts_us: u64,
    offset_s: f64,
    kind: &'a str,
    message: &'a str,
    timeline: &'a str,
}

/// cgroup2's dying memcgs per subtree; null when memory is not enabled on cgroup2.
#[derive(Serialize)]
struct V2MemoryJson<'a> {
    mount: String,
    dying: u64,
    source: &'a str,
    subtrees: Vec<Subtree>,
    holder: Option<Subtree>,
}

#[derive(Serialize)]
struct Subtree {
    path: String,
    dying: u64,
    file_bytes: Option<u64>,
}

impl Subtree {
    fn new(s: &crate::cgroups::MemorySubtree) -> Self {
        Subtree {
            path: s.path.display().to_string(),
            dying: s.dying,
            file_bytes: s.file_bytes,
        }
    }
}

#[derive(Serialize)]
#[expect(
    clippy::struct_field_names,
    reason = "the names are doctor --json's schema"
)]
struct Cpu<'a> {
    cpu: u32,
    busy_percent: f64,
    saturated: bool,
    /// The processes that kept it busiest, busiest first.
    top: Vec<CpuShare<'a>>,
}

#[derive(Serialize)]
struct CpuShare<'a> {
    comm: &'a str,
    pid: u32,
    percent: f64,
}

#[derive(Serialize)]
#[expect(
    clippy::struct_field_names,
    reason = "the names are doctor --json's schema"
)]
struct Memcg<'a> {
    pid: u32,
    comm: &'a str,
    samples: u64,
    memcg_samples: u64,
    percent: f64,
    cpu_percent: f64,
    top_function: &'a str,
    functions: Vec<Function<'a>>,
}

#[derive(Serialize)]
struct Function<'a> {
    function: &'a str,
    samples: u64,
}

impl<'a> Churn<'a> {
    fn new(c: &'a crate::bpf::churn::ChurnCount, f: &Findings) -> Self {
        Churn {
            pid: c.pid,
            comm: &c.comm,
            mkdirs: c.mkdirs,
            rmdirs: c.rmdirs,
            mkdirs_per_s: round(f.churn_rate(c), 3),
            parents: (c.parents.iter())
                .map(|(path, events)| PathCount {
                    path,
                    events: *events,
                })
                .collect(),
            via: helpers(&c.via),
        }
    }
}

fn helpers(via: &[(String, u64)]) -> Vec<Helper<'_>> {
    via.iter()
        .map(|(comm, processes)| Helper {
            comm,
            processes: *processes,
        })
        .collect()
}

impl<'a> Report<'a> {
    fn new(f: &'a Findings, v: &'a Verdict) -> Self {
        let cg = &f.cgroups;
        Report {
            verdict: v.level.name(),
            holder: v.holder.as_deref(),
            problems: &v.problems,
            remedies: &v.remedies,
            duration_s: round(f.duration_s, 3),
            samples: f.samples,
            frequency_hz: f.frequency_hz,
            kernel: &f.kernel,
            dying_memory_start: f.dying_memory.map(|d| d.0),
            dying_memory_end: f.dying_memory.map(|d| d.1),
            controllers: (cg.controllers.iter())
                .map(|c| Controller {
                    controller: &c.controller,
                    mount: c.mount.display().to_string(),
                    num_cgroups: c.num_cgroups,
                    live: c.live,
                    dying: c.dying,
                })
                .collect(),
            v2_nr_dying_descendants: cg.v2.as_ref().map(|p| p.1),
            v2_memory: cg.v2_memory.as_ref().map(|m| V2MemoryJson {
                mount: m.mount.display().to_string(),
                dying: m.dying,
                source: m.source,
                subtrees: m.subtrees.iter().map(Subtree::new).collect(),
                holder: m.holder.as_ref().map(Subtree::new),
            }),
            mem_cgroup_slab: cg.mem_cgroup_slab,
            percpu_kb: cg.percpu_kb,
            cache_holders: (cg.cache_holders.iter())
                .map(|h| CacheHolder {
                    path: h.path.display().to_string(),
                    total_cache_bytes: h.total_cache,
                    children_cache_bytes: h.children_cache,
                    unexplained_bytes: h.unexplained(),
                    live_children: h.live_children,
                })
                .collect(),
            churn: f.churn.iter().map(|c| Churn::new(c, f)).collect(),
            churn_error: f.churn_error.as_deref(),
            programs: f.programs.iter().map(|p| ProgramJson::new(p, f)).collect(),
            crash_loops: f.programs.iter().filter(|p| p.crash_loop).count(),
            attach_error: f.attach_error.as_deref(),
            kernel_events: (f.kernel_events.iter().zip(&f.timeline))
                .map(|(e, line)| KernelEvent {
                    ts_us: e.ts_us,
                    offset_s: round(e.offset_s, 3),
                    kind: e.kind,
                    message: &e.message,
                    timeline: line,
                })
                .collect(),
            kernel_log_error: f.kernel_log_error.as_deref(),
            cpus: (f.cpus.iter())
                .map(|&(cpu, busy)| Cpu {
                    cpu,
                    busy_percent: round(busy, 1),
                    saturated: busy >= CPU_SATURATED,
                    top: (f.cpu_top.iter()).find(|(c, _)| *c == cpu).map_or(
                        Vec::new(),
                        |(_, top)| {
                            top.iter()
                                .map(|p| CpuShare {
                                    comm: &p.comm,
                                    pid: p.pid,
                                    percent: round(p.percent, 1),
                                })
                                .collect()
                        },
                    ),
                })
                .collect(),
            memcg: (f.memcg.iter())
                .map(|s| Memcg {
                    pid: s.pid,
                    comm: &s.comm,
                    samples: s.samples,
                    memcg_samples: s.memcg_samples,
                    percent: round(s.percent(), 1),
                    cpu_percent: round(cpu_percent(s, f), 1),
                    top_function: s.top_function(),
                    functions: (s.functions.iter())
                        .map(|(function, samples)| Function {
                            function,
                            samples: *samples,
                        })
                        .collect(),
                })
                .collect(),
            memcg_functions_present: &f.memcg_present,
            memcg_functions_absent: &f.memcg_absent,
            starved: (f.starved.as_ref()).map(|v| v.iter().map(starved_json).collect()),
        }
    }
}

impl<'a> ProgramJson<'a> {
    fn new(p: &'a Program, f: &'a Findings) -> Self {
        ProgramJson {
            program: p.into(),
            creator: creator(p, &f.churn).map(|c| Creator {
                pid: c.pid,
                comm: &c.comm,
                mkdirs: c.mkdirs,
                rmdirs: c.rmdirs,
                mkdirs_per_min: round(c.mkdirs as f64 * 60.0 / f.duration_s.max(0.001), 2),
                rmdirs_per_min: round(c.rmdirs as f64 * 60.0 / f.duration_s.max(0.001), 2),
                via: helpers(&c.via),
            }),
        }
    }
}
