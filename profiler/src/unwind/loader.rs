//! Feeds the kernel's table walk: compiles each binary's table once (keyed by device and
//! inode, so every process mapping it shares one copy), copies the rows into the UNWIND_ROWS
//! array in the kernel's 4-byte form (`kernel_rows`; mapped as far as rows are used,
//! `rows_view`) and their rules into UNWIND_RULES, and writes each process's executable mappings into UNWIND_PROCS.
//! `Loader::load_process` takes a plain list of mappings, so the kernel's MMAP2 records
//! (through the collector) or /proc/PID/maps (`procmaps`) feed it alike. Rows live within
//! the `--unwind-memory` budget (`budget`): when a table does not fit, least recently used
//! binaries are evicted, those no loaded process maps first.
use std::{
    collections::{HashMap, HashSet},
    os::fd::AsFd as _,
    path::Path,
    sync::{Arc, Mutex},
};

use aya::maps::{Array as BpfArray, HashMap as BpfHashMap, Map, MapData};
use profiler_common::unwind::{
    MAX_MAPPINGS, ProcMappings, UnwindMapping, UnwindRow, UnwindRule, mapping,
};

use crate::process::MappingSpec;

use super::{
    LoaderStats, UnwindMode,
    budget::RowSpace,
    files::{Mmap, memmap},
    kernel_rows::{KernelTable, Rules},
    pool::{Compiled, Ready},
    rows_view::RowsView,
    table,
};

pub(crate) use super::files::BinaryKey;

/// Eviction: room for a table in UNWIND_ROWS (`make_room`).
mod evict;

/// Tables compiled and not yet taken by a process, at most (see `pool::Ready`).
const MAX_READY_TABLES: usize = 4096;

/// One binary known to the loader: where its table sits in UNWIND_ROWS, or that it is walked
/// by frame pointer.
#[derive(Clone, Debug)]
struct Binary {
    kind: u32,
    /// Its slice of UNWIND_ROWS (page index and rows; `table_len` 0: none).
    table_start: u32,
    table_len: u32,
    /// `UnwindMapping::pages` and `first_page` of its table.
    pages: u32,
    first_page: u32,
    /// `table::mapping_bias` of a mapping at address 0, by file offset: a mapping's bias is
    /// its start plus this (linear in the start), so a new process needs no re-read.
    bias_at_zero: HashMap<u64, u64>,
    /// Loaded processes that map it.
    users: u32,
    /// `Loader::clock` when a process last loaded it (least recently used goes first).
    last_used: u64,
    /// Set when its table did not fit the budget: walked by frame pointer until then, when
    /// the next process that maps it tries again (the space may have been freed).
    retry_at: Option<std::time::Instant>,
}

impl Binary {
    /// Whether it is loaded for good (not waiting to try the budget again).
    fn settled(&self) -> bool {
        self.retry_at.is_none_or(|t| std::time::Instant::now() < t)
    }
}

pub(crate) struct Loader {
    mode: UnwindMode,
    /// The part of UNWIND_ROWS mapped here; declared before `_rows_map` so it is unmapped
    /// before the map's fd closes.
    rows: RowsView,
    space: RowSpace,
    /// Keeps UNWIND_ROWS's fd open for `rows`.
    _rows_map: MapData,
    procs: BpfHashMap<MapData, u32, ProcMappings>,
    /// UNWIND_RULES, and the rules it holds (never freed).
    rules_map: BpfArray<MapData, [UnwindRule; 2]>,
    rules: Rules,
    binaries: HashMap<BinaryKey, Binary>,
    /// What each loaded process's kernel entry holds, by binary (to rewrite it when one of
    /// its binaries is evicted, and to count users).
    loaded: HashMap<u32, Vec<(BinaryKey, UnwindMapping)>>,
    clock: u64,
    /// Compiled tables kept on disk between runs.
    cache: Option<super::cache::TableCache>,
    /// Tables compiled elsewhere (the `pool`), taken by the first process that maps them.
    ready: Ready,
    /// `TablePolicy::Reached`: the binaries some walk reached (filled by `BackgroundLoader`);
    /// the others, unless compiled already, go into the kernel as `mapping::UNREACHED`.
    /// None: every binary is loaded (`TablePolicy::All`).
    reached: Option<Arc<Mutex<HashSet<BinaryKey>>>>,
    pub stats: LoaderStats,
}

