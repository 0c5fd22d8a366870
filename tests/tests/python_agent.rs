//! Python frames in the agent (issue 17): a churn of short-lived Python processes, each
//! running a function of its own, sampled by a long-running agent. Every one is named in the
//! store, and the names the agent holds follow the live processes, not the churn: its
//! `profiler_python_processes` gauge comes back to 0 once they have all exited.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use profiler_tests::{
    Agent, TempDir, exclusive, expect_success, read_folded, require_bpf, run_profiler,
};

/// Debian's interpreter (`cargo xtask setup --tests` installs it).
const PYTHON: &str = "/usr/bin/python3.11";
const PROCESSES: usize = 200;
/// Processes running at once.
const LANES: usize = 20;
const COMM: &str = "pychurn";

/// One short-lived process: its comm set first (the agent keeps only `COMM`), then 3 s in
/// `work_<i>` spinning 2 ms of every 50 (0.12 CPU seconds, ~24 samples at 199 Hz), then
/// 1.2 s asleep so that a drain (every 2 s, or at a new Python process's first samples) names
/// its frames while it lives. Spread over 3 s, its samples outlast its detection (the drain
/// after its first sample as `COMM`, then the detection thread: 0.16 s median, 2.1 s at
/// most seen with load on 2 CPUs), which a 0.1 s burst did not always.
fn program(i: usize) -> String {
    format!(
        "import time\n\
         open('/proc/self/comm', 'w').write('{COMM}')\n\
         def work_{i}():\n    \
             x = 0\n    \
             end = time.monotonic() + 3\n    \
             while time.monotonic() < end:\n        \
                 until = time.process_time() + 0.002\n        \
                 while time.process_time() < until:\n            \
                     x += 1\n        \
                 time.sleep(0.048)\n\
         work_{i}()\n\
         time.sleep(1.2)\n"
    )
}

/// Spins in `warm_up` until `stop` exists.
fn warm_program(stop: &str) -> String {
    format!(
        "import os\n\
         open('/proc/self/comm', 'w').write('{COMM}')\n\
         def warm_up():\n    \
             while not os.path.exists('{stop}'):\n        \
                 pass\n\
         warm_up()\n"
    )
}

fn gauge(agent: &Agent) -> Option<f64> {
    metric(agent, "profiler_python_processes")
}

fn metric(agent: &Agent, name: &str) -> Option<f64> {
    let (status, body) = agent.get("/metrics");
    assert_eq!(status, 200, "GET /metrics");
    String::from_utf8_lossy(&body).lines().find_map(|l| {
        l.strip_prefix(name)?
            .strip_prefix(' ')
            .and_then(|v| v.trim().parse().ok())
    })
}

/// Whether the interpreter is installed (its absence fails under CI=true).
fn python_installed() -> bool {
    if Path::new(PYTHON).exists() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{PYTHON} is missing and CI=true: `cargo xtask setup --tests` installs it"
    );
    eprintln!("skipped: {PYTHON} is not installed");
    false
}

