//! The grammar of values a user types (a flag, a config key, a query parameter): sizes,
//! durations and frequencies, one parser each, which clap's `value_parser`, the agent's config
//! file and its HTTP API share, and the error of each. An error is a leaf, one line naming the
//! text and the form wanted: clap shows only an error's own `Display`, so nothing here hides
//! part of its message in a `source()`.

/// A value typed by a user that does not parse or is out of range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    #[error("`{0}` is not a duration; write e.g. 10s, 500ms, 2m, 1m30s, 1d")]
    NotDuration(String),
    #[error("`{text}`: unknown unit `{unit}`; use ms, s, m, h or d")]
    DurationUnit { text: String, unit: String },
    #[error(
        "`{0}`: a thread's name (comm) is 1 to 15 bytes (the kernel cuts longer ones); give the first 15"
    )]
    Comm(String),
    #[error("`{0}` must be a positive duration")]
    NotPositive(String),
    #[error("window `{0}` must be between 1s and 1h")]
    Window(String),
    #[error(
        "`{0}` is not a size; write e.g. 64M, 512K, 1GiB or 100MB (K, M, G, KiB, MiB, GiB: powers of 1024; KB, MB, GB: of 1000)"
    )]
    Bytes(String),
    #[error(
        "`{text}`: unknown unit `{unit}`; use B, KiB (K), MiB (M), GiB (G), or KB, MB, GB (powers of 1000)"
    )]
    SizeUnit { text: String, unit: String },
    #[error("max size `{0}` is below 1MiB")]
    SizeBelowMiB(String),
    #[error("frequency must be a whole number of Hz in 1..={max}, got `{text}`")]
    Frequency { text: String, max: u32 },
    #[error("listen address `{0}` is not IP:PORT (e.g. 127.0.0.1:7070)")]
    Listen(String),
}

/// Bytes: `64M`, `512K`, `1G`, `1GiB`, `500MiB` (powers of 1024), `100MB`, `2GB` (of 1000),
/// `4096` or `4096B`; more than zero.
pub(crate) fn parse_bytes(text: &str) -> Result<u64, InputError> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = match num.parse() {
        Ok(n) if n > 0 => n,
        _ => return Err(InputError::Bytes(text.to_owned())),
    };
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        u => {
            return Err(InputError::SizeUnit {
                text: text.to_owned(),
                unit: u.to_owned(),
            });
        }
    };
    n.checked_mul(scale)
        .ok_or_else(|| InputError::Bytes(text.to_owned()))
}

/// A sampling frequency: a whole number of Hz in 1..=`max`.
pub(crate) fn parse_hz(text: &str, max: u32) -> Result<u32, InputError> {
    match text.trim().parse::<u32>() {
        Ok(hz) => check_hz(hz, max),
        Err(_) => Err(InputError::Frequency {
            text: text.to_owned(),
            max,
        }),
    }
}

/// `hz` if it is in 1..=`max` (a number given as such, e.g. a config file's integer).
pub(crate) fn check_hz(hz: u32, max: u32) -> Result<u32, InputError> {
    if (1..=max).contains(&hz) {
        Ok(hz)
    } else {
        Err(InputError::Frequency {
            text: hz.to_string(),
            max,
        })
    }
}

/// A thread name to match (`--comm`): what the kernel keeps of one, 1 to 15 bytes.
pub(crate) fn parse_comm(text: &str) -> Result<String, InputError> {
    if text.is_empty() || text.len() > 15 {
        return Err(InputError::Comm(text.to_owned()));
    }
    Ok(text.to_owned())
}

/// Parses a duration: `10s`, `500ms`, `2m`, `1h`, `7d`, `1m30s`, or a bare number of seconds
/// (`1.5`).
pub(crate) fn parse_duration(text: &str) -> Result<std::time::Duration, InputError> {
    let ns = duration_ns(text)?;
    if !(0.5..1e18).contains(&ns) {
        return Err(InputError::NotPositive(text.to_owned()));
    }
    Ok(std::time::Duration::from_nanos(ns.round() as u64))
}

/// A duration in ns, unchecked beyond its syntax: `parse_duration` and the offsets of
/// `report --from/--to` (where 0 is valid) share it. Units: us, ms, s (or none), m, min, h, d;
/// terms add up (`1m30s`, `1h30m`), a number without a unit only alone (`1.5`).
pub(crate) fn duration_ns(text: &str) -> Result<f64, InputError> {
    let t = text.trim();
    let mut rest = t;
    let mut total = 0.0;
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(split);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let value: f64 = num
            .parse()
            .map_err(|_| InputError::NotDuration(text.to_owned()))?;
        let scale = match unit {
            "" if rest.len() == t.len() => 1e9,
            "" => return Err(InputError::NotDuration(text.to_owned())),
            "s" => 1e9,
            "ms" => 1e6,
            "us" => 1e3,
            "m" | "min" => 60e9,
            "h" => 3600e9,
            "d" => 86400e9,
            _ => {
                return Err(InputError::DurationUnit {
                    text: text.to_owned(),
                    unit: unit.to_owned(),
                });
            }
        };
        total += value * scale;
        rest = next;
    }
    if t.is_empty() {
        return Err(InputError::NotDuration(text.to_owned()));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_add_their_terms() {
        for (text, s) in [
            ("1m30s", 90.0),
            ("1h30m", 5400.0),
            ("2h15m10s", 8110.0),
            ("1s500ms", 1.5),
            ("1.5", 1.5),
            ("10s", 10.0),
        ] {
            assert_eq!(duration_ns(text), Ok(s * 1e9), "{text}");
        }
        for bad in ["", "1m30", "s", "1m 30s", "1x"] {
            assert!(duration_ns(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sizes_in_every_unit_the_flags_and_keys_take() {
        for (text, bytes) in [
            ("64M", 64 << 20),
            ("512K", 512 << 10),
            ("1G", 1 << 30),
            ("1GiB", 1 << 30),
            ("500MiB", 500 << 20),
            ("100MB", 100_000_000),
            ("4096", 4096),
            ("4096B", 4096),
        ] {
            assert_eq!(parse_bytes(text), Ok(bytes), "{text}");
        }
        for bad in ["", "0", "-1M", "M", "99999999999999G"] {
            let e = parse_bytes(bad).unwrap_err().to_string();
            assert!(
                e.contains("64M") && e.contains(&format!("`{bad}`")),
                "{bad}: {e}"
            );
        }
        let e = parse_bytes("12 parsecs").unwrap_err().to_string();
        assert!(e.contains("unknown unit `parsecs`"), "{e}");
    }

    #[test]
    fn frequencies_are_whole_hz_up_to_the_commands_limit() {
        assert_eq!(parse_hz("99", 10_000), Ok(99));
        assert_eq!(parse_hz("10000", 10_000), Ok(10_000));
        for bad in ["0", "10001", "1.5", "fast", ""] {
            let e = parse_hz(bad, 10_000).unwrap_err().to_string();
            assert!(
                e.contains("1..=10000") && e.contains(&format!("`{bad}`")),
                "{e}"
            );
        }
        assert!(
            check_hz(2000, 1000)
                .unwrap_err()
                .to_string()
                .contains("1..=1000")
        );
    }
}
