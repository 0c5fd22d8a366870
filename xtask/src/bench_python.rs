//! `cargo xtask bench python`: what naming Python frames costs, and whether it agrees with
//! py-spy. On a 60-frame Python stack (tests/fixtures/python/deep.py): BPF ns per sample of
//! the process with and without the Python walk (bpf_stats), our userspace CPU per sample,
//! the top-10 functions' self shares against `py-spy record --rate 99` on the same script,
//! and our whole-host cost against py-spy's cost for that one process.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use crate::bench_support::{
    BpfStatsEnabled, Proc, ProgStats, catch_ctrl_c, children_cpu_seconds, prepare,
    process_cpu_seconds, sleep,
};
use crate::setup::Extras;
use crate::{host, setup, util};

/// The 1, 5 and 15 minute load averages: the machine is shared, so the numbers say how busy.
fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

const HZ: u64 = 99;
/// Agreement target: each top-10 function's share, ours against py-spy's, in points.
const MAX_SHARE_GAP: f64 = 3.0;
/// Stats are read this long before a run ends, while its programs are surely still loaded.
const READ_BEFORE_END: u64 = 2;
/// Steady-state CPU use is measured from this many seconds into the run.
const STEADY_FROM: u64 = 3;
const EXIT_GRACE: Duration = Duration::from_secs(60);

pub(crate) fn python(seconds: u64) -> Result<()> {
    let (bin, out_dir) = prepare(Extras {
        bench: true,
        ..Extras::default()
    })?;
    let py_spy = setup::py_spy_bin();
    ensure!(
        py_spy.exists(),
        "{} is missing: run `cargo xtask setup --bench`",
        py_spy.display()
    );
    let python = util::which("python3").context("no python3 on PATH")?;
    let script = util::workspace_root().join("tests/fixtures/python/deep.py");
    let tmp = std::env::temp_dir().join(format!("profiler-bench-py-{}", std::process::id()));
    fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    catch_ctrl_c();
    let run = Run {
        bin: &bin,
        python: &python,
        script: &script,
        tmp: &tmp,
        seconds,
    };
    let result = measure(&run, &py_spy);
    let _ = fs::remove_dir_all(&tmp);
    let m = result?;
    print_table(&m, &python);
    let json = out_dir.join("python.json");
    fs::write(&json, to_json(&m)).with_context(|| format!("cannot write {}", json.display()))?;
    println!("wrote {}", json.display());
    Ok(())
}

struct Run<'a> {
    bin: &'a Path,
    python: &'a Path,
    script: &'a Path,
    tmp: &'a Path,
    seconds: u64,
}

impl Run<'_> {
    /// The fixture, running a little longer than one recording.
    fn target(&self) -> Result<Proc> {
        let secs = (self.seconds + 10).to_string();
        let p = Proc::spawn(Command::new(self.python).arg(self.script).arg(secs))?;
        // Past start-up, into the 60-frame loop.
        sleep(Duration::from_millis(500))?;
        Ok(p)
    }

    fn record(&self, args: &[&str], folded: &Path) -> Command {
        let mut cmd = Command::new(self.bin);
        cmd.args(["record", "-F", &HZ.to_string()])
            .args(["-d", &format!("{}s", self.seconds)])
            .args(args)
            .arg("-o")
            .arg(folded);
        cmd
    }
}

/// One of our recordings: BPF stats, CPU use, the folded stacks.
struct Ours {
    bpf: ProgStats,
    /// Samples of the target process.
    samples: u64,
    cpu_whole_s: f64,
    cpu_steady_s: f64,
    steady_s: f64,
    folded: String,
}

struct Measurement {
    seconds: u64,
    on: Ours,
    off: Ours,
    host: Ours,
    host_pid: u32,
    pyspy_cpu_s: f64,
    pyspy_folded: String,
}

