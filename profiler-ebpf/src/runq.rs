//! Run-queue latency: a raw tracepoint on sched_switch. The kernel counts every task's waits
//! in run queues itself (`sched_info`, what /proc/PID/schedstat shows: the number of times it
//! got a CPU and the waits' sum); this program reads them from the task being switched out
//! and keeps the difference since that thread's previous switch-out, which is its last wait
//! (from its wake-up or preemption to its switch-in), whole, on whatever CPU it began. So a
//! switch costs one map lookup and a few reads, and wake-ups need no hook at all; a thread
//! that migrates while it waits is counted once, and exactly. Userspace reads the maps.
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

#[map(name = "RUNQ_CGROUP_HIST")]
static CGROUP_HIST: PerCpuHashMap<CgroupBucket, u64> =
    PerCpuHashMap::with_max_entries(MAX_CGROUP_BUCKETS, 0);

#[map(name = "RUNQ_COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

// Set at load time (profiler_common::runq).
#[unsafe(no_mangle)]
static RUNQ_PCOUNT_OFFSET: u64 = 0;
#[unsafe(no_mangle)]
static RUNQ_RUN_DELAY_OFFSET: u64 = 0;
#[unsafe(no_mangle)]
static RUNQ_ARRIVAL_OFFSET: u64 = 0;
#[unsafe(no_mangle)]
static RUNQ_EXEC_START_OFFSET: u64 = 0;
#[unsafe(no_mangle)]
static RUNQ_SUM_EXEC_OFFSET: u64 = 0;
#[unsafe(no_mangle)]
static RUNQ_START_TIME_OFFSET: u64 = 0;
#[unsafe(no_mangle)]
static RUNQ_TRACE_START: u64 = 0;

#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn runq_switch(ctx: RawTracePointContext) -> i32 {
    switched(&ctx);
    0
}

/// What the kernel counted of a task, read at its switch-out.
struct Counted {
    pcount: u64,
    run_delay: u64,
    runtime: u64,
}

/// TP_PROTO(bool preempt, struct task_struct *prev, ...): prev is still current, and its
/// `sched_info` already holds the wait that ended at its switch-in.
#[inline(always)]
fn switched(ctx: &RawTracePointContext) {
    // SAFETY: a load-time constant; read_volatile keeps the compiler from folding the 0.
    if unsafe { core::ptr::read_volatile(&RUNQ_RUN_DELAY_OFFSET) } == 0 {
        return;
    }
    count(counter::SWITCHES);
    let ids = bpf_get_current_pid_tgid();
    let tid = ids as u32;
    if tid == 0 {
        return;
    }
    let preempt: u64 = ctx.arg(0);
    let task: *const u8 = ctx.arg(1);
    let now = unsafe { bpf_ktime_get_ns() };
    let counted = Counted {
        pcount: task_u64(task, &RUNQ_PCOUNT_OFFSET),
        run_delay: task_u64(task, &RUNQ_RUN_DELAY_OFFSET),
        runtime: task_u64(task, &RUNQ_SUM_EXEC_OFFSET),
    };
    let Some(t) = thread(tid, task, &counted) else {
        return;
    };
    // SAFETY: a map value of this program's.
    let t = unsafe { &mut *t };
    let waits = counted.pcount.saturating_sub(t.seen_pcount);
    let wait = counted.run_delay.saturating_sub(t.seen_run_delay);
    t.runtime_ns += counted.runtime.saturating_sub(t.seen_runtime);
    if waits > 0 {
        let cpu = unsafe { bpf_get_smp_processor_id() };
        waited(t, task, wait, waits, now, cpu);
    }
    t.seen_pcount = counted.pcount;
    t.seen_run_delay = counted.run_delay;
    t.seen_runtime = counted.runtime;
    t.seen_ns = now;
    t.out_preempted = (preempt & 1) as u32;
    let pid = (ids >> 32) as u32;
    // The comm and the cgroup change rarely: read at a thread's first switch-outs (a new
    // thread names itself, a runtime moves it into its container's cgroup, as it starts),
    // after an exec made it a new process, and every 256th wait.
    if t.pid != pid || t.waits < 8 || t.waits & 255 == 0 {
        if let Ok(comm) = bpf_get_current_comm() {
            t.comm = comm;
        }
        t.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    }
    t.pid = pid;
}

/// Counts the wait (`waits` of them when the kernel counted more, which one switch-out does
/// not see: they are taken as one) that ended at this run's start on `cpu`.
#[inline(always)]
fn waited(t: &mut Thread, task: *const u8, wait: u64, waits: u64, now: u64, cpu: u32) {
    t.delay_ns += wait;
    t.waits += waits as u32;
    t.preempted += t.out_preempted;
    count(counter::WAITS);
    if wait > t.max_delay_ns {
        // It ended when this run began: how long the task ran since, on the run queue's
        // clock (its last update at this switch, less the arrival), at most the time since
        // its last switch-out.
        let ran = task_u64(task, &RUNQ_EXEC_START_OFFSET)
            .saturating_sub(task_u64(task, &RUNQ_ARRIVAL_OFFSET));
        let since_out = now.saturating_sub(t.seen_ns);
        t.max_delay_ns = wait;
        t.max_end_ns = now - if ran < since_out { ran } else { since_out };
        t.max_cpu = cpu;
    }
    let b = bucket(wait);
    if let Some(row) = CPU_HIST.get_ptr_mut(0) {
        // SAFETY: this CPU's row; the program does not nest on a CPU (the runqueue lock).
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

/// The thread's entry. Userspace made one for every thread there was before it attached
/// (`bpf::runq`), from its schedstat. One seen for the first time starts from zero when it
/// was created after tracing started (every wait of its life is ours), else (one userspace
/// missed) from what the kernel counted so far: its next wait is the first counted.
#[inline(always)]
fn thread(tid: u32, task: *const u8, counted: &Counted) -> Option<*mut Thread> {
    if let Some(t) = THREADS.get_ptr_mut(&tid) {
        return Some(t);
    }
    // SAFETY: a load-time constant.
    let trace_start = unsafe { core::ptr::read_volatile(&RUNQ_TRACE_START) };
    let mut t = Thread::default();
    if task_u64(task, &RUNQ_START_TIME_OFFSET) < trace_start {
        t.seen_pcount = counted.pcount;
        t.seen_run_delay = counted.run_delay;
        t.seen_runtime = counted.runtime;
    }
    t.seen_ns = trace_start;
    if THREADS.insert(&tid, &t, 0).is_err() {
        count(counter::THREADS_FULL);
        return None;
    }
    THREADS.get_ptr_mut(&tid)
}

/// The u64 at the offset `offset` holds in a task_struct (0 when unreadable).
#[inline(always)]
fn task_u64(task: *const u8, offset: &u64) -> u64 {
    // SAFETY: a load-time constant.
    let offset = unsafe { core::ptr::read_volatile(offset) };
    // SAFETY: a kernel pointer from the tracepoint; the helper checks the read.
    unsafe { bpf_probe_read_kernel(task.wrapping_add(offset as usize).cast::<u64>()) }.unwrap_or(0)
}

#[inline(always)]
fn count(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot; the tracepoint runs with preemption off.
        unsafe { *slot += 1 };
    }
}
