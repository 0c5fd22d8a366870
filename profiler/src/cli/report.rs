//! `profiler report`: re-render a capture on any machine, or print its statistics.
use std::path::PathBuf;

use anyhow::{Context as _, bail};

use crate::profile::{self, Counters};

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// A capture written by `profiler record -o NAME.capture`.
    pub capture: PathBuf,
    /// Output file, by extension: .svg, .folded, .capture. Repeatable.
    #[arg(short, long = "output", value_name = "FILE")]
    pub outputs: Vec<PathBuf>,
    /// Print the capture's statistics as `key: value` lines.
    #[arg(long)]
    pub stats: bool,
}

pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    if args.outputs.is_empty() && !args.stats {
        bail!("nothing to do: give -o FILE (.svg, .folded, .capture) or --stats");
    }
    let outputs = super::parse_outputs(&args.outputs)?;
    let profile = profile::read_file(&args.capture).context("cannot read the capture")?;
    if args.stats {
        print_stats(&profile);
    }
    for o in &outputs {
        o.write(&profile)?;
    }
    Ok(())
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
    println!("samples: {}", p.samples.len());
    println!("recorded: {recorded}");
    println!("lost_ringbuf_full: {lost_ringbuf_full}");
    println!("filtered: {filtered}");
    println!("kstack_failed: {kstack_failed}");
    println!("ustack_failed: {ustack_failed}");
    println!("duration_s: {:.3}", m.duration_ns as f64 / 1e9);
    println!("frequency_hz: {}", m.frequency_hz);
    println!("event: {}", m.event);
    println!("cpus: {}", m.cpus.len());
    println!("hostname: {}", m.hostname);
    println!("kernel: {}", m.kernel_release);
    println!("start_unix_ns: {}", m.start_unix_ns);
    println!("processes: {}", p.processes.len());
    println!("unique_stacks: {}", p.stacks.len());
    println!("unique_frames: {}", p.frames.len());
}
