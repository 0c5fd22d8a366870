//! A reproducible crash loop for the doctor to find, beside the pipeline (as `lab` is): a
//! `supervisor` that, like a service manager with Restart=always, creates a v1 memory cgroup
//! for its service, moves the child into it, runs `crashy-agent` (a shell script that writes
//! page cache and exits with status 2), removes the cgroup and starts again. Every start and
//! exit goes to a log the tests compare with what the doctor saw. `profiler-lab crashloop`
//! (and `cargo xtask lab crashloop`) run it; `--cleanup` undoes it.
//!
//! With `--per-attempt` the supervisor starts each attempt in a cgroup of its own,
//! `run-<n>` (as a container runtime makes a new container, or a shell supervisor a numbered
//! cgroup), and creates and removes it with short-lived `mkdir` and `rmdir` processes.
use std::{
    ffi::CString,
    fs,
    io::Write as _,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::{force_empty, kill, memory_count, memory_parent, running, set_comm, spawn_detached};

/// The lab's parent cgroup under the memory mount; the service's is `SERVICE` below it.
pub const CRASHLOOP_CGROUP: &str = "profiler-crashloop";
/// The service's cgroup, created anew for every start (as systemd does for a unit).
pub const SERVICE: &str = "crashy-agent.service";
/// With `--per-attempt`, attempt n's cgroup is `run-<n>`.
pub const ATTEMPT_PREFIX: &str = "run-";
/// Where the script, its files (page cache), the log and the supervisor's pid live.
pub const CRASHLOOP_DIR: &str = "/var/tmp/profiler-crashloop";
/// The looping program's name (the script's, hence its comm).
pub const PROGRAM: &str = "crashy-agent";
/// The exit status the program fails with.
pub const EXIT_CODE: i32 = 2;
/// The supervisor stops on its own after this long, so a forgotten lab does not loop forever.
const SUPERVISOR_MAX: Duration = Duration::from_secs(3600);

/// The script: page cache charged to the service's memcg (so each removed cgroup stays
/// dying), then a failure. `printf` is a shell builtin: no other process runs in the cgroup.
const SCRIPT: &str = "#!/bin/sh\n\
# crashy-agent: the failing service of `profiler-lab crashloop`\n\
printf '%16384s' '' > /var/tmp/profiler-crashloop/cache.$$\n\
exit 2\n";

/// One line of the supervisor's log (`log` in `CRASHLOOP_DIR`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogLine {
    /// A start: pid, CLOCK_MONOTONIC ns.
    Start { pid: u32, mono_ns: u64 },
    /// An exit: pid, wait(2) status, CLOCK_MONOTONIC ns.
    Exit { pid: u32, status: u32, mono_ns: u64 },
}

/// Parses the log ("start PID NS" / "exit PID STATUS NS" lines); a torn last line is skipped.
pub fn read_log() -> anyhow::Result<Vec<LogLine>> {
    let path = Path::new(CRASHLOOP_DIR).join("log");
    let text = fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    Ok(text.lines().filter_map(parse_line).collect())
}

fn parse_line(line: &str) -> Option<LogLine> {
    let f: Vec<&str> = line.split(' ').collect();
    match f.as_slice() {
        ["start", pid, ns] => Some(LogLine::Start {
            pid: pid.parse().ok()?,
            mono_ns: ns.parse().ok()?,
        }),
        ["exit", pid, status, ns] => Some(LogLine::Exit {
            pid: pid.parse().ok()?,
            status: status.parse().ok()?,
            mono_ns: ns.parse().ok()?,
        }),
        _ => None,
    }
}

fn parent() -> anyhow::Result<PathBuf> {
    memory_parent(CRASHLOOP_CGROUP)
}

fn pid_file() -> PathBuf {
    Path::new(CRASHLOOP_DIR).join("supervisor.pid")
}

/// The supervisor's pid if it runs.
fn running_supervisor() -> Option<u32> {
    running(&pid_file(), "supervisor")
}

/// Starts the supervisor (in its own session: it outlives this command); returns its pid.
pub fn crashloop(restart_ms: u64, per_attempt: bool) -> anyhow::Result<u32> {
    let parent = parent()?;
    if let Some(pid) = running_supervisor() {
        return Ok(pid);
    }
    fs::create_dir_all(CRASHLOOP_DIR).context(CRASHLOOP_DIR)?;
    let script = Path::new(CRASHLOOP_DIR).join(PROGRAM);
    fs::write(&script, SCRIPT).with_context(|| script.display().to_string())?;
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755))?;
    if !parent.exists() {
        fs::create_dir(&parent).with_context(|| format!("mkdir {}", parent.display()))?;
    }
    let restart_ms = restart_ms.to_string();
    let mut args = vec!["supervisor", "--restart-ms", &restart_ms];
    if per_attempt {
        args.push("--per-attempt");
    }
    spawn_detached(&args, &pid_file(), "supervisor")
}

/// Attempt `n`'s cgroup: the service's, made anew by the supervisor itself, or with
/// `per_attempt` a cgroup of its own made by a `mkdir` process.
fn make_attempt_cgroup(parent: &Path, n: u64, per_attempt: bool) -> anyhow::Result<PathBuf> {
    if !per_attempt {
        let service = parent.join(SERVICE);
        if service.exists() {
            let _ = fs::remove_dir(&service);
        }
        fs::create_dir(&service).with_context(|| format!("mkdir {}", service.display()))?;
        return Ok(service);
    }
    let attempt = parent.join(format!("{ATTEMPT_PREFIX}{n}"));
    helper("mkdir", &attempt)?;
    Ok(attempt)
}

