//! `cargo xtask bench unwind`'s peers (profile-bee `--dwarf`, bpftrace's frame-pointer
//! `ustack`, `perf record --call-graph dwarf`) over the same workload, and the share of each
//! tool's samples that reach the program's entry, from perf-script text or collapsed stacks.
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::bench_support::{Proc, sleep};
use crate::bench_unwind::{EXIT_GRACE, HZ, PROGRAMS, READ_BEFORE_END, Run, sampling_window};
use crate::util;

/// profile-bee 0.3.13 with its .eh_frame unwinder, writing collapsed stacks.
pub(crate) fn profile_bee(tmp: &Path, seconds: u64) -> Result<Run> {
    println!("==> profile-bee --dwarf -F {HZ} for {seconds}s");
    ensure_tracefs()?;
    let out = tmp.join("bee.folded");
    let mut cmd = Command::new(profile_bee_bin()?);
    // Stacks rooted at "comm (pid)" (`--group-by-process`), as collapsed text.
    cmd.args([
        "--dwarf",
        "--group-by-process",
        "--frequency",
        &HZ.to_string(),
    ])
    .args(["--time", &(seconds * 1000).to_string(), "-o"])
    .arg(&out)
    .stderr(Stdio::null());
    let proc = Proc::spawn(&mut cmd)?;
    let stats = sampling_window(&proc, seconds)?;
    let mut proc = proc;
    proc.wait_success(Duration::from_secs(seconds) + EXIT_GRACE)?;
    Ok(Run {
        name: "profile-bee 0.3.13 --dwarf".into(),
        ns_per_sample: Some(stats.ns_per_run()),
        reach: reach_folded(&fs::read_to_string(&out).unwrap_or_default()),
        ..Run::default()
    })
}

fn profile_bee_bin() -> Result<PathBuf> {
    // The crate installs its binary as `probee` (and `pbee`).
    util::which("probee")
        .or_else(|| {
            let p = Path::new(&std::env::var_os("HOME")?).join(".cargo/bin/probee");
            p.is_file().then_some(p)
        })
        .context("profile-bee is not installed: run `cargo xtask setup --bench`")
}

/// profile-bee reads tracepoint formats from tracefs.
fn ensure_tracefs() -> Result<()> {
    if Path::new("/sys/kernel/tracing/events").is_dir() {
        return Ok(());
    }
    util::run(Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]))
}

pub(crate) fn bpftrace(seconds: u64) -> Result<Run> {
    println!("==> bpftrace profile:hz:{HZ} ustack (frame pointers) for {seconds}s");
    let mut cmd = Command::new("bpftrace");
    cmd.args([
        "-e",
        // The map is cleared at exit: printing thousands of symbolized stacks takes minutes.
        &format!("profile:hz:{HZ} {{ @[ustack, comm] = count(); }} END {{ clear(@); }}"),
    ])
    .stderr(Stdio::null());
    let proc = Proc::spawn(&mut cmd)?;
    let stats = sampling_window(&proc, seconds)?;
    sleep(Duration::from_secs(READ_BEFORE_END))?;
    proc.interrupt();
    let mut proc = proc;
    proc.wait(EXIT_GRACE)?;
    Ok(Run {
        name: "bpftrace ustack (frame pointers)".into(),
        ns_per_sample: Some(stats.ns_per_run()),
        ..Run::default()
    })
}

