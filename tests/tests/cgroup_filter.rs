//! `record --cgroup PATH`: only samples of tasks in that cgroup (or below) are kept, for a
//! cgroup2 path (filtered in the kernel) and a cgroup v1 memory path (filtered in userspace);
//! a cgroup that exists nowhere is one clear error before sampling starts.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use profiler_tests::{
    TempDir, cannot_run, exclusive, expect_success, head, read_folded, record, require_bpf, samples,
};

/// A cgroup made for this test in the v1 memory hierarchy and in cgroup2, where each exists
/// (`/sys/fs/cgroup/unified` on hybrid hosts, `/sys/fs/cgroup` on unified ones); removed on
/// drop.
struct TestCgroup {
    /// The v1 memory directory, if made.
    memory: Option<String>,
    /// The cgroup2 directory, if made.
    v2: Option<String>,
    /// Name relative to each hierarchy's root, `/profiler-cgfilter-PID`.
    name: String,
}

impl TestCgroup {
    fn new() -> Self {
        let name = format!("/profiler-cgfilter-{}", std::process::id());
        let make = |root: &str| {
            let dir = format!("{root}{name}");
            (Path::new(root).join("cgroup.procs").exists() && std::fs::create_dir(&dir).is_ok())
                .then_some(dir)
        };
        let memory = make("/sys/fs/cgroup/memory");
        let v2 = make("/sys/fs/cgroup/unified").or_else(|| make("/sys/fs/cgroup"));
        assert!(
            memory.is_some() || v2.is_some(),
            "could not create a test cgroup anywhere"
        );
        Self { memory, v2, name }
    }

    fn dirs(&self) -> impl Iterator<Item = &String> {
        self.memory.iter().chain(&self.v2)
    }

    /// fx-chain, moved into every test cgroup before it execs.
    fn spawn_inside(&self) -> Running {
        let moves: String = self
            .dirs()
            .map(|d| format!("echo $$ > {d}/cgroup.procs && "))
            .collect();
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("{moves}exec \"$0\" \"$@\""))
            .arg(env!("FIXTURE_FX_CHAIN"))
            .arg("120")
            .stdout(Stdio::null())
            .spawn()
            .expect("start fx-chain in the test cgroup");
        Running::new(child)
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for d in self.dirs() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// A fixture, killed and reaped on drop; created once it has exec'd fx-chain.
struct Running(Child);

impl Running {
    fn new(child: Child) -> Self {
        let comm = format!("/proc/{}/comm", child.id());
        for _ in 0..500 {
            if std::fs::read_to_string(&comm).is_ok_and(|c| c.trim_end() == "fx-chain") {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Self(child)
    }

    fn root(&self) -> String {
        format!("fx-chain [{}]", self.0.id())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn cgroup_filter_keeps_only_the_cgroup() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("cgroup-filter");
    let cg = TestCgroup::new();
    let inside = cg.spawn_inside();
    let outside = Running::new(
        Command::new(env!("FIXTURE_FX_CHAIN"))
            .arg("120")
            .stdout(Stdio::null())
            .spawn()
            .expect("start fx-chain outside"),
    );

    // Per pid: (samples rooted at inside, at outside, total fx-chain samples).
    let record_by_pid = |filter: &[&str], name: &str| {
        let out = dir.file(&format!("{name}.folded"));
        let args = [
            filter,
            &[
                "--comm",
                "fx-chain",
                // ~1,000 samples of a fixture with a CPU to itself: enough for the > 20 below
                // when other work leaves it a tenth of a CPU.
                "-F",
                "499",
                "--group-by",
                "pid",
                "-d",
                "2s",
                "-o",
                &out,
            ],
        ]
        .concat();
        let run = record(&args);
        expect_success(&run, &format!("record {args:?}"));
        let (text, stacks) = read_folded(Path::new(&out));
        let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
        let (i, o) = (inside.root(), outside.root());
        let counts = (
            samples(&stacks, |f| f[0] == i),
            samples(&stacks, |f| f[0] == o),
            samples(&stacks, |_| true),
        );
        (counts, format!("{stderr}\n{}", head(&text, 10)))
    };

    // Unfiltered, both fixtures have samples: the filter below has something to remove.
    let ((i, o, _), why) = record_by_pid(&[], "all");
    assert!(
        i > 20 && o > 20,
        "unfiltered: inside {i}, outside {o}; {why}"
    );

    // A hierarchy this host lacks drops its cases: say which, and fail under CI=true.
    if cg.v2.is_none() {
        cannot_run(
            "the cgroup2 cases (filtered in the kernel, and v1+v2 mixed): no cgroup2 mount where a test cgroup could be made",
        );
    }
    if cg.memory.is_none() {
        cannot_run(
            "the cgroup v1 cases (filtered in userspace, and v1+v2 mixed): no v1 memory hierarchy at /sys/fs/cgroup/memory where a test cgroup could be made",
        );
    }
    let mut cases: Vec<(String, &str)> = Vec::new();
    if let Some(v2) = &cg.v2 {
        cases.push((v2.clone(), "filtered in the kernel"));
        // Relative to the hierarchy: found in cgroup2 first.
        cases.push((cg.name.clone(), "filtered in the kernel"));
    }
    if let Some(memory) = &cg.memory {
        cases.push((memory.clone(), "filtered in userspace"));
    }
    let mut cases: Vec<(Vec<&str>, &str)> = cases
        .iter()
        .map(|(path, how)| (vec!["--cgroup", path.as_str()], *how))
        .collect();
    // v1 and v2 mixed: both are filtered in userspace, either keeps a sample.
    if let (Some(v2), Some(memory)) = (&cg.v2, &cg.memory) {
        cases.push((
            vec!["--cgroup", v2, "--cgroup", memory],
            "filtered in userspace",
        ));
    }
    for (n, (filter, how)) in cases.iter().enumerate() {
        let path = filter.join(" ");
        let ((i, o, total), why) = record_by_pid(filter, &format!("case{n}"));
        assert!(
            i > 20 && o == 0 && i == total,
            "{path}: inside {i}, outside {o}, of {total}; {why}"
        );
        assert!(why.contains(how), "{path} is not {how}: {why}");
    }
}

#[test]
fn a_missing_cgroup_is_an_error_before_sampling() {
    let dir = TempDir::new("cgroup-missing");
    let out = dir.file("x.folded");
    let missing = "/profiler-no-such-cgroup/xyz";
    let run = record(&["--cgroup", missing, "-d", "1s", "-o", &out]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "record succeeded: {stderr}");
    assert!(
        stderr.contains(&format!("no cgroup named {missing} under /sys/fs/cgroup"))
            && stderr.contains("list them with")
            && stderr.trim_end().lines().count() == 1
            && !stderr.contains("sampling"),
        "unexpected error: {stderr}"
    );
    assert!(!Path::new(&out).exists(), "an output was written");
}
