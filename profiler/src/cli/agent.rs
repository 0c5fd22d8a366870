//! `profiler agent`: always-on sampling into an embedded store, with an HTTP API
//! (docs/agent.md). Flags override the `--config` file, which overrides the defaults.
use crate::util::status;
use std::{path::PathBuf, time::Duration};

use super::OnOff;
use crate::agent::{
    AgentConfig,
    config::{FileConfig, parse_frequency, parse_listen, parse_size, parse_window},
};
use crate::unwind::{TablePolicy, UnwindMode};

#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// TOML file with the same keys as these flags (frequency, window, data-dir, retention,
    /// keep-times, max-size, listen, push-url, otlp-endpoint, comm, token-file, insecure-listen,
    /// unwind, unwind-memory, python); flags given here win.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Samples per second on each CPU (1..=1000; default 19).
    #[arg(short = 'F', long, value_name = "HZ", value_parser = parse_frequency)]
    pub frequency: Option<u32>,
    /// Length of one stored window (1s..=1h; default 10s).
    #[arg(long, value_name = "DURATION", value_parser = parse_window)]
    pub window: Option<Duration>,
    /// Where the store lives (default /var/lib/profiler).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Delete windows older than this: 7d (default), 12h...
    #[arg(long, value_name = "DURATION", value_parser = crate::util::parse_duration)]
    pub retention: Option<Duration>,
    /// Keep each sample's time and CPU this long (24h default); older windows keep their
    /// counts (flame graphs) until --retention, and their heat map says "no exact times".
    #[arg(long, value_name = "DURATION", value_parser = crate::util::parse_duration)]
    pub keep_times: Option<Duration>,
    /// Keep the store under this size: 1GiB (default), 500MiB...
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_size: Option<u64>,
    /// HTTP API address (default 127.0.0.1:7070; other addresses only when given).
    #[arg(long, value_name = "ADDR:PORT", value_parser = parse_listen)]
    pub listen: Option<std::net::SocketAddr>,
    /// Also push each window (pprof) to this Pyroscope-compatible server: http://HOST:PORT.
    #[arg(long, value_name = "URL")]
    pub push_url: Option<String>,
    /// Also send each window as OTLP profiles (protobuf over HTTP, the v1development signal)
    /// to this collector: http://HOST:4318 (`/v1development/profiles` is added).
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Only threads with this comm (repeatable).
    #[arg(long = "comm", value_name = "NAME", value_parser = crate::util::parse_comm)]
    pub comms: Vec<String>,
    /// File with the bearer token the API requires (all but /healthz); needed for a
    /// non-loopback --listen.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Serve a non-loopback --listen without a token, to anyone who can reach it.
    #[arg(long)]
    pub insecure_listen: bool,
    /// How user stacks are walked, as for `record` (default auto: by table except binaries
    /// that keep frame pointers).
    #[arg(long, value_enum)]
    pub unwind: Option<UnwindMode>,
    /// Kernel memory for unwind tables: 64M (default), 512K...
    #[arg(long, value_name = "BYTES", value_parser = crate::util::parse_bytes)]
    pub unwind_memory: Option<u64>,
    /// Which binaries get unwind tables, as for `record` (default reached: only those the
    /// stacks go through).
    #[arg(long, value_enum)]
    pub unwind_tables: Option<TablePolicy>,
    /// Name Python functions in CPython 3.11-3.13 processes (default on).
    #[arg(long, value_enum, value_name = "on|off")]
    pub python: Option<OnOff>,
    /// Time every thread's waits for a CPU, for the `profiler_runqueue_latency_seconds`
    /// histograms of /metrics (default off: about 0.4 us of CPU a context switch).
    #[arg(long, value_enum, value_name = "on|off")]
    pub runq: Option<OnOff>,
}

pub(super) fn run(args: AgentArgs) -> anyhow::Result<()> {
    let mut config = AgentConfig::default();
    if let Some(path) = &args.config {
        FileConfig::load(path)?.apply(&mut config)?;
    }
    let AgentArgs {
        config: _,
        frequency,
        window,
        data_dir,
        retention,
        keep_times,
        max_size,
        listen,
        push_url,
        otlp_endpoint,
        comms,
        token_file,
        insecure_listen,
        unwind,
        unwind_memory,
        unwind_tables,
        python,
        runq,
    } = args;
    config.unwind = unwind.unwrap_or(config.unwind);
    config.unwind_memory = unwind_memory.unwrap_or(config.unwind_memory);
    config.unwind_tables = unwind_tables.unwrap_or(config.unwind_tables);
    config.python = python.map_or(config.python, |p| p == OnOff::On);
    config.runq = runq.map_or(config.runq, |r| r == OnOff::On);
    config.frequency_hz = frequency.unwrap_or(config.frequency_hz);
    config.window = window.unwrap_or(config.window);
    config.data_dir = data_dir.unwrap_or(config.data_dir);
    config.retention = retention.unwrap_or(config.retention);
    config.keep_times = keep_times.unwrap_or(config.keep_times);
    config.max_size_bytes = max_size.unwrap_or(config.max_size_bytes);
    config.listen = listen.unwrap_or(config.listen);
    if push_url.is_some() {
        config.push_url = push_url;
    }
    if otlp_endpoint.is_some() {
        config.otlp_endpoint = otlp_endpoint;
    }
    if !comms.is_empty() {
        config.comms = comms;
    }
    if token_file.is_some() {
        config.token_file = token_file;
    }
    config.insecure_listen |= insecure_listen;
    // Before the privilege check: a refusal that needs no root should not wait for it.
    config.check_exposure()?;
    super::check_privileges()?;
    // A perf event per CPU, and a file per binary mapped: more than the default 1024.
    crate::util::raise_fd_limit();
    crate::agent::run(config, &mut printer)?;
    Ok(())
}

/// Prints what the agent reports (tests wait for the start line and read the stop line).
fn printer(p: crate::agent::Progress<'_>) {
    use crate::{agent::Progress, record::Stop};
    match p {
        Progress::Started { cpus, config } => status!(
            "agent: sampling every CPU ({cpus}) at {} Hz, {:?} windows into {}, API on http://{}",
            config.frequency_hz,
            config.window,
            config.data_dir.display(),
            config.listen
        ),
        Progress::Stopping(Stop::Interrupted) => {
            status!("\ninterrupted: writing what was collected");
        }
        Progress::Stopping(_) => status!("terminated: writing what was collected"),
        Progress::Stopped {
            lost_windows,
            pushed,
        } => {
            if lost_windows == 0 {
                status!("agent: stopped; the last window is stored");
            } else {
                status!("agent: stopped; {lost_windows} windows could not be stored and are lost");
            }
            if let Some((sent, dropped)) = pushed {
                status!(
                    "agent: {sent} windows pushed since start, {dropped} dropped from the full spool"
                );
            }
        }
    }
}
