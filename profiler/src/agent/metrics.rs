//! Prometheus metrics of the agent, updated once per window and rendered on each scrape.
//! Label sets are bounded: the first `MAX_SERIES` comms (and cgroups) seen keep their own
//! series, later ones add to `other`, so counters stay monotonic and cardinality fixed.
use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
};

use crate::{
    profile::memcg,
    profile::{
        Counters, Lifetime, Profile,
        lifecycle::{self, Program},
    },
};
use profiler_common::unwind::ByReason;

/// Distinct label values per metric at most, `other` excluded.
pub(crate) const MAX_SERIES: usize = 50;
const OTHER: &str = "other";
/// Programs kept of a window besides its crash loops (/api/programs).
const PROGRAMS_KEPT: usize = 10;

/// Cumulative figures since the agent started.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    /// Samples whose table walk stopped early, by `unwind::reason` code, since start.
    unwind_truncated: ByReason,
    /// Walks of stack copies by the reason they stopped at (0: whole), since start.
    copy_walks: ByReason,
    /// `unwind::report::metrics_text` as of the last window; empty under `--unwind fp`.
    unwind_text: String,
    /// CPU seconds by comm (idle task excluded).
    cpu_by_comm: BoundedCounter,
    /// CPU seconds by cgroup v2 path.
    cpu_by_cgroup: BoundedCounter,
    /// CPU seconds by container id (12 hex digits, from the cgroup path); hosts' own
    /// processes are not counted here.
    cpu_by_container: BoundedCounter,
    /// Seconds with a memory-cgroup catalogue function on the stack, by comm.
    memcg_by_comm: BoundedCounter,
    /// Sample accounting summed over windows.
    counters: Counters,
    /// Windows written to the store, and those dropped (store failing too long).
    pub windows_stored: u64,
    pub windows_dropped: u64,
    /// Bytes of the store's database in use (pages minus free pages) after the last write;
    /// what the store grows by, apart from one-time files and WAL traffic.
    pub store_used_bytes: Option<u64>,
    /// Windows pushed to --push-url, and those dropped from the full push spool.
    pub push_sent: u64,
    pub push_dropped: u64,
    /// Where every sample the drain cut went (`Pipeline`).
    pub pipeline: Pipeline,
    /// Dying cgroups by controller (v1) and `v2` for cgroup2, at the last window.
    dying: Vec<(String, u64)>,
    /// Processes started (forked or exec'd) since the agent started.
    process_starts: u64,
    /// Process exits by `EXIT_REASONS` (a fixed label set).
    process_exits: [u64; 4],
    /// The last window's programs (`profile::lifecycle`): its crash loops, then the others
    /// with the most failing exits (at most `PROGRAMS_KEPT`), for /metrics and /api/programs.
    pub programs: Vec<Program>,
    /// Whether those programs were grouped by cgroup place (the churn tracer saw which
    /// process went into which cgroup) or, without it, by supervisor.
    pub programs_by_cgroup: bool,
    /// cgroups created and removed since the start (all hierarchies); None when the churn
    /// tracer could not start.
    cgroup_churn: Option<(u64, u64)>,
    /// Process generations whose Python names the drain holds, as of the last cut
    /// (`python::Tracker::python_processes`); None with Python frames off.
    pub python_processes: Option<u64>,
    /// Samples of new Python processes that woke the sampler thread (`Session::python_exec_wakes`).
    pub python_exec_wakes: Option<u64>,
    /// The run-queue tracer's per-CPU totals at the last cut (`--runq on`), cumulative as
    /// Prometheus histograms are.
    pub runq: Option<crate::profile::runq::RunQueue>,
    /// The sampler program loaded and how many the kernel refused before it
    /// (`bpf::variant`); None until sampling starts.
    pub sampler: Option<(&'static str, usize)>,
}

