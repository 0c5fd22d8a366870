//! From findings to a verdict: thresholds (documented in docs/doctor.md), the problems with
//! their evidence, and remedies that name the cgroup, the creator and the command.
use super::{Findings, memcg::MemcgShare};

/// Dying cgroups of one controller worth a warning: more than a host's own trickle.
pub const DYING_WARN: u64 = 100;
/// Dying cgroups that make an alarm on their own: statistics reads and reclaim now walk
/// hundreds of memcgs.
pub const DYING_ALARM: u64 = 400;
/// A process is "hot in memcg code" with at least this share of its CPU there, percent...
pub const MEMCG_SHARE_HOT: f64 = 20.0;
/// ...and at least this share of one CPU over the window, percent (ignores idle processes).
pub const MEMCG_CPU_HOT: f64 = 10.0;
/// cgroup creations per second by one process worth naming as churn.
pub const CHURN_RATE_WARN: f64 = 1.0;
/// A CPU this busy, percent, is saturated.
pub const CPU_SATURATED: f64 = 90.0;

/// How bad.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Healthy,
    Warning,
    Alarm,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Healthy => "healthy",
            Level::Warning => "warning",
            Level::Alarm => "alarm",
        }
    }
}

/// The doctor's conclusion.
#[derive(Clone, Debug)]
pub struct Verdict {
    pub level: Level,
    /// One line per problem found.
    pub problems: Vec<String>,
    /// What to do, most direct first.
    pub remedies: Vec<String>,
    /// The v1 memory cgroup judged to hold the dying memcgs (see `holder`).
    pub holder: Option<String>,
}

/// memcg CPU of a share as percent of one CPU over the window.
pub fn cpu_percent(share: &MemcgShare, f: &Findings) -> f64 {
    let ticks = f.samples_per_cpu_window();
    if ticks <= 0.0 {
        0.0
    } else {
        share.memcg_samples as f64 * 100.0 / ticks
    }
}

impl Findings {
    /// Expected samples of one fully busy CPU over the window.
    pub fn samples_per_cpu_window(&self) -> f64 {
        f64::from(self.frequency_hz) * self.duration_s
    }

    /// Processes hot in memcg code (see `MEMCG_SHARE_HOT`, `MEMCG_CPU_HOT`).
    pub fn hot_memcg(&self) -> Vec<&MemcgShare> {
        self.memcg
            .iter()
            .filter(|s| s.percent() >= MEMCG_SHARE_HOT && cpu_percent(s, self) >= MEMCG_CPU_HOT)
            .collect()
    }

    /// Processes creating cgroups at `CHURN_RATE_WARN` or faster.
    pub fn churners(&self) -> Vec<&crate::bpf::churn::ChurnCount> {
        self.churn
            .iter()
            .filter(|c| self.churn_rate(c) >= CHURN_RATE_WARN)
            .collect()
    }

    /// cgroups `c` created per second of the window (the verdict, the text and the JSON).
    pub fn churn_rate(&self, c: &crate::bpf::churn::ChurnCount) -> f64 {
        c.mkdirs as f64 / self.duration_s.max(0.001)
    }
}

/// Who made a crash loop's cgroup: the process that creates cgroups beside it (under the same
/// parent), the program's own starter first. A service manager (systemd, containerd, a
/// supervisor) creates the cgroup anew on every restart; it is the creator, not the cause.
pub fn creator<'a>(
    p: &crate::profile::lifecycle::Program,
    churn: &'a [crate::bpf::churn::ChurnCount],
) -> Option<&'a crate::bpf::churn::ChurnCount> {
    let parent = match p.cgroup.rfind('/') {
        Some(0) => "/",
        Some(i) => &p.cgroup[..i],
        None => return None,
    };
    let beside = |c: &&crate::bpf::churn::ChurnCount| {
        c.mkdirs > 0 && c.parents.iter().any(|(path, _)| path == parent)
    };
    let starter = p.parents.first().map(|s| s.0);
    churn
        .iter()
        .filter(beside)
        .find(|c| Some(c.pid) == starter)
        .or_else(|| churn.iter().find(beside))
}

