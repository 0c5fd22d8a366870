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
    /// The Debian release it comes from when that is not this machine's ("bullseye"): its
    /// `main` is read through a private apt sources list (`PrivateApt`), so the machine's own
    /// package lists stay as they are. None: the sources the machine has configured.
    pub suite: Option<&'static str>,
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
    if let Some(private) = PrivateApt::of(series)
        && !private.has_lists()
    {
        private.update()?;
    }
    fetch_once(series).or_else(|first| {
        // Package lists older than the archive name builds it no longer has: refresh, retry.
        println!("{first:#}; refreshing the package lists (apt-get update) and retrying");
        match PrivateApt::of(series) {
            Some(private) => private.update()?,
            None => {
                util::output(Command::new("apt-get").arg("update"))
                    .context("apt-get update failed")?;
            }
        }
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
            apt(series, "apt-get")
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

/// The image package `series.meta_package` depends on, as the configured apt sources (or the
/// series' private ones) have it.
fn resolve(series: &Series) -> Result<String> {
    let text = util::output(apt(series, "apt-cache").args(["depends", series.meta_package]))
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

/// `program` (apt-get, apt-cache) reading the sources `series` comes from.
fn apt(series: &Series, program: &str) -> Command {
    let mut cmd = Command::new(program);
    if let Some(private) = PrivateApt::of(series) {
        cmd.args(private.options());
    }
    cmd
}

/// A sources list of one Debian release's `main` and the package lists apt fetches for it,
/// under target/kernels/apt/<suite>/, used by passing apt `-o` options (`options`): this
/// machine's configured sources, its package lists under /var/lib/apt and the binary caches
/// of them are neither read nor changed, so the machine keeps installing from its own release.
struct PrivateApt {
    suite: &'static str,
    dir: PathBuf,
}

impl PrivateApt {
    fn of(series: &Series) -> Option<Self> {
        let suite = series.suite?;
        Some(Self {
            suite,
            dir: util::target_dir().join("kernels/apt").join(suite),
        })
    }

    fn sources(&self) -> PathBuf {
        self.dir.join("sources.list")
    }

    fn lists(&self) -> PathBuf {
        self.dir.join("lists")
    }

    /// The `-o` options that make apt-get and apt-cache read these sources and lists only.
    fn options(&self) -> Vec<String> {
        [
            format!("Dir::Etc::SourceList={}", self.sources().display()),
            // No sources.list.d: only the one file above.
            "Dir::Etc::SourceParts=/dev/null".to_owned(),
            format!("Dir::State::Lists={}", self.lists().display()),
            // Without these apt would rebuild /var/cache/apt/*.bin from the private lists.
            "Dir::Cache::pkgcache=".to_owned(),
            "Dir::Cache::srcpkgcache=".to_owned(),
        ]
        .into_iter()
        .flat_map(|option| ["-o".to_owned(), option])
        .collect()
    }

    /// Whether `update` has fetched the package lists already.
    fn has_lists(&self) -> bool {
        std::fs::read_dir(self.lists()).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().contains("_Packages"))
        })
    }

    /// Writes the sources list (the archive this machine's own release comes from, with the
    /// suite in its place) and runs `apt-get update` on it.
    fn update(&self) -> Result<()> {
        let uri = machine_archive()?;
        // The Debian archive's keys (debian-archive-keyring holds the older releases' too).
        let signed_by = if Path::new(DEBIAN_KEYRING).is_file() {
            format!("[signed-by={DEBIAN_KEYRING}] ")
        } else {
            String::new()
        };
        let line = format!("deb {signed_by}{uri} {} main\n", self.suite);
        std::fs::create_dir_all(self.lists().join("partial"))?;
        std::fs::write(self.sources(), &line)
            .with_context(|| format!("writing {}", self.sources().display()))?;
        println!(
            "fetching the package lists of {} main into {} ({})",
            self.suite,
            self.lists().display(),
            line.trim()
        );
        util::output(Command::new("apt-get").args(self.options()).arg("update"))
            .with_context(|| format!("apt-get update of {} failed", self.sources().display()))?;
        Ok(())
    }
}

/// debian-archive-keyring's keyring of every Debian release's archive keys.
const DEBIAN_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// The URI of the archive this machine's release comes from: the apt source whose suite is
/// the release's codename (bookworm, not bookworm-updates or bookworm-security), component
/// `main`, as apt itself lists it (`apt-get indextargets`), whichever format it is written in.
fn machine_archive() -> Result<String> {
    let os_release = std::fs::read_to_string("/etc/os-release")?;
    let codename = os_release
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|c| c.trim().trim_matches('"').to_owned())
        .context("/etc/os-release names no VERSION_CODENAME")?;
    let targets = util::output(Command::new("apt-get").args([
        "indextargets",
        "--format",
        "$(TARGET_OF) $(RELEASE) $(COMPONENT) $(REPO_URI)",
        "Identifier: Packages",
    ]))?;
    archive_of(&targets, &codename).with_context(|| {
        format!("no apt source of this machine serves `{codename} main` (apt-get indextargets)")
    })
}

/// In `apt-get indextargets` lines of `TARGET_OF RELEASE COMPONENT REPO_URI`, the URI of the
/// one that serves `codename` main.
fn archive_of(targets: &str, codename: &str) -> Option<String> {
    targets.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        let matches = words.next() == Some("deb")
            && words.next() == Some(codename)
            && words.next() == Some("main");
        matches.then(|| words.next()).flatten().map(str::to_owned)
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_archive_is_the_one_serving_its_release_main() {
        let targets = "deb bookworm-updates main http://mirror.example/debian/\n\
                       deb-src bookworm main http://mirror.example/debian/\n\
                       deb bookworm contrib http://mirror.example/debian/\n\
                       deb bookworm main http://mirror.example/debian/\n\
                       deb bookworm-security main http://mirror.example/debian-security/\n";
        assert_eq!(
            archive_of(targets, "bookworm").as_deref(),
            Some("http://mirror.example/debian/")
        );
        assert_eq!(archive_of(targets, "trixie"), None);
    }

    #[test]
    fn a_private_suite_reads_only_its_own_sources_and_lists() {
        let series = Series {
            name: "5.10",
            meta_package: "linux-image-cloud-amd64",
            package_prefix: "linux-image-5.10.",
            suite: Some("bullseye"),
        };
        let private = PrivateApt::of(&series).unwrap();
        let options = private.options().join(" ");
        assert!(
            options.contains("-o Dir::Etc::SourceParts=/dev/null"),
            "{options}"
        );
        assert!(
            options.contains("kernels/apt/bullseye/sources.list"),
            "{options}"
        );
        assert!(options.contains("kernels/apt/bullseye/lists"), "{options}");
        let own = Series {
            suite: None,
            ..series
        };
        assert!(PrivateApt::of(&own).is_none());
        assert_eq!(apt(&own, "apt-cache").get_args().count(), 0);
    }
}
