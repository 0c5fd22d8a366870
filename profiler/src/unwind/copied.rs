//! Whole stacks for samples taken before a process's tables were in the kernel: the sampler
//! copies the registers and the top of the user stack into such a record
//! (`flags::STACK_COPY`, profiler-ebpf `unwind::copy_stack`), and the collector walks the
//! copy here with the same compiled rows and the same rules as the kernel walk
//! (profiler-ebpf `unwind::step`), from the mappings the kernel's records gave it.
use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

use profiler_common::unwind::{COPY_HEADER_BYTES, MAX_FRAMES, StackCopy, UnwindRow, kind, reason};

use crate::process::MappingSpec;

use super::{
    TablePolicy, UnwindMode,
    cache::TableCache,
    files::{BinaryKey, memmap},
    pool::Compiled,
    table,
};

/// A record's stack copy: the registers and the bytes from `regs.sp` up.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Copy<'a> {
    pub regs: StackCopy,
    pub stack: &'a [u8],
}

impl<'a> Copy<'a> {
    /// Reads the copy at the end of a record (what follows its last frame); None when it is
    /// cut short (never trusted: the length is checked against what is there).
    pub(crate) fn parse(trailer: &'a [u8]) -> Option<Self> {
        let word = |i: usize| {
            let b = trailer.get(i * 8..i * 8 + 8)?;
            Some(u64::from_ne_bytes(b.try_into().ok()?))
        };
        let regs = StackCopy {
            ip: word(0)?,
            sp: word(1)?,
            bp: word(2)?,
            len: word(3)?,
        };
        let len = usize::try_from(regs.len).ok()?;
        let stack = trailer.get(COPY_HEADER_BYTES..COPY_HEADER_BYTES.checked_add(len)?)?;
        Some(Self { regs, stack })
    }

    /// The u64 at user address `at`, if the copy holds it.
    fn read(&self, at: u64) -> Option<u64> {
        let off = usize::try_from(at.checked_sub(self.regs.sp)?).ok()?;
        let b = self.stack.get(off..off.checked_add(8)?)?;
        Some(u64::from_ne_bytes(b.try_into().ok()?))
    }
}

/// One binary as the walk sees it: by frame pointer (with its STOP rows, Go's thread
/// entries) or by its rows.
#[derive(Debug, Default)]
pub(crate) struct Rows {
    pub by_frame_pointer: bool,
    pub rows: Vec<UnwindRow>,
}

impl Rows {
    fn lookup(&self, pc: u64) -> Option<UnwindRow> {
        let pc = u32::try_from(pc).ok()?;
        let i = self.rows.partition_point(|r| r.pc <= pc);
        i.checked_sub(1).map(|i| self.rows[i])
    }
}

/// One executable mapping of the process: [start, end), bias (address - file vaddr).
#[derive(Clone, Debug)]
pub(crate) struct Mapped {
    pub start: u64,
    pub end: u64,
    pub bias: u64,
    pub rows: Arc<Rows>,
}