fn measure(r: &Run, py_spy: &Path) -> Result<Measurement> {
    let _stats = BpfStatsEnabled::enable()?;
    let ours = |name: &str, extra: &[&str]| -> Result<(Ours, u32)> {
        let target = r.target()?;
        let pid = target.pid().to_string();
        let folded = r.tmp.join(format!("{name}.folded"));
        let mut args = extra.to_vec();
        if !extra.contains(&"--group-by") {
            args.extend(["--pid", &pid]);
        }
        println!(
            "==> {name}: profiler record -F {HZ} {} for {}s",
            args.join(" "),
            r.seconds
        );
        let o = run_ours(r.record(&args, &folded), r.seconds, &folded)?;
        Ok((o, target.pid()))
    };
    let (on, _) = ours("python-on", &[])?;
    let (off, _) = ours("python-off", &["--python", "off"])?;
    let (mut host, host_pid) = ours("whole-host", &["--group-by", "pid"])?;
    // Only the target's stacks, its `comm [pid]` root dropped.
    let tag = format!("[{host_pid}];");
    host.folded = host
        .folded
        .lines()
        .filter_map(|l| l.split_once(&tag).map(|(_, rest)| rest))
        .collect::<Vec<_>>()
        .join("\n");
    host.samples = folded_total(&host.folded);

    let target = r.target()?;
    let out = r.tmp.join("py-spy.txt");
    println!(
        "==> py-spy record --rate {HZ} --pid {} for {}s",
        target.pid(),
        r.seconds
    );
    let before = children_cpu_seconds();
    let mut spy = Proc::spawn(
        Command::new(py_spy)
            .args(["record", "--rate", &HZ.to_string(), "--format", "raw"])
            .args(["--nonblocking", "--duration", &r.seconds.to_string()])
            .args(["--pid", &target.pid().to_string(), "-o"])
            .arg(&out),
    )?;
    spy.wait_success(Duration::from_secs(r.seconds) + EXIT_GRACE)?;
    let pyspy_cpu_s = children_cpu_seconds() - before;
    let pyspy_folded =
        fs::read_to_string(&out).with_context(|| format!("py-spy wrote no {}", out.display()))?;
    Ok(Measurement {
        seconds: r.seconds,
        on,
        off,
        host,
        host_pid,
        pyspy_cpu_s,
        pyspy_folded,
    })
}

fn run_ours(mut cmd: Command, seconds: u64, folded: &Path) -> Result<Ours> {
    let before = children_cpu_seconds();
    let mut proc = Proc::spawn(&mut cmd)?;
    sleep(Duration::from_secs(STEADY_FROM))?;
    let (cpu0, t0) = (process_cpu_seconds(proc.pid())?, Instant::now());
    sleep(Duration::from_secs(
        seconds.saturating_sub(STEADY_FROM + READ_BEFORE_END).max(1),
    ))?;
    let (cpu1, t1) = (process_cpu_seconds(proc.pid())?, Instant::now());
    let bpf = ProgStats::of(&proc)?;
    proc.wait_success(Duration::from_secs(seconds) + EXIT_GRACE)?;
    let text = fs::read_to_string(folded)
        .with_context(|| format!("profiler wrote no {}", folded.display()))?;
    Ok(Ours {
        bpf,
        samples: folded_total(&text),
        cpu_whole_s: children_cpu_seconds() - before,
        cpu_steady_s: cpu1 - cpu0,
        steady_s: (t1 - t0).as_secs_f64(),
        folded: text,
    })
}

fn folded_total(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum()
}

