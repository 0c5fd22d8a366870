//! `cargo xtask test --repeat N`: the privileged integration tests (the `profiler-tests`
//! package) run N times in a row, every run to its end, then one table of the tests that failed
//! in any run. A test that fails once in five runs is as broken as one that always fails: on a
//! newcomer's fresh machine it is the first thing they see.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;

use anyhow::{Context, Result, bail};

use crate::util;

/// Which stream of `cargo test` a line came from: cargo's progress (`Running tests/x.rs`) is on
/// stderr, libtest's `test name ... ok` lines on stdout.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stream {
    Out,
    Err,
}

/// What one run of `cargo test` said, line by line.
///
/// Test lines are tied to their target by order, not by arrival: cargo announces each test
/// binary on stderr (`Running tests/x.rs`, `Doc-tests x`) and each binary starts its stdout with
/// `running N tests`, so the k-th `running` block belongs to the k-th announced binary. The two
/// pipes are read by two threads, so a block's lines may arrive before its announcement.
#[derive(Default, Debug)]
struct Run {
    /// Announced test targets, in order (`record` for tests/record.rs).
    targets: Vec<String>,
    /// `running N tests` blocks seen so far.
    blocks: usize,
    /// (block, test name, passed).
    outcomes: Vec<(usize, String, bool)>,
}

impl Run {
    fn line(&mut self, stream: Stream, line: &str) {
        let line = line.trim();
        if stream == Stream::Err {
            if let Some(rest) = line.strip_prefix("Running ") {
                // `Running tests/record.rs (target/debug/deps/record-0123abcd)`,
                // `Running unittests src/lib.rs (...)`.
                let path = rest
                    .split_whitespace()
                    .find(|w| {
                        std::path::Path::new(w)
                            .extension()
                            .is_some_and(|e| e == "rs")
                    })
                    .unwrap_or(rest);
                let file = path.rsplit('/').next().unwrap_or(path);
                self.targets.push(file.trim_end_matches(".rs").to_owned());
            } else if let Some(krate) = line.strip_prefix("Doc-tests ") {
                self.targets.push(format!("doc {krate}"));
            }
            return;
        }
        if line.starts_with("running ") && (line.ends_with(" tests") || line.ends_with(" test")) {
            self.blocks += 1;
            return;
        }
        // `test name ... ok`, `test name ... FAILED`; a test printing to stdout without
        // --nocapture cannot split these lines, so only complete ones count.
        let Some(rest) = line.strip_prefix("test ") else {
            return;
        };
        let Some((name, outcome)) = rest.rsplit_once(" ... ") else {
            return;
        };
        match outcome {
            "ok" => self.outcomes.push((self.blocks, name.to_owned(), true)),
            "FAILED" => self.outcomes.push((self.blocks, name.to_owned(), false)),
            _ => {}
        }
    }

    /// `target::test` of every test that passed, and of every one that failed.
    fn results(&self) -> (Vec<String>, Vec<String>) {
        let (mut passed, mut failed) = (Vec::new(), Vec::new());
        for (block, name, ok) in &self.outcomes {
            let target = block
                .checked_sub(1)
                .and_then(|i| self.targets.get(i))
                .map_or("?", String::as_str);
            let full = format!("{target}::{name}");
            if *ok {
                passed.push(full);
            } else {
                failed.push(full);
            }
        }
        (passed, failed)
    }
}

/// Runs `cargo test -p profiler-tests` `repeat` times (`test_args` go to the test binaries) and
/// fails if any test failed in any run, after printing which and how often.
pub(crate) fn repeat(
    repeat: u32,
    cargo_args: &[String],
    test_args: &[String],
    bin: &std::path::Path,
) -> Result<()> {
    // test -> runs it failed in; BTreeMap for a stable table.
    let mut failures: BTreeMap<String, u32> = BTreeMap::new();
    let mut seen: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    let mut broken_runs = Vec::new();
    for i in 1..=repeat {
        let mut cmd = util::cargo();
        // --no-fail-fast: one failing test binary must not hide the others' results.
        cmd.args(["test", "-p", "profiler-tests", "--no-fail-fast"])
            .args(cargo_args)
            .args(["--", "--test-threads=1"])
            .args(test_args)
            .env("PROFILER_BIN", bin);
        println!("==> run {i}/{repeat}: {}", util::display(&cmd));
        let (run, success) = run_cargo_test(&mut cmd)?;
        let (passed, failed) = run.results();
        for name in &passed {
            seen.insert(name.clone());
        }
        for name in &failed {
            seen.insert(name.clone());
            *failures.entry(name.clone()).or_default() += 1;
        }
        if !success && failed.is_empty() {
            // A build error or a test binary that crashed: no test line says FAILED.
            broken_runs.push(i);
        }
        println!(
            "==> run {i}/{repeat}: {} passed, {} failed",
            passed.len(),
            failed.len()
        );
    }
    println!("==> {repeat} runs of {} tests", seen.len());
    if failures.is_empty() && broken_runs.is_empty() {
        println!("==> every test passed in every run");
        return Ok(());
    }
    println!("{}", table(&failures, repeat));
    if !broken_runs.is_empty() {
        println!(
            "==> runs {broken_runs:?}: cargo test failed without a failing test line (build error or crash; see above)"
        );
    }
    bail!(
        "{} test(s) failed in at least one of {repeat} runs",
        failures.len() + usize::from(!broken_runs.is_empty())
    )
}

