//! The perf_event_open(2) ABI (linux/perf_event.h) as the userspace side uses it: the event
//! the kernel records come from (`profiler` process/kernel_records.rs) and the set-up check
//! that the sampler's event opens (`xtask` host.rs). One layout for both.

/// `struct perf_event_attr`, version 8 (136 bytes, Linux 6.3+; older kernels accept it when
/// the fields they do not know are zero).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EventAttr {
    pub kind: u32,
    pub size: u32,
    pub config: u64,
    pub sample_period: u64,
    pub sample_type: u64,
    pub read_format: u64,
    /// The C bitfield (`attr_bit`), least significant bit first.
    pub flags: u64,
    pub wakeup_watermark: u32,
    pub bp_type: u32,
    pub config1: u64,
    pub config2: u64,
    pub branch_sample_type: u64,
    pub sample_regs_user: u64,
    pub sample_stack_user: u32,
    pub clockid: i32,
    pub sample_regs_intr: u64,
    pub aux_watermark: u32,
    pub sample_max_stack: u16,
    pub reserved_2: u16,
    pub aux_sample_size: u32,
    pub reserved_3: u32,
    pub sig_data: u64,
    pub config3: u64,
}
const _: () = assert!(core::mem::size_of::<EventAttr>() == 136);

impl EventAttr {
    /// A software event (`PERF_TYPE_SOFTWARE`) of `config`, its size filled in.
    pub fn software(config: u64) -> Self {
        Self {
            kind: TYPE_SOFTWARE,
            size: core::mem::size_of::<Self>() as u32,
            config,
            ..Self::default()
        }
    }
}

pub const TYPE_SOFTWARE: u32 = 1;
pub const COUNT_SW_CPU_CLOCK: u64 = 0;
pub const COUNT_SW_DUMMY: u64 = 9;
pub const SAMPLE_TID: u64 = 1 << 1;
pub const SAMPLE_TIME: u64 = 1 << 2;
/// perf_event_open(2)'s `flags` argument.
pub const FLAG_FD_CLOEXEC: u64 = 1 << 3;

/// `EventAttr::flags` bits.
pub mod attr_bit {
    pub const DISABLED: u64 = 1 << 0;
    pub const MMAP: u64 = 1 << 8;
    pub const COMM: u64 = 1 << 9;
    pub const TASK: u64 = 1 << 13;
    pub const WATERMARK: u64 = 1 << 14;
    pub const SAMPLE_ID_ALL: u64 = 1 << 18;
    pub const MMAP2: u64 = 1 << 23;
    pub const COMM_EXEC: u64 = 1 << 24;
    pub const USE_CLOCKID: u64 = 1 << 25;
    pub const BUILD_ID: u64 = 1 << 34;
}
