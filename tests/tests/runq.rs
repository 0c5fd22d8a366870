//! Run-queue waits (`record --runq`, the doctor's starved threads) against the kernel's own
//! count (/proc/PID/task/TID/schedstat's run_delay) and `perf sched latency`, on threads that
//! share one CPU (`profiler-lab contend`) and a thread starved by a real-time spinner
//! (`profiler-lab starve`, the code behind `cargo xtask lab starve`).
use std::{path::Path, time::Duration};

use profiler_tests::{
    Running, TempDir, doctor_findings, exclusive, expect_success, require_bpf, run_profiler,
    run_program, tool,
};

const TIMEOUT: Duration = Duration::from_secs(180);

fn run_lab(args: &[&str]) -> std::process::Output {
    run_program(Path::new(env!("CARGO_BIN_EXE_profiler-lab")), args, TIMEOUT)
}

/// Stops the starve lab even when an assertion fails: its spinner takes most of a CPU.
struct StarveGuard;

impl Drop for StarveGuard {
    fn drop(&mut self) {
        let _ = run_lab(&["starve", "--cleanup"]);
    }
}

#[test]
fn each_threads_waits_match_the_kernels_run_delay() {
    if !require_bpf() {
        return;
    }
    let _lock = exclusive();
    // Three threads share CPU 0 for 1.5 s: each waits for about two thirds of it.
    let (capture, _dir, lab) = record_contention(&[]);
    check_against_schedstat(&capture, &lab);
}

/// Threads moved between two CPUs every 15 ms while they wait there: each wait is still
/// counted once, whole, wherever it began and ended.
#[test]
fn waits_of_threads_that_migrate_are_counted_once() {
    if !require_bpf() {
        return;
    }
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    if cpus.trim() == "0" {
        profiler_tests::cannot_run("one CPU: nothing to migrate to");
        return;
    }
    let _lock = exclusive();
    let (capture, _dir, lab) = record_contention(&["--migrate-to", "1"]);
    check_against_schedstat(&capture, &lab);
}

/// `profiler record` while `profiler-lab contend` runs three threads on CPU 0 (with `more`
/// options); the capture's path, its directory and the lab's output.
fn record_contention(more: &[&str]) -> (String, TempDir, std::process::Output) {
    let dir = TempDir::new("runq");
    let capture = dir.file("out.capture");
    let mut profiler = Running::start(&["record", "-d", "120s", "-o", &capture]);
    profiler.wait_for("sampling");
    let mut args = vec!["contend", "--cpu", "0", "--threads", "3", "--ms", "1500"];
    args.extend(more);
    let lab = run_lab(&args);
    expect_success(&lab, "profiler-lab contend");
    profiler.signal("INT");
    let (status, stderr) = profiler.finish();
    assert!(status.success(), "record failed with {status}:\n{stderr}");
    (capture, dir, lab)
}

/// Each contender's waits in the capture against what the kernel counted (the lab's output).
fn check_against_schedstat(capture: &str, lab: &std::process::Output) {
    let p = profiler::profile::read_file(Path::new(capture)).expect("reading the capture");
    let rq = p.runq.as_ref().expect("the capture has run-queue waits");
    assert!(rq.switches > 0 && rq.threads_lost == 0, "{rq:?}");
    let kernel = String::from_utf8_lossy(&lab.stdout);
    let mut checked = 0;
    for line in kernel.lines() {
        let (tid, delay) = line.split_once(' ').expect("`tid run_delay_ns` lines");
        let (tid, delay): (u32, u64) = (tid.parse().unwrap(), delay.parse().unwrap());
        assert!(
            delay >= 500_000_000,
            "tid {tid} waited only {delay} ns: no contention"
        );
        let t = (rq.threads.iter().find(|t| t.tid == tid))
            .unwrap_or_else(|| panic!("tid {tid} not in the run-queue threads"));
        let error = t.delay_ns.abs_diff(delay) as f64 / delay as f64;
        eprintln!(
            "tid {tid}: {} ns in {} waits, the kernel counted {delay} ns ({:.3}% apart)",
            t.delay_ns,
            t.waits,
            100.0 * error
        );
        assert!(
            error <= 0.02,
            "tid {tid}: we timed {} ns of waits, the kernel {delay} ns",
            t.delay_ns
        );
        assert!(t.comm.starts_with("contend-") && t.waits > 10, "{t:?}");
        checked += 1;
    }
    assert_eq!(checked, 3, "the lab printed:\n{kernel}");
    // The table names them, and who ran instead: mostly the other contenders (the profiler's
    // own threads ran on CPU 0 too, while it loaded tables).
    let table = run_profiler(&["report", capture, "--runq"], TIMEOUT);
    expect_success(&table, "report --runq");
    let text = String::from_utf8_lossy(&table.stdout);
    let rows: Vec<&str> = (text.lines())
        .filter(|l| l.starts_with("contend-"))
        .collect();
    assert_eq!(rows.len(), 3, "{text}");
    assert!(rows.iter().any(|r| r.contains("profiler-lab")), "{text}");
}

