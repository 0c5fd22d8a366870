//! `profiler doctor`, a front end over the whole flow: for one window it traces cgroup churn
//! and profiles every CPU at once, then joins that with the dying-cgroup figures
//! (`crate::cgroups`) into findings and a verdict. The incident it is built for: a CPU
//! starved by kubelet reading memory statistics while tens of thousands of dying memcgs,
//! left by a crash-looping creator, make every read slow.
mod churn;
mod json;
pub(crate) mod kmsg;
use crate::profile::memcg;
mod report;
pub(crate) mod verdict;

use std::time::Duration;

pub(crate) use report::{json, text};

use crate::{
    bpf::{
        Event,
        churn::{ChurnCount, ChurnTracer},
    },
    cgroups::{self, Snapshot},
    profile::lifecycle::{self, Program},
    record::{KERNEL_RECORD_BYTES, Progress, RecordConfig, record_blocking},
    session::SessionConfig,
    session::SessionError,
};

/// What to look at.
#[derive(Clone, Debug)]
pub(crate) struct DoctorConfig {
    /// Length of the observation window.
    pub duration: Duration,
    /// Profile sampling rate per CPU, Hz.
    pub frequency_hz: u32,
    /// How user stacks are walked (`--unwind`), and the kernel memory for the tables.
    pub unwind: crate::unwind::UnwindMode,
    pub unwind_memory: u64,
    /// Name Python frames (`--python`).
    pub python: bool,
}

/// Everything the doctor measured, the input of the verdict and of both renderings.
#[derive(Clone, Debug)]
pub(crate) struct Findings {
    /// Length of the profile window, s.
    pub duration_s: f64,
    /// Samples in the profile (all CPUs).
    pub samples: u64,
    /// Sampling rate per CPU, Hz.
    pub frequency_hz: u32,
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// Dying cgroups at the end of the window.
    pub cgroups: Snapshot,
    /// Dying memory cgroups (v1 memory, else cgroup2's root) at the window's start and end.
    pub dying_memory: Option<(u64, u64)>,
    /// Processes that made or removed cgroups during the window, most first; a short-lived
    /// helper's churn is its supervisor's (`churn::charge_to_supervisors`).
    pub churn: Vec<ChurnCount>,
    /// Why churn could not be traced, if it could not.
    pub churn_error: Option<String>,
    /// Programs that started or exited during the window, by executable and cgroup, most
    /// failing first (crash loops all, others at most `PROGRAMS_SHOWN`).
    pub programs: Vec<Program>,
    /// Why processes could not be linked to cgroups, if they could not.
    pub attach_error: Option<String>,
    /// Starvation symptoms the kernel logged during the window.
    pub kernel_events: Vec<kmsg::KernelEvent>,
    /// Each symptom after the saturated CPU run before it (`kmsg::timeline`).
    pub timeline: Vec<String>,
    /// Why the kernel log could not be read, if it could not.
    pub kernel_log_error: Option<String>,
    /// Per CPU: (cpu, busy percent).
    pub cpus: Vec<(u32, f64)>,
    /// Per CPU, the processes that kept it busiest.
    pub cpu_top: Vec<(u32, Vec<memcg::CpuShare>)>,
    /// Catalogue functions this kernel has / lacks.
    pub memcg_present: Vec<&'static str>,
    pub memcg_absent: Vec<&'static str>,
    /// Processes with CPU in memcg code, most samples first (at most 10).
    pub memcg: Vec<memcg::MemcgShare>,
    /// Threads that waited at least `verdict::STARVED_WARN` for a CPU, longest first, with
    /// who ran there meanwhile; None when run-queue waits could not be traced.
    pub starved: Option<Vec<Starved>>,
}

/// A thread's longest wait for a CPU, and who held that CPU meanwhile.
#[derive(Clone, Debug)]
pub(crate) struct Starved {
    pub tid: u32,
    pub pid: u32,
    pub comm: String,
    pub wait_s: f64,
    pub cpu: u32,
    /// When the wait began, s from the window's start.
    pub at_s: f64,
    /// At most `CPU_TOP`, most first.
    pub instead: Vec<crate::profile::runq::RanInstead>,
}

/// Starved threads named at most.
const STARVED_SHOWN: usize = 10;

/// The window's starved threads (see `Findings::starved`).
fn starved(profile: &crate::profile::Profile) -> Option<Vec<Starved>> {
    profile.runq.as_ref()?;
    let min_ns = (verdict::STARVED_WARN * 1e9) as u64;
    let waits = crate::profile::runq::longest_waits(profile, min_ns, STARVED_SHOWN);
    Some(
        waits
            .into_iter()
            .map(|w| Starved {
                tid: w.thread.tid,
                pid: w.thread.pid,
                comm: w.thread.comm.clone(),
                wait_s: w.thread.max_delay_ns as f64 / 1e9,
                cpu: w.thread.max_cpu,
                at_s: w.thread.max_start_ns() as f64 / 1e9,
                instead: w.instead.into_iter().take(CPU_TOP).collect(),
            })
            .collect(),
    )
}

/// Processes named per CPU (who kept it busy).
const CPU_TOP: usize = 3;

/// Programs listed besides crash loops.
pub(crate) const PROGRAMS_SHOWN: usize = 10;

