use super::*;

const S: u64 = 1_000_000_000;

/// A process of `comm` forked by `ppid` at `start_s`, living `life_ms`, ending with `status`
/// (wait(2) form).
fn life(pid: u32, ppid: u32, comm: &str, start_s: f64, life_ms: u64, status: u32) -> Lifetime {
    let fork = (start_s * S as f64) as u64;
    Lifetime {
        pid,
        ppid,
        comm: comm.into(),
        exe: "/usr/bin/dash".into(),
        fork_ns: Some(fork),
        exec_ns: Some(fork + 1000),
        exit_ns: Some(fork + life_ms * 1_000_000),
        exit_status: Some(status),
    }
}

/// `n` restarts of `crashy` by supervisor pid 50, evenly over `window_s`, exiting with code 2,
/// each moved into /lab/svc.
fn looping(n: u32, window_s: f64) -> (Vec<Lifetime>, Vec<(u32, String)>) {
    let ls: Vec<Lifetime> = (0..n)
        .map(|i| {
            life(
                100 + i,
                50,
                "crashy",
                f64::from(i) * window_s / f64::from(n),
                20 + u64::from(i),
                2 << 8,
            )
        })
        .collect();
    let at = (0..n).map(|i| (100 + i, "/lab/svc".to_owned())).collect();
    (ls, at)
}

fn judge(n: u32, window_s: f64) -> Program {
    let (ls, at) = looping(n, window_s);
    let cg = cgroup_of(&ls, &at);
    let ps = programs(&ls, &cg, false, window_s);
    assert_eq!(ps.len(), 1, "{ps:?}");
    ps.into_iter().next().unwrap()
}

#[test]
fn five_failing_restarts_in_a_minute_are_a_loop_four_are_not() {
    let p = judge(5, 60.0);
    assert!(p.crash_loop, "{p:?}");
    assert_eq!((p.starts(), p.failing), (5, 5));
    assert_eq!(p.exits, [("code 2".to_owned(), 5)]);
    assert_eq!(p.failing_status(), Some("code 2"));
    assert_eq!(p.cgroup, "/lab/svc");
    assert_eq!(p.parents, [(50, String::new(), 5)]);
    // Lifetimes 20..=24 ms: the median is the middle one.
    assert_eq!(p.median_lifetime_ns, Some(22_000_000));
    assert!(!judge(4, 60.0).crash_loop);
}

#[test]
fn the_rate_threshold_is_per_minute() {
    // 5 failures in 61 s: 4.92 a minute, under the threshold; 10 in 120 s is exactly 5.
    assert!(!judge(5, 61.0).crash_loop);
    assert!(judge(10, 120.0).crash_loop);
    // One failure in a 10 s window is 6 a minute but not a loop (too few failures).
    assert!(!is_crash_loop(1, 1, 10.0));
    assert!(is_crash_loop(5, 5, 10.0));
    // Failures nobody restarts (5 processes of a batch failing, 2 started in the window).
    assert!(!is_crash_loop(2, 5, 10.0));
}

#[test]
fn clean_exits_and_clean_signals_are_not_failures() {
    for (status, failing) in [
        (0, false),
        (2 << 8, true),
        (9, true),
        (0xb | 0x80, true),
        (15, false),
        (1, false),
        (13, false),
    ] {
        let l = life(1, 0, "x", 0.0, 1, status);
        assert_eq!(failed(&l), failing, "status {status:#x}");
    }
    let mut unknown = life(1, 0, "x", 0.0, 1, 0);
    unknown.exit_status = None;
    assert!(!failed(&unknown));
    // A job that succeeds every time is no loop however often it runs.
    let mut ls: Vec<Lifetime> = (0..100)
        .map(|i| life(100 + i, 50, "cron-job", f64::from(i) * 0.1, 5, 0))
        .collect();
    let at: Vec<(u32, String)> = (0..100).map(|i| (100 + i, "/jobs".to_owned())).collect();
    // And a process that never exits in the window has no exit and no lifetime.
    ls.push(Lifetime {
        exit_ns: None,
        exit_status: None,
        ..life(300, 50, "cron-job", 1.0, 0, 0)
    });
    let ps = programs(&ls, &cgroup_of(&ls, &at), false, 10.0);
    assert_eq!(ps.len(), 2, "{ps:?}");
    assert!(ps.iter().all(|p| !p.crash_loop && p.failing == 0));
}

