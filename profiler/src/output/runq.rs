//! `report --runq`: who waited for a CPU, as `perf sched latency` prints it (task, runtime,
//! waits (its switches in), average and longest wait, when) plus who ran on that CPU instead, then the
//! waits' log2 histogram (as bcc's runqlat) and each CPU's and cgroup's share.
use std::fmt::Write as _;

use crate::profile::{
    Profile,
    runq::{Histogram, RunQueue, longest_waits},
};
use profiler_common::runq::bucket_floor_ns;

/// The run-queue table of `profile`, `n` threads at most; None when it has no waits traced.
pub(crate) fn runq_table(profile: &Profile, threads: usize) -> Option<String> {
    let rq = profile.runq.as_ref()?;
    let m = &profile.meta;
    let total = rq.total();
    let waits: u64 = total.iter().sum();
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{waits} run-queue waits over {:.1} s on {} CPUs ({} context switches); threads by longest wait",
        m.duration_ns as f64 / 1e9,
        m.cpus.len(),
        rq.switches
    );
    if rq.threads_lost > 0 || rq.cgroup_waits_lost > 0 {
        let _ = writeln!(
            o,
            "warning: {} threads not timed (thread map full), {} waits not in the cgroup histograms",
            rq.threads_lost, rq.cgroup_waits_lost
        );
    }
    let _ = writeln!(
        o,
        "\n{:<16} {:>7} {:>7} {:>11} {:>7} {:>9} {:>9} {:>9} {:>4}  ran instead (share of that CPU)",
        "task", "pid", "tid", "runtime ms", "waits", "avg ms", "max ms", "max at s", "cpu"
    );
    for w in longest_waits(profile, 0, threads) {
        let t = w.thread;
        let instead = match w.instead.first() {
            Some(r) => format!("{} ({}) {:.0}% {}", r.comm, r.pid, r.percent(), r.function),
            None => "-".to_owned(),
        };
        let _ = writeln!(
            o,
            "{:<16} {:>7} {:>7} {:>11.3} {:>7} {:>9.3} {:>9.3} {:>9.3} {:>4}  {instead}",
            t.comm,
            t.pid,
            t.tid,
            t.runtime_ns as f64 / 1e6,
            t.waits,
            t.avg_delay_ns() as f64 / 1e6,
            t.max_delay_ns as f64 / 1e6,
            t.max_start_ns() as f64 / 1e9,
            t.max_cpu
        );
    }
    let _ = writeln!(o, "\nwaits (all CPUs)");
    o.push_str(&histogram(&total));
    o.push_str(&by_key(
        "cpu",
        rq.cpus.iter().map(|c| (c.cpu.to_string(), &c.histogram)),
    ));
    o.push_str(&by_key(
        "cgroup",
        rq.cgroups
            .iter()
            .map(|(id, h)| (cgroup_name(profile, *id), h)),
    ));
    Some(o)
}

/// runqlat's form: one line a bucket from the first to the last with waits.
fn histogram(h: &Histogram) -> String {
    let mut o = String::new();
    let (Some(first), Some(last)) = (
        h.iter().position(|&n| n > 0),
        h.iter().rposition(|&n| n > 0),
    ) else {
        return "  (none)\n".to_owned();
    };
    let most = h.iter().copied().max().unwrap_or(1).max(1);
    let _ = writeln!(o, "{:>24} : {:<9} distribution", "usecs", "count");
    for (b, &count) in h.iter().enumerate().take(last + 1).skip(first) {
        let (lo, hi) = (bucket_floor_ns(b) / 1000, bucket_floor_ns(b + 1) / 1000 - 1);
        let bar = "*".repeat((count * 40 / most) as usize);
        let _ = writeln!(o, "{lo:>10} -> {hi:<10} : {count:<9} |{bar:<40}|");
    }
    o
}

/// Waits, the share over 1 ms and the 99th percentile, per CPU or cgroup, most waits first.
fn by_key<'a>(what: &str, rows: impl Iterator<Item = (String, &'a Histogram)>) -> String {
    let mut rows: Vec<(String, &Histogram)> = rows.collect();
    rows.sort_by_key(|(k, h)| (std::cmp::Reverse(h.iter().sum::<u64>()), k.clone()));
    let mut o = String::new();
    let _ = writeln!(
        o,
        "\n{:>9} {:>8} {:>10}  {what}",
        "waits", ">=1ms %", "p99 < ms"
    );
    for (key, h) in rows {
        let waits: u64 = h.iter().sum();
        // Bucket 10 starts at 1.024 ms.
        let long: u64 = h.iter().skip(10).sum();
        let _ = writeln!(
            o,
            "{waits:>9} {:>8.2} {:>10.3}  {key}",
            100.0 * long as f64 / waits.max(1) as f64,
            percentile_ceiling_ns(h, 0.99) as f64 / 1e6
        );
    }
    o
}

/// The end of the bucket that holds the `q` quantile of waits, ns.
fn percentile_ceiling_ns(h: &Histogram, q: f64) -> u64 {
    let waits: u64 = h.iter().sum();
    let target = (waits as f64 * q).ceil() as u64;
    let mut seen = 0;
    for (b, &n) in h.iter().enumerate() {
        seen += n;
        if seen >= target.max(1) {
            return bucket_floor_ns(b + 1);
        }
    }
    0
}

fn cgroup_name(p: &Profile, id: u64) -> String {
    match p.cgroups.iter().find(|c| c.id == id) {
        Some(c) => c.path.clone(),
        None if id == 0 => "(not known: the thread had not run yet)".to_owned(),
        None => format!("(cgroup id {id})"),
    }
}

/// The run-queue totals as `report --stats` lines.
pub(crate) fn runq_stats(rq: &RunQueue) -> Vec<(&'static str, u64)> {
    let total: u64 = rq.total().iter().sum();
    let max = rq.threads.iter().map(|t| t.max_delay_ns).max().unwrap_or(0);
    vec![
        ("runq_switches", rq.switches),
        ("runq_waits", total),
        ("runq_max_delay_ns", max),
        ("runq_threads", rq.threads.len() as u64),
        ("runq_threads_lost", rq.threads_lost),
        ("runq_cgroup_waits_lost", rq.cgroup_waits_lost),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_histogram_lines() {
        let mut h = vec![0; profiler_common::runq::BUCKETS];
        h[1] = 98; // 2-3 us
        h[19] = 2; // 0.5-1 s
        assert_eq!(percentile_ceiling_ns(&h, 0.5), 4_000);
        assert_eq!(percentile_ceiling_ns(&h, 0.99), 1_048_576_000);
        let text = histogram(&h);
        assert!(text.contains("2 -> 3"), "{text}");
        assert!(text.contains("524288 -> 1048575"), "{text}");
        assert_eq!(text.lines().count(), 1 + 19, "{text}");
    }
}
