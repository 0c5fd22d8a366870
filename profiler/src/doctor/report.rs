//! The doctor's two renderings of the same findings: text for people, JSON for scripts (its
//! schema in json.rs).
use std::fmt::Write as _;

pub(crate) use super::json::json;
use super::{
    Findings,
    verdict::{CPU_SATURATED, STARVED_WARN, Verdict, cpu_percent, crash_loop_line, starved_line},
};
use crate::cgroups::MemorySubtree;

const MIB: f64 = (1 << 20) as f64;

/// The human report: the verdict, the findings section by section, the remedies.
pub(crate) fn text(f: &Findings, v: &Verdict) -> String {
    let mut o = String::new();
    verdict_text(&mut o, v);
    dying_text(&mut o, f);
    churn_text(&mut o, f);
    lifecycle_text(&mut o, f);
    kernel_log_text(&mut o, f);
    cpu_text(&mut o, f);
    starved_text(&mut o, f);
    memcg_text(&mut o, f);
    remedies_text(&mut o, v);
    o
}

/// `verdict:`, its problems and the holder.
fn verdict_text(o: &mut String, v: &Verdict) {
    let _ = writeln!(o, "verdict: {}", v.level.name());
    for p in &v.problems {
        let _ = writeln!(o, "  problem: {p}");
    }
    if let Some(h) = &v.holder {
        let _ = writeln!(o, "  the dying memory cgroups hang under: {h}");
    }
}

/// `dying cgroups (end of window):` per v1 controller, on cgroup2, and their corroboration.
fn dying_text(o: &mut String, f: &Findings) {
    let _ = writeln!(o, "\ndying cgroups (end of window):");
    for c in &f.cgroups.controllers {
        let _ = writeln!(
            o,
            "  {:<10} {:>6} dying  ({} in /proc/cgroups, {} live under {})",
            c.controller,
            c.dying,
            c.num_cgroups,
            c.live,
            c.mount.display()
        );
    }
    if let Some((path, n)) = &f.cgroups.v2 {
        let _ = writeln!(o, "  cgroup2    {n:>6} dying  ({})", path.display());
    }
    for t in &f.cgroups.v2_top {
        let _ = writeln!(
            o,
            "    {} dying under {}",
            t.nr_dying_descendants,
            t.path.display()
        );
    }
    if let Some(m) = &f.cgroups.v2_memory {
        let _ = writeln!(
            o,
            "  memory v2  {:>6} dying  ({} of {}/cgroup.stat)",
            m.dying,
            m.source,
            m.mount.display()
        );
        for s in &m.subtrees {
            let _ = writeln!(o, "    {}", subtree_text(s));
        }
        if let Some(h) = &m.holder {
            let _ = writeln!(o, "    holder: {}", subtree_text(h));
        }
    }
    if let Some(n) = f.cgroups.mem_cgroup_slab {
        let _ = writeln!(o, "  mem_cgroup slab objects: {n}");
    }
    if let Some(kb) = f.cgroups.percpu_kb {
        let _ = writeln!(o, "  Percpu memory: {kb} kB");
    }
    for h in &f.cgroups.cache_holders {
        let _ = writeln!(
            o,
            "  holder: {}: total_cache {:.1} MiB, {} live children account {:.1} MiB -> {:.1} MiB held by dying children",
            h.path.display(),
            h.total_cache as f64 / MIB,
            h.live_children,
            h.children_cache as f64 / MIB,
            h.unexplained() as f64 / MIB
        );
    }
}