/// The agent's stages pass windows through bounded queues (docs/agent.md): a full queue drops
/// the window, never waits. Every sample the drain cut is in exactly one of these, so
/// `cut = stored + in_flight + the drops` holds in every scrape (one lock updates them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pipeline {
    /// Samples cut into windows by the drain.
    pub cut: u64,
    /// Samples cut but not yet stored nor dropped (queued, symbolizing, writing).
    pub in_flight: u64,
    /// Samples written to the store.
    pub stored: u64,
    /// Samples of windows dropped because the symbolizer's queue was full.
    pub dropped_symbolize_queue: u64,
    /// Samples of windows dropped because the store's queue was full (a slow store).
    pub dropped_store_queue: u64,
    /// Samples of windows dropped because the store failed for too long (`MAX_PENDING`).
    pub dropped_store_failing: u64,
    /// Windows not handed to the pusher because its queue was full.
    pub push_queue_dropped_windows: u64,
    /// /debug/pprof/profile requests refused because the symbolizer's queue was full.
    pub pprof_refused: u64,
}

impl Pipeline {
    /// `n` samples of a window leave the pipeline into `to` (a drop counter or `stored`).
    pub(crate) fn settle(&mut self, n: u64, to: fn(&mut Self) -> &mut u64) {
        self.in_flight = self.in_flight.saturating_sub(n);
        *to(self) += n;
    }
}

/// `reason` labels of `profiler_process_exits_total`: exit(0), another code, a signal, and a
/// status the kernel did not report.
const EXIT_REASONS: [&str; 4] = ["exit_zero", "exit_nonzero", "signal", "unknown"];

fn exit_reason(how: &str) -> usize {
    match how {
        "code 0" => 0,
        h if h.starts_with("code ") => 1,
        h if h.starts_with("signal ") => 2,
        _ => 3,
    }
}

#[derive(Debug, Default)]
struct BoundedCounter(BTreeMap<String, f64>);

impl BoundedCounter {
    fn add(&mut self, label: &str, value: f64) {
        let key = if self.0.contains_key(label) || self.0.len() < MAX_SERIES {
            label
        } else {
            OTHER
        };
        *self.0.entry(key.to_owned()).or_default() += value;
    }
}

impl Metrics {
    /// Adds one window's sample accounting (the drain calls this as it cuts the window, so
    /// windows dropped later are counted too) and puts its samples in flight.
    pub(crate) fn add_cut(&mut self, c: &Counters) {
        self.counters = Counters {
            recorded: self.counters.recorded + c.recorded,
            lost_ringbuf_full: self.counters.lost_ringbuf_full + c.lost_ringbuf_full,
            filtered: self.counters.filtered + c.filtered,
            kstack_failed: self.counters.kstack_failed + c.kstack_failed,
            ustack_failed: self.counters.ustack_failed + c.ustack_failed,
        };
        self.pipeline.cut += c.recorded;
        self.pipeline.in_flight += c.recorded;
    }

    /// Dying cgroups by controller, as the caller read them (`cgroups::dying_counts`; the
    /// agent reads them once a minute, not every window).
    pub(crate) fn set_dying(&mut self, dying: Vec<(String, u64)>) {
        self.dying = dying;
    }

    /// Adds one symbolized window's samples to the attribution figures.
    pub(crate) fn add_window(&mut self, p: &Profile) {
        let hz = f64::from(p.meta.frequency_hz.max(1));
        let paths: HashMap<u64, &str> = p.cgroups.iter().map(|c| (c.id, c.path.as_str())).collect();
        let mut by_comm: BTreeMap<&str, u64> = BTreeMap::new();
        let mut by_cgroup: BTreeMap<&str, u64> = BTreeMap::new();
        let mut by_container: BTreeMap<String, u64> = BTreeMap::new();
        for s in p.samples.iter().filter(|s| !crate::profile::is_idle(s)) {
            *by_comm.entry(p.str(s.comm)).or_default() += 1;
            let path = paths.get(&s.cgroup_id).copied().unwrap_or("");
            *by_cgroup
                .entry(if path.is_empty() { "unknown" } else { path })
                .or_default() += 1;
            if let Some(id) = crate::profile::attribution::owner(path).container {
                *by_container
                    .entry(id.chars().take(12).collect())
                    .or_default() += 1;
            }
        }
        // Most samples first, so the bounded slots go to the busiest.
        for (map, counter) in [
            (by_comm, &mut self.cpu_by_comm),
            (by_cgroup, &mut self.cpu_by_cgroup),
        ] {
            let mut v: Vec<_> = map.into_iter().collect();
            v.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
            for (label, n) in v {
                counter.add(label, n as f64 / hz);
            }
        }
        let mut v: Vec<_> = by_container.into_iter().collect();
        v.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        for (id, n) in v {
            self.cpu_by_container.add(&id, n as f64 / hz);
        }
        let mut memcg_by_comm: BTreeMap<String, u64> = BTreeMap::new();
        for share in memcg::shares(p, memcg::CATALOGUE) {
            *memcg_by_comm.entry(share.comm).or_default() += share.memcg_samples;
        }
        for (comm, n) in memcg_by_comm {
            self.memcg_by_comm.add(&comm, n as f64 / hz);
        }
    }

