//! Process exits: a raw tracepoint on sched_process_exit sends (time, pid, exit status) of
//! each exiting thread group leader to the collector, which keeps process lifetimes. The
//! kernel's PERF_RECORD_EXIT (read by the collector with the mappings) has no exit status.
use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{map, raw_tracepoint},
    maps::RingBuf,
    programs::RawTracePointContext,
};
use profiler_common::exits::{EXITS_BYTES, ExitEvent};

#[map(name = "EXITS")]
static EXITS: RingBuf = RingBuf::with_byte_size(EXITS_BYTES, 0);

/// Set at load time: offset of `exit_code` in `struct task_struct` (from the kernel's BTF).
#[unsafe(no_mangle)]
static EXIT_CODE_OFFSET: u64 = 0;

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn process_exit(ctx: RawTracePointContext) -> i32 {
    exited(&ctx);
    0
}

#[inline(always)]
fn exited(ctx: &RawTracePointContext) {
    let ids = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((ids >> 32) as u32, ids as u32);
    // Threads exit too; the leader's exit_code holds the status of the whole group
    // (do_group_exit sets it on every thread).
    // SAFETY: a load-time constant; read_volatile keeps the compiler from folding the 0.
    let offset = unsafe { core::ptr::read_volatile(&EXIT_CODE_OFFSET) };
    if tgid != tid || offset == 0 {
        return;
    }
    // TP_PROTO(struct task_struct *p, ...): the exiting task, current.
    let task: *const u8 = ctx.arg(0);
    // SAFETY: a kernel pointer from the tracepoint; the helper checks the read.
    let Ok(status) =
        (unsafe { bpf_probe_read_kernel(task.wrapping_add(offset as usize).cast::<i32>()) })
    else {
        return;
    };
    let event = ExitEvent {
        time_ns: unsafe { bpf_ktime_get_ns() },
        pid: tgid,
        status: status as u32,
    };
    // No wake-up: the collector drains exits with the samples. A full buffer drops the event
    // (that exit's status stays unknown).
    let _ = EXITS.output::<ExitEvent>(event, BPF_RB_NO_WAKEUP as u64);
}
