//! Reproducible incidents for the doctor to find, and synthetic captures for the benchmarks:
//! test support, not part of the profiler. The `profiler-lab` binary (src/bin/profiler_lab.rs)
//! runs them for the integration tests and for `cargo xtask lab` / `cargo xtask bench heatmap`.
//! What the zombie and crash-loop labs share (their v1 memory parent, a helper process in its
//! own session found again by pid file and comm, emptying the parent) lives here.
pub mod crashloop;
pub mod starve;
pub mod synth;
pub mod zombie;

use std::{
    ffi::CStr,
    fs,
    io::Write as _,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::Context as _;

use profiler::testkit::cgroups;

/// `name` under the v1 memory mount: the parent cgroup of a lab.
fn memory_parent(name: &str) -> anyhow::Result<PathBuf> {
    let mount = cgroups::memory_mount()
        .context("no v1 memory cgroup hierarchy is mounted; the lab needs one")?;
    Ok(mount.join(name))
}

/// memory `num_cgroups` from /proc/cgroups (dying ones included).
fn memory_count() -> anyhow::Result<u64> {
    cgroups::num_cgroups("memory").context("no memory line in /proc/cgroups")
}

/// The pid in `pid_file` if that process still runs as `comm` (so a reused pid is never
/// taken for the lab's helper, nor killed).
fn running(pid_file: &Path, comm: &str) -> Option<u32> {
    let pid: u32 = fs::read_to_string(pid_file).ok()?.trim().parse().ok()?;
    let now = fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    (now.trim() == comm).then_some(pid)
}

/// Starts this binary with `args` in its own session (it outlives the command, and a
/// terminal's Ctrl-C does not reach it); its pid goes to `pid_file`.
fn spawn_detached(args: &[&str], pid_file: &Path, what: &str) -> anyhow::Result<u32> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        })
    };
    let child = cmd
        .spawn()
        .with_context(|| format!("starting the {what}"))?;
    fs::write(pid_file, child.id().to_string())?;
    Ok(child.id())
}

/// Names this process (its comm), as the program the lab plays.
fn set_comm(name: &CStr) {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0) };
}

/// SIGKILL to a helper found by `running`.
fn kill(pid: u32) {
    // SAFETY: a signal to the process we started (checked by comm in `running`).
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

/// Frees whatever page cache is still charged below `parent`, so its dying cgroups can go.
fn force_empty(parent: &Path) {
    let _ = fs::OpenOptions::new()
        .write(true)
        .open(parent.join("memory.force_empty"))
        .and_then(|mut f| f.write_all(b"0"));
}
