//! Small helpers shared across the pipeline.

mod dense;
mod input;
mod ticker;

pub(crate) use dense::{Dense, FxDense, FxMap, FxSet};
pub(crate) use input::{
    InputError, check_hz, duration_ns, parse_bytes, parse_comm, parse_duration, parse_hz,
};
pub(crate) use ticker::Ticker;

/// An error and its causes on one line, `: `-separated, for logs and HTTP bodies (the CLI
/// prints anyhow's `{:#}`, the same). The crate's errors name only their own step and give
/// their cause through `source()`, so no cause is repeated.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        line.push_str(": ");
        line.push_str(&c.to_string());
        cause = c.source();
    }
    line
}

/// `println!` that never panics: with stdout a pipe its reader closed (`report --stats |
/// head -2`), the rest of the output is dropped, and the command still ends as it would.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}
pub(crate) use say;

/// `eprintln!` that never panics: with stderr a pipe its reader closed (`record ... 2>&1 |
/// head -1`), a status line must not stop the command before its outputs are written.
macro_rules! status {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
pub(crate) use status;

/// A running process's comm, from /proc; None once it is gone.
pub(crate) fn proc_comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|c| c.trim_end().to_owned())
}

/// A kernel comm (NUL padded, not always UTF-8) as a string.
pub(crate) fn comm_str(raw: &[u8]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

/// Opens a file a user named for reading, refusing anything but a regular file: a FIFO would
/// block forever and a device (`/dev/zero`) never ends. Opened non-blocking, so even a FIFO
/// nobody writes returns at once; for a regular file the flag changes nothing.
pub(crate) fn open_regular(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        Ok(file)
    } else {
        let what = if kind.is_dir() {
            "a directory"
        } else {
            "not a regular file (a FIFO, socket or device)"
        };
        Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{what}; give a file"),
        ))
    }
}

/// Reads a user-named regular file (see `open_regular`) of at most `max` bytes; a longer one
/// is an error naming the bound, not a slow exhaustion of memory.
pub(crate) fn read_regular(path: &std::path::Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    open_regular(path)?.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "larger than {} MiB, the most read from such a file",
                max >> 20
            ),
        ));
    }
    Ok(bytes)
}

/// Writes `path` through a temporary file in the same directory, renamed over `path` only once
/// `write` succeeded and the data is on disk: an error (or a crash) leaves the old file as it
/// was, never half a file. A path that exists and is not a regular file (`/dev/stdout`, a
/// FIFO) is written in place: renaming over it would replace the device.
pub(crate) fn write_atomic(
    path: &std::path::Path,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    use std::io::Write as _;
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
        write(&mut w)?;
        return w.flush();
    }
    let tmp = temporary_name(path);
    let result = (|| {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        write(&mut w)?;
        w.into_inner()
            .map_err(std::io::IntoInnerError::into_error)?
            .sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Where `write_atomic` writes before renaming: a hidden name in the same directory (a rename
/// is atomic only within one filesystem).
fn temporary_name(path: &std::path::Path) -> std::path::PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{name}.{}.tmp", std::process::id()))
}

/// Bytes free for us and the size of the file system holding `dir` (None if unknown).
pub(crate) fn disk_space(dir: &std::path::Path) -> Option<(u64, u64)> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: `c` is a NUL-terminated path and `st` a properly sized out-parameter.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &raw mut st) != 0 {
            return None;
        }
        Some((
            st.f_bavail.saturating_mul(st.f_frsize),
            st.f_blocks.saturating_mul(st.f_frsize),
        ))
    }
}

/// Fails now if `write_atomic(path, ..)` could not write later: the path must name a file
/// (not a directory, nor end in `/`), an existing file must be writable, and its directory
/// must take the temporary file. Leaves everything as it was.
pub(crate) fn check_atomic_writable(path: &std::path::Path) -> std::io::Result<()> {
    let existing = std::fs::metadata(path).ok();
    if path.as_os_str().as_encoded_bytes().ends_with(b"/")
        || existing.as_ref().is_some_and(std::fs::Metadata::is_dir)
    {
        return Err(std::io::Error::from_raw_os_error(libc::EISDIR));
    }
    if existing.is_some() {
        std::fs::OpenOptions::new().write(true).open(path)?;
    }
    if existing.is_none_or(|m| m.is_file()) {
        let tmp = temporary_name(path);
        std::fs::File::create(&tmp)?;
        std::fs::remove_file(&tmp)?;
    }
    Ok(())
}

