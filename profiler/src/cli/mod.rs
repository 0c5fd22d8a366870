//! Front ends: one file per subcommand. Each parses its options (clap) and calls the library.
mod record;
mod report;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

pub use record::RecordArgs;
pub use report::ReportArgs;

/// An eBPF CPU profiler: samples kernel and user stacks on every CPU and writes flame graphs,
/// folded stacks and re-renderable captures.
#[derive(Debug, Parser)]
#[command(name = "profiler", version, about, long_about = None, max_term_width = 100)]
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
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Record(args) => record::run(args),
        Command::Report(args) => report::run(args),
    }
}

/// `-o` values: outputs by extension (see `output::EXTENSIONS`).
fn parse_outputs(paths: &[PathBuf]) -> anyhow::Result<Vec<crate::output::Output>> {
    Ok(paths
        .iter()
        .map(|p| crate::output::Output::parse(p))
        .collect::<Result<_, _>>()?)
}
