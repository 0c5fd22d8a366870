//! Python frames (issue 17): what userspace registers per Python process (`PyProc`) so the
//! sampler can walk the sampled thread's own interpreter frames, and what it appends to the
//! sample record per frame (`PyFrame`). Names and lines are resolved in userspace.

/// Deepest Python stack walked per sample; deeper ones are cut (counted, `flags::TRUNCATED`).
pub const MAX_PY_FRAMES: usize = 128;

/// HashMap<u32 tgid, PyProc>: the Python processes the sampler walks.
pub const MAP_PY_PROCS: &str = "PY_PROCS";
/// Capacity of `MAP_PY_PROCS`.
pub const MAX_PY_PROCS: u32 = 4096;
/// Per-CPU array of `counter::COUNT` u64s.
pub const MAP_PY_COUNTERS: &str = "PY_COUNTERS";
/// Load-time global (u32): offset of `thread.fsbase` in the kernel's `task_struct` (from
/// BTF); 0 turns the Python walk off.
pub const GLOBAL_FSBASE_OFFSET: &str = "PY_FSBASE_OFFSET";
/// LruHashMap<u32 tgid, [u64; 2] (exec time, last wake)>: processes that exec'd a program
/// named `python*` lately, whose samples wake the reader (`PROGRAM_PY_EXEC`).
pub const MAP_PY_EXECS: &str = "PY_EXECS";
/// Capacity of `MAP_PY_EXECS` (least recently used entries go first).
pub const PY_EXECS_CAPACITY: u32 = 1024;
/// Raw tracepoint on sched_process_exec: notes processes whose new program is named
/// `python*`. Loaded only where the reader is not woken by every new process (the agent,
/// which drains on a timer of `PY_EXEC_WAKE_FOR_NS` or more): a Python process is then
/// registered for its frames within a fraction of a second instead of a drain later.
pub const PROGRAM_PY_EXEC: &str = "python_exec";
/// For this long after its exec, a `python*` process's samples wake the reader...
pub const PY_EXEC_WAKE_FOR_NS: u64 = 2_000_000_000;
/// ...at most this often (a wake-up costs the reader more than the sample itself).
pub const PY_EXEC_WAKE_EVERY_NS: u64 = 250_000_000;

/// Bytes of a code object read at once from its `PyProc::code_check` word, which take in the
/// `name_check` pointer too (80 bytes on: 3.8-3.10; 64 on 3.11), in one helper call.
pub const CODE_SPAN: usize = 88;
const _: () = assert!(CODE_SPAN <= FRAME_HEAD_BUF && CODE_SPAN.is_multiple_of(8));

/// Bytes of an interpreter frame read at once: every field the walk needs lies in the first
/// 72 bytes on 3.11-3.13. Not more: a 3.11+ frame can end its data-stack chunk that soon.
pub const FRAME_HEAD_BYTES: usize = 72;
/// Bytes of a 3.8-3.10 `PyFrameObject` read at once: `f_lasti` ends at 108 (3.8, 3.9); the
/// object is at least 360 bytes long, so the read never leaves it.
pub const OLD_FRAME_HEAD_BYTES: usize = 112;
/// Size of the buffer either head is read into (a power of two, so indexes can be masked).
pub const FRAME_HEAD_BUF: usize = 128;

/// `PyProc::entry_mode` values: how the end of one C-level eval-loop call shows in the frames.
pub mod entry {
    /// 3.11: the byte at `entry_byte` is `is_entry`, set on the call's first (outermost) frame.
    pub const IS_ENTRY_BYTE: u32 = 0;
    /// 3.12+: the byte at `entry_byte` is `owner`; a frame owned by the C stack (3) is a shim
    /// pushed by the eval loop below its outermost frame (not a Python function: skipped).
    pub const CSTACK_SHIM: u32 = 1;
    /// 3.8-3.10: the frames are `PyFrameObject`s, each run by its own eval-loop call (every
    /// frame is outermost); `frame_instr` is the int `f_lasti`, recorded as `f_lasti << 1`.
    pub const FRAME_OBJECT: u32 = 2;
}

/// `SampleHeader::py_flags` bits.
pub mod flags {
    /// The walk stopped at `MAX_PY_FRAMES` with frames left.
    pub const TRUNCATED: u32 = 1 << 0;
    /// A read of the process's memory failed mid-walk (the frames so far are kept).
    pub const READ_FAILED: u32 = 1 << 1;
}

/// Indexes into `MAP_PY_COUNTERS`.
pub mod counter {
    /// Samples of registered processes whose thread had Python frames.
    pub const WALKED: u32 = 0;
    /// Walks cut at `MAX_PY_FRAMES`.
    pub const TRUNCATED: u32 = 1;
    /// Walks that hit an unreadable address (the thread state or a frame).
    pub const READ_FAILED: u32 = 2;
    /// Threads of registered processes without a Python thread state (none bound, or a pthread
    /// key outside the first block the walk reads).
    pub const NO_THREAD_STATE: u32 = 3;
    /// Samples of a process just exec'd as `python*` that woke the reader (`MAP_PY_EXECS`).
    pub const EXEC_WAKES: u32 = 4;
    pub const COUNT: u32 = 5;
}

