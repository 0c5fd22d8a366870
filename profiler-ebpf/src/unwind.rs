//! The table walk of a user stack (`--unwind dwarf|auto`), called by the sampler in place of
//! bpf_get_stack for processes whose mappings userspace loaded (profiler::unwind::loader).
//! Each step finds the mapping of the current address (binary search of the process's
//! sorted executable mappings), then either follows the frame pointer (binaries that keep
//! them; it stops at their STOP rows, e.g. Go's thread entries) or the binary's row for that
//! address (its page's rows found through the binary's page index, then a binary search of
//! those: docs/unwinding.md, "The kernel's table format"), reads the return address at
//! CFA - 8 and, when the row's rule says so, the caller's RBP.
use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, BPF_F_NO_PREALLOC},
    helpers::{
        bpf_probe_read_kernel, bpf_probe_read_user,
        generated::{
            bpf_get_current_task_btf, bpf_loop, bpf_probe_read_user as probe_read_user_raw,
            bpf_task_pt_regs,
        },
    },
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
    programs::PerfEventContext,
};
use profiler_common::{
    MAX_FRAMES as FRAME_SLOTS,
    unwind::{
        COPIES_PER_SECOND, COPY_BYTES, COPY_CHUNK, COPY_HEADER_BYTES, DEFAULT_ROWS, MAX_FRAMES,
        MAX_MAPPINGS, MAX_PROCS, MAX_RULES, PAGE_SHIFT, ProcMappings, SEARCH_STEPS, StackCopy,
        UnwindMapping, UnwindRule, WORDS_PER_ELEMENT, kind, mapping, reason,
    },
};

/// Every binary's table, one slice per binary (shared by all processes mapping it): its page
/// index, then its rows (pc offset in the page << 16 | rule index). Mmapable: userspace
/// writes a table with one copy instead of a syscall per row. Sized at load from
/// `--unwind-memory`.
/// Two words to an element (`WORDS_PER_ELEMENT`: 4-byte values would take 8 bytes each).
#[map(name = "UNWIND_ROWS")]
static UNWIND_ROWS: Array<[u32; 2]> =
    Array::with_max_entries(DEFAULT_ROWS / WORDS_PER_ELEMENT, BPF_F_MMAPABLE);

/// The distinct rules of every loaded table, indexed by the rows' low 16 bits (two to an
/// element, as above).
#[map(name = "UNWIND_RULES")]
static UNWIND_RULES: Array<[UnwindRule; 2]> =
    Array::with_max_entries(MAX_RULES / WORDS_PER_ELEMENT, 0);

/// Word `i` of UNWIND_ROWS.
#[inline(always)]
fn word(i: u32) -> Option<u32> {
    UNWIND_ROWS.get(i >> 1).map(|pair| pair[(i & 1) as usize])
}

/// Executable mappings per process (tgid). Not preallocated: most slots stay empty.
#[map(name = "UNWIND_PROCS")]
static UNWIND_PROCS: HashMap<u32, ProcMappings> =
    HashMap::with_max_entries(MAX_PROCS, BPF_F_NO_PREALLOC);

/// The loaded mappings of `pid`, if userspace has loaded them yet.
#[inline(always)]
pub(crate) fn mappings(pid: u32) -> Option<*const ProcMappings> {
    UNWIND_PROCS.get_ptr(&pid)
}

