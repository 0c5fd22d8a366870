//! New Python processes wake the reader (issue 12): the agent drains its ring buffer on a
//! timer of seconds, and a Python process is registered for its frames (`PY_PROCS`) only
//! after a drain has read one of its samples. A raw tracepoint on sched_process_exec notes
//! each process whose new program is named `python*` (its comm at exec is the file's name);
//! for `PY_EXEC_WAKE_FOR_NS` after that, its samples wake the reader, at most every
//! `PY_EXEC_WAKE_EVERY_NS`, until userspace registers it. The other new processes (60 a
//! second on a busy host, most of them never sampled) wait for the timer.
use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, raw_tracepoint},
    maps::LruHashMap,
    programs::RawTracePointContext,
};
use profiler_common::python::{
    PY_EXEC_WAKE_EVERY_NS, PY_EXEC_WAKE_FOR_NS, PY_EXECS_CAPACITY, counter,
};

/// tgid -> [exec time, last wake] (CLOCK_MONOTONIC ns).
#[map(name = "PY_EXECS")]
static PY_EXECS: LruHashMap<u32, [u64; 2]> = LruHashMap::with_max_entries(PY_EXECS_CAPACITY, 0);

#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn python_exec(_ctx: RawTracePointContext) -> i32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // By this tracepoint the kernel has set comm to the new program's file name (cut to 15
    // bytes): `python3.11`, whatever the path or the comm the process sets later.
    let named_python = bpf_get_current_comm().is_ok_and(|c| c.starts_with(b"python"));
    if named_python {
        // SAFETY: a helper with no preconditions.
        let now = unsafe { bpf_ktime_get_ns() };
        let _ = PY_EXECS.insert(&tgid, &[now, 0], 0);
    } else {
        // A pid that ran Python and exec'd something else is not Python any more.
        let _ = PY_EXECS.remove(&tgid);
    }
    0
}

/// Whether this sample of `pid` should wake the reader: its process exec'd as `python*` less
/// than PY_EXEC_WAKE_FOR_NS ago, is not registered in PY_PROCS yet, and no sample of it woke
/// the reader in the last PY_EXEC_WAKE_EVERY_NS.
#[inline(always)]
pub fn wakes(pid: u32, now_ns: u64) -> bool {
    let Some(entry) = PY_EXECS.get_ptr_mut(&pid) else {
        return false;
    };
    // SAFETY: a map value of this program's, updated in place (a race with another CPU's
    // sample of the same process costs at most one more wake-up).
    let entry = unsafe { &mut *entry };
    // Registered (its frames are walked): the wake-ups did their work.
    if now_ns.saturating_sub(entry[0]) > PY_EXEC_WAKE_FOR_NS || crate::python::registered(pid) {
        let _ = PY_EXECS.remove(&pid);
        return false;
    }
    if entry[1] != 0 && now_ns.saturating_sub(entry[1]) < PY_EXEC_WAKE_EVERY_NS {
        return false;
    }
    entry[1] = now_ns;
    crate::python::count(counter::EXEC_WAKES);
    true
}
