//! Pieces for benchmarks that watch BPF programs: child processes killed on drop, the
//! bpf_stats_enabled switch, per-program run time from fdinfo, and Ctrl-C aware sleeping.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    run,
    setup::{self, Extras},
    util,
};

/// What every benchmark starts with: its set-up extras installed, the release binary built,
/// and target/bench (where results go) made. Returns (binary, target/bench).
pub(crate) fn prepare(extras: Extras) -> Result<(PathBuf, PathBuf)> {
    prepare_build(extras, true)
}

/// `prepare` with the debug build when `release` is false (quicker to build on a busy host;
/// the BPF programs are the same).
pub(crate) fn prepare_build(extras: Extras, release: bool) -> Result<(PathBuf, PathBuf)> {
    setup::require(extras)?;
    let bin = run::build(release)?;
    let out_dir = util::target_dir().join("bench");
    fs::create_dir_all(&out_dir).with_context(|| format!("cannot create {}", out_dir.display()))?;
    Ok((bin, out_dir))
}

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Catches Ctrl-C so the guards below can restore bpf_stats_enabled and stop the load; the
/// children get the signal too and stop, and `sleep` turns it into an error.
pub(crate) fn catch_ctrl_c() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t,
        )
    };
}

/// Sleeps, returning early with an error on Ctrl-C.
pub(crate) fn sleep(duration: Duration) -> Result<()> {
    let end = Instant::now() + duration;
    while Instant::now() < end {
        ensure!(!INTERRUPTED.load(Ordering::SeqCst), "interrupted by Ctrl-C");
        thread::sleep(Duration::from_millis(100).min(end - Instant::now()));
    }
    Ok(())
}

/// CPU time (user + system) a live process has used so far, seconds, from /proc/PID/stat.
pub(crate) fn process_cpu_seconds(pid: u32) -> Result<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("process {pid} is not running"))?;
    // Fields after the comm, which may hold spaces but ends at the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the comm.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok((ticks(11) + ticks(12)) as f64 / hz)
}