/// The processes /proc lists now (thread-group ids, not other threads).
pub(crate) fn proc_pids() -> std::io::Result<impl Iterator<Item = u32>> {
    Ok(std::fs::read_dir("/proc")?.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()))
}

/// Wall-clock now, ns since the Unix epoch.
pub(crate) fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Unix ns -> `YYYYMMDD-HHMMSS` (UTC): a name's timestamp that sorts as time does.
pub(crate) fn utc_stamp(unix_ns: u64) -> String {
    let secs = unix_ns / 1_000_000_000;
    let (days, of_day) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let shifted = days as i64 + 719_468;
    let era = shifted.div_euclid(146_097);
    let doe = shifted - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    )
}

/// CLOCK_MONOTONIC now, ns: the clock of `bpf_ktime_get_ns`, which stamps every sample.
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Raises the soft open-file limit to the hard one: the collector keeps mapped binaries open
/// (see collect::process) and the default soft limit (1024) is low for a busy host.
pub(crate) fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &raw const lim);
        }
    }
}

/// Sorts `items` by `key`, keeping the order of equal keys (a stable sort), without
/// allocating: `order` is scratch space the caller keeps. The slice's own stable sort
/// allocates half its length of elements each call, memory that a long-running reader's
/// heap trims give back and fault in again.
pub(crate) fn sort_stable_by_key<T>(
    items: &mut [T],
    key: impl Fn(&T) -> u64,
    order: &mut Vec<(u64, u32)>,
) {
    order.clear();
    order.extend(items.iter().enumerate().map(|(i, t)| (key(t), i as u32)));
    if order.is_sorted() {
        return;
    }
    // Unique (key, position) pairs: an unstable sort of them is stable for the keys.
    order.sort_unstable();
    // order[i].1 is where item i of the sorted order is now: follow each cycle of that
    // permutation with swaps, marking placed entries.
    for start in 0..items.len() {
        let mut i = start;
        loop {
            let from = std::mem::replace(&mut order[i].1, u32::MAX);
            if from == u32::MAX || from as usize == start {
                break;
            }
            items.swap(i, from as usize);
            i = from as usize;
        }
    }
}

/// The size of a memory page, bytes.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .unwrap_or(4096)
        .max(1)
}