/// Walks `copy` over the process's `maps` (sorted or not): the frames (leaf first, return
/// addresses as the kernel walk writes them) and why it stopped (`reason::NONE` at the entry).
/// Every rule is the kernel walk's; a read outside the copy is a read fault, as a read of
/// unmapped memory is there.
pub(crate) fn walk(maps: &[Mapped], copy: &Copy<'_>) -> (Vec<u64>, u32) {
    let (mut ip, mut sp, mut bp) = (copy.regs.ip, copy.regs.sp, copy.regs.bp);
    let mut frames = Vec::new();
    let mut exact = false;
    for index in 0..MAX_FRAMES {
        frames.push(ip);
        let pc = if index == 0 || exact {
            ip
        } else {
            ip.wrapping_sub(1)
        };
        exact = false;
        let found = maps.iter().find(|m| m.start <= pc && pc < m.end);
        let (cfa, saved_bp) = match found {
            Some(m) if !m.rows.by_frame_pointer => {
                let Some(row) = m.rows.lookup(pc.wrapping_sub(m.bias)) else {
                    return (frames, reason::NO_ROW);
                };
                if row.kind == kind::SIGNAL {
                    let saved_sp = sp.wrapping_add(u64::from(row.cfa_off));
                    let saved_bp = saved_sp.wrapping_add((i64::from(row.rbp_off) * 8) as u64);
                    let (Some(s), Some(i), Some(b)) = (
                        copy.read(saved_sp),
                        copy.read(saved_sp.wrapping_add(8)),
                        copy.read(saved_bp),
                    ) else {
                        return (frames, reason::READ_FAULT);
                    };
                    if i == 0 {
                        return (frames, reason::NONE);
                    }
                    (ip, sp, bp, exact) = (i, s, b, true);
                    continue;
                }
                let cfa = match row.kind {
                    kind::CFA_RSP => sp.wrapping_add(u64::from(row.cfa_off)),
                    kind::CFA_RBP => bp.wrapping_add(u64::from(row.cfa_off)),
                    kind::PLT => sp.wrapping_add(if pc & 15 >= u64::from(row.cfa_off) {
                        16
                    } else {
                        8
                    }),
                    kind::STOP => return (frames, reason::NONE),
                    kind::UNSUPPORTED => return (frames, reason::UNSUPPORTED),
                    _ => return (frames, reason::NO_ROW),
                };
                let saved = if row.rbp_off == 0 {
                    0
                } else {
                    cfa.wrapping_add((i64::from(row.rbp_off) * 8) as u64)
                };
                (cfa, saved)
            }
            _ => {
                if let Some(m) = found
                    && m.rows
                        .lookup(pc.wrapping_sub(m.bias))
                        .is_some_and(|r| r.kind == kind::STOP)
                {
                    return (frames, reason::NONE);
                }
                if bp == 0 {
                    let why = if found.is_none() {
                        reason::NO_MAPPING
                    } else {
                        reason::NONE
                    };
                    return (frames, why);
                }
                if bp.wrapping_add(16) <= sp {
                    return (frames, reason::NO_MAPPING);
                }
                (bp.wrapping_add(16), bp)
            }
        };
        let Some(ra) = copy.read(cfa.wrapping_sub(8)) else {
            return (frames, reason::READ_FAULT);
        };
        if saved_bp != 0 {
            match copy.read(saved_bp) {
                Some(b) => bp = b,
                None => return (frames, reason::READ_FAULT),
            }
        }
        if ra == 0 {
            return (frames, reason::NONE);
        }
        if cfa <= sp {
            return (frames, reason::UNSUPPORTED);
        }
        (ip, sp) = (ra, cfa);
    }
    (frames, reason::FRAME_LIMIT)
}

/// Rows kept in memory for copies at most (64 MiB); beyond, further binaries get none (walks
/// of copies stop at them).
const MAX_ROWS: usize = 8 << 20;

/// Records waiting for their tables at most (bytes): beyond, a record is walked at once with
/// the tables there are (its frame-pointer stack kept when that walk does worse).
const MAX_DEFERRED_BYTES: usize = 32 << 20;

/// How long /proc's mappings of a process from before the recording (the kernel's records
/// do not hold its whole space) serve the walks of its copies. Read for every copied sample,
/// they were a read of /proc/PID/maps per sample, and a stat of each of its files at each
/// check of the records waiting for tables, all on the thread that drains the ring buffer:
/// at a recording's start, when every running process is copied, it fell behind.
const PROC_MAPS_FOR: Duration = Duration::from_secs(1);

/// Tables no walk used for this long are dropped (a copy that needs one again asks for it
/// anew: a read of the disk cache). A process's copies stop once the kernel has its tables,
/// so most tables here idle a few seconds after their program started, and the agent runs
/// for months: they held megabytes of its RSS.
const IDLE_TABLE: Duration = Duration::from_secs(60);

/// Processes whose /proc mappings are kept at most (beyond, all are read again).
const MAX_PROC_MAPS: usize = 4096;

/// A record kept for its tables: the record, its process's mappings, and the one binary its
/// walk stopped in (`TablePolicy::Reached`; None: it waits for every binary of the process).
type Deferred = (Vec<u8>, Arc<Vec<MappingSpec>>, Option<BinaryKey>);

/// Tables compiled for copies, by binary (None: no table can be made for it).
type Tables = Arc<Mutex<HashMap<BinaryKey, Option<Arc<Rows>>>>>;

/// What to do with a record that carries a stack copy (`CopyUnwinder::offer`).
pub(crate) enum Offer {
    /// Walked: the frames and why the walk stopped.
    Walked(Vec<u64>, u32),
    /// Kept until the tables it needs are compiled (`CopyUnwinder::take_ready`).
    Deferred,
}

