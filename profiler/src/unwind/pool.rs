//! The threads that compile unwind tables for the `background` loader: a binary's table
//! takes from milliseconds (a small program, libc) to many seconds (librustc_driver's 6 MiB
//! of .eh_frame), and one thread compiling them in turn made every new process wait behind
//! the biggest. Here a few threads take binaries from two lanes: files under
//! `SMALL_BYTES` and the rest. Thread 0 takes small ones only, so a huge binary never holds
//! up a small program's tables; the others take large ones first, then small ones. Each
//! binary (by device and inode) is queued once however many processes map it; what a thread
//! compiles goes back to the loader through `done`, which loads the processes waiting for it.
use std::{
    collections::{HashMap, HashSet, VecDeque},
    fs::File,
    path::{Path, PathBuf},
    sync::{Arc, Condvar, Mutex},
};

use crate::process::MappingSpec;

use super::{
    cache::TableCache,
    files::{BinaryKey, memmap},
    table::TableError,
};

/// Threads by default: one for each lane.
pub(crate) const DEFAULT_THREADS: usize = 2;

/// Files below this size go to the small lane (libc is 2 MiB, python3.11 7 MiB, rustc's
/// librustc_driver 150 MiB).
pub(crate) const SMALL_BYTES: u64 = 8 << 20;

/// Binaries queued in each lane at most: beyond, `submit` refuses and the loader asks again
/// when the next table is done (the process waits, walked by frame pointer).
const MAX_QUEUED: usize = 512;

/// What `CompilePool::submit` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Submitted {
    /// Queued now or before: its result comes to `done`.
    Queued,
    /// Its lane is full: ask again later.
    Full,
    /// The file cannot be opened: no result will come.
    Unreadable,
}

/// Called on a compile thread with each binary's result.
pub(crate) type Done = Box<dyn Fn(BinaryKey, Compiled) + Send + Sync>;

struct Task {
    key: BinaryKey,
    file: File,
    path: PathBuf,
}

#[derive(Default)]
struct Lanes {
    small: VecDeque<Task>,
    large: VecDeque<Task>,
    /// Binaries queued, being compiled, or compiled and not yet taken by the loader
    /// (`finished`): asked for again, they are not compiled twice.
    busy: HashSet<BinaryKey>,
    stop: bool,
}

struct Shared {
    lanes: Mutex<Lanes>,
    wake: Condvar,
}

pub(crate) struct CompilePool {
    shared: Arc<Shared>,
}

impl CompilePool {
    /// Starts `threads` compile threads (at least one), reading and writing `cache`.
    pub(crate) fn spawn(
        threads: usize,
        cache: Option<TableCache>,
        done: Done,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            lanes: Mutex::new(Lanes::default()),
            wake: Condvar::new(),
        });
        let done = Arc::new(done);
        for index in 0..threads.max(1) {
            let (shared, cache, done) = (Arc::clone(&shared), cache.clone(), Arc::clone(&done));
            // With one thread it takes both lanes, small first.
            let small_only = index == 0 && threads > 1;
            std::thread::Builder::new()
                .name(format!("unwind-compile-{index}"))
                .spawn(move || {
                    while let Some(task) = next(&shared, small_only, index > 0) {
                        let compiled = compile(&task, cache.as_ref());
                        done(task.key, compiled);
                    }
                })?;
        }
        Ok(Self { shared })
    }

    /// Queues the table of `m`'s binary `key` unless it is queued already.
    pub(crate) fn submit(&self, key: BinaryKey, m: &MappingSpec) -> Submitted {
        let Ok(mut lanes) = self.shared.lanes.lock() else {
            return Submitted::Full;
        };
        if lanes.busy.contains(&key) {
            return Submitted::Queued;
        }
        let Some(file) = m.open() else {
            return Submitted::Unreadable;
        };
        let len = file.metadata().map_or(0, |meta| meta.len());
        let lane = if len < SMALL_BYTES {
            &mut lanes.small
        } else {
            &mut lanes.large
        };
        if lane.len() >= MAX_QUEUED {
            return Submitted::Full;
        }
        lane.push_back(Task {
            key,
            file,
            path: m.path.clone(),
        });
        lanes.busy.insert(key);
        self.shared.wake.notify_all();
        Submitted::Queued
    }

    /// The loader took binary `key`'s result: asked for again (an evicted table, say), it
    /// is compiled again.
    pub(crate) fn finished(&self, key: BinaryKey) {
        if let Ok(mut lanes) = self.shared.lanes.lock() {
            lanes.busy.remove(&key);
        }
    }
}

