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

use super::{Loader, LoaderStats, MappingSpec, proc_mappings};

pub struct BackgroundLoader {
    tx: Option<mpsc::Sender<(u32, Vec<MappingSpec>)>>,
    loader: Arc<Mutex<Loader>>,
    /// A copy of the loader's stats, readable while the thread holds the loader.
    stats: Arc<Mutex<LoaderStats>>,
    stop: Arc<AtomicBool>,
    /// When each pid's mappings were last read: a process is read again at most every
    /// RELOAD_INTERVAL (its walks may keep leaving the mappings, e.g. in JIT code).
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
        let (tx, rx) = mpsc::channel::<(u32, Vec<MappingSpec>)>();
        let stats = Arc::new(Mutex::new(loader.stats));
        let loader = Arc::new(Mutex::new(loader));
        let stop = Arc::new(AtomicBool::new(false));
        let (thread_loader, thread_stats, thread_stop) =
            (Arc::clone(&loader), Arc::clone(&stats), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("unwind-loader".into())
            .spawn(move || {
                while let Ok((pid, mappings)) = rx.recv() {
                    if thread_stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(mut loader) = thread_loader.lock() else {
                        break;
                    };
                    load(&mut loader, &thread_stats, pid, &mappings);
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

    /// Reads `pid`'s mappings now (unless read within RELOAD_INTERVAL); loads them at once when their binaries are all loaded
    /// already and the thread is idle, else queues them. A process already gone is skipped
    /// (its samples stay walked by frame pointer).
    pub fn submit(&self, pid: u32) {
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
        let Ok(mappings) = proc_mappings(pid) else {
            return;
        };
        if let Ok(mut loader) = self.loader.try_lock()
            && loader.knows_all(&mappings)
        {
            load(&mut loader, &self.stats, pid, &mappings);
            return;
        }
        if let Some(tx) = &self.tx {
            let _ = tx.send((pid, mappings));
        }
    }

    /// A sender for the collector's new-process hook.
    pub fn hook(self: &Arc<Self>) -> crate::collect::NewProcessHook {
        let me = Arc::clone(self);
        Box::new(move |pid| me.submit(pid))
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
