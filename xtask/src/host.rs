//! Host checks run by `cargo xtask setup`: can this machine load BPF and open perf events?

use std::fs;
use std::io;
use std::path::Path;

use profiler_common::perf;

/// The kernel release, e.g. "6.18.44".
pub(crate) fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "unknown".into(), |s| s.trim().into())
}

/// Reports every host requirement for loading the profiler; returns the failed ones.
pub(crate) fn checks() -> Vec<String> {
    let release = kernel_release();
    println!("ok: kernel {release}");
    memlock_note(&release);
    let mut failed = Vec::new();
    let checks = [
        ("kernel BTF at /sys/kernel/btf/vmlinux", btf()),
        ("capabilities CAP_BPF and CAP_PERFMON", capabilities()),
        ("perf_event_open(cpu-clock, cpu 0)", perf_event()),
    ];
    for (name, result) in checks {
        match result {
            Ok(()) => println!("ok: {name}"),
            Err(fix) => {
                println!("FAIL: {name}: {fix}");
                failed.push(format!("{name}: {fix}"));
            }
        }
    }
    failed
}

fn btf() -> Result<(), String> {
    if Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Ok(());
    }
    Err("missing; use a kernel built with CONFIG_DEBUG_INFO_BTF=y".into())
}

fn capabilities() -> Result<(), String> {
    use profiler_common::caps;
    let status = fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("cannot read /proc/self/status: {e}"))?;
    let eff = caps::cap_eff(&status).ok_or("no CapEff line in /proc/self/status")?;
    // CAP_SYS_ADMIN stands in for both (and is the only option before kernel 5.8).
    let missing: Vec<&str> = caps::missing_for_bpf(eff).collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "missing {} (CapEff {eff:#x}); run as root, or grant CAP_BPF and CAP_PERFMON (containers: --cap-add BPF --cap-add PERFMON)",
        missing.join(" and ")
    ))
}

/// Opens the event the profiler samples with: seccomp, paranoia or a missing PMU show up here.
fn perf_event() -> Result<(), String> {
    let attr = perf::EventAttr {
        // Disabled: the probe must not count anything while it is open.
        flags: perf::attr_bit::DISABLED,
        ..perf::EventAttr::software(perf::COUNT_SW_CPU_CLOCK)
    };
    let (pid, cpu, group): (libc::pid_t, libc::c_int, libc::c_int) = (-1, 0, -1);
    // SAFETY: attr is a fully initialised perf_event_attr of the size it declares and outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr,
            pid,
            cpu,
            group,
            perf::FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd >= 0 {
        // SAFETY: fd was just returned to us by the kernel and nothing else owns it.
        unsafe { libc::close(fd as libc::c_int) };
        return Ok(());
    }
    let err = io::Error::last_os_error();
    Err(match err.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => format!(
            "{err}; needs CAP_PERFMON (or kernel.perf_event_paranoid <= 0), and in a container a seccomp profile that allows perf_event_open"
        ),
        Some(libc::ENOSYS) => format!(
            "{err}; the kernel has no perf events (CONFIG_PERF_EVENTS) or seccomp blocks the syscall"
        ),
        _ => format!("{err}; the kernel refuses a cpu-clock event on cpu 0"),
    })
}

/// Before 5.11 BPF maps are charged to RLIMIT_MEMLOCK (later kernels use memcg), so the limit
/// only matters on old kernels; we never raise it ourselves.
fn memlock_note(release: &str) {
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse::<u32>().ok());
    if (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0)) >= (5, 11) {
        return;
    }
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: limit is a valid rlimit for getrlimit to fill in.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &raw mut limit) } != 0
        || limit.rlim_cur == libc::RLIM_INFINITY
    {
        return;
    }
    println!(
        "note: kernel {release} charges BPF maps to RLIMIT_MEMLOCK ({} KiB here); if loading fails, raise it (`ulimit -l unlimited`)",
        limit.rlim_cur / 1024
    );
}
