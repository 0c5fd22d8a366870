//! Starvation's symptoms from the kernel log: while the doctor's window runs, the records
//! that /dev/kmsg gains are read and the ones starvation leaves (network watchdog timeouts,
//! driver resets, soft and hard lockups, RCU stalls, hung tasks) are placed on the same clock
//! as the profile, after the saturated CPU runs that precede them.
use std::{
    fs::File,
    io::{Read as _, Seek as _, SeekFrom},
    os::unix::fs::OpenOptionsExt as _,
};

use crate::profile::{CpuTable, Profile};

/// Records read at most per window (a log flooding faster than we read ends the read).
const MAX_RECORDS: usize = 100_000;

/// A starvation symptom the kernel logged during the window.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct KernelEvent {
    /// The record's timestamp (the kernel's monotonic clock), µs.
    pub ts_us: u64,
    /// Seconds after the profile's start.
    pub offset_s: f64,
    pub kind: &'static str,
    pub message: String,
}

/// What a kernel message is a symptom of, if it is one.
pub(crate) fn classify(msg: &str) -> Option<&'static str> {
    let m = msg.to_ascii_lowercase();
    if m.contains("netdev watchdog") || (m.contains("transmit queue") && m.contains("timed out")) {
        Some("network watchdog")
    } else if m.contains("soft lockup") {
        Some("soft lockup")
    } else if m.contains("hard lockup") {
        Some("hard lockup")
    } else if m.contains("rcu") && m.contains("stall") {
        Some("RCU stall")
    } else if m.contains("blocked for more than") {
        Some("hung task")
    } else if m.contains("reset adapter") || m.contains("resetting") && m.contains("tx") {
        Some("driver reset")
    } else {
        None
    }
}

/// One /dev/kmsg record: "PRIO,SEQ,TS_USEC,FLAGS[,...];MESSAGE\n" plus continuation lines.
pub(crate) fn parse_record(rec: &str) -> Option<(u64, &str)> {
    let (head, rest) = rec.split_once(';')?;
    let ts = head.split(',').nth(2)?.parse().ok()?;
    Some((ts, rest.lines().next().unwrap_or("")))
}

/// /dev/kmsg opened at its end: `finish` reads what came after.
pub(crate) struct KmsgWatch(File);

impl KmsgWatch {
    pub(crate) fn start() -> std::io::Result<Self> {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")?;
        f.seek(SeekFrom::End(0))?;
        Ok(Self(f))
    }

    /// The symptoms logged since `start`, on the profile's clock.
    pub(crate) fn finish(mut self, start_mono_ns: u64) -> Vec<KernelEvent> {
        let mut out = Vec::new();
        // One record per read; EPIPE means records were overwritten (skip on), EAGAIN the end.
        // A kernel logging faster than we read would keep us here: stop at records from after
        // this call (a second of slack: printk's clock is not exactly CLOCK_MONOTONIC), and
        // after a bounded number of reads.
        let end_us = crate::util::monotonic_ns() / 1000 + 1_000_000;
        let mut buf = vec![0u8; 8192];
        for _ in 0..MAX_RECORDS {
            match self.0.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let rec = String::from_utf8_lossy(&buf[..n]);
                    let Some((ts_us, msg)) = parse_record(&rec) else {
                        continue;
                    };
                    if ts_us > end_us {
                        break;
                    }
                    if let Some(kind) = classify(msg) {
                        out.push(KernelEvent {
                            ts_us,
                            offset_s: (ts_us as f64 * 1e3 - start_mono_ns as f64) / 1e9,
                            kind,
                            message: msg.to_owned(),
                        });
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
                Err(_) => break,
            }
        }
        out
    }
}

/// A CPU's run of saturated seconds: (cpu, first second, seconds, mean busy %, mean sys %).
fn runs(t: &CpuTable) -> Vec<(u32, u64, u64, f64, f64)> {
    t.saturated_runs()
        .into_iter()
        .map(|(ci, cols)| {
            let run = &t.seconds[ci][cols.clone()];
            let n = run.len() as f64;
            (
                t.cpus[ci],
                t.span.first_s + cols.start as u64,
                run.len() as u64,
                run.iter().map(|s| s.busy_pct).sum::<f64>() / n,
                run.iter().map(|s| s.sys_pct).sum::<f64>() / n,
            )
        })
        .collect()
}

