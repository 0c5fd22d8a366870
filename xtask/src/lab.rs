//! `cargo xtask lab zombie` / `crashloop` / `starve` (`--cleanup`): incidents for the doctor to find. The lab is test
//! support, not part of the profiler: it lives in the tests crate (tests/src/lab, the
//! `profiler-lab` binary) so the integration tests drive the same code; this task builds it
//! and runs it.
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result};

use crate::util;

/// Builds `profiler-lab` and returns its path. The labs run it debug (they do no sampling);
/// the heat-map benchmark's synthetic capture of millions of samples wants it release.
pub(crate) fn build(release: bool) -> Result<PathBuf> {
    let mut cmd = util::cargo();
    cmd.args(["build", "-p", "profiler-tests", "--bin", "profiler-lab"]);
    if release {
        cmd.arg("--release");
    }
    util::run(&mut cmd).context("building profiler-lab failed")?;
    let profile = if release { "release" } else { "debug" };
    Ok(util::target_dir().join(profile).join("profiler-lab"))
}

/// `profiler-lab ARGS`: `zombie` (dying memory cgroups and a `kubelet` poller), `crashloop`
/// (a supervisor restarting a failing program), each with `--cleanup`.
pub(crate) fn run(args: &[String]) -> Result<ExitCode> {
    let bin = build(false)?;
    let status = Command::new(&bin)
        .args(args)
        .status()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
