//! Runs the `Loader` on a thread of its own: compiling a large binary's table takes from
//! milliseconds to seconds, and the reader that drains the ring buffer must never wait for
//! it. The reader reads each new process's mappings at once (while the process still lives)
//! and loads them itself when every binary's table is already in (a few syscalls: a new
//! process of a known program is walked by table from its next samples); otherwise it queues
//! them for the thread. Until its tables are in, the kernel walks a process by frame pointer.
use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use super::{Loader, LoaderStats, MappingSpec, ProcessEvent, proc_mappings};

/// Work for the loader thread, in the order the collector saw it.
enum Job {
    Load(u32, Vec<MappingSpec>),
    Forget(u32),
}

pub struct BackgroundLoader {
    tx: Option<mpsc::Sender<Job>>,
    loader: Arc<Mutex<Loader>>,
    /// A copy of the loader's stats, readable while the thread holds the loader.
    stats: Arc<Mutex<LoaderStats>>,
    stop: Arc<AtomicBool>,
    /// When each sampled pid's mappings were last read: a process is read again at most
    /// every RELOAD_INTERVAL (its walks may keep leaving the mappings, e.g. in JIT code).
    /// Its keys are the processes that were sampled and have not exited.
    last_read: Mutex<HashMap<u32, Instant>>,
}

const RELOAD_INTERVAL: Duration = Duration::from_millis(50);

/// Loads one process and mirrors the loader's stats.
fn load(loader: &mut Loader, stats: &Mutex<LoaderStats>, pid: u32, mappings: &[MappingSpec]) {
    if let Err(e) = loader.load_process(pid, mappings) {
        log::debug!(
            "pid {pid}: cannot load its mappings for unwinding: {}",
            crate::util::chain(&e)
        );
    }
    if let Ok(mut s) = stats.lock() {
        *s = loader.stats;
    }
}

impl BackgroundLoader {
    pub fn spawn(loader: Loader) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let stats = Arc::new(Mutex::new(loader.stats));
        let loader = Arc::new(Mutex::new(loader));
        let stop = Arc::new(AtomicBool::new(false));
        let (thread_loader, thread_stats, thread_stop) =
            (Arc::clone(&loader), Arc::clone(&stats), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("unwind-loader".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    if thread_stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(mut loader) = thread_loader.lock() else {
                        break;
                    };
                    match job {
                        Job::Load(pid, mappings) => {
                            load(&mut loader, &thread_stats, pid, &mappings);
                        }
                        Job::Forget(pid) => {
                            loader.forget_process(pid);
                            if let Ok(mut s) = thread_stats.lock() {
                                *s = loader.stats;
                            }
                        }
                    }
                }
            })?;
        Ok(Self {
            tx: Some(tx),
            loader,
            stats,
            stop,
            last_read: Mutex::new(HashMap::new()),
        })
    }

    /// Acts on what the collector saw. A sample of a process not loaded yet (or one whose
    /// walk left its loaded mappings) loads its mappings: the kernel's when the collector
    /// has them all, else /proc's (read now, at most every RELOAD_INTERVAL). Loading is done
    /// at once when every binary's table is in already and the thread is idle, else queued.
    /// New mappings of a process are loaded at once when that costs no table build, so an
    /// exec of a known program is walked by table from its first samples; a process that
    /// was sampled gets its new libraries' tables built too. A process already gone is
    /// skipped (its samples stay walked by frame pointer).
    pub fn submit(&self, event: ProcessEvent) {
        match event {
            ProcessEvent::Sampled {
                pid,
                stale: _,
                mappings,
            } => {
                if let Ok(mut last) = self.last_read.lock() {
                    let now = Instant::now();
                    if last
                        .get(&pid)
                        .is_some_and(|t| now.duration_since(*t) < RELOAD_INTERVAL)
                    {
                        return;
                    }
                    last.insert(pid, now);
                }
                let Some(mappings) = mappings.or_else(|| proc_mappings(pid).ok()) else {
                    return;
                };
                self.load_or_queue(pid, mappings, true);
            }
            ProcessEvent::Mapped { pid, mappings } => {
                let sampled = self
                    .last_read
                    .lock()
                    .is_ok_and(|last| last.contains_key(&pid));
                // A process from before the recording that was sampled (a dlopen, say):
                // read /proc now, before its walks reach the new library.
                let Some(mappings) =
                    mappings.or_else(|| sampled.then(|| proc_mappings(pid).ok()).flatten())
                else {
                    return;
                };
                self.load_or_queue(pid, mappings, sampled);
            }
            ProcessEvent::Exited { pid } => {
                if let Ok(mut last) = self.last_read.lock() {
                    last.remove(&pid);
                }
                // Sent for every exit: unsampled processes may have been loaded (`Mapped`).
                if let Some(tx) = &self.tx {
                    let _ = tx.send(Job::Forget(pid));
                }
            }
        }
    }

    /// Loads now when it costs no table build and the thread is idle; else queues the load
    /// when `queue` (a process that was sampled), or leaves it.
    fn load_or_queue(&self, pid: u32, mappings: Vec<MappingSpec>, queue: bool) {
        if let Ok(mut loader) = self.loader.try_lock()
            && loader.knows_all(&mappings)
        {
            load(&mut loader, &self.stats, pid, &mappings);
            return;
        }
        if queue && let Some(tx) = &self.tx {
            let _ = tx.send(Job::Load(pid, mappings));
        }
    }

    /// The collector's hook (`Collection::on_new_process`).
    pub fn hook(self: &Arc<Self>) -> crate::collect::NewProcessHook {
        let me = Arc::clone(self);
        Box::new(move |event| me.submit(event))
    }

    /// What was loaded so far.
    pub fn stats(&self) -> LoaderStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }
}

impl Drop for BackgroundLoader {
    /// Abandons what is still queued. The thread is not joined: it may be in the middle of
    /// a large binary, and it ends by itself after that one.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.tx = None;
    }
}
