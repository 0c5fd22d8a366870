//! `profiler agent`, the always-on front end: a `Session` stays attached and its drain cuts
//! windows (`sampler`); each is symbolized and goes to the metrics, the push target and the
//! store (`pipeline`), every stage on its own thread behind a bounded queue, so the drain
//! never waits; the HTTP API (`api`) serves all of it from the main thread.
mod api;
pub(crate) mod config;
pub(crate) mod metrics;
mod pipeline;
pub(crate) mod push;
pub(crate) mod sampler;

use std::{
    rc::Rc,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

pub(crate) use config::AgentConfig;
use metrics::Metrics;

use crate::{
    bpf::Event,
    session::SessionConfig,
    session::SessionError,
    store::{Store, StoreError},
    symbolize::KernelSymbols,
};

/// Windows kept in memory while the store fails, at most (then the oldest are dropped and
/// counted in `profiler_windows_total{outcome="dropped"}`).
pub(crate) const MAX_PENDING: usize = 60;

#[derive(Debug, thiserror::Error)]
pub(crate) enum AgentError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot listen on {addr}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Record(#[from] SessionError),
    #[error("cannot use the push spool in the data dir")]
    Spool(#[source] std::io::Error),
    #[error("{flag}")]
    PushUrl {
        flag: &'static str,
        #[source]
        source: push::PushUrlError,
    },
    #[error("cannot start the runtime")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    Token(#[from] crate::http::TokenError),
    #[error(transparent)]
    Exposure(#[from] config::ExposureError),
    #[error("{env} must be a whole number of milliseconds, got `{value}`")]
    TestDelay { env: &'static str, value: String },
}

/// What the stages share with each other and the HTTP API, each behind its own short lock.
pub(crate) struct Shared {
    metrics: Mutex<Metrics>,
    /// Why the store fails, while it does (/healthz says it).
    store_problem: Mutex<Option<String>>,
}

impl Shared {
    /// The metrics; a stage that panicked while holding them leaves them usable.
    pub(crate) fn metrics(&self) -> MutexGuard<'_, Metrics> {
        self.metrics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn store_problem(&self) -> MutexGuard<'_, Option<String>> {
        self.store_problem
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What the HTTP API (on the main thread) holds.
pub(crate) struct State {
    pub config: AgentConfig,
    pub shared: Arc<Shared>,
    /// /debug/pprof/profile requests, to the sampling thread.
    pub taps: tokio::sync::mpsc::Sender<sampler::TapRequest>,
    /// Store reads running now (`api::MAX_HEAVY` at most).
    pub heavy: std::cell::Cell<usize>,
    /// The push targets, whose counts `/metrics` reads as they are (`count_pushes`).
    pub pushers: Vec<Rc<push::Pusher>>,
}

/// What the agent reports to its front end (the CLI prints it, `cli/agent.rs`); called on
/// the thread that called `run`.
#[derive(Debug)]
pub(crate) enum Progress<'a> {
    /// Sampling started on `cpus` CPUs and the API listens.
    Started {
        cpus: usize,
        config: &'a AgentConfig,
    },
    /// A signal asked it to stop: the current window is being written.
    Stopping(crate::record::Stop),
    /// The stages finished; `lost_windows` could not be stored (the store failing at the end).
    /// `pushed`: windows sent and dropped since start over every push target, the last pass
    /// at stop included; None without one.
    Stopped {
        lost_windows: usize,
        pushed: Option<(u64, u64)>,
    },
}

/// Runs the agent until SIGTERM or SIGINT, then stores the current window and returns.
/// Threads: the drain (`sampler`), the symbolizer and the store (`pipeline`), and this one,
/// which serves HTTP and pushes. It prints nothing: `progress` hears what happens.
pub(crate) fn run(
    config: AgentConfig,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<(), AgentError> {
    one_malloc_arena();
    let (endpoints, inputs) = open(&config)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(AgentError::Runtime)?;
    // Before the sampler loads: a signal while it does still ends in a stored window.
    let signals = {
        let _enter = runtime.enter();
        crate::record::StopSignals::install()
    };
    let shared = Arc::new(Shared {
        metrics: Mutex::new(Metrics::default()),
        store_problem: Mutex::new(None),
    });
    let (taps_tx, taps_rx) = tokio::sync::mpsc::channel(sampler::MAX_TAPS);
    let (push_tx, push_rx) = tokio::sync::mpsc::channel(pipeline::PUSH_QUEUE);
    let push = (!endpoints.pushers.is_empty()).then_some(push_tx);
    let stages = Stages::start(&config, inputs, &shared, taps_rx, push)?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let pushing = serve(&config, endpoints, &shared, taps_tx, push_rx)?;
        progress(Progress::Started {
            cpus: stages.cpus,
            config: &config,
        });
        // Forever, in practice: only a signal ends it.
        let stop = signals
            .until(Duration::from_secs(u64::from(u32::MAX)))
            .await;
        progress(Progress::Stopping(stop));
        let finished = stages.stop().await;
        let pushed = pushing.finish(&shared).await;
        match finished {
            Some(lost_windows) => progress(Progress::Stopped {
                lost_windows,
                pushed,
            }),
            None => log::error!("agent: a stage panicked; see the messages above"),
        }
        Ok(())
    })
}

/// What the main thread serves with: the API's token and listener, the push targets.
struct Endpoints {
    token: Option<crate::http::Token>,
    listener: std::net::TcpListener,
    pushers: Vec<Rc<push::Pusher>>,
}

/// What the stages start from besides the config.
struct StageInputs {
    store: Store,
    kernel: KernelSymbols,
    /// `pipeline::STORE_DELAY_ENV` and `sampler::SETTLE_DELAY_ENV`, when set.
    store_delay: Option<Duration>,
    settle_delay: Option<Duration>,
}

/// Every check before loading BPF, so a bad data dir, port or token fails fast and clearly:
/// the exposure, the token, the store, the port, the push targets, the test hooks' delays,
/// then the kernel's symbols.
fn open(config: &AgentConfig) -> Result<(Endpoints, StageInputs), AgentError> {
    config.check_exposure()?;
    let token = config
        .token_file
        .as_deref()
        .map(crate::http::Token::from_file)
        .transpose()?;
    let store = Store::open(&config.data_dir)?;
    let listener = std::net::TcpListener::bind(config.listen)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|source| AgentError::Listen {
            addr: config.listen,
            source,
        })?;
    let pushers = open_pushers(config)?;
    let store_delay = test_delay(pipeline::STORE_DELAY_ENV)?;
    let settle_delay = test_delay(sampler::SETTLE_DELAY_ENV)?;
    let kernel = KernelSymbols::load().map_err(SessionError::Kallsyms)?;
    if kernel.hidden() {
        log::warn!(
            "kernel addresses are hidden by kernel.kptr_restrict; kernel frames show as [kernel]"
        );
    }
    let endpoints = Endpoints {
        token,
        listener,
        pushers,
    };
    let inputs = StageInputs {
        store,
        kernel,
        store_delay,
        settle_delay,
    };
    Ok((endpoints, inputs))
}

/// A pusher for each push target configured (--push-url, then --otlp-endpoint), each with its
/// spool in the data dir.
fn open_pushers(config: &AgentConfig) -> Result<Vec<Rc<push::Pusher>>, AgentError> {
    let mut pushers = Vec::new();
    for (url, protocol, flag) in [
        (&config.push_url, push::Protocol::Pyroscope, "--push-url"),
        (
            &config.otlp_endpoint,
            push::Protocol::Otlp,
            "--otlp-endpoint",
        ),
    ] {
        if let Some(url) = url {
            let url =
                push::parse_push_url(url).map_err(|source| AgentError::PushUrl { flag, source })?;
            pushers.push(
                push::Pusher::new(url, protocol, &config.data_dir).map_err(AgentError::Spool)?,
            );
        }
    }
    Ok(pushers)
}

/// The sampler's session as the agent runs it: on CPU time, every process of `config.comms`.
fn session_config(config: &AgentConfig, settle_delay: Option<Duration>) -> SessionConfig {
    SessionConfig {
        event: Event::CpuClock,
        frequency_hz: config.frequency_hz,
        pids: Vec::new(),
        comms: config.comms.clone(),
        cgroups: Vec::new(),
        unwind: config.unwind,
        unwind_memory: config.unwind_memory,
        unwind_tables: config.unwind_tables,
        python: config.python,
        runq: config.runq,
        // Tables compiled once survive restarts, next to the store (docs/unwinding.md).
        unwind_cache: Some(config.data_dir.join("unwind-tables")),
        kernel_record_bytes: sampler::KERNEL_RECORD_BYTES,
        wake_for_processes: false,
        settle_delay,
    }
}

/// The stages' threads, which the main thread stops at the end.
struct Stages {
    /// CPUs sampled.
    cpus: usize,
    stop: tokio::sync::watch::Sender<bool>,
    sampling: std::thread::JoinHandle<()>,
    symbolizer: std::thread::JoinHandle<()>,
    /// Returns the windows it could not store.
    storing: std::thread::JoinHandle<usize>,
}

impl Stages {
    /// Starts the drain, which loads BPF, and waits until it samples (or could not start);
    /// then the symbolizer and the store. `taps` are /debug/pprof/profile requests to the
    /// drain; `push` takes the symbolized windows when there is a push target.
    fn start(
        config: &AgentConfig,
        inputs: StageInputs,
        shared: &Arc<Shared>,
        taps: tokio::sync::mpsc::Receiver<sampler::TapRequest>,
        push: Option<tokio::sync::mpsc::Sender<Arc<crate::profile::Profile>>>,
    ) -> Result<Self, AgentError> {
        let StageInputs {
            store,
            kernel,
            store_delay,
            settle_delay,
        } = inputs;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let jobs = Arc::new(pipeline::Jobs::default());
        let (store_tx, store_rx) = std::sync::mpsc::sync_channel(pipeline::STORE_QUEUE);
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let stage = sampler::Stage {
            config: session_config(config, settle_delay),
            window: config.window,
            jobs: jobs.clone(),
            taps,
            stop: stop_rx,
            shared: shared.clone(),
        };
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.to_owned())
                .spawn(f)
                .map_err(AgentError::Runtime)
        };
        let sampling = spawn("sampler", Box::new(move || stage.run(started_tx)))?;
        let cpus = match started_rx.recv() {
            Ok(Ok(cpus)) => cpus,
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => {
                return Err(
                    SessionError::Io(std::io::Error::other("the sampler thread died")).into(),
                );
            }
        };
        let symbolizer = {
            let shared = shared.clone();
            spawn(
                "symbolize",
                Box::new(move || pipeline::symbolize(&jobs, kernel, store_tx, push, shared)),
            )?
        };
        let storing = {
            let stage = pipeline::StoreStage {
                store,
                windows: store_rx,
                retention: config.store_retention(),
                shared: shared.clone(),
                delay: store_delay,
            };
            std::thread::Builder::new()
                .name("store".to_owned())
                .spawn(move || stage.run())
                .map_err(AgentError::Runtime)?
        };
        Ok(Self {
            cpus,
            stop: stop_tx,
            sampling,
            symbolizer,
            storing,
        })
    }

    /// Stops the stages: the drain cuts the last window, the symbolizer and the store finish
    /// theirs; the API goes on answering meanwhile. Returns the windows that could not be
    /// stored, or None if a stage panicked.
    async fn stop(self) -> Option<usize> {
        let Self {
            stop,
            sampling,
            symbolizer,
            storing,
            ..
        } = self;
        let _ = stop.send(true);
        let joined = tokio::task::spawn_blocking(move || {
            let others = [sampling, symbolizer].into_iter().all(|t| t.join().is_ok());
            (others, storing.join().ok())
        })
        .await
        .unwrap_or((false, None));
        match joined {
            (true, Some(lost_windows)) => Some(lost_windows),
            _ => None,
        }
    }
}

