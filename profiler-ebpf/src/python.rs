//! Python frames for the sampler (issue 17): for a sample of a process userspace registered in
//! PY_PROCS, find the sampled thread's own PyThreadState through its pthread-specific slot
//! (`_PyRuntime.autoTSSkey`, read at the task's fsbase), then walk that thread's interpreter
//! frames and append (code object, instruction) per frame to the record. Names come later,
//! in userspace (profiler::python).
use aya_ebpf::{
    helpers::generated::{
        bpf_get_current_task, bpf_loop, bpf_probe_read_kernel, bpf_probe_read_user,
    },
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use profiler_common::python::{
    CHECK_SHIFT, CODE_SPAN, ENTRY_BIT, FRAME_HEAD_BUF, FRAME_HEAD_BYTES, INSTR_MASK, MAX_PY_FRAMES,
    MAX_PY_PROCS, OLD_FRAME_HEAD_BYTES, PyProc, STR_HASH, check_of, counter, entry, flags,
};

#[map(name = "PY_PROCS")]
static PY_PROCS: HashMap<u32, PyProc> = HashMap::with_max_entries(MAX_PY_PROCS, 0);

#[map(name = "PY_COUNTERS")]
static PY_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// One frame head, read with one helper call. In a map value rather than on the stack so
/// the fields can be picked at offsets known only at run time.
#[map(name = "PY_FRAME_HEAD")]
static PY_FRAME_HEAD: PerCpuArray<[u64; FRAME_HEAD_BUF / 8]> = PerCpuArray::with_max_entries(1, 0);

/// The frames of the walk in progress, copied into the record at the end.
#[map(name = "PY_FRAMES")]
static PY_FRAMES: PerCpuArray<[u64; 2 * MAX_PY_FRAMES]> = PerCpuArray::with_max_entries(1, 0);

/// Set at load time: offset of `thread.fsbase` in `task_struct` (BTF); 0 = no Python walk.
#[unsafe(no_mangle)]
static PY_FSBASE_OFFSET: u32 = 0;

/// State of one walk, shared with `walk_step`. In a per-CPU map value, not on the stack: the
/// verifier knows the values kept on the stack (a frame count of 0, 1, 2...) and would check
/// `walk_step` again for each; a map value's fields are unknown to it, so one pass suffices.
#[map(name = "PY_WALK")]
static PY_WALK: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);

#[repr(C)]
struct Walk {
    frame: u64,
    n: u64,
    flags: u64,
    code_i: u64,
    prev_i: u64,
    instr_i: u64,
    entry_shift: u64,
    entry_mode: u64,
    code_check: u64,
    /// `PyProc::name_check`'s u64 index in the `CODE_SPAN` read; 0: none.
    name_i: u64,
}

