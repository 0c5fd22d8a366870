//! `profiler doctor`: one command for a zombie-cgroup CPU drain (see docs/doctor.md).
use std::{process::ExitCode, time::Duration};

use super::record::OnOff;
use crate::{
    doctor::{self, DoctorConfig},
    unwind::UnwindMode,
    util::{self, say},
};

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit status: 0 healthy, 3 a warning, 4 an alarm (the verdict); 1 the \
                        doctor could not run, 2 a bad command line.\n\n\
                        Example:\n  profiler doctor              # watch 10 s, then the report\n  \
                        profiler doctor -d 30s --json > findings.json   # the report on stderr"
)]
pub struct DoctorArgs {
    /// How long to watch (profile and cgroup churn), e.g. 10s, 30s, 1m.
    #[arg(short, long, default_value = "10s", value_parser = util::parse_duration)]
    pub duration: Duration,
    /// Profile sampling rate per CPU, Hz (1..=10000).
    #[arg(short = 'F', long, default_value_t = 199, value_name = "HZ", value_parser = super::record::parse_frequency)]
    pub frequency: u32,
    /// Print the findings as JSON on stdout (the text report then goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// How user stacks are walked (as for `record`). The doctor reads kernel stacks, so
    /// frame pointers, the cheapest, are the default.
    #[arg(long, value_enum, default_value_t = UnwindMode::Fp)]
    pub unwind: UnwindMode,
    /// Kernel memory for unwind tables with --unwind auto|dwarf: 64M, 512K...
    #[arg(long, default_value = "64M", value_name = "BYTES", value_parser = crate::util::parse_bytes)]
    pub unwind_memory: u64,
    /// Name Python functions in CPython processes (as for `record`; off by default here).
    #[arg(long, value_enum, default_value_t = OnOff::Off, value_name = "on|off")]
    pub python: OnOff,
}

/// Runs the window and reports; the exit status says the verdict (`Level::exit_code`).
pub(super) fn run(args: DoctorArgs, verbose: bool) -> anyhow::Result<ExitCode> {
    super::check_privileges()?;
    util::raise_fd_limit();
    let findings = doctor::examine(
        &DoctorConfig {
            duration: args.duration,
            frequency_hz: args.frequency,
            unwind: args.unwind,
            unwind_memory: args.unwind_memory,
            python: args.python == OnOff::On,
        },
        &mut super::progress::printer(verbose),
    )?;
    let verdict = doctor::verdict::judge(&findings);
    let text = doctor::text(&findings, &verdict);
    if args.json {
        let _ = std::io::Write::write_all(&mut std::io::stderr(), text.as_bytes());
        say!("{}", doctor::json(&findings, &verdict));
    } else {
        let _ = std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes());
    }
    Ok(ExitCode::from(verdict.level.exit_code()))
}
