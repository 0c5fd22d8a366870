//! `profiler doctor`: one command for a zombie-cgroup CPU drain (see docs/doctor.md).
use std::time::Duration;

use crate::{
    doctor::{self, DoctorConfig},
    util,
};

#[derive(Debug, clap::Args)]
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
}

pub fn run(args: DoctorArgs, verbose: bool) -> anyhow::Result<()> {
    super::check_privileges()?;
    let findings = doctor::examine(&DoctorConfig {
        duration: args.duration,
        frequency_hz: args.frequency,
        verbose,
    })?;
    let verdict = doctor::verdict::judge(&findings);
    let text = doctor::text(&findings, &verdict);
    if args.json {
        eprint!("{text}");
        println!("{}", doctor::json(&findings, &verdict));
    } else {
        print!("{text}");
    }
    Ok(())
}
