//! `cargo xtask bench runq`: what timing every run-queue wait costs a switch-heavy load.
//! `perf bench sched pipe` (two processes ping-ponging through pipes), pinned to CPU 0: each
//! round trip is two switches on that CPU, over 300,000 a second here. Unpinned, the two land
//! on one CPU or on two from run to run, and a wake-up across CPUs in a VM (an IPI, an exit
//! from idle) makes the load 7 times slower: the spread would hide any cost. It runs alone, beside `profiler record --runq off` (the
//! sampler only), beside `profiler record` (the sampler and the run-queue tracer, the
//! default), and beside bpftrace's runqlat (the same three tracepoints, a hash map and a
//! histogram), in alternating rounds. Reported: the load's throughput in each, and the BPF ns
//! per event of the run-queue programs and of bpftrace's (the kernel's bpf_stats).
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::bench_support::{
    BpfStatsEnabled, Proc, ProgStats, catch_ctrl_c, prepare, program_names, round, write_json,
};
use crate::setup::Extras;
use crate::util;

/// Round trips of one `perf bench sched pipe` run (about 2.5 s here).
const LOOPS: u64 = 400_000;
const ROUNDS: u32 = 5;
/// Target: the load's throughput with our run-queue tracer at most this much lower than with
/// the sampler alone.
const MAX_SLOWDOWN_PERCENT: f64 = 5.0;
const EXIT_GRACE: Duration = Duration::from_secs(90);

/// bcc's runqlat in bpftrace: wake-up (or preemption) to switch-in, as a log2 histogram.
const RUNQLAT_BT: &str = "tracepoint:sched:sched_wakeup, tracepoint:sched:sched_wakeup_new \
{ @qtime[args->pid] = nsecs; } \
tracepoint:sched:sched_switch { \
if (args->prev_state == 0) { @qtime[args->prev_pid] = nsecs; } \
$ns = @qtime[args->next_pid]; \
if ($ns) { @usecs = hist((nsecs - $ns) / 1000); } \
delete(@qtime[args->next_pid]); }";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Beside {
    Nothing,
    SamplerOnly,
    SamplerAndRunq,
    BpftraceRunqlat,
}

impl Beside {
    const ALL: [Beside; 4] = [
        Beside::Nothing,
        Beside::SamplerOnly,
        Beside::SamplerAndRunq,
        Beside::BpftraceRunqlat,
    ];

    fn name(self) -> &'static str {
        match self {
            Beside::Nothing => "alone",
            Beside::SamplerOnly => "profiler record --runq off",
            Beside::SamplerAndRunq => "profiler record (--runq on)",
            Beside::BpftraceRunqlat => "bpftrace runqlat",
        }
    }

    /// Whether a program of this tool is one whose cost per event we report.
    fn counts(self, program: &str) -> bool {
        match self {
            Beside::SamplerAndRunq => program.starts_with("runq_"),
            Beside::BpftraceRunqlat => true,
            _ => false,
        }
    }
}

#[derive(Default)]
struct Figures {
    ops_per_sec: Vec<f64>,
    bpf: ProgStats,
}

pub(crate) fn runq() -> Result<()> {
    let (bin, out_dir) = prepare(Extras {
        bench: true,
        ..Extras::default()
    })?;
    let tmp = std::env::temp_dir().join(format!("profiler-bench-runq-{}", std::process::id()));
    fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    catch_ctrl_c();
    let result = measure(&bin, &tmp);
    let _ = fs::remove_dir_all(&tmp);
    let figures = result?;
    let json = print_table(&figures);
    write_json(&out_dir.join("runq.json"), &json)
}

fn measure(bin: &Path, tmp: &Path) -> Result<Vec<Figures>> {
    let mut figures: Vec<Figures> = Beside::ALL.iter().map(|_| Figures::default()).collect();
    // Throughput with the kernel's run-time accounting off (it reads the clock twice a run
    // of every program, which would be charged to the tools); then one run each with it on,
    // for the BPF time per event.
    for round in 0..=ROUNDS {
        let stats = if round == 0 {
            Some(BpfStatsEnabled::enable()?)
        } else {
            None
        };
        for (i, &beside) in Beside::ALL.iter().enumerate() {
            if stats.is_some() && beside == Beside::Nothing {
                continue;
            }
            let what = if stats.is_some() {
                "BPF time per event".to_owned()
            } else {
                format!("round {round}/{ROUNDS}")
            };
            println!(
                "==> {what}: taskset -c 0 perf bench sched pipe -l {LOOPS}, {}",
                beside.name()
            );
            let tool = start(bin, tmp, beside)?;
            let before = tool.as_ref().map(|t| counted(t, beside)).transpose()?;
            let ops = pipe_ops_per_sec()?;
            if stats.is_some() {
                if let (Some(t), Some(before)) = (&tool, before) {
                    figures[i].bpf = counted(t, beside)?.since(before);
                }
            } else {
                figures[i].ops_per_sec.push(ops);
            }
            if let Some(mut t) = tool {
                t.interrupt();
                t.wait(EXIT_GRACE)?;
            }
        }
    }
    Ok(figures)
}