/// Removes an attempt's cgroup as `make_attempt_cgroup` made it.
fn remove_attempt_cgroup(cgroup: &Path, per_attempt: bool) -> anyhow::Result<()> {
    if per_attempt {
        return helper("rmdir", cgroup);
    }
    fs::remove_dir(cgroup).with_context(|| format!("rmdir {}", cgroup.display()))
}

/// Runs `/bin/<tool> <path>` to its end.
fn helper(tool: &str, path: &Path) -> anyhow::Result<()> {
    let status = std::process::Command::new(format!("/bin/{tool}"))
        .arg(path)
        .status()
        .with_context(|| format!("running {tool}"))?;
    anyhow::ensure!(status.success(), "{tool} {}: {status}", path.display());
    Ok(())
}

fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The supervisor's body: names itself `supervisor` and restarts the program until killed.
pub fn supervisor(restart_ms: u64, per_attempt: bool) -> anyhow::Result<()> {
    set_comm(c"supervisor");
    let parent = parent()?;
    let script = CString::new(format!("{CRASHLOOP_DIR}/{PROGRAM}"))?;
    let argv = [script.as_ptr(), std::ptr::null()];
    let mut log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(Path::new(CRASHLOOP_DIR).join("log"))?;
    let start = Instant::now();
    for n in 0.. {
        if start.elapsed() >= SUPERVISOR_MAX {
            break;
        }
        let service = make_attempt_cgroup(&parent, n, per_attempt)?;
        let mut fds = [0i32; 2];
        // SAFETY: a pipe into a two-int array.
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            bail!("pipe: {}", std::io::Error::last_os_error());
        }
        // SAFETY: the child only reads a byte and execs (async-signal-safe calls); the
        // supervisor is single-threaded.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            bail!("fork: {}", std::io::Error::last_os_error());
        }
        if pid == 0 {
            // Wait until the supervisor has moved us into the service's cgroup, as a service
            // manager does before exec.
            let mut b = 0u8;
            // SAFETY: reading one byte from our end of the pipe, then exec or _exit.
            unsafe {
                libc::close(fds[1]);
                libc::read(fds[0], (&raw mut b).cast(), 1);
                libc::execv(script.as_ptr(), argv.as_ptr());
                libc::_exit(127);
            }
        }
        // SAFETY: closing our copy of the child's end.
        unsafe { libc::close(fds[0]) };
        let moved = fs::write(service.join("cgroup.procs"), pid.to_string());
        let _ = writeln!(log, "start {pid} {}", mono_ns());
        // SAFETY: one byte to the child, then our end closes.
        unsafe {
            libc::write(fds[1], [1u8].as_ptr().cast(), 1);
            libc::close(fds[1]);
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &raw mut status, 0) };
        let _ = writeln!(log, "exit {pid} {status} {}", mono_ns());
        moved.with_context(|| format!("moving {pid} into {}", service.display()))?;
        remove_attempt_cgroup(&service, per_attempt)?;
        std::thread::sleep(Duration::from_millis(restart_ms));
    }
    Ok(())
}

/// What `cleanup` did.
#[derive(Clone, Debug)]
pub struct CleanupReport {
    /// Starts in the log.
    pub starts: usize,
    /// memory `num_cgroups` before and after.
    pub before: u64,
    pub after: u64,
}

/// Stops the supervisor, frees the page cache that pins the dying memcgs, removes the lab.
pub fn cleanup() -> anyhow::Result<CleanupReport> {
    let before = memory_count()?;
    if let Some(pid) = running_supervisor() {
        kill(pid);
        // Its last child may still be running: give both a moment.
        let deadline = Instant::now() + Duration::from_secs(2);
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let starts = read_log().map_or(0, |l| {
        l.iter()
            .filter(|l| matches!(l, LogLine::Start { .. }))
            .count()
    });
    if Path::new(CRASHLOOP_DIR).exists() {
        fs::remove_dir_all(CRASHLOOP_DIR).context(CRASHLOOP_DIR)?;
    }
    let parent = parent()?;
    if parent.exists() {
        force_empty(&parent);
        for entry in fs::read_dir(&parent)?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if (name == SERVICE || name.starts_with(ATTEMPT_PREFIX)) && entry.path().is_dir() {
                fs::remove_dir(entry.path())
                    .with_context(|| format!("rmdir {}", entry.path().display()))?;
            }
        }
        fs::remove_dir(&parent).with_context(|| format!("rmdir {}", parent.display()))?;
    }
    Ok(CleanupReport {
        starts,
        before,
        after: memory_count()?,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn log_lines_parse_and_torn_ones_are_skipped() {
        use super::{LogLine, parse_line};
        assert_eq!(
            parse_line("start 12 99"),
            Some(LogLine::Start {
                pid: 12,
                mono_ns: 99
            })
        );
        assert_eq!(
            parse_line("exit 12 512 100"),
            Some(LogLine::Exit {
                pid: 12,
                status: 512,
                mono_ns: 100
            })
        );
        assert_eq!(parse_line("exit 12 51"), None);
    }
}
