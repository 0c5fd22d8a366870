//! One recording, end to end: start the sampler, collect until the duration ends (or Ctrl-C /
//! SIGTERM), stop, symbolize, and return the profile. `profiler record`, and any front end
//! that needs a short profile (the doctor), call this.
use std::{future::Future, sync::Arc, time::Duration};

use tokio::{
    io::{Interest, unix::AsyncFd},
    signal::unix::{Signal, SignalKind, signal},
};

use crate::{
    bpf::{BpfError, Event, Sampler, SamplerConfig},
    collect::{
        CgroupFilter, Collection, CommFilter, KernelRecords, ProcessEvents, cgroup::CgroupTarget,
    },
    profile::{Counters, Meta, Profile},
    symbolize::{self, KernelSymbols, UserSymbolizer},
    unwind::{BackgroundLoader, LoaderStats, UnwindMode},
    util,
};

/// What to record.
#[derive(Clone, Debug)]
pub struct RecordConfig {
    pub event: Event,
    /// Samples per second per CPU.
    pub frequency_hz: u32,
    /// How long; Ctrl-C or SIGTERM stop earlier.
    pub duration: Duration,
    /// Only these processes (in the kernel); empty = all.
    pub pids: Vec<u32>,
    /// Only these comms; empty = all.
    pub comms: Vec<String>,
    /// Only tasks in these cgroups or below (`--cgroup`); empty = all. When all are cgroup2
    /// ones they are filtered in the kernel, otherwise all in the collector.
    pub cgroups: Vec<CgroupTarget>,
    /// Print progress and a summary on stderr.
    pub verbose: bool,
    /// Expand inlined functions from DWARF into frames of their own (`--inline`).
    pub inline: bool,
    /// How user stacks are walked (`--unwind`).
    pub unwind: UnwindMode,
    /// Kernel memory for unwind rows, bytes (`--unwind-memory`).
    pub unwind_memory: u64,
    /// Name Python frames in CPython processes (`--python on`, the default).
    pub python: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("cannot start sampling")]
    Sampler(#[from] BpfError),
    #[error("reading samples failed")]
    Io(#[from] std::io::Error),
    #[error("cannot read /proc/kallsyms")]
    Kallsyms(#[source] std::io::Error),
}

/// Records on a runtime of its own; blocks until done. Ctrl-C and SIGTERM are caught from the
/// start, before the BPF programs load: a signal then still ends in written outputs.
pub fn record_blocking(config: &RecordConfig) -> Result<Profile, RecordError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let signals = StopSignals::install();
        if config.verbose {
            // Loading and attaching take a while (the verifier); say that we are alive and
            // that Ctrl-C is safe already. Tests wait for this line to signal at start-up.
            eprintln!("loading the sampler; Ctrl-C stops and writes what was collected");
        }
        record(config, signals.until(config.duration)).await
    })
}

