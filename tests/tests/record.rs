//! The real profiler on fixtures with known call chains. Each test needs BPF (it skips with a
//! reason outside CI), starts its fixture first, then records a few seconds of it.

use std::path::Path;
use std::time::Duration;

use profiler_tests::{
    CpuUsage, Fixture, Running, Stack, TempDir, cpu_seconds, exclusive, expect_success, has_chain,
    head, is_kernel, read_folded, record, report, require_bpf, samples, spawn_fixture, svg_frames,
    tool,
};

/// Fixture lifetime: a backstop (each is killed when its test is done), far longer than a
/// test takes on a slow, busy machine.
const FIXTURE_SECS: u64 = 120;

fn c_fixture(path: &str) -> Fixture {
    spawn_fixture(Path::new(path), FIXTURE_SECS)
}

fn rust_fixture() -> Fixture {
    spawn_fixture(Path::new(env!("CARGO_BIN_EXE_fixture-rust")), FIXTURE_SECS)
}

/// `profiler record <args> -o <dir>/out.folded` (default duration 3 s unless `args` has one),
/// returning the folded text and its parsed stacks.
fn record_folded(dir: &TempDir, args: &[&str]) -> (String, Vec<Stack>) {
    let out = dir.file("out.folded");
    let mut full: Vec<&str> = args.to_vec();
    if !args.iter().any(|a| *a == "-d" || *a == "--duration") {
        full.extend(["-d", "3s"]);
    }
    full.extend(["-o", &out]);
    expect_success(&record(&full), &format!("profiler record {full:?}"));
    read_folded(Path::new(&out))
}

/// Among the samples whose root is `comm`: at least `min` (and 50) in total, and at least 80%
/// with `chain` as an ordered subsequence of their frames.
fn assert_chain(
    text: &str,
    stacks: &[Stack],
    comm: &str,
    chain: &[&str],
    ends_with: bool,
    min: f64,
) {
    let matches = |frame: &str, want: &str| {
        if ends_with {
            frame.ends_with(want)
        } else {
            frame == want
        }
    };
    let total = samples(stacks, |f| f[0] == comm);
    let chained = samples(stacks, |f| f[0] == comm && has_chain(f, chain, matches));
    eprintln!("{comm}: {chained} of {total} samples have {chain:?}");
    assert!(
        total >= 50 && total as f64 >= min,
        "only {total} samples of {comm}, expected {min:.0} from the CPU it used; {}",
        head(text, 40)
    );
    assert!(
        chained * 100 >= total * 80,
        "only {chained} of {total} samples of {comm} have the chain {chain:?}; {}",
        head(text, 40)
    );
}

#[test]
fn c_chain_main_a_b_c() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("c-chain");
    let fixture = c_fixture(env!("FIXTURE_FX_CHAIN"));
    let usage = CpuUsage::start(fixture.pid());
    let (text, stacks) = record_folded(&dir, &["--comm", "fx-chain", "-F", "499"]);
    // Lower bound only: another fx-chain on the machine would add samples under this comm.
    let (min, _) = usage.sample_band(499.0, 3.0);
    let chain = ["main", "a", "b", "c"];
    assert_chain(&text, &stacks, "fx-chain", &chain, false, min);
}

#[test]
fn rust_chain_outer_middle_inner() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("rust-chain");
    let fixture = rust_fixture();
    let usage = CpuUsage::start(fixture.pid());
    let (text, stacks) = record_folded(&dir, &["--comm", "fixture-rust", "-F", "499"]);
    let (min, _) = usage.sample_band(499.0, 3.0);
    let chain = ["rust_outer", "rust_middle", "rust_inner"];
    assert_chain(&text, &stacks, "fixture-rust", &chain, true, min);
}