/// `failures/N` per test, worst first.
fn table(failures: &BTreeMap<String, u32>, repeat: u32) -> String {
    let mut rows: Vec<(&String, &u32)> = failures.iter().collect();
    rows.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let width = rows
        .iter()
        .map(|(name, _)| name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut text = format!("{:<width$}  failed", "test");
    for (name, n) in rows {
        text.push_str(&format!("\n{name:<width$}  {n}/{repeat}"));
    }
    text
}

/// Runs `cmd`, echoing its output as it comes, and returns what it said and whether it
/// succeeded.
fn run_cargo_test(cmd: &mut Command) -> Result<(Run, bool)> {
    let name = util::display(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start `{name}`"))?;
    let (tx, rx) = mpsc::channel();
    let readers = [
        reader(child.stdout.take().expect("piped"), Stream::Out, tx.clone()),
        reader(child.stderr.take().expect("piped"), Stream::Err, tx),
    ];
    let mut run = Run::default();
    for (stream, line) in rx {
        // Echo first: the run is long and its progress is the user's only feedback.
        match stream {
            Stream::Out => println!("{line}"),
            Stream::Err => eprintln!("{line}"),
        }
        let _ = std::io::stdout().flush();
        run.line(stream, &line);
    }
    for r in readers {
        let _ = r.join();
    }
    let status = child
        .wait()
        .with_context(|| format!("waiting for `{name}`"))?;
    Ok((run, status.success()))
}

fn reader(
    pipe: impl Read + Send + 'static,
    stream: Stream,
    tx: mpsc::Sender<(Stream, String)>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            if tx.send((stream, line)).is_err() {
                break;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(lines: &[(Stream, &str)]) -> Run {
        let mut run = Run::default();
        for (stream, line) in lines {
            run.line(*stream, line);
        }
        run
    }

    #[test]
    fn outcomes_are_named_by_target_and_test() {
        let run = parse(&[
            (
                Stream::Err,
                "     Running tests/record.rs (target/debug/deps/record-0123abcd)",
            ),
            (Stream::Out, "running 2 tests"),
            (Stream::Out, "test c_chain_main_a_b_c ... ok"),
            (Stream::Out, "test ctrl_c_stops_recording ... FAILED"),
            (
                Stream::Err,
                "     Running tests/jit.rs (target/debug/deps/jit-0123abcd)",
            ),
            (Stream::Out, "running 2 tests"),
            (Stream::Out, "test perf_map_names_jit_code ... ok"),
            (Stream::Out, "test ignored_one ... ignored"),
        ]);
        let (passed, failed) = run.results();
        assert_eq!(
            passed,
            ["record::c_chain_main_a_b_c", "jit::perf_map_names_jit_code"]
        );
        assert_eq!(failed, ["record::ctrl_c_stops_recording"]);
    }

    #[test]
    fn a_block_read_before_its_announcement_still_gets_its_target() {
        // Both binaries' stdout overtook cargo's stderr lines announcing them.
        let run = parse(&[
            (Stream::Out, "running 1 test"),
            (Stream::Out, "test diff_top ... ok"),
            (Stream::Out, "running 1 test"),
            (Stream::Out, "test doctor_json ... FAILED"),
            (Stream::Err, "     Running tests/diff.rs (x)"),
            (Stream::Err, "     Running tests/doctor.rs (y)"),
            (Stream::Err, "   Doc-tests profiler_tests"),
            (Stream::Out, "running 0 tests"),
        ]);
        let (passed, failed) = run.results();
        assert_eq!(passed, ["diff::diff_top"]);
        assert_eq!(failed, ["doctor::doctor_json"]);
        assert_eq!(run.targets, ["diff", "doctor", "doc profiler_tests"]);
    }

    #[test]
    fn test_lines_on_stderr_and_partial_lines_do_not_count() {
        let run = parse(&[
            (Stream::Err, "test x ... FAILED"),
            (Stream::Out, "test y ... skipped: needs CAP_BPF"),
            (Stream::Out, "test z ..."),
        ]);
        assert!(run.outcomes.is_empty(), "{run:?}");
    }

    #[test]
    fn table_lists_worst_first_with_the_run_count() {
        let failures = BTreeMap::from([("a::rare".to_owned(), 1), ("b::often".to_owned(), 3)]);
        let text = table(&failures, 5);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[1].starts_with("b::often") && lines[1].ends_with("3/5"),
            "{text}"
        );
        assert!(
            lines[2].starts_with("a::rare") && lines[2].ends_with("1/5"),
            "{text}"
        );
    }
}
