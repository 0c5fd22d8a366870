//! One recording, end to end, over a `Session`: start the sampler, collect until the
//! duration ends (or Ctrl-C / SIGTERM), stop, symbolize, and return the profile.
//! `profiler record`, and any front end that needs a short profile (the doctor), call this;
//! it reports progress through a callback and prints nothing itself.
use std::{future::Future, time::Duration};

use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::{
    profile::{Counters, Profile},
    session::{Notice, Session, SessionConfig, SessionError, SessionReport},
    symbolize::{KernelSymbols, Symbolizer},
    util,
};

/// What to record.
#[derive(Clone, Debug)]
pub(crate) struct RecordConfig {
    /// What to sample and how; `kernel_record_bytes` as `KERNEL_RECORD_BYTES` says.
    pub session: SessionConfig,
    /// How long; Ctrl-C or SIGTERM stop earlier.
    pub duration: Duration,
    /// Expand inlined functions from DWARF into frames of their own (`--inline`).
    pub inline: bool,
}

/// What a recording tells its front end as it goes; the CLI prints it (`cli::record`).
#[derive(Debug)]
pub(crate) enum Progress<'a> {
    /// The sampler is loading (the verifier takes a while); signals are caught already.
    Loading,
    /// Something the session noticed while it started.
    Notice(Notice),
    /// Sampling started.
    Sampling {
        cpus: usize,
        frequency_hz: u32,
        event: &'static str,
        secs: f64,
    },
    /// About every `DRAIN_INTERVAL_MS` while sampling.
    Tick {
        elapsed_s: f64,
        secs: f64,
        samples: usize,
    },
    /// Sampling stopped, and why.
    Stopped(Stop),
    /// Sampling ended; symbolizing starts.
    Collected(&'a RecordReport),
    /// Symbolizing ended.
    Symbolized { samples: usize, secs: f64 },
}

/// How a recording went, besides its profile.
#[derive(Clone, Debug, Default)]
pub(crate) struct RecordReport {
    pub counters: Counters,
    pub duration_ns: u64,
    /// kernel.kptr_restrict hides kernel addresses: kernel frames show as [kernel].
    pub kernel_hidden: bool,
    pub session: SessionReport,
}

/// Records on a runtime of its own; blocks until done. Ctrl-C and SIGTERM are caught from the
/// start, before the BPF programs load: a signal then still ends in written outputs.
pub(crate) fn record_blocking(
    config: &RecordConfig,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Profile, SessionError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let signals = StopSignals::install();
        progress(Progress::Loading);
        record(config, signals.until(config.duration), progress).await
    })
}

/// Records until `stop` completes.
pub(crate) async fn record(
    config: &RecordConfig,
    stop: impl Future<Output = Stop>,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Profile, SessionError> {
    let mut session = Session::start(&config.session, &mut |n| progress(Progress::Notice(n)))?;
    let secs = config.duration.as_secs_f64();
    progress(Progress::Sampling {
        cpus: session.cpus().len(),
        frequency_hz: config.session.frequency_hz,
        event: config.session.event.name(),
        secs,
    });
    let start_mono_ns = session.window_start_mono_ns();
    let tick = Duration::from_millis(profiler_common::DRAIN_INTERVAL_MS);
    let mut stopped = Stop::Elapsed;
    let stop = async { stopped = stop.await };
    session
        .run_until(stop, tick, |c| {
            progress(Progress::Tick {
                elapsed_s: (util::monotonic_ns() - start_mono_ns) as f64 / 1e9,
                secs,
                samples: c.sample_count(),
            });
        })
        .await?;
    progress(Progress::Stopped(stopped));
    let (window, session_report) = session.finish().await?;
    let symbolize_start = std::time::Instant::now();
    let kernel = KernelSymbols::load().map_err(SessionError::Kallsyms)?;
    let report = RecordReport {
        counters: window.meta.counters,
        duration_ns: window.meta.duration_ns,
        kernel_hidden: kernel.hidden(),
        session: session_report,
    };
    progress(Progress::Collected(&report));
    let samples = window.collected.samples.len();
    let inline = config.inline;
    // Made on the thread that uses it: blazesym's symbolizer stays on one thread.
    let profile =
        tokio::task::spawn_blocking(move || window.symbolize(&mut Symbolizer::new(kernel, inline)))
            .await
            .map_err(std::io::Error::other)?;
    progress(Progress::Symbolized {
        samples,
        secs: symbolize_start.elapsed().as_secs_f64(),
    });
    Ok(profile)
}

/// Bytes of ring per CPU for the kernel's process records. `record` drains every 100 ms:
/// 512 KiB holds thousands of execs per CPU in that time.
pub(crate) const KERNEL_RECORD_BYTES: usize = 512 << 10;

/// SIGINT and SIGTERM handlers, installed when this is made: a signal that arrives before
/// anyone waits (while BPF loads) is kept and ends the wait at once.
pub(crate) struct StopSignals {
    interrupt: Option<Signal>,
    terminate: Option<Signal>,
}

impl StopSignals {
    /// Installs the handlers; needs a tokio runtime. A handler that cannot be installed
    /// (never seen on Linux) leaves that signal's default action.
    pub(crate) fn install() -> Self {
        Self {
            interrupt: signal(SignalKind::interrupt()).ok(),
            terminate: signal(SignalKind::terminate()).ok(),
        }
    }

    /// Completes `duration` after its first poll (when sampling starts), or at a signal
    /// received since `install`; says which.
    pub(crate) async fn until(mut self, duration: Duration) -> Stop {
        tokio::select! {
            () = tokio::time::sleep(duration) => Stop::Elapsed,
            () = recv(self.interrupt.as_mut()) => Stop::Interrupted,
            () = recv(self.terminate.as_mut()) => Stop::Terminated,
        }
    }
}

/// What ended a recording.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Its duration passed (or the caller's own stop completed).
    Elapsed,
    /// SIGINT (Ctrl-C).
    Interrupted,
    /// SIGTERM.
    Terminated,
}

async fn recv(signal: Option<&mut Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}
