//! Unwinding without frame pointers (`--unwind dwarf|auto`), beside `bpf`: `table` compiles a
//! binary's .eh_frame into rows (on the `pool`'s threads), `loader` puts the rows (in the
//! kernel's 4-byte form, `kernel_rows`) and each process's mappings into the kernel maps that the sampler's table walk (profiler-ebpf
//! `unwind`) reads.
pub(crate) mod background;
pub(crate) mod budget;
pub(crate) mod cache;
pub(crate) mod copied;
pub(crate) mod files;
pub(crate) mod kernel_rows;
pub(crate) mod loader;
pub(crate) mod pool;
pub(crate) mod procmaps;
pub(crate) mod report;
pub(crate) mod rows_view;
pub(crate) mod table;
pub(crate) mod vdso;

pub(crate) use background::BackgroundLoader;
pub(crate) use copied::CopyUnwinder;
pub(crate) use loader::Loader;
pub(crate) use procmaps::proc_mappings;
pub(crate) use report::LoaderStats;

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
