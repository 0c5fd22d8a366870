//! The catalogue of kernel memory-cgroup functions and, per process, how much of its CPU a
//! profile shows in them. Names differ between kernels (mem_cgroup_nr_lru_pages is gone on
//! 6.x; memcg1_stat_format is new), so the catalogue is checked against /proc/kallsyms and
//! the doctor reports which entries this kernel has.
use std::collections::{BTreeMap, HashMap, HashSet};

use crate::profile::{FrameKind, Profile};

/// Kernel functions whose presence on a stack means time spent on memory-cgroup work:
/// statistics reads (what kubelet/cAdvisor polls; v1's and cgroup2's memory.stat readers
/// differ), the memcg hierarchy walk, rstat flushing,
/// and reclaim (which walks dying memcgs too).
pub(crate) const CATALOGUE: &[&str] = &[
    "mem_cgroup_nr_lru_pages",
    "mem_cgroup_node_nr_lru_pages",
    "memcg_numa_stat_show",
    "memory_stat_show",
    "memory_numa_stat_show",
    "memcg1_stat_format",
    "memcg_stat_show",
    "memory_stat_format",
    // cgroup2's memory.stat reader flushes the rstat tree before printing (on 6.18:
    // memory_stat_show -> mem_cgroup_flush_stats -> __mem_cgroup_flush_stats ->
    // css_rstat_flush; memcg_page_state_output per counter); 6.1 flushes through
    // cgroup_rstat_flush_irqsafe, 6.8+ through do_flush_stats.
    "memcg_page_state_output",
    "mem_cgroup_iter",
    "mem_cgroup_flush_stats",
    "mem_cgroup_flush_stats_ratelimited",
    "__mem_cgroup_flush_stats",
    "do_flush_stats",
    "cgroup_rstat_flush_irqsafe",
    "mem_cgroup_css_rstat_flush",
    "css_rstat_flush",
    "cgroup_rstat_flush",
    "mem_cgroup_force_empty",
    "shrink_node",
    "shrink_node_memcgs",
    "try_to_free_mem_cgroup_pages",
];

/// Catalogue entries defined in kallsyms `text` (function symbols: t/T).
pub(crate) fn present_in_kallsyms(text: &str) -> Vec<&'static str> {
    let wanted: HashSet<&str> = CATALOGUE.iter().copied().collect();
    let mut found: HashSet<&str> = HashSet::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(_), Some(kind), Some(name)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if matches!(kind, "t" | "T") && wanted.contains(name) {
            found.insert(name);
        }
    }
    CATALOGUE
        .iter()
        .copied()
        .filter(|n| found.contains(n))
        .collect()
}

/// One process's CPU in memcg code.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MemcgShare {
    pub pid: u32,
    pub comm: String,
    /// All samples of the process.
    pub samples: u64,
    /// Samples with a catalogue function anywhere on the stack.
    pub memcg_samples: u64,
    /// Catalogue functions by samples that contain them, most first.
    pub functions: Vec<(String, u64)>,
}

impl MemcgShare {
    /// Share of the process's CPU in memcg code, percent.
    pub(crate) fn percent(&self) -> f64 {
        pct(self.memcg_samples, self.samples)
    }

    /// The catalogue function seen on most of its memcg samples.
    pub(crate) fn top_function(&self) -> &str {
        self.functions.first().map_or("", |(n, _)| n)
    }
}

pub(crate) fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Per process (not the idle task) with at least one memcg sample, most memcg samples first.
pub(crate) fn shares(profile: &Profile, catalogue: &[&str]) -> Vec<MemcgShare> {
    let wanted: HashSet<&str> = catalogue.iter().copied().collect();
    // Which catalogue functions each stack holds, computed once per stack.
    let mut stack_hits: HashMap<u32, Vec<String>> = HashMap::new();
    let mut per: BTreeMap<u32, (String, u64, u64, BTreeMap<String, u64>)> = BTreeMap::new();
    for s in profile
        .samples
        .iter()
        .filter(|s| !crate::profile::is_idle(s))
    {
        let hits = stack_hits.entry(s.stack).or_insert_with(|| {
            let mut names: Vec<String> = profile
                .stack_frames(s.stack)
                .filter(|f| f.kind == FrameKind::Kernel)
                .map(|f| profile.str(f.name))
                .filter(|n| wanted.contains(n))
                .map(str::to_owned)
                .collect();
            names.dedup();
            names
        });
        let e = per
            .entry(s.pid)
            .or_insert_with(|| (String::new(), 0, 0, BTreeMap::new()));
        // The comm at the tick, not when the process was first noted: a process that renames
        // itself (prctl PR_SET_NAME, as the lab's poller does) is known by its new name.
        if s.tid == s.pid || e.0.is_empty() {
            profile.str(s.comm).clone_into(&mut e.0);
        }
        e.1 += 1;
        if !hits.is_empty() {
            e.2 += 1;
            let mut seen = HashSet::new();
            for h in hits.iter().filter(|h| seen.insert(h.as_str())) {
                *e.3.entry(h.clone()).or_default() += 1;
            }
        }
    }
    let mut out: Vec<MemcgShare> = per
        .into_iter()
        .filter(|(_, e)| e.2 > 0)
        .map(|(pid, (comm, samples, memcg_samples, fns))| {
            let mut functions: Vec<(String, u64)> = fns.into_iter().collect();
            functions.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            MemcgShare {
                pid,
                comm,
                samples,
                memcg_samples,
                functions,
            }
        })
        .collect();
    out.sort_by_key(|s| std::cmp::Reverse(s.memcg_samples));
    out
}

