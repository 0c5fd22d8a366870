//! Files a user hands `report` and `diff` that were crafted to hurt (issue 15): each must end in
//! ONE `error: ` line, promptly, in little memory, and leave an existing output as it was.
//! Before the bounds, these aborted on a 72 GB allocation (leaving a 0-byte output), took
//! 3.2 GB, read /dev/zero until memory ran out, or exited 0 on an empty input.
//! No privilege needed: nothing here samples.

use std::{
    os::unix::process::ExitStatusExt as _,
    path::Path,
    process::{Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use profiler::profile::{Frame, FrameKind, Interner, Meta, Sample, write_file};
use profiler_tests::{TempDir, profiler_bin};

/// Bound on each run: catches a hang, not a timing assertion.
const TIMEOUT: Duration = Duration::from_secs(60);
/// Peak RSS allowed for refusing a crafted file. The debug binary idles near 15 MB; the
/// unbounded readers took 1.1-72 GB on these inputs.
const MAX_RSS_KB: i64 = 200 * 1024;

const NS_PER_S: u64 = 1_000_000_000;

/// What a run printed and its peak RSS (from wait4's rusage).
struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    max_rss_kb: i64,
}

/// Runs the profiler with stdout and stderr in files (no pipes to drain) and reaps it with
/// wait4, whose rusage gives the child's peak RSS.
#[expect(
    clippy::zombie_processes,
    reason = "reaped by wait4 below, which std's wait cannot replace: it gives the rusage"
)]
fn run(dir: &TempDir, args: &[&str]) -> Run {
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let child = Command::new(profiler_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("starting profiler {args:?}: {e}"));
    let pid = child.id() as libc::pid_t;
    let start = Instant::now();
    let (status, usage) = loop {
        let mut status = 0;
        // SAFETY: an all-zero rusage is valid; wait4 fills it and `status` for our own child.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above; WNOHANG returns 0 while the child runs.
        let got = unsafe { libc::wait4(pid, &raw mut status, libc::WNOHANG, &raw mut usage) };
        assert!(got >= 0, "wait4: {}", std::io::Error::last_os_error());
        if got == pid {
            break (ExitStatus::from_raw(status), usage);
        }
        if start.elapsed() > TIMEOUT {
            // SAFETY: kill(2) on our own child's pid, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("profiler {args:?} did not exit within {TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap()).into_owned();
    Run {
        status,
        stdout: read(&out),
        stderr: read(&err),
        max_rss_kb: usage.ru_maxrss,
    }
}

/// Expects a plain failure (exit code 1, not a signal) with one `error: ` line mentioning
/// `says`, nothing on stdout, and a small peak RSS.
fn expect_refused(dir: &TempDir, args: &[&str], says: &str) -> Run {
    let r = run(dir, args);
    assert_eq!(
        r.status.code(),
        Some(1),
        "profiler {args:?}: {:?} (a signal means it crashed); stderr:\n{}",
        r.status,
        r.stderr
    );
    let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        lines.len() == 1 && lines[0].starts_with("error: ") && lines[0].contains(says),
        "profiler {args:?}: expected one `error: ` line saying {says:?}, got:\n{}",
        r.stderr
    );
    assert!(
        r.stdout.is_empty(),
        "profiler {args:?} printed:\n{}",
        r.stdout
    );
    assert!(
        r.max_rss_kb < MAX_RSS_KB,
        "profiler {args:?} peaked at {} MB refusing its input",
        r.max_rss_kb / 1024
    );
    eprintln!("{args:?}: {} ({} MB peak)", lines[0], r.max_rss_kb / 1024);
    r
}

/// A capture declaring `duration_ns`, with one busy sample at each of `offsets`.
fn capture(path: &str, duration_ns: u64, offsets: &[u64]) {
    let mut i = Interner::new(Meta {
        frequency_hz: 99,
        duration_ns,
        cpus: vec![0, 1],
        ..Meta::default()
    });
    let name = i.string("main");
    let main = i.frame(Frame {
        name,
        kind: FrameKind::User,
        ..Frame::default()
    });
    let stack = i.stack(vec![main]);
    let comm = i.string("app");
    for &offset_ns in offsets {
        i.sample(Sample {
            offset_ns,
            cpu: 1,
            pid: 7,
            tid: 7,
            cgroup_id: 0,
            comm,
            stack,
        });
    }
    write_file(&i.finish(), Path::new(path)).unwrap();
}

/// The files in `dir` other than the run's stdout/stderr: no temporary output may be left.
fn files(dir: &TempDir) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "stdout" && n != "stderr")
        .collect();
    names.sort();
    names
}

