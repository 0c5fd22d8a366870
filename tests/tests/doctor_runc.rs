//! The doctor and the agent against a real container runtime: Debian's `runc`, run in a
//! loop by a shell supervisor (`zsuper`) as Docker restarts a failing container: a new
//! container each attempt, with a new id and, as Docker's cgroupfs driver does, a new cgroup
//! `/profiler-test/<64 hex>` in every hierarchy, made and removed by that attempt's
//! short-lived `runc`; or one container re-created in the same cgroup. Its program, `zagent`,
//! exits with status 2. Both must find one crash loop: the program, its status, its restart
//! rate against the supervisor's own log, the supervisor above the runcs, the cgroup place
//! and the churn it causes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use profiler_tests::{
    Agent, TempDir, doctor_findings, doctor_problem, exclusive, expect_success, metric_series,
    require_bpf, run_profiler, tool,
};
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(180);
/// Where the containers' cgroups are made, in every hierarchy (Docker's is `/docker`).
const PARENT: &str = "/profiler-test";
/// The in-place case's one container cgroup.
const IN_PLACE_CGROUP: &str = "/profiler-test/in-place";

/// The supervisor: a new 64-hex container id per attempt, its cgroup path written into the
/// bundle's config (`@ID@` in config.in), each start and exit logged with CLOCK_REALTIME ns
/// (`date`), until `stop` appears.
const SUPERVISOR: &str = r#"#!/bin/sh
# zsuper: restarts zagent in a new runc container each time, as a container runtime does
dir=$1
while [ ! -e "$dir/stop" ]; do
    id=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
    sed "s/@ID@/$id/" "$dir/config.in" > "$dir/bundle/config.json"
    echo "start $(date +%s%N)" >> "$dir/log"
    runc --root "$dir/state" run --bundle "$dir/bundle" "$id" < /dev/null > /dev/null 2>&1
    echo "exit $? $(date +%s%N)" >> "$dir/log"
    sleep 0.1
done
"#;

/// The container's program: fails at once.
const PROGRAM: &str = "#!/bin/sh\nexit 2\n";

/// The supervisor and its runc containers, stopped on drop.
struct RuncLab {
    dir: TempDir,
    supervisor: Child,
}

impl RuncLab {
    /// A bundle whose root is a static busybox and `zagent`; with `cgroup`, every container
    /// is made in that one cgroup (`cgroupsPath`), else in `PARENT/<its id>`.
    fn start(runc: &Path, cgroup: Option<&str>) -> RuncLab {
        let dir = TempDir::new("runc-lab");
        let bundle = dir.path().join("bundle");
        let bin = bundle.join("rootfs/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::copy("/bin/busybox", bin.join("busybox")).expect("a static /bin/busybox");
        std::os::unix::fs::symlink("busybox", bin.join("sh")).unwrap();
        write_executable(&bundle.join("rootfs/zagent"), PROGRAM);
        let spec = Command::new(runc)
            .args(["spec", "--bundle"])
            .arg(&bundle)
            .output()
            .unwrap();
        expect_success(&spec, "runc spec");
        let path = bundle.join("config.json");
        let mut config: Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).expect("runc spec's JSON");
        config["process"]["terminal"] = false.into();
        config["process"]["args"] = serde_json::json!(["/zagent"]);
        config["root"]["readonly"] = true.into();
        config["linux"]["cgroupsPath"] = cgroup
            .map_or(format!("{PARENT}/@ID@"), str::to_owned)
            .into();
        std::fs::write(
            dir.path().join("config.in"),
            serde_json::to_vec(&config).unwrap(),
        )
        .unwrap();
        let script = dir.path().join("zsuper");
        write_executable(&script, SUPERVISOR);
        let supervisor = Command::new(&script)
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("starting the supervisor");
        let lab = RuncLab { dir, supervisor };
        // Running: at least two attempts logged.
        let start = Instant::now();
        while lab.log().0.len() < 2 {
            assert!(start.elapsed() < TIMEOUT, "runc started no container");
            std::thread::sleep(Duration::from_millis(100));
        }
        lab
    }

