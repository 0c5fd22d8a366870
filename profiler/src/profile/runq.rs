//! Run-queue waits of a recording: who waited for a CPU, how long, on which CPU, and who ran
//! there instead (the on-CPU samples of that CPU during the wait). The kernel side is
//! profiler-ebpf `runq`; `bpf::runq` reads it into a `RunQueue` at the window's end.
use std::collections::HashMap;

use super::{Profile, Sample, is_timed_busy};

/// Counts per log2 bucket of wait (`profiler_common::runq::BUCKETS`): bucket 0 holds waits
/// under 2 us, bucket b waits in [2^b, 2^(b+1)) us.
pub type Histogram = Vec<u64>;

/// The run-queue waits of a recording, as traced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunQueue {
    /// Per CPU the thread then ran on, CPUs with waits only.
    pub cpus: Vec<CpuWaits>,
    /// Per cgroup2 id of the waiting thread (0: not known, it had not run yet).
    pub cgroups: Vec<(u64, Histogram)>,
    /// Threads that ran or waited, most waited first.
    pub threads: Vec<ThreadWaits>,
    /// Context switches traced.
    pub switches: u64,
    /// Threads whose waits could not be timed (the kernel's thread map was full), and waits
    /// left out of the cgroup histograms (its map full): nothing is lost silently.
    pub threads_lost: u64,
    pub cgroup_waits_lost: u64,
}

/// The waits of threads that then ran on one CPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuWaits {
    pub cpu: u32,
    pub histogram: Histogram,
    /// Their sum, ns.
    pub delay_ns: u64,
}

/// One thread's waits and time on CPU during the recording.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThreadWaits {
    pub tid: u32,
    /// Process id (tgid); 0 when not known (the thread never left a CPU while traced).
    pub pid: u32,
    pub comm: String,
    pub cgroup_id: u64,
    pub runtime_ns: u64,
    /// Waits: the times it got a CPU.
    pub waits: u64,
    /// Waits that began with a preemption (the rest with a wake-up or a yield).
    pub preempted: u64,
    pub delay_ns: u64,
    /// The longest wait: how long, its end (offset from the recording's start) and CPU.
    pub max_delay_ns: u64,
    pub max_end_ns: u64,
    pub max_cpu: u32,
}

impl ThreadWaits {
    pub fn avg_delay_ns(&self) -> u64 {
        self.delay_ns.checked_div(self.waits).unwrap_or(0)
    }

    /// Offset of the longest wait's start, ns.
    pub fn max_start_ns(&self) -> u64 {
        self.max_end_ns.saturating_sub(self.max_delay_ns)
    }
}

impl RunQueue {
    /// All waits, summed over CPUs.
    pub fn total(&self) -> Histogram {
        let mut sum = vec![0; profiler_common::runq::BUCKETS];
        for c in &self.cpus {
            for (s, n) in sum.iter_mut().zip(&c.histogram) {
                *s += n;
            }
        }
        sum
    }
}

/// A process that ran on a CPU while a thread waited there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RanInstead {
    pub pid: u32,
    pub comm: String,
    /// Its samples on that CPU during the wait, and all busy samples there then.
    pub samples: u64,
    pub of: u64,
    /// Its most sampled function there (the stack's leaf).
    pub function: String,
}

impl RanInstead {
    pub fn percent(&self) -> f64 {
        100.0 * self.samples as f64 / self.of.max(1) as f64
    }
}