/// Appends the Python frames of the current thread to `out` at u64 slot `base` (two slots
/// per frame). Returns (frames written, `flags::*`); (0, 0) for anything not Python.
#[inline(always)]
pub fn python_frames(pid: u32, out: *mut u64, base: usize, limit: usize) -> (u32, u32) {
    // SAFETY: a read of a load-time constant.
    let fsbase_offset = unsafe { core::ptr::read_volatile(&PY_FSBASE_OFFSET) };
    if fsbase_offset == 0 {
        return (0, 0);
    }
    // SAFETY: the value is plain data, copied out.
    let Some(p) = (unsafe { PY_PROCS.get(&pid) }).copied() else {
        return (0, 0);
    };
    let Some(tstate) = thread_state(&p, fsbase_offset) else {
        count(counter::NO_THREAD_STATE);
        return (0, 0);
    };
    let frame = if p.cframe == u32::MAX {
        user_u64(tstate + u64::from(p.current_frame))
    } else {
        user_u64(tstate + u64::from(p.cframe))
            .and_then(|c| user_u64(c + u64::from(p.current_frame)))
    };
    let Some(frame) = frame else {
        count(counter::READ_FAILED);
        return (0, flags::READ_FAILED);
    };
    let Some(walk) = PY_WALK.get_ptr_mut(0) else {
        return (0, 0);
    };
    // SAFETY: per-CPU value, and perf_event programs do not nest on one CPU.
    let w = unsafe { &mut *walk };
    *w = Walk {
        frame,
        n: 0,
        flags: 0,
        code_i: u64::from(p.frame_code / 8),
        prev_i: u64::from(p.frame_previous / 8),
        instr_i: u64::from(p.frame_instr / 8),
        entry_shift: u64::from(p.entry_byte.wrapping_sub(64) & 7) * 8,
        entry_mode: u64::from(p.entry_mode),
        code_check: u64::from(p.code_check),
        name_i: u64::from(p.name_check.saturating_sub(p.code_check) / 8),
    };
    // bpf_loop, not a loop: the verifier checks the step once instead of every iteration.
    // Shim frames take a turn too, so a stack of MAX_PY_FRAMES functions with shims between
    // is cut early (and counted as truncated).
    // SAFETY: walk_step only touches this CPU's PY_WALK and this program's maps.
    unsafe {
        bpf_loop(
            MAX_PY_FRAMES as u32,
            walk_step as *mut core::ffi::c_void,
            core::ptr::null_mut(),
            0,
        );
    }
    // SAFETY: as above; the walk is over.
    let w = unsafe { &mut *walk };
    if w.frame != 0 && w.flags & u64::from(flags::READ_FAILED) == 0 {
        w.flags |= u64::from(flags::TRUNCATED);
    }
    let n = (w.n as usize).min(MAX_PY_FRAMES);
    let f = w.flags as u32;
    if f & flags::TRUNCATED != 0 {
        count(counter::TRUNCATED);
    }
    if f & flags::READ_FAILED != 0 {
        count(counter::READ_FAILED);
    }
    if n == 0 {
        return (0, f);
    }
    count(counter::WALKED);
    let Some(frames) = PY_FRAMES.get_ptr(0) else {
        return (0, f);
    };
    // Bounds for the verifier: the user stack ends at most 2 * 127 slots in, and the record
    // has room for MAX_PY_FRAMES after that.
    if base > limit - 2 * MAX_PY_FRAMES {
        return (0, f);
    }
    let bytes = (n * 16) as u32 & (16 * MAX_PY_FRAMES as u32 * 2 - 1);
    let bytes = if bytes > 16 * MAX_PY_FRAMES as u32 {
        16 * MAX_PY_FRAMES as u32
    } else {
        bytes
    };
    // SAFETY: `base` slots plus `bytes` stay inside the scratch buffer (checked above); the
    // source is this CPU's PY_FRAMES value.
    let r = unsafe { bpf_probe_read_kernel(out.add(base).cast(), bytes, frames.cast()) };
    if r != 0 {
        return (0, f);
    }
    (n as u32, f)
}

