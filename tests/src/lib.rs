//! Helpers shared by the integration tests in tests/tests: where the profiler binary is,
//! whether this host can load BPF, fixture processes, running the profiler with a timeout,
//! parsing folded output, and scratch directories; and the labs (`lab`, run by the
//! `profiler-lab` binary): incidents for the doctor and synthetic captures.
//!
//! The fixtures themselves are built by build.rs (C, env `FIXTURE_<NAME>`) and as the bin
//! target `fixture-rust` (env `CARGO_BIN_EXE_fixture-rust` in integration tests).

mod agent;
mod cpu;
mod debugfile;
mod folded;
mod image;
pub mod lab;
mod privilege;
mod process;
mod tempdir;
mod tools;

pub use agent::{Agent, free_port, get, metric_series};
pub use cpu::{CpuUsage, cpu_seconds};
pub use debugfile::{InstalledDebugFile, build_id};
pub use folded::{Stack, has_chain, head, is_kernel, parse_folded, read_folded, samples};
pub use image::{PngSummary, png_summary, svg_frames, svg_titles};
pub use privilege::{missing_privilege, require_bpf};
pub use process::{
    Fixture, Running, doctor_findings, doctor_problem, expect_success, profiler_bin, record,
    report, run_profiler, run_profiler_env, run_program, spawn_fixture, spawn_fixture_args,
    wait_timeout,
};
pub use tempdir::TempDir;
pub use tools::{
    cannot_run, chromium, go_tool_pprof, in_ci, pprof_raw_counts, pprof_traces,
    pprof_weighted_traces, tool,
};

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Serializes the tests that sample the machine. They run as threads of one test binary, and
/// concurrent fixtures and profilers would compete for the CPUs (two on a small VM): the
/// sample counts and the work_three/work_one split assume a fixture that is mostly on a CPU.
pub fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    // A failed test poisons the lock; the next test is still valid on its own.
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}