/// Per-CPU busy share from the samples: non-idle samples over the ticks expected in the
/// recording (frequency x duration), percent.
pub(crate) fn cpu_busy(profile: &Profile) -> Vec<(u32, f64)> {
    let expected = f64::from(profile.meta.frequency_hz) * profile.meta.duration_ns as f64 / 1e9;
    profile
        .meta
        .cpus
        .iter()
        .map(|&cpu| {
            let busy = profile
                .samples
                .iter()
                .filter(|s| s.cpu == cpu && !crate::profile::is_idle(s))
                .count();
            let p = if expected > 0.0 {
                (busy as f64 * 100.0 / expected).min(100.0)
            } else {
                0.0
            };
            (cpu, p)
        })
        .collect()
}

/// One process's share of one CPU.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CpuShare {
    pub comm: String,
    pub pid: u32,
    /// Of the CPU's ticks over the profile.
    pub percent: f64,
}

/// Per CPU, the processes that kept it busiest over the profile, at most `n` each, busiest
/// first; idle is no process.
pub(crate) fn cpu_top(profile: &Profile, n: usize) -> Vec<(u32, Vec<CpuShare>)> {
    let expected = f64::from(profile.meta.frequency_hz) * profile.meta.duration_ns as f64 / 1e9;
    // cpu -> pid -> (samples, the comm at its last tick).
    let mut by_cpu: BTreeMap<u32, HashMap<u32, (u64, &str)>> = profile
        .meta
        .cpus
        .iter()
        .map(|&cpu| (cpu, HashMap::new()))
        .collect();
    for s in profile
        .samples
        .iter()
        .filter(|s| !crate::profile::is_idle(s))
    {
        let e = by_cpu.entry(s.cpu).or_default().entry(s.pid).or_default();
        *e = (e.0 + 1, profile.str(s.comm));
    }
    by_cpu
        .into_iter()
        .map(|(cpu, pids)| {
            let mut top: Vec<(u32, (u64, &str))> = pids.into_iter().collect();
            top.sort_by_key(|&(pid, (k, _))| (std::cmp::Reverse(k), pid));
            top.truncate(n);
            let top = top
                .into_iter()
                .map(|(pid, (k, comm))| {
                    let percent = if expected > 0.0 {
                        (k as f64 * 100.0 / expected).min(100.0)
                    } else {
                        0.0
                    };
                    CpuShare {
                        comm: comm.to_owned(),
                        pid,
                        percent,
                    }
                })
                .collect();
            (cpu, top)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Frame, Interner, Meta, Sample};

    #[test]
    fn kallsyms_filter_keeps_functions_only() {
        let text = "ffffffff81300000 T memory_stat_show\n\
                    ffffffff81300100 t memcg_numa_stat_show\n\
                    ffffffff81300200 d mem_cgroup_iter\n\
                    ffffffff81300300 T something_else\n\
                    ffffffff81300400 t __mem_cgroup_flush_stats\n";
        assert_eq!(
            present_in_kallsyms(text),
            [
                "memcg_numa_stat_show",
                "memory_stat_show",
                "__mem_cgroup_flush_stats"
            ]
        );
    }

    #[test]
    fn shares_count_any_frame_on_the_stack() {
        let mut i = Interner::new(Meta::default());
        let comm = i.string("kubelet");
        let vmlinux = i.string("vmlinux");
        let frame = |i: &mut Interner, n: &str, kind| {
            let name = i.string(n);
            i.frame(Frame {
                name,
                module: vmlinux,
                kind,
                ..Frame::default()
            })
        };
        let main = frame(&mut i, "main", FrameKind::User);
        let read = frame(&mut i, "vfs_read", FrameKind::Kernel);
        let stat = frame(&mut i, "memory_stat_show", FrameKind::Kernel);
        let fmt = frame(&mut i, "memcg1_stat_format", FrameKind::Kernel);
        let hot = i.stack(vec![main, read, stat, fmt]);
        let cold = i.stack(vec![main]);
        for (n, stack) in [(3, hot), (1, cold)] {
            for _ in 0..n {
                i.sample(Sample {
                    offset_ns: 0,
                    cpu: 0,
                    pid: 42,
                    tid: 42,
                    cgroup_id: 0,
                    comm,
                    stack,
                });
            }
        }
        let s = shares(&i.finish(), &["memory_stat_show", "memcg1_stat_format"]);
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].samples, s[0].memcg_samples), (4, 3));
        assert_eq!(s[0].percent(), 75.0);
        assert_eq!(s[0].comm, "kubelet");
        assert_eq!(s[0].functions.len(), 2);
    }
}
