//! The profile model, fourth stage of the flow: interned strings, frames and stacks, and every
//! sample with its time. Outputs render from it; `capture` stores it on disk.
pub mod attribution;
mod capture;
pub mod lifecycle;
mod lifetimes;
mod model;
mod timeline;

pub use attribution::GroupBy;
pub use capture::{CAPTURE_VERSION, CaptureError, MAGIC, decode, encode, read_file, write_file};
pub use lifetimes::{LifetimeStats, lifetime_stats};
pub use model::{
    Binary, Cgroup, Counters, Frame, FrameKind, Interner, Lifetime, Meta, Process, Profile, Sample,
    Stack, StrId,
};
#[cfg(test)]
pub(crate) use timeline::tests::pattern_profile as timeline_pattern;
pub use timeline::{
    CpuSecond, CpuTable, DEFAULT_ROWS, Filter, HeatMap, SATURATED_PCT, SATURATED_SECS, Span,
    cpu_table, heat_map, is_idle, leaf_is_kernel, row,
};