/// Starts serving the HTTP API and pushing on this thread's `LocalSet` (its tasks run while
/// the caller waits); returns the push tasks, to finish at the end.
fn serve(
    config: &AgentConfig,
    endpoints: Endpoints,
    shared: &Arc<Shared>,
    taps: tokio::sync::mpsc::Sender<sampler::TapRequest>,
    windows: tokio::sync::mpsc::Receiver<Arc<crate::profile::Profile>>,
) -> Result<Pushing, AgentError> {
    let Endpoints {
        token,
        listener,
        pushers,
    } = endpoints;
    let listener =
        tokio::net::TcpListener::from_std(listener).map_err(|source| AgentError::Listen {
            addr: config.listen,
            source,
        })?;
    let state = Rc::new(State {
        config: config.clone(),
        shared: shared.clone(),
        taps,
        heavy: std::cell::Cell::new(0),
        pushers: pushers.clone(),
    });
    let pushing = Pushing::start(pushers, windows, shared);
    tokio::task::spawn_local(crate::http::serve(listener, token, move |req| {
        api::handle(state.clone(), req)
    }));
    Ok(pushing)
}

/// The push targets' tasks: a sender each, and the spooler that hands every symbolized
/// window to all of them (none without a target).
struct Pushing {
    pushers: Vec<Rc<push::Pusher>>,
    senders: Vec<tokio::task::JoinHandle<()>>,
    spooler: Option<tokio::task::JoinHandle<()>>,
}