/// How long a binary whose table did not fit stays walked by frame pointer before a process
/// that maps it tries again (each try compiles or reads its table anew).
const RETRY_OVER_BUDGET: std::time::Duration = std::time::Duration::from_secs(1);

impl Loader {
    /// Takes the three maps of the loaded sampler; `capacity` is UNWIND_ROWS's entry count.
    pub(crate) fn new(
        mode: UnwindMode,
        rows: Map,
        capacity: u32,
        rules: Map,
        procs: Map,
    ) -> std::io::Result<Self> {
        let Map::Array(rows) = rows else {
            return Err(std::io::Error::other("UNWIND_ROWS is not an array map"));
        };
        let view = RowsView::new(
            std::os::fd::AsRawFd::as_raw_fd(&rows.fd().as_fd()),
            capacity,
        )?;
        let procs = BpfHashMap::try_from(procs).map_err(std::io::Error::other)?;
        let rules_map = BpfArray::try_from(rules).map_err(std::io::Error::other)?;
        Ok(Self {
            mode,
            rows: view,
            space: RowSpace::new(capacity),
            _rows_map: rows,
            procs,
            rules_map,
            rules: Rules::default(),
            binaries: HashMap::new(),
            loaded: HashMap::new(),
            clock: 0,
            cache: None,
            ready: Ready::new(u64::from(capacity), MAX_READY_TABLES),
            reached: None,
            stats: LoaderStats {
                slots_capacity: u64::from(capacity),
                ..LoaderStats::default()
            },
        })
    }

    /// Reads tables from `cache` before compiling them, and keeps those it compiles there.
    pub(crate) fn set_cache(&mut self, cache: super::cache::TableCache) {
        self.cache = Some(cache);
    }

    /// The disk cache, for compilers running beside the loader (`pool`).
    pub(crate) fn cache(&self) -> Option<&super::cache::TableCache> {
        self.cache.as_ref()
    }

    /// Loads only the binaries in `reached` (and those compiled already): `TablePolicy::Reached`.
    pub(crate) fn set_reached(&mut self, reached: Arc<Mutex<HashSet<BinaryKey>>>) {
        self.reached = Some(reached);
    }

    /// Whether binary `key` has its table here (loaded, or compiled and waiting).
    fn known(&self, key: BinaryKey) -> bool {
        self.ready.contains(key) || self.binaries.get(&key).is_some_and(Binary::settled)
    }

    /// Whether binary `key` is left out until a walk reaches it (`set_reached`).
    fn unreached(&self, key: BinaryKey) -> bool {
        self.reached
            .as_ref()
            .is_some_and(|r| r.lock().is_ok_and(|r| !r.contains(&key)) && !self.known(key))
    }

    /// Hands over a table compiled elsewhere (`pool`): the next process that maps binary
    /// `key` loads it without compiling.
    pub(crate) fn add_compiled(&mut self, key: BinaryKey, compiled: Compiled) {
        self.ready.insert(key, compiled);
    }

    /// Loads the executable mappings of `pid` (and the tables of binaries not loaded yet)
    /// into the kernel. From then on its samples are walked by table.
    pub(crate) fn load_process(
        &mut self,
        pid: u32,
        mappings: &[MappingSpec],
    ) -> std::io::Result<()> {
        self.load_process_pending(pid, mappings, &HashSet::new())
    }

