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

/// `name` on PATH, if it is there.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// `name` on PATH, or None after `cannot_run` (Debian or cargo `package` installs it).
pub fn tool(name: &str, package: &str) -> Option<PathBuf> {
    let found = on_path(name);
    if found.is_none() {
        cannot_run(&format!(
            "`{name}` is not on PATH (install {package}, or run `cargo xtask setup --tests`)"
        ));
    }
    found
}

/// Chromium under any of its usual names, or None after `cannot_run`.
pub fn chromium() -> Option<PathBuf> {
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| on_path(name));
    if found.is_none() {
        cannot_run(
            "chromium is not on PATH (install chromium, or run `cargo xtask setup --tests`)",
        );
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

/// The function names of each stack of `go tool pprof -traces` output, leaf first (one per
/// distinct stack: see `pprof_weighted_traces` for how many samples each holds).
pub fn pprof_traces(text: &str) -> Vec<Vec<String>> {
    pprof_weighted_traces(text)
        .into_iter()
        .map(|(_, names)| names)
        .collect()
}

/// Each distinct stack of `go tool pprof -traces` output with its value in ns (a CPU
/// profile's time: samples x period). Stacks are separated by `-----------+----...` lines
/// (the header before the first is skipped); a stack's first line starts with its value
/// (`10.10ms   main`); label lines look like `      comm:  fx-chain`. Names may hold spaces
/// (Python frames: `c (chain.py:9)`).
pub fn pprof_weighted_traces(text: &str) -> Vec<(f64, Vec<String>)> {
    text.split("-----------+")
        .skip(1) // the header: File, Build ID, Type, Duration
        .map(|block| {
            let mut value = 0.0;
            let names = block
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
                        Some((v, rest)) if v.starts_with(|c: char| c.is_ascii_digit()) => {
                            value = duration_ns(v);
                            rest.trim()
                        }
                        _ => line,
                    };
                    (!name.is_empty()).then(|| name.to_owned())
                })
                .collect();
            (value, names)
        })
        .filter(|(_, names): &(f64, Vec<String>)| !names.is_empty())
        .collect()
}

/// `10.10ms`, `1.01s`, `250us` in ns; 0 when not a duration.
fn duration_ns(text: &str) -> f64 {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale = match unit {
        "ns" => 1.0,
        "us" | "\u{b5}s" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "min" => 60e9,
        "hrs" => 3600e9,
        _ => 0.0,
    };
    number.parse::<f64>().unwrap_or(0.0) * scale
}
