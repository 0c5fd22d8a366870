//! Peer programs the tests hand our outputs to (go tool pprof, prometheus,
//! inferno-collapse-perf), and the one rule for a case this host cannot run: say so and skip
//! on a laptop, fail under CI=true, where `cargo xtask setup --tests` installs everything.

use std::path::{Path, PathBuf};
use std::process::Command;

/// True under CI=true, where nothing may be skipped.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|ci| ci == "true")
}

/// A case that cannot run here: panics under CI=true, else prints `skipped: <reason>`.
/// Returns false so a test can `return` on it.
pub fn cannot_run(reason: &str) -> bool {
    assert!(!in_ci(), "{reason}; CI=true forbids skipping");
    eprintln!("skipped: {reason}");
    false
}

/// `name` on PATH, or None after `cannot_run` (Debian or cargo `package` installs it).
pub fn tool(name: &str, package: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        cannot_run(&format!(
            "`{name}` is not on PATH (install {package}, or run `cargo xtask setup --tests`)"
        ));
    }
    found
}

/// `go tool pprof <args>`, which must succeed; its stdout. pprof keeps state under
/// $HOME/pprof: `scratch` takes it.
pub fn go_tool_pprof(go: &Path, scratch: &Path, args: &[&str]) -> String {
    let out = Command::new(go)
        .args(["tool", "pprof"])
        .args(args)
        .env("PPROF_TMPDIR", scratch)
        .env("HOME", scratch)
        .output()
        .expect("running go tool pprof");
    assert!(
        out.status.success(),
        "go tool pprof {args:?} failed with {}:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The sample count of each sample in `go tool pprof -raw` output (`   3   30303030: 1 2 3`
/// lines between `Samples:` and `Locations`).
pub fn pprof_raw_counts(raw: &str) -> Vec<u64> {
    raw.lines()
        .skip_while(|l| !l.starts_with("Samples:"))
        .take_while(|l| !l.starts_with("Locations"))
        .filter_map(|l| {
            let (head, _) = l.split_once(':')?;
            let mut words = head.split_whitespace();
            let count = words.next()?.parse().ok()?;
            // A sample line has two numbers before its colon (count, nanoseconds).
            words.next()?.parse::<u64>().ok()?;
            Some(count)
        })
        .collect()
}

/// The function names of each sample of `go tool pprof -traces` output, leaf first. Samples
/// are separated by `-----------+----...` lines; a sample's first line starts with its value
/// (`10ms   main`); label lines look like `      comm:  fx-chain`. Names may hold spaces
/// (Python frames: `c (chain.py:9)`).
pub fn pprof_traces(text: &str) -> Vec<Vec<String>> {
    text.split("-----------+")
        .map(|block| {
            block
                .lines()
                .skip(1) // the rest of the separator line
                .filter(|line| {
                    !line
                        .split_whitespace()
                        .next()
                        .is_some_and(|key| key.ends_with(':'))
                })
                .filter_map(|line| {
                    let line = line.trim();
                    // The value column: a number with its unit, then at least two spaces.
                    let name = match line.split_once("  ") {
                        Some((value, rest)) if value.starts_with(|c: char| c.is_ascii_digit()) => {
                            rest.trim()
                        }
                        _ => line,
                    };
                    (!name.is_empty()).then(|| name.to_owned())
                })
                .collect()
        })
        .filter(|names: &Vec<String>| !names.is_empty())
        .collect()
}
