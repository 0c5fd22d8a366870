//! Continuous sampling for the agent: the sampler stays attached and every `window` call cuts
//! one `Profile` out of the stream. Process facts (maps, exe, open binaries) of live processes
//! carry over between windows; those of exited processes are dropped, so memory follows the
//! number of live processes, not the pid churn.
use std::{collections::HashMap, future::Future, sync::Arc, time::Duration};

use aya::maps::{MapData, RingBuf};
use tokio::io::{Interest, unix::AsyncFd};

use crate::{
    bpf::{Event, KernelCounters, Sampler, SamplerConfig},
    collect::{Collection, CommFilter, ProcessEvents, ProcessTable, space_pid},
    profile::{Counters, Meta, Profile},
    record::RecordError,
    symbolize::{self, KernelSymbols, UserSymbolizer},
    util,
};

/// Mapped files remembered across windows at most; past it the table starts afresh (live
/// processes are simply read again when next seen), which bounds open handles and memory.
const MAX_FILES: usize = 2048;
/// Addresses remembered across windows at most (same reset as `MAX_FILES`).
const MAX_LOCS: usize = 1_000_000;

/// Bytes of ring per CPU for the kernel's process records: a second of them between drains
/// (new processes also wake the agent at their first sample).
const KERNEL_RECORD_BYTES: usize = 256 << 10;
/// How often the agent drains the ring buffer unwoken. At 19 Hz a second of samples is a few
/// KiB, and every wake-up costs the agent CPU; new processes and a quarter-full buffer still
/// wake it at once (see profiler-ebpf).
const DRAIN_EVERY: Duration = Duration::from_secs(1);

/// A sampler that stays attached, handing out one profile per window.
pub struct Recorder {
    sampler: Sampler,
    ring: AsyncFd<RingBuf<MapData>>,
    collection: Collection,
    filter: CommFilter,
    /// Shared with the blocking thread that symbolizes each window.
    kernel: Arc<KernelSymbols>,
    /// User frame names found in earlier windows (cleared with the process table).
    names: symbolize::NameCache,
    frequency_hz: u32,
    event: Event,
    /// Kernel counters at the start of the current window (they are cumulative).
    last_counters: KernelCounters,
    /// Wall-clock and monotonic start of the current window, ns.
    start_unix_ns: u64,
    start_mono_ns: u64,
    hostname: String,
    kernel_release: String,
}

impl Recorder {
    /// Loads and attaches the sampler on every CPU. Needs CAP_BPF + CAP_PERFMON (or root).
    pub fn start(event: Event, frequency_hz: u32, comms: Vec<String>) -> Result<Self, RecordError> {
        util::raise_fd_limit();
        let kernel_records = crate::record::open_kernel_records(KERNEL_RECORD_BYTES);
        let (mut sampler, ring) = Sampler::start(&SamplerConfig {
            event,
            frequency_hz: frequency_hz.into(),
            pids: &[],
            cgroups: &[],
            // The agent's collector does not feed the table walk yet.
            unwind: crate::unwind::UnwindMode::Fp,
            unwind_memory: 0,
            python: None,
        })?;
        // SAFETY: the RingBuf owns its map fd and keeps it open until the AsyncFd drops it.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| RecordError::Io(std::io::Error::other(e.to_string())))?;
        let kernel = KernelSymbols::load().map_err(RecordError::Kallsyms)?;
        if kernel.hidden() {
            log::warn!(
                "kernel addresses are hidden by kernel.kptr_restrict; kernel frames show as [kernel]"
            );
        }
        let filter = CommFilter(comms);
        let mut collection = Collection::new(filter.clone());
        collection.events = ProcessEvents::new(kernel_records, sampler.take_exits());
        Ok(Self {
            last_counters: sampler.counters()?,
            sampler,
            ring,
            collection,
            filter,
            kernel: Arc::new(kernel),
            names: symbolize::NameCache::new(),
            frequency_hz,
            event,
            start_unix_ns: unix_now_ns(),
            start_mono_ns: util::monotonic_ns(),
            hostname: read_trimmed("/proc/sys/kernel/hostname"),
            kernel_release: read_trimmed("/proc/sys/kernel/osrelease"),
        })
    }

    /// Samples per second per CPU.
    pub fn frequency_hz(&self) -> u32 {
        self.frequency_hz
    }

    /// Collects until `stop` completes, then returns everything since the previous window
    /// as a symbolized profile and starts the next window at once (no gap in sampling).
    pub async fn window(&mut self, stop: impl Future<Output = ()>) -> Result<Profile, RecordError> {
        self.collection
            .run_until(&mut self.ring, stop, DRAIN_EVERY, |_| {})
            .await?;
        self.collection.drain(self.ring.get_mut());
        self.collection.processes.resolve_pending();
        // Perf maps are the processes' own files: read on a blocking thread, so a slow one
        // never holds up this thread, which also serves the HTTP API.
        self.collection.processes.name_jit_code().await?;
        self.cut().await
    }

