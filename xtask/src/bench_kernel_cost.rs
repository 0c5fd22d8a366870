//! `cargo xtask bench kernel-cost`: BPF time per sample against bpftrace, lost samples and the
//! profiler's own CPU use, all with every CPU busy.

use std::fmt::Display;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;

use crate::bench_support::{
    BpfStatsEnabled, Proc, ProgStats, catch_ctrl_c, children_cpu_seconds, prepare,
    process_cpu_seconds, round, sleep, write_json,
};
use crate::setup::Extras;
use crate::{host, util};

/// Targets: our BPF ns/sample over bpftrace's, and own CPU in % of one core at `OWN_CPU_HZ`.
const MAX_RATIO: f64 = 0.75;
const MAX_CPU_PERCENT: f64 = 0.5;
const OWN_CPU_HZ: u64 = 99;
/// Stats are read this long before a run ends, while its programs are surely still loaded.
const READ_BEFORE_END: u64 = 2;
/// Steady-state CPU use is measured from this many seconds into the run.
const STEADY_FROM: u64 = 3;
/// Alternating rounds of ours and bpftrace.
const ROUNDS: u32 = 2;
/// Time allowed after a run's duration for start-up and writing outputs.
const EXIT_GRACE: Duration = Duration::from_secs(60);

pub(crate) fn kernel_cost(seconds: u64, frequency: u64, record_args: &[String]) -> Result<()> {
    let (bin, out_dir) = prepare(Extras {
        bench: true,
        ..Extras::default()
    })?;
    let tmp = std::env::temp_dir().join(format!("profiler-bench-{}", std::process::id()));
    fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    catch_ctrl_c();
    let result = measure(&bin, &tmp, &out_dir, seconds, frequency, record_args);
    let _ = fs::remove_dir_all(&tmp);
    let m = result?;
    print_table(&m);
    let json = out_dir.join("kernel-cost.json");
    write_json(&json, &to_json(&m))?;
    Ok(())
}

struct Measurement {
    seconds: u64,
    frequency: u64,
    /// Extra `record` options of our runs (the bench's `-- ...`).
    record_args: Vec<String>,
    cpus: usize,
    ours: ProgStats,
    report: ReportStats,
    bpftrace: ProgStats,
    /// Whole run, start-up and writing outputs included.
    own_cpu_percent: f64,
    /// While sampling only.
    own_cpu_steady_percent: f64,
}

