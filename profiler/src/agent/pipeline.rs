//! The agent's later stages, each on a thread of its own behind a bounded queue, so that the
//! drain (`sampler`) never waits on them: the symbolizer names each window's frames, feeds
//! the metrics, answers /debug/pprof/profile taps and hands the profile on to the pusher's
//! and the store's queues; the store thread writes windows and applies retention. A full
//! queue drops the window and counts its samples (`metrics::Pipeline`).
use std::{
    collections::VecDeque,
    sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, mpsc},
    time::{Duration, Instant},
};

use tokio::sync::{mpsc as tmpsc, oneshot};

use super::{MAX_PENDING, Shared};
use crate::util::unix_now_ns;
use crate::{
    cgroups,
    profile::{Frame, Interner, Profile, Sample},
    session::Window,
    store::Store,
    symbolize::{KernelSymbols, Symbolizer},
};

/// Windows waiting for the symbolizer, at most; a window is a few KiB at 19 Hz.
pub(super) const SYMBOLIZE_QUEUE: usize = 4;
/// /debug/pprof/profile taps waiting for the symbolizer, at most.
pub(super) const TAP_QUEUE: usize = 2 * super::sampler::MAX_TAPS;
/// Symbolized windows waiting for the store, at most.
pub(super) const STORE_QUEUE: usize = 4;
/// Symbolized windows waiting for the pusher, at most.
pub(super) const PUSH_QUEUE: usize = 4;
/// How long the symbolizer keeps the binaries it parsed. Each new symbolizer parses and
/// indexes again every binary with new addresses: under churn the busy ones (the spawning
/// interpreter, libc) were a fifth of this thread's CPU. Five minutes would cut that, but a
/// build's big libraries (librustc_driver, libLLVM: 44 MB of parsed symbols) stayed that long.
const SYMBOLIZER_KEEP: Duration = Duration::from_secs(60);
/// How often the dying-cgroup figures are read (a walk of every v1 hierarchy).
const DYING_EVERY: Duration = Duration::from_secs(60);
/// Test hook: milliseconds the store thread sleeps before each write, to show that a slow
/// store makes the agent drop (and count) windows rather than stall its drain. Read once at
/// start; unset in production (docs/agent.md).
pub(super) const STORE_DELAY_ENV: &str = "PROFILER_TEST_STORE_DELAY_MS";

/// Work for the symbolizer.
pub(super) enum Job {
    /// A window to store (and push).
    Window(Box<Window>),
    /// The samples of a /debug/pprof/profile request, in the parts the windows cut
    /// meanwhile left it (oldest first).
    Tap(Vec<Window>, Reply),
}

/// Where a tap's profile goes, or why there is none.
pub(crate) type Reply = oneshot::Sender<Result<Profile, TapError>>;

/// Why a /debug/pprof/profile request gets no profile (the API answers 503, retry later).
#[derive(Debug, thiserror::Error)]
pub(crate) enum TapError {
    #[error("the agent is behind on symbolizing; try again later")]
    Behind,
}

/// The symbolizer's queue: windows and taps, each bounded; taps go first (a client waits
/// for them; a window only has to be stored some time).
#[derive(Default)]
pub(crate) struct Jobs {
    queue: Mutex<Queued>,
    ready: Condvar,
}

#[derive(Default)]
struct Queued {
    windows: VecDeque<Box<Window>>,
    taps: VecDeque<(Vec<Window>, Reply)>,
    closed: bool,
}

impl Jobs {
    fn queued(&self) -> MutexGuard<'_, Queued> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a window; false (the window dropped) when `SYMBOLIZE_QUEUE` wait already.
    /// `always` queues it anyway (the last one, at stop: no more come).
    pub(crate) fn push_window(&self, w: Window, always: bool) -> bool {
        let mut q = self.queued();
        if q.windows.len() >= SYMBOLIZE_QUEUE && !always {
            return false;
        }
        q.windows.push_back(Box::new(w));
        self.ready.notify_one();
        true
    }