/// Records until `stop` completes.
pub async fn record(
    config: &RecordConfig,
    stop: impl Future<Output = ()>,
) -> Result<Profile, RecordError> {
    let in_kernel = config.cgroups.iter().all(CgroupTarget::is_v2)
        && config.cgroups.len() <= profiler_common::MAX_CGROUP_FILTER as usize;
    let (kernel_cgroups, user_cgroups) = if in_kernel {
        (
            config.cgroups.iter().map(CgroupTarget::dir).collect(),
            Vec::new(),
        )
    } else {
        (Vec::new(), config.cgroups.clone())
    };
    if config.verbose {
        for t in &config.cgroups {
            eprintln!(
                "only cgroup {} ({} {}), filtered {}",
                t.given,
                t.hierarchy_name(),
                t.path,
                if in_kernel {
                    "in the kernel"
                } else {
                    "in userspace"
                }
            );
        }
    }
    // A host where the walk cannot work still records everything else.
    let python = if config.python {
        match crate::python::KernelFacts::find() {
            Ok(f) => Some(f),
            Err(e) => {
                eprintln!("warning: no Python frames: {}", crate::util::chain(&e));
                None
            }
        }
    } else {
        None
    };
    let sampler_config = SamplerConfig {
        event: config.event,
        frequency_hz: config.frequency_hz.into(),
        pids: &config.pids,
        cgroups: &kernel_cgroups,
        unwind: config.unwind,
        unwind_memory: config.unwind_memory,
        python,
    };
    util::raise_fd_limit();
    // Process records first, so none a sample depends on can be missed.
    let kernel_records = open_kernel_records(KERNEL_RECORD_BYTES);
    let (mut sampler, ring) = Sampler::start(&sampler_config)?;
    let events = ProcessEvents::new(kernel_records, sampler.take_exits());
    // The recording starts once the sampler is attached (loading takes a while).
    let start_unix_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let start_mono_ns = util::monotonic_ns();
    // SAFETY: the RingBuf owns its map fd and keeps it open until the AsyncFd drops it.
    let mut ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| RecordError::Io(std::io::Error::other(e.to_string())))?;
    let mut collection = Collection::new(CommFilter(config.comms.clone()))
        .with_cgroup_filter(CgroupFilter::new(user_cgroups));
    collection.events = events;
    let loader = match sampler.unwind.take() {
        Some(l) => Some(Arc::new(BackgroundLoader::spawn(l)?)),
        None => None,
    };
    if let Some(loader) = &loader {
        collection = collection.on_new_process(loader.hook());
    }
    if let (Some(facts), Some(map)) = (python, sampler.take_python_map()) {
        let mut tracker = crate::python::Tracker::new(map, facts);
        tracker.register_running(&config.pids);
        collection.python = Some(tracker);
    }
    let secs = config.duration.as_secs_f64();
    let tty = config.verbose && std::io::IsTerminal::is_terminal(&std::io::stderr());
    if config.verbose {
        eprintln!(
            "sampling {} CPUs at {} Hz ({}) for {secs:.1} s; Ctrl-C stops early",
            sampler.cpus.len(),
            config.frequency_hz,
            config.event.name()
        );
    }
    let tick = Duration::from_millis(profiler_common::DRAIN_INTERVAL_MS);
    collection
        .run_until(&mut ring, stop, tick, |c| {
            if tty {
                let elapsed = (util::monotonic_ns() - start_mono_ns) as f64 / 1e9;
                eprint!(
                    "\r  {elapsed:5.1} s / {secs:.1} s, {} samples ",
                    c.samples.len()
                );
            }
        })
        .await?;
    if tty {
        eprintln!();
    }
    if collection.samples.is_empty() {
        // Stopped before the first sample (a signal while the sampler loaded, or nothing
        // matched the filters): the outputs are written, and empty, so say it here.
        eprintln!("warning: no samples were recorded; the outputs hold an empty profile");
    }
    let duration_ns = util::monotonic_ns() - start_mono_ns;
    sampler.detach();
    collection.drain(ring.get_mut());
    collection.processes.resolve_pending();
    collection.resolve_python();
    // Blocking file work off this thread: in the agent, /debug/pprof/profile records here
    // on the thread that serves HTTP.
    collection.processes.name_jit_code().await?;
    collection.resolve_cgroups();
    let k = sampler.counters()?;

    let symbolize_start = std::time::Instant::now();
    let sample_count = collection.samples.len();
    if config.verbose {
        eprintln!("symbolizing {sample_count} samples...");
    }
    let kernel = KernelSymbols::load().map_err(RecordError::Kallsyms)?;
    if kernel.hidden() {
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
        frequency_hz: config.frequency_hz,
        event: config.event.name().to_owned(),
        hostname: read_trimmed("/proc/sys/kernel/hostname"),
        kernel_release: read_trimmed("/proc/sys/kernel/osrelease"),
        cpus: sampler.cpus.clone(),
        counters,
    };
    if config.verbose || counters.lost_ringbuf_full > 0 {
        report_counters(&counters, duration_ns);
    }
    let lost_records = collection.processes.lost_records;
    if lost_records > 0 {
        eprintln!(
            "warning: the kernel dropped {lost_records} process records (mappings, exec, exit): \
             some short-lived processes may show [unknown] frames"
        );
    }
    if config.verbose
        && let Some(loader) = &loader
    {
        report_unwind(&loader.stats(), &collection.unwind_truncated);
    }
    if config.verbose
        && let Some(t) = &collection.python
    {
        report_python(t, sampler.python_counters()?, collection.py_truncated);
    }
    let inline = config.inline;
    let profile = tokio::task::spawn_blocking(move || {
        symbolize::build_profile(collection, meta, &kernel, &UserSymbolizer::new(inline))
    })
    .await
    .map_err(std::io::Error::other)?;
    if config.verbose {
        // `cargo xtask bench symbolize` reads this line: it is our share of the work that
        // `perf script` does after the fact.
        eprintln!(
            "symbolized {sample_count} samples in {:.3} s",
            symbolize_start.elapsed().as_secs_f64()
        );
    }
    Ok(profile)
}