/// How a walk ended, in a per-CPU map value rather than on the stack: the verifier knows
/// the constants stored on the stack (a reason, a done flag) and would check `step` again
/// for each combination of them; values in a map are unknown to it, so one pass suffices.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct WalkEnd {
    /// The registers of the frame being walked: here, not in `Walk` on the stack, so that
    /// every call of `step` starts from the same state as far as the verifier knows (its
    /// bounds on a stack pointer kept in `Walk` grew with each call it checked).
    ip: u64,
    sp: u64,
    bp: u64,
    /// Frames written.
    n: u32,
    /// `reason::*` the walk stopped for; FRAME_LIMIT until it stops by itself.
    reason: u32,
    /// 1 when the current address is exact (the interrupted RIP a signal frame saved), not
    /// a return address: it is looked up as is, not as the call before it.
    exact: u32,
    /// The rule `find_row` gave last, and the address it was for (0: none yet): a recursive
    /// function's frames all return to the same address (26 of the 34 frames of the
    /// bench's `deep30`, an interpreter's eval loop, a tree walk), whose rule needs no
    /// search again. Within one walk the table cannot change under it.
    rule: UnwindRule,
    rule_pc: u64,
    /// The mapping the last step found (an empty range before the first): a caller is
    /// mostly in the same binary as its callee (30 frames of one program, then libc's
    /// start), so the step checks it before searching the process's mappings again.
    last: UnwindMapping,
    /// The binary search in progress (`find_mapping`, `find_row`): candidates [lo, hi) of
    /// mappings, or rows with `lo` the last known at or below `key`. Here rather than on the
    /// stack for the reason above: each search step is its own bpf_loop callback, which the
    /// verifier checks once for any bounds.
    lo: u32,
    hi: u32,
    key: u64,
    /// Set by a search step that could not read its row.
    failed: u32,
    /// A copy of the user stack from `win_base`, `win_len` bytes (0: none yet): the walk
    /// goes up the stack, and one read of WINDOW bytes holds the return addresses of
    /// several small frames, each of which cost a helper call of its own.
    win_base: u64,
    win_len: u64,
    /// WINDOW bytes and 8 more, so a word read at any offset below WINDOW stays inside.
    win: [u8; WINDOW + 8],
}

/// Bytes of the user stack one read copies (`WalkEnd::win`): the 16-byte frames of a small
/// recursive function, 16 of them; a 200-byte frame still gets its saved RBP and return
/// address in one read.
const WINDOW: usize = 256;

#[map(name = "UNWIND_END")]
static UNWIND_END: PerCpuArray<WalkEnd> = PerCpuArray::with_max_entries(1, 0);

/// State of one walk, on the sampler's stack and handed to each `step` by bpf_loop.
#[repr(C)]
struct Walk {
    procs: *const ProcMappings,
    /// The sample's frame array (per-CPU scratch) and the slot of the first user frame.
    frames: *mut u64,
    end: *mut WalkEnd,
    base: u32,
}

/// Walks the user stack of the current task into `frames[base..]`; returns the frame count
/// and why the walk stopped early (`reason::NONE` when it reached the entry).
#[inline(always)]
pub(crate) fn walk(
    ctx: &PerfEventContext,
    user_mode: bool,
    procs: *const ProcMappings,
    frames: *mut u64,
    base: u32,
) -> (u32, u32) {
    let Some((ip, sp, bp)) = user_regs(ctx, user_mode) else {
        return (0, reason::READ_FAULT);
    };
    let Some(end) = UNWIND_END.get_ptr_mut(0) else {
        return (0, reason::READ_FAULT);
    };
    // Field by field: the window's bytes need no clearing (win_len 0 marks them unread),
    // and a whole WalkEnd built on the stack would take most of its 512 bytes.
    // SAFETY: per-CPU value, and perf_event programs do not nest on one CPU.
    unsafe {
        let e = &mut *end;
        e.n = 0;
        e.reason = reason::FRAME_LIMIT;
        e.exact = 0;
        e.rule_pc = 0;
        e.last.start = 0;
        e.last.end = 0;
        e.win_len = 0;
        e.ip = ip;
        e.sp = sp;
        e.bp = bp;
    };
    let mut w = Walk {
        procs,
        frames,
        end,
        base,
    };
    // bpf_loop (5.17+, allowed in perf_event programs): the verifier checks `step` once
    // instead of unrolling MAX_FRAMES walks with their searches, which it could not.
    // SAFETY: `step` has the callback signature; `w` outlives the call.
    unsafe {
        bpf_loop(
            MAX_FRAMES,
            step as *mut core::ffi::c_void,
            (&raw mut w).cast(),
            0,
        )
    };
    // SAFETY: as above.
    let e = unsafe { *end };
    (e.n, e.reason)
}

