//! JIT symbol maps: V8, the JVM's perf agents, LuaJIT, .NET and others write
//! `/tmp/perf-PID.map` (`START SIZE name` per line, hex, no `0x` needed) to name code they
//! generate in anonymous memory, where no ELF file can. The collector notes which processes run
//! such code while they live (`Source`), and their maps are read later, off the drain thread.
//!
//! The map is the process's own file, so it is read as hostile input: opened inside the
//! process's root without blocking (`untrusted`), a regular file owned by the process's user
//! (or root and world-readable), at most `MAX_FILE_BYTES` of it, names cut at `MAX_NAME_BYTES`.
use std::{
    io::{BufRead, Read as _},
    os::unix::fs::MetadataExt as _,
    path::Path,
};

use super::untrusted::{OpenError, Root};

/// Bytes of a perf map read at most. A JVM's map of a large service is a few MiB; the cap
/// keeps a map that is /dev/zero-like (a sparse file of any size) from costing more than
/// this much reading. Entries past it are not seen.
pub(super) const MAX_FILE_BYTES: u64 = 64 << 20;
/// Bytes of a name kept; longer names are cut there and end in `NAME_CUT`. Real JIT names
/// (a JS function with its script URL, a Java signature) stay far below.
pub(super) const MAX_NAME_BYTES: usize = 1024;
/// Appended to a name cut at `MAX_NAME_BYTES`.
pub(super) const NAME_CUT: &str = "[...]";
/// Entries kept at most: bounds memory when a map is all tiny lines (about 80 MB at worst).
pub(super) const MAX_ENTRIES: usize = 1 << 20;

/// One process's perf map: (start, end exclusive, name), sorted by start.
#[derive(Debug, Default)]
pub struct PerfMap {
    entries: Vec<(u64, u64, String)>,
}

impl PerfMap {
    /// Parses perf-map text; malformed lines are skipped (agents append while running, so
    /// the last line may be cut short).
    #[cfg(test)]
    pub fn parse(text: &str) -> Self {
        Self::parse_from(text.as_bytes())
    }