#[test]
fn failing_programs_without_a_cgroup_move_are_not_loops_in_the_doctor() {
    // A shell loop running grep that finds nothing: exit 1 fifty times, same parent, never
    // moved into a cgroup.
    let ls: Vec<Lifetime> = (0..50)
        .map(|i| life(100 + i, 7, "grep", f64::from(i) * 0.1, 1, 1 << 8))
        .collect();
    let ps = programs(&ls, &cgroup_of(&ls, &[]), false, 10.0);
    assert_eq!(ps[0].failing, 50);
    assert!(!ps[0].crash_loop, "{ps:?}");
    // A capture groups by parent instead and calls it what it is.
    let ps = programs(&ls, &HashMap::new(), true, 10.0);
    assert!(ps[0].crash_loop, "{ps:?}");
}

#[test]
fn children_inherit_their_parents_cgroup_and_the_deepest_path_wins() {
    let mut ls = vec![
        life(10, 1, "svc", 0.0, 100, 0),
        life(11, 10, "helper", 0.1, 10, 0),
        life(12, 11, "worker", 0.2, 10, 0),
        life(13, 99, "other", 0.2, 10, 0),
    ];
    (ls[0].fork_ns, ls[0].exec_ns) = (None, None);
    let at = vec![
        (10, "/".to_owned()),
        (10, "/system.slice/svc.service".to_owned()),
    ];
    let cg = cgroup_of(&ls, &at);
    assert_eq!(cg[&10], "/system.slice/svc.service");
    assert_eq!(cg[&12], "/system.slice/svc.service");
    assert!(!cg.contains_key(&13));
    let ps = programs(&ls, &cg, false, 1.0);
    let svc = ps.iter().find(|p| p.comm == "svc").unwrap();
    // It started before the window: an exit, no start.
    assert_eq!((svc.starts(), svc.exits.len()), (0, 1));
    let worker = ps.iter().find(|p| p.comm == "worker").unwrap();
    assert_eq!(worker.parents, [(11, "helper".to_owned(), 1)]);
    assert_eq!(worker.name(), "worker (/usr/bin/dash)");
}

#[test]
fn records_read_after_the_window_are_left_out() {
    // 10 s window: one start after it, one exit after it (status unknown by then).
    let mut ls = vec![
        life(1, 50, "a", 1.0, 100, 2 << 8),
        life(2, 50, "a", 9.95, 100, 2 << 8),
        life(3, 50, "a", 10.5, 100, 2 << 8),
    ];
    ls[1].exit_status = None;
    // Before it (clamped to offset 0): one that ended there, one that started there.
    ls.push(Lifetime {
        fork_ns: Some(0),
        exec_ns: Some(0),
        exit_ns: Some(0),
        exit_status: None,
        ..life(4, 50, "a", 0.0, 0, 0)
    });
    ls.push(Lifetime {
        fork_ns: Some(0),
        exec_ns: Some(0),
        ..life(5, 50, "a", 0.0, 300, 2 << 8)
    });
    let ps = programs(&ls, &HashMap::new(), true, 10.0);
    assert_eq!(ps[0].pids, [1, 2]);
    assert_eq!(ps[0].exits, [("code 2".to_owned(), 2)]);
}