/// This CPU's stack copies in the current 100 ms: (window number, copies in it).
#[map(name = "UNWIND_COPIES")]
static UNWIND_COPIES: PerCpuArray<[u64; 2]> = PerCpuArray::with_max_entries(1, 0);

/// Whether this CPU may send one more stack copy now (`COPIES_PER_SECOND`, per 100 ms).
#[inline(always)]
pub(crate) fn copy_allowed(now_ns: u64) -> bool {
    let Some(slot) = UNWIND_COPIES.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: per-CPU value, and perf_event programs do not nest on one CPU.
    let c = unsafe { &mut *slot };
    let window = now_ns / 100_000_000;
    if c[0] != window {
        c[0] = window;
        c[1] = 0;
    }
    if c[1] >= u64::from(COPIES_PER_SECOND / 10) {
        return false;
    }
    c[1] += 1;
    true
}

/// Copies the registers and the top of the user stack (`COPY_BYTES` at most, from RSP up) to
/// `dst` (a `StackCopy`, then the bytes), for a process whose tables are not in the kernel
/// yet: userspace walks the copy with the same rows once it has them (perf's own method,
/// here only for those samples). Returns the bytes written, 0 when the registers are unknown.
///
/// The stack is read a page at a time: one read crossing into an unmapped page (the top of
/// the stack is often nearer than COPY_BYTES) would fail whole, so this keeps every page
/// below the first that does not read. Unrolled (COPY_BYTES / COPY_CHUNK + 1 reads, the first
/// and last partial pages); `got` is masked so the verifier sees each read inside `dst`'s
/// room of COPY_HEADER_BYTES + COPY_BYTES + COPY_CHUNK.
#[inline(always)]
pub(crate) fn copy_stack(ctx: &PerfEventContext, user_mode: bool, dst: *mut u8) -> usize {
    let Some((ip, sp, bp)) = user_regs(ctx, user_mode) else {
        return 0;
    };
    let bytes = dst.wrapping_add(COPY_HEADER_BYTES);
    let mut got = 0usize;
    let mut i = 0;
    while i <= COPY_BYTES / COPY_CHUNK {
        let left = COPY_BYTES - got;
        let to_page = COPY_CHUNK - ((sp as usize + got) & (COPY_CHUNK - 1));
        let n = if to_page < left { to_page } else { left };
        // Read back through memory, so the check below stays: LLVM knows n <= COPY_CHUNK and
        // dropped it, and 6.1's verifier does not take that bound from the comparison of two
        // registers above (it rejected the read below as past the scratch).
        // SAFETY: a read of a local.
        let n = unsafe { core::ptr::read_volatile(&n) };
        if n == 0 || n > COPY_CHUNK {
            break;
        }
        // Masked for the verifier: got < COPY_BYTES here (n would be 0 at COPY_BYTES).
        let at = got & (COPY_BYTES - 1);
        // SAFETY: `at + n <= COPY_BYTES + COPY_CHUNK` bytes after the header fit the room
        // the caller gives; user memory read through the checked helper.
        let r = unsafe {
            probe_read_user_raw(
                bytes.wrapping_add(at).cast(),
                n as u32,
                (sp + got as u64) as *const core::ffi::c_void,
            )
        };
        if r != 0 {
            break;
        }
        got = at + n;
        i += 1;
    }
    // SAFETY: the header's room at `dst`, as above; unaligned: `dst` follows the frames.
    unsafe {
        core::ptr::write_unaligned(
            dst.cast::<StackCopy>(),
            StackCopy {
                ip,
                sp,
                bp,
                len: got as u64,
            },
        )
    };
    COPY_HEADER_BYTES + got
}

/// The user registers at the sample: the interrupted ones when the tick hit user mode, else
/// the ones the task saved on kernel entry (top of its kernel stack).
#[inline(always)]
fn user_regs(ctx: &PerfEventContext, user_mode: bool) -> Option<(u64, u64, u64)> {
    if user_mode {
        // SAFETY: perf_event programs may read their context's saved registers.
        let r = unsafe { &(*ctx.ctx).regs };
        return Some((r.rip, r.rsp, r.rbp));
    }
    let r = saved_user_regs()?;
    Some((r.rip, r.rsp, r.rbp))
}

