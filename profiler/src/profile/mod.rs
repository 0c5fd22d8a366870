//! The profile model, fourth stage of the flow: interned strings, frames and stacks, and every
//! sample with its time. Outputs render from it; `capture` stores it on disk.
pub mod attribution;
mod capture;
mod leb128;
pub mod lifecycle;
mod lifetimes;
pub(crate) mod memcg;
mod model;
pub mod runq;
mod timeline;

pub use attribution::GroupBy;
pub use capture::{
    BUDGET_FLOOR, CAPTURE_VERSION, CaptureError, END_SLACK_NS, MAGIC, MAX_EXPANSION,
    MAX_STACK_DEPTH, MAX_STRING_BYTES, decode, encode, read_file, write_file,
};
pub(crate) use leb128::{Reader as VarintReader, Writer as VarintWriter};
pub use lifetimes::{LifetimeStats, lifetime_stats};
pub use model::{
    Binary, Cgroup, Counters, Frame, FrameKind, Interner, Lifetime, Meta, NO_CPU, Process, Profile,
    Sample, Stack, StrId, UNKNOWN_FRAME,
};
#[cfg(test)]
pub(crate) use timeline::tests::pattern_profile as timeline_pattern;
pub use timeline::{
    CpuSecond, CpuTable, DEFAULT_ROWS, Filter, HeatMap, MAX_CPU_SECONDS, MAX_SPAN_SECS,
    SATURATED_PCT, SATURATED_SECS, Span, SpanTooLong, cpu_ids, cpu_table, heat_map, is_idle,
    is_timed_busy, leaf_is_kernel, row,
};