impl Drop for CompilePool {
    /// Abandons what is queued; a thread in the middle of a binary ends after it.
    fn drop(&mut self) {
        if let Ok(mut lanes) = self.shared.lanes.lock() {
            lanes.stop = true;
            lanes.small.clear();
            lanes.large.clear();
        }
        self.shared.wake.notify_all();
    }
}

/// The next task of a thread (None: the pool stopped): from the small lane only, or from
/// both with the large one first (`large_first`) or last.
fn next(shared: &Shared, small_only: bool, large_first: bool) -> Option<Task> {
    let mut lanes = shared.lanes.lock().ok()?;
    loop {
        if lanes.stop {
            return None;
        }
        let task = if small_only {
            lanes.small.pop_front()
        } else if large_first {
            lanes.large.pop_front().or_else(|| lanes.small.pop_front())
        } else {
            lanes.small.pop_front().or_else(|| lanes.large.pop_front())
        };
        if task.is_some() {
            return task;
        }
        lanes = shared.wake.wait(lanes).ok()?;
    }
}

/// A binary's table as compiled (or read from the disk cache), before it is loaded.
#[derive(Debug)]
pub struct Compiled {
    pub table: Result<super::table::Table, TableError>,
    /// Read from the disk cache rather than compiled.
    pub cache_hit: bool,
    /// Time taken, ns.
    pub ns: u64,
}

impl Compiled {
    /// Compiles the table of ELF image `data` (read from `path`), or reads it from `cache`
    /// (and keeps what it compiles there). A binary whose .eh_frame covers little has its
    /// .debug_frame read too, from a separate debug file (by build id or .gnu_debuglink)
    /// when it has none itself; a cached table made without that file is compiled again
    /// once the file is there.
    pub fn new(
        path: &Path,
        image: &impl super::table::Image,
        cache: Option<&super::cache::TableCache>,
    ) -> Self {
        let data: &[u8] = image;
        let started = std::time::Instant::now();
        let build_id = || {
            use object::Object as _;
            let elf = object::File::parse(data).ok()?;
            elf.build_id().ok().flatten().map(<[u8]>::to_vec)
        };
        let debug_file = |id: Option<&[u8]>| crate::process::find_debug_file(path, path, id);
        // A table compiled while the debug file it wanted was missing is kept under its own
        // key, and used only while that file is still missing: installed since (by build id
        // or .gnu_debuglink), the table is compiled again with it.
        let cache_key = cache.map(|_| super::cache::key(image));
        // One compile of a binary at a time: a thread that wants it meanwhile waits, then
        // reads it from the cache (`TableCache::compiling`).
        let _turn = cache.zip(cache_key.as_deref()).map(|(c, k)| c.compiling(k));
        let without_debug = cache_key.as_ref().map(|k| format!("{k}-nodebug"));
        let cached = cache
            .zip(cache_key.as_deref())
            .and_then(|(c, k)| c.get(k))
            .or_else(|| {
                let t = cache
                    .zip(without_debug.as_deref())
                    .and_then(|(c, k)| c.get(k))?;
                debug_file(build_id().as_deref()).is_none().then_some(t)
            });
        let cache_hit = cached.is_some();
        let table = match cached {
            Some(t) => Ok(t),
            None => {
                let mut debug_missing = false;
                let compiled = super::table::compile_with_debug(image, |elf| {
                    use object::Object as _;
                    let id = elf.build_id().ok().flatten();
                    let found = debug_file(id).and_then(|debug| {
                        // SAFETY: a read-only view, as for the binary itself (`mapping`).
                        unsafe { memmap(&debug) }
                    });
                    debug_missing = found.is_none();
                    found
                });
                let key = if debug_missing {
                    without_debug.as_ref()
                } else {
                    cache_key.as_ref()
                };
                if let (Some(c), Some(k), Ok(t)) = (cache, key, &compiled) {
                    c.put(k, t);
                }
                compiled
            }
        };
        Self {
            table,
            cache_hit,
            ns: started.elapsed().as_nanos() as u64,
        }
    }
}

fn compile(task: &Task, cache: Option<&TableCache>) -> Compiled {
    // SAFETY: a read-only view; see `Loader::mapping` for a file changed under us.
    let Some(data) = (unsafe { memmap(&task.file) }) else {
        return Compiled {
            table: Err(TableError::Unreadable),
            cache_hit: false,
            ns: 0,
        };
    };
    let compiled = Compiled::new(&task.path, &data, cache);
    log::debug!(
        "{}: unwind table {} in {} ms",
        task.path.display(),
        if compiled.cache_hit {
            "read from the cache"
        } else {
            "compiled"
        },
        compiled.ns / 1_000_000
    );
    compiled
}

