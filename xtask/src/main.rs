//! `cargo xtask`: project tasks (toolchain setup, run, test, benchmarks) written in Rust so they
//! work the same on every machine.

mod bench_agent;
mod bench_agent_probe;
mod bench_heatmap;
mod bench_kernel_cost;
mod bench_python;
mod bench_runq;
mod bench_support;
mod bench_symbolize;
mod bench_unwind;
mod bench_unwind_deep;
mod bench_unwind_peers;
mod host;
mod kernels;
mod lab;
mod run;
mod setup;
mod test;
mod test_repeat;
mod util;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "Project tasks for the profiler workspace"
)]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the eBPF toolchain (when missing) and check that this host can profile.
    Setup {
        /// Also what `cargo xtask test` needs: gcc, chromium, nodejs + npm (Playwright),
        /// golang-go (go tool pprof), prometheus, inferno (inferno-collapse-perf).
        #[arg(long)]
        tests: bool,
        /// Also the peers the benchmarks compare with (bpftrace, perf).
        #[arg(long)]
        bench: bool,
    },
    /// Build the profiler (release unless --debug) and run it: `cargo xtask run -- record ...`.
    Run {
        /// Use the debug build.
        #[arg(long)]
        debug: bool,
        /// Arguments for the profiler.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// fmt check, clippy, debug build, all tests (`cargo xtask test -- FILTER`), then the
    /// kernel matrix when its images are there (`cargo xtask setup --tests` fetches them).
    Test {
        /// Instead of all tests once, the privileged integration tests N times, each run to
        /// its end; lists every test that failed in any run (failures/N) and fails if any did.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        repeat: Option<u32>,
        /// Only the kernel matrix: the release profiler booted on each kernel in QEMU
        /// (docs/kernels.md).
        #[arg(long)]
        kernels: bool,
        /// Arguments for `cargo test`; after a further `--`, for the test binaries.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Benchmarks; they print a table and write JSON under target/bench/.
    #[command(subcommand)]
    Bench(Bench),
    /// Reproducible incidents for `profiler doctor` (root; see docs/doctor.md): `zombie
    /// [--count N]`, `crashloop`, `starve [--cpu N]`, each with `--cleanup`; the arguments go to `profiler-lab`.
    Lab {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// The agent at 19 Hz under process churn (50+/s) against `perf record -F 19 -a -g`:
    /// CPU, RSS trend, bytes written per hour.
    Agent {
        /// How long the agent and perf are measured, side by side (after a 10 s warm-up).
        #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(30..))]
        seconds: u64,
        /// Also run `cargo fmt --check` on this repository every 10 s: rustfmt maps rustc's
        /// librustc_driver (150 MB, no build id), whose unwind table and symbols the agent
        /// then builds, as on a host that builds Rust code. Issue 12's targets are for the
        /// churn alone; this load shows the peak RSS (VmHWM) a big binary costs.
        #[arg(long)]
        big_binaries: bool,
        /// More `profiler agent` options, after `--` (e.g. `-- --runq on`).
        #[arg(last = true)]
        agent_args: Vec<String>,
    },
    /// The heat-map page: time, peak RSS and size for a synthetic hour on 64 CPUs (22.8M
    /// samples), and for a real capture of this host; render time in headless Chromium.
    Heatmap {
        /// Length of the synthetic capture, hours.
        #[arg(long, default_value_t = 1.0)]
        hours: f64,
        /// CPUs of the synthetic capture.
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
        cpus: u32,
        /// Sampling frequency of the synthetic capture, Hz.
        #[arg(long, default_value_t = 99, value_parser = clap::value_parser!(u32).range(1..=10000))]
        hz: u32,
        /// Length of the real recording of this host, s.
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
        seconds: u64,
    },
    /// BPF time per sample against bpftrace, lost samples and own CPU use, with every CPU busy.
    KernelCost {
        /// How long each of the three runs lasts.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(3..))]
        seconds: u64,
        /// Sampling frequency for our profiler and bpftrace, in Hz.
        #[arg(long, default_value_t = 999, value_parser = clap::value_parser!(u64).range(1..))]
        frequency: u64,
        /// More `profiler record` options for our runs, after `--` (e.g. `-- --unwind fp
        /// --python off` to compare like with like against bpftrace's frame-pointer walk).
        #[arg(last = true)]
        record_args: Vec<String>,
    },
    /// Run-queue latency's cost to a switch-heavy load (`perf bench sched pipe`): its
    /// throughput alone, beside the sampler, beside the sampler and the run-queue tracer, and
    /// beside bpftrace's runqlat; BPF ns per event.
    Runq,
    /// Python frames: BPF and userspace cost per sample on a 60-frame Python stack, with and
    /// without the walk, and top-10 shares and cost against `py-spy record --rate 99`.
    Python {
        /// How long each of the four runs lasts.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(8..))]
        seconds: u64,
    },
    /// Folded + SVG from a 1M-sample capture of a varied workload, against perf script | inferno.
    Symbolize {
        /// How long each recording (ours, then perf's) lasts.
        #[arg(long, default_value_t = 55, value_parser = clap::value_parser!(u64).range(3..))]
        seconds: u64,
        /// Sampling frequency for both, in Hz.
        #[arg(long, default_value_t = 10000, value_parser = clap::value_parser!(u64).range(1..=10000))]
        frequency: u64,
        /// More `profiler record` options for our recording, after `--` (e.g. `-- --unwind fp`).
        #[arg(last = true)]
        record_args: Vec<String>,
    },
    /// Table unwinding against frame pointers, profile-bee --dwarf, bpftrace and perf
    /// --call-graph dwarf on fx-unwind, python3.11, xz and sqlite3: BPF ns per sample,
    /// reach-the-entry share, lost samples, map memory, table build time.
    Unwind {
        /// How long each tool records (one after the other, same workload).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(4..))]
        seconds: u64,
        /// Use the debug build of the profiler (its BPF programs are the same).
        #[arg(long)]
        debug: bool,
        /// Leave profile-bee out (it is not installed, and installing it takes long).
        #[arg(long)]
        no_profile_bee: bool,
        /// Only the 30-frame section: fx-unwind deep30 recorded --unwind fp, then dwarf.
        #[arg(long)]
        deep30_only: bool,
    },
}

fn main() -> ExitCode {
    match dispatch(Cli::parse().command) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(task: Task) -> Result<ExitCode> {
    match task {
        Task::Setup { tests, bench } => {
            let failed = setup::setup(setup::Extras {
                tests,
                bench,
                profile_bee: bench,
            })?;
            if !failed.is_empty() {
                // Building needs no privileges, so setup itself succeeds; run/test/bench refuse.
                println!(
                    "warning: toolchain ready, but {} host check(s) failed: run, test and bench will refuse until fixed",
                    failed.len()
                );
            }
        }
        Task::Run { debug, args } => return run::run(debug, &args),
        Task::Test {
            kernels,
            args,
            repeat,
        } => test::test(kernels, &args, repeat)?,
        Task::Lab { args } => return lab::run(&args),
        Task::Bench(Bench::Agent {
            seconds,
            big_binaries,
            agent_args,
        }) => bench_agent::agent(seconds, big_binaries, &agent_args)?,
        Task::Bench(Bench::Heatmap {
            hours,
            cpus,
            hz,
            seconds,
        }) => bench_heatmap::heatmap(&bench_heatmap::Options {
            hours,
            cpus,
            hz,
            seconds,
        })?,
        Task::Bench(Bench::KernelCost {
            seconds,
            frequency,
            record_args,
        }) => {
            bench_kernel_cost::kernel_cost(seconds, frequency, &record_args)?;
        }
        Task::Bench(Bench::Python { seconds }) => bench_python::python(seconds)?,
        Task::Bench(Bench::Runq) => bench_runq::runq()?,
        Task::Bench(Bench::Symbolize {
            seconds,
            frequency,
            record_args,
        }) => {
            bench_symbolize::symbolize(seconds, frequency, &record_args)?;
        }
        Task::Bench(Bench::Unwind {
            seconds,
            debug,
            no_profile_bee,
            deep30_only,
        }) => bench_unwind::unwind(seconds, debug, !no_profile_bee && !deep30_only, deep30_only)?,
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Task {
        Cli::try_parse_from(["xtask"].iter().chain(args))
            .unwrap()
            .command
    }

    #[test]
    fn run_passes_everything_after_the_separator() {
        let Task::Run { debug, args } = parse(&["run", "--debug", "--", "record", "-F", "99"])
        else {
            panic!("not run");
        };
        assert!(debug);
        assert_eq!(args, ["record", "-F", "99"]);
    }

    #[test]
    fn test_kernels_is_a_flag_not_a_cargo_argument() {
        let Task::Test { kernels, args, .. } = parse(&["test", "--kernels"]) else {
            panic!("not test");
        };
        assert!(kernels);
        assert!(args.is_empty(), "{args:?}");
    }

    #[test]
    fn test_keeps_a_second_separator_for_the_test_binaries() {
        let Task::Test {
            kernels,
            args,
            repeat,
        } = parse(&["test", "--", "fixture", "--", "--nocapture"])
        else {
            panic!("not test");
        };
        assert!(!kernels);
        assert_eq!(args, ["fixture", "--", "--nocapture"]);
        assert_eq!(repeat, None);
    }

    #[test]
    fn test_repeat_takes_a_count_before_the_filter() {
        let Task::Test { args, repeat, .. } = parse(&["test", "--repeat", "5", "--", "record"])
        else {
            panic!("not test");
        };
        assert_eq!(repeat, Some(5));
        assert_eq!(args, ["record"]);
        assert!(Cli::try_parse_from(["xtask", "test", "--repeat", "0"]).is_err());
    }
}