/// The agent reads an interpreter's symbols once (seconds for a debug build on a busy
/// machine), at its first process: one that runs until it is named, so that the churn
/// measures naming and forgetting, not that first read.
fn warm_up(agent: &Agent, dir: &TempDir) {
    let warm = dir.file("warm.stop");
    let mut warmup = Command::new(PYTHON)
        .args(["-c", &warm_program(&warm)])
        .stdin(Stdio::null())
        .spawn()
        .expect("starting python");
    let deadline = Instant::now() + Duration::from_secs(120);
    while gauge(agent).unwrap_or(0.0) < 1.0 {
        assert!(
            Instant::now() < deadline,
            "the warm-up process was never named (profiler_python_processes {:?})",
            gauge(agent)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::fs::write(&warm, b"").expect("writing the warm-up's stop file");
    assert!(warmup.wait().expect("waiting for the warm-up").success());
}

/// Runs the `PROCESSES` short-lived processes, `LANES` at a time. Returns the gauge's highest
/// value while they ran: some are alive (and named) at every cut. (The warm-up's name is
/// forgotten at the first cuts after its exit.)
fn churn(agent: &Agent) -> f64 {
    let lanes: Vec<_> = (0..LANES)
        .map(|lane| {
            std::thread::spawn(move || {
                for i in (lane..PROCESSES).step_by(LANES) {
                    let out = Command::new(PYTHON)
                        .args(["-c", &program(i)])
                        .stdin(Stdio::null())
                        .output()
                        .expect("starting python");
                    assert!(out.status.success(), "process {i}: {out:?}");
                }
            })
        })
        .collect();
    let mut during = 0.0f64;
    while !lanes.iter().all(std::thread::JoinHandle::is_finished) {
        std::thread::sleep(Duration::from_millis(500));
        during = during.max(gauge(agent).unwrap_or(0.0));
    }
    for l in lanes {
        l.join().expect("a churn lane failed");
    }
    during
}

/// The gauge once it has settled: each exit is read at a drain, the next cut forgets it (a
/// deadline for a hang, not a timing assertion).
fn settled_gauge(agent: &Agent) -> Option<f64> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut after = gauge(agent);
    while after != Some(0.0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        after = gauge(agent);
    }
    after
}

/// The agent drains every 2 s; each process's first samples woke it sooner (its exec as
/// python3.11, profiler-ebpf `python_exec`). A process spins 2 ms of every 50 for 3 s at
/// 199 Hz: nearly all are sampled within their first 2 s.
fn check_exec_wakes(wakes: f64) {
    eprintln!("profiler_python_exec_wakes_total: {wakes}");
    assert!(
        wakes >= (PROCESSES / 2) as f64,
        "new Python processes woke the agent {wakes} times (want {} or more: one for each of \
         most of the {PROCESSES} processes)",
        PROCESSES / 2
    );
}

/// The names follow the live processes: some during the churn, none once all have exited.
fn check_names_forgotten(during: f64, after: Option<f64>) {
    eprintln!("profiler_python_processes: up to {during} during the churn, {after:?} after it");
    assert!(
        during >= 1.0 && after == Some(0.0),
        "profiler_python_processes was {during} at most while {PROCESSES} Python processes \
         came and went (want 1 or more) and {after:?} once all had exited (want 0: the \
         names of exited processes must be forgotten)"
    );
}

/// Every process has a sample in the store naming its `work_<i>`.
fn check_every_process_named(dir: &TempDir, data: &str) {
    let out = dir.file("churn.folded");
    let q = run_profiler(
        &[
            "query",
            "--data-dir",
            data,
            "--since",
            "10m",
            "--comm",
            COMM,
            "-o",
            &out,
        ],
        Duration::from_secs(120),
    );
    expect_success(&q, "profiler query");
    let (text, stacks) = read_folded(Path::new(&out));
    let missing: Vec<usize> = (0..PROCESSES)
        .filter(|i| {
            let name = format!("work_{i} (");
            !stacks
                .iter()
                .any(|(frames, _)| frames.iter().any(|f| f.starts_with(&name)))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {PROCESSES} processes have no sample naming their work_<i> (want 0): {missing:?}; \
         {} stacks, the first:\n{}",
        missing.len(),
        stacks.len(),
        profiler_tests::head(&text, 15)
    );
}

#[test]
fn a_churn_of_python_processes_is_named_and_then_forgotten() {
    if !require_bpf() || !python_installed() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("python-agent-churn");
    let data = dir.file("data");
    let mut agent = Agent::start(&data, &["--window", "2s", "-F", "199", "--comm", COMM]);
    warm_up(&agent, &dir);
    let during = churn(&agent);
    let after = settled_gauge(&agent);
    let wakes = metric(&agent, "profiler_python_exec_wakes_total").unwrap_or(0.0);
    assert!(agent.stop().success(), "the agent failed");
    check_exec_wakes(wakes);
    check_names_forgotten(during, after);
    check_every_process_named(&dir, &data);
}