/// Who ran on `cpu` between `from_ns` and `to_ns` (offsets), most samples first: the
/// processes the waiting thread waited behind. Idle samples are left out (a wait on an idle
/// CPU is the scheduler's latency, not someone else's work).
pub fn ran_instead(p: &Profile, cpu: u32, from_ns: u64, to_ns: u64) -> Vec<RanInstead> {
    let during = |s: &&Sample| {
        is_timed_busy(s) && s.cpu == cpu && s.offset_ns >= from_ns && s.offset_ns <= to_ns
    };
    let mut by_pid: HashMap<u32, (u64, u32, HashMap<u32, u64>)> = HashMap::new();
    let mut of = 0;
    for s in p.samples.iter().filter(during) {
        of += 1;
        let e = by_pid.entry(s.pid).or_insert((0, s.comm, HashMap::new()));
        e.0 += 1;
        if let Some(&leaf) = p.stacks[s.stack as usize].frames.last() {
            *e.2.entry(leaf).or_default() += 1;
        }
    }
    let mut v: Vec<RanInstead> = by_pid
        .into_iter()
        .map(|(pid, (samples, comm, leaves))| RanInstead {
            pid,
            comm: p
                .processes
                .iter()
                .find(|pr| pr.pid == pid)
                .map_or_else(|| p.str(comm).to_owned(), |pr| pr.comm.clone()),
            samples,
            of,
            function: leaves
                .into_iter()
                .max_by_key(|&(f, n)| (n, std::cmp::Reverse(f)))
                .map(|(f, _)| p.frame_name(&p.frames[f as usize]).to_owned())
                .unwrap_or_default(),
        })
        .collect();
    v.sort_by_key(|r| (std::cmp::Reverse(r.samples), r.pid));
    v
}

/// A thread's longest wait with who ran instead, for the report and the doctor.
pub struct LongWait<'a> {
    pub thread: &'a ThreadWaits,
    pub instead: Vec<RanInstead>,
}

/// Threads whose longest wait reached `min_ns`, longest first, at most `n`.
pub fn longest_waits(p: &Profile, min_ns: u64, n: usize) -> Vec<LongWait<'_>> {
    let Some(rq) = &p.runq else {
        return Vec::new();
    };
    let mut threads: Vec<&ThreadWaits> = rq
        .threads
        .iter()
        .filter(|t| t.max_delay_ns >= min_ns && t.waits > 0)
        .collect();
    threads.sort_by_key(|t| (std::cmp::Reverse(t.max_delay_ns), t.tid));
    threads.truncate(n);
    threads
        .into_iter()
        .map(|t| LongWait {
            thread: t,
            instead: ran_instead(p, t.max_cpu, t.max_start_ns(), t.max_end_ns),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Frame, FrameKind, Interner, Meta, Process};

    fn sample(i: &mut Interner, cpu: u32, pid: u32, comm: &str, at_ms: u64, leaf: &str) {
        let name = i.string(leaf);
        let frame = i.frame(Frame {
            name,
            kind: FrameKind::Kernel,
            ..Frame::default()
        });
        let stack = i.stack(vec![frame]);
        let comm = i.string(comm);
        i.sample(Sample {
            offset_ns: at_ms * 1_000_000,
            cpu,
            pid,
            tid: pid,
            cgroup_id: 0,
            comm,
            stack,
        });
    }

    #[test]
    fn names_who_held_the_cpu_during_the_wait() {
        let mut i = Interner::new(Meta::default());
        for ms in 0..100 {
            // kubelet holds CPU 1 for 90 ms of the 100, a shell the rest; idle on CPU 0.
            let (pid, comm, leaf) = if ms < 90 {
                (7, "kubelet", "mem_cgroup_nr_lru_pages")
            } else {
                (8, "sh", "clear_page")
            };
            sample(&mut i, 1, pid, comm, ms, leaf);
            sample(&mut i, 0, 0, "swapper/0", ms, "default_idle");
        }
        i.process(Process {
            pid: 7,
            comm: "kubelet".into(),
            ..Process::default()
        });
        let mut p = i.finish();
        p.runq = Some(RunQueue {
            threads: vec![ThreadWaits {
                tid: 20,
                comm: "ksoftirqd/1".into(),
                waits: 3,
                max_delay_ns: 99_000_000,
                max_end_ns: 99_000_000,
                max_cpu: 1,
                ..ThreadWaits::default()
            }],
            ..RunQueue::default()
        });
        let waits = longest_waits(&p, 50_000_000, 5);
        assert_eq!(waits.len(), 1);
        let top = &waits[0].instead[0];
        assert_eq!((top.pid, top.comm.as_str()), (7, "kubelet"));
        assert_eq!((top.samples, top.of), (90, 100));
        assert_eq!(top.function, "mem_cgroup_nr_lru_pages");
        assert!(longest_waits(&p, 100_000_000, 5).is_empty());
        // Only the CPU it waited on counts, and never the idle task.
        assert!(ran_instead(&p, 0, 0, 99_000_000).is_empty());
    }
}
