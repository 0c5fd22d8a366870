//! Shared by the kernel writer (profiler-ebpf) and the user reader (profiler::collect): the
//! sample record that crosses the BPF ring buffer, the lost-sample counters, map names.
#![no_std]

/// Deepest stack captured per side (kernel, user). The kernel's own limit
/// (`kernel.perf_event_max_stack`) defaults to 127.
pub const MAX_FRAMES: usize = 127;

/// Length of a task's comm, as the kernel keeps it (TASK_COMM_LEN).
pub const COMM_LEN: usize = 16;

/// Ring buffer size in bytes as compiled (a power of two, a multiple of the page size). The
/// loader sets the real size per run (`ring_buffer_bytes`): the agent at 19 Hz needs far less,
/// and every page of the buffer ends up in the reader's RSS (twice: the data is mapped twice).
pub const RING_BUFFER_BYTES: u32 = 8 << 20;

/// The ring buffer for `hz` samples per second on `cpus` CPUs: 2 KiB per sample-second, room
/// for a second of the deepest stacks (a record of 2 x 127 frames is 2096 bytes) and several
/// seconds of typical ones (Python frames add 16 bytes each), a power of two between 256 KiB
/// and 32 MiB (4 MiB at 999 Hz on 2 CPUs, where 30 s lose nothing; 256 KiB for the agent's
/// 19 Hz there).
pub const fn ring_buffer_bytes(hz: u64, cpus: u64) -> u32 {
    let want = hz.saturating_mul(cpus).saturating_mul(2048);
    let want = if want < 256 << 10 { 256 << 10 } else { want };
    let want = if want > 32 << 20 { 32 << 20 } else { want };
    want.next_power_of_two() as u32
}

// Compile-time checks of the sizes the docs promise: 4 MiB at 999 Hz on 2 CPUs, the floor
// for the agent's 19 Hz, a power of two always, the ceiling on huge hosts.
const _: () = assert!(ring_buffer_bytes(999, 2) == 4 << 20);
const _: () = assert!(ring_buffer_bytes(19, 2) == 256 << 10);
const _: () = assert!(ring_buffer_bytes(19, 64) == 4 << 20);
const _: () = assert!(ring_buffer_bytes(99, 3).is_power_of_two());
const _: () = assert!(ring_buffer_bytes(10_000, 4096) == 32 << 20);

/// The sampler wakes the reader only when a quarter of the ring buffer waits (the loader sets
/// `GLOBAL_WAKEUP_BYTES` to that); otherwise the reader drains on its own timer.
pub const WAKEUP_FRACTION: u32 = 4;

/// How often the reader drains the ring buffer without being woken, ms.
pub const DRAIN_INTERVAL_MS: u64 = 100;

/// Processes remembered as already sampled (LRU): the first sample of any other wakes the
/// reader at once.
pub const SEEN_PIDS_CAPACITY: u32 = 16384;

/// Capacity of the in-kernel pid filter.
pub const MAX_PID_FILTER: u32 = 1024;

/// Capacity of the in-kernel cgroup filter (cgroup2 directories in `MAP_CGROUP_FILTER`).
pub const MAX_CGROUP_FILTER: u32 = 16;

/// Map names, so both sides agree.
pub const MAP_SAMPLES: &str = "SAMPLES";
pub const MAP_COUNTERS: &str = "COUNTERS";
pub const MAP_PID_FILTER: &str = "PID_FILTER";
pub const MAP_SCRATCH: &str = "SCRATCH";
/// BPF_MAP_TYPE_CGROUP_ARRAY of cgroup2 directories: sample only tasks in one of them or below.
pub const MAP_CGROUP_FILTER: &str = "CGROUP_FILTER";
/// Processed instructions any of our programs may take on any kernel (`profiler check`, the
/// kernel matrix, tests/tests/kernel_programs.rs): a quarter of the verifier's limit
/// (1,000,000), so a stricter kernel or another compiler's code cannot reach the limit.
pub const VERIFIED_INSNS_BUDGET: u32 = 250_000;

/// The sampler's programs, one per variant (profiler-ebpf sampler.rs), most capable first:
/// table walk and Python frames; table walk; frame pointers and Python frames; frame pointers.
pub mod program {
    pub const FULL: &str = "sample_cpu";
    pub const TABLES: &str = "sample_tables";
    pub const FP_PYTHON: &str = "sample_fp_py";
    pub const FP: &str = "sample_fp";
}
/// Load-time global: 1 when only pids in PID_FILTER are sampled.
pub const GLOBAL_FILTER_PIDS: &str = "FILTER_PIDS";
/// Load-time global (u32): how many slots of CGROUP_FILTER are set; 0 = no cgroup filter.
pub const GLOBAL_FILTER_CGROUPS: &str = "FILTER_CGROUPS";
/// Global set at load time: bytes waiting in the ring buffer that wake the reader.
pub const GLOBAL_WAKEUP_BYTES: &str = "WAKEUP_BYTES";
/// Load-time global (u8): 1 = a process's first sample (and its stale mappings) wake the
/// reader at once; 0 = only a quarter-full buffer does (the agent, which drains every second).
pub const GLOBAL_WAKE_FOR_PROCESSES: &str = "WAKE_FOR_PROCESSES";

