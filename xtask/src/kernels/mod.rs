//! `cargo xtask test --kernels`: the kernel matrix. Boots each kernel of `SERIES` (and the
//! host's, when its image is readable) in QEMU with an initramfs holding the release profiler,
//! runs the smoke suite of init.sh inside and reports per kernel what loaded, what ran and
//! what failed, with the verifier log of any rejected program. See docs/kernels.md.

mod image;
mod initramfs;
mod report;

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{run, util};

/// The kernels users run: Debian 11's, the generation of Amazon Linux 2 and many EKS nodes
/// (fetched from bullseye through a private apt sources list: this machine is Debian 12),
/// Debian 12's (also Amazon Linux 2023's series) and the next LTS.
const SERIES: &[image::Series] = &[
    image::Series {
        name: "5.10",
        meta_package: "linux-image-cloud-amd64",
        package_prefix: "linux-image-5.10.",
        suite: Some("bullseye"),
    },
    image::Series {
        name: "6.1",
        meta_package: "linux-image-cloud-amd64",
        package_prefix: "linux-image-6.1.",
        suite: None,
    },
    image::Series {
        name: "6.12",
        meta_package: "linux-image-6.12-cloud-amd64",
        package_prefix: "linux-image-6.12.",
        suite: None,
    },
];

/// A user-stack unwind mode of `record`: each gets its own `record-<name>` test in every
/// kernel. A new mode is one line in `UNWIND_MODES`.
struct UnwindMode {
    name: &'static str,
    /// It asks for the table walk: on a kernel without bpf_loop (5.17) the sampler falls back
    /// to frame pointers and says so in one line, which init.sh checks.
    tables: bool,
    /// The flags that select it.
    args: &'static [&'static str],
}

/// Every user-stack unwind mode `record` has.
const UNWIND_MODES: &[UnwindMode] = &[
    UnwindMode {
        name: "fp",
        tables: false,
        args: &["--unwind", "fp"],
    },
    UnwindMode {
        name: "dwarf",
        tables: true,
        args: &["--unwind", "dwarf"],
    },
    UnwindMode {
        name: "auto",
        tables: true,
        args: &["--unwind", "auto"],
    },
];

/// The tests init.sh runs besides one `record-<mode>` per unwind mode; all must pass.
const SUITE: &[&str] = &[
    report::CHECK_TEST,
    "report",
    "runq",
    "record-cgroup",
    "doctor",
    "churn",
    "doctor-v2",
    "crashloop-v2",
    "agent",
];

