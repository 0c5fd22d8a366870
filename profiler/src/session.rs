//! The recording pipeline every front end shares (`record`, the agent, `doctor`, the HTTP
//! endpoints): it starts the sampler (kernel process records first, then the BPF programs,
//! the unwind-table loader and the Python tracker), drains the ring buffer into a
//! `Collection`, and cuts what it collected into `Window`s: one for a whole recording
//! (`finish`), or one after another while sampling goes on (`cut`, the agent). A window
//! holds everything symbolizing needs, so that can happen on another thread.
use std::{future::Future, sync::Arc, time::Duration};

use aya::maps::{MapData, RingBuf};
use tokio::io::{Interest, unix::AsyncFd};

use crate::{
    bpf::{Event, KernelCounters, Sampler, SamplerConfig, UnwindMaps},
    cgroups::CgroupTarget,
    collect::{CgroupFilter, Collected, Collection, CommFilter},
    process::{KernelRecords, ProcessEvents, TableBounds},
    profile::{Counters, Meta, Profile},
    symbolize::Symbolizer,
    unwind::{BackgroundLoader, Loader, LoaderStats, UnwindMode},
    util::{self, unix_now_ns},
};

/// Why the live pipeline could not start or go on.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionError {
    #[error("cannot start sampling")]
    Sampler(#[from] crate::bpf::BpfError),
    #[error("reading samples failed")]
    Io(#[from] std::io::Error),
    #[error("cannot read /proc/kallsyms")]
    Kallsyms(#[source] std::io::Error),
}

/// What to sample and how.
#[derive(Clone, Debug)]
pub(crate) struct SessionConfig {
    pub event: Event,
    /// Samples per second per CPU.
    pub frequency_hz: u32,
    /// Only these processes (in the kernel); empty = all.
    pub pids: Vec<u32>,
    /// Only these comms; empty = all.
    pub comms: Vec<String>,
    /// Only tasks in these cgroups or below; cgroup2 ones are filtered in the kernel (up to
    /// `MAX_CGROUP_FILTER`), a mix with v1 ones all in the collector.
    pub cgroups: Vec<CgroupTarget>,
    /// How user stacks are walked.
    pub unwind: UnwindMode,
    /// Kernel memory for unwind rows, bytes.
    pub unwind_memory: u64,
    /// Which binaries of a sampled process get their tables (`unwind::TablePolicy`).
    pub unwind_tables: crate::unwind::TablePolicy,
    /// Directory of compiled unwind tables kept between runs (`unwind::cache`); None: none.
    pub unwind_cache: Option<std::path::PathBuf>,
    /// Name Python frames in CPython processes.
    pub python: bool,
    /// Time every thread's run-queue waits (`bpf::runq`); a kernel that refuses it is told
    /// in a warning and the recording goes on without.
    pub runq: bool,
    /// Bytes of ring per CPU for the kernel's process records: enough for the process
    /// churn between two drains.
    pub kernel_record_bytes: usize,
    /// A new process's first sample wakes the drain at once (`record`, `doctor`: short
    /// recordings want every process's tables before it exits); false for the agent, whose
    /// timed drain every second costs less than a wake-up for each new process.
    pub wake_for_processes: bool,
    /// Test hook: a pause after a cut's last drain, as a busy machine makes (the agent's
    /// `PROFILER_TEST_SETTLE_DELAY_MS`); None everywhere else.
    pub settle_delay: Option<Duration>,
}

/// What a session tells its front end while it starts; the front end decides how to show it.
#[derive(Clone, Debug)]
pub(crate) enum Notice {
    /// One `--cgroup` target and whether it is filtered in the kernel.
    CgroupFilter {
        target: CgroupTarget,
        in_kernel: bool,
    },
    /// Something works less well than asked; the recording goes on.
    Warning(String),
}

/// One cut of the recording: the samples and stacks of a span of time, with the process
/// facts and metadata to symbolize them anywhere.
pub(crate) struct Window {
    pub collected: Collected,
    pub meta: Meta,
    /// Run-queue waits, when traced (`finish` only: they are totals since the start).
    pub runq: Option<crate::profile::runq::RunQueue>,
    /// Changes when the session's process table starts afresh: names a `Symbolizer` kept
    /// across windows must then go (their keys are the table's file ids).
    pub table_generation: u64,
}

impl Window {
    /// Names every frame: the profile of this window.
    pub(crate) fn symbolize(self, symbolizer: &mut Symbolizer) -> Profile {
        let mut profile = symbolizer.profile(self.collected, self.meta, self.table_generation);
        profile.runq = self.runq;
        profile
    }
}

/// How the unwinder and the Python walk did over a whole recording (`Session::finish`).
#[derive(Clone, Debug, Default)]
pub(crate) struct SessionReport {
    /// Table loader figures, when stacks were walked by table.
    pub unwind: Option<LoaderStats>,
    /// Samples whose user stack a table walk cut short, by `unwind::reason`.
    pub unwind_truncated: profiler_common::unwind::ByReason,
    /// Python figures, when Python frames were on.
    pub python: Option<PythonReport>,
    /// Kernel process records lost (rings full).
    pub lost_records: u64,
}

/// See `SessionReport::python`.
#[derive(Clone, Debug, Default)]
pub(crate) struct PythonReport {
    pub registered: u64,
    /// Walked, truncated, unreadable, without thread state (the kernel's counters).
    pub kernel: [u64; profiler_common::python::counter::COUNT as usize],
    /// Recorded samples whose walk was cut short.
    pub cut: u64,
    /// Processes refused, by kind: (count, last message).
    pub refused: Vec<(String, u64, String)>,
}

/// What the process table remembers across windows at most.
const TABLE_BOUNDS: TableBounds = TableBounds {
    files: 2048,
    locs: 1_000_000,
};

/// How long the end of a window waits for tables that samples' stack copies need
/// (`unwind::copied`): libc's compiles in a fraction of a second, a large binary's in seconds.
const COPY_TABLES_WAIT: Duration = Duration::from_secs(10);

/// A sampler attached on every CPU and what it collected since the last cut.
pub(crate) struct Session {
    sampler: Sampler,
    ring: AsyncFd<RingBuf<MapData>>,
    collection: Collection,
    loader: Option<Arc<BackgroundLoader>>,
    event: Event,
    frequency_hz: u32,
    /// Kernel counters at the last cut (they are cumulative).
    last_counters: KernelCounters,
    /// Wall-clock and monotonic start of the current window, ns.
    start_unix_ns: u64,
    start_mono_ns: u64,
    hostname: String,
    kernel_release: String,
    table_generation: u64,
    /// `SessionConfig::settle_delay`.
    settle_delay: Option<Duration>,
    runq: Option<crate::bpf::runq::RunqTracer>,
}

impl Session {
    /// Loads and attaches the sampler. Needs CAP_BPF + CAP_PERFMON (or root), and enough
    /// open files for a perf event per CPU (the front end raises the limit).
    pub(crate) fn start(
        config: &SessionConfig,
        notice: &mut dyn FnMut(Notice),
    ) -> Result<Self, SessionError> {
        let (kernel_cgroups, user_cgroups) = split_cgroups(&config.cgroups, notice);
        let python = python_facts(config.python, notice);
        // Process records first, so none a sample depends on can be missed.
        let kernel_records = open_kernel_records(config.kernel_record_bytes, notice);
        // The loader is made before the program is attached (`Sampler::start`), so the
        // processes asked for by pid are walked by table from their first sample.
        let mut unwind = None;
        let (mut sampler, ring) = Sampler::start(
            &SamplerConfig {
                event: config.event,
                frequency_hz: config.frequency_hz.into(),
                pids: &config.pids,
                cgroups: &kernel_cgroups,
                table_walk: config.unwind != UnwindMode::Fp,
                unwind_memory: config.unwind_memory,
                python_fsbase_offset: python.map(|p| p.fsbase_offset),
                wake_for_processes: config.wake_for_processes,
            },
            &mut |maps| {
                unwind = Some(unwind_loader(maps, config)?);
                Ok(())
            },
        )?;
        for line in sampler.lost() {
            notice(Notice::Warning(line.clone()));
        }
        let events = ProcessEvents::new(kernel_records, sampler.take_exits());
        // SAFETY: the RingBuf owns its map fd and keeps it open until the AsyncFd drops it.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| SessionError::Io(std::io::Error::other(e.to_string())))?;
        let mut collection = Collection::new(CommFilter(config.comms.clone()))
            .with_cgroup_filter(CgroupFilter::new(user_cgroups))
            .with_events(events);
        let loader = match unwind {
            Some(l) => Some(Arc::new(BackgroundLoader::spawn(l, config.unwind_tables)?)),
            None => None,
        };
        if let Some(loader) = &loader {
            let to_loader = Arc::clone(loader);
            collection = collection.on_new_process(Box::new(move |event| to_loader.submit(event)));
            let cache = loader.cache();
            collection = collection.with_copy_unwinder(crate::unwind::CopyUnwinder::new(
                config.unwind,
                config.unwind_tables,
                cache,
            )?);
        }
        if let (Some(facts), Some(map)) = (python, sampler.take_python_map()) {
            let mut tracker = crate::python::Tracker::new(map, facts);
            tracker.register_running(&config.pids);
            collection = collection.with_python(tracker);
        }
        Ok(Self {
            // After the sampler: the window starts now.
            runq: config.runq.then(|| start_runq(notice)).flatten(),
            last_counters: sampler.counters()?,
            sampler,
            ring,
            collection,
            loader,
            event: config.event,
            frequency_hz: config.frequency_hz,
            // The recording starts once the sampler is attached (loading takes a while).
            start_unix_ns: unix_now_ns(),
            start_mono_ns: util::monotonic_ns(),
            hostname: read_trimmed("/proc/sys/kernel/hostname"),
            kernel_release: read_trimmed("/proc/sys/kernel/osrelease"),
            table_generation: 0,
            settle_delay: config.settle_delay,
        })
    }

    /// The capture's named counters: the sampler's variant and refusals, and the table
    /// walk's figures (since the start, as the loader's).
    fn named_counters(&self, k: &KernelCounters) -> Vec<(String, u64)> {
        let variant = self.sampler.variant();
        let mut named = vec![
            (
                "sampler_programs_refused".to_owned(),
                self.sampler.refusals().len() as u64,
            ),
            ("sampler_table_walk".to_owned(), u64::from(variant.tables)),
            ("sampler_python_walk".to_owned(), u64::from(variant.python)),
        ];
        if let Some(l) = &self.loader {
            named.extend(crate::unwind::report::named_counters(&l.stats()));
            named.push(("unwind_stack_copies".to_owned(), k.stack_copies));
            named.push((
                "unwind_stack_copies_refused".to_owned(),
                k.stack_copies_refused,
            ));
        }
        named
    }

    /// The sampler program loaded and the ones the kernel refused before it.
    pub(crate) fn sampler_variant(&self) -> (crate::bpf::variant::Variant, usize) {
        (self.sampler.variant(), self.sampler.refusals().len())
    }

    /// The CPUs sampled.
    pub(crate) fn cpus(&self) -> &[u32] {
        &self.sampler.cpus
    }

    /// Monotonic start of the current window, ns.
    pub(crate) fn window_start_mono_ns(&self) -> u64 {
        self.start_mono_ns
    }

    /// Drains the ring buffer as samples arrive until `stop` completes, resolving new
    /// addresses every `tick` and then calling `on_tick` with what was collected so far.
    pub(crate) async fn run_until(
        &mut self,
        stop: impl Future<Output = ()>,
        tick: Duration,
        on_tick: impl FnMut(&Collection),
    ) -> Result<(), SessionError> {
        self.collection
            .run_until(&mut self.ring, stop, tick, on_tick)
            .await?;
        Ok(())
    }

    /// The run-queue tracer's per-CPU totals since it started, when it runs (a few lookups:
    /// the agent reads them every window for its metrics).
    pub(crate) fn runq_totals(&self) -> Option<crate::profile::runq::RunQueue> {
        (self.runq.as_ref()).map(|t| t.totals(&self.sampler.cpus))
    }

    /// Table loader figures now, when stacks are walked by table.
    pub(crate) fn unwind_stats(&self) -> Option<crate::unwind::LoaderStats> {
        self.loader.as_ref().map(|l| l.stats())
    }

    /// Process generations whose Python names the session holds now, when Python frames
    /// are on (`python::Tracker::python_processes`).
    pub(crate) fn python_processes(&self) -> Option<usize> {
        self.collection
            .python()
            .map(crate::python::Tracker::python_processes)
    }

    /// How many samples of new Python processes woke the reader so far (profiler-ebpf
    /// `python_exec`: the agent only); None with Python frames off.
    pub(crate) fn python_exec_wakes(&self) -> Option<u64> {
        let counters = self.sampler.python_counters().ok()??;
        Some(counters[profiler_common::python::counter::EXEC_WAKES as usize])
    }

    /// Ends the current window and starts the next at once (no gap in sampling): everything
    /// since the last cut, ready to symbolize anywhere. Process facts of live processes stay
    /// for the next window; those of exited processes go (Python names of ended generations
    /// too), so memory follows the number of live processes, not the pid churn.
    pub(crate) async fn cut(&mut self) -> Result<Window, SessionError> {
        let drained = self.settle().await?;
        let (meta, _) = self.meta(drained)?;
        let collected = self.collection.cut(meta.start_mono_ns);
        // After the cut: the window took the Python names its samples need.
        if self.collection.prune(TABLE_BOUNDS) {
            self.table_generation += 1;
        }
        Ok(Window {
            collected,
            meta,
            runq: None,
            table_generation: self.table_generation,
        })
    }

    /// The samples since `since_mono_ns` as a window of their own, leaving the current
    /// window as it is: a profile of part of it, from the running sampler.
    pub(crate) async fn copy_since(&mut self, since_mono_ns: u64) -> Result<Window, SessionError> {
        // Up to the last drain, as a cut (see `meta`).
        let drained = self.settle().await?;
        let collected = self.collection.copy_since(since_mono_ns);
        let since = since_mono_ns.max(self.start_mono_ns);
        let meta = Meta {
            start_unix_ns: unix_at(since),
            start_mono_ns: since,
            duration_ns: drained.saturating_sub(since),
            frequency_hz: self.frequency_hz,
            event: self.event.name().to_owned(),
            hostname: self.hostname.clone(),
            kernel_release: self.kernel_release.clone(),
            cpus: self.sampler.cpus.clone(),
            counters: Counters {
                recorded: collected.samples.len() as u64,
                ..Counters::default()
            },
            untimed: Vec::new(),
            named_counters: Vec::new(),
        };
        Ok(Window {
            collected,
            meta,
            runq: None,
            table_generation: self.table_generation,
        })
    }

    /// Detaches the sampler and returns everything since the last cut (for `record`, the
    /// whole recording), with how the unwinder and the Python walk did.
    pub(crate) async fn finish(mut self) -> Result<(Window, SessionReport), SessionError> {
        self.sampler.detach();
        let runq = (self.runq.take()).map(|t| t.read(&self.sampler.cpus, self.start_mono_ns));
        let drained = self.settle().await?;
        let (meta, _) = self.meta(drained)?;
        let counts = self.collection.counts();
        let python = match self.collection.python() {
            Some(t) => Some(PythonReport {
                registered: t.registered,
                kernel: self.sampler.python_counters()?.unwrap_or_default(),
                cut: counts.py_truncated,
                refused: t
                    .refused
                    .iter()
                    .map(|(kind, (n, last))| ((*kind).to_owned(), *n, last.clone()))
                    .collect(),
            }),
            None => None,
        };
        let report = SessionReport {
            unwind: self.loader.as_ref().map(|l| l.stats()),
            unwind_truncated: counts.unwind_truncated,
            python,
            lost_records: counts.lost_records,
        };
        let window = Window {
            collected: self.collection.cut(meta.start_mono_ns),
            meta,
            runq,
            table_generation: self.table_generation,
        };
        Ok((window, report))
    }

    /// Reads what is left in the ring and resolves every address and cgroup seen so far;
    /// returns when the ring was last read (monotonic ns): the samples collected are those
    /// taken before it, and any taken since are still in the ring.
    async fn settle(&mut self) -> Result<u64, SessionError> {
        self.collection.drain(self.ring.get_mut());
        let drained = self.collection.drained_at_ns();
        // Samples whose stack copies wait for tables: their compiles are given a while,
        // then what still waits is walked with the tables there are. The ring is read
        // meanwhile (its samples held for the next window): it must not fill.
        let deadline = tokio::time::Instant::now() + COPY_TABLES_WAIT;
        while self.collection.copies_waiting() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.collection.hold(self.ring.get_mut());
        }
        self.collection.add_deferred(true);
        if let Some(d) = self.settle_delay {
            tokio::time::sleep(d).await;
        }
        self.collection.resolve().await?;
        Ok(drained)
    }

    /// The current window's metadata and counters; ends it and starts the next at
    /// `end_mono_ns`, when the ring was last read. Not at the clock after resolving what was
    /// read: that can take a while on a busy machine (100 ms seen), and the samples taken
    /// meanwhile, drained into the next window, had times before its start (stored at its
    /// start, several at one time, issue 11) and lost their symbols (their process gone by
    /// then). A sample still in flight at the read lies at most its program's run before it.
    fn meta(&mut self, end_mono_ns: u64) -> Result<(Meta, KernelCounters), SessionError> {
        let k = self.sampler.counters()?;
        let prev = std::mem::replace(&mut self.last_counters, k);
        let c = self.collection.counts();
        let counters = Counters {
            recorded: self.collection.sample_count() as u64,
            lost_ringbuf_full: k.lost_ringbuf_full.saturating_sub(prev.lost_ringbuf_full),
            filtered: k.filtered.saturating_sub(prev.filtered) + c.filtered,
            kstack_failed: c.kstack_failed,
            ustack_failed: c.ustack_failed,
        };
        let meta = Meta {
            start_unix_ns: self.start_unix_ns,
            start_mono_ns: self.start_mono_ns,
            duration_ns: end_mono_ns.saturating_sub(self.start_mono_ns),
            frequency_hz: self.frequency_hz,
            event: self.event.name().to_owned(),
            hostname: self.hostname.clone(),
            kernel_release: self.kernel_release.clone(),
            cpus: self.sampler.cpus.clone(),
            counters,
            untimed: Vec::new(),
            named_counters: self.named_counters(&k),
        };
        self.start_unix_ns = unix_at(end_mono_ns);
        self.start_mono_ns = end_mono_ns;
        Ok((meta, k))
    }
}

/// The `--cgroup` targets filtered in the kernel (their directories) and those filtered in
/// the collector: all in the kernel when every one is cgroup2 and they fit its filter, else
/// all in the collector. Says which for each.
fn split_cgroups(
    cgroups: &[CgroupTarget],
    notice: &mut dyn FnMut(Notice),
) -> (Vec<std::path::PathBuf>, Vec<CgroupTarget>) {
    let in_kernel = cgroups.iter().all(CgroupTarget::is_v2)
        && cgroups.len() <= profiler_common::MAX_CGROUP_FILTER as usize;
    for t in cgroups {
        notice(Notice::CgroupFilter {
            target: t.clone(),
            in_kernel,
        });
    }
    if in_kernel {
        (cgroups.iter().map(CgroupTarget::dir).collect(), Vec::new())
    } else {
        (Vec::new(), cgroups.to_vec())
    }
}

/// What the Python walk needs of this host, when Python frames are asked for; a host where
/// the walk cannot work is told in a warning and records everything else.
fn python_facts(
    wanted: bool,
    notice: &mut dyn FnMut(Notice),
) -> Option<crate::python::KernelFacts> {
    if !wanted {
        return None;
    }
    crate::python::KernelFacts::find()
        .map_err(|e| notice(Notice::Warning(format!("no Python frames: {e}"))))
        .ok()
}

/// The run-queue tracer, a nicety: a kernel that refuses it is told in a warning.
fn start_runq(notice: &mut dyn FnMut(Notice)) -> Option<crate::bpf::runq::RunqTracer> {
    crate::bpf::runq::RunqTracer::start()
        .map_err(|e| {
            notice(Notice::Warning(format!(
                "run-queue waits are not recorded: {}",
                crate::util::chain(&e)
            )));
        })
        .ok()
}

/// The table walk's loader over the sampler's unwind maps, with its disk cache and the
/// processes asked for by pid already loaded, so their first samples are walked by table too.
fn unwind_loader(maps: UnwindMaps, config: &SessionConfig) -> std::io::Result<Loader> {
    let mut loader = Loader::new(config.unwind, maps.rows, maps.words, maps.rules, maps.procs)?;
    if let Some(dir) = &config.unwind_cache {
        match crate::unwind::cache::TableCache::open(dir, crate::unwind::cache::DEFAULT_MAX_BYTES) {
            Ok(cache) => loader.set_cache(cache),
            Err(e) => log::warn!(
                "unwind tables are not cached: cannot create {}: {e}",
                dir.display()
            ),
        }
    }
    for &pid in &config.pids {
        if let Ok(mappings) = crate::unwind::proc_mappings(pid)
            && let Err(e) = loader.load_process(pid, &mappings)
        {
            log::debug!(
                "pid {pid}: cannot load its mappings for unwinding: {}",
                crate::util::chain(&e)
            );
        }
    }
    Ok(loader)
}

/// The wall clock at the monotonic `mono_ns` of the recent past.
fn unix_at(mono_ns: u64) -> u64 {
    unix_now_ns().saturating_sub(util::monotonic_ns().saturating_sub(mono_ns))
}

/// The kernel's process records on every online CPU; None (with a notice) when they cannot
/// be had: processes are then read from /proc at their first sample, which short-lived ones
/// may not survive.
fn open_kernel_records(
    bytes_per_cpu: usize,
    notice: &mut dyn FnMut(Notice),
) -> Option<KernelRecords> {
    let cpus = aya::util::online_cpus().ok()?;
    KernelRecords::open(&cpus, bytes_per_cpu)
        .map_err(|e| {
            notice(Notice::Warning(format!(
                "cannot follow process mappings in the kernel ({e}): short-lived processes may not be symbolized"
            )));
        })
        .ok()
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}