/// `SampleEvent::flags` bits.
pub mod flags {
    /// The kernel stack could not be read (the sample is kept with an empty kernel stack).
    pub const KSTACK_FAILED: u32 = 1 << 0;
    /// The user stack could not be read (kernel threads have none; that is not a failure).
    pub const USTACK_FAILED: u32 = 1 << 1;
    /// The sample interrupted user mode (no kernel frames are expected).
    pub const USER_MODE: u32 = 1 << 2;
    /// Bits 8..11: why the table walk of the user stack stopped early
    /// (`unwind::reason::*`, 0 = it did not).
    pub const UNWIND_REASON_SHIFT: u32 = 8;
    pub const UNWIND_REASON_MASK: u32 = 0xf << UNWIND_REASON_SHIFT;
    /// The record ends with a copy of the user stack (`unwind::StackCopy`, then its bytes),
    /// taken because the process's tables were not in the kernel yet (`reason::NOT_LOADED`)
    /// or the walk left its loaded mappings (`reason::NO_MAPPING`: a library mapped since,
    /// the kernel's entry not updated yet): userspace walks it with the same rows and the
    /// mappings the kernel's records gave it.
    pub const STACK_COPY: u32 = 1 << 3;
}

/// Indexes into the per-CPU `COUNTERS` array. Every sample the program sees ends in exactly
/// one of SENT / LOST_RINGBUF_FULL / FILTERED; the stack failures are counted besides.
pub mod counter {
    /// Samples written to the ring buffer.
    pub const SENT: u32 = 0;
    /// Samples dropped because the ring buffer was full (the reader fell behind).
    pub const LOST_RINGBUF_FULL: u32 = 1;
    /// Samples of processes outside the pid or cgroup filter (not lost: not wanted).
    pub const FILTERED: u32 = 2;
    /// Sent samples whose kernel stack could not be read.
    pub const KSTACK_FAILED: u32 = 3;
    /// Sent samples whose user stack could not be read.
    pub const USTACK_FAILED: u32 = 4;
    /// User stacks walked by table that stopped early, per `unwind::reason` (index
    /// UNWIND_REASON_BASE + reason; reason 0 is unused).
    pub const UNWIND_REASON_BASE: u32 = 5;
    /// Samples given a stack copy (`flags::STACK_COPY`).
    pub const STACK_COPIES: u32 = UNWIND_REASON_BASE + 7;
    /// Samples that wanted a stack copy and were sent without one: the ring buffer was half
    /// full already, or the CPU's copy ration was spent (`unwind::COPIES_PER_SECOND`).
    pub const STACK_COPIES_REFUSED: u32 = STACK_COPIES + 1;
    /// Number of counters.
    pub const COUNT: u32 = STACK_COPIES_REFUSED + 1;
}

/// The fixed part of one sample record in the ring buffer. The record is variable length:
/// this header, then `kstack_len` kernel addresses, then `ustack_len` user addresses (u64
/// each, leaf first), then `py_len` Python frames (two u64 each, innermost first), so only
/// the frames a stack really has are copied.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SampleHeader {
    /// CLOCK_MONOTONIC time of the sample, ns (bpf_ktime_get_ns).
    pub time_ns: u64,
    /// cgroup v2 id of the task (bpf_get_current_cgroup_id): the inode of its cgroup2 directory.
    pub cgroup_id: u64,
    /// Process id (the kernel's tgid).
    pub pid: u32,
    /// Thread id (the kernel's pid).
    pub tid: u32,
    /// CPU the sample was taken on.
    pub cpu: u32,
    /// `flags::*` bits.
    pub flags: u32,
    /// Kernel addresses following the header.
    pub kstack_len: u32,
    /// User addresses following the kernel ones.
    pub ustack_len: u32,
    /// Python frames (`PyFrame`, 16 bytes each) following the user addresses; 0 for every
    /// process not registered in `MAP_PY_PROCS`.
    pub py_len: u32,
    /// `python::flags::*` bits of the Python walk (0 when none was made).
    pub py_flags: u32,
    /// Task comm, NUL padded.
    pub comm: [u8; COMM_LEN],
}