#[test]
fn samples_far_past_the_declared_end_keep_the_old_output() {
    let dir = TempDir::new("hostile-span");
    let (cap, html) = (dir.file("x.capture"), dir.file("x.html"));
    // 10^18 ns apart in a capture that says it ran 1 s (a 130-byte file).
    capture(&cap, NS_PER_S, &[0, 1_000_000_000_000_000_000]);
    std::fs::write(&html, "old page").unwrap();
    expect_refused(
        &dir,
        &["report", &cap, "-o", &html],
        "past the capture's end",
    );
    assert_eq!(std::fs::read_to_string(&html).unwrap(), "old page");
    assert_eq!(files(&dir), ["x.capture", "x.html"]);
}

#[test]
fn a_year_long_capture_is_refused_by_the_per_second_tables() {
    let dir = TempDir::new("hostile-year");
    let (cap, html, cut) = (
        dir.file("y.capture"),
        dir.file("y.html"),
        dir.file("cut.html"),
    );
    let year = 365 * 86_400 * NS_PER_S;
    capture(&cap, year, &[0, NS_PER_S / 2, year - NS_PER_S]);
    std::fs::write(&html, "old page").unwrap();
    expect_refused(
        &dir,
        &["report", &cap, "--cpus"],
        "pick a shorter time range",
    );
    expect_refused(
        &dir,
        &["report", &cap, "-o", &html],
        "pick a shorter time range",
    );
    assert_eq!(std::fs::read_to_string(&html).unwrap(), "old page");
    assert_eq!(files(&dir), ["y.capture", "y.html"]);
    // What the message suggests works: a range within the bound renders.
    let r = run(&dir, &["report", &cap, "--to", "10s", "-o", &cut, "--cpus"]);
    assert!(r.status.success(), "{:?}: {}", r.status, r.stderr);
    assert!(r.stdout.contains("saturated: none"), "{}", r.stdout);
    assert!(
        std::fs::read_to_string(&cut)
            .unwrap()
            .contains("\"cols\":1,")
    );
}

#[test]
fn diff_refuses_special_files_and_empty_inputs() {
    let dir = TempDir::new("hostile-diff");
    let (good, svg) = (dir.file("good.folded"), dir.file("d.svg"));
    std::fs::write(&good, "app;main;work 10\n").unwrap();
    std::fs::write(&svg, "old svg").unwrap();
    let fifo = dir.file("fifo.folded");
    let c = std::ffi::CString::new(fifo.clone()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path we pass.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for special in ["/dev/zero", fifo.as_str()] {
        expect_refused(
            &dir,
            &["diff", &good, special, "-o", &svg, "--top", "3"],
            "not a regular file",
        );
    }
    let empty = dir.file("empty.folded");
    std::fs::write(&empty, "").unwrap();
    expect_refused(&dir, &["diff", &empty, &good, "--top", "3"], "no stacks");
    let no_samples = dir.file("none.capture");
    capture(&no_samples, NS_PER_S, &[]);
    expect_refused(
        &dir,
        &["diff", &no_samples, &good, "--top", "3"],
        "holds no samples",
    );
    assert_eq!(std::fs::read_to_string(&svg).unwrap(), "old svg");
}

#[test]
fn diff_refuses_overflowing_counts_and_huge_lines() {
    let dir = TempDir::new("hostile-folded");
    let (good, svg) = (dir.file("good.folded"), dir.file("d.svg"));
    std::fs::write(&good, "app;main;work 10\n").unwrap();
    std::fs::write(&svg, "old svg").unwrap();
    let max = u64::MAX;
    for (name, text, says) in [
        // Wrapped to print `614891469123651764224%` before.
        (
            "wrap.folded",
            format!("a;x {max}\na;y {max}\n"),
            "the counts add up past 2^60",
        ),
        // A count near 2^63 overflowed inferno's signed differences.
        (
            "imax.folded",
            format!("a;y {}\n", i64::MAX),
            "the counts add up past 2^60",
        ),
        // Silently dropped before.
        (
            "big.folded",
            "a;x 18446744073709551616\n".to_owned(),
            "does not fit 64 bits",
        ),
        // A 974 MB SVG before.
        (
            "line.folded",
            format!("a;{} 1\n", "f;".repeat(5_000_000)),
            "longer than 1048576 bytes",
        ),
    ] {
        let path = dir.file(name);
        std::fs::write(&path, text).unwrap();
        expect_refused(&dir, &["diff", &good, &path, "-o", &svg], says);
    }
    assert_eq!(std::fs::read_to_string(&svg).unwrap(), "old svg");
}
