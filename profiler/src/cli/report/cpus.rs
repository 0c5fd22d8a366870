//! `report --cpus`: per-CPU utilisation per second as text, like `mpstat -P ALL 1` side by
//! side: one row per second, one column per CPU with busy% and its usr/sys split, `!` on
//! saturated seconds, then the saturated runs with the process that kept each CPU busy.
use std::fmt::Write as _;

use super::range::format_clock;
use crate::profile::{self, CpuTable, Filter, Profile, SATURATED_PCT, SATURATED_SECS, SpanTooLong};

/// The table for `profile` (already cut to --from/--to), as text; refused (before any work)
/// when the samples span more seconds than `Span::bounded` allows.
pub(super) fn cpu_report(profile: &Profile) -> Result<String, SpanTooLong> {
    let t = profile::cpu_table(profile, &Filter::default())?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "per-CPU utilisation per second (UTC); busy% usr/sys; `!` = >= {SATURATED_PCT}% for >= {SATURATED_SECS} s; expected {} samples/s",
        profile.meta.frequency_hz
    );
    let _ = write!(out, "{:<8} {:>6}", "time", "offset");
    for cpu in &t.cpus {
        let _ = write!(out, " {:>13}", format!("CPU{cpu}"));
    }
    out.push('\n');
    let untimed = t.span.untimed_cols(profile);
    for col in 0..t.span.cols {
        let sec = t.span.first_s + col as u64;
        let clock = format_clock(profile.meta.start_unix_ns + sec * 1_000_000_000);
        let _ = write!(out, "{clock:<8} {sec:>5}s");
        if untimed[col] {
            // Stored windows past the agent's --keep-times: counts without times or CPUs.
            out.push_str(" no exact times (the store kept only counts for this second)\n");
            continue;
        }
        for row in &t.seconds {
            let c = &row[col];
            let cell = format!(
                "{:>3.0}% {:>2.0}/{:<2.0}{}",
                c.busy_pct,
                c.user_pct,
                c.sys_pct,
                if c.saturated { "!" } else { " " }
            );
            let _ = write!(out, " {cell:>13}");
        }
        out.push('\n');
    }
    saturated_runs(profile, &t, &mut out);
    Ok(out)
}

/// One line per saturated run: CPU, from-to, and the top comm over the run.
fn saturated_runs(profile: &Profile, t: &CpuTable, out: &mut String) {
    let runs = t.saturated_runs();
    for (ci, cols) in &runs {
        let mut tops = std::collections::HashMap::<u32, u64>::new();
        for second in &t.seconds[*ci][cols.clone()] {
            if let Some((comm, n)) = second.top {
                *tops.entry(comm).or_default() += n;
            }
        }
        let top = tops
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
            .map_or("?", |(c, _)| profile.str(c));
        let at = |c: usize| {
            format_clock(profile.meta.start_unix_ns + (t.span.first_s + c as u64) * 1_000_000_000)
        };
        let _ = writeln!(
            out,
            "saturated: CPU{} {}-{} ({} s), mostly {top}",
            t.cpus[*ci],
            at(cols.start),
            at(cols.end),
            cols.len()
        );
    }
    if runs.is_empty() {
        out.push_str("saturated: none\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_table() {
        let text = cpu_report(&profile::timeline_pattern()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 6, "{text}");
        assert!(lines[1].contains("CPU0") && lines[1].contains("CPU1"));
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["00:00:00", "0s", "0%", "0/0", "20%", "10/10"]
        );
        assert_eq!(lines[5], "saturated: none");
    }

    /// A second whose samples have no known times (an old stored window) says so rather
    /// than showing idle CPUs.
    #[test]
    fn untimed_seconds_say_so() {
        let mut p = profile::timeline_pattern();
        p.meta.untimed = vec![(1_000_000_000, 2_000_000_000)];
        p.samples.retain(|s| s.offset_ns / 1_000_000_000 != 1);
        let text = cpu_report(&p).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[3].ends_with("no exact times (the store kept only counts for this second)"),
            "{text}"
        );
        assert!(
            lines[2].contains("20%") && lines[4].contains("20%"),
            "{text}"
        );
    }
}