/// Lowercase hex, as `readelf -n` and pprof print build ids.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_stable_by_key_keeps_ties_in_order() {
        let mut order = Vec::new();
        // Pseudo-random keys in a small range: many ties, long and short cycles.
        let mut x = 12_345u64;
        for len in [0, 1, 2, 3, 17, 500] {
            let items: Vec<(u64, usize)> = (0..len)
                .map(|i| {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    ((x >> 33) % 7, i)
                })
                .collect();
            let mut ours = items.clone();
            sort_stable_by_key(&mut ours, |t| t.0, &mut order);
            let mut std = items;
            std.sort_by_key(|t| t.0);
            assert_eq!(ours, std, "{len} items");
        }
    }

    #[test]
    fn a_chain_names_each_cause_once() {
        let e = crate::profile::CaptureError::Io {
            path: "/x.capture".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert_eq!(chain(&e), "/x.capture: entity not found");
        let outer = crate::session::SessionError::Kallsyms(std::io::Error::other("denied"));
        assert_eq!(chain(&outer), "cannot read /proc/kallsyms: denied");
    }

    /// The typed errors of bad input, made by the code that makes them: each is one line, no
    /// step's message repeats its cause's, and the chain reads as the old one-string message.
    #[test]
    fn no_error_repeats_its_cause() {
        use crate::agent::config::FileConfig;
        let apply = |text: &str| {
            let file: FileConfig = toml::from_str(text).unwrap();
            file.apply(&mut crate::agent::AgentConfig::default())
                .unwrap_err()
        };
        let errors: Vec<Box<dyn std::error::Error>> = vec![
            Box::new(apply("retention = \"ten\"")),
            Box::new(apply("unwind-memory = \"lots\"")),
            Box::new(apply("window = \"2h\"")),
            Box::new(FileConfig::load(std::path::Path::new("/")).unwrap_err()),
            Box::new(crate::agent::time_ago("yesterday", 0).unwrap_err()),
            Box::new(crate::agent::AgentError::PushUrl {
                flag: "--otlp-endpoint",
                source: crate::agent::push::parse_push_url("http://").unwrap_err(),
            }),
            Box::new(crate::cgroups::resolve_target("/no/such", &[]).unwrap_err()),
        ];
        for e in &errors {
            let line = chain(e.as_ref());
            assert!(!line.is_empty() && !line.contains('\n'), "{line:?}");
            let mut step: &dyn std::error::Error = e.as_ref();
            while let Some(cause) = step.source() {
                let (outer, inner) = (step.to_string(), cause.to_string());
                assert!(
                    !outer.contains(&inner),
                    "`{outer}` repeats its cause `{inner}`"
                );
                step = cause;
            }
        }
        let lines: Vec<String> = errors.iter().map(|e| chain(e.as_ref())).collect();
        assert_eq!(
            lines[0],
            "retention: `ten` is not a duration; write e.g. 10s, 500ms, 2m, 1m30s, 1d"
        );
        assert_eq!(lines[3], "cannot read config /: a directory; give a file");
        assert_eq!(
            lines[4],
            "a time is `now` or a duration ago such as 1h, 30m: \
             `yesterday` is not a duration; write e.g. 10s, 500ms, 2m, 1m30s, 1d"
        );
        assert_eq!(lines[5], "--otlp-endpoint: push url `http://` has no host");
    }
    use std::{os::unix::fs::FileTypeExt as _, time::Duration};

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5 parsecs").is_err());
    }

    /// A render that fails half-way leaves the previous output whole and no temporary file;
    /// one that succeeds replaces it; a device is written in place, not replaced.
    #[test]
    fn utc_stamps_sort_as_time_does() {
        assert_eq!(utc_stamp(0), "19700101-000000");
        // 2026-11-30T16:00:01Z; a leap day.
        assert_eq!(utc_stamp(1_796_054_401 * 1_000_000_000), "20261130-160001");
        assert_eq!(utc_stamp(1_709_208_000 * 1_000_000_000), "20240229-120000");
    }

    #[test]
    fn a_directory_is_no_output_file() {
        let dir = tempfile::Builder::new()
            .prefix("profiler-atomic-")
            .tempdir()
            .unwrap();
        for path in [dir.path().to_owned(), dir.path().join("x.svg/")] {
            let e = check_atomic_writable(&path).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EISDIR), "{}", path.display());
        }
        check_atomic_writable(&dir.path().join("x.svg")).unwrap();
    }

    #[test]
    fn atomic_writes_keep_the_old_file_on_error() {
        let dir = tempfile::Builder::new()
            .prefix("profiler-atomic-")
            .tempdir()
            .unwrap();
        let out = dir.path().join("x.svg");
        std::fs::write(&out, "old").unwrap();
        let e = write_atomic(&out, |w| {
            std::io::Write::write_all(w, &vec![b'n'; 100_000])?;
            Err(std::io::Error::other("render failed"))
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "render failed");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "old");
        let names = || std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(names(), 1, "a temporary file was left");
        write_atomic(&out, |w| std::io::Write::write_all(w, b"new")).unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "new");
        assert_eq!(names(), 1);
        write_atomic(std::path::Path::new("/dev/null"), |w| {
            std::io::Write::write_all(w, b"x")
        })
        .unwrap();
        assert!(
            std::fs::metadata("/dev/null")
                .unwrap()
                .file_type()
                .is_char_device()
        );
        // The check before recording: leaves the file and the directory as they were.
        check_atomic_writable(&out).unwrap();
        check_atomic_writable(&dir.path().join("new.svg")).unwrap();
        check_atomic_writable(std::path::Path::new("/dev/null")).unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "new");
        assert_eq!(names(), 1);
        assert!(check_atomic_writable(&dir.path().join("missing/x.svg")).is_err());
    }

    #[test]
    fn comms_stop_at_nul() {
        assert_eq!(comm_str(b"kubelet\0\0\0\0\0\0\0\0\0"), "kubelet");
        assert_eq!(comm_str(b"0123456789abcdef"), "0123456789abcdef");
    }
}
