//! perf-script-compatible text (`.perf.txt`): what `perf script` prints for a cpu-clock
//! recording, so FlameScope, stackcollapse-perf.pl, inferno-collapse-perf and speedscope read
//! our captures. Per sample a header line, one line per frame leaf first (after a tab), then a
//! blank line:
//!
//! ```text
//! busy 42/42 [001] 1796083200.010000: 1 cpu-clock:
//!     ffffffff81a2b3c0 clear_page ([kernel.kallsyms])
//!     ffffffff81e00b27 asm_exc_page_fault ([kernel.kallsyms])
//!     1139 main (/usr/bin/busy)
//!
//! ```
//!
//! The address column is the frame's address as the capture keeps it: the instruction address
//! for kernel frames, the offset in the binary for user frames (perf prints the process's
//! virtual address, which means nothing once the process is gone), 0 when unknown.
use std::io;

use crate::profile::{Frame, FrameKind, Profile, UNKNOWN_FRAME};

/// Every sample needs its time and CPU here: a profile with untimed ranges (old stored
/// windows) is refused (`InvalidInput`) rather than printed with times it does not have.
pub fn write_perf_text(profile: &Profile, w: &mut impl io::Write) -> io::Result<()> {
    if profile.samples.iter().any(|s| !s.has_time()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "perf script text needs each sample's time, and part of this range was stored \
             without times (older than the agent's --keep-times); pick a more recent range or \
             another format",
        ));
    }
    // Module column per frame, computed once: most samples share few frames.
    let modules: Vec<String> = profile.frames.iter().map(|f| module(profile, f)).collect();
    let names: Vec<String> = profile
        .frames
        .iter()
        .map(|f| keep_offset(clean(profile.str(f.name))))
        .collect();
    let comms: Vec<String> = profile.strings.iter().map(|s| clean(s)).collect();
    let event = if profile.meta.event.is_empty() {
        "cpu-clock"
    } else {
        &profile.meta.event
    };
    for s in &profile.samples {
        // Wall clock, as perf prints it: secs.usecs.
        let ns = profile.meta.start_unix_ns + s.offset_ns;
        writeln!(
            w,
            "{} {}/{} [{:03}] {}.{:06}: 1 {event}:",
            comms[s.comm as usize],
            s.pid,
            s.tid,
            s.cpu,
            ns / 1_000_000_000,
            ns % 1_000_000_000 / 1_000
        )?;
        for &f in profile.stacks[s.stack as usize].frames.iter().rev() {
            let f = f as usize;
            let addr = profile.frames[f].addr;
            writeln!(w, "\t{addr:x} {} ({})", names[f], modules[f])?;
        }
        writeln!(w)?;
    }
    Ok(())
}

/// perf's module column: `[kernel.kallsyms]` for the kernel image, `[name]` for a kernel
/// module, the binary path for user code, `[unknown]` when we do not know it.
fn module(profile: &Profile, f: &Frame) -> String {
    let m = profile.str(f.module);
    match (f.kind, m) {
        (FrameKind::Kernel, "" | "vmlinux") => "[kernel.kallsyms]".into(),
        (FrameKind::Kernel, m) => format!("[{}]", clean(m)),
        (FrameKind::User, m) => match profile.binaries.get(f.binary as usize) {
            // The full path, as perf prints it; the module name is only the file name.
            Some(b) if !b.path.is_empty() => clean(&b.path),
            _ if m.is_empty() => UNKNOWN_FRAME.into(),
            _ => clean(m),
        },
    }
}

/// perf prints `symbol+0xOFFSET` with `-F +symoff`, and consumers (inferno-collapse-perf,
/// stackcollapse-perf.pl) cut a trailing `+0x...` off every name. An unknown frame is named by
/// its place (`libc.so.6+0x26110`): an explicit `+0x0` keeps that whole name through them.
fn keep_offset(name: String) -> String {
    let ends_like_offset = name.rsplit_once("+0x").is_some_and(|(head, hex)| {
        !head.is_empty() && !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit())
    });
    if ends_like_offset {
        name + "+0x0"
    } else {
        name
    }
}

/// A newline would end the record early; an empty name reads as a missing column.
fn clean(s: &str) -> String {
    if s.is_empty() {
        return UNKNOWN_FRAME.into();
    }
    s.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn names_that_end_like_an_offset_keep_it() {
        assert_eq!(
            keep_offset("libc.so.6+0x26110".into()),
            "libc.so.6+0x26110+0x0"
        );
        assert_eq!(keep_offset("main".into()), "main");
        assert_eq!(keep_offset("a+0xzz".into()), "a+0xzz");
        assert_eq!(keep_offset("+0x10".into()), "+0x10");
    }
    use crate::{output::folded_lines, profile::timeline_pattern};

    /// Folds perf script text the way stackcollapse-perf / inferno-collapse-perf do: a header
    /// found by FlameScope's regex ` +([0-9.]+): .+?:`, frames `\taddr name (module)` leaf
    /// first, `comm;root;...;leaf`, `_[k]` on `[...]` (kernel) modules.
    fn collapse(text: &str) -> (Vec<String>, Vec<String>) {
        let mut counts: HashMap<String, u64> = HashMap::new();
        let mut times = Vec::new();
        for record in text.split("\n\n").filter(|r| !r.trim().is_empty()) {
            let mut lines = record.lines();
            let header = lines.next().unwrap();
            // FlameScope: the first ` +([0-9.]+): ` then a lazy `.+?:`.
            let colon = header.find(": ").unwrap();
            let secs = header[..colon].rsplit(' ').next().unwrap();
            assert!(header[colon + 2..].contains(':'), "{header}");
            assert!(secs.parse::<f64>().is_ok(), "{header}");
            times.push(secs.to_owned());
            // stackcollapse-perf: comm is everything before ` pid/tid`.
            let comm = header
                .split(" [")
                .next()
                .unwrap()
                .rsplit_once(' ')
                .unwrap()
                .0;
            let mut frames: Vec<String> = lines
                .map(|l| {
                    let l = l.strip_prefix('\t').expect("frame lines start with a tab");
                    let (_addr, rest) = l.split_once(' ').unwrap();
                    let (name, module) = rest.rsplit_once(" (").unwrap();
                    let module = module.strip_suffix(')').unwrap();
                    let kernel = module.starts_with('[') && module != "[unknown]";
                    format!("{name}{}", if kernel { "_[k]" } else { "" })
                })
                .collect();
            frames.push(comm.to_owned());
            frames.reverse();
            *counts.entry(frames.join(";")).or_default() += 1;
        }
        let mut out: Vec<String> = counts
            .into_iter()
            .map(|(l, n)| format!("{l} {n}"))
            .collect();
        out.sort_unstable();
        (out, times)
    }

    #[test]
    fn round_trips_to_the_folded_counts() {
        let p = timeline_pattern();
        let mut bytes = Vec::new();
        write_perf_text(&p, &mut bytes).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with("swapper/0 0/0 [000] 1796083200.000000: 1 cpu-clock:\n\t"));
        let (folded, times) = collapse(&text);
        assert_eq!(folded, folded_lines(&p));
        assert_eq!(times.len(), p.samples.len());
        // Wall-clock seconds with microseconds; two samples (CPUs 0, 1) per 10 ms tick.
        assert_eq!(times[2], "1796083200.010000");
        assert!(folded.contains(&"busy;main;asm_exc_page_fault_[k];clear_page_[k] 30".into()));
    }
}
