//! `cargo xtask setup`: installs the eBPF toolchain and test/bench tools, then checks the host can profile.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail, ensure};

use crate::{host, util};

/// Debian's rustc-web: its LLVM matches bpf-linker's, and it ships a prebuilt BPF `core`.
const EBPF_RUSTC: &str = "/usr/bin/rustc";
const BPF_CORE: &str = "/usr/lib/rustlib/bpfel-unknown-none";
const EBPF_PACKAGES: &[&str] = &["rustc-web", "cargo-web", "libstd-rust-web-dev-bpf"];
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Optional tool sets on top of the toolchain.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Extras {
    /// gcc (C fixtures), rustfmt and clippy, and the peers the tests feed outputs to.
    pub tests: bool,
    /// bpftrace and perf, the peers the benchmarks compare with.
    pub bench: bool,
    /// profile-bee, the peer only `bench unwind` runs (a cargo install of ~40 minutes here,
    /// so the other benchmarks do not wait for it; `setup --bench` installs it too).
    pub profile_bee: bool,
}

/// Installs what is missing and checks the host; returns the failed host checks, each with its fix.
pub(crate) fn setup(extras: Extras) -> Result<Vec<String>> {
    let llvm_major = ensure_ebpf_rustc()?;
    ensure_bpf_linker(llvm_major)?;
    let mut tools = Vec::new();
    if extras.tests {
        tools.push(("gcc", "gcc"));
        // readelf and objdump check the unwind tables and the no-frame-pointer fixture
        // (profiler unwind::table tests, tests/tests/unwind.rs); gcc pulls binutils in, but
        // the tests call them by name.
        tools.push(("objdump", "binutils"));
        // The heat map page test renders it in headless Chromium (tests/tests/heatmap.rs).
        tools.push(("chromium", "chromium"));
        // Playwright (tests/browser, from the npm registry) drags the mouse over that page
        // (tests/tests/heatmap_drag.rs).
        tools.extend([("node", "nodejs"), ("npm", "npm")]);
        // `go tool pprof` reads our pprof output (tests/tests/pprof.rs); `go build` makes the
        // frame-pointer Go fixture (tests/tests/unwind.rs).
        tools.push(("go", "golang-go"));
        // A real Prometheus scrapes the agent (tests/tests/agent_peers.rs).
        tools.push(("prometheus", "prometheus"));
        // `perf record --call-graph dwarf` is the reference the table walk's stacks are
        // compared with (tests/tests/unwind_perf.rs).
        tools.push(("perf", "linux-perf"));
        // Debian's own CPython (no frame pointers) is one of the interpreters
        // tests/tests/python.rs records; the pyenv builds there are not installed here.
        tools.push(("python3.11", "python3.11"));
        // Debian's sqlite3 maps eight files and runs in three: tests/tests/unwind_reached.rs
        // checks that `--unwind-tables reached` compiles only those.
        tools.push(("sqlite3", "sqlite3"));
        // A real container runtime restarts a failing program in a new container each time
        // for the doctor and the agent to find (tests/tests/doctor_runc.rs).
        tools.push(("runc", "runc"));
        // The kernel matrix boots Debian's kernels in QEMU (xtask/src/kernels).
        tools.push((crate::kernels::QEMU, "qemu-system-x86"));
    }
    if extras.bench {
        tools.extend([("bpftrace", "bpftrace"), ("perf", "linux-perf")]);
        // The unmodified Debian programs `bench unwind` profiles.
        tools.extend([
            ("xz", "xz-utils"),
            ("sqlite3", "sqlite3"),
            ("python3.11", "python3.11"),
        ]);
    }
    ensure_apt(&tools)?;
    // The benchmarks compare with perf script | inferno; the tests feed our .perf.txt to
    // inferno-collapse-perf (tests/tests/record.rs).
    if extras.bench || extras.tests {
        ensure_inferno()?;
    }
    if extras.bench {
        ensure_py_spy()?;
    }
    if extras.profile_bee {
        ensure_profile_bee()?;
    }
    if extras.tests {
        ensure_browser_node_modules()?;
        ensure_otlp_proto()?;
        ensure_rustup_components()?;
        // The matrix's initramfs needs a static busybox (the guest has no C library of its
        // own); the package conflicts with the dynamic busybox, so it is asked for by name.
        ensure_packages(&["busybox-static"])?;
        if util::is_root() {
            crate::kernels::fetch_images()?;
        } else {
            println!("skipping the kernel matrix's images: fetching them needs root (apt)");
        }
    }
    Ok(host::checks())
}