pub(crate) fn perf_dwarf(tmp: &Path, seconds: u64) -> Result<Run> {
    println!("==> perf record --call-graph dwarf -F {HZ} -a for {seconds}s");
    let data = tmp.join("perf.data");
    let record = || {
        util::run(
            Command::new("perf")
                .args([
                    "record",
                    "-q",
                    "--call-graph",
                    "dwarf",
                    "-F",
                    &HZ.to_string(),
                    "-a",
                ])
                .arg("-o")
                .arg(&data)
                .args(["--", "sleep", &seconds.to_string()]),
        )
    };
    // Debian's perf 6.1 aborted (SIGABRT) in 2 of 4 runs here while processes came and went
    // (the xz loop): tried once more, its own output shown.
    if let Err(e) = record() {
        println!("    {e:#}; once more");
        record()?;
    }
    // perf script unwinds every sample's 8 KiB stack copy with DWARF, and the recording is
    // machine-wide (`perf record -p` records nothing on this kernel): over a busy host's
    // samples (compilers with huge debug info) it ran for more than 8 minutes. Only the
    // workload's comms are unwound (the others are filtered before their callchain is
    // resolved), without inline expansion (an addr2line run per frame); what is compared,
    // the workload's stacks with perf's default 8 KiB copies, is unchanged.
    let bytes = fs::metadata(&data).map_or(0, |m| m.len());
    println!(
        "    perf script over {:.1} MB of samples, the workload's only",
        bytes as f64 / 1e6
    );
    let started = std::time::Instant::now();
    let text = util::output(
        Command::new("perf")
            .args(["script", "--no-inline", "--comms", &PROGRAMS.join(",")])
            .arg("-i")
            .arg(&data),
    )?;
    println!(
        "    perf script took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(Run {
        name: "perf --call-graph dwarf".into(),
        reach: reach_perf_text(&text),
        ..Run::default()
    })
}

/// Whether a user frame name is a program's entry: `main`, `_start` or libc's start code.
fn is_entry(name: &str) -> bool {
    name == "main" || name == "_start" || name.starts_with("__libc_start")
}

/// Per comm of PROGRAMS: (samples with an entry frame, samples), from perf-script text
/// (ours and perf's: a `comm pid/tid ...` line, then one frame a line).
pub(crate) fn reach_perf_text(text: &str) -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    for block in text.split("\n\n") {
        let mut lines = block.lines().filter(|l| !l.trim().is_empty());
        let Some(head) = lines.next() else { continue };
        let comm = head.split_whitespace().next().unwrap_or_default();
        if !PROGRAMS.contains(&comm) {
            continue;
        }
        let reached = lines.any(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|f| is_entry(f.split('+').next().unwrap_or(f)))
        });
        let e: &mut (u64, u64) = out.entry(comm.to_owned()).or_default();
        e.0 += u64::from(reached);
        e.1 += 1;
    }
    out
}

/// The same from collapsed stacks (`comm;frame;...;frame count`, root first).
pub(crate) fn reach_folded(text: &str) -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(count) = count.parse::<u64>() else {
            continue;
        };
        let mut frames = stack.split(';');
        let comm = frames.next().unwrap_or_default();
        let Some(prog) = PROGRAMS.iter().find(|p| comm.starts_with(**p)) else {
            continue;
        };
        let reached = frames.any(|f| is_entry(f.split('+').next().unwrap_or(f)));
        let e: &mut (u64, u64) = out.entry((*prog).to_owned()).or_default();
        e.0 += if reached { count } else { 0 };
        e.1 += count;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_shares_from_both_formats() {
        let text = "xz 5/5 [000] 1.0: 1 cpu-clock:\n\t1 lzma_code (/lib/liblzma.so)\n\t2 main (/usr/bin/xz)\n\nxz 5/5 [000] 1.1: 1 cpu-clock:\n\t1 lzma_code (/lib/liblzma.so)\n\t0 [unknown] ([unknown])\n\ncc1 6/6 [1] 1.2: 1 cpu-clock:\n\t2 main (/usr/bin/cc1)\n";
        assert_eq!(reach_perf_text(text).get("xz"), Some(&(1, 2)));
        assert_eq!(reach_perf_text(text).get("cc1"), None);
        let folded = "sqlite3;_start;__libc_start_main;main;f 3\nsqlite3;f 1\n";
        assert_eq!(reach_folded(folded).get("sqlite3"), Some(&(3, 4)));
    }
}
