//! `profiler doctor` against the crash-loop lab (`profiler-lab crashloop`, the code behind
//! `cargo xtask lab crashloop`): a supervisor restarting a script that fails with status 2 in
//! a memory cgroup it makes anew each time. The doctor must name the program, its status, its
//! restart rate, the cgroup and the supervisor, and see every start the lab's log records.

use std::collections::HashMap;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::time::Duration;

use profiler_tests::{
    Agent, TempDir, doctor_findings, doctor_problem, exclusive, expect_success, metric_series,
    require_bpf, run_profiler, run_program,
};
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(180);

/// `profiler-lab ARGS` (the lab is test support, not a command of the profiler).
fn run_lab(args: &[&str]) -> std::process::Output {
    run_program(Path::new(env!("CARGO_BIN_EXE_profiler-lab")), args, TIMEOUT)
}
const LOG: &str = "/var/tmp/profiler-crashloop/log";
const CGROUP: &str = "/profiler-crashloop/crashy-agent.service";

/// Undoes the lab even when an assertion fails, so no supervisor keeps looping.
struct LabGuard;

impl Drop for LabGuard {
    fn drop(&mut self) {
        let _ = run_lab(&["crashloop", "--cleanup"]);
    }
}

fn has_memory_v1() -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let found = mounts
        .lines()
        .any(|l| l.contains(" - cgroup ") && l.split(',').any(|o| o == "memory"));
    if !found {
        // The lab needs a v1 memory hierarchy; under CI its absence is a failure.
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "no v1 memory cgroup hierarchy on this host (CI=true)"
        );
        eprintln!("skipped: no v1 memory cgroup hierarchy on this host");
    }
    found
}

/// The lab's log: (pid, start ns) per start, and (pid -> wait status) per exit.
fn read_log() -> (Vec<(u32, u64)>, HashMap<u32, u32>) {
    let text = std::fs::read_to_string(LOG).expect("the lab's log");
    let mut starts = Vec::new();
    let mut exits = HashMap::new();
    for l in text.lines() {
        let f: Vec<&str> = l.split(' ').collect();
        match f.as_slice() {
            ["start", pid, ns] => starts.push((pid.parse().unwrap(), ns.parse().unwrap())),
            ["exit", pid, status, _] => {
                exits.insert(pid.parse().unwrap(), status.parse().unwrap());
            }
            _ => {}
        }
    }
    (starts, exits)
}

/// Starts the lab afresh (after undoing any earlier one); the guard undoes it. Returns what
/// the lab printed.
fn start_lab(args: &[&str]) -> (LabGuard, String) {
    let _ = run_lab(&["crashloop", "--cleanup"]);
    let lab = run_lab(&[&["crashloop"], args].concat());
    let guard = LabGuard;
    expect_success(&lab, "profiler-lab crashloop");
    (guard, String::from_utf8_lossy(&lab.stdout).into_owned())
}

/// The supervisor's pid, from the lab's "supervisor pid N restarts ...".
fn supervisor_pid(said: &str) -> u64 {
    said.split_whitespace()
        .nth(2)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no supervisor pid in {said:?}"))
}

/// The doctor's crash loop of crashy-agent: the program, its interpreter, cgroup (a place:
/// per-attempt ids as `*`) and status, started and its cgroup created by the supervisor.
fn crashy_agent_loop<'a>(v: &'a Value, sh: &Path, supervisor: u64, cgroup: &str) -> &'a Value {
    let loops: Vec<&Value> = v["programs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["crash_loop"] == true)
        .collect();
    let p = loops
        .iter()
        .find(|p| p["comm"] == "crashy-agent")
        .unwrap_or_else(|| panic!("crashy-agent is not a crash loop: {}", v["programs"]));
    assert_eq!(p["exe"], sh.to_str().unwrap(), "the script's interpreter");
    assert_eq!(p["cgroup"], cgroup);
    assert_eq!(p["failing_status"], "code 2");
    assert_eq!(p["parents"][0]["pid"], supervisor);
    assert_eq!(p["parents"][0]["comm"], "supervisor");
    assert_eq!(p["creator"]["comm"], "supervisor", "{p}");
    assert_eq!(p["creator"]["pid"], supervisor);
    p
}