#[test]
fn per_attempt_ids_fold_and_names_stay() {
    let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let uid = "0a1b2c3d-1111-2222-3333-444455556666";
    let cases = [
        (
            format!("/system.slice/docker-{id}.scope"),
            "/system.slice/docker-*.scope",
        ),
        (
            format!("/system.slice/cri-containerd-{id}.scope"),
            "/system.slice/cri-containerd-*.scope",
        ),
        (
            format!("/machine.slice/crio-{id}.scope"),
            "/machine.slice/crio-*.scope",
        ),
        (format!("/docker/{id}"), "/docker/*"),
        (
            format!("/kubepods/burstable/pod{uid}/{id}"),
            "/kubepods/burstable/pod*/*",
        ),
        (
            format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
                uid.replace('-', "_")
            ),
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod*.slice",
        ),
        ("/zsvc/run-100".to_owned(), "/zsvc/run-*"),
        ("/svc/attempt7".to_owned(), "/svc/attempt*"),
        (
            "/system.slice/run-u42.scope".to_owned(),
            "/system.slice/run-u*.scope",
        ),
        (
            "/system.slice/run-r0123456789abcdef0123456789abcdef.scope".to_owned(),
            "/system.slice/run-r*.scope",
        ),
        (
            "/system.slice/kubelet.service".to_owned(),
            "/system.slice/kubelet.service",
        ),
        ("/kubepods/burstable".to_owned(), "/kubepods/burstable"),
        (String::new(), ""),
    ];
    for (path, place) in cases {
        assert_eq!(cgroup_place(&path), place, "{path}");
    }
    // Not a UUID (its last group is short): not folded as one id.
    assert_ne!(
        cgroup_place("/a/0a1b2c3d-1111-2222-3333-44445555666"),
        "/a/*"
    );
}

/// A supervisor starting each attempt in a new cgroup (`/zsvc/run-N`) restarts one program:
/// one crash loop over every attempt, with the number of cgroups it used.
#[test]
fn a_new_cgroup_per_attempt_is_one_program() {
    let (ls, _) = looping(12, 60.0);
    let at: Vec<(u32, String)> = ls
        .iter()
        .map(|l| (l.pid, format!("/zsvc/run-{}", l.pid)))
        .collect();
    let ps = programs(&ls, &cgroup_of(&ls, &at), false, 60.0);
    assert_eq!(ps.len(), 1, "{ps:?}");
    let p = &ps[0];
    assert!(p.crash_loop, "{p:?}");
    assert_eq!(
        (p.cgroup.as_str(), p.cgroups_seen, p.starts()),
        ("/zsvc/run-*", 12, 12)
    );
    assert!(
        p.summary().contains("in /zsvc/run-* (12 cgroups)"),
        "{}",
        p.summary()
    );
    // Restarted in the same cgroup: one cgroup, said as before.
    let same = judge(5, 60.0);
    assert_eq!(same.cgroups_seen, 1);
    assert!(
        same.summary().contains("in /lab/svc:"),
        "{}",
        same.summary()
    );
}

/// A runtime that forks one short-lived starter per attempt (`runc`, a shim): the program's
/// supervisor is the long-lived process above the starters, and without cgroups (captures,
/// an agent without the churn tracer) its restarts are one program under that supervisor.
#[test]
fn starters_per_attempt_share_one_supervisor() {
    let mut ls = vec![Lifetime {
        pid: 9,
        comm: "zsuper".into(),
        ..Lifetime::default()
    }];
    for i in 0..12u32 {
        let start = f64::from(i) * 5.0;
        ls.push(life(1000 + i, 9, "runc", start, 30, 2 << 8));
        ls.push(life(100 + i, 1000 + i, "zagent", start + 0.001, 20, 2 << 8));
    }
    let ps = programs(&ls, &HashMap::new(), true, 60.0);
    let zagent = ps.iter().find(|p| p.comm == "zagent").expect("zagent");
    assert!(zagent.crash_loop, "{ps:?}");
    assert_eq!(
        zagent.starts(),
        12,
        "one program, not one per starter: {ps:?}"
    );
    assert_eq!(zagent.parents.len(), 12);
    assert_eq!(zagent.supervisor, Some((9, "zsuper".to_owned())));
    assert_eq!(
        zagent.started_by().as_deref(),
        Some("started by runc (12 processes) under zsuper (pid 9)")
    );
    // A starter from before the window, gone unnamed, does not rename the others.
    let mut one_unnamed = zagent.clone();
    one_unnamed.parents[0].1.clear();
    assert_eq!(one_unnamed.started_by(), zagent.started_by());
    // A supervisor that starts the program itself is named once.
    let direct = judge(5, 60.0);
    assert_eq!(
        direct.started_by().as_deref(),
        Some("started by ? (pid 50)")
    );
}