    /// Starts, exits by reason and crash loops of one window of `window_s`. Its programs
    /// are grouped as the doctor groups them, by cgroup place, when `attaches` (which process
    /// went into which cgroup) were traced; else by supervisor, as for a capture.
    pub(crate) fn add_lifecycle(
        &mut self,
        lifetimes: &[Lifetime],
        attaches: Option<&[(u32, String)]>,
        window_s: f64,
    ) {
        let programs = match attaches {
            Some(a) => {
                let cgroups = lifecycle::cgroup_of(lifetimes, a);
                lifecycle::programs(lifetimes, &cgroups, false, window_s)
            }
            None => lifecycle::programs(lifetimes, &HashMap::new(), true, window_s),
        };
        for prog in &programs {
            self.process_starts += prog.starts();
            for (how, n) in &prog.exits {
                self.process_exits[exit_reason(how)] += n;
            }
        }
        let mut programs = lifecycle::loops_and_top(programs, PROGRAMS_KEPT);
        programs.sort_by_key(|p| !p.crash_loop);
        for p in &mut programs {
            p.name_starters(crate::util::proc_comm);
        }
        self.programs = programs;
        self.programs_by_cgroup = attaches.is_some();
    }

    /// One window's cgroup churn (`ChurnTracer::take`).
    pub(crate) fn add_churn(&mut self, churn: &[crate::bpf::churn::ChurnCount]) {
        let (made, removed) = self.cgroup_churn.get_or_insert((0, 0));
        for c in churn {
            *made += c.mkdirs;
            *removed += c.rmdirs;
        }
    }

    /// The table walk's figures after a window: its cut-short samples and walks of stack
    /// copies added to the totals; `named` is the window's named counters (the sampler's
    /// stack copies since the start, `Session::meta`).
    pub(crate) fn add_unwind(
        &mut self,
        stats: &crate::unwind::LoaderStats,
        counts: &crate::collect::Counts,
        named: &[(String, u64)],
    ) {
        self.unwind_truncated.add_all(&counts.unwind_truncated);
        self.copy_walks.add_all(&counts.copy_walks);
        let named = |key: &str| {
            named
                .iter()
                .find_map(|(k, v)| (k == key).then_some(*v))
                .unwrap_or(0)
        };
        let copies = crate::unwind::report::CopyFigures {
            sent: named("unwind_stack_copies"),
            refused: named("unwind_stack_copies_refused"),
            walks: self.copy_walks,
        };
        self.unwind_text =
            crate::unwind::report::metrics_text(stats, &self.unwind_truncated, &copies);
    }

    /// The Prometheus text exposition format (version 0.0.4): the table walk's figures, then
    /// one group of families after another, in this order.
    pub(crate) fn render(&self) -> String {
        let mut o = self.unwind_text.clone();
        self.render_cpu(&mut o);
        self.render_dying_cgroups(&mut o);
        self.render_samples(&mut o);
        self.render_windows(&mut o);
        self.render_pipeline(&mut o);
        self.render_lifecycle(&mut o);
        self.render_python(&mut o);
        self.render_sampler(&mut o);
        if let Some(rq) = &self.runq {
            render_runq(&mut o, rq);
        }
        render_own_usage(&mut o);
        o
    }