    /// Queues a tap, or hands its reply back when `TAP_QUEUE` wait already.
    pub(crate) fn push_tap(&self, w: Vec<Window>, reply: Reply) -> Result<(), Reply> {
        let mut q = self.queued();
        if q.taps.len() >= TAP_QUEUE {
            return Err(reply);
        }
        q.taps.push_back((w, reply));
        self.ready.notify_one();
        Ok(())
    }

    /// No more jobs come: `next` returns None once the queue is empty.
    pub(crate) fn close(&self) {
        self.queued().closed = true;
        self.ready.notify_one();
    }

    /// The next job, taps first; waits for one.
    fn next(&self) -> Option<Job> {
        let mut q = self.queued();
        loop {
            if let Some((w, r)) = q.taps.pop_front() {
                return Some(Job::Tap(w, r));
            }
            if let Some(w) = q.windows.pop_front() {
                return Some(Job::Window(w));
            }
            if q.closed {
                return None;
            }
            q = self.ready.wait(q).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// The symbolizer's thread: runs until the drain closes its queue, then closes the store's
/// (by dropping its sender).
pub(super) fn symbolize(
    jobs: &Jobs,
    kernel: KernelSymbols,
    store: mpsc::SyncSender<Arc<Profile>>,
    push: Option<tmpsc::Sender<Arc<Profile>>>,
    shared: Arc<Shared>,
) {
    let mut symbolizer = Symbolizer::new(kernel, false).renewing_after(SYMBOLIZER_KEEP);
    let mut dying_read: Option<Instant> = None;
    let mut symbolize = |window: Window| {
        let t = Instant::now();
        let p = window.symbolize(&mut symbolizer);
        log::debug!(
            "symbolized {} samples in {:.3} s",
            p.samples.len(),
            t.elapsed().as_secs_f64()
        );
        p
    };
    while let Some(job) = jobs.next() {
        let window = match job {
            Job::Window(w) => w,
            Job::Tap(parts, reply) => {
                let profiles: Vec<Profile> = parts.into_iter().map(&mut symbolize).collect();
                let _ = reply.send(Ok(join(profiles)));
                continue;
            }
        };
        let lost = window.collected.counts.lost_records;
        let profile = symbolize(*window);
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

/// One profile of consecutive ones (a tap's parts): their samples on one time line, from
/// the first's start to the last's end.
fn join(mut parts: Vec<Profile>) -> Profile {
    if parts.len() <= 1 {
        return parts.pop().unwrap_or_default();
    }
    let first = &parts[0].meta;
    let last = &parts[parts.len() - 1].meta;
    let mut meta = first.clone();
    meta.duration_ns = (last.start_mono_ns + last.duration_ns).saturating_sub(first.start_mono_ns);
    meta.counters.recorded = parts.iter().map(|p| p.meta.counters.recorded).sum();
    let start = meta.start_mono_ns;
    let mut out = Interner::new(meta);
    let mut pids = std::collections::HashSet::new();
    let mut cgroups = std::collections::HashSet::new();
    for p in &parts {
        let binaries: Vec<u32> = p.binaries.iter().map(|b| out.binary(b.clone())).collect();
        let frames: Vec<u32> = p
            .frames
            .iter()
            .map(|f| {
                let frame = Frame {
                    name: out.string(p.str(f.name)),
                    module: out.string(p.str(f.module)),
                    binary: binaries[f.binary as usize],
                    ..f.clone()
                };
                out.frame(frame)
            })
            .collect();
        let stacks: Vec<u32> = p
            .stacks
            .iter()
            .map(|s| out.stack(s.frames.iter().map(|&f| frames[f as usize]).collect()))
            .collect();
        let shift = p.meta.start_mono_ns.saturating_sub(start);
        for s in &p.samples {
            let comm = out.string(p.str(s.comm));
            out.sample(Sample {
                offset_ns: s.offset_ns + shift,
                comm,
                stack: stacks[s.stack as usize],
                ..*s
            });
        }
        for proc in p.processes.iter().filter(|q| pids.insert(q.pid)) {
            out.process(proc.clone());
        }
        for c in p.cgroups.iter().filter(|c| cgroups.insert(c.id)) {
            out.cgroup(c.clone());
        }
    }
    out.finish()
}

/// What the store thread needs.
pub(super) struct StoreStage {
    pub store: Store,
    pub windows: mpsc::Receiver<Arc<Profile>>,
    pub retention: crate::store::Retention,
    pub shared: Arc<Shared>,
    /// `STORE_DELAY_ENV`, when set.
    pub delay: Option<Duration>,
}

impl StoreStage {
    /// Writes windows until the symbolizer closes the queue; returns how many it could not
    /// store (the store failing at the end), counted as dropped.
    pub(super) fn run(mut self) -> usize {
        let mut pending: VecDeque<Arc<Profile>> = VecDeque::new();
        let mut failing = false;
        // At start too: an agent restarted with a shorter --keep-times or --max-age applies
        // it before its first window is stored (and counted as stored), not a window later.
        let mut retention_failing = self.retain(false);
        while let Ok(profile) = self.windows.recv() {
            if let Some(d) = self.delay {
                std::thread::sleep(d);
            }
            pending.push_back(profile);
            failing = self.store_pending(&mut pending, failing);
            retention_failing = self.retain(retention_failing);
            // The window's last stage: what symbolizing and storing it took is free now.
            super::release_freed_memory();
        }
        let lost = pending.len();
        let mut m = self.shared.metrics();
        for p in pending {
            m.pipeline
                .settle(p.meta.counters.recorded, |q| &mut q.dropped_store_failing);
        }
        lost
    }

    /// Applies the retention now; returns whether it failed, logged once per failing spell
    /// like writes (on a full disk it fails every window).
    fn retain(&mut self, failing: bool) -> bool {
        match self.store.retain(unix_now_ns(), self.retention) {
            Err(e) if !failing => {
                log::error!("store retention failed: {}", crate::util::chain(&e));
                true
            }
            Err(_) => true,
            Ok(_) => false,
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
                    // Three PRAGMAs once a window: cheap, and read outside the metrics lock.
                    let used = self.store.used_bytes().ok();
                    let mut m = self.shared.metrics();
                    m.store_used_bytes = used.or(m.store_used_bytes);
                    m.windows_stored += 1;
                    m.pipeline.settle(n, |q| &mut q.stored);
                }
                Err(e) => {
                    // The store's error names the file; its cause (SQLite's) says why.
                    let e = crate::util::chain(&e);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{FrameKind, Meta};

    /// A one-sample profile of `func` at `offset_ns`, starting at `start_mono_ns`.
    fn one(func: &str, start_mono_ns: u64, offset_ns: u64) -> Profile {
        let mut i = Interner::new(Meta {
            start_mono_ns,
            duration_ns: 1_000,
            counters: crate::profile::Counters {
                recorded: 1,
                ..Default::default()
            },
            ..Meta::default()
        });
        let name = i.string(func);
        let frame = i.frame(Frame {
            name,
            module: 0,
            kind: FrameKind::User,
            addr: 0,
            binary: 0,
        });
        let stack = i.stack(vec![frame]);
        let comm = i.string("worker");
        i.sample(Sample {
            offset_ns,
            cpu: 1,
            pid: 7,
            tid: 7,
            cgroup_id: 0,
            comm,
            stack,
        });
        i.finish()
    }

    #[test]
    fn joined_parts_share_one_time_line() {
        let p = join(vec![one("a", 1_000, 10), one("b", 1_500, 20)]);
        assert_eq!(p.meta.start_mono_ns, 1_000);
        assert_eq!(
            p.meta.duration_ns, 1_500,
            "from the first start to the last end"
        );
        assert_eq!(p.meta.counters.recorded, 2);
        let got: Vec<(u64, String)> = p
            .samples
            .iter()
            .map(|s| {
                let f = p.stack_frames(s.stack).next().unwrap();
                (s.offset_ns, p.str(f.name).to_owned())
            })
            .collect();
        assert_eq!(got, [(10, "a".to_owned()), (520, "b".to_owned())]);
        assert!(p.samples.iter().all(|s| p.str(s.comm) == "worker"));
        assert_eq!(join(vec![one("x", 5, 1)]), one("x", 5, 1));
    }

    fn window(start_mono_ns: u64) -> Window {
        Window {
            collected: crate::collect::Collected::default(),
            meta: Meta {
                start_mono_ns,
                ..Meta::default()
            },
            runq: None,
            table_generation: 0,
        }
    }

    #[test]
    fn taps_go_first_and_windows_are_bounded() {
        let jobs = Jobs::default();
        for i in 0..SYMBOLIZE_QUEUE as u64 {
            assert!(jobs.push_window(window(i), false));
        }
        assert!(
            !jobs.push_window(window(99), false),
            "past the bound: dropped"
        );
        assert!(
            jobs.push_window(window(100), true),
            "the last window always goes"
        );
        let (reply, _answer) = oneshot::channel();
        assert!(jobs.push_tap(vec![window(50)], reply).is_ok());
        jobs.close();
        let mut order = Vec::new();
        while let Some(job) = jobs.next() {
            order.push(match job {
                Job::Tap(parts, _) => (true, parts[0].meta.start_mono_ns),
                Job::Window(w) => (false, w.meta.start_mono_ns),
            });
        }
        assert_eq!(
            order,
            [
                (true, 50),
                (false, 0),
                (false, 1),
                (false, 2),
                (false, 3),
                (false, 100)
            ]
        );
    }

    #[test]
    fn settled_samples_leave_the_flight() {
        let mut m = crate::agent::metrics::Metrics::default();
        m.add_cut(&crate::profile::Counters {
            recorded: 10,
            ..Default::default()
        });
        m.pipeline.settle(4, |q| &mut q.stored);
        m.pipeline.settle(6, |q| &mut q.dropped_store_queue);
        let q = m.pipeline;
        assert_eq!(
            (q.cut, q.in_flight, q.stored, q.dropped_store_queue),
            (10, 0, 4, 6)
        );
    }

    /// The store thread applies the retention when it starts, before any window: an agent
    /// restarted with a shorter --keep-times drops the old times before it counts its first
    /// window stored (agent_history read the heat map right after that count and, on a
    /// slow store, found the old windows still timed). Before, it waited for a window.
    #[test]
    fn retention_is_applied_at_start() {
        let dir = tempfile::Builder::new()
            .prefix("pipeline-test-retain-")
            .tempdir()
            .unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        store.write_window(&one("old", 0, 500)).unwrap();
        let (tx, windows) = mpsc::channel();
        drop(tx); // no window comes
        let stage = StoreStage {
            store,
            windows,
            retention: crate::store::Retention {
                max_age_ns: u64::MAX,
                keep_times_ns: 1_000_000_000,
                max_bytes: u64::MAX,
            },
            shared: Arc::new(crate::agent::Shared {
                metrics: std::sync::Mutex::new(crate::agent::metrics::Metrics::default()),
                store_problem: std::sync::Mutex::new(None),
            }),
            delay: None,
        };
        assert_eq!(stage.run(), 0);
        let p = Store::open_read(dir.path())
            .unwrap()
            .read(&crate::store::Query {
                until_unix_ns: u64::MAX / 2,
                ..Default::default()
            });
        let p = p.unwrap();
        assert_eq!(p.samples.len(), 1);
        assert_eq!(
            p.meta.untimed,
            vec![(0, 1_000)],
            "the old window kept its times"
        );
    }
}