fn measure(
    bin: &Path,
    tmp: &Path,
    out_dir: &Path,
    seconds: u64,
    frequency: u64,
    record_args: &[String],
) -> Result<Measurement> {
    let _stats = BpfStatsEnabled::enable()?;
    // SAFETY: sysconf has no preconditions.
    let cpus = usize::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) })
        .unwrap_or(1)
        .max(1);
    let _busy: Vec<Proc> = (0..cpus)
        .map(|_| Proc::spawn(Command::new("sh").args(["-c", "while :; do :; done"])))
        .collect::<Result<_>>()?;
    let record = |hz: u64, capture: &Path| {
        let mut cmd = Command::new(bin);
        cmd.args([
            "record",
            "-F",
            &hz.to_string(),
            "-d",
            &format!("{seconds}s"),
            "-o",
        ])
        .arg(capture)
        .args(record_args);
        cmd
    };

    // Two alternating rounds, so a disturbance during one tool's run does not decide the ratio.
    let mut ours = ProgStats::default();
    let mut bt = ProgStats::default();
    let mut report = None;
    for round in 1..=ROUNDS {
        println!(
            "==> round {round}/{ROUNDS}: profiler record -F {frequency} {} for {seconds}s, {cpus} CPUs busy",
            record_args.join(" ")
        );
        let capture = tmp.join(format!("bench-{round}.capture"));
        let (mut ours_proc, stats) = start_and_read(record(frequency, &capture), seconds)?;
        ours = ours.plus(stats);
        ours_proc.wait_success(Duration::from_secs(seconds) + EXIT_GRACE)?;
        if report.is_none() {
            report = Some(ReportStats::read(bin, &capture)?);
        }

        // bpftrace's complaints (memlock, stack ids it cannot print) would bury the table.
        let bt_log = out_dir.join("bpftrace.stderr");
        println!(
            "==> round {round}/{ROUNDS}: bpftrace profile:hz:{frequency} for {seconds}s (messages in {})",
            bt_log.display()
        );
        let mut bpftrace = Command::new("bpftrace");
        bpftrace.stderr(
            fs::File::create(&bt_log)
                .with_context(|| format!("cannot create {}", bt_log.display()))?,
        );
        bpftrace.args([
            "-e",
            &format!("profile:hz:{frequency} {{ @[kstack, ustack, comm] = count(); }}"),
        ]);
        let (mut bt_proc, stats) = start_and_read(bpftrace, seconds)?;
        bt = bt.plus(stats);
        sleep(Duration::from_secs(READ_BEFORE_END))?;
        // bpftrace stops on SIGINT and prints its map, which goes to /dev/null.
        bt_proc.interrupt();
        bt_proc.wait(EXIT_GRACE)?;
    }
    let report = report.context("no round ran")?;

    println!("==> profiler record -F {OWN_CPU_HZ} for {seconds}s (own CPU use)");
    // Whole run: getrusage(RUSAGE_CHILDREN) grows by exactly what the child used once we reap
    // it; unlike wait4 this keeps std's Child in charge of reaping. Steady state: /proc/PID/stat
    // between STEADY_FROM seconds in and READ_BEFORE_END before the end, leaving out start-up
    // (BPF load) and the end (symbolization, writing outputs).
    let before = children_cpu_seconds();
    let start = Instant::now();
    let mut proc = Proc::spawn(&mut record(OWN_CPU_HZ, &tmp.join("cpu.capture")))?;
    sleep(Duration::from_secs(STEADY_FROM))?;
    let (cpu0, t0) = (process_cpu_seconds(proc.pid())?, Instant::now());
    sleep(Duration::from_secs(
        seconds.saturating_sub(STEADY_FROM + READ_BEFORE_END).max(1),
    ))?;
    let (cpu1, t1) = (process_cpu_seconds(proc.pid())?, Instant::now());
    proc.wait_success(Duration::from_secs(seconds) + EXIT_GRACE)?;
    let own_cpu_percent = (children_cpu_seconds() - before) / start.elapsed().as_secs_f64() * 100.0;
    let own_cpu_steady_percent = (cpu1 - cpu0) / (t1 - t0).as_secs_f64() * 100.0;

    Ok(Measurement {
        seconds,
        frequency,
        record_args: record_args.to_vec(),
        cpus,
        ours,
        report,
        bpftrace: bt,
        own_cpu_percent,
        own_cpu_steady_percent,
    })
}

/// Starts `cmd` and reads its BPF program stats `READ_BEFORE_END` seconds before its run ends.
fn start_and_read(mut cmd: Command, seconds: u64) -> Result<(Proc, ProgStats)> {
    let proc = Proc::spawn(&mut cmd)?;
    sleep(Duration::from_secs(seconds.saturating_sub(READ_BEFORE_END)))?;
    let stats = ProgStats::of(&proc)?;
    Ok((proc, stats))
}

/// The counters `profiler report --stats` prints as `key: value` lines.
struct ReportStats {
    samples: u64,
    lost_ringbuf_full: u64,
    kstack_failed: u64,
    ustack_failed: u64,
}