/// Self shares (percent) by Python function: each stack's innermost `name (file.py:LINE)`
/// frame, whatever native frames lie under it (py-spy, without --native, shows none).
/// Stacks without a Python frame are left out (returned as the second value).
fn python_shares(folded: &str) -> (BTreeMap<String, f64>, u64) {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let (mut total, mut without) = (0u64, 0u64);
    for line in folded.lines() {
        let Some((stack, n)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        let leaf = stack
            .split(';')
            .rev()
            .find(|f| f.ends_with(')') && f.contains(".py:"));
        match leaf.and_then(|f| f.split_once(" (")) {
            Some((name, _)) => {
                *counts.entry(name.to_owned()).or_default() += n;
                total += n;
            }
            None => without += n,
        }
    }
    let shares = counts
        .into_iter()
        .map(|(k, v)| (k, v as f64 * 100.0 / total.max(1) as f64))
        .collect();
    (shares, without)
}

/// The top-10 functions by our share, with py-spy's share and the gap.
fn top10(m: &Measurement) -> Vec<(String, f64, f64)> {
    let (ours, _) = python_shares(&m.host.folded);
    let (theirs, _) = python_shares(&m.pyspy_folded);
    let mut v: Vec<_> = ours
        .iter()
        .map(|(k, &s)| (k.clone(), s, theirs.get(k).copied().unwrap_or(0.0)))
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v.truncate(10);
    v
}

/// BPF ns per sample of the target: all of the programs' time over the target's samples
/// (with --pid the other runs return at the filter, so this is an upper bound).
fn ns_per_sample(o: &Ours) -> f64 {
    o.bpf.run_time_ns as f64 / o.samples.max(1) as f64
}

/// Userspace CPU per sample while sampling: steady CPU over the samples of that window.
fn user_us_per_sample(o: &Ours, seconds: u64) -> f64 {
    let in_window = o.samples as f64 * o.steady_s / seconds as f64;
    o.cpu_steady_s * 1e6 / in_window.max(1.0)
}

/// Whole run cost, % of a core: userspace CPU plus BPF time.
fn host_cost_percent(m: &Measurement) -> f64 {
    (m.host.cpu_whole_s + m.host.bpf.run_time_ns as f64 / 1e9) * 100.0 / m.seconds as f64
}

fn print_table(m: &Measurement, python: &Path) {
    let load = load_average();
    println!(
        "\npython: {}s at {HZ} Hz, {} (60-frame stack), kernel {}, load average {load}",
        m.seconds,
        python.display(),
        host::kernel_release()
    );
    let (on, off) = (ns_per_sample(&m.on), ns_per_sample(&m.off));
    println!(
        "{:<48} {:>10}",
        "BPF ns per sample, --python on",
        on.round()
    );
    println!(
        "{:<48} {:>10}",
        "BPF ns per sample, --python off",
        off.round()
    );
    println!(
        "{:<48} {:>10}",
        "  the Python walk (difference)",
        (on - off).round()
    );
    println!(
        "{:<48} {:>10.1}",
        "userspace us per sample, --python on",
        user_us_per_sample(&m.on, m.seconds)
    );
    println!(
        "{:<48} {:>10.1}",
        "userspace us per sample, --python off",
        user_us_per_sample(&m.off, m.seconds)
    );
    let ours = host_cost_percent(m);
    let theirs = m.pyspy_cpu_s * 100.0 / m.seconds as f64;
    let met = if ours < theirs { "met" } else { "MISSED" };
    println!(
        "{:<48} {:>10.2}  (py-spy, one process: {theirs:.2}; below: {met})",
        "whole-host cost, % of a core (CPU + BPF)", ours
    );
    let (_, without) = python_shares(&m.host.folded);
    println!(
        "top-10 functions, self share % (pid {}; {} of our {} samples had no Python frame):",
        m.host_pid, without, m.host.samples
    );
    println!(
        "{:<24} {:>8} {:>8} {:>6}",
        "function", "ours", "py-spy", "gap"
    );
    for (name, a, b) in top10(m) {
        let flag = if (a - b).abs() <= MAX_SHARE_GAP {
            ""
        } else {
            "  > 3"
        };
        println!("{name:<24} {a:>8.1} {b:>8.1} {:>6.1}{flag}", (a - b).abs());
    }
}

fn to_json(m: &Measurement) -> String {
    let rows: Vec<String> = top10(m)
        .iter()
        .map(|(n, a, b)| {
            format!(
                "    {{\"function\": \"{}\", \"ours\": {a:.2}, \"py_spy\": {b:.2}}}",
                n.escape_default()
            )
        })
        .collect();
    let gap = top10(m)
        .iter()
        .map(|(_, a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    let (ours_cost, spy_cost) = (
        host_cost_percent(m),
        m.pyspy_cpu_s * 100.0 / m.seconds as f64,
    );
    format!(
        r#"{{
  "kernel": "{}",
  "load_average": "{}",
  "seconds": {},
  "frequency_hz": {HZ},
  "bpf_ns_per_sample_python_on": {:.1},
  "bpf_ns_per_sample_python_off": {:.1},
  "user_us_per_sample_python_on": {:.2},
  "user_us_per_sample_python_off": {:.2},
  "whole_host_cost_percent": {ours_cost:.3},
  "py_spy_cost_percent": {spy_cost:.3},
  "top10": [
{}
  ],
  "max_share_gap": {gap:.2},
  "targets": {{"share_gap_max": {MAX_SHARE_GAP}, "share_gap_met": {}, "cost_met": {}}}
}}
"#,
        host::kernel_release().escape_default(),
        load_average().escape_default(),
        m.seconds,
        ns_per_sample(&m.on),
        ns_per_sample(&m.off),
        user_us_per_sample(&m.on, m.seconds),
        user_us_per_sample(&m.off, m.seconds),
        rows.join(",\n"),
        gap <= MAX_SHARE_GAP,
        ours_cost < spy_cost,
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn shares_take_the_innermost_python_frame() {
        let folded = "python3;main;<module> (d.py:3);w1 (d.py:9);PyLong_Add 3\n\
                      <module> (d.py:3);w2 (d.py:12) 1\n\
                      python3;_start 4\n";
        let (shares, without) = super::python_shares(folded);
        assert_eq!(without, 4);
        assert_eq!(shares.get("w1"), Some(&75.0));
        assert_eq!(shares.get("w2"), Some(&25.0));
    }
}
