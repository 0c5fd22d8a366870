//! A reproducible zombie-memcg incident for the doctor to find, beside the pipeline: N v1
//! memory cgroups that each charge a little page cache, removed while the cache is still
//! charged (so they stay dying), and a poller named `kubelet` reading memory statistics in a
//! loop, as kubelet's cAdvisor does. `profiler-lab zombie` (and `cargo xtask lab zombie`) run
//! this; `--cleanup` undoes it. One implementation, used by the xtask and the tests.
use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::{force_empty, kill, memory_count, memory_parent, running, set_comm, spawn_detached};

/// Name of the lab's parent cgroup under the memory mount.
pub const LAB_CGROUP: &str = "profiler-lab";
/// Where the lab's files (page cache) and state live.
pub const LAB_DIR: &str = "/var/tmp/profiler-lab";
/// Bytes each lab process writes and reads: enough page cache to pin its memcg.
const FILE_BYTES: usize = 16 << 10;
/// The poller gives up on its own after this long, so a forgotten lab does not burn forever.
const POLLER_MAX: Duration = Duration::from_secs(3600);

/// What `zombie` did.
#[derive(Clone, Debug)]
pub struct LabReport {
    pub parent: PathBuf,
    /// memory `num_cgroups` before and after.
    pub before: u64,
    pub after: u64,
    /// Pid of the `kubelet` poller.
    pub poller_pid: u32,
}

/// The lab parent cgroup on this host.
pub fn lab_parent() -> anyhow::Result<PathBuf> {
    memory_parent(LAB_CGROUP)
}

/// Creates `count` dying memory cgroups under the lab parent and starts the poller.
pub fn zombie(count: u32) -> anyhow::Result<LabReport> {
    let parent = lab_parent()?;
    fs::create_dir_all(LAB_DIR).context(LAB_DIR)?;
    if !parent.exists() {
        fs::create_dir(&parent).with_context(|| format!("mkdir {}", parent.display()))?;
    }
    let baseline_file = Path::new(LAB_DIR).join("baseline");
    let before = memory_count()?;
    // The first run's count is the baseline `--cleanup` returns to (parent excluded).
    if !baseline_file.exists() {
        fs::write(&baseline_file, (before - 1).to_string())?;
    }
    let first = next_index();
    for i in first..first + count {
        let cg = parent.join(format!("z{i}"));
        fs::create_dir(&cg).with_context(|| format!("mkdir {}", cg.display()))?;
        charge_in(&cg, &Path::new(LAB_DIR).join(format!("f.{i}")))?;
        fs::remove_dir(&cg).with_context(|| format!("rmdir {}", cg.display()))?;
    }
    fs::write(Path::new(LAB_DIR).join("next"), (first + count).to_string())?;
    let poller_pid = start_poller(&parent)?;
    // The kernel frees nothing here, but offlining is asynchronous: let it settle.
    std::thread::sleep(Duration::from_millis(200));
    Ok(LabReport {
        parent,
        before,
        after: memory_count()?,
        poller_pid,
    })
}

fn next_index() -> u32 {
    fs::read_to_string(Path::new(LAB_DIR).join("next"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Forks a child that joins `cg` before it touches `file`, so the page cache it makes is
/// charged there; waits for it. A fork without exec keeps N=500 to about a second.
fn charge_in(cg: &Path, file: &Path) -> anyhow::Result<()> {
    let procs = cg.join("cgroup.procs");
    // SAFETY: the child only does file I/O and _exit; the lab runs single-threaded here.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        bail!("fork: {}", std::io::Error::last_os_error());
    }
    if pid == 0 {
        let ok = fs::write(&procs, std::process::id().to_string()).is_ok()
            && fs::write(file, vec![0x5au8; FILE_BYTES]).is_ok()
            && fs::read(file).is_ok();
        // SAFETY: leave the forked child without running the parent's destructors.
        unsafe { libc::_exit(i32::from(!ok)) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &raw mut status, 0) };
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("the lab process in {} failed", cg.display());
    }
    Ok(())
}

fn poller_pid_file() -> PathBuf {
    Path::new(LAB_DIR).join("poller.pid")
}

/// Starts `profiler-lab poller` (it outlives this command).
fn start_poller(parent: &Path) -> anyhow::Result<u32> {
    if let Some(pid) = running(&poller_pid_file(), "kubelet") {
        return Ok(pid);
    }
    let parent = parent
        .to_str()
        .context("the memory mount path is not UTF-8")?;
    spawn_detached(
        &["poller", "--parent", parent],
        &poller_pid_file(),
        "poller",
    )
}

/// The poller's body: names itself `kubelet` and reads memory.stat and memory.numa_stat of
/// the lab parent and the root until killed (or `POLLER_MAX`).
pub fn poller(parent: &Path) -> anyhow::Result<()> {
    set_comm(c"kubelet");
    let root = parent.parent().unwrap_or(parent).to_owned();
    let files: Vec<PathBuf> = [parent, root.as_path()]
        .iter()
        .flat_map(|d| [d.join("memory.stat"), d.join("memory.numa_stat")])
        .collect();
    let start = Instant::now();
    let mut buf = Vec::with_capacity(64 << 10);
    while start.elapsed() < POLLER_MAX {
        for f in &files {
            buf.clear();
            if let Ok(mut file) = fs::File::open(f) {
                let _ = std::io::Read::read_to_end(&mut file, &mut buf);
            }
        }
    }
    Ok(())
}

/// What `cleanup` did.
#[derive(Clone, Debug)]
pub struct CleanupReport {
    pub before: u64,
    pub after: u64,
    /// The count before the first lab run, if recorded.
    pub baseline: Option<u64>,
}

/// Stops the poller, frees the page cache that pins the dying cgroups, removes the parent.
pub fn cleanup() -> anyhow::Result<CleanupReport> {
    let before = memory_count()?;
    if let Some(pid) = running(&poller_pid_file(), "kubelet") {
        kill(pid);
    }
    let baseline = fs::read_to_string(Path::new(LAB_DIR).join("baseline"))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if Path::new(LAB_DIR).exists() {
        fs::remove_dir_all(LAB_DIR).context(LAB_DIR)?;
    }
    let parent = lab_parent()?;
    if parent.exists() {
        // Whatever cache is left (other files the lab processes touched) goes with it.
        force_empty(&parent);
        remove_tree(&parent)?;
    }
    // Freeing a memcg waits for RCU and workqueues: give it a moment to reach the baseline.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut after = memory_count()?;
    while baseline.is_some_and(|b| after > b) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        after = memory_count()?;
    }
    Ok(CleanupReport {
        before,
        after,
        baseline,
    })
}

/// rmdir of a cgroup tree, leaves first (cgroup directories hold only control files).
fn remove_tree(dir: &Path) -> anyhow::Result<()> {
    for e in fs::read_dir(dir)?.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&e.path())?;
        }
    }
    fs::remove_dir(dir).with_context(|| format!("rmdir {}", dir.display()))
}