/// Runs the window and gathers the findings.
pub(crate) fn examine(
    config: &DoctorConfig,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Findings, SessionError> {
    // Churn is counted in the kernel while the profile records; a failure to attach is
    // reported in the findings rather than stopping the rest.
    let tracer = ChurnTracer::start();
    let kmsg = kmsg::KmsgWatch::start();
    let dying_at_start = dying_memory();
    let profile = record_window(config, progress)?;
    let traced = Traced::read(&tracer);
    drop(tracer);
    let kallsyms = std::fs::read_to_string("/proc/kallsyms").map_err(SessionError::Kallsyms)?;
    let memcg_present = memcg::present_in_kallsyms(&kallsyms);
    let memcg_absent = memcg::CATALOGUE
        .iter()
        .copied()
        .filter(|n| !memcg_present.contains(n))
        .collect();
    let duration_s = profile.meta.duration_ns as f64 / 1e9;
    let (kernel_events, kernel_log_error) = match kmsg {
        Ok(k) => (k.finish(profile.meta.start_mono_ns), None),
        Err(e) => (Vec::new(), Some(format!("/dev/kmsg: {e}"))),
    };
    let timeline = kmsg::timeline(&kernel_events, &profile);
    let mut shares = memcg::shares(&profile, &memcg_present);
    shares.truncate(10);
    Ok(Findings {
        duration_s,
        samples: profile.samples.len() as u64,
        frequency_hz: profile.meta.frequency_hz,
        kernel: profile.meta.kernel_release.clone(),
        cgroups: cgroups::snapshot(),
        dying_memory: dying_at_start.zip(dying_memory()),
        programs: programs_in(&profile, &traced.attaches, duration_s),
        churn: churn_by_causer(traced.churn, &profile.lifetimes),
        churn_error: traced.churn_error,
        attach_error: traced.attach_error,
        kernel_events,
        timeline,
        kernel_log_error,
        cpus: memcg::cpu_busy(&profile),
        cpu_top: memcg::cpu_top(&profile, CPU_TOP),
        memcg_present,
        memcg_absent,
        memcg: shares,
        starved: starved(&profile),
    })
}

/// The profile of the doctor's window: every CPU, every process.
fn record_window(
    config: &DoctorConfig,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<crate::profile::Profile, SessionError> {
    record_blocking(
        &RecordConfig {
            session: SessionConfig {
                event: Event::CpuClock,
                frequency_hz: config.frequency_hz,
                pids: Vec::new(),
                comms: Vec::new(),
                cgroups: Vec::new(),
                unwind: config.unwind,
                unwind_memory: config.unwind_memory,
                unwind_tables: crate::unwind::TablePolicy::All,
                python: config.python,
                // Who waited for a CPU, and behind whom: the starved threads' finding.
                runq: true,
                unwind_cache: None,
                kernel_record_bytes: KERNEL_RECORD_BYTES,
                wake_for_processes: true,
                settle_delay: None,
            },
            duration: config.duration,
            inline: false,
        },
        progress,
    )
}

/// What the churn tracer saw over the window, or why it could not.
struct Traced {
    churn: Vec<ChurnCount>,
    churn_error: Option<String>,
    /// (pid, cgroup path) moves.
    attaches: Vec<(u32, String)>,
    attach_error: Option<String>,
}

impl Traced {
    fn read(tracer: &Result<ChurnTracer, crate::bpf::BpfError>) -> Self {
        let (churn, churn_error) = match tracer {
            Ok(t) => (t.counts(), None),
            Err(e) => (Vec::new(), Some(crate::util::chain(e))),
        };
        let (attaches, attach_error) = match tracer.as_ref().map(ChurnTracer::attaches) {
            Ok(Some(a)) => (a, None),
            Ok(None) => (
                Vec::new(),
                Some(
                    "the kernel refused the cgroup_attach_task tracer (see the warning)".to_owned(),
                ),
            ),
            Err(e) => (Vec::new(), Some(crate::util::chain(e))),
        };
        Traced {
            churn,
            churn_error,
            attaches,
            attach_error,
        }
    }
}

/// The window's programs by cgroup place: every crash loop and the `PROGRAMS_SHOWN` others
/// with the most failing exits, their starters named from /proc (supervisors usually started
/// before the window).
fn programs_in(
    profile: &crate::profile::Profile,
    attaches: &[(u32, String)],
    duration_s: f64,
) -> Vec<Program> {
    let cgroup_of = lifecycle::cgroup_of(&profile.lifetimes, attaches);
    let programs = lifecycle::programs(&profile.lifetimes, &cgroup_of, false, duration_s);
    let mut programs = lifecycle::loops_and_top(programs, PROGRAMS_SHOWN);
    for p in &mut programs {
        p.name_starters(crate::util::proc_comm);
    }
    programs
}

/// The tracer's churn charged to who causes it (`churn::charge_to_supervisors`), the
/// processes the records did not name named from /proc.
fn churn_by_causer(
    churn: Vec<ChurnCount>,
    lifetimes: &[crate::profile::Lifetime],
) -> Vec<ChurnCount> {
    let alive = |pid: u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    let mut churn =
        churn::charge_to_supervisors(churn, lifetimes, cgroups::hierarchies().len(), alive);
    for c in churn.iter_mut().filter(|c| c.comm.is_empty()) {
        c.comm = crate::util::proc_comm(c.pid).unwrap_or_default();
    }
    churn
}

/// Dying memory cgroups now: the v1 memory controller's, else cgroup2's root count (memcgs
/// are most of what dies there).
fn dying_memory() -> Option<u64> {
    let counts = cgroups::dying_counts();
    let of = |name: &str| counts.iter().find(|(c, _)| c == name).map(|(_, n)| *n);
    of("memory").or_else(|| of("v2"))
}