/// Whether a task interrupted in kernel mode has a user stack at all: only a task that
/// entered the kernel from user space does. Kernel threads (kworker, kswapd...) have none:
/// their saved registers are zeros, and walking them gave `[truncated: no mapping]` user
/// frames (or a stack copy) to every kernel-thread sample.
#[inline(always)]
pub(crate) fn entered_from_user() -> bool {
    saved_user_regs().is_some()
}

/// The registers the current task saved on kernel entry, if it came from user mode (the
/// privilege level of the saved code segment is 3).
#[inline(always)]
fn saved_user_regs() -> Option<aya_ebpf::bindings::pt_regs> {
    // SAFETY: helpers on the current task; the result is read with probe_read_kernel.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) }
        as *const aya_ebpf::bindings::pt_regs;
    if regs.is_null() {
        return None;
    }
    // SAFETY: a kernel pointer read through the checked helper.
    let r = unsafe { bpf_probe_read_kernel(regs) }.ok()?;
    (r.cs & 3 == 3).then_some(r)
}

/// One frame: record `ip`, then move to the caller. Returns 1 to stop the loop.
///
/// The frame count is the loop's index, not a counter kept in `Walk`: the verifier checks
/// this callback again for each distinct state it is called in, and a counter it knows
/// exactly (0, 1, 2...) would make 127 distinct states (about 400k verified instructions),
/// where the index is an unknown number to it and one pass suffices.
extern "C" fn step(index: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: bpf_loop passes back the `Walk` given to it.
    let w = unsafe { &mut *ctx.cast::<Walk>() };
    // SAFETY: the per-CPU WalkEnd set up by `walk`.
    let (ip, sp, mut bp) = unsafe { ((*w.end).ip, (*w.end).sp, (*w.end).bp) };
    let slot = u64::from(w.base) + index;
    // Bounded for the verifier: the frame array has 2 * FRAME_SLOTS slots.
    if slot >= 2 * FRAME_SLOTS as u64 {
        return stop(w, reason::FRAME_LIMIT);
    }
    // SAFETY: slot < 2 * FRAME_SLOTS, the scratch array's length.
    unsafe { *w.frames.add(slot as usize) = ip };
    // SAFETY: the per-CPU WalkEnd set up by `walk`.
    unsafe { (*w.end).n = index as u32 + 1 };
    // A return address points after the call; the call itself (ip - 1) is in the caller's
    // range even when the call was the function's last instruction. The first address and
    // one a signal frame saved are where the code was interrupted: looked up as they are.
    // SAFETY: the per-CPU WalkEnd set up by `walk`.
    let exact = unsafe { core::mem::replace(&mut (*w.end).exact, 0) };
    let pc = if index == 0 || exact != 0 { ip } else { ip - 1 };
    // Code in no file mapping (JIT code; the vDSO has a table) is walked by frame pointer, as
    // bpf_get_stack would: JIT compilers keep them, and the chain leads back into mapped code.
    // SAFETY: the per-CPU WalkEnd set up by `walk`.
    let last = unsafe { (*w.end).last };
    let found = if pc >= last.start && pc < last.end {
        Some(last)
    } else {
        let found = find_mapping(w, pc);
        if let Some(m) = found {
            // SAFETY: as above.
            unsafe { (*w.end).last = m };
        }
        found
    };
    let m = found.unwrap_or_default();
    if m.kind == mapping::PENDING {
        return stop(w, reason::NOT_LOADED); // its table is being compiled: copy the stack
    }
    if m.kind == mapping::UNREACHED {
        return stop(w, reason::NO_MAPPING); // userspace compiles its table now: copy the stack
    }
    let (cfa, saved_bp) = if found.is_none() || m.kind == mapping::FRAME_POINTER {
        // A frame-pointer binary may have STOP rows at its threads' entries (Go's
        // runtime.mstart: what its frame pointer points at is no frame of the thread).
        if m.pages != 0
            && find_row(w, &m, pc.wrapping_sub(m.bias)).is_some_and(|r| r.kind == kind::STOP)
        {
            return stop(w, reason::NONE);
        }
        if bp == 0 {
            // The end of the frame-pointer chain; in unmapped code, the walk cannot go on.
            let why = if found.is_none() {
                reason::NO_MAPPING
            } else {
                reason::NONE
            };
            return stop(w, why);
        }
        if bp + 16 <= sp {
            return stop(w, reason::NO_MAPPING); // not a frame pointer into this stack
        }
        (bp + 16, bp)
    } else {
        // SAFETY: the per-CPU WalkEnd set up by `walk`.
        let row = if pc == unsafe { (*w.end).rule_pc } {
            // SAFETY: as above.
            unsafe { (*w.end).rule }
        } else {
            let Some(row) = find_row(w, &m, pc.wrapping_sub(m.bias)) else {
                return stop(w, reason::NO_ROW);
            };
            // SAFETY: as above.
            unsafe {
                (*w.end).rule = row;
                (*w.end).rule_pc = pc;
            }
            row
        };
        if row.kind == kind::SIGNAL {
            return signal_frame(w, sp, &row);
        }
        let cfa = match row.kind {
            kind::CFA_RSP => sp + u64::from(row.cfa_off),
            kind::CFA_RBP => bp + u64::from(row.cfa_off),
            kind::PLT => {
                // rsp + 8, + 8 once the stub pushed (from byte `cfa_off` of its 16).
                sp + 8
                    + if pc & 15 >= u64::from(row.cfa_off) {
                        8
                    } else {
                        0
                    }
            }
            kind::STOP => return stop(w, reason::NONE),
            kind::UNSUPPORTED => return stop(w, reason::UNSUPPORTED),
            _ => return stop(w, reason::NO_ROW),
        };
        let saved = if row.rbp_off == 0 {
            0
        } else {
            cfa.wrapping_add((i64::from(row.rbp_off) * 8) as u64)
        };
        (cfa, saved)
    };
    // The saved RBP first: it is below the return address (CFA - 16 or lower), and the
    // window is read upwards from the first address asked for.
    if saved_bp != 0 {
        match stack_word(w, saved_bp) {
            Some(saved) => bp = saved,
            None => return stop(w, reason::READ_FAULT),
        }
    }
    let Some(ra) = stack_word(w, cfa - 8) else {
        return stop(w, reason::READ_FAULT);
    };
    if ra == 0 {
        return stop(w, reason::NONE); // the outermost frame
    }
    // The stack grows down: a caller's frame above ours, or the walk is going in circles.
    if cfa <= sp {
        return stop(w, reason::UNSUPPORTED);
    }
    // SAFETY: the per-CPU WalkEnd set up by `walk`.
    unsafe {
        (*w.end).ip = ra;
        (*w.end).sp = cfa;
        (*w.end).bp = bp;
    }
    0
}

