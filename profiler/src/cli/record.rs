//! `profiler record`: sample, collect, symbolize, write every output.
use std::{path::PathBuf, time::Duration};

use anyhow::bail;

use crate::{
    bpf::Event,
    profile::GroupBy,
    record::{KERNEL_RECORD_BYTES, RecordConfig, record_blocking},
    session::SessionConfig,
    unwind::{TablePolicy, UnwindMode},
    util::{self, InputError, status},
};

#[derive(Debug, clap::Args)]
pub struct RecordArgs {
    /// Samples per second on each CPU (1..=10000).
    #[arg(short = 'F', long, default_value_t = 99, value_name = "HZ", value_parser = parse_frequency)]
    pub frequency: u32,
    /// What drives sampling: the cpu-clock timer, or hardware cycles (needs a PMU).
    #[arg(long, value_enum, default_value_t = Event::CpuClock)]
    pub event: Event,
    /// How long to record: 10s, 500ms, 2m... Ctrl-C stops earlier and still writes outputs.
    #[arg(short, long, default_value = "10s", value_parser = util::parse_duration)]
    pub duration: Duration,
    /// Only this process (repeatable, or a list: -p 12,34). Filtered in the kernel.
    #[arg(short, long = "pid", value_name = "PID", value_delimiter = ',')]
    pub pids: Vec<u32>,
    /// Only threads with this comm (repeatable), e.g. --comm kubelet: the kernel's name of a
    /// thread, at most 15 bytes, matched whole.
    #[arg(long = "comm", value_name = "NAME", value_parser = util::parse_comm)]
    pub comms: Vec<String>,
    /// Only tasks in this cgroup or below it (repeatable: any of them). PATH is relative to a
    /// hierarchy (/system.slice/kubelet.service, /kubepods/burstable/pod...) or a full path
    /// under a cgroup mount (/sys/fs/cgroup/memory/lab, /sys/fs/cgroup/unified/x). A cgroup2
    /// path (a relative path is looked up there first) is filtered in the kernel: filtered
    /// samples cost one helper call and are counted as filtered. A path found only in v1
    /// hierarchies (e.g. memory) is filtered in userspace from /proc/PID/cgroup, as is every
    /// path when v1 and v2 ones are mixed. A path in no hierarchy is an error.
    #[arg(long = "cgroup", value_name = "PATH")]
    pub cgroups: Vec<String>,
    #[arg(short, long = "output", value_name = "FILE", help = crate::output::RECORD_OUTPUT_HELP)]
    pub outputs: Vec<PathBuf>,
    /// Root frame of every stack in .folded and .svg outputs.
    #[arg(long, value_enum, default_value_t = GroupBy::Comm)]
    pub group_by: GroupBy,
    /// Expand functions inlined by the compiler into frames of their own, named
    /// `func (inlined)`, from the binaries' DWARF (slower symbolization).
    #[arg(long)]
    pub inline: bool,
    /// How user stacks are walked: `dwarf` by tables compiled from each binary's .eh_frame
    /// (whole stacks through code without frame pointers: Debian's packages, libc), `fp` by
    /// frame pointers only (cheapest), `auto` by table except binaries that keep frame
    /// pointers. A process's first samples, before its tables are loaded, are walked by frame
    /// pointer.
    #[arg(long, value_enum, default_value_t = UnwindMode::Auto)]
    pub unwind: UnwindMode,
    /// Kernel memory for unwind tables (4 bytes a row; libc needs about 110 KiB): 64M, 512K...
    /// Binaries beyond it are walked by frame pointer.
    #[arg(long, default_value = "64M", value_name = "BYTES", value_parser = crate::util::parse_bytes)]
    pub unwind_memory: u64,
    /// Which binaries of a sampled process get unwind tables: `all` it maps, at its first
    /// sample (its first stacks are whole), or only those its stacks `reached` (the agent's
    /// default: a process that maps fifty libraries and runs in three costs three tables;
    /// its stacks are whole after a sample per binary they cross).
    #[arg(long, value_enum, default_value_t = TablePolicy::All)]
    pub unwind_tables: TablePolicy,
    /// Where compiled unwind tables are kept between recordings, keyed by build id (at most
    /// 256 MiB; default ~/.cache/profiler/unwind-tables), or `off`.
    #[arg(long, value_name = "DIR|off")]
    pub unwind_cache: Option<PathBuf>,
    /// Name Python functions in CPython 3.11-3.13 processes: each eval-loop frame becomes
    /// the `qualname (file.py:LINE)` frames it ran. `off` shows the eval loop only.
    #[arg(long, value_enum, default_value_t = OnOff::On, value_name = "on|off")]
    pub python: OnOff,
    /// Time every thread's waits for a CPU (run-queue latency: from its wake-up or
    /// preemption until it runs), per CPU and per cgroup, with each thread's longest wait and
    /// who ran on that CPU meanwhile: `report CAPTURE --runq`. Costs about 0.4 us of CPU per
    /// context switch (BENCHMARKS.md): 1% of a CPU that switches 25,000 times a second.
    #[arg(long, value_enum, default_value_t = OnOff::On, value_name = "on|off")]
    pub runq: OnOff,
}

/// A feature switch given as `on` or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

/// The highest sampling frequency `record` and the doctor take, Hz.
pub(crate) const MAX_HZ: u32 = 10_000;