/// Starts what runs beside the load, and waits until its programs are attached.
fn start(bin: &Path, tmp: &Path, beside: Beside) -> Result<Option<Proc>> {
    let mut cmd = match beside {
        Beside::Nothing => return Ok(None),
        Beside::SamplerOnly | Beside::SamplerAndRunq => {
            let mut cmd = Command::new(bin);
            cmd.args(["record", "-F", "99", "-d", "10m", "-o"])
                .arg(tmp.join("bench.capture"))
                .args([
                    "--runq",
                    if beside == Beside::SamplerOnly {
                        "off"
                    } else {
                        "on"
                    },
                ]);
            cmd
        }
        Beside::BpftraceRunqlat => {
            let mut cmd = Command::new("bpftrace");
            cmd.args(["-e", RUNQLAT_BT])
                .stderr(std::process::Stdio::null());
            cmd
        }
    };
    let proc = Proc::spawn(&mut cmd)?;
    let wanted = |names: &[String]| match beside {
        Beside::SamplerOnly => names.iter().any(|n| n.starts_with("sample_")),
        Beside::SamplerAndRunq => names.iter().any(|n| n == "runq_switch"),
        _ => names.len() >= 3,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let all = program_names();
        let names: Vec<String> = ProgStats::by_program(&proc)?
            .keys()
            .filter_map(|id| all.get(id).cloned())
            .collect();
        if wanted(&names) {
            // The sampler's first second loads unwind tables: let it settle.
            std::thread::sleep(Duration::from_secs(3));
            return Ok(Some(proc));
        }
        if Instant::now() > deadline {
            bail!("`{}` attached no programs within 60 s", beside.name());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs and run time so far of the programs of `tool` whose cost is reported.
fn counted(tool: &Proc, beside: Beside) -> Result<ProgStats> {
    let names = program_names();
    Ok(ProgStats::by_program(tool)?
        .into_iter()
        .filter(|(id, _)| names.get(id).is_some_and(|n| beside.counts(n)))
        .fold(ProgStats::default(), |a, (_, p)| a.plus(p)))
}

/// One `perf bench sched pipe` run's `ops/sec`.
fn pipe_ops_per_sec() -> Result<f64> {
    let text = util::output(Command::new("taskset").args([
        "-c",
        "0",
        "perf",
        "bench",
        "sched",
        "pipe",
        "-l",
        &LOOPS.to_string(),
    ]))?;
    text.lines()
        .find_map(|l| l.trim().strip_suffix("ops/sec")?.trim().parse().ok())
        .with_context(|| format!("no `ops/sec` in perf bench's output:\n{text}"))
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn print_table(figures: &[Figures]) -> serde_json::Value {
    let alone = median(&figures[0].ops_per_sec);
    let sampler = median(&figures[1].ops_per_sec);
    println!(
        "\n{:<30} {:>12} {:>10} {:>14} {:>12}",
        "beside perf bench sched pipe", "ops/s", "vs alone", "BPF ns/event", "events"
    );
    let mut rows = Vec::new();
    for (beside, f) in Beside::ALL.iter().zip(figures) {
        let ops = median(&f.ops_per_sec);
        let ns = (f.bpf.run_cnt > 0).then(|| f.bpf.ns_per_run());
        println!(
            "{:<30} {:>12.0} {:>9.1}% {:>14} {:>12}",
            beside.name(),
            ops,
            100.0 * (ops / alone - 1.0),
            ns.map_or("-".to_owned(), |n| format!("{n:.0}")),
            f.bpf.run_cnt
        );
        rows.push(json!({
            "beside": beside.name(),
            "ops_per_sec": f.ops_per_sec,
            "median_ops_per_sec": round(ops, 0),
            "bpf_ns_per_event": ns.map(|n| round(n, 1)),
            "bpf_events": f.bpf.run_cnt,
        }));
    }
    let with_runq = median(&figures[2].ops_per_sec);
    let slowdown = 100.0 * (1.0 - with_runq / sampler);
    let met = slowdown <= MAX_SLOWDOWN_PERCENT;
    println!(
        "\nthe run-queue tracer costs the load {slowdown:.1}% of its throughput over the sampler alone (target <= {MAX_SLOWDOWN_PERCENT}%): {}",
        if met { "met" } else { "NOT met" }
    );
    json!({
        "loops": LOOPS,
        "rounds": ROUNDS,
        "rows": rows,
        "runq_slowdown_percent": round(slowdown, 2),
        "target_met": met,
    })
}