/// A kernel that has not finished its suite by then is stopped and reported as hung (TCG
/// runs the suite in a minute or two; the margin is for a busy machine).
const BOOT_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The QEMU the matrix boots with (Debian's qemu-system-x86).
pub(crate) const QEMU: &str = "qemu-system-x86_64";

/// Whether the matrix can run here without fetching anything: QEMU, busybox and every
/// series' image are in place (`cargo xtask setup --tests` puts them there).
pub(crate) fn available() -> bool {
    util::which(QEMU).is_some()
        && Path::new(initramfs::BUSYBOX).is_file()
        && SERIES.iter().all(|s| image::cached(s).is_some())
}

/// Fetches every series' image into the cache (setup calls this).
pub(crate) fn fetch_images() -> Result<()> {
    for series in SERIES {
        let image = image::fetch(series)?;
        println!("ok: kernel {} ({})", image.label, image.vmlinuz.display());
    }
    Ok(())
}

/// Builds everything, boots every kernel and fails unless every kernel did what is expected.
pub(crate) fn matrix() -> Result<()> {
    let started = Instant::now();
    let work = util::target_dir().join("kernels");
    std::fs::create_dir_all(&work)?;
    let broken = build_broken(&work)?;
    let profiler = run::build(true)?;
    let fixture = build_fixture(&work)?;

    // init.sh reads one mode a line: NAME tables|fp ARGS...
    let modes: String = UNWIND_MODES
        .iter()
        .map(|m| {
            let walk = if m.tables { "tables" } else { "fp" };
            format!("{} {walk} {}\n", m.name, m.args.join(" "))
        })
        .collect();
    let mut contents = initramfs::Contents::new(&modes)?;
    contents.add_program("/bin/profiler", &profiler)?;
    contents.add_program("/bin/profiler-broken", &broken)?;
    contents.add_host_file("/bin/fx-chain", &fixture)?;
    let initrd = work.join("initramfs.cpio");
    std::fs::write(&initrd, contents.to_cpio())
        .with_context(|| format!("writing {}", initrd.display()))?;

    let mut images = Vec::new();
    for series in SERIES {
        images.push(image::fetch(series)?);
    }
    // Without a bootable host image the suite's own run covers the host's kernel, except for
    // the broken program: that one is tried here, directly.
    let host_broken = match image::host() {
        Ok(host) => {
            images.push(host);
            None
        }
        Err(why) => {
            println!("note: {why}; the broken program is tried on it directly");
            Some(broken_on_host(&broken, &work)?)
        }
    };

    let expected: Vec<String> = UNWIND_MODES
        .iter()
        .map(|m| format!("record-{}", m.name))
        .chain(SUITE.iter().map(|t| (*t).to_owned()))
        .collect();
    let mut problems = Vec::new();
    let mut reports = String::new();
    let mut boots = Vec::new();
    for image in &images {
        let name = image.label.split(' ').next().unwrap_or("x");
        let log = work.join(format!("serial-{name}.log"));
        let boot_started = Instant::now();
        let serial = boot(image, &initrd, &log)?;
        let boot = report::parse(&serial);
        let label = format!(
            "{} in {:.0} s (serial log {})",
            image.label,
            boot_started.elapsed().as_secs_f64(),
            log.display()
        );
        let (text, found) = report::judge(&label, &boot, &expected, true);
        print!("{text}");
        reports.push_str(&text);
        problems.extend(found);
        boots.push((name, boot));
    }
    // The figures docs/kernels.md keeps: every program's verified instructions on every kernel.
    let table = report::verified_table(&boots);
    print!("{table}");
    reports.push_str(&table);
    if let Some(boot) = host_broken {
        let (text, found) = report::judge("host (broken program only)", &boot, &[], true);
        print!("{text}");
        reports.push_str(&text);
        problems.extend(found);
    }
    std::fs::write(work.join("report.txt"), &reports)?;
    println!(
        "kernel matrix: {} kernel(s) in {:.0} s, report in {}",
        images.len(),
        started.elapsed().as_secs_f64(),
        work.join("report.txt").display()
    );
    if !problems.is_empty() {
        bail!("the kernel matrix failed:\n  {}", problems.join("\n  "));
    }
    Ok(())
}

/// The release profiler built with `--features matrix-broken` (a sampler with an unbounded
/// loop), copied out of target/release before the normal build takes its place there. Both
/// builds share every dependency; only the profiler crate and its eBPF object differ.
fn build_broken(work: &Path) -> Result<PathBuf> {
    let mut cmd = run::build_cmd(true);
    cmd.args(["--features", "matrix-broken"]);
    println!("==> {}", util::display(&cmd));
    util::run(&mut cmd).context("building the matrix-broken profiler failed")?;
    let broken = work.join("profiler-broken");
    std::fs::copy(run::profiler_bin(true), &broken)
        .with_context(|| format!("copying the broken build to {}", broken.display()))?;
    Ok(broken)
}

/// The broken build's `record` on this machine's kernel, as a boot's report would have it.
fn broken_on_host(broken: &Path, work: &Path) -> Result<report::Boot> {
    let out = Command::new(broken)
        .args(["-v", "record", "-d", "1s", "-o"])
        .arg(work.join("broken-host.folded"))
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot start {}", broken.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    let serial = if out.status.success() {
        "MATRIX broken PASS loaded, though it must not\n".to_owned()
    } else {
        let why = stderr.lines().last().unwrap_or_default();
        let log: String = stderr
            .lines()
            .map(|l| format!("MATRIX-LOG broken {l}\n"))
            .collect();
        format!("MATRIX broken FAIL {why}\n{log}")
    };
    Ok(report::parse(&format!(
        "MATRIX-INFO kernel {}\n{serial}MATRIX-END\n",
        release.trim()
    )))
}

/// fx-chain, linked statically so the guest needs no C library for it, with the flags the
/// tests build every fixture with (tests/fixtures/cflags.txt).
fn build_fixture(work: &Path) -> Result<PathBuf> {
    let fixtures = util::workspace_root().join("tests/fixtures");
    let cflags = std::fs::read_to_string(fixtures.join("cflags.txt"))?;
    let out = work.join("fx-chain");
    let mut cc = Command::new("cc");
    cc.args(
        cflags
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#')),
    )
    .arg("-static")
    .arg("-o")
    .arg(&out)
    .arg(fixtures.join("fx-chain.c"));
    util::run(&mut cc).context("building the static fx-chain failed")?;
    Ok(out)
}

/// Boots `image` under TCG (KVM's `-cpu host` fails on this kind of VM) and returns what the
/// serial console printed; MATRIX lines are echoed as they come, everything goes to `log`.
fn boot(image: &image::Image, initrd: &Path, log: &Path) -> Result<String> {
    let mut cmd = Command::new(QEMU);
    cmd.args(["-accel", "tcg", "-cpu", "max", "-smp", "2", "-m", "2048"])
        .arg("-kernel")
        .arg(&image.vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", "console=ttyS0 panic=-1 loglevel=3"])
        .args(["-display", "none", "-serial", "stdio", "-monitor", "none"])
        .arg("-no-reboot")
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    println!("==> booting {}: {}", image.label, util::display(&cmd));
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {QEMU}"))?;
    let stdout = child.stdout.take().context("qemu stdout")?;
    let mut file = std::fs::File::create(log)?;
    let label = image.label.clone();
    let reader = std::thread::spawn(move || {
        let mut serial = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = writeln!(file, "{line}");
            // Progress as it happens; failed commands' logs come in the report after the boot.
            if line.starts_with("MATRIX") && !line.starts_with("MATRIX-LOG") {
                println!("[{label}] {}", line.trim_end_matches('\r'));
            }
            serial.push_str(&line);
            serial.push('\n');
        }
        serial
    });
    let started = Instant::now();
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if started.elapsed() > BOOT_TIMEOUT {
            println!(
                "{} still running after {BOOT_TIMEOUT:?}: stopping it",
                image.label
            );
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    reader
        .join()
        .map_err(|_| anyhow::anyhow!("the serial reader panicked"))
}