/// The eBPF side's per-CPU scratch space where a record is assembled before one copy into the
/// ring buffer: the header and room for both stacks.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SampleScratch {
    pub header: SampleHeader,
    pub frames: [u64; 2 * MAX_FRAMES + 2 * python::MAX_PY_FRAMES],
    /// Room for a stack copy (`flags::STACK_COPY`) written right after the last frame in use
    /// (at most `unwind::COPY_AT_MASK` bytes into the scratch, the bound the verifier sees):
    /// its registers, `COPY_BYTES`, and one page of slack the verifier needs (it cannot see
    /// that the page-sized reads add up to no more than `COPY_BYTES`).
    pub copy: [u64; COPY_ROOM / 8],
}

/// Bytes of `SampleScratch::copy`: from the end of the frames to `COPY_AT_MASK`, then the
/// copy's header, bytes and slack.
const COPY_ROOM: usize = unwind::COPY_AT_MASK + 1 - HEADER_BYTES - FRAME_BYTES
    + unwind::COPY_HEADER_BYTES
    + unwind::COPY_BYTES
    + unwind::COPY_CHUNK;
const FRAME_BYTES: usize = 8 * (2 * MAX_FRAMES + 2 * python::MAX_PY_FRAMES);

/// Size of the header in bytes.
pub const HEADER_BYTES: usize = core::mem::size_of::<SampleHeader>();

// The layout is an ABI between two compilers: pin it.
const _: () = assert!(HEADER_BYTES == 64);
const _: () = assert!(
    core::mem::size_of::<SampleScratch>()
        == unwind::COPY_AT_MASK
            + 1
            + unwind::COPY_HEADER_BYTES
            + unwind::COPY_BYTES
            + unwind::COPY_CHUNK
);
// Every frame ends below the copy's furthest start.
const _: () = assert!(HEADER_BYTES + FRAME_BYTES <= unwind::COPY_AT_MASK + 1);
// A per-CPU map value may not exceed 32 KiB (the kernel's PCPU_MIN_UNIT_SIZE).
const _: () = assert!(core::mem::size_of::<SampleScratch>() <= 32 << 10);
const _: () = assert!(core::mem::align_of::<SampleHeader>() == 8);

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers and arrays of integers, no padding (size asserted above).
unsafe impl aya::Pod for SampleHeader {}

#[cfg(not(target_arch = "bpf"))]
pub mod caps;
pub mod perf;
pub mod python;

/// cgroup churn tracer (profiler-ebpf `churn`): map and program names, and the map's key.
pub mod churn {
    use super::COMM_LEN;

    /// HashMap<ChurnKey, u64>: events counted per process and kind (exact totals).
    pub const MAP_CHURN: &str = "CHURN";
    /// Capacity of `MAP_CHURN` (distinct process x event pairs).
    pub const MAX_ENTRIES: u32 = 4096;
    /// LruHashMap<ChurnPathKey, u64>: the same events per cgroup path, so userspace can say
    /// under which parents they happened. A burst of more new cgroups than it holds evicts
    /// the oldest paths: the totals stay exact, the places are those of the latest.
    pub const MAP_CHURN_PATHS: &str = "CHURN_PATHS";
    /// Capacity of `MAP_CHURN_PATHS`.
    pub const MAX_PATHS: u32 = 4096;
    pub const PROGRAM_MKDIR: &str = "churn_mkdir";
    pub const PROGRAM_RMDIR: &str = "churn_rmdir";
    /// `ChurnKey::event` values.
    pub const EVENT_MKDIR: u32 = 0;
    pub const EVENT_RMDIR: u32 = 1;
    /// Bytes kept of a cgroup's path (longer paths are cut): a Kubernetes container's, under
    /// the systemd driver, is about 190 (`/kubepods.slice/kubepods-burstable.slice/
    /// kubepods-burstable-pod<uid>.slice/cri-containerd-<64 hex>.scope`).
    pub const PATH_LEN: usize = 256;

