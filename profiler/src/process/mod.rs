//! What we know about processes, taken while they live because it vanishes with them: the
//! kernel's side-band records (`kernel_records`: mappings, exec, fork, exit, read as they
//! happen) kept in time (`mappings`, `lifetimes`), each process's exe, comm and where its user
//! addresses fall (`table`), the binaries it maps opened once and kept open (`files`) and
//! what their headers say (`binary`: build id, debug file), through the one boundary that
//! opens files on another process's behalf (`untrusted`), and the perf maps that name its JIT
//! code (`perfmap`, `jit`). The collector feeds it from the rings; symbolization, the unwind
//! loader and the Python tracker read it.
mod binary;
mod events;
mod files;
mod jit;
mod kernel_records;
mod lifetimes;
mod mappings;
mod perfmap;
mod table;
pub(crate) mod untrusted;

pub(crate) use binary::{file_build_id, find_debug_file, interpreter_named};
#[cfg(test)]
pub(crate) use events::unseen_lives;
pub(crate) use events::{ProcessEvents, mapped_and_exited, sampled_pids};
pub(crate) use files::UserFile;
pub(crate) use kernel_records::{KernelRecord, KernelRecords};
pub(crate) use mappings::MappingSpec;
pub use perfmap::{PerfMap, ns_pid};
#[cfg(test)]
pub(crate) use table::tests::map_record;
pub(crate) use table::{
    ProcessFacts, ProcessTable, SpaceId, TableBounds, UserLoc, procmap_query_supported, space_id,
    space_pid,
};

/// What the collector tells the loader about a process (`NewProcessHook`).
#[derive(Debug)]
pub(crate) enum ProcessEvent {
    /// A sample of `pid`: its first, or one whose walk left the loaded mappings.
    /// `mappings` are the kernel's (MMAP2 records) when they hold the process's whole
    /// address space; None: a process from before the recording, read from /proc.
    Sampled {
        pid: u32,
        /// The process had exited by the time its sample was read: nothing is loaded for
        /// it, but its binaries' tables are built (its stack copies are walked with them).
        gone: bool,
        mappings: Option<Vec<MappingSpec>>,
        /// The user addresses the sample's walk reached, leaf first (`TablePolicy::Reached`
        /// compiles the tables of their binaries only).
        reached: Vec<u64>,
    },
    /// The kernel reported new executable mappings of `pid` (an exec, ld.so, a dlopen);
    /// `mappings` is its whole space now, None for a process from before the recording
    /// (read from /proc if it was sampled). Loaded at once when that costs no table build.
    Mapped {
        pid: u32,
        mappings: Option<Vec<MappingSpec>>,
    },
    /// `pid` exited: its kernel entry goes, and its binaries may be evicted.
    Exited { pid: u32 },
}

/// Where the collector sends `ProcessEvent`s (`Collection::on_new_process`); `session` wires
/// it to the unwind loader.
pub(crate) type NewProcessHook = Box<dyn FnMut(ProcessEvent) + Send>;
