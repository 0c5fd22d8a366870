//! `report --from/--to`: a time in the capture, as an offset from its start (`2.5s`, `1500ms`,
//! `1m`, or bare seconds) or as a wall-clock time in UTC (`16:00:01`, `16:00:01.250`, or
//! `2026-11-30T16:00:01[.250][Z]`). Wall-clock times are UTC: the capture stores the start as
//! Unix time and no time zone, and UTC reads the same on every machine that renders it.
use crate::profile::Meta;

const NS_PER_S: u64 = 1_000_000_000;
const NS_PER_DAY: u64 = 86_400 * NS_PER_S;

/// A `--from`/`--to` that names no time in the capture.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum TimeError {
    #[error("`{0}` is not a time; write an offset (2.5s, 1500ms) or UTC HH:MM:SS")]
    NotTime(String),
    #[error("`{0}`: bad date, want YYYY-MM-DD")]
    BadDate(String),
    #[error("`{0}`: bad time of day, want HH:MM:SS[.fff] (UTC)")]
    BadClock(String),
    /// `start` is the capture's start, `HH:MM:SS` UTC.
    #[error("`{text}` is before the capture started ({start} UTC)")]
    BeforeStart { text: String, start: String },
}

/// Parses `text` into an offset from the capture start, ns.
pub(super) fn parse_time(text: &str, meta: &Meta) -> Result<u64, TimeError> {
    let t = text.trim();
    if !t.contains(':') {
        return parse_offset(t).ok_or_else(|| TimeError::NotTime(text.to_owned()));
    }
    let bad_clock = || TimeError::BadClock(text.to_owned());
    let wall = if let Some((date, time)) = t.split_once(['T', ' ']) {
        let days = parse_date(date).ok_or_else(|| TimeError::BadDate(text.to_owned()))?;
        days * NS_PER_DAY + parse_clock(time.trim_end_matches('Z')).ok_or_else(bad_clock)?
    } else {
        // A bare clock time is on the capture's (UTC) start day, or the next day when the
        // capture ran past midnight and the time is before the start.
        let clock = parse_clock(t.trim_end_matches('Z')).ok_or_else(bad_clock)?;
        let day = meta.start_unix_ns / NS_PER_DAY * NS_PER_DAY;
        if day + clock < meta.start_unix_ns
            && day + NS_PER_DAY + clock <= meta.start_unix_ns + meta.duration_ns
        {
            day + NS_PER_DAY + clock
        } else {
            day + clock
        }
    };
    wall.checked_sub(meta.start_unix_ns)
        .ok_or_else(|| TimeError::BeforeStart {
            text: text.to_owned(),
            start: format_clock(meta.start_unix_ns),
        })
}

/// `2.5s`, `1500ms`, `1m`, `1h`, `3` (seconds) -> ns.
fn parse_offset(t: &str) -> Option<u64> {
    let ns = crate::util::duration_ns(t).ok()?.round();
    (0.0..1e19).contains(&ns).then_some(ns as u64)
}

/// `HH:MM:SS[.fff]` -> ns since midnight.
fn parse_clock(t: &str) -> Option<u64> {
    let mut parts = t.splitn(3, ':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    let (h, m): (u64, u64) = (h.parse().ok()?, m.parse().ok()?);
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let sec: u64 = whole.parse().ok()?;
    if h > 23 || m > 59 || sec > 60 || frac.len() > 9 || !frac.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let frac_ns = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<9}").parse::<u64>().ok()?
    };
    Some(((h * 60 + m) * 60 + sec) * NS_PER_S + frac_ns)
}

/// `YYYY-MM-DD` -> days since 1970-01-01 (Howard Hinnant's days_from_civil).
fn parse_date(t: &str) -> Option<u64> {
    let mut parts = t.splitn(3, '-');
    let y: i64 = parts.next()?.parse().ok()?;
    let m: i64 = parts.next()?.parse().ok()?;
    let d: i64 = parts.next()?.parse().ok()?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    u64::try_from(era * 146_097 + doe - 719_468).ok()
}

/// Unix ns -> `HH:MM:SS` (UTC).
pub(super) fn format_clock(unix_ns: u64) -> String {
    let s = unix_ns / NS_PER_S % 86_400;
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_and_wall_clock_times() {
        // 2026-11-30T16:00:00Z, 1 h long.
        let meta = Meta {
            start_unix_ns: 1_796_054_400 * NS_PER_S,
            duration_ns: 3600 * NS_PER_S,
            ..Meta::default()
        };
        let p = |t| parse_time(t, &meta);
        assert_eq!(p("2.5s"), Ok(2_500_000_000));
        assert_eq!(p("1500ms"), Ok(1_500_000_000));
        assert_eq!(p("0"), Ok(0));
        assert_eq!(p("1m"), Ok(60 * NS_PER_S));
        assert_eq!(p("16:00:01"), Ok(NS_PER_S));
        assert_eq!(p("16:00:01.25"), Ok(1_250_000_000));
        assert_eq!(p("2026-11-30T16:00:01"), Ok(NS_PER_S));
        assert_eq!(p("2026-11-30T16:00:02.5Z"), Ok(2_500_000_000));
        assert!(
            p("15:59:59")
                .unwrap_err()
                .to_string()
                .contains("before the capture")
        );
        assert!(p("2s5").is_err() && p("25:00:00").is_err() && p("2026-13-01T00:00:00").is_err());
        assert_eq!(format_clock(meta.start_unix_ns + 61 * NS_PER_S), "16:01:01");
    }
}
