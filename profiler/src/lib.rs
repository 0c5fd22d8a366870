//! profiler: an eBPF CPU profiler. The library holds the whole pipeline, in the order the data
//! flows: `bpf` (load and attach the sampler) -> `collect` (drain the ring buffer, note process
//! facts) -> `symbolize` (kernel and user frames) -> `profile` (the model and the capture file)
//! -> `output` (folded, SVG). `record` runs that pipeline once; `cli` holds the subcommands
//! the binary exposes.

// The binary (main.rs) needs only clap and this library; every dependency is the library's.
#![warn(unused_crate_dependencies)]

pub(crate) mod agent;
pub(crate) mod bpf;
pub(crate) mod cgroups;
pub mod cli;
pub(crate) mod collect;
pub(crate) mod doctor;
pub(crate) mod http;
pub(crate) mod output;
pub(crate) mod process;
pub mod profile;
pub(crate) mod python;
pub(crate) mod record;
pub(crate) mod session;
pub(crate) mod store;
pub(crate) mod symbolize;
pub(crate) mod unwind;
pub(crate) mod util;

/// The parsers of bytes the profiler does not control, and the renderers fed from what they
/// accept: the surface `tests/fuzz.rs` drives (everything else in the crate is `pub(crate)`).
/// Not an API for other programs.
#[doc(hidden)]
pub mod untrusted {
    pub use crate::agent::config::{AgentConfig, FileConfig};
    pub use crate::http::parse_request;
    pub use crate::symbolize::KernelSymbols;

    /// What cgroupfs, /proc/cgroups, /proc/PID/cgroup and mountinfo say.
    pub mod cgroups {
        pub use crate::cgroups::{
            meminfo_kb, mount_of, parse_mountinfo, parse_proc_cgroup, parse_proc_cgroups,
            slab_active_objects, stat_value, v2_mount,
        };
    }

    /// Unwind tables compiled from a binary's .eh_frame, and their cache files.
    pub mod unwind {
        pub use crate::unwind::{
            cache::{decode, encode},
            table::{compile, mapping_bias},
        };
    }

    /// Perf maps and /proc/PID/status.
    pub mod collect {
        pub use crate::process::{PerfMap, ns_pid};
    }

    /// What `report` renders from a capture, and `diff`'s folded input.
    pub mod output {
        pub use crate::output::{folded_lines, heatmap_data, write_perf_text, write_pprof};

        pub mod diff {
            pub use crate::output::diff::{parse_folded, top_changes, write_diff_svg};
        }
    }
}

/// What the integration tests and the lab reach inside the crate: the unwind table compiler
/// and its kernel layout, the table cache, the agent's store and two cgroupfs readers. Not an
/// API for other programs.
#[doc(hidden)]
pub mod testkit {
    pub use crate::store::Store;

    pub mod unwind {
        pub use crate::unwind::{
            cache::TableCache,
            kernel_rows::{KernelTable, Rules, lookup},
            pool::Compiled,
            rows_view::CHUNK_BYTES,
            table::{GO_STACK_BASES, Table, compile, compile_with_debug},
        };
    }

    pub mod cgroups {
        pub use crate::cgroups::{memory_mount, num_cgroups};
    }
}