    /// Who made or removed cgroups.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct ChurnKey {
        /// Process id (tgid) of the caller.
        pub pid: u32,
        /// `EVENT_MKDIR` or `EVENT_RMDIR`.
        pub event: u32,
        /// Caller's thread comm, NUL padded.
        pub comm: [u8; COMM_LEN],
    }

    const _: () = assert!(core::mem::size_of::<ChurnKey>() == 24);

    #[cfg(feature = "user")]
    // SAFETY: repr(C), integers only, no padding (size asserted above).
    unsafe impl aya::Pod for ChurnKey {}

    /// Which cgroup a process made or removed.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct ChurnPathKey {
        /// Process id (tgid) of the caller.
        pub pid: u32,
        /// `EVENT_MKDIR` or `EVENT_RMDIR`.
        pub event: u32,
        /// Path of the cgroup within its hierarchy (`/zsvc/run-12`), NUL padded.
        pub path: [u8; PATH_LEN],
    }

    impl Default for ChurnPathKey {
        fn default() -> Self {
            Self {
                pid: 0,
                event: 0,
                path: [0; PATH_LEN],
            }
        }
    }

    const _: () = assert!(core::mem::size_of::<ChurnPathKey>() == 8 + PATH_LEN);

    #[cfg(feature = "user")]
    // SAFETY: repr(C), integers and bytes only, no padding (size asserted above).
    unsafe impl aya::Pod for ChurnPathKey {}

    /// HashMap<AttachKey, u64>: processes moved into a cgroup (cgroup_attach_task), so the
    /// doctor can say which programs ran in a cgroup that is made and removed again and again.
    pub const MAP_ATTACH: &str = "ATTACH";
    /// Capacity of `MAP_ATTACH`: one entry per process and cgroup path; a crash loop
    /// restarting 10 times a second in a new cgroup fills a tenth of it in a 60 s window (the
    /// agent empties it every window).
    pub const MAX_ATTACH: u32 = 8192;
    pub const PROGRAM_ATTACH: &str = "churn_attach";
    /// Load-time global (u64): offset of `tgid` in the running kernel's `task_struct` (from
    /// its BTF); 0 leaves the attach program idle.
    pub const GLOBAL_TGID_OFFSET: &str = "TGID_OFFSET";
    /// A process moved into a cgroup.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct AttachKey {
        /// The moved process (tgid of the task, not of the caller: a service manager moves
        /// its children).
        pub pid: u32,
        /// Path of the cgroup within its hierarchy (`/system.slice/x.service`), NUL padded.
        pub path: [u8; PATH_LEN],
    }

    impl Default for AttachKey {
        fn default() -> Self {
            Self {
                pid: 0,
                path: [0; PATH_LEN],
            }
        }
    }

    const _: () = assert!(core::mem::size_of::<AttachKey>() == 4 + PATH_LEN);

    #[cfg(feature = "user")]
    // SAFETY: repr(C), integers and bytes only, no padding (size asserted above).
    unsafe impl aya::Pod for AttachKey {}
}

/// Stack unwinding without frame pointers (`--unwind dwarf|auto`): the tables userspace compiles
/// from `.eh_frame` (profiler::unwind) and the kernel walks (profiler-ebpf `unwind`).
pub mod unwind {
    /// Map names and load-time globals.
    pub const MAP_ROWS: &str = "UNWIND_ROWS";
    pub const MAP_RULES: &str = "UNWIND_RULES";
    pub const MAP_PROCS: &str = "UNWIND_PROCS";
    /// Words (u32: kernel rows and page indexes) of UNWIND_ROWS as compiled; the loader
    /// sets the real count from `--unwind-memory`.
    pub const DEFAULT_ROWS: u32 = 64 << 20 >> 2;
    /// Words in one element of UNWIND_ROWS and UNWIND_RULES: an array map stores each
    /// element in a multiple of 8 bytes (`round_up(value_size, 8)`), so 4-byte values would
    /// take 8 bytes each; two to an element take 4. The mmap of UNWIND_ROWS is then a plain
    /// array of u32.
    pub const WORDS_PER_ELEMENT: u32 = 2;
    /// Code pages of the kernel layout: a kernel row's high 16 bits are its pc's offset in a
    /// page of this many bytes of file vaddr (`PAGE_SHIFT` bits).
    pub const PAGE_SHIFT: u32 = 16;
    /// Distinct rules UNWIND_RULES holds (two to an element), shared by every binary and
    /// never freed (a kernel row's low 16 bits index it). A binary whose rules do not fit
    /// gets no table.
    pub const MAX_RULES: u32 = 1 << 16;
    /// Processes whose mappings the kernel holds at once.
    pub const MAX_PROCS: u32 = 4096;
    /// Executable mappings kept per process (sorted by start); more are left out and their
    /// frames stop with `reason::NO_MAPPING`.
    pub const MAX_MAPPINGS: usize = 64;
    /// User frames the table walk produces at most (the same limit as a frame-pointer stack).
    pub const MAX_FRAMES: u32 = crate::MAX_FRAMES as u32;
    /// Binary search steps inside one page: a page has at most 2^16 rows (one per byte),
    /// and the search starts at the row before them (the rule in force at offset 0), so
    /// 2^16 + 1 candidates.
    pub const SEARCH_STEPS: u32 = 17;