/// One line naming a crash loop, its cause and its creator (for problems and the text report).
pub fn crash_loop_line(p: &crate::profile::lifecycle::Program, f: &Findings) -> String {
    let mut line = format!(
        "{} in cgroup {} exited with {} and was restarted {} times in {:.1} s ({:.0}/min, {} failing exits), median life {}",
        p.name(),
        p.cgroup,
        p.failing_status().unwrap_or("a failure"),
        p.starts(),
        f.duration_s,
        p.starts_per_min,
        p.failing,
        p.median_lifetime_ns
            .map_or("unknown".to_owned(), |ns| format!(
                "{:.1} ms",
                ns as f64 / 1e6
            ))
    );
    if let Some((pid, comm, _)) = p.parents.first() {
        line.push_str(&format!("; started by {comm} (pid {pid})"));
    }
    if let Some(c) = creator(p, &f.churn) {
        line.push_str(&format!(
            "; {} (pid {}) created {} cgroups beside it and removed {}",
            c.comm, c.pid, c.mkdirs, c.rmdirs
        ));
    }
    line
}

/// The v1 memory cgroup most likely holding the dying memcgs: the cache holder under which a
/// churning process makes cgroups, else the top-ranked holder.
pub fn holder<'a>(
    f: &'a Findings,
    churners: &[&crate::bpf::churn::ChurnCount],
) -> Option<&'a crate::cgroups::CacheHolder> {
    let holders = &f.cgroups.cache_holders;
    churners
        .iter()
        .flat_map(|c| c.parents.iter())
        .filter(|(p, _)| p.len() > 1)
        .find_map(|(p, _)| {
            holders
                .iter()
                .find(|h| h.path.to_string_lossy().ends_with(p.as_str()))
        })
        .or_else(|| holders.first())
}

