//! The agent's first stage, on a thread of its own: the `Session` stays attached and drains
//! the ring buffer; every window is cut and handed to the symbolizer's bounded queue
//! (`pipeline`) without waiting: a full queue drops the window and counts its samples. A
//! /debug/pprof/profile request is a tap on the same stream: its samples are copied out of
//! the running window when its time is up, so no request loads a sampler of its own.
use std::{
    sync::{Arc, mpsc},
    time::Duration,
};

use tokio::{
    sync::{mpsc as tmpsc, watch},
    time::Instant,
};

use super::{
    Shared,
    pipeline::{Jobs, Reply, TapError},
};
use crate::{
    bpf::churn::{ChurnCount, ChurnTracer},
    session::SessionError,
    session::{Notice, Session, SessionConfig, Window},
    util,
};

/// Bytes of ring per CPU for the kernel's process records: a few hundred new processes a
/// second between drains (~500 bytes of records a process); half full wakes the agent.
pub(crate) const KERNEL_RECORD_BYTES: usize = 256 << 10;
/// How often the agent drains the ring buffer. At 19 Hz two seconds of samples are a few
/// KiB, and every wake-up costs the agent CPU: only a quarter-full sample ring, a half-full
/// ring of process records, or the first samples of a new Python process (profiler-ebpf
/// `python_exec`, so its frames are named from its first second on) wake it sooner, not every
/// new process's first sample (`SessionConfig::wake_for_processes`). Any other process's
/// samples wait for its tables at most this long (its stack copies cover them meanwhile).
/// At one second, the drains were about a third of the sampling thread's CPU under churn.
const DRAIN_EVERY: Duration = Duration::from_secs(2);
/// Test hook: milliseconds of pause after each cut's last drain of the ring, as a busy
/// machine makes (`SessionConfig::settle_delay`).
pub(crate) const SETTLE_DELAY_ENV: &str = "PROFILER_TEST_SETTLE_DELAY_MS";
/// /debug/pprof/profile requests sampling at once, at most (more wait in the channel).
pub(crate) const MAX_TAPS: usize = 8;

/// A /debug/pprof/profile request: the profile of the next `duration`, or why not.
pub(crate) struct TapRequest {
    pub duration: Duration,
    pub reply: Reply,
}

/// A request being sampled: its samples are those from `since_mono_ns` until `end`; the
/// windows cut meanwhile leave their share of them in `parts`.
struct Tap {
    since_mono_ns: u64,
    end: Instant,
    parts: Vec<Window>,
    reply: Reply,
}

/// The sampling thread's inputs and outputs.
pub(crate) struct Stage {
    pub config: SessionConfig,
    pub window: Duration,
    pub jobs: Arc<Jobs>,
    pub taps: tmpsc::Receiver<TapRequest>,
    pub stop: watch::Receiver<bool>,
    pub shared: Arc<Shared>,
}

/// What ended one wait of the drain.
enum Woken {
    Deadline,
    Stop,
    Tap(TapRequest),
}

