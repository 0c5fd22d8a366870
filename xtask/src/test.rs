//! `cargo xtask test`: formatting, lints, the debug build, every test against that binary, then
//! the kernel matrix (xtask/src/kernels).

use anyhow::{Context, Result};

use crate::setup::{self, Extras};
use crate::{kernels, run, test_repeat, util};

/// Runs the steps in order and stops at the first failure. `args` go to `cargo test`; after a
/// `--` among them, to the test binaries. `kernels_only`: the kernel matrix alone. With
/// `repeat`, the last step runs the privileged integration tests that many times instead (see
/// test_repeat.rs), and the matrix does not run.
pub(crate) fn test(kernels_only: bool, args: &[String], repeat: Option<u32>) -> Result<()> {
    setup::require(Extras {
        tests: true,
        ..Extras::default()
    })?;
    if kernels_only {
        return kernels::matrix();
    }
    let (cargo_args, test_args) = match args.iter().position(|arg| arg == "--") {
        Some(i) => (&args[..i], &args[i + 1..]),
        None => (args, &[][..]),
    };

    let mut fmt = util::cargo();
    fmt.args(["fmt", "--all", "--", "--check"]);
    let mut clippy = util::cargo();
    clippy.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);
    let mut tests = util::cargo();
    // One thread: the privileged tests each load BPF and sample every CPU, so they would
    // disturb each other's profiles.
    tests
        .args(["test", "--workspace"])
        .args(cargo_args)
        .args(["--", "--test-threads=1"])
        .args(test_args)
        .env("PROFILER_BIN", run::profiler_bin(false));

    let mut steps = [
        ("fmt", fmt, "run `cargo fmt --all` to fix"),
        ("clippy", clippy, "fix the lints above"),
        (
            "build",
            run::build_cmd(false),
            "fix the compile errors above",
        ),
        ("test", tests, "see the failing tests above"),
    ];
    let steps = match repeat {
        Some(_) => &mut steps[..3],
        None => &mut steps[..],
    };
    // The matrix runs when setup could fetch its kernels; a filtered run (`-- FILTER`) is
    // about some tests, not about every kernel.
    let wanted = args.is_empty() && repeat.is_none();
    let matrix = kernels::available() && wanted;
    // CI must not pass with the kernel matrix (and with it the cgroup2 doctor test) unrun.
    if wanted && !matrix && std::env::var("CI").as_deref() == Ok("true") {
        anyhow::bail!(
            "the kernel matrix cannot run here (QEMU, busybox or a kernel image is missing) and \
             CI=true forbids skipping it: run `cargo xtask setup --tests` as root"
        );
    }
    let total = steps.len() + usize::from(matrix);
    for (i, (name, cmd, fix)) in steps.iter_mut().enumerate() {
        println!("==> [{}/{total}] {name}: {}", i + 1, util::display(cmd));
        util::run(cmd).with_context(|| format!("step `{name}` failed ({fix})"))?;
    }
    if let Some(n) = repeat {
        return test_repeat::repeat(n, cargo_args, test_args, &run::profiler_bin(false));
    }
    if matrix {
        println!("==> [{total}/{total}] kernels: the kernel matrix (docs/kernels.md)");
        kernels::matrix().context("step `kernels` failed (see the report above)")?;
    } else {
        println!("==> the kernel matrix did not run: `cargo xtask test --kernels` runs it");
    }
    println!("==> all {total} steps passed");
    Ok(())
}
