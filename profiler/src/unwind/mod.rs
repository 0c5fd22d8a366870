//! Unwinding without frame pointers (`--unwind dwarf|auto`), beside `bpf`: `table` compiles a
//! binary's .eh_frame into rows, `loader` puts the rows and each process's mappings into the
//! kernel maps that the sampler's table walk (profiler-ebpf `unwind`) reads.
pub mod table;
