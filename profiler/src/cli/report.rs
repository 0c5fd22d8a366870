//! `profiler report`: re-render a capture on any machine, or print its statistics.
use crate::util::say;
use std::path::PathBuf;

use anyhow::{Context as _, bail};

use crate::profile::{self, Counters};

mod cpus;
mod range;

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// A capture written by `profiler record -o NAME.capture`.
    pub capture: PathBuf,
    #[arg(short, long = "output", value_name = "FILE", help = crate::output::OUTPUT_HELP)]
    pub outputs: Vec<PathBuf>,
    /// Print the capture's statistics as `key: value` lines.
    #[arg(long)]
    pub stats: bool,
    /// Root frame of every stack in .folded and .svg outputs.
    #[arg(long, value_enum, default_value_t = crate::profile::GroupBy::Comm)]
    pub group_by: crate::profile::GroupBy,
    /// Print per-CPU utilisation per second (busy%, usr/sys, saturated CPUs), like mpstat.
    #[arg(long)]
    pub cpus: bool,
    /// Keep samples from this time on: an offset from the capture start (`2.5s`, `1500ms`) or
    /// a UTC wall-clock time (`16:00:01.5`, `2026-11-30T16:00:01`). Applies to every output.
    #[arg(long, value_name = "TIME")]
    pub from: Option<String>,
    /// Keep samples before this time (same forms as --from).
    #[arg(long, value_name = "TIME")]
    pub to: Option<String>,
    /// Lines of the terminal table (no -o, --stats or --cpus): the N hottest functions and
    /// processes.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub top: usize,
    /// Print who waited for a CPU (`record --runq`), as `perf sched latency`: each thread's
    /// runtime, waits, average and longest wait (when, on which CPU) and who ran on that
    /// CPU meanwhile; then the waits' histogram, per CPU and per cgroup. --top threads.
    #[arg(long)]
    pub runq: bool,
}

pub(super) fn run(args: ReportArgs) -> anyhow::Result<()> {
    // Nothing asked for: the hottest functions and processes, in the terminal.
    let table = args.outputs.is_empty() && !args.stats && !args.cpus && !args.runq;
    let outputs = super::parse_outputs(&args.outputs, args.group_by)?;
    let same_file = |p: &std::path::Path| {
        p.canonicalize()
            .ok()
            .is_some_and(|p| Some(p) == args.capture.canonicalize().ok())
    };
    if let Some(o) = outputs.iter().find(|o| same_file(&o.path)) {
        bail!(
            "-o {} is the capture being read; write the output elsewhere",
            o.path.display()
        );
    }
    let mut profile = profile::read_file(&args.capture).context("cannot read the capture")?;
    if args.from.is_some() || args.to.is_some() {
        let at = |t: &Option<String>, default| match t {
            Some(t) => range::parse_time(t, &profile.meta).map_err(anyhow::Error::from),
            None => Ok(default),
        };
        let (from, to) = (at(&args.from, 0)?, at(&args.to, u64::MAX)?);
        if from >= to {
            bail!("--from must be before --to");
        }
        let m = &profile.meta;
        if from >= m.duration_ns {
            bail!(
                "--from {} is not before the capture's end: it runs {:.1} s, {} to {} UTC",
                args.from.as_deref().unwrap_or_default(),
                m.duration_ns as f64 / 1e9,
                range::format_clock(m.start_unix_ns),
                range::format_clock(m.start_unix_ns + m.duration_ns)
            );
        }
        profile = profile.slice(from, to);
    }
    if table {
        let top = crate::output::top_table(&profile, args.top);
        let _ = std::io::Write::write_all(&mut std::io::stdout(), top.as_bytes());
        return Ok(());
    }
    // Built before anything is printed, so a refused table prints nothing half-way.
    let cpus = args.cpus.then(|| cpus::cpu_report(&profile)).transpose()?;
    let runq = if args.runq {
        Some(crate::output::runq_table(&profile, args.top).with_context(|| {
            format!(
                "{} has no run-queue waits: record with `--runq on` (the default) on a kernel that allows it",
                args.capture.display()
            )
        })?)
    } else {
        None
    };
    if args.stats {
        print_stats(&profile);
    }
    for table in [cpus, runq].into_iter().flatten() {
        let _ = std::io::Write::write_all(&mut std::io::stdout(), table.as_bytes());
    }
    super::write_outputs(&outputs, &profile)
}