/// One line per symptom, after the saturated run that ended last before it (or overlaps it):
/// "CPU1 at 100% (97% sys) for 14 s from +2 s; 2.0 s later (+18.0 s): network watchdog: ...".
pub(crate) fn timeline(events: &[KernelEvent], profile: &Profile) -> Vec<String> {
    // The doctor's window is seconds long; a span too long for a table leaves the symptoms
    // without their CPU context rather than failing the report.
    let runs = crate::profile::cpu_table(profile, &crate::profile::Filter::default())
        .map(|t| runs(&t))
        .unwrap_or_default();
    events
        .iter()
        .map(|e| {
            let before = runs
                .iter()
                .filter(|r| r.1 as f64 <= e.offset_s)
                .max_by_key(|r| r.1 + r.2);
            match before {
                Some(&(cpu, first, secs, busy, sys)) => {
                    let end = (first + secs) as f64;
                    let when = if e.offset_s < end {
                        "while it lasted".to_owned()
                    } else {
                        format!("{:.1} s later", e.offset_s - end)
                    };
                    format!(
                        "CPU{cpu} at {busy:.0}% ({sys:.0}% sys) for {secs} s from +{first} s; {when} (+{:.1} s): {}: {}",
                        e.offset_s, e.kind, e.message
                    )
                }
                None => format!(
                    "+{:.1} s: {}: {} (no CPU saturated before it)",
                    e.offset_s, e.kind, e.message
                ),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_and_symptoms_are_named() {
        let rec = "4,1234,5678901,-;NETDEV WATCHDOG: eth0 (ena): transmit queue 3 timed out 5040 ms\n SUBSYSTEM=net\n";
        let (ts, msg) = parse_record(rec).unwrap();
        assert_eq!(ts, 5678901);
        assert_eq!(classify(msg), Some("network watchdog"));
        for (msg, kind) in [
            (
                "watchdog: BUG: soft lockup - CPU#3 stuck for 22s! [kubelet:1234]",
                Some("soft lockup"),
            ),
            (
                "rcu: INFO: rcu_sched self-detected stall on CPU",
                Some("RCU stall"),
            ),
            (
                "INFO: task jbd2/sda1-8:312 blocked for more than 120 seconds.",
                Some("hung task"),
            ),
            ("ena 0000:00:05.0: Reset adapter", Some("driver reset")),
            ("eth0: link up", None),
        ] {
            assert_eq!(classify(msg), kind, "{msg}");
        }
        assert_eq!(parse_record("no header"), None);
    }

    #[test]
    fn a_symptom_follows_the_saturated_run_before_it() {
        use crate::profile::{Frame, Interner, Meta, Sample};
        let mut i = Interner::new(Meta {
            frequency_hz: 10,
            cpus: vec![0, 1],
            ..Meta::default()
        });
        let f = i.frame(Frame::default());
        let stack = i.stack(vec![f]);
        // CPU 1 busy for seconds 0..4, then idle until 8; CPU 0 idle throughout.
        for tick in 0..80u64 {
            for cpu in [0, 1] {
                i.sample(Sample {
                    offset_ns: tick * 100_000_000,
                    cpu,
                    pid: u32::from(cpu == 1 && tick < 40) * 7,
                    tid: 7,
                    cgroup_id: 0,
                    comm: 0,
                    stack,
                });
            }
        }
        let p = i.finish();
        let ev = |offset_s: f64| KernelEvent {
            ts_us: 0,
            offset_s,
            kind: "network watchdog",
            message: "NETDEV WATCHDOG: eth0".into(),
        };
        let lines = timeline(&[ev(6.0), ev(2.5)], &p);
        assert_eq!(
            lines[0],
            "CPU1 at 100% (0% sys) for 4 s from +0 s; 2.0 s later (+6.0 s): network watchdog: NETDEV WATCHDOG: eth0"
        );
        assert!(
            lines[1].contains("while it lasted (+2.5 s)"),
            "{}",
            lines[1]
        );
        let quiet = timeline(&[ev(1.0)], &Profile::default());
        assert_eq!(
            quiet[0],
            "+1.0 s: network watchdog: NETDEV WATCHDOG: eth0 (no CPU saturated before it)"
        );
    }
}