impl Stage {
    /// Starts the session (reporting how that went on `started`, with the CPUs sampled),
    /// then samples until `stop`; the last window is cut and queued (waiting, then: no more
    /// samples are coming) before the thread ends.
    pub(crate) fn run(mut self, started: mpsc::Sender<Result<usize, SessionError>>) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(e) => {
                let _ = started.send(Err(SessionError::Io(e)));
                return;
            }
        };
        runtime.block_on(async move {
            let mut session = match Session::start(&self.config, &mut log_notice) {
                Ok(s) => s,
                Err(e) => {
                    let _ = started.send(Err(e));
                    return;
                }
            };
            // Which process went into which cgroup groups crash loops as the doctor does;
            // without it they are grouped by supervisor. Loaded before the agent says it has
            // started: from then on its programs are all there.
            let mut churn = ChurnTracer::start()
                .map(CgroupMoves::new)
                .map_err(|e| {
                    log::warn!(
                        "cgroup changes are not traced ({}): crash loops are grouped by \
                         supervisor, not by cgroup",
                        util::chain(&e)
                    );
                })
                .ok();
            let (variant, refused) = session.sampler_variant();
            self.shared.metrics().sampler = Some((variant.program(), refused));
            let _ = started.send(Ok(session.cpus().len()));
            if let Err(e) = self.sample(&mut session, churn.as_mut()).await {
                log::error!("sampling failed: {}", util::chain(&e));
            }
        });
    }

    async fn sample(
        &mut self,
        session: &mut Session,
        mut churn: Option<&mut CgroupMoves>,
    ) -> Result<(), SessionError> {
        let mut window_end = Instant::now() + self.window;
        let mut taps: Vec<Tap> = Vec::new();
        let mut taps_open = true;
        loop {
            let next = taps
                .iter()
                .map(|t| t.end)
                .min()
                .map_or(window_end, |e| e.min(window_end));
            let mut woken = Woken::Deadline;
            let (stop, requests) = (&mut self.stop, &mut self.taps);
            let wait = async {
                tokio::select! {
                    () = tokio::time::sleep_until(next) => {}
                    _ = stop.changed() => woken = Woken::Stop,
                    r = requests.recv(), if taps_open && taps.len() < MAX_TAPS => match r {
                        Some(r) => woken = Woken::Tap(r),
                        None => taps_open = false,
                    },
                }
            };
            session.run_until(wait, DRAIN_EVERY, |_| {}).await?;
            let stopping = match woken {
                Woken::Tap(r) => {
                    taps.push(Tap {
                        since_mono_ns: util::monotonic_ns(),
                        end: Instant::now() + r.duration,
                        parts: Vec::new(),
                        reply: r.reply,
                    });
                    continue;
                }
                Woken::Stop => true,
                Woken::Deadline => false,
            };
            let now = Instant::now();
            // Taps end before the window they are in is cut (it takes their samples).
            let (done, running): (Vec<Tap>, Vec<Tap>) =
                taps.into_iter().partition(|t| stopping || t.end <= now);
            taps = running;
            for mut tap in done {
                tap.parts.push(session.copy_since(tap.since_mono_ns).await?);
                self.queue_tap(tap.parts, tap.reply);
            }
            if stopping || now >= window_end {
                // The running taps keep their share of the window about to go.
                for tap in &mut taps {
                    tap.parts.push(session.copy_since(tap.since_mono_ns).await?);
                }
                let window = session.cut().await?;
                self.add_lifecycle(&window, churn.as_deref_mut());
                self.shared.metrics().python_processes =
                    session.python_processes().map(|n| n as u64);
                self.shared.metrics().python_exec_wakes = session.python_exec_wakes();
                self.shared.metrics().runq = session.runq_totals();
                if let Some(stats) = session.unwind_stats() {
                    self.shared.metrics().add_unwind(
                        &stats,
                        &window.collected.counts,
                        &window.meta.named_counters,
                    );
                }
                self.queue_window(window, stopping);
                window_end = now + self.window;
            }
            if stopping {
                return Ok(());
            }
        }
    }

    /// The window's process lifecycle and cgroup churn into the metrics, before the window
    /// can be dropped on its way to the symbolizer.
    fn add_lifecycle(&self, window: &Window, churn: Option<&mut CgroupMoves>) {
        let (changes, attaches) = churn.map_or((None, None), |c| {
            let (changes, attaches) = c.take();
            (Some(changes), attaches)
        });
        let mut m = self.shared.metrics();
        m.add_lifecycle(
            &window.collected.facts.lifetimes,
            attaches.as_deref(),
            window.meta.duration_ns as f64 / 1e9,
        );
        if let Some(changes) = changes {
            m.add_churn(&changes);
        }
    }

    /// Hands a window to the symbolizer; counts it dropped when its queue is full. At stop
    /// it waits instead: the last window should be stored and sampling is over.
    fn queue_window(&self, window: Window, stopping: bool) {
        let n = window.meta.counters.recorded;
        self.shared.metrics().add_cut(&window.meta.counters);
        if !self.jobs.push_window(window, stopping) {
            self.shared
                .metrics()
                .pipeline
                .settle(n, |p| &mut p.dropped_symbolize_queue);
        }
    }

    /// Hands a tap's window to the symbolizer; a full queue answers the request at once.
    fn queue_tap(&self, parts: Vec<Window>, reply: Reply) {
        if let Err(reply) = self.jobs.push_tap(parts, reply) {
            self.shared.metrics().pipeline.pprof_refused += 1;
            let _ = reply.send(Err(TapError::Behind));
        }
    }
}

/// The churn tracer read window by window. A process moved into its cgroup just before a
/// cut starts (execs, exits) in the next window: each window's moves are those since the
/// last cut and the ones before it.
pub(crate) struct CgroupMoves {
    tracer: ChurnTracer,
    last: Vec<(u32, String)>,
}

impl CgroupMoves {
    fn new(tracer: ChurnTracer) -> Self {
        CgroupMoves {
            tracer,
            last: Vec::new(),
        }
    }

    /// The window's cgroup changes and moves (None: moves are not traced on this kernel).
    fn take(&mut self) -> (Vec<ChurnCount>, Option<Vec<(u32, String)>>) {
        let (changes, moves) = self.tracer.take();
        let moves = moves.map(|now| {
            let both = [std::mem::take(&mut self.last), now.clone()].concat();
            self.last = now;
            both
        });
        (changes, moves)
    }
}

impl Drop for Stage {
    /// However the thread ends (a panic too), the symbolizer learns no more jobs come.
    fn drop(&mut self) {
        self.jobs.close();
    }
}

/// The session's notices go to the log: the agent has no terminal to print progress on.
fn log_notice(n: Notice) {
    match n {
        Notice::Warning(w) => log::warn!("{w}"),
        Notice::CgroupFilter { target, in_kernel } => {
            log::info!("only cgroup {} (in the kernel: {in_kernel})", target.given);
        }
    }
}
