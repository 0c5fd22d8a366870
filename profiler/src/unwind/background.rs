//! Runs the `Loader` on a thread of its own, and the table compiles on a small `pool`:
//! compiling a large binary's table takes from milliseconds to seconds, and the reader that
//! drains the ring buffer must never wait for it, nor a small program's tables for a huge
//! one's. The reader reads each new process's mappings at once (while the process still
//! lives) and loads them itself when every binary's table is already in (a few syscalls: a
//! new process of a known program is walked by table from its next samples); otherwise it
//! queues them for the thread, which asks the pool for the missing tables and loads the
//! process once the last of them is compiled. Until then, the kernel walks a process by
//! frame pointer.
use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

use crate::process::{MappingSpec, ProcessEvent};

use super::{
    Loader, LoaderStats, TablePolicy,
    loader::BinaryKey,
    pool::{self, CompilePool, Compiled, Submitted},
    proc_mappings,
};

/// Work for the loader thread, in the order the collector (or the pool) sent it.
enum Job {
    Load(u32, Vec<MappingSpec>),
    Forget(u32),
    Compiled(BinaryKey, Compiled),
    Stop,
}

pub(crate) struct BackgroundLoader {
    tx: Option<mpsc::Sender<Job>>,
    loader: Arc<Mutex<Loader>>,
    /// A copy of the loader's stats, readable while the thread holds the loader.
    stats: Arc<Mutex<LoaderStats>>,
    /// When each sampled pid's mappings were last read: a process is read again at most
    /// every RELOAD_INTERVAL (its walks may keep leaving the mappings, e.g. in JIT code).
    /// Its keys are the processes that were sampled and have not exited.
    last_read: Mutex<HashMap<u32, Instant>>,
    /// Pids handed to the loader that have not exited, each with whether a job for it went
    /// to the loader thread (true) or it was only loaded here: only their exits matter, and
    /// the exit of one never queued is done here too (no message and wake-up per exit).
    handed: Mutex<HashMap<u32, bool>>,
    /// `TablePolicy::Reached`: the binaries some process's walk reached so far, shared with
    /// the loader (`Loader::set_reached`); None under `TablePolicy::All`.
    reached: Option<Arc<Mutex<HashSet<BinaryKey>>>>,
}

/// Binaries remembered as reached at most; beyond, the set starts afresh (a binary still in
/// use is reached again by its next walks).
const MAX_REACHED: usize = 4096;

const RELOAD_INTERVAL: Duration = Duration::from_millis(50);

/// Processes waiting for tables at most; beyond, a new one is left to frame pointers until
/// the collector asks for it again (a walk that leaves its mappings).
const MAX_WAITING: usize = 4096;

/// Whether `path` is a C library, where every thread's stack starts (`__libc_start_main`,
/// `start_thread`). With the program itself (its lowest mapping: the executable is mapped
/// below the libraries), it is loaded at a process's first sample under `TablePolicy::Reached`:
/// a walk then needs no round of samples to learn them.
fn is_entry_binary(path: &std::path::Path) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
        n.starts_with("libc.so") || n.starts_with("libc-") || n.starts_with("ld-musl")
    })
}

/// Loads one process and mirrors the loader's stats.
fn load(loader: &mut Loader, stats: &Mutex<LoaderStats>, pid: u32, mappings: &[MappingSpec]) {
    if let Err(e) = loader.load_process(pid, mappings) {
        log::debug!(
            "pid {pid}: cannot load its mappings for unwinding: {}",
            crate::util::chain(&e)
        );
    }
    mirror(loader, stats);
}

fn mirror(loader: &Loader, stats: &Mutex<LoaderStats>) {
    if let Ok(mut s) = stats.lock() {
        *s = loader.stats;
    }
}

/// A process waiting for the tables of some of its binaries.
struct Waiting {
    /// Its latest mappings.
    mappings: Vec<MappingSpec>,
    /// The binaries whose tables it waits for (keys taken once, not a file stat per check).
    missing: HashSet<BinaryKey>,
    /// Whether the pool refused one of them (a full lane): asked again at each table done.
    refused: bool,
}

