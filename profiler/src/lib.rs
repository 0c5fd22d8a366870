//! profiler: an eBPF CPU profiler. The library holds the whole pipeline, in the order the data
//! flows: `bpf` (load and attach the sampler) -> `collect` (drain the ring buffer, note process
//! facts) -> `symbolize` (kernel and user frames) -> `profile` (the model and the capture file)
//! -> `output` (folded, SVG). `record` runs that pipeline once; `cli` holds the subcommands
//! the binary exposes.

pub mod agent;
pub mod bpf;
pub mod cgroups;
pub mod cli;
pub mod collect;
pub mod doctor;
pub mod http;
pub mod output;
pub mod profile;
pub mod python;
pub mod record;
pub mod session;
pub mod store;
pub mod symbolize;
pub mod unwind;
pub mod util;
