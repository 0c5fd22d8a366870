//! What the collect stage hands on: one span's samples and raw stacks, with the process
//! facts, Python names and cgroup paths that name them, as plain data with no live state (no
//! ring, no filters, no hooks). Symbolizing consumes it (`symbolize::build_profile`) on any
//! thread while the live `Collection` goes on collecting.
use std::collections::HashMap;

use profiler_common::python::PyFrame;

use super::{RawSample, StackTable};
use crate::process::{ProcessFacts, SpaceId};

/// One span of the recording (a window, or a whole recording), collected.
#[derive(Default)]
pub(crate) struct Collected {
    pub samples: Vec<RawSample>,
    /// Comms, indexed by `RawSample::comm`.
    pub comms: Vec<String>,
    pub kstacks: StackTable<Box<[u64]>>,
    /// User stacks per address space (pid, and which exec).
    pub ustacks: StackTable<(SpaceId, Box<[u64]>)>,
    /// Python frames, innermost first, per address space.
    pub pystacks: StackTable<(SpaceId, Box<[PyFrame]>)>,
    /// The names of this span's Python frames (None: read but not a code object).
    pub py_names: HashMap<crate::python::PyKey, Option<crate::python::PyName>>,
    pub facts: ProcessFacts,
    /// Paths of the cgroup v2 ids the samples carry ("" if the cgroup was gone).
    pub cgroup_paths: HashMap<u64, String>,
    pub counts: Counts,
}

/// What was dropped or cut short while collecting a span.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counts {
    /// Samples dropped by the comm filter or the userspace cgroup filter.
    pub filtered: u64,
    pub kstack_failed: u64,
    pub ustack_failed: u64,
    /// Kept samples whose user stack a table walk cut short, by `unwind::reason` (0: not cut).
    pub unwind_truncated: profiler_common::unwind::ByReason,
    /// Stack copies the collector walked (`flags::STACK_COPY`), by the `unwind::reason` their
    /// walk stopped at (0: it reached the entry), whether or not the walk was kept.
    pub copy_walks: profiler_common::unwind::ByReason,
    /// Samples whose Python walk was cut at `MAX_PY_FRAMES` or by an unreadable frame.
    pub py_truncated: u64,
    /// Kernel process records dropped because a ring was full: mappings may be missing.
    pub lost_records: u64,
}