#[test]
fn syscall_stacks_have_kernel_frames() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("syscall");
    let fixture = c_fixture(env!("FIXTURE_FX_SYSCALL"));
    let usage = CpuUsage::start(fixture.pid());
    // 999 Hz for 3 s: at the default 99 Hz, under a load of 22 fx-syscall got 29 samples, too
    // few for the floor of 50. The band is a lower bound only (the comm is not unique).
    let (text, stacks) = record_folded(&dir, &["--comm", "fx-syscall", "-F", "999"]);
    let (min, _) = usage.sample_band(999.0, 3.0);
    let entry = |f: &String| f.starts_with("entry_SYSCALL") && is_kernel(f);
    let read = |f: &String| f == "__x64_sys_read_[k]" || f == "ksys_read_[k]";
    let mine: Vec<&Stack> = stacks
        .iter()
        .filter(|(f, _)| f[0] == "fx-syscall")
        .collect();
    assert!(
        mine.iter()
            .any(|(f, _)| f.iter().any(entry) && f.iter().any(read)),
        "no fx-syscall stack has both entry_SYSCALL*_[k] and __x64_sys_read_[k] or \
         ksys_read_[k]; {}",
        head(&text, 40)
    );
    let total = samples(&stacks, |f| f[0] == "fx-syscall");
    let kernel = samples(&stacks, |f| {
        f[0] == "fx-syscall" && f.iter().any(|x| is_kernel(x))
    });
    eprintln!("fx-syscall: {kernel} of {total} samples have kernel frames");
    assert!(
        total >= 50 && total as f64 >= min,
        "only {total} samples of fx-syscall, expected {min:.0} from the CPU it used; {}",
        head(&text, 40)
    );
    assert!(
        kernel * 100 >= total * 30,
        "only {kernel} of {total} fx-syscall samples have a _[k] frame; {}",
        head(&text, 40)
    );
}

#[test]
fn cpu_split_matches_work_done() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("ratio");
    // Alive as long as the recording may last.
    let fixture = spawn_fixture(Path::new(env!("FIXTURE_FX_RATIO")), 120);
    // The split needs ~1,000 samples, i.e. the fixture's CPU time, not a fixed duration: on a
    // busy machine 4 s gave it 0.8 s of CPU (807 samples). Stop once it used 1.3 s of CPU
    // while sampled (1,300 samples at 999 Hz).
    let out = dir.file("out.folded");
    let mut profiler = Running::start(&[
        "record", "--comm", "fx-ratio", "-F", "999", "-d", "120s", "-o", &out,
    ]);
    profiler.wait_for("sampling");
    let start = cpu_seconds(fixture.pid());
    while cpu_seconds(fixture.pid()) - start < 1.3 {
        std::thread::sleep(Duration::from_millis(100));
    }
    profiler.signal("INT");
    let (status, stderr) = profiler.finish();
    assert!(status.success(), "record failed with {status}:\n{stderr}");
    let (text, stacks) = read_folded(Path::new(&out));
    let within = |name: &str| {
        samples(&stacks, |f| {
            f[0] == "fx-ratio" && f.iter().any(|x| x == name)
        })
    };
    let (three, one) = (within("work_three"), within("work_one"));
    let total = three + one;
    assert!(
        total >= 1000,
        "only {total} samples in work_three ({three}) + work_one ({one}); {}",
        head(&text, 40)
    );
    let share = three as f64 * 100.0 / total as f64;
    eprintln!("work_three share: {share:.1}% ({three} of {total}); expected 75%");
    assert!(
        (share - 75.0).abs() <= 5.0,
        "work_three has {share:.1}% of the samples ({three} vs work_one {one}), expected 75 +- 5; {}",
        head(&text, 40)
    );
}

#[test]
fn pid_filter_keeps_only_that_process() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("pid");
    let _other = c_fixture(env!("FIXTURE_FX_CHAIN"));
    let target = rust_fixture();
    let pid = target.pid().to_string();
    let usage = CpuUsage::start(target.pid());
    let (text, stacks) = record_folded(&dir, &["--pid", &pid, "-F", "499"]);
    let (min, max) = usage.sample_band(499.0, 3.0);
    let strangers: Vec<&str> = stacks
        .iter()
        .map(|(f, _)| f[0].as_str())
        .filter(|c| *c != "fixture-rust")
        .collect();
    assert!(
        strangers.is_empty(),
        "--pid {pid} (fixture-rust) recorded other comms {strangers:?}; {}",
        head(&text, 40)
    );
    let total = samples(&stacks, |_| true);
    eprintln!("--pid {pid}: {total} samples, {min:.0}..{max:.0} expected from its CPU time");
    assert!(
        total >= 50 && total as f64 >= min && total as f64 <= max,
        "{total} samples of --pid {pid}; at -F 499 for 3 s its CPU time says {min:.0}..{max:.0}; {}",
        head(&text, 40)
    );
}

