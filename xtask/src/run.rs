//! `cargo xtask run`: builds the profiler and runs it with the given arguments, passing on its exit code.

use std::path::PathBuf;
use std::process::{Command, ExitCode, ExitStatus};

use anyhow::{Context, Result};

use crate::setup::{self, Extras};
use crate::util;

/// `target/<profile>/profiler`, absolute.
pub(crate) fn profiler_bin(release: bool) -> PathBuf {
    let profile = if release { "release" } else { "debug" };
    util::target_dir().join(profile).join("profiler")
}

pub(crate) fn build_cmd(release: bool) -> Command {
    let mut cmd = util::cargo();
    cmd.args(["build", "-p", "profiler"]);
    if release {
        cmd.arg("--release");
    }
    cmd
}

/// Builds the profiler and returns the path of its binary.
pub(crate) fn build(release: bool) -> Result<PathBuf> {
    util::run(&mut build_cmd(release)).context("building the profiler failed")?;
    Ok(profiler_bin(release))
}

pub(crate) fn run(debug: bool, args: &[String]) -> Result<ExitCode> {
    setup::require(Extras::default())?;
    let bin = build(!debug)?;
    let mut child = Command::new(&bin)
        .args(args)
        .spawn()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    // Ctrl-C reaches the whole foreground process group: the profiler stops and writes its
    // outputs, and we must still be here afterwards to pass its exit code on. Ignoring only
    // after the spawn keeps the child's SIGINT disposition at its default.
    // SAFETY: installing SIG_IGN runs no code of ours in signal context.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    let status = child.wait().context("waiting for the profiler failed")?;
    Ok(exit_code(status))
}

/// The child's exit code; death by signal N becomes 128 + N, as shells report it.
fn exit_code(status: ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .unwrap_or(1);
    ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1))
}
