//! The run-queue tracer, user side of profiler-ebpf `runq`: loads its program onto the
//! sched_switch raw tracepoint and reads what it kept into a `RunQueue` (threads, histograms
//! per CPU and per cgroup, counters).
use aya::{
    Ebpf,
    maps::{HashMap, MapData, PerCpuArray, PerCpuHashMap},
    programs::RawTracePoint,
};
use profiler_common::runq::{
    BUCKETS, CgroupBucket, CpuRow, GLOBAL_TRACE_START, MAP_CGROUP_HIST, MAP_COUNTERS, MAP_CPU_HIST,
    MAP_THREADS, PROGRAM_SWITCH, Thread, counter,
};

use super::BpfError;
use crate::profile::runq::{CpuWaits, Histogram, RunQueue, ThreadWaits};

/// The tracer, attached while it lives.
pub(crate) struct RunqTracer {
    // Kept for the links: dropping it detaches.
    _ebpf: Ebpf,
    /// An LRU hash map: aya reads it as a `HashMap`.
    threads: HashMap<MapData, u32, Thread>,
    cpu_hist: PerCpuArray<MapData, CpuRow>,
    cgroup_hist: PerCpuHashMap<MapData, CgroupBucket, u64>,
    counters: PerCpuArray<MapData, u64>,
}

impl RunqTracer {
    /// Loads and attaches the program. Needs CAP_BPF + CAP_PERFMON (or root), and the kernel's
    /// BTF for `task_struct`'s `sched_info` (CONFIG_SCHED_INFO, which /proc/PID/schedstat
    /// shows) and `se`.
    pub(crate) fn start() -> Result<Self, BpfError> {
        if super::task::TaskOffsets::get().runq.is_none() {
            return Err(BpfError::Missing(
                "task_struct.sched_info in the kernel's BTF (CONFIG_SCHED_INFO)",
            ));
        }
        let keep = [MAP_THREADS, MAP_CPU_HIST, MAP_CGROUP_HIST];
        let start = [(GLOBAL_TRACE_START, crate::util::monotonic_ns())];
        let mut ebpf = super::load_tracer(&keep, &start)?;
        let mut threads: HashMap<_, u32, Thread> = HashMap::try_from(
            ebpf.map_mut(MAP_THREADS)
                .ok_or(BpfError::Missing(MAP_THREADS))?,
        )?;
        for (tid, thread) in baselines(start[0].1) {
            let _ = threads.insert(tid, thread, 0);
        }
        let program: &mut RawTracePoint = ebpf
            .program_mut(PROGRAM_SWITCH)
            .ok_or(BpfError::Missing("run-queue program"))?
            .try_into()?;
        program
            .load()
            .map_err(|e| super::rejected(PROGRAM_SWITCH, e))?;
        program.attach("sched_switch")?;
        let mut take = |name: &'static str| ebpf.take_map(name).ok_or(BpfError::Missing(name));
        Ok(Self {
            threads: HashMap::try_from(take(MAP_THREADS)?)?,
            cpu_hist: PerCpuArray::try_from(take(MAP_CPU_HIST)?)?,
            cgroup_hist: PerCpuHashMap::try_from(take(MAP_CGROUP_HIST)?)?,
            counters: PerCpuArray::try_from(take(MAP_COUNTERS)?)?,
            _ebpf: ebpf,
        })
    }

    /// What the programs kept since they were attached, times as offsets from
    /// `start_mono_ns` (the recording's start).
    pub(crate) fn read(&self, cpus: &[u32], start_mono_ns: u64) -> RunQueue {
        RunQueue {
            cgroups: self.cgroup_histograms(),
            threads: self.threads(start_mono_ns),
            ..self.totals(cpus)
        }
    }

    /// The per-CPU histograms and the counters only: a few lookups, whatever the number of
    /// threads (the agent's metrics read them every window).
    pub(crate) fn totals(&self, cpus: &[u32]) -> RunQueue {
        let counter = |i: u32| {
            self.counters
                .get(&i, 0)
                .map_or(0, |per_cpu| per_cpu.iter().sum::<u64>())
        };
        RunQueue {
            cpus: self.cpu_histograms(cpus),
            switches: counter(counter::SWITCHES),
            threads_lost: counter(counter::THREADS_FULL),
            cgroup_waits_lost: counter(counter::CGROUP_HIST_FULL),
            ..RunQueue::default()
        }
    }

    fn cpu_histograms(&self, cpus: &[u32]) -> Vec<CpuWaits> {
        let Ok(rows) = self.cpu_hist.get(&0, 0) else {
            return Vec::new();
        };
        cpus.iter()
            .filter_map(|&cpu| {
                let row = rows.get(cpu as usize)?;
                let histogram: Histogram = row[..BUCKETS].to_vec();
                histogram.iter().any(|&n| n > 0).then(|| CpuWaits {
                    cpu,
                    histogram,
                    delay_ns: row[BUCKETS],
                })
            })
            .collect()
    }

    fn cgroup_histograms(&self) -> Vec<(u64, Histogram)> {
        let mut by_cgroup = std::collections::BTreeMap::<u64, Histogram>::new();
        for (key, per_cpu) in self.cgroup_hist.iter().flatten() {
            let h = by_cgroup
                .entry(key.cgroup_id)
                .or_insert_with(|| vec![0; BUCKETS]);
            if let Some(slot) = h.get_mut(key.bucket as usize) {
                *slot += per_cpu.iter().sum::<u64>();
            }
        }
        by_cgroup.into_iter().collect()
    }

    /// Threads that ran or waited, most waited first.
    fn threads(&self, start_mono_ns: u64) -> Vec<ThreadWaits> {
        let mut v: Vec<ThreadWaits> = self
            .threads
            .iter()
            .flatten()
            .filter(|(_, t)| t.waits > 0 || t.runtime_ns > 0)
            .map(|(tid, t)| ThreadWaits {
                tid,
                pid: t.pid,
                comm: crate::util::comm_str(&t.comm),
                cgroup_id: t.cgroup_id,
                runtime_ns: t.runtime_ns,
                waits: t.waits.into(),
                preempted: t.preempted.into(),
                delay_ns: t.delay_ns,
                max_delay_ns: t.max_delay_ns,
                max_end_ns: t.max_end_ns.saturating_sub(start_mono_ns),
                max_cpu: t.max_cpu,
            })
            .collect();
        v.sort_by_key(|t| (std::cmp::Reverse(t.delay_ns), t.tid));
        v
    }
}

/// Every thread's entry as the program starts it, from what the kernel counted so far
/// (/proc/PID/task/TID/schedstat: time on a CPU, time waited, times it got a CPU): the wait
/// a thread is in when the tracer attaches, or that ends before its first switch-out, is then
/// counted whole. Threads that start after `trace_start` need none.
fn baselines(trace_start: u64) -> Vec<(u32, Thread)> {
    let mut v = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return v;
    };
    for p in procs.flatten() {
        let Ok(tasks) = std::fs::read_dir(p.path().join("task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else {
                continue;
            };
            let mut n = text.split_whitespace().map(|f| f.parse::<u64>().ok());
            if let (Some(Some(runtime)), Some(Some(run_delay)), Some(Some(pcount))) =
                (n.next(), n.next(), n.next())
            {
                let thread = Thread {
                    seen_pcount: pcount,
                    seen_run_delay: run_delay,
                    seen_runtime: runtime,
                    seen_ns: trace_start,
                    ..Thread::default()
                };
                v.push((tid, thread));
            }
        }
    }
    v
}