/// `-F` and `-d` against the sample count: no CPU is sampled more than F times a second for d
/// seconds (samples of other processes count as filtered), and the fixture, filtered by pid,
/// gets F samples per second of CPU it used.
#[test]
fn sample_count_follows_frequency_and_duration() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("frequency");
    let fixture = c_fixture(env!("FIXTURE_FX_CHAIN"));
    let pid = fixture.pid().to_string();
    let cpus = std::thread::available_parallelism().unwrap().get() as f64;
    for (hz, secs, duration) in [(199.0, 2.0, "2s"), (997.0, 1.0, "1000ms")] {
        let capture = dir.file(&format!("{hz}.capture"));
        let usage = CpuUsage::start(fixture.pid());
        let hz_arg = hz.to_string();
        let args = ["--pid", &pid, "-F", &hz_arg, "-d", duration, "-o", &capture];
        expect_success(&record(&args), &format!("profiler record {args:?}"));
        let (min, max) = usage.sample_band(hz, secs);
        let stats = report(&[&capture, "--stats"]);
        expect_success(&stats, "report --stats");
        let stats = String::from_utf8_lossy(&stats.stdout).into_owned();
        let field = |key: &str| -> f64 {
            stats
                .lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {key} in --stats:\n{stats}"))
        };
        let fixture_samples = field("recorded");
        let all = fixture_samples + field("filtered") + field("lost_ringbuf_full");
        let want = hz * secs * cpus;
        eprintln!(
            "-F {hz} -d {duration}: {all} samples on {cpus} CPUs (F x d x CPUs = {want}); \
             fx-chain {fixture_samples}, {min:.0}..{max:.0} from its CPU time"
        );
        // At most F x d per CPU; fewer where a CPU idled (cpu-clock does not tick in the
        // idle task here: a quiet 2-CPU machine gives ~55% of F x d x CPUs), so the fixture's
        // own count against its CPU time below is the exact check of -F and -d.
        assert!(
            all >= fixture_samples && all <= 1.1 * want,
            "-F {hz} -d {duration}: {all} samples in all, F x d x CPUs = {want}:\n{stats}"
        );
        assert!(
            fixture_samples >= min && fixture_samples <= max,
            "-F {hz} -d {duration}: {fixture_samples} fx-chain samples, its CPU time says \
             {min:.0}..{max:.0}:\n{stats}"
        );
    }
}

/// `report CAPTURE` alone prints the top table: its hottest function by self share is the
/// folded output's most frequent leaf, at the same share, and the process is all of it.
fn check_top_table(capture: &str, folded: &str) {
    let out = report(&[capture, "--top", "5"]);
    expect_success(&out, "profiler report a.capture");
    let table = String::from_utf8_lossy(&out.stdout);
    let (text, _) = read_folded(Path::new(folded));
    let mut leaves: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    let mut total = 0;
    for line in text.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        *leaves.entry(stack.rsplit(';').next().unwrap()).or_default() += n;
        total += n;
    }
    let (leaf, n) = leaves
        .iter()
        .max_by_key(|(name, n)| (**n, std::cmp::Reverse(**name)))
        .unwrap();
    let share = *n as f64 * 100.0 / total as f64;
    let first = table
        .lines()
        .skip_while(|l| !l.contains("function (top 5 by self)"))
        .nth(1)
        .unwrap_or_else(|| panic!("no function line:\n{table}"));
    let fields: Vec<&str> = first.split_whitespace().collect();
    assert_eq!(fields.last(), Some(leaf), "{table}");
    let shown: f64 = fields[0].parse().unwrap();
    assert!(
        (shown - share).abs() < 0.01,
        "{shown} vs {share:.2}:\n{table}"
    );
    assert!(
        table.lines().any(|l| l.trim() == "100.00  fx-chain"),
        "fx-chain is not all of the busy samples:\n{table}"
    );
}