/// The collector's side of stack copies. The tables the copies go through are compiled (or
/// read from the disk cache) once each on a thread of its own, beside the kernel loader's
/// pool (which builds the same ones for the kernel: a copy is only made until that is done,
/// for a process's first samples), so the reader that drains the ring buffer never waits
/// for a compile: a record whose tables are not ready yet is kept and added when they are.
pub(crate) struct CopyUnwinder {
    tables: Tables,
    /// Binaries sent to the compile thread.
    asked: std::collections::HashSet<BinaryKey>,
    /// When a walk last used each binary's table (`sweep`).
    used: HashMap<BinaryKey, Instant>,
    /// When `sweep` last ran.
    swept: Instant,
    tx: Option<mpsc::Sender<(BinaryKey, MappingSpec)>>,
    /// Tells the compile thread to stop at its next table (it is not waited for: its queue
    /// may hold every binary of a host's processes).
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// `table::mapping_bias` at address 0, by binary and file offset.
    bias_at_zero: HashMap<(BinaryKey, u64), Option<u64>>,
    /// Records waiting for tables, oldest first, with their process's mappings and the
    /// binary they wait for (`TablePolicy::Reached`; None: all of the process's).
    deferred: VecDeque<Deferred>,
    policy: TablePolicy,
    /// /proc's mappings of processes from before the recording, by pid, and when read
    /// (`PROC_MAPS_FOR`).
    proc_maps: HashMap<u32, (Instant, Arc<Vec<MappingSpec>>)>,
    /// The mappings a record handed back by `take_ready` was kept with (`retake`): its
    /// process may have exited since.
    retaken: Option<Arc<Vec<MappingSpec>>>,
    deferred_bytes: usize,
    /// Set while `take_ready` hands out records that will not wait again.
    forcing: bool,
}

impl CopyUnwinder {
    pub(crate) fn new(
        mode: UnwindMode,
        policy: TablePolicy,
        cache: Option<TableCache>,
    ) -> std::io::Result<Self> {
        let tables: Tables = Arc::default();
        let (tx, rx) = mpsc::channel::<(BinaryKey, MappingSpec)>();
        let out = Arc::clone(&tables);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("unwind-copies".into())
            .spawn(move || {
                while let Ok((key, m)) = rx.recv() {
                    if stopped.load(std::sync::atomic::Ordering::Relaxed) {
                        return;
                    }
                    if out.lock().is_ok_and(|t| t.contains_key(&key)) {
                        continue;
                    }
                    let rows = rows_of(mode, &m, cache.as_ref()).map(Arc::new);
                    if let Ok(mut t) = out.lock() {
                        let held: usize = t.values().flatten().map(|r| r.rows.len()).sum();
                        // Beyond the bound a binary gets no table here: copies stop there.
                        let fits = held + rows.as_ref().map_or(0, |r| r.rows.len()) <= MAX_ROWS;
                        t.insert(key, rows.filter(|_| fits));
                    }
                }
            })?;
        Ok(Self {
            tables,
            asked: std::collections::HashSet::new(),
            used: HashMap::new(),
            swept: Instant::now(),
            tx: Some(tx),
            stop,
            bias_at_zero: HashMap::new(),
            deferred: VecDeque::new(),
            proc_maps: HashMap::new(),
            retaken: None,
            deferred_bytes: 0,
            forcing: false,
            policy,
        })
    }

