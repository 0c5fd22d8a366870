//! `profiler doctor` against the zombie-memcg lab (`profiler-lab zombie`, the code behind
//! `cargo xtask lab zombie`) and on the host as it is. The lab runs while the doctor watches,
//! so the churn tracer sees it create the cgroups, and its `kubelet` poller is profiled.

use std::thread;
use std::time::Duration;

use profiler_tests::{
    doctor_findings, exclusive, expect_success, require_bpf, run_profiler, run_program,
};
use serde_json::Value;

const LAB_COUNT: u64 = 500;
const TIMEOUT: Duration = Duration::from_secs(180);

/// `profiler-lab ARGS` (the lab is test support, not a command of the profiler).
fn run_lab(args: &[&str]) -> std::process::Output {
    run_program(
        std::path::Path::new(env!("CARGO_BIN_EXE_profiler-lab")),
        args,
        TIMEOUT,
    )
}

fn memory_num_cgroups() -> u64 {
    let text = std::fs::read_to_string("/proc/cgroups").unwrap();
    text.lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&"memory")).then(|| f[2].parse().unwrap())
        })
        .expect("memory line in /proc/cgroups")
}

fn has_memory_v1() -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let found = mounts
        .lines()
        .any(|l| l.contains(" - cgroup ") && l.split(',').any(|o| o == "memory"));
    // Under CI=true this fails rather than passing with nothing tested; the cgroup2 case
    // runs in the kernel matrix (`doctor-v2` in xtask/src/kernels/init.sh).
    found || profiler_tests::cannot_run("no v1 memory cgroup hierarchy on this host")
}

/// Undoes the lab even when an assertion fails, so no poller keeps burning a CPU.
struct LabGuard;

impl Drop for LabGuard {
    fn drop(&mut self) {
        let _ = run_lab(&["zombie", "--cleanup"]);
    }
}

fn memory_dying(v: &Value) -> u64 {
    v["controllers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["controller"] == "memory")
        .expect("memory controller in the findings")["dying"]
        .as_u64()
        .unwrap()
}

#[test]
fn doctor_finds_the_zombie_lab_and_cleanup_restores() {
    if !require_bpf() || !has_memory_v1() {
        return;
    }
    let _lock = exclusive();
    let _ = run_lab(&["zombie", "--cleanup"]);
    let baseline = memory_num_cgroups();
    let guard = LabGuard;
    let doctor = thread::spawn(|| run_profiler(&["doctor", "--duration", "8s", "--json"], TIMEOUT));
    // Let the doctor attach its tracers; the lab then runs inside its window.
    thread::sleep(Duration::from_secs(2));
    let lab = run_lab(&["zombie", "--count", &LAB_COUNT.to_string()]);
    expect_success(&lab, "profiler-lab zombie");
    eprintln!("lab: {}", String::from_utf8_lossy(&lab.stdout));
    let out = doctor.join().unwrap();
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("{text}");
    let v = doctor_findings(&out);

    let dying = memory_dying(&v);
    assert!(
        dying * 100 >= LAB_COUNT * 95,
        "only {dying} dying memcgs counted"
    );
    assert_eq!(v["verdict"], "alarm");
    // The verdict's holder: the cache holder under which the churning process made cgroups.
    let holder = v["holder"].as_str().unwrap_or("");
    assert!(holder.ends_with("/profiler-lab"), "holder {holder:?}");
    let kubelet = v["memcg"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["comm"] == "kubelet")
        .expect("kubelet among the processes in memcg code");
    let stats_fns = [
        "memory_stat_show",
        "memcg1_stat_format",
        "memcg_numa_stat_show",
    ];
    let fns: Vec<&str> = kubelet["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["function"].as_str().unwrap())
        .collect();
    assert!(
        fns.iter().any(|f| stats_fns.contains(f)),
        "kubelet's memcg functions: {fns:?}"
    );
    let creator = v["churn"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["comm"] == "profiler-lab" && c["mkdirs"].as_u64().unwrap() >= LAB_COUNT)
        .unwrap_or_else(|| panic!("the lab is not named as creator: {}", v["churn"]));
    assert!(creator["rmdirs"].as_u64().unwrap() >= LAB_COUNT);
    assert_eq!(
        creator["parents"][0]["path"], "/profiler-lab",
        "the churn tracer names where the lab makes its cgroups"
    );

    // The text shows the same figures as the JSON.
    assert!(text.starts_with("verdict: alarm"), "{text}");
    assert!(
        text.contains(&format!("memory     {dying:>6} dying")),
        "{dying} not in the text"
    );
    // The JSON carries the share to 0.1 (42.5 for a true 42.54), the text to 1 (43): the
    // text's figure is the rounding of some value within 0.05 of the JSON's, not the
    // rounding of the JSON's (which gave 42 against the text's 43 once).
    let percent = kubelet["percent"].as_f64().unwrap();
    let function = kubelet["top_function"].as_str().unwrap();
    let lines: Vec<String> = [percent - 0.05, percent, percent + 0.05]
        .iter()
        .map(|p| format!("kubelet: {p:.0}% of its CPU in {function}"))
        .collect();
    assert!(
        lines.iter().any(|line| text.contains(line)),
        "none of {lines:?} in the text"
    );
    assert!(text.contains(&format!("{holder}/memory.force_empty")));

    let cleanup = run_lab(&["zombie", "--cleanup"]);
    expect_success(&cleanup, "profiler-lab zombie --cleanup");
    let said = String::from_utf8_lossy(&cleanup.stdout).into_owned();
    eprintln!("cleanup: {said}");
    std::mem::forget(guard);
    // "memory num_cgroups: BEFORE -> AFTER (...)": the lab's memcgs (and its parent) are freed.
    let nums: Vec<u64> = said
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    let (before_cleanup, after) = (nums[0], nums[1]);
    assert!(
        before_cleanup.saturating_sub(after) * 100 >= LAB_COUNT * 95,
        "cleanup freed only {before_cleanup} -> {after}"
    );
    // Back to the baseline, within the host's own trickle: other processes on a shared
    // machine leave dying memcgs too while the test runs (about one a second was seen).
    let after_now = memory_num_cgroups();
    assert!(
        after_now <= baseline + 60,
        "num_cgroups {after_now} after cleanup, {baseline} before the lab"
    );
}

#[test]
fn doctor_on_the_host_raises_no_alarm() {
    if !require_bpf() {
        return;
    }
    let _lock = exclusive();
    let out = run_profiler(&["doctor", "--duration", "3s", "--json"], TIMEOUT);
    let text = String::from_utf8_lossy(&out.stderr);
    eprintln!("{text}");
    let v = doctor_findings(&out);
    assert_ne!(v["verdict"], "alarm", "{text}");
    assert!(v["memcg_functions_present"].as_array().unwrap().len() >= 3);
    assert!(text.starts_with(&format!("verdict: {}", v["verdict"].as_str().unwrap())));
}
