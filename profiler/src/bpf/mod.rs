//! First stage on the user side: load the embedded sampler object, set its load-time globals,
//! attach it to a perf event on every online CPU, and hand the maps to the collector.
pub(crate) mod check;
pub(crate) mod churn;
mod ebpf_log;
mod exits;
pub(crate) mod features;
pub(crate) mod runq;
mod task;
pub(crate) mod variant;

use std::path::{Path, PathBuf};

use aya::{
    Ebpf, EbpfLoader,
    maps::{CgroupArray, HashMap, Map, MapData, PerCpuArray, RingBuf},
    programs::{
        PerfEvent,
        perf_event::{HardwareEvent, PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
};
use profiler_common::{
    DRAIN_INTERVAL_MS, GLOBAL_FILTER_CGROUPS, GLOBAL_FILTER_PIDS, GLOBAL_WAKE_FOR_PROCESSES,
    GLOBAL_WAKEUP_BYTES, MAP_CGROUP_FILTER, MAP_COUNTERS, MAP_PID_FILTER, MAP_SAMPLES,
    MAX_CGROUP_FILTER, WAKEUP_FRACTION, counter, python as py, ring_buffer_bytes, unwind,
};

use variant::{Refusal, Variant};

/// The sampler object, built by build.rs from profiler-ebpf.
static SAMPLER_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler-ebpf"));

/// What the sampler is driven by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Event {
    /// Software timer (works everywhere, also in VMs without a PMU).
    CpuClock,
    /// Hardware CPU cycles (needs a hardware PMU).
    Cycles,
}

impl Event {
    pub fn name(self) -> &'static str {
        match self {
            Event::CpuClock => "cpu-clock",
            Event::Cycles => "cycles",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum BpfError {
    #[error("loading the eBPF sampler failed")]
    Load(#[from] aya::EbpfError),
    #[error("the eBPF sampler was rejected")]
    Program(#[from] aya::programs::ProgramError),
    #[error(
        "this kernel's verifier rejected {program}: {reason} (run with -v for the verifier's log)"
    )]
    Rejected { program: String, reason: String },
    #[error(
        "this kernel has no BPF ring buffer, which the sampler streams through: the profiler \
         needs Linux 5.8 or newer"
    )]
    NoRingBuffer,
    #[error("eBPF map error")]
    Map(#[from] aya::maps::MapError),
    #[error("the eBPF object has no {0}")]
    Missing(&'static str),
    #[error("cannot set up the unwind tables")]
    UnwindMaps(#[source] std::io::Error),
    #[error("cannot list online CPUs ({0})")]
    Cpus(&'static str, #[source] std::io::Error),
    #[error(
        "--event cycles needs a hardware PMU and this machine has none \
         (no /sys/bus/event_source/devices/cpu); use --event cpu-clock"
    )]
    NoPmu,
    #[error("cannot open cgroup {0}")]
    Cgroup(PathBuf, #[source] std::io::Error),
    #[error("at most {MAX_CGROUP_FILTER} cgroups can be filtered in the kernel, got {0}")]
    TooManyCgroups(usize),
}

/// Map sizes and load-time values of one load of the object.
struct Settings {
    ring_bytes: u32,
    unwind_rows: u32,
    unwind_rules: u32,
    task: task::TaskOffsets,
    fsbase_offset: u32,
    filter_pids: u8,
    filter_cgroups: u32,
    wake_for_processes: u8,
    log_level: u8,
}

impl Settings {
    fn new(config: &SamplerConfig<'_>, variant: Variant, cpus: usize) -> Self {
        let ring_bytes = ring_buffer_bytes(config.frequency_hz, cpus as u64);
        // Table walks send stack copies (up to COPY_BYTES each, COPIES_PER_SECOND per CPU):
        // room for a drain interval's worth of them on every CPU besides.
        let ring_bytes = if variant.tables {
            let copies = u64::from(unwind::COPIES_PER_SECOND) * DRAIN_INTERVAL_MS / 1000
                * unwind::COPY_BYTES as u64
                * cpus as u64;
            u32::try_from((u64::from(ring_bytes) + copies).next_power_of_two())
                .unwrap_or(ring_bytes)
        } else {
            ring_bytes
        };
        // One entry without the table walk: the arrays are allocated in full at load.
        // UNWIND_ROWS holds 4-byte entries (kernel rows and page indexes).
        let (unwind_rows, unwind_rules) = if variant.tables {
            let rows = u32::try_from(config.unwind_memory / 4)
                .unwrap_or(u32::MAX)
                .max(2)
                / unwind::WORDS_PER_ELEMENT;
            (rows, unwind::MAX_RULES / unwind::WORDS_PER_ELEMENT)
        } else {
            (1, 1)
        };
        Self {
            ring_bytes,
            unwind_rows,
            unwind_rules,
            task: task::TaskOffsets::get(),
            fsbase_offset: if variant.python {
                config.python_fsbase_offset.unwrap_or(0)
            } else {
                0
            },
            filter_pids: u8::from(!config.pids.is_empty()),
            filter_cgroups: config.cgroups.len() as u32,
            wake_for_processes: u8::from(config.wake_for_processes),
            log_level: ebpf_log::level(),
        }
    }

    /// Every option on, so no load-time constant lets the verifier skip code: the most any
    /// run can ask of it (`check`). Maps at their smallest.
    fn worst_case() -> Self {
        Self {
            ring_bytes: ring_buffer_bytes(1, 1),
            unwind_rows: 1,
            unwind_rules: 1,
            task: task::TaskOffsets::worst_case(),
            // Any offset makes the Python walk live; its value is only read at run time.
            fsbase_offset: 8,
            filter_pids: 1,
            filter_cgroups: MAX_CGROUP_FILTER,
            wake_for_processes: 1,
            log_level: ebpf_log::MAX_LEVEL,
        }
    }
}

/// Parses the object and creates its maps with their load-time sizes and values; the
/// tracers' maps at their smallest (each tracer loads the object again: `load_tracer`).
fn load_object(settings: &Settings) -> Result<Ebpf, BpfError> {
    let s = settings;
    let wakeup_bytes = u64::from(s.ring_bytes / WAKEUP_FRACTION);
    let task = s.task.globals();
    let mut loader = with_globals(&task);
    shrink(&mut loader, TRACER_MAPS);
    Ok(loader
        .override_global(ebpf_log::GLOBAL_LOG_LEVEL, &s.log_level, true)
        .override_global(py::GLOBAL_FSBASE_OFFSET, &s.fsbase_offset, true)
        .override_global(GLOBAL_FILTER_PIDS, &s.filter_pids, true)
        .override_global(GLOBAL_FILTER_CGROUPS, &s.filter_cgroups, true)
        .override_global(GLOBAL_WAKEUP_BYTES, &wakeup_bytes, true)
        .override_global(GLOBAL_WAKE_FOR_PROCESSES, &s.wake_for_processes, true)
        .map_max_entries(MAP_SAMPLES, s.ring_bytes)
        .map_max_entries(unwind::MAP_ROWS, s.unwind_rows)
        .map_max_entries(unwind::MAP_RULES, s.unwind_rules)
        .load(SAMPLER_OBJECT)?)
}

/// The maps of the tracers that load the object on their own (`churn`, `runq`), and the
/// sampler's largest: each load makes the ones it does not use as small as they can be.
const TRACER_MAPS: &[&str] = &[
    profiler_common::churn::MAP_CHURN_PATHS,
    profiler_common::churn::MAP_ATTACH,
    profiler_common::runq::MAP_THREADS,
    profiler_common::runq::MAP_CPU_HIST,
    profiler_common::runq::MAP_CGROUP_HIST,
];
const SAMPLER_MAPS: &[&str] = &[
    MAP_SAMPLES,
    profiler_common::exits::MAP_EXITS,
    unwind::MAP_ROWS,
    unwind::MAP_RULES,
];

/// A loader with the load-time globals `globals` (name, value) set.
fn with_globals<'a>(globals: &'a [(&'static str, u64)]) -> EbpfLoader<'a> {
    let mut loader = EbpfLoader::new();
    for (global, value) in globals {
        loader.override_global(global, value, true);
    }
    loader
}

/// Makes `maps` as small as the kernel allows: one entry, a page of ring buffer.
fn shrink(loader: &mut EbpfLoader<'_>, maps: &[&'static str]) {
    for &name in maps {
        let ring = name == MAP_SAMPLES || name == profiler_common::exits::MAP_EXITS;
        loader.map_max_entries(name, if ring { 4096 } else { 1 });
    }
}

/// The object for a tracer that uses the maps `keep` of `TRACER_MAPS` and none of the
/// sampler's, every other large map at its smallest, with the load-time globals `extra`
/// besides the task offsets.
fn load_tracer(keep: &[&str], extra: &[(&'static str, u64)]) -> Result<Ebpf, BpfError> {
    let mut globals = task::TaskOffsets::get().globals().to_vec();
    globals.extend_from_slice(extra);
    let mut loader = with_globals(&globals);
    shrink(&mut loader, SAMPLER_MAPS);
    let others: Vec<&'static str> = TRACER_MAPS
        .iter()
        .copied()
        .filter(|m| !keep.contains(m))
        .collect();
    shrink(&mut loader, &others);
    Ok(loader.load(SAMPLER_OBJECT)?)
}

/// Fills the in-kernel filters: the cgroups of `--cgroup` and the pids of `--pid`.
fn fill_filters(
    ebpf: &mut Ebpf,
    pids: &[u32],
    cgroup_dirs: &[std::fs::File],
) -> Result<(), BpfError> {
    if !cgroup_dirs.is_empty() {
        let mut map = CgroupArray::try_from(
            ebpf.map_mut(MAP_CGROUP_FILTER)
                .ok_or(BpfError::Missing("cgroup map"))?,
        )?;
        // The map holds a reference to each cgroup; the descriptors can close after.
        for (i, dir) in cgroup_dirs.iter().enumerate() {
            map.set(i as u32, std::os::fd::AsFd::as_fd(dir), 0)?;
        }
    }
    if !pids.is_empty() {
        let mut map: HashMap<_, u32, u8> = HashMap::try_from(
            ebpf.map_mut(MAP_PID_FILTER)
                .ok_or(BpfError::Missing("pid map"))?,
        )?;
        for pid in pids {
            map.insert(pid, 1, 0)?;
        }
    }
    Ok(())
}

/// Loads `variant`'s program into the kernel (the verifier runs here).
fn load_program(ebpf: &mut Ebpf, variant: Variant) -> Result<(), BpfError> {
    let name = variant.program();
    let program: &mut PerfEvent = ebpf
        .program_mut(name)
        .ok_or(BpfError::Missing("sampler program"))?
        .try_into()?;
    let verify_started = std::time::Instant::now();
    program.load().map_err(|e| rejected(name, e))?;
    log::debug!(
        "{name} verified in {:.3} s ({:?} instructions)",
        verify_started.elapsed().as_secs_f64(),
        program
            .info()
            .ok()
            .as_ref()
            .and_then(aya::programs::ProgramInfo::verified_instruction_count)
    );
    Ok(())
}

/// The table walk's maps, taken from the object: the rows (`words` 4-byte entries), the
/// rules and the processes' mappings, for `unwind::Loader` to fill.
pub(crate) struct UnwindMaps {
    pub rows: Map,
    pub words: u32,
    pub rules: Map,
    pub procs: Map,
}

fn take_unwind_maps(ebpf: &mut Ebpf, settings: &Settings) -> Result<UnwindMaps, BpfError> {
    let mut take = |name, what| ebpf.take_map(name).ok_or(BpfError::Missing(what));
    Ok(UnwindMaps {
        rows: take(unwind::MAP_ROWS, "unwind rows")?,
        words: settings.unwind_rows * unwind::WORDS_PER_ELEMENT,
        rules: take(unwind::MAP_RULES, "unwind rules")?,
        procs: take(unwind::MAP_PROCS, "unwind mappings")?,
    })
}

/// Loads and attaches `PROGRAM_PY_EXEC` (profiler-ebpf `python_exec`).
fn attach_python_exec(ebpf: &mut Ebpf) -> Result<(), BpfError> {
    let program: &mut aya::programs::RawTracePoint = ebpf
        .program_mut(py::PROGRAM_PY_EXEC)
        .ok_or(BpfError::Missing("python exec program"))?
        .try_into()?;
    program
        .load()
        .map_err(|e| rejected(py::PROGRAM_PY_EXEC, e))?;
    program.attach("sched_process_exec")?;
    Ok(())
}

/// A program load error as one line: the verifier's reason. At -v (info) its whole log goes
/// to a file, named in the log: thousands of lines do not belong on a terminal.
fn rejected(program: &str, e: aya::programs::ProgramError) -> BpfError {
    match e {
        aya::programs::ProgramError::LoadError { verifier_log, .. } => {
            let log = verifier_log.to_string();
            if log::log_enabled!(log::Level::Info) {
                match save_verifier_log(program, &log) {
                    Ok(path) => log::info!(
                        "{program}: the verifier's log ({} lines) is in {}",
                        log.lines().count(),
                        path.display()
                    ),
                    Err(e) => log::info!("{program}: cannot save the verifier's log: {e}"),
                }
            }
            BpfError::Rejected {
                program: program.to_owned(),
                reason: features::verifier_reason(&log).to_owned(),
            }
        }
        other => BpfError::Program(other),
    }
}

/// Writes a verifier log to a new file in the temporary directory; returns its path.
fn save_verifier_log(program: &str, log: &str) -> std::io::Result<PathBuf> {
    use std::io::Write as _;
    let mut file = tempfile::Builder::new()
        .prefix(&format!("profiler-verifier-{program}-"))
        .suffix(".log")
        .tempfile()?;
    file.write_all(log.as_bytes())?;
    let (_, path) = file.keep().map_err(|e| e.error)?;
    Ok(path)
}

/// The sampler, attached: dropping it detaches from every CPU.
pub(crate) struct Sampler {
    // Dropping Ebpf unloads the program and closes the perf events (see `detach`).
    ebpf: Option<Ebpf>,
    counters: PerCpuArray<MapData, u64>,
    /// CPUs the program is attached on.
    pub cpus: Vec<u32>,
    /// The Python processes map, until the collector takes it (`take_python_map`).
    python_map: Option<HashMap<MapData, u32, py::PyProc>>,
    python_counters: Option<PerCpuArray<MapData, u64>>,
    /// Exit statuses of processes (`exits`), until the collector takes them.
    exits: Option<RingBuf<MapData>>,
    /// The variant loaded, the ones refused before it, and what that lost (one line each).
    variant: Variant,
    refusals: Vec<Refusal>,
    lost: Vec<String>,
    /// The programs' debug log (`-vv` only).
    _log: Option<ebpf_log::EbpfLog>,
}

/// Counters kept by the sampler (sums over CPUs); see `profiler_common::counter`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct KernelCounters {
    pub sent: u64,
    pub lost_ringbuf_full: u64,
    pub filtered: u64,
    pub kstack_failed: u64,
    pub ustack_failed: u64,
    /// Table walks stopped early, by `unwind::reason` code (index 0 unused).
    pub unwind_truncated: unwind::ByReason,
    /// Samples given a stack copy, and samples sent without the copy they wanted
    /// (`counter::STACK_COPIES_REFUSED`).
    pub stack_copies: u64,
    pub stack_copies_refused: u64,
}

/// Options for `Sampler::start`.
pub(crate) struct SamplerConfig<'a> {
    pub event: Event,
    /// Samples per second per CPU.
    pub frequency_hz: u64,
    /// Sample only these processes (tgids); empty = all.
    pub pids: &'a [u32],
    /// Sample only tasks in these cgroup2 directories or below (full paths under the cgroup2
    /// mount, at most `MAX_CGROUP_FILTER`); empty = all.
    pub cgroups: &'a [PathBuf],
    /// Walk user stacks by unwind table where the kernel allows it (a variant with the
    /// table walk and its maps); false: frame pointers only.
    pub table_walk: bool,
    /// Bytes of kernel memory for unwind rows (`--unwind-memory`).
    pub unwind_memory: u64,
    /// Walk Python frames in registered processes: the offset of `thread.fsbase` in
    /// `task_struct` (`python::KernelFacts`); None = off.
    pub python_fsbase_offset: Option<u32>,
    /// A new process's first sample wakes the reader (`GLOBAL_WAKE_FOR_PROCESSES`).
    pub wake_for_processes: bool,
}

impl Sampler {
    /// Loads and attaches the most capable sampler variant the kernel accepts, from what
    /// `config` asks down to frame pointers only (`variant`). Needs CAP_BPF + CAP_PERFMON (or
    /// root). Returns the sampler and the ring buffer its samples stream through.
    ///
    /// When the loaded variant walks tables, `on_unwind_maps` gets their maps before the
    /// program is attached: what it loads (the processes asked for by pid) is walked by table
    /// from the first sample.
    pub(crate) fn start(
        config: &SamplerConfig<'_>,
        on_unwind_maps: &mut dyn FnMut(UnwindMaps) -> std::io::Result<()>,
    ) -> Result<(Self, RingBuf<MapData>), BpfError> {
        if config.event == Event::Cycles && !Path::new("/sys/bus/event_source/devices/cpu").exists()
        {
            return Err(BpfError::NoPmu);
        }
        let features = features::KernelFeatures::probe();
        log::info!("kernel features: {}", features.summary());
        if !features.ring_buffer {
            return Err(BpfError::NoRingBuffer);
        }
        for line in features.degraded() {
            log::warn!("{line}");
        }
        if config.cgroups.len() > MAX_CGROUP_FILTER as usize {
            return Err(BpfError::TooManyCgroups(config.cgroups.len()));
        }
        // Open before loading: a cgroup that cannot be opened fails without loading anything.
        let cgroup_dirs = config
            .cgroups
            .iter()
            .map(|p| std::fs::File::open(p).map_err(|e| BpfError::Cgroup(p.clone(), e)))
            .collect::<Result<Vec<_>, _>>()?;
        let cpus = aya::util::online_cpus().map_err(|(what, e)| BpfError::Cpus(what, e))?;
        let asked = Variant {
            tables: config.table_walk,
            python: config.python_fsbase_offset.is_some(),
        };
        let mut refusals = Vec::new();
        for variant in asked.fallbacks() {
            let refused = |reason: String| Refusal { variant, reason };
            if variant.refused_by_env() {
                refusals.push(refused(format!(
                    "refused for a test ({})",
                    variant::REFUSE_ENV
                )));
                continue;
            }
            if variant.needs_bpf_loop() && !features.bpf_loop {
                refusals.push(refused(
                    "this kernel has no bpf_loop helper (Linux 5.17+)".into(),
                ));
                continue;
            }
            let settings = Settings::new(config, variant, cpus.len());
            let mut ebpf = load_object(&settings)?;
            fill_filters(&mut ebpf, config.pids, &cgroup_dirs)?;
            match load_program(&mut ebpf, variant) {
                Ok(()) => {}
                Err(BpfError::Rejected { reason, .. }) => {
                    refusals.push(refused(reason));
                    continue;
                }
                Err(e) => return Err(e),
            }
            let lost = variant::lost_lines(asked, variant, &refusals);
            if variant.tables {
                on_unwind_maps(take_unwind_maps(&mut ebpf, &settings)?)
                    .map_err(BpfError::UnwindMaps)?;
            }
            return Self::attach(ebpf, config, &settings, cpus, variant, refusals, lost);
        }
        // Nothing loads: the last (simplest) variant's refusal is the error.
        let last = refusals.pop().expect("frame pointers only is always tried");
        Err(BpfError::Rejected {
            program: last.variant.program().to_owned(),
            reason: last.reason,
        })
    }

    /// Attaches the loaded `variant` on every CPU and takes the maps the collector reads.
    fn attach(
        mut ebpf: Ebpf,
        config: &SamplerConfig<'_>,
        settings: &Settings,
        cpus: Vec<u32>,
        variant: Variant,
        refusals: Vec<Refusal>,
        lost: Vec<String>,
    ) -> Result<(Self, RingBuf<MapData>), BpfError> {
        let (perf_config, policy) = match config.event {
            // A fixed period in ns gives evenly spaced samples on the timer.
            Event::CpuClock => (
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                SamplePolicy::Period(1_000_000_000 / config.frequency_hz),
            ),
            Event::Cycles => (
                PerfEventConfig::Hardware(HardwareEvent::CpuCycles),
                SamplePolicy::Frequency(config.frequency_hz),
            ),
        };
        let program: &mut PerfEvent = ebpf
            .program_mut(variant.program())
            .ok_or(BpfError::Missing("sampler program"))?
            .try_into()?;
        for &cpu in &cpus {
            program.attach(
                perf_config,
                PerfEventScope::AllProcessesOneCpu { cpu },
                policy,
                false,
            )?;
        }
        // Exit statuses are a nicety: a kernel that refuses the tracepoint still samples.
        if settings.task.exit_code.is_none() {
            log::warn!(
                "cannot find task_struct.exit_code in /sys/kernel/btf/vmlinux: exit statuses are not recorded"
            );
        }
        let exits = settings
            .task
            .exit_code
            .is_some()
            .then(|| exits::attach(&mut ebpf))
            .and_then(|r| {
                r.map_err(|e| {
                    log::warn!("exit statuses are not recorded: {}", crate::util::chain(&e));
                })
                .ok()
            });
        // The agent's reader is not woken by new processes: a new Python process's first
        // samples wake it instead, so its frames are named from its first second on.
        if variant.python
            && !config.wake_for_processes
            && let Err(e) = attach_python_exec(&mut ebpf)
        {
            log::warn!(
                "new Python processes wait for the next drain: {}",
                crate::util::chain(&e)
            );
        }
        let log = ebpf_log::EbpfLog::start(&mut ebpf);
        let samples = RingBuf::try_from(
            ebpf.take_map(MAP_SAMPLES)
                .ok_or(BpfError::Missing("ring buffer"))?,
        )?;
        let counters = PerCpuArray::try_from(
            ebpf.take_map(MAP_COUNTERS)
                .ok_or(BpfError::Missing("counters"))?,
        )?;
        let (python_map, python_counters) = if variant.python {
            let map = HashMap::try_from(
                ebpf.take_map(py::MAP_PY_PROCS)
                    .ok_or(BpfError::Missing("Python map"))?,
            )?;
            let counters = PerCpuArray::try_from(
                ebpf.take_map(py::MAP_PY_COUNTERS)
                    .ok_or(BpfError::Missing("Python counters"))?,
            )?;
            (Some(map), Some(counters))
        } else {
            (None, None)
        };
        Ok((
            Sampler {
                ebpf: Some(ebpf),
                counters,
                cpus,
                python_map,
                python_counters,
                exits,
                variant,
                refusals,
                lost,
                _log: log,
            },
            samples,
        ))
    }

    /// The variant loaded (`variant::Variant`).
    pub(crate) fn variant(&self) -> Variant {
        self.variant
    }

    /// The variants the kernel refused before this one loaded.
    pub(crate) fn refusals(&self) -> &[Refusal] {
        &self.refusals
    }

    /// One line per part of what was asked that the loaded variant lacks, and why.
    pub(crate) fn lost(&self) -> &[String] {
        &self.lost
    }

    /// The ring buffer of process exit statuses (`profiler_common::exits`), once; None when
    /// the kernel's BTF or the tracepoint is missing.
    pub(crate) fn take_exits(&mut self) -> Option<RingBuf<MapData>> {
        self.exits.take()
    }

    /// Stops sampling on every CPU; the ring buffer and counters stay readable.
    pub(crate) fn detach(&mut self) {
        self.ebpf = None;
    }

    /// The map the collector registers Python processes in (once; None when Python is off).
    pub(crate) fn take_python_map(&mut self) -> Option<HashMap<MapData, u32, py::PyProc>> {
        self.python_map.take()
    }

    /// The Python walk's counters (`profiler_common::python::counter`), summed over CPUs;
    /// None when Python is off.
    pub(crate) fn python_counters(
        &self,
    ) -> Result<Option<[u64; py::counter::COUNT as usize]>, BpfError> {
        let Some(map) = &self.python_counters else {
            return Ok(None);
        };
        let mut out = [0u64; py::counter::COUNT as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = map.get(&(i as u32), 0)?.iter().sum();
        }
        Ok(Some(out))
    }

    /// Current counter values, summed over CPUs.
    pub(crate) fn counters(&self) -> Result<KernelCounters, BpfError> {
        let read = |index: u32| -> Result<u64, BpfError> {
            Ok(self.counters.get(&index, 0)?.iter().sum())
        };
        Ok(KernelCounters {
            sent: read(counter::SENT)?,
            lost_ringbuf_full: read(counter::LOST_RINGBUF_FULL)?,
            filtered: read(counter::FILTERED)?,
            kstack_failed: read(counter::KSTACK_FAILED)?,
            ustack_failed: read(counter::USTACK_FAILED)?,
            unwind_truncated: {
                let mut by_reason = unwind::ByReason::default();
                for (code, n) in by_reason.0.iter_mut().enumerate().skip(1) {
                    *n = read(counter::UNWIND_REASON_BASE + code as u32)?;
                }
                by_reason
            },
            stack_copies: read(counter::STACK_COPIES)?,
            stack_copies_refused: read(counter::STACK_COPIES_REFUSED)?,
        })
    }
}
