//! The agent's later stages, each on a thread of its own behind a bounded queue, so that the
//! drain (`sampler`) never waits on them: the symbolizer names each window's frames, feeds
//! the metrics, answers /debug/pprof/profile taps and hands the profile on to the pusher's
//! and the store's queues; the store thread writes windows and applies retention. A full
//! queue drops the window and counts its samples (`metrics::Pipeline`).
use std::{
    collections::VecDeque,
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use tokio::sync::{mpsc as tmpsc, oneshot};

use super::{MAX_PENDING, Shared, unix_now_ns};
use crate::{
    cgroups,
    profile::Profile,
    session::Window,
    store::Store,
    symbolize::{KernelSymbols, NameCache, UserSymbolizer},
};

/// Windows waiting for the symbolizer, at most; a window is a few KiB at 19 Hz.
pub const SYMBOLIZE_QUEUE: usize = 4;
/// Symbolized windows waiting for the store, at most.
pub const STORE_QUEUE: usize = 4;
/// Symbolized windows waiting for the pusher, at most.
pub const PUSH_QUEUE: usize = 4;
/// User frame names cached across windows at most; then the cache starts afresh.
const MAX_NAMES: usize = 1_000_000;
/// How often the dying-cgroup figures are read (a walk of every v1 hierarchy).
const DYING_EVERY: Duration = Duration::from_secs(60);
/// Test hook: milliseconds the store thread sleeps before each write, to show that a slow
/// store makes the agent drop (and count) windows rather than stall its drain. Read once at
/// start; unset in production (docs/agent.md).
pub const STORE_DELAY_ENV: &str = "PROFILER_TEST_STORE_DELAY_MS";

/// Work for the symbolizer.
pub enum Job {
    /// A window to store (and push).
    Window(Window),
    /// The samples of a /debug/pprof/profile request.
    Tap(Window, oneshot::Sender<Result<Profile, String>>),
}

/// The symbolizer's thread: runs until the drain closes its queue, then closes the store's.
pub fn symbolize(
    jobs: mpsc::Receiver<Job>,
    kernel: KernelSymbols,
    store: mpsc::SyncSender<Arc<Profile>>,
    push: Option<tmpsc::Sender<Arc<Profile>>>,
    shared: Arc<Shared>,
) {
    let mut names = NameCache::new();
    let mut generation = 0;
    let mut dying_read: Option<Instant> = None;
    for job in jobs {
        let (window, reply) = match job {
            Job::Window(w) => (w, None),
            Job::Tap(w, r) => (w, Some(r)),
        };
        if window.table_generation != generation || names.len() > MAX_NAMES {
            // File ids start afresh (or the cache is too big): names keyed by them go.
            names.clear();
            generation = window.table_generation;
        }
        // A fresh user symbolizer each window: names found are kept in `names`, so a window
        // parses only binaries with new addresses, and their mappings leave the RSS.
        let profile = window.symbolize(&kernel, &UserSymbolizer::default(), &mut names);
        if let Some(reply) = reply {
            let _ = reply.send(Ok(profile));
            continue;
        }
        let lost = window.collection.processes.lost_records;
        if lost > 0 {
            log::warn!(
                "the kernel dropped {lost} process records (mappings, exec, exit) this window: \
                 some short-lived processes may show [unknown] frames"
            );
        }
        let dying = match dying_read {
            Some(t) if t.elapsed() < DYING_EVERY => None,
            _ => {
                dying_read = Some(Instant::now());
                Some(cgroups::dying_counts())
            }
        };
        let profile = Arc::new(profile);
        {
            let mut m = shared.metrics();
            m.add_window(&profile);
            if let Some(d) = dying {
                m.set_dying(d);
            }
        }
        if let Some(push) = &push
            && push.try_send(profile.clone()).is_err()
        {
            shared.metrics().pipeline.push_queue_dropped_windows += 1;
        }
        let n = profile.meta.counters.recorded;
        if let Err(mpsc::TrySendError::Full(_) | mpsc::TrySendError::Disconnected(_)) =
            store.try_send(profile)
        {
            shared
                .metrics()
                .pipeline
                .settle(n, |p| &mut p.dropped_store_queue);
        }
    }
}

/// What the store thread needs.
pub struct StoreStage {
    pub store: Store,
    pub windows: mpsc::Receiver<Arc<Profile>>,
    pub retention: Duration,
    pub max_size_bytes: u64,
    pub shared: Arc<Shared>,
    /// `STORE_DELAY_ENV`, when set.
    pub delay: Option<Duration>,
}

impl StoreStage {
    /// Writes windows until the symbolizer closes the queue.
    pub fn run(mut self) {
        let mut pending: VecDeque<Arc<Profile>> = VecDeque::new();
        let mut failing = false;
        let mut retention_failing = false;
        while let Ok(profile) = self.windows.recv() {
            if let Some(d) = self.delay {
                std::thread::sleep(d);
            }
            pending.push_back(profile);
            failing = self.store_pending(&mut pending, failing);
            let retained = self.store.retain(
                unix_now_ns(),
                self.retention.as_nanos() as u64,
                self.max_size_bytes,
            );
            // Once per failing spell, like writes: on a full disk it fails every window.
            match retained {
                Err(e) if !retention_failing => {
                    log::error!("store retention failed: {e}");
                    retention_failing = true;
                }
                Err(_) => {}
                Ok(_) => retention_failing = false,
            }
        }
        if pending.is_empty() {
            eprintln!("agent: stopped; the last window is stored");
        } else {
            log::error!(
                "agent: stopped; {} windows could not be stored and are lost",
                pending.len()
            );
            let mut m = self.shared.metrics();
            for p in pending {
                m.pipeline
                    .settle(p.meta.counters.recorded, |q| &mut q.dropped_store_failing);
            }
        }
    }

    /// Writes the pending windows, oldest first; on failure keeps them (bounded) for the next
    /// try. Returns whether the store is failing, to log a failure once rather than per window.
    fn store_pending(&mut self, pending: &mut VecDeque<Arc<Profile>>, failing: bool) -> bool {
        while let Some(p) = pending.front() {
            match self.store.write_window(p) {
                Ok(()) => {
                    let n = p.meta.counters.recorded;
                    pending.pop_front();
                    let mut m = self.shared.metrics();
                    m.windows_stored += 1;
                    m.pipeline.settle(n, |q| &mut q.stored);
                }
                Err(e) => {
                    *self.shared.store_problem() = Some(format!(
                        "cannot write to the store: {e}; {} windows wait in memory",
                        pending.len().min(MAX_PENDING)
                    ));
                    if !failing {
                        log::error!(
                            "cannot write to the store: {e}; sampling goes on, keeping up to {MAX_PENDING} windows in memory"
                        );
                    }
                    while pending.len() > MAX_PENDING {
                        if let Some(p) = pending.pop_front() {
                            let mut m = self.shared.metrics();
                            m.windows_dropped += 1;
                            m.pipeline
                                .settle(p.meta.counters.recorded, |q| &mut q.dropped_store_failing);
                        }
                    }
                    return true;
                }
            }
        }
        if failing {
            log::warn!("the store works again; every kept window is written");
        }
        *self.shared.store_problem() = None;
        false
    }
}