fn print_stats(p: &profile::Profile) {
    let Counters {
        recorded,
        lost_ringbuf_full,
        filtered,
        kstack_failed,
        ustack_failed,
    } = p.meta.counters;
    let m = &p.meta;
    say!("samples: {}", p.samples.len());
    say!("recorded: {recorded}");
    say!("lost_ringbuf_full: {lost_ringbuf_full}");
    say!("filtered: {filtered}");
    say!("kstack_failed: {kstack_failed}");
    say!("ustack_failed: {ustack_failed}");
    say!("duration_s: {:.3}", m.duration_ns as f64 / 1e9);
    say!("frequency_hz: {}", m.frequency_hz);
    say!("event: {}", m.event);
    say!("cpus: {}", m.cpus.len());
    say!("hostname: {}", m.hostname);
    say!("kernel: {}", m.kernel_release);
    say!("start_unix_ns: {}", m.start_unix_ns);
    say!("processes: {}", p.processes.len());
    let life = profile::lifetime_stats(p);
    say!("processes_started: {}", life.started);
    say!("processes_exited: {}", life.exited);
    say!(
        "processes_started_symbolized: {} of {} sampled",
        life.started_symbolized,
        life.started_sampled
    );
    let exits: Vec<String> = life
        .exits
        .iter()
        .map(|(how, n)| format!("{n} {how}"))
        .collect();
    say!("exits: {}", exits.join(", "));
    // A capture keeps no cgroup per process: the parent stands in for the service's unit.
    let programs = profile::lifecycle::programs(
        &p.lifetimes,
        &std::collections::HashMap::new(),
        true,
        m.duration_ns as f64 / 1e9,
    );
    let mut programs = programs;
    // Supervisors usually started before the recording: their comm is in its process table.
    for prog in &mut programs {
        for (pid, comm, _) in &mut prog.parents {
            if comm.is_empty()
                && let Some(proc) = p.processes.iter().find(|q| q.pid == *pid)
            {
                comm.clone_from(&proc.comm);
            }
        }
    }
    let loops: Vec<_> = programs.iter().filter(|p| p.crash_loop).collect();
    say!("crash_loops: {}", loops.len());
    for l in &loops {
        say!(
            "crash_loop: {} ({} failing exits, {:.1}/min)",
            l.summary(),
            l.failing,
            l.failing_per_min
        );
    }
    for l in programs.iter().filter(|p| !p.crash_loop).take(10) {
        say!("program: {}", l.summary());
    }
    say!("unique_stacks: {}", p.stacks.len());
    say!("unique_frames: {}", p.frames.len());
    for (reason, n) in truncated_by_reason(p) {
        say!("truncated {reason}: {n}");
    }
    for (name, value) in &p.meta.named_counters {
        say!("{name}: {value}");
    }
    if let Some(rq) = &p.runq {
        for (name, value) in crate::output::runq_stats(rq) {
            say!("{name}: {value}");
        }
    }
}

/// Samples whose user stack a table walk cut short, per reason, read from the
/// `[truncated: reason]` root frames the stacks carry (`--unwind`, docs/unwinding.md).
fn truncated_by_reason(p: &profile::Profile) -> std::collections::BTreeMap<&str, u64> {
    let mut by_stack: std::collections::HashMap<u32, u64> = std::collections::HashMap::new();
    for s in &p.samples {
        *by_stack.entry(s.stack).or_default() += 1;
    }
    let mut out = std::collections::BTreeMap::new();
    for (stack, n) in by_stack {
        let reason = p.stack_frames(stack).find_map(|f| {
            p.str(f.name)
                .strip_prefix("[truncated: ")
                .and_then(|r| r.strip_suffix(']'))
        });
        if let Some(reason) = reason {
            *out.entry(reason).or_default() += n;
        }
    }
    out
}
