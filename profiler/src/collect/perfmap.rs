//! JIT symbol maps: V8, the JVM's perf agents, LuaJIT, .NET and others write
//! `/tmp/perf-PID.map` (`START SIZE name` per line, hex, no `0x` needed) to name code they
//! generate in anonymous memory, where no ELF file can. The collector reads a process's map
//! while it lives, for addresses that normalization left unknown.
use std::path::PathBuf;

/// One process's perf map: (start, end exclusive, name), sorted by start.
#[derive(Debug, Default)]
pub struct PerfMap {
    entries: Vec<(u64, u64, String)>,
}

impl PerfMap {
    /// Parses perf-map text; malformed lines are skipped (agents append while running, so
    /// the last line may be cut short).
    pub fn parse(text: &str) -> Self {
        let hex = |s: &str| {
            let s = s.trim_start_matches("0x").trim_start_matches("0X");
            u64::from_str_radix(s, 16).ok()
        };
        let mut entries: Vec<(u64, u64, String)> = text
            .lines()
            .filter_map(|line| {
                let mut it = line.trim_start().splitn(3, ' ');
                let start = hex(it.next()?)?;
                let size = hex(it.next()?)?;
                let name = it.next()?.trim_end();
                (size > 0 && !name.is_empty())
                    .then(|| (start, start.saturating_add(size), name.to_owned()))
            })
            .collect();
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

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Reads the perf map of live process `pid`, if it has one. The file is named after the pid
/// the process sees in its own pid namespace and lives in its own /tmp, so both are taken
/// from the process's point of view (NSpid, /proc/PID/root).
pub fn read(pid: u32) -> Option<PerfMap> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let ns_pid = ns_pid(&status).unwrap_or(pid);
    let candidates = [
        PathBuf::from(format!("/proc/{pid}/root/tmp/perf-{ns_pid}.map")),
        // A process that shares our mount namespace but not our pid namespace, or an agent
        // that wrote the map from outside: the host's /tmp with the host pid.
        PathBuf::from(format!("/tmp/perf-{pid}.map")),
    ];
    candidates.iter().find_map(|path| {
        let text = std::fs::read_to_string(path).ok()?;
        let map = PerfMap::parse(&text);
        (!map.is_empty()).then_some(map)
    })
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
    fn ns_pid_is_the_innermost() {
        assert_eq!(ns_pid("Name:\tx\nNSpid:\t4242\t17\n"), Some(17));
        assert_eq!(ns_pid("Name:\tx\nNSpid:\t4242\n"), Some(4242));
        assert_eq!(ns_pid("Name:\tx\n"), None);
    }
}
