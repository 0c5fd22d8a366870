//! The perf_event program: thin entry point, the work in small functions.
use aya_ebpf::{
    EbpfContext as _,
    bindings::BPF_F_USER_STACK,
    helpers::{bpf_get_current_cgroup_id, bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::{map, perf_event},
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::PerfEventContext,
};
use profiler_common::{
    COMM_LEN, MAX_FRAMES, MAX_PID_FILTER, RING_BUFFER_BYTES, SampleEvent, counter, flags,
};

#[map(name = "SAMPLES")]
static SAMPLES: RingBuf = RingBuf::with_byte_size(RING_BUFFER_BYTES, 0);

#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

#[map(name = "PID_FILTER")]
static PID_FILTER: HashMap<u32, u8> = HashMap::with_max_entries(MAX_PID_FILTER, 0);

/// Set at load time: 1 = sample only the pids in PID_FILTER.
#[unsafe(no_mangle)]
static FILTER_PIDS: u8 = 0;

const STACK_BYTES: u32 = (MAX_FRAMES * 8) as u32;

#[perf_event]
pub fn sample_cpu(ctx: PerfEventContext) -> u32 {
    sample(&ctx);
    0
}

#[inline(always)]
fn sample(ctx: &PerfEventContext) {
    let pid = ctx.tgid();
    if !wanted(pid) {
        count(counter::FILTERED);
        return;
    }
    let Some(mut entry) = SAMPLES.reserve::<SampleEvent>(0) else {
        count(counter::LOST_RINGBUF_FULL);
        return;
    };
    // SAFETY: the reservation is sizeof(SampleEvent) bytes, aligned; we write every field
    // before submitting (the stacks only up to their length, which the reader respects).
    let ev = unsafe { &mut *entry.as_mut_ptr() };
    ev.time_ns = unsafe { bpf_ktime_get_ns() };
    ev.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    ev.pid = pid;
    ev.tid = ctx.pid();
    ev.cpu = unsafe { bpf_get_smp_processor_id() };
    ev.comm = ctx.command().unwrap_or([0u8; COMM_LEN]);
    let mut f = 0u32;

    let klen = stack_into(ctx, ev.kstack.as_mut_ptr(), 0);
    if klen < 0 {
        f |= flags::KSTACK_FAILED;
        count(counter::KSTACK_FAILED);
    }
    ev.kstack_len = frames(klen);
    if ev.kstack_len == 0 {
        f |= flags::USER_MODE;
    }

    // Kernel threads (pid 0 is the idle task) have no user stack: not a failure.
    let ulen = stack_into(ctx, ev.ustack.as_mut_ptr(), BPF_F_USER_STACK as u64);
    if ulen < 0 && pid != 0 {
        f |= flags::USTACK_FAILED;
        count(counter::USTACK_FAILED);
    }
    ev.ustack_len = frames(ulen);
    ev.flags = f;
    entry.submit(0);
    count(counter::SENT);
}

#[inline(always)]
fn wanted(pid: u32) -> bool {
    // SAFETY: a read of a load-time constant.
    let filtering = unsafe { core::ptr::read_volatile(&FILTER_PIDS) };
    // SAFETY: the value is a u8 read by copy.
    filtering == 0 || unsafe { PID_FILTER.get(&pid) }.is_some()
}

/// bpf_get_stack into a fixed buffer; returns bytes written or a negative error.
#[inline(always)]
fn stack_into(ctx: &PerfEventContext, buf: *mut u64, flags: u64) -> i64 {
    // SAFETY: buf points at MAX_FRAMES u64s inside the reserved ring buffer record.
    unsafe {
        aya_ebpf::helpers::generated::bpf_get_stack(ctx.as_ptr(), buf.cast(), STACK_BYTES, flags)
    }
}

#[inline(always)]
fn frames(bytes: i64) -> u32 {
    if bytes <= 0 { 0 } else { (bytes as u32) / 8 }
}

#[inline(always)]
fn count(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, and perf_event programs do not nest on one CPU.
        unsafe { *slot += 1 };
    }
}