impl Pushing {
    fn start(
        pushers: Vec<Rc<push::Pusher>>,
        mut windows: tokio::sync::mpsc::Receiver<Arc<crate::profile::Profile>>,
        shared: &Arc<Shared>,
    ) -> Self {
        let senders = pushers
            .iter()
            .map(|p| tokio::task::spawn_local(p.clone().run()))
            .collect();
        let mut spooler = None;
        if !pushers.is_empty() {
            let shared = shared.clone();
            let pushers = pushers.clone();
            spooler = Some(tokio::task::spawn_local(async move {
                while let Some(profile) = windows.recv().await {
                    for p in &pushers {
                        p.enqueue(&profile, &profile.meta.hostname);
                    }
                    count_pushes(&shared, &pushers);
                }
            }));
        }
        Self {
            pushers,
            senders,
            spooler,
        }
    }

    /// Once the stages stopped: sends what is left (within `push::STOP_GRACE`) and returns
    /// the windows sent and dropped over every target, None without one.
    async fn finish(self, shared: &Shared) -> Option<(u64, u64)> {
        let Self {
            pushers,
            senders,
            spooler,
        } = self;
        // The symbolizer is gone, so the spooler ends once the last window is spooled; then
        // each sender finishes its push and sends what is spooled. Dropped at the runtime's
        // end instead, a sender cut its connection mid-request (a server saw one close before
        // its request line) and left the last window for the next start.
        let flush = async {
            if let Some(spooler) = spooler {
                let _ = spooler.await;
            }
            for p in &pushers {
                p.stop();
            }
            for s in senders {
                let _ = s.await;
            }
        };
        if tokio::time::timeout(push::STOP_GRACE, flush).await.is_err() {
            log::error!(
                "push: the last windows were not sent within {:?}; they stay spooled for the next start",
                push::STOP_GRACE
            );
        }
        // The last pass sent windows after the spooler's last count.
        (!pushers.is_empty()).then(|| count_pushes(shared, &pushers))
    }
}