#[test]
fn the_doctor_names_a_starved_thread_and_who_held_its_cpu() {
    if !require_bpf() {
        return;
    }
    let _lock = exclusive();
    let _ = run_lab(&["starve", "--cleanup"]);
    let _guard = StarveGuard;
    let cpu = profiler_tests::lab::starve::default_cpu().to_string();
    expect_success(&run_lab(&["starve", "--cpu", &cpu]), "profiler-lab starve");
    let waker: u64 = std::fs::read_to_string(profiler_tests::lab::starve::waker_tid_file())
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // perf sched records every switch from before the doctor starts until after its window
    // ends: the reference for the waits it saw.
    let dir = TempDir::new("starve");
    let perf_data = dir.file("perf.data");
    let perf = std::thread::spawn({
        let perf_data = perf_data.clone();
        move || {
            run_program(
                &tool("perf", "linux-perf").expect("perf"),
                &["sched", "record", "-o", &perf_data, "--", "sleep", "20"],
                TIMEOUT,
            )
        }
    });
    let out = run_profiler(&["doctor", "--duration", "4s", "--json"], TIMEOUT);
    expect_success(&perf.join().unwrap(), "perf sched record");
    let v = doctor_findings(&out);
    let starved = v["starved"].as_array().expect("starved threads traced");
    let w = (starved.iter())
        .find(|s| s["tid"].as_u64() == Some(waker))
        .unwrap_or_else(|| panic!("the waker (tid {waker}) is not starved: {starved:?}"));
    let ours = w["wait_s"].as_f64().unwrap();
    assert_eq!(w["cpu"].to_string(), cpu, "{w}");
    let holder = &w["ran_instead"][0];
    assert_eq!(holder["comm"], "rt-spinner", "{w}");
    assert!(holder["percent"].as_f64().unwrap() >= 80.0, "{w}");
    assert!(v["verdict"] != "healthy", "{v}");
    let problem = profiler_tests::doctor_problem(&v, "waker (tid");
    assert!(problem.contains("while rt-spinner"), "{problem}");
    // The doctor's longest wait is one perf saw too. Not perf's longest: the throttled
    // phases vary in length on a busy machine, and perf's 20 s hold more of them than the
    // doctor's 4 s (one run saw 0.53 s at most in perf's 6 s, 0.95 s in the doctor's window).
    // `perf sched timehist` (not `latency`: Debian's perf 6.1 pairs only sched_wakeup, which
    // it no longer records) gives each switch-in's scheduling delay.
    let timehist = run_program(
        &tool("perf", "linux-perf").expect("perf"),
        &["sched", "timehist", "-i", &perf_data],
        TIMEOUT,
    );
    expect_success(&timehist, "perf sched timehist");
    let perf_waits = perf_delays_s(&String::from_utf8_lossy(&timehist.stdout), waker);
    let nearest = (perf_waits.iter().copied())
        .min_by(|a, b| (a - ours).abs().total_cmp(&(b - ours).abs()))
        .expect("the waker in perf sched timehist");
    let perf_max = perf_waits.iter().copied().fold(0.0, f64::max);
    eprintln!(
        "waker's longest wait: ours {ours:.3} s; perf sched saw {nearest:.3} s, at most {perf_max:.3} s"
    );
    assert!(
        (ours - nearest).abs() / nearest <= 0.05 && perf_max >= 0.95 * ours,
        "ours {ours} s, the nearest of perf sched timehist's {nearest} s (longest {perf_max} s)"
    );
}

/// Every `sch delay` of `tid` in `perf sched timehist` (`time [cpu] name[tid/pid] wait
/// sch-delay run`, ms), s.
fn perf_delays_s(text: &str, tid: u64) -> Vec<f64> {
    let tag = format!("[{tid}/");
    text.lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            let at = fields.iter().position(|f| f.contains(&tag))?;
            fields.get(at + 2)?.parse::<f64>().ok()
        })
        .map(|ms| ms / 1e3)
        .collect()
}