    /// Walks the copy in `record` (at `copy_at`) of process `pid` now when every binary of
    /// its mappings has its table (`TablePolicy::Reached`: every binary the walk reaches),
    /// else keeps the record for later (and has the missing tables compiled). `mappings`
    /// are the kernel records' when they hold its whole space; None reads /proc's
    /// (`PROC_MAPS_FOR`).
    pub(crate) fn offer(
        &mut self,
        record: &[u8],
        copy_at: usize,
        pid: u32,
        mappings: Option<Vec<MappingSpec>>,
    ) -> Offer {
        let Some(copy) = record.get(copy_at..).and_then(Copy::parse) else {
            return Offer::Walked(Vec::new(), reason::READ_FAULT);
        };
        let mappings = match self.retaken.take() {
            Some(kept) => Some(kept),
            None => self.mappings_of(pid, mappings),
        };
        let Some(mappings) = mappings else {
            return Offer::Walked(Vec::new(), reason::NOT_LOADED);
        };
        let room = !self.forcing && self.deferred_bytes + record.len() <= MAX_DEFERRED_BYTES;
        let policy = self.policy;
        let waits_for = match policy {
            TablePolicy::All => (room && !self.ready(&mappings)).then_some(None),
            TablePolicy::Reached => {
                let (frames, why) = self.unwind(&mappings, &copy);
                match self.missing_in(&mappings, &frames).filter(|_| room) {
                    Some(key) => Some(Some(key)),
                    None => return Offer::Walked(frames, why),
                }
            }
        };
        if let Some(key) = waits_for {
            self.deferred_bytes += record.len();
            self.deferred.push_back((record.to_vec(), mappings, key));
            return Offer::Deferred;
        }
        let (frames, why) = self.unwind(&mappings, &copy);
        Offer::Walked(frames, why)
    }

    /// The binary without a table here (not even a failed one) that the walk's last frame is
    /// in; it is asked for. The walk ends in such a binary: it cannot go through one.
    fn missing_in(&mut self, mappings: &[MappingSpec], frames: &[u64]) -> Option<BinaryKey> {
        let last = frames.len().checked_sub(1)?;
        // A return address is looked up at the call (address - 1), as the walk does.
        let pc = frames[last].wrapping_sub(u64::from(last != 0));
        let m = mappings.iter().find(|m| m.start <= pc && pc < m.end)?;
        let key = m.key()?;
        if self.tables.lock().ok()?.contains_key(&key) {
            return None;
        }
        if self.asked.insert(key)
            && let Some(tx) = &self.tx
        {
            let _ = tx.send((key, m.clone()));
        }
        Some(key)
    }

    /// `given`, or /proc's mappings of `pid` (read again once `PROC_MAPS_FOR` old), each
    /// file's identity read once.
    fn mappings_of(
        &mut self,
        pid: u32,
        given: Option<Vec<MappingSpec>>,
    ) -> Option<Arc<Vec<MappingSpec>>> {
        if let Some(m) = given {
            return Some(Arc::new(m));
        }
        let now = Instant::now();
        if let Some((at, maps)) = self.proc_maps.get(&pid)
            && now.duration_since(*at) < PROC_MAPS_FOR
        {
            return Some(Arc::clone(maps));
        }
        let mut maps = super::proc_mappings(pid).ok()?;
        for m in &mut maps {
            m.key = m.key();
        }
        if self.proc_maps.len() >= MAX_PROC_MAPS {
            self.proc_maps.clear();
        }
        let maps = Arc::new(maps);
        self.proc_maps.insert(pid, (now, Arc::clone(&maps)));
        Some(maps)
    }

    /// Whether every binary of `mappings` has its table here; asks for those missing.
    fn ready(&mut self, mappings: &[MappingSpec]) -> bool {
        let Ok(tables) = self.tables.lock() else {
            return true;
        };
        let mut ready = true;
        for m in mappings {
            let Some(key) = m.key() else { continue };
            if tables.contains_key(&key) {
                continue;
            }
            ready = false;
            // Asked once: it is being compiled.
            if self.asked.insert(key)
                && let Some(tx) = &self.tx
            {
                let _ = tx.send((key, m.clone()));
            }
        }
        ready
    }

    /// Records kept by `offer` whose tables are ready now (all of them when `force`), oldest
    /// first, with the mappings they were kept with, to be offered again (`retake` first):
    /// they are walked then, kept again only when not `force` and the walk reaches another
    /// binary without its table (`TablePolicy::Reached`: one more binary a turn).
    pub(crate) fn take_ready(&mut self, force: bool) -> Vec<(Vec<u8>, Arc<Vec<MappingSpec>>)> {
        self.sweep(Instant::now());
        let mut out = Vec::new();
        let mut keep = VecDeque::new();
        while let Some((record, mappings, key)) = self.deferred.pop_front() {
            let ready = match key {
                Some(key) => self.tables.lock().map_or(true, |t| t.contains_key(&key)),
                None => self.ready(&mappings),
            };
            if force || ready {
                self.deferred_bytes -= record.len();
                out.push((record, mappings));
            } else {
                keep.push_back((record, mappings, key));
            }
        }
        self.deferred = keep;
        self.forcing = force && !out.is_empty();
        out
    }

