//! `cargo xtask lab zombie` / `crashloop`: incidents for the doctor to find. The lab itself
//! lives in the profiler (`profiler lab zombie`, profiler/src/lab.rs) so the integration tests
//! drive the same code; this task builds the profiler and runs it.
use std::process::{Command, ExitCode};

use anyhow::{Context, Result};

use crate::run;

/// Builds the profiler (debug: the lab does no sampling) and runs `profiler lab zombie`.
pub fn zombie(count: u32, cleanup: bool) -> Result<ExitCode> {
    lab(&["zombie", "--count", &count.to_string()], cleanup)
}

/// `profiler lab crashloop`: a supervisor restarting a failing program.
pub fn crashloop(cleanup: bool) -> Result<ExitCode> {
    lab(&["crashloop"], cleanup)
}

fn lab(args: &[&str], cleanup: bool) -> Result<ExitCode> {
    let bin = run::build(false)?;
    let mut cmd = Command::new(&bin);
    cmd.arg("lab").args(args);
    if cleanup {
        cmd.arg("--cleanup");
    }
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
