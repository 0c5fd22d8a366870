//! Front ends: one file per subcommand. Each parses its options (clap) and calls the library.
use crate::util::status;
mod agent;
mod check;
mod diff;
mod doctor;
mod progress;
mod query;
mod record;
mod report;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

pub(crate) use record::OnOff;
pub use record::RecordArgs;
pub use report::ReportArgs;

/// An eBPF CPU profiler: samples kernel and user stacks on every CPU and writes flame graphs,
/// folded stacks and re-renderable captures.
#[derive(Debug, Parser)]
#[command(
    name = "profiler",
    version = concat!(
        env!("CARGO_PKG_VERSION"),
        " (eBPF object built by ",
        env!("PROFILER_EBPF_BUILT_BY"),
        ")"
    ),
    about,
    long_about = None,
    max_term_width = 100
)]
pub struct Cli {
    /// More log output (-v: info, -vv: debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Sample all CPUs for a while and write the outputs (Ctrl-C stops early, outputs are kept).
    Record(RecordArgs),
    /// Re-render a capture file into other outputs, or print its statistics.
    Report(ReportArgs),
    /// Find a zombie-cgroup CPU drain: dying cgroups, who makes them, who pays (docs/doctor.md).
    Doctor(doctor::DoctorArgs),
    /// Differential flame graph and the functions/processes whose share changed most.
    Diff(diff::DiffArgs),
    /// Always-on profiling: low-rate sampling into a local store, with an HTTP API and
    /// Prometheus metrics (docs/agent.md).
    Agent(agent::AgentArgs),
    /// Render a time range of the agent's store: -o FILE... (every output format).
    Query(query::QueryArgs),
    /// Load every kernel program into this kernel without attaching it: what loads, what the
    /// verifier refused and why, and what verifying each cost (docs/kernels.md).
    Check(check::CheckArgs),
}

/// Runs the parsed command, with the log level `-v` asks for.
/// Runs the command; its exit status on success (only the doctor's says more than "done").
pub fn run(cli: Cli) -> anyhow::Result<std::process::ExitCode> {
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    // inferno warns on every folded line it cannot parse; our inputs are checked before.
    let filter = format!("{level},inferno=error");
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(filter)).init();
    match cli.command {
        Command::Record(args) => record::run(args),
        Command::Report(args) => report::run(args),
        Command::Doctor(args) => return doctor::run(args, cli.verbose > 0),
        Command::Diff(args) => diff::run(args),
        Command::Agent(args) => agent::run(args),
        Command::Query(args) => query::run(args),
        Command::Check(args) => check::run(&args),
    }
    .map(|()| std::process::ExitCode::SUCCESS)
}

/// `-o` values: outputs by extension (see `output::EXTENSIONS`), stacks rooted by `group_by`.
fn parse_outputs(
    paths: &[PathBuf],
    group_by: crate::profile::GroupBy,
) -> anyhow::Result<Vec<crate::output::Output>> {
    for (i, p) in paths.iter().enumerate() {
        if paths[..i].contains(p) {
            anyhow::bail!("-o {} is given twice", p.display());
        }
    }
    paths
        .iter()
        .map(|p| {
            Ok(crate::output::Output {
                group_by,
                ..crate::output::Output::parse(p)?
            })
        })
        .collect()
}

/// Writes every output, then says so on stderr (`wrote a.svg, a.capture`).
fn write_outputs(
    outputs: &[crate::output::Output],
    profile: &crate::profile::Profile,
) -> anyhow::Result<()> {
    crate::output::write_all(outputs, profile)?;
    let names: Vec<String> = outputs
        .iter()
        .map(|o| o.path.display().to_string())
        .collect();
    if !names.is_empty() {
        status!("wrote {}", names.join(", "));
    }
    Ok(())
}

/// Effective capabilities: BPF programs and perf events need CAP_BPF and CAP_PERFMON
/// (CAP_SYS_ADMIN implies both).
pub(crate) fn check_privileges() -> anyhow::Result<()> {
    use profiler_common::caps;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let missing: Vec<&str> = caps::missing_for_bpf(caps::cap_eff(&status).unwrap_or(0)).collect();
    if !missing.is_empty() {
        anyhow::bail!(
            "sampling needs the {} capabilit{} (or root); run it with sudo",
            missing.join(" and "),
            if missing.len() == 1 { "y" } else { "ies" }
        );
    }
    Ok(())
}