    /// Parses a perf map line by line, never holding more than one capped line: a single
    /// line may be gigabytes long.
    pub fn parse_from(mut input: impl BufRead) -> Self {
        let hex = |s: &str| {
            let s = s.trim_start_matches("0x").trim_start_matches("0X");
            u64::from_str_radix(s, 16).ok()
        };
        // Two 16-digit numbers with `0x` and their spaces fit in 64 bytes before the name.
        let max_line = MAX_NAME_BYTES + 64;
        let mut line = Vec::with_capacity(256);
        let mut entries: Vec<(u64, u64, String)> = Vec::new();
        while entries.len() < MAX_ENTRIES {
            let Ok(Some(cut)) = next_line(&mut input, &mut line, max_line) else {
                break;
            };
            let text = String::from_utf8_lossy(&line);
            let mut it = text.trim_start().splitn(3, ' ');
            let (Some(start), Some(size), Some(name)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            let (Some(start), Some(size)) = (hex(start), hex(size)) else {
                continue;
            };
            let name = name.trim_end();
            if size == 0 || name.is_empty() {
                continue;
            }
            entries.push((start, start.saturating_add(size), cap_name(name, cut)));
        }
        // Stable: when code is regenerated at the same address, the later line wins below.
        entries.sort_by_key(|e| e.0);
        Self { entries }
    }

    /// The name of the code containing `addr`. Of overlapping entries, the one that starts
    /// closest below `addr` (and among equal starts the last written) wins: JITs rewrite
    /// regions and append the new name.
    pub fn lookup(&self, addr: u64) -> Option<&str> {
        let end = self.entries.partition_point(|e| e.0 <= addr);
        self.entries[..end]
            .iter()
            .rev()
            .take(64) // nested or stale entries are few; bound the walk on pathological maps
            .find(|e| addr < e.1)
            .map(|e| e.2.as_str())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The next line of `input` into `line` (without its newline), at most `max` bytes of it;
/// the rest of a longer line is skipped. Some(true) when the line was cut, None at the end.
fn next_line(
    input: &mut impl BufRead,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<bool>> {
    line.clear();
    let (mut cut, mut any) = (false, false);
    loop {
        let buf = input.fill_buf()?;
        if buf.is_empty() {
            return Ok(any.then_some(cut));
        }
        any = true;
        let newline = buf.iter().position(|&b| b == b'\n');
        let chunk = &buf[..newline.unwrap_or(buf.len())];
        let room = max.saturating_sub(line.len());
        cut |= chunk.len() > room;
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        let used = newline.map_or(buf.len(), |n| n + 1);
        input.consume(used);
        if newline.is_some() {
            return Ok(Some(cut));
        }
    }
}

/// `name` cut at `MAX_NAME_BYTES` (on a character boundary) with `NAME_CUT` appended when it
/// is longer or its line was already cut.
fn cap_name(name: &str, line_cut: bool) -> String {
    if !line_cut && name.len() <= MAX_NAME_BYTES {
        return name.to_owned();
    }
    let mut end = name.len().min(MAX_NAME_BYTES);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{NAME_CUT}", &name[..end])
}

/// What is needed to read a process's perf map later, taken while it lives: its root (held
/// open, valid after it exits), its pid as it sees it, and its effective user.
#[derive(Debug)]
pub(super) struct Source {
    root: Root,
    ns_pid: u32,
    euid: u32,
}

impl Source {
    /// None when the process is gone (or its root cannot be opened).
    pub(super) fn of(pid: u32) -> Option<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        Some(Self {
            root: Root::of_process(pid).ok()?,
            ns_pid: ns_pid(&status).unwrap_or(pid),
            euid: euid(&status)?,
        })
    }
}

/// Reads the perf map of process `pid`, if it has a usable one. The file is named after the
/// pid the process sees in its own pid namespace and lives in its own /tmp, so both are taken
/// from the process's point of view; then the host's /tmp with the host pid (a process that
/// shares our mount namespace but not our pid namespace, or an agent that wrote the map from
/// outside). Blocking file work: never call it on a thread that drains samples or serves HTTP.
pub(super) fn read(pid: u32, src: &Source) -> Option<PerfMap> {
    let host = Root::host().ok();
    let candidates = [
        (Some(&src.root), format!("/tmp/perf-{}.map", src.ns_pid)),
        (host.as_ref(), format!("/tmp/perf-{pid}.map")),
    ];
    candidates.iter().find_map(|(root, path)| {
        let map = read_one((*root)?, Path::new(path), src.euid)
            .map_err(|e| {
                let e = crate::util::chain(&e);
                log::debug!("pid {pid}: perf map {path} not read: {e}");
            })
            .ok()?;
        (!map.is_empty()).then_some(map)
    })
}

/// Why a candidate map was not read (logged at debug level: most processes have none).
#[derive(Debug, thiserror::Error)]
enum PerfMapError {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("cannot read its owner and mode")]
    Metadata(#[source] std::io::Error),
    #[error(
        "owned by uid {uid} (mode {mode:o}), not by the process's user {euid}, nor by root and world-readable"
    )]
    NotOwned { uid: u32, mode: u32, euid: u32 },
}

/// One candidate map: opened safely, its owner checked, read up to the cap.
fn read_one(root: &Root, path: &Path, euid: u32) -> Result<PerfMap, PerfMapError> {
    let file = root.open(path)?;
    let meta = file.metadata().map_err(PerfMapError::Metadata)?;
    owner_allowed(meta.uid(), meta.mode(), euid)?;
    Ok(PerfMap::parse_from(std::io::BufReader::new(
        file.take(MAX_FILE_BYTES),
    )))
}

/// perf reads only maps owned by the user or root; we read a map only if the process could
/// read it itself: owned by its effective user, or by root and readable by everyone. A root
/// file readable by root alone (a symlink or hard link to a secret) would otherwise show its
/// lines as frame names in profiles anyone with the profile can read.
fn owner_allowed(uid: u32, mode: u32, euid: u32) -> Result<(), PerfMapError> {
    if uid == euid || (uid == 0 && mode & 0o004 != 0) {
        return Ok(());
    }
    Err(PerfMapError::NotOwned {
        uid,
        mode: mode & 0o7777,
        euid,
    })
}

/// The effective uid: the second field of the `Uid:` line of /proc/PID/status.
fn euid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The innermost pid of the `NSpid:` line of /proc/PID/status (tab separated, outermost first).
pub fn ns_pid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_looks_up() {
        let map = PerfMap::parse(
            "7f0000001000 40 jit_hot_loop\n\
             0x7f0000002000 0x100 LazyCompile:*foo /app/x.js:10:3\n\
             7f0000003000 10\n\
             garbage line\n\
             7f0000004000 0 empty\n\
             7f00000050",
        );
        assert_eq!(map.lookup(0x7f0000001000), Some("jit_hot_loop"));
        assert_eq!(map.lookup(0x7f000000103f), Some("jit_hot_loop"));
        assert_eq!(map.lookup(0x7f0000001040), None);
        assert_eq!(
            map.lookup(0x7f0000002010),
            Some("LazyCompile:*foo /app/x.js:10:3")
        );
        assert_eq!(map.lookup(0x7f0000003005), None);
        assert_eq!(map.lookup(0x7f0000004000), None);
        assert_eq!(map.lookup(0x1000), None);
    }

