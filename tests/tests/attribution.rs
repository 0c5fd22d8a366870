//! Attribution: samples land in the right cgroup and group (`--group-by`), and short-lived
//! processes are symbolized although they exit long before the recording ends.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use profiler_tests::{
    TempDir, cannot_run, exclusive, expect_success, head, is_kernel, profiler_bin, read_folded,
    record, report, require_bpf, samples, wait_timeout,
};

/// A cgroup made for one test in every hierarchy where the test can make one (v1 memory, and
/// cgroup2 when mounted), removed on drop.
struct TestCgroup {
    dirs: Vec<String>,
    name: String,
}

impl TestCgroup {
    fn new() -> Self {
        let name = format!("profiler-test-{}", std::process::id());
        let mut dirs = Vec::new();
        for root in [
            "/sys/fs/cgroup/memory",
            "/sys/fs/cgroup/unified",
            "/sys/fs/cgroup",
        ] {
            let is_cgroup = Path::new(root).join("cgroup.procs").exists();
            let dir = format!("{root}/{name}");
            if is_cgroup && std::fs::create_dir(&dir).is_ok() {
                dirs.push(dir);
            }
        }
        assert!(!dirs.is_empty(), "could not create a test cgroup anywhere");
        // The fixture runs in both hierarchies where both exist; a missing one narrows what
        // `--group-by cgroup` is tested with: say so, and fail under CI=true.
        if !dirs.iter().any(|d| !d.starts_with("/sys/fs/cgroup/memory")) {
            cannot_run(
                "--group-by cgroup with a cgroup2 path: no cgroup2 mount where a test cgroup could be made",
            );
        }
        if !dirs.iter().any(|d| d.starts_with("/sys/fs/cgroup/memory")) {
            cannot_run(
                "a process in a v1 memory cgroup as well: no v1 memory hierarchy at /sys/fs/cgroup/memory",
            );
        }
        Self { dirs, name }
    }

    /// `sh` that moves itself into every test cgroup, then execs `program args`.
    fn command(&self, program: &str, args: &[&str]) -> Command {
        let moves: String = self
            .dirs
            .iter()
            .map(|d| format!("echo $$ > {d}/cgroup.procs && "))
            .collect();
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("{moves}exec \"$0\" \"$@\""))
            .arg(program)
            .args(args);
        cmd
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for d in &self.dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[test]
fn cgroup_attribution_and_group_by() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("attribution");
    let cg = TestCgroup::new();
    let mut child = cg
        .command(env!("FIXTURE_FX_CHAIN"), &["120"])
        .stdout(Stdio::null())
        .spawn()
        .expect("start fx-chain in the test cgroup");
    // Wait for the exec, so the recording sees comm fx-chain.
    let pid = child.id().to_string();
    let fixture = spawn_guard(&mut child);
    let capture = dir.file("x.capture");
    expect_success(
        // By pid: another fx-chain on the machine (another test run) is in another cgroup.
        &record(&["--pid", &pid, "-d", "2s", "-o", &capture]),
        "record",
    );

    let folded_by = |group: &str| {
        let out = dir.file(&format!("{group}.folded"));
        expect_success(
            &report(&[&capture, "--group-by", group, "-o", &out]),
            "report",
        );
        read_folded(Path::new(&out))
    };
    let want = format!("/{}", cg.name);
    for (group, root) in [
        ("cgroup", want.as_str()),
        ("pid", &format!("fx-chain [{pid}]")),
        ("container", "[host]"),
        ("pod", "[no pod]"),
        ("comm", "fx-chain"),
    ] {
        let (text, stacks) = folded_by(group);
        let total = samples(&stacks, |_| true);
        let rooted = samples(&stacks, |f| f[0] == root);
        assert!(
            total > 20 && rooted == total,
            "--group-by {group}: {rooted} of {total} rooted at {root}; {}",
            head(&text, 10)
        );
    }
    let (text, stacks) = folded_by("none");
    let total = samples(&stacks, |_| true);
    // As many samples as under the comm root, none rooted at it: an empty output fails.
    let (_, by_comm) = folded_by("comm");
    let comm_total = samples(&by_comm, |_| true);
    assert!(
        total > 20 && total == comm_total,
        "--group-by none has {total} samples, --group-by comm {comm_total}: {}",
        head(&text, 5)
    );
    assert!(
        samples(&stacks, |f| f[0] != "fx-chain"
            && f.iter().any(|x| x == "c"))
            == total,
        "--group-by none keeps a comm root: {}",
        head(&text, 5)
    );
    drop(fixture);
}