/// Bytes of ring per CPU for the kernel's process records. `record` drains every 100 ms:
/// 512 KiB holds thousands of execs per CPU in that time.
const KERNEL_RECORD_BYTES: usize = 512 << 10;

/// The kernel's process records on every online CPU; None (with a warning) when they cannot
/// be had: processes are then read from /proc at their first sample, which short-lived ones
/// may not survive.
pub(crate) fn open_kernel_records(bytes_per_cpu: usize) -> Option<KernelRecords> {
    let cpus = aya::util::online_cpus().ok()?;
    KernelRecords::open(&cpus, bytes_per_cpu)
        .map_err(|e| {
            log::warn!(
                "cannot follow process mappings in the kernel ({e}): short-lived processes may not be symbolized"
            );
        })
        .ok()
}

/// Completes after `duration`, or at Ctrl-C / SIGTERM.
pub async fn stop_signal(duration: Duration) {
    StopSignals::install().until(duration).await;
}

/// SIGINT and SIGTERM handlers, installed when this is made: a signal that arrives before
/// anyone waits (while BPF loads) is kept and ends the wait at once.
pub struct StopSignals {
    interrupt: Option<Signal>,
    terminate: Option<Signal>,
}

impl StopSignals {
    /// Installs the handlers; needs a tokio runtime. A handler that cannot be installed
    /// (never seen on Linux) leaves that signal's default action.
    pub fn install() -> Self {
        Self {
            interrupt: signal(SignalKind::interrupt()).ok(),
            terminate: signal(SignalKind::terminate()).ok(),
        }
    }

    /// Completes `duration` after its first poll (when sampling starts), or at a signal
    /// received since `install`.
    pub async fn until(mut self, duration: Duration) {
        tokio::select! {
            () = tokio::time::sleep(duration) => {}
            () = recv(self.interrupt.as_mut()) => eprintln!("\ninterrupted: writing what was collected"),
            () = recv(self.terminate.as_mut()) => eprintln!("terminated: writing what was collected"),
        }
    }
}

async fn recv(signal: Option<&mut Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
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

fn report_unwind(s: &LoaderStats, truncated: &[u64; 7]) {
    eprintln!(
        "unwind tables: {} processes, {} binaries by table ({} rows, {:.1} MiB, compiled in {:.3} s), {} by frame pointer{}",
        s.processes,
        s.binaries_table,
        s.rows,
        (s.rows * 8) as f64 / f64::from(1 << 20),
        s.compile_ns as f64 / 1e9,
        s.binaries_fp,
        if s.over_budget > 0 {
            format!(" ({} over --unwind-memory)", s.over_budget)
        } else {
            String::new()
        }
    );
    let cut: Vec<String> = truncated
        .iter()
        .enumerate()
        .skip(1) // 0: not cut
        .filter(|(_, n)| **n > 0)
        .map(|(code, n)| format!("{n} {}", profiler_common::unwind::reason::NAMES[code]))
        .collect();
    if !cut.is_empty() {
        eprintln!("user stacks cut short: {}", cut.join(", "));
    }
}

fn report_python(
    t: &crate::python::Tracker,
    kernel: Option<[u64; profiler_common::python::counter::COUNT as usize]>,
    cut: u64,
) {
    let [walked, truncated, read_failed, no_tstate] = kernel.unwrap_or_default();
    eprintln!(
        "python: {} processes registered; {walked} samples walked, {truncated} truncated, \
         {read_failed} unreadable, {no_tstate} without a thread state; {cut} recorded cut short",
        t.registered
    );
    for (kind, (n, last)) in &t.refused {
        eprintln!("python: {n} processes refused ({kind}), e.g.: {last}");
    }
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}