/// Every start the lab logged inside the window, and no other: the doctor's pids are one
/// unbroken run of the log's starts. Returns them and where the run begins in the log.
fn check_starts_are_the_logs(p: &Value, log_starts: &[(u32, u64)]) -> (Vec<u32>, usize) {
    let pids: Vec<u32> = p["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    let n = pids.len();
    assert!(n >= 20, "only {n} starts seen in 20 s");
    let first = log_starts
        .iter()
        .position(|s| s.0 == pids[0])
        .unwrap_or_else(|| panic!("pid {} not in the lab's log", pids[0]));
    let logged: Vec<u32> = log_starts[first..].iter().take(n).map(|s| s.0).collect();
    assert_eq!(pids, logged, "the doctor's starts are not the lab's");
    (pids, first)
}

/// Every exit the doctor counted is code 2, as the log says of each of these pids. Returns
/// how many it counted.
fn check_exits_are_code_2(p: &Value, pids: &[u32], log_exits: &HashMap<u32, u32>) -> u64 {
    let n = pids.len();
    let exits = p["exits"].as_array().unwrap();
    assert_eq!(exits.len(), 1, "{exits:?}");
    assert_eq!(exits[0]["status"], "code 2");
    let counted = exits[0]["count"].as_u64().unwrap();
    assert_eq!(p["failing_exits"].as_u64().unwrap(), counted);
    // The last start may still run when the window closes, and the first exit may be of a
    // start just before it opened.
    assert!(
        counted.abs_diff(n as u64) <= 1,
        "{counted} exits of {n} starts"
    );
    for pid in &pids[..n - 1] {
        assert_eq!(log_exits.get(pid), Some(&(2 << 8)), "pid {pid} in the log");
    }
    counted
}

/// The restart rate, against the lab's own clock over the same `n` starts from `first`.
fn check_restart_rate(p: &Value, log_starts: &[(u32, u64)], first: usize, n: usize, counted: u64) {
    let span_s = (log_starts[first + n - 1].1 - log_starts[first].1) as f64 / 1e9;
    let lab_rate = (n - 1) as f64 * 60.0 / span_s;
    let rate = p["starts_per_min"].as_f64().unwrap();
    eprintln!("{n} starts, {counted} exits: doctor {rate:.1}/min, the lab's log {lab_rate:.1}/min");
    assert!(
        (rate - lab_rate).abs() <= lab_rate * 0.10,
        "doctor says {rate:.1}/min, the lab's log {lab_rate:.1}/min"
    );
}

/// An alarm, with the crash loop among the problems, its root cause among the remedies, and
/// its line in the text report.
fn check_verdict_and_text(v: &Value, text: &str, sh: &Path, n: usize, place: &str) {
    assert_eq!(v["verdict"], "alarm");
    doctor_problem(v, "crash loop: crashy-agent");
    assert!(
        v["remedies"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x.as_str().unwrap().starts_with("root cause: crashy-agent")),
        "{}",
        v["remedies"]
    );
    assert!(text.contains(&format!(
        "CRASH LOOP: crashy-agent ({}) in cgroup {place} exited with code 2 and was restarted {n} times",
        sh.display()
    )), "{text}");
}

/// The lab's cleanup succeeds and leaves neither its log nor its cgroup.
fn check_cleanup(guard: LabGuard) {
    let cleanup = run_lab(&["crashloop", "--cleanup"]);
    expect_success(&cleanup, "profiler-lab crashloop --cleanup");
    std::mem::forget(guard);
    assert!(!Path::new(LOG).exists(), "cleanup left the log");
    assert!(
        !Path::new("/sys/fs/cgroup/memory/profiler-crashloop").exists(),
        "cleanup left the lab's cgroup"
    );
}

/// A doctor run on the lab started with `lab_args`, and the lab's log of that time.
struct LabRun {
    guard: LabGuard,
    supervisor: u64,
    /// The text report (stderr).
    text: String,
    json: Value,
    log_starts: Vec<(u32, u64)>,
    log_exits: HashMap<u32, u32>,
}

fn doctor_on_the_lab(lab_args: &[&str], duration: &str) -> LabRun {
    let (guard, said) = start_lab(lab_args);
    eprintln!("lab: {said}");
    let supervisor = supervisor_pid(&said);
    let out = run_profiler(&["doctor", "--duration", duration, "--json"], TIMEOUT);
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("{text}");
    let json = doctor_findings(&out);
    // Read before cleanup removes it.
    let (log_starts, log_exits) = read_log();
    LabRun {
        guard,
        supervisor,
        text,
        json,
        log_starts,
        log_exits,
    }
}

#[test]
fn doctor_names_the_crash_loop_its_cgroup_and_its_supervisor() {
    if !require_bpf() || !has_memory_v1() {
        return;
    }
    let _lock = exclusive();
    let LabRun {
        guard,
        supervisor,
        text,
        json: v,
        log_starts,
        log_exits,
    } = doctor_on_the_lab(&[], "20s");

    let sh = std::fs::canonicalize("/bin/sh").unwrap();
    let p = crashy_agent_loop(&v, &sh, supervisor, CGROUP);
    assert_eq!(p["cgroups_seen"], 1, "restarted in the same cgroup: {p}");
    let (pids, first) = check_starts_are_the_logs(p, &log_starts);
    let counted = check_exits_are_code_2(p, &pids, &log_exits);
    check_restart_rate(p, &log_starts, first, pids.len(), counted);
    check_verdict_and_text(&v, &text, &sh, pids.len(), CGROUP);
    check_cleanup(guard);
}

/// The supervisor starts each attempt in a new cgroup (`run-<n>`), made and removed by
/// `mkdir` and `rmdir` processes: still one crash loop, in the place `run-*` with as many
/// cgroups as attempts, its churn charged to the supervisor through those helpers, and the
/// dying memory cgroups it leaves counted.
#[test]
fn doctor_finds_a_crash_loop_with_a_new_cgroup_per_attempt() {
    if !require_bpf() || !has_memory_v1() {
        return;
    }
    let _lock = exclusive();
    let LabRun {
        guard,
        supervisor,
        text,
        json: v,
        log_starts,
        log_exits,
    } = doctor_on_the_lab(&["--per-attempt"], "15s");

    let sh = std::fs::canonicalize("/bin/sh").unwrap();
    let place = "/profiler-crashloop/run-*";
    let p = crashy_agent_loop(&v, &sh, supervisor, place);
    let (pids, first) = check_starts_are_the_logs(p, &log_starts);
    let counted = check_exits_are_code_2(p, &pids, &log_exits);
    check_restart_rate(p, &log_starts, first, pids.len(), counted);
    // One cgroup per attempt the window saw start.
    let seen = p["cgroups_seen"].as_u64().unwrap();
    assert!(
        seen + 1 >= pids.len() as u64 && seen <= pids.len() as u64 + 1,
        "{p}"
    );
    // The supervisor's churn is the helpers' (it makes no cgroup itself).
    let creator = &p["creator"];
    assert!(
        creator["mkdirs"].as_u64().unwrap() + 2 >= pids.len() as u64,
        "{creator}"
    );
    let churn = v["churn"].as_array().unwrap();
    let own = churn
        .iter()
        .find(|c| c["pid"] == supervisor)
        .unwrap_or_else(|| panic!("no churn charged to the supervisor: {churn:?}"));
    let via: Vec<&str> = own["via"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["comm"].as_str().unwrap())
        .collect();
    assert!(via.contains(&"mkdir") && via.contains(&"rmdir"), "{own}");
    assert!(
        churn
            .iter()
            .all(|c| c["comm"] != "mkdir" && c["comm"] != "rmdir"),
        "a helper keeps churn of its own: {churn:?}"
    );
    // Each attempt leaves its memcg dying (the script's page cache stays charged to it).
    let (start, end) = (
        v["dying_memory_start"].as_u64(),
        v["dying_memory_end"].as_u64(),
    );
    assert!(end > start, "dying memory cgroups {start:?} -> {end:?}");
    check_verdict_and_text(
        &v,
        &text,
        &sh,
        pids.len(),
        &format!("{place} (a new one each time: {seen} cgroups)"),
    );
    check_cleanup(guard);
}

/// Short-lived processes that fail, as builds and shell loops run them (`grep` finding
/// nothing, `test` false), are no crash loop: nobody moves them into a cgroup of their own.
/// A `cargo build` runs beside them, again and again (rustc, build scripts, linkers).
#[test]
fn doctor_on_a_host_without_the_lab_raises_no_crash_loop() {
    if !require_bpf() {
        return;
    }
    let _lock = exclusive();
    let _ = run_lab(&["crashloop", "--cleanup"]);
    let mut shell_loop = std::process::Command::new("/bin/sh")
        .args(["-c", "while :; do /bin/false; /bin/true; sleep 0.05; done"])
        .spawn()
        .expect("a shell loop");
    let dir = TempDir::new("crashloop-build");
    let mut builds = cargo_build_loop(dir.path());
    let out = run_profiler(&["doctor", "--duration", "8s", "--json"], TIMEOUT);
    let _ = shell_loop.kill();
    let _ = shell_loop.wait();
    kill_group(&mut builds);
    let text = String::from_utf8_lossy(&out.stderr);
    eprintln!("{text}");
    let v = doctor_findings(&out);
    assert_eq!(v["crash_loops"], 0, "{}", v["programs"]);
    assert!(!text.contains("CRASH LOOP"));
    // The lifecycle and cgroup moves are traced all the same.
    assert!(v["attach_error"].is_null(), "{}", v["attach_error"]);
    let programs = v["programs"].as_array().unwrap();
    for p in programs {
        assert_eq!(p["crash_loop"], false);
    }
    assert!(
        programs.iter().any(|p| p["comm"] == "rustc"),
        "the builds' rustc runs were seen: {programs:?}"
    );
    let false_loop = programs.iter().find(|p| p["comm"] == "false");
    let fails = false_loop.map_or(0, |p| p["failing_exits"].as_u64().unwrap());
    assert!(
        fails >= 20,
        "the shell loop's failures were seen: {false_loop:?}"
    );
}

/// A shell running `cargo build` of a small crate with a build script, then `cargo clean`,
/// until its process group is killed (`kill_group`).
fn cargo_build_loop(dir: &Path) -> std::process::Child {
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        "[package]\nname = \"busy\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("build.rs"),
        "fn main() { println!(\"cargo:rerun-if-changed=build.rs\"); }\n",
    )
    .unwrap();
    std::fs::write(
        src.join("main.rs"),
        "mod more;\nfn main() { println!(\"{}\", more::sum(40)); }\n",
    )
    .unwrap();
    std::fs::write(
        src.join("more.rs"),
        "pub fn sum(n: u64) -> u64 { (0..n).map(|i| i * i).sum() }\n",
    )
    .unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(format!(
            "while :; do '{cargo}' build -q --offline; '{cargo}' clean -q; done"
        ))
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .stdout(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .expect("a cargo build loop")
}

/// Kills `child`'s process group (it leads one) and waits for it.
fn kill_group(child: &mut std::process::Child) {
    // SAFETY: a signal to a process group we made.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let _ = child.wait();
}

#[test]
fn report_stats_of_a_capture_names_the_crash_loop() {
    if !require_bpf() || !has_memory_v1() {
        return;
    }
    let _lock = exclusive();
    let (guard, _) = start_lab(&[]);
    let dir = TempDir::new("crashloop");
    let capture = dir.file("loop.capture");
    let rec = run_profiler(&["record", "-d", "8s", "-o", &capture], TIMEOUT);
    expect_success(&rec, "profiler record");
    let (log_starts, _) = read_log();
    drop(guard);
    let out = run_profiler(&["report", &capture, "--stats"], TIMEOUT);
    expect_success(&out, "profiler report --stats");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("crash_loop: crashy-agent"))
        .unwrap_or_else(|| panic!("no crash loop of crashy-agent in the stats"));
    // "... : N started (R/min), exits: M code 2; ... started by supervisor (pid P) ..."
    let started: usize = line
        .split(": ")
        .nth(2)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no start count in {line:?}"));
    assert!(started >= 8 && started <= log_starts.len(), "{line}");
    assert!(line.contains(" code 2;"), "{line}");
    assert!(!line.contains("unknown"), "{line}");
    assert!(line.contains("started by supervisor (pid "), "{line}");
}

