//! The doctor's two renderings of the same findings: text for people, JSON for scripts. The
//! JSON is written by hand (a few flat objects) to keep serde out of the binary.
use std::fmt::Write as _;

use super::{
    Findings,
    verdict::{CPU_SATURATED, Verdict, cpu_percent, crash_loop_line, creator},
};
use crate::profile::lifecycle::Program;

const MIB: f64 = (1 << 20) as f64;

/// The human report.
pub fn text(f: &Findings, v: &Verdict) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "verdict: {}", v.level.name());
    for p in &v.problems {
        let _ = writeln!(o, "  problem: {p}");
    }
    if let Some(h) = &v.holder {
        let _ = writeln!(o, "  the dying memory cgroups hang under: {h}");
    }
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
    let _ = writeln!(o, "\ncgroup churn ({:.1} s):", f.duration_s);
    if let Some(e) = &f.churn_error {
        let _ = writeln!(o, "  not traced: {e}");
    } else if f.churn.is_empty() {
        let _ = writeln!(o, "  no cgroups created or removed");
    }
    for c in f.churn.iter().take(10) {
        let _ = writeln!(
            o,
            "  {} (pid {}): {} created, {} removed ({:.1}/s) under {}",
            c.comm,
            c.pid,
            c.mkdirs,
            c.rmdirs,
            f.churn_rate(c),
            c.parents
                .iter()
                .take(3)
                .map(|(p, n)| format!("{p} ({n})"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
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
    let _ = writeln!(o, "\nkernel log (starvation symptoms):");
    if let Some(e) = &f.kernel_log_error {
        let _ = writeln!(o, "  not read: {e}");
    } else if f.timeline.is_empty() {
        let _ = writeln!(o, "  none");
    }
    for line in &f.timeline {
        let _ = writeln!(o, "  {line}");
    }
    let _ = writeln!(o, "\nCPU ({} samples at {} Hz):", f.samples, f.frequency_hz);
    for (cpu, busy) in &f.cpus {
        let flag = if *busy >= CPU_SATURATED {
            "  SATURATED"
        } else {
            ""
        };
        let _ = writeln!(o, "  cpu{cpu}: {busy:.0}% busy{flag}");
    }
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
            .map(|(n, c)| format!("{n} {:.0}%", super::memcg::pct(*c, s.samples)))
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
    if !v.remedies.is_empty() {
        let _ = writeln!(o, "\nremedies:");
        for r in &v.remedies {
            let _ = writeln!(o, "  {r}");
        }
    }
    o
}

/// One program as a JSON object; the pids of its starts only for a crash loop (bounded by
/// the restarts a window can hold).
fn program_json(p: &Program, f: &Findings) -> String {
    let exits: Vec<String> = p
        .exits
        .iter()
        .map(|(how, n)| format!(r#"{{"status":{},"count":{n}}}"#, q(how)))
        .collect();
    let parents: Vec<String> = p
        .parents
        .iter()
        .map(|(pid, comm, n)| format!(r#"{{"pid":{pid},"comm":{},"starts":{n}}}"#, q(comm)))
        .collect();
    let creator = creator(p, &f.churn).map_or("null".to_owned(), |c| {
        format!(
            r#"{{"pid":{},"comm":{},"mkdirs":{},"rmdirs":{}}}"#,
            c.pid,
            q(&c.comm),
            c.mkdirs,
            c.rmdirs
        )
    });
    let pids: Vec<String> = if p.crash_loop {
        p.pids.iter().map(u32::to_string).collect()
    } else {
        Vec::new()
    };
    format!(
        r#"{{"comm":{},"exe":{},"cgroup":{},"starts":{},"starts_per_min":{:.2},"failing_exits":{},"failing_per_min":{:.2},"failing_status":{},"exits":[{}],"median_lifetime_ms":{},"parents":[{}],"crash_loop":{},"creator":{creator},"pids":[{}]}}"#,
        q(&p.comm),
        q(&p.exe),
        q(&p.cgroup),
        p.starts(),
        p.starts_per_min,
        p.failing,
        p.failing_per_min,
        p.failing_status().map_or("null".to_owned(), q),
        exits.join(","),
        p.median_lifetime_ns
            .map_or("null".to_owned(), |ns| format!("{:.3}", ns as f64 / 1e6)),
        parents.join(","),
        p.crash_loop,
        pids.join(",")
    )
}

/// The same figures as JSON (one object).
pub fn json(f: &Findings, v: &Verdict) -> String {
    let strs = |v: &[String]| format!("[{}]", v.iter().map(|s| q(s)).collect::<Vec<_>>().join(","));
    let controllers: Vec<String> = f
        .cgroups
        .controllers
        .iter()
        .map(|c| {
            format!(
                r#"{{"controller":{},"mount":{},"num_cgroups":{},"live":{},"dying":{}}}"#,
                q(&c.controller),
                q(&c.mount.display().to_string()),
                c.num_cgroups,
                c.live,
                c.dying
            )
        })
        .collect();
    let holders: Vec<String> = f
        .cgroups
        .cache_holders
        .iter()
        .map(|h| {
            format!(
                r#"{{"path":{},"total_cache_bytes":{},"children_cache_bytes":{},"unexplained_bytes":{},"live_children":{}}}"#,
                q(&h.path.display().to_string()),
                h.total_cache,
                h.children_cache,
                h.unexplained(),
                h.live_children
            )
        })
        .collect();
    let churn: Vec<String> = f
        .churn
        .iter()
        .map(|c| {
            format!(
                r#"{{"pid":{},"comm":{},"mkdirs":{},"rmdirs":{},"mkdirs_per_s":{:.3},"parents":[{}]}}"#,
                c.pid,
                q(&c.comm),
                c.mkdirs,
                c.rmdirs,
                f.churn_rate(c),
                c.parents
                    .iter()
                    .map(|(p, n)| format!(r#"{{"path":{},"events":{n}}}"#, q(p)))
                    .collect::<Vec<_>>()
                    .join(",")
            )
        })
        .collect();
    let cpus: Vec<String> = f
        .cpus
        .iter()
        .map(|(c, b)| {
            format!(
                r#"{{"cpu":{c},"busy_percent":{b:.1},"saturated":{}}}"#,
                *b >= CPU_SATURATED
            )
        })
        .collect();
    let memcg: Vec<String> = f
        .memcg
        .iter()
        .map(|s| {
            let fns: Vec<String> = s
                .functions
                .iter()
                .map(|(n, c)| format!(r#"{{"function":{},"samples":{c}}}"#, q(n)))
                .collect();
            format!(
                r#"{{"pid":{},"comm":{},"samples":{},"memcg_samples":{},"percent":{:.1},"cpu_percent":{:.1},"top_function":{},"functions":[{}]}}"#,
                s.pid,
                q(&s.comm),
                s.samples,
                s.memcg_samples,
                s.percent(),
                cpu_percent(s, f),
                q(s.top_function()),
                fns.join(",")
            )
        })
        .collect();
    let programs: Vec<String> = f.programs.iter().map(|p| program_json(p, f)).collect();
    let kernel_events: Vec<String> = f
        .kernel_events
        .iter()
        .zip(&f.timeline)
        .map(|(e, line)| {
            format!(
                r#"{{"ts_us":{},"offset_s":{:.3},"kind":{},"message":{},"timeline":{}}}"#,
                e.ts_us,
                e.offset_s,
                q(e.kind),
                q(&e.message),
                q(line)
            )
        })
        .collect();
    let opt = |v: Option<u64>| v.map_or("null".to_owned(), |n| n.to_string());
    let v2 = f.cgroups.v2.as_ref().map(|p| p.1);
    let list = |v: &[&str]| strs(&v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
    format!(
        r#"{{"verdict":{},"holder":{},"problems":{},"remedies":{},"duration_s":{:.3},"samples":{},"frequency_hz":{},"kernel":{},"controllers":[{}],"v2_nr_dying_descendants":{},"mem_cgroup_slab":{},"percpu_kb":{},"cache_holders":[{}],"churn":[{}],"churn_error":{},"programs":[{}],"crash_loops":{},"attach_error":{},"kernel_events":[{}],"kernel_log_error":{},"cpus":[{}],"memcg":[{}],"memcg_functions_present":{},"memcg_functions_absent":{}}}"#,
        q(v.level.name()),
        v.holder.as_deref().map_or("null".to_owned(), q),
        strs(&v.problems),
        strs(&v.remedies),
        f.duration_s,
        f.samples,
        f.frequency_hz,
        q(&f.kernel),
        controllers.join(","),
        opt(v2),
        opt(f.cgroups.mem_cgroup_slab),
        opt(f.cgroups.percpu_kb),
        holders.join(","),
        churn.join(","),
        f.churn_error.as_deref().map_or("null".to_owned(), q),
        programs.join(","),
        f.programs.iter().filter(|p| p.crash_loop).count(),
        f.attach_error.as_deref().map_or("null".to_owned(), q),
        kernel_events.join(","),
        f.kernel_log_error.as_deref().map_or("null".to_owned(), q),
        cpus.join(","),
        memcg.join(","),
        list(&f.memcg_present),
        list(&f.memcg_absent),
    )
}

/// A JSON string literal.
fn q(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(super::q("a\"b\\c\n"), r#""a\"b\\c\u000a""#);
    }
}
