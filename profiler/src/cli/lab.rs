//! `profiler lab` (hidden): the zombie-memcg lab behind `cargo xtask lab zombie`.
use std::path::PathBuf;

use crate::lab;

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
    }
    Ok(())
}