pub(crate) fn children_cpu_seconds() -> f64 {
    // SAFETY: an all-zero rusage is valid, and getrusage only fills it in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: usage is a valid rusage for the kernel to fill in.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &raw mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// A child process that is killed when dropped, so an error never leaves load or a profiler behind.
pub(crate) struct Proc {
    name: String,
    child: Child,
}

impl Proc {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn spawn(cmd: &mut Command) -> Result<Self> {
        let name = util::display(cmd);
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start `{name}`"))?;
        Ok(Self { name, child })
    }

    pub(crate) fn wait(&mut self, limit: Duration) -> Result<ExitStatus> {
        let end = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            ensure!(!INTERRUPTED.load(Ordering::SeqCst), "interrupted by Ctrl-C");
            ensure!(
                Instant::now() < end,
                "`{}` did not exit within {limit:?}; killed it",
                self.name
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Asks the child to stop as Ctrl-C would.
    pub(crate) fn interrupt(&self) {
        // SAFETY: the child is not reaped yet (we own it), so its pid still names it.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
    }

    pub(crate) fn wait_success(&mut self, limit: Duration) -> Result<()> {
        let status = self.wait(limit)?;
        ensure!(
            status.success(),
            "`{}` failed ({status}); see its messages above",
            self.name
        );
        Ok(())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // Both are no-ops once the child has been reaped.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Turns on the kernel's per-program run time accounting, restoring the old value when dropped.
pub(crate) struct BpfStatsEnabled {
    previous: String,
}

impl BpfStatsEnabled {
    pub(crate) fn enable() -> Result<Self> {
        let previous =
            fs::read_to_string(BPF_STATS).with_context(|| format!("cannot read {BPF_STATS}"))?;
        fs::write(BPF_STATS, "1")
            .with_context(|| format!("cannot enable {BPF_STATS}: run the bench as root"))?;
        Ok(Self { previous })
    }
}

impl Drop for BpfStatsEnabled {
    fn drop(&mut self) {
        if let Err(err) = fs::write(BPF_STATS, self.previous.trim()) {
            eprintln!(
                "warning: could not restore {BPF_STATS} to {}: {err}",
                self.previous.trim()
            );
        }
    }
}

/// Run time of a process's BPF programs, summed over distinct programs (from fdinfo).
#[derive(Clone, Copy, Default)]
pub(crate) struct ProgStats {
    /// Total time in the programs, ns.
    pub run_time_ns: u64,
    /// Number of program runs.
    pub run_cnt: u64,
}

impl ProgStats {
    /// Both runs together.
    pub(crate) fn plus(self, other: Self) -> Self {
        Self {
            run_time_ns: self.run_time_ns + other.run_time_ns,
            run_cnt: self.run_cnt + other.run_cnt,
        }
    }

    pub(crate) fn of(proc: &Proc) -> Result<Self> {
        let programs = Self::by_program(proc)?;
        let total = programs.values().fold(Self::default(), |a, p| a.plus(*p));
        if total.run_cnt == 0 {
            bail!(
                "`{}` has no BPF program that ran ({} loaded); see its messages above",
                proc.name,
                programs.len()
            );
        }
        Ok(total)
    }

    /// Each program `proc` holds, by program id (a program held through several fds counts
    /// once). Tail-called programs run inside their caller and show no runs of their own.
    pub(crate) fn by_program(proc: &Proc) -> Result<BTreeMap<u64, Self>> {
        let pid = proc.child.id();
        let mut programs = BTreeMap::new();
        let fds = fs::read_dir(format!("/proc/{pid}/fd"))
            .with_context(|| format!("`{}` is not running", proc.name))?;
        for fd in fds.flatten() {
            if fs::read_link(fd.path())
                .is_ok_and(|target| target == Path::new("anon_inode:bpf-prog"))
            {
                let info = fs::read_to_string(format!(
                    "/proc/{pid}/fdinfo/{}",
                    fd.file_name().to_string_lossy()
                ))
                .unwrap_or_default();
                let num = |key| {
                    util::field(&info, key)
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                programs.insert(
                    num("prog_id"),
                    Self {
                        run_time_ns: num("run_time_ns"),
                        run_cnt: num("run_cnt"),
                    },
                );
            }
        }
        Ok(programs)
    }

    /// What ran between `earlier` and `self` (both of the same program).
    pub(crate) fn since(self, earlier: Self) -> Self {
        Self {
            run_time_ns: self.run_time_ns.saturating_sub(earlier.run_time_ns),
            run_cnt: self.run_cnt.saturating_sub(earlier.run_cnt),
        }
    }

    pub(crate) fn ns_per_run(self) -> f64 {
        self.run_time_ns as f64 / self.run_cnt as f64
    }
}

/// Reaps `child`, returning whether it exited 0 and its resource usage.
pub(crate) fn wait4(child: &Child) -> Result<(bool, libc::rusage)> {
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid, and wait4 only fills it in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own unreaped child, with valid out pointers.
    let pid = unsafe {
        libc::wait4(
            child.id() as libc::pid_t,
            &raw mut status,
            0,
            &raw mut usage,
        )
    };
    if pid < 0 {
        bail!("wait4: {}", std::io::Error::last_os_error());
    }
    Ok((
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        usage,
    ))
}

/// `x` to `places` decimals, as the benchmark JSON reports its figures.
pub(crate) fn round(x: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (x * scale).round() / scale
}

/// Writes a benchmark's results, pretty-printed, to `path` and says so.
pub(crate) fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value).expect("a JSON value serializes") + "\n";
    fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// Names of loaded BPF programs by id (fdinfo has none), for per-program figures.
pub(crate) fn program_names() -> BTreeMap<u64, String> {
    aya::programs::loaded_programs()
        .flatten()
        .map(|p| {
            let name = p.name_as_str().unwrap_or("?").to_owned();
            (u64::from(p.id()), name)
        })
        .collect()
}