    /// CPU seconds by comm, cgroup and container, and memory-cgroup seconds by comm.
    fn render_cpu(&self, o: &mut String) {
        counter_family(
            o,
            "profiler_process_cpu_seconds_total",
            "CPU time seen in samples, by process comm (top comms, the rest as other).",
            "comm",
            &self.cpu_by_comm,
        );
        counter_family(
            o,
            "profiler_cgroup_cpu_seconds_total",
            "CPU time seen in samples, by cgroup v2 path (top cgroups, the rest as other).",
            "cgroup",
            &self.cpu_by_cgroup,
        );
        counter_family(
            o,
            "profiler_container_cpu_seconds_total",
            "CPU time seen in samples, by container id (12 hex digits; top containers, the rest as other).",
            "container",
            &self.cpu_by_container,
        );
        counter_family(
            o,
            "profiler_process_memcg_seconds_total",
            "CPU time with a kernel memory-cgroup function on the stack, by comm.",
            "comm",
            &self.memcg_by_comm,
        );
    }

    /// Dying cgroups by controller, as last read (`set_dying`).
    fn render_dying_cgroups(&self, o: &mut String) {
        let _ = writeln!(
            o,
            "# HELP profiler_dying_cgroups Dying cgroups now, by controller (v2: cgroup2 nr_dying_descendants)."
        );
        let _ = writeln!(o, "# TYPE profiler_dying_cgroups gauge");
        for (c, n) in &self.dying {
            let _ = writeln!(
                o,
                "profiler_dying_cgroups{{controller=\"{}\"}} {n}",
                escape(c)
            );
        }
    }

    /// The sampler's accounting: samples recorded or filtered, and those lost or damaged.
    fn render_samples(&self, o: &mut String) {
        let c = self.counters;
        metric(
            o,
            "profiler_samples_total",
            "Samples by outcome.",
            "counter",
            &[
                ("outcome=\"recorded\"", value(c.recorded)),
                ("outcome=\"filtered\"", value(c.filtered)),
            ],
        );
        metric(
            o,
            "profiler_samples_lost_total",
            "Samples lost or damaged, by reason.",
            "counter",
            &[
                ("reason=\"ringbuf_full\"", value(c.lost_ringbuf_full)),
                ("reason=\"kstack_failed\"", value(c.kstack_failed)),
                ("reason=\"ustack_failed\"", value(c.ustack_failed)),
            ],
        );
    }

    /// Where whole windows went: stored or dropped, the store's size, pushed or dropped.
    fn render_windows(&self, o: &mut String) {
        metric(
            o,
            "profiler_windows_total",
            "Windows by outcome (dropped: the store failed for too long).",
            "counter",
            &[
                ("outcome=\"stored\"", value(self.windows_stored)),
                ("outcome=\"dropped\"", value(self.windows_dropped)),
            ],
        );
        if let Some(bytes) = self.store_used_bytes {
            metric(
                o,
                "profiler_store_used_bytes",
                "Bytes of the store's database in use (pages minus free pages) after the last window written.",
                "gauge",
                &[("", bytes as f64)],
            );
        }
        metric(
            o,
            "profiler_push_windows_total",
            "Windows pushed to --push-url, or dropped from the full spool.",
            "counter",
            &[
                ("outcome=\"sent\"", value(self.push_sent)),
                ("outcome=\"dropped\"", value(self.push_dropped)),
            ],
        );
    }

    /// Where the samples cut went through the stages (`Pipeline`), and the work refused.
    fn render_pipeline(&self, o: &mut String) {
        let q = self.pipeline;
        metric(
            o,
            "profiler_pipeline_samples_total",
            "Samples cut into windows, and where they went: stored, or dropped where a queue was \
             full or the store failed too long (cut = stored + in flight + dropped).",
            "counter",
            &[
                ("stage=\"cut\"", value(q.cut)),
                ("stage=\"stored\"", value(q.stored)),
                (
                    "stage=\"dropped_symbolize_queue\"",
                    value(q.dropped_symbolize_queue),
                ),
                (
                    "stage=\"dropped_store_queue\"",
                    value(q.dropped_store_queue),
                ),
                (
                    "stage=\"dropped_store_failing\"",
                    value(q.dropped_store_failing),
                ),
            ],
        );
        metric(
            o,
            "profiler_pipeline_samples_in_flight",
            "Samples cut but not yet stored or dropped (queued, symbolizing, being written).",
            "gauge",
            &[("", value(q.in_flight))],
        );
        metric(
            o,
            "profiler_pipeline_refused_total",
            "Work refused because a queue was full: windows not handed to the pusher, \
             /debug/pprof/profile requests answered 503.",
            "counter",
            &[
                ("what=\"push_window\"", value(q.push_queue_dropped_windows)),
                ("what=\"pprof_request\"", value(q.pprof_refused)),
            ],
        );
    }