    /// `UnwindRow::kind` values: how the CFA (the caller's RSP) is found.
    pub mod kind {
        /// No unwind information here (a gap between functions): the walk stops.
        pub const NONE: u8 = 0;
        /// CFA = RSP + cfa_off.
        pub const CFA_RSP: u8 = 1;
        /// CFA = RBP + cfa_off.
        pub const CFA_RBP: u8 = 2;
        /// A PLT stub: CFA = RSP + 8, + 8 more when (pc & 15) >= cfa_off (the expression
        /// binutils writes for .plt entries, which push once halfway through).
        pub const PLT: u8 = 3;
        /// The return address is undefined: the outermost frame (`_start`, thread entry).
        pub const STOP: u8 = 4;
        /// A rule the kernel walk does not follow (a DWARF expression, another register).
        pub const UNSUPPORTED: u8 = 5;
        /// A signal frame (`__restore_rt`): RSP = *(RSP + cfa_off), the interrupted RIP
        /// follows it, RBP is at RSP + cfa_off + 8 x rbp_off (the sigcontext in the ucontext
        /// the kernel pushed). The next frame's address is exact, not a return address.
        pub const SIGNAL: u8 = 6;
    }

    /// One row of a binary's table as userspace keeps it (compiled, cached on disk, walked
    /// over stack copies): the rule from `pc` (a file virtual address) up to the next row's.
    /// x86_64: the return address is always at CFA - 8. The kernel holds it as a 4-byte
    /// row, the pc's offset in its 64 KiB page and the index of its `UnwindRule` in
    /// UNWIND_RULES (docs/unwinding.md, "The kernel's table format").
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct UnwindRow {
        /// First address (file vaddr, binaries below 4 GiB) the rule covers.
        pub pc: u32,
        /// Offset added to the CFA's base register (bytes), or the PLT threshold.
        pub cfa_off: u16,
        /// Where the caller's RBP was saved, in 8-byte units from the CFA (negative); 0 = RBP
        /// is unchanged by this frame.
        pub rbp_off: i8,
        /// `kind::*`.
        pub kind: u8,
    }
    const _: () = assert!(core::mem::size_of::<UnwindRow>() == 8);