#[test]
fn agent_metrics_count_the_loops_starts_and_failing_exits() {
    if !require_bpf() || !has_memory_v1() {
        return;
    }
    let _lock = exclusive();
    let (_guard, _) = start_lab(&[]);
    let dir = TempDir::new("crashloop-agent");
    let data = dir.file("data");
    let agent = Agent::start(&data, &["--window", "5s", "-F", "19"]);
    let start = std::time::Instant::now();
    let m = loop {
        let m = String::from_utf8_lossy(&agent.get("/metrics").1).into_owned();
        if metric_series(&m, "profiler_windows_total{outcome=\"stored\"}").unwrap_or(0.0) >= 2.0 {
            break m;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "fewer than 2 windows stored:\n{m}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let loops = metric_series(&m, "profiler_crash_loops").expect("profiler_crash_loops");
    let starts = metric_series(&m, "profiler_process_starts_total").expect("starts");
    let failing = metric_series(&m, "profiler_process_exits_total{reason=\"exit_nonzero\"}")
        .expect("exit_nonzero");
    eprintln!("crash loops {loops}, starts {starts}, failing exits {failing}");
    // The gauge is of the last window: the lab loops in every one.
    assert!(loops >= 1.0, "{m}");
    // Two 5 s windows of a loop restarting several times a second.
    assert!(failing >= 10.0 && starts >= failing, "{m}");
    for reason in ["exit_zero", "exit_nonzero", "signal", "unknown"] {
        assert!(m.contains(&format!(
            "profiler_process_exits_total{{reason=\"{reason}\"}}"
        )));
    }
}

fn uptime_s() -> f64 {
    std::fs::read_to_string("/proc/uptime")
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn a_network_watchdog_line_in_the_kernel_log_lands_on_the_doctors_timeline() {
    if !require_bpf() {
        return;
    }
    let _lock = exclusive();
    let doctor =
        std::thread::spawn(|| run_profiler(&["doctor", "--duration", "8s", "--json"], TIMEOUT));
    // Well inside the window, whatever the load time: the doctor reads the log from its start.
    std::thread::sleep(Duration::from_secs(5));
    let msg = format!(
        "NETDEV WATCHDOG: eth9 (profiler-test-{}): transmit queue 0 timed out 5000 ms",
        std::process::id()
    );
    let before = uptime_s();
    std::fs::write("/dev/kmsg", format!("<4>{msg}\n")).expect("write /dev/kmsg");
    let after = uptime_s();
    let out = doctor.join().unwrap();
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("{text}");
    let v = doctor_findings(&out);
    let e = v["kernel_events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["message"] == msg.as_str())
        .unwrap_or_else(|| panic!("our line is not among {}", v["kernel_events"]));
    assert_eq!(e["kind"], "network watchdog");
    // The record's own kernel timestamp (the monotonic clock /proc/uptime also reads here).
    let ts = e["ts_us"].as_f64().unwrap() / 1e6;
    assert!(
        ts >= before - 0.5 && ts <= after + 0.5,
        "logged at {ts}, written between {before} and {after}"
    );
    // On the profile's clock: inside the window.
    let offset = e["offset_s"].as_f64().unwrap();
    assert!(
        offset > 0.0 && offset < v["duration_s"].as_f64().unwrap(),
        "offset {offset}"
    );
    // Placed at its offset: after the saturated CPU run before it when there was one
    // ("2.0 s later (+4.7 s): ..."), else on its own ("+4.7 s: ... (no CPU saturated before
    // it)"); which one depends on what else this host ran, and the placement against a run is
    // unit-tested in doctor/kmsg.rs.
    let line = e["timeline"].as_str().unwrap();
    assert!(
        line.contains(&format!("(+{offset:.1} s): network watchdog: {msg}"))
            || (line.starts_with(&format!("+{offset:.1} s: network watchdog: {msg}"))
                && line.ends_with("(no CPU saturated before it)")),
        "{line}"
    );
    assert!(text.contains(line), "{line} not in the text");
    assert_ne!(v["verdict"], "healthy");
}