    /// `load_process`, with the binaries in `pending` (their tables are being compiled)
    /// marked `mapping::PENDING`: the process's other binaries are walked by table at once,
    /// a walk that reaches a pending one stops as not loaded (and its stack is copied).
    pub(crate) fn load_process_pending(
        &mut self,
        pid: u32,
        mappings: &[MappingSpec],
        pending: &HashSet<BinaryKey>,
    ) -> std::io::Result<()> {
        let mut sorted: Vec<&MappingSpec> = mappings.iter().collect();
        sorted.sort_by_key(|m| m.start);
        self.clock += 1;
        let mut entries: Vec<(BinaryKey, UnwindMapping)> = Vec::new();
        // Binaries of this process: never evicted to make room for another of its own.
        let mut pinned: HashSet<BinaryKey> = HashSet::new();
        for m in sorted {
            if entries.len() == MAX_MAPPINGS {
                log::debug!("pid {pid}: more than {MAX_MAPPINGS} executable mappings");
                break;
            }
            let placeholder = m.key().and_then(|key| {
                let kind = if pending.contains(&key) {
                    mapping::PENDING
                } else if self.unreached(key) {
                    mapping::UNREACHED
                } else {
                    return None;
                };
                Some((
                    key,
                    UnwindMapping {
                        start: m.start,
                        end: m.end,
                        kind,
                        ..UnwindMapping::default()
                    },
                ))
            });
            let entry = match placeholder {
                Some(entry) => entry,
                None => match self.mapping(m, &pinned) {
                    Some(entry) => entry,
                    None => continue,
                },
            };
            pinned.insert(entry.0);
            entries.push(entry);
        }
        for key in &pinned {
            if let Some(b) = self.binaries.get_mut(key) {
                b.users += 1;
                b.last_used = self.clock;
            }
        }
        let n = entries.len();
        let old = self.loaded.insert(pid, entries);
        let new_process = old.is_none();
        self.drop_users(old);
        self.write_entry(pid)?;
        // A process loaded again while it lives (by --pid, then at its first sample; at its
        // exec) counts once. Counted, not kept: a set of every pid ever loaded grew with each
        // new process (60 a second under churn) up to pid_max, 4M on large hosts.
        if new_process {
            self.stats.processes += 1;
        }
        log::debug!("pid {pid}: {n} executable mappings loaded for unwinding");
        Ok(())
    }

    /// `pid` exited: its kernel entry goes, and its binaries lose a user.
    pub(crate) fn forget_process(&mut self, pid: u32) {
        let old = self.loaded.remove(&pid);
        if old.is_some() {
            let _ = self.procs.remove(&pid);
            // Its binaries may be evicted now: binaries that did not fit may fit next time.
            let now = std::time::Instant::now();
            for b in self.binaries.values_mut() {
                if b.retry_at.is_some() {
                    b.retry_at = Some(now);
                }
            }
        }
        self.drop_users(old);
    }

    /// Whether every binary of `mappings` has been compiled already (loading them is then
    /// a few syscalls, no table to build).
    pub(crate) fn knows_all(&self, mappings: &[MappingSpec]) -> bool {
        self.missing(mappings).next().is_none()
    }

