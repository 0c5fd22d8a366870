//! Kernel images for the matrix: Debian's cloud kernels fetched as packages (never installed
//! as this host's kernel) into a cache under target/, and the host's own image when readable.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail, ensure};

use crate::util;

/// A kernel of the matrix, named by the Debian meta-package that depends on its newest build,
/// so the matrix follows Debian's security updates of each series.
pub(super) struct Series {
    /// Short name in reports: "6.1".
    pub name: &'static str,
    /// The meta-package, e.g. linux-image-cloud-amd64 -> linux-image-6.1.0-NN-cloud-amd64.
    pub meta_package: &'static str,
    /// What the resolved image package must start with (a meta-package that moved to another
    /// series would otherwise change the matrix silently).
    pub package_prefix: &'static str,
}

/// A bootable image.
pub(super) struct Image {
    /// "6.1 (6.1.0-57-cloud-amd64)".
    pub label: String,
    pub vmlinuz: PathBuf,
}

/// Where fetched packages and extracted images are kept.
pub(super) fn cache_dir() -> PathBuf {
    util::target_dir().join("kernels/cache")
}

/// The image of `series` if it was fetched already.
pub(super) fn cached(series: &Series) -> Option<Image> {
    let dir = cache_dir().join(series.name);
    let entries = std::fs::read_dir(&dir).ok()?;
    entries.flatten().map(|e| e.path()).find_map(|path| {
        let release = path
            .file_name()?
            .to_str()?
            .strip_prefix("vmlinuz-")?
            .to_owned();
        Some(Image {
            label: format!("{} ({release})", series.name),
            vmlinuz: path,
        })
    })
}

/// Fetches (once) and extracts the newest image of `series`: `apt-get download` of the
/// package the meta-package depends on, then only ./boot/vmlinuz-* out of it.
pub(super) fn fetch(series: &Series) -> Result<Image> {
    fetch_once(series).or_else(|first| {
        // Package lists older than the archive name builds it no longer has: refresh, retry.
        println!("{first:#}; refreshing the package lists (apt-get update) and retrying");
        util::output(Command::new("apt-get").arg("update")).context("apt-get update failed")?;
        fetch_once(series)
    })
}

fn fetch_once(series: &Series) -> Result<Image> {
    let package = resolve(series)?;
    let release = package
        .strip_prefix("linux-image-")
        .context("not a linux-image package")?;
    let dir = cache_dir().join(series.name);
    let vmlinuz = dir.join(format!("vmlinuz-{release}"));
    if !vmlinuz.is_file() {
        // A newer build replaces the old one: the cache holds one image per series.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        println!(
            "fetching {package} (Debian package, extracted under {})",
            dir.display()
        );
        util::output(
            Command::new("apt-get")
                .args(["download", &package])
                .current_dir(&dir),
        )
        .with_context(|| format!("cannot download {package}"))?;
        let deb = std::fs::read_dir(&dir)?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .with_context(|| format!("apt-get download left no .deb in {}", dir.display()))?;
        extract_vmlinuz(&deb, &dir, release)?;
        std::fs::remove_file(&deb)?;
        ensure!(
            vmlinuz.is_file(),
            "{} has no /boot/vmlinuz-{release}",
            deb.display()
        );
    }
    Ok(Image {
        label: format!("{} ({release})", series.name),
        vmlinuz,
    })
}

/// The image package `series.meta_package` depends on, as the configured apt sources have it.
fn resolve(series: &Series) -> Result<String> {
    let text = util::output(Command::new("apt-cache").args(["depends", series.meta_package]))
        .with_context(|| format!("apt-cache knows no {}", series.meta_package))?;
    let package = text
        .lines()
        .filter_map(|line| line.trim().strip_prefix("Depends:"))
        .map(str::trim)
        .find(|dep| dep.starts_with(series.package_prefix))
        .with_context(|| {
            format!(
                "{} depends on no {}* package; run `apt-get update` (as root)",
                series.meta_package, series.package_prefix
            )
        })?;
    Ok(package.to_owned())
}

/// `dpkg-deb --fsys-tarfile DEB | tar -x ./boot/vmlinuz-RELEASE`, the image alone (the
/// package's modules are not needed: the cloud kernels have virtio and everything the
/// profiler uses built in).
fn extract_vmlinuz(deb: &Path, dir: &Path, release: &str) -> Result<()> {
    let mut dpkg = Command::new("dpkg-deb")
        .arg("--fsys-tarfile")
        .arg(deb)
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start dpkg-deb")?;
    let member = format!("./boot/vmlinuz-{release}");
    let tar = Command::new("tar")
        .args(["-x", "--strip-components=2", "-f", "-", &member])
        .current_dir(dir)
        .stdin(dpkg.stdout.take().context("dpkg-deb stdout")?)
        .status()
        .context("cannot start tar")?;
    let dpkg = dpkg.wait()?;
    if !tar.success() || !dpkg.success() {
        bail!("extracting {member} from {} failed", deb.display());
    }
    Ok(())
}

/// This host's kernel image, or why there is none to boot (then the ordinary test suite,
/// which runs on this kernel, is its coverage).
pub(super) fn host() -> Result<Image, String> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_err(|e| format!("cannot read the host's kernel release: {e}"))?;
    let release = release.trim();
    let vmlinuz = PathBuf::from(format!("/boot/vmlinuz-{release}"));
    match std::fs::File::open(&vmlinuz) {
        Ok(_) => Ok(Image {
            label: format!("host ({release})"),
            vmlinuz,
        }),
        Err(e) => Err(format!(
            "host kernel {release}: {} cannot be read ({e}); the test suite running on this \
             kernel covers it",
            vmlinuz.display()
        )),
    }
}