/// One frame of the walk: 0 = go on, 1 = stop.
#[inline(never)]
extern "C" fn walk_step(_index: u64, _ctx: *mut core::ffi::c_void) -> i64 {
    let Some(walk) = PY_WALK.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: this CPU's walk state, set up by python_frames.
    let w = unsafe { &mut *walk };
    if w.frame == 0 {
        return 1;
    }
    let (Some(head), Some(frames)) = (PY_FRAME_HEAD.get_ptr_mut(0), PY_FRAMES.get_ptr_mut(0))
    else {
        return 1;
    };
    let old = w.entry_mode == u64::from(entry::FRAME_OBJECT);
    // Two calls with constant sizes: a 3.11+ frame may end its chunk 72 bytes in.
    // SAFETY: head is this CPU's FRAME_HEAD_BUF-long map value; both sizes fit in it.
    let r = unsafe {
        if old {
            bpf_probe_read_user(
                head.cast(),
                OLD_FRAME_HEAD_BYTES as u32,
                w.frame as *const core::ffi::c_void,
            )
        } else {
            bpf_probe_read_user(
                head.cast(),
                FRAME_HEAD_BYTES as u32,
                w.frame as *const core::ffi::c_void,
            )
        }
    };
    if r != 0 {
        w.flags |= u64::from(flags::READ_FAILED);
        return 1;
    }
    // SAFETY: this CPU's map values; indexes masked to the arrays' sizes.
    let (h, out) = unsafe { (&*head, &mut *frames) };
    const M: u64 = (FRAME_HEAD_BUF / 8 - 1) as u64;
    let code = h[(w.code_i & M) as usize];
    let instr = h[(w.instr_i & M) as usize];
    w.frame = h[(w.prev_i & M) as usize];
    let byte = (h[8] >> (w.entry_shift & 63)) & 0xff;
    let n = w.n as usize;
    // Indexes come from `slot`, masked on a value read again (volatile), not from `n`: LLVM
    // drops a mask that a range check on `n` makes redundant, and some verifiers (6.12's)
    // do not carry that check over to the shifted copy used as the index ("math between
    // map_value pointer and register with unbounded min value", found by the kernel matrix).
    // SAFETY: a plain read of the walk state on our stack.
    let slot = unsafe { core::ptr::read_volatile(&raw const w.n) } as usize & (MAX_PY_FRAMES - 1);
    if w.entry_mode == u64::from(entry::CSTACK_SHIM) && byte == 3 {
        // The shim below an eval-loop call's outermost frame: mark that frame (slot 0 is
        // n == MAX_PY_FRAMES here, whose last index is the array's last too).
        if n > 0 && n <= MAX_PY_FRAMES {
            out[(2 * slot).wrapping_sub(1) & (2 * MAX_PY_FRAMES - 1)] |= ENTRY_BIT;
        }
        return 0;
    }
    if n >= MAX_PY_FRAMES {
        w.flags |= u64::from(flags::TRUNCATED);
        return 1;
    }
    let instr = if old {
        // f_lasti, an int: its 32 bits shifted clear of the entry bit, which every
        // PyFrameObject gets (each runs in its own eval-loop call).
        ((instr & 0xffff_ffff) << 1) | ENTRY_BIT
    } else {
        // An offset into the code object: an address would leave no room for the checksum.
        let at = instr.wrapping_sub(code) & !ENTRY_BIT;
        if w.entry_mode == u64::from(entry::IS_ENTRY_BYTE) && byte != 0 {
            at | ENTRY_BIT
        } else {
            at
        }
    };
    // Two more reads per frame, so a code object freed before userspace names it (and
    // another put at its address) is not named as the new one; 0 when unreadable. The
    // word and the name pointer in one read into the head buffer (done with), then the
    // name's hash: generated code objects often differ in nothing else.
    // SAFETY: head is this CPU's FRAME_HEAD_BUF-long map value; CODE_SPAN fits in it.
    let check = if w.code_check != 0
        && unsafe {
            bpf_probe_read_user(
                head.cast(),
                CODE_SPAN as u32,
                code.wrapping_add(w.code_check) as *const core::ffi::c_void,
            )
        } == 0
    {
        // SAFETY: as above; the index is masked to the buffer.
        let c = unsafe { &*head };
        let hash = if w.name_i != 0 {
            user_u64(c[(w.name_i & M) as usize].wrapping_add(STR_HASH)).unwrap_or(0)
        } else {
            0
        };
        check_of(c[0] ^ hash)
    } else {
        0
    };
    out[(2 * slot) & (2 * MAX_PY_FRAMES - 1)] = code;
    out[(2 * slot + 1) & (2 * MAX_PY_FRAMES - 1)] = (instr & INSTR_MASK) | (check << CHECK_SHIFT);
    w.n += 1;
    0
}

/// The current thread's PyThreadState: glibc keeps pthread key k's value at fsbase +
/// tsd_base + 16 k for keys below 32 (its first block), and CPython binds each thread's own
/// state to `autoTSSkey`. None when the thread has none (not a Python thread).
#[inline(always)]
fn thread_state(p: &PyProc, fsbase_offset: u32) -> Option<u64> {
    // SAFETY: returns the current task pointer, only read through bpf_probe_read_kernel.
    let task = unsafe { bpf_get_current_task() };
    let mut fsbase = 0u64;
    // SAFETY: reads 8 bytes of the current task into a local.
    let r = unsafe {
        bpf_probe_read_kernel(
            (&raw mut fsbase).cast(),
            8,
            (task + u64::from(fsbase_offset)) as *const core::ffi::c_void,
        )
    };
    if r != 0 || fsbase == 0 {
        return None;
    }
    // SAFETY: the key is a plain u32 read from the process's memory.
    let key =
        unsafe { aya_ebpf::helpers::bpf_probe_read_user(p.tss_key_addr as *const u32) }.ok()?;
    if key >= 32 {
        return None;
    }
    let tstate = user_u64(fsbase + u64::from(p.tsd_base) + 16 * u64::from(key))?;
    (tstate != 0).then_some(tstate)
}

#[inline(always)]
fn user_u64(addr: u64) -> Option<u64> {
    // SAFETY: a copy of 8 bytes of user memory; a bad address is an error, not a fault.
    unsafe { aya_ebpf::helpers::bpf_probe_read_user(addr as *const u64) }.ok()
}

/// Whether userspace registered `pid` for its Python frames.
#[inline(always)]
pub(crate) fn registered(pid: u32) -> bool {
    // SAFETY: only whether the value exists is read.
    unsafe { PY_PROCS.get(&pid) }.is_some()
}

#[inline(always)]
pub(crate) fn count(index: u32) {
    if let Some(slot) = PY_COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, and perf_event programs do not nest on one CPU.
        unsafe { *slot += 1 };
    }
}
