//! `profiler lab` (hidden): the zombie-memcg lab behind `cargo xtask lab zombie`.
use std::path::PathBuf;

use crate::{lab, lab_synth};

#[derive(Debug, clap::Subcommand)]
pub enum LabCommand {
    /// Leave N dying memory cgroups behind and start a `kubelet` poller (--cleanup undoes it).
    Zombie {
        /// How many dying memory cgroups to add.
        #[arg(long, default_value_t = 500)]
        count: u32,
        /// Stop the poller, free the page cache, remove the lab cgroup.
        #[arg(long)]
        cleanup: bool,
    },
    /// Write a synthetic capture of CPUS x HZ x SECONDS samples (`cargo xtask bench heatmap`).
    Synth {
        #[arg(long, default_value_t = 64)]
        cpus: u32,
        #[arg(long, default_value_t = 99)]
        hz: u32,
        #[arg(long, default_value_t = 3600)]
        seconds: u32,
        /// PRNG seed: the same seed gives the same capture.
        #[arg(long, default_value_t = 0x5eed)]
        seed: u64,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// The poller itself (started by `lab zombie`).
    #[command(hide = true)]
    Poller {
        #[arg(long)]
        parent: PathBuf,
    },
}

pub fn run(cmd: LabCommand) -> anyhow::Result<()> {
    match cmd {
        LabCommand::Zombie { cleanup: true, .. } => {
            let r = lab::cleanup()?;
            let baseline = r.baseline.map_or("unknown".to_owned(), |b| b.to_string());
            println!(
                "memory num_cgroups: {} -> {} (baseline before the lab: {baseline})",
                r.before, r.after
            );
        }
        LabCommand::Zombie { count, .. } => {
            let r = lab::zombie(count)?;
            println!(
                "memory num_cgroups: {} -> {} (+{} dying under {}); kubelet poller pid {}",
                r.before,
                r.after,
                r.after.saturating_sub(r.before),
                r.parent.display(),
                r.poller_pid
            );
        }
        LabCommand::Poller { parent } => lab::poller(&parent)?,
        LabCommand::Synth {
            cpus,
            hz,
            seconds,
            seed,
            output,
        } => {
            let spec = lab_synth::SynthSpec {
                cpus,
                hz,
                seconds,
                seed,
            };
            let r = lab_synth::synth(spec, &output)?;
            println!(
                "wrote {}: {} samples ({} idle), {} stacks, {} processes",
                output.display(),
                r.samples,
                r.idle,
                r.stacks,
                r.processes
            );
        }
    }
    Ok(())
}
