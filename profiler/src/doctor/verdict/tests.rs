//! The verdict's thresholds and wording, on findings built by hand.
use super::*;
use crate::{
    bpf::churn::ChurnCount,
    cgroups::{CacheHolder, ControllerDying, MemorySubtree, Snapshot, V2Memory},
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
            via: vec![],
        }],
        churn_error: None,
        dying_memory: None,
        programs: vec![],
        attach_error: None,
        kernel_events: vec![],
        timeline: vec![],
        kernel_log_error: None,
        cpus: vec![(0, 100.0), (1, 5.0)],
        cpu_top: vec![
            (
                0,
                vec![crate::profile::memcg::CpuShare {
                    comm: "kubelet".into(),
                    pid: 5,
                    percent: 87.0,
                }],
            ),
            (1, vec![]),
        ],
        memcg_present: vec!["memory_stat_show"],
        memcg_absent: vec![],
        memcg: vec![MemcgShare {
            pid: 5,
            comm: "kubelet".into(),
            samples: 1000,
            memcg_samples: kubelet_memcg,
            functions: vec![("memory_stat_show".into(), kubelet_memcg)],
        }],
        starved: Some(vec![]),
    }
}

fn ksoftirqd_waited(wait_s: f64) -> crate::doctor::Starved {
    crate::doctor::Starved {
        tid: 20,
        pid: 20,
        comm: "ksoftirqd/0".into(),
        wait_s,
        cpu: 0,
        at_s: 4.1,
        instead: vec![crate::profile::runq::RanInstead {
            pid: 5,
            comm: "kubelet".into(),
            samples: 87,
            of: 100,
            function: "mem_cgroup_nr_lru_pages".into(),
        }],
    }
}