    /// Drops the tables no walk used for `IDLE_TABLE` and no kept record waits for (at most
    /// every `IDLE_TABLE`).
    fn sweep(&mut self, now: Instant) {
        if now.duration_since(self.swept) < IDLE_TABLE {
            return;
        }
        self.swept = now;
        let mut waited = std::collections::HashSet::new();
        for (_, maps, key) in &self.deferred {
            match key {
                Some(k) => {
                    waited.insert(*k);
                }
                None => waited.extend(maps.iter().filter_map(MappingSpec::key)),
            }
        }
        let tables = Arc::clone(&self.tables);
        let Ok(mut tables) = tables.lock() else {
            return;
        };
        let (used, asked) = (&mut self.used, &mut self.asked);
        tables.retain(|key, _| {
            let keep = waited.contains(key)
                || used
                    .get(key)
                    .is_some_and(|at| now.duration_since(*at) < IDLE_TABLE);
            if !keep {
                asked.remove(key);
                used.remove(key);
            }
            keep
        });
    }

    /// The next record offered is one `take_ready` handed back, kept with `mappings`.
    pub(crate) fn retake(&mut self, mappings: Arc<Vec<MappingSpec>>) {
        self.retaken = Some(mappings);
    }

    /// Ends a `take_ready` hand-out.
    pub(crate) fn done_forcing(&mut self) {
        self.forcing = false;
        self.retaken = None;
    }

    /// Whether records wait for tables still being compiled.
    pub(crate) fn waiting(&self) -> bool {
        let Ok(tables) = self.tables.lock() else {
            return false;
        };
        // Every missing table was asked for when its record was kept.
        self.deferred.iter().any(|(_, maps, key)| match key {
            Some(key) => !tables.contains_key(key),
            None => maps
                .iter()
                .any(|m| m.key().is_some_and(|k| !tables.contains_key(&k))),
        })
    }

    /// Walks `copy` over the process's `mappings` with the tables there are.
    pub(crate) fn unwind(&mut self, mappings: &[MappingSpec], copy: &Copy<'_>) -> (Vec<u64>, u32) {
        let maps: Vec<Mapped> = mappings.iter().filter_map(|m| self.mapped(m)).collect();
        walk(&maps, copy)
    }

    fn mapped(&mut self, m: &MappingSpec) -> Option<Mapped> {
        let key = m.key()?;
        // Not compiled yet (a walk `take_ready` forced): this binary is left out, the walk
        // stops there (the collector keeps the frame-pointer stack if it went further).
        let rows = self.tables.lock().ok()?.get(&key).cloned()??;
        self.used.insert(key, Instant::now());
        let at_zero = match self.bias_at_zero.get(&(key, m.file_offset)) {
            Some(b) => (*b)?,
            None => {
                let file = m.open()?;
                // SAFETY: a read-only view, as the loader's (see `Loader::mapping`).
                let data = unsafe { memmap(&file)? };
                let b = table::mapping_bias(&data, 0, m.file_offset);
                self.bias_at_zero.insert((key, m.file_offset), b);
                b?
            }
        };
        Some(Mapped {
            start: m.start,
            end: m.end,
            bias: m.start.wrapping_add(at_zero),
            rows,
        })
    }
}

impl Drop for CopyUnwinder {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.tx = None;
    }
}

/// The binary's rows as the loader would put them in the kernel (`Loader::load_binary`).
fn rows_of(mode: UnwindMode, m: &MappingSpec, cache: Option<&TableCache>) -> Option<Rows> {
    let file = m.open()?;
    // SAFETY: a read-only view, as the loader's (see `Loader::mapping`).
    let data = unsafe { memmap(&file)? };
    object::File::parse(&*data).ok()?;
    let table = Compiled::new(&m.path, &data, cache).table.ok()?;
    let by_frame_pointer =
        table.rows.is_empty() || (mode == UnwindMode::Auto && table.keeps_frame_pointers());
    Some(Rows {
        by_frame_pointer,
        rows: if by_frame_pointer {
            table::go_stops(&data)
        } else {
            table.rows
        },
    })
}

#[cfg(test)]
mod tests;
