//! Process lifetimes from the kernel: processes that live 5 ms are symbolized, exit codes and
//! signals are recorded, and a process that execs another binary is attributed to each binary
//! in time order. Every process here starts after sampling has begun, so nothing of it can be
//! read from /proc before it runs: what the profiler knows, the kernel told it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use profiler_tests::{
    TempDir, exclusive, expect_success, head, is_kernel, profiler_bin, read_folded, report,
    require_bpf, wait_timeout,
};

/// `profiler record` running until `stop`, started and past its "sampling" line.
struct Recording {
    child: Child,
    stderr: std::thread::JoinHandle<Vec<String>>,
}

impl Recording {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(profiler_bin())
            .arg("record")
            .args(["-d", "600s"])
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .expect("start profiler");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let started = lines
            .by_ref()
            .map_while(Result::ok)
            .any(|l| l.starts_with("sampling"));
        assert!(started, "profiler did not start sampling");
        let stderr = std::thread::spawn(move || lines.map_while(Result::ok).collect());
        Self { child, stderr }
    }

    /// Ctrl-C, then the profiler's stderr once it has written its outputs.
    fn stop(mut self) -> String {
        // SAFETY: plain kill(2) of our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = wait_timeout(&mut self.child, Duration::from_secs(120))
            .expect("profiler exits after SIGINT");
        let stderr = self.stderr.join().unwrap().join("\n");
        assert!(status.success(), "profiler failed: {stderr}");
        stderr
    }
}

/// fx-burn with these arguments, burning CPU time rather than wall time (so that a busy
/// machine changes how long a run takes, not how many samples it gives).
fn fx_burn(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("FIXTURE_FX_BURN"));
    cmd.args(args).env("FIXTURE_CLOCK", "cpu");
    cmd
}

/// `report CAPTURE --stats -o FOLDED`: the stats lines as (key, value).
fn stats(capture: &str, folded: &str) -> Vec<(String, String)> {
    let out = report(&[capture, "--stats", "-o", folded]);
    expect_success(&out, "profiler report --stats");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn stat<'a>(stats: &'a [(String, String)], key: &str) -> &'a str {
    stats.iter().find(|(k, _)| k == key).map_or_else(
        || panic!("no {key} in --stats: {stats:?}"),
        |(_, v)| v.as_str(),
    )
}

#[test]
fn two_thousand_5ms_processes_have_named_user_leaves() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("short-5ms");
    let capture = dir.file("short.capture");
    let rec = Recording::start(&["--comm", "fx-burn", "-F", "999", "-o", &capture]);
    // 2,000 runs, two at a time (one per CPU here), each burning 5 ms in burn().
    for _ in 0..1000 {
        let pair: Vec<Child> = (0..2)
            .map(|_| fx_burn(&["0.005"]).spawn().expect("start fx-burn"))
            .collect();
        for mut child in pair {
            assert!(child.wait().expect("wait fx-burn").success());
        }
    }
    let stderr = rec.stop();
    let folded = dir.file("short.folded");
    let stats = stats(&capture, &folded);
    let (text, stacks) = read_folded(Path::new(&folded));

    // Samples with user frames, and those whose user leaf (the last user frame) is named;
    // the dynamic loader's start-up frames are named like any other.
    let (mut with_user, mut named, mut in_burn) = (0u64, 0u64, 0u64);
    for (frames, count) in &stacks {
        let user: Vec<&String> = frames[1..].iter().filter(|f| !is_kernel(f)).collect();
        let Some(leaf) = user.last() else { continue };
        with_user += count;
        named += count * u64::from(leaf.as_str() != "[unknown]");
        in_burn += count * u64::from(user.iter().any(|f| f.as_str() == "burn"));
    }
    eprintln!(
        "5 ms runs: {named} of {with_user} samples with user frames have a named leaf; {in_burn} in burn"
    );
    assert!(
        with_user >= 8000,
        "only {with_user} samples with user frames from 2,000 runs of 5 ms of CPU (about 10,000 expected); {stderr}\n{}",
        head(&text, 20)
    );
    assert!(
        named * 100 >= with_user * 99,
        "only {named} of {with_user} samples have a named user leaf; {}",
        head(&text, 30)
    );
    // Most of each run is burn(): the work itself is named, not only the start-up.
    assert!(
        in_burn * 2 >= with_user,
        "only {in_burn} of {with_user} samples are in burn; {}",
        head(&text, 30)
    );
    // Every run is in the lifetime table, with its exit code.
    assert_eq!(stat(&stats, "processes_started"), "2000", "{stats:?}");
    assert_eq!(stat(&stats, "processes_exited"), "2000", "{stats:?}");
    assert_eq!(stat(&stats, "exits"), "2000 code 0", "{stats:?}");
}