    /// Process starts, exits by reason and crash loops (`add_lifecycle`).
    fn render_lifecycle(&self, o: &mut String) {
        metric(
            o,
            "profiler_process_starts_total",
            "Processes started (fork or exec) as the kernel reported them.",
            "counter",
            &[("", value(self.process_starts))],
        );
        let exits: Vec<(String, f64)> = EXIT_REASONS
            .iter()
            .zip(self.process_exits)
            .map(|(r, n)| (format!("reason=\"{r}\""), value(n)))
            .collect();
        let exits: Vec<(&str, f64)> = exits.iter().map(|(l, n)| (l.as_str(), *n)).collect();
        metric(
            o,
            "profiler_process_exits_total",
            "Process exits by how they ended (exit_zero, exit_nonzero, signal, unknown).",
            "counter",
            &exits,
        );
        let loops: Vec<&Program> = self.programs.iter().filter(|p| p.crash_loop).collect();
        metric(
            o,
            "profiler_crash_loops",
            "Programs restarted with failing exits at 5 or more a minute in the last window \
             (same executable in the same cgroup place, or under the same supervisor; see \
             docs/doctor.md).",
            "gauge",
            &[("", value(loops.len() as u64))],
        );
        let rates: Vec<(String, f64)> = loops
            .iter()
            .map(|p| {
                (
                    format!(
                        "comm=\"{}\",exe=\"{}\",cgroup=\"{}\",status=\"{}\"",
                        escape(&p.comm),
                        escape(&p.exe),
                        escape(&p.cgroup),
                        escape(p.failing_status().unwrap_or(""))
                    ),
                    p.starts_per_min,
                )
            })
            .collect();
        let rates: Vec<(&str, f64)> = rates.iter().map(|(l, n)| (l.as_str(), *n)).collect();
        metric(
            o,
            "profiler_crash_loop_starts_per_minute",
            "Starts a minute of each program in a crash loop in the last window, by comm, \
             executable, cgroup place (per-attempt ids as *) and most common failing status.",
            "gauge",
            &rates,
        );
        if let Some((made, removed)) = self.cgroup_churn {
            metric(
                o,
                "profiler_cgroup_changes_total",
                "cgroups created and removed (every hierarchy counts its own).",
                "counter",
                &[
                    ("event=\"created\"", value(made)),
                    ("event=\"removed\"", value(removed)),
                ],
            );
        }
    }

    /// The Python processes named and the exec wake-ups; nothing with Python frames off.
    fn render_python(&self, o: &mut String) {
        if let Some(n) = self.python_processes {
            metric(
                o,
                "profiler_python_processes",
                "Python processes (each exec counted apart) whose frame names the agent holds, \
                 as of the last window: the live ones and those of the window being cut.",
                "gauge",
                &[("", value(n))],
            );
        }
        if let Some(n) = self.python_exec_wakes {
            metric(
                o,
                "profiler_python_exec_wakes_total",
                "Samples of processes that exec'd a program named python* in the last 2 s that \
                 woke the sampler thread before its timed drain (at most 4 a second a process), \
                 so they are named from their first second on.",
                "counter",
                &[("", value(n))],
            );
        }
    }

