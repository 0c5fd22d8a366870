//! Unwinding without frame pointers (`--unwind dwarf|auto`), beside `bpf`: `table` compiles a
//! binary's .eh_frame into rows, `loader` puts the rows and each process's mappings into the
//! kernel maps that the sampler's table walk (profiler-ebpf `unwind`) reads.
pub mod background;
pub mod loader;
pub mod table;
pub mod vdso;

pub use background::BackgroundLoader;
pub use loader::{Loader, LoaderStats, MappingSpec, proc_mappings};

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