#[test]
fn capture_round_trip_gives_identical_folded() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("round-trip");
    let _fixture = c_fixture(env!("FIXTURE_FX_CHAIN"));
    let (a_folded, a_capture, a_svg, a_perf) = (
        dir.file("a.folded"),
        dir.file("a.capture"),
        dir.file("a.svg"),
        dir.file("a.perf.txt"),
    );
    let args = [
        "--comm", "fx-chain", "-d", "3s", "-o", &a_folded, "-o", &a_capture, "-o", &a_svg, "-o",
        &a_perf,
    ];
    expect_success(&record(&args), &format!("profiler record {args:?}"));

    let b_folded = dir.file("b.folded");
    expect_success(
        &report(&[&a_capture, "-o", &b_folded]),
        "profiler report a.capture -o b.folded",
    );
    assert_same_folded(&a_folded, &b_folded);

    // The SVG is well-formed XML whose frames include the fixture's chain.
    let svg = std::fs::read_to_string(&a_svg).expect("reading a.svg");
    let frames = svg_frames(&svg).unwrap_or_else(|e| {
        panic!(
            "a.svg does not parse: {e}; it starts with {}",
            head(&svg, 5)
        )
    });
    for want in ["fx-chain", "main", "a", "b", "c"] {
        assert!(
            frames.iter().any(|f| f == want),
            "a.svg has no frame {want:?}: {frames:?}"
        );
    }

    // perf script text read by a real consumer: inferno-collapse-perf folds it into exactly
    // our folded stacks (--all: kernel frames marked _[k] as ours are).
    if let Some(collapse) = tool("inferno-collapse-perf", "inferno (cargo install inferno)") {
        let out = std::process::Command::new(collapse)
            .args(["--all", &a_perf])
            .output()
            .expect("running inferno-collapse-perf");
        assert!(
            out.status.success(),
            "inferno-collapse-perf failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut theirs: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        let (ours, _) = read_folded(Path::new(&a_folded));
        let mut ours: Vec<String> = ours.lines().map(str::to_owned).collect();
        theirs.sort();
        ours.sort();
        assert!(!ours.is_empty(), "no samples recorded");
        assert!(
            theirs == ours,
            "inferno-collapse-perf of a.perf.txt differs from a.folded.\ninferno: {}\nours: {}",
            theirs.join("\n"),
            ours.join("\n")
        );
    }

    check_top_table(&a_capture, &a_folded);

    let stats = report(&[&a_capture, "--stats"]);
    expect_success(&stats, "profiler report a.capture --stats");
    let stats = String::from_utf8_lossy(&stats.stdout);
    let sampled = stats
        .lines()
        .find_map(|line| line.strip_prefix("samples:"))
        .and_then(|n| n.trim().parse::<u64>().ok());
    assert!(
        sampled.is_some_and(|n| n > 0),
        "--stats has no positive `samples:` line:\n{stats}"
    );
}

/// Both folded files exist, are non-empty and byte-identical.
fn assert_same_folded(expected: &str, actual: &str) {
    let (want, _) = read_folded(Path::new(expected));
    let (got, _) = read_folded(Path::new(actual));
    assert!(!want.is_empty(), "{expected} is empty");
    assert!(
        want == got,
        "{actual} differs from {expected}.\n{expected}: {}\n{actual}: {}",
        head(&want, 20),
        head(&got, 20)
    );
}

#[test]
fn ctrl_c_stops_recording_and_writes_outputs() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("ctrl-c");
    let _fixture = c_fixture(env!("FIXTURE_FX_CHAIN"));
    let (folded, capture) = (dir.file("x.folded"), dir.file("x.capture"));
    let mut profiler = Running::start(&[
        "record", "--comm", "fx-chain", "-F", "999", "-d", "60s", "-o", &folded, "-o", &capture,
    ]);
    profiler.wait_for("sampling");
    // Sampling runs: give the busy fixture time to be sampled (~1,000 samples at 999 Hz), so
    // the outputs have something to compare. Not a readiness wait: that is the line above.
    std::thread::sleep(Duration::from_secs(1));
    profiler.signal("INT");
    let (status, stderr) = profiler.finish();
    assert!(
        status.success(),
        "profiler record exited with {status} after SIGINT:\n{stderr}"
    );
    assert!(stderr.contains("interrupted"), "{stderr}");

    let (text, stacks) = read_folded(Path::new(&folded));
    let total = samples(&stacks, |f| f[0] == "fx-chain");
    assert!(
        total > 0,
        "no fx-chain samples after SIGINT; {}",
        head(&text, 10)
    );
    let again = dir.file("again.folded");
    expect_success(
        &report(&[&capture, "-o", &again]),
        "profiler report x.capture",
    );
    assert_same_folded(&folded, &again);
}

