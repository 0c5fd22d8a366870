//! The agent's own figures for `cargo xtask bench agent` (bench_agent.rs runs it): taken at the
//! end of the warm-up and at the end through its API, /proc and its BPF programs' fdinfo, and
//! after it stopped from its data dir and `profiler query`. Each figure says how it was taken.
use std::{
    collections::BTreeMap,
    fs,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use serde_json::json;

use crate::{
    bench_agent::size_of,
    bench_support::{Proc, ProgStats, program_names, round},
    util,
};

/// The agent's window length: the store grows by windows.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);

/// Waited at most for the agent's first stored window after the warm-up.
const FIRST_WINDOW_WAIT: Duration = Duration::from_secs(60);

/// A loopback address nobody listens on now, for the agent's API.
pub(crate) fn free_loopback_port() -> Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// The agent at one moment.
pub(crate) struct Snapshot {
    at: Instant,
    /// `profiler_store_used_bytes`: database pages in use after the last window written.
    store_used: u64,
    /// `profiler_windows_total{outcome="stored"}`.
    windows: u64,
    /// /proc/PID/io `write_bytes`: bytes the agent caused to be written to disk.
    write_bytes: u64,
    /// Run time of each BPF program, by program id.
    programs: BTreeMap<u64, ProgStats>,
}

impl Snapshot {
    /// Waits for a stored window (the store's size is known from then on) and reads the rest.
    pub(crate) fn take(proc: &Proc, api: SocketAddr) -> Result<Self> {
        let waited = Instant::now();
        loop {
            let metrics = String::from_utf8_lossy(&get(api, "/metrics")?.1).into_owned();
            let value = |name: &str| {
                metrics
                    .lines()
                    .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            };
            let windows = value("profiler_windows_total{outcome=\"stored\"} ");
            if let (Some(used), Some(windows)) = (value("profiler_store_used_bytes "), windows) {
                return Ok(Self {
                    at: Instant::now(),
                    store_used: used as u64,
                    windows: windows as u64,
                    write_bytes: write_bytes(proc.pid())?,
                    programs: ProgStats::by_program(proc)?,
                });
            }
            ensure!(
                waited.elapsed() < FIRST_WINDOW_WAIT,
                "the agent stored no window within {FIRST_WINDOW_WAIT:?} of its warm-up"
            );
            crate::bench_support::sleep(Duration::from_millis(500))?;
        }
    }
}

/// What was measured of the agent, over the run and after it.
pub(crate) struct Probed {
    /// Seconds between the two snapshots.
    span_s: f64,
    /// Growth of the database in use, and over how many windows.
    store_growth: i64,
    windows: u64,
    write_bytes: u64,
    /// (program name, run time and runs over the span), programs that ran.
    programs: Vec<(String, ProgStats)>,
    /// /api/heatmap of the run's span: seconds, bytes, status.
    heatmap_api: (f64, usize, u16),
    /// After the stop: each entry of the data dir and its bytes.
    files: Vec<(String, u64)>,
    /// `profiler query --since 1h -o x.html`: seconds and bytes of the page.
    query: (f64, u64),
}

impl Probed {
    pub(crate) fn at_end(
        proc: &Proc,
        api: SocketAddr,
        start: Snapshot,
        seconds: u64,
    ) -> Result<Self> {
        let end = Snapshot::take(proc, api)?;
        let names = program_names();
        let programs = end
            .programs
            .iter()
            .map(|(id, p)| {
                let ran = p.since(start.programs.get(id).copied().unwrap_or_default());
                let name = names.get(id).cloned().unwrap_or_else(|| format!("id {id}"));
                (name, ran)
            })
            .collect();
        let span = seconds + crate::bench_agent::WARMUP.as_secs() + WINDOW.as_secs();
        let asked = Instant::now();
        let (status, body) = get(api, &format!("/api/heatmap?since={span}s"))?;
        let heatmap_api = (asked.elapsed().as_secs_f64(), body.len(), status);
        Ok(Self {
            span_s: end.at.duration_since(start.at).as_secs_f64(),
            store_growth: end.store_used as i64 - start.store_used as i64,
            windows: end.windows - start.windows,
            write_bytes: end.write_bytes - start.write_bytes,
            programs,
            heatmap_api,
            files: Vec::new(),
            query: (0.0, 0),
        })
    }

    /// Reads the stopped agent's data dir and times a query of the last hour on it.
    pub(crate) fn after_stop(&mut self, bin: &Path, data: &Path, tmp: &Path) -> Result<()> {
        let mut files: Vec<(String, u64)> = fs::read_dir(data)?
            .flatten()
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    size_of(&e.path()),
                )
            })
            .collect();
        files.sort();
        self.files = files;
        let page = tmp.join("last-hour.html");
        let started = Instant::now();
        let out = Command::new(bin)
            .args(["query", "--since", "1h", "--data-dir"])
            .arg(data)
            .arg("-o")
            .arg(&page)
            .output()
            .context("cannot run `profiler query`")?;
        let took = started.elapsed().as_secs_f64();
        if !out.status.success() {
            bail!(
                "`profiler query --since 1h` failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        self.query = (took, fs::metadata(&page).map_or(0, |m| m.len()));
        Ok(())
    }

    /// Seconds `profiler query --since 1h -o x.html` took.
    pub(crate) fn query_s(&self) -> f64 {
        self.query.0
    }

    /// Store bytes per hour at steady state: growth per stored window, times windows an hour.
    pub(crate) fn store_mb_per_hour(&self) -> f64 {
        if self.windows == 0 {
            return 0.0;
        }
        let per_window = self.store_growth as f64 / self.windows as f64;
        per_window * (3600 / WINDOW.as_secs()) as f64 / 1e6
    }

    fn write_mb_per_hour(&self) -> f64 {
        self.write_bytes as f64 * 3600.0 / self.span_s.max(1e-9) / 1e6
    }

    pub(crate) fn print(&self) {
        println!(
            "{:<28} {:>12.2}   database pages in use (profiler_store_used_bytes), {} B over {} windows, x {} windows/hour",
            "store growth (MB per hour)",
            self.store_mb_per_hour(),
            self.store_growth,
            self.windows,
            3600 / WINDOW.as_secs()
        );
        println!(
            "{:<28} {:>12.1}   /proc/PID/io write_bytes over {:.0} s (WAL, checkpoints, new unwind-table cache files: what wears disks)",
            "written to disk (MB per hour)",
            self.write_mb_per_hour(),
            self.span_s
        );
        println!("data dir after the stop (one-time files apart from the database):");
        for (name, bytes) in &self.files {
            println!("  {name:<26} {:>12.3} MB", *bytes as f64 / 1e6);
        }
        println!(
            "BPF programs (kernel.bpf_stats_enabled, run_time_ns/run_cnt from the agent's prog fds, {:.0} s):",
            self.span_s
        );
        println!(
            "  {:<18} {:>10} {:>12} {:>14}",
            "program", "runs", "us per run", "% of a core"
        );
        for (name, p) in &self.programs {
            if p.run_cnt == 0 {
                println!(
                    "  {name:<18} {:>10}   (tail-called, or its event did not happen)",
                    0
                );
                continue;
            }
            println!(
                "  {name:<18} {:>10} {:>12.2} {:>13.4}%",
                p.run_cnt,
                p.ns_per_run() / 1e3,
                p.run_time_ns as f64 / 1e7 / self.span_s.max(1e-9)
            );
        }
        println!(
            "{:<28} {:>12.3}   `profiler query --since 1h -o x.html` on the stopped agent's store ({} B page)",
            "query last hour (s)", self.query.0, self.query.1
        );
        println!(
            "{:<28} {:>12.3}   GET /api/heatmap?since=<run span> before the stop (HTTP {}, {} B)",
            "/api/heatmap of the run (s)",
            self.heatmap_api.0,
            self.heatmap_api.2,
            self.heatmap_api.1
        );
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        let programs: BTreeMap<&str, serde_json::Value> = self
            .programs
            .iter()
            .map(|(name, p)| {
                (
                    name.as_str(),
                    json!({
                        "runs": p.run_cnt,
                        "run_time_ns": p.run_time_ns,
                        "us_per_run": (p.run_cnt > 0).then(|| round(p.ns_per_run() / 1e3, 3)),
                        "percent_of_core": round(p.run_time_ns as f64 / 1e7 / self.span_s.max(1e-9), 5),
                    }),
                )
            })
            .collect();
        let files: BTreeMap<&str, u64> = self.files.iter().map(|(n, b)| (n.as_str(), *b)).collect();
        json!({
            "span_s": round(self.span_s, 1),
            "store_growth_bytes": self.store_growth,
            "store_windows": self.windows,
            "store_mb_per_hour": round(self.store_mb_per_hour(), 3),
            "written_to_disk_mb_per_hour": round(self.write_mb_per_hour(), 3),
            "data_dir_after_stop": files,
            "bpf_programs": programs,
            "query_last_hour_s": round(self.query.0, 3),
            "query_page_bytes": self.query.1,
            "api_heatmap_s": round(self.heatmap_api.0, 3),
            "api_heatmap_status": self.heatmap_api.2,
        })
    }
}

/// /proc/PID/io `write_bytes` (root can read it for any process).
fn write_bytes(pid: u32) -> Result<u64> {
    let io = fs::read_to_string(format!("/proc/{pid}/io"))
        .with_context(|| format!("cannot read /proc/{pid}/io"))?;
    util::field(&io, "write_bytes")
        .and_then(|v| v.trim().parse().ok())
        .context("no write_bytes in /proc/PID/io")
}

/// One GET on the agent's API (it answers once and closes): status and body.
fn get(api: SocketAddr, path: &str) -> Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect_timeout(&api, Duration::from_secs(5))
        .with_context(|| format!("cannot reach the agent's API on {api}"))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {api}\r\nConnection: close\r\n\r\n"
    )?;
    let mut reply = Vec::new();
    s.read_to_end(&mut reply)?;
    let head_end = reply
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("the agent's reply has no header end")?;
    let status = String::from_utf8_lossy(&reply[..head_end])
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("the agent's reply has no status")?;
    Ok((status, reply[head_end + 4..].to_vec()))
}