/// A Python process as the sampler needs it; byte offsets are into the named struct.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProc {
    /// Address of `_PyRuntime.autoTSSkey._key` (a pthread key) in the process.
    pub tss_key_addr: u64,
    /// glibc: `specific_1stblock[0].data` from the thread pointer (fsbase); key k's value is
    /// at fsbase + `tsd_base` + 16 k.
    pub tsd_base: u32,
    /// PyThreadState -> `_PyCFrame *cframe` (3.11, 3.12); `u32::MAX` when the current frame
    /// is in the thread state itself (3.13; `frame` on 3.8-3.10).
    pub cframe: u32,
    /// `current_frame` in the cframe (3.11, 3.12) or in the thread state (3.13).
    pub current_frame: u32,
    /// `_PyInterpreterFrame`: the code object (`f_code` / `f_executable`), 8-aligned, < 64
    /// (`PyFrameObject.f_code` on 3.8-3.10, < `OLD_FRAME_HEAD_BYTES`, as the next two).
    pub frame_code: u32,
    /// `_PyInterpreterFrame.previous` (`PyFrameObject.f_back`), 8-aligned, < 64.
    pub frame_previous: u32,
    /// `_PyInterpreterFrame.prev_instr` / `instr_ptr`, 8-aligned, < 64 (`f_lasti`, an int
    /// in the low half of its 8 bytes).
    pub frame_instr: u32,
    /// The byte `entry_mode` reads, 64..72.
    pub entry_byte: u32,
    /// `entry::*`.
    pub entry_mode: u32,
    /// The 8-aligned word of a code object folded into `PyFrame::instr`'s checksum bits
    /// (the one holding `co_firstlineno`); 0: none.
    pub code_check: u32,
    /// The code object's `co_qualname` (`co_name` before 3.11), 8-aligned, within
    /// `CODE_SPAN` bytes of `code_check`'s word: the hash its string caches (`STR_HASH`) is
    /// folded in too, so code objects alike but for their names (generated functions,
    /// exec'd strings) are told apart at a reused address; 0: none.
    pub name_check: u32,
}

const _: () = assert!(core::mem::size_of::<PyProc>() == 48);

#[cfg(feature = "user")]
// SAFETY: repr(C), integers only, no padding (size asserted above).
unsafe impl aya::Pod for PyProc {}

/// One Python frame in a sample record (innermost first).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PyFrame {
    /// Address of the code object in the process.
    pub code: u64,
    /// Offset of the frame's current instruction from the code object (3.11+) or
    /// `f_lasti << 1` (3.8-3.10, the low 32 bits shifted; -1 before the first instruction),
    /// with bit 0 set when this frame is the outermost of its C-level eval-loop call
    /// (instructions are 2-byte aligned), and the code object's checksum above `CHECK_SHIFT`.
    pub instr: u64,
}

/// Bit 0 of `PyFrame::instr`: this frame is the outermost of its eval-loop call.
pub const ENTRY_BIT: u64 = 1;
/// `PyFrame::instr` bits 33-63: a checksum of the code object as the sampler saw it
/// (`check_of` of its `PyProc::code_check` word XOR its name's hash, `PyProc::name_check`),
/// so userspace names a code object only if the one at that address when it reads is the
/// one sampled (code objects are freed and their addresses reused). Two code objects with
/// the same first line, locals and name still pass for each other, and any two have a 1 in
/// 2^31 chance of the same checksum (16 bits were too few: 20 generated functions at one
/// address over 6 s named one with another's name in a test run). Instruction offsets
/// within a code object and `f_lasti << 1` stay below bit 33.
pub const CHECK_SHIFT: u32 = 33;
/// The instruction bits of `PyFrame::instr` (entry bit included).
pub const INSTR_MASK: u64 = (1 << CHECK_SHIFT) - 1;

/// `PyASCIIObject.hash` (every str starts so): after the object header and the length, in
/// 3.8-3.14; -1 until the string is hashed, which names are when interned (the compiler
/// interns identifiers), so the sampler and userspace read the same value.
pub const STR_HASH: u64 = 24;

/// The 31-bit checksum of one word (`64 - CHECK_SHIFT` bits), the same in the sampler and
/// in userspace.
#[expect(
    clippy::inline_always,
    reason = "the sampler's copy must be inlined: the verifier sees each BPF call"
)]
#[inline(always)]
pub const fn check_of(word: u64) -> u64 {
    (word ^ (word >> 31) ^ (word >> 62)) & ((1 << (64 - CHECK_SHIFT)) - 1)
}