    /// The mappings of `mappings` whose binary's table would be compiled by loading them
    /// (neither loaded nor handed over by `add_compiled`, nor left unreached), with the
    /// binary's key.
    pub(crate) fn missing<'a>(
        &'a self,
        mappings: &'a [MappingSpec],
    ) -> impl Iterator<Item = (BinaryKey, &'a MappingSpec)> + 'a {
        // A file that cannot be read is left out by `load_process` too.
        mappings.iter().filter_map(|m| {
            let key = m.key()?;
            (!self.known(key) && !self.unreached(key)).then_some((key, m))
        })
    }

    fn drop_users(&mut self, entries: Option<Vec<(BinaryKey, UnwindMapping)>>) {
        let keys: HashSet<BinaryKey> = entries.into_iter().flatten().map(|(k, _)| k).collect();
        for key in keys {
            if let Some(b) = self.binaries.get_mut(&key) {
                b.users = b.users.saturating_sub(1);
            }
        }
    }

    /// Writes `pid`'s entry in UNWIND_PROCS from `loaded`.
    fn write_entry(&mut self, pid: u32) -> std::io::Result<()> {
        let mut value = ProcMappings {
            count: 0,
            _pad: 0,
            maps: [UnwindMapping::default(); MAX_MAPPINGS],
        };
        let entries = self.loaded.get(&pid).map_or(&[][..], Vec::as_slice);
        for (slot, (_, m)) in value.maps.iter_mut().zip(entries) {
            *slot = *m;
        }
        value.count = entries.len().min(MAX_MAPPINGS) as u32;
        self.procs
            .insert(pid, value, 0)
            .map_err(std::io::Error::other)
    }

    /// The kernel entry for one mapping; None for a file that cannot be read as ELF.
    fn mapping(
        &mut self,
        m: &MappingSpec,
        pinned: &HashSet<BinaryKey>,
    ) -> Option<(BinaryKey, UnwindMapping)> {
        let key = m.key()?;
        let known = self.binaries.get(&key).filter(|b| b.settled());
        // The file's bytes, read only when the table or this offset's bias is new.
        let data = match known {
            Some(b) if b.bias_at_zero.contains_key(&m.file_offset) => None,
            _ => {
                let file = m.open()?;
                // SAFETY: a read-only view. A file rewritten in place under us gives a wrong
                // table (walks stop early), not unsafety; a file truncated under us would
                // raise SIGBUS, a risk accepted: running executables refuse writes (ETXTBSY)
                // and package managers replace libraries by rename, not truncation.
                Some(unsafe { memmap(&file)? })
            }
        };
        let binary = match known {
            Some(b) => b.clone(),
            None => {
                let mut b = self.load_binary(&m.path, data.as_ref()?, key, pinned)?;
                // Tried again after it did not fit: its processes stay its users.
                if let Some(old) = self.binaries.get(&key) {
                    b.users = old.users;
                }
                self.binaries.insert(key, b.clone());
                b
            }
        };
        let at_zero = match binary.bias_at_zero.get(&m.file_offset) {
            Some(b) => *b,
            None => {
                let b = table::mapping_bias(data.as_deref()?, 0, m.file_offset)?;
                if let Some(known) = self.binaries.get_mut(&key) {
                    known.bias_at_zero.insert(m.file_offset, b);
                }
                b
            }
        };
        let bias = m.start.wrapping_add(at_zero);
        Some((
            key,
            UnwindMapping {
                start: m.start,
                end: m.end,
                bias,
                table_start: binary.table_start,
                pages: binary.pages,
                kind: binary.kind,
                first_page: binary.first_page,
            },
        ))
    }

    fn load_binary(
        &mut self,
        path: &Path,
        data: &Mmap,
        key: BinaryKey,
        pinned: &HashSet<BinaryKey>,
    ) -> Option<Binary> {
        // Not ELF: no table, no bias.
        object::File::parse(&**data).ok()?;
        let mut binary = Binary {
            kind: mapping::FRAME_POINTER,
            table_start: 0,
            table_len: 0,
            pages: 0,
            first_page: 0,
            bias_at_zero: HashMap::new(),
            users: 0,
            last_used: self.clock,
            retry_at: None,
        };
        let compiled = self
            .ready
            .take(key)
            .unwrap_or_else(|| Compiled::new(path, data, self.cache.as_ref()));
        self.stats.compile_ns += compiled.ns;
        self.stats.cache_hits += u64::from(compiled.cache_hit);
        let table = match compiled.table {
            Ok(t) => t,
            Err(e) => {
                log::debug!(
                    "{}: no unwind table: {}",
                    path.display(),
                    crate::util::chain(&e)
                );
                self.stats.binaries_fp += 1;
                return Some(binary);
            }
        };
        let by_fp = table.rows.is_empty()
            || (self.mode == UnwindMode::Auto && table.keeps_frame_pointers());
        if by_fp {
            self.stats.binaries_fp += 1;
            self.add_stops(&mut binary, data, key, pinned);
            return Some(binary);
        }
        let kernel = match self.convert(&table.rows, &table.padding) {
            Ok(k) => k,
            Err(e) => {
                log::debug!("{}: no unwind table: {e}", path.display());
                self.stats.binaries_fp += 1;
                return Some(binary);
            }
        };
        let len = kernel.len();
        let start = if len > self.space.capacity() {
            None
        } else {
            self.make_room(len, key, pinned)
        };
        let Some(start) = start else {
            log::debug!(
                "{}: {} rows ({len} entries) do not fit the unwind memory",
                path.display(),
                table.rows.len()
            );
            self.stats.over_budget += 1;
            binary.retry_at = Some(std::time::Instant::now() + RETRY_OVER_BUDGET);
            return Some(binary);
        };
        if let Err(e) = self.write_rows(&mut binary, &kernel, start) {
            log::debug!("{}: cannot map its unwind rows: {e}", path.display());
            self.stats.binaries_fp += 1;
            return Some(binary);
        }
        binary.kind = mapping::TABLE;
        self.stats.rows += table.rows.len() as u64;
        self.stats.binaries_table += 1;
        Some(binary)
    }

    /// `rows` in the kernel's form, their new rules written to UNWIND_RULES; an error when
    /// the rule table is full (counted) or cannot be written.
    fn convert(&mut self, rows: &[UnwindRow], padding: &[u32]) -> std::io::Result<KernelTable> {
        let before = self.rules.len();
        let kernel = KernelTable::new(rows, padding, &mut self.rules).map_err(|e| {
            self.stats.rules_full += 1;
            std::io::Error::other(e)
        })?;
        // Two rules to an element (`WORDS_PER_ELEMENT`): the pairs holding new ones.
        let list = self.rules.as_slice();
        let pairs: Vec<(u32, [UnwindRule; 2])> = (before / 2..list.len().div_ceil(2))
            .map(|p| {
                let at = |i: usize| list.get(i).copied().unwrap_or_default();
                (p as u32, [at(2 * p), at(2 * p + 1)])
            })
            .collect();
        for (index, pair) in pairs {
            if let Err(e) = self.rules_map.set(index, pair, 0) {
                self.rules.truncate(before);
                return Err(std::io::Error::other(e));
            }
        }
        self.stats.rules = self.rules.len() as u64;
        Ok(kernel)
    }

    /// Copies `kernel` into UNWIND_ROWS at `start` (a range `make_room` handed out) and
    /// gives `binary` that slice; the range goes back to the free space on failure.
    fn write_rows(
        &mut self,
        binary: &mut Binary,
        kernel: &KernelTable,
        start: u32,
    ) -> std::io::Result<()> {
        let len = kernel.len();
        // Entries [start, start + len) lie inside the array (RowSpace hands out only ranges
        // below its capacity, the array's length), and no kernel walk reads them before a
        // mapping points at them (evicted ones waited REUSE_GRACE).
        match self.rows.rows_mut(start, len) {
            Ok(dst) => {
                kernel.write_to(dst, start);
                self.stats.mapped_bytes = self.rows.mapped_bytes();
            }
            Err(e) => {
                self.space.release(start, len);
                return Err(e);
            }
        }
        binary.table_start = start;
        binary.table_len = len;
        binary.pages = kernel.pages;
        binary.first_page = kernel.first_page;
        self.stats.slots_now = u64::from(self.space.used());
        Ok(())
    }

    /// Gives a binary walked by frame pointer its STOP rows (`table::go_stops`), when it has
    /// any and they fit; it stays walked by frame pointer.
    fn add_stops(
        &mut self,
        binary: &mut Binary,
        data: &[u8],
        key: BinaryKey,
        pinned: &HashSet<BinaryKey>,
    ) {
        let rows = table::go_stops(data);
        if rows.is_empty() {
            return;
        }
        let kernel = match self.convert(&rows, &[]) {
            Ok(k) => k,
            Err(e) => {
                log::debug!("no room for the Go stack-base rows: {e}");
                return;
            }
        };
        let len = kernel.len();
        if len > self.space.capacity() {
            return;
        }
        let Some(start) = self.make_room(len, key, pinned) else {
            return;
        };
        if let Err(e) = self.write_rows(binary, &kernel, start) {
            log::debug!("cannot map the Go stack-base rows: {e}");
            return;
        }
        self.stats.rows += rows.len() as u64;
    }
}
