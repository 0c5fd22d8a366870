//! How the CLI shows a recording's progress and report on stderr (`record`, `doctor`): the
//! library reports through `record::Progress`; only this prints.
use crate::util::status;
use profiler_common::unwind::ByReason;

use crate::{
    record::{Progress, RecordReport, Stop},
    session::{Notice, PythonReport},
    unwind::LoaderStats,
};

/// A progress callback that prints: warnings always; the time and samples so far on a
/// terminal (the doctor's window too, which says nothing else until its report); with
/// `verbose`, what is going on and a summary (tests and `cargo xtask bench symbolize` read
/// some of these lines).
pub(super) fn printer(verbose: bool) -> impl FnMut(Progress<'_>) {
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    move |p| match p {
        // Loading and attaching take a while (the verifier); say that we are alive and
        // that Ctrl-C is safe already. Tests wait for this line to signal at start-up.
        Progress::Loading if verbose => {
            status!("loading the sampler; Ctrl-C stops and writes what was collected");
        }
        Progress::Loading => {}
        Progress::Notice(Notice::CgroupFilter { target, in_kernel }) => {
            if verbose {
                status!(
                    "only cgroup {} ({} {}), filtered {}",
                    target.given,
                    target.hierarchy_name(),
                    target.path,
                    if in_kernel {
                        "in the kernel"
                    } else {
                        "in userspace"
                    }
                );
            }
        }
        Progress::Notice(Notice::Warning(w)) => status!("warning: {w}"),
        Progress::Sampling {
            cpus,
            frequency_hz,
            event,
            secs,
        } => {
            if verbose {
                status!(
                    "sampling {cpus} CPUs at {frequency_hz} Hz ({event}) for {secs:.1} s; Ctrl-C stops early"
                );
            }
        }
        Progress::Tick {
            elapsed_s,
            secs,
            samples,
        } => {
            if tty {
                use std::io::Write as _;
                let _ = write!(
                    std::io::stderr(),
                    "\r  {elapsed_s:5.1} s / {secs:.1} s, {samples} samples "
                );
            }
        }
        Progress::Stopped(Stop::Interrupted) => {
            status!("\ninterrupted: writing what was collected");
        }
        Progress::Stopped(Stop::Terminated) => {
            status!("terminated: writing what was collected");
        }
        Progress::Stopped(Stop::Elapsed) => {}
        Progress::Collected(r) => collected(r, verbose, tty),
        Progress::Symbolized { samples, secs } => {
            if verbose {
                // `cargo xtask bench symbolize` reads this line: it is our share of the work
                // that `perf script` does after the fact.
                status!("symbolized {samples} samples in {secs:.3} s");
            }
        }
    }
}

fn collected(r: &RecordReport, verbose: bool, tty: bool) {
    if tty {
        status!();
    }
    let c = &r.counters;
    if c.recorded == 0 {
        // Stopped before the first sample (a signal while the sampler loaded, or nothing
        // matched the filters): the outputs are written, and empty, so say it here.
        status!("warning: no samples were recorded; the outputs hold an empty profile");
    }
    if verbose {
        status!("symbolizing {} samples...", c.recorded);
    }
    if r.kernel_hidden {
        status!(
            "warning: kernel addresses are hidden by kernel.kptr_restrict; kernel frames show as [kernel]"
        );
    }
    if verbose || c.lost_ringbuf_full > 0 {
        status!(
            "recorded {} samples in {:.1} s; lost {} (ring buffer full); stack reads failed: {} kernel, {} user",
            c.recorded,
            r.duration_ns as f64 / 1e9,
            c.lost_ringbuf_full,
            c.kstack_failed,
            c.ustack_failed
        );
        if c.lost_ringbuf_full > 0 {
            status!(
                "warning: {} samples were lost because the reader fell behind; lower --frequency",
                c.lost_ringbuf_full
            );
        }
    }
    let lost_records = r.session.lost_records;
    if lost_records > 0 {
        status!(
            "warning: the kernel dropped {lost_records} process records (mappings, exec, exit): \
             some short-lived processes may show [unknown] frames"
        );
    }
    if verbose && let Some(s) = &r.session.unwind {
        unwind(s, &r.session.unwind_truncated);
    }
    if verbose && let Some(p) = &r.session.python {
        python(p);
    }
}

fn unwind(s: &LoaderStats, truncated: &ByReason) {
    status!(
        "unwind tables: {} processes, {} binaries by table ({} rows, {:.1} MiB in the kernel at the end, compiled in {:.3} s, {} from the disk cache), {} by frame pointer, {} evicted{}",
        s.processes,
        s.binaries_table,
        s.rows,
        s.table_bytes() as f64 / f64::from(1 << 20),
        s.compile_ns as f64 / 1e9,
        s.cache_hits,
        s.binaries_fp,
        s.evicted,
        if s.over_budget > 0 {
            format!(" ({} over --unwind-memory)", s.over_budget)
        } else {
            String::new()
        }
    );
    let cut: Vec<String> = truncated
        .cuts()
        .filter(|&(_, n)| n > 0)
        .map(|(code, n)| format!("{n} {}", profiler_common::unwind::reason::NAMES[code]))
        .collect();
    if !cut.is_empty() {
        status!("user stacks cut short: {}", cut.join(", "));
    }
}

fn python(p: &PythonReport) {
    // The exec wakes are the agent's only (`record` wakes for every new process).
    let [walked, truncated, read_failed, no_tstate, _] = p.kernel;
    if p.registered == 0 && p.refused.is_empty() {
        return; // No Python ran: nothing to say.
    }
    status!(
        "python: {} processes registered; {walked} samples walked, {truncated} truncated, \
         {read_failed} unreadable, {no_tstate} without a thread state; {} recorded cut short",
        p.registered,
        p.cut
    );
    for (kind, n, last) in &p.refused {
        status!("python: {n} processes refused ({kind}), e.g.: {last}");
    }
}