#[test]
fn a_starved_thread_warns_from_100ms_and_alarms_from_1s_naming_who_held_its_cpu() {
    for (wait_s, level) in [
        (0.099, Level::Healthy),
        (0.1, Level::Warning),
        (0.99, Level::Warning),
        (1.0, Level::Alarm),
    ] {
        let mut f = findings(28, 10, 0);
        // `starved` holds only the waits past the threshold (`doctor::starved`).
        f.starved = Some(if wait_s >= STARVED_WARN {
            vec![ksoftirqd_waited(wait_s)]
        } else {
            vec![]
        });
        assert_eq!(judge(&f).level, level, "{wait_s} s");
    }
    // Linked to the holder's memcg share when it is hot there.
    let mut f = findings(28, 600, 0);
    f.starved = Some(vec![ksoftirqd_waited(2.3)]);
    let v = judge(&f);
    let line = v
        .problems
        .iter()
        .find(|p| p.starts_with("ksoftirqd/0"))
        .unwrap();
    assert_eq!(
        line,
        "ksoftirqd/0 (tid 20) waited up to 2.30 s for CPU 0 at 4.1 s while kubelet (pid 5) ran \
         mem_cgroup_nr_lru_pages there (87% of CPU 0); kubelet spends 60% of its CPU in \
         memory-cgroup kernel code"
    );
    assert!(
        v.remedies
            .iter()
            .any(|r| r.starts_with("kubelet (pid 5) held CPU 0"))
    );
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
    assert!(
        line.contains(
            "agent (pid 9) restarts it making its cgroup anew each time: it created 180 and \
             removed 180 cgroups a minute in all"
        ),
        "{line}"
    );
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

/// A supervisor starting each attempt in a new cgroup and making them through helpers: one
/// crash loop, in a place with the number of its cgroups, the churn charged to the supervisor
/// through its helpers, and the dying count's growth projected.
#[test]
fn a_new_cgroup_per_attempt_made_by_helpers_is_one_loop_charged_to_the_supervisor() {
    use crate::profile::lifecycle::{cgroup_of, programs};
    let mut f = findings(28, 10, 0);
    f.dying_memory = Some((28, 82));
    let mut ls = Vec::new();
    let mut churn = Vec::new();
    let mut at = Vec::new();
    for i in 0..30u32 {
        let t = u64::from(i + 1) * 300_000_000;
        let life = |pid: u32, comm: &str, exe: &str, status: u32| crate::profile::Lifetime {
            pid,
            ppid: 9,
            comm: comm.into(),
            exe: exe.into(),
            fork_ns: Some(t),
            exec_ns: None,
            exit_ns: Some(t + 5_000_000),
            exit_status: Some(status),
        };
        ls.push(life(100 + i, "zagent", "/usr/bin/zagent", 2 << 8));
        ls.push(life(1000 + i, "mkdir", "/usr/bin/mkdir", 0));
        ls.push(life(2000 + i, "rmdir", "/usr/bin/rmdir", 0));
        at.push((100 + i, format!("/zsvc/run-{i}")));
        for (pid, comm, mkdirs) in [(1000 + i, "mkdir", 1), (2000 + i, "rmdir", 0)] {
            churn.push(ChurnCount {
                pid,
                comm: comm.into(),
                mkdirs,
                rmdirs: 1 - mkdirs,
                parents: vec![("/zsvc".into(), 1)],
                via: vec![],
            });
        }
    }
    f.churn = super::super::churn::charge_to_supervisors(churn, &ls, 1, |pid| pid == 9);
    f.churn[0].comm = "zsuper".into();
    f.programs = programs(&ls, &cgroup_of(&ls, &at), false, f.duration_s);
    assert_eq!(
        f.programs.iter().filter(|p| p.crash_loop).count(),
        1,
        "{:?}",
        f.programs
    );
    let v = judge(&f);
    assert_eq!(v.level, Level::Alarm, "{v:?}");
    let line = v
        .problems
        .iter()
        .find(|p| p.starts_with("crash loop"))
        .unwrap();
    for part in [
        "zagent in cgroup /zsvc/run-* (a new one each time: 30 cgroups) exited with code 2 and was restarted 30 times",
        "zsuper (pid 9) restarts it in a new cgroup under /zsvc each time: 180 new cgroups a \
         minute; it created 180 and removed 180 cgroups a minute in all (through mkdir x30, rmdir x30)",
        "+54 dying memory cgroups in 10.0 s (now 82): ~19,000 an hour",
    ] {
        assert!(line.contains(part), "{part}\n in {line}");
    }
}

/// A container runtime's shape: the supervisor (pid 9) runs one short-lived `runc` per
/// attempt, which makes the attempt's cgroup in each of 10 v1 hierarchies, starts the
/// program in it and removes it. One loop, started by the runcs under the supervisor, and
/// their churn is the supervisor's.
#[test]
fn a_runtime_per_attempt_is_one_loop_under_its_supervisor() {
    use crate::profile::lifecycle::{cgroup_of, programs};
    const HIERARCHIES: u64 = 10;
    let mut f = findings(28, 10, 0);
    let (mut ls, mut churn, mut at) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..30u32 {
        let t = u64::from(i + 1) * 300_000_000;
        let life = |pid: u32, ppid: u32, comm: &str| crate::profile::Lifetime {
            pid,
            ppid,
            comm: comm.into(),
            exe: format!("/usr/bin/{comm}"),
            fork_ns: Some(t),
            exec_ns: None,
            exit_ns: Some(t + 5_000_000),
            exit_status: Some(2 << 8),
        };
        ls.push(life(1000 + i, 9, "runc"));
        ls.push(life(100 + i, 1000 + i, "zagent"));
        let id = format!("{:064x}", u64::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        at.push((100 + i, format!("/docker/{id}")));
        churn.push(ChurnCount {
            pid: 1000 + i,
            comm: "runc".into(),
            mkdirs: HIERARCHIES,
            rmdirs: HIERARCHIES,
            parents: vec![("/docker".into(), 2 * HIERARCHIES)],
            via: vec![],
        });
    }
    let alive = |pid| pid == 9;
    // Counted against one hierarchy, a runc's 20 changes are its own churn.
    let own = super::super::churn::charge_to_supervisors(churn.clone(), &ls, 1, alive);
    assert_eq!(own.len(), 30, "{own:?}");
    f.churn = super::super::churn::charge_to_supervisors(churn, &ls, HIERARCHIES as usize, alive);
    f.churn[0].comm = "dockerd".into();
    f.programs = programs(&ls, &cgroup_of(&ls, &at), false, f.duration_s);
    let loops: Vec<_> = f.programs.iter().filter(|p| p.crash_loop).collect();
    assert_eq!(loops.len(), 1, "{:?}", f.programs);
    assert_eq!(loops[0].supervisor, Some((9, String::new())));
    let line = crash_loop_line(loops[0], &f);
    for part in [
        "zagent in cgroup /docker/* (a new one each time: 30 cgroups)",
        "started by runc (30 processes) under ? (pid 9)",
        "dockerd (pid 9) restarts it in a new cgroup under /docker each time: 180 new cgroups a \
         minute; it created 1800 and removed 1800 cgroups a minute in all (through runc x30)",
    ] {
        assert!(line.contains(part), "{part}\n in {line}");
    }
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

#[test]
fn a_cpu_is_saturated_from_90_percent() {
    let mut f = findings(0, 0, 0);
    f.cpus = vec![(0, 89.9), (1, 90.0), (2, 90.1)];
    f.cpu_top.clear();
    let v = judge(&f);
    let json = super::super::report::json(&f, &v);
    for (cpu, saturated) in [(0, false), (1, true), (2, true)] {
        let want = format!(r#""cpu":{cpu},"busy_percent":"#);
        let at = json
            .find(&want)
            .unwrap_or_else(|| panic!("cpu {cpu} in {json}"));
        let rest = &json[at..];
        let flag = &rest[..rest.find(",\"top\"").unwrap()];
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

/// A v2-only host: no v1 controller, `dying` memcgs on cgroup2, most under one slice.
fn v2_findings(dying: u64, kubelet_memcg: u64, mkdirs: u64) -> Findings {
    let mut f = findings(0, kubelet_memcg, mkdirs);
    f.cgroups = Snapshot {
        v2_memory: Some(V2Memory {
            mount: "/sys/fs/cgroup".into(),
            dying,
            source: "nr_dying_descendants",
            subtrees: vec![],
            holder: Some(MemorySubtree {
                path: "/sys/fs/cgroup/system.slice".into(),
                dying: dying - 2,
                file_bytes: Some(6 << 20),
            }),
        }),
        ..Snapshot::default()
    };
    f
}

#[test]
fn dying_memcgs_on_cgroup2_warn_and_alarm_like_v1() {
    for (dying, want) in [
        (DYING_WARN - 1, Level::Healthy),
        (DYING_WARN, Level::Warning),
        (DYING_ALARM - 1, Level::Warning),
        (DYING_ALARM, Level::Alarm),
    ] {
        let v = judge(&v2_findings(dying, 0, 0));
        assert_eq!(v.level, want, "{dying} dying on cgroup2: {v:?}");
    }
    let v = judge(&v2_findings(DYING_ALARM, 0, 0));
    assert_eq!(
        v.problems,
        [
            "400 dying memory cgroups on cgroup2 (nr_dying_descendants of \
             /sys/fs/cgroup/cgroup.stat), 398 of them under /sys/fs/cgroup/system.slice"
        ]
    );
    assert_eq!(v.holder.as_deref(), Some("/sys/fs/cgroup/system.slice"));
    assert!(
        v.remedies[0].starts_with("echo 6291456 > /sys/fs/cgroup/system.slice/memory.reclaim"),
        "{v:?}"
    );
    assert!(
        v.remedies.iter().any(|r| r.contains("drop_caches")),
        "{v:?}"
    );
    assert!(
        !v.remedies.iter().any(|r| r.contains("force_empty")),
        "{v:?}"
    );
}

#[test]
fn on_cgroup2_a_hot_poller_and_a_churner_count_the_v2_dying_memcgs() {
    // Below the warning the poller alone warns; from it, with dying memcgs, it is an alarm.
    assert_eq!(
        judge(&v2_findings(DYING_WARN - 1, 300, 0)).level,
        Level::Warning
    );
    assert_eq!(judge(&v2_findings(DYING_WARN, 300, 0)).level, Level::Alarm);
    let v = judge(&v2_findings(DYING_WARN, 0, 10));
    assert!(
        v.remedies
            .iter()
            .any(|r| r.contains("stop or fix agent (pid 9)")),
        "{v:?}"
    );
}

#[test]
fn cgroup2_figures_in_text_and_json() {
    let f = v2_findings(DYING_ALARM, 0, 0);
    let v = judge(&f);
    let text = super::super::report::text(&f, &v);
    assert!(
        text.contains(
            "  memory v2     400 dying  (nr_dying_descendants of /sys/fs/cgroup/cgroup.stat)\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "    holder: 398 dying memcgs under /sys/fs/cgroup/system.slice (6.0 MiB page cache)\n"
        ),
        "{text}"
    );
    assert!(text.contains("the dying memory cgroups hang under: /sys/fs/cgroup/system.slice"));
    let json = super::super::report::json(&f, &v);
    assert!(
        json.contains(
            r#""v2_memory":{"mount":"/sys/fs/cgroup","dying":400,"source":"nr_dying_descendants","subtrees":[],"holder":{"path":"/sys/fs/cgroup/system.slice","dying":398,"file_bytes":6291456}}"#
        ),
        "{json}"
    );
    // A host without memory on cgroup2 says so with null.
    let f = findings(0, 0, 0);
    assert!(super::super::report::json(&f, &judge(&f)).contains(r#""v2_memory":null"#));
}

/// A saturated CPU names who kept it busy, in the text and the JSON.
#[test]
fn a_cpu_names_who_kept_it_busy() {
    let f = findings(0, 0, 0);
    let v = judge(&f);
    let text = super::super::report::text(&f, &v);
    assert!(
        text.contains("cpu0: 100% busy  SATURATED: kubelet (pid 5) 87%"),
        "{text}"
    );
    let json = super::super::report::json(&f, &v);
    assert!(
        json.contains(r#""top":[{"comm":"kubelet","pid":5,"percent":87.0}]"#),
        "{json}"
    );
}
