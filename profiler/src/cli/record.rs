//! `profiler record`: sample, collect, symbolize, write every output.
use std::{io::IsTerminal as _, path::PathBuf, time::Duration};

use anyhow::{Context as _, bail};
use tokio::io::{Interest, unix::AsyncFd};

use crate::{
    bpf::{Event, Sampler, SamplerConfig},
    collect::{Collection, CommFilter},
    profile::{Counters, Meta},
    symbolize::{self, KernelSymbols, UserSymbolizer},
    util,
};

#[derive(Debug, clap::Args)]
pub struct RecordArgs {
    /// Samples per second on each CPU (1..=10000).
    #[arg(short = 'F', long, default_value_t = 99, value_name = "HZ", value_parser = parse_frequency)]
    pub frequency: u32,
    /// What drives sampling: the cpu-clock timer, or hardware cycles (needs a PMU).
    #[arg(long, value_enum, default_value_t = Event::CpuClock)]
    pub event: Event,
    /// How long to record: 10s, 500ms, 2m... Ctrl-C stops earlier and still writes outputs.
    #[arg(short, long, default_value = "10s", value_parser = util::parse_duration)]
    pub duration: Duration,
    /// Only this process (repeatable). Filtered in the kernel.
    #[arg(short, long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Only threads with this comm (repeatable), e.g. --comm kubelet.
    #[arg(long = "comm", value_name = "NAME")]
    pub comms: Vec<String>,
    /// Output file, by extension: .svg flame graph, .folded stacks, .capture (re-render with
    /// `profiler report`). Repeatable. Default: profile.svg.
    #[arg(short, long = "output", value_name = "FILE")]
    pub outputs: Vec<PathBuf>,
}

fn parse_frequency(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(hz @ 1..=10_000) => Ok(hz),
        _ => Err(format!(
            "frequency must be a whole number of Hz in 1..=10000, got `{text}`"
        )),
    }
}

pub fn run(args: RecordArgs) -> anyhow::Result<()> {
    // Every check that can fail happens before sampling starts, so no recording is wasted.
    let paths = if args.outputs.is_empty() {
        vec![PathBuf::from("profile.svg")]
    } else {
        args.outputs.clone()
    };
    let outputs = super::parse_outputs(&paths)?;
    for o in &outputs {
        o.check_writable()?;
    }
    for pid in &args.pids {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            bail!("no process with pid {pid} is running (check it with `ps -p {pid}`)");
        }
    }
    check_privileges()?;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let profile = runtime.block_on(record(&args))?;
    for o in &outputs {
        o.write(&profile)?;
    }
    let names: Vec<String> = outputs
        .iter()
        .map(|o| o.path.display().to_string())
        .collect();
    eprintln!("wrote {}", names.join(", "));
    Ok(())
}

async fn record(args: &RecordArgs) -> anyhow::Result<crate::profile::Profile> {
    let config = SamplerConfig {
        event: args.event,
        frequency_hz: args.frequency.into(),
        pids: &args.pids,
    };
    let (mut sampler, ring) = Sampler::start(&config).context("cannot start sampling")?;
    // The recording starts once the sampler is attached (loading takes a while).
    let start_unix_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let start_mono_ns = util::monotonic_ns();
    // SAFETY: the RingBuf owns its map fd and keeps it open until the AsyncFd drops it.
    let mut ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| anyhow::anyhow!("cannot watch the ring buffer: {e}"))?;
    let mut collection = Collection::new(CommFilter(args.comms.clone()));
    let secs = args.duration.as_secs_f64();
    let tty = std::io::stderr().is_terminal();
    eprintln!(
        "sampling {} CPUs at {} Hz ({}) for {secs:.1} s; Ctrl-C stops early",
        sampler.cpus.len(),
        args.frequency,
        args.event.name()
    );
    collection
        .run_until(
            &mut ring,
            stop_signal(args.duration),
            Duration::from_millis(profiler_common::DRAIN_INTERVAL_MS),
            |c| {
                if tty {
                    let elapsed = (util::monotonic_ns() - start_mono_ns) as f64 / 1e9;
                    eprint!(
                        "\r  {elapsed:5.1} s / {secs:.1} s, {} samples ",
                        c.samples.len()
                    );
                }
            },
        )
        .await?;
    if tty {
        eprintln!();
    }
    let duration_ns = util::monotonic_ns() - start_mono_ns;
    sampler.detach();
    collection.drain(ring.get_mut());
    collection.processes.resolve_pending();
    let k = sampler.counters()?;

    eprintln!("symbolizing {} samples...", collection.samples.len());
    let kernel = KernelSymbols::load().context("cannot read /proc/kallsyms")?;
    if kernel.hidden() {
        log::warn!(
            "kernel addresses are hidden (kernel.kptr_restrict); kernel frames show as [kernel]"
        );
        eprintln!(
            "warning: kernel addresses are hidden by kernel.kptr_restrict; kernel frames show as [kernel]"
        );
    }
    let counters = Counters {
        recorded: collection.samples.len() as u64,
        lost_ringbuf_full: k.lost_ringbuf_full,
        filtered: k.filtered + collection.filtered,
        kstack_failed: collection.kstack_failed,
        ustack_failed: collection.ustack_failed,
    };
    let meta = Meta {
        start_unix_ns,
        start_mono_ns,
        duration_ns,
        frequency_hz: args.frequency,
        event: args.event.name().to_owned(),
        hostname: hostname(),
        kernel_release: kernel_release(),
        cpus: sampler.cpus.clone(),
        counters,
    };
    report_counters(&counters, duration_ns);
    Ok(symbolize::build_profile(
        collection,
        meta,
        &kernel,
        &UserSymbolizer::default(),
    ))
}

/// Completes after `duration`, or at Ctrl-C / SIGTERM.
async fn stop_signal(duration: Duration) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let term = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = tokio::time::sleep(duration) => {}
        _ = tokio::signal::ctrl_c() => eprintln!("\ninterrupted: writing what was collected"),
        () = term => eprintln!("terminated: writing what was collected"),
    }
}

fn report_counters(c: &Counters, duration_ns: u64) {
    eprintln!(
        "recorded {} samples in {:.1} s; lost {} (ring buffer full); stack reads failed: {} kernel, {} user",
        c.recorded,
        duration_ns as f64 / 1e9,
        c.lost_ringbuf_full,
        c.kstack_failed,
        c.ustack_failed
    );
    if c.lost_ringbuf_full > 0 {
        eprintln!(
            "warning: {} samples were lost because the reader fell behind; lower --frequency",
            c.lost_ringbuf_full
        );
    }
}

/// Effective capabilities: BPF programs and perf events need CAP_BPF and CAP_PERFMON
/// (CAP_SYS_ADMIN implies both).
fn check_privileges() -> anyhow::Result<()> {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let caps = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let has = |bit: u32| caps & (1 << bit) != 0;
    if has(CAP_SYS_ADMIN) {
        return Ok(());
    }
    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|&(bit, _)| !has(bit))
        .map(|(_, name)| name)
        .collect();
    if !missing.is_empty() {
        bail!(
            "recording needs the {} capabilit{} (or root); run it with sudo",
            missing.join(" and "),
            if missing.len() == 1 { "y" } else { "ies" }
        );
    }
    Ok(())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}