/// Kills and reaps `child` on drop; waits until it has exec'd the fixture.
fn spawn_guard(child: &mut Child) -> impl Drop + '_ {
    let comm = format!("/proc/{}/comm", child.id());
    for _ in 0..500 {
        if std::fs::read_to_string(&comm).is_ok_and(|c| c.trim_end() == "fx-chain") {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    struct Guard<'a>(&'a mut Child);
    impl Drop for Guard<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    Guard(child)
}

#[test]
fn short_lived_processes_are_symbolized() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("short-lived");
    let out = dir.file("short.folded");
    let mut profiler = Command::new(profiler_bin())
        .args([
            "record", "--comm", "fx-chain", "-F", "999", "-d", "120s", "-o", &out,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("start profiler");
    // Start the processes once sampling has begun (the profiler says so on stderr).
    let mut lines = BufReader::new(profiler.stderr.take().unwrap()).lines();
    let started = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.starts_with("sampling"));
    assert!(started, "profiler did not start sampling");
    let drain = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());

    // 120 processes, two at a time (one per CPU here), each burning 100 ms of CPU in c():
    // CPU time, not wall time, so that on a busy machine c() keeps its share of each run.
    for _ in 0..60 {
        let pair: Vec<Child> = (0..2)
            .map(|_| {
                Command::new(env!("FIXTURE_FX_CHAIN"))
                    .arg("0.1")
                    .env("FIXTURE_CLOCK", "cpu")
                    .spawn()
                    .expect("start fx-chain")
            })
            .collect();
        for mut child in pair {
            assert!(child.wait().expect("wait fx-chain").success());
        }
    }
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(profiler.id() as i32, libc::SIGINT) };
    let status =
        wait_timeout(&mut profiler, Duration::from_secs(60)).expect("profiler exits after SIGINT");
    let stderr = drain.join().unwrap().join("\n");
    assert!(status.success(), "profiler failed: {stderr}");

    let (text, stacks) = read_folded(Path::new(&out));
    let total = samples(&stacks, |f| f[0] == "fx-chain");
    let in_c = samples(&stacks, |f| {
        f[0] == "fx-chain" && f.iter().any(|x| x == "c")
    });
    eprintln!("short-lived: {in_c} of {total} samples resolve to c");
    assert!(
        total >= 1000,
        "only {total} samples of 120 short processes; {stderr}\n{}",
        head(&text, 20)
    );
    assert!(
        in_c * 100 >= total * 95,
        "only {in_c} of {total} samples resolve to c; {}",
        head(&text, 30)
    );
    // What the design guarantees: the kernel reports each mapping before the process can run
    // code in it, so in every sample with fixture frames the fixture's frames are named: from
    // the outermost fixture frame to the innermost, no `[unknown]` and no bare
    // `fx-chain+0x..` offset, in call order. (The frame-pointer walk may skip a caller when a
    // sample lands on a function's first instruction, before its frame is set up: main;a;c.
    // That is the unwinder's business, not symbolization's. Below c, the vDSO has no file.)
    let chain = ["main", "a", "b", "c"];
    let unnamed = samples(&stacks, |f| {
        let user: Vec<&str> = f[1..]
            .iter()
            .map(String::as_str)
            .filter(|x| !is_kernel(x))
            .collect();
        let (Some(first), Some(last)) = (
            user.iter().position(|x| chain.contains(x)),
            user.iter().rposition(|x| chain.contains(x)),
        ) else {
            return false;
        };
        let mut order = user
            .iter()
            .filter_map(|x| chain.iter().position(|c| c == x));
        let in_order = order
            .try_fold(None, |prev, i| match prev {
                Some(p) if p >= i => Err(()),
                _ => Ok(Some(i)),
            })
            .is_ok();
        f[0] == "fx-chain"
            && (!in_order
                || user[first..=last]
                    .iter()
                    .any(|x| *x == "[unknown]" || x.starts_with("fx-chain+")))
    });
    assert_eq!(
        unnamed,
        0,
        "{unnamed} samples have fixture frames missing or unnamed; {}",
        head(&text, 30)
    );
}