/// inferno's CLI: the perf-script pipeline `cargo xtask bench symbolize` compares with, and
/// the `.perf.txt` consumer of the tests.
fn ensure_inferno() -> Result<()> {
    if let Some(path) = util::which("inferno-flamegraph") {
        println!("ok: inferno ({})", path.display());
        return Ok(());
    }
    println!("installing inferno (cargo install; a minute or two)");
    util::run(util::cargo().args(["install", "--locked", "inferno"]))
        .context("installing inferno failed")
}

/// py-spy, the peer of `cargo xtask bench python`, in a venv of its own under target/.
pub(crate) fn py_spy_bin() -> std::path::PathBuf {
    util::target_dir().join("py-spy/bin/py-spy")
}

fn ensure_py_spy() -> Result<()> {
    let bin = py_spy_bin();
    if bin.exists() {
        println!("ok: py-spy ({})", bin.display());
        return Ok(());
    }
    let venv = util::target_dir().join("py-spy");
    println!("installing py-spy into {} (pip)", venv.display());
    let python = util::which("python3").context("py-spy needs python3 on PATH")?;
    util::run(Command::new(python).args(["-m", "venv"]).arg(&venv))
        .context("creating the py-spy venv failed")?;
    util::run(Command::new(venv.join("bin/pip")).args(["install", "py-spy"]))
        .context("installing py-spy failed")
}

/// profile-bee, the Rust/aya peer with .eh_frame unwinding in BPF that `bench unwind`
/// compares with, at the version issue 10 measured.
fn ensure_profile_bee() -> Result<()> {
    if let Some(path) = util::which("probee") {
        println!("ok: profile-bee ({})", path.display());
        return Ok(());
    }
    println!("installing profile-bee 0.3.13 (cargo install; several minutes)");
    util::run(util::cargo().args([
        "install",
        "--locked",
        "profile-bee",
        "--version",
        "0.3.13",
        "--no-default-features",
    ]))
    .context("installing profile-bee failed")
}

/// Setup for the commands that load BPF: a failed host check is an error.
pub(crate) fn require(extras: Extras) -> Result<()> {
    let failed = setup(extras)?;
    if !failed.is_empty() {
        bail!("this host cannot load the profiler: {}", failed.join("; "));
    }
    Ok(())
}

/// Makes sure /usr/bin/rustc and the BPF `core` exist; returns the LLVM major version.
fn ensure_ebpf_rustc() -> Result<u32> {
    if ebpf_rustc_info().is_none() || !Path::new(BPF_CORE).is_dir() {
        println!("installing {} (the eBPF compiler)", EBPF_PACKAGES.join(" "));
        apt_install(EBPF_PACKAGES)?;
    }
    let info = ebpf_rustc_info().with_context(|| {
        format!("`{EBPF_RUSTC} -vV` reports no LLVM version; reinstall rustc-web")
    })?;
    ensure!(
        Path::new(BPF_CORE).is_dir(),
        "{BPF_CORE} is missing; reinstall libstd-rust-web-dev-bpf"
    );
    let llvm_major = llvm_major(&info.llvm)?;
    println!(
        "ok: {EBPF_RUSTC} {} (LLVM {}) with the prebuilt bpfel-unknown-none core",
        info.release, info.llvm
    );
    Ok(llvm_major)
}

struct RustcInfo {
    release: String,
    llvm: String,
}

fn ebpf_rustc_info() -> Option<RustcInfo> {
    let text = util::output(Command::new(EBPF_RUSTC).arg("-vV")).ok()?;
    Some(RustcInfo {
        release: util::field(&text, "release").unwrap_or("?").to_owned(),
        llvm: util::field(&text, "LLVM version")?.to_owned(),
    })
}