    /// The supervisor's log: (start ns) per attempt, and the attempts' exit statuses.
    fn log(&self) -> (Vec<u64>, Vec<u32>) {
        let text = std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default();
        let mut starts = Vec::new();
        let mut exits = Vec::new();
        for l in text.lines() {
            match l.split(' ').collect::<Vec<_>>().as_slice() {
                ["start", ns] => starts.extend(ns.parse::<u64>().ok()),
                ["exit", status, _] => exits.extend(status.parse::<u32>().ok()),
                _ => {}
            }
        }
        (starts, exits)
    }

    /// Starts a minute by the supervisor's own log, over the attempts from `since_ns` on.
    fn rate_since(&self, since_ns: u64) -> f64 {
        let (starts, _) = self.log();
        let span: Vec<u64> = starts.into_iter().filter(|t| *t >= since_ns).collect();
        assert!(span.len() >= 10, "only {} attempts logged", span.len());
        (span.len() - 1) as f64 * 60e9 / (span[span.len() - 1] - span[0]) as f64
    }
}

impl Drop for RuncLab {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.path().join("stop"), "");
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.supervisor.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.supervisor.kill();
        let _ = self.supervisor.wait();
        // runc leaves the parent it made in each hierarchy (as Docker's `/docker` stays).
        for mount in cgroup_mounts() {
            let parent = mount.join(PARENT.trim_start_matches('/'));
            let _ = std::fs::remove_dir(parent.join("in-place"));
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// Every mounted cgroup hierarchy's root.
fn cgroup_mounts() -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mounts
        .lines()
        .filter(|l| l.contains(" - cgroup ") || l.contains(" - cgroup2 "))
        .filter_map(|l| l.split(' ').nth(4).map(PathBuf::from))
        .collect()
}

fn write_executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// `doctor --json` for `duration` with the lab running: (its JSON, its text report, when it
/// started in CLOCK_REALTIME ns).
fn doctor(duration: &str) -> (Value, String, u64) {
    let since = realtime_ns();
    let out = run_profiler(&["doctor", "--duration", duration, "--json"], TIMEOUT);
    let json = doctor_findings(&out);
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("{text}");
    (json, text, since)
}

/// The one crash loop of zagent among `programs` (there is exactly one object for it).
fn zagent_loop(programs: &Value) -> &Value {
    let zagent: Vec<&Value> = programs
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["comm"] == "zagent")
        .collect();
    assert_eq!(zagent.len(), 1, "one program for zagent: {programs}");
    assert_eq!(zagent[0]["crash_loop"], true, "{}", zagent[0]);
    zagent[0]
}

/// What a crash loop under the supervisor says of itself, wherever it is reported: its
/// status, its starters (one runc per attempt) and its supervisor.
fn check_loop(p: &Value, place: &str, supervisor: u32) {
    assert_eq!(p["cgroup"], place, "{p}");
    assert_eq!(p["failing_status"], "code 2", "{p}");
    assert_eq!(p["supervisor"]["pid"], supervisor, "{p}");
    assert_eq!(p["supervisor"]["comm"], "zsuper", "{p}");
    // Every starter is a runc; one that started before the window and is gone by its end
    // may have no name the records or /proc can give.
    let parents = p["parents"].as_array().unwrap();
    let unnamed = parents.iter().filter(|s| s["comm"] == "").count();
    assert!(
        unnamed <= 1
            && parents
                .iter()
                .all(|s| s["comm"] == "runc" || s["comm"] == ""),
        "{p}"
    );
}