/// The user stack's word at `at`, from the walk's window when it holds it; else the window is
/// read again from `at` up, WINDOW bytes or to the end of `at`'s page (a read crossing into
/// an unmapped page fails whole, and the stack's top page may be the last one mapped).
#[inline(always)]
fn stack_word(w: &mut Walk, at: u64) -> Option<u64> {
    // SAFETY: the per-CPU WalkEnd set up by `walk`.
    let e = unsafe { &mut *w.end };
    let off = at.wrapping_sub(e.win_base);
    if off >= e.win_len || e.win_len - off < 8 {
        let to_page = COPY_CHUNK as u64 - (at & (COPY_CHUNK as u64 - 1));
        let n = if to_page < WINDOW as u64 {
            to_page
        } else {
            WINDOW as u64
        };
        // Read back through memory so the check below stays for the verifier (as in
        // `copy_stack`: 6.1 takes no bound from the comparison above).
        // SAFETY: a read of a local.
        let n = unsafe { core::ptr::read_volatile(&n) };
        if n < 8 || n > WINDOW as u64 {
            // A word across a page boundary (the stack is 8-aligned: never in practice).
            // SAFETY: user memory read through the checked helper.
            return unsafe { bpf_probe_read_user(at as *const u64) }.ok();
        }
        // SAFETY: n <= WINDOW bytes into the window's WINDOW + 8; user memory read through
        // the checked helper.
        let r = unsafe {
            probe_read_user_raw(
                e.win.as_mut_ptr().cast(),
                n as u32,
                at as *const core::ffi::c_void,
            )
        };
        if r != 0 {
            e.win_len = 0;
            return None;
        }
        e.win_base = at;
        e.win_len = n;
        return Some(u64::from_ne_bytes([
            e.win[0], e.win[1], e.win[2], e.win[3], e.win[4], e.win[5], e.win[6], e.win[7],
        ]));
    }
    // Masked for the verifier: off < win_len <= WINDOW already.
    let off = off as usize & (WINDOW - 1);
    // SAFETY: off + 8 <= WINDOW + 8, inside the window; unaligned as the stack may be.
    Some(unsafe { core::ptr::read_unaligned(e.win.as_ptr().add(off).cast::<u64>()) })
}