/// Copies the push targets' counts, both together, into `profiler_push_windows_total` and
/// returns them (sent, dropped): after each window spooled, on each scrape and after the last
/// pass at stop, so no window sent is left out of the metric.
pub(crate) fn count_pushes(shared: &Shared, pushers: &[Rc<push::Pusher>]) -> (u64, u64) {
    let sent = pushers.iter().map(|p| p.sent.get()).sum();
    let dropped = pushers.iter().map(|p| p.dropped.get()).sum();
    let mut m = shared.metrics();
    m.push_sent = sent;
    m.push_dropped = dropped;
    (sent, dropped)
}

/// Caps glibc's malloc at one arena, before the agent's threads start. By default each
/// thread that allocates gets an arena of its own (up to 8 per core) and keeps what it freed
/// there: the agent's eight threads allocate in bursts (a window symbolized, tables
/// compiled, a process read) and idle between them, so the freed memory of each burst stayed
/// resident per thread, and one arena keeps a good part of the agent's memory from piling up
/// (docs/benchmarks-history.md has the runs). The threads mostly wait (a drain a second, a
/// window every 10 s), so one shared arena lock costs little.
///
/// Blocks of `MMAP_FROM` and more are mapped on their own, so they go back to the kernel
/// when freed. glibc's own threshold starts at 128 KiB but rises to the size of each mapped
/// block freed, up to 32 MiB: after a big binary's table (librustc_driver's rows are 9 MB,
/// its spans 14 MB) the next such buffers would come from the heap, and what they left free
/// there would stay resident until the window's trim.
fn one_malloc_arena() {
    const MMAP_FROM: i32 = 2 << 20;
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets malloc parameters; both take any positive value.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_FROM);
    }
}