impl ReportStats {
    fn read(bin: &Path, capture: &Path) -> Result<Self> {
        let text = util::output(Command::new(bin).arg("report").arg(capture).arg("--stats"))?;
        let num = |key| {
            util::field(&text, key)
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .with_context(|| {
                    format!("`profiler report --stats` printed no `{key}: <number>` line")
                })
        };
        Ok(Self {
            samples: num("samples")?,
            lost_ringbuf_full: num("lost_ringbuf_full")?,
            kstack_failed: num("kstack_failed")?,
            ustack_failed: num("ustack_failed")?,
        })
    }
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

fn print_table(m: &Measurement) {
    let ratio = m.ours.ns_per_run() / m.bpftrace.ns_per_run();
    let r = &m.report;
    let (s, f, cpus, kernel) = (m.seconds, m.frequency, m.cpus, host::kernel_release());
    println!("\nkernel cost: {s}s at {f} Hz, {cpus} CPUs busy, kernel {kernel}");
    if !m.record_args.is_empty() {
        println!("our record options: {}", m.record_args.join(" "));
    }
    let row = |metric: &str, ours: &dyn Display, bpftrace: &dyn Display, target: &dyn Display| {
        let line = format!("{metric:<32} {ours:>12} {bpftrace:>12}  {target}");
        println!("{}", line.trim_end());
    };
    let (ours_ns, bt_ns) = (m.ours.ns_per_run().round(), m.bpftrace.ns_per_run().round());
    row("metric", &"ours", &"bpftrace", &"ratio / target");
    let met = verdict(ratio <= MAX_RATIO);
    row(
        "BPF ns per sample",
        &ours_ns,
        &bt_ns,
        &format!("{ratio:.2} (<= {MAX_RATIO}: {met})"),
    );
    row(
        "BPF program runs",
        &m.ours.run_cnt,
        &m.bpftrace.run_cnt,
        &"",
    );
    row("samples in capture", &r.samples, &"", &"");
    let met = verdict(r.lost_ringbuf_full == 0);
    row(
        "lost (ring buffer full)",
        &r.lost_ringbuf_full,
        &"",
        &format!("0: {met}"),
    );
    row("kernel stack failed", &r.kstack_failed, &"", &"");
    row("user stack failed", &r.ustack_failed, &"", &"");
    let (cpu, met) = (
        m.own_cpu_steady_percent,
        verdict(m.own_cpu_steady_percent < MAX_CPU_PERCENT),
    );
    let label = format!("own CPU at {OWN_CPU_HZ} Hz, sampling (% of a core)");
    row(
        &label,
        &format!("{cpu:.3}"),
        &"",
        &format!("< {MAX_CPU_PERCENT}: {met}"),
    );
    let label = format!("own CPU at {OWN_CPU_HZ} Hz, whole run (% of a core)");
    row(
        &label,
        &format!("{:.3}", m.own_cpu_percent),
        &"",
        &"start-up and outputs included",
    );
}

fn to_json(m: &Measurement) -> serde_json::Value {
    // Destructured fully so that a new counter cannot be forgotten here.
    let Measurement {
        seconds,
        frequency,
        record_args,
        cpus,
        ours,
        report,
        bpftrace,
        own_cpu_percent: cpu_whole,
        own_cpu_steady_percent: cpu,
    } = m;
    let ReportStats {
        samples,
        lost_ringbuf_full: lost,
        kstack_failed,
        ustack_failed,
    } = report;
    let (ours_ns, bt_ns) = (ours.ns_per_run(), bpftrace.ns_per_run());
    let ratio = ours_ns / bt_ns;
    json!({
        "kernel": host::kernel_release(),
        "seconds": seconds,
        "rounds": ROUNDS,
        "frequency_hz": frequency,
        "record_args": record_args,
        "cpus_busy": cpus,
        "ours": {
            "bpf_ns_per_sample": round(ours_ns, 1),
            "bpf_run_cnt": ours.run_cnt,
            "samples": samples,
            "lost_ringbuf_full": lost,
            "kstack_failed": kstack_failed,
            "ustack_failed": ustack_failed,
            format!("own_cpu_percent_at_{OWN_CPU_HZ}hz_sampling"): round(*cpu, 4),
            format!("own_cpu_percent_at_{OWN_CPU_HZ}hz_whole_run"): round(*cpu_whole, 4),
        },
        "bpftrace": {
            "bpf_ns_per_sample": round(bt_ns, 1),
            "bpf_run_cnt": bpftrace.run_cnt,
        },
        "targets": {
            "ns_ratio": round(ratio, 3),
            "ns_ratio_max": MAX_RATIO,
            "ns_ratio_met": ratio <= MAX_RATIO,
            "lost_met": *lost == 0,
            "own_cpu_percent_max": MAX_CPU_PERCENT,
            "own_cpu_met": *cpu < MAX_CPU_PERCENT,
        },
    })
}