    /// A row's rule without its address: what UNWIND_RULES holds, one copy per distinct
    /// rule (libc has a few hundred), indexed by the low 16 bits of the kernel's rows.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct UnwindRule {
        /// As `UnwindRow::cfa_off`.
        pub cfa_off: u16,
        /// As `UnwindRow::rbp_off`.
        pub rbp_off: i8,
        /// `kind::*`; the all-zero rule (index 0, never written) is `kind::NONE`.
        pub kind: u8,
    }
    const _: () = assert!(core::mem::size_of::<UnwindRule>() == 4);

    impl UnwindRow {
        /// Its rule, without the address.
        pub const fn rule(&self) -> UnwindRule {
            UnwindRule {
                cfa_off: self.cfa_off,
                rbp_off: self.rbp_off,
                kind: self.kind,
            }
        }
    }

    /// `UnwindMapping::kind` values.
    pub mod mapping {
        /// Walk this binary's frames by frame pointer (it keeps them, or has no table). Its
        /// rows, if it has any, are only `kind::STOP` ranges (Go's thread entries): the walk
        /// ends there.
        pub const FRAME_POINTER: u32 = 0;
        /// Walk by the table whose page index starts at `table_start`.
        pub const TABLE: u32 = 1;
        /// Its table is still being compiled (the process's other binaries are walkable
        /// already): a walk reaching it stops as `reason::NOT_LOADED`, and the sampler
        /// copies the stack for userspace to walk.
        pub const PENDING: u32 = 2;
        /// No walk reached this binary yet (`--unwind-tables reached`): it has no table, and
        /// a walk reaching it stops as `reason::NO_MAPPING` (the stack is copied), which has
        /// userspace compile its table and load the process again.
        pub const UNREACHED: u32 = 3;
    }

    /// One executable mapping of a process.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct UnwindMapping {
        /// Address range [start, end) in the process.
        pub start: u64,
        pub end: u64,
        /// Subtracted from an address to get the binary's file vaddr (the table's `pc`).
        pub bias: u64,
        /// Where the binary's slice of UNWIND_ROWS starts: its page index, `pages + 1`
        /// entries (the absolute index of each page's first row, then the end of its rows).
        pub table_start: u32,
        /// Pages of 2^PAGE_SHIFT bytes the table covers, from `first_page` on; 0: no table.
        pub pages: u32,
        /// `mapping::*`.
        pub kind: u32,
        /// The file vaddr of the table's first row >> PAGE_SHIFT.
        pub first_page: u32,
    }
    const _: () = assert!(core::mem::size_of::<UnwindMapping>() == 40);

    /// The value of UNWIND_PROCS (key: tgid): the process's executable mappings sorted by start.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct ProcMappings {
        pub count: u32,
        #[expect(
            clippy::pub_underscore_fields,
            reason = "repr(C) padding the other crates initialize"
        )]
        pub _pad: u32,
        pub maps: [UnwindMapping; MAX_MAPPINGS],
    }
    const _: () = assert!(core::mem::size_of::<ProcMappings>() == 8 + 40 * MAX_MAPPINGS);

    /// Counts by `unwind::reason` code: of samples whose table walk was cut short, or of walks
    /// of stack copies (index 0, `none`: reached the entry, not a cut).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct ByReason(pub [u64; reason::NAMES.len()]);

    impl ByReason {
        /// Counts one of `code` (an unknown code is not counted).
        pub fn add(&mut self, code: u32) {
            if let Some(n) = self.0.get_mut(code as usize) {
                *n += 1;
            }
        }

        /// Adds every count of `other`.
        pub fn add_all(&mut self, other: &ByReason) {
            for (total, n) in self.0.iter_mut().zip(other.0) {
                *total += n;
            }
        }

        /// The cuts, by code and count, `none` left out.
        pub fn cuts(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
            self.0.iter().copied().enumerate().skip(1)
        }

        pub fn total(&self) -> u64 {
            self.0.iter().sum()
        }
    }

    /// Why a table walk stopped before the entry (the header's `flags` bits 8..11, and the
    /// `counter::UNWIND_*` index of each).
    pub mod reason {
        /// Reached the entry (or a zero return address): not a truncation.
        pub const NONE: u32 = 0;
        /// The process's mappings, or the table of the binary the walk reached, were not
        /// loaded yet: walked by frame pointer instead, and the stack copied
        /// (`flags::STACK_COPY`) for userspace to walk by table.
        pub const NOT_LOADED: u32 = 1;
        /// An address in no known executable mapping.
        pub const NO_MAPPING: u32 = 2;
        /// An address the binary's table has no row for.
        pub const NO_ROW: u32 = 3;
        /// Reading the user stack failed.
        pub const READ_FAULT: u32 = 4;
        /// MAX_FRAMES frames walked and the entry not reached.
        pub const FRAME_LIMIT: u32 = 5;
        /// A rule the kernel does not follow (`kind::UNSUPPORTED`).
        pub const UNSUPPORTED: u32 = 6;
        /// Names, by code, as reports print them.
        pub const NAMES: [&str; 7] = [
            "none",
            "not loaded",
            "no mapping",
            "no unwind info",
            "read fault",
            "frame limit",
            "unsupported rule",
        ];
    }

    /// Most user-stack bytes copied into a record whose process's tables are not in the kernel
    /// yet (`flags::STACK_COPY`), from RSP up. perf's `--call-graph dwarf` copies 8 KiB by
    /// default; 16 KiB reaches the entry of deeper interpreters too. Read a page at a time, so a
    /// stack whose top is nearer than this gives what it has.
    pub const COPY_BYTES: usize = 16 << 10;
    /// The copy starts after the record's last frame, at an offset masked with this for the
    /// verifier (a power of two less one, above the header and every frame).
    pub const COPY_AT_MASK: usize = 0x1fff;
    /// Stack copies a CPU sends per second at most (counted per 100 ms): a copy is up to 16
    /// KiB, and a host starting many processes (a build) or one whose huge library compiles
    /// for seconds would otherwise fill the ring buffer with them. At 99 Hz it never binds;
    /// a sample over it keeps the walk it has, cut as the kernel walk was.
    pub const COPIES_PER_SECOND: u32 = 100;
    /// The unit of those reads: a page (a read that crosses into an unmapped page fails whole).
    pub const COPY_CHUNK: usize = 4096;
    /// Size of `StackCopy`.
    pub const COPY_HEADER_BYTES: usize = core::mem::size_of::<StackCopy>();

    /// Starts a record's stack copy (after its Python frames): the registers the walk starts
    /// from and how many stack bytes, from `sp` up, follow.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct StackCopy {
        pub ip: u64,
        pub sp: u64,
        pub bp: u64,
        /// Bytes copied (0 when even the first read failed), at most `COPY_BYTES`.
        pub len: u64,
    }
    const _: () = assert!(core::mem::size_of::<StackCopy>() == 32);

    #[cfg(feature = "user")]
    // SAFETY: repr(C), integers only, no padding (sizes asserted above).
    unsafe impl aya::Pod for UnwindRow {}
    #[cfg(feature = "user")]
    // SAFETY: as above.
    unsafe impl aya::Pod for UnwindRule {}
    #[cfg(feature = "user")]
    // SAFETY: as above.
    unsafe impl aya::Pod for UnwindMapping {}
    #[cfg(feature = "user")]
    // SAFETY: as above.
    unsafe impl aya::Pod for ProcMappings {}
}