#[test]
fn exit_code_and_kill_signal_are_recorded() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("exit-status");
    let capture = dir.file("exits.capture");
    let rec = Recording::start(&["--comm", "fx-burn", "-F", "99", "-o", &capture]);
    let status = fx_burn(&["0.05", "3"]).status().expect("run fx-burn");
    assert_eq!(status.code(), Some(3));
    let mut victim = fx_burn(&["30"]).spawn().expect("start fx-burn");
    std::thread::sleep(Duration::from_millis(200));
    victim.kill().expect("SIGKILL fx-burn");
    let status = victim.wait().expect("wait fx-burn");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    rec.stop();
    let stats = stats(&capture, &dir.file("exits.folded"));
    assert_eq!(stat(&stats, "processes_started"), "2", "{stats:?}");
    assert_eq!(stat(&stats, "processes_exited"), "2", "{stats:?}");
    assert_eq!(stat(&stats, "exits"), "1 code 3, 1 signal 9", "{stats:?}");
}

/// One sample of `profiler record -o X.perf.txt`: pid, time (s), frames leaf first.
struct TextSample {
    pid: u32,
    time_s: f64,
    frames: Vec<String>,
}

fn parse_perf_text(text: &str) -> Vec<TextSample> {
    let mut out = Vec::new();
    for block in text.split("\n\n") {
        let mut lines = block.lines();
        let Some(head) = lines.next() else { continue };
        // "comm pid/tid [cpu] secs.usecs: 1 cpu-clock:"
        let mut fields = head.split_whitespace();
        let (Some(_comm), Some(ids), Some(_cpu), Some(time)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let pid = ids.split('/').next().unwrap().parse().expect("pid");
        let time_s = time.trim_end_matches(':').parse().expect("time");
        // "\tADDR NAME (MODULE)"; fixture names have no spaces.
        let frames = lines
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_owned))
            .collect();
        out.push(TextSample {
            pid,
            time_s,
            frames,
        });
    }
    out
}

#[test]
fn exec_of_another_binary_is_attributed_to_both_in_order() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("exec-mid");
    let out = dir.file("exec.perf.txt");
    let rec = Recording::start(&[
        "--comm", "fx-burn", "--comm", "fx-chain", "-F", "999", "-o", &out,
    ]);
    // burn() for 1 s of CPU as fx-burn, then the same process is fx-chain: c() for 1 s.
    let status = fx_burn(&["1", "0", env!("FIXTURE_FX_CHAIN"), "1"])
        .status()
        .expect("run fx-burn");
    let pid_status = status.success();
    rec.stop();
    assert!(pid_status, "fx-burn then fx-chain failed: {status}");
    let text = std::fs::read_to_string(&out).expect("read perf.txt");
    let samples = parse_perf_text(&text);
    let has = |s: &TextSample, f: &str| s.frames.iter().any(|x| x == f);
    // The one process that ran burn.
    let pid = samples.iter().find(|s| has(s, "burn")).map_or_else(
        || panic!("no sample in burn: {}", head(&text, 40)),
        |s| s.pid,
    );
    let mine: Vec<&TextSample> = samples.iter().filter(|s| s.pid == pid).collect();
    let burn: Vec<f64> = mine
        .iter()
        .filter(|s| has(s, "burn"))
        .map(|s| s.time_s)
        .collect();
    let c: Vec<f64> = mine
        .iter()
        .filter(|s| has(s, "c"))
        .map(|s| s.time_s)
        .collect();
    eprintln!(
        "pid {pid}: {} samples in burn, then {} in c",
        burn.len(),
        c.len()
    );
    // About 1,000 each: a second of CPU at 999 Hz.
    assert!(
        burn.len() >= 500 && c.len() >= 500,
        "burn {} c {}; {}",
        burn.len(),
        c.len(),
        head(&text, 40)
    );
    let last_burn = burn.iter().copied().fold(f64::MIN, f64::max);
    let first_c = c.iter().copied().fold(f64::MAX, f64::min);
    assert!(
        last_burn < first_c,
        "fx-burn's samples must all come before fx-chain's: last burn {last_burn}, first c {first_c}"
    );
    // Neither binary's code is named after the other's: fx-chain's chain is whole.
    for s in mine.iter().filter(|s| has(s, "c")) {
        assert!(!has(s, "burn"), "a sample in both binaries: {:?}", s.frames);
        // Leaf first in perf.txt: reversed, root first.
        let chain: Vec<&str> = s
            .frames
            .iter()
            .rev()
            .map(std::string::String::as_str)
            .filter(|f| ["main", "a", "b", "c"].contains(f))
            .collect();
        assert_eq!(chain, ["main", "a", "b", "c"], "{:?}", s.frames);
    }
}
