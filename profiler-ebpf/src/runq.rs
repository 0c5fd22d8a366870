//! Run-queue latency: raw tracepoints on sched_switch, sched_wakeup and sched_wakeup_new. A
//! thread's wait starts when it becomes runnable (woken, or switched out while still
//! runnable: preempted) and ends when sched_switch gives it a CPU. Everything is kept per
//! thread in one LRU map (state and totals, one lookup a side of a switch), so a thread that
//! migrates while it waits is counted once and exactly, and nothing is sent per event:
//! userspace reads the maps (the thread's longest wait is kept whole, with its CPU and end).
use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel,
    },
    macros::{map, raw_tracepoint},
    maps::{LruHashMap, PerCpuArray, PerCpuHashMap},
    programs::RawTracePointContext,
};
use profiler_common::runq::{
    BUCKETS, CgroupBucket, CpuRow, MAX_CGROUP_BUCKETS, MAX_THREADS, Thread, bucket, counter,
};

#[map(name = "RUNQ_THREADS")]
static THREADS: LruHashMap<u32, Thread> = LruHashMap::with_max_entries(MAX_THREADS, 0);

#[map(name = "RUNQ_CPU_HIST")]
static CPU_HIST: PerCpuArray<CpuRow> = PerCpuArray::with_max_entries(1, 0);

/// Per CPU, so that an increment needs no atomic instruction (5.10 has no fetch-and-add for
/// BPF); userspace sums the CPUs' values.
#[map(name = "RUNQ_CGROUP_HIST")]
static CGROUP_HIST: PerCpuHashMap<CgroupBucket, u64> =
    PerCpuHashMap::with_max_entries(MAX_CGROUP_BUCKETS, 0);

#[map(name = "RUNQ_COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Set at load time: offsets in `struct task_struct` (profiler_common::runq).
#[unsafe(no_mangle)]
static RUNQ_PID_OFFSET: u64 = 0;
#[unsafe(no_mangle)]
static RUNQ_STATE_OFFSET: u64 = 0;

#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn runq_switch(ctx: RawTracePointContext) -> i32 {
    switched(&ctx);
    0
}

#[raw_tracepoint(tracepoint = "sched_wakeup")]
pub fn runq_wakeup(ctx: RawTracePointContext) -> i32 {
    woken(&ctx);
    0
}

#[raw_tracepoint(tracepoint = "sched_wakeup_new")]
pub fn runq_wakeup_new(ctx: RawTracePointContext) -> i32 {
    woken(&ctx);
    0
}

/// TP_PROTO(struct task_struct *p): `p` is runnable from now (it is not current).
#[inline(always)]
fn woken(ctx: &RawTracePointContext) {
    let Some(tid) = task_u32(ctx.arg(0), pid_offset()) else {
        return;
    };
    if tid == 0 {
        return;
    }
    let Some(t) = thread(tid) else {
        return;
    };
    // SAFETY: a map value of this program's.
    let t = unsafe { &mut *t };
    t.queued_ns = unsafe { bpf_ktime_get_ns() };
    t.queued_preempted = 0;
}

/// TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next, ...): prev is
/// still current.
#[inline(always)]
fn switched(ctx: &RawTracePointContext) {
    let pid_offset = pid_offset();
    if pid_offset == 0 {
        return;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    count(counter::SWITCHES);
    let preempt: u64 = ctx.arg(0);
    let prev: *const u8 = ctx.arg(1);
    let next: *const u8 = ctx.arg(2);
    let ids = bpf_get_current_pid_tgid();
    if ids as u32 != 0 {
        // Switched out while runnable (preempted, or woken before it got to sleep): it waits
        // from now. Any other state sleeps until a wake-up.
        // SAFETY: a load-time constant.
        let state_offset = unsafe { core::ptr::read_volatile(&RUNQ_STATE_OFFSET) };
        let runnable = preempt & 1 != 0 || task_u32(prev, state_offset) == Some(0);
        switched_out(ids, now, runnable);
    }
    if let Some(tid) = task_u32(next, pid_offset)
        && tid != 0
    {
        let cpu = unsafe { bpf_get_smp_processor_id() };
        switched_in(tid, now, cpu);
    }
}

#[inline(always)]
fn switched_out(ids: u64, now: u64, runnable: bool) {
    let Some(t) = thread(ids as u32) else {
        return;
    };
    // SAFETY: a map value of this program's.
    let t = unsafe { &mut *t };
    if t.on_ns != 0 && now > t.on_ns {
        t.runtime_ns += now - t.on_ns;
    }
    t.on_ns = 0;
    t.queued_ns = if runnable { now } else { 0 };
    t.queued_preempted = runnable as u32;
    let pid = (ids >> 32) as u32;
    // The comm changes rarely (exec, prctl): read at a thread's first switch-out, after an
    // exec made it a new process, and every 256th switch, not at every one.
    if t.pid != pid || t.switches & 255 == 0 {
        if let Ok(comm) = bpf_get_current_comm() {
            t.comm = comm;
        }
    }
    t.pid = pid;
    t.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
}

#[inline(always)]
fn switched_in(tid: u32, now: u64, cpu: u32) {
    let Some(t) = thread(tid) else {
        return;
    };
    // SAFETY: a map value of this program's.
    let t = unsafe { &mut *t };
    t.switches += 1;
    t.on_ns = now;
    let queued = t.queued_ns;
    t.queued_ns = 0;
    if queued == 0 || now < queued {
        return;
    }
    let wait = now - queued;
    t.delay_ns += wait;
    t.waits += 1;
    t.preempted += t.queued_preempted;
    if wait > t.max_delay_ns {
        t.max_delay_ns = wait;
        t.max_end_ns = now;
        t.max_cpu = cpu;
    }
    count(counter::WAITS);
    let b = bucket(wait);
    if let Some(row) = CPU_HIST.get_ptr_mut(0) {
        // SAFETY: this CPU's row, not nested (the scheduler's lock is held).
        let row = unsafe { &mut *row };
        row[(b as usize) & (BUCKETS - 1)] += 1;
        row[BUCKETS] += wait;
    }
    let key = CgroupBucket {
        cgroup_id: t.cgroup_id,
        bucket: u64::from(b),
    };
    match CGROUP_HIST.get_ptr_mut(&key) {
        // SAFETY: this CPU's value.
        Some(n) => unsafe { *n += 1 },
        None => {
            if CGROUP_HIST.insert(&key, &1, 0).is_err() {
                count(counter::CGROUP_HIST_FULL);
            }
        }
    }
}

/// The thread's entry, made (zeroed) on first sight.
#[inline(always)]
fn thread(tid: u32) -> Option<*mut Thread> {
    if let Some(t) = THREADS.get_ptr_mut(&tid) {
        return Some(t);
    }
    if THREADS.insert(&tid, &Thread::default(), 0).is_err() {
        count(counter::THREADS_FULL);
        return None;
    }
    THREADS.get_ptr_mut(&tid)
}

#[inline(always)]
fn pid_offset() -> u64 {
    // SAFETY: a load-time constant; read_volatile keeps the compiler from folding the 0.
    unsafe { core::ptr::read_volatile(&RUNQ_PID_OFFSET) }
}

/// The u32 at `offset` in a task_struct.
#[inline(always)]
fn task_u32(task: *const u8, offset: u64) -> Option<u32> {
    // SAFETY: a kernel pointer from the tracepoint; the helper checks the read.
    unsafe { bpf_probe_read_kernel(task.wrapping_add(offset as usize).cast::<u32>()) }.ok()
}

#[inline(always)]
fn count(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot; the tracepoints run with preemption off.
        unsafe { *slot += 1 };
    }
}