fn llvm_major(version: &str) -> Result<u32> {
    let major = version.split('.').next().unwrap_or_default();
    major
        .parse()
        .with_context(|| format!("cannot read the LLVM major version from {version:?}"))
}

/// bpf-linker must load the same libLLVM as rustc-web, so it is built against Debian's libllvm.
fn ensure_bpf_linker(llvm_major: u32) -> Result<()> {
    let libllvm = format!("libllvm{llvm_major}");
    if dpkg_installed(&libllvm) {
        println!("ok: {libllvm} (the LLVM rustc-web loads)");
    } else {
        println!("installing {libllvm}");
        apt_install(&[&libllvm])?;
    }
    match bpf_linker() {
        Ok(path) => {
            println!("ok: bpf-linker {BPF_LINKER_VERSION} ({})", path.display());
            return Ok(());
        }
        Err(why) => println!(
            "installing bpf-linker {BPF_LINKER_VERSION} for LLVM {llvm_major} ({why}; about a minute)"
        ),
    }
    // --force: a broken binary of the right version would otherwise count as installed.
    let mut install = util::cargo();
    install
        .args(["install", "--locked", "--force"])
        .arg(format!("bpf-linker@{BPF_LINKER_VERSION}"))
        .args(["--no-default-features", "--features"])
        .arg(format!("llvm-{llvm_major},no-llvm-linking"))
        .env("RUSTFLAGS", format!("-l dylib=LLVM-{llvm_major}"))
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false");
    util::run(&mut install).context("installing bpf-linker failed")?;
    let path = bpf_linker().map_err(|why| {
        anyhow::anyhow!(
            "bpf-linker is still unusable after installing it: {why}; is ~/.cargo/bin on PATH?"
        )
    })?;
    println!("ok: bpf-linker {BPF_LINKER_VERSION} ({})", path.display());
    Ok(())
}

/// The usable bpf-linker on PATH, or what is wrong with it.
fn bpf_linker() -> Result<std::path::PathBuf, String> {
    let path = util::which("bpf-linker").ok_or("not on PATH")?;
    let version =
        util::output(Command::new(&path).arg("--version")).map_err(|e| format!("{e:#}"))?;
    if !version
        .split_whitespace()
        .any(|word| word == BPF_LINKER_VERSION)
    {
        return Err(format!("found {:?}", version.trim()));
    }
    let libs = util::output(Command::new("ldd").arg(&path)).map_err(|e| format!("{e:#}"))?;
    let missing: Vec<&str> = libs
        .lines()
        .filter(|l| l.contains("not found"))
        .map(str::trim)
        .collect();
    if !missing.is_empty() {
        return Err(format!("missing libraries: {}", missing.join(", ")));
    }
    Ok(path)
}

/// Installs the Debian packages that are not installed, in one apt-get call.
fn ensure_packages(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| !dpkg_installed(p))
        .collect();
    if !missing.is_empty() {
        println!("installing {}", missing.join(" "));
        apt_install(&missing)?;
    }
    println!("ok: {}", packages.join(" "));
    Ok(())
}

fn dpkg_installed(package: &str) -> bool {
    util::output(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]))
        .is_ok_and(|status| status.contains("install ok installed"))
}

/// Installs the Debian package of each command that is not on PATH, in one apt-get call.
fn ensure_apt(tools: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = tools
        .iter()
        .filter(|(command, _)| util::which(command).is_none())
        .map(|&(_, package)| package)
        .collect();
    if !missing.is_empty() {
        println!("installing {}", missing.join(" "));
        apt_install(&missing)?;
    }
    for &(command, package) in tools {
        let path = util::which(command).with_context(|| {
            format!("`{command}` is still not on PATH after installing {package}")
        })?;
        println!("ok: {command} ({})", path.display());
    }
    Ok(())
}