/// Process exits (profiler-ebpf `exits`): the kernel's own process records (perf's
/// PERF_RECORD_EXIT) carry no exit status, so a raw tracepoint on sched_process_exit sends it.
pub mod exits {
    /// BPF ring buffer of `ExitEvent`s.
    pub const MAP_EXITS: &str = "EXITS";
    /// Size of `MAP_EXITS`, bytes: 16 K exits between two drains (the agent drains every
    /// second; a build that forks faster than that loses exit statuses, not samples).
    pub const EXITS_BYTES: u32 = 256 << 10;
    pub const PROGRAM_EXIT: &str = "process_exit";
    /// Load-time global (u64): offset of `exit_code` in the running kernel's `task_struct`,
    /// found in its BTF by the loader (no CO-RE in our toolchain); 0 leaves the program idle.
    pub const GLOBAL_EXIT_CODE_OFFSET: &str = "EXIT_CODE_OFFSET";

    /// One process (thread group leader) exiting.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct ExitEvent {
        /// CLOCK_MONOTONIC time of the exit, ns (bpf_ktime_get_ns), as samples carry.
        pub time_ns: u64,
        /// Process id (tgid).
        pub pid: u32,
        /// The exit status in wait(2) form: `code << 8`, or the signal number (| 0x80 when
        /// it dumped core).
        pub status: u32,
    }

    const _: () = assert!(core::mem::size_of::<ExitEvent>() == 16);

    #[cfg(feature = "user")]
    // SAFETY: repr(C), integers only, no padding (size asserted above).
    unsafe impl aya::Pod for ExitEvent {}
}

/// Run-queue latency (profiler-ebpf `runq`): a raw tracepoint on sched_switch reads, from the
/// task being switched out, what the kernel itself counts of its waits in run queues (its
/// `sched_info`: the waits' sum and the number of times it got a CPU, the schedstat of
/// /proc/PID/schedstat), and keeps the difference since the thread's previous switch-out:
/// its last wait, whole, wherever it began. One map lookup a switch and no wake-up hook.
/// Histograms per CPU and per cgroup.
pub mod runq {
    use super::COMM_LEN;

    /// LruHashMap<u32 tid, Thread>: every thread's baseline and totals. Threads that exited
    /// are the least recently used, so they go first when it is full.
    pub const MAP_THREADS: &str = "RUNQ_THREADS";
    pub const MAX_THREADS: u32 = 32768;
    /// PerCpuArray<CpuRow> of one entry: each CPU's waits (of threads that then ran there)
    /// per log2 bucket, and their sum in ns. A CPU writes only its own row, so no atomics, and
    /// userspace reads every CPU's in one lookup.
    pub const MAP_CPU_HIST: &str = "RUNQ_CPU_HIST";
    /// `CpuRow`: `BUCKETS` counts, then the waits' sum, ns.
    pub const CPU_ROW: usize = BUCKETS + 1;
    pub type CpuRow = [u64; CPU_ROW];
    /// PerCpuHashMap<CgroupBucket, u64>: waits per cgroup (cgroup2 id of the waiting thread)
    /// and log2 bucket; per CPU so that an increment needs no atomic instruction (5.10 has
    /// no fetch-and-add for BPF), summed by userspace.
    pub const MAP_CGROUP_HIST: &str = "RUNQ_CGROUP_HIST";
    pub const MAX_CGROUP_BUCKETS: u32 = 4096;
    /// PerCpuArray<u64> of `counter::COUNT`.
    pub const MAP_COUNTERS: &str = "RUNQ_COUNTERS";
    /// Buckets of a histogram: bucket 0 holds waits under 2 us, bucket b >= 1 waits in
    /// [2^b, 2^(b+1)) us, the last everything longer (over 2^31 us: half an hour).
    pub const BUCKETS: usize = 32;
    pub const PROGRAM_SWITCH: &str = "runq_switch";
    /// Load-time globals (u64), offsets in the running kernel's `task_struct` from its BTF
    /// (as `exits` does): of `sched_info.pcount`, `sched_info.run_delay`,
    /// `sched_info.last_arrival`, `se.exec_start`, `se.sum_exec_runtime` and `start_time`. A
    /// zero `run_delay` offset leaves the program idle.
    pub const GLOBAL_PCOUNT_OFFSET: &str = "RUNQ_PCOUNT_OFFSET";
    pub const GLOBAL_RUN_DELAY_OFFSET: &str = "RUNQ_RUN_DELAY_OFFSET";
    pub const GLOBAL_ARRIVAL_OFFSET: &str = "RUNQ_ARRIVAL_OFFSET";
    pub const GLOBAL_EXEC_START_OFFSET: &str = "RUNQ_EXEC_START_OFFSET";
    pub const GLOBAL_SUM_EXEC_OFFSET: &str = "RUNQ_SUM_EXEC_OFFSET";
    pub const GLOBAL_START_TIME_OFFSET: &str = "RUNQ_START_TIME_OFFSET";
    /// Load-time global (u64): CLOCK_MONOTONIC ns when the tracer starts. A thread first seen
    /// that started after it has all its waits counted; an older one from its next wait on.
    pub const GLOBAL_TRACE_START: &str = "RUNQ_TRACE_START";

