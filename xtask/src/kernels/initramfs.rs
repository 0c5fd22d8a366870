//! The kernel matrix's initramfs: the release profiler (and the broken build), the shared
//! libraries they load, busybox, the static fx-chain fixture and `/init`, written as an
//! uncompressed newc cpio archive that every kernel unpacks without a decompressor.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::util;

/// Debian's busybox-static: one static binary, every applet the init script uses.
pub(super) const BUSYBOX: &str = "/bin/busybox";

/// The init script run by each kernel; it prints the MATRIX protocol lines.
const INIT: &str = include_str!("init.sh");

/// What goes into the archive, by path inside the guest.
#[derive(Default)]
pub(super) struct Contents {
    entries: BTreeMap<PathBuf, Entry>,
}

enum Entry {
    Dir,
    File { data: Vec<u8>, mode: u32 },
    CharDev { major: u32, minor: u32 },
}

impl Contents {
    /// The skeleton: /init, busybox, /dev/console (the kernel opens it for init's stdio
    /// before anything is mounted) and `/matrix/unwind-modes`.
    pub(super) fn new(unwind_modes: &str) -> Result<Self> {
        let mut c = Self::default();
        c.add_data("/init", INIT.as_bytes().to_vec(), 0o755);
        c.add_host_file("/bin/busybox", Path::new(BUSYBOX))?;
        c.add_dir("/dev");
        c.entries
            .insert("/dev/console".into(), Entry::CharDev { major: 5, minor: 1 });
        c.add_data(
            "/matrix/unwind-modes",
            unwind_modes.as_bytes().to_vec(),
            0o644,
        );
        Ok(c)
    }

    /// A dynamically linked program at `guest`, with every library `ldd` lists at the same
    /// path it has on the host (the guest's loader finds them there).
    pub(super) fn add_program(&mut self, guest: &str, host: &Path) -> Result<()> {
        self.add_host_file(guest, host)?;
        let ldd = util::output(Command::new("ldd").arg(host))?;
        for lib in shared_libraries(&ldd)? {
            if !self.entries.contains_key(&lib) {
                self.add_host_file(lib.to_str().context("non-UTF-8 library path")?, &lib)?;
            }
        }
        Ok(())
    }

    /// `host`'s contents at `guest` (symlinks followed), executable if it is on the host.
    pub(super) fn add_host_file(&mut self, guest: &str, host: &Path) -> Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        let data = std::fs::read(host).with_context(|| format!("reading {}", host.display()))?;
        let mode = std::fs::metadata(host)?.permissions().mode() & 0o777;
        self.add_data(guest, data, mode);
        Ok(())
    }

    fn add_data(&mut self, guest: &str, data: Vec<u8>, mode: u32) {
        let path = PathBuf::from(guest);
        if let Some(parent) = path.parent() {
            self.add_dir(parent);
        }
        self.entries.insert(path, Entry::File { data, mode });
    }

    /// `guest` and its parents (the kernel's unpacker makes no missing parent).
    fn add_dir(&mut self, guest: impl AsRef<Path>) {
        for dir in guest.as_ref().ancestors() {
            if dir != Path::new("/") && !dir.as_os_str().is_empty() {
                self.entries.entry(dir.to_owned()).or_insert(Entry::Dir);
            }
        }
    }

    /// The archive; BTreeMap order puts every directory before what it holds.
    pub(super) fn to_cpio(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (ino, (path, entry)) in self.entries.iter().enumerate() {
            let name = path.to_string_lossy();
            let name = name.trim_start_matches('/');
            let (mode, data, rdev): (u32, &[u8], (u32, u32)) = match entry {
                Entry::Dir => (0o040_755, &[], (0, 0)),
                Entry::File { data, mode } => (0o100_000 | mode, data, (0, 0)),
                Entry::CharDev { major, minor } => (0o020_600, &[], (*major, *minor)),
            };
            write_entry(&mut out, ino as u32 + 1, mode, name, data, rdev);
        }
        write_entry(&mut out, 0, 0, "TRAILER!!!", &[], (0, 0));
        out
    }
}

/// One newc record: "070701", 13 eight-digit hex fields, the name (NUL-ended) and the data,
/// each padded to 4 bytes.
fn write_entry(out: &mut Vec<u8>, ino: u32, mode: u32, name: &str, data: &[u8], rdev: (u32, u32)) {
    let nlink = if mode & 0o170_000 == 0o040_000 { 2 } else { 1 };
    let fields = [
        ino,
        mode,
        0, // uid
        0, // gid
        nlink,
        0, // mtime
        data.len() as u32,
        0, // dev major
        0, // dev minor
        rdev.0,
        rdev.1,
        name.len() as u32 + 1,
        0, // check (unused by newc)
    ];
    out.extend_from_slice(b"070701");
    for field in fields {
        out.extend_from_slice(format!("{field:08x}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    pad4(out);
    out.extend_from_slice(data);
    pad4(out);
}

fn pad4(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

/// The absolute library paths in `ldd` output (`name => /path (addr)` and the loader's
/// `/lib64/ld-linux-x86-64.so.2 (addr)`); a library ldd cannot find is an error.
fn shared_libraries(ldd: &str) -> Result<Vec<PathBuf>> {
    let mut libs = Vec::new();
    for line in ldd.lines().map(str::trim) {
        if line.contains("not found") {
            bail!("ldd: {line}");
        }
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(path) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_lines_give_every_absolute_path() {
        let ldd = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        let libs = shared_libraries(ldd).unwrap();
        assert_eq!(
            libs,
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        assert!(shared_libraries("\tlibfoo.so => not found\n").is_err());
    }

    #[test]
    fn cpio_has_parents_first_padding_and_trailer() {
        let mut c = Contents::default();
        c.add_data("/a/b/file", b"hello".to_vec(), 0o644);
        c.add_data("/a/c", b"x".to_vec(), 0o755);
        let cpio = c.to_cpio();
        // Every record starts 4-byte aligned with the newc magic.
        let text = String::from_utf8_lossy(&cpio);
        let names: Vec<&str> = text
            .match_indices("070701")
            .map(|(i, _)| {
                assert_eq!(i % 4, 0, "record at {i} not aligned");
                let name_len = usize::from_str_radix(&text[i + 94..i + 102], 16).unwrap();
                &text[i + 110..i + 110 + name_len - 1]
            })
            .collect();
        assert_eq!(names, ["a", "a/b", "a/b/file", "a/c", "TRAILER!!!"]);
        assert!(text.contains("hello"));
        assert_eq!(cpio.len() % 4, 0);
    }
}