fn apt_install(packages: &[&str]) -> Result<()> {
    let list = packages.join(" ");
    ensure!(
        util::is_root(),
        "missing Debian packages: {list}; run `sudo apt-get update && sudo apt-get install -y --no-install-recommends {list}`"
    );
    // One index refresh per run is enough, however many installs follow.
    static UPDATED: AtomicBool = AtomicBool::new(false);
    let apt = || {
        let mut cmd = Command::new("apt-get");
        cmd.env("DEBIAN_FRONTEND", "noninteractive");
        cmd
    };
    if !UPDATED.swap(true, Ordering::Relaxed) {
        util::run(apt().arg("update")).context("apt-get update failed")?;
    }
    util::run(
        apt()
            .args(["install", "-y", "--no-install-recommends"])
            .args(packages),
    )
    .with_context(|| format!("installing {list} failed"))
}

/// tests/browser's npm packages (playwright-core, pinned by its package-lock.json), for the
/// drag test. Playwright drives Debian's chromium: no browser download (`npx playwright
/// install` is never run).
fn ensure_browser_node_modules() -> Result<()> {
    let dir = util::workspace_root().join("tests/browser");
    if dir.join("node_modules/playwright-core").is_dir() {
        println!("ok: tests/browser/node_modules");
        return Ok(());
    }
    if util::which("node").is_none() {
        println!("skipping npm ci in tests/browser: node is not on PATH");
        return Ok(());
    }
    println!("installing tests/browser's npm packages (npm ci)");
    util::run(
        Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&dir),
    )
    .context("npm ci in tests/browser failed")
}

/// The OpenTelemetry protobuf classes the OTLP export test decodes the agent's requests with
/// (tests/tests/agent_otlp.rs): the `opentelemetry-proto` Python package, pinned (1.45.2 is
/// generated from opentelemetry-proto v1.10.0, whose profiles signal the agent speaks), in a
/// venv under target/ so nothing is installed system-wide.
pub(crate) const OTLP_PROTO_PACKAGE: &str = "opentelemetry-proto==1.45.2";

fn ensure_otlp_proto() -> Result<()> {
    let venv = util::workspace_root().join("target/otlp-venv");
    let python = venv.join("bin/python");
    let check = || {
        util::output(Command::new(&python).args([
            "-c",
            "import importlib.metadata as m, opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2; print(m.version('opentelemetry-proto'))",
        ]))
    };
    let pinned = OTLP_PROTO_PACKAGE.rsplit("==").next().unwrap_or("");
    if check().is_ok_and(|v| v.trim() == pinned) {
        println!("ok: {OTLP_PROTO_PACKAGE} in {}", venv.display());
        return Ok(());
    }
    // Debian's python3.11 (installed above) needs its venv module as a package.
    ensure_packages(&["python3.11-venv"])?;
    println!("installing {OTLP_PROTO_PACKAGE} into {}", venv.display());
    util::run(Command::new("python3.11").arg("-m").arg("venv").arg(&venv))?;
    util::run(Command::new(venv.join("bin/pip")).args(["install", "--quiet", OTLP_PROTO_PACKAGE]))
        .context("installing the OpenTelemetry protobuf classes failed")?;
    check().context("the OpenTelemetry protobuf classes do not import")?;
    Ok(())
}

/// `cargo xtask test` runs `cargo fmt` and `cargo clippy`, which rustup installs as components.
fn ensure_rustup_components() -> Result<()> {
    let missing: Vec<&str> = [("fmt", "rustfmt"), ("clippy", "clippy")]
        .into_iter()
        .filter(|(sub, _)| util::output(util::cargo().args([sub, "--version"])).is_err())
        .map(|(_, component)| component)
        .collect();
    if !missing.is_empty() {
        println!("installing rustup components {}", missing.join(" "));
        util::run(
            Command::new("rustup")
                .args(["component", "add"])
                .args(&missing),
        )?;
    }
    println!("ok: rustfmt and clippy");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llvm_major_from_rustc_version() {
        assert_eq!(llvm_major("22.1.8").unwrap(), 22);
        assert!(llvm_major("").is_err());
    }
}