/// The loader thread's state: processes waiting for tables the pool compiles.
struct Thread {
    loader: Arc<Mutex<Loader>>,
    stats: Arc<Mutex<LoaderStats>>,
    pool: CompilePool,
    waiting: HashMap<u32, Waiting>,
}

impl Thread {
    /// Does `job`; false to stop.
    fn run(&mut self, job: Job) -> bool {
        let Ok(mut loader) = self.loader.lock() else {
            return false;
        };
        match job {
            Job::Load(pid, mappings) => {
                if loader.knows_all(&mappings) {
                    self.waiting.remove(&pid);
                    load(&mut loader, &self.stats, pid, &mappings);
                } else if self.waiting.len() < MAX_WAITING || self.waiting.contains_key(&pid) {
                    let (missing, refused) = request(&self.pool, &loader, &mappings);
                    // Its other binaries are walkable by table meanwhile; a walk that
                    // reaches one still compiling copies the stack (`unwind::copied`).
                    if let Err(e) = loader.load_process_pending(pid, &mappings, &missing) {
                        log::debug!("pid {pid}: cannot load its mappings: {e}");
                    }
                    mirror(&loader, &self.stats);
                    self.waiting.insert(
                        pid,
                        Waiting {
                            mappings,
                            missing,
                            refused,
                        },
                    );
                } else {
                    log::debug!("pid {pid}: {MAX_WAITING} processes wait for tables already");
                }
            }
            Job::Forget(pid) => {
                self.waiting.remove(&pid);
                loader.forget_process(pid);
                mirror(&loader, &self.stats);
            }
            Job::Compiled(key, compiled) => {
                loader.add_compiled(key, compiled);
                self.pool.finished(key);
                let mut done = Vec::new();
                let mut fewer = Vec::new();
                for (pid, w) in &mut self.waiting {
                    if w.missing.remove(&key) {
                        fewer.push(*pid);
                    }
                    if w.refused {
                        // Asked again: the lane may have room now.
                        (w.missing, w.refused) = request(&self.pool, &loader, &w.mappings);
                    }
                    if w.missing.is_empty() {
                        done.push(*pid);
                    }
                }
                for pid in done {
                    if let Some(w) = self.waiting.remove(&pid) {
                        load(&mut loader, &self.stats, pid, &w.mappings);
                    }
                }
                // Still waiting for others (a huge library): walked by this table already.
                for pid in fewer {
                    if let Some(w) = self.waiting.get(&pid) {
                        if let Err(e) = loader.load_process_pending(pid, &w.mappings, &w.missing) {
                            log::debug!("pid {pid}: cannot load its mappings: {e}");
                        }
                        mirror(&loader, &self.stats);
                    }
                }
            }
            Job::Stop => return false,
        }
        true
    }
}

/// Asks the pool for the tables `mappings` lack (each binary is queued once); returns
/// the binaries to wait for, and whether the pool refused one.
fn request(
    pool: &CompilePool,
    loader: &Loader,
    mappings: &[MappingSpec],
) -> (HashSet<BinaryKey>, bool) {
    let mut refused = false;
    let missing = loader
        .missing(mappings)
        .filter_map(|(key, m)| match pool.submit(key, m) {
            Submitted::Queued => Some(key),
            Submitted::Full => {
                log::debug!("{}: not queued for a table yet", m.path.display());
                refused = true;
                Some(key)
            }
            // Loading the process will leave it out.
            Submitted::Unreadable => None,
        })
        .collect();
    (missing, refused)
}