/// Tables compiled by the pool and not taken yet by a process, bounded: a table waits here
/// until a process that maps its binary is loaded, and one whose processes all exited first
/// would wait for ever. Any user can run many distinct binaries briefly, so without a bound
/// this held the tables of every binary ever seen. Beyond `max_rows` rows (the row array's
/// capacity: more could never be loaded at once) or `max_tables` tables, the oldest go; a
/// process that still wants one has it compiled again.
pub(crate) struct Ready {
    tables: HashMap<BinaryKey, Compiled>,
    /// Keys oldest first; may hold keys taken since (skipped when met).
    order: VecDeque<BinaryKey>,
    rows: u64,
    max_rows: u64,
    max_tables: usize,
}

impl Ready {
    pub(crate) fn new(max_rows: u64, max_tables: usize) -> Self {
        Self {
            tables: HashMap::new(),
            order: VecDeque::new(),
            rows: 0,
            max_rows,
            max_tables,
        }
    }

    fn rows_of(c: &Compiled) -> u64 {
        c.table.as_ref().map_or(0, |t| t.rows.len() as u64)
    }

    pub(crate) fn insert(&mut self, key: BinaryKey, compiled: Compiled) {
        self.rows += Self::rows_of(&compiled);
        if let Some(old) = self.tables.insert(key, compiled) {
            self.rows -= Self::rows_of(&old);
        }
        self.order.push_back(key);
        while self.rows > self.max_rows || self.tables.len() > self.max_tables {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            // A key queued twice (taken and handed over again) is dropped at its first
            // entry: early, never wrongly (it is compiled again if wanted).
            self.take(oldest);
        }
        if self.order.len() > 2 * self.max_tables.max(1) {
            let tables = &self.tables;
            self.order.retain(|k| tables.contains_key(k));
        }
    }

    pub(crate) fn take(&mut self, key: BinaryKey) -> Option<Compiled> {
        let c = self.tables.remove(&key)?;
        self.rows -= Self::rows_of(&c);
        Some(c)
    }

    pub(crate) fn contains(&self, key: BinaryKey) -> bool {
        self.tables.contains_key(&key)
    }

    /// Rows held.
    #[cfg(test)]
    pub(crate) fn rows(&self) -> u64 {
        self.rows
    }
}

#[cfg(test)]
mod ready_tests {
    use super::*;
    use crate::unwind::table::Table;

    fn compiled(rows: usize) -> Compiled {
        Compiled {
            table: Ok(Table {
                rows: vec![profiler_common::unwind::UnwindRow::default(); rows],
                fdes: 0,
                rbp_fdes: 0,
                padding: Vec::new(),
            }),
            cache_hit: false,
            ns: 0,
        }
    }

    #[test]
    fn oldest_tables_go_beyond_the_row_bound() {
        let mut r = Ready::new(100, 10);
        r.insert((1, 1), compiled(60));
        r.insert((1, 2), compiled(30));
        assert_eq!(r.rows(), 90);
        r.insert((1, 3), compiled(20)); // 110 rows: the oldest goes
        assert!(!r.contains((1, 1)) && r.contains((1, 2)) && r.contains((1, 3)));
        assert_eq!(r.rows(), 50);
        assert!(r.take((1, 2)).is_some());
        assert_eq!(r.rows(), 20);
        assert!(r.take((1, 2)).is_none());
    }

    #[test]
    fn tables_without_rows_are_bounded_by_count() {
        let mut r = Ready::new(u64::MAX, 3);
        for i in 0..1000 {
            r.insert((2, i), compiled(0));
        }
        assert_eq!(r.tables.len(), 3);
        assert!(r.order.len() <= 6, "{}", r.order.len());
        assert!(r.contains((2, 999)) && !r.contains((2, 0)));
    }
}

#[cfg(test)]
mod compile_once_tests {
    use super::*;

    /// Two threads wanting libc's table at once (the loader's pool and the stack-copy thread
    /// at a recording's start): one compiles it, the other reads it from the cache.
    #[test]
    fn a_binary_wanted_by_two_threads_at_once_is_compiled_once() {
        let dir = tempfile::Builder::new()
            .prefix("unw-once-")
            .tempdir()
            .unwrap();
        let cache = TableCache::open(dir.path(), 64 << 20).unwrap();
        let path = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        let data = std::fs::read(path).expect("Debian's libc");
        let start = std::sync::Barrier::new(2);
        let hits: Vec<bool> = std::thread::scope(|s| {
            let both: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        start.wait();
                        let c = Compiled::new(path, &data, Some(&cache));
                        assert!(c.table.is_ok(), "{:?}", c.table.as_ref().err());
                        c.cache_hit
                    })
                })
                .collect();
            both.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert_eq!(
            hits.iter().filter(|hit| !**hit).count(),
            1,
            "compiled by both threads: {hits:?}"
        );
    }
}