    /// The sampler program loaded and how many were refused; nothing before sampling starts.
    fn render_sampler(&self, o: &mut String) {
        if let Some((program, refused)) = self.sampler {
            metric(
                o,
                "profiler_sampler_program",
                "The sampler program the kernel accepted (sample_cpu: table walk and Python \
                 frames; sample_tables; sample_fp_py; sample_fp: frame pointers only).",
                "gauge",
                &[(&format!("program=\"{program}\""), 1.0)],
            );
            metric(
                o,
                "profiler_sampler_programs_refused",
                "Sampler programs the kernel refused at start before one loaded (docs/kernels.md).",
                "gauge",
                &[("", value(refused as u64))],
            );
        }
    }
}

/// The agent's own CPU seconds and resident memory, read now (`own_usage`).
fn render_own_usage(o: &mut String) {
    let (cpu, rss) = own_usage();
    metric(
        o,
        "profiler_agent_cpu_seconds_total",
        "CPU time of the agent itself (user + system).",
        "counter",
        &[("", cpu)],
    );
    metric(
        o,
        "profiler_agent_resident_memory_bytes",
        "Resident memory of the agent.",
        "gauge",
        &[("", rss as f64)],
    );
}

/// `profiler_runqueue_latency_seconds`: each CPU's waits as a histogram (cumulative `le`
/// buckets at the log2 bounds, 2 us to 2^32 us), and the switches traced.
fn render_runq(o: &mut String, rq: &crate::profile::runq::RunQueue) {
    let name = "profiler_runqueue_latency_seconds";
    let _ = writeln!(
        o,
        "# HELP {name} Waits of threads for a CPU, from their wake-up or preemption until they ran, by the CPU they ran on."
    );
    let _ = writeln!(o, "# TYPE {name} histogram");
    for c in &rq.cpus {
        let cpu = c.cpu;
        let mut below = 0;
        for (b, n) in c.histogram.iter().enumerate().take(c.histogram.len() - 1) {
            below += n;
            let le = profiler_common::runq::bucket_floor_ns(b + 1) as f64 / 1e9;
            let _ = writeln!(o, "{name}_bucket{{cpu=\"{cpu}\",le=\"{le}\"}} {below}");
        }
        let count: u64 = c.histogram.iter().sum();
        let _ = writeln!(o, "{name}_bucket{{cpu=\"{cpu}\",le=\"+Inf\"}} {count}");
        let _ = writeln!(o, "{name}_sum{{cpu=\"{cpu}\"}} {}", c.delay_ns as f64 / 1e9);
        let _ = writeln!(o, "{name}_count{{cpu=\"{cpu}\"}} {count}");
    }
    metric(
        o,
        "profiler_runqueue_switches_total",
        "Context switches the run-queue tracer saw.",
        "counter",
        &[("", value(rq.switches))],
    );
    metric(
        o,
        "profiler_runqueue_threads_lost_total",
        "Threads whose waits could not be timed (the tracer's thread map was full).",
        "counter",
        &[("", value(rq.threads_lost))],
    );
}

/// A count as a sample value.
fn value(n: u64) -> f64 {
    n as f64
}

/// One metric family with fixed labels: `labels` is the text inside `{}` ("" for none).
fn metric(o: &mut String, name: &str, help: &str, kind: &str, series: &[(&str, f64)]) {
    let _ = writeln!(o, "# HELP {name} {help}");
    let _ = writeln!(o, "# TYPE {name} {kind}");
    for (labels, value) in series {
        if labels.is_empty() {
            let _ = writeln!(o, "{name} {value}");
        } else {
            let _ = writeln!(o, "{name}{{{labels}}} {value}");
        }
    }
}

fn counter_family(o: &mut String, name: &str, help: &str, label: &str, c: &BoundedCounter) {
    let _ = writeln!(o, "# HELP {name} {help}");
    let _ = writeln!(o, "# TYPE {name} counter");
    for (value, secs) in &c.0 {
        let _ = writeln!(o, "{name}{{{label}=\"{}\"}} {secs}", escape(value));
    }
}