impl BackgroundLoader {
    /// Starts the loader thread and `pool::DEFAULT_THREADS` compile threads.
    pub(crate) fn spawn(mut loader: Loader, policy: TablePolicy) -> std::io::Result<Self> {
        let reached = (policy == TablePolicy::Reached).then(Arc::default);
        if let Some(r) = &reached {
            loader.set_reached(Arc::clone(r));
        }
        let (tx, rx) = mpsc::channel::<Job>();
        let stats = Arc::new(Mutex::new(loader.stats));
        let to_loader = Mutex::new(tx.clone());
        let pool = CompilePool::spawn(
            pool::DEFAULT_THREADS,
            loader.cache().cloned(),
            Box::new(move |key, compiled| {
                if let Ok(tx) = to_loader.lock() {
                    let _ = tx.send(Job::Compiled(key, compiled));
                }
            }),
        )?;
        let loader = Arc::new(Mutex::new(loader));
        let mut thread = Thread {
            loader: Arc::clone(&loader),
            stats: Arc::clone(&stats),
            pool,
            waiting: HashMap::new(),
        };
        std::thread::Builder::new()
            .name("unwind-loader".into())
            .spawn(move || while rx.recv().is_ok_and(|job| thread.run(job)) {})?;
        Ok(Self {
            tx: Some(tx),
            loader,
            stats,
            last_read: Mutex::new(HashMap::new()),
            handed: Mutex::new(HashMap::new()),
            reached,
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
    pub(crate) fn submit(&self, event: ProcessEvent) {
        match event {
            ProcessEvent::Sampled {
                pid,
                gone: true,
                mappings: Some(mappings),
                reached,
            } => {
                // Most short-lived processes sampled under churn: loading them cost a kernel
                // map update now and a removal at their exit, for no walk. Only tables to build.
                self.note_reached(&mappings, &reached);
                if !self.loader.try_lock().is_ok_and(|l| l.knows_all(&mappings)) {
                    self.load_or_queue(pid, mappings, true);
                }
            }
            ProcessEvent::Sampled {
                pid,
                gone: _,
                mappings,
                reached,
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
                self.note_reached(&mappings, &reached);
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
                self.note_reached(&mappings, &[]);
                self.load_or_queue(pid, mappings, sampled);
            }
            ProcessEvent::Exited { pid } => {
                if let Ok(mut last) = self.last_read.lock() {
                    last.remove(&pid);
                }
                // Only for processes handed to the loader, sampled or not (`Mapped`). One
                // with a job queued must be forgotten after it, by the thread.
                let queued = self
                    .handed
                    .lock()
                    .map_or(Some(true), |mut h| h.remove(&pid));
                match queued {
                    None => {}
                    Some(false) if let Ok(mut loader) = self.loader.try_lock() => {
                        loader.forget_process(pid);
                        mirror(&loader, &self.stats);
                    }
                    Some(_) => {
                        if let Some(tx) = &self.tx {
                            let _ = tx.send(Job::Forget(pid));
                        }
                    }
                }
            }
        }
    }

    /// `TablePolicy::Reached`: notes the binaries of `mappings` that `reached` (a sample's user
    /// addresses) lands in, and those every whole stack goes through (`is_entry_binary`), so
    /// that loading `mappings` compiles their tables (the loader leaves the others
    /// `mapping::UNREACHED` until a walk stops at one).
    fn note_reached(&self, mappings: &[MappingSpec], reached: &[u64]) {
        let Some(set) = &self.reached else {
            return;
        };
        let lowest = mappings.iter().map(|m| m.start).min();
        if let Ok(mut set) = set.lock() {
            if set.len() >= MAX_REACHED {
                set.clear();
            }
            for m in mappings {
                if (Some(m.start) == lowest
                    || is_entry_binary(&m.path)
                    || reached.iter().any(|&pc| m.start <= pc && pc < m.end))
                    && let Some(key) = m.key()
                {
                    set.insert(key);
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
            self.hand(pid, false);
            load(&mut loader, &self.stats, pid, &mappings);
            return;
        }
        if queue && let Some(tx) = &self.tx {
            self.hand(pid, true);
            let _ = tx.send(Job::Load(pid, mappings));
        }
    }

    /// Notes that `pid` went to the loader, before it does (`queued`: as a job to its
    /// thread): its exit must then reach it.
    fn hand(&self, pid: u32, queued: bool) {
        if let Ok(mut h) = self.handed.lock() {
            *h.entry(pid).or_default() |= queued;
        }
    }

    /// The loader's disk cache of tables, for the collector's walks of stack copies.
    pub(crate) fn cache(&self) -> Option<super::cache::TableCache> {
        self.loader.lock().ok()?.cache().cloned()
    }

    /// What was loaded so far.
    pub(crate) fn stats(&self) -> LoaderStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }
}

impl Drop for BackgroundLoader {
    /// Abandons what is still queued. The threads are not joined: a compile thread may be
    /// in the middle of a large binary, and it ends by itself after that one.
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Job::Stop);
        }
    }
}