/// Judges the findings.
pub fn judge(f: &Findings) -> Verdict {
    let mut level = Level::Healthy;
    let mut problems = Vec::new();
    let mut remedies = Vec::new();
    let mut chosen = None;
    let worst = f.cgroups.controllers.iter().max_by_key(|c| c.dying);
    let dying = worst.map_or(0, |c| c.dying);
    let hot = f.hot_memcg();
    let churners = f.churners();

    if let Some(c) = worst.filter(|c| c.dying >= DYING_WARN) {
        level = level.max(if c.dying >= DYING_ALARM {
            Level::Alarm
        } else {
            Level::Warning
        });
        problems.push(format!(
            "{} dying {} cgroups ({} counted, {} live)",
            c.dying, c.controller, c.num_cgroups, c.live
        ));
        if c.controller == "memory" || f.cgroups.dying("memory").unwrap_or(0) >= DYING_WARN {
            if let Some(h) = holder(f, &churners) {
                chosen = Some(h.path.display().to_string());
                remedies.push(format!(
                    "echo 0 > {}/memory.force_empty   # reclaims the {:.1} MiB of page cache \
                     that keeps the dying memcgs below it alive",
                    h.path.display(),
                    h.unexplained() as f64 / f64::from(1 << 20)
                ));
            }
            remedies.push(
                "sync; echo 1 > /proc/sys/vm/drop_caches   # host-wide: frees all clean page \
                 cache, and with it the dying memcgs"
                    .to_owned(),
            );
        }
    }
    for s in &hot {
        level = level.max(if dying >= DYING_WARN {
            Level::Alarm
        } else {
            Level::Warning
        });
        problems.push(format!(
            "{} (pid {}) spends {:.0}% of its CPU in memory-cgroup kernel code ({})",
            s.comm,
            s.pid,
            s.percent(),
            s.top_function()
        ));
        remedies.push(format!(
            "poll memory statistics less often in {} (kubelet: --housekeeping-interval)",
            s.comm
        ));
    }
    for c in &churners {
        level = level.max(Level::Warning);
        problems.push(format!(
            "{} (pid {}) creates {:.1} cgroups/s",
            c.comm,
            c.pid,
            f.churn_rate(c)
        ));
        if dying >= DYING_WARN {
            remedies.push(format!(
                "stop or fix {} (pid {}): it makes and removes cgroups under {}, and each one \
                 removed with page cache charged stays dying",
                c.comm,
                c.pid,
                c.parents.first().map_or("?", |p| p.0.as_str())
            ));
        }
    }
    for line in &f.timeline {
        level = level.max(Level::Warning);
        problems.push(format!("the kernel logged: {line}"));
    }
    let loops: Vec<_> = f.programs.iter().filter(|p| p.crash_loop).collect();
    for p in &loops {
        level = Level::Alarm;
        problems.push(format!("crash loop: {}", crash_loop_line(p, f)));
        let manager = creator(p, &f.churn)
            .map(|c| format!("{} (pid {})", c.comm, c.pid))
            .or_else(|| p.parents.first().map(|s| format!("{} (pid {})", s.1, s.0)))
            .unwrap_or_else(|| "its service manager".to_owned());
        let unit = p.cgroup.rsplit('/').next().unwrap_or("");
        let stop = if unit.ends_with(".service") {
            format!("`systemctl stop {unit}` or ")
        } else {
            String::new()
        };
        remedies.push(format!(
            "root cause: {} keeps failing ({}); {manager} only restarts it, making {} anew each              time. Fix its failure, or {stop}stop it in {manager}",
            p.name(),
            p.failing_status().unwrap_or("a failure"),
            p.cgroup
        ));
    }
    if dying >= DYING_WARN && churners.is_empty() && loops.is_empty() {
        remedies.push(
            "no process made cgroups in this window: the creator may be periodic (a \
             crash-looping unit); run a longer window, e.g. --duration 60s"
                .to_owned(),
        );
    }
    Verdict {
        level,
        problems,
        remedies,
        holder: chosen,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        bpf::churn::ChurnCount,
        cgroups::{CacheHolder, ControllerDying, Snapshot},
    };

    fn findings(dying: u64, kubelet_memcg: u64, mkdirs: u64) -> Findings {
        Findings {
            duration_s: 10.0,
            samples: 2000,
            frequency_hz: 100,
            kernel: "6.18".into(),
            cgroups: Snapshot {
                controllers: vec![ControllerDying {
                    controller: "memory".into(),
                    mount: "/sys/fs/cgroup/memory".into(),
                    num_cgroups: dying + 3,
                    live: 3,
                    dying,
                }],
                cache_holders: vec![CacheHolder {
                    path: "/sys/fs/cgroup/memory/lab".into(),
                    total_cache: 8 << 20,
                    children_cache: 0,
                    own_cache: 0,
                    live_children: 0,
                }],
                ..Snapshot::default()
            },
            churn: vec![ChurnCount {
                pid: 9,
                comm: "agent".into(),
                mkdirs,
                rmdirs: mkdirs,
                parents: vec![("/lab".into(), 2 * mkdirs)],
            }],
            churn_error: None,
            programs: vec![],
            attach_error: None,
            kernel_events: vec![],
            timeline: vec![],
            kernel_log_error: None,
            cpus: vec![(0, 100.0), (1, 5.0)],
            memcg_present: vec!["memory_stat_show"],
            memcg_absent: vec![],
            memcg: vec![MemcgShare {
                pid: 5,
                comm: "kubelet".into(),
                samples: 1000,
                memcg_samples: kubelet_memcg,
                functions: vec![("memory_stat_show".into(), kubelet_memcg)],
            }],
        }
    }

    #[test]
    fn a_quiet_host_is_healthy() {
        let v = judge(&findings(28, 10, 0));
        assert_eq!(v.level, Level::Healthy, "{v:?}");
        assert!(v.problems.is_empty() && v.remedies.is_empty());
    }

    #[test]
    fn zombies_a_hot_poller_and_a_creator_make_an_alarm_with_remedies() {
        let f = findings(5000, 450, 300);
        let v = judge(&f);
        assert_eq!(v.level, Level::Alarm);
        assert_eq!(v.problems.len(), 3, "{v:?}");
        assert!(v.problems[1].contains("kubelet (pid 5) spends 45%"));
        assert!(v.remedies[0].starts_with("echo 0 > /sys/fs/cgroup/memory/lab/memory.force_empty"));
        assert!(
            v.remedies
                .iter()
                .any(|r| r.contains("stop or fix agent (pid 9)"))
        );
    }

    #[test]
    fn a_crash_loop_names_the_program_as_cause_and_the_supervisor_as_creator() {
        use crate::profile::lifecycle::{cgroup_of, programs};
        let mut f = findings(28, 10, 30);
        f.churn[0].parents = vec![("/lab".into(), 60)];
        let ls: Vec<crate::profile::Lifetime> = (0..30)
            .map(|i| crate::profile::Lifetime {
                pid: 100 + i,
                ppid: 9,
                comm: "crashy-agent".into(),
                exe: "/usr/bin/dash".into(),
                fork_ns: Some(u64::from(i + 1) * 300_000_000),
                exec_ns: None,
                exit_ns: Some(u64::from(i + 1) * 300_000_000 + 5_000_000),
                exit_status: Some(2 << 8),
            })
            .collect();
        let at: Vec<(u32, String)> = (0..30).map(|i| (100 + i, "/lab/svc".into())).collect();
        f.programs = programs(&ls, &cgroup_of(&ls, &at), false, f.duration_s);
        let v = judge(&f);
        assert_eq!(v.level, Level::Alarm, "{v:?}");
        let line = v
            .problems
            .iter()
            .find(|p| p.starts_with("crash loop"))
            .unwrap();
        assert!(line.contains("crashy-agent (/usr/bin/dash) in cgroup /lab/svc exited with code 2 and was restarted 30 times"), "{line}");
        assert!(line.contains("agent (pid 9) created 30 cgroups"), "{line}");
        assert!(
            v.remedies
                .iter()
                .any(|r| r.starts_with("root cause: crashy-agent"))
        );
        // The same processes exiting 0 raise nothing.
        for p in &mut f.programs {
            p.crash_loop = false;
        }
        assert!(
            judge(&f)
                .problems
                .iter()
                .all(|p| !p.starts_with("crash loop"))
        );
    }

    #[test]
    fn a_few_hundred_zombies_alone_warn() {
        assert_eq!(judge(&findings(150, 0, 0)).level, Level::Warning);
    }

    // Boundaries of every documented threshold (docs/doctor.md): just below, at, just above.
    // `findings(dying, kubelet_memcg, mkdirs)`: 10 s at 100 Hz, kubelet has 1000 samples, so
    // its memcg share and its share of one CPU are both kubelet_memcg / 10 percent.

    #[test]
    fn dying_cgroups_alone_warn_from_100_and_alarm_from_400() {
        for (dying, want) in [
            (DYING_WARN - 1, Level::Healthy),
            (DYING_WARN, Level::Warning),
            (DYING_WARN + 1, Level::Warning),
            (DYING_ALARM - 1, Level::Warning),
            (DYING_ALARM, Level::Alarm),
            (DYING_ALARM + 1, Level::Alarm),
        ] {
            // Nothing hot, nobody churning: the dying count alone decides.
            let v = judge(&findings(dying, 0, 0));
            assert_eq!(v.level, want, "{dying} dying: {v:?}");
            assert_eq!(
                v.problems.len(),
                usize::from(want != Level::Healthy),
                "{v:?}"
            );
        }
    }

    #[test]
    fn alarm_from_dying_cgroups_alone_names_the_holder_and_the_host_wide_remedy() {
        let v = judge(&findings(DYING_ALARM, 0, 0));
        assert_eq!(v.level, Level::Alarm);
        assert_eq!(
            v.problems,
            ["400 dying memory cgroups (403 counted, 3 live)"]
        );
        assert_eq!(v.holder.as_deref(), Some("/sys/fs/cgroup/memory/lab"));
        assert!(
            v.remedies[0].contains("/sys/fs/cgroup/memory/lab/memory.force_empty"),
            "{v:?}"
        );
        assert!(
            v.remedies.iter().any(|r| r.contains("drop_caches")),
            "{v:?}"
        );
        // No creator seen: the verdict says so rather than blaming nobody.
        assert!(
            v.remedies.iter().any(|r| r.contains("--duration 60s")),
            "{v:?}"
        );
    }

    #[test]
    fn memcg_share_is_hot_from_20_percent() {
        // 199, 200, 201 of 1000 samples: 19.9%, 20%, 20.1% of its CPU (and of one CPU).
        for (memcg, hot) in [(199, false), (200, true), (201, true)] {
            let f = findings(0, memcg, 0);
            assert_eq!(f.hot_memcg().len(), usize::from(hot), "{memcg}/1000");
            let want = if hot { Level::Warning } else { Level::Healthy };
            assert_eq!(judge(&f).level, want, "{memcg}/1000 alone");
        }
    }

    #[test]
    fn memcg_hot_needs_10_percent_of_one_cpu() {
        // 400 samples of the process: its share is >= 24.75% in every case; of one CPU
        // (1000 samples in the window) 9.9%, 10%, 10.1%.
        for (memcg, hot) in [(99, false), (100, true), (101, true)] {
            let mut f = findings(0, memcg, 0);
            f.memcg[0].samples = 400;
            assert!(f.memcg[0].percent() >= MEMCG_SHARE_HOT);
            assert_eq!(
                f.hot_memcg().len(),
                usize::from(hot),
                "{memcg} memcg samples"
            );
        }
    }

    #[test]
    fn a_hot_process_is_an_alarm_only_with_dying_cgroups_from_100() {
        for (dying, want) in [
            (DYING_WARN - 1, Level::Warning),
            (DYING_WARN, Level::Alarm),
            (DYING_WARN + 1, Level::Alarm),
        ] {
            let v = judge(&findings(dying, 300, 0));
            assert_eq!(v.level, want, "{dying} dying and a hot kubelet: {v:?}");
        }
    }

    #[test]
    fn churn_warns_from_one_cgroup_per_second() {
        // 9, 10, 11 mkdirs in 10 s.
        for (mkdirs, want) in [
            (9, Level::Healthy),
            (10, Level::Warning),
            (11, Level::Warning),
        ] {
            let f = findings(0, 0, mkdirs);
            assert_eq!(f.churners().len(), usize::from(want == Level::Warning));
            assert_eq!(judge(&f).level, want, "{mkdirs} mkdirs in 10 s");
        }
        // A churner with dying cgroups below the alarm stays a warning, and is named.
        let v = judge(&findings(DYING_WARN, 0, 10));
        assert_eq!(v.level, Level::Warning, "{v:?}");
        assert!(
            v.remedies
                .iter()
                .any(|r| r.contains("stop or fix agent (pid 9)"))
        );
    }

    /// Strings with quotes, backslashes, control characters and non-ASCII come back intact
    /// from the JSON, which stays one line.
    #[test]
    fn json_strings_are_escaped() {
        let awkward = "a\"b\\c\n\u{1}é";
        let mut f = findings(0, 0, 0);
        f.kernel = awkward.to_owned();
        let mut v = judge(&f);
        v.problems.push(awkward.to_owned());
        let json = super::super::report::json(&f, &v);
        assert!(!json.contains('\n'), "one line: {json}");
        let back: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(back["kernel"], awkward);
        assert_eq!(
            back["problems"].as_array().unwrap().last().unwrap(),
            awkward
        );
    }

    #[test]
    fn a_cpu_is_saturated_from_90_percent() {
        let mut f = findings(0, 0, 0);
        f.cpus = vec![(0, 89.9), (1, 90.0), (2, 90.1)];
        let v = judge(&f);
        let json = super::super::report::json(&f, &v);
        for (cpu, saturated) in [(0, false), (1, true), (2, true)] {
            let want = format!(r#""cpu":{cpu},"busy_percent":"#);
            let at = json
                .find(&want)
                .unwrap_or_else(|| panic!("cpu {cpu} in {json}"));
            let rest = &json[at..];
            let flag = &rest[..rest.find('}').unwrap()];
            assert!(
                flag.ends_with(&format!(r#""saturated":{saturated}"#)),
                "cpu {cpu}: {flag}"
            );
        }
        let text = super::super::report::text(&f, &v);
        assert!(
            text.contains("cpu0: 90% busy\n"),
            "89.9% rounds to 90 but is not saturated:\n{text}"
        );
        assert!(text.contains("cpu1: 90% busy  SATURATED"), "{text}");
        assert!(text.contains("cpu2: 90% busy  SATURATED"), "{text}");
    }
}
