//! Bad input: the profiler exits non-zero with ONE stderr line `error: ...` that names the
//! culprit. These need no privilege: input is validated before BPF is loaded, so they run
//! (and must pass) as any user. Each run is bounded by a timeout: an input error that is only
//! noticed after sampling shows up as a hang, not as a slow pass.

use std::time::Duration;

use profiler_tests::{TempDir, run_profiler};

/// Bound on each run. A bound to catch a hang (e.g. sampling for the whole `-d 30s` before
/// failing), not a timing assertion.
const FAIL_FAST: Duration = Duration::from_secs(10);

/// Runs the profiler, expects failure with a single `error: ` line containing each of
/// `mentions`, and returns that line.
fn expect_error(args: &[&str], mentions: &[&str]) -> String {
    let output = run_profiler(args, FAIL_FAST);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "profiler {args:?} succeeded; stderr:\n{stderr}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        lines.len() == 1 && lines[0].starts_with("error: "),
        "profiler {args:?}: expected one `error: ` line on stderr, got {} lines:\n{stderr}",
        lines.len()
    );
    for mention in mentions {
        assert!(
            lines[0].to_lowercase().contains(&mention.to_lowercase()),
            "profiler {args:?}: error does not mention {mention:?}: {}",
            lines[0]
        );
    }
    lines[0].to_owned()
}

#[test]
fn unknown_output_extension() {
    let dir = TempDir::new("bad-ext");
    let out = dir.file("out.xyz");
    expect_error(&["record", "-d", "30s", "-o", &out], &["xyz"]);
}

#[test]
fn output_in_missing_directory_fails_before_sampling() {
    let out = "/nonexistent-dir/x.svg";
    expect_error(&["record", "-d", "30s", "-o", out], &[out]);
}

/// A directory, or a name ending in `/`, is no output file: said before sampling, not after
/// (when the recording would be lost).
#[test]
fn output_that_names_a_directory_fails_before_sampling() {
    let dir = TempDir::new("errors-dir-output");
    let existing = dir.file("d.svg");
    std::fs::create_dir(&existing).unwrap();
    for out in [format!("{}/", dir.file("x.svg")), existing] {
        expect_error(
            &["record", "-d", "30s", "-o", &out],
            &[&out, "is a directory"],
        );
    }
}

#[test]
fn pid_that_does_not_exist() {
    let dir = TempDir::new("bad-pid");
    let out = dir.file("x.folded");
    expect_error(
        &["record", "-d", "30s", "--pid", "999999999", "-o", &out],
        &["999999999"],
    );
}

#[test]
fn frequency_out_of_range() {
    let dir = TempDir::new("bad-freq");
    let out = dir.file("x.folded");
    for hz in ["0", "20000"] {
        // The message must give the valid range, whose upper end is 10000.
        expect_error(&["record", "-d", "30s", "-F", hz, "-o", &out], &["10000"]);
    }
}

#[test]
fn report_of_missing_capture() {
    let dir = TempDir::new("missing-capture");
    let out = dir.file("x.folded");
    expect_error(
        &["report", "/nonexistent.capture", "-o", &out],
        &["/nonexistent.capture"],
    );
}

#[test]
fn report_of_a_file_that_is_not_a_capture() {
    let dir = TempDir::new("not-capture");
    let garbage = dir.file("garbage.capture");
    std::fs::write(
        &garbage,
        b"this is not a profiler capture\n\x00\x01\x02\xff".repeat(50),
    )
    .expect("writing garbage capture");
    let out = dir.file("x.folded");
    let line = expect_error(&["report", &garbage, "-o", &out], &["capture", &garbage]);
    // Wording is free ("not a capture", "not a valid profiler capture"), the meaning is not.
    assert!(
        line.to_lowercase().contains("not a"),
        "error does not say it is not a capture: {line}"
    );
}

#[test]
fn report_of_a_directory() {
    let dir = TempDir::new("dir-capture");
    let out = dir.file("x.folded");
    let path = dir.path().to_str().unwrap().to_owned();
    expect_error(&["report", &path, "-o", &out], &[&path, "directory"]);
}

#[test]
fn diff_of_files_that_are_no_profiles() {
    let dir = TempDir::new("diff-garbage");
    let garbage = dir.file("notes.txt");
    std::fs::write(&garbage, "just some notes\nnot stacks\n").unwrap();
    let out = dir.file("d.svg");
    expect_error(
        &["diff", &garbage, &garbage, "-o", &out],
        &[&garbage, "folded"],
    );
    assert!(
        !std::path::Path::new(&out).exists(),
        "no diff of nothing is written"
    );
}

/// clap's own details survive the one-line rule: the possible values, the missing argument.
#[test]
fn argument_errors_keep_their_details() {
    expect_error(
        &["report", "x.capture", "--group-by", "containr"],
        &["container", "pod"],
    );
    expect_error(&["report"], &["<CAPTURE>"]);
}

#[test]
fn durations_take_days_and_say_which_units() {
    let dir = TempDir::new("bad-since");
    let out = dir.file("x.svg");
    let data = dir.file("data");
    expect_error(
        &["query", "--data-dir", &data, "--since", "3w", "-o", &out],
        &["3w", "ms, s, m, h or d"],
    );
}

#[test]
fn report_outputs_twice_or_onto_the_capture() {
    let dir = TempDir::new("bad-outputs");
    let capture = dir.file("x.capture");
    std::fs::write(&capture, b"stands in for a capture").unwrap();
    let svg = dir.file("x.svg");
    expect_error(&["report", &capture, "-o", &svg, "-o", &svg], &["twice"]);
    expect_error(
        &["report", &capture, "-o", &capture],
        &["capture being read"],
    );
    assert_eq!(
        std::fs::read(&capture).unwrap(),
        b"stands in for a capture",
        "the input is untouched"
    );
}

/// Each cause is said once: an error names its own step and leaves its cause to `source()`,
/// and the binary prints the chain as it is (it no longer strips repeats by substring).
#[test]
fn a_cause_is_said_once() {
    let path = "/nonexistent-dir/x.capture";
    let line = expect_error(&["report", path, "--stats"], &[path, "no such file"]);
    assert_eq!(line.matches("No such file").count(), 1, "{line}");
    assert_eq!(line.matches(path).count(), 1, "{line}");
}

/// `--comm` takes what the kernel keeps of a thread's name (15 bytes): a longer one could never
/// match, so it is refused up front, in every command that takes it.
#[test]
fn a_comm_longer_than_the_kernel_keeps_is_refused() {
    let long = "a-name-of-16-byt";
    expect_error(
        &["record", "-d", "30s", "--comm", long, "-o", "x.svg"],
        &[long, "15"],
    );
    expect_error(
        &["query", "--since", "1h", "--comm", long, "-o", "x.svg"],
        &[long, "15"],
    );
}

/// Pids as a list (`-p 12,34`) are each checked; durations add their terms (`1m30s`).
#[test]
fn pid_lists_and_compound_durations_are_read() {
    expect_error(
        &["record", "-d", "1m30s", "-p", "1,999999", "-o", "x.svg"],
        &["999999"],
    );
    expect_error(
        &["record", "-d", "1m30x", "-o", "x.svg"],
        &["1m30x", "unit"],
    );
}