/// Crosses a signal frame (`__restore_rt`, where the handler returns to): the registers of
/// the interrupted code are in the sigcontext the kernel pushed, RSP at `sp + cfa_off`, RIP
/// right after it, RBP `rbp_off` slots from RSP. No stack-direction check: a handler on an
/// alternate stack (sigaltstack) interrupted code whose stack is below its own.
#[inline(always)]
fn signal_frame(w: &mut Walk, sp: u64, row: &UnwindRule) -> i64 {
    let saved_sp = sp + u64::from(row.cfa_off);
    let saved_bp = saved_sp.wrapping_add((i64::from(row.rbp_off) * 8) as u64);
    // SAFETY: user memory read through the checked helper.
    let read = |at: u64| unsafe { bpf_probe_read_user(at as *const u64) };
    let (Ok(sp), Ok(ip), Ok(bp)) = (read(saved_sp), read(saved_sp + 8), read(saved_bp)) else {
        return stop(w, reason::READ_FAULT);
    };
    if ip == 0 {
        return stop(w, reason::NONE);
    }
    // SAFETY: the per-CPU WalkEnd set up by `walk`.
    unsafe {
        let e = &mut *w.end;
        e.ip = ip;
        e.sp = sp;
        e.bp = bp;
        e.exact = 1;
    }
    0
}

#[inline(always)]
fn stop(w: &mut Walk, why: u32) -> i64 {
    // SAFETY: the per-CPU WalkEnd set up by `walk`.
    unsafe { (*w.end).reason = why };
    1
}

/// The mapping containing `pc`: a binary search of the sorted mappings, each step a call of
/// `mapping_step` (bpf_loop: verified once, whatever the bounds at each step). Returned by
/// copy: a pointer whose offset differs on each search path would keep those paths apart in
/// the verifier (each verified again through the rest of the step), a copy does not.
#[inline(always)]
fn find_mapping(w: &mut Walk, pc: u64) -> Option<UnwindMapping> {
    // SAFETY: a map value pointer from UNWIND_PROCS, read-only here.
    let count = unsafe { (*w.procs).count }.min(MAX_MAPPINGS as u32);
    // SAFETY: the per-CPU WalkEnd set up by `walk`.
    unsafe {
        let e = &mut *w.end;
        e.lo = 0;
        e.hi = count;
        e.key = pc;
        e.failed = 1; // cleared by the step that finds it
    }
    // Enough steps for MAX_MAPPINGS (log2 + 1).
    // SAFETY: `mapping_step` has the callback signature; `w` outlives the call.
    unsafe {
        bpf_loop(
            8,
            mapping_step as *mut core::ffi::c_void,
            core::ptr::from_mut(w).cast(),
            0,
        )
    };
    // SAFETY: as above.
    let e = unsafe { &*w.end };
    if e.failed != 0 {
        return None;
    }
    // SAFETY: a map value pointer from UNWIND_PROCS, read-only here.
    unsafe { &*w.procs }
        .maps
        .get(e.lo as usize & (MAX_MAPPINGS - 1))
        .copied()
}