    #[test]
    fn later_and_inner_entries_win() {
        let map = PerfMap::parse("1000 1000 outer\n1100 10 inner\n2000 10 old\n2000 10 new\n");
        assert_eq!(map.lookup(0x1105), Some("inner"));
        assert_eq!(map.lookup(0x1200), Some("outer"));
        assert_eq!(map.lookup(0x2000), Some("new"));
    }

    #[test]
    fn long_lines_and_names_are_capped() {
        let long = "x".repeat(3 * MAX_NAME_BYTES);
        let huge = format!("{}\n", "y".repeat(200_000));
        let text = format!(
            "1000 10 {long}\n{huge}2000 10 short\n3000 10 {}é\n",
            "z".repeat(MAX_NAME_BYTES - 1)
        );
        // A small buffer, so lines span many reads.
        let map = PerfMap::parse_from(std::io::BufReader::with_capacity(64, text.as_bytes()));
        let cut = map.lookup(0x1000).unwrap();
        assert_eq!(cut.len(), MAX_NAME_BYTES + NAME_CUT.len());
        assert!(cut.ends_with(NAME_CUT) && cut.starts_with("xxx"));
        assert_eq!(map.lookup(0x2000), Some("short"));
        // Cut on a character boundary: 1023 z, then é (2 bytes) does not fit.
        let z = map.lookup(0x3000).unwrap();
        assert_eq!(z, format!("{}{NAME_CUT}", "z".repeat(MAX_NAME_BYTES - 1)));
    }

    #[test]
    fn nul_bytes_make_no_entries() {
        let zeros = vec![0u8; 1 << 20];
        assert!(PerfMap::parse_from(&zeros[..]).is_empty());
    }

    #[test]
    fn only_maps_the_process_could_read_itself() {
        assert!(owner_allowed(1000, 0o600, 1000).is_ok());
        assert!(owner_allowed(0, 0o644, 1000).is_ok());
        assert!(owner_allowed(0, 0o600, 0).is_ok());
        let e = owner_allowed(0, 0o100600, 65534).unwrap_err().to_string();
        assert!(e.contains("owned by uid 0 (mode 600)"), "{e}");
        assert!(owner_allowed(1001, 0o644, 1000).is_err());
        assert_eq!(euid("Uid:\t1000\t65534\t65534\t65534\n"), Some(65534));
    }

    #[test]
    fn reads_a_map_in_a_root_and_refuses_others() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::Builder::new()
            .prefix("profiler-perfmap-")
            .tempdir()
            .unwrap();
        std::fs::create_dir_all(dir.path().join("tmp")).unwrap();
        std::fs::write(dir.path().join("tmp/perf-7.map"), "1000 10 mine\n").unwrap();
        let root = Root::open_dir(dir.path().to_str().unwrap()).unwrap();
        let me = std::fs::metadata(dir.path()).unwrap().uid();
        let path = Path::new("/tmp/perf-7.map");
        let map = read_one(&root, path, me).unwrap();
        assert_eq!(map.lookup(0x1000), Some("mine"));
        // Not the process's user's, and root's only (as root runs this test) or someone else's.
        let private = std::fs::Permissions::from_mode(0o600);
        std::fs::set_permissions(dir.path().join("tmp/perf-7.map"), private).unwrap();
        assert!(read_one(&root, path, me + 1).is_err());
    }

    #[test]
    fn ns_pid_is_the_innermost() {
        assert_eq!(ns_pid("Name:\tx\nNSpid:\t4242\t17\n"), Some(17));
        assert_eq!(ns_pid("Name:\tx\nNSpid:\t4242\n"), Some(4242));
        assert_eq!(ns_pid("Name:\tx\n"), None);
    }
}