/// Label value escaping of the text format: backslash, quote, newline.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The agent's own CPU seconds (user + system) and resident bytes, from /proc/self.
pub(crate) fn own_usage() -> (f64, u64) {
    // SAFETY: sysconf has no memory-safety preconditions.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the comm's closing paren; utime and stime are the 14th and 15th overall.
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let cpu = (num(11) + num(12)) / ticks.max(1) as f64;
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (cpu, pages * page.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cardinality_is_bounded() {
        let mut c = BoundedCounter::default();
        for i in 0..(MAX_SERIES + 10) {
            c.add(&format!("p{i}"), 1.0);
        }
        c.add("p0", 1.0);
        assert_eq!(c.0.len(), MAX_SERIES + 1);
        assert_eq!(c.0[OTHER], 10.0);
        assert_eq!(c.0["p0"], 2.0);
    }

    #[test]
    fn lifecycle_metrics_count_starts_exits_and_loops() {
        use crate::profile::{Interner, Lifetime, Meta};
        let mut i = Interner::new(Meta {
            duration_ns: 60_000_000_000,
            ..Meta::default()
        });
        // Six failing restarts by one parent (a loop), one clean run, one killed.
        for k in 0..6u32 {
            i.lifetime(Lifetime {
                pid: 100 + k,
                ppid: 9,
                comm: "crashy".into(),
                fork_ns: Some(u64::from(k + 1) * 1_000_000_000),
                exit_ns: Some(u64::from(k + 1) * 1_000_000_000 + 5_000_000),
                exit_status: Some(2 << 8),
                ..Lifetime::default()
            });
        }
        for (pid, status) in [(200, 0), (201, 9)] {
            i.lifetime(Lifetime {
                pid,
                ppid: 1,
                comm: "job".into(),
                fork_ns: Some(1_000),
                exit_ns: Some(2_000),
                exit_status: Some(status),
                ..Lifetime::default()
            });
        }
        let mut m = Metrics::default();
        let p = i.finish();
        m.add_lifecycle(&p.lifetimes, None, 60.0);
        let text = m.render();
        for line in [
            "profiler_process_starts_total 8",
            "profiler_process_exits_total{reason=\"exit_zero\"} 1",
            "profiler_process_exits_total{reason=\"exit_nonzero\"} 6",
            "profiler_process_exits_total{reason=\"signal\"} 1",
            "profiler_process_exits_total{reason=\"unknown\"} 0",
            "profiler_crash_loops 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing:\n{text}");
        }
    }

    /// With the cgroups each process went into, a runtime's attempts (one `runc` each, which
    /// exits with the program's status) are grouped as the doctor groups them: one loop in
    /// `/docker/*`; the runcs, moved nowhere, are not one.
    #[test]
    fn crash_loops_are_grouped_by_cgroup_place_when_attaches_are_traced() {
        let mut lives = Vec::new();
        let mut attaches = Vec::new();
        for k in 0..6u32 {
            let t = u64::from(k + 1) * 1_000_000_000;
            for (pid, ppid, comm) in [(300 + k, 9, "runc"), (100 + k, 300 + k, "zagent")] {
                lives.push(Lifetime {
                    pid,
                    ppid,
                    comm: comm.into(),
                    fork_ns: Some(t),
                    exit_ns: Some(t + 5_000_000),
                    exit_status: Some(2 << 8),
                    ..Lifetime::default()
                });
            }
            attaches.push((100 + k, format!("/docker/{:064x}", k + 1)));
        }
        let mut m = Metrics::default();
        m.add_lifecycle(&lives, Some(&attaches), 60.0);
        assert!(m.programs_by_cgroup);
        assert!(m.programs[0].crash_loop && m.programs[0].comm == "zagent");
        let text = m.render();
        for line in [
            "profiler_crash_loops 1",
            "profiler_crash_loop_starts_per_minute{comm=\"zagent\",exe=\"\",cgroup=\"/docker/*\",status=\"code 2\"} 6",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing:\n{text}");
        }
        // Without them, by supervisor: the runcs exit 2 too, and are a loop of their own.
        m.add_lifecycle(&lives, None, 60.0);
        assert!(!m.programs_by_cgroup);
        assert_eq!(m.programs.iter().filter(|p| p.crash_loop).count(), 2);
    }

    #[test]
    fn own_usage_reads_proc() {
        let (_, rss) = own_usage();
        assert!(rss > 0);
    }
}
