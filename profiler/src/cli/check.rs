//! `profiler check`: which of the profiler's kernel programs this kernel accepts, and what
//! verifying each cost (bpf::check).
use anyhow::bail;

use profiler_common::VERIFIED_INSNS_BUDGET;

use crate::bpf::check::{ProgramCheck, check_programs};

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example:\n  profiler check          # a table: program, loaded or why not, \
                        instructions, load time\n  profiler check --json   # one object per program"
)]
pub struct CheckArgs {
    /// One JSON object per program (program, loaded, verified_insns, load_ms, refused), in a
    /// JSON array with one object per line.
    #[arg(long)]
    pub json: bool,
}

pub(super) fn run(args: &CheckArgs) -> anyhow::Result<()> {
    let checks = check_programs()?;
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        write_json(&mut out, &checks)
    } else {
        write_table(&mut out, &checks)
    };
    // A closed pipe (`| head`) is the reader's choice, not an error of ours.
    if let Err(e) = written
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        return Err(e.into());
    }
    if !checks.iter().any(|c| c.is_sampler() && c.loaded) {
        bail!("this kernel accepts none of the sampler's programs: see `refused` above");
    }
    Ok(())
}

fn write_json(out: &mut impl std::io::Write, checks: &[ProgramCheck]) -> std::io::Result<()> {
    writeln!(out, "[")?;
    for (i, c) in checks.iter().enumerate() {
        let comma = if i + 1 < checks.len() { "," } else { "" };
        writeln!(out, "  {}{comma}", serde_json::to_string(c)?)?;
    }
    writeln!(out, "]")
}

fn write_table(out: &mut impl std::io::Write, checks: &[ProgramCheck]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<16} {:>14} {:>10}  result",
        "program", "verified insns", "load"
    )?;
    for c in checks {
        let insns = c
            .verified_insns
            .map_or_else(|| "-".to_owned(), |n| n.to_string());
        let result = match (&c.refused, c.within_budget()) {
            (Some(why), _) => format!("refused: {why}"),
            (None, true) => "loaded".to_owned(),
            (None, false) => format!("loaded, over the budget of {VERIFIED_INSNS_BUDGET}"),
        };
        writeln!(
            out,
            "{:<16} {insns:>14} {:>7} ms  {result}",
            c.program, c.load_ms
        )?;
    }
    writeln!(
        out,
        "budget: {VERIFIED_INSNS_BUDGET} verified instructions a program (a quarter of the \
         verifier's limit); `-` where the kernel does not count them (before 5.16)"
    )?;
    writeln!(out, "object built by {}", env!("PROFILER_EBPF_BUILT_BY"))
}