/// `-F`: a whole number of Hz in 1..=MAX_HZ.
pub(crate) fn parse_frequency(text: &str) -> Result<u32, InputError> {
    crate::util::parse_hz(text, MAX_HZ)
}

pub(super) fn run(args: RecordArgs) -> anyhow::Result<()> {
    // Every check that can fail happens before sampling starts, so no recording is wasted.
    let paths = if args.outputs.is_empty() {
        default_outputs(std::path::Path::new(""))
    } else {
        args.outputs.clone()
    };
    let outputs = super::parse_outputs(&paths, args.group_by)?;
    for o in &outputs {
        o.check_writable()?;
    }
    for pid in &args.pids {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            bail!("no process with pid {pid} is running (check it with `ps -p {pid}`)");
        }
    }
    for comm in &args.comms {
        if let Some(hint) = comm_hint(comm) {
            status!("warning: {hint}");
        }
    }
    let hierarchies = crate::cgroups::hierarchies();
    let mut cgroups = Vec::new();
    for path in &args.cgroups {
        cgroups.extend(crate::cgroups::resolve_target(path, &hierarchies)?);
    }
    super::check_privileges()?;

    let config = RecordConfig {
        session: SessionConfig {
            event: args.event,
            frequency_hz: args.frequency,
            pids: args.pids.clone(),
            comms: args.comms.clone(),
            cgroups,
            unwind: args.unwind,
            unwind_memory: args.unwind_memory,
            unwind_tables: args.unwind_tables,
            unwind_cache: match &args.unwind_cache {
                Some(dir) if dir.as_os_str() == "off" => None,
                Some(dir) => Some(dir.clone()),
                None => crate::unwind::cache::TableCache::default_dir(),
            },
            python: args.python == OnOff::On,
            runq: args.runq == OnOff::On,
            kernel_record_bytes: KERNEL_RECORD_BYTES,
            wake_for_processes: true,
            settle_delay: None,
        },
        duration: args.duration,
        inline: args.inline,
    };
    // A perf event per CPU, and a file per binary mapped: more than the default 1024.
    util::raise_fd_limit();
    let profile = record_blocking(&config, &mut super::progress::printer(true))?;
    super::write_outputs(&outputs, &profile)
}

/// With no `-o`: a capture (to re-render, slice or diff later) and its flame graph, named by
/// the time (UTC) so that no earlier recording is overwritten: `profile-20261207-193500.capture`
/// and `.svg` in `dir`, with `-2`, `-3`... when those names are taken.
fn default_outputs(dir: &std::path::Path) -> Vec<PathBuf> {
    let stamp = util::utc_stamp(util::unix_now_ns());
    (1..u32::MAX)
        .map(|n| match n {
            1 => format!("profile-{stamp}"),
            n => format!("profile-{stamp}-{n}"),
        })
        .map(|base| ["capture", "svg"].map(|ext| dir.join(format!("{base}.{ext}"))))
        .find(|paths| paths.iter().all(|p| !p.exists()))
        .expect("an unused name")
        .to_vec()
}

/// What to tell a user whose `--comm NAME` matches no running thread (it may start later, so
/// this is a warning): the running names that contain it or that it contains, if any.
fn comm_hint(comm: &str) -> Option<String> {
    let mut names = std::collections::BTreeSet::new();
    for pid in util::proc_pids().ok()? {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            if let Ok(name) = std::fs::read_to_string(task.path().join("comm")) {
                names.insert(name.trim_end().to_owned());
            }
        }
    }
    if names.contains(comm) {
        return None;
    }
    let near: Vec<&String> = names
        .iter()
        .filter(|n| n.contains(comm) || comm.contains(n.as_str()))
        .take(5)
        .collect();
    let near = if near.is_empty() {
        String::new()
    } else {
        let near: Vec<&str> = near.iter().map(|n| n.as_str()).collect();
        format!("; running names like it: {}", near.join(", "))
    };
    Some(format!(
        "no running thread is named `{comm}` (matched whole; it may start later){near}"
    ))
}

#[cfg(test)]
mod tests {
    /// Default outputs are a capture and an SVG named by the time, never an existing file.
    #[test]
    fn default_outputs_are_new_files() {
        let dir = tempfile::tempdir().unwrap();
        let first = super::default_outputs(dir.path());
        let names: Vec<String> = (first.iter())
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert!(
            names[0].starts_with("profile-2") && names[0].ends_with(".capture"),
            "{names:?}"
        );
        assert_eq!(
            first[1].extension().and_then(|e| e.to_str()),
            Some("svg"),
            "{names:?}"
        );
        std::fs::write(&first[1], "").unwrap();
        let second = super::default_outputs(dir.path());
        assert!(second.iter().all(|p| !p.exists()), "{second:?}");
    }

    /// A running thread's own name needs no hint; a part of it gets one naming it.
    #[test]
    fn a_comm_no_thread_has_gets_the_names_like_it() {
        let own = std::fs::read_to_string("/proc/thread-self/comm").unwrap();
        let own = own.trim_end();
        assert_eq!(super::comm_hint(own), None);
        let hint = super::comm_hint(&own[..3]).expect("a hint");
        assert!(hint.contains(own), "{hint}");
    }
}
