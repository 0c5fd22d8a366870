//! Unwinding without frame pointers (`--unwind dwarf|auto`), beside `bpf`: `table` compiles a
//! binary's .eh_frame into rows (on the `pool`'s threads), `loader` puts the rows (in the
//! kernel's 4-byte form, `kernel_rows`) and each process's mappings into the kernel maps that the sampler's table walk (profiler-ebpf
//! `unwind`) reads.
pub mod background;
pub mod budget;
pub mod cache;
pub mod copied;
pub mod files;
pub mod kernel_rows;
pub mod loader;
pub mod pool;
pub mod procmaps;
pub mod report;
pub mod rows_view;
pub mod table;
pub mod vdso;

pub use background::BackgroundLoader;
pub use copied::CopyUnwinder;
pub use loader::{Loader, MappingSpec};
pub use procmaps::proc_mappings;
pub use report::LoaderStats;

/// What the collector tells the loader about a process (`collect::NewProcessHook`).
#[derive(Debug)]
pub enum ProcessEvent {
    /// A sample of `pid`: its first, or one whose walk left the loaded mappings (`stale`).
    /// `mappings` are the kernel's (MMAP2 records) when they hold the process's whole
    /// address space; None: a process from before the recording, read from /proc.
    Sampled {
        pid: u32,
        stale: bool,
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

/// Which binaries of a sampled process get their unwind tables (`--unwind-tables`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TablePolicy {
    /// Every binary the process maps, at its first sample: its first stacks are whole
    /// (`record`, `doctor`).
    #[default]
    All,
    /// Only the binaries its stacks reach: a walk that leaves the binaries loaded asks for
    /// the next one, so a stack is whole after a sample per binary it crosses, and a process
    /// mapping fifty libraries that runs in three costs three tables (the agent: every host
    /// process is sampled now and then).
    Reached,
}

/// How user stacks are walked (`--unwind`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum UnwindMode {
    /// By table, except binaries whose code keeps frame pointers (walked by frame pointer).
    #[default]
    Auto,
    /// Frame pointers only (bpf_get_stack): cheapest, loses stacks through code without them.
    Fp,
    /// By table wherever a binary has one; frame pointers only where it has none.
    Dwarf,
}