/// The doctor's restart rate within 10% of the supervisor's own count, every attempt in a
/// new cgroup (`per_attempt`) or all in one, and its churn charged to the supervisor through
/// its runcs, with an alarm naming the loop.
fn check_doctor(lab: &RuncLab, per_attempt: bool) {
    let (v, text, since) = doctor("15s");
    let supervisor = lab.supervisor.id();
    let place = if per_attempt {
        format!("{PARENT}/*")
    } else {
        IN_PLACE_CGROUP.to_owned()
    };
    let p = zagent_loop(&v["programs"]);
    check_loop(p, &place, supervisor);
    let starts = p["starts"].as_u64().unwrap();
    let seen = p["cgroups_seen"].as_u64().unwrap();
    if per_attempt {
        assert!(seen + 1 >= starts && seen <= starts + 1, "{p}");
    } else {
        assert_eq!(seen, 1, "{p}");
    }
    let rate = p["starts_per_min"].as_f64().unwrap();
    let logged = lab.rate_since(since);
    eprintln!("{starts} starts: doctor {rate:.1}/min, the supervisor's log {logged:.1}/min");
    assert!(
        (rate - logged).abs() <= logged * 0.10,
        "doctor says {rate:.1}/min, the supervisor's log {logged:.1}/min"
    );
    let (_, exits) = lab.log();
    assert!(exits.iter().all(|s| *s == 2), "runc exits {exits:?}");
    let creator = &p["creator"];
    assert_eq!(
        creator["pid"], supervisor,
        "the churn is the supervisor's: {p}"
    );
    assert!(
        creator["via"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["comm"] == "runc"),
        "{creator}"
    );
    assert!(
        creator["mkdirs"].as_u64().unwrap() + 2 >= starts,
        "{creator}"
    );
    assert_eq!(v["verdict"], "alarm");
    doctor_problem(&v, "crash loop: zagent");
    let how = if per_attempt {
        format!("restarts it in a new cgroup under {PARENT} each time: ")
    } else {
        "restarts it making its cgroup anew each time: ".to_owned()
    };
    for part in [
        format!("CRASH LOOP: zagent (/bin/busybox) in cgroup {place}"),
        format!("started by runc ({starts} processes) under zsuper (pid {supervisor})"),
        format!("zsuper (pid {supervisor}) {how}"),
    ] {
        assert!(text.contains(&part), "{part:?} not in the report");
    }
}

/// The agent groups the loop as the doctor does (by cgroup place: it traces cgroup moves)
/// in /api/programs and its crash-loop metrics.
fn check_agent(place: &str, supervisor: u32) {
    let dir = TempDir::new("runc-agent");
    let agent = Agent::start(&dir.file("data"), &["--window", "5s", "-F", "19"]);
    // The first window may hold an attempt that was moved into its cgroup before the agent
    // started: the programs of a later one.
    let start = Instant::now();
    let programs = loop {
        let metrics = String::from_utf8_lossy(&agent.get("/metrics").1).into_owned();
        let cut =
            metric_series(&metrics, "profiler_windows_total{outcome=\"stored\"}").unwrap_or(0.0);
        let (status, body) = agent.get("/api/programs");
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let v: Value = serde_json::from_slice(&body).expect("/api/programs is JSON");
        if cut >= 2.0 {
            assert_eq!(v["grouped_by"], "cgroup", "{v}");
            break v["programs"].clone();
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "fewer than 2 windows stored: {v}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    check_loop(zagent_loop(&programs), place, supervisor);
    let metrics = String::from_utf8_lossy(&agent.get("/metrics").1).into_owned();
    let series = format!(
        "profiler_crash_loop_starts_per_minute{{comm=\"zagent\",exe=\"/bin/busybox\",cgroup=\"{place}\",status=\"code 2\"}} "
    );
    assert!(
        metrics.lines().any(|l| l.starts_with(&series)),
        "{series:?} not in /metrics"
    );
}

fn runc() -> Option<PathBuf> {
    if !require_bpf() {
        return None;
    }
    tool("runc", "runc")
}

#[test]
fn a_new_container_per_attempt_is_one_crash_loop_under_its_supervisor() {
    let Some(runc) = runc() else { return };
    let _lock = exclusive();
    let lab = RuncLab::start(&runc, None);
    check_doctor(&lab, true);
    check_agent(&format!("{PARENT}/*"), lab.supervisor.id());
}

#[test]
fn a_container_recreated_in_its_cgroup_is_one_crash_loop() {
    let Some(runc) = runc() else { return };
    let _lock = exclusive();
    let lab = RuncLab::start(&runc, Some(IN_PLACE_CGROUP));
    check_doctor(&lab, false);
}
