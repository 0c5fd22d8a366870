//! How much CPU a fixture really used while it was recorded, from the kernel's own accounting
//! (/proc/PID/stat), and so how many samples a recording at F Hz must hold for it: the check
//! that `-F` and `-d` mean what they say, whatever else the machine is busy with.

use std::time::Instant;

/// utime + stime of `pid` in seconds (/proc/PID/stat; USER_HZ is 100 on Linux).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/stat: {e}"));
    let after = stat.rsplit_once(')').expect("comm in parentheses").1;
    let f: Vec<f64> = after
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    (f[11] + f[12]) / 100.0
}

/// A process's CPU time and the wall time from now on.
pub struct CpuUsage {
    pid: u32,
    cpu: f64,
    wall: Instant,
}

impl CpuUsage {
    pub fn start(pid: u32) -> Self {
        Self {
            pid,
            cpu: cpu_seconds(pid),
            wall: Instant::now(),
        }
    }

    /// The band of samples a recording of `secs` at `hz`, made since `start` (with the
    /// profiler's start-up and symbolization around it), must have for this process: at most
    /// F x the CPU it used in all that time (+10% and 10 ms of tick rounding), at least 60%
    /// of F x d x its average share of a CPU over that time.
    pub fn sample_band(&self, hz: f64, secs: f64) -> (f64, f64) {
        let used = cpu_seconds(self.pid) - self.cpu;
        let wall = self.wall.elapsed().as_secs_f64();
        let share = (used / wall).min(1.0);
        (0.6 * hz * secs * share, 1.1 * hz * (used + 0.01))
    }
}
