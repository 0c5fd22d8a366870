//! `profiler-lab`: the zombie-memcg and crash-loop labs behind `cargo xtask lab` and the
//! doctor tests, and the synthetic captures of `cargo xtask bench heatmap`. Test support:
//! it forks, makes and removes cgroups and plays a fake kubelet, so it is not in the product.
use std::{path::PathBuf, process::ExitCode};

use clap::Parser as _;
use profiler_tests::lab::{crashloop, starve, synth, zombie};

/// Reproducible incidents for testing the doctor, and synthetic captures.
#[derive(Debug, clap::Parser)]
#[command(name = "profiler-lab", max_term_width = 100)]
enum LabCommand {
    /// Leave N dying memory cgroups behind and start a `kubelet` poller (--cleanup undoes it).
    Zombie {
        /// How many dying memory cgroups to add.
        #[arg(long, default_value_t = 500)]
        count: u32,
        /// Stop the poller, free the page cache, remove the lab cgroup.
        #[arg(long)]
        cleanup: bool,
    },
    /// Start a `supervisor` that restarts `crashy-agent` (exit 2) in a memory cgroup it makes
    /// anew each time, like Restart=always (--cleanup stops it and removes the lab).
    Crashloop {
        /// Pause between an exit and the next start, ms (systemd's RestartSec).
        #[arg(long, default_value_t = 100)]
        restart_ms: u64,
        /// Each attempt in a cgroup of its own (`run-<n>`), made and removed by `mkdir` and
        /// `rmdir` processes, as a container runtime or a shell supervisor does.
        #[arg(long)]
        per_attempt: bool,
        #[arg(long)]
        cleanup: bool,
    },
    /// The supervisor itself (started by `profiler-lab crashloop`).
    #[command(hide = true)]
    Supervisor {
        #[arg(long)]
        restart_ms: u64,
        #[arg(long)]
        per_attempt: bool,
    },
    /// Starve a thread of its CPU: a SCHED_FIFO `rt-spinner` pinned to CPU N beside a normal
    /// `waker` thread pinned there that wakes every 10 ms. RT throttling lets the waker run
    /// 50 ms a second: it waits up to ~950 ms (--cleanup stops it).
    Starve {
        /// The CPU to take (default: the last online one).
        #[arg(long)]
        cpu: Option<u32>,
        #[arg(long)]
        cleanup: bool,
    },
    /// The starve lab itself (started by `profiler-lab starve`).
    #[command(hide = true)]
    Starver {
        #[arg(long)]
        cpu: u32,
    },
    /// THREADS threads pinned to CPU N, busy for MS ms (wall time); prints `tid run_delay_ns` of
    /// each from the kernel's schedstat (the run-queue test's reference).
    Contend {
        #[arg(long)]
        cpu: u32,
        #[arg(long, default_value_t = 2)]
        threads: u32,
        #[arg(long, default_value_t = 2000)]
        ms: u64,
        /// Move them all between CPU N and this one every 15 ms meanwhile.
        #[arg(long, value_name = "CPU")]
        migrate_to: Option<u32>,
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
    /// The poller itself (started by `profiler-lab zombie`).
    #[command(hide = true)]
    Poller {
        #[arg(long)]
        parent: PathBuf,
    },
}

fn main() -> ExitCode {
    match run(LabCommand::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("profiler-lab: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cmd: LabCommand) -> anyhow::Result<()> {
    match cmd {
        LabCommand::Zombie { cleanup: true, .. } => {
            let r = zombie::cleanup()?;
            let baseline = r.baseline.map_or("unknown".to_owned(), |b| b.to_string());
            println!(
                "memory num_cgroups: {} -> {} (baseline before the lab: {baseline})",
                r.before, r.after
            );
        }
        LabCommand::Zombie { count, .. } => {
            let r = zombie::zombie(count)?;
            println!(
                "memory num_cgroups: {} -> {} (+{} dying under {}); kubelet poller pid {}",
                r.before,
                r.after,
                r.after.saturating_sub(r.before),
                r.parent.display(),
                r.poller_pid
            );
        }
        LabCommand::Poller { parent } => zombie::poller(&parent)?,
        LabCommand::Crashloop { cleanup: true, .. } => {
            let r = crashloop::cleanup()?;
            println!(
                "supervisor stopped after {} starts; memory num_cgroups: {} -> {}",
                r.starts, r.before, r.after
            );
        }
        LabCommand::Crashloop {
            restart_ms,
            per_attempt,
            ..
        } => {
            let pid = crashloop::crashloop(restart_ms, per_attempt)?;
            let cgroup = if per_attempt {
                format!("{}N, a new one each time", crashloop::ATTEMPT_PREFIX)
            } else {
                crashloop::SERVICE.to_owned()
            };
            println!(
                "supervisor pid {pid} restarts {} every {restart_ms} ms in {}/{cgroup}; log: {}/log",
                crashloop::PROGRAM,
                crashloop::CRASHLOOP_CGROUP,
                crashloop::CRASHLOOP_DIR
            );
        }
        LabCommand::Supervisor {
            restart_ms,
            per_attempt,
        } => crashloop::supervisor(restart_ms, per_attempt)?,
        LabCommand::Starve { cpu, cleanup } => run_starve(cpu, cleanup)?,
        LabCommand::Starver { cpu } => starve::starver(cpu)?,
        LabCommand::Contend {
            cpu,
            threads,
            ms,
            migrate_to,
        } => starve::contend(cpu, threads, ms, migrate_to)?,
        LabCommand::Synth {
            cpus,
            hz,
            seconds,
            seed,
            output,
        } => {
            let spec = synth::SynthSpec {
                cpus,
                hz,
                seconds,
                seed,
            };
            let r = synth::synth(spec, &output)?;
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

/// `profiler-lab starve [--cpu N] [--cleanup]`.
fn run_starve(cpu: Option<u32>, cleanup: bool) -> anyhow::Result<()> {
    if cleanup {
        let was = starve::cleanup()?;
        println!(
            "{}",
            if was {
                "starve lab stopped"
            } else {
                "no starve lab was running"
            }
        );
        return Ok(());
    }
    let cpu = cpu.unwrap_or_else(starve::default_cpu);
    let pid = starve::starve(cpu)?;
    println!(
        "{} (pid {pid}) spins at SCHED_FIFO on CPU {cpu}; {} (tid {}) waits there up to ~950 ms a second",
        starve::SPINNER,
        starve::WAKER,
        std::fs::read_to_string(starve::waker_tid_file())?.trim()
    );
    Ok(())
}