    /// Counters of the runq program.
    pub mod counter {
        /// Switches seen.
        pub const SWITCHES: u32 = 0;
        /// Waits timed.
        pub const WAITS: u32 = 1;
        /// A thread could not be added to `MAP_THREADS` (its waits are not timed).
        pub const THREADS_FULL: u32 = 2;
        /// A wait could not be added to `MAP_CGROUP_HIST` (it is in the CPU's histogram).
        pub const CGROUP_HIST_FULL: u32 = 3;
        pub const COUNT: u32 = 4;
    }

    /// One thread, as the program keeps it.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Thread {
        /// The kernel's counts at its last switch-out (`sched_info.pcount` and `run_delay`,
        /// `se.sum_exec_runtime`): the next switch-out's difference is what happened since.
        pub seen_pcount: u64,
        pub seen_run_delay: u64,
        pub seen_runtime: u64,
        /// CLOCK_MONOTONIC ns of its last switch-out.
        pub seen_ns: u64,
        /// Time on a CPU and in run queues, counted since tracing started.
        pub runtime_ns: u64,
        pub delay_ns: u64,
        /// The longest wait: how long, when it ended, on which CPU.
        pub max_delay_ns: u64,
        pub max_end_ns: u64,
        /// cgroup2 id as of its last switch-out.
        pub cgroup_id: u64,
        /// Process id (tgid) as of its last switch-out.
        pub pid: u32,
        pub max_cpu: u32,
        /// Waits counted (the times it got a CPU).
        pub waits: u32,
        /// Waits that began with a preemption (the rest with a wake-up or a yield).
        pub preempted: u32,
        /// 1 when its last switch-out was a preemption: the wait it began is one.
        pub out_preempted: u32,
        /// Keeps `comm` 8-byte aligned with no hidden padding.
        pub pad: u32,
        /// Thread comm, NUL padded (read now and then: `runq_switch`).
        pub comm: [u8; COMM_LEN],
    }
    const _: () = assert!(core::mem::size_of::<Thread>() == 112);

    /// Key of `MAP_CGROUP_HIST`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct CgroupBucket {
        pub cgroup_id: u64,
        pub bucket: u64,
    }
    const _: () = assert!(core::mem::size_of::<CgroupBucket>() == 16);

    /// The bucket of a wait of `ns` nanoseconds (see `BUCKETS`).
    #[inline]
    pub fn bucket(ns: u64) -> u32 {
        // A binary search over the bits (no loop: every kernel's verifier checks it once).
        let mut us = ns / 1000;
        if us >= 1 << 32 {
            return BUCKETS as u32 - 1;
        }
        let mut b = 0u32;
        if us >= 1 << 16 {
            us >>= 16;
            b += 16;
        }
        if us >= 1 << 8 {
            us >>= 8;
            b += 8;
        }
        if us >= 1 << 4 {
            us >>= 4;
            b += 4;
        }
        if us >= 1 << 2 {
            us >>= 2;
            b += 2;
        }
        if us >= 2 {
            b += 1;
        }
        b
    }

    /// The smallest wait, ns, of bucket `b`.
    pub const fn bucket_floor_ns(b: usize) -> u64 {
        if b == 0 { 0 } else { (1u64 << b) * 1000 }
    }

    #[cfg(feature = "user")]
    // SAFETY: repr(C), integers only, no padding (sizes asserted above).
    unsafe impl aya::Pod for Thread {}
    #[cfg(feature = "user")]
    // SAFETY: as above.
    unsafe impl aya::Pod for CgroupBucket {}

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn buckets_are_log2_of_microseconds() {
            assert_eq!(bucket(0), 0);
            assert_eq!(bucket(1_999), 0);
            assert_eq!(bucket(2_000), 1);
            assert_eq!(bucket(3_999), 1);
            assert_eq!(bucket(4_000), 2);
            assert_eq!(bucket(1_000_000), 9); // 1 ms = 2^9.97 us
            assert_eq!(bucket(1_000_000_000), 19); // 1 s = 2^19.93 us
            assert_eq!(bucket(u64::MAX), BUCKETS as u32 - 1);
            for b in 1..BUCKETS - 1 {
                assert_eq!(bucket(bucket_floor_ns(b)), b as u32);
                assert_eq!(bucket(bucket_floor_ns(b + 1) - 1000), b as u32);
            }
        }
    }
}