/// Gives the memory freed since the last call back to the kernel (glibc's `malloc_trim`),
/// after each window is stored. The agent allocates in bursts (loading BPF and reading
/// kallsyms at start, then a window drained, symbolized and written) and frees most of it;
/// malloc keeps freed chunks for reuse and returns only the top of its heap by itself, so
/// what the bursts freed would stay resident, scattered between live blocks: under churn
/// that is about half of the agent's RSS. One arena (`one_malloc_arena`) makes it one heap
/// to walk once every `--window`; the walk's cost is inside the agent's CPU figures
/// (BENCHMARKS.md).
pub(crate) fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free memory to the kernel; live blocks are untouched.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A test hook's delay: `pipeline::STORE_DELAY_ENV` (a slow store) or
/// `sampler::SETTLE_DELAY_ENV` (a slow cut).
fn test_delay(env: &'static str) -> Result<Option<Duration>, AgentError> {
    match std::env::var(env) {
        Err(_) => Ok(None),
        Ok(v) => v
            .parse::<u64>()
            .map(|ms| Some(Duration::from_millis(ms)))
            .map_err(|_| AgentError::TestDelay { env, value: v }),
    }
}

/// A time that is neither `now` nor a duration ago; the duration's error follows.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("a time is `now` or a duration ago such as 1h, 30m")]
pub(crate) struct TimeAgoError(#[source] crate::util::InputError);

/// A time given as `now` or as a duration ago (`1h`, `30m`, `90s`), in ns since the epoch.
pub(crate) fn time_ago(text: &str, now_unix_ns: u64) -> Result<u64, TimeAgoError> {
    if text == "now" {
        return Ok(now_unix_ns);
    }
    let d = crate::util::parse_duration(text).map_err(TimeAgoError)?;
    Ok(now_unix_ns.saturating_sub(d.as_nanos() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_ago() {
        let now = 10_000 * 1_000_000_000;
        assert_eq!(time_ago("now", now), Ok(now));
        assert_eq!(time_ago("1h", now), Ok(now - 3600 * 1_000_000_000));
        assert!(time_ago("yesterday", now).is_err());
    }
}
