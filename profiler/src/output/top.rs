//! `report` with no output file: the hottest functions, by self (leaf) and total (anywhere on
//! the stack) share, and the busiest processes, as `pprof -top` and `perf report --stdio`
//! show them, for a terminal or a pipe. Idle (pid 0, the CPUs' idle tasks) is left out of the
//! shares and said apart: the shares are of the busy samples.
use std::fmt::Write as _;

use super::diff::{Folded, shares};
use crate::profile::{GroupBy, Profile, is_idle};

/// The table of `profile`'s `n` hottest functions and processes.
pub(crate) fn top_table(profile: &Profile, n: usize) -> String {
    let busy = profile.samples.iter().filter(|s| !is_idle(s)).count();
    let idle = profile.samples.len() - busy;
    let m = &profile.meta;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{busy} busy samples ({idle} idle left out), {} CPUs at {} Hz over {:.1} s",
        m.cpus.len(),
        m.frequency_hz,
        m.duration_ns as f64 / 1e9
    );
    let mut folded = Folded::new();
    let mut without_idle = profile.clone();
    without_idle.samples.retain(|s| !is_idle(s));
    for line in super::folded_lines_by(&without_idle, GroupBy::Comm) {
        if let Some((stack, count)) = line.rsplit_once(' ')
            && let Ok(count) = count.parse::<u64>()
        {
            *folded.entry(stack.to_owned()).or_default() += count;
        }
    }
    let [own, total, processes] = shares(&folded);
    let _ = writeln!(
        o,
        "\n{:>7} {:>7}  function (top {n} by self)",
        "self%", "total%"
    );
    for (name, share) in ranked(&own, n) {
        let total = total.get(name).copied().unwrap_or(share);
        let _ = writeln!(o, "{share:>7.2} {total:>7.2}  {name}");
    }
    let _ = writeln!(o, "\n{:>7}  process (comm)", "busy%");
    for (name, share) in ranked(&processes, n) {
        let _ = writeln!(o, "{share:>7.2}  {name}");
    }
    o
}

/// The `n` largest shares, largest first (names break ties).
fn ranked(shares: &std::collections::HashMap<String, f64>, n: usize) -> Vec<(&str, f64)> {
    let mut v: Vec<(&str, f64)> = shares.iter().map(|(k, &s)| (k.as_str(), s)).collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    v.truncate(n);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Frame, FrameKind, Interner, Meta, Sample};

    /// 3 samples in `work` under `main`, 1 in `main` itself, 2 idle: shares are of the 4 busy.
    #[test]
    fn self_and_total_shares_of_busy_samples() {
        let mut i = Interner::new(Meta {
            frequency_hz: 99,
            duration_ns: 1_000_000_000,
            cpus: vec![0],
            ..Meta::default()
        });
        let frame = |i: &mut Interner, name: &str| {
            let name = i.string(name);
            i.frame(Frame {
                kind: FrameKind::User,
                name,
                ..Frame::default()
            })
        };
        let (main, work) = (frame(&mut i, "main"), frame(&mut i, "work"));
        let deep = i.stack(vec![main, work]);
        let shallow = i.stack(vec![main]);
        let app = i.string("app");
        let swapper = i.string("swapper/0");
        for (pid, comm, stack, n) in [
            (7, app, deep, 3),
            (7, app, shallow, 1),
            (0, swapper, shallow, 2),
        ] {
            for _ in 0..n {
                i.sample(Sample {
                    offset_ns: 0,
                    cpu: 0,
                    pid,
                    tid: pid,
                    cgroup_id: 0,
                    comm,
                    stack,
                });
            }
        }
        let text = top_table(&i.finish(), 10);
        assert!(
            text.starts_with("4 busy samples (2 idle left out)"),
            "{text}"
        );
        assert!(text.contains("  75.00   75.00  work\n"), "{text}");
        assert!(text.contains("  25.00  100.00  main\n"), "{text}");
        assert!(text.contains(" 100.00  app\n"), "{text}");
        assert!(!text.contains("swapper"), "{text}");
    }
}
