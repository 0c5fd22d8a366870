//! `cargo xtask bench unwind`'s 30-frame section: the kernel's cost per sample of a table
//! walk of 30+ user frames (issue 10's target: <= 5 us), which the whole-system workload
//! cannot show (its stacks are short and its kernel paths long). Two copies of fx-unwind
//! `deep30` (34 user frames from `_start`, none with a frame pointer), one per CPU of a
//! 2-CPU host, so nearly every tick lands in them; recorded `--unwind fp`, then `--unwind
//! dwarf`, at 999 Hz. Reported per run: BPF ns per program run (bpf_stats), the share of
//! samples that were fx-unwind, its mean user frames per sample and its reach-the-entry share.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::Result;

use crate::bench_support::{BpfStatsEnabled, Proc, sleep};
use crate::bench_unwind::record_ours;

const HZ: u64 = 999;
/// Each run's recording (both runs together well under 30 s).
const SECONDS: u64 = 8;
const COPIES: usize = 2;

/// One run of the section.
pub(crate) struct DeepRun {
    pub(crate) mode: &'static str,
    pub(crate) ns_per_run: f64,
    /// fx-unwind samples, and samples of any program (kept plus filtered out by `--comm`).
    pub(crate) fx_samples: u64,
    pub(crate) all_samples: u64,
    /// User frames in fx-unwind's samples, and those that reach `_start`/`main`.
    pub(crate) user_frames: u64,
    pub(crate) reached: u64,
}

/// Runs the section with fx-unwind built at `fx` (no frame pointers).
pub(crate) fn measure(bin: &Path, tmp: &Path, fx: &Path) -> Result<Vec<DeepRun>> {
    let life = (COPIES as u64 * (SECONDS + 30)).to_string();
    let _copies: Vec<Proc> = (0..COPIES)
        .map(|_| Proc::spawn(Command::new(fx).args([life.as_str(), "deep30"])))
        .collect::<Result<_>>()?;
    sleep(Duration::from_millis(500))?;
    let _stats = BpfStatsEnabled::enable()?;
    let mut runs = Vec::new();
    for mode in ["fp", "dwarf"] {
        println!(
            "==> 30 frames: profiler record --unwind {mode} --comm fx-unwind -F {HZ} for {SECONDS}s"
        );
        let name = format!("deep30-{mode}");
        let args = ["--comm", "fx-unwind", "--unwind", mode];
        let ours = record_ours(bin, tmp, &name, HZ, SECONDS, &args)?;
        let (fx_samples, user_frames, reached) = user_stacks(&ours.text);
        runs.push(DeepRun {
            mode,
            ns_per_run: ours.stats.ns_per_run(),
            fx_samples,
            all_samples: ours.num("samples") + ours.num("filtered"),
            user_frames,
            reached,
        });
    }
    Ok(runs)
}

/// From perf-script text: fx-unwind's samples, their user frames (user addresses, not the
/// `[truncated: ...]` marker) and the samples whose user stack reaches `_start` or `main`.
fn user_stacks(text: &str) -> (u64, u64, u64) {
    let (mut samples, mut frames, mut reached) = (0, 0, 0);
    for block in text.split("\n\n") {
        let mut lines = block.lines().filter(|l| !l.trim().is_empty());
        let Some(head) = lines.next() else { continue };
        if head.split_whitespace().next() != Some("fx-unwind") {
            continue;
        }
        samples += 1;
        let mut hit = false;
        for line in lines {
            let mut words = line.split_whitespace();
            let (Some(addr), Some(name)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(addr) = u64::from_str_radix(addr, 16) else {
                continue;
            };
            if addr == 0 || addr >= 0x8000_0000_0000_0000 || name.starts_with("[truncated") {
                continue;
            }
            frames += 1;
            let name = name.split('+').next().unwrap_or(name);
            hit |= name == "_start" || name == "main";
        }
        reached += u64::from(hit);
    }
    (samples, frames, reached)
}

/// The section's table.
pub(crate) fn render(runs: &[DeepRun]) -> String {
    let mut o = format!(
        "\n30-frame table walks: {COPIES} x fx-unwind deep30 (34 user frames, no frame \
         pointers), --comm fx-unwind -F {HZ}, {SECONDS} s a run\n\n\
         | run | BPF ns/sample | fx-unwind share | user frames/sample | reach entry |\n\
         |---|--:|--:|--:|--:|\n"
    );
    for r in runs {
        let pct = |a: u64, b: u64| (a * 100).checked_div(b).unwrap_or(0);
        o += &format!(
            "| ours --unwind {} | {:.0} | {}% of {} | {:.1} | {}% |\n",
            r.mode,
            r.ns_per_run,
            pct(r.fx_samples, r.all_samples),
            r.all_samples,
            r.user_frames as f64 / r.fx_samples.max(1) as f64,
            pct(r.reached, r.fx_samples),
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_frames_leave_out_kernel_and_truncation_frames() {
        let text = "fx-unwind 5/5 [000] 1.0: 1 cpu-clock:\n\
            \tffffffff81000000 asm_sysvec ([kernel.kallsyms])\n\
            \t401136 spin (/tmp/fx-unwind)\n\t401150 main (/tmp/fx-unwind)\n\
            \t401020 _start (/tmp/fx-unwind)\n\n\
            fx-unwind 5/5 [000] 1.1: 1 cpu-clock:\n\t401136 spin (/tmp/fx-unwind)\n\
            \t0 [truncated: frame limit] ([unknown])\n\n\
            sh 6/6 [1] 1.2: 1 cpu-clock:\n\t401136 main (/bin/sh)\n";
        assert_eq!(user_stacks(text), (2, 4, 1));
    }
}
