//! Shared by the kernel writer (profiler-ebpf) and the user reader (profiler::collect): the
//! sample record that crosses the BPF ring buffer, the lost-sample counters, map names.
#![no_std]

/// Deepest stack captured per side (kernel, user). The kernel's own limit
/// (`kernel.perf_event_max_stack`) defaults to 127.
pub const MAX_FRAMES: usize = 127;

/// Length of a task's comm, as the kernel keeps it (TASK_COMM_LEN).
pub const COMM_LEN: usize = 16;

/// Ring buffer size in bytes (a power of two, a multiple of the page size). 8 MiB holds
/// about 4000 samples: two seconds of 999 Hz on two CPUs, a long stall for the reader.
pub const RING_BUFFER_BYTES: u32 = 8 << 20;

/// Capacity of the in-kernel pid filter.
pub const MAX_PID_FILTER: u32 = 1024;

/// Map names, so both sides agree.
pub const MAP_SAMPLES: &str = "SAMPLES";
pub const MAP_COUNTERS: &str = "COUNTERS";
pub const MAP_PID_FILTER: &str = "PID_FILTER";
pub const PROGRAM_NAME: &str = "sample_cpu";
/// Load-time global: 1 when only pids in PID_FILTER are sampled.
pub const GLOBAL_FILTER_PIDS: &str = "FILTER_PIDS";

/// `SampleEvent::flags` bits.
pub mod flags {
    /// The kernel stack could not be read (the sample is kept with an empty kernel stack).
    pub const KSTACK_FAILED: u32 = 1 << 0;
    /// The user stack could not be read (kernel threads have none; that is not a failure).
    pub const USTACK_FAILED: u32 = 1 << 1;
    /// The sample interrupted user mode (no kernel frames are expected).
    pub const USER_MODE: u32 = 1 << 2;
}

/// Indexes into the per-CPU `COUNTERS` array. Every sample the program sees ends in exactly
/// one of SENT / LOST_RINGBUF_FULL / FILTERED; the stack failures are counted besides.
pub mod counter {
    /// Samples written to the ring buffer.
    pub const SENT: u32 = 0;
    /// Samples dropped because the ring buffer was full (the reader fell behind).
    pub const LOST_RINGBUF_FULL: u32 = 1;
    /// Samples of processes outside the pid filter (not lost: not wanted).
    pub const FILTERED: u32 = 2;
    /// Sent samples whose kernel stack could not be read.
    pub const KSTACK_FAILED: u32 = 3;
    /// Sent samples whose user stack could not be read.
    pub const USTACK_FAILED: u32 = 4;
    /// Number of counters.
    pub const COUNT: u32 = 5;
}

/// One sample as the eBPF program writes it into the ring buffer. Fixed size: the ring buffer
/// reservation must be a constant; `kstack_len`/`ustack_len` say how much is valid.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SampleEvent {
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
    /// Valid entries in `kstack`.
    pub kstack_len: u32,
    /// Valid entries in `ustack`.
    pub ustack_len: u32,
    /// Task comm, NUL padded.
    pub comm: [u8; COMM_LEN],
    /// Kernel return addresses, leaf first.
    pub kstack: [u64; MAX_FRAMES],
    /// User return addresses, leaf first.
    pub ustack: [u64; MAX_FRAMES],
}

// The layout is an ABI between two compilers: pin it.
const _: () = assert!(core::mem::size_of::<SampleEvent>() == 56 + 2 * 8 * MAX_FRAMES);
const _: () = assert!(core::mem::align_of::<SampleEvent>() == 8);

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers and arrays of integers, no padding (size asserted above).
unsafe impl aya::Pod for SampleEvent {}