/// One step of `find_mapping`; returns 1 once the search is over (`lo` the mapping found,
/// `failed` cleared) or empty.
extern "C" fn mapping_step(_index: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: bpf_loop passes back the `Walk` given to it; its WalkEnd is the per-CPU one.
    let (w, e) = unsafe {
        let w = &*ctx.cast::<Walk>();
        (w, &mut *w.end)
    };
    if e.lo >= e.hi {
        return 1;
    }
    let mid = e.lo + (e.hi - e.lo) / 2;
    // SAFETY: a map value pointer from UNWIND_PROCS, read-only here.
    let Some(m) = unsafe { &*w.procs }.maps.get(mid as usize) else {
        return 1;
    };
    if e.key < m.start {
        e.hi = mid;
    } else if e.key >= m.end {
        e.lo = mid + 1;
    } else {
        e.lo = mid;
        e.failed = 0;
        return 1;
    }
    0
}

/// The rule of file vaddr `pc` in mapping `m`'s table: the page index gives the rows of
/// `pc`'s 64 KiB page, and a binary search of at most SEARCH_STEPS steps (`row_step`) finds
/// the last one at or below `pc`'s offset, starting from the row just before the page's first
/// (the rule in force where the page starts, an earlier page's last row; the loader adds no
/// row at offset 0). Before the binary's first row that position is the page index's last
/// entry, no row: NONE. profiler::unwind::kernel_rows::lookup is the same in userspace,
/// checked against the compiler's own lookup for every row of libc, ld.so and fx-unwind.
#[inline(always)]
fn find_row(w: &mut Walk, m: &UnwindMapping, pc: u64) -> Option<UnwindRule> {
    if pc > u64::from(u32::MAX) {
        return None;
    }
    let pc = pc as u32;
    let page = (pc >> PAGE_SHIFT).wrapping_sub(m.first_page);
    // Below the first page too: the subtraction wrapped to a large number.
    if page >= m.pages {
        return None;
    }
    let at = m.table_start.wrapping_add(page);
    let first = word(at)?;
    let hi = word(at.wrapping_add(1))?;
    if first > hi || first == 0 {
        return None; // not a page index the loader wrote
    }
    let rows_start = m.table_start.wrapping_add(m.pages).wrapping_add(1);
    // SAFETY: the per-CPU WalkEnd set up by `walk`.
    unsafe {
        let e = &mut *w.end;
        e.lo = first - 1;
        e.hi = hi;
        e.key = u64::from(pc & ((1 << PAGE_SHIFT) - 1));
        e.failed = 0;
    }
    // SAFETY: `row_step` has the callback signature; `w` outlives the call.
    unsafe {
        bpf_loop(
            SEARCH_STEPS,
            row_step as *mut core::ffi::c_void,
            core::ptr::from_mut(w).cast(),
            0,
        )
    };
    // SAFETY: as above.
    let (lo, failed) = unsafe { ((*w.end).lo, (*w.end).failed) };
    if failed != 0 {
        return None;
    }
    let rule = if lo < rows_start {
        0
    } else {
        word(lo)? & 0xffff
    };
    UNWIND_RULES
        .get(rule >> 1)
        .map(|pair| pair[(rule & 1) as usize])
}

/// One step of `find_row`. Invariant: row `lo` starts at or below `key` (or is the one before
/// the page's first); rows from `hi` on start above it. Returns 1 once they meet.
extern "C" fn row_step(_index: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: bpf_loop passes back the `Walk` given to it; its WalkEnd is the per-CPU one.
    let e = unsafe { &mut *(*ctx.cast::<Walk>()).end };
    if e.hi <= e.lo.wrapping_add(1) || e.lo == u32::MAX {
        return 1;
    }
    let mid = e.lo + (e.hi - e.lo) / 2;
    let Some(row) = word(mid) else {
        e.failed = 1;
        return 1;
    };
    if u64::from(row >> 16) <= e.key {
        e.lo = mid;
    } else {
        e.hi = mid;
    }
    0
}