/// `cgroup churn`: the ten processes that made or removed the most cgroups.
fn churn_text(o: &mut String, f: &Findings) {
    let _ = writeln!(o, "\ncgroup churn ({:.1} s):", f.duration_s);
    if let Some(e) = &f.churn_error {
        let _ = writeln!(o, "  not traced: {e}");
    } else if f.churn.is_empty() {
        let _ = writeln!(o, "  no cgroups created or removed");
    }
    for c in f.churn.iter().take(10) {
        let _ = writeln!(
            o,
            "  {} (pid {}): {} created, {} removed ({:.1}/s){} under {}",
            c.comm,
            c.pid,
            c.mkdirs,
            c.rmdirs,
            f.churn_rate(c),
            super::verdict::via(c),
            c.parents
                .iter()
                .take(3)
                .map(|(p, n)| format!("{p} ({n})"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// `process lifecycle`: one line per program, crash loops flagged.
fn lifecycle_text(o: &mut String, f: &Findings) {
    let _ = writeln!(o, "\nprocess lifecycle ({:.1} s):", f.duration_s);
    if let Some(e) = &f.attach_error {
        let _ = writeln!(o, "  processes not linked to cgroups: {e}");
    }
    if f.programs.is_empty() {
        let _ = writeln!(o, "  no process started or exited");
    }
    for p in &f.programs {
        if p.crash_loop {
            let _ = writeln!(o, "  CRASH LOOP: {}", crash_loop_line(p, f));
        } else {
            let _ = writeln!(o, "  {}", p.summary());
        }
    }
}

/// `kernel log (starvation symptoms)`, each after the saturated run before it.
fn kernel_log_text(o: &mut String, f: &Findings) {
    let _ = writeln!(o, "\nkernel log (starvation symptoms):");
    if let Some(e) = &f.kernel_log_error {
        let _ = writeln!(o, "  not read: {e}");
    } else if f.timeline.is_empty() {
        let _ = writeln!(o, "  none");
    }
    for line in &f.timeline {
        let _ = writeln!(o, "  {line}");
    }
}

/// `CPU`: how busy each CPU was, saturated ones flagged, and who kept each busy.
fn cpu_text(o: &mut String, f: &Findings) {
    let _ = writeln!(o, "\nCPU ({} samples at {} Hz):", f.samples, f.frequency_hz);
    for (cpu, busy) in &f.cpus {
        let flag = if *busy >= CPU_SATURATED {
            "  SATURATED"
        } else {
            ""
        };
        let top = f
            .cpu_top
            .iter()
            .find(|(c, _)| c == cpu)
            .map_or(String::new(), |(_, top)| {
                let names: Vec<String> = top
                    .iter()
                    .filter(|p| p.percent >= 0.5)
                    .map(|p| format!("{} (pid {}) {:.0}%", p.comm, p.pid, p.percent))
                    .collect();
                if names.is_empty() {
                    String::new()
                } else {
                    format!(": {}", names.join(", "))
                }
            });
        let _ = writeln!(o, "  cpu{cpu}: {busy:.0}% busy{flag}{top}");
    }
}

/// `Waited for a CPU`: threads whose run-queue wait passed `STARVED_WARN`, and who ran.
fn starved_text(o: &mut String, f: &Findings) {
    let _ = writeln!(
        o,
        "\nWaited for a CPU ({:.0} ms or more in one wait):",
        STARVED_WARN * 1e3
    );
    match &f.starved {
        None => {
            let _ = writeln!(o, "  not traced on this kernel");
        }
        Some(v) if v.is_empty() => {
            let _ = writeln!(o, "  none");
        }
        Some(v) => {
            for s in v {
                let _ = writeln!(o, "  {}", starved_line(s, f));
                for r in s.instead.iter().skip(1) {
                    let _ = writeln!(
                        o,
                        "      also {} (pid {}) {:.0}%: {}",
                        r.comm,
                        r.pid,
                        r.percent(),
                        r.function
                    );
                }
            }
        }
    }
}

/// `CPU in memory-cgroup kernel code`, per process, and which of the catalogue this kernel has.
fn memcg_text(o: &mut String, f: &Findings) {
    let _ = writeln!(o, "\nCPU in memory-cgroup kernel code, per process:");
    if f.memcg.is_empty() {
        let _ = writeln!(o, "  none");
    }
    for s in &f.memcg {
        let others: Vec<String> = s
            .functions
            .iter()
            .skip(1)
            .take(3)
            .map(|(n, c)| format!("{n} {:.0}%", crate::profile::memcg::pct(*c, s.samples)))
            .collect();
        let _ = writeln!(
            o,
            "  {}: {:.0}% of its CPU in {} ({:.0}% of a CPU; pid {}{}{})",
            s.comm,
            s.percent(),
            s.top_function(),
            cpu_percent(s, f),
            s.pid,
            if others.is_empty() { "" } else { "; also " },
            others.join(", ")
        );
    }
    let _ = writeln!(
        o,
        "  catalogue on this kernel ({}): {}",
        f.kernel,
        f.memcg_present.join(" ")
    );
    let _ = writeln!(o, "  not on this kernel: {}", f.memcg_absent.join(" "));
}

/// `remedies:`, if there are any.
fn remedies_text(o: &mut String, v: &Verdict) {
    if !v.remedies.is_empty() {
        let _ = writeln!(o, "\nremedies:");
        for r in &v.remedies {
            let _ = writeln!(o, "  {r}");
        }
    }
}

/// `N dying memcgs under PATH (X MiB page cache)`.
fn subtree_text(s: &MemorySubtree) -> String {
    let cache = s.file_bytes.map_or(String::new(), |b| {
        format!(" ({:.1} MiB page cache)", b as f64 / MIB)
    });
    format!("{} dying memcgs under {}{cache}", s.dying, s.path.display())
}
