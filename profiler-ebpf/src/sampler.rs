//! The perf_event program: thin entry point, the work in small functions.
//!
//! Cost matters (it runs on every CPU at every tick), so a record is assembled in a per-CPU
//! scratch buffer that stays in cache and copied once into the ring buffer with only the
//! frames the stacks have, and the reader is woken only when the buffer fills (see
//! `wakeup_flag`).
//!
//! Failures also go to aya-log at debug level (`profiler record -vv`). The loader sets
//! `AYA_LOG_LEVEL` to 0 otherwise: a read-only global, so the verifier sees each log call's
//! guard as always false and removes the call; it costs nothing on the sampling path.
use aya_ebpf::{
    EbpfContext as _,
    bindings::{BPF_F_USER_STACK, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_smp_processor_id,
        bpf_ktime_get_ns, generated::bpf_get_stack,
    },
    macros::{map, perf_event},
    maps::{CgroupArray, HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::PerfEventContext,
};
use aya_log_ebpf::debug;
use profiler_common::{
    COMM_LEN, HEADER_BYTES, MAX_CGROUP_FILTER, MAX_FRAMES, MAX_PID_FILTER, RING_BUFFER_BYTES,
    SEEN_PIDS_CAPACITY, SampleScratch, WAKEUP_FRACTION, counter, flags,
    unwind::{COPY_AT_MASK, COPY_BYTES, COPY_HEADER_BYTES, reason},
};

use crate::unwind;

#[map(name = "SAMPLES")]
static SAMPLES: RingBuf = RingBuf::with_byte_size(RING_BUFFER_BYTES, 0);

#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

#[map(name = "PID_FILTER")]
static PID_FILTER: HashMap<u32, u8> = HashMap::with_max_entries(MAX_PID_FILTER, 0);

/// cgroup2 directories (`--cgroup`): only tasks in one of them or below are sampled.
#[map(name = "CGROUP_FILTER")]
static CGROUP_FILTER: CgroupArray = CgroupArray::with_max_entries(MAX_CGROUP_FILTER, 0);

/// Processes that already had a sample, with the time the reader was last woken for their
/// stale mappings (0: never). The first sample of a new process wakes the reader at once, so
/// it reads the process's mappings before a short-lived process exits; see `stale_wake`.
#[map(name = "SEEN_PIDS")]
static SEEN_PIDS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(SEEN_PIDS_CAPACITY, 0);

/// A process's stale mappings wake the reader at most this often (`stale_wake`).
const STALE_WAKE_NS: u64 = 200_000_000;

#[map(name = "SCRATCH")]
static SCRATCH: PerCpuArray<SampleScratch> = PerCpuArray::with_max_entries(1, 0);

/// Set at load time: 1 = sample only the pids in PID_FILTER.
#[unsafe(no_mangle)]
static FILTER_PIDS: u8 = 0;

/// Set at load time: how many slots of CGROUP_FILTER are set (0 = no cgroup filter).
#[unsafe(no_mangle)]
static FILTER_CGROUPS: u32 = 0;

/// Set at load time to a quarter of the ring buffer's real size (the loader resizes it).
#[unsafe(no_mangle)]
static WAKEUP_BYTES: u64 = (RING_BUFFER_BYTES / WAKEUP_FRACTION) as u64;

/// Set at load time: 1 = a new process's first sample and its stale mappings wake the reader
/// (`record`, which wants every short-lived process's tables at once); 0 = they wait for the
/// reader's timer (the agent: a wake-up costs it more than a second's late tables do).
#[unsafe(no_mangle)]
static WAKE_FOR_PROCESSES: u8 = 1;

const STACK_BYTES: u32 = (MAX_FRAMES * 8) as u32;

// The sampler in four variants, from the most the kernel must accept to the least: userspace
// loads the first one the kernel's verifier takes (profiler::bpf::variant). Each is compiled
// from `sample` with the parts it leaves out removed, not switched off at load time, so an old
// verifier never sees code it cannot check (5.10 knows neither bpf_loop's callbacks nor
// bpf_task_pt_regs).

/// Table walk and Python frames.
#[perf_event]
pub fn sample_cpu(ctx: PerfEventContext) -> u32 {
    sample::<true, true>(&ctx);
    0
}

/// Table walk, no Python frames.
#[perf_event]
pub fn sample_tables(ctx: PerfEventContext) -> u32 {
    sample::<true, false>(&ctx);
    0
}

/// Frame pointers and Python frames.
#[perf_event]
pub fn sample_fp_py(ctx: PerfEventContext) -> u32 {
    sample::<false, true>(&ctx);
    0
}

/// Frame pointers only: helpers every 5.8 kernel has, no BPF-to-BPF callbacks.
#[perf_event]
pub fn sample_fp(ctx: PerfEventContext) -> u32 {
    sample::<false, false>(&ctx);
    0
}

#[inline(always)]
fn sample<const TABLES: bool, const PYTHON: bool>(ctx: &PerfEventContext) {
    // One helper call for both ids (tgid in the high half).
    let ids = bpf_get_current_pid_tgid();
    let pid = (ids >> 32) as u32;
    #[cfg(feature = "matrix-broken")]
    spin_forever();
    if !wanted(pid) || !in_cgroups() {
        count(counter::FILTERED);
        return;
    }
    let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU value, and perf_event programs do not nest on one CPU.
    let s = unsafe { &mut *scratch };
    // The scratch still holds this CPU's previous sample: the same process again (the common
    // case) cannot be new, which saves the SEEN_PIDS lookup.
    let maybe_new = s.header.pid != pid;
    let h = &mut s.header;
    h.time_ns = unsafe { bpf_ktime_get_ns() };
    h.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    h.pid = pid;
    h.tid = ids as u32;
    h.cpu = unsafe { bpf_get_smp_processor_id() };
    h.comm = ctx.command().unwrap_or([0u8; COMM_LEN]);
    let mut f = 0u32;

    let frames = s.frames.as_mut_ptr();
    // A tick that interrupted user code has no kernel stack: skip the helper call.
    let kbytes = if in_user_mode(ctx) {
        0
    } else {
        stack_into(ctx, frames, 0)
    };
    if kbytes < 0 {
        f |= flags::KSTACK_FAILED;
        count(counter::KSTACK_FAILED);
        debug!(
            ctx,
            "pid {}: bpf_get_stack (kernel) failed: {}", pid, kbytes
        );
    }
    let klen = frame_count(kbytes);
    if klen == 0 {
        f |= flags::USER_MODE;
    }
    // The user stack goes right after the kernel frames. The idle task (pid 0) has none.
    // --- table unwinding (`--unwind dwarf|auto`, profiler-ebpf/src/unwind.rs) ---
    // A process whose mappings userspace loaded is walked by table; one not loaded yet falls
    // back to the frame-pointer walk below, marked and counted as such.
    let mut table_frames = None;
    let mut copy = false;
    // The walk left the loaded mappings of a loaded process (`stale_wake`).
    let mut stale = false;
    let user_mode = klen == 0 && in_user_mode(ctx);
    if TABLES && pid != 0 {
        let why = if !user_mode && !unwind::entered_from_user() {
            // A kernel thread: no user stack, nothing truncated.
            table_frames = Some(0);
            reason::NONE
        } else {
            match unwind::mappings(pid) {
                Some(procs) => {
                    let (n, why) = unwind::walk(ctx, user_mode, procs, frames, klen);
                    table_frames = Some(n);
                    // Its table not in yet, or an address outside the loaded mappings (a library
                    // mapped since the kernel's entry was written): userspace has both.
                    copy = why == reason::NOT_LOADED || why == reason::NO_MAPPING;
                    stale = why == reason::NO_MAPPING;
                    why
                }
                None => {
                    copy = true;
                    reason::NOT_LOADED
                }
            }
        };
        if why != reason::NONE {
            f |= (why << flags::UNWIND_REASON_SHIFT) & flags::UNWIND_REASON_MASK;
            count(counter::UNWIND_REASON_BASE + (why & 7));
        }
        // Copies take half the ring at most (`copy_fits`) and are rationed per CPU
        // (`COPIES_PER_SECOND`). A copy refused is counted, the sample still sent; a walk
        // that stopped at a binary still compiling then takes the frame-pointer walk below
        // instead (whole through frame-pointer code, where the table walk kept only the
        // frames before that binary).
        if copy && !(copy_fits() && unwind::copy_allowed(s.header.time_ns)) {
            count(counter::STACK_COPIES_REFUSED);
            copy = false;
            if why == reason::NOT_LOADED {
                table_frames = None;
            }
        }
    }
    // --- end of table unwinding ---
    let ubytes = if pid == 0 {
        0
    } else if let Some(n) = table_frames {
        i64::from(n) * 8
    } else {
        // SAFETY: frames has 2 * MAX_FRAMES slots and klen <= MAX_FRAMES.
        stack_into(
            ctx,
            unsafe { frames.add(klen as usize) },
            BPF_F_USER_STACK as u64,
        )
    };
    // Kernel threads (pid 0 is the idle task) have no user stack: not a failure.
    if ubytes < 0 && pid != 0 {
        f |= flags::USTACK_FAILED;
        count(counter::USTACK_FAILED);
        debug!(ctx, "pid {}: bpf_get_stack (user) failed: {}", pid, ubytes);
    }
    let ulen = frame_count(ubytes);
    // Python frames (issue 17) after the user addresses; none unless the pid is registered.
    let (plen, pflags) = if PYTHON {
        crate::python::python_frames(pid, frames, (klen + ulen) as usize, s.frames.len())
    } else {
        (0, 0)
    };
    let h = &mut s.header;
    h.kstack_len = klen;
    h.ustack_len = ulen;
    h.py_len = plen;
    h.py_flags = pflags;
    h.flags = f;

    let mut len = HEADER_BYTES + (klen + ulen + 2 * plen) as usize * 8;
    // Not loaded yet: the stack itself goes with the record (after the last frame), for
    // userspace to walk by table later (allowed above). The common path (loaded, or --unwind
    // fp) pays nothing.
    if copy {
        // Masked for the verifier (the frames end below the mask; the copy's room follows).
        let at = len & COPY_AT_MASK;
        let n = unwind::copy_stack(ctx, user_mode, scratch.cast::<u8>().wrapping_add(at));
        if n > 0 {
            s.header.flags |= flags::STACK_COPY;
            len = at + n;
            count(counter::STACK_COPIES);
        }
    }
    let time_ns = s.header.time_ns;
    // Mask the length so the verifier sees it bounded by the scratch size.
    let len = len & 0x7fff;
    let len = if len > core::mem::size_of::<SampleScratch>() {
        core::mem::size_of::<SampleScratch>()
    } else {
        len
    };
    // SAFETY: `len` bytes of the scratch value, which is size_of::<SampleScratch>() long.
    let bytes = unsafe { core::slice::from_raw_parts(scratch.cast::<u8>(), len) };
    let flag = wakeup_flag::<PYTHON>(pid, maybe_new, stale, time_ns);
    match SAMPLES.output::<[u8]>(bytes, flag) {
        Ok(()) => count(counter::SENT),
        Err(_) => {
            count(counter::LOST_RINGBUF_FULL);
            debug!(ctx, "pid {}: sample lost, the ring buffer is full", pid);
        }
    }
}

/// Test-only (feature `matrix-broken`): a loop whose exit depends on a value the program never
/// changes, so the verifier cannot bound it and every kernel must reject the program. The
/// kernel matrix checks that the rejection reaches its report with the verifier's complaint.
#[cfg(feature = "matrix-broken")]
#[inline(always)]
fn spin_forever() {
    if let Some(slot) = COUNTERS.get_ptr(0) {
        // SAFETY: a per-CPU map value; volatile so the compiler keeps the loop as written.
        while unsafe { core::ptr::read_volatile(slot) } != u64::MAX {}
    }
}

/// Waking the reader costs an irq_work per sample (a VM exit in a guest), more than the rest
/// of the sample. The reader drains on a short timer instead; it is woken only when the buffer
/// fills past WAKEUP_BYTES, so a burst cannot overrun it, or for a process's first sample
/// (`record`), or, where new processes do not wake it (the agent), for a new Python process's
/// first samples (`python_exec`).
#[inline(always)]
fn wakeup_flag<const PYTHON: bool>(pid: u32, maybe_new: bool, stale: bool, now_ns: u64) -> u64 {
    // SAFETY: a read of a load-time constant.
    let wakeup_bytes = unsafe { core::ptr::read_volatile(&WAKEUP_BYTES) };
    // SAFETY: as above.
    let for_processes = unsafe { core::ptr::read_volatile(&WAKE_FOR_PROCESSES) } != 0;
    if SAMPLES.query(BPF_RB_AVAIL_DATA as u64) > wakeup_bytes
        || (for_processes
            && ((maybe_new && first_sample(pid)) || (stale && stale_wake(pid, now_ns))))
        || (PYTHON && !for_processes && crate::python_exec::wakes(pid, now_ns))
    {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// Whether a stack copy leaves half the ring buffer free. A copy is up to 16 KiB, a sample
/// without one a few hundred bytes: copies may fill the first half of the ring only, so a
/// burst of them (every process of a host copied at a recording's start, or a reader behind
/// for a moment) is refused, and counted, before it could cost a sample.
#[inline(always)]
fn copy_fits() -> bool {
    // SAFETY: a read of a load-time constant (a quarter of the ring's real size).
    let quarter = unsafe { core::ptr::read_volatile(&WAKEUP_BYTES) };
    SAMPLES.query(BPF_RB_AVAIL_DATA as u64) + (COPY_HEADER_BYTES + COPY_BYTES) as u64 <= 2 * quarter
}

/// True the first time `pid` is seen (the idle task never counts).
#[inline(always)]
fn first_sample(pid: u32) -> bool {
    // SAFETY: the value is a u64 read by copy.
    if pid == 0 || unsafe { SEEN_PIDS.get(&pid) }.is_some() {
        return false;
    }
    let _ = SEEN_PIDS.insert(&pid, &0, 0);
    true
}

/// True when a walk that left the process's loaded mappings should wake the reader now: its
/// kernel records (the mapping the code is in, written before the sample) then reach the
/// loader at once instead of at the next timed drain (100 ms), during which every sample of
/// the process in that library is cut (`no mapping`) and stack copies, rationed, mend only
/// some. A new process's first load is often made while ld.so is still mapping libc. At most
/// once per STALE_WAKE_NS a process: code in memory no file backs (JIT) never gets a mapping.
#[inline(always)]
fn stale_wake(pid: u32, now_ns: u64) -> bool {
    match SEEN_PIDS.get_ptr_mut(&pid) {
        Some(last) => {
            // SAFETY: a map value of this program's, updated in place.
            let last = unsafe { &mut *last };
            if now_ns.saturating_sub(*last) < STALE_WAKE_NS {
                return false;
            }
            *last = now_ns;
            true
        }
        None => {
            let _ = SEEN_PIDS.insert(&pid, &now_ns, 0);
            true
        }
    }
}

/// Whether the tick interrupted user mode (the CPL bits of the saved code segment).
#[cfg(bpf_target_arch = "x86_64")]
#[inline(always)]
fn in_user_mode(ctx: &PerfEventContext) -> bool {
    // SAFETY: perf_event programs may read their context's saved registers directly.
    unsafe { (*ctx.ctx).regs.cs & 3 == 3 }
}

/// Other architectures: always ask for the kernel stack (it is empty in user mode).
#[cfg(not(bpf_target_arch = "x86_64"))]
#[inline(always)]
fn in_user_mode(_ctx: &PerfEventContext) -> bool {
    false
}

#[inline(always)]
fn wanted(pid: u32) -> bool {
    // SAFETY: a read of a load-time constant.
    let filtering = unsafe { core::ptr::read_volatile(&FILTER_PIDS) };
    // SAFETY: the value is a u8 read by copy.
    filtering == 0 || unsafe { PID_FILTER.get(&pid) }.is_some()
}

/// Whether the current task is under one of the CGROUP_FILTER cgroups (always, when none
/// are set): one bpf_current_task_under_cgroup call per cgroup given, before any other work.
#[inline(always)]
fn in_cgroups() -> bool {
    // SAFETY: a read of a load-time constant.
    let n = unsafe { core::ptr::read_volatile(&FILTER_CGROUPS) };
    let mut i = 0;
    while i < n && i < MAX_CGROUP_FILTER {
        if CGROUP_FILTER.current_task_under_cgroup(i) == Ok(true) {
            return true;
        }
        i += 1;
    }
    n == 0
}

/// bpf_get_stack into `buf`; returns bytes written or a negative error.
#[inline(always)]
fn stack_into(ctx: &PerfEventContext, buf: *mut u64, flags: u64) -> i64 {
    // SAFETY: buf points at >= MAX_FRAMES u64s inside the per-CPU scratch value.
    unsafe { bpf_get_stack(ctx.as_ptr(), buf.cast(), STACK_BYTES, flags) }
}

/// Frames in a bpf_get_stack result, at most MAX_FRAMES.
#[inline(always)]
fn frame_count(bytes: i64) -> u32 {
    if bytes <= 0 {
        0
    } else {
        let n = (bytes as u64 / 8) as u32;
        if n > MAX_FRAMES as u32 {
            MAX_FRAMES as u32
        } else {
            n
        }
    }
}

#[inline(always)]
fn count(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, and perf_event programs do not nest on one CPU.
        unsafe { *slot += 1 };
    }
}