    /// Ends the current window (drained, its addresses resolved): takes its samples,
    /// symbolizes them.
    async fn cut(&mut self) -> Result<Profile, RecordError> {
        self.collection.resolve_cgroups();
        let now_mono = util::monotonic_ns();
        let now_unix = unix_now_ns();
        let k = self.sampler.counters()?;
        let prev = std::mem::replace(&mut self.last_counters, k);

        // The window's samples and stacks go; the process table (open binaries, resolved
        // addresses) stays for the next window, minus exited processes.
        let mut window =
            std::mem::replace(&mut self.collection, Collection::new(self.filter.clone()));
        let counters = Counters {
            recorded: window.samples.len() as u64,
            lost_ringbuf_full: k.lost_ringbuf_full.saturating_sub(prev.lost_ringbuf_full),
            filtered: k.filtered.saturating_sub(prev.filtered) + window.filtered,
            kstack_failed: window.kstack_failed,
            ustack_failed: window.ustack_failed,
        };
        let meta = Meta {
            start_unix_ns: self.start_unix_ns,
            start_mono_ns: self.start_mono_ns,
            duration_ns: now_mono.saturating_sub(self.start_mono_ns),
            frequency_hz: self.frequency_hz,
            event: self.event.name().to_owned(),
            hostname: self.hostname.clone(),
            kernel_release: self.kernel_release.clone(),
            cpus: self.sampler.cpus.clone(),
            counters,
        };
        self.start_unix_ns = now_unix;
        self.start_mono_ns = now_mono;
        // Symbolize only this window's addresses, not every address the table remembers.
        let all_locs = std::mem::take(&mut window.processes.locs);
        window.processes.locs = window
            .ustacks
            .items()
            .iter()
            .flat_map(|(pid, addrs)| addrs.iter().map(move |a| (*pid, *a)))
            .filter_map(|k| all_locs.get(&k).map(|l| (k, *l)))
            .collect();
        // Symbolizing reads the processes' binaries and debug files: on a blocking thread,
        // so this one goes on serving HTTP. A fresh user symbolizer each window (blazesym's
        // cannot cross threads, and need not: names already found are kept in `names`, so a
        // window parses only the binaries with new addresses, and their mappings do not stay
        // in the agent's RSS).
        let kernel = self.kernel.clone();
        let mut names = std::mem::take(&mut self.names);
        let (profile, mut window, names) = tokio::task::spawn_blocking(move || {
            let user = UserSymbolizer::default();
            let p = symbolize::build_profile_cached(&window, meta, &kernel, &user, &mut names);
            (p, window, names)
        })
        .await
        .map_err(|e| RecordError::Io(std::io::Error::other(e.to_string())))?;
        self.names = names;
        window.processes.locs = all_locs;
        let mut live = std::mem::take(&mut window.processes);
        if prune(&mut live) {
            // File ids start afresh: names keyed by them would point at other files.
            self.names.clear();
        } else if self.names.len() > MAX_LOCS {
            // Names of exited processes' code pile up; finding them again is cheap.
            self.names.clear();
        }
        // Lifetimes are reported in the window their events happened in.
        let _reported = live.lifetimes.take_window();
        if live.lost_records > 0 {
            log::warn!(
                "the kernel dropped {} process records (mappings, exec, exit) this window: \
                 some short-lived processes may show [unknown] frames",
                std::mem::take(&mut live.lost_records)
            );
        }
        self.collection.processes = live;
        self.collection.events = std::mem::take(&mut window.events);
        // Cgroup paths are a small cache: keep the ones this window saw.
        self.collection.cgroup_paths = std::mem::take(&mut window.cgroup_paths);
        Ok(profile)
    }
}

/// Forgets exited processes; starts afresh when the table outgrows its bounds (then returns
/// true: the names cache must go too, as it is keyed by the table's file ids).
fn prune(live: &mut ProcessTable) -> bool {
    let mut alive: HashMap<u32, bool> = HashMap::new();
    let mut is_alive = |pid: u32| {
        *alive
            .entry(pid)
            .or_insert_with(|| std::path::Path::new(&format!("/proc/{pid}")).exists())
    };
    live.processes.retain(|pid, _| is_alive(*pid));
    live.locs
        .retain(|(space, _), _| is_alive(space_pid(*space)));
    let dead: Vec<u32> = live.mappings.pids().filter(|&p| !is_alive(p)).collect();
    for pid in dead {
        live.mappings.remove(pid);
    }
    if live.files.len() > MAX_FILES || live.locs.len() > MAX_LOCS || live.names.len() > MAX_LOCS {
        log::info!(
            "process table reset ({} files, {} addresses): live processes are read again",
            live.files.len(),
            live.locs.len()
        );
        *live = ProcessTable::default();
        return true;
    }
    false
}

fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}
