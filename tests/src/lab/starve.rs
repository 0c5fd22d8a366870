//! CPU waits on demand. `starve` (`cargo xtask lab starve`): a SCHED_FIFO spinner pinned to
//! one CPU beside a normal thread pinned there that wakes every 10 ms. RT throttling
//! (sched_rt_runtime_us: 950 ms of each second by default; the fair server from 6.12 gives
//! the same 50 ms) lets the normal thread run only in the rest of each second: it waits up
//! to ~950 ms, the starvation behind the incident (a NAPI or softirq thread that does not
//! get its CPU). `contend`: threads pinned to one CPU that share it for a while, then print
//! what the kernel counted of their waits (/proc/thread-self/schedstat).
use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::{kill, running, set_comm, spawn_detached};

pub const STARVE_DIR: &str = "/var/tmp/profiler-starve";
/// The comm of the spinner (the lab's main thread) and of the starved thread.
pub const SPINNER: &str = "rt-spinner";
pub const WAKER: &str = "waker";
/// The spinner gives up by itself after this long, should nobody clean up.
const MAX_RUN: Duration = Duration::from_secs(600);
/// How often the waker wakes.
const WAKE_EVERY: Duration = Duration::from_millis(10);

fn pid_file() -> PathBuf {
    Path::new(STARVE_DIR).join("spinner.pid")
}

/// The waker's thread id, written by the lab once it runs.
pub fn waker_tid_file() -> PathBuf {
    Path::new(STARVE_DIR).join("waker.tid")
}

/// The last online CPU: not CPU 0, which the console and most housekeeping prefer.
pub fn default_cpu() -> u32 {
    let online = fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let last = online.trim().rsplit([',', '-']).next().unwrap_or("0");
    last.parse().unwrap_or(0)
}

/// Starts the lab on `cpu` (in its own session: it outlives this command); returns the
/// spinner's pid. Refused where RT throttling is off: the spinner would then keep the CPU.
pub fn starve(cpu: u32) -> anyhow::Result<u32> {
    let runtime = fs::read_to_string("/proc/sys/kernel/sched_rt_runtime_us")
        .context("reading /proc/sys/kernel/sched_rt_runtime_us")?;
    if runtime.trim() == "-1" {
        bail!(
            "RT throttling is off (kernel.sched_rt_runtime_us = -1): a SCHED_FIFO spinner would \
             keep CPU {cpu} for good; set it to 950000 first"
        );
    }
    if let Some(pid) = running(&pid_file(), SPINNER) {
        return Ok(pid);
    }
    fs::create_dir_all(STARVE_DIR).context(STARVE_DIR)?;
    let _ = fs::remove_file(waker_tid_file());
    let cpu = cpu.to_string();
    let pid = spawn_detached(&["starver", "--cpu", &cpu], &pid_file(), "spinner")?;
    // Ready when the waker has said its tid (the spinner may not have the CPU yet).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !waker_tid_file().exists() {
        if Instant::now() > deadline {
            bail!("the starve lab did not start its waker within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(pid)
}

/// The lab's body: the waker in a thread of its own, then this thread spins at SCHED_FIFO.
pub fn starver(cpu: u32) -> anyhow::Result<()> {
    pin_to(0, cpu)?;
    std::thread::spawn(move || {
        set_comm(c"waker");
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let _ = fs::write(waker_tid_file(), tid.to_string());
        let mut n = 0u64;
        loop {
            std::thread::sleep(WAKE_EVERY);
            n = n.wrapping_add(1);
            std::hint::black_box(n);
        }
    });
    // Give the waker its first run before the spinner takes the CPU.
    std::thread::sleep(Duration::from_millis(50));
    set_comm(c"rt-spinner");
    let param = libc::sched_param { sched_priority: 10 };
    // SAFETY: a valid sched_param for this thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &raw const param) } != 0 {
        bail!(
            "sched_setscheduler(SCHED_FIFO): {}",
            std::io::Error::last_os_error()
        );
    }
    spin_for(MAX_RUN);
    Ok(())
}

/// Stops the lab; whether it was running.
pub fn cleanup() -> anyhow::Result<bool> {
    let pid = running(&pid_file(), SPINNER);
    if let Some(pid) = pid {
        kill(pid);
    }
    if Path::new(STARVE_DIR).exists() {
        fs::remove_dir_all(STARVE_DIR).context(STARVE_DIR)?;
    }
    Ok(pid.is_some())
}

/// `threads` threads pinned to `cpu`, busy for `ms` ms of wall time, named `contend-N`;
/// prints `tid run_delay_ns` of each (the kernel's schedstat, read by the thread at its end:
/// its whole life's waits). With `migrate_to`, this thread moves them all between `cpu` and
/// that CPU every 15 ms, so that waits begin on one CPU and end on the other.
pub fn contend(cpu: u32, threads: u32, ms: u64, migrate_to: Option<u32>) -> anyhow::Result<()> {
    let (tids, tid_rx) = std::sync::mpsc::channel();
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let tids = tids.clone();
            std::thread::spawn(move || -> anyhow::Result<(i32, u64)> {
                pin_to(0, cpu)?;
                let name = std::ffi::CString::new(format!("contend-{i}"))?;
                set_comm(&name);
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() };
                let _ = tids.send(tid);
                spin_for(Duration::from_millis(ms));
                let stat = fs::read_to_string("/proc/thread-self/schedstat")?;
                let delay = stat
                    .split_whitespace()
                    .nth(1)
                    .and_then(|d| d.parse().ok())
                    .context("no run_delay in /proc/thread-self/schedstat")?;
                Ok((tid, delay))
            })
        })
        .collect();
    drop(tids);
    if let Some(other) = migrate_to {
        let tids: Vec<i32> = tid_rx.iter().collect();
        let end = Instant::now() + Duration::from_millis(ms);
        for to in [other, cpu].into_iter().cycle() {
            if Instant::now() >= end {
                break;
            }
            for &tid in &tids {
                // A thread that already ended is gone: nothing to move.
                let _ = pin_to(tid, to);
            }
            std::thread::sleep(Duration::from_millis(15));
        }
    }
    for h in handles {
        let (tid, delay) = h
            .join()
            .map_err(|_| anyhow::anyhow!("a thread panicked"))??;
        println!("{tid} {delay}");
    }
    Ok(())
}

/// Keeps thread `tid` (0: this one) on `cpu` only.
fn pin_to(tid: i32, cpu: u32) -> anyhow::Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET stays inside it for cpu < 1024.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= 1024 {
        bail!("CPU {cpu} is out of range");
    }
    unsafe { libc::CPU_SET(cpu as usize, &mut set) };
    // SAFETY: a valid set of the size given.
    if unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &raw const set) } != 0 {
        bail!(
            "cannot pin to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Burns this thread's CPU for `how_long`.
fn spin_for(how_long: Duration) {
    let start = Instant::now();
    let mut x = 0u64;
    while start.elapsed() < how_long {
        for _ in 0..10_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}