/// Ctrl-C or SIGTERM while the sampler is still loading (the profiler says it is loading,
/// loading takes a few hundred ms) ends in an orderly exit with every output written; an
/// empty profile is said to be one.
#[test]
fn signal_during_start_up_still_writes_outputs() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let _fixture = c_fixture(env!("FIXTURE_FX_CHAIN"));
    for (signal, said) in [("INT", "interrupted"), ("TERM", "terminated")] {
        let dir = TempDir::new("start-signal");
        let (folded, capture) = (dir.file("x.folded"), dir.file("x.capture"));
        let mut profiler = Running::start(&[
            "record", "--comm", "fx-chain", "-d", "60s", "-o", &folded, "-o", &capture,
        ]);
        profiler.wait_for("loading the sampler");
        profiler.signal(signal);
        let (status, stderr) = profiler.finish();
        assert!(
            status.success(),
            "SIG{signal} at start-up: record exited with {status}:\n{stderr}"
        );
        assert!(stderr.contains(said), "SIG{signal}: no {said:?}:\n{stderr}");
        assert!(
            Path::new(&folded).is_file(),
            "SIG{signal}: {folded} not written:\n{stderr}"
        );
        let stats = report(&[&capture, "--stats"]);
        expect_success(&stats, "profiler report x.capture --stats");
        let stats = String::from_utf8_lossy(&stats.stdout);
        let sampled = stats
            .lines()
            .find_map(|line| line.strip_prefix("samples:"))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("--stats has no `samples:` line:\n{stats}"));
        eprintln!("SIG{signal} at start-up: {sampled} samples");
        if sampled == 0 {
            assert!(
                stderr.contains("no samples were recorded"),
                "SIG{signal}: an empty profile written without a word:\n{stderr}"
            );
        }
    }
}

/// `profiler ARGS` with stdout and stderr pipes whose reader is gone before it writes a byte
/// (`record ... 2>&1 | head -1` once `head` has its line): every status line fails with EPIPE.
/// Returns how it ended.
fn with_closed_pipes(args: &[&str]) -> std::process::ExitStatus {
    let mut child = std::process::Command::new(profiler_tests::profiler_bin())
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting the profiler");
    drop(child.stdout.take());
    drop(child.stderr.take());
    profiler_tests::wait_timeout(&mut child, Duration::from_secs(120)).expect("the profiler ended")
}

/// Closed pipes are no reason to lose a recording or to panic: `record` still writes its
/// outputs and succeeds, and `report --stats` (stdout closed) ends as it would.
#[test]
fn closed_pipes_lose_nothing() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("closed-pipes");
    let capture = dir.file("piped.capture");
    let status = with_closed_pipes(&["record", "-d", "1s", "-o", &capture]);
    assert!(status.success(), "record with closed pipes: {status}");
    assert!(
        Path::new(&capture).is_file(),
        "record with closed pipes wrote no capture"
    );
    let status = with_closed_pipes(&["report", &capture, "--stats"]);
    assert!(
        status.success(),
        "report --stats with closed pipes: {status}"
    );
}

/// With no `-o`, `record` keeps its data: a capture and its SVG named by the time, and a
/// second recording beside the first, not over it.
#[test]
fn record_without_outputs_keeps_every_recording() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("default-outputs");
    for _ in 0..2 {
        let out = std::process::Command::new(profiler_tests::profiler_bin())
            .args(["record", "-d", "1s"])
            .current_dir(dir.path())
            .output()
            .expect("running the profiler");
        expect_success(&out, "profiler record -d 1s");
    }
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 4, "{names:?}");
    for pair in names.chunks(2) {
        let base = pair[0].strip_suffix(".capture").expect("a capture");
        assert!(base.starts_with("profile-20"), "{names:?}");
        assert_eq!(pair[1], format!("{base}.svg"), "{names:?}");
    }
    let capture = dir.path().join(&names[0]);
    let stats = report(&[capture.to_str().unwrap(), "--stats"]);
    expect_success(&stats, "profiler report on the default capture");
}
